//! Admission of a parsed request, in the specification's order (rate limit, connection limit, WAF), then request_filters and routing.

use zgix_admission::{ConnDecision, RateDecision};
use zgix_parser::{BodyKind, Method, Version};

use super::{Conn, Next};
use crate::filters::Verdict;

impl Conn {
    /// Gives back the token this request took from its client's bucket, if
    /// it took one (a 503 from the connection limit; a 413 once a chunked
    /// body outgrew `max_request_body`, whose size no check could know).
    pub(super) fn refund_token(&mut self) {
        if let Some(p) = self.token.take() {
            self.shard.rt.rate_table.refund(self.id, p);
        }
    }

    /// Admission, then forwarding. The order is the spec's: a malformed head was
    /// refused before this point (no token spent); then rate limit, connection
    /// limit, WAF, and only then routing.
    pub(super) async fn handle_request(&mut self) -> Next {
        let shard = self.shard.clone();
        let rt = &shard.rt;
        let lst = &rt.listeners[self.li];
        let c = &shard.counters;
        let t0 = shard.driver.now();
        self.token = None;

        if let Some(p) = lst.rate_limit {
            match rt
                .rate_table
                .check(self.id, p, zgix_admission::monotonic_ns_at(t0))
            {
                RateDecision::Allowed => self.token = Some(p),
                RateDecision::TableFull => c.rate_limit_full.inc(),
                RateDecision::Limited { retry_after_secs } => {
                    c.rate_limited.inc();
                    self.refuse(429, Some(retry_after_secs)).await;
                    return Next::Close;
                }
            }
        }
        if let Some(max) = lst.conn_limit {
            if !self.conn_checked {
                match rt.conn_table.acquire(self.id, max) {
                    ConnDecision::Admitted(g) => {
                        self.conn_slot = Some(g);
                        self.conn_checked = true;
                    }
                    ConnDecision::TableFull => {
                        c.conn_limit_full.inc();
                        self.conn_checked = true;
                    }
                    ConnDecision::Limited => {
                        c.conn_limited.inc();
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
            if hit {
                c.waf_blocked.inc();
                self.refuse(waf.status, None).await;
                return Next::Close;
            }
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
                    c.response(self.li, status);
                    let x = self.x.as_mut().expect("a request state is held");
                    if self.client.write_all(&x.out).await.is_err() || !keep {
                        return Next::Close;
                    }
                    x.cstart += x.req.head_len;
                    return Next::KeepAlive;
                }
            }
        }

        let next = self.forward(cluster, filtered).await;
        let us = shard.driver.now().saturating_duration_since(t0).as_micros() as u64;
        shard.latency.borrow_mut()[self.li].saturating_record(us.max(1));
        next
    }
}
