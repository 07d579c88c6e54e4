//! The socket layer with busy polling off (`limits.busy_poll_us: 0`): every wait parks in epoll, and traffic, pipelining, streaming and timeouts still work.

mod support;

use std::thread;
use std::time::Duration;

use support::*;

fn sleepy_proxy() -> (Origin, Zgix) {
    let origin = Origin::start();
    let zgix = Zgix::start(
        &Config::new(&[origin.addr()])
            .cpus(&[0])
            .limit("busy_poll_us", 0)
            .limit("upstream_header_timeout_ms", 300),
    );
    (origin, zgix)
}

#[test]
fn keep_alive_with_quiet_gaps_reuses_both_sides() {
    let (origin, zgix) = sleepy_proxy();
    let mut client = Client::connect(zgix.addr());
    for i in 0..5 {
        // Gaps longer than any spin: each request arrives to a sleeping shard.
        if i > 0 {
            thread::sleep(Duration::from_millis(30));
        }
        let resp = client.get("/");
        assert_eq!(resp.status, 200, "{}", resp.show());
    }
    assert_eq!(origin.accepted(), 1, "the upstream connection was pooled");
}

#[test]
fn pipelined_requests_are_answered_in_order() {
    let (_origin, zgix) = sleepy_proxy();
    let mut client = Client::connect(zgix.addr());
    client.send(
        b"GET /status/201 HTTP/1.1\r\nHost: t\r\n\r\nGET /status/202 HTTP/1.1\r\nHost: t\r\n\r\nGET /status/203 HTTP/1.1\r\nHost: t\r\n\r\n",
    );
    for want in [201, 202, 203] {
        let resp = client.read_response();
        assert_eq!(resp.status, want, "{}", resp.show());
    }
}

#[test]
fn a_large_download_streams_through_a_sleeping_shard() {
    let (_origin, zgix) = sleepy_proxy();
    let mut client = Client::connect(zgix.addr());
    let n = 8 << 20;
    let resp = client.get(&format!("/source/{n}"));
    assert_eq!(resp.status, 200);
    assert_eq!(resp.body.len(), n);
    assert_eq!(resp.body, pattern(n as u64));
}

#[test]
fn deadlines_fire_while_the_shard_sleeps() {
    let (_origin, zgix) = sleepy_proxy();
    assert_refusal(
        zgix.addr(),
        b"GET /hang HTTP/1.1\r\nHost: t\r\n\r\n",
        504,
        "Gateway Timeout",
    );
    health_check(zgix.addr());
}
