//! Per-shard counters and latency histograms, summed on read and rendered in the Prometheus text format.
//!
//! Each shard writes only its own [`ShardCounters`] (one allocation per shard,
//! cache-line aligned), so no core writes another core's cache line on the hot
//! path. A counter has a single writer, so an increment is a relaxed load and
//! store rather than a locked read-modify-write. Latency is recorded into a
//! shard-local hdrhistogram and folded into a per-shard mutex-guarded copy once
//! a second by the shard's tick task: the lock is off the request path.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;

use hdrhistogram::Histogram;

/// A single-writer counter: the owning shard increments, anyone may read.
#[derive(Default)]
pub struct Counter(AtomicU64);

impl Counter {
    #[inline]
    pub fn inc(&self) {
        self.add(1);
    }
    #[inline]
    pub fn add(&self, n: u64) {
        // Single writer: load + store avoids a locked instruction.
        self.0.store(
            self.0.load(Ordering::Relaxed).wrapping_add(n),
            Ordering::Relaxed,
        );
    }
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
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
}

impl UpstreamError {
    pub const ALL: [UpstreamError; 7] = [
        UpstreamError::ConnectRefused,
        UpstreamError::ConnectTimeout,
        UpstreamError::ConnectOther,
        UpstreamError::Reset,
        UpstreamError::HeaderTimeout,
        UpstreamError::IdleTimeout,
        UpstreamError::BadResponse,
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
        }
    }
}

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

/// Counters of one listener on one shard.
#[derive(Default)]
pub struct ListenerCounters {
    /// Responses by status class: index 0 = 1xx … 4 = 5xx.
    pub responses: [Counter; 5],
    pub connections: Counter,
}

/// Everything one shard counts. Aligned so two shards never share a line.
#[repr(align(128))]
#[derive(Default)]
pub struct ShardCounters {
    pub rate_limited: Counter,
    pub rate_limit_full: Counter,
    pub conn_limited: Counter,
    pub conn_limit_full: Counter,
    pub waf_blocked: Counter,
    pub upstream_errors: [Counter; UpstreamError::ALL.len()],
    pub upstream_retries: Counter,
    pub upstream_connects: Counter,
    pub refused_connections: [Counter; ConnRefusal::ALL.len()],
    pub active_connections: AtomicI64,
    /// Heap allocations by the shard's thread, copied in once a tick.
    pub heap_allocations: AtomicU64,
    pub listeners: Box<[ListenerCounters]>,
    /// Driver, accept and tunnel counters.
    pub engine: crate::engine_metrics::EngineCounters,
}

impl ShardCounters {
    pub fn new(listeners: usize) -> ShardCounters {
        ShardCounters {
            listeners: (0..listeners)
                .map(|_| ListenerCounters::default())
                .collect(),
            ..Default::default()
        }
    }
    #[inline]
    pub fn response(&self, listener: usize, status: u16) {
        let class = (status / 100).clamp(1, 5) as usize - 1;
        self.listeners[listener].responses[class].inc();
    }
    #[inline]
    pub fn upstream_error(&self, kind: UpstreamError) {
        self.upstream_errors[kind as usize].inc();
    }
    #[inline]
    pub fn refused(&self, why: ConnRefusal) {
        self.refused_connections[why as usize].inc();
    }
}

/// Lowest and highest latency the histograms track, in microseconds, and their precision.
pub const LATENCY_MAX_US: u64 = 3_600_000_000;
const LATENCY_SIGFIG: u8 = 2;

/// A latency histogram in microseconds with the bounds every shard uses.
pub fn new_latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_MAX_US, LATENCY_SIGFIG).expect("static bounds are valid")
}

/// The process-wide registry: one counters block and one histogram set per shard.
pub struct Metrics {
    pub shards: Vec<std::sync::Arc<ShardCounters>>,
    /// Per shard, per listener: latency folded in by the shard's tick task.
    pub latency: Vec<Mutex<Vec<Histogram<u64>>>>,
}

/// Table gauges the admin endpoint reports beside the counters.
pub struct TableGauges {
    pub rate_in_use: usize,
    pub rate_capacity: usize,
    pub conn_in_use: usize,
    pub conn_capacity: usize,
}

/// Upper bounds of the exported latency buckets, in seconds.
const BUCKETS_S: [f64; 16] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

impl Metrics {
    pub fn new(shards: usize, listeners: usize) -> Metrics {
        Metrics {
            shards: (0..shards)
                .map(|_| std::sync::Arc::new(ShardCounters::new(listeners)))
                .collect(),
            latency: (0..shards)
                .map(|_| Mutex::new((0..listeners).map(|_| new_latency_histogram()).collect()))
                .collect(),
        }
    }

    fn sum(&self, f: impl Fn(&ShardCounters) -> u64) -> u64 {
        self.shards.iter().map(|s| f(s)).sum()
    }

    /// Renders every metric in the Prometheus text exposition format 0.0.4.
    pub fn render(&self, listener_names: &[String], tables: &TableGauges) -> String {
        let mut o = String::with_capacity(8192);
        let counter = |o: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
        };
        // The admission counters keep the exact names of the specification.
        // Prometheus' linter (promtool check metrics) insists that a `counter`
        // ends in `_total`, so each is exposed twice: under its exact name as
        // `untyped` (monotonic all the same: rate() works on it) and as the
        // conventional `<name>_total` counter.
        let spec_counter = |o: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(
                o,
                "# HELP {name} {help}\n# TYPE {name} untyped\n{name} {v}\n# HELP {name}_total {help}\n# TYPE {name}_total counter\n{name}_total {v}"
            );
        };
        spec_counter(
            &mut o,
            "zgix_l7_rate_limited",
            "Requests answered 429 by the rate limit.",
            self.sum(|s| s.rate_limited.get()),
        );
        spec_counter(
            &mut o,
            "zgix_l7_rate_limit_full",
            "Rate checks that found no free slot within 8 probes and failed open.",
            self.sum(|s| s.rate_limit_full.get()),
        );
        spec_counter(
            &mut o,
            "zgix_l7_conn_limited",
            "Requests answered 503 by the connection limit.",
            self.sum(|s| s.conn_limited.get()),
        );
        spec_counter(
            &mut o,
            "zgix_l7_conn_limit_full",
            "Connection-limit checks that found no free slot within 8 probes and failed open.",
            self.sum(|s| s.conn_limit_full.get()),
        );
        spec_counter(
            &mut o,
            "zgix_l7_waf_blocked",
            "Requests refused by the WAF-lite denylist.",
            self.sum(|s| s.waf_blocked.get()),
        );
        counter(
            &mut o,
            "zgix_upstream_retries_total",
            "Idempotent requests retried once on a fresh upstream connection.",
            self.sum(|s| s.upstream_retries.get()),
        );
        counter(
            &mut o,
            "zgix_upstream_connects_total",
            "Upstream connections opened.",
            self.sum(|s| s.upstream_connects.get()),
        );
        crate::engine_metrics::render(&mut o, self.shards.iter().map(|s| &s.engine));

        let _ = writeln!(
            o,
            "# HELP zgix_http_responses_total Responses sent to clients, by listener and status class.\n# TYPE zgix_http_responses_total counter"
        );
        for (li, name) in listener_names.iter().enumerate() {
            for class in 0..5 {
                let v = self.sum(|s| s.listeners[li].responses[class].get());
                let _ = writeln!(
                    o,
                    "zgix_http_responses_total{{listener=\"{name}\",class=\"{}xx\"}} {v}",
                    class + 1
                );
            }
        }
        let _ = writeln!(
            o,
            "# HELP zgix_connections_accepted_total Client connections accepted, by listener.\n# TYPE zgix_connections_accepted_total counter"
        );
        for (li, name) in listener_names.iter().enumerate() {
            let v = self.sum(|s| s.listeners[li].connections.get());
            let _ = writeln!(
                o,
                "zgix_connections_accepted_total{{listener=\"{name}\"}} {v}"
            );
        }
        let _ = writeln!(
            o,
            "# HELP zgix_connections_refused_total Client connections closed before any request was read, by reason.\n# TYPE zgix_connections_refused_total counter"
        );
        for why in ConnRefusal::ALL {
            let v = self.sum(|s| s.refused_connections[why as usize].get());
            let _ = writeln!(
                o,
                "zgix_connections_refused_total{{reason=\"{}\"}} {v}",
                why.label()
            );
        }
        let active: i64 = self
            .shards
            .iter()
            .map(|s| s.active_connections.load(Ordering::Relaxed))
            .sum();
        let _ = writeln!(
            o,
            "# HELP zgix_connections_active Client connections open now.\n# TYPE zgix_connections_active gauge\nzgix_connections_active {}",
            active.max(0)
        );
        let _ = writeln!(
            o,
            "# HELP zgix_heap_allocations_total Heap allocations made by shard threads (updated every 100 ms).\n# TYPE zgix_heap_allocations_total counter"
        );
        for (i, s) in self.shards.iter().enumerate() {
            let _ = writeln!(
                o,
                "zgix_heap_allocations_total{{shard=\"{i}\"}} {}",
                s.heap_allocations.load(Ordering::Relaxed)
            );
        }
        let _ = writeln!(
            o,
            "# HELP zgix_upstream_errors_total Upstream failures, by kind.\n# TYPE zgix_upstream_errors_total counter"
        );
        for kind in UpstreamError::ALL {
            let v = self.sum(|s| s.upstream_errors[kind as usize].get());
            let _ = writeln!(
                o,
                "zgix_upstream_errors_total{{kind=\"{}\"}} {v}",
                kind.label()
            );
        }
        let _ = writeln!(
            o,
            "# HELP zgix_table_slots_in_use Admission table slots holding live state.\n# TYPE zgix_table_slots_in_use gauge\nzgix_table_slots_in_use{{table=\"rate\"}} {}\nzgix_table_slots_in_use{{table=\"conn\"}} {}",
            tables.rate_in_use, tables.conn_in_use
        );
        let _ = writeln!(
            o,
            "# HELP zgix_table_slots_capacity Admission table size, fixed at load.\n# TYPE zgix_table_slots_capacity gauge\nzgix_table_slots_capacity{{table=\"rate\"}} {}\nzgix_table_slots_capacity{{table=\"conn\"}} {}",
            tables.rate_capacity, tables.conn_capacity
        );

        let _ = writeln!(
            o,
            "# HELP zgix_request_duration_seconds Time from a complete request head to the end of the response, by listener (folded in once a second).\n# TYPE zgix_request_duration_seconds histogram"
        );
        for (li, name) in listener_names.iter().enumerate() {
            let mut merged = new_latency_histogram();
            for shard in &self.latency {
                let h = shard.lock().unwrap_or_else(|p| p.into_inner());
                let _ = merged.add(&h[li]);
            }
            for le in BUCKETS_S {
                let us = (le * 1_000_000.0) as u64;
                let c: u64 = merged
                    .iter_recorded()
                    .filter(|v| v.value_iterated_to() <= us)
                    .map(|v| v.count_at_value())
                    .sum();
                let _ = writeln!(
                    o,
                    "zgix_request_duration_seconds_bucket{{listener=\"{name}\",le=\"{le}\"}} {c}"
                );
            }
            let total = merged.len();
            let sum_s = merged
                .iter_recorded()
                .map(|v| v.value_iterated_to() as f64 * v.count_at_value() as f64)
                .sum::<f64>()
                / 1_000_000.0;
            let _ = writeln!(
                o,
                "zgix_request_duration_seconds_bucket{{listener=\"{name}\",le=\"+Inf\"}} {total}\nzgix_request_duration_seconds_sum{{listener=\"{name}\"}} {sum_s}\nzgix_request_duration_seconds_count{{listener=\"{name}\"}} {total}"
            );
        }
        o
    }
}
