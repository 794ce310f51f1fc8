//! Secondary CPU bring-up: PSCI CPU_ON or a spin-table release into `secondary_entry` (boot.S),
//! which turns the MMU on through the early identity map with the boot CPU's tables and APIA
//! key, then `secondary_main` here (per-CPU data, TTBR0 walks off) hands the CPU to the task
//! layer, which marks it online.
//!
//! CPUs are started one at a time: each has its own block in `SECONDARY_BOOT` (its first stack,
//! its slots), and the boot CPU waits (with `wfe`, woken by the CPU's `sev` or the timer's event
//! stream) until the CPU says it is online or a deadline passes. A CPU that arrives after its
//! deadline finds it was given up on and parks: it never shares another CPU's stack (one shared
//! block did, once the next CPU's start overwrote it: two CPUs on one stack, seen on raspi4b
//! without icount on a loaded host) and never comes online behind the banner's back.

use super::mmu::{VA_OFFSET, pa_of};
use super::percpu::CPUS;
use super::stack::Slot;
use crate::board::PsciConduit;
use core::sync::atomic::{AtomicU64, Ordering};

/// What a starting secondary reads with its MMU off (by physical address, so the boot CPU
/// cleans it to the point of coherency first), then by its kernel address: one block per CPU,
/// `1 << BOOT_BLOCK_SHIFT` bytes each (boot.S indexes them by CPU).
#[repr(C, align(128))]
pub struct SecondaryBoot {
    pub ttbr1: AtomicU64,
    /// The boot CPU's TCR_EL1 (TTBR0 walks disabled); boot.S enables them for the identity map.
    pub tcr: AtomicU64,
    /// SCTLR_EL1.EnIA when the kernel signs return addresses, else 0.
    pub sctlr_extra: AtomicU64,
    pub apia_lo: AtomicU64,
    pub apia_hi: AtomicU64,
    /// Top and shadow call stack of the starting CPU's first stack (its idle stack).
    pub stack_top: AtomicU64,
    pub scs_base: AtomicU64,
    /// The starting CPU's IRQ and overflow slots (slot base addresses).
    pub irq_slot: AtomicU64,
    pub overflow_slot: AtomicU64,
    /// What the CPU runs once its arch state is set up (`start_cpu`'s `then`).
    pub then: AtomicU64,
    /// Test-only (`smp.late-cpu`): non-zero holds the CPU before it arrives.
    pub held: AtomicU64,
    /// `RELEASED` until the CPU arrives in `secondary_main` (`ARRIVED`) or the boot CPU gives up
    /// waiting (`GIVEN_UP`): whichever changes it first decides.
    pub claim: AtomicU64,
}

/// log2 of a `SecondaryBoot` block's size (boot.S: `SECONDARY_BOOT + (cpu << BOOT_BLOCK_SHIFT)`).
pub const BOOT_BLOCK_SHIFT: u32 = 7;
const _: () = assert!(core::mem::size_of::<SecondaryBoot>() == 1 << BOOT_BLOCK_SHIFT);

const RELEASED: u64 = 0;
const ARRIVED: u64 = 1;
const GIVEN_UP: u64 = 2;

#[unsafe(no_mangle)]
pub static SECONDARY_BOOT: [SecondaryBoot; CPUS] = [const {
    SecondaryBoot {
        ttbr1: AtomicU64::new(0),
        tcr: AtomicU64::new(0),
        sctlr_extra: AtomicU64::new(0),
        apia_lo: AtomicU64::new(0),
        apia_hi: AtomicU64::new(0),
        stack_top: AtomicU64::new(0),
        scs_base: AtomicU64::new(0),
        irq_slot: AtomicU64::new(0),
        overflow_slot: AtomicU64::new(0),
        then: AtomicU64::new(0),
        held: AtomicU64::new(0),
        claim: AtomicU64::new(RELEASED),
    }
}; CPUS];

/// Bit n: CPU n runs kernel code (the boot CPU's bit is set by `mark_boot_cpu_online`).
static ONLINE: AtomicU64 = AtomicU64::new(0);

/// SCTLR_EL1.EnIA.
const SCTLR_ENIA: u64 = 1 << 31;

unsafe extern "C" {
    fn secondary_entry();
    fn secondary_spin_entry();
}

/// How a secondary CPU is started.
#[derive(Clone, Copy)]
pub enum Release {
    /// PSCI CPU_ON with this MPIDR affinity.
    Psci { conduit: PsciConduit, mpidr: u64 },
    /// The firmware's spin table entry the core polls (physical address).
    SpinTable { entry: u64 },
}

/// Why a CPU did not come up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StartError {
    /// CPU_ON's negative return code (DEN0022 5.1.5).
    Psci(i64),
    /// Released, but it did not arrive before the deadline (`BRING_UP_MS` times the wait
    /// patience); if it arrives later it parks.
    NoResponse,
}

impl StartError {
    pub fn describe(self) -> &'static str {
        match self {
            Self::Psci(-1) => "PSCI NOT_SUPPORTED",
            Self::Psci(-2) => "PSCI INVALID_PARAMETERS",
            Self::Psci(-3) => "PSCI DENIED",
            Self::Psci(-4) => "PSCI ALREADY_ON",
            Self::Psci(-5) => "PSCI ON_PENDING",
            Self::Psci(-6) => "PSCI INTERNAL_FAILURE",
            Self::Psci(-7) => "PSCI NOT_PRESENT",
            Self::Psci(-8) => "PSCI DISABLED",
            Self::Psci(-9) => "PSCI INVALID_ADDRESS",
            Self::Psci(_) => "PSCI error",
            Self::NoResponse => "no response within the bring-up wait",
        }
    }
}

/// The boot CPU counts itself online.
pub fn mark_boot_cpu_online() {
    ONLINE.fetch_or(1, Ordering::Release);
}

/// Bit n set: CPU n is online.
pub fn online_mask() -> u64 {
    ONLINE.load(Ordering::Acquire)
}

/// CPUs online now.
pub fn online_count() -> usize {
    ONLINE.load(Ordering::Acquire).count_ones() as usize
}

/// Whether CPU `cpu` reported online.
pub fn is_online(cpu: usize) -> bool {
    ONLINE.load(Ordering::Acquire) & (1 << cpu) != 0
}

/// Marks the calling secondary online and wakes the boot CPU waiting for it in `start_cpu`.
pub fn mark_this_cpu_online() {
    ONLINE.fetch_or(1 << super::percpu::this_cpu_index(), Ordering::Release);
    // SAFETY: wakes the boot CPU waiting in `wait_online`.
    unsafe { core::arch::asm!("dsb ish", "sev", options(nomem, nostack, preserves_flags)) };
}

/// Starts CPU `cpu` on `idle` (its first stack) with its IRQ and overflow slots, running `then`
/// once its arch state is set up; waits until `then` calls `mark_this_cpu_online`. Runs on the
/// boot CPU, after the kernel's tables are live. `held` (test-only): the CPU waits before it
/// arrives until this CPU has given up on it.
pub fn start_cpu(
    cpu: usize,
    release: Release,
    (idle, irq, overflow): (Slot, Slot, Slot),
    then: fn(usize) -> !,
    held: bool,
) -> Result<(), StartError> {
    assert!((1..CPUS).contains(&cpu), "cpu {cpu} is not a secondary this kernel has room for");
    let boot = &SECONDARY_BOOT[cpu];
    let (ttbr1, tcr, sctlr, apia_lo, apia_hi): (u64, u64, u64, u64, u64);
    // SAFETY: reads this CPU's translation and control registers; no memory is touched.
    unsafe {
        core::arch::asm!(
            "mrs {ttbr1}, ttbr1_el1",
            "mrs {tcr}, tcr_el1",
            "mrs {sctlr}, sctlr_el1",
            ttbr1 = out(reg) ttbr1, tcr = out(reg) tcr, sctlr = out(reg) sctlr,
            options(nomem, nostack, preserves_flags),
        )
    };
    if sctlr & SCTLR_ENIA != 0 {
        // SAFETY: EnIA is only set when the CPU has PAuth (boot.S), so the key registers exist.
        unsafe {
            core::arch::asm!(
                "mrs {lo}, S3_0_C2_C1_0",
                "mrs {hi}, S3_0_C2_C1_1",
                lo = out(reg) apia_lo, hi = out(reg) apia_hi,
                options(nomem, nostack, preserves_flags),
            )
        };
    } else {
        (apia_lo, apia_hi) = (0, 0);
    }
    boot.ttbr1.store(ttbr1, Ordering::Relaxed);
    // TTBR0 walks off whatever the boot CPU has now (user::init turns them on, per CPU, once
    // TTBR0 holds a table).
    boot.tcr.store(tcr | super::mmu::TCR_EPD0, Ordering::Relaxed);
    boot.sctlr_extra.store(sctlr & SCTLR_ENIA, Ordering::Relaxed);
    boot.apia_lo.store(apia_lo, Ordering::Relaxed);
    boot.apia_hi.store(apia_hi, Ordering::Relaxed);
    boot.stack_top.store(idle.stack_top(), Ordering::Relaxed);
    boot.scs_base.store(idle.shadow_stack_base(), Ordering::Relaxed);
    boot.irq_slot.store(irq.0, Ordering::Relaxed);
    boot.overflow_slot.store(overflow.0, Ordering::Relaxed);
    boot.then.store(then as usize as u64, Ordering::Relaxed);
    boot.claim.store(RELEASED, Ordering::Relaxed);
    boot.held.store(u64::from(held), Ordering::Relaxed);
    let block = boot as *const SecondaryBoot as u64;
    // SAFETY: cleans the block's two cache lines to PoC so that the CPU reading it with its MMU
    // and caches off sees these values; `dsb sy` completes the cleans before the release.
    unsafe {
        core::arch::asm!(
            "dc cvac, {a}",
            "dc cvac, {b}",
            "dsb sy",
            a = in(reg) block, b = in(reg) block + 64,
            options(nostack, preserves_flags),
        )
    };
    match release {
        Release::Psci { conduit, mpidr } => {
            let entry = pa_of(secondary_entry as *const () as u64);
            let status = conduit.cpu_on(mpidr, entry, cpu as u64);
            if status != 0 {
                return Err(StartError::Psci(status));
            }
        }
        Release::SpinTable { entry } => {
            let target = pa_of(secondary_spin_entry as *const () as u64);
            let address = entry + VA_OFFSET;
            // SAFETY: the spin table entry lies in firmware-reserved RAM the kernel maps; only the
            // waiting core reads it, with caches off: clean the line to PoC before `sev`.
            unsafe {
                core::ptr::write_volatile(address as *mut u64, target);
                core::arch::asm!("dc cvac, {}", "dsb sy", "sev", in(reg) address, options(nostack, preserves_flags));
            }
        }
    }
    loop {
        match wait_online(cpu) {
            Ok(()) => return Ok(()),
            // Not there in time: give up on it, unless it arrived in `secondary_main` just now
            // (then it is coming online: wait again).
            Err(error) => {
                if boot.claim.compare_exchange(RELEASED, GIVEN_UP, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                    boot.held.store(0, Ordering::Release);
                    super::cpu::send_event();
                    return Err(error);
                }
            }
        }
    }
}

/// How long the boot CPU waits for a released CPU to come online, in milliseconds of counter
/// time before the wait patience (x20 without icount: a loaded host may not run a new vCPU's
/// thread for a while).
const BRING_UP_MS: u64 = 100;

/// Waits for CPU `cpu`'s online bit with `wfe`, the timer's event stream bounding each wait (a
/// CPU that never comes up sends no `sev`), for at most `BRING_UP_MS` (times the patience).
fn wait_online(cpu: usize) -> Result<(), StartError> {
    let (frequency, start): (u64, u64);
    // SAFETY: reads the counter and its frequency; no memory is touched.
    unsafe {
        core::arch::asm!(
            "mrs {freq}, cntfrq_el0",
            "mrs {now}, cntvct_el0",
            freq = out(reg) frequency, now = out(reg) start,
            options(nomem, nostack, preserves_flags),
        )
    };
    let saved = super::cpu::event_stream_on();
    let deadline = start + frequency * super::cpu::patience_ms(BRING_UP_MS) / 1000;
    let result = loop {
        if ONLINE.load(Ordering::Acquire) & (1 << cpu) != 0 {
            break Ok(());
        }
        let now: u64;
        // SAFETY: waits for an event (the CPU's `sev` or the event stream), then reads the counter.
        unsafe {
            core::arch::asm!("wfe", "mrs {}, cntvct_el0", out(reg) now, options(nomem, nostack, preserves_flags))
        };
        if now > deadline {
            break Err(StartError::NoResponse);
        }
    };
    super::cpu::event_stream_restore(saved);
    result
}

/// The secondary's first Rust code (boot.S `secondary_high`), on its idle stack with the MMU
/// on: TTBR0 walks off as on the boot CPU, its per-CPU data, then what `start_cpu` was given
/// (the task layer's idle loop), which marks the CPU online.
#[unsafe(no_mangle)]
extern "C" fn secondary_main(cpu: u64) -> ! {
    let boot = &SECONDARY_BOOT[cpu as usize];
    while boot.held.load(Ordering::Acquire) != 0 {
        super::cpu::wait_for_event();
    }
    // Arrived too late: the boot CPU gave up on this CPU and reported it. It stays out (its own
    // stack and slots are its own, so nothing it did so far touched another CPU's).
    if boot.claim.compare_exchange(RELEASED, ARRIVED, Ordering::AcqRel, Ordering::Acquire).is_err() {
        loop {
            super::cpu::wait_for_event();
        }
    }
    // SAFETY: the identity map is no longer used (this code runs in the upper half): back to the
    // boot CPU's TCR (TTBR0 walks off, left for EL0 address spaces), as `KernelSpace::activate`.
    unsafe {
        core::arch::asm!(
            "msr tcr_el1, {tcr}",
            "msr ttbr0_el1, xzr",
            "isb",
            "tlbi vmalle1",
            "dsb nsh",
            "isb",
            tcr = in(reg) boot.tcr.load(Ordering::Relaxed),
            options(nostack),
        )
    };
    let irq = Slot(boot.irq_slot.load(Ordering::Relaxed));
    let overflow = Slot(boot.overflow_slot.load(Ordering::Relaxed));
    super::percpu::init_this_cpu(cpu as usize, irq, overflow);
    // Tag checks are per CPU (SCTLR_EL1.ATA/TCF, GCR, RGSR, TFSR): this CPU's own, as the boot
    // CPU's (build variant `mte`; nothing otherwise).
    super::mte::init_this_cpu();
    let then = boot.then.load(Ordering::Relaxed);
    // SAFETY: `start_cpu` stored a `fn(usize) -> !` there before releasing this CPU.
    let then: fn(usize) -> ! = unsafe { core::mem::transmute(then as usize) };
    then(cpu as usize)
}
