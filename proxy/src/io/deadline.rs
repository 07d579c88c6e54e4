//! Deadlines in a min-heap with lazy deletion: arming is O(log n), expiry visits only the entries that are due (plus the stale ones it discards), never every socket or timer.
//!
//! An entry is a `(deadline, key)` pair. Nothing is removed when a wait ends
//! early or its deadline moves: the owner of the key says, when the entry
//! comes up, whether it still stands ([`Deadlines::pop_due`] and
//! [`Deadlines::prune`] ask). Stale entries are dropped in bulk once they
//! could outnumber the live ones ([`Deadlines::should_compact`]), so the heap
//! stays within a constant factor of what is armed.
//!
//! An owner whose deadline only moves later (a keep-alive socket's next
//! wait, `now + timeout` again) need not push a new entry each time: its
//! earlier entry comes up first, and the owner then moves it to the
//! deadline that stands ([`Deadlines::pop_due_moving`],
//! [`Deadlines::prune_moving`]), as nginx leaves a timer armed that moved
//! by less than its lazy delay. The heap then works once per timeout
//! period per socket, not once per wait.

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
        self.pop_due_moving(now, |k, at| {
            fire(k, at);
            None
        })
    }

    /// [`Deadlines::prune`] for owners that move their entries: `at_now`
    /// says where the top entry stands now (`None`: stale, dropped; its own
    /// time: live, pruning stops; a later time: moved there).
    pub(super) fn prune_moving(&mut self, mut at_now: impl FnMut(K, Instant) -> Option<Instant>) {
        while let Some(&Reverse(Entry(at, k))) = self.heap.peek() {
            match at_now(k, at) {
                Some(t) if t <= at => return,
                moved => {
                    self.heap.pop();
                    if let Some(t) = moved {
                        self.heap.push(Reverse(Entry(t, k)));
                    }
                }
            }
        }
    }

    /// [`Deadlines::pop_due`] for owners that move their entries: `fire`
    /// handles a due entry and returns a later time if its owner's deadline
    /// moved past `now` (the entry is pushed there; an earlier time drops
    /// it). Returns how many entries were visited.
    pub(super) fn pop_due_moving(
        &mut self,
        now: Instant,
        mut fire: impl FnMut(K, Instant) -> Option<Instant>,
    ) -> usize {
        let mut visited = 0;
        while let Some(&Reverse(Entry(at, k))) = self.heap.peek() {
            if at > now {
                break;
            }
            self.heap.pop();
            visited += 1;
            if let Some(t) = fire(k, at).filter(|t| *t > now) {
                self.heap.push(Reverse(Entry(t, k)));
            }
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

    #[test]
    fn moved_entries_follow_their_owner_and_stale_ones_go() {
        let now = Instant::now();
        let ms = |n| now + Duration::from_millis(n);
        let mut d = Deadlines::<u32>::default();
        d.push(ms(1), 1); // its owner's deadline moved to 5 ms
        d.push(ms(2), 2); // stale
        d.push(ms(3), 3); // stands
        d.prune_moving(|k, at| match k {
            1 => Some(ms(5)),
            2 => None,
            _ => Some(at),
        });
        assert_eq!(d.next(), Some(ms(3)), "1 moved past 3, 2 dropped");
        assert_eq!(d.len(), 2);
        // Due at 4 ms: 3 fires; 1 (now at 5) is not due.
        let mut fired = Vec::new();
        assert_eq!(
            d.pop_due_moving(ms(4), |k, _| {
                fired.push(k);
                None
            }),
            1
        );
        assert_eq!(fired, [3]);
        // Due at 6 ms: 1 moves once more, to 9; a time not past `now`
        // drops the entry instead of looping on it.
        d.push(ms(6), 4);
        let visited = d.pop_due_moving(ms(6), |k, _| match k {
            1 => Some(ms(9)),
            _ => Some(ms(6)),
        });
        assert_eq!(visited, 2);
        assert_eq!((d.len(), d.next()), (1, Some(ms(9))));
    }

    /// A keep-alive socket waits again and again with the same timeout
    /// from a later `now`: its one heap entry stays (no push per wait),
    /// moves when it comes up, and the wait still times out at its own,
    /// last deadline. An earlier deadline after a later one is pushed.
    #[test]
    fn a_deadline_that_only_moves_later_is_armed_once_and_still_times_out() {
        use crate::io::{Driver, Kind, Options, Slot, RD};
        use std::task::{Context, Waker};
        const N: u32 = 100;
        const WAITS: u64 = 50;
        let timeout = Duration::from_secs(10);
        let d = Driver::new(&Options::new(Kind::Epoll)).unwrap();
        let cx = Context::from_waker(Waker::noop());
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        {
            let mut st = d.st.borrow_mut();
            for _ in 0..N {
                st.slots.push(Slot {
                    in_use: true,
                    fd: -1,
                    ..Default::default()
                });
            }
            for w in 0..WAITS {
                for t in 0..N {
                    // The previous wait ended (its waker was taken), the
                    // next one starts a millisecond later.
                    st.slots[t as usize].rd.waker = None;
                    st.wait_side(t, RD, &cx, Some(at(w) + timeout), at(w))
                        .unwrap();
                }
            }
            assert_eq!(
                st.deadlines.len(),
                N as usize,
                "one entry per socket, not one per wait"
            );
        }
        // The first entries come up: nothing fires, they move.
        assert_eq!(
            d.expire(t0 + timeout),
            0,
            "fired at the first wait's deadline"
        );
        assert_eq!(d.next_wake(), Some(at(WAITS - 1) + timeout));
        assert_eq!(d.st.borrow().deadlines.len(), N as usize);
        // A shorter wait on socket 0 is armed by itself and fires alone.
        {
            let mut st = d.st.borrow_mut();
            st.slots[0].rd.waker = None;
            st.wait_side(0, RD, &cx, Some(at(WAITS) + timeout / 2), at(WAITS))
                .unwrap();
        }
        assert_eq!(d.expire(at(WAITS) + timeout / 2), 1);
        // The rest time out at their last wait's deadline.
        assert_eq!(d.expire(at(WAITS - 1) + timeout), N as usize - 1);
        let mut st = d.st.borrow_mut();
        assert!(st.slots.iter().all(|s| s.rd.timed_out));
        assert_eq!(st.deadlines.len(), 0);
        st.slots.iter_mut().for_each(|s| s.in_use = false);
    }
}
