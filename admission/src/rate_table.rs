//! `RateTable`: one token bucket per client identity in a fixed array of atomic slots, shared by every shard and every listener.

use std::fmt;

use crate::slot_table::{self, Geometry, KeyCell, Located, Slot, BUSY, EMPTY_KEY};
use crate::sync::{AtomicU64, Ordering};
use crate::token_bucket::{Rate, RateDecision, RateParams, MICROTOKENS_PER_TOKEN, TOKEN_MAX};
use crate::ClientId;

/// Control word: bit 63 `BUSY`, bits 50..63 a 13-bit generation, bits 0..50 the tokens
/// in microtokens (`TOKEN_MAX`). 13 bits means a stale CAS could only succeed if the slot
/// changed owner exactly 8192 times between one thread's load and its CAS, and each change
/// needs the previous bucket to have refilled completely.
const GEN_SHIFT: u32 = 50;

#[inline]
fn tokens(ctl: u64) -> u64 {
    ctl & TOKEN_MAX
}

#[inline]
fn with_tokens(ctl: u64, tokens: u64) -> u64 {
    (ctl & !TOKEN_MAX) | tokens
}

/// One bucket: 40 bytes padded to a 64-byte line.
///
/// Every admitted request writes its bucket, from whichever core it landed on. Two
/// buckets sharing a line would make each hot client's writes invalidate the other's
/// line on another core (false sharing), so each slot gets a line: 64 B × entries
/// (256 KiB for the default 4096) instead of 160 KiB packed. A probe window is then 8
/// adjacent lines, which the prefetcher streams.
#[repr(C, align(64))]
struct RateSlot {
    ctl: AtomicU64,
    /// Bucket clock: the refill is paid up to here. Advanced by CAS, so two threads
    /// can never both be paid for the same interval.
    stamp: AtomicU64,
    /// When the bucket is full again if nothing takes from it (with the parameters of
    /// the listener that last took a token). Only ever raised while one client owns the
    /// slot; read by `in_use` and as a guard against recycling a bucket another
    /// listener still considers live.
    full_at: AtomicU64,
    key: KeyCell,
    /// Tokens taken for fleet-scoped listeners since the fleet sync last drained the
    /// slot, and (`FLEET_TAG_SHIFT` up) the tag of the last such listener. Written on
    /// the line the take already owns, so it costs no extra cache-line transfer.
    spent: AtomicU64,
}

/// `RateSlot::spent`: the low 40 bits count tokens, the high 24 the listener tag.
const FLEET_TAG_SHIFT: u32 = 40;
const FLEET_COUNT_MASK: u64 = (1 << FLEET_TAG_SHIFT) - 1;

impl Slot for RateSlot {
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

/// Per-identity token buckets, allocated once, probed at most 8 slots deep.
///
/// Keyed by [`ClientId`] only: the parameters come with each check (they are per
/// listener) while the bucket is per address, so one client on two listeners drains one
/// bucket. A slot is reusable once its bucket has refilled to the burst — an idle
/// client and a client never seen are indistinguishable — so a few thousand slots serve
/// any number of distinct clients over time, as long as not too many are mid-burst at
/// once.
pub struct RateTable {
    slots: Box<[RateSlot]>,
    geo: Geometry,
    /// The one bucket every identity that finds no slot shares under
    /// [`Overflow::Shared`]. Its key never changes (generation 0 forever), so `take`
    /// never sees it change owner; it starts at `TOKEN_MAX`, which the first check
    /// clamps to that listener's burst.
    overflow: RateSlot,
}

/// What a rate check does for an identity that finds no slot within its probe window
/// (`limits.rate_limit_overflow`).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum Overflow {
    /// Admit it (and let the caller count `TableFull`): today's rule, a full table is
    /// never an outage.
    #[default]
    FailOpen,
    /// Take from one bucket all such identities share, with the listener's rate: a
    /// client rotating through millions of /64s to fill the table gets, in total, one
    /// client's rate instead of unlimited requests.
    Shared,
}

/// A rate check with what the occupancy metrics need.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct RateCheck {
    /// `TableFull` only under [`Overflow::FailOpen`].
    pub decision: RateDecision,
    /// Slots past the identity's home that were probed to find or claim its bucket
    /// (0..=7), or [`PROBE_DEPTH_FULL`] when none was found.
    pub depth: u8,
    /// The identity found no slot; under [`Overflow::Shared`] `decision` came from the
    /// shared bucket.
    pub overflowed: bool,
    /// Whole tokens left in the bucket that answered after this check (the shared
    /// bucket's when `overflowed`; 0 for `TableFull`).
    pub remaining: u64,
    /// Seconds (rounded up) until that bucket gains its next whole token; 0 when it is
    /// full. For a `Limited` check this is the `Retry-After` value.
    pub next_token_secs: u64,
}

impl RateCheck {
    fn new(decision: RateDecision, depth: u8, overflowed: bool, left: u64, rate: &Rate) -> Self {
        let (remaining, next_token_secs) = match decision {
            RateDecision::TableFull => (0, 0),
            _ if left >= rate.cap => (left / MICROTOKENS_PER_TOKEN, 0),
            _ => (
                left / MICROTOKENS_PER_TOKEN,
                rate.retry_after_secs(left % MICROTOKENS_PER_TOKEN),
            ),
        };
        RateCheck {
            decision,
            depth,
            overflowed,
            remaining,
            next_token_secs,
        }
    }
}

/// `RateCheck::depth` of an identity that found no slot: one past the deepest probe.
pub const PROBE_DEPTH_FULL: u8 = slot_table::PROBES as u8;

/// A token taken by an allowed check, to give back with [`RateTable::refund_spent`].
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Spent {
    /// The identity (address or hashed key) whose bucket paid.
    pub id: ClientId,
    pub params: RateParams,
    /// Paid by the shared overflow bucket.
    pub shared: bool,
    /// Counted for the fleet sync ([`RateTable::check_fleet`]): a refund takes it
    /// back from the count the sync has not drained yet.
    pub fleet: bool,
}

impl RateTable {
    /// A table of `entries` slots, rounded up to a power of two (and at least 8).
    pub fn new(entries: usize) -> Self {
        let geo = Geometry::new(entries);
        let slots = (0..geo.len())
            .map(|_| RateSlot {
                ctl: AtomicU64::new(0),
                stamp: AtomicU64::new(0),
                full_at: AtomicU64::new(0),
                key: KeyCell::empty(),
                spent: AtomicU64::new(0),
            })
            .collect();
        let overflow = RateSlot {
            ctl: AtomicU64::new(TOKEN_MAX),
            stamp: AtomicU64::new(0),
            full_at: AtomicU64::new(0),
            key: KeyCell::empty(),
            spent: AtomicU64::new(0),
        };
        RateTable {
            slots,
            geo,
            overflow,
        }
    }

    /// [`RateTable::check`] with the table's overflow rule, reporting the probe depth
    /// and whether the identity overflowed. Same bounds: at most 8 slots probed, then
    /// (under `Shared`) one more bucket; no allocation, no lock.
    pub fn check_with(
        &self,
        id: ClientId,
        p: RateParams,
        now_ns: u64,
        overflow: Overflow,
    ) -> RateCheck {
        self.check_inner(id, p, now_ns, overflow, None)
    }

    fn check_inner(
        &self,
        id: ClientId,
        p: RateParams,
        now_ns: u64,
        overflow: Overflow,
        tag: Option<u32>,
    ) -> RateCheck {
        let rate = Rate::new(p);
        let (decision, depth, left) = self.check_depth(id, &rate, now_ns, tag);
        if decision != RateDecision::TableFull {
            return RateCheck::new(decision, depth, false, left, &rate);
        }
        let (decision, left) = match overflow {
            Overflow::FailOpen => (RateDecision::TableFull, 0),
            Overflow::Shared => {
                let ctl = self.overflow.ctl.load(Ordering::SeqCst);
                // The overflow slot never changes owner, so `take` always settles.
                take(&self.overflow, ctl, &rate, now_ns).unwrap_or((RateDecision::TableFull, 0))
            }
        };
        RateCheck::new(decision, PROBE_DEPTH_FULL, true, left, &rate)
    }

    /// [`RateTable::check_with`] for a fleet-scoped listener: a token taken from the
    /// identity's own bucket is also counted for the fleet sync under `tag` (a
    /// stable number for the listener that its name maps to, below 2^24), which [`RateTable::drain_spent`] collects. The
    /// shared overflow bucket is not synced (it has no identity to name).
    pub fn check_fleet(
        &self,
        id: ClientId,
        p: RateParams,
        now_ns: u64,
        overflow: Overflow,
        tag: u32,
    ) -> RateCheck {
        self.check_inner(id, p, now_ns, overflow, Some(tag))
    }

    /// Takes one token back from `id`'s undrained fleet count (a refund); nothing
    /// when the sync drained it already (the fleet then counts one token too many,
    /// never one too few).
    fn uncount_spent(&self, id: ClientId) {
        let Some((idx, _)) = slot_table::find(&self.geo, &self.slots, self.geo.place(id), id)
        else {
            return;
        };
        let spent = &self.slots[idx].spent;
        let mut cur = spent.load(Ordering::Relaxed);
        while cur & FLEET_COUNT_MASK > 0 {
            match spent.compare_exchange_weak(cur, cur - 1, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return,
                Err(v) => cur = v,
            }
        }
    }

    /// Collects what fleet-scoped checks took since the last call: `f(id, tag,
    /// tokens)` for every slot that took any. Scans the table; for the fleet sync
    /// thread, never the request path. A slot with an undrained count is not
    /// recycled (see `is_stale`), so no count is lost to a newcomer; a take racing
    /// the recycling of a slot it found (the owner's bucket had refilled) is counted
    /// under the new owner at worst, a one-token error.
    pub fn drain_spent(&self, mut f: impl FnMut(ClientId, u32, u64)) {
        for s in self.slots.iter() {
            if s.spent.load(Ordering::Relaxed) & FLEET_COUNT_MASK == 0 {
                continue;
            }
            let w = s.ctl.load(Ordering::SeqCst);
            let key = s.key.load();
            let w2 = s.ctl.load(Ordering::SeqCst);
            if w & BUSY != 0
                || w2 & BUSY != 0
                || w >> GEN_SHIFT != w2 >> GEN_SHIFT
                || key == EMPTY_KEY
            {
                continue;
            }
            let v = s.spent.swap(0, Ordering::AcqRel);
            let n = v & FLEET_COUNT_MASK;
            if n > 0 {
                f(ClientId::from_bits(key), (v >> FLEET_TAG_SHIFT) as u32, n);
            }
        }
    }

    /// Takes `tokens` tokens from `id`'s bucket for what other boxes of the fleet
    /// spent: first the whole tokens it holds, then the refill it has not earned yet,
    /// by moving its clock forward (a bucket clock in the future earns nothing until
    /// the time comes, so a client spending on every box at once finds this box's
    /// bucket empty for as long as the others' spending is worth). The clock moves at
    /// most one window (or one full refill, if longer) past `now_ns`, so no debt locks
    /// a client out for longer.
    /// Returns the tokens taken (0 when `id` holds no bucket here). Lock-free.
    pub fn debit(&self, id: ClientId, p: RateParams, tokens: u64, now_ns: u64) -> u64 {
        let rate = Rate::new(p);
        let Some((idx, mut ctl)) = slot_table::find(&self.geo, &self.slots, self.geo.place(id), id)
        else {
            return 0;
        };
        let slot = &self.slots[idx];
        let owner = ctl >> GEN_SHIFT;
        let mut took = 0;
        loop {
            let take = (self::tokens(ctl) / MICROTOKENS_PER_TOKEN).min(tokens);
            if take == 0 {
                break;
            }
            let left = self::tokens(ctl) - take * MICROTOKENS_PER_TOKEN;
            match slot.ctl.compare_exchange(
                ctl,
                with_tokens(ctl, left),
                Ordering::AcqRel,
                Ordering::SeqCst,
            ) {
                Ok(_) => {
                    took = take;
                    break;
                }
                Err(cur) if cur >> GEN_SHIFT == owner => ctl = cur,
                Err(_) => return 0,
            }
        }
        let rest = tokens - took;
        if rest == 0 {
            return took;
        }
        let window_ns = p.window_ms.max(1).saturating_mul(1_000_000);
        let horizon = now_ns.saturating_add(rate.ns_for(rate.cap).max(window_ns));
        let per = rate.ns_for(rest.saturating_mul(MICROTOKENS_PER_TOKEN));
        loop {
            let s = slot.stamp.load(Ordering::Acquire);
            let new = s.saturating_add(per).min(horizon.max(s));
            if new == s || slot.ctl.load(Ordering::SeqCst) >> GEN_SHIFT != owner {
                return took;
            }
            if slot
                .stamp
                .compare_exchange(s, new, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                // Not recyclable before it has refilled from the new clock.
                slot.full_at
                    .fetch_max(rate.full_at(0, new), Ordering::AcqRel);
                let moved = new - s;
                return took
                    + if moved >= per {
                        rest
                    } else {
                        (moved / rate.ns_for(MICROTOKENS_PER_TOKEN).max(1)).min(rest)
                    };
            }
        }
    }

    /// Gives back a token an allowed [`RateTable::check_with`] took: from the
    /// identity's bucket, or from the shared overflow bucket. Same rules as
    /// [`RateTable::refund`].
    pub fn refund_spent(&self, s: Spent) -> bool {
        if !s.shared {
            if s.fleet {
                self.uncount_spent(s.id);
            }
            return self.refund(s.id, s.params);
        }
        let cap = Rate::new(s.params).cap;
        let mut ctl = self.overflow.ctl.load(Ordering::SeqCst);
        loop {
            let left = tokens(ctl).min(cap);
            if left >= cap {
                return false;
            }
            let back = (left + crate::token_bucket::MICROTOKENS_PER_TOKEN).min(cap);
            match self.overflow.ctl.compare_exchange(
                ctl,
                with_tokens(ctl, back),
                Ordering::AcqRel,
                Ordering::SeqCst,
            ) {
                Ok(_) => return true,
                Err(cur) => ctl = cur,
            }
        }
    }

    /// Take one token from `id`'s bucket at `now_ns` (a monotonic clock; it may stall or
    /// step back between callers without harm).
    pub fn check(&self, id: ClientId, p: RateParams, now_ns: u64) -> RateDecision {
        self.check_depth(id, &Rate::new(p), now_ns, None).0
    }

    /// The decision, the probe depth and the microtokens left in the bucket.
    ///
    /// With a fleet `tag`, a token taken is also counted in the slot's `spent` for the
    /// fleet sync: on the line the take just wrote, so no extra cache-line transfer.
    fn check_depth(
        &self,
        id: ClientId,
        rate: &Rate,
        now_ns: u64,
        tag: Option<u32>,
    ) -> (RateDecision, u8, u64) {
        let rate = *rate;
        let tagged = tag.map(|t| u64::from(t & 0xff_ffff) << FLEET_TAG_SHIFT);
        let place = self.geo.place(id);
        let depth = |idx: usize| ((idx.wrapping_sub(place.home)) & self.geo.mask) as u8;
        for _ in 0..slot_table::MAX_ATTEMPTS {
            let free = |s: &RateSlot, ctl: u64| is_stale(s, ctl, &rate, now_ns);
            match slot_table::locate(&self.geo, &self.slots, place, id, free) {
                Located::Full => return (RateDecision::TableFull, PROBE_DEPTH_FULL, 0),
                Located::Claimed { idx, prev } => {
                    let slot = &self.slots[idx];
                    // A new bucket starts full and pays for this request at once.
                    let left = rate.cap - crate::token_bucket::MICROTOKENS_PER_TOKEN;
                    slot.stamp.store(now_ns, Ordering::Relaxed);
                    // Nothing the previous owner spent is this one's.
                    slot.spent
                        .store(tagged.map_or(0, |t| t | 1), Ordering::Relaxed);
                    slot.full_at
                        .store(rate.full_at(left, now_ns), Ordering::Relaxed);
                    slot_table::publish(slot, prev, left);
                    return (RateDecision::Allowed, depth(idx), left);
                }
                Located::Existing { idx, ctl } => {
                    if let Some((d, left)) = take(&self.slots[idx], ctl, &rate, now_ns) {
                        if let (Some(t), RateDecision::Allowed) = (tagged, d) {
                            count_spent(&self.slots[idx], t);
                        }
                        return (d, depth(idx), left);
                    }
                }
            }
        }
        (RateDecision::TableFull, PROBE_DEPTH_FULL, 0)
    }

    /// Gives back the token a request took, for a request refused after its rate check
    /// for a reason that must not cost the client one: a 503 from the connection limit
    /// (the two limits are independent), or a 413 for a chunked body that grew past
    /// `max_request_body` (oversized requests are answered "before" the rate check; a
    /// body whose size is unknown up front can only be found out after it).
    ///
    /// Call it at most once, and only after [`RateTable::check`] answered `Allowed` for
    /// `id` with the same `p` (`TableFull` took nothing). The bucket never goes above its
    /// burst. Returns false when `id` holds no bucket any more (its slot was recycled,
    /// which needs the bucket to have refilled, so nothing is owed) or the bucket was
    /// already full.
    pub fn refund(&self, id: ClientId, p: RateParams) -> bool {
        let cap = Rate::new(p).cap;
        let Some((idx, mut ctl)) = slot_table::find(&self.geo, &self.slots, self.geo.place(id), id)
        else {
            return false;
        };
        let slot = &self.slots[idx];
        let owner = ctl >> GEN_SHIFT;
        loop {
            let left = tokens(ctl);
            if left >= cap {
                return false;
            }
            let back = (left + crate::token_bucket::MICROTOKENS_PER_TOKEN).min(cap);
            match slot.ctl.compare_exchange(
                ctl,
                with_tokens(ctl, back),
                Ordering::AcqRel,
                Ordering::SeqCst,
            ) {
                Ok(_) => return true,
                Err(cur) if cur >> GEN_SHIFT == owner => ctl = cur,
                // Re-keyed: the bucket refilled and went to someone else.
                Err(_) => return false,
            }
        }
    }

    /// Number of slots (a power of two).
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Slots holding a bucket that has not refilled yet at `now_ns`. Scans the table;
    /// for `/metrics`, not the request path.
    pub fn in_use(&self, now_ns: u64) -> usize {
        self.slots
            .iter()
            .filter(|s| {
                let ctl = s.ctl.load(Ordering::Acquire);
                ctl & BUSY != 0
                    || (s.key.load() != EMPTY_KEY && s.full_at.load(Ordering::Acquire) > now_ns)
            })
            .count()
    }

    /// Keys of every claimed slot (tests: no identity twice).
    #[cfg(all(test, loom))]
    pub(crate) fn keys(&self) -> Vec<u128> {
        slot_table::keys(&self.slots)
    }

    /// Microtokens in `id`'s bucket, without refilling (tests).
    #[cfg(all(test, loom))]
    pub(crate) fn tokens_of(&self, id: ClientId) -> Option<u64> {
        slot_table::find(&self.geo, &self.slots, self.geo.place(id), id).map(|(_, c)| tokens(c))
    }

    #[cfg(test)]
    fn home(&self, id: ClientId) -> usize {
        self.geo.place(id).home
    }
}

impl fmt::Debug for RateTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateTable")
            .field("capacity", &self.capacity())
            .finish_non_exhaustive()
    }
}

/// One more token spent for the fleet in `slot`, under the tag bits `tagged`: one
/// CAS loop on the client's own line (the count saturates at 2^40 - 1).
fn count_spent(slot: &RateSlot, tagged: u64) {
    let mut cur = slot.spent.load(Ordering::Relaxed);
    loop {
        let next = tagged | ((cur & FLEET_COUNT_MASK) + 1).min(FLEET_COUNT_MASK);
        match slot
            .spent
            .compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Relaxed)
        {
            Ok(_) => return,
            Err(v) => cur = v,
        }
    }
}

/// May a slot holding another identity's bucket be recycled for a newcomer? Only once
/// the bucket is full both by this listener's parameters and by its own `full_at`,
/// and the fleet sync has drained what it spent: recycling a slot whose count was not
/// yet collected would lose tokens the fleet must hear of (a client that spent and
/// went quiet long enough to refill, before the next sync). Such a slot waits at most
/// one `fleet.sync_ms` (the sync drains every period, Redis up or not).
fn is_stale(s: &RateSlot, ctl: u64, rate: &Rate, now: u64) -> bool {
    now >= s.full_at.load(Ordering::Acquire)
        && rate.is_refilled(tokens(ctl), s.stamp.load(Ordering::Acquire), now)
        && s.spent.load(Ordering::Acquire) & FLEET_COUNT_MASK == 0
}

/// Refill and take from the bucket in `slot`, whose owner (ours) was seen in `ctl`.
/// `None` when the slot changed owner meanwhile: the caller probes again.
fn take(slot: &RateSlot, mut ctl: u64, rate: &Rate, now: u64) -> Option<(RateDecision, u64)> {
    let owner = ctl >> GEN_SHIFT;
    loop {
        // Claim the refill for [stamp, new_stamp) first; a lost CAS means another thread
        // was paid for it, so reload and recompute.
        let stamp = slot.stamp.load(Ordering::Acquire);
        let (grant, new_stamp) = rate.refill(tokens(ctl), stamp, now);
        if new_stamp != stamp
            && slot
                .stamp
                .compare_exchange(stamp, new_stamp, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
        {
            ctl = slot.ctl.load(Ordering::SeqCst);
            if ctl >> GEN_SHIFT != owner {
                return None;
            }
            continue;
        }
        // Deposit the grant and take a token. The grant stays ours across CAS retries;
        // if the slot changes owner it is dropped, which only ever under-refills.
        loop {
            let (left, decision) = rate.settle(tokens(ctl), grant);
            if left == tokens(ctl) {
                return Some((decision, left));
            }
            match slot.ctl.compare_exchange(
                ctl,
                with_tokens(ctl, left),
                Ordering::AcqRel,
                Ordering::SeqCst,
            ) {
                Ok(_) => {
                    if decision == RateDecision::Allowed {
                        slot.full_at
                            .fetch_max(rate.full_at(left, now), Ordering::AcqRel);
                    }
                    return Some((decision, left));
                }
                Err(cur) => {
                    if cur >> GEN_SHIFT != owner {
                        return None;
                    }
                    ctl = cur;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
