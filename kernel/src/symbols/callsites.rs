//! The kernel's instrumented functions, from `__patchable_function_entries` (kernel.ld keeps
//! it): each entry is the address of the two NOPs before a function, so the function starts 8
//! bytes later. Sorted once at boot for lookups by address (stack-trace tests, probes, ftrace).

use core::sync::atomic::{AtomicUsize, Ordering};

unsafe extern "C" {
    static __patchable_function_entries_start: u64;
    static __patchable_function_entries_end: u64;
}

const CAPACITY: usize = 4096;
static mut STARTS: [u64; CAPACITY] = [0; CAPACITY];
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
    // SAFETY: runs once at boot before any reader (COUNT is published afterwards).
    let starts = unsafe { &mut *core::ptr::addr_of_mut!(STARTS) };
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
    // SAFETY: STARTS[..count] was written before COUNT was published and never changes.
    let starts = unsafe { &(&*core::ptr::addr_of!(STARTS))[..count] };
    let index = starts.partition_point(|&start| start <= pc).checked_sub(1)?;
    Some((starts[index], starts.get(index + 1).copied().unwrap_or(u64::MAX)))
}
