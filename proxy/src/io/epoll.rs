//! The epoll backend: non-blocking `recv`/`send`/`accept4`/`connect` on readiness from one edge-triggered epoll set per shard.
//!
//! This is what a shard runs on when the kernel or a seccomp policy refuses
//! an io_uring ring (Docker's default profile does), or when the config asks
//! for it. Every socket is registered once, edge-triggered, in both
//! directions; a slot remembers the last edge so that a read or write is
//! only tried when it can make progress, and `EAGAIN` clears the flag.

use std::io;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use super::addr::{sockaddr, take_error};
use super::sock::PipeFds;
use super::{Driver, Role, Slot, State};

/// epoll's own per-socket state: the last edges seen.
#[derive(Default)]
pub(super) struct ESock {
    /// An edge said readable / writable and no syscall has said otherwise since.
    pub(super) readable: bool,
    pub(super) writable: bool,
}

impl ESock {
    /// A connecting socket (`connected` false) is not writable until its
    /// connect completes: the `EPOLLOUT` edge says so.
    pub(super) fn new(connected: bool) -> ESock {
        // Adding an fd to an edge-triggered set reports the readiness it
        // already has, so the read side starts "not known readable": an idle
        // connection then waits for its first byte without a buffer or a
        // `recv` that would only say EAGAIN.
        ESock {
            readable: false,
            writable: connected,
        }
    }
}

const EVENTS: usize = 256;
/// The token of the wake-up eventfd in the set.
const WAKE: u64 = u64::MAX;

pub struct Epoll {
    epfd: RawFd,
    events: std::cell::RefCell<Box<[libc::epoll_event; EVENTS]>>,
}

impl Drop for Epoll {
    fn drop(&mut self) {
        // SAFETY: epfd is owned here and closed once.
        unsafe { libc::close(self.epfd) };
    }
}

fn last() -> io::Error {
    io::Error::last_os_error()
}

impl Epoll {
    pub(super) fn new(evfd: RawFd) -> io::Result<Epoll> {
        // SAFETY: plain syscall; the result is checked.
        let epfd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if epfd < 0 {
            return Err(last());
        }
        let e = Epoll {
            epfd,
            events: std::cell::RefCell::new(Box::new(
                [libc::epoll_event { events: 0, u64: 0 }; EVENTS],
            )),
        };
        e.add(evfd, WAKE, libc::EPOLLIN as u32)?;
        Ok(e)
    }

    fn add(&self, fd: RawFd, token: u64, events: u32) -> io::Result<()> {
        let mut ev = libc::epoll_event {
            events: events | libc::EPOLLET as u32,
            u64: token,
        };
        // SAFETY: epfd and fd are open; ev is valid for the call.
        if unsafe { libc::epoll_ctl(self.epfd, libc::EPOLL_CTL_ADD, fd, &mut ev) } < 0 {
            return Err(last());
        }
        Ok(())
    }

    /// `mode_set`: the descriptor is non-blocking already (`accept4`'s
    /// `SOCK_NONBLOCK`).
    pub(super) fn register(
        &self,
        fd: RawFd,
        token: u32,
        role: Role,
        mode_set: bool,
    ) -> io::Result<()> {
        if !mode_set {
            set_nonblocking(fd)?;
        }
        let events = match role {
            Role::Stream => libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLRDHUP,
            Role::Listener => libc::EPOLLIN,
        };
        self.add(fd, token as u64, events as u32)
    }

    /// Takes a released socket out of the set; it has no kernel operation
    /// in flight (every syscall here is synchronous), so it can close now.
    pub(super) fn release(&self, s: &mut Slot) -> bool {
        // SAFETY: fd is still open; it is removed from the set (closed by the caller).
        unsafe { libc::epoll_ctl(self.epfd, libc::EPOLL_CTL_DEL, s.fd, std::ptr::null_mut()) };
        true
    }

    /// Issues a non-blocking connect before the socket joins the set (so
    /// the set reports its state once connecting, never the unconnected one).
    pub(super) fn begin_connect(fd: RawFd, addr: SocketAddr) -> io::Result<()> {
        let a = sockaddr(addr);
        // SAFETY: `a` holds a valid address of `a.len()` bytes; fd is open;
        // the call is synchronous (the kernel copies the address).
        let rc = unsafe { libc::connect(fd, a.as_ptr(), a.len()) };
        if rc < 0 {
            let e = last();
            if e.raw_os_error() != Some(libc::EINPROGRESS) {
                return Err(e);
            }
        }
        Ok(())
    }

    /// The connect is done once the socket is writable (or failed): its
    /// `SO_ERROR` says how. Until then it waits, up to `deadline`.
    pub(super) fn poll_connect(
        st: &mut State,
        token: u32,
        deadline: Option<Instant>,
        cx: &Context<'_>,
        now: Instant,
    ) -> Poll<io::Result<()>> {
        let s = &mut st.slots[token as usize];
        if s.be.e().writable || s.hup {
            return Poll::Ready(match take_error(s.fd) {
                Ok(None) => Ok(()),
                Ok(Some(e)) | Err(e) => Err(e),
            });
        }
        if let Err(e) = Driver::wait_write(st, token, cx, deadline, now) {
            return Poll::Ready(Err(e));
        }
        Poll::Pending
    }

    /// One non-blocking `send` of the caller's bytes (synchronous: the
    /// kernel has copied them when it returns); waits for an `EPOLLOUT`
    /// edge, up to `deadline`, when the socket is full.
    pub(super) fn poll_write(
        st: &mut State,
        token: u32,
        buf: &[u8],
        deadline: Option<Instant>,
        cx: &Context<'_>,
        now: Instant,
    ) -> Poll<io::Result<usize>> {
        if let Some(r) = Epoll::try_write(&mut st.slots[token as usize], buf) {
            return Poll::Ready(r);
        }
        if let Err(e) = Driver::wait_write(st, token, cx, deadline, now) {
            return Poll::Ready(Err(e));
        }
        if st.slots[token as usize].be.e().writable {
            // An edge arrived between the send and now.
            cx.waker().wake_by_ref();
        }
        Poll::Pending
    }

    /// One non-blocking `sendmsg` of a gather list (synchronous, like
    /// [`Epoll::poll_write`]: the kernel has copied the bytes from where
    /// they are when it returns); waits for an `EPOLLOUT` edge, up to
    /// `deadline`, when the socket is full.
    pub(super) fn poll_gather(
        st: &mut State,
        token: u32,
        iov: &mut [libc::iovec],
        deadline: Option<Instant>,
        cx: &Context<'_>,
        now: Instant,
    ) -> Poll<io::Result<usize>> {
        let s = &mut st.slots[token as usize];
        match super::gather::sendmsg_nb(s.fd, iov) {
            Ok(n) => return Poll::Ready(Ok(n)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => s.be.e().writable = false,
            Err(e) => return Poll::Ready(Err(e)),
        }
        if let Err(e) = Driver::wait_write(st, token, cx, deadline, now) {
            return Poll::Ready(Err(e));
        }
        if st.slots[token as usize].be.e().writable {
            cx.waker().wake_by_ref();
        }
        Poll::Pending
    }

    /// Whether the peer closed or sent something unasked.
    pub(super) fn is_stale(s: &mut Slot) -> bool {
        let mut b = [0u8; 1];
        // SAFETY: one writable byte; fd is open; MSG_PEEK leaves data queued.
        let n = unsafe {
            libc::recv(
                s.fd,
                b.as_mut_ptr().cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        // Data (n > 0) or EOF (0) both mean stale; EAGAIN means quiet and alive.
        n >= 0 || last().kind() != io::ErrorKind::WouldBlock
    }

    /// One `recv`. `None`: the socket is known empty (or just said `EAGAIN`).
    pub(super) fn try_read(s: &mut Slot, buf: &mut [u8]) -> Option<io::Result<usize>> {
        loop {
            if !s.be.e().readable {
                return None;
            }
            // SAFETY: buf is valid for buf.len() bytes; fd is open.
            let n =
                unsafe { libc::recv(s.fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
            if n >= 0 {
                // Edge-triggered: a short read emptied the socket; later bytes raise a new edge.
                if (n as usize) < buf.len() && n > 0 && !s.hup {
                    s.be.e().readable = false;
                }
                return Some(Ok(n as usize));
            }
            let e = last();
            match e.kind() {
                io::ErrorKind::WouldBlock => s.be.e().readable = s.hup,
                io::ErrorKind::Interrupted => {}
                _ => return Some(Err(e)),
            }
            if s.hup && !s.be.e().readable {
                return Some(Ok(0));
            }
        }
    }

    /// Whether a read could make progress now (an edge not yet consumed).
    pub(super) fn has_input(s: &mut Slot) -> bool {
        s.be.e().readable || s.hup
    }

    /// One `send`. `None`: the socket buffer is full.
    fn try_write(s: &mut Slot, buf: &[u8]) -> Option<io::Result<usize>> {
        loop {
            // SAFETY: buf is valid for buf.len() bytes; fd is open.
            let n = unsafe {
                libc::send(
                    s.fd,
                    buf.as_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                )
            };
            if n >= 0 {
                return Some(Ok(n as usize));
            }
            let e = last();
            match e.kind() {
                io::ErrorKind::WouldBlock => {
                    s.be.e().writable = false;
                    return None;
                }
                io::ErrorKind::Interrupted => {}
                _ => return Some(Err(e)),
            }
        }
    }

    /// One non-blocking `splice` of up to `max` bytes from the socket into
    /// an empty pipe. `None`: the socket is known empty (with the pipe
    /// empty, `EAGAIN` can only mean that). `Some(Ok(0))`: EOF.
    pub(super) fn try_splice_in(
        s: &mut Slot,
        pipe: &PipeFds,
        max: usize,
    ) -> Option<io::Result<usize>> {
        loop {
            if !s.be.e().readable {
                return None;
            }
            match pipe.fill_from(s.fd, max) {
                // A short splice may be the pipe's slots, not an empty
                // socket: readiness stays until EAGAIN says otherwise.
                Ok(n) => return Some(Ok(n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => s.be.e().readable = s.hup,
                Err(e) => return Some(Err(e)),
            }
            if s.hup && !s.be.e().readable {
                return Some(Ok(0));
            }
        }
    }

    /// One non-blocking `splice` of up to `n` bytes (all in the pipe) from
    /// the pipe into the socket. `None`: the socket is full.
    pub(super) fn try_splice_out(
        s: &mut Slot,
        pipe: &PipeFds,
        n: usize,
    ) -> Option<io::Result<usize>> {
        match pipe.drain_to(s.fd, n) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                s.be.e().writable = false;
                None
            }
            r => Some(r),
        }
    }

    /// One `accept4`. `None`: nothing waiting.
    pub(super) fn try_accept(s: &mut Slot) -> Option<io::Result<RawFd>> {
        loop {
            if !s.be.e().readable {
                return None;
            }
            // SAFETY: plain syscall on the listening socket; no address wanted.
            let fd = unsafe {
                libc::accept4(
                    s.fd,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                )
            };
            if fd >= 0 {
                return Some(Ok(fd));
            }
            let e = last();
            match e.kind() {
                io::ErrorKind::WouldBlock => s.be.e().readable = false,
                io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted => {}
                _ => return Some(Err(e)),
            }
        }
    }

    pub(super) fn turn(&self, d: &Driver, wait: Option<Duration>) -> usize {
        let ms = match wait {
            None => 0,
            Some(t) => t.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32,
        };
        let mut events = self.events.borrow_mut();
        d.stats.enters.set(d.stats.enters.get() + 1);
        // SAFETY: events is a valid buffer of EVENTS entries; epfd is open.
        let n = unsafe { libc::epoll_wait(self.epfd, events.as_mut_ptr(), EVENTS as i32, ms) };
        if n <= 0 {
            return 0;
        }
        let mut woke_notifier = false;
        {
            let mut st = d.st.borrow_mut();
            for e in &events[..n as usize] {
                if e.u64 == WAKE {
                    woke_notifier = true;
                    continue;
                }
                let bits = e.events as i32;
                let Some(s) = st
                    .slots
                    .get_mut(e.u64 as usize)
                    .filter(|s| s.in_use && !s.closed)
                else {
                    continue;
                };
                let err = bits & (libc::EPOLLERR | libc::EPOLLHUP) != 0;
                if s.role == Role::Listener {
                    s.be.e().readable = true;
                    s.rd.wake();
                    continue;
                }
                if err || bits & libc::EPOLLRDHUP != 0 {
                    s.hup = true;
                }
                if err || bits & (libc::EPOLLIN | libc::EPOLLRDHUP) != 0 {
                    s.be.e().readable = true;
                    s.rd.wake();
                }
                if err || bits & libc::EPOLLOUT != 0 {
                    s.be.e().writable = true;
                    s.wr.wake();
                }
            }
        }
        if woke_notifier {
            d.wake_notified(true);
        }
        n as usize
    }
}

fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on an open descriptor; results are checked.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        if fl < 0 {
            return Err(last());
        }
        if fl & libc::O_NONBLOCK == 0 && libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK) < 0 {
            return Err(last());
        }
    }
    Ok(())
}
