//! Process state that outlives any one runtime: config generation, reload outcomes, the drain gauge and what a drain cut (rendered beside the runtime's metrics); the log-reopen hook; systemd readiness over `$NOTIFY_SOCKET`.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

/// Counters of the process lifecycle, written by the main thread (and the
/// shards at the drain deadline), read by `/metrics`.
pub struct Lifecycle {
    /// 1 for the configuration loaded at start, +1 per applied reload.
    pub generation: AtomicU64,
    pub reloads_applied: AtomicU64,
    pub reloads_rejected: AtomicU64,
    pub draining: AtomicBool,
    /// Requests and connections still open when the drain deadline passed.
    pub cut_requests: AtomicU64,
    pub cut_connections: AtomicU64,
    /// Set by a second drain signal: each shard counts what it holds into
    /// `cut_*` now, without waiting for the deadline, and stops.
    pub cut_now: AtomicBool,
    /// Set once every shard accepts on its first generation (`/ready`).
    pub ready: AtomicBool,
    /// Set when the listening sockets went to a new process (`--upgrade`):
    /// the admin socket is answered there, not here, during this drain.
    pub handed_off: AtomicBool,
    /// Admin state changes by the state set (`AdminState as usize`).
    pub endpoint_changes: [AtomicU64; 3],
    /// Admin POSTs refused: `[401 unauthorized, 403 forbidden]`.
    pub admin_refused: [AtomicU64; 2],
}

pub static LIFECYCLE: Lifecycle = Lifecycle {
    generation: AtomicU64::new(1),
    reloads_applied: AtomicU64::new(0),
    reloads_rejected: AtomicU64::new(0),
    draining: AtomicBool::new(false),
    cut_requests: AtomicU64::new(0),
    cut_connections: AtomicU64::new(0),
    cut_now: AtomicBool::new(false),
    ready: AtomicBool::new(false),
    handed_off: AtomicBool::new(false),
    endpoint_changes: [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)],
    admin_refused: [AtomicU64::new(0), AtomicU64::new(0)],
};

/// Exit status when the drain deadline cut a request or a connection
/// (documented in docs/lifecycle.md and `zgix --help`).
pub const EXIT_DRAIN_CUT: i32 = 3;

/// A second drain signal: asks the shards to count what they still hold
/// into `cut_*` and stop (`wake` wakes each draining shard to look), and
/// waits (at most a second) until they did.
pub fn cut_now(live: &std::sync::atomic::AtomicUsize, wake: impl Fn()) {
    LIFECYCLE
        .cut_now
        .store(true, std::sync::atomic::Ordering::Release);
    wake();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(1);
    while live.load(std::sync::atomic::Ordering::Acquire) > 0 && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// Appends the lifecycle series in the Prometheus text format 0.0.4.
pub fn render(out: &mut String) {
    let l = &LIFECYCLE;
    let _ = writeln!(
        out,
        "# HELP zgix_config_reloads_total Configuration reloads (SIGHUP) by outcome.\n\
         # TYPE zgix_config_reloads_total counter\n\
         zgix_config_reloads_total{{result=\"applied\"}} {}\n\
         zgix_config_reloads_total{{result=\"rejected\"}} {}\n\
         # HELP zgix_config_generation Configuration generation in use (1 at start, +1 per applied reload).\n\
         # TYPE zgix_config_generation gauge\n\
         zgix_config_generation {}\n\
         # HELP zgix_draining 1 while the process drains before exiting.\n\
         # TYPE zgix_draining gauge\n\
         zgix_draining {}\n\
         # HELP zgix_generations_live Configuration generations still alive (the current one, and each older one a connection or request still runs on).\n\
         # TYPE zgix_generations_live gauge\n\
         zgix_generations_live {}",
        l.reloads_applied.load(Relaxed),
        l.reloads_rejected.load(Relaxed),
        l.generation.load(Relaxed),
        u8::from(l.draining.load(Relaxed)),
        crate::conn::shard::generations_live(),
    );
    let _ = writeln!(
        out,
        "# HELP zgix_admin_endpoint_changes_total Endpoint state changes made through the admin API, by the state set.\n\
         # TYPE zgix_admin_endpoint_changes_total counter"
    );
    for s in crate::upstream::health::AdminState::ALL {
        let _ = writeln!(
            out,
            "zgix_admin_endpoint_changes_total{{state=\"{}\"}} {}",
            s.as_str(),
            l.endpoint_changes[s as usize].load(Relaxed)
        );
    }
    let _ = writeln!(
        out,
        "# HELP zgix_admin_refused_total Admin POSTs refused: no or a wrong bearer token (401), or no token on a non-loopback admin.bind (403).\n\
         # TYPE zgix_admin_refused_total counter\n\
         zgix_admin_refused_total{{code=\"401\"}} {}\n\
         zgix_admin_refused_total{{code=\"403\"}} {}\n\
         # HELP zgix_ready 1 while /ready answers 200 (every shard up, not draining).\n\
         # TYPE zgix_ready gauge\n\
         zgix_ready {}",
        l.admin_refused[0].load(Relaxed),
        l.admin_refused[1].load(Relaxed),
        u8::from(l.ready.load(Relaxed) && !l.draining.load(Relaxed)),
    );
}

/// `RELOADING=1` with the `CLOCK_MONOTONIC` time in µs, which systemd's
/// `Type=notify-reload` insists on (systemd.service(5)): it tells this
/// reload from one under way before the signal.
pub fn notify_reloading() {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    let us = ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1_000;
    sd_notify(&format!("RELOADING=1\nMONOTONIC_USEC={us}"));
}

/// Reopens log files (SIGUSR1, for logrotate). zgix writes only to stderr
/// today, which the supervisor owns, so there is nothing to reopen yet; the
/// access log connects its reopen function here.
pub fn reopen_logs() {
    crate::log_info!("server", "signal USR1: log files reopened");
}

/// Sends `state` (e.g. `READY=1`) to systemd when it started us with
/// `Type=notify`; does nothing otherwise. See sd_notify(3): the socket is a
/// datagram socket, `@` at the start of its name means the abstract namespace.
pub fn sd_notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    if let Err(e) = send_notify(&path, state) {
        crate::log_warn!("server", "cannot notify systemd ({state}): {e}");
    }
}

fn send_notify(path: &std::ffi::OsStr, state: &str) -> std::io::Result<()> {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::net::{SocketAddr, UnixDatagram};
    let sock = UnixDatagram::unbound()?;
    let bytes = path.as_bytes();
    let addr = match bytes.strip_prefix(b"@") {
        Some(name) => SocketAddr::from_abstract_name(name)?,
        None => SocketAddr::from_pathname(std::path::Path::new(path))?,
    };
    sock.send_to_addr(state.as_bytes(), &addr)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_reload_generation_and_draining_series() {
        let mut o = String::new();
        render(&mut o);
        assert!(o.contains("zgix_config_reloads_total{result=\"applied\"} "));
        assert!(o.contains("zgix_config_reloads_total{result=\"rejected\"} "));
        assert!(o.contains("\nzgix_config_generation "), "{o}");
        assert!(o.contains("\nzgix_draining 0"), "{o}");
    }

    #[test]
    fn notify_reaches_a_datagram_socket() {
        let dir = std::env::temp_dir().join(format!("zgix-notify-{}", std::process::id()));
        let _ = std::fs::remove_file(&dir);
        let rx = std::os::unix::net::UnixDatagram::bind(&dir).unwrap();
        send_notify(dir.as_os_str(), "READY=1").unwrap();
        let mut buf = [0u8; 64];
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");
        let _ = std::fs::remove_file(&dir);
    }
}
