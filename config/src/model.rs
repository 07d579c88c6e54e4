//! The config document's shape: listeners, their admission controls, clusters.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::filter::RequestFilter;
use crate::limits::Limits;
use crate::upstream::{
    default_retries, default_retry_on, ClusterTimeouts, Endpoint, Health, RetryOn, UpstreamTls,
};
use crate::via::Via;

/// The whole config document.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// CPUs to run one shard on each; `None` means every available CPU
    /// (see [`Config::shard_cpus`]).
    #[serde(default)]
    pub cpus: Option<Vec<usize>>,
    /// Admin/metrics HTTP endpoint; `None` disables it.
    #[serde(default)]
    pub admin: Option<Admin>,
    /// Listening sockets; at least one.
    pub listeners: Vec<Listener>,
    /// Upstream clusters by name.
    pub clusters: BTreeMap<String, Cluster>,
    /// Global size and time limits.
    #[serde(default)]
    pub limits: Limits,
    /// The socket driver and its buffers.
    #[serde(default)]
    pub io: crate::io::Io,
    /// The name in the Via field added to forwarded requests and responses, or off.
    #[serde(default)]
    pub via: Via,
    /// One line per request; `None` (absent) turns the access log off.
    #[serde(default)]
    pub access_log: Option<AccessLog>,
    /// The `Server` field on responses zgix writes itself: a product name, or
    /// `false` for none. Absent means [`DEFAULT_SERVER_HEADER`].
    #[serde(default)]
    pub server_header: Option<ServerHeader>,
    /// The Redis a fleet of processes sums rate-limit spending through; needed by
    /// `"scope": "fleet"`.
    #[serde(default)]
    pub fleet: Option<crate::admission::Fleet>,
}

/// One listening socket and what it serves.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Listener {
    /// Address to listen on; port 0 asks the kernel for a free port.
    pub bind: SocketAddr,
    /// Expect a PROXY protocol header before the first request and use its
    /// source address as the client's address.
    #[serde(default)]
    pub proxy_protocol: bool,
    /// CIDR allow/deny lists checked before any request is read.
    #[serde(default)]
    pub clients: Option<ClientFilter>,
    /// TLS termination: absent means plaintext HTTP/1.1.
    #[serde(default)]
    pub tls: Option<crate::tls::ListenerTls>,
    /// HTTP/2 settings (spoken when ALPN picks `h2`, or with `prior_knowledge`).
    #[serde(default)]
    pub http2: crate::http2::Http2,
    /// HTTP/1.1 proxying settings.
    pub http: HttpListener,
    /// Name in metric labels and log lines; absent means the bind address
    /// (see [`Config::listener_names`]).
    #[serde(default)]
    pub name: Option<String>,
    /// `false` keeps this listener's requests out of the access log.
    #[serde(default = "default_true")]
    pub access_log: bool,
}

fn default_true() -> bool {
    true
}

/// Listener-level CIDR filter on the client's address.
///
/// A client matching any `deny` entry is refused; otherwise, if `allow` is
/// non-empty, the client must match one of its entries. IPv6 entries are at most
/// /64 long because a client's identity is its IPv6 /64.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ClientFilter {
    /// If non-empty, only these networks are served.
    #[serde(default)]
    pub allow: Vec<IpNet>,
    /// These networks are never served; deny wins over allow.
    #[serde(default)]
    pub deny: Vec<IpNet>,
}

/// The HTTP side of a listener: default cluster, admission controls, filters.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HttpListener {
    /// Cluster a request goes to unless a `route` filter says otherwise.
    pub cluster: String,
    /// Per-client token bucket; `None` disables rate limiting.
    #[serde(default)]
    pub rate_limit: Option<RateLimit>,
    /// Per-client concurrent connection cap; `None` disables it.
    #[serde(default)]
    pub conn_limit: Option<ConnLimit>,
    /// Literal denylist over the request head; `None` disables it.
    #[serde(default)]
    pub waf: Option<Waf>,
    /// Ordered request filters, walked after the admission controls.
    #[serde(default)]
    pub request_filters: Vec<RequestFilter>,
    /// `X-Request-ID`: `"generate"` (default), `"replace"` or `false`.
    #[serde(default)]
    pub request_id: crate::RequestIdMode,
    /// Add an RFC 7239 `Forwarded: for=…;proto=…;host=…` field (default off).
    #[serde(default)]
    pub forwarded: bool,
}

/// Largest `requests` and `burst`: one billion tokens.
///
/// The refill arithmetic multiplies a token count by an elapsed time in
/// milliseconds bounded by `window_ms`; 10^9 × 8.64×10^7 ≈ 8.6×10^16 stays far
/// below `u64::MAX` (≈1.8×10^19), even scaled by 100 for fixed-point tokens.
pub const MAX_RATE_LIMIT_TOKENS: u64 = 1_000_000_000;
/// Longest `window_ms`: one day. Longer windows are quota accounting, not rate
/// limiting, and would not survive a restart anyway.
pub const MAX_RATE_LIMIT_WINDOW_MS: u64 = 86_400_000;

/// Token bucket: `requests` tokens are refilled evenly over every `window_ms`,
/// and the bucket holds at most `burst` tokens.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimit {
    /// Tokens added per window; 1..=[`MAX_RATE_LIMIT_TOKENS`].
    pub requests: u64,
    /// Window length in milliseconds; 1..=[`MAX_RATE_LIMIT_WINDOW_MS`].
    pub window_ms: u64,
    /// Bucket capacity (and the starting fill); 1..=[`MAX_RATE_LIMIT_TOKENS`].
    pub burst: u64,
    /// `"box"` (this process) or `"fleet"` (summed through `fleet.redis`).
    #[serde(default)]
    pub scope: crate::admission::RateScope,
    /// `"address"` or `{"header": name}`.
    #[serde(default)]
    pub key: crate::admission::RateKey,
    /// Count and log what would be refused, forward it anyway.
    #[serde(default)]
    pub dry_run: bool,
    /// Response header fields telling the client its quota; `None` writes none.
    #[serde(default)]
    pub headers: Option<crate::admission::RateHeaders>,
}

/// Per-client cap on connections held at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ConnLimit {
    /// Connections one client identity may hold; at least 1.
    pub max: u32,
    /// Count and log what would be refused, forward it anyway.
    #[serde(default)]
    pub dry_run: bool,
}

/// Default WAF status: 403 Forbidden says "refused by policy" without implying
/// the client can fix the request (400) or hiding that something matched (404).
pub const DEFAULT_WAF_STATUS: u16 = 403;
/// Statuses a WAF hit may be answered with.
pub const WAF_STATUSES: [u16; 4] = [400, 403, 404, 429];
/// Most literals in one WAF denylist. The matcher is built once at load; 64
/// keeps it small and keeps the list reviewable by a human.
pub const MAX_WAF_LITERALS: usize = 64;
/// Longest WAF literal in bytes. Attack markers are short; a long literal is
/// almost always a pasted payload that will never recur byte for byte.
pub const MAX_WAF_LITERAL_BYTES: usize = 256;

/// serde default for [`Waf::status`].
pub fn default_waf_status() -> u16 {
    DEFAULT_WAF_STATUS
}

/// WAF-lite: literal denylist over the request head.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Waf {
    /// 1..=64 literals, each 1..=256 bytes, matched ASCII case-insensitively.
    pub deny: Vec<String>,
    /// Status for a hit: 400, 403 (default), 404 or 429.
    #[serde(default = "default_waf_status")]
    pub status: u16,
    /// Count and log a hit, forward the request anyway.
    #[serde(default)]
    pub dry_run: bool,
}

/// An upstream cluster.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Cluster {
    /// Origin addresses or names, with weights; non-empty and unique.
    pub endpoints: Vec<Endpoint>,
    /// How a request picks an endpoint.
    #[serde(default)]
    pub lb: Lb,
    /// Passive and active health checks.
    #[serde(default)]
    pub health: Health,
    /// Further tries on another endpoint after a failure that is safe to retry.
    #[serde(default = "default_retries")]
    pub retries: u32,
    /// Re-resolve named endpoints this often; `None` resolves at load only.
    #[serde(default)]
    pub resolve_ms: Option<u64>,
    /// TLS to the endpoints; `None`: plain TCP.
    #[serde(default)]
    pub tls: Option<UpstreamTls>,
    /// The cluster's own timeouts over the global ones.
    #[serde(default)]
    pub timeouts: ClusterTimeouts,
    /// Failures retried on another endpoint (within `retries` and the retry budget).
    #[serde(default = "default_retry_on")]
    pub retry_on: Vec<RetryOn>,
}

/// Load-balancing policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Lb {
    /// Smooth weighted round robin, per shard: with equal weights each shard
    /// cycles through the endpoints in order.
    #[default]
    RoundRobin,
    /// Hash of the client identity (IPv4 /32, IPv6 /64) picks the endpoint.
    SourceIp,
    /// The endpoint with the fewest requests in flight on this shard, per weight.
    LeastConn,
}

pub use crate::observe::{
    AccessLog, AccessLogFormat, Admin, ServerHeader, DEFAULT_ACCESS_LOG_BUFFER_BYTES,
    DEFAULT_SERVER_HEADER, MAX_ACCESS_LOG_BUFFER_BYTES, MAX_LISTENER_NAME_BYTES,
    MIN_ACCESS_LOG_BUFFER_BYTES,
};

impl Config {
    /// The cluster named `name`, if any.
    pub fn cluster(&self, name: &str) -> Option<&Cluster> {
        self.clusters.get(name)
    }
}

impl Config {
    /// The `Server` field value zgix writes, or `None` when turned off.
    pub fn server_header(&self) -> Option<&str> {
        match &self.server_header {
            None | Some(ServerHeader::Enabled(true)) => Some(DEFAULT_SERVER_HEADER),
            Some(ServerHeader::Enabled(false)) => None,
            Some(ServerHeader::Name(n)) => Some(n),
        }
    }

    /// Every listener's name, by index: its `name`, or else its bind address as
    /// written. Two unnamed listeners on the same address (only possible with
    /// port 0) would share a label, so a repeat gets `#<index>` appended.
    pub fn listener_names(&self) -> Vec<String> {
        let mut names: Vec<String> = Vec::with_capacity(self.listeners.len());
        for (i, l) in self.listeners.iter().enumerate() {
            let name = match &l.name {
                Some(n) => n.clone(),
                None => {
                    let bind = l.bind.to_string();
                    if names.contains(&bind) {
                        format!("{bind}#{i}")
                    } else {
                        bind
                    }
                }
            };
            names.push(name);
        }
        names
    }
}
