//! zgix's own timers: a slab of (deadline, waker) entries the driver fires between turns and parks until.
//!
//! A shard has few timers at once (its tick, lingering closes, the drain
//! deadline, sleeps in tests), so the earliest is found by a scan; socket
//! timeouts are deadlines kept in the socket slots instead.

use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use super::Driver;

#[derive(Default)]
struct Entry {
    in_use: bool,
    fired: bool,
    deadline: Option<Instant>,
    waker: Option<Waker>,
}

/// The timer slab of one driver.
#[derive(Default)]
pub(super) struct Timers {
    entries: Vec<Entry>,
    free: Vec<usize>,
    /// The earliest armed deadline (exact: recomputed on every change).
    next: Option<Instant>,
}

impl Timers {
    fn add(&mut self, deadline: Instant) -> usize {
        let id = match self.free.pop() {
            Some(id) => id,
            None => {
                self.entries.push(Entry::default());
                self.entries.len() - 1
            }
        };
        self.entries[id] = Entry {
            in_use: true,
            fired: false,
            deadline: Some(deadline),
            waker: None,
        };
        if self.next.is_none_or(|n| deadline < n) {
            self.next = Some(deadline);
        }
        id
    }

    fn remove(&mut self, id: usize) {
        let e = &mut self.entries[id];
        let was = e.deadline.take();
        e.in_use = false;
        e.waker = None;
        self.free.push(id);
        if was.is_some() && was == self.next {
            self.recompute();
        }
    }

    fn recompute(&mut self) {
        self.next = self
            .entries
            .iter()
            .filter(|e| e.in_use && !e.fired)
            .filter_map(|e| e.deadline)
            .min();
    }

    pub(super) fn next(&self) -> Option<Instant> {
        self.next
    }

    /// Wakes every timer due at `now`; returns how many.
    pub(super) fn fire(&mut self, now: Instant) -> usize {
        if self.next.is_none_or(|n| now < n) {
            return 0;
        }
        let mut n = 0;
        for e in self.entries.iter_mut() {
            if e.in_use && !e.fired && e.deadline.is_some_and(|d| d <= now) {
                e.fired = true;
                n += 1;
                if let Some(w) = e.waker.take() {
                    w.wake();
                }
            }
        }
        self.recompute();
        n
    }

    /// Timers armed (tests: a dropped sleep must not stay armed).
    pub(super) fn armed(&self) -> usize {
        self.entries.iter().filter(|e| e.in_use).count()
    }
}

/// Completes at its deadline. Dropping it disarms the timer.
pub struct Sleep {
    driver: Rc<Driver>,
    id: Option<usize>,
    deadline: Instant,
    done: bool,
}

impl Sleep {
    pub fn deadline(&self) -> Instant {
        self.deadline
    }
}

impl Future for Sleep {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(());
        }
        let mut st = this.driver.st.borrow_mut();
        let id = match this.id {
            Some(id) => id,
            None => {
                if this.driver.now() >= this.deadline {
                    return Poll::Ready(());
                }
                let id = st.timers.add(this.deadline);
                this.id = Some(id);
                id
            }
        };
        let e = &mut st.timers.entries[id];
        if e.fired {
            st.timers.remove(id);
            this.id = None;
            this.done = true;
            return Poll::Ready(());
        }
        match &e.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => e.waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            self.driver.st.borrow_mut().timers.remove(id);
        }
    }
}

impl Driver {
    /// Completes `d` from now (on the driver's clock).
    pub fn sleep(self: &Rc<Self>, d: Duration) -> Sleep {
        self.sleep_until(self.now() + d)
    }

    /// Completes at `deadline`.
    pub fn sleep_until(self: &Rc<Self>, deadline: Instant) -> Sleep {
        Sleep {
            driver: self.clone(),
            id: None,
            deadline,
            done: false,
        }
    }

    /// Runs `f` for up to `d`; `None` when the time ran out first.
    pub async fn timeout<F: Future>(self: &Rc<Self>, d: Duration, f: F) -> Option<F::Output> {
        let sleep = self.sleep(d);
        futures_lite::future::or(async { Some(f.await) }, async {
            sleep.await;
            None
        })
        .await
    }

    /// Timers armed now.
    pub fn timers_armed(&self) -> usize {
        self.st.borrow().timers.armed()
    }
}
