//! Per-shard counters, gauges and histograms, summed on read and rendered in the Prometheus text format ([`render`]).
//!
//! Each shard writes only its own [`ShardCounters`] (one allocation per shard,
//! cache-line aligned), so no core writes another core's cache line on the hot
//! path. A counter has a single writer, so an increment is a relaxed load and
//! store rather than a locked read-modify-write. Durations go into
//! fixed-bucket [`Histo`]s of the same single-writer counters (the exported
//! buckets are fixed, so nothing finer is needed). The older per-listener
//! hdrhistogram (`Shard::latency`, folded into [`Metrics::latency`] once a
//! second) is still rendered, merged into `decision="forwarded"`, until the
//! request path records through [`ShardCounters::request_done`] instead.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;

use hdrhistogram::Histogram;

use crate::observe::counter::Counter;
pub use crate::observe::decision::Control;
use crate::observe::decision::UpstreamError;

/// Why a connection was refused before any request was read.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ConnRefusal {
    ProxyHeaderInvalid,
    ProxyHeaderTimeout,
    ClientDenied,
}

impl ConnRefusal {
    pub const ALL: [ConnRefusal; 3] = [
        ConnRefusal::ProxyHeaderInvalid,
        ConnRefusal::ProxyHeaderTimeout,
        ConnRefusal::ClientDenied,
    ];
    pub fn label(self) -> &'static str {
        match self {
            ConnRefusal::ProxyHeaderInvalid => "proxy_header_invalid",
            ConnRefusal::ProxyHeaderTimeout => "proxy_header_timeout",
            ConnRefusal::ClientDenied => "client_denied",
        }
    }
}

/// A single-writer gauge (open connections): the owning shard moves it.
#[derive(Default)]
pub struct Gauge(AtomicI64);

impl Gauge {
    #[inline]
    pub fn add(&self, n: i64) {
        self.0.store(
            self.0.load(Ordering::Relaxed).wrapping_add(n),
            Ordering::Relaxed,
        );
    }
    pub fn get(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Upper bounds of the exported duration buckets, in microseconds (100 µs to 10 s).
pub const BUCKETS_US: [u64; 16] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000,
];

/// A fixed-bucket duration histogram: one single-writer counter per bucket
/// (not cumulative; summed into `le` buckets when rendered), a count and a
/// sum in microseconds. Recording is a 16-entry scan and three stores.
#[derive(Default)]
pub struct Histo {
    /// `buckets[i]` counts values in (BUCKETS_US[i-1], BUCKETS_US[i]]; the
    /// last slot counts values above 10 s.
    pub buckets: [Counter; BUCKETS_US.len() + 1],
    pub count: Counter,
    pub sum_us: Counter,
}

impl Histo {
    #[inline]
    pub fn record(&self, us: u64) {
        let i = BUCKETS_US
            .iter()
            .position(|&b| us <= b)
            .unwrap_or(BUCKETS_US.len());
        self.buckets[i].inc();
        self.count.inc();
        self.sum_us.add(us);
    }
}

/// The admission events counted per listener (and summed under the
/// specification's names).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Admission {
    RateLimited,
    RateLimitFull,
    ConnLimited,
    ConnLimitFull,
    WafBlocked,
}

impl Admission {
    pub const ALL: [Admission; 5] = [
        Admission::RateLimited,
        Admission::RateLimitFull,
        Admission::ConnLimited,
        Admission::ConnLimitFull,
        Admission::WafBlocked,
    ];
    pub fn label(self) -> &'static str {
        match self {
            Admission::RateLimited => "rate_limited",
            Admission::RateLimitFull => "rate_limit_full",
            Admission::ConnLimited => "conn_limited",
            Admission::ConnLimitFull => "conn_limit_full",
            Admission::WafBlocked => "waf_blocked",
        }
    }
}

/// Buckets of the probe-depth histogram: depth 0..=7 past the home slot, and 8 for an
/// identity that found no slot (`zgix_admission::PROBE_DEPTH_FULL`).
pub const PROBE_DEPTHS: usize = zgix_admission::PROBE_DEPTH_FULL as usize + 1;

/// Statuses counted one by one: every code a response can carry.
pub const STATUS_CODES: std::ops::RangeInclusive<u16> = 100..=599;

/// Counters of one listener on one shard.
pub struct ListenerCounters {
    /// Responses by status code: index `code - 100`.
    pub codes: Box<[Counter]>,
    pub connections: Counter,
    /// Client connections open now.
    pub open: Gauge,
    /// By [`Admission`] index.
    pub admission: [Counter; Admission::ALL.len()],
    /// Request duration by [`crate::observe::decision::Decision::class`].
    pub duration: [Histo; crate::observe::decision::CLASS_LABELS.len()],
    /// TLS handshakes by [`TLS_RESULTS`] index and [`TLS_VERSIONS`] index.
    pub tls_handshakes: [[Counter; TLS_VERSIONS.len()]; TLS_RESULTS.len()],
    /// TLS handshakes that resumed a session (a ticket).
    pub tls_resumed: Counter,
    /// Time from the first ClientHello byte to the end of the handshake.
    pub tls_handshake_time: Histo,
    /// Refusals a dry-run control would have made, by [`Control`] index.
    pub dry_run: [Counter; Control::ALL.len()],
    /// HTTP/2 connections and streams accepted.
    pub h2_connections: Counter,
    pub h2_streams: Counter,
    /// HTTP/2 connections and streams refused, by [`H2_REFUSALS`] index.
    pub h2_refused: [Counter; H2_REFUSALS.len()],
}

/// The `reason` label of `zgix_h2_refused_total`, by index (what each
/// means: docs/operations.md, HTTP/2).
pub const H2_REFUSALS: [&str; 12] = [
    "bad_preface",
    "rapid_reset",
    "calm",
    "hpack",
    "protocol",
    "flow_control",
    "frame_size",
    "refused_stream",
    "stream_error",
    "settings_flood",
    "ping_flood",
    "header_list",
];

/// The `result` label of `zgix_tls_handshakes_total`, by index.
pub const TLS_RESULTS: [&str; 6] = [
    "ok",
    "timeout",
    "alert",
    "bad_hello",
    "no_cert",
    "plaintext",
];
/// The `version` label of `zgix_tls_handshakes_total`, by index (a failed
/// handshake has no version).
pub const TLS_VERSIONS: [&str; 3] = ["none", "TLSv1.2", "TLSv1.3"];

impl Default for ListenerCounters {
    fn default() -> Self {
        ListenerCounters {
            codes: STATUS_CODES.map(|_| Counter::default()).collect(),
            connections: Counter::default(),
            open: Gauge::default(),
            admission: Default::default(),
            duration: Default::default(),
            tls_handshakes: Default::default(),
            tls_resumed: Counter::default(),
            tls_handshake_time: Histo::default(),
            dry_run: Default::default(),
            h2_connections: Counter::default(),
            h2_streams: Counter::default(),
            h2_refused: Default::default(),
        }
    }
}

/// Counters of one cluster on one shard.
#[derive(Default)]
pub struct ClusterCounters {
    /// From the request head written upstream to the response head read.
    pub upstream_time: Histo,
    /// By [`UpstreamError`] index.
    pub errors: [Counter; UpstreamError::ALL.len()],
}

/// What one shard counts outside any listener or cluster. Aligned so two
/// shards never share a line. Kept across reloads.
#[repr(align(128))]
#[derive(Default)]
pub struct CoreCounters {
    pub rate_limited: Counter,
    pub rate_limit_full: Counter,
    pub conn_limited: Counter,
    pub conn_limit_full: Counter,
    pub waf_blocked: Counter,
    /// Rate checks by probe depth (index = slots past home; the last = no slot).
    pub rate_probe_depth: [Counter; PROBE_DEPTHS],
    /// Connection-limit checks by probe depth, likewise.
    pub conn_probe_depth: [Counter; PROBE_DEPTHS],
    pub upstream_errors: [Counter; UpstreamError::ALL.len()],
    pub upstream_connects: Counter,
    pub refused_connections: [Counter; ConnRefusal::ALL.len()],
    pub active_connections: AtomicI64,
    /// Heap allocations by the shard's thread, copied in once a tick.
    pub heap_allocations: AtomicU64,
    /// Access-log lines queued, and lines dropped because the ring was full.
    pub access_log_lines: Counter,
    pub access_log_dropped: Counter,
    /// Driver, accept and tunnel counters.
    pub engine: crate::observe::engine_metrics::EngineCounters,
}

impl CoreCounters {
    #[inline]
    pub fn upstream_error(&self, kind: UpstreamError) {
        self.upstream_errors[kind as usize].inc();
    }
    #[inline]
    pub fn refused(&self, why: ConnRefusal) {
        self.refused_connections[why as usize].inc();
    }
}

/// Everything one shard counts, as one generation's runtime indexes it: the
/// listener and cluster blocks are in that runtime's order, each shared with
/// every generation that has a listener (cluster) of the same name, so a
/// series follows its name across reloads that reorder, add or remove.
pub struct ShardCounters {
    pub core: std::sync::Arc<CoreCounters>,
    pub listeners: Box<[std::sync::Arc<ListenerCounters>]>,
    pub clusters: Box<[std::sync::Arc<ClusterCounters>]>,
}

impl std::ops::Deref for ShardCounters {
    type Target = CoreCounters;
    fn deref(&self) -> &CoreCounters {
        &self.core
    }
}

impl ShardCounters {
    pub fn new(listeners: usize, clusters: usize) -> ShardCounters {
        ShardCounters {
            core: Default::default(),
            listeners: (0..listeners).map(|_| Default::default()).collect(),
            clusters: (0..clusters).map(|_| Default::default()).collect(),
        }
    }
    /// A response written to a client of `listener`, by status code.
    #[inline]
    pub fn response(&self, listener: usize, status: u16) {
        let code = status.clamp(*STATUS_CODES.start(), *STATUS_CODES.end());
        self.listeners[listener].codes[(code - STATUS_CODES.start()) as usize].inc();
    }
    /// An upstream failure in `cluster` (also counted in the unlabelled total).
    #[inline]
    pub fn cluster_upstream_error(&self, cluster: usize, kind: UpstreamError) {
        self.upstream_error(kind);
        self.clusters[cluster].errors[kind as usize].inc();
    }
    /// An admission event on `listener`: counted for the listener and in the
    /// shard's total under the specification's name.
    #[inline]
    pub fn admission(&self, listener: usize, ev: Admission) {
        let total = match ev {
            Admission::RateLimited => &self.rate_limited,
            Admission::RateLimitFull => &self.rate_limit_full,
            Admission::ConnLimited => &self.conn_limited,
            Admission::ConnLimitFull => &self.conn_limit_full,
            Admission::WafBlocked => &self.waf_blocked,
        };
        total.inc();
        self.listeners[listener].admission[ev as usize].inc();
    }
    /// A refusal a dry-run `control` on `listener` would have made.
    #[inline]
    pub fn dry_run(&self, listener: usize, control: Control) {
        self.listeners[listener].dry_run[control as usize].inc();
    }
    /// A rate check that probed `depth` slots past its home.
    #[inline]
    pub fn rate_probe(&self, depth: u8) {
        self.rate_probe_depth[usize::from(depth).min(PROBE_DEPTHS - 1)].inc();
    }
    /// A connection-limit check that probed `depth` slots past its home.
    #[inline]
    pub fn conn_probe(&self, depth: u8) {
        self.conn_probe_depth[usize::from(depth).min(PROBE_DEPTHS - 1)].inc();
    }
    /// A request finished (response written, refusal included) after `us`.
    #[inline]
    pub fn request_done(
        &self,
        listener: usize,
        decision: crate::observe::decision::Decision,
        us: u64,
    ) {
        self.listeners[listener].duration[decision.class()].record(us);
    }
    /// An upstream answered its response head `us` after the request was sent.
    #[inline]
    pub fn upstream_time(&self, cluster: usize, us: u64) {
        self.clusters[cluster].upstream_time.record(us);
    }
    /// A client connection on `listener` opened (accepted and registered).
    #[inline]
    pub fn connection_opened(&self, listener: usize) {
        self.active_connections.fetch_add(1, Ordering::Relaxed);
        self.listeners[listener].open.add(1);
    }
    /// A client connection on `listener` closed.
    #[inline]
    pub fn connection_closed(&self, listener: usize) {
        self.active_connections.fetch_sub(1, Ordering::Relaxed);
        self.listeners[listener].open.add(-1);
    }
}

/// Lowest and highest latency the histograms track, in microseconds, and their precision.
pub const LATENCY_MAX_US: u64 = 3_600_000_000;
const LATENCY_SIGFIG: u8 = 2;

/// A latency histogram in microseconds with the bounds every shard uses.
pub fn new_latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_MAX_US, LATENCY_SIGFIG).expect("static bounds are valid")
}

/// One runtime's registry: one counters block and one histogram set per
/// shard, in that runtime's listener and cluster order.
pub struct Metrics {
    pub shards: Vec<std::sync::Arc<ShardCounters>>,
    /// Per shard, per listener: latency folded in by the shard's tick task.
    pub latency: Vec<Mutex<Vec<Histogram<u64>>>>,
    /// When the registry (the process) started, in Unix seconds.
    pub start_time: f64,
    /// The names the listener and cluster blocks are shared by.
    listener_names: Vec<String>,
    cluster_names: Vec<String>,
}

impl Metrics {
    pub fn new(shards: usize, listeners: usize, clusters: usize) -> Metrics {
        let l: Vec<String> = (0..listeners).map(|i| format!("#{i}")).collect();
        let c: Vec<String> = (0..clusters).map(|i| format!("#{i}")).collect();
        Metrics::named(shards, &l, &c, None)
    }

    /// A registry for listeners and clusters of these names, in this order:
    /// each block is `prev`'s of the same name when it has one (counts go
    /// on), else new; the shard-wide counters are `prev`'s.
    pub fn named(
        shards: usize,
        listeners: &[String],
        clusters: &[String],
        prev: Option<&Metrics>,
    ) -> Metrics {
        fn pick<T: Default>(
            names: &[String],
            prev_names: &[String],
            prev: Option<&[std::sync::Arc<T>]>,
        ) -> Box<[std::sync::Arc<T>]> {
            names
                .iter()
                .map(|n| {
                    prev.and_then(|p| Some(p[prev_names.iter().position(|x| x == n)?].clone()))
                        .unwrap_or_default()
                })
                .collect()
        }
        let (pl, pc) = prev.map_or((&[][..], &[][..]), |p| {
            (&p.listener_names[..], &p.cluster_names[..])
        });
        Metrics {
            shards: (0..shards)
                .map(|i| {
                    let old = prev.and_then(|p| p.shards.get(i));
                    std::sync::Arc::new(ShardCounters {
                        core: old.map_or_else(Default::default, |o| o.core.clone()),
                        listeners: pick(listeners, pl, old.map(|o| &o.listeners[..])),
                        clusters: pick(clusters, pc, old.map(|o| &o.clusters[..])),
                    })
                })
                .collect(),
            latency: (0..shards)
                .map(|_| {
                    Mutex::new(
                        (0..listeners.len())
                            .map(|_| new_latency_histogram())
                            .collect(),
                    )
                })
                .collect(),
            start_time: prev.map_or_else(
                || {
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0.0, |d| d.as_secs_f64())
                },
                |p| p.start_time,
            ),
            listener_names: listeners.to_vec(),
            cluster_names: clusters.to_vec(),
        }
    }

    fn sum(&self, f: impl Fn(&ShardCounters) -> u64) -> u64 {
        self.shards.iter().map(|s| f(s)).sum()
    }
}

/// Table gauges the admin endpoint reports beside the counters.
pub struct TableGauges {
    pub rate_in_use: usize,
    pub rate_capacity: usize,
    pub conn_in_use: usize,
    pub conn_capacity: usize,
    /// `Runtime::max_connections` (`zgix_max_connections`).
    pub max_connections: usize,
}

pub mod process;
mod render;
pub use render::Labels;

#[cfg(test)]
mod tests;
