//! No allocation per request once warm: with a stream kept open (so the connection never idles and keeps its buffers), a second round of 100 requests in flight, answered and written out, allocates nothing; and an idle connection frees what it held.

mod support;
use support::*;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Counts allocations (this test binary only).
struct Counting;

static ALLOCS: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's layout, passed on unchanged.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: `p` came from `alloc` with this layout.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as for `alloc` and `dealloc`.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static A: Counting = Counting;

/// 100 GETs from `first` on, each with fields the dynamic table has after the first round.
fn round(s: &mut Server, input: &[u8], ids: &mut Vec<u32>) {
    ids.clear();
    let n = s
        .recv(input, &mut |e| {
            if let Event::Request { id, .. } = e {
                ids.push(id);
            }
        })
        .unwrap();
    assert_eq!(n, input.len());
    for &id in ids.iter() {
        let f = [
            (&b"content-type"[..], &b"text/plain"[..]),
            (b"server", b"zgix"),
        ];
        s.send_response(id, 200, f.into_iter(), false).unwrap();
        s.send_data(id, b"hello", true).unwrap();
    }
    let n = s.pending().len();
    s.written(n);
}

fn requests(first: u32) -> Vec<u8> {
    let mut b = Vec::new();
    for i in 0..100 {
        let mut block = get("/index.html");
        lit_indexed(&mut block, b"user-agent", b"test");
        b.extend(headers(first + 2 * i, &block, true));
    }
    b
}

#[test]
fn a_warm_connection_allocates_nothing_per_request() {
    let mut c = Client::open(Config::default());
    c.send(&headers(1, &post(None), false));
    c.out();
    let mut s = c.s;
    let (one, two) = (requests(3), requests(203));
    let mut ids = Vec::with_capacity(100);
    round(&mut s, &one, &mut ids);
    let before = ALLOCS.load(Ordering::Relaxed);
    round(&mut s, &two, &mut ids);
    let allocs = ALLOCS.load(Ordering::Relaxed) - before;
    assert_eq!(ids.len(), 100);
    assert_eq!(allocs, 0, "allocations in a warm round of 100 requests");
    // Stream 1 ends: the connection is idle and its buffers go.
    s.recv(&frame(DATA, END_STREAM, 1, b""), &mut |_| {})
        .unwrap();
    s.send_response(1, 204, std::iter::empty(), true).unwrap();
    let n = s.pending().len();
    s.written(n);
    assert_eq!(s.open_streams(), 0);
    // What is left is the HPACK decoder's dynamic table, which the client
    // filled (200 indexed fields): at most 5,632 bytes for 4,096.
    assert!(s.heap_bytes() <= 5632, "{}", s.heap_bytes());
}
