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
use crate::runtime::Runtime;
use crate::upstream::health::{now_ms, Avail};

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
}

impl RetryReason {
    pub const ALL: [RetryReason; 2] = [RetryReason::Connect, RetryReason::Reset];
    pub fn label(self) -> &'static str {
        match self {
            RetryReason::Connect => "connect",
            RetryReason::Reset => "reset_before_response",
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
    ttfb: [Counter; TTFB_BUCKETS_US.len() + 1],
    ttfb_sum_us: Counter,
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

/// Everything one shard counts about upstreams.
#[repr(align(128))]
pub struct ShardUpstream {
    pub endpoints: Box<[EndpointStats]>,
    pub retries: [Counter; RetryReason::ALL.len()],
    /// Picks made in panic mode, per cluster.
    pub panic_picks: Box<[Counter]>,
}

impl ShardUpstream {
    fn new(endpoints: usize, clusters: usize) -> ShardUpstream {
        ShardUpstream {
            endpoints: (0..endpoints).map(|_| EndpointStats::default()).collect(),
            retries: Default::default(),
            panic_picks: (0..clusters).map(|_| Counter::default()).collect(),
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

    fn sum(&self, ep: usize, f: impl Fn(&EndpointStats) -> u64) -> u64 {
        self.shards.iter().map(|s| f(&s.endpoints[ep])).sum()
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

/// Every per-endpoint family, labelled `cluster` and `endpoint` (the address
/// as configured). Appended to `/metrics` by the admin endpoint.
pub fn render(rt: &Runtime) -> String {
    let m = &rt.upstream_stats;
    let mut o = String::with_capacity(1024 + rt.upstreams.len() * 2048);
    m.render_retries(&mut o);
    let labels = |ep: usize| {
        let u = &rt.upstreams[ep];
        format!(
            "cluster=\"{}\",endpoint=\"{}\"",
            rt.clusters[u.cluster].name, u.label
        )
    };
    let family = |o: &mut String, name: &str, kind: &str, help: &str| {
        let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
    };
    let per_endpoint =
        |o: &mut String, name: &str, kind: &str, help: &str, v: &dyn Fn(usize) -> u64| {
            family(o, name, kind, help);
            for ep in 0..rt.upstreams.len() {
                let _ = writeln!(o, "{name}{{{}}} {}", labels(ep), v(ep));
            }
        };
    per_endpoint(
        &mut o,
        "zgix_upstream_requests_total",
        "counter",
        "Requests sent to an endpoint (every try).",
        &|ep| m.sum(ep, |s| s.requests.get()),
    );
    per_endpoint(
        &mut o,
        "zgix_upstream_endpoint_connects_total",
        "counter",
        "Upstream connections opened to an endpoint; requests / connects is the reuse ratio.",
        &|ep| m.sum(ep, |s| s.connects.get()),
    );
    per_endpoint(
        &mut o,
        "zgix_upstream_in_flight",
        "gauge",
        "Requests to an endpoint in flight now.",
        &|ep| m.sum(ep, |s| u64::from(s.in_flight())),
    );
    let now = now_ms();
    per_endpoint(
        &mut o,
        "zgix_upstream_endpoint_healthy",
        "gauge",
        "1 when an endpoint takes traffic, 0 while ejected, marked down by the active check, or unresolved.",
        &|ep| u64::from(rt.upstreams[ep].health.availability(now) != Avail::Down),
    );
    per_endpoint(
        &mut o,
        "zgix_upstream_ejections_total",
        "counter",
        "Passive-health ejections of an endpoint.",
        &|ep| rt.upstreams[ep].health.ejections(),
    );
    per_endpoint(
        &mut o,
        "zgix_upstream_resolve_failures_total",
        "counter",
        "Failed lookups of a named endpoint (its last address is kept).",
        &|ep| rt.upstreams[ep].addr.resolve_failures(),
    );
    family(
        &mut o,
        "zgix_upstream_endpoint_errors_total",
        "counter",
        "Upstream failures of an endpoint, by kind.",
    );
    for ep in 0..rt.upstreams.len() {
        for kind in UpstreamError::ALL {
            let v = m.sum(ep, |s| s.errors[kind as usize].get());
            let _ = writeln!(
                o,
                "zgix_upstream_endpoint_errors_total{{{},kind=\"{}\"}} {v}",
                labels(ep),
                kind.label()
            );
        }
    }
    family(
        &mut o,
        "zgix_upstream_panic_picks_total",
        "counter",
        "Picks made while no endpoint of the cluster was healthy (panic mode: every endpoint is used).",
    );
    for (ci, c) in rt.clusters.iter().enumerate() {
        let v: u64 = m.shards.iter().map(|s| s.panic_picks[ci].get()).sum();
        let _ = writeln!(
            o,
            "zgix_upstream_panic_picks_total{{cluster=\"{}\"}} {v}",
            c.name
        );
    }
    family(
        &mut o,
        "zgix_upstream_ttfb_seconds",
        "histogram",
        "Time from sending a request to an endpoint to its first response byte.",
    );
    for ep in 0..rt.upstreams.len() {
        let l = labels(ep);
        let mut cumulative = 0;
        for (i, le) in TTFB_BUCKETS_US.iter().enumerate() {
            cumulative += m.sum(ep, |s| s.ttfb[i].get());
            let _ = writeln!(
                o,
                "zgix_upstream_ttfb_seconds_bucket{{{l},le=\"{}\"}} {cumulative}",
                *le as f64 / 1e6
            );
        }
        cumulative += m.sum(ep, |s| s.ttfb[TTFB_BUCKETS_US.len()].get());
        let sum_s = m.sum(ep, |s| s.ttfb_sum_us.get()) as f64 / 1e6;
        let _ = writeln!(
            o,
            "zgix_upstream_ttfb_seconds_bucket{{{l},le=\"+Inf\"}} {cumulative}\nzgix_upstream_ttfb_seconds_sum{{{l}}} {sum_s}\nzgix_upstream_ttfb_seconds_count{{{l}}} {cumulative}"
        );
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttfb_buckets_are_cumulative_and_in_seconds() {
        let text = r#"{"listeners": [{"bind": "127.0.0.1:0", "http": {"cluster": "c"}}],
            "clusters": {"c": {"endpoints": ["127.0.0.1:1"]}}}"#;
        let rt = Runtime::new(zgix_config::Config::from_json(text).unwrap(), 2);
        let (s0, s1) = (&rt.upstream_stats.shards[0], &rt.upstream_stats.shards[1]);
        s0.endpoints[0].ttfb(100);
        s1.endpoints[0].ttfb(101);
        s1.endpoints[0].ttfb(20_000_000);
        s0.retry(RetryReason::Connect);
        s1.retry(RetryReason::Connect);
        let m = render(&rt);
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
