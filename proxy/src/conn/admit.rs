//! Admission of a parsed request, in the specification's order (rate limit, connection limit, WAF), then request_filters and routing.

use zgix_admission::{ClientId, ConnDecision, RateDecision, Spent};
use zgix_parser::{BodyKind, Method, Version};

use super::{Conn, Next};
use crate::http::filters::Verdict;
use crate::observe::decision::{Control, Decision};
use crate::observe::metrics::Admission;

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
    fn rate_id(&self, key_header: Option<&[u8]>) -> ClientId {
        let Some(name) = key_header else {
            return self.id;
        };
        let x = self.x.as_ref().expect("a request state is held");
        let base = &x.cbuf[x.cstart..x.cend];
        x.req
            .headers
            .iter()
            .find(|h| h.name.get(base).eq_ignore_ascii_case(name))
            .map_or(self.id, |h| ClientId::from_key(h.value.get(base)))
    }

    /// One parsed request from admission to its last response byte, with
    /// its access-log record and duration (every decision counted).
    pub(super) async fn handle_request(&mut self) -> Next {
        let shard = self.shard.clone();
        // Counted while handled: a drain cut at its deadline reports it.
        let _in_flight = shard.request_started();
        let t0 = self.shard.driver.now();
        self.begin_record();
        let next = self.admit_and_route(t0).await;
        self.end_record(t0);
        if let Some(x) = self.x.as_mut() {
            x.rate_fields.clear();
        }
        next
    }

    /// Admission, then forwarding. The order is the spec's: a malformed head was
    /// refused before this point (no token spent); then rate limit, connection
    /// limit, WAF, and only then routing.
    async fn admit_and_route(&mut self, t0: std::time::Instant) -> Next {
        let shard = self.shard.clone();
        let rt = &shard.rt;
        let lst = &rt.listeners[self.li];
        let c = &shard.counters;
        let li = self.li;
        self.token = None;

        // The first dry-run control that would have refused names the decision.
        let mut dry: Option<Control> = None;
        if let Some(p) = lst.rate_limit {
            let id = self.rate_id(lst.rate.key_header.as_deref());
            let now = zgix_admission::monotonic_ns_at(t0);
            let rc = if lst.rate.fleet {
                rt.rate_table
                    .check_fleet(id, p, now, rt.overflow, self.li as u32)
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
                crate::http::ratelimit::write(&mut self.x().rate_fields, prefix, r, t);
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
                        fleet: lst.rate.fleet,
                    })
                }
                RateDecision::TableFull => {}
                RateDecision::Limited { .. } if lst.rate.dry_run => {
                    c.dry_run(li, Control::RateLimit);
                    dry = dry.or(Some(Control::RateLimit));
                }
                RateDecision::Limited { retry_after_secs } => {
                    c.admission(li, Admission::RateLimited);
                    self.x().rec.decision = Decision::RateLimited;
                    self.refuse(429, Some(retry_after_secs)).await;
                    return Next::Close;
                }
            }
        }
        if let Some(max) = lst.conn_limit {
            if !self.conn_checked {
                let (decision, depth) = rt.conn_table.acquire_probed(self.id, max);
                c.conn_probe(depth);
                match decision {
                    ConnDecision::Admitted(g) => {
                        self.conn_slot = Some(g);
                        self.conn_checked = true;
                    }
                    ConnDecision::TableFull => {
                        c.admission(li, Admission::ConnLimitFull);
                        self.conn_checked = true;
                    }
                    ConnDecision::Limited if lst.conn_dry_run => {
                        // Counted once per connection, as enforcing would refuse it once.
                        c.dry_run(li, Control::ConnLimit);
                        dry = dry.or(Some(Control::ConnLimit));
                        self.conn_checked = true;
                    }
                    ConnDecision::Limited => {
                        c.admission(li, Admission::ConnLimited);
                        self.x().rec.decision = Decision::ConnLimited;
                        // The two controls are independent: a request the
                        // connection limit refuses spends no token.
                        self.refund_token();
                        self.refuse(503, None).await;
                        return Next::Close;
                    }
                }
            }
        }
        if let Some(waf) = &lst.waf {
            let x = self.x.as_ref().expect("a request state is held");
            let base = &x.cbuf[x.cstart..x.cend];
            let req = &x.req;
            let m = &waf.matcher;
            // The authority of an absolute-form target becomes the Host the
            // origin sees, so it is scanned like the Host field would be.
            let hit = m.is_match(&req.canonical_path)
                || req.query.is_some_and(|q| m.is_match(q.get(base)))
                || req.authority.is_some_and(|a| m.is_match(a.get(base)))
                || req.headers.iter().any(|h| m.is_match(h.value.get(base)));
            if hit && waf.dry_run {
                c.dry_run(li, Control::Waf);
                dry = dry.or(Some(Control::Waf));
            } else if hit {
                c.admission(li, Admission::WafBlocked);
                self.x().rec.decision = Decision::Waf;
                self.refuse(waf.status, None).await;
                return Next::Close;
            }
        }
        if let Some(d) = dry {
            self.x().rec.decision = Decision::DryRun(d);
        }

        let mut cluster = lst.cluster;
        let filtered = !lst.filters.is_empty();
        if filtered {
            let ip = self.ip;
            let x = self.x();
            let base = &x.cbuf[x.cstart..x.cend];
            match lst.filters.walk(&x.req, base, ip, &mut x.walk) {
                Verdict::Route => {
                    if let Some(cl) = x.walk.cluster {
                        cluster = cl;
                    }
                }
                Verdict::Answer(rule) => {
                    // Keep the connection only when no body is left unread.
                    let keep = x.req.keep_alive
                        && matches!(x.req.body, BodyKind::None | BodyKind::Length(0))
                        && !shard.draining.get();
                    let status = lst.filters.write_terminal(
                        rule,
                        keep,
                        x.req.version == Version::Http10,
                        x.req.method == Method::Head,
                        &mut x.out,
                    );
                    c.response(li, status);
                    x.rec.decision = Decision::Filter(rule);
                    x.rec.status = status;
                    let x = self.x.as_mut().expect("a request state is held");
                    crate::http::ratelimit::insert(&mut x.out, &x.rate_fields);
                    if self.client.write_all(&x.out).await.is_err() || !keep {
                        return Next::Close;
                    }
                    x.cstart += x.req.head_len;
                    return Next::KeepAlive;
                }
            }
        }

        let _ = t0;
        self.forward(cluster, filtered).await
    }

    /// Starts the access-log record of the request whose head just parsed,
    /// copying what the log needs of the head (the buffer is reused for the body).
    fn begin_record(&mut self) {
        let (li, ip, peer, rx) = (self.li, self.ip, self.peer, self.client.bytes_read());
        let tx = self.client.bytes_written();
        let tls = self.client.log_facts().0;
        let h2 = self.client.is_h2();
        let x = self.x();
        let base = &x.cbuf[x.cstart..x.cend];
        x.rec = crate::observe::access_log::Record::new(li, ip, peer);
        x.rec.tls = tls;
        x.rec.version = Some(x.req.version);
        x.rec.h2 = h2;
        x.rec_method.clear();
        x.rec_method.extend_from_slice(x.req.method_span.get(base));
        x.rec_query.clear();
        x.rec_has_query = x.req.query.is_some();
        if let Some(q) = x.req.query {
            x.rec_query.extend_from_slice(q.get(base));
        }
        x.rec_rx0 = rx - (x.cend - x.cstart) as u64;
        x.rec_tx0 = tx;
    }

    /// Counts the request's duration under its decision and writes its
    /// access-log line. `base` is gone by now: the record carries its copies.
    pub(super) fn end_record(&mut self, t0: std::time::Instant) {
        let shard = self.shard.clone();
        let (rx, tx) = (self.client.bytes_read(), self.client.bytes_written());
        let li = self.li;
        let Some(x) = self.x.as_mut() else { return };
        x.rec.duration_us = shard.driver.now().saturating_duration_since(t0).as_micros() as u64;
        // Bytes of this request: what was read since its head began, minus
        // what is left for the next one.
        x.rec.bytes_in = rx
            .saturating_sub(x.rec_rx0)
            .saturating_sub((x.cend - x.cstart) as u64);
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
            log.emit(&*shard.rt, &x.rec, &t);
        }
    }

    /// Logs a request refused before it parsed (400-class, 408): no method,
    /// path or query to show.
    pub(super) fn record_unparsed(&mut self, decision: Decision, tx0: u64) {
        let shard = self.shard.clone();
        let (li, ip, peer) = (self.li, self.ip, self.peer);
        let tx = self.client.bytes_written();
        let Some(x) = self.x.as_mut() else { return };
        let status = x.rec.status;
        let (tls, sni) = self.client.log_facts();
        x.rec = crate::observe::access_log::Record::new(li, ip, peer);
        x.rec.tls = tls;
        x.rec.status = status;
        x.rec.decision = decision;
        x.rec.bytes_in = (x.cend - x.cstart) as u64;
        x.rec.bytes_out = tx - tx0;
        shard.counters.request_done(li, decision, 1);
        if let Some(log) = &shard.access_log {
            let t = crate::observe::access_log::Target {
                sni,
                ..Default::default()
            };
            log.emit(&*shard.rt, &x.rec, &t);
        }
    }
}
