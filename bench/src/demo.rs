//! `zgix-bench demo`: the README's one-command end-to-end run of origin → zgix → client.

use crate::args::Args;
use crate::http;
use crate::load::{self, LoadConfig};
use crate::origin::{self, OriginConfig};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub const USAGE: &str = "\
zgix-bench demo [--zgix PATH] [--duration S]

Starts an origin on an ephemeral 127.0.0.1 port, writes a temporary zgix config
pointing at it (listener on port 0, and a TLS listener with a certificate made
by `openssl req` when openssl and curl are installed), starts zgix, sends a few
requests (a clean one, one the WAF denies, one HTTPS request through curl, then
a short load run), stops zgix with SIGTERM and
checks that it exits 0. The zgix binary is --zgix, else $ZGIX_BIN, else `zgix`
next to this executable (cargo build --release -p zgix -p zgix-bench puts it there).";

/// How long zgix gets to log `server: ready`; shard start-up is milliseconds,
/// the margin is for a loaded CI box.
const READY_TIMEOUT: Duration = Duration::from_secs(15);
/// How long zgix gets to drain and exit after SIGTERM.
const EXIT_TIMEOUT: Duration = Duration::from_secs(10);
/// A request the demo config's WAF must refuse.
const WAF_PROBE: &str = "/download?file=../../etc/passwd";
/// Timeout for each single demo request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Kills zgix if the demo fails half-way, so no proxy outlives it.
struct ChildGuard(Option<Child>);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Removes the temporary config directory on every exit path.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs the demo; every failure comes back as a message saying what broke.
pub fn run(mut a: Args) -> Result<(), String> {
    let zgix_flag = a.value("--zgix")?;
    let duration = a.parsed::<f64>("--duration")?.unwrap_or(2.0);
    a.finish()?;
    if !(duration > 0.0 && duration <= 60.0) {
        return Err("--duration must be between 0 and 60 seconds".into());
    }
    let zgix = find_zgix(zgix_flag)?;

    // 1. Origin, in-process, on the last CPU so it does not share zgix's shard core.
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let ocfg = OriginConfig {
        bind: "127.0.0.1:0".parse().expect("literal address"),
        cpus: vec![cpus - 1],
        body_bytes: 64,
        delay: Duration::ZERO,
        chunked: false,
        chunk_bytes: 0,
        echo: false,
    };
    let origin = origin::start(&ocfg)?;
    println!("demo: origin listening on {}", origin.addr);

    // 2. Config: one shard, one listener on an ephemeral port, admission on.
    let dir = TempDir(std::env::temp_dir().join(format!("zgix-demo-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0)
        .map_err(|e| format!("cannot create {}: {e}", dir.0.display()))?;
    let config_path = dir.0.join("zgix.json");
    let tls = make_certificate(&dir.0);
    let config = demo_config(origin.addr, tls.as_deref());
    std::fs::write(
        &config_path,
        serde_json::to_string_pretty(&config).expect("json value serializes"),
    )
    .map_err(|e| format!("cannot write {}: {e}", config_path.display()))?;
    println!("demo: config {}", config_path.display());

    // 3. zgix, reading its stderr until it is ready.
    let (mut guard, listeners) = start_zgix(&zgix, &config_path)?;
    let listener = listeners[0];
    println!("demo: zgix listening on {listener}");

    // 4. A clean request, one the WAF denies, a clean one again, and one
    // HTTPS request on the TLS listener.
    check_requests(listener, ocfg.body_bytes)?;
    if let (Some(cert), Some(&https)) = (&tls, listeners.get(1)) {
        check_https(https, cert)?;
    }

    // 5. A short closed-loop load run through the proxy.
    load_run(listener, duration)?;

    // 6. SIGTERM and a clean exit.
    stop_zgix(&mut guard)?;
    println!("demo: ok");
    Ok(())
}

/// Starts zgix on `config_path` and waits for its `ready` line; its stderr
/// is echoed (and drained) by a thread. Returns it and its listeners.
fn start_zgix(
    zgix: &std::path::Path,
    config_path: &std::path::Path,
) -> Result<(ChildGuard, Vec<SocketAddr>), String> {
    let mut child = Command::new(zgix)
        .arg("--config")
        .arg(config_path)
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", zgix.display()))?;
    let stderr = child.stderr.take().expect("stderr piped");
    let mut guard = ChildGuard(Some(child));
    let (tx, rx) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("  zgix| {line}");
            if tx.send(line).is_err() {
                // The demo stopped listening; keep draining so zgix never blocks on a full pipe.
                continue;
            }
        }
    });
    let listeners = wait_ready(&rx, &mut guard)?;
    Ok((guard, listeners))
}

/// A clean request, one the WAF denies, and a clean one again.
fn check_requests(listener: SocketAddr, body_bytes: usize) -> Result<(), String> {
    let (status, body) = get(listener, "/hello")?;
    println!(
        "demo: GET /hello -> {status} {:?}",
        String::from_utf8_lossy(&body)
    );
    if status != 200 || body != vec![b'x'; body_bytes] {
        return Err(format!(
            "GET /hello through zgix returned {status} with a {}-byte body; \
             expected 200 with the origin's {body_bytes}-byte body",
            body.len(),
        ));
    }
    // zgix's WAF matches the canonical path (dot-segments already removed),
    // the raw query and header values, so the "../" goes in the query.
    let (status, _) = get(listener, WAF_PROBE)?;
    println!("demo: GET {WAF_PROBE} -> {status} (WAF deny list has \"../\")");
    if status != 403 {
        return Err(format!("the WAF request returned {status}, expected 403"));
    }
    let (status, _) = get(listener, "/after-waf")?;
    println!("demo: GET /after-waf -> {status}");
    if status != 200 {
        return Err(format!(
            "a clean request after the WAF hit returned {status}, expected 200"
        ));
    }
    Ok(())
}

/// One HTTPS request on the TLS listener, with curl trusting the
/// certificate made for the demo.
fn check_https(https: SocketAddr, cert: &std::path::Path) -> Result<(), String> {
    let status = https_get(https, cert)?;
    println!(
        "demo: GET https://demo.example:{}/tls -> {status} (TLS listener)",
        https.port()
    );
    if status != 200 {
        return Err(format!("the HTTPS request returned {status}, expected 200"));
    }
    Ok(())
}

/// A short closed-loop load run through the proxy; some answers must be 200.
fn load_run(listener: SocketAddr, duration: f64) -> Result<(), String> {
    let lcfg = LoadConfig::new(listener, "/", 16, Duration::from_secs_f64(duration));
    let report = load::execute(&lcfg, false)?;
    println!(
        "demo: load {:.1}s x 16 connections: {:.0} requests/s, status {:?}, errors {}, p50 {} us, p99 {} us",
        report.elapsed.as_secs_f64(),
        report.requests_per_sec(),
        report.stats.status,
        report.stats.errors.total(),
        report.stats.hist.value_at_quantile(0.5),
        report.stats.hist.value_at_quantile(0.99),
    );
    if report.stats.status.get(&200).copied().unwrap_or(0) == 0 {
        return Err("the load run got no 200 responses through zgix".into());
    }
    Ok(())
}

/// SIGTERM, then zgix must exit 0 within [`EXIT_TIMEOUT`].
fn stop_zgix(guard: &mut ChildGuard) -> Result<(), String> {
    let child = guard.0.as_mut().expect("child still owned");
    // SAFETY: kill(2) on the pid of a child we have not yet reaped.
    if unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) } != 0 {
        return Err(format!(
            "cannot SIGTERM zgix: {}",
            std::io::Error::last_os_error()
        ));
    }
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if started.elapsed() < EXIT_TIMEOUT => {
                std::thread::sleep(Duration::from_millis(20))
            }
            // The guard kills and reaps it on the way out.
            Ok(None) => {
                return Err(format!(
                    "zgix did not exit within {EXIT_TIMEOUT:?} of SIGTERM"
                ))
            }
            Err(e) => return Err(format!("waiting for zgix: {e}")),
        }
    };
    guard.0 = None;
    if !status.success() {
        return Err(format!(
            "zgix exited with {status} after SIGTERM, expected 0"
        ));
    }
    println!(
        "demo: zgix stopped cleanly after SIGTERM ({:.0} ms)",
        started.elapsed().as_secs_f64() * 1e3
    );
    Ok(())
}

fn find_zgix(flag: Option<String>) -> Result<PathBuf, String> {
    let (path, from) = if let Some(p) = flag {
        (PathBuf::from(p), "--zgix")
    } else if let Some(p) = std::env::var_os("ZGIX_BIN") {
        (PathBuf::from(p), "$ZGIX_BIN")
    } else {
        let exe =
            std::env::current_exe().map_err(|e| format!("cannot find own executable: {e}"))?;
        (exe.with_file_name("zgix"), "next to zgix-bench")
    };
    if !path.is_file() {
        return Err(format!(
            "zgix binary not found at {} ({from}); build it with \
             `cargo build --release -p zgix` or set ZGIX_BIN",
            path.display()
        ));
    }
    Ok(path)
}

/// The demo config: examples/demo.json's shape with the origin's real port
/// and ephemeral listener and admin ports.
fn demo_config(origin: SocketAddr, tls: Option<&std::path::Path>) -> serde_json::Value {
    let mut c = serde_json::json!({
        "cpus": [0],
        "admin": { "bind": "127.0.0.1:0" },
        "listeners": [{
            "bind": "127.0.0.1:0",
            "http": {
                "cluster": "origin",
                // High enough that the demo's load run is never refused.
                "rate_limit": { "requests": 1_000_000, "window_ms": 1000, "burst": 1_000_000 },
                "conn_limit": { "max": 256 },
                "waf": { "deny": ["union select", "<script", "../"], "status": 403 }
            }
        }],
        "clusters": {
            "origin": { "endpoints": [origin.to_string()], "lb": "round_robin" }
        }
    });
    if let Some(dir) = tls {
        let https = serde_json::json!({
            "bind": "127.0.0.1:0",
            "name": "https",
            "tls": { "certificates": [{
                "cert": dir.join("cert.pem").to_string_lossy(),
                "key": dir.join("key.pem").to_string_lossy()
            }] },
            "http": { "cluster": "origin" }
        });
        c["listeners"]
            .as_array_mut()
            .expect("listeners is an array")
            .push(https);
    }
    c
}

/// A throw-away ECDSA certificate for `demo.example` in `dir` (by `openssl
/// req`); `None` when openssl or curl is missing (the demo then skips HTTPS).
fn make_certificate(dir: &std::path::Path) -> Option<PathBuf> {
    let have = |c: &str| {
        Command::new(c)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok()
    };
    if !have("curl")
        || !Command::new("openssl")
            .arg("version")
            .output()
            .is_ok_and(|o| o.status.success())
    {
        println!("demo: openssl or curl not found; skipping the HTTPS listener");
        return None;
    }
    let ok = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
        ])
        .arg("-keyout")
        .arg(dir.join("key.pem"))
        .arg("-out")
        .arg(dir.join("cert.pem"))
        .args(["-days", "30", "-subj", "/CN=demo.example"])
        .args(["-addext", "subjectAltName=DNS:demo.example"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    ok.then(|| dir.to_path_buf())
}

/// One HTTPS GET with curl, trusting the demo's certificate; the status.
fn https_get(addr: SocketAddr, dir: &std::path::Path) -> Result<u16, String> {
    let out = Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "10",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
        ])
        .arg("--cacert")
        .arg(dir.join("cert.pem"))
        .arg("--resolve")
        .arg(format!("demo.example:{}:127.0.0.1", addr.port()))
        .arg(format!("https://demo.example:{}/tls", addr.port()))
        .output()
        .map_err(|e| format!("cannot run curl: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.trim().parse().map_err(|_| {
        format!(
            "curl over TLS failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )
    })
}

/// Waits for zgix's `server: ready` log line, returning the listeners'
/// addresses by index (from `server: listener N on ADDR ...`).
fn wait_ready(
    rx: &mpsc::Receiver<String>,
    guard: &mut ChildGuard,
) -> Result<Vec<SocketAddr>, String> {
    let deadline = Instant::now() + READY_TIMEOUT;
    let mut listeners: Vec<SocketAddr> = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left.min(Duration::from_millis(100))) {
            Ok(line) => {
                // `<timestamp> <level> server: <message>`
                let msg = line.split_once(" server: ").map_or("", |(_, m)| m);
                let listed = msg
                    .strip_prefix("listener ")
                    .and_then(|r| r.split_once(" on "));
                if let Some((_, rest)) = listed {
                    let addr = rest.split(' ').next().unwrap_or("");
                    listeners.push(
                        addr.parse()
                            .map_err(|e| format!("zgix printed listener address {addr:?}: {e}"))?,
                    );
                } else if msg.starts_with("ready") {
                    if listeners.is_empty() {
                        return Err(
                            "zgix said ready without logging `server: listener 0 on ADDR`".into(),
                        );
                    }
                    return Ok(listeners);
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {}
        }
        if let Some(child) = guard.0.as_mut() {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!(
                    "zgix exited with {status} before it was ready (its stderr is above)"
                ));
            }
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "zgix did not log `server: ready` within {READY_TIMEOUT:?}"
            ));
        }
    }
}

/// One blocking GET on a fresh connection; returns the status and body.
fn get(addr: SocketAddr, path: &str) -> Result<(u16, Vec<u8>), String> {
    let fail = |e: std::io::Error| format!("GET {path} via {addr}: {e}");
    let mut s = TcpStream::connect_timeout(&addr, REQUEST_TIMEOUT).map_err(fail)?;
    s.set_read_timeout(Some(REQUEST_TIMEOUT)).map_err(fail)?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).map_err(fail)?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(head) = http::parse_response(&buf, false)
            .map_err(|e| format!("GET {path}: unparsable response: {e:?}"))?
        {
            let rest = &buf[head.len..];
            match head.body {
                http::BodyKind::Length(n) if rest.len() >= n => {
                    return Ok((head.status, rest[..n].to_vec()))
                }
                http::BodyKind::Chunked => {
                    let mut dec = http::ChunkedDecoder::default();
                    let mut body = Vec::new();
                    dec.feed(rest, Some(&mut body))
                        .map_err(|e| format!("GET {path}: bad chunked body: {e:?}"))?;
                    if dec.is_done() {
                        return Ok((head.status, body));
                    }
                }
                _ => {}
            }
        }
        let n = s.read(&mut chunk).map_err(fail)?;
        if n == 0 {
            // EOF ends an until-close body; anything else is truncated.
            return match http::parse_response(&buf, false) {
                Ok(Some(h)) if h.body == http::BodyKind::UntilClose => {
                    Ok((h.status, buf[h.len..].to_vec()))
                }
                _ => Err(format!(
                    "GET {path}: connection closed before a full response"
                )),
            };
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}
