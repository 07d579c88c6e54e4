//! Unit tests of the request-head parser.

use super::*;

/// Small limits every case of the request parser's tests (and the assembler's) runs under.
pub(super) fn limits() -> Limits {
    Limits {
        max_request_line: 64,
        max_header_bytes: 256,
        max_headers: 8,
        max_body: 1000,
    }
}

/// Parses `input` whole and as every prefix; a prefix must give `Partial` until the first
/// one that decides, and from there on the whole input's result (and head).
fn parse_with(limits: Limits, input: &[u8]) -> Result<RequestHead, ParseError> {
    let parser = RequestParser::new(limits);
    let mut whole = RequestHead::new(&limits);
    let result = parser.parse(input, &mut whole);
    let mut decided = false;
    for k in 0..=input.len() {
        let mut head = RequestHead::new(&limits);
        match parser.parse(&input[..k], &mut head) {
            Ok(Status::Partial) => assert!(!decided, "Partial after a decided prefix at {k}"),
            other => {
                decided = true;
                assert_eq!(
                    other,
                    result,
                    "prefix {k} of {:?}",
                    String::from_utf8_lossy(input)
                );
                if result.is_ok() {
                    assert_eq!(head, whole, "prefix {k}");
                }
            }
        }
    }
    match result {
        Ok(Status::Complete(())) => Ok(whole),
        Ok(Status::Partial) => panic!(
            "whole input is Partial: {:?}",
            String::from_utf8_lossy(input)
        ),
        Err(e) => Err(e),
    }
}

fn parse(input: &str) -> Result<RequestHead, ParseError> {
    parse_with(limits(), input.as_bytes())
}

fn err(input: &str) -> ParseError {
    parse(input).expect_err(input)
}

fn text(buf: &str, span: Span) -> &str {
    std::str::from_utf8(span.get(buf.as_bytes())).unwrap()
}

fn kind_of(buf: &str, head: &RequestHead, name: &str) -> HeaderKind {
    head.headers
        .iter()
        .find(|h| text(buf, h.name).eq_ignore_ascii_case(name))
        .map(|h| h.kind)
        .unwrap()
}

#[test]
fn simple_get() {
    let req = "GET /a/./b/../c?x=1 HTTP/1.1\r\nHost:  example.com \r\nAccept: */*\r\n\r\n";
    let head = parse(req).unwrap();
    assert_eq!(head.method, Method::Get);
    assert_eq!(text(req, head.method_span), "GET");
    assert_eq!(head.version, Version::Http11);
    assert_eq!(text(req, head.target), "/a/./b/../c?x=1");
    assert_eq!(text(req, head.path), "/a/./b/../c");
    assert_eq!(head.query.map(|q| text(req, q)), Some("x=1"));
    assert_eq!(head.authority, None);
    assert_eq!(head.host.map(|h| text(req, h)), Some("example.com"));
    assert_eq!(head.canonical_path, b"/a/c");
    assert_eq!(head.head_len, req.len());
    assert_eq!(head.body, BodyKind::None);
    assert!(head.keep_alive);
    assert!(!head.expect_continue);
    assert_eq!(head.headers.len(), 2);
    assert_eq!(head.headers[0].kind, HeaderKind::Host);
    assert_eq!(text(req, head.headers[1].name), "Accept");
    assert_eq!(text(req, head.headers[1].value), "*/*");
    assert_eq!(head.headers[1].kind, HeaderKind::Other);
}

#[test]
fn other_method_and_empty_value() {
    let req = "PROPFIND /x HTTP/1.1\r\nHost: a\r\nX-Empty:\r\nX-Sp:   \r\n\r\n";
    let head = parse(req).unwrap();
    assert_eq!(head.method, Method::Other);
    assert_eq!(text(req, head.method_span), "PROPFIND");
    assert_eq!(text(req, head.headers[1].value), "");
    assert_eq!(text(req, head.headers[2].value), "");
}

#[test]
fn leading_empty_line_is_skipped() {
    let req = "\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n";
    let head = parse(req).unwrap();
    assert_eq!(text(req, head.method_span), "GET");
    assert_eq!(head.head_len, req.len());
}

#[test]
fn pipelined_requests() {
    let first = "POST /up HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\n";
    let second = "GET /next HTTP/1.1\r\nHost: a\r\n\r\n";
    let buf = format!("{first}hello{second}");
    let head = parse(&buf).unwrap();
    assert_eq!(head.head_len, first.len());
    assert_eq!(head.body, BodyKind::Length(5));
    let rest = &buf[head.head_len + 5..];
    let head2 = parse(rest).unwrap();
    assert_eq!(head2.head_len, second.len());
    assert_eq!(text(rest, head2.path), "/next");

    let two = format!("{second}{second}");
    let head = parse(&two).unwrap();
    assert_eq!(head.head_len, second.len());
}

#[test]
fn keep_alive_semantics() {
    // RFC 9112 §9.3.
    assert!(
        parse("GET / HTTP/1.1\r\nHost: a\r\n\r\n")
            .unwrap()
            .keep_alive
    );
    assert!(
        !parse("GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
            .unwrap()
            .keep_alive
    );
    assert!(
        !parse("GET / HTTP/1.1\r\nHost: a\r\nConnection: Keep-Alive, CLOSE\r\n\r\n")
            .unwrap()
            .keep_alive
    );
    assert!(!parse("GET / HTTP/1.0\r\n\r\n").unwrap().keep_alive);
    assert!(
        parse("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
            .unwrap()
            .keep_alive
    );
    assert!(
        parse("GET / HTTP/1.0\r\nConnection: foo,, Keep-Alive\r\n\r\n")
            .unwrap()
            .keep_alive
    );
    assert!(
        !parse("GET / HTTP/1.0\r\nConnection: keep-alive\r\nConnection: close\r\n\r\n")
            .unwrap()
            .keep_alive
    );
    assert_eq!(
        err("GET / HTTP/1.1\r\nHost: a\r\nConnection: a b\r\n\r\n"),
        ParseError::Malformed
    );
}

#[test]
fn connection_options_are_hop_by_hop() {
    let req = "GET / HTTP/1.1\r\nHost: a\r\nX-Secret: 1\r\nConnection: x-secret, Content-Length\r\nContent-Length: 0\r\nKeep-Alive: 5\r\nUpgrade: h2c\r\nTE: trailers\r\nTrailer: x\r\nProxy-Connection: x\r\nX-Forwarded-For: 1.2.3.4\r\n\r\n";
    let limits = Limits {
        max_headers: 16,
        ..limits()
    };
    let head = parse_with(limits, req.as_bytes()).unwrap();
    assert_eq!(kind_of(req, &head, "X-Secret"), HeaderKind::HopByHop);
    assert_eq!(kind_of(req, &head, "Connection"), HeaderKind::Connection);
    // Naming a framing field in Connection must not make the proxy drop it.
    assert_eq!(
        kind_of(req, &head, "Content-Length"),
        HeaderKind::ContentLength
    );
    for name in ["Keep-Alive", "Upgrade", "TE", "Trailer", "Proxy-Connection"] {
        assert_eq!(kind_of(req, &head, name), HeaderKind::HopByHop, "{name}");
    }
    assert_eq!(
        kind_of(req, &head, "X-Forwarded-For"),
        HeaderKind::XForwardedFor
    );
    assert_eq!(head.body, BodyKind::Length(0));
}

#[test]
fn content_length() {
    let head =
        parse("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n")
            .unwrap();
    assert_eq!(head.body, BodyKind::Length(5));
    let head = parse("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5 , 5\r\n\r\n").unwrap();
    assert_eq!(head.body, BodyKind::Length(5));
    let head = parse("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n").unwrap();
    assert_eq!(head.body, BodyKind::Length(0));
    for cl in [
        "Content-Length: 5\r\nContent-Length: 6",
        "Content-Length: 5, 6",
        "Content-Length: +5",
        "Content-Length: -5",
        "Content-Length: 5a",
        "Content-Length: 0x5",
        "Content-Length: 5 5",
        "Content-Length: 99999999999999999999",
        "Content-Length:",
        "Content-Length: 5,",
    ] {
        let req = format!("POST / HTTP/1.1\r\nHost: a\r\n{cl}\r\n\r\n");
        assert_eq!(err(&req), ParseError::BadFraming, "{cl}");
    }
}

#[test]
fn transfer_encoding() {
    let chunked = |te: &str| {
        let req = format!("POST / HTTP/1.1\r\nHost: a\r\n{te}\r\n\r\n");
        parse(&req).map(|h| h.body)
    };
    assert_eq!(chunked("Transfer-Encoding: chunked"), Ok(BodyKind::Chunked));
    assert_eq!(chunked("Transfer-Encoding: CHUNKED"), Ok(BodyKind::Chunked));
    assert_eq!(
        chunked("Transfer-Encoding: gzip, chunked"),
        Ok(BodyKind::Chunked)
    );
    assert_eq!(
        chunked("Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked"),
        Ok(BodyKind::Chunked)
    );
    let bad = [
        (
            "Transfer-Encoding: chunked\r\nContent-Length: 5",
            ParseError::BadFraming,
        ),
        (
            "Content-Length: 5\r\nTransfer-Encoding: chunked",
            ParseError::BadFraming,
        ),
        (
            "Content-Length: x\r\nTransfer-Encoding: chunked",
            ParseError::BadFraming,
        ),
        (
            "Transfer-Encoding: foo\r\nContent-Length: 5",
            ParseError::BadFraming,
        ),
        ("Transfer-Encoding: gzip", ParseError::BadFraming),
        ("Transfer-Encoding: identity", ParseError::BadFraming),
        ("Transfer-Encoding: chunked, gzip", ParseError::BadFraming),
        ("Transfer-Encoding: foo, chunked", ParseError::UnknownCoding),
        ("Transfer-Encoding: foo", ParseError::UnknownCoding),
        ("Transfer-Encoding: xchunked", ParseError::UnknownCoding),
        (
            "Transfer-Encoding: chunked, chunked",
            ParseError::BadFraming,
        ),
        (
            "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked",
            ParseError::BadFraming,
        ),
        ("Transfer-Encoding: chunked;q=1", ParseError::BadFraming),
        ("Transfer-Encoding: chunked,", ParseError::BadFraming),
        ("Transfer-Encoding: , chunked", ParseError::BadFraming),
        ("Transfer-Encoding:", ParseError::BadFraming),
        ("Transfer-Encoding: \"chunked\"", ParseError::BadFraming),
    ];
    for (te, e) in bad {
        assert_eq!(chunked(te), Err(e), "{te}");
    }
    // RFC 9112 §6.1: Transfer-Encoding in HTTP/1.0 means faulty framing.
    assert_eq!(
        err("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n"),
        ParseError::BadFraming
    );
}

#[test]
fn field_syntax() {
    for (what, req) in [
        (
            "obs-fold",
            "GET / HTTP/1.1\r\nHost: a\r\nX-A: b\r\n c\r\n\r\n",
        ),
        ("leading space", "GET / HTTP/1.1\r\n Host: a\r\n\r\n"),
        ("space before colon", "GET / HTTP/1.1\r\nHost : a\r\n\r\n"),
        ("tab before colon", "GET / HTTP/1.1\r\nHost\t: a\r\n\r\n"),
        ("bare CR in value", "GET / HTTP/1.1\r\nHost: a\rb\r\n\r\n"),
        (
            "bare CR line end",
            "GET / HTTP/1.1\r\nHost: a\r\rX: b\r\n\r\n",
        ),
        (
            "NUL in value",
            "GET / HTTP/1.1\r\nHost: a\r\nX: a\0b\r\n\r\n",
        ),
        ("NUL in name", "GET / HTTP/1.1\r\nHost: a\r\nX\0: b\r\n\r\n"),
        (
            "DEL in value",
            "GET / HTTP/1.1\r\nHost: a\r\nX: a\x7fb\r\n\r\n",
        ),
        (
            "bare LF in fields",
            "GET / HTTP/1.1\r\nHost: a\nX: b\r\n\r\n",
        ),
        ("bare LF end", "GET / HTTP/1.1\r\nHost: a\r\n\n"),
        ("bare LF request line", "GET / HTTP/1.1\nHost: a\r\n\r\n"),
        ("no colon", "GET / HTTP/1.1\r\nHost a\r\n\r\n"),
        ("empty name", "GET / HTTP/1.1\r\n: a\r\nHost: a\r\n\r\n"),
        ("double space", "GET  / HTTP/1.1\r\nHost: a\r\n\r\n"),
        ("tab separator", "GET\t/ HTTP/1.1\r\nHost: a\r\n\r\n"),
        ("bad method", "G(T / HTTP/1.1\r\nHost: a\r\n\r\n"),
        ("trailing garbage", "GET / HTTP/1.1x\r\nHost: a\r\n\r\n"),
        ("space in target", "GET /a b HTTP/1.1\r\nHost: a\r\n\r\n"),
    ] {
        assert_eq!(err(req), ParseError::Malformed, "{what}");
    }
    // obs-text is legal in field values (RFC 9110 §5.5).
    assert!(parse("GET / HTTP/1.1\r\nHost: a\r\nX: caf\u{e9}\r\n\r\n").is_ok());
}

#[test]
fn host_rules() {
    assert_eq!(err("GET / HTTP/1.1\r\n\r\n"), ParseError::BadHost);
    assert_eq!(
        err("GET / HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n"),
        ParseError::BadHost
    );
    assert_eq!(
        err("GET / HTTP/1.0\r\nHost: a\r\nhost: b\r\n\r\n"),
        ParseError::BadHost
    );
    for bad in ["a b", "a:b", "a/b", "user@a", "[::1", "a:99999", "a,b c"] {
        let req = format!("GET / HTTP/1.1\r\nHost: {bad}\r\n\r\n");
        assert_eq!(err(&req), ParseError::BadHost, "{bad}");
    }
    for good in ["a", "a.example:8080", "[::1]:443", "127.0.0.1", ""] {
        let req = format!("GET / HTTP/1.1\r\nHost: {good}\r\n\r\n");
        let head = parse(&req).unwrap();
        assert_eq!(head.host.map(|h| text(&req, h)), Some(good));
    }
    let head = parse("GET / HTTP/1.0\r\n\r\n").unwrap();
    assert_eq!(head.host, None);
    assert_eq!(head.version, Version::Http10);
}

#[test]
fn versions() {
    for v in ["HTTP/2.0", "HTTP/1.2", "HTTP/0.9", "HTTP/3"] {
        let req = format!("GET / {v}\r\nHost: a\r\n\r\n");
        assert_eq!(err(&req), ParseError::UnsupportedVersion, "{v}");
    }
    for v in ["HTTX/1.1", "http/1.1", "HTTP/x.1"] {
        let req = format!("GET / {v}\r\nHost: a\r\n\r\n");
        assert_eq!(err(&req), ParseError::Malformed, "{v}");
    }
    assert_eq!(err("GET /\r\n\r\n"), ParseError::Malformed);
}

#[test]
fn targets() {
    let req = "GET http://Example.com:81/p?q HTTP/1.1\r\nHost: other\r\n\r\n";
    let head = parse(req).unwrap();
    assert_eq!(head.authority.map(|a| text(req, a)), Some("Example.com:81"));
    assert_eq!(text(req, head.path), "/p");
    assert_eq!(head.query.map(|q| text(req, q)), Some("q"));
    assert_eq!(head.host.map(|h| text(req, h)), Some("other"));

    let req = "GET https://a.com HTTP/1.1\r\nHost: a.com\r\n\r\n";
    let head = parse(req).unwrap();
    assert_eq!(text(req, head.path), "/");
    assert_eq!(head.canonical_path, b"/");

    let req = "OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n";
    let head = parse(req).unwrap();
    assert_eq!(text(req, head.path), "*");
    assert_eq!(head.canonical_path, b"*");

    assert_eq!(
        err("GET * HTTP/1.1\r\nHost: a\r\n\r\n"),
        ParseError::Malformed
    );
    assert_eq!(
        err("CONNECT a.com:443 HTTP/1.1\r\nHost: a.com:443\r\n\r\n"),
        ParseError::Malformed
    );
    assert_eq!(
        err("GET a.com:443 HTTP/1.1\r\nHost: a\r\n\r\n"),
        ParseError::Malformed
    );
    assert_eq!(
        err("GET /a#b HTTP/1.1\r\nHost: a\r\n\r\n"),
        ParseError::Malformed
    );
    assert_eq!(
        err("GET /%2 HTTP/1.1\r\nHost: a\r\n\r\n"),
        ParseError::Malformed
    );

    // Encoded dot-segments count as dot-segments (RFC 3986 §6.2.2.2); the query is
    // never touched.
    let req = "GET //a///b/%2e%2e/../c?x=/../ HTTP/1.1\r\nHost: a\r\n\r\n";
    assert_eq!(parse(req).unwrap().canonical_path, b"/c");
    let req = "GET /public/%2E%2e/%61dmin?%2e%2e HTTP/1.1\r\nHost: a\r\n\r\n";
    let head = parse(req).unwrap();
    assert_eq!(head.canonical_path, b"/admin");
    assert_eq!(head.query.map(|q| text(req, q)), Some("%2e%2e"));
    for target in ["/%2fadmin", "/a/%2F", "http://a.com/%5c"] {
        assert_eq!(
            err(&format!("GET {target} HTTP/1.1\r\nHost: a\r\n\r\n")),
            ParseError::EncodedSlash,
            "{target}"
        );
    }
    // A "%2F" in the query is data, not a separator.
    assert!(parse("GET /a?b=%2F HTTP/1.1\r\nHost: a\r\n\r\n").is_ok());
}

#[test]
fn expect() {
    let head =
        parse("PUT / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n")
            .unwrap();
    assert!(head.expect_continue);
    assert!(
        parse("PUT / HTTP/1.1\r\nHost: a\r\nExpect: 100-Continue\r\n\r\n")
            .unwrap()
            .expect_continue
    );
    assert_eq!(
        err("PUT / HTTP/1.1\r\nHost: a\r\nExpect: 200-ok\r\n\r\n"),
        ParseError::ExpectationFailed
    );
    assert_eq!(
        err("PUT / HTTP/1.1\r\nHost: a\r\nExpect:\r\n\r\n"),
        ParseError::ExpectationFailed
    );
    assert_eq!(
        err("PUT / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nExpect: x\r\n\r\n"),
        ParseError::ExpectationFailed
    );
    // RFC 9110 §10.1.1: ignored on HTTP/1.0.
    assert!(
        !parse("PUT / HTTP/1.0\r\nExpect: 100-continue\r\n\r\n")
            .unwrap()
            .expect_continue
    );
    assert!(
        !parse("PUT / HTTP/1.0\r\nExpect: other\r\n\r\n")
            .unwrap()
            .expect_continue
    );
}

#[test]
fn request_line_limit() {
    // max_request_line = 64: "GET " + target + " HTTP/1.1" is 13 + target bytes.
    let fits = format!("GET /{} HTTP/1.1\r\nHost: a\r\n\r\n", "a".repeat(50));
    assert!(parse(&fits).is_ok());
    let over = format!("GET /{} HTTP/1.1\r\nHost: a\r\n\r\n", "a".repeat(51));
    assert_eq!(err(&over), ParseError::UriTooLong);
    // Without any line end the refusal comes as soon as the line cannot fit.
    let parser = RequestParser::new(limits());
    let mut head = RequestHead::new(&limits());
    let endless = format!("GET /{}", "a".repeat(200));
    // 64 bytes of line and a CR may still be followed by the LF; 66 bytes cannot.
    assert_eq!(
        parser.parse(&endless.as_bytes()[..65], &mut head),
        Ok(Status::Partial)
    );
    assert_eq!(
        parser.parse(&endless.as_bytes()[..66], &mut head),
        Err(ParseError::UriTooLong)
    );
    // A syntax error inside the window wins.
    assert_eq!(
        err(&format!("G{{T /{}", "a".repeat(100))),
        ParseError::Malformed
    );
}

#[test]
fn header_byte_limit() {
    // max_header_bytes = 256.
    let base = "GET / HTTP/1.1\r\nHost: a\r\nX: \r\n\r\n";
    let fill = 256 - base.len();
    let fits = format!(
        "GET / HTTP/1.1\r\nHost: a\r\nX: {}\r\n\r\n",
        "v".repeat(fill)
    );
    assert_eq!(fits.len(), 256);
    assert!(parse(&fits).is_ok());
    let over = format!(
        "GET / HTTP/1.1\r\nHost: a\r\nX: {}\r\n\r\n",
        "v".repeat(fill + 1)
    );
    assert_eq!(err(&over), ParseError::HeadersTooLarge);
    // An endless field is refused once the buffer passes the limit.
    let endless = format!("GET / HTTP/1.1\r\nHost: a\r\nX: {}", "v".repeat(300));
    let parser = RequestParser::new(limits());
    let mut head = RequestHead::new(&limits());
    assert_eq!(
        parser.parse(&endless.as_bytes()[..256], &mut head),
        Ok(Status::Partial)
    );
    assert_eq!(
        parser.parse(&endless.as_bytes()[..257], &mut head),
        Err(ParseError::HeadersTooLarge)
    );
    // So are endless empty lines before the request line.
    assert_eq!(
        parse_with(limits(), &b"\r\n".repeat(200)),
        Err(ParseError::HeadersTooLarge)
    );
}

#[test]
fn header_count_limit() {
    // max_headers = 8: Host + 7 more fit, one more does not.
    let fields = |n: usize| (0..n).map(|i| format!("X-{i}: v\r\n")).collect::<String>();
    let fits = format!("GET / HTTP/1.1\r\nHost: a\r\n{}\r\n", fields(7));
    assert_eq!(parse(&fits).unwrap().headers.len(), 8);
    let over = format!("GET / HTTP/1.1\r\nHost: a\r\n{}\r\n", fields(8));
    assert_eq!(err(&over), ParseError::HeadersTooLarge);
}

#[test]
fn body_limit() {
    assert_eq!(
        parse("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1000\r\n\r\n")
            .unwrap()
            .body,
        BodyKind::Length(1000)
    );
    assert_eq!(
        err("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1001\r\n\r\n"),
        ParseError::BodyTooLarge
    );
    // A body that is too large wins over an unsupported expectation.
    assert_eq!(
        err("POST / HTTP/1.1\r\nHost: a\r\nExpect: x\r\nContent-Length: 1001\r\n\r\n"),
        ParseError::BodyTooLarge
    );
}

#[test]
fn head_is_reusable() {
    let parser = RequestParser::new(limits());
    let mut head = RequestHead::new(&limits());
    let a = b"GET /a HTTP/1.1\r\nHost: a\r\nX: 1\r\nY: 2\r\n\r\n";
    let b = b"GET /b HTTP/1.1\r\nHost: b\r\n\r\n";
    assert_eq!(parser.parse(a, &mut head), Ok(Status::Complete(())));
    assert_eq!(head.headers.len(), 3);
    assert_eq!(parser.parse(b, &mut head), Ok(Status::Complete(())));
    assert_eq!(head.headers.len(), 1);
    assert_eq!(head.canonical_path, b"/b");
}
