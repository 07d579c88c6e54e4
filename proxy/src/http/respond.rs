//! Responses zgix writes itself (refusals and gateway errors), and the mapping from parser errors to statuses.

use std::io::Write as _;
use std::sync::OnceLock;

use zgix_parser::ParseError;

/// The status a request-parsing error is answered with. RFC 9112 §2.2 and §6.3
/// make framing faults 400; RFC 9110 §15 gives the rest their own codes.
pub fn status_for(e: ParseError) -> u16 {
    match e {
        ParseError::Malformed
        | ParseError::BadFraming
        | ParseError::BadHost
        | ParseError::BadChunk
        | ParseError::EncodedSlash => 400,
        ParseError::UnknownCoding => 501,
        ParseError::UriTooLong => 414,
        ParseError::HeadersTooLarge => 431,
        ParseError::BodyTooLarge => 413,
        ParseError::UnsupportedVersion => 505,
        ParseError::ExpectationFailed => 417,
    }
}

/// Reason phrase (RFC 9110 §15) for the statuses zgix generates.
pub fn reason(status: u16) -> &'static str {
    known_reason(status).unwrap_or(match status {
        // RFC 9110 §15: a client must understand any status by its class; the
        // reason phrase is informational.
        100..=199 => "Informational",
        200..=299 => "Success",
        300..=399 => "Redirection",
        400..=499 => "Client Error",
        _ => "Server Error",
    })
}

fn known_reason(status: u16) -> Option<&'static str> {
    Some(match status {
        100 => "Continue",
        101 => "Switching Protocols",
        103 => "Early Hints",
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        203 => "Non-Authoritative Information",
        204 => "No Content",
        205 => "Reset Content",
        206 => "Partial Content",
        300 => "Multiple Choices",
        301 => "Moved Permanently",
        302 => "Found",
        303 => "See Other",
        304 => "Not Modified",
        307 => "Temporary Redirect",
        308 => "Permanent Redirect",
        400 => "Bad Request",
        401 => "Unauthorized",
        402 => "Payment Required",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        406 => "Not Acceptable",
        407 => "Proxy Authentication Required",
        408 => "Request Timeout",
        409 => "Conflict",
        410 => "Gone",
        411 => "Length Required",
        412 => "Precondition Failed",
        413 => "Content Too Large",
        414 => "URI Too Long",
        415 => "Unsupported Media Type",
        416 => "Range Not Satisfiable",
        417 => "Expectation Failed",
        421 => "Misdirected Request",
        422 => "Unprocessable Content",
        425 => "Too Early",
        426 => "Upgrade Required",
        428 => "Precondition Required",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        451 => "Unavailable For Legal Reasons",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        506 => "Variant Also Negotiates",
        507 => "Insufficient Storage",
        508 => "Loop Detected",
        511 => "Network Authentication Required",
        _ => return None,
    })
}

static SERVER: OnceLock<Option<Box<[u8]>>> = OnceLock::new();

/// Sets the `Server` value (`server_header`; `None` for none) once at start-up.
/// Unset, zgix sends [`zgix_config::DEFAULT_SERVER_HEADER`].
pub fn set_server_header(value: Option<&str>) {
    let _ = SERVER.set(value.map(|v| v.as_bytes().into()));
}

fn server_header() -> Option<&'static [u8]> {
    SERVER
        .get_or_init(|| Some(zgix_config::DEFAULT_SERVER_HEADER.as_bytes().into()))
        .as_deref()
}

/// Appends `date` (RFC 9110 §6.6.1: an origin with a clock must send it; zgix
/// is the origin of what it writes itself) from this shard's once-a-second
/// cache, and `server` (§10.2.4) unless turned off. `skip_date` /
/// `skip_server` leave out a field the response already carries.
pub fn write_stamp(out: &mut Vec<u8>, skip_date: bool, skip_server: bool) {
    if !skip_date {
        out.extend_from_slice(b"date: ");
        out.extend_from_slice(&crate::observe::clock::shard_date());
        out.extend_from_slice(b"\r\n");
    }
    if let (false, Some(s)) = (skip_server, server_header()) {
        out.extend_from_slice(b"server: ");
        out.extend_from_slice(s);
        out.extend_from_slice(b"\r\n");
    }
}

/// `x-request-id: <id>` in an answer zgix writes itself, so a client can quote
/// the ID the logs carry; nothing for an empty `id` (`request_id: false`, or a
/// refusal before the head was read).
pub fn write_request_id(out: &mut Vec<u8>, id: &[u8]) {
    if !id.is_empty() {
        out.extend_from_slice(b"x-request-id: ");
        out.extend_from_slice(id);
        out.extend_from_slice(b"\r\n");
    }
}

/// Writes a complete `connection: close` refusal into `out` (cleared first).
/// The body is the reason phrase and a newline. `retry_after` adds that header
/// (429); `id` the request's ID. `out` has capacity for this, so nothing is
/// allocated.
pub fn write_refusal(out: &mut Vec<u8>, status: u16, retry_after: Option<u64>, id: &[u8]) {
    out.clear();
    let r = reason(status);
    let _ = write!(out, "HTTP/1.1 {status} {r}\r\n");
    write_stamp(out, false, false);
    write_request_id(out, id);
    let _ = write!(
        out,
        "content-type: text/plain\r\ncontent-length: {}\r\n",
        r.len() + 1
    );
    if let Some(secs) = retry_after {
        let _ = write!(out, "retry-after: {secs}\r\n");
    }
    let _ = write!(out, "connection: close\r\n\r\n{r}\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `out` without its `date` line, after checking the line is an IMF-fixdate.
    pub(crate) fn undated(out: &[u8]) -> Vec<u8> {
        let text = std::str::from_utf8(out).unwrap();
        let at = text.find("\r\ndate: ").expect("a date field") + 2;
        let end = at + text[at..].find("\r\n").unwrap() + 2;
        let date = &text[at + 6..end - 2];
        assert_eq!(date.len(), 29, "{date:?}");
        assert!(
            date.ends_with(" GMT") && date.as_bytes()[3] == b',',
            "{date:?}"
        );
        [&out[..at], &out[end..]].concat()
    }

    #[test]
    fn refusal_bytes_are_exact() {
        let mut out = Vec::with_capacity(256);
        write_refusal(&mut out, 400, None, b"");
        let out = undated(&out);
        assert_eq!(
            out,
            b"HTTP/1.1 400 Bad Request\r\nserver: zgix\r\ncontent-type: text/plain\r\ncontent-length: 12\r\nconnection: close\r\n\r\nBad Request\n"
        );
        let mut out = Vec::with_capacity(256);
        write_refusal(&mut out, 429, Some(3), b"4bf92f3577b34da6a3ce929d0e0e4736");
        assert!(out.capacity() == 256, "no growth");
        assert_eq!(
            undated(&out),
            &b"HTTP/1.1 429 Too Many Requests\r\nserver: zgix\r\nx-request-id: 4bf92f3577b34da6a3ce929d0e0e4736\r\ncontent-type: text/plain\r\ncontent-length: 18\r\nretry-after: 3\r\nconnection: close\r\n\r\nToo Many Requests\n"[..]
        );
    }

    #[test]
    fn every_parse_error_maps_to_a_client_or_gateway_status() {
        for e in ParseError::ALL {
            let s = status_for(e);
            assert!((400..=505).contains(&s), "{e:?} -> {s}");
            assert!(
                !reason(s).ends_with("Error") || s == 500,
                "{s} has no specific reason phrase"
            );
        }
    }
}
