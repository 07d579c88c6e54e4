//! A shard's socket driver: one io_uring ring (or, as the fallback, one epoll set) carrying every accept, connect, read, write, deadline and wake-up of the shard.
//!
//! # Shape
//!
//! Each shard runs one [`Driver`] inside its glommio executor. The driver owns
//! a table of slots, one per socket (client, upstream, listener), and a small
//! set of timers. Tasks wait on a slot's read or write side or on a timer; a
//! single driver task ([`Driver::run`]) moves completions into the slots and
//! wakes the tasks. Two backends sit behind it:
//!
//! - [`uring`]: zgix's own ring, `SINGLE_ISSUER | DEFER_TASKRUN | COOP_TASKRUN
//!   | TASKRUN_FLAG | SUBMIT_ALL`. Client and upstream sockets receive with
//!   multishot `recv` into a per-shard provided-buffer ring, listeners accept
//!   with multishot `accept`, sends and connects are SQEs that the driver
//!   submits once per executor turn together with the reaping of completions.
//!   Sends are tried inline (`MSG_DONTWAIT`); a shard about to park leaves
//!   them for the park's `io_uring_enter`, which submits them and sleeps
//!   until the next event past their completions ([`Turn`]).
//!   With `DEFER_TASKRUN` the kernel never interrupts the shard for a
//!   completion: it queues the work until the shard asks for it (the
//!   `IORING_SQ_TASKRUN` flag says when), so a busy shard pays no syscall and
//!   no cross-core interrupt per event.
//! - [`epoll`]: non-blocking `recv`/`send`/`accept4`/`connect` on readiness
//!   from an edge-triggered epoll set; what runs where a ring is refused.
//!
//! # Parking
//!
//! When a shard has nothing to do it sleeps in the backend's wait
//! (`io_uring_enter` with a timeout, or `epoll_wait`), on the shard thread,
//! until the earliest deadline or timer. Everything a parked shard must wake
//! for is on the ring or in the set: sockets, accepts, connects, the drain
//! notification from the main thread (an eventfd, [`Notifier`]) and zgix's
//! own timers (the shard tick, lingering closes, the drain deadline, every
//! socket timeout). glommio's own timers and sockets are not used by the
//! shard at all, so no polling loop or periodic nudge is needed.

mod addr;
mod buf;
pub mod epoll;
mod sock;
mod timer;
pub mod uring;

#[cfg(test)]
mod tests;

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::io;
use std::os::fd::RawFd;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::Waker;
use std::time::{Duration, Instant};

pub use addr::{bind_listener, local_addr, peer_addr};
pub use buf::Buf;
pub use sock::{Listener, Sock};
pub use timer::Sleep;

/// glommio's preemption timer for a shard. zgix's tasks yield to each other
/// through the driver, and nothing of the shard's waits on glommio's
/// reactor, so this only bounds how long glommio goes without turning its
/// own (idle) loop. A parked shard is not woken by it: with `DEFER_TASKRUN`
/// on zgix's ring (and epoll's wait), glommio's completions are run as task
/// work inside the wait without ending it.
pub const PREEMPT_EVERY: Duration = Duration::from_millis(250);

/// Empty turns, each followed by a yield, before the driver may park: tasks
/// woken by other tasks get their turns first.
const PARK_AFTER_EMPTY_TURNS: u32 = 2;

/// What one turn of the driver does in the kernel.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(super) enum Turn {
    /// Submit what is queued and reap completions, without sleeping.
    Poll,
    /// Reap completions; enter the kernel only if it has completions or
    /// deferred work for us, leaving queued sends for the park that follows
    /// (at most [`uring::MAX_DEFERRED_TURNS`] turns in a row). On epoll, no
    /// syscall: the park's wait collects what is ready.
    Lazy,
    /// The driver parks: submit, then sleep until an event other than the
    /// inline sends just submitted, or the timeout.
    Park(Duration),
    /// Submit, then sleep until any completion or the timeout.
    Wait(Duration),
}

impl Turn {
    fn timeout(self) -> Option<Duration> {
        match self {
            Turn::Poll | Turn::Lazy => None,
            Turn::Park(t) | Turn::Wait(t) => Some(t),
        }
    }
}

/// Which backend a driver runs.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    Uring,
    Epoll,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Uring => "uring",
            Kind::Epoll => "epoll",
        }
    }
}

/// How a driver is set up.
#[derive(Clone, Debug)]
pub struct Options {
    pub kind: Kind,
    /// How long to keep turning after the last event before parking.
    pub spin: Duration,
    /// Provided buffers (uring): count (a power of two) and size.
    pub recv_buffers: u32,
    pub recv_buffer_bytes: u32,
    /// Completion queue entries (uring); the SQ is a quarter of it.
    pub cq_entries: u32,
}

impl Options {
    pub fn new(kind: Kind) -> Options {
        Options {
            kind,
            spin: Duration::ZERO,
            recv_buffers: zgix_config::DEFAULT_RECV_BUFFERS,
            recv_buffer_bytes: zgix_config::DEFAULT_RECV_BUFFER_BYTES,
            cq_entries: 4096,
        }
    }
}

/// Counters a driver keeps (read by tests and `/metrics`).
#[derive(Default, Debug)]
pub struct DriverStats {
    /// Times the driver entered the kernel (io_uring_enter or epoll_wait).
    pub enters: Cell<u64>,
    /// Times it slept (parked) there.
    pub parks: Cell<u64>,
    /// Multishot receives re-armed after the buffer ring ran dry (`ENOBUFS`).
    pub recv_rearm_nobufs: Cell<u64>,
    /// Multishot receives re-armed after the kernel ended them for another
    /// reason (a full completion queue, backpressure).
    pub recv_rearm_other: Cell<u64>,
    /// Receives paused because a socket had too much unread data queued.
    pub recv_paused: Cell<u64>,
    /// Completion-queue overflows seen (the kernel kept the entries).
    pub cq_overflows: Cell<u64>,
    /// Sends that waited in the kernel for room because the socket was full
    /// (the inline attempt got `EAGAIN`, or the previous send was short).
    pub sends_waited: Cell<u64>,
}

/// Wakes a shard's driver from another thread (the drain, a reload).
pub struct Notifier {
    fd: RawFd,
    /// Bumped by every `notify`; the shard compares it with what it saw.
    pub seq: AtomicU64,
}

impl Notifier {
    fn new() -> io::Result<Notifier> {
        // SAFETY: plain syscall; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Notifier {
            fd,
            seq: AtomicU64::new(0),
        })
    }

    /// Wakes the shard (it then runs its notification waiters).
    pub fn notify(&self) {
        self.seq.fetch_add(1, Ordering::AcqRel);
        let one: u64 = 1;
        // SAFETY: fd is an open eventfd; writing 8 bytes is its protocol.
        unsafe { libc::write(self.fd, (&one as *const u64).cast(), 8) };
    }

    fn drain(&self) {
        let mut v: u64 = 0;
        // SAFETY: fd is an open non-blocking eventfd; v is 8 writable bytes.
        unsafe { libc::read(self.fd, (&mut v as *mut u64).cast(), 8) };
    }
}

impl Drop for Notifier {
    fn drop(&mut self) {
        // SAFETY: the eventfd is owned here and closed once.
        unsafe { libc::close(self.fd) };
    }
}

/// What a slot is for.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
enum Role {
    #[default]
    Stream,
    Listener,
}

/// A kernel operation a slot can have in flight besides its receive (uring).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
enum Op {
    #[default]
    Idle,
    InFlight,
    /// Cancellation requested (a deadline passed or the waiter went away).
    Cancelling,
    Done(i32),
}

/// One socket's state in the driver.
#[derive(Default)]
struct Slot {
    in_use: bool,
    gen: u32,
    fd: RawFd,
    role: Role,
    /// Set when the owner dropped its handle; freed once no kernel op refers to it.
    closed: bool,
    /// epoll: an edge said readable / writable and no syscall has said otherwise since.
    readable: bool,
    writable: bool,
    /// The peer closed or the socket failed: reads return EOF (or `error`) from now on.
    hup: bool,
    /// errno of a failed receive, or 0.
    error: i32,
    /// The read side's waiter (also accepts, for listeners) and the write
    /// side's (sends, connects): a reader and a writer may wait at once.
    rd: Side,
    wr: Side,
    // --- uring receive state ---
    /// Received buffers not yet copied out: a list through `Ring::meta`.
    rq_head: u16,
    rq_tail: u16,
    rq_len: u16,
    /// Bytes of the head buffer already copied out.
    rq_off: u32,
    recv_armed: bool,
    /// The receive was stopped because `rq_len` reached its cap.
    recv_paused: bool,
    /// The receive ended with `ENOBUFS` and waits for a buffer to come back;
    /// meanwhile reads are plain `recv` calls on a readiness poll.
    recv_starved: bool,
    /// That readiness poll is armed.
    poll_armed: bool,
    /// Send or connect in flight.
    op: Op,
    /// The send in flight was submitted with `MSG_DONTWAIT` (it completes
    /// within the submitting `io_uring_enter`, `EAGAIN` if the socket is full).
    send_inline: bool,
    /// The last send found the socket's buffer full (`EAGAIN` or a short
    /// write): the next one waits for room in the kernel instead.
    send_full: bool,
    /// Kernel operations that refer to this slot (the slot is not reused before 0).
    ops: u8,
    /// Accepted descriptors not yet taken (listeners).
    accepted: VecDeque<RawFd>,
    /// Accept errors not yet reported (listeners, uring).
    accept_error: i32,
}

/// One direction's waiter, its deadline, and whether that deadline passed.
#[derive(Default)]
struct Side {
    waker: Option<Waker>,
    deadline: Option<Instant>,
    timed_out: bool,
}

impl Side {
    /// Parks `cx` here until woken or `deadline`; `Err` if it already passed.
    fn wait(
        &mut self,
        cx: &std::task::Context<'_>,
        deadline: Option<Instant>,
        now: Instant,
    ) -> io::Result<()> {
        if std::mem::take(&mut self.timed_out) {
            return Err(timed_out());
        }
        if let Some(d) = deadline {
            if now >= d {
                return Err(timed_out());
            }
        }
        self.deadline = deadline;
        match &self.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => self.waker = Some(cx.waker().clone()),
        }
        Ok(())
    }

    fn wake(&mut self) {
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }
}

fn timed_out() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "operation timed out")
}

const NO_BUF: u16 = u16::MAX;

/// The slot table and timers, borrowed only inside driver methods.
struct State {
    slots: Vec<Slot>,
    free: Vec<u32>,
    timers: timer::Timers,
    /// No slot deadline is earlier than this (it may be early, never late).
    next_expiry: Option<Instant>,
}

#[allow(clippy::large_enum_variant)] // one per shard, never moved
enum Backend {
    Uring(uring::Ring),
    Epoll(epoll::Epoll),
}

/// A shard's driver. Shared by its tasks through `Rc`; never leaves the thread.
pub struct Driver {
    backend: Backend,
    st: RefCell<State>,
    stopped: Cell<bool>,
    spin: Duration,
    clock: Cell<Instant>,
    clock_live: Cell<bool>,
    notifier: Arc<Notifier>,
    /// The notifier sequence the shard has seen, and who waits for the next.
    notified_seen: Cell<u64>,
    notify_wakers: RefCell<Vec<Waker>>,
    pub stats: DriverStats,
}

impl Driver {
    /// Creates a driver of `opts.kind`; a uring driver that the kernel
    /// refuses is reported as the error (the caller decides to fall back).
    pub fn new(opts: &Options) -> io::Result<Rc<Driver>> {
        let notifier = Arc::new(Notifier::new()?);
        let backend = match opts.kind {
            Kind::Uring => Backend::Uring(uring::Ring::new(opts, notifier.fd)?),
            Kind::Epoll => Backend::Epoll(epoll::Epoll::new(notifier.fd)?),
        };
        let now = Instant::now();
        Ok(Rc::new(Driver {
            backend,
            st: RefCell::new(State {
                slots: Vec::with_capacity(1024),
                free: Vec::with_capacity(1024),
                timers: timer::Timers::default(),
                next_expiry: None,
            }),
            stopped: Cell::new(false),
            spin: opts.spin,
            clock: Cell::new(now),
            clock_live: Cell::new(false),
            notifier,
            notified_seen: Cell::new(0),
            notify_wakers: RefCell::new(Vec::new()),
            stats: DriverStats::default(),
        }))
    }

    /// A uring driver, or an epoll one with the reason when the ring is
    /// refused: the start-up path of a shard.
    pub fn new_or_fallback(opts: &Options) -> io::Result<(Rc<Driver>, Option<io::Error>)> {
        match Driver::new(opts) {
            Ok(d) => Ok((d, None)),
            Err(e) if opts.kind == Kind::Uring => {
                let mut o = opts.clone();
                o.kind = Kind::Epoll;
                Ok((Driver::new(&o)?, Some(e)))
            }
            Err(e) => Err(e),
        }
    }

    pub fn kind(&self) -> Kind {
        match self.backend {
            Backend::Uring(_) => Kind::Uring,
            Backend::Epoll(_) => Kind::Epoll,
        }
    }

    /// The handle other threads use to wake this shard.
    pub fn notifier(&self) -> Arc<Notifier> {
        self.notifier.clone()
    }

    /// Waits for the next [`Notifier::notify`] after the last one this shard saw.
    pub async fn notified(self: &Rc<Self>) {
        std::future::poll_fn(|cx| {
            let seq = self.notifier.seq.load(Ordering::Acquire);
            if seq != self.notified_seen.get() {
                self.notified_seen.set(seq);
                return std::task::Poll::Ready(());
            }
            let mut w = self.notify_wakers.borrow_mut();
            if !w.iter().any(|x| x.will_wake(cx.waker())) {
                w.push(cx.waker().clone());
            }
            std::task::Poll::Pending
        })
        .await
    }

    /// Runs the notification waiters; `drain` resets an eventfd that no
    /// armed read consumed (epoll).
    fn wake_notified(&self, drain: bool) {
        if drain {
            self.notifier.drain();
        }
        for w in self.notify_wakers.borrow_mut().drain(..) {
            w.wake();
        }
    }

    /// The time for deadlines and pool ages: what the driver read at its last
    /// turn while it is turning, else a fresh read.
    pub fn now(&self) -> Instant {
        if self.clock_live.get() {
            self.clock.get()
        } else {
            Instant::now()
        }
    }

    /// Ends [`Driver::run`] at its next turn.
    pub fn stop(&self) {
        self.stopped.set(true);
    }

    /// The driver task: turns while there is traffic, parks otherwise.
    pub async fn run(self: Rc<Self>) {
        let mut last_event = Instant::now();
        let mut empty_turns = 0u32;
        while !self.stopped.get() {
            // With no spin a quiet turn is followed by a park, which submits
            // what the tasks queued together with its wait: one enter, not two.
            let lazy = self.spin.is_zero() && empty_turns < PARK_AFTER_EMPTY_TURNS;
            let n = self.turn(if lazy { Turn::Lazy } else { Turn::Poll });
            let now = Instant::now();
            self.clock.set(now);
            self.clock_live.set(true);
            let fired = self.expire(now);
            if n + fired > 0 {
                last_event = now;
                empty_turns = 0;
            } else {
                empty_turns = empty_turns.saturating_add(1);
            }
            let quiet = now.duration_since(last_event) >= self.spin
                && empty_turns >= PARK_AFTER_EMPTY_TURNS
                && !glommio::executor().need_preempt();
            if quiet {
                let until = self.next_wake().map(|d| d.saturating_duration_since(now));
                self.clock_live.set(false);
                self.stats.parks.set(self.stats.parks.get() + 1);
                if self.turn(Turn::Park(until.unwrap_or(Duration::from_secs(3600)))) > 0 {
                    last_event = Instant::now();
                    empty_turns = 0;
                }
                self.clock.set(Instant::now());
                self.clock_live.set(true);
                self.expire(self.clock.get());
            }
            glommio::executor().yield_now().await;
        }
        // Hand the kernel what the last round queued (the cancels of the
        // sockets and listeners just dropped, so they close now, not when
        // the process exits) and let its deferred work run.
        self.turn(Turn::Poll);
        self.turn(Turn::Wait(Duration::from_millis(1)));
        self.clock_live.set(false);
    }

    /// Submits what is queued (a lazy turn may leave it for the park) and
    /// dispatches what completed; a park or wait sleeps up to its timeout
    /// for an event. Returns events handled.
    fn turn(&self, how: Turn) -> usize {
        match &self.backend {
            Backend::Uring(r) => r.turn(self, how),
            // epoll learns of events only from a wait, and the park that
            // follows a lazy turn waits (returning at once if any are ready).
            Backend::Epoll(_) if how == Turn::Lazy => 0,
            Backend::Epoll(e) => e.turn(self, how.timeout()),
        }
    }

    /// Blocks until slot `token`'s send or connect is no longer in flight
    /// (used when its waiter is dropped: the kernel may still read the buffer).
    fn wait_op_done(&self, token: u32) {
        loop {
            let busy = {
                let st = self.st.borrow();
                matches!(st.slots[token as usize].op, Op::InFlight | Op::Cancelling)
            };
            if !busy {
                return;
            }
            self.turn(Turn::Wait(Duration::from_millis(100)));
        }
    }

    /// Registers a socket of `role` and returns its token; `arm` starts its
    /// receive at once (not for a socket still connecting).
    fn register(&self, fd: RawFd, role: Role, arm: bool) -> io::Result<u32> {
        let token = {
            let mut st = self.st.borrow_mut();
            let token = match st.free.pop() {
                Some(t) => t,
                None => {
                    st.slots.push(Slot::default());
                    (st.slots.len() - 1) as u32
                }
            };
            let s = &mut st.slots[token as usize];
            let gen = s.gen.wrapping_add(1) & 0x00ff_ffff;
            let accepted = std::mem::take(&mut s.accepted);
            *s = Slot {
                in_use: true,
                gen,
                fd,
                role,
                readable: true,
                writable: true,
                rq_head: NO_BUF,
                rq_tail: NO_BUF,
                accepted,
                ..Slot::default()
            };
            token
        };
        let r = match &self.backend {
            Backend::Uring(r) => r.register(self, token, arm),
            Backend::Epoll(e) => e.register(self, fd, token, role),
        };
        if let Err(e) = r {
            let mut st = self.st.borrow_mut();
            st.slots[token as usize].in_use = false;
            st.free.push(token);
            return Err(e);
        }
        Ok(token)
    }

    /// The owner let go of `token`: stop its kernel work, close the socket,
    /// free the slot once nothing refers to it.
    fn release(&self, token: u32) {
        match &self.backend {
            Backend::Uring(r) => r.release(self, token),
            Backend::Epoll(e) => e.release(self, token),
        }
    }

    /// Frees a slot with no kernel op left (called by the backends).
    fn free_slot(st: &mut State, token: u32) {
        let s = &mut st.slots[token as usize];
        s.in_use = false;
        s.rd = Side::default();
        s.wr = Side::default();
        for fd in s.accepted.drain(..) {
            // SAFETY: accepted descriptors nobody took are ours to close.
            unsafe { libc::close(fd) };
        }
        st.free.push(token);
    }

    fn note_deadline(st: &mut State, d: Instant) {
        if st.next_expiry.is_none_or(|n| d < n) {
            st.next_expiry = Some(d);
        }
    }

    fn next_wake(&self) -> Option<Instant> {
        let st = self.st.borrow();
        match (st.next_expiry, st.timers.next()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Fires due timers and times out due socket waits. Returns how many fired.
    fn expire(&self, now: Instant) -> usize {
        let mut fired = 0;
        let mut wake: [Option<Waker>; 32] = Default::default();
        let mut nwake = 0;
        {
            let mut st = self.st.borrow_mut();
            fired += st.timers.fire(now);
            if st.next_expiry.is_none_or(|d| now < d) {
                return fired;
            }
            let mut next: Option<Instant> = None;
            for s in st.slots.iter_mut() {
                if !s.in_use {
                    continue;
                }
                for side in [&mut s.rd, &mut s.wr] {
                    if side.waker.is_none() {
                        continue;
                    }
                    match side.deadline {
                        Some(d) if now >= d => {
                            side.timed_out = true;
                            side.deadline = None;
                            fired += 1;
                            if let Some(w) = side.waker.take() {
                                if nwake < wake.len() {
                                    wake[nwake] = Some(w);
                                    nwake += 1;
                                } else {
                                    w.wake();
                                }
                            }
                        }
                        Some(d) => next = Some(next.map_or(d, |n| n.min(d))),
                        None => {}
                    }
                }
            }
            st.next_expiry = next;
        }
        for w in wake.iter_mut().take(nwake) {
            if let Some(w) = w.take() {
                w.wake();
            }
        }
        fired
    }

    /// Slots in use (tests: a released socket must not stay registered).
    pub fn slots_in_use(&self) -> usize {
        self.st.borrow().slots.iter().filter(|s| s.in_use).count()
    }

    /// Provided buffers currently held by sockets (uring; 0 for epoll).
    pub fn buffers_held(&self) -> usize {
        match &self.backend {
            Backend::Uring(r) => r.buffers_held(),
            Backend::Epoll(_) => 0,
        }
    }
}
