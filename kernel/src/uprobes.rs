//! User-space probes (uprobes) and return probes (uretprobes) on EL0 code.
//!
//! A uprobe displaces one instruction of user text (`.text.user`, shared by every user space
//! like a file's page cache in Linux) and performs it on every hit in the way its [`Method`] says:
//! - `SingleStep`: `BRK #0x005` traps from EL0; the handler runs; the task returns to EL0 at the
//!   probe's slot `[insn, BRK #0x120]` in its XOL page under hardware single-step (MDSCR_EL1.SS,
//!   SPSR.SS); the step exception from EL0 resumes it at `address + 4`. Two round trips.
//! - `BrkStep`: the same slot, but the slot's `BRK #0x120` brings the task back. Two round trips.
//! - `Simulate`: `crates/probes` performs the instruction on the saved user registers, reaching
//!   user memory with unprivileged LDTR/STTR (task/user.rs): a store to an unmapped user stack
//!   fails exactly as the task's own store would, and the task gets that fault at the probed PC.
//!   One round trip.
//! - `Detour`: the instruction becomes `B trampoline`; the per-probe trampoline in the XOL page
//!   is `[SVC #0x5550, insn, B address + 4]`: one (cheaper, SVC) round trip, then the displaced
//!   instruction runs natively at EL0.
//!
//! The XOL page (USER_XOL) of each user space holds, per probe index `i`: the step slot at
//! `16 i`, the detour trampoline at `0x400 + 16 i`, and at `0x800` the uretprobe trampoline
//! `BRK #0x121`. A fault inside a slot or trampoline is attributed to the probed address.
//!
//! A uretprobe is a uprobe with a return handler: at the hit (before the displaced instruction,
//! so before any `paciasp` or push of x30) the user's x30 is saved on the task's return-instance
//! stack and replaced by the uretprobe trampoline; the trampoline's BRK pops the instance, runs
//! the return handler and resumes the task at the real return address. Nested and recursive
//! calls push one instance each.
//!
//! Everything on the hit path runs in the EL0 exception handler with IRQs masked, on one CPU.

use core::sync::atomic::{AtomicU64, Ordering};

use crate::arch::cpu;
use crate::arch::exception::{ExceptionClass, ExceptionFrame};
use crate::arch::patch;
use crate::probes::{Method, Registers};
use crate::task::stacks::TASK_SLOTS;
use crate::task::user::{self, USER_XOL, UserFault};
use probes::{
    Classification, Exception, Fault, IndirectBranch, Insn, Memory, RegisterFile, RejectReason, Simulated,
    SimulationConfig, classify, encode_b, encode_brk, simulate,
};

/// A handler: sees (and may change) the user registers; `pc` is the probed address (for a return
/// handler, the real return address, with x0 the return value).
pub type Handler = fn(&mut Registers);

/// BRK immediates from EL0: the probe (Linux's uprobe value), the step back, the return.
pub const BRK_UPROBE: u16 = 0x005;
pub const BRK_UPROBE_STEP: u16 = 0x120;
pub const BRK_URETPROBE: u16 = 0x121;
/// SVC immediate of the detour trampolines.
pub const SVC_UPROBE_DETOUR: u16 = 0x5550;

pub const MAX_UPROBES: usize = 16;
const DETOUR_OFFSET: u64 = 0x400;
/// Where the uretprobe trampoline sits in the XOL page.
pub const RETURN_TRAMPOLINE: u64 = USER_XOL + 0x800;
/// Return instances per task (deeper nesting is counted as missed and not hijacked).
const MAX_RETURN_DEPTH: usize = 64;

/// Why a uprobe was not registered or unregistered.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum UprobeError {
    Misaligned,
    NotUserText,
    AlreadyRegistered,
    NotRegistered,
    Rejected(RejectReason),
    /// The instruction reads or writes the PC: only `Simulate` (or `Detour` for RET/BR).
    NeedsOriginalPc,
    /// `Simulate` on an instruction `crates/probes` steps.
    NotSimulated,
    OutOfBranchRange,
    NoSpace,
}

impl UprobeError {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Misaligned => "address is not 4-byte aligned",
            Self::NotUserText => "address is not user text",
            Self::AlreadyRegistered => "a uprobe is already registered at this address",
            Self::NotRegistered => "no uprobe is registered at this address",
            Self::Rejected(reason) => reason.as_str(),
            Self::NeedsOriginalPc => "instruction reads or writes the PC: cannot run out of line",
            Self::NotSimulated => "instruction is stepped, not simulated, by crates/probes",
            Self::OutOfBranchRange => "branch to the detour trampoline out of range",
            Self::NoSpace => "no free uprobe record",
        }
    }
}

impl defmt::Format for UprobeError {
    fn format(&self, f: defmt::Formatter) {
        defmt::write!(f, "{=str}", self.as_str())
    }
}

#[derive(Clone, Copy)]
enum Action {
    Simulate(Simulated),
    /// `stp x29, x30, [sp, #-16]!`, the frame push that starts most functions, performed
    /// directly (as Linux's `simulate_stp_fp_lr_sp_64` of the 2024 uprobes series): the same
    /// result as `crates/probes`' simulation of it, without its general decode.
    SimulateFramePush,
    OutOfLine {
        hardware_step: bool,
    },
    Detour,
}

#[derive(Clone, Copy)]
struct Uprobe {
    address: u64,
    kernel_address: u64,
    original: u32,
    action: Action,
    handler: Handler,
    return_handler: Option<Handler>,
}

/// Probe records by index (the index names its XOL slot and trampoline). Written with IRQs
/// masked; read by the hit path, which runs with IRQs masked: one CPU, no concurrent access.
static mut UPROBES: [Option<Uprobe>; MAX_UPROBES] = [None; MAX_UPROBES];
static HITS: [AtomicU64; MAX_UPROBES] = [const { AtomicU64::new(0) }; MAX_UPROBES];
static RETURNS: [AtomicU64; MAX_UPROBES] = [const { AtomicU64::new(0) }; MAX_UPROBES];
static MISSED_RETURNS: AtomicU64 = AtomicU64::new(0);

fn uprobes() -> &'static mut [Option<Uprobe>; MAX_UPROBES] {
    // SAFETY: see UPROBES.
    unsafe { &mut *core::ptr::addr_of_mut!(UPROBES) }
}

/// One task's return instances: (real return address, probe index).
#[derive(Clone, Copy)]
struct ReturnStack {
    depth: usize,
    instances: [(u64, usize); MAX_RETURN_DEPTH],
}

static mut RETURN_STACKS: [ReturnStack; TASK_SLOTS] =
    [ReturnStack { depth: 0, instances: [(0, 0); MAX_RETURN_DEPTH] }; TASK_SLOTS];

fn return_stack(slot: usize) -> &'static mut ReturnStack {
    // SAFETY: a task's stack is used by that task's exception handlers (IRQs masked) and reset
    // at spawn, before the task runs.
    unsafe { &mut *core::ptr::addr_of_mut!(RETURN_STACKS[slot]) }
}

/// The step in flight on this CPU: probe index, SPSR at the hit; `usize::MAX` when none.
static mut STEP: (usize, u64, bool) = (usize::MAX, 0, false);

fn step() -> &'static mut (usize, u64, bool) {
    // SAFETY: only the EL0 exception handlers (IRQs masked, one CPU) use it.
    unsafe { &mut *core::ptr::addr_of_mut!(STEP) }
}

const fn slot_offset(index: usize) -> u64 {
    16 * index as u64
}

const fn detour_offset(index: usize) -> u64 {
    DETOUR_OFFSET + 16 * index as u64
}

const SVC_DETOUR: u32 = 0xd400_0001 | ((SVC_UPROBE_DETOUR as u32) << 5);

/// The words a probe owns in every XOL page: (offset, words).
fn xol_words(index: usize, probe: &Uprobe) -> Result<(u64, [u32; 3]), UprobeError> {
    match probe.action {
        Action::OutOfLine { .. } => {
            Ok((slot_offset(index), [probe.original, encode_brk(BRK_UPROBE_STEP).0, encode_brk(BRK_UPROBE_STEP).0]))
        }
        Action::Detour => {
            let trampoline = USER_XOL + detour_offset(index);
            let back = encode_b(trampoline + 8, probe.address + 4).map_err(|_| UprobeError::OutOfBranchRange)?;
            Ok((detour_offset(index), [SVC_DETOUR, probe.original, back.0]))
        }
        Action::Simulate(_) | Action::SimulateFramePush => Ok((slot_offset(index), [encode_brk(BRK_UPROBE_STEP).0; 3])),
    }
}

/// Writes `words` at byte `offset` of every task slot's XOL page and makes them visible to
/// instruction fetch (the pages are executed at their user VA, written at their kernel VA).
fn write_xol(offset: u64, words: &[u32], slots: core::ops::Range<usize>) {
    for slot in slots {
        let page = user::xol_page(slot);
        for (index, &word) in words.iter().enumerate() {
            // SAFETY: offset + 4 * index < 4096 (callers' layout); the page is kernel data.
            unsafe { page.add(offset as usize / 4 + index).write_volatile(word) };
        }
        let address = page as u64 + offset;
        // SAFETY: cache maintenance by VA of mapped kernel data, then an instruction-cache
        // invalidation to the point of unification: no memory is changed.
        unsafe {
            core::arch::asm!(
                "dc cvau, {a}",
                "add {b}, {a}, #8",
                "dc cvau, {b}",
                "dsb ish",
                "ic iallu",
                "dsb ish",
                "isb",
                a = in(reg) address,
                b = out(reg) _,
                options(nostack, preserves_flags)
            )
        };
    }
}

/// A new user task in `slot`: a fresh return-instance stack and an XOL page holding every
/// registered probe's slot or trampoline and the return trampoline. IRQs masked.
pub fn on_new_user_task(slot: usize) {
    return_stack(slot).depth = 0;
    let filler = [encode_brk(BRK_UPROBE_STEP).0; 4];
    for offset in (0..4096).step_by(16) {
        write_xol(offset, &filler, slot..slot + 1);
    }
    write_xol(RETURN_TRAMPOLINE - USER_XOL, &[encode_brk(BRK_URETPROBE).0], slot..slot + 1);
    for (index, probe) in uprobes().iter().enumerate() {
        if let Some(probe) = probe
            && let Ok((offset, words)) = xol_words(index, probe)
        {
            write_xol(offset, &words, slot..slot + 1);
        }
    }
}

fn runs_anywhere(simulated: &Simulated) -> bool {
    matches!(
        simulated,
        Simulated::Nop
            | Simulated::LoadStorePair { .. }
            | Simulated::MoveRegister { .. }
            | Simulated::AddSubImmediate { .. }
    )
}

/// `stp x29, x30, [sp, #-16]!`.
fn is_frame_push(simulated: &Simulated) -> bool {
    matches!(
        simulated,
        Simulated::LoadStorePair { load: false, rt, rt2, rn, offset: -16, indexing: probes::Indexing::PreIndex }
            if rt.number() == 29 && rt2.number() == 30 && rn.number() == 31
    )
}

/// Registers a uprobe at user text `address` (a user VA); with `return_handler`, a uretprobe
/// on the function starting there.
pub fn register(
    address: u64,
    method: Method,
    handler: Handler,
    return_handler: Option<Handler>,
) -> Result<(), UprobeError> {
    if address & 3 != 0 {
        return Err(UprobeError::Misaligned);
    }
    let kernel_address = user::kernel_text_address(address).ok_or(UprobeError::NotUserText)?;
    let daif = cpu::mask_interrupts();
    let result = register_masked(address, kernel_address, method, handler, return_handler);
    cpu::restore_interrupts(daif);
    result
}

fn register_masked(
    address: u64,
    kernel_address: u64,
    method: Method,
    handler: Handler,
    return_handler: Option<Handler>,
) -> Result<(), UprobeError> {
    if lookup(address).is_some() {
        return Err(UprobeError::AlreadyRegistered);
    }
    let index = uprobes().iter().position(Option::is_none).ok_or(UprobeError::NoSpace)?;
    // SAFETY: kernel_address is user text inside the kernel image, mapped readable.
    let original = unsafe { core::ptr::read_volatile(kernel_address as *const u32) };
    let classification = classify(Insn(original));
    let action = match (method, classification) {
        (_, Classification::Reject(reason)) => return Err(UprobeError::Rejected(reason)),
        (Method::Simulate, Classification::Simulate(simulated)) if is_frame_push(&simulated) => {
            Action::SimulateFramePush
        }
        (Method::Simulate, Classification::Simulate(simulated)) => Action::Simulate(simulated),
        (Method::Simulate, _) => return Err(UprobeError::NotSimulated),
        (Method::SingleStep | Method::BrkStep, Classification::Simulate(simulated)) if !runs_anywhere(&simulated) => {
            return Err(UprobeError::NeedsOriginalPc);
        }
        (Method::SingleStep | Method::BrkStep, _) => Action::OutOfLine { hardware_step: method == Method::SingleStep },
        (Method::Detour, Classification::Simulate(simulated))
            if !runs_anywhere(&simulated)
                && !matches!(
                    simulated,
                    Simulated::BranchRegister { kind: IndirectBranch::Ret | IndirectBranch::Br, .. }
                ) =>
        {
            return Err(UprobeError::NeedsOriginalPc);
        }
        (Method::Detour, _) => Action::Detour,
    };
    let probe = Uprobe { address, kernel_address, original, action, handler, return_handler };
    let (offset, words) = xol_words(index, &probe)?;
    write_xol(offset, &words, 0..TASK_SLOTS);
    let patched = match action {
        Action::Detour => {
            encode_b(address, USER_XOL + detour_offset(index)).map_err(|_| UprobeError::OutOfBranchRange)?.0
        }
        _ => encode_brk(BRK_UPROBE).0,
    };
    HITS[index].store(0, Ordering::Relaxed);
    RETURNS[index].store(0, Ordering::Relaxed);
    uprobes()[index] = Some(probe);
    // SAFETY: user text is kernel image text (its alias is writable); BRK and B may replace an
    // instruction concurrently with its execution (ARM ARM B2.2.5).
    unsafe { patch::write_instruction(kernel_address, patched) };
    Ok(())
}

/// Unregisters the uprobe at `address`, restoring the instruction.
pub fn unregister(address: u64) -> Result<(), UprobeError> {
    let daif = cpu::mask_interrupts();
    let result = match lookup(address) {
        Some(index) => {
            let probe = uprobes()[index].take().expect("looked up");
            // SAFETY: as in register: the original instruction replaces the BRK/B.
            unsafe { patch::write_instruction(probe.kernel_address, probe.original) };
            write_xol(slot_offset(index), &[encode_brk(BRK_UPROBE_STEP).0; 4], 0..TASK_SLOTS);
            write_xol(detour_offset(index), &[encode_brk(BRK_UPROBE_STEP).0; 4], 0..TASK_SLOTS);
            Ok(())
        }
        None => Err(UprobeError::NotRegistered),
    };
    cpu::restore_interrupts(daif);
    result
}

/// Hits and return-handler runs of the uprobe at `address`.
pub fn counts(address: u64) -> Option<(u64, u64)> {
    lookup(address).map(|index| (HITS[index].load(Ordering::Relaxed), RETURNS[index].load(Ordering::Relaxed)))
}

/// Function entries whose return could not be hijacked (return-instance stack full).
pub fn missed_returns() -> u64 {
    MISSED_RETURNS.load(Ordering::Relaxed)
}

#[inline(always)]
fn lookup(address: u64) -> Option<usize> {
    uprobes().iter().position(|probe| probe.is_some_and(|probe| probe.address == address))
}

const _: () = {
    use core::mem::offset_of;
    assert!(offset_of!(ExceptionFrame, x) == offset_of!(Registers, x));
    assert!(offset_of!(ExceptionFrame, sp) == offset_of!(Registers, sp));
    assert!(offset_of!(ExceptionFrame, elr) == offset_of!(Registers, pc));
    assert!(offset_of!(ExceptionFrame, spsr) == offset_of!(Registers, pstate));
};

fn registers(frame: &mut ExceptionFrame) -> &mut Registers {
    // SAFETY: same repr(C) prefix (checked above); the frame's borrow is handed on.
    unsafe { &mut *(frame as *mut ExceptionFrame).cast::<Registers>() }
}

/// The saved user registers as the simulator's register file, with accessors the compiler
/// inlines into the `simulate` instantiation (as kprobes' hit path does: the crate's own
/// `Registers` impl is not inlinable across crates).
struct FrameRegisters<'a>(&'a mut Registers);

impl RegisterFile for FrameRegisters<'_> {
    #[inline(always)]
    fn x(&self, n: u8) -> u64 {
        self.0.x[usize::from(n) % 31]
    }
    #[inline(always)]
    fn set_x(&mut self, n: u8, value: u64) {
        self.0.x[usize::from(n) % 31] = value;
    }
    #[inline(always)]
    fn sp(&self) -> u64 {
        self.0.sp
    }
    #[inline(always)]
    fn set_sp(&mut self, value: u64) {
        self.0.sp = value;
    }
    #[inline(always)]
    fn pc(&self) -> u64 {
        self.0.pc
    }
    #[inline(always)]
    fn set_pc(&mut self, value: u64) {
        self.0.pc = value;
    }
    #[inline(always)]
    fn pstate(&self) -> u64 {
        self.0.pstate
    }
    #[inline(always)]
    fn set_pstate(&mut self, value: u64) {
        self.0.pstate = value;
    }
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

const SPSR_SS: u64 = 1 << 21;
const SPSR_BTYPE: u64 = 3 << 10;
const SPSR_I: u64 = 1 << 7;
const SPSR_F: u64 = 1 << 6;
const MDSCR_SS: u64 = 1;

#[unsafe(link_section = ".text.noprobe")]
fn set_mdscr_ss(on: bool) {
    let mut mdscr: u64;
    // SAFETY: read-modify-write of MDSCR_EL1.SS (software step of EL0; KDE stays as it is, so
    // EL1 is never stepped). No memory is touched.
    unsafe {
        core::arch::asm!("mrs {m}, mdscr_el1", m = out(reg) mdscr, options(nomem, nostack, preserves_flags));
        mdscr = if on { mdscr | MDSCR_SS } else { mdscr & !MDSCR_SS };
        core::arch::asm!("msr mdscr_el1, {m}", "isb", m = in(reg) mdscr, options(nomem, nostack, preserves_flags));
    }
}

/// A synchronous exception from EL0 that may be the uprobes' (BRK, software step, detour SVC).
#[unsafe(link_section = ".text.noprobe")]
pub fn on_el0_exception(frame: &mut ExceptionFrame, class: ExceptionClass) -> bool {
    let immediate = (frame.esr & 0xffff) as u16;
    match class {
        ExceptionClass::Brk => match immediate {
            BRK_UPROBE => on_brk(frame),
            BRK_UPROBE_STEP => finish_step(frame, false),
            BRK_URETPROBE => on_return(frame),
            _ => false,
        },
        ExceptionClass::SoftwareStepLowerEl => finish_step(frame, true),
        ExceptionClass::Svc64 if immediate == SVC_UPROBE_DETOUR => on_detour(frame),
        _ => false,
    }
}

#[unsafe(link_section = ".text.noprobe")]
fn hijack_return(frame: &mut ExceptionFrame, index: usize) {
    let stack = return_stack(crate::task::current().0);
    if stack.depth == MAX_RETURN_DEPTH {
        MISSED_RETURNS.fetch_add(1, Ordering::Relaxed);
        return;
    }
    stack.instances[stack.depth] = (frame.x[30], index);
    stack.depth += 1;
    frame.x[30] = RETURN_TRAMPOLINE;
}

#[unsafe(link_section = ".text.noprobe")]
fn on_brk(frame: &mut ExceptionFrame) -> bool {
    let Some(index) = lookup(frame.elr) else {
        return false;
    };
    // By reference: a copy of the record (or of its `Simulated`) is a memcpy call per hit.
    let Some(probe) = &uprobes()[index] else {
        return false;
    };
    HITS[index].fetch_add(1, Ordering::Relaxed);
    (probe.handler)(registers(frame));
    if probe.return_handler.is_some() {
        hijack_return(frame, index);
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
        &Action::OutOfLine { hardware_step } => {
            *step() = (index, frame.spsr, hardware_step);
            frame.elr = USER_XOL + slot_offset(index);
            // IRQs stay masked for the one instruction, so the step state is per CPU.
            frame.spsr |= SPSR_I | SPSR_F;
            if hardware_step {
                frame.spsr |= SPSR_SS;
                set_mdscr_ss(true);
            }
        }
        Action::Detour => return false,
    }
    true
}

#[unsafe(link_section = ".text.noprobe")]
fn finish_step(frame: &mut ExceptionFrame, hardware_step: bool) -> bool {
    let (index, spsr, stepped) = *step();
    if index == usize::MAX || stepped != hardware_step || frame.elr != USER_XOL + slot_offset(index) + 4 {
        return false;
    }
    let Some(probe) = &uprobes()[index] else {
        return false;
    };
    if hardware_step {
        set_mdscr_ss(false);
    }
    let restored = SPSR_I | SPSR_F | SPSR_SS;
    frame.spsr = (frame.spsr & !restored) | (spsr & restored);
    frame.elr = probe.address + 4;
    *step() = (usize::MAX, 0, false);
    true
}

#[unsafe(link_section = ".text.noprobe")]
fn on_detour(frame: &mut ExceptionFrame) -> bool {
    let offset = frame.elr.wrapping_sub(4).wrapping_sub(USER_XOL + DETOUR_OFFSET);
    let index = (offset / 16) as usize;
    if !offset.is_multiple_of(16) || index >= MAX_UPROBES {
        return false;
    }
    let Some(probe) = &uprobes()[index] else {
        return false;
    };
    HITS[index].fetch_add(1, Ordering::Relaxed);
    let resume = frame.elr;
    frame.elr = probe.address;
    (probe.handler)(registers(frame));
    frame.elr = resume;
    if probe.return_handler.is_some() {
        hijack_return(frame, index);
    }
    true
}

#[unsafe(link_section = ".text.noprobe")]
fn on_return(frame: &mut ExceptionFrame) -> bool {
    let stack = return_stack(crate::task::current().0);
    if frame.elr != RETURN_TRAMPOLINE || stack.depth == 0 {
        return false;
    }
    stack.depth -= 1;
    let (return_address, index) = stack.instances[stack.depth];
    frame.elr = return_address;
    RETURNS[index].fetch_add(1, Ordering::Relaxed);
    if let Some(probe) = &uprobes()[index]
        && let Some(handler) = probe.return_handler
    {
        handler(registers(frame));
    }
    true
}

/// The user PC a fault at `elr` is reported at: a fault in a step slot or detour trampoline
/// belongs to the probed instruction (and ends the step).
#[unsafe(link_section = ".text.noprobe")]
pub fn attributed_pc(elr: u64) -> u64 {
    let (index, _, hardware_step) = *step();
    if index != usize::MAX && elr == USER_XOL + slot_offset(index) {
        if hardware_step {
            set_mdscr_ss(false);
        }
        *step() = (usize::MAX, 0, false);
        if let Some(probe) = &uprobes()[index] {
            return probe.address;
        }
    }
    let offset = elr.wrapping_sub(USER_XOL + DETOUR_OFFSET);
    let index = (offset / 16) as usize;
    if offset % 16 == 4
        && index < MAX_UPROBES
        && let Some(probe) = &uprobes()[index]
        && matches!(probe.action, Action::Detour)
    {
        return probe.address;
    }
    elr
}
