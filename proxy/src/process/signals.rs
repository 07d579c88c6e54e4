//! Signal handling: every handled signal is blocked in every thread and received synchronously by the main thread, which turns it into a [`Signal`].

use std::time::Duration;

/// What a received signal asks for.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Signal {
    /// SIGTERM, SIGINT, SIGQUIT: stop accepting, drain, exit.
    Drain(i32),
    /// SIGHUP: re-read and apply the configuration.
    Reload,
    /// SIGUSR1: reopen log files.
    ReopenLogs,
    /// SIGUSR2, SIGALRM, SIGVTALRM, SIGPROF, SIGWINCH, SIGTSTP: logged and ignored
    /// (their default action would end or stop the process without a word).
    Ignored(i32),
}

const DRAIN: [i32; 3] = [libc::SIGTERM, libc::SIGINT, libc::SIGQUIT];
const IGNORED: [i32; 6] = [
    libc::SIGUSR2,
    libc::SIGALRM,
    libc::SIGVTALRM,
    libc::SIGPROF,
    libc::SIGWINCH,
    libc::SIGTSTP,
];

/// The handled signals, blocked in the calling thread (and so in every
/// thread it spawns afterwards) so that only [`Signals::wait`] receives them.
/// SIGPIPE needs nothing: Rust's runtime ignores it, and sockets write with
/// `MSG_NOSIGNAL`.
pub struct Signals {
    set: libc::sigset_t,
}

impl Signals {
    /// Blocks every handled signal. Call before spawning any thread.
    pub fn block() -> std::io::Result<Signals> {
        // SAFETY: sigset_t is plain data initialised by sigemptyset before use;
        // pthread_sigmask only reads the set.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for s in DRAIN
                .iter()
                .chain(&IGNORED)
                .chain(&[libc::SIGHUP, libc::SIGUSR1])
            {
                libc::sigaddset(&mut set, *s);
            }
            let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            if rc != 0 {
                return Err(std::io::Error::from_raw_os_error(rc));
            }
            Ok(Signals { set })
        }
    }

    /// Waits up to `timeout` for a handled signal.
    pub fn wait(&self, timeout: Duration) -> Option<Signal> {
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: set and ts are valid; info may be null.
        let sig = unsafe { libc::sigtimedwait(&self.set, std::ptr::null_mut(), &ts) };
        (sig > 0).then(|| classify(sig))
    }
}

fn classify(sig: i32) -> Signal {
    match sig {
        libc::SIGHUP => Signal::Reload,
        libc::SIGUSR1 => Signal::ReopenLogs,
        s if DRAIN.contains(&s) => Signal::Drain(s),
        s => Signal::Ignored(s),
    }
}

/// The signal's name without `SIG` (`TERM`, `HUP`), for log lines.
pub fn name(sig: i32) -> String {
    // SAFETY: strsignal returns a pointer to a static or thread-local string.
    let text = unsafe { std::ffi::CStr::from_ptr(libc::strsignal(sig)) };
    let known = [
        (libc::SIGTERM, "TERM"),
        (libc::SIGINT, "INT"),
        (libc::SIGQUIT, "QUIT"),
        (libc::SIGHUP, "HUP"),
        (libc::SIGUSR1, "USR1"),
        (libc::SIGUSR2, "USR2"),
        (libc::SIGALRM, "ALRM"),
        (libc::SIGVTALRM, "VTALRM"),
        (libc::SIGPROF, "PROF"),
        (libc::SIGWINCH, "WINCH"),
        (libc::SIGTSTP, "TSTP"),
    ];
    match known.iter().find(|(n, _)| *n == sig) {
        Some((_, s)) => (*s).to_string(),
        None => text.to_string_lossy().into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_each_handled_signal() {
        assert_eq!(classify(libc::SIGHUP), Signal::Reload);
        assert_eq!(classify(libc::SIGUSR1), Signal::ReopenLogs);
        assert_eq!(classify(libc::SIGTERM), Signal::Drain(libc::SIGTERM));
        assert_eq!(classify(libc::SIGQUIT), Signal::Drain(libc::SIGQUIT));
        assert_eq!(classify(libc::SIGUSR2), Signal::Ignored(libc::SIGUSR2));
        assert_eq!(name(libc::SIGALRM), "ALRM");
    }
}
