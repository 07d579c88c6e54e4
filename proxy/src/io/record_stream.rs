//! A TLS session over a socket after its handshake, for either side (a client connection, `conn::client`; an origin connection, `upstream::tls`): received records are decrypted in place where the driver put them (on the ring, the provided buffer it lends for the call; on epoll, the pooled record buffer `recv` filled) and their payload copied once, into the caller's buffer; only a record split across buffers is completed in a per-shard pooled buffer, held while it waits. Writes are encrypted into one send buffer (a long one, a body's, into a pooled buffer). No borrow of the session is held across an await, so one direction can stream while the other waits.

use std::cell::{Cell, RefCell};
use std::io;

use zgix_tls::session::{Side, Tls};

use crate::io::record_buf::{put_send_buffer, take_send_scratch, RECORD_BUFFER, SMALL_WRITE};
use crate::io::{put_record_buffer, take_record_buffer, Lent, Sock};

/// The encrypted stream of one connection, side `S`.
pub struct RecordStream<S> {
    session: RefCell<Tls<S>>,
    /// Received TLS bytes not yet decrypted (a partial record), in a pooled
    /// buffer held only while there are some.
    inbuf: RefCell<Option<Box<[u8]>>>,
    in_len: Cell<usize>,
    /// Decrypted bytes that did not fit the caller's buffer.
    plain: RefCell<Vec<u8>>,
    plain_pos: Cell<usize>,
    peer_closed: Cell<bool>,
    /// A write is under way (its future holds the socket's send side): a
    /// `close_notify` sent now could land inside one of its records.
    writing: Cell<bool>,
    /// `close_notify` went out with the last answer ([`RecordStream::write_all_last`]).
    notified: Cell<bool>,
    /// Application bytes received and sent (before encryption).
    rx: Cell<u64>,
    tx: Cell<u64>,
}

fn invalid(e: zgix_tls::Failure) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e.to_string())
}

/// How many bytes to read after `have` so that its first incomplete record
/// is whole (its header first, if not whole yet): at least one, at most the
/// room left in the record buffer (all of it if no record is incomplete).
fn record_rest(have: &[u8]) -> usize {
    let room = RECORD_BUFFER - have.len();
    let mut at = 0;
    while at + 5 <= have.len() {
        let end = at + 5 + u16::from_be_bytes([have[at + 3], have[at + 4]]) as usize;
        if end > have.len() {
            return (end - have.len()).min(room);
        }
        at = end;
    }
    if at == have.len() {
        room
    } else {
        (at + 5 - have.len()).min(room)
    }
}

impl<S: Side> RecordStream<S> {
    /// The stream after a handshake that left `len` bytes of the next
    /// records in `inbuf` and decrypted `plain` already.
    pub fn new(session: Tls<S>, inbuf: Box<[u8]>, len: usize, plain: Vec<u8>) -> Self {
        let keep = if len > 0 {
            Some(inbuf)
        } else {
            put_record_buffer(inbuf);
            None
        };
        RecordStream {
            session: RefCell::new(session),
            inbuf: RefCell::new(keep),
            in_len: Cell::new(len),
            plain: RefCell::new(plain),
            plain_pos: Cell::new(0),
            peer_closed: Cell::new(false),
            writing: Cell::new(false),
            notified: Cell::new(false),
            rx: Cell::new(0),
            tx: Cell::new(0),
        }
    }

    /// The session, for what the handshake settled.
    pub fn session(&self) -> std::cell::Ref<'_, Tls<S>> {
        self.session.borrow()
    }

    /// Decrypted bytes wait, or the peer has closed: a read completes at once.
    pub fn ready(&self) -> bool {
        self.has_plain() || self.peer_closed.get()
    }

    /// Bytes received and not yet handed out (decrypted or not).
    pub fn holds_input(&self) -> bool {
        self.ready() || self.in_len.get() > 0
    }

    pub fn bytes_read(&self) -> u64 {
        self.rx.get()
    }

    pub fn bytes_written(&self) -> u64 {
        self.tx.get()
    }

    fn has_plain(&self) -> bool {
        self.plain_pos.get() < self.plain.borrow().len()
    }

    /// Copies buffered plaintext into `buf`.
    fn take_plain(&self, buf: &mut [u8]) -> usize {
        let mut p = self.plain.borrow_mut();
        let pos = self.plain_pos.get();
        let n = (p.len() - pos).min(buf.len());
        buf[..n].copy_from_slice(&p[pos..pos + n]);
        if pos + n == p.len() {
            p.clear();
            if p.capacity() > 4096 {
                *p = Vec::new();
            }
            self.plain_pos.set(0);
        } else {
            self.plain_pos.set(pos + n);
        }
        n
    }

    /// Reads decrypted bytes, waiting (up to the socket's read timeout) for
    /// at least one; 0 at `close_notify` or the peer's FIN.
    pub async fn read(&self, sock: &Sock, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            if self.has_plain() {
                let n = self.take_plain(buf);
                self.rx.set(self.rx.get() + n as u64);
                return Ok(n);
            }
            if self.peer_closed.get() {
                return Ok(0);
            }
            // Output held for the first answer (the handshake's session
            // ticket) goes out before zgix waits on the client.
            if !self.writing.get() && !self.session.borrow().pending().is_empty() {
                self.flush(sock).await;
            }
            let copied = if self.in_len.get() == 0 {
                match self.read_lent(sock, buf).await? {
                    Some(n) => n,
                    None => self.read_copied(sock, buf).await?,
                }
            } else {
                self.read_copied(sock, buf).await?
            };
            if copied > 0 {
                self.rx.set(self.rx.get() + copied as u64);
                return Ok(copied);
            }
        }
    }

    /// The fast path: whole records are decrypted where the driver received
    /// them (a ring's provided buffer) and their payload copied once, into
    /// `buf` (what does not fit into `plain`). A partial record at the end
    /// moves into a pooled record buffer to be completed there. `None`: the
    /// driver lends nothing (epoll, a ring reading past its dry buffer
    /// ring): read with [`RecordStream::read_copied`].
    async fn read_lent(&self, sock: &Sock, buf: &mut [u8]) -> io::Result<Option<usize>> {
        let mut copied = 0;
        let mut failed = None;
        let lent = sock
            .read_lent(&mut |bytes| {
                let len = bytes.len();
                match self.decrypt(bytes, buf, &mut copied) {
                    Ok(consumed) => consumed + self.keep_partial(&bytes[consumed..]),
                    Err(e) => {
                        failed = Some(e);
                        len
                    }
                }
            })
            .await?;
        if let Some(e) = failed {
            self.flush(sock).await;
            return Err(invalid(e));
        }
        match lent {
            Lent::Bytes(_) => Ok(Some(copied)),
            Lent::Eof => {
                // A FIN without close_notify: a truncation the HTTP framing
                // above notices; there is nothing more to read either way.
                self.peer_closed.set(true);
                Ok(Some(0))
            }
            Lent::Copy => Ok(None),
        }
    }

    /// Moves the start of a record that continues in the next buffer into
    /// a pooled record buffer; how many bytes it took (all, unless more
    /// than a record waits: the rest stays with the driver).
    fn keep_partial(&self, rest: &[u8]) -> usize {
        if rest.is_empty() || self.peer_closed.get() {
            return rest.len();
        }
        let mut inbuf = take_record_buffer();
        let n = rest.len().min(inbuf.len());
        inbuf[..n].copy_from_slice(&rest[..n]);
        self.in_len.set(n);
        *self.inbuf.borrow_mut() = Some(inbuf);
        n
    }

    /// Decrypts the records of `bytes` in place: payload into `buf` from
    /// `*copied` on, the rest into `plain`. Returns the bytes the session
    /// is done with (a partial record stays).
    fn decrypt(
        &self,
        bytes: &mut [u8],
        buf: &mut [u8],
        copied: &mut usize,
    ) -> Result<usize, zgix_tls::Failure> {
        let mut plain = self.plain.borrow_mut();
        let p = self.session.borrow_mut().read(bytes, &mut |d| {
            let k = (buf.len() - *copied).min(d.len());
            buf[*copied..*copied + k].copy_from_slice(&d[..k]);
            *copied += k;
            plain.extend_from_slice(&d[k..]);
        })?;
        if p.peer_closed {
            self.peer_closed.set(true);
        }
        Ok(p.consumed)
    }

    /// The slow path: received bytes are copied into the pooled record
    /// buffer (after the partial record it holds) and decrypted there. A
    /// driver that lends its buffers gives only what completes the record
    /// waiting here, so the records after it are read where they landed.
    async fn read_copied(&self, sock: &Sock, buf: &mut [u8]) -> io::Result<usize> {
        let mut inbuf = self
            .inbuf
            .borrow_mut()
            .take()
            .unwrap_or_else(take_record_buffer);
        let have = self.in_len.get();
        if have == inbuf.len() {
            // rustls takes records of at most 2^14 + 256 bytes: a full
            // buffer it consumed nothing of is not TLS.
            self.in_len.set(0);
            put_record_buffer(inbuf);
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "TLS record larger than its buffer",
            ));
        }
        let want = if have > 0 && sock.lends() {
            record_rest(&inbuf[..have])
        } else {
            inbuf.len() - have
        };
        let n = match sock.read(&mut inbuf[have..have + want]).await {
            Ok(n) => n,
            Err(e) => {
                self.stash(inbuf);
                return Err(e);
            }
        };
        if n == 0 {
            // A FIN without close_notify (see `read_lent`).
            self.stash(inbuf);
            self.peer_closed.set(true);
            return Ok(0);
        }
        let len = have + n;
        let mut copied = 0;
        match self.decrypt(&mut inbuf[..len], buf, &mut copied) {
            Ok(consumed) => {
                inbuf.copy_within(consumed..len, 0);
                self.in_len.set(len - consumed);
                self.stash(inbuf);
                Ok(copied)
            }
            Err(e) => {
                self.in_len.set(0);
                put_record_buffer(inbuf);
                self.flush(sock).await;
                Err(invalid(e))
            }
        }
    }

    /// Keeps `inbuf` while it holds a partial record; pools it otherwise.
    fn stash(&self, inbuf: Box<[u8]>) {
        if self.in_len.get() > 0 {
            *self.inbuf.borrow_mut() = Some(inbuf);
        } else {
            put_record_buffer(inbuf);
        }
    }

    /// Encrypts and sends all of `buf`.
    pub async fn write_all(&self, sock: &Sock, buf: &[u8]) -> io::Result<()> {
        self.write_inner(sock, buf, false).await
    }

    /// Encrypts and sends all of `buf`, the last bytes zgix writes on the
    /// connection, with `close_notify` (RFC 8446 §6.1) after them in the
    /// same send; the close that follows sends no second one.
    pub async fn write_all_last(&self, sock: &Sock, buf: &[u8]) -> io::Result<()> {
        self.write_inner(sock, buf, true).await
    }

    async fn write_inner(&self, sock: &Sock, buf: &[u8], last: bool) -> io::Result<()> {
        let last = last && !self.notified.get();
        if last {
            self.notified.set(true);
        }
        if buf.len() > SMALL_WRITE {
            // Encrypted into a pooled send buffer (over what it last sent)
            // that is then handed to the driver whole: the ring sends it
            // without a copy.
            let mut out = take_send_scratch();
            {
                let mut s = self.session.borrow_mut();
                if let Err(e) = s.write_over(buf, &mut out) {
                    put_send_buffer(out);
                    return Err(invalid(e));
                }
                if last {
                    s.close();
                    let n = s.pending().len();
                    out.extend_from_slice(s.pending());
                    s.sent(n);
                }
            }
            self.writing.set(true);
            let r = sock.write_all_owned(out).await;
            self.writing.set(false);
            r?;
        } else {
            let out = {
                let mut s = self.session.borrow_mut();
                s.write(buf).map_err(invalid)?;
                if last {
                    s.close();
                }
                s.take_output()
            };
            let r = self.send(sock, &out).await;
            self.session.borrow_mut().give_back(out);
            r?;
        }
        self.tx.set(self.tx.get() + buf.len() as u64);
        Ok(())
    }

    /// Sends TLS bytes, marked as under way until done (see
    /// [`RecordStream::close_now`]).
    async fn send(&self, sock: &Sock, out: &[u8]) -> io::Result<()> {
        self.writing.set(true);
        let r = sock.write_all(out).await;
        self.writing.set(false);
        r
    }

    /// Sends `close_notify` (RFC 8446 §6.1: each party sends one before
    /// closing its write side).
    pub async fn close(&self, sock: &Sock) {
        if self.notified.get() {
            return;
        }
        let out = {
            let mut s = self.session.borrow_mut();
            s.close();
            s.take_output()
        };
        if !out.is_empty() {
            let _ = self.send(sock, &out).await;
        }
    }

    /// Sends `close_notify` without waiting, as zgix drops the connection.
    /// Skipped while a write is under way, or once the session has sent one
    /// or failed. The record (24 bytes) goes into the empty send buffer of a
    /// connection that is not writing; if the kernel takes no byte, the FIN
    /// follows alone.
    pub fn close_now(&self, sock: &Sock) {
        if self.writing.get() || self.notified.get() {
            return;
        }
        let out = {
            let mut s = self.session.borrow_mut();
            s.close();
            s.take_output()
        };
        if !out.is_empty() {
            // SAFETY: the socket's fd is open for as long as `sock` lives;
            // `out` is valid for its length.
            unsafe {
                libc::send(
                    sock.fd(),
                    out.as_ptr().cast(),
                    out.len(),
                    libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                )
            };
        }
    }

    /// Sends what the session queued (an alert after a failure).
    async fn flush(&self, sock: &Sock) {
        let out = self.session.borrow_mut().take_output();
        if !out.is_empty() {
            let _ = self.send(sock, &out).await;
        }
    }
}
