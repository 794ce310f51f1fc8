//! Kernel text patching through the writable text alias, with the cache maintenance that
//! self-modifying code needs (ARM ARM B2.4.4, "Concurrent modification and execution").

use super::mmu::{TEXT_ALIAS_OFFSET, VA_OFFSET};

/// Writes one instruction at kernel text address `pc` and makes it visible to instruction fetch
/// on this CPU.
///
/// # Safety
/// `pc` must be a 4-aligned address of kernel text, and the caller must ensure that no CPU
/// executes the old and new instruction concurrently unless the pair is one the architecture
/// allows to be modified concurrently (B, BL, NOP, BRK...).
pub unsafe fn write_instruction(pc: u64, instruction: u32) {
    let alias = pc - VA_OFFSET + TEXT_ALIAS_OFFSET;
    // SAFETY: the caller guarantees pc is kernel text; its alias is mapped writable.
    unsafe {
        core::ptr::write_volatile(alias as *mut u32, instruction);
        // Clean the new data to the point of unification, then invalidate the instruction cache
        // line by the executable address and resynchronise the fetch stream.
        core::arch::asm!(
            "dc cvau, {alias}",
            "dsb ish",
            "ic ivau, {pc}",
            "dsb ish",
            "isb",
            alias = in(reg) alias,
            pc = in(reg) pc,
            options(nostack, preserves_flags),
        );
    }
}
