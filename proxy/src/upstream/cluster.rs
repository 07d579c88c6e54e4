//! The clusters and endpoint slots of a runtime, as the upstream floor needs them: built once from the config, shared read-only by every shard (health, addresses and counters inside are atomics).

use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use zgix_config::{Active, Config, Lb, Target};

use crate::upstream::health::{ClusterHealth, EndpointHealth};
use crate::upstream::metrics::UpstreamMetrics;
use crate::upstream::resolve::AtomicAddr;
use crate::upstream::tls::{ClusterTls, TlsFailures};

/// Fixed keys hashing an endpoint's label into its rendezvous identity; the
/// secret part of `source_ip` hashing is [`Upstreams::hrw`], not this.
const HRW_LABEL_KEYS: ahash::RandomState = ahash::RandomState::with_seeds(
    0x6a09_e667_f3bc_c908, // fractional digits of sqrt(2), nothing up the sleeve
    0xbb67_ae85_84ca_a73b,
    0x3c6e_f372_fe94_f82b,
    0xa54f_f53a_5f1d_36f1,
);

/// A cluster: its endpoints as indices into [`Upstreams::endpoints`] and its balancing rule.
pub struct ClusterRt {
    pub name: String,
    pub endpoints: Vec<usize>,
    pub lb: Lb,
    /// Further tries on another endpoint (`clusters.NAME.retries`).
    pub retries: u32,
    /// `clusters.NAME.retry_on` as a set of [`RetryOn::bit`]s.
    pub retry_on: u8,
    /// The cluster's connect, header and idle timeouts (its own, else the global ones).
    pub timeouts: UpTimeouts,
    /// The active check, if configured (run by `health::run_prober`).
    pub active: Option<Active>,
    /// Panic-mode flag.
    pub health: ClusterHealth,
    /// `clusters.NAME.resolve_ms`: how often its names are resolved again.
    pub resolve_ms: Option<u64>,
    /// `clusters.NAME.tls`, read by `tls::load_all` and attached with
    /// [`Upstreams::attach_tls`] before the first connection; unset: plain TCP.
    pub tls: OnceLock<Arc<ClusterTls>>,
    /// `zgix_upstream_tls_failures_total` of the cluster (rendered while
    /// `tls` is set), continued across reloads by the cluster's name.
    pub tls_failures: Arc<TlsFailures>,
}

/// The timeouts of one cluster's exchanges.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct UpTimeouts {
    pub connect: Duration,
    pub header: Duration,
    pub idle: Duration,
}

impl UpTimeouts {
    /// `clusters.NAME.timeouts` over `limits.upstream_*_timeout_ms`.
    fn of(c: &zgix_config::Cluster, l: &zgix_config::Limits) -> UpTimeouts {
        let t = &c.timeouts;
        let ms = |own: Option<u64>, global: u64| Duration::from_millis(own.unwrap_or(global));
        UpTimeouts {
            connect: ms(t.connect_ms, l.upstream_connect_timeout_ms),
            header: ms(t.header_ms, l.upstream_header_timeout_ms),
            idle: ms(t.idle_ms, l.upstream_idle_timeout_ms),
        }
    }
}

/// One endpoint slot: fixed at load for the life of the process, whether its
/// address is a literal or a name that re-resolves (see `resolve.rs`).
pub struct UpstreamRt {
    /// Index into [`Upstreams::clusters`].
    pub cluster: usize,
    pub target: Target,
    /// The address as configured: the `endpoint` label of its metrics.
    pub label: String,
    pub weight: u32,
    /// Identity of the endpoint for rendezvous hashing: a hash of its label,
    /// so adding an endpoint does not change the others' keys.
    pub hrw_key: u64,
    pub addr: AtomicAddr,
    pub health: EndpointHealth,
    /// Rate limit of this endpoint's failure lines in the error log.
    pub log: Arc<crate::observe::log::Limiter>,
}

/// The upstream part of a runtime: every cluster and endpoint slot, their
/// counters and the rendezvous key. Handed to the balancer, the pools, the
/// prober, the resolver and the per-endpoint metrics instead of the whole
/// runtime.
pub struct Upstreams {
    pub clusters: Vec<ClusterRt>,
    /// Every endpoint slot of every cluster, by cluster then position (an
    /// endpoint listed in two clusters has two slots: health is per cluster),
    /// with its address at load; the upstream pools index by it. Use
    /// [`Upstreams::upstreams`]`[ep].addr.get()` for the current address.
    pub endpoints: Vec<SocketAddr>,
    /// Health, address and identity of each endpoint slot, same indices.
    pub upstreams: Vec<UpstreamRt>,
    /// Per-shard, per-endpoint counters (rendered by `upstream::metrics`).
    pub upstream_stats: UpstreamMetrics,
    /// Per-process random key of `source_ip` rendezvous hashing, so no client
    /// can choose addresses that all land on one endpoint.
    pub hrw: ahash::RandomState,
    /// Set when the runtime is retired (drain, or replaced by a reload): its
    /// prober and resolver stop.
    pub draining: AtomicBool,
}

impl Upstreams {
    /// The clusters of a config that has passed `validate()`; named
    /// endpoints have no address until `resolver::resolve_at_load`.
    pub fn build(config: &Config, shard_count: usize) -> Upstreams {
        let l = &config.limits;
        let mut upstreams: Vec<UpstreamRt> = Vec::new();
        let mut clusters = Vec::new();
        for (ci, (name, c)) in config.clusters.iter().enumerate() {
            let first = upstreams.len();
            let timeouts = UpTimeouts::of(c, l);
            let trial_ms = (timeouts.connect + timeouts.header).as_millis() as u64;
            for ep in &c.endpoints {
                let target = ep.target().expect("validated: endpoint parses");
                upstreams.push(UpstreamRt {
                    cluster: ci,
                    addr: AtomicAddr::new(match &target {
                        Target::Ip(a) => Some(*a),
                        Target::Name { .. } => None,
                    }),
                    hrw_key: HRW_LABEL_KEYS.hash_one(ep.address.as_str()),
                    target,
                    label: ep.address.clone(),
                    weight: ep.weight,
                    health: EndpointHealth::new(c.health.passive, trial_ms),
                    log: Default::default(),
                });
            }
            clusters.push(ClusterRt {
                name: name.clone(),
                endpoints: (first..upstreams.len()).collect(),
                lb: c.lb,
                retries: c.retries,
                retry_on: c.retry_on.iter().fold(0, |m, r| m | r.bit()),
                timeouts,
                active: c.health.active.clone(),
                health: ClusterHealth::default(),
                resolve_ms: c.resolve_ms,
                tls: OnceLock::new(),
                tls_failures: Arc::default(),
            });
        }
        let endpoints = upstreams
            .iter()
            .map(|u| match &u.target {
                Target::Ip(a) => *a,
                // Replaced once resolved; connecting to it fails fast.
                Target::Name { port, .. } => SocketAddr::from(([0, 0, 0, 0], *port)),
            })
            .collect();
        let upstream_stats = UpstreamMetrics::new(shard_count, upstreams.len(), clusters.len());
        Upstreams {
            clusters,
            endpoints,
            upstreams,
            upstream_stats,
            hrw: ahash::RandomState::new(),
            draining: AtomicBool::new(false),
        }
    }

    /// Gives each cluster the TLS configuration `tls::load_all` read for
    /// it (by index).
    pub fn attach_tls(&self, tls: Vec<Option<Arc<ClusterTls>>>) {
        for (c, t) in self.clusters.iter().zip(tls) {
            if let Some(t) = t {
                let _ = c.tls.set(t);
            }
        }
    }

    /// The slot in `self` that takes over the pooled connections of slot
    /// `ep` of `prev` (a reload): same address, and the same TLS settings
    /// (a connection made under other ones, or in the clear, is not reused).
    pub fn successor(&self, prev: &Upstreams, ep: usize) -> Option<usize> {
        let addr = prev.endpoints[ep];
        let spec = |u: &Upstreams, ep: usize| {
            u.clusters[u.upstreams[ep].cluster]
                .tls
                .get()
                .map(|t| t.spec.clone())
        };
        let want = spec(prev, ep);
        (0..self.endpoints.len()).find(|&i| self.endpoints[i] == addr && spec(self, i) == want)
    }
}
