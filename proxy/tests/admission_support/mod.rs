//! What the admission tests share: configs with rate and connection limits, clients from chosen loopback sources, exact refusals, and `/metrics` scrapes compared by counter deltas.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::Read;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::thread;
use std::time::{Duration, Instant};

use crate::support::{
    assert_bytes, connect_from, escape, generated, unstamped, Client, Origin, Zgix, OK_BODY,
};

/// One token per hour: nothing refills while a test runs.
pub const HOUR_MS: u64 = 3_600_000;

/// The five admission counters, each also exported as `<name>_total`.
pub const ADMISSION: [&str; 5] = [
    "zgix_l7_rate_limited",
    "zgix_l7_rate_limit_full",
    "zgix_l7_conn_limited",
    "zgix_l7_conn_limit_full",
    "zgix_l7_waf_blocked",
];

pub const RATE: &str = "zgix_l7_rate_limited";
pub const RATE_FULL: &str = "zgix_l7_rate_limit_full";
pub const CONN: &str = "zgix_l7_conn_limited";
pub const CONN_FULL: &str = "zgix_l7_conn_limit_full";
pub const WAF: &str = "zgix_l7_waf_blocked";

/// How long a metric may take to show an expected value (2xx responses are
/// counted after the response is written, so a scrape can race them).
pub const METRIC_WAIT: Duration = Duration::from_secs(5);

// ---------------------------------------------------------------------------
// Config
// ---------------------------------------------------------------------------

/// A listener on 127.0.0.1:0 forwarding to cluster `api`; `http` is extra
/// fields inside `http` (e.g. `"rate_limit":{...}`), `top` extra listener fields.
pub fn listener_with(top: &str, http: &str) -> String {
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

pub fn listener(http: &str) -> String {
    listener_with("", http)
}

pub fn rate(burst: u64) -> String {
    format!("\"rate_limit\":{{\"requests\":1,\"window_ms\":{HOUR_MS},\"burst\":{burst}}}")
}

pub fn conn_limit(max: u64) -> String {
    format!("\"conn_limit\":{{\"max\":{max}}}")
}

/// Starts zgix with an admin endpoint, `listeners`, cluster `api` = `origin`
/// and `limits` (a JSON object body such as `"rate_limit_entries":1`).
pub fn start(origin: &Origin, listeners: &[String], limits: &str) -> Zgix {
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

pub fn v4(addr: SocketAddr) -> SocketAddrV4 {
    match addr {
        SocketAddr::V4(a) => a,
        SocketAddr::V6(a) => panic!("listener {a} is not IPv4"),
    }
}

/// 127.0.0.`n`.
pub fn lo(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 0, n)
}

/// A client of listener `li` whose source address is `src`.
#[track_caller]
pub fn client_from(zgix: &Zgix, li: usize, src: Ipv4Addr) -> Client {
    let dest = v4(zgix.listeners[li]);
    match connect_from(src, dest) {
        Ok(stream) => Client::from_stream(stream),
        Err(e) => panic!("connect {src} -> {dest}: {e}"),
    }
}

/// A keep-alive GET with a Host header.
pub fn get_req(target: &str) -> Vec<u8> {
    format!("GET {target} HTTP/1.1\r\nHost: test.local\r\n\r\n").into_bytes()
}

/// Asserts a 200 `ok\n` forwarded from the origin.
#[track_caller]
pub fn assert_ok(client: &mut Client, request: &[u8]) {
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
pub fn expect_eof(client: &mut Client) {
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
pub fn expect_refusal(client: &mut Client, request: &[u8], code: u16, reason: &str) {
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
pub fn too_many(secs: u64) -> Vec<u8> {
    format!(
        "HTTP/1.1 429 Too Many Requests\r\ncontent-type: text/plain\r\ncontent-length: 18\r\nretry-after: {secs}\r\nconnection: close\r\n\r\nToo Many Requests\n"
    )
    .into_bytes()
}

/// Sends `request` and expects the exact rate-limit 429 with a Retry-After of
/// 1 s to one hour (the time one token takes), then EOF. Returns Retry-After.
#[track_caller]
pub fn expect_429(client: &mut Client, request: &[u8]) -> u64 {
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
pub fn proxy_v1(src: &str) -> String {
    if src.contains(':') {
        format!("PROXY TCP6 {src} ::1 40000 80\r\n")
    } else {
        format!("PROXY TCP4 {src} 127.0.0.1 40000 80\r\n")
    }
}

/// A client of listener `li` (which has `proxy_protocol` on) that has sent a
/// PROXY header claiming `src`.
#[track_caller]
pub fn client_as(zgix: &Zgix, li: usize, src: &str) -> Client {
    let mut client = Client::connect(zgix.listeners[li]);
    client.send(proxy_v1(src).as_bytes());
    client
}

/// Polls until `f` holds (bounded), returning whether it did.
pub fn eventually(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
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
pub struct Scrape {
    pub text: String,
    pub series: BTreeMap<String, f64>,
}

impl Scrape {
    #[track_caller]
    pub fn value(&self, series: &str) -> f64 {
        *self
            .series
            .get(series)
            .unwrap_or_else(|| panic!("no series {series} in /metrics:\n{}", self.text))
    }

    /// A counter value as an integer.
    #[track_caller]
    pub fn count(&self, series: &str) -> u64 {
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
pub fn metrics_text(zgix: &Zgix) -> String {
    let admin = zgix.admin.expect("zgix started without admin");
    let mut client = Client::connect(admin);
    let resp = client.request(b"GET /metrics HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n");
    assert_eq!(resp.status, 200, "/metrics: \"{}\"", resp.show());
    String::from_utf8(resp.body).expect("/metrics is UTF-8")
}

#[track_caller]
pub fn scrape(zgix: &Zgix) -> Scrape {
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
pub fn listener_name(i: usize) -> String {
    if i == 0 {
        "127.0.0.1:0".into()
    } else {
        format!("127.0.0.1:0#{i}")
    }
}

/// Responses of a status class on a listener: a sum `scrape` adds up from
/// the per-code series.
pub fn responses(listener: usize, class: u8) -> String {
    format!(
        "zgix_http_responses_total{{listener=\"{}\",class=\"{class}xx\"}}",
        listener_name(listener)
    )
}

/// Differences from `expected` (series, delta) since `before`; each of the
/// five admission counters not listed must not have moved, and each must equal
/// its `_total` twin.
pub fn mismatches(before: &Scrape, after: &Scrape, expected: &[(&str, u64)]) -> Vec<String> {
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
pub fn expect_deltas(zgix: &Zgix, before: &Scrape, expected: &[(&str, u64)]) -> Scrape {
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

pub const DENY: &str =
    "\"deny\":[\"<script\",\"union select\",\"../\",\"/private/key\",\"drop_table\"]";
