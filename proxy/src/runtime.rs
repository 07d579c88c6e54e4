//! The read-only runtime model built once from a validated config and shared by every shard.

use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use zgix_admission::{ConnTable, RateParams, RateTable, WafMatcher};
use zgix_config::{Config, Lb};

use crate::filters::FiltersRt;
use crate::metrics::Metrics;

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
}

/// Millisecond limits turned into durations once.
pub struct Timeouts {
    pub client_header: Duration,
    pub client_idle: Duration,
    pub client_body: Duration,
    pub upstream_connect: Duration,
    pub upstream_header: Duration,
    pub upstream_idle: Duration,
    pub drain: Duration,
    pub proxy_protocol: Duration,
}

/// Everything the shards share. Only the admission tables and the drain flag are
/// written after load, and those are atomics.
pub struct Runtime {
    pub config: Config,
    pub listeners: Vec<ListenerRt>,
    pub clusters: Vec<ClusterRt>,
    /// Every distinct endpoint of every cluster; the upstream pools index by it.
    pub endpoints: Vec<SocketAddr>,
    pub timeouts: Timeouts,
    pub request_limits: zgix_parser::Limits,
    pub rate_table: RateTable,
    pub conn_table: Arc<ConnTable>,
    pub metrics: Arc<Metrics>,
    /// Set by the signal thread; shards poll it from their tick task.
    pub draining: AtomicBool,
    /// The access log's rings and writer; started by `server::run`.
    pub access_log: Option<crate::access_log::AccessLog>,
}

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

impl Runtime {
    /// Builds the runtime from a config that has passed `validate()`.
    pub fn new(config: Config, shard_count: usize) -> Runtime {
        let l = &config.limits;
        let mut endpoints: Vec<SocketAddr> = Vec::new();
        let mut clusters = Vec::new();
        let names: Vec<&String> = config.clusters.keys().collect();
        for (name, c) in &config.clusters {
            let eps = c
                .endpoints
                .iter()
                .map(|ep| match endpoints.iter().position(|e| e == ep) {
                    Some(i) => i,
                    None => {
                        endpoints.push(*ep);
                        endpoints.len() - 1
                    }
                })
                .collect();
            clusters.push(ClusterRt {
                name: name.clone(),
                endpoints: eps,
                lb: c.lb,
            });
        }
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
            drain: ms(l.drain_timeout_ms),
            proxy_protocol: ms(l.proxy_protocol_timeout_ms),
        };
        let request_limits = zgix_parser::Limits {
            max_request_line: l.max_request_line,
            max_header_bytes: l.max_header_bytes,
            max_headers: l.max_headers,
            max_body: l.max_request_body,
        };
        let metrics = Arc::new(Metrics::new(shard_count, listeners.len(), clusters.len()));
        Runtime {
            rate_table: RateTable::new(l.rate_limit_entries),
            conn_table: ConnTable::new(l.conn_limit_entries),
            listeners,
            clusters,
            endpoints,
            timeouts,
            request_limits,
            metrics,
            draining: AtomicBool::new(false),
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
