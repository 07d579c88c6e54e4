//! A cluster's upstream side: endpoints (address or name, weight), passive and active health, retries, TLS to the origins.

use std::fmt;
use std::net::SocketAddr;

use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Weight of an endpoint written as a bare string.
pub const DEFAULT_ENDPOINT_WEIGHT: u32 = 1;
/// Largest endpoint weight. Weights are relative; 1000 expresses a 0.1 % share,
/// finer than any origin fleet is sized, and keeps weight × in-flight products
/// of `least_conn` far from overflow.
pub const MAX_ENDPOINT_WEIGHT: u32 = 1000;
/// Most endpoints in one cluster: the balancer keeps a tried-set of this many
/// bits on the stack while it picks, so a retry never allocates.
pub const MAX_CLUSTER_ENDPOINTS: usize = 256;
/// One retry: a dead endpoint costs no client-visible error in a cluster of two
/// (nginx's `proxy_next_upstream` tries every server; HAProxy's `retries` is 3
/// on the same server with `redispatch` to another one).
pub const DEFAULT_RETRIES: u32 = 1;
/// Most retries: past five, a request waits through five connect timeouts.
pub const MAX_RETRIES: u32 = 5;
/// Shortest `resolve_ms`: re-resolving more often than once a second only loads
/// the resolver; DNS TTLs are rarely below that.
pub const MIN_RESOLVE_MS: u64 = 1_000;
/// Longest `resolve_ms`: one day.
pub const MAX_RESOLVE_MS: u64 = 86_400_000;

/// Three consecutive failures: one lost packet or one restart of a worker does
/// not eject, a dead endpoint costs three errors (nginx `max_fails` is 1,
/// Envoy's `consecutive_5xx` is 5).
pub const DEFAULT_PASSIVE_FAILURES: u32 = 3;
/// 10 s first ejection: long enough to stop hammering a restarting origin,
/// short enough that a recovered one is back quickly (nginx `fail_timeout`).
pub const DEFAULT_EJECTION_MS: u64 = 10_000;
/// Ejections double up to 5 minutes for an endpoint that keeps failing its trial.
pub const DEFAULT_MAX_EJECTION_MS: u64 = 300_000;
/// Most consecutive failures accepted as a threshold.
pub const MAX_PASSIVE_FAILURES: u32 = 1000;

/// Probe every 2 s.
pub const DEFAULT_ACTIVE_INTERVAL_MS: u64 = 2_000;
/// A probe answer later than 1 s counts as a failure.
pub const DEFAULT_ACTIVE_TIMEOUT_MS: u64 = 1_000;
/// Two good probes bring an endpoint back (HAProxy `rise 2`).
pub const DEFAULT_ACTIVE_HEALTHY: u32 = 2;
/// Three bad probes take it out (HAProxy `fall 3`).
pub const DEFAULT_ACTIVE_UNHEALTHY: u32 = 3;
/// Shortest probe interval: 100 ms.
pub const MIN_ACTIVE_INTERVAL_MS: u64 = 100;
/// Most consecutive probes a threshold may ask for.
pub const MAX_ACTIVE_THRESHOLD: u32 = 100;
/// Most statuses in `expect_status`.
pub const MAX_EXPECT_STATUSES: usize = 16;

/// One endpoint: an address (`10.0.0.1:80`, `[2001:db8::1]:80`) or a name
/// (`origin.internal:80`) and its weight.
///
/// In JSON either a bare string (weight 1) or `{"address": ..., "weight": ...}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// `ip:port`, `[ipv6]:port` or `host:port`, as written.
    pub address: String,
    /// Relative share of requests; 1..=[`MAX_ENDPOINT_WEIGHT`].
    pub weight: u32,
}

/// Where an endpoint's address points, once parsed.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Target {
    /// An IP literal with its port.
    Ip(SocketAddr),
    /// A DNS name and port, resolved at load and every `resolve_ms`.
    Name {
        /// The name, lower-cased.
        host: String,
        /// The port, 1..=65535.
        port: u16,
    },
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Ip(a) => a.fmt(f),
            Target::Name { host, port } => write!(f, "{host}:{port}"),
        }
    }
}

impl Endpoint {
    /// An endpoint of weight 1.
    pub fn new(address: impl Into<String>) -> Endpoint {
        Endpoint {
            address: address.into(),
            weight: DEFAULT_ENDPOINT_WEIGHT,
        }
    }

    /// Parses [`Endpoint::address`]: an IP socket address, else `host:port`
    /// with a DNS name (RFC 1123 §2.1 letters, digits, hyphens, dots; `_` too,
    /// as resolvers accept it). The error names what is wrong.
    pub fn target(&self) -> Result<Target, String> {
        let s = self.address.as_str();
        if let Ok(a) = s.parse::<SocketAddr>() {
            return Ok(Target::Ip(a));
        }
        let Some((host, port)) = s.rsplit_once(':') else {
            return Err(format!(
                "{s:?} has no port: write ip:port or host:port, such as \"10.0.0.1:80\" or \"origin.internal:80\""
            ));
        };
        if host.contains(':') || host.starts_with('[') {
            return Err(format!(
                "{s:?} is not an address: write an IPv6 address in brackets, such as \"[2001:db8::1]:80\""
            ));
        }
        let port: u16 = port
            .parse()
            .map_err(|_| format!("{s:?}: the port must be a number from 1 to 65535"))?;
        let valid_name = (1..=253).contains(&host.len())
            && host.split('.').all(|label| {
                (1..=63).contains(&label.len())
                    && !label.starts_with('-')
                    && !label.ends_with('-')
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            });
        if !valid_name {
            return Err(format!(
                "{s:?} is neither an IP address nor a host name (letters, digits, '-', '_' and '.')"
            ));
        }
        Ok(Target::Name {
            host: host.to_ascii_lowercase(),
            port,
        })
    }
}

/// The object form of an endpoint.
#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct EndpointObject {
    address: String,
    #[serde(default = "d_weight")]
    weight: u32,
}

fn d_weight() -> u32 {
    DEFAULT_ENDPOINT_WEIGHT
}

impl<'de> Deserialize<'de> for Endpoint {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Endpoint, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Endpoint;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "an address string such as \"10.0.0.1:80\" or an object {\"address\": ..., \"weight\": ...}",
                )
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Endpoint, E> {
                Ok(Endpoint::new(s))
            }
            fn visit_map<A: MapAccess<'de>>(self, m: A) -> Result<Endpoint, A::Error> {
                let o = EndpointObject::deserialize(de::value::MapAccessDeserializer::new(m))?;
                Ok(Endpoint {
                    address: o.address,
                    weight: o.weight,
                })
            }
        }
        d.deserialize_any(V)
    }
}

impl Serialize for Endpoint {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.weight == DEFAULT_ENDPOINT_WEIGHT {
            s.serialize_str(&self.address)
        } else {
            EndpointObject {
                address: self.address.clone(),
                weight: self.weight,
            }
            .serialize(s)
        }
    }
}

/// `clusters.NAME.health`: passive (on by default) and active (opt-in) checks.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Health {
    /// Ejection on consecutive request failures; `null` turns it off.
    #[serde(default = "d_passive")]
    pub passive: Option<Passive>,
    /// Periodic HTTP probes; off unless given.
    #[serde(default)]
    pub active: Option<Active>,
}

impl Default for Health {
    fn default() -> Health {
        Health {
            passive: d_passive(),
            active: None,
        }
    }
}

fn d_passive() -> Option<Passive> {
    Some(Passive::default())
}

/// Passive health: `failures` consecutive failures eject an endpoint for
/// `ejection_ms`, doubled on each ejection that follows a failed trial, up to
/// `max_ejection_ms`; then one trial request decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Passive {
    /// Consecutive failures that eject; 1..=[`MAX_PASSIVE_FAILURES`].
    #[serde(default = "d_failures")]
    pub failures: u32,
    /// First ejection length.
    #[serde(default = "d_ejection_ms")]
    pub ejection_ms: u64,
    /// Longest ejection; at least `ejection_ms`.
    #[serde(default = "d_max_ejection_ms")]
    pub max_ejection_ms: u64,
    /// Whether a 5xx response counts as a failure.
    #[serde(default)]
    pub on_5xx: bool,
}

impl Default for Passive {
    fn default() -> Passive {
        Passive {
            failures: DEFAULT_PASSIVE_FAILURES,
            ejection_ms: DEFAULT_EJECTION_MS,
            max_ejection_ms: DEFAULT_MAX_EJECTION_MS,
            on_5xx: false,
        }
    }
}

fn d_failures() -> u32 {
    DEFAULT_PASSIVE_FAILURES
}
fn d_ejection_ms() -> u64 {
    DEFAULT_EJECTION_MS
}
fn d_max_ejection_ms() -> u64 {
    DEFAULT_MAX_EJECTION_MS
}

/// Active health: `GET path` with `Host: host` to every endpoint every
/// `interval_ms`, from one shard; `unhealthy` consecutive bad answers mark it
/// down, `healthy` good ones bring it back.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Active {
    /// Request target in origin form (`/healthz`, `/status?full=1`).
    pub path: String,
    /// Host header; default: the endpoint's address as written.
    #[serde(default)]
    pub host: Option<String>,
    /// Time between probes of one endpoint.
    #[serde(default = "d_interval_ms")]
    pub interval_ms: u64,
    /// Deadline for connect plus the status line; at most `interval_ms`.
    #[serde(default = "d_timeout_ms")]
    pub timeout_ms: u64,
    /// Consecutive good probes that bring a down endpoint back.
    #[serde(default = "d_healthy")]
    pub healthy: u32,
    /// Consecutive bad probes that mark an endpoint down.
    #[serde(default = "d_unhealthy")]
    pub unhealthy: u32,
    /// Statuses that count as good.
    #[serde(default = "d_expect_status")]
    pub expect_status: Vec<u16>,
}

fn d_interval_ms() -> u64 {
    DEFAULT_ACTIVE_INTERVAL_MS
}
fn d_timeout_ms() -> u64 {
    DEFAULT_ACTIVE_TIMEOUT_MS
}
fn d_healthy() -> u32 {
    DEFAULT_ACTIVE_HEALTHY
}
fn d_unhealthy() -> u32 {
    DEFAULT_ACTIVE_UNHEALTHY
}
fn d_expect_status() -> Vec<u16> {
    vec![200]
}

/// `clusters.NAME.tls`: connect to the endpoints over TLS (1.2 or 1.3).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamTls {
    /// The name sent as SNI and checked against the origin's certificate;
    /// default: the endpoint's host name, or its IP address (checked
    /// against the certificate's IP SANs, and no SNI).
    #[serde(default)]
    pub server_name: Option<String>,
    /// PEM file of the CA certificates trusted for the origins; default:
    /// the system's roots.
    #[serde(default)]
    pub ca: Option<String>,
    /// `false` accepts any certificate (logged as a warning at start and
    /// reload); only when written out.
    #[serde(default = "d_verify")]
    pub verify: bool,
}

fn d_verify() -> bool {
    true
}

/// `clusters.NAME.timeouts`: the cluster's own upstream timeouts; an omitted
/// one is the global `limits.upstream_*_timeout_ms`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterTimeouts {
    /// Connect (and TLS handshake) to one endpoint.
    #[serde(default)]
    pub connect_ms: Option<u64>,
    /// From the request sent to the response head.
    #[serde(default)]
    pub header_ms: Option<u64>,
    /// Between two reads or writes of a body.
    #[serde(default)]
    pub idle_ms: Option<u64>,
}

/// A failure after which `clusters.NAME.retry_on` sends a request to another endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize)]
pub enum RetryOn {
    /// The connect failed: nothing was sent, so any request.
    #[serde(rename = "connect")]
    Connect,
    /// Reset or closed before any response byte.
    #[serde(rename = "reset")]
    Reset,
    /// No response head within the header timeout.
    #[serde(rename = "timeout")]
    Timeout,
    /// The origin answered 502.
    #[serde(rename = "502")]
    S502,
    /// The origin answered 503.
    #[serde(rename = "503")]
    S503,
    /// The origin answered 504.
    #[serde(rename = "504")]
    S504,
}

impl RetryOn {
    /// Its bit in a set of them.
    pub fn bit(self) -> u8 {
        1 << self as u8
    }

    /// The bits of the statuses.
    pub const STATUSES: u8 = 0b111 << RetryOn::S502 as u8;

    /// The bit of a response status, 0 for one that is never retried.
    pub fn status_bit(status: u16) -> u8 {
        match status {
            502 => RetryOn::S502.bit(),
            503 => RetryOn::S503.bit(),
            504 => RetryOn::S504.bit(),
            _ => 0,
        }
    }
}

/// serde default for `Cluster::retry_on`: connect failures and resets
/// before any response byte (a header timeout is not retried: the origin has
/// the request and may still act on it).
pub fn default_retry_on() -> Vec<RetryOn> {
    vec![RetryOn::Connect, RetryOn::Reset]
}

/// serde default for `Cluster::retries`.
pub fn default_retries() -> u32 {
    DEFAULT_RETRIES
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Result<Target, String> {
        Endpoint::new(s).target()
    }

    #[test]
    fn targets_parse() {
        assert_eq!(
            t("10.0.0.1:80"),
            Ok(Target::Ip("10.0.0.1:80".parse().unwrap()))
        );
        assert_eq!(
            t("[::1]:8080"),
            Ok(Target::Ip("[::1]:8080".parse().unwrap()))
        );
        assert_eq!(
            t("Origin.Internal:8080"),
            Ok(Target::Name {
                host: "origin.internal".into(),
                port: 8080
            })
        );
        assert_eq!(
            t("origin.internal:8080").unwrap().to_string(),
            "origin.internal:8080"
        );
        assert!(t("origin").unwrap_err().contains("has no port"));
        assert!(t("::1:80").unwrap_err().contains("in brackets"));
        assert!(t("a:99999").unwrap_err().contains("from 1 to 65535"));
        assert!(t("a b:80").unwrap_err().contains("neither an IP"));
        assert!(t("-a.b:80").unwrap_err().contains("neither an IP"));
        assert!(t("a..b:80").unwrap_err().contains("neither an IP"));
        assert!(t(":80").unwrap_err().contains("neither an IP"));
    }

    #[test]
    fn endpoint_string_or_object_round_trips() {
        let v: Vec<Endpoint> = serde_json::from_str(
            r#"["10.0.0.1:80", {"address": "b:80", "weight": 3}, {"address": "c:1"}]"#,
        )
        .unwrap();
        assert_eq!(v[0], Endpoint::new("10.0.0.1:80"));
        assert_eq!(v[1].weight, 3);
        assert_eq!(v[2].weight, 1);
        assert_eq!(
            serde_json::to_string(&v).unwrap(),
            r#"["10.0.0.1:80",{"address":"b:80","weight":3},"c:1"]"#
        );
        let e = serde_json::from_str::<Vec<Endpoint>>("[7]").unwrap_err();
        assert!(e.to_string().contains("an address string"), "{e}");
    }
}
