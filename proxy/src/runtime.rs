//! The read-only runtime model built once from a validated config and shared by every shard.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use zgix_admission::{ConnTable, Overflow, RateParams, RateTable, WafMatcher};
use zgix_config::Config;

use crate::http::filters::FiltersRt;
use crate::observe::access_log::Names;
use crate::observe::metrics::Metrics;
use crate::upstream::cluster::Upstreams;

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
    /// The rate limit's modes (meaningful when `rate_limit` is set).
    pub rate: RateModes,
    pub conn_limit: Option<u32>,
    pub conn_dry_run: bool,
    pub waf: Option<WafRt>,
    pub clients: Option<ClientFilterRt>,
    pub filters: FiltersRt,
    /// TLS termination: its certificates and rustls configuration, read by
    /// [`crate::conn::handshake::load_all`] before the runtime is built.
    pub tls: Option<Arc<crate::conn::handshake::TlsListener>>,
    /// `http.request_id`: how each request's `X-Request-ID` is chosen.
    pub request_id: zgix_config::RequestIdMode,
    /// `http.forwarded`: add an RFC 7239 `Forwarded` element.
    pub forwarded: bool,
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
    /// Count and log a hit, forward anyway.
    pub dry_run: bool,
}

/// A listener's rate-limit modes, resolved at load.
#[derive(Default)]
pub struct RateModes {
    /// Count and log a refusal, forward anyway (tokens are spent all the same).
    pub dry_run: bool,
    /// `"key": {"header": name}`: the field name, compared ASCII case-insensitively.
    pub key_header: Option<Box<[u8]>>,
    /// `"headers": "draft-11"`: the start of the two fields (see
    /// [`crate::http::ratelimit::prefix`]); `None` writes none.
    pub headers: Option<Box<[u8]>>,
    /// `"scope": "fleet"`: the listener's fleet tag ([`fleet_tag`]), which the
    /// rate table stores beside what a fleet-scoped check spent.
    pub fleet: Option<u32>,
}

/// The process-wide tag of a fleet-scoped listener, by name: the same name gets
/// the same tag in every generation, so counts the rate table collected before a
/// reload that reordered, added or removed listeners are credited to the listener
/// they were spent on, never to the one now at the same index. Tags are never
/// reused; there are as many as distinct fleet-scoped names the process has loaded
/// (the rate table keeps 24 bits of them).
pub fn fleet_tag(name: &str) -> u32 {
    static TAGS: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut tags = TAGS.lock().unwrap_or_else(|e| e.into_inner());
    let i = match tags.iter().position(|t| t == name) {
        Some(i) => i,
        None => {
            tags.push(name.to_owned());
            tags.len() - 1
        }
    };
    i as u32
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
    /// Clusters, endpoint slots, their health and counters: the part the
    /// upstream floor is handed.
    pub up: Arc<Upstreams>,
    pub timeouts: Timeouts,
    pub request_limits: zgix_parser::Limits,
    /// Shared with the previous runtime across a reload when the geometry
    /// (`rate_limit_entries`, `conn_limit_entries`) is unchanged.
    pub rate_table: Arc<RateTable>,
    pub conn_table: Arc<ConnTable>,
    /// `limits.rate_limit_overflow`.
    pub overflow: Overflow,
    pub metrics: Arc<Metrics>,
    /// `limits.max_connections`, or what the descriptor limit allows.
    pub max_connections: usize,
    /// The access log's rings and writer; started by `server::run`, shared
    /// with the next runtime by a reload that leaves `access_log` unchanged.
    pub access_log: Option<Arc<crate::observe::access_log::AccessLog>>,
}

fn rate_modes(r: &zgix_config::RateLimit, name: &str) -> RateModes {
    RateModes {
        dry_run: r.dry_run,
        key_header: match &r.key {
            zgix_config::RateKey::Address => None,
            zgix_config::RateKey::Header(h) => Some(h.as_bytes().into()),
        },
        headers: r.headers.map(|_| {
            crate::http::ratelimit::prefix(
                name,
                RateParams {
                    requests: r.requests,
                    window_ms: r.window_ms,
                    burst: r.burst,
                },
            )
        }),
        fleet: (r.scope == zgix_config::RateScope::Fleet).then(|| fleet_tag(name)),
    }
}

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

impl Runtime {
    /// Gives each listener the TLS configuration [`crate::conn::handshake::load_all`]
    /// read for it (by index).
    pub fn attach_tls(&mut self, tls: Vec<Option<Arc<crate::conn::handshake::TlsListener>>>) {
        for (l, t) in self.listeners.iter_mut().zip(tls) {
            l.tls = t;
        }
    }

    /// Builds the runtime from a config that has passed `validate()`.
    pub fn new(config: Config, shard_count: usize) -> Runtime {
        Runtime::build(config, shard_count, None)
    }

    /// Builds the runtime a reload applies: like [`Runtime::new`], but the
    /// admission tables of `prev` are kept when their size is unchanged (a
    /// drained bucket stays drained, a held connection count stays held),
    /// and so are the counters (a listener's or a cluster's by its name). Returns
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
        let mut up = Upstreams::build(&config, shard_count);
        if let Some(p) = prev {
            crate::upstream::reload::carry_over(&mut up, &p.up);
        }
        crate::upstream::resolver::resolve_at_load(&mut up);
        let names: Vec<&String> = config.clusters.keys().collect();
        let mut listener_names = config.listener_names().into_iter();
        let listeners = config
            .listeners
            .iter()
            .enumerate()
            .map(|(index, lst)| {
                let h = &lst.http;
                let name = listener_names.next().unwrap_or_default();
                ListenerRt {
                    index,
                    rate: h
                        .rate_limit
                        .as_ref()
                        .map(|r| rate_modes(r, &name))
                        .unwrap_or_default(),
                    name,
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
                    conn_dry_run: h.conn_limit.as_ref().is_some_and(|c| c.dry_run),
                    request_id: h.request_id,
                    forwarded: h.forwarded,
                    waf: h.waf.as_ref().map(|w| WafRt {
                        matcher: WafMatcher::new(&w.deny),
                        status: w.status,
                        dry_run: w.dry_run,
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
                    tls: None,
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
        // Per-listener and per-cluster series are kept by name.
        let lnames: Vec<String> = listeners.iter().map(|l| l.name.clone()).collect();
        let cnames: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let metrics = Arc::new(Metrics::named(
            shard_count,
            &lnames,
            &cnames,
            prev.map(|p| &*p.metrics),
        ));
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
        let overflow = match l.rate_limit_overflow {
            zgix_config::RateLimitOverflow::FailOpen => Overflow::FailOpen,
            zgix_config::RateLimitOverflow::Shared => Overflow::Shared,
        };
        Runtime {
            rate_table,
            conn_table,
            overflow,
            listeners,
            up: Arc::new(up),
            timeouts,
            request_limits,
            metrics,
            max_connections: config.limits.max_connections_for(nofile_limit()),
            access_log: None,
            config,
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

/// The access log names listeners, filter rules and endpoints through this.
impl Names for Runtime {
    fn logs(&self, listener: usize) -> bool {
        self.listeners.get(listener).is_some_and(|l| l.access_log)
    }

    fn listener_name(&self, listener: usize) -> Option<&str> {
        self.listeners.get(listener).map(|l| l.name.as_str())
    }

    fn filter_name(&self, listener: usize, rule: u16) -> Option<&str> {
        self.listeners.get(listener)?.filters.rule_name(rule)
    }

    fn endpoint(&self, ep: usize) -> Option<SocketAddr> {
        self.up.endpoints.get(ep).copied()
    }
}
