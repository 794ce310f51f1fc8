//! Trap routing: the one table that says who owns which synchronous exception, the entries the
//! exception vectors call, and the two reports that end a context (unexpected exception, stack
//! overflow).
//!
//! Layering: arch/ saves the interrupted context and calls the `trap_*` entries below by symbol
//! (vectors.S, context.S); this layer calls the owners (kprobes, uprobes, syscalls and user
//! faults in the task layer, the drivers' IRQ dispatch). Nothing under arch/ or drivers/ names
//! an owner. Tests install a hook at run time (`install_test_hook`); production code here never
//! names them.

use crate::arch::cpu;
use crate::arch::exception::{
    self, BRK_BENCH, BRK_KPROBE, BRK_KPROBE_STEP, Esr, ExceptionClass, ExceptionFrame, STACK_GAP, TEST_BRK_FIRST,
    TEST_BRK_LAST,
};
use crate::probes::uprobe::{BRK_UPROBE, BRK_UPROBE_STEP, SVC_UPROBE_DETOUR};
use crate::probes::uretprobe::BRK_URETPROBE;
use crate::sync::IrqSpinLock;
use crate::task::stacks::{self, Slot};
use crate::task::user::{SVC_SYSCALL, UserFault};
use crate::task::{self, KillReason};

/// Where a synchronous exception came from.
#[derive(Clone, Copy, PartialEq, Eq, Debug, defmt::Format)]
pub enum Level {
    /// EL1, on SP_EL1 or SP_EL0 (the probe tests' EL1t harness).
    El1,
    /// An EL0 task.
    El0,
}

/// Who handles a synchronous exception.
#[derive(Clone, Copy, PartialEq, Eq, Debug, defmt::Format)]
pub enum Owner {
    /// `BRK_KPROBE` at EL1: a kprobe hit.
    Kprobe,
    /// `BRK_KPROBE_STEP` at EL1: the end of a kprobe's out-of-line step.
    KprobeStep,
    /// Hardware software step at EL1: the end of a kprobe's single step.
    KprobeSoftwareStep,
    /// `BRK_BENCH`: the `baseline` bench's round trip, resumed after the BRK.
    BenchResume,
    /// The tests' BRK range: the hook the tests installed.
    TestHook,
    /// A synchronous tag check fault at EL1 (build variant `mte`): the sanitizer reports it.
    TagCheckFault,
    /// A data abort at EL1: one of the unprivileged user accessors, if its PC is in their table.
    UserAccessFixup,
    /// `SVC #SVC_SYSCALL` from EL0.
    Syscall,
    /// A uprobe BRK, the uprobes' step BRK or software step, or their detour SVC, from EL0.
    Uprobe,
    /// Any other fault from EL0 (abort, alignment, undefined instruction, PAC failure): the task
    /// is reported and killed.
    UserFault,
    /// Nobody: the unexpected-exception report ends the run.
    Unexpected,
}

/// The trap table. One `match`, inlined into both entries, so a hit costs one decode of the ESR
/// and a compare per level of the table.
#[inline(always)]
pub fn route(esr: Esr, level: Level) -> Owner {
    match (level, esr.ec()) {
        (Level::El1, Esr::EC_BRK) => match esr.immediate() {
            BRK_KPROBE => Owner::Kprobe,
            BRK_BENCH => Owner::BenchResume,
            BRK_KPROBE_STEP => Owner::KprobeStep,
            TEST_BRK_FIRST..=TEST_BRK_LAST => Owner::TestHook,
            _ => Owner::Unexpected,
        },
        (Level::El1, Esr::EC_SOFTWARE_STEP) => Owner::KprobeSoftwareStep,
        (Level::El1, Esr::EC_DATA_ABORT) if HARDWARE_TAGS && is_tag_check_fault(esr.0) => Owner::TagCheckFault,
        (Level::El1, Esr::EC_DATA_ABORT) => Owner::UserAccessFixup,
        (Level::El1, _) => Owner::Unexpected,
        (Level::El0, Esr::EC_SVC64) => match esr.immediate() {
            SVC_SYSCALL => Owner::Syscall,
            SVC_UPROBE_DETOUR => Owner::Uprobe,
            _ => Owner::Unexpected,
        },
        (Level::El0, Esr::EC_BRK) => match esr.immediate() {
            BRK_UPROBE | BRK_UPROBE_STEP | BRK_URETPROBE => Owner::Uprobe,
            _ => Owner::Unexpected,
        },
        (Level::El0, Esr::EC_SOFTWARE_STEP_LOWER_EL) => Owner::Uprobe,
        (Level::El0, _) => Owner::UserFault,
    }
}

/// A synchronous exception at EL1 (vectors.S), IRQs masked.
#[unsafe(no_mangle)]
#[unsafe(link_section = ".text.noprobe")]
extern "C" fn trap_el1_sync(frame: &mut ExceptionFrame) {
    if HARDWARE_TAGS {
        check_async_tag_faults(frame.elr);
    }
    let handled = match route(Esr(frame.esr), Level::El1) {
        Owner::Kprobe => crate::probes::on_brk(frame),
        Owner::BenchResume => {
            frame.elr += 4;
            true
        }
        Owner::KprobeStep => crate::probes::on_step_brk(frame),
        Owner::KprobeSoftwareStep => crate::probes::on_software_step(frame),
        Owner::UserAccessFixup => crate::task::user::fixup_user_access(frame),
        Owner::TagCheckFault => on_tag_check_fault(frame),
        Owner::TestHook | Owner::Syscall | Owner::Uprobe | Owner::UserFault | Owner::Unexpected => false,
    };
    if !handled {
        unexpected(frame);
    }
}

/// A synchronous exception from EL0 (vectors.S), IRQs masked.
#[unsafe(no_mangle)]
#[unsafe(link_section = ".text.noprobe")]
extern "C" fn trap_el0_sync(frame: &mut ExceptionFrame) {
    match route(Esr(frame.esr), Level::El0) {
        Owner::Syscall => crate::task::user::syscall(frame),
        Owner::Uprobe => {
            if !crate::probes::uprobe_hit::on_el0_exception(frame, ExceptionClass::of(frame.esr)) {
                user_fault(frame)
            }
        }
        Owner::UserFault => user_fault(frame),
        Owner::Kprobe
        | Owner::KprobeStep
        | Owner::KprobeSoftwareStep
        | Owner::BenchResume
        | Owner::TestHook
        | Owner::UserAccessFixup
        | Owner::TagCheckFault
        | Owner::Unexpected => unexpected(frame),
    }
}

/// Reports the user task's fault (at the PC the user sees: a fault in a uprobe's step slot or
/// detour belongs to the probed instruction) and kills the task.
#[unsafe(link_section = ".text.noprobe")]
fn user_fault(frame: &ExceptionFrame) -> ! {
    let pc = crate::probes::uprobe_hit::attributed_pc(frame.elr);
    // The task dies here: no step of it may stay armed on this CPU (a step exception nobody owns
    // left MDSCR_EL1.SS set, and the next EL0 return on this CPU would take a step at once). No
    // kernel step is in flight on a CPU that takes an EL0 fault.
    crate::arch::step::set_mdscr(crate::arch::step::MDSCR_SS, false);
    crate::task::user::kill_with_fault(UserFault { esr: frame.esr, far: frame.far, pc })
}

/// What the tests install to see exceptions that production code does not own: it returns true
/// when it handled the exception (the context resumes on the frame as the hook left it).
pub type TestHook = fn(&mut ExceptionFrame) -> bool;

static TEST_HOOK: spin::Once<TestHook> = spin::Once::new();

/// Installs the tests' hook (once, when the tests start): it gets the tests' BRK range and every
/// exception that would otherwise end the run.
pub fn install_test_hook(hook: TestHook) {
    TEST_HOOK.call_once(|| hook);
}

/// An exception nobody owns: the tests' hook may take it, else the report ends the run.
#[cold]
#[inline(never)]
#[unsafe(link_section = ".text.noprobe")]
fn unexpected(frame: &mut ExceptionFrame) {
    if let Some(hook) = TEST_HOOK.get()
        && hook(frame)
    {
        return;
    }
    report_and_exit("unexpected synchronous exception", frame);
}

/// The IRQ, on this CPU's IRQ stack (context.S).
#[unsafe(no_mangle)]
#[unsafe(link_section = ".text.noprobe")]
extern "C" fn trap_irq(frame: &mut ExceptionFrame) {
    if HARDWARE_TAGS {
        check_async_tag_faults(frame.elr);
    }
    crate::drivers::interrupts::handle_irq();
}

/// After the IRQ, back on the interrupted stack with IRQs masked (context.S). No-probe text: it
/// reads this CPU's probe status (`must_not_preempt`, inlined here), and a probe stepped here
/// reads its own hit's status, not IDLE, so no IRQ exit on any CPU reschedules while it is
/// armed and no grace period ends (the whole 4-CPU prod sweep hung on
/// `trap_irq_exit+0x44:single-step`, the status load). `task::irq_exit` stays probeable.
#[unsafe(no_mangle)]
#[unsafe(link_section = ".text.noprobe")]
extern "C" fn trap_irq_exit(frame: *mut ExceptionFrame) {
    // SAFETY: context.S passes the interrupted context's frame, live until it resumes.
    let pc = unsafe { (*frame).elr };
    if HARDWARE_TAGS {
        check_async_tag_faults(pc);
    }
    // No task switch inside probe code (a detour trampoline or its entry stub, an XOL slot, a
    // probe handler, a user task's uprobe detour trampoline):
    // the switch is a quiescent point, and the task would resume in memory a grace period let
    // `unregister` free. The reschedule stays pending for the next IRQ exit. (Tracers run with
    // IRQs masked inside the ftrace trampoline: no IRQ exit lands in one.)
    if crate::probes::must_not_preempt(pc) {
        return;
    }
    task::irq_exit();
}

/// Where the IRQ exit's text starts (a test checks that no probe can be placed in it).
pub fn irq_exit_text() -> u64 {
    trap_irq_exit as *const () as u64
}

/// Whether the heap's tags are MTE's (build variant `mte`): only then can a tag check fault
/// happen, and only then do the entries check for asynchronous ones (a constant: the other
/// variants' entries do not change).
const HARDWARE_TAGS: bool = crate::mm::kasan::HARDWARE_TAGS;

#[cfg(feature = "mte")]
use crate::mm::kasan::mte::{check_async as check_async_tag_faults, is_tag_check_fault, on_tag_check_fault};

#[cfg(not(feature = "mte"))]
const fn is_tag_check_fault(_esr: u64) -> bool {
    false
}

#[cfg(not(feature = "mte"))]
fn on_tag_check_fault(_frame: &mut ExceptionFrame) -> bool {
    false
}

#[cfg(not(feature = "mte"))]
#[inline(always)]
fn check_async_tag_faults(_pc: u64) {}

/// An FIQ, SError or AArch32 exception: nothing in the kernel raises them.
#[unsafe(no_mangle)]
#[unsafe(link_section = ".text.noprobe")]
extern "C" fn trap_unexpected_vector(frame: &mut ExceptionFrame) {
    report_and_exit("exception from an unexpected vector", frame);
}

/// The stack slot the interrupted context ran on.
fn slot_of(frame: &ExceptionFrame) -> Slot {
    [stacks::this_irq_slot(), stacks::this_overflow_slot()]
        .into_iter()
        .find(|slot| slot.contains_stack(frame.sp))
        .unwrap_or_else(task::current_slot)
}

/// The unexpected-exception report: the syndrome decoded, the registers, both backtraces of the
/// interrupted context; then the run ends with `ExitStatus::Panic`.
#[unsafe(link_section = ".text.noprobe")]
fn report_and_exit(what: &str, frame: &ExceptionFrame) -> ! {
    cpu::mask_interrupts();
    exception::report(what, frame);
    crate::stacktrace::print_both_of(frame, slot_of(frame));
    crate::power::exit(crate::power::ExitStatus::Panic)
}

/// The stack overflowed into its guard page (vectors.S moved to the overflow stack). Reports it
/// with the interrupted context's backtraces and kills the task.
#[unsafe(no_mangle)]
extern "C" fn trap_stack_overflow(frame: &mut ExceptionFrame) -> ! {
    // vectors.S kept the SP that did not fit in TPIDR_EL0.
    let failed_sp: u64;
    // SAFETY: reads a scratch system register.
    unsafe { core::arch::asm!("mrs {}, tpidr_el0", out(reg) failed_sp, options(nomem, nostack, preserves_flags)) };
    frame.sp = failed_sp + (core::mem::size_of::<ExceptionFrame>() + STACK_GAP) as u64;
    report_overflow("stack overflow", KillReason::StackOverflow, frame)
}

/// The shadow call stack reached its guard page (vectors.S switched x18 to the overflow shadow
/// stack). Reports it and kills the task.
#[unsafe(no_mangle)]
extern "C" fn trap_shadow_stack_overflow(frame: &mut ExceptionFrame) -> ! {
    report_overflow("shadow call stack overflow", KillReason::ShadowStackOverflow, frame)
}

fn report_overflow(what: &str, reason: KillReason, frame: &ExceptionFrame) -> ! {
    let slot = task::current_slot();
    defmt::error!(
        "{=str} in task {=str}: SP {=u64:#x}, x18 {=u64:#x}, at ELR {=u64:#x}, FAR {=u64:#x} (stack {=u64:#x}..{=u64:#x}, shadow stack {=u64:#x}..{=u64:#x})",
        what,
        task::current_name(),
        frame.sp,
        frame.x[18],
        frame.elr,
        frame.far,
        slot.stack_base(),
        slot.stack_top(),
        slot.shadow_stack_base(),
        slot.shadow_stack_end()
    );
    crate::stacktrace::print_both_of(frame, slot);
    *LAST_OVERFLOW.lock() = Some(reason);
    task::kill_current(reason)
}

/// The last overflow, for tests.
static LAST_OVERFLOW: IrqSpinLock<Option<KillReason>> = IrqSpinLock::new(None);

pub fn take_last_overflow() -> Option<KillReason> {
    LAST_OVERFLOW.lock().take()
}

/// The EL1 synchronous entry's address (for the probe tests' no-probe checks).
pub fn sync_handler_address() -> u64 {
    trap_el1_sync as *const () as u64
}
