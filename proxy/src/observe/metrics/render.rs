//! `/metrics`: every family in the Prometheus text exposition format 0.0.4, shards summed on read.

use std::fmt::Write as _;
use std::sync::atomic::Ordering;

use super::{
    new_latency_histogram, Admission, ConnRefusal, Control, Histo, Metrics, ShardCounters,
    TableGauges, UpstreamError, BUCKETS_US, PROBE_DEPTHS, STATUS_CODES,
};
use crate::observe::decision::CLASS_LABELS;

/// Reads one counter of a shard.
type CounterOf = fn(&ShardCounters) -> u64;

/// Label values by index: listener names and cluster names.
/// A certificate's first name and `notAfter` (seconds since the epoch).
pub type CertExpiry = (String, i64);

pub struct Labels<'a> {
    pub listeners: Vec<&'a str>,
    pub clusters: Vec<&'a str>,
    /// By listener: `None` for plaintext (no TLS series), else each
    /// certificate's first name and `notAfter` (seconds since the epoch).
    pub tls: Vec<Option<&'a [CertExpiry]>>,
}

/// The git revision `build.rs` found (`unknown` outside a checkout).
pub const REVISION: &str = env!("ZGIX_GIT_REVISION");

/// A label value with `\`, `"` and newlines escaped (exposition format).
struct Esc<'a>(&'a str);

impl std::fmt::Display for Esc<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for c in self.0.chars() {
            match c {
                '\\' => f.write_str("\\\\")?,
                '"' => f.write_str("\\\"")?,
                '\n' => f.write_str("\\n")?,
                c => f.write_char(c)?,
            }
        }
        Ok(())
    }
}

fn family(o: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

fn seconds(us: u64) -> f64 {
    us as f64 / 1_000_000.0
}

/// Cumulative bucket counts, count and sum (µs) of a histogram summed over shards.
#[derive(Default)]
struct Summed {
    le: [u64; BUCKETS_US.len() + 1],
    count: u64,
    sum_us: u64,
}

impl Summed {
    fn add(&mut self, h: &Histo) {
        for (i, b) in h.buckets.iter().enumerate() {
            self.le[i] += b.get();
        }
        self.count += h.count.get();
        self.sum_us += h.sum_us.get();
    }

    fn write(mut self, o: &mut String, name: &str, labels: &str) {
        for i in 1..self.le.len() {
            self.le[i] += self.le[i - 1];
        }
        for (i, us) in BUCKETS_US.iter().enumerate() {
            let _ = writeln!(
                o,
                "{name}_bucket{{{labels},le=\"{}\"}} {}",
                seconds(*us),
                self.le[i]
            );
        }
        let _ = writeln!(
            o,
            "{name}_bucket{{{labels},le=\"+Inf\"}} {c}\n{name}_sum{{{labels}}} {}\n{name}_count{{{labels}}} {c}",
            seconds(self.sum_us),
            c = self.count,
        );
    }
}

impl Metrics {
    /// The older hdrhistogram latency of `listener`, as fixed buckets.
    fn folded_latency(&self, listener: usize, into: &mut Summed) {
        let mut merged = new_latency_histogram();
        for shard in &self.latency {
            let h = shard.lock().unwrap_or_else(|p| p.into_inner());
            let _ = merged.add(&h[listener]);
        }
        for v in merged.iter_recorded() {
            let us = v.value_iterated_to();
            let i = BUCKETS_US
                .iter()
                .position(|&b| us <= b)
                .unwrap_or(BUCKETS_US.len());
            into.le[i] += v.count_at_value();
            into.count += v.count_at_value();
            into.sum_us += us * v.count_at_value();
        }
    }

    /// Renders every metric in the Prometheus text exposition format 0.0.4.
    pub fn render(&self, names: &Labels<'_>, tables: &TableGauges) -> String {
        let mut o = String::with_capacity(32 << 10);
        let o = &mut o;
        self.render_admission(o, names);
        crate::observe::engine_metrics::render(o, self.shards.iter().map(|s| &s.engine));

        self.render_clients(o, names);
        self.render_upstream_errors(o, names);
        self.render_tables(o, tables);
        self.render_durations(o, names);
        self.render_tls(o, names);
        self.render_h2(o, names);
        self.render_process(o);
        super::process::render(o, self.start_time, tables.max_connections);
        std::mem::take(o)
    }

    /// The admission counters, summed and by listener, and upstream connects.
    fn render_admission(&self, o: &mut String, names: &Labels<'_>) {
        // The admission counters keep the exact names of the specification,
        // summed over listeners. promtool insists a `counter` ends in
        // `_total`, so each is exposed twice: under its exact name as
        // `untyped` (monotonic all the same: rate() works on it) and as the
        // conventional `<name>_total` counter.
        let spec: [(&str, &str, CounterOf); 5] = [
            (
                "zgix_l7_rate_limited",
                "Requests answered 429 by the rate limit.",
                |s| s.rate_limited.get(),
            ),
            (
                "zgix_l7_rate_limit_full",
                "Rate checks that found no free slot within 8 probes and failed open.",
                |s| s.rate_limit_full.get(),
            ),
            (
                "zgix_l7_conn_limited",
                "Requests answered 503 by the connection limit.",
                |s| s.conn_limited.get(),
            ),
            (
                "zgix_l7_conn_limit_full",
                "Connection-limit checks that found no free slot within 8 probes and failed open.",
                |s| s.conn_limit_full.get(),
            ),
            (
                "zgix_l7_waf_blocked",
                "Requests refused by the WAF-lite denylist.",
                |s| s.waf_blocked.get(),
            ),
        ];
        for (name, help, get) in spec {
            let v = self.sum(get);
            family(o, name, "untyped", help);
            let _ = writeln!(o, "{name} {v}");
            counter(o, &format!("{name}_total"), help, v);
        }
        family(
            o,
            "zgix_admission_events_total",
            "counter",
            "The five admission counters by listener (event = the specification's name without zgix_l7_).",
        );
        for (li, name) in names.listeners.iter().enumerate() {
            for ev in Admission::ALL {
                let v = self.sum(|s| s.listeners[li].admission[ev as usize].get());
                let _ = writeln!(
                    o,
                    "zgix_admission_events_total{{listener=\"{}\",event=\"{}\"}} {v}",
                    Esc(name),
                    ev.label()
                );
            }
        }
        counter(
            o,
            "zgix_upstream_connects_total",
            "Upstream connections opened.",
            self.sum(|s| s.upstream_connects.get()),
        );
        family(
            o,
            "zgix_l7_dry_run_total",
            "counter",
            "Requests a dry-run control would have refused (forwarded instead).",
        );
        for (li, name) in names.listeners.iter().enumerate() {
            for c in Control::ALL {
                let v = self.sum(|s| s.listeners[li].dry_run[c as usize].get());
                let _ = writeln!(
                    o,
                    "zgix_l7_dry_run_total{{listener=\"{}\",control=\"{}\"}} {v}",
                    Esc(name),
                    c.label()
                );
            }
        }
    }

    /// Responses by status, client connections (accepted, open, refused,
    /// active) and heap allocations per shard.
    fn render_clients(&self, o: &mut String, names: &Labels<'_>) {
        family(
            o,
            "zgix_http_responses_total",
            "counter",
            "Responses sent to clients, by listener and status code (codes never sent are omitted).",
        );
        for (li, name) in names.listeners.iter().enumerate() {
            for (ci, code) in STATUS_CODES.enumerate() {
                let v = self.sum(|s| s.listeners[li].codes[ci].get());
                if v > 0 {
                    let _ = writeln!(
                        o,
                        "zgix_http_responses_total{{listener=\"{}\",code=\"{code}\"}} {v}",
                        Esc(name)
                    );
                }
            }
        }
        family(
            o,
            "zgix_connections_accepted_total",
            "counter",
            "Client connections accepted, by listener.",
        );
        for (li, name) in names.listeners.iter().enumerate() {
            let v = self.sum(|s| s.listeners[li].connections.get());
            let _ = writeln!(
                o,
                "zgix_connections_accepted_total{{listener=\"{}\"}} {v}",
                Esc(name)
            );
        }
        family(
            o,
            "zgix_connections_open",
            "gauge",
            "Client connections open now, by listener.",
        );
        for (li, name) in names.listeners.iter().enumerate() {
            let v: i64 = self.shards.iter().map(|s| s.listeners[li].open.get()).sum();
            let _ = writeln!(
                o,
                "zgix_connections_open{{listener=\"{}\"}} {}",
                Esc(name),
                v.max(0)
            );
        }
        family(
            o,
            "zgix_connections_refused_total",
            "counter",
            "Client connections closed before any request was read, by reason.",
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
        family(
            o,
            "zgix_connections_active",
            "gauge",
            "Client connections open now, all listeners.",
        );
        let _ = writeln!(o, "zgix_connections_active {}", active.max(0));
        family(
            o,
            "zgix_heap_allocations_total",
            "counter",
            "Heap allocations made by shard threads (updated every 100 ms).",
        );
        for (i, s) in self.shards.iter().enumerate() {
            let _ = writeln!(
                o,
                "zgix_heap_allocations_total{{shard=\"{i}\"}} {}",
                s.heap_allocations.load(Ordering::Relaxed)
            );
        }
    }

    /// Upstream failures by kind, and by cluster and kind.
    fn render_upstream_errors(&self, o: &mut String, names: &Labels<'_>) {
        family(
            o,
            "zgix_upstream_errors_total",
            "counter",
            "Upstream failures, by kind.",
        );
        for kind in UpstreamError::ALL {
            let v = self.sum(|s| s.upstream_errors[kind as usize].get());
            let _ = writeln!(
                o,
                "zgix_upstream_errors_total{{kind=\"{}\"}} {v}",
                kind.label()
            );
        }
        family(
            o,
            "zgix_cluster_upstream_errors_total",
            "counter",
            "Upstream failures, by cluster and kind.",
        );
        for (ci, name) in names.clusters.iter().enumerate() {
            for kind in UpstreamError::ALL {
                let v = self.sum(|s| s.clusters[ci].errors[kind as usize].get());
                let _ = writeln!(
                    o,
                    "zgix_cluster_upstream_errors_total{{cluster=\"{}\",kind=\"{}\"}} {v}",
                    Esc(name),
                    kind.label()
                );
            }
        }
    }

    /// Admission table slots and the access log's line counters.
    fn render_tables(&self, o: &mut String, tables: &TableGauges) {
        family(
            o,
            "zgix_table_slots_in_use",
            "gauge",
            "Admission table slots holding live state.",
        );
        let _ = writeln!(
            o,
            "zgix_table_slots_in_use{{table=\"rate\"}} {}\nzgix_table_slots_in_use{{table=\"conn\"}} {}",
            tables.rate_in_use, tables.conn_in_use
        );
        family(
            o,
            "zgix_table_slots_capacity",
            "gauge",
            "Admission table size, fixed at load.",
        );
        let _ = writeln!(
            o,
            "zgix_table_slots_capacity{{table=\"rate\"}} {}\nzgix_table_slots_capacity{{table=\"conn\"}} {}",
            tables.rate_capacity, tables.conn_capacity
        );
        family(
            o,
            "zgix_table_probe_depth",
            "histogram",
            "Slots probed past an identity's home to find or claim its slot, per table; le=\"+Inf\" minus le=\"7\" found none.",
        );
        type DepthsOf = fn(&ShardCounters) -> &[crate::observe::counter::Counter; PROBE_DEPTHS];
        let depths: [(&str, DepthsOf); 2] = [
            ("rate", |s| &s.rate_probe_depth),
            ("conn", |s| &s.conn_probe_depth),
        ];
        for (table, of) in depths {
            let (mut cum, mut sum) = (0, 0);
            for d in 0..PROBE_DEPTHS {
                let v = self.sum(|s| of(s)[d].get());
                cum += v;
                sum += v * d as u64;
                if d + 1 < PROBE_DEPTHS {
                    let _ = writeln!(
                        o,
                        "zgix_table_probe_depth_bucket{{table=\"{table}\",le=\"{d}\"}} {cum}"
                    );
                }
            }
            let _ = writeln!(
                o,
                "zgix_table_probe_depth_bucket{{table=\"{table}\",le=\"+Inf\"}} {cum}\nzgix_table_probe_depth_sum{{table=\"{table}\"}} {sum}\nzgix_table_probe_depth_count{{table=\"{table}\"}} {cum}"
            );
        }
        counter(
            o,
            "zgix_access_log_lines_total",
            "Access-log lines queued for the writer.",
            self.sum(|s| s.access_log_lines.get()),
        );
        counter(
            o,
            "zgix_access_log_dropped_total",
            "Access-log lines lost: the shard's buffer was full, or the writer could not write them (a full disk, /dev/full).",
            self.sum(|s| s.access_log_dropped.get())
                + crate::observe::access_log::WRITE_DROPPED.load(Ordering::Relaxed),
        );
    }

    /// The request and upstream duration histograms.
    fn render_durations(&self, o: &mut String, names: &Labels<'_>) {
        family(
            o,
            "zgix_request_duration_seconds",
            "histogram",
            "Time from a complete request head to the end of the response, by listener and decision (refusals and filter answers included).",
        );
        for (li, name) in names.listeners.iter().enumerate() {
            for (class, decision) in CLASS_LABELS.iter().enumerate() {
                let mut h = Summed::default();
                for s in &self.shards {
                    h.add(&s.listeners[li].duration[class]);
                }
                if class == 0 {
                    self.folded_latency(li, &mut h);
                }
                let labels = format!("listener=\"{}\",decision=\"{decision}\"", Esc(name));
                h.write(o, "zgix_request_duration_seconds", &labels);
            }
        }
        family(
            o,
            "zgix_upstream_duration_seconds",
            "histogram",
            "Time from the request head written upstream to the response head read, by cluster.",
        );
        for (ci, name) in names.clusters.iter().enumerate() {
            let mut h = Summed::default();
            for s in &self.shards {
                h.add(&s.clusters[ci].upstream_time);
            }
            h.write(
                o,
                "zgix_upstream_duration_seconds",
                &format!("cluster=\"{}\"", Esc(name)),
            );
        }
    }

    /// The HTTP/2 series, by listener.
    fn render_h2(&self, o: &mut String, names: &Labels<'_>) {
        family(
            o,
            "zgix_h2_connections_total",
            "counter",
            "HTTP/2 connections (ALPN h2, or prior knowledge), by listener.",
        );
        for (li, name) in names.listeners.iter().enumerate() {
            let n = self.sum(|s| s.listeners[li].h2_connections.get());
            let _ = writeln!(
                o,
                "zgix_h2_connections_total{{listener=\"{}\"}} {n}",
                Esc(name)
            );
        }
        family(
            o,
            "zgix_h2_streams_total",
            "counter",
            "HTTP/2 streams accepted (each one request), by listener.",
        );
        for (li, name) in names.listeners.iter().enumerate() {
            let n = self.sum(|s| s.listeners[li].h2_streams.get());
            let _ = writeln!(o, "zgix_h2_streams_total{{listener=\"{}\"}} {n}", Esc(name));
        }
        family(
            o,
            "zgix_h2_refused_total",
            "counter",
            "HTTP/2 connections ended or streams reset for misbehaviour, by listener and reason.",
        );
        for (li, name) in names.listeners.iter().enumerate() {
            for (r, reason) in super::H2_REFUSALS.iter().enumerate() {
                let n = self.sum(|s| s.listeners[li].h2_refused[r].get());
                let _ = writeln!(
                    o,
                    "zgix_h2_refused_total{{listener=\"{}\",reason=\"{reason}\"}} {n}",
                    Esc(name)
                );
            }
        }
    }

    /// The TLS series of the listeners that terminate TLS.
    fn render_tls(&self, o: &mut String, names: &Labels<'_>) {
        let tls: Vec<(usize, &str, &[CertExpiry])> = names
            .listeners
            .iter()
            .enumerate()
            .filter_map(|(li, n)| Some((li, *n, (*names.tls.get(li)?)?)))
            .collect();
        if tls.is_empty() {
            return;
        }
        family(
            o,
            "zgix_tls_handshakes_total",
            "counter",
            "TLS handshakes by listener, outcome and negotiated version (none when it failed).",
        );
        for &(li, name, _) in &tls {
            for (r, result) in super::TLS_RESULTS.iter().enumerate() {
                for (v, version) in super::TLS_VERSIONS.iter().enumerate() {
                    // Only ok handshakes have a version; failed ones none.
                    if (r == 0) == (v == 0) {
                        continue;
                    }
                    let n = self.sum(|s| s.listeners[li].tls_handshakes[r][v].get());
                    let _ = writeln!(
                        o,
                        "zgix_tls_handshakes_total{{listener=\"{}\",result=\"{result}\",version=\"{version}\"}} {n}",
                        Esc(name)
                    );
                }
            }
        }
        family(
            o,
            "zgix_tls_resumed_total",
            "counter",
            "TLS handshakes that resumed a session from a ticket, by listener.",
        );
        for &(li, name, _) in &tls {
            let n = self.sum(|s| s.listeners[li].tls_resumed.get());
            let _ = writeln!(
                o,
                "zgix_tls_resumed_total{{listener=\"{}\"}} {n}",
                Esc(name)
            );
        }
        family(
            o,
            "zgix_tls_handshake_seconds",
            "histogram",
            "Time from a connection's first ClientHello byte to the end of its TLS handshake, by listener.",
        );
        for &(li, name, _) in &tls {
            let mut h = Summed::default();
            for s in &self.shards {
                h.add(&s.listeners[li].tls_handshake_time);
            }
            h.write(
                o,
                "zgix_tls_handshake_seconds",
                &format!("listener=\"{}\"", Esc(name)),
            );
        }
        family(
            o,
            "zgix_tls_certificate_expiry_seconds",
            "gauge",
            "A listener certificate's notAfter, in seconds since the epoch, by listener and the certificate's first name.",
        );
        for &(_, name, certs) in &tls {
            for (cert, not_after) in certs {
                let _ = writeln!(
                    o,
                    "zgix_tls_certificate_expiry_seconds{{listener=\"{}\",name=\"{}\"}} {not_after}",
                    Esc(name),
                    Esc(cert)
                );
            }
        }
    }

    /// Build and process identity.
    fn render_process(&self, o: &mut String) {
        family(
            o,
            "zgix_build_info",
            "gauge",
            "Always 1; the labels name the running build.",
        );
        let _ = writeln!(
            o,
            "zgix_build_info{{version=\"{}\",revision=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION"),
            Esc(REVISION)
        );
    }
}

/// One unlabelled counter family.
fn counter(o: &mut String, name: &str, help: &str, v: u64) {
    family(o, name, "counter", help);
    let _ = writeln!(o, "{name} {v}");
}
