//! The user probe hit path: the EL0 trap entry of every user probe (BRK, the step back, the
//! detour SVC, the return trampoline's BRK) and the IRQ-exit check for detour trampolines.
//!
//! Everything here runs in the EL0 exception handler with IRQs masked, in `.text.noprobe`. It
//! finds a probe by index or PC among the published records (`uprobe.rs`, lock-free), performs
//! the displaced instruction by the probe's [`Action`] and never allocates or takes a lock. A
//! stepped instruction runs in the probe's XOL slot or this CPU's (`uprobe_xol.rs`); the step
//! in flight is this CPU's `UserStepControl`. A fault inside a slot or trampoline is attributed
//! to the probed address ([`attributed_pc`]).

use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::action::{Action, CpuSlot};
use super::frame::{FrameRegisters, registers};
use super::uprobe::{BRK_UPROBE, NO_STEP, Uprobe, lookup, published, record, retiring};
use super::uprobe_xol::{
    BRK_UPROBE_STEP, DETOUR_AREA_BYTES, DETOUR_OFFSET, MAX_UPROBES, cpu_slot_offset, fill_cpu_slot, release_cpu_slot,
    slot_offset,
};
use super::uretprobe::{self, BRK_URETPROBE};
use crate::arch::exception::{ExceptionClass, ExceptionFrame};
use crate::arch::percpu::{UserStepControl, this_cpu, this_cpu_index};
use crate::arch::step::{MDSCR_SS, SPSR_BTYPE, SPSR_IF, SPSR_SS, set_mdscr};
use crate::inject;
use crate::task::user::{self, USER_XOL, UserFault};
use probes::{Exception, Fault, Memory, SimulationConfig, encode_brk, simulate};

/// The step in flight on this CPU (`percpu::UserStepControl`): the probe index, the SPSR at the
/// hit and whether it is a hardware step. Only the EL0 exception handlers (IRQs masked, from the
/// BRK to the step's return) use it. One pointer load from this CPU's data.
#[inline(always)]
fn step_state() -> &'static UserStepControl {
    // SAFETY: `init_this_cpu` pointed it at this CPU's own state before anything ran on this CPU
    // (or the registry at CPU 0's, under the test-only `Fault::UserStepStateShared`): a static
    // entry of the per-CPU table.
    unsafe { &*this_cpu().user_step.load(Ordering::Relaxed) }
}

/// User memory as the probed EL0 instruction sees it; remembers the ESR of a fault.
struct UserMemory {
    esr: u64,
}

impl Memory for UserMemory {
    #[inline(always)]
    fn read_u32(&mut self, address: u64) -> Result<u32, Fault> {
        match user::load_u32(address) {
            Ok(value) => Ok(value),
            Err(esr) => {
                self.esr = esr;
                Err(Fault { address, access: probes::Access::Read })
            }
        }
    }
    #[inline(always)]
    fn read_u64(&mut self, address: u64) -> Result<u64, Fault> {
        match user::load_u64(address) {
            Ok(value) => Ok(value),
            Err(esr) => {
                self.esr = esr;
                Err(Fault { address, access: probes::Access::Read })
            }
        }
    }
    #[inline(always)]
    fn write_pair(&mut self, address: u64, values: [u64; 2]) -> Result<(), Fault> {
        match user::store_pair(address, values) {
            Ok(()) => Ok(()),
            Err(esr) => {
                self.esr = esr;
                Err(Fault { address, access: probes::Access::Write })
            }
        }
    }
}

/// EL0: SCTLR_EL1.SA0 is clear; TBI0/TBI1 apply to instruction addresses.
const USER_CONFIG: SimulationConfig =
    SimulationConfig { sp_alignment_check: false, guarded_page: false, instruction_tbi: [true, true] };

/// A synchronous exception from EL0 that may be a user probe's (BRK, software step, detour SVC).
/// The only SVC the trap table (`trap::route`) gives uprobes is `SVC #SVC_UPROBE_DETOUR`, so
/// its immediate is not compared again (`on_detour` checks that the SVC is a trampoline's).
#[unsafe(link_section = ".text.noprobe")]
pub fn on_el0_exception(frame: &mut ExceptionFrame, class: ExceptionClass) -> bool {
    let immediate = (frame.esr & 0xffff) as u16;
    match class {
        ExceptionClass::Brk => match immediate {
            BRK_UPROBE => on_brk(frame),
            BRK_UPROBE_STEP => finish_step(frame, false) || finish_cpu_slot_step(frame, false),
            BRK_URETPROBE => on_return(frame),
            _ => false,
        },
        ExceptionClass::SoftwareStepLowerEl => {
            finish_step(frame, true) || finish_cpu_slot_step(frame, true) || foreign_step(frame)
        }
        ExceptionClass::Svc64 => on_detour(frame),
        _ => false,
    }
}

/// A test hook: called with a software-step exception from EL0 that no uprobe step owns (the
/// race tests step an EL0 task); true when it took it. 0: none. Installed and removed by each
/// test that steps, so not one of `sync::Hooks`' fixed, registered-once places.
static FOREIGN_STEP_HOOK: AtomicUsize = AtomicUsize::new(0);

/// Installs (or with `None` removes) the foreign step hook.
pub fn set_foreign_step_hook(hook: Option<fn(&mut ExceptionFrame) -> bool>) {
    FOREIGN_STEP_HOOK.store(hook.map_or(0, |hook| hook as usize), Ordering::Release);
}

#[unsafe(link_section = ".text.noprobe")]
#[cold]
fn foreign_step(frame: &mut ExceptionFrame) -> bool {
    let hook = FOREIGN_STEP_HOOK.load(Ordering::Acquire);
    // SAFETY: a non-zero hook was stored by `set_foreign_step_hook` from such a function.
    hook != 0 && unsafe { core::mem::transmute::<usize, fn(&mut ExceptionFrame) -> bool>(hook) }(frame)
}

/// A BRK taken before its uprobe's unregistration restored the word, looked up after the
/// unpublish: the instruction is back, so the task resumes at it (true). False for a
/// `BRK #BRK_UPROBE` nobody registered (a user fault).
#[unsafe(link_section = ".text.noprobe")]
#[cold]
fn brk_removed(address: u64) -> bool {
    user::kernel_text_address(address).is_some_and(|kernel_address| {
        // SAFETY: user text inside the kernel image, mapped readable.
        unsafe { core::ptr::read_volatile(kernel_address as *const u32) != encode_brk(BRK_UPROBE).0 }
    })
}

#[unsafe(link_section = ".text.noprobe")]
fn on_brk(frame: &mut ExceptionFrame) -> bool {
    // By reference: a copy of the record (or of its `Simulated`) is a memcpy call per hit.
    let Some((index, probe)) = lookup(frame.elr) else {
        return brk_removed(frame.elr);
    };
    probe.hits.fetch_add(1, Ordering::Relaxed);
    (probe.handler)(registers(frame));
    if probe.return_handler.is_some() {
        uretprobe::hijack_return(frame, index);
    }
    match &probe.action {
        Action::Simulate(simulated) => {
            let mut memory = UserMemory { esr: 0 };
            match simulate(simulated, &mut FrameRegisters(registers(frame)), &mut memory, &USER_CONFIG) {
                Ok(()) => {}
                Err(Exception::DataAbort(fault)) => user::kill_with_fault(UserFault {
                    esr: user::lower_el_data_abort(memory.esr),
                    far: fault.address,
                    pc: probe.address,
                }),
                Err(Exception::SpAlignment { .. }) => user::kill_with_fault(UserFault {
                    esr: ((ExceptionClass::SpAlignment as u64) << 26) | (1 << 25),
                    far: 0,
                    pc: probe.address,
                }),
            }
        }
        Action::SimulateFramePush => {
            let address = frame.sp.wrapping_sub(16);
            if let Err(esr) = user::store_pair(address, [frame.x[29], frame.x[30]]) {
                user::kill_with_fault(UserFault {
                    esr: user::lower_el_data_abort(esr),
                    far: address,
                    pc: probe.address,
                });
            }
            frame.sp = address;
            frame.elr += 4;
            frame.spsr &= !SPSR_BTYPE;
        }
        &Action::OutOfLine { slot, hardware_step } => {
            let step = step_state();
            step.index.store(index, Ordering::Relaxed);
            step.spsr.store(frame.spsr, Ordering::Relaxed);
            step.hardware_step.store(hardware_step, Ordering::Relaxed);
            frame.elr = slot;
            // IRQs stay masked for the one instruction, so the step state is per CPU.
            frame.spsr |= SPSR_IF;
            if hardware_step {
                frame.spsr |= SPSR_SS;
                // KDE stays as it is, so EL1 is never stepped.
                set_mdscr(MDSCR_SS, true);
            }
        }
        &Action::CpuSlot(CpuSlot { hardware_step, skip_unchanged }) => {
            frame.elr = fill_cpu_slot(probe.original, skip_unchanged);
            let step = step_state();
            step.index.store(index, Ordering::Relaxed);
            step.spsr.store(frame.spsr, Ordering::Relaxed);
            step.hardware_step.store(hardware_step, Ordering::Relaxed);
            frame.spsr |= SPSR_IF;
            if hardware_step {
                frame.spsr |= SPSR_SS;
                set_mdscr(MDSCR_SS, true);
            }
        }
        Action::Detour { .. } => return false,
    }
    true
}

/// The step back from this CPU's slot (`XolSlots::PerCpu`): as `finish_step`, at that slot.
#[unsafe(link_section = ".text.noprobe")]
#[cold]
fn finish_cpu_slot_step(frame: &mut ExceptionFrame, hardware_step: bool) -> bool {
    let cpu = this_cpu_index();
    let step = step_state();
    let index = step.index.load(Ordering::Relaxed);
    if index == NO_STEP
        || step.hardware_step.load(Ordering::Relaxed) != hardware_step
        || frame.elr != USER_XOL + cpu_slot_offset(cpu) + 4
    {
        return false;
    }
    // The record, published or not, as in `finish_step`: this CPU's step state names `index`
    // (set by its BRK on this CPU, IRQs masked since), so the index's record is initialised and
    // stays as it is until the grace period after its unpublish, which this step holds off.
    // SAFETY: as above.
    let probe = unsafe { record(index) };
    if !matches!(probe.action, Action::CpuSlot(_)) {
        return false;
    }
    return_from_step(frame, step, probe, hardware_step);
    release_cpu_slot(cpu);
    true
}

/// The end of a step: the stepping state off, the interrupt masks and step bit of the hit
/// back, and the task resumed after the probed instruction.
#[unsafe(link_section = ".text.noprobe")]
#[inline(always)]
fn return_from_step(frame: &mut ExceptionFrame, step: &UserStepControl, probe: &Uprobe, hardware_step: bool) {
    if hardware_step {
        set_mdscr(MDSCR_SS, false);
    }
    let restored = SPSR_IF | SPSR_SS;
    frame.spsr = (frame.spsr & !restored) | (step.spsr.load(Ordering::Relaxed) & restored);
    frame.elr = probe.address + 4;
    step.index.store(NO_STEP, Ordering::Relaxed);
}

#[unsafe(link_section = ".text.noprobe")]
fn finish_step(frame: &mut ExceptionFrame, hardware_step: bool) -> bool {
    let step = step_state();
    let index = step.index.load(Ordering::Relaxed);
    if index == NO_STEP
        || step.hardware_step.load(Ordering::Relaxed) != hardware_step
        || frame.elr != USER_XOL + slot_offset(index) + 4
    {
        return false;
    }
    // The record, published or not: a hit that began before an unpublish (a task held after
    // its BRK, in the handler or the slot, while another CPU unregistered) finishes on it; the
    // published-pointer lookup here killed such a task as a user fault (found by the race tests).
    // SAFETY: the PC is `index`'s slot + 4, so its slot + 0 ran: a probe of `index` stepping
    // out of line was registered, so the record is initialised; it is rewritten only by a new
    // registration of the index, after the grace period following its unpublish, and this step
    // (IRQs masked from its BRK to here) keeps this CPU from passing a quiescent point.
    let probe = unsafe { record(index) };
    return_from_step(frame, step, probe, hardware_step);
    true
}

/// The detour trampoline's SVC: the handler runs on the task's frame with `pc` the probed
/// address, as at a BRK. Then, as Linux's uprobes do, the task resumes where the handler left
/// `pc`: unchanged, at the trampoline's displaced instruction (then its branch back); changed,
/// at the new address, the instruction skipped. Every other register the handler changed,
/// `sp` included, is what the task resumes with (the frame is restored at the return).
#[unsafe(link_section = ".text.noprobe")]
fn on_detour(frame: &mut ExceptionFrame) -> bool {
    // The trampoline's address after its SVC: where an unchanged `pc` resumes. Kept from the
    // first load, which also finds the probe's index.
    let resume = frame.elr;
    let offset = resume.wrapping_sub(4).wrapping_sub(USER_XOL + DETOUR_OFFSET);
    let index = (offset / 16) as usize;
    if !offset.is_multiple_of(16) || index >= MAX_UPROBES {
        return false;
    }
    let Some(probe) = published(index) else {
        // Unpublished while the task was in the trampoline before its SVC (killed here before,
        // found by the race tests): the hit had not begun; the trampoline goes on with the
        // displaced instruction and the branch back. (It is intact until the grace period ends:
        // a task inside a trampoline is never switched away there, `in_detour_trampoline`, so
        // its CPU passes no quiescent point before it left.)
        return retiring(index).is_some();
    };
    if this_cpu().need_resched.load(Ordering::Relaxed) {
        reschedule_before_hit(frame, probe);
        return true;
    }
    probe.hits.fetch_add(1, Ordering::Relaxed);
    // Read once: compared after the handler, which the compiler cannot see into.
    let address = probe.address;
    frame.elr = address;
    (probe.handler)(registers(frame));
    if frame.elr == address {
        frame.elr = resume;
    }
    if probe.return_handler.is_some() {
        uretprobe::hijack_return(frame, index);
    }
    true
}

/// A reschedule is pending at a detour SVC (typically an IRQ exit inside a trampoline deferred it,
/// `in_detour_trampoline`): the hit has not begun and the trampoline has run nothing but the
/// SVC, so the task goes back to the probed address, outside the trampoline, and is switched
/// away there; when it resumes it runs that word again (the B: the hit then; or the restored
/// instruction). Without this a task calling a detour-probed function in a loop is hardly ever
/// preemptible: an IRQ that arrives while its SVC exception runs (IRQs masked, most of each
/// call's time) is taken right after the `eret`, at trampoline + 4, where it may not switch.
/// Measured on virt (icount or not): every tick during a 4-tick loop of hits deferred; the
/// tasks waiting for that CPU, and the grace period of a kprobe or tracer waiting for it to
/// pass a quiescent point, would wait for as long as the loop runs.
#[unsafe(link_section = ".text.noprobe")]
#[cold]
#[inline(never)]
fn reschedule_before_hit(frame: &mut ExceptionFrame, probe: &Uprobe) {
    RESCHEDULED_BEFORE_HIT.fetch_add(1, Ordering::Relaxed);
    frame.elr = probe.address;
    // The reschedule an IRQ exit would have made (a quiescent point, maybe a switch).
    crate::task::irq_exit();
}

static RESCHEDULED_BEFORE_HIT: AtomicU64 = AtomicU64::new(0);

/// Detour SVCs that found a reschedule pending and made it at the probed address, before the
/// hit (`reschedule_before_hit`), since boot.
pub fn rescheduled_before_hit() -> u64 {
    RESCHEDULED_BEFORE_HIT.load(Ordering::Relaxed)
}

/// The user PC a fault at `elr` is reported at: a fault in a step slot or detour trampoline
/// belongs to the probed instruction (and ends the step).
#[unsafe(link_section = ".text.noprobe")]
pub fn attributed_pc(elr: u64) -> u64 {
    let step = step_state();
    let index = step.index.load(Ordering::Relaxed);
    let cpu_slot = USER_XOL + cpu_slot_offset(this_cpu_index());
    if index != NO_STEP && (elr == USER_XOL + slot_offset(index) || elr == cpu_slot) {
        if step.hardware_step.load(Ordering::Relaxed) {
            set_mdscr(MDSCR_SS, false);
        }
        step.index.store(NO_STEP, Ordering::Relaxed);
        if elr == cpu_slot {
            release_cpu_slot(this_cpu_index());
        }
        if let Some(probe) = published(index) {
            return probe.address;
        }
    }
    let offset = elr.wrapping_sub(USER_XOL + DETOUR_OFFSET);
    let index = (offset / 16) as usize;
    if offset % 16 == 4
        && index < MAX_UPROBES
        && let Some(probe) = published(index)
        && matches!(probe.action, Action::Detour { .. })
    {
        return probe.address;
    }
    elr
}

/// `BRK #0x121` from the return trampoline: the task resumes at the real return address and
/// the probe's return handler runs (unless the probe was unregistered meanwhile).
#[unsafe(link_section = ".text.noprobe")]
fn on_return(frame: &mut ExceptionFrame) -> bool {
    let Some(index) = uretprobe::pop_return(frame) else {
        return false;
    };
    if let Some(probe) = published(index)
        && let Some(handler) = probe.return_handler
    {
        handler(registers(frame));
    }
    true
}

/// IRQ exits that found a user task inside a detour trampoline and so switched no task there
/// (`in_detour_trampoline`), since boot.
static TRAMPOLINE_IRQ_EXITS: AtomicU64 = AtomicU64::new(0);

/// Whether an IRQ taken from EL0 at `pc` interrupted a task inside a detour trampoline (its SVC,
/// displaced instruction or branch back). The trap layer then switches no task at that IRQ's
/// exit (`probes::must_not_preempt`; the reschedule stays pending for the next IRQ exit): a task
/// switch is a quiescent point, and `unregister` poisons and reuses a trampoline once its grace
/// period ended. So a task is switched away only outside every trampoline, and a grace period
/// covers tasks in trampolines as it covers CPUs in a hit. Runs at every IRQ exit: one
/// subtraction and compare outside the trampolines. `USER_XOL` is a TTBR0 address: no kernel
/// PC (TTBR1) falls in the range.
#[unsafe(link_section = ".text.noprobe")]
#[inline]
pub fn in_detour_trampoline(pc: u64) -> bool {
    pc.wrapping_sub(USER_XOL + DETOUR_OFFSET) < DETOUR_AREA_BYTES && trampoline_irq_exit()
}

/// An IRQ exit inside a trampoline: counted, and not preempted (unless the test-only
/// `Fault::UprobePreemptibleTrampoline` puts the bug back).
#[unsafe(link_section = ".text.noprobe")]
#[cold]
#[inline(never)]
fn trampoline_irq_exit() -> bool {
    if inject::on(inject::Fault::UprobePreemptibleTrampoline) {
        return false;
    }
    TRAMPOLINE_IRQ_EXITS.fetch_add(1, Ordering::Relaxed);
    true
}

/// IRQ exits that found a user task in a detour trampoline (and left it running), since boot.
pub fn trampoline_irq_exits() -> u64 {
    TRAMPOLINE_IRQ_EXITS.load(Ordering::Relaxed)
}
