//! The active health prober: `GET path` to every endpoint of clusters with `health.active`, from one shard (over TLS for a cluster with `tls`, checked as requests are).
//!
//! One shard runs [`run_prober`] (spawned by shard 0), so an endpoint is
//! probed once per interval, not once per shard. Its verdict goes into the
//! shared `EndpointHealth`, which every shard reads without a lock. Probes of
//! a cluster's endpoints are spread evenly over the interval so they do not
//! arrive together. A probe is good when the status line arrives within
//! `timeout_ms` (connect included) and its status is in `expect_status`;
//! `unhealthy` bad probes in a row mark the endpoint down and `healthy` good
//! ones bring it back. Endpoints start up: the first requests after start-up
//! are not refused while the first probes run.

use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use zgix_config::{Active, Target};

use crate::io::{Driver, Sock};
use crate::upstream::cluster::Upstreams;
use crate::upstream::conn::UpConn;
use crate::upstream::tls::{self, ClusterTls};

/// Bytes read for the status line: `HTTP/1.1 200` plus the separator.
const STATUS_LINE_PREFIX: usize = 13;

/// Probes every actively checked endpoint until the runtime drains. Runs on
/// the shard's `driver` (its sockets and timers), like everything of a shard.
pub async fn run_prober(up: Arc<Upstreams>, driver: Rc<Driver>) {
    let mut tasks = Vec::new();
    for c in &up.clusters {
        let Some(active) = &c.active else { continue };
        let n = c.endpoints.len() as u32;
        let interval = Duration::from_millis(active.interval_ms);
        for (i, &ep) in c.endpoints.iter().enumerate() {
            let stagger = interval * i as u32 / n.max(1);
            let task = probe_loop(up.clone(), driver.clone(), ep, active.clone(), stagger);
            tasks.push(glommio::spawn_local(task));
        }
    }
    for t in tasks {
        t.await;
    }
}

async fn probe_loop(
    up: Arc<Upstreams>,
    driver: Rc<Driver>,
    ep: usize,
    active: Active,
    stagger: Duration,
) {
    let u = &up.upstreams[ep];
    let cluster = &up.clusters[u.cluster].name;
    let host = active.host.as_deref().unwrap_or(&u.label);
    let request = format!(
        "GET {} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: zgix-health-check\r\nConnection: close\r\n\r\n",
        active.path
    );
    let interval = Duration::from_millis(active.interval_ms);
    let timeout = Duration::from_millis(active.timeout_ms);
    let tls = up.clusters[u.cluster].tls.get().map(|t| &**t);
    let (mut good, mut bad) = (0u32, 0u32);
    driver.sleep(stagger).await;
    while !up.draining.load(Relaxed) {
        let started = Instant::now();
        if u.health.admin_state() == crate::upstream::health::AdminState::Disabled {
            // Disabled by the operator: not probed (HAProxy's maintenance).
            driver.sleep(interval).await;
            continue;
        }
        let verdict = match u.addr.get() {
            None => Err("the name has not resolved".to_string()),
            Some(addr) => match probe_once(
                &driver,
                addr,
                tls.map(|t| (t, &u.target)),
                request.as_bytes(),
                timeout,
            )
            .await
            {
                Ok(s) if active.expect_status.contains(&s) => Ok(()),
                Ok(s) => Err(format!("status {s}")),
                Err(e) => Err(e),
            },
        };
        match verdict {
            Ok(()) => {
                (good, bad) = (good.saturating_add(1), 0);
                if good >= active.healthy && u.health.set_active_down(false) {
                    crate::log_info!(
                        "upstream",
                        "clusters.{cluster}: {} passed {good} active checks; up",
                        u.label
                    );
                }
            }
            Err(why) => {
                (good, bad) = (0, bad.saturating_add(1));
                if bad >= active.unhealthy && u.health.set_active_down(true) {
                    crate::log_info!(
                        "upstream",
                        "clusters.{cluster}: {} failed {bad} active checks ({why}); down",
                        u.label
                    );
                }
            }
        }
        driver
            .sleep(interval.saturating_sub(started.elapsed()))
            .await;
    }
}

/// One probe: connect (and the TLS handshake when `tls` is given, with the
/// endpoint's target), send `request`, read the status line, all within
/// `timeout`. Returns the status code, or why the probe failed.
pub async fn probe_once(
    driver: &Rc<Driver>,
    addr: SocketAddr,
    tls: Option<(&ClusterTls, &Target)>,
    request: &[u8],
    timeout: Duration,
) -> Result<u16, String> {
    let exchange = async {
        let sock = Sock::connect(driver, addr, timeout)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let s = match tls {
            None => UpConn::Plain(sock),
            Some((t, target)) => {
                let name = t
                    .name_for(target)
                    .ok_or_else(|| "TLS: no server name".to_string())?;
                match tls::handshake(&sock, t, name, timeout).await {
                    Ok(st) => UpConn::Tls(sock, st),
                    Err(r) => return Err(format!("TLS handshake: {}", r.label())),
                }
            }
        };
        s.write_all(request)
            .await
            .map_err(|e| format!("send: {e}"))?;
        let mut buf = [0u8; STATUS_LINE_PREFIX];
        let mut got = 0;
        while got < buf.len() {
            match s.read(&mut buf[got..]).await {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) => return Err(format!("read: {e}")),
            }
        }
        parse_status(&buf[..got])
    };
    match driver.timeout(timeout, exchange).await {
        Some(r) => r,
        None => Err(format!("no status line within {} ms", timeout.as_millis())),
    }
}

/// RFC 9112 §4: `status-line = HTTP-version SP status-code SP [ reason-phrase ]`,
/// `HTTP-version = "HTTP/" DIGIT "." DIGIT`. The SP after the code is
/// required by the grammar but some servers omit it before CRLF; accept both.
fn parse_status(b: &[u8]) -> Result<u16, String> {
    let garbled = || {
        Err(format!(
            "not an HTTP/1.x status line: {:?}",
            String::from_utf8_lossy(b)
        ))
    };
    if b.len() < 12
        || !b.starts_with(b"HTTP/1.")
        || !b[7].is_ascii_digit()
        || b[8] != b' '
        || !b[9..12].iter().all(u8::is_ascii_digit)
        || b.get(12).is_some_and(|&c| c != b' ' && c != b'\r')
    {
        return garbled();
    }
    let code = b[9..12]
        .iter()
        .fold(0u16, |n, d| n * 10 + u16::from(d - b'0'));
    if (100..=599).contains(&code) {
        Ok(code)
    } else {
        garbled()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::health::Avail;
    use std::io::{Read, Write};
    use std::net::TcpListener;
    use std::sync::atomic::{AtomicU16, AtomicUsize};
    use std::sync::Mutex;
    use zgix_config::Config;

    #[test]
    fn status_lines() {
        assert_eq!(parse_status(b"HTTP/1.1 200 OK\r"), Ok(200));
        assert_eq!(parse_status(b"HTTP/1.0 503\r"), Ok(503));
        assert_eq!(parse_status(b"HTTP/1.1 204"), Ok(204));
        for bad in [
            &b"HTTP/2 200 OK"[..],
            b"HTTP/1.1 20x ",
            b"SSH-2.0-Open",
            b"HTTP/1.1 099 x",
            b"",
        ] {
            assert!(parse_status(bad).is_err(), "{bad:?}");
        }
    }

    /// A loopback origin answering every connection with the current `status`
    /// and recording the first request head.
    struct Origin {
        addr: SocketAddr,
        status: Arc<AtomicU16>,
        probes: Arc<AtomicUsize>,
        first_head: Arc<Mutex<String>>,
    }

    fn origin() -> Origin {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let o = Origin {
            addr: l.local_addr().unwrap(),
            status: Arc::new(AtomicU16::new(200)),
            probes: Arc::new(AtomicUsize::new(0)),
            first_head: Arc::new(Mutex::new(String::new())),
        };
        let (status, probes, head) = (o.status.clone(), o.probes.clone(), o.first_head.clone());
        std::thread::spawn(move || {
            for mut s in l.incoming().flatten() {
                let mut buf = [0u8; 1024];
                let n = s.read(&mut buf).unwrap_or(0);
                let mut h = head.lock().unwrap();
                if h.is_empty() {
                    *h = String::from_utf8_lossy(&buf[..n]).into_owned();
                }
                drop(h);
                let code = status.load(Relaxed);
                let _ = write!(s, "HTTP/1.1 {code} X\r\ncontent-length: 0\r\n\r\n");
                probes.fetch_add(1, Relaxed);
            }
        });
        o
    }

    /// Runs `f` on a glommio executor with a zgix driver turning beside it.
    fn on_executor<F: std::future::Future<Output = ()> + 'static>(
        f: impl FnOnce(Rc<Driver>) -> F + Send + 'static,
    ) {
        glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .io_memory(crate::process::shard::IO_MEMORY)
            .spawn(move || async move {
                let d = Driver::new(&crate::io::Options::new(crate::io::Kind::Epoll)).unwrap();
                let t = glommio::spawn_local(d.clone().run());
                f(d.clone()).await;
                d.stop();
                t.await;
            })
            .unwrap()
            .join()
            .unwrap();
    }

    /// Waits (bounded) until `cond` holds, checking every 5 ms on the driver's timer.
    async fn until(d: &Rc<Driver>, what: &str, mut cond: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !cond() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            d.sleep(Duration::from_millis(5)).await;
        }
    }

    #[test]
    fn prober_marks_down_after_unhealthy_and_up_after_healthy() {
        let o = origin();
        let text = format!(
            r#"{{"listeners": [{{"bind": "127.0.0.1:0", "http": {{"cluster": "c"}}}}],
                "clusters": {{"c": {{"endpoints": ["{}"], "health": {{"active": {{
                  "path": "/healthz?deep=1", "host": "origin.test", "interval_ms": 100, "timeout_ms": 100,
                  "healthy": 2, "unhealthy": 3, "expect_status": [200, 204]}}}}}}}}}}"#,
            o.addr
        );
        let rt = Arc::new(Upstreams::build(&Config::from_json(&text).unwrap(), 1));
        on_executor(move |d| async move {
            let prober = glommio::spawn_local(run_prober(rt.clone(), d.clone()));
            let h = &rt.upstreams[0].health;
            until(&d, "a first probe", || o.probes.load(Relaxed) >= 1).await;
            assert_eq!(h.availability(0), Avail::Up);
            let head = o.first_head.lock().unwrap().clone();
            assert!(
                head.starts_with("GET /healthz?deep=1 HTTP/1.1\r\n"),
                "{head:?}"
            );
            assert!(head.contains("\r\nHost: origin.test\r\n"), "{head:?}");

            o.status.store(503, Relaxed);
            let at = o.probes.load(Relaxed);
            until(&d, "down", || h.availability(0) == Avail::Down).await;
            // Not before `unhealthy` (3) bad probes.
            assert!(o.probes.load(Relaxed) >= at + 3);

            o.status.store(204, Relaxed);
            let at = o.probes.load(Relaxed);
            until(&d, "up again", || h.availability(0) == Avail::Up).await;
            assert!(o.probes.load(Relaxed) >= at + 2);

            rt.draining.store(true, Relaxed);
            prober.await;
        });
    }

    #[test]
    fn probe_failures_are_explained() {
        // A port with no listener: bind one, note the port, close it.
        let dead = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let silent = TcpListener::bind("127.0.0.1:0").unwrap();
        let silent_addr = silent.local_addr().unwrap();
        on_executor(move |d| async move {
            let r = probe_once(
                &d,
                dead,
                None,
                b"GET / HTTP/1.1\r\n\r\n",
                Duration::from_millis(500),
            )
            .await;
            assert!(r.as_ref().unwrap_err().starts_with("connect:"), "{r:?}");
            // Accepted by the kernel backlog, never answered.
            let r = probe_once(
                &d,
                silent_addr,
                None,
                b"GET / HTTP/1.1\r\n\r\n",
                Duration::from_millis(50),
            )
            .await;
            assert_eq!(r, Err("no status line within 50 ms".into()));
            drop(silent);
        });
    }
}
