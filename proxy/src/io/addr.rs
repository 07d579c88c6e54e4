//! Socket addresses in the kernel's form and back, socket options, and the listening sockets a shard binds (`SO_REUSEPORT`).

use std::io;
use std::net::SocketAddr;
use std::os::fd::RawFd;

/// Listen backlog asked for; the kernel caps it at `net.core.somaxconn`.
const BACKLOG: i32 = 4096;

/// A socket address as the kernel takes it.
pub(super) fn sockaddr(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain data; zeroed is a valid start.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            // SAFETY: sockaddr_storage is large and aligned enough for sockaddr_in.
            let sin = unsafe {
                &mut *(&mut storage as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>()
            };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = a.port().to_be();
            sin.sin_addr.s_addr = u32::from(*a.ip()).to_be();
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            // SAFETY: sockaddr_storage is large and aligned enough for sockaddr_in6.
            let sin6 = unsafe {
                &mut *(&mut storage as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>()
            };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = a.port().to_be();
            sin6.sin6_addr.s6_addr = a.ip().octets();
            sin6.sin6_flowinfo = a.flowinfo();
            sin6.sin6_scope_id = a.scope_id();
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (storage, len as libc::socklen_t)
}

/// The address in a `sockaddr_storage` the kernel filled.
fn from_sockaddr(storage: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match storage.ss_family as i32 {
        libc::AF_INET => {
            // SAFETY: the family says it holds a sockaddr_in.
            let sin =
                unsafe { &*(storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            Some(SocketAddr::from((
                u32::from_be(sin.sin_addr.s_addr).to_be_bytes(),
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says it holds a sockaddr_in6.
            let sin6 = unsafe {
                &*(storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>()
            };
            Some(SocketAddr::V6(std::net::SocketAddrV6::new(
                sin6.sin6_addr.s6_addr.into(),
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// The peer of a connected socket.
pub fn peer_addr(fd: RawFd) -> io::Result<SocketAddr> {
    socket_name(fd, libc::getpeername)
}

/// The local address of a socket.
pub fn local_addr(fd: RawFd) -> io::Result<SocketAddr> {
    socket_name(fd, libc::getsockname)
}

type NameFn =
    unsafe extern "C" fn(libc::c_int, *mut libc::sockaddr, *mut libc::socklen_t) -> libc::c_int;

fn socket_name(fd: RawFd, f: NameFn) -> io::Result<SocketAddr> {
    // SAFETY: plain data, zeroed is valid.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: storage and len are valid for the call; f is getpeername or getsockname.
    let rc = unsafe {
        f(
            fd,
            (&mut storage as *mut libc::sockaddr_storage).cast(),
            &mut len,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    from_sockaddr(&storage).ok_or_else(|| io::Error::other("not an IP socket"))
}

pub(super) fn setsockopt_int(fd: RawFd, level: i32, opt: i32, v: libc::c_int) -> io::Result<()> {
    // SAFETY: fd is open; the option value is a c_int that outlives the call.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            opt,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// A new non-blocking TCP socket for `addr`'s family.
pub(super) fn tcp_socket(addr: &SocketAddr) -> io::Result<RawFd> {
    let family = if addr.is_ipv6() {
        libc::AF_INET6
    } else {
        libc::AF_INET
    };
    // SAFETY: plain syscall; the result is checked.
    let fd = unsafe {
        libc::socket(
            family,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// Binds a non-blocking listening socket with SO_REUSEPORT (every shard binds
/// the same address and the kernel spreads connections), SO_REUSEADDR (a
/// restart can rebind while old connections linger in TIME_WAIT) and a
/// backlog that follows somaxconn. The caller owns the descriptor.
pub fn bind_listener(addr: SocketAddr) -> io::Result<RawFd> {
    let fd = tcp_socket(&addr)?;
    let fail = |e: io::Error| {
        // SAFETY: fd was opened above and is closed once on this path.
        unsafe { libc::close(fd) };
        e
    };
    for opt in [libc::SO_REUSEPORT, libc::SO_REUSEADDR] {
        setsockopt_int(fd, libc::SOL_SOCKET, opt, 1).map_err(fail)?;
    }
    let (storage, len) = sockaddr(addr);
    // SAFETY: storage holds a valid address of `len` bytes; fd is open.
    if unsafe { libc::bind(fd, (&storage as *const libc::sockaddr_storage).cast(), len) } < 0 {
        return Err(fail(io::Error::last_os_error()));
    }
    // SAFETY: fd is a bound socket.
    if unsafe { libc::listen(fd, BACKLOG) } < 0 {
        return Err(fail(io::Error::last_os_error()));
    }
    Ok(fd)
}
