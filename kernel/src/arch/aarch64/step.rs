//! Software step for probes' out-of-line slots: MDSCR_EL1 and SPSR bits (ARM ARM D2.12, D2.5).
//!
//! A step is armed by setting SPSR.SS in the frame the exception returns with and MDSCR_EL1.SS
//! (plus KDE to step EL1 code); the CPU then runs one instruction and takes a software-step
//! exception. Every probe kind arms and disarms steps through this file.

/// SPSR_ELx bits a step changes or preserves (D1.4 "Saved Program Status Registers").
pub const SPSR_SS: u64 = 1 << 21;
pub const SPSR_BTYPE: u64 = 3 << 10;
pub const SPSR_D: u64 = 1 << 9;
pub const SPSR_A: u64 = 1 << 8;
pub const SPSR_I: u64 = 1 << 7;
pub const SPSR_F: u64 = 1 << 6;
/// Interrupt masks: a stepped slot runs with these set, so the step lands on the slot's
/// instruction and not in the IRQ vector.
pub const SPSR_IF: u64 = SPSR_I | SPSR_F;
/// Every exception mask.
pub const SPSR_DAIF: u64 = SPSR_D | SPSR_A | SPSR_I | SPSR_F;

/// MDSCR_EL1.KDE: debug exceptions (software step) are enabled at EL1 too.
pub const MDSCR_KDE: u64 = 1 << 13;
/// MDSCR_EL1.SS: software step enabled.
pub const MDSCR_SS: u64 = 1 << 0;

/// Clears the OS lock and OS double lock so that debug exceptions can be taken at EL1 (D2.5).
/// MDSCR_EL1.KDE/SS are set only while a slot is stepped.
pub fn unlock_debug() {
    // SAFETY: writing 0 to OSLAR_EL1 and OSDLR_EL1 unlocks the debug registers; no memory, no
    // general-purpose register besides xzr.
    unsafe {
        core::arch::asm!("msr oslar_el1, xzr", "msr osdlr_el1, xzr", "isb", options(nomem, nostack, preserves_flags))
    };
}

/// Sets (`on`) or clears `bits` (`MDSCR_KDE`, `MDSCR_SS`) of MDSCR_EL1. Called from the probe
/// trap handlers (`.text.noprobe`, which this inlines into) with PSTATE.D set, so no debug
/// exception is taken before the exception return.
#[inline(always)]
pub fn set_mdscr(bits: u64, on: bool) {
    let mut mdscr: u64;
    // SAFETY: read-modify-write of MDSCR_EL1's step bits; reads and writes one general-purpose
    // register, no memory; the isb makes the new value apply to the exception return.
    unsafe {
        core::arch::asm!("mrs {m}, mdscr_el1", m = out(reg) mdscr, options(nomem, nostack, preserves_flags));
        mdscr = if on { mdscr | bits } else { mdscr & !bits };
        core::arch::asm!("msr mdscr_el1, {m}", "isb", m = in(reg) mdscr, options(nomem, nostack, preserves_flags));
    }
}
