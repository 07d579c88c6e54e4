//! Accepting under churn (issue 19's accept stall): a shard that pauses at its connection cap and resumes as connections close, on a plain and on a TLS listener, and with accepts failing on EMFILE, still answers every connection that reaches its backlog, and no listener is ever left waiting with no accept armed.

mod support;

use std::net::TcpStream;
use std::process::Command;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use support::{Client, Config, Origin, Zgix, IO_TIMEOUT};

/// Clients that connect at once, and the connections each opens in turn.
const CLIENTS: usize = 240;
const ROUNDS: usize = 4;
/// The shard's connection cap in the cap tests.
const CAP: usize = 64;

/// `CLIENTS` threads each open `ROUNDS` connections one after another; on
/// each, client `i` sends `request` up to `1 + (i + round) % 3` times
/// (once when `close_after_one`) and reads every answer, then closes. The
/// first connections all open before any sends (more than the cap: the
/// rest wait in the backlog), so the shard pauses and resumes as they
/// close. An answer not read within [`IO_TIMEOUT`] (a connection left in
/// the backlog) is a failure. The requests start once the shard holds
/// `hold` connections (its cap). Returns the statuses and the failures.
fn churn(
    zgix: &Zgix,
    hold: usize,
    request: &'static [u8],
    close_after_one: bool,
) -> (Vec<u16>, Vec<String>) {
    let addr = zgix.addr();
    let all_open = Arc::new(Barrier::new(CLIENTS + 1));
    let threads: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let all_open = all_open.clone();
            thread::spawn(move || {
                let mut statuses = Vec::new();
                for round in 0..ROUNDS {
                    let stream = TcpStream::connect_timeout(&addr, IO_TIMEOUT);
                    if round == 0 {
                        all_open.wait();
                    }
                    let stream = match stream {
                        Ok(s) => s,
                        Err(e) => return Err(format!("client {i} round {round}: connect: {e}")),
                    };
                    let mut c = Client::from_stream(stream);
                    let n = if close_after_one {
                        1
                    } else {
                        1 + (i + round) % 3
                    };
                    for k in 0..n {
                        c.try_send(request).map_err(|e| {
                            format!("client {i} round {round} request {k}: send: {e}")
                        })?;
                        let r = c
                            .try_read_response(false)
                            .map_err(|e| format!("client {i} round {round} request {k}: {e}"))?;
                        statuses.push(r.status);
                        // A refusal (a 502 when out of descriptors) closes.
                        if r.field("connection")
                            .is_some_and(|v| v.eq_ignore_ascii_case("close"))
                        {
                            break;
                        }
                    }
                }
                Ok(statuses)
            })
        })
        .collect();
    let deadline = Instant::now() + IO_TIMEOUT;
    while hold > 0 && support::metric(zgix, "zgix_connections_active") < hold as f64 {
        assert!(
            Instant::now() < deadline,
            "the shard never held {hold} connections"
        );
        thread::sleep(Duration::from_millis(10));
    }
    all_open.wait();
    let mut statuses = Vec::new();
    let mut failures = Vec::new();
    for t in threads {
        match t.join().expect("client thread") {
            Ok(s) => statuses.extend(s),
            Err(e) => failures.push(e),
        }
    }
    (statuses, failures)
}

/// The accept watchdog's count: listeners it found waiting, not paused,
/// with connections in the backlog and none taken for a second (a lost
/// accept, which it restarts). Must stay 0.
#[track_caller]
fn assert_no_lost_accept(zgix: &Zgix) {
    let text = support::metrics_text(zgix);
    let stalls = support::series(&text, "zgix_accept_stalls_total");
    assert_eq!(stalls, 0.0, "accepts were lost and restarted:\n{text}");
}

/// The shard reached its cap (and paused), and lost no accept.
#[track_caller]
fn assert_paused_and_no_lost_accept(zgix: &Zgix) {
    let pauses = support::metric(zgix, "zgix_accept_pauses_total");
    assert!(
        pauses >= 1.0,
        "the shard never reached its cap: {pauses} pauses"
    );
    assert_no_lost_accept(zgix);
}

#[track_caller]
fn assert_all_answered(what: &str, failures: &[String], statuses: &[u16], want: u16) {
    assert!(
        failures.is_empty(),
        "{what}: {} of {CLIENTS} clients were not answered, first: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    let wrong: Vec<_> = statuses.iter().filter(|&&s| s != want).collect();
    assert!(
        wrong.is_empty(),
        "{what}: statuses other than {want}: {wrong:?}"
    );
}

#[test]
fn a_shard_pausing_and_resuming_at_its_cap_answers_every_connection() {
    let origin = Origin::start();
    let zgix = Zgix::start(
        &Config::new(&[origin.addr()])
            .cpus(&[0])
            .admin()
            .limit("max_connections", CAP as u64),
    );
    let (statuses, failures) = churn(&zgix, CAP, b"GET / HTTP/1.1\r\nHost: t\r\n\r\n", false);
    assert_all_answered("plain", &failures, &statuses, 200);
    assert_paused_and_no_lost_accept(&zgix);
}

/// A self-signed certificate and key for `t.example`, written under a
/// scratch directory that the returned guard removes.
struct Cert {
    dir: std::path::PathBuf,
}

impl Cert {
    fn new() -> Cert {
        let dir = std::env::temp_dir().join(format!("zgix-accept-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["t.example".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        std::fs::write(dir.join("c.pem"), cert.pem()).unwrap();
        std::fs::write(dir.join("c.key"), key.serialize_pem()).unwrap();
        Cert { dir }
    }
}

impl Drop for Cert {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn a_tls_listener_pausing_and_resuming_at_its_cap_answers_every_connection() {
    let origin = Origin::start();
    let cert = Cert::new();
    let mut v: serde_json::Value = serde_json::from_str(
        &Config::new(&[origin.addr()])
            .cpus(&[0])
            .admin()
            .limit("max_connections", CAP as u64)
            .to_json(),
    )
    .unwrap();
    v["listeners"][0]["tls"] = serde_json::json!({ "certificates": [{
        "cert": cert.dir.join("c.pem"), "key": cert.dir.join("c.key") }] });
    let zgix = Zgix::start_json(&v.to_string());
    // Plaintext on the TLS port: the shard accepts, reads the bytes as a
    // failed handshake and answers 400 in cleartext, then closes.
    let (statuses, failures) = churn(&zgix, CAP, b"GET / HTTP/1.1\r\nHost: t\r\n\r\n", true);
    assert_all_answered("tls", &failures, &statuses, 400);
    assert_paused_and_no_lost_accept(&zgix);
}

/// zgix's descriptor limit (soft, hard), from `/proc`.
fn nofile(pid: u32) -> (String, String) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("a descriptor limit");
    let mut v = line["Max open files".len()..].split_whitespace();
    (v.next().unwrap().to_string(), v.next().unwrap().to_string())
}

/// Sets zgix's descriptor limit (soft, hard) with `prlimit`.
fn set_nofile(pid: u32, soft: &str, hard: &str) {
    let ok = Command::new("prlimit")
        .arg(format!("--pid={pid}"))
        .arg(format!("--nofile={soft}:{hard}"))
        .status()
        .expect("run prlimit")
        .success();
    assert!(ok, "prlimit --nofile={soft}:{hard} failed");
}

#[test]
fn accepts_failing_on_emfile_back_off_and_every_connection_is_still_answered() {
    let origin = Origin::start();
    let zgix = Zgix::start(
        &Config::new(&[origin.addr()])
            .cpus(&[0])
            .admin()
            .limit("max_connections", 1000),
    );
    support::health_check(zgix.addr());
    let held = std::fs::read_dir(format!("/proc/{}/fd", zgix.pid()))
        .unwrap()
        .count();
    // Room for a few connections and their upstreams: the rest of the
    // burst makes the kernel's accept fail with EMFILE.
    let (soft, hard) = nofile(zgix.pid());
    let low = (held + 24).to_string();
    set_nofile(zgix.pid(), &low, &hard);
    let (statuses, failures) = churn(&zgix, 0, b"GET / HTTP/1.1\r\nHost: t\r\n\r\n", false);
    set_nofile(zgix.pid(), &soft, &hard);
    // A request whose upstream connect failed on EMFILE gets 502; every
    // connection still gets its answers.
    assert!(
        failures.is_empty(),
        "{} of {CLIENTS} clients were not answered, first: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    assert!(
        statuses.contains(&200),
        "no request was served: {statuses:?}"
    );
    let text = support::metrics_text(&zgix);
    let emfile = support::series(&text, "zgix_accept_errors_total{errno=\"EMFILE\"}");
    assert!(emfile >= 1.0, "accept never failed on EMFILE:\n{text}");
    assert_no_lost_accept(&zgix);
    support::health_check(zgix.addr());
}
