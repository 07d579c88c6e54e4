//! One-buffer receives: a socket whose last body took the bulk path takes its next head one provided buffer per receive, so the body behind that head stays in the socket for the splices.
//!
//! A multishot receive cannot be stopped in time for that. With
//! `DEFER_TASKRUN` the kernel runs it when the shard enters the ring, and
//! it then loops over what the socket holds (up to 32 buffers, 512 KiB of
//! 16 KiB ones) before zgix sees the first completion: most of a 1 MiB
//! response was in provided buffers before its head was parsed, and went
//! out by `sendmsg` over them (a copy into and one out of user memory)
//! instead of through the pipe. A one-shot receive (`IORING_OP_RECV` with
//! a selected buffer) takes one buffer and ends; the next is armed only
//! once the reader has emptied the queue, and only at the start of the
//! next turn ([`Ring::arm_deferred`]): the task that read the head runs
//! in between and, if the body takes the bulk path, holds the receive
//! off first (`splice.rs`), so nothing more is read from the socket.
//!
//! The mode is a guess from the socket's last body (`conn/bulk.rs` sets it
//! when it holds a receive for splicing, the head of a body that does not
//! take the bulk path clears it): sockets that carry small requests never
//! leave the multishot receive. A fresh connection starts on the multishot
//! receive too, so its first large body is still mostly pulled into
//! buffers and relayed from them.

use super::super::{Slot, State, NO_BUF};
use super::{Op, Ring};

impl Ring {
    /// Sets whether the socket receives one buffer per arming (`on`) or
    /// with a multishot receive. Turning it off arms the multishot receive
    /// now if nothing is armed and nothing holds it off; turning it on
    /// takes effect at the next arming (a multishot one still armed keeps
    /// running: the caller holds it off when it must stop).
    pub(in crate::io) fn receive_one(&self, s: &mut Slot, token: u32, on: bool) {
        let u = s.be.u();
        if u.recv_one == on {
            return;
        }
        u.recv_one = on;
        if !on && Ring::may_arm(s) {
            self.arm_recv(s, token);
        }
    }

    /// A one-buffer socket whose queue is empty and whose receive is not
    /// armed gets it armed at the start of the next turn, unless held off
    /// by then.
    pub(super) fn arm_later(&self, s: &mut Slot, token: u32) {
        if s.be.u().recv_one && s.be.u().rq_head == NO_BUF && Ring::may_arm(s) {
            self.rearm.borrow_mut().push((token, s.gen));
        }
    }

    /// Arms the receives [`Ring::arm_later`] put off, where they still may
    /// be (called before the turn submits).
    pub(super) fn arm_deferred(&self, st: &mut State) {
        loop {
            let next = self.rearm.borrow_mut().pop();
            let Some((token, gen)) = next else { break };
            let s = &mut st.slots[token as usize];
            if !s.in_use || s.gen != gen {
                continue;
            }
            // Back on the multishot receive meanwhile, it is armed whatever
            // is queued (its buffers join the queue behind those).
            let u = s.be.u();
            let empty = u.rq_head == NO_BUF || !u.recv_one;
            if empty && Ring::may_arm(s) {
                self.arm_recv(s, token);
            }
        }
    }

    /// Whether nothing stands in the way of arming the socket's receive:
    /// none armed, not held off, paused or starved, no splice reading it,
    /// the peer still there.
    fn may_arm(s: &mut Slot) -> bool {
        let (closed, hup) = (s.closed, s.hup);
        let u = s.be.u();
        !closed
            && !hup
            && !u.recv_armed
            && !u.recv_hold
            && !u.recv_paused
            && !u.recv_starved
            && u.rsplice == Op::Idle
    }
}
