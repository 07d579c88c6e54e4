//! Socket addresses in the kernel's form and back, socket options, and the listening sockets a shard binds (`SO_REUSEPORT`), all through socket2 (no hand-written `sockaddr` or `setsockopt`).

use std::io;
use std::net::SocketAddr;
use std::os::fd::{BorrowedFd, IntoRawFd, RawFd};

use socket2::{Domain, SockAddr, SockRef, Socket, Type};

/// Listen backlog asked for; the kernel caps it at `net.core.somaxconn`.
const BACKLOG: i32 = 4096;

/// A socket address as the kernel takes it (`as_ptr`, `len`); the
/// conversions both ways are socket2's.
pub(super) fn sockaddr(addr: SocketAddr) -> SockAddr {
    SockAddr::from(addr)
}

/// The socket behind `fd`, borrowed for a call (it is not closed after).
/// `EBADF` for a negative descriptor (socket2 would panic on it).
fn sock_ref<'a>(fd: &'a BorrowedFd<'_>) -> SockRef<'a> {
    SockRef::from(fd)
}

/// Borrows `fd` (open for the duration of the caller's call) for socket2.
fn borrow(fd: RawFd) -> io::Result<BorrowedFd<'static>> {
    if fd < 0 {
        return Err(io::Error::from_raw_os_error(libc::EBADF));
    }
    // SAFETY: the caller's descriptor is open for as long as the borrow is
    // used (within the caller's call); it is never closed through it.
    Ok(unsafe { BorrowedFd::borrow_raw(fd) })
}

fn ip_only(a: SockAddr) -> io::Result<SocketAddr> {
    a.as_socket()
        .ok_or_else(|| io::Error::other("not an IP socket"))
}

/// The peer of a connected socket.
pub fn peer_addr(fd: RawFd) -> io::Result<SocketAddr> {
    ip_only(sock_ref(&borrow(fd)?).peer_addr()?)
}

/// The local address of a socket.
pub fn local_addr(fd: RawFd) -> io::Result<SocketAddr> {
    ip_only(sock_ref(&borrow(fd)?).local_addr()?)
}

/// `TCP_NODELAY` on or off.
pub(super) fn set_nodelay(fd: RawFd, on: bool) -> io::Result<()> {
    sock_ref(&borrow(fd)?).set_nodelay(on)
}

/// The socket's pending error (`SO_ERROR`, cleared by reading it): how a
/// non-blocking connect ended.
pub(super) fn take_error(fd: RawFd) -> io::Result<Option<io::Error>> {
    sock_ref(&borrow(fd)?).take_error()
}

/// A new non-blocking, close-on-exec TCP socket for `addr`'s family.
pub(super) fn tcp_socket(addr: &SocketAddr) -> io::Result<RawFd> {
    let ty = Type::STREAM.nonblocking().cloexec();
    let s = Socket::new(Domain::for_address(*addr), ty, None)?;
    Ok(s.into_raw_fd())
}

/// Binds a non-blocking listening socket with SO_REUSEPORT (every shard binds
/// the same address and the kernel spreads connections), SO_REUSEADDR (a
/// restart can rebind while old connections linger in TIME_WAIT) and a
/// backlog that follows somaxconn. The caller owns the descriptor.
pub fn bind_listener(addr: SocketAddr) -> io::Result<RawFd> {
    let ty = Type::STREAM.nonblocking().cloexec();
    // Closed on every error path by its drop.
    let s = Socket::new(Domain::for_address(addr), ty, None)?;
    s.set_reuse_port(true)?;
    s.set_reuse_address(true)?;
    s.bind(&SockAddr::from(addr))?;
    s.listen(BACKLOG)?;
    Ok(s.into_raw_fd())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_go_to_the_kernel_and_back_unchanged() {
        for a in ["127.0.0.1:0", "[::1]:0"] {
            let a: SocketAddr = a.parse().unwrap();
            let Ok(fd) = bind_listener(a) else {
                // No IPv6 on this box.
                continue;
            };
            let local = local_addr(fd).unwrap();
            assert_eq!(local.ip(), a.ip());
            assert_ne!(local.port(), 0);
            let c = std::net::TcpStream::connect(local).unwrap();
            assert_eq!(
                peer_addr(c.as_raw_fd()).unwrap(),
                local,
                "the client's peer is the listener"
            );
            assert_eq!(sockaddr(local).as_socket(), Some(local));
            set_nodelay(c.as_raw_fd(), true).unwrap();
            assert!(take_error(c.as_raw_fd()).unwrap().is_none());
            // SAFETY: the listener's descriptor, closed once.
            unsafe { libc::close(fd) };
        }
        assert_eq!(peer_addr(-1).unwrap_err().raw_os_error(), Some(libc::EBADF));
    }

    use std::os::fd::AsRawFd;
}
