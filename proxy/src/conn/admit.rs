//! Admission of a parsed request, in the specification's order (rate limit, connection limit, WAF), then request_filters and routing.

use zgix_admission::{ClientId, ConnDecision, RateDecision, Spent};
use zgix_parser::{BodyKind, Method, Version};

use super::state::Held;
use super::{Conn, Exchange, Next};
use crate::http::filters::Verdict;
use crate::observe::decision::{Control, Decision};
use crate::observe::metrics::Admission;

/// What one admission control says of a request.
enum Gate {
    Pass,
    /// It would refuse, but runs in dry-run mode: counted, forwarded.
    DryRun(Control),
    Refuse {
        status: u16,
        retry_after: Option<u64>,
        decision: Decision,
    },
}

impl Conn {
    /// Gives back the token this request took from its client's bucket, if
    /// it took one (a 503 from the connection limit; a 413 once a chunked
    /// body outgrew `max_request_body`, whose size no check could know).
    pub(super) fn refund_token(&mut self) {
        if let Some(s) = self.token.take() {
            self.shard.rt.rate_table.refund_spent(s);
        }
    }

    /// The identity the rate limit keys this request by: the hashed value of the
    /// listener's key field when the request carries it (the first such field), else
    /// the client's address identity.
    fn rate_id(&self, x: &Exchange, key_header: Option<&[u8]>) -> ClientId {
        let Some(name) = key_header else {
            return self.id;
        };
        let base = x.cl.bytes();
        x.req
            .headers
            .iter()
            .find(|h| h.name.get(base).eq_ignore_ascii_case(name))
            .map_or(self.id, |h| ClientId::from_key(h.value.get(base)))
    }

    /// One parsed request from admission to its last response byte, with
    /// its access-log record and duration (every decision counted). It owns
    /// the request state while it runs (in its slab block, not in the idle
    /// connection's future) and hands it back with how the connection goes on.
    pub(super) async fn handle_request(&mut self, mut x: Held) -> (Next, Held) {
        let next = self.handle(&mut x).await;
        (next, x)
    }

    async fn handle(&mut self, x: &mut Exchange) -> Next {
        let shard = self.shard.clone();
        // Counted while handled: a drain cut at its deadline reports it.
        let _in_flight = shard.request_started();
        let t0 = self.shard.driver.now();
        self.begin_record(x);
        let next = self.admit_and_route(x, t0).await;
        self.end_record(x, t0, next);
        x.rate_fields.clear();
        next
    }

    /// Admission, then forwarding. The order is the spec's: a malformed head was
    /// refused before this point (no token spent); then rate limit, connection
    /// limit, WAF, and only then routing.
    async fn admit_and_route(&mut self, x: &mut Exchange, t0: std::time::Instant) -> Next {
        self.token = None;
        // The first dry-run control that would have refused names the decision.
        let mut dry: Option<Control> = None;
        for control in [Control::RateLimit, Control::ConnLimit, Control::Waf] {
            let gate = match control {
                Control::RateLimit => self.check_rate(x, t0),
                Control::ConnLimit => self.check_conn(),
                Control::Waf => self.check_waf(x),
            };
            match gate {
                Gate::Pass => {}
                Gate::DryRun(c) => dry = dry.or(Some(c)),
                Gate::Refuse {
                    status,
                    retry_after,
                    decision,
                } => {
                    x.rec.decision = decision;
                    self.refuse(x, status, retry_after).await;
                    return Next::Close;
                }
            }
        }
        if let Some(d) = dry {
            x.rec.decision = Decision::DryRun(d);
        }
        let shard = self.shard.clone();
        let lst = &shard.rt.listeners[self.li];
        let mut cluster = lst.cluster;
        let filtered = !lst.filters.is_empty();
        if filtered {
            let base = x.cl.bytes();
            match lst.filters.walk(&x.req, base, self.ip, &mut x.walk) {
                Verdict::Route => {
                    if let Some(cl) = x.walk.cluster {
                        cluster = cl;
                    }
                }
                Verdict::Answer(rule) => return self.answer_by_filter(x, rule).await,
            }
        }
        self.forward(x, cluster, filtered).await
    }

    /// The rate limit: takes a token from the request's bucket (kept in
    /// `self.token` to be refunded), writes the RateLimit fields if asked.
    fn check_rate(&mut self, x: &mut Exchange, t0: std::time::Instant) -> Gate {
        let shard = self.shard.clone();
        let rt = &shard.rt;
        let lst = &rt.listeners[self.li];
        let (c, li) = (&shard.counters, self.li);
        let Some(p) = lst.rate_limit else {
            return Gate::Pass;
        };
        let id = self.rate_id(x, lst.rate.key_header.as_deref());
        let now = zgix_admission::monotonic_ns_at(t0);
        let rc = if let Some(tag) = lst.rate.fleet {
            rt.rate_table.check_fleet(id, p, now, rt.overflow, tag)
        } else {
            rt.rate_table.check_with(id, p, now, rt.overflow)
        };
        c.rate_probe(rc.depth);
        if let Some(prefix) = &lst.rate.headers {
            // An identity without a bucket of its own is told nothing about the
            // shared one (other clients' spending): none left, a window away.
            let (r, t) = if rc.overflowed {
                (0, p.window_ms.div_ceil(1000).max(1))
            } else {
                (rc.remaining, rc.next_token_secs)
            };
            crate::http::ratelimit::write(&mut x.rate_fields, prefix, r, t);
        }
        if rc.overflowed {
            c.admission(li, Admission::RateLimitFull);
        }
        match rc.decision {
            RateDecision::Allowed => {
                self.token = Some(Spent {
                    id,
                    params: p,
                    shared: rc.overflowed,
                    fleet: lst.rate.fleet.is_some(),
                });
                Gate::Pass
            }
            RateDecision::TableFull => Gate::Pass,
            RateDecision::Limited { .. } if lst.rate.dry_run => {
                c.dry_run(li, Control::RateLimit);
                Gate::DryRun(Control::RateLimit)
            }
            RateDecision::Limited { retry_after_secs } => {
                c.admission(li, Admission::RateLimited);
                Gate::Refuse {
                    status: 429,
                    retry_after: Some(retry_after_secs),
                    decision: Decision::RateLimited,
                }
            }
        }
    }

    /// The connection limit: checked once per connection, at its first
    /// request; the slot is held until the connection ends.
    fn check_conn(&mut self) -> Gate {
        let shard = self.shard.clone();
        let lst = &shard.rt.listeners[self.li];
        let (c, li) = (&shard.counters, self.li);
        let Some(max) = lst.conn_limit.filter(|_| !self.conn_checked) else {
            return Gate::Pass;
        };
        let (decision, depth) = shard.rt.conn_table.acquire_probed(self.id, max);
        c.conn_probe(depth);
        match decision {
            ConnDecision::Admitted(g) => {
                self.conn_slot = Some(g);
                self.conn_checked = true;
                Gate::Pass
            }
            ConnDecision::TableFull => {
                c.admission(li, Admission::ConnLimitFull);
                self.conn_checked = true;
                Gate::Pass
            }
            ConnDecision::Limited if lst.conn_dry_run => {
                // Counted once per connection, as enforcing would refuse it once.
                c.dry_run(li, Control::ConnLimit);
                self.conn_checked = true;
                Gate::DryRun(Control::ConnLimit)
            }
            ConnDecision::Limited => {
                c.admission(li, Admission::ConnLimited);
                // The two controls are independent: a request the
                // connection limit refuses spends no token.
                self.refund_token();
                Gate::Refuse {
                    status: 503,
                    retry_after: None,
                    decision: Decision::ConnLimited,
                }
            }
        }
    }

    /// The WAF-lite denylist over the path, query, authority and field values.
    fn check_waf(&self, x: &Exchange) -> Gate {
        let lst = &self.shard.rt.listeners[self.li];
        let (c, li) = (&self.shard.counters, self.li);
        let Some(waf) = &lst.waf else {
            return Gate::Pass;
        };
        let base = x.cl.bytes();
        let req = &x.req;
        let m = &waf.matcher;
        // The authority of an absolute-form target becomes the Host the
        // origin sees, so it is scanned like the Host field would be.
        let hit = m.is_match(&req.canonical_path)
            || req.query.is_some_and(|q| m.is_match(q.get(base)))
            || req.authority.is_some_and(|a| m.is_match(a.get(base)))
            || req.headers.iter().any(|h| m.is_match(h.value.get(base)));
        if !hit {
            Gate::Pass
        } else if waf.dry_run {
            c.dry_run(li, Control::Waf);
            Gate::DryRun(Control::Waf)
        } else {
            c.admission(li, Admission::WafBlocked);
            Gate::Refuse {
                status: waf.status,
                retry_after: None,
                decision: Decision::Waf,
            }
        }
    }

    /// A request filter answered the request itself (rule `rule`).
    async fn answer_by_filter(&mut self, x: &mut Exchange, rule: u16) -> Next {
        let shard = self.shard.clone();
        let filters = &shard.rt.listeners[self.li].filters;
        // Keep the connection only when no body is left unread.
        let keep = x.req.keep_alive
            && matches!(x.req.body, BodyKind::None | BodyKind::Length(0))
            && !shard.draining.get();
        let status = filters.write_terminal(
            rule,
            keep,
            x.req.version == Version::Http10,
            x.req.method == Method::Head,
            x.rec.request_id.as_bytes(),
            &mut x.out,
        );
        shard.counters.response(self.li, status);
        x.rec.decision = Decision::Filter(rule);
        x.rec.status = status;
        crate::http::ratelimit::insert(&mut x.out, &x.rate_fields);
        if !keep {
            self.client.closing();
        }
        if self.client.write_all(&x.out).await.is_err() || !keep {
            return Next::Close;
        }
        x.cl.consume(x.req.head_len);
        Next::KeepAlive
    }

    /// Starts the access-log record of the request whose head just parsed,
    /// copying what the log needs of the head (the buffer is reused for the body).
    fn begin_record(&mut self, x: &mut Exchange) {
        let (li, ip, peer, rx) = (self.li, self.ip, self.peer, self.client.bytes_read());
        let tx = self.client.bytes_written();
        let tls = self.client.log_facts().0;
        let h2 = self.client.is_h2();
        let base = x.cl.bytes();
        x.rec = crate::observe::access_log::Record::new(li, ip, peer);
        x.rec.tls = tls;
        x.rec.version = Some(x.req.version);
        let client_ids = x
            .req
            .headers
            .iter()
            .filter(|h| h.name.get(base).eq_ignore_ascii_case(b"x-request-id"))
            .map(|h| h.value.get(base));
        x.rec
            .request_id
            .choose(self.shard.rt.listeners[li].request_id, client_ids);
        x.rec.h2 = h2;
        if let Some(log) = &self.shard.access_log {
            let hs = x.req.headers.iter();
            (x.rec_headers).capture(
                log.captures(),
                hs.map(|h| (h.name.get(base), h.value.get(base))),
            );
        }
        x.rec_method.clear();
        x.rec_method.extend_from_slice(x.req.method_span.get(base));
        x.rec_query.clear();
        x.rec_has_query = x.req.query.is_some();
        if let Some(q) = x.req.query {
            x.rec_query.extend_from_slice(q.get(base));
        }
        x.rec_rx0 = rx - x.cl.pending() as u64;
        x.rec_tx0 = tx;
    }

    /// Counts the request's duration under its decision and writes its
    /// access-log line. `base` is gone by now: the record carries its copies.
    pub(super) fn end_record(&mut self, x: &mut Exchange, t0: std::time::Instant, next: Next) {
        let shard = self.shard.clone();
        let (rx, tx) = (self.client.bytes_read(), self.client.bytes_written());
        let li = self.li;
        x.rec.duration_us = shard.driver.now().saturating_duration_since(t0).as_micros() as u64;
        // Bytes of this request: what was read since its head began, minus
        // what is left for the next one. A refusal closes with its own head
        // still buffered (unconsumed): there is no next request, all of it counts.
        let left = if next == Next::Close {
            0
        } else {
            x.cl.pending() as u64
        };
        x.rec.bytes_in = rx.saturating_sub(x.rec_rx0).saturating_sub(left);
        x.rec.bytes_out = tx - x.rec_tx0;
        shard
            .counters
            .request_done(li, x.rec.decision, x.rec.duration_us.max(1));
        if let Some(log) = &shard.access_log {
            let t = crate::observe::access_log::Target {
                method: &x.rec_method,
                path: &x.req.canonical_path,
                query: x.rec_has_query.then_some(&x.rec_query[..]),
                sni: self.client.log_facts().1,
            };
            log.emit_with(&*shard.rt, &x.rec, &t, &x.rec_headers);
        }
    }

    /// Logs a request refused before its head parsed (400-class, 408): the
    /// request line is shown when it was whole and well formed (a 413, 431
    /// or CL+TE refusal of a head whose first line was fine), else `-`.
    pub(super) fn record_unparsed(&mut self, x: &mut Exchange, decision: Decision, tx0: u64) {
        let shard = self.shard.clone();
        let (li, ip, peer) = (self.li, self.ip, self.peer);
        let tx = self.client.bytes_written();
        let (status, id) = (x.rec.status, x.rec.request_id);
        let (tls, sni) = self.client.log_facts();
        x.rec = crate::observe::access_log::Record::new(li, ip, peer);
        x.rec.tls = tls;
        x.rec.status = status;
        x.rec.request_id = id;
        x.rec.decision = decision;
        x.rec.bytes_in = x.cl.pending() as u64;
        x.rec.bytes_out = tx - tx0;
        shard.counters.request_done(li, decision, 1);
        if let Some(log) = &shard.access_log {
            let line = request_line(x.cl.bytes());
            x.rec.version = line.map(|l| l.2);
            let (method, target) = line.map_or((&b""[..], &b""[..]), |l| (l.0, l.1));
            let (path, query) = match target.iter().position(|&b| b == b'?') {
                Some(q) => (&target[..q], Some(&target[q + 1..])),
                None => (target, None),
            };
            let t = crate::observe::access_log::Target {
                method,
                path,
                query,
                sni,
            };
            log.emit(&*shard.rt, &x.rec, &t);
        }
    }
}

/// The method, raw target and version of `head`'s first line when that
/// line is complete and well formed (`METHOD SP target SP HTTP/1.x CRLF`).
fn request_line(head: &[u8]) -> Option<(&[u8], &[u8], Version)> {
    let end = head.iter().position(|&b| b == b'\n')?;
    let line = head[..end].strip_suffix(b"\r")?;
    let mut parts = line.split(|&b| b == b' ');
    let (method, target, version) = (parts.next()?, parts.next()?, parts.next()?);
    let tchar = |b: &u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(b);
    let version = match version {
        b"HTTP/1.1" => Version::Http11,
        b"HTTP/1.0" => Version::Http10,
        _ => return None,
    };
    let ok = parts.next().is_none()
        && !method.is_empty()
        && method.iter().all(tchar)
        && !target.is_empty()
        && target.iter().all(u8::is_ascii_graphic);
    ok.then_some((method, target, version))
}
