//! The ring's turn: submitting what is queued (or leaving it for the park), sleeping in `io_uring_enter`, and dispatching each completion to its socket.

use std::time::Duration;

use io_uring::{cqueue, types};

use super::super::{Driver, State, Turn, NO_BUF};
use super::{
    ud_parts, Meta, Op, Ring, CQE_BATCH, K_ACCEPT, K_CANCEL, K_CONNECT, K_POLL, K_RECV, K_SEND,
    K_SPLICE_IN, K_SPLICE_OUT, K_WAKE, MAX_DEFERRED_TURNS, MAX_INLINE_COUNTED, RQ_MAX,
};

impl Ring {
    /// Submits queued entries (a lazy turn may leave them for the park) and
    /// reaps completions; a park or wait sleeps until a completion or the
    /// timeout. A park's `wait_nr` counts past the inline sends it submits:
    /// their completions are posted before the kernel starts waiting, so it
    /// sleeps until one more (a receive, an accept, a wake) arrives.
    pub(in crate::io) fn turn(&self, d: &Driver, how: Turn) -> usize {
        let wait: Option<Duration> = how.timeout();
        {
            let mut st = d.st.borrow_mut();
            self.drain_returned(&mut st);
            self.arm_deferred(&mut st);
        }
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
            // Entries the submission queue had no room for must reach the
            // kernel before the thread sleeps (an accept among them would
            // wait for a completion that cannot come): this turn submits
            // without waiting and the next one moves the rest.
            let backlogged = !self.backlog.borrow().is_empty();
            let must_wait = wait.is_some() && !cq_ready && !backlogged;
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
                // With inline sends counted, the park waits for them and one
                // more event, but no longer than the backstop.
                let counted = match how {
                    Turn::Park(_) => self.inline_sends.get().min(MAX_INLINE_COUNTED),
                    _ => 0,
                };
                let want = 1 + counted as usize;
                let mut backstop = false;
                let r = match wait {
                    Some(t) if must_wait => {
                        let t = if counted > 0 && t > self.backstop {
                            backstop = true;
                            self.backstop
                        } else {
                            t
                        };
                        let ts = types::Timespec::new()
                            .sec(t.as_secs())
                            .nsec(t.subsec_nanos());
                        let args = types::SubmitArgs::new().timespec(&ts);
                        // If the kernel takes fewer entries than queued it
                        // returns without waiting, so an inline send it did
                        // not take is never counted as completed.
                        ring.submitter().submit_with_args(want, &args)
                    }
                    _ => ring.submitter().submit_and_wait(0),
                };
                self.inline_sends.set(0);
                // Took every entry, yet fewer completions than waited for:
                // the park slept to its backstop, an inline send it counted
                // followed by no other event. (An enter that submits returns
                // the count it took, not ETIME, when its wait times out.)
                if backstop && matches!(r, Ok(n) if n == sq_len) {
                    let mut cq = ring.completion();
                    cq.sync();
                    if cq.len() < want {
                        let c = &d.stats.backstop_parks;
                        c.set(c.get() + 1);
                    }
                }
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
        // Taken out while its completions are dispatched (a dispatch never
        // turns the ring, but the borrow must not be held across it).
        let mut batch = std::mem::take(&mut *self.cqe_batch.borrow_mut());
        loop {
            batch.clear();
            {
                let mut ring = self.ring.borrow_mut();
                let cq = ring.completion();
                batch.extend(
                    cq.take(CQE_BATCH)
                        .map(|c| (c.user_data(), c.result(), c.flags())),
                );
            }
            let n = batch.len();
            for &(u, res, flags) in &batch {
                self.dispatch(d, u, res, flags);
            }
            total += n;
            if n < CQE_BATCH {
                break;
            }
        }
        batch.clear();
        *self.cqe_batch.borrow_mut() = batch;
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
        let live = st
            .slots
            .get_mut(token as usize)
            .is_some_and(|s| s.in_use && s.gen == gen);
        if !live {
            // A slot is reused only once all its entries completed: this
            // cannot be one of them, but a buffer must not be lost.
            if let Some(b) = bid {
                self.recycle(st, b);
            }
            return;
        }
        match kind {
            K_RECV => self.on_recv(d, st, token, res, bid, more),
            K_POLL => {
                let s = &mut st.slots[token as usize];
                let u = s.be.u();
                u.poll_armed = false;
                u.poll_ready = true;
                u.ops -= 1;
                s.rd.wake();
            }
            K_SPLICE_IN => self.on_splice_in(st, token, res),
            K_SEND | K_CONNECT | K_SPLICE_OUT => {
                let s = &mut st.slots[token as usize];
                let u = s.be.u();
                u.ops -= 1;
                u.addr = None;
                if std::mem::take(&mut u.abandoned) {
                    // Its future went away: the chunk comes back now.
                    u.op = Op::Idle;
                    self.give_back(u);
                } else if u.relay.is_some() && !s.closed {
                    // A relayed send goes on by itself until all its bytes are out.
                    if self.relay_sent(s, token, res) {
                        return;
                    }
                } else if u.gather.is_some() && !s.closed {
                    // So does a gathered send.
                    if self.gather_sent(s, token, res) {
                        return;
                    }
                } else {
                    u.op = Op::Done(res);
                }
                s.wr.wake();
            }
            K_ACCEPT => {
                let s = &mut st.slots[token as usize];
                let closed = s.closed;
                let u = s.be.u();
                u.accepts_armed -= 1;
                u.ops -= 1;
                if res >= 0 {
                    if closed {
                        // SAFETY: a descriptor accepted for a closed listener is ours to close.
                        unsafe { libc::close(res) };
                    } else {
                        u.accepted.push_back(res);
                    }
                } else if res != -libc::ECANCELED {
                    u.accept_error = -res;
                }
                s.rd.wake();
            }
            _ => {}
        }
        let s = &mut st.slots[token as usize];
        if s.closed && s.be.u().ops == 0 {
            self.retire(st, token);
        }
    }

    /// A receive completion: queue its buffer, note EOF or an error, re-arm
    /// or pause the receive.
    fn on_recv(
        &self,
        d: &Driver,
        st: &mut State,
        token: u32,
        res: i32,
        bid: Option<u16>,
        more: bool,
    ) {
        let s = &mut st.slots[token as usize];
        let gen = s.gen;
        // A one-shot receive that found EOF (or failed) may still have
        // taken a buffer: it goes back, and the result reads as EOF.
        let bid = match bid {
            Some(b) if res <= 0 => {
                self.recycle(st, b);
                None
            }
            b => b,
        };
        let s = &mut st.slots[token as usize];
        if let Some(b) = bid {
            if s.closed {
                self.recycle(st, b);
            } else {
                let u = s.be.u();
                let mut meta = self.meta.borrow_mut();
                meta[b as usize] = Meta {
                    len: res.max(0) as u32,
                    next: NO_BUF,
                };
                if u.rq_tail == NO_BUF {
                    u.rq_head = b;
                } else {
                    meta[u.rq_tail as usize].next = b;
                }
                u.rq_tail = b;
                u.rq_len += 1;
            }
        } else if res == 0 {
            s.hup = true;
        } else if res == -libc::ENOBUFS {
            if !s.closed {
                s.be.u().recv_starved = true;
                self.starved.borrow_mut().push((token, gen));
                let c = &d.stats.recv_rearm_nobufs;
                c.set(c.get() + 1);
            }
        } else if res == -libc::ECANCELED
            && (s.closed || s.be.u().recv_paused || s.be.u().recv_hold)
        {
        } else if res < 0 {
            s.error = -res;
            s.hup = true;
        }
        let s = &mut st.slots[token as usize];
        if !more {
            let u = s.be.u();
            u.recv_armed = false;
            u.ops -= 1;
            // Paused, but the reader took the queue down while the cancel
            // was on its way: nobody else would re-arm it.
            let cap = u.rq_cap.max(RQ_MAX);
            if u.recv_paused && u.rq_len <= cap / 2 {
                u.recv_paused = false;
            }
            if u.recv_one {
                // One buffer per arming: the next once the reader emptied
                // the queue (`one.rs`).
                self.arm_later(s, token);
            } else if !s.closed && !s.hup && !u.recv_paused && !u.recv_starved && !u.recv_hold {
                let c = &d.stats.recv_rearm_other;
                c.set(c.get() + 1);
                self.arm_recv(s, token);
            }
        }
        let u = s.be.u();
        // A bulk socket may hold more unread buffers while the shard has
        // most of its buffers in the ring (the cap per connection and the
        // shard's ring bound what 10,000 slow readers can hold).
        let cap = if u.rq_cap > RQ_MAX && self.held.get() * 2 < self.bufs.entries as usize {
            u.rq_cap
        } else {
            RQ_MAX
        };
        if !s.closed && u.recv_armed && !u.recv_paused && u.rq_len >= cap {
            u.recv_paused = true;
            self.cancel(K_RECV, token, gen);
            let c = &d.stats.recv_paused;
            c.set(c.get() + 1);
        }
        s.rd.wake();
    }

    /// Frees a released slot whose last entry completed: its chunk goes
    /// back to the pool, descriptors accepted for it are closed, and then
    /// its own descriptor.
    pub(super) fn retire(&self, st: &mut State, token: u32) {
        let u = st.slots[token as usize].be.u();
        debug_assert_eq!(u.ops, 0);
        self.give_back(u);
        u.rpipe = None;
        for fd in u.accepted.drain(..) {
            // SAFETY: accepted descriptors nobody took are ours to close.
            unsafe { libc::close(fd) };
        }
        Driver::free_slot(st, token);
        self.drain_returned(st);
    }
}
