//! The lookup-hit path's atomic accesses, uninstrumented with the `kernel` feature.
//!
//! With the `kernel` feature every function of the hit path is built with
//! `#[sanitize(kernel_hwaddress = "off")]`, and LLVM does not inline a
//! function built with the sanitizer on into one built with it off. Core's
//! atomic methods (`AtomicU64::load`, `fetch_add`) are such functions: each
//! access would be an out-of-line call that checks its tag anyway. So with
//! the feature these helpers are the atomic intrinsics themselves, always
//! inlined, and are instrumented or not as their caller is; without it they
//! are the ordinary methods (what host tests and Miri check).

#[cfg(not(feature = "kernel"))]
use core::sync::atomic::Ordering;
use core::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, AtomicUsize};

/// Defines an always-inlined atomic load of `$value` from `$atomic`.
macro_rules! load {
    ($(#[$doc:meta])* $name:ident, $atomic:ty, $value:ty, $ordering:ident) => {
        $(#[$doc])*
        #[inline(always)]
        pub(crate) fn $name(atomic: &$atomic) -> $value {
            #[cfg(feature = "kernel")]
            {
                let pointer = atomic as *const $atomic as *const $value;
                // SAFETY: the atomic type has the same in-memory
                // representation as `$value`; `pointer` comes from a
                // reference, so it is valid and aligned; and the access is
                // atomic with the same ordering as the method's.
                unsafe {
                    core::intrinsics::atomic_load::<$value, { core::intrinsics::AtomicOrdering::$ordering }>(pointer)
                }
            }
            #[cfg(not(feature = "kernel"))]
            atomic.load(Ordering::$ordering)
        }
    };
}

load!(
    /// A bucket head, acquire: the records it leads to are published.
    load_acquire_u32, AtomicU32, u32, Acquire
);
load!(
    /// A record's header word, acquire (pairs with the release publication).
    load_acquire, AtomicU64, u64, Acquire
);
load!(
    /// A frame word of a published record.
    load_relaxed, AtomicU64, u64, Relaxed
);
load!(
    /// A pool's base, acquire: its length was stored before it.
    load_acquire_pointer, AtomicPtr<AtomicU64>, *mut AtomicU64, Acquire
);
load!(
    /// A pool's length in words, read after its base.
    load_relaxed_usize, AtomicUsize, usize, Relaxed
);

/// A relaxed `fetch_add(1)` for the hit counter: a real atomic
/// read-modify-write (concurrent savers must not lose counts).
#[inline(always)]
pub(crate) fn increment(counter: &AtomicU64) {
    #[cfg(feature = "kernel")]
    {
        let pointer = counter as *const AtomicU64 as *mut u64;
        // SAFETY: as in the loads; `AtomicU64` is an `UnsafeCell` inside,
        // so writing through a pointer derived from a shared reference is
        // allowed, and the write is atomic, exactly what `fetch_add` does.
        unsafe {
            core::intrinsics::atomic_xadd::<u64, u64, { core::intrinsics::AtomicOrdering::Relaxed }>(pointer, 1);
        }
    }
    #[cfg(not(feature = "kernel"))]
    counter.fetch_add(1, Ordering::Relaxed);
}

/// The `words`-long slice at `base` (`core::slice::from_raw_parts` without
/// the call: with the `kernel` feature it is the intrinsic that builds the
/// slice pointer).
///
/// # Safety
///
/// As for `core::slice::from_raw_parts`, for the `'static` lifetime.
#[inline(always)]
pub(crate) unsafe fn pool_words(base: *const AtomicU64, words: usize) -> &'static [AtomicU64] {
    #[cfg(feature = "kernel")]
    let slice: *const [AtomicU64] = core::intrinsics::aggregate_raw_ptr(base, words);
    #[cfg(not(feature = "kernel"))]
    let slice = core::ptr::slice_from_raw_parts(base, words);
    // SAFETY: `base` and `words` describe `words` valid, aligned,
    // initialised `AtomicU64`s that live for the rest of the program (the
    // caller's promise); shared references to atomics may alias.
    unsafe { &*slice }
}
