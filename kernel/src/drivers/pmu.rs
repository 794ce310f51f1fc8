//! PMU event counters 0 (and 1) as a sampling clock: overflow every N events raises PMUIRQ
//! (ARM ARM D12 "The Performance Monitors Extension": PMEVCNTR<n>, PMEVTYPER<n>, PMINTENSET,
//! PMOVSCLR; the overflow interrupt is a PPI the device tree's "arm,armv8-pmuv3" node names).
//!
//! Event counter 0, not the cycle counter: the benchmarks reset PMCCNTR_EL0 (counters.rs) while
//! a profiled workload runs, which would silently stop a cycle-counter clock. Under QEMU's
//! `-icount shift=0` both INST_RETIRED and CPU_CYCLES advance exactly one per instruction, so
//! an overflow lands on the same instruction every run. aarch64-cpu has no PMU registers, hence
//! the named `mrs`/`msr` below, one register each.

use core::sync::atomic::{AtomicU64, Ordering};

/// Architectural event numbers (ARM ARM D12.11, "Common event numbers").
#[derive(Clone, Copy, PartialEq, Eq, Debug, defmt::Format)]
pub enum Event {
    /// 0x08: instructions architecturally executed. QEMU implements it only under `-icount`.
    InstructionsRetired,
    /// 0x11: processor cycles (QEMU: its virtual clock, one per instruction under icount).
    CpuCycles,
}

impl Event {
    const fn number(self) -> u64 {
        match self {
            Self::InstructionsRetired => 0x08,
            Self::CpuCycles => 0x11,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            Self::InstructionsRetired => "inst_retired",
            Self::CpuCycles => "cpu_cycles",
        }
    }

    /// Whether this CPU counts the event (PMCEID0_EL0 has one bit per common event 0..31).
    pub fn implemented(self) -> bool {
        read_common_event_ids() >> self.number() & 1 == 1
    }
}

/// PMCR_EL0.E: every enabled counter counts.
const PMCR_ENABLE: u64 = 1;
/// Bit 0 of PMCNTENSET/PMINTENSET/PMOVSCLR: event counter 0, the sampling counter.
const COUNTER_0: u64 = 1;
/// Event counter 1 counts the same event one period plus one, without an interrupt. QEMU 10
/// arms its overflow timer for `-(count + 1)` events of an event counter, one short of the
/// overflow: under `-icount shift=0` the timer then fires with one event to go, sees no
/// overflow and arms nothing more, so counter 0 alone would interrupt only at the next
/// exception. Counter 1's timer fires exactly when counter 0 overflows. On hardware it is an
/// idle counter whose overflow flag `rearm` clears.
const COUNTER_1: u64 = 2;
/// PMEVTYPER<n>_EL0.NSH: count at EL2 too (a kernel entered at EL2 keeps counting there).
const EVTYPER_COUNT_EL2: u64 = 1 << 27;
/// Event counters are 32 bits wide here (PMCR_EL0.LP is left clear): an overflow after
/// `period` events means starting at 2^32 - period.
const COUNTER_SPAN: u64 = 1 << 32;

/// The armed period, for re-arming from the interrupt.
static PERIOD: AtomicU64 = AtomicU64::new(0);

/// Why the counter cannot be used as a clock.
#[derive(Clone, Copy, PartialEq, Eq, Debug, defmt::Format)]
pub enum PmuError {
    /// PMCR_EL0.N is below 2: not the two event counters the clock uses.
    NoEventCounter,
    /// PMCEID0_EL0 does not list the event.
    EventNotImplemented,
    /// A period of 0 or one the 32-bit counter cannot hold.
    BadPeriod,
}

/// Starts event counter 0 on `event`, with an overflow interrupt every `period` events.
pub fn start(event: Event, period: u64) -> Result<(), PmuError> {
    if (read_control() >> 11) & 0x1f < 2 {
        return Err(PmuError::NoEventCounter);
    }
    if !event.implemented() {
        return Err(PmuError::EventNotImplemented);
    }
    if period == 0 || period >= COUNTER_SPAN {
        return Err(PmuError::BadPeriod);
    }
    PERIOD.store(period, Ordering::Relaxed);
    // SAFETY: writes PMU registers of counter 0 only (type, value, overflow flag, interrupt
    // and count enables) and sets PMCR_EL0.E without resetting any counter; EL1 owns the PMU
    // (boot.S cleared MDCR_EL2.TPM/TPMCR when entered at EL2). No memory, no stack.
    unsafe {
        core::arch::asm!(
            "msr pmevtyper0_el0, {evtype}",
            "msr pmevtyper1_el0, {evtype}",
            "msr pmevcntr0_el0, {start}",
            "msr pmevcntr1_el0, {helper_start}",
            "msr pmovsclr_el0, {both}",
            "msr pmintenset_el1, {counter}",
            "msr pmcntenset_el0, {both}",
            "mrs {pmcr}, pmcr_el0",
            "orr {pmcr}, {pmcr}, {enable}",
            "msr pmcr_el0, {pmcr}",
            "isb",
            evtype = in(reg) event.number() | EVTYPER_COUNT_EL2,
            start = in(reg) COUNTER_SPAN - period,
            helper_start = in(reg) COUNTER_SPAN - period - 1,
            counter = in(reg) COUNTER_0,
            both = in(reg) COUNTER_0 | COUNTER_1,
            enable = in(reg) PMCR_ENABLE,
            pmcr = out(reg) _,
            options(nomem, nostack, preserves_flags),
        )
    };
    Ok(())
}

/// Stops counters 0 and 1 and counter 0's interrupt (the cycle counter and PMCR are left as they are).
pub fn stop() {
    // SAFETY: clears counters 0 and 1's count enables and overflow flags and counter 0's
    // interrupt enable only.
    unsafe {
        core::arch::asm!(
            "msr pmcntenclr_el0, {both}",
            "msr pmintenclr_el1, {counter}",
            "msr pmovsclr_el0, {both}",
            "isb",
            counter = in(reg) COUNTER_0,
            both = in(reg) COUNTER_0 | COUNTER_1,
            options(nomem, nostack, preserves_flags),
        )
    };
}

/// Events counted since counter 0 last overflowed (read in the overflow interrupt: the
/// interrupt's latency plus what ran of the handler so far).
#[inline(always)]
pub fn since_overflow() -> u64 {
    let value: u64;
    // SAFETY: reads counter 0; the barrier only orders instruction execution.
    unsafe {
        core::arch::asm!("isb", "mrs {}, pmevcntr0_el0", out(reg) value, options(nomem, nostack, preserves_flags))
    };
    value & (COUNTER_SPAN - 1)
}

/// Whether counter 0 overflowed (PMOVSSET_EL0 bit 0): the interrupt is this counter's.
pub fn overflowed() -> bool {
    let flags: u64;
    // SAFETY: reads the overflow flags.
    unsafe { core::arch::asm!("mrs {}, pmovsset_el0", out(reg) flags, options(nomem, nostack, preserves_flags)) };
    flags & COUNTER_0 != 0
}

/// Starts the next period and clears the overflow flag, which drops the level-sensitive
/// PMUIRQ before the GIC sees the end of the interrupt. The next sample comes `period` events
/// after this point, so the handler's own work before it is not part of the period.
#[inline(always)]
pub fn rearm() {
    let period = PERIOD.load(Ordering::Relaxed);
    // SAFETY: writes counters 0 and 1's values and overflow flags only.
    unsafe {
        core::arch::asm!(
            "msr pmevcntr0_el0, {start}",
            "msr pmevcntr1_el0, {helper_start}",
            "msr pmovsclr_el0, {both}",
            "isb",
            start = in(reg) COUNTER_SPAN - period,
            helper_start = in(reg) COUNTER_SPAN - period - 1,
            both = in(reg) COUNTER_0 | COUNTER_1,
            options(nomem, nostack, preserves_flags),
        )
    };
}

fn read_control() -> u64 {
    let value: u64;
    // SAFETY: reads PMCR_EL0.
    unsafe { core::arch::asm!("mrs {}, pmcr_el0", out(reg) value, options(nomem, nostack, preserves_flags)) };
    value
}

fn read_common_event_ids() -> u64 {
    let value: u64;
    // SAFETY: reads PMCEID0_EL0.
    unsafe { core::arch::asm!("mrs {}, pmceid0_el0", out(reg) value, options(nomem, nostack, preserves_flags)) };
    value
}
