//! Per-cluster upstream policy end to end: cluster timeouts over the global ones, `retry_on` (statuses, resets, idempotent requests only), the retry budget, every failed attempt counted, and the rate-limited warn line each failure writes to the error log.

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use support::*;

/// A port nothing listens on (bound, then freed).
fn dead_addr() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

/// An origin that answers every request with `503`, counting them.
struct Unavailable {
    addr: SocketAddr,
    requests: Arc<AtomicUsize>,
}

impl Unavailable {
    fn start() -> Unavailable {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let requests = Arc::new(AtomicUsize::new(0));
        let count = requests.clone();
        thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { continue };
                let count = count.clone();
                thread::spawn(move || {
                    let mut buf = [0u8; 4096];
                    let mut have = Vec::new();
                    while let Ok(n @ 1..) = s.read(&mut buf) {
                        have.extend_from_slice(&buf[..n]);
                        while let Some(end) = have.windows(4).position(|w| w == b"\r\n\r\n") {
                            have.drain(..end + 4);
                            count.fetch_add(1, Ordering::SeqCst);
                            let _ = s.write_all(
                                b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n",
                            );
                        }
                    }
                });
            }
        });
        Unavailable { addr, requests }
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

/// One shard, an admin endpoint, request IDs on, cluster `api` on
/// `endpoints` with `cluster_extra` (JSON members after the endpoints).
fn start(endpoints: &[SocketAddr], cluster_extra: &str) -> Zgix {
    let eps: Vec<String> = endpoints.iter().map(|e| format!("\"{e}\"")).collect();
    Zgix::start_json(&format!(
        r#"{{"cpus":[0],"admin":{{"bind":"127.0.0.1:0"}},
"listeners":[{{"bind":"127.0.0.1:0","http":{{"cluster":"api","request_id":"generate"}}}}],
"clusters":{{"api":{{"endpoints":[{}],"health":{{"passive":null}}{cluster_extra}}}}}}}"#,
        eps.join(",")
    ))
}

/// The error log's warn lines from component `upstream`.
fn warns(zgix: &Zgix) -> Vec<String> {
    zgix.stderr()
        .lines()
        .filter_map(log_message)
        .filter(|&(level, component, _)| (level, component) == ("warn", "upstream"))
        .map(|(_, _, m)| m.to_string())
        .collect()
}

/// The warn lines once `pred` holds for them (within `IO_TIMEOUT`).
#[track_caller]
fn warn_lines(zgix: &Zgix, pred: impl Fn(&[String]) -> bool) -> Vec<String> {
    let deadline = Instant::now() + IO_TIMEOUT;
    let mut lines = warns(zgix);
    while !pred(&lines) {
        assert!(Instant::now() < deadline, "no such warn lines: {lines:#?}");
        thread::sleep(Duration::from_millis(20));
        lines = warns(zgix);
    }
    lines
}

/// GET `path` with request ID `id`; the status.
fn get(zgix: &Zgix, path: &str, id: &str) -> u16 {
    let mut c = Client::connect(zgix.addr());
    c.request(
        format!(
            "GET {path} HTTP/1.1\r\nHost: t\r\nX-Request-ID: {id}\r\nConnection: close\r\n\r\n"
        )
        .as_bytes(),
    )
    .status
}

/// One failure of `kind` on path `path` gives `status` and exactly one warn
/// line naming cluster, endpoint, reason, client and request ID.
#[track_caller]
fn one_warn_line(endpoint: SocketAddr, zgix: &Zgix, path: &str, kind: &str, status: u16) {
    let id = format!("req-{kind}");
    assert_eq!(get(zgix, path, &id), status);
    let want = format!(
        "clusters.api: endpoint {endpoint}: {kind}, client 127.0.0.1, request_id {id}; answered {status}"
    );
    let lines = warn_lines(zgix, |l| l.iter().any(|m| m == &want));
    let n = lines.iter().filter(|m| m.contains(&id)).count();
    assert_eq!(n, 1, "{lines:#?}");
}

#[test]
fn a_refused_connect_is_one_warn_line_with_cluster_endpoint_client_and_request_id() {
    let dead = dead_addr();
    let zgix = start(&[dead], r#","retries":0"#);
    one_warn_line(dead, &zgix, "/", "connect_refused", 502);
}

#[test]
fn a_header_timeout_is_one_warn_line_and_the_cluster_timeout_overrides_the_global_one() {
    let origin = Origin::start();
    // The global header timeout stays at its 30 s default.
    let zgix = start(&[origin.addr()], r#","timeouts":{"header_ms":300}"#);
    let t = Instant::now();
    one_warn_line(origin.addr(), &zgix, "/hang", "header_timeout", 504);
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
}

#[test]
fn a_reset_is_one_warn_line() {
    let origin = Origin::start();
    let zgix = start(&[origin.addr()], r#","retries":0"#);
    one_warn_line(origin.addr(), &zgix, "/reset", "reset", 502);
}

#[test]
fn a_garbled_head_is_one_warn_line() {
    let origin = Origin::start();
    let zgix = start(&[origin.addr()], r#","retries":0"#);
    one_warn_line(origin.addr(), &zgix, "/garbage", "bad_response", 502);
}

#[test]
fn a_burst_of_failures_is_rate_limited_per_endpoint_and_the_count_shown() {
    let dead = dead_addr();
    let zgix = start(&[dead], r#","retries":0"#);
    let burst = 40;
    for i in 0..burst {
        assert_eq!(get(&zgix, "/", &format!("b{i}")), 502);
    }
    let key =
        format!("zgix_upstream_error_log_suppressed_total{{cluster=\"api\",endpoint=\"{dead}\"}}");
    let suppressed = series(&metrics_text(&zgix), &key) as usize;
    let written = warn_lines(&zgix, |l| l.len() + suppressed >= burst).len();
    assert_eq!(written + suppressed, burst);
    assert!(suppressed > 0, "40 failures written in full");
    // The next line after the window names how many were left out.
    let deadline = Instant::now() + IO_TIMEOUT;
    let mut i = 0;
    let summary = loop {
        i += 1;
        get(&zgix, "/", &format!("after{i}"));
        let lines = warn_lines(&zgix, |_| true);
        if let Some(l) = lines
            .iter()
            .find(|l| l.contains("earlier line(s) suppressed)"))
        {
            break l.clone();
        }
        assert!(Instant::now() < deadline, "no summary: {lines:#?}");
        thread::sleep(Duration::from_millis(100));
    };
    let n: usize = summary
        .rsplit_once(" (")
        .and_then(|(_, t)| t.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("{summary}"));
    assert!(n >= 1, "{summary}");
}

#[test]
fn a_503_is_retried_on_another_endpoint() {
    let bad = Unavailable::start();
    let good = Origin::start();
    let zgix = start(&[bad.addr, good.addr()], r#","retry_on":["503"]"#);
    for i in 0..4 {
        assert_eq!(get(&zgix, "/", &format!("r{i}")), 200);
    }
    assert_eq!(good.requests().len(), 4);
    let retried = bad.requests();
    assert!(retried >= 1, "round robin never picked the 503 endpoint");
    let m = metrics_text(&zgix);
    assert_eq!(
        series(&m, "zgix_upstream_retries_total{reason=\"status\"}") as usize,
        retried
    );
    assert_eq!(
        series(&m, "zgix_upstream_errors_total{kind=\"status_5xx\"}") as usize,
        retried
    );
    // Without "503" in retry_on the answer is passed on.
    let plain = start(&[bad.addr], "");
    assert_eq!(get(&plain, "/", "p"), 503);
}

#[test]
fn a_post_is_not_retried_on_a_reset_but_a_get_is() {
    let (a, b) = (Origin::start(), Origin::start());
    let zgix = start(&[a.addr(), b.addr()], "");
    let mut c = Client::connect(zgix.addr());
    let resp = c.request(
        b"POST /reset HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc",
    );
    assert_eq!(resp.status, 502);
    assert_eq!(
        a.requests().len() + b.requests().len(),
        1,
        "the POST was sent again"
    );
    assert_eq!(get(&zgix, "/reset", "g"), 502);
    assert_eq!(
        a.requests().len() + b.requests().len(),
        3,
        "the GET was not retried"
    );
}

#[test]
fn the_retry_budget_stops_retries_when_every_endpoint_fails() {
    let (x, y) = (Unavailable::start(), Unavailable::start());
    let zgix = start(&[x.addr, y.addr], r#","retry_on":["503"]"#);
    let n = 50;
    for i in 0..n {
        assert_eq!(get(&zgix, "/", &format!("b{i}")), 503);
    }
    // At most 20 % of 50 requests, and the floor of 3 (one shard, well
    // inside one 10 s window): 10 retries, not 50.
    let sent = x.requests() + y.requests();
    assert_eq!(sent, n + 10, "origins saw {sent} requests");
    let m = metrics_text(&zgix);
    assert_eq!(
        series(
            &m,
            "zgix_upstream_retry_budget_refused_total{cluster=\"api\"}"
        ) as usize,
        n - 10
    );
}

#[test]
fn every_failed_attempt_is_counted_even_when_a_retry_saves_the_request() {
    let dead = dead_addr();
    let good = Origin::start();
    let zgix = start(&[dead, good.addr()], "");
    for i in 0..2 {
        assert_eq!(get(&zgix, "/", &format!("s{i}")), 200);
    }
    let m = metrics_text(&zgix);
    assert_eq!(
        series(&m, "zgix_upstream_errors_total{kind=\"connect_refused\"}"),
        1.0
    );
    assert_eq!(
        series(
            &m,
            "zgix_cluster_upstream_errors_total{cluster=\"api\",kind=\"connect_refused\"}"
        ),
        1.0
    );
    warn_lines(&zgix, |l| {
        l.iter().any(|m| {
            m.starts_with(&format!("clusters.api: endpoint {dead}: connect_refused"))
                && m.ends_with("; tried on another endpoint")
        })
    });
}

#[test]
fn a_header_timeout_is_retried_only_when_retry_on_says_timeout() {
    let (a, b) = (Origin::start(), Origin::start());
    let zgix = start(
        &[a.addr(), b.addr()],
        r#","timeouts":{"header_ms":200},"retry_on":["connect","timeout"]"#,
    );
    assert_eq!(get(&zgix, "/hang", "t"), 504);
    assert_eq!(a.requests().len() + b.requests().len(), 2);
    let m = metrics_text(&zgix);
    assert_eq!(
        series(&m, "zgix_upstream_retries_total{reason=\"header_timeout\"}"),
        1.0
    );
    assert_eq!(
        series(&m, "zgix_upstream_errors_total{kind=\"header_timeout\"}"),
        2.0
    );
}
