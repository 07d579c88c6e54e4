//! Serving a request allocates nothing: zgix counts its shard thread's heap allocations (`zgix_heap_allocations_total`) and they stay flat across thousands of requests on a warm connection, admission controls included.

mod support;

use std::time::Duration;

use support::*;

/// The request sent `i`th in a window.
fn request(i: usize) -> String {
    format!("GET /a/b?i={i} HTTP/1.1\r\nHost: t\r\nUser-Agent: test/1.0\r\nAccept: */*\r\n\r\n")
}

const REQUESTS: usize = 2000;

#[test]
fn no_alloc_per_request() {
    let origin = Origin::start();
    let json = format!(
        r#"{{ "cpus": [0], "admin": {{"bind": "127.0.0.1:0"}},
  "listeners": [{{"bind": "127.0.0.1:0", "http": {{"cluster": "o",
    "rate_limit": {{"requests": 1000000, "window_ms": 1000, "burst": 1000000}},
    "conn_limit": {{"max": 100}},
    "waf": {{"deny": ["union select", "<script", "../"]}} }} }}],
  "clusters": {{"o": {{"endpoints": ["{}"]}}}},
  "limits": {{"busy_poll_us": 100000}} }}"#,
        origin.addr()
    );
    let zgix = Zgix::start_json(&json);
    let mut client = Client::connect(zgix.addr());
    // Warm up: the connection, its buffers, the upstream connection and pool.
    for _ in 0..20 {
        assert_eq!(client.get("/warm").status, 200);
    }
    let (busy, took) = allocation_window(&zgix, &mut client, REQUESTS, Duration::ZERO, request);
    let (idle, _) = allocation_window(&zgix, &mut client, 0, took, request);
    // The scrape in each window allocates a varying few dozen times; one
    // allocation per request would add REQUESTS.
    assert!(
        busy <= idle + REQUESTS as u64 / 20,
        "{REQUESTS} requests made {} more allocations than none ({busy} vs {idle})",
        busy.saturating_sub(idle)
    );
    assert_eq!(origin.accepted(), 1, "one pooled upstream connection");
}
