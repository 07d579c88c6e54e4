//! Tests of the rate table: token buckets per identity, probing, the overflow bucket, fleet counts, debits and refunds.

use super::*;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use RateDecision::*;

const MS: u64 = 1_000_000;

fn v4(i: u32) -> ClientId {
    ClientId::from_ip(IpAddr::V4(Ipv4Addr::from(i)))
}

fn v6(i: u64) -> ClientId {
    ClientId::from_ip(IpAddr::V6(Ipv6Addr::from(u128::from(i) << 64 | 7)))
}

fn p(requests: u64, window_ms: u64, burst: u64) -> RateParams {
    RateParams {
        requests,
        window_ms,
        burst,
    }
}

#[test]
fn capacity_rounds_up_to_a_power_of_two() {
    assert_eq!(RateTable::new(4096).capacity(), 4096);
    assert_eq!(RateTable::new(4097).capacity(), 8192);
    assert_eq!(RateTable::new(0).capacity(), 8);
    assert_eq!(RateTable::new(3).capacity(), 8);
}

#[test]
fn one_bucket_per_identity_shared_across_listeners() {
    let t = RateTable::new(64);
    let a = p(1, 1000, 3);
    let b = p(1000, 1000, 3);
    assert_eq!(t.check(v4(1), a, 0), Allowed);
    assert_eq!(t.check(v4(1), b, 0), Allowed);
    assert_eq!(t.check(v4(1), a, 0), Allowed);
    assert!(matches!(t.check(v4(1), b, 0), Limited { .. }));
    // Another client is untouched, and so is another /64.
    assert_eq!(t.check(v4(2), a, 0), Allowed);
    assert_eq!(t.check(v6(1), a, 0), Allowed);
    assert_eq!(t.in_use(0), 3);
}

#[test]
fn limited_reports_retry_after() {
    let t = RateTable::new(64);
    let q = p(1, 1500, 1);
    assert_eq!(t.check(v4(9), q, 0), Allowed);
    assert_eq!(
        t.check(v4(9), q, 0),
        Limited {
            retry_after_secs: 2
        }
    );
    assert_eq!(
        t.check(v4(9), q, 1000 * MS),
        Limited {
            retry_after_secs: 1
        }
    );
    assert_eq!(t.check(v4(9), q, 1500 * MS), Allowed);
}

#[test]
fn clock_backwards_in_the_table() {
    let t = RateTable::new(8);
    let q = p(1, 1000, 1);
    assert_eq!(t.check(v4(1), q, 5000 * MS), Allowed);
    assert!(matches!(t.check(v4(1), q, 0), Limited { .. }));
    assert!(matches!(t.check(v4(1), q, 5999 * MS), Limited { .. }));
    assert_eq!(t.check(v4(1), q, 6000 * MS), Allowed);
}

/// Identities whose home slot is `home`, found by trying addresses.
fn same_home(t: &RateTable, home: usize, n: usize) -> Vec<ClientId> {
    (0u32..)
        .map(v4)
        .filter(|id| t.home(*id) == home)
        .take(n)
        .collect()
}

#[test]
fn probes_at_most_eight_slots() {
    let t = RateTable::new(256);
    let ids = same_home(&t, 17, 9);
    let q = p(1, 1000, 2);
    for id in &ids[..8] {
        assert_eq!(t.check(*id, q, 0), Allowed);
    }
    // The ninth finds its window full although 248 slots are empty.
    assert_eq!(t.check(ids[8], q, 0), TableFull);
    assert_eq!(t.in_use(0), 8);
    // The eight placed ones still have their own buckets.
    for id in &ids[..8] {
        assert_eq!(t.check(*id, q, 0), Allowed);
        assert!(matches!(t.check(*id, q, 0), Limited { .. }));
    }
}

#[test]
fn depth_counts_slots_past_home() {
    let t = RateTable::new(256);
    let ids = same_home(&t, 40, 9);
    let q = p(1, 1000, 2);
    for (i, id) in ids[..8].iter().enumerate() {
        let c = t.check_with(*id, q, 0, Overflow::FailOpen);
        assert_eq!(
            (c.decision, c.depth, c.overflowed),
            (Allowed, i as u8, false)
        );
    }
    // An existing bucket reports where it was found.
    assert_eq!(t.check_with(ids[5], q, 0, Overflow::FailOpen).depth, 5);
    // Burst 2 at 1/s: the second take leaves 0 and a token 1 s away.
    let c = t.check_with(ids[6], q, 0, Overflow::FailOpen);
    assert_eq!((c.remaining, c.next_token_secs), (0, 1));
    let c = t.check_with(ids[8], q, 0, Overflow::FailOpen);
    assert_eq!(
        (c.decision, c.depth, c.overflowed),
        (TableFull, PROBE_DEPTH_FULL, true)
    );
}

#[test]
fn shared_overflow_bucket_holds_every_homeless_identity_to_one_rate() {
    let t = RateTable::new(8); // one window: 8 identities fill it
    let q = p(10, 1000, 5);
    // Fillers on a slow listener: their buckets stay live for a second.
    for i in 0..8 {
        assert_eq!(t.check(v4(i), p(1, 1000, 5), 0), Allowed);
    }
    // 1000 more identities, each new: together they get the burst of one bucket.
    let allowed = (1000..2000)
        .filter(|&i| {
            let c = t.check_with(v4(i), q, 0, Overflow::Shared);
            assert!(c.overflowed);
            c.decision == Allowed
        })
        .count();
    assert_eq!(allowed, 5);
    assert!(matches!(
        t.check_with(v4(5000), q, 0, Overflow::Shared).decision,
        Limited {
            retry_after_secs: 1
        }
    ));
    // ... and refill at the listener's rate: 10/s, so one more after 100 ms.
    assert_eq!(
        t.check_with(v4(5001), q, 100 * MS, Overflow::Shared)
            .decision,
        Allowed
    );
    assert!(matches!(
        t.check_with(v4(5002), q, 100 * MS, Overflow::Shared)
            .decision,
        Limited { .. }
    ));
    // Fail-open admits the same identities.
    assert_eq!(
        t.check_with(v4(5003), q, 100 * MS, Overflow::FailOpen)
            .decision,
        TableFull
    );
    // A refund goes back to the shared bucket.
    let s = Spent {
        id: v4(5001),
        params: q,
        shared: true,
        fleet: false,
    };
    assert!(t.refund_spent(s));
    assert_eq!(
        t.check_with(v4(5004), q, 100 * MS, Overflow::Shared)
            .decision,
        Allowed
    );
}

#[test]
fn remaining_and_next_token_follow_the_bucket() {
    let t = RateTable::new(64);
    let q = p(1, 10_000, 3); // a token every 10 s
    let c = t.check_with(v4(1), q, 0, Overflow::FailOpen);
    assert_eq!((c.remaining, c.next_token_secs), (2, 10));
    let c = t.check_with(v4(1), q, 4000 * MS, Overflow::FailOpen);
    // 2 + 0.4 - 1 = 1.4 tokens: one whole, the next in 6 s.
    assert_eq!((c.remaining, c.next_token_secs), (1, 6));
    t.check(v4(1), q, 4000 * MS);
    let c = t.check_with(v4(1), q, 4000 * MS, Overflow::FailOpen);
    assert_eq!(
        c.decision,
        Limited {
            retry_after_secs: 6
        }
    );
    assert_eq!((c.remaining, c.next_token_secs), (0, 6));
}

#[test]
fn fleet_checks_are_drained_by_identity_and_tag_and_debits_take_tokens() {
    let t = RateTable::new(64);
    let q = p(1, 1000, 10);
    for _ in 0..3 {
        t.check_fleet(v4(1), q, 0, Overflow::FailOpen, 7);
    }
    t.check_fleet(v6(2), q, 0, Overflow::FailOpen, 9);
    t.check(v4(3), q, 0); // box scope: not synced
    let mut got = Vec::new();
    t.drain_spent(|id, tag, n| got.push((id, tag, n)));
    got.sort_by_key(|g| g.2);
    assert_eq!(got, [(v6(2), 9, 1), (v4(1), 7, 3)]);
    let mut again = 0;
    t.drain_spent(|_, _, _| again += 1);
    assert_eq!(again, 0, "drained once");
    // A refunded fleet token is taken back from the undrained count.
    t.check_fleet(v4(1), q, 0, Overflow::FailOpen, 7);
    t.check_fleet(v4(1), q, 0, Overflow::FailOpen, 7);
    let s = Spent {
        id: v4(1),
        params: q,
        shared: false,
        fleet: true,
    };
    assert!(t.refund_spent(s));
    let mut n = 0;
    t.drain_spent(|_, _, k| n += k);
    assert_eq!(n, 1);
    assert!(t.refund_spent(s), "the bucket still gets its token back");
    // 7 tokens left: a debit of 5 takes 5 of them; the next of 5 the last 2 and
    // 3 s of refill (1/s), so the bucket earns nothing until 3 s.
    assert_eq!(t.debit(v4(1), q, 5, 0), 5);
    assert_eq!(t.debit(v4(1), q, 5, 0), 5);
    assert!(matches!(t.check(v4(1), q, 0), Limited { .. }));
    assert!(matches!(t.check(v4(1), q, 2999 * MS), Limited { .. }));
    assert_eq!(t.check(v4(1), q, 4000 * MS), Allowed);
    // At most one full refill (10 s, longer than the 1 s window) ahead.
    assert_eq!(t.debit(v4(1), q, 1000, 4000 * MS), 10);
    assert!(matches!(t.check(v4(1), q, 14_999 * MS), Limited { .. }));
    // ... or one window when that is longer: burst 1 at 1 per 5 s.
    let w = p(1, 5000, 1);
    assert_eq!(t.check(v4(7), w, 0), Allowed);
    assert_eq!(t.debit(v4(7), w, 100, 0), 1);
    assert!(matches!(t.check(v4(7), w, 9_999 * MS), Limited { .. }));
    assert_eq!(t.debit(v4(99), q, 1, 0), 0, "no bucket here");
}

#[test]
fn hashed_keys_get_their_own_buckets() {
    let t = RateTable::new(64);
    let q = p(1, 1000, 1);
    let a = ClientId::from_key(b"key-a");
    assert_eq!(t.check(a, q, 0), Allowed);
    assert!(matches!(t.check(a, q, 0), Limited { .. }));
    assert_eq!(t.check(ClientId::from_key(b"key-b"), q, 0), Allowed);
    assert_eq!(t.check(v4(1), q, 0), Allowed);
    assert!(t.refund_spent(Spent {
        id: a,
        params: q,
        shared: false,
        fleet: false,
    }));
    assert_eq!(t.check(a, q, 0), Allowed);
}

#[test]
fn full_table_then_stale_reuse() {
    let t = RateTable::new(8); // one window covers the whole table
    let q = p(1, 1000, 1);
    for i in 0..8 {
        assert_eq!(t.check(v4(i), q, 0), Allowed);
    }
    assert_eq!(t.in_use(0), 8);
    assert_eq!(t.check(v4(100), q, 0), TableFull);
    assert_eq!(t.check(v4(100), q, 999 * MS), TableFull);
    // Once the buckets have refilled their slots are free again.
    assert_eq!(t.in_use(1000 * MS), 0);
    for i in 100..108 {
        assert_eq!(t.check(v4(i), q, 1000 * MS), Allowed);
    }
    assert_eq!(t.check(v4(200), q, 1000 * MS), TableFull);
    // An evicted client comes back with a full bucket, as if never seen.
    assert_eq!(t.check(v4(0), q, 2000 * MS), Allowed);
    assert!(matches!(t.check(v4(0), q, 2000 * MS), Limited { .. }));
}

#[test]
fn a_bigger_burst_elsewhere_keeps_the_slot_live() {
    // Client 0 is mid-burst on a listener with burst 100; a listener with burst 1
    // sees that bucket as full but must not recycle it.
    let t = RateTable::new(8);
    let big = p(1, 1000, 100);
    let small = p(1, 1000, 1);
    for _ in 0..50 {
        assert_eq!(t.check(v4(0), big, 0), Allowed);
    }
    for i in 1..8 {
        assert_eq!(t.check(v4(i), small, 0), Allowed);
    }
    assert_eq!(t.check(v4(99), small, 2000 * MS), Allowed); // reuses one of 1..8
    let mut placed = 0;
    for i in 100..110 {
        if t.check(v4(i), small, 2000 * MS) == Allowed {
            placed += 1;
        }
    }
    assert_eq!(placed, 6, "client 0's live bucket was recycled");
}

#[test]
fn a_million_clients_through_4096_slots() {
    // A new client every 10 µs, each bucket full again 1 ms later: ~100 live
    // buckets at a time, so every window has room once the old ones refill.
    let t = RateTable::new(4096);
    let q = p(1, 1, 1);
    let mut now = 0;
    for i in 0..1_000_000u64 {
        let id = if i % 2 == 0 { v4(i as u32) } else { v6(i) };
        assert_eq!(t.check(id, q, now), Allowed, "client {i}");
        now += 10_000;
    }
    assert!(t.in_use(now) <= 101);
    assert_eq!(t.in_use(now + MS), 0);
}

#[test]
fn threads_never_admit_more_than_burst_plus_refill() {
    // One hot key from four threads on a shared fake clock that advances 1 µs per
    // call (threads see it out of order, so the clock also steps back).
    let t = Arc::new(RateTable::new(64));
    let clock = Arc::new(AtomicU64::new(0));
    let q = p(1, 1, 20); // 1 token per ms, burst 20
    let go = Arc::new(AtomicBool::new(false));
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let (t, clock, go) = (t.clone(), clock.clone(), go.clone());
            std::thread::spawn(move || {
                while !go.load(Ordering::Acquire) {
                    spin_loop_hint();
                }
                let (mut allowed, mut full) = (0u64, 0u64);
                for _ in 0..25_000 {
                    let now = clock.fetch_add(1000, Ordering::Relaxed);
                    match t.check(v4(7), q, now) {
                        Allowed => allowed += 1,
                        Limited { .. } => {}
                        TableFull => full += 1,
                    }
                }
                (allowed, full)
            })
        })
        .collect();
    go.store(true, Ordering::Release);
    let (mut allowed, mut full) = (0, 0);
    for h in handles {
        let (a, f) = h.join().unwrap();
        allowed += a;
        full += f;
    }
    let elapsed_ms = clock.load(Ordering::Relaxed) / MS; // 100 ms
    assert_eq!(full, 0);
    assert!(allowed <= 20 + elapsed_ms, "{allowed} > 20 + {elapsed_ms}");
    assert!(allowed >= 20, "only {allowed} admitted");
}

#[test]
fn racing_first_requests_create_one_bucket_per_identity() {
    // Four threads all introduce the same 32 new clients at once. A duplicate
    // bucket would admit more than the burst; the clock never moves, so each
    // client gets exactly its burst of 3 in total.
    let t = Arc::new(RateTable::new(1024));
    let q = p(1, 1000, 3);
    let go = Arc::new(AtomicBool::new(false));
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let (t, go) = (t.clone(), go.clone());
            std::thread::spawn(move || {
                while !go.load(Ordering::Acquire) {
                    spin_loop_hint();
                }
                let mut allowed = [0u32; 32];
                for _ in 0..20 {
                    for (k, n) in allowed.iter_mut().enumerate() {
                        let id = v6(k as u64 * 7919);
                        if t.check(id, q, 0) == Allowed {
                            *n += 1;
                        }
                    }
                }
                allowed
            })
        })
        .collect();
    go.store(true, Ordering::Release);
    let mut total = [0u32; 32];
    for h in handles {
        for (t, a) in total.iter_mut().zip(h.join().unwrap()) {
            *t += a;
        }
    }
    assert_eq!(total, [3; 32]);
    assert_eq!(t.in_use(0), 32);
}

#[test]
fn refund_gives_one_token_back_up_to_the_burst() {
    let t = RateTable::new(64);
    let q = p(1, 1000, 2);
    assert!(!t.refund(v4(3), q), "no bucket, nothing owed");
    assert_eq!(t.check(v4(3), q, 0), Allowed);
    assert_eq!(t.check(v4(3), q, 0), Allowed);
    assert!(matches!(t.check(v4(3), q, 0), Limited { .. }));
    // Two requests refused after their check (503, 413): both tokens come back.
    assert!(t.refund(v4(3), q));
    assert!(t.refund(v4(3), q));
    assert!(!t.refund(v4(3), q), "never above the burst");
    assert_eq!(t.check(v4(3), q, 0), Allowed);
    assert_eq!(t.check(v4(3), q, 0), Allowed);
    assert!(matches!(t.check(v4(3), q, 0), Limited { .. }));
    // Another identity's bucket is untouched.
    assert_eq!(t.check(v4(4), q, 0), Allowed);
    assert!(t.refund(v4(3), q));
    assert_eq!(t.check(v4(4), q, 0), Allowed);
    assert!(matches!(t.check(v4(4), q, 0), Limited { .. }));
}

#[test]
fn refund_after_the_slot_was_recycled_touches_nobody() {
    let t = RateTable::new(8);
    let q = p(1, 1000, 1);
    for i in 0..8 {
        assert_eq!(t.check(v4(i), q, 0), Allowed);
    }
    // Every bucket refills; eight newcomers take the slots.
    for i in 100..108 {
        assert_eq!(t.check(v4(i), q, 1000 * MS), Allowed);
    }
    assert!(!t.refund(v4(0), q));
    for i in 100..108 {
        assert!(matches!(t.check(v4(i), q, 1000 * MS), Limited { .. }));
    }
}

fn spin_loop_hint() {
    std::hint::spin_loop();
}

/// A slot whose fleet count the sync has not drained is not recycled, however full
/// its bucket is again: a newcomer waits (here: finds the one window full) until the
/// drain, and every token taken reaches the drain. (The slot was recycled and its
/// count overwritten: 8 of 1,000 counts lost in `examples/rate_check_cost.rs`.)
#[test]
fn undrained_fleet_counts_hold_their_slot_until_the_drain() {
    let t = RateTable::new(8);
    let fast = p(1000, 1, 1);
    for i in 0..8 {
        let c = t.check_fleet(v4(i), fast, 0, Overflow::FailOpen, 5);
        assert_eq!(c.decision, Allowed, "identity {i}");
    }
    // A millisecond on, every bucket is full again: stale by the bucket's rules.
    let later = 10 * MS;
    let c = t.check_fleet(v4(100), fast, later, Overflow::FailOpen, 5);
    assert_eq!(
        c.decision, TableFull,
        "a slot with an undrained count was recycled"
    );
    let mut drained = 0;
    t.drain_spent(|id, tag, n| {
        assert_eq!(tag, 5);
        assert!((0..8).any(|i| v4(i) == id), "a count under {id:?}");
        drained += n;
    });
    assert_eq!(drained, 8, "every take drained once");
    // Drained: the slots may go to newcomers again, box-scoped ones too.
    assert_eq!(
        t.check_fleet(v4(100), fast, later, Overflow::FailOpen, 5)
            .decision,
        Allowed
    );
    assert_eq!(
        t.check_with(v4(101), fast, later, Overflow::FailOpen)
            .decision,
        Allowed
    );
}
