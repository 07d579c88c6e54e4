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
        head.headers.clear();
        for h in req.headers.iter() {
            head.headers.push(Header {
                name: Span::of(buf, h.name.as_bytes()),
                value: Span::of(buf, h.value),
                kind: HeaderKind::of(h.name.as_bytes()),
            });
        }
        self.complete(buf, head, line_end)?;
        Ok(Status::Complete(()))
    }

    /// What follows tokenising (`parse`'s httparse pass, or `assemble`'s span
    /// checks), in one order for both: the request-target's form, the fields'
    /// rules, framing, Expect, persistence and the canonical path. `head`'s
    /// method, version, target, head length and field spans are set;
    /// `line_end` is where the request line's CRLF starts.
    fn complete(
        &self,
        buf: &[u8],
        head: &mut RequestHead,
        line_end: usize,
    ) -> Result<(), ParseError> {
        // The line ends in "HTTP/1.x", whose "/" stands in for an empty absolute-form path.
        let target = parse_target(buf, head.target, head.method, line_end - 4)?;
        head.path = target.path;
        head.query = target.query;
        head.authority = target.authority;

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
        Ok(())
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

mod assemble;
#[cfg(test)]
mod tests;
