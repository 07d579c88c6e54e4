//! End-to-end tests of `request_filters`: every matcher, every action, rule order and WAF precedence.

mod support;

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};

use support::*;

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// One listener on 127.0.0.1:0 for cluster `api` = `origin` with `filters`
/// (a JSON array) and `http_extra` spliced into its `http` object.
fn start(origin: &Origin, filters: &str, http_extra: &str) -> Zgix {
    Zgix::start_json(&format!(
        r#"{{"listeners":[{{"bind":"127.0.0.1:0","http":{{"cluster":"api","request_filters":{filters}{http_extra}}}}}],
"clusters":{{"api":{{"endpoints":["{}"]}}}}}}"#,
        origin.addr()
    ))
}

/// `GET {path}` with `Host: {host}` and `extra` header lines (each ending in CRLF), keep-alive.
fn get_req(path: &str, extra: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: f.test\r\n{extra}\r\n").into_bytes()
}

/// The body of a response as text.
fn body(resp: &Response) -> String {
    String::from_utf8_lossy(&resp.body).into_owned()
}

/// The request target each recorded request carried, in arrival order.
fn targets(origin: &Origin) -> Vec<String> {
    origin
        .requests()
        .iter()
        .map(|r| {
            String::from_utf8_lossy(&r.head)
                .split(' ')
                .nth(1)
                .unwrap_or("")
                .to_string()
        })
        .collect()
}

/// Sends `req` on `c` and returns the body text of a 200 answer.
#[track_caller]
fn body_of(c: &mut Client, req: &[u8]) -> String {
    let resp = c.request(req);
    assert_eq!(
        resp.status,
        200,
        "request \"{}\" got \"{}\"",
        escape(req),
        resp.show()
    );
    body(&resp)
}

const ORIGIN_BODY: &str = "ok\n";

// ---------------------------------------------------------------------------
// Matchers
// ---------------------------------------------------------------------------

#[test]
fn methods_matcher_is_exact_and_case_sensitive() {
    let origin = Origin::start();
    let z = start(
        &origin,
        r#"[{"match":{"methods":["DELETE","PURGE"]},"action":{"respond":{"status":200,"body":"method\n"}}}]"#,
        "",
    );
    let mut c = Client::connect(z.addr());
    for (method, expect) in [
        ("DELETE", "method\n"),
        ("PURGE", "method\n"),
        ("GET", ORIGIN_BODY),
        ("OPTIONS", ORIGIN_BODY),
        ("PURGEX", ORIGIN_BODY),
        ("Delete", ORIGIN_BODY),
    ] {
        let req = format!("{method} /m HTTP/1.1\r\nHost: f.test\r\n\r\n");
        assert_eq!(body_of(&mut c, req.as_bytes()), expect, "method {method}");
    }
    let methods: Vec<String> = origin
        .requests()
        .iter()
        .map(|r| {
            String::from_utf8_lossy(&r.head)
                .split(' ')
                .next()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(methods, ["GET", "OPTIONS", "PURGEX", "Delete"]);
}

#[test]
fn hosts_matcher_ignores_port_and_case() {
    let origin = Origin::start();
    let z = start(
        &origin,
        r#"[{"match":{"hosts":["Example.COM","[::1]","192.0.2.1"]},"action":{"respond":{"status":200,"body":"host\n"}}}]"#,
        "",
    );
    let mut c = Client::connect(z.addr());
    for (host, expect) in [
        ("example.com", "host\n"),
        ("EXAMPLE.com:8080", "host\n"),
        ("eXaMpLe.CoM", "host\n"),
        ("example.com:443", "host\n"),
        ("[::1]:8443", "host\n"),
        ("[::1]", "host\n"),
        ("192.0.2.1:80", "host\n"),
        ("example.com.evil", ORIGIN_BODY),
        ("sub.example.com", ORIGIN_BODY),
        ("example.co", ORIGIN_BODY),
        ("192.0.2.10", ORIGIN_BODY),
        ("[::2]:8443", ORIGIN_BODY),
    ] {
        let req = format!("GET /h HTTP/1.1\r\nHost: {host}\r\n\r\n");
        assert_eq!(body_of(&mut c, req.as_bytes()), expect, "Host: {host}");
    }
    // An HTTP/1.0 request without Host never matches a hosts list.
    let resp = raw_request(z.addr(), b"GET /h HTTP/1.0\r\n\r\n");
    assert!(
        resp.starts_with(b"HTTP/1.1 200 ") && resp.ends_with(OK_BODY),
        "{}",
        escape(&resp)
    );
    assert_eq!(origin.requests().len(), 6);
}

#[test]
fn path_matchers_use_the_canonical_path() {
    let origin = Origin::start();
    let z = start(
        &origin,
        r#"[{"match":{"path":{"exact":"/a/b"}},"action":{"respond":{"status":200,"body":"exact\n"}}},
            {"match":{"path":{"prefix":"/p/"}},"action":{"respond":{"status":200,"body":"prefix\n"}}},
            {"match":{"path":{"prefix":"/api"}},"action":{"respond":{"status":200,"body":"api\n"}}}]"#,
        "",
    );
    let mut c = Client::connect(z.addr());
    for (path, expect) in [
        ("/a/b", "exact\n"),
        ("/a/./b", "exact\n"),
        ("/a//b", "exact\n"),
        ("//a/b", "exact\n"),
        ("/a/c/../b", "exact\n"),
        ("/a/b?x=1", "exact\n"),
        ("/a/b/", ORIGIN_BODY),
        ("/A/b", ORIGIN_BODY),
        ("/a/b/c", ORIGIN_BODY),
        // Encoded unreserved characters are the characters (RFC 3986 §6.2.2.2).
        ("/a/%62", "exact\n"),
        ("/x/%2e%2E/a/b", "exact\n"),
        ("/p/", "prefix\n"),
        ("/p/x/y", "prefix\n"),
        ("/x/../p/y", "prefix\n"),
        ("/p", ORIGIN_BODY),
        ("/P/x", ORIGIN_BODY),
        ("/%70/x", "prefix\n"),
        ("/%3F/x", ORIGIN_BODY),
        ("/apiary", "api\n"),
        ("/api", "api\n"),
        ("/ap", ORIGIN_BODY),
    ] {
        let req = get_req(path, "");
        assert_eq!(body_of(&mut c, &req), expect, "path {path}");
    }
}

#[test]
fn header_matchers_present_equals_contains() {
    let origin = Origin::start();
    let z = start(
        &origin,
        r#"[{"match":{"path":{"exact":"/h1"},"headers":[{"name":"x-flag","present":true}]},"action":{"respond":{"status":200,"body":"h1\n"}}},
            {"match":{"path":{"exact":"/h2"},"headers":[{"name":"X-Flag","present":false}]},"action":{"respond":{"status":200,"body":"h2\n"}}},
            {"match":{"path":{"exact":"/h3"},"headers":[{"name":"x-env","equals":"Prod"}]},"action":{"respond":{"status":200,"body":"h3\n"}}},
            {"match":{"path":{"exact":"/h4"},"headers":[{"name":"user-agent","contains":"Bot/"}]},"action":{"respond":{"status":200,"body":"h4\n"}}},
            {"match":{"path":{"exact":"/h5"},"headers":[{"name":"x-a","present":true},{"name":"x-b","equals":"1"}]},"action":{"respond":{"status":200,"body":"h5\n"}}},
            {"match":{"path":{"exact":"/h6"},"headers":[{"name":"host","equals":"f.test"}]},"action":{"respond":{"status":200,"body":"h6\n"}}}]"#,
        "",
    );
    let mut c = Client::connect(z.addr());
    for (path, headers, expect) in [
        ("/h1", "x-flag: 1\r\n", "h1\n"),
        ("/h1", "X-FLAG:\r\n", "h1\n"),
        ("/h1", "x-flags: 1\r\n", ORIGIN_BODY),
        ("/h1", "", ORIGIN_BODY),
        ("/h2", "", "h2\n"),
        ("/h2", "x-other: 1\r\n", "h2\n"),
        ("/h2", "X-flag: 0\r\n", ORIGIN_BODY),
        ("/h3", "x-env: Prod\r\n", "h3\n"),
        // Case-insensitive, surrounding whitespace ignored.
        ("/h3", "x-env: prod\r\n", "h3\n"),
        ("/h3", "X-Env:   PROD  \r\n", "h3\n"),
        ("/h3", "x-env: dev\r\nx-env: prod\r\n", "h3\n"),
        ("/h3", "x-env: production\r\n", ORIGIN_BODY),
        ("/h3", "x-env: pro d\r\n", ORIGIN_BODY),
        ("/h3", "", ORIGIN_BODY),
        ("/h4", "User-Agent: Mozilla GoogleBot/2.1\r\n", "h4\n"),
        ("/h4", "user-agent: x googlebot/2.1\r\n", "h4\n"),
        ("/h4", "user-agent: Bot/\r\n", "h4\n"),
        ("/h4", "user-agent: Bot 2\r\n", ORIGIN_BODY),
        ("/h4", "x-ua: Bot/1\r\n", ORIGIN_BODY),
        ("/h5", "x-a: z\r\nx-b: 1\r\n", "h5\n"),
        ("/h5", "x-a: z\r\n", ORIGIN_BODY),
        ("/h5", "x-b: 1\r\n", ORIGIN_BODY),
        ("/h5", "x-a: z\r\nx-b: 2\r\n", ORIGIN_BODY),
        ("/h6", "", "h6\n"),
    ] {
        let req = get_req(path, headers);
        assert_eq!(
            body_of(&mut c, &req),
            expect,
            "{path} with \"{}\"",
            escape(headers.as_bytes())
        );
    }
    // `equals` compares the whole value: case-insensitively, port included.
    let resp = c.request(b"GET /h6 HTTP/1.1\r\nHost: F.TEST\r\n\r\n");
    assert_eq!(
        body(&resp),
        "h6\n",
        "Host equals ignores case: {}",
        resp.show()
    );
    let resp = c.request(b"GET /h6 HTTP/1.1\r\nHost: f.test:80\r\n\r\n");
    assert_eq!(body(&resp), ORIGIN_BODY, "{}", resp.show());
}

#[test]
fn clients_matcher_ipv4_and_ipv6() {
    let origin = Origin::start();
    let http = |bind: &str| {
        format!(
            r#"{{"bind":"{bind}","http":{{"cluster":"api","request_filters":[
 {{"match":{{"clients":["127.0.0.2/32"]}},"action":{{"respond":{{"status":200,"body":"v4-two\n"}}}}}},
 {{"match":{{"clients":["10.0.0.0/8","127.0.0.0/30"]}},"action":{{"respond":{{"status":200,"body":"v4-net\n"}}}}}},
 {{"match":{{"clients":["2001:db8::/32"]}},"action":{{"respond":{{"status":200,"body":"v6-doc\n"}}}}}},
 {{"match":{{"clients":["::/64"]}},"action":{{"respond":{{"status":200,"body":"v6-loop\n"}}}}}}]}}}}"#
        )
    };
    let z = Zgix::start_json(&format!(
        r#"{{"listeners":[{},{}],"clusters":{{"api":{{"endpoints":["{}"]}}}}}}"#,
        http("127.0.0.1:0"),
        http("[::1]:0"),
        origin.addr()
    ));
    let SocketAddr::V4(v4) = z.listeners[0] else {
        panic!("listener 0 is not IPv4")
    };
    let dest = SocketAddrV4::new(Ipv4Addr::LOCALHOST, v4.port());
    for (src, expect) in [
        (Ipv4Addr::new(127, 0, 0, 2), "v4-two\n"),
        (Ipv4Addr::new(127, 0, 0, 1), "v4-net\n"),
        (Ipv4Addr::new(127, 0, 0, 3), "v4-net\n"),
        (Ipv4Addr::new(127, 0, 0, 4), ORIGIN_BODY),
    ] {
        let stream = connect_from(src, dest).expect("connect from 127.0.0.x");
        let mut c = Client::from_stream(stream);
        assert_eq!(body_of(&mut c, &get_req("/", "")), expect, "from {src}");
    }
    assert!(z.listeners[1].is_ipv6(), "listener 1: {}", z.listeners[1]);
    let mut c = Client::connect(z.listeners[1]);
    assert_eq!(body_of(&mut c, &get_req("/", "")), "v6-loop\n", "from ::1");
    assert_eq!(origin.requests().len(), 1);
}

// ---------------------------------------------------------------------------
// Actions
// ---------------------------------------------------------------------------

#[test]
fn allow_stops_the_walk() {
    let origin = Origin::start();
    let z = start(
        &origin,
        r#"[{"action":{"request_headers":{"set":[["x-before","1"]]}}},
            {"match":{"path":{"prefix":"/open/"}},"action":{"allow":{}}},
            {"action":{"request_headers":{"set":[["x-after","1"]]}}},
            {"match":{"path":{"prefix":"/"}},"action":{"reject":{"status":403}}}]"#,
        "",
    );
    let mut c = Client::connect(z.addr());
    assert_eq!(body_of(&mut c, &get_req("/open/x", "")), ORIGIN_BODY);
    let resp = c.request(&get_req("/closed", ""));
    assert_bytes(
        &unstamped(&resp.raw),
        b"HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\n\r\n",
    );
    let rec = origin.only_request();
    assert_bytes(
        &rec.head,
        b"GET /open/x HTTP/1.1\r\nHost: f.test\r\nx-before: 1\r\nX-Forwarded-For: 127.0.0.1\r\nX-Forwarded-Proto: http\r\n\r\n",
    );
}

#[test]
fn request_headers_set_add_remove_reach_the_origin_exactly() {
    let origin = Origin::start();
    let z = start(
        &origin,
        r#"[{"match":{"path":{"exact":"/edit"}},"action":{"request_headers":{"set":[["X-Set","new"]],"add":[["x-add","a2"]],"remove":["x-remove"]}}},
            {"match":{"path":{"exact":"/nope"}},"action":{"request_headers":{"set":[["x-nope","1"]]}}},
            {"match":{"path":{"exact":"/chain"}},"action":{"request_headers":{"add":[["x-tag","one"]]}}},
            {"match":{"path":{"exact":"/chain"}},"action":{"request_headers":{"set":[["x-tag","two"]]}}},
            {"match":{"path":{"exact":"/chain"}},"action":{"request_headers":{"add":[["x-tag","three"]],"remove":["x-other"]}}},
            {"match":{"path":{"exact":"/late"}},"action":{"request_headers":{"add":[["x-late","1"]],"set":[["x-keep","k"]]}}},
            {"match":{"path":{"exact":"/late"}},"action":{"request_headers":{"remove":["X-LATE"]}}},
            {"match":{"path":{"exact":"/same"}},"action":{"request_headers":{"remove":["x-s"],"set":[["x-s","set"]],"add":[["x-s","add"]]}}}]"#,
        "",
    );
    let mut c = Client::connect(z.addr());
    let reqs: [&[u8]; 4] = [
        b"GET /edit HTTP/1.1\r\nHost: e.test\r\nX-Keep: 1\r\nX-Remove: a\r\nX-Set: old1\r\nX-Add: c1\r\nx-set: old2\r\nx-REMOVE: b\r\n\r\n",
        b"GET /chain HTTP/1.1\r\nHost: e.test\r\nX-Tag: client\r\nX-Other: o\r\nX-Stay: s\r\n\r\n",
        b"GET /late HTTP/1.1\r\nHost: e.test\r\nx-late: client\r\n\r\n",
        b"GET /same HTTP/1.1\r\nHost: e.test\r\nx-s: client\r\n\r\n",
    ];
    for req in reqs {
        assert_eq!(body_of(&mut c, req), ORIGIN_BODY);
    }
    let got = origin.wait_requests(4);
    let expected: [&[u8]; 4] = [
        b"GET /edit HTTP/1.1\r\nHost: e.test\r\nX-Keep: 1\r\nX-Add: c1\r\nX-Set: new\r\nx-add: a2\r\nX-Forwarded-For: 127.0.0.1\r\nX-Forwarded-Proto: http\r\n\r\n",
        b"GET /chain HTTP/1.1\r\nHost: e.test\r\nX-Stay: s\r\nx-tag: two\r\nx-tag: three\r\nX-Forwarded-For: 127.0.0.1\r\nX-Forwarded-Proto: http\r\n\r\n",
        b"GET /late HTTP/1.1\r\nHost: e.test\r\nx-keep: k\r\nX-Forwarded-For: 127.0.0.1\r\nX-Forwarded-Proto: http\r\n\r\n",
        b"GET /same HTTP/1.1\r\nHost: e.test\r\nx-s: set\r\nx-s: add\r\nX-Forwarded-For: 127.0.0.1\r\nX-Forwarded-Proto: http\r\n\r\n",
    ];
    for (rec, want) in got.iter().zip(expected) {
        assert_bytes(&rec.head, want);
    }
}

#[test]
fn response_headers_set_remove_reach_the_client_exactly() {
    let origin = Origin::start();
    let z = start(
        &origin,
        r#"[{"match":{"path":{"exact":"/rh"}},"action":{"response_headers":{"set":[["x-served-by","zgix"]],"remove":["X-Origin"]}}},
            {"match":{"path":{"exact":"/rh2"}},"action":{"response_headers":{"set":[["x-origin","masked"],["x-two","2"]]}}},
            {"match":{"path":{"exact":"/rh2"}},"action":{"response_headers":{"remove":["x-two"]}}},
            {"match":{"path":{"prefix":"/gen"}},"action":{"response_headers":{"set":[["x-gen","1"]]}}},
            {"match":{"path":{"exact":"/gen/respond"}},"action":{"respond":{"status":200,"body":"gen\n"}}},
            {"match":{"path":{"exact":"/gen/reject"}},"action":{"reject":{"status":403}}}]"#,
        "",
    );
    let mut c = Client::connect(z.addr());
    let resp = c.request(&get_req("/rh", ""));
    assert_bytes(
        &resp.raw,
        b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\nx-served-by: zgix\r\n\r\nok\n",
    );
    let resp = c.request(&get_req("/rh2", ""));
    assert_bytes(
        &resp.raw,
        b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\nx-origin: masked\r\n\r\nok\n",
    );
    // Responses zgix generates itself are not edited.
    let resp = c.request(&get_req("/gen/respond", ""));
    assert_bytes(
        &unstamped(&resp.raw),
        b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\ngen\n",
    );
    let resp = c.request(&get_req("/gen/reject", ""));
    assert_bytes(
        &unstamped(&resp.raw),
        b"HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\n\r\n",
    );
    // Relayed: the edit applies. Set fields go before zgix's own Connection field.
    let resp = c.request(&get_req("/gen/relayed", "Connection: close\r\n"));
    assert_bytes(
        &resp.raw,
        b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\nx-origin: o\r\nx-gen: 1\r\nConnection: close\r\n\r\nok\n",
    );
    c.expect_closed();
}

#[test]
fn rewrite_prefix_chains_and_keeps_the_query() {
    let origin = Origin::start();
    let z = start(
        &origin,
        r#"[{"action":{"rewrite":{"prefix":"/v1/","replacement":"/api/v1/"}}},
            {"action":{"rewrite":{"prefix":"/api/","replacement":"/internal/"}}},
            {"match":{"path":{"exact":"/internal/v1/users"}},"action":{"reject":{"status":403}}},
            {"action":{"rewrite":{"prefix":"/v1/","replacement":"/never/"}}},
            {"action":{"rewrite":{"prefix":"/old","replacement":"/new"}}}]"#,
        "",
    );
    let mut c = Client::connect(z.addr());
    for path in [
        "/v1/users?id=1&x=%2F",
        "/api/x",
        "/other?q",
        "/v1/./users",
        "/oldies?a=b",
        "/v1",
    ] {
        assert_eq!(body_of(&mut c, &get_req(path, "")), ORIGIN_BODY, "{path}");
    }
    // Matchers see the client's path: this one is rejected, the rewritten /v1/users was not.
    let resp = c.request(&get_req("/internal/v1/users", ""));
    assert_eq!(resp.status, 403, "{}", resp.show());
    assert_eq!(
        targets(&origin),
        [
            "/internal/v1/users?id=1&x=%2F",
            "/internal/x",
            "/other?q",
            "/internal/v1/users",
            "/newies?a=b",
            "/v1",
        ]
    );
}

#[test]
fn route_picks_another_cluster_last_route_wins() {
    let a = Origin::named("a");
    let b = Origin::named("b");
    let z = Zgix::start_json(&format!(
        r#"{{"listeners":[{{"bind":"127.0.0.1:0","http":{{"cluster":"api","request_filters":[
 {{"match":{{"path":{{"prefix":"/b/"}}}},"action":{{"route":{{"cluster":"other"}}}}}},
 {{"match":{{"path":{{"prefix":"/b/back"}}}},"action":{{"route":{{"cluster":"api"}}}}}},
 {{"match":{{"path":{{"prefix":"/c/"}}}},"action":{{"route":{{"cluster":"other"}}}}}},
 {{"match":{{"path":{{"prefix":"/c/"}}}},"action":{{"allow":{{}}}}}},
 {{"match":{{"path":{{"prefix":"/c/"}}}},"action":{{"route":{{"cluster":"api"}}}}}}]}}}}],
"clusters":{{"api":{{"endpoints":["{}"]}},"other":{{"endpoints":["{}"]}}}}}}"#,
        a.addr(),
        b.addr()
    ));
    let mut c = Client::connect(z.addr());
    for (path, expect) in [
        ("/b/x?q=1", "b"),
        ("/b/back", "a"),
        ("/c/x", "b"),
        ("/x", "a"),
        ("/b/y", "b"),
    ] {
        let resp = c.request(&get_req(path, ""));
        assert_eq!(resp.status, 200, "{path}: {}", resp.show());
        assert_eq!(
            resp.field("x-origin"),
            Some(expect),
            "{path}: {}",
            resp.show()
        );
    }
    assert_eq!(targets(&a), ["/b/back", "/x"]);
    assert_eq!(targets(&b), ["/b/x?q=1", "/c/x", "/b/y"]);
}

#[test]
fn reject_redirect_respond_answers_and_keep_alive() {
    let origin = Origin::start();
    let z = start(
        &origin,
        r#"[{"match":{"path":{"exact":"/reject"}},"action":{"reject":{"status":403}}},
            {"match":{"path":{"exact":"/r301"}},"action":{"redirect":{"status":301,"location":"https://example.com/new"}}},
            {"match":{"path":{"exact":"/r302"}},"action":{"redirect":{"status":302,"location":"/relative?x=1"}}},
            {"match":{"path":{"exact":"/r307"}},"action":{"redirect":{"status":307,"location":"https://example.com/t"}}},
            {"match":{"path":{"exact":"/r308"}},"action":{"redirect":{"status":308,"location":"https://example.com/p"}}},
            {"match":{"path":{"exact":"/respond"}},"action":{"respond":{"status":200,"headers":[["content-type","text/plain"],["x-edge","1"]],"body":"hello\n"}}},
            {"match":{"path":{"exact":"/down"}},"action":{"respond":{"status":503,"headers":[["retry-after","5"]]}}}]"#,
        "",
    );
    let mut c = Client::connect(z.addr());
    let cases: [(&str, &[u8]); 7] = [
        ("/reject", b"HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\n\r\n"),
        (
            "/r301",
            b"HTTP/1.1 301 Moved Permanently\r\nlocation: https://example.com/new\r\ncontent-length: 0\r\n\r\n",
        ),
        (
            "/r302",
            b"HTTP/1.1 302 Found\r\nlocation: /relative?x=1\r\ncontent-length: 0\r\n\r\n",
        ),
        (
            "/r307",
            b"HTTP/1.1 307 Temporary Redirect\r\nlocation: https://example.com/t\r\ncontent-length: 0\r\n\r\n",
        ),
        (
            "/r308",
            b"HTTP/1.1 308 Permanent Redirect\r\nlocation: https://example.com/p\r\ncontent-length: 0\r\n\r\n",
        ),
        (
            "/respond",
            b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\nx-edge: 1\r\ncontent-length: 6\r\n\r\nhello\n",
        ),
        (
            "/down",
            b"HTTP/1.1 503 Service Unavailable\r\nretry-after: 5\r\ncontent-length: 0\r\n\r\n",
        ),
    ];
    // All on one connection: each terminal answer keeps it open for the next.
    for (path, want) in cases {
        let resp = c.request(&get_req(path, ""));
        assert_bytes(&unstamped(&resp.raw), want);
    }
    assert_eq!(body_of(&mut c, &get_req("/", "")), ORIGIN_BODY);
    // Pipelined: a terminal answer, then a forwarded request, in one write.
    let mut two = get_req("/r301", "");
    two.extend_from_slice(&get_req("/after", ""));
    c.send(&two);
    assert_eq!(c.read_response().status, 301);
    let resp = c.read_response();
    assert_eq!(resp.status, 200, "{}", resp.show());

    // A request with a body gets `connection: close` and the connection closes.
    let mut c = Client::connect(z.addr());
    let resp =
        c.request(b"POST /reject HTTP/1.1\r\nHost: f.test\r\nContent-Length: 5\r\n\r\nabcde");
    assert_bytes(
        &unstamped(&resp.raw),
        b"HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
    );
    c.expect_closed();
    // So does a request that asks to close.
    let mut c = Client::connect(z.addr());
    let resp = c.request(&get_req("/respond", "Connection: close\r\n"));
    assert_bytes(
        &unstamped(&resp.raw),
        b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\nx-edge: 1\r\ncontent-length: 6\r\nconnection: close\r\n\r\nhello\n",
    );
    c.expect_closed();
    // A chunked body too.
    let mut c = Client::connect(z.addr());
    let resp = c.request(
        b"POST /r308 HTTP/1.1\r\nHost: f.test\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    );
    assert_bytes(
        &unstamped(&resp.raw),
        b"HTTP/1.1 308 Permanent Redirect\r\nlocation: https://example.com/p\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
    );
    c.expect_closed();

    // Filter answers never reach the origin: it saw only the two forwarded GETs.
    assert_eq!(targets(&origin), ["/", "/after"]);
    health_check(z.addr());
}

#[test]
fn respond_to_head_sends_no_body() {
    let origin = Origin::start();
    let z = start(
        &origin,
        r#"[{"match":{"path":{"exact":"/respond"}},"action":{"respond":{"status":200,"headers":[["content-type","text/plain"]],"body":"hello\n"}}}]"#,
        "",
    );
    let mut c = Client::connect(z.addr());
    c.send(b"HEAD /respond HTTP/1.1\r\nHost: f.test\r\n\r\n");
    let resp = c.read_head_response();
    assert_bytes(
        &unstamped(&resp.raw),
        b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 6\r\n\r\n",
    );
    // RFC 9110 §9.3.2: no content after a HEAD response; the next response
    // on the connection must start right after the head.
    let next = c.request(&get_req("/", ""));
    assert!(
        next.raw.starts_with(b"HTTP/1.1 200 OK\r\n"),
        "bytes after the HEAD response's head: \"{}\"",
        next.show()
    );
    assert_bytes(&next.body, OK_BODY);
}

#[test]
fn respond_204_carries_no_content_length() {
    let origin = Origin::start();
    let z = start(
        &origin,
        r#"[{"match":{"path":{"exact":"/empty"}},"action":{"respond":{"status":204,"headers":[["x-edge","1"]]}}}]"#,
        "",
    );
    let mut c = Client::connect(z.addr());
    let resp = c.request(&get_req("/empty", ""));
    assert_eq!(resp.status, 204, "{}", resp.show());
    assert_eq!(resp.field("x-edge"), Some("1"));
    // RFC 9110 §8.6: a server MUST NOT send Content-Length in a 204 response.
    assert_eq!(
        resp.field("content-length"),
        None,
        "204 with Content-Length: {}",
        resp.show()
    );
}

#[test]
fn rule_order_first_terminal_wins_earlier_edits_apply() {
    let origin = Origin::start();
    let z = start(
        &origin,
        r#"[{"match":{"path":{"exact":"/order/a"}},"action":{"respond":{"status":200,"body":"first\n"}}},
            {"match":{"path":{"prefix":"/order/"}},"action":{"respond":{"status":200,"body":"second\n"}}},
            {"match":{"path":{"prefix":"/keep/"}},"action":{"request_headers":{"set":[["x-early","1"]]}}},
            {"match":{"path":{"prefix":"/keep/"}},"action":{"response_headers":{"set":[["x-resp","1"]]}}},
            {"match":{"path":{"prefix":"/keep/"}},"action":{"rewrite":{"prefix":"/keep/","replacement":"/kept/"}}},
            {"match":{"path":{"prefix":"/keep/"}},"action":{"allow":{}}},
            {"match":{"path":{"prefix":"/keep/"}},"action":{"reject":{"status":403}}},
            {"match":{"path":{"prefix":"/gone/"}},"action":{"request_headers":{"set":[["x-early","1"]]}}},
            {"match":{"path":{"prefix":"/gone/"}},"action":{"reject":{"status":404}}}]"#,
        "",
    );
    let mut c = Client::connect(z.addr());
    assert_eq!(body_of(&mut c, &get_req("/order/a", "")), "first\n");
    assert_eq!(body_of(&mut c, &get_req("/order/b", "")), "second\n");
    let resp = c.request(&get_req("/keep/x", ""));
    assert_bytes(
        &resp.raw,
        b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\nx-origin: o\r\nx-resp: 1\r\n\r\nok\n",
    );
    let resp = c.request(&get_req("/gone/x", ""));
    assert_bytes(
        &unstamped(&resp.raw),
        b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n",
    );
    let rec = origin.only_request();
    assert_bytes(
        &rec.head,
        b"GET /kept/x HTTP/1.1\r\nHost: f.test\r\nx-early: 1\r\nX-Forwarded-For: 127.0.0.1\r\nX-Forwarded-Proto: http\r\n\r\n",
    );
}

#[test]
fn waf_runs_before_the_walk_allow_cannot_exempt() {
    let origin = Origin::start();
    let z = start(
        &origin,
        r#"[{"match":{"path":{"prefix":"/allowed/"}},"action":{"allow":{}}},
            {"match":{"path":{"prefix":"/respond/"}},"action":{"respond":{"status":200,"body":"filter\n"}}},
            {"action":{"reject":{"status":403}}}]"#,
        r#","waf":{"deny":["evil"],"status":404}"#,
    );
    assert_refusal(z.addr(), &get_req("/allowed/evil", ""), 404, "Not Found");
    assert_refusal(
        z.addr(),
        &get_req("/allowed/x?q=EVIL", ""),
        404,
        "Not Found",
    );
    assert_refusal(
        z.addr(),
        &get_req("/allowed/x", "x-note: quite Evil here\r\n"),
        404,
        "Not Found",
    );
    assert_refusal(z.addr(), &get_req("/respond/evil", ""), 404, "Not Found");
    // Without a WAF hit the filters decide.
    let mut c = Client::connect(z.addr());
    assert_eq!(body_of(&mut c, &get_req("/allowed/fine", "")), ORIGIN_BODY);
    assert_eq!(body_of(&mut c, &get_req("/respond/x", "")), "filter\n");
    let resp = c.request(&get_req("/elsewhere", ""));
    assert_eq!(resp.status, 403, "{}", resp.show());
    assert_eq!(targets(&origin), ["/allowed/fine"]);
}

#[test]
fn hosts_matcher_sees_the_host_the_origin_gets_for_absolute_form() {
    let origin = Origin::start();
    let z = start(
        &origin,
        r#"[{"match":{"hosts":["admin.example.com"]},"action":{"reject":{"status":403}}}]"#,
        "",
    );
    let mut c = Client::connect(z.addr());
    // Origin-form: rejected.
    let resp = c.request(b"GET /x HTTP/1.1\r\nHost: admin.example.com\r\n\r\n");
    assert_eq!(resp.status, 403, "{}", resp.show());
    // Absolute-form: zgix forwards the target's authority as Host (RFC 9112
    // §3.2.2), so the hosts matcher has to judge that same host.
    let resp =
        c.request(b"GET http://admin.example.com/x HTTP/1.1\r\nHost: www.example.com\r\n\r\n");
    let forwarded: Vec<String> = origin.requests().iter().map(|r| escape(&r.head)).collect();
    assert_eq!(
        resp.status, 403,
        "hosts filter bypassed via absolute-form target; origin received: {forwarded:?}"
    );
}

#[test]
fn request_headers_remove_x_forwarded_for_drops_the_client_value() {
    let origin = Origin::start();
    let z = start(
        &origin,
        r#"[{"action":{"request_headers":{"remove":["x-forwarded-for"]}}}]"#,
        "",
    );
    let mut c = Client::connect(z.addr());
    let resp = c.request(&get_req("/", "X-Forwarded-For: 6.6.6.6\r\n"));
    assert_eq!(resp.status, 200, "{}", resp.show());
    let rec = origin.only_request();
    assert_bytes(
        &rec.head,
        b"GET / HTTP/1.1\r\nHost: f.test\r\nX-Forwarded-For: 127.0.0.1\r\nX-Forwarded-Proto: http\r\n\r\n",
    );
}

#[test]
fn terminal_answer_to_http10_keep_alive_client_is_consistent() {
    let origin = Origin::start();
    let z = start(
        &origin,
        r#"[{"match":{"path":{"exact":"/reject"}},"action":{"reject":{"status":403}}}]"#,
        "",
    );
    // Relayed answers tell an HTTP/1.0 keep-alive client the connection persists.
    let mut c = Client::connect(z.addr());
    let resp = c.request(b"GET / HTTP/1.0\r\nHost: f.test\r\nConnection: keep-alive\r\n\r\n");
    assert_eq!(resp.status, 200, "{}", resp.show());
    assert_eq!(
        resp.field("connection"),
        Some("keep-alive"),
        "{}",
        resp.show()
    );
    // A filter answer must do the same if it keeps the connection, else close it.
    let resp = c.request(b"GET /reject HTTP/1.0\r\nHost: f.test\r\nConnection: keep-alive\r\n\r\n");
    assert_eq!(resp.status, 403, "{}", resp.show());
    match resp
        .field("connection")
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        Some("keep-alive") => {
            let again =
                c.request(b"GET / HTTP/1.0\r\nHost: f.test\r\nConnection: keep-alive\r\n\r\n");
            assert_eq!(again.status, 200, "{}", again.show());
        }
        Some("close") => c.expect_closed(),
        other => {
            let open = !c.is_closed();
            panic!(
                "HTTP/1.0 keep-alive client got Connection {other:?} (connection left open: {open}); an HTTP/1.0 client takes that as close: {}",
                resp.show()
            )
        }
    }
}
