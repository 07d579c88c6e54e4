//! End-to-end tests of listener `clients` allow/deny lists: IPv4 and IPv6, deny beats allow, refusals counted.

mod support;

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};

use support::*;

/// An admin endpoint and one listener on `bind` with `clients` = `clients`
/// (a JSON object, or empty for none) for cluster `api` = `origin`.
fn start(origin: &Origin, bind: &str, clients: &str) -> Zgix {
    let clients = if clients.is_empty() {
        String::new()
    } else {
        format!(r#","clients":{clients}"#)
    };
    Zgix::start_json(&format!(
        r#"{{"admin":{{"bind":"127.0.0.1:0"}},
"listeners":[{{"bind":"{bind}"{clients},"http":{{"cluster":"api"}}}}],
"clusters":{{"api":{{"endpoints":["{}"]}}}}}}"#,
        origin.addr()
    ))
}

/// `zgix_connections_refused_total{reason="client_denied"}` from admin /metrics.
fn denied(z: &Zgix) -> u64 {
    let admin = z.admin.expect("admin address");
    let mut c = Client::connect(admin);
    let resp = c.request(b"GET /metrics HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n");
    assert_eq!(resp.status, 200, "metrics: {}", resp.show());
    let text = String::from_utf8_lossy(&resp.body).into_owned();
    let key = "zgix_connections_refused_total{reason=\"client_denied\"} ";
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {key} in metrics:\n{text}"))
}

/// The listener's port on 127.0.0.1, for `connect_from`.
fn v4_dest(z: &Zgix) -> SocketAddrV4 {
    match z.addr() {
        SocketAddr::V4(a) => a,
        other => panic!("listener {other} is not IPv4"),
    }
}

fn from(last: u8) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 0, last)
}

/// A client connected from 127.0.0.`last`.
#[track_caller]
fn client_from(z: &Zgix, last: u8) -> Client {
    let stream = connect_from(from(last), v4_dest(z))
        .unwrap_or_else(|e| panic!("connect from {}: {e}", from(last)));
    Client::from_stream(stream)
}

/// A keep-alive `GET /` then a second one on the same connection: both 200 from the origin.
#[track_caller]
fn assert_served(mut c: Client, who: &str) {
    for _ in 0..2 {
        let resp = c.get("/");
        assert_eq!(resp.status, 200, "{who}: {}", resp.show());
        assert_bytes(&resp.body, OK_BODY);
    }
}

/// The connection is closed without a byte of response, and counted.
#[track_caller]
fn assert_refused(z: &Zgix, connect: impl FnOnce() -> Client, send_request: bool, who: &str) {
    // Read before connecting: zgix refuses at accept, before any byte is sent.
    let before = denied(z);
    let mut c = connect();
    if send_request {
        let _ = c.try_send(b"GET / HTTP/1.1\r\nHost: clients.test\r\n\r\n");
    }
    // is_closed panics if any byte arrives.
    assert!(c.is_closed(), "{who}: connection not closed");
    assert_eq!(denied(z), before + 1, "{who}: client_denied counter");
}

#[test]
fn ipv4_allow_list() {
    let origin = Origin::start();
    let z = start(&origin, "127.0.0.1:0", r#"{"allow":["127.0.0.2/32"]}"#);
    assert_served(client_from(&z, 2), "127.0.0.2");
    assert_refused(&z, || client_from(&z, 3), true, "127.0.0.3");
    assert_refused(&z, || client_from(&z, 1), true, "127.0.0.1");
    // Still serving after refusals.
    assert_served(client_from(&z, 2), "127.0.0.2 again");
    assert_eq!(origin.requests().len(), 4);
    assert_eq!(denied(&z), 2);
}

#[test]
fn ipv4_deny_list() {
    let origin = Origin::start();
    let z = start(&origin, "127.0.0.1:0", r#"{"deny":["127.0.0.3/32"]}"#);
    assert_served(client_from(&z, 2), "127.0.0.2");
    assert_served(client_from(&z, 1), "127.0.0.1");
    assert_refused(&z, || client_from(&z, 3), true, "127.0.0.3");
    health_check(z.addr());
    assert_eq!(denied(&z), 1);
}

#[test]
fn deny_beats_allow() {
    let origin = Origin::start();
    let z = start(
        &origin,
        "127.0.0.1:0",
        r#"{"allow":["127.0.0.0/8"],"deny":["127.0.0.2/31"]}"#,
    );
    assert_served(client_from(&z, 1), "127.0.0.1");
    assert_served(client_from(&z, 4), "127.0.0.4");
    assert_refused(&z, || client_from(&z, 2), true, "127.0.0.2");
    assert_refused(&z, || client_from(&z, 3), true, "127.0.0.3");
    assert_eq!(denied(&z), 2);
}

#[test]
fn empty_allow_admits_everyone_not_denied() {
    let origin = Origin::start();
    let z = start(&origin, "127.0.0.1:0", r#"{"allow":[],"deny":[]}"#);
    for last in [1, 2, 3] {
        assert_served(client_from(&z, last), &format!("127.0.0.{last}"));
    }
    let z2 = start(&origin, "127.0.0.1:0", r#"{"deny":["10.0.0.0/8"]}"#);
    for last in [1, 2] {
        assert_served(client_from(&z2, last), &format!("127.0.0.{last}"));
    }
    assert_eq!(denied(&z), 0);
    assert_eq!(denied(&z2), 0);
}

#[test]
fn refused_before_any_request_is_read() {
    let origin = Origin::start();
    let z = start(&origin, "127.0.0.1:0", r#"{"deny":["127.0.0.3/32"]}"#);
    // The client sends nothing: zgix still closes, it does not wait for a request.
    assert_refused(&z, || client_from(&z, 3), false, "silent 127.0.0.3");
    // A full request and a body: never answered, never forwarded.
    let before = denied(&z);
    let mut c = client_from(&z, 3);
    let _ =
        c.try_send(b"POST /echo HTTP/1.1\r\nHost: clients.test\r\nContent-Length: 5\r\n\r\nhello");
    assert!(c.is_closed(), "denied connection not closed");
    assert_eq!(denied(&z), before + 1);
    assert_eq!(
        origin.accepted(),
        0,
        "a denied client's request reached the origin"
    );
    health_check(z.addr());
}

#[test]
fn ipv6_deny_and_allow() {
    let origin = Origin::start();
    // ::1 is in ::/64.
    let z = start(&origin, "[::1]:0", r#"{"deny":["::/64"]}"#);
    assert!(z.addr().is_ipv6(), "{}", z.addr());
    assert_refused(
        &z,
        || Client::connect(z.addr()),
        true,
        "::1 denied by ::/64",
    );
    assert_refused(
        &z,
        || Client::connect(z.addr()),
        false,
        "::1 denied, silent",
    );

    let z = start(&origin, "[::1]:0", r#"{"allow":["::/64"]}"#);
    assert_served(Client::connect(z.addr()), "::1 allowed by ::/64");

    // An allow list ::1 is not in, and IPv4 networks never match an IPv6 client.
    let z = start(
        &origin,
        "[::1]:0",
        r#"{"allow":["2001:db8::/32","127.0.0.0/8","0.0.0.0/0"]}"#,
    );
    assert_refused(&z, || Client::connect(z.addr()), true, "::1 not allowed");

    // Deny beats allow for IPv6 too; ::/0 contains ::1.
    let z = start(&origin, "[::1]:0", r#"{"allow":["::/0"],"deny":["::/64"]}"#);
    assert_refused(
        &z,
        || Client::connect(z.addr()),
        true,
        "::1 denied over allow",
    );

    // IPv6 deny networks do not touch IPv4 clients.
    let z = start(&origin, "127.0.0.1:0", r#"{"deny":["::/0"]}"#);
    assert_served(client_from(&z, 2), "127.0.0.2 vs IPv6 deny");
    assert_eq!(origin.requests().len(), 4);
}
