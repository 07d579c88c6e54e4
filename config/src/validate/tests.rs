//! Tests for validate.rs.
use super::*;
use crate::load::deserialize;
use serde_json::{json, Value};

const MINIMAL: &str = r#"{ "cpus": [0, 1], "admin": { "bind": "127.0.0.1:9901" },
  "listeners": [ { "bind": "0.0.0.0:8080", "http": { "cluster": "api" } } ],
  "clusters": { "api": { "endpoints": ["127.0.0.1:9000", "127.0.0.1:9001"], "lb": "round_robin" } } }"#;

fn load(text: &str) -> Result<Config, Vec<String>> {
    let strs = |v: Vec<ConfigError>| v.iter().map(ToString::to_string).collect::<Vec<_>>();
    let c = deserialize(text).map_err(strs)?;
    validate_with_cpus(&c, &[0, 1, 2, 3]).map_err(strs)?;
    Ok(c)
}

/// MINIMAL with each `(pointer, value)` set; missing objects on the way are created.
fn with(edits: &[(&str, Value)]) -> String {
    let mut doc: Value = serde_json::from_str(MINIMAL).unwrap();
    for (ptr, v) in edits {
        let mut at = &mut doc;
        let keys: Vec<&str> = ptr.split('/').skip(1).collect();
        for (i, key) in keys.iter().enumerate() {
            let last = i + 1 == keys.len();
            at = match at {
                Value::Array(a) => &mut a[key.parse::<usize>().unwrap()],
                Value::Object(o) => o.entry(key.to_string()).or_insert_with(|| json!({})),
                _ => panic!("{ptr}: cannot descend into a scalar"),
            };
            if last {
                *at = v.clone();
            }
        }
    }
    serde_json::to_string_pretty(&doc).unwrap()
}

/// The rules `with(edits)` breaks, as displayed.
fn errs(edits: &[(&str, Value)]) -> Vec<String> {
    match load(&with(edits)) {
        Ok(_) => Vec::new(),
        Err(e) => e,
    }
}

/// Asserts `edits` produce exactly one error, equal to `expected`.
fn one(edits: &[(&str, Value)], expected: &str) {
    assert_eq!(errs(edits), [expected], "edits: {edits:?}");
}

const F: &str = "/listeners/0/http/request_filters";
const FP: &str = "listeners[0].http.request_filters";

/// Asserts a single filter produces exactly `expected` (empty: accepted).
fn filter(f: Value, expected: &[&str]) {
    assert_eq!(errs(&[(F, json!([f]))]), expected, "filter: {f}");
}

#[test]
fn minimal_config_gets_every_default() {
    let c = load(MINIMAL).unwrap();
    assert_eq!(c.cpus, Some(vec![0, 1]));
    assert_eq!(
        c.admin.as_ref().unwrap().bind,
        "127.0.0.1:9901".parse().unwrap()
    );
    let l = &c.listeners[0];
    assert_eq!(l.bind, "0.0.0.0:8080".parse().unwrap());
    assert!(!l.proxy_protocol);
    assert_eq!(l.clients, None);
    assert_eq!(l.http.cluster, "api");
    assert_eq!(l.http.rate_limit, None);
    assert_eq!(l.http.request_id, crate::RequestIdMode::Generate);
    assert!(!l.http.forwarded);
    assert_eq!(l.http.conn_limit, None);
    assert_eq!(l.http.waf, None);
    assert!(l.http.request_filters.is_empty());
    let api = &c.clusters["api"];
    assert_eq!(api.lb, crate::model::Lb::RoundRobin);
    assert_eq!(api.endpoints.len(), 2);
    assert_eq!(c.limits, crate::limits::Limits::default());
    assert_eq!(c.limits.max_request_line, 8192);
    assert_eq!(c.limits.max_header_bytes, 32768);
    assert_eq!(c.limits.max_headers, 100);
    assert_eq!(c.limits.max_request_body, 1 << 30);
    assert_eq!(c.limits.max_response_header_bytes, 65536);
    assert_eq!(c.limits.buffer_bytes, 16384);
    assert_eq!(c.limits.client_header_timeout_ms, 10_000);
    assert_eq!(c.limits.client_idle_timeout_ms, 60_000);
    assert_eq!(c.limits.client_body_timeout_ms, 30_000);
    assert_eq!(c.limits.upstream_connect_timeout_ms, 3_000);
    assert_eq!(c.limits.upstream_header_timeout_ms, 30_000);
    assert_eq!(c.limits.upstream_idle_timeout_ms, 60_000);
    assert_eq!(c.limits.upstream_pool_idle_per_endpoint, 1024);
    assert_eq!(c.limits.upstream_pool_idle_timeout_ms, 60_000);
    assert_eq!(api.health, crate::upstream::Health::default());
    assert_eq!(api.retries, 1);
    assert_eq!(api.resolve_ms, None);
    assert_eq!(c.limits.drain_timeout_ms, 10_000);
    assert_eq!(c.limits.proxy_protocol_timeout_ms, 3_000);
    assert_eq!(c.limits.busy_poll_us, 500);
    assert_eq!(c.limits.rate_limit_entries, 4096);
    assert_eq!(c.limits.conn_limit_entries, 4096);
    assert_eq!(c.shard_cpus(), [0, 1]);
}

#[test]
fn waf_status_defaults_to_403() {
    let c = load(&with(&[(
        "/listeners/0/http/waf",
        json!({"deny": ["<script"]}),
    )]))
    .unwrap();
    assert_eq!(c.listeners[0].http.waf.as_ref().unwrap().status, 403);
}

#[test]
fn serialize_round_trips() {
    let c = load(&with(&[
        ("/listeners/0/http/waf", json!({"deny": ["../"]})),
        (
            F,
            json!([{"name": "n", "match": {"path": {"prefix": "/a/"}, "clients": ["10.0.0.0/8"]},
                    "action": {"request_headers": {"set": [["x-a", "1"]]}}}]),
        ),
    ]))
    .unwrap();
    let again = load(&serde_json::to_string(&c).unwrap()).unwrap();
    assert_eq!(c, again);
}

#[test]
fn unknown_fields_are_named_by_path() {
    let cases: &[(&str, Value, &str)] = &[
        ("/foo", json!(1), "foo: unknown field `foo`, expected one of `cpus`, `admin`, `listeners`, `clusters`, `limits`"),
        ("/admin/port", json!(1), "admin.port: unknown field `port`, expected one of `bind`, `token`, `max_connections`, `header_timeout_ms`, `idle_timeout_ms`"),
        ("/listeners/0/ssl", json!(true), "listeners[0].ssl: unknown field `ssl`, expected one of `bind`, `proxy_protocol`, `clients`, `tls`, `http2`, `http`"),
        ("/listeners/0/clients/block", json!([]), "listeners[0].clients.block: unknown field `block`, expected `allow` or `deny`"),
        ("/listeners/0/http/extra", json!(1), "listeners[0].http.extra: unknown field `extra`, expected one of `cluster`, `rate_limit`, `conn_limit`, `waf`, `request_filters`"),
        ("/listeners/0/http/rate_limit", json!({"requests": 1, "window_ms": 1, "burst": 1, "per": "ip"}), "listeners[0].http.rate_limit.per: unknown field `per`, expected one of `requests`, `window_ms`, `burst`, `scope`, `key`, `dry_run`, `headers`"),
        ("/listeners/0/http/rate_limit", json!({"requests": 1, "window_ms": 1, "burst": 1, "key": "ip"}), "listeners[0].http.rate_limit.key: unknown variant `ip`, expected `address` or `header`"),
        ("/listeners/0/http/conn_limit", json!({"max": 1, "min": 0}), "listeners[0].http.conn_limit.min: unknown field `min`, expected `max`"),
        ("/listeners/0/http/waf", json!({"deny": ["a"], "body": true}), "listeners[0].http.waf.body: unknown field `body`, expected one of `deny`, `status`, `dry_run`"),
        ("/clusters/api/weight", json!(1), "clusters.api.weight: unknown field `weight`, expected one of `endpoints`, `lb`, `health`, `retries`, `resolve_ms`"),
        ("/limits/bogus", json!(1), "limits.bogus: unknown field `bogus`"),
        (F, json!([{"action": {"allow": {}}, "when": 1}]), "listeners[0].http.request_filters[0].when: unknown field `when`, expected one of `name`, `match`, `action`"),
        (F, json!([{"match": {"query": 1}, "action": {"allow": {}}}]), "listeners[0].http.request_filters[0].match.query: unknown field `query`, expected one of `methods`, `hosts`, `path`, `headers`, `clients`"),
        (F, json!([{"match": {"headers": [{"name": "a", "regex": "b"}]}, "action": {"allow": {}}}]), "listeners[0].http.request_filters[0].match.headers[0].regex: unknown field `regex`"),
        (F, json!([{"action": {"allow": {"log": true}}}]), "listeners[0].http.request_filters[0].action.allow.log: unknown field `log`, there are no fields"),
        (F, json!([{"action": {"reject": {"status": 403, "body": ""}}}]), "listeners[0].http.request_filters[0].action.reject.body: unknown field `body`, expected `status`"),
        (F, json!([{"action": {"nope": {}}}]), "listeners[0].http.request_filters[0].action: unknown variant `nope`"),
        (F, json!([{"action": {"rewrite": {"prefix": "/", "replacement": "/", "regex": true}}}]), "listeners[0].http.request_filters[0].action.rewrite.regex: unknown field `regex`"),
    ];
    for (ptr, v, expected) in cases {
        let e = errs(&[(ptr, v.clone())]);
        assert_eq!(e.len(), 1, "{ptr}: {e:?}");
        assert!(
            e[0].starts_with(expected),
            "{ptr}: got {:?}, want {expected:?}",
            e[0]
        );
        assert!(e[0].contains("(line "), "{ptr}: no position in {:?}", e[0]);
    }
}

/// A key that is not a plain name is quoted in the path, so the path names one
/// place: the `config_load` fuzz target found `"proxy_protoc.?.?"` reported at
/// `listeners[0].proxy_protoc.?`, a path that names no place in the file.
#[test]
fn keys_that_are_not_plain_names_are_quoted_in_paths() {
    let cases = [
        (
            "/listeners/0/proxy_protoc.?.?",
            "listeners[0][\"proxy_protoc.?.?\"]: unknown field `proxy_protoc.?.?`",
        ),
        (
            "/listeners/0/a b",
            "listeners[0][\"a b\"]: unknown field `a b`",
        ),
        (
            "/listeners/0/x\"y",
            "listeners[0][\"x\\\"y\"]: unknown field",
        ),
        ("/9lives", "[\"9lives\"]: unknown field `9lives`"),
        (
            "/clusters/api/re-tries",
            "clusters.api.re-tries: unknown field `re-tries`",
        ),
    ];
    for (ptr, expected) in cases {
        let e = errs(&[(ptr, json!(true))]);
        assert_eq!(e.len(), 1, "{ptr}: {e:?}");
        assert!(
            e[0].starts_with(expected),
            "{ptr}: got {:?}, want {expected:?}",
            e[0]
        );
    }
    // Rules name a cluster whose name holds a dot the same way.
    let e = errs(&[(
        "/clusters/api.v2",
        json!({"endpoints": ["127.0.0.1:9000", "127.0.0.1:9000"]}),
    )]);
    assert_eq!(
        e,
        ["clusters[\"api.v2\"].endpoints[1]: 127.0.0.1:9000 is already endpoints[0]"]
    );
    // A key serde could not read is located at the object that holds it.
    let bad = MINIMAL.replacen("\"listeners\": [ {", "\"listeners\": [ { \"\\q\": 1,", 1);
    assert_ne!(bad, MINIMAL, "the edit applies");
    let e = deserialize(&bad).unwrap_err();
    assert_eq!(e[0].path, "listeners[0]", "{e:?}");
}

#[test]
fn five_problems_are_all_reported() {
    let e = errs(&[
        ("/cpus", json!([0, 0])),
        ("/listeners/0/http/cluster", json!("apx")),
        (
            "/clusters/api/endpoints",
            json!(["127.0.0.1:9000", "127.0.0.1:9000"]),
        ),
        (
            "/listeners/0/http/waf",
            json!({"deny": ["x"], "status": 401}),
        ),
        ("/limits/max_headers", json!(0)),
    ]);
    assert_eq!(
        e,
        [
            "cpus[1]: CPU 0 is already cpus[0]",
            "listeners[0].http.cluster: no cluster named \"apx\"",
            "listeners[0].http.waf.status: must be 400, 403, 404 or 429, got 401",
            "clusters.api.endpoints[1]: 127.0.0.1:9000 is already endpoints[0]",
            "limits.max_headers: must be between 1 and 256, got 0",
        ]
    );
}

#[test]
fn syntax_errors_have_no_path() {
    let e = deserialize("{").unwrap_err();
    assert_eq!(e[0].path, "");
    assert_eq!(
        e[0].to_string(),
        "EOF while parsing an object (line 1, column 1)"
    );
    let e = deserialize(&format!("{MINIMAL} x")).unwrap_err();
    assert_eq!(e[0].path, "");
    assert_eq!(e[0].to_string(), "trailing characters (line 3, column 103)");
    let e = deserialize(r#"{"listeners": []}"#).unwrap_err();
    assert_eq!(
        e[0].to_string(),
        "missing field `clusters` (line 1, column 17)"
    );
}

#[test]
fn cpus() {
    one(
        &[("/cpus", json!([]))],
        "cpus: must list at least one CPU; omit it to use every CPU of the process's affinity mask",
    );
    one(
        &[("/cpus", json!([0, 4]))],
        "cpus[1]: CPU 4 is not in the process's affinity mask (CPUs 0-3)",
    );
    assert_eq!(
        errs(&[("/cpus", json!([3, 2, 1, 0]))]),
        Vec::<String>::new()
    );
    let c = deserialize(&with(&[("/cpus", json!([1]))])).unwrap();
    assert_eq!(
        validate_with_cpus(&c, &[0]).unwrap_err()[0].to_string(),
        "cpus[0]: CPU 1 is not in the process's affinity mask (CPUs 0)"
    );
    // Under `taskset -c 1` the mask is CPU 1 alone: `[1]` is fine, `[0]` is not.
    assert!(validate_with_cpus(&c, &[1]).is_ok());
    let c0 = deserialize(&with(&[("/cpus", json!([0, 3]))])).unwrap();
    assert_eq!(
        validate_with_cpus(&c0, &[1, 2, 5, 6, 7]).unwrap_err()[0].to_string(),
        "cpus[0]: CPU 0 is not in the process's affinity mask (CPUs 1-2,5-7)"
    );
    let mut c = c;
    c.cpus = None;
    assert_eq!(c.shard_cpus(), crate::load::available_cpus());
    assert_eq!(
        crate::load::parse_cpu_list("0-2,5,8-9"),
        Some(vec![0, 1, 2, 5, 8, 9])
    );
    assert_eq!(crate::load::parse_cpu_list("3-1"), None);
    assert_eq!(crate::load::parse_cpu_list("x"), None);
}

#[test]
fn listener_binds() {
    one(
        &[("/listeners", json!([]))],
        "listeners: must list at least one listener",
    );
    let l = |bind: &str| json!({"bind": bind, "http": {"cluster": "api"}});
    one(
        &[(
            "/listeners",
            json!([l("0.0.0.0:80"), l("0.0.0.0:81"), l("0.0.0.0:80")]),
        )],
        "listeners[2].bind: 0.0.0.0:80 is already listeners[0].bind",
    );
    // Port 0 means "any free port" and may repeat.
    assert!(errs(&[("/listeners", json!([l("127.0.0.1:0"), l("127.0.0.1:0")]))]).is_empty());
    one(
        &[("/admin/bind", json!("0.0.0.0:8080"))],
        "admin.bind: 0.0.0.0:8080 is already listeners[0].bind",
    );
}

#[test]
fn client_networks() {
    let e = errs(&[("/listeners/0/clients", json!({"allow": ["10.0.0.0/33"]}))]);
    assert_eq!(e.len(), 1);
    assert!(
        e[0].starts_with("listeners[0].clients.allow[0]: not a CIDR network such as \"10.0.0.0/8\" or \"2001:db8::/32\" (line "),
        "{e:?}"
    );
    let e = errs(&[("/listeners/0/clients", json!({"deny": ["10.0.0.1"]}))]);
    assert!(
        e[0].starts_with("listeners[0].clients.deny[0]: not a CIDR network"),
        "{e:?}"
    );
    one(
        &[("/listeners/0/clients", json!({"allow": ["10.1.2.3/8"]}))],
        "listeners[0].clients.allow[0]: 10.1.2.3/8 has host bits set; write 10.0.0.0/8",
    );
    one(
        &[("/listeners/0/clients", json!({"deny": ["2001:db8::1/128"]}))],
        "listeners[0].clients.deny[0]: 2001:db8::1/128 is longer than /64; IPv6 clients are identified by their /64, write 2001:db8::/64",
    );
    assert!(errs(&[(
        "/listeners/0/clients",
        json!({"allow": ["10.0.0.0/8", "192.0.2.7/32", "2001:db8::/32", "2001:db8:1:2::/64"], "deny": ["0.0.0.0/0"]})
    )])
    .is_empty());
}

#[test]
fn rate_limit_bounds() {
    let rl = "/listeners/0/http/rate_limit";
    assert_eq!(
        errs(&[(rl, json!({"requests": 0, "window_ms": 0, "burst": 0}))]),
        [
            "listeners[0].http.rate_limit.requests: must be between 1 and 1000000000, got 0",
            "listeners[0].http.rate_limit.window_ms: must be between 1 and 86400000, got 0",
            "listeners[0].http.rate_limit.burst: must be between 1 and 1000000000, got 0",
        ]
    );
    assert_eq!(
        errs(&[(rl, json!({"requests": 1_000_000_001u64, "window_ms": 86_400_001u64, "burst": u64::MAX}))]),
        [
            "listeners[0].http.rate_limit.requests: must be between 1 and 1000000000, got 1000000001",
            "listeners[0].http.rate_limit.window_ms: must be between 1 and 86400000, got 86400001",
            "listeners[0].http.rate_limit.burst: must be between 1 and 1000000000, got 18446744073709551615",
        ]
    );
    assert!(errs(&[(rl, json!({"requests": 1, "window_ms": 1, "burst": 1}))]).is_empty());
    assert!(errs(&[(
        rl,
        json!({"requests": 1_000_000_000u64, "window_ms": 86_400_000u64, "burst": 1_000_000_000u64})
    )])
    .is_empty());
    let e = errs(&[(rl, json!({"requests": 1, "window_ms": 1}))]);
    assert!(
        e[0].starts_with("listeners[0].http.rate_limit: missing field `burst`"),
        "{e:?}"
    );
}

#[test]
fn conn_limit_bounds() {
    one(
        &[("/listeners/0/http/conn_limit", json!({"max": 0}))],
        "listeners[0].http.conn_limit.max: must be at least 1",
    );
    assert!(errs(&[("/listeners/0/http/conn_limit", json!({"max": 1}))]).is_empty());
    assert!(errs(&[("/listeners/0/http/conn_limit", json!({"max": u32::MAX}))]).is_empty());
}

#[test]
fn waf_rules() {
    let waf = "/listeners/0/http/waf";
    one(
        &[(waf, json!({"deny": []}))],
        "listeners[0].http.waf.deny: must list between 1 and 64 literals, got 0",
    );
    let many: Vec<String> = (0..65).map(|i| format!("lit{i}")).collect();
    one(
        &[(waf, json!({ "deny": many }))],
        "listeners[0].http.waf.deny: must list between 1 and 64 literals, got 65",
    );
    assert!(errs(&[(waf, json!({ "deny": many[..64] }))]).is_empty());
    assert_eq!(
        errs(&[(waf, json!({"deny": ["ok", "", "x".repeat(257)]}))]),
        [
            "listeners[0].http.waf.deny[1]: must be between 1 and 256 bytes long, got 0",
            "listeners[0].http.waf.deny[2]: must be between 1 and 256 bytes long, got 257",
        ]
    );
    assert!(errs(&[(waf, json!({"deny": ["x".repeat(256), "y"]}))]).is_empty());
    one(
        &[(waf, json!({"deny": ["a"], "status": 401}))],
        "listeners[0].http.waf.status: must be 400, 403, 404 or 429, got 401",
    );
    for status in [400, 403, 404, 429] {
        assert!(errs(&[(waf, json!({"deny": ["a"], "status": status}))]).is_empty());
    }
}

#[test]
fn unknown_clusters() {
    one(
        &[("/listeners/0/http/cluster", json!("apx"))],
        "listeners[0].http.cluster: no cluster named \"apx\"",
    );
    filter(
        json!({"action": {"route": {"cluster": "other"}}}),
        &["listeners[0].http.request_filters[0].action.route.cluster: no cluster named \"other\""],
    );
    assert!(errs(&[
        (
            "/clusters/other",
            json!({"endpoints": ["[::1]:9000"], "lb": "source_ip"})
        ),
        (F, json!([{"action": {"route": {"cluster": "other"}}}])),
    ])
    .is_empty());
}

#[test]
fn clusters() {
    one(
        &[("/clusters/api/endpoints", json!([]))],
        "clusters.api.endpoints: must list at least one endpoint",
    );
    assert_eq!(
        errs(&[(
            "/clusters/api/endpoints",
            json!(["127.0.0.1:0", "0.0.0.0:80"])
        )]),
        [
            "clusters.api.endpoints[0]: 127.0.0.1:0: port 0 cannot be connected to",
            "clusters.api.endpoints[1]: 0.0.0.0:80: 0.0.0.0 is not a destination address",
        ]
    );
    one(
        &[("/clusters/bad name", json!({"endpoints": ["127.0.0.1:1"]}))],
        "clusters[\"bad name\"]: cluster names must be 1 to 64 characters from A-Z a-z 0-9 _ . -",
    );
}

#[test]
fn max_headers_past_the_parsers_array_is_refused() {
    // 1024 used to pass here and be clamped to the parser's 256 slots without
    // a word; now it is refused with its path, beside the file's other errors.
    assert_eq!(crate::limits::MAX_MAX_HEADERS, zgix_parser::MAX_HEADERS_CAP);
    assert_eq!(
        errs(&[
            ("/limits/max_headers", json!(1024)),
            ("/limits/buffer_bytes", json!(1)),
        ]),
        [
            "limits.max_headers: must be between 1 and 256, got 1024",
            "limits.buffer_bytes: must be between 1024 and 1048576, got 1",
        ]
    );
    assert!(errs(&[("/limits/max_headers", json!(256))]).is_empty());
}

#[test]
fn limits_bounds_both_sides() {
    // (field, lowest accepted, highest accepted); one below and one above must fail.
    let cases: &[(&str, u64, u64)] = &[
        ("max_headers", 1, 256),
        ("max_response_header_bytes", 1024, 1 << 20),
        ("buffer_bytes", 1024, 1 << 20),
        ("client_header_timeout_ms", 1, 3_600_000),
        ("client_idle_timeout_ms", 1, 3_600_000),
        ("client_body_timeout_ms", 1, 3_600_000),
        ("upstream_connect_timeout_ms", 1, 3_600_000),
        ("upstream_header_timeout_ms", 1, 3_600_000),
        ("upstream_idle_timeout_ms", 1, 3_600_000),
        ("upstream_pool_idle_timeout_ms", 1, 3_600_000),
        ("drain_timeout_ms", 1, 3_600_000),
        ("proxy_protocol_timeout_ms", 1, 3_600_000),
        ("upstream_pool_idle_per_endpoint", 0, 65_536),
        ("busy_poll_us", 0, 100_000),
        ("rate_limit_entries", 1, 1 << 24),
        ("conn_limit_entries", 1, 1 << 24),
    ];
    for &(field, lo, hi) in cases {
        let ptr = format!("/limits/{field}");
        assert!(errs(&[(&ptr, json!(lo))]).is_empty(), "{field} = {lo}");
        assert!(errs(&[(&ptr, json!(hi))]).is_empty(), "{field} = {hi}");
        if lo > 0 {
            assert_eq!(
                errs(&[(&ptr, json!(lo - 1))]),
                [format!(
                    "limits.{field}: must be between {lo} and {hi}, got {}",
                    lo - 1
                )]
            );
        }
        assert_eq!(
            errs(&[(&ptr, json!(hi + 1))]),
            [format!(
                "limits.{field}: must be between {lo} and {hi}, got {}",
                hi + 1
            )]
        );
    }
    // max_request_line: 64..=65536 (its top also needs max_header_bytes >= it).
    assert!(errs(&[("/limits/max_request_line", json!(64))]).is_empty());
    assert!(errs(&[
        ("/limits/max_request_line", json!(65536)),
        ("/limits/max_header_bytes", json!(65536))
    ])
    .is_empty());
    assert_eq!(
        errs(&[
            ("/limits/max_request_line", json!(65537)),
            ("/limits/max_header_bytes", json!(1 << 20))
        ]),
        ["limits.max_request_line: must be between 64 and 65536, got 65537"]
    );
    one(
        &[("/limits/max_request_line", json!(63))],
        "limits.max_request_line: must be between 64 and 65536, got 63",
    );
    // max_header_bytes: at least max_request_line, at most 1 MiB.
    one(
        &[("/limits/max_header_bytes", json!(8191))],
        "limits.max_header_bytes: must be between 8192 and 1048576, got 8191",
    );
    one(
        &[("/limits/max_header_bytes", json!(1_048_577))],
        "limits.max_header_bytes: must be between 8192 and 1048576, got 1048577",
    );
    assert!(errs(&[("/limits/max_header_bytes", json!(8192))]).is_empty());
    assert!(errs(&[("/limits/max_header_bytes", json!(1 << 20))]).is_empty());
    // max_request_body takes any u64, 0 included.
    assert!(errs(&[("/limits/max_request_body", json!(0))]).is_empty());
    assert!(errs(&[("/limits/max_request_body", json!(u64::MAX))]).is_empty());
}

#[test]
fn redirect_status() {
    filter(
        json!({"action": {"redirect": {"status": 303, "location": "https://x/"}}}),
        &["listeners[0].http.request_filters[0].action.redirect.status: must be 301, 302, 307 or 308, got 303"],
    );
    for status in [301, 302, 307, 308] {
        filter(
            json!({"action": {"redirect": {"status": status, "location": "/"}}}),
            &[],
        );
    }
    filter(
        json!({"action": {"redirect": {"status": 301, "location": "https://x/\r\nSet-Cookie: a=b"}}}),
        &["listeners[0].http.request_filters[0].action.redirect.location: must not contain CR, LF or NUL"],
    );
    filter(
        json!({"action": {"redirect": {"status": 301, "location": ""}}}),
        &["listeners[0].http.request_filters[0].action.redirect.location: must not be empty"],
    );
}

#[test]
fn reject_and_respond_status() {
    filter(
        json!({"action": {"reject": {"status": 399}}}),
        &["listeners[0].http.request_filters[0].action.reject.status: must be between 400 and 599, got 399"],
    );
    filter(
        json!({"action": {"reject": {"status": 600}}}),
        &["listeners[0].http.request_filters[0].action.reject.status: must be between 400 and 599, got 600"],
    );
    filter(json!({"action": {"reject": {"status": 400}}}), &[]);
    filter(json!({"action": {"reject": {"status": 599}}}), &[]);
    filter(
        json!({"action": {"respond": {"status": 199}}}),
        &["listeners[0].http.request_filters[0].action.respond.status: must be between 200 and 599, got 199"],
    );
    filter(
        json!({"action": {"respond": {"status": 204, "body": "x"}}}),
        &["listeners[0].http.request_filters[0].action.respond.body: must be empty: a 204 response has no body"],
    );
    filter(
        json!({"action": {"respond": {"status": 200, "body": "x".repeat(65537)}}}),
        &["listeners[0].http.request_filters[0].action.respond.body: must be at most 65536 bytes long, got 65537"],
    );
    filter(
        json!({"action": {"respond": {"status": 599, "body": "x".repeat(65536)}}}),
        &[],
    );
    filter(
        json!({"action": {"respond": {"status": 200, "headers": [["content-length", "2"], ["x y", "1"], ["x-ok", " padded"]], "body": "hi"}}}),
        &[
            "listeners[0].http.request_filters[0].action.respond.headers[0][0]: \"content-length\" cannot be edited: zgix manages hop-by-hop, framing and Host headers itself",
            "listeners[0].http.request_filters[0].action.respond.headers[1][0]: \"x y\" is not a valid header name",
            "listeners[0].http.request_filters[0].action.respond.headers[2][1]: must not start or end with a space or tab",
        ],
    );
}

#[test]
fn header_edits() {
    filter(
        json!({"action": {"request_headers": {}}}),
        &["listeners[0].http.request_filters[0].action.request_headers: must set, add or remove at least one header"],
    );
    filter(
        json!({"action": {"response_headers": {}}}),
        &["listeners[0].http.request_filters[0].action.response_headers: must set or remove at least one header"],
    );
    filter(
        json!({"action": {"request_headers": {
            "set": [["Transfer-Encoding", "chunked"]],
            "add": [["x-a", "a\u{0}b"]],
            "remove": ["Host", "Connection", "x-ok"]}}}),
        &[
            "listeners[0].http.request_filters[0].action.request_headers.set[0][0]: \"Transfer-Encoding\" cannot be edited: zgix manages hop-by-hop, framing and Host headers itself",
            "listeners[0].http.request_filters[0].action.request_headers.add[0][1]: must not contain CR, LF or NUL",
            "listeners[0].http.request_filters[0].action.request_headers.remove[0]: \"Host\" cannot be edited: zgix manages hop-by-hop, framing and Host headers itself",
            "listeners[0].http.request_filters[0].action.request_headers.remove[1]: \"Connection\" cannot be edited: zgix manages hop-by-hop, framing and Host headers itself",
        ],
    );
    filter(
        json!({"action": {"response_headers": {"set": [["strict-transport-security", "max-age=63072000"]], "remove": ["server", "upgrade"]}}}),
        &["listeners[0].http.request_filters[0].action.response_headers.remove[1]: \"upgrade\" cannot be edited: zgix manages hop-by-hop, framing and Host headers itself"],
    );
    filter(
        json!({"action": {"request_headers": {
            "set": [["X-Forwarded-For", "1.2.3.4"]],
            "add": [["x-forwarded-for", "5.6.7.8"]],
            "remove": ["x-forwarded-for"]}}}),
        &[
            "listeners[0].http.request_filters[0].action.request_headers.set[0][0]: \"X-Forwarded-For\" is written by zgix; use remove to drop client-supplied values",
            "listeners[0].http.request_filters[0].action.request_headers.add[0][0]: \"X-Forwarded-For\" is written by zgix; use remove to drop client-supplied values",
        ],
    );
    filter(
        json!({"action": {"request_headers": {"set": [["x-long", "v".repeat(8193)]]}}}),
        &["listeners[0].http.request_filters[0].action.request_headers.set[0][1]: must be at most 8192 bytes long, got 8193"],
    );
}

#[test]
fn rewrite_paths() {
    filter(
        json!({"action": {"rewrite": {"prefix": "old/", "replacement": "/new/?x=1"}}}),
        &[
            "listeners[0].http.request_filters[0].action.rewrite.prefix: \"old/\" must start with '/'",
            "listeners[0].http.request_filters[0].action.rewrite.replacement: \"/new/?x=1\" must not contain '?' or '#': paths are matched without the query",
        ],
    );
    filter(
        json!({"action": {"rewrite": {"prefix": "/old/", "replacement": "/"}}}),
        &[],
    );
}

#[test]
fn matchers() {
    let m = |m: Value| json!({"match": m, "action": {"allow": {}}});
    filter(m(json!({})), &[]);
    filter(
        m(json!({"methods": ["GET", "get", "PURGE", "GE T"]})),
        &[
            "listeners[0].http.request_filters[0].match.methods[1]: \"get\" is not an upper-case method token such as \"GET\"",
            "listeners[0].http.request_filters[0].match.methods[3]: \"GE T\" is not an upper-case method token such as \"GET\"",
        ],
    );
    filter(
        m(json!({"methods": [], "hosts": [], "headers": [], "clients": []})),
        &[
            "listeners[0].http.request_filters[0].match.methods: must not be empty; omit it to match every method",
            "listeners[0].http.request_filters[0].match.hosts: must not be empty; omit it to match every host",
            "listeners[0].http.request_filters[0].match.headers: must not be empty; omit it to match every request",
            "listeners[0].http.request_filters[0].match.clients: must not be empty; omit it to match every client",
        ],
    );
    filter(
        m(json!({"hosts": ["Example.COM", "[2001:db8::1]", "192.0.2.1", "example.com:443", "exa mple", "[::1]:80", ""]})),
        &[
            "listeners[0].http.request_filters[0].match.hosts[3]: \"example.com:443\" must not include a port; write an IPv6 address in brackets",
            "listeners[0].http.request_filters[0].match.hosts[4]: \"exa mple\" is not a host name: use letters, digits, '-', '.' and '_'",
            "listeners[0].http.request_filters[0].match.hosts[5]: \"[::1]:80\" is not a bracketed IPv6 address such as \"[2001:db8::1]\" (ports are not allowed)",
            "listeners[0].http.request_filters[0].match.hosts[6]: must be between 1 and 253 bytes long, got 0",
        ],
    );
    filter(
        m(json!({"path": {"exact": "x"}})),
        &["listeners[0].http.request_filters[0].match.path.exact: \"x\" must start with '/'"],
    );
    filter(
        m(json!({"path": {"prefix": "/caf\u{e9}/"}})),
        &["listeners[0].http.request_filters[0].match.path.prefix: \"/café/\" contains 'é'; paths are printable ASCII, percent-encode anything else"],
    );
    filter(
        m(json!({"headers": [
            {"name": "x-a", "present": true},
            {"name": "x-b", "equals": "v", "contains": "v"},
            {"name": "x-c"},
            {"name": "bad name", "contains": ""},
            {"name": "user-agent", "contains": "curl"},
            {"name": "content-length", "equals": "0"}
        ]})),
        &[
            "listeners[0].http.request_filters[0].match.headers[1]: must give exactly one of present, equals, contains",
            "listeners[0].http.request_filters[0].match.headers[2]: must give exactly one of present, equals, contains",
            "listeners[0].http.request_filters[0].match.headers[3].name: \"bad name\" is not a valid header name",
            "listeners[0].http.request_filters[0].match.headers[3].contains: must not be empty; use \"present\": true",
        ],
    );
    filter(
        m(json!({"clients": ["10.0.0.0/8", "10.0.0.1/8"]})),
        &["listeners[0].http.request_filters[0].match.clients[1]: 10.0.0.1/8 has host bits set; write 10.0.0.0/8"],
    );
    let e = errs(&[(F, json!([m(json!({"clients": ["10.0.0.0/40"]}))]))]);
    assert!(
        e[0].starts_with(
            "listeners[0].http.request_filters[0].match.clients[0]: not a CIDR network"
        ),
        "{e:?}"
    );
}

#[test]
fn filter_names_and_reachability() {
    let allow_all = json!({"action": {"allow": {}}});
    let tag = json!({"action": {"request_headers": {"add": [["x-tag", "1"]]}}});
    // A non-terminal catch-all does not end the walk.
    assert!(errs(&[(F, json!([tag, allow_all]))]).is_empty());
    assert_eq!(
        errs(&[(
            F,
            json!([allow_all, tag, {"name": "", "action": {"allow": {}}}])
        )]),
        [
            format!(
                "{FP}[1]: unreachable: request_filters[0] matches every request and ends the walk"
            ),
            format!(
                "{FP}[2]: unreachable: request_filters[0] matches every request and ends the walk"
            ),
            format!("{FP}[2].name: must be between 1 and 128 bytes long, got 0"),
        ]
    );
    filter(
        json!({"name": "a\nb", "action": {"allow": {}}}),
        &["listeners[0].http.request_filters[0].name: must not contain control characters"],
    );
}

#[test]
fn every_problem_in_a_filter_list_is_reported() {
    let e = errs(&[(
        F,
        json!([
            {"match": {"methods": ["get"]}, "action": {"reject": {"status": 200}}},
            {"action": {"route": {"cluster": "nope"}}},
            {"match": {"path": {"prefix": "/"}}, "action": {"redirect": {"status": 303, "location": "https://x/"}}}
        ]),
    )]);
    assert_eq!(
        e,
        [
            "listeners[0].http.request_filters[0].match.methods[0]: \"get\" is not an upper-case method token such as \"GET\"",
            "listeners[0].http.request_filters[0].action.reject.status: must be between 400 and 599, got 200",
            "listeners[0].http.request_filters[1].action.route.cluster: no cluster named \"nope\"",
            "listeners[0].http.request_filters[2].action.redirect.status: must be 301, 302, 307 or 308, got 303",
        ]
    );
}

mod admission;
mod cluster;
mod http2;
mod tls;
mod top_level;
