//! Listening sockets across a unix socket: descriptors sent as `SCM_RIGHTS` control messages (unix(7)), at most [`FDS_PER_MESSAGE`] per one-byte message.

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};

/// Descriptors sent in one message (the kernel allows 253, `SCM_MAX_FD`).
pub const FDS_PER_MESSAGE: usize = 64;

/// Sends `fds` (at most [`FDS_PER_MESSAGE`]) with one byte of data.
pub fn send_fds(s: &UnixStream, fds: &[RawFd]) -> io::Result<()> {
    debug_assert!(fds.len() <= FDS_PER_MESSAGE);
    let iov = [IoSlice::new(b"F")];
    let cmsg = [ControlMessage::ScmRights(fds)];
    sendmsg::<()>(s.as_raw_fd(), &iov, &cmsg, MsgFlags::empty(), None)?;
    Ok(())
}

/// Receives `total` descriptors, each taken into an [`OwnedFd`] once (and
/// marked close-on-exec as it arrives).
pub fn recv_fds(s: &UnixStream, total: usize) -> io::Result<Vec<OwnedFd>> {
    let mut out = Vec::with_capacity(total);
    let mut space = nix::cmsg_space!([RawFd; FDS_PER_MESSAGE]);
    while out.len() < total {
        let mut byte = [0u8];
        let mut iov = [IoSliceMut::new(&mut byte)];
        space.clear();
        let msg = recvmsg::<()>(
            s.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )?;
        if msg.bytes == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "closed mid-hand-off",
            ));
        }
        for c in msg.cmsgs() {
            if let ControlMessageOwned::ScmRights(fds) = c {
                // SAFETY: the kernel installed each received descriptor in
                // this process just now; nothing else owns them.
                out.extend(
                    fds.into_iter()
                        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                );
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_cross_a_socket_pair_in_chunks() {
        let (a, b) = UnixStream::pair().unwrap();
        let files: Vec<std::fs::File> = (0..FDS_PER_MESSAGE + 3)
            .map(|_| std::fs::File::open("/dev/null").unwrap())
            .collect();
        let raw: Vec<RawFd> = files.iter().map(|f| f.as_raw_fd()).collect();
        for chunk in raw.chunks(FDS_PER_MESSAGE) {
            send_fds(&a, chunk).unwrap();
        }
        let got = recv_fds(&b, raw.len()).unwrap();
        assert_eq!(got.len(), raw.len());
        for fd in &got {
            assert!(
                !raw.contains(&fd.as_raw_fd()),
                "a received descriptor is a new number"
            );
        }
    }
}
