//! Splicing on the ring, the epoll way: a socket's receive held off while non-blocking `splice(2)` calls on the shard thread move its bytes into a pipe and out of it into another socket, waiting on the ring's readiness polls when a socket is empty or full.
//!
//! `IORING_OP_SPLICE` is always punted to the ring's kernel workers (a
//! splice may block), and on a socket their wake-ups cost about what the
//! copies it saves (BENCHMARKS.md, "Bodies"). So the splices run inline,
//! as on epoll: a splice that finds the socket empty (in) or full (out)
//! says `EAGAIN`, and the side waits for a one-shot `POLLIN` / `POLLOUT`
//! poll on the ring. Nothing of a splice stays in the kernel after the
//! call, so a future that goes away, a deadline or a released socket leave
//! no pipe or bytes behind (a poll still armed only wakes the side).
//!
//! `SPLICE_F_NONBLOCK` makes only the pipe side non-blocking: the socket
//! side follows the socket's own `O_NONBLOCK`, which the ring clears
//! (`set_blocking`). A socket is made non-blocking at its first splice and
//! stays so: the ring's receives and sends never depend on it (they pass
//! `MSG_DONTWAIT` themselves and wait on the ring's own poll).
//!
//! Before the first splice the socket's multishot receive is cancelled and
//! held off (`recv_hold`), and the buffers it queued are relayed first, so
//! the bytes keep their order; resuming re-arms it.

use std::io;
use std::task::{Context, Poll};
use std::time::Instant;

use io_uring::{opcode, types};

use super::super::ops::OpId;
use super::super::sock::PipeFds;
use super::super::{Driver, Side, Slot, State, RD, WR};
use super::{ud, Op, Ring, K_RECV, K_WPOLL};

impl Ring {
    /// Holds off (`on`) or resumes the socket's multishot receive.
    pub(in crate::io) fn hold_receiving(&self, s: &mut Slot, token: u32, on: bool) {
        let gen = s.gen;
        let u = s.be.u();
        if on == u.recv_hold {
            return;
        }
        u.recv_hold = on;
        if on {
            if u.recv_armed {
                self.cancel(K_RECV, token, gen);
            }
        } else if !u.recv_armed && !s.hup && !s.closed {
            u.recv_paused = false;
            u.recv_starved = false;
            self.arm_recv(s, token);
        }
    }

    /// Whether a held-off receive has ended with no buffer queued.
    pub(in crate::io) fn receive_idle(s: &mut Slot) -> bool {
        let u = s.be.u();
        u.recv_hold && !u.recv_armed && u.rq_head == super::NO_BUF
    }

    /// One splice between socket `token` and `pipe`: into it (`into_pipe`,
    /// up to `n` bytes, the pipe empty; 0 at EOF) or out of it (at most the
    /// `n` bytes it holds). Waits, up to `deadline`, on a readiness poll
    /// while the socket is empty or full. `op` marks a future that waits
    /// (its guard resets the side if it goes away, [`Ring::drop_splice`]).
    #[allow(clippy::too_many_arguments)]
    pub(in crate::io) fn poll_splice(
        &self,
        d: &Driver,
        st: &mut State,
        token: u32,
        op: &mut OpId,
        pipe: &PipeFds,
        n: usize,
        into_pipe: bool,
        deadline: Option<Instant>,
        cx: &Context<'_>,
    ) -> Poll<io::Result<usize>> {
        let which = if into_pipe { RD } else { WR };
        let s = &mut st.slots[token as usize];
        if op.0.is_none() {
            side(s, which).timed_out = false;
            op.0 = Some(0);
        }
        let r = match self.try_splice(s, token, pipe, n, into_pipe) {
            Some(r) => r,
            // Woken by the poll, the completion of the send before, or the deadline.
            None => match st.wait_side(token, which, cx, deadline, d.now()) {
                Ok(()) => return Poll::Pending,
                Err(e) => Err(e),
            },
        };
        op.0 = None;
        let sd = side(&mut st.slots[token as usize], which);
        sd.deadline = None;
        sd.timed_out = false;
        Poll::Ready(r)
    }

    /// One non-blocking splice; `None`: the socket is empty (in) or full
    /// (out), or another future's send still holds the write side, and its
    /// poll (or that send's completion) wakes the side.
    fn try_splice(
        &self,
        s: &mut Slot,
        token: u32,
        pipe: &PipeFds,
        n: usize,
        into_pipe: bool,
    ) -> Option<io::Result<usize>> {
        if into_pipe && s.hup && s.error == 0 {
            // The peer's FIN came in on the receive before it was held.
            return Some(Ok(0));
        }
        if !into_pipe {
            match s.be.u().op {
                Op::InFlight | Op::Cancelling => return None,
                // A finished send nobody took (its future went away).
                Op::Done(_) => self.finish(s),
                Op::Idle => {}
            }
        }
        let r = nonblocking(s).and_then(|()| {
            if into_pipe {
                pipe.fill_from(s.fd, n)
            } else {
                pipe.drain_to(s.fd, n)
            }
        });
        match r {
            Ok(0) if into_pipe => {
                s.hup = true;
                Some(Ok(0))
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if into_pipe {
                    s.be.u().poll_ready = false;
                    self.arm_poll(s, token);
                } else {
                    self.arm_wpoll(s, token);
                }
                None
            }
            r => Some(r),
        }
    }

    /// The splice future of `op` went away while it waited: its side's
    /// waiter and deadline go (nothing of a splice is left in the kernel).
    pub(in crate::io) fn drop_splice(s: &mut Slot, into_pipe: bool, op: &mut OpId) {
        if op.0.take().is_some() {
            *side(s, if into_pipe { RD } else { WR }) = Side::default();
        }
    }

    /// A one-shot writability poll (a splice out found the socket full).
    fn arm_wpoll(&self, s: &mut Slot, token: u32) {
        let u = s.be.u();
        if u.wpoll_armed || s.closed {
            return;
        }
        let e = opcode::PollAdd::new(types::Fd(s.fd), libc::POLLOUT as u32)
            .build()
            .user_data(ud(K_WPOLL, token, s.gen));
        u.wpoll_armed = true;
        u.ops += 1;
        self.push(&e);
    }

    /// The writability poll completed: the write side tries again.
    pub(super) fn on_wpoll(s: &mut Slot) {
        let u = s.be.u();
        u.wpoll_armed = false;
        u.ops -= 1;
        s.wr.wake();
    }
}

/// The read or write side of a slot.
fn side(s: &mut Slot, which: u8) -> &mut Side {
    if which == RD {
        &mut s.rd
    } else {
        &mut s.wr
    }
}

/// Makes the socket non-blocking for `splice(2)` (once per socket).
fn nonblocking(s: &mut Slot) -> io::Result<()> {
    let u = s.be.u();
    if u.nonblock {
        return Ok(());
    }
    // SAFETY: fcntl on an open descriptor; results are checked.
    unsafe {
        let fl = libc::fcntl(s.fd, libc::F_GETFL);
        if fl < 0 || libc::fcntl(s.fd, libc::F_SETFL, fl | libc::O_NONBLOCK) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    u.nonblock = true;
    Ok(())
}
