//! Reused heap blocks for the request-handling future (and other per-request values), so an idle connection's task holds only its small idle state.
//!
//! An async fn's future is as large as its largest state: the connection
//! task would carry the whole forward-and-stream machinery (about 2 KB)
//! while it only waits for its next request. Running each request's future
//! in a block from this per-shard slab keeps the task small, and reusing the
//! blocks keeps the request path free of allocation: a block is allocated
//! only when more requests are in flight at once than ever before (trimmed
//! back once a second, like the request states). The same blocks hold other
//! per-request values that would otherwise be allocated each time (an
//! HTTP/2 stream's I/O state, [`FutureSlab::place_in`]).

use std::alloc::Layout;
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::ptr::NonNull;
use std::rc::Rc;
use std::task::{Context, Poll};

/// Blocks of one layout; every future run (or value placed) through one
/// slab has that layout (one slab per type).
pub struct FutureSlab {
    layout: Cell<Option<Layout>>,
    free: RefCell<Vec<NonNull<u8>>>,
    out: Cell<usize>,
    peak: Cell<usize>,
}

impl Default for FutureSlab {
    fn default() -> Self {
        FutureSlab {
            layout: Cell::new(None),
            free: RefCell::new(Vec::new()),
            out: Cell::new(0),
            peak: Cell::new(0),
        }
    }
}

impl FutureSlab {
    /// Makes the future `make` returns in a block of this slab; the returned
    /// future runs it to completion there. The future is written straight
    /// into the block (`make` is inlined and the optimiser constructs its
    /// result through the `&mut MaybeUninit` in the block's place), not
    /// built beside it and moved in: a moved request future is a `memcpy`
    /// of its whole size (~800 instructions per request in
    /// `scripts/callgrind-h2.sh`) however little of it the unstarted state
    /// uses. Rust promises no placement, so that script is what shows the
    /// copy is gone (`FutureSlab::run` absent from its profile). (Not an
    /// async fn: its frame would hold the future itself.)
    #[inline(always)]
    pub fn run<F: Future>(&self, make: impl FnOnce() -> F) -> Running<'_, F> {
        Running {
            slab: self,
            p: self.place(make),
        }
    }

    /// As [`FutureSlab::run`], for a slab that `owner` holds (`slab` finds
    /// it there): the future keeps the owner alive and so is `'static`, and
    /// its type is erased behind two function pointers, so a set of futures
    /// holds the [`RunningIn`] itself: neither the future (an HTTP/2
    /// stream's is about 1 KiB, past the allocator's small-size cache) nor
    /// a handle to it is boxed.
    #[inline(always)]
    pub fn run_in<S, F: Future + 'static>(
        owner: Rc<S>,
        slab: fn(&S) -> &FutureSlab,
        make: impl FnOnce() -> F,
    ) -> RunningIn<S, F::Output> {
        let p = slab(&owner).place(make);
        RunningIn {
            owner,
            slab,
            p: p.cast(),
            poll: poll_at::<F>,
            drop: drop_at::<F>,
        }
    }

    /// A value `make` returns, kept in a block of a slab `owner` holds
    /// (reused, as the futures' blocks are) for as long as the returned
    /// [`PlacedIn`] lives: a per-request value without an allocation.
    #[inline(always)]
    pub fn place_in<S, T>(
        owner: Rc<S>,
        slab: fn(&S) -> &FutureSlab,
        make: impl FnOnce() -> T,
    ) -> PlacedIn<S, T> {
        let p = slab(&owner).place(make);
        PlacedIn { owner, slab, p }
    }

    /// `make`'s result written straight into an unused block (see `run`).
    #[inline(always)]
    fn place<F>(&self, make: impl FnOnce() -> F) -> NonNull<F> {
        let p = self.block::<F>();
        // SAFETY: the block is sized and aligned for F and unused; a
        // `&mut MaybeUninit<F>` is valid for any bytes.
        let slot = unsafe { &mut *p.as_ptr().cast::<MaybeUninit<F>>() };
        slot.write(make());
        p
    }

    /// Takes back the block at `p` (its future already dropped).
    fn give_back<F>(&self, p: NonNull<F>) {
        self.out.set(self.out.get() - 1);
        self.free.borrow_mut().push(p.cast());
    }

    /// An unused block for an `F`, counted out.
    fn block<F>(&self) -> NonNull<F> {
        let layout = Layout::new::<F>();
        match self.layout.get() {
            None => self.layout.set(Some(layout)),
            Some(l) => assert_eq!(l, layout, "one type per slab"),
        }
        let block = match self.free.borrow_mut().pop() {
            Some(b) => b,
            None => {
                // SAFETY: the layout has a non-zero size (a future holding a
                // `&mut Conn` is at least a pointer).
                let p = unsafe { std::alloc::alloc(layout) };
                NonNull::new(p).unwrap_or_else(|| std::alloc::handle_alloc_error(layout))
            }
        };
        let out = self.out.get() + 1;
        self.out.set(out);
        self.peak.set(self.peak.get().max(out));
        block.cast::<F>()
    }

    /// Frees the blocks the last interval's peak did not need (shard tick).
    pub fn trim(&self) {
        let out = self.out.get();
        let spare = self.peak.replace(out).saturating_sub(out);
        let mut free = self.free.borrow_mut();
        while free.len() > spare {
            if let (Some(b), Some(l)) = (free.pop(), self.layout.get()) {
                // SAFETY: every block was allocated with this layout.
                unsafe { std::alloc::dealloc(b.as_ptr(), l) };
            }
        }
    }
}

impl Drop for FutureSlab {
    fn drop(&mut self) {
        if let Some(l) = self.layout.get() {
            for b in self.free.get_mut().drain(..) {
                // SAFETY: every block was allocated with this layout.
                unsafe { std::alloc::dealloc(b.as_ptr(), l) };
            }
        }
    }
}

/// A future living in a slab block: polled in place (the block never moves),
/// dropped in place, then the block goes back.
pub struct Running<'a, F: Future> {
    slab: &'a FutureSlab,
    p: NonNull<F>,
}

impl<F: Future> Future for Running<'_, F> {
    type Output = F::Output;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // SAFETY: the block holds a live F that is never moved until it is
        // dropped in place by `Running::drop`.
        unsafe { Pin::new_unchecked(&mut *self.p.as_ptr()) }.poll(cx)
    }
}

impl<F: Future> Drop for Running<'_, F> {
    fn drop(&mut self) {
        // SAFETY: the block holds a live F (written by `run`), dropped once here.
        unsafe { std::ptr::drop_in_place(self.p.as_ptr()) };
        self.slab.give_back(self.p);
    }
}

/// A future living in a block of a slab its owner holds ([`FutureSlab::run_in`]),
/// its type erased: `poll` and `drop` are the future type's own, chosen
/// when it was placed.
pub struct RunningIn<S, O> {
    owner: Rc<S>,
    slab: fn(&S) -> &FutureSlab,
    p: NonNull<u8>,
    poll: unsafe fn(NonNull<u8>, &mut Context<'_>) -> Poll<O>,
    drop: unsafe fn(NonNull<u8>),
}

/// Polls the `F` at `p` in place.
///
/// # Safety
/// `p` holds a live `F` that never moves until it is dropped in place.
unsafe fn poll_at<F: Future>(p: NonNull<u8>, cx: &mut Context<'_>) -> Poll<F::Output> {
    // SAFETY: the caller's promise.
    unsafe { Pin::new_unchecked(&mut *p.cast::<F>().as_ptr()) }.poll(cx)
}

/// Drops the `F` at `p` in place.
///
/// # Safety
/// `p` holds a live `F`, not used again.
unsafe fn drop_at<F>(p: NonNull<u8>) {
    // SAFETY: the caller's promise.
    unsafe { std::ptr::drop_in_place(p.cast::<F>().as_ptr()) }
}

impl<S, O> Future for RunningIn<S, O> {
    type Output = O;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<O> {
        // SAFETY: as for `Running`: the block's future (of the type `poll`
        // was made for) never moves until dropped.
        unsafe { (self.poll)(self.p, cx) }
    }
}

impl<S, O> Drop for RunningIn<S, O> {
    fn drop(&mut self) {
        // SAFETY: the block holds a live future (written by `run_in`, of
        // the type `drop` was made for), dropped once here.
        unsafe { (self.drop)(self.p) };
        (self.slab)(&self.owner).give_back(self.p);
    }
}

/// A value living in a block of a slab its owner holds ([`FutureSlab::place_in`]).
pub struct PlacedIn<S, T> {
    owner: Rc<S>,
    slab: fn(&S) -> &FutureSlab,
    p: NonNull<T>,
}

impl<S, T> std::ops::Deref for PlacedIn<S, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the block holds a live T until `drop`.
        unsafe { self.p.as_ref() }
    }
}

impl<S, T> Drop for PlacedIn<S, T> {
    fn drop(&mut self) {
        // SAFETY: the block holds a live T (written by `place_in`), dropped once here.
        unsafe { std::ptr::drop_in_place(self.p.as_ptr()) };
        (self.slab)(&self.owner).give_back(self.p);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_reused_and_trimmed_to_the_peak() {
        let slab = FutureSlab::default();
        futures_lite::future::block_on(async {
            for i in 0..10u64 {
                let v = slab.run(|| async move { i * 2 }).await;
                assert_eq!(v, i * 2);
            }
        });
        assert_eq!(
            slab.free.borrow().len(),
            1,
            "one block serves sequential runs"
        );
        slab.trim();
        assert_eq!(slab.free.borrow().len(), 1, "the peak (1) keeps its block");
        slab.trim();
        assert_eq!(slab.free.borrow().len(), 0, "an idle interval frees it");
    }

    /// What holds a slab in the `run_in` and `place_in` tests.
    struct Owner {
        slab: FutureSlab,
    }

    fn slab(o: &Owner) -> &FutureSlab {
        &o.slab
    }

    #[test]
    fn a_future_run_in_an_owned_slab_returns_its_block_however_it_ends() {
        let owner = Rc::new(Owner {
            slab: FutureSlab::default(),
        });
        // One future type per slab (and not zero-sized): done or never.
        async fn wait(x: u64, done: bool) -> u64 {
            if !done {
                std::future::pending::<()>().await;
            }
            x
        }
        let done = futures_lite::future::block_on(FutureSlab::run_in(owner.clone(), slab, || {
            wait(7, true)
        }));
        assert_eq!(done, 7);
        assert_eq!(
            (owner.slab.out.get(), owner.slab.free.borrow().len()),
            (0, 1)
        );
        // Dropped unfinished, after its owner's other handle went: the
        // future holds the owner, so the block goes back to a live slab.
        let pending = FutureSlab::run_in(owner.clone(), slab, || wait(8, false));
        assert_eq!(owner.slab.out.get(), 1);
        let weak = Rc::downgrade(&owner);
        drop(owner);
        assert!(weak.upgrade().is_some(), "the future keeps its owner");
        drop(pending);
        assert!(weak.upgrade().is_none(), "and lets it go when dropped");
    }

    #[test]
    fn a_placed_value_reuses_its_block_and_is_dropped_in_place() {
        let owner = Rc::new(Owner {
            slab: FutureSlab::default(),
        });
        let dropped = Rc::new(Cell::new(0));
        struct Value(u64, Rc<Cell<u32>>);
        impl Drop for Value {
            fn drop(&mut self) {
                self.1.set(self.1.get() + 1);
            }
        }
        let a = FutureSlab::place_in(owner.clone(), slab, || Value(1, dropped.clone()));
        let b = FutureSlab::place_in(owner.clone(), slab, || Value(2, dropped.clone()));
        assert_eq!((a.0, b.0, owner.slab.out.get()), (1, 2, 2));
        let at = &*a as *const Value;
        drop(a);
        assert_eq!((dropped.get(), owner.slab.out.get()), (1, 1));
        let c = FutureSlab::place_in(owner.clone(), slab, || Value(3, dropped.clone()));
        assert_eq!(&*c as *const Value, at, "the freed block is reused");
        assert_eq!(c.0, 3);
        drop((b, c));
        assert_eq!(dropped.get(), 3);
        assert_eq!(
            (owner.slab.out.get(), owner.slab.free.borrow().len()),
            (0, 2)
        );
    }

    #[test]
    fn a_dropped_future_is_dropped_in_place_and_returns_its_block() {
        let slab = FutureSlab::default();
        let dropped = std::rc::Rc::new(Cell::new(false));
        struct Flag(std::rc::Rc<Cell<bool>>);
        impl Drop for Flag {
            fn drop(&mut self) {
                self.0.set(true);
            }
        }
        {
            let flag = Flag(dropped.clone());
            let fut = slab.run(|| async move {
                let _f = flag;
                std::future::pending::<()>().await
            });
            let mut fut = Box::pin(fut);
            let w = futures_lite::future::block_on(futures_lite::future::poll_once(fut.as_mut()));
            assert!(w.is_none());
        }
        assert!(dropped.get());
        assert_eq!(slab.out.get(), 0);
        assert_eq!(slab.free.borrow().len(), 1);
    }
}
