//! The engine's soundness fixes seen from outside: the upstream connect timeout holds on both socket drivers (an endpoint that drops SYNs costs the connect timeout, then the next endpoint answers), and a shard at `max_connections` leaves further connections in the kernel's backlog instead of holding their descriptors.

mod support;

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::thread;
use std::time::{Duration, Instant};

use support::{Client, Config, Origin, Zgix};

/// The drivers to run on: the one the suite asks for (`ZGIX_TEST_DRIVER`),
/// else both.
fn drivers() -> Vec<Option<&'static str>> {
    if std::env::var("ZGIX_TEST_DRIVER").is_ok() {
        vec![None]
    } else {
        vec![Some("uring"), Some("epoll")]
    }
}

/// Starts zgix on `config`, on `driver` when one is named.
fn start_on(config: &Config, driver: Option<&str>) -> Zgix {
    let mut v: serde_json::Value = serde_json::from_str(&config.to_json()).unwrap();
    if let Some(d) = driver {
        v["io"] = serde_json::json!({ "driver": d });
    }
    Zgix::start_json(&v.to_string())
}

/// A listener on 127.0.0.1 whose accept queue is full (backlog 0 and
/// connections nobody accepts): Linux drops the SYNs of further connects,
/// which hang in SYN-SENT. Returns the socket, its address and the fillers.
fn syn_dropping_listener() -> (OwnedFd, SocketAddr, Vec<TcpStream>) {
    let std_l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = std_l.local_addr().unwrap();
    // SAFETY: listen(2) on an open, bound socket; re-listening sets the backlog.
    assert_eq!(unsafe { libc::listen(std_l.as_raw_fd(), 0) }, 0);
    // SAFETY: into_raw_fd hands over the open descriptor.
    let l = unsafe { OwnedFd::from_raw_fd(std::os::fd::IntoRawFd::into_raw_fd(std_l)) };
    let mut fillers = Vec::new();
    loop {
        match TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
            Ok(s) => fillers.push(s),
            Err(_) => break,
        }
        assert!(fillers.len() < 16, "the accept queue never filled");
    }
    // It stays full: another connect hangs too.
    let e = TcpStream::connect_timeout(&addr, Duration::from_millis(200)).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "{e}");
    (l, addr, fillers)
}

#[test]
fn an_endpoint_that_drops_syns_costs_the_connect_timeout_then_the_next_answers() {
    let (_l, dead, _fillers) = syn_dropping_listener();
    let origin = Origin::start();
    for driver in drivers() {
        let zgix = start_on(
            &Config::new(&[dead, origin.addr()])
                .cpus(&[0])
                .admin()
                .limit("upstream_connect_timeout_ms", 300),
            driver,
        );
        // Round robin on one shard: of two requests, one tries the dead
        // endpoint first.
        for i in 0..2 {
            let t = Instant::now();
            let mut c = Client::connect(zgix.addr());
            let r = c.get("/");
            let took = t.elapsed();
            assert_eq!(r.status, 200, "{driver:?} request {i}: {}", r.show());
            assert!(
                took < Duration::from_secs(1),
                "{driver:?} request {i} took {took:?}"
            );
        }
        let text = support::metrics_text(&zgix);
        let retries = support::series(&text, "zgix_upstream_retries_total{reason=\"connect\"}");
        assert!(
            retries >= 1.0,
            "{driver:?}: no connect was retried:\n{text}"
        );
    }
}

/// Descriptors the process holds now.
fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// Polls `cond` (bounded) until it holds.
#[track_caller]
fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_shard_at_its_cap_leaves_connections_in_the_backlog_then_serves_them() {
    const CAP: usize = 200;
    const CLIENTS: usize = 400;
    let origin = Origin::start();
    for driver in drivers() {
        let zgix = start_on(
            &Config::new(&[origin.addr()])
                .cpus(&[0])
                .admin()
                .limit("max_connections", CAP as u64),
            driver,
        );
        let idle = fds(zgix.pid());
        // A burst: every client waits in the backlog before the shard runs
        // again (the kernel completes handshakes of a stopped process), so
        // an accept that takes what the backlog has takes all of them.
        zgix.signal("STOP");
        let mut clients: Vec<TcpStream> = (0..CLIENTS)
            .map(|_| support::connect(zgix.addr()))
            .collect();
        zgix.signal("CONT");
        wait_for("the shard to reach its cap", || {
            support::metric(&zgix, "zgix_connections_active") >= CAP as f64
        });
        let pauses = support::metric(&zgix, "zgix_accept_pauses_total");
        assert!(pauses >= 1.0, "{driver:?}: never paused");
        let held = fds(zgix.pid());
        eprintln!("{driver:?}: {held} descriptors at the cap, {idle} idle");
        assert!(
            held <= CAP + 32,
            "{driver:?}: {held} descriptors held at a cap of {CAP} ({idle} when idle, {CLIENTS} clients)"
        );
        // The first half leave; every other client is then served.
        let rest = clients.split_off(CLIENTS / 2);
        drop(clients);
        let served: Vec<_> = rest
            .into_iter()
            .map(|s| {
                thread::spawn(move || {
                    let mut c = Client::from_stream(s);
                    c.stream().set_nodelay(true).ok();
                    c.writer()
                        .write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
                        .unwrap();
                    c.read_response().status
                })
            })
            .collect();
        for (i, t) in served.into_iter().enumerate() {
            assert_eq!(t.join().unwrap(), 200, "{driver:?}: waiting client {i}");
        }
    }
}
