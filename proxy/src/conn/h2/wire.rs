//! The connection's bytes for the codec: what the client (plain or TLS) sends is read into a pooled buffer that the connection holds only while it holds the start of a frame the codec has not used yet (a partial frame, RFC 9113 §4.1), so an idle connection holds none; what the codec queues is copied out into a pooled buffer and written, one write in flight at a time, beside the read.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use super::shared::Core;
use crate::conn::client::ClientConn;

/// A read buffer: room for the largest frame the codec waits for whole
/// (9 + SETTINGS_MAX_FRAME_SIZE 16,384, §4.2) and as much again to read.
const READ_BYTES: usize = 32 * 1024;

/// Buffers a shard keeps for its HTTP/2 connections between uses.
const POOLED: usize = 64;

/// The largest write buffer kept.
const WRITE_KEPT: usize = 256 * 1024;

thread_local! {
    /// Read buffers, kept at their full length (no zeroing per read).
    static READS: std::cell::RefCell<Vec<Vec<u8>>> = const { std::cell::RefCell::new(Vec::new()) };
    static WRITES: std::cell::RefCell<Vec<Vec<u8>>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn take_read() -> Vec<u8> {
    READS
        .with(|p| p.borrow_mut().pop())
        .unwrap_or_else(|| vec![0; READ_BYTES])
}

fn put_read(b: Vec<u8>) {
    if b.len() == READ_BYTES {
        let _ = READS.try_with(|p| {
            let mut p = p.borrow_mut();
            if p.len() < POOLED {
                p.push(b);
            }
        });
    }
}

fn take_write() -> Vec<u8> {
    WRITES.with(|p| p.borrow_mut().pop()).unwrap_or_default()
}

fn put_write(mut b: Vec<u8>) {
    if b.capacity() == 0 || b.capacity() > WRITE_KEPT {
        return;
    }
    b.clear();
    let _ = WRITES.try_with(|p| {
        let mut p = p.borrow_mut();
        if p.len() < POOLED {
            p.push(b);
        }
    });
}

type ReadFut<'a> = Pin<Box<dyn Future<Output = (Vec<u8>, io::Result<usize>)> + 'a>>;
type WriteFut<'a> = Pin<Box<dyn Future<Output = (Vec<u8>, io::Result<()>)> + 'a>>;

/// What a read found.
pub(super) enum Got {
    Bytes,
    Eof,
    Err(io::Error),
}

/// The connection's read and write state (see the module docs).
pub(super) struct Wire<'a> {
    client: &'a ClientConn,
    /// `READ_BYTES` long while held; empty otherwise.
    rbuf: Vec<u8>,
    /// Bytes in `rbuf` the codec has not used.
    rlen: usize,
    reading: Option<ReadFut<'a>>,
    writing: Option<WriteFut<'a>>,
    /// Held bytes the codec has not seen yet (those read before).
    unseen: bool,
}

impl<'a> Wire<'a> {
    /// `early`: bytes read before HTTP/2 was chosen (the preface's first).
    pub fn new(client: &'a ClientConn, early: &[u8]) -> Wire<'a> {
        let mut w = Wire {
            client,
            rbuf: Vec::new(),
            rlen: 0,
            reading: None,
            writing: None,
            unseen: false,
        };
        if !early.is_empty() {
            w.rbuf = take_read();
            if early.len() > READ_BYTES {
                w.rbuf.resize(early.len(), 0);
            }
            w.rbuf[..early.len()].copy_from_slice(early);
            w.rlen = early.len();
            w.unseen = true;
        }
        w
    }

    /// Bytes read and not used yet.
    pub fn held(&self) -> &[u8] {
        &self.rbuf[..self.rlen]
    }

    /// The codec used `n` of [`Wire::held`]: the rest moves to the front;
    /// with none left the buffer goes back to the pool.
    pub fn used(&mut self, n: usize) {
        let n = n.min(self.rlen);
        self.rbuf.copy_within(n..self.rlen, 0);
        self.rlen -= n;
        if self.rlen == 0 {
            put_read(std::mem::take(&mut self.rbuf));
        }
    }

    /// Drops what is held (the connection ended on an error).
    pub fn discard(&mut self) {
        self.used(self.rlen);
        self.reading = None;
    }

    /// Reads more after what is held; while nothing is held, no buffer is
    /// taken until the client's bytes are there.
    pub fn poll_read(&mut self, cx: &mut Context<'_>) -> Poll<Got> {
        if std::mem::take(&mut self.unseen) {
            return Poll::Ready(Got::Bytes);
        }
        let fut = self.reading.get_or_insert_with(|| {
            let c = self.client;
            let at = self.rlen;
            let mut b = std::mem::take(&mut self.rbuf);
            Box::pin(async move {
                if at == 0 {
                    if let Err(e) = c.readable().await {
                        return (b, Err(e));
                    }
                }
                if b.is_empty() {
                    b = take_read();
                }
                if at == b.len() {
                    // Never a read into no room (it would look like the end).
                    b.resize(at + READ_BYTES / 2, 0);
                }
                // Boxed: a TLS read's state is not kept while idle.
                let r = Box::pin(c.read(&mut b[at..])).await;
                (b, r)
            })
        });
        let (b, r) = match fut.as_mut().poll(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(v) => v,
        };
        self.reading = None;
        self.rbuf = b;
        let got = match r {
            Ok(0) => Got::Eof,
            Ok(n) => {
                self.rlen += n;
                Got::Bytes
            }
            Err(e) => Got::Err(e),
        };
        if self.rlen == 0 {
            put_read(std::mem::take(&mut self.rbuf));
        }
        Poll::Ready(got)
    }

    /// Writes what the codec queued: `Ready(Ok)` once nothing is queued or
    /// in flight. Each write takes all that is queued then.
    pub fn poll_write(&mut self, cx: &mut Context<'_>, core: &Core) -> Poll<io::Result<()>> {
        loop {
            if let Some(f) = self.writing.as_mut() {
                let (v, r) = match f.as_mut().poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(v) => v,
                };
                self.writing = None;
                put_write(v);
                r?;
            }
            let v = {
                let mut s = core.server.borrow_mut();
                let p = s.pending();
                if p.is_empty() {
                    return Poll::Ready(Ok(()));
                }
                let mut v = take_write();
                v.extend_from_slice(p);
                let n = p.len();
                s.written(n);
                v
            };
            core.written();
            let c = self.client;
            self.writing = Some(Box::pin(async move {
                let r = c.write_all(&v).await;
                (v, r)
            }));
        }
    }
}
