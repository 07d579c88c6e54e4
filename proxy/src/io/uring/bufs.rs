//! The ring's memory: the provided-buffer ring receives land in, and the pool of send chunks the driver owns from a send's submission to its completion.
//!
//! # Send chunks
//!
//! `Sock::write(&[u8])` borrows the caller's bytes, and a borrow cannot be
//! held past a dropped or forgotten future, while the kernel reads a send's
//! buffer until its completion. So a ring send first copies (up to
//! [`BIG`] bytes of) the caller's slice into a chunk the driver owns; the
//! chunk stays with the socket's slot until the completion arrives, whatever
//! happens to the future, and then goes back to the pool. Chunks come in
//! three sizes ([`SIZES`]: 4, 16 and 64 KiB) and the pool keeps idle as
//! many of each as were out at once since the shard's last trim (at least
//! [`POOLED`]), so a shard in steady state allocates nothing per send, even
//! when one read of 100 HTTP/2 requests starts 100 upstream sends at once; the copy is a `memcpy` of bytes that are hot in cache. A caller
//! that has its bytes in a buffer of its own (TLS records encrypted into a
//! pooled send buffer) hands the buffer over instead (`Sock::write_all_owned`):
//! no copy, and the driver sends all of it before the buffer goes back.

use std::cell::{Cell, RefCell};
use std::io;

use io_uring::types::BufRingEntry;

use super::super::buf::Mapping;

/// The sizes of send chunks: a write takes the smallest that holds it (a
/// reply head, a default 16 KiB streaming buffer, a long write's piece).
const SIZES: [usize; 3] = [4 << 10, 16 << 10, BIG];
/// The largest chunk: a longer write sends this much and returns the count.
pub(crate) const BIG: usize = 64 << 10;
/// Idle chunks kept per size however few were out lately.
const POOLED: usize = 64;

/// Bytes a send owns until its completion.
pub(crate) struct Chunk {
    buf: Bytes,
    len: usize,
    /// Bytes of an owned buffer the kernel has already taken (a short send
    /// is sent on from here); 0 for a pooled chunk.
    off: usize,
}

/// Where a chunk's bytes live.
enum Bytes {
    /// A pooled chunk the caller's bytes were copied into.
    Pooled(Box<[u8]>),
    /// A buffer the caller handed over whole (`Sock::write_all_owned`):
    /// sent without a copy, and given back to the shard's send-buffer pool.
    Owned(Vec<u8>),
}

impl Chunk {
    /// A chunk of the caller's own buffer, taken whole.
    pub(super) fn owned(v: Vec<u8>) -> Chunk {
        Chunk {
            len: v.len(),
            buf: Bytes::Owned(v),
            off: 0,
        }
    }

    /// Where the bytes still to send start.
    pub(super) fn ptr(&self) -> *const u8 {
        let base = match &self.buf {
            Bytes::Pooled(b) => b.as_ptr(),
            Bytes::Owned(v) => v.as_ptr(),
        };
        base.wrapping_add(self.off)
    }

    /// How many bytes are still to send.
    pub(super) fn len(&self) -> usize {
        self.len - self.off
    }

    /// Whether the driver sends all of it (an owned buffer) rather than
    /// returning a short count to the caller.
    pub(super) fn is_owned(&self) -> bool {
        matches!(self.buf, Bytes::Owned(_))
    }

    /// The kernel took `n` more bytes of an owned buffer.
    pub(super) fn advance(&mut self, n: usize) {
        debug_assert!(self.is_owned() && n <= self.len());
        self.off += n;
    }
}

/// Idle send chunks of one shard, by size, and how many of each are out
/// (in flight) now and were at most since the last trim.
#[derive(Default)]
pub(super) struct SendPool {
    pub(super) idle: [RefCell<Vec<Box<[u8]>>>; 3],
    out: [Cell<usize>; 3],
    peak: [Cell<usize>; 3],
}

impl SendPool {
    /// A chunk holding the first `min(src.len(), BIG)` bytes of `src`.
    pub(super) fn fill(&self, src: &[u8]) -> Chunk {
        let len = src.len().min(BIG);
        let class = SIZES
            .iter()
            .position(|&n| len <= n)
            .unwrap_or(SIZES.len() - 1);
        let mut buf = self.idle[class]
            .borrow_mut()
            .pop()
            .unwrap_or_else(|| vec![0u8; SIZES[class]].into_boxed_slice());
        buf[..len].copy_from_slice(&src[..len]);
        let out = self.out[class].get() + 1;
        self.out[class].set(out);
        self.peak[class].set(self.peak[class].get().max(out));
        Chunk {
            buf: Bytes::Pooled(buf),
            len,
            off: 0,
        }
    }

    /// Takes back a chunk whose send completed (an owned buffer goes back
    /// to the shard's send-buffer pool).
    pub(super) fn give(&self, c: Chunk) {
        let buf = match c.buf {
            Bytes::Pooled(b) => b,
            Bytes::Owned(v) => return super::super::put_send_buffer(v),
        };
        if let Some(class) = SIZES.iter().position(|&n| n == buf.len()) {
            self.out[class].set(self.out[class].get().saturating_sub(1));
            let mut idle = self.idle[class].borrow_mut();
            if idle.len() < self.peak[class].get().max(POOLED) {
                idle.push(buf);
            }
        }
    }

    /// Frees the idle chunks the last interval's peak did not need (at
    /// least [`POOLED`] of each size stay); from the shard's tick.
    pub(super) fn trim(&self) {
        for class in 0..SIZES.len() {
            let out = self.out[class].get();
            let keep = self.peak[class]
                .replace(out)
                .saturating_sub(out)
                .max(POOLED);
            self.idle[class].borrow_mut().truncate(keep);
        }
    }
}

/// The provided-buffer ring: the entry ring the kernel reads and the buffers.
pub(super) struct BufRing {
    pub(super) ring: Mapping,
    bufs: Mapping,
    pub(super) entries: u16,
    size: u32,
    /// Our copy of the ring tail (the kernel reads the shared one).
    tail: Cell<u16>,
}

impl BufRing {
    pub(super) fn new(entries: u32, size: u32) -> io::Result<BufRing> {
        let ring =
            Mapping::new((entries as usize * std::mem::size_of::<BufRingEntry>()).max(4096))?;
        let bufs = Mapping::new(entries as usize * size as usize)?;
        Ok(BufRing {
            ring,
            bufs,
            entries: entries as u16,
            size,
            tail: Cell::new(0),
        })
    }

    fn base(&self) -> *mut BufRingEntry {
        self.ring.ptr.cast()
    }

    /// Puts buffer `bid` at the tail; published by [`BufRing::publish`].
    pub(super) fn add(&self, bid: u16) {
        let t = self.tail.get();
        let idx = (t & (self.entries - 1)) as usize;
        // SAFETY: idx < entries, so the entry lies inside the page-aligned
        // ring mapping; the kernel reads entries only up to the published
        // tail, and `BufRingEntry`'s setters leave `resv` (entry 0's is the
        // shared tail) alone.
        let e = unsafe { &mut *self.base().add(idx) };
        // SAFETY: bid < entries: the buffer lies inside the buffer mapping.
        e.set_addr(unsafe { self.bufs.ptr.add(bid as usize * self.size as usize) } as u64);
        e.set_len(self.size);
        e.set_bid(bid);
        self.tail.set(t.wrapping_add(1));
    }

    pub(super) fn publish(&self) {
        // SAFETY: the base is the first entry of the live ring mapping; its
        // `resv` field is the ring tail the kernel reads, a u16 it never writes.
        let tail =
            unsafe { &*(BufRingEntry::tail(self.base()) as *const std::sync::atomic::AtomicU16) };
        tail.store(self.tail.get(), std::sync::atomic::Ordering::Release);
    }

    pub(super) fn data(&self, bid: u16, from: u32, len: u32) -> &[u8] {
        debug_assert!(bid < self.entries && from + len <= self.size);
        // SAFETY: the range lies inside buffer `bid`, which zgix owns while
        // it is queued on a socket (the kernel wrote it before completing).
        unsafe {
            std::slice::from_raw_parts(
                self.bufs
                    .ptr
                    .add(bid as usize * self.size as usize + from as usize),
                len as usize,
            )
        }
    }

    /// Where byte `from` of buffer `bid` lies, for a lend
    /// ([`super::Ring::try_lend`]) that writes there: zgix owns a buffer
    /// while it is queued on a socket, and the lend is its only user.
    pub(super) fn at(&self, bid: u16, from: u32) -> *mut u8 {
        debug_assert!(bid < self.entries && from <= self.size);
        // SAFETY: the offset lies inside the buffer mapping (bid < entries,
        // from <= size).
        unsafe {
            self.bufs
                .ptr
                .add(bid as usize * self.size as usize + from as usize)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_send_pool_keeps_what_was_out_at_once_until_an_idle_trim() {
        let pool = SendPool::default();
        let idle = |p: &SendPool| p.idle[0].borrow().len();
        // One read's worth of upstream sends at once: 100 small chunks.
        let chunks: Vec<Chunk> = (0..100)
            .map(|_| pool.fill(b"GET / HTTP/1.1\r\n\r\n"))
            .collect();
        assert_eq!(pool.out[0].get(), 100);
        for c in chunks {
            pool.give(c);
        }
        assert_eq!(idle(&pool), 100, "every chunk of the burst is kept");
        // The next burst takes them all: nothing is allocated.
        let again: Vec<Chunk> = (0..100).map(|_| pool.fill(b"x")).collect();
        assert_eq!(idle(&pool), 0);
        for c in again {
            pool.give(c);
        }
        pool.trim();
        assert_eq!(idle(&pool), 100, "the interval's peak keeps its chunks");
        pool.trim();
        assert_eq!(idle(&pool), POOLED, "an idle interval trims to the floor");
    }
}
