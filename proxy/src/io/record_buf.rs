//! Buffers for TLS records, pooled per shard thread and shared by client-side and origin-side TLS: a read buffer, held by a connection only while a partial record waits in it (on the ring, only a record split across two provided buffers), and a send buffer, held only while a long write is encrypted and sent.

use std::cell::RefCell;

/// A TLS record is at most 2^14 bytes of payload plus 256 of overhead (RFC
/// 8446 §5.2); a read buffer holds one whole, and a bit more so a following
/// record's head can wait in it.
pub const RECORD_BUFFER: usize = (1 << 14) + 256 + 1024;

/// Read buffers a shard keeps between reads (an idle TLS connection, client or
/// origin, holds none).
const POOLED: usize = 128;

thread_local! {
    static POOL: RefCell<Vec<Box<[u8]>>> = const { RefCell::new(Vec::new()) };
}

#[cfg(test)]
thread_local! {
    static TAKEN: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Record buffers this thread has taken (tests: a whole record received on
/// the ring is decrypted where it landed, without one).
#[cfg(test)]
pub fn record_buffers_taken() -> u64 {
    TAKEN.with(|t| t.get())
}

/// A record buffer from this thread's pool, or a new one.
pub fn take_record_buffer() -> Box<[u8]> {
    #[cfg(test)]
    TAKEN.with(|t| t.set(t.get() + 1));
    POOL.with(|p| p.borrow_mut().pop())
        .unwrap_or_else(|| vec![0u8; RECORD_BUFFER].into_boxed_slice())
}

/// Gives a record buffer back (freed past the pool's size).
pub fn put_record_buffer(b: Box<[u8]>) {
    POOL.with(|p| {
        let mut p = p.borrow_mut();
        if p.len() < POOLED {
            p.push(b);
        }
    });
}

/// Writes longer than this are encrypted into a pooled send buffer; shorter
/// ones into the session's own small one (kept up to 4 KiB).
pub const SMALL_WRITE: usize = 2048;

/// A send buffer's first capacity: four full records (a 64 KiB write).
const SEND_BUFFER: usize = 4 * ((1 << 14) + 64);

/// The largest send buffer kept for the next write, and how many are kept.
const SEND_KEPT_MAX: usize = 256 << 10;
const SEND_POOLED: usize = 16;

thread_local! {
    static SEND_POOL: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

/// An empty send buffer from this thread's pool, or a new one: a long TLS
/// write (a body) encrypts into it without an allocation per write.
pub fn take_send_buffer() -> Vec<u8> {
    let mut b = take_send_scratch();
    b.clear();
    b
}

/// A send buffer from this thread's pool as it came back, its bytes those
/// it last sent (or a new, empty one): scratch that a TLS write encrypts
/// over (`zgix_tls::session::Tls::write_over`), so the room its records need
/// is already initialised and not zero-filled again for each long write.
pub fn take_send_scratch() -> Vec<u8> {
    SEND_POOL
        .with(|p| p.borrow_mut().pop())
        .unwrap_or_else(|| Vec::with_capacity(SEND_BUFFER))
}

/// Gives a sent buffer back (freed past the pool's size, if it grew past
/// [`SEND_KEPT_MAX`], or if it is a small one that is not from the pool).
/// Its bytes stay, for [`take_send_scratch`].
pub fn put_send_buffer(b: Vec<u8>) {
    if b.capacity() > SEND_KEPT_MAX || b.capacity() < SEND_BUFFER {
        return;
    }
    SEND_POOL.with(|p| {
        let mut p = p.borrow_mut();
        if p.len() < SEND_POOLED {
            p.push(b);
        }
    });
}
