//! The engine's soundness fixes seen from outside: the upstream connect timeout holds on both socket drivers (an endpoint that drops SYNs costs the connect timeout, then the next endpoint answers), a shard at `max_connections` leaves further connections in the kernel's backlog instead of holding their descriptors, and a request state whose buffers cannot be mapped refuses that one connection with a 503.

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

/// Polls `cond` for up to 5 s; whether it came to hold.
fn wait_until(mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cond() {
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(20));
    }
    true
}

/// Raises this process's descriptor limit to its hard limit (zgix, started
/// from here, inherits it) and checks `need` fit under it.
fn raise_fd_limit(need: usize) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain getrlimit/setrlimit on this process with a valid struct.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        lim.rlim_cur = lim.rlim_max;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
    }
    assert!(
        lim.rlim_cur as usize >= need,
        "this test needs {need} descriptors; the hard limit is {}",
        lim.rlim_cur
    );
}

/// Connections waiting in the accept queue of the IPv4 listener on `port`
/// (`/proc/net/tcp`: a listening socket's `rx_queue` is its backlog).
fn backlog(port: u16) -> usize {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let local = format!("0100007F:{port:04X}");
    table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(1) == Some(&local.as_str()) && f.get(3) == Some(&"0A")).then(|| {
                let rx = f[4].split(':').nth(1).unwrap();
                usize::from_str_radix(rx, 16).unwrap()
            })
        })
        .sum()
}

/// `n` connections to `addr` made while zgix is stopped, so they all wait
/// in the backlog before the shard runs again (the kernel completes the
/// handshakes of a stopped process) and one accept could take them all.
fn burst(zgix: &Zgix, n: usize) -> Vec<TcpStream> {
    zgix.signal("STOP");
    let clients = (0..n).map(|_| support::connect(zgix.addr())).collect();
    zgix.signal("CONT");
    clients
}

/// One shard (CPU 0) with the admin API in front of `origin`, capped at
/// `cap` connections.
fn capped(origin: &Origin, cap: usize, driver: Option<&str>) -> Zgix {
    start_on(
        &Config::new(&[origin.addr()])
            .cpus(&[0])
            .admin()
            .limit("max_connections", cap as u64),
        driver,
    )
}

#[test]
fn a_shard_at_its_cap_leaves_connections_in_the_backlog_then_serves_them() {
    // The figures: a cap of 4,000 and 8,000 clients. The kernel's
    // backlog holds at most 4,096 (`somaxconn`), so they come in two bursts:
    // the first fills the shard to its cap, the second must stay in the
    // backlog (a multishot accept left armed took them as descriptors).
    const CAP: usize = 4000;
    const CLIENTS: usize = 8000;
    raise_fd_limit(CLIENTS + CAP + 256);
    let origin = Origin::start();
    for driver in drivers() {
        let zgix = capped(&origin, CAP, driver);
        let idle = fds(zgix.pid());
        let mut clients = burst(&zgix, CAP);
        wait_for("the shard to reach its cap", || {
            support::metric(&zgix, "zgix_connections_active") >= CAP as f64
        });
        let mut rest = burst(&zgix, CLIENTS - CAP);
        // A request answered on a held connection: the shard has run since
        // the second burst, so an accept still armed would have taken it.
        let mut first = Client::from_stream(clients.swap_remove(0));
        assert_eq!(first.get("/").status, 200, "{driver:?}: a held connection");
        let pauses = support::metric(&zgix, "zgix_accept_pauses_total");
        assert!(pauses >= 1.0, "{driver:?}: never paused");
        // Wait (bounded) for the whole burst to be counted. One that zgix
        // accepted never is, and the assertion below then says so: under
        // load the ring's last batch of accepts before the cap could leave
        // some armed, which took 1 of the 4,000 (fixed: a paused listener
        // cancels them; the test below pins it with a cap of 5).
        let port = zgix.addr().port();
        let _ = wait_until(|| backlog(port) >= CLIENTS - CAP);
        let held = fds(zgix.pid());
        let waiting = backlog(port);
        eprintln!(
            "{driver:?}: {held} descriptors at the cap, {idle} idle, {waiting} in the backlog"
        );
        assert!(
            held <= idle + CAP + 32,
            "{driver:?}: {held} descriptors held at a cap of {CAP} ({idle} when idle, {CLIENTS} clients)"
        );
        assert_eq!(
            waiting,
            CLIENTS - CAP,
            "{driver:?}: the second burst should wait in the backlog"
        );
        assert_eq!(
            support::metric(&zgix, "zgix_connections_active"),
            CAP as f64,
            "{driver:?}: connections counted at the cap"
        );
        // The first burst leaves; every waiting client is then served, by
        // a few threads in turn (the shard takes them as others close).
        drop(first);
        drop(clients);
        let chunk = rest.len().div_ceil(8);
        let served: Vec<_> = (0..8)
            .map(|_| {
                let part: Vec<TcpStream> = rest.drain(..chunk.min(rest.len())).collect();
                thread::spawn(move || {
                    part.into_iter()
                        .map(|s| {
                            let mut c = Client::from_stream(s);
                            c.writer()
                                .write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
                                .unwrap();
                            c.read_response().status
                        })
                        .collect::<Vec<u16>>()
                })
            })
            .collect();
        let statuses: Vec<u16> = served.into_iter().flat_map(|t| t.join().unwrap()).collect();
        assert_eq!(statuses.len(), CLIENTS - CAP, "{driver:?}: clients served");
        assert!(
            statuses.iter().all(|&s| s == 200),
            "{driver:?}: a waiting client was not answered 200"
        );
    }
}

#[test]
fn a_paused_listener_leaves_every_later_connection_in_the_backlog() {
    // A cap that is not a multiple of the ring's accepts in flight (4):
    // the last batch armed before the cap has accepts left over, which
    // must not take the next clients off the backlog while the shard
    // waits below its cap (they would be held, unserved, by a full shard).
    const CAP: usize = 5;
    const LATER: usize = 10;
    let origin = Origin::start();
    for driver in drivers() {
        let zgix = capped(&origin, CAP, driver);
        let mut clients = burst(&zgix, CAP);
        wait_for("the shard to reach its cap", || {
            support::metric(&zgix, "zgix_connections_active") >= CAP as f64
                && support::metric(&zgix, "zgix_accept_pauses_total") >= 1.0
        });
        let rest = burst(&zgix, LATER);
        // A request answered on a held connection (the others stay open, so
        // the shard stays at its cap): it has run, and entered the ring,
        // since the later clients connected.
        let mut first = Client::from_stream(clients.swap_remove(0));
        assert_eq!(first.get("/").status, 200, "{driver:?}: a held connection");
        let port = zgix.addr().port();
        let _ = wait_until(|| backlog(port) >= LATER);
        assert_eq!(
            backlog(port),
            LATER,
            "{driver:?}: a paused listener took clients off the backlog"
        );
        drop((first, clients, rest));
    }
}

/// This process's child `pid`'s address-space limit (`RLIMIT_AS`), soft
/// part only: `None` lifts it again.
fn limit_address_space(pid: u32, bytes: Option<u64>) {
    let lim = libc::rlimit {
        rlim_cur: bytes.unwrap_or(libc::RLIM_INFINITY),
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: prlimit on our own child with a valid struct; the old value is not asked for.
    let r = unsafe {
        libc::prlimit(
            pid as libc::pid_t,
            libc::RLIMIT_AS,
            &lim,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(r, 0, "prlimit: {}", std::io::Error::last_os_error());
}

/// The `VmSize` of process `pid`, in bytes.
fn address_space(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmSize:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .map(|v| v.trim().parse().unwrap())
        .expect("VmSize in /proc/PID/status");
    kib * 1024
}

#[test]
fn a_request_state_that_cannot_be_mapped_refuses_that_connection_503_and_the_process_goes_on() {
    // Real mapping failures: zgix's address space is capped below what it
    // already maps, so every new `mmap` fails with ENOMEM (the heap's
    // arenas are reserved already and keep serving small allocations). With
    // no request state pooled, each new head needs fresh buffers.
    let origin = Origin::start();
    for driver in drivers() {
        let mut v: serde_json::Value =
            serde_json::from_str(&Config::new(&[origin.addr()]).cpus(&[0]).admin().to_json())
                .unwrap();
        v["io"] = serde_json::json!({ "idle_exchanges": 0 });
        if let Some(d) = driver {
            v["io"]["driver"] = serde_json::json!(d);
        }
        let zgix = Zgix::start_json(&v.to_string());
        let mut kept = Client::connect(zgix.addr());
        assert_eq!(kept.get("/").status, 200, "{driver:?}: before the cap");
        let before = support::metric(&zgix, "zgix_request_state_refused_total");
        let forwarded = origin.requests().len();

        limit_address_space(zgix.pid(), Some(address_space(zgix.pid()) / 2));
        const REFUSED: usize = 3;
        for i in 0..REFUSED {
            let mut c = Client::connect(zgix.addr());
            c.send(b"GET / HTTP/1.1\r\nHost: test.local\r\n\r\n");
            let r = c.try_read_response(false).unwrap_or_else(|e| {
                panic!(
                    "{driver:?}: connection {i}: {e}; zgix alive: {}; stderr:\n{}",
                    std::path::Path::new(&format!("/proc/{}/stat", zgix.pid())).exists(),
                    zgix.stderr()
                )
            });
            assert_eq!(r.status, 503, "{driver:?}: connection {i}: {}", r.show());
            assert_eq!(
                r.field("connection"),
                Some("close"),
                "{driver:?}: connection {i}"
            );
            c.expect_closed();
        }
        // A kept-alive connection's next request needs a state too.
        let r = kept.get("/");
        assert_eq!(r.status, 503, "{driver:?}: kept-alive connection");
        kept.expect_closed();
        limit_address_space(zgix.pid(), None);

        // The same process serves again, and counted each refusal.
        let mut c = Client::connect(zgix.addr());
        assert_eq!(c.get("/").status, 200, "{driver:?}: after the cap");
        assert_eq!(
            support::metric(&zgix, "zgix_request_state_refused_total") - before,
            (REFUSED + 1) as f64,
            "{driver:?}: refusals counted; stderr:\n{}",
            zgix.stderr()
        );
        assert!(
            zgix.stderr().contains("cannot make a request state"),
            "{driver:?}: the refusal is logged"
        );
        // No refused request reached the origin.
        assert_eq!(
            origin.requests().len(),
            forwarded + 1,
            "{driver:?}: requests forwarded"
        );
    }
}
