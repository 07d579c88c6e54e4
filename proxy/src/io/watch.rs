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
            self.kick();
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

#[cfg(test)]
mod tests {
    use std::net::{SocketAddr, TcpStream};
    use std::rc::Rc;
    use std::time::Duration;

    use super::super::tests::{kinds, on_driver, until};
    use super::super::{bind_listener, Driver, Listener, Options};

    /// An accept loop waiting on a paused listener (nothing armed): the
    /// listener, its address and token, and the accept's task.
    async fn paused_accept(
        d: &Rc<Driver>,
    ) -> (
        Rc<Listener>,
        SocketAddr,
        u32,
        glommio::Task<std::io::Result<()>>,
    ) {
        let fd = bind_listener("127.0.0.1:0".parse().unwrap()).unwrap();
        let l = Rc::new(Listener::from_fd(fd, d).unwrap());
        let addr = l.local_addr().unwrap();
        let token = d.st.borrow().listeners[0].token;
        l.pause();
        let waiting = glommio::spawn_local({
            let l = l.clone();
            async move { l.accept().await.map(|_| ()) }
        });
        until(d, "the accept loop to wait", || {
            d.st.borrow().slots[token as usize].rd.waker.is_some()
        })
        .await;
        (l, addr, token, waiting)
    }

    /// A lost accept made on purpose: the pause of a waiting accept loop is
    /// lifted without the wake a resume gives, and a client connects.
    /// Without the watchdog the accept waits for good; with it, the second
    /// look restarts it.
    #[test]
    fn a_listener_left_waiting_with_a_backlog_is_restarted_by_the_watchdog() {
        for kind in kinds() {
            on_driver(Options::new(kind), move |d| async move {
                let (_l, addr, token, waiting) = paused_accept(&d).await;
                d.st.borrow_mut().slots[token as usize].paused = false;
                let _peer = TcpStream::connect(addr).unwrap();
                let first = d.watch_accepts();
                assert_eq!(first, 0, "{kind:?}: the first look only suspects");
                assert_eq!(d.watch_accepts(), 1, "{kind:?}: the second look restarts");
                let got = d.timeout(Duration::from_secs(5), waiting).await;
                assert!(
                    matches!(got, Some(Ok(()))),
                    "{kind:?}: not accepted after the restart"
                );
                assert_eq!(d.stats.accept_stalls.get(), 1);
                // Taken since: a quiet listener is not suspected.
                assert_eq!(d.watch_accepts(), 0);
                assert_eq!(d.watch_accepts(), 0);
            });
        }
    }

    /// A resume wakes the accept loop from another task: the driver must
    /// not park (here for the whole 5 s timeout, in the proxy until the
    /// next tick) before that loop has run and armed its accepts.
    #[test]
    fn a_resumed_listener_accepts_a_waiting_connection_without_a_timer() {
        for kind in kinds() {
            on_driver(Options::new(kind), move |d| async move {
                let (l, addr, _token, waiting) = paused_accept(&d).await;
                let _peer = TcpStream::connect(addr).unwrap();
                let t = std::time::Instant::now();
                l.resume();
                let got = d.timeout(Duration::from_secs(5), waiting).await;
                assert!(matches!(got, Some(Ok(()))), "{kind:?}: not accepted");
                let took = t.elapsed();
                assert!(
                    took < Duration::from_secs(1),
                    "{kind:?}: accepted after {took:?}"
                );
                assert_eq!(d.stats.accept_stalls.get(), 0);
            });
        }
    }
}
