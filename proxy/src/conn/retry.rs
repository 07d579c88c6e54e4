//! What follows a failed attempt to an endpoint: whether `retry_on` and the retry budget send the request to another one, and its warn line in the error log (rate-limited per endpoint).

use std::net::IpAddr;

use zgix_config::RetryOn;

use super::Fail;
use crate::observe::decision::UpstreamError;
use crate::observe::log::{log_limited, Level};
use crate::runtime::Runtime;
use crate::upstream::metrics::RetryReason;

/// The `retry_on` reason that would send a request failed with `f` to
/// another endpoint, if any (`retryable`: idempotent, no body, no upgrade;
/// every reason but a connect failure needs it).
pub(super) fn retry_reason(f: &Fail, retryable: bool, on: u8) -> Option<RetryReason> {
    let (reason, needs) = match *f {
        Fail::Upstream(k) if k.is_connect() => (RetryReason::Connect, RetryOn::Connect),
        Fail::UpstreamEarly(_) => (RetryReason::Reset, RetryOn::Reset),
        Fail::Upstream(UpstreamError::HeaderTimeout) => (RetryReason::Timeout, RetryOn::Timeout),
        // Only refused in the exchange when a retry was open to it.
        Fail::Upstream(UpstreamError::Status5xx) => return Some(RetryReason::Status),
        _ => return None,
    };
    let allowed = reason == RetryReason::Connect || retryable;
    (allowed && on & needs.bit() != 0).then_some(reason)
}

/// What the client got after a failed attempt, for its log line.
#[derive(Copy, Clone)]
pub(super) enum Then {
    Retried,
    Answered(u16),
    Closed,
}

impl Then {
    /// Retried if `again`, else closed if part of the answer was `sent`, else `answer`.
    pub(super) fn of(again: bool, sent: bool, answer: u16) -> Then {
        if again {
            Then::Retried
        } else if sent {
            Then::Closed
        } else {
            Then::Answered(answer)
        }
    }
}

impl std::fmt::Display for Then {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Then::Retried => f.write_str("tried on another endpoint"),
            Then::Answered(s) => write!(f, "answered {s}"),
            Then::Closed => f.write_str("client connection closed"),
        }
    }
}

/// Who and what one failed attempt concerned.
pub(super) struct Attempt<'a> {
    pub ep: usize,
    pub kind: UpstreamError,
    pub status: u16,
    pub client: IpAddr,
    pub request_id: &'a [u8],
}

/// One warn line for a failed attempt: cluster, endpoint, reason, client,
/// request ID and what followed; at most `observe::log::BURST` a second per
/// endpoint, the rest counted (`zgix_upstream_error_log_suppressed_total`)
/// and their number given in the next line.
pub(super) fn log_failure(rt: &Runtime, a: &Attempt<'_>, then: Then) {
    let u = &rt.up.upstreams[a.ep];
    let cluster = &rt.up.clusters[u.cluster].name;
    let id = std::str::from_utf8(a.request_id)
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or("-");
    let status = StatusNote(a.kind, a.status);
    log_limited(
        &u.log,
        Level::Warn,
        "upstream",
        format_args!(
            "clusters.{cluster}: endpoint {}: {}{status}, client {}, request_id {id}; {then}",
            u.label,
            a.kind.label(),
            a.client,
        ),
    );
}

/// ` (503)` after `status_5xx`, nothing after other kinds.
struct StatusNote(UpstreamError, u16);

impl std::fmt::Display for StatusNote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0 == UpstreamError::Status5xx {
            write!(f, " ({})", self.1)
        } else {
            Ok(())
        }
    }
}
