//! What an idle HTTP/2 connection holds: heap per idle h2c connection by zgix's counting allocator (`zgix_heap_live_bytes`), fresh, after a request (no read or write buffer is kept once the bytes are used and written), and after answers with changing field values (zgix's HPACK encoder keeps no table; the client's indexed request fields stay in the decoder's).

mod http2_support;
mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};

use http2_support::*;
use support::{metrics_after_tick, series, Origin, Zgix};

/// Idle connections held for the figure: enough that the shard's own
/// churn (a scrape, a timer) is a few bytes per connection.
const CONNS: usize = 100;

/// What an idle h2c connection may hold, all of it: the connection's task
/// and future, the codec (its 528-byte `Server` beside the streams' slots),
/// the boxed wait for bytes and for a drain. Over the `h2` crate it was
/// 32 KiB, 29.3 of them the crate's fixed buffers (16 KiB to write, 8 to
/// read, a 4 KiB HPACK table, 0.6 its stream store), which it could
/// neither size nor free; a read buffer (32 KiB) or a stream's state kept
/// would be over it too.
const IDLE_BYTES: f64 = 4_096.0;

/// The HPACK decoder's dynamic table once a client indexed its request
/// fields (RFC 7541 §2.3.2; the test's GETs index none, h2load's five
/// take 224 bytes): bounded by SETTINGS_HEADER_TABLE_SIZE 4,096 and its
/// bookkeeping.
const TABLE_BYTES: f64 = 5_632.0;

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
fn an_idle_h2c_connection_holds_at_most_4_kib() {
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
        per > 0.0,
        "{per:.0} bytes per idle h2c connection: nothing counted?"
    );
    assert!(
        per <= IDLE_BYTES,
        "{per:.0} bytes per idle h2c connection, over {IDLE_BYTES}"
    );
    drop(held);
    // Still serving.
    warm.headers(7, &get_block("/"), true);
    assert_eq!(warm.answer(7), Some(Ok(200)));
}

/// Answers a connection made, each with a new `x-seq` value (a field the
/// codec's HPACK table indexes, as it would a `Date`) and `BODY` bytes.
const ANSWERS: u32 = 24;
const BODY: usize = 4096;

/// An origin answering every request with the next `x-seq` and `BODY` bytes.
fn sequence_origin() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        let seq = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            let seq = seq.clone();
            std::thread::spawn(move || {
                let (mut head, mut b) = (Vec::new(), [0u8; 2048]);
                loop {
                    while let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
                        head.drain(..end + 4);
                        let n = seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let mut a = format!(
                            "HTTP/1.1 200 OK\r\nx-seq: {n}\r\ncontent-length: {BODY}\r\n\r\n"
                        )
                        .into_bytes();
                        a.resize(a.len() + BODY, b'x');
                        if s.write_all(&a).is_err() {
                            return;
                        }
                    }
                    match s.read(&mut b) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&b[..n]),
                    }
                }
            });
        }
    });
    addr
}

/// `ANSWERS` GETs on a new connection, one after the other, the window
/// given back after each; the connection is left open and idle.
fn served(z: &Zgix) -> Raw {
    let mut c = Raw::open(z.addr());
    for i in 0..ANSWERS {
        let id = 2 * i + 1;
        c.headers(id, &get_block("/"), true);
        c.answer_end(id).expect("the answer ends");
        let back = (BODY as u32).to_be_bytes();
        c.frame(WINDOW_UPDATE, 0, 0, &back);
    }
    // Our SETTINGS acknowledged after all of it: zgix is done with the
    // answers' frames.
    c.frame(SETTINGS, 0, 0, &[]);
    c.until(|f| f.kind == SETTINGS && f.flags & 1 == 1)
        .expect("a SETTINGS ACK");
    c
}

#[test]
fn answers_with_new_field_values_leave_an_idle_connection_their_heads_not_their_bodies() {
    let z = Zgix::start_json(&h2c_config(sequence_origin(), "", ""));
    drop(served(&z));
    let held: Vec<Raw> = vec![served(&z)];
    let before = live_bytes(&z);
    let held2: Vec<Raw> = (0..6).map(|_| served(&z)).collect();
    let per = (live_bytes(&z) - before) / 6.0;
    // The `h2` crate's encoder table kept up to 4 KiB of field values
    // (RFC 7541 §4.1), each with the head it was a slice of; zgix's
    // encoder indexes nothing, and no answer's head or body stays.
    assert!(
        per <= IDLE_BYTES + TABLE_BYTES,
        "{per:.0} bytes per idle h2c connection after {ANSWERS} answers, over {}",
        IDLE_BYTES + TABLE_BYTES
    );
    drop((held, held2));
}

/// Connections that each served a request (its 4 KiB answer written, the
/// window given back) and went idle: each holds what a fresh one does, no
/// read buffer (32 KiB), no write buffer, no stream state.
#[test]
fn an_idle_h2c_connection_after_a_request_holds_no_read_or_write_buffer() {
    let z = Zgix::start_json(&h2c_config(sequence_origin(), "", ""));
    // The pools exist before the baseline.
    let warm: Vec<Raw> = (0..4).map(|_| served_once(&z)).collect();
    let before = live_bytes(&z);
    let held: Vec<Raw> = (0..20).map(|_| served_once(&z)).collect();
    let per = (live_bytes(&z) - before) / 20.0;
    assert!(
        per <= IDLE_BYTES + 1024.0,
        "{per:.0} bytes per idle h2c connection after a request, over {}",
        IDLE_BYTES + 1024.0
    );
    drop((warm, held));
}

/// One GET on a new connection, answered whole; the connection is left
/// open once zgix acknowledged a later SETTINGS (it is done writing).
fn served_once(z: &Zgix) -> Raw {
    let mut c = Raw::open(z.addr());
    c.headers(1, &get_block("/"), true);
    c.answer_end(1).expect("the answer ends");
    c.frame(WINDOW_UPDATE, 0, 0, &(BODY as u32).to_be_bytes());
    c.frame(SETTINGS, 0, 0, &[]);
    c.until(|f| f.kind == SETTINGS && f.flags & 1 == 1)
        .expect("a SETTINGS ACK");
    c
}
