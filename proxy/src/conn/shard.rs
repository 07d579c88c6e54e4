//! A shard's state as its connections see it: the runtime of its generation, its upstream pool and balancer, its counters and access-log ring, the connection cap, the pooled request states, and the way to the next generation.
//!
//! The shard's executor (`process::shard`) makes one [`Shard`] per
//! configuration generation and hands it to each connection it accepts; the
//! exchange takes what it needs from it and never reaches back up.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::{Rc, Weak};
use std::sync::{Arc, Mutex};

use glommio::sync::{Gate, Semaphore};
use zgix_parser::{RequestParser, ResponseParser};

use crate::io::Driver;
use crate::observe::metrics::ShardCounters;
use crate::runtime::Runtime;
use crate::upstream::pool::Pool;

/// Everything one shard owns. Shared by its tasks through `Rc`: never sent to
/// another thread.
pub struct Shard {
    pub id: usize,
    pub rt: Arc<Runtime>,
    pub counters: Arc<ShardCounters>,
    pub pool: Pool,
    /// Endpoint choice per cluster (weights, least_conn, rendezvous).
    pub balancer: crate::upstream::lb::Balancer,
    /// This shard's per-endpoint counters.
    pub up: Arc<crate::upstream::metrics::ShardUpstream>,
    /// Resolver generations seen, so moved endpoints' pooled connections go.
    pub seen: crate::upstream::resolver::SeenGenerations,
    /// This shard's access-log ring, when the access log is on.
    pub access_log: Option<crate::observe::access_log::ShardLog>,
    /// Set once the shard drains (shared by its generations): answers
    /// carry `Connection: close` from then on.
    pub closing: Rc<Cell<bool>>,
    /// Set once the drain's grace for idle keep-alive connections is over
    /// (shared by its generations): a connection that goes idle closes.
    pub draining: Rc<Cell<bool>>,
    /// Never holds permits: closing it wakes every task waiting on it (the
    /// drain closes every generation's; a reload, the one it retires).
    pub shutdown: Semaphore,
    /// Every connection task of every generation passes through it, so a
    /// drain can wait for them.
    pub gate: Rc<Gate>,
    pub req_parser: RequestParser,
    pub resp_parser: ResponseParser,
    /// The socket driver every client, upstream and listening socket of
    /// this shard (and every timer) runs on.
    pub driver: Rc<Driver>,
    /// Client connections open on this shard, and its share of
    /// `limits.max_connections`.
    pub open_connections: Rc<Cell<usize>>,
    pub max_connections: usize,
    /// The most connections open since the last memory trim (all generations).
    pub connections_high: Rc<Cell<usize>>,
    /// Accept loops paused at the cap wait here for a connection to close.
    pub capacity_waiters: Rc<RefCell<Vec<std::task::Waker>>>,
    /// Request states kept for reuse (see `conn::Exchange`), how many are
    /// out now, and the most out at once since the last tick trimmed the pool.
    pub exchanges: RefCell<Vec<Box<crate::conn::Exchange>>>,
    pub exchanges_out: Cell<usize>,
    pub exchanges_peak: Cell<usize>,
    /// Blocks the request-handling futures run in (see `conn::slab`).
    pub request_futures: crate::conn::slab::FutureSlab,
    /// Blocks the HTTP/2 streams' futures run in (see `conn::h2`).
    pub stream_futures: crate::conn::slab::FutureSlab,
    /// Blocks the HTTP/2 streams' I/O states live in (see `conn::h2::stream`).
    pub stream_ios: crate::conn::slab::FutureSlab,
    /// Requests being handled on this shard, all generations (see
    /// [`Shard::request_started`]); what a drain cut at its deadline.
    pub in_flight: Rc<Cell<usize>>,
    /// The configuration generation this shard state belongs to (1 at start).
    pub generation: u64,
    /// The newest generation of this shard, shared by all of them (see
    /// [`crate::process::generation`]). Weak: a generation does not keep a
    /// newer (or an older) one alive, only its connections and requests do.
    pub newest: Rc<RefCell<Weak<Shard>>>,
    /// Set once a newer generation replaced this one: its pool is emptied
    /// and connections returned to it go to the newest generation's pool
    /// (same endpoint address) or close.
    pub retired: Cell<bool>,
}

/// Live shard states by generation number (all shards, admin included).
static LIVE: Mutex<BTreeMap<u64, usize>> = Mutex::new(BTreeMap::new());

/// How many configuration generations are alive in this process (each
/// counted once however many shards hold it): 1 when every connection runs
/// on the current config.
pub fn generations_live() -> usize {
    LIVE.lock().unwrap_or_else(|p| p.into_inner()).len()
}

impl Drop for Shard {
    fn drop(&mut self) {
        let mut live = LIVE.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = live.get_mut(&self.generation) {
            *n -= 1;
            if *n == 0 {
                live.remove(&self.generation);
            }
        }
    }
}

impl Shard {
    /// A shard state for `rt`; `prev` is the generation it follows, whose
    /// connection count, gate, drain flag and in-flight count it shares.
    pub fn new(
        id: usize,
        rt: Arc<Runtime>,
        driver: Rc<Driver>,
        prev: Option<&Shard>,
        generation: u64,
    ) -> Shard {
        let l = &rt.config.limits;
        let shards = rt.metrics.shards.len();
        *LIVE
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(generation)
            .or_default() += 1;
        Shard {
            id,
            counters: rt.metrics.shards[id].clone(),
            pool: Pool::new(
                rt.up.endpoints.len(),
                l.upstream_pool_idle_per_endpoint,
                rt.timeouts.upstream_pool_idle,
            ),
            balancer: crate::upstream::lb::Balancer::new(&rt.up, id),
            up: rt.up.upstream_stats.shards[id].clone(),
            seen: crate::upstream::resolver::SeenGenerations::new(&rt.up),
            access_log: rt
                .access_log
                .as_ref()
                .map(|a| a.shard(id, rt.metrics.shards[id].clone(), l.max_request_line)),
            draining: prev.map_or_else(Default::default, |p| p.draining.clone()),
            closing: prev.map_or_else(Default::default, |p| p.closing.clone()),
            shutdown: Semaphore::new(0),
            gate: prev.map_or_else(|| Rc::new(Gate::new()), |p| p.gate.clone()),
            req_parser: RequestParser::new(rt.request_limits),
            resp_parser: ResponseParser::new(
                l.max_response_header_bytes,
                rt.response_max_headers(),
            ),
            driver,
            open_connections: prev.map_or_else(Default::default, |p| p.open_connections.clone()),
            max_connections: rt.max_connections.div_ceil(shards.max(1)).max(1),
            connections_high: prev.map_or_else(Default::default, |p| p.connections_high.clone()),
            capacity_waiters: prev.map_or_else(Default::default, |p| p.capacity_waiters.clone()),
            exchanges: RefCell::new(Vec::with_capacity(rt.config.io.idle_exchanges)),
            exchanges_out: Cell::new(0),
            exchanges_peak: Cell::new(0),
            request_futures: Default::default(),
            stream_futures: Default::default(),
            stream_ios: Default::default(),
            in_flight: prev.map_or_else(Default::default, |p| p.in_flight.clone()),
            generation,
            newest: prev.map_or_else(Default::default, |p| p.newest.clone()),
            retired: Cell::new(false),
            rt,
        }
    }

    /// A request started (its head is parsed): counted until the guard drops.
    pub fn request_started(&self) -> InFlight<'_> {
        self.in_flight.set(self.in_flight.get() + 1);
        InFlight(&self.in_flight)
    }

    /// A newer generation replaced this one: idle upstream connections move
    /// to `next`'s pool when it has an endpoint of the same address (else
    /// they close), and so will connections in use now when they are
    /// returned; the request-state caches are let go; and connections
    /// idle between requests on it are woken (its `shutdown` closes), so
    /// they follow to `next` now instead of holding this one until their
    /// next request (`conn::head`, `Conn::wait_between_requests`).
    pub fn retire(&self, next: &Shard) {
        self.retired.set(true);
        self.shutdown.close();
        let now = self.driver.now();
        let fresh = self.rt.timeouts.upstream_pool_idle;
        for ep in 0..self.rt.up.endpoints.len() {
            let to = next.rt.up.successor(&self.rt.up, ep);
            // Oldest first, so the newest ends up on top of the new pool.
            while let Some((s, since)) = self.pool.take_oldest(ep) {
                if let Some(to) = to.filter(|_| now.duration_since(since) < fresh) {
                    next.pool.adopt(to, s, since);
                }
            }
        }
        self.pool.clear();
        self.exchanges.borrow_mut().clear();
        self.request_futures.trim();
        self.stream_futures.trim();
        self.stream_ios.trim();
    }

    /// An upstream connection whose exchange ended cleanly, back to the
    /// pool: this generation's, or the newest's once this one is retired.
    pub fn return_upstream(&self, ep: usize, sock: crate::upstream::conn::UpConn) {
        let now = self.driver.now();
        if !self.retired.get() {
            return self.pool.put(ep, sock, now);
        }
        let Some(next) = self.newest.borrow().upgrade() else {
            return;
        };
        if next.retired.get() {
            return;
        }
        if let Some(to) = next.rt.up.successor(&self.rt.up, ep) {
            next.pool.put(to, sock, now);
        }
    }

    /// A connection closed: wake an accept loop paused at the cap.
    pub fn connection_closed(&self) {
        self.open_connections.set(self.open_connections.get() - 1);
        let mut waiters = self.capacity_waiters.borrow_mut();
        if !waiters.is_empty() {
            // Woken by this task, not a completion: the driver lets the
            // accept loop run before it parks.
            self.driver.kick();
        }
        for w in waiters.drain(..) {
            w.wake();
        }
    }
}

/// An [`InFlight`] guard: one request being handled (see [`Shard::request_started`]).
pub struct InFlight<'a>(&'a Cell<usize>);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.set(self.0.get() - 1);
    }
}

/// Where a connection goes between two requests after a reload.
#[derive(Debug, PartialEq, Eq)]
pub enum Follow {
    /// No newer generation: stay.
    Stay,
    /// Serve the next request on the newest generation, as listener `index`.
    Move(usize),
    /// The connection's listener is gone from the config: close it.
    Close,
}

/// Finds the newest generation (when it is not `shard`'s) and the connection's listener
/// in it (by its configured `bind`). Called by a connection between two
/// requests, holding no request state (when bytes of the next one arrive,
/// or when a reload retired its generation); on `Move` it replaces its
/// `Rc<Shard>` with `*shard` and its listener index with the one returned.
pub fn follow(shard: &mut Rc<Shard>, li: usize) -> Follow {
    let newest = shard.newest.borrow().upgrade();
    let Some(newest) = newest.filter(|n| !Rc::ptr_eq(n, shard)) else {
        return Follow::Stay;
    };
    let key = shard.rt.listeners[li].bind;
    match newest.rt.listeners.iter().position(|l| l.bind == key) {
        Some(index) => {
            *shard = newest;
            Follow::Move(index)
        }
        None => Follow::Close,
    }
}
