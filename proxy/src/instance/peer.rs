//! Who is on the other end of a control socket (`SO_PEERCRED`, unix(7)) and whether zgix may talk to it: only its own effective uid, or root.

use std::io;
use std::os::unix::net::UnixStream;

use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};

/// A peer's credentials as the kernel recorded them at `connect`/`listen`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peer {
    pub pid: i32,
    pub uid: u32,
}

/// The credentials of `s`'s peer. For a connected client this is the
/// process that called `listen` on the other end; for an accepted socket,
/// the process that called `connect`.
pub fn peer(s: &UnixStream) -> io::Result<Peer> {
    let c = getsockopt(s, PeerCredentials).map_err(io::Error::from)?;
    Ok(Peer {
        pid: c.pid(),
        uid: c.uid(),
    })
}

/// The uid zgix runs as (its effective uid).
pub fn own_uid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// Whether a peer may hand off, stop or query this instance, or hand its
/// sockets to us: the same effective uid as ours, or root.
pub fn trusted(p: Peer) -> bool {
    p.uid == own_uid() || p.uid == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_socket_pair_peer_is_this_process_and_trusted() {
        let (a, _b) = UnixStream::pair().unwrap();
        let p = peer(&a).unwrap();
        assert_eq!(p.pid as u32, std::process::id());
        assert_eq!(p.uid, own_uid());
        assert!(trusted(p));
    }

    #[test]
    fn another_non_root_uid_is_not_trusted() {
        let other = if own_uid() == 65534 { 65533 } else { 65534 };
        assert!(!trusted(Peer { pid: 1, uid: other }));
        assert!(trusted(Peer { pid: 1, uid: 0 }));
    }
}
