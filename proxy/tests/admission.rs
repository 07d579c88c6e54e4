//! End-to-end admission controls: rate limit (429), connection limit (503) and WAF-lite, with exact bytes and exact counter deltas from `/metrics`.
//!
//! Every rate limit here refills one token per hour, so no token can accrue
//! while a test runs and no result depends on timing. Source addresses other
//! than 127.0.0.1 come from `connect_from` (all of 127/8 is loopback on Linux);
//! identities no socket can have (other IPv4 networks, IPv6 /64s) come from a
//! PROXY protocol header on a loopback connection.

mod support;

use std::collections::BTreeMap;
use std::io::Read;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use support::{
    assert_bytes, connect_from, escape, generated, unstamped, Client, Origin, Zgix, OK_BODY,
};

/// One token per hour: nothing refills while a test runs.
const HOUR_MS: u64 = 3_600_000;

/// The five admission counters, each also exported as `<name>_total`.
const ADMISSION: [&str; 5] = [
    "zgix_l7_rate_limited",
    "zgix_l7_rate_limit_full",
    "zgix_l7_conn_limited",
    "zgix_l7_conn_limit_full",
    "zgix_l7_waf_blocked",
];

const RATE: &str = "zgix_l7_rate_limited";
const RATE_FULL: &str = "zgix_l7_rate_limit_full";
const CONN: &str = "zgix_l7_conn_limited";
const CONN_FULL: &str = "zgix_l7_conn_limit_full";
const WAF: &str = "zgix_l7_waf_blocked";

/// How long a metric may take to show an expected value (2xx responses are
/// counted after the response is written, so a scrape can race them).
const METRIC_WAIT: Duration = Duration::from_secs(5);

// ---------------------------------------------------------------------------
// Config
// ---------------------------------------------------------------------------

/// A listener on 127.0.0.1:0 forwarding to cluster `api`; `http` is extra
/// fields inside `http` (e.g. `"rate_limit":{...}`), `top` extra listener fields.
fn listener_with(top: &str, http: &str) -> String {
    let top = if top.is_empty() {
        String::new()
    } else {
        format!(",{top}")
    };
    let http = if http.is_empty() {
        String::new()
    } else {
        format!(",{http}")
    };
    format!("{{\"bind\":\"127.0.0.1:0\"{top},\"http\":{{\"cluster\":\"api\"{http}}}}}")
}

fn listener(http: &str) -> String {
    listener_with("", http)
}

fn rate(burst: u64) -> String {
    format!("\"rate_limit\":{{\"requests\":1,\"window_ms\":{HOUR_MS},\"burst\":{burst}}}")
}

fn conn_limit(max: u64) -> String {
    format!("\"conn_limit\":{{\"max\":{max}}}")
}

/// Starts zgix with an admin endpoint, `listeners`, cluster `api` = `origin`
/// and `limits` (a JSON object body such as `"rate_limit_entries":1`).
fn start(origin: &Origin, listeners: &[String], limits: &str) -> Zgix {
    let json = format!(
        "{{\"admin\":{{\"bind\":\"127.0.0.1:0\"}},\"listeners\":[{}],\"clusters\":{{\"api\":{{\"endpoints\":[\"{}\"],\"lb\":\"round_robin\"}}}},\"limits\":{{{limits}}}}}",
        listeners.join(","),
        origin.addr()
    );
    let zgix = Zgix::start_json(&json);
    assert_eq!(
        zgix.listeners.len(),
        listeners.len(),
        "listener lines; stderr:\n{}",
        zgix.stderr()
    );
    assert!(
        zgix.admin.is_some(),
        "no admin line; stderr:\n{}",
        zgix.stderr()
    );
    zgix
}

// ---------------------------------------------------------------------------
// Clients and responses
// ---------------------------------------------------------------------------

fn v4(addr: SocketAddr) -> SocketAddrV4 {
    match addr {
        SocketAddr::V4(a) => a,
        SocketAddr::V6(a) => panic!("listener {a} is not IPv4"),
    }
}

/// 127.0.0.`n`.
fn lo(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 0, n)
}

/// A client of listener `li` whose source address is `src`.
#[track_caller]
fn client_from(zgix: &Zgix, li: usize, src: Ipv4Addr) -> Client {
    let dest = v4(zgix.listeners[li]);
    match connect_from(src, dest) {
        Ok(stream) => Client::from_stream(stream),
        Err(e) => panic!("connect {src} -> {dest}: {e}"),
    }
}

/// A keep-alive GET with a Host header.
fn get_req(target: &str) -> Vec<u8> {
    format!("GET {target} HTTP/1.1\r\nHost: test.local\r\n\r\n").into_bytes()
}

/// Asserts a 200 `ok\n` forwarded from the origin.
#[track_caller]
fn assert_ok(client: &mut Client, request: &[u8]) {
    let resp = client.request(request);
    assert_eq!(
        resp.status,
        200,
        "request \"{}\" got \"{}\"",
        escape(request),
        resp.show()
    );
    assert_bytes(&resp.body, OK_BODY);
    assert_eq!(
        resp.field("x-origin"),
        Some("o"),
        "not from the origin: \"{}\"",
        resp.show()
    );
}

/// Asserts the peer closed with a FIN: nothing more arrives and a read returns EOF.
#[track_caller]
fn expect_eof(client: &mut Client) {
    // Through the buffered reader first, so stray bytes after the response fail loudly.
    client.expect_closed();
    let mut byte = [0u8; 1];
    match client.stream().read(&mut byte) {
        Ok(0) => {}
        Ok(_) => panic!("bytes after the close: \"{}\"", client.transcript()),
        Err(e) => panic!("expected EOF, read failed: {e}"),
    }
}

/// Sends `request` (ignoring a write error: a refusal may race it), expects
/// exactly zgix's own `code reason` refusal, then EOF.
#[track_caller]
fn expect_refusal(client: &mut Client, request: &[u8], code: u16, reason: &str) {
    let _ = client.try_send(request);
    let resp = match client.try_read_response(false) {
        Ok(r) => r,
        Err(e) => panic!(
            "request \"{}\": expected {code} {reason}, read failed: {e}; received \"{}\"",
            escape(request),
            client.transcript()
        ),
    };
    assert_bytes(&unstamped(&resp.raw), &generated(code, reason));
    expect_eof(client);
}

/// The exact 429 zgix writes, with `retry-after: secs`.
fn too_many(secs: u64) -> Vec<u8> {
    format!(
        "HTTP/1.1 429 Too Many Requests\r\ncontent-type: text/plain\r\ncontent-length: 18\r\nretry-after: {secs}\r\nconnection: close\r\n\r\nToo Many Requests\n"
    )
    .into_bytes()
}

/// Sends `request` and expects the exact rate-limit 429 with a Retry-After of
/// 1 s to one hour (the time one token takes), then EOF. Returns Retry-After.
#[track_caller]
fn expect_429(client: &mut Client, request: &[u8]) -> u64 {
    let _ = client.try_send(request);
    let resp = match client.try_read_response(false) {
        Ok(r) => r,
        Err(e) => panic!(
            "expected 429, read failed: {e}; received \"{}\"",
            client.transcript()
        ),
    };
    assert_eq!(resp.status, 429, "got \"{}\"", resp.show());
    let secs: u64 = resp
        .field("retry-after")
        .unwrap_or_else(|| panic!("429 without retry-after: \"{}\"", resp.show()))
        .parse()
        .unwrap_or_else(|_| panic!("retry-after not an integer: \"{}\"", resp.show()));
    assert!(
        (1..=HOUR_MS / 1000).contains(&secs),
        "retry-after {secs} outside 1..=3600 for one token per hour"
    );
    assert_bytes(&unstamped(&resp.raw), &too_many(secs));
    expect_eof(client);
    secs
}

/// PROXY protocol v1 header claiming `src` (an IPv4 or IPv6 address literal).
fn proxy_v1(src: &str) -> String {
    if src.contains(':') {
        format!("PROXY TCP6 {src} ::1 40000 80\r\n")
    } else {
        format!("PROXY TCP4 {src} 127.0.0.1 40000 80\r\n")
    }
}

/// A client of listener `li` (which has `proxy_protocol` on) that has sent a
/// PROXY header claiming `src`.
#[track_caller]
fn client_as(zgix: &Zgix, li: usize, src: &str) -> Client {
    let mut client = Client::connect(zgix.listeners[li]);
    client.send(proxy_v1(src).as_bytes());
    client
}

/// Polls until `f` holds (bounded), returning whether it did.
fn eventually(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

// ---------------------------------------------------------------------------
// Metrics
// ---------------------------------------------------------------------------

/// One scrape of `/metrics`: series (name and labels, as written) to value.
#[derive(Clone, Debug)]
struct Scrape {
    text: String,
    series: BTreeMap<String, f64>,
}

impl Scrape {
    #[track_caller]
    fn value(&self, series: &str) -> f64 {
        *self
            .series
            .get(series)
            .unwrap_or_else(|| panic!("no series {series} in /metrics:\n{}", self.text))
    }

    /// A counter value as an integer.
    #[track_caller]
    fn count(&self, series: &str) -> u64 {
        let v = self.value(series);
        assert!(
            v >= 0.0 && v.fract() == 0.0,
            "{series} = {v} is not a count"
        );
        v as u64
    }
}

/// The raw `/metrics` response of `zgix`'s admin endpoint.
#[track_caller]
fn metrics_text(zgix: &Zgix) -> String {
    let admin = zgix.admin.expect("zgix started without admin");
    let mut client = Client::connect(admin);
    let resp = client.request(b"GET /metrics HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n");
    assert_eq!(resp.status, 200, "/metrics: \"{}\"", resp.show());
    String::from_utf8(resp.body).expect("/metrics is UTF-8")
}

#[track_caller]
fn scrape(zgix: &Zgix) -> Scrape {
    let text = metrics_text(zgix);
    let mut series = BTreeMap::new();
    for line in text.lines() {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("bad metrics line {line:?}"));
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value in metrics line {line:?}"));
        // Per-code response series, also summed by class (listed even at 0).
        if let Some(labels) = name.strip_prefix("zgix_http_responses_total{") {
            if let Some((listener, code)) = labels.split_once(",code=\"") {
                let class = format!(
                    "zgix_http_responses_total{{{listener},class=\"{}xx\"}}",
                    &code[..1]
                );
                *series.entry(class).or_insert(0.0) += value;
            }
        }
        series.insert(name.to_string(), value);
    }
    for li in 0..4 {
        for class in 1..=5 {
            series.entry(responses(li, class)).or_insert(0.0);
        }
    }
    Scrape { text, series }
}

/// The name of listener `i`: unnamed listeners on 127.0.0.1:0 are named by
/// that address, repeats with `#<index>` (`Config::listener_names`).
fn listener_name(i: usize) -> String {
    if i == 0 {
        "127.0.0.1:0".into()
    } else {
        format!("127.0.0.1:0#{i}")
    }
}

/// Responses of a status class on a listener: a sum `scrape` adds up from
/// the per-code series.
fn responses(listener: usize, class: u8) -> String {
    format!(
        "zgix_http_responses_total{{listener=\"{}\",class=\"{class}xx\"}}",
        listener_name(listener)
    )
}

/// Differences from `expected` (series, delta) since `before`; each of the
/// five admission counters not listed must not have moved, and each must equal
/// its `_total` twin.
fn mismatches(before: &Scrape, after: &Scrape, expected: &[(&str, u64)]) -> Vec<String> {
    let mut want: BTreeMap<String, u64> = ADMISSION.iter().map(|n| (n.to_string(), 0)).collect();
    for (name, delta) in expected {
        want.insert(name.to_string(), *delta);
    }
    let mut bad = Vec::new();
    for (name, delta) in &want {
        let (Some(b), Some(a)) = (before.series.get(name), after.series.get(name)) else {
            bad.push(format!("{name}: missing"));
            continue;
        };
        let got = a - b;
        if got != *delta as f64 {
            bad.push(format!("{name}: moved by {got}, expected {delta}"));
        }
    }
    for name in ADMISSION {
        let total = format!("{name}_total");
        if after.series.get(name) != after.series.get(&total) {
            bad.push(format!(
                "{name} = {:?} but {total} = {:?}",
                after.series.get(name),
                after.series.get(&total)
            ));
        }
    }
    bad
}

/// Scrapes until every expected delta holds (bounded) and returns that scrape.
#[track_caller]
fn expect_deltas(zgix: &Zgix, before: &Scrape, expected: &[(&str, u64)]) -> Scrape {
    let deadline = Instant::now() + METRIC_WAIT;
    loop {
        let after = scrape(zgix);
        let bad = mismatches(before, &after, expected);
        if bad.is_empty() {
            return after;
        }
        if Instant::now() >= deadline {
            panic!(
                "counter deltas wrong:\n  {}\n/metrics:\n{}",
                bad.join("\n  "),
                after.text
            );
        }
        thread::sleep(Duration::from_millis(50));
    }
}

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

const DENY: &str =
    "\"deny\":[\"<script\",\"union select\",\"../\",\"/private/key\",\"drop_table\"]";

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
