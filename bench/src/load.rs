//! `zgix-bench load`: an HTTP/1.1 keep-alive load generator, closed loop like
//! wrk or open loop with coordinated-omission correction like wrk2.
//!
//! Engine choice: glommio executors, not std threads with blocking sockets.
//! Measured on the 2-core dev box against `zgix-bench origin`, everything
//! pinned to one CPU, 64 connections, the quietest runs: glommio ~64k req/s,
//! `wrk -t1` ~68k, 64 blocking threads ~70k; at 1000 connections all three
//! land within the (large) noise of a shared box. Throughput alone does not
//! decide it, so the rest does: a blocking client needs a thread per
//! connection (thousands for connection-limit and many-client runs), pays
//! two context switches per request, and its open-loop schedule becomes
//! thousands of sleeping threads whose wake-up jitter lands in the latencies
//! it reports. One executor keeps every connection on one thread, tries
//! `send`/`recv` directly (MSG_DONTWAIT) and batches readiness waits and
//! timers through io_uring, so the schedule and the clock are one loop's.
//! `--threads` adds executors when one core is not enough.

use crate::args::{parse_cpu_list, Args};
use crate::executor;
use crate::proxy_header::{self, Version};
use futures_lite::AsyncWriteExt;
use glommio::net::TcpStream;
use hdrhistogram::Histogram;
use response::ResponseReader;
use std::collections::BTreeMap;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, ToSocketAddrs};
use std::os::unix::io::FromRawFd;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tls::Conn;

pub const USAGE: &str = "\
zgix-bench load --url http://127.0.0.1:PORT/path [options]

  --url URL             target, http:// or https:// (TLS with rustls, ALPN http/1.1,
                        the certificate not checked); host must be an IP or localhost
  --connections N       keep-alive connections, one request in flight each (default 64)
  --duration S          seconds to run, fractions allowed (default 5)
  --rate R              open loop: R requests/s in total, latency measured from each
                        request's scheduled send time (coordinated omission corrected,
                        like wrk2); default is closed loop like wrk
  --sources N           spread connections over N source addresses 127.0.0.2.. (bound
                        before connect); needs a 127.0.0.0/8 target
  --proxy-header v1|v2  start each connection with a PROXY header carrying a distinct
                        fake client address from 198.18.0.0/15 (RFC 2544 benchmark range)
  --threads T           glommio executors (default 1)
  --cpus LIST           pin executor i to the i-th CPU of LIST (default: not pinned)
  --header \"K: V\"       extra request header, repeatable
  --timeout-ms N        per-response and per-connect timeout (default 2000)
  --allow-remote        permit a target outside 127.0.0.0/8 and ::1
  --json                print one JSON object instead of the text report

Latencies are in microseconds. Connections the server closes are reopened and
counted as reconnects. A progress line goes to stderr every second on runs over 3 s.

A run whose target stalls prints no figures: when no request completes, or at
least half the connections time out (--timeout-ms) at least once, it names the
target on stderr and exits 1.";

/// Default connection count: enough to keep a single-shard proxy busy on a
/// small box without measuring mostly queueing.
pub const DEFAULT_CONNECTIONS: usize = 64;
/// wrk's default timeout; a response slower than this is an error, not a sample.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);
/// Highest latency the histogram tracks (1 hour in µs); slower ones saturate.
const HIST_MAX_US: u64 = 3_600_000_000;
/// Pause after a failed connect so a refusing server is not hammered in a spin.
const CONNECT_BACKOFF: Duration = Duration::from_millis(10);
/// A run in which at least this share of the connections timed out (a
/// connect, a send or a response slower than `--timeout-ms`) measured a
/// stalled target, not its speed: a server that is merely slow under load
/// times out a few connections, one that stopped serving times out all.
const STALL_SHARE: f64 = 0.5;

/// Load-run settings.
#[derive(Clone, Debug)]
pub struct LoadConfig {
    pub target: SocketAddr,
    pub host: String,
    pub path: String,
    pub connections: usize,
    pub duration: Duration,
    pub rate: Option<f64>,
    pub sources: usize,
    pub proxy_header: Option<Version>,
    pub threads: usize,
    pub cpus: Option<Vec<usize>>,
    pub headers: Vec<String>,
    pub timeout: Duration,
    pub json: bool,
    /// Set for an `https://` URL: every connection speaks TLS.
    pub tls: Option<Arc<rustls::ClientConfig>>,
}

impl LoadConfig {
    /// A closed-loop run with defaults, for callers inside this crate (the demo).
    pub fn new(target: SocketAddr, path: &str, connections: usize, duration: Duration) -> Self {
        LoadConfig {
            target,
            host: target.to_string(),
            path: path.to_string(),
            connections,
            duration,
            rate: None,
            sources: 0,
            proxy_header: None,
            threads: 1,
            cpus: None,
            headers: Vec::new(),
            timeout: DEFAULT_TIMEOUT,
            json: false,
            tls: None,
        }
    }

    /// Parses the `load` subcommand's flags.
    pub fn from_args(mut a: Args) -> Result<Self, String> {
        let url = a
            .value("--url")?
            .ok_or("load needs --url http://HOST:PORT/path")?;
        let (https, url) = tls::scheme(&url);
        let (target, host, path) = parse_url(&url)?;
        let mut cfg = LoadConfig::new(target, &path, DEFAULT_CONNECTIONS, Duration::from_secs(5));
        cfg.host = host;
        cfg.tls = https.then(tls::client_config);
        if let Some(c) = a.parsed("--connections")? {
            cfg.connections = c;
        }
        if let Some(d) = a.parsed::<f64>("--duration")? {
            if !(d > 0.0 && d < 86_400.0) {
                return Err("--duration must be between 0 and 86400 seconds".into());
            }
            cfg.duration = Duration::from_secs_f64(d);
        }
        cfg.rate = a.parsed("--rate")?;
        if cfg.rate.is_some_and(|r| r.is_nan() || r <= 0.0) {
            return Err("--rate must be positive".into());
        }
        cfg.sources = a.parsed("--sources")?.unwrap_or(0);
        cfg.proxy_header = a.parsed("--proxy-header")?;
        cfg.threads = a.parsed("--threads")?.unwrap_or(1);
        cfg.cpus = a.value("--cpus")?.map(|s| parse_cpu_list(&s)).transpose()?;
        cfg.headers = a.values("--header")?;
        if let Some(ms) = a.parsed::<u64>("--timeout-ms")? {
            cfg.timeout = Duration::from_millis(ms.max(1));
        }
        cfg.json = a.switch("--json");
        let allow_remote = a.switch("--allow-remote");
        a.finish()?;

        if cfg.connections == 0 || cfg.threads == 0 {
            return Err("--connections and --threads must be at least 1".into());
        }
        if cfg.threads > cfg.connections {
            cfg.threads = cfg.connections;
        }
        if let Some(cpus) = &cfg.cpus {
            if cpus.len() < cfg.threads {
                return Err(format!(
                    "--cpus lists {} CPUs for {} threads",
                    cpus.len(),
                    cfg.threads
                ));
            }
        }
        if !allow_remote && !cfg.target.ip().is_loopback() {
            return Err(format!(
                "{} is not a loopback address; pass --allow-remote to load it",
                cfg.target
            ));
        }
        if cfg.sources > 0 && !matches!(cfg.target, SocketAddr::V4(a) if a.ip().is_loopback()) {
            return Err(
                "--sources binds 127.0.0.x addresses and needs a 127.0.0.0/8 target".into(),
            );
        }
        if cfg.proxy_header.is_some() && !cfg.target.is_ipv4() {
            return Err("--proxy-header sends TCP4 headers and needs an IPv4 target".into());
        }
        Ok(cfg)
    }

    fn request_bytes(&self) -> Vec<u8> {
        let mut r = format!("GET {} HTTP/1.1\r\nHost: {}\r\n", self.path, self.host);
        for h in &self.headers {
            r.push_str(h);
            r.push_str("\r\n");
        }
        r.push_str("\r\n");
        r.into_bytes()
    }
}

/// Splits `http://host[:port][/path]` into a resolved address, the Host header
/// value, and the path.
pub fn parse_url(url: &str) -> Result<(SocketAddr, String, String), String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("--url {url:?}: only http:// URLs are supported"))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].to_string()),
        None => (rest, "/".to_string()),
    };
    if authority.is_empty() {
        return Err(format!("--url {url:?}: missing host"));
    }
    let with_port = if authority.ends_with(']') || !authority.contains(':') {
        format!("{authority}:80")
    } else {
        authority.to_string()
    };
    let target = with_port
        .to_socket_addrs()
        .map_err(|e| format!("--url {url:?}: {e}"))?
        .next()
        .ok_or_else(|| format!("--url {url:?}: host does not resolve"))?;
    Ok((target, authority.to_string(), path))
}

/// Error counters, by where the request failed.
#[derive(Clone, Copy, Debug, Default)]
pub struct Errors {
    pub connect: u64,
    pub read: u64,
    pub write: u64,
    pub timeout: u64,
    /// Responses that could not be framed.
    pub parse: u64,
}

impl Errors {
    fn add(&mut self, o: &Errors) {
        self.connect += o.connect;
        self.read += o.read;
        self.write += o.write;
        self.timeout += o.timeout;
        self.parse += o.parse;
    }

    /// All errors together.
    pub fn total(&self) -> u64 {
        self.connect + self.read + self.write + self.timeout + self.parse
    }
}

/// What one executor (and, merged, the whole run) observed.
pub struct Stats {
    pub hist: Histogram<u64>,
    pub status: BTreeMap<u16, u64>,
    pub errors: Errors,
    pub reconnects: u64,
    pub completed: u64,
    pub bytes_read: u64,
    /// Connection slots that saw at least one timeout.
    pub timed_out_connections: u64,
}

impl Stats {
    fn new() -> Self {
        Stats {
            hist: Histogram::new_with_bounds(1, HIST_MAX_US, 3).expect("valid histogram bounds"),
            status: BTreeMap::new(),
            errors: Errors::default(),
            reconnects: 0,
            completed: 0,
            bytes_read: 0,
            timed_out_connections: 0,
        }
    }

    fn merge(&mut self, o: &Stats) {
        self.hist.add(&o.hist).expect("histograms share bounds");
        for (s, n) in &o.status {
            *self.status.entry(*s).or_default() += n;
        }
        self.errors.add(&o.errors);
        self.reconnects += o.reconnects;
        self.completed += o.completed;
        self.bytes_read += o.bytes_read;
        self.timed_out_connections += o.timed_out_connections;
    }
}

/// The result of a run.
pub struct Report {
    pub stats: Stats,
    pub elapsed: Duration,
    pub target: SocketAddr,
    pub connections: usize,
    pub rate: Option<f64>,
    pub timeout: Duration,
}

impl Report {
    /// Completed responses per second of wall time.
    pub fn requests_per_sec(&self) -> f64 {
        self.stats.completed as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Why this run measured a stalled target rather than its speed, if it
    /// did: no request completed, or at least [`STALL_SHARE`] of the
    /// connections timed out.
    pub fn stalled(&self) -> Option<String> {
        let s = &self.stats;
        let e = &s.errors;
        let errors = format!(
            "errors: connect={} read={} write={} timeout={} parse={}",
            e.connect, e.read, e.write, e.timeout, e.parse
        );
        if s.completed == 0 {
            return Some(format!(
                "target {} stalled: no request completed in {:.1}s over {} connections ({errors})",
                self.target,
                self.elapsed.as_secs_f64(),
                self.connections
            ));
        }
        let timed_out = s.timed_out_connections;
        if timed_out as f64 >= STALL_SHARE * self.connections as f64 {
            return Some(format!(
                "target {} stalled: {timed_out} of {} connections timed out (nothing within {} ms) \
                 after {} requests in {:.1}s ({errors})",
                self.target,
                self.connections,
                self.timeout.as_millis(),
                s.completed,
                self.elapsed.as_secs_f64()
            ));
        }
        None
    }

    fn percentiles(&self) -> [(&'static str, u64); 5] {
        let h = &self.stats.hist;
        [
            ("p50", h.value_at_quantile(0.50)),
            ("p90", h.value_at_quantile(0.90)),
            ("p99", h.value_at_quantile(0.99)),
            ("p99.9", h.value_at_quantile(0.999)),
            ("max", h.max()),
        ]
    }

    /// The human-readable report.
    pub fn text(&self) -> String {
        let s = &self.stats;
        let mode = match self.rate {
            Some(r) => format!("open loop at {r} req/s"),
            None => "closed loop".to_string(),
        };
        let mut out = format!(
            "{} requests in {:.2}s over {} connections ({mode}), {:.1} MB read\n\
             requests/s: {:.1}\n",
            s.completed,
            self.elapsed.as_secs_f64(),
            self.connections,
            s.bytes_read as f64 / 1e6,
            self.requests_per_sec()
        );
        let statuses: Vec<String> = s.status.iter().map(|(k, v)| format!("{k}={v}")).collect();
        out.push_str(&format!("status: {}\n", statuses.join(" ")));
        let e = &s.errors;
        out.push_str(&format!(
            "errors: connect={} read={} write={} timeout={} parse={}; reconnects={}\n",
            e.connect, e.read, e.write, e.timeout, e.parse, s.reconnects
        ));
        let lat: Vec<String> = self
            .percentiles()
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        out.push_str(&format!("latency us: {}\n", lat.join(" ")));
        out
    }

    /// The same as one JSON object.
    pub fn json(&self) -> serde_json::Value {
        let s = &self.stats;
        let status: serde_json::Map<String, serde_json::Value> = s
            .status
            .iter()
            .map(|(k, v)| (k.to_string(), (*v).into()))
            .collect();
        let latency: serde_json::Map<String, serde_json::Value> = self
            .percentiles()
            .iter()
            .map(|(k, v)| (k.to_string(), (*v).into()))
            .collect();
        serde_json::json!({
            "requests": s.completed,
            "duration_s": self.elapsed.as_secs_f64(),
            "connections": self.connections,
            "rate": self.rate,
            "requests_per_sec": self.requests_per_sec(),
            "bytes_read": s.bytes_read,
            "status": status,
            "errors": {
                "connect": s.errors.connect,
                "read": s.errors.read,
                "write": s.errors.write,
                "timeout": s.errors.timeout,
                "parse": s.errors.parse,
            },
            "reconnects": s.reconnects,
            "timed_out_connections": s.timed_out_connections,
            "latency_us": latency,
        })
    }
}

/// Runs the `load` subcommand and prints its report; a stalled target is an
/// error instead (no figures).
pub fn run(cfg: LoadConfig) -> Result<(), String> {
    let report = execute(&cfg, true)?;
    if let Some(why) = report.stalled() {
        return Err(format!("{why}; no figures reported"));
    }
    if cfg.json {
        println!("{}", report.json());
    } else {
        print!("{}", report.text());
    }
    Ok(())
}

/// Runs a load test and returns the merged report. `progress` allows the
/// per-second stderr line (only on runs longer than 3 s).
pub fn execute(cfg: &LoadConfig, progress: bool) -> Result<Report, String> {
    let request: Arc<[u8]> = cfg.request_bytes().into();
    let start = Instant::now();
    let deadline = start + cfg.duration;
    let finished = Arc::new(AtomicUsize::new(0));
    let mut counters = Vec::new();
    let mut handles = Vec::new();
    for t in 0..cfg.threads {
        let conns: Vec<usize> = (t..cfg.connections).step_by(cfg.threads).collect();
        let counter = Arc::new(AtomicU64::new(0));
        counters.push(counter.clone());
        let (cfg2, request, finished) = (cfg.clone(), request.clone(), finished.clone());
        let cpu = cfg.cpus.as_ref().map(|c| c[t]);
        let handle = executor::spawn(&format!("load-{t}"), cpu, move || async move {
            let stats = run_executor(cfg2, conns, request, start, deadline, counter).await;
            finished.fetch_add(1, Ordering::Release);
            stats
        })?;
        handles.push(handle);
    }

    let show = progress && cfg.duration > Duration::from_secs(3);
    let mut last = (start, 0u64);
    let mut tick = start + Duration::from_secs(1);
    while finished.load(Ordering::Acquire) < handles.len() {
        std::thread::sleep(Duration::from_millis(20));
        let now = Instant::now();
        if show && now >= tick && now < deadline {
            let done: u64 = counters.iter().map(|c| c.load(Ordering::Relaxed)).sum();
            let rate = (done - last.1) as f64 / (now - last.0).as_secs_f64();
            eprintln!(
                "load: {:>4.0}s {:>10} requests {:>10.0} req/s",
                (now - start).as_secs_f64(),
                done,
                rate
            );
            last = (now, done);
            tick += Duration::from_secs(1);
        }
    }
    let elapsed = start.elapsed();
    let mut stats = Stats::new();
    for h in handles {
        stats.merge(&h.join());
    }
    Ok(Report {
        stats,
        elapsed,
        target: cfg.target,
        connections: cfg.connections,
        rate: cfg.rate,
        timeout: cfg.timeout,
    })
}

async fn run_executor(
    cfg: LoadConfig,
    conns: Vec<usize>,
    request: Arc<[u8]>,
    start: Instant,
    deadline: Instant,
    counter: Arc<AtomicU64>,
) -> Stats {
    let ctx = Rc::new(Ctx {
        request: request.to_vec(),
        // Each connection gets an equal share of the total rate; its first
        // send is staggered so the connections do not fire in lockstep.
        interval: cfg
            .rate
            .map(|r| Duration::from_secs_f64(cfg.connections as f64 / r)),
        cfg,
        start,
        deadline,
        counter,
    });
    let tasks: Vec<_> = conns
        .into_iter()
        .map(|i| glommio::spawn_local(connection(ctx.clone(), i)))
        .collect();
    let mut stats = Stats::new();
    for t in tasks {
        stats.merge(&t.await);
    }
    stats
}

/// Per-executor read-only state shared by its connection tasks.
struct Ctx {
    cfg: LoadConfig,
    request: Vec<u8>,
    interval: Option<Duration>,
    start: Instant,
    deadline: Instant,
    counter: Arc<AtomicU64>,
}

/// How a request attempt failed.
enum Failure {
    Write(io::Error),
    Read(io::Error),
    Parse,
}

fn is_timeout(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::TimedOut
}

/// One connection slot: keeps a connection open and one request in flight
/// until the deadline, reopening the connection whenever it is lost.
async fn connection(ctx: Rc<Ctx>, index: usize) -> Stats {
    let cfg = &ctx.cfg;
    let mut stats = Stats::new();
    let mut stream: Option<Conn> = None;
    let mut opened = 0u64;
    let mut timed_out = false;
    let mut reader = ResponseReader::new();
    let mut next_send = ctx
        .interval
        .map(|iv| ctx.start + iv.mul_f64(index as f64 / cfg.connections as f64));
    let preface = cfg.proxy_header.map(|v| {
        let dst = match cfg.target {
            SocketAddr::V4(a) => a,
            SocketAddr::V6(_) => unreachable!("checked in from_args"),
        };
        proxy_header::encode(v, proxy_header::fake_source(index), dst)
    });
    let mut first_write = Vec::with_capacity(ctx.request.len() + 64);

    while Instant::now() < ctx.deadline {
        // Open loop: wait for this request's slot; latency counts from the
        // slot, not from the actual send, so a stalled server is charged for
        // the requests it delayed (wrk2's coordinated-omission correction).
        let t0 = match (&mut next_send, ctx.interval) {
            (Some(at), Some(iv)) => {
                let slot = *at;
                *at += iv;
                let now = Instant::now();
                if slot > now {
                    glommio::timer::sleep(slot - now).await;
                }
                if slot >= ctx.deadline {
                    break;
                }
                slot
            }
            _ => Instant::now(),
        };

        if stream.is_none() {
            match glommio::timer::timeout(cfg.timeout, async {
                connect(cfg, index)
                    .await
                    .map_err(glommio::GlommioError::from)
            })
            .await
            {
                Ok(s) => {
                    let _ = s.set_nodelay(true);
                    let _ = s.set_read_timeout(Some(cfg.timeout));
                    if opened > 0 {
                        stats.reconnects += 1;
                    }
                    opened += 1;
                    reader.reset();
                    stream = Some(match &cfg.tls {
                        None => Conn::Plain(s),
                        Some(c) => match Conn::tls(s, c, &cfg.host) {
                            Ok(c) => c,
                            Err(_) => {
                                stats.errors.connect += 1;
                                continue;
                            }
                        },
                    });
                }
                Err(e) => {
                    timed_out |= matches!(e, glommio::GlommioError::TimedOut(_));
                    stats.errors.connect += 1;
                    glommio::timer::sleep(CONNECT_BACKOFF).await;
                    continue;
                }
            }
            // A PROXY header leads the connection, in the same write as the
            // first request.
            first_write.clear();
            if let Some(p) = &preface {
                first_write.extend_from_slice(p);
            }
            first_write.extend_from_slice(&ctx.request);
        } else {
            first_write.clear();
        }
        let s = stream.as_mut().expect("connected above");
        let out: &[u8] = if first_write.is_empty() {
            &ctx.request
        } else {
            &first_write
        };
        match exchange(s, out, &mut reader).await {
            Ok((status, close, bytes)) => {
                let us = t0.elapsed().as_micros().min(u128::from(HIST_MAX_US)) as u64;
                stats.hist.saturating_record(us.max(1));
                *stats.status.entry(status).or_default() += 1;
                stats.completed += 1;
                stats.bytes_read += bytes;
                ctx.counter.fetch_add(1, Ordering::Relaxed);
                if close {
                    stream = None;
                }
            }
            Err(f) => {
                match f {
                    Failure::Write(e) | Failure::Read(e) if is_timeout(&e) => {
                        stats.errors.timeout += 1;
                        timed_out = true;
                    }
                    Failure::Write(_) => stats.errors.write += 1,
                    Failure::Read(_) => stats.errors.read += 1,
                    Failure::Parse => stats.errors.parse += 1,
                }
                stream = None;
            }
        }
    }
    stats.timed_out_connections = u64::from(timed_out);
    stats
}

/// Sends one request and reads its whole response. Returns the status, whether
/// the connection must be closed after it, and the bytes read.
async fn exchange(
    s: &mut Conn,
    request: &[u8],
    reader: &mut ResponseReader,
) -> Result<(u16, bool, u64), Failure> {
    s.write_all(request).await.map_err(Failure::Write)?;
    if matches!(s, Conn::Tls(_)) {
        s.flush().await.map_err(Failure::Write)?;
    }
    reader.read_response(s).await
}

/// Opens a connection, from a chosen 127.0.0.x source when `--sources` is set.
async fn connect(cfg: &LoadConfig, index: usize) -> io::Result<TcpStream> {
    if cfg.sources == 0 {
        return TcpStream::connect(cfg.target)
            .await
            .map_err(io::Error::from);
    }
    let SocketAddr::V4(dst) = cfg.target else {
        unreachable!("checked in from_args")
    };
    // 127.0.0.1 is usually the server's own address, so sources start at .2.
    let base = u32::from(Ipv4Addr::new(127, 0, 0, 2));
    let src = Ipv4Addr::from(base + (index % cfg.sources) as u32);
    connect_from(src, dst).await
}

/// Non-blocking connect from `src`: glommio's connect cannot bind first, so
/// the socket is made here and handed to glommio once connected.
async fn connect_from(src: Ipv4Addr, dst: SocketAddrV4) -> io::Result<TcpStream> {
    // SAFETY: plain socket syscalls on a descriptor this function owns; it is
    // closed on every error path and otherwise moved into the TcpStream.
    unsafe {
        let fd = libc::socket(
            libc::AF_INET,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        );
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let fail = |fd| {
            let e = io::Error::last_os_error();
            libc::close(fd);
            Err(e)
        };
        // Let connect() pick the port, so the same source port can be reused
        // towards different destinations and a bound source does not exhaust
        // the ephemeral range at bind time.
        let one: libc::c_int = 1;
        libc::setsockopt(
            fd,
            libc::IPPROTO_IP,
            libc::IP_BIND_ADDRESS_NO_PORT,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
        let sa = sockaddr_in(SocketAddrV4::new(src, 0));
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        if libc::bind(fd, (&sa as *const libc::sockaddr_in).cast(), len) != 0 {
            return fail(fd);
        }
        let da = sockaddr_in(dst);
        if libc::connect(fd, (&da as *const libc::sockaddr_in).cast(), len) != 0
            && io::Error::last_os_error().raw_os_error() != Some(libc::EINPROGRESS)
        {
            return fail(fd);
        }
        // Loopback handshakes finish within microseconds: poll without
        // blocking, yielding to the executor between checks.
        let mut spins = 0u32;
        loop {
            let mut pfd = libc::pollfd {
                fd,
                events: libc::POLLOUT,
                revents: 0,
            };
            if libc::poll(&mut pfd, 1, 0) > 0 {
                break;
            }
            spins += 1;
            if spins < 16 {
                futures_lite::future::yield_now().await;
            } else {
                glommio::timer::sleep(Duration::from_millis(1)).await;
            }
        }
        let mut err: libc::c_int = 0;
        let mut elen = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ERROR,
            (&mut err as *mut libc::c_int).cast(),
            &mut elen,
        );
        if err != 0 {
            libc::close(fd);
            return Err(io::Error::from_raw_os_error(err));
        }
        Ok(TcpStream::from_raw_fd(fd))
    }
}

fn sockaddr_in(a: SocketAddrV4) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: a.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*a.ip()).to_be(),
        },
        sin_zero: [0; 8],
    }
}

mod response;
#[cfg(test)]
mod tests;
mod tls;
