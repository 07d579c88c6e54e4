//! End-to-end tests of the hardening issue: paths filters can trust, one Content-Length, strict chunk extensions.

mod support;

use support::*;

/// One listener for cluster `api` = `origin`, with `http_extra` spliced into its `http` object.
fn start(origin: &Origin, http_extra: &str) -> Zgix {
    Zgix::start_json(&format!(
        r#"{{"listeners":[{{"bind":"127.0.0.1:0","http":{{"cluster":"api"{http_extra}}}}}],
"clusters":{{"api":{{"endpoints":["{}"]}}}}}}"#,
        origin.addr()
    ))
}

/// The request line the origin received for its `i`th request.
fn request_line(origin: &Origin, i: usize) -> String {
    let head = &origin.wait_requests(i + 1)[i].head;
    let head = String::from_utf8_lossy(head);
    head.lines().next().unwrap_or("").to_string()
}

#[test]
fn encoded_dot_segments_cannot_dodge_a_prefix_rule() {
    let origin = Origin::start();
    let z = start(
        &origin,
        r#","request_filters":[{"match":{"path":{"prefix":"/admin"}},"action":{"reject":{"status":403}}}]"#,
    );
    // The issue's vectors: each reached the origin before the path was decoded.
    for path in [
        "/admin",
        "/public/%2e%2e/admin",
        "/public/%2E%2E/admin",
        "/.%2e/admin",
        "/x/.%2e/admin",
        "/%61dmin",
        "/public/%2e%2e/%61dmin/users",
    ] {
        let mut c = Client::connect(z.addr());
        let resp = c.get(path);
        assert_eq!(resp.status, 403, "{path}: {}", resp.show());
    }
    // An encoded slash is refused before any rule runs.
    for path in ["/%2fadmin", "/%2Fadmin", "/public%5c..%5cadmin"] {
        let req = format!("GET {path} HTTP/1.1\r\nHost: h.test\r\n\r\n");
        assert_refusal(z.addr(), req.as_bytes(), 400, "Bad Request");
    }
    assert!(origin.requests().is_empty(), "{:?}", origin.requests());
    // What the origin receives is the form the rule saw; the query is untouched.
    let mut c = Client::connect(z.addr());
    let resp = c.get("/public/%2e%2e/%7Euser/./x?q=%2e%2e/admin");
    assert_eq!(resp.status, 200, "{}", resp.show());
    assert_eq!(
        request_line(&origin, 0),
        "GET /~user/x?q=%2e%2e/admin HTTP/1.1"
    );
    // Case is kept: /ADMIN is another path (and the rule is case-sensitive).
    assert_eq!(c.get("/ADMIN").status, 200);
    assert_eq!(request_line(&origin, 1), "GET /ADMIN HTTP/1.1");
    health_check(z.addr());
}

#[test]
fn waf_sees_the_decoded_path() {
    let origin = Origin::start();
    let z = start(&origin, r#","waf":{"deny":["/secret"]}"#);
    let req = b"GET /x/%2e%2e/%73ecret HTTP/1.1\r\nHost: h.test\r\n\r\n";
    assert_refusal(z.addr(), req, 403, "Forbidden");
    assert!(origin.requests().is_empty());
    health_check(z.addr());
}

#[test]
fn a_content_length_list_reaches_the_origin_as_one_field() {
    let origin = Origin::start();
    let z = start(&origin, "");
    let mut c = Client::connect(z.addr());
    for (i, cl) in [
        "Content-Length: 5, 5",
        "Content-Length: 5\r\nContent-Length: 5",
    ]
    .iter()
    .enumerate()
    {
        let req = format!("POST /echo HTTP/1.1\r\nHost: h.test\r\n{cl}\r\n\r\nhello");
        let resp = c.request(req.as_bytes());
        assert_eq!(resp.status, 200, "{}", resp.show());
        assert_bytes(&resp.body, b"hello");
        let got = &origin.wait_requests(i + 1)[i];
        let head = String::from_utf8_lossy(&got.head).to_ascii_lowercase();
        let lines: Vec<&str> = head
            .lines()
            .filter(|l| l.starts_with("content-length"))
            .collect();
        assert_eq!(lines, ["content-length: 5"], "{cl:?}: {head}");
    }
    health_check(z.addr());
}

#[test]
fn malformed_chunk_extensions_are_400_and_never_reach_the_origin() {
    let origin = Origin::start();
    let z = start(&origin, "");
    for ext in [&b"2;"[..], b"2;a=\"unterminated", b"2;a b", b"2;a=\xff"] {
        let mut req =
            b"POST /echo HTTP/1.1\r\nHost: h.test\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        req.extend_from_slice(ext);
        req.extend_from_slice(b"\r\nab\r\n0\r\n\r\n");
        assert_refusal(z.addr(), &req, 400, "Bad Request");
    }
    for r in origin.requests() {
        assert!(
            r.body.is_empty(),
            "origin got body bytes {:?}",
            escape(&r.body)
        );
    }
    // A well-formed extension passes (the body arrives whole).
    let mut c = Client::connect(z.addr());
    let resp = c.request(
        b"POST /echo HTTP/1.1\r\nHost: h.test\r\nTransfer-Encoding: chunked\r\n\r\n2;a=\"b c\"\r\nab\r\n0\r\n\r\n",
    );
    assert_eq!(resp.status, 200, "{}", resp.show());
    assert_bytes(&resp.body, b"ab");
    health_check(z.addr());
}

/// zgix with `top` (e.g. `"via":"edge-1"`) spliced into the top-level object.
fn start_top(origin: &Origin, top: &str) -> Zgix {
    Zgix::start_json(&format!(
        r#"{{{top}"listeners":[{{"bind":"127.0.0.1:0","http":{{"cluster":"api"}}}}],
"clusters":{{"api":{{"endpoints":["{}"]}}}}}}"#,
        origin.addr()
    ))
}

#[test]
fn via_is_added_to_forwarded_requests_and_responses_after_existing_entries() {
    // RFC 9110 §7.6.3: a proxy MUST send Via, appended to what came before.
    let origin = Origin::start();
    let zgix = start_top(&origin, r#""via":"edge-1","#);
    let mut c = Client::connect(zgix.addr());
    let resp = c.request(b"GET / HTTP/1.1\r\nHost: t\r\nVia: 1.0 upstream-cdn\r\n\r\n");
    assert_eq!(resp.status, 200, "{}", resp.show());
    assert_eq!(
        resp.fields_named("via"),
        vec!["1.1 edge-1"],
        "{}",
        resp.show()
    );
    let head = String::from_utf8_lossy(&origin.only_request().head).into_owned();
    let vias: Vec<&str> = head
        .lines()
        .filter(|l| l.to_ascii_lowercase().starts_with("via:"))
        .collect();
    assert_eq!(
        vias,
        vec!["Via: 1.0 upstream-cdn", "Via: 1.1 edge-1"],
        "{head}"
    );
}

#[test]
fn via_false_adds_nothing() {
    let origin = Origin::start();
    let zgix = start_top(&origin, r#""via":false,"#);
    let mut c = Client::connect(zgix.addr());
    let resp = c.get("/");
    assert!(resp.field("via").is_none(), "{}", resp.show());
    let head = String::from_utf8_lossy(&origin.only_request().head).into_owned();
    assert!(!head.to_ascii_lowercase().contains("\nvia:"), "{head}");
}
