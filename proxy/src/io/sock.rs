//! The handles tasks use: [`Sock`] (a connected TCP socket) and [`Listener`], with reads, writes, connects and accepts that wait on the shard's driver.

use std::cell::Cell;
use std::future::poll_fn;
use std::io;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::rc::Rc;
use std::task::Poll;
use std::time::{Duration, Instant};

use super::addr::{set_nodelay, tcp_socket};
use super::gather::Gather;
use super::ops::{OpId, Relayed};
use super::{Backend, Driver, Role};

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
        Sock::with_fd(fd, driver, true, false)
    }

    fn with_fd(fd: RawFd, driver: &Rc<Driver>, arm: bool, mode_set: bool) -> io::Result<Sock> {
        let token = match driver.register(fd, Role::Stream, arm, mode_set) {
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

    /// Connects to `addr` within `timeout` (on either backend: the
    /// deadline ends the wait even if the handshake never completes).
    pub async fn connect(
        driver: &Rc<Driver>,
        addr: SocketAddr,
        timeout: Duration,
    ) -> io::Result<Sock> {
        let fd = tcp_socket(&addr)?;
        let _ = set_nodelay(fd, true);
        if let Err(e) = driver.begin_connect(fd, addr) {
            // SAFETY: fd was opened above and is closed once on this path.
            unsafe { libc::close(fd) };
            return Err(e);
        }
        let sock = Sock::with_fd(fd, driver, false, false)?;
        sock.set_write_timeout(Some(timeout));
        let deadline = Some(driver.now() + timeout);
        let mut op = OpGuard::new(&sock);
        poll_fn(|cx| driver.poll_connect(sock.token, &mut op.id, addr, deadline, cx)).await?;
        drop(op);
        driver.start_receiving(sock.token);
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
        set_nodelay(self.fd, on)
    }

    fn read_deadline(&self) -> Option<Instant> {
        self.read_timeout.get().map(|d| self.driver.now() + d)
    }

    /// Reads what is available, waiting (up to the read timeout) for at least a byte.
    pub async fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        let mut deadline: Option<Option<Instant>> = None;
        poll_fn(|cx| {
            let d = &self.driver;
            if let Some(r) = d.try_read(self.token, buf) {
                if let Ok(n) = r {
                    self.rx.set(self.rx.get() + n as u64);
                }
                return Poll::Ready(r);
            }
            let dl = *deadline.get_or_insert_with(|| self.read_deadline());
            match d.wait_read(self.token, cx, dl) {
                Ok(()) => Poll::Pending,
                Err(e) => Poll::Ready(Err(e)),
            }
        })
        .await
    }

    /// Lends received bytes, where the driver put them, to `f` (waiting,
    /// up to the read timeout, for some): `f` may change them (decrypt in
    /// place) and returns how many it consumed; the rest stays for the next
    /// read or lend. On the ring that is the first queued provided buffer,
    /// which goes back to the ring once used up. `f` runs inside the driver
    /// and must not call into it. [`Lent::Copy`]: the driver has no buffer
    /// of its own to lend (epoll, whose `recv` puts bytes straight into the
    /// caller's buffer, or a ring socket reading past its dry buffer ring):
    /// read with [`Sock::read`] instead.
    pub async fn read_lent(&self, f: &mut dyn FnMut(&mut [u8]) -> usize) -> io::Result<Lent> {
        let mut deadline: Option<Option<Instant>> = None;
        poll_fn(|cx| {
            let d = &self.driver;
            if let Some(r) = d.try_lend(self.token, &mut *f) {
                if let Ok(Lent::Bytes(n)) = r {
                    self.rx.set(self.rx.get() + n as u64);
                }
                return Poll::Ready(r);
            }
            let dl = *deadline.get_or_insert_with(|| self.read_deadline());
            match d.wait_read(self.token, cx, dl) {
                Ok(()) => Poll::Pending,
                Err(e) => Poll::Ready(Err(e)),
            }
        })
        .await
    }

    /// Whether [`Sock::read_lent`] can lend the driver's own buffers (the
    /// ring): a reader completing a record that straddles two of them takes
    /// only the bytes it needs, and lends the rest where it landed.
    pub fn lends(&self) -> bool {
        self.driver.kind() == super::Kind::Uring
    }

    /// Waits (up to the read timeout) until a read would complete at once:
    /// bytes are there, or the peer closed. Lets a connection take a buffer
    /// only once it has something to put in it.
    pub async fn readable(&self) -> io::Result<()> {
        let mut deadline: Option<Option<Instant>> = None;
        poll_fn(|cx| {
            let d = &self.driver;
            if d.has_input(self.token) {
                return Poll::Ready(Ok(()));
            }
            let dl = *deadline.get_or_insert_with(|| self.read_deadline());
            match d.wait_read(self.token, cx, dl) {
                Ok(()) => Poll::Pending,
                Err(e) => Poll::Ready(Err(e)),
            }
        })
        .await
    }

    /// Whether the peer has closed or sent something unasked (a pooled
    /// upstream connection that is no longer fit for a request).
    pub fn is_stale(&self) -> bool {
        self.driver.is_stale(self.token)
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

    /// Sends all of `buf`, a buffer from [`super::take_send_buffer`] the
    /// caller has filled (TLS records): on the ring the buffer itself is
    /// sent, without the copy into a send chunk [`Sock::write`] makes, and
    /// stays with the driver until the kernel is done with it (a dropped
    /// future leaves it there); then it goes back to the pool. On epoll it
    /// is sent from where it is and goes back at once.
    pub async fn write_all_owned(&self, buf: Vec<u8>) -> io::Result<()> {
        if self.driver.kind() == super::Kind::Epoll {
            let r = self.write_all(&buf).await;
            super::put_send_buffer(buf);
            return r;
        }
        let n = buf.len();
        if n == 0 {
            super::put_send_buffer(buf);
            return Ok(());
        }
        let deadline = self.write_timeout.get().map(|d| self.driver.now() + d);
        let owned = std::cell::Cell::new(Some(buf));
        let mut op = OpGuard::new(self);
        let r = poll_fn(|cx| {
            self.driver
                .poll_write_owned(self.token, &mut op.id, &owned, deadline, cx)
        })
        .await;
        if let Some(b) = owned.take() {
            // Never started (the write side was lost): the buffer is ours.
            super::put_send_buffer(b);
        }
        match r? {
            0 => Err(io::ErrorKind::WriteZero.into()),
            _ => {
                self.tx.set(self.tx.get() + n as u64);
                Ok(())
            }
        }
    }

    /// Sends all of `g` with vectored sends (`sendmsg` over its pieces),
    /// the data pieces straight from the shared buffer, without a copy in
    /// user space. On the ring one operation holds a clone of the buffer's
    /// `Rc` and a copy of the framing until its completion (a dropped or
    /// forgotten future leaves them with the driver: `io/gather.rs`) and
    /// the driver sends on after a short write, within the write timeout;
    /// on epoll each `sendmsg` is synchronous and a short one is resumed
    /// at the byte it stopped at (up to the write timeout between progress).
    pub async fn write_all_gather(&self, g: Gather<'_>) -> io::Result<()> {
        assert!(g.fits(), "a gather list past one send's iovecs or framing");
        let total = g.len();
        let mut done = 0;
        while done < total {
            let deadline = self.write_timeout.get().map(|d| self.driver.now() + d);
            let mut op = OpGuard::new(self);
            let n = poll_fn(|cx| {
                self.driver
                    .poll_gather(self.token, &mut op.id, &g, done, deadline, cx)
            })
            .await?;
            drop(op);
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            done += n;
            self.tx.set(self.tx.get() + n as u64);
        }
        let st = &self.driver.stats;
        st.gathered_sends.set(st.gathered_sends.get() + 1);
        st.gathered_bytes
            .set(st.gathered_bytes.get() + g.data_len() as u64);
        Ok(())
    }

    /// One write: how many bytes of `buf` the kernel took. On the ring
    /// that is at most [`super::uring::SEND_CHUNK`]: the bytes are copied
    /// into a send chunk the driver owns until the kernel is done with it,
    /// so this future may be dropped or forgotten at any point.
    pub async fn write(&self, buf: &[u8]) -> io::Result<usize> {
        let deadline = self.write_timeout.get().map(|d| self.driver.now() + d);
        let mut op = OpGuard::new(self);
        poll_fn(|cx| {
            self.driver
                .poll_write(self.token, &mut op.id, buf, deadline, cx)
        })
        .await
    }

    /// One relay step from `src` to this socket (uring): the whole buffers
    /// `src` has received, up to `max` bytes, sent here without a copy in
    /// user space, waiting (up to the write timeout) for the send to
    /// complete. [`Relayed::Empty`] and [`Relayed::Copy`] send nothing.
    pub async fn relay_from(&self, src: &Sock, max: usize) -> io::Result<Relayed> {
        let deadline = self.write_timeout.get().map(|d| self.driver.now() + d);
        let mut op = OpGuard::new(self);
        let r = poll_fn(|cx| {
            self.driver
                .poll_relay(src.token, self.token, &mut op.id, max, deadline, cx)
        })
        .await;
        if let Ok(Relayed::Sent(n)) = r {
            src.rx.set(src.rx.get() + n as u64);
            self.tx.set(self.tx.get() + n as u64);
        }
        r
    }

    /// Holds off (or resumes) the ring's receive so that splices read the
    /// socket itself; a no-op on epoll. Holds nest: the receive resumes
    /// when the last one is let go.
    pub fn hold_receiving(&self, on: bool) {
        self.driver.hold_receiving(self.token, on);
    }

    /// Whether the ring's receive takes one buffer per arming (`on`: the
    /// socket's last body took the bulk path, and the body behind its next
    /// head should stay in the socket for the splices) or runs multishot
    /// (`io/uring/one.rs`); a no-op on epoll, whose reads take what they
    /// are asked for.
    pub fn receive_one(&self, on: bool) {
        self.driver.receive_one(self.token, on);
    }

    /// Says that this socket is closed after what is written from now on
    /// (a last answer, a refusal, `close_notify`), before it is written: on
    /// the ring those sends do not hold the shard's park for an event that
    /// will not come (the peer waits for the FIN). Call it before the last
    /// write, not after. A no-op on epoll.
    pub fn closing(&self) {
        self.driver.set_closing(self.token);
    }

    /// Says that after its next write the caller goes on with bytes it has
    /// already read from this socket (the request that came with a TLS 1.3
    /// client's Finished, after which zgix sends its session ticket), not
    /// with something the peer has still to send: on the ring that send
    /// does not hold the shard's park for a peer event that would not come
    /// (the caller waits for its completion). Call it before the write. A
    /// no-op on epoll.
    pub fn goes_on(&self) {
        self.driver.set_goes_on(self.token);
    }

    /// Whether a held-off receive has stopped with nothing left queued
    /// (always on epoll): from now on only splices read the socket.
    pub fn receive_idle(&self) -> bool {
        self.driver.receive_idle(self.token)
    }

    /// Splices up to `max` bytes (at most the pipe's room) from this socket
    /// into the empty `pipe`, waiting up to the read timeout for a byte;
    /// 0 at EOF.
    pub async fn splice_in(&self, pipe: &mut Pipe, max: usize) -> io::Result<usize> {
        debug_assert_eq!(pipe.held, 0);
        let deadline = self.read_deadline();
        let max = max.min(pipe.fds.cap);
        let mut op = SpliceGuard::new(self, true);
        let n = poll_fn(|cx| {
            self.driver
                .poll_splice(self.token, &mut op.id, &pipe.fds, max, true, deadline, cx)
        })
        .await?;
        pipe.held = n;
        self.rx.set(self.rx.get() + n as u64);
        Ok(n)
    }

    /// Splices everything `pipe` holds into this socket, waiting (up to the
    /// write timeout between progress) for room.
    pub async fn splice_out(&self, pipe: &mut Pipe) -> io::Result<()> {
        while pipe.held > 0 {
            let deadline = self.write_timeout.get().map(|d| self.driver.now() + d);
            let mut op = SpliceGuard::new(self, false);
            let k = poll_fn(|cx| {
                self.driver.poll_splice(
                    self.token, &mut op.id, &pipe.fds, pipe.held, false, deadline, cx,
                )
            })
            .await?;
            if k == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            pipe.held -= k;
            self.tx.set(self.tx.get() + k as u64);
        }
        Ok(())
    }

    /// Half-closes the sending side (FIN after what is queued).
    pub fn shutdown_write(&self) {
        // SAFETY: fd is open.
        unsafe { libc::shutdown(self.fd, libc::SHUT_WR) };
    }
}

/// What a [`Sock::read_lent`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lent {
    /// The closure consumed that many of the bytes it was lent.
    Bytes(usize),
    /// The peer closed: nothing more will come.
    Eof,
    /// Nothing to lend: read into a buffer of the caller's.
    Copy,
}

impl Driver {
    /// Lends what `token` has received to `f`. `None`: nothing yet.
    fn try_lend(
        &self,
        token: u32,
        f: &mut dyn FnMut(&mut [u8]) -> usize,
    ) -> Option<io::Result<Lent>> {
        match &self.backend {
            Backend::Uring(r) => r.try_lend(&mut self.st.borrow_mut(), token, f),
            Backend::Epoll(_) => Some(Ok(Lent::Copy)),
        }
    }
}

/// A write-side operation's future's claim on its slot: dropped early, it
/// hands the operation to the driver ([`Driver::drop_op`]) without waiting.
struct OpGuard<'a> {
    driver: &'a Driver,
    token: u32,
    id: OpId,
}

impl<'a> OpGuard<'a> {
    fn new(sock: &'a Sock) -> OpGuard<'a> {
        OpGuard {
            driver: &sock.driver,
            token: sock.token,
            id: OpId::default(),
        }
    }
}

impl Drop for OpGuard<'_> {
    fn drop(&mut self) {
        self.driver.drop_op(self.token, &mut self.id);
    }
}

/// A splice future's claim on its socket's splice slot (the read side's
/// for splices in, the write side's for splices out): dropped early, the
/// splice is cancelled and left to the driver, which keeps the pipe open
/// until its completion.
struct SpliceGuard<'a> {
    driver: &'a Driver,
    token: u32,
    into_pipe: bool,
    id: OpId,
}

impl<'a> SpliceGuard<'a> {
    fn new(sock: &'a Sock, into_pipe: bool) -> SpliceGuard<'a> {
        SpliceGuard {
            driver: &sock.driver,
            token: sock.token,
            into_pipe,
            id: OpId::default(),
        }
    }
}

impl Drop for SpliceGuard<'_> {
    fn drop(&mut self) {
        self.driver
            .drop_splice(self.token, self.into_pipe, &mut self.id);
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
        // Accepted sockets inherit TCP_NODELAY from the listener (Linux
        // copies it into each connection): set once here, not per accept.
        if let Err(e) = set_nodelay(fd, true) {
            // SAFETY: the descriptor was handed over to us; close it once.
            unsafe { libc::close(fd) };
            return Err(e);
        }
        let token = match driver.register(fd, Role::Listener, true, false) {
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

    /// Stops taking connections off the backlog until [`Listener::resume`]:
    /// the ring cancels the accepts it has armed and submits no more (one of
    /// the [`super::uring::ACCEPTS_IN_FLIGHT`] that completed before the
    /// cancel may still hold a connection; [`Listener::accept`] hands those
    /// out, paused or not).
    pub fn pause(&self) {
        if !self.paused.replace(true) {
            self.driver.set_accepting(self.token, false);
        }
    }

    pub fn resume(&self) {
        if self.paused.replace(false) {
            self.driver.set_accepting(self.token, true);
        }
    }

    /// The next connection: its socket and peer address.
    pub async fn accept(&self) -> io::Result<(Sock, SocketAddr)> {
        let fd = poll_fn(|cx| self.driver.poll_accept(self.token, cx)).await?;
        let peer = match super::peer_addr(fd) {
            Ok(p) => p,
            Err(e) => {
                // SAFETY: the accepted descriptor is ours; closed once on this path.
                unsafe { libc::close(fd) };
                return Err(e);
            }
        };
        // The driver's own accept set the mode it wants (and TCP_NODELAY
        // came from the listener): no syscall on the new socket here.
        Ok((Sock::with_fd(fd, &self.driver, true, true)?, peer))
    }
}

/// Pipes one shard may have out at once: each holds up to [`PIPE_BYTES`]
/// of spliced data (and, on the ring, at most two kernel workers blocked in
/// its splices), so this bounds what slow readers pin.
pub const PIPES_MAX: usize = 256;
/// The size asked for each pipe (`F_SETPIPE_SZ`; the default 64 KiB stays
/// if the kernel refuses).
pub const PIPE_BYTES: usize = 256 << 10;
/// Idle pipes a shard keeps for the next relay.
const PIPES_POOLED: usize = 32;

/// A pipe's two descriptors and its size, closed when the last holder lets
/// go: the relay's [`Pipe`], and on the ring each splice in flight (the
/// kernel may use them until its completion, whatever happens to the future).
pub(in crate::io) struct PipeFds {
    pub(in crate::io) r: RawFd,
    pub(in crate::io) w: RawFd,
    cap: usize,
}

impl PipeFds {
    /// One non-blocking splice of up to `n` bytes from socket `fd` into
    /// the pipe (epoll): 0 at EOF, `WouldBlock` when the socket is empty (or
    /// the pipe full). The socket must be non-blocking itself:
    /// `SPLICE_F_NONBLOCK` covers only the pipe.
    pub(in crate::io) fn fill_from(&self, fd: RawFd, n: usize) -> io::Result<usize> {
        splice_nb(fd, self.w, n)
    }

    /// One non-blocking splice of up to `n` bytes (held in the pipe) into
    /// socket `fd`: `WouldBlock` when the socket is full.
    pub(in crate::io) fn drain_to(&self, fd: RawFd, n: usize) -> io::Result<usize> {
        splice_nb(self.r, fd, n)
    }
}

/// `splice(2)` of up to `n` bytes, `SPLICE_F_MOVE | SPLICE_F_NONBLOCK`,
/// again after `EINTR`.
fn splice_nb(from: RawFd, to: RawFd, n: usize) -> io::Result<usize> {
    loop {
        // SAFETY: both descriptors are open; no user memory is involved.
        let k = unsafe {
            libc::splice(
                from,
                std::ptr::null_mut(),
                to,
                std::ptr::null_mut(),
                n,
                libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK,
            )
        };
        if k >= 0 {
            return Ok(k as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

impl Drop for PipeFds {
    fn drop(&mut self) {
        // SAFETY: both ends are owned here and closed once.
        unsafe {
            libc::close(self.r);
            libc::close(self.w);
        }
    }
}

/// A pipe for splicing between two sockets, from the shard's pool; an empty
/// one that no splice still names goes back to it when dropped, any other
/// is closed (once the kernel is done with it).
pub struct Pipe {
    driver: Rc<Driver>,
    fds: Rc<PipeFds>,
    /// Bytes spliced in and not yet out.
    held: usize,
}

impl Pipe {
    /// A pipe, unless the shard has [`PIPES_MAX`] out or `pipe2` fails (the
    /// caller copies instead; counted in `splice_fallbacks`).
    pub fn take(driver: &Rc<Driver>) -> Option<Pipe> {
        let fds = match driver.pipes.borrow_mut().pop() {
            Some(p) => p,
            None if driver.pipes_out.get() >= PIPES_MAX => return None,
            None => {
                let mut fds = [0 as RawFd; 2];
                // SAFETY: fds has room for the two descriptors.
                let rc =
                    unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) };
                if rc != 0 {
                    return None;
                }
                // SAFETY: fds[1] was just opened; a refusal leaves the default size.
                let cap = unsafe {
                    libc::fcntl(fds[1], libc::F_SETPIPE_SZ, PIPE_BYTES as libc::c_int);
                    libc::fcntl(fds[1], libc::F_GETPIPE_SZ)
                };
                Rc::new(PipeFds {
                    r: fds[0],
                    w: fds[1],
                    cap: if cap > 0 { cap as usize } else { 64 << 10 },
                })
            }
        };
        driver.pipes_out.set(driver.pipes_out.get() + 1);
        Some(Pipe {
            driver: driver.clone(),
            fds,
            held: 0,
        })
    }
}

impl Drop for Pipe {
    fn drop(&mut self) {
        let d = &self.driver;
        d.pipes_out.set(d.pipes_out.get() - 1);
        let mut pool = d.pipes.borrow_mut();
        if self.held == 0 && Rc::strong_count(&self.fds) == 1 && pool.len() < PIPES_POOLED {
            pool.push(self.fds.clone());
        }
    }
}
