//! The probe hit path: BRK #0x004, the step back (BRK #0x006 or a software-step exception) and
//! the detour entry. Follows ARM ARM D2.12 (software step) and Linux's kprobes re-entrancy rule.
//!
//! Everything here is in `.text.noprobe` (refused as a probe address). Re-entrancy: a hit while
//! a handler runs on this CPU (the handler, or something it calls, is probed) skips the handlers,
//! still performs the instruction and counts a missed hit, as Linux does. The library code the
//! hit path calls (`core`, the `probes` crate's `simulate`) cannot be placed in `.text.noprobe`;
//! a probe there would recurse, which the `DEPTH` check turns into a report instead of a stack
//! overflow.

use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};

use super::{Action, Probe, Registers, lookup};
use crate::arch::exception::ExceptionFrame;
use probes::{Fault, Memory, SimulationConfig, simulate};

/// A handler of some probe is running on this CPU (one CPU for now).
static ACTIVE: AtomicBool = AtomicBool::new(false);
/// Nesting of the hit path itself, to catch a probe on code the hit path runs through.
static DEPTH: AtomicU32 = AtomicU32::new(0);
/// The probe whose slot is executing, the SPSR it was hit with, and whether it is a missed hit.
static STEPPING: AtomicPtr<Probe> = AtomicPtr::new(core::ptr::null_mut());
static STEP_SPSR: AtomicU64 = AtomicU64::new(0);
static STEP_MISSED: AtomicBool = AtomicBool::new(false);

const SPSR_SS: u64 = 1 << 21;
const SPSR_D: u64 = 1 << 9;
const SPSR_A: u64 = 1 << 8;
const SPSR_I: u64 = 1 << 7;
const SPSR_F: u64 = 1 << 6;
const MDSCR_KDE: u64 = 1 << 13;
const MDSCR_SS: u64 = 1 << 0;

/// What the simulator needs to know about EL1: SCTLR_EL1.SA is set (arch/aarch64/mod.rs), and
/// TCR_EL1.TBI0/TBI1 apply to instruction addresses (TBID0/1 are clear).
const CONFIG: SimulationConfig =
    SimulationConfig { sp_alignment_check: true, guarded_page: false, instruction_tbi: [true, true] };

const _: () = {
    use core::mem::offset_of;
    assert!(offset_of!(ExceptionFrame, x) == offset_of!(Registers, x));
    assert!(offset_of!(ExceptionFrame, sp) == offset_of!(Registers, sp));
    assert!(offset_of!(ExceptionFrame, elr) == offset_of!(Registers, pc));
    assert!(offset_of!(ExceptionFrame, spsr) == offset_of!(Registers, pstate));
};

/// The frame's first 34 words, as the `probes` crate's register file (same layout, checked
/// above). Changes go straight into what the exception return restores.
#[inline(always)]
fn registers(frame: &mut ExceptionFrame) -> &mut Registers {
    // SAFETY: both are repr(C) with x[31], sp, pc/elr, pstate/spsr at the same offsets, and the
    // frame is larger; the borrow of the frame is handed on.
    unsafe { &mut *(frame as *mut ExceptionFrame).cast::<Registers>() }
}

/// Kernel memory as the simulated instruction sees it: the same kind of access it makes (one
/// `stp` for a pair store). A faulting access is a fault in the BRK handler, which the kernel
/// reports (it is not re-raised at the probed address).
struct KernelMemory;

impl Memory for KernelMemory {
    #[unsafe(link_section = ".text.noprobe")]
    fn read_u32(&mut self, address: u64) -> Result<u32, Fault> {
        // SAFETY: the probed instruction makes this access at this address with this privilege.
        Ok(unsafe { core::ptr::read_volatile(address as *const u32) })
    }
    #[unsafe(link_section = ".text.noprobe")]
    fn read_u64(&mut self, address: u64) -> Result<u64, Fault> {
        // SAFETY: as above.
        Ok(unsafe { core::ptr::read_volatile(address as *const u64) })
    }
    #[unsafe(link_section = ".text.noprobe")]
    fn read_pair(&mut self, address: u64) -> Result<[u64; 2], Fault> {
        let (first, second): (u64, u64);
        // SAFETY: as above; one `ldp`, as the original. Reads memory only, clobbers its outputs.
        unsafe {
            core::arch::asm!("ldp {a}, {b}, [{p}]", p = in(reg) address, a = out(reg) first, b = out(reg) second,
                options(nostack, readonly, preserves_flags))
        };
        Ok([first, second])
    }
    #[unsafe(link_section = ".text.noprobe")]
    fn write_pair(&mut self, address: u64, values: [u64; 2]) -> Result<(), Fault> {
        // SAFETY: as above; one `stp`, so single-copy atomicity, alignment and ordering match
        // the original. Writes 16 bytes at `address`, clobbers nothing.
        unsafe {
            core::arch::asm!("stp {a}, {b}, [{p}]", p = in(reg) address, a = in(reg) values[0], b = in(reg) values[1],
                options(nostack, preserves_flags))
        };
        Ok(())
    }
}

#[unsafe(link_section = ".text.noprobe")]
#[inline(never)]
fn set_mdscr(bits: u64, on: bool) {
    let mut mdscr: u64;
    // SAFETY: read-modify-write of MDSCR_EL1's KDE/SS bits; PSTATE.D is set in the handler, so
    // no debug exception is taken until the exception return. No memory is touched.
    unsafe {
        core::arch::asm!("mrs {m}, mdscr_el1", m = out(reg) mdscr, options(nomem, nostack, preserves_flags));
        mdscr = if on { mdscr | bits } else { mdscr & !bits };
        core::arch::asm!("msr mdscr_el1, {m}", "isb", m = in(reg) mdscr, options(nomem, nostack, preserves_flags));
    }
}

/// Marks entry into the hit path; false (and a report) if it recursed through itself.
#[unsafe(link_section = ".text.noprobe")]
#[inline(always)]
fn enter() -> bool {
    // Depth 1: a hit; 2: a hit from a handler (missed); more: the hit path itself was probed.
    DEPTH.fetch_add(1, Ordering::Relaxed) < 2
}

#[unsafe(link_section = ".text.noprobe")]
#[inline(always)]
fn leave() {
    DEPTH.fetch_sub(1, Ordering::Relaxed);
}

/// BRK #0x004. Returns false if no probe is registered at the PC (the caller reports it).
#[unsafe(link_section = ".text.noprobe")]
pub fn on_brk(frame: &mut ExceptionFrame) -> bool {
    let Some(probe) = lookup(frame.elr) else {
        return false;
    };
    if !enter() {
        return false;
    }
    let missed = ACTIVE.swap(true, Ordering::Acquire);
    if missed {
        probe.missed.fetch_add(1, Ordering::Relaxed);
    } else {
        probe.hits.fetch_add(1, Ordering::Relaxed);
        (probe.pre)(registers(frame));
    }
    match probe.action {
        Action::Simulate(simulated) => {
            let registers = registers(frame);
            if simulate(&simulated, registers, &mut KernelMemory, &CONFIG).is_err() {
                // KernelMemory never returns a fault; only the SP alignment check can fail.
                leave();
                return false;
            }
            if !missed {
                if let Some(post) = probe.post {
                    post(registers);
                }
                ACTIVE.store(false, Ordering::Release);
            }
        }
        Action::OutOfLine { slot, hardware_step } => {
            if !STEPPING.load(Ordering::Relaxed).is_null() {
                // Only a handler can hit a probe here, and handlers never run mid-step.
                leave();
                return false;
            }
            STEPPING.store(probe as *const Probe as *mut Probe, Ordering::Relaxed);
            STEP_SPSR.store(frame.spsr, Ordering::Relaxed);
            STEP_MISSED.store(missed, Ordering::Relaxed);
            frame.elr = slot;
            if hardware_step {
                // Step exactly the slot's instruction: SS set, debug unmasked, interrupts masked
                // (otherwise the step would land in the IRQ vector).
                frame.spsr = (frame.spsr | SPSR_SS | SPSR_I | SPSR_F) & !SPSR_D;
                set_mdscr(MDSCR_KDE | MDSCR_SS, true);
            } else {
                frame.spsr |= SPSR_D | SPSR_A | SPSR_I | SPSR_F;
            }
        }
        Action::Detour { .. } => {
            leave();
            return false;
        }
    }
    leave();
    true
}

/// BRK #0x006 after a slot's instruction (brk-step). False if no slot is being executed there.
#[unsafe(link_section = ".text.noprobe")]
pub fn on_step_brk(frame: &mut ExceptionFrame) -> bool {
    finish_step(frame, false)
}

/// A software-step exception (EC 0x33) after a slot's instruction (single-step).
#[unsafe(link_section = ".text.noprobe")]
pub fn on_software_step(frame: &mut ExceptionFrame) -> bool {
    finish_step(frame, true)
}

#[unsafe(link_section = ".text.noprobe")]
fn finish_step(frame: &mut ExceptionFrame, hardware_step: bool) -> bool {
    let probe = STEPPING.load(Ordering::Relaxed);
    if probe.is_null() {
        return false;
    }
    // SAFETY: STEPPING points at a published probe from BRK until here (unregistering a probe
    // whose slot is executing cannot happen on this CPU in between).
    let probe = unsafe { &*probe };
    let Action::OutOfLine { slot, hardware_step: stepped } = probe.action else {
        return false;
    };
    if stepped != hardware_step || frame.elr != slot + 4 {
        return false;
    }
    if hardware_step {
        set_mdscr(MDSCR_KDE | MDSCR_SS, false);
    }
    let saved = STEP_SPSR.load(Ordering::Relaxed);
    let restored = SPSR_D | SPSR_A | SPSR_I | SPSR_F | SPSR_SS;
    frame.spsr = (frame.spsr & !restored) | (saved & restored);
    frame.elr = probe.address + 4;
    STEPPING.store(core::ptr::null_mut(), Ordering::Relaxed);
    if !STEP_MISSED.load(Ordering::Relaxed) {
        if let Some(post) = probe.post {
            post(registers(frame));
        }
        ACTIVE.store(false, Ordering::Release);
    }
    true
}

/// Called by a detour trampoline with the probe and the registers it saved (x0..x30, the SP
/// before the trampoline, pc = the probed address, pstate = NZCV only). Changes to x0..x30 and
/// NZCV are restored into the context; changes to sp and pc are ignored.
#[unsafe(link_section = ".text.noprobe")]
pub extern "C" fn detour_entry(probe: &Probe, registers: &mut Registers) {
    if ACTIVE.swap(true, Ordering::Acquire) {
        probe.missed.fetch_add(1, Ordering::Relaxed);
        return;
    }
    probe.hits.fetch_add(1, Ordering::Relaxed);
    (probe.pre)(registers);
    ACTIVE.store(false, Ordering::Release);
}
