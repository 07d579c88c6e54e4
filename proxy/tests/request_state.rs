//! The request state's guard end to end: clients that vanish at every point of a request (inside a head, inside a body, while the origin thinks, with a pipelined request buffered) leave no request state out of the pool (`zgix_exchanges_in_use` back to 0), and the proxy serves the next client.

mod support;

use std::time::{Duration, Instant};

use support::{metrics_text, series, Client, Config, Origin, Zgix, IO_TIMEOUT};

/// Polls `/metrics` until `zgix_exchanges_in_use` is 0 (the shard tick
/// publishes it once a second), for at most `IO_TIMEOUT`; its last value.
fn exchanges_settle(z: &Zgix) -> f64 {
    let deadline = Instant::now() + IO_TIMEOUT;
    loop {
        let v = series(&metrics_text(z), "zgix_exchanges_in_use");
        if v == 0.0 || Instant::now() >= deadline {
            return v;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn clients_that_vanish_mid_request_leave_no_request_state_out() {
    let o = Origin::start();
    let z = Zgix::start(&Config::new(&[o.addr()]).admin());
    let addr = z.addr();
    // Half a head.
    let mut c = Client::connect(addr);
    c.send(b"GET / HTTP/1.1\r\nHost: t\r\nX-A: ");
    drop(c);
    // A head and part of its body (the upload is streaming when it goes).
    let mut c = Client::connect(addr);
    c.send(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\n0123456789");
    // (The origin records a request only once its body is whole: wait for
    // zgix's upstream connection instead.)
    let deadline = Instant::now() + IO_TIMEOUT;
    while o.accepted() < 1 {
        assert!(Instant::now() < deadline, "zgix never connected upstream");
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(c);
    // While the origin has not answered yet.
    let mut c = Client::connect(addr);
    c.send(b"GET /slow HTTP/1.1\r\nHost: t\r\n\r\n");
    o.wait_requests(1);
    drop(c);
    // A pipelined request buffered behind the first one's answer.
    let mut c = Client::connect(addr);
    c.send(b"GET /slow HTTP/1.1\r\nHost: t\r\n\r\nGET / HTTP/1.1\r\nHost: t\r\n\r\n");
    o.wait_requests(2);
    drop(c);
    // A kept-alive client that finished its request holds none either.
    let mut idle = Client::connect(addr);
    assert_eq!(idle.get("/").status, 200);
    let left = exchanges_settle(&z);
    assert_eq!(left, 0.0, "request states still out after the clients left");
    // The pool gives them out again: the next clients are served.
    for _ in 0..3 {
        let mut c = Client::connect(addr);
        assert_eq!(c.get("/").status, 200);
    }
    assert_eq!(idle.get("/again").status, 200);
    assert_eq!(exchanges_settle(&z), 0.0);
}
