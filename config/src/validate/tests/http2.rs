//! Tests of the `listeners[].http2` rules.
use super::*;

const H: &str = "/listeners/0/http2";

#[test]
fn a_listener_without_http2_gets_every_default() {
    let c = load(MINIMAL).unwrap();
    let h = c.listeners[0].http2;
    assert_eq!(h.max_concurrent_streams, 128);
    assert_eq!(h.initial_window_bytes, 65_535);
    assert_eq!(h.max_header_list_bytes, 65_536);
    assert!(!h.prior_knowledge);
    let c = load(&with(&[(H, json!({"prior_knowledge": true}))])).unwrap();
    assert!(c.listeners[0].http2.prior_knowledge);
    assert_eq!(c.listeners[0].http2.max_concurrent_streams, 128);
}

#[test]
fn every_http2_rule_is_reported_at_once_with_its_path() {
    let got = errs(&[
        (
            H,
            json!({"max_concurrent_streams": 0, "initial_window_bytes": 10,
                   "max_header_list_bytes": 20_000_000, "prior_knowledge": true}),
        ),
        (
            "/listeners/0/tls",
            json!({"certificates": [{"cert": "/c.pem", "key": "/k.pem"}]}),
        ),
    ]);
    assert_eq!(
        got,
        [
            "listeners[0].http2.max_concurrent_streams: must be between 1 and 1024, got 0",
            "listeners[0].http2.initial_window_bytes: must be between 1024 and 16777216, got 10",
            "listeners[0].http2.max_header_list_bytes: must be between 1024 and 1048576, got 20000000",
            "listeners[0].http2.prior_knowledge: is for a plain listener; a TLS listener speaks h2 when \"h2\" is in tls.alpn",
        ]
    );
}

#[test]
fn unknown_http2_fields_are_located() {
    let e = load(&with(&[(H, json!({"max_streams": 5}))])).unwrap_err();
    assert!(
        e[0].starts_with("listeners[0].http2.max_streams: unknown field `max_streams`"),
        "{e:?}"
    );
}
