//! Proves the request-path calls allocate nothing after construction, with a counting global allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use zgix_admission::{
    ClientId, ConnDecision, ConnTable, RateDecision, RateParams, RateTable, WafMatcher,
};

/// Counts allocations made by the current thread, so tests running in parallel on
/// other threads cannot disturb a measurement.
struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

fn bump() {
    // try_with: the slot may already be gone while a thread is exiting.
    let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        bump();
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        bump();
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        bump();
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations `f` makes on this thread.
fn allocations(f: impl FnOnce()) -> u64 {
    let before = ALLOCS.with(Cell::get);
    f();
    ALLOCS.with(Cell::get) - before
}

fn v4(i: u32) -> ClientId {
    ClientId::from_ip(IpAddr::V4(Ipv4Addr::from(i)))
}

#[test]
fn the_counter_sees_allocations() {
    // Guards against a counter that never counts.
    assert!(allocations(|| drop(std::hint::black_box(vec![1u8; 64]))) >= 1);
}

#[test]
fn rate_check_allocates_nothing() {
    let t = RateTable::new(1024);
    let p = RateParams {
        requests: 10,
        window_ms: 1000,
        burst: 3,
    };
    let n = allocations(|| {
        let mut now = 0;
        for i in 0..10_000u32 {
            // New identities, repeat identities, refusals and refills.
            let id = v4(i % 300);
            let d = t.check(id, p, now);
            std::hint::black_box(d);
            if i % 7 == 0 && d == RateDecision::Allowed {
                std::hint::black_box(t.refund(id, p));
            }
            let v6 = ClientId::from_ip(IpAddr::V6(Ipv6Addr::from(u128::from(i) << 64)));
            std::hint::black_box(t.check(v6, p, now));
            now += 50_000;
        }
        assert!(matches!(t.check(v4(1), p, 0), RateDecision::Limited { .. }));
    });
    assert_eq!(n, 0);
}

#[test]
fn conn_acquire_and_release_allocate_nothing() {
    let t = ConnTable::new(1024);
    let n = allocations(|| {
        for i in 0..10_000u32 {
            let a = t.acquire(v4(i % 50), 2);
            let b = t.acquire(v4(i % 50), 2);
            let c = t.acquire(v4(i % 50), 2);
            assert!(matches!(c, ConnDecision::Limited));
            drop((a, b, c));
        }
    });
    assert_eq!(n, 0);
    assert_eq!(t.in_use(), 0);
}

#[test]
fn waf_is_match_allocates_nothing() {
    let lits: Vec<String> = ["union select", "<script", "../"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let m = WafMatcher::new(&lits);
    let head = "GET /a/b/c?q=1 HTTP/1.1\r\nHost: example.com\r\nUser-Agent: x\r\n\r\n".repeat(16);
    let n = allocations(|| {
        for _ in 0..1000 {
            assert!(!m.is_match(head.as_bytes()));
            assert!(m.is_match(b"/x?q=1 UNION SELECT 2"));
            // Dense candidates: the memchr pass gives up and the DFA decides.
            assert!(!m.is_match(&[b'.'; 2048]));
        }
    });
    assert_eq!(n, 0);
}
