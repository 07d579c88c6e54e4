//! Request heads (RFC 9112 §2-§3, §6): parsing, validation and body framing.

use std::mem::MaybeUninit;

use crate::error::ParseError;
use crate::fields::{Fields, Header, HeaderKind};
use crate::limits::{Limits, MAX_HEADERS_CAP};
use crate::message::{Method, Version};
use crate::path::canonicalize_path;
use crate::span::{Span, Status};
use crate::syntax::valid_host_port;
use crate::target::parse_target;

/// How the request body is delimited (RFC 9112 §6.3).
///
/// An explicit `Content-Length: 0` stays `Length(0)` (not normalised to `None`), so the proxy
/// can forward the field: some origins answer 411 to a POST without one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyKind {
    /// No Content-Length and no Transfer-Encoding: no body (RFC 9112 §6.3 rule 7).
    None,
    /// Exactly this many bytes follow the head (RFC 9112 §6.3 rule 6).
    Length(u64),
    /// Chunked transfer coding is final (RFC 9112 §6.3 rule 4); decode with
    /// [`crate::ChunkedDecoder`].
    Chunked,
}

/// A parsed request head. All spans are offsets into the buffer given to
/// [`RequestParser::parse`]; after a `Partial` or an error the contents are unspecified.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestHead {
    /// The method.
    pub method: Method,
    /// The method token as sent.
    pub method_span: Span,
    /// HTTP/1.0 or HTTP/1.1.
    pub version: Version,
    /// The raw request-target.
    pub target: Span,
    /// Raw path: of the origin-form target, or of the absolute-form one ("/" when it is empty,
    /// as a span over the "/" of "HTTP/1.x"), or "*" for asterisk-form.
    pub path: Span,
    /// Raw query without the "?"; `Some` of an empty span for a trailing "?".
    pub query: Option<Span>,
    /// `host[:port]` of an absolute-form target.
    pub authority: Option<Span>,
    /// The Host field value, OWS-trimmed; `None` only on HTTP/1.0 without Host.
    pub host: Option<Span>,
    /// Every field line in order, cleared and refilled per parse.
    pub headers: Vec<Header>,
    /// Bytes of the head, leading empty lines and the final CRLFCRLF included: the body (or
    /// the next pipelined request) starts at `buf[head_len..]`.
    pub head_len: usize,
    /// How the body is delimited.
    pub body: BodyKind,
    /// The one value every Content-Length field and list element agreed on (RFC 9112 §6.3
    /// rule 5 lets `Content-Length: 5, 5` and two `Content-Length: 5` fields through only if
    /// the recipient replaces them with this single value: the proxy forwards one field).
    pub content_length: Option<u64>,
    /// Whether the connection may carry another request after this one (RFC 9112 §9.3).
    pub keep_alive: bool,
    /// HTTP/1.1 `Expect: 100-continue` (RFC 9110 §10.1.1).
    pub expect_continue: bool,
    /// The canonical path: see [`canonicalize_path`]; "*" for asterisk-form.
    pub canonical_path: Vec<u8>,
}

impl RequestHead {
    /// An empty head whose vectors are sized for `limits`, so parsing never grows them.
    pub fn new(limits: &Limits) -> Self {
        RequestHead {
            method: Method::Get,
            method_span: Span::default(),
            version: Version::Http11,
            target: Span::default(),
            path: Span::default(),
            query: None,
            authority: None,
            host: None,
            headers: Vec::with_capacity(limits.header_slots()),
            head_len: 0,
            body: BodyKind::None,
            content_length: None,
            keep_alive: false,
            expect_continue: false,
            // A canonical path is at most one byte longer than the raw path, which fits in
            // the request line.
            canonical_path: Vec::with_capacity(limits.max_request_line + 1),
        }
    }
}

/// Parses request heads against fixed [`Limits`].
#[derive(Clone, Debug)]
pub struct RequestParser {
    limits: Limits,
}

impl RequestParser {
    /// A parser enforcing `limits`.
    pub fn new(limits: Limits) -> Self {
        RequestParser { limits }
    }

    /// The limits this parser enforces.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Parses a request head at the start of `buf` into `head`.
    ///
    /// Returns `Partial` while the head is incomplete and within limits. Call again with the
    /// same buffer extended; the outcome depends only on the bytes, and feeding a message in
    /// growing prefixes gives `Partial` until the first prefix that decides, then always that
    /// same result.
    ///
    /// Limits are enforced on the bytes as they arrive: no LF within
    /// `max_request_line + 2` bytes (line plus CRLF) of the request line start is 414 at once,
    /// more than `max_header_bytes` without a complete head is 431. Syntax errors inside those
    /// windows win over the limit; bytes past them are never looked at.
    pub fn parse(&self, buf: &[u8], head: &mut RequestHead) -> Result<Status<()>, ParseError> {
        let limits = &self.limits;
        let window = buf.len().min(limits.max_header_bytes);
        // RFC 9112 §2.2: a server SHOULD ignore at least one empty line before the request
        // line; httparse skips any number, bounded here by max_header_bytes.
        let line_start = buf[..window]
            .iter()
            .take_while(|&&b| b == b'\r' || b == b'\n')
            .count();
        let line_cap = line_start.saturating_add(limits.max_request_line.saturating_add(2));
        let line_overflow =
            window >= line_cap && memchr::memchr(b'\n', &buf[line_start..line_cap]).is_none();
        let cap = if line_overflow { line_cap } else { window };

        let mut slots = [const { MaybeUninit::<httparse::Header>::uninit() }; MAX_HEADERS_CAP];
        let mut req = httparse::Request::new(&mut []);
        let parsed =
            req.parse_with_uninit_headers(&buf[..cap], &mut slots[..limits.header_slots()]);
        let head_len = match parsed {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) if line_overflow => return Err(ParseError::UriTooLong),
            Ok(httparse::Status::Partial) if buf.len() > limits.max_header_bytes => {
                return Err(ParseError::HeadersTooLarge)
            }
            Ok(httparse::Status::Partial) => return Ok(Status::Partial),
            Err(httparse::Error::TooManyHeaders) => return Err(ParseError::HeadersTooLarge),
            Err(httparse::Error::Version) => {
                return Err(version_error(&buf[line_start..cap]));
            }
            // Bad method token, target bytes, spacing, field name (obs-fold, whitespace before
            // the colon: RFC 9112 §5.1, §5.2), field value (NUL, bare CR: RFC 9112 §2.2, RFC
            // 9110 §5.5) or line ending.
            Err(_) => return Err(ParseError::Malformed),
        };

        // The request line ends at the first LF (httparse guarantees one), CR excluded.
        let lf = line_start + memchr::memchr(b'\n', &buf[line_start..head_len]).unwrap_or(0);
        let line_end = if buf[lf - 1] == b'\r' { lf - 1 } else { lf };
        if line_end - line_start > limits.max_request_line {
            return Err(ParseError::UriTooLong);
        }
        // RFC 9112 §2.2 lets a recipient accept a bare LF as a line terminator, but a proxy
        // and an origin that disagree on line ends disagree on where fields (and so the
        // framing) are; refuse it. httparse already refuses a CR not followed by LF.
        if memchr::memchr_iter(b'\n', &buf[..head_len]).any(|i| i == 0 || buf[i - 1] != b'\r') {
            return Err(ParseError::Malformed);
        }

        let method_bytes = req.method.unwrap_or_default().as_bytes();
        head.method = Method::from_bytes(method_bytes);
        head.method_span = Span::of(buf, method_bytes);
        head.version = Version::from_minor(req.version.unwrap_or(1));
        head.target = Span::of(buf, req.path.unwrap_or_default().as_bytes());
        head.head_len = head_len;
        // The line ends in "HTTP/1.x", whose "/" stands in for an empty absolute-form path.
        let target = parse_target(buf, head.target, head.method, line_end - 4)?;
        head.path = target.path;
        head.query = target.query;
        head.authority = target.authority;

        head.headers.clear();
        for h in req.headers.iter() {
            head.headers.push(Header {
                name: Span::of(buf, h.name.as_bytes()),
                value: Span::of(buf, h.value),
                kind: HeaderKind::of(h.name.as_bytes()),
            });
        }
        let fields = Fields::scan(buf, &mut head.headers);

        // RFC 9112 §3.2: "A server MUST respond with a 400 (Bad Request) status code to any
        // HTTP/1.1 request message that lacks a Host header field and to any request message
        // that contains more than one Host header field line or a Host header field with an
        // invalid field value." Host = uri-host [ ":" port ] (RFC 9110 §7.2).
        if fields.host_count > 1
            || (fields.host_count == 0 && head.version == Version::Http11)
            || fields.host.is_some_and(|h| !valid_host_port(h.get(buf)))
        {
            return Err(ParseError::BadHost);
        }
        head.host = fields.host;
        // Connection = #connection-option, each a token (RFC 9110 §7.6.1).
        if fields.conn_invalid {
            return Err(ParseError::Malformed);
        }
        head.body = self.body(&fields, head.version)?;
        head.content_length = fields.content_length;
        // RFC 9110 §10.1.1: "A server that receives a 100-continue expectation in an HTTP/1.0
        // request MUST ignore that expectation"; zgix ignores every expectation on 1.0. On
        // 1.1, "A server that receives an Expect field value containing a member other than
        // 100-continue MAY respond with a 417"; zgix does, as it cannot honour one.
        head.expect_continue = false;
        if fields.expect_present && head.version == Version::Http11 {
            if !fields.expect_all_continue {
                return Err(ParseError::ExpectationFailed);
            }
            head.expect_continue = true;
        }
        // RFC 9112 §9.3: HTTP/1.1 is persistent unless "close" is a connection option; an
        // HTTP/1.0 connection persists only with "keep-alive" (and no "close").
        head.keep_alive =
            !fields.conn_close && (head.version == Version::Http11 || fields.conn_keep_alive);

        if target.asterisk {
            head.canonical_path.clear();
            head.canonical_path.push(b'*');
        } else {
            canonicalize_path(head.path.get(buf), &mut head.canonical_path)?;
        }
        Ok(Status::Complete(()))
    }

    /// Request body framing, RFC 9112 §6.3 rules 3-7, strictest reading throughout.
    fn body(&self, fields: &Fields, version: Version) -> Result<BodyKind, ParseError> {
        if fields.te_present {
            // RFC 9112 §6.1: "A server or client that receives an HTTP/1.0 message containing
            // a Transfer-Encoding header field MUST treat the message as if the framing is
            // faulty". For a request that means 400.
            if version == Version::Http10 {
                return Err(ParseError::BadFraming);
            }
            // RFC 9112 §6.3 rule 3: Transfer-Encoding with Content-Length "ought to be handled
            // as an error"; a server MAY reject it. Both present is the classic smuggling
            // setup, so always 400 (also when the Content-Length is itself invalid).
            if fields.content_length.is_some() || fields.content_length_invalid {
                return Err(ParseError::BadFraming);
            }
            if fields.te_invalid {
                return Err(ParseError::BadFraming);
            }
            // RFC 9112 §6.1: "A server that receives a request message with a transfer coding
            // it does not understand SHOULD respond with 501 (Not Implemented)."
            if fields.te_unknown {
                return Err(ParseError::UnknownCoding);
            }
            // RFC 9112 §6.1: "A sender MUST NOT apply the chunked transfer coding more than
            // once to a message body".
            if fields.te_chunked_twice {
                return Err(ParseError::BadFraming);
            }
            // RFC 9112 §6.3 rule 4: a request whose final coding is not chunked has no
            // reliable length; "the server MUST respond with the 400 (Bad Request) status
            // code and then close the connection".
            if !fields.te_final_chunked {
                return Err(ParseError::BadFraming);
            }
            return Ok(BodyKind::Chunked);
        }
        // RFC 9112 §6.3 rule 5: an invalid Content-Length (several differing values, or not
        // 1*DIGIT) is unrecoverable: "the server MUST respond with a 400".
        if fields.content_length_invalid {
            return Err(ParseError::BadFraming);
        }
        match fields.content_length {
            Some(n) if n > self.limits.max_body => Err(ParseError::BodyTooLarge),
            // RFC 9112 §6.3 rule 6.
            Some(n) => Ok(BodyKind::Length(n)),
            // RFC 9112 §6.3 rule 7: a request with neither has no body.
            None => Ok(BodyKind::None),
        }
    }
}

/// httparse refuses every version but HTTP/1.0 and HTTP/1.1. A well-formed HTTP-version
/// (`"HTTP/" DIGIT "." DIGIT`, RFC 9112 §2.3) is 505; anything else (wrong case, garbage, an
/// extra space in the line) is 400. The decision looks only at the third field's "HTTP/" and
/// first digit, which httparse has seen when it refuses, so a byte-by-byte feed decides the
/// same way as a whole one.
fn version_error(request_line: &[u8]) -> ParseError {
    let line = match memchr::memchr(b'\n', request_line) {
        Some(lf) => &request_line[..lf],
        None => request_line,
    };
    // request-line = method SP request-target SP HTTP-version (RFC 9112 §3).
    let version = line.split(|&b| b == b' ').nth(2).unwrap_or_default();
    match version {
        [b'H', b'T', b'T', b'P', b'/', d, ..] if d.is_ascii_digit() => {
            ParseError::UnsupportedVersion
        }
        _ => ParseError::Malformed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
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
}
