//! End-to-end reload (SIGHUP): no request fails across reloads under load, listeners come and go, a bad file changes nothing and says why, the admission tables outlive the runtime.

mod lifecycle_support;
mod support;

use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use lifecycle_support::{free_port, Proc};
use support::{Client, Origin};

/// A config: one listener on `bind` to cluster `c` = `endpoints`, plus `http` extra fields and `limits`.
fn config(bind: &str, endpoints: &[SocketAddr], http: &str, limits: &str) -> String {
    let eps: Vec<String> = endpoints.iter().map(|e| format!("\"{e}\"")).collect();
    format!(
        r#"{{"cpus": [0, 1], "listeners": [{{"bind": "{bind}", "http": {{"cluster": "c"{http}}}}}],
            "clusters": {{"c": {{"endpoints": [{}]}}}}, "limits": {{{limits}}}}}"#,
        eps.join(",")
    )
}

/// The origin answering one `Connection: close` request on a new connection.
#[track_caller]
fn fresh_origin(addr: SocketAddr) -> String {
    let mut c = Client::connect(addr);
    let r = c.request(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    assert_eq!(r.status, 200, "{}", r.show());
    r.field("x-origin").unwrap_or("?").to_string()
}

fn status_on_new_connection(addr: SocketAddr) -> u16 {
    let mut c = Client::connect(addr);
    c.request(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .status
}

/// Requests in a loop on keep-alive connections (20 per connection) until
/// `stop`; counts answers and records every failure.
struct Load {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicUsize>,
    failures: Arc<Mutex<Vec<String>>>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl Load {
    fn start(addr: SocketAddr, threads: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let ok = Arc::new(AtomicUsize::new(0));
        let failures = Arc::new(Mutex::new(Vec::new()));
        let threads = (0..threads)
            .map(|_| {
                let (stop, ok, failures) = (stop.clone(), ok.clone(), failures.clone());
                thread::spawn(move || {
                    while !stop.load(Ordering::Acquire) {
                        if let Err(e) = connection(addr, &ok) {
                            failures.lock().unwrap().push(e);
                        }
                    }
                })
            })
            .collect();
        Load {
            stop,
            ok,
            failures,
            threads,
        }
    }

    /// Waits until `n` more requests were answered.
    fn wait_more(&self, n: usize) {
        let target = self.ok.load(Ordering::Acquire) + n;
        let deadline = std::time::Instant::now() + lifecycle_support::WAIT;
        while self.ok.load(Ordering::Acquire) < target {
            assert!(std::time::Instant::now() < deadline, "load stalled");
            thread::sleep(Duration::from_millis(2));
        }
    }

    fn finish(self) -> (usize, Vec<String>) {
        self.stop.store(true, Ordering::Release);
        for t in self.threads {
            let _ = t.join();
        }
        let failures = self.failures.lock().unwrap().clone();
        (self.ok.load(Ordering::Acquire), failures)
    }
}

fn connection(addr: SocketAddr, ok: &AtomicUsize) -> Result<(), String> {
    let s = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let mut c = Client::from_stream(s);
    for i in 0..20 {
        let closing = lifecycle_support::keep_alive_get(&mut c, i)?;
        ok.fetch_add(1, Ordering::AcqRel);
        if closing {
            return Ok(());
        }
    }
    Ok(())
}

#[test]
fn three_reloads_under_load_fail_no_request_and_new_connections_follow_the_config() {
    let a = Origin::named("a");
    let b = Origin::named("b");
    let zgix = Proc::start(&config("127.0.0.1:0", &[a.addr()], "", ""), &[]);
    let addr = zgix.listeners()[0];
    let load = Load::start(addr, 2);
    load.wait_more(50);
    for (n, (to, name)) in [(&b, "b"), (&a, "a"), (&b, "b")].into_iter().enumerate() {
        zgix.reload(&config("127.0.0.1:0", &[to.addr()], "", ""), n + 1);
        assert_eq!(zgix.listeners(), vec![addr], "the listener kept its socket");
        assert_eq!(fresh_origin(addr), name, "reload {} not applied", n + 1);
        load.wait_more(50);
    }
    let (ok, failures) = load.finish();
    assert!(
        failures.is_empty(),
        "{} of {ok} requests failed: {failures:?}",
        failures.len()
    );
    assert!(zgix
        .stderr()
        .contains("reload applied: generation 4 (1 listener(s) kept, 0 added, 0 removed)"));
}

#[test]
fn a_reload_adds_one_listener_and_removes_another_whose_request_in_flight_finishes() {
    let o = Origin::start();
    let (p1, p2) = (free_port(), free_port());
    let one = format!("127.0.0.1:{p1}");
    let two = format!("127.0.0.1:{p2}");
    let zgix = Proc::start(&config(&one, &[o.addr()], "", ""), &[]);
    let first = zgix.listeners()[0];
    let mut slow = Client::connect(first);
    slow.send(b"GET /slow HTTP/1.1\r\nHost: t\r\n\r\n");
    o.wait_requests(1);
    zgix.reload(&config(&two, &[o.addr()], "", ""), 1);
    let now = zgix.listeners();
    assert_eq!(now.len(), 1);
    assert_eq!(now[0].port(), p2);
    assert_eq!(status_on_new_connection(now[0]), 200);
    // The removed listener's request finishes on the old config...
    let r = slow.read_response();
    assert_eq!(r.status, 200, "{}", r.show());
    assert_eq!(r.body, b"slow\n");
    // ...and the removed listener accepts no more.
    let deadline = std::time::Instant::now() + lifecycle_support::WAIT;
    while TcpStream::connect(first).is_ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "{first} still accepts after its removal"
        );
        thread::sleep(Duration::from_millis(10));
    }
    assert!(zgix
        .stderr()
        .contains("(0 listener(s) kept, 1 added, 1 removed)"));
}

#[test]
fn a_bad_reload_keeps_serving_and_names_every_error() {
    let o = Origin::start();
    let good = config("127.0.0.1:0", &[o.addr()], "", "");
    let zgix = Proc::start(&good, &[]);
    let addr = zgix.listeners()[0];
    let mut kept = Client::connect(addr);
    assert_eq!(kept.get("/").status, 200);
    let bad = config(
        "127.0.0.1:0",
        &[o.addr()],
        r#", "conn_limit": {"max": 0}"#,
        r#""max_headers": 0"#,
    );
    zgix.write_config(&bad);
    zgix.signal("HUP");
    let log = zgix.wait_log("reload rejected", 1);
    assert!(
        log.contains("reload: listeners[0].http.conn_limit.max"),
        "{log}"
    );
    assert!(log.contains("reload: limits.max_headers"), "{log}");
    assert!(
        log.contains("reload rejected (2 error(s)); still serving generation 1"),
        "{log}"
    );
    assert_eq!(
        kept.get("/").status,
        200,
        "the open connection still serves"
    );
    assert_eq!(
        status_on_new_connection(addr),
        200,
        "the listener still serves"
    );
    // A good file afterwards applies as generation 2.
    zgix.reload(&good, 1);
    assert!(zgix.stderr().contains("reload applied: generation 2"));
}

const RATE: &str = r#", "rate_limit": {"requests": 2, "window_ms": 600000, "burst": 2}"#;

#[test]
fn a_drained_bucket_stays_drained_after_reload_unless_the_table_is_resized() {
    let o = Origin::start();
    let zgix = Proc::start(&config("127.0.0.1:0", &[o.addr()], RATE, ""), &[]);
    let addr = zgix.listeners()[0];
    assert_eq!(status_on_new_connection(addr), 200);
    assert_eq!(status_on_new_connection(addr), 200);
    assert_eq!(status_on_new_connection(addr), 429);
    // Another timeout, same geometry: the bucket is the same bucket.
    zgix.reload(
        &config(
            "127.0.0.1:0",
            &[o.addr()],
            RATE,
            r#""client_idle_timeout_ms": 30000"#,
        ),
        1,
    );
    assert_eq!(
        status_on_new_connection(addr),
        429,
        "the reload refilled the bucket"
    );
    // A resized table starts empty, and the log says so.
    zgix.reload(
        &config(
            "127.0.0.1:0",
            &[o.addr()],
            RATE,
            r#""rate_limit_entries": 8192"#,
        ),
        2,
    );
    assert!(zgix.stderr().contains(
        "limits.rate_limit_entries changed (4096 -> 8192): the rate-limit table starts empty"
    ));
    assert_eq!(status_on_new_connection(addr), 200);
}

#[test]
fn a_conn_limit_count_held_across_a_reload_is_released_when_its_connection_closes() {
    let o = Origin::start();
    let limit = r#", "conn_limit": {"max": 1}"#;
    let zgix = Proc::start(&config("127.0.0.1:0", &[o.addr()], limit, ""), &[]);
    let addr = zgix.listeners()[0];
    let mut holder = Client::connect(addr);
    assert_eq!(holder.get("/").status, 200);
    zgix.reload(
        &config(
            "127.0.0.1:0",
            &[o.addr()],
            limit,
            r#""client_idle_timeout_ms": 30000"#,
        ),
        1,
    );
    assert_eq!(
        status_on_new_connection(addr),
        503,
        "the held count was forgotten"
    );
    assert_eq!(holder.get("/").status, 200, "the holder still serves");
    drop(holder);
    let deadline = std::time::Instant::now() + lifecycle_support::WAIT;
    while status_on_new_connection(addr) != 200 {
        assert!(
            std::time::Instant::now() < deadline,
            "the count was never released"
        );
        thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_keep_alive_connection_serves_its_next_request_on_the_reloaded_config() {
    let a = Origin::named("a");
    let b = Origin::named("b");
    let bind = format!("127.0.0.1:{}", free_port());
    let zgix = Proc::start(&config(&bind, &[a.addr()], "", ""), &[]);
    let mut c = Client::connect(zgix.listeners()[0]);
    let r = c.get("/");
    assert_eq!(r.field("x-origin"), Some("a"), "{}", r.show());
    zgix.reload(&config(&bind, &[b.addr()], "", ""), 1);
    // Same client connection, opened before the reload: the next request
    // starts after it, so it goes where the new config says.
    let r = c.get("/");
    assert_eq!(r.field("x-origin"), Some("b"), "{}", r.show());
}
