//! The parse error enum: a small `Copy` enum the proxy maps to HTTP statuses (see `proxy/src/respond.rs`).

/// Why a message head or body was refused. The comment on each variant is the status the
/// proxy answers to a client (a bad response from an origin is a 502 whatever the variant).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ParseError {
    /// 400: generic syntax error: bad request line, bad field name or value, obs-fold,
    /// whitespace before a colon, bare CR or LF, NUL, bad request-target.
    Malformed,
    /// 400: ambiguous or invalid message framing: Content-Length with Transfer-Encoding,
    /// differing or non-numeric Content-Length values, a request whose final transfer coding
    /// is not chunked, chunked applied twice, Transfer-Encoding on HTTP/1.0.
    BadFraming,
    /// 501: a transfer coding zgix does not know (RFC 9112 §6.1).
    UnknownCoding,
    /// 400: HTTP/1.1 without Host, several Host fields, or an invalid Host value
    /// (RFC 9112 §3.2).
    BadHost,
    /// 400: bad chunked framing: chunk-size, missing CRLF after data, oversized or malformed
    /// chunk line or trailer (RFC 9112 §7.1).
    BadChunk,
    /// 414: the request line is longer than [`crate::Limits::max_request_line`].
    UriTooLong,
    /// 431: the head is longer than [`crate::Limits::max_header_bytes`] or has more than
    /// [`crate::Limits::max_headers`] fields.
    HeadersTooLarge,
    /// 413: the declared or chunked body is larger than [`crate::Limits::max_body`].
    BodyTooLarge,
    /// 505: an HTTP version other than 1.0 and 1.1.
    UnsupportedVersion,
    /// 417: an HTTP/1.1 Expect field other than `100-continue` (RFC 9110 §10.1.1).
    ExpectationFailed,
    /// 400: an encoded `/` or `\` (`%2F`, `%5C`) in the path: see [`crate::canonicalize_path`].
    EncodedSlash,
}

impl ParseError {
    /// Every variant, for exhaustive checks (the status mapping's tests).
    pub const ALL: [ParseError; 11] = [
        ParseError::Malformed,
        ParseError::BadFraming,
        ParseError::UnknownCoding,
        ParseError::BadHost,
        ParseError::BadChunk,
        ParseError::UriTooLong,
        ParseError::HeadersTooLarge,
        ParseError::BodyTooLarge,
        ParseError::UnsupportedVersion,
        ParseError::ExpectationFailed,
        ParseError::EncodedSlash,
    ];

    /// A short, fixed description for logs.
    pub fn as_str(self) -> &'static str {
        match self {
            ParseError::Malformed => "malformed message",
            ParseError::BadFraming => "ambiguous or invalid message framing",
            ParseError::UnknownCoding => "unknown transfer coding",
            ParseError::BadHost => "missing, repeated or invalid Host",
            ParseError::BadChunk => "bad chunked encoding",
            ParseError::UriTooLong => "request line too long",
            ParseError::HeadersTooLarge => "header section too large",
            ParseError::BodyTooLarge => "body too large",
            ParseError::UnsupportedVersion => "unsupported HTTP version",
            ParseError::ExpectationFailed => "unsupported expectation",
            ParseError::EncodedSlash => "encoded slash in path",
        }
    }
}

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::error::Error for ParseError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variant_has_text() {
        let all = ParseError::ALL;
        for e in all {
            assert!(!e.as_str().is_empty());
            assert_eq!(e.to_string(), e.as_str());
        }
    }
}
