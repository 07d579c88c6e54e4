//! `Config::validate`: every semantic rule, checked in full, each violation reported with its JSON path.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use ipnet::IpNet;

use crate::error::ConfigError;
use crate::filter::{
    Action, HeaderMatch, Match, PathMatch, RequestFilter, FORBIDDEN_EDIT_HEADERS,
    MAX_FILTER_HEADER_VALUE_BYTES, MAX_RESPOND_BODY_BYTES,
};
use crate::io::*;
use crate::limits::*;
use crate::load::available_cpus;
use crate::model::{
    Config, HttpListener, Listener, RateLimit, Waf, MAX_RATE_LIMIT_TOKENS,
    MAX_RATE_LIMIT_WINDOW_MS, MAX_WAF_LITERALS, MAX_WAF_LITERAL_BYTES, WAF_STATUSES,
};

/// Longest cluster name: it appears in metric labels and log lines.
pub const MAX_CLUSTER_NAME_BYTES: usize = 64;
/// Longest filter `name`: a label for logs, not documentation.
pub const MAX_FILTER_NAME_BYTES: usize = 128;
/// Longest `hosts` entry: a DNS name is at most 253 characters (RFC 1035 §2.3.4).
const MAX_HOST_BYTES: usize = 253;

impl Config {
    /// Checks every rule the types cannot express and returns all violations,
    /// in document order, or `Ok(())`.
    pub fn validate(&self) -> Result<(), Vec<ConfigError>> {
        validate_with_cpus(self, &available_cpus())
    }
}

/// [`Config::validate`] against a given affinity mask (the CPUs the process
/// may run on), so tests do not depend on the machine.
pub(crate) fn validate_with_cpus(config: &Config, cpus: &[usize]) -> Result<(), Vec<ConfigError>> {
    let mut v = Validator {
        config,
        errors: Vec::new(),
    };
    v.cpus(cpus);
    if let Some(a) = &config.admin {
        v.admin(a);
    }
    v.listeners();
    v.clusters();
    v.limits();
    if let Err(rule) = config.via.check() {
        v.err("via", rule);
    }
    v.observability();
    v.fleet();
    if v.errors.is_empty() {
        Ok(())
    } else {
        Err(v.errors)
    }
}

/// `[0, 1, 2, 5]` as the kernel writes it: `0-2,5`.
fn cpu_list(cpus: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            cpus[i].to_string()
        } else {
            format!("{}-{}", cpus[i], cpus[j])
        });
        i = j + 1;
    }
    if out.is_empty() {
        "none".into()
    } else {
        out.join(",")
    }
}

struct Validator<'a> {
    config: &'a Config,
    errors: Vec<ConfigError>,
}

impl Validator<'_> {
    fn err(&mut self, path: impl Into<String>, rule: impl Into<String>) {
        self.errors.push(ConfigError::new(path, rule));
    }

    fn range<T: PartialOrd + std::fmt::Display>(&mut self, path: &str, v: T, lo: T, hi: T) {
        if v < lo || v > hi {
            self.err(path, format!("must be between {lo} and {hi}, got {v}"));
        }
    }

    fn cpus(&mut self, allowed: &[usize]) {
        let Some(cpus) = &self.config.cpus else {
            return;
        };
        if cpus.is_empty() {
            self.err(
                "cpus",
                "must list at least one CPU; omit it to use every CPU of the process's affinity mask",
            );
        }
        let mut seen: HashMap<usize, usize> = HashMap::new();
        for (i, &cpu) in cpus.iter().enumerate() {
            let path = format!("cpus[{i}]");
            if !allowed.contains(&cpu) {
                self.err(
                    &path,
                    format!(
                        "CPU {cpu} is not in the process's affinity mask (CPUs {})",
                        cpu_list(allowed)
                    ),
                );
            }
            if let Some(&first) = seen.get(&cpu) {
                self.err(&path, format!("CPU {cpu} is already cpus[{first}]"));
            } else {
                seen.insert(cpu, i);
            }
        }
    }

    fn listeners(&mut self) {
        let config = self.config;
        if config.listeners.is_empty() {
            self.err("listeners", "must list at least one listener");
        }
        let mut binds: HashMap<SocketAddr, usize> = HashMap::new();
        for (i, l) in config.listeners.iter().enumerate() {
            let path = format!("listeners[{i}]");
            // Port 0 asks the kernel for a fresh port, so it cannot collide.
            if l.bind.port() != 0 {
                if let Some(&first) = binds.get(&l.bind) {
                    self.err(
                        format!("{path}.bind"),
                        format!("{} is already listeners[{first}].bind", l.bind),
                    );
                } else {
                    binds.insert(l.bind, i);
                }
            }
            self.listener(&path, l);
        }
        if let Some(admin) = &config.admin {
            if admin.bind.port() != 0 {
                if let Some(&i) = binds.get(&admin.bind) {
                    self.err(
                        "admin.bind",
                        format!("{} is already listeners[{i}].bind", admin.bind),
                    );
                }
            }
        }
    }

    fn listener(&mut self, path: &str, l: &Listener) {
        if let Some(t) = &l.tls {
            self.listener_tls(&format!("{path}.tls"), t);
        }
        self.listener_http2(&format!("{path}.http2"), &l.http2, l.tls.is_some());
        if let Some(clients) = &l.clients {
            for (j, net) in clients.allow.iter().enumerate() {
                self.client_net(&format!("{path}.clients.allow[{j}]"), net);
            }
            for (j, net) in clients.deny.iter().enumerate() {
                self.client_net(&format!("{path}.clients.deny[{j}]"), net);
            }
        }
        self.http(&format!("{path}.http"), &l.http);
    }

    /// A client CIDR must be written in canonical form and, for IPv6, be no
    /// longer than /64: a client's identity is its IPv6 /64, so a longer
    /// prefix would single out addresses zgix treats as one client.
    fn client_net(&mut self, path: &str, net: &IpNet) {
        if net.trunc() != *net {
            self.err(
                path,
                format!("{net} has host bits set; write {}", net.trunc()),
            );
        }
        if let IpNet::V6(v6) = net {
            if v6.prefix_len() > 64 {
                self.err(
                    path,
                    format!(
                        "{net} is longer than /64; IPv6 clients are identified by their /64, write {}",
                        IpNet::new(IpAddr::V6(v6.addr()), 64)
                            .map(|n| n.trunc())
                            .unwrap_or(*net)
                    ),
                );
            }
        }
    }

    fn cluster_ref(&mut self, path: &str, name: &str) {
        if !self.config.clusters.contains_key(name) {
            self.err(path, format!("no cluster named {name:?}"));
        }
    }

    fn http(&mut self, path: &str, http: &HttpListener) {
        self.cluster_ref(&format!("{path}.cluster"), &http.cluster);
        if let Some(rl) = &http.rate_limit {
            self.rate_limit(&format!("{path}.rate_limit"), rl);
        }
        if let Some(cl) = &http.conn_limit {
            if cl.max == 0 {
                self.err(format!("{path}.conn_limit.max"), "must be at least 1");
            }
        }
        if let Some(waf) = &http.waf {
            self.waf(&format!("{path}.waf"), waf);
        }
        let mut ends_walk: Option<usize> = None;
        for (i, f) in http.request_filters.iter().enumerate() {
            let fpath = format!("{path}.request_filters[{i}]");
            if let Some(first) = ends_walk {
                self.err(
                    &fpath,
                    format!(
                        "unreachable: request_filters[{first}] matches every request and ends the walk"
                    ),
                );
            }
            self.filter(&fpath, f);
            if ends_walk.is_none() && f.matcher.is_always() && f.action.is_terminal() {
                ends_walk = Some(i);
            }
        }
    }

    fn rate_limit(&mut self, path: &str, rl: &RateLimit) {
        self.range(
            &format!("{path}.requests"),
            rl.requests,
            1,
            MAX_RATE_LIMIT_TOKENS,
        );
        self.range(
            &format!("{path}.window_ms"),
            rl.window_ms,
            1,
            MAX_RATE_LIMIT_WINDOW_MS,
        );
        self.range(&format!("{path}.burst"), rl.burst, 1, MAX_RATE_LIMIT_TOKENS);
        self.rate_limit_modes(path, rl);
    }

    fn waf(&mut self, path: &str, waf: &Waf) {
        let n = waf.deny.len();
        if !(1..=MAX_WAF_LITERALS).contains(&n) {
            self.err(
                format!("{path}.deny"),
                format!("must list between 1 and {MAX_WAF_LITERALS} literals, got {n}"),
            );
        }
        for (i, lit) in waf.deny.iter().enumerate() {
            let len = lit.len();
            if !(1..=MAX_WAF_LITERAL_BYTES).contains(&len) {
                self.err(
                    format!("{path}.deny[{i}]"),
                    format!("must be between 1 and {MAX_WAF_LITERAL_BYTES} bytes long, got {len}"),
                );
            }
        }
        if !WAF_STATUSES.contains(&waf.status) {
            self.err(
                format!("{path}.status"),
                format!("must be 400, 403, 404 or 429, got {}", waf.status),
            );
        }
    }

    fn filter(&mut self, path: &str, f: &RequestFilter) {
        if let Some(name) = &f.name {
            if name.is_empty() || name.len() > MAX_FILTER_NAME_BYTES {
                self.err(
                    format!("{path}.name"),
                    format!(
                        "must be between 1 and {MAX_FILTER_NAME_BYTES} bytes long, got {}",
                        name.len()
                    ),
                );
            } else if name.chars().any(char::is_control) {
                self.err(
                    format!("{path}.name"),
                    "must not contain control characters",
                );
            }
        }
        self.matcher(&format!("{path}.match"), &f.matcher);
        self.action(&format!("{path}.action.{}", f.action.kind()), &f.action);
    }

    fn non_empty_list<T>(&mut self, path: &str, list: &[T], what: &str) {
        if list.is_empty() {
            self.err(
                path,
                format!("must not be empty; omit it to match every {what}"),
            );
        }
    }

    fn matcher(&mut self, path: &str, m: &Match) {
        if let Some(methods) = &m.methods {
            let p = format!("{path}.methods");
            self.non_empty_list(&p, methods, "method");
            for (i, method) in methods.iter().enumerate() {
                if !is_token(method) || method.bytes().any(|b| b.is_ascii_lowercase()) {
                    self.err(
                        format!("{p}[{i}]"),
                        format!("{method:?} is not an upper-case method token such as \"GET\""),
                    );
                }
            }
        }
        if let Some(hosts) = &m.hosts {
            let p = format!("{path}.hosts");
            self.non_empty_list(&p, hosts, "host");
            for (i, host) in hosts.iter().enumerate() {
                if let Err(rule) = check_host(host) {
                    self.err(format!("{p}[{i}]"), rule);
                }
            }
        }
        match &m.path {
            Some(PathMatch::Exact(s)) => self.path_string(&format!("{path}.path.exact"), s),
            Some(PathMatch::Prefix(s)) => self.path_string(&format!("{path}.path.prefix"), s),
            None => {}
        }
        if let Some(headers) = &m.headers {
            let p = format!("{path}.headers");
            self.non_empty_list(&p, headers, "request");
            for (i, h) in headers.iter().enumerate() {
                self.header_match(&format!("{p}[{i}]"), h);
            }
        }
        if let Some(clients) = &m.clients {
            let p = format!("{path}.clients");
            self.non_empty_list(&p, clients, "client");
            for (i, net) in clients.iter().enumerate() {
                self.client_net(&format!("{p}[{i}]"), net);
            }
        }
    }

    fn header_match(&mut self, path: &str, h: &HeaderMatch) {
        self.header_name(&format!("{path}.name"), &h.name, false);
        let given = [
            h.present.is_some(),
            h.equals.is_some(),
            h.contains.is_some(),
        ]
        .iter()
        .filter(|&&b| b)
        .count();
        if given != 1 {
            self.err(path, "must give exactly one of present, equals, contains");
        }
        if let Some(v) = &h.equals {
            self.header_value(&format!("{path}.equals"), v);
        }
        if let Some(v) = &h.contains {
            let p = format!("{path}.contains");
            if v.is_empty() {
                self.err(&p, "must not be empty; use \"present\": true");
            } else {
                self.value_bytes(&p, v);
            }
        }
    }

    /// `/`-rooted ASCII path without query, fragment, spaces or control bytes:
    /// anything else could never equal a request path as received.
    fn path_string(&mut self, path: &str, s: &str) {
        if !s.starts_with('/') {
            self.err(path, format!("{s:?} must start with '/'"));
        } else if s.len() > MAX_FILTER_HEADER_VALUE_BYTES {
            self.err(
                path,
                format!(
                    "must be at most {MAX_FILTER_HEADER_VALUE_BYTES} bytes long, got {}",
                    s.len()
                ),
            );
        } else if let Some(c) = s.chars().find(|&c| !c.is_ascii_graphic()) {
            self.err(
                path,
                format!(
                    "{s:?} contains {c:?}; paths are printable ASCII, percent-encode anything else"
                ),
            );
        } else if s.contains(['?', '#']) {
            self.err(
                path,
                format!("{s:?} must not contain '?' or '#': paths are matched without the query"),
            );
        } else if let Some(rule) = encoded_path_char(s) {
            self.err(path, format!("{s:?} {rule}"));
        }
    }

    /// `edit` is true where the name is written into a message (header edits,
    /// `respond` headers), which refuses hop-by-hop, framing and `Host`.
    fn header_name(&mut self, path: &str, name: &str, edit: bool) {
        if !is_token(name) {
            self.err(path, format!("{name:?} is not a valid header name"));
        } else if edit
            && FORBIDDEN_EDIT_HEADERS
                .iter()
                .any(|f| f.eq_ignore_ascii_case(name))
        {
            self.err(
                path,
                format!(
                    "{name:?} cannot be edited: zgix manages hop-by-hop, framing and Host headers itself"
                ),
            );
        }
    }

    /// A value zgix will write (or compare after trimming): no CR, LF or NUL
    /// (RFC 9110 §5.5), no surrounding whitespace, bounded length.
    fn header_value(&mut self, path: &str, v: &str) {
        if self.value_bytes(path, v) && v != v.trim_matches([' ', '\t']) {
            self.err(path, "must not start or end with a space or tab");
        }
    }

    /// Length and CR/LF/NUL check; true when both pass.
    fn value_bytes(&mut self, path: &str, v: &str) -> bool {
        if v.len() > MAX_FILTER_HEADER_VALUE_BYTES {
            self.err(
                path,
                format!(
                    "must be at most {MAX_FILTER_HEADER_VALUE_BYTES} bytes long, got {}",
                    v.len()
                ),
            );
            false
        } else if v.contains(['\r', '\n', '\0']) {
            self.err(path, "must not contain CR, LF or NUL");
            false
        } else {
            true
        }
    }

    fn header_pairs(&mut self, path: &str, pairs: &[(String, String)]) {
        for (i, (name, value)) in pairs.iter().enumerate() {
            self.header_name(&format!("{path}[{i}][0]"), name, true);
            self.header_value(&format!("{path}[{i}][1]"), value);
        }
    }

    fn header_names(&mut self, path: &str, names: &[String]) {
        for (i, name) in names.iter().enumerate() {
            self.header_name(&format!("{path}[{i}]"), name, true);
        }
    }

    fn action(&mut self, path: &str, action: &Action) {
        match action {
            Action::Allow(_) => {}
            Action::Reject(r) => self.range(&format!("{path}.status"), r.status, 400, 599),
            Action::Redirect(r) => {
                if ![301, 302, 307, 308].contains(&r.status) {
                    self.err(
                        format!("{path}.status"),
                        format!("must be 301, 302, 307 or 308, got {}", r.status),
                    );
                }
                let p = format!("{path}.location");
                if r.location.is_empty() {
                    self.err(&p, "must not be empty");
                } else {
                    self.header_value(&p, &r.location);
                }
            }
            Action::Respond(r) => {
                self.range(&format!("{path}.status"), r.status, 200, 599);
                self.header_pairs(&format!("{path}.headers"), &r.headers);
                let p = format!("{path}.body");
                if r.body.len() > MAX_RESPOND_BODY_BYTES {
                    self.err(
                        &p,
                        format!(
                            "must be at most {MAX_RESPOND_BODY_BYTES} bytes long, got {}",
                            r.body.len()
                        ),
                    );
                }
                // RFC 9110 §15.3.5 and §15.4.5: these responses end at the head.
                if matches!(r.status, 204 | 304) && !r.body.is_empty() {
                    self.err(
                        &p,
                        format!("must be empty: a {} response has no body", r.status),
                    );
                }
            }
            Action::RequestHeaders(h) => {
                if h.set.is_empty() && h.add.is_empty() && h.remove.is_empty() {
                    self.err(path, "must set, add or remove at least one header");
                }
                self.header_pairs(&format!("{path}.set"), &h.set);
                self.header_pairs(&format!("{path}.add"), &h.add);
                self.header_names(&format!("{path}.remove"), &h.remove);
                // zgix writes X-Forwarded-For itself (client-supplied values, then
                // the client address); `remove` drops the client-supplied values.
                for (list, pairs) in [("set", &h.set), ("add", &h.add)] {
                    for (i, (name, _)) in pairs.iter().enumerate() {
                        if name.eq_ignore_ascii_case("x-forwarded-for") {
                            self.err(
                                format!("{path}.{list}[{i}][0]"),
                                "\"X-Forwarded-For\" is written by zgix; use remove to drop client-supplied values",
                            );
                        }
                    }
                }
            }
            Action::ResponseHeaders(h) => {
                if h.set.is_empty() && h.remove.is_empty() {
                    self.err(path, "must set or remove at least one header");
                }
                self.header_pairs(&format!("{path}.set"), &h.set);
                self.header_names(&format!("{path}.remove"), &h.remove);
            }
            Action::Rewrite(r) => {
                self.path_string(&format!("{path}.prefix"), &r.prefix);
                self.path_string(&format!("{path}.replacement"), &r.replacement);
            }
            Action::Route(r) => self.cluster_ref(&format!("{path}.cluster"), &r.cluster),
        }
    }

    fn limits(&mut self) {
        let l = &self.config.limits;
        self.range(
            "limits.max_request_line",
            l.max_request_line,
            MIN_MAX_REQUEST_LINE,
            MAX_MAX_REQUEST_LINE,
        );
        // The head includes the request line, so it can never be the smaller.
        self.range(
            "limits.max_header_bytes",
            l.max_header_bytes,
            l.max_request_line,
            MAX_MAX_HEADER_BYTES,
        );
        self.range("limits.max_headers", l.max_headers, 1, MAX_MAX_HEADERS);
        self.range(
            "limits.max_response_header_bytes",
            l.max_response_header_bytes,
            MIN_MAX_RESPONSE_HEADER_BYTES,
            MAX_MAX_RESPONSE_HEADER_BYTES,
        );
        self.range(
            "limits.buffer_bytes",
            l.buffer_bytes,
            MIN_BUFFER_BYTES,
            MAX_BUFFER_BYTES,
        );
        for (name, v) in [
            ("client_header_timeout_ms", l.client_header_timeout_ms),
            ("client_idle_timeout_ms", l.client_idle_timeout_ms),
            ("client_body_timeout_ms", l.client_body_timeout_ms),
            ("upstream_connect_timeout_ms", l.upstream_connect_timeout_ms),
            ("upstream_header_timeout_ms", l.upstream_header_timeout_ms),
            ("upstream_idle_timeout_ms", l.upstream_idle_timeout_ms),
            (
                "upstream_pool_idle_timeout_ms",
                l.upstream_pool_idle_timeout_ms,
            ),
            ("drain_timeout_ms", l.drain_timeout_ms),
            ("proxy_protocol_timeout_ms", l.proxy_protocol_timeout_ms),
            ("tunnel_idle_timeout_ms", l.tunnel_idle_timeout_ms),
        ] {
            self.range(&format!("limits.{name}"), v, MIN_TIMEOUT_MS, MAX_TIMEOUT_MS);
        }
        self.range("limits.busy_poll_us", l.busy_poll_us, 0, MAX_BUSY_POLL_US);
        self.range(
            "limits.upstream_pool_idle_per_endpoint",
            l.upstream_pool_idle_per_endpoint,
            0,
            MAX_UPSTREAM_POOL_IDLE_PER_ENDPOINT,
        );
        self.range(
            "limits.rate_limit_entries",
            l.rate_limit_entries,
            1,
            MAX_TABLE_ENTRIES,
        );
        self.range(
            "limits.conn_limit_entries",
            l.conn_limit_entries,
            1,
            MAX_TABLE_ENTRIES,
        );
        if let Some(m) = l.max_connections {
            self.range("limits.max_connections", m, 1, MAX_CONNECTIONS);
        }
        let io = &self.config.io;
        if !io.recv_buffers.is_power_of_two()
            || !(MIN_RECV_BUFFERS..=MAX_RECV_BUFFERS).contains(&io.recv_buffers)
        {
            self.err(
                "io.recv_buffers",
                format!(
                    "must be a power of two between {MIN_RECV_BUFFERS} and {MAX_RECV_BUFFERS}, got {}",
                    io.recv_buffers
                ),
            );
        }
        self.range(
            "io.recv_buffer_bytes",
            io.recv_buffer_bytes,
            MIN_RECV_BUFFER_BYTES,
            MAX_RECV_BUFFER_BYTES,
        );
        self.range(
            "io.idle_exchanges",
            io.idle_exchanges,
            0,
            MAX_IDLE_EXCHANGES,
        );
    }
}

/// RFC 9110 §5.6.2 token: one or more tchar.
/// A pct-encoded triplet that can never occur in a canonical path: an unreserved
/// character (zgix decodes those before matching, so `%61` never matches) or an
/// encoded `/` or `\` (requests carrying one are refused 400).
fn encoded_path_char(s: &str) -> Option<String> {
    let b = s.as_bytes();
    (0..b.len().saturating_sub(2)).find_map(|i| {
        let triplet = s.get(i..i + 3)?;
        let c = u8::from_str_radix(triplet.strip_prefix('%')?, 16).ok()?;
        if c == b'/' || c == b'\\' {
            Some(format!(
                "contains {triplet:?}: a request path with an encoded '/' or '\\' is refused 400, so it never matches"
            ))
        } else if c.is_ascii_alphanumeric() || b"-._~".contains(&c) {
            Some(format!(
                "contains {triplet:?}: paths are matched with unreserved characters decoded, write {:?}",
                char::from(c)
            ))
        } else {
            None
        }
    })
}

pub(crate) fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

fn is_cluster_name(name: &str) -> bool {
    (1..=MAX_CLUSTER_NAME_BYTES).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
}

/// A `hosts` entry: a DNS name or IPv4 literal, or a bracketed IPv6 literal,
/// never with a port (the matcher strips the request's port before comparing).
fn check_host(host: &str) -> Result<(), String> {
    if host.is_empty() || host.len() > MAX_HOST_BYTES {
        return Err(format!(
            "must be between 1 and {MAX_HOST_BYTES} bytes long, got {}",
            host.len()
        ));
    }
    if let Some(inner) = host.strip_prefix('[') {
        return match inner.strip_suffix(']').map(str::parse::<Ipv6Addr>) {
            Some(Ok(_)) => Ok(()),
            _ => Err(format!(
                "{host:?} is not a bracketed IPv6 address such as \"[2001:db8::1]\" (ports are not allowed)"
            )),
        };
    }
    if host.contains(':') {
        return Err(format!(
            "{host:?} must not include a port; write an IPv6 address in brackets"
        ));
    }
    if !host
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b))
    {
        return Err(format!(
            "{host:?} is not a host name: use letters, digits, '-', '.' and '_'"
        ));
    }
    Ok(())
}

mod admission;
mod cluster;
mod http2;
mod observe;
#[cfg(test)]
mod tests;
mod tls;
