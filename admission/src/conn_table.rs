//! `ConnTable`: concurrent connections per client identity in a fixed array of atomic counters, released by a `ConnGuard` on drop.

use std::fmt;
use std::sync::Arc;

use crate::slot_table::{self, Geometry, KeyCell, Located, Slot, BUSY, EMPTY_KEY};
use crate::sync::{AtomicU64, Ordering};
use crate::ClientId;

/// Control word: bit 63 `BUSY`, bits 32..63 a 31-bit generation, bits 0..32 the count.
/// A count is below `max: u32` before it is incremented, so it never carries into the
/// generation, and a guard's decrement never borrows from it.
const GEN_SHIFT: u32 = 32;
const COUNT_MASK: u64 = (1 << GEN_SHIFT) - 1;

#[inline]
fn count_of(ctl: u64) -> u32 {
    (ctl & COUNT_MASK) as u32
}

/// 24 bytes padded to 32, two slots per cache line.
///
/// Unlike a rate bucket this is written twice per connection, not per request, so two
/// neighbours sharing a line costs little; 32-byte alignment keeps a slot inside one line
/// (one load sees `ctl` and the key together) at half the memory of a line per slot.
#[repr(C, align(32))]
struct ConnSlot {
    ctl: AtomicU64,
    key: KeyCell,
}

impl Slot for ConnSlot {
    const GEN_SHIFT: u32 = GEN_SHIFT;
    #[inline]
    fn ctl(&self) -> &AtomicU64 {
        &self.ctl
    }
    #[inline]
    fn key(&self) -> &KeyCell {
        &self.key
    }
}

/// Outcome of [`ConnTable::acquire`] without the guard.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ConnDecisionKind {
    Admitted,
    Limited,
    TableFull,
}

/// Outcome of [`ConnTable::acquire`].
#[derive(Debug)]
pub enum ConnDecision {
    /// Counted; the connection holds the guard until it closes.
    Admitted(ConnGuard),
    /// The identity already holds `max` connections: answer 503, count nothing.
    Limited,
    /// No slot within the probe window: admit without a guard (fail open) and count
    /// `zgix_l7_conn_limit_full`.
    TableFull,
}

impl ConnDecision {
    /// The decision without the guard, for counters and logs.
    pub fn kind(&self) -> ConnDecisionKind {
        match self {
            ConnDecision::Admitted(_) => ConnDecisionKind::Admitted,
            ConnDecision::Limited => ConnDecisionKind::Limited,
            ConnDecision::TableFull => ConnDecisionKind::TableFull,
        }
    }
}

/// Per-identity connection counts, allocated once, probed at most 8 slots deep. A slot
/// whose count has dropped to zero is free for any identity.
pub struct ConnTable {
    slots: Box<[ConnSlot]>,
    geo: Geometry,
}

/// One counted connection. Dropping it releases the count exactly once; it holds an
/// `Arc` to the table so it may outlive the shard that created it.
pub struct ConnGuard {
    table: Arc<ConnTable>,
    idx: usize,
}

impl ConnTable {
    /// A table of `entries` slots, rounded up to a power of two (and at least 8).
    pub fn new(entries: usize) -> Arc<Self> {
        let geo = Geometry::new(entries);
        let slots = (0..geo.len())
            .map(|_| ConnSlot {
                ctl: AtomicU64::new(0),
                key: KeyCell::empty(),
            })
            .collect();
        Arc::new(ConnTable { slots, geo })
    }

    /// Count one more connection for `id` if it holds fewer than `max`.
    pub fn acquire(self: &Arc<Self>, id: ClientId, max: u32) -> ConnDecision {
        self.acquire_probed(id, max).0
    }

    /// [`ConnTable::acquire`], with the slots probed past the identity's home to find
    /// or claim its slot (0..=7; [`crate::PROBE_DEPTH_FULL`] when none was found): the
    /// occupancy histogram's input.
    pub fn acquire_probed(self: &Arc<Self>, id: ClientId, max: u32) -> (ConnDecision, u8) {
        const FULL: u8 = crate::PROBE_DEPTH_FULL;
        if max == 0 {
            return (ConnDecision::Limited, 0);
        }
        let place = self.geo.place(id);
        let depth = |idx: usize| ((idx.wrapping_sub(place.home)) & self.geo.mask) as u8;
        let free = |_: &ConnSlot, ctl: u64| count_of(ctl) == 0;
        for _ in 0..slot_table::MAX_ATTEMPTS {
            match slot_table::locate(&self.geo, &self.slots, place, id, free) {
                Located::Full => return (ConnDecision::TableFull, FULL),
                Located::Claimed { idx, prev } => {
                    slot_table::publish(&self.slots[idx], prev, 1);
                    return (self.admitted(idx), depth(idx));
                }
                Located::Existing { idx, mut ctl } => {
                    let owner = ctl >> GEN_SHIFT;
                    loop {
                        if count_of(ctl) >= max {
                            return (ConnDecision::Limited, depth(idx));
                        }
                        match self.slots[idx].ctl.compare_exchange(
                            ctl,
                            ctl + 1,
                            Ordering::AcqRel,
                            Ordering::SeqCst,
                        ) {
                            Ok(_) => return (self.admitted(idx), depth(idx)),
                            Err(cur) if cur >> GEN_SHIFT == owner => ctl = cur,
                            Err(_) => break, // re-keyed: probe again
                        }
                    }
                }
            }
        }
        (ConnDecision::TableFull, FULL)
    }

    #[inline]
    fn admitted(self: &Arc<Self>, idx: usize) -> ConnDecision {
        ConnDecision::Admitted(ConnGuard {
            table: Arc::clone(self),
            idx,
        })
    }

    /// Number of slots (a power of two).
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Slots with at least one connection. Scans the table; for `/metrics`.
    pub fn in_use(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| {
                let ctl = s.ctl.load(Ordering::Acquire);
                ctl & BUSY != 0 || count_of(ctl) > 0
            })
            .count()
    }

    /// Connections `id` holds now.
    pub fn count(&self, id: ClientId) -> u32 {
        let place = self.geo.place(id);
        self.geo
            .window(place)
            .map(|i| {
                let s = &self.slots[i];
                let ctl = s.ctl.load(Ordering::Acquire);
                let key = s.key.load();
                if ctl & BUSY == 0 && key == id.bits() && key != EMPTY_KEY {
                    count_of(ctl)
                } else {
                    0
                }
            })
            .sum()
    }

    /// Keys of every claimed slot (tests: no identity twice).
    #[cfg(all(test, loom))]
    pub(crate) fn keys(&self) -> Vec<u128> {
        slot_table::keys(&self.slots)
    }

    #[cfg(test)]
    fn home(&self, id: ClientId) -> usize {
        self.geo.place(id).home
    }
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        // The slot cannot be re-keyed while this count is held (only a zero count is
        // free), so a plain decrement is exact.
        self.table.slots[self.idx]
            .ctl
            .fetch_sub(1, Ordering::Release);
    }
}

impl fmt::Debug for ConnGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnGuard")
            .field("slot", &self.idx)
            .finish()
    }
}

impl fmt::Debug for ConnTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnTable")
            .field("capacity", &self.capacity())
            .field("in_use", &self.in_use())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    use std::sync::atomic::{AtomicBool, AtomicI64};

    fn v4(i: u32) -> ClientId {
        ClientId::from_ip(IpAddr::V4(Ipv4Addr::from(i)))
    }

    fn v6(i: u64) -> ClientId {
        ClientId::from_ip(IpAddr::V6(Ipv6Addr::from(u128::from(i) << 64 | 1)))
    }

    fn guard(d: ConnDecision) -> ConnGuard {
        match d {
            ConnDecision::Admitted(g) => g,
            other => panic!("expected Admitted, got {other:?}"),
        }
    }

    #[test]
    fn acquire_to_max_then_limited_then_release() {
        let t = ConnTable::new(64);
        let a = v4(1);
        let g1 = guard(t.acquire(a, 3));
        let g2 = guard(t.acquire(a, 3));
        let g3 = guard(t.acquire(a, 3));
        assert_eq!(t.count(a), 3);
        assert_eq!(t.acquire(a, 3).kind(), ConnDecisionKind::Limited);
        assert_eq!(t.count(a), 3, "a refusal must not count");
        // A lower max elsewhere sees the same count.
        assert_eq!(t.acquire(a, 2).kind(), ConnDecisionKind::Limited);
        // Other clients are independent.
        let b = guard(t.acquire(v4(2), 1));
        assert_eq!(t.acquire(v4(2), 1).kind(), ConnDecisionKind::Limited);
        drop(g2);
        assert_eq!(t.count(a), 2);
        let g4 = guard(t.acquire(a, 3));
        assert_eq!(t.acquire(a, 3).kind(), ConnDecisionKind::Limited);
        assert_eq!(t.in_use(), 2);
        drop((g1, g3, g4, b));
        assert_eq!(t.count(a), 0);
        assert_eq!(t.in_use(), 0);
        assert_eq!(t.acquire(a, 0).kind(), ConnDecisionKind::Limited);
        assert_eq!(t.in_use(), 0);
    }

    #[test]
    fn probes_at_most_eight_then_reuses_released_slots() {
        let t = ConnTable::new(128);
        let ids: Vec<_> = (0u32..)
            .map(v4)
            .filter(|id| t.home(*id) == 5)
            .take(9)
            .collect();
        let guards: Vec<_> = ids[..8].iter().map(|id| guard(t.acquire(*id, 1))).collect();
        assert_eq!(t.acquire(ids[8], 1).kind(), ConnDecisionKind::TableFull);
        assert_eq!(t.in_use(), 8);
        drop(guards);
        // Zero counts are free: the ninth fits now, and the others can come back.
        let g = guard(t.acquire(ids[8], 1));
        assert_eq!(t.count(ids[8]), 1);
        let back: Vec<_> = ids[..7].iter().map(|id| guard(t.acquire(*id, 1))).collect();
        assert_eq!(t.acquire(ids[7], 1).kind(), ConnDecisionKind::TableFull);
        drop((g, back));
        assert_eq!(t.in_use(), 0);
    }

    #[test]
    fn a_million_clients_through_4096_slots() {
        // 100 connections open at any time, each client distinct.
        let t = ConnTable::new(4096);
        let mut open = VecDeque::with_capacity(101);
        for i in 0..1_000_000u64 {
            let id = if i % 2 == 0 { v4(i as u32) } else { v6(i) };
            open.push_back(guard(t.acquire(id, 1)));
            if open.len() > 100 {
                open.pop_front();
            }
        }
        assert_eq!(t.in_use(), 100);
        drop(open);
        assert_eq!(t.in_use(), 0);
    }

    #[test]
    fn threads_racing_acquire_and_release_leak_nothing() {
        // Four threads churn 12 clients through a small table, so slots are re-keyed
        // constantly. Live guards per client are tracked outside the table: they must
        // never exceed max (a duplicate slot would allow it), and everything must be
        // released at the end.
        const MAX: u32 = 3;
        const KEYS: usize = 12;
        let t = ConnTable::new(32);
        let live: Arc<Vec<AtomicI64>> = Arc::new((0..KEYS).map(|_| AtomicI64::new(0)).collect());
        let go = Arc::new(AtomicBool::new(false));
        let handles: Vec<_> = (0..4u64)
            .map(|seed| {
                let (t, live, go) = (t.clone(), live.clone(), go.clone());
                std::thread::spawn(move || {
                    while !go.load(Ordering::Acquire) {
                        std::hint::spin_loop();
                    }
                    let mut held: Vec<(usize, ConnGuard)> = Vec::with_capacity(8);
                    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
                    let (mut admitted, mut full) = (0u64, 0u64);
                    for _ in 0..30_000 {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let k = (x % KEYS as u64) as usize;
                        if held.len() < 8 && x & 0x100 != 0 {
                            match t.acquire(v6(k as u64 + 1), MAX) {
                                ConnDecision::Admitted(g) => {
                                    let n = live[k].fetch_add(1, Ordering::SeqCst) + 1;
                                    assert!(n <= i64::from(MAX), "client {k} holds {n}");
                                    held.push((k, g));
                                    admitted += 1;
                                }
                                ConnDecision::Limited => {}
                                ConnDecision::TableFull => full += 1,
                            }
                        } else if !held.is_empty() {
                            let (k, g) = held.swap_remove((x >> 20) as usize % held.len());
                            live[k].fetch_sub(1, Ordering::SeqCst);
                            drop(g);
                        }
                    }
                    for (k, g) in held.drain(..) {
                        live[k].fetch_sub(1, Ordering::SeqCst);
                        drop(g);
                    }
                    (admitted, full)
                })
            })
            .collect();
        go.store(true, Ordering::Release);
        let mut admitted = 0;
        for h in handles {
            admitted += h.join().unwrap().0;
        }
        assert!(admitted > 1000);
        assert_eq!(t.in_use(), 0);
        for k in 0..KEYS {
            assert_eq!(t.count(v6(k as u64 + 1)), 0);
        }
    }
}
