//! The per-endpoint upstream families of `/metrics` (requests, errors, in flight, connects, time to first byte, health), labelled by cluster and endpoint, and the TLS handshake failures by cluster.

use std::fmt::Write as _;

use crate::observe::decision::UpstreamError;
use crate::upstream::cluster::Upstreams;
use crate::upstream::health::{now_ms, Avail};
use crate::upstream::metrics::TTFB_BUCKETS_US;

/// Every per-endpoint family, labelled `cluster` and `endpoint` (the address
/// as configured). Appended to `/metrics` by the admin endpoint.
pub fn render(up: &Upstreams) -> String {
    let m = &up.upstream_stats;
    let mut o = String::with_capacity(1024 + up.upstreams.len() * 2048);
    m.render_retries(&mut o);
    let labels = |ep: usize| {
        let u = &up.upstreams[ep];
        format!(
            "cluster=\"{}\",endpoint=\"{}\"",
            up.clusters[u.cluster].name, u.label
        )
    };
    let per_endpoint =
        |o: &mut String, name: &str, kind: &str, help: &str, v: &dyn Fn(usize) -> u64| {
            family(o, name, kind, help);
            for ep in 0..up.upstreams.len() {
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
        "1 when an endpoint takes traffic, 0 while ejected, marked down by the active check, unresolved, or drained or disabled through the admin API.",
        &|ep| u64::from(up.upstreams[ep].health.availability(now) != Avail::Down),
    );
    per_endpoint(
        &mut o,
        "zgix_upstream_ejections_total",
        "counter",
        "Passive-health ejections of an endpoint.",
        &|ep| up.upstreams[ep].health.ejections(),
    );
    per_endpoint(
        &mut o,
        "zgix_upstream_resolve_failures_total",
        "counter",
        "Failed lookups of a named endpoint (its last address is kept).",
        &|ep| up.upstreams[ep].addr.resolve_failures(),
    );
    family(
        &mut o,
        "zgix_upstream_endpoint_errors_total",
        "counter",
        "Upstream failures of an endpoint, by kind.",
    );
    for ep in 0..up.upstreams.len() {
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
    per_cluster(&mut o, up);
    per_endpoint(
        &mut o,
        "zgix_upstream_error_log_suppressed_total",
        "counter",
        "Upstream failure lines not written to the error log (at most 10 a second per endpoint).",
        &|ep| {
            up.upstreams[ep]
                .log
                .suppressed_total
                .load(std::sync::atomic::Ordering::Relaxed)
        },
    );
    tls_failures(&mut o, up);
    ttfb(&mut o, up, &labels);
    o
}

/// The families labelled by cluster alone: panic-mode picks and the retry
/// budget's refusals, summed over the shards.
fn per_cluster(o: &mut String, up: &Upstreams) {
    let m = &up.upstream_stats;
    let each = |o: &mut String, name: &str, help: &str, v: &dyn Fn(usize) -> u64| {
        family(o, name, "counter", help);
        for (ci, c) in up.clusters.iter().enumerate() {
            let _ = writeln!(o, "{name}{{cluster=\"{}\"}} {}", c.name, v(ci));
        }
    };
    each(
        o,
        "zgix_upstream_panic_picks_total",
        "Picks made while no endpoint of the cluster was healthy (panic mode: every endpoint is used).",
        &|ci| m.shards.iter().map(|s| s.panic_picks[ci].get()).sum(),
    );
    each(
        o,
        "zgix_upstream_retry_budget_refused_total",
        "Retries not made because the cluster's retry budget (20 % of its requests over 10 s, at least 3) was spent.",
        &|ci| m.shards.iter().map(|s| s.budgets[ci].refused.get()).sum(),
    );
}

/// `zgix_upstream_tls_failures_total{cluster,reason}`: failed handshakes
/// with the origins of each TLS cluster (continued across reloads by the
/// cluster's name).
fn tls_failures(o: &mut String, up: &Upstreams) {
    use crate::upstream::tls::TlsReason;
    family(
        o,
        "zgix_upstream_tls_failures_total",
        "counter",
        "Failed TLS handshakes with the origins of a cluster, by reason (continued across reloads).",
    );
    for c in &up.clusters {
        if c.tls.get().is_none() {
            continue;
        }
        for r in TlsReason::ALL {
            let _ = writeln!(
                o,
                "zgix_upstream_tls_failures_total{{cluster=\"{}\",reason=\"{}\"}} {}",
                c.name,
                r.label(),
                c.tls_failures.get(r)
            );
        }
    }
}

/// `zgix_upstream_ttfb_seconds`: one cumulative histogram per endpoint.
fn ttfb(o: &mut String, up: &Upstreams, labels: &dyn Fn(usize) -> String) {
    let m = &up.upstream_stats;
    family(
        o,
        "zgix_upstream_ttfb_seconds",
        "histogram",
        "Time from sending a request to an endpoint to its first response byte.",
    );
    for ep in 0..up.upstreams.len() {
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
}

fn family(o: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
}
