//! Proves the hot-path calls (request, response and chunked parsing) never touch the heap once their state is built.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use zgix_parser::{
    canonicalize_path, rechunk, ChunkedDecoder, Limits, Method, RequestHead, RequestParser,
    ResponseHead, ResponseParser, Status, RECHUNK_SLACK,
};

/// Counts allocations made by the current thread, so tests running in parallel on other
/// threads do not disturb the count.
struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

fn bump() {
    // try_with: the allocator may run while the thread-local is being torn down.
    let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        bump();
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        bump();
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        bump();
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations made by `f` on this thread.
fn allocations<R>(f: impl FnOnce() -> R) -> (u64, R) {
    let before = ALLOCS.with(Cell::get);
    let r = f();
    (ALLOCS.with(Cell::get) - before, r)
}

#[test]
fn counter_sees_allocations() {
    let (n, v) = allocations(|| vec![1u8; 16]);
    assert!(n >= 1);
    drop(v);
}

#[test]
fn request_parse_does_not_allocate() {
    // zgix's default limits (zgix-config defines them; this crate does not
    // depend on it): 8 KiB line, 32 KiB head, 100 fields, 1 GiB body.
    let limits = Limits {
        max_request_line: 8 << 10,
        max_header_bytes: 32 << 10,
        max_headers: 100,
        max_body: 1 << 30,
    };
    let parser = RequestParser::new(limits);
    let mut head = RequestHead::new(&limits);
    let many_fields: String = (0..limits.max_headers - 3)
        .map(|i| format!("X-Field-{i}: value {i}\r\n"))
        .collect();
    let long_path = format!("/{}", "seg/./../x//".repeat(200));
    let requests = [
        "GET /a/./b/../c?x=1 HTTP/1.1\r\nHost: example.com\r\nConnection: x-a, keep-alive\r\nX-A: 1\r\n\r\n".to_string(),
        "POST http://example.com/up HTTP/1.1\r\nHost: example.com\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n".to_string(),
        format!("GET {long_path} HTTP/1.0\r\n{many_fields}Host: a\r\nContent-Length: 5\r\n\r\n"),
        "OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n".to_string(),
        // Errors do not allocate either.
        "GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n".to_string(),
        "GET / HTTP/1.1\r\n\r\n".to_string(),
    ];
    for req in &requests {
        let buf = req.as_bytes();
        for k in [buf.len() / 2, buf.len()] {
            let (n, r) = allocations(|| parser.parse(&buf[..k], &mut head));
            assert_eq!(
                n, 0,
                "{n} allocations parsing {} bytes of {req:?}: {r:?}",
                k
            );
        }
    }
    assert!(matches!(
        parser.parse(requests[2].as_bytes(), &mut head),
        Ok(Status::Complete(()))
    ));
    assert_eq!(head.headers.len(), limits.max_headers - 1);
}

#[test]
fn canonicalize_path_does_not_allocate_with_capacity() {
    let raw = b"//a/./b/../%2e%2E/c/%7e";
    let mut out = Vec::with_capacity(raw.len() + 1);
    let (n, r) = allocations(|| canonicalize_path(raw, &mut out));
    assert_eq!(n, 0);
    assert_eq!(r, Ok(()));
    assert_eq!(out, b"/c/~");
}

#[test]
fn rechunk_does_not_allocate_with_slack() {
    let msg = b"5;a=b\r\nhello\r\n10\r\n0123456789abcdef\r\n0\r\nX: y\r\n\r\n";
    let mut dec = ChunkedDecoder::new(u64::MAX);
    let mut out = Vec::with_capacity(msg.len() + RECHUNK_SLACK);
    for cut in [3, 20] {
        let (n, r) = allocations(|| rechunk(&mut dec, &msg[..cut], &mut out));
        assert_eq!(n, 0);
        assert!(r.is_ok());
    }
    dec.reset();
    out.clear();
    let (n, r) = allocations(|| rechunk(&mut dec, msg, &mut out));
    assert_eq!(n, 0);
    assert_eq!(r.map(|r| r.done), Ok(true));
    assert_eq!(out, b"5\r\nhello\r\n10\r\n0123456789abcdef\r\n0\r\n\r\n");
}

#[test]
fn response_parse_does_not_allocate() {
    let parser = ResponseParser::new(16 * 1024, 100);
    let mut head = ResponseHead::new(100);
    for resp in [
        &b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: x-a\r\nX-A: 1\r\n\r\nhello"[..],
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"HTTP/1.0 204 No Content\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
    ] {
        let (n, _) = allocations(|| parser.parse(resp, Method::Get, &mut head));
        assert_eq!(n, 0);
    }
}

#[test]
fn chunked_feed_does_not_allocate() {
    let body = b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-T: 1\r\n\r\nNEXT";
    let mut dec = ChunkedDecoder::new(1024);
    let (n, ()) = allocations(|| {
        for piece in body.chunks(3) {
            let mut rest = piece;
            while !rest.is_empty() && !dec.is_done() {
                let p = dec.feed(rest).unwrap();
                rest = &rest[p.consumed..];
            }
        }
        dec.reset();
        let _ = dec.feed(b"zz");
    });
    assert_eq!(n, 0);
}
