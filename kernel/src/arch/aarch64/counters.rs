//! The counters benchmarks read: the PMU cycle counter and the generic timer's virtual count
//! (ARM ARM D12 "The Performance Monitors Extension", D11.2 "The Generic Timer").
//!
//! Under QEMU with `-icount shift=0,sleep=off` PMCCNTR_EL0 counts exactly one per retired
//! instruction; without icount it runs on virtual time that tracks the host. On hardware it
//! counts CPU cycles. aarch64-cpu has no PMU registers, hence the named `mrs`/`msr` below.

/// PMCR_EL0: E (enable) and C (reset the cycle counter); LC (64-bit cycle counter overflow).
const PMCR_ENABLE: u64 = 1;
const PMCR_RESET_CYCLES: u64 = 1 << 2;
const PMCR_LONG_CYCLES: u64 = 1 << 6;
/// PMCNTENSET_EL0.C: the cycle counter counts.
const PMCNTEN_CYCLES: u64 = 1 << 31;
/// PMCCFILTR_EL0.NSH: also count at EL2 (EL1 and EL0 are counted by default).
const PMCCFILTR_COUNT_EL2: u64 = 1 << 27;

/// Starts the cycle counter from zero.
pub fn start_cycle_counter() {
    // SAFETY: writes PMU control registers only; EL1 owns the PMU (boot.S cleared
    // MDCR_EL2.TPM/TPMCR when entered at EL2).
    unsafe {
        core::arch::asm!(
            "msr pmccfiltr_el0, {filter}",
            "msr pmcntenset_el0, {enable}",
            "msr pmcr_el0, {pmcr}",
            "isb",
            filter = in(reg) PMCCFILTR_COUNT_EL2,
            enable = in(reg) PMCNTEN_CYCLES,
            pmcr = in(reg) PMCR_ENABLE | PMCR_RESET_CYCLES | PMCR_LONG_CYCLES,
            options(nostack, preserves_flags),
        )
    }
}

/// PMCCNTR_EL0. The `isb` keeps the read from moving relative to the measured code.
#[inline(always)]
pub fn cycles() -> u64 {
    let value;
    // SAFETY: reads a counter; the barrier only orders instruction execution.
    unsafe { core::arch::asm!("isb", "mrs {}, pmccntr_el0", out(reg) value, options(nomem, nostack, preserves_flags)) };
    value
}

/// CNTVCT_EL0, ordered like `cycles`.
#[inline(always)]
pub fn virtual_count() -> u64 {
    let value;
    // SAFETY: reads a counter; the barrier only orders instruction execution.
    unsafe { core::arch::asm!("isb", "mrs {}, cntvct_el0", out(reg) value, options(nomem, nostack, preserves_flags)) };
    value
}
