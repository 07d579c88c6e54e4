//! Counters of the connection engine (driver, accepts, tunnels), kept per shard and rendered into `/metrics`.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

use crate::observe::counter::Counter;

/// The errno values accept failures are counted under; the rest is `other`.
const ACCEPT_ERRNOS: [(i32, &str); 5] = [
    (libc::EMFILE, "EMFILE"),
    (libc::ENFILE, "ENFILE"),
    (libc::ENOBUFS, "ENOBUFS"),
    (libc::ENOMEM, "ENOMEM"),
    (0, "other"),
];

/// One shard's engine counters. Written by that shard only.
#[derive(Default)]
pub struct EngineCounters {
    /// 1 = uring, 2 = epoll (0 before the shard started).
    driver: AtomicU8,
    pub accept_pauses: Counter,
    accept_errors: [Counter; ACCEPT_ERRNOS.len()],
    pub tunnels_opened: Counter,
    pub tunnels_active: AtomicU64,
    pub tunnel_bytes_up: Counter,
    pub tunnel_bytes_down: Counter,
    /// Copied from the driver's own stats by the shard tick.
    pub driver_enters: AtomicU64,
    pub accept_stalls: AtomicU64,
    pub recv_rearm_nobufs: AtomicU64,
    pub recv_paused: AtomicU64,
    pub cq_overflows: AtomicU64,
    pub sends_waited: AtomicU64,
    pub backstop_parks: AtomicU64,
    pub buffers_held: AtomicU64,
    /// Body and tunnel bytes on the bulk path (`conn/bulk.rs`).
    pub relayed_bytes: AtomicU64,
    pub spliced_bytes: AtomicU64,
    /// Bulk relays that found no free pipe, and the pipes out now.
    pub splice_fallbacks: AtomicU64,
    pub pipes_out: AtomicU64,
    /// Gathered sends (a re-encoded chunked upload's framing and data in
    /// one `sendmsg`) and their data bytes sent without a copy.
    pub gathered_sends: AtomicU64,
    pub gathered_bytes: AtomicU64,
    /// Request states pooled and in use (copied by the shard tick).
    pub exchanges_pooled: AtomicU64,
    pub exchanges_out: AtomicU64,
    /// Request states that could not be made (a buffer could not be
    /// mapped): each refused one connection with a 503.
    pub request_state_refused: Counter,
    /// The shard thread's live heap bytes (counting allocator).
    pub heap_live_bytes: AtomicU64,
}

impl EngineCounters {
    /// Records the driver by its name (`uring` or `epoll`).
    pub fn set_driver(&self, name: &str) {
        let v = match name {
            "uring" => 1,
            "epoll" => 2,
            _ => 0,
        };
        self.driver.store(v, Ordering::Relaxed);
    }

    pub fn driver_name(&self) -> &'static str {
        match self.driver.load(Ordering::Relaxed) {
            1 => "uring",
            2 => "epoll",
            _ => "none",
        }
    }

    pub fn accept_error(&self, errno: i32) {
        let i = ACCEPT_ERRNOS
            .iter()
            .position(|&(e, _)| e == errno)
            .unwrap_or(ACCEPT_ERRNOS.len() - 1);
        self.accept_errors[i].inc();
    }
}

/// Renders every shard's engine counters, summed over shards (the driver
/// info per shard).
pub fn render<'a>(o: &mut String, shards: impl Iterator<Item = &'a EngineCounters> + Clone) {
    let sum = |f: &dyn Fn(&EngineCounters) -> u64| shards.clone().map(f).sum::<u64>();
    let _ = writeln!(
        o,
        "# HELP zgix_io_driver_info The socket driver each shard runs on.\n# TYPE zgix_io_driver_info gauge"
    );
    for (i, s) in shards.clone().enumerate() {
        let name = s.driver_name();
        let _ = writeln!(
            o,
            "zgix_io_driver_info{{shard=\"{i}\",driver=\"{name}\"}} 1"
        );
    }
    render_accepts(o, shards.clone());
    counter(
        o,
        "zgix_tunnels_total",
        "Upgrade tunnels opened (101 from the origin).",
        sum(&|s| s.tunnels_opened.get()),
    );
    gauge(
        o,
        "zgix_tunnels_active",
        "Upgrade tunnels open now.",
        sum(&|s| s.tunnels_active.load(Ordering::Relaxed)),
    );
    let _ = writeln!(
        o,
        "# HELP zgix_tunnel_bytes_total Bytes relayed through upgrade tunnels.\n# TYPE zgix_tunnel_bytes_total counter\nzgix_tunnel_bytes_total{{direction=\"up\"}} {}\nzgix_tunnel_bytes_total{{direction=\"down\"}} {}",
        sum(&|s| s.tunnel_bytes_up.get()),
        sum(&|s| s.tunnel_bytes_down.get())
    );
    counter(
        o,
        "zgix_io_enters_total",
        "Times the shards' drivers entered the kernel to submit, reap or sleep.",
        sum(&|s| s.driver_enters.load(Ordering::Relaxed)),
    );
    counter(
        o,
        "zgix_io_recv_nobufs_total",
        "Multishot receives that ended because the provided-buffer ring was empty.",
        sum(&|s| s.recv_rearm_nobufs.load(Ordering::Relaxed)),
    );
    counter(
        o,
        "zgix_io_recv_paused_total",
        "Receives paused because a socket had too many unread buffers (backpressure).",
        sum(&|s| s.recv_paused.load(Ordering::Relaxed)),
    );
    counter(
        o,
        "zgix_io_cq_overflows_total",
        "Turns that found the completion queue had overflowed (no completion is lost).",
        sum(&|s| s.cq_overflows.load(Ordering::Relaxed)),
    );
    counter(
        o,
        "zgix_io_sends_waited_total",
        "Sends that found the socket's buffer full and waited for room (uring).",
        sum(&|s| s.sends_waited.load(Ordering::Relaxed)),
    );
    counter(
        o,
        "zgix_io_backstop_parks_total",
        "Parks that slept until the 1 ms inline-send backstop with no other event (uring).",
        sum(&|s| s.backstop_parks.load(Ordering::Relaxed)),
    );
    render_bulk(o, shards.clone());
    gauge(
        o,
        "zgix_heap_live_bytes",
        "Heap bytes the shard threads hold (allocated minus freed, by the counting allocator).",
        sum(&|s| s.heap_live_bytes.load(Ordering::Relaxed)),
    );
    gauge(
        o,
        "zgix_heap_in_use_bytes",
        "Heap bytes in use by the whole process, every thread (the C allocator's own count, mallinfo2).",
        heap_in_use_bytes(),
    );
    gauge(
        o,
        "zgix_exchanges_pooled",
        "Request states (buffers, parsed heads) kept for reuse.",
        sum(&|s| s.exchanges_pooled.load(Ordering::Relaxed)),
    );
    gauge(
        o,
        "zgix_exchanges_in_use",
        "Request states held by requests in progress.",
        sum(&|s| s.exchanges_out.load(Ordering::Relaxed)),
    );
    counter(
        o,
        "zgix_request_state_refused_total",
        "Request states that could not be made (a buffer could not be mapped): each connection was answered 503 and closed.",
        sum(&|s| s.request_state_refused.get()),
    );
    gauge(
        o,
        "zgix_io_buffers_held",
        "Provided receive buffers holding unread bytes.",
        sum(&|s| s.buffers_held.load(Ordering::Relaxed)),
    );
}

/// Bytes the process's heap holds in use, all threads and arenas: glibc's
/// `mallinfo2` (`uordblks`, small blocks, plus `hblkhd`, blocks of their own
/// mapping). Unlike `zgix_heap_live_bytes` it stays right when one thread frees
/// what another allocated (a runtime built on the main thread and retired on a
/// shard). It takes every arena's lock, so it is read at scrape time only.
fn heap_in_use_bytes() -> u64 {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo2 only reads the allocator's statistics.
        let m = unsafe { libc::mallinfo2() };
        (m.uordblks + m.hblkhd) as u64
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        0
    }
}

/// The accept series: pauses at the cap, stalls the watchdog restarted,
/// failures by errno, each summed over the shards.
fn render_accepts<'a>(o: &mut String, shards: impl Iterator<Item = &'a EngineCounters> + Clone) {
    let sum = |f: &dyn Fn(&EngineCounters) -> u64| shards.clone().map(f).sum::<u64>();
    counter(
        o,
        "zgix_accept_pauses_total",
        "Times a shard stopped accepting at its share of limits.max_connections.",
        sum(&|s| s.accept_pauses.get()),
    );
    counter(
        o,
        "zgix_accept_stalls_total",
        "Listeners found waiting with connections in the backlog and none taken for a second, and restarted (0 unless an accept was lost).",
        sum(&|s| s.accept_stalls.load(Ordering::Relaxed)),
    );
    let _ = writeln!(
        o,
        "# HELP zgix_accept_errors_total Accept failures by errno.\n# TYPE zgix_accept_errors_total counter"
    );
    for (i, (_, name)) in ACCEPT_ERRNOS.iter().enumerate() {
        let v = sum(&|s| s.accept_errors[i].get());
        let _ = writeln!(o, "zgix_accept_errors_total{{errno=\"{name}\"}} {v}");
    }
}

/// The bulk path's series (`conn/bulk.rs`): bytes relayed and spliced,
/// relays that found no pipe, and the pipes out now.
fn render_bulk<'a>(o: &mut String, shards: impl Iterator<Item = &'a EngineCounters> + Clone) {
    let sum = |f: &dyn Fn(&EngineCounters) -> u64| shards.clone().map(f).sum::<u64>();
    counter(
        o,
        "zgix_io_relayed_bytes_total",
        "Body and tunnel bytes sent on as the received buffers themselves, without a copy (uring bulk path).",
        sum(&|s| s.relayed_bytes.load(Ordering::Relaxed)),
    );
    counter(
        o,
        "zgix_io_spliced_bytes_total",
        "Body and tunnel bytes moved socket to socket through a pipe with splice (bulk path).",
        sum(&|s| s.spliced_bytes.load(Ordering::Relaxed)),
    );
    counter(
        o,
        "zgix_io_splice_fallbacks_total",
        "Bulk relays that found the shard's pipes all out (or pipe2 refused) and ran without one.",
        sum(&|s| s.splice_fallbacks.load(Ordering::Relaxed)),
    );
    gauge(
        o,
        "zgix_io_pipes_out",
        "Splice pipes the bulk path holds now (at most 256 per shard).",
        sum(&|s| s.pipes_out.load(Ordering::Relaxed)),
    );
    counter(
        o,
        "zgix_io_gathered_sends_total",
        "Vectored sends (sendmsg) of re-encoded chunked request bodies: zgix's framing and the client's data in one gather list.",
        sum(&|s| s.gathered_sends.load(Ordering::Relaxed)),
    );
    counter(
        o,
        "zgix_io_gathered_bytes_total",
        "Chunk-data bytes those vectored sends took from the client's receive buffer, without a copy in user space.",
        sum(&|s| s.gathered_bytes.load(Ordering::Relaxed)),
    );
}

/// One counter series with its HELP and TYPE lines.
fn counter(o: &mut String, name: &str, help: &str, v: u64) {
    let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
}

/// One gauge series with its HELP and TYPE lines.
fn gauge(o: &mut String, name: &str, help: &str, v: u64) {
    let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
}
