//! The zgix process of the harness: configs, the binary, start-up and its announced addresses, the suite's defaults and /metrics helpers.

use super::*;

/// A zgix config document, built up in tests and rendered to JSON.
#[derive(Clone, Debug)]
pub struct Config {
    pub cpus: Option<Vec<u32>>,
    pub admin: bool,
    /// `(bind, cluster)` per listener.
    pub listeners: Vec<(String, String)>,
    /// `(name, endpoints, lb)` per cluster.
    pub clusters: Vec<(String, Vec<String>, String)>,
    pub limits: Vec<(String, u64)>,
}

impl Config {
    /// One listener on 127.0.0.1:0 forwarding to cluster `api` = `endpoints`, round robin.
    pub fn new(endpoints: &[SocketAddr]) -> Config {
        Config {
            cpus: None,
            admin: false,
            listeners: vec![("127.0.0.1:0".into(), "api".into())],
            clusters: vec![(
                "api".into(),
                endpoints.iter().map(|e| e.to_string()).collect(),
                "round_robin".into(),
            )],
            limits: Vec::new(),
        }
    }

    pub fn cpus(mut self, cpus: &[u32]) -> Config {
        self.cpus = Some(cpus.to_vec());
        self
    }

    pub fn admin(mut self) -> Config {
        self.admin = true;
        self
    }

    pub fn lb(mut self, lb: &str) -> Config {
        self.clusters[0].2 = lb.into();
        self
    }

    pub fn limit(mut self, name: &str, value: u64) -> Config {
        self.limits.push((name.into(), value));
        self
    }

    /// Adds cluster `name` and a listener on 127.0.0.1:0 forwarding to it.
    pub fn listener_for(mut self, name: &str, endpoints: &[SocketAddr]) -> Config {
        self.clusters.push((
            name.into(),
            endpoints.iter().map(|e| e.to_string()).collect(),
            "round_robin".into(),
        ));
        self.listeners.push(("127.0.0.1:0".into(), name.into()));
        self
    }

    pub fn to_json(&self) -> String {
        let quoted = |items: &[String]| {
            items
                .iter()
                .map(|s| format!("\"{s}\""))
                .collect::<Vec<_>>()
                .join(",")
        };
        let mut out = String::from("{");
        if let Some(cpus) = &self.cpus {
            let list: Vec<String> = cpus.iter().map(u32::to_string).collect();
            let _ = write!(out, "\"cpus\":[{}],", list.join(","));
        }
        if self.admin {
            out.push_str("\"admin\":{\"bind\":\"127.0.0.1:0\"},");
        }
        let listeners: Vec<String> = self
            .listeners
            .iter()
            .map(|(bind, cluster)| {
                format!("{{\"bind\":\"{bind}\",\"http\":{{\"cluster\":\"{cluster}\"}}}}")
            })
            .collect();
        let _ = write!(out, "\"listeners\":[{}],", listeners.join(","));
        let clusters: Vec<String> = self
            .clusters
            .iter()
            .map(|(name, endpoints, lb)| {
                format!(
                    "\"{name}\":{{\"endpoints\":[{}],\"lb\":\"{lb}\"}}",
                    quoted(endpoints)
                )
            })
            .collect();
        let _ = write!(out, "\"clusters\":{{{}}}", clusters.join(","));
        if !self.limits.is_empty() {
            let limits: Vec<String> = self
                .limits
                .iter()
                .map(|(k, v)| format!("\"{k}\":{v}"))
                .collect();
            let _ = write!(out, ",\"limits\":{{{}}}", limits.join(","));
        }
        out.push('}');
        out
    }
}

/// Splits an error-log line `<RFC 3339 ms> <level> <component>: <message>`
/// into level, component and message; `None` if the line has another shape.
pub fn log_message(line: &str) -> Option<(&str, &str, &str)> {
    let (ts, rest) = line.split_once(' ')?;
    let (level, rest) = rest.split_once(' ')?;
    let (component, msg) = rest.split_once(": ")?;
    let t = ts.as_bytes();
    let ts_ok = t.len() == 24
        && t[4] == b'-'
        && t[7] == b'-'
        && t[10] == b'T'
        && t[13] == b':'
        && t[16] == b':'
        && t[19] == b'.'
        && t[23] == b'Z'
        && [0, 1, 2, 3, 5, 6, 8, 9, 11, 12, 14, 15, 17, 18, 20, 21, 22]
            .iter()
            .all(|&i| t[i].is_ascii_digit());
    let level_ok = ["error", "warn", "info", "debug"].contains(&level);
    let component_ok = !component.is_empty()
        && component
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b == b'_');
    (ts_ok && level_ok && component_ok).then_some((level, component, msg))
}

/// Path of the zgix binary cargo built for these tests.
pub fn zgix_bin() -> &'static str {
    env!("CARGO_BIN_EXE_zgix")
}

/// A config file in the temp dir, removed on drop.
pub struct TempConfig {
    pub path: PathBuf,
}

impl TempConfig {
    pub fn new(contents: &str) -> TempConfig {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let path = std::env::temp_dir().join(format!(
            "zgix-test-{}-{}-{nanos}.json",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::write(&path, contents).expect("write config");
        TempConfig { path }
    }
}

impl Drop for TempConfig {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Output of a short zgix invocation.
pub struct Run {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// Runs zgix with `args` to completion (bounded by [`IO_TIMEOUT`]).
pub fn run_zgix(args: &[&str]) -> Run {
    run_zgix_env(args, &[])
}

/// [`run_zgix`] with extra environment variables.
pub fn run_zgix_env(args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut child = Command::new(zgix_bin())
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn zgix");
    let drain = |mut pipe: Box<dyn Read + Send>| {
        thread::spawn(move || {
            let mut out = Vec::new();
            let _ = pipe.read_to_end(&mut out);
            String::from_utf8_lossy(&out).into_owned()
        })
    };
    let out = drain(Box::new(child.stdout.take().unwrap()));
    let err = drain(Box::new(child.stderr.take().unwrap()));
    let status = wait_timeout(&mut child, IO_TIMEOUT).unwrap_or_else(|| {
        let _ = child.kill();
        let _ = child.wait();
        panic!("zgix {args:?} did not exit within {IO_TIMEOUT:?}");
    });
    Run {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    }
}

fn wait_timeout(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// A running zgix process. Dropping it sends SIGTERM, waits, then SIGKILLs.
pub struct Zgix {
    child: Child,
    exited: Option<ExitStatus>,
    /// Listener addresses by index, from the `listener N on ADDR` lines.
    pub listeners: Vec<SocketAddr>,
    pub admin: Option<SocketAddr>,
    /// N from `ready (N shards)`.
    pub shards: usize,
    log: Arc<Mutex<String>>,
    _config: TempConfig,
}

impl Zgix {
    /// Starts zgix on `config` and waits for its `ready` line.
    #[track_caller]
    pub fn start(config: &Config) -> Zgix {
        Zgix::start_json(&config.to_json())
    }

    /// Starts zgix on a raw JSON document and waits for its `ready` line.
    #[track_caller]
    pub fn start_json(json: &str) -> Zgix {
        Zgix::start_json_env(json, &[])
    }

    /// [`Zgix::start_json`] with `env` set for zgix alone (a diagnostic
    /// knob such as `ZGIX_INLINE_BACKSTOP_MS`).
    #[track_caller]
    pub fn start_json_env(json: &str, env: &[(&str, &str)]) -> Zgix {
        let json = &with_test_defaults(json);
        let config = TempConfig::new(json);
        let mut child = Command::new(zgix_bin())
            .envs(env.iter().copied())
            .arg("--config")
            .arg(&config.path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn zgix");
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel::<String>();
        let stderr = child.stderr.take().unwrap();
        let thread_log = log.clone();
        thread::spawn(move || {
            let mut reader = BufReader::new(stderr);
            let mut line = Vec::new();
            loop {
                line.clear();
                match reader.read_until(b'\n', &mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        let text = String::from_utf8_lossy(&line).into_owned();
                        thread_log.lock().unwrap().push_str(&text);
                        let _ = tx.send(text.trim_end().to_string());
                    }
                }
            }
        });
        let mut listeners: Vec<(usize, SocketAddr)> = Vec::new();
        let mut admin = None;
        let deadline = Instant::now() + START_TIMEOUT;
        let shards = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = match rx.recv_timeout(left) {
                Ok(line) => line,
                Err(e) => {
                    let _ = child.kill();
                    let status = child.wait().ok();
                    panic!(
                        "zgix did not get ready ({e:?}, exit status {status:?}); config:\n{json}\nstderr:\n{}",
                        log.lock().unwrap()
                    );
                }
            };
            let msg = log_message(&line).map_or("", |(_, _, m)| m);
            if let Some(rest) = msg.strip_prefix("listener ") {
                if let Some((n, addr)) = rest.split_once(" on ") {
                    let addr = addr.split(' ').next().unwrap_or("");
                    if let (Ok(n), Ok(addr)) = (n.parse(), addr.parse()) {
                        listeners.push((n, addr));
                    }
                }
            } else if let Some(addr) = msg.strip_prefix("admin on ") {
                admin = addr.trim().parse().ok();
            } else if let Some(rest) = msg.strip_prefix("ready (") {
                // "zgix: ready (N shards, DRIVER)"
                let driver = rest
                    .split(", ")
                    .nth(1)
                    .map(|d| d.trim_end_matches(')').to_string())
                    .unwrap_or_default();
                if let Ok(want) = std::env::var("ZGIX_TEST_DRIVER") {
                    assert_eq!(
                        driver,
                        want,
                        "zgix runs on {driver}, the suite asked for {want}:\n{}",
                        log.lock().unwrap()
                    );
                }
                break rest
                    .split(' ')
                    .next()
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0);
            }
        };
        listeners.sort_by_key(|(n, _)| *n);
        Zgix {
            child,
            exited: None,
            listeners: listeners.into_iter().map(|(_, a)| a).collect(),
            admin,
            shards,
            log,
            _config: config,
        }
    }

    /// The first listener's address.
    #[track_caller]
    pub fn addr(&self) -> SocketAddr {
        *self
            .listeners
            .first()
            .unwrap_or_else(|| panic!("no listener line in stderr:\n{}", self.stderr()))
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Everything zgix wrote to stderr so far.
    pub fn stderr(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Sends a signal by name (`TERM`, `KILL`, ...) with kill(1).
    pub fn signal(&self, name: &str) {
        let _ = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.pid().to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }

    /// Waits up to `timeout` for the process to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        if self.exited.is_none() {
            self.exited = wait_timeout(&mut self.child, timeout);
        }
        self.exited
    }

    /// Peak resident set size (`VmHWM`) in KiB.
    #[track_caller]
    pub fn vm_hwm_kib(&self) -> u64 {
        let path = Path::new("/proc")
            .join(self.pid().to_string())
            .join("status");
        let status = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("no VmHWM in {}", path.display()))
    }
}

impl Drop for Zgix {
    fn drop(&mut self) {
        if self.exited.is_some() {
            return;
        }
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        self.signal("TERM");
        if wait_timeout(&mut self.child, Duration::from_secs(5)).is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// What every config of the suite gets unless it says otherwise:
/// - `"via": false`, so the many tests that compare forwarded heads byte for
///   byte see only what they are about (the Via tests set `via` themselves);
/// - `"request_id": false` on every listener's `http`, for the same reason
///   (proxy/tests/request_id.rs sets it);
/// - the socket driver `ZGIX_TEST_DRIVER` (`uring` or `epoll`, as CI sets it);
///   unset, zgix's default applies.
pub fn with_test_defaults(json: &str) -> String {
    let Ok(mut v) = serde_json::from_str::<serde_json::Value>(json) else {
        return json.to_string();
    };
    let driver = std::env::var("ZGIX_TEST_DRIVER").ok();
    if let Some(obj) = v.as_object_mut() {
        obj.entry("via").or_insert(serde_json::Value::Bool(false));
        // Like Via, the request ID (a random X-Request-ID by default) is off
        // unless a test asks for it, so exact heads stay exact.
        if let Some(ls) = obj.get_mut("listeners").and_then(|l| l.as_array_mut()) {
            for http in ls
                .iter_mut()
                .filter_map(|l| l.get_mut("http")?.as_object_mut())
            {
                http.entry("request_id")
                    .or_insert(serde_json::Value::Bool(false));
            }
        }
        if let Some(driver) = driver {
            let io = obj
                .entry("io")
                .or_insert_with(|| serde_json::Value::Object(Default::default()));
            if let Some(io) = io.as_object_mut() {
                io.entry("driver")
                    .or_insert(serde_json::Value::String(driver));
            }
        }
    }
    v.to_string()
}

/// zgix's `/metrics` text (started with an admin endpoint).
#[track_caller]
pub fn metrics_text(zgix: &Zgix) -> String {
    let admin = zgix.admin.expect("zgix started without admin");
    let mut c = Client::connect(admin);
    let resp = c.request(b"GET /metrics HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n");
    assert_eq!(resp.status, 200, "metrics: {}", resp.show());
    String::from_utf8(resp.body).expect("/metrics is UTF-8")
}

/// `/metrics` once the shard tick that copies the driver counters has run
/// since the call (`zgix_io_enters_total` moved past its value then): the
/// driver's figures include everything done before it. Meant for a
/// single-shard zgix (each shard ticks on its own).
#[track_caller]
pub fn metrics_after_tick(zgix: &Zgix) -> String {
    let before = series(&metrics_text(zgix), "zgix_io_enters_total");
    let deadline = std::time::Instant::now() + super::IO_TIMEOUT;
    loop {
        let m = metrics_text(zgix);
        if series(&m, "zgix_io_enters_total") > before {
            return m;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no shard tick in {:?}",
            super::IO_TIMEOUT
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The value of the series `key` (name and labels, exactly) in `text`.
#[track_caller]
pub fn series(text: &str, key: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(key).and_then(|v| v.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {key} in metrics:\n{text}"))
}

/// The value of an unlabelled series in zgix's `/metrics`.
#[track_caller]
pub fn metric(zgix: &Zgix, name: &str) -> f64 {
    series(&metrics_text(zgix), name)
}

/// Shard 0's heap allocations so far (`zgix_heap_allocations_total`).
pub fn heap_allocations(zgix: &Zgix) -> u64 {
    let admin = zgix.admin.expect("admin configured");
    let mut client = Client::connect(admin);
    let resp = client.request(b"GET /metrics HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n");
    assert_eq!(resp.status, 200);
    let text = String::from_utf8(resp.body).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("zgix_heap_allocations_total{shard=\"0\"} "))
        .unwrap_or_else(|| panic!("no allocation counter in:\n{text}"))
        .trim()
        .parse()
        .unwrap()
}

/// Allocations of shard 0 over a window in which `requests` requests
/// (`request(i)`) are sent on the warm connection, and how long the requests took. The window always
/// contains exactly one /metrics scrape (which does allocate) and lasts at
/// least `at_least` plus fixed margins, so two windows of the same length
/// differ only by the requests: glommio's timer wheel allocates a little
/// each time its loop fires timers, which is per unit of time, not per
/// request.
pub fn allocation_window(
    zgix: &Zgix,
    client: &mut Client,
    requests: usize,
    at_least: Duration,
    request: impl Fn(usize) -> String,
) -> (u64, Duration) {
    // Let the 100 ms tick publish everything before the window opens.
    thread::sleep(Duration::from_millis(350));
    let before = heap_allocations(zgix);
    let start = Instant::now();
    for i in 0..requests {
        let resp = client.request(request(i).as_bytes());
        assert_eq!(resp.status, 200, "{}", resp.show());
    }
    let took = start.elapsed();
    if let Some(rest) = at_least.checked_sub(took) {
        thread::sleep(rest);
    }
    thread::sleep(Duration::from_millis(350));
    (heap_allocations(zgix) - before, took)
}
