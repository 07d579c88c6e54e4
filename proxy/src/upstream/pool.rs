//! A shard's upstream keep-alive pool: idle connections (plain or TLS, which stay TLS) per endpoint, newest reused first, sized by recent demand.
//!
//! The pool follows the demand without being told it. Connections are reused
//! newest first (LIFO), so the oldest idle ones sit at the front untouched
//! while the load needs fewer. Each slot remembers the lowest idle count it
//! reached during the current demand interval ([`DEMAND_INTERVAL`], 10 s):
//! that many connections were idle the *whole* interval, i.e. the interval's
//! peak concurrency did not need them, so the first [`Pool::sweep`] after the
//! interval closes them, oldest first. A steady load of N concurrent requests
//! per endpoint keeps N connections however they interleave; the surplus of a
//! burst is closed 10 to 20 s after it ends; traffic sparser than one request
//! per interval reconnects each time. `max_idle` (`limits.upstream_pool_idle_per_endpoint`) only caps a
//! burst, and connections idle past the idle timeout
//! (`limits.upstream_pool_idle_timeout_ms`) are closed as before.
//!
//! A fixed small cap instead closes a connection on nearly every return once
//! concurrency exceeds it, and reconnects on the next request: 62,478
//! connects in 10 s for 200 clients against a cap of 64 (issue 13).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::upstream::conn::UpConn;

/// How long a connection must have been unneeded before the pool closes it:
/// long enough that a lull between bursts, or a client pausing a few
/// seconds, does not cost a reconnect; short enough that a burst's surplus of
/// origin sockets (and ephemeral ports) is returned quickly.
pub const DEMAND_INTERVAL: Duration = Duration::from_secs(10);

/// Room reserved per endpoint at start; a queue grows (by doubling) only while
/// the demand reaches a new high, never in steady state.
const INITIAL_SLOTS: usize = 64;

struct Idle<S> {
    stream: S,
    since: Instant,
}

struct Slot<S> {
    idle: VecDeque<Idle<S>>,
    /// Fewest idle connections seen since the last sweep.
    low: usize,
}

/// Idle upstream connections of one shard, indexed by endpoint slot. Only its
/// shard touches it, so it is a plain `RefCell`.
pub struct Pool<S = UpConn> {
    slots: Vec<RefCell<Slot<S>>>,
    max_idle: usize,
    idle_timeout: Duration,
    /// When the current demand interval began.
    interval_start: std::cell::Cell<Option<Instant>>,
}

impl<S> Pool<S> {
    pub fn new(endpoints: usize, max_idle: usize, idle_timeout: Duration) -> Pool<S> {
        Pool {
            slots: (0..endpoints)
                .map(|_| {
                    RefCell::new(Slot {
                        idle: VecDeque::with_capacity(max_idle.min(INITIAL_SLOTS)),
                        low: 0,
                    })
                })
                .collect(),
            max_idle,
            idle_timeout,
            interval_start: std::cell::Cell::new(None),
        }
    }

    /// The most recently used idle connection to `endpoint`, if one is fresh.
    /// Newest first: it is the least likely to have been closed by the upstream.
    pub fn take(&self, endpoint: usize, now: Instant) -> Option<S> {
        let mut s = self.slots[endpoint].borrow_mut();
        let idle = s.idle.pop_back();
        let got = match idle {
            Some(i) if now.duration_since(i.since) < self.idle_timeout => Some(i.stream),
            Some(_) => {
                // It and everything older has expired.
                s.idle.clear();
                None
            }
            None => None,
        };
        s.low = s.low.min(s.idle.len());
        got
    }

    /// The oldest idle connection to `endpoint` and since when it is idle
    /// (a retired pool handing its connections over; see `adopt`).
    pub fn take_oldest(&self, endpoint: usize) -> Option<(S, Instant)> {
        let mut s = self.slots[endpoint].borrow_mut();
        let i = s.idle.pop_front()?;
        s.low = s.low.min(s.idle.len());
        Some((i.stream, i.since))
    }

    /// Takes over an idle connection from another pool, keeping its age
    /// (so the idle timeout still counts from its last exchange).
    pub fn adopt(&self, endpoint: usize, stream: S, since: Instant) {
        self.put(endpoint, stream, since);
    }

    /// Returns a connection whose last exchange ended cleanly. Past `max_idle`
    /// the oldest idle connection is closed to make room.
    pub fn put(&self, endpoint: usize, stream: S, now: Instant) {
        if self.max_idle == 0 {
            return;
        }
        let mut s = self.slots[endpoint].borrow_mut();
        if s.idle.len() == self.max_idle {
            s.idle.pop_front();
            s.low = s.low.min(s.idle.len());
        }
        s.idle.push_back(Idle { stream, since: now });
    }

    /// From the shard tick (every second): closes connections idle past the
    /// idle timeout and, once a demand interval is over, those no request
    /// needed during it.
    pub fn sweep(&self, now: Instant) {
        let start = self.interval_start.get().unwrap_or(now);
        let interval_over = now.duration_since(start) >= DEMAND_INTERVAL;
        self.interval_start
            .set(Some(if interval_over { now } else { start }));
        for s in &self.slots {
            let mut s = s.borrow_mut();
            if interval_over {
                let surplus = s.low.min(s.idle.len());
                s.idle.drain(..surplus);
            }
            while s
                .idle
                .front()
                .is_some_and(|i| now.duration_since(i.since) >= self.idle_timeout)
            {
                s.idle.pop_front();
            }
            if interval_over {
                s.low = s.idle.len();
            } else {
                s.low = s.low.min(s.idle.len());
            }
        }
    }

    /// Drops every idle connection to one endpoint (its address changed).
    pub fn retire(&self, endpoint: usize) {
        let mut s = self.slots[endpoint].borrow_mut();
        s.idle.clear();
        s.low = 0;
    }

    /// Idle connections held for `endpoint`.
    pub fn idle(&self, endpoint: usize) -> usize {
        self.slots[endpoint].borrow().idle.len()
    }

    /// Drops every idle connection (drain).
    pub fn clear(&self) {
        for s in &self.slots {
            let mut s = s.borrow_mut();
            s.idle.clear();
            s.low = 0;
        }
    }
}

/// True when a pooled connection is still open with nothing unread (see
/// [`UpConn::is_stale`]). Used before sending a request that could not be
/// retried (non-idempotent or with a body).
pub fn looks_alive(stream: &UpConn) -> bool {
    !stream.is_stale()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: Duration = Duration::from_secs(60);

    /// One round of a closed-loop load with `concurrency` requests in
    /// flight at its peak: every request takes a pooled connection or
    /// "connects", then all are returned. Returns the connects made.
    fn interval(pool: &Pool<u32>, concurrency: usize, t: Instant, next_id: &mut u32) -> usize {
        let mut out = Vec::new();
        let mut connects = 0;
        for _ in 0..concurrency {
            out.push(pool.take(0, t).unwrap_or_else(|| {
                connects += 1;
                *next_id += 1;
                *next_id
            }));
        }
        for c in out {
            pool.put(0, c, t);
        }
        connects
    }

    #[test]
    fn steady_load_reuses_its_connections() {
        let pool: Pool<u32> = Pool::new(1, 1024, MINUTE);
        let t = Instant::now();
        let mut id = 0;
        assert_eq!(interval(&pool, 200, t, &mut id), 200);
        pool.sweep(t);
        for k in 1..=30 {
            let now = t + Duration::from_secs(k);
            assert_eq!(interval(&pool, 200, now, &mut id), 0, "second {k}");
            pool.sweep(now);
            assert_eq!(pool.idle(0), 200);
        }
    }

    #[test]
    fn a_fixed_cap_below_the_load_churns() {
        // What the old fixed pool did: 64 kept, the rest reconnect every time.
        let pool: Pool<u32> = Pool::new(1, 64, MINUTE);
        let t = Instant::now();
        let mut id = 0;
        interval(&pool, 200, t, &mut id);
        assert_eq!(interval(&pool, 200, t, &mut id), 136);
    }

    #[test]
    fn the_surplus_of_a_burst_closes_within_one_interval() {
        let pool: Pool<u32> = Pool::new(1, 1024, MINUTE);
        let t = Instant::now();
        let mut id = 0;
        pool.sweep(t);
        interval(&pool, 300, t, &mut id);
        let t1 = t + DEMAND_INTERVAL;
        pool.sweep(t1);
        assert_eq!(pool.idle(0), 300, "needed in this interval");
        for k in 1..10 {
            let now = t1 + Duration::from_secs(k);
            interval(&pool, 20, now, &mut id);
            pool.sweep(now);
            assert_eq!(pool.idle(0), 300, "the interval is not over");
        }
        let t2 = t1 + DEMAND_INTERVAL;
        pool.sweep(t2);
        assert_eq!(pool.idle(0), 20, "280 sat idle the whole interval");
        // A quiet interval closes everything.
        pool.sweep(t2 + DEMAND_INTERVAL);
        assert_eq!(pool.idle(0), 0);
    }

    #[test]
    fn expired_connections_are_never_handed_out() {
        let pool: Pool<u32> = Pool::new(2, 8, Duration::from_millis(100));
        let t = Instant::now();
        pool.put(1, 7, t);
        pool.put(1, 8, t + Duration::from_millis(50));
        assert_eq!(pool.take(1, t + Duration::from_millis(120)), Some(8));
        assert_eq!(pool.take(1, t + Duration::from_millis(120)), None);
        pool.put(0, 1, t);
        pool.sweep(t + Duration::from_millis(100));
        assert_eq!(pool.idle(0), 0);
    }

    #[test]
    fn bound_zero_disables_and_retire_empties_one_endpoint() {
        let pool: Pool<u32> = Pool::new(2, 0, MINUTE);
        let t = Instant::now();
        pool.put(0, 1, t);
        assert_eq!(pool.take(0, t), None);
        let pool: Pool<u32> = Pool::new(2, 4, MINUTE);
        for i in 0..6 {
            pool.put(0, i, t);
            pool.put(1, i, t);
        }
        assert_eq!(pool.idle(0), 4, "bounded");
        pool.retire(0);
        assert_eq!((pool.idle(0), pool.idle(1)), (0, 4));
        assert_eq!(pool.take(1, t), Some(5), "newest first");
    }

    #[test]
    fn a_handed_over_connection_keeps_its_age() {
        let old: Pool<u32> = Pool::new(1, 8, Duration::from_millis(100));
        let new: Pool<u32> = Pool::new(2, 8, Duration::from_millis(100));
        let t = Instant::now();
        old.put(0, 1, t);
        old.put(0, 2, t + Duration::from_millis(60));
        while let Some((c, since)) = old.take_oldest(0) {
            new.adopt(1, c, since);
        }
        assert_eq!(old.idle(0), 0);
        assert_eq!(new.idle(1), 2);
        // 1 is past the idle timeout at 110 ms; 2 (newest, on top) is not.
        assert_eq!(new.take(1, t + Duration::from_millis(110)), Some(2));
        assert_eq!(new.take(1, t + Duration::from_millis(110)), None);
    }
}
