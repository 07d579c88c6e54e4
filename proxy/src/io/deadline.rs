//! Deadlines in a min-heap with lazy deletion: arming is O(log n), expiry visits only the entries that are due (plus the stale ones it discards), never every socket or timer.
//!
//! An entry is a `(deadline, key)` pair. Nothing is removed when a wait ends
//! early or its deadline moves: the owner of the key says, when the entry
//! comes up, whether it still stands ([`Deadlines::pop_due`] and
//! [`Deadlines::prune`] ask). Stale entries are dropped in bulk once they
//! could outnumber the live ones ([`Deadlines::should_compact`]), so the heap
//! stays within a constant factor of what is armed.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Instant;

/// Entries below which the heap is never compacted.
const COMPACT_FLOOR: usize = 1024;

pub(super) struct Deadlines<K: Copy + Ord> {
    heap: BinaryHeap<Reverse<(Instant, K)>>,
    /// The heap's size after the last compaction.
    kept: usize,
}

impl<K: Copy + Ord> Default for Deadlines<K> {
    fn default() -> Self {
        Deadlines {
            heap: BinaryHeap::new(),
            kept: 0,
        }
    }
}

impl<K: Copy + Ord> Deadlines<K> {
    pub(super) fn push(&mut self, at: Instant, key: K) {
        self.heap.push(Reverse((at, key)));
    }

    /// The earliest entry's deadline (it may be stale: early, never late).
    pub(super) fn next(&self) -> Option<Instant> {
        self.heap.peek().map(|Reverse((at, _))| *at)
    }

    /// Drops stale entries from the top, so [`Deadlines::next`] is a live one.
    pub(super) fn prune(&mut self, mut live: impl FnMut(K, Instant) -> bool) {
        while let Some(&Reverse((at, k))) = self.heap.peek() {
            if live(k, at) {
                return;
            }
            self.heap.pop();
        }
    }

    /// Pops every entry due at `now` and hands it to `fire` (which ignores
    /// stale ones). Returns how many entries were visited.
    pub(super) fn pop_due(&mut self, now: Instant, mut fire: impl FnMut(K, Instant)) -> usize {
        let mut visited = 0;
        while let Some(&Reverse((at, k))) = self.heap.peek() {
            if at > now {
                break;
            }
            self.heap.pop();
            visited += 1;
            fire(k, at);
        }
        visited
    }

    /// Whether stale entries may now outnumber live ones (checked on arming).
    pub(super) fn should_compact(&self) -> bool {
        self.heap.len() > COMPACT_FLOOR.max(2 * self.kept)
    }

    /// Keeps only the entries `live` accepts: O(n), amortised over the n/2
    /// arms since the last compaction.
    pub(super) fn compact(&mut self, mut live: impl FnMut(K, Instant) -> bool) {
        let v = std::mem::take(&mut self.heap).into_vec();
        self.heap = v
            .into_iter()
            .filter(|Reverse((at, k))| live(*k, *at))
            .collect();
        self.kept = self.heap.len();
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.heap.len()
    }
}
