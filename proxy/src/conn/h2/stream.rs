//! One HTTP/2 stream as a client of the HTTP/1.1 request loop: its request is rendered as an HTTP/1.1 head and body (`:authority` becomes Host, a body without Content-Length is chunked, RFC 9113 §8.3.1) — the head into the exchange's buffer with its pieces' spans, taken parsed ([`render_in_place`]), or as text the loop parses — and the HTTP/1.1 answer the loop writes is parsed back into HEADERS and DATA (hop-by-hop fields dropped, §8.2.2; a 1xx interim answer becomes an informational HEADERS, §8.1), sent as the stream's flow-control window allows.

use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::io;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

use ::h2::server::SendResponse;
use ::h2::{RecvStream, SendStream};
use bytes::Bytes;
use zgix_parser::{ChunkedDecoder, Header, HeaderKind, Method, RequestHead, Span};

use super::answer::{self, Framing, HOP_BY_HOP};

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

/// A request the stream cannot carry as HTTP/1.1.
#[derive(Debug)]
pub(super) struct Unfit;

/// Where a rendered head goes: a growing buffer (the text the request
/// loop reads back and parses), or the exchange's client buffer, where the
/// loop takes it as already parsed ([`InPlace`]).
pub(super) trait HeadOut {
    fn put(&mut self, b: &[u8]);
    /// Bytes written so far (where the next one goes).
    fn at(&self) -> usize;
    /// Records a field line's spans.
    fn field(&mut self, _name: Span, _value: Span) {}
}

impl HeadOut for Vec<u8> {
    fn put(&mut self, b: &[u8]) {
        self.extend_from_slice(b);
    }
    fn at(&self) -> usize {
        self.len()
    }
}

/// A head written straight into the exchange's client buffer, with the
/// spans of its pieces in the exchange's `RequestHead`, for
/// [`zgix_parser::RequestParser::assemble`]. `over`: it did not fit (the
/// buffer, or the head's field slots), and goes as text instead.
pub(super) struct InPlace<'a> {
    buf: &'a mut [u8],
    n: usize,
    fields: &'a mut Vec<Header>,
    slots: usize,
    pub(super) over: bool,
}

impl<'a> InPlace<'a> {
    /// `slots`: field lines kept at most (the parser's, so that the
    /// vector, sized for them, never grows).
    pub(super) fn new(buf: &'a mut [u8], fields: &'a mut Vec<Header>, slots: usize) -> Self {
        fields.clear();
        InPlace {
            buf,
            n: 0,
            fields,
            slots,
            over: false,
        }
    }

    /// The head's length.
    pub(super) fn len(&self) -> usize {
        self.n
    }
}

impl HeadOut for InPlace<'_> {
    fn put(&mut self, b: &[u8]) {
        match self.buf.get_mut(self.n..self.n + b.len()) {
            Some(dst) if !self.over => {
                dst.copy_from_slice(b);
                self.n += b.len();
            }
            _ => self.over = true,
        }
    }
    fn at(&self) -> usize {
        self.n
    }
    fn field(&mut self, name: Span, value: Span) {
        if self.fields.len() == self.slots {
            self.over = true;
            return;
        }
        self.fields.push(Header {
            name,
            value,
            kind: HeaderKind::Other,
        });
    }
}

/// What rendering a head found out: whether its body goes chunked, and
/// where its method and target are.
pub(super) struct Rendered {
    pub(super) chunked: bool,
    pub(super) method: Span,
    pub(super) target: Span,
}

fn span(from: usize, to: usize) -> Span {
    Span {
        start: from as u32,
        len: (to - from) as u32,
    }
}

/// Writes one field line, recording its spans.
fn field_line<O: HeadOut>(out: &mut O, name: &[u8], value: &[u8]) {
    let n0 = out.at();
    out.put(name);
    let n1 = out.at();
    out.put(b": ");
    let v0 = out.at();
    out.put(value);
    let v1 = out.at();
    out.put(b"\r\n");
    out.field(span(n0, n1), span(v0, v1));
}

/// Renders the request head as HTTP/1.1 into `out` (RFC 9113 §8.3.1:
/// `:authority` becomes Host; §8.2.2: a connection-specific field is
/// refused; §8.2.3: cookie fields are joined).
pub(super) fn render_request<O: HeadOut>(
    parts: &http::request::Parts,
    has_body: bool,
    out: &mut O,
) -> Result<Rendered, Unfit> {
    let path = match parts.uri.path_and_query() {
        Some(p) => p.as_str(),
        None if parts.method == http::Method::OPTIONS => "*",
        None => return Err(Unfit),
    };
    let m = parts.method.as_str().as_bytes();
    out.put(m);
    out.put(b" ");
    let t0 = out.at();
    out.put(path.as_bytes());
    let t1 = out.at();
    out.put(b" HTTP/1.1\r\n");
    let authority = parts.uri.authority();
    if let Some(a) = authority {
        field_line(out, b"host", a.as_str().as_bytes());
    }
    let mut length = false;
    let mut cookies = 0;
    for (name, value) in parts.headers.iter() {
        let n = name.as_str();
        if HOP_BY_HOP.contains(&n) && !(n == "te" && value.as_bytes() == b"trailers") {
            return Err(Unfit);
        }
        if n == "host" && authority.is_some() {
            // :authority wins (RFC 9113 §8.3.1); a differing Host is dropped.
            continue;
        }
        if n == "cookie" {
            // Split cookie fields are one line in HTTP/1.1 (RFC 9113 §8.2.3).
            cookies += 1;
            continue;
        }
        if n == "content-length" {
            length = true;
        }
        if n == "te" {
            continue;
        }
        field_line(out, n.as_bytes(), value.as_bytes());
    }
    if cookies > 0 {
        let n0 = out.at();
        out.put(b"cookie");
        let n1 = out.at();
        out.put(b": ");
        let v0 = out.at();
        for (i, v) in parts.headers.get_all("cookie").iter().enumerate() {
            if i > 0 {
                out.put(b"; ");
            }
            out.put(v.as_bytes());
        }
        let v1 = out.at();
        out.put(b"\r\n");
        out.field(span(n0, n1), span(v0, v1));
    }
    let chunked = has_body && !length;
    if chunked {
        field_line(out, b"transfer-encoding", b"chunked");
    }
    out.put(b"\r\n");
    Ok(Rendered {
        chunked,
        method: span(0, m.len()),
        target: span(t0, t1),
    })
}

/// Renders the head straight into `buf` (the exchange's client buffer)
/// with its pieces' spans in `head`, for
/// [`zgix_parser::RequestParser::assemble`]: whether the body goes
/// chunked, or `None` when it did not fit the buffer or `slots` field
/// lines (then it goes as text).
pub(super) fn render_in_place(
    parts: &http::request::Parts,
    has_body: bool,
    buf: &mut [u8],
    head: &mut RequestHead,
    slots: usize,
) -> Result<Option<bool>, Unfit> {
    let mut out = InPlace::new(buf, &mut head.headers, slots);
    let r = render_request(parts, has_body, &mut out)?;
    if out.over {
        return Ok(None);
    }
    head.head_len = out.len();
    head.method_span = r.method;
    head.target = r.target;
    Ok(Some(r.chunked))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(b: http::request::Builder) -> http::request::Parts {
        b.body(()).unwrap().into_parts().0
    }

    #[test]
    fn a_request_becomes_an_http11_head_with_host_one_cookie_and_chunked_framing() {
        let p = parts(
            http::Request::builder()
                .method("POST")
                .uri("https://site.example:8443/a?b=c")
                .header("host", "other.example")
                .header("cookie", "a=1")
                .header("cookie", "b=2")
                .header("te", "trailers")
                .header("x-k", "v"),
        );
        let mut out = Vec::new();
        assert!(
            render_request(&p, true, &mut out).unwrap().chunked,
            "no length: chunked"
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "POST /a?b=c HTTP/1.1\r\nhost: site.example:8443\r\nx-k: v\r\n\
             cookie: a=1; b=2\r\ntransfer-encoding: chunked\r\n\r\n"
        );
        let p = parts(
            http::Request::builder()
                .uri("http://h/")
                .header("content-length", "3"),
        );
        let mut out = Vec::new();
        assert!(
            !render_request(&p, true, &mut out).unwrap().chunked,
            "a length stays"
        );
        let p = parts(
            http::Request::builder()
                .uri("/")
                .header("connection", "close"),
        );
        assert!(render_request(&p, false, &mut Vec::<u8>::new()).is_err());
        let p = parts(http::Request::builder().uri("/").header("te", "gzip"));
        assert!(render_request(&p, false, &mut Vec::<u8>::new()).is_err());
    }

    fn limits() -> zgix_parser::Limits {
        zgix_parser::Limits {
            max_request_line: 8192,
            max_header_bytes: 16384,
            max_headers: 16,
            max_body: 1 << 20,
        }
    }

    /// What the request loop makes of a stream's head: assembled from
    /// the in-place rendering (`None`: it went as text, or the assembler
    /// left it to the parser), and parsed from the text rendering.
    #[allow(clippy::type_complexity)]
    fn both(
        p: &http::request::Parts,
        has_body: bool,
        room: usize,
    ) -> (
        Option<Result<RequestHead, zgix_parser::ParseError>>,
        Result<RequestHead, zgix_parser::ParseError>,
    ) {
        let parser = zgix_parser::RequestParser::new(limits());
        let mut text = Vec::new();
        let chunked = render_request(p, has_body, &mut text).unwrap().chunked;
        let mut parsed = RequestHead::new(&limits());
        let want = match parser.parse(&text, &mut parsed) {
            Ok(zgix_parser::Status::Complete(())) => Ok(parsed),
            Ok(zgix_parser::Status::Partial) => panic!("a whole head is partial"),
            Err(e) => Err(e),
        };
        let mut buf = vec![0u8; room];
        let mut head = RequestHead::new(&limits());
        let slots = limits().header_slots();
        let got = match render_in_place(p, has_body, &mut buf, &mut head, slots).unwrap() {
            None => None,
            Some(c) => {
                assert_eq!(c, chunked, "the same framing");
                assert_eq!(&buf[..head.head_len], &text[..], "the same bytes");
                parser
                    .assemble(&buf, &mut head)
                    .map(|r| r.map(|()| head.clone()))
            }
        };
        (got, want)
    }

    /// A stream's head goes to the request loop parsed already (not as
    /// text to parse again), and as what the parser makes of its text:
    /// the same spans, kinds, framing, Host, canonical path, or the same
    /// refusal.
    #[test]
    fn a_streams_head_is_assembled_in_place_as_the_parser_reads_its_text() {
        let get = |uri: &str| http::Request::builder().uri(uri);
        let cases = [
            (
                get("http://a.example/x/../y?q=1").header("user-agent", "h2load"),
                false,
            ),
            (
                http::Request::builder()
                    .method("POST")
                    .uri("https://a.example:8443/up")
                    .header("cookie", "a=1")
                    .header("cookie", "b=2")
                    .header("te", "trailers")
                    .header("x-forwarded-for", "10.0.0.1"),
                true,
            ),
            (
                http::Request::builder()
                    .method("PUT")
                    .uri("http://a.example/up")
                    .header("content-length", "5"),
                true,
            ),
            (
                http::Request::builder()
                    .method("POST")
                    .uri("http://a.example/up")
                    .header("content-length", "5000000"),
                true,
            ),
            (
                get("http://a.example/").header("expect", "100-continue"),
                false,
            ),
            (get("http://a.example/").header("expect", "fancy"), false),
            (get("http://a.example/%2E%2e/a%zz"), false),
            (get("http://a.example/%2e%2e/secret"), false),
            (get("http://a.example:99999/"), false),
            (
                http::Request::builder()
                    .method("OPTIONS")
                    .uri("http://a.example"),
                false,
            ),
            (get("http://a.example/").header("x-v", "caf\u{e9}"), false),
        ];
        for (b, has_body) in cases {
            let p = parts(b);
            let (got, want) = both(&p, has_body, 4096);
            let got = got.unwrap_or_else(|| panic!("{:?} went to the parser", p.uri));
            assert_eq!(got, want, "{:?}", p.uri);
        }
    }

    /// What does not fit the buffer or the field slots goes as text, and a
    /// value the parser would trim is left to it: either way the loop
    /// parses it, as before.
    #[test]
    fn what_the_assembler_cannot_vouch_for_is_parsed_as_text() {
        let p = parts(
            http::Request::builder()
                .uri("http://a.example/")
                .header("x-a", "1"),
        );
        assert!(both(&p, false, 32).0.is_none(), "the buffer is too small");
        let mut b = http::Request::builder().uri("http://a.example/");
        for i in 0..20 {
            b = b.header(format!("x-{i}"), "v");
        }
        assert!(
            both(&parts(b), false, 4096).0.is_none(),
            "more fields than slots"
        );
        let p = parts(
            http::Request::builder()
                .uri("http://a.example/")
                .header("x-a", " lead"),
        );
        assert!(both(&p, false, 4096).0.is_none(), "a value parse trims");
    }
}
