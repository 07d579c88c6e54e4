//! One client connection: PROXY header, client filter, then the request loop. Each phase has its room: [`state`] is the request state as types, [`head`] reads and parses a head, [`admit`] runs the admission controls and filters, [`forward`] talks to the upstream, [`body`] streams bodies both ways, [`tunnel`] relays an upgraded connection; [`shard`] is the shard state a connection runs on.
//!
//! # The floor
//!
//! The exchange stands above the runtime, the upstreams, the HTTP pieces,
//! the driver and observability, and imports only from them; the process
//! floor (`process/`: the shard's executor, generations, admin) hands each
//! accepted connection its [`shard::Shard`] and is never imported here.
//!
//! # The request state
//!
//! Like hyper's `proto/h1/conn.rs`, a connection's phases are values
//! ([`state`]): [`State::Idle`] between requests holds nothing;
//! [`State::Busy`] holds a [`Held`] guard, which owns the pooled
//! [`Exchange`] — the read and streaming buffers, the parsed heads, the
//! chunked decoders, the access-log record — and gives it back to its
//! shard's pool when it drops, on whatever path the request ends (a
//! connection task dropped mid-request included). The state is not a field
//! of [`Conn`]: it moves through [`Conn::run`]'s loop, into the head read
//! and the request's slab block and back, and every function of a request
//! is handed the `&mut Exchange` it works on, so none can find it missing.
//! The client bytes are a [`state::ClientBytes`] window whose start and end
//! only its own methods move; whether an answer's bytes reached the client
//! (`body::Sent`) and whether the request body is all read
//! (`body::BodyRead`) each have one writer.
//!
//! # Memory
//!
//! An idle connection (before its first byte, and between keep-alive
//! requests) holds no buffer: only this small [`Conn`] and its socket. When
//! bytes arrive it takes an [`Exchange`] from its shard's bounded pool,
//! and gives it back when the request is done and nothing pipelined is left
//! (more than the pool holds are freed). Buffers are mapped pages
//! ([`crate::io::Buf`]), resident only as far as bytes were written into
//! them, so a small request costs a page or two whatever the configured
//! sizes. A request state that cannot be made (a mapping failed) refuses
//! that one connection with a 503 (`zgix_request_state_refused_total`).
//!
//! # Generations
//!
//! A connection runs on the generation ([`shard::Shard`]) of its current
//! request. Idle between requests it holds no request state and follows a
//! reload at once: the retired generation's `shutdown` wakes it and it moves
//! to the newest ([`shard::follow`]), so an idle keep-alive client does not
//! keep an old configuration alive (`zgix_generations_live` returns to 1).
//! Before its first request a connection holds the accepting generation
//! for at most the header timeout.

mod admit;
mod body;
mod bulk;
pub mod client;
mod forward;
mod h2;
pub mod handshake;
mod head;
mod rechunk_up;
mod retry;
pub mod shard;
pub mod slab;
mod state;
#[cfg(test)]
mod tls_tests;
mod tunnel;

use forward::append_fields;

use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;
use std::time::Duration;

use zgix_admission::{ClientId, ConnGuard};
use zgix_parser::ParseError;

use crate::http::respond::{status_for, write_refusal};
use crate::io::Sock;
use crate::observe::decision::UpstreamError;
use crate::observe::metrics::ConnRefusal;
use client::ClientConn;
use shard::Shard;
use state::{Held, State};

pub use head::HeadScan;
pub use state::{trim_memory, Exchange};

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

/// A client connection: what it holds while idle. The request state is
/// not a field: it lives in [`Conn::run`]'s loop as a [`State`], and each
/// function of a request is handed the [`Exchange`] it works on.
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
        client.set_write_timeout(Some(shard.rt.timeouts.client_idle));
        Conn {
            li,
            client: ClientConn::plain(client),
            peer,
            ip,
            id: ClientId::from_ip(ip),
            conn_slot: None,
            conn_checked: false,
            token: None,
            shard,
        }
    }

    /// The connection's life. Its future is what an idle connection's task
    /// holds, so it keeps only the head read and the request's slab handle
    /// inline: the phases a connection passes once or on a failure (the
    /// PROXY header, the TLS handshake, refusals, the lingering close) run
    /// boxed, and cost their memory only while they run.
    ///
    /// The request state moves on with each phase: [`State::Idle`] (none
    /// held) or [`State::Busy`] (bytes buffered) into the head read, which
    /// hands back the [`Held`] exchange of a parsed head; the request is
    /// handled on it; then it goes back to the pool (the guard drops) unless
    /// a pipelined request is already buffered in it.
    async fn run(&mut self) {
        // The accepting generation is held for the prelude only: a
        // connection then runs on the generation of its current request.
        let Some(mut state) = Box::pin(self.open()).await else {
            return;
        };
        if self.h2_possible() {
            state = match Box::pin(self.h2_or_http1(state)).await {
                Some(s) => s,
                None => return,
            };
        }
        let mut first = true;
        loop {
            // Between requests, holding nothing: bytes, the idle timeout,
            // a drain, or a reload that moves the connection on.
            if !first && matches!(state, State::Idle) && !self.wait_between_requests().await {
                return;
            }
            let x = match self.read_head(first, state).await {
                head::HeadRead::Ready(x) => x,
                head::HeadRead::Closed => return,
                head::HeadRead::TimedOut(x) => {
                    // A head that started but did not finish in time: RFC 9110 §15.5.9.
                    if x.has_pending() {
                        Box::pin(self.refuse_and_close(
                            x,
                            408,
                            crate::observe::decision::Decision::ClientTimeout,
                        ))
                        .await;
                    }
                    return;
                }
                head::HeadRead::Bad(e, x) => {
                    Box::pin(self.refuse_and_close(
                        x,
                        status_for(e),
                        crate::observe::decision::Decision::BadRequest(e),
                    ))
                    .await;
                    return;
                }
            };
            first = false;
            let shard = self.shard.clone();
            let (next, x) = shard.request_futures.run(|| self.handle_request(x)).await;
            if next == Next::Close {
                Box::pin(self.close_gracefully(Some(x))).await;
                return;
            }
            state = if x.has_pending() {
                State::Busy(x)
            } else {
                State::Idle
            };
        }
    }

    /// What comes before the first head: the PROXY header, the client
    /// filter, the TLS handshake. `None`: the connection ends; else the
    /// state the first head read starts from (bytes after a PROXY header).
    async fn open(&mut self) -> Option<State> {
        let shard = self.shard.clone();
        let lst = &shard.rt.listeners[self.li];
        let mut state = State::Idle;
        if lst.proxy_protocol {
            match self.read_proxy_header().await {
                Ok(x) => state = State::Busy(x),
                Err(why) => {
                    // `None`: refused for want of a request state, answered.
                    if let Some(why) = why {
                        shard.counters.refused(why);
                    }
                    return None;
                }
            }
        }
        if let Some(filter) = &lst.clients {
            if !filter.admits(self.ip) {
                shard.counters.refused(ConnRefusal::ClientDenied);
                return None;
            }
        }
        if let Some(tls) = &lst.tls {
            // Bytes after the PROXY header are the ClientHello's start.
            let early = match &mut state {
                State::Busy(x) => {
                    let e = x.cl.bytes().to_vec();
                    x.cl.clear();
                    e
                }
                State::Idle => Vec::new(),
            };
            if !self.start_tls(tls, &early).await {
                self.close_gracefully(state.into_held()).await;
                return None;
            }
        }
        // Nothing buffered: wait for the first head holding no state.
        Some(match state {
            State::Busy(x) if !x.has_pending() => State::Idle,
            s => s,
        })
    }

    /// Answers a head that cannot be served with `status`, logs it as
    /// `decision`, and closes.
    async fn refuse_and_close(
        &mut self,
        mut x: Held,
        status: u16,
        decision: crate::observe::decision::Decision,
    ) {
        let tx0 = self.client.bytes_written();
        // The head did not parse: the refusal (and its log line) get a new ID,
        // never the previous request's.
        let mode = self.shard.rt.listeners[self.li].request_id;
        x.rec.request_id.choose(mode, std::iter::empty());
        self.refuse(&mut x, status, None).await;
        self.record_unparsed(&mut x, decision, tx0);
        self.close_gracefully(Some(x)).await;
    }

    /// Answers with a generated `connection: close` refusal; the caller then
    /// closes the connection (`close_gracefully`).
    async fn refuse(&mut self, x: &mut Exchange, status: u16, retry_after: Option<u64>) {
        x.rec.status = status;
        write_refusal(&mut x.out, status, retry_after, x.rec.request_id.as_bytes());
        crate::http::ratelimit::insert(&mut x.out, &x.rate_fields);
        self.shard.counters.response(self.li, status);
        self.client.closing();
        let _ = self.client.write_all(&x.out).await;
    }

    /// Half-closes and drains what the client still sends for a short, bounded
    /// while, so unread request bytes do not turn the close into a reset that
    /// could destroy the response in flight (the "lingering close" of nginx).
    /// Drains into the request state's buffer (taken for it if none is held).
    async fn close_gracefully(&mut self, x: Option<Held>) {
        self.client.shutdown().await;
        let shard = self.shard.clone();
        let mut x = match x.map_or_else(|| state::take(&shard, self.li), Ok) {
            Ok(x) => x,
            // No request state: drain into a small buffer of its own.
            Err(_) => return linger(&self.client, &shard, &mut vec![0; 4096]).await,
        };
        linger(&self.client, &shard, x.cl.scratch()).await;
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
    /// A request state from the shard's pool. When none can be made (its
    /// buffers could not be mapped) this one connection is answered 503 with
    /// `connection: close`, counted (`zgix_request_state_refused_total`) and
    /// `None` returned: the caller closes it, the shard goes on.
    async fn take_state(&mut self) -> Option<Held> {
        match state::take(&self.shard, self.li) {
            Ok(x) => Some(x),
            // Boxed: the refusal's writes and drain would otherwise widen
            // every future that awaits this one (an idle connection's, too).
            Err(e) => {
                Box::pin(self.refuse_for_want_of_state(e)).await;
                None
            }
        }
    }

    /// The 503 of [`Conn::take_state`].
    async fn refuse_for_want_of_state(&mut self, e: std::io::Error) {
        let shard = self.shard.clone();
        crate::log_warn!("conn", "cannot make a request state ({e}): answering 503");
        shard.counters.engine.request_state_refused.inc();
        let mut out = Vec::new();
        write_refusal(&mut out, 503, None, b"");
        shard.counters.response(self.li, 503);
        self.client.closing();
        let _ = self.client.write_all(&out).await;
        // The caller closes without `close_gracefully`, which would
        // try again: drain here so unread bytes do not reset the 503.
        self.client.shutdown().await;
        linger(&self.client, &shard, &mut vec![0; 4096]).await;
    }
}

impl Conn {
    /// The TLS handshake, after the PROXY header (whose leftover bytes,
    /// `early`, are the ClientHello's start); counted by outcome. `false`:
    /// the client was told why (or timed out) and the connection closes.
    async fn start_tls(&mut self, tls: &handshake::TlsListener, early: &[u8]) -> bool {
        let started = self.shard.driver.now();
        let c = &self.shard.counters.listeners[self.li];
        let Some(sock) = self.client.sock() else {
            return false;
        };
        match handshake::accept(sock, tls, early, None).await {
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
    fn ret_head<F: FnOnce(&'static mut super::Conn, bool, super::State) -> R, R>(_: F) -> usize {
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
        let idle = ret_conn(super::Conn::wait_between_requests);
        assert!(conn <= 256, "Conn is {conn} bytes");
        assert!(head <= 320, "the head read's future is {head} bytes");
        assert!(
            idle <= head,
            "the wait between requests ({idle}) is more than the head read ({head})"
        );
        assert!(
            run <= head + 64,
            "run's future ({run}) is more than the head read's ({head})"
        );
        // What the task of an idle connection holds besides its socket:
        // 512 bytes when the request state moved out of `Conn` (240 + 272
        // before, with it inside); a new field or await must not widen it.
        assert!(
            conn + run <= 512,
            "an idle connection holds {conn} + {run} bytes"
        );
        let tls = ret_conn(|c: &'static mut super::Conn| c.open());
        let close = ret_conn(|c: &'static mut super::Conn| c.close_gracefully(None));
        let hold = ret_conn(super::Conn::take_state);
        assert!(
            tls > run && close > run,
            "the phases boxed out of run are the larger ones (open {tls}, close {close}, run {run})"
        );
        assert!(
            hold <= 64,
            "take_state's future is {hold} bytes: its refusal must stay boxed"
        );
    }
}
