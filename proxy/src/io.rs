//! Socket I/O for the request path: non-blocking syscalls with readiness from a per-shard edge-triggered epoll that the shard busy-polls while it has traffic.
//!
//! # Why not glommio's own stream reads
//!
//! glommio learns that a socket is readable from an io_uring poll request. The
//! ring is created without `IORING_SETUP_COOP_TASKRUN`, so every completion is
//! delivered as task work with a signal-style notification: the core that
//! receives the packet (on loopback, the *sender's* core) interrupts the proxy's
//! core, whether the proxy is asleep or busy. Measured on a 2-vCPU VM with the
//! load generator and origin on the other core, those interrupts cost the other
//! core about 11 % more CPU per request than nginx's epoll does (the
//! `sock_def_readable` → wake-up path: 16.5 % of that core against 5 %), and the
//! other core is the one that limits throughput.
//!
//! An epoll interest list does not interrupt anybody while its owner is not
//! sleeping in `epoll_wait`: a ready socket is just appended to the ready list.
//! So each shard keeps one edge-triggered epoll set with every client and
//! upstream socket registered once, and a [`Poller`] task that, while traffic
//! flows, calls `epoll_wait(0)` each time round the executor loop and wakes the
//! tasks whose sockets became ready (busy polling, as seastar and DPDK do on
//! their dedicated cores). After `limits.busy_poll_us` without any event it stops spinning and
//! sleeps in `epoll_wait` on the shard thread itself ([`Poller::park`]), like
//! nginx's event loop, so an idle shard sleeps and a lightly loaded one pays
//! no helper-thread hand-off per wait. Reads and writes are plain non-blocking `recv`/`send`: a syscall
//! only when there is something to move.
//!
//! Timeouts are deadlines kept in the slot and checked by the poller every
//! [`DEADLINE_TICK`]; a timed-out wait returns `ErrorKind::TimedOut`.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::io;
use std::net::{Shutdown, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use glommio::net::{TcpListener, TcpStream};

/// Granularity of timeouts: deadlines are checked this often.
pub const DEADLINE_TICK: Duration = Duration::from_millis(5);

/// Longest a parked poller sleeps before it looks at deadlines again (and
/// the longest glommio's own timers can be late on a parked shard).
const PARK_MAX: Duration = Duration::from_millis(10);

/// Empty polls, each followed by a yield, before the poller may park: tasks
/// woken by other tasks get their turn first.
const PARK_AFTER_EMPTY_TURNS: u32 = 2;

/// glommio's preemption timer for a shard: how long a round of task runs may
/// last before its loop turns (submitting, reaping, firing timers) whatever
/// the poller does; also how late glommio's own timers can fire.
pub const PREEMPT_EVERY: Duration = Duration::from_millis(25);

/// The timer [`turn_glommio`] waits on: long enough not to have expired by
/// the time it is first polled, short enough to cost nothing noticeable.
const NUDGE_WAIT: Duration = Duration::from_micros(20);

const EVENTS: usize = 256;

#[derive(Default)]
struct Slot {
    in_use: bool,
    readable: bool,
    writable: bool,
    /// The peer closed or the socket failed: no further edge will come, so
    /// the socket stays readable from now on.
    hup: bool,
    read_waker: Option<Waker>,
    write_waker: Option<Waker>,
    /// Deadline of the wait in progress (either direction).
    deadline: Option<Instant>,
    timed_out: bool,
    /// A listening socket watched only so that a connection arriving while
    /// the shard sleeps in `epoll_wait` wakes it (glommio accepts it).
    listener: bool,
}

/// A shard's readiness poller: an epoll set and one slot per registered socket.
pub struct Poller {
    epfd: RawFd,
    slots: RefCell<Vec<Slot>>,
    free: RefCell<Vec<usize>>,
    /// Number of pending waits (tasks parked on a slot).
    waiting: Cell<usize>,
    /// The poller task, when it is parked because nobody waits.
    idle_waker: RefCell<Option<Waker>>,
    last_deadline_check: Cell<Instant>,
    /// No pending wait has a deadline before this: slots are only scanned
    /// once it has passed (it may be stale-early, never late).
    next_expiry: Cell<Option<Instant>>,
    stopped: Cell<bool>,
    /// How long to keep polling after the last event before parking
    /// (`limits.busy_poll_us`).
    spin: Duration,
    /// glommio's loop should turn at once: a watched listener has a
    /// connection, or a park was interrupted by a ring completion.
    turn_soon: Cell<bool>,
    /// The time the poller read at its last turn, and whether it is still
    /// turning (see [`Poller::now`]).
    clock: Cell<Instant>,
    clock_live: Cell<bool>,
}

impl Drop for Poller {
    fn drop(&mut self) {
        // SAFETY: epfd is owned by this poller and closed exactly once.
        unsafe { libc::close(self.epfd) };
    }
}

fn last_os_error() -> io::Error {
    io::Error::last_os_error()
}

impl Poller {
    pub fn new(spin: Duration) -> io::Result<Rc<Poller>> {
        // SAFETY: plain syscall; the result is checked.
        let epfd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if epfd < 0 {
            return Err(last_os_error());
        }
        Ok(Rc::new(Poller {
            epfd,
            slots: RefCell::new(Vec::with_capacity(1024)),
            free: RefCell::new(Vec::with_capacity(1024)),
            waiting: Cell::new(0),
            idle_waker: RefCell::new(None),
            last_deadline_check: Cell::new(Instant::now()),
            next_expiry: Cell::new(None),
            stopped: Cell::new(false),
            spin,
            turn_soon: Cell::new(false),
            clock: Cell::new(Instant::now()),
            clock_live: Cell::new(false),
        }))
    }

    /// Registers `fd` (edge-triggered, both directions) and returns its slot.
    fn register(&self, fd: RawFd) -> io::Result<usize> {
        let token = match self.free.borrow_mut().pop() {
            Some(t) => t,
            None => {
                let mut slots = self.slots.borrow_mut();
                slots.push(Slot::default());
                slots.len() - 1
            }
        };
        {
            let mut slots = self.slots.borrow_mut();
            slots[token] = Slot {
                in_use: true,
                readable: true,
                writable: true,
                ..Slot::default()
            };
        }
        let mut ev = libc::epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLRDHUP | libc::EPOLLET) as u32,
            u64: token as u64,
        };
        // SAFETY: epfd and fd are open; ev is valid for the call.
        let rc = unsafe { libc::epoll_ctl(self.epfd, libc::EPOLL_CTL_ADD, fd, &mut ev) };
        if rc < 0 {
            let e = last_os_error();
            self.release(token, None);
            return Err(e);
        }
        Ok(token)
    }

    fn release(&self, token: usize, fd: Option<RawFd>) {
        if let Some(fd) = fd {
            // SAFETY: fd is still open (the stream is dropped after this).
            unsafe {
                libc::epoll_ctl(self.epfd, libc::EPOLL_CTL_DEL, fd, std::ptr::null_mut());
            }
        }
        let mut slots = self.slots.borrow_mut();
        let s = &mut slots[token];
        if s.read_waker.take().is_some() {
            self.waiting.set(self.waiting.get() - 1);
        }
        if s.write_waker.take().is_some() {
            self.waiting.set(self.waiting.get() - 1);
        }
        *s = Slot::default();
        drop(slots);
        self.free.borrow_mut().push(token);
    }

    fn dispatch(&self, events: impl Iterator<Item = (u64, u32)>) {
        let mut slots = self.slots.borrow_mut();
        for (token, bits) in events {
            let (token, bits) = (token as usize, bits as i32);
            let Some(s) = slots.get_mut(token) else {
                continue;
            };
            if !s.in_use {
                continue;
            }
            if s.listener {
                self.turn_soon.set(true);
                continue;
            }
            let err = bits & (libc::EPOLLERR | libc::EPOLLHUP) != 0;
            if err || bits & libc::EPOLLRDHUP != 0 {
                s.hup = true;
            }
            if err || bits & (libc::EPOLLIN | libc::EPOLLRDHUP) != 0 {
                s.readable = true;
                if let Some(w) = s.read_waker.take() {
                    self.waiting.set(self.waiting.get() - 1);
                    w.wake();
                }
            }
            if err || bits & libc::EPOLLOUT != 0 {
                s.writable = true;
                if let Some(w) = s.write_waker.take() {
                    self.waiting.set(self.waiting.get() - 1);
                    w.wake();
                }
            }
        }
    }

    fn expire(&self, now: Instant) {
        if now.duration_since(self.last_deadline_check.get()) < DEADLINE_TICK
            || self.next_expiry.get().is_none_or(|d| now < d)
        {
            return;
        }
        self.last_deadline_check.set(now);
        let mut next: Option<Instant> = None;
        let mut slots = self.slots.borrow_mut();
        for s in slots.iter_mut() {
            if s.read_waker.is_none() && s.write_waker.is_none() {
                continue;
            }
            match s.deadline {
                Some(d) if now >= d => {
                    s.timed_out = true;
                    s.deadline = None;
                    for w in [s.read_waker.take(), s.write_waker.take()]
                        .into_iter()
                        .flatten()
                    {
                        self.waiting.set(self.waiting.get() - 1);
                        w.wake();
                    }
                }
                Some(d) => next = Some(next.map_or(d, |n| n.min(d))),
                None => {}
            }
        }
        self.next_expiry.set(next);
    }

    fn note_deadline(&self, d: Instant) {
        if self.next_expiry.get().is_none_or(|n| d < n) {
            self.next_expiry.set(Some(d));
        }
    }

    fn next_deadline(&self) -> Option<Instant> {
        self.next_expiry.get()
    }

    /// `epoll_wait` for up to `ms` milliseconds (0: do not block), dispatching
    /// what it returns; the raw result (-1 on error, e.g. `EINTR`).
    fn wait(&self, events: &mut [libc::epoll_event; EVENTS], ms: i32) -> i32 {
        // SAFETY: events is a valid buffer of EVENTS entries; epfd is open.
        let n = unsafe { libc::epoll_wait(self.epfd, events.as_mut_ptr(), EVENTS as i32, ms) };
        if n > 0 {
            self.dispatch(events[..n as usize].iter().map(|e| (e.u64, e.events)));
        }
        n
    }

    fn poll_now(&self, events: &mut [libc::epoll_event; EVENTS]) -> usize {
        self.wait(events, 0).max(0) as usize
    }

    /// Ends [`Poller::run`] at its next turn (a park in progress ends within
    /// `PARK_MAX`). The shard awaits the run task before its executor goes
    /// away.
    pub fn stop(&self) {
        self.stopped.set(true);
        if let Some(w) = self.idle_waker.borrow_mut().take() {
            w.wake();
        }
    }

    /// The poller task: busy-polls while there is traffic, parks otherwise.
    pub async fn run(self: Rc<Self>) {
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; EVENTS];
        let mut last_event = Instant::now();
        // Consecutive turns whose poll found nothing (each followed by a yield).
        let mut empty_turns = 0u32;
        let mut nudge = glommio::timer::Timer::new(NUDGE_WAIT);
        while !self.stopped.get() {
            let n = self.poll_now(&mut events);
            let now = Instant::now();
            self.clock.set(now);
            self.clock_live.set(true);
            if n > 0 {
                last_event = now;
                empty_turns = 0;
            } else {
                empty_turns = empty_turns.saturating_add(1);
            }
            self.expire(now);
            if self.turn_soon.take() {
                if !turn_glommio(&mut nudge).await {
                    // The nudge had expired before it could suspend: no turn
                    // happened, so try again.
                    self.turn_soon.set(true);
                    glommio::executor().yield_now().await;
                }
                continue;
            }
            if self.waiting.get() == 0 {
                // Nobody waits: sleep until a task starts waiting.
                self.clock_live.set(false);
                IdleWait { poller: &self }.await;
                last_event = Instant::now();
                empty_turns = 0;
                continue;
            }
            let quiet = now.duration_since(last_event) >= self.spin
                && empty_turns >= PARK_AFTER_EMPTY_TURNS
                && !glommio::executor().need_preempt();
            if !quiet {
                glommio::executor().yield_now().await;
                continue;
            }
            // Quiet: sleep in epoll_wait on this thread, bounded so deadlines
            // (and glommio's own timers, which only run between tasks) are
            // honoured. See `park` for why nothing else is starved.
            let until = self
                .next_deadline()
                .map(|d| d.saturating_duration_since(now))
                .unwrap_or(PARK_MAX)
                .min(PARK_MAX);
            self.clock_live.set(false);
            match self.park(&mut events, until) {
                Parked::Events => {
                    last_event = Instant::now();
                    empty_turns = 0;
                }
                Parked::Interrupted => self.turn_soon.set(true),
                Parked::TimedOut => {}
            }
            self.clock.set(Instant::now());
            self.clock_live.set(true);
            glommio::executor().yield_now().await;
        }
    }

    /// Blocks the shard thread in `epoll_wait` for up to `until`.
    ///
    /// This is nginx's event loop: no helper thread, no hand-off, one syscall
    /// per sleep. Measured at 10k requests/s it halves zgix's CPU time per
    /// request against parking on glommio's blocking-helper thread, which
    /// costs two context switches and a futex and eventfd round trip per wait.
    ///
    /// What else could need the thread still ends the sleep at once:
    /// - connections: every client and upstream socket is in the set, and so
    ///   is every listener ([`Poller::watch_listener`]); a listener's event
    ///   makes glommio's loop turn so its `accept` is submitted and reaped;
    /// - completions on glommio's rings: glommio sets its rings up without
    ///   `IORING_SETUP_COOP_TASKRUN`, so a completion reaches this thread as
    ///   signal-style task work, which interrupts `epoll_wait` with `EINTR`,
    ///   and the poller then lets glommio's loop turn; completions glommio
    ///   has not reaped yet show in `need_preempt()` (accept, connect and
    ///   wake-ups from other threads use its latency ring) and the poller
    ///   does not park while it is set; a request glommio has queued but not
    ///   submitted yet (a connect) makes its loop turn first
    ///   ([`Poller::ring_op`]);
    /// - tasks woken by other tasks: the poller parks only after
    ///   [`PARK_AFTER_EMPTY_TURNS`] empty polls with a yield in between.
    ///
    /// glommio's userspace timers (the shard tick, lingering closes, drain)
    /// run between task rounds, so they fire at most [`PREEMPT_EVERY`] late:
    /// the preemption timer is a ring request too, and interrupts the sleep.
    fn park(&self, events: &mut [libc::epoll_event; EVENTS], until: Duration) -> Parked {
        let ms = until.as_millis().clamp(1, PARK_MAX.as_millis()) as i32;
        let n = self.wait(events, ms);
        if n > 0 {
            Parked::Events
        } else if n < 0 {
            Parked::Interrupted
        } else {
            Parked::TimedOut
        }
    }

    /// The time for deadlines and pool ages, without a clock read: what the
    /// poller read at its last turn while it is turning (busy polling, at
    /// most one round of tasks old), else a fresh read. Deadlines are only
    /// checked every [`DEADLINE_TICK`], so a round's staleness is noise.
    pub fn now(&self) -> Instant {
        if self.clock_live.get() {
            self.clock.get()
        } else {
            Instant::now()
        }
    }

    /// Adds a listening socket to the set so that a connection arriving while
    /// the shard sleeps in `epoll_wait` wakes it; glommio still accepts it.
    /// The returned guard takes it out again.
    pub fn watch_listener(self: &Rc<Self>, fd: RawFd) -> io::Result<ListenerWatch> {
        let token = self.register(fd)?;
        self.slots.borrow_mut()[token].listener = true;
        Ok(ListenerWatch {
            poller: self.clone(),
            token,
            fd,
        })
    }

    /// Call before starting a request on glommio's rings that the shard will
    /// wait for (an upstream connect): glommio only queues it, so the poller
    /// makes glommio's loop turn and submit it before it may sleep in
    /// `epoll_wait`. Its completion then interrupts the sleep.
    pub fn ring_op(&self) {
        self.turn_soon.set(true);
    }

    fn note_waiter(&self) {
        self.waiting.set(self.waiting.get() + 1);
        if let Some(w) = self.idle_waker.borrow_mut().take() {
            w.wake();
        }
    }
}

/// Lets glommio's executor loop turn once: submit the requests tasks queued
/// on its rings (an `accept` that found no connection waiting, a `connect`),
/// reap completions and fire due timers.
///
/// glommio does that between rounds of task runs, and a round only ends when
/// no task is runnable or the preemption timer ([`PREEMPT_EVERY`]) fires. The
/// poller is always runnable while it spins, so a connect, or a connection
/// arriving during steady traffic, would otherwise wait for the preemption
/// timer. Waiting on a short glommio timer makes the poller not runnable for
/// one round. It is done on demand (a watched listener's event, a connect, a
/// park interrupted by a ring completion), not per request: glommio's timer
/// wheel allocates when it fires timers.
/// Returns whether the poller was suspended, i.e. whether the loop turned.
async fn turn_glommio(nudge: &mut glommio::timer::Timer) -> bool {
    nudge.reset(NUDGE_WAIT);
    let mut suspended = false;
    std::future::poll_fn(|cx| match Pin::new(&mut *nudge).poll(cx) {
        Poll::Ready(_) => Poll::Ready(()),
        Poll::Pending => {
            suspended = true;
            Poll::Pending
        }
    })
    .await;
    suspended
}

/// Listen backlog asked for; the kernel caps it at `net.core.somaxconn`
/// (`scripts/tune-sysctl.sh` raises that).
const BACKLOG: i32 = 4096;

/// Binds a listening socket as glommio's `TcpListener::bind` does
/// (SO_REUSEPORT, so every shard binds the same address and the kernel
/// spreads connections), plus SO_REUSEADDR so a restart can rebind while old
/// connections linger in TIME_WAIT, and a backlog that follows somaxconn.
/// Returns the descriptor too: glommio's listener does not expose it, and the
/// poller watches it.
pub fn bind_listener(addr: SocketAddr) -> io::Result<(TcpListener, RawFd)> {
    let err = io::Error::last_os_error;
    let family = if addr.is_ipv6() {
        libc::AF_INET6
    } else {
        libc::AF_INET
    };
    // SAFETY: plain syscall; the result is checked.
    let fd = unsafe { libc::socket(family, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(err());
    }
    // SAFETY: fd is a fresh socket; glommio's listener owns it from here on
    // (and closes it on drop, also on the error paths below).
    let listener = unsafe { TcpListener::from_raw_fd(fd) };
    let one: libc::c_int = 1;
    for opt in [libc::SO_REUSEPORT, libc::SO_REUSEADDR] {
        // SAFETY: fd is open; the option value is a c_int that outlives the call.
        let rc = unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                opt,
                (&one as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(err());
        }
    }
    // SAFETY: both sockaddr structs are plain data; zeroed is a valid start.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            // SAFETY: sockaddr_storage is large and aligned enough for sockaddr_in.
            let sin = unsafe {
                &mut *(&mut storage as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>()
            };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = a.port().to_be();
            sin.sin_addr.s_addr = u32::from(*a.ip()).to_be();
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            // SAFETY: sockaddr_storage is large and aligned enough for sockaddr_in6.
            let sin6 = unsafe {
                &mut *(&mut storage as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>()
            };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = a.port().to_be();
            sin6.sin6_addr.s6_addr = a.ip().octets();
            sin6.sin6_flowinfo = a.flowinfo();
            sin6.sin6_scope_id = a.scope_id();
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    // SAFETY: storage holds a valid address of `len` bytes; fd is open.
    if unsafe {
        libc::bind(
            fd,
            (&storage as *const libc::sockaddr_storage).cast(),
            len as libc::socklen_t,
        )
    } < 0
    {
        return Err(err());
    }
    // SAFETY: fd is a bound socket.
    if unsafe { libc::listen(fd, BACKLOG) } < 0 {
        return Err(err());
    }
    Ok((listener, fd))
}

/// How a park ended.
enum Parked {
    Events,
    /// `EINTR`: a ring completion (or a signal) arrived.
    Interrupted,
    TimedOut,
}

/// A listener watched by the poller; dropping it unwatches the socket (drop
/// it before the listener closes).
pub struct ListenerWatch {
    poller: Rc<Poller>,
    token: usize,
    fd: RawFd,
}

impl Drop for ListenerWatch {
    fn drop(&mut self) {
        self.poller.release(self.token, Some(self.fd));
    }
}

struct IdleWait<'a> {
    poller: &'a Poller,
}

impl Future for IdleWait<'_> {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.poller.waiting.get() > 0 || self.poller.stopped.get() {
            return Poll::Ready(());
        }
        *self.poller.idle_waker.borrow_mut() = Some(cx.waker().clone());
        Poll::Pending
    }
}

#[derive(Copy, Clone, PartialEq, Eq)]
enum Dir {
    Read,
    Write,
}

/// Waits until the poller marks the slot ready in `dir`, or its deadline passes.
struct Ready<'a> {
    sock: &'a Sock,
    dir: Dir,
    deadline: Option<Instant>,
}

impl Future for Ready<'_> {
    type Output = io::Result<()>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let p = &self.sock.poller;
        let mut slots = p.slots.borrow_mut();
        let s = &mut slots[self.sock.token];
        let ready = match self.dir {
            Dir::Read => s.readable,
            Dir::Write => s.writable,
        };
        if ready {
            return Poll::Ready(Ok(()));
        }
        if s.timed_out {
            s.timed_out = false;
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "operation timed out",
            )));
        }
        if let Some(d) = self.deadline {
            if p.now() >= d {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "operation timed out",
                )));
            }
        }
        s.deadline = self.deadline;
        if let Some(d) = self.deadline {
            p.note_deadline(d);
        }
        let slot = match self.dir {
            Dir::Read => &mut s.read_waker,
            Dir::Write => &mut s.write_waker,
        };
        let fresh = slot.is_none();
        *slot = Some(cx.waker().clone());
        drop(slots);
        if fresh {
            p.note_waiter();
        }
        Poll::Pending
    }
}

impl Drop for Ready<'_> {
    fn drop(&mut self) {
        // A wait abandoned (e.g. raced against a drain) must not stay counted.
        let p = &self.sock.poller;
        let mut slots = p.slots.borrow_mut();
        if let Some(s) = slots.get_mut(self.sock.token) {
            let w = match self.dir {
                Dir::Read => s.read_waker.take(),
                Dir::Write => s.write_waker.take(),
            };
            if w.is_some() {
                p.waiting.set(p.waiting.get() - 1);
            }
            s.timed_out = false;
        }
    }
}

/// A TCP socket driven by the shard's [`Poller`]. It keeps the glommio stream
/// only for ownership of the descriptor; the same method names as glommio's
/// stream keep the request path readable.
pub struct Sock {
    stream: TcpStream,
    poller: Rc<Poller>,
    token: usize,
    read_timeout: Cell<Option<Duration>>,
    write_timeout: Cell<Option<Duration>>,
}

impl Drop for Sock {
    fn drop(&mut self) {
        self.poller
            .release(self.token, Some(self.stream.as_raw_fd()));
    }
}

impl Sock {
    pub fn new(stream: TcpStream, poller: &Rc<Poller>) -> io::Result<Sock> {
        let token = poller.register(stream.as_raw_fd())?;
        Ok(Sock {
            stream,
            poller: poller.clone(),
            token,
            read_timeout: Cell::new(None),
            write_timeout: Cell::new(None),
        })
    }

    pub fn fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }

    pub fn set_read_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        self.read_timeout.set(d);
        Ok(())
    }

    pub fn set_write_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        self.write_timeout.set(d);
        Ok(())
    }

    pub fn set_nodelay(&self, on: bool) -> io::Result<()> {
        self.stream.set_nodelay(on).map_err(io::Error::from)
    }

    fn is_ready(&self, dir: Dir) -> bool {
        let slots = self.poller.slots.borrow();
        let s = &slots[self.token];
        match dir {
            Dir::Read => s.readable,
            Dir::Write => s.writable,
        }
    }

    fn mark(&self, dir: Dir, ready: bool) {
        let mut slots = self.poller.slots.borrow_mut();
        let s = &mut slots[self.token];
        match dir {
            Dir::Read => s.readable = ready || s.hup,
            Dir::Write => s.writable = ready,
        }
    }

    /// Reads what is available, waiting (up to the read timeout) for at least a byte.
    pub async fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        // The deadline is computed only if the read has to wait.
        let mut deadline: Option<Option<Instant>> = None;
        loop {
            if !self.is_ready(Dir::Read) {
                // Known empty since the last short read: skip the EAGAIN
                // syscall and wait for the next edge straight away.
                let deadline = *deadline
                    .get_or_insert_with(|| self.read_timeout.get().map(|d| self.poller.now() + d));
                Ready {
                    sock: self,
                    dir: Dir::Read,
                    deadline,
                }
                .await?;
            }
            // SAFETY: buf is valid for buf.len() bytes; fd is open.
            let n = unsafe {
                libc::recv(
                    self.fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n >= 0 {
                // Edge-triggered: a read shorter than the buffer emptied the
                // socket, and any byte arriving later raises a new event.
                if (n as usize) < buf.len() && n > 0 {
                    self.mark(Dir::Read, false);
                }
                return Ok(n as usize);
            }
            let e = last_os_error();
            match e.kind() {
                io::ErrorKind::WouldBlock => self.mark(Dir::Read, false),
                io::ErrorKind::Interrupted => {}
                _ => return Err(e),
            }
        }
    }

    /// Writes all of `buf`, waiting for buffer space (up to the write timeout
    /// between progress) when the socket is full.
    pub async fn write_all(&self, mut buf: &[u8]) -> io::Result<()> {
        while !buf.is_empty() {
            // SAFETY: buf is valid for buf.len() bytes; fd is open.
            let n = unsafe {
                libc::send(
                    self.fd(),
                    buf.as_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                )
            };
            if n >= 0 {
                buf = &buf[n as usize..];
                continue;
            }
            let e = last_os_error();
            match e.kind() {
                io::ErrorKind::WouldBlock => {
                    self.mark(Dir::Write, false);
                    let deadline = self.write_timeout.get().map(|d| self.poller.now() + d);
                    Ready {
                        sock: self,
                        dir: Dir::Write,
                        deadline,
                    }
                    .await?;
                }
                io::ErrorKind::Interrupted => {}
                _ => return Err(e),
            }
        }
        Ok(())
    }

    pub async fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        let how = match how {
            Shutdown::Read => libc::SHUT_RD,
            Shutdown::Write => libc::SHUT_WR,
            Shutdown::Both => libc::SHUT_RDWR,
        };
        // SAFETY: fd is open.
        if unsafe { libc::shutdown(self.fd(), how) } < 0 {
            return Err(last_os_error());
        }
        Ok(())
    }
}
