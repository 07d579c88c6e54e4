//! Cluster rules: endpoints (address or name, weight, uniqueness), health checks, retries, re-resolution, TLS to the origins.

use std::collections::HashMap;

use super::{is_cluster_name, Validator, MAX_CLUSTER_NAME_BYTES};
use crate::limits::{MAX_TIMEOUT_MS, MIN_TIMEOUT_MS};
use crate::model::Cluster;
use crate::upstream::*;

/// RFC 1123 §2.1 host name: dot-separated labels of letters, digits and
/// hyphens (`_` too, as resolvers accept it), at most 253 bytes.
fn is_dns_name(s: &str) -> bool {
    (1..=253).contains(&s.len())
        && s.split('.').all(|label| {
            (1..=63).contains(&label.len())
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

/// Longest active-check path or Host value.
const MAX_PROBE_FIELD_BYTES: usize = 1024;

impl Validator<'_> {
    pub(super) fn clusters(&mut self) {
        for (name, cluster) in &self.config.clusters {
            let path = crate::load::key_path("clusters", name);
            if !is_cluster_name(name) {
                self.err(
                    &path,
                    format!(
                        "cluster names must be 1 to {MAX_CLUSTER_NAME_BYTES} characters from A-Z a-z 0-9 _ . -"
                    ),
                );
            }
            self.cluster(&path, cluster);
        }
    }

    fn cluster(&mut self, path: &str, cluster: &Cluster) {
        let n = cluster.endpoints.len();
        if n == 0 {
            self.err(
                format!("{path}.endpoints"),
                "must list at least one endpoint",
            );
        } else if n > MAX_CLUSTER_ENDPOINTS {
            self.err(
                format!("{path}.endpoints"),
                format!("must list at most {MAX_CLUSTER_ENDPOINTS} endpoints, got {n}"),
            );
        }
        let mut seen: HashMap<Target, usize> = HashMap::new();
        let mut names = 0;
        for (i, ep) in cluster.endpoints.iter().enumerate() {
            let p = format!("{path}.endpoints[{i}]");
            if ep.weight != DEFAULT_ENDPOINT_WEIGHT {
                self.range(&format!("{p}.weight"), ep.weight, 1, MAX_ENDPOINT_WEIGHT);
            }
            let target = match ep.target() {
                Ok(t) => t,
                Err(rule) => {
                    self.err(&p, rule);
                    continue;
                }
            };
            match &target {
                Target::Ip(a) => {
                    if a.port() == 0 {
                        self.err(&p, format!("{a}: port 0 cannot be connected to"));
                    }
                    if a.ip().is_unspecified() {
                        self.err(&p, format!("{a}: {} is not a destination address", a.ip()));
                    }
                }
                Target::Name { port, .. } => {
                    names += 1;
                    if *port == 0 {
                        self.err(&p, format!("{target}: port 0 cannot be connected to"));
                    }
                }
            }
            if let Some(&first) = seen.get(&target) {
                self.err(&p, format!("{target} is already endpoints[{first}]"));
            } else {
                seen.insert(target, i);
            }
        }
        self.range(&format!("{path}.retries"), cluster.retries, 0, MAX_RETRIES);
        self.retry_policy(path, cluster);
        if let Some(ms) = cluster.resolve_ms {
            let p = format!("{path}.resolve_ms");
            self.range(&p, ms, MIN_RESOLVE_MS, MAX_RESOLVE_MS);
            if names == 0 && n > 0 {
                self.err(
                    &p,
                    "has no effect: every endpoint is an IP address; remove it",
                );
            }
        }
        if let Some(passive) = &cluster.health.passive {
            self.passive(&format!("{path}.health.passive"), passive);
        }
        if let Some(active) = &cluster.health.active {
            self.active(&format!("{path}.health.active"), active);
        }
        if let Some(tls) = &cluster.tls {
            self.upstream_tls(&format!("{path}.tls"), tls);
        }
    }

    /// `clusters.NAME.timeouts` and `retry_on`.
    fn retry_policy(&mut self, path: &str, cluster: &Cluster) {
        let t = &cluster.timeouts;
        for (name, v) in [
            ("connect_ms", t.connect_ms),
            ("header_ms", t.header_ms),
            ("idle_ms", t.idle_ms),
        ] {
            if let Some(v) = v {
                let p = format!("{path}.timeouts.{name}");
                self.range(&p, v, MIN_TIMEOUT_MS, MAX_TIMEOUT_MS);
            }
        }
        let mut seen = 0u8;
        for (i, r) in cluster.retry_on.iter().enumerate() {
            if seen & r.bit() != 0 {
                let v = serde_json::to_value(r).unwrap_or_default();
                self.err(
                    format!("{path}.retry_on[{i}]"),
                    format!("{v} is listed twice"),
                );
            }
            seen |= r.bit();
        }
        if cluster.retries == 0 && cluster.retry_on != default_retry_on() {
            self.err(
                format!("{path}.retry_on"),
                "has no effect with \"retries\": 0; remove one of them",
            );
        }
    }

    /// `clusters.NAME.tls`: what can be checked without reading the CA file
    /// (zgix reads it at `--check`, start and reload, with the same path).
    fn upstream_tls(&mut self, path: &str, t: &UpstreamTls) {
        if let Some(name) = &t.server_name {
            let p = format!("{path}.server_name");
            if name.parse::<std::net::IpAddr>().is_err() && !is_dns_name(name) {
                self.err(
                    &p,
                    format!(
                        "{name:?} is neither a DNS name (letters, digits, '-', '_' and '.', at most 253 bytes) nor an IP address"
                    ),
                );
            }
        }
        if let Some(ca) = &t.ca {
            let p = format!("{path}.ca");
            if ca.is_empty() {
                self.err(&p, "must be the path of a PEM file of CA certificates");
            } else if ca.contains('\0') {
                self.err(&p, "must not contain NUL");
            } else if !t.verify {
                self.err(
                    &p,
                    "has no effect with \"verify\": false (no certificate is checked); remove one of them",
                );
            }
        }
    }

    fn passive(&mut self, path: &str, p: &Passive) {
        self.range(
            &format!("{path}.failures"),
            p.failures,
            1,
            MAX_PASSIVE_FAILURES,
        );
        self.range(
            &format!("{path}.ejection_ms"),
            p.ejection_ms,
            MIN_TIMEOUT_MS,
            MAX_TIMEOUT_MS,
        );
        // An ejection never shrinks below its first length.
        self.range(
            &format!("{path}.max_ejection_ms"),
            p.max_ejection_ms,
            p.ejection_ms.clamp(MIN_TIMEOUT_MS, MAX_TIMEOUT_MS),
            MAX_TIMEOUT_MS,
        );
    }

    fn active(&mut self, path: &str, a: &Active) {
        let p = format!("{path}.path");
        // RFC 9112 §3.2.1: origin-form is an absolute path and an optional query.
        if !a.path.starts_with('/') {
            self.err(&p, format!("{:?} must start with '/'", a.path));
        } else if a.path.len() > MAX_PROBE_FIELD_BYTES {
            self.err(
                &p,
                format!(
                    "must be at most {MAX_PROBE_FIELD_BYTES} bytes long, got {}",
                    a.path.len()
                ),
            );
        } else if a.path.bytes().any(|b| !b.is_ascii_graphic() || b == b'#') {
            self.err(
                &p,
                format!(
                    "{:?} must be printable ASCII without spaces or '#'; percent-encode anything else",
                    a.path
                ),
            );
        }
        if let Some(host) = &a.host {
            // RFC 9110 §7.2: Host is uri-host [":" port], no whitespace.
            if host.is_empty()
                || host.len() > MAX_PROBE_FIELD_BYTES
                || host.bytes().any(|b| !b.is_ascii_graphic())
            {
                self.err(
                    format!("{path}.host"),
                    format!(
                        "{host:?} must be 1 to {MAX_PROBE_FIELD_BYTES} printable ASCII characters without spaces"
                    ),
                );
            }
        }
        self.range(
            &format!("{path}.interval_ms"),
            a.interval_ms,
            MIN_ACTIVE_INTERVAL_MS,
            MAX_TIMEOUT_MS,
        );
        // A probe that could outlive its interval would overlap the next one.
        self.range(
            &format!("{path}.timeout_ms"),
            a.timeout_ms,
            MIN_TIMEOUT_MS,
            a.interval_ms.clamp(MIN_TIMEOUT_MS, MAX_TIMEOUT_MS),
        );
        self.range(
            &format!("{path}.healthy"),
            a.healthy,
            1,
            MAX_ACTIVE_THRESHOLD,
        );
        self.range(
            &format!("{path}.unhealthy"),
            a.unhealthy,
            1,
            MAX_ACTIVE_THRESHOLD,
        );
        let p = format!("{path}.expect_status");
        let n = a.expect_status.len();
        if !(1..=MAX_EXPECT_STATUSES).contains(&n) {
            self.err(
                &p,
                format!("must list between 1 and {MAX_EXPECT_STATUSES} statuses, got {n}"),
            );
        }
        for (i, &s) in a.expect_status.iter().enumerate() {
            self.range(&format!("{p}[{i}]"), s, 200, 599);
        }
    }
}
