//! Process start-up, reload and shutdown: bind the listening sockets, start one pinned shard per CPU, answer signals (drain, reload, log reopen), hand the sockets to an upgrading instance, drain and report what the drain cut.

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use glommio::{LocalExecutorBuilder, Placement};
use zgix_config::Config;

use crate::instance::{self, Guards, Table};
use crate::process::generation::{Command, ListenerFd, Mailbox, Update};
use crate::process::lifecycle::{sd_notify, EXIT_DRAIN_CUT, LIFECYCLE};
use crate::process::shard::{self, BindReport, IO_MEMORY};
use crate::process::signals::{self, Signal, Signals};
use crate::runtime::Runtime;

/// How long the main thread waits for every shard to take a new generation.
const APPLY_WAIT: Duration = Duration::from_secs(5);

/// How zgix was asked to start.
pub struct Start {
    pub config: Config,
    /// The file, read again on SIGHUP.
    pub path: PathBuf,
    /// `--upgrade`: take the listening sockets over from the running instance.
    pub upgrade: bool,
}

/// One listener's sockets: one per shard (or more, when handed over by an
/// instance with more shards). The main thread keeps these; shards get
/// duplicates, so a hand-off can send them and a removal closes them.
struct Bound {
    key: SocketAddr,
    actual: SocketAddr,
    fds: Vec<OwnedFd>,
}

/// Runs zgix until SIGTERM/SIGINT/SIGQUIT (or a hand-off) and the drain
/// that follows; returns the exit status.
pub fn run(start: Start) -> Result<i32, String> {
    let cpus = start.config.shard_cpus();
    if cpus.is_empty() {
        return Err("no CPU to run a shard on".into());
    }
    let signals = Signals::block().map_err(|e| format!("cannot block signals: {e}"))?;
    let (mut server, mut handed) = load(start, cpus.len())?;
    let rt = server.rt.clone();
    let _resolver = crate::upstream::resolver::spawn_resolver(rt.up.clone());
    let live = start_shards(&mut server, &cpus, handed.as_mut())?;
    if let Some(mut h) = handed {
        instance::confirm(&mut h.conn).map_err(|e| format!("--upgrade: {e}"))?;
        // The guards we were handed are ours now: remove them at exit.
        server.guards.own();
        sd_notify(&format!("MAINPID={}\nREADY=1", std::process::id()));
    } else {
        sd_notify("READY=1");
    }
    server.publish_table();
    let control = ControlThread::spawn(&server)?;
    serve(&mut server, &signals, &control, &live, cpus.len())?;
    Ok(drain(server, &signals, control, &live))
}

/// Start-up before any shard: takes the sockets over (`--upgrade`), claims
/// the guards, builds the runtime and the access log, binds the listeners.
fn load(start: Start, shards: usize) -> Result<(Server, Option<instance::Handed>), String> {
    let mut handed = if start.upgrade {
        let binds: Vec<SocketAddr> = start.config.listeners.iter().map(|l| l.bind).collect();
        let h = instance::take_over(&binds)?;
        crate::log_info!(
            "server",
            "took the listening sockets over from pid {}",
            h.pid
        );
        if let Some(m) = h.tickets {
            // Before any TLS listener is loaded: the clients of the old
            // instance resume their sessions here.
            crate::conn::handshake::adopt_ticket_master(m);
        }
        Some(h)
    } else {
        None
    };
    let mut guards = Guards::default();
    if let Some(h) = handed.as_mut() {
        guards.held = std::mem::take(&mut h.guards);
    }
    guards
        .claim(&guarded(&start.config))
        .map_err(|e| e.join("; "))?;
    crate::http::respond::set_server_header(start.config.server_header());
    let tls = crate::conn::handshake::load_all(&start.config).map_err(|e| e.join("; "))?;
    for w in &tls.warnings {
        crate::log_warn!("server", "{w}");
    }
    let mut rt = Runtime::new(start.config, shards);
    rt.attach_tls(tls.listeners);
    rt.up.attach_tls(tls.clusters);
    if let Some(cfg) = &rt.config.access_log {
        rt.access_log = Some(Arc::new(crate::observe::access_log::AccessLog::start(
            cfg, shards,
        )?));
    }
    let rt = Arc::new(rt);
    crate::fleet::attach(&rt);
    let mut server = Server {
        path: start.path,
        shards,
        listeners: Vec::new(),
        admin: None,
        rt: rt.clone(),
        mailboxes: (0..shards).map(|_| Arc::default()).collect(),
        guards,
        table: Arc::default(),
        generation: 1,
    };
    let inherited = handed
        .as_mut()
        .map(|h| (std::mem::take(&mut h.listeners), h.admin.take()));
    let (listeners, admin) = server.bind(&rt, inherited)?;
    server.listeners = listeners;
    server.admin = admin;
    Ok((server, handed))
}

/// Starts one shard per CPU, each on its first generation, and waits until
/// each accepts; tells the old instance to stop first on `--upgrade`.
fn start_shards(
    server: &mut Server,
    cpus: &[usize],
    handed: Option<&mut instance::Handed>,
) -> Result<Arc<AtomicUsize>, String> {
    let rt = server.rt.clone();
    if let Some(h) = handed {
        instance::stop_old(&mut h.conn).map_err(|e| format!("--upgrade: {e}"))?;
    }
    let live = Arc::new(AtomicUsize::new(0));
    let (tx, rx) = mpsc::channel::<BindReport>();
    for (i, &cpu) in cpus.iter().enumerate() {
        let first = server.update(i, &[]);
        spawn_shard(
            i,
            cpu,
            first,
            server.mailboxes[i].clone(),
            tx.clone(),
            live.clone(),
        )?;
        rx.recv()
            .map_err(|_| format!("shard {i} exited before binding"))??;
    }
    server.announce();
    // Every shard accepts: `/ready` answers 200 from the `ready` line on.
    LIFECYCLE.ready.store(true, Ordering::Release);
    crate::log_info!(
        "server",
        "ready ({} shards, {})",
        cpus.len(),
        rt.io_driver_name()
    );
    Ok(live)
}

/// The control channel's thread and what it reports back.
struct ControlThread {
    stop: Arc<AtomicBool>,
    handed_to: Arc<AtomicU32>,
    resume: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl ControlThread {
    /// Starts the thread that answers a new instance's `--upgrade`.
    fn spawn(server: &Server) -> Result<ControlThread, String> {
        let stop_control = Arc::new(AtomicBool::new(false));
        let handed_to = Arc::new(AtomicU32::new(0));
        let resume = Arc::new(AtomicBool::new(false));
        let mailboxes = server.mailboxes.clone();
        let thread = instance::spawn_control(instance::Control {
            table: server.table.clone(),
            stop: stop_control.clone(),
            handed_to: handed_to.clone(),
            stop_accepting: Box::new(move || {
                let seqs: Vec<u64> = mailboxes
                    .iter()
                    .map(|m| m.post(Command::StopAccepting))
                    .collect();
                let until = Instant::now() + APPLY_WAIT;
                for (m, s) in mailboxes.iter().zip(seqs) {
                    m.wait(s, until);
                }
            }),
            resume: resume.clone(),
        })
        .map_err(|e| format!("cannot start the control thread: {e}"))?;
        Ok(ControlThread {
            stop: stop_control,
            handed_to,
            resume,
            thread,
        })
    }
}

/// Answers signals until a drain signal or a hand-off; `Err` if a shard stopped.
fn serve(
    server: &mut Server,
    signals: &Signals,
    control: &ControlThread,
    live: &AtomicUsize,
    shards: usize,
) -> Result<(), String> {
    loop {
        crate::observe::log::flush_repeats();
        match signals.wait(Duration::from_millis(100)) {
            Some(Signal::Drain(sig)) => {
                crate::log_info!(
                    "server",
                    "signal {}: draining (up to {} ms)",
                    signals::name(sig),
                    server.rt.timeouts.drain.as_millis()
                );
                return Ok(());
            }
            Some(Signal::Reload) => server.reload(),
            Some(Signal::ReopenLogs) => {
                if let Some(log) = &server.rt.access_log {
                    log.reopen();
                }
                crate::process::lifecycle::reopen_logs();
            }
            Some(Signal::Ignored(sig)) => {
                crate::log_info!("server", "signal {}: ignored", signals::name(sig));
            }
            None => {}
        }
        if control.resume.swap(false, Ordering::AcqRel) {
            // A hand-off failed after the shards stopped: accept again.
            server.generation += 1;
            server.post_each(|i| Command::Apply(server.update(i, &[])));
            LIFECYCLE
                .generation
                .store(server.generation, Ordering::Release);
            crate::log_info!(
                "server",
                "accepting again (generation {})",
                server.generation
            );
        }
        let pid = control.handed_to.load(Ordering::Acquire);
        if pid != 0 {
            crate::log_info!(
                "server",
                "pid {pid} accepts on the listening sockets now; draining (up to {} ms)",
                server.rt.timeouts.drain.as_millis()
            );
            return Ok(());
        }
        if live.load(Ordering::Acquire) < shards {
            return Err("a shard stopped unexpectedly".into());
        }
    }
}

/// Stops the control thread, drains every shard within the drain timeout,
/// stops the access log; the exit status.
fn drain(mut server: Server, signals: &Signals, control: ControlThread, live: &AtomicUsize) -> i32 {
    control.stop.store(true, Ordering::Release);
    let _ = control.thread.join();
    // The guard names go with the sockets (or away): a new instance may start.
    if control.handed_to.load(Ordering::Acquire) != 0 {
        server.guards.disown();
        LIFECYCLE.handed_off.store(true, Ordering::Release);
    }
    drop(std::mem::take(&mut server.guards));
    LIFECYCLE.draining.store(true, Ordering::Release);
    sd_notify("STOPPING=1");
    server.rt.up.draining.store(true, Ordering::Release);
    server.post_all(|| Command::Drain);
    // The shards stopped accepting: closing these closes the listening
    // sockets once each shard served what it had already accepted.
    server.listeners.clear();
    server.admin = None;
    server.publish_table();
    // Shards drain within drain_timeout; allow a margin on top.
    let deadline = Instant::now() + server.rt.timeouts.drain + Duration::from_millis(500);
    let mut forced = false;
    while live.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
        if let Some(Signal::Drain(_)) = signals.wait(Duration::from_millis(20)) {
            crate::log_info!("server", "second signal: exiting now");
            forced = true;
            crate::process::lifecycle::cut_now(live, || {
                server.mailboxes.iter().for_each(|m| m.wake());
            });
            break;
        }
    }
    if let Some(log) = &server.rt.access_log {
        log.stop();
    }
    crate::observe::log::flush_repeats();
    let requests = LIFECYCLE.cut_requests.load(Ordering::Acquire);
    let conns = LIFECYCLE.cut_connections.load(Ordering::Acquire);
    if forced || live.load(Ordering::Acquire) > 0 || conns > 0 || requests > 0 {
        crate::log_info!(
            "server", "drain deadline passed: cut {conns} connection(s), {requests} request(s) in flight; exit status {EXIT_DRAIN_CUT}"
        );
        crate::log_info!("server", "stopped");
        return EXIT_DRAIN_CUT;
    }
    crate::log_info!("server", "stopped");
    0
}

/// The addresses guarded against a second instance, with their config paths.
fn guarded(config: &Config) -> Vec<(String, SocketAddr)> {
    let mut v: Vec<(String, SocketAddr)> = config
        .listeners
        .iter()
        .enumerate()
        .map(|(i, l)| (format!("listeners[{i}].bind"), l.bind))
        .collect();
    if let Some(a) = &config.admin {
        v.push(("admin.bind".into(), a.bind));
    }
    v
}

struct Server {
    path: PathBuf,
    shards: usize,
    listeners: Vec<Bound>,
    admin: Option<Bound>,
    rt: Arc<Runtime>,
    mailboxes: Vec<Arc<Mailbox>>,
    guards: Guards,
    /// What a hand-off sends (raw descriptors of `listeners`, `admin`, `guards`).
    table: Arc<Mutex<Table>>,
    generation: u64,
}

type Inherited = (
    Vec<(SocketAddr, Vec<OwnedFd>)>,
    Option<(SocketAddr, OwnedFd)>,
);

impl Server {
    /// The sockets `rt` listens on: kept from `self` (same configured bind),
    /// taken from `inherited` (a hand-off), or bound now. Binding errors are
    /// every one reported, with the listener's path.
    fn bind(
        &mut self,
        rt: &Runtime,
        inherited: Option<Inherited>,
    ) -> Result<(Vec<Bound>, Option<Bound>), String> {
        let (mut from_old, mut old_admin) = inherited.unwrap_or_default();
        let mut errors = Vec::new();
        // The sockets held now, by position: a kept one is taken out, and a
        // failure puts it back where it was (the current runtime's indices).
        let mut held: Vec<Option<Bound>> = std::mem::take(&mut self.listeners)
            .into_iter()
            .map(Some)
            .collect();
        let mut out: Vec<(Option<usize>, Bound)> = Vec::new();
        for (i, l) in rt.listeners.iter().enumerate() {
            // The socket of the listener with this bind and this name, else of the
            // first with this bind: several listeners on "127.0.0.1:0" each keep
            // their own port across a reload that reorders them.
            let same_bind = |p: &usize| held[*p].as_ref().is_some_and(|b| b.key == l.bind);
            let pos = (0..held.len())
                .filter(same_bind)
                .find(|&p| self.rt.listeners.get(p).is_some_and(|o| o.name == l.name))
                .or_else(|| (0..held.len()).find(same_bind));
            let handed = from_old.iter().position(|(k, _)| *k == l.bind);
            let mut b = match (pos, handed) {
                (Some(p), _) => held[p].take().expect("found above"),
                (None, Some(h)) => {
                    let (key, fds) = from_old.remove(h);
                    let actual = crate::io::local_addr(fds[0].as_raw_fd()).unwrap_or(key);
                    Bound { key, actual, fds }
                }
                (None, None) => Bound {
                    key: l.bind,
                    actual: l.bind,
                    fds: Vec::new(),
                },
            };
            // One socket per shard at least; the first fixes a port 0.
            while b.fds.len() < self.shards {
                match bind_fd(b.actual) {
                    Ok(fd) => {
                        if b.fds.is_empty() {
                            b.actual = crate::io::local_addr(fd.as_raw_fd()).unwrap_or(b.actual);
                        }
                        b.fds.push(fd);
                    }
                    Err(e) => {
                        errors.push(format!("listeners[{i}]: cannot bind {}: {e}", l.bind));
                        break;
                    }
                }
            }
            out.push((pos, b));
        }
        let mut admin_kept = false;
        let admin = match rt.config.admin.as_ref().map(|a| a.bind) {
            None => None,
            Some(bind) => match (&self.admin, &mut old_admin) {
                (Some(a), _) if a.key == bind => {
                    admin_kept = true;
                    self.admin.take()
                }
                (_, Some((k, _))) if *k == bind => old_admin.take().map(|(key, fd)| Bound {
                    key,
                    actual: crate::io::local_addr(fd.as_raw_fd()).unwrap_or(key),
                    fds: vec![fd],
                }),
                _ => match bind_fd(bind) {
                    Ok(fd) => Some(Bound {
                        key: bind,
                        actual: crate::io::local_addr(fd.as_raw_fd()).unwrap_or(bind),
                        fds: vec![fd],
                    }),
                    Err(e) => {
                        errors.push(format!("admin: cannot bind {bind}: {e}"));
                        None
                    }
                },
            },
        };
        if !errors.is_empty() {
            // Nothing changes: the kept sockets go back in their places (a
            // socket kept but topped up loses only the new ones), every
            // socket bound here closes as it drops.
            for (pos, b) in out {
                if let Some(p) = pos {
                    held[p] = Some(b);
                }
            }
            self.listeners = held.into_iter().flatten().collect();
            if admin_kept {
                self.admin = admin;
            }
            return Err(errors.join("; "));
        }
        // Listeners the new runtime drops stay in `self` for the caller.
        self.listeners = held.into_iter().flatten().collect();
        Ok((out.into_iter().map(|(_, b)| b).collect(), admin))
    }

    /// Shard `i`'s part of the current generation: duplicates of the sockets
    /// it accepts on; `None` for listeners in `kept` (it has them already).
    fn update(&self, i: usize, kept: &[SocketAddr]) -> Update {
        let mut listeners = Vec::new();
        for (index, b) in self.listeners.iter().enumerate() {
            if kept.contains(&b.key) {
                listeners.push(ListenerFd {
                    key: b.key,
                    index,
                    fd: None,
                });
                continue;
            }
            for fd in b.fds.iter().skip(i).step_by(self.shards) {
                listeners.push(ListenerFd {
                    key: b.key,
                    index,
                    fd: dup(fd),
                });
            }
        }
        let admin = match (&self.admin, i) {
            (Some(a), 0) => dup(&a.fds[0]),
            _ => None,
        };
        Update {
            generation: self.generation,
            rt: self.rt.clone(),
            listeners,
            admin,
        }
    }

    fn announce(&self) {
        for (i, b) in self.listeners.iter().enumerate() {
            crate::log_info!(
                "server",
                "listener {i} on {} (name {:?})",
                b.actual,
                self.rt.listeners[i].name
            );
        }
        if let Some(a) = &self.admin {
            crate::log_info!("server", "admin on {}", a.actual);
        }
    }

    fn publish_table(&self) {
        let mut t = self.table.lock().unwrap_or_else(|p| p.into_inner());
        t.listeners = self
            .listeners
            .iter()
            .map(|b| (b.key, b.fds.iter().map(AsRawFd::as_raw_fd).collect()))
            .collect();
        t.admin = self.admin.as_ref().map(|a| (a.key, a.fds[0].as_raw_fd()));
        t.guards = self
            .guards
            .held
            .iter()
            .map(|g| (g.path.clone(), g.listener.as_raw_fd()))
            .collect();
        t.tickets = crate::conn::handshake::current_ticket_master();
    }

    /// Posts a command to every shard and waits (bounded) until each did it.
    fn post_all(&self, cmd: impl Fn() -> Command) {
        self.post_each(|_| cmd());
    }

    fn post_each(&self, cmd: impl Fn(usize) -> Command) -> bool {
        let seqs: Vec<u64> = self
            .mailboxes
            .iter()
            .enumerate()
            .map(|(i, m)| m.post(cmd(i)))
            .collect();
        let until = Instant::now() + APPLY_WAIT;
        self.mailboxes
            .iter()
            .zip(seqs)
            .all(|(m, s)| m.wait(s, until))
    }

    /// A reload was rejected after claiming its guards: hold exactly the
    /// current config's again (the new addresses' guards close).
    fn unclaim(&mut self) {
        if let Err(errors) = self.guards.claim(&guarded(&self.rt.config)) {
            for e in &errors {
                crate::log_warn!("server", "reload: {e}");
            }
        }
    }

    /// SIGHUP: validate the file like `--check`; apply it or keep serving.
    fn reload(&mut self) {
        let g = self.generation;
        crate::log_info!("server", "signal HUP: reloading {}", self.path.display());
        crate::process::lifecycle::notify_reloading();
        if let Err(why) = self.try_reload() {
            LIFECYCLE.reloads_rejected.fetch_add(1, Ordering::AcqRel);
            crate::log_warn!(
                "server",
                "reload rejected ({why}); still serving generation {g}"
            );
            // systemd counts READY=1 as the reload's end whatever came
            // before; the unit's ExecReload= (`zgix --check`) is what fails
            // `systemctl reload` on a bad file. STATUS= shows the rest.
            sd_notify(&format!(
                "STATUS=reload rejected ({why}); serving generation {g}\nREADY=1"
            ));
        }
    }

    /// The reload's phases: read and check the file, build the new runtime,
    /// bind, then hand it to the shards. `Err`: why it was rejected (logged).
    fn try_reload(&mut self) -> Result<(), String> {
        let (config, tls) = self.read_reload()?;
        let (rt, notes, stop_old_log) = self.reloaded_runtime(config, tls)?;
        let kept: Vec<SocketAddr> = self
            .listeners
            .iter()
            .map(|b| b.key)
            .filter(|k| rt.listeners.iter().any(|l| l.bind == *k))
            .collect();
        let (listeners, admin) = match self.bind(&rt, None) {
            Ok(x) => x,
            Err(e) => {
                crate::log_error!("server", "reload: {e}");
                if let (Some(new), Some(_)) = (&rt.access_log, &stop_old_log) {
                    new.stop();
                }
                self.unclaim();
                return Err("cannot bind".into());
            }
        };
        let removed = self.listeners.len();
        let added = listeners.iter().filter(|b| !kept.contains(&b.key)).count();
        let old_rt = std::mem::replace(&mut self.rt, Arc::new(rt));
        crate::fleet::attach(&self.rt);
        // Sockets of removed listeners close here; the shards close theirs
        // when they take the new generation.
        self.listeners = listeners;
        self.admin = admin;
        self.generation += 1;
        for n in &notes {
            crate::log_warn!("server", "reload: {n}");
        }
        let all = self.post_each(|i| Command::Apply(self.update(i, &kept)));
        // The old runtime's resolver (and prober) stop; connections still on
        // it finish with the addresses they have.
        old_rt.up.draining.store(true, Ordering::Release);
        let _resolver = crate::upstream::resolver::spawn_resolver(self.rt.up.clone());
        // Lines of connections still on the old runtime after this are lost.
        if let Some(log) = stop_old_log {
            log.stop();
        }
        self.publish_table();
        LIFECYCLE
            .generation
            .store(self.generation, Ordering::Release);
        LIFECYCLE.reloads_applied.fetch_add(1, Ordering::AcqRel);
        self.announce();
        crate::log_info!(
            "server", "reload applied: generation {} ({} listener(s) kept, {added} added, {removed} removed){}",
            self.generation,
            kept.len(),
            if all { "" } else { "; a shard has not taken it yet" }
        );
        sd_notify(&format!(
            "STATUS=serving generation {}\nREADY=1",
            self.generation
        ));
        Ok(())
    }

    /// The reload's first phase: the file parsed and validated, the shard
    /// count unchanged, its listen addresses claimed, its certificates and
    /// keys read (a file that does not load refuses the whole reload, and
    /// the old ones keep serving).
    fn read_reload(&mut self) -> Result<(Config, crate::conn::handshake::LoadedTls), String> {
        let config = Config::from_file(&self.path).map_err(|errors| {
            for e in &errors {
                crate::log_error!("server", "reload: {e}");
            }
            format!("{} error(s)", errors.len())
        })?;
        if config.shard_cpus().len() != self.shards {
            crate::log_error!(
                "server", "reload: cpus: the shard count cannot change on reload ({} now); restart or use --upgrade",
                self.shards
            );
            return Err("cpus changed".into());
        }
        if let Err(errors) = self.guards.claim(&guarded(&config)) {
            for e in &errors {
                crate::log_error!("server", "reload: {e}");
            }
            self.unclaim();
            return Err("a listen address is served by another instance".into());
        }
        match crate::conn::handshake::load_all(&config) {
            Ok(tls) => Ok((config, tls)),
            Err(errors) => {
                for e in &errors {
                    crate::log_error!("server", "reload: {e}");
                }
                self.unclaim();
                Err(format!("{} error(s)", errors.len()))
            }
        }
    }

    /// The reload's second phase: the new runtime with its certificates and
    /// its access log (the running one when unchanged, else a new one; the
    /// old log, returned, is stopped once the shards moved on).
    fn reloaded_runtime(
        &mut self,
        config: Config,
        tls: crate::conn::handshake::LoadedTls,
    ) -> Result<(Runtime, Vec<String>, OldLog), String> {
        for w in &tls.warnings {
            crate::log_warn!("server", "reload: {w}");
        }
        let (mut rt, notes) = Runtime::reloaded(config, self.shards, &self.rt);
        rt.attach_tls(tls.listeners);
        rt.up.attach_tls(tls.clusters);
        if rt.config.access_log == self.rt.config.access_log {
            rt.access_log = self.rt.access_log.clone();
            return Ok((rt, notes, None));
        }
        if let Some(cfg) = &rt.config.access_log {
            match crate::observe::access_log::AccessLog::start(cfg, self.shards) {
                Ok(log) => rt.access_log = Some(Arc::new(log)),
                Err(e) => {
                    crate::log_error!("server", "reload: {e}");
                    self.unclaim();
                    return Err("cannot open the access log".into());
                }
            }
        }
        Ok((rt, notes, self.rt.access_log.clone()))
    }
}

/// The access log a reload replaced, stopped once the shards moved on.
type OldLog = Option<Arc<crate::observe::access_log::AccessLog>>;

fn bind_fd(addr: SocketAddr) -> std::io::Result<OwnedFd> {
    let fd = crate::io::bind_listener(addr)?;
    // SAFETY: bind_listener returns a fresh descriptor the caller owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn dup(fd: &OwnedFd) -> Option<RawFd> {
    // SAFETY: fcntl(F_DUPFD_CLOEXEC) on an open descriptor; checked.
    let d = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
    if d < 0 {
        crate::log_info!(
            "server",
            "cannot duplicate a listening socket: {}",
            std::io::Error::last_os_error()
        );
        return None;
    }
    Some(d)
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
    first: Update,
    mailbox: Arc<Mailbox>,
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
        shard::run(id, first, mailbox, report).await;
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
