//! The `process_*` series of the Prometheus client conventions (CPU time, resident memory, descriptors, start time), read from `/proc/self` at each scrape, and `zgix_max_connections`.
//!
//! Names, units and types follow the Prometheus client libraries' process
//! collector (client_golang `process_collector_procfs.go`): CPU in seconds
//! as a counter, memory in bytes, the start time in Unix seconds.

use std::fmt::Write as _;

/// What `/proc/self` says about the process, read at one scrape.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct ProcessStats {
    /// User plus system CPU time, in seconds.
    pub cpu_seconds: f64,
    pub resident_bytes: u64,
    pub virtual_bytes: u64,
    pub open_fds: u64,
    /// The soft `RLIMIT_NOFILE`.
    pub max_fds: u64,
    /// Start time in Unix seconds (`None` if `/proc` could not say).
    pub start_time: Option<f64>,
}

/// Reads the process's figures (each one that cannot be read stays 0).
pub fn read() -> ProcessStats {
    // SAFETY: sysconf has no preconditions.
    let (ticks, page) = unsafe {
        (
            libc::sysconf(libc::_SC_CLK_TCK).max(1) as f64,
            libc::sysconf(libc::_SC_PAGESIZE).max(1) as u64,
        )
    };
    let mut p = ProcessStats::default();
    if let Ok(stat) = std::fs::read_to_string("/proc/self/stat") {
        if let Some(f) = stat_fields(&stat) {
            // Fields 14, 15 (utime, stime), 22 (starttime) in clock ticks,
            // 23 (vsize) in bytes, 24 (rss) in pages: proc(5), 1-based.
            let n = |i: usize| {
                f.get(i - 3)
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            p.cpu_seconds = (n(14) + n(15)) as f64 / ticks;
            p.virtual_bytes = n(23);
            p.resident_bytes = n(24) * page;
            p.start_time = boot_time().map(|b| b + n(22) as f64 / ticks);
        }
    }
    p.open_fds = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64);
    // SAFETY: getrlimit writes into a plain struct it is given.
    unsafe {
        let mut r: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 {
            p.max_fds = r.rlim_cur as u64;
        }
    }
    p
}

/// The fields of `/proc/self/stat` after the command name (which may hold
/// spaces and parentheses: it ends at the last `)`), starting with field 3.
fn stat_fields(stat: &str) -> Option<Vec<&str>> {
    let rest = &stat[stat.rfind(')')? + 1..];
    Some(rest.split_whitespace().collect())
}

/// `btime` of `/proc/stat`: the boot time in Unix seconds.
fn boot_time() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/stat").ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// Appends the process families; `fallback_start` (when the registry was
/// made) stands in when `/proc` gives no start time.
pub fn render(o: &mut String, fallback_start: f64, max_connections: usize) {
    let p = read();
    let rows: [(&str, &str, &str, String); 7] = [
        (
            "process_cpu_seconds_total",
            "counter",
            "Total user and system CPU time spent in seconds.",
            format!("{:.2}", p.cpu_seconds),
        ),
        (
            "process_resident_memory_bytes",
            "gauge",
            "Resident memory size in bytes.",
            p.resident_bytes.to_string(),
        ),
        (
            "process_virtual_memory_bytes",
            "gauge",
            "Virtual memory size in bytes.",
            p.virtual_bytes.to_string(),
        ),
        (
            "process_open_fds",
            "gauge",
            "Number of open file descriptors.",
            p.open_fds.to_string(),
        ),
        (
            "process_max_fds",
            "gauge",
            "Maximum number of open file descriptors.",
            p.max_fds.to_string(),
        ),
        (
            "process_start_time_seconds",
            "gauge",
            "Start time of the process since unix epoch in seconds.",
            format!("{:.2}", p.start_time.unwrap_or(fallback_start)),
        ),
        (
            "zgix_max_connections",
            "gauge",
            "Client connections zgix accepts at once over all shards (limits.max_connections, or half the descriptor limit).",
            max_connections.to_string(),
        ),
    ];
    for (name, kind, help, v) in rows {
        let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        let p = read();
        assert!(
            p.resident_bytes > 0 && p.virtual_bytes >= p.resident_bytes,
            "{p:?}"
        );
        assert!(p.open_fds >= 3 && p.max_fds >= p.open_fds, "{p:?}");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let start = p.start_time.expect("btime and starttime");
        assert!(
            start <= now + 1.0 && start > now - 86_400.0 * 365.0,
            "{start} vs {now}"
        );
    }

    #[test]
    fn the_command_name_may_hold_spaces_and_parentheses() {
        let f = stat_fields("42 (a) b) S 1 2 3").unwrap();
        assert_eq!(f, ["S", "1", "2", "3"]);
    }
}
