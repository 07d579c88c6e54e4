//! The retry budget of one cluster on one shard: retries may be at most 20 % of the cluster's requests over a sliding 10 s window (Envoy's retry budget), with a floor of a few retries so a quiet cluster can still retry.
//!
//! Only its shard writes it (relaxed load + store, no lock); ten one-second
//! buckets, each stamped with the second it counts, make the window slide.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

use crate::observe::counter::Counter;

/// Seconds in the window.
pub const WINDOW_S: u64 = 10;
/// Retries allowed per 100 requests in the window.
pub const BUDGET_PERCENT: u64 = 20;
/// Retries always allowed in a window, whatever the request count (Envoy's
/// `min_retry_concurrency` is 3 too): the first requests of a quiet cluster
/// may still be saved by a retry.
pub const MIN_RETRIES: u64 = 3;

const N: usize = WINDOW_S as usize;

/// One cluster's requests and retries over the last [`WINDOW_S`] seconds on one shard.
#[derive(Default)]
pub struct RetryBudget {
    stamp: [AtomicU64; N],
    requests: [AtomicU32; N],
    retries: [AtomicU32; N],
    /// Retries refused because the budget was spent.
    pub refused: Counter,
}

fn bump(c: &AtomicU32) {
    c.store(c.load(Relaxed).wrapping_add(1), Relaxed);
}

impl RetryBudget {
    /// The bucket of second `sec`, emptied if it held an older second.
    #[inline]
    fn bucket(&self, sec: u64) -> usize {
        let i = (sec % WINDOW_S) as usize;
        if self.stamp[i].load(Relaxed) != sec {
            self.stamp[i].store(sec, Relaxed);
            self.requests[i].store(0, Relaxed);
            self.retries[i].store(0, Relaxed);
        }
        i
    }

    /// Counts a request to the cluster (not its retries).
    #[inline]
    pub fn request(&self, now_ms: u64) {
        bump(&self.requests[self.bucket(now_ms / 1000)]);
    }

    /// Whether a retry would be allowed now (nothing is taken).
    pub fn has_room(&self, now_ms: u64) -> bool {
        let sec = now_ms / 1000;
        let (mut requests, mut retries) = (0u64, 0u64);
        for j in 0..N {
            if sec - self.stamp[j].load(Relaxed).min(sec) < WINDOW_S {
                requests += u64::from(self.requests[j].load(Relaxed));
                retries += u64::from(self.retries[j].load(Relaxed));
            }
        }
        retries < (requests * BUDGET_PERCENT / 100).max(MIN_RETRIES)
    }

    /// Takes one retry from the budget if there is one left; else counts the refusal.
    pub fn try_retry(&self, now_ms: u64) -> bool {
        if self.has_room(now_ms) {
            bump(&self.retries[self.bucket(now_ms / 1000)]);
            true
        } else {
            self.refused.inc();
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_are_held_to_a_fifth_of_the_window_and_the_window_slides() {
        let b = RetryBudget::default();
        let t = 1_000_000_000;
        // A quiet cluster still gets its floor.
        assert!((0..MIN_RETRIES).all(|_| b.try_retry(t)));
        assert!(!b.has_room(t));
        assert!(!b.try_retry(t));
        assert_eq!(b.refused.get(), 1);
        // 50 requests allow 10 retries in all: 7 more.
        for _ in 0..50 {
            b.request(t + 500);
        }
        assert_eq!((0..20).filter(|_| b.try_retry(t + 600)).count(), 7);
        // 9.9 s later the window still holds them; 10 s later it has moved on.
        assert!(!b.try_retry(t + 9_900));
        assert!(b.try_retry(t + 10_000));
        assert_eq!(b.refused.get(), 1 + 13 + 1);
    }
}
