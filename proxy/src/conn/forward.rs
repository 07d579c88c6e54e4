//! Forwarding a request: pick an endpoint, take or dial an upstream connection, run the exchange (both directions at once), then keep or drop both connections.

use std::future::Future;
use std::io;
use std::pin::pin;
use std::task::Poll;

use zgix_parser::{BodyKind, HeaderKind, RequestHead};

use super::body::{Download, ResponseEnd, Upload};
use super::{is_timeout, Conn, Fail, Next};
use crate::io::Sock;
use crate::lb;
use crate::metrics::UpstreamError;
use crate::respond::status_for;
use crate::wire;

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

impl Conn {
    /// Proxies the parsed request to an endpoint and streams the answer back.
    pub(super) async fn forward(&mut self, cluster_ix: usize, filtered: bool) -> Next {
        let shard = self.shard.clone();
        let rt = &shard.rt;
        let filters = &rt.listeners[self.li].filters;
        let ep = lb::pick(&rt.clusters[cluster_ix], &shard.rr[cluster_ix], self.id);
        self.sent = false;
        let ip_text = self.ip_text;
        let x = self.x();
        let base = &x.cbuf[x.cstart..x.cend];
        let upgrade = upgrade_request(&x.req, base).is_some();
        {
            let edits = filtered.then_some((filters, &x.walk));
            let via = rt.config.via.name().map(str::as_bytes);
            wire::write_request_head_via(
                &mut x.out,
                base,
                &x.req,
                &ip_text,
                rt.endpoints[ep],
                edits,
                via,
            );
            // Expect goes to the origin, which may refuse before the body
            // comes (RFC 9110 §10.1.1); the client gets its 100 or its answer.
            if x.req.expect_continue {
                append_fields(&mut x.out, &[b"Expect: 100-continue\r\n"]);
            }
            if let Some(u) = upgrade_request(&x.req, base) {
                append_fields(
                    &mut x.out,
                    &[b"Connection: upgrade\r\nUpgrade: ", u, b"\r\n"],
                );
            }
        }
        let body = x.req.body;
        let body_at = x.cstart + x.req.head_len;
        let buffered = x.cend - body_at;
        // A whole small body already read rides in the head's write.
        let mut coalesced = 0u64;
        if let BodyKind::Length(n) = body {
            let n = n as usize;
            if n > 0 && n <= buffered && x.out.len() + n <= x.out.capacity() {
                x.out.extend_from_slice(&x.cbuf[body_at..body_at + n]);
                coalesced = n as u64;
            }
        }
        let has_body = !matches!(body, BodyKind::None | BodyKind::Length(0));
        let retryable = x.req.method.is_idempotent() && !has_body && !upgrade;

        let mut retried = false;
        let head_at = x.cstart;
        let (up, end, body_done) = loop {
            // An attempt consumes the head from `cbuf`; a retry starts from it again.
            self.x().cstart = head_at;
            // The retry always dials a fresh connection.
            let (up, reused) = match self.acquire_upstream(ep, !retryable, retried).await {
                Ok(x) => x,
                Err(kind) => return self.failed(Fail::Upstream(kind)).await,
            };
            match self
                .exchange(&up, reused, coalesced, filtered, upgrade)
                .await
            {
                Ok((end, body_done)) => break (up, end, body_done),
                Err(Fail::UpstreamEarly(kind)) if reused && retryable && !retried => {
                    crate::log_debug!(
                        "upstream",
                        "pooled upstream failed early ({kind:?}), retrying"
                    );
                    shard.counters.upstream_retries.inc();
                    retried = true;
                }
                Err(f) => return self.failed(f).await,
            }
        };
        if end.tunnel {
            return self.tunnel(up).await;
        }
        let li = self.li;
        let x = self.x();
        let status = x.resp.status;
        shard.counters.response(li, status);
        if end.upstream_reusable && x.resp.keep_alive && body_done {
            shard.pool.put(ep, up, shard.driver.now());
        }
        if end.client_keep && body_done {
            Next::KeepAlive
        } else {
            Next::Close
        }
    }

    /// A pooled connection if one is fresh (checked alive when the request could
    /// not be retried), else a new one within the connect timeout.
    async fn acquire_upstream(
        &mut self,
        ep: usize,
        must_be_alive: bool,
        fresh: bool,
    ) -> Result<(Sock, bool), UpstreamError> {
        let shard = &self.shard;
        let now = shard.driver.now();
        while let Some(s) = (!fresh).then(|| shard.pool.take(ep, now)).flatten() {
            if !must_be_alive || !s.is_stale() {
                return Ok((s, true));
            }
        }
        shard.counters.upstream_connects.inc();
        let addr = shard.rt.endpoints[ep];
        match Sock::connect(&shard.driver, addr, shard.rt.timeouts.upstream_connect).await {
            Ok(s) => Ok((s, false)),
            Err(e) => Err(match e.kind() {
                io::ErrorKind::ConnectionRefused => UpstreamError::ConnectRefused,
                _ if is_timeout(&e) => UpstreamError::ConnectTimeout,
                _ => UpstreamError::ConnectOther,
            }),
        }
    }

    /// Sends the head, then streams the body up while reading the answer
    /// down. Returns how the response ended and whether the request body was
    /// all read (if not, the client connection must close after the answer).
    async fn exchange(
        &mut self,
        up: &Sock,
        reused: bool,
        coalesced: u64,
        filtered: bool,
        upgrade: bool,
    ) -> Result<(ResponseEnd, bool), Fail> {
        let shard = self.shard.clone();
        let t = &shard.rt.timeouts;
        up.set_write_timeout(Some(t.upstream_idle));
        let li = self.li;
        let client = &self.client;
        let sent = &mut self.sent;
        let x = self.x.as_mut().expect("a request state is held");
        let early = |e: &io::Error| {
            if is_timeout(e) {
                Fail::Upstream(UpstreamError::IdleTimeout)
            } else if reused {
                Fail::UpstreamEarly(UpstreamError::Reset)
            } else {
                Fail::Upstream(UpstreamError::Reset)
            }
        };
        up.write_all(&x.out).await.map_err(|e| early(&e))?;
        let body = x.req.body;
        let has_body = !matches!(body, BodyKind::None | BodyKind::Length(0))
            && !matches!(body, BodyKind::Length(n) if n == coalesced);
        let x = &mut **x;
        x.cstart += x.req.head_len;
        if !has_body {
            if let BodyKind::Length(n) = body {
                x.cstart += n as usize;
            }
        }
        let finished = std::cell::Cell::new(!has_body);
        let upload = Upload {
            client,
            up,
            cbuf: &mut x.cbuf,
            cstart: &mut x.cstart,
            cend: &mut x.cend,
            chunked: &mut x.req_chunked,
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
            reused,
            sent,
            body_read: &finished,
            via: shard.rt.config.via.name().map(str::as_bytes),
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
        .await?;
        Ok((end, matches!(up_done, Some(Ok(())))))
    }

    /// Ends a failed exchange: an answer if the client has seen nothing yet, else a close.
    pub(super) async fn failed(&mut self, f: Fail) -> Next {
        let shard = self.shard.clone();
        let status = match f {
            Fail::UpstreamEarly(kind) | Fail::Upstream(kind) => {
                shard.counters.upstream_error(kind);
                crate::log_debug!("upstream", "upstream error: {}", kind.label());
                match kind {
                    UpstreamError::ConnectTimeout
                    | UpstreamError::HeaderTimeout
                    | UpstreamError::IdleTimeout => 504,
                    _ => 502,
                }
            }
            Fail::ClientGone => return Next::Close,
            Fail::ClientBad(e) => {
                if e == zgix_parser::ParseError::BodyTooLarge {
                    self.refund_token();
                }
                status_for(e)
            }
        };
        if !self.sent {
            self.refuse(status, None).await;
        }
        Next::Close
    }
}
