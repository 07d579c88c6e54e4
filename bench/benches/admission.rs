//! Admission hot-path benchmark: atomic slot tables vs `Mutex<HashMap>`, and the WAF engines, with allocation counts.
//!
//! Plain `Instant` loops (no harness) printing one table; run with
//! `cargo bench -p zgix-bench --bench admission`. Times are wall-clock nanoseconds per operation per
//! thread: with two threads both run the loop at once, so a number that doubles means
//! the threads serialised.

use std::alloc::{GlobalAlloc, Layout, System};

use aho_corasick::{AhoCorasick, AhoCorasickKind};
use std::collections::HashMap;
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::Instant;

use zgix_admission::{
    monotonic_now_ns, ClientId, ConnDecision, ConnTable, MemchrMatcher, RateDecision, RateParams,
    RateTable, TokenBucket, WafMatcher,
};

struct Counting;
static ALLOCS: AtomicU64 = AtomicU64::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const OPS: u64 = 2_000_000;
const MANY: u32 = 100_000;

/// A high rate so the hot key is admitted (and its bucket written) on every check.
const PARAMS: RateParams = RateParams {
    requests: 1_000_000_000,
    window_ms: 1,
    burst: 1_000_000,
};

fn id(i: u32) -> ClientId {
    ClientId::from_ip(IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i)))
}

/// Key for iteration `i` of thread `t`: one hot key, or a walk over `MANY` keys.
fn key(ids: &[ClientId], hot: bool, t: u64, i: u64) -> ClientId {
    if hot {
        ids[0]
    } else {
        ids[((i.wrapping_mul(2_654_435_761) + t * 7919) % ids.len() as u64) as usize]
    }
}

/// Runs `op(thread, i)` `OPS` times on each of `threads` threads at once; returns ns per
/// op per thread and allocations per op.
fn run<F>(threads: u64, op: F) -> (f64, f64)
where
    F: Fn(u64, u64) + Sync + Send + Copy + 'static,
{
    // Warm up (first touches of the tables, the clock base).
    for i in 0..OPS / 10 {
        op(0, i);
    }
    let barrier = Arc::new(Barrier::new(threads as usize + 1));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                barrier.wait();
                for i in 0..OPS {
                    op(t, i);
                }
            })
        })
        .collect();
    barrier.wait();
    let allocs = ALLOCS.load(Ordering::Relaxed);
    let start = Instant::now();
    for h in handles {
        h.join().unwrap();
    }
    let ns = start.elapsed().as_nanos() as f64 / OPS as f64;
    let allocs = (ALLOCS.load(Ordering::Relaxed) - allocs) as f64 / (OPS * threads) as f64;
    (ns, allocs)
}

fn row(name: &str, (ns, allocs): (f64, f64)) {
    println!("{name:<64} {ns:>9.1} {allocs:>11.3}");
}

fn leak<T>(x: T) -> &'static T {
    Box::leak(Box::new(x))
}

fn main() {
    let ids: &'static [ClientId] = Box::leak((0..MANY).map(id).collect());
    println!("{:<64} {:>9} {:>11}", "operation", "ns/op", "allocs/op");

    // The clock the proxy reads once per request.
    row(
        "monotonic_now_ns()",
        run(1, move |_, _| {
            black_box(monotonic_now_ns());
        }),
    );
    rate_rows(ids);
    conn_rows(ids);
    waf_rows();
}

/// The rate table against a mutex-guarded map, hot key and many keys.
fn rate_rows(ids: &'static [ClientId]) {
    // Rate: a fake clock that advances 100 ns per call keeps the timing about the table.
    let full = leak(AtomicU64::new(0));
    for threads in [1, 2] {
        for hot in [true, false] {
            let what = if hot { "1 hot key" } else { "100k keys" };
            let table = leak(RateTable::new(1 << 18));
            row(
                &format!("RateTable::check, {what}, {threads} thread(s)"),
                run(threads, move |t, i| {
                    let d = table.check(key(ids, hot, t, i), PARAMS, i * 100);
                    if d == RateDecision::TableFull {
                        full.fetch_add(1, Ordering::Relaxed);
                    }
                    black_box(d);
                }),
            );
            let map: &'static Mutex<HashMap<ClientId, TokenBucket>> =
                leak(Mutex::new(HashMap::with_capacity(MANY as usize)));
            row(
                &format!("  Mutex<HashMap> baseline, {what}, {threads} thread(s)"),
                run(threads, move |t, i| {
                    let now = i * 100;
                    let mut m = map.lock().unwrap();
                    let b = m
                        .entry(key(ids, hot, t, i))
                        .or_insert_with(|| TokenBucket::full(PARAMS, now));
                    black_box(b.check(PARAMS, now));
                }),
            );
        }
    }
    println!(
        "  (rate table TableFull answers across all runs: {})",
        full.load(Ordering::Relaxed)
    );
}

/// The connection table's acquire and release against a mutex-guarded map.
fn conn_rows(ids: &'static [ClientId]) {
    // Connections: acquire then drop the guard.
    for threads in [1, 2] {
        for hot in [true, false] {
            let what = if hot { "1 hot key" } else { "100k keys" };
            let table = leak(ConnTable::new(1 << 18));
            row(
                &format!("ConnTable::acquire + drop, {what}, {threads} thread(s)"),
                run(threads, move |t, i| {
                    let d = table.acquire(key(ids, hot, t, i), u32::MAX);
                    assert!(matches!(
                        d,
                        ConnDecision::Admitted(_) | ConnDecision::TableFull
                    ));
                    black_box(d);
                }),
            );
            let map: &'static Mutex<HashMap<ClientId, u32>> =
                leak(Mutex::new(HashMap::with_capacity(MANY as usize)));
            row(
                &format!("  Mutex<HashMap> baseline, {what}, {threads} thread(s)"),
                run(threads, move |t, i| {
                    let k = key(ids, hot, t, i);
                    *map.lock().unwrap().entry(k).or_insert(0) += 1;
                    black_box(());
                    let mut m = map.lock().unwrap();
                    let n = m.get_mut(&k).unwrap();
                    *n -= 1;
                    if *n == 0 {
                        m.remove(&k);
                    }
                }),
            );
        }
    }
}

/// The WAF matcher against aho-corasick and memchr over a 1 KiB head.
fn waf_rows() {
    // WAF over a 1 KiB request head with no hit (the whole head is scanned).
    println!("WAF, ns per 1 KiB head:");
    let mut head = String::from("GET /api/v1/orders/12345/items?page=2&sort=desc HTTP/1.1\r\n");
    head.push_str("Host: api.example.com\r\nAccept: application/json\r\n");
    head.push_str("User-Agent: Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101\r\n");
    head.push_str("Accept-Language: en-GB,en;q=0.5\r\nAccept-Encoding: gzip, deflate, br\r\n");
    head.push_str("Cookie: session=3f9a6c2e8b1d4f7a9c0e2b4d6f8a1c3e; theme=dark; consent=yes\r\n");
    while head.len() < 1022 {
        head.push_str("X-Trace: 0123456789abcdef\r\n");
    }
    head.truncate(1022);
    head.push_str("\r\n");
    let head: &'static [u8] = leak(head).as_bytes();
    let three: Vec<String> = ["union select", "<script", "../"]
        .map(String::from)
        .to_vec();
    let sixty_four: Vec<String> = (0..64)
        .map(|i| match i % 4 {
            0 => format!("select-{i}"),
            1 => format!("<tag{i}"),
            2 => format!("/etc/passwd{i}"),
            _ => format!("${{jndi:{i}"),
        })
        .collect();
    // Adversarial for memchr: self-overlapping literals and a head of their first byte,
    // so every position is a candidate that compares almost a whole literal.
    let overlapping: Vec<String> = ["a".repeat(7) + "b", "a".repeat(7) + "c"].to_vec();
    let all_a: &'static [u8] = leak(vec![b'a'; 1024]);
    for (n, lits, head) in [
        (3, &three, head),
        (64, &sixty_four, head),
        (2, &overlapping, all_a),
    ] {
        let waf = leak(WafMatcher::new(lits));
        let ac = leak(
            AhoCorasick::builder()
                .ascii_case_insensitive(true)
                .kind(Some(AhoCorasickKind::DFA))
                .build(lits)
                .unwrap(),
        );
        let mm = leak(MemchrMatcher::new(lits));
        assert!(!waf.is_match(head) && !ac.is_match(head) && !mm.is_match(head));
        let what = if n == 2 {
            "2 x 8 B overlapping, all-a head"
        } else {
            ""
        };
        let what = if what.is_empty() {
            format!("{n} literals")
        } else {
            what.to_string()
        };
        row(
            &format!("WafMatcher (engine: {}), {what}", waf.engine_name()),
            run(1, move |_, _| {
                black_box(waf.is_match(black_box(head)));
            }),
        );
        row(
            &format!("  aho-corasick DFA, {what}"),
            run(1, move |_, _| {
                black_box(ac.is_match(black_box(head)));
            }),
        );
        for (label, kind, prefilter) in [
            ("DFA, no prefilter", Some(AhoCorasickKind::DFA), false),
            ("auto kind", None, true),
            ("contiguous NFA", Some(AhoCorasickKind::ContiguousNFA), true),
        ] {
            let other = leak(
                AhoCorasick::builder()
                    .ascii_case_insensitive(true)
                    .kind(kind)
                    .prefilter(prefilter)
                    .build(lits)
                    .unwrap(),
            );
            row(
                &format!("  aho-corasick {label}, {what}"),
                run(1, move |_, _| {
                    black_box(other.is_match(black_box(head)));
                }),
            );
        }
        row(
            &format!("  memchr2 + eq_ignore_ascii_case, {what}"),
            run(1, move |_, _| {
                black_box(mm.is_match(black_box(head)));
            }),
        );
    }
}
