//! The admission modes of issue 22 allocate nothing per request either: header keys hashed, every request overflowing into the shared bucket, all three controls refusing in dry run, RateLimit fields spliced into every head.

mod support;

use std::time::Duration;

use support::*;

/// The request sent `i`th in a window.
fn request(i: usize) -> String {
    format!("GET /a/evil?i={i} HTTP/1.1\r\nHost: t\r\nX-Api-Key: k{i}\r\nAccept: */*\r\n\r\n")
}

const REQUESTS: usize = 2000;

#[test]
fn no_alloc_per_request_with_header_keys_overflow_and_dry_run() {
    let origin = Origin::start();
    // An 8-slot table and a new key per request: after 8 requests every one
    // overflows into the shared bucket, which is empty after its burst of 1, so
    // each request is a dry-run rate refusal and a dry-run WAF hit (`evil`).
    let json = format!(
        r#"{{ "cpus": [0], "admin": {{"bind": "127.0.0.1:0"}},
  "listeners": [{{"bind": "127.0.0.1:0", "http": {{"cluster": "o",
    "rate_limit": {{"requests": 1, "window_ms": 3600000, "burst": 1, "dry_run": true,
                    "key": {{"header": "x-api-key"}}, "headers": "draft-11"}},
    "conn_limit": {{"max": 100, "dry_run": true}},
    "waf": {{"deny": ["evil"], "dry_run": true}} }} }}],
  "clusters": {{"o": {{"endpoints": ["{}"]}}}},
  "limits": {{"busy_poll_us": 100000, "rate_limit_entries": 8, "rate_limit_overflow": "shared"}} }}"#,
        origin.addr()
    );
    let zgix = Zgix::start_json(&json);
    let mut client = Client::connect(zgix.addr());
    for _ in 0..20 {
        assert_eq!(client.get("/warm").status, 200);
    }
    let (busy, took) = allocation_window(&zgix, &mut client, REQUESTS, Duration::ZERO, request);
    let (idle, _) = allocation_window(&zgix, &mut client, 0, took, request);
    assert!(
        busy <= idle + REQUESTS as u64 / 20,
        "{REQUESTS} requests made {} more allocations than none ({busy} vs {idle})",
        busy.saturating_sub(idle)
    );
    let m = metrics_text(&zgix);
    let dry_rate = series(
        &m,
        "zgix_l7_dry_run_total{listener=\"127.0.0.1:0\",control=\"rate_limit\"}",
    );
    assert!(
        dry_rate >= (REQUESTS - 10) as f64,
        "dry-run rate refusals: {dry_rate}"
    );
    let dry_waf = series(
        &m,
        "zgix_l7_dry_run_total{listener=\"127.0.0.1:0\",control=\"waf\"}",
    );
    assert_eq!(dry_waf, REQUESTS as f64);
    assert!(series(&m, "zgix_l7_rate_limit_full") >= (REQUESTS - 10) as f64);
}
