//! The error log: `<RFC 3339 ms> <level> <component>: message` lines on stderr, one process-wide level, and per-call-site rate limiting of repeats.
//!
//! Use the macros: `log_error!("server", "cannot bind {addr}: {e}")`, and
//! likewise [`log_warn!`](crate::log_warn), [`log_info!`](crate::log_info),
//! [`log_debug!`](crate::log_debug). Each call site may write [`BURST`] lines a
//! second; the rest are counted, and once the second is over one line says
//! `last message repeated N times`. Client-triggered events belong at debug
//! (a hostile client must not be able to flood the log), and a disabled level
//! costs one relaxed load: the arguments are not even formatted.

use std::cell::RefCell;
use std::fmt;
use std::io::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;

use crate::observe::clock::{unix_ms, write_rfc3339_ms, SecondCache};

/// Severity, most severe first.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Level {
    Error = 0,
    Warn = 1,
    Info = 2,
    Debug = 3,
}

impl Level {
    pub const ALL: [Level; 4] = [Level::Error, Level::Warn, Level::Info, Level::Debug];

    pub fn as_str(self) -> &'static str {
        match self {
            Level::Error => "error",
            Level::Warn => "warn",
            Level::Info => "info",
            Level::Debug => "debug",
        }
    }

    pub fn parse(s: &str) -> Option<Level> {
        Level::ALL.into_iter().find(|l| l.as_str() == s)
    }
}

/// Lines one call site may write per second before the rest are only counted.
/// Ten lets a short burst of distinct failures through in full.
pub const BURST: u64 = 10;

static LEVEL: AtomicU8 = AtomicU8::new(Level::Info as u8);

/// Sets the level: `explicit` (from `--log-level`) if given, else debug when
/// `ZGIX_DEBUG` is set (the older switch, kept as an alias), else info.
pub fn init(explicit: Option<Level>) {
    let level = explicit.unwrap_or(if std::env::var_os("ZGIX_DEBUG").is_some() {
        Level::Debug
    } else {
        Level::Info
    });
    LEVEL.store(level as u8, Ordering::Relaxed);
}

/// Whether lines at `level` are written.
#[inline]
pub fn enabled(level: Level) -> bool {
    level as u8 <= LEVEL.load(Ordering::Relaxed)
}

/// Whether debug lines (client-triggered events) are written; the drop-in
/// replacement for `shard::debug_enabled`.
#[inline]
pub fn debug_enabled() -> bool {
    enabled(Level::Debug)
}

/// One log call site's rate-limit state (a `static` the macros declare).
pub struct Site {
    level: Level,
    component: &'static str,
    /// The second `lines` counts in.
    window: AtomicU64,
    lines: AtomicU64,
    suppressed: AtomicU64,
    listed: AtomicBool,
}

/// Sites that have suppressed lines, so [`flush_repeats`] can report them
/// when no further line comes. Locked only when a site first suppresses.
static SUPPRESSING: Mutex<Vec<&'static Site>> = Mutex::new(Vec::new());

impl Site {
    pub const fn new(level: Level, component: &'static str) -> Site {
        Site {
            level,
            component,
            window: AtomicU64::new(0),
            lines: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
            listed: AtomicBool::new(false),
        }
    }

    /// Writes one line unless this site used its burst this second.
    pub fn emit(&'static self, args: fmt::Arguments<'_>) {
        let now = unix_ms();
        self.roll(now / 1000);
        if self.lines.fetch_add(1, Ordering::Relaxed) >= BURST {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            if !self.listed.swap(true, Ordering::Relaxed) {
                SUPPRESSING
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(self);
            }
            return;
        }
        write_line(now, self.level, self.component, args);
    }

    /// Starts a new window if `sec` is past the current one, reporting what
    /// the old window suppressed.
    fn roll(&self, sec: u64) {
        if new_window(&self.window, &self.lines, sec) {
            let n = self.suppressed.swap(0, Ordering::Relaxed);
            if n > 0 {
                write_line(
                    unix_ms(),
                    self.level,
                    self.component,
                    format_args!("last message repeated {n} times"),
                );
            }
        }
    }
}

/// A rate limit kept per subject rather than per call site (an upstream
/// endpoint's failure lines): [`BURST`] lines a second, the rest counted and
/// the count handed to the next line written, which names it. Atomics only:
/// shards share it without a lock.
#[derive(Default)]
pub struct Limiter {
    window: AtomicU64,
    lines: AtomicU64,
    /// Suppressed since the last line written.
    pending: AtomicU64,
    /// Suppressed since start (a metric).
    pub suppressed_total: AtomicU64,
}

impl Limiter {
    /// `None` when this second's burst is used (the line is counted);
    /// else how many lines were suppressed before this one.
    pub fn admit(&self, unix_ms: u64) -> Option<u64> {
        new_window(&self.window, &self.lines, unix_ms / 1000);
        if self.lines.fetch_add(1, Ordering::Relaxed) >= BURST {
            self.pending.fetch_add(1, Ordering::Relaxed);
            self.suppressed_total.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Some(self.pending.swap(0, Ordering::Relaxed))
    }
}

/// Writes one line at `level` if `limiter` admits it, with `, N earlier
/// line(s) suppressed` appended when some were.
pub fn log_limited(limiter: &Limiter, level: Level, component: &str, args: fmt::Arguments<'_>) {
    if !enabled(level) {
        return;
    }
    let now = unix_ms();
    match limiter.admit(now) {
        None => {}
        Some(0) => write_line(now, level, component, args),
        Some(n) => write_line(
            now,
            level,
            component,
            format_args!("{args} ({n} earlier line(s) suppressed)"),
        ),
    }
}

/// Moves `window` to second `sec` and zeroes its line count if it held an
/// earlier one; true for the one caller that moved it.
fn new_window(window: &AtomicU64, lines: &AtomicU64, sec: u64) -> bool {
    let w = window.load(Ordering::Relaxed);
    let moved = w != sec
        && window
            .compare_exchange(w, sec, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok();
    if moved {
        lines.store(0, Ordering::Relaxed);
    }
    moved
}

/// Reports sites whose suppressed lines have not been followed by a new
/// window yet; the main thread calls it a few times a second.
pub fn flush_repeats() {
    let sites = SUPPRESSING.lock().unwrap_or_else(|p| p.into_inner());
    let sec = unix_ms() / 1000;
    for site in sites.iter() {
        if site.suppressed.load(Ordering::Relaxed) > 0 {
            site.roll(sec);
        }
    }
}

/// Writes one line now, without rate limiting (start-up and shutdown lines).
pub fn log(level: Level, component: &str, args: fmt::Arguments<'_>) {
    if enabled(level) {
        write_line(unix_ms(), level, component, args);
    }
}

/// Appends one complete line for `unix_ms` to `out`.
pub fn format_line(
    out: &mut Vec<u8>,
    unix_ms: u64,
    cache: &SecondCache,
    level: Level,
    component: &str,
    args: fmt::Arguments<'_>,
) {
    write_rfc3339_ms(out, unix_ms, cache);
    out.push(b' ');
    out.extend_from_slice(level.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(component.as_bytes());
    out.extend_from_slice(b": ");
    let _ = out.write_fmt(args);
    out.push(b'\n');
}

thread_local! {
    static LINE: RefCell<(Vec<u8>, SecondCache)> =
        const { RefCell::new((Vec::new(), SecondCache::new())) };
}

/// Formats into this thread's reused buffer and writes the line with one
/// `write` on stderr, so lines of different threads never interleave.
fn write_line(unix_ms: u64, level: Level, component: &str, args: fmt::Arguments<'_>) {
    LINE.with(|cell| {
        let Ok(mut guard) = cell.try_borrow_mut() else {
            return; // a Display impl logging from inside a log line
        };
        let (buf, cache) = &mut *guard;
        buf.clear();
        format_line(buf, unix_ms, cache, level, component, args);
        let _ = std::io::stderr().lock().write_all(buf);
    });
}

/// Logs at `level` from `component` with call-site rate limiting.
#[macro_export]
macro_rules! log_at {
    ($level:expr, $component:expr, $($arg:tt)+) => {{
        static SITE: $crate::observe::log::Site = $crate::observe::log::Site::new($level, $component);
        if $crate::observe::log::enabled($level) {
            SITE.emit(format_args!($($arg)+));
        }
    }};
}

/// `log_error!("component", "format", args...)`.
#[macro_export]
macro_rules! log_error {
    ($component:expr, $($arg:tt)+) => { $crate::log_at!($crate::observe::log::Level::Error, $component, $($arg)+) };
}

/// `log_warn!("component", "format", args...)`.
#[macro_export]
macro_rules! log_warn {
    ($component:expr, $($arg:tt)+) => { $crate::log_at!($crate::observe::log::Level::Warn, $component, $($arg)+) };
}

/// `log_info!("component", "format", args...)`.
#[macro_export]
macro_rules! log_info {
    ($component:expr, $($arg:tt)+) => { $crate::log_at!($crate::observe::log::Level::Info, $component, $($arg)+) };
}

/// `log_debug!("component", "format", args...)`: client-triggered events.
#[macro_export]
macro_rules! log_debug {
    ($component:expr, $($arg:tt)+) => { $crate::log_at!($crate::observe::log::Level::Debug, $component, $($arg)+) };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shape every line has: timestamp, level, component, message.
    pub fn parse(line: &str) -> Option<(&str, Level, &str, &str)> {
        let (ts, rest) = line.split_once(' ')?;
        let (level, rest) = rest.split_once(' ')?;
        let (component, msg) = rest.split_once(": ")?;
        let ok_ts = ts.len() == 24
            && ts.ends_with('Z')
            && ts.as_bytes()[10] == b'T'
            && ts.as_bytes()[19] == b'.';
        let ok_component = component
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b == b'_');
        (ok_ts && ok_component).then_some((ts, Level::parse(level)?, component, msg))
    }

    #[test]
    fn a_line_has_timestamp_level_component_message() {
        let mut out = Vec::new();
        let cache = SecondCache::new();
        format_line(
            &mut out,
            1_798_761_600_042,
            &cache,
            Level::Warn,
            "shard",
            format_args!("accept failed: {}", "EMFILE"),
        );
        let line = String::from_utf8(out).unwrap();
        assert_eq!(
            line,
            "2027-01-01T00:00:00.042Z warn shard: accept failed: EMFILE\n"
        );
        assert_eq!(
            parse(line.trim_end()),
            Some((
                "2027-01-01T00:00:00.042Z",
                Level::Warn,
                "shard",
                "accept failed: EMFILE"
            ))
        );
    }

    #[test]
    fn levels_parse_and_order() {
        for l in Level::ALL {
            assert_eq!(Level::parse(l.as_str()), Some(l));
        }
        assert_eq!(Level::parse("trace"), None);
        assert!(Level::Error < Level::Debug);
    }

    #[test]
    fn a_limiter_admits_its_burst_then_hands_the_count_to_the_next_line() {
        let l = Limiter::default();
        let t = 5_000_000;
        for _ in 0..BURST {
            assert_eq!(l.admit(t), Some(0));
        }
        assert_eq!(l.admit(t + 1), None);
        assert_eq!(l.admit(t + 999), None);
        assert_eq!(l.admit(t + 1000), Some(2));
        assert_eq!(l.admit(t + 1001), Some(0));
        assert_eq!(l.suppressed_total.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn a_site_writes_its_burst_then_counts() {
        static SITE: Site = Site::new(Level::Error, "test");
        for _ in 0..BURST + 5 {
            SITE.emit(format_args!("x"));
        }
        // Within one second (the test may straddle a boundary: then the
        // second window holds the rest and nothing was suppressed yet).
        let lines = SITE.lines.load(Ordering::Relaxed);
        let suppressed = SITE.suppressed.load(Ordering::Relaxed);
        assert!(lines <= BURST + 5);
        assert_eq!(suppressed, lines.saturating_sub(BURST));
        // A new window reports and resets.
        SITE.roll(SITE.window.load(Ordering::Relaxed) + 1);
        assert_eq!(SITE.suppressed.load(Ordering::Relaxed), 0);
        assert_eq!(SITE.lines.load(Ordering::Relaxed), 0);
    }
}
