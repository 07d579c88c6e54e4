//! One client connection: PROXY header, client filter, then the request loop. Each phase has its room: [`head`] reads and parses a head, [`admit`] runs the admission controls and filters, [`forward`] talks to the upstream, [`body`] streams bodies both ways, [`tunnel`] relays an upgraded connection; [`shard`] is the shard state a connection runs on.
//!
//! # The floor
//!
//! The exchange stands above the runtime, the upstreams, the HTTP pieces,
//! the driver and observability, and imports only from them; the process
//! floor (`process/`: the shard's executor, generations, admin) hands each
//! accepted connection its [`shard::Shard`] and is never imported here.
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
//! sizes. A request state that cannot be made (a mapping failed) refuses
//! that one connection with a 503 (`zgix_request_state_refused_total`).

mod admit;
mod body;
mod bulk;
pub mod client;
mod forward;
pub mod handshake;
mod head;
pub mod shard;
pub mod slab;
#[cfg(test)]
mod tls_tests;
mod tunnel;

use forward::append_fields;

use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;
use std::time::Duration;

use zgix_admission::{ClientId, ConnGuard};
use zgix_parser::{ChunkedDecoder, ParseError, RequestHead, ResponseHead};

use crate::http::filters::Walk;
use crate::http::respond::{status_for, write_refusal};
use crate::io::{Buf, Sock};
use crate::observe::decision::UpstreamError;
use crate::observe::metrics::ConnRefusal;
use client::ClientConn;
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

/// A request state's buffer, or why its memory could not be mapped (the
/// connection is then refused with 503, the shard goes on).
fn state_buf(len: usize) -> std::io::Result<Buf> {
    Buf::try_new(len)
}

impl Exchange {
    /// A new request state, or the error of a buffer that could not be made.
    fn new(shard: &Shard, li: usize) -> std::io::Result<Box<Exchange>> {
        let rt = &shard.rt;
        Ok(Box::new(Exchange {
            cbuf: state_buf(rt.client_buffer_bytes())?,
            cstart: 0,
            cend: 0,
            scan: HeadScan::default(),
            ubuf: state_buf(rt.upstream_buffer_bytes())?,
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
        }))
    }

    /// Unhandled client bytes (a pipelined request) are left.
    fn has_pending(&self) -> bool {
        self.cend > self.cstart
    }
}

/// Takes a request state from the shard's pool (or makes one; that fails
/// when its buffers cannot be mapped).
fn take_exchange(shard: &Shard, li: usize) -> std::io::Result<Box<Exchange>> {
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
            Ok(x)
        }
        None => Exchange::new(shard, li).inspect_err(|_| {
            shard.exchanges_out.set(shard.exchanges_out.get() - 1);
        }),
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
    client: ClientConn,
    /// The TCP peer.
    peer: SocketAddr,
    /// The client's address: the PROXY header's source, else the peer.
    ip: IpAddr,
    id: ClientId,
    /// The connection-limit slot, held from the first admitted request until
    /// the connection ends (dropping the `Conn` releases it).
    conn_slot: Option<ConnGuard>,
    conn_checked: bool,
    /// Whether any byte of the current final response reached the client
    /// (a relayed 1xx does not count: a final answer may still follow it).
    sent: bool,
    /// The current request's state; `None` while idle.
    x: Option<Box<Exchange>>,
    /// The bucket and parameters when the current request took a token.
    token: Option<zgix_admission::Spent>,
}

/// Serves one accepted connection to its end.
///
/// Not an async fn: the connection is made here, so the task's future
/// holds the [`Conn`] and [`Conn::run`]'s state, not also the arguments it
/// was made from (an async fn keeps those in its frame for good). And the
/// future is boxed: whoever spawns it may wrap it in an `async` block that
/// awaits it (glommio's `Gate::spawn` does), and such a block holds the
/// future twice, as its capture and as the value it awaits; boxed, both
/// are a pointer. An idle connection's task is so about half the size.
pub fn serve(
    shard: Rc<Shard>,
    li: usize,
    client: Sock,
    peer: SocketAddr,
) -> impl std::future::Future<Output = ()> {
    // Counted closed where it was counted open, whichever generation the
    // connection ends on.
    let counters = shard.counters.clone();
    counters.connection_opened(li);
    counters.listeners[li].connections.inc();
    let mut conn = Conn::new(shard, li, client, peer);
    Box::pin(async move {
        conn.run().await;
        // The generation it ended on (the accepting one is not pinned; they
        // share the connection count).
        let shard = conn.shard.clone();
        drop(conn);
        counters.connection_closed(li);
        shard.connection_closed();
    })
}

impl Conn {
    fn new(shard: Rc<Shard>, li: usize, client: Sock, peer: SocketAddr) -> Conn {
        let ip = client_ip(peer.ip());
        let _ = client.set_nodelay(true);
        client.set_write_timeout(Some(shard.rt.timeouts.client_idle));
        Conn {
            li,
            client: ClientConn::plain(client),
            peer,
            ip,
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

    /// The connection's life. Its future is what an idle connection's task
    /// holds, so it keeps only the head read and the request's slab handle
    /// inline: the phases a connection passes once or on a failure (the
    /// PROXY header, the TLS handshake, refusals, the lingering close) run
    /// boxed, and cost their memory only while they run.
    async fn run(&mut self) {
        // The accepting generation is held for the prelude only (`open`
        // drops its handle): a connection then runs on the generation of
        // its current request.
        if !Box::pin(self.open()).await {
            return;
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
                        Box::pin(self.refuse_and_close(
                            408,
                            crate::observe::decision::Decision::ClientTimeout,
                        ))
                        .await;
                    }
                    return;
                }
                head::HeadRead::Bad(e) => {
                    Box::pin(self.refuse_and_close(
                        status_for(e),
                        crate::observe::decision::Decision::BadRequest(e),
                    ))
                    .await;
                    return;
                }
            }
            first = false;
            let shard = self.shard.clone();
            let next = shard.request_futures.run(self.handle_request()).await;
            if next == Next::Close {
                Box::pin(self.close_gracefully()).await;
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

    /// What comes before the first head: the PROXY header, the client
    /// filter, the TLS handshake. `false`: the connection ends.
    async fn open(&mut self) -> bool {
        let shard = self.shard.clone();
        let lst = &shard.rt.listeners[self.li];
        if lst.proxy_protocol {
            if let Err(why) = self.read_proxy_header().await {
                // `None`: refused for want of a request state, answered.
                if let Some(why) = why {
                    shard.counters.refused(why);
                }
                return false;
            }
        }
        if let Some(filter) = &lst.clients {
            if !filter.admits(self.ip) {
                shard.counters.refused(ConnRefusal::ClientDenied);
                return false;
            }
        }
        if let Some(tls) = &lst.tls {
            if !self.start_tls(tls).await {
                self.close_gracefully().await;
                return false;
            }
        }
        true
    }

    /// Answers a head that cannot be served with `status`, logs it as
    /// `decision`, and closes.
    async fn refuse_and_close(
        &mut self,
        status: u16,
        decision: crate::observe::decision::Decision,
    ) {
        let tx0 = self.client.bytes_written();
        self.refuse(status, None).await;
        self.record_unparsed(decision, tx0);
        self.close_gracefully().await;
    }

    /// Answers with a generated `connection: close` refusal; the caller then
    /// closes the connection (`close_gracefully`).
    async fn refuse(&mut self, status: u16, retry_after: Option<u64>) {
        let shard = self.shard.clone();
        if !self.hold_state().await {
            // Answered 503 instead: no state to write `status` from.
            return;
        }
        let x = self.x.as_mut().expect("just held");
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
        self.client.shutdown().await;
        let shard = self.shard.clone();
        if self.x.is_none() {
            match take_exchange(&shard, self.li) {
                Ok(x) => self.x = Some(x),
                // No request state: drain into a small buffer of its own.
                Err(_) => return linger(&self.client, &shard, &mut vec![0; 4096]).await,
            }
        }
        let x = self.x.as_mut().expect("just set");
        linger(&self.client, &shard, &mut x.cbuf[..]).await;
    }
}

/// Drains what the client still sends into `buf` until it closes, for at
/// most [`LINGER`] in all and [`LINGER_BYTES`].
async fn linger(client: &ClientConn, shard: &Shard, buf: &mut [u8]) {
    let until = shard.driver.now() + LINGER;
    let mut drained = 0usize;
    while drained < LINGER_BYTES {
        // One deadline for the whole drain, not one per read: a client
        // trickling bytes must not hold the connection.
        let left = until.saturating_duration_since(shard.driver.now());
        if left.is_zero() {
            break;
        }
        client.set_read_timeout(Some(left));
        match client.read(buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => drained += n,
        }
    }
}

impl Conn {
    /// Makes sure a request state is held. When none can be made (its
    /// buffers could not be mapped) this one connection is answered 503 with
    /// `connection: close`, counted (`zgix_request_state_refused_total`) and
    /// `false` returned: the caller closes it, the shard goes on.
    async fn hold_state(&mut self) -> bool {
        if self.x.is_some() {
            return true;
        }
        match take_exchange(&self.shard, self.li) {
            Ok(x) => {
                self.x = Some(x);
                true
            }
            // Boxed: the refusal's writes and drain would otherwise widen
            // every future that awaits this one (an idle connection's, too).
            Err(e) => Box::pin(self.refuse_for_want_of_state(e)).await,
        }
    }

    /// The 503 of [`Conn::hold_state`]; always `false`.
    async fn refuse_for_want_of_state(&mut self, e: std::io::Error) -> bool {
        let shard = self.shard.clone();
        crate::log_warn!("conn", "cannot make a request state ({e}): answering 503");
        shard.counters.engine.request_state_refused.inc();
        let mut out = Vec::new();
        write_refusal(&mut out, 503, None);
        shard.counters.response(self.li, 503);
        self.sent = true;
        let _ = self.client.write_all(&out).await;
        // The caller closes without `close_gracefully`, which would
        // try again: drain here so unread bytes do not reset the 503.
        self.client.shutdown().await;
        linger(&self.client, &shard, &mut vec![0; 4096]).await;
        false
    }
}

impl Conn {
    /// The TLS handshake, after the PROXY header (whose leftover bytes are
    /// the ClientHello's start); counted by outcome. `false`: the client was
    /// told why (or timed out) and the connection closes.
    async fn start_tls(&mut self, tls: &handshake::TlsListener) -> bool {
        let early = match self.x.as_mut() {
            Some(x) if x.has_pending() => {
                let e = x.cbuf[x.cstart..x.cend].to_vec();
                x.cstart = 0;
                x.cend = 0;
                e
            }
            _ => Vec::new(),
        };
        let started = self.shard.driver.now();
        let c = &self.shard.counters.listeners[self.li];
        match handshake::accept(self.client.sock(), tls, &early, None).await {
            Ok(t) => {
                let v = match t.info.version {
                    "TLSv1.2" => 1,
                    _ => 2,
                };
                c.tls_handshakes[0][v].inc();
                if t.info.resumed {
                    c.tls_resumed.inc();
                }
                let us = self
                    .shard
                    .driver
                    .now()
                    .saturating_duration_since(started)
                    .as_micros();
                c.tls_handshake_time.record(us as u64);
                self.client.start_tls(t);
                true
            }
            Err(o) => {
                c.tls_handshakes[o.index()][0].inc();
                false
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

/// How long in all and how much a closing connection is drained (see
/// `close_gracefully`). 500 ms is a few round trips even on a slow path, time
/// for the request bytes already in flight when the answer left (what the
/// drain is for), and short enough that a client trickling bytes holds a
/// closing connection no longer than that, however it spaces them (nginx's
/// `lingering_time` is likewise a total).
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

#[cfg(test)]
mod size_tests {
    //! What an idle connection's task holds, by type size: these bound the
    //! futures so that a new await on the idle path (a large future inline)
    //! shows here, not only as RSS in `scripts/bench-conns.sh`.

    /// The size of what `f` returns, without calling it.
    fn ret<A, B, C, D, R>(_: fn(A, B, C, D) -> R) -> usize {
        std::mem::size_of::<R>()
    }
    fn ret_conn<F: FnOnce(&'static mut super::Conn) -> R, R>(_: F) -> usize {
        std::mem::size_of::<R>()
    }
    fn ret_head<F: FnOnce(&'static mut super::Conn, bool) -> R, R>(_: F) -> usize {
        std::mem::size_of::<R>()
    }

    #[test]
    fn an_idle_connection_holds_a_small_future() {
        // A pointer: a spawner that awaits it inside its own async block
        // (glommio's Gate) holds it twice, so it must be boxed.
        assert_eq!(ret(super::serve as fn(_, _, _, _) -> _), 8);
        // The boxed part: the Conn and the life loop, whose biggest state
        // is the head read. The once-per-connection and failure phases are
        // boxed, and measured on their own above these bounds.
        let conn = std::mem::size_of::<super::Conn>();
        let run = ret_conn(super::Conn::run);
        let head = ret_head(super::Conn::read_head);
        assert!(conn <= 256, "Conn is {conn} bytes");
        assert!(head <= 320, "the head read's future is {head} bytes");
        assert!(
            run <= head + 64,
            "run's future ({run}) is more than the head read's ({head})"
        );
        let tls = ret_conn(|c: &'static mut super::Conn| c.open());
        let close = ret_conn(super::Conn::close_gracefully);
        let hold = ret_conn(super::Conn::hold_state);
        assert!(
            tls > run && close > run,
            "the phases boxed out of run are the larger ones (open {tls}, close {close}, run {run})"
        );
        assert!(
            hold <= 64,
            "hold_state's future is {hold} bytes: its refusal must stay boxed"
        );
    }
}
