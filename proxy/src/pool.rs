//! A shard's upstream keep-alive pool: idle connections per endpoint, bounded, newest reused first.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::io::Sock;

struct Idle {
    stream: Sock,
    since: Instant,
}

/// Idle upstream connections of one shard, indexed by endpoint. Only its shard
/// touches it, so it is a plain `RefCell`. Each endpoint's queue is allocated
/// once at its full size; putting and taking never allocates.
pub struct Pool {
    idle: Vec<RefCell<VecDeque<Idle>>>,
    max_idle: usize,
    idle_timeout: Duration,
}

impl Pool {
    pub fn new(endpoints: usize, max_idle: usize, idle_timeout: Duration) -> Pool {
        Pool {
            idle: (0..endpoints)
                .map(|_| RefCell::new(VecDeque::with_capacity(max_idle)))
                .collect(),
            max_idle,
            idle_timeout,
        }
    }

    /// The most recently used idle connection to `endpoint`, if one is fresh.
    /// Newest first: it is the least likely to have been closed by the upstream.
    pub fn take(&self, endpoint: usize, now: Instant) -> Option<Sock> {
        let mut q = self.idle[endpoint].borrow_mut();
        let idle = q.pop_back()?;
        if now.duration_since(idle.since) >= self.idle_timeout {
            // It and everything older has expired.
            q.clear();
            return None;
        }
        Some(idle.stream)
    }

    /// Returns a connection whose last exchange ended cleanly. When the pool is
    /// full the oldest idle connection is closed to make room.
    pub fn put(&self, endpoint: usize, stream: Sock, now: Instant) {
        if self.max_idle == 0 {
            return;
        }
        let mut q = self.idle[endpoint].borrow_mut();
        if q.len() == self.max_idle {
            q.pop_front();
        }
        q.push_back(Idle { stream, since: now });
    }

    /// Closes idle connections past the idle timeout (called from the shard tick).
    pub fn sweep(&self, now: Instant) {
        for q in &self.idle {
            let mut q = q.borrow_mut();
            while q
                .front()
                .is_some_and(|i| now.duration_since(i.since) >= self.idle_timeout)
            {
                q.pop_front();
            }
        }
    }

    /// Drops every idle connection (drain).
    pub fn clear(&self) {
        for q in &self.idle {
            q.borrow_mut().clear();
        }
    }
}

/// True when a pooled connection is still open with nothing unread (see
/// [`Sock::is_stale`]). Used before sending a request that could not be
/// retried (non-idempotent or with a body).
pub fn looks_alive(stream: &Sock) -> bool {
    !stream.is_stale()
}
