//! End-to-end zero-failure hand-off (issue 18 part 3): 10 upgrades and 10 reloads under a keep-alive load from client threads, not one socket error; listeners on one port-0 bind keep their sockets by name across a reorder.

mod lifecycle_support;
mod support;

use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use lifecycle_support::{free_port, Proc};
use support::{Client, Origin};

fn config(port: u16, origin: SocketAddr) -> String {
    format!(
        r#"{{"cpus": [0, 1], "listeners": [{{"bind": "127.0.0.1:{port}", "http": {{"cluster": "c"}}}}],
            "clusters": {{"c": {{"endpoints": ["{origin}"]}}}}}}"#
    )
}

/// Keep-alive clients: each sends requests back to back on one connection
/// and opens a new one when an answer says `Connection: close`; every
/// connect, send or read error is recorded.
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
                        if let Err(e) = keep_alive(addr, &ok, &stop) {
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

    #[track_caller]
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

fn keep_alive(addr: SocketAddr, ok: &AtomicUsize, stop: &AtomicBool) -> Result<(), String> {
    let s = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let mut c = Client::from_stream(s);
    for i in 0.. {
        if stop.load(Ordering::Acquire) {
            return Ok(());
        }
        let closing = lifecycle_support::keep_alive_get(&mut c, i)?;
        ok.fetch_add(1, Ordering::AcqRel);
        if closing {
            return Ok(());
        }
    }
    Ok(())
}

#[test]
fn ten_upgrades_and_ten_reloads_under_keep_alive_load_fail_no_request() {
    let o = Origin::start();
    let port = free_port();
    let json = config(port, o.addr());
    let mut current = Proc::start(&json, &[]);
    let addr = current.listeners()[0];
    let load = Load::start(addr, 4);
    load.wait_more(100);
    for round in 1..=10 {
        current.reload(&json, 1);
        load.wait_more(50);
        let new = Proc::start(&json, &["--upgrade"]);
        let mut old = std::mem::replace(&mut current, new);
        let status = old.wait_exit();
        assert!(
            status.success(),
            "upgrade {round}: old exit {status}; stderr:\n{}",
            old.stderr()
        );
        load.wait_more(50);
    }
    let (ok, failures) = load.finish();
    assert!(
        failures.is_empty(),
        "{} socket errors in {ok} requests over 10 upgrades and 10 reloads: {failures:?}",
        failures.len()
    );
    eprintln!("10 upgrades, 10 reloads: {ok} requests, 0 errors");
}

/// Two named listeners both on "127.0.0.1:0": a reload that swaps them keeps each
/// one's socket (its port) with its name. (Sockets were matched by the bind
/// string alone, first come first served, so the swap moved the ports.)
#[test]
fn listeners_sharing_a_port_zero_bind_keep_their_sockets_by_name_across_a_reorder() {
    let origin = Origin::start();
    let cfg = |a: &str, b: &str| {
        format!(
            r#"{{"cpus":[0],"listeners":[
  {{"bind":"127.0.0.1:0","name":"{a}","http":{{"cluster":"api"}}}},
  {{"bind":"127.0.0.1:0","name":"{b}","http":{{"cluster":"api"}}}}],
"clusters":{{"api":{{"endpoints":["{}"]}}}}}}"#,
            origin.addr()
        )
    };
    let zgix = Proc::start(&cfg("x", "y"), &[]);
    let before = zgix.listeners();
    assert_eq!(before.len(), 2);
    assert_ne!(before[0], before[1]);
    zgix.reload(&cfg("y", "x"), 1);
    let after = zgix.listeners();
    assert_eq!(
        after,
        [before[1], before[0]],
        "y and x swapped places but not ports"
    );
    // And each still serves.
    for a in after {
        let mut c = Client::connect(a);
        let r = c.request(b"GET /p HTTP/1.1\r\nHost: t\r\n\r\n");
        assert_eq!(r.status, 200);
    }
}
