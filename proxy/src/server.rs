//! Process start-up and shutdown: build the runtime, start one pinned shard per CPU, wait for a signal, drain.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use glommio::{LocalExecutorBuilder, Placement};
use zgix_config::Config;

use crate::runtime::Runtime;
use crate::shard::{self, BindReport, IO_MEMORY};
use crate::signals::TermSignals;

/// Runs zgix until SIGTERM/SIGINT and the drain that follows.
pub fn run(config: Config) -> Result<(), String> {
    let cpus = config.shard_cpus();
    if cpus.is_empty() {
        return Err("no CPU to run a shard on".into());
    }
    let signals = TermSignals::block().map_err(|e| format!("cannot block signals: {e}"))?;
    crate::respond::set_server_header(config.server_header());
    let mut rt = Runtime::new(config, cpus.len());
    if let Some(cfg) = &rt.config.access_log {
        rt.access_log = Some(crate::access_log::AccessLog::start(cfg, cpus.len())?);
    }
    let rt = Arc::new(rt);
    let _resolver = crate::resolve::spawn_resolver(rt.clone());
    let live = Arc::new(AtomicUsize::new(0));
    let (tx, rx) = mpsc::channel::<BindReport>();

    // Shard 0 binds first: a listener on port 0 gets its port there, and every
    // other shard binds that same port, so all shards share one SO_REUSEPORT group.
    let mut binds: Vec<_> = rt.listeners.iter().map(|l| l.bind).collect();
    let admin = rt.config.admin.as_ref().map(|a| a.bind);
    let mut admin_bound = None;
    let mut notifiers = Vec::with_capacity(cpus.len());
    for (i, &cpu) in cpus.iter().enumerate() {
        spawn_shard(
            i,
            cpu,
            rt.clone(),
            binds.clone(),
            if i == 0 { admin } else { None },
            tx.clone(),
            live.clone(),
        )?;
        let (bound, adm, notifier) = rx
            .recv()
            .map_err(|_| format!("shard {i} exited before binding"))??;
        notifiers.push(notifier);
        if i == 0 {
            binds = bound;
            admin_bound = adm;
        }
    }
    for (i, b) in binds.iter().enumerate() {
        info(format_args!(
            "listener {i} on {b} (name {:?})",
            rt.listeners[i].name
        ));
    }
    if let Some(a) = admin_bound {
        info(format_args!("admin on {a}"));
    }
    info(format_args!(
        "ready ({} shards, {})",
        cpus.len(),
        rt.io_driver_name()
    ));

    loop {
        crate::log::flush_repeats();
        match signals.wait(Duration::from_millis(200)) {
            Some(crate::signals::REOPEN) => {
                if let Some(log) = &rt.access_log {
                    log.reopen();
                }
                continue;
            }
            Some(sig) => {
                info(format_args!(
                    "signal {sig}: draining (up to {} ms)",
                    rt.timeouts.drain.as_millis()
                ));
                break;
            }
            None => {}
        }
        if live.load(Ordering::Acquire) < cpus.len() {
            return Err("a shard stopped unexpectedly".into());
        }
    }
    rt.draining.store(true, Ordering::Release);
    for n in &notifiers {
        n.notify();
    }
    // Shards drain within drain_timeout; allow one tick and a margin on top.
    let deadline = Instant::now() + rt.timeouts.drain + Duration::from_millis(500);
    while live.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
        match signals.wait(Duration::from_millis(20)) {
            Some(crate::signals::REOPEN) | None => {}
            Some(_) => {
                info(format_args!("second signal: exiting now"));
                break;
            }
        }
    }
    if let Some(log) = &rt.access_log {
        log.stop();
    }
    crate::log::flush_repeats();
    info(format_args!("stopped"));
    Ok(())
}

fn info(args: std::fmt::Arguments<'_>) {
    crate::log::log(crate::log::Level::Info, "server", args);
}

/// Decrements the live-shard count when a shard's thread finishes, however it finishes.
struct LiveGuard(Arc<AtomicUsize>);

impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

fn spawn_shard(
    id: usize,
    cpu: usize,
    rt: Arc<Runtime>,
    binds: Vec<std::net::SocketAddr>,
    admin: Option<std::net::SocketAddr>,
    report: mpsc::Sender<BindReport>,
    live: Arc<AtomicUsize>,
) -> Result<(), String> {
    live.fetch_add(1, Ordering::AcqRel);
    let guard_live = live.clone();
    let builder = LocalExecutorBuilder::new(Placement::Fixed(cpu))
        .name(&format!("zgix-shard-{id}"))
        .io_memory(IO_MEMORY)
        .preempt_timer(crate::io::PREEMPT_EVERY);
    let handle = builder.spawn(move || async move {
        let _live = LiveGuard(guard_live);
        shard::run(id, rt, binds, admin, report).await;
    });
    match handle {
        Ok(h) => {
            // The thread runs on its own; the live count tracks it.
            std::mem::forget(h);
            Ok(())
        }
        Err(e) => {
            live.fetch_sub(1, Ordering::AcqRel);
            Err(format!(
                "cannot start shard {id} on CPU {cpu}: {e}. glommio's executor needs locked memory: \
                 check `ulimit -l` (each shard locks {} KiB for glommio's registered buffers; \
                 raise RLIMIT_MEMLOCK, e.g. LimitMEMLOCK=infinity under systemd)",
                IO_MEMORY >> 10
            ))
        }
    }
}
