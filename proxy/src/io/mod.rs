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
//!   with single `accept`s submitted as the accept loop asks (none while it
//!   is paused at the cap), sends (of driver-owned copies of the bytes) and
//!   connects are SQEs that the driver submits once per executor turn
//!   together with the reaping of completions.
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
//! Both sit below one interface ([`ops`]): registering, closing, reading,
//! writing, connecting and accepting are written once, and each backend
//! keeps its own per-socket state ([`uring::USock`], [`epoll::ESock`]).
//! Socket deadlines and timers live in a heap ([`deadline`]): expiry costs
//! the waits that expire, not a scan of every socket. A socket's next wait
//! with the same timeout keeps the entry it has (moved when it comes up), so
//! a keep-alive request costs the heap nothing.
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
//! shard at all, so no polling loop or periodic nudge is needed. A task
//! woken by another task rather than by a completion (a listener resumed, a
//! connection closed under the cap) is not visible to the driver: the waker
//! calls [`Driver::kick`] so the driver yields again before it parks.
//! [`watch`] looks at each listener once a second and restarts one left
//! waiting with connections in its backlog (`zgix_accept_stalls_total`).

mod addr;
mod buf;
mod deadline;
pub mod epoll;
mod gather;
mod notify;
mod ops;
mod record_buf;
mod record_stream;
mod sock;
mod timer;
pub mod uring;
mod watch;

#[cfg(test)]
pub(crate) mod tests;
#[cfg(test)]
mod tests_gather;
#[cfg(test)]
mod tests_lend;
#[cfg(test)]
mod tests_soundness;

use std::cell::{Cell, RefCell};
use std::io;
use std::os::fd::RawFd;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Waker};
use std::time::{Duration, Instant};

pub use addr::{bind_listener, local_addr, peer_addr};
pub use buf::Buf;
pub use gather::{Gather, GATHER_FRAMING, GATHER_IOVS};
pub use notify::Notifier;
pub use ops::Relayed;
#[cfg(test)]
pub use record_buf::record_buffers_taken;
pub use record_buf::{put_record_buffer, put_send_buffer, take_record_buffer, take_send_buffer};
pub use record_stream::RecordStream;
pub use sock::{Lent, Listener, Pipe, Sock};
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
    /// The longest a park that counted inline sends sleeps (uring;
    /// [`uring::INLINE_PARK_MAX`]); the driver tests shorten or lengthen it
    /// to tell a park that slept to it from one that did not, and
    /// `ZGIX_INLINE_BACKSTOP_MS` sets it for diagnosis.
    pub inline_backstop: Duration,
}

impl Options {
    pub fn new(kind: Kind) -> Options {
        Options {
            kind,
            spin: Duration::ZERO,
            recv_buffers: zgix_config::DEFAULT_RECV_BUFFERS,
            recv_buffer_bytes: zgix_config::DEFAULT_RECV_BUFFER_BYTES,
            cq_entries: 4096,
            inline_backstop: uring::INLINE_PARK_MAX,
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
    /// Parks (uring) that counted inline sends and slept until the
    /// backstop ([`Options::inline_backstop`]) with no other event: an
    /// inline send came back short, or one before a close was counted.
    pub backstop_parks: Cell<u64>,
    /// Relayed sends (uring: received buffers sent on without a copy) and
    /// the bytes they carried.
    pub relayed_sends: Cell<u64>,
    pub relayed_bytes: Cell<u64>,
    /// Gathered sends (both backends: one vectored `sendmsg` of framing
    /// and ranges of a receive buffer, `Sock::write_all_gather`) and the
    /// bytes of theirs that came from the buffer without a copy.
    pub gathered_sends: Cell<u64>,
    pub gathered_bytes: Cell<u64>,
    /// Bytes moved socket to socket through a pipe with splice (both backends).
    pub spliced_bytes: Cell<u64>,
    /// Relays that found the shard's pipes all in use (or `pipe2` refused)
    /// and copied through the exchange's buffer instead.
    pub splice_fallbacks: Cell<u64>,
    /// Deadline entries the expiry looked at (each due, stale or moved entry
    /// once: the work of timing sockets out, O(expired), never a scan of them
    /// all).
    pub deadline_visits: Cell<u64>,
    /// Listeners the accept watchdog found stalled (waiting, not paused,
    /// connections in the backlog, none taken for a second) and restarted.
    pub accept_stalls: Cell<u64>,
}

/// What a slot is for.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
enum Role {
    #[default]
    Stream,
    Listener,
}

/// One socket's state in the driver: what every backend keeps, and the
/// backend's own part ([`SlotBe`]).
#[derive(Default)]
struct Slot {
    in_use: bool,
    gen: u32,
    fd: RawFd,
    role: Role,
    /// Set when the owner dropped its handle; freed (and its descriptor
    /// closed) once no kernel operation names it.
    closed: bool,
    /// The peer closed or the socket failed: reads return EOF (or `error`) from now on.
    hup: bool,
    /// errno of a failed receive, or 0.
    error: i32,
    /// A listener whose owner paused accepting.
    paused: bool,
    /// The read side's waiter (also accepts, for listeners) and the write
    /// side's (sends, connects): a reader and a writer may wait at once.
    rd: Side,
    wr: Side,
    be: SlotBe,
}

/// A backend's own per-socket state.
enum SlotBe {
    Uring(uring::USock),
    Epoll(epoll::ESock),
}

impl Default for SlotBe {
    fn default() -> Self {
        SlotBe::Epoll(epoll::ESock::default())
    }
}

impl SlotBe {
    fn u(&mut self) -> &mut uring::USock {
        match self {
            SlotBe::Uring(u) => u,
            SlotBe::Epoll(_) => unreachable!("a ring slot on the epoll backend"),
        }
    }

    fn e(&mut self) -> &mut epoll::ESock {
        match self {
            SlotBe::Epoll(e) => e,
            SlotBe::Uring(_) => unreachable!("an epoll slot on the ring backend"),
        }
    }
}

/// Which side of a slot a deadline belongs to.
const RD: u8 = 0;
const WR: u8 = 1;

/// One direction's waiter, its deadline, and whether that deadline passed.
#[derive(Default)]
struct Side {
    waker: Option<Waker>,
    deadline: Option<Instant>,
    timed_out: bool,
    /// The time of this side's entry in the deadline heap, if it has one:
    /// at or before `deadline` while a wait has one (a later deadline moves
    /// the entry when it comes up; see [`deadline`]).
    queued: Option<Instant>,
}

impl Side {
    /// Parks `cx` here until woken or `deadline`; `Err` if it already passed.
    fn wait(
        &mut self,
        cx: &Context<'_>,
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
        self.set_waker(cx);
        Ok(())
    }

    fn set_waker(&mut self, cx: &Context<'_>) {
        match &self.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => self.waker = Some(cx.waker().clone()),
        }
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

/// A socket deadline's key: token, generation, side.
type DeadlineKey = (u32, u32, u8);

/// The slot table and timers, borrowed only inside driver methods.
struct State {
    slots: Vec<Slot>,
    free: Vec<u32>,
    timers: timer::Timers,
    /// Every socket wait's deadline (stale entries are skipped).
    deadlines: deadline::Deadlines<DeadlineKey>,
    /// The listeners the accept watchdog looks at ([`watch`]).
    listeners: Vec<watch::Watched>,
}

impl State {
    /// Parks `cx` on side `which` of `token` until woken or `deadline`
    /// (`Err` once it passed), arming the deadline when it is new.
    fn wait_side(
        &mut self,
        token: u32,
        which: u8,
        cx: &Context<'_>,
        deadline: Option<Instant>,
        now: Instant,
    ) -> io::Result<()> {
        let s = &mut self.slots[token as usize];
        let gen = s.gen;
        let side = if which == RD { &mut s.rd } else { &mut s.wr };
        side.wait(cx, deadline, now)?;
        // An entry at or before the deadline is in the heap already (the
        // common case: the same timeout from a later `now`): it moves when
        // it comes up. Only an earlier deadline is pushed.
        if let Some(d) = deadline.filter(|d| side.queued.is_none_or(|q| q > *d)) {
            side.queued = Some(d);
            self.arm_deadline(d, (token, gen, which));
        }
        Ok(())
    }

    fn arm_deadline(&mut self, d: Instant, key: DeadlineKey) {
        if self.deadlines.should_compact() {
            let slots = &self.slots;
            self.deadlines.compact(|k, at| deadline_live(slots, k, at));
        }
        self.deadlines.push(d, key);
    }
}

/// Whether deadline entry `key` at `at` is its side's heap entry (others
/// are stale: the slot was reused, or an earlier deadline superseded it).
fn deadline_live(slots: &[Slot], (token, gen, which): DeadlineKey, at: Instant) -> bool {
    let Some(s) = slots.get(token as usize) else {
        return false;
    };
    let side = if which == RD { &s.rd } else { &s.wr };
    s.in_use && s.gen == gen && side.queued == Some(at)
}

/// Where the side's entry `key` at `at` stands now: `None` if stale or its
/// side waits no more (the side then has no entry), else the deadline of
/// the wait (at or after `at`).
fn deadline_moved(slots: &mut [Slot], key: DeadlineKey, at: Instant) -> Option<Instant> {
    if !deadline_live(slots, key, at) {
        return None;
    }
    let s = &mut slots[key.0 as usize];
    let side = if key.2 == RD { &mut s.rd } else { &mut s.wr };
    let waiting = side.deadline.filter(|_| side.waker.is_some());
    side.queued = waiting;
    waiting
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
    /// A task was woken outside a turn (see [`Driver::kick`]).
    kicked: Cell<bool>,
    spin: Duration,
    clock: Cell<Instant>,
    clock_live: Cell<bool>,
    notifier: Arc<Notifier>,
    /// The notifier sequence the shard has seen, and who waits for the next.
    notified_seen: Cell<u64>,
    notify_wakers: RefCell<Vec<Waker>>,
    /// Idle pipes for splicing (epoll), and how many are out.
    pipes: RefCell<Vec<Rc<sock::PipeFds>>>,
    pipes_out: Cell<usize>,
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
                deadlines: deadline::Deadlines::default(),
                listeners: Vec::new(),
            }),
            stopped: Cell::new(false),
            kicked: Cell::new(false),
            spin: opts.spin,
            clock: Cell::new(now),
            clock_live: Cell::new(false),
            notifier,
            notified_seen: Cell::new(0),
            notify_wakers: RefCell::new(Vec::new()),
            pipes: RefCell::new(Vec::new()),
            pipes_out: Cell::new(0),
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

    /// A task was woken by another task, not by a completion (a listener
    /// resumed, a connection closed under the cap): the driver yields again
    /// before it may park, so the woken task runs (and submits what it
    /// arms) first. Without it a park could sleep, until its next timer,
    /// in front of a task that was ready to run.
    pub fn kick(&self) {
        self.kicked.set(true);
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
            if n + fired > 0 || self.kicked.take() {
                last_event = now;
                empty_turns = 0;
            } else {
                empty_turns = empty_turns.saturating_add(1);
            }
            // Cheapest test first: most turns are not the second empty one,
            // and without a spin the time since the last event is not needed.
            let quiet = empty_turns >= PARK_AFTER_EMPTY_TURNS
                && (self.spin.is_zero() || now.duration_since(last_event) >= self.spin)
                && !glommio::executor().need_preempt();
            if quiet {
                let until = self.next_wake().map(|d| d.saturating_duration_since(now));
                self.clock_live.set(false);
                self.stats.parks.set(self.stats.parks.get() + 1);
                let woke = self.turn(Turn::Park(until.unwrap_or(Duration::from_secs(3600)))) > 0;
                // One clock read per wake-up, for the last event and for
                // every deadline the woken tasks arm.
                let now = Instant::now();
                if woke {
                    last_event = now;
                    empty_turns = 0;
                }
                self.clock.set(now);
                self.clock_live.set(true);
                self.expire(now);
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

    fn next_wake(&self) -> Option<Instant> {
        let mut st = self.st.borrow_mut();
        let st = &mut *st;
        let slots = &mut st.slots;
        st.deadlines
            .prune_moving(|k, at| deadline_moved(slots, k, at));
        match (st.deadlines.next(), st.timers.next()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Fires due timers and times out due socket waits. Returns how many
    /// fired; the work is the due (and stale) heap entries, not the sockets.
    fn expire(&self, now: Instant) -> usize {
        let mut st = self.st.borrow_mut();
        let st = &mut *st;
        let mut fired = st.timers.fire(now);
        let slots = &mut st.slots;
        let visited = st.deadlines.pop_due_moving(now, |key, at| {
            let d = deadline_moved(slots, key, at)?;
            if d > now {
                // The wait's deadline moved past this entry: the entry follows.
                return Some(d);
            }
            let s = &mut slots[key.0 as usize];
            let side = if key.2 == RD { &mut s.rd } else { &mut s.wr };
            side.queued = None;
            side.timed_out = true;
            side.deadline = None;
            fired += 1;
            // Waking only schedules the task: it runs after this borrow ends.
            side.wake();
            None
        });
        let v = &self.stats.deadline_visits;
        v.set(v.get() + visited as u64);
        fired
    }

    /// Slots in use (tests: a released socket must not stay registered).
    pub fn slots_in_use(&self) -> usize {
        self.st.borrow().slots.iter().filter(|s| s.in_use).count()
    }

    /// Splice pipes the bulk path holds now (both drivers).
    pub fn pipes_out(&self) -> usize {
        self.pipes_out.get()
    }

    /// Frees the send chunks the last second's peak did not need (uring;
    /// the shard's memory trim calls it).
    pub fn trim(&self) {
        if let Backend::Uring(r) = &self.backend {
            r.trim();
        }
    }

    /// Provided buffers currently held by sockets (uring; 0 for epoll).
    pub fn buffers_held(&self) -> usize {
        match &self.backend {
            Backend::Uring(r) => r.buffers_held(),
            Backend::Epoll(_) => 0,
        }
    }
}
