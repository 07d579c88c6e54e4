//! The request state as types: an idle connection holds none; a request holds a [`Held`] exchange taken from its shard's pool, which goes back to that pool when the guard drops, on whatever path the request ends; the client bytes are a [`ClientBytes`] window that only its own methods move.
//!
//! Like hyper's `proto/h1/conn.rs` `State`, the phases of a connection are
//! values, not flags: [`State::Idle`] between requests (nothing held),
//! [`State::Busy`] while bytes of a request are buffered or it is handled.
//! The functions of a request take the [`Exchange`] they work on as an
//! argument, so none can find it missing, and none can keep it past the
//! request: the [`Held`] guard that owns it lives in the connection's loop,
//! and a connection task dropped mid-request drops it, which returns it.

use std::cell::Cell;
use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};
use std::rc::{Rc, Weak};

use zgix_parser::{ChunkedDecoder, RequestHead, ResponseHead};

use super::shard::Shard;
use super::HeadScan;
use crate::http::filters::Walk;
use crate::io::Buf;

/// A connection's request state between two heads.
pub(super) enum State {
    /// Nothing buffered: no exchange held (what an idle connection costs).
    Idle,
    /// Bytes of a next request (pipelined, or after a PROXY header) are
    /// buffered in this exchange.
    Busy(Held),
}

impl State {
    /// The exchange a busy state holds.
    pub(super) fn into_held(self) -> Option<Held> {
        match self {
            State::Idle => None,
            State::Busy(x) => Some(x),
        }
    }
}

/// The client's bytes of the current request: `buf[start..end]` is what
/// arrived and is not handled yet (a head being read, body bytes, a
/// pipelined request). `start` and `end` are private: only these methods
/// move them, each keeping `start <= end <= buf.len()`.
///
/// The buffer is shared (`Rc`) with the gathered sends that send its bytes
/// without a copy (a re-encoded chunked body, `io/gather.rs`): on the ring
/// such a send holds it until its completion, even after its future went
/// away. So it is written only through [`ClientBytes::own`], which goes on
/// in a copy of the unhandled bytes while a send still holds it: the kernel
/// never reads bytes written after the send began.
pub struct ClientBytes {
    buf: Rc<Buf>,
    start: usize,
    end: usize,
}

impl ClientBytes {
    fn new(buf: Buf) -> ClientBytes {
        ClientBytes {
            buf: Rc::new(buf),
            start: 0,
            end: 0,
        }
    }

    /// The buffer, for a gathered send of [`ClientBytes::bytes`] (its
    /// ranges start at [`ClientBytes::mark`]).
    pub(super) fn shared(&self) -> &Rc<Buf> {
        &self.buf
    }

    /// The buffer to write: this one, or, while a gathered send the kernel
    /// may still read holds it (its future was dropped mid-send), a new one
    /// with the bytes copied over. A mapping refused then leaves
    /// an empty buffer: no bytes, no room (reads see EOF, the connection
    /// ends; the pool does not keep it).
    fn own(&mut self) -> &mut Buf {
        if Rc::get_mut(&mut self.buf).is_none() {
            let fresh = match Buf::try_new(self.buf.len()) {
                Ok(mut b) => {
                    // From 0, not `start`: a rewind may take back consumed bytes.
                    b[..self.end].copy_from_slice(&self.buf[..self.end]);
                    b
                }
                Err(_) => {
                    (self.start, self.end) = (0, 0);
                    Buf::empty()
                }
            };
            self.buf = Rc::new(fresh);
        }
        Rc::get_mut(&mut self.buf).expect("a buffer no send holds")
    }

    /// What arrived and is not handled yet.
    pub(super) fn bytes(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    /// How many bytes [`ClientBytes::bytes`] holds.
    pub(super) fn pending(&self) -> usize {
        self.end - self.start
    }

    /// Where the unhandled bytes begin in the buffer (a mark for
    /// [`ClientBytes::rewind`]).
    pub(super) fn mark(&self) -> usize {
        self.start
    }

    /// The first `n` unhandled bytes are handled.
    pub(super) fn consume(&mut self, n: usize) {
        self.start = (self.start + n).min(self.end);
    }

    /// Takes back what was consumed since `mark` (the bytes are still
    /// there: a request sent again to another upstream).
    pub(super) fn rewind(&mut self, mark: usize) {
        self.start = mark.min(self.end);
    }

    /// Moves the unhandled bytes to the buffer's start, making room after them.
    pub(super) fn compact(&mut self) {
        if self.start > 0 {
            self.own();
            let (start, end) = (self.start, self.end);
            self.own().copy_within(start..end, 0);
            self.end -= self.start;
            self.start = 0;
        }
    }

    /// Forgets every byte.
    pub(super) fn clear(&mut self) {
        self.start = 0;
        self.end = 0;
    }

    /// The buffer's size.
    pub(super) fn capacity(&self) -> usize {
        self.buf.len()
    }

    /// No room is left after the unhandled bytes.
    pub(super) fn is_full(&self) -> bool {
        self.end == self.buf.len()
    }

    /// The room after the unhandled bytes, to read into; then [`ClientBytes::filled`].
    pub(super) fn spare(&mut self) -> &mut [u8] {
        // `own` first: a refused copy resets `end` (to an empty buffer).
        self.own();
        let end = self.end;
        &mut self.own()[end..]
    }

    /// `n` bytes were read into [`ClientBytes::spare`].
    pub(super) fn filled(&mut self, n: usize) {
        self.end = (self.end + n).min(self.buf.len());
    }

    /// The whole buffer as scratch space, its bytes forgotten (a tunnel
    /// after moving what was pending, a lingering close).
    pub(super) fn scratch(&mut self) -> &mut [u8] {
        self.clear();
        &mut self.own()[..]
    }

    /// Moves the unhandled bytes to the start and forgets them; returns
    /// how many there were (they are `scratch()[..n]`: a tunnel's first bytes).
    pub(super) fn drain_to_front(&mut self) -> usize {
        self.compact();
        let n = self.end;
        self.clear();
        n
    }
}

/// The state one request needs, pooled per shard (see the module docs of `conn`).
pub struct Exchange {
    /// Client bytes: the head being read, then body chunks.
    pub(super) cl: ClientBytes,
    /// How far `cl.bytes()` was scanned for the end of the head.
    pub(super) scan: HeadScan,
    /// Upstream bytes: the response head, then body chunks.
    pub(super) ubuf: Buf,
    pub(super) ustart: usize,
    pub(super) uend: usize,
    /// Heads as rewritten for the other side.
    pub(super) out: Vec<u8>,
    pub(super) req: RequestHead,
    pub(super) resp: ResponseHead,
    pub(super) req_chunked: ChunkedDecoder,
    pub(super) resp_chunked: ChunkedDecoder,
    /// A chunked request body re-encoded for the origin: its gather list
    /// (`rechunk_up.rs`, about 3.5 KiB, made on the first chunked upload),
    /// and its copy for a TLS upstream (sized on first use).
    pub(super) body_pieces: Option<zgix_parser::Pieces>,
    pub(super) body_out: Vec<u8>,
    /// The access-log record of the current request, and what it needs of
    /// the head once the buffer holds body bytes: the method, the query,
    /// the client's byte counters when the head began.
    pub(super) rec: crate::observe::access_log::Record,
    pub(super) rec_method: Vec<u8>,
    pub(super) rec_query: Vec<u8>,
    pub(super) rec_has_query: bool,
    /// The request headers `access_log.fields` asks for.
    pub(super) rec_headers: crate::observe::access_log::Captured,
    pub(super) rec_rx0: u64,
    pub(super) rec_tx0: u64,
    pub(super) walk: Walk,
    /// The listener `walk` is sized for.
    walk_li: usize,
    /// This request's RateLimit-Policy and RateLimit fields (`"headers":
    /// "draft-11"`), spliced into every head zgix writes for it; empty for none.
    pub(super) rate_fields: Vec<u8>,
    /// The shard state whose pool it goes back to (weak: a pooled exchange
    /// must not keep its own pool alive).
    home: Weak<Shard>,
}

impl Exchange {
    /// A new request state, or the error of a buffer that could not be made
    /// (the connection is then refused with 503, the shard goes on).
    fn new(shard: &Rc<Shard>, li: usize) -> std::io::Result<Box<Exchange>> {
        let rt = &shard.rt;
        Ok(Box::new(Exchange {
            cl: ClientBytes::new(Buf::try_new(rt.client_buffer_bytes())?),
            scan: HeadScan::default(),
            ubuf: Buf::try_new(rt.upstream_buffer_bytes())?,
            ustart: 0,
            uend: 0,
            out: Vec::with_capacity(rt.out_buffer_bytes()),
            req: RequestHead::new(&rt.request_limits),
            resp: ResponseHead::new(rt.response_max_headers()),
            req_chunked: ChunkedDecoder::new(u64::MAX),
            resp_chunked: ChunkedDecoder::new(u64::MAX),
            body_pieces: None,
            body_out: Vec::new(),
            rec: crate::observe::access_log::Record::new(
                li,
                std::net::Ipv4Addr::UNSPECIFIED.into(),
                ([0, 0, 0, 0], 0).into(),
            ),
            rec_method: Vec::with_capacity(16),
            rec_query: Vec::new(),
            rec_has_query: false,
            rec_headers: Default::default(),
            rec_rx0: 0,
            rec_tx0: 0,
            walk: rt.listeners[li]
                .filters
                .new_walk(rt.config.limits.max_request_line),
            walk_li: li,
            rate_fields: Vec::with_capacity(crate::http::ratelimit::FIELDS_CAPACITY),
            home: Rc::downgrade(shard),
        }))
    }

    /// Unhandled client bytes (a pipelined request) are left.
    pub(super) fn has_pending(&self) -> bool {
        self.cl.pending() > 0
    }
}

/// A request state taken from a shard's pool; dropping it gives it back
/// (or frees it), so no path of a request can keep or lose one.
pub(super) struct Held(ManuallyDrop<Box<Exchange>>);

impl Deref for Held {
    type Target = Exchange;
    fn deref(&self) -> &Exchange {
        &self.0
    }
}

impl DerefMut for Held {
    fn deref_mut(&mut self) -> &mut Exchange {
        &mut self.0
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        // SAFETY: the box is taken once, here, and `self.0` is not used after.
        let x = unsafe { ManuallyDrop::take(&mut self.0) };
        if let Some(shard) = x.home.upgrade() {
            put_back(&shard, x);
        }
    }
}

/// Takes a request state from the shard's pool (or makes one; that fails
/// when its buffers cannot be mapped).
pub(super) fn take(shard: &Rc<Shard>, li: usize) -> std::io::Result<Held> {
    let out = shard.exchanges_out.get() + 1;
    shard.exchanges_out.set(out);
    if out > shard.exchanges_peak.get() {
        shard.exchanges_peak.set(out);
    }
    let pooled = shard.exchanges.borrow_mut().pop();
    let x = match pooled {
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
        None => Exchange::new(shard, li).inspect_err(|_| {
            shard.exchanges_out.set(shard.exchanges_out.get() - 1);
        })?,
    };
    Ok(Held(ManuallyDrop::new(x)))
}

/// Gives a request state back to the pool, or frees it when the pool is
/// full or its generation was replaced (a retired one keeps no cache).
fn put_back(shard: &Shard, mut x: Box<Exchange>) {
    shard.exchanges_out.set(shard.exchanges_out.get() - 1);
    let mut pool = shard.exchanges.borrow_mut();
    // An exchange whose client buffer is empty (refused in `ClientBytes::own`)
    // is not kept.
    let whole = x.cl.capacity() == shard.rt.client_buffer_bytes();
    if pool.len() < shard.rt.config.io.idle_exchanges && !shard.retired.get() && whole {
        x.cl.clear();
        x.scan = HeadScan::default();
        x.ustart = 0;
        x.uend = 0;
        x.out.clear();
        x.rate_fields.clear();
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
    static FREED: Cell<u64> = const { Cell::new(0) };
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
    shard.stream_futures.trim();
    shard.stream_ios.trim();
    shard.driver.trim();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_a_send_still_holds_are_never_written_the_client_goes_on_in_a_copy() {
        let mut cl = ClientBytes::new(Buf::new(64));
        cl.spare()[..11].copy_from_slice(b"hello world");
        cl.filled(11);
        cl.consume(6);
        // A gathered send the kernel may still read holds the buffer.
        let held = cl.shared().clone();
        let before = held.as_ptr();
        cl.compact();
        cl.spare()[..3].copy_from_slice(b"!!!");
        cl.filled(3);
        assert_eq!(cl.bytes(), b"world!!!");
        assert_eq!(&held[..11], b"hello world", "the held bytes were written");
        assert_ne!(cl.shared().as_ptr(), before);
        // Let go, the buffer is written in place again (no copy per read).
        drop(held);
        let now = cl.shared().as_ptr();
        cl.spare()[0] = b'?';
        assert_eq!(cl.shared().as_ptr(), now);
        assert_eq!(cl.capacity(), 64);
    }
}
