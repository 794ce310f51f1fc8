//! CPU identification and the system registers aarch64-cpu does not name (ARM ARM D23).

use aarch64_cpu::registers::{ID_AA64ISAR1_EL1, MIDR_EL1, Readable};

/// Which pointer-authentication algorithm the CPU implements for the instruction keys.
#[derive(Clone, Copy, PartialEq, Eq, Debug, defmt::Format)]
pub enum PointerAuth {
    Qarma5,
    Qarma3,
    ImplementationDefined,
    None,
}

impl PointerAuth {
    /// Reads ID_AA64ISAR1_EL1.{APA, API} and ID_AA64ISAR2_EL1.APA3.
    pub fn detect() -> Self {
        let isar1 = ID_AA64ISAR1_EL1.get();
        let apa = (isar1 >> 4) & 0xf;
        let api = (isar1 >> 8) & 0xf;
        let apa3 = (id_aa64isar2_el1() >> 12) & 0xf;
        if apa != 0 {
            Self::Qarma5
        } else if apa3 != 0 {
            Self::Qarma3
        } else if api != 0 {
            Self::ImplementationDefined
        } else {
            Self::None
        }
    }

    /// The name printed on the banner's `PAuth:` line and given on the kernel command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::Qarma5 => "QARMA5",
            Self::Qarma3 => "QARMA3",
            Self::ImplementationDefined => "IMPDEF",
            Self::None => "none",
        }
    }
}

/// ID_AA64ISAR2_EL1 (reads as zero on CPUs older than ARMv8.7, such as the Cortex-A72).
pub fn id_aa64isar2_el1() -> u64 {
    let value;
    // SAFETY: reading an ID register has no side effects; it is RAZ where not implemented.
    unsafe { core::arch::asm!("mrs {}, S3_0_C0_C6_2", out(reg) value, options(nomem, nostack)) };
    value
}

/// ID_AA64PFR1_EL1.MTE: 0 none, 1 instructions only, 2 or more full MTE.
pub fn mte_level() -> u64 {
    let value: u64;
    // SAFETY: reading an ID register has no side effects.
    unsafe { core::arch::asm!("mrs {}, id_aa64pfr1_el1", out(reg) value, options(nomem, nostack)) };
    (value >> 8) & 0xf
}

pub fn midr() -> u64 {
    MIDR_EL1.get()
}

/// This CPU's MPIDR_EL1 (its affinity: what PSCI and the device tree name it by).
pub fn mpidr() -> u64 {
    let value: u64;
    // SAFETY: reads an ID register; no memory is touched.
    unsafe { core::arch::asm!("mrs {}, mpidr_el1", out(reg) value, options(nomem, nostack, preserves_flags)) };
    value
}

/// The core's name from MIDR_EL1 (implementer and part number).
pub fn core_name() -> &'static str {
    let midr = midr();
    match ((midr >> 24) & 0xff, (midr >> 4) & 0xfff) {
        (0x41, 0xd03) => "Cortex-A53",
        (0x41, 0xd07) => "Cortex-A57",
        (0x41, 0xd08) => "Cortex-A72",
        (0x41, 0xd0b) => "Cortex-A76",
        (0x00, _) => "QEMU max",
        _ => "unknown core",
    }
}

/// Removes the PAC from a code pointer with XPACLRI, which is a hint-space NOP without PAuth.
#[inline(always)]
pub fn strip_pac(pointer: u64) -> u64 {
    let mut lr = pointer;
    // SAFETY: XPACLRI only rewrites x30, which is declared as an in/out operand.
    unsafe { core::arch::asm!("xpaclri", inout("x30") lr, options(nomem, nostack, preserves_flags)) };
    lr
}

/// The current shadow call stack pointer (the next free slot).
#[inline(always)]
pub fn shadow_call_stack_pointer() -> u64 {
    let value;
    // SAFETY: reads x18 into another register; no memory access.
    unsafe { core::arch::asm!("mov {}, x18", out(reg) value, options(nomem, nostack, preserves_flags)) };
    value
}

/// Masks IRQs and FIQs, returning the previous DAIF to hand to `restore_interrupts`.
#[inline(always)]
pub fn mask_interrupts() -> u64 {
    let daif;
    // SAFETY: reads and sets DAIF; the compiler may not move memory accesses across it, so no
    // `nomem` (critical sections rely on this ordering).
    unsafe { core::arch::asm!("mrs {}, daif", "msr daifset, #3", out(reg) daif, options(nostack)) };
    daif
}

/// Whether IRQs are masked on this CPU (PSTATE.I).
#[inline(always)]
pub fn interrupts_masked() -> bool {
    let daif: u64;
    // SAFETY: reads DAIF; no memory is touched.
    unsafe { core::arch::asm!("mrs {}, daif", out(reg) daif, options(nomem, nostack, preserves_flags)) };
    daif & (1 << 7) != 0
}

#[inline(always)]
pub fn restore_interrupts(daif: u64) {
    // SAFETY: restores a DAIF value read by `mask_interrupts`.
    unsafe { core::arch::asm!("msr daif, {}", in(reg) daif, options(nostack)) };
}

#[inline(always)]
pub fn enable_interrupts() {
    // SAFETY: unmasks IRQs; handlers are installed before the caller does this.
    unsafe { core::arch::asm!("msr daifclr, #3", options(nostack)) };
}

pub fn wait_for_interrupt() {
    // SAFETY: WFI only waits; interrupts wake it.
    unsafe { core::arch::asm!("wfi", options(nomem, nostack, preserves_flags)) };
}

/// Waits for an event (`sev` from another CPU, an interrupt, the event stream). May return at
/// once (a pending event): callers re-check what they wait for.
#[inline(always)]
pub fn wait_for_event() {
    // SAFETY: WFE only waits; no memory is touched.
    unsafe { core::arch::asm!("wfe", options(nomem, nostack, preserves_flags)) };
}

/// Signals an event to every CPU (ends their `wfe`), after this CPU's earlier stores are visible.
#[inline(always)]
pub fn send_event() {
    // SAFETY: a barrier and an event; memory is only ordered, not accessed.
    unsafe { core::arch::asm!("dsb ish", "sev", options(nostack, preserves_flags)) };
}

/// Turns on this CPU's timer event stream (CNTKCTL_EL1.EVNTEN, an event every 1024 counter ticks)
/// so that a `wfe` whose wake-up may never be signalled (a CPU that does not come up or release)
/// still returns to check its deadline. Returns what to give `event_stream_restore`.
#[inline(always)]
pub fn event_stream_on() -> u64 {
    let saved: u64;
    // SAFETY: reads CNTKCTL_EL1; no memory is touched.
    unsafe { core::arch::asm!("mrs {}, cntkctl_el1", out(reg) saved, options(nomem, nostack, preserves_flags)) };
    let stream = (saved & !(0xf << 4)) | (1 << 2) | (10 << 4);
    // SAFETY: the event-stream bits only wake this CPU's `wfe`; the EL0 access bits are kept.
    unsafe { core::arch::asm!("msr cntkctl_el1, {}", "isb", in(reg) stream, options(nomem, nostack, preserves_flags)) };
    saved
}

/// How much longer than asked every cross-CPU wait is (`wait_until`): 1 under icount, where
/// counter time is instruction time and every CPU runs in turn; `WALL_PATIENCE` otherwise, where
/// it is wall time and a loaded host (4 vCPUs on 2 cores) can leave a vCPU unscheduled for
/// longer than a timeout meant for the other CPU's work.
static PATIENCE: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(WALL_PATIENCE);

/// The factor without icount (QEMU without `-icount`, or a board).
pub const WALL_PATIENCE: u64 = 20;

/// Sets the factor at boot: 1 when QEMU runs with `-icount` (the command line says so).
pub fn set_patience(instruction_exact: bool) {
    PATIENCE.store(if instruction_exact { 1 } else { WALL_PATIENCE }, core::sync::atomic::Ordering::Relaxed);
}

/// What a wait of `timeout_ms` really waits, in milliseconds of counter time (for messages).
#[inline(always)]
pub fn patience_ms(timeout_ms: u64) -> u64 {
    timeout_ms * PATIENCE.load(core::sync::atomic::Ordering::Relaxed)
}

/// Waits with `wfe` until `done` holds or `timeout_ms` (times the patience factor) of counter
/// time pass; the event stream bounds each `wfe` (the CPU expected to `sev` may never do so).
/// Returns whether `done` held.
#[inline(always)]
pub fn wait_until(timeout_ms: u64, done: impl Fn() -> bool) -> bool {
    wait_exactly(patience_ms(timeout_ms), done)
}

/// `wait_until` without the patience factor: for a wait whose length is a period of its own (a
/// resend interval), not a bound on another CPU's answer.
#[inline(always)]
pub fn wait_exactly(timeout_ms: u64, done: impl Fn() -> bool) -> bool {
    let frequency: u64;
    // SAFETY: reads the counter frequency; no memory is touched.
    unsafe { core::arch::asm!("mrs {}, cntfrq_el0", out(reg) frequency, options(nomem, nostack, preserves_flags)) };
    let start = super::counters::virtual_count();
    let patience = frequency * timeout_ms / 1000;
    let saved = event_stream_on();
    let result = loop {
        if done() {
            break true;
        }
        if super::counters::virtual_count().wrapping_sub(start) > patience {
            break false;
        }
        // SAFETY: waits for an event; no memory is touched.
        unsafe { core::arch::asm!("wfe", options(nomem, nostack, preserves_flags)) };
    };
    event_stream_restore(saved);
    result
}

/// Restores CNTKCTL_EL1 as `event_stream_on` found it.
#[inline(always)]
pub fn event_stream_restore(saved: u64) {
    // SAFETY: writes back this CPU's own earlier value.
    unsafe { core::arch::asm!("msr cntkctl_el1, {}", "isb", in(reg) saved, options(nomem, nostack, preserves_flags)) };
}
