//! Tests of the admission modes: rate-limit scope, key, dry_run and headers, the overflow rule, the fleet section.
use super::*;

const RL: &str = "/listeners/0/http/rate_limit";

fn rl(extra: Value) -> Value {
    let mut v = json!({ "requests": 100, "window_ms": 1000, "burst": 200 });
    v.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    v
}

#[test]
fn every_mode_defaults_to_todays_behaviour() {
    let c = load(&with(&[(RL, rl(json!({})))])).unwrap();
    let r = c.listeners[0].http.rate_limit.clone().unwrap();
    assert_eq!(r.scope, crate::RateScope::Box);
    assert_eq!(r.key, crate::RateKey::Address);
    assert!(!r.dry_run);
    assert_eq!(r.headers, None);
    assert_eq!(
        c.limits.rate_limit_overflow,
        crate::RateLimitOverflow::FailOpen
    );
    assert_eq!(c.fleet, None);
}

#[test]
fn the_issue_example_loads() {
    let c = load(&with(&[
        (
            "/fleet",
            json!({ "redis": "127.0.0.1:6379", "sync_ms": 100, "timeout_ms": 50, "prefix": "zgix" }),
        ),
        (
            RL,
            rl(json!({ "scope": "fleet", "key": "address", "dry_run": false, "headers": "draft-11" })),
        ),
        (
            "/listeners/0/http/conn_limit",
            json!({ "max": 256, "dry_run": true }),
        ),
        (
            "/listeners/0/http/waf",
            json!({ "deny": ["union select"], "dry_run": true }),
        ),
        ("/limits/rate_limit_overflow", json!("shared")),
    ]))
    .unwrap();
    let h = &c.listeners[0].http;
    assert!(h.conn_limit.unwrap().dry_run && h.waf.as_ref().unwrap().dry_run);
    assert_eq!(
        h.rate_limit.as_ref().unwrap().headers,
        Some(crate::RateHeaders::Draft11)
    );
    assert_eq!(
        c.limits.rate_limit_overflow,
        crate::RateLimitOverflow::Shared
    );
}

#[test]
fn header_key_must_be_a_field_name() {
    assert!(errs(&[(RL, rl(json!({ "key": { "header": "x-api-key" } })))]).is_empty());
    one(
        &[(RL, rl(json!({ "key": { "header": "x api" } })))],
        "listeners[0].http.rate_limit.key.header: must be a header field name (RFC 9110 §5.1 token) of 1..=128 bytes, got \"x api\"",
    );
    one(
        &[(RL, rl(json!({ "key": { "header": "" } })))],
        "listeners[0].http.rate_limit.key.header: must be a header field name (RFC 9110 §5.1 token) of 1..=128 bytes, got \"\"",
    );
}

#[test]
fn fleet_scope_needs_the_fleet_section() {
    one(
        &[(RL, rl(json!({ "scope": "fleet" })))],
        "listeners[0].http.rate_limit.scope: \"fleet\" needs the top-level \"fleet\" section (its Redis)",
    );
}

#[test]
fn fleet_section_reports_every_problem() {
    let e = errs(&[(
        "/fleet",
        json!({ "redis": "localhost", "sync_ms": 5, "timeout_ms": 6, "prefix": "a b" }),
    )]);
    assert_eq!(
        e,
        [
            "fleet.redis: must be host:port with a port 1..=65535, got \"localhost\"",
            "fleet.sync_ms: must be between 10 and 60000, got 5",
            "fleet.timeout_ms: must be between 1 and fleet.sync_ms (5), got 6",
            "fleet.prefix: must be 1..=64 visible ASCII characters, got \"a b\"",
        ]
    );
    assert!(errs(&[("/fleet", json!({ "redis": "redis.internal:6379" }))]).is_empty());
}

#[test]
fn unknown_names_are_refused_by_serde() {
    assert!(!errs(&[("/limits/rate_limit_overflow", json!("drop"))]).is_empty());
    assert!(!errs(&[(RL, rl(json!({ "headers": "draft-10" })))]).is_empty());
    assert!(!errs(&[(RL, rl(json!({ "scope": "region" })))]).is_empty());
}
