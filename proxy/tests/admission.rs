//! End-to-end admission controls: rate limit (429) and WAF-lite, what spends a token, and the order of the checks, with exact bytes and exact counter deltas from `/metrics` (connection limits: admission_limits.rs).
//!
//! Every rate limit here refills one token per hour, so no token can accrue
//! while a test runs and no result depends on timing. Source addresses other
//! than 127.0.0.1 come from `connect_from` (all of 127/8 is loopback on Linux);
//! identities no socket can have (other IPv4 networks, IPv6 /64s) come from a
//! PROXY protocol header on a loopback connection.

mod admission_support;
mod support;

use support::{escape, Client, Origin};

use admission_support::*;

// ---------------------------------------------------------------------------
// 1. Rate limiting
// ---------------------------------------------------------------------------

#[test]
fn rate_limit_burst_then_429_closes_and_is_per_address() {
    let origin = Origin::start();
    let zgix = start(&origin, &[listener(&rate(3))], "");
    let before = scrape(&zgix);

    let mut c = Client::connect(zgix.addr());
    for _ in 0..3 {
        assert_ok(&mut c, &get_req("/"));
    }
    // The 4th request on the same keep-alive connection: exact 429, then a real close.
    expect_429(&mut c, &get_req("/"));
    let mid = expect_deltas(
        &zgix,
        &before,
        &[(RATE, 1), (&responses(0, 2), 3), (&responses(0, 4), 1)],
    );

    // A new connection from the same address still finds the bucket empty.
    let mut again = Client::connect(zgix.addr());
    expect_429(&mut again, &get_req("/"));
    // Another address has its own bucket.
    let mut other = client_from(&zgix, 0, lo(2));
    assert_ok(&mut other, &get_req("/"));
    assert_ok(&mut other, &get_req("/"));
    expect_deltas(
        &zgix,
        &mid,
        &[(RATE, 1), (&responses(0, 2), 2), (&responses(0, 4), 1)],
    );
    // The refused requests never reached the origin.
    assert_eq!(origin.requests().len(), 5);
}

#[test]
fn rate_limit_bucket_is_shared_across_listeners() {
    let origin = Origin::start();
    let zgix = start(&origin, &[listener(&rate(2)), listener(&rate(2))], "");
    let before = scrape(&zgix);

    assert_ok(&mut Client::connect(zgix.listeners[0]), &get_req("/"));
    assert_ok(&mut Client::connect(zgix.listeners[1]), &get_req("/"));
    // The third request, on either listener, finds the one shared bucket empty.
    expect_429(&mut Client::connect(zgix.listeners[0]), &get_req("/"));
    expect_429(&mut Client::connect(zgix.listeners[1]), &get_req("/"));
    expect_deltas(
        &zgix,
        &before,
        &[
            (RATE, 2),
            (&responses(0, 2), 1),
            (&responses(1, 2), 1),
            (&responses(0, 4), 1),
            (&responses(1, 4), 1),
        ],
    );
    assert_eq!(origin.requests().len(), 2);
}

#[test]
fn rate_limit_keys_ipv4_by_address_and_ipv6_by_slash_64() {
    // PROXY protocol supplies identities no loopback socket can have.
    let origin = Origin::start();
    let zgix = start(
        &origin,
        &[listener_with("\"proxy_protocol\":true", &rate(1))],
        "",
    );
    let before = scrape(&zgix);

    // IPv4: each /32 is its own identity.
    assert_ok(&mut client_as(&zgix, 0, "192.0.2.1"), &get_req("/"));
    assert_ok(&mut client_as(&zgix, 0, "192.0.2.2"), &get_req("/"));
    expect_429(&mut client_as(&zgix, 0, "192.0.2.1"), &get_req("/"));
    // IPv6: two addresses in one /64 share a bucket; the next /64 has its own.
    assert_ok(&mut client_as(&zgix, 0, "2001:db8:0:1::1"), &get_req("/"));
    expect_429(
        &mut client_as(&zgix, 0, "2001:db8:0:1:ffff:ffff:ffff:ffff"),
        &get_req("/"),
    );
    assert_ok(&mut client_as(&zgix, 0, "2001:db8:0:2::1"), &get_req("/"));
    // An IPv4-mapped IPv6 source is the IPv4 client it stands for, not one /64.
    expect_429(&mut client_as(&zgix, 0, "::ffff:192.0.2.2"), &get_req("/"));
    assert_ok(&mut client_as(&zgix, 0, "::ffff:192.0.2.3"), &get_req("/"));
    // The TCP peer (127.0.0.1 throughout) is not the identity.
    expect_deltas(&zgix, &before, &[(RATE, 3), (&responses(0, 2), 5)]);
}

#[test]
fn rate_limited_request_with_a_body_closes_without_reading_it_as_a_request() {
    let origin = Origin::start();
    let zgix = start(&origin, &[listener(&rate(1))], "");
    let before = scrape(&zgix);

    let mut c = Client::connect(zgix.addr());
    assert_ok(&mut c, &get_req("/"));
    // Over the rate with a body that looks like a request: one 429, a close,
    // and the body is never answered or forwarded as a request of its own.
    let inner = b"GET /smuggled HTTP/1.1\r\nHost: t\r\n\r\n";
    let mut req = format!(
        "POST /upload HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n",
        inner.len()
    )
    .into_bytes();
    req.extend_from_slice(inner);
    expect_429(&mut c, &req);
    expect_deltas(
        &zgix,
        &before,
        &[(RATE, 1), (&responses(0, 2), 1), (&responses(0, 4), 1)],
    );
    let seen = origin.requests();
    assert_eq!(seen.len(), 1, "origin saw {seen:?}");
}

// ---------------------------------------------------------------------------
// 3. WAF-lite
// ---------------------------------------------------------------------------

#[test]
fn waf_matches_path_query_and_header_values_case_insensitively() {
    let origin = Origin::start();
    let zgix = start(&origin, &[listener(&format!("\"waf\":{{{DENY}}}"))], "");
    let before = scrape(&zgix);

    let hits: [&[u8]; 8] = [
        // Canonical path: `/./` is removed, so the literal `/private/key` appears.
        b"GET /PRIVATE/./Key HTTP/1.1\r\nHost: t\r\n\r\n",
        // Merged slashes, mixed case.
        b"GET //Private//kEY/file HTTP/1.1\r\nHost: t\r\n\r\n",
        // Absolute form: the path is the canonical path.
        b"GET http://t/private/key HTTP/1.1\r\nHost: t\r\n\r\n",
        // Raw query: `../` never survives canonicalisation in a path, but does in a query.
        b"GET /download?file=../../etc/passwd HTTP/1.1\r\nHost: t\r\n\r\n",
        b"GET /q?t=DROP_Table HTTP/1.1\r\nHost: t\r\n\r\n",
        // Header values, any header, mixed case.
        b"GET / HTTP/1.1\r\nHost: t\r\nX-Comment: hi <ScRiPt>alert(1)</script>\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: t\r\nAccept: */*\r\nUser-Agent: x UNION SeLeCt 1\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: t\r\nReferer: http://t/a/../b\r\n\r\n",
    ];
    for hit in hits {
        expect_refusal(&mut Client::connect(zgix.addr()), hit, 403, "Forbidden");
    }
    // A hit mid keep-alive: the connection's earlier request is unaffected.
    let mut c = Client::connect(zgix.addr());
    assert_ok(&mut c, &get_req("/first"));
    expect_refusal(&mut c, &get_req("/x?q=Drop_Table"), 403, "Forbidden");
    let n_hits = hits.len() as u64 + 1;
    let after_hits = expect_deltas(
        &zgix,
        &before,
        &[
            (WAF, n_hits),
            (&responses(0, 4), n_hits),
            (&responses(0, 2), 1),
        ],
    );
    // No refused request was routed: the origin saw only `/first`.
    let seen = origin.requests();
    assert_eq!(seen.len(), 1, "origin saw {seen:?}");
    assert!(
        seen[0].head.starts_with(b"GET /first "),
        "{}",
        escape(&seen[0].head)
    );

    let misses: [&[u8]; 6] = [
        b"GET /index.html?q=hello HTTP/1.1\r\nHost: t\r\n\r\n",
        // No percent-decoding: `%3C` is not `<`, `%2e%2e%2f` is not `../`.
        b"GET /?q=%3Cscript%3E&f=%2e%2e%2fetc HTTP/1.1\r\nHost: t\r\n\r\n",
        // The raw path has `../`, the canonical path (`/key`) has not.
        b"GET /private/../key HTTP/1.1\r\nHost: t\r\n\r\n",
        // Header names are not matched.
        b"GET / HTTP/1.1\r\nHost: t\r\nDrop_Table: 1\r\n\r\n",
        // Literals are not matched across a separator they do not contain.
        b"GET /?q=union+select HTTP/1.1\r\nHost: t\r\n\r\n",
        // The body is not inspected.
        b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 18\r\n\r\n<script>x</script>",
    ];
    for miss in misses {
        assert_ok(&mut Client::connect(zgix.addr()), miss);
    }
    expect_deltas(
        &zgix,
        &after_hits,
        &[
            (&responses(0, 2), misses.len() as u64),
            (&responses(0, 4), 0),
        ],
    );
    assert_eq!(origin.requests().len(), 1 + misses.len());
}

#[test]
fn waf_custom_status_is_used_and_no_filter_exempts_a_hit() {
    let origin = Origin::start();
    let http = format!(
        "\"waf\":{{{DENY},\"status\":404}},\"request_filters\":[{{\"match\":{{}},\"action\":{{\"allow\":{{}}}}}}]"
    );
    let zgix = start(&origin, &[listener(&http)], "");
    let before = scrape(&zgix);

    expect_refusal(
        &mut Client::connect(zgix.addr()),
        b"GET /a?x=1 HTTP/1.1\r\nHost: t\r\nX-Q: 1 union SELECT 2\r\n\r\n",
        404,
        "Not Found",
    );
    expect_refusal(
        &mut Client::connect(zgix.addr()),
        &get_req("/private/key"),
        404,
        "Not Found",
    );
    expect_deltas(&zgix, &before, &[(WAF, 2), (&responses(0, 4), 2)]);
    // Never routed, never dialed.
    assert_eq!(origin.accepted(), 0, "origin was dialed for a WAF hit");
    assert!(origin.requests().is_empty());
    // The allow filter still routes clean requests.
    assert_ok(&mut Client::connect(zgix.addr()), &get_req("/clean"));
}

// ---------------------------------------------------------------------------
// 4. What spends a token
// ---------------------------------------------------------------------------

#[test]
fn waf_refused_request_spends_a_token() {
    let origin = Origin::start();
    let http = format!("{},\"waf\":{{{DENY}}}", rate(2));
    let zgix = start(&origin, &[listener(&http)], "");
    let before = scrape(&zgix);

    expect_refusal(
        &mut Client::connect(zgix.addr()),
        &get_req("/private/key"),
        403,
        "Forbidden",
    );
    let mut c = Client::connect(zgix.addr());
    assert_ok(&mut c, &get_req("/"));
    expect_429(&mut c, &get_req("/"));
    expect_deltas(
        &zgix,
        &before,
        &[
            (RATE, 1),
            (WAF, 1),
            (&responses(0, 2), 1),
            (&responses(0, 4), 2),
        ],
    );
    assert_eq!(origin.requests().len(), 1);
}

#[test]
fn malformed_and_oversized_requests_spend_no_token() {
    let origin = Origin::start();
    let zgix = start(
        &origin,
        &[listener(&rate(1))],
        "\"max_request_line\":128,\"max_header_bytes\":512,\"max_request_body\":16",
    );
    let before = scrape(&zgix);

    // Content-Length with Transfer-Encoding: 400.
    expect_refusal(
        &mut Client::connect(zgix.addr()),
        b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        400,
        "Bad Request",
    );
    // A declared body past max_request_body: 413.
    expect_refusal(
        &mut Client::connect(zgix.addr()),
        b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n",
        413,
        "Content Too Large",
    );
    // A request line past max_request_line: 414.
    let long = format!("/{}", "a".repeat(300));
    expect_refusal(
        &mut Client::connect(zgix.addr()),
        &get_req(&long),
        414,
        "URI Too Long",
    );
    // A head past max_header_bytes: 431.
    let big = format!(
        "GET / HTTP/1.1\r\nHost: t\r\nX-Big: {}\r\n\r\n",
        "b".repeat(1000)
    );
    expect_refusal(
        &mut Client::connect(zgix.addr()),
        big.as_bytes(),
        431,
        "Request Header Fields Too Large",
    );
    // The single token (burst 1) is still there, and it is the only one.
    let mut c = Client::connect(zgix.addr());
    assert_ok(&mut c, &get_req("/"));
    expect_429(&mut c, &get_req("/"));
    expect_deltas(
        &zgix,
        &before,
        &[(RATE, 1), (&responses(0, 2), 1), (&responses(0, 4), 5)],
    );
    assert_eq!(origin.requests().len(), 1);
}

// ---------------------------------------------------------------------------
// 8. Order: rate, then connection limit, then WAF
// ---------------------------------------------------------------------------

#[test]
fn rate_limit_is_checked_before_the_waf() {
    let origin = Origin::start();
    let http = format!("{},\"waf\":{{{DENY}}}", rate(1));
    let zgix = start(&origin, &[listener(&http)], "");
    let before = scrape(&zgix);

    assert_ok(&mut Client::connect(zgix.addr()), &get_req("/"));
    // Over the rate and a WAF hit: 429, and the WAF did not count it.
    expect_429(&mut Client::connect(zgix.addr()), &get_req("/private/key"));
    expect_deltas(
        &zgix,
        &before,
        &[(RATE, 1), (&responses(0, 2), 1), (&responses(0, 4), 1)],
    );
    assert_eq!(origin.requests().len(), 1);
}

#[test]
fn conn_limit_is_checked_before_the_waf() {
    let origin = Origin::start();
    let http = format!("{},\"waf\":{{{DENY}}}", conn_limit(1));
    let zgix = start(&origin, &[listener(&http)], "");
    let before = scrape(&zgix);

    let mut held = Client::connect(zgix.addr());
    assert_ok(&mut held, &get_req("/"));
    // Conn-limited and a WAF hit: 503, and the WAF did not count it.
    expect_refusal(
        &mut Client::connect(zgix.addr()),
        &get_req("/private/key"),
        503,
        "Service Unavailable",
    );
    let mid = expect_deltas(
        &zgix,
        &before,
        &[(CONN, 1), (&responses(0, 2), 1), (&responses(0, 5), 1)],
    );
    // On the admitted connection the WAF still applies.
    expect_refusal(&mut held, &get_req("/private/key"), 403, "Forbidden");
    expect_deltas(&zgix, &mid, &[(WAF, 1), (&responses(0, 4), 1)]);
    assert_eq!(origin.requests().len(), 1);
}

#[test]
fn rate_limit_is_checked_before_the_conn_limit() {
    let origin = Origin::start();
    let http = format!("{},{}", rate(1), conn_limit(1));
    let zgix = start(&origin, &[listener(&http)], "");
    let before = scrape(&zgix);

    let mut held = Client::connect(zgix.addr());
    assert_ok(&mut held, &get_req("/"));
    // Over the rate and over the connection limit: 429, not 503.
    expect_429(&mut Client::connect(zgix.addr()), &get_req("/"));
    expect_deltas(
        &zgix,
        &before,
        &[(RATE, 1), (&responses(0, 2), 1), (&responses(0, 4), 1)],
    );
}

// ---------------------------------------------------------------------------
