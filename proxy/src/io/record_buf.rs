//! Read buffers for TLS records, pooled per shard thread and shared by client-side and origin-side TLS: a connection holds one only while a partial record waits in it.

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

/// A record buffer from this thread's pool, or a new one.
pub fn take_record_buffer() -> Box<[u8]> {
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
