//! A counting wrapper around the system allocator, so a shard can report how many heap allocations its thread made (`zgix_heap_allocations_total`).
//!
//! The count is a thread-local `Cell`: no atomic, no shared cache line, about
//! a nanosecond per allocation. Each shard copies its thread's count into its
//! counters once a tick. It exists to hold zgix to its rule that serving a
//! request allocates nothing: the end-to-end test `no_alloc_per_request`
//! drives requests through a warm connection and asserts the count stays flat.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// The allocator zgix's binary installs.
pub struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
    /// Bytes allocated minus bytes freed by this thread (memory another
    /// thread frees counts against that thread; zgix's shards free their own).
    static LIVE: Cell<i64> = const { Cell::new(0) };
}

#[inline]
fn count(delta: i64, new_allocation: bool) {
    let _ = LIVE.try_with(|c| c.set(c.get() + delta));
    if new_allocation {
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
    }
}

// SAFETY: every call is forwarded unchanged to the system allocator; the
// thread-local counter is a `const`-initialised `Cell`, which never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size() as i64, true);
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size() as i64, true);
        // SAFETY: same contract as ours.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size as i64 - layout.size() as i64, true);
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(-(layout.size() as i64), false);
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// Heap allocations made so far by the calling thread.
pub fn thread_allocations() -> u64 {
    ALLOCATIONS.try_with(|c| c.get()).unwrap_or(0)
}

/// Heap bytes the calling thread holds: what it allocated minus what it freed.
pub fn thread_live_bytes() -> i64 {
    LIVE.try_with(|c| c.get()).unwrap_or(0)
}
