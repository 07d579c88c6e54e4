//! HTTP/2 from clients (RFC 9113) on a connection that negotiated `h2` with ALPN, or sent the preface to a plain listener with `http2.prior_knowledge`: the `h2` codec over the connection ([`io`]), and each stream served by the HTTP/1.1 request loop over an in-memory client ([`stream`]) — admission, WAF, filters, routing, retries and the access log per stream; what the codec refuses, and the rapid resets zgix sees itself, counted by reason ([`frames`]).
//!
//! # Bounds
//!
//! The codec enforces `max_concurrent_streams` (one more is refused with
//! `REFUSED_STREAM`), `max_header_list_bytes` (a header block, CONTINUATION
//! frames included, is decoded against it and a flood ends the connection
//! with `ENHANCE_YOUR_CALM` or `COMPRESSION_ERROR`), the flow-control
//! windows, and its limits on streams reset before zgix accepted them and on
//! streams it reset for a client's error. Beyond those, a client that resets
//! more than [`RAPID_RESETS`] streams it opened within one second gets
//! GOAWAY `ENHANCE_YOUR_CALM` (CVE-2023-44487).

mod answer;
mod frames;
mod hpack_scan;
mod inbound;
mod io;
mod render;
mod stream;

pub use stream::StreamIo;

use std::cell::{Cell, RefCell};
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::rc::Rc;
use std::task::Poll;
use std::time::{Duration, Instant};

use ::h2::server::SendResponse;
use ::h2::RecvStream;
use bytes::Bytes;
use futures_util::stream::{FuturesUnordered, StreamExt};
use zgix_admission::ConnGuard;

use super::client::ClientConn;
use super::state::{self, Held, State};
use super::Exchange;
use super::{head, shard, Conn};
use crate::http::respond::status_for;
use crate::observe::decision::Decision;

/// The connection preface (RFC 9113 §3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Streams a client may reset within a second before GOAWAY (rapid reset).
pub const RAPID_RESETS: u32 = 200;

/// Streams reset for a client's error before the codec ends the connection.
const LOCAL_ERROR_RESETS: usize = 100;

/// Index into `H2_REFUSALS`.
#[derive(Copy, Clone)]
enum Refusal {
    BadPreface = 0,
    RapidReset = 1,
    Calm = 2,
    Hpack = 3,
    Protocol = 4,
    FlowControl = 5,
    FrameSize = 6,
    RefusedStream = 7,
    StreamError = 8,
    SettingsFlood = 9,
    PingFlood = 10,
}

/// What the streams of one connection share with it.
struct Streams {
    /// The connection-limit slot, once a stream's admission took it.
    slot: RefCell<Option<ConnGuard>>,
    checked: Cell<bool>,
    /// A stream was refused by the connection limit: no more are taken.
    limited: Cell<bool>,
}

// Not boxed: an event is only returned and matched, never held across an
// await, so its size costs nothing; a box would be an allocation per stream.
#[allow(clippy::large_enum_variant)]
enum Event {
    Stream(http::Request<RecvStream>, SendResponse<Bytes>),
    /// A stream ended; `true`: the client reset it before its answer.
    StreamDone(bool),
    Drain,
    Refuse(inbound::Verdict),
    Closed,
    Failed(::h2::Error),
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
        let shared = Rc::new(io::Shared::default());
        // One binding of the codec here, and none in `run` (it is lent):
        // each binding alive across an await is a copy of the `Connection`
        // (1.8 KiB) in this future for the connection's life.
        let Some(mut conn) = self.h2_handshake(st, &shared).await else {
            return;
        };
        let sni = self.client.log_facts().1.map(Rc::from);
        let mut parent = Parent {
            shard: self.shard.clone(),
            li,
            conn: self,
            sni,
        };
        parent.run(&mut conn, &shared).await;
        count_sent(&shard.counters.listeners[li], &shared.sent);
    }

    /// The codec over the connection, once the client's preface and
    /// SETTINGS came; `None` when they did not (a bad preface is answered
    /// GOAWAY `PROTOCOL_ERROR`).
    async fn h2_handshake(&self, st: State, shared: &Rc<io::Shared>) -> Option<H2Conn<'_>> {
        let shard = &self.shard;
        let c = &shard.counters.listeners[self.li];
        // The bytes read so far (the preface's first ones) go to the codec;
        // the exchange goes back to the pool as the state drops.
        let early = match st.into_held() {
            Some(x) => x.cl.bytes().to_vec(),
            None => Vec::new(),
        };
        let cfg = shard.rt.config.listeners[self.li].http2;
        self.client
            .set_read_timeout(Some(shard.rt.timeouts.client_idle));
        let mut b = ::h2::server::Builder::new();
        b.max_concurrent_streams(cfg.max_concurrent_streams)
            .initial_window_size(cfg.initial_window_bytes)
            .initial_connection_window_size(
                cfg.initial_window_bytes.saturating_mul(4).min(16 << 20),
            )
            .max_header_list_size(cfg.max_header_list_bytes)
            .max_send_buffer_size(64 * 1024)
            .max_local_error_reset_streams(Some(LOCAL_ERROR_RESETS));
        let client: &ClientConn = &self.client;
        // Boxed: the handshake's state (its own copy of the adapter) is
        // freed once it is done, not kept beside the connection's.
        let hs = Box::pin(b.handshake::<_, Bytes>(io::Io::new(client, early, shared.clone())));
        // No await while the result is held: it would be kept in this
        // future (and so in the caller's) beside the codec.
        let bad = match shard
            .driver
            .timeout(shard.rt.timeouts.client_header, hs)
            .await
        {
            Some(Ok(conn)) => return Some(conn),
            Some(Err(e)) => !e.is_io(),
            None => false,
        };
        if bad {
            c.h2_refused[Refusal::BadPreface as usize].inc();
            client.closing();
            let _ = client.write_all(&frames::GOAWAY_PROTOCOL_ERROR).await;
        }
        None
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

/// Adds the codes the scanner saw to the listener's counters.
fn count_sent(c: &crate::observe::metrics::ListenerCounters, s: &frames::SentCodes) {
    let r = &c.h2_refused;
    r[Refusal::RefusedStream as usize].add(s.refused.replace(0));
    r[Refusal::StreamError as usize].add(s.stream_errors.replace(0));
    if let Some(code) = s.goaway.take() {
        let why = match code {
            frames::ENHANCE_YOUR_CALM => Refusal::Calm,
            frames::COMPRESSION_ERROR => Refusal::Hpack,
            frames::FLOW_CONTROL_ERROR => Refusal::FlowControl,
            frames::FRAME_SIZE_ERROR => Refusal::FrameSize,
            frames::PROTOCOL_ERROR | frames::STREAM_CLOSED => Refusal::Protocol,
            _ => return,
        };
        r[why as usize].inc();
    }
}

/// Ends the connection for what the client sent; `true` for a flood, whose
/// GOAWAY is counted here (a malformed frame's is counted by its code).
fn refuse(
    c: &crate::observe::metrics::ListenerCounters,
    conn: &mut ::h2::server::Connection<io::Io<'_>, Bytes>,
    shared: &io::Shared,
    v: inbound::Verdict,
) -> bool {
    match v {
        inbound::Verdict::Flood(f) => {
            let why = match f {
                inbound::Flood::Ping => Refusal::PingFlood,
                inbound::Flood::Settings => Refusal::SettingsFlood,
            };
            c.h2_refused[why as usize].inc();
            conn.abrupt_shutdown(::h2::Reason::ENHANCE_YOUR_CALM);
            true
        }
        inbound::Verdict::Malformed(code) => {
            shared.refuse.set(None);
            conn.abrupt_shutdown(code.into());
            false
        }
    }
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

/// A stream's future, boxed: `FuturesUnordered` keeps a stub task holding
/// an `Option` of its future type inline, so an unboxed stream future (a
/// few KiB) would cost its size on every idle connection (measured: +2 KiB).
type StreamFut = Pin<Box<dyn Future<Output = bool>>>;

/// The connection's state between events.
struct Loop {
    streams: Rc<Streams>,
    set: FuturesUnordered<StreamFut>,
    drain: DrainFut,
    going_away: bool,
    /// Client resets in the current second: when it began, and how many.
    resets: (Instant, u32),
    /// Refused for a flood or rapid resets: the GOAWAY is counted so.
    rapid: bool,
}

type H2Conn<'a> = ::h2::server::Connection<io::Io<'a>, Bytes>;

/// The connection and whether it sent its graceful GOAWAY.
struct GoingAway<'l, 'c> {
    done: &'l mut bool,
    conn: &'l mut H2Conn<'c>,
}

impl GoingAway<'_, '_> {
    fn go(&mut self) {
        if !*self.done {
            *self.done = true;
            self.conn.graceful_shutdown();
        }
    }
}

impl Loop {
    /// The next thing to act on: a refusal the adapter found, a stream
    /// done, a drain, or what the codec accepted.
    async fn next(&mut self, conn: &mut H2Conn<'_>, shared: &io::Shared) -> Event {
        poll_fn(|cx| {
            if let (Some(v), false) = (shared.refuse.get(), self.rapid) {
                return Poll::Ready(Event::Refuse(v));
            }
            if let Poll::Ready(Some(reset)) = self.set.poll_next_unpin(cx) {
                return Poll::Ready(Event::StreamDone(reset));
            }
            if !self.going_away && self.drain.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Event::Drain);
            }
            match conn.poll_accept(cx) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(Some(Ok((req, resp)))) => Poll::Ready(Event::Stream(req, resp)),
                Poll::Ready(Some(Err(e))) => Poll::Ready(Event::Failed(e)),
                Poll::Ready(None) => Poll::Ready(Event::Closed),
            }
        })
        .await
    }

    /// Sends GOAWAY (NO_ERROR) once: no new streams, those in flight finish.
    fn go_away(&mut self, conn: &mut H2Conn<'_>) {
        GoingAway {
            done: &mut self.going_away,
            conn,
        }
        .go();
    }

    /// A stream ended; a client's reset counts towards rapid reset.
    fn stream_done(&mut self, conn: &mut H2Conn<'_>, shared: &io::Shared, reset: bool, p: &Parent) {
        shared.busy.set(shared.busy.get() - 1);
        if self.streams.limited.get() {
            self.go_away(conn);
        }
        if !reset || self.rapid {
            return;
        }
        let now = p.shard.driver.now();
        if now.saturating_duration_since(self.resets.0) >= Duration::from_secs(1) {
            self.resets = (now, 0);
        }
        self.resets.1 += 1;
        if self.resets.1 > RAPID_RESETS {
            self.rapid = true;
            self.going_away = true;
            p.counters().h2_refused[Refusal::RapidReset as usize].inc();
            // Counted here, not again from the frame sent.
            conn.abrupt_shutdown(::h2::Reason::ENHANCE_YOUR_CALM);
            shared.sent.goaway.set(None);
        }
    }
}

impl Parent<'_> {
    fn counters(&self) -> &crate::observe::metrics::ListenerCounters {
        &self.shard.counters.listeners[self.li]
    }

    async fn run(&mut self, conn: &mut H2Conn<'_>, shared: &Rc<io::Shared>) {
        let streams = Rc::new(Streams {
            slot: RefCell::new(None),
            checked: Cell::new(false),
            limited: Cell::new(false),
        });
        let mut lp = Loop {
            streams,
            set: FuturesUnordered::new(),
            drain: arm(self.shard.clone()),
            going_away: false,
            resets: (Instant::now(), 0u32),
            rapid: false,
        };
        loop {
            let ev = lp.next(conn, shared).await;
            count_sent(self.counters(), &shared.sent);
            match ev {
                Event::Stream(req, resp) => {
                    let mut away = GoingAway {
                        done: &mut lp.going_away,
                        conn,
                    };
                    if let Some(f) = self.accepted(&lp.streams, &mut away, shared, req, resp) {
                        lp.set.push(Box::pin(f));
                    }
                }
                Event::StreamDone(reset) => lp.stream_done(conn, shared, reset, self),
                Event::Refuse(v) => {
                    lp.going_away = true;
                    lp.rapid |= refuse(self.counters(), conn, shared, v);
                }
                Event::Drain => self.drained(&mut lp, conn),
                Event::Closed => break,
                Event::Failed(e) => {
                    crate::log_debug!("h2", "connection ended: {e}");
                    break;
                }
            }
            if lp.rapid {
                // Whatever the codec sends for it is this refusal.
                shared.sent.goaway.set(None);
            }
        }
        if lp.rapid {
            shared.sent.goaway.set(None);
        }
        // Streams still running lose their connection: their writes fail.
        drop(lp);
    }

    /// A stream the codec accepted: its future, or `None` when zgix refused
    /// it already (a field the adapter found malformed, RFC 9113 §8.1.1).
    fn accepted(
        &mut self,
        streams: &Rc<Streams>,
        away: &mut GoingAway<'_, '_>,
        shared: &Rc<io::Shared>,
        req: http::Request<RecvStream>,
        mut resp: SendResponse<Bytes>,
    ) -> Option<impl Future<Output = bool> + 'static> {
        self.counters().h2_streams.inc();
        if shared.take_malformed(u32::from(resp.stream_id())) {
            // Counted as a stream error from the RST_STREAM sent.
            resp.send_reset(::h2::Reason::PROTOCOL_ERROR);
            return None;
        }
        shared.busy.set(shared.busy.get() + 1);
        if self.shard.closing.get() || streams.limited.get() {
            away.go();
        }
        if !*away.done && self.follow() {
            away.go();
        }
        Some(self.stream(streams, shared, req, resp))
    }

    /// The shutdown semaphore closed: a drain sends GOAWAY; a reload moves
    /// new streams to the newest generation, or winds down when the
    /// listener is gone.
    fn drained(&mut self, lp: &mut Loop, conn: &mut H2Conn<'_>) {
        if self.shard.retired.get() && !self.shard.draining.get() {
            if self.follow() {
                lp.go_away(conn);
            } else {
                lp.drain = arm(self.shard.clone());
            }
        } else {
            lp.go_away(conn);
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

    /// One stream, from its request to the end of its answer; `true` when
    /// the client reset it first.
    fn stream(
        &self,
        streams: &Rc<Streams>,
        shared: &Rc<io::Shared>,
        req: http::Request<RecvStream>,
        respond: SendResponse<Bytes>,
    ) -> impl Future<Output = bool> + 'static {
        let parent = self.conn;
        let shard = self.shard.clone();
        let li = self.li;
        let (peer, ip, id) = (parent.peer, parent.ip, parent.id);
        let tls = parent.client.log_facts().0;
        let sni = self.sni.clone();
        let streams = streams.clone();
        let shared = shared.clone();
        async move {
            let (parts, body) = req.into_parts();
            let has_body = !body.is_end_stream();
            let mut respond = respond;
            let (head, text, chunked) = match stream_head(&shard, li, &parts, has_body) {
                Ok(h) => h,
                Err(_) => {
                    respond.send_reset(::h2::Reason::PROTOCOL_ERROR);
                    shard.counters.listeners[li].h2_refused[Refusal::StreamError as usize].inc();
                    return false;
                }
            };
            // An in-place head counts as read already, as when the loop
            // reads it (the access log's byte counts begin with it).
            let rx = match &head {
                StreamHead::InPlace(x) => x.cl.pending() as u64,
                StreamHead::Text => 0,
            };
            let io = StreamIo::new(
                shard.driver.clone(),
                (tls, sni),
                (shared, u32::from(respond.stream_id())),
                (text, has_body.then_some(body), chunked),
                &parts.method,
                respond,
            );
            io.rx.set(rx);
            io.write_timeout.set(Some(shard.rt.timeouts.client_idle));
            let wr = io.writer();
            let mut conn = Conn {
                shard,
                li,
                client: ClientConn::h2(Box::new(io)),
                peer,
                ip,
                id,
                conn_slot: None,
                conn_checked: streams.checked.get(),
                token: None,
            };
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
                false
            };
            let reset = poll_fn(|cx| wr.borrow_mut().poll_reset(cx).map(|()| true));
            futures_lite::future::or(serve, reset).await
        }
    }
}

/// A stream's request head, as the request loop takes it.
enum StreamHead {
    /// Written into the client buffer of the exchange it is handled in,
    /// with its pieces' spans: assembled, not parsed again.
    InPlace(Held),
    /// Rendered as text for the loop to read and parse, as from a socket:
    /// it did not fit the client buffer or the field slots, or no
    /// exchange could be taken here (the loop then answers 503).
    Text,
}

/// The stream's request head (see [`StreamHead`]), the bytes its client
/// starts with (the text head, or none), and whether its body goes
/// chunked; `Err` for a request HTTP/1.1 cannot carry.
fn stream_head(
    shard: &Rc<shard::Shard>,
    li: usize,
    parts: &http::request::Parts,
    has_body: bool,
) -> Result<(StreamHead, Vec<u8>, bool), render::Unfit> {
    if let Ok(mut x) = state::take(shard, li) {
        let slots = shard.rt.request_limits.header_slots();
        let ex: &mut Exchange = &mut x;
        if let Some(chunked) =
            render::render_in_place(parts, has_body, ex.cl.spare(), &mut ex.req, slots)?
        {
            let n = ex.req.head_len;
            ex.cl.filled(n);
            // Body bytes come in a pooled buffer, as after a text head.
            let body = if has_body {
                stream::take_request_buffer()
            } else {
                Vec::new()
            };
            return Ok((StreamHead::InPlace(x), body, chunked));
        }
    }
    let mut text = stream::take_request_buffer();
    let r = render::render_request(parts, has_body, &mut text)?;
    Ok((StreamHead::Text, text, r.chunked))
}

/// The request loop, once, over the stream's client. Returns whether the
/// connection limit refused the request.
async fn serve_stream(conn: &mut Conn, head: StreamHead) -> bool {
    let read = match head {
        StreamHead::InPlace(mut x) => {
            let shard = conn.shard.clone();
            let ex: &mut Exchange = &mut x;
            match shard.req_parser.assemble(ex.cl.bytes(), &mut ex.req) {
                Some(Ok(())) => head::HeadRead::Ready(x),
                Some(Err(e)) => head::HeadRead::Bad(e, x),
                // What the parser might answer otherwise: it reads the
                // same bytes, as from any client.
                None => conn.read_head(true, State::Busy(x)).await,
            }
        }
        StreamHead::Text => conn.read_head(true, State::Idle).await,
    };
    match read {
        head::HeadRead::Ready(x) => {
            let shard = conn.shard.clone();
            let (_, x) = shard.request_futures.run(|| conn.handle_request(x)).await;
            x.rec.decision == Decision::ConnLimited
        }
        head::HeadRead::Bad(e, x) => {
            Box::pin(conn.refuse_and_close(x, status_for(e), Decision::BadRequest(e))).await;
            false
        }
        head::HeadRead::TimedOut(x) => {
            Box::pin(conn.refuse_and_close(x, 408, Decision::ClientTimeout)).await;
            false
        }
        head::HeadRead::Closed => false,
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
    fn an_idle_connections_future_holds_the_codec_once() {
        let codec = std::mem::size_of::<H2Conn<'static>>();
        let serve = |c: &'static mut Conn, st: State| c.serve_h2(st);
        let serve = returned(&serve);
        // Once inline, plus the loop's state: it was 3.3 times the codec
        // (the codec kept three times, 5.8 KiB in a debug build).
        assert!(
            serve < codec + 512,
            "serve_h2: {serve} bytes, the codec {codec}"
        );
        // What the dispatch holds around it: no preface read's state.
        let dispatch = |c: &'static mut Conn, st: State| c.h2_or_http1(st);
        assert!(
            returned(&dispatch) <= 64,
            "h2_or_http1: {}",
            returned(&dispatch)
        );
    }
}
