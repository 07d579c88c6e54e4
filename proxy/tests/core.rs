//! End-to-end forwarding: exact bytes both ways, keep-alive, pipelining, HTTP/1.0, chunked and 100-continue.

mod support;

use support::{
    assert_bytes, Client, Config, Origin, Zgix, CHUNKED_BODY, CHUNKED_BODY_RAW, OK_BODY,
};

/// An origin and a zgix in front of it.
fn proxy(config: impl FnOnce(Config) -> Config) -> (Origin, Zgix) {
    let origin = Origin::start();
    let zgix = Zgix::start(&config(Config::new(&[origin.addr()])));
    (origin, zgix)
}

#[test]
fn forwards_request_head_exactly_minus_hop_by_hop_with_xff_merged() {
    let (origin, zgix) = proxy(|c| c);
    let mut client = Client::connect(zgix.addr());
    let resp = client.request(
        b"GET /a/./b/../c?x=1&y=%2F HTTP/1.1\r\n\
          Host: example.test\r\n\
          X-Custom-Hop: drop me\r\n\
          Connection: keep-alive, X-Custom-Hop\r\n\
          Keep-Alive: timeout=5\r\n\
          TE: trailers\r\n\
          Trailer: X-Checksum\r\n\
          Upgrade: websocket\r\n\
          Proxy-Connection: keep-alive\r\n\
          x-MiXeD-Case: Value  With\tInner  Space\r\n\
          X-Forwarded-For: 10.0.0.1\r\nX-Forwarded-Proto: http\r\n\
          Accept: */*\r\n\
          x-forwarded-for: 10.0.0.2, 10.0.0.3\r\n\
          \r\n",
    );
    assert_eq!(resp.status, 200, "{}", resp.show());
    let got = origin.only_request();
    assert_bytes(
        &got.head,
        b"GET /a/c?x=1&y=%2F HTTP/1.1\r\n\
          Host: example.test\r\n\
          x-MiXeD-Case: Value  With\tInner  Space\r\n\
          Accept: */*\r\n\
          X-Forwarded-For: 10.0.0.1, 10.0.0.2, 10.0.0.3, 127.0.0.1\r\nX-Forwarded-Proto: http\r\n\
          \r\n",
    );
    assert!(got.body.is_empty());
}

#[test]
fn canonicalizes_path_decoding_only_unreserved_characters() {
    let (origin, zgix) = proxy(|c| c);
    let cases: [(&str, &str); 8] = [
        ("/a/./b/../c", "/a/c"),
        ("//x///y", "/x/y"),
        ("/a/b/../../../c", "/c"),
        ("/a/b/..", "/a/"),
        ("/a/./b/.", "/a/b/"),
        // Encoded unreserved characters are decoded (RFC 3986 §6.2.2.2), reserved ones and
        // the query are left alone.
        ("/p%3Fq/%41%2e?x=/../y//z", "/p%3Fq/A.?x=/../y//z"),
        ("/a/%2e%2E/b", "/b"),
        ("/plain", "/plain"),
    ];
    let mut client = Client::connect(zgix.addr());
    for (sent, _) in cases {
        let resp = client.get(sent);
        assert_eq!(resp.status, 200, "GET {sent}: {}", resp.show());
    }
    let got = origin.wait_requests(cases.len());
    for ((sent, want), rec) in cases.iter().zip(&got) {
        let expected = format!(
            "GET {want} HTTP/1.1\r\nHost: test.local\r\nX-Forwarded-For: 127.0.0.1\r\nX-Forwarded-Proto: http\r\n\r\n"
        );
        assert!(
            rec.head == expected.as_bytes(),
            "GET {sent}: origin got \"{}\", expected \"{}\"",
            support::escape(&rec.head),
            support::escape(expected.as_bytes())
        );
    }
}

#[test]
fn absolute_form_is_forwarded_as_origin_form_with_target_host() {
    let (origin, zgix) = proxy(|c| c);
    let mut client = Client::connect(zgix.addr());
    // RFC 9112 §3.2.2: a proxy replaces the received Host with the target's
    // authority, so the stale `other.test` must not reach the origin. Where the
    // new Host goes is not pinned; everything else keeps its order.
    let resp = client.request(
        b"GET http://example.test/p/./q?k=v HTTP/1.1\r\nX-A: 1\r\nHost: other.test\r\nAccept: */*\r\n\r\n",
    );
    assert_eq!(resp.status, 200, "{}", resp.show());
    let head = origin.only_request().head;
    let text = String::from_utf8_lossy(&head);
    let hosts: Vec<&str> = text
        .split("\r\n")
        .filter(|l| l.to_ascii_lowercase().starts_with("host:"))
        .collect();
    assert_eq!(hosts, ["Host: example.test"], "forwarded head: {text:?}");
    let without_host: String = text
        .split_inclusive("\r\n")
        .filter(|l| !l.to_ascii_lowercase().starts_with("host:"))
        .collect();
    assert_eq!(
        without_host,
        "GET /p/q?k=v HTTP/1.1\r\nX-A: 1\r\nAccept: */*\r\nX-Forwarded-For: 127.0.0.1\r\nX-Forwarded-Proto: http\r\n\r\n"
    );
}

#[test]
fn content_length_body_is_forwarded_verbatim() {
    let (origin, zgix) = proxy(|c| c);
    let mut client = Client::connect(zgix.addr());
    let resp = client.request(
        b"POST /echo?q HTTP/1.1\r\nHost: test.local\r\nContent-Type: text/plain\r\nContent-Length: 11\r\n\r\nhello world",
    );
    assert_bytes(
        &resp.raw,
        b"HTTP/1.1 200 OK\r\ncontent-length: 11\r\nx-origin: o\r\n\r\nhello world",
    );
    let got = origin.only_request();
    assert_bytes(
        &got.head,
        b"POST /echo?q HTTP/1.1\r\nHost: test.local\r\nContent-Type: text/plain\r\nContent-Length: 11\r\nX-Forwarded-For: 127.0.0.1\r\nX-Forwarded-Proto: http\r\n\r\n",
    );
    assert_bytes(&got.body, b"hello world");
}

#[test]
fn chunked_request_is_reencoded_without_extensions_and_trailers() {
    let (origin, zgix) = proxy(|c| c);
    let body: &[u8] = b"5;name=value\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n";
    let mut request =
        b"POST /echo HTTP/1.1\r\nHost: test.local\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    request.extend_from_slice(body);
    let mut client = Client::connect(zgix.addr());
    let resp = client.request(&request);
    assert_eq!(resp.status, 200, "{}", resp.show());
    assert_bytes(&resp.body, b"hello world");
    let got = origin.only_request();
    assert_bytes(
        &got.head,
        b"POST /echo HTTP/1.1\r\nHost: test.local\r\nTransfer-Encoding: chunked\r\nX-Forwarded-For: 127.0.0.1\r\nX-Forwarded-Proto: http\r\n\r\n",
    );
    // RFC 9112 §7.1.1: zgix interprets no extension and forwards none; the
    // trailer section is checked and dropped (§7.1.2).
    assert_bytes(&got.body, b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n");
    // The connection stays usable after a chunked request.
    assert_eq!(client.get("/").status, 200);
}

#[test]
fn chunked_request_fed_byte_by_byte() {
    let (origin, zgix) = proxy(|c| c);
    let request: &[u8] = b"POST /echo HTTP/1.1\r\nHost: test.local\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
    let mut client = Client::connect(zgix.addr());
    for byte in request {
        client.send(std::slice::from_ref(byte));
    }
    let resp = client.read_response();
    assert_eq!(resp.status, 200, "{}", resp.show());
    assert_bytes(&resp.body, b"abc");
    assert_bytes(&origin.only_request().body, b"3\r\nabc\r\n0\r\n\r\n");
}

#[test]
fn response_is_forwarded_byte_for_byte() {
    let (_origin, zgix) = proxy(|c| c);
    let mut client = Client::connect(zgix.addr());
    let resp = client.get("/");
    assert_bytes(
        &resp.raw,
        b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\nx-origin: o\r\n\r\nok\n",
    );
    let resp = client.get("/cl/30");
    assert_bytes(
        &resp.raw,
        b"HTTP/1.1 200 OK\r\ncontent-length: 30\r\nx-origin: o\r\n\r\nabcdefghijklmnopqrstuvwxyzabcd",
    );
}

#[test]
fn response_hop_by_hop_fields_are_stripped() {
    let (_origin, zgix) = proxy(|c| c);
    let mut client = Client::connect(zgix.addr());
    let resp = client.get("/hop");
    assert_bytes(
        &resp.raw,
        b"HTTP/1.1 200 OK\r\nX-End: Kept  As-Is\r\ncontent-length: 3\r\nx-origin: o\r\n\r\nok\n",
    );
    // The origin's `Connection: keep-alive` must not have made zgix close.
    assert_eq!(client.get("/").status, 200);
}

#[test]
fn origin_status_and_reason_are_kept() {
    let (_origin, zgix) = proxy(|c| c);
    let mut client = Client::connect(zgix.addr());
    assert_bytes(
        &client.get("/status/418").raw,
        b"HTTP/1.1 418 Origin Reason\r\nx-origin: o\r\ncontent-length: 0\r\n\r\n",
    );
    // 204 carries no body and no length; the next response must still parse.
    assert_bytes(
        &client.get("/status/204").raw,
        b"HTTP/1.1 204 Origin Reason\r\nx-origin: o\r\n\r\n",
    );
    assert_bytes(
        &client.get("/status/503").raw,
        b"HTTP/1.1 503 Origin Reason\r\nx-origin: o\r\ncontent-length: 0\r\n\r\n",
    );
    assert_bytes(&client.get("/").body, OK_BODY);
}

#[test]
fn chunked_response_is_forwarded_verbatim_to_http11_client() {
    let (_origin, zgix) = proxy(|c| c);
    let mut client = Client::connect(zgix.addr());
    let resp = client.get("/chunked");
    let mut expected =
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nx-origin: o\r\n\r\n".to_vec();
    expected.extend_from_slice(CHUNKED_BODY_RAW);
    assert_bytes(&resp.raw, &expected);
    assert_bytes(&resp.body, CHUNKED_BODY);
    assert_eq!(client.get("/").status, 200);
}

#[test]
fn close_delimited_response_adds_connection_close_and_closes() {
    let (_origin, zgix) = proxy(|c| c);
    let mut client = Client::connect(zgix.addr());
    let resp = client.get("/close");
    assert_bytes(
        &resp.raw,
        b"HTTP/1.1 200 OK\r\nx-origin: o\r\nConnection: close\r\n\r\nclose-delimited\n",
    );
    client.expect_closed();
}

#[test]
fn client_connection_close_is_honoured() {
    let (origin, zgix) = proxy(|c| c);
    let mut client = Client::connect(zgix.addr());
    let resp = client.request(b"GET / HTTP/1.1\r\nHost: test.local\r\nConnection: close\r\n\r\n");
    assert_bytes(
        &resp.raw,
        b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\nx-origin: o\r\nConnection: close\r\n\r\nok\n",
    );
    client.expect_closed();
    assert_bytes(
        &origin.only_request().head,
        b"GET / HTTP/1.1\r\nHost: test.local\r\nX-Forwarded-For: 127.0.0.1\r\nX-Forwarded-Proto: http\r\n\r\n",
    );
}

#[test]
fn keep_alive_reuses_client_and_upstream_connections() {
    let (origin, zgix) = proxy(|c| c.cpus(&[0]));
    let mut client = Client::connect(zgix.addr());
    for i in 0..12 {
        let path = ["/", "/cl/100", "/chunked", "/status/204"][i % 4];
        let resp = client.get(path);
        assert!(
            resp.status == 200 || resp.status == 204,
            "request {i} {path}: {}",
            resp.show()
        );
    }
    // A second client connection on the same (only) shard reuses the pooled one.
    let mut second = Client::connect(zgix.addr());
    for _ in 0..3 {
        assert_eq!(second.get("/").status, 200);
    }
    assert_eq!(origin.wait_requests(15).len(), 15);
    assert_eq!(
        origin.accepted(),
        1,
        "origin accepted {} connections for 15 sequential requests",
        origin.accepted()
    );
}

#[test]
fn pipelined_requests_are_answered_in_order() {
    let (origin, zgix) = proxy(|c| c);
    let mut client = Client::connect(zgix.addr());
    client.send(
        b"GET /cl/5 HTTP/1.1\r\nHost: test.local\r\n\r\n\
          POST /echo HTTP/1.1\r\nHost: test.local\r\nContent-Length: 4\r\n\r\nping\
          GET /chunked HTTP/1.1\r\nHost: test.local\r\n\r\n\
          GET /status/404 HTTP/1.1\r\nHost: test.local\r\n\r\n\
          GET / HTTP/1.1\r\nHost: test.local\r\n\r\n",
    );
    let bodies: [(u16, &[u8]); 5] = [
        (200, b"abcde"),
        (200, b"ping"),
        (200, CHUNKED_BODY),
        (404, b""),
        (200, OK_BODY),
    ];
    for (i, (status, body)) in bodies.iter().enumerate() {
        let resp = client.read_response();
        assert_eq!(resp.status, *status, "response {i}: {}", resp.show());
        assert_bytes(&resp.body, body);
    }
    let got = origin.wait_requests(5);
    let lines: Vec<String> = got
        .iter()
        .map(|r| {
            String::from_utf8_lossy(&r.head)
                .lines()
                .next()
                .unwrap_or("")
                .to_string()
        })
        .collect();
    assert_eq!(
        lines,
        [
            "GET /cl/5 HTTP/1.1",
            "POST /echo HTTP/1.1",
            "GET /chunked HTTP/1.1",
            "GET /status/404 HTTP/1.1",
            "GET / HTTP/1.1"
        ]
    );
}

#[test]
fn head_response_has_no_body_and_connection_stays_in_sync() {
    let (_origin, zgix) = proxy(|c| c);
    let mut client = Client::connect(zgix.addr());
    client.send(b"HEAD / HTTP/1.1\r\nHost: test.local\r\n\r\n");
    let resp = client.read_head_response();
    assert_bytes(
        &resp.raw,
        b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\nx-origin: o\r\n\r\n",
    );
    assert_bytes(&client.get("/cl/4").raw_body, b"abcd");
}

#[test]
fn http10_request_closes_after_response() {
    let (origin, zgix) = proxy(|c| c);
    let mut client = Client::connect(zgix.addr());
    let resp = client.request(b"GET / HTTP/1.0\r\nHost: test.local\r\n\r\n");
    assert_bytes(
        &resp.raw,
        b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\nx-origin: o\r\nConnection: close\r\n\r\nok\n",
    );
    client.expect_closed();
    assert_bytes(
        &origin.only_request().head,
        b"GET / HTTP/1.1\r\nHost: test.local\r\nX-Forwarded-For: 127.0.0.1\r\nX-Forwarded-Proto: http\r\n\r\n",
    );
}

#[test]
fn http10_keep_alive_is_honoured() {
    let (origin, zgix) = proxy(|c| c);
    let mut client = Client::connect(zgix.addr());
    for _ in 0..3 {
        let resp =
            client.request(b"GET / HTTP/1.0\r\nHost: test.local\r\nConnection: keep-alive\r\n\r\n");
        assert_bytes(
            &resp.raw,
            b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\nx-origin: o\r\nConnection: keep-alive\r\n\r\nok\n",
        );
    }
    for rec in origin.wait_requests(3) {
        assert_bytes(
            &rec.head,
            b"GET / HTTP/1.1\r\nHost: test.local\r\nX-Forwarded-For: 127.0.0.1\r\nX-Forwarded-Proto: http\r\n\r\n",
        );
    }
}

#[test]
fn http10_without_host_gets_endpoint_host() {
    let (origin, zgix) = proxy(|c| c);
    let mut client = Client::connect(zgix.addr());
    let resp = client.request(b"GET /x HTTP/1.0\r\nUser-Agent: t/1\r\n\r\n");
    assert_eq!(resp.status, 200, "{}", resp.show());
    client.expect_closed();
    let expected = format!(
        "GET /x HTTP/1.1\r\nUser-Agent: t/1\r\nHost: {}\r\nX-Forwarded-For: 127.0.0.1\r\nX-Forwarded-Proto: http\r\n\r\n",
        origin.addr()
    );
    assert_bytes(&origin.only_request().head, expected.as_bytes());
}

#[test]
fn http10_client_gets_chunked_response_dechunked_then_close() {
    let (_origin, zgix) = proxy(|c| c);
    let mut client = Client::connect(zgix.addr());
    let resp = client.request(b"GET /chunked HTTP/1.0\r\nHost: test.local\r\n\r\n");
    assert_eq!(resp.status, 200, "{}", resp.show());
    assert_eq!(
        resp.field("transfer-encoding"),
        None,
        "HTTP/1.0 client got chunked framing: {}",
        resp.show()
    );
    assert_eq!(resp.field("x-origin"), Some("o"));
    assert_eq!(resp.field("connection"), Some("close"), "{}", resp.show());
    assert_bytes(&resp.body, CHUNKED_BODY);
}

#[test]
fn expect_100_continue_goes_to_the_origin_and_zgix_makes_up_no_100() {
    // RFC 9110 §10.1.1: the origin may refuse before the body comes, so the
    // expectation is the origin's to answer; this origin never sends a 100
    // and the client sends its body anyway (as curl does after a second).
    let (origin, zgix) = proxy(|c| c);
    let mut client = Client::connect(zgix.addr());
    client.send(
        b"PUT /echo HTTP/1.1\r\nHost: test.local\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\nhello",
    );
    let resp = client.read_response();
    assert_bytes(
        &resp.raw,
        b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nx-origin: o\r\n\r\nhello",
    );
    let got = origin.only_request();
    assert_bytes(
        &got.head,
        b"PUT /echo HTTP/1.1\r\nHost: test.local\r\nContent-Length: 5\r\nX-Forwarded-For: 127.0.0.1\r\nX-Forwarded-Proto: http\r\nExpect: 100-continue\r\n\r\n",
    );
    assert_bytes(&got.body, b"hello");
}

#[test]
fn startup_reports_listeners_admin_and_shards() {
    let (_origin, zgix) = proxy(|c| c.cpus(&[0, 1]).admin());
    assert_eq!(zgix.shards, 2, "stderr:\n{}", zgix.stderr());
    assert_eq!(zgix.listeners.len(), 1, "stderr:\n{}", zgix.stderr());
    assert_ne!(zgix.addr().port(), 0);
    let admin = zgix
        .admin
        .unwrap_or_else(|| panic!("no admin line in stderr:\n{}", zgix.stderr()));
    assert_ne!(admin.port(), 0);
    drop(support::connect(admin));
    support::health_check(zgix.addr());
}
