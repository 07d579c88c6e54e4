//! The one interface above the backends: registering and closing a socket, reading, waiting for input, writing, connecting and accepting are each written once here, and only the backend's own step is chosen by [`Backend`].
//!
//! The shape follows monoio's driver: an operation is started and polled
//! through one entry point ([`Driver::poll_write`], [`Driver::poll_connect`],
//! [`Driver::poll_accept`], ...), and a future that goes away mid-operation
//! calls [`Driver::drop_op`], which never blocks: on the ring the driver
//! keeps what the kernel may still read (the send's chunk, the connect's
//! address) until the completion arrives.

use std::io;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Instant;

use super::gather::{Gather, GATHER_IOVS};
use super::sock::PipeFds;
use super::{epoll, uring, Backend, Driver, Role, Side, Slot, SlotBe, State, RD, WR};

/// What one relay step did ([`Driver::poll_relay`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Relayed {
    /// That many bytes of the source's received buffers went out on the
    /// destination, without a copy in user space.
    Sent(usize),
    /// Nothing is queued on the source: wait until it is readable.
    Empty,
    /// The source's next bytes are to be read and written (a buffer longer
    /// than the bytes asked for, a socket read past the buffer ring, or a
    /// backend that does not relay buffers: epoll).
    Copy,
}

/// Which operation of a slot's write side a future started (ring: the
/// operation's sequence number; epoll: whether its connect was issued).
#[derive(Default)]
pub(super) struct OpId(pub(super) Option<u32>);

impl Driver {
    /// Registers a socket of `role` and returns its token; `arm` starts its
    /// receive at once (not for a socket still connecting). `mode_set`: the
    /// descriptor already has the blocking mode the backend wants (one this
    /// backend's own accept made), so no `fcntl` checks it.
    pub(super) fn register(
        &self,
        fd: RawFd,
        role: Role,
        arm: bool,
        mode_set: bool,
    ) -> io::Result<u32> {
        let mut st = self.st.borrow_mut();
        let st = &mut *st;
        let token = match st.free.pop() {
            Some(t) => t,
            None => {
                st.slots.push(Slot::default());
                (st.slots.len() - 1) as u32
            }
        };
        let s = &mut st.slots[token as usize];
        let gen = s.gen.wrapping_add(1) & 0x00ff_ffff;
        *s = Slot {
            in_use: true,
            gen,
            fd,
            role,
            be: match &self.backend {
                Backend::Uring(_) => SlotBe::Uring(uring::USock::new()),
                Backend::Epoll(_) => SlotBe::Epoll(epoll::ESock::new(arm)),
            },
            ..Slot::default()
        };
        let r = match &self.backend {
            Backend::Uring(r) => r.register(s, token, arm, mode_set),
            Backend::Epoll(e) => e.register(fd, token, role, mode_set),
        };
        if let Err(e) = r {
            let s = &mut st.slots[token as usize];
            s.in_use = false;
            s.be = SlotBe::default();
            st.free.push(token);
            return Err(e);
        }
        if role == Role::Listener {
            st.watch_listener(token);
        }
        Ok(token)
    }

    /// The owner let go of `token`: its waiters go, its kernel work is
    /// cancelled, and the socket is closed and the slot freed once no
    /// submitted or queued kernel operation names the descriptor (so its
    /// number cannot be reused under an operation still to be issued).
    pub(super) fn release(&self, token: u32) {
        let mut st = self.st.borrow_mut();
        let st = &mut *st;
        let s = &mut st.slots[token as usize];
        s.closed = true;
        s.rd = Side::default();
        s.wr = Side::default();
        let idle = match &self.backend {
            Backend::Uring(r) => r.release(st, token),
            Backend::Epoll(e) => e.release(s),
        };
        if idle {
            Driver::free_slot(st, token);
        }
    }

    /// Closes the descriptor of a released slot with no kernel operation
    /// left, and frees the slot (called by the backends).
    pub(super) fn free_slot(st: &mut State, token: u32) {
        let s = &mut st.slots[token as usize];
        debug_assert!(s.closed && s.in_use);
        // SAFETY: the slot owned this descriptor and nothing refers to it
        // any more; it is closed once, here.
        unsafe { libc::close(s.fd) };
        s.in_use = false;
        s.rd = Side::default();
        s.wr = Side::default();
        s.be = SlotBe::default();
        st.free.push(token);
    }

    /// Copies what `token` has received into `buf`. `None`: nothing yet.
    pub(super) fn try_read(&self, token: u32, buf: &mut [u8]) -> Option<io::Result<usize>> {
        let mut st = self.st.borrow_mut();
        match &self.backend {
            Backend::Uring(r) => r.try_read(&mut st, token, buf),
            Backend::Epoll(_) => epoll::Epoll::try_read(&mut st.slots[token as usize], buf),
        }
    }

    /// Waits on the read side of `token` (`Err` once `deadline` passed).
    pub(super) fn wait_read(
        &self,
        token: u32,
        cx: &Context<'_>,
        deadline: Option<Instant>,
    ) -> io::Result<()> {
        self.st
            .borrow_mut()
            .wait_side(token, RD, cx, deadline, self.now())
    }

    /// Whether a read of `token` would complete now.
    pub(super) fn has_input(&self, token: u32) -> bool {
        let mut st = self.st.borrow_mut();
        let s = &mut st.slots[token as usize];
        match &self.backend {
            Backend::Uring(r) => r.has_input(s, token),
            Backend::Epoll(_) => epoll::Epoll::has_input(s),
        }
    }

    /// Whether the peer of `token` closed or sent something unasked.
    pub(super) fn is_stale(&self, token: u32) -> bool {
        let mut st = self.st.borrow_mut();
        let s = &mut st.slots[token as usize];
        match &self.backend {
            Backend::Uring(_) => uring::Ring::is_stale(s),
            Backend::Epoll(_) => epoll::Epoll::is_stale(s),
        }
    }

    /// One write of `buf` on `token`: how many bytes the kernel took.
    pub(super) fn poll_write(
        &self,
        token: u32,
        op: &mut OpId,
        buf: &[u8],
        deadline: Option<Instant>,
        cx: &Context<'_>,
    ) -> Poll<io::Result<usize>> {
        let now = self.now();
        let mut st = self.st.borrow_mut();
        match &self.backend {
            Backend::Uring(r) => r.poll_op(
                self,
                &mut st,
                token,
                op,
                uring::What::Send(buf),
                deadline,
                cx,
            ),
            Backend::Epoll(_) => epoll::Epoll::poll_write(&mut st, token, buf, deadline, cx, now),
        }
    }

    /// Sends all of the buffer in `owned` on `token` (uring only: the ring
    /// takes the buffer at the start and gives it to the send-buffer pool
    /// at the completion); the count of the last piece the kernel took.
    pub(super) fn poll_write_owned(
        &self,
        token: u32,
        op: &mut OpId,
        owned: &std::cell::Cell<Option<Vec<u8>>>,
        deadline: Option<Instant>,
        cx: &Context<'_>,
    ) -> Poll<io::Result<usize>> {
        let what = uring::What::SendOwned(owned);
        match &self.backend {
            Backend::Uring(r) => r.poll_op(
                self,
                &mut self.st.borrow_mut(),
                token,
                op,
                what,
                deadline,
                cx,
            ),
            Backend::Epoll(_) => unreachable!("epoll sends from the caller's slice"),
        }
    }

    /// A gathered send of `g` on `token`. uring: started on the first call
    /// and continued by the driver until all of it went (the count is the
    /// whole); epoll: one `sendmsg` of `g` past its first `skip` bytes,
    /// what the kernel took.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn poll_gather(
        &self,
        token: u32,
        op: &mut OpId,
        g: &Gather<'_>,
        skip: usize,
        deadline: Option<Instant>,
        cx: &Context<'_>,
    ) -> Poll<io::Result<usize>> {
        let now = self.now();
        let mut st = self.st.borrow_mut();
        match &self.backend {
            Backend::Uring(r) => r.poll_gather(self, &mut st, token, op, g, skip, deadline, cx),
            Backend::Epoll(_) => {
                let mut iov = [libc::iovec {
                    iov_base: std::ptr::null_mut(),
                    iov_len: 0,
                }; GATHER_IOVS];
                let n = g.iovecs(skip, g.framing.as_ptr(), &mut iov);
                epoll::Epoll::poll_gather(&mut st, token, &mut iov[..n], deadline, cx, now)
            }
        }
    }

    /// Starts (first call) or polls a relayed send on `dst` of the whole
    /// buffers queued on `src` (at most `max` bytes); epoll: always
    /// [`Relayed::Copy`].
    #[allow(clippy::too_many_arguments)]
    pub(super) fn poll_relay(
        &self,
        src: u32,
        dst: u32,
        op: &mut OpId,
        max: usize,
        deadline: Option<Instant>,
        cx: &Context<'_>,
    ) -> Poll<io::Result<Relayed>> {
        let mut st = self.st.borrow_mut();
        match &self.backend {
            Backend::Uring(r) => r.poll_relay(self, &mut st, src, dst, op, max, deadline, cx),
            Backend::Epoll(_) => Poll::Ready(Ok(Relayed::Copy)),
        }
    }

    /// One splice between socket `token` and pipe `fds`: into the pipe
    /// (`into_pipe`, up to `n` bytes, on the read side) or out of it (at
    /// most the `n` bytes it holds, on the write side). epoll: a
    /// non-blocking `splice(2)` on readiness; uring: an `IORING_OP_SPLICE`
    /// (the kernel runs it in a worker, since splicing may block).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn poll_splice(
        &self,
        token: u32,
        op: &mut OpId,
        fds: &Rc<PipeFds>,
        n: usize,
        into_pipe: bool,
        deadline: Option<Instant>,
        cx: &Context<'_>,
    ) -> Poll<io::Result<usize>> {
        let now = self.now();
        let mut st = self.st.borrow_mut();
        let r = match &self.backend {
            Backend::Uring(r) if into_pipe => {
                r.poll_splice_in(self, &mut st, token, op, fds, n, deadline, cx)
            }
            Backend::Uring(r) => r.poll_op(
                self,
                &mut st,
                token,
                op,
                uring::What::Splice(fds, n),
                deadline,
                cx,
            ),
            Backend::Epoll(_) => epoll_splice(&mut st, token, fds, n, into_pipe, deadline, cx, now),
        };
        if let Poll::Ready(Ok(k)) = r {
            if !into_pipe {
                let c = &self.stats.spliced_bytes;
                c.set(c.get() + k as u64);
            }
        }
        r
    }

    /// A splice future went away (see [`Driver::drop_op`]).
    pub(super) fn drop_splice(&self, token: u32, into_pipe: bool, op: &mut OpId) {
        if !into_pipe {
            return self.drop_op(token, op);
        }
        if op.0.is_none() {
            return;
        }
        let mut st = self.st.borrow_mut();
        if let Backend::Uring(r) = &self.backend {
            r.drop_splice_in(&mut st.slots[token as usize], token, op);
        }
        op.0 = None;
    }

    /// Holds off or resumes the ring's receive on `token` (splices read
    /// the socket meanwhile); nothing on epoll.
    pub(super) fn hold_receiving(&self, token: u32, on: bool) {
        if let Backend::Uring(r) = &self.backend {
            let mut st = self.st.borrow_mut();
            r.hold_receiving(&mut st.slots[token as usize], token, on);
        }
    }

    /// Sets whether the ring's receive on `token` takes one buffer per
    /// arming (`uring/one.rs`); nothing on epoll.
    pub(super) fn receive_one(&self, token: u32, on: bool) {
        if let Backend::Uring(r) = &self.backend {
            let mut st = self.st.borrow_mut();
            r.receive_one(&mut st.slots[token as usize], token, on);
        }
    }

    /// Marks `token` as closing after what it sends now (uring: its
    /// inline sends stop counting in the park's wait); nothing on epoll.
    pub(super) fn set_closing(&self, token: u32) {
        if let Backend::Uring(_) = &self.backend {
            uring::Ring::set_closing(&mut self.st.borrow_mut().slots[token as usize]);
        }
    }

    /// Marks `token`'s next send as followed by work on bytes already read
    /// (uring: it does not count in the park's wait); nothing on epoll.
    pub(super) fn set_goes_on(&self, token: u32) {
        if let Backend::Uring(_) = &self.backend {
            uring::Ring::set_goes_on(&mut self.st.borrow_mut().slots[token as usize]);
        }
    }

    /// Whether `token`'s held-off receive ended with nothing queued (epoll: always).
    pub(super) fn receive_idle(&self, token: u32) -> bool {
        let mut st = self.st.borrow_mut();
        let s = &mut st.slots[token as usize];
        match &self.backend {
            Backend::Uring(_) => uring::Ring::receive_idle(s),
            Backend::Epoll(_) => true,
        }
    }

    /// Starts (first call) or polls the connect of `token` to `addr`.
    pub(super) fn poll_connect(
        &self,
        token: u32,
        op: &mut OpId,
        addr: SocketAddr,
        deadline: Option<Instant>,
        cx: &Context<'_>,
    ) -> Poll<io::Result<()>> {
        let now = self.now();
        let mut st = self.st.borrow_mut();
        match &self.backend {
            Backend::Uring(r) => r
                .poll_op(
                    self,
                    &mut st,
                    token,
                    op,
                    uring::What::Connect(addr),
                    deadline,
                    cx,
                )
                .map_ok(|_| ()),
            Backend::Epoll(_) => epoll::Epoll::poll_connect(&mut st, token, deadline, cx, now),
        }
    }

    /// The future of operation `op` on `token` went away: nothing blocks;
    /// the ring keeps the operation's memory until its completion.
    pub(super) fn drop_op(&self, token: u32, op: &mut OpId) {
        if op.0.is_none() {
            return;
        }
        let mut st = self.st.borrow_mut();
        let s = &mut st.slots[token as usize];
        match &self.backend {
            Backend::Uring(r) => r.drop_op(s, token, op),
            Backend::Epoll(_) => {
                op.0 = None;
                s.wr = Side::default();
            }
        }
    }

    /// Starts receiving on a socket that just connected.
    pub(super) fn start_receiving(&self, token: u32) {
        if let Backend::Uring(r) = &self.backend {
            let mut st = self.st.borrow_mut();
            r.start_receiving(&mut st.slots[token as usize], token);
        }
    }

    /// The next accepted descriptor of listener `token`, if any; else its
    /// waker is kept. A paused listener hands out only what the kernel had
    /// already accepted for it and takes nothing more off the backlog.
    pub(super) fn poll_accept(&self, token: u32, cx: &Context<'_>) -> Poll<io::Result<RawFd>> {
        let mut st = self.st.borrow_mut();
        let s = &mut st.slots[token as usize];
        let got = match &self.backend {
            Backend::Uring(r) => r.try_accept(s, token),
            Backend::Epoll(_) if s.paused => None,
            Backend::Epoll(_) => epoll::Epoll::try_accept(s),
        };
        if let Some(r) = got {
            st.taken_from(token);
            return Poll::Ready(r);
        }
        s.rd.set_waker(cx);
        Poll::Pending
    }

    /// Stops or restarts taking connections off the backlog of listener `token`.
    pub(super) fn set_accepting(&self, token: u32, on: bool) {
        let mut st = self.st.borrow_mut();
        let s = &mut st.slots[token as usize];
        s.paused = !on;
        if on {
            s.rd.wake();
            self.kick();
        } else if let Backend::Uring(r) = &self.backend {
            r.stop_accepts(s, token);
        }
    }

    /// Issues the connect of a new socket where the backend does that
    /// before registering it (epoll); the ring submits it in [`Driver::poll_connect`].
    pub(super) fn begin_connect(&self, fd: RawFd, addr: SocketAddr) -> io::Result<()> {
        match &self.backend {
            // The ring's connect is an entry submitted by `poll_connect`.
            Backend::Uring(_) => Ok(()),
            Backend::Epoll(_) => epoll::Epoll::begin_connect(fd, addr),
        }
    }

    /// The write side of `token` waits (`Err` once `deadline` passed).
    pub(super) fn wait_write(
        st: &mut State,
        token: u32,
        cx: &Context<'_>,
        deadline: Option<Instant>,
        now: Instant,
    ) -> io::Result<()> {
        st.wait_side(token, WR, cx, deadline, now)
    }
}

/// epoll's splice: one non-blocking `splice(2)`, else a wait for the edge.
#[allow(clippy::too_many_arguments)]
fn epoll_splice(
    st: &mut State,
    token: u32,
    fds: &PipeFds,
    n: usize,
    into_pipe: bool,
    deadline: Option<Instant>,
    cx: &Context<'_>,
    now: Instant,
) -> Poll<io::Result<usize>> {
    let s = &mut st.slots[token as usize];
    let got = if into_pipe {
        epoll::Epoll::try_splice_in(s, fds, n)
    } else {
        epoll::Epoll::try_splice_out(s, fds, n)
    };
    if let Some(r) = got {
        return Poll::Ready(r);
    }
    let which = if into_pipe { RD } else { WR };
    if let Err(e) = st.wait_side(token, which, cx, deadline, now) {
        return Poll::Ready(Err(e));
    }
    let e = st.slots[token as usize].be.e();
    if (into_pipe && e.readable) || (!into_pipe && e.writable) {
        cx.waker().wake_by_ref();
    }
    Poll::Pending
}
