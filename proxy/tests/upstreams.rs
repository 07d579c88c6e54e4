//! End-to-end upstream slots: endpoints by name resolved at load, unresolvable names reported, per-endpoint series in `/metrics`.

mod support;

use std::collections::BTreeSet;

use support::*;

#[test]
fn a_named_endpoint_resolves_at_load_and_serves() {
    let origin = Origin::start();
    let name = format!("localhost:{}", origin.addr().port());
    let z = Zgix::start_json(&format!(
        r#"{{"admin":{{"bind":"127.0.0.1:0"}},
"listeners":[{{"bind":"127.0.0.1:0","http":{{"cluster":"api"}}}}],
"clusters":{{"api":{{"endpoints":["{name}"],"resolve_ms":1000}}}}}}"#
    ));
    let resp = Client::connect(z.addr()).get("/by-name");
    assert_eq!(resp.status, 200, "{}", resp.show());
    assert!(origin
        .only_request()
        .head
        .starts_with(b"GET /by-name HTTP/1.1\r\n"));
    let m = metrics_text(&z);
    let labels = format!("{{cluster=\"api\",endpoint=\"{name}\"}}");
    assert_eq!(
        series(&m, &format!("zgix_upstream_endpoint_healthy{labels}")),
        1.0
    );
    assert_eq!(
        series(&m, &format!("zgix_upstream_resolve_failures_total{labels}")),
        0.0
    );
}

#[test]
fn an_unresolvable_name_is_reported_and_marked_down() {
    let origin = Origin::start();
    // RFC 6761 §6.4: names under .invalid never resolve.
    let z = Zgix::start_json(&format!(
        r#"{{"admin":{{"bind":"127.0.0.1:0"}},
"listeners":[{{"bind":"127.0.0.1:0","http":{{"cluster":"api"}}}}],
"clusters":{{"api":{{"endpoints":["{}", {{"address":"origin.invalid:80","weight":2}}]}}}}}}"#,
        origin.addr()
    ));
    let err = z.stderr();
    assert!(
        err.contains("warn upstream: clusters.api: origin.invalid:80 does not resolve (")
            && err.contains("); the endpoint stays down"),
        "stderr:\n{err}"
    );
    let m = metrics_text(&z);
    let down = "{cluster=\"api\",endpoint=\"origin.invalid:80\"}";
    assert_eq!(
        series(&m, &format!("zgix_upstream_endpoint_healthy{down}")),
        0.0
    );
    assert!(series(&m, &format!("zgix_upstream_resolve_failures_total{down}")) >= 1.0);
    let up = format!("{{cluster=\"api\",endpoint=\"{}\"}}", origin.addr());
    assert_eq!(
        series(&m, &format!("zgix_upstream_endpoint_healthy{up}")),
        1.0
    );
}

#[test]
fn per_endpoint_families_are_labelled_and_declared_once() {
    let (a, b) = (Origin::named("a"), Origin::named("b"));
    let z = Zgix::start_json(&format!(
        r#"{{"admin":{{"bind":"127.0.0.1:0"}},
"listeners":[{{"bind":"127.0.0.1:0","http":{{"cluster":"web"}}}}],
"clusters":{{"web":{{"endpoints":["{}", {{"address":"{}","weight":3}}],"lb":"least_conn"}}}}}}"#,
        a.addr(),
        b.addr()
    ));
    let m = metrics_text(&z);
    for ep in [a.addr(), b.addr()] {
        let l = format!("cluster=\"web\",endpoint=\"{ep}\"");
        for family in [
            "zgix_upstream_requests_total",
            "zgix_upstream_endpoint_connects_total",
            "zgix_upstream_in_flight",
            "zgix_upstream_endpoint_healthy",
            "zgix_upstream_ejections_total",
        ] {
            series(&m, &format!("{family}{{{l}}}"));
        }
        series(
            &m,
            &format!("zgix_upstream_endpoint_errors_total{{{l},kind=\"connect_refused\"}}"),
        );
        series(
            &m,
            &format!("zgix_upstream_ttfb_seconds_bucket{{{l},le=\"+Inf\"}}"),
        );
        series(&m, &format!("zgix_upstream_ttfb_seconds_count{{{l}}}"));
    }
    series(&m, "zgix_upstream_panic_picks_total{cluster=\"web\"}");
    // One family name, one TYPE line: a scrape with a repeated family is rejected whole.
    let mut seen = BTreeSet::new();
    for line in m.lines().filter(|l| l.starts_with("# TYPE ")) {
        let name = line.split(' ').nth(2).unwrap_or_default().to_string();
        assert!(seen.insert(name.clone()), "{name} declared twice:\n{m}");
    }
}
