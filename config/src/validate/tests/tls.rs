//! Tests of the `listeners[].tls` rules (the files themselves are checked by zgix at load).
use super::*;

const T: &str = "/listeners/0/tls";

fn tls(v: Value) -> Vec<String> {
    errs(&[(T, v)])
}

#[test]
fn a_listener_with_one_certificate_gets_every_default() {
    let c = load(&with(&[(
        T,
        json!({"certificates": [{"cert": "/c.pem", "key": "/k.pem"}]}),
    )]))
    .unwrap();
    let t = c.listeners[0].tls.as_ref().unwrap();
    assert_eq!(t.alpn, ["h2", "http/1.1"]);
    assert_eq!(t.handshake_timeout_ms, crate::DEFAULT_HANDSHAKE_TIMEOUT_MS);
    assert!(c.listeners[0].tls.is_some());
    assert!(load(MINIMAL).unwrap().listeners[0].tls.is_none());
}

#[test]
fn every_rule_is_reported_at_once_with_its_path() {
    let got = tls(json!({
        "certificates": [{"cert": "", "key": "/k.pem"}, {"cert": "/c.pem", "key": "a\u{0}b"}],
        "alpn": ["http/1.1", "h2", "spdy/3", "http/1.1", "h2"],
        "handshake_timeout_ms": 5,
        "session_tickets": {"key_file": ""}
    }));
    assert_eq!(
        got,
        [
            "listeners[0].tls.certificates[0].cert: must be the path of a file",
            "listeners[0].tls.certificates[1].key: must not contain NUL",
            "listeners[0].tls.alpn[2]: unknown protocol \"spdy/3\"; zgix speaks [\"h2\", \"http/1.1\"]",
            "listeners[0].tls.alpn[3]: \"http/1.1\" is listed twice",
            "listeners[0].tls.alpn[4]: \"h2\" is listed twice",
            "listeners[0].tls.handshake_timeout_ms: must be between 100 and 120000, got 5",
            "listeners[0].tls.session_tickets.key_file: must be the path of a file",
        ]
    );
}

#[test]
fn no_certificate_and_no_protocol_are_refused() {
    assert_eq!(
        tls(json!({"certificates": [], "alpn": []})),
        [
            "listeners[0].tls.certificates: must list between 1 and 256 certificates, got 0",
            "listeners[0].tls.alpn: must list at least one protocol, such as [\"h2\", \"http/1.1\"]",
        ]
    );
}

#[test]
fn unknown_fields_and_versions_are_located() {
    let e = load(&with(&[(
        T,
        json!({"certificates": [], "ciphers": "HIGH"}),
    )]))
    .unwrap_err();
    assert!(
        e[0].starts_with("listeners[0].tls.ciphers: unknown field `ciphers`"),
        "{e:?}"
    );
    let e = load(&with(&[(
        T,
        json!({"certificates": [], "min_version": "1.1"}),
    )]))
    .unwrap_err();
    assert!(
        e[0].starts_with("listeners[0].tls.min_version: unknown variant `1.1`"),
        "{e:?}"
    );
}
