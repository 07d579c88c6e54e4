//! Gathered sends on the ring: one `IORING_OP_SENDMSG` over the framing (copied into the operation) and ranges of a shared receive buffer (held by its `Rc` until the completion), continued by the driver after a short write.
//!
//! Like a relayed send (`relay.rs`), the operation's memory — the iovecs,
//! the message header, the framing copy and the clone of the buffer's `Rc`
//! — is one box that belongs to the socket's slot from submission to
//! completion: a future that goes away, a deadline, a released socket all
//! leave it with the driver, which drops the `Rc` (and pools the box) when
//! the kernel is done. The caller learns only "all of it went" or the error.

use std::io;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Instant;

use super::super::gather::{Gather, GATHER_FRAMING, GATHER_IOVS};
use super::super::ops::OpId;
use super::super::{Buf, Driver, Slot, State};
use super::sock::op_result;
use super::{Op, Ring, K_SEND};

/// Idle operation boxes a shard keeps, so a steady load allocates none.
const POOLED: usize = 16;

/// One gathered send's memory, kept put (boxed) until its completion.
pub(in crate::io) struct GatherOp {
    /// The buffer the data iovecs point into: alive until the completion.
    shared: Option<Rc<Buf>>,
    framing: [u8; GATHER_FRAMING],
    iov: [libc::iovec; GATHER_IOVS],
    n: usize,
    /// The first iovec not wholly sent (after a short write).
    first: usize,
    msg: libc::msghdr,
    total: usize,
    sent: usize,
}

impl GatherOp {
    fn new() -> Box<GatherOp> {
        Box::new(GatherOp {
            shared: None,
            framing: [0; GATHER_FRAMING],
            iov: [libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            }; GATHER_IOVS],
            n: 0,
            first: 0,
            // SAFETY: msghdr is plain data; all-zero is an empty header.
            msg: unsafe { std::mem::zeroed() },
            total: 0,
            sent: 0,
        })
    }

    /// Takes `g` past its first `skip` bytes: a clone of its buffer's
    /// `Rc`, a copy of its framing, the iovecs over both.
    fn load(&mut self, g: &Gather<'_>, skip: usize) {
        self.shared = Some(g.shared.clone());
        self.framing[..g.framing.len()].copy_from_slice(g.framing);
        self.n = g.iovecs(skip, self.framing.as_ptr(), &mut self.iov);
        self.first = 0;
        self.total = g.len() - skip;
        self.sent = 0;
        self.aim();
    }

    /// Points the header at the iovecs still to send.
    fn aim(&mut self) {
        // SAFETY: first <= n <= GATHER_IOVS: in bounds of the array (or one past).
        self.msg.msg_iov = unsafe { self.iov.as_mut_ptr().add(self.first) };
        self.msg.msg_iovlen = (self.n - self.first) as _;
    }
}

impl Ring {
    /// Starts (first call) or polls the gathered send of future `op` on
    /// `token` of `g` past its first `skip` bytes; `Ok` once all of that
    /// went.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::io) fn poll_gather(
        &self,
        d: &Driver,
        st: &mut State,
        token: u32,
        op: &mut OpId,
        g: &Gather<'_>,
        skip: usize,
        deadline: Option<Instant>,
        cx: &Context<'_>,
    ) -> Poll<io::Result<usize>> {
        let s = &mut st.slots[token as usize];
        let mine = op.0.is_some() && op.0 == Some(s.be.u().op_seq);
        match s.be.u().op {
            // Another future's operation still holds the write side.
            Op::InFlight | Op::Cancelling if !mine => op.0 = None,
            Op::InFlight | Op::Cancelling => {}
            Op::Done(_) | Op::Idle if !mine => {
                self.finish(s);
                self.start_gather(s, token, g, skip);
                op.0 = Some(s.be.u().op_seq);
                s.wr.timed_out = false;
            }
            Op::Done(res) => {
                self.finish(s);
                op.0 = None;
                s.wr.deadline = None;
                return Poll::Ready(op_result(res, false));
            }
            Op::Idle => {
                op.0 = None;
                return Poll::Ready(Err(io::Error::other("operation lost")));
            }
        }
        self.wait_op(d, st, token, op, deadline, cx)
    }

    fn start_gather(&self, s: &mut Slot, token: u32, g: &Gather<'_>, skip: usize) {
        let mut b = self
            .gathers
            .borrow_mut()
            .pop()
            .unwrap_or_else(GatherOp::new);
        b.load(g, skip);
        let u = s.be.u();
        u.op_seq = u.op_seq.wrapping_add(1);
        u.op_kind = K_SEND;
        u.send_inline = false;
        u.gather = Some(b);
        self.submit_gather(s, token);
    }

    fn submit_gather(&self, s: &mut Slot, token: u32) {
        let g =
            s.be.u()
                .gather
                .as_ref()
                .expect("a gathered send has its iovecs");
        let msg: *const libc::msghdr = &g.msg;
        self.submit_sendmsg(s, token, msg);
    }

    /// A gathered send's completion: true if the rest was sent again (a
    /// short write, resumed at the iovec and byte it stopped at; the
    /// operation stays in flight), else it is done.
    pub(super) fn gather_sent(&self, s: &mut Slot, token: u32, res: i32) -> bool {
        let u = s.be.u();
        let g = u.gather.as_mut().expect("a gathered send has its iovecs");
        if res <= 0 {
            u.op = Op::Done(res);
            return false;
        }
        g.sent += res as usize;
        if g.sent >= g.total {
            u.op = Op::Done(g.total.min(i32::MAX as usize) as i32);
            return false;
        }
        super::iov::advance(&mut g.iov, &mut g.first, g.n, res as usize);
        g.aim();
        self.submit_gather(s, token);
        true
    }

    /// A gathered send's box comes back: its `Rc` goes (the buffer's owner
    /// may write it again), the box to the pool.
    pub(super) fn pool_gather(&self, mut g: Box<GatherOp>) {
        g.shared = None;
        let mut pool = self.gathers.borrow_mut();
        if pool.len() < POOLED {
            pool.push(g);
        }
    }
}
