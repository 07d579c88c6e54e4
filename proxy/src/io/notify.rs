//! The cross-thread wake-up of a shard: an eventfd the main thread writes (drain, reload) and the shard's ring or epoll set watches.

use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};

/// Wakes a shard's driver from another thread (the drain, a reload).
pub struct Notifier {
    pub(super) fd: RawFd,
    /// Bumped by every `notify`; the shard compares it with what it saw.
    pub seq: AtomicU64,
}

impl Notifier {
    pub(super) fn new() -> io::Result<Notifier> {
        // SAFETY: plain syscall; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Notifier {
            fd,
            seq: AtomicU64::new(0),
        })
    }

    /// Wakes the shard (it then runs its notification waiters).
    pub fn notify(&self) {
        self.seq.fetch_add(1, Ordering::AcqRel);
        let one: u64 = 1;
        // SAFETY: fd is an open eventfd; writing 8 bytes is its protocol.
        unsafe { libc::write(self.fd, (&one as *const u64).cast(), 8) };
    }

    pub(super) fn drain(&self) {
        let mut v: u64 = 0;
        // SAFETY: fd is an open non-blocking eventfd; v is 8 writable bytes.
        unsafe { libc::read(self.fd, (&mut v as *mut u64).cast(), 8) };
    }
}

impl Drop for Notifier {
    fn drop(&mut self) {
        // SAFETY: the eventfd is owned here and closed once.
        unsafe { libc::close(self.fd) };
    }
}
