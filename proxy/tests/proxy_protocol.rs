//! End-to-end tests of `proxy_protocol` listeners: v1/v2 headers, refusals and the header's source as client identity.

mod support;

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::thread;
use std::time::Duration;

use support::*;

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// A config with an admin endpoint, listener 0 (`proxy_protocol: true`) and
/// listener 1 (plain) both on cluster `api` = `endpoints`. `listener_extra` and
/// `http_extra` are spliced into listener 0's object and its `http` object
/// (each starting with a comma), `tail` into the top level.
fn pp_config(
    endpoints: &[SocketAddr],
    lb: &str,
    listener_extra: &str,
    http_extra: &str,
    tail: &str,
) -> String {
    let eps: Vec<String> = endpoints.iter().map(|e| format!("\"{e}\"")).collect();
    format!(
        r#"{{"admin":{{"bind":"127.0.0.1:0"}},
"listeners":[
 {{"bind":"127.0.0.1:0","proxy_protocol":true{listener_extra},"http":{{"cluster":"api"{http_extra}}}}},
 {{"bind":"127.0.0.1:0","http":{{"cluster":"api"}}}}],
"clusters":{{"api":{{"endpoints":[{}],"lb":"{lb}"}}}}{tail}}}"#,
        eps.join(",")
    )
}

fn start_pp(origin: &Origin) -> Zgix {
    Zgix::start_json(&pp_config(&[origin.addr()], "round_robin", "", "", ""))
}

/// The body of admin `GET /metrics`.
fn metrics(z: &Zgix) -> String {
    let admin = z.admin.expect("admin address");
    let mut c = Client::connect(admin);
    let resp = c.request(b"GET /metrics HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n");
    assert_eq!(resp.status, 200, "metrics: {}", resp.show());
    String::from_utf8_lossy(&resp.body).into_owned()
}

/// `zgix_connections_refused_total{reason="<reason>"}`.
fn refused(z: &Zgix, reason: &str) -> u64 {
    let text = metrics(z);
    let key = format!("zgix_connections_refused_total{{reason=\"{reason}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(key.as_str()))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {key} in metrics:\n{text}"))
}

/// Every refusal counter, in label order.
fn refusals(z: &Zgix) -> [u64; 3] {
    [
        refused(z, "proxy_header_invalid"),
        refused(z, "proxy_header_timeout"),
        refused(z, "client_denied"),
    ]
}

/// Values of every field named `name` in a recorded request head.
fn field_values(head: &[u8], name: &str) -> Vec<String> {
    String::from_utf8_lossy(head)
        .split("\r\n")
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .filter(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.trim().to_string())
        .collect()
}

/// The single X-Forwarded-For value the origin saw.
#[track_caller]
fn xff(rec: &Recorded) -> String {
    let v = field_values(&rec.head, "x-forwarded-for");
    assert_eq!(
        v.len(),
        1,
        "expected one X-Forwarded-For in \"{}\"",
        escape(&rec.head)
    );
    v[0].clone()
}

fn v1_tcp4(src: Ipv4Addr) -> Vec<u8> {
    format!("PROXY TCP4 {src} 198.51.100.1 40000 80\r\n").into_bytes()
}

/// A v2 header: signature, `ver_cmd`, `fam`, length, `block` (addresses and TLVs).
fn v2(ver_cmd: u8, fam: u8, block: &[u8]) -> Vec<u8> {
    let mut out = vec![
        0x0D, 0x0A, 0x0D, 0x0A, 0x00, 0x0D, 0x0A, 0x51, 0x55, 0x49, 0x54, 0x0A,
    ];
    out.push(ver_cmd);
    out.push(fam);
    out.extend_from_slice(&(block.len() as u16).to_be_bytes());
    out.extend_from_slice(block);
    out
}

/// A v2 TLV: type, 16-bit length, value.
fn tlv(ty: u8, value: &[u8]) -> Vec<u8> {
    let mut out = vec![ty];
    out.extend_from_slice(&(value.len() as u16).to_be_bytes());
    out.extend_from_slice(value);
    out
}

fn v2_tcp4(src: Ipv4Addr, tlvs: &[u8]) -> Vec<u8> {
    let mut block = Vec::new();
    block.extend_from_slice(&src.octets());
    block.extend_from_slice(&Ipv4Addr::new(198, 51, 100, 2).octets());
    block.extend_from_slice(&40001u16.to_be_bytes());
    block.extend_from_slice(&443u16.to_be_bytes());
    block.extend_from_slice(tlvs);
    v2(0x21, 0x11, &block)
}

fn v2_tcp6(src: Ipv6Addr, tlvs: &[u8]) -> Vec<u8> {
    let mut block = Vec::new();
    block.extend_from_slice(&src.octets());
    block.extend_from_slice(&"2001:db8::1".parse::<Ipv6Addr>().unwrap().octets());
    block.extend_from_slice(&40002u16.to_be_bytes());
    block.extend_from_slice(&443u16.to_be_bytes());
    block.extend_from_slice(tlvs);
    v2(0x21, 0x21, &block)
}

/// Connects, sends `header`, and returns the client for requests.
#[track_caller]
fn pp_connect(addr: SocketAddr, header: &[u8]) -> Client {
    let mut c = Client::connect(addr);
    c.send(header);
    c
}

/// One `GET path` after `header` on a fresh connection.
#[track_caller]
fn pp_get(addr: SocketAddr, header: &[u8], path: &str) -> Response {
    let mut req = header.to_vec();
    req.extend_from_slice(
        format!("GET {path} HTTP/1.1\r\nHost: pp.test\r\nConnection: close\r\n\r\n").as_bytes(),
    );
    let mut c = Client::connect(addr);
    c.send(&req);
    c.read_response()
}

/// A health check through the PROXY listener and through the plain one.
#[track_caller]
fn pp_health(z: &Zgix) {
    let resp = pp_get(z.listeners[0], &v1_tcp4(Ipv4Addr::new(192, 0, 2, 200)), "/");
    assert_eq!(resp.status, 200, "health via PROXY: {}", resp.show());
    assert_bytes(&resp.body, OK_BODY);
    health_check(z.listeners[1]);
}

/// Sends `bytes` (tolerating a refused write), optionally half-closes, and
/// asserts the proxy closes without sending a single byte.
#[track_caller]
fn assert_dropped(addr: SocketAddr, bytes: &[u8], half_close: bool) {
    let mut c = Client::connect(addr);
    let _ = c.try_send(bytes);
    if half_close {
        let _ = c.stream().shutdown(std::net::Shutdown::Write);
    }
    c.expect_closed();
}

// ---------------------------------------------------------------------------
// Accepted headers: the source becomes X-Forwarded-For
// ---------------------------------------------------------------------------

#[test]
fn v1_tcp4_source_is_forwarded_for_on_every_request_of_the_connection() {
    let origin = Origin::start();
    let z = start_pp(&origin);
    let mut c = pp_connect(z.addr(), &v1_tcp4(Ipv4Addr::new(192, 0, 2, 10)));
    for _ in 0..2 {
        let resp = c.get("/");
        assert_eq!(resp.status, 200, "{}", resp.show());
        assert_bytes(&resp.body, OK_BODY);
    }
    let got = origin.wait_requests(2);
    assert_eq!(got.len(), 2);
    for rec in &got {
        assert_eq!(xff(rec), "192.0.2.10");
    }
    // A prior X-Forwarded-For is kept and the PROXY source appended.
    let mut req = v1_tcp4(Ipv4Addr::new(192, 0, 2, 11));
    req.extend_from_slice(
        b"GET / HTTP/1.1\r\nHost: pp.test\r\nX-Forwarded-For: 203.0.113.9\r\nX-Forwarded-Proto: http\r\nConnection: close\r\n\r\n",
    );
    let mut c = Client::connect(z.addr());
    c.send(&req);
    assert_eq!(c.read_response().status, 200);
    let got = origin.wait_requests(3);
    assert_eq!(xff(&got[2]), "203.0.113.9, 192.0.2.11");
}

#[test]
fn v1_tcp6_source_is_forwarded_for() {
    let origin = Origin::start();
    let z = start_pp(&origin);
    let resp = pp_get(
        z.addr(),
        b"PROXY TCP6 2001:db8:0:1::7 2001:db8::1 40000 443\r\n",
        "/",
    );
    assert_eq!(resp.status, 200, "{}", resp.show());
    assert_eq!(xff(&origin.only_request()), "2001:db8:0:1::7");
}

#[test]
fn v1_tcp6_ipv4_mapped_source_is_taken_as_ipv4() {
    let origin = Origin::start();
    let z = start_pp(&origin);
    let resp = pp_get(
        z.addr(),
        b"PROXY TCP6 ::ffff:192.0.2.9 ::ffff:198.51.100.1 40000 443\r\n",
        "/",
    );
    assert_eq!(resp.status, 200, "{}", resp.show());
    assert_eq!(xff(&origin.only_request()), "192.0.2.9");
}

#[test]
fn v1_unknown_falls_back_to_the_peer_address() {
    let origin = Origin::start();
    let z = start_pp(&origin);
    let resp = pp_get(z.addr(), b"PROXY UNKNOWN\r\n", "/");
    assert_eq!(resp.status, 200, "{}", resp.show());
    // UNKNOWN with ignored address text, padded to the longest legal line:
    // 107 bytes including the CRLF.
    let mut line = b"PROXY UNKNOWN ffff:f::1 ffff:f::2 65535 65535 ".to_vec();
    line.resize(105, b'x');
    line.extend_from_slice(b"\r\n");
    assert_eq!(line.len(), 107);
    let resp = pp_get(z.addr(), &line, "/");
    assert_eq!(resp.status, 200, "{}", resp.show());
    let got = origin.wait_requests(2);
    assert_eq!(got.len(), 2);
    for rec in &got {
        assert_eq!(xff(rec), "127.0.0.1");
    }
}

#[test]
fn v2_proxy_ipv4_with_tlv_source_is_forwarded_for() {
    let origin = Origin::start();
    let z = start_pp(&origin);
    let mut tlvs = tlv(0x04, b""); // PP2_TYPE_NOOP, empty
    tlvs.extend(tlv(0x02, b"example.com")); // PP2_TYPE_AUTHORITY
    let header = v2_tcp4(Ipv4Addr::new(192, 0, 2, 20), &tlvs);
    let mut c = pp_connect(z.addr(), &header);
    for _ in 0..2 {
        let resp = c.get("/");
        assert_eq!(resp.status, 200, "{}", resp.show());
    }
    let got = origin.wait_requests(2);
    assert_eq!(got.len(), 2);
    for rec in &got {
        assert_eq!(xff(rec), "192.0.2.20");
        // The TLV bytes never leak into the HTTP stream.
        assert!(
            rec.head.starts_with(b"GET / HTTP/1.1\r\n"),
            "{}",
            escape(&rec.head)
        );
    }
}

#[test]
fn v2_proxy_ipv6_with_tlv_source_is_forwarded_for() {
    let origin = Origin::start();
    let z = start_pp(&origin);
    let header = v2_tcp6(
        "2001:db8:aa::20".parse().unwrap(),
        &tlv(0x05, b"unique-id-0123456789"),
    );
    let resp = pp_get(z.addr(), &header, "/");
    assert_eq!(resp.status, 200, "{}", resp.show());
    assert_eq!(xff(&origin.only_request()), "2001:db8:aa::20");
}

#[test]
fn v2_local_falls_back_to_the_peer_address() {
    let origin = Origin::start();
    let z = start_pp(&origin);
    // LOCAL with an empty block (a health check from the balancer).
    let resp = pp_get(z.addr(), &v2(0x20, 0x00, b""), "/");
    assert_eq!(resp.status, 200, "{}", resp.show());
    // LOCAL carrying an address block: the addresses must be ignored.
    let mut block = Vec::new();
    block.extend_from_slice(&[192, 0, 2, 99, 198, 51, 100, 1]);
    block.extend_from_slice(&1234u16.to_be_bytes());
    block.extend_from_slice(&80u16.to_be_bytes());
    let resp = pp_get(z.addr(), &v2(0x20, 0x11, &block), "/");
    assert_eq!(resp.status, 200, "{}", resp.show());
    let got = origin.wait_requests(2);
    assert_eq!(got.len(), 2);
    for rec in &got {
        assert_eq!(xff(rec), "127.0.0.1");
    }
}

#[test]
fn header_split_across_several_writes() {
    let origin = Origin::start();
    let z = start_pp(&origin);
    let request = b"GET /split HTTP/1.1\r\nHost: pp.test\r\nConnection: close\r\n\r\n";
    let headers = [
        v1_tcp4(Ipv4Addr::new(192, 0, 2, 30)),
        v2_tcp4(Ipv4Addr::new(192, 0, 2, 31), &tlv(0x04, b"pad")),
    ];
    for header in &headers {
        let mut c = Client::connect(z.addr());
        // Pieces of 5 bytes, then the request with the last piece.
        let mut pieces: Vec<&[u8]> = header.chunks(5).collect();
        let last = pieces.pop().unwrap();
        for p in pieces {
            c.send(p);
            thread::sleep(Duration::from_millis(15));
        }
        let mut tail = last.to_vec();
        tail.extend_from_slice(&request[..7]);
        c.send(&tail);
        thread::sleep(Duration::from_millis(15));
        c.send(&request[7..]);
        let resp = c.read_response();
        assert_eq!(resp.status, 200, "{}", resp.show());
    }
    let got = origin.wait_requests(2);
    assert_eq!(got.len(), 2);
    assert_eq!(xff(&got[0]), "192.0.2.30");
    assert_eq!(xff(&got[1]), "192.0.2.31");
    for rec in &got {
        assert!(
            rec.head.starts_with(b"GET /split HTTP/1.1\r\n"),
            "{}",
            escape(&rec.head)
        );
    }
}

// ---------------------------------------------------------------------------
// Refused headers
// ---------------------------------------------------------------------------

#[test]
fn invalid_headers_close_without_a_response_and_are_counted() {
    let origin = Origin::start();
    let z = start_pp(&origin);
    let v2_sig_bad = {
        let mut h = v2_tcp4(Ipv4Addr::new(192, 0, 2, 40), b"");
        h[11] = 0x0B;
        h
    };
    let v2_bad_version = {
        let mut h = v2_tcp4(Ipv4Addr::new(192, 0, 2, 40), b"");
        h[12] = 0x11;
        h
    };
    let v2_tlv_overrun = {
        // A TLV claiming 200 bytes inside a 16-byte block.
        let mut block = Vec::new();
        block.extend_from_slice(&[192, 0, 2, 41, 198, 51, 100, 1, 0, 1, 0, 80]);
        block.extend_from_slice(&[0x04, 0x00, 0xC8, 0x00]);
        v2(0x21, 0x11, &block)
    };
    let v1_oversized = {
        // A valid-looking UNKNOWN line with no CRLF in the first 107 bytes.
        let mut h = b"PROXY UNKNOWN ".to_vec();
        h.resize(107, b'a');
        h
    };
    let mut v2_truncated = v2_tcp4(Ipv4Addr::new(192, 0, 2, 42), b"");
    v2_truncated.truncate(20);
    let cases: Vec<(&str, Vec<u8>, bool)> = vec![
        (
            "plain HTTP, no header",
            b"GET / HTTP/1.1\r\nHost: pp.test\r\n\r\n".to_vec(),
            false,
        ),
        (
            "binary garbage",
            b"\x00\x01\x02\x03garbage\r\n".to_vec(),
            false,
        ),
        (
            "v1 wrong signature",
            b"PROXZ TCP4 192.0.2.1 198.51.100.1 1 2\r\n".to_vec(),
            false,
        ),
        (
            "v1 lower-case signature",
            b"proxy TCP4 192.0.2.1 198.51.100.1 1 2\r\n".to_vec(),
            false,
        ),
        (
            "v1 bad address",
            b"PROXY TCP4 192.0.2.256 198.51.100.1 1 2\r\n".to_vec(),
            false,
        ),
        (
            "v1 bare LF",
            b"PROXY TCP4 192.0.2.1 198.51.100.1 1 2\n".to_vec(),
            false,
        ),
        ("v2 wrong signature", v2_sig_bad, false),
        ("v2 bad version", v2_bad_version, false),
        ("v2 TLV past the end", v2_tlv_overrun, false),
        ("v1 oversized (no CRLF in 107 bytes)", v1_oversized, false),
        (
            "v1 truncated then closed",
            b"PROXY TCP4 192.0.2.1 198.5".to_vec(),
            true,
        ),
        ("v2 truncated then closed", v2_truncated, true),
    ];
    for (what, bytes, half_close) in &cases {
        let before = refusals(&z);
        assert_dropped(z.addr(), bytes, *half_close);
        let after = refusals(&z);
        assert_eq!(
            after,
            [before[0] + 1, before[1], before[2]],
            "{what}: refusal counters [invalid, timeout, client_denied] before {before:?}"
        );
        pp_health(&z);
    }
    // Nothing refused ever reached the origin: only the health checks did.
    let got = origin.requests();
    assert_eq!(
        got.len(),
        2 * cases.len(),
        "origin saw {} requests",
        got.len()
    );
    for rec in &got {
        let host = field_values(&rec.head, "host");
        let from = xff(rec);
        assert!(
            (host == ["pp.test"] && from == "192.0.2.200")
                || (host == ["health.test"] && from == "127.0.0.1"),
            "a refused connection's request reached the origin: \"{}\"",
            escape(&rec.head)
        );
    }
}

#[test]
fn slow_header_times_out_and_is_counted() {
    let origin = Origin::start();
    let json = pp_config(
        &[origin.addr()],
        "round_robin",
        "",
        "",
        r#","limits":{"proxy_protocol_timeout_ms":300}"#,
    );
    let z = Zgix::start_json(&json);
    let header = v1_tcp4(Ipv4Addr::new(192, 0, 2, 50));
    let (first, rest) = header.split_at(header.len() / 2);

    // Half a header, then nothing until well past the deadline.
    let before = refusals(&z);
    let mut c = Client::connect(z.addr());
    c.send(first);
    thread::sleep(Duration::from_millis(800));
    let mut late = rest.to_vec();
    late.extend_from_slice(b"GET / HTTP/1.1\r\nHost: pp.test\r\n\r\n");
    let _ = c.try_send(&late);
    c.expect_closed();
    let after = refusals(&z);
    assert_eq!(
        after,
        [before[0], before[1] + 1, before[2]],
        "refusal counters [invalid, timeout, client_denied] before {before:?}"
    );
    pp_health(&z);

    // A connection that sends nothing at all times out the same way.
    let before = after;
    let mut c = Client::connect(z.addr());
    c.expect_closed();
    let after = refusals(&z);
    assert_eq!(after, [before[0], before[1] + 1, before[2]]);
    pp_health(&z);

    // Only the health checks reached the origin.
    assert_eq!(origin.requests().len(), 4);
}

// ---------------------------------------------------------------------------
// The header's source drives every identity-keyed feature
// ---------------------------------------------------------------------------

#[test]
fn rate_limit_is_keyed_by_the_proxy_source() {
    let origin = Origin::start();
    let json = pp_config(
        &[origin.addr()],
        "round_robin",
        "",
        r#","rate_limit":{"requests":1,"window_ms":86400000,"burst":2}"#,
        "",
    );
    let z = Zgix::start_json(&json);
    let a = v1_tcp4(Ipv4Addr::new(192, 0, 2, 60));
    let b = v2_tcp4(Ipv4Addr::new(192, 0, 2, 61), b"");
    // Two connections from A share one bucket of 2.
    assert_eq!(pp_get(z.addr(), &a, "/").status, 200);
    assert_eq!(pp_get(z.addr(), &a, "/").status, 200);
    let third = pp_get(z.addr(), &a, "/");
    assert_eq!(third.status, 429, "{}", third.show());
    assert!(third.field("retry-after").is_some(), "{}", third.show());
    // B (same TCP peer, 127.0.0.1) has its own bucket.
    assert_eq!(pp_get(z.addr(), &b, "/").status, 200);
    assert_eq!(pp_get(z.addr(), &b, "/").status, 200);
    assert_eq!(pp_get(z.addr(), &b, "/").status, 429);
    // A v1 TCP6 source is a third identity.
    let c6 = b"PROXY TCP6 2001:db8:1::1 2001:db8::1 1000 443\r\n";
    assert_eq!(pp_get(z.addr(), c6, "/").status, 200);
    // ... and another address in the same /64 shares its bucket.
    let c6b = b"PROXY TCP6 2001:db8:1::ffff 2001:db8::1 1000 443\r\n";
    assert_eq!(pp_get(z.addr(), c6b, "/").status, 200);
    assert_eq!(pp_get(z.addr(), c6b, "/").status, 429);
    assert_eq!(origin.requests().len(), 6);
}

#[test]
fn conn_limit_is_keyed_by_the_proxy_source() {
    let origin = Origin::start();
    let json = pp_config(
        &[origin.addr()],
        "round_robin",
        "",
        r#","conn_limit":{"max":1}"#,
        "",
    );
    let z = Zgix::start_json(&json);
    let a = v1_tcp4(Ipv4Addr::new(192, 0, 2, 70));
    let b = v1_tcp4(Ipv4Addr::new(192, 0, 2, 71));
    let mut held = pp_connect(z.addr(), &a);
    assert_eq!(held.get("/").status, 200);
    // A second connection from A is over the limit.
    let second = pp_get(z.addr(), &a, "/");
    assert_eq!(second.status, 503, "{}", second.show());
    // B is counted separately although the TCP peer is the same.
    let mut other = pp_connect(z.addr(), &b);
    assert_eq!(other.get("/").status, 200);
    // The held connections still work.
    assert_eq!(held.get("/").status, 200);
    assert_eq!(other.get("/").status, 200);
    // Closing A's connection frees its slot (bounded wait for the proxy to see the close).
    drop(held);
    let mut freed = false;
    for _ in 0..100 {
        let resp = pp_get(z.addr(), &a, "/");
        if resp.status == 200 {
            freed = true;
            break;
        }
        assert_eq!(resp.status, 503, "{}", resp.show());
        thread::sleep(Duration::from_millis(50));
    }
    assert!(freed, "A's slot was never released");
}

#[test]
fn source_ip_balancing_hashes_the_proxy_source() {
    let a = Origin::named("a");
    let b = Origin::named("b");
    let json = pp_config(&[a.addr(), b.addr()], "source_ip", "", "", "");
    let z = Zgix::start_json(&json);
    let mut seen = BTreeSet::new();
    for host in 1..=16u8 {
        let header = v1_tcp4(Ipv4Addr::new(192, 0, 2, host));
        let mut picked = BTreeSet::new();
        for i in 0..4 {
            // Alternate v1 and v2 headers for the same source.
            let h = if i % 2 == 0 {
                header.clone()
            } else {
                v2_tcp4(Ipv4Addr::new(192, 0, 2, host), b"")
            };
            let resp = pp_get(z.addr(), &h, "/");
            assert_eq!(resp.status, 200, "{}", resp.show());
            picked.insert(resp.field("x-origin").unwrap_or("?").to_string());
        }
        assert_eq!(
            picked.len(),
            1,
            "source 192.0.2.{host} reached several endpoints: {picked:?}"
        );
        seen.extend(picked);
    }
    // Every TCP peer is 127.0.0.1: if zgix hashed the peer, one endpoint would get everything.
    assert_eq!(
        seen.len(),
        2,
        "16 PROXY sources all went to {seen:?}: the PROXY source is not what is hashed"
    );
}

#[test]
fn request_filter_clients_match_the_proxy_source() {
    let origin = Origin::start();
    let filters = r#","request_filters":[
 {"match":{"clients":["192.0.2.0/24"]},"action":{"respond":{"status":200,"body":"v4-net\n"}}},
 {"match":{"clients":["2001:db8:5::/48"]},"action":{"respond":{"status":200,"body":"v6-net\n"}}},
 {"match":{"clients":["127.0.0.0/8"]},"action":{"reject":{"status":403}}}]"#;
    let json = pp_config(&[origin.addr()], "round_robin", "", filters, "");
    let z = Zgix::start_json(&json);
    let resp = pp_get(z.addr(), &v1_tcp4(Ipv4Addr::new(192, 0, 2, 80)), "/");
    assert_bytes(&resp.body, b"v4-net\n");
    let resp = pp_get(z.addr(), &v2_tcp4(Ipv4Addr::new(192, 0, 2, 81), b""), "/");
    assert_bytes(&resp.body, b"v4-net\n");
    let resp = pp_get(
        z.addr(),
        &v2_tcp6("2001:db8:5:1::9".parse().unwrap(), b""),
        "/",
    );
    assert_bytes(&resp.body, b"v6-net\n");
    // Outside every network: forwarded, although the TCP peer 127.0.0.1 would match the reject.
    let resp = pp_get(z.addr(), &v1_tcp4(Ipv4Addr::new(198, 51, 100, 7)), "/");
    assert_eq!(resp.status, 200, "{}", resp.show());
    assert_bytes(&resp.body, OK_BODY);
    // UNKNOWN falls back to the peer, which the reject filter matches.
    let resp = pp_get(z.addr(), b"PROXY UNKNOWN\r\n", "/");
    assert_eq!(resp.status, 403, "{}", resp.show());
    assert_eq!(origin.requests().len(), 1);
    assert_eq!(xff(&origin.only_request()), "198.51.100.7");
}

#[test]
fn listener_clients_deny_uses_the_proxy_source() {
    let origin = Origin::start();
    let json = pp_config(
        &[origin.addr()],
        "round_robin",
        r#","clients":{"deny":["192.0.2.0/24"]}"#,
        "",
        "",
    );
    let z = Zgix::start_json(&json);
    let before = refusals(&z);
    let mut req = v1_tcp4(Ipv4Addr::new(192, 0, 2, 90));
    req.extend_from_slice(b"GET / HTTP/1.1\r\nHost: pp.test\r\n\r\n");
    assert_dropped(z.addr(), &req, false);
    assert_dropped(z.addr(), &v2_tcp4(Ipv4Addr::new(192, 0, 2, 91), b""), false);
    let after = refusals(&z);
    assert_eq!(after, [before[0], before[1], before[2] + 2]);
    // The TCP peer is 127.0.0.1 for all of them; other PROXY sources are served.
    let resp = pp_get(z.addr(), &v1_tcp4(Ipv4Addr::new(198, 51, 100, 90)), "/");
    assert_eq!(resp.status, 200, "{}", resp.show());
    assert_eq!(xff(&origin.only_request()), "198.51.100.90");
}

#[test]
fn listener_clients_allow_uses_the_proxy_source() {
    let origin = Origin::start();
    let json = pp_config(
        &[origin.addr()],
        "round_robin",
        r#","clients":{"allow":["192.0.2.0/24"]}"#,
        "",
        "",
    );
    let z = Zgix::start_json(&json);
    // The TCP peer 127.0.0.1 is not allowed, but the PROXY source is.
    let resp = pp_get(z.addr(), &v1_tcp4(Ipv4Addr::new(192, 0, 2, 95)), "/");
    assert_eq!(resp.status, 200, "{}", resp.show());
    let before = refusals(&z);
    // UNKNOWN and LOCAL fall back to the peer, which is not allowed.
    let mut req = b"PROXY UNKNOWN\r\n".to_vec();
    req.extend_from_slice(b"GET / HTTP/1.1\r\nHost: pp.test\r\n\r\n");
    assert_dropped(z.addr(), &req, false);
    assert_dropped(z.addr(), &v2(0x20, 0x00, b""), false);
    assert_dropped(z.addr(), &v1_tcp4(Ipv4Addr::new(198, 51, 100, 95)), false);
    let after = refusals(&z);
    assert_eq!(after, [before[0], before[1], before[2] + 3]);
    assert_eq!(xff(&origin.only_request()), "192.0.2.95");
}
