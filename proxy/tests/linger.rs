//! Closing connections: after an error answer zgix drains what the client still sends for at most its lingering time in all, however the client trickles bytes; and an answer zgix closes after goes out, FIN and all, without the shard's park waiting for an event that will not come.

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

/// Every answer zgix closes after (HTTP/1.0, `Connection: close`, a 400
/// refusal, the admin endpoint's) reaches the client
/// with its FIN, and no park slept to the inline-send backstop for it
/// (`zgix_io_backstop_parks_total` stays where it was). The driver test
/// `an_answer_before_a_close_does_not_wait_for_the_backstop` shows the
/// mechanism; this one guards the plaintext paths end to end.
#[test]
fn answers_before_zgix_closes_do_not_wait_for_the_backstop() {
    let origin = Origin::start();
    let cfg = Config::new(&[origin.addr()]).cpus(&[0]).admin();
    let z = Zgix::start(&cfg);
    let start = series(&metrics_after_tick(&z), "zgix_io_backstop_parks_total");
    let requests: [&[u8]; 3] = [
        b"GET /a HTTP/1.0\r\n\r\n",
        b"GET /b HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a\r\nBad Header: x\r\n\r\n",
    ];
    for _ in 0..5 {
        for r in requests {
            // raw_request reads to EOF: zgix's FIN ends it.
            let got = raw_request(z.addr(), r);
            assert!(got.starts_with(b"HTTP/1."), "\"{}\"", escape(&got));
        }
    }
    let m = metrics_after_tick(&z);
    let parks = series(&m, "zgix_io_backstop_parks_total") - start;
    assert_eq!(parks, 0.0, "parks slept to the backstop\n{m}");
}
