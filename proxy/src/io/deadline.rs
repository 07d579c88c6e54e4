//! Deadlines in a min-heap with lazy deletion: arming is O(log n), expiry visits only the entries that are due (plus the stale ones it discards), never every socket or timer.
//!
//! An entry is a `(deadline, key)` pair. Nothing is removed when a wait ends
//! early or its deadline moves: the owner of the key says, when the entry
//! comes up, whether it still stands ([`Deadlines::pop_due`] and
//! [`Deadlines::prune`] ask). Stale entries are dropped in bulk once they
//! could outnumber the live ones ([`Deadlines::should_compact`]), so the heap
//! stays within a constant factor of what is armed.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;
use std::time::Instant;

/// Entries below which the heap is never compacted.
const COMPACT_FLOOR: usize = 1024;

/// One armed deadline, ordered by `(at, key)`. Its comparisons are the
/// heap's work; the unit tests count them ([`Entry::cmp`]).
#[derive(Copy, Clone, PartialEq, Eq)]
struct Entry<K>(Instant, K);

impl<K: Ord> Ord for Entry<K> {
    fn cmp(&self, other: &Self) -> Ordering {
        #[cfg(test)]
        tests::COMPARES.with(|c| c.set(c.get() + 1));
        (&self.0, &self.1).cmp(&(&other.0, &other.1))
    }
}

impl<K: Ord> PartialOrd for Entry<K> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

pub(super) struct Deadlines<K: Copy + Ord> {
    heap: BinaryHeap<Reverse<Entry<K>>>,
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
        self.heap.push(Reverse(Entry(at, key)));
    }

    /// The earliest entry's deadline (it may be stale: early, never late).
    pub(super) fn next(&self) -> Option<Instant> {
        self.heap.peek().map(|Reverse(Entry(at, _))| *at)
    }

    /// Drops stale entries from the top, so [`Deadlines::next`] is a live one.
    pub(super) fn prune(&mut self, mut live: impl FnMut(K, Instant) -> bool) {
        while let Some(&Reverse(Entry(at, k))) = self.heap.peek() {
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
        while let Some(&Reverse(Entry(at, k))) = self.heap.peek() {
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
            .filter(|Reverse(Entry(at, k))| live(*k, *at))
            .collect();
        self.kept = self.heap.len();
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.heap.len()
    }
}

#[cfg(test)]
mod tests {
    //! Expiry costs what expires: counted in the heap's comparisons (each
    //! sift step is one or two), not timed.

    use super::*;
    use std::cell::Cell;
    use std::time::Duration;

    thread_local! {
        /// Comparisons of heap entries on this thread (see [`Entry::cmp`]).
        pub(super) static COMPARES: Cell<u64> = const { Cell::new(0) };
    }

    fn compares() -> u64 {
        COMPARES.with(|c| c.replace(0))
    }

    /// Arms `n` deadlines, `due` of them in 1 ms and the rest in an hour
    /// (spread over the heap's arming order), then expires the due ones.
    /// Returns (entries visited, comparisons) of the expiry alone.
    fn expire_some_of(n: u32, due: u32) -> (usize, u64) {
        let now = Instant::now();
        let mut d = Deadlines::<u32>::default();
        for k in 0..n {
            let at = if k % (n / due) == 0 {
                now + Duration::from_millis(1)
            } else {
                now + Duration::from_secs(3600) + Duration::from_micros(u64::from(k))
            };
            d.push(at, k);
        }
        compares();
        assert_eq!(d.pop_due(now, |_, _| panic!("nothing is due")), 0);
        assert_eq!(compares(), 0, "an expiry with nothing due compares nothing");
        let mut fired = 0;
        let visited = d.pop_due(now + Duration::from_millis(2), |_, _| fired += 1);
        let work = compares();
        assert_eq!(fired, due as usize);
        assert_eq!(d.len(), (n - due) as usize);
        (visited, work)
    }

    #[test]
    fn expiring_a_few_of_ten_thousand_deadlines_costs_what_expires() {
        const DUE: u32 = 10;
        let (visited, work) = expire_some_of(10_000, DUE);
        assert_eq!(visited, DUE as usize, "only the due entries are visited");
        // A pop sifts through the heap's depth (log2 10,000 < 14) with at
        // most two comparisons a level; a scan of every entry would be 10,000.
        let per_pop = work as f64 / f64::from(DUE);
        assert!(
            work <= u64::from(DUE) * 2 * 14,
            "{work} comparisons to expire {DUE} of 10,000"
        );
        // Ten times the armed deadlines: the same visits, a few more
        // comparisons per pop (the depth grows by log2 10 = 3.3), not ten
        // times the work.
        let (visited_100k, work_100k) = expire_some_of(100_000, DUE);
        assert_eq!(visited_100k, DUE as usize);
        assert!(
            work_100k <= u64::from(DUE) * 2 * 17 && work_100k < 2 * work,
            "{work_100k} comparisons at 100,000 against {work} at 10,000"
        );
        eprintln!(
            "expire {DUE} of 10,000: {visited} visited, {work} comparisons ({per_pop:.1} a pop); of 100,000: {visited_100k} visited, {work_100k} comparisons"
        );
    }
}
