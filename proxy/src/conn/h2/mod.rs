//! HTTP/2 from clients (RFC 9113) on a connection that negotiated `h2` with ALPN, or sent the preface to a plain listener with `http2.prior_knowledge`: zgix's own sans-I/O codec (`zgix_h2`) driven over the connection ([`wire`]: reads, writes; [`shared`]: the codec and the streams' slots), and each stream served by the HTTP/1.1 request loop over an in-memory client ([`stream`]) — admission, WAF, filters, routing, retries and the access log per stream; what the codec refuses counted by reason ([`frames`]).
//!
//! # Bounds
//!
//! The codec enforces `max_concurrent_streams` (one more is refused with
//! `REFUSED_STREAM`), `max_header_list_bytes` (a larger list is answered
//! 431; a header block over CONTINUATION frames past it ends the
//! connection with `ENHANCE_YOUR_CALM`), the flow-control windows (a
//! stream's body bytes are released only as the request loop reads them,
//! so a slow upstream holds the client back, §6.9), and its flood bounds
//! per second: PING, SETTINGS, empty frames, streams reset for the
//! client's errors ([`LOCAL_ERROR_RESETS`]) and streams the client resets
//! ([`RAPID_RESETS`], CVE-2023-44487), each answered GOAWAY
//! `ENHANCE_YOUR_CALM`. Responses stop while more than 64 KiB of frames
//! wait to be written, and so does reading.

mod answer;
mod direct;
mod frames;
mod render;
mod serve;
mod shared;
mod stream;
mod wire;

pub(in crate::conn) use direct::{answer_parsed, Added};
pub use stream::StreamIo;

/// A stream's I/O state in a block of the shard's `stream_ios` slab (the
/// client side of its request loop; reused, not allocated per stream).
pub type PlacedStreamIo = super::slab::PlacedIn<shard::Shard, StreamIo>;

use std::cell::{Cell, RefCell};
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::rc::Rc;
use std::task::Poll;
use std::time::{Duration, Instant};

use futures_util::stream::{FuturesUnordered, StreamExt};
use zgix_admission::ConnGuard;
use zgix_h2::server::{Config, ErrorCode, Event, Server, Stats, StreamId};
use zgix_parser::Method;

use super::client::ClientConn;
use super::slab::{FutureSlab, RunningIn};
use super::state::{self, State};
use super::{is_timeout, shard, Conn};
use frames::Refusal;
use serve::{serve_stream, stream_head, StreamHead};
use shared::Core;
use wire::{Got, Wire};

/// The connection preface (RFC 9113 §3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Streams a client may reset within a second before GOAWAY (rapid reset).
pub const RAPID_RESETS: u32 = 200;

/// Streams reset for a client's error within a second before GOAWAY.
const LOCAL_ERROR_RESETS: u32 = 100;

/// The preface and the first SETTINGS' header: once the codec used this
/// many bytes the handshake is done (§3.4) and the idle timeout applies.
const HANDSHAKE_BYTES: usize = 24 + 9;

/// What the streams of one connection share with it.
struct Streams {
    /// The connection-limit slot, once a stream's admission took it.
    slot: RefCell<Option<ConnGuard>>,
    checked: Cell<bool>,
    /// A stream was refused by the connection limit: no more are taken.
    limited: Cell<bool>,
}

impl Conn {
    /// Whether the connection may speak HTTP/2: ALPN chose `h2`, or a plain
    /// listener takes the preface by prior knowledge.
    pub(super) fn h2_possible(&self) -> bool {
        let lst = &self.shard.rt.config.listeners[self.li];
        self.client.alpn() == Some(b"h2") || (lst.tls.is_none() && lst.http2.prior_knowledge)
    }

    /// On a prior-knowledge listener, reads until the first bytes are (or
    /// cannot be) the preface; they stay buffered for whichever protocol.
    pub(super) async fn h2_wanted(&mut self, st: &mut State) -> bool {
        if self.client.alpn() == Some(b"h2") {
            return true;
        }
        let shard = self.shard.clone();
        let deadline = shard.driver.now() + shard.rt.timeouts.client_header;
        if matches!(st, State::Idle) {
            // No request state is held before the first byte.
            self.client
                .set_read_timeout(Some(shard.rt.timeouts.client_header));
            if self.client.readable().await.is_err() {
                return false;
            }
        }
        loop {
            if matches!(st, State::Idle) {
                match state::take(&shard, self.li) {
                    Ok(x) => *st = State::Busy(x),
                    Err(_) => return false,
                }
            }
            let State::Busy(x) = st else { return false };
            let have = x.cl.bytes();
            // "PRI " is no HTTP/1.1 method zgix forwards: the rest of the
            // preface is the codec's to check (and answer GOAWAY).
            let n = have.len().min(4);
            if have[..n] != PREFACE[..n] {
                return false;
            }
            if n == 4 {
                return true;
            }
            let left = deadline.saturating_duration_since(shard.driver.now());
            if left.is_zero() {
                return false;
            }
            self.client.set_read_timeout(Some(left));
            match self.client.read(x.cl.spare()).await {
                Ok(0) | Err(_) => return false,
                Ok(k) => x.cl.filled(k),
            }
        }
    }

    /// On a listener that may speak HTTP/2: serves the connection as HTTP/2
    /// to its end when it does (`None`), else hands back the state with the
    /// bytes read so far for the HTTP/1.1 loop. Boxed out of `run`, so an
    /// idle HTTP/1.1 connection's task does not grow by it.
    pub(super) async fn h2_or_http1(&mut self, mut st: State) -> Option<State> {
        // The preface wait boxed: its read (0.6 KiB) is not kept in this
        // future beside the connection's life; ALPN needs no wait.
        if self.client.alpn() != Some(b"h2") && !Box::pin(self.h2_wanted(&mut st)).await {
            return Some(st);
        }
        Box::pin(self.serve_h2(st)).await;
        Box::pin(self.close_gracefully(None)).await;
        None
    }

    /// Serves the connection as HTTP/2 to its end.
    pub(super) async fn serve_h2(&mut self, st: State) {
        let shard = self.shard.clone();
        let li = self.li;
        shard.counters.listeners[li].h2_connections.inc();
        let cfg = shard.rt.config.listeners[li].http2;
        let server = Server::new(Config {
            max_concurrent_streams: cfg.max_concurrent_streams,
            initial_window: cfg.initial_window_bytes,
            connection_window: cfg.initial_window_bytes.saturating_mul(4).min(16 << 20),
            max_header_list: cfg.max_header_list_bytes,
            max_resets_per_tick: RAPID_RESETS,
            max_stream_errors_per_tick: LOCAL_ERROR_RESETS,
            ..Config::default()
        });
        let core = Rc::new(Core::new(server));
        // The bytes read so far (the preface's first ones) go to the codec;
        // the exchange goes back to the pool as the state drops.
        let held = st.into_held();
        let early: &[u8] = match &held {
            Some(x) => x.cl.bytes(),
            None => &[],
        };
        let wire = Wire::new(&self.client, early);
        drop(held);
        self.client
            .set_read_timeout(Some(shard.rt.timeouts.client_header));
        let sni = self.client.log_facts().1.map(Rc::from);
        let mut parent = Parent {
            shard: self.shard.clone(),
            li,
            conn: self,
            sni,
        };
        parent.run(wire, &core).await;
    }
}

/// The parts of the connection its streams are made from.
struct Parent<'a> {
    shard: Rc<shard::Shard>,
    li: usize,
    conn: &'a Conn,
    /// The connection's SNI, shared by its streams' access-log records.
    sni: Option<Rc<[u8]>>,
}

/// A drain or a reload retiring the generation: its shutdown semaphore closed.
type DrainFut = Pin<Box<dyn Future<Output = ()>>>;

/// Closed by a drain, and by a reload retiring this generation (then the
/// connection follows and waits on the new one's).
fn arm(shard: Rc<shard::Shard>) -> DrainFut {
    Box::pin(async move {
        let _ = shard.shutdown.acquire(1).await;
    })
}

/// A stream's future: a handle to its block in the shard's
/// `stream_futures` slab, its type erased. `FuturesUnordered` keeps a stub
/// task holding an `Option` of its future type inline, so the stream
/// future itself (about 1 KiB) would cost its size on every idle
/// connection; the handle costs five words, and neither it nor the future
/// is a per-stream allocation (the set's task for it still is).
type StreamFut = RunningIn<shard::Shard, ()>;

/// The most [`Todo`]s the shard's list keeps room for between reads.
const TODO_KEPT: usize = 256;

thread_local! {
    /// What a read left to do, one list for the shard's connections (each
    /// read's list is done before the loop polls anything else), so a read
    /// of 100 requests does not grow a list of its own from nothing.
    static TODO: std::cell::Cell<Vec<Todo>> = const { std::cell::Cell::new(Vec::new()) };
}

/// What a `recv` left to do once the codec is free again.
enum Todo {
    /// A request to serve: its head as the loop takes it, or `Unfit`.
    New(StreamId, Result<NewStream, render::Unfit>),
    /// Body bytes no stream takes: their window goes back at once.
    Release(StreamId, usize),
}

struct NewStream {
    head: StreamHead,
    text: Vec<u8>,
    chunked: bool,
    has_body: bool,
    method: Method,
}

/// Why the connection loop ended.
enum End {
    /// The codec is done (an error's GOAWAY written, or drained).
    Done,
    /// The client closed, timed out, or a write failed.
    Closed,
}

/// The connection's state between events.
struct Loop {
    streams: Rc<Streams>,
    set: FuturesUnordered<StreamFut>,
    drain: DrainFut,
    going_away: bool,
    /// When the codec's flood counters last began a period.
    tick_at: Instant,
    /// The codec's refusal counts as last counted.
    stats: Stats,
    /// Bytes the codec used: the handshake is done past [`HANDSHAKE_BYTES`].
    used: usize,
    /// When the handshake must be done: one deadline for the preface and
    /// the first SETTINGS, not one per read, so a client dribbling them a
    /// byte at a time is cut at `client_header_timeout_ms`.
    handshake_by: Instant,
}

impl Loop {
    /// Sends the graceful GOAWAY once (RFC 9113 §6.8): no new streams,
    /// those in flight finish.
    fn go_away(&mut self, core: &Core) {
        if !self.going_away {
            self.going_away = true;
            core.server.borrow_mut().graceful_shutdown();
        }
    }
}

impl Parent<'_> {
    fn counters(&self) -> &crate::observe::metrics::ListenerCounters {
        &self.shard.counters.listeners[self.li]
    }

    async fn run(&mut self, mut wire: Wire<'_>, core: &Rc<Core>) {
        let mut lp = Loop {
            streams: Rc::new(Streams {
                slot: RefCell::new(None),
                checked: Cell::new(false),
                limited: Cell::new(false),
            }),
            set: FuturesUnordered::new(),
            drain: arm(self.shard.clone()),
            going_away: false,
            tick_at: self.shard.driver.now(),
            stats: Stats::default(),
            used: 0,
            handshake_by: self.shard.driver.now() + self.shard.rt.timeouts.client_header,
        };
        let end = poll_fn(|cx| loop {
            let mut again = false;
            while let Poll::Ready(Some(())) = lp.set.poll_next_unpin(cx) {
                if lp.streams.limited.get() {
                    lp.go_away(core);
                }
            }
            match wire.poll_write(cx, core) {
                Poll::Ready(Err(_)) => return Poll::Ready(End::Closed),
                Poll::Ready(Ok(())) => {
                    let s = core.server.borrow();
                    if s.error().is_some() || (s.is_done() && lp.set.is_empty()) {
                        return Poll::Ready(End::Done);
                    }
                }
                Poll::Pending => {}
            }
            if !lp.going_away && lp.drain.as_mut().poll(cx).is_ready() {
                self.drained(&mut lp, core);
                again = true;
            }
            let dead = core.server.borrow().error().is_some();
            if !dead && core.room() {
                match wire.poll_read(cx) {
                    Poll::Pending => {}
                    Poll::Ready(Got::Bytes) => {
                        self.received(&mut lp, &mut wire, core);
                        again = true;
                    }
                    Poll::Ready(Got::Eof) => return Poll::Ready(End::Closed),
                    // Streams are in flight: an idle client is waiting for them.
                    Poll::Ready(Got::Err(e))
                        if is_timeout(&e) && lp.used >= HANDSHAKE_BYTES && !lp.set.is_empty() =>
                    {
                        again = true
                    }
                    Poll::Ready(Got::Err(_)) => return Poll::Ready(End::Closed),
                }
            }
            if !again {
                return Poll::Pending;
            }
        })
        .await;
        if let End::Closed = end {
            crate::log_debug!("h2", "connection closed");
        }
        core.end();
        frames::count_stats(self.counters(), &mut lp.stats, core.server.borrow().stats());
        // Streams still running lose their connection: their writes fail.
        drop(lp);
    }

    /// The client's bytes: the codec's events, then what they left to do.
    fn received(&mut self, lp: &mut Loop, wire: &mut Wire<'_>, core: &Rc<Core>) {
        let now = self.shard.driver.now();
        if now.saturating_duration_since(lp.tick_at) >= Duration::from_secs(1) {
            lp.tick_at = now;
            core.server.borrow_mut().tick();
        }
        if !lp.going_away && self.follow() {
            lp.go_away(core);
        }
        let (shard, li) = (&self.shard, self.li);
        let mut todo = TODO.take();
        let r = core
            .server
            .borrow_mut()
            .recv(wire.held(), &mut |e| match e {
                Event::Request {
                    id,
                    head,
                    end_stream,
                } => {
                    core.open(id, end_stream);
                    let has_body = !end_stream;
                    let method = Method::from_bytes(head.method);
                    let made = stream_head(shard, li, &render::Req::of(head), has_body).map(
                        |(head, text, chunked)| NewStream {
                            head,
                            text,
                            chunked,
                            has_body,
                            method,
                        },
                    );
                    todo.push(Todo::New(id, made));
                }
                Event::Data {
                    id,
                    data,
                    end_stream,
                } => {
                    if !core.data(id, data, end_stream) && !data.is_empty() {
                        todo.push(Todo::Release(id, data.len()));
                    }
                }
                Event::Trailers { id, .. } => core.ended(id),
                Event::Reset { id, .. } | Event::StreamError { id, .. } => core.reset(id),
                Event::WindowOpen { id } => core.window_open(id),
                Event::GoAway { .. } => {}
            });
        match r {
            Ok(n) => {
                lp.used = lp.used.saturating_add(n);
                wire.used(n);
                if lp.used < HANDSHAKE_BYTES {
                    // The next read waits only for what is left of the
                    // handshake's time (at least 1 ms, then it times out).
                    let left = lp.handshake_by.saturating_duration_since(now);
                    self.conn
                        .client
                        .set_read_timeout(Some(left.max(Duration::from_millis(1))));
                } else if lp.used - n < HANDSHAKE_BYTES {
                    self.conn
                        .client
                        .set_read_timeout(Some(self.shard.rt.timeouts.client_idle));
                }
            }
            Err(e) => {
                frames::count_error(self.counters(), e);
                wire.discard();
                // The GOAWAY is the last thing sent.
                self.conn.client.closing();
            }
        }
        frames::count_stats(self.counters(), &mut lp.stats, core.server.borrow().stats());
        for t in todo.drain(..) {
            match t {
                // Opened and reset in one read (rapid reset, CVE-2023-44487):
                // no request loop runs for it; its exchange goes back now.
                Todo::New(id, Ok(_)) if core.is_reset(id) => core.close(id),
                Todo::New(id, Ok(n)) => self.accepted(lp, core, id, n),
                Todo::New(id, Err(render::Unfit)) => {
                    core.close(id);
                    core.server
                        .borrow_mut()
                        .reset(id, ErrorCode::PROTOCOL_ERROR);
                    frames::count(self.counters(), Refusal::StreamError);
                }
                Todo::Release(id, n) => core.server.borrow_mut().release(id, n),
            }
        }
        if todo.capacity() <= TODO_KEPT {
            TODO.set(todo);
        }
    }

    /// A stream the codec handed over: its future joins the set.
    fn accepted(&mut self, lp: &mut Loop, core: &Rc<Core>, id: StreamId, n: NewStream) {
        self.counters().h2_streams.inc();
        if self.shard.closing.get() || lp.streams.limited.get() {
            lp.go_away(core);
        }
        if !lp.going_away && self.follow() {
            lp.go_away(core);
        }
        // The stream's future (about 1 KiB) in a block of the shard's
        // slab, reused; only a pointer-sized handle is boxed into the set.
        let f = FutureSlab::run_in(
            self.shard.clone(),
            |s| &s.stream_futures,
            || self.stream(&lp.streams, core, id, n),
        );
        lp.set.push(f);
    }

    /// The shutdown semaphore closed: a drain sends GOAWAY; a reload moves
    /// new streams to the newest generation, or winds down when the
    /// listener is gone.
    fn drained(&mut self, lp: &mut Loop, core: &Core) {
        if self.shard.retired.get() && !self.shard.draining.get() {
            if self.follow() {
                lp.go_away(core);
            } else {
                lp.drain = arm(self.shard.clone());
            }
        } else {
            lp.go_away(core);
        }
    }

    /// A reload made a newer generation: new streams run there. `true`:
    /// the listener is gone, the connection winds down.
    fn follow(&mut self) -> bool {
        match shard::follow(&mut self.shard, self.li) {
            shard::Follow::Stay => false,
            shard::Follow::Move(li) => {
                self.li = li;
                false
            }
            shard::Follow::Close => true,
        }
    }

    /// One stream, from its request to the end of its answer, or until
    /// the client resets it.
    fn stream(
        &self,
        streams: &Rc<Streams>,
        core: &Rc<Core>,
        id: StreamId,
        n: NewStream,
    ) -> impl Future<Output = ()> + 'static {
        let parent = self.conn;
        let shard = self.shard.clone();
        let li = self.li;
        let (peer, ip, conn_id) = (parent.peer, parent.ip, parent.id);
        let tls = parent.client.log_facts().0;
        let sni = self.sni.clone();
        let streams = streams.clone();
        let core = core.clone();
        async move {
            // An in-place head counts as read already, as when the loop
            // reads it (the access log's byte counts begin with it).
            let rx = match &n.head {
                StreamHead::InPlace(x) => x.cl.pending() as u64,
                StreamHead::Text => 0,
            };
            let io = FutureSlab::place_in(
                shard.clone(),
                |s| &s.stream_ios,
                || {
                    StreamIo::new(
                        shard.driver.clone(),
                        (tls, sni),
                        (core.clone(), id),
                        (n.text, n.has_body, n.chunked),
                        n.method,
                    )
                },
            );
            io.rx.set(rx);
            io.write_timeout.set(Some(shard.rt.timeouts.client_idle));
            let mut conn = Conn {
                shard,
                li,
                client: ClientConn::h2(io),
                peer,
                ip,
                id: conn_id,
                conn_slot: None,
                conn_checked: streams.checked.get(),
                token: None,
            };
            let head = n.head;
            let serve = async {
                let limited = serve_stream(&mut conn, head).await;
                if conn.conn_checked {
                    streams.checked.set(true);
                }
                if let Some(g) = conn.conn_slot.take() {
                    let mut slot = streams.slot.borrow_mut();
                    if slot.is_none() {
                        *slot = Some(g);
                    }
                }
                if limited {
                    streams.limited.set(true);
                }
                conn.client.shutdown().await;
            };
            let reset = poll_fn(|cx| core.poll_reset(id, cx));
            futures_lite::future::or(serve, reset).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The size of what a function `f` returns (here: an async fn's future).
    fn returned<A, B, R>(_: &impl FnOnce(A, B) -> R) -> usize {
        std::mem::size_of::<R>()
    }

    #[test]
    fn an_idle_connections_future_is_small_and_the_codec_is_not_in_it() {
        let serve = |c: &'static mut Conn, st: State| c.serve_h2(st);
        let serve = returned(&serve);
        // The codec lives beside the streams' slots in one allocation; the
        // future holds the loop's state and the reads' and writes' boxes.
        assert!(serve < 1024, "serve_h2: {serve} bytes");
        // What the dispatch holds around it: no preface read's state.
        let dispatch = |c: &'static mut Conn, st: State| c.h2_or_http1(st);
        assert!(
            returned(&dispatch) <= 64,
            "h2_or_http1: {}",
            returned(&dispatch)
        );
    }
}
