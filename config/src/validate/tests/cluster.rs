//! Tests of the cluster rules: endpoints by name and weight, lb, retries, resolve_ms, passive and active health, TLS to the origins.
use super::*;

const C: &str = "/clusters/api";

#[test]
fn endpoints_by_name_and_weight() {
    let c = load(&with(&[(
        "/clusters/api/endpoints",
        json!(["10.0.0.1:80", {"address": "origin.internal:8080", "weight": 3}]),
    )]))
    .unwrap();
    let eps = &c.clusters["api"].endpoints;
    assert_eq!(eps[1].weight, 3);
    assert_eq!(
        eps[1].target(),
        Ok(crate::upstream::Target::Name {
            host: "origin.internal".into(),
            port: 8080
        })
    );
    assert_eq!(
        errs(&[(
            "/clusters/api/endpoints",
            json!([
                {"address": "a.internal:80", "weight": 0},
                {"address": "b.internal:80", "weight": 1001},
                "origin",
                "A.internal:80",
                "bad host:80",
                "c.internal:0"
            ])
        )]),
        [
            "clusters.api.endpoints[0].weight: must be between 1 and 1000, got 0",
            "clusters.api.endpoints[1].weight: must be between 1 and 1000, got 1001",
            "clusters.api.endpoints[2]: \"origin\" has no port: write ip:port or host:port, such as \"10.0.0.1:80\" or \"origin.internal:80\"",
            "clusters.api.endpoints[3]: a.internal:80 is already endpoints[0]",
            "clusters.api.endpoints[4]: \"bad host:80\" is neither an IP address nor a host name (letters, digits, '-', '_' and '.')",
            "clusters.api.endpoints[5]: c.internal:0: port 0 cannot be connected to",
        ]
    );
    let many: Vec<String> = (1..=257)
        .map(|i| format!("10.0.{}.{}:80", i / 200, i % 200))
        .collect();
    one(
        &[("/clusters/api/endpoints", json!(many))],
        "clusters.api.endpoints: must list at most 256 endpoints, got 257",
    );
    let e = errs(&[(
        "/clusters/api/endpoints",
        json!([{"address": "a:1", "wieght": 2}]),
    )]);
    assert!(
        e[0].starts_with("clusters.api.endpoints[0].wieght: unknown field `wieght`, expected `address` or `weight`"),
        "{e:?}"
    );
}

#[test]
fn lb_least_conn_retries_and_resolve_ms() {
    let c = load(&with(&[
        ("/clusters/api/lb", json!("least_conn")),
        ("/clusters/api/retries", json!(0)),
    ]))
    .unwrap();
    assert_eq!(c.clusters["api"].lb, crate::model::Lb::LeastConn);
    assert_eq!(c.clusters["api"].retries, 0);
    one(
        &[("/clusters/api/retries", json!(6))],
        "clusters.api.retries: must be between 0 and 5, got 6",
    );
    one(
        &[("/clusters/api/resolve_ms", json!(5000))],
        "clusters.api.resolve_ms: has no effect: every endpoint is an IP address; remove it",
    );
    assert!(errs(&[
        ("/clusters/api/endpoints", json!(["localhost:80"])),
        ("/clusters/api/resolve_ms", json!(5000)),
    ])
    .is_empty());
    one(
        &[
            ("/clusters/api/endpoints", json!(["localhost:80"])),
            ("/clusters/api/resolve_ms", json!(999)),
        ],
        "clusters.api.resolve_ms: must be between 1000 and 86400000, got 999",
    );
}

#[test]
fn passive_health_defaults_bounds_and_off() {
    let c = load(MINIMAL).unwrap();
    let p = c.clusters["api"].health.passive.unwrap();
    assert_eq!(
        (p.failures, p.ejection_ms, p.max_ejection_ms, p.on_5xx),
        (3, 10_000, 300_000, false)
    );
    let c = load(&with(&[(&format!("{C}/health/passive"), json!(null))])).unwrap();
    assert_eq!(c.clusters["api"].health.passive, None);
    let c = load(&with(&[(
        &format!("{C}/health/passive"),
        json!({"on_5xx": true}),
    )]))
    .unwrap();
    assert!(c.clusters["api"].health.passive.unwrap().on_5xx);
    assert_eq!(
        errs(&[(
            &format!("{C}/health/passive"),
            json!({"failures": 0, "ejection_ms": 5000, "max_ejection_ms": 4000})
        )]),
        [
            "clusters.api.health.passive.failures: must be between 1 and 1000, got 0",
            "clusters.api.health.passive.max_ejection_ms: must be between 5000 and 3600000, got 4000",
        ]
    );
}

#[test]
fn active_health_defaults_and_every_rule() {
    let c = load(&with(&[(
        &format!("{C}/health/active"),
        json!({"path": "/healthz"}),
    )]))
    .unwrap();
    let a = c.clusters["api"].health.active.clone().unwrap();
    assert_eq!(
        (
            a.interval_ms,
            a.timeout_ms,
            a.healthy,
            a.unhealthy,
            a.expect_status,
            a.host
        ),
        (2000, 1000, 2, 3, vec![200], None)
    );
    assert_eq!(
        errs(&[(
            &format!("{C}/health/active"),
            json!({"path": "healthz", "host": "a b", "interval_ms": 50, "timeout_ms": 60,
                   "healthy": 0, "unhealthy": 101, "expect_status": [200, 99]})
        )]),
        [
            "clusters.api.health.active.path: \"healthz\" must start with '/'",
            "clusters.api.health.active.host: \"a b\" must be 1 to 1024 printable ASCII characters without spaces",
            "clusters.api.health.active.interval_ms: must be between 100 and 3600000, got 50",
            "clusters.api.health.active.timeout_ms: must be between 1 and 50, got 60",
            "clusters.api.health.active.healthy: must be between 1 and 100, got 0",
            "clusters.api.health.active.unhealthy: must be between 1 and 100, got 101",
            "clusters.api.health.active.expect_status[1]: must be between 200 and 599, got 99",
        ]
    );
    assert_eq!(
        errs(&[(
            &format!("{C}/health/active"),
            json!({"path": "/a#b", "expect_status": []}),
        )]),
        [
            "clusters.api.health.active.path: \"/a#b\" must be printable ASCII without spaces or '#'; percent-encode anything else",
            "clusters.api.health.active.expect_status: must list between 1 and 16 statuses, got 0",
        ]
    );
    let e = errs(&[(&format!("{C}/health/active"), json!({"interval_ms": 1000}))]);
    assert!(
        e[0].starts_with("clusters.api.health.active: missing field `path`"),
        "{e:?}"
    );
    assert!(errs(&[(
        &format!("{C}/health/active"),
        json!({"path": "/status?full=1", "host": "origin.internal:8080", "expect_status": [200, 204]})
    )])
    .is_empty());
}

#[test]
fn upstream_settings_serialize_round_trip() {
    let c = load(&with(&[
        (
            "/clusters/api/endpoints",
            json!(["10.0.0.1:80", {"address": "origin.internal:80", "weight": 5}]),
        ),
        ("/clusters/api/resolve_ms", json!(2000)),
        ("/clusters/api/health/passive", json!(null)),
        (
            &format!("{C}/health/active"),
            json!({"path": "/h", "expect_status": [204]}),
        ),
    ]))
    .unwrap();
    let again = load(&serde_json::to_string(&c).unwrap()).unwrap();
    assert_eq!(c, again);
    assert_eq!(again.clusters["api"].health.passive, None);
}

#[test]
fn upstream_tls_defaults_and_rules() {
    let c = load(&with(&[("/clusters/api/tls", json!({}))])).unwrap();
    let t = c.clusters["api"].tls.as_ref().unwrap();
    assert_eq!(
        (t.server_name.as_deref(), t.ca.as_deref(), t.verify),
        (None, None, true)
    );
    assert!(load(MINIMAL).unwrap().clusters["api"].tls.is_none());
    assert!(errs(&[(
        "/clusters/api/tls",
        json!({"server_name": "10.0.0.1", "ca": "/etc/zgix/ca.pem"})
    )])
    .is_empty());
    assert!(errs(&[("/clusters/api/tls", json!({"verify": false}))]).is_empty());
    assert_eq!(
        errs(&[(
            "/clusters/api/tls",
            json!({"server_name": "bad name", "ca": "", "verify": true})
        )]),
        [
            "clusters.api.tls.server_name: \"bad name\" is neither a DNS name (letters, digits, '-', '_' and '.', at most 253 bytes) nor an IP address",
            "clusters.api.tls.ca: must be the path of a PEM file of CA certificates",
        ]
    );
    one(
        &[("/clusters/api/tls", json!({"ca": "/x.pem", "verify": false}))],
        "clusters.api.tls.ca: has no effect with \"verify\": false (no certificate is checked); remove one of them",
    );
    let e = load(&with(&[("/clusters/api/tls", json!({"sni": "x"}))])).unwrap_err();
    assert!(e[0].to_string().contains("unknown field `sni`"), "{e:?}");
}

#[test]
fn cluster_timeouts_and_retry_on() {
    let c = load(&with(&[
        ("/clusters/api/timeouts", json!({"header_ms": 250})),
        (
            "/clusters/api/retry_on",
            json!(["connect", "timeout", "503"]),
        ),
    ]))
    .unwrap();
    let api = &c.clusters["api"];
    assert_eq!(api.timeouts.header_ms, Some(250));
    assert_eq!(api.timeouts.connect_ms, None);
    use crate::upstream::RetryOn;
    assert_eq!(
        api.retry_on,
        [RetryOn::Connect, RetryOn::Timeout, RetryOn::S503]
    );
    let d = load(&with(&[])).unwrap();
    assert_eq!(
        d.clusters["api"].retry_on,
        [RetryOn::Connect, RetryOn::Reset]
    );
    assert_eq!(
        errs(&[
            (
                "/clusters/api/timeouts",
                json!({"connect_ms": 0, "header_ms": 3_600_001, "idle_ms": 5})
            ),
            ("/clusters/api/retry_on", json!(["reset", "503", "reset"])),
        ]),
        [
            "clusters.api.timeouts.connect_ms: must be between 1 and 3600000, got 0",
            "clusters.api.timeouts.header_ms: must be between 1 and 3600000, got 3600001",
            "clusters.api.retry_on[2]: \"reset\" is listed twice",
        ]
    );
    let e = errs(&[("/clusters/api/retry_on", json!(["connect", "500"]))]);
    assert!(
        e[0].starts_with("clusters.api.retry_on[1]: unknown variant `500`, expected one of `connect`, `reset`, `timeout`, `502`, `503`, `504`"),
        "{e:?}"
    );
    let e = errs(&[("/clusters/api/timeouts", json!({"read_ms": 1}))]);
    assert!(
        e[0].starts_with("clusters.api.timeouts.read_ms: unknown field `read_ms`"),
        "{e:?}"
    );
    one(
        &[
            ("/clusters/api/retries", json!(0)),
            ("/clusters/api/retry_on", json!(["503"])),
        ],
        "clusters.api.retry_on: has no effect with \"retries\": 0; remove one of them",
    );
}
