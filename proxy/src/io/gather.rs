//! A gathered send: framing bytes of the caller's interleaved with ranges of a shared receive buffer, sent as one vectored `sendmsg` (epoll: from where the bytes are; the ring: the buffer kept alive by its `Rc` until the completion, the framing copied with the iovecs).
//!
//! The data pieces name a [`Buf`] behind an `Rc`: on the ring the send
//! holds a clone of it from its submission to its completion, whatever
//! happens to the future (dropped, forgotten, timed out), so the kernel
//! never reads memory that was unmapped; and the buffer's owner writes it
//! only through `Rc::get_mut` (`conn::state::ClientBytes`), going on in a
//! copy while a send still holds it, so the kernel never reads bytes the
//! caller overwrote either.

use std::io;
use std::os::fd::RawFd;
use std::rc::Rc;

use zgix_parser::Piece;

use super::Buf;

/// Iovecs one vectored send takes at most: one per [`Piece`].
pub const GATHER_IOVS: usize = zgix_parser::PIECES_MAX;

/// Framing bytes one gathered send carries at most.
pub const GATHER_FRAMING: usize = zgix_parser::FRAMING_MAX;

/// What [`super::Sock::write_all_gather`] sends: `pieces` in order, a
/// [`Piece::Framing`] range being bytes of `framing` and a [`Piece::Data`]
/// range bytes `base + range` of `shared`.
#[derive(Clone, Copy)]
pub struct Gather<'a> {
    pub shared: &'a Rc<Buf>,
    pub base: usize,
    pub framing: &'a [u8],
    pub pieces: &'a [Piece],
}

impl Gather<'_> {
    /// Bytes of the whole send.
    pub fn len(&self) -> usize {
        self.pieces.iter().map(|p| range(p).len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of it from the shared buffer (sent without a copy).
    pub fn data_len(&self) -> usize {
        self.pieces
            .iter()
            .filter(|p| matches!(p, Piece::Data(_)))
            .map(|p| range(p).len())
            .sum()
    }

    /// Whether it fits one send's iovecs and framing, its data inside the buffer.
    pub(super) fn fits(&self) -> bool {
        self.pieces.len() <= GATHER_IOVS
            && self.framing.len() <= GATHER_FRAMING
            && self.pieces.iter().all(|p| match p {
                Piece::Framing(r) => r.end <= self.framing.len(),
                Piece::Data(r) => self.base + r.end <= self.shared.len(),
            })
    }

    /// Fills `iov` with the pieces past their first `skip` bytes, the
    /// framing read from `framing` (the caller's, or the ring's copy of
    /// it); returns how many iovecs it filled. Empty pieces are left out.
    pub(super) fn iovecs(
        &self,
        mut skip: usize,
        framing: *const u8,
        iov: &mut [libc::iovec],
    ) -> usize {
        let data = self.shared.as_ptr();
        let mut n = 0;
        for p in self.pieces {
            let r = range(p);
            if skip >= r.len() {
                skip -= r.len();
                continue;
            }
            let base = match p {
                Piece::Framing(_) => framing,
                Piece::Data(_) => data.wrapping_add(self.base),
            };
            iov[n] = libc::iovec {
                iov_base: base.wrapping_add(r.start + skip) as *mut libc::c_void,
                iov_len: r.len() - skip,
            };
            skip = 0;
            n += 1;
        }
        n
    }
}

fn range(p: &Piece) -> &std::ops::Range<usize> {
    match p {
        Piece::Framing(r) | Piece::Data(r) => r,
    }
}

/// One non-blocking `sendmsg` of `iov` on `fd` (`MSG_NOSIGNAL`), again
/// after `EINTR`: the bytes the kernel took.
pub(super) fn sendmsg_nb(fd: RawFd, iov: &mut [libc::iovec]) -> io::Result<usize> {
    // SAFETY: msghdr is plain data; all-zero is an empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = iov.len() as _;
    loop {
        // SAFETY: every iovec names bytes the caller keeps borrowed for
        // this call (its framing, the shared buffer); fd is open.
        let n = unsafe { libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}
