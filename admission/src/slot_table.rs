//! The fixed-size open-addressed slot array both tables share: per-process hashing, the 8-slot probe window, and the lock-free claim protocol.
//!
//! Every slot has a 64-bit control word (`ctl`) and the full 128-bit identity in two
//! more words (`KeyCell`). The control word is the only thing a thread ever CASes:
//!
//! * bit 63 set — `BUSY`: a thread owns the slot while it writes a new key. The other
//!   63 bits are a fingerprint of the identity being installed, so a prober for that
//!   same identity knows to wait for it (briefly) instead of installing a duplicate.
//! * bit 63 clear — a generation in the bits above `Slot::GEN_SHIFT` and the table's
//!   payload below (tokens or a connection count). Every change of owner bumps the
//!   generation, so a CAS prepared against the previous owner's value fails even if the
//!   payload happens to repeat (no ABA).
//!
//! A reader loads `ctl`, then the key, then `ctl` again; equal owner bits mean the key
//! belongs to that generation (a seqlock read without a lock: writers never wait for
//! readers). Claiming a free slot is one CAS to `BUSY`; afterwards the claimer rescans the
//! window for a rival claim of the same identity, Dekker style — of two concurrent
//! claimers the later one in the SeqCst order is guaranteed to see the earlier, so at
//! most one keeps its claim and an identity never holds two slots.

use crate::sync::{seqcst_point, spin_loop, AtomicU64, Ordering};

use crate::ClientId;

/// Probe window: an identity lives in one of the 8 slots after its hashed home.
///
/// Eight consecutive slots are 8 cache lines the hardware prefetcher streams, a miss
/// scans all of them (~8 loads, tens of ns), and with a randomly seeded hash the chance
/// that all 8 are live at load factor `a` is roughly `a^8` (0.4% at a = 0.5, 1e-8 at
/// 0.1). A window that is full costs one fail-open (`TableFull`, counted), not an
/// error or a scan of the table.
#[cfg(not(loom))]
pub(crate) const PROBES: usize = 8;
/// Under loom: a window of two slots, so a model can fill it and race a claim against
/// stale-slot reuse in few enough steps to explore every interleaving. The protocol is
/// the same for any window size.
#[cfg(loom)]
pub(crate) const PROBES: usize = 2;

/// A slot being (re)keyed; the low 63 bits are the claimer's fingerprint.
pub(crate) const BUSY: u64 = 1 << 63;

/// Stored key of a slot that has never been claimed; no `ClientId` has this value.
pub(crate) const EMPTY_KEY: u128 = u128::MAX;

/// How long a prober waits for a concurrent install of its own identity. The install
/// is three stores, so this only runs out if that thread was descheduled mid-install;
/// the prober then fails open rather than wait on it.
#[cfg(not(loom))]
const SPIN_LIMIT: u32 = 1 << 10;
/// Under loom each spin is a yield to the other threads; a few are enough to see both
/// outcomes (the install finishes, or the prober gives up).
#[cfg(loom)]
const SPIN_LIMIT: u32 = 3;

/// Full rescans before failing open when claims keep losing races (a slot changing
/// owner between our scan and our CAS); each is at most `PROBES` slots.
pub(crate) const MAX_ATTEMPTS: u32 = 8;

/// The 128-bit identity split over two atomics. Written only by a slot's `BUSY` owner;
/// a torn read is caught by the reader's second `ctl` load.
pub(crate) struct KeyCell {
    hi: AtomicU64,
    lo: AtomicU64,
}

impl KeyCell {
    pub(crate) fn empty() -> Self {
        KeyCell {
            hi: AtomicU64::new(u64::MAX),
            lo: AtomicU64::new(u64::MAX),
        }
    }

    #[inline]
    pub(crate) fn load(&self) -> u128 {
        let hi = self.hi.load(Ordering::Acquire);
        let lo = self.lo.load(Ordering::Acquire);
        (u128::from(hi) << 64) | u128::from(lo)
    }

    #[inline]
    fn store(&self, key: u128) {
        self.hi.store((key >> 64) as u64, Ordering::Release);
        self.lo.store(key as u64, Ordering::Release);
    }
}

/// What the generic probe needs from a table's slot type.
pub(crate) trait Slot {
    /// Control-word bits at and above this are the owner: generation and `BUSY`.
    const GEN_SHIFT: u32;
    fn ctl(&self) -> &AtomicU64;
    fn key(&self) -> &KeyCell;
}

/// Same owner (generation, not `BUSY`) in two control-word values.
#[inline]
fn same_owner<S: Slot>(a: u64, b: u64) -> bool {
    a >> S::GEN_SHIFT == b >> S::GEN_SHIFT
}

/// The next generation after the one in `prev`, wrapped inside the generation bits.
#[inline]
pub(crate) fn next_gen<S: Slot>(prev: u64) -> u64 {
    let gen_bits = 63 - S::GEN_SHIFT;
    (((prev & !BUSY) >> S::GEN_SHIFT) + 1) & ((1 << gen_bits) - 1)
}

/// Size, mask and the per-process hasher of one table.
pub(crate) struct Geometry {
    /// Seeded from the OS at construction, unlike `source_ip_hash`: a client cannot
    /// choose addresses that pile into one probe window, since it cannot know the seed.
    hasher: ahash::RandomState,
    pub(crate) mask: usize,
}

/// Where an identity probes from, and its `BUSY` marker.
#[derive(Copy, Clone)]
pub(crate) struct Place {
    pub(crate) home: usize,
    busy: u64,
}

impl Geometry {
    /// `entries` rounded up to a power of two (for a mask instead of a division), and
    /// to at least one probe window.
    pub(crate) fn new(entries: usize) -> Self {
        let len = entries.max(PROBES).next_power_of_two();
        // A loom model must replay the same execution, so its homes must not move.
        #[cfg(loom)]
        let hasher = ahash::RandomState::with_seeds(1, 2, 3, 4);
        #[cfg(not(loom))]
        let hasher = ahash::RandomState::new();
        Geometry {
            hasher,
            mask: len - 1,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.mask + 1
    }

    #[inline]
    pub(crate) fn place(&self, id: ClientId) -> Place {
        let h = self.hasher.hash_one(id.bits());
        Place {
            home: h as usize & self.mask,
            busy: BUSY | (h >> 1),
        }
    }

    /// Slot indices of `place`'s probe window, in probe order.
    #[inline]
    pub(crate) fn window(&self, place: Place) -> impl Iterator<Item = usize> {
        let mask = self.mask;
        (0..PROBES).map(move |i| (place.home + i) & mask)
    }
}

/// Result of [`locate`].
pub(crate) enum Located {
    /// The identity's slot, with a control word consistent with the key (the caller's
    /// CAS against `ctl` validates that it still is).
    Existing { idx: usize, ctl: u64 },
    /// A free slot now `BUSY`, owned by the caller, key already written. The caller
    /// must publish a non-`BUSY` control word with [`next_gen`]`(prev)`.
    Claimed { idx: usize, prev: u64 },
    /// No slot for the identity within the window: fail open.
    Full,
}

/// Find `id`'s slot, or claim the first free one in its window.
///
/// `is_free(slot, ctl)` says whether a slot held by another identity may be recycled
/// (a full bucket, a zero count). Bounded: at most `MAX_ATTEMPTS` scans of `PROBES`
/// slots plus a bounded spin; no allocation, no lock.
pub(crate) fn locate<S: Slot>(
    geo: &Geometry,
    slots: &[S],
    place: Place,
    id: ClientId,
    mut is_free: impl FnMut(&S, u64) -> bool,
) -> Located {
    let id = id.bits();
    'attempt: for _ in 0..MAX_ATTEMPTS {
        let mut free = None;
        for i in 0..PROBES {
            let idx = (place.home + i) & geo.mask;
            let slot = &slots[idx];
            let mut w = slot.ctl().load(Ordering::SeqCst);
            if w & BUSY != 0 {
                if w != place.busy {
                    continue;
                }
                // Possibly our own identity being installed by another shard.
                let mut spins = 0;
                while w == place.busy {
                    if spins == SPIN_LIMIT {
                        return Located::Full;
                    }
                    spin_loop();
                    spins += 1;
                    w = slot.ctl().load(Ordering::SeqCst);
                }
                if w & BUSY != 0 {
                    continue;
                }
            }
            let key = slot.key().load();
            let w2 = slot.ctl().load(Ordering::SeqCst);
            if w2 & BUSY != 0 || !same_owner::<S>(w, w2) {
                // Re-keyed under us; the picture of the window is stale.
                continue 'attempt;
            }
            if key == id {
                return Located::Existing { idx, ctl: w2 };
            }
            if free.is_none() && (key == EMPTY_KEY || is_free(slot, w2)) {
                free = Some((idx, w2));
            }
        }
        let Some((idx, prev)) = free else {
            return Located::Full;
        };
        let slot = &slots[idx];
        if slot
            .ctl()
            .compare_exchange(prev, place.busy, Ordering::SeqCst, Ordering::Relaxed)
            .is_err()
        {
            continue;
        }
        seqcst_point();
        if rival(geo, slots, place, id, idx) {
            // Someone else holds or is installing this identity: put the slot back
            // exactly as it was (its owner and key never changed) and look again.
            slot.ctl().store(prev, Ordering::Release);
            continue;
        }
        slot.key().store(id);
        return Located::Claimed { idx, prev };
    }
    Located::Full
}

/// `id`'s slot and a control word consistent with its key, without claiming anything:
/// `None` when the identity holds no slot in its window (or is being installed).
pub(crate) fn find<S: Slot>(
    geo: &Geometry,
    slots: &[S],
    place: Place,
    id: ClientId,
) -> Option<(usize, u64)> {
    let id = id.bits();
    geo.window(place).find_map(|idx| {
        let slot = &slots[idx];
        let w = slot.ctl().load(Ordering::SeqCst);
        if w & BUSY != 0 || slot.key().load() != id {
            return None;
        }
        let w2 = slot.ctl().load(Ordering::SeqCst);
        (w2 & BUSY == 0 && same_owner::<S>(w, w2)).then_some((idx, w2))
    })
}

/// After claiming `own`, is `id` held or being installed anywhere else in its window?
fn rival<S: Slot>(geo: &Geometry, slots: &[S], place: Place, id: u128, own: usize) -> bool {
    for i in 0..PROBES {
        let idx = (place.home + i) & geo.mask;
        if idx == own {
            continue;
        }
        let w = slots[idx].ctl().load(Ordering::SeqCst);
        if w == place.busy || (w & BUSY == 0 && slots[idx].key().load() == id) {
            return true;
        }
    }
    false
}

/// Keys of the slots that hold an identity now, in slot order: for tests asserting that
/// no identity holds two slots.
#[cfg(all(test, loom))]
pub(crate) fn keys<S: Slot>(slots: &[S]) -> Vec<u128> {
    slots
        .iter()
        .filter(|s| s.ctl().load(Ordering::SeqCst) & BUSY == 0)
        .map(|s| s.key().load())
        .filter(|&k| k != EMPTY_KEY)
        .collect()
}

/// Publish a claimed slot: the new owner's generation with `payload` below it.
#[inline]
pub(crate) fn publish<S: Slot>(slot: &S, prev: u64, payload: u64) -> u64 {
    let w = (next_gen::<S>(prev) << S::GEN_SHIFT) | payload;
    slot.ctl().store(w, Ordering::Release);
    w
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{IpAddr, Ipv4Addr};

    /// Minimal slot: 32-bit generation, 32-bit payload.
    struct TestSlot {
        ctl: AtomicU64,
        key: KeyCell,
    }

    impl Slot for TestSlot {
        const GEN_SHIFT: u32 = 32;
        fn ctl(&self) -> &AtomicU64 {
            &self.ctl
        }
        fn key(&self) -> &KeyCell {
            &self.key
        }
    }

    fn table(geo: &Geometry) -> Vec<TestSlot> {
        (0..geo.len())
            .map(|_| TestSlot {
                ctl: AtomicU64::new(0),
                key: KeyCell::empty(),
            })
            .collect()
    }

    fn id(i: u32) -> ClientId {
        ClientId::from_ip(IpAddr::V4(Ipv4Addr::from(i)))
    }

    fn never_free(_: &TestSlot, _: u64) -> bool {
        false
    }

    #[test]
    fn claim_then_find_existing() {
        let geo = Geometry::new(64);
        let slots = table(&geo);
        let place = geo.place(id(1));
        let Located::Claimed { idx, prev } = locate(&geo, &slots, place, id(1), never_free) else {
            panic!("an empty table must have room");
        };
        assert_eq!(idx, place.home);
        assert_eq!(slots[idx].ctl.load(Ordering::SeqCst), place.busy);
        let published = publish(&slots[idx], prev, 5);
        assert_eq!(published, (1 << 32) | 5);
        match locate(&geo, &slots, place, id(1), never_free) {
            Located::Existing { idx: found, ctl } => assert_eq!((found, ctl), (idx, published)),
            _ => panic!("published identity not found"),
        }
    }

    #[test]
    fn rival_sees_another_claim_of_the_same_identity() {
        let geo = Geometry::new(64);
        let slots = table(&geo);
        let place = geo.place(id(1));
        let own = place.home;
        let other = (place.home + 3) & geo.mask;
        assert!(!rival(&geo, &slots, place, id(1).bits(), own));
        // Another thread mid-install of the same identity.
        slots[other].ctl.store(place.busy, Ordering::SeqCst);
        assert!(rival(&geo, &slots, place, id(1).bits(), own));
        // ... or finished installing it.
        slots[other].key.store(id(1).bits());
        slots[other].ctl.store(1 << 32, Ordering::SeqCst);
        assert!(rival(&geo, &slots, place, id(1).bits(), own));
        // Our own slot and other identities do not count.
        assert!(!rival(&geo, &slots, place, id(1).bits(), other));
        slots[other].key.store(id(2).bits());
        assert!(!rival(&geo, &slots, place, id(1).bits(), own));
    }

    #[test]
    fn a_stuck_install_of_the_same_identity_fails_open() {
        let geo = Geometry::new(64);
        let slots = table(&geo);
        let place = geo.place(id(1));
        // An installer of id(1) that never finishes (descheduled forever).
        slots[(place.home + 2) & geo.mask]
            .ctl
            .store(place.busy, Ordering::SeqCst);
        assert!(matches!(
            locate(&geo, &slots, place, id(1), never_free),
            Located::Full
        ));
        // Another identity's install is skipped, not waited for.
        let p2 = geo.place(id(2));
        slots[p2.home].ctl.store(BUSY | 12345, Ordering::SeqCst);
        assert!(!matches!(
            locate(&geo, &slots, p2, id(2), never_free),
            Located::Full
        ));
    }

    #[test]
    fn generation_wraps_inside_its_bits() {
        assert_eq!(next_gen::<TestSlot>(0), 1);
        assert_eq!(next_gen::<TestSlot>(((1 << 31) - 1) << 32 | 7), 0);
        assert_eq!(next_gen::<TestSlot>(BUSY | 5 << 32), 6);
    }
}
