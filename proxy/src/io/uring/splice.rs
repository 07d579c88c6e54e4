//! Splicing on the ring: a socket's receive held off while `IORING_OP_SPLICE` reads it into a pipe (the read side's own operation), so a relayed body moves socket to pipe to socket without a copy.
//!
//! The kernel runs a splice in one of the ring's workers (splicing may
//! block), so a splice waits there for bytes or room without holding the
//! shard. The pipe a splice names stays open (an `Rc` in the slot) until
//! its completion, whatever happens to the future; a released socket
//! cancels its splices and is closed only once they completed.
//!
//! Before the first splice the socket's multishot receive is cancelled and
//! held off (`recv_hold`), and the buffers it queued are relayed first, so
//! the bytes keep their order; resuming re-arms it.

use std::io;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Instant;

use io_uring::{opcode, types};

use super::super::ops::OpId;
use super::super::sock::PipeFds;
use super::super::{timed_out, Driver, Slot, State, RD};
use super::{ud, Op, Ring, K_RECV, K_SPLICE_IN};

impl Ring {
    /// Holds off (`on`) or resumes the socket's receive. Holds nest: it
    /// resumes when the last is let go.
    pub(in crate::io) fn hold_receiving(&self, s: &mut Slot, token: u32, on: bool) {
        let gen = s.gen;
        let u = s.be.u();
        u.holds = if on {
            u.holds.saturating_add(1)
        } else {
            u.holds.saturating_sub(1)
        };
        if on == u.recv_hold || (!on && u.holds > 0) {
            return;
        }
        u.recv_hold = on;
        if on {
            if u.recv_armed {
                self.cancel(K_RECV, token, gen);
            }
        } else if !u.recv_armed && u.rsplice == Op::Idle && !s.hup && !s.closed {
            u.recv_paused = false;
            u.recv_starved = false;
            self.arm_recv(s, token);
        }
        // With a splice still in flight (a cancelled one), the receive is
        // armed at its completion: two readers would split the bytes.
    }

    /// Whether a held-off receive has ended with no buffer queued.
    pub(in crate::io) fn receive_idle(s: &mut Slot) -> bool {
        let u = s.be.u();
        u.recv_hold && !u.recv_armed && u.rq_head == super::NO_BUF
    }

    /// Starts (first call) or polls the splice of up to `n` bytes from
    /// socket `token` into `pipe`.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::io) fn poll_splice_in(
        &self,
        d: &Driver,
        st: &mut State,
        token: u32,
        op: &mut OpId,
        pipe: &Rc<PipeFds>,
        n: usize,
        deadline: Option<Instant>,
        cx: &Context<'_>,
    ) -> Poll<io::Result<usize>> {
        let s = &mut st.slots[token as usize];
        let (fd, gen) = (s.fd, s.gen);
        let u = s.be.u();
        let mine = op.0.is_some() && op.0 == Some(u.rsplice_seq);
        match u.rsplice {
            Op::InFlight | Op::Cancelling if !mine => op.0 = None,
            Op::InFlight | Op::Cancelling => {}
            Op::Done(_) | Op::Idle if !mine => {
                u.rsplice = Op::Idle;
                u.rpipe = None;
                if s.hup && s.error == 0 {
                    // The peer's FIN came in on the receive before it was held.
                    return Poll::Ready(Ok(0));
                }
                let e = opcode::Splice::new(
                    types::Fd(fd),
                    -1,
                    types::Fd(pipe.w),
                    -1,
                    n.min(u32::MAX as usize) as u32,
                )
                .flags(libc::SPLICE_F_MOVE)
                .build()
                .user_data(ud(K_SPLICE_IN, token, gen));
                u.rsplice_seq = u.rsplice_seq.wrapping_add(1);
                u.rpipe = Some(pipe.clone());
                u.rsplice = Op::InFlight;
                u.ops += 1;
                op.0 = Some(u.rsplice_seq);
                s.rd.timed_out = false;
                self.push(&e);
            }
            Op::Done(res) => {
                u.rsplice = Op::Idle;
                u.rpipe = None;
                op.0 = None;
                s.rd.deadline = None;
                return Poll::Ready(if res >= 0 {
                    Ok(res as usize)
                } else if res == -libc::ECANCELED || res == -libc::EINTR {
                    Err(timed_out())
                } else {
                    Err(io::Error::from_raw_os_error(-res))
                });
            }
            Op::Idle => {
                op.0 = None;
                return Poll::Ready(Err(io::Error::other("operation lost")));
            }
        }
        match st.wait_side(token, RD, cx, deadline, d.now()) {
            Ok(()) => Poll::Pending,
            Err(e) => {
                let s = &mut st.slots[token as usize];
                self.abandon_splice_in(s, token);
                op.0 = None;
                Poll::Ready(Err(e))
            }
        }
    }

    /// The splice-in future of `op` went away.
    pub(in crate::io) fn drop_splice_in(&self, s: &mut Slot, token: u32, op: &mut OpId) {
        if op.0 == Some(s.be.u().rsplice_seq) {
            self.abandon_splice_in(s, token);
        }
        s.rd = Default::default();
    }

    /// Nobody will take the result of the socket's splice in.
    pub(super) fn abandon_splice_in(&self, s: &mut Slot, token: u32) {
        let gen = s.gen;
        let u = s.be.u();
        match u.rsplice {
            Op::InFlight => {
                self.cancel(K_SPLICE_IN, token, gen);
                u.rsplice = Op::Cancelling;
                u.rsplice_abandoned = true;
            }
            Op::Cancelling => u.rsplice_abandoned = true,
            Op::Done(_) => {
                u.rsplice = Op::Idle;
                u.rpipe = None;
            }
            Op::Idle => {}
        }
    }

    /// A splice-in completion.
    pub(super) fn on_splice_in(&self, st: &mut State, token: u32, res: i32) {
        let s = &mut st.slots[token as usize];
        let u = s.be.u();
        u.ops -= 1;
        if std::mem::take(&mut u.rsplice_abandoned) {
            u.rsplice = Op::Idle;
            u.rpipe = None;
        } else {
            u.rsplice = Op::Done(res);
        }
        // Resumed while this splice was in flight: the receive starts now.
        let u = s.be.u();
        if !u.recv_hold && !u.recv_armed && u.rsplice == Op::Idle && !s.hup && !s.closed {
            u.recv_paused = false;
            u.recv_starved = false;
            self.arm_recv(s, token);
        }
        // A released socket's last completion: `dispatch` retires it.
        s.rd.wake();
    }
}
