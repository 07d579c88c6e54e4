//! Harness of the lifecycle tests: a zgix process whose config file the test rewrites and signals, with its stderr searchable line by line.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::support::{log_message, with_test_defaults, zgix_bin, TempConfig};

/// Longest any wait of these tests may take.
pub const WAIT: Duration = Duration::from_secs(15);

/// A loopback port free right now (for configs that need a fixed port:
/// the single-instance guard and the hand-off key on it).
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind a probe socket");
    l.local_addr().expect("probe address").port()
}

/// A running zgix on a config file the test controls.
pub struct Proc {
    child: Child,
    log: Arc<Mutex<String>>,
    /// Set when the stderr reader saw end of file (every holder of the pipe
    /// exited: zgix, and a process it handed its sockets to).
    eof: Arc<std::sync::atomic::AtomicBool>,
    config: TempConfig,
    exited: Option<ExitStatus>,
}

impl Proc {
    /// Starts `zgix --config FILE ARGS` on `json` and waits for `ready`.
    #[track_caller]
    pub fn start(json: &str, args: &[&str]) -> Proc {
        let p = Proc::spawn(TempConfig::new(&with_test_defaults(json)), args);
        p.wait_log("ready (", 1);
        p
    }

    /// [`Proc::start`] with extra environment variables.
    #[track_caller]
    pub fn start_env(json: &str, args: &[&str], env: &[(&str, &str)]) -> Proc {
        let p = Proc::spawn_env(TempConfig::new(&with_test_defaults(json)), args, env);
        p.wait_log("ready (", 1);
        p
    }

    /// Starts zgix without waiting for anything.
    pub fn spawn(config: TempConfig, args: &[&str]) -> Proc {
        Proc::spawn_env(config, args, &[])
    }

    /// [`Proc::spawn`] with extra environment variables.
    pub fn spawn_env(config: TempConfig, args: &[&str], env: &[(&str, &str)]) -> Proc {
        let mut child = Command::new(zgix_bin())
            .arg("--config")
            .arg(&config.path)
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn zgix");
        let log = Arc::new(Mutex::new(String::new()));
        let stderr = child.stderr.take().expect("piped stderr");
        let thread_log = log.clone();
        let eof = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let thread_eof = eof.clone();
        thread::spawn(move || {
            let mut reader = BufReader::new(stderr);
            let mut line = String::new();
            while matches!(reader.read_line(&mut line), Ok(n) if n > 0) {
                thread_log.lock().unwrap().push_str(&line);
                line.clear();
            }
            thread_eof.store(true, std::sync::atomic::Ordering::Release);
        });
        Proc {
            child,
            log,
            eof,
            config,
            exited: None,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn stderr(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Waits until stderr holds `needle` at least `count` times.
    #[track_caller]
    pub fn wait_log(&self, needle: &str, count: usize) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let log = self.stderr();
            if log.matches(needle).count() >= count {
                return log;
            }
            if Instant::now() >= deadline {
                panic!("no {count}× {needle:?} in zgix's stderr:\n{log}");
            }
            thread::sleep(Duration::from_millis(5));
        }
    }

    /// The listener addresses zgix announced last (at start or after the
    /// last applied reload), by index.
    #[track_caller]
    pub fn listeners(&self) -> Vec<SocketAddr> {
        let log = self.stderr();
        let lines: Vec<&str> = log
            .lines()
            .map(|l| log_message(l).map_or("", |(_, _, m)| m))
            .collect();
        let marker = |l: &str| l.starts_with("ready (") || l.starts_with("reload applied");
        let end = lines.iter().rposition(|l| marker(l)).expect("ready line");
        let start = lines[..end]
            .iter()
            .rposition(|l| marker(l) || l.starts_with("signal HUP"))
            .map_or(0, |i| i + 1);
        lines[start..end]
            .iter()
            .filter_map(|l| l.strip_prefix("listener "))
            .filter_map(|r| r.split_once(" on ")?.1.split(' ').next()?.parse().ok())
            .collect()
    }

    /// The admin address announced last.
    pub fn admin(&self) -> Option<SocketAddr> {
        self.stderr().lines().rev().find_map(|l| {
            let m = log_message(l)?.2;
            m.strip_prefix("admin on ")?.trim().parse().ok()
        })
    }

    /// Rewrites the config file (with the suite's defaults).
    pub fn write_config(&self, json: &str) {
        std::fs::write(&self.config.path, with_test_defaults(json)).expect("rewrite config");
    }

    /// Rewrites the config, sends SIGHUP and waits for `reload applied` number `n`.
    #[track_caller]
    pub fn reload(&self, json: &str, n: usize) {
        self.write_config(json);
        self.signal("HUP");
        self.wait_log("reload applied", n);
    }

    pub fn signal(&self, name: &str) {
        let _ = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.pid().to_string())
            .status();
    }

    /// Waits for the process to exit.
    #[track_caller]
    pub fn wait_exit(&mut self) -> ExitStatus {
        if let Some(s) = self.exited {
            return s;
        }
        let deadline = Instant::now() + WAIT;
        loop {
            if let Ok(Some(s)) = self.child.try_wait() {
                self.exited = Some(s);
                // Its last lines may still be in the pipe: let the reader reach
                // end of file (bounded: a process zgix handed its sockets to
                // may hold the pipe open).
                let drained = Instant::now() + Duration::from_secs(2);
                while !self.eof.load(std::sync::atomic::Ordering::Acquire)
                    && Instant::now() < drained
                {
                    thread::sleep(Duration::from_millis(5));
                }
                return s;
            }
            if Instant::now() >= deadline {
                panic!("zgix still running; stderr:\n{}", self.stderr());
            }
            thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.exited.is_some() || matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        self.signal("TERM");
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One `GET /` on a kept-alive connection, which must be answered 200;
/// `true` when the answer said `Connection: close` (a drain's last one).
pub fn keep_alive_get(c: &mut crate::support::Client, i: usize) -> Result<bool, String> {
    c.try_send(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        .map_err(|e| format!("request {i}: send: {e}"))?;
    let r = c
        .try_read_response(false)
        .map_err(|e| format!("request {i}: read: {e}"))?;
    if r.status != 200 {
        return Err(format!("request {i}: {}", r.show()));
    }
    Ok(r.field("connection")
        .is_some_and(|v| v.eq_ignore_ascii_case("close")))
}
