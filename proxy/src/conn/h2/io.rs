//! The h2 codec's transport: tokio's `AsyncRead`/`AsyncWrite` over a client connection (plain or TLS), with one read and one write in flight at a time, each a boxed future over the connection; outgoing frames are scanned for the RST_STREAM and GOAWAY codes zgix sends (RFC 9113 §6.4, §6.8), which the refusal counters count.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::inbound::{Inbound, Verdict};
use crate::conn::client::ClientConn;
use crate::conn::is_timeout;

/// Bytes read from the connection per read.
const READ_BYTES: usize = 16 * 1024;
/// Frames buffered before a write must finish first.
const WRITE_BUFFER: usize = 64 * 1024;

/// Buffers a shard keeps for its HTTP/2 connections' reads and writes
/// between uses: an idle connection holds none.
const POOLED: usize = 64;

thread_local! {
    static BUFFERS: std::cell::RefCell<Vec<Vec<u8>>> = const { std::cell::RefCell::new(Vec::new()) };
}

thread_local! {
    /// Read buffers, kept at their full length (no zeroing per read).
    static READS: std::cell::RefCell<Vec<Vec<u8>>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn take_read() -> Vec<u8> {
    READS
        .with(|p| p.borrow_mut().pop())
        .unwrap_or_else(|| vec![0; READ_BYTES])
}

fn put_read(b: Vec<u8>) {
    if b.len() == READ_BYTES {
        READS.with(|p| {
            let mut p = p.borrow_mut();
            if p.len() < POOLED {
                p.push(b);
            }
        });
    }
}

fn take_buffer() -> Vec<u8> {
    BUFFERS.with(|p| p.borrow_mut().pop()).unwrap_or_default()
}

fn put_buffer(mut b: Vec<u8>) {
    if b.capacity() == 0 || b.capacity() > 4 * WRITE_BUFFER {
        return;
    }
    b.clear();
    BUFFERS.with(|p| {
        let mut p = p.borrow_mut();
        if p.len() < POOLED {
            p.push(b);
        }
    });
}

type ReadFut<'a> = Pin<Box<dyn Future<Output = (Vec<u8>, io::Result<usize>)> + 'a>>;
type WriteFut<'a> = Pin<Box<dyn Future<Output = (Vec<u8>, io::Result<()>)> + 'a>>;

/// What the codec's connection shares with the adapter.
#[derive(Default)]
pub(super) struct Shared {
    /// Streams being served: while there are some, a read timeout on the
    /// connection is not its end (the client may just be waiting).
    pub busy: Cell<usize>,
    /// Error codes of RST_STREAM and GOAWAY frames sent, for the counters.
    pub sent: crate::conn::h2::frames::SentCodes,
    /// The client flooded PING or SETTINGS frames, or sent a frame zgix
    /// refuses itself: nothing more is read.
    pub refuse: Cell<Option<Verdict>>,
    /// Set with `refuse`, and kept once the connection took the verdict.
    pub stopped: Cell<bool>,
    /// Streams the adapter found malformed (a forbidden field name, a
    /// pseudo-header in trailers), for their stream error; the latest
    /// [`MARKED_KEPT`].
    malformed: RefCell<Vec<u32>>,
}

/// Streams marked malformed that are remembered: one the codec refused
/// itself is never taken, so the oldest go.
const MARKED_KEPT: usize = 64;

impl Shared {
    fn mark(&self, ids: &mut Vec<u32>) {
        let mut m = self.malformed.borrow_mut();
        for id in ids.drain(..) {
            if m.len() == MARKED_KEPT {
                m.remove(0);
            }
            m.push(id);
        }
    }

    /// Whether stream `id` was marked malformed; the mark goes.
    pub fn take_malformed(&self, id: u32) -> bool {
        let mut m = self.malformed.borrow_mut();
        match m.iter().position(|&x| x == id) {
            Some(at) => {
                m.remove(at);
                true
            }
            None => false,
        }
    }
}

pub(super) struct Io<'a> {
    conn: &'a ClientConn,
    shared: Rc<Shared>,
    /// Bytes read before the codec started (the preface, on prior knowledge).
    early: Vec<u8>,
    early_pos: usize,
    rbuf: Vec<u8>,
    rlen: usize,
    rpos: usize,
    reading: Option<ReadFut<'a>>,
    wbuf: Vec<u8>,
    writing: Option<WriteFut<'a>>,
    scan: crate::conn::h2::frames::Scanner,
    inbound: Inbound,
}

impl<'a> Io<'a> {
    pub fn new(conn: &'a ClientConn, early: Vec<u8>, shared: Rc<Shared>) -> Io<'a> {
        Io {
            conn,
            shared,
            early,
            early_pos: 0,
            rbuf: Vec::new(),
            rlen: 0,
            rpos: 0,
            reading: None,
            wbuf: Vec::new(),
            writing: None,
            scan: Default::default(),
            inbound: Default::default(),
        }
    }

    /// Polls the write in flight; its buffer comes back for reuse.
    fn poll_writing(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let Some(f) = self.writing.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        match f.as_mut().poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready((v, r)) => {
                self.writing = None;
                put_buffer(v);
                if self.wbuf.is_empty() {
                    // Nothing more to send: an idle connection keeps no buffer.
                    put_buffer(std::mem::take(&mut self.wbuf));
                }
                Poll::Ready(r)
            }
        }
    }

    fn start_write(&mut self) {
        let v = std::mem::take(&mut self.wbuf);
        let c = self.conn;
        self.writing = Some(Box::pin(async move {
            let r = c.write_all(&v).await;
            (v, r)
        }));
    }
}

impl AsyncRead for Io<'_> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = &mut *self;
        if me.shared.stopped.get() {
            // The connection answers GOAWAY and ends; the rest is not read.
            return Poll::Pending;
        }
        let before = out.filled().len();
        let r = me.read_some(cx, out);
        let got = &mut out.filled_mut()[before..];
        if !got.is_empty() {
            let verdict = me.inbound.feed(got, me.conn.now());
            if !me.inbound.marked.is_empty() {
                me.shared.mark(&mut me.inbound.marked);
            }
            if let Some((v, keep)) = verdict {
                me.shared.refuse.set(Some(v));
                me.shared.stopped.set(true);
                cx.waker().wake_by_ref();
                // The codec never sees a frame zgix refused.
                out.set_filled(before + keep);
                if keep == 0 {
                    return Poll::Pending;
                }
            }
        }
        r
    }
}

impl Io<'_> {
    fn read_some(&mut self, cx: &mut Context<'_>, out: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let me = self;
        if me.early_pos < me.early.len() {
            let n = (me.early.len() - me.early_pos).min(out.remaining());
            out.put_slice(&me.early[me.early_pos..me.early_pos + n]);
            me.early_pos += n;
            if me.early_pos == me.early.len() {
                me.early = Vec::new();
            }
            return Poll::Ready(Ok(()));
        }
        loop {
            if me.rpos < me.rlen {
                let n = (me.rlen - me.rpos).min(out.remaining());
                out.put_slice(&me.rbuf[me.rpos..me.rpos + n]);
                me.rpos += n;
                if me.rpos == me.rlen {
                    put_read(std::mem::take(&mut me.rbuf));
                    (me.rpos, me.rlen) = (0, 0);
                }
                return Poll::Ready(Ok(()));
            }
            let fut = me.reading.get_or_insert_with(|| {
                let c = me.conn;
                Box::pin(async move {
                    // No buffer is held while the connection idles, nor the
                    // read's state (0.5 KiB, boxed once there are bytes).
                    if let Err(e) = c.readable().await {
                        return (Vec::new(), Err(e));
                    }
                    let mut b = take_read();
                    let r = Box::pin(c.read(&mut b)).await;
                    (b, r)
                })
            });
            let (b, r) = match fut.as_mut().poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(v) => v,
            };
            me.reading = None;
            match r {
                Ok(0) => {
                    put_read(b);
                    return Poll::Ready(Ok(()));
                }
                Ok(n) => {
                    me.rbuf = b;
                    (me.rpos, me.rlen) = (0, n);
                }
                // Streams are in flight: an idle client is waiting for them.
                Err(e) if is_timeout(&e) && me.shared.busy.get() > 0 => put_read(b),
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl AsyncWrite for Io<'_> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let me = &mut *self;
        if me.wbuf.len() >= WRITE_BUFFER {
            match me.poll_writing(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) => {}
            }
            me.start_write();
            if let Poll::Ready(Err(e)) = me.poll_writing(cx) {
                return Poll::Ready(Err(e));
            }
        }
        me.scan.feed(buf, &me.shared.sent);
        if me.wbuf.capacity() == 0 {
            me.wbuf = take_buffer();
        }
        me.wbuf.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let me = &mut *self;
        loop {
            match me.poll_writing(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) => {}
            }
            if me.wbuf.is_empty() {
                return Poll::Ready(Ok(()));
            }
            me.start_write();
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // The connection closes (TLS close_notify, FIN) once the codec is done.
        self.poll_flush(cx)
    }
}
