//! One client connection: PROXY header, client filter, then the request loop. Each phase has its room: [`head`] reads and parses a head, [`admit`] runs the admission controls and filters, [`forward`] talks to the upstream, [`body`] streams bodies both ways, [`tunnel`] relays an upgraded connection.
//!
//! # Memory
//!
//! An idle connection (before its first byte, and between keep-alive
//! requests) holds no buffer: only this small [`Conn`] and its socket. When
//! bytes arrive it takes an [`Exchange`] — the read and streaming buffers,
//! the parsed heads, the chunked decoders — from its shard's bounded pool,
//! and gives it back when the request is done and nothing pipelined is left
//! (more than the pool holds are freed). Buffers are mapped pages
//! ([`crate::io::Buf`]), resident only as far as bytes were written into
//! them, so a small request costs a page or two whatever the configured
//! sizes.

mod admit;
mod body;
mod forward;
mod head;
pub mod shard;
pub mod slab;
mod tunnel;

use forward::append_fields;

use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;
use std::time::Duration;

use zgix_admission::{ClientId, ConnGuard};
use zgix_parser::{ChunkedDecoder, ParseError, RequestHead, ResponseHead};

use crate::http::filters::Walk;
use crate::http::respond::{status_for, write_refusal};
use crate::http::wire;
use crate::io::{Buf, Sock};
use crate::observe::decision::UpstreamError;
use crate::observe::metrics::ConnRefusal;
use shard::Shard;

pub use head::HeadScan;

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

/// The state one request needs, pooled per shard (see the module docs).
pub struct Exchange {
    /// Client bytes: the head being read, then body chunks.
    cbuf: Buf,
    cstart: usize,
    cend: usize,
    /// How far `cbuf[cstart..cend]` was scanned for the end of the head.
    scan: HeadScan,
    /// Upstream bytes: the response head, then body chunks.
    ubuf: Buf,
    ustart: usize,
    uend: usize,
    /// Heads as rewritten for the other side.
    out: Vec<u8>,
    req: RequestHead,
    resp: ResponseHead,
    req_chunked: ChunkedDecoder,
    resp_chunked: ChunkedDecoder,
    /// A chunked request body re-encoded for the origin (sized on first use).
    body_out: Vec<u8>,
    /// The access-log record of the current request, and what it needs of
    /// the head once the buffer holds body bytes: the method, the query,
    /// the client's byte counters when the head began.
    rec: crate::observe::access_log::Record,
    rec_method: Vec<u8>,
    rec_query: Vec<u8>,
    rec_has_query: bool,
    rec_rx0: u64,
    rec_tx0: u64,
    walk: Walk,
    /// The listener `walk` is sized for.
    walk_li: usize,
    /// This request's RateLimit-Policy and RateLimit fields (`"headers":
    /// "draft-11"`), spliced into every head zgix writes for it; empty for none.
    rate_fields: Vec<u8>,
}

impl Exchange {
    fn new(shard: &Shard, li: usize) -> Box<Exchange> {
        let rt = &shard.rt;
        Box::new(Exchange {
            cbuf: Buf::new(rt.client_buffer_bytes()),
            cstart: 0,
            cend: 0,
            scan: HeadScan::default(),
            ubuf: Buf::new(rt.upstream_buffer_bytes()),
            ustart: 0,
            uend: 0,
            out: Vec::with_capacity(rt.out_buffer_bytes()),
            req: RequestHead::new(&rt.request_limits),
            resp: ResponseHead::new(rt.response_max_headers()),
            req_chunked: ChunkedDecoder::new(u64::MAX),
            resp_chunked: ChunkedDecoder::new(u64::MAX),
            body_out: Vec::new(),
            rec: crate::observe::access_log::Record::new(
                li,
                std::net::Ipv4Addr::UNSPECIFIED.into(),
                ([0, 0, 0, 0], 0).into(),
            ),
            rec_method: Vec::with_capacity(16),
            rec_query: Vec::new(),
            rec_has_query: false,
            rec_rx0: 0,
            rec_tx0: 0,
            walk: rt.listeners[li]
                .filters
                .new_walk(rt.config.limits.max_request_line),
            walk_li: li,
            rate_fields: Vec::with_capacity(crate::http::ratelimit::FIELDS_CAPACITY),
        })
    }

    /// Unhandled client bytes (a pipelined request) are left.
    fn has_pending(&self) -> bool {
        self.cend > self.cstart
    }
}

/// Takes a request state from the shard's pool (or makes one).
fn take_exchange(shard: &Shard, li: usize) -> Box<Exchange> {
    let out = shard.exchanges_out.get() + 1;
    shard.exchanges_out.set(out);
    if out > shard.exchanges_peak.get() {
        shard.exchanges_peak.set(out);
    }
    let pooled = shard.exchanges.borrow_mut().pop();
    match pooled {
        Some(mut x) => {
            if x.walk_li != li {
                // Walks are sized per listener's filters.
                x.walk = shard.rt.listeners[li]
                    .filters
                    .new_walk(shard.rt.config.limits.max_request_line);
                x.walk_li = li;
            }
            x
        }
        None => Exchange::new(shard, li),
    }
}

/// Gives a request state back to the pool, or frees it when the pool is full.
fn put_exchange(shard: &Shard, mut x: Box<Exchange>) {
    shard.exchanges_out.set(shard.exchanges_out.get() - 1);
    let mut pool = shard.exchanges.borrow_mut();
    if pool.len() < shard.rt.config.io.idle_exchanges {
        x.cstart = 0;
        x.cend = 0;
        x.scan = HeadScan::default();
        x.ustart = 0;
        x.uend = 0;
        x.out.clear();
        pool.push(x);
    } else {
        FREED.with(|f| f.set(f.get() + 1));
    }
}

/// Connections that must have closed since the last tick before the heap is
/// trimmed for them: a few hundred connections' tasks are a MiB or so.
const TRIM_AFTER_CLOSED: usize = 256;

thread_local! {
    /// Request states freed since the last trim (see [`trim_memory`]).
    static FREED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Once a second (the shard tick): keeps as many pooled request states as
/// the last second's peak of requests in flight needs, frees the rest, and
/// after a burst hands free heap pages back to the OS (`malloc_trim`: the
/// parsed-head vectors live on the heap, and glibc keeps freed pages in the
/// middle of it otherwise). A steady load so reuses its states (no mapping
/// per request); after a burst, memory falls back within a second or two.
pub fn trim_memory(shard: &Shard) {
    // Connections that closed since the last trim freed their tasks and
    // slots' worth of heap too.
    let open = shard.open_connections.get();
    let high = shard.connections_high.replace(open);
    if high > open + TRIM_AFTER_CLOSED {
        FREED.with(|f| f.set(f.get() + 1));
    }
    let out = shard.exchanges_out.get();
    let spare = shard.exchanges_peak.replace(out).saturating_sub(out);
    shard.request_futures.trim();
    {
        let mut pool = shard.exchanges.borrow_mut();
        while pool.len() > spare {
            pool.pop();
            FREED.with(|f| f.set(f.get() + 1));
        }
    }
    if FREED.with(|f| f.replace(0)) > 0 {
        // SAFETY: malloc_trim only releases free memory of this process.
        unsafe { libc::malloc_trim(0) };
    }
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

/// A client connection: what it holds while idle.
pub struct Conn {
    shard: Rc<Shard>,
    li: usize,
    client: Sock,
    /// The TCP peer.
    peer: SocketAddr,
    /// The client's address: the PROXY header's source, else the peer.
    ip: IpAddr,
    /// `ip` as text, for X-Forwarded-For.
    ip_text: wire::IpText,
    id: ClientId,
    /// The connection-limit slot, held from the first admitted request until
    /// the connection ends (dropping the `Conn` releases it).
    conn_slot: Option<ConnGuard>,
    conn_checked: bool,
    /// Whether any byte of the current response reached the client.
    sent: bool,
    /// The current request's state; `None` while idle.
    x: Option<Box<Exchange>>,
    /// The bucket and parameters when the current request took a token.
    token: Option<zgix_admission::Spent>,
}

/// Serves one accepted connection to its end.
pub async fn serve(shard: Rc<Shard>, li: usize, client: Sock, peer: SocketAddr) {
    let counters = shard.counters.clone();
    counters.connection_opened(li);
    counters.listeners[li].connections.inc();
    let mut conn = Conn::new(shard.clone(), li, client, peer);
    conn.run().await;
    drop(conn);
    counters.connection_closed(li);
    shard.connection_closed();
}

impl Conn {
    fn new(shard: Rc<Shard>, li: usize, client: Sock, peer: SocketAddr) -> Conn {
        let ip = client_ip(peer.ip());
        let _ = client.set_nodelay(true);
        client.set_write_timeout(Some(shard.rt.timeouts.client_idle));
        Conn {
            li,
            client,
            peer,
            ip,
            ip_text: wire::IpText::new(ip),
            id: ClientId::from_ip(ip),
            conn_slot: None,
            conn_checked: false,
            sent: false,
            x: None,
            token: None,
            shard,
        }
    }

    /// The current request state (taken by `head` before anything uses it).
    fn x(&mut self) -> &mut Exchange {
        self.x
            .as_mut()
            .expect("a request state is held while a request is handled")
    }

    async fn run(&mut self) {
        let shard = self.shard.clone();
        let lst = &shard.rt.listeners[self.li];
        if lst.proxy_protocol {
            if let Err(why) = self.read_proxy_header().await {
                shard.counters.refused(why);
                return;
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
                head::HeadRead::Ready => {}
                head::HeadRead::Moved => continue,
                head::HeadRead::Closed => return,
                head::HeadRead::TimedOut => {
                    // A head that started but did not finish in time: RFC 9110 §15.5.9.
                    if self.x.as_ref().is_some_and(|x| x.has_pending()) {
                        let tx0 = self.client.bytes_written();
                        self.refuse(408, None).await;
                        self.record_unparsed(
                            crate::observe::decision::Decision::ClientTimeout,
                            tx0,
                        );
                        self.close_gracefully().await;
                    }
                    return;
                }
                head::HeadRead::Bad(e) => {
                    let tx0 = self.client.bytes_written();
                    self.refuse(status_for(e), None).await;
                    self.record_unparsed(crate::observe::decision::Decision::BadRequest(e), tx0);
                    self.close_gracefully().await;
                    return;
                }
            }
            first = false;
            let shard = self.shard.clone();
            let next = shard.request_futures.run(self.handle_request()).await;
            if next == Next::Close {
                self.close_gracefully().await;
                return;
            }
            // Idle between requests: give the request state back unless a
            // pipelined request is already buffered.
            if self.x.as_ref().is_some_and(|x| !x.has_pending()) {
                if let Some(x) = self.x.take() {
                    put_exchange(&shard, x);
                }
            }
        }
    }

    /// Answers with a generated `connection: close` refusal; the caller then
    /// closes the connection (`close_gracefully`).
    async fn refuse(&mut self, status: u16, retry_after: Option<u64>) {
        let shard = self.shard.clone();
        if self.x.is_none() {
            self.x = Some(take_exchange(&shard, self.li));
        }
        let x = self.x.as_mut().expect("just set");
        x.rec.status = status;
        write_refusal(&mut x.out, status, retry_after);
        crate::http::ratelimit::insert(&mut x.out, &x.rate_fields);
        shard.counters.response(self.li, status);
        self.sent = true;
        let _ = self.client.write_all(&x.out).await;
    }

    /// Half-closes and drains what the client still sends for a short, bounded
    /// while, so unread request bytes do not turn the close into a reset that
    /// could destroy the response in flight (the "lingering close" of nginx).
    async fn close_gracefully(&mut self) {
        self.client.shutdown_write();
        self.client.set_read_timeout(Some(LINGER));
        let shard = self.shard.clone();
        if self.x.is_none() {
            self.x = Some(take_exchange(&shard, self.li));
        }
        let x = self.x.as_mut().expect("just set");
        let mut drained = 0usize;
        while drained < LINGER_BYTES {
            match self.client.read(&mut x.cbuf[..]).await {
                Ok(0) | Err(_) => break,
                Ok(n) => drained += n,
            }
        }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if let Some(x) = self.x.take() {
            put_exchange(&self.shard, x);
        }
    }
}

/// How long and how much a closing connection is drained (see `close_gracefully`).
const LINGER: Duration = Duration::from_millis(500);
const LINGER_BYTES: usize = 1 << 20;

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
    )
}

fn upstream_io(e: &std::io::Error) -> Fail {
    if is_timeout(e) {
        Fail::Upstream(UpstreamError::IdleTimeout)
    } else {
        Fail::Upstream(UpstreamError::Reset)
    }
}
