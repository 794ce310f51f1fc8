//! Kernel text patching through the writable text alias, with the cache maintenance that
//! self-modifying code needs (ARM ARM B2.4.4, "Concurrent modification and execution").

use super::mmu::{TEXT_ALIAS_OFFSET, VA_OFFSET};
use core::sync::atomic::{AtomicUsize, Ordering};

/// Test-only: a function called after every single store of an instruction, a literal or a word
/// of user XOL code (`write_code_alias`), with the stored (kernel) address, once the store is
/// visible to instruction fetch (the race tests step the
/// patcher with it). 0: none (normal runs: one load and a branch per store).
static STEP_HOOK: AtomicUsize = AtomicUsize::new(0);

/// Installs (`Some`) or removes the step hook. The hook runs on the patching CPU, inside the
/// patcher's locks: it must not patch text itself.
pub fn set_step_hook(hook: Option<fn(u64)>) {
    STEP_HOOK.store(hook.map_or(0, |hook| hook as usize), Ordering::Release);
}

/// Whether the step hook is installed (a test steps the patcher: CPUs held while a word changes
/// serve its cross calls, `task::cpus::with_others_held`).
#[inline(always)]
pub fn is_stepped() -> bool {
    STEP_HOOK.load(Ordering::Relaxed) != 0
}

#[inline(always)]
fn step_point(address: u64) {
    let hook = STEP_HOOK.load(Ordering::Acquire);
    if hook != 0 {
        // SAFETY: a non-zero hook was stored by `set_step_hook` from a `fn(u64)`.
        let hook = unsafe { core::mem::transmute::<usize, fn(u64)>(hook) };
        hook(address);
    }
}

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
    step_point(pc);
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
    step_point(address);
}

/// Writes consecutive instructions from kernel text address `pc` (a probe slot or trampoline),
/// each made visible to instruction fetch as [`write_instruction`] does.
///
/// # Safety
/// As [`write_instruction`], for every word: in practice, no CPU may execute the words while
/// they are written.
pub unsafe fn write_instructions(pc: u64, instructions: &[u32]) {
    for (index, &instruction) in instructions.iter().enumerate() {
        // SAFETY: the caller's guarantee, word by word.
        unsafe { write_instruction(pc + 4 * index as u64, instruction) };
    }
}

/// Writes at most 16 bytes of code at `at` in a kernel-writable page that is executed at another
/// virtual address (a user XOL page, mapped at EL0's `USER_XOL`), and makes them visible to
/// instruction fetch there: clean to the point of unification by the kernel VA, then invalidate
/// the whole instruction cache of every CPU in the Inner Shareable domain (`ic ialluis`: the
/// executing VA is another address space's, and the task may run on, or move to, another CPU,
/// whose cache may hold the slot's old words at that VA; `ic iallu` is this CPU's only).
///
/// # Safety
/// `at` must be 4-aligned kernel data in such a page, `16 - at % 16 >= 4 * code.len()`, and no
/// CPU may execute the words while they are written.
pub unsafe fn write_code_alias(at: *mut u32, code: &[u32]) {
    debug_assert!(code.len() <= 4);
    if STEP_HOOK.load(Ordering::Relaxed) != 0 {
        // Test-only (the race tests): one word at a time, each made visible, then a step point.
        for (index, &word) in code.iter().enumerate() {
            // SAFETY: the caller's guarantee, for one word of its 16 bytes.
            unsafe { write_code_alias_words(at.add(index), &[word]) };
            step_point(at as u64 + 4 * index as u64);
        }
        return;
    }
    // SAFETY: the caller's guarantee.
    unsafe { write_code_alias_words(at, code) };
}

/// [`write_code_alias`] without step points.
///
/// # Safety
/// As [`write_code_alias`].
#[inline(always)]
unsafe fn write_code_alias_words(at: *mut u32, code: &[u32]) {
    for (index, &word) in code.iter().enumerate() {
        // SAFETY: within the caller's 16 bytes of kernel data.
        unsafe { at.add(index).write_volatile(word) };
    }
    // SAFETY: cache maintenance by VA of mapped kernel data (both ends of the 16 bytes), then an
    // instruction-cache invalidation to the point of unification: no memory is changed. Reads
    // `at`, clobbers one scratch register.
    unsafe {
        core::arch::asm!(
            "dc cvau, {a}",
            "add {b}, {a}, #8",
            "dc cvau, {b}",
            "dsb ish",
            "ic ialluis",
            "dsb ish",
            "isb",
            a = in(reg) at as u64,
            b = out(reg) _,
            options(nostack, preserves_flags)
        )
    };
}
