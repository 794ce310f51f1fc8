//! Exception frames, ESR decoding and the EL1 synchronous/IRQ handlers (ARM ARM D1.10, D24.2.40).

use crate::sync::IrqSpinLock;
use core::sync::atomic::{AtomicU64, Ordering};

/// The interrupted context, as vectors.S saves it on the stack.
#[repr(C)]
pub struct ExceptionFrame {
    pub x: [u64; 31],
    /// SP of the interrupted context; the context resumes on this value (a probe that emulates
    /// `stp x29, x30, [sp, #-16]!` moves it).
    pub sp: u64,
    pub elr: u64,
    pub spsr: u64,
    pub esr: u64,
    pub far: u64,
    /// Exception-boundary frame record for unwinders: {0, 0, kind, elr, interrupted x29}.
    /// x29 points here while the handler runs.
    pub boundary: [u64; 5],
    /// The user's TPIDR_EL0 in a frame from EL0 (unused otherwise).
    pub tpidr_el0: u64,
}

/// BRK immediates the kernel owns (ESR_ELx.ISS[15:0] of a BRK). Linux's kprobes use 0x004-0x006
/// and KASAN 0x900-0x9ff; tracelab's own start at 0x100.
pub const BRK_TEST: u16 = 0x100;
/// The `baseline` bench's BRK round trip: resumed at once, nothing else done.
pub const BRK_BENCH: u16 = 0x101;
/// A kernel probe (Linux's value): the probed instruction was replaced by this BRK.
pub const BRK_KPROBE: u16 = 0x004;
/// After the instruction in a probe's out-of-line slot (Linux's kprobe step value).
pub const BRK_KPROBE_STEP: u16 = 0x006;
/// The probe tests' harness: enter a randomized EL1t context / capture it on a landing pad.
pub const BRK_HARNESS_ENTER: u16 = 0x110;
pub const BRK_HARNESS_CAPTURE: u16 = 0x111;

/// Bytes below the interrupted SP that exception entry leaves untouched (see vectors.S): a probe
/// may emulate stores there, and the return path stashes x0/x1 there.
pub const STACK_GAP: usize = 256;

/// `boundary[2]` of an exception frame (0 marks the final frame of a task).
pub const BOUNDARY_KIND_EXCEPTION: u64 = 1;

/// Exception classes (ESR_ELx.EC) the kernel tells apart.
#[derive(Clone, Copy, PartialEq, Eq, Debug, defmt::Format)]
#[repr(u8)]
pub enum ExceptionClass {
    Unknown = 0x00,
    Svc64 = 0x15,
    SystemRegisterTrap = 0x18,
    PointerAuthFailure = 0x1c,
    InstructionAbortLowerEl = 0x20,
    InstructionAbort = 0x21,
    PcAlignment = 0x22,
    DataAbortLowerEl = 0x24,
    DataAbort = 0x25,
    SpAlignment = 0x26,
    SError = 0x2f,
    SoftwareStepLowerEl = 0x32,
    SoftwareStep = 0x33,
    Brk = 0x3c,
    Other = 0xff,
}

impl ExceptionClass {
    pub fn of(esr: u64) -> Self {
        match (esr >> 26) & 0x3f {
            0x00 => Self::Unknown,
            0x15 => Self::Svc64,
            0x18 => Self::SystemRegisterTrap,
            0x1c => Self::PointerAuthFailure,
            0x20 => Self::InstructionAbortLowerEl,
            0x21 => Self::InstructionAbort,
            0x22 => Self::PcAlignment,
            0x24 => Self::DataAbortLowerEl,
            0x25 => Self::DataAbort,
            0x26 => Self::SpAlignment,
            0x2f => Self::SError,
            0x32 => Self::SoftwareStepLowerEl,
            0x33 => Self::SoftwareStep,
            0x3c => Self::Brk,
            _ => Self::Other,
        }
    }
}

/// The fault status code of an instruction or data abort (ISS.xFSC), decoded.
#[derive(Clone, Copy, PartialEq, Eq, Debug, defmt::Format)]
pub enum FaultStatus {
    Translation { level: u8 },
    AccessFlag { level: u8 },
    Permission { level: u8 },
    Alignment,
    SynchronousExternal,
    Other(u8),
}

impl FaultStatus {
    pub fn of(esr: u64) -> Self {
        let fsc = (esr & 0x3f) as u8;
        let level = fsc & 3;
        match fsc >> 2 {
            0b0001 => Self::Translation { level },
            0b0010 => Self::AccessFlag { level },
            0b0011 => Self::Permission { level },
            _ if fsc == 0b10_0001 => Self::Alignment,
            _ if fsc == 0b01_0000 => Self::SynchronousExternal,
            _ => Self::Other(fsc),
        }
    }
}

/// What a test-provoked exception looked like.
#[derive(Clone, Copy, Debug, defmt::Format)]
pub struct Caught {
    pub esr: u64,
    pub far: u64,
    pub elr: u64,
}

/// Exception class (plus one) that the running code expects to take and step over; 0 if none.
static EXPECTED_CLASS: AtomicU64 = AtomicU64::new(0);
static CAUGHT: IrqSpinLock<Option<Caught>> = IrqSpinLock::new(None);

/// Runs `f`, expecting it to raise one synchronous exception of `class` at EL1. The handler
/// records it and resumes after the faulting instruction. Returns what was caught, if anything.
pub fn catch(class: ExceptionClass, f: impl FnOnce()) -> Option<Caught> {
    *CAUGHT.lock() = None;
    EXPECTED_CLASS.store(class as u64 + 1, Ordering::SeqCst);
    f();
    EXPECTED_CLASS.store(0, Ordering::SeqCst);
    CAUGHT.lock().take()
}

#[unsafe(no_mangle)]
#[unsafe(link_section = ".text.noprobe")]
extern "C" fn exception_el1_sync(frame: &mut ExceptionFrame) {
    let ec = frame.esr >> 26;
    if ec == ExceptionClass::Brk as u64 {
        let handled = match (frame.esr & 0xffff) as u16 {
            BRK_KPROBE => crate::probes::on_brk(frame),
            BRK_BENCH => {
                frame.elr += 4;
                true
            }
            BRK_KPROBE_STEP => crate::probes::on_step_brk(frame),
            BRK_HARNESS_ENTER | BRK_HARNESS_CAPTURE => crate::tests::probe_harness_brk(frame),
            _ => false,
        };
        if handled {
            return;
        }
    } else if (ec == ExceptionClass::SoftwareStep as u64 && crate::probes::on_software_step(frame))
        || (ec == ExceptionClass::DataAbort as u64 && crate::task::user::fixup_user_access(frame))
    {
        return;
    }
    let class = ExceptionClass::of(frame.esr);
    if EXPECTED_CLASS.load(Ordering::SeqCst) == class as u64 + 1 {
        EXPECTED_CLASS.store(0, Ordering::SeqCst);
        *CAUGHT.lock() = Some(Caught { esr: frame.esr, far: frame.far, elr: frame.elr });
        frame.elr += 4;
        return;
    }
    report_and_exit("unexpected synchronous exception", frame);
}

/// The vector table's address (for the probe tests' no-probe checks).
pub fn vectors_address() -> u64 {
    unsafe extern "C" {
        static exception_vectors: u32;
    }
    // SAFETY: only the address of the asm-defined table is taken.
    unsafe { &exception_vectors as *const u32 as u64 }
}

/// The synchronous exception handler's address (for the probe tests' no-probe checks).
pub fn sync_handler_address() -> u64 {
    exception_el1_sync as *const () as u64
}

#[unsafe(no_mangle)]
#[unsafe(link_section = ".text.noprobe")]
extern "C" fn exception_el1_irq(_frame: &mut ExceptionFrame) {
    crate::drivers::interrupts::handle_irq();
}

#[unsafe(no_mangle)]
#[unsafe(link_section = ".text.noprobe")]
extern "C" fn exception_unexpected(frame: &mut ExceptionFrame) {
    report_and_exit("exception from an unexpected vector", frame);
}

/// The stack overflowed into its guard page (vectors.S moved to the overflow stack). Reports it
/// with the interrupted context's backtraces and kills the task.
#[unsafe(no_mangle)]
extern "C" fn exception_stack_overflow(frame: &mut ExceptionFrame) -> ! {
    // vectors.S kept the SP that did not fit in TPIDR_EL0.
    let failed_sp: u64;
    // SAFETY: reads a scratch system register.
    unsafe { core::arch::asm!("mrs {}, tpidr_el0", out(reg) failed_sp, options(nomem, nostack, preserves_flags)) };
    frame.sp = failed_sp + (core::mem::size_of::<ExceptionFrame>() + STACK_GAP) as u64;
    report_overflow("stack overflow", crate::task::KillReason::StackOverflow, frame)
}

/// The shadow call stack reached its guard page (vectors.S switched x18 to the overflow shadow
/// stack). Reports it and kills the task.
#[unsafe(no_mangle)]
extern "C" fn exception_shadow_stack_overflow(frame: &mut ExceptionFrame) -> ! {
    report_overflow("shadow call stack overflow", crate::task::KillReason::ShadowStackOverflow, frame)
}

fn report_overflow(what: &str, reason: crate::task::KillReason, frame: &ExceptionFrame) -> ! {
    let slot = crate::task::current_slot();
    defmt::error!(
        "{=str} in task {=str}: SP {=u64:#x}, x18 {=u64:#x}, at ELR {=u64:#x}, FAR {=u64:#x} (stack {=u64:#x}..{=u64:#x}, shadow stack {=u64:#x}..{=u64:#x})",
        what,
        crate::task::current_name(),
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
    record_overflow(reason);
    crate::task::kill_current(reason)
}

/// The last overflow, for tests.
static LAST_OVERFLOW: IrqSpinLock<Option<crate::task::KillReason>> = IrqSpinLock::new(None);

fn record_overflow(reason: crate::task::KillReason) {
    *LAST_OVERFLOW.lock() = Some(reason);
}

pub fn take_last_overflow() -> Option<crate::task::KillReason> {
    LAST_OVERFLOW.lock().take()
}

#[unsafe(link_section = ".text.noprobe")]
fn report_and_exit(what: &str, frame: &ExceptionFrame) -> ! {
    crate::arch::aarch64::cpu::mask_interrupts();
    let class = ExceptionClass::of(frame.esr);
    defmt::error!(
        "{=str}: {} (ESR {=u64:#x}) at ELR {=u64:#x}, FAR {=u64:#x}, SPSR {=u64:#x}",
        what,
        class,
        frame.esr,
        frame.elr,
        frame.far,
        frame.spsr
    );
    if matches!(class, ExceptionClass::DataAbort | ExceptionClass::InstructionAbort) {
        let write = frame.esr & (1 << 6) != 0;
        defmt::error!("  fault: {}, {=str}", FaultStatus::of(frame.esr), if write { "write" } else { "read" });
    }
    defmt::error!(
        "  x29 {=u64:#x} x30 {=u64:#x} sp {=u64:#x} x18 {=u64:#x}",
        frame.x[29],
        frame.x[30],
        frame.sp,
        frame.x[18]
    );
    crate::exit(crate::ExitStatus::Panic)
}
