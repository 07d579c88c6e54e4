//! The ring's per-socket operations: closing, reading what multishot receives queued, the send/connect state machine over driver-owned memory, and accepts taken only on demand.

use std::io;
use std::os::fd::RawFd;
use std::task::{Context, Poll};
use std::time::Instant;

use io_uring::{opcode, types};

use super::super::addr::sockaddr;
use super::super::ops::OpId;
use super::super::sock::Lent;
use super::super::{timed_out, Driver, Role, Slot, State, NO_BUF, WR};
use super::bufs::Chunk;
use super::{
    ud, Op, Ring, What, ACCEPTS_IN_FLIGHT, K_ACCEPT, K_CONNECT, K_POLL, K_RECV, K_SEND,
    K_SPLICE_OUT, RQ_MAX,
};

impl Ring {
    /// A released socket: its queued buffers go back, its entries are
    /// cancelled. Returns whether none is left (the caller frees the slot
    /// and closes the descriptor now); otherwise the last completion does.
    pub(in crate::io) fn release(&self, st: &mut State, token: u32) -> bool {
        let s = &mut st.slots[token as usize];
        let gen = s.gen;
        let listener = s.role == Role::Listener;
        let u = s.be.u();
        let mut bid = u.rq_head;
        u.rq_head = NO_BUF;
        u.rq_tail = NO_BUF;
        u.rq_len = 0;
        u.rq_off = 0;
        if u.recv_armed {
            self.cancel(K_RECV, token, gen);
        }
        if listener && u.accepts_armed > 0 {
            self.cancel(K_ACCEPT, token, gen);
        }
        if u.poll_armed {
            self.cancel(K_POLL, token, gen);
        }
        self.abandon_splice_in(s, token);
        self.abandon(s, token);
        while bid != NO_BUF {
            let next = self.meta.borrow()[bid as usize].next;
            self.recycle(st, bid);
            bid = next;
        }
        let u = st.slots[token as usize].be.u();
        if u.ops == 0 {
            self.give_back(u);
            u.rpipe = None;
            for fd in u.accepted.drain(..) {
                // SAFETY: accepted descriptors nobody took are ours to close.
                unsafe { libc::close(fd) };
            }
            return true;
        }
        false
    }

    /// Copies queued bytes into `buf`. `None`: nothing queued, not at EOF.
    pub(in crate::io) fn try_read(
        &self,
        st: &mut State,
        token: u32,
        buf: &mut [u8],
    ) -> Option<io::Result<usize>> {
        let mut n = 0;
        loop {
            let s = st.slots[token as usize].be.u();
            if n == buf.len() || s.rq_head == NO_BUF {
                break;
            }
            let bid = s.rq_head;
            let m = self.meta.borrow()[bid as usize];
            let take = ((m.len - s.rq_off) as usize).min(buf.len() - n);
            buf[n..n + take].copy_from_slice(self.bufs.data(bid, s.rq_off, take as u32));
            n += take;
            self.drop_head(st, token, take as u32);
        }
        let s = &mut st.slots[token as usize];
        self.caught_up(s, token);
        if n > 0 || buf.is_empty() {
            return Some(Ok(n));
        }
        if s.be.u().recv_starved && !s.hup {
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
            s.be.u().poll_ready = false;
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

    /// Lends the unread bytes of the socket's first queued buffer, where
    /// the kernel put them, to `f`, which returns how many it consumed:
    /// those are dropped, the rest stays queued for the next read or lend,
    /// and a buffer used up goes back to the ring. `f` runs with the slot
    /// table borrowed and must not call into the driver. `None`: nothing
    /// queued, not at EOF; [`Lent::Copy`]: the socket reads past the buffer
    /// ring (it ran dry), so the caller reads into its own buffer.
    pub(in crate::io) fn try_lend(
        &self,
        st: &mut State,
        token: u32,
        f: &mut dyn FnMut(&mut [u8]) -> usize,
    ) -> Option<io::Result<Lent>> {
        let s = &mut st.slots[token as usize];
        let u = s.be.u();
        if u.rq_head == NO_BUF {
            if u.recv_starved && !s.hup {
                return Some(Ok(Lent::Copy));
            }
            if s.hup {
                return Some(if s.error != 0 {
                    Err(io::Error::from_raw_os_error(s.error))
                } else {
                    Ok(Lent::Eof)
                });
            }
            return None;
        }
        let bid = u.rq_head;
        let m = self.meta.borrow()[bid as usize];
        let len = (m.len - u.rq_off) as usize;
        // SAFETY: bytes rq_off..len of buffer `bid` were written by the
        // kernel before it completed the receive; zgix owns the buffer
        // while it is queued here, and nothing else refers to it until it
        // is recycled below, after `f` returns.
        let bytes = unsafe { std::slice::from_raw_parts_mut(self.bufs.at(bid, u.rq_off), len) };
        let used = f(bytes).min(len);
        self.drop_head(st, token, used as u32);
        self.caught_up(&mut st.slots[token as usize], token);
        Some(Ok(Lent::Bytes(used)))
    }

    /// Drops `n` bytes of the socket's first queued buffer (read or lent);
    /// a buffer used up goes back to the ring.
    fn drop_head(&self, st: &mut State, token: u32, n: u32) {
        let u = st.slots[token as usize].be.u();
        let bid = u.rq_head;
        let m = self.meta.borrow()[bid as usize];
        u.rq_off += n;
        if u.rq_off == m.len {
            u.rq_head = m.next;
            if u.rq_head == NO_BUF {
                u.rq_tail = NO_BUF;
            }
            u.rq_len -= 1;
            u.rq_off = 0;
            self.recycle(st, bid);
        }
    }

    /// After a read or a lend: bulk relaying ends (the next bytes are a
    /// head, or small), a receive paused for a full queue resumes once
    /// the reader has caught up, and a one-buffer receive is armed again
    /// at the next turn once the queue is empty.
    fn caught_up(&self, s: &mut Slot, token: u32) {
        let u = s.be.u();
        u.rq_cap = RQ_MAX;
        if u.recv_paused && !u.recv_armed && !u.recv_hold && u.rq_len <= RQ_MAX / 2 && !s.hup {
            u.recv_paused = false;
            self.arm_recv(s, token);
        } else if u.recv_one {
            self.arm_later(s, token);
        }
    }

    /// Whether a read would complete now (bytes queued, or EOF/error, or a
    /// starved socket's poll said readable). A starved socket with nothing
    /// to report gets its readiness poll armed.
    pub(in crate::io) fn has_input(&self, s: &mut Slot, token: u32) -> bool {
        let u = s.be.u();
        if u.rq_head != NO_BUF || s.hup {
            return true;
        }
        if u.recv_hold && !u.recv_armed {
            // Held off and stopped: the splice that reads next can go.
            return true;
        }
        if u.recv_starved {
            if u.poll_ready {
                return true;
            }
            self.arm_poll(s, token);
        }
        false
    }

    /// Whether the peer closed or sent something unasked.
    pub(in crate::io) fn is_stale(s: &mut Slot) -> bool {
        s.hup || s.be.u().rq_head != NO_BUF
    }

    /// Starts or polls the send or connect of future `op` on `token`. A
    /// deadline that passes ends the wait at once (the operation is
    /// cancelled and its memory stays with the driver until it completes).
    #[allow(clippy::too_many_arguments)]
    pub(in crate::io) fn poll_op(
        &self,
        d: &Driver,
        st: &mut State,
        token: u32,
        op: &mut OpId,
        what: What<'_>,
        deadline: Option<Instant>,
        cx: &Context<'_>,
    ) -> Poll<io::Result<usize>> {
        let s = &mut st.slots[token as usize];
        let mine = op.0.is_some() && op.0 == Some(s.be.u().op_seq);
        let u = s.be.u();
        match u.op {
            // Another future's operation (one forgotten mid-flight) still
            // holds the write side: wait for its completion first.
            Op::InFlight | Op::Cancelling if !mine => op.0 = None,
            Op::InFlight | Op::Cancelling => {}
            Op::Done(_) | Op::Idle if !mine => {
                self.finish(s);
                self.start(d, s, token, what);
                op.0 = Some(s.be.u().op_seq);
                s.wr.timed_out = false;
            }
            Op::Done(res) if res == -libc::EAGAIN && u.send_inline && u.op_kind == K_SEND => {
                // The inline attempt found the socket full: send the same
                // chunk again, waiting in the kernel for room this time.
                u.send_full = true;
                self.submit_send(d, s, token, false);
            }
            Op::Done(res)
                if res > 0
                    && u.op_kind == K_SEND
                    && u.send
                        .as_ref()
                        .is_some_and(|c| c.is_owned() && (res as usize) < c.len()) =>
            {
                // An owned buffer is sent whole: the rest goes on, waiting
                // in the kernel for room.
                if let Some(c) = u.send.as_mut() {
                    c.advance(res as usize);
                }
                u.send_full = true;
                self.submit_send(d, s, token, false);
            }
            Op::Done(res) => {
                if u.op_kind == K_SEND {
                    // A short write means the socket filled up: the next
                    // send waits for room; a whole one clears that.
                    let len = u.send.as_ref().map_or(0, |c| c.len());
                    u.send_full = res >= 0 && (res as usize) < len;
                }
                let connect = u.op_kind == K_CONNECT;
                self.finish(s);
                op.0 = None;
                s.wr.deadline = None;
                return Poll::Ready(op_result(res, connect));
            }
            Op::Idle => {
                op.0 = None;
                return Poll::Ready(Err(io::Error::other("operation lost")));
            }
        }
        self.wait_op(d, st, token, op, deadline, cx)
    }

    /// The write side of `token` waits for its operation's completion (up
    /// to `deadline`; one that passes abandons the operation to the driver).
    pub(super) fn wait_op<T>(
        &self,
        d: &Driver,
        st: &mut State,
        token: u32,
        op: &mut OpId,
        deadline: Option<Instant>,
        cx: &Context<'_>,
    ) -> Poll<io::Result<T>> {
        match st.wait_side(token, WR, cx, deadline, d.now()) {
            Ok(()) => Poll::Pending,
            Err(e) => {
                let s = &mut st.slots[token as usize];
                self.abandon(s, token);
                op.0 = None;
                Poll::Ready(Err(e))
            }
        }
    }

    /// The future of `op` went away: its operation is cancelled and left to
    /// the driver, which recycles its memory at the completion.
    pub(in crate::io) fn drop_op(&self, s: &mut Slot, token: u32, op: &mut OpId) {
        if op.0 == Some(s.be.u().op_seq) {
            self.abandon(s, token);
        }
        op.0 = None;
        s.wr = Default::default();
    }

    /// Nobody will take the result of the slot's operation.
    pub(super) fn abandon(&self, s: &mut Slot, token: u32) {
        let gen = s.gen;
        let u = s.be.u();
        match u.op {
            Op::InFlight => {
                self.cancel(u.op_kind, token, gen);
                u.op = Op::Cancelling;
                u.abandoned = true;
            }
            Op::Cancelling => u.abandoned = true,
            Op::Done(_) => self.finish(s),
            Op::Idle => {}
        }
    }

    /// Ends a completed operation: its chunk goes back to the pool.
    pub(super) fn finish(&self, s: &mut Slot) {
        let u = s.be.u();
        u.op = Op::Idle;
        self.give_back(u);
    }

    /// A send's memory goes back: its chunk to the pool, a relayed send's
    /// provided buffers to the list the next turn recycles.
    pub(super) fn give_back(&self, u: &mut super::USock) {
        if let Some(c) = u.send.take() {
            self.sends.give(c);
        }
        if let Some(r) = u.relay.take() {
            self.returned.borrow_mut().extend_from_slice(r.bids());
        }
        if let Some(g) = u.gather.take() {
            self.pool_gather(g);
        }
        u.wpipe = None;
    }

    /// Starts an operation: copies a send's bytes into a chunk, boxes a
    /// connect's address; the slot owns them until the completion.
    fn start(&self, d: &Driver, s: &mut Slot, token: u32, what: What<'_>) {
        let u = s.be.u();
        u.op_seq = u.op_seq.wrapping_add(1);
        match what {
            What::Send(_) | What::SendOwned(_) => {
                let c = match what {
                    What::Send(b) => self.sends.fill(b),
                    What::SendOwned(v) => Chunk::owned(v.take().unwrap_or_default()),
                    _ => unreachable!(),
                };
                let n = c.len();
                u.send = Some(c);
                u.op_kind = K_SEND;
                let bulk = n > super::SEND_CHUNK;
                let inline = !u.send_full && !u.bulk && !bulk && n <= super::INLINE_SEND_MAX;
                u.bulk = bulk;
                self.submit_send(d, s, token, inline);
            }
            What::Splice(pipe, n) => {
                let e = opcode::Splice::new(
                    types::Fd(pipe.r),
                    -1,
                    types::Fd(s.fd),
                    -1,
                    n.min(u32::MAX as usize) as u32,
                )
                .flags(libc::SPLICE_F_MOVE)
                .build()
                .user_data(ud(K_SPLICE_OUT, token, s.gen));
                u.wpipe = Some(pipe.clone());
                u.op_kind = K_SPLICE_OUT;
                u.send_inline = false;
                u.op = Op::InFlight;
                u.ops += 1;
                self.push(&e);
            }
            What::Connect(addr) => {
                let a = Box::new(sockaddr(addr));
                let e = opcode::Connect::new(types::Fd(s.fd), a.as_ptr(), a.len())
                    .build()
                    .user_data(ud(K_CONNECT, token, s.gen));
                u.addr = Some(a);
                u.op_kind = K_CONNECT;
                u.send_inline = false;
                u.op = Op::InFlight;
                u.ops += 1;
                self.push(&e);
            }
        }
    }

    /// Queues a send of the slot's chunk. An `inline` send (`MSG_DONTWAIT`,
    /// unless the socket was full last time or the write is a long one) is
    /// completed by the kernel within the enter that submits it, with what
    /// fitted or `EAGAIN`, and never kept waiting, so a park can submit it
    /// and still sleep until the next real event. After `EAGAIN` or a short
    /// write the send waits for room (counted in `sends_waited`).
    fn submit_send(&self, d: &Driver, s: &mut Slot, token: u32, inline: bool) {
        let (fd, gen) = (s.fd, s.gen);
        let u = s.be.u();
        if u.send_full {
            d.stats.sends_waited.set(d.stats.sends_waited.get() + 1);
        }
        let flags = if inline {
            libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT
        } else {
            libc::MSG_NOSIGNAL
        };
        let c = u.send.as_ref().expect("a send has its chunk");
        let e = opcode::Send::new(types::Fd(fd), c.ptr(), c.len() as u32)
            .flags(flags)
            .build()
            .user_data(ud(K_SEND, token, gen));
        u.send_inline = inline;
        u.op = Op::InFlight;
        u.ops += 1;
        // A send before zgix's own close is followed by nothing from the
        // peer: counted, it would hold the park until the backstop.
        // Nor is a send after which its task goes on with bytes it has
        // already read (a request that came with the TLS handshake's
        // Finished): the task waits for this completion, not for the peer.
        let goes_on = std::mem::take(&mut u.goes_on);
        let counted = inline && !u.closing && !goes_on;
        if self.push(&e) && counted {
            self.inline_sends.set(self.inline_sends.get() + 1);
        }
    }

    /// Marks the socket as closing after what it sends from now on (the
    /// last answer, a refusal, `close_notify`): its inline sends still go
    /// out within the enter that submits them, but a park no longer waits
    /// for one more event on their account.
    pub(in crate::io) fn set_closing(s: &mut Slot) {
        s.be.u().closing = true;
    }

    /// Marks the socket's next send as followed by work on bytes already
    /// read, not by a peer event (see [`crate::io::Sock::goes_on`]).
    pub(in crate::io) fn set_goes_on(s: &mut Slot) {
        s.be.u().goes_on = true;
    }

    /// The watchdog found the listener's accept lost: its accepts are
    /// cancelled (each cancelled one wakes the loop, which arms afresh), or,
    /// with none armed, the loop is woken to arm them.
    pub(in crate::io) fn restart_accepts(&self, s: &mut Slot, token: u32) {
        if s.be.u().accepts_armed > 0 {
            self.cancel(K_ACCEPT, token, s.gen);
        } else {
            s.rd.wake();
        }
    }

    /// The listener was paused: its armed accepts are cancelled, so none of
    /// them takes a connection that arrives later off the backlog (one that
    /// completed first hands out its descriptor, paused or not).
    pub(in crate::io) fn stop_accepts(&self, s: &mut Slot, token: u32) {
        if s.be.u().accepts_armed > 0 {
            self.cancel(K_ACCEPT, token, s.gen);
        }
    }

    /// An accepted descriptor or error, if one is there; otherwise, unless
    /// the listener is paused, accepts are submitted so that at most
    /// [`ACCEPTS_IN_FLIGHT`] are outstanding or waiting to be taken.
    pub(in crate::io) fn try_accept(&self, s: &mut Slot, token: u32) -> Option<io::Result<RawFd>> {
        let u = s.be.u();
        if let Some(fd) = u.accepted.pop_front() {
            return Some(Ok(fd));
        }
        if u.accept_error != 0 {
            let e = std::mem::take(&mut u.accept_error);
            return Some(Err(io::Error::from_raw_os_error(e)));
        }
        while !s.paused && !s.closed {
            let u = s.be.u();
            if u.accepts_armed as usize + u.accepted.len() >= ACCEPTS_IN_FLIGHT {
                break;
            }
            self.arm_accept(s, token);
        }
        None
    }
}

/// What a send's (or connect's) completion result means to its caller: a
/// send of 0 bytes is `WriteZero`, a cancelled one a timeout.
pub(super) fn op_result(res: i32, connect: bool) -> io::Result<usize> {
    if res > 0 || (connect && res == 0) {
        Ok(res as usize)
    } else if res == 0 {
        Err(io::ErrorKind::WriteZero.into())
    } else if res == -libc::ECANCELED || res == -libc::ETIME {
        Err(timed_out())
    } else {
        Err(io::Error::from_raw_os_error(-res))
    }
}
