//! The handles tasks use: [`Sock`] (a connected TCP socket) and [`Listener`], with reads, writes, connects and accepts that wait on the shard's driver.

use std::cell::Cell;
use std::future::poll_fn;
use std::io;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::rc::Rc;
use std::task::Poll;
use std::time::{Duration, Instant};

use super::addr::{setsockopt_int, sockaddr, tcp_socket};
use super::{epoll, Backend, Driver, Op, Role};

/// A TCP socket registered with the shard's driver. Dropping it closes the
/// socket (after its kernel operations are cancelled, on the ring).
pub struct Sock {
    driver: Rc<Driver>,
    token: u32,
    fd: RawFd,
    read_timeout: Cell<Option<Duration>>,
    write_timeout: Cell<Option<Duration>>,
    /// Bytes read from and written to the socket so far (access log).
    rx: Cell<u64>,
    tx: Cell<u64>,
}

impl Drop for Sock {
    fn drop(&mut self) {
        self.driver.release(self.token);
    }
}

impl Sock {
    /// Takes ownership of a connected socket descriptor.
    pub fn from_fd(fd: RawFd, driver: &Rc<Driver>) -> io::Result<Sock> {
        Sock::with_fd(fd, driver, true)
    }

    fn with_fd(fd: RawFd, driver: &Rc<Driver>, arm: bool) -> io::Result<Sock> {
        let token = match driver.register(fd, Role::Stream, arm) {
            Ok(t) => t,
            Err(e) => {
                // SAFETY: the descriptor was handed over to us; close it once.
                unsafe { libc::close(fd) };
                return Err(e);
            }
        };
        Ok(Sock {
            driver: driver.clone(),
            token,
            fd,
            read_timeout: Cell::new(None),
            write_timeout: Cell::new(None),
            rx: Cell::new(0),
            tx: Cell::new(0),
        })
    }

    /// Connects to `addr` within `timeout`.
    pub async fn connect(
        driver: &Rc<Driver>,
        addr: SocketAddr,
        timeout: Duration,
    ) -> io::Result<Sock> {
        let uring = matches!(driver.backend, Backend::Uring(_));
        let fd = tcp_socket(&addr)?;
        let _ = setsockopt_int(fd, libc::IPPROTO_TCP, libc::TCP_NODELAY, 1);
        if !uring {
            let (storage, len) = sockaddr(addr);
            // SAFETY: storage holds a valid address of `len` bytes; fd is open.
            let rc = unsafe {
                libc::connect(fd, (&storage as *const libc::sockaddr_storage).cast(), len)
            };
            if rc < 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::EINPROGRESS) {
                    // SAFETY: fd was opened above and is closed once on this path.
                    unsafe { libc::close(fd) };
                    return Err(e);
                }
            }
        }
        let sock = Sock::with_fd(fd, driver, !uring)?;
        sock.set_write_timeout(Some(timeout));
        let deadline = Some(driver.now() + timeout);
        if uring {
            // The kernel reads the address until the connect completes; it
            // lives in this frame, which `OpWait` keeps alive that long.
            let target = sockaddr(addr);
            let op = OpWait {
                sock: &sock,
                connect: true,
                started: false,
            };
            op.run(deadline, What::Connect(&target)).await?;
            if let Backend::Uring(r) = &driver.backend {
                let mut st = driver.st.borrow_mut();
                r.start_receiving(&mut st.slots[sock.token as usize], sock.token);
            }
        } else {
            poll_fn(|cx| {
                let mut st = driver.st.borrow_mut();
                let st = &mut *st;
                let s = &mut st.slots[sock.token as usize];
                if s.writable || s.hup {
                    return Poll::Ready(Ok(()));
                }
                if let Err(e) = s.wr.wait(cx, deadline, driver.now()) {
                    return Poll::Ready(Err(e));
                }
                if let Some(d) = deadline {
                    Driver::note_deadline(st, d);
                }
                Poll::Pending
            })
            .await?;
            let mut err: libc::c_int = 0;
            let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
            // SAFETY: err/len are valid for the call; fd is open.
            let rc = unsafe {
                libc::getsockopt(
                    fd,
                    libc::SOL_SOCKET,
                    libc::SO_ERROR,
                    (&mut err as *mut libc::c_int).cast(),
                    &mut len,
                )
            };
            if rc < 0 {
                return Err(io::Error::last_os_error());
            }
            if err != 0 {
                return Err(io::Error::from_raw_os_error(err));
            }
        }
        Ok(sock)
    }

    pub fn fd(&self) -> RawFd {
        self.fd
    }

    pub fn driver(&self) -> &Rc<Driver> {
        &self.driver
    }

    /// Bytes read from the socket so far.
    pub fn bytes_read(&self) -> u64 {
        self.rx.get()
    }

    /// Bytes written to the socket so far.
    pub fn bytes_written(&self) -> u64 {
        self.tx.get()
    }

    pub fn set_read_timeout(&self, d: Option<Duration>) {
        self.read_timeout.set(d);
    }

    pub fn set_write_timeout(&self, d: Option<Duration>) {
        self.write_timeout.set(d);
    }

    pub fn set_nodelay(&self, on: bool) -> io::Result<()> {
        setsockopt_int(
            self.fd,
            libc::IPPROTO_TCP,
            libc::TCP_NODELAY,
            on as libc::c_int,
        )
    }

    fn read_deadline(&self) -> Option<Instant> {
        self.read_timeout.get().map(|d| self.driver.now() + d)
    }

    /// Reads what is available, waiting (up to the read timeout) for at least a byte.
    pub async fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        let mut deadline: Option<Option<Instant>> = None;
        poll_fn(|cx| {
            let d = &self.driver;
            let got = match &d.backend {
                Backend::Uring(r) => r.try_read(d, self.token, buf),
                Backend::Epoll(_) => {
                    epoll::Epoll::try_read(&mut d.st.borrow_mut().slots[self.token as usize], buf)
                }
            };
            if let Some(r) = got {
                if let Ok(n) = r {
                    self.rx.set(self.rx.get() + n as u64);
                }
                return Poll::Ready(r);
            }
            let dl = *deadline.get_or_insert_with(|| self.read_deadline());
            let mut st = d.st.borrow_mut();
            let st = &mut *st;
            if let Err(e) = st.slots[self.token as usize].rd.wait(cx, dl, d.now()) {
                return Poll::Ready(Err(e));
            }
            if let Some(dl) = dl {
                Driver::note_deadline(st, dl);
            }
            Poll::Pending
        })
        .await
    }

    /// Waits (up to the read timeout) until a read would complete at once:
    /// bytes are there, or the peer closed. Lets a connection take a buffer
    /// only once it has something to put in it.
    pub async fn readable(&self) -> io::Result<()> {
        let mut deadline: Option<Option<Instant>> = None;
        poll_fn(|cx| {
            let d = &self.driver;
            let mut st = d.st.borrow_mut();
            let st = &mut *st;
            let s = &mut st.slots[self.token as usize];
            let ready = match &d.backend {
                Backend::Uring(r) => r.has_input(s, self.token),
                Backend::Epoll(_) => epoll::Epoll::has_input(s),
            };
            if ready {
                return Poll::Ready(Ok(()));
            }
            let dl = *deadline.get_or_insert_with(|| self.read_deadline());
            if let Err(e) = s.rd.wait(cx, dl, d.now()) {
                return Poll::Ready(Err(e));
            }
            if let Some(dl) = dl {
                Driver::note_deadline(st, dl);
            }
            Poll::Pending
        })
        .await
    }

    /// Whether the peer has closed or sent something unasked (a pooled
    /// upstream connection that is no longer fit for a request).
    pub fn is_stale(&self) -> bool {
        let d = &self.driver;
        match &d.backend {
            Backend::Uring(_) => {
                let st = d.st.borrow();
                let s = &st.slots[self.token as usize];
                s.hup || s.rq_head != super::NO_BUF
            }
            Backend::Epoll(_) => {
                let mut b = [0u8; 1];
                // SAFETY: one writable byte; fd is open; MSG_PEEK leaves data queued.
                let n = unsafe {
                    libc::recv(
                        self.fd,
                        b.as_mut_ptr().cast(),
                        1,
                        libc::MSG_PEEK | libc::MSG_DONTWAIT,
                    )
                };
                // Data (n > 0) or EOF (0) both mean stale; EAGAIN means quiet and alive.
                n >= 0 || io::Error::last_os_error().kind() != io::ErrorKind::WouldBlock
            }
        }
    }

    /// Writes all of `buf`, waiting for buffer space (up to the write timeout
    /// between progress) when the socket is full.
    pub async fn write_all(&self, mut buf: &[u8]) -> io::Result<()> {
        while !buf.is_empty() {
            let n = self.write(buf).await?;
            self.tx.set(self.tx.get() + n as u64);
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            buf = &buf[n..];
        }
        Ok(())
    }

    /// One write: how many bytes of `buf` the kernel took.
    pub async fn write(&self, buf: &[u8]) -> io::Result<usize> {
        let deadline = self.write_timeout.get().map(|d| self.driver.now() + d);
        match &self.driver.backend {
            Backend::Uring(_) => {
                let op = OpWait {
                    sock: self,
                    connect: false,
                    started: false,
                };
                op.run(deadline, What::Send(buf)).await
            }
            Backend::Epoll(_) => {
                poll_fn(|cx| {
                    let d = &self.driver;
                    let mut st = d.st.borrow_mut();
                    let st = &mut *st;
                    let s = &mut st.slots[self.token as usize];
                    if let Some(r) = epoll::Epoll::try_write(s, buf) {
                        return Poll::Ready(r);
                    }
                    if let Err(e) = s.wr.wait(cx, deadline, d.now()) {
                        return Poll::Ready(Err(e));
                    }
                    if s.writable {
                        // An edge arrived between the send and now.
                        cx.waker().wake_by_ref();
                    }
                    if let Some(dl) = deadline {
                        Driver::note_deadline(st, dl);
                    }
                    Poll::Pending
                })
                .await
            }
        }
    }

    /// Half-closes the sending side (FIN after what is queued).
    pub fn shutdown_write(&self) {
        // SAFETY: fd is open.
        unsafe { libc::shutdown(self.fd, libc::SHUT_WR) };
    }
}

/// What an [`OpWait`] asks of the kernel; both borrow memory the kernel
/// reads until the completion.
#[derive(Clone, Copy)]
enum What<'a> {
    Send(&'a [u8]),
    Connect(&'a (libc::sockaddr_storage, libc::socklen_t)),
}

/// A send or connect in flight on the ring: completes when the kernel is
/// done with it, also after a timeout (it cancels and waits), and, when
/// dropped early, cancels and waits for the kernel before the bytes go.
struct OpWait<'a> {
    sock: &'a Sock,
    connect: bool,
    started: bool,
}

impl OpWait<'_> {
    async fn run(mut self, deadline: Option<Instant>, what: What<'_>) -> io::Result<usize> {
        let d = self.sock.driver.clone();
        let token = self.sock.token;
        let Backend::Uring(ring) = &d.backend else {
            unreachable!("ring operations only on the uring backend")
        };
        poll_fn(|cx| {
            let mut st = d.st.borrow_mut();
            let st = &mut *st;
            let s = &mut st.slots[token as usize];
            match s.op {
                Op::Idle => {
                    match what {
                        What::Send(b) => start_send(&d, ring, s, token, b),
                        What::Connect(a) => ring.start_connect(s, token, a),
                    }
                    self.started = true;
                }
                Op::InFlight if s.wr.timed_out => ring.cancel_op(s, token, self.connect),
                Op::InFlight | Op::Cancelling => {}
                Op::Done(res)
                    if res == -libc::EAGAIN
                        && s.send_inline
                        && !self.connect
                        && !s.wr.timed_out =>
                {
                    // The inline attempt found the socket full: send again,
                    // waiting in the kernel for room this time.
                    s.send_full = true;
                    if let What::Send(b) = what {
                        start_send(&d, ring, s, token, b);
                    }
                }
                Op::Done(res) => {
                    if let What::Send(b) = what {
                        // A short write means the socket filled up: the next
                        // send waits for room; a whole one clears that.
                        s.send_full = res >= 0 && (res as usize) < b.len();
                    }
                    s.op = Op::Idle;
                    self.started = false;
                    let timed_out = std::mem::take(&mut s.wr.timed_out);
                    s.wr.deadline = None;
                    return Poll::Ready(if res > 0 || (self.connect && res == 0) {
                        Ok(res as usize)
                    } else if res == 0 {
                        Err(io::ErrorKind::WriteZero.into())
                    } else if timed_out || res == -libc::ECANCELED || res == -libc::ETIME {
                        Err(super::timed_out())
                    } else {
                        Err(io::Error::from_raw_os_error(-res))
                    });
                }
            }
            // Waiting: the deadline only asks for a cancel; the completion ends the wait.
            let s = &mut st.slots[token as usize];
            let timed_out = s.wr.timed_out;
            match &s.wr.waker {
                Some(w) if w.will_wake(cx.waker()) => {}
                _ => s.wr.waker = Some(cx.waker().clone()),
            }
            if !timed_out {
                s.wr.deadline = deadline;
                if let Some(dl) = deadline {
                    Driver::note_deadline(st, dl);
                }
            }
            Poll::Pending
        })
        .await
    }
}

/// Starts a send of `b`, counting it when it will wait for room.
fn start_send(d: &Driver, ring: &super::uring::Ring, s: &mut super::Slot, token: u32, b: &[u8]) {
    if s.send_full {
        d.stats.sends_waited.set(d.stats.sends_waited.get() + 1);
    }
    ring.start_send(s, token, b);
}

impl Drop for OpWait<'_> {
    fn drop(&mut self) {
        if !self.started {
            return;
        }
        let d = &self.sock.driver;
        let Backend::Uring(ring) = &d.backend else {
            return;
        };
        let token = self.sock.token;
        {
            let mut st = d.st.borrow_mut();
            let s = &mut st.slots[token as usize];
            if matches!(s.op, Op::InFlight) {
                ring.cancel_op(s, token, self.connect);
            }
        }
        d.wait_op_done(token);
        let mut st = d.st.borrow_mut();
        let s = &mut st.slots[token as usize];
        s.op = Op::Idle;
        s.wr = Default::default();
    }
}

/// A listening socket registered with the shard's driver.
pub struct Listener {
    driver: Rc<Driver>,
    token: u32,
    fd: RawFd,
    paused: Cell<bool>,
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.driver.release(self.token);
    }
}

impl Listener {
    /// Takes ownership of a bound, listening socket.
    pub fn from_fd(fd: RawFd, driver: &Rc<Driver>) -> io::Result<Listener> {
        let token = match driver.register(fd, Role::Listener, true) {
            Ok(t) => t,
            Err(e) => {
                // SAFETY: the descriptor was handed over to us; close it once.
                unsafe { libc::close(fd) };
                return Err(e);
            }
        };
        Ok(Listener {
            driver: driver.clone(),
            token,
            fd,
            paused: Cell::new(false),
        })
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        super::local_addr(self.fd)
    }

    /// Stops taking connections off the backlog until [`Listener::resume`].
    pub fn pause(&self) {
        if self.paused.replace(true) {
            return;
        }
        if let Backend::Uring(r) = &self.driver.backend {
            let mut st = self.driver.st.borrow_mut();
            r.pause_accept(&mut st.slots[self.token as usize], self.token);
        }
    }

    pub fn resume(&self) {
        if !self.paused.replace(false) {
            return;
        }
        if let Backend::Uring(r) = &self.driver.backend {
            let mut st = self.driver.st.borrow_mut();
            r.resume_accept(&mut st.slots[self.token as usize], self.token);
        }
    }

    /// The next connection: its socket and peer address.
    pub async fn accept(&self) -> io::Result<(Sock, SocketAddr)> {
        let fd = poll_fn(|cx| {
            let d = &self.driver;
            let mut st = d.st.borrow_mut();
            let s = &mut st.slots[self.token as usize];
            match &d.backend {
                Backend::Uring(r) => {
                    if let Some(fd) = s.accepted.pop_front() {
                        return Poll::Ready(Ok(fd));
                    }
                    if s.accept_error != 0 {
                        let e = std::mem::take(&mut s.accept_error);
                        return Poll::Ready(Err(io::Error::from_raw_os_error(e)));
                    }
                    if !s.recv_armed && !self.paused.get() {
                        r.resume_accept(s, self.token);
                    }
                }
                Backend::Epoll(_) => {
                    if !self.paused.get() {
                        if let Some(r) = epoll::Epoll::try_accept(s) {
                            return Poll::Ready(r);
                        }
                    }
                }
            }
            let _ = s.rd.wait(cx, None, d.now());
            Poll::Pending
        })
        .await?;
        let peer = match super::peer_addr(fd) {
            Ok(p) => p,
            Err(e) => {
                // SAFETY: the accepted descriptor is ours; closed once on this path.
                unsafe { libc::close(fd) };
                return Err(e);
            }
        };
        Ok((Sock::from_fd(fd, &self.driver)?, peer))
    }
}
