//! A closing connection has a total time limit: after an error answer zgix drains what the client still sends for at most its lingering time in all, however the client trickles bytes.

mod support;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use support::*;

#[test]
fn a_trickling_client_cannot_hold_a_closing_connection() {
    let origin = Origin::start();
    let z = Zgix::start(&Config::new(&[origin.addr()]));
    let mut s = connect(z.addr());
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: a\r\nBad Header: x\r\n\r\n")
        .unwrap();
    // The 400, then zgix's FIN: it lingers from here on.
    let mut got = Vec::new();
    let mut b = [0u8; 1024];
    loop {
        match s.read(&mut b) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&b[..n]),
            Err(e) => panic!("no 400 and FIN ({e}): \"{}\"", escape(&got)),
        }
    }
    assert!(got.starts_with(b"HTTP/1.1 400 "), "\"{}\"", escape(&got));
    let lingering = Instant::now();
    // A byte every 100 ms; each one arrives well within any per-read
    // timeout. The connection is gone once a write fails (the first write
    // after zgix's close draws a reset, the next fails).
    let closed = loop {
        if s.write_all(b"x").is_err() {
            break lingering.elapsed();
        }
        assert!(
            lingering.elapsed() < Duration::from_secs(10),
            "still lingering after 10 s of trickled bytes"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    // The limit is 500 ms in all; the bound leaves room for a slow machine.
    assert!(closed < Duration::from_secs(3), "closed after {closed:?}");
    health_check(z.addr());
}
