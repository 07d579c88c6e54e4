//! What an idle HTTP/2 connection holds: heap per idle h2c connection by zgix's counting allocator (`zgix_heap_live_bytes`), below a bound that counts the `h2` codec's fixed buffers and what zgix keeps itself.

mod http2_support;
mod support;

use std::io::{Read, Write};
use std::net::TcpStream;

use http2_support::*;
use support::{metrics_after_tick, series, Origin, Zgix};

/// Idle connections held for the figure: enough that the shard's own
/// churn (a scrape, a timer) is a few bytes per connection.
const CONNS: usize = 100;

/// The `h2` crate's buffers, allocated at its handshake and kept for the
/// connection's life (0.4 can neither size nor free them): `FramedWrite`'s
/// 16 KiB, `FramedRead`'s 8 KiB, the HPACK decoder's 4 KiB, its stream
/// store 0.6 KiB.
const CODEC_BYTES: f64 = 29_300.0;

/// What zgix may hold beside them per idle connection: the connection's
/// future with the codec inline (2 KiB), its task, the wait for bytes and
/// for a drain. It was 8 KiB while the codec was kept three times over in
/// the connection's future and a read's state lived across the idle wait.
const ZGIX_BYTES: f64 = 4_096.0;

/// A prior-knowledge connection once the server acknowledged its SETTINGS:
/// zgix read the preface and SETTINGS and waits for the next frame.
fn idle_h2c(z: &Zgix) -> TcpStream {
    let mut s = TcpStream::connect(z.addr()).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    s.write_all(PREFACE).unwrap();
    s.write_all(&Raw::frame_bytes(SETTINGS, 0, 0, &[])).unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let mut at = 0;
        while buf.len() >= at + 9 {
            let len = u32::from_be_bytes([0, buf[at], buf[at + 1], buf[at + 2]]) as usize;
            if buf[at + 3] == SETTINGS && buf[at + 4] & 1 == 1 {
                return s;
            }
            at += 9 + len;
        }
        let n = s.read(&mut chunk).expect("the server's SETTINGS ACK");
        assert!(n > 0, "closed before the SETTINGS ACK");
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn live_bytes(z: &Zgix) -> f64 {
    series(&metrics_after_tick(z), "zgix_heap_live_bytes")
}

#[test]
fn an_idle_h2c_connection_holds_the_codecs_buffers_and_at_most_4_kib_more() {
    let o = Origin::start();
    let z = Zgix::start_json(&h2c_config(o.addr(), "", ""));
    // Served streams first: the shard's buffer pools exist before the
    // baseline, and an idle connection holds none of them.
    let mut warm = Raw::open(z.addr());
    for id in [1, 3, 5] {
        warm.headers(id, &get_block("/"), true);
        assert_eq!(warm.answer(id), Some(Ok(200)));
    }
    let before = live_bytes(&z);
    let held: Vec<TcpStream> = (0..CONNS).map(|_| idle_h2c(&z)).collect();
    let per = (live_bytes(&z) - before) / CONNS as f64;
    assert!(
        per > CODEC_BYTES,
        "{per:.0} bytes per idle h2c connection: less than the codec's own buffers?"
    );
    assert!(
        per <= CODEC_BYTES + ZGIX_BYTES,
        "{per:.0} bytes per idle h2c connection, over {}",
        CODEC_BYTES + ZGIX_BYTES
    );
    drop(held);
    // Still serving.
    warm.headers(7, &get_block("/"), true);
    assert_eq!(warm.answer(7), Some(Ok(200)));
}
