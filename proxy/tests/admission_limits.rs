//! End-to-end connection limits (503), full tables failing open, and `/metrics` passing promtool after every kind of admission traffic.
//!
//! Shares the rate-limit tests' helpers (admission_support): one token per hour, so no result depends on timing.

mod admission_support;
mod support;

use std::io::Read;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use support::{assert_bytes, generated, unstamped, Client, Origin, OK_BODY};

use admission_support::*;

// 5. Connection limits
// ---------------------------------------------------------------------------

#[test]
fn conn_limit_caps_concurrent_connections_and_releases_on_close() {
    let origin = Origin::start();
    let zgix = start(&origin, &[listener(&conn_limit(2))], "");
    let before = scrape(&zgix);

    let mut a = Client::connect(zgix.addr());
    assert_ok(&mut a, &get_req("/a"));
    let mut b = Client::connect(zgix.addr());
    assert_ok(&mut b, &get_req("/b"));
    // Every request on a held connection shares its one count.
    for _ in 0..4 {
        assert_ok(&mut a, &get_req("/a"));
    }
    // A third connection's first request: exact 503, then a close.
    expect_refusal(
        &mut Client::connect(zgix.addr()),
        &get_req("/c"),
        503,
        "Service Unavailable",
    );
    let mid = expect_deltas(
        &zgix,
        &before,
        &[(CONN, 1), (&responses(0, 2), 6), (&responses(0, 5), 1)],
    );
    // The held connections are unaffected.
    assert_ok(&mut b, &get_req("/b"));

    // Closing one held connection releases its count.
    drop(a);
    let mut refused = 0u64;
    let mut admitted = None;
    for _ in 0..100 {
        let mut c = Client::connect(zgix.addr());
        let resp = c.request(&get_req("/d"));
        match resp.status {
            200 => {
                assert_bytes(&resp.body, OK_BODY);
                admitted = Some(c);
                break;
            }
            503 => {
                assert_bytes(
                    &unstamped(&resp.raw),
                    &generated(503, "Service Unavailable"),
                );
                refused += 1;
                thread::sleep(Duration::from_millis(50));
            }
            s => panic!("unexpected {s}: \"{}\"", resp.show()),
        }
    }
    let mut d = admitted.expect("the closed connection's count was never released (5 s)");
    // Still capped at two: b and d.
    expect_refusal(
        &mut Client::connect(zgix.addr()),
        &get_req("/e"),
        503,
        "Service Unavailable",
    );
    assert_ok(&mut d, &get_req("/d"));
    expect_deltas(
        &zgix,
        &mid,
        &[
            (CONN, refused + 1),
            (&responses(0, 2), 3),
            (&responses(0, 5), refused + 1),
        ],
    );
    drop(b);
}

#[test]
fn conn_count_is_released_when_a_refusal_closes_the_connection() {
    let origin = Origin::start();
    let http = format!("{},\"waf\":{{{DENY}}}", conn_limit(1));
    let zgix = start(&origin, &[listener(&http)], "");
    let before = scrape(&zgix);

    // Admitted (counted), then refused by the WAF and closed.
    let mut a = Client::connect(zgix.addr());
    assert_ok(&mut a, &get_req("/"));
    expect_refusal(&mut a, &get_req("/private/key"), 403, "Forbidden");
    // The count goes with the connection: a new one is admitted (bounded poll,
    // since the release follows the close asynchronously).
    let mut refused = 0u64;
    let mut admitted = false;
    for _ in 0..100 {
        let mut c = Client::connect(zgix.addr());
        let resp = c.request(&get_req("/"));
        if resp.status == 200 {
            admitted = true;
            break;
        }
        assert_bytes(
            &unstamped(&resp.raw),
            &generated(503, "Service Unavailable"),
        );
        refused += 1;
        thread::sleep(Duration::from_millis(50));
    }
    assert!(
        admitted,
        "the refused connection's count was never released (5 s)"
    );
    expect_deltas(
        &zgix,
        &before,
        &[
            (WAF, 1),
            (CONN, refused),
            (&responses(0, 2), 2),
            (&responses(0, 4), 1),
            (&responses(0, 5), refused),
        ],
    );
}

#[test]
fn conn_is_counted_at_first_request_not_at_accept() {
    let origin = Origin::start();
    let zgix = start(&origin, &[listener(&conn_limit(1))], "");
    let before = scrape(&zgix);

    // Open, but no request yet: not counted.
    let mut idle = Client::connect(zgix.addr());
    let mut busy = Client::connect(zgix.addr());
    assert_ok(&mut busy, &get_req("/"));
    // Now the idle connection's first request is the second connection.
    expect_refusal(&mut idle, &get_req("/"), 503, "Service Unavailable");
    expect_deltas(
        &zgix,
        &before,
        &[(CONN, 1), (&responses(0, 2), 1), (&responses(0, 5), 1)],
    );
}

#[test]
fn conn_limit_identity_is_the_proxy_protocol_source() {
    let origin = Origin::start();
    let zgix = start(
        &origin,
        &[listener_with("\"proxy_protocol\":true", &conn_limit(1))],
        "",
    );
    let before = scrape(&zgix);

    // Every TCP peer is 127.0.0.1; the identities are the PROXY sources.
    let mut a = client_as(&zgix, 0, "198.51.100.7");
    assert_ok(&mut a, &get_req("/"));
    let mut b = client_as(&zgix, 0, "198.51.100.8");
    assert_ok(&mut b, &get_req("/"));
    expect_refusal(
        &mut client_as(&zgix, 0, "198.51.100.7"),
        &get_req("/"),
        503,
        "Service Unavailable",
    );
    expect_deltas(
        &zgix,
        &before,
        &[(CONN, 1), (&responses(0, 2), 2), (&responses(0, 5), 1)],
    );
}

#[test]
fn conn_limit_counts_one_identity_across_listeners() {
    let origin = Origin::start();
    let zgix = start(
        &origin,
        &[listener(&conn_limit(1)), listener(&conn_limit(1))],
        "",
    );
    let before = scrape(&zgix);

    let mut held = Client::connect(zgix.listeners[0]);
    assert_ok(&mut held, &get_req("/"));
    expect_refusal(
        &mut Client::connect(zgix.listeners[1]),
        &get_req("/"),
        503,
        "Service Unavailable",
    );
    expect_deltas(
        &zgix,
        &before,
        &[(CONN, 1), (&responses(0, 2), 1), (&responses(1, 5), 1)],
    );
}

// ---------------------------------------------------------------------------
// 6. Table full: fail open
// ---------------------------------------------------------------------------

/// Capacity of `table` from /metrics, asserted to be at most one probe window
/// (8 slots), so every identity probes the whole table and which requests fail
/// open is deterministic.
#[track_caller]
fn small_capacity(s: &Scrape, table: &str) -> u64 {
    let cap = s.count(&format!("zgix_table_slots_capacity{{table=\"{table}\"}}"));
    assert!(
        (1..=8).contains(&cap),
        "{table} table with 1 entry has {cap} slots; this test needs at most one 8-slot probe window"
    );
    cap
}

#[test]
fn full_rate_table_fails_open_and_counts() {
    let origin = Origin::start();
    let zgix = start(&origin, &[listener(&rate(1))], "\"rate_limit_entries\":1");
    let before = scrape(&zgix);
    let cap = small_capacity(&before, "rate");

    // 20 identities, one request each: `cap` take a slot, the rest fail open.
    const N: u8 = 20;
    for i in 0..N {
        assert_ok(&mut client_from(&zgix, 0, lo(2 + i)), &get_req("/"));
    }
    let n = u64::from(N);
    let mid = expect_deltas(
        &zgix,
        &before,
        &[(RATE_FULL, n - cap), (&responses(0, 2), n)],
    );
    assert_eq!(mid.count("zgix_table_slots_in_use{table=\"rate\"}"), cap);

    // Fail open means unlimited: an identity without a slot passes burst 1 three times.
    let mut open = client_from(&zgix, 0, lo(2 + N - 1));
    for _ in 0..3 {
        assert_ok(&mut open, &get_req("/"));
    }
    // An identity holding a slot is still limited.
    expect_429(&mut client_from(&zgix, 0, lo(2)), &get_req("/"));
    expect_deltas(
        &zgix,
        &mid,
        &[
            (RATE_FULL, 3),
            (RATE, 1),
            (&responses(0, 2), 3),
            (&responses(0, 4), 1),
        ],
    );
}

#[test]
fn full_conn_table_fails_open_and_counts() {
    let origin = Origin::start();
    let zgix = start(
        &origin,
        &[listener(&conn_limit(1))],
        "\"conn_limit_entries\":1",
    );
    let before = scrape(&zgix);
    let cap = small_capacity(&before, "conn");

    // 12 identities each hold one connection: `cap` take a slot, the rest fail open.
    const N: u8 = 12;
    let mut held = Vec::new();
    for i in 0..N {
        let mut c = client_from(&zgix, 0, lo(2 + i));
        assert_ok(&mut c, &get_req("/"));
        held.push(c);
    }
    let n = u64::from(N);
    let mid = expect_deltas(
        &zgix,
        &before,
        &[(CONN_FULL, n - cap), (&responses(0, 2), n)],
    );
    assert_eq!(mid.count("zgix_table_slots_in_use{table=\"conn\"}"), cap);

    // An identity without a slot is not limited: a second connection at max 1 passes.
    let mut second = client_from(&zgix, 0, lo(2 + N - 1));
    assert_ok(&mut second, &get_req("/"));
    // An identity holding a slot is still limited.
    expect_refusal(
        &mut client_from(&zgix, 0, lo(2)),
        &get_req("/"),
        503,
        "Service Unavailable",
    );
    expect_deltas(
        &zgix,
        &mid,
        &[
            (CONN_FULL, 1),
            (CONN, 1),
            (&responses(0, 2), 1),
            (&responses(0, 5), 1),
        ],
    );
    drop(held);
}

// ---------------------------------------------------------------------------
// 7. /metrics passes promtool
// ---------------------------------------------------------------------------

const PROMTOOL: &str = "/usr/bin/promtool";

#[test]
fn metrics_pass_promtool_after_every_kind_of_traffic() {
    assert!(
        std::path::Path::new(PROMTOOL).exists(),
        "{PROMTOOL} is missing: install it (Debian/Ubuntu: `apt-get install prometheus`) to run this test"
    );
    let origin = Origin::start();
    let http = format!("{},{},\"waf\":{{{DENY}}}", rate(3), conn_limit(1));
    let zgix = start(
        &origin,
        &[listener(&http)],
        "\"rate_limit_entries\":1,\"conn_limit_entries\":1",
    );

    // 200, then 503 (conn limit) and 429 (rate) for 127.0.0.1.
    let mut held = Client::connect(zgix.addr());
    assert_ok(&mut held, &get_req("/"));
    expect_refusal(
        &mut Client::connect(zgix.addr()),
        &get_req("/"),
        503,
        "Service Unavailable",
    );
    let resp = held.request(&get_req("/status/404"));
    assert_eq!(resp.status, 404, "{}", resp.show());
    // The 503 spent no token, so the burst of 3 has one left.
    assert_ok(&mut held, &get_req("/"));
    expect_429(&mut held, &get_req("/"));
    // WAF hit from another identity.
    expect_refusal(
        &mut client_from(&zgix, 0, lo(2)),
        &get_req("/private/key"),
        403,
        "Forbidden",
    );
    // A malformed request and an origin 5xx.
    expect_refusal(
        &mut Client::connect(zgix.addr()),
        b"GET / HTTP/1.1\r\nHost: t\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        400,
        "Bad Request",
    );
    let mut five = client_from(&zgix, 0, lo(3));
    let resp = five.request(&get_req("/status/500"));
    assert_eq!(resp.status, 500, "{}", resp.show());
    // Both tables overflow: held connections from many identities.
    let mut held_many = Vec::new();
    for i in 10..30 {
        let mut c = client_from(&zgix, 0, lo(i));
        assert_ok(&mut c, &get_req("/"));
        held_many.push(c);
    }

    // Latency histograms are folded in once a second: wait for them.
    let mut last = None;
    let folded = eventually(METRIC_WAIT, || {
        let s = scrape(&zgix);
        let ok = s.value(
            "zgix_request_duration_seconds_count{listener=\"127.0.0.1:0\",decision=\"forwarded\"}",
        ) > 0.0;
        last = Some(s);
        ok
    });
    let s = last.expect("scraped");
    assert!(folded, "histogram never folded in:\n{}", s.text);
    for name in ADMISSION {
        assert!(s.count(name) > 0, "{name} did not move:\n{}", s.text);
    }

    let text = metrics_text(&zgix);
    let mut child = Command::new(PROMTOOL)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn promtool");
    {
        use std::io::Write as _;
        let mut stdin = child.stdin.take().expect("promtool stdin");
        stdin.write_all(text.as_bytes()).expect("write to promtool");
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait promtool") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("promtool did not finish in 30 s");
        }
        thread::sleep(Duration::from_millis(20));
    };
    let mut out = String::new();
    let mut err = String::new();
    if let Some(mut o) = child.stdout.take() {
        let _ = o.read_to_string(&mut out);
    }
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    assert!(
        status.success() && out.trim().is_empty() && err.trim().is_empty(),
        "promtool check metrics: {status}\nstdout:\n{out}\nstderr:\n{err}\nmetrics:\n{text}"
    );
    drop(held_many);
}

#[test]
fn a_503_from_the_conn_limit_spends_no_token() {
    // "Where the token bucket answers too many requests, this answers too many
    // sockets, and the two are independent."
    let origin = Origin::start();
    let zgix = start(
        &origin,
        &[listener(&format!("{},{}", rate(2), conn_limit(1)))],
        "",
    );
    let mut held = Client::connect(zgix.addr());
    assert_ok(&mut held, &get_req("/"));
    for _ in 0..3 {
        expect_refusal(
            &mut Client::connect(zgix.addr()),
            &get_req("/"),
            503,
            "Service Unavailable",
        );
    }
    // Three 503s later the burst of 2 still has its second token.
    assert_ok(&mut held, &get_req("/"));
    expect_429(&mut held, &get_req("/"));
    let m = scrape(&zgix);
    assert_eq!(m.value("zgix_l7_conn_limited"), 3.0);
    assert_eq!(m.value("zgix_l7_rate_limited"), 1.0);
}

#[test]
fn a_429_leaves_no_connection_counted() {
    let origin = Origin::start();
    let zgix = start(
        &origin,
        &[listener(&format!("{},{}", rate(1), conn_limit(1)))],
        "",
    );
    let mut c = Client::connect(zgix.addr());
    assert_ok(&mut c, &get_req("/"));
    expect_429(&mut c, &get_req("/"));
    drop(c);
    // The 429 closed the connection, and its conn-limit count went with it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let m = scrape(&zgix);
        if m.value("zgix_table_slots_in_use{table=\"conn\"}") == 0.0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "conn slot still held:\n{}",
            m.text
        );
        std::thread::yield_now();
    }
}

#[test]
fn a_chunked_body_outgrowing_max_request_body_gives_its_token_back() {
    // "Malformed or oversized requests are answered before this check": for a
    // body whose size no head announces, the 413 comes mid-body, after the
    // check, so the token it took is given back.
    let origin = Origin::start();
    let zgix = start(&origin, &[listener(&rate(1))], "\"max_request_body\":16");
    let mut c = Client::connect(zgix.addr());
    let _ = c.try_send(
        b"POST / HTTP/1.1\r\nHost: test.local\r\nTransfer-Encoding: chunked\r\n\r\n20\r\n0123456789abcdef0123456789abcdef\r\n0\r\n\r\n",
    );
    let resp = c.read_response();
    assert_eq!(resp.status, 413, "{}", resp.show());
    // The burst of 1 is whole again: one request passes, the next is limited.
    let mut d = Client::connect(zgix.addr());
    assert_ok(&mut d, &get_req("/"));
    expect_429(&mut d, &get_req("/"));
}
