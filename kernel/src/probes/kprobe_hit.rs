//! The probe hit path: BRK #0x004, the step back (BRK #0x006 or a software-step exception) and
//! the detour entry. Follows ARM ARM D2.12 (software step) and Linux's kprobes re-entrancy rule.
//!
//! Everything here is in `.text.noprobe` (refused as a probe address). Re-entry, per CPU (Linux's
//! `kprobe_reenter`): a hit while a probe's handler or simulation runs on this CPU (the handler,
//! or something it calls, is probed) skips the handlers, still performs the instruction (by its
//! own method) and counts a missed hit; a hit while a slot is stepped or while a re-entered hit
//! is performed is a panic naming the probes. The simulator calls no probeable code: its callees
//! are no-probe text (the kernel test `probe_simulator_calls_only_noprobe_text` checks every
//! branch of its instantiations), since a probe there would re-enter on every simulated hit.

use core::sync::atomic::Ordering;

use super::Registers;
use super::action::Action;
use super::frame::{FrameRegisters, registers};
use super::kprobe::{Probe, lookup, retiring};
use super::kprobe_slots::{self as slots, detour_entry_address};
use crate::arch::exception::{BRK_KPROBE, ExceptionFrame};
use crate::arch::percpu::{ProbeControl, this_cpu};
use crate::arch::step::{self, MDSCR_KDE, MDSCR_SS, SPSR_BTYPE, SPSR_D, SPSR_DAIF, SPSR_F, SPSR_I, SPSR_SS};
use crate::inject;
use probes::{Fault, Memory, Simulated, SimulationConfig, simulate};

/// What this CPU's probe hit path is doing (`ProbeControl::status`), as Linux's `kprobe_status`.
/// Idle: no probe is being handled.
const IDLE: u32 = 0;
/// `current`'s handlers or simulation run: a hit now is re-entered (missed).
const ACTIVE: u32 = 1;
/// `current`'s slot is being stepped: a hit now cannot be recovered from.
const STEPPING: u32 = 2;
/// `current` is a re-entered probe being performed (no handlers) on behalf of `previous`, which
/// is ACTIVE: a hit now is a re-entry while re-entered, which cannot be recovered from.
const REENTERED: u32 = 3;
/// The same while the re-entered probe's slot is being stepped.
const REENTERED_STEPPING: u32 = 4;

/// This CPU's probe state (one `mrs` away).
#[inline(always)]
fn control() -> &'static ProbeControl {
    &this_cpu().probe
}

/// The probe record a `ProbeControl` pointer names.
///
/// # Safety
/// `pointer` was stored by this file from a published probe that is still being handled on this
/// CPU (a probe cannot be unregistered while its hit is in progress on this CPU).
#[inline(always)]
unsafe fn probe_at(pointer: *mut ()) -> &'static Probe {
    // SAFETY: the caller's contract.
    unsafe { &*pointer.cast::<Probe>() }
}

fn as_pointer(probe: &Probe) -> *mut () {
    probe as *const Probe as *mut ()
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
        return brk_unpublished(frame);
    };
    hit(frame, probe)
}

/// A hit of `probe`, fresh or re-entered.
#[unsafe(link_section = ".text.noprobe")]
#[inline(always)]
fn hit(frame: &mut ExceptionFrame, probe: &Probe) -> bool {
    let cpu = control();
    // The one re-entry check on the hot path: a per-CPU load and a branch.
    if cpu.status.load(Ordering::Relaxed) != IDLE {
        return reenter(frame, probe, cpu);
    }
    handle(frame, probe, cpu)
}

/// A BRK whose probe is not published: the probe being unregistered, whose word is not
/// restored yet: its instruction is performed without its handlers, a missed hit (its record
/// and slot live until after the grace period); else `brk_removed`.
#[unsafe(link_section = ".text.noprobe")]
#[cold]
#[inline(never)]
fn brk_unpublished(frame: &mut ExceptionFrame) -> bool {
    if let Some(probe) = retiring(frame.elr) {
        let cpu = control();
        return match cpu.status.load(Ordering::Relaxed) {
            IDLE => perform_missed(frame, probe, cpu, core::ptr::null_mut()),
            _ => reenter(frame, probe, cpu),
        };
    }
    brk_removed(frame.elr)
}

/// A BRK whose probe is gone and whose word no longer holds it: the instruction is back, so the
/// CPU resumes at it (true). False for a `BRK #0x004` nobody registered. (Unregistration holds
/// the other CPUs while it restores the word, so no CPU should come here; kept as Linux's
/// kprobes keep it.)
#[unsafe(link_section = ".text.noprobe")]
#[cold]
fn brk_removed(address: u64) -> bool {
    // SAFETY: the BRK was fetched from `address`: mapped, readable kernel text.
    unsafe { core::ptr::read_volatile(address as *const u32) != probes::encode_brk(BRK_KPROBE).0 }
}

/// A hit on an idle CPU: the handlers run around the instruction.
#[unsafe(link_section = ".text.noprobe")]
#[inline(always)]
fn handle(frame: &mut ExceptionFrame, probe: &Probe, cpu: &ProbeControl) -> bool {
    cpu.current.store(as_pointer(probe), Ordering::Relaxed);
    cpu.status.store(ACTIVE, Ordering::Relaxed);
    probe.hits.fetch_add(1, Ordering::Relaxed);
    (probe.pre)(registers(frame));
    match probe.action {
        Action::Simulate(ref simulated) => {
            let registers = registers(frame);
            if !simulate_hit(simulated, registers) {
                // KernelMemory never returns a fault; only the SP alignment check can fail.
                return false;
            }
            if let Some(post) = probe.post {
                post(registers);
            }
        }
        Action::SimulateFramePush => {
            if !push_frame(frame) {
                return false;
            }
            if let Some(post) = probe.post {
                post(registers(frame));
            }
        }
        Action::OutOfLine { slot, hardware_step } => {
            // Read once: the compiler reloaded it after the per-CPU stores (+1 per stepped hit).
            let spsr = frame.spsr;
            cpu.step_spsr.store(spsr, Ordering::Relaxed);
            cpu.status.store(STEPPING, Ordering::Relaxed);
            enter_slot(frame, spsr, slot, hardware_step);
            return true;
        }
        Action::Detour { .. } => return false,
        Action::CpuSlot(never) => match never {},
    }
    cpu.status.store(IDLE, Ordering::Relaxed);
    true
}

/// A hit while this CPU is already handling a probe (Linux's `kprobe_reenter`): from inside a
/// handler (it, or something it calls, is probed) the probe's instruction is performed without
/// its handlers and the hit counted as missed; from inside a slot step or a re-entered hit, the
/// state of the first probe would be lost: a panic naming the probes.
#[unsafe(link_section = ".text.noprobe")]
#[inline(never)]
#[cold]
fn reenter(frame: &mut ExceptionFrame, probe: &Probe, cpu: &ProbeControl) -> bool {
    let status = cpu.status.load(Ordering::Relaxed);
    let current = cpu.current.load(Ordering::Relaxed);
    if inject::on(inject::Fault::ReentryUnhandled) {
        // The test-only fallback: handled as a fresh hit, then the interrupted probe's state is
        // put back (its handler is still running). Simulated re-entered probes only: a stepped
        // one would leave this CPU stepping it, which is the state re-entry handling exists to avoid.
        let handled = handle(frame, probe, cpu);
        cpu.current.store(current, Ordering::Relaxed);
        cpu.status.store(status, Ordering::Relaxed);
        return handled;
    }
    if status != ACTIVE {
        unrecoverable(probe, status, current, cpu.previous.load(Ordering::Relaxed));
    }
    perform_missed(frame, probe, cpu, current)
}

/// Performs `probe`'s instruction without its handlers and counts a missed hit, on behalf of
/// `interrupted` (the probe whose handler this CPU runs, status ACTIVE; or null: none, status
/// IDLE), whose state is put back afterwards (here, or when the slot's step ends).
#[unsafe(link_section = ".text.noprobe")]
#[inline(never)]
#[cold]
fn perform_missed(frame: &mut ExceptionFrame, probe: &Probe, cpu: &ProbeControl, interrupted: *mut ()) -> bool {
    let current = interrupted;
    probe.missed.fetch_add(1, Ordering::Relaxed);
    cpu.previous.store(current, Ordering::Relaxed);
    cpu.current.store(as_pointer(probe), Ordering::Relaxed);
    cpu.status.store(REENTERED, Ordering::Relaxed);
    // Test-only (`Fault::ReenteredRunsHandler`): stands in for what the no-probe rules prevent
    // (the performance of a re-entered hit reaching probed code), so that a hit then reaches the
    // "re-entered twice" panic (`sweep.inject=reenter-twice`). Off the hot path.
    if inject::on(inject::Fault::ReenteredRunsHandler) {
        (probe.pre)(registers(frame));
    }
    let performed = match probe.action {
        Action::Simulate(ref simulated) => simulate_hit(simulated, registers(frame)),
        Action::SimulateFramePush => push_frame(frame),
        Action::OutOfLine { slot, hardware_step } => {
            let spsr = frame.spsr;
            cpu.step_spsr.store(spsr, Ordering::Relaxed);
            cpu.status.store(REENTERED_STEPPING, Ordering::Relaxed);
            enter_slot(frame, spsr, slot, hardware_step);
            return true;
        }
        Action::Detour { .. } => false,
        Action::CpuSlot(never) => match never {},
    };
    if performed {
        cpu.current.store(current, Ordering::Relaxed);
        cpu.status.store(status_of(current), Ordering::Relaxed);
    }
    performed
}

/// The status to go back to after a missed hit performed on behalf of `interrupted`.
#[unsafe(link_section = ".text.noprobe")]
#[inline(always)]
fn status_of(interrupted: *mut ()) -> u32 {
    if interrupted.is_null() { IDLE } else { ACTIVE }
}

/// A probe hit while a slot is stepped or while a re-entered probe is performed: the panic
/// names each probe's function (`FUNCTION+0xOFF`, from the symbol table) and address.
#[unsafe(link_section = ".text.noprobe")]
#[inline(never)]
#[cold]
fn unrecoverable(probe: &Probe, status: u32, current: *mut (), previous: *mut ()) -> ! {
    // SAFETY: `current` (and `previous` when re-entered) are the probes this CPU is handling.
    let current = unsafe { probe_at(current) }.address;
    let (hit, current_place) = (Place(probe.address), Place(current));
    match status {
        STEPPING => panic!(
            "kprobe re-entered while stepping: the probe at {hit} was hit while the slot of the probe at {current_place} ran"
        ),
        _ => {
            // SAFETY: as above; a re-entered status always has a previous probe.
            let previous = Place(unsafe { probe_at(previous) }.address);
            panic!(
                "kprobe re-entered twice: the probe at {hit} was hit while the probe at {current_place} was performed as a missed hit inside the handling of the probe at {previous}"
            )
        }
    }
}

/// A kernel text address as a panic names it: `FUNCTION+0xOFF (0xADDRESS)`, or the address alone
/// outside the symbol table's functions.
struct Place(u64);

impl core::fmt::Display for Place {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let name = crate::symbols::callsites::function_containing(self.0)
            .and_then(|(start, _)| Some((crate::symbols::Symbols::get()?.name_at(start)?, self.0 - start)));
        match name {
            Some((name, offset)) => write!(f, "{name}+{offset:#x} ({:#x})", self.0),
            None => write!(f, "{:#x}", self.0),
        }
    }
}

/// `stp x29, x30, [sp, #-16]!` on the frame. False if the original would take an SP alignment
/// fault (SCTLR_EL1.SA; reported, as from the simulator).
#[unsafe(link_section = ".text.noprobe")]
#[inline(always)]
fn push_frame(frame: &mut ExceptionFrame) -> bool {
    if frame.sp & 15 != 0 {
        return false;
    }
    let address = frame.sp - 16;
    let _ = KernelMemory.write_pair(address, [frame.x[29], frame.x[30]]);
    frame.sp = address;
    frame.elr += 4;
    frame.spsr &= !SPSR_BTYPE;
    true
}

/// Returns into `slot` to run the probe's instruction there (`spsr`: the frame's).
#[unsafe(link_section = ".text.noprobe")]
#[inline(always)]
fn enter_slot(frame: &mut ExceptionFrame, spsr: u64, slot: u64, hardware_step: bool) {
    frame.elr = slot;
    if hardware_step {
        // Step exactly the slot's instruction: SS set, debug unmasked, interrupts masked
        // (otherwise the step would land in the IRQ vector).
        frame.spsr = (spsr | SPSR_SS | SPSR_I | SPSR_F) & !SPSR_D;
        set_mdscr(MDSCR_KDE | MDSCR_SS, true);
    } else {
        frame.spsr = spsr | SPSR_DAIF;
    }
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

/// The kernel hit path's simulator functions, by name: a test checks every branch out of them
/// goes to no-probe text.
pub fn simulator_functions() -> [(&'static str, u64); 2] {
    [("simulate_hit", simulate_hit as *const () as u64), ("simulate::<FrameRegisters, KernelMemory>", simulator_text())]
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
    let cpu = control();
    let status = cpu.status.load(Ordering::Relaxed);
    if status != STEPPING && status != REENTERED_STEPPING {
        return false;
    }
    // SAFETY: a stepping status names the published probe whose slot runs (unregistering a probe
    // whose slot is executing cannot happen on this CPU in between).
    let probe = unsafe { probe_at(cpu.current.load(Ordering::Relaxed)) };
    let Action::OutOfLine { slot, hardware_step: stepped } = probe.action else {
        return false;
    };
    if stepped != hardware_step || frame.elr != slot + 4 {
        return false;
    }
    if hardware_step {
        set_mdscr(MDSCR_KDE | MDSCR_SS, false);
    }
    let saved = cpu.step_spsr.load(Ordering::Relaxed);
    let restored = SPSR_DAIF | SPSR_SS;
    frame.spsr = (frame.spsr & !restored) | (saved & restored);
    frame.elr = probe.address + 4;
    if status == REENTERED_STEPPING {
        // Back to the handling the missed hit interrupted (none: a retiring probe's hit).
        let previous = cpu.previous.load(Ordering::Relaxed);
        cpu.current.store(previous, Ordering::Relaxed);
        cpu.status.store(status_of(previous), Ordering::Relaxed);
        return true;
    }
    if let Some(post) = probe.post {
        cpu.status.store(ACTIVE, Ordering::Relaxed);
        post(registers(frame));
    }
    cpu.status.store(IDLE, Ordering::Relaxed);
    true
}

/// Whether a task interrupted at `pc` on this CPU is inside kernel-probe code (a detour
/// trampoline or XOL slot, the detour entry stub) or a kernel probe's handler: the kernel half
/// of [`must_not_preempt`](super::must_not_preempt).
#[unsafe(link_section = ".text.noprobe")]
#[inline(always)]
pub fn must_not_preempt(pc: u64) -> bool {
    pc.wrapping_sub(slots::chunk_address(0)) < slots::AREA_SIZE
        || control().status.load(Ordering::Relaxed) != IDLE
        || pc.wrapping_sub(detour_entry_address()) < DETOUR_ENTRY_BYTES
}

// Where detour trampolines call (`blr`, x0 = the probe, x1 = the saved registers): this CPU's
// status is set ACTIVE (and `current` the probe) before any Rust code runs, and IDLE again only
// after it returned, so a CPU interrupted anywhere between the trampoline's `blr` and its return
// there is either in this stub (whose text `must_not_preempt` covers) or has a non-IDLE status:
// it is never switched away, and no grace period ends while it will still return into the
// trampoline. (A Rust function's prologue and epilogue run outside any status it sets, and
// may call the kernel-hwaddress check thunks or out-of-line atomics there.) With the status
// already not IDLE (a re-entered hit), `detour_reentered` runs instead. The stub's return
// address waits in x20, which `detour_hit` preserves and the trampoline restores.
// `probe_detour_refuse`, the same stub around `detour_refused`, is where a trampoline calls when
// the pre-handler changed pc or sp (with the status not IDLE it is called all the same: it
// touches only the probe's count and the saved registers).
core::arch::global_asm!(
    r#"
    .macro detour_stub name, hit, reentered
    .global \name
\name:
    hint #34
    mov x20, x30
    mrs x9, tpidr_el1
    ldr w10, [x9, #{status}]
    cbnz w10, 1f
    str x0, [x9, #{current}]
    mov w10, #{active}
    str w10, [x9, #{status}]
    bl \hit
    mrs x9, tpidr_el1
    str wzr, [x9, #{status}]
    mov x30, x20
    ret
1:  bl \reentered
    mov x30, x20
    ret
    .endm

    .section .text.noprobe.detour_entry, "ax"
    .balign 4
    detour_stub probe_detour_entry, {hit}, {reentered}
    detour_stub probe_detour_refuse, {refused}, {refused}
probe_detour_stubs_end:
    .if probe_detour_stubs_end - probe_detour_entry != {bytes}
    .error "DETOUR_ENTRY_BYTES does not match the detour stubs"
    .endif
    .purgem detour_stub
"#,
    status = const PROBE_CONTROL + core::mem::offset_of!(ProbeControl, status),
    current = const PROBE_CONTROL + core::mem::offset_of!(ProbeControl, current),
    active = const ACTIVE,
    hit = sym detour_hit,
    reentered = sym detour_reentered,
    refused = sym detour_refused,
    bytes = const DETOUR_ENTRY_BYTES,
);

/// Where `ProbeControl` is in `PerCpu` (TPIDR_EL1 points at this CPU's).
const PROBE_CONTROL: usize = core::mem::offset_of!(crate::arch::percpu::PerCpu, probe);
/// The size of `probe_detour_entry` and `probe_detour_refuse` (16 instructions each; the
/// assembler checks it).
const DETOUR_ENTRY_BYTES: u64 = 2 * 16 * 4;
const _: () = assert!(IDLE == 0, "probe_detour_entry stores wzr for IDLE");

/// Called by `probe_detour_entry`, this CPU's status ACTIVE and `current` the probe, with the
/// probe and the registers the trampoline saved (x0..x30, the SP before the trampoline, pc = the
/// probed address, pstate = NZCV only). Changes to x0..x30 and NZCV are restored into the
/// context; a change of sp or pc makes the trampoline call [`detour_refused`].
#[unsafe(link_section = ".text.noprobe")]
extern "C" fn detour_hit(probe: &Probe, registers: &mut Registers) {
    probe.hits.fetch_add(1, Ordering::Relaxed);
    (probe.pre)(registers);
}

/// Called by `probe_detour_refuse` (the same stub as `probe_detour_entry`) when a detour's
/// pre-handler changed `pc` or `sp`. Linux's contract (a pre-handler that sets the PC and
/// returns nonzero skips the instruction) cannot be kept by a detour: after its restore every
/// register holds the context's value, none is left to branch to another PC, and SP is the
/// trampoline's own (`crates/probes`, `relocate.rs`). Rather than ignore the change silently, it
/// is refused: counted ([`refused_changes`](super::kprobe::refused_changes)), logged as an
/// error, and undone, so the instruction runs at the probed address with the original SP, as in
/// a hit whose handler changed neither. A probe that must redirect uses another method.
#[unsafe(link_section = ".text.noprobe")]
#[cold]
extern "C" fn detour_refused(probe: &Probe, registers: &mut Registers) {
    // The trampoline saved the SP before it just above the save area.
    let sp = registers as *const Registers as u64 + core::mem::size_of::<Registers>() as u64;
    let pc = probe.address;
    probe.refused.fetch_add(1, Ordering::Relaxed);
    defmt::error!(
        "kprobe at {=u64:#x}: a detour cannot honour a pre-handler's change of pc ({=u64:#x} -> {=u64:#x}) or sp ({=u64:#x} -> {=u64:#x}): refused, the instruction runs unchanged",
        probe.address,
        pc,
        registers.pc,
        sp,
        registers.sp
    );
    registers.pc = pc;
    registers.sp = sp;
}

/// Called by `probe_detour_entry` when this CPU already handles a probe: the hit is missed (the
/// trampoline still performs the instruction), or, with re-entry handling off (a test-only
/// fault `Fault::ReentryUnhandled`), handled as a fresh one.
#[unsafe(link_section = ".text.noprobe")]
extern "C" fn detour_reentered(probe: &Probe, registers: &mut Registers) {
    if !inject::on(inject::Fault::ReentryUnhandled) {
        probe.missed.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let cpu = control();
    cpu.current.store(as_pointer(probe), Ordering::Relaxed);
    cpu.status.store(ACTIVE, Ordering::Relaxed);
    probe.hits.fetch_add(1, Ordering::Relaxed);
    (probe.pre)(registers);
    cpu.status.store(IDLE, Ordering::Relaxed);
}
