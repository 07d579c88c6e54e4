//! The io_uring backend: zgix's own ring per shard, multishot receive into a provided-buffer ring, multishot accept, batched sends and connects.
//!
//! # Buffer ownership
//!
//! The kernel owns a provided buffer from the moment it is in the ring until
//! a receive completion hands it back with its id; zgix then owns it until
//! its bytes are copied out, when it goes back to the ring. Each socket
//! keeps the buffers it received in arrival order (a list threaded through
//! [`Meta`]); a released socket gives its buffers back at once, and a
//! completion for a socket that is gone gives its buffer back too, so no
//! buffer is lost whatever is dropped when.
//!
//! A send reads the caller's bytes until its completion (an inline send,
//! `MSG_DONTWAIT`, completes within the enter that submits it). The send future
//! waits for that completion even when it times out (it asks for a cancel
//! and waits); a send future dropped early cancels and blocks until the
//! kernel is done with the bytes ([`super::Driver::wait_op_done`]).
//!
//! # Backpressure
//!
//! A multishot receive keeps receiving while armed. A socket with
//! [`RQ_MAX`] buffers unread has its receive cancelled (the kernel's socket
//! buffer and TCP window take over) and re-armed once its reader has caught
//! up, so one fast sender cannot take the shard's buffers from everyone.
//! When the ring runs dry anyway a receive ends with `ENOBUFS`; the socket
//! waits on a list and is re-armed as buffers come back.

use std::cell::{Cell, RefCell};
use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

use io_uring::{cqueue, opcode, squeue, types, IoUring};

use super::buf::Mapping;
use super::{Driver, Op, Options, Role, Slot, State, Turn, NO_BUF};

/// What the one log line says when the ring is refused and the shard runs on epoll.
pub const REFUSED_HINT: &str = "The ring needs io_uring_setup (seccomp profiles such as Docker's default \
block it) and kernel 6.1+ for DEFER_TASKRUN; its memory is charged to the memory cgroup, not RLIMIT_MEMLOCK. \
Set \"io\": {\"driver\": \"epoll\"} to choose epoll without this message.";

/// Unread buffers at which a socket's receive is paused.
pub const RQ_MAX: u16 = 4;

/// Buffer group id of the shard's provided-buffer ring.
const BGID: u16 = 0;

/// Lazy turns in a row that may leave queued entries unsubmitted.
pub const MAX_DEFERRED_TURNS: u32 = 2;

/// Inline sends a park counts past (its `wait_nr` stays far below the CQ size).
const MAX_INLINE_COUNTED: u32 = 64;

const K_RECV: u64 = 1;
const K_SEND: u64 = 2;
const K_CONNECT: u64 = 3;
const K_ACCEPT: u64 = 4;
const K_CANCEL: u64 = 5;
const K_WAKE: u64 = 6;
const K_POLL: u64 = 7;

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

/// The provided-buffer ring: the entry ring the kernel reads and the buffers.
struct BufRing {
    ring: Mapping,
    bufs: Mapping,
    entries: u16,
    size: u32,
    /// Our copy of the ring tail (the kernel reads the shared one).
    tail: Cell<u16>,
}

impl BufRing {
    fn new(entries: u32, size: u32) -> io::Result<BufRing> {
        let ring = Mapping::new((entries as usize * 16).max(4096))?;
        let bufs = Mapping::new(entries as usize * size as usize)?;
        Ok(BufRing {
            ring,
            bufs,
            entries: entries as u16,
            size,
            tail: Cell::new(0),
        })
    }

    fn shared_tail(&self) -> &AtomicU16 {
        // SAFETY: the ring tail is the u16 at offset 14 of the first entry
        // (`struct io_uring_buf_ring`); the mapping is page aligned and alive.
        unsafe { &*(self.ring.ptr.add(14) as *const AtomicU16) }
    }

    /// Puts buffer `bid` at the tail; published by [`BufRing::publish`].
    fn add(&self, bid: u16) {
        let t = self.tail.get();
        let idx = (t & (self.entries - 1)) as usize;
        // SAFETY: idx < entries, so the entry lies inside the ring mapping.
        // Each entry is { addr: u64, len: u32, bid: u16, resv: u16 }; the
        // `resv` of entry 0 is the shared tail, so it is not written here.
        unsafe {
            let e = self.ring.ptr.add(idx * 16);
            (e as *mut u64).write(self.bufs.ptr.add(bid as usize * self.size as usize) as u64);
            (e.add(8) as *mut u32).write(self.size);
            (e.add(12) as *mut u16).write(bid);
        }
        self.tail.set(t.wrapping_add(1));
    }

    fn publish(&self) {
        self.shared_tail().store(self.tail.get(), Ordering::Release);
    }

    fn data(&self, bid: u16, from: u32, len: u32) -> &[u8] {
        debug_assert!(bid < self.entries && from + len <= self.size);
        // SAFETY: the range lies inside buffer `bid`, which zgix owns while
        // it is queued on a socket (the kernel wrote it before completing).
        unsafe {
            std::slice::from_raw_parts(
                self.bufs
                    .ptr
                    .add(bid as usize * self.size as usize + from as usize),
                len as usize,
            )
        }
    }
}

/// The ring and everything it refers to.
pub struct Ring {
    ring: RefCell<IoUring>,
    bufs: BufRing,
    meta: RefCell<Vec<Meta>>,
    /// Buffers queued on sockets (not in the kernel's ring).
    held: Cell<usize>,
    /// Sockets whose receive ended with ENOBUFS, to re-arm as buffers return.
    starved: RefCell<Vec<(u32, u32)>>,
    /// Entries that found the submission queue full (see [`Ring::push`]).
    backlog: RefCell<Vec<squeue::Entry>>,
    /// `MSG_DONTWAIT` sends in the submission queue, not yet submitted: each
    /// posts its completion within the enter that submits it.
    inline_sends: Cell<u32>,
    /// Lazy turns since the last enter.
    deferred: Cell<u32>,
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
            held: Cell::new(0),
            starved: RefCell::new(Vec::with_capacity(64)),
            backlog: RefCell::new(Vec::new()),
            inline_sends: Cell::new(0),
            deferred: Cell::new(0),
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
        let e = opcode::RecvMulti::new(types::Fd(s.fd), BGID)
            .build()
            .user_data(ud(K_RECV, token, s.gen));
        self.push(&e);
        s.recv_armed = true;
        s.ops += 1;
    }

    fn arm_accept(&self, s: &mut Slot, token: u32) {
        let e = opcode::AcceptMulti::new(types::Fd(s.fd))
            .flags(libc::SOCK_CLOEXEC)
            .build()
            .user_data(ud(K_ACCEPT, token, s.gen));
        self.push(&e);
        s.recv_armed = true;
        s.ops += 1;
    }

    fn cancel(&self, kind: u64, token: u32, gen: u32) {
        let e = opcode::AsyncCancel::new(ud(kind, token, gen))
            .build()
            .user_data(ud(K_CANCEL, token, gen));
        self.push(&e);
    }

    /// Takes a socket onto the ring; `arm` starts its receive (or accept)
    /// now, else [`Ring::start_receiving`] does once it is connected.
    pub(super) fn register(&self, d: &Driver, token: u32, arm: bool) -> io::Result<()> {
        let mut st = d.st.borrow_mut();
        let s = &mut st.slots[token as usize];
        set_blocking(s.fd)?;
        if arm {
            match s.role {
                Role::Stream => self.arm_recv(s, token),
                Role::Listener => self.arm_accept(s, token),
            }
        }
        Ok(())
    }

    /// Arms the receive of a socket that just connected.
    pub(super) fn start_receiving(&self, s: &mut Slot, token: u32) {
        if !s.recv_armed && !s.closed {
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
            if s.in_use && s.gen == gen && s.recv_starved && !s.closed {
                s.recv_starved = false;
                if !s.recv_armed && !s.recv_paused && !s.hup {
                    self.arm_recv(s, t);
                }
            }
        }
    }

    /// A one-shot readiness poll for a starved socket (no buffer needed).
    fn arm_poll(&self, s: &mut Slot, token: u32) {
        if s.poll_armed || s.closed {
            return;
        }
        let e = opcode::PollAdd::new(types::Fd(s.fd), libc::POLLIN as u32)
            .build()
            .user_data(ud(K_POLL, token, s.gen));
        self.push(&e);
        s.poll_armed = true;
        s.ops += 1;
    }

    pub(super) fn release(&self, d: &Driver, token: u32) {
        let mut st = d.st.borrow_mut();
        let st = &mut *st;
        let s = &mut st.slots[token as usize];
        s.closed = true;
        s.rd = Default::default();
        s.wr = Default::default();
        let mut bid = s.rq_head;
        s.rq_head = NO_BUF;
        s.rq_tail = NO_BUF;
        s.rq_len = 0;
        s.rq_off = 0;
        let (armed, role, gen, fd, polled) = (s.recv_armed, s.role, s.gen, s.fd, s.poll_armed);
        debug_assert!(!matches!(s.op, Op::InFlight | Op::Cancelling));
        while bid != NO_BUF {
            let next = self.meta.borrow()[bid as usize].next;
            self.recycle(st, bid);
            bid = next;
        }
        if armed {
            let kind = if role == Role::Listener {
                K_ACCEPT
            } else {
                K_RECV
            };
            self.cancel(kind, token, gen);
        }
        if polled {
            self.cancel(K_POLL, token, gen);
        }
        // The armed receive holds its own reference to the socket: the
        // socket itself closes (FIN) once the cancel above completes.
        // SAFETY: the slot owned this descriptor; it is closed once.
        unsafe { libc::close(fd) };
        if st.slots[token as usize].ops == 0 {
            Driver::free_slot(st, token);
        }
    }

    /// Copies queued bytes into `buf`. `None`: nothing queued, not at EOF.
    pub(super) fn try_read(
        &self,
        d: &Driver,
        token: u32,
        buf: &mut [u8],
    ) -> Option<io::Result<usize>> {
        let mut st = d.st.borrow_mut();
        let st = &mut *st;
        let mut n = 0;
        loop {
            let s = &mut st.slots[token as usize];
            if n == buf.len() || s.rq_head == NO_BUF {
                break;
            }
            let bid = s.rq_head;
            let m = self.meta.borrow()[bid as usize];
            let take = ((m.len - s.rq_off) as usize).min(buf.len() - n);
            buf[n..n + take].copy_from_slice(self.bufs.data(bid, s.rq_off, take as u32));
            n += take;
            s.rq_off += take as u32;
            if s.rq_off == m.len {
                s.rq_head = m.next;
                if s.rq_head == NO_BUF {
                    s.rq_tail = NO_BUF;
                }
                s.rq_len -= 1;
                s.rq_off = 0;
                self.recycle(st, bid);
            }
        }
        let s = &mut st.slots[token as usize];
        if s.recv_paused && !s.recv_armed && s.rq_len <= RQ_MAX / 2 && !s.hup {
            s.recv_paused = false;
            self.arm_recv(s, token);
        }
        if n > 0 || buf.is_empty() {
            return Some(Ok(n));
        }
        if s.recv_starved && !s.hup {
            // The buffer ring ran dry: read straight into the caller's
            // buffer while it refills, so a starved socket never waits for
            // other sockets' readers (no shard-wide stall).
            // SAFETY: buf is valid for buf.len() bytes; fd is open.
            let r =
                unsafe { libc::recv(s.fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
            if r > 0 {
                return Some(Ok(r as usize));
            }
            if r == 0 {
                s.hup = true;
                return Some(Ok(0));
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::WouldBlock && e.kind() != io::ErrorKind::Interrupted {
                s.hup = true;
                s.error = e.raw_os_error().unwrap_or(libc::EIO);
                return Some(Err(e));
            }
            s.readable = false;
            self.arm_poll(s, token);
            return None;
        }
        if s.hup {
            return Some(if s.error != 0 {
                Err(io::Error::from_raw_os_error(s.error))
            } else {
                Ok(0)
            });
        }
        None
    }

    /// Whether a read would complete now (bytes queued, or EOF/error, or a
    /// starved socket's poll said readable). A starved socket with nothing
    /// to report gets its readiness poll armed.
    pub(super) fn has_input(&self, s: &mut Slot, token: u32) -> bool {
        if s.rq_head != NO_BUF || s.hup {
            return true;
        }
        if s.recv_starved {
            if s.readable {
                return true;
            }
            self.arm_poll(s, token);
        }
        false
    }

    /// Queues a send of `buf`. Unless the socket was full last time, it is
    /// an inline send (`MSG_DONTWAIT`): the kernel completes it within the
    /// enter that submits it, with what fitted or `EAGAIN`, and never keeps
    /// it waiting, so a park can submit it and still sleep until the next
    /// real event. After `EAGAIN` or a short write the send waits for room.
    pub(super) fn start_send(&self, s: &mut Slot, token: u32, buf: &[u8]) {
        let inline = !s.send_full;
        let flags = if inline {
            libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT
        } else {
            libc::MSG_NOSIGNAL
        };
        let e = opcode::Send::new(
            types::Fd(s.fd),
            buf.as_ptr(),
            buf.len().min(u32::MAX as usize) as u32,
        )
        .flags(flags)
        .build()
        .user_data(ud(K_SEND, token, s.gen));
        if self.push(&e) && inline {
            self.inline_sends.set(self.inline_sends.get() + 1);
        }
        s.send_inline = inline;
        s.op = Op::InFlight;
        s.ops += 1;
    }

    pub(super) fn start_connect(
        &self,
        s: &mut Slot,
        token: u32,
        addr: &(libc::sockaddr_storage, libc::socklen_t),
    ) {
        let e = opcode::Connect::new(
            types::Fd(s.fd),
            (&addr.0 as *const libc::sockaddr_storage).cast(),
            addr.1,
        )
        .build()
        .user_data(ud(K_CONNECT, token, s.gen));
        self.push(&e);
        s.send_inline = false;
        s.op = Op::InFlight;
        s.ops += 1;
    }

    /// Asks the kernel to end slot `token`'s send or connect early.
    pub(super) fn cancel_op(&self, s: &mut Slot, token: u32, connect: bool) {
        if s.op == Op::InFlight {
            self.cancel(if connect { K_CONNECT } else { K_SEND }, token, s.gen);
            s.op = Op::Cancelling;
        }
    }

    /// Stops a listener's multishot accept (the backlog holds new connections).
    pub(super) fn pause_accept(&self, s: &mut Slot, token: u32) {
        if s.recv_armed && !s.recv_paused {
            self.cancel(K_ACCEPT, token, s.gen);
        }
        s.recv_paused = true;
    }

    /// Re-arms a listener's multishot accept if it is not running.
    pub(super) fn resume_accept(&self, s: &mut Slot, token: u32) {
        s.recv_paused = false;
        if !s.recv_armed && !s.closed {
            self.arm_accept(s, token);
        }
    }

    pub(super) fn buffers_held(&self) -> usize {
        self.held.get()
    }

    /// Submits queued entries (a lazy turn may leave them for the park) and
    /// reaps completions; a park or wait sleeps until a completion or the
    /// timeout. A park's `wait_nr` counts past the inline sends it submits:
    /// their completions are posted before the kernel starts waiting, so it
    /// sleeps until one more (a receive, an accept, a wake) arrives.
    pub(super) fn turn(&self, d: &Driver, how: Turn) -> usize {
        let wait: Option<Duration> = how.timeout();
        {
            let mut ring = self.ring.borrow_mut();
            self.flush_backlog(&mut ring);
            let (sq_len, taskrun, overflow) = {
                let mut sq = ring.submission();
                sq.sync();
                (sq.len(), sq.taskrun(), sq.cq_overflow())
            };
            let cq_ready = {
                let mut cq = ring.completion();
                cq.sync();
                !cq.is_empty()
            };
            if overflow {
                d.stats.cq_overflows.set(d.stats.cq_overflows.get() + 1);
            }
            let must_wait = wait.is_some() && !cq_ready;
            let defer = how == Turn::Lazy
                && !taskrun
                && !overflow
                && self.deferred.get() < MAX_DEFERRED_TURNS;
            if sq_len > 0 && defer {
                self.deferred.set(self.deferred.get() + 1);
            }
            if (sq_len > 0 && !defer) || taskrun || overflow || must_wait {
                d.stats.enters.set(d.stats.enters.get() + 1);
                self.deferred.set(0);
                let r = match wait {
                    Some(t) if must_wait => {
                        let ts = types::Timespec::new()
                            .sec(t.as_secs())
                            .nsec(t.subsec_nanos());
                        let args = types::SubmitArgs::new().timespec(&ts);
                        // If the kernel takes fewer entries than queued it
                        // returns without waiting, so an inline send it did
                        // not take is never counted as completed.
                        let want = match how {
                            Turn::Park(_) => 1 + self.inline_sends.get().min(MAX_INLINE_COUNTED),
                            _ => 1,
                        };
                        ring.submitter().submit_with_args(want as usize, &args)
                    }
                    _ => ring.submitter().submit_and_wait(0),
                };
                self.inline_sends.set(0);
                if let Err(e) = r {
                    match e.raw_os_error() {
                        Some(libc::ETIME) | Some(libc::EINTR) | Some(libc::EBUSY)
                        | Some(libc::EAGAIN) => {}
                        _ => crate::log_debug!("io", "io_uring_enter: {e}"),
                    }
                }
            }
        }
        let mut total = 0;
        let mut batch = [(0u64, 0i32, 0u32); 64];
        loop {
            let mut n = 0;
            {
                let mut ring = self.ring.borrow_mut();
                let mut cq = ring.completion();
                for c in &mut cq {
                    batch[n] = (c.user_data(), c.result(), c.flags());
                    n += 1;
                    if n == batch.len() {
                        break;
                    }
                }
            }
            for &(u, res, flags) in &batch[..n] {
                self.dispatch(d, u, res, flags);
            }
            total += n;
            if n < batch.len() {
                break;
            }
        }
        total
    }

    fn dispatch(&self, d: &Driver, u: u64, res: i32, flags: u32) {
        let (kind, token, gen) = ud_parts(u);
        match kind {
            K_WAKE => {
                self.arm_wake();
                d.wake_notified(false);
                return;
            }
            K_CANCEL => return,
            _ => {}
        }
        let bid = cqueue::buffer_select(flags);
        let more = cqueue::more(flags);
        let mut st = d.st.borrow_mut();
        let st = &mut *st;
        if let Some(b) = bid {
            self.held.set(self.held.get() + 1);
            #[cfg(debug_assertions)]
            self.in_ring.set(self.in_ring.get() - 1);
            debug_assert!(b < self.bufs.entries);
        }
        let Some(s) = st
            .slots
            .get_mut(token as usize)
            .filter(|s| s.in_use && s.gen == gen)
        else {
            if let Some(b) = bid {
                self.recycle(st, b);
            }
            return;
        };
        match kind {
            K_RECV => {
                if let Some(b) = bid {
                    if s.closed {
                        self.recycle(st, b);
                    } else {
                        let mut meta = self.meta.borrow_mut();
                        meta[b as usize] = Meta {
                            len: res.max(0) as u32,
                            next: NO_BUF,
                        };
                        if s.rq_tail == NO_BUF {
                            s.rq_head = b;
                        } else {
                            meta[s.rq_tail as usize].next = b;
                        }
                        s.rq_tail = b;
                        s.rq_len += 1;
                    }
                } else if res == 0 {
                    s.hup = true;
                } else if res == -libc::ENOBUFS {
                    if !s.closed {
                        s.recv_starved = true;
                        self.starved.borrow_mut().push((token, gen));
                        d.stats
                            .recv_rearm_nobufs
                            .set(d.stats.recv_rearm_nobufs.get() + 1);
                    }
                } else if res == -libc::ECANCELED && (s.closed || s.recv_paused) {
                } else if res < 0 {
                    s.error = -res;
                    s.hup = true;
                }
                let s = &mut st.slots[token as usize];
                if !more {
                    s.recv_armed = false;
                    s.ops -= 1;
                    if !s.closed && !s.hup && !s.recv_paused && !s.recv_starved {
                        d.stats
                            .recv_rearm_other
                            .set(d.stats.recv_rearm_other.get() + 1);
                        self.arm_recv(s, token);
                    }
                }
                if !s.closed && s.recv_armed && !s.recv_paused && s.rq_len >= RQ_MAX {
                    self.cancel(K_RECV, token, gen);
                    s.recv_paused = true;
                    d.stats.recv_paused.set(d.stats.recv_paused.get() + 1);
                }
                s.rd.wake();
            }
            K_POLL => {
                s.poll_armed = false;
                s.ops -= 1;
                s.readable = true;
                s.rd.wake();
            }
            K_SEND | K_CONNECT => {
                s.op = Op::Done(res);
                s.ops -= 1;
                s.wr.wake();
            }
            K_ACCEPT => {
                if res >= 0 {
                    if s.closed {
                        // SAFETY: a descriptor accepted for a closed listener is ours to close.
                        unsafe { libc::close(res) };
                    } else {
                        s.accepted.push_back(res);
                    }
                } else if res != -libc::ECANCELED {
                    s.accept_error = -res;
                }
                if !more {
                    s.recv_armed = false;
                    s.ops -= 1;
                }
                s.rd.wake();
            }
            _ => {}
        }
        if st.slots[token as usize].closed && st.slots[token as usize].ops == 0 {
            Driver::free_slot(st, token);
        }
    }
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
