//! The atomics the shared tables are built on: std's, or loom's under `--cfg loom` so the model tests can explore every interleaving.
//!
//! Loom models `SeqCst` loads, stores and read-modify-writes as `AcqRel` only (its
//! documented limitation), which would report the claim protocol's Dekker step (a CAS on
//! our slot, then loads of the others, in the single total order of `SeqCst`
//! operations) as a race it cannot have. Under loom, [`seqcst_point`] is a `SeqCst`
//! fence, which loom does model and which orders that CAS before those loads the way
//! the real `SeqCst` accesses do; in a normal build it is nothing.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU64, Ordering};

/// A busy-wait step: a CPU hint, or a yield to loom's scheduler (a spin loop that never
/// yields would never let the thread it waits for run in a model).
#[inline]
pub(crate) fn spin_loop() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    std::hint::spin_loop();
}

/// See the module documentation: the `SeqCst` order of the claim protocol, made
/// visible to loom.
#[inline]
pub(crate) fn seqcst_point() {
    #[cfg(loom)]
    loom::sync::atomic::fence(Ordering::SeqCst);
}
