//! Tests for the counters and their rendering.

use super::*;
use crate::observe::decision::Decision;

fn gauges() -> TableGauges {
    TableGauges {
        rate_in_use: 1,
        rate_capacity: 8,
        conn_in_use: 2,
        conn_capacity: 8,
        max_connections: 1000,
    }
}

fn render(m: &Metrics) -> String {
    let certs = [("site.example".to_string(), 1_900_000_000i64)];
    let names = Labels {
        listeners: vec!["public", "127.0.0.1:0#1"],
        clusters: vec!["api"],
        tls: vec![Some(&certs[..]), None],
    };
    m.render(&names, &gauges())
}

#[test]
fn tls_series_exist_for_tls_listeners_only() {
    let m = Metrics::new(2, 2, 1);
    m.shards[1].listeners[0].tls_handshakes[0][2].inc();
    m.shards[0].listeners[0].tls_handshakes[3][0].inc();
    m.shards[0].listeners[0].tls_resumed.inc();
    m.shards[0].listeners[0].tls_handshake_time.record(1_500);
    let t = render(&m);
    let ok = "zgix_tls_handshakes_total{listener=\"public\",result=\"ok\",version=\"TLSv1.3\"}";
    assert_eq!(value(&t, ok), 1.0);
    let bad =
        "zgix_tls_handshakes_total{listener=\"public\",result=\"bad_hello\",version=\"none\"}";
    assert_eq!(value(&t, bad), 1.0);
    assert!(!t.contains("result=\"ok\",version=\"none\""), "{t}");
    assert!(!t.contains("result=\"alert\",version=\"TLSv1.2\""), "{t}");
    assert_eq!(
        value(&t, "zgix_tls_resumed_total{listener=\"public\"}"),
        1.0
    );
    assert_eq!(
        value(&t, "zgix_tls_handshake_seconds_count{listener=\"public\"}"),
        1.0
    );
    assert_eq!(
        value(
            &t,
            "zgix_tls_certificate_expiry_seconds{listener=\"public\",name=\"site.example\"}"
        ),
        1_900_000_000.0
    );
    assert!(
        !t.contains("listener=\"127.0.0.1:0#1\",result="),
        "no TLS series for a plaintext listener"
    );
}

fn value(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {series} in:\n{text}"))
        .parse()
        .unwrap()
}

#[test]
fn histo_buckets_are_upper_bounds() {
    let h = Histo::default();
    for us in [1, 100, 101, 10_000_000, 10_000_001] {
        h.record(us);
    }
    let counts: Vec<u64> = h.buckets.iter().map(Counter::get).collect();
    assert_eq!(counts[0], 2, "1 and 100 are <= 100 µs");
    assert_eq!(counts[1], 1);
    assert_eq!(counts[15], 1, "10 s is in the 10 s bucket");
    assert_eq!(counts[16], 1, "above 10 s only in +Inf");
    assert_eq!(h.count.get(), 5);
    assert_eq!(h.sum_us.get(), 20_000_203);
}

#[test]
fn empty_histograms_render_a_zero_sum() {
    let m = Metrics::new(2, 2, 1);
    let text = render(&m);
    assert!(!text.contains("-0"), "{text}");
    assert_eq!(
        value(
            &text,
            "zgix_request_duration_seconds_sum{listener=\"public\",decision=\"waf\"}"
        ),
        0.0
    );
    assert!(text.contains("zgix_upstream_duration_seconds_sum{cluster=\"api\"} 0\n"));
}

#[test]
fn series_are_labelled_by_name_and_summed_over_shards() {
    let m = Metrics::new(2, 2, 1);
    let (a, b) = (&m.shards[0], &m.shards[1]);
    a.response(0, 200);
    b.response(0, 200);
    b.response(1, 429);
    a.admission(0, Admission::WafBlocked);
    b.admission(1, Admission::WafBlocked);
    b.admission(1, Admission::RateLimited);
    a.request_done(0, Decision::Forwarded, 300);
    b.request_done(0, Decision::Forwarded, 20_000);
    b.request_done(1, Decision::RateLimited, 50);
    a.upstream_time(0, 2_000);
    a.cluster_upstream_error(0, UpstreamError::Reset);
    a.connection_opened(1);
    b.connection_opened(1);
    b.connection_closed(1);
    let t = render(&m);
    let v = |s: &str| value(&t, s);
    assert_eq!(
        v("zgix_http_responses_total{listener=\"public\",code=\"200\"}"),
        2.0
    );
    assert_eq!(
        v("zgix_http_responses_total{listener=\"127.0.0.1:0#1\",code=\"429\"}"),
        1.0
    );
    assert!(!t.contains("code=\"500\""), "codes never sent are omitted");
    // The specification's names are the sums; the per-listener family splits them.
    assert_eq!(v("zgix_l7_waf_blocked"), 2.0);
    assert_eq!(v("zgix_l7_waf_blocked_total"), 2.0);
    assert_eq!(v("zgix_l7_rate_limited"), 1.0);
    assert_eq!(
        v("zgix_admission_events_total{listener=\"public\",event=\"waf_blocked\"}"),
        1.0
    );
    assert_eq!(
        v("zgix_admission_events_total{listener=\"127.0.0.1:0#1\",event=\"rate_limited\"}"),
        1.0
    );
    let fwd = "listener=\"public\",decision=\"forwarded\"";
    assert_eq!(
        v(&format!("zgix_request_duration_seconds_count{{{fwd}}}")),
        2.0
    );
    assert_eq!(
        v(&format!(
            "zgix_request_duration_seconds_bucket{{{fwd},le=\"0.0005\"}}"
        )),
        1.0
    );
    assert_eq!(
        v(&format!(
            "zgix_request_duration_seconds_bucket{{{fwd},le=\"0.025\"}}"
        )),
        2.0
    );
    assert_eq!(
        v(&format!("zgix_request_duration_seconds_sum{{{fwd}}}")),
        0.0203
    );
    assert_eq!(
        v("zgix_request_duration_seconds_count{listener=\"127.0.0.1:0#1\",decision=\"rate_limited\"}"),
        1.0
    );
    assert_eq!(
        v("zgix_upstream_duration_seconds_count{cluster=\"api\"}"),
        1.0
    );
    assert_eq!(
        v("zgix_cluster_upstream_errors_total{cluster=\"api\",kind=\"reset\"}"),
        1.0
    );
    assert_eq!(v("zgix_upstream_errors_total{kind=\"reset\"}"), 1.0);
    assert_eq!(v("zgix_connections_open{listener=\"127.0.0.1:0#1\"}"), 1.0);
    assert_eq!(v("zgix_connections_active"), 1.0);
    let build = format!(
        "zgix_build_info{{version=\"{}\",revision=\"{}\"}}",
        env!("CARGO_PKG_VERSION"),
        render::REVISION
    );
    assert_eq!(v(&build), 1.0);
    assert!(!render::REVISION.is_empty());
    let start = v("process_start_time_seconds");
    let now = crate::observe::clock::unix_ms() as f64 / 1000.0;
    assert!(start <= now && start > now - 60.0, "{start} vs {now}");
}

#[test]
fn the_older_latency_histogram_is_merged_into_forwarded() {
    let m = Metrics::new(1, 2, 1);
    m.latency[0].lock().unwrap()[0].record(1_000).unwrap();
    let t = render(&m);
    assert_eq!(
        value(
            &t,
            "zgix_request_duration_seconds_count{listener=\"public\",decision=\"forwarded\"}"
        ),
        1.0
    );
}

#[test]
fn every_status_code_has_a_counter() {
    let c = ShardCounters::new(1, 0);
    c.response(0, 100);
    c.response(0, 599);
    c.response(0, 42); // clamped: never indexes out of range
    assert_eq!(c.listeners[0].codes[0].get(), 2);
    assert_eq!(c.listeners[0].codes[499].get(), 1);
}
