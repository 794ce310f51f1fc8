//! The Memory Tagging Extension: this CPU's tag-check setup and the tag instructions (ARM ARM
//! D10 "The Memory Tagging Extension"; registers in D23).
//!
//! A pointer's logical tag is bits [59:56]; every 16-byte granule of Tagged Normal memory has a
//! 4-bit allocation tag. With SCTLR_EL1.TCF set, a load or store whose logical tag differs from
//! the allocation tag is a tag check fault: a data abort (sync), a bit in TFSR_EL1 (async), or
//! one of them by direction (asymm: reads sync, writes async). TCR_EL1.TCMA1 makes accesses
//! through pointers with bits [59:55] all ones unchecked: the kernel's untagged pointers (top
//! byte 0xFF) then match everything, as Linux's HW_TAGS arranges.
//!
//! Only build variant `mte` enables any of this ([`init_this_cpu`] does nothing elsewhere).
//! EL2 gives EL1 tag access with HCR_EL2.ATA (boot.S) when the CPU has MTE.

use core::sync::atomic::{AtomicU8, AtomicU32, Ordering};

/// Whether this kernel was built to use MTE (build variant `mte`).
pub const ENABLED_IN_BUILD: bool = cfg!(feature = "mte");

/// SCTLR_EL1.ATA: EL1 may access allocation tags (IRG, STG, LDG tag values).
const SCTLR_ATA: u64 = 1 << 43;
/// SCTLR_EL1.TCF, bits [41:40]: what a tag check fault at EL1 does.
const SCTLR_TCF_SHIFT: u64 = 40;
const SCTLR_TCF_MASK: u64 = 3 << SCTLR_TCF_SHIFT;
/// SCTLR_EL1.ITFSB: exception entry to EL1 synchronizes asynchronous tag check faults into
/// TFSR_EL1, so that a check at entry sees the faults of the code it interrupted.
const SCTLR_ITFSB: u64 = 1 << 37;
/// TCR_EL1.TCMA1: unchecked accesses through TTBR1 pointers whose bits [59:55] are all ones.
const TCR_TCMA1: u64 = 1 << 58;
/// TFSR_EL1.TF1: an asynchronous tag check fault at EL1 through a TTBR1 address.
const TFSR_TF1: u64 = 1 << 1;
/// GCR_EL1.Exclude: the tags IRG never returns. 0xF is the tag of untagged kernel pointers
/// (match-all), 0xE the tag of memory no object owns; IRG draws from the 14 others, as Linux's
/// HW_TAGS does (KASAN_TAG_MIN 0xF0 to 0xFD).
pub const GCR_EXCLUDE: u64 = (1 << 0xf) | (1 << 0xe);
/// PSTATE.TCO in SPSR: tag checks of the context that resumes are suppressed.
pub const SPSR_TCO: u64 = 1 << 25;
/// The Data Fault Status Code of a synchronous tag check fault (ESR_ELx.ISS.DFSC).
pub const DFSC_TAG_CHECK: u64 = 0b01_0001;

/// What a tag check fault does (`kasan.mode=`): SCTLR_EL1.TCF's values.
#[derive(Clone, Copy, PartialEq, Eq, Debug, defmt::Format)]
#[repr(u8)]
pub enum CheckMode {
    /// Checks off (TCF 0): allocation tags are still written and read.
    None = 0,
    /// A data abort at the faulting access.
    Sync = 1,
    /// A sticky TFSR_EL1 bit, seen at the next check point.
    Async = 2,
    /// Reads sync, writes async.
    Asymm = 3,
}

impl CheckMode {
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Sync => "sync",
            Self::Async => "async",
            Self::Asymm => "asymm",
        }
    }

    /// The value of `kasan.mode=`, or None when it is not one of sync, async, asymm.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "sync" => Some(Self::Sync),
            "async" => Some(Self::Async),
            "asymm" => Some(Self::Asymm),
            _ => None,
        }
    }

    fn of(bits: u8) -> Self {
        match bits & 3 {
            0 => Self::None,
            1 => Self::Sync,
            2 => Self::Async,
            _ => Self::Asymm,
        }
    }
}

/// The mode every CPU's [`init_this_cpu`] programs (the command line's, sync by default).
static MODE: AtomicU8 = AtomicU8::new(CheckMode::Sync as u8);
/// The generator seed every CPU's [`init_this_cpu`] derives its RGSR_EL1 seed from.
static SEED: AtomicU32 = AtomicU32::new(0x7472_6163);

/// Whether the CPU has full MTE (ID_AA64PFR1_EL1.MTE >= 2: tag storage and checks, not only
/// the instructions).
pub fn available() -> bool {
    super::cpu::mte_level() >= 2
}

/// Chooses the check mode [`init_this_cpu`] programs (the boot path, before any CPU's init).
pub fn choose_mode(mode: CheckMode) {
    MODE.store(mode as u8, Ordering::Relaxed);
}

/// Switches this CPU to `mode` at once, and every CPU initialised later (tests compare modes).
/// Only after [`init_this_cpu`]: before it, untagged pointers are not yet exempt from checks.
pub fn switch_mode(mode: CheckMode) {
    choose_mode(mode);
    if ENABLED_IN_BUILD {
        write_tcf(mode);
    }
}

/// The mode chosen at boot (or by [`set_mode`]).
pub fn mode() -> CheckMode {
    CheckMode::of(MODE.load(Ordering::Relaxed))
}

/// This CPU's tag-check setup, in the one order that keeps every access valid: untagged
/// pointers unchecked (TCMA1) before checks are on; IRG's exclusions and seed; then
/// SCTLR_EL1.ATA, TCF and ITFSB; stale async faults cleared. Each CPU calls it once before it
/// touches tagged memory (the boot CPU before the heap exists). Does nothing outside build
/// variant `mte`; the caller checked [`available`].
pub fn init_this_cpu() {
    if !ENABLED_IN_BUILD {
        return;
    }
    // SAFETY: TCMA1 only relaxes checks (bits [59:55] all ones: unchecked); GCR_EL1 and
    // RGSR_EL1 only steer IRG; SCTLR_EL1.ATA/TCF/ITFSB enable tag access and checks, which no
    // access made so far can fail: no pointer with another tag than 0xF exists yet on this CPU
    // (the heap hands them out only after this). The ISBs make each write take effect before
    // the next.
    unsafe {
        core::arch::asm!(
            "mrs {t}, tcr_el1",
            "orr {t}, {t}, {tcma1}",
            "msr tcr_el1, {t}",
            "isb",
            "msr S3_0_C1_C0_6, {gcr}",        // GCR_EL1 (RRND = 0: IRG uses RGSR's seed)
            "msr S3_0_C1_C0_5, {rgsr}",       // RGSR_EL1
            "msr S3_0_C5_C6_0, xzr",          // TFSR_EL1
            "mrs {t}, sctlr_el1",
            "orr {t}, {t}, {ata}",
            "msr sctlr_el1, {t}",
            "isb",
            t = out(reg) _,
            tcma1 = in(reg) TCR_TCMA1,
            gcr = in(reg) GCR_EXCLUDE,
            rgsr = in(reg) rgsr_seed(SEED.load(Ordering::Relaxed)),
            ata = in(reg) SCTLR_ATA | SCTLR_ITFSB,
            options(nostack, preserves_flags),
        )
    };
    write_tcf(mode());
}

/// Seeds this CPU's IRG generator (`tag-seed=`): the same seed, the same sequence of tags.
pub fn seed(seed: u32) {
    SEED.store(seed, Ordering::Relaxed);
    if ENABLED_IN_BUILD {
        // SAFETY: RGSR_EL1 only steers IRG.
        unsafe { core::arch::asm!("msr S3_0_C1_C0_5, {}", in(reg) rgsr_seed(seed), options(nomem, nostack)) };
    }
}

/// RGSR_EL1 for `seed`: SEED [23:8] from the seed folded to 16 bits and this CPU's affinity
/// (each CPU draws its own sequence), never zero (a zero seed would make QEMU draw from the
/// host's random source and the run would not be reproducible); TAG [3:0] zero.
fn rgsr_seed(seed: u32) -> u64 {
    let cpu = (super::cpu::mpidr() & 0xff) as u32;
    let folded = ((seed ^ (seed >> 16) ^ cpu.wrapping_mul(0x9e37)) & 0xffff) as u64;
    (if folded == 0 { 1 } else { folded }) << 8
}

fn write_tcf(mode: CheckMode) {
    // SAFETY: changes only what a tag check fault does at EL1 on this CPU.
    unsafe {
        core::arch::asm!(
            "mrs {t}, sctlr_el1",
            "bic {t}, {t}, {mask}",
            "orr {t}, {t}, {tcf}",
            "msr sctlr_el1, {t}",
            "isb",
            t = out(reg) _,
            mask = in(reg) SCTLR_TCF_MASK,
            tcf = in(reg) (mode as u64) << SCTLR_TCF_SHIFT,
            options(nostack, preserves_flags),
        )
    };
}

/// IRG: `address` with a random logical tag that GCR_EL1 does not exclude.
#[inline(always)]
pub fn random_tag(address: u64) -> u64 {
    let tagged: u64;
    // SAFETY: IRG only computes a register value.
    unsafe {
        core::arch::asm!(
            ".arch_extension memtag",
            "irg {d}, {n}",
            d = lateout(reg) tagged,
            n = in(reg) address,
            options(nomem, nostack, preserves_flags)
        )
    };
    tagged
}

/// IRG with extra exclusions: `exclude` (one bit per tag) on top of GCR_EL1's. Always inlined:
/// the sanitizer heap's allocation draws with it.
#[inline(always)]
pub fn random_tag_excluding(address: u64, exclude: u64) -> u64 {
    let tagged: u64;
    // SAFETY: IRG only computes a register value.
    unsafe {
        core::arch::asm!(
            ".arch_extension memtag",
            "irg {d}, {n}, {m}",
            d = lateout(reg) tagged,
            n = in(reg) address,
            m = in(reg) exclude,
            options(nomem, nostack, preserves_flags)
        )
    };
    tagged
}

/// Gives each granule of `[address, address + size)` (granule-aligned, size a multiple of 16)
/// the allocation tag that `tag_source`'s bits [59:56] hold: ST2G per 32 bytes, STG for an
/// odd last granule.
///
/// # Safety
///
/// The range must be Tagged Normal memory that the caller owns: retagging memory someone else
/// uses makes their accesses fault.
#[inline(always)]
pub unsafe fn set_tags(address: u64, size: u64, tag_source: u64) {
    let end = address + size;
    let mut granule = address;
    while granule + 32 <= end {
        // SAFETY: the caller owns the range; ST2G writes only tags.
        unsafe {
            core::arch::asm!(
                ".arch_extension memtag",
                "st2g {t}, [{a}]",
                t = in(reg) tag_source,
                a = in(reg) granule,
                options(nostack, preserves_flags)
            )
        };
        granule += 32;
    }
    if granule < end {
        // SAFETY: as above, for the last granule.
        unsafe {
            core::arch::asm!(
                ".arch_extension memtag",
                "stg {t}, [{a}]",
                t = in(reg) tag_source,
                a = in(reg) granule,
                options(nostack, preserves_flags)
            )
        };
    }
}

/// LDG: the allocation tag (0..=15) of the granule holding `address`.
#[inline(always)]
pub fn allocation_tag(address: u64) -> u8 {
    let mut loaded: u64 = 0;
    // SAFETY: LDG reads only the tag of a mapped granule (callers pass mapped addresses); an
    // LDG of Untagged memory reads 0.
    unsafe {
        core::arch::asm!(
            ".arch_extension memtag",
            "ldg {t}, [{a}]",
            t = inout(reg) loaded,
            a = in(reg) address,
            options(readonly, nostack, preserves_flags)
        )
    };
    ((loaded >> 56) & 0xf) as u8
}

/// Reads and clears this CPU's asynchronous EL1 tag check fault flag (TFSR_EL1.TF1). Exception
/// entry synchronizes pending faults (ITFSB); elsewhere a DSB first makes earlier stores'
/// faults visible.
#[inline(always)]
pub fn take_async_fault() -> bool {
    let tfsr: u64;
    // SAFETY: reads a status register (DSB: earlier stores complete first).
    unsafe { core::arch::asm!("dsb nsh", "isb", "mrs {}, S3_0_C5_C6_0", out(reg) tfsr, options(nostack)) };
    if tfsr & TFSR_TF1 == 0 {
        return false;
    }
    // SAFETY: clears the sticky flag just read.
    unsafe { core::arch::asm!("msr S3_0_C5_C6_0, xzr", "isb", options(nomem, nostack)) };
    true
}

/// Clears PSTATE.TCO: tag checks apply again to this context after a report let it go on with
/// checks suppressed (the trap set TCO in the context's SPSR).
#[inline(always)]
pub fn resume_checks() {
    // SAFETY: TCO only suppresses or allows tag checks (MSR TCO, Xt).
    unsafe { core::arch::asm!("msr S3_3_C4_C2_7, xzr", options(nomem, nostack, preserves_flags)) };
}

/// Whether PSTATE.TCO is set (tag checks suppressed in this context).
pub fn checks_suppressed() -> bool {
    let tco: u64;
    // SAFETY: reads PSTATE.TCO.
    unsafe { core::arch::asm!("mrs {}, S3_3_C4_C2_7", out(reg) tco, options(nomem, nostack, preserves_flags)) };
    tco & SPSR_TCO != 0
}
