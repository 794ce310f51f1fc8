//! The probe hit path: BRK #0x004, the step back (BRK #0x006 or a software-step exception) and
//! the detour entry. Follows ARM ARM D2.12 (software step) and Linux's kprobes re-entrancy rule.
//!
//! Everything here is in `.text.noprobe` (refused as a probe address). Re-entrancy: a hit while
//! a handler runs on this CPU (the handler, or something it calls, is probed) skips the handlers,
//! still performs the instruction and counts a missed hit, as Linux does. The library code the
//! hit path calls (`core`, the `probes` crate's `simulate`) cannot be placed in `.text.noprobe`;
//! a probe there would recurse, which the nesting check turns into a report instead of a stack
//! overflow.

use core::sync::atomic::Ordering;

use super::Registers;
use super::frame::{FrameRegisters, registers};
use super::kprobe::{Action, Probe, lookup};
use crate::arch::exception::ExceptionFrame;
use crate::arch::step::{self, MDSCR_KDE, MDSCR_SS, SPSR_BTYPE, SPSR_D, SPSR_DAIF, SPSR_F, SPSR_I, SPSR_SS};
use probes::{Fault, Memory, Simulated, SimulationConfig, simulate};

/// This CPU's hit state, in its per-CPU data (reached through TPIDR_EL1: cheaper than a static
/// under the large code model). `nesting`: 0 no handler running; 1 a handler is running (a hit
/// now is missed); 2 a missed hit is being performed (a hit now means the hit path itself was
/// probed: refused, reported); only ever changed by code that restores it before returning, so
/// nested exceptions see a consistent value without read-modify-write. `stepping`,
/// `step_spsr`, `step_nesting`: the probe whose slot is executing, the SPSR it was hit with, and
/// the nesting to restore. Per CPU: hits on several CPUs at once are independent.
#[inline(always)]
fn cpu() -> &'static crate::arch::percpu::ProbeHitState {
    &crate::arch::percpu::this_cpu().probe_hit
}

/// What the simulator needs to know about EL1: SCTLR_EL1.SA is set (arch/aarch64/mod.rs), and
/// TCR_EL1.TBI0/TBI1 apply to instruction addresses (TBID0/1 are clear).
const CONFIG: SimulationConfig =
    SimulationConfig { sp_alignment_check: true, guarded_page: false, instruction_tbi: [true, true] };

/// Kernel memory as the simulated instruction sees it: the same kind of access it makes (one
/// `stp` for a pair store). A faulting access is a fault in the BRK handler, which the kernel
/// reports (it is not re-raised at the probed address).
struct KernelMemory;

impl Memory for KernelMemory {
    #[unsafe(link_section = ".text.noprobe")]
    #[inline(always)]
    fn read_u32(&mut self, address: u64) -> Result<u32, Fault> {
        // SAFETY: the probed instruction makes this access at this address with this privilege.
        Ok(unsafe { core::ptr::read_volatile(address as *const u32) })
    }
    #[unsafe(link_section = ".text.noprobe")]
    #[inline(always)]
    fn read_u64(&mut self, address: u64) -> Result<u64, Fault> {
        // SAFETY: as above.
        Ok(unsafe { core::ptr::read_volatile(address as *const u64) })
    }
    #[unsafe(link_section = ".text.noprobe")]
    #[inline(always)]
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
    #[inline(always)]
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

/// Out of line, so that `on_brk`'s simulate path does not pay for the system-register code.
#[unsafe(link_section = ".text.noprobe")]
#[inline(never)]
fn set_mdscr(bits: u64, on: bool) {
    step::set_mdscr(bits, on);
}

/// BRK #0x004. Returns false if no probe is registered at the PC (the caller reports it).
#[unsafe(link_section = ".text.noprobe")]
pub fn on_brk(frame: &mut ExceptionFrame) -> bool {
    let Some(probe) = lookup(frame.elr) else {
        return false;
    };
    let nesting = cpu().nesting.load(Ordering::Relaxed);
    if nesting >= 2 {
        return false;
    }
    cpu().nesting.store(nesting + 1, Ordering::Relaxed);
    let missed = nesting == 1;
    if missed {
        probe.missed.fetch_add(1, Ordering::Relaxed);
    } else {
        probe.hits.fetch_add(1, Ordering::Relaxed);
        (probe.pre)(registers(frame));
    }
    match probe.action {
        Action::Simulate(ref simulated) => {
            let registers = registers(frame);
            if !simulate_hit(simulated, registers) {
                // KernelMemory never returns a fault; only the SP alignment check can fail.
                return false;
            }
            if !missed && let Some(post) = probe.post {
                post(registers);
            }
            cpu().nesting.store(nesting, Ordering::Relaxed);
        }
        Action::SimulateFramePush => {
            // SCTLR_EL1.SA: the original would take an SP alignment fault (reported, as from
            // the simulator).
            if frame.sp & 15 != 0 {
                return false;
            }
            let address = frame.sp - 16;
            let _ = KernelMemory.write_pair(address, [frame.x[29], frame.x[30]]);
            frame.sp = address;
            frame.elr += 4;
            frame.spsr &= !SPSR_BTYPE;
            if !missed && let Some(post) = probe.post {
                post(registers(frame));
            }
            cpu().nesting.store(nesting, Ordering::Relaxed);
        }
        Action::OutOfLine { slot, hardware_step } => {
            if !cpu().stepping.load(Ordering::Relaxed).is_null() {
                // Only a handler can hit a probe here, and handlers never run mid-step.
                return false;
            }
            cpu().stepping.store(probe as *const Probe as *mut (), Ordering::Relaxed);
            cpu().step_spsr.store(frame.spsr, Ordering::Relaxed);
            cpu().step_nesting.store(nesting, Ordering::Relaxed);
            frame.elr = slot;
            if hardware_step {
                // Step exactly the slot's instruction: SS set, debug unmasked, interrupts masked
                // (otherwise the step would land in the IRQ vector).
                frame.spsr = (frame.spsr | SPSR_SS | SPSR_I | SPSR_F) & !SPSR_D;
                set_mdscr(MDSCR_KDE | MDSCR_SS, true);
            } else {
                frame.spsr |= SPSR_DAIF;
            }
        }
        Action::Detour { .. } => return false,
    }
    true
}

/// The simulator's instantiation for kernel probes, out of line: inlined into `on_brk` it makes
/// every hit (stepped ones too) save and restore more callee-saved registers.
#[unsafe(link_section = ".text.noprobe")]
#[inline(never)]
fn simulate_hit(simulated: &Simulated, registers: &mut Registers) -> bool {
    simulate(simulated, &mut FrameRegisters(registers), &mut KernelMemory, &CONFIG).is_ok()
}

/// Where the simulator this hit path runs starts (a test checks it is no-probe text).
pub fn simulator_text() -> u64 {
    simulate::<FrameRegisters<'static>, KernelMemory> as *const () as u64
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
    let probe = cpu().stepping.load(Ordering::Relaxed) as *const Probe;
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
    let saved = cpu().step_spsr.load(Ordering::Relaxed);
    let restored = SPSR_DAIF | SPSR_SS;
    frame.spsr = (frame.spsr & !restored) | (saved & restored);
    frame.elr = probe.address + 4;
    cpu().stepping.store(core::ptr::null_mut(), Ordering::Relaxed);
    let nesting = cpu().step_nesting.load(Ordering::Relaxed);
    if nesting == 0
        && let Some(post) = probe.post
    {
        post(registers(frame));
    }
    cpu().nesting.store(nesting, Ordering::Relaxed);
    true
}

/// Called by a detour trampoline with the probe and the registers it saved (x0..x30, the SP
/// before the trampoline, pc = the probed address, pstate = NZCV only). Changes to x0..x30 and
/// NZCV are restored into the context; changes to sp and pc are ignored.
#[unsafe(link_section = ".text.noprobe")]
pub extern "C" fn detour_entry(probe: &Probe, registers: &mut Registers) {
    if cpu().nesting.load(Ordering::Relaxed) != 0 {
        probe.missed.fetch_add(1, Ordering::Relaxed);
        return;
    }
    cpu().nesting.store(1, Ordering::Relaxed);
    probe.hits.fetch_add(1, Ordering::Relaxed);
    (probe.pre)(registers);
    cpu().nesting.store(0, Ordering::Relaxed);
}
