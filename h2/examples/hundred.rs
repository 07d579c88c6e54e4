//! 100 requests on one connection, all in flight at once as h2load sends them (HEADERS with the fields indexed after the first), each answered with a small response (HEADERS and one DATA); for instruction counts under callgrind: `valgrind --tool=callgrind --toggle-collect='*hundred*exchange*' target/release/examples/hundred 20` counts 20 connections' exchanges.

use zgix_h2::frame::{self, END_HEADERS, END_STREAM, HEADERS, PREFACE, SETTINGS};
use zgix_h2::server::{Config, Event, Server};

/// A literal with incremental indexing, its name a literal (RFC 7541 §6.2.1).
fn lit_indexed(b: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    b.push(0x40);
    b.push(name.len() as u8);
    b.extend_from_slice(name);
    b.push(value.len() as u8);
    b.extend_from_slice(value);
}

/// The client's bytes: preface, SETTINGS, 100 GETs (the first one puts
/// :authority, :path and three fields in the dynamic table; the others
/// refer to them, one byte each, as nghttp2's encoder does).
fn client_bytes() -> Vec<u8> {
    let mut b = PREFACE.to_vec();
    frame::put_head(&mut b, 0, SETTINGS, 0, 0);
    frame::put_head(&mut b, 0, SETTINGS, frame::ACK, 0);
    let mut first = vec![0x82, 0x86];
    lit_indexed(&mut first, b":authority", b"127.0.0.1:8080");
    lit_indexed(&mut first, b":path", b"/index.html?q=1");
    lit_indexed(&mut first, b"user-agent", b"h2load nghttp2/1.64.0");
    lit_indexed(&mut first, b"accept", b"*/*");
    lit_indexed(&mut first, b"accept-encoding", b"gzip, deflate");
    // Newest first in the dynamic table: 62 accept-encoding ... 66 :authority.
    let rest = [
        0x82,
        0x86,
        0x80 | 66,
        0x80 | 65,
        0x80 | 64,
        0x80 | 63,
        0x80 | 62,
    ];
    for i in 0..100u32 {
        let block: &[u8] = if i == 0 { &first } else { &rest };
        frame::put_head(
            &mut b,
            block.len(),
            HEADERS,
            END_HEADERS | END_STREAM,
            1 + 2 * i,
        );
        b.extend_from_slice(block);
    }
    b
}

const BODY: &[u8] = b"hello, world\n";

thread_local! {
    /// What the last connection held on the heap once idle.
    static HEAP: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// One connection's exchange: returns the bytes the server wrote.
#[inline(never)]
fn exchange(input: &[u8], ids: &mut Vec<u32>) -> usize {
    let mut s = Server::new(Config::default());
    let mut out = s.pending().len();
    s.written(out);
    ids.clear();
    let used = s
        .recv(input, &mut |e| {
            if let Event::Request { id, head, .. } = e {
                std::hint::black_box(head.path);
                ids.push(id);
            }
        })
        .expect("a valid conversation");
    assert_eq!(used, input.len());
    for &id in ids.iter() {
        let fields = [
            (&b"content-type"[..], &b"text/plain"[..]),
            (b"content-length", b"13"),
            (b"date", b"Thu, 03 Dec 2026 18:00:00 GMT"),
            (b"server", b"zgix"),
        ];
        s.send_response(id, 200, fields.into_iter(), false).unwrap();
        s.send_data(id, BODY, true).unwrap();
    }
    out += s.pending().len();
    let n = s.pending().len();
    s.written(n);
    assert_eq!(s.open_streams(), 0);
    HEAP.with(|h| h.set(s.heap_bytes()));
    out
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1000);
    let input = client_bytes();
    let mut ids = Vec::with_capacity(100);
    let mut total = 0;
    let t = std::time::Instant::now();
    for _ in 0..n {
        total += exchange(&input, &mut ids);
    }
    let e = t.elapsed();
    println!(
        "{n} connections x 100 requests: {} bytes out, {:.0} ns per request; idle after: {} heap bytes, Server {} bytes inline",
        total,
        e.as_nanos() as f64 / (n * 100) as f64,
        HEAP.with(|h| h.get()),
        std::mem::size_of::<Server>(),
    );
}
