//! Tests of the top-level fields and document-level rules: via, server_header, access_log, listener names, filter paths in decoded form, unreadable keys.
use super::*;

#[test]
fn via_is_a_token_or_false() {
    assert_eq!(load(MINIMAL).unwrap().via, crate::Via::Name("zgix".into()));
    assert_eq!(
        load(&with(&[("/via", json!(false))])).unwrap().via,
        crate::Via::Off
    );
    assert_eq!(
        load(&with(&[("/via", json!("edge-7.example"))]))
            .unwrap()
            .via
            .name(),
        Some("edge-7.example")
    );
    let rule = "must be a token of 1 to 64 letters, digits or !#$%&'*+-.^_`|~ (such as \"zgix\"), or false";
    for bad in ["", "a b", "zgix, 1.1 evil", "a\r\nX: y", &"v".repeat(65)] {
        one(
            &[("/via", json!(bad))],
            &format!("via: {rule}, got {bad:?}"),
        );
    }
    // Reported with every other problem, not alone.
    assert_eq!(
        errs(&[
            ("/via", json!("a b")),
            ("/listeners/0/http/cluster", json!("nope"))
        ])
        .len(),
        2
    );
    let e = load(&with(&[("/via", json!(true))])).unwrap_err();
    assert_eq!(e.len(), 1);
    assert!(
        e[0].starts_with(
            "via: invalid value: boolean `true`, expected a name such as \"zgix\", or false"
        ),
        "{e:?}"
    );
    let e = load(&with(&[("/via", json!(3))])).unwrap_err();
    assert!(e[0].starts_with("via: invalid type: integer `3`"), "{e:?}");
}

#[test]
fn filter_paths_are_in_decoded_form() {
    let m =
        |p: &str| json!({"match": {"path": {"prefix": p}}, "action": {"reject": {"status": 403}}});
    let at = format!("{FP}[0].match.path.prefix");
    filter(
        m("/%61dmin"),
        &[&format!("{at}: \"/%61dmin\" contains \"%61\": paths are matched with unreserved characters decoded, write 'a'")],
    );
    filter(
        m("/a%2Fb"),
        &[&format!("{at}: \"/a%2Fb\" contains \"%2F\": a request path with an encoded '/' or '\\' is refused 400, so it never matches")],
    );
    filter(m("/caf%C3%A9/%20/%3f"), &[]);
}

#[test]
fn an_unreadable_key_is_located_at_its_object() {
    // Found by the config_load fuzz target: serde_path_to_error names a key it could
    // not read "?", which is no path an operator can look up.
    let e = deserialize("{\"list\u{0}eners\": []}").unwrap_err();
    assert_eq!(e[0].path, "");
    assert!(e[0].rule.starts_with("control character"), "{e:?}");
    let e = deserialize("{\"listeners\": [{\"bi\u{1}nd\": 1}], \"clusters\": {}}").unwrap_err();
    assert_eq!(e[0].path, "listeners[0]", "{e:?}");
}

#[test]
fn observability_defaults() {
    let c = load(MINIMAL).unwrap();
    assert_eq!(c.access_log, None);
    assert_eq!(c.server_header(), Some("zgix"));
    assert_eq!(c.listener_names(), ["0.0.0.0:8080"]);
    assert!(c.listeners[0].access_log);
    let c = load(&with(&[
        ("/access_log", json!({"path": "-"})),
        ("/server_header", json!(false)),
    ]))
    .unwrap();
    let log = c.access_log.as_ref().unwrap();
    assert_eq!(log.format, crate::observe::AccessLogFormat::Text);
    assert!(log.query);
    assert_eq!(log.buffer_bytes, 256 << 10);
    assert_eq!(c.server_header(), None);
}

#[test]
fn unnamed_listeners_on_one_port_zero_address_get_distinct_names() {
    let c = load(&with(&[(
        "/listeners",
        json!([
            {"bind": "127.0.0.1:0", "http": {"cluster": "api"}},
            {"bind": "127.0.0.1:0", "http": {"cluster": "api"}},
            {"bind": "127.0.0.1:0", "name": "public", "http": {"cluster": "api"}}
        ]),
    )]))
    .unwrap();
    assert_eq!(
        c.listener_names(),
        ["127.0.0.1:0", "127.0.0.1:0#1", "public"]
    );
}

#[test]
fn observability_rules_are_all_reported() {
    let e = errs(&[
        (
            "/access_log",
            json!({"path": "", "format": "json", "buffer_bytes": 10}),
        ),
        ("/server_header", json!("bad\u{1}")),
        (
            "/listeners",
            json!([
                {"bind": "0.0.0.0:8080", "name": "a b", "http": {"cluster": "api"}},
                {"bind": "0.0.0.0:8081", "name": "x", "http": {"cluster": "api"}},
                {"bind": "0.0.0.0:8082", "name": "x", "http": {"cluster": "api"}},
                {"bind": "0.0.0.0:8083", "name": "0.0.0.0:8084", "http": {"cluster": "api"}},
                {"bind": "0.0.0.0:8084", "http": {"cluster": "api"}}
            ]),
        ),
    ]);
    assert_eq!(
        e,
        [
            "access_log.path: must not be empty; use \"-\" for stdout",
            "access_log.buffer_bytes: must be between 512 and 67108864, got 10",
            "server_header: must be visible ASCII and inner spaces only, such as \"zgix/1.0\"",
            "listeners[0].name: must be visible ASCII without spaces, quotes or backslashes (it is a metric label and a log field)",
            "listeners[2].name: \"x\" is already listeners[1].name",
            "listeners[3].name: \"0.0.0.0:8084\" is the default name of listeners[4] (its bind address)",
        ]
    );
    assert_eq!(
        errs(&[("/access_log", json!({"path": "-", "format": "xml"}))]).len(),
        1
    );
}

#[test]
fn admin_keys_default_and_every_bad_value_is_reported() {
    let c = load(MINIMAL).unwrap();
    let a = c.admin.as_ref().unwrap();
    assert_eq!(a.token, None);
    assert_eq!(a.max_connections, 64);
    assert_eq!(a.header_timeout_ms, 5_000);
    assert_eq!(a.idle_timeout_ms, 5_000);
    let e = errs(&[(
        "/admin",
        json!({"bind": "127.0.0.1:9901", "token": "short", "max_connections": 0,
               "header_timeout_ms": 10, "idle_timeout_ms": 3_600_000}),
    )]);
    assert_eq!(
        e,
        [
            "admin.token: must be between 16 and 256 bytes long, got 5",
            "admin.max_connections: must be between 1 and 4096, got 0",
            "admin.header_timeout_ms: must be between 100 and 60000, got 10",
            "admin.idle_timeout_ms: must be between 100 and 60000, got 3600000",
        ]
    );
    one(
        &[("/admin/token", json!("0123456789abcdef 0123"))],
        "admin.token: must be letters, digits and -._~+/= only (an RFC 6750 bearer token)",
    );
    let c = load(&with(&[("/admin/token", json!("s3cr3t-t0ken-0123456789"))])).unwrap();
    assert_eq!(
        c.admin.unwrap().token.as_deref(),
        Some("s3cr3t-t0ken-0123456789")
    );
}

#[test]
fn access_log_fields_are_checked_each_with_its_path() {
    let c = load(&with(&[(
        "/access_log",
        json!({"path": "-", "fields": ["time", "host", "header:X-Tenant", "status"]}),
    )]))
    .unwrap();
    assert_eq!(
        c.access_log.unwrap().fields.unwrap(),
        ["time", "host", "header:X-Tenant", "status"]
    );
    let e = errs(&[(
        "/access_log",
        json!({"path": "-", "fields": ["status", "stauts", "header:", "header:a b",
                                       "host", "header:Host", "status", "header:x-a"]}),
    )]);
    assert_eq!(e.len(), 5, "{e:?}");
    assert!(
        e[0].starts_with(
            "access_log.fields[1]: unknown field \"stauts\"; the fields are time, client,"
        ),
        "{e:?}"
    );
    assert_eq!(
        e[1..],
        [
            "access_log.fields[2]: \"header:\": a header name is 1 to 64 token characters (RFC 9110 §5.6.2)",
            "access_log.fields[3]: \"header:a b\": a header name is 1 to 64 token characters (RFC 9110 §5.6.2)",
            "access_log.fields[5]: \"host\" is already at access_log.fields[4]",
            "access_log.fields[6]: \"status\" is already at access_log.fields[0]",
        ]
    );
    one(
        &[("/access_log", json!({"path": "-", "fields": []}))],
        "access_log.fields: must name 1 to 64 fields, got 0; omit it for the default line",
    );
    let many: Vec<String> = (0..17).map(|i| format!("header:x-{i}")).collect();
    one(
        &[("/access_log", json!({"path": "-", "fields": many}))],
        "access_log.fields[16]: more than 16 header fields (host, user_agent, referer, header:NAME)",
    );
}
