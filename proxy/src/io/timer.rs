//! zgix's own timers: a slab of (deadline, waker) entries the driver fires between turns and parks until, ordered by a deadline heap.
//!
//! A shard has few timers at once (its tick, lingering closes, the drain
//! deadline, sleeps in tests), but firing and finding the earliest never
//! scan them: they sit in a [`Deadlines`] heap keyed by slab id and a
//! sequence number, so a removed or re-used entry is recognised as stale.
//! Socket timeouts are deadlines in the driver's own heap.

use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use super::deadline::Deadlines;
use super::Driver;

#[derive(Default)]
struct Entry {
    in_use: bool,
    fired: bool,
    /// Tells this use of the entry from earlier ones (heap entries carry it).
    seq: u64,
    deadline: Option<Instant>,
    waker: Option<Waker>,
}

/// The timer slab of one driver.
#[derive(Default)]
pub(super) struct Timers {
    entries: Vec<Entry>,
    free: Vec<usize>,
    heap: Deadlines<(usize, u64)>,
    seq: u64,
    armed: usize,
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
        self.seq += 1;
        self.entries[id] = Entry {
            in_use: true,
            fired: false,
            seq: self.seq,
            deadline: Some(deadline),
            waker: None,
        };
        self.armed += 1;
        if self.heap.should_compact() {
            let entries = &self.entries;
            self.heap.compact(|k, at| live(entries, k, at));
        }
        self.heap.push(deadline, (id, self.seq));
        id
    }

    fn remove(&mut self, id: usize) {
        let e = &mut self.entries[id];
        e.deadline = None;
        e.in_use = false;
        e.waker = None;
        self.armed -= 1;
        self.free.push(id);
    }

    /// The earliest armed deadline.
    pub(super) fn next(&mut self) -> Option<Instant> {
        let entries = &self.entries;
        self.heap.prune(|k, at| live(entries, k, at));
        self.heap.next()
    }

    /// Wakes every timer due at `now`; returns how many.
    pub(super) fn fire(&mut self, now: Instant) -> usize {
        let mut n = 0;
        let entries = &mut self.entries;
        self.heap.pop_due(now, |k, at| {
            if !live(entries, k, at) {
                return;
            }
            let e = &mut entries[k.0];
            e.fired = true;
            n += 1;
            if let Some(w) = e.waker.take() {
                w.wake();
            }
        });
        n
    }

    /// Timers armed (tests: a dropped sleep must not stay armed).
    pub(super) fn armed(&self) -> usize {
        self.armed
    }
}

/// Whether heap entry `(id, seq)` at `at` is still an armed, unfired timer.
fn live(entries: &[Entry], (id, seq): (usize, u64), at: Instant) -> bool {
    let e = &entries[id];
    e.in_use && !e.fired && e.seq == seq && e.deadline == Some(at)
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
