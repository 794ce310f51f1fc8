//! The two kinds of probe state that neither a lock nor an atomic can hold, each behind the one
//! `unsafe impl Sync` it needs.
//!
//! - [`Records`]: probe records read by the hit path without a lock (a lock there would lengthen
//!   every hit). A record is written only while unpublished, under its registry's lock, and
//!   read only after a Release store of its address (kprobes' hash table, uprobes' index).
//! - [`PerContext`]: return-instance stacks, one per task slot (and one per CPU IRQ context),
//!   each changed only by code running in that context with IRQs masked (the kretprobe and
//!   uretprobe hit paths), and read by walkers in that context or in an IRQ above it.

use core::cell::UnsafeCell;
use core::mem::MaybeUninit;

/// `N` probe records of type `T`, written while unpublished and read after publication.
pub struct Records<T, const N: usize>([UnsafeCell<MaybeUninit<T>>; N]);

// SAFETY: see the module comment: writes happen only to unpublished records under the owner's
// registration lock; the hit path reads a record only after the Release store publishing it,
// and unregistering unpublishes before a record is reused (one CPU: no hit is in flight on
// another CPU while it does).
unsafe impl<T: Sync, const N: usize> Sync for Records<T, N> {}

impl<T, const N: usize> Records<T, N> {
    pub const fn new() -> Self {
        Self([const { UnsafeCell::new(MaybeUninit::uninit()) }; N])
    }

    /// Record `index`'s storage (initialised only once written).
    #[inline(always)]
    pub fn pointer(&self, index: usize) -> *mut T {
        self.0[index].get().cast()
    }

    /// The index of the record `record` points at (a reference into these records).
    pub fn index_of(&self, record: &T) -> usize {
        (record as *const T as usize - self.0.as_ptr() as usize) / core::mem::size_of::<T>()
    }
}

/// One `T` per execution context (task slot or IRQ context).
/// `repr(transparent)`: element `i` lies at `i * size_of::<T>()` (the graph tracer's asm indexes it).
#[repr(transparent)]
pub struct PerContext<T, const N: usize>([UnsafeCell<T>; N]);

// SAFETY: see the module comment: each element is changed only by its own context with IRQs
// masked, and read only by that context or an IRQ handler nested above it. One CPU.
unsafe impl<T: Sync, const N: usize> Sync for PerContext<T, N> {}

impl<T, const N: usize> PerContext<T, N> {
    pub const fn new(cells: [UnsafeCell<T>; N]) -> Self {
        Self(cells)
    }

    /// Context `index`'s element. Callers keep the rule above.
    #[inline(always)]
    pub fn get(&self, index: usize) -> *mut T {
        self.0[index].get()
    }
}
