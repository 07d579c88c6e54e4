//! Per-endpoint upstream counters (requests, errors, in flight, connects, time to first byte), per shard, rendered for Prometheus.
//!
//! Like `metrics.rs`, every shard writes only its own [`ShardUpstream`]
//! (single-writer relaxed load + store), and `/metrics` sums the shards. The
//! time-to-first-byte histogram has fixed buckets of plain counters, so
//! recording it is a short scan and one increment, with no lock and no fold.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::sync::Arc;

use crate::observe::counter::Counter;
use crate::observe::decision::UpstreamError;
use crate::upstream::budget::RetryBudget;

/// Upper bounds of the time-to-first-byte buckets, in microseconds: 100 µs to 10 s.
pub const TTFB_BUCKETS_US: [u64; 16] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000,
];

/// Why a request was tried again on another endpoint.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum RetryReason {
    /// The connect failed (refused, timed out): always safe, nothing was sent.
    Connect,
    /// Reset or closed before any response byte, idempotent request without a body.
    Reset,
    /// No response head within the header timeout (`retry_on` "timeout").
    Timeout,
    /// The origin answered 502, 503 or 504 (`retry_on` "502" ...).
    Status,
}

impl RetryReason {
    pub const ALL: [RetryReason; 4] = [
        RetryReason::Connect,
        RetryReason::Reset,
        RetryReason::Timeout,
        RetryReason::Status,
    ];
    pub fn label(self) -> &'static str {
        match self {
            RetryReason::Connect => "connect",
            RetryReason::Reset => "reset_before_response",
            RetryReason::Timeout => "header_timeout",
            RetryReason::Status => "status",
        }
    }
}

/// One endpoint's counters on one shard.
#[derive(Default)]
pub struct EndpointStats {
    pub requests: Counter,
    pub errors: [Counter; UpstreamError::ALL.len()],
    /// Requests to this endpoint in flight on this shard: `least_conn` reads it.
    in_flight: AtomicU32,
    pub connects: Counter,
    pub(super) ttfb: [Counter; TTFB_BUCKETS_US.len() + 1],
    pub(super) ttfb_sum_us: Counter,
}

impl EndpointStats {
    /// In-flight requests on this shard.
    #[inline]
    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Relaxed)
    }

    /// Records the time from sending the request to its first response byte.
    #[inline]
    pub fn ttfb(&self, us: u64) {
        let i = TTFB_BUCKETS_US
            .iter()
            .position(|&b| us <= b)
            .unwrap_or(TTFB_BUCKETS_US.len());
        self.ttfb[i].inc();
        self.ttfb_sum_us.add(us);
    }

    #[inline]
    pub fn error(&self, kind: UpstreamError) {
        self.errors[kind as usize].inc();
    }
}

/// Holds one in-flight request to an endpoint; dropping it releases it.
/// Only its shard creates and drops it, so the count has a single writer.
pub struct InFlight<'a>(&'a AtomicU32);

impl Drop for InFlight<'_> {
    #[inline]
    fn drop(&mut self) {
        self.0.store(self.0.load(Relaxed).wrapping_sub(1), Relaxed);
    }
}

/// Everything one shard counts about upstreams. Each block is shared with
/// the previous generation's (by cluster and endpoint name, see
/// [`carry_over`]), so a reload never resets a counter.
#[repr(align(128))]
pub struct ShardUpstream {
    pub endpoints: Box<[Arc<EndpointStats>]>,
    pub retries: Arc<[Counter; RetryReason::ALL.len()]>,
    /// Picks made in panic mode, per cluster.
    pub panic_picks: Box<[Arc<Counter>]>,
    /// Each cluster's retry budget on this shard.
    pub budgets: Box<[Arc<RetryBudget>]>,
}

impl ShardUpstream {
    fn new(endpoints: usize, clusters: usize) -> ShardUpstream {
        ShardUpstream {
            endpoints: (0..endpoints).map(|_| Arc::default()).collect(),
            retries: Arc::default(),
            panic_picks: (0..clusters).map(|_| Arc::default()).collect(),
            budgets: (0..clusters).map(|_| Arc::default()).collect(),
        }
    }

    /// Counts a request to `ep` and holds it in flight until the guard drops.
    #[inline]
    pub fn begin(&self, ep: usize) -> InFlight<'_> {
        let s = &self.endpoints[ep];
        s.requests.inc();
        s.in_flight
            .store(s.in_flight.load(Relaxed).wrapping_add(1), Relaxed);
        InFlight(&s.in_flight)
    }

    #[inline]
    pub fn retry(&self, why: RetryReason) {
        self.retries[why as usize].inc();
    }
}

/// The process-wide registry: one block per shard.
pub struct UpstreamMetrics {
    pub shards: Vec<Arc<ShardUpstream>>,
}

impl UpstreamMetrics {
    pub fn new(shards: usize, endpoints: usize, clusters: usize) -> UpstreamMetrics {
        UpstreamMetrics {
            shards: (0..shards.max(1))
                .map(|_| Arc::new(ShardUpstream::new(endpoints, clusters)))
                .collect(),
        }
    }

    /// Endpoint `ep`'s counter `f`, summed over the shards.
    pub fn sum(&self, ep: usize, f: impl Fn(&EndpointStats) -> u64) -> u64 {
        self.shards.iter().map(|s| f(&s.endpoints[ep])).sum()
    }

    /// The `q` quantile (0..1) of endpoint `ep`'s time to first byte over
    /// every shard, in seconds: the upper bound of the bucket it falls in
    /// (so at most 2.5x off); `None` before any response.
    pub fn ttfb_quantile(&self, ep: usize, q: f64) -> Option<f64> {
        let counts: Vec<u64> = (0..=TTFB_BUCKETS_US.len())
            .map(|i| self.sum(ep, |s| s.ttfb[i].get()))
            .collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return None;
        }
        let rank = (q * total as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, c) in counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Some(
                    TTFB_BUCKETS_US
                        .get(i)
                        .map_or(f64::INFINITY, |&b| b as f64 / 1e6),
                );
            }
        }
        None
    }

    /// `zgix_upstream_retries_total{reason}`. Rendered by the caller in place
    /// of the unlabelled family `metrics.rs` still carries (see the report of
    /// issue 13): one family name must appear once in an exposition.
    pub fn render_retries(&self, o: &mut String) {
        let _ = writeln!(
            o,
            "# HELP zgix_upstream_retries_total Requests tried again on another endpoint, by reason.\n# TYPE zgix_upstream_retries_total counter"
        );
        for why in RetryReason::ALL {
            let v: u64 = self
                .shards
                .iter()
                .map(|s| s.retries[why as usize].get())
                .sum();
            let _ = writeln!(
                o,
                "zgix_upstream_retries_total{{reason=\"{}\"}} {v}",
                why.label()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttfb_buckets_are_cumulative_and_in_seconds() {
        let text = r#"{"listeners": [{"bind": "127.0.0.1:0", "http": {"cluster": "c"}}],
            "clusters": {"c": {"endpoints": ["127.0.0.1:1"]}}}"#;
        let rt = crate::upstream::cluster::Upstreams::build(
            &zgix_config::Config::from_json(text).unwrap(),
            2,
        );
        let (s0, s1) = (&rt.upstream_stats.shards[0], &rt.upstream_stats.shards[1]);
        s0.endpoints[0].ttfb(100);
        s1.endpoints[0].ttfb(101);
        s1.endpoints[0].ttfb(20_000_000);
        s0.retry(RetryReason::Connect);
        s1.retry(RetryReason::Connect);
        let m = crate::upstream::render::render(&rt);
        let l = "cluster=\"c\",endpoint=\"127.0.0.1:1\"";
        for line in [
            format!("zgix_upstream_ttfb_seconds_bucket{{{l},le=\"0.0001\"}} 1"),
            format!("zgix_upstream_ttfb_seconds_bucket{{{l},le=\"0.00025\"}} 2"),
            format!("zgix_upstream_ttfb_seconds_bucket{{{l},le=\"10\"}} 2"),
            format!("zgix_upstream_ttfb_seconds_bucket{{{l},le=\"+Inf\"}} 3"),
            format!("zgix_upstream_ttfb_seconds_count{{{l}}} 3"),
            format!("zgix_upstream_ttfb_seconds_sum{{{l}}} 20.000201"),
        ] {
            assert!(m.lines().any(|x| x == line), "no {line:?} in\n{m}");
        }
        let mut r = String::new();
        rt.upstream_stats.render_retries(&mut r);
        assert!(
            r.contains("zgix_upstream_retries_total{reason=\"connect\"} 2\n"),
            "{r}"
        );
        assert!(r.contains("zgix_upstream_retries_total{reason=\"reset_before_response\"} 0\n"));
    }
}
