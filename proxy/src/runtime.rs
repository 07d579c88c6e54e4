//! The read-only runtime model built once from a validated config and shared by every shard.

use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use zgix_admission::{ConnTable, RateParams, RateTable, WafMatcher};
use zgix_config::{Active, Config, Lb, Target};

use crate::filters::FiltersRt;
use crate::health::{ClusterHealth, EndpointHealth};
use crate::metrics::Metrics;
use crate::resolve::AtomicAddr;
use crate::upstream_metrics::UpstreamMetrics;

/// Fixed keys hashing an endpoint's label into its rendezvous identity; the
/// secret part of `source_ip` hashing is [`Runtime::hrw`], not this.
const HRW_LABEL_KEYS: ahash::RandomState = ahash::RandomState::with_seeds(
    0x6a09_e667_f3bc_c908, // fractional digits of sqrt(2), nothing up the sleeve
    0xbb67_ae85_84ca_a73b,
    0x3c6e_f372_fe94_f82b,
    0xa54f_f53a_5f1d_36f1,
);

/// A listener as the request path needs it: indices instead of names, matchers built.
pub struct ListenerRt {
    pub index: usize,
    /// `listeners[].name`, or the bind address: the `listener` label and log field.
    pub name: String,
    /// Whether this listener's requests go to the access log (when there is one).
    pub access_log: bool,
    pub bind: SocketAddr,
    pub cluster: usize,
    pub proxy_protocol: bool,
    pub rate_limit: Option<RateParams>,
    pub conn_limit: Option<u32>,
    pub waf: Option<WafRt>,
    pub clients: Option<ClientFilterRt>,
    pub filters: FiltersRt,
}

/// A listener's client filter, checked once per connection on the client address
/// (after the PROXY header): any deny match refuses; a non-empty allow list
/// must match.
pub struct ClientFilterRt {
    pub allow: Vec<ipnet::IpNet>,
    pub deny: Vec<ipnet::IpNet>,
}

impl ClientFilterRt {
    pub fn admits(&self, ip: std::net::IpAddr) -> bool {
        if self.deny.iter().any(|n| n.contains(&ip)) {
            return false;
        }
        self.allow.is_empty() || self.allow.iter().any(|n| n.contains(&ip))
    }
}

/// WAF-lite for one listener: the literal matcher and the status a hit is answered with.
pub struct WafRt {
    pub matcher: WafMatcher,
    pub status: u16,
}

/// A cluster: its endpoints as indices into [`Runtime::endpoints`] and its balancing rule.
pub struct ClusterRt {
    pub name: String,
    pub endpoints: Vec<usize>,
    pub lb: Lb,
    /// Further tries on another endpoint (`clusters.NAME.retries`).
    pub retries: u32,
    /// The active check, if configured (run by `health::run_prober`).
    pub active: Option<Active>,
    /// Panic-mode flag.
    pub health: ClusterHealth,
}

/// One endpoint slot: fixed at load for the life of the process, whether its
/// address is a literal or a name that re-resolves (see `resolve.rs`).
pub struct UpstreamRt {
    /// Index into [`Runtime::clusters`].
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
}

/// Millisecond limits turned into durations once.
pub struct Timeouts {
    pub client_header: Duration,
    pub client_idle: Duration,
    pub client_body: Duration,
    pub upstream_connect: Duration,
    pub upstream_header: Duration,
    pub upstream_idle: Duration,
    /// Lifetime of an idle pooled upstream connection.
    pub upstream_pool_idle: Duration,
    pub drain: Duration,
    pub proxy_protocol: Duration,
}

/// Everything the shards share. Only the admission tables and the drain flag are
/// written after load, and those are atomics.
pub struct Runtime {
    pub config: Config,
    pub listeners: Vec<ListenerRt>,
    pub clusters: Vec<ClusterRt>,
    /// Every endpoint slot of every cluster, by cluster then position (an
    /// endpoint listed in two clusters has two slots: health is per cluster),
    /// with its address at load; the upstream pools index by it. Use
    /// [`Runtime::upstreams`]`[ep].addr.get()` for the current address.
    pub endpoints: Vec<SocketAddr>,
    /// Health, address and identity of each endpoint slot, same indices.
    pub upstreams: Vec<UpstreamRt>,
    /// Per-shard, per-endpoint counters (rendered by `upstream_metrics`).
    pub upstream_stats: UpstreamMetrics,
    /// Per-process random key of `source_ip` rendezvous hashing, so no client
    /// can choose addresses that all land on one endpoint.
    pub hrw: ahash::RandomState,
    pub timeouts: Timeouts,
    pub request_limits: zgix_parser::Limits,
    /// Shared with the previous runtime across a reload when the geometry
    /// (`rate_limit_entries`, `conn_limit_entries`) is unchanged.
    pub rate_table: Arc<RateTable>,
    pub conn_table: Arc<ConnTable>,
    pub metrics: Arc<Metrics>,
    /// Set by the signal thread, which then wakes every shard's driver.
    pub draining: AtomicBool,
    /// `limits.max_connections`, or what the descriptor limit allows.
    pub max_connections: usize,
    /// The access log's rings and writer; started by `server::run`, shared
    /// with the next runtime by a reload that leaves `access_log` unchanged.
    pub access_log: Option<Arc<crate::access_log::AccessLog>>,
}

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

impl Runtime {
    /// Builds the runtime from a config that has passed `validate()`.
    pub fn new(config: Config, shard_count: usize) -> Runtime {
        Runtime::build(config, shard_count, None)
    }

    /// Builds the runtime a reload applies: like [`Runtime::new`], but the
    /// admission tables of `prev` are kept when their size is unchanged (a
    /// drained bucket stays drained, a held connection count stays held),
    /// and so are the listener counters when the listener count is. Returns
    /// a line for the log about each table that starts empty instead.
    pub fn reloaded(config: Config, shard_count: usize, prev: &Runtime) -> (Runtime, Vec<String>) {
        let mut notes = Vec::new();
        let (old, new) = (&prev.config.limits, &config.limits);
        if old.rate_limit_entries != new.rate_limit_entries {
            notes.push(format!(
                "limits.rate_limit_entries changed ({} -> {}): the rate-limit table starts empty",
                old.rate_limit_entries, new.rate_limit_entries
            ));
        }
        if old.conn_limit_entries != new.conn_limit_entries {
            notes.push(format!(
                "limits.conn_limit_entries changed ({} -> {}): the connection-limit table starts empty \
                 (connections open now release their counts in the old table)",
                old.conn_limit_entries, new.conn_limit_entries
            ));
        }
        (Runtime::build(config, shard_count, Some(prev)), notes)
    }

    fn build(config: Config, shard_count: usize, prev: Option<&Runtime>) -> Runtime {
        let l = &config.limits;
        let mut upstreams: Vec<UpstreamRt> = Vec::new();
        let mut clusters = Vec::new();
        let names: Vec<&String> = config.clusters.keys().collect();
        let trial_ms = l.upstream_connect_timeout_ms + l.upstream_header_timeout_ms;
        for (ci, (name, c)) in config.clusters.iter().enumerate() {
            let first = upstreams.len();
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
                });
            }
            clusters.push(ClusterRt {
                name: name.clone(),
                endpoints: (first..upstreams.len()).collect(),
                lb: c.lb,
                retries: c.retries,
                active: c.health.active.clone(),
                health: ClusterHealth::default(),
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
        let mut listener_names = config.listener_names().into_iter();
        let listeners = config
            .listeners
            .iter()
            .enumerate()
            .map(|(index, lst)| {
                let h = &lst.http;
                ListenerRt {
                    index,
                    name: listener_names.next().unwrap_or_default(),
                    access_log: lst.access_log && config.access_log.is_some(),
                    bind: lst.bind,
                    cluster: names
                        .iter()
                        .position(|n| **n == h.cluster)
                        .expect("validated: cluster exists"),
                    proxy_protocol: lst.proxy_protocol,
                    rate_limit: h.rate_limit.as_ref().map(|r| RateParams {
                        requests: r.requests,
                        window_ms: r.window_ms,
                        burst: r.burst,
                    }),
                    conn_limit: h.conn_limit.as_ref().map(|c| c.max),
                    waf: h.waf.as_ref().map(|w| WafRt {
                        matcher: WafMatcher::new(&w.deny),
                        status: w.status,
                    }),
                    filters: FiltersRt::build(&h.request_filters, |name| {
                        names
                            .iter()
                            .position(|n| n.as_str() == name)
                            .expect("validated: route cluster exists")
                    }),
                    clients: lst.clients.as_ref().map(|c| ClientFilterRt {
                        allow: c.allow.clone(),
                        deny: c.deny.clone(),
                    }),
                }
            })
            .collect::<Vec<_>>();
        let timeouts = Timeouts {
            client_header: ms(l.client_header_timeout_ms),
            client_idle: ms(l.client_idle_timeout_ms),
            client_body: ms(l.client_body_timeout_ms),
            upstream_connect: ms(l.upstream_connect_timeout_ms),
            upstream_header: ms(l.upstream_header_timeout_ms),
            upstream_idle: ms(l.upstream_idle_timeout_ms),
            upstream_pool_idle: ms(l.upstream_pool_idle_timeout_ms),
            drain: ms(l.drain_timeout_ms),
            proxy_protocol: ms(l.proxy_protocol_timeout_ms),
        };
        let request_limits = l.request_limits();
        let metrics = match prev {
            Some(p)
                if p.listeners.len() == listeners.len() && p.clusters.len() == clusters.len() =>
            {
                p.metrics.clone()
            }
            _ => Arc::new(Metrics::new(shard_count, listeners.len(), clusters.len())),
        };
        let rate_table = match prev {
            Some(p) if p.config.limits.rate_limit_entries == l.rate_limit_entries => {
                p.rate_table.clone()
            }
            _ => Arc::new(RateTable::new(l.rate_limit_entries)),
        };
        let conn_table = match prev {
            Some(p) if p.config.limits.conn_limit_entries == l.conn_limit_entries => {
                p.conn_table.clone()
            }
            _ => ConnTable::new(l.conn_limit_entries),
        };
        let upstream_stats = UpstreamMetrics::new(shard_count, upstreams.len(), clusters.len());
        let mut rt = Runtime {
            rate_table,
            conn_table,
            listeners,
            clusters,
            endpoints,
            upstreams,
            upstream_stats,
            hrw: ahash::RandomState::new(),
            timeouts,
            request_limits,
            metrics,
            draining: AtomicBool::new(false),
            max_connections: config.limits.max_connections_for(nofile_limit()),
            access_log: None,
            config,
        };
        rt.resolve_at_load();
        rt
    }

    /// Resolves every named endpoint once, before any shard starts (blocking
    /// lookups are fine here). A name that does not resolve is reported and
    /// stays down until the resolver thread resolves it.
    fn resolve_at_load(&mut self) {
        for slot in 0..self.upstreams.len() {
            if !matches!(self.upstreams[slot].target, Target::Name { .. }) {
                continue;
            }
            if let Some(line) = crate::resolve::refresh(self, slot) {
                crate::log_warn!("upstream", "{line}");
            }
            match self.upstreams[slot].addr.get() {
                Some(a) => self.endpoints[slot] = a,
                None => self.upstreams[slot].health.set_unresolved(true),
            }
        }
    }

    /// Size of a connection's client read buffer: a whole head must fit in it.
    pub fn client_buffer_bytes(&self) -> usize {
        self.config.limits.client_read_buffer_bytes()
    }

    /// Size of a connection's upstream read buffer: a whole response head must fit.
    pub fn upstream_buffer_bytes(&self) -> usize {
        let l = &self.config.limits;
        l.buffer_bytes.max(l.max_response_header_bytes)
    }

    /// Header fields a response head may carry: at least the request limit, and
    /// never fewer than 100 (origins send many Set-Cookie fields).
    pub fn response_max_headers(&self) -> usize {
        self.config.limits.max_headers.max(100)
    }

    /// Size of the buffer heads are rewritten into: the larger head plus room for
    /// the headers zgix adds (X-Forwarded-For, Host, Connection).
    pub fn out_buffer_bytes(&self) -> usize {
        let l = &self.config.limits;
        (l.max_header_bytes + l.max_request_line).max(l.max_response_header_bytes) + 512
    }
}

impl Runtime {
    /// The driver every shard reported it runs on (`uring`, `epoll`, or
    /// `mixed` if some fell back).
    pub fn io_driver_name(&self) -> &'static str {
        let kinds: Vec<_> = self
            .metrics
            .shards
            .iter()
            .map(|s| s.engine.driver_name())
            .collect();
        match kinds.first() {
            Some(k) if kinds.iter().all(|x| x == k) => k,
            _ => "mixed",
        }
    }
}

/// The soft `RLIMIT_NOFILE`, after raising it to the hard limit (as HAProxy
/// does): the connection cap defaults from it.
pub fn nofile_limit() -> u64 {
    // SAFETY: plain data, valid for the calls; results are checked.
    unsafe {
        let mut r: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            return 1024;
        }
        if r.rlim_cur < r.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: r.rlim_max,
                rlim_max: r.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                r.rlim_cur = r.rlim_max;
            }
        }
        r.rlim_cur as u64
    }
}
