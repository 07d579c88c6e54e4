//! The single-writer counter every floor counts with: the owning shard increments with a relaxed load and store, anyone may read.

use std::sync::atomic::{AtomicU64, Ordering};

/// A single-writer counter: the owning shard increments, anyone may read.
#[derive(Default)]
pub struct Counter(AtomicU64);

impl Counter {
    #[inline]
    pub fn inc(&self) {
        self.add(1);
    }
    #[inline]
    pub fn add(&self, n: u64) {
        // Single writer: load + store avoids a locked instruction.
        self.0.store(
            self.0.load(Ordering::Relaxed).wrapping_add(n),
            Ordering::Relaxed,
        );
    }
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}
