//! Exception frames as vectors.S saves them, the BRK immediates, and the first lines of the
//! unexpected-exception report (ARM ARM D1.10). Who owns which exception is the trap layer's
//! table (trap/mod.rs).

pub use super::esr::{Esr, ExceptionClass, FaultStatus};

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

/// BRK immediates (ESR_ELx.ISS[15:0] of a BRK); their owners are in the trap table
/// (trap/mod.rs). Linux's kprobes use 0x004-0x006 and KASAN 0x900-0x9ff; tracelab's own start at
/// 0x100. This one has no owner: the tests raise it inside `tests::catch`.
pub const BRK_TEST: u16 = 0x100;
/// The `baseline` bench's BRK round trip: resumed at once, nothing else done.
pub const BRK_BENCH: u16 = 0x101;
/// A kernel probe (Linux's value): the probed instruction was replaced by this BRK.
pub const BRK_KPROBE: u16 = 0x004;
/// After the instruction in a probe's out-of-line slot (Linux's kprobe step value).
pub const BRK_KPROBE_STEP: u16 = 0x006;
/// The probe tests' harness: enter a randomized EL1t context / capture it on a landing pad
/// (inside the test-owned range).
pub const BRK_HARNESS_ENTER: u16 = 0x110;
pub const BRK_HARNESS_CAPTURE: u16 = 0x111;
/// BRK immediates the tests own (`TEST_BRK_FIRST..=TEST_BRK_LAST`): the trap layer hands them
/// to the hook the tests install.
pub const TEST_BRK_FIRST: u16 = 0x110;
pub const TEST_BRK_LAST: u16 = 0x11f;
/// Never owned by anything: `run=unowned-brk` raises it to check the unexpected-exception report.
pub const BRK_UNOWNED: u16 = 0x1ff;

/// Bytes below the interrupted SP that exception entry leaves untouched (see vectors.S): a probe
/// may emulate stores there, and the return path stashes x0/x1 there. The value is
/// `crates/probes`' (`KERNEL_STACK_GAP`, whose simulation reach for kernel text follows from it),
/// named `::probes`: the crate below the kernel, not the probe subsystem above this layer.
pub const STACK_GAP: usize = ::probes::KERNEL_STACK_GAP;

/// `boundary[2]` of an exception frame (0 marks the final frame of a task).
pub const BOUNDARY_KIND_EXCEPTION: u64 = 1;

/// The vector table's address (for the probe tests' no-probe checks).
pub fn vectors_address() -> u64 {
    unsafe extern "C" {
        static exception_vectors: u32;
    }
    // SAFETY: only the address of the asm-defined table is taken.
    unsafe { &exception_vectors as *const u32 as u64 }
}

/// Prints the decoded syndrome and the registers of an exception nobody owns (the first lines
/// of the unexpected-exception report; the trap layer adds the backtraces and ends the run).
#[unsafe(link_section = ".text.noprobe")]
pub fn report(what: &str, frame: &ExceptionFrame) {
    let esr = Esr(frame.esr);
    let class = esr.class();
    defmt::error!(
        "{=str}: {} (ESR {=u64:#x}) at ELR {=u64:#x}, FAR {=u64:#x}, SPSR {=u64:#x}",
        what,
        class,
        frame.esr,
        frame.elr,
        frame.far,
        frame.spsr
    );
    match class {
        ExceptionClass::DataAbort
        | ExceptionClass::InstructionAbort
        | ExceptionClass::DataAbortLowerEl
        | ExceptionClass::InstructionAbortLowerEl => {
            defmt::error!("  fault: {}, {=str}", esr.fault_status(), if esr.is_write() { "write" } else { "read" });
        }
        ExceptionClass::Brk | ExceptionClass::Svc64 => {
            defmt::error!("  immediate: {=u16:#x} (no owner)", esr.immediate());
        }
        _ => defmt::error!("  ISS: {=u32:#x}", esr.iss()),
    }
    defmt::error!(
        "  x29 {=u64:#x} x30 {=u64:#x} sp {=u64:#x} x18 {=u64:#x}",
        frame.x[29],
        frame.x[30],
        frame.sp,
        frame.x[18]
    );
}
