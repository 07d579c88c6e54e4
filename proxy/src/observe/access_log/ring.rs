//! A bounded single-producer single-consumer byte ring: a shard appends whole lines, the writer thread takes everything written so far.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Bytes are owned by the producer between `head` and `tail + cap` and by
/// the consumer between `tail` and `head`; both positions only grow (they
/// are byte counts, taken modulo `cap` to index), so full and empty differ.
pub struct Ring {
    buf: Box<[UnsafeCell<u8>]>,
    /// Bytes ever pushed; written by the producer only.
    head: AtomicUsize,
    /// Bytes ever taken; written by the consumer only.
    tail: AtomicUsize,
}

// SAFETY: the producer writes only bytes in [head, tail + cap) and publishes
// them with a release store of `head`; the consumer reads only [tail, head)
// after an acquire load of `head` and gives them back with a release store
// of `tail`. The regions never overlap, so no byte is accessed from both
// threads at once. One producer and one consumer is the caller's contract
// (`push` and `drain` take `&self` but each has a single caller).
unsafe impl Sync for Ring {}

impl Ring {
    pub fn new(cap: usize) -> Ring {
        Ring {
            buf: (0..cap.max(1)).map(|_| UnsafeCell::new(0)).collect(),
            head: AtomicUsize::new(0),
            tail: AtomicUsize::new(0),
        }
    }

    pub fn capacity(&self) -> usize {
        self.buf.len()
    }

    /// Bytes waiting for the consumer.
    pub fn len(&self) -> usize {
        self.head
            .load(Ordering::Relaxed)
            .wrapping_sub(self.tail.load(Ordering::Relaxed))
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn ptr(&self) -> *mut u8 {
        UnsafeCell::raw_get(self.buf.as_ptr())
    }

    /// Appends `data` whole, or returns false (nothing written) when it does
    /// not fit. Producer only.
    pub fn push(&self, data: &[u8]) -> bool {
        let cap = self.buf.len();
        let head = self.head.load(Ordering::Relaxed);
        let tail = self.tail.load(Ordering::Acquire);
        if cap - head.wrapping_sub(tail) < data.len() {
            return false;
        }
        let at = head % cap;
        let first = data.len().min(cap - at);
        // SAFETY: [head, head + len) is free (checked above) and owned by the
        // producer; both copies stay inside the allocation of `cap` bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr().add(at), first);
            std::ptr::copy_nonoverlapping(data.as_ptr().add(first), self.ptr(), data.len() - first);
        }
        self.head
            .store(head.wrapping_add(data.len()), Ordering::Release);
        true
    }

    /// Hands everything pushed so far to `f` as one or two slices (the
    /// second is empty unless the bytes wrap), then frees it. Consumer only.
    pub fn drain(&self, f: impl FnOnce(&[u8], &[u8])) -> usize {
        let cap = self.buf.len();
        let tail = self.tail.load(Ordering::Relaxed);
        let head = self.head.load(Ordering::Acquire);
        let n = head.wrapping_sub(tail);
        if n == 0 {
            return 0;
        }
        let at = tail % cap;
        let first = n.min(cap - at);
        // SAFETY: [tail, head) was published by the producer's release store
        // and is not written again until `tail` moves past it below.
        let (a, b) = unsafe {
            (
                std::slice::from_raw_parts(self.ptr().add(at), first),
                std::slice::from_raw_parts(self.ptr(), n - first),
            )
        };
        f(a, b);
        self.tail.store(head, Ordering::Release);
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn take(r: &Ring) -> Vec<u8> {
        let mut v = Vec::new();
        r.drain(|a, b| {
            v.extend_from_slice(a);
            v.extend_from_slice(b);
        });
        v
    }

    #[test]
    fn refuses_what_does_not_fit_and_wraps() {
        let r = Ring::new(10);
        assert!(r.push(b"abcdef"));
        assert!(!r.push(b"ghijk"), "6 + 5 > 10");
        assert!(r.push(b"ghij"));
        assert!(!r.push(b"x"));
        assert_eq!(take(&r), b"abcdefghij");
        assert!(r.is_empty());
        assert!(r.push(b"0123456"), "wraps at 10");
        assert_eq!(r.len(), 7);
        assert_eq!(take(&r), b"0123456");
    }

    #[test]
    fn a_producer_and_a_consumer_thread_see_every_byte_in_order() {
        let r = std::sync::Arc::new(Ring::new(64));
        let producer = {
            let r = r.clone();
            std::thread::spawn(move || {
                let mut sent = 0u32;
                let mut dropped = 0u32;
                for i in 0..20_000u32 {
                    let line = format!("{i:08}\n");
                    if r.push(line.as_bytes()) {
                        sent += 1;
                    } else {
                        dropped += 1;
                    }
                }
                (sent, dropped)
            })
        };
        let mut got = Vec::new();
        loop {
            let done = producer.is_finished();
            got.extend(take(&r));
            if done && r.is_empty() {
                break;
            }
            std::thread::yield_now();
        }
        let (sent, dropped) = producer.join().unwrap();
        assert_eq!(sent + dropped, 20_000);
        let text = String::from_utf8(got).unwrap();
        let nums: Vec<u32> = text.lines().map(|l| l.parse().unwrap()).collect();
        assert_eq!(nums.len() as u32, sent);
        assert!(nums.windows(2).all(|w| w[0] < w[1]), "lines out of order");
    }
}
