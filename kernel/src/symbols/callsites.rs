//! The kernel's instrumented functions, from `__patchable_function_entries` (kernel.ld keeps
//! it): each entry is the address of the two NOPs before a function, so the function starts 8
//! bytes later. Sorted once at boot for lookups by address (stack-trace tests, probes, ftrace).

use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

unsafe extern "C" {
    static __patchable_function_entries_start: u64;
    static __patchable_function_entries_end: u64;
}

const CAPACITY: usize = 4096;
/// Sorted function starts: written once by `init`, then only read. Atomics rather than a
/// `static mut`: relaxed loads are plain loads, and COUNT's release/acquire orders them.
static STARTS: [AtomicU64; CAPACITY] = [const { AtomicU64::new(0) }; CAPACITY];
static COUNT: AtomicUsize = AtomicUsize::new(0);

/// The section's entries as a slice (empty in the `plain` variant).
pub fn entries() -> &'static [u64] {
    // SAFETY: the linker script brackets the section with these symbols; its contents are u64
    // addresses, read-only.
    unsafe {
        let start = &__patchable_function_entries_start as *const u64;
        let end = &__patchable_function_entries_end as *const u64;
        core::slice::from_raw_parts(start, end.offset_from(start) as usize)
    }
}

/// Sorts the function starts. Called once at boot.
pub fn init() {
    let entries = entries();
    assert!(entries.len() <= CAPACITY, "{} patchable entries, room for {}", entries.len(), CAPACITY);
    assert_eq!(COUNT.load(Ordering::Acquire), 0, "callsites::init runs once");
    // SAFETY: AtomicU64 has u64's layout and its value sits in an UnsafeCell, so writing it
    // through a pointer from a shared reference is allowed; this runs once at boot, before
    // COUNT is published, so no reader looks at STARTS yet and nothing else writes it.
    let starts = unsafe { core::slice::from_raw_parts_mut(STARTS.as_ptr().cast::<u64>().cast_mut(), CAPACITY) };
    for (start, entry) in starts.iter_mut().zip(entries) {
        *start = entry + 8;
    }
    starts[..entries.len()].sort_unstable();
    COUNT.store(entries.len(), Ordering::Release);
}

/// The start of the instrumented function holding `pc`, and the start of the next one (an
/// upper bound of its end).
pub fn function_containing(pc: u64) -> Option<(u64, u64)> {
    let count = COUNT.load(Ordering::Acquire);
    let starts = &STARTS[..count];
    let index = starts.partition_point(|start| start.load(Ordering::Relaxed) <= pc).checked_sub(1)?;
    let next = starts.get(index + 1).map_or(u64::MAX, |start| start.load(Ordering::Relaxed));
    Some((starts[index].load(Ordering::Relaxed), next))
}
