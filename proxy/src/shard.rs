//! A shard: one pinned glommio executor owning its listeners, connections, upstream pool and counters.

use std::cell::{Cell, RefCell};
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use futures_lite::future::or;
use glommio::net::TcpListener;
use glommio::sync::{Gate, Semaphore};
use hdrhistogram::Histogram;
use zgix_parser::{RequestParser, ResponseParser};

use crate::io::Poller;
use crate::metrics::{new_latency_histogram, ShardCounters};
use crate::pool::Pool;
use crate::runtime::Runtime;

/// Locked memory each shard's executor asks for (glommio's registered buffer
/// area). zgix does no file I/O, so it needs little; the floor glommio accepts
/// is 64 KiB. With an 8 MiB `RLIMIT_MEMLOCK` this leaves room for many shards.
pub const IO_MEMORY: usize = 256 << 10;

/// How often a shard checks the drain flag, sweeps its pool and publishes latency.
const TICK: Duration = Duration::from_millis(100);

/// Everything one shard owns. Shared by its tasks through `Rc`: never sent to
/// another thread.
pub struct Shard {
    pub id: usize,
    pub rt: Arc<Runtime>,
    pub counters: Arc<ShardCounters>,
    /// Per-listener latency, folded into `Metrics::latency` by the tick task.
    pub latency: RefCell<Vec<Histogram<u64>>>,
    pub pool: Pool,
    /// Round-robin cursor per cluster.
    pub rr: Vec<Cell<usize>>,
    pub draining: Cell<bool>,
    /// Never holds permits: closing it wakes every task waiting on it (drain).
    pub shutdown: Semaphore,
    /// Every connection task passes through it, so a drain can wait for them.
    pub gate: Gate,
    pub req_parser: RequestParser,
    pub resp_parser: ResponseParser,
    /// Readiness for every client and upstream socket of this shard.
    pub poller: Rc<Poller>,
}

/// What a shard reports once its sockets are bound (or why it could not).
pub type BindReport = Result<(Vec<SocketAddr>, Option<SocketAddr>), String>;

impl Shard {
    fn new(id: usize, rt: Arc<Runtime>, poller: Rc<Poller>) -> Shard {
        let l = &rt.config.limits;
        Shard {
            id,
            counters: rt.metrics.shards[id].clone(),
            latency: RefCell::new(
                (0..rt.listeners.len())
                    .map(|_| new_latency_histogram())
                    .collect(),
            ),
            pool: Pool::new(
                rt.endpoints.len(),
                l.upstream_pool_idle_per_endpoint,
                rt.timeouts.upstream_idle,
            ),
            rr: rt.clusters.iter().map(|_| Cell::new(id)).collect(),
            draining: Cell::new(false),
            shutdown: Semaphore::new(0),
            gate: Gate::new(),
            req_parser: RequestParser::new(rt.request_limits),
            resp_parser: ResponseParser::new(
                l.max_response_header_bytes,
                rt.response_max_headers(),
            ),
            poller,
            rt,
        }
    }

    /// Moves this shard's recorded latency into the shared registry.
    fn publish_latency(&self) {
        let mut local = self.latency.borrow_mut();
        let mut shared = self.rt.metrics.latency[self.id]
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        for (l, s) in local.iter_mut().zip(shared.iter_mut()) {
            if !l.is_empty() {
                let _ = s.add(&*l);
                l.reset();
            }
        }
    }
}

/// Whether `ZGIX_DEBUG` asked for client-triggered events to be logged.
pub fn debug_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("ZGIX_DEBUG").is_some())
}

/// The body of a shard's executor: bind, report, serve until drained.
pub async fn run(
    id: usize,
    rt: Arc<Runtime>,
    binds: Vec<SocketAddr>,
    admin: Option<SocketAddr>,
    report: std::sync::mpsc::Sender<BindReport>,
) {
    let spin = Duration::from_micros(rt.config.limits.busy_poll_us);
    let poller = match Poller::new(spin) {
        Ok(p) => p,
        Err(e) => {
            let _ = report.send(Err(format!("shard {id}: cannot create its epoll set: {e}")));
            return;
        }
    };
    let shard = Rc::new(Shard::new(id, rt.clone(), poller.clone()));
    let poller_task = glommio::spawn_local(poller.clone().run());
    let mut listeners = Vec::with_capacity(binds.len());
    let mut bound = Vec::with_capacity(binds.len());
    for (i, addr) in binds.iter().enumerate() {
        match crate::io::bind_listener(*addr) {
            Ok(l) => {
                bound.push(l.0.local_addr().unwrap_or(*addr));
                listeners.push(l);
            }
            Err(e) => {
                let _ = report.send(Err(format!("listeners[{i}]: cannot bind {addr}: {e}")));
                return;
            }
        }
    }
    let admin_listener = match admin {
        Some(addr) => match crate::io::bind_listener(addr) {
            Ok(l) => Some(l),
            Err(e) => {
                let _ = report.send(Err(format!("admin: cannot bind {addr}: {e}")));
                return;
            }
        },
        None => None,
    };
    let admin_bound = admin_listener
        .as_ref()
        .map(|l| l.0.local_addr().expect("bound listener has an address"));
    let _ = report.send(Ok((bound, admin_bound)));

    for (li, listener) in listeners.into_iter().enumerate() {
        glommio::spawn_local(accept_loop(shard.clone(), li, listener)).detach();
    }
    if let Some(l) = admin_listener {
        glommio::spawn_local(crate::admin::serve(shard.clone(), l)).detach();
    }
    glommio::spawn_local(tick(shard.clone())).detach();

    // Wait for the drain: the semaphore never has permits, closing it wakes us.
    let _ = shard.shutdown.acquire(1).await;
    shard.pool.clear();
    let _ = glommio::timer::timeout(rt.timeouts.drain, async {
        let _ = shard.gate.close().await;
        Ok(())
    })
    .await;
    shard.publish_latency();
    poller.stop();
    poller_task.await;
}

async fn accept_loop(shard: Rc<Shard>, li: usize, (listener, fd): (TcpListener, RawFd)) {
    // Wakes a shard parked in epoll_wait when a connection arrives (dropped
    // before the listener).
    let _watch = watch(&shard, fd);
    loop {
        let accepted = or(async { Some(listener.accept().await) }, async {
            let _ = shard.shutdown.acquire(1).await;
            None
        })
        .await;
        match accepted {
            None => break,
            Some(Ok(stream)) => {
                let peer = match stream.peer_addr() {
                    Ok(p) => p,
                    Err(_) => continue,
                };
                let task = shard
                    .gate
                    .spawn(crate::conn::serve(shard.clone(), li, stream, peer));
                if let Ok(task) = task {
                    task.detach();
                }
            }
            Some(Err(e)) => {
                crate::conn::log_debug(format_args!("accept failed: {e}"));
                // Out of descriptors or memory: back off instead of spinning.
                glommio::timer::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    // Dropping the listener closes this shard's socket; others may still accept
    // until their own tick notices the drain.
}

/// Puts a listener in the shard's poller set; see `Poller::watch_listener`.
pub fn watch(shard: &Shard, fd: RawFd) -> Option<crate::io::ListenerWatch> {
    match shard.poller.watch_listener(fd) {
        Ok(w) => Some(w),
        Err(e) => {
            // Only latency suffers: accepts then wait for glommio's next turn.
            crate::conn::log_debug(format_args!("cannot watch listener: {e}"));
            None
        }
    }
}

async fn tick(shard: Rc<Shard>) {
    let mut n = 0u64;
    loop {
        glommio::timer::sleep(TICK).await;
        if shard.rt.draining.load(Ordering::Relaxed) && !shard.draining.get() {
            shard.draining.set(true);
            shard.shutdown.close();
        }
        shard
            .counters
            .heap_allocations
            .store(crate::alloc::thread_allocations(), Ordering::Relaxed);
        n += 1;
        if n.is_multiple_of(10) {
            shard.pool.sweep(Instant::now());
            shard.publish_latency();
        }
    }
}
