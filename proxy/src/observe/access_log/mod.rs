//! The access log: one line per request, formatted by the shard into a reused buffer, queued in a bounded per-shard ring and written by one writer thread, so a request never waits for the disk.
//!
//! The request path fills a [`Record`] (plain scalars, kept in the
//! connection) and, once the response is written, calls [`ShardLog::emit`]
//! with the request's method, path and query. The line is formatted into the
//! shard's preallocated line buffer and copied into the shard's [`Ring`]; a
//! line that does not fit is dropped and counted
//! (`zgix_access_log_dropped_total`), never waited for. The writer thread
//! drains every ring at least every [`FLUSH_EVERY`], sooner when a ring is
//! half full, and reopens the file when asked ([`AccessLog::reopen`], on
//! SIGUSR1) so rotation works the way it does for nginx.

mod fields;
mod format;
mod ring;

use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::{JoinHandle, Thread};
use std::time::Duration;

use zgix_config::AccessLogFormat;
use zgix_parser::Version;

pub use fields::{write_fields, Captured, Fields};
pub use format::{write_line, ESCAPE_GROWTH, LINE_OVERHEAD};
pub use ring::Ring;

use crate::observe::clock::SecondCache;
use crate::observe::decision::Decision;
use crate::observe::metrics::ShardCounters;

/// Lines the writer thread could not write (a full disk, `/dev/full`),
/// added to `zgix_access_log_dropped_total`; process-wide, never reset.
pub static WRITE_DROPPED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn bytecount(b: &[u8]) -> u64 {
    b.iter().filter(|&&c| c == b'\n').count() as u64
}

/// Longest a line waits in a ring when traffic is light.
pub const FLUSH_EVERY: Duration = Duration::from_millis(50);

/// What a line names by index, answered by the runtime above: the access
/// log knows listeners, filter rules and endpoints only by their indices.
pub trait Names {
    /// Whether `listener`'s requests are logged (`listeners[].access_log`).
    fn logs(&self, listener: usize) -> bool;
    /// The `listener` field: the listener's name.
    fn listener_name(&self, listener: usize) -> Option<&str>;
    /// The name of request filter rule `rule` of `listener`, if it has one.
    fn filter_name(&self, listener: usize, rule: u16) -> Option<&str>;
    /// The `upstream` field: endpoint slot `ep`'s address.
    fn endpoint(&self, ep: usize) -> Option<SocketAddr>;
}

/// A request's log fields other than its text, filled along the request path.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Record {
    /// Wall clock (ms since the epoch) when the request's head was complete.
    pub start_unix_ms: u64,
    /// The client identity's address (after a PROXY header, if any).
    pub client: IpAddr,
    /// The TCP peer.
    pub peer: SocketAddr,
    /// Index into `Runtime::listeners`.
    pub listener: usize,
    /// `None` when the request line was not understood.
    pub version: Option<Version>,
    /// The request came as an HTTP/2 stream: its protocol is logged as
    /// `HTTP/2.0` (`version` is that of its HTTP/1.1 rendering).
    pub h2: bool,
    pub status: u16,
    /// Request bytes read from the client (head and body).
    pub bytes_in: u64,
    /// Response bytes written to the client (head and body).
    pub bytes_out: u64,
    /// From the complete head to the last response byte written.
    pub duration_us: u64,
    /// Index into `Runtime::endpoints`; `None` when not forwarded.
    pub upstream: Option<usize>,
    /// From the upstream request written to the response head read.
    pub upstream_us: Option<u64>,
    /// Upstream attempts after the first.
    pub retries: u32,
    pub decision: Decision,
    /// What the TLS handshake settled; `None` on a plaintext listener.
    pub tls: Option<TlsFacts>,
    /// `X-Request-ID` (`listeners[].http.request_id`); empty when off or
    /// before the head was read.
    pub request_id: crate::observe::request_id::RequestId,
}

/// The TLS fields of an access-log line (the SNI rides in [`Target`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TlsFacts {
    /// `TLSv1.2` or `TLSv1.3`.
    pub version: &'static str,
    /// The cipher suite's IANA name.
    pub cipher: &'static str,
    /// The session was resumed from a ticket.
    pub resumed: bool,
}

impl Record {
    /// The protocol the access log shows: `HTTP/2.0` for a stream, else
    /// the request line's version; `None` when it was not understood.
    pub fn protocol(&self) -> Option<&'static str> {
        match (self.h2, self.version) {
            (true, _) => Some("HTTP/2.0"),
            (false, v) => v.map(|v| v.as_str()),
        }
    }

    /// A record for a request on `listener` from `client` via `peer`, at the
    /// start of its life: the request path overwrites the rest as it learns it.
    pub fn new(listener: usize, client: IpAddr, peer: SocketAddr) -> Record {
        Record {
            start_unix_ms: crate::observe::clock::unix_ms(),
            client,
            peer,
            listener,
            version: None,
            h2: false,
            status: 0,
            bytes_in: 0,
            bytes_out: 0,
            duration_us: 0,
            upstream: None,
            upstream_us: None,
            retries: 0,
            tls: None,
            decision: Decision::Forwarded,
            request_id: Default::default(),
        }
    }
}

/// The request's text, borrowed from the connection's buffer at emit time.
#[derive(Clone, Copy, Debug, Default)]
pub struct Target<'a> {
    /// Empty when the request line was not understood.
    pub method: &'a [u8],
    /// The canonical path (dot-segments removed, slashes merged).
    pub path: &'a [u8],
    /// The raw query, without `?`.
    pub query: Option<&'a [u8]>,
    /// The ClientHello's SNI, on a TLS listener.
    pub sni: Option<&'a [u8]>,
}

enum Output {
    Stdout,
    File(File),
}

/// Opens `path` as zgix would at start (creating it, for appending), for
/// `--check`: a log file zgix could not open makes the configuration invalid.
pub fn check_path(path: &str) -> Result<(), String> {
    Output::open(path)
        .map(drop)
        .map_err(|e| format!("cannot open {path} for appending: {e}"))
}

impl Output {
    fn open(path: &str) -> std::io::Result<Output> {
        if path == "-" {
            return Ok(Output::Stdout);
        }
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map(Output::File)
    }

    fn write(&mut self, a: &[u8], b: &[u8]) -> std::io::Result<()> {
        match self {
            Output::Stdout => {
                let mut out = std::io::stdout().lock();
                out.write_all(a)?;
                out.write_all(b)?;
                out.flush()
            }
            Output::File(f) => {
                f.write_all(a)?;
                f.write_all(b)
            }
        }
    }
}

struct Shared {
    path: String,
    format: AccessLogFormat,
    query: bool,
    /// `access_log.fields`, compiled; `None`: the default line.
    fields: Option<Fields>,
    rings: Vec<Arc<Ring>>,
    reopen: AtomicBool,
    stop: AtomicBool,
    /// Set by a shard that woke the writer; cleared after each drain.
    woken: AtomicBool,
    writer: OnceLock<Thread>,
}

impl Shared {
    fn wake(&self) {
        if !self.woken.swap(true, Ordering::Relaxed) {
            if let Some(t) = self.writer.get() {
                t.unpark();
            }
        }
    }
}

/// The process's access log: the rings and the writer thread.
pub struct AccessLog {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl AccessLog {
    /// Opens the log (failing at start-up, not later, if the file cannot be
    /// opened) and starts the writer thread for `shards` rings.
    pub fn start(cfg: &zgix_config::AccessLog, shards: usize) -> Result<AccessLog, String> {
        let fields = cfg.fields.as_deref().map(Fields::compile).transpose()?;
        let out = Output::open(&cfg.path)
            .map_err(|e| format!("access_log.path: cannot open {}: {e}", cfg.path))?;
        let shared = Arc::new(Shared {
            path: cfg.path.clone(),
            format: cfg.format,
            query: cfg.query,
            fields,
            rings: (0..shards)
                .map(|_| Arc::new(Ring::new(cfg.buffer_bytes)))
                .collect(),
            reopen: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            woken: AtomicBool::new(false),
            writer: OnceLock::new(),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("zgix-access-log".into())
            .spawn(move || writer(&s, out))
            .map_err(|e| format!("cannot start the access log writer: {e}"))?;
        let _ = shared.writer.set(thread.thread().clone());
        Ok(AccessLog {
            shared,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Shard `id`'s handle; `max_request_line` sizes its line buffer so that
    /// formatting never grows it.
    pub fn shard(
        &self,
        id: usize,
        counters: Arc<ShardCounters>,
        max_request_line: usize,
    ) -> ShardLog {
        // A field list may hold the request line twice (`request`, and
        // `method` `path` `query`) and captured headers.
        let extra = self
            .shared
            .fields
            .as_ref()
            .map_or(0, |f| f.room() + max_request_line * ESCAPE_GROWTH);
        ShardLog {
            shared: self.shared.clone(),
            ring: self.shared.rings[id].clone(),
            line: std::cell::RefCell::new(Vec::with_capacity(
                max_request_line * ESCAPE_GROWTH + LINE_OVERHEAD + extra,
            )),
            cache: SecondCache::new(),
            counters,
        }
    }

    /// Asks the writer to reopen the file (log rotation); the SIGUSR1 handler
    /// calls it. Lines keep flowing to the old file until the reopen succeeds.
    pub fn reopen(&self) {
        self.shared.reopen.store(true, Ordering::Relaxed);
        if let Some(t) = self.shared.writer.get() {
            t.unpark();
        }
    }

    /// Writes what the rings hold and stops the writer (after the shards stopped).
    pub fn stop(&self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.shared.writer.get() {
            t.unpark();
        }
        let handle = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(h) = handle {
            let _ = h.join();
        }
    }
}

fn writer(s: &Shared, mut out: Output) {
    loop {
        let stopping = s.stop.load(Ordering::Acquire);
        if s.reopen.swap(false, Ordering::Relaxed) {
            match Output::open(&s.path) {
                Ok(o) => {
                    out = o;
                    crate::log_info!("access_log", "reopened {}", s.path);
                }
                Err(e) => crate::log_error!(
                    "access_log",
                    "cannot reopen {}: {e}; still writing to the file open before",
                    s.path
                ),
            }
        }
        for ring in &s.rings {
            ring.drain(|a, b| {
                if let Err(e) = out.write(a, b) {
                    // Every line of the chunk is lost (a short write may have
                    // kept part of one: counted as lost too).
                    let lines = bytecount(a) + bytecount(b);
                    WRITE_DROPPED.fetch_add(lines, Ordering::Relaxed);
                    crate::log_error!("access_log", "cannot write {}: {e}", s.path);
                }
            });
        }
        s.woken.store(false, Ordering::Relaxed);
        if stopping {
            return;
        }
        std::thread::park_timeout(FLUSH_EVERY);
    }
}

/// One shard's side of the access log. Shard-local (not `Sync`).
pub struct ShardLog {
    shared: Arc<Shared>,
    ring: Arc<Ring>,
    line: std::cell::RefCell<Vec<u8>>,
    cache: SecondCache,
    counters: Arc<ShardCounters>,
}

impl ShardLog {
    /// Whether `listener` logs at all (`listeners[].access_log`); the request
    /// path may skip filling a record when it does not.
    #[inline]
    pub fn wants(&self, rt: &dyn Names, listener: usize) -> bool {
        rt.logs(listener)
    }

    /// The request headers `access_log.fields` asks for (lowercase), for
    /// [`Captured::capture`]; empty for the default line.
    pub fn captures(&self) -> &[Box<[u8]>] {
        self.shared.fields.as_ref().map_or(&[], |f| f.headers())
    }

    /// [`ShardLog::emit_with`] for a request whose headers are not at hand.
    pub fn emit(&self, rt: &dyn Names, r: &Record, t: &Target<'_>) {
        static NONE: Captured = Captured::new();
        self.emit_with(rt, r, t, &NONE)
    }

    /// Formats and queues one line; drops and counts it when the ring is
    /// full. Allocation-free: the line buffer is sized for the longest line.
    pub fn emit_with(&self, rt: &dyn Names, r: &Record, t: &Target<'_>, c: &Captured) {
        if !self.wants(rt, r.listener) {
            return;
        }
        let Ok(mut line) = self.line.try_borrow_mut() else {
            return;
        };
        line.clear();
        let s = &self.shared;
        match &s.fields {
            None => write_line(&mut line, s.format, s.query, rt, &self.cache, r, t),
            Some(f) => write_fields(&mut line, s.format, s.query, f, rt, &self.cache, (r, t, c)),
        }
        if self.ring.push(&line) {
            self.counters.access_log_lines.inc();
            if self.ring.len() * 2 > self.ring.capacity() {
                s.wake();
            }
        } else {
            self.counters.access_log_dropped.inc();
        }
    }
}

#[cfg(test)]
mod tests;
