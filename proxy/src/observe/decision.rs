//! What produced a response's status: the access log's `decision` field and the `decision` label of the request duration histogram.

use zgix_parser::ParseError;

/// Why a request got the status it got.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// The origin's answer was relayed.
    Forwarded,
    /// 429 from the rate limit.
    RateLimited,
    /// 503 from the connection limit.
    ConnLimited,
    /// The WAF-lite denylist matched.
    Waf,
    /// Terminal request filter (rule index in the listener's `request_filters`).
    Filter(u16),
    /// 502/504: the upstream exchange failed.
    UpstreamError(UpstreamError),
    /// The request could not be parsed (400, 413, 414, 431, 501, 505, 417).
    BadRequest(ParseError),
    /// 408: the head did not arrive within `client_header_timeout_ms`.
    ClientTimeout,
    /// Forwarded although this dry-run control would have refused it (the first
    /// such control in admission order).
    DryRun(Control),
    /// Answered by the admin endpoint (listener `admin`).
    Admin,
}

/// The controls that can run in dry-run mode: what `zgix_l7_dry_run_total` and the
/// access log's `dry_run:<decision>` name.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Control {
    RateLimit,
    ConnLimit,
    Waf,
}

impl Control {
    pub const ALL: [Control; 3] = [Control::RateLimit, Control::ConnLimit, Control::Waf];
    /// The `control` label.
    pub fn label(self) -> &'static str {
        match self {
            Control::RateLimit => "rate_limit",
            Control::ConnLimit => "conn_limit",
            Control::Waf => "waf",
        }
    }
    /// The decision enforcing would have logged.
    pub fn decision(self) -> &'static str {
        match self {
            Control::RateLimit => "rate_limited",
            Control::ConnLimit => "conn_limited",
            Control::Waf => "waf",
        }
    }
}

/// The histogram label of each [`Decision::class`], by index. Names and kinds
/// stay out of the label so the series count is fixed at load.
pub const CLASS_LABELS: [&str; 8] = [
    "forwarded",
    "rate_limited",
    "conn_limited",
    "waf",
    "filter",
    "upstream_error",
    "bad_request",
    "client_timeout",
];

impl Decision {
    /// Index into [`CLASS_LABELS`].
    pub fn class(self) -> usize {
        match self {
            Decision::Forwarded | Decision::DryRun(_) => 0,
            Decision::RateLimited => 1,
            Decision::ConnLimited => 2,
            Decision::Waf => 3,
            Decision::Filter(_) | Decision::Admin => 4,
            Decision::UpstreamError(_) => 5,
            Decision::BadRequest(_) => 6,
            Decision::ClientTimeout => 7,
        }
    }
}

/// A parse error as a `bad_request:<token>` suffix.
pub fn parse_error_token(e: ParseError) -> &'static str {
    match e {
        ParseError::Malformed => "malformed",
        ParseError::BadFraming => "bad_framing",
        ParseError::UnknownCoding => "unknown_coding",
        ParseError::BadHost => "bad_host",
        ParseError::BadChunk => "bad_chunk",
        ParseError::UriTooLong => "uri_too_long",
        ParseError::HeadersTooLarge => "headers_too_large",
        ParseError::BodyTooLarge => "body_too_large",
        ParseError::UnsupportedVersion => "unsupported_version",
        ParseError::ExpectationFailed => "expectation_failed",
        ParseError::EncodedSlash => "encoded_slash",
    }
}

/// Writes the decision string: `forwarded`, `rate_limited`, `conn_limited`,
/// `waf`, `filter:<name>` (`filter:#<index>` for an unnamed rule),
/// `upstream_error:<kind>`, `bad_request:<error>`, `client_timeout`,
/// `dry_run:<decision>` (`dry_run:rate_limited` ...).
pub fn write_decision(out: &mut Vec<u8>, d: Decision, filter_name: Option<&str>) {
    use std::io::Write as _;
    match d {
        Decision::Filter(i) => match filter_name {
            Some(n) => {
                out.extend_from_slice(b"filter:");
                out.extend_from_slice(n.as_bytes());
            }
            None => {
                let _ = write!(out, "filter:#{i}");
            }
        },
        Decision::UpstreamError(k) => {
            out.extend_from_slice(b"upstream_error:");
            out.extend_from_slice(k.label().as_bytes());
        }
        Decision::DryRun(c) => {
            out.extend_from_slice(b"dry_run:");
            out.extend_from_slice(c.decision().as_bytes());
        }
        Decision::Admin => out.extend_from_slice(b"admin"),
        Decision::BadRequest(e) => {
            out.extend_from_slice(b"bad_request:");
            out.extend_from_slice(parse_error_token(e).as_bytes());
        }
        other => out.extend_from_slice(CLASS_LABELS[other.class()].as_bytes()),
    }
}

/// Why an upstream exchange failed; each kind has its own counter.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum UpstreamError {
    ConnectRefused,
    ConnectTimeout,
    ConnectOther,
    Reset,
    HeaderTimeout,
    IdleTimeout,
    BadResponse,
    /// The TLS handshake with the origin failed (certificate refused, alert).
    ConnectTls,
    /// The origin answered 502, 503 or 504 and `retry_on` sent the request
    /// to another endpoint (a failed attempt; the client never sees it).
    Status5xx,
}

impl UpstreamError {
    /// The connection could not be made: nothing of the request was sent.
    pub fn is_connect(self) -> bool {
        matches!(
            self,
            UpstreamError::ConnectRefused
                | UpstreamError::ConnectTimeout
                | UpstreamError::ConnectOther
                | UpstreamError::ConnectTls
        )
    }

    pub const ALL: [UpstreamError; 9] = [
        UpstreamError::ConnectRefused,
        UpstreamError::ConnectTimeout,
        UpstreamError::ConnectOther,
        UpstreamError::Reset,
        UpstreamError::HeaderTimeout,
        UpstreamError::IdleTimeout,
        UpstreamError::BadResponse,
        UpstreamError::ConnectTls,
        UpstreamError::Status5xx,
    ];
    pub fn label(self) -> &'static str {
        match self {
            UpstreamError::ConnectRefused => "connect_refused",
            UpstreamError::ConnectTimeout => "connect_timeout",
            UpstreamError::ConnectOther => "connect_error",
            UpstreamError::Reset => "reset",
            UpstreamError::HeaderTimeout => "header_timeout",
            UpstreamError::IdleTimeout => "idle_timeout",
            UpstreamError::BadResponse => "bad_response",
            UpstreamError::ConnectTls => "tls_handshake",
            UpstreamError::Status5xx => "status_5xx",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decision_strings() {
        let cases: [(Decision, Option<&str>, &str); 12] = [
            (Decision::Forwarded, None, "forwarded"),
            (
                Decision::DryRun(Control::RateLimit),
                None,
                "dry_run:rate_limited",
            ),
            (
                Decision::DryRun(Control::ConnLimit),
                None,
                "dry_run:conn_limited",
            ),
            (Decision::DryRun(Control::Waf), None, "dry_run:waf"),
            (Decision::RateLimited, None, "rate_limited"),
            (Decision::ConnLimited, None, "conn_limited"),
            (Decision::Waf, None, "waf"),
            (Decision::Filter(2), Some("old-api"), "filter:old-api"),
            (Decision::Filter(2), None, "filter:#2"),
            (
                Decision::UpstreamError(UpstreamError::ConnectRefused),
                None,
                "upstream_error:connect_refused",
            ),
            (
                Decision::BadRequest(ParseError::BadFraming),
                None,
                "bad_request:bad_framing",
            ),
            (Decision::ClientTimeout, None, "client_timeout"),
        ];
        for (d, name, want) in cases {
            let mut out = Vec::new();
            write_decision(&mut out, d, name);
            assert_eq!(String::from_utf8(out).unwrap(), want);
        }
        let tokens: std::collections::BTreeSet<_> = ParseError::ALL
            .iter()
            .map(|e| parse_error_token(*e))
            .collect();
        assert_eq!(tokens.len(), ParseError::ALL.len());
    }
}
