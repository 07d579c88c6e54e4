//! Response heads from origins (RFC 9112 §4, §6.3): parsing and body framing.

use std::mem::MaybeUninit;

use crate::error::ParseError;
use crate::fields::{Fields, Header, HeaderKind};
use crate::limits::MAX_HEADERS_CAP;
use crate::message::{Method, Version};
use crate::span::{Span, Status};

/// How a response body is delimited (RFC 9112 §6.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResponseBody {
    /// No body: a response to HEAD, or a 1xx, 204 or 304 (RFC 9112 §6.3 rules 1-2).
    None,
    /// Exactly this many bytes (rule 6).
    Length(u64),
    /// Chunked is the final transfer coding (rule 4); decode with [`crate::ChunkedDecoder`].
    Chunked,
    /// The body runs until the origin closes the connection (rules 4 and 8); the origin
    /// connection cannot be reused.
    CloseDelimited,
}

/// A parsed response head; spans are offsets into the buffer given to
/// [`ResponseParser::parse`]. After a `Partial` or an error the contents are unspecified.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResponseHead {
    /// The status code, 100..=599.
    pub status: u16,
    /// HTTP/1.0 or HTTP/1.1.
    pub version: Version,
    /// The reason phrase as sent (may be empty; may hold obs-text).
    pub reason: Span,
    /// Every field line in order.
    pub headers: Vec<Header>,
    /// Bytes of the head including the final CRLFCRLF.
    pub head_len: usize,
    /// How the body is delimited.
    pub body: ResponseBody,
    /// The agreed Content-Length value (several equal fields or list elements reduced to
    /// one, RFC 9112 §6.3 rule 5); kept for HEAD, 1xx, 204 and 304 answers too, whose body
    /// is `None` whatever it says.
    pub content_length: Option<u64>,
    /// Whether the origin connection may carry another request after this response.
    pub keep_alive: bool,
}

impl ResponseHead {
    /// An empty head with room for `max_headers` fields (clamped to [`MAX_HEADERS_CAP`]).
    pub fn new(max_headers: usize) -> Self {
        ResponseHead {
            status: 0,
            version: Version::Http11,
            reason: Span::default(),
            headers: Vec::with_capacity(max_headers.min(MAX_HEADERS_CAP)),
            head_len: 0,
            body: ResponseBody::None,
            content_length: None,
            keep_alive: false,
        }
    }
}

/// Parses response heads from origins. Any error means the proxy answers 502 and drops the
/// origin connection.
#[derive(Clone, Debug)]
pub struct ResponseParser {
    max_header_bytes: usize,
    max_headers: usize,
}

impl ResponseParser {
    /// A parser refusing heads over `max_header_bytes` or with more than `max_headers`
    /// fields (clamped to [`MAX_HEADERS_CAP`]).
    pub fn new(max_header_bytes: usize, max_headers: usize) -> Self {
        ResponseParser {
            max_header_bytes,
            max_headers: max_headers.min(MAX_HEADERS_CAP),
        }
    }

    /// Parses a response head at the start of `buf`, sent in answer to a `request_method`
    /// request. `Partial` while incomplete and within `max_header_bytes`.
    ///
    /// Framing follows RFC 9112 §6.3 for responses, except that Content-Length together with
    /// Transfer-Encoding is refused (BadFraming) rather than resolved in favour of
    /// Transfer-Encoding: an origin that sends both is confused or compromised, and whatever
    /// sits behind zgix must not decide for it.
    ///
    /// Unlike requests, a bare LF line terminator is accepted (RFC 9112 §2.2 allows it):
    /// origins are configured by the operator, and some legacy ones still send it.
    pub fn parse(
        &self,
        buf: &[u8],
        request_method: Method,
        head: &mut ResponseHead,
    ) -> Result<Status<()>, ParseError> {
        let window = buf.len().min(self.max_header_bytes);
        let mut slots = [const { MaybeUninit::<httparse::Header>::uninit() }; MAX_HEADERS_CAP];
        let mut resp = httparse::Response::new(&mut []);
        let parsed = httparse::ParserConfig::default().parse_response_with_uninit_headers(
            &mut resp,
            &buf[..window],
            &mut slots[..self.max_headers],
        );
        let head_len = match parsed {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) if buf.len() > self.max_header_bytes => {
                return Err(ParseError::HeadersTooLarge)
            }
            Ok(httparse::Status::Partial) => return Ok(Status::Partial),
            Err(httparse::Error::TooManyHeaders) => return Err(ParseError::HeadersTooLarge),
            // A version other than 1.0/1.1, a bad status line, obs-fold (RFC 9112 §5.2: a
            // proxy MUST either reject it or replace it; zgix rejects), whitespace before a
            // colon (§5.1: a proxy MUST remove it or reject; zgix rejects), bare CR, NUL.
            Err(_) => return Err(ParseError::Malformed),
        };
        let status = resp.code.unwrap_or(0);
        // RFC 9110 §15: status codes are 100 through 599.
        if !(100..=599).contains(&status) {
            return Err(ParseError::Malformed);
        }
        head.status = status;
        head.version = Version::from_minor(resp.version.unwrap_or(1));
        head.head_len = head_len;
        head.reason = reason_span(&buf[..head_len]);

        head.headers.clear();
        for h in resp.headers.iter() {
            head.headers.push(Header {
                name: Span::of(buf, h.name.as_bytes()),
                value: Span::of(buf, h.value),
                kind: HeaderKind::of(h.name.as_bytes()),
            });
        }
        let fields = Fields::scan(buf, &mut head.headers);
        head.body = body(&fields, head.version, status, request_method)?;
        head.content_length = fields.content_length;
        // RFC 9112 §9.3: persistence from the version and the "close" / "keep-alive"
        // options. A close-delimited body ends the connection whatever they say (§9.6).
        head.keep_alive = head.body != ResponseBody::CloseDelimited
            && !fields.conn_close
            && (head.version == Version::Http11 || fields.conn_keep_alive);
        Ok(Status::Complete(()))
    }
}

/// Response framing, RFC 9112 §6.3 in order, after refusing ambiguous framing outright.
fn body(
    fields: &Fields,
    version: Version,
    status: u16,
    request_method: Method,
) -> Result<ResponseBody, ParseError> {
    // §6.3 rule 5: an invalid Content-Length in a response is an unrecoverable error; "a
    // proxy MUST close the connection to the server, discard the received response, and send
    // a 502". Both fields at once, or chunked twice (§6.1), is refused the same way even when
    // the status says there is no body, since the head itself is forwarded.
    if fields.content_length_invalid
        || (fields.te_present && fields.content_length.is_some())
        || fields.te_chunked_twice
        || fields.te_invalid
    {
        return Err(ParseError::BadFraming);
    }
    // §6.1: Transfer-Encoding in an HTTP/1.0 message means the framing is faulty.
    if fields.te_present && version == Version::Http10 {
        return Err(ParseError::BadFraming);
    }
    // §6.3 rule 1: a response to HEAD, and any 1xx, 204 or 304, ends with its head.
    if request_method == Method::Head
        || (100..200).contains(&status)
        || status == 204
        || status == 304
    {
        return Ok(ResponseBody::None);
    }
    if fields.te_present {
        // §6.3 rule 4: chunked final means chunked; any other final coding means the body
        // runs until the connection closes.
        return Ok(if fields.te_final_chunked {
            ResponseBody::Chunked
        } else {
            ResponseBody::CloseDelimited
        });
    }
    Ok(match fields.content_length {
        // §6.3 rule 6.
        Some(n) => ResponseBody::Length(n),
        // §6.3 rule 8: no length, so the body is everything until close.
        None => ResponseBody::CloseDelimited,
    })
}

/// The reason phrase of the status line at the start of `head` (after any empty lines).
/// httparse replaces a phrase with obs-text by "", so it is located here instead:
/// `HTTP/1.x SP 3DIGIT [ SP reason ] CRLF`, validated by httparse already.
fn reason_span(head: &[u8]) -> Span {
    let start = head
        .iter()
        .take_while(|&&b| b == b'\r' || b == b'\n')
        .count();
    let lf = start + memchr::memchr(b'\n', &head[start..]).unwrap_or(0);
    let end = if head[lf - 1] == b'\r' { lf - 1 } else { lf };
    // "HTTP/1.1 200" is 12 bytes; a reason starts after one more space.
    let reason_start = (start + 13).min(end);
    Span::at(reason_start, end - reason_start)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parses `input` whole and as every prefix (see the request parser tests).
    fn parse_with(
        max_bytes: usize,
        max_headers: usize,
        method: Method,
        input: &[u8],
    ) -> Result<ResponseHead, ParseError> {
        let parser = ResponseParser::new(max_bytes, max_headers);
        let mut whole = ResponseHead::new(max_headers);
        let result = parser.parse(input, method, &mut whole);
        let mut decided = false;
        for k in 0..=input.len() {
            let mut head = ResponseHead::new(max_headers);
            match parser.parse(&input[..k], method, &mut head) {
                Ok(Status::Partial) => assert!(!decided, "Partial after a decided prefix at {k}"),
                other => {
                    decided = true;
                    assert_eq!(other, result, "prefix {k}");
                    if result.is_ok() {
                        assert_eq!(head, whole, "prefix {k}");
                    }
                }
            }
        }
        match result {
            Ok(Status::Complete(())) => Ok(whole),
            Ok(Status::Partial) => panic!("whole input is Partial"),
            Err(e) => Err(e),
        }
    }

    fn parse_for(method: Method, input: &str) -> Result<ResponseHead, ParseError> {
        parse_with(512, 16, method, input.as_bytes())
    }

    fn parse(input: &str) -> Result<ResponseHead, ParseError> {
        parse_for(Method::Get, input)
    }

    fn frame(input: &str) -> (ResponseBody, bool) {
        let head = parse(input).unwrap();
        (head.body, head.keep_alive)
    }

    #[test]
    fn content_length_response() {
        let resp = "HTTP/1.1 200 OK\r\nContent-Length: 12\r\nX: y\r\n\r\nhello world!";
        let head = parse(resp).unwrap();
        assert_eq!(head.status, 200);
        assert_eq!(head.version, Version::Http11);
        assert_eq!(head.reason.get(resp.as_bytes()), b"OK");
        assert_eq!(head.body, ResponseBody::Length(12));
        assert!(head.keep_alive);
        assert_eq!(head.head_len, resp.len() - 12);
        assert_eq!(head.headers.len(), 2);
        assert_eq!(head.headers[0].kind, HeaderKind::ContentLength);
    }

    #[test]
    fn reason_phrases() {
        let resp = "HTTP/1.1 404 Not Found Here\r\nContent-Length: 0\r\n\r\n";
        assert_eq!(
            parse(resp).unwrap().reason.get(resp.as_bytes()),
            b"Not Found Here"
        );
        let resp = "HTTP/1.1 204\r\n\r\n";
        assert!(parse(resp).unwrap().reason.is_empty());
        let resp = "HTTP/1.1 200 \r\nContent-Length: 0\r\n\r\n";
        assert!(parse(resp).unwrap().reason.is_empty());
        let resp = "HTTP/1.1 200 caf\u{e9}\r\nContent-Length: 0\r\n\r\n";
        assert_eq!(
            parse(resp).unwrap().reason.get(resp.as_bytes()),
            "caf\u{e9}".as_bytes()
        );
    }

    #[test]
    fn no_body_statuses() {
        // RFC 9112 §6.3 rule 1.
        for status in [
            "100 Continue",
            "101 Switching Protocols",
            "103 Early Hints",
            "204 No Content",
            "304 Not Modified",
        ] {
            let resp = format!("HTTP/1.1 {status}\r\nContent-Length: 10\r\n\r\n");
            assert_eq!(frame(&resp), (ResponseBody::None, true), "{status}");
        }
        let head = parse_for(
            Method::Head,
            "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n",
        )
        .unwrap();
        assert_eq!(head.body, ResponseBody::None);
        let head = parse_for(
            Method::Head,
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
        )
        .unwrap();
        assert_eq!(head.body, ResponseBody::None);
        assert!(head.keep_alive);
    }

    #[test]
    fn chunked_and_close_delimited() {
        assert_eq!(
            frame("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"),
            (ResponseBody::Chunked, true)
        );
        assert_eq!(
            frame("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"),
            (ResponseBody::Chunked, true)
        );
        // §6.3 rule 4: final coding not chunked: read until close.
        assert_eq!(
            frame("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n"),
            (ResponseBody::CloseDelimited, false)
        );
        assert_eq!(
            frame("HTTP/1.1 200 OK\r\nTransfer-Encoding: foo\r\n\r\n"),
            (ResponseBody::CloseDelimited, false)
        );
        // §6.3 rule 8.
        assert_eq!(
            frame("HTTP/1.1 200 OK\r\n\r\n"),
            (ResponseBody::CloseDelimited, false)
        );
        assert_eq!(
            frame("HTTP/1.0 200 OK\r\n\r\n"),
            (ResponseBody::CloseDelimited, false)
        );
    }

    #[test]
    fn keep_alive() {
        assert_eq!(
            frame("HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"),
            (ResponseBody::Length(0), false)
        );
        assert_eq!(
            frame("HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\n"),
            (ResponseBody::Length(1), false)
        );
        assert_eq!(
            frame("HTTP/1.0 200 OK\r\nContent-Length: 1\r\nConnection: keep-alive\r\n\r\n"),
            (ResponseBody::Length(1), true)
        );
        let resp = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: x-hop\r\nX-Hop: 1\r\n\r\n";
        let head = parse(resp).unwrap();
        assert_eq!(head.headers[2].kind, HeaderKind::HopByHop);
    }

    #[test]
    fn bad_framing() {
        for resp in [
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 5x\r\n\r\n",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, chunked\r\n\r\n",
            "HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
            "HTTP/1.1 304 Not Modified\r\nContent-Length: 5, 6\r\n\r\n",
        ] {
            assert_eq!(parse(resp).unwrap_err(), ParseError::BadFraming, "{resp:?}");
        }
        let head = parse("HTTP/1.1 200 OK\r\nContent-Length: 7, 7\r\n\r\n").unwrap();
        assert_eq!(head.body, ResponseBody::Length(7));
    }

    #[test]
    fn malformed() {
        for resp in [
            "HTTP/2.0 200 OK\r\n\r\n",
            "HTTP/1.1 20 OK\r\n\r\n",
            "HTTP/1.1 099 Low\r\n\r\n",
            "HTTP/1.1 600 High\r\n\r\n",
            "HTTP/1.1 200 OK\r\nX: a\r\n b\r\n\r\n",
            "HTTP/1.1 200 OK\r\nX : a\r\n\r\n",
            "HTTP/1.1 200 OK\r\nX: a\rb\r\n\r\n",
            "HTTP/1.1 200 OK\r\nX: a\0b\r\n\r\n",
            "HTTP/1.1  200 OK\r\n\r\n",
            "ICY 200 OK\r\n\r\n",
        ] {
            assert_eq!(parse(resp).unwrap_err(), ParseError::Malformed, "{resp:?}");
        }
        // Bare LF is tolerated from origins (RFC 9112 §2.2).
        let head = parse("HTTP/1.1 200 OK\nContent-Length: 0\n\n").unwrap();
        assert_eq!(head.body, ResponseBody::Length(0));
    }

    #[test]
    fn limits() {
        let resp = format!("HTTP/1.1 200 OK\r\nX: {}\r\n\r\n", "v".repeat(100));
        assert!(parse_with(resp.len(), 4, Method::Get, resp.as_bytes()).is_ok());
        assert_eq!(
            parse_with(resp.len() - 1, 4, Method::Get, resp.as_bytes()).unwrap_err(),
            ParseError::HeadersTooLarge
        );
        let resp = "HTTP/1.1 200 OK\r\nA: 1\r\nB: 2\r\nC: 3\r\n\r\n";
        assert!(parse_with(512, 3, Method::Get, resp.as_bytes()).is_ok());
        assert_eq!(
            parse_with(512, 2, Method::Get, resp.as_bytes()).unwrap_err(),
            ParseError::HeadersTooLarge
        );
    }

    #[test]
    fn interim_then_final() {
        let buf =
            "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok";
        let first = parse(buf).unwrap();
        assert_eq!((first.status, first.body), (100, ResponseBody::None));
        let rest = &buf[first.head_len..];
        let second = parse(rest).unwrap();
        assert_eq!((second.status, second.body), (201, ResponseBody::Length(2)));
    }
}
