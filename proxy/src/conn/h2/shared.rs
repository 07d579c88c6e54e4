//! What one HTTP/2 connection's streams share with it: the codec (`zgix_h2::server::Server`, RFC 9113) and a slot per stream being served — the request body bytes received and not yet read (bounded by the stream's window, §6.9: they are released only as the request loop reads them), whether the request ended or the stream was reset (§5.1), and the wakers of the stream's waits (body bytes, send window, reset, the write backlog).

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::task::{Context, Poll, Waker};

use zgix_h2::server::{Server, StreamId};

/// Frames queued in the codec beyond which streams stop sending (and the
/// connection stops reading) until they are written: the codec bounds
/// only its own answers, not responses.
pub(super) const BACKLOG: usize = 64 * 1024;

/// The largest DATA piece handed to the codec at once, so that the
/// backlog is checked between pieces.
pub(super) const PIECE: usize = 16 * 1024;

/// One stream being served.
struct Slot {
    id: StreamId,
    /// Request body bytes received, not yet read by the request loop.
    data: Vec<u8>,
    /// The request ended (END_STREAM or trailers).
    ended: bool,
    /// The client reset the stream, or the codec did for its error.
    reset: bool,
    /// The answer is complete: a reset after it ends nothing.
    answered: bool,
    reader: Option<Waker>,
    writer: Option<Waker>,
    on_reset: Option<Waker>,
}

/// What a stream's read of its body found.
pub(super) enum Body {
    /// Bytes (moved into the caller's buffer), released to the codec.
    Data,
    /// The request ended.
    End,
    /// The stream is gone (reset, or the connection is over).
    Gone,
}

fn set(w: &mut Option<Waker>, cx: &Context<'_>) {
    match w {
        Some(old) if old.will_wake(cx.waker()) => {}
        _ => *w = Some(cx.waker().clone()),
    }
}

fn wake(w: &mut Option<Waker>) {
    if let Some(w) = w.take() {
        w.wake();
    }
}

/// Emptied slot lists a shard keeps for its connections' next streams.
const SPARE_LISTS: usize = 16;

/// The longest emptied slot list kept.
const SPARE_KEPT: usize = 256;

thread_local! {
    /// Emptied slot lists, kept with their room: a connection holds one
    /// only while a stream is open (an idle connection holds none), and its
    /// next burst of streams does not grow one from nothing.
    static SPARE: RefCell<Vec<VecDeque<Slot>>> = const { RefCell::new(Vec::new()) };
}

/// Where stream `id`'s slot is (or would go) in the sorted list.
#[inline]
fn find(s: &VecDeque<Slot>, id: StreamId) -> Result<usize, usize> {
    // The newest stream and the oldest are the likeliest.
    match (s.front(), s.back()) {
        (_, Some(l)) if l.id == id => Ok(s.len() - 1),
        (_, Some(l)) if l.id < id => Err(s.len()),
        (Some(f), _) if f.id == id => Ok(0),
        _ => s.binary_search_by_key(&id, |x| x.id),
    }
}

/// The codec and the streams' slots (see the module docs).
pub(super) struct Core {
    pub server: RefCell<Server>,
    /// Sorted by stream id (client ids only grow, RFC 9113 §5.1.1); a
    /// deque, since streams mostly end in the order they began.
    slots: RefCell<VecDeque<Slot>>,
    /// Streams waiting for the backlog to be written.
    drained: RefCell<Vec<Waker>>,
    /// The connection is over: every wait ends.
    pub over: Cell<bool>,
}

impl Core {
    pub fn new(server: Server) -> Core {
        Core {
            server: RefCell::new(server),
            slots: RefCell::new(VecDeque::new()),
            drained: RefCell::new(Vec::new()),
            over: Cell::new(false),
        }
    }

    fn with<R>(&self, id: StreamId, f: impl FnOnce(&mut Slot) -> R) -> Option<R> {
        let mut s = self.slots.borrow_mut();
        let at = find(&s, id).ok()?;
        s.get_mut(at).map(f)
    }

    /// A new stream's slot; `ended`: the request has no body.
    pub fn open(&self, id: StreamId, ended: bool) {
        let mut s = self.slots.borrow_mut();
        if s.capacity() == 0 {
            if let Some(spare) = SPARE.with(|p| p.borrow_mut().pop()) {
                *s = spare;
            }
        }
        debug_assert!(s.back().is_none_or(|l| l.id < id));
        s.push_back(Slot {
            id,
            data: Vec::new(),
            ended,
            reset: false,
            answered: false,
            reader: None,
            writer: None,
            on_reset: None,
        });
    }

    /// The stream is done with; an idle connection keeps no slots.
    pub fn close(&self, id: StreamId) {
        let mut s = self.slots.borrow_mut();
        if let Some(slot) = find(&s, id).ok().and_then(|at| s.remove(at)) {
            super::stream::put_request_buffer(slot.data);
        }
        if s.is_empty() && s.capacity() > 0 {
            let list = std::mem::take(&mut *s);
            if list.capacity() <= SPARE_KEPT {
                let _ = SPARE.try_with(|p| {
                    let mut p = p.borrow_mut();
                    if p.len() < SPARE_LISTS {
                        p.push(list);
                    }
                });
            }
        }
    }

    /// Body bytes for stream `id`; `false`: no stream takes them (the
    /// caller releases them to the codec at once).
    pub fn data(&self, id: StreamId, data: &[u8], end: bool) -> bool {
        self.with(id, |s| {
            if s.data.capacity() == 0 {
                s.data = super::stream::take_request_buffer();
            }
            s.data.extend_from_slice(data);
            s.ended |= end;
            wake(&mut s.reader);
        })
        .is_some()
    }

    /// The request ended (trailers, which are dropped).
    pub fn ended(&self, id: StreamId) {
        self.with(id, |s| {
            s.ended = true;
            wake(&mut s.reader);
        });
    }

    /// The stream was reset (by the client, or by the codec for its error).
    pub fn is_reset(&self, id: StreamId) -> bool {
        self.with(id, |s| s.reset).unwrap_or(true)
    }

    pub fn reset(&self, id: StreamId) {
        self.with(id, |s| {
            s.reset = true;
            wake(&mut s.reader);
            wake(&mut s.writer);
            wake(&mut s.on_reset);
        });
    }

    /// A send window opened: the stream's, or every stream's (`None`).
    pub fn window_open(&self, id: Option<StreamId>) {
        match id {
            Some(id) => {
                self.with(id, |s| wake(&mut s.writer));
            }
            None => {
                for s in self.slots.borrow_mut().iter_mut() {
                    wake(&mut s.writer);
                }
            }
        }
    }

    /// The connection is over: every stream's waits end.
    pub fn end(&self) {
        self.over.set(true);
        for s in self.slots.borrow_mut().iter_mut() {
            s.reset = true;
            wake(&mut s.reader);
            wake(&mut s.writer);
            wake(&mut s.on_reset);
        }
        self.written();
    }

    /// The answer is complete.
    pub fn answered(&self, id: StreamId) {
        self.with(id, |s| s.answered = true);
    }

    /// Whether the whole request came.
    pub fn request_ended(&self, id: StreamId) -> bool {
        self.with(id, |s| s.ended).unwrap_or(true)
    }

    /// Moves the stream's body bytes into `into` (emptied first, its
    /// capacity traded), releasing them to the codec so the client may
    /// send more (RFC 9113 §6.9); or waits for them.
    pub fn poll_body(&self, id: StreamId, cx: &Context<'_>, into: &mut Vec<u8>) -> Poll<Body> {
        let r = self.with(id, |s| {
            if !s.data.is_empty() {
                into.clear();
                std::mem::swap(into, &mut s.data);
                return Poll::Ready(Body::Data);
            }
            if s.ended {
                return Poll::Ready(Body::End);
            }
            if s.reset {
                return Poll::Ready(Body::Gone);
            }
            set(&mut s.reader, cx);
            Poll::Pending
        });
        let r = r.unwrap_or(Poll::Ready(Body::Gone));
        if let Poll::Ready(Body::Data) = r {
            if !self.over.get() {
                self.server.borrow_mut().release(id, into.len());
            }
        }
        r
    }

    /// Ready once the stream may send DATA (`true`), or is gone (`false`).
    pub fn poll_window(&self, id: StreamId, cx: &Context<'_>) -> Poll<bool> {
        if self.over.get() {
            return Poll::Ready(false);
        }
        if self.server.borrow().send_window(id) > 0 {
            return Poll::Ready(true);
        }
        self.with(id, |s| {
            if s.reset {
                return Poll::Ready(false);
            }
            set(&mut s.writer, cx);
            Poll::Pending
        })
        .unwrap_or(Poll::Ready(false))
    }

    /// Ready when the client reset the stream before its answer was done.
    pub fn poll_reset(&self, id: StreamId, cx: &Context<'_>) -> Poll<()> {
        self.with(id, |s| {
            if s.answered {
                return Poll::Pending;
            }
            if s.reset {
                return Poll::Ready(());
            }
            set(&mut s.on_reset, cx);
            Poll::Pending
        })
        .unwrap_or(Poll::Pending)
    }

    /// Whether more may be queued now (the backlog is under [`BACKLOG`]).
    pub fn room(&self) -> bool {
        self.over.get() || self.server.borrow().pending().len() < BACKLOG
    }

    /// Ready once the backlog is under [`BACKLOG`].
    pub fn poll_room(&self, cx: &Context<'_>) -> Poll<()> {
        if self.room() {
            return Poll::Ready(());
        }
        let mut d = self.drained.borrow_mut();
        if !d.iter().any(|w| w.will_wake(cx.waker())) {
            d.push(cx.waker().clone());
        }
        Poll::Pending
    }

    /// The backlog was taken for writing: the streams waiting on it go on.
    pub fn written(&self) {
        let d = std::mem::take(&mut *self.drained.borrow_mut());
        for w in d {
            w.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(id: u32) -> Slot {
        Slot {
            id,
            data: Vec::new(),
            ended: false,
            reset: false,
            answered: false,
            reader: None,
            writer: None,
            on_reset: None,
        }
    }

    #[test]
    fn slots_are_found_by_id_whichever_order_streams_end_in() {
        let mut s: VecDeque<Slot> = (0..100).map(|k| slot(2 * k + 1)).collect();
        for k in 0..100 {
            assert_eq!(find(&s, 2 * k + 1), Ok(k as usize));
        }
        // Ends out of order: the middle, the oldest, the newest.
        for id in [101, 1, 199, 57, 143] {
            let at = find(&s, id).unwrap();
            assert_eq!(s.remove(at).map(|x| x.id), Some(id));
            assert!(find(&s, id).is_err(), "{id} is gone");
        }
        for (at, x) in s.iter().enumerate() {
            assert_eq!(find(&s, x.id), Ok(at));
        }
        // A new stream's id is above every open one: its place is the end.
        assert_eq!(find(&s, 201), Err(s.len()));
        assert!(find(&VecDeque::new(), 1).is_err());
    }
}
