//! One HTTP/2 stream as a client of the HTTP/1.1 request loop: its request goes in as the head `render.rs` made and its body (chunked when it has no Content-Length, RFC 9113 §8.3.1), and its answer goes out as HEADERS and DATA, sent as the stream's flow-control window allows: a proxied final answer handed over as the response parser read it (`direct.rs`), an answer zgix makes itself (and a relayed 1xx, which becomes an informational HEADERS, §8.1) parsed back from the HTTP/1.1 text the loop writes (`answer.rs`; hop-by-hop fields dropped either way, §8.2.2).

use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::io;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

use zgix_h2::server::{ErrorCode, StreamId};
use zgix_parser::{ChunkedDecoder, Method};

use super::answer::{self, Framing};
use super::shared::{Body, Core, PIECE};

use crate::io::Driver;
use crate::observe::access_log::TlsFacts;

/// Request buffers a shard keeps for its streams between uses: as many as
/// four connections' streams in flight at the default 128 each (fewer, and
/// `h2load -c 4 -m 100` allocated one for every other stream).
const BUFS_POOLED: usize = 512;

/// The largest buffer kept (a head's; one a request body grew is freed), so
/// the pool holds at most 512 KiB.
const BUF_KEPT: usize = 1024;

thread_local! {
    /// Request buffers (the rendered head, then body bytes), emptied.
    static BUFS: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

/// A buffer for a stream's request, from the shard's pool.
pub(super) fn take_request_buffer() -> Vec<u8> {
    BUFS.with(|p| p.borrow_mut().pop())
        .unwrap_or_else(|| Vec::with_capacity(256))
}

pub(super) fn put_request_buffer(mut b: Vec<u8>) {
    if b.capacity() == 0 || b.capacity() > BUF_KEPT {
        return;
    }
    b.clear();
    let _ = BUFS.try_with(|p| {
        let mut p = p.borrow_mut();
        if p.len() < BUFS_POOLED {
            p.push(b);
        }
    });
}

/// The in-memory client of one stream (see the module docs).
pub struct StreamIo {
    pub(in crate::conn) driver: Rc<Driver>,
    pub(in crate::conn) rx: Cell<u64>,
    pub(in crate::conn) tx: Cell<u64>,
    pub(in crate::conn) read_timeout: Cell<Option<Duration>>,
    pub(in crate::conn) write_timeout: Cell<Option<Duration>>,
    tls: Option<TlsFacts>,
    sni: Option<Rc<[u8]>>,
    core: Rc<Core>,
    id: StreamId,
    rd: RefCell<Reader>,
    wr: RefCell<Writer>,
}

struct Reader {
    pending: Vec<u8>,
    pos: usize,
    /// Body bytes are still to come from the codec.
    body: bool,
    chunked: bool,
    ended: bool,
}

enum Out {
    /// The response head is still coming.
    Head,
    Length(u64),
    Chunked(ChunkedDecoder),
    /// Until the loop shuts the stream down.
    Close,
    Done,
}

struct Writer {
    head: Vec<u8>,
    method: Method,
    out: Out,
}

fn gone() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionReset, "stream closed")
}

fn timed_out() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "stream timed out")
}

fn bad_answer() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, "bad answer")
}

impl StreamIo {
    /// The stream's client: the bytes it starts with (the head as text,
    /// or none when the head was written in place), whether a body is to
    /// come and whether it goes chunked.
    pub(super) fn new(
        driver: Rc<Driver>,
        facts: (Option<TlsFacts>, Option<Rc<[u8]>>),
        (core, id): (Rc<Core>, StreamId),
        (head, body, chunked): (Vec<u8>, bool, bool),
        method: Method,
    ) -> StreamIo {
        StreamIo {
            driver,
            rx: Cell::new(0),
            tx: Cell::new(0),
            read_timeout: Cell::new(None),
            write_timeout: Cell::new(None),
            tls: facts.0,
            sni: facts.1,
            core,
            id,
            rd: RefCell::new(Reader {
                pending: head,
                pos: 0,
                body,
                chunked,
                ended: false,
            }),
            wr: RefCell::new(Writer {
                head: Vec::new(),
                method,
                out: Out::Head,
            }),
        }
    }

    pub(in crate::conn) fn log_facts(&self) -> (Option<TlsFacts>, Option<&[u8]>) {
        (self.tls, self.sni.as_deref())
    }

    async fn timed<T>(
        &self,
        d: Option<Duration>,
        f: impl std::future::Future<Output = io::Result<T>>,
    ) -> io::Result<T> {
        match d {
            Some(d) => self
                .driver
                .timeout(d, f)
                .await
                .unwrap_or_else(|| Err(timed_out())),
            None => f.await,
        }
    }

    /// Waits for request bytes (or the end), within the read timeout.
    async fn fill(&self) -> io::Result<()> {
        let f = poll_fn(|cx| self.rd.borrow_mut().poll_fill(cx, &self.core, self.id));
        self.timed(self.read_timeout.get(), f).await
    }

    pub(in crate::conn) async fn readable(&self) -> io::Result<()> {
        self.fill().await
    }

    pub(in crate::conn) async fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            if let Some(n) = self.try_read(buf) {
                return Ok(n);
            }
            self.fill().await?;
        }
    }

    /// A read that needs no wait: request bytes already here (0 at the
    /// end), or `None`. The head is always here when the loop starts, so
    /// its read makes no future and arms no timer.
    pub(in crate::conn) fn try_read(&self, buf: &mut [u8]) -> Option<usize> {
        let mut r = self.rd.borrow_mut();
        if r.pos < r.pending.len() {
            let n = (r.pending.len() - r.pos).min(buf.len());
            buf[..n].copy_from_slice(&r.pending[r.pos..r.pos + n]);
            r.pos += n;
            self.rx.set(self.rx.get() + n as u64);
            return Some(n);
        }
        r.ended.then_some(0)
    }

    /// Whether a read would complete at once.
    pub(in crate::conn) fn ready(&self) -> bool {
        let r = self.rd.borrow();
        r.pos < r.pending.len() || r.ended
    }

    /// Takes response bytes the loop wrote: the head once whole (interim
    /// answers relayed as they come), then body bytes (de-chunked) as DATA.
    pub(in crate::conn) async fn write_all(&self, buf: &[u8]) -> io::Result<()> {
        let mut body = buf;
        if matches!(self.wr.borrow().out, Out::Head) {
            match self.answer(buf)? {
                Some(at) => body = &buf[at..],
                None => return Ok(()),
            }
        }
        let mut i = 0;
        loop {
            // One piece of the body at a time; no borrow across a send.
            let (part, eos) = {
                let mut w = self.wr.borrow_mut();
                match &mut w.out {
                    Out::Head | Out::Done => break,
                    Out::Close => ((i, body.len()), false),
                    Out::Length(left) => {
                        let n = (*left).min((body.len() - i) as u64) as usize;
                        *left -= n as u64;
                        ((i, i + n), *left == 0)
                    }
                    Out::Chunked(d) => {
                        let p = d.feed(&body[i..]).map_err(|_| bad_answer())?;
                        let part = (i + p.data.start, i + p.data.end);
                        if p.consumed == 0 && !p.done {
                            break;
                        }
                        i += p.consumed;
                        (part, p.done)
                    }
                }
            };
            let framed = matches!(self.wr.borrow().out, Out::Chunked(_));
            if eos {
                self.wr.borrow_mut().out = Out::Done;
                self.core.answered(self.id);
            }
            self.send(&body[part.0..part.1], eos).await?;
            if !framed {
                i = part.1;
            }
            if eos || i >= body.len() {
                break;
            }
        }
        Ok(())
    }

    /// Takes bytes of the answer's head: once it is whole, relays any
    /// interim answers and sends the final one's HEADERS. Returns where in
    /// `buf` the body bytes begin, once the head was sent.
    fn answer(&self, buf: &[u8]) -> io::Result<Option<usize>> {
        let mut w = self.wr.borrow_mut();
        let w = &mut *w;
        if w.head.capacity() == 0 {
            w.head = take_request_buffer();
        }
        // Where `buf` begins in the head buffer.
        let mut start = w.head.len();
        w.head.extend_from_slice(buf);
        loop {
            let Some(len) = answer::head_end(&w.head).map_err(|_| bad_answer())? else {
                return Ok(None);
            };
            let a = answer::read(&mut w.head[..len], w.method).map_err(|_| bad_answer())?;
            if a.status < 200 {
                // An interim answer is an informational HEADERS (RFC 9113
                // §8.1); 101 has no place on HTTP/2 (§8.6) and is dropped.
                if a.status != 101 {
                    let fields = a.fields(&w.head[..len]);
                    let n = self
                        .core
                        .server
                        .borrow_mut()
                        .send_response(self.id, a.status, fields, false)
                        .map_err(|_| gone())?;
                    self.tx.set(self.tx.get() + n as u64);
                }
                w.head.drain(..len);
                start = start.saturating_sub(len);
                if w.head.is_empty() {
                    return Ok(None);
                }
                continue;
            }
            self.final_head(&mut w.out, a.status, a.fields(&w.head[..len]), a.framing)?;
            put_request_buffer(std::mem::take(&mut w.head));
            // The head's end is in `buf`: it was not whole before.
            return Ok(Some((len - start).min(buf.len())));
        }
    }

    /// The final answer as the response parser read it (`direct.rs`): its
    /// HEADERS now, its body through [`StreamIo::write_all`] after, framed
    /// as `framing` says (de-chunked when chunked).
    pub(super) fn answer_parsed<'f>(
        &self,
        status: u16,
        fields: impl Iterator<Item = (&'f [u8], &'f [u8])>,
        framing: Framing,
    ) -> io::Result<()> {
        let mut w = self.wr.borrow_mut();
        if !matches!(w.out, Out::Head) || !w.head.is_empty() {
            return Err(bad_answer());
        }
        self.final_head(&mut w.out, status, fields, framing)?;
        put_request_buffer(std::mem::take(&mut w.head));
        Ok(())
    }

    /// Sends the final answer's HEADERS (counted in `tx` as the frames'
    /// bytes) and sets how the body after it is framed.
    fn final_head<'f>(
        &self,
        out: &mut Out,
        status: u16,
        fields: impl Iterator<Item = (&'f [u8], &'f [u8])>,
        framing: Framing,
    ) -> io::Result<()> {
        *out = match framing {
            Framing::None | Framing::Length(0) => Out::Done,
            Framing::Length(n) => Out::Length(n),
            Framing::Chunked => Out::Chunked(ChunkedDecoder::new(u64::MAX)),
            Framing::Close => Out::Close,
        };
        let eos = matches!(out, Out::Done);
        let n = self
            .core
            .server
            .borrow_mut()
            .send_response(self.id, status, fields, eos)
            .map_err(|_| gone())?;
        self.tx.set(self.tx.get() + n as u64);
        if eos {
            self.core.answered(self.id);
        }
        Ok(())
    }

    /// Sends `data` as DATA as the windows allow, within the write timeout
    /// for each wait (a zero window holds the stream only that long), and
    /// no faster than the connection writes (the backlog bound).
    async fn send(&self, mut data: &[u8], eos: bool) -> io::Result<()> {
        if data.is_empty() && !eos {
            return Ok(());
        }
        loop {
            if !self.core.room() {
                let f = poll_fn(|cx| self.core.poll_room(cx).map(Ok));
                self.timed(self.write_timeout.get(), f).await?;
            }
            let piece = &data[..data.len().min(PIECE)];
            let last = piece.len() == data.len();
            let n = self
                .core
                .server
                .borrow_mut()
                .send_data(self.id, piece, eos && last)
                .map_err(|_| gone())?;
            self.tx.set(self.tx.get() + n as u64);
            data = &data[n..];
            if n == piece.len() {
                if last {
                    return Ok(());
                }
                continue;
            }
            // Room already there (the usual case) needs no wait, so no timer.
            let f = poll_fn(|cx| {
                self.core
                    .poll_window(self.id, cx)
                    .map(|ok| if ok { Ok(()) } else { Err(gone()) })
            });
            self.timed(self.write_timeout.get(), f).await?;
        }
    }

    /// The loop is done with the stream: a close-delimited answer ends, an
    /// unfinished one is reset; nothing more is read, and a request still
    /// coming is stopped without error (RFC 9113 §8.1).
    pub(in crate::conn) fn finish(&self) {
        {
            let mut r = self.rd.borrow_mut();
            r.ended = true;
            r.body = false;
            put_request_buffer(std::mem::take(&mut r.pending));
            r.pos = 0;
        }
        let mut w = self.wr.borrow_mut();
        let Ok(mut server) = self.core.server.try_borrow_mut() else {
            return;
        };
        if self.core.over.get() {
            return;
        }
        match w.out {
            Out::Done => {
                if !self.core.request_ended(self.id) {
                    server.reset(self.id, ErrorCode::NO_ERROR);
                }
            }
            Out::Close => {
                w.out = Out::Done;
                let _ = server.send_data(self.id, &[], true);
                if !self.core.request_ended(self.id) {
                    server.reset(self.id, ErrorCode::NO_ERROR);
                }
            }
            _ => {
                w.out = Out::Done;
                server.reset(self.id, ErrorCode::INTERNAL_ERROR);
            }
        }
        drop(server);
        self.core.answered(self.id);
    }
}

impl Drop for StreamIo {
    fn drop(&mut self) {
        // Dropped unfinished (its client reset it, or the connection
        // ended): nothing more goes out on it.
        if !self.core.over.get() {
            if let Ok(mut s) = self.core.server.try_borrow_mut() {
                s.reset(self.id, ErrorCode::CANCEL);
            }
        }
        put_request_buffer(std::mem::take(&mut self.wr.get_mut().head));
        self.core.close(self.id);
    }
}

impl Reader {
    fn poll_fill(
        &mut self,
        cx: &mut Context<'_>,
        core: &Core,
        id: StreamId,
    ) -> Poll<io::Result<()>> {
        if self.pos < self.pending.len() || self.ended {
            return Poll::Ready(Ok(()));
        }
        if !self.body {
            self.ended = true;
            return Poll::Ready(Ok(()));
        }
        // `pending` is all read: it is emptied before new bytes come in.
        let r = core.poll_body(id, cx, &mut self.pending);
        if r.is_ready() {
            self.pos = 0;
        }
        match r {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Body::Data) => {
                if self.chunked {
                    // RFC 9112 §7.1: the size line, the data, CRLF.
                    let mut size = [0u8; 18];
                    let n = hex(self.pending.len(), &mut size);
                    let len = self.pending.len();
                    self.pending.resize(len + n, 0);
                    self.pending.copy_within(0..len, n);
                    self.pending[..n].copy_from_slice(&size[..n]);
                    self.pending.extend_from_slice(b"\r\n");
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Body::End) => {
                // Trailers, if any, are dropped.
                self.pending.clear();
                if self.chunked {
                    self.pending.extend_from_slice(b"0\r\n\r\n");
                }
                self.body = false;
                self.ended = true;
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Body::Gone) => {
                self.pending.clear();
                Poll::Ready(Err(gone()))
            }
        }
    }
}

/// `n` in hex and CRLF into `out`: the bytes written.
fn hex(mut n: usize, out: &mut [u8; 18]) -> usize {
    let mut digits = [0u8; 16];
    let mut k = 0;
    loop {
        digits[k] = b"0123456789abcdef"[n & 0xf];
        k += 1;
        n >>= 4;
        if n == 0 {
            break;
        }
    }
    for i in 0..k {
        out[i] = digits[k - 1 - i];
    }
    out[k] = b'\r';
    out[k + 1] = b'\n';
    k + 2
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_chunk_size_line_is_hex_and_crlf() {
        let mut b = [0u8; 18];
        for (n, want) in [
            (0, "0\r\n"),
            (10, "a\r\n"),
            (65535, "ffff\r\n"),
            (4096, "1000\r\n"),
        ] {
            let k = super::hex(n, &mut b);
            assert_eq!(&b[..k], want.as_bytes());
        }
    }
}
