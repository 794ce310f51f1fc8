//! Demo part 3: a use-after-free the tag-based sanitizer catches, reported and recovered from.
//!
//! `allocate_object`, `free_object` and `read_object` are the allocation, free and access sites
//! xtask looks for in the report's stacks (`Allocated by`, `Freed by`, the faulting stack).

use crate::mm::kasan::{self as sanitizer, heap, recording};
use core::hint::black_box;

/// Not inlined: the report's stacks must name it (xtask's demo check), whatever the caller.
#[inline(never)]
pub fn show() {
    if !sanitizer::CHECKS_COMPILED_IN && !sanitizer::HARDWARE_TAGS {
        defmt::info!(
            "demo: skipped: variant {=str} has no sanitizer checks (kernel-hwaddress is in variant full, MTE in mte)",
            crate::build_info::VARIANT
        );
        return;
    }
    let object = allocate_object();
    free_object(object);
    let (reports, report) = recording::scope(|| {
        black_box(read_object(object));
    });
    match report {
        Some(report) => defmt::info!(
            "demo: kasan: {=u64} report, {=str} at {=u64:#x} (pointer tag {=u8:#x}, memory tag {=u8:#x}); recovered",
            reports,
            report.bug.name(),
            report.address,
            report.pointer_tag,
            report.memory_tag
        ),
        None => defmt::error!("demo: kasan: the use-after-free was not reported"),
    }
}

#[inline(never)]
fn allocate_object() -> u64 {
    let object = heap::allocate(48, 16).expect("the heap has room for 48 bytes");
    // SAFETY: a fresh 48-byte allocation, 16-aligned: the store is inside it.
    unsafe { (object as *mut u64).write_volatile(0x7472_6163_656c_6162) };
    object
}

#[inline(never)]
fn free_object(object: u64) {
    heap::free(object);
    // Not a tail call: the free stack keeps this frame.
    black_box(object);
}

#[inline(never)]
fn read_object(object: u64) -> u64 {
    // SAFETY: deliberately reads freed heap memory (still mapped RAM): the sanitizer's check
    // before the load reports the tag mismatch and, in this recording scope, returns.
    unsafe { (object as *const u64).read_volatile() }
}
