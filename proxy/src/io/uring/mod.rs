//! The io_uring backend: zgix's own ring per shard, multishot receive into a provided-buffer ring, accepts taken on demand, batched sends (of driver-owned chunks) and connects.
//!
//! # Buffer ownership
//!
//! The kernel owns a provided buffer from the moment it is in the ring until
//! a receive completion hands it back with its id; zgix then owns it until
//! its bytes are copied out, or consumed where they are by a lend
//! (`Ring::try_lend`: TLS decrypts records in place there), when it goes
//! back to the ring. Each socket
//! keeps the buffers it received in arrival order (a list threaded through
//! [`Meta`]); a released socket gives its buffers back at once, and a
//! completion for a socket that is gone gives its buffer back too, so no
//! buffer is lost whatever is dropped when.
//!
//! A send never hands the kernel the caller's bytes: they are copied into a
//! driver-owned chunk ([`bufs::SendPool`]) that stays with the socket's slot
//! from submission to completion, and a connect's address is boxed in the
//! slot the same way. The one exception is a gathered send (`gather.rs`),
//! whose data lies in a buffer shared through an `Rc`: the slot holds a
//! clone of it until the completion, and its owner writes it only when no
//! send holds it (`conn::state::ClientBytes`). A send or connect future that times out, is dropped
//! or is forgotten leaves that memory with the driver, which recycles it at
//! the completion; nothing waits in `Drop`.
//!
//! # Descriptors
//!
//! The kernel resolves an entry's descriptor when it is submitted, and a
//! lazy turn or a full queue may leave entries unsubmitted for a while. So
//! a released socket's descriptor stays open until every entry naming it
//! (receive, poll, accepts, send, connect: `USock::ops`) has completed or
//! been cancelled; only then is it closed and its slot reused.
//!
//! # Backpressure
//!
//! A multishot receive keeps receiving while armed. A socket with
//! [`RQ_MAX`] buffers unread has its receive cancelled (the kernel's socket
//! buffer and TCP window take over) and re-armed once its reader has caught
//! up, so one fast sender cannot take the shard's buffers from everyone.
//! When the ring runs dry anyway a receive ends with `ENOBUFS`; the socket
//! waits on a list and is re-armed as buffers come back.

mod bufs;
mod complete;
mod gather;
mod iov;
mod one;
mod relay;
mod sock;
mod splice;

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::rc::Rc;
use std::time::Duration;

use io_uring::{opcode, squeue, types, IoUring};

use self::bufs::{BufRing, Chunk, SendPool};
use super::sock::PipeFds;
use super::{Options, Role, Slot, State, NO_BUF};

/// What the one log line says when the ring is refused and the shard runs on epoll.
pub const REFUSED_HINT: &str = "The ring needs io_uring_setup (seccomp profiles such as Docker's default \
block it) and kernel 6.1+ for DEFER_TASKRUN; its memory is charged to the memory cgroup, not RLIMIT_MEMLOCK. \
Set \"io\": {\"driver\": \"epoll\"} to choose epoll without this message.";

/// Unread buffers at which a socket's receive is paused.
pub const RQ_MAX: u16 = 4;

/// The same for a socket whose bytes are relayed in bulk
/// ([`Ring::poll_relay`]), while the shard holds less than half its
/// buffers: the receive keeps running while the previous bytes are sent.
pub const RQ_BULK: u16 = 8;

/// Provided buffers one relayed send (`sendmsg`) takes at most.
pub const RELAY_BUFS: usize = 8;

/// Accepts a listener has submitted or completed but not handed out, at
/// most: the ring takes connections off the backlog only as the accept loop
/// asks, so a shard at its cap leaves them in the kernel's backlog.
pub const ACCEPTS_IN_FLIGHT: usize = 4;

/// The largest write one ring send takes (the rest is the caller's next write).
pub const SEND_CHUNK: usize = bufs::BIG;

/// Buffer group id of the shard's provided-buffer ring.
const BGID: u16 = 0;

/// Completions a turn copies out of the queue at a time.
const CQE_BATCH: usize = 64;

/// Lazy turns in a row that may leave queued entries unsubmitted.
pub const MAX_DEFERRED_TURNS: u32 = 2;

/// Inline sends a park counts past (its `wait_nr` stays far below the CQ size).
const MAX_INLINE_COUNTED: u32 = 64;

/// The longest write sent inline. An inline send that does not fit the
/// socket completes short (or with `EAGAIN`) inside the park that counted
/// it as done, and the rest needs user space to act: a park that then
/// waited for "one more event" would sleep with bytes still to send. A
/// reply up to 16 KiB fits a loopback or LAN socket's send buffer unless
/// the peer stopped reading; longer writes wait in the kernel for room.
pub(in crate::io) const INLINE_SEND_MAX: usize = 16 * 1024;

/// How long a park that counted inline sends sleeps at most: the backstop
/// for an inline send that still came back short (a peer that stopped
/// reading), whose rest is sent at the next turn. The default of
/// [`Options::inline_backstop`].
pub const INLINE_PARK_MAX: Duration = Duration::from_millis(1);

const K_RECV: u64 = 1;
const K_SEND: u64 = 2;
const K_CONNECT: u64 = 3;
const K_ACCEPT: u64 = 4;
const K_CANCEL: u64 = 5;
const K_WAKE: u64 = 6;
const K_POLL: u64 = 7;
const K_SPLICE_IN: u64 = 8;
const K_SPLICE_OUT: u64 = 9;

fn ud(kind: u64, token: u32, gen: u32) -> u64 {
    (kind << 56) | ((gen as u64 & 0x00ff_ffff) << 32) | token as u64
}

fn ud_parts(ud: u64) -> (u64, u32, u32) {
    (ud >> 56, ud as u32, ((ud >> 32) & 0x00ff_ffff) as u32)
}

/// Per provided buffer: bytes the kernel put in it and the next buffer of
/// the same socket's queue.
#[derive(Copy, Clone)]
struct Meta {
    len: u32,
    next: u16,
}

/// A socket's send or connect (one at a time).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
enum Op {
    #[default]
    Idle,
    InFlight,
    /// Cancellation requested (a deadline passed or the waiter went away).
    Cancelling,
    Done(i32),
}

/// What a write-side operation asks of the kernel.
#[derive(Clone, Copy)]
pub(in crate::io) enum What<'a> {
    Send(&'a [u8]),
    /// Send all of a buffer the caller hands over (taken at the start).
    SendOwned(&'a std::cell::Cell<Option<Vec<u8>>>),
    Connect(SocketAddr),
    /// Splice the first `n` bytes of the pipe into the socket.
    Splice(&'a Rc<PipeFds>, usize),
}

/// The ring's own per-socket state.
pub(in crate::io) struct USock {
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
    /// That readiness poll is armed, and whether it said readable.
    poll_armed: bool,
    poll_ready: bool,
    /// The send or connect, its kind (`K_SEND`/`K_CONNECT`) and sequence
    /// number (which future started it), and whether that future went away.
    op: Op,
    op_kind: u64,
    op_seq: u32,
    abandoned: bool,
    /// The send in flight was submitted with `MSG_DONTWAIT` (it completes
    /// within the submitting `io_uring_enter`, `EAGAIN` if the socket is full).
    send_inline: bool,
    /// The last send found the socket's buffer full (`EAGAIN` or a short
    /// write): the next one waits for room in the kernel instead.
    send_full: bool,
    /// The last send was part of a longer write (the caller had more than
    /// a chunk): it and the send after it are not inline, since an inline
    /// send finding the socket full (`EAGAIN`) is a completion the park
    /// does not wake for.
    bulk: bool,
    /// The bytes of the send, owned here from submission to completion.
    send: Option<Chunk>,
    /// A relayed send's provided buffers (another socket's received bytes,
    /// sent without a copy), owned here likewise.
    relay: Option<Box<relay::Relay>>,
    /// A gathered send's iovecs, framing and hold on the buffer its data
    /// lies in (`gather.rs`), owned here likewise.
    gather: Option<Box<gather::GatherOp>>,
    /// The pipe end a splice in flight names (out of it on the write side,
    /// into it on the read side): kept open until the completion.
    wpipe: Option<Rc<PipeFds>>,
    rpipe: Option<Rc<PipeFds>>,
    /// The read side's splice (socket into a pipe), its sequence number and
    /// whether its future went away.
    rsplice: Op,
    rsplice_seq: u32,
    rsplice_abandoned: bool,
    /// The receive is held off for splicing: nothing re-arms it until resumed.
    recv_hold: bool,
    /// Holds not yet let go (they nest: the body's relay holds a receive
    /// its exchange already holds).
    holds: u8,
    /// The receive takes one buffer per arming, re-armed once the queue is
    /// empty (`one.rs`): the next head is awaited before a bulk body.
    recv_one: bool,
    /// Its owner closes it after what it sends now ([`Ring::set_closing`]):
    /// no event from the peer follows these sends, so a park does not count
    /// them as riding on the next one.
    closing: bool,
    /// The next send is followed by work on bytes already read, not by a
    /// peer event ([`Ring::set_goes_on`]): not counted in the park's wait.
    goes_on: bool,
    /// Unread buffers at which this socket's receive is paused: [`RQ_MAX`],
    /// or [`RQ_BULK`] while its bytes are relayed.
    rq_cap: u16,
    /// The connect's address, owned here while the kernel may read it.
    addr: Option<Box<socket2::SockAddr>>,
    /// Entries submitted or queued that name this socket: its descriptor
    /// is closed and the slot reused only at 0.
    ops: u16,
    /// Accepts submitted, descriptors accepted and not taken, and an accept
    /// error not yet reported (listeners).
    accepts_armed: u8,
    accepted: VecDeque<RawFd>,
    accept_error: i32,
}

impl USock {
    pub(in crate::io) fn new() -> USock {
        USock {
            rq_head: NO_BUF,
            rq_tail: NO_BUF,
            rq_len: 0,
            rq_off: 0,
            recv_armed: false,
            recv_paused: false,
            recv_starved: false,
            poll_armed: false,
            poll_ready: false,
            op: Op::Idle,
            op_kind: 0,
            op_seq: 0,
            abandoned: false,
            send_inline: false,
            send_full: false,
            bulk: false,
            send: None,
            relay: None,
            gather: None,
            wpipe: None,
            rpipe: None,
            rsplice: Op::Idle,
            rsplice_seq: 0,
            rsplice_abandoned: false,
            recv_hold: false,
            holds: 0,
            recv_one: false,
            closing: false,
            goes_on: false,
            rq_cap: RQ_MAX,
            addr: None,
            ops: 0,
            accepts_armed: 0,
            accepted: VecDeque::new(),
            accept_error: 0,
        }
    }
}

/// The ring and everything it refers to.
pub struct Ring {
    ring: RefCell<IoUring>,
    bufs: BufRing,
    sends: SendPool,
    meta: RefCell<Vec<Meta>>,
    /// Buffers queued on sockets (not in the kernel's ring).
    held: Cell<usize>,
    /// Buffers of relayed sends that ended where the slot table was not at
    /// hand: recycled at the next turn (or relay poll).
    returned: RefCell<Vec<u16>>,
    /// Idle gathered-send boxes (`gather.rs`): boxed, as a send's header
    /// points into its own iovecs, so one moves between the slot and here
    /// as a pointer.
    #[allow(clippy::vec_box)]
    gathers: RefCell<Vec<Box<gather::GatherOp>>>,
    /// Sockets whose receive ended with ENOBUFS, to re-arm as buffers return.
    starved: RefCell<Vec<(u32, u32)>>,
    /// One-buffer sockets whose receive is armed at the next turn (`one.rs`).
    rearm: RefCell<Vec<(u32, u32)>>,
    /// Entries that found the submission queue full (see [`Ring::push`]).
    backlog: RefCell<Vec<squeue::Entry>>,
    /// Completions copied out of the queue before they are dispatched (a
    /// dispatch pushes entries, which needs the ring): kept between turns
    /// so a turn does not zero a fresh array of [`CQE_BATCH`] each time.
    cqe_batch: RefCell<Vec<(u64, i32, u32)>>,
    /// `MSG_DONTWAIT` sends in the submission queue, not yet submitted: each
    /// posts its completion within the enter that submits it.
    inline_sends: Cell<u32>,
    /// Lazy turns since the last enter.
    deferred: Cell<u32>,
    /// The longest park while inline sends are counted ([`Options::inline_backstop`]).
    backstop: Duration,
    /// The eventfd the main thread writes to wake this shard, and the
    /// 8 bytes the armed read of it fills.
    evfd: RawFd,
    wake_buf: Box<Cell<u64>>,
    /// In debug builds: buffers in the kernel's ring + held == all of them.
    #[cfg(debug_assertions)]
    in_ring: Cell<usize>,
}

impl Ring {
    pub(super) fn new(opts: &Options, evfd: RawFd) -> io::Result<Ring> {
        let cq = opts.cq_entries.clamp(8, 1 << 16).next_power_of_two();
        let sq = (cq / 4).max(4);
        let ring = IoUring::builder()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .setup_coop_taskrun()
            .setup_taskrun_flag()
            .setup_submit_all()
            .setup_cqsize(cq)
            .build(sq)?;
        let n = opts.recv_buffers.clamp(1, 32768).next_power_of_two();
        let bufs = BufRing::new(n, opts.recv_buffer_bytes.max(64))?;
        // SAFETY: the entry mapping lives as long as `Ring`, whose `ring`
        // field is declared first and so is closed (unregistering the
        // buffer ring) before the mappings are unmapped.
        unsafe {
            ring.submitter().register_buf_ring_with_flags(
                bufs.ring.ptr as u64,
                bufs.entries,
                BGID,
                0,
            )?;
        }
        limit_workers(&ring);
        for bid in 0..bufs.entries {
            bufs.add(bid);
        }
        bufs.publish();
        let r = Ring {
            ring: RefCell::new(ring),
            meta: RefCell::new(vec![
                Meta {
                    len: 0,
                    next: NO_BUF
                };
                bufs.entries as usize
            ]),
            bufs,
            sends: SendPool::default(),
            held: Cell::new(0),
            returned: RefCell::new(Vec::new()),
            gathers: RefCell::new(Vec::new()),
            starved: RefCell::new(Vec::with_capacity(64)),
            rearm: RefCell::new(Vec::new()),
            backlog: RefCell::new(Vec::new()),
            cqe_batch: RefCell::new(Vec::with_capacity(CQE_BATCH)),
            inline_sends: Cell::new(0),
            deferred: Cell::new(0),
            backstop: opts.inline_backstop,
            evfd,
            wake_buf: Box::new(Cell::new(0)),
            #[cfg(debug_assertions)]
            in_ring: Cell::new(n as usize),
        };
        // The eventfd is blocking: io_uring waits on it with an internal poll.
        set_blocking(evfd)?;
        r.arm_wake();
        Ok(r)
    }

    /// Queues an entry; true if it is in the submission queue (not the backlog).
    fn push(&self, e: &squeue::Entry) -> bool {
        let mut ring = self.ring.borrow_mut();
        if !self.backlog.borrow().is_empty() {
            self.backlog.borrow_mut().push(e.clone());
            return false;
        }
        // SAFETY: every buffer and address an entry refers to outlives its
        // completion (see the module docs).
        if unsafe { ring.submission().push(e) }.is_err() {
            // Full: hand what is queued to the kernel, then there is room,
            // unless the kernel refuses new work while completions wait in
            // its overflow list (EBUSY): then the entry waits in the backlog
            // for the next turn, which reaps first.
            let _ = ring.submit();
            self.inline_sends.set(0);
            // SAFETY: as above.
            if unsafe { ring.submission().push(e) }.is_err() {
                self.backlog.borrow_mut().push(e.clone());
                return false;
            }
        }
        true
    }

    /// Moves backlogged entries into the submission queue while it has room.
    fn flush_backlog(&self, ring: &mut IoUring) {
        let mut backlog = self.backlog.borrow_mut();
        if backlog.is_empty() {
            return;
        }
        let mut moved = 0;
        {
            let mut sq = ring.submission();
            for e in backlog.iter() {
                // SAFETY: as in `push`.
                if unsafe { sq.push(e) }.is_err() {
                    break;
                }
                moved += 1;
            }
        }
        backlog.drain(..moved);
    }

    fn arm_wake(&self) {
        let e = opcode::Read::new(types::Fd(self.evfd), self.wake_buf.as_ptr().cast(), 8)
            .build()
            .user_data(ud(K_WAKE, 0, 0));
        self.push(&e);
    }

    fn arm_recv(&self, s: &mut Slot, token: u32) {
        let fd = types::Fd(s.fd);
        let e = if s.be.u().recv_one {
            // One buffer (len 0: the buffer's own size), then it ends.
            opcode::Recv::new(fd, std::ptr::null_mut(), 0)
                .buf_group(BGID)
                .build()
                .flags(squeue::Flags::BUFFER_SELECT)
        } else {
            opcode::RecvMulti::new(fd, BGID).build()
        };
        let e = e.user_data(ud(K_RECV, token, s.gen));
        self.push(&e);
        let u = s.be.u();
        u.recv_armed = true;
        u.ops += 1;
    }

    /// One accept (not multishot: the kernel would take the whole backlog).
    fn arm_accept(&self, s: &mut Slot, token: u32) {
        let e = opcode::Accept::new(types::Fd(s.fd), std::ptr::null_mut(), std::ptr::null_mut())
            .flags(libc::SOCK_CLOEXEC)
            .build()
            .user_data(ud(K_ACCEPT, token, s.gen));
        self.push(&e);
        let u = s.be.u();
        u.accepts_armed += 1;
        u.ops += 1;
    }

    /// Cancels every entry of `kind` for the socket (all its accepts, its
    /// receive, its poll, its send or connect).
    fn cancel(&self, kind: u64, token: u32, gen: u32) {
        let e =
            opcode::AsyncCancel2::new(types::CancelBuilder::user_data(ud(kind, token, gen)).all())
                .build()
                .user_data(ud(K_CANCEL, token, gen));
        self.push(&e);
    }

    /// Takes a socket onto the ring; `arm` starts its receive now (else
    /// [`Ring::start_receiving`] does once it is connected). A listener's
    /// accepts start when its accept loop first asks. `mode_set`: the
    /// descriptor is blocking already (the ring's accepts ask no `O_NONBLOCK`).
    pub(in crate::io) fn register(
        &self,
        s: &mut Slot,
        token: u32,
        arm: bool,
        mode_set: bool,
    ) -> io::Result<()> {
        if !mode_set {
            set_blocking(s.fd)?;
        }
        if arm && s.role == Role::Stream {
            self.arm_recv(s, token);
        }
        Ok(())
    }

    /// Arms the receive of a socket that just connected.
    pub(in crate::io) fn start_receiving(&self, s: &mut Slot, token: u32) {
        if !s.be.u().recv_armed && !s.be.u().recv_hold && !s.closed {
            self.arm_recv(s, token);
        }
    }

    /// Gives buffer `bid` back to the kernel and re-arms a starved socket.
    fn recycle(&self, st: &mut State, bid: u16) {
        self.bufs.add(bid);
        self.bufs.publish();
        self.held.set(self.held.get() - 1);
        #[cfg(debug_assertions)]
        {
            self.in_ring.set(self.in_ring.get() + 1);
            debug_assert_eq!(
                self.in_ring.get() + self.held.get(),
                self.bufs.entries as usize
            );
        }
        let next = self.starved.borrow_mut().pop();
        if let Some((t, gen)) = next {
            let s = &mut st.slots[t as usize];
            if s.in_use && s.gen == gen && !s.closed && s.be.u().recv_starved {
                let u = s.be.u();
                u.recv_starved = false;
                if !u.recv_armed && !u.recv_paused && !u.recv_hold && !s.hup {
                    self.arm_recv(s, t);
                }
            }
        }
    }

    /// A one-shot readiness poll for a starved socket (no buffer needed).
    fn arm_poll(&self, s: &mut Slot, token: u32) {
        if s.be.u().poll_armed || s.closed {
            return;
        }
        let e = opcode::PollAdd::new(types::Fd(s.fd), libc::POLLIN as u32)
            .build()
            .user_data(ud(K_POLL, token, s.gen));
        self.push(&e);
        let u = s.be.u();
        u.poll_armed = true;
        u.ops += 1;
    }

    pub(in crate::io) fn buffers_held(&self) -> usize {
        self.held.get()
    }

    /// Frees the send chunks the last interval's peak did not need.
    pub(in crate::io) fn trim(&self) {
        self.sends.trim();
    }

    /// Send chunks idle in the pool (tests: a copied send leaves one).
    #[cfg(test)]
    pub(in crate::io) fn chunks_idle(&self) -> usize {
        self.sends.idle.iter().map(|v| v.borrow().len()).sum()
    }

    /// Sends and connects outstanding in the kernel (tests).
    #[cfg(test)]
    pub(in crate::io) fn ops_in_flight(st: &State) -> usize {
        st.slots
            .iter()
            .filter(|s| s.in_use)
            .filter(|s| {
                matches!(&s.be, super::SlotBe::Uring(u) if matches!(u.op, Op::InFlight | Op::Cancelling))
            })
            .count()
    }
}

/// The ring's kernel workers (they run its splices, `splice.rs`) stay on
/// the shard's CPUs, as the shard does, and are at most two per pipe a
/// shard may have out. A kernel that refuses either keeps its defaults.
fn limit_workers(ring: &IoUring) {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity fills it for this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0 {
            let _ = ring.submitter().register_iowq_aff(&set);
        }
    }
    let mut max = [0u32, 2 * super::sock::PIPES_MAX as u32];
    let _ = ring.submitter().register_iowq_max_workers(&mut max);
}

/// Clears `O_NONBLOCK`: io_uring waits on a blocking socket with its own
/// poll, while on a non-blocking one a receive could end with `EAGAIN`.
fn set_blocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on an open descriptor; results are checked.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        if fl < 0 {
            return Err(io::Error::last_os_error());
        }
        if fl & libc::O_NONBLOCK != 0 && libc::fcntl(fd, libc::F_SETFL, fl & !libc::O_NONBLOCK) < 0
        {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}
