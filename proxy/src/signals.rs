//! SIGTERM/SIGINT (drain) and SIGUSR1 (reopen the access log): blocked in every thread, received synchronously by the main thread.

use std::time::Duration;

/// The termination signals, blocked in the calling thread (and so in every
/// thread it spawns afterwards) so that only [`wait`] receives them.
pub struct TermSignals {
    set: libc::sigset_t,
}

impl TermSignals {
    /// Blocks SIGTERM, SIGINT and SIGUSR1. Call before spawning any shard thread.
    pub fn block() -> std::io::Result<TermSignals> {
        // SAFETY: sigset_t is plain data initialised by sigemptyset before use;
        // pthread_sigmask only reads the set.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGTERM);
            libc::sigaddset(&mut set, libc::SIGINT);
            libc::sigaddset(&mut set, libc::SIGUSR1);
            let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            if rc != 0 {
                return Err(std::io::Error::from_raw_os_error(rc));
            }
            Ok(TermSignals { set })
        }
    }

    /// Waits up to `timeout` for one of the blocked signals; returns its number.
    pub fn wait(&self, timeout: Duration) -> Option<i32> {
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: set and ts are valid; info may be null.
        let sig = unsafe { libc::sigtimedwait(&self.set, std::ptr::null_mut(), &ts) };
        (sig > 0).then_some(sig)
    }
}

/// SIGUSR1: reopen the access log (after rotation), keep running.
pub const REOPEN: i32 = libc::SIGUSR1;
