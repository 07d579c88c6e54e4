//! The accept watchdog: a listener whose accept loop waits, not paused, while connections sit in its backlog and nothing was taken on two looks in a row has lost its accept; it is restarted and counted (issue 19's accept stall).

use std::os::fd::RawFd;

use super::{Backend, Driver, State};

/// One listener as the watchdog last looked at it.
pub(super) struct Watched {
    token: u32,
    gen: u32,
    /// Connections handed to the accept loop, and that count at the last look.
    taken: u32,
    seen: u32,
    /// The last look found it waiting with a backlog and nothing taken.
    suspect: bool,
}

impl State {
    /// Puts a new listener under watch.
    pub(super) fn watch_listener(&mut self, token: u32) {
        let gen = self.slots[token as usize].gen;
        self.listeners.push(Watched {
            token,
            gen,
            taken: 0,
            seen: 0,
            suspect: false,
        });
    }

    /// Listener `token` handed a connection out (listeners are few: a scan).
    pub(super) fn taken_from(&mut self, token: u32) {
        if let Some(w) = self.listeners.iter_mut().find(|w| w.token == token) {
            w.taken = w.taken.wrapping_add(1);
        }
    }
}

impl Driver {
    /// One look at every listener (the shard calls it once a second): one
    /// whose accept loop waits in [`super::Listener::accept`], not paused,
    /// with connections in the kernel's backlog and none taken since the
    /// previous look, twice running, has lost its accept. Its accepts are
    /// cancelled (the loop arms fresh ones as the cancels complete; epoll:
    /// the loop is woken to accept again). Returns how many were found;
    /// [`super::Stats::accept_stalls`] counts them. Costs one `getsockopt`
    /// per waiting listener with nothing taken, nothing per request.
    pub fn watch_accepts(&self) -> usize {
        let mut st = self.st.borrow_mut();
        let st = &mut *st;
        let slots = &mut st.slots;
        st.listeners.retain(|w| {
            slots
                .get(w.token as usize)
                .is_some_and(|s| s.in_use && !s.closed && s.gen == w.gen)
        });
        let mut found = 0;
        for w in &mut st.listeners {
            let s = &mut slots[w.token as usize];
            let idle = w.taken == w.seen;
            w.seen = w.taken;
            let stuck = idle && !s.paused && s.rd.waker.is_some() && backlog(s.fd) > 0;
            if !stuck || !std::mem::replace(&mut w.suspect, true) {
                w.suspect &= stuck;
                continue;
            }
            w.suspect = false;
            found += 1;
            crate::log_warn!(
                "io",
                "listener {}: connections waited in the backlog with no accept taking them; accepts restarted",
                w.token
            );
            match &self.backend {
                Backend::Uring(r) => r.restart_accepts(s, w.token),
                Backend::Epoll(_) => s.rd.wake(),
            }
        }
        self.stats
            .accept_stalls
            .set(self.stats.accept_stalls.get() + found as u64);
        found
    }
}

/// Connections in listening socket `fd`'s accept queue (`TCP_INFO`'s
/// `tcpi_unacked` on a listener); 0 if the kernel does not say.
fn backlog(fd: RawFd) -> u32 {
    // SAFETY: tcp_info is plain data; getsockopt fills at most `len` bytes of it.
    unsafe {
        let mut info: libc::tcp_info = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
        let r = libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        );
        if r == 0 {
            info.tcpi_unacked
        } else {
            0
        }
    }
}
