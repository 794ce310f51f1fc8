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

/// Replaces the 64-bit literal at kernel text address `address` (a callsite's ops pointer) with
/// one single-copy-atomic store, ordered after every earlier store: a CPU that loads it sees the
/// old or the new value, never half of each, and whatever was published before it.
///
/// # Safety
/// `address` must be an 8-aligned address in kernel text that holds data, not instructions
/// that may execute.
pub unsafe fn write_literal(address: u64, value: u64) {
    let alias = address - VA_OFFSET + TEXT_ALIAS_OFFSET;
    // SAFETY: the caller guarantees an aligned literal in kernel text; its alias is mapped
    // writable. Data reads through the executable mapping see the store (PIPT data caches).
    unsafe {
        core::arch::asm!(
            "dmb ish",
            "str {value}, [{alias}]",
            alias = in(reg) alias,
            value = in(reg) value,
            options(nostack, preserves_flags),
        );
    }
}
