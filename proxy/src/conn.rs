//! One client connection: PROXY header, client filter, then the request loop (parse, admit, forward, stream back).
//!
//! Every buffer a connection uses is allocated once when it is accepted and
//! reused for every request on it: the client read buffer (a whole request head
//! must fit), the upstream read buffer (a whole response head must fit) and the
//! buffer heads are rewritten into. Bodies stream through those buffers, so
//! memory per connection is flat whatever the body size, and the kernel socket
//! buffers provide the backpressure: zgix reads from one side only after the
//! previous chunk was written to the other.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures_lite::future::or;
use glommio::net::TcpStream;

use crate::io::Sock;
use zgix_admission::{ClientId, ConnDecision, ConnGuard, RateDecision};
use zgix_parser::proxy_protocol::{parse_proxy_header, ProxyStatus};
use zgix_parser::{
    BodyKind, ChunkedDecoder, Method, ParseError, RequestHead, ResponseBody, ResponseHead, Status,
    Version,
};

use crate::filters::{Verdict, Walk};
use crate::lb;
use crate::metrics::{ConnRefusal, UpstreamError};
use crate::respond::{status_for, write_refusal};
use crate::shard::Shard;
use crate::wire;

/// What happens to the client connection after a request.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Next {
    KeepAlive,
    Close,
}

/// Why an exchange failed, and so what the client is told.
#[derive(Copy, Clone, Debug)]
enum Fail {
    /// The upstream failed before sending a byte of response on a pooled
    /// connection: the request may be retried once if it is idempotent.
    UpstreamEarly(UpstreamError),
    /// The upstream failed: 502, or 504 for timeouts, if nothing was sent yet.
    Upstream(UpstreamError),
    /// The client went away or stalled mid-body: close without an answer.
    ClientGone,
    /// The client's body broke framing or a limit: 400/413 if nothing was sent yet.
    ClientBad(ParseError),
}

/// How a head read ended.
enum HeadRead {
    Ready,
    /// Clean end: EOF or drain between requests, or idle timeout.
    Closed,
    TimedOut,
    Bad(ParseError),
}

/// What a completed response leaves behind.
struct ResponseEnd {
    upstream_reusable: bool,
    client_keep: bool,
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
    )
}

/// Normalises a peer address: IPv4-mapped IPv6 is taken as IPv4.
fn client_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

/// A client connection and everything it owns.
pub struct Conn {
    shard: Rc<Shard>,
    li: usize,
    client: Sock,
    /// The client's address: the PROXY header's source, else the peer.
    ip: IpAddr,
    /// `ip` as text, for X-Forwarded-For.
    ip_text: wire::IpText,
    id: ClientId,
    cbuf: Box<[u8]>,
    cstart: usize,
    cend: usize,
    ubuf: Box<[u8]>,
    ustart: usize,
    uend: usize,
    out: Vec<u8>,
    req: RequestHead,
    resp: ResponseHead,
    chunked: ChunkedDecoder,
    walk: Walk,
    /// The connection-limit slot, held from the first admitted request until
    /// the connection ends (dropping the `Conn` releases it).
    conn_slot: Option<ConnGuard>,
    conn_checked: bool,
    /// Whether any byte of the current response reached the client.
    sent: bool,
}

/// Serves one accepted connection to its end.
pub async fn serve(shard: Rc<Shard>, li: usize, client: TcpStream, peer: SocketAddr) {
    let counters = shard.counters.clone();
    counters.active_connections.fetch_add(1, Ordering::Relaxed);
    counters.listeners[li].connections.inc();
    let client = match Sock::new(client, &shard.poller) {
        Ok(c) => c,
        Err(e) => {
            log_debug(format_args!("cannot register connection: {e}"));
            counters.active_connections.fetch_sub(1, Ordering::Relaxed);
            return;
        }
    };
    let mut conn = Conn::new(shard, li, client, peer);
    conn.run().await;
    drop(conn);
    counters.active_connections.fetch_sub(1, Ordering::Relaxed);
}

impl Conn {
    fn new(shard: Rc<Shard>, li: usize, client: Sock, peer: SocketAddr) -> Conn {
        let rt = &shard.rt;
        let ip = client_ip(peer.ip());
        let _ = client.set_nodelay(true);
        let _ = client.set_write_timeout(Some(rt.timeouts.client_idle));
        Conn {
            li,
            client,
            ip,
            ip_text: wire::IpText::new(ip),
            id: ClientId::from_ip(ip),
            cbuf: vec![0u8; rt.client_buffer_bytes()].into_boxed_slice(),
            cstart: 0,
            cend: 0,
            ubuf: vec![0u8; rt.upstream_buffer_bytes()].into_boxed_slice(),
            ustart: 0,
            uend: 0,
            out: Vec::with_capacity(rt.out_buffer_bytes()),
            req: RequestHead::new(&rt.request_limits),
            resp: ResponseHead::new(rt.response_max_headers()),
            chunked: ChunkedDecoder::new(u64::MAX),
            walk: rt.listeners[li]
                .filters
                .new_walk(rt.config.limits.max_request_line),
            conn_slot: None,
            conn_checked: false,
            sent: false,
            shard,
        }
    }

    async fn run(&mut self) {
        let shard = self.shard.clone();
        let lst = &shard.rt.listeners[self.li];
        if lst.proxy_protocol {
            match self.read_proxy_header().await {
                Ok(()) => {}
                Err(why) => {
                    shard.counters.refused(why);
                    return;
                }
            }
        }
        if let Some(filter) = &lst.clients {
            if !filter.admits(self.ip) {
                shard.counters.refused(ConnRefusal::ClientDenied);
                return;
            }
        }
        let mut first = true;
        loop {
            match self.read_head(first).await {
                HeadRead::Ready => {}
                HeadRead::Closed => return,
                HeadRead::TimedOut => {
                    // A head that started but did not finish in time: RFC 9110 §15.5.9.
                    if self.cend > self.cstart {
                        self.refuse(408, None).await;
                        self.close_gracefully().await;
                    }
                    return;
                }
                HeadRead::Bad(e) => {
                    self.refuse(status_for(e), None).await;
                    self.close_gracefully().await;
                    return;
                }
            }
            first = false;
            if self.handle_request().await == Next::Close {
                self.close_gracefully().await;
                return;
            }
        }
    }

    /// Reads the PROXY protocol header (v1 or v2) within its deadline and makes
    /// its source the client identity. LOCAL/UNKNOWN keep the peer address.
    async fn read_proxy_header(&mut self) -> Result<(), ConnRefusal> {
        let deadline = Instant::now() + self.shard.rt.timeouts.proxy_protocol;
        loop {
            if self.cend > 0 {
                match parse_proxy_header(&self.cbuf[..self.cend]) {
                    Ok(ProxyStatus::Complete(h)) => {
                        self.cstart = h.consumed;
                        if let Some(src) = h.source {
                            self.ip = client_ip(src.ip());
                            self.ip_text = wire::IpText::new(self.ip);
                            self.id = ClientId::from_ip(self.ip);
                        }
                        return Ok(());
                    }
                    Ok(ProxyStatus::Partial) => {}
                    Err(e) => {
                        log_debug(format_args!("PROXY header refused: {}", e.as_str()));
                        return Err(ConnRefusal::ProxyHeaderInvalid);
                    }
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ConnRefusal::ProxyHeaderTimeout);
            }
            let _ = self.client.set_read_timeout(Some(left));
            match self.client.read(&mut self.cbuf[self.cend..]).await {
                Ok(0) => return Err(ConnRefusal::ProxyHeaderInvalid),
                Ok(n) => self.cend += n,
                Err(e) if is_timeout(&e) => return Err(ConnRefusal::ProxyHeaderTimeout),
                Err(_) => return Err(ConnRefusal::ProxyHeaderInvalid),
            }
        }
    }

    /// Reads until a whole request head is in `cbuf[cstart..]`.
    ///
    /// Between requests the wait is the keep-alive idle timeout and a drain ends
    /// it; once the first byte of a head (or the connection, for the first
    /// request) has arrived, the whole head must come within the header timeout.
    async fn read_head(&mut self, first: bool) -> HeadRead {
        let shard = self.shard.clone();
        let t = &shard.rt.timeouts;
        let mut deadline = first.then(|| Instant::now() + t.client_header);
        loop {
            if self.cend > self.cstart {
                match shard
                    .req_parser
                    .parse(&self.cbuf[self.cstart..self.cend], &mut self.req)
                {
                    Ok(Status::Complete(())) => return HeadRead::Ready,
                    Ok(Status::Partial) => {}
                    Err(e) => return HeadRead::Bad(e),
                }
                if deadline.is_none() {
                    deadline = Some(Instant::now() + t.client_header);
                }
            } else if self.cstart == self.cend {
                self.cstart = 0;
                self.cend = 0;
            }
            if self.cstart > 0 {
                self.cbuf.copy_within(self.cstart..self.cend, 0);
                self.cend -= self.cstart;
                self.cstart = 0;
            }
            if self.cend == self.cbuf.len() {
                return HeadRead::Bad(ParseError::HeadersTooLarge);
            }
            let r = match deadline {
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return HeadRead::TimedOut;
                    }
                    let _ = self.client.set_read_timeout(Some(left));
                    self.client.read(&mut self.cbuf[self.cend..]).await
                }
                None => {
                    if shard.draining.get() {
                        return HeadRead::Closed;
                    }
                    let _ = self.client.set_read_timeout(Some(t.client_idle));
                    let read = self.client.read(&mut self.cbuf[self.cend..]);
                    let drained = async {
                        let _ = shard.shutdown.acquire(1).await;
                        Err(io::Error::new(io::ErrorKind::Interrupted, "draining"))
                    };
                    match or(read, drained).await {
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {
                            return HeadRead::Closed
                        }
                        Err(e) if is_timeout(&e) => return HeadRead::Closed,
                        r => r,
                    }
                }
            };
            match r {
                // EOF between requests is a clean close; inside a head there is
                // nobody left to answer.
                Ok(0) => return HeadRead::Closed,
                Ok(n) => self.cend += n,
                Err(e) if is_timeout(&e) && self.cend > self.cstart => return HeadRead::TimedOut,
                Err(_) => return HeadRead::Closed,
            }
        }
    }

    /// Admission, then forwarding. The order is the spec's: a malformed head was
    /// refused before this point (no token spent); then rate limit, connection
    /// limit, WAF, and only then routing.
    async fn handle_request(&mut self) -> Next {
        let shard = self.shard.clone();
        let rt = &shard.rt;
        let lst = &rt.listeners[self.li];
        let c = &shard.counters;
        let t0 = Instant::now();

        if let Some(p) = lst.rate_limit {
            match rt
                .rate_table
                .check(self.id, p, zgix_admission::monotonic_ns_at(t0))
            {
                RateDecision::Allowed => {}
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
                        self.refuse(503, None).await;
                        return Next::Close;
                    }
                }
            }
        }
        if let Some(waf) = &lst.waf {
            let base = &self.cbuf[self.cstart..self.cend];
            let m = &waf.matcher;
            // The authority of an absolute-form target becomes the Host the
            // origin sees, so it is scanned like the Host field would be.
            let hit = m.is_match(&self.req.canonical_path)
                || self.req.query.is_some_and(|q| m.is_match(q.get(base)))
                || self.req.authority.is_some_and(|a| m.is_match(a.get(base)))
                || self
                    .req
                    .headers
                    .iter()
                    .any(|h| m.is_match(h.value.get(base)));
            if hit {
                c.waf_blocked.inc();
                self.refuse(waf.status, None).await;
                return Next::Close;
            }
        }

        let mut cluster = lst.cluster;
        let filtered = !lst.filters.is_empty();
        if filtered {
            let base = &self.cbuf[self.cstart..self.cend];
            match lst.filters.walk(&self.req, base, self.ip, &mut self.walk) {
                Verdict::Route => {
                    if let Some(cl) = self.walk.cluster {
                        cluster = cl;
                    }
                }
                Verdict::Answer(rule) => {
                    // Keep the connection only when no body is left unread.
                    let keep = self.req.keep_alive
                        && matches!(self.req.body, BodyKind::None | BodyKind::Length(0))
                        && !shard.draining.get();
                    let status = lst.filters.write_terminal(
                        rule,
                        keep,
                        self.req.version == Version::Http10,
                        self.req.method == Method::Head,
                        &mut self.out,
                    );
                    c.response(self.li, status);
                    if self.client.write_all(&self.out).await.is_err() || !keep {
                        return Next::Close;
                    }
                    self.cstart += self.req.head_len;
                    return Next::KeepAlive;
                }
            }
        }

        let next = self.forward(cluster, filtered).await;
        let us = t0.elapsed().as_micros() as u64;
        shard.latency.borrow_mut()[self.li].saturating_record(us.max(1));
        next
    }

    /// Proxies the parsed request to an endpoint and streams the answer back.
    async fn forward(&mut self, cluster_ix: usize, filtered: bool) -> Next {
        let shard = self.shard.clone();
        let rt = &shard.rt;
        let filters = &rt.listeners[self.li].filters;
        let ep = lb::pick(&rt.clusters[cluster_ix], &shard.rr[cluster_ix], self.id);
        self.sent = false;

        {
            let base = &self.cbuf[self.cstart..self.cend];
            let edits = filtered.then_some((filters, &self.walk));
            wire::write_request_head(
                &mut self.out,
                base,
                &self.req,
                &self.ip_text,
                rt.endpoints[ep],
                edits,
            );
        }
        let body = self.req.body;
        let body_at = self.cstart + self.req.head_len;
        let buffered = self.cend - body_at;
        // A whole small body already read rides in the head's write.
        let mut coalesced = 0u64;
        if let BodyKind::Length(n) = body {
            let n = n as usize;
            if n > 0 && n <= buffered && self.out.len() + n <= self.out.capacity() {
                self.out.extend_from_slice(&self.cbuf[body_at..body_at + n]);
                coalesced = n as u64;
            }
        }
        let has_body = !matches!(body, BodyKind::None | BodyKind::Length(0));
        let retryable = self.req.method.is_idempotent() && !has_body;
        let expect_continue = self.req.expect_continue && has_body && buffered == 0;

        let mut retried = false;
        let head_at = self.cstart;
        let mut up = loop {
            // An attempt consumes the head from `cbuf`; a retry starts from it again.
            self.cstart = head_at;
            // The retry always dials a fresh connection.
            let (mut up, reused) = match self.acquire_upstream(ep, !retryable, retried).await {
                Ok(x) => x,
                Err(kind) => return self.failed(Fail::Upstream(kind)).await,
            };
            match self
                .exchange(&mut up, reused, body, coalesced, expect_continue)
                .await
            {
                Ok(()) => break up,
                Err(Fail::UpstreamEarly(kind)) if reused && retryable && !retried => {
                    log_debug(format_args!(
                        "pooled upstream failed early ({kind:?}), retrying"
                    ));
                    shard.counters.upstream_retries.inc();
                    retried = true;
                }
                Err(f) => return self.failed(f).await,
            }
        };
        match self.send_response(&mut up, filtered).await {
            Ok(end) => {
                let status = self.resp.status;
                shard.counters.response(self.li, status);
                if end.upstream_reusable && self.resp.keep_alive {
                    shard.pool.put(ep, up, shard.poller.now());
                }
                if end.client_keep {
                    Next::KeepAlive
                } else {
                    Next::Close
                }
            }
            Err(f) => self.failed(f).await,
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
        let now = shard.poller.now();
        while let Some(s) = (!fresh).then(|| shard.pool.take(ep, now)).flatten() {
            if !must_be_alive || crate::pool::looks_alive(&s) {
                return Ok((s, true));
            }
        }
        shard.counters.upstream_connects.inc();
        let addr = shard.rt.endpoints[ep];
        shard.poller.ring_op();
        match TcpStream::connect_timeout(addr, shard.rt.timeouts.upstream_connect).await {
            Ok(s) => {
                let _ = s.set_nodelay(true);
                Sock::new(s, &shard.poller)
                    .map(|s| (s, false))
                    .map_err(|_| UpstreamError::ConnectOther)
            }
            Err(e) => {
                let e = io::Error::from(e);
                Err(match e.kind() {
                    io::ErrorKind::ConnectionRefused => UpstreamError::ConnectRefused,
                    io::ErrorKind::TimedOut => UpstreamError::ConnectTimeout,
                    _ if e.raw_os_error() == Some(libc::ECANCELED)
                        || e.raw_os_error() == Some(libc::ETIME) =>
                    {
                        UpstreamError::ConnectTimeout
                    }
                    _ => UpstreamError::ConnectOther,
                })
            }
        }
    }

    /// Sends the head and body upstream and reads the response head.
    async fn exchange(
        &mut self,
        up: &mut Sock,
        reused: bool,
        body: BodyKind,
        coalesced: u64,
        expect_continue: bool,
    ) -> Result<(), Fail> {
        let t = &self.shard.rt.timeouts;
        let _ = up.set_write_timeout(Some(t.upstream_idle));
        let early = |e: &io::Error| {
            if is_timeout(e) {
                Fail::Upstream(UpstreamError::IdleTimeout)
            } else if reused {
                Fail::UpstreamEarly(UpstreamError::Reset)
            } else {
                Fail::Upstream(UpstreamError::Reset)
            }
        };
        up.write_all(&self.out).await.map_err(|e| early(&e))?;
        if expect_continue {
            // RFC 9110 §10.1.1: zgix answers the expectation itself and reads the
            // body; the upstream never sees Expect.
            self.client
                .write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
                .await
                .map_err(|_| Fail::ClientGone)?;
        }
        self.send_body(up, body, coalesced).await?;
        self.read_response_head(up, reused).await
    }

    /// Streams the request body from the client to the upstream, leaving
    /// `cstart` at the first byte after it (a pipelined request may follow).
    async fn send_body(&mut self, up: &mut Sock, body: BodyKind, done: u64) -> Result<(), Fail> {
        let body_timeout = self.shard.rt.timeouts.client_body;
        let mut pos = self.cstart + self.req.head_len;
        match body {
            BodyKind::None => {}
            BodyKind::Length(n) => {
                let mut remaining = n - done;
                pos += done as usize;
                loop {
                    let take = ((self.cend - pos) as u64).min(remaining) as usize;
                    if take > 0 {
                        up.write_all(&self.cbuf[pos..pos + take])
                            .await
                            .map_err(|e| upstream_io(&e))?;
                        pos += take;
                        remaining -= take as u64;
                    }
                    if remaining == 0 {
                        break;
                    }
                    pos = 0;
                    self.cend = 0;
                    self.cend = self.read_client(0, body_timeout).await?;
                }
            }
            BodyKind::Chunked => {
                self.chunked = ChunkedDecoder::new(self.shard.rt.request_limits.max_body);
                loop {
                    let from = pos;
                    let mut done = false;
                    while pos < self.cend {
                        let p = self
                            .chunked
                            .feed(&self.cbuf[pos..self.cend])
                            .map_err(Fail::ClientBad)?;
                        pos += p.consumed;
                        if p.done {
                            done = true;
                            break;
                        }
                        if p.consumed == 0 {
                            break;
                        }
                    }
                    if pos > from {
                        up.write_all(&self.cbuf[from..pos])
                            .await
                            .map_err(|e| upstream_io(&e))?;
                    }
                    if done {
                        break;
                    }
                    let rest = self.cend - pos;
                    self.cbuf.copy_within(pos..self.cend, 0);
                    pos = 0;
                    self.cend = rest;
                    if self.cend == self.cbuf.len() {
                        return Err(Fail::ClientBad(ParseError::BadChunk));
                    }
                    let n = self.read_client(self.cend, body_timeout).await?;
                    self.cend += n;
                }
            }
        }
        self.cstart = pos;
        Ok(())
    }

    /// One read from the client into `cbuf[at..]`; EOF and stalls end the exchange.
    async fn read_client(&mut self, at: usize, timeout: Duration) -> Result<usize, Fail> {
        let _ = self.client.set_read_timeout(Some(timeout));
        match self.client.read(&mut self.cbuf[at..]).await {
            Ok(0) | Err(_) => Err(Fail::ClientGone),
            Ok(n) => Ok(n),
        }
    }

    /// Reads the response head into `ubuf`, passing interim (1xx) responses to
    /// HTTP/1.1 clients on the way (RFC 9110 §15.2). 100 Continue is dropped: zgix
    /// answered the expectation itself. 101 is refused: zgix removes Upgrade.
    async fn read_response_head(&mut self, up: &mut Sock, reused: bool) -> Result<(), Fail> {
        let shard = self.shard.clone();
        let _ = up.set_read_timeout(Some(shard.rt.timeouts.upstream_header));
        self.ustart = 0;
        self.uend = 0;
        let mut got_any = false;
        loop {
            if self.uend > self.ustart {
                match shard.resp_parser.parse(
                    &self.ubuf[self.ustart..self.uend],
                    self.req.method,
                    &mut self.resp,
                ) {
                    Ok(Status::Complete(())) => {
                        let s = self.resp.status;
                        if !(100..200).contains(&s) {
                            return Ok(());
                        }
                        if s == 101 {
                            return Err(Fail::Upstream(UpstreamError::BadResponse));
                        }
                        let hl = self.resp.head_len;
                        if s != 100 && self.req.version == Version::Http11 {
                            self.sent = true;
                            self.client
                                .write_all(&self.ubuf[self.ustart..self.ustart + hl])
                                .await
                                .map_err(|_| Fail::ClientGone)?;
                        }
                        self.ustart += hl;
                        continue;
                    }
                    Ok(Status::Partial) => {}
                    Err(_) => return Err(Fail::Upstream(UpstreamError::BadResponse)),
                }
            }
            if self.ustart > 0 {
                self.ubuf.copy_within(self.ustart..self.uend, 0);
                self.uend -= self.ustart;
                self.ustart = 0;
            }
            if self.uend == self.ubuf.len() {
                return Err(Fail::Upstream(UpstreamError::BadResponse));
            }
            match up.read(&mut self.ubuf[self.uend..]).await {
                Ok(0) => {
                    return Err(if !got_any && reused {
                        Fail::UpstreamEarly(UpstreamError::Reset)
                    } else if !got_any {
                        Fail::Upstream(UpstreamError::Reset)
                    } else {
                        Fail::Upstream(UpstreamError::BadResponse)
                    })
                }
                Ok(n) => {
                    self.uend += n;
                    got_any = true;
                }
                Err(e) if is_timeout(&e) => {
                    return Err(Fail::Upstream(UpstreamError::HeaderTimeout))
                }
                Err(_) => {
                    return Err(if !got_any && reused {
                        Fail::UpstreamEarly(UpstreamError::Reset)
                    } else {
                        Fail::Upstream(UpstreamError::Reset)
                    })
                }
            }
        }
    }

    /// Writes the response head and streams the body to the client.
    async fn send_response(&mut self, up: &mut Sock, filtered: bool) -> Result<ResponseEnd, Fail> {
        let shard = self.shard.clone();
        let filters = &shard.rt.listeners[self.li].filters;
        let _ = up.set_read_timeout(Some(shard.rt.timeouts.upstream_idle));
        let http10 = self.req.version == Version::Http10;
        // An HTTP/1.0 client cannot read chunked framing: de-chunk and delimit by close.
        let dechunk = http10 && self.resp.body == ResponseBody::Chunked;
        let client_keep = self.req.keep_alive
            && !shard.draining.get()
            && self.resp.body != ResponseBody::CloseDelimited
            && !dechunk;
        {
            let base = &self.ubuf[self.ustart..self.uend];
            wire::write_response_head(
                &mut self.out,
                base,
                &self.resp,
                client_keep,
                http10,
                dechunk,
                (filtered && self.walk.edits_response).then_some((filters, &self.walk)),
            );
        }
        let mut pos = self.ustart + self.resp.head_len;
        let reusable;
        match self.resp.body {
            ResponseBody::None => {
                reusable = pos == self.uend;
                self.write_out().await?;
            }
            ResponseBody::Length(n) => {
                let avail = (self.uend - pos) as u64;
                let first = avail.min(n) as usize;
                if self.out.len() + first <= self.out.capacity() {
                    self.out.extend_from_slice(&self.ubuf[pos..pos + first]);
                    self.write_out().await?;
                } else {
                    self.write_out().await?;
                    self.write_client_u(pos, pos + first).await?;
                }
                pos += first;
                let mut remaining = n - first as u64;
                while remaining > 0 {
                    let got = self.read_upstream(up).await?;
                    let take = (got as u64).min(remaining) as usize;
                    self.write_client_u(0, take).await?;
                    remaining -= take as u64;
                    pos = take;
                    self.uend = got;
                }
                reusable = pos == self.uend;
            }
            ResponseBody::Chunked => {
                self.chunked = ChunkedDecoder::new(u64::MAX);
                let mut head_pending = true;
                loop {
                    let done = self
                        .relay_chunks(&mut pos, dechunk, &mut head_pending)
                        .await?;
                    if done {
                        break;
                    }
                    let rest = self.uend - pos;
                    self.ubuf.copy_within(pos..self.uend, 0);
                    self.uend = rest;
                    pos = 0;
                    if self.uend == self.ubuf.len() {
                        return Err(Fail::Upstream(UpstreamError::BadResponse));
                    }
                    let at = self.uend;
                    let _ = up.set_read_timeout(Some(shard.rt.timeouts.upstream_idle));
                    match up.read(&mut self.ubuf[at..]).await {
                        Ok(0) => return Err(Fail::Upstream(UpstreamError::Reset)),
                        Ok(n) => self.uend += n,
                        Err(e) => return Err(upstream_io(&e)),
                    }
                }
                reusable = pos == self.uend;
            }
            ResponseBody::CloseDelimited => {
                self.out.extend_from_slice(&self.ubuf[pos..self.uend]);
                self.write_out().await?;
                loop {
                    let _ = up.set_read_timeout(Some(shard.rt.timeouts.upstream_idle));
                    match up.read(&mut self.ubuf[..]).await {
                        Ok(0) => break,
                        Ok(n) => self.write_client_u(0, n).await?,
                        Err(e) => return Err(upstream_io(&e)),
                    }
                }
                reusable = false;
            }
        }
        Ok(ResponseEnd {
            upstream_reusable: reusable,
            client_keep,
        })
    }

    /// Feeds `ubuf[pos..uend]` through the chunked scanner and writes it on:
    /// raw to HTTP/1.1 clients, data only when de-chunking. The response head
    /// still in `out` goes out with the first bytes in one write.
    async fn relay_chunks(
        &mut self,
        pos: &mut usize,
        dechunk: bool,
        head_pending: &mut bool,
    ) -> Result<bool, Fail> {
        let from = *pos;
        let mut done = false;
        while *pos < self.uend {
            let p = self
                .chunked
                .feed(&self.ubuf[*pos..self.uend])
                .map_err(|_| Fail::Upstream(UpstreamError::BadResponse))?;
            if dechunk && !p.data.is_empty() {
                let (a, b) = (*pos + p.data.start, *pos + p.data.end);
                self.stage(a, b, head_pending).await?;
            }
            *pos += p.consumed;
            if p.done {
                done = true;
                break;
            }
            if p.consumed == 0 {
                break;
            }
        }
        if !dechunk && *pos > from {
            self.stage(from, *pos, head_pending).await?;
        }
        if *head_pending {
            self.write_out().await?;
            *head_pending = false;
        }
        Ok(done)
    }

    /// Writes `ubuf[a..b]` to the client, joined to the pending head when it fits.
    async fn stage(&mut self, a: usize, b: usize, head_pending: &mut bool) -> Result<(), Fail> {
        if *head_pending {
            if self.out.len() + (b - a) <= self.out.capacity() {
                self.out.extend_from_slice(&self.ubuf[a..b]);
                return Ok(());
            }
            self.write_out().await?;
            *head_pending = false;
        }
        self.write_client_u(a, b).await
    }

    async fn read_upstream(&mut self, up: &mut Sock) -> Result<usize, Fail> {
        match up.read(&mut self.ubuf[..]).await {
            Ok(0) => Err(Fail::Upstream(UpstreamError::Reset)),
            Ok(n) => Ok(n),
            Err(e) => Err(upstream_io(&e)),
        }
    }

    async fn write_out(&mut self) -> Result<(), Fail> {
        self.sent = true;
        self.client
            .write_all(&self.out)
            .await
            .map_err(|_| Fail::ClientGone)
    }

    async fn write_client_u(&mut self, a: usize, b: usize) -> Result<(), Fail> {
        if a == b {
            return Ok(());
        }
        self.sent = true;
        self.client
            .write_all(&self.ubuf[a..b])
            .await
            .map_err(|_| Fail::ClientGone)
    }

    /// Ends a failed exchange: an answer if the client has seen nothing yet, else a close.
    async fn failed(&mut self, f: Fail) -> Next {
        let shard = self.shard.clone();
        let status = match f {
            Fail::UpstreamEarly(kind) | Fail::Upstream(kind) => {
                shard.counters.upstream_error(kind);
                log_debug(format_args!("upstream error: {}", kind.label()));
                match kind {
                    UpstreamError::ConnectTimeout
                    | UpstreamError::HeaderTimeout
                    | UpstreamError::IdleTimeout => 504,
                    _ => 502,
                }
            }
            Fail::ClientGone => return Next::Close,
            Fail::ClientBad(e) => status_for(e),
        };
        if !self.sent {
            self.refuse(status, None).await;
        }
        Next::Close
    }

    /// Answers with a generated `connection: close` refusal; the caller then
    /// closes the connection (`close_gracefully`).
    async fn refuse(&mut self, status: u16, retry_after: Option<u64>) {
        write_refusal(&mut self.out, status, retry_after);
        self.shard.counters.response(self.li, status);
        self.sent = true;
        let _ = self.client.write_all(&self.out).await;
    }

    /// Half-closes and drains what the client still sends for a short, bounded
    /// while, so unread request bytes do not turn the close into a reset that
    /// could destroy the response in flight (the "lingering close" of nginx).
    async fn close_gracefully(&mut self) {
        let _ = self.client.shutdown(std::net::Shutdown::Write).await;
        let _ = self.client.set_read_timeout(Some(LINGER));
        let mut drained = 0usize;
        while drained < LINGER_BYTES {
            match self.client.read(&mut self.cbuf[..]).await {
                Ok(0) | Err(_) => break,
                Ok(n) => drained += n,
            }
        }
    }
}

/// How long and how much a closing connection is drained (see `close_gracefully`).
const LINGER: Duration = Duration::from_millis(500);
const LINGER_BYTES: usize = 1 << 20;

fn upstream_io(e: &io::Error) -> Fail {
    if is_timeout(e) {
        Fail::Upstream(UpstreamError::IdleTimeout)
    } else {
        Fail::Upstream(UpstreamError::Reset)
    }
}

/// Client-triggered events are logged only when `ZGIX_DEBUG` is set: a hostile
/// client must not be able to flood the log.
pub fn log_debug(args: std::fmt::Arguments<'_>) {
    if crate::shard::debug_enabled() {
        eprintln!("zgix[debug]: {args}");
    }
}
