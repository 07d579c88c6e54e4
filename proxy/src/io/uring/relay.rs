//! Relayed sends on the ring: the provided buffers one socket received are sent on another as they are (one `sendmsg` over up to [`RELAY_BUFS`] of them), without a copy in user space.
//!
//! The buffers leave the source socket's queue when the send starts and
//! belong to the destination's slot until its completion, like a send's
//! chunk: a future that goes away, a deadline, a released socket all leave
//! them with the driver, which gives them back to the buffer ring when the
//! kernel is done (via `Ring::returned`, recycled at the next turn). A
//! short write is continued by the driver itself from the completion, so
//! the caller learns only "all of it went" or the error.

use std::io;
use std::task::{Context, Poll};
use std::time::Instant;

use io_uring::{opcode, types};

use super::super::ops::{OpId, Relayed};
use super::super::{Driver, Slot, State, NO_BUF};
use super::sock::op_result;
use super::{ud, Op, Ring, K_SEND, RELAY_BUFS, RQ_BULK};

/// One relayed send: the buffers, the iovecs over them and the message
/// header the kernel reads, all in one box that stays put until the
/// completion.
pub(in crate::io) struct Relay {
    bids: [u16; RELAY_BUFS],
    n: usize,
    iov: [libc::iovec; RELAY_BUFS],
    /// The first iovec not wholly sent (after a short write).
    first: usize,
    msg: libc::msghdr,
    total: usize,
    sent: usize,
}

impl Relay {
    pub(super) fn bids(&self) -> &[u16] {
        &self.bids[..self.n]
    }

    fn empty() -> Box<Relay> {
        Box::new(Relay {
            bids: [NO_BUF; RELAY_BUFS],
            n: 0,
            iov: [libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            }; RELAY_BUFS],
            first: 0,
            // SAFETY: msghdr is plain data; all-zero is an empty header.
            msg: unsafe { std::mem::zeroed() },
            total: 0,
            sent: 0,
        })
    }

    /// Points the header at the iovecs still to send.
    fn aim(&mut self) {
        // SAFETY: first <= n <= RELAY_BUFS: in bounds of the array (or one past).
        self.msg.msg_iov = unsafe { self.iov.as_mut_ptr().add(self.first) };
        self.msg.msg_iovlen = self.n - self.first;
    }
}

impl Ring {
    /// Recycles the buffers of relayed sends that ended without the slot
    /// table at hand.
    pub(super) fn drain_returned(&self, st: &mut State) {
        loop {
            let bid = self.returned.borrow_mut().pop();
            match bid {
                Some(b) => self.recycle(st, b),
                None => break,
            }
        }
    }

    /// Takes the whole buffers queued on `src`, up to `max` bytes and
    /// [`RELAY_BUFS`] buffers, off its queue. `Err`: none queued
    /// ([`Relayed::Empty`]) or the first is longer than `max`
    /// ([`Relayed::Copy`]: the caller reads a part of it).
    fn take_queued(&self, st: &mut State, src: u32, max: usize) -> Result<Box<Relay>, Relayed> {
        let s = &mut st.slots[src as usize];
        let u = s.be.u();
        if u.rq_head == NO_BUF {
            return Err(Relayed::Empty);
        }
        let mut r = Relay::empty();
        {
            let meta = self.meta.borrow();
            let (mut bid, mut off) = (u.rq_head, u.rq_off);
            while bid != NO_BUF && r.n < RELAY_BUFS {
                let m = meta[bid as usize];
                let len = (m.len - off) as usize;
                if r.total + len > max {
                    break;
                }
                let data = self.bufs.data(bid, off, len as u32);
                r.iov[r.n] = libc::iovec {
                    iov_base: data.as_ptr() as *mut libc::c_void,
                    iov_len: len,
                };
                r.bids[r.n] = bid;
                r.n += 1;
                r.total += len;
                off = 0;
                bid = m.next;
            }
            if r.n == 0 {
                return Err(Relayed::Copy);
            }
            u.rq_head = bid;
        }
        if u.rq_head == NO_BUF {
            u.rq_tail = NO_BUF;
        }
        u.rq_len -= r.n as u16;
        u.rq_off = 0;
        u.rq_cap = RQ_BULK;
        if u.recv_paused && !u.recv_armed && !u.recv_hold && u.rq_len <= RQ_BULK / 2 && !s.hup {
            u.recv_paused = false;
            self.arm_recv(s, src);
        } else if u.recv_one {
            self.arm_later(s, src);
        }
        Ok(r)
    }

    /// Starts (first call) or polls the relayed send of future `op`: the
    /// whole buffers queued on `src` (at most `max` bytes) sent on `dst`.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::io) fn poll_relay(
        &self,
        d: &Driver,
        st: &mut State,
        src: u32,
        dst: u32,
        op: &mut OpId,
        max: usize,
        deadline: Option<Instant>,
        cx: &Context<'_>,
    ) -> Poll<io::Result<Relayed>> {
        self.drain_returned(st);
        let s = &mut st.slots[dst as usize];
        let mine = op.0.is_some() && op.0 == Some(s.be.u().op_seq);
        match s.be.u().op {
            // Another future's operation still holds the write side.
            Op::InFlight | Op::Cancelling if !mine => op.0 = None,
            Op::InFlight | Op::Cancelling => {}
            Op::Done(_) | Op::Idle if !mine => {
                self.finish(s);
                let r = match self.take_queued(st, src, max) {
                    Ok(r) => r,
                    Err(why) => return Poll::Ready(Ok(why)),
                };
                let s = &mut st.slots[dst as usize];
                self.start_relay(d, s, dst, r);
                op.0 = Some(s.be.u().op_seq);
                s.wr.timed_out = false;
            }
            Op::Done(res) => {
                self.finish(s);
                op.0 = None;
                s.wr.deadline = None;
                self.drain_returned(st);
                return Poll::Ready(op_result(res, false).map(Relayed::Sent));
            }
            Op::Idle => {
                op.0 = None;
                return Poll::Ready(Err(io::Error::other("operation lost")));
            }
        }
        self.wait_op(d, st, dst, op, deadline, cx)
    }

    fn start_relay(&self, d: &Driver, s: &mut Slot, token: u32, mut r: Box<Relay>) {
        r.aim();
        let st = &d.stats;
        st.relayed_sends.set(st.relayed_sends.get() + 1);
        st.relayed_bytes
            .set(st.relayed_bytes.get() + r.total as u64);
        let u = s.be.u();
        u.op_seq = u.op_seq.wrapping_add(1);
        u.op_kind = K_SEND;
        u.send_inline = false;
        u.relay = Some(r);
        self.submit_relay(s, token);
    }

    fn submit_relay(&self, s: &mut Slot, token: u32) {
        let r =
            s.be.u()
                .relay
                .as_ref()
                .expect("a relayed send has its buffers");
        let msg: *const libc::msghdr = &r.msg;
        self.submit_sendmsg(s, token, msg);
    }

    /// Queues the slot's `sendmsg` of `msg`, a header in a box the slot
    /// holds until the completion (a relayed or a gathered send).
    pub(super) fn submit_sendmsg(&self, s: &mut Slot, token: u32, msg: *const libc::msghdr) {
        let (fd, gen) = (s.fd, s.gen);
        let u = s.be.u();
        let e = opcode::SendMsg::new(types::Fd(fd), msg)
            .flags(libc::MSG_NOSIGNAL as u32)
            .build()
            .user_data(ud(K_SEND, token, gen));
        u.op = Op::InFlight;
        u.ops += 1;
        self.push(&e);
    }

    /// A relayed send's completion: true if the rest was sent again (a
    /// short write; the operation stays in flight), else it is done.
    pub(super) fn relay_sent(&self, s: &mut Slot, token: u32, res: i32) -> bool {
        let u = s.be.u();
        let r = u.relay.as_mut().expect("a relayed send has its buffers");
        if res <= 0 {
            u.op = Op::Done(res);
            return false;
        }
        r.sent += res as usize;
        if r.sent >= r.total {
            u.op = Op::Done(r.total as i32);
            return false;
        }
        super::iov::advance(&mut r.iov, &mut r.first, r.n, res as usize);
        r.aim();
        self.submit_relay(s, token);
        true
    }
}
