//! Forwarding a request: pick an endpoint, take or dial an upstream connection, run the exchange (both directions at once), then keep or drop both connections.

use std::future::Future;
use std::io;
use std::pin::pin;
use std::task::Poll;

use zgix_config::RetryOn;
use zgix_parser::{BodyKind, HeaderKind, RequestHead};

use super::body::{BodyRead, Download, ResponseEnd, Sent, Upload};
use super::{is_timeout, retry, Conn, Exchange, Fail, Next};
use crate::http::respond::status_for;
use crate::http::wire;
use crate::observe::decision::Decision;
use crate::observe::decision::UpstreamError;
use crate::runtime::Runtime;
use crate::upstream::cluster::UpTimeouts;
use crate::upstream::conn::UpConn;
use crate::upstream::health;
use crate::upstream::lb;
use crate::upstream::metrics::RetryReason;

/// The `Upgrade` field value of a request that asks to switch protocols
/// (`Connection: upgrade` and an `Upgrade` field, HTTP/1.1, RFC 9110 §7.8).
fn upgrade_request<'a>(req: &RequestHead, base: &'a [u8]) -> Option<&'a [u8]> {
    if req.version != zgix_parser::Version::Http11 {
        return None;
    }
    let asks = req.headers.iter().any(|h| {
        h.kind == HeaderKind::Connection
            && h.value
                .get(base)
                .split(|&b| b == b',')
                .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"upgrade"))
    });
    if !asks {
        return None;
    }
    req.headers
        .iter()
        .find(|h| h.name.get(base).eq_ignore_ascii_case(b"upgrade"))
        .map(|h| h.value.get(base))
}

/// Appends fields to a head `wire` wrote (it ends with the empty line).
pub(super) fn append_fields(out: &mut Vec<u8>, fields: &[&[u8]]) {
    debug_assert!(out.ends_with(b"\r\n\r\n"));
    out.truncate(out.len() - 2);
    for f in fields {
        out.extend_from_slice(f);
    }
    out.extend_from_slice(b"\r\n");
}

/// An attempt that failed: why, whether its upstream connection came from
/// the pool, and whether any byte of a final answer reached the client
/// (then it cannot be answered 502/504 any more, only closed).
struct Failed {
    fail: Fail,
    reused: bool,
    sent: bool,
}

/// How an attempt is made.
#[derive(Copy, Clone)]
struct How {
    /// The listener's request filters ran (their edits apply).
    filtered: bool,
    /// The request asks to switch protocols.
    upgrade: bool,
    /// The request may be sent again (idempotent, no body, no upgrade).
    retryable: bool,
    /// Dial a new connection, do not take a pooled one.
    fresh: bool,
    /// Statuses held back for a retry (`RetryOn::status_bit`).
    retry_status: u8,
    /// The cluster's connect, header and idle timeouts.
    timeouts: UpTimeouts,
}

/// zgix's answer to a failed exchange: 504 for a timeout, else 502.
fn status_of(kind: UpstreamError) -> u16 {
    match kind {
        UpstreamError::ConnectTimeout
        | UpstreamError::HeaderTimeout
        | UpstreamError::IdleTimeout => 504,
        _ => 502,
    }
}

impl Conn {
    /// Proxies the parsed request to an endpoint of the cluster and streams
    /// the answer back, trying another endpoint when one fails before it
    /// answered (see [`Conn::attempt`]).
    pub(super) async fn forward(
        &mut self,
        x: &mut Exchange,
        cluster_ix: usize,
        filtered: bool,
    ) -> Next {
        let shard = self.shard.clone();
        let rt = &shard.rt;
        let base = x.cl.bytes();
        let upgrade = upgrade_request(&x.req, base).is_some();
        let has_body = !matches!(x.req.body, BodyKind::None | BodyKind::Length(0));
        // RFC 9110 §9.2.2: an idempotent request without a body can be sent
        // again; one whose body started streaming never is.
        let retryable = x.req.method.is_idempotent() && !has_body && !upgrade;
        let head_at = x.cl.mark();
        let cluster = &rt.up.clusters[cluster_ix];
        let budget = &shard.up.budgets[cluster_ix];
        let now = health::now_ms();
        budget.request(now);
        let mut tried = lb::Tried::default();
        let mut attempt = 0u32;
        loop {
            let picked = shard.balancer.pick(
                &rt.up,
                &shard.up,
                cluster_ix,
                self.id,
                &mut tried,
                if attempt == 0 { now } else { health::now_ms() },
            );
            let ep = picked.ep;
            x.rec.upstream = Some(ep);
            // A 502/503/504 in `retry_on` is held back while a retry is open
            // and the budget has room for it.
            let statuses = cluster.retry_on & RetryOn::STATUSES;
            let open = statuses != 0 && retryable && attempt < cluster.retries;
            let room = open && budget.has_room(health::now_ms());
            let retry_status = if room { statuses } else { 0 };
            // A pooled connection that fails before answering was most likely
            // closed by the origin while idle: dial once more, same endpoint,
            // whatever `retries` says, and do not hold it against the endpoint.
            let mut fresh = false;
            let f = loop {
                // The head again (an attempt consumes it).
                x.cl.rewind(head_at);
                let how = How {
                    filtered,
                    upgrade,
                    retryable,
                    fresh,
                    retry_status,
                    timeouts: cluster.timeouts,
                };
                match self.attempt(x, ep, cluster_ix, how).await {
                    Ok(next) => {
                        if open && !room && statuses & RetryOn::status_bit(x.resp.status) != 0 {
                            // Passed on as it was: the budget refused its retry.
                            budget.refused.inc();
                        }
                        return next;
                    }
                    Err(Failed {
                        fail: Fail::UpstreamEarly(kind),
                        reused: true,
                        ..
                    }) if retryable && !fresh => {
                        crate::log_debug!(
                            "upstream",
                            "pooled upstream failed early ({kind:?}), dialing again"
                        );
                        shard.up.retry(RetryReason::Reset);
                        x.rec.retries += 1;
                        fresh = true;
                    }
                    Err(f) => break f,
                }
            };
            let Failed {
                fail: f,
                reused,
                sent,
            } = f;
            let kind = match f {
                Fail::Upstream(k) | Fail::UpstreamEarly(k) => Some(k),
                _ => None,
            };
            let t_ms = health::now_ms();
            if let Some(k) = kind {
                note_failure(&shard, x, ep, cluster_ix, k, reused, t_ms);
            }
            drop(picked);
            let why = (attempt < cluster.retries)
                .then(|| retry::retry_reason(&f, retryable, cluster.retry_on))
                .flatten();
            // Connect retries cost the origins nothing and are not budgeted.
            let again = why.is_some_and(|w| w == RetryReason::Connect || budget.try_retry(t_ms));
            if let Some(k) = kind {
                let then = retry::Then::of(again, sent, status_of(k));
                let a = retry::Attempt {
                    ep,
                    kind: k,
                    status: x.resp.status,
                    client: self.ip,
                    request_id: x.rec.request_id.as_bytes(),
                };
                retry::log_failure(rt, &a, then);
            }
            match why {
                Some(w) if again => shard.up.retry(w),
                _ => return self.failed(x, f, sent).await,
            }
            attempt += 1;
            x.rec.retries += 1;
        }
    }

    /// One try on endpoint `ep`: connect (or reuse), exchange, keep or drop
    /// the connections. `Err` carries the failure and whether the upstream
    /// connection came from the pool.
    async fn attempt(
        &mut self,
        x: &mut Exchange,
        ep: usize,
        cluster_ix: usize,
        how: How,
    ) -> Result<Next, Failed> {
        let shard = self.shard.clone();
        let rt = &shard.rt;
        let How {
            filtered,
            upgrade,
            retryable,
            fresh,
            timeouts,
            ..
        } = how;
        let coalesced = self.write_upstream_head(x, ep, filtered, upgrade);
        let (up, reused) = self
            .acquire_upstream(ep, !retryable, fresh, timeouts.connect)
            .await
            .map_err(|k| Failed {
                fail: Fail::Upstream(k),
                reused: false,
                sent: false,
            })?;
        let (end, body_done, ttfb) = self
            .exchange(x, &up, reused, coalesced, how)
            .await
            .map_err(|(fail, sent)| Failed { fail, reused, sent })?;
        let li = self.li;
        let status = x.resp.status;
        if let Some(us) = ttfb {
            shard.up.endpoints[ep].ttfb(us);
            shard.counters.upstream_time(cluster_ix, us);
            x.rec.upstream_us = Some(us);
        }
        let t = rt.up.upstreams[ep]
            .health
            .report_status(status, health::now_ms());
        note_transition(rt, ep, t);
        x.rec.status = status;
        // A dry-run refusal stays in the log: it was forwarded all the same.
        if !matches!(x.rec.decision, Decision::DryRun(_)) {
            x.rec.decision = Decision::Forwarded;
        }
        if end.tunnel {
            return Ok(self.tunnel(x, up).await);
        }
        shard.counters.response(li, status);
        if end.upstream_reusable && x.resp.keep_alive && body_done {
            shard.return_upstream(ep, up);
        }
        Ok(if end.client_keep && body_done {
            Next::KeepAlive
        } else {
            Next::Close
        })
    }

    /// Writes the request head for endpoint `ep` into `out` (the Host of an
    /// HTTP/1.0 request without one is the endpoint's address), with a whole
    /// small body already read appended. Returns the body bytes appended.
    fn write_upstream_head(
        &mut self,
        x: &mut Exchange,
        ep: usize,
        filtered: bool,
        upgrade: bool,
    ) -> u64 {
        let shard = self.shard.clone();
        let rt = &shard.rt;
        let filters = &rt.listeners[self.li].filters;
        let on_tls = rt.listeners[self.li].tls.is_some();
        // Formatted per request, not kept: an idle connection is smaller so.
        let ip_text = wire::IpText::new(self.ip);
        let base = x.cl.bytes();
        let edits = filtered.then_some((filters, &x.walk));
        let lst = &rt.listeners[self.li];
        let stamp = wire::Stamp {
            via: rt.config.via.name().map(str::as_bytes),
            proto: if on_tls { "https" } else { "http" },
            request_id: (lst.request_id != zgix_config::RequestIdMode::Off)
                .then(|| x.rec.request_id.as_bytes()),
            forwarded: lst.forwarded,
        };
        let endpoint = rt.up.upstreams[ep]
            .addr
            .get()
            .unwrap_or(rt.up.endpoints[ep]);
        wire::write_request_head_via(&mut x.out, base, &x.req, &ip_text, endpoint, edits, &stamp);
        // Expect goes to the origin, which may refuse before the body
        // comes (RFC 9110 §10.1.1); the client gets its 100 or its answer.
        if x.req.expect_continue {
            append_fields(&mut x.out, &[b"Expect: 100-continue\r\n"]);
        }
        if upgrade {
            if let Some(u) = upgrade_request(&x.req, base) {
                append_fields(
                    &mut x.out,
                    &[b"Connection: upgrade\r\nUpgrade: ", u, b"\r\n"],
                );
            }
        }
        let buffered = &x.cl.bytes()[x.req.head_len..];
        if let BodyKind::Length(n) = x.req.body {
            let n = n as usize;
            if n > 0 && n <= buffered.len() && x.out.len() + n <= x.out.capacity() {
                x.out.extend_from_slice(&buffered[..n]);
                return n as u64;
            }
        }
        0
    }

    /// A pooled connection if one is fresh (checked alive when the request could
    /// not be retried), else a new one within the connect timeout.
    async fn acquire_upstream(
        &mut self,
        ep: usize,
        must_be_alive: bool,
        fresh: bool,
        timeout: std::time::Duration,
    ) -> Result<(UpConn, bool), UpstreamError> {
        let shard = &self.shard;
        let now = shard.driver.now();
        while let Some(s) = (!fresh).then(|| shard.pool.take(ep, now)).flatten() {
            if !must_be_alive || !s.is_stale() {
                return Ok((s, true));
            }
        }
        shard.counters.upstream_connects.inc();
        shard.up.endpoints[ep].connects.inc();
        let Some(addr) = shard.rt.up.upstreams[ep].addr.get() else {
            // A name that never resolved.
            return Err(UpstreamError::ConnectOther);
        };
        UpConn::connect(&shard.driver, &shard.rt.up, ep, addr, timeout)
            .await
            .map(|s| (s, false))
    }

    /// Sends the head, then streams the body up while reading the answer
    /// down. Returns how the response ended and whether the request body was
    /// all read (if not, the client connection must close after the answer).
    async fn exchange(
        &mut self,
        x: &mut Exchange,
        up: &UpConn,
        reused: bool,
        coalesced: u64,
        how: How,
    ) -> Result<(ResponseEnd, bool, Option<u64>), (Fail, bool)> {
        let shard = self.shard.clone();
        let How {
            filtered,
            upgrade,
            timeouts,
            ..
        } = how;
        up.set_write_timeout(Some(timeouts.idle));
        let li = self.li;
        let client = &self.client;
        let early = |e: &io::Error| {
            if is_timeout(e) {
                Fail::Upstream(UpstreamError::IdleTimeout)
            } else if reused {
                Fail::UpstreamEarly(UpstreamError::Reset)
            } else {
                Fail::Upstream(UpstreamError::Reset)
            }
        };
        up.write_all(&x.out).await.map_err(|e| (early(&e), false))?;
        let sent_at = shard.driver.now();
        let head_seen = std::cell::Cell::new(None);
        let body = x.req.body;
        let has_body = !matches!(body, BodyKind::None | BodyKind::Length(0))
            && !matches!(body, BodyKind::Length(n) if n == coalesced);
        x.cl.consume(x.req.head_len);
        if !has_body {
            if let BodyKind::Length(n) = body {
                x.cl.consume(n as usize);
            }
        }
        let finished = BodyRead::new(!has_body);
        let sent = Sent::default();
        let upload = Upload {
            client,
            up,
            cl: &mut x.cl,
            chunked: &mut x.req_chunked,
            pieces: &mut x.body_pieces,
            rechunked: &mut x.body_out,
            body,
            done: coalesced,
            shard: &shard,
            finished: &finished,
        };
        let download = Download {
            shard: &shard,
            li,
            client,
            up,
            ubuf: &mut x.ubuf,
            ustart: &mut x.ustart,
            uend: &mut x.uend,
            out: &mut x.out,
            resp: &mut x.resp,
            chunked: &mut x.resp_chunked,
            req: &x.req,
            walk: &x.walk,
            filtered,
            upgrade,
            sent: &sent,
            body_read: &finished,
            via: shard.rt.config.via.name().map(str::as_bytes),
            head_seen: &head_seen,
            rate_fields: &x.rate_fields,
            timeouts,
            retry_status: how.retry_status,
        };
        let mut up_fut = pin!(upload.run());
        let mut down_fut = pin!(download.run());
        let mut up_done: Option<Result<(), Fail>> = (!has_body).then_some(Ok(()));
        let end = std::future::poll_fn(|cx| {
            if up_done.is_none() {
                if let Poll::Ready(r) = up_fut.as_mut().poll(cx) {
                    if let Err(f @ (Fail::ClientGone | Fail::ClientBad(_))) = r {
                        // The client broke its body: nothing more to wait for.
                        return Poll::Ready(Err(f));
                    }
                    // An upstream that stopped reading may still answer.
                    up_done = Some(r);
                }
            }
            down_fut.as_mut().poll(cx)
        })
        .await
        .map_err(|f| (f, sent.get()))?;
        let ttfb = head_seen
            .get()
            .map(|t| t.saturating_duration_since(sent_at).as_micros() as u64);
        Ok((end, matches!(up_done, Some(Ok(()))), ttfb))
    }

    /// Ends a failed exchange: an answer if the client has seen nothing yet, else a close.
    /// `sent`: bytes of a final answer reached the client already.
    pub(super) async fn failed(&mut self, x: &mut Exchange, f: Fail, sent: bool) -> Next {
        let status = match f {
            Fail::UpstreamEarly(kind) | Fail::Upstream(kind) => {
                x.rec.decision = Decision::UpstreamError(kind);
                status_of(kind)
            }
            Fail::ClientGone => {
                // nginx's 499: the client closed before its answer was done.
                if x.rec.status == 0 {
                    x.rec.status = 499;
                }
                return Next::Close;
            }
            Fail::ClientBad(e) => {
                x.rec.decision = Decision::BadRequest(e);
                if e == zgix_parser::ParseError::BodyTooLarge {
                    self.refund_token();
                }
                status_for(e)
            }
        };
        if !sent {
            self.refuse(x, status, None).await;
        }
        Next::Close
    }
}

/// Counts a failed attempt on `ep` (every one, not only the last:
/// docs/operations.md) and reports it to the endpoint's passive health.
fn note_failure(
    shard: &super::shard::Shard,
    x: &Exchange,
    ep: usize,
    cluster_ix: usize,
    k: UpstreamError,
    reused: bool,
    t_ms: u64,
) {
    let rt = &shard.rt;
    shard.up.endpoints[ep].error(k);
    shard.counters.cluster_upstream_error(cluster_ix, k);
    let h = &rt.up.upstreams[ep].health;
    if k == UpstreamError::Status5xx {
        note_transition(rt, ep, h.report_status(x.resp.status, t_ms));
    } else if !reused && health::counts_as_failure(k) {
        note_transition(rt, ep, h.report_failure(t_ms));
    }
}

/// Logs an endpoint's ejection or recovery at info (operator-facing,
/// rate-limited); the failures that led to it are warn lines of their own.
fn note_transition(rt: &Runtime, ep: usize, t: health::Transition) {
    let u = &rt.up.upstreams[ep];
    let cluster = &rt.up.clusters[u.cluster].name;
    match t {
        health::Transition::Ejected(ms) => {
            crate::log_info!(
                "upstream",
                "clusters.{cluster}: {} ejected for {ms} ms",
                u.label
            )
        }
        health::Transition::Recovered => {
            crate::log_info!(
                "upstream",
                "clusters.{cluster}: {} answered its trial; back in",
                u.label
            )
        }
        health::Transition::None => {}
    }
}
