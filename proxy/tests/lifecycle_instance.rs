//! End-to-end process lifecycle: one instance per listen address, the `--upgrade` hand-off losing no connection, a drain cut by its deadline exiting 3, signals that must not kill.

mod lifecycle_support;
mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use lifecycle_support::{free_port, Proc};
use support::{run_zgix, with_test_defaults, Client, Origin, TempConfig};

fn config(port: u16, origin: SocketAddr, limits: &str) -> String {
    format!(
        r#"{{"cpus": [0, 1], "listeners": [{{"bind": "127.0.0.1:{port}", "http": {{"cluster": "c"}}}}],
            "clusters": {{"c": {{"endpoints": ["{origin}"]}}}}, "limits": {{{limits}}}}}"#
    )
}

#[test]
fn a_second_instance_on_a_served_address_refuses_to_start_naming_it_and_the_pid() {
    let o = Origin::start();
    let port = free_port();
    let first = Proc::start(&config(port, o.addr(), ""), &[]);
    let file = TempConfig::new(&with_test_defaults(&config(port, o.addr(), "")));
    let path = file.path.to_string_lossy().into_owned();
    let second = run_zgix(&["--config", &path]);
    assert_eq!(second.status.code(), Some(1), "stderr:\n{}", second.stderr);
    let want = format!(
        "listeners[0].bind: 127.0.0.1:{port} is already served by zgix pid {}",
        first.pid()
    );
    assert!(second.stderr.contains(&want), "stderr:\n{}", second.stderr);
    assert!(
        !second.stderr.contains(" ready ("),
        "stderr:\n{}",
        second.stderr
    );
}

#[test]
fn an_upgrade_hands_the_sockets_over_and_loses_no_connection() {
    let o = Origin::start();
    let port = free_port();
    let json = config(port, o.addr(), "");
    let mut old = Proc::start(&json, &[]);
    let addr = old.listeners()[0];
    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(Mutex::new(Vec::<String>::new()));
    let client = {
        let (stop, ok, failures) = (stop.clone(), ok.clone(), failures.clone());
        thread::spawn(move || {
            while !stop.load(Ordering::Acquire) {
                match one_request(addr) {
                    Ok(()) => {
                        ok.fetch_add(1, Ordering::AcqRel);
                    }
                    Err(e) => failures.lock().unwrap().push(e),
                }
            }
        })
    };
    let wait_ok = |n: usize| {
        let target = ok.load(Ordering::Acquire) + n;
        let deadline = std::time::Instant::now() + lifecycle_support::WAIT;
        while ok.load(Ordering::Acquire) < target {
            assert!(
                std::time::Instant::now() < deadline,
                "the client loop stalled"
            );
            thread::sleep(Duration::from_millis(2));
        }
    };
    wait_ok(20);
    let new = Proc::start(&json, &["--upgrade"]);
    assert!(
        new.stderr().contains(&format!(
            "took the listening sockets over from pid {}",
            old.pid()
        )),
        "{}",
        new.stderr()
    );
    assert_eq!(new.listeners(), vec![addr]);
    let status = old.wait_exit();
    assert!(
        status.success(),
        "old exit {status}; stderr:\n{}\nnew stderr:\n{}",
        old.stderr(),
        new.stderr()
    );
    assert!(old.stderr().contains(&format!(
        "pid {} accepts on the listening sockets now",
        new.pid()
    )));
    wait_ok(20);
    stop.store(true, Ordering::Release);
    let _ = client.join();
    let failures = failures.lock().unwrap().clone();
    assert!(
        failures.is_empty(),
        "{} failed: {failures:?}\nold stderr:\n{}\nnew stderr:\n{}",
        failures.len(),
        old.stderr(),
        new.stderr()
    );
    // The new instance holds the guard now: a third one is refused, naming it.
    let file = TempConfig::new(&with_test_defaults(&json));
    let third = run_zgix(&["--config", &file.path.to_string_lossy()]);
    assert!(
        third
            .stderr
            .contains(&format!("served by zgix pid {}", new.pid())),
        "{}",
        third.stderr
    );
}

/// One `Connection: close` request on a new connection.
fn one_request(addr: SocketAddr) -> Result<(), String> {
    let mut s = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    s.write_all(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .map_err(|e| format!("send: {e}"))?;
    let mut out = Vec::new();
    s.read_to_end(&mut out).map_err(|e| format!("read: {e}"))?;
    if out.starts_with(b"HTTP/1.1 200 ") {
        Ok(())
    } else {
        Err(format!("answer: {:?}", String::from_utf8_lossy(&out)))
    }
}

/// A zgix with a drain timeout of `drain_ms` and one request in flight to
/// an origin that accepts and never answers (the client, the origin side).
fn one_request_held(drain_ms: u64) -> (Proc, Client, TcpStream) {
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let origin = silent.local_addr().unwrap();
    let json = format!(
        r#"{{"cpus": [0], "listeners": [{{"bind": "127.0.0.1:0", "http": {{"cluster": "c"}}}}],
            "clusters": {{"c": {{"endpoints": ["{origin}"]}}}},
            "limits": {{"drain_timeout_ms": {drain_ms}, "upstream_header_timeout_ms": 30000}}}}"#
    );
    let zgix = Proc::start(&json, &[]);
    let mut client = Client::connect(zgix.listeners()[0]);
    client.send(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n");
    let (held, _) = silent.accept().expect("zgix connects to the origin");
    (zgix, client, held)
}

#[test]
fn a_drain_cut_by_its_deadline_reports_it_and_exits_3() {
    let (mut zgix, _client, _held) = one_request_held(300);
    zgix.signal("TERM");
    exits_3_saying(&mut zgix, "drain deadline passed: cut 1 connection(s)");
}

/// Waits for zgix to exit, asserting status 3 and `said` in its log.
fn exits_3_saying(zgix: &mut Proc, said: &str) {
    let status = zgix.wait_exit();
    assert_eq!(status.code(), Some(3), "stderr:\n{}", zgix.stderr());
    assert!(zgix.stderr().contains(said), "{}", zgix.stderr());
}

#[test]
fn term_then_int_counts_what_it_cut() {
    let (mut zgix, _client, _held) = one_request_held(30_000);
    zgix.signal("TERM");
    zgix.wait_log("signal TERM: draining", 1);
    zgix.signal("INT");
    exits_3_saying(&mut zgix, "cut 1 connection(s), 1 request(s) in flight");
}

#[test]
fn usr1_usr2_and_alrm_are_logged_and_do_not_stop_zgix() {
    let o = Origin::start();
    let zgix = Proc::start(&config(free_port(), o.addr(), ""), &[]);
    zgix.signal("USR2");
    zgix.wait_log("signal USR2: ignored", 1);
    zgix.signal("ALRM");
    zgix.wait_log("signal ALRM: ignored", 1);
    zgix.signal("USR1");
    zgix.wait_log("signal USR1: log files reopened", 1);
    assert!(
        one_request(zgix.listeners()[0]).is_ok(),
        "{}",
        zgix.stderr()
    );
}
