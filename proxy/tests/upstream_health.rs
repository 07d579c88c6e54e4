//! Upstreams through the request path: a dead or hanging endpoint is ejected and retried around, an ejected one comes back, weights and least_conn choose, and a steady load reuses its upstream connections.

mod support;

use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use support::*;

/// zgix with an admin endpoint and cluster `api` = `endpoints` (JSON array
/// items) with `cluster_extra` spliced into the cluster object.
fn start(endpoints: &str, cluster_extra: &str, limits: &str) -> Zgix {
    Zgix::start_json(&format!(
        r#"{{"cpus":[0],"admin":{{"bind":"127.0.0.1:0"}},
"listeners":[{{"bind":"127.0.0.1:0","http":{{"cluster":"api"}}}}],
"clusters":{{"api":{{"endpoints":[{endpoints}]{cluster_extra}}}}},
"limits":{{{limits}}}}}"#
    ))
}

/// A port nothing listens on (bound, then closed).
fn dead_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// An endpoint that accepts connections and never answers; counts them.
fn hanging() -> (SocketAddr, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let n = Arc::new(AtomicUsize::new(0));
    let count = n.clone();
    thread::spawn(move || {
        let mut held = Vec::new();
        for s in l.incoming().flatten() {
            count.fetch_add(1, Ordering::SeqCst);
            held.push(s);
        }
    });
    (addr, n)
}

fn label(addr: SocketAddr) -> String {
    format!("{{cluster=\"api\",endpoint=\"{addr}\"}}")
}

#[test]
fn a_dead_endpoint_costs_the_clients_nothing_and_is_ejected() {
    let origin = Origin::start();
    let dead = dead_port();
    let z = start(
        &format!(r#""{}","{dead}""#, origin.addr()),
        r#","health":{"passive":{"failures":3,"ejection_ms":60000}}"#,
        "",
    );
    let mut c = Client::connect(z.addr());
    for i in 0..200 {
        let r = c.get("/");
        assert_eq!(r.status, 200, "request {i}: {}", r.show());
    }
    let m = metrics_text(&z);
    assert_eq!(
        series(
            &m,
            &format!("zgix_upstream_endpoint_healthy{}", label(dead))
        ),
        0.0
    );
    assert!(series(&m, &format!("zgix_upstream_ejections_total{}", label(dead))) >= 1.0);
    // Connect failures before the ejection were retried on the live endpoint.
    assert!(
        series(&m, "zgix_upstream_retries_total{reason=\"connect\"}") >= 3.0,
        "{m}"
    );
    assert!(
        series(&m, "zgix_upstream_retries_total{reason=\"connect\"}") <= 3.0 + 1.0,
        "{m}"
    );
}

#[test]
fn a_hanging_endpoint_is_ejected_after_its_failures_and_gets_no_more_requests() {
    let origin = Origin::start();
    let (hang, accepted) = hanging();
    let z = start(
        &format!(r#""{}","{hang}""#, origin.addr()),
        r#","health":{"passive":{"failures":2,"ejection_ms":60000}}"#,
        r#""upstream_header_timeout_ms":200"#,
    );
    let mut timed_out = 0;
    for i in 0..40 {
        // A 504 closes the connection: one per request.
        let mut c = Client::connect(z.addr());
        let r = c.get("/");
        match r.status {
            200 => {}
            504 => timed_out += 1,
            s => panic!("request {i}: {s}: {}", r.show()),
        }
    }
    // Two header timeouts eject it. They are not retried (the origin had the
    // request): those two clients got 504, every other one 200.
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
    assert_eq!(timed_out, 2);
    let m = metrics_text(&z);
    assert_eq!(
        series(
            &m,
            &format!("zgix_upstream_endpoint_healthy{}", label(hang))
        ),
        0.0
    );
    assert_eq!(
        series(
            &m,
            "zgix_upstream_retries_total{reason=\"reset_before_response\"}"
        ),
        0.0,
        "{m}"
    );
}

#[test]
fn an_ejected_endpoint_is_tried_again_when_its_ejection_ends() {
    let origin = Origin::start();
    let dead = dead_port();
    let z = start(
        &format!(r#""{}","{dead}""#, origin.addr()),
        r#","health":{"passive":{"failures":1,"ejection_ms":100,"max_ejection_ms":100}}"#,
        "",
    );
    let mut c = Client::connect(z.addr());
    for _ in 0..4 {
        assert_eq!(c.get("/").status, 200);
    }
    // The endpoint comes back on the same port.
    let back = Origin::named_at("back", dead);
    let deadline = Instant::now() + Duration::from_secs(10);
    while back.requests().is_empty() {
        assert!(
            Instant::now() < deadline,
            "the endpoint was never tried again"
        );
        assert_eq!(c.get("/").status, 200);
    }
    let m = metrics_text(&z);
    assert_eq!(
        series(
            &m,
            &format!("zgix_upstream_endpoint_healthy{}", label(dead))
        ),
        1.0
    );
}

#[test]
fn weights_share_the_requests_within_10_percent() {
    let a = Origin::named("a");
    let b = Origin::named("b");
    let z = start(
        &format!(r#""{}",{{"address":"{}","weight":3}}"#, a.addr(), b.addr()),
        "",
        "",
    );
    let mut c = Client::connect(z.addr());
    for _ in 0..1000 {
        assert_eq!(c.get("/").status, 200);
    }
    let (na, nb) = (a.requests().len(), b.requests().len());
    assert_eq!(na + nb, 1000);
    assert!(
        na.abs_diff(250) <= 25 && nb.abs_diff(750) <= 75,
        "a {na}, b {nb}"
    );
}

#[test]
fn least_conn_sends_to_the_idle_endpoint_while_the_other_is_busy() {
    let slow = Origin::named("slow");
    let fast = Origin::named("fast");
    let z = start(
        &format!(r#""{}","{}""#, slow.addr(), fast.addr()),
        r#","lb":"least_conn""#,
        "",
    );
    // Hold a request in flight on whichever endpoint takes it first.
    let mut busy = Client::connect(z.addr());
    busy.send(b"GET /slow HTTP/1.1\r\nHost: t\r\n\r\n");
    let deadline = Instant::now() + Duration::from_secs(5);
    while slow.requests().len() + fast.requests().len() == 0 {
        assert!(Instant::now() < deadline, "the slow request never arrived");
        thread::yield_now();
    }
    let (held, idle) = if slow.requests().is_empty() {
        (&fast, &slow)
    } else {
        (&slow, &fast)
    };
    let mut c = Client::connect(z.addr());
    for _ in 0..10 {
        assert_eq!(c.get("/").status, 200);
    }
    assert_eq!(
        idle.requests().len(),
        10,
        "least_conn spread requests onto the busy endpoint"
    );
    assert_eq!(held.requests().len(), 1);
    assert_eq!(busy.read_response().status, 200);
}

#[test]
fn a_steady_200_connection_load_reuses_its_upstream_connections() {
    let origin = Origin::start();
    let z = start(&format!(r#""{}""#, origin.addr()), "", "");
    // 200 keep-alive clients, each sending requests back to back for 2 s.
    let addr = z.addr();
    let until = Instant::now() + Duration::from_secs(2);
    let clients: Vec<_> = (0..200)
        .map(|_| {
            thread::spawn(move || {
                let mut c = Client::connect(addr);
                let mut n = 0u32;
                while Instant::now() < until {
                    assert_eq!(c.get("/").status, 200);
                    n += 1;
                }
                n
            })
        })
        .collect();
    let total: u32 = clients.into_iter().map(|t| t.join().unwrap()).sum();
    assert!(total >= 400, "only {total} requests");
    let m = metrics_text(&z);
    let connects = series(&m, "zgix_upstream_connects_total");
    assert!(
        connects <= 400.0,
        "{connects} upstream connections for 200 clients"
    );
}
