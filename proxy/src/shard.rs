//! A shard: one pinned glommio executor owning its listeners, connections, upstream pool and counters.

use std::cell::{Cell, RefCell};
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_lite::future::or;
use glommio::sync::{Gate, Semaphore};
use zgix_parser::{RequestParser, ResponseParser};

use crate::io::{Driver, Listener, Notifier};
use crate::metrics::ShardCounters;
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
    pub pool: Pool,
    /// Endpoint choice per cluster (weights, least_conn, rendezvous).
    pub balancer: crate::lb::Balancer,
    /// This shard's per-endpoint counters.
    pub up: Arc<crate::upstream_metrics::ShardUpstream>,
    /// Resolver generations seen, so moved endpoints' pooled connections go.
    pub seen: crate::resolve::SeenGenerations,
    /// This shard's access-log ring, when the access log is on.
    pub access_log: Option<crate::access_log::ShardLog>,
    pub draining: Cell<bool>,
    /// Never holds permits: closing it wakes every task waiting on it (drain).
    pub shutdown: Semaphore,
    /// Every connection task passes through it, so a drain can wait for them.
    pub gate: Gate,
    pub req_parser: RequestParser,
    pub resp_parser: ResponseParser,
    /// The socket driver every client, upstream and listening socket of
    /// this shard (and every timer) runs on.
    pub driver: Rc<Driver>,
    /// Client connections open on this shard, and its share of
    /// `limits.max_connections`.
    pub open_connections: Cell<usize>,
    pub max_connections: usize,
    /// The most connections open since the last memory trim.
    pub connections_high: Cell<usize>,
    /// Accept loops paused at the cap wait here for a connection to close.
    pub capacity_waiters: RefCell<Vec<std::task::Waker>>,
    /// Request states kept for reuse (see `conn::Exchange`), how many are
    /// out now, and the most out at once since the last tick trimmed the pool.
    pub exchanges: RefCell<Vec<Box<crate::conn::Exchange>>>,
    pub exchanges_out: Cell<usize>,
    /// Blocks the request-handling futures run in (see `conn::slab`).
    pub request_futures: crate::conn::slab::FutureSlab,
    pub exchanges_peak: Cell<usize>,
}

/// What a shard reports once its sockets are bound (or why it could not):
/// listener addresses, the admin address, and the handle that wakes it.
pub type BindReport = Result<(Vec<SocketAddr>, Option<SocketAddr>, Arc<Notifier>), String>;

impl Shard {
    fn new(id: usize, rt: Arc<Runtime>, driver: Rc<Driver>, max_connections: usize) -> Shard {
        let l = &rt.config.limits;
        Shard {
            id,
            counters: rt.metrics.shards[id].clone(),
            pool: Pool::new(
                rt.endpoints.len(),
                l.upstream_pool_idle_per_endpoint,
                rt.timeouts.upstream_pool_idle,
            ),
            balancer: crate::lb::Balancer::new(&rt, id),
            up: rt.upstream_stats.shards[id].clone(),
            seen: crate::resolve::SeenGenerations::new(&rt),
            access_log: rt
                .access_log
                .as_ref()
                .map(|a| a.shard(id, rt.metrics.shards[id].clone(), l.max_request_line)),
            draining: Cell::new(false),
            shutdown: Semaphore::new(0),
            gate: Gate::new(),
            req_parser: RequestParser::new(rt.request_limits),
            resp_parser: ResponseParser::new(
                l.max_response_header_bytes,
                rt.response_max_headers(),
            ),
            driver,
            open_connections: Cell::new(0),
            max_connections,
            connections_high: Cell::new(0),
            capacity_waiters: RefCell::new(Vec::new()),
            exchanges: RefCell::new(Vec::with_capacity(rt.config.io.idle_exchanges)),
            exchanges_out: Cell::new(0),
            request_futures: Default::default(),
            exchanges_peak: Cell::new(0),
            rt,
        }
    }

    /// A connection closed: wake an accept loop paused at the cap.
    pub fn connection_closed(&self) {
        self.open_connections.set(self.open_connections.get() - 1);
        for w in self.capacity_waiters.borrow_mut().drain(..) {
            w.wake();
        }
    }
}

/// The driver options a shard runs with, from the config.
pub fn driver_options(rt: &Runtime, shards: usize) -> crate::io::Options {
    let l = &rt.config.limits;
    let io = &rt.config.io;
    let per_shard = rt.max_connections.div_ceil(shards.max(1));
    let mut o = crate::io::Options::new(match io.driver {
        zgix_config::IoDriver::Uring => crate::io::Kind::Uring,
        zgix_config::IoDriver::Epoll => crate::io::Kind::Epoll,
    });
    o.spin = Duration::from_micros(l.busy_poll_us);
    o.recv_buffers = io.recv_buffers;
    o.recv_buffer_bytes = io.recv_buffer_bytes;
    // Two multishot receives per proxied connection (client, upstream) may
    // each have a completion waiting, plus the accepts.
    o.cq_entries = (per_shard.saturating_mul(2)).clamp(1024, 1 << 16) as u32;
    o
}

/// The body of a shard's executor: bind, report, serve until drained.
pub async fn run(
    id: usize,
    rt: Arc<Runtime>,
    binds: Vec<SocketAddr>,
    admin: Option<SocketAddr>,
    report: std::sync::mpsc::Sender<BindReport>,
) {
    let shards = rt.metrics.shards.len();
    let opts = driver_options(&rt, shards);
    let driver = match Driver::new_or_fallback(&opts) {
        Ok((d, None)) => d,
        Ok((d, Some(why))) => {
            if id == 0 {
                crate::log_warn!(
                    "io",
                    "io_uring refused ({why}); running on epoll. {}",
                    crate::io::uring::REFUSED_HINT
                );
            }
            d
        }
        Err(e) => {
            let _ = report.send(Err(format!(
                "shard {id}: cannot create its socket driver: {e}"
            )));
            return;
        }
    };
    rt.metrics.shards[id].engine.set_driver(driver.kind());
    let max_conns = rt.max_connections.div_ceil(shards.max(1)).max(1);
    let shard = Rc::new(Shard::new(id, rt.clone(), driver.clone(), max_conns));
    let driver_task = glommio::spawn_local(driver.clone().run());
    let mut listeners = Vec::with_capacity(binds.len());
    let mut bound = Vec::with_capacity(binds.len());
    for (i, addr) in binds.iter().enumerate() {
        match crate::io::bind_listener(*addr).and_then(|fd| Listener::from_fd(fd, &driver)) {
            Ok(l) => {
                bound.push(l.local_addr().unwrap_or(*addr));
                listeners.push(l);
            }
            Err(e) => {
                let _ = report.send(Err(format!("listeners[{i}]: cannot bind {addr}: {e}")));
                driver.stop();
                return;
            }
        }
    }
    let admin_listener = match admin {
        Some(addr) => {
            match crate::io::bind_listener(addr).and_then(|fd| Listener::from_fd(fd, &driver)) {
                Ok(l) => Some(l),
                Err(e) => {
                    let _ = report.send(Err(format!("admin: cannot bind {addr}: {e}")));
                    driver.stop();
                    return;
                }
            }
        }
        None => None,
    };
    let admin_bound = admin_listener.as_ref().and_then(|l| l.local_addr().ok());
    let _ = report.send(Ok((bound, admin_bound, driver.notifier())));

    for (li, listener) in listeners.into_iter().enumerate() {
        glommio::spawn_local(accept_loop(shard.clone(), li, listener)).detach();
    }
    if let Some(l) = admin_listener {
        glommio::spawn_local(crate::admin::serve(shard.clone(), l)).detach();
    }
    glommio::spawn_local(tick(shard.clone())).detach();
    if id == 0 && rt.clusters.iter().any(|c| c.active.is_some()) {
        // Active health checks run on one shard: an endpoint is probed once
        // per interval, not once per shard.
        glommio::spawn_local(crate::health::run_prober(rt.clone(), driver.clone())).detach();
    }
    glommio::spawn_local(watch_drain(shard.clone())).detach();

    // Wait for the drain: the semaphore never has permits, closing it wakes us.
    let _ = shard.shutdown.acquire(1).await;
    shard.pool.clear();
    let _ = driver
        .timeout(rt.timeouts.drain, async {
            let _ = shard.gate.close().await;
        })
        .await;
    driver.stop();
    driver_task.await;
}

/// Starts the drain when the main thread says so (it sets the flag, then
/// notifies every shard's driver).
async fn watch_drain(shard: Rc<Shard>) {
    loop {
        if shard.rt.draining.load(Ordering::Acquire) {
            begin_drain(&shard);
            return;
        }
        or(shard.driver.notified(), async {
            let _ = shard.shutdown.acquire(1).await;
        })
        .await;
        if shard.draining.get() {
            return;
        }
    }
}

fn begin_drain(shard: &Shard) {
    if !shard.draining.get() {
        shard.draining.set(true);
        shard.shutdown.close();
    }
}

/// Waits until this shard holds fewer connections than its cap.
async fn below_cap(shard: &Shard) {
    std::future::poll_fn(|cx| {
        if shard.open_connections.get() < shard.max_connections {
            return std::task::Poll::Ready(());
        }
        shard.capacity_waiters.borrow_mut().push(cx.waker().clone());
        std::task::Poll::Pending
    })
    .await
}

async fn accept_loop(shard: Rc<Shard>, li: usize, listener: Listener) {
    let counters = shard.counters.clone();
    let mut last_log: Option<Instant> = None;
    loop {
        if shard.open_connections.get() >= shard.max_connections {
            // At the cap: stop taking connections (the backlog holds them)
            // instead of accepting and refusing, or spinning on EMFILE.
            listener.pause();
            counters.engine.accept_pauses.inc();
            let now = shard.driver.now();
            if last_log.is_none_or(|t| now.duration_since(t) >= Duration::from_secs(1)) {
                last_log = Some(now);
                crate::log_warn!(
                    "shard",
                    "shard {} at its connection cap ({}); accepting paused",
                    shard.id,
                    shard.max_connections
                );
            }
            let resumed = or(
                async {
                    below_cap(&shard).await;
                    true
                },
                async {
                    let _ = shard.shutdown.acquire(1).await;
                    false
                },
            )
            .await;
            if !resumed {
                break;
            }
            listener.resume();
        }
        let accepted = or(async { Some(listener.accept().await) }, async {
            let _ = shard.shutdown.acquire(1).await;
            None
        })
        .await;
        match accepted {
            None => break,
            Some(Ok((sock, peer))) => {
                let open = shard.open_connections.get() + 1;
                shard.open_connections.set(open);
                if open > shard.connections_high.get() {
                    shard.connections_high.set(open);
                }
                let task = shard
                    .gate
                    .spawn(crate::conn::serve(shard.clone(), li, sock, peer));
                match task {
                    Ok(task) => {
                        task.detach();
                    }
                    Err(_) => shard.connection_closed(),
                }
            }
            Some(Err(e)) => {
                counters.engine.accept_error(e.raw_os_error().unwrap_or(0));
                let now = shard.driver.now();
                if last_log.is_none_or(|t| now.duration_since(t) >= Duration::from_secs(1)) {
                    last_log = Some(now);
                    crate::log_warn!("shard", "shard {}: accept failed: {e}", shard.id);
                }
                // Out of descriptors or memory: back off instead of spinning.
                shard.driver.sleep(Duration::from_millis(10)).await;
            }
        }
    }
    // Dropping the listener closes this shard's socket; others may still accept
    // until their own drain starts.
}

async fn tick(shard: Rc<Shard>) {
    let mut n = 0u64;
    loop {
        shard.driver.sleep(TICK).await;
        if shard.rt.draining.load(Ordering::Relaxed) {
            begin_drain(&shard);
        }
        shard
            .counters
            .heap_allocations
            .store(crate::alloc::thread_allocations(), Ordering::Relaxed);
        shard.counters.engine.publish(&shard.driver);
        let e = &shard.counters.engine;
        e.exchanges_pooled
            .store(shard.exchanges.borrow().len() as u64, Ordering::Relaxed);
        e.exchanges_out
            .store(shard.exchanges_out.get() as u64, Ordering::Relaxed);
        e.heap_live_bytes.store(
            crate::alloc::thread_live_bytes().max(0) as u64,
            Ordering::Relaxed,
        );
        n += 1;
        if n.is_multiple_of(10) {
            shard.pool.sweep(Instant::now());
            let rt = &shard.rt;
            shard.seen.changed(rt, |ep| shard.pool.retire(ep));
            crate::conn::trim_memory(&shard);
        }
    }
}
