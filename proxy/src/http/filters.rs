//! request_filters: the per-listener rule walk (matchers and actions), compiled once at load.
//!
//! The walk runs after the WAF, once per admitted request. Matchers always see
//! the request as the client sent it. Non-terminal actions are remembered (their
//! rule indices go into the connection's reused [`Walk`]) and applied when the
//! head is written upstream or the response head is written back; terminal
//! actions answer at once. Nothing here allocates per request: every string was
//! turned into bytes (lower-cased where matching ignores case) at load.

use std::io::Write as _;
use std::net::IpAddr;

use ipnet::IpNet;
use zgix_config::{Action, HeaderTest, PathMatch, RequestFilter};
use zgix_parser::RequestHead;

enum HeaderTestRt {
    Present(bool),
    Equals(Vec<u8>),
    Contains(Vec<u8>),
}

struct HeaderMatchRt {
    name: Vec<u8>,
    test: HeaderTestRt,
}

enum ActionRt {
    Allow,
    Reject(u16),
    Redirect {
        status: u16,
        location: Vec<u8>,
    },
    Respond {
        status: u16,
        headers: Vec<u8>,
        body: Vec<u8>,
        /// Whether `headers` already carries `date` / `server`.
        has_date: bool,
        has_server: bool,
    },
    RequestHeaders {
        set: Vec<(Vec<u8>, Vec<u8>)>,
        add: Vec<(Vec<u8>, Vec<u8>)>,
        remove: Vec<Vec<u8>>,
    },
    ResponseHeaders {
        set: Vec<(Vec<u8>, Vec<u8>)>,
        remove: Vec<Vec<u8>>,
    },
    Rewrite {
        prefix: Vec<u8>,
        replacement: Vec<u8>,
    },
    Route(usize),
}

struct RuleRt {
    /// `name`, for the access log's `filter:<name>` decision.
    name: Option<String>,
    methods: Option<Vec<Vec<u8>>>,
    hosts: Option<Vec<Vec<u8>>>,
    path: Option<(bool, Vec<u8>)>,
    headers: Vec<HeaderMatchRt>,
    clients: Option<Vec<IpNet>>,
    action: ActionRt,
}

/// A listener's compiled filters.
pub struct FiltersRt {
    rules: Vec<RuleRt>,
    /// Longest a path can grow through every rewrite applying once each.
    path_growth: usize,
}

/// The result of one walk, kept in the connection and reused.
pub struct Walk {
    /// Indices of matched non-terminal rules with edits, in walk order.
    matched: Vec<u16>,
    /// Cluster chosen by the last matching `route`, if any.
    pub cluster: Option<usize>,
    /// Whether a rewrite changed the path (then `path` holds it).
    pub rewritten: bool,
    /// The rewritten path (capacity reserved at connection start).
    pub path: Vec<u8>,
    /// Whether any matched rule edits response headers.
    pub edits_response: bool,
}

/// What the walk decided.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Forward (after `allow` or the end of the list).
    Route,
    /// A terminal reject/redirect/respond rule: answer with [`FiltersRt::write_terminal`].
    Answer(u16),
}

fn lower(s: &str) -> Vec<u8> {
    s.as_bytes().to_ascii_lowercase()
}

fn pairs(v: &[(String, String)]) -> Vec<(Vec<u8>, Vec<u8>)> {
    v.iter()
        .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
        .collect()
}

fn contains_ci(hay: &[u8], needle: &[u8]) -> bool {
    needle.is_empty()
        || hay
            .windows(needle.len())
            .any(|w| w.eq_ignore_ascii_case(needle))
}

fn trim(v: &[u8]) -> &[u8] {
    let s = v
        .iter()
        .position(|b| *b != b' ' && *b != b'\t')
        .unwrap_or(v.len());
    let e = v
        .iter()
        .rposition(|b| *b != b' ' && *b != b'\t')
        .map_or(s, |e| e + 1);
    &v[s..e]
}

/// The host part of a Host value: `[v6]:port` → `[v6]`, `name:port` → `name`.
fn host_without_port(h: &[u8]) -> &[u8] {
    if h.first() == Some(&b'[') {
        return match memchr::memchr(b']', h) {
            Some(i) => &h[..=i],
            None => h,
        };
    }
    match memchr::memrchr(b':', h) {
        Some(i) => &h[..i],
        None => h,
    }
}

impl FiltersRt {
    /// Compiles a validated filter list; `cluster` maps a cluster name to its index.
    pub fn build(filters: &[RequestFilter], cluster: impl Fn(&str) -> usize) -> FiltersRt {
        let mut path_growth = 0;
        let rules = filters
            .iter()
            .map(|f| {
                let m = &f.matcher;
                let action = match &f.action {
                    Action::Allow(_) => ActionRt::Allow,
                    Action::Reject(r) => ActionRt::Reject(r.status),
                    Action::Redirect(r) => ActionRt::Redirect {
                        status: r.status,
                        location: r.location.as_bytes().to_vec(),
                    },
                    Action::Respond(r) => {
                        let mut headers = Vec::new();
                        for (k, v) in &r.headers {
                            let _ = write!(headers, "{k}: {v}\r\n");
                        }
                        let has =
                            |n: &str| r.headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(n));
                        ActionRt::Respond {
                            status: r.status,
                            headers,
                            body: r.body.as_bytes().to_vec(),
                            has_date: has("date"),
                            has_server: has("server"),
                        }
                    }
                    Action::RequestHeaders(h) => ActionRt::RequestHeaders {
                        set: pairs(&h.set),
                        add: pairs(&h.add),
                        remove: h.remove.iter().map(|n| lower(n)).collect(),
                    },
                    Action::ResponseHeaders(h) => ActionRt::ResponseHeaders {
                        set: pairs(&h.set),
                        remove: h.remove.iter().map(|n| lower(n)).collect(),
                    },
                    Action::Rewrite(r) => {
                        path_growth += r.replacement.len();
                        ActionRt::Rewrite {
                            prefix: r.prefix.as_bytes().to_vec(),
                            replacement: r.replacement.as_bytes().to_vec(),
                        }
                    }
                    Action::Route(r) => ActionRt::Route(cluster(&r.cluster)),
                };
                RuleRt {
                    name: f.name.clone(),
                    methods: m
                        .methods
                        .as_ref()
                        .map(|v| v.iter().map(|s| s.as_bytes().to_vec()).collect()),
                    hosts: m
                        .hosts
                        .as_ref()
                        .map(|v| v.iter().map(|s| lower(s)).collect()),
                    path: m.path.as_ref().map(|p| match p {
                        PathMatch::Exact(s) => (true, s.as_bytes().to_vec()),
                        PathMatch::Prefix(s) => (false, s.as_bytes().to_vec()),
                    }),
                    headers: m
                        .headers
                        .iter()
                        .flatten()
                        .map(|h| HeaderMatchRt {
                            name: lower(&h.name),
                            test: match h.test() {
                                HeaderTest::Present(p) => HeaderTestRt::Present(p),
                                HeaderTest::Equals(v) => HeaderTestRt::Equals(lower(v)),
                                HeaderTest::Contains(v) => HeaderTestRt::Contains(lower(v)),
                            },
                        })
                        .collect(),
                    clients: m.clients.clone(),
                    action,
                }
            })
            .collect();
        FiltersRt { rules, path_growth }
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Rule `i`'s `name`, if it has one.
    pub fn rule_name(&self, i: u16) -> Option<&str> {
        self.rules.get(i as usize)?.name.as_deref()
    }

    /// A [`Walk`] sized for this listener, made once per connection.
    pub fn new_walk(&self, max_path: usize) -> Walk {
        Walk {
            matched: Vec::with_capacity(self.rules.len()),
            cluster: None,
            rewritten: false,
            path: Vec::with_capacity(max_path + self.path_growth + 1),
            edits_response: false,
        }
    }

    fn matches(&self, r: &RuleRt, req: &RequestHead, base: &[u8], client: IpAddr) -> bool {
        if let Some(ms) = &r.methods {
            let m = req.method_span.get(base);
            if !ms.iter().any(|x| x.as_slice() == m) {
                return false;
            }
        }
        if let Some(hs) = &r.hosts {
            // The host the origin will see: an absolute-form target's authority
            // replaces Host (RFC 9112 §3.2.2), so matchers must use it too.
            let Some(h) = req.authority.or(req.host) else {
                return false;
            };
            let h = host_without_port(h.get(base));
            if !hs.iter().any(|x| x.eq_ignore_ascii_case(h)) {
                return false;
            }
        }
        if let Some((exact, p)) = &r.path {
            let path = req.canonical_path.as_slice();
            let ok = if *exact {
                path == p.as_slice()
            } else {
                path.starts_with(p)
            };
            if !ok {
                return false;
            }
        }
        for hm in &r.headers {
            // `host` under an absolute-form target is the authority (see hosts).
            let authority = match req.authority {
                Some(a) if hm.name == b"host" => Some(a.get(base)),
                _ => None,
            };
            let fields = req
                .headers
                .iter()
                .filter(|h| authority.is_none() && h.name.get(base).eq_ignore_ascii_case(&hm.name))
                .map(|h| trim(h.value.get(base)));
            let mut values = authority.into_iter().chain(fields);
            let ok = match &hm.test {
                HeaderTestRt::Present(p) => values.next().is_some() == *p,
                HeaderTestRt::Equals(v) => values.any(|x| x.eq_ignore_ascii_case(v)),
                HeaderTestRt::Contains(v) => values.any(|x| contains_ci(x, v)),
            };
            if !ok {
                return false;
            }
        }
        if let Some(nets) = &r.clients {
            if !nets.iter().any(|n| n.contains(&client)) {
                return false;
            }
        }
        true
    }

    /// Walks the rules in order for one request.
    pub fn walk(&self, req: &RequestHead, base: &[u8], client: IpAddr, w: &mut Walk) -> Verdict {
        w.matched.clear();
        w.cluster = None;
        w.rewritten = false;
        w.edits_response = false;
        for (i, r) in self.rules.iter().enumerate() {
            if !self.matches(r, req, base, client) {
                continue;
            }
            match &r.action {
                ActionRt::Allow => return Verdict::Route,
                ActionRt::Reject(_) | ActionRt::Redirect { .. } | ActionRt::Respond { .. } => {
                    return Verdict::Answer(i as u16)
                }
                ActionRt::Route(c) => w.cluster = Some(*c),
                ActionRt::Rewrite {
                    prefix,
                    replacement,
                } => {
                    // Rewrites chain: each sees the path the previous one left.
                    let cur: &[u8] = if w.rewritten {
                        &w.path
                    } else {
                        &req.canonical_path
                    };
                    if cur.starts_with(prefix) {
                        if !w.rewritten {
                            w.path.clear();
                            w.path.extend_from_slice(&req.canonical_path);
                        }
                        // In place; capacity was reserved for every rewrite's growth.
                        w.path.splice(..prefix.len(), replacement.iter().copied());
                        w.rewritten = true;
                    }
                }
                ActionRt::RequestHeaders { .. } => w.matched.push(i as u16),
                ActionRt::ResponseHeaders { .. } => {
                    w.edits_response = true;
                    w.matched.push(i as u16);
                }
            }
        }
        Verdict::Route
    }

    /// Writes the complete answer of terminal rule `i` into `out` and returns
    /// its status. Redirects and rejects carry no body; `respond` carries its
    /// own, except to HEAD (RFC 9110 §9.3.2) and for statuses that never have
    /// one, which also get no Content-Length (1xx, 204, 304: RFC 9110 §8.6).
    /// `connection` is what zgix does next: `close`, `keep-alive` for an
    /// HTTP/1.0 client it keeps (RFC 9112 §9.3), nothing otherwise. The
    /// answer carries the request's ID (`x-request-id`) unless it is empty.
    pub fn write_terminal(
        &self,
        i: u16,
        keep_alive: bool,
        http10: bool,
        head_request: bool,
        request_id: &[u8],
        out: &mut Vec<u8>,
    ) -> u16 {
        out.clear();
        let conn: &[u8] = match (keep_alive, http10) {
            (false, _) => b"connection: close\r\n",
            (true, true) => b"connection: keep-alive\r\n",
            (true, false) => b"",
        };
        let mut own = (false, false);
        let (status, location, headers, body): (u16, Option<&[u8]>, &[u8], &[u8]) =
            match &self.rules[i as usize].action {
                ActionRt::Reject(s) => (*s, None, b"", b""),
                ActionRt::Redirect { status, location } => (*status, Some(location), b"", b""),
                ActionRt::Respond {
                    status,
                    headers,
                    body,
                    has_date,
                    has_server,
                } => {
                    own = (*has_date, *has_server);
                    (*status, None, headers, body)
                }
                _ => (500, None, b"", b""),
            };
        let _ = write!(
            out,
            "HTTP/1.1 {status} {}\r\n",
            crate::http::respond::reason(status)
        );
        crate::http::respond::write_stamp(out, own.0, own.1);
        crate::http::respond::write_request_id(out, request_id);
        if let Some(l) = location {
            out.extend_from_slice(b"location: ");
            out.extend_from_slice(l);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(headers);
        let bodiless = matches!(status, 100..=199 | 204 | 304);
        if !bodiless {
            let _ = write!(out, "content-length: {}\r\n", body.len());
        }
        out.extend_from_slice(conn);
        out.extend_from_slice(b"\r\n");
        if !bodiless && !head_request {
            out.extend_from_slice(body);
        }
        status
    }

    fn header_actions<'a>(
        &'a self,
        w: &'a Walk,
    ) -> impl Iterator<Item = (usize, &'a ActionRt)> + 'a {
        w.matched
            .iter()
            .enumerate()
            .map(move |(k, &i)| (k, &self.rules[i as usize].action))
    }

    /// True when a matched `request_headers` edit removes or sets `name`: the
    /// client's own fields of that name are not forwarded.
    pub fn request_drops(&self, w: &Walk, name: &[u8]) -> bool {
        self.header_actions(w).any(|(_, a)| match a {
            ActionRt::RequestHeaders { set, remove, .. } => {
                remove.iter().any(|r| r.eq_ignore_ascii_case(name))
                    || set.iter().any(|(k, _)| k.eq_ignore_ascii_case(name))
            }
            _ => false,
        })
    }

    /// Appends the fields matched `request_headers` edits add, with the walk's
    /// sequential meaning: within an action remove, then set, then add; a later
    /// action's remove or set of a name cancels what earlier ones put there.
    pub fn write_request_additions(&self, w: &Walk, out: &mut Vec<u8>) {
        for (k, a) in self.header_actions(w) {
            let ActionRt::RequestHeaders { set, add, .. } = a else {
                continue;
            };
            for (name, value) in set.iter().chain(add.iter()) {
                if self.later_request_override(w, k, name) {
                    continue;
                }
                out.extend_from_slice(name);
                out.extend_from_slice(b": ");
                out.extend_from_slice(value);
                out.extend_from_slice(b"\r\n");
            }
        }
    }

    fn later_request_override(&self, w: &Walk, k: usize, name: &[u8]) -> bool {
        self.header_actions(w).skip(k + 1).any(|(_, a)| match a {
            ActionRt::RequestHeaders { set, remove, .. } => {
                remove.iter().any(|r| r.eq_ignore_ascii_case(name))
                    || set.iter().any(|(n, _)| n.eq_ignore_ascii_case(name))
            }
            _ => false,
        })
    }

    /// True when a matched `response_headers` edit removes or sets `name`.
    pub fn response_drops(&self, w: &Walk, name: &[u8]) -> bool {
        self.header_actions(w).any(|(_, a)| match a {
            ActionRt::ResponseHeaders { set, remove } => {
                remove.iter().any(|r| r.eq_ignore_ascii_case(name))
                    || set.iter().any(|(k, _)| k.eq_ignore_ascii_case(name))
            }
            _ => false,
        })
    }

    /// Appends the fields matched `response_headers` edits set (later edits win).
    pub fn write_response_additions(&self, w: &Walk, out: &mut Vec<u8>) {
        for (k, a) in self.header_actions(w) {
            let ActionRt::ResponseHeaders { set, .. } = a else {
                continue;
            };
            for (name, value) in set {
                let overridden = self.header_actions(w).skip(k + 1).any(|(_, b)| match b {
                    ActionRt::ResponseHeaders { set, remove } => {
                        remove.iter().any(|r| r.eq_ignore_ascii_case(name))
                            || set.iter().any(|(n, _)| n.eq_ignore_ascii_case(name))
                    }
                    _ => false,
                });
                if overridden {
                    continue;
                }
                out.extend_from_slice(name);
                out.extend_from_slice(b": ");
                out.extend_from_slice(value);
                out.extend_from_slice(b"\r\n");
            }
        }
    }
}
