//! One HTTP/2 stream as a client of the HTTP/1.1 request loop: its request goes in as the head `render.rs` made and its body (chunked when it has no Content-Length, RFC 9113 §8.3.1), and the HTTP/1.1 answer the loop writes is parsed back into HEADERS and DATA (hop-by-hop fields dropped, §8.2.2; a 1xx interim answer becomes an informational HEADERS, §8.1), sent as the stream's flow-control window allows.

use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::io;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

use ::h2::server::SendResponse;
use ::h2::{RecvStream, SendStream};
use bytes::Bytes;
use zgix_parser::{ChunkedDecoder, Method};

use super::answer::{self, Framing};

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

fn put_request_buffer(mut b: Vec<u8>) {
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
    rd: RefCell<Reader>,
    wr: Rc<RefCell<Writer>>,
}

struct Reader {
    pending: Vec<u8>,
    pos: usize,
    body: Option<RecvStream>,
    chunked: bool,
    ended: bool,
    /// The connection's marks and this stream's id: trailers the adapter
    /// found malformed end the stream with PROTOCOL_ERROR (RFC 9113 §8.1.1).
    marks: (Rc<super::io::Shared>, u32),
    malformed: bool,
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

pub(super) struct Writer {
    respond: Option<SendResponse<Bytes>>,
    send: Option<SendStream<Bytes>>,
    head: Vec<u8>,
    method: Method,
    out: Out,
}

/// DATA to send for one write of the loop: the first chunk inline (a
/// body with a length is one per write), more only for a chunked body.
#[derive(Default)]
struct Chunks {
    first: Option<Bytes>,
    rest: Vec<Bytes>,
}

impl Chunks {
    fn push(&mut self, b: Bytes) {
        match self.first {
            None => self.first = Some(b),
            Some(_) => self.rest.push(b),
        }
    }

    fn len(&self) -> usize {
        usize::from(self.first.is_some()) + self.rest.len()
    }

    fn all(self) -> impl Iterator<Item = Bytes> {
        self.first.into_iter().chain(self.rest)
    }
}

fn gone(e: ::h2::Error) -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionReset, e)
}

fn timed_out() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "stream timed out")
}

impl StreamIo {
    /// The stream's client: the bytes it starts with (the head as text,
    /// or none when the head was written in place), the body still to
    /// come and whether it goes chunked.
    pub(super) fn new(
        driver: Rc<Driver>,
        facts: (Option<TlsFacts>, Option<Rc<[u8]>>),
        marks: (Rc<super::io::Shared>, u32),
        (head, body, chunked): (Vec<u8>, Option<RecvStream>, bool),
        method: &http::Method,
        respond: SendResponse<Bytes>,
    ) -> StreamIo {
        StreamIo {
            driver,
            rx: Cell::new(0),
            tx: Cell::new(0),
            read_timeout: Cell::new(None),
            write_timeout: Cell::new(None),
            tls: facts.0,
            sni: facts.1,
            rd: RefCell::new(Reader {
                pending: head,
                pos: 0,
                body,
                chunked,
                ended: false,
                marks,
                malformed: false,
            }),
            wr: Rc::new(RefCell::new(Writer {
                respond: Some(respond),
                send: None,
                head: Vec::new(),
                method: Method::from_bytes(method.as_str().as_bytes()),
                out: Out::Head,
            })),
        }
    }

    pub(super) fn writer(&self) -> Rc<RefCell<Writer>> {
        self.wr.clone()
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
        let f = poll_fn(|cx| self.rd.borrow_mut().poll_fill(cx));
        let r = self.timed(self.read_timeout.get(), f).await;
        if self.rd.borrow().malformed {
            self.wr.borrow_mut().reset(::h2::Reason::PROTOCOL_ERROR);
        }
        r
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

    pub(in crate::conn) async fn write_all(&self, buf: &[u8]) -> io::Result<()> {
        let (chunks, eos) = self.wr.borrow_mut().feed(buf)?;
        let last = chunks.len();
        for (i, c) in chunks.all().enumerate() {
            self.send(c, eos && i + 1 == last).await?;
        }
        if eos && last == 0 {
            self.send(Bytes::new(), true).await?;
        }
        self.tx.set(self.tx.get() + buf.len() as u64);
        Ok(())
    }

    /// Sends `data` as the window allows, within the write timeout for
    /// each wait (a zero window holds the stream only that long).
    async fn send(&self, mut data: Bytes, eos: bool) -> io::Result<()> {
        loop {
            if data.is_empty() {
                if eos {
                    let mut w = self.wr.borrow_mut();
                    if let Some(s) = w.send.as_mut() {
                        s.send_data(Bytes::new(), true).map_err(gone)?;
                    }
                }
                return Ok(());
            }
            let want = data.len();
            // Room already there (the usual case) needs no wait, so no timer.
            let now = self.wr.borrow_mut().room_now(want)?;
            let room = match now {
                Some(n) => n,
                None => {
                    let f = poll_fn(|cx| self.wr.borrow_mut().poll_room(cx, want));
                    self.timed(self.write_timeout.get(), f).await?
                }
            };
            let part = data.split_to(room.min(data.len()));
            let end = eos && data.is_empty();
            let mut w = self.wr.borrow_mut();
            let s = w.send.as_mut().ok_or_else(closed)?;
            s.send_data(part, end).map_err(gone)?;
            if end {
                return Ok(());
            }
        }
    }

    /// The loop is done with the stream: a close-delimited answer ends, an
    /// unfinished one is reset; nothing more is read.
    pub(in crate::conn) fn finish(&self) {
        {
            let mut r = self.rd.borrow_mut();
            r.ended = true;
            r.body = None;
            put_request_buffer(std::mem::take(&mut r.pending));
            r.pos = 0;
        }
        let mut w = self.wr.borrow_mut();
        match w.out {
            Out::Done => {}
            Out::Close => {
                w.out = Out::Done;
                if let Some(s) = w.send.as_mut() {
                    let _ = s.send_data(Bytes::new(), true);
                }
            }
            _ => w.reset(::h2::Reason::INTERNAL_ERROR),
        }
    }
}

fn closed() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionReset, "stream closed")
}

impl Reader {
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            if self.pos < self.pending.len() || self.ended {
                return Poll::Ready(Ok(()));
            }
            let Some(body) = self.body.as_mut() else {
                self.ended = true;
                return Poll::Ready(Ok(()));
            };
            match body.poll_data(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(d))) => {
                    // Our window reopens as the loop takes the bytes: at most
                    // one DATA frame waits here beside the codec's window.
                    let _ = body.flow_control().release_capacity(d.len());
                    self.pending.clear();
                    self.pos = 0;
                    if d.is_empty() {
                        continue;
                    }
                    if self.chunked {
                        self.pending
                            .extend_from_slice(format!("{:x}\r\n", d.len()).as_bytes());
                        self.pending.extend_from_slice(&d);
                        self.pending.extend_from_slice(b"\r\n");
                    } else {
                        self.pending.extend_from_slice(&d);
                    }
                }
                Poll::Ready(None) => {
                    if self.marks.0.take_malformed(self.marks.1) {
                        self.malformed = true;
                        self.body = None;
                        return Poll::Ready(Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            "a pseudo-header in trailers",
                        )));
                    }
                    // Trailers, if any, are dropped.
                    self.pending.clear();
                    self.pos = 0;
                    if self.chunked {
                        self.pending.extend_from_slice(b"0\r\n\r\n");
                    }
                    self.body = None;
                    self.ended = true;
                }
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(gone(e))),
            }
        }
    }
}

impl Writer {
    /// Ends the stream with a stream error; nothing more is sent on it.
    fn reset(&mut self, why: ::h2::Reason) {
        if matches!(self.out, Out::Done) {
            return;
        }
        self.out = Out::Done;
        if let Some(s) = self.send.as_mut() {
            s.send_reset(why);
        } else if let Some(r) = self.respond.as_mut() {
            r.send_reset(why);
        }
    }

    /// Whether the client reset the stream before its answer was done.
    pub(super) fn poll_reset(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if matches!(self.out, Out::Done) {
            return Poll::Pending;
        }
        let r = match (self.send.as_mut(), self.respond.as_mut()) {
            (Some(s), _) => s.poll_reset(cx),
            (None, Some(r)) => r.poll_reset(cx),
            (None, None) => return Poll::Pending,
        };
        r.map(|_| ())
    }

    /// Asks the window for `want` bytes; how many may be sent now, if any.
    fn room_now(&mut self, want: usize) -> io::Result<Option<usize>> {
        let s = self.send.as_mut().ok_or_else(closed)?;
        s.reserve_capacity(want);
        Ok(Some(s.capacity()).filter(|&n| n > 0))
    }

    fn poll_room(&mut self, cx: &mut Context<'_>, want: usize) -> Poll<io::Result<usize>> {
        let s = self.send.as_mut().ok_or_else(closed)?;
        s.reserve_capacity(want);
        loop {
            if s.capacity() > 0 {
                return Poll::Ready(Ok(s.capacity()));
            }
            match s.poll_capacity(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(n))) if n > 0 => return Poll::Ready(Ok(n)),
                Poll::Ready(Some(Ok(_))) => {}
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(gone(e))),
                Poll::Ready(None) => return Poll::Ready(Err(closed())),
            }
        }
    }

    /// Takes response bytes the loop wrote: the head once whole, then body
    /// bytes (de-chunked). Returns the DATA to send and whether it ends.
    fn feed(&mut self, buf: &[u8]) -> io::Result<(Chunks, bool)> {
        let mut chunks = Chunks::default();
        // The body bytes that came with the head, once it is whole: DATA
        // is cut from them, not copied.
        let mut whole: Option<Bytes> = None;
        let mut body: &[u8] = buf;
        if let Out::Head = self.out {
            let Some(rest) = self.answer(buf)? else {
                return Ok((chunks, false));
            };
            if matches!(self.out, Out::Done) {
                return Ok((chunks, false));
            }
            whole = Some(rest);
            if let Some(rest) = &whole {
                body = rest;
            }
        }
        let cut = |part: &[u8]| match &whole {
            Some(b) => b.slice_ref(part),
            None => Bytes::copy_from_slice(part),
        };
        let mut eos = false;
        match &mut self.out {
            Out::Head | Out::Done => {}
            Out::Close => {
                if !body.is_empty() {
                    chunks.push(cut(body));
                }
            }
            Out::Length(left) => {
                let n = (*left).min(body.len() as u64) as usize;
                if n > 0 {
                    chunks.push(cut(&body[..n]));
                }
                *left -= n as u64;
                if *left == 0 {
                    eos = true;
                }
            }
            Out::Chunked(d) => {
                let mut i = 0;
                while i < body.len() {
                    let p = d
                        .feed(&body[i..])
                        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "bad chunk"))?;
                    if !p.data.is_empty() {
                        chunks.push(cut(&body[i + p.data.start..i + p.data.end]));
                    }
                    i += p.consumed;
                    if p.done {
                        eos = true;
                        break;
                    }
                    if p.consumed == 0 {
                        break;
                    }
                }
            }
        }
        if eos {
            self.out = Out::Done;
        }
        Ok((chunks, eos))
    }

    /// Takes bytes of the answer's head: once it is whole, relays any
    /// interim answers and sends the final one's HEADERS. Returns the body
    /// bytes that came with the head.
    fn answer(&mut self, buf: &[u8]) -> io::Result<Option<Bytes>> {
        let bad = |_| io::Error::new(io::ErrorKind::InvalidData, "bad answer");
        if self.head.is_empty() {
            // Usually the whole head in one write: one exact copy.
            self.head = buf.to_vec();
        } else {
            self.head.extend_from_slice(buf);
        }
        loop {
            let Some(len) = answer::head_end(&self.head).map_err(bad)? else {
                return Ok(None);
            };
            let (head, rest) = split_head(std::mem::take(&mut self.head), len);
            let a = answer::read(&head, len, self.method).map_err(bad)?;
            if a.status < 200 {
                // An interim answer is an informational HEADERS (RFC 9113
                // §8.1); 101 has no place on HTTP/2 (§8.6) and is dropped.
                if a.status != 101 {
                    let respond = self.respond.as_mut().ok_or_else(closed)?;
                    respond.send_informational(a.response).map_err(gone)?;
                }
                self.head = rest.to_vec();
                if self.head.is_empty() {
                    return Ok(None);
                }
                continue;
            }
            self.out = match a.framing {
                Framing::None | Framing::Length(0) => Out::Done,
                Framing::Length(n) => Out::Length(n),
                Framing::Chunked => Out::Chunked(ChunkedDecoder::new(u64::MAX)),
                Framing::Close => Out::Close,
            };
            let eos = matches!(self.out, Out::Done);
            let respond = self.respond.as_mut().ok_or_else(closed)?;
            self.send = Some(respond.send_response(a.response, eos).map_err(gone)?);
            return Ok(Some(rest));
        }
    }
}

/// Body bytes that may share the head's buffer: the codec's HPACK table
/// keeps the field values it indexes (a `Date`, an id) for as long as the
/// connection lives, and with them the buffer they are slices of.
const BODY_WITH_HEAD: usize = 256;

/// The head (`v[..len]`) as the buffer the field values are slices of, and
/// the body bytes after it: in the same buffer when they are few, else
/// apart, so that an indexed field keeps no more than its head alive
/// (measured: 60 answers of 8 KiB, each with a new field value, left 246
/// KiB per idle connection when the values were slices of head and body).
fn split_head(mut v: Vec<u8>, len: usize) -> (Bytes, Bytes) {
    if v.len() - len <= BODY_WITH_HEAD {
        let all = Bytes::from(v);
        let rest = all.slice(len..);
        return (all, rest);
    }
    let head = Bytes::copy_from_slice(&v[..len]);
    v.drain(..len);
    (head, Bytes::from(v))
}
