//! End-to-end refusals: every malformed or oversized request and every upstream failure gets its exact status, then a health check.

mod support;

use std::net::TcpListener;

use support::{
    assert_bytes, assert_refusal, generated, health_check, unstamped, Client, Config, Origin, Zgix,
};

/// An origin and a zgix in front of it.
fn proxy(config: impl FnOnce(Config) -> Config) -> (Origin, Zgix) {
    let origin = Origin::start();
    let zgix = Zgix::start(&config(Config::new(&[origin.addr()])));
    (origin, zgix)
}

/// Asserts the exact refusal of `request` on default limits, then a health check.
#[track_caller]
fn refuses(request: &[u8], code: u16, reason: &str) {
    let (_origin, zgix) = proxy(|c| c);
    assert_refusal(zgix.addr(), request, code, reason);
    health_check(zgix.addr());
}

#[test]
fn content_length_with_transfer_encoding_is_400() {
    refuses(
        b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        400,
        "Bad Request",
    );
}

#[test]
fn transfer_encoding_with_content_length_after_is_400() {
    refuses(
        b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n",
        400,
        "Bad Request",
    );
}

#[test]
fn differing_content_lengths_are_400() {
    refuses(
        b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
        400,
        "Bad Request",
    );
}

#[test]
fn non_numeric_content_length_is_400() {
    refuses(
        b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 12a\r\n\r\nhello world!",
        400,
        "Bad Request",
    );
}

#[test]
fn transfer_encoding_gzip_alone_is_400() {
    refuses(
        b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip\r\n\r\n",
        400,
        "Bad Request",
    );
}

#[test]
fn unknown_transfer_coding_before_chunked_is_501() {
    refuses(
        b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: foo, chunked\r\n\r\n0\r\n\r\n",
        501,
        "Not Implemented",
    );
}

#[test]
fn bad_chunk_size_is_400() {
    refuses(
        b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
        400,
        "Bad Request",
    );
}

#[test]
fn missing_crlf_after_chunk_data_is_400() {
    refuses(
        b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n",
        400,
        "Bad Request",
    );
}

#[test]
fn obs_fold_is_400() {
    refuses(
        b"GET / HTTP/1.1\r\nHost: t\r\nX-Folded: first\r\n second\r\n\r\n",
        400,
        "Bad Request",
    );
}

#[test]
fn space_before_colon_is_400() {
    refuses(
        b"GET / HTTP/1.1\r\nHost: t\r\nX-Name : value\r\n\r\n",
        400,
        "Bad Request",
    );
}

#[test]
fn nul_in_header_value_is_400() {
    refuses(
        b"GET / HTTP/1.1\r\nHost: t\r\nX-Nul: a\0b\r\n\r\n",
        400,
        "Bad Request",
    );
}

#[test]
fn bare_cr_in_header_is_400() {
    refuses(
        b"GET / HTTP/1.1\r\nHost: t\r\nX-Cr: a\rb\r\n\r\n",
        400,
        "Bad Request",
    );
}

#[test]
fn http11_without_host_is_400() {
    refuses(b"GET / HTTP/1.1\r\nAccept: */*\r\n\r\n", 400, "Bad Request");
}

#[test]
fn two_host_fields_are_400() {
    refuses(
        b"GET / HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n\r\n",
        400,
        "Bad Request",
    );
}

#[test]
fn http2_version_is_505() {
    refuses(
        b"GET / HTTP/2.0\r\nHost: t\r\n\r\n",
        505,
        "HTTP Version Not Supported",
    );
}

#[test]
fn request_line_over_limit_is_414() {
    let (_origin, zgix) = proxy(|c| c.limit("max_request_line", 1024));
    let request = format!("GET /{} HTTP/1.1\r\nHost: t\r\n\r\n", "a".repeat(2000));
    assert_refusal(zgix.addr(), request.as_bytes(), 414, "URI Too Long");
    health_check(zgix.addr());
}

#[test]
fn request_line_over_default_limit_is_414() {
    let request = format!("GET /{} HTTP/1.1\r\nHost: t\r\n\r\n", "a".repeat(9000));
    refuses(request.as_bytes(), 414, "URI Too Long");
}

#[test]
fn head_over_max_header_bytes_is_431() {
    // 8 KiB is the smallest accepted max_header_bytes.
    let (_origin, zgix) = proxy(|c| c.limit("max_header_bytes", 8192));
    let request = format!(
        "GET / HTTP/1.1\r\nHost: t\r\nX-Big: {}\r\n\r\n",
        "v".repeat(9000)
    );
    assert_refusal(
        zgix.addr(),
        request.as_bytes(),
        431,
        "Request Header Fields Too Large",
    );
    health_check(zgix.addr());
}

#[test]
fn head_over_default_max_header_bytes_is_431() {
    let mut request = String::from("GET / HTTP/1.1\r\nHost: t\r\n");
    for i in 0..10 {
        request.push_str(&format!("X-Big-{i}: {}\r\n", "v".repeat(4000)));
    }
    request.push_str("\r\n");
    refuses(request.as_bytes(), 431, "Request Header Fields Too Large");
}

#[test]
fn too_many_header_fields_is_431() {
    let (_origin, zgix) = proxy(|c| c.limit("max_headers", 20));
    let mut request = String::from("GET / HTTP/1.1\r\nHost: t\r\n");
    for i in 0..30 {
        request.push_str(&format!("X-H{i}: {i}\r\n"));
    }
    request.push_str("\r\n");
    assert_refusal(
        zgix.addr(),
        request.as_bytes(),
        431,
        "Request Header Fields Too Large",
    );
    health_check(zgix.addr());
}

#[test]
fn many_header_fields_over_default_limit_is_431() {
    let mut request = String::from("GET / HTTP/1.1\r\nHost: t\r\n");
    for i in 0..150 {
        request.push_str(&format!("X-H{i}: {i}\r\n"));
    }
    request.push_str("\r\n");
    refuses(request.as_bytes(), 431, "Request Header Fields Too Large");
}

#[test]
fn content_length_over_max_request_body_is_413() {
    let (origin, zgix) = proxy(|c| c.limit("max_request_body", 1000));
    // Only the head: a proxy that refuses up front must not wait for the body.
    assert_refusal(
        zgix.addr(),
        b"POST /sink HTTP/1.1\r\nHost: t\r\nContent-Length: 1001\r\n\r\n",
        413,
        "Content Too Large",
    );
    assert!(origin.requests().is_empty(), "the origin got a request");
    // Exactly the limit is fine.
    let mut client = Client::connect(zgix.addr());
    let mut request = b"POST /sink HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\n".to_vec();
    request.extend_from_slice(&[b'x'; 1000]);
    let resp = client.request(&request);
    assert_bytes(&resp.body, b"1000");
    health_check(zgix.addr());
}

#[test]
fn chunked_body_over_max_request_body_is_413() {
    let (_origin, zgix) = proxy(|c| c.limit("max_request_body", 1000));
    let mut request =
        b"POST /sink HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    for _ in 0..4 {
        request.extend_from_slice(b"1f4\r\n");
        request.extend_from_slice(&[b'y'; 500]);
        request.extend_from_slice(b"\r\n");
    }
    request.extend_from_slice(b"0\r\n\r\n");
    assert_refusal(zgix.addr(), &request, 413, "Content Too Large");
    health_check(zgix.addr());
}

#[test]
fn unknown_expectation_is_417() {
    refuses(
        b"POST /echo HTTP/1.1\r\nHost: t\r\nExpect: something-else\r\nContent-Length: 2\r\n\r\nhi",
        417,
        "Expectation Failed",
    );
}

#[test]
fn refused_upstream_is_502() {
    // A port that was just free: nothing listens there.
    let dead = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap();
    let origin = Origin::start();
    let zgix = Zgix::start(&Config::new(&[dead]).listener_for("live", &[origin.addr()]));
    assert_eq!(zgix.listeners.len(), 2, "stderr:\n{}", zgix.stderr());
    assert_refusal(
        zgix.listeners[0],
        b"GET / HTTP/1.1\r\nHost: t\r\n\r\n",
        502,
        "Bad Gateway",
    );
    health_check(zgix.listeners[1]);
}

#[test]
fn upstream_closing_without_response_is_502() {
    let (origin, zgix) = proxy(|c| c);
    assert_refusal(
        zgix.addr(),
        b"GET /reset HTTP/1.1\r\nHost: t\r\n\r\n",
        502,
        "Bad Gateway",
    );
    assert!(!origin.requests().is_empty());
    health_check(zgix.addr());
}

#[test]
fn upstream_garbage_is_502() {
    refuses(
        b"GET /garbage HTTP/1.1\r\nHost: t\r\n\r\n",
        502,
        "Bad Gateway",
    );
}

#[test]
fn upstream_header_timeout_is_504() {
    let (_origin, zgix) = proxy(|c| c.limit("upstream_header_timeout_ms", 300));
    assert_refusal(
        zgix.addr(),
        b"GET /hang HTTP/1.1\r\nHost: t\r\n\r\n",
        504,
        "Gateway Timeout",
    );
    health_check(zgix.addr());
}

/// A header timeout is not retried: the origin has the request and may still
/// act on it, and docs/config.md's retry rule names connect failures and
/// resets before any response byte only. (A GET was sent to the second
/// endpoint too, and the client waited two timeouts.)
#[test]
fn a_request_that_meets_the_header_timeout_is_not_sent_again() {
    let (a, b) = (Origin::start(), Origin::start());
    let zgix =
        Zgix::start(&Config::new(&[a.addr(), b.addr()]).limit("upstream_header_timeout_ms", 300));
    assert_refusal(
        zgix.addr(),
        b"GET /hang HTTP/1.1\r\nHost: t\r\n\r\n",
        504,
        "Gateway Timeout",
    );
    let sent = a.requests().len() + b.requests().len();
    assert_eq!(sent, 1, "the request went to {sent} endpoints");
}

#[test]
fn stalled_client_head_is_closed_after_header_timeout() {
    let (origin, zgix) = proxy(|c| c.limit("client_header_timeout_ms", 300));
    let mut client = Client::connect(zgix.addr());
    client.send(b"GET / HTTP/1.1\r\nHost: t\r\nX-Partial: ");
    // Either a generated 408 then close, or a bare close; a read that times
    // out after IO_TIMEOUT means zgix kept the connection open.
    match client.try_read_response(false) {
        Ok(resp) => {
            assert_bytes(&unstamped(&resp.raw), &generated(408, "Request Timeout"));
            client.expect_closed();
        }
        Err(e) => assert!(
            matches!(
                e.kind(),
                std::io::ErrorKind::UnexpectedEof
                    | std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::ConnectionAborted
            ),
            "connection not closed after the header timeout: {e}; received: \"{}\"",
            client.transcript()
        ),
    }
    assert!(origin.requests().is_empty());
    health_check(zgix.addr());
}
