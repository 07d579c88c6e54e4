//! A shard's executor: one pinned glommio executor per CPU, binding its listeners, running their accept loops, switching generations and publishing its counters each tick; the state its connections run on is `conn::shard::Shard`.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::rc::{Rc, Weak};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_lite::future::or;
use glommio::sync::{Gate, Semaphore};

use crate::conn::shard::Shard;
use crate::io::{Driver, Listener};
use crate::observe::engine_metrics::EngineCounters;
use crate::process::generation::{Command, ListenerFd, Mailbox, Update};
use crate::runtime::Runtime;

/// Locked memory each shard's executor asks for (glommio's registered buffer
/// area). zgix does no file I/O, so it needs little; the floor glommio accepts
/// is 64 KiB. With an 8 MiB `RLIMIT_MEMLOCK` this leaves room for many shards.
pub const IO_MEMORY: usize = 256 << 10;

/// How often a shard publishes its engine counters and sweeps its pools.
const TICK: Duration = Duration::from_millis(100);

/// How long a drain leaves idle keep-alive connections open (at most half
/// the drain timeout): requests that reach one meanwhile are answered with
/// `Connection: close`.
pub const IDLE_GRACE: Duration = Duration::from_millis(1000);

/// What a shard reports once it accepts on its first generation's sockets
/// (or why it cannot).
pub type BindReport = Result<(), String>;

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
    // A diagnostic knob, not config: raised out of reach (the end-to-end
    // tests do), it shows whether any answer waits on the backstop.
    if let Some(ms) = std::env::var("ZGIX_INLINE_BACKSTOP_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        o.inline_backstop = Duration::from_millis(ms);
    }
    o
}

/// What a shard thread holds across its generations.
struct Local {
    id: usize,
    driver: Rc<Driver>,
    /// The newest generation: new connections run on it.
    current: RefCell<Rc<Shard>>,
    /// Every generation made, for the tick and the drain (dead ones pruned).
    gens: RefCell<Vec<Weak<Shard>>>,
    /// One entry per listening socket this shard accepts on.
    listeners: RefCell<Vec<Rc<Entry>>>,
    /// The admin endpoint's accept loop, kept across generations while its
    /// socket is the same (a reload swaps the shard state it answers from).
    admin: RefCell<Option<AdminLoop>>,
    /// Every accept loop runs in it: closing it waits until each has served
    /// what its socket had already accepted.
    accepts: RefCell<Rc<Gate>>,
    /// Closed when the drain starts.
    stopped: Semaphore,
}

/// The admin socket's accept loop: the socket's inode (its identity across
/// the duplicates each generation brings), the shard state it answers
/// from, and the semaphore closed to stop it.
struct AdminLoop {
    inode: u64,
    shard: Rc<RefCell<Rc<Shard>>>,
    stop: Rc<Semaphore>,
}

/// The inode of a socket descriptor (0 if `fstat` fails).
fn inode(fd: RawFd) -> u64 {
    // SAFETY: fstat on a descriptor the caller owns, into plain data.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(fd, &mut st) != 0 {
            return 0;
        }
        st.st_ino
    }
}

/// One listening socket's accept loop.
struct Entry {
    /// The listener's configured `bind`.
    key: SocketAddr,
    /// Its index in the current generation's runtime.
    index: Cell<usize>,
    /// The generation new connections run on.
    shard: RefCell<Rc<Shard>>,
    /// Closed to stop accepting (listener removed, handed off, drain).
    stop: Semaphore,
}

impl Local {
    fn current(&self) -> Rc<Shard> {
        self.current.borrow().clone()
    }

    fn live_gens(&self) -> Vec<Rc<Shard>> {
        let mut gens = self.gens.borrow_mut();
        gens.retain(|g| g.strong_count() > 0);
        gens.iter().filter_map(Weak::upgrade).collect()
    }

    /// Makes `up` the current generation: kept listeners accept into it,
    /// removed ones stop, added ones start.
    fn apply(self: &Rc<Self>, up: Update) -> Result<(), String> {
        let prev = self.current();
        let next = Rc::new(Shard::new(
            self.id,
            up.rt.clone(),
            self.driver.clone(),
            Some(&prev),
            up.generation,
        ));
        *next.newest.borrow_mut() = Rc::downgrade(&next);
        // Its idle upstream connections move to the new pool (same
        // endpoint address) or close; it keeps nothing a request does not use.
        prev.retire(&next);
        self.gens.borrow_mut().push(Rc::downgrade(&next));
        *self.current.borrow_mut() = next.clone();
        up.rt.metrics.shards[self.id]
            .engine
            .set_driver(self.driver.kind().as_str());
        spawn_prober(&next);
        let listeners = self.serve_listeners(&next, up.listeners);
        let admin = self.serve_admin(&next, up.admin);
        listeners.and(admin)
    }

    fn serve_listeners(
        self: &Rc<Self>,
        shard: &Rc<Shard>,
        list: Vec<ListenerFd>,
    ) -> Result<(), String> {
        let old = std::mem::take(&mut *self.listeners.borrow_mut());
        let mut now = Vec::with_capacity(list.len());
        for e in old {
            match list.iter().find(|l| l.key == e.key) {
                Some(l) => {
                    e.index.set(l.index);
                    *e.shard.borrow_mut() = shard.clone();
                    now.push(e);
                }
                None => e.stop.close(),
            }
        }
        let mut result = Ok(());
        for l in list {
            let Some(fd) = l.fd else { continue };
            match Listener::from_fd(fd, &self.driver) {
                Ok(listener) => {
                    let e = Rc::new(Entry {
                        key: l.key,
                        index: Cell::new(l.index),
                        shard: RefCell::new(shard.clone()),
                        stop: Semaphore::new(0),
                    });
                    let gate = self.accepts.borrow().clone();
                    if let Ok(t) = gate.spawn(accept_loop(e.clone(), listener)) {
                        t.detach();
                        now.push(e);
                    }
                }
                Err(e) => {
                    result = Err(format!("listeners[{}]: {}: {e}", l.index, l.key));
                }
            }
        }
        *self.listeners.borrow_mut() = now;
        result
    }

    fn serve_admin(&self, shard: &Rc<Shard>, fd: Option<RawFd>) -> Result<(), String> {
        let Some(fd) = fd else {
            if let Some(old) = self.admin.borrow_mut().take() {
                old.stop.close();
            }
            return Ok(());
        };
        let admin = Rc::new(Shard::new(
            self.id,
            shard.rt.clone(),
            self.driver.clone(),
            Some(shard),
            shard.generation,
        ));
        let ino = inode(fd);
        if let Some(cur) = self
            .admin
            .borrow()
            .as_ref()
            .filter(|a| a.inode == ino && ino != 0)
        {
            // The same socket: keep accepting on it (closing and reopening
            // the loop could drop a connection already accepted for it),
            // answer from the new runtime from now on.
            // SAFETY: `fd` is a duplicate this shard owns and does not use.
            unsafe { libc::close(fd) };
            *cur.shard.borrow_mut() = admin;
            return Ok(());
        }
        if let Some(old) = self.admin.borrow_mut().take() {
            old.stop.close();
        }
        let listener = Listener::from_fd(fd, &self.driver).map_err(|e| format!("admin: {e}"))?;
        let cell = Rc::new(RefCell::new(admin));
        let stop = Rc::new(Semaphore::new(0));
        glommio::spawn_local(crate::process::admin::serve(
            cell.clone(),
            stop.clone(),
            listener,
        ))
        .detach();
        *self.admin.borrow_mut() = Some(AdminLoop {
            inode: ino,
            shard: cell,
            stop,
        });
        Ok(())
    }

    fn stop_accepting(&self) {
        for e in self.listeners.borrow_mut().drain(..) {
            e.stop.close();
        }
    }

    /// Waits until every stopped accept loop has served what its socket had
    /// already accepted (later listeners start in a fresh gate).
    async fn accept_loops_done(&self) {
        let gate = std::mem::replace(&mut *self.accepts.borrow_mut(), Rc::new(Gate::new()));
        let _ = gate.close().await;
    }

    fn begin_drain(self: &Rc<Self>) {
        let cur = self.current();
        if cur.closing.replace(true) {
            return;
        }
        self.stop_accepting();
        // Idle keep-alive connections are closed only after a grace: a
        // request already on the wire to one is answered (with
        // `Connection: close`, as every answer while draining) instead of
        // meeting a closed socket. On an upgrade the new process accepts
        // already, so its client reconnects there.
        let grace = IDLE_GRACE.min(cur.rt.timeouts.drain / 2);
        let local = self.clone();
        glommio::spawn_local(async move {
            local.driver.sleep(grace).await;
            local.current().draining.set(true);
            for g in local.live_gens() {
                g.shutdown.close();
            }
        })
        .detach();
        // The admin socket keeps answering through the drain (`/ready` 503,
        // `zgix_draining 1`) until the process exits, unless a new process
        // took the sockets over: then it answers there.
        if crate::process::lifecycle::LIFECYCLE
            .handed_off
            .load(Ordering::Acquire)
        {
            if let Some(a) = self.admin.borrow_mut().take() {
                a.stop.close();
            }
        }
        self.stopped.close();
    }
}

/// The body of a shard's executor: accept on the first generation's sockets,
/// report, serve (and switch generations) until drained.
pub async fn run(
    id: usize,
    first: Update,
    mailbox: Arc<Mailbox>,
    report: std::sync::mpsc::Sender<BindReport>,
) {
    let rt = first.rt.clone();
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
    rt.metrics.shards[id]
        .engine
        .set_driver(driver.kind().as_str());
    mailbox.set_notifier(driver.notifier());
    let shard = Rc::new(Shard::new(id, rt, driver.clone(), None, first.generation));
    *shard.newest.borrow_mut() = Rc::downgrade(&shard);
    let driver_task = glommio::spawn_local(driver.clone().run());
    let local = Rc::new(Local {
        id,
        driver: driver.clone(),
        current: RefCell::new(shard.clone()),
        gens: RefCell::new(vec![Rc::downgrade(&shard)]),
        listeners: RefCell::new(Vec::new()),
        admin: RefCell::new(None),
        accepts: RefCell::new(Rc::new(Gate::new())),
        stopped: Semaphore::new(0),
    });
    let bound = local
        .serve_listeners(&shard, first.listeners)
        .and_then(|()| local.serve_admin(&shard, first.admin));
    drop(shard);
    let failed = bound.is_err();
    let _ = report.send(bound);
    if !failed {
        spawn_prober(&local.current());
        glommio::spawn_local(tick(local.clone())).detach();
        glommio::spawn_local(watch(local.clone(), mailbox)).detach();
        let _ = local.stopped.acquire(1).await;
        // Connections the listeners had already accepted join the gate first.
        local.accept_loops_done().await;
        for g in local.live_gens() {
            g.pool.clear();
        }
        let cur = local.current();
        if !drained(&driver, &cur).await {
            let l = &crate::process::lifecycle::LIFECYCLE;
            l.cut_requests
                .fetch_add(cur.in_flight.get() as u64, Ordering::AcqRel);
            l.cut_connections
                .fetch_add(cur.open_connections.get() as u64, Ordering::AcqRel);
        }
    }
    local.stop_accepting();
    driver.stop();
    driver_task.await;
}

/// Waits until every connection of `cur` closed (true), the drain timeout
/// passed or a second drain signal asked to cut now (false). The signal's
/// thread sets [`Lifecycle::cut_now`] and then wakes the shard through its
/// notifier, so the flag is read once per wake-up, not on a timer.
///
/// [`Lifecycle::cut_now`]: crate::process::lifecycle::Lifecycle::cut_now
async fn drained(driver: &Rc<Driver>, cur: &Shard) -> bool {
    let gate = cur.gate.clone();
    let deadline = driver.now() + cur.rt.timeouts.drain;
    let mut close = std::pin::pin!(async move {
        let _ = gate.close().await;
    });
    loop {
        // Read after the notified() of the previous turn completed: a cut
        // stored before its wake-up is seen here.
        let now = driver.now();
        if now >= deadline
            || crate::process::lifecycle::LIFECYCLE
                .cut_now
                .load(Ordering::Acquire)
        {
            return false;
        }
        let mut woken = std::pin::pin!(driver.notified());
        let closed_or_woken = std::future::poll_fn(|cx| {
            if close.as_mut().poll(cx).is_ready() {
                return std::task::Poll::Ready(true);
            }
            woken.as_mut().poll(cx).map(|()| false)
        });
        if let Some(true) = driver.timeout(deadline - now, closed_or_woken).await {
            return true;
        }
    }
}

/// Starts the active health checks of `shard`'s runtime on shard 0 (an
/// endpoint is probed once per interval, not once per shard); they end when
/// that runtime is retired by a reload or drains.
fn spawn_prober(shard: &Shard) {
    let rt = &shard.rt;
    if shard.id == 0 && rt.up.clusters.iter().any(|c| c.active.is_some()) {
        glommio::spawn_local(crate::upstream::health::run_prober(
            rt.up.clone(),
            shard.driver.clone(),
        ))
        .detach();
    }
}

/// Carries out the main thread's commands (it posts, then notifies the
/// driver; the tick-long sleep is a backstop, not the mechanism).
async fn watch(local: Rc<Local>, mailbox: Arc<Mailbox>) {
    loop {
        while let Some((seq, cmd)) = mailbox.take() {
            match cmd {
                Command::Apply(up) => {
                    let generation = up.generation;
                    if let Err(e) = local.apply(up) {
                        crate::log_warn!(
                            "shard",
                            "shard {}: generation {generation}: {e}",
                            local.id
                        );
                    }
                }
                Command::StopAccepting => {
                    local.stop_accepting();
                    local.accept_loops_done().await;
                }
                Command::Drain => {
                    local.begin_drain();
                    mailbox.ack(seq);
                    return;
                }
            }
            mailbox.ack(seq);
        }
        let _ = local.driver.timeout(TICK, local.driver.notified()).await;
    }
}

/// Waits until this shard holds fewer connections than `max` (the count
/// and the waiters are shared by every generation: holding them pins none).
async fn below_cap(open: Rc<Cell<usize>>, max: usize, waiters: Rc<RefCell<Vec<std::task::Waker>>>) {
    std::future::poll_fn(|cx| {
        if open.get() < max {
            return std::task::Poll::Ready(());
        }
        waiters.borrow_mut().push(cx.waker().clone());
        std::task::Poll::Pending
    })
    .await
}

/// How long a listener that stops accepting keeps serving connections the
/// kernel had already handed to this shard (io_uring's multishot accept
/// queues them before the loop asks).
const STOP_GRACE: Duration = Duration::from_millis(50);

/// Accepts into the generation `entry` points at when each connection
/// arrives; holds no generation while it waits (only the driver and the
/// counts every generation shares).
async fn accept_loop(entry: Rc<Entry>, listener: Listener) {
    let mut last_log: Option<Instant> = None;
    let (id, driver) = {
        let s = entry.shard.borrow();
        (s.id, s.driver.clone())
    };
    loop {
        let (at_cap, open, max, waiters) = {
            let s = entry.shard.borrow();
            (
                s.open_connections.get() >= s.max_connections,
                s.open_connections.clone(),
                s.max_connections,
                s.capacity_waiters.clone(),
            )
        };
        if at_cap {
            // At the cap: stop taking connections (the backlog holds them)
            // instead of accepting and refusing, or spinning on EMFILE.
            listener.pause();
            entry.shard.borrow().counters.engine.accept_pauses.inc();
            let now = driver.now();
            if last_log.is_none_or(|t| now.duration_since(t) >= Duration::from_secs(1)) {
                last_log = Some(now);
                crate::log_warn!(
                    "shard",
                    "shard {id} at its connection cap ({max}); accepting paused"
                );
            }
            let resumed = or(
                async {
                    below_cap(open, max, waiters).await;
                    true
                },
                async {
                    let _ = entry.stop.acquire(1).await;
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
            let _ = entry.stop.acquire(1).await;
            None
        })
        .await;
        match accepted {
            None => break,
            // The generation may have changed while this loop waited.
            Some(Ok((sock, peer))) => {
                spawn_connection(&entry.shard.borrow().clone(), entry.index.get(), sock, peer)
            }
            Some(Err(e)) => {
                entry
                    .shard
                    .borrow()
                    .counters
                    .engine
                    .accept_error(e.raw_os_error().unwrap_or(0));
                let now = driver.now();
                if last_log.is_none_or(|t| now.duration_since(t) >= Duration::from_secs(1)) {
                    last_log = Some(now);
                    crate::log_warn!("shard", "shard {id}: accept failed: {e}");
                }
                // Out of descriptors or memory: back off instead of spinning.
                driver.sleep(Duration::from_millis(10)).await;
            }
        }
    }
    // Stopped: take nothing more off the backlog, but serve what the kernel
    // already accepted for us, then close this shard's socket (others — in
    // this process or the one the sockets were handed to — keep accepting).
    listener.pause();
    while let Some(Ok((sock, peer))) = driver.timeout(STOP_GRACE, listener.accept()).await {
        spawn_connection(&entry.shard.borrow().clone(), entry.index.get(), sock, peer);
    }
}

fn spawn_connection(shard: &Rc<Shard>, li: usize, sock: crate::io::Sock, peer: SocketAddr) {
    let open = shard.open_connections.get() + 1;
    shard.open_connections.set(open);
    if open > shard.connections_high.get() {
        shard.connections_high.set(open);
    }
    match shard
        .gate
        .spawn(crate::conn::serve(shard.clone(), li, sock, peer))
    {
        Ok(task) => {
            task.detach();
        }
        Err(_) => shard.connection_closed(),
    }
}

async fn tick(local: Rc<Local>) {
    let mut n = 0u64;
    loop {
        local.driver.sleep(TICK).await;
        let shard = local.current();
        shard.counters.heap_allocations.store(
            crate::observe::alloc::thread_allocations(),
            Ordering::Relaxed,
        );
        publish_driver(&shard.counters.engine, &shard.driver);
        let e = &shard.counters.engine;
        e.exchanges_pooled
            .store(shard.exchanges.borrow().len() as u64, Ordering::Relaxed);
        e.exchanges_out
            .store(shard.exchanges_out.get() as u64, Ordering::Relaxed);
        e.heap_live_bytes.store(
            crate::observe::alloc::thread_live_bytes().max(0) as u64,
            Ordering::Relaxed,
        );
        n += 1;
        if n.is_multiple_of(10) {
            local.driver.watch_accepts();
            for g in local.live_gens() {
                g.pool.sweep(Instant::now());
                g.seen.changed(&g.rt.up, |ep| g.pool.retire(ep));
                // Disabled by the operator: its idle connections close now.
                for (ep, u) in g.rt.up.upstreams.iter().enumerate() {
                    if u.health.admin_state() == crate::upstream::health::AdminState::Disabled {
                        g.pool.retire(ep);
                    }
                }
                crate::conn::trim_memory(&g);
            }
        }
    }
}

/// Copies the driver's counters into the shard's engine counters (the tick).
fn publish_driver(e: &EngineCounters, d: &Driver) {
    let s = &d.stats;
    e.driver_enters.store(s.enters.get(), Ordering::Relaxed);
    e.recv_rearm_nobufs
        .store(s.recv_rearm_nobufs.get(), Ordering::Relaxed);
    e.recv_paused.store(s.recv_paused.get(), Ordering::Relaxed);
    e.cq_overflows
        .store(s.cq_overflows.get(), Ordering::Relaxed);
    e.sends_waited
        .store(s.sends_waited.get(), Ordering::Relaxed);
    e.backstop_parks
        .store(s.backstop_parks.get(), Ordering::Relaxed);
    e.buffers_held
        .store(d.buffers_held() as u64, Ordering::Relaxed);
    e.relayed_bytes
        .store(s.relayed_bytes.get(), Ordering::Relaxed);
    e.spliced_bytes
        .store(s.spliced_bytes.get(), Ordering::Relaxed);
    e.gathered_sends
        .store(s.gathered_sends.get(), Ordering::Relaxed);
    e.gathered_bytes
        .store(s.gathered_bytes.get(), Ordering::Relaxed);
    e.accept_stalls
        .store(s.accept_stalls.get(), Ordering::Relaxed);
    e.splice_fallbacks
        .store(s.splice_fallbacks.get(), Ordering::Relaxed);
    e.pipes_out.store(d.pipes_out() as u64, Ordering::Relaxed);
}
