//! User-space probes (uprobes) on EL0 code, and the EL0 trap entry of every user probe.
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
//! `16 i`, the detour trampoline at `0x400 + 16 i`, at `0x800` the uretprobe trampoline
//! (`uretprobe.rs`), and per CPU `c` a slot at `0xc00 + 16 c`. A fault inside a slot or
//! trampoline is attributed to the probed address.
//!
//! Where a stepped probe's instruction runs ([`XolSlots`], chosen per probe at registration,
//! issue 23): `PerProbe` (the default) is the probe's own slot, written once at registration (and
//! into each new space); `PerCpu` is this CPU's slot, rewritten at every hit (Linux's dynamic XOL
//! slots), optionally skipping the write and its cache maintenance when the slot already holds
//! the instruction. A `PerCpu` hit holds its CPU's slot from the BRK to the step back (IRQs
//! masked) and counts a wait if it ever finds the slot held ([`slot_waits`]).
//!
//! Everything on the hit path runs in the EL0 exception handler with IRQs masked. Records are
//! published lock-free (`cells::Records`, one pointer per index), so a hit takes no lock.

use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};

use super::cells::Records;
use super::frame::{FrameRegisters, registers};
use super::{Handler, ProbeError, uretprobe};
use crate::arch::exception::{ExceptionClass, ExceptionFrame};
use crate::arch::patch;
use crate::arch::percpu::{CPUS, UserStepControl, cpu_data, this_cpu, this_cpu_index};
use crate::arch::step::{MDSCR_SS, SPSR_BTYPE, SPSR_IF, SPSR_SS, set_mdscr};
use crate::sync::IrqSpinLock;
use crate::task::stacks::TASK_SLOTS;
use crate::task::user::{self, USER_XOL, UserFault};
use probes::{
    Exception, Fault, Insn, Memory, Method, Plan, Rules, Simulated, SimulationConfig, Text, classify, encode_b,
    encode_brk, simulate,
};

/// BRK immediates from EL0: the probe (Linux's uprobe value), the step back, the return.
pub const BRK_UPROBE: u16 = 0x005;
pub const BRK_UPROBE_STEP: u16 = 0x120;
pub use super::uretprobe::BRK_URETPROBE;
/// SVC immediate of the detour trampolines.
pub const SVC_UPROBE_DETOUR: u16 = 0x5550;

pub const MAX_UPROBES: usize = 16;
const DETOUR_OFFSET: u64 = 0x400;
/// The detour trampolines' bytes in the XOL page (16 per probe index).
const DETOUR_AREA_BYTES: u64 = 16 * MAX_UPROBES as u64;
/// The per-CPU slots (strategy `XolSlots::PerCpu`).
const CPU_SLOTS_OFFSET: u64 = 0xc00;

/// Where a stepped uprobe's displaced instruction runs (issue 23's slot strategies).
#[derive(Clone, Copy, PartialEq, Eq, Debug, defmt::Format)]
pub enum XolSlots {
    /// One slot per probe, shared by every CPU, written once (at registration and into each
    /// new user space).
    PerProbe,
    /// One slot per CPU, rewritten at every hit with the probe's instruction; with
    /// `skip_unchanged`, the write and its cache maintenance are skipped when the slot already
    /// holds it.
    PerCpu { skip_unchanged: bool },
}

#[derive(Clone, Copy)]
enum Action {
    Simulate(Simulated),
    /// `stp x29, x30, [sp, #-16]!`, the frame push that starts most functions, performed
    /// directly (`Plan::SimulateFramePush`).
    SimulateFramePush,
    OutOfLine {
        hardware_step: bool,
    },
    /// Out of line in this CPU's slot, written at the hit (`XolSlots::PerCpu`).
    CpuSlot {
        hardware_step: bool,
        skip_unchanged: bool,
    },
    Detour,
}

pub(super) struct Uprobe {
    pub(super) address: u64,
    kernel_address: u64,
    original: u32,
    action: Action,
    handler: Handler,
    pub(super) return_handler: Option<Handler>,
}

/// Probe records by index (the index names its XOL slot and trampoline), and the published
/// pointer to each (null: free).
static RECORDS: Records<Uprobe, MAX_UPROBES> = Records::new();
static PUBLISHED: [AtomicPtr<Uprobe>; MAX_UPROBES] = [const { AtomicPtr::new(core::ptr::null_mut()) }; MAX_UPROBES];
static HITS: [AtomicU64; MAX_UPROBES] = [const { AtomicU64::new(0) }; MAX_UPROBES];
pub(super) static RETURNS: [AtomicU64; MAX_UPROBES] = [const { AtomicU64::new(0) }; MAX_UPROBES];
/// Serialises registration; the hit path never takes it.
static REGISTER: IrqSpinLock<()> = IrqSpinLock::new(());

/// No step in flight (`UserStepControl::index`).
const NO_STEP: usize = usize::MAX;

/// The step in flight on this CPU (`percpu::UserStepControl`): the probe index, the SPSR at the
/// hit and whether it is a hardware step. Only the EL0 exception handlers (IRQs masked, from the
/// BRK to the step's return) use it. One pointer load from this CPU's data.
#[inline(always)]
fn step_state() -> &'static UserStepControl {
    // SAFETY: `init_this_cpu` pointed it at this CPU's own state before anything ran on this CPU
    // (or `set_step_state_per_cpu` at CPU 0's): a static entry of the per-CPU table.
    unsafe { &*this_cpu().user_step.load(Ordering::Relaxed) }
}

/// Test-only: `false` points every CPU at CPU 0's step state, the single global state uprobes
/// had before SMP (two CPUs stepping at once then overwrite each other's), `true` gives each its
/// own back. Call only while no user probe is hit (no uprobe registered).
pub fn set_step_state_per_cpu(per_cpu: bool) {
    let shared = &cpu_data(0).user_step_own;
    for cpu in 0..CPUS {
        let data = cpu_data(cpu);
        let state = if per_cpu { &data.user_step_own } else { shared };
        data.user_step_own.index.store(NO_STEP, Ordering::Relaxed);
        data.user_step.store(core::ptr::from_ref(state).cast_mut(), Ordering::Release);
    }
}

/// The published record at `index`, if any.
#[inline(always)]
pub(super) fn published(index: usize) -> Option<&'static Uprobe> {
    let pointer = PUBLISHED[index].load(Ordering::Acquire);
    // SAFETY: a published pointer points at an initialised record (see `cells::Records`).
    (!pointer.is_null()).then(|| unsafe { &*pointer })
}

#[inline(always)]
fn lookup(address: u64) -> Option<(usize, &'static Uprobe)> {
    (0..MAX_UPROBES).find_map(|index| published(index).filter(|probe| probe.address == address).map(|p| (index, p)))
}

const fn slot_offset(index: usize) -> u64 {
    16 * index as u64
}

const fn detour_offset(index: usize) -> u64 {
    DETOUR_OFFSET + 16 * index as u64
}

const fn cpu_slot_offset(cpu: usize) -> u64 {
    CPU_SLOTS_OFFSET + 16 * cpu as u64
}

const _: () = assert!(cpu_slot_offset(CPUS) <= 4096, "the per-CPU slots fit the XOL page");

const SVC_DETOUR: u32 = 0xd400_0001 | ((SVC_UPROBE_DETOUR as u32) << 5);
const FILLER: [u32; 4] = [encode_brk(BRK_UPROBE_STEP).0; 4];

/// The words a probe owns in every XOL page: (offset, words).
fn xol_words(index: usize, probe: &Uprobe) -> Result<(u64, [u32; 3]), ProbeError> {
    match probe.action {
        Action::OutOfLine { .. } => {
            Ok((slot_offset(index), [probe.original, encode_brk(BRK_UPROBE_STEP).0, encode_brk(BRK_UPROBE_STEP).0]))
        }
        Action::Detour => {
            let trampoline = USER_XOL + detour_offset(index);
            let back = encode_b(trampoline + 8, probe.address + 4).map_err(|_| ProbeError::OutOfBranchRange)?;
            Ok((detour_offset(index), [SVC_DETOUR, probe.original, back.0]))
        }
        Action::Simulate(_) | Action::SimulateFramePush | Action::CpuSlot { .. } => {
            Ok((slot_offset(index), [encode_brk(BRK_UPROBE_STEP).0; 3]))
        }
    }
}

/// Writes `words` at byte `offset` of the XOL page of every task slot in `slots`.
pub(super) fn write_xol(offset: u64, words: &[u32], slots: core::ops::Range<usize>) {
    for slot in slots {
        // SAFETY: offset + 4 * words.len() stays within one 16-byte unit of the 4096-byte XOL
        // page (callers' layout), kernel data executed only at USER_XOL; the words change only
        // while no task runs the probe's slot or trampoline (registration, task creation).
        unsafe { patch::write_code_alias(user::xol_page(slot).add(offset as usize / 4), words) };
    }
}

/// A new user task in `slot`: a fresh return-instance stack and an XOL page holding every
/// registered probe's slot or trampoline and the return trampoline.
pub fn on_new_user_task(slot: usize) {
    let _lock = REGISTER.lock();
    uretprobe::reset(slot);
    for offset in (0..4096).step_by(16) {
        write_xol(offset, &FILLER, slot..slot + 1);
    }
    uretprobe::write_trampoline(slot);
    for index in 0..MAX_UPROBES {
        if let Some(probe) = published(index)
            && let Ok((offset, words)) = xol_words(index, probe)
        {
            write_xol(offset, &words, slot..slot + 1);
        }
    }
}

/// Registers a uprobe at user text `address` (a user VA); with `return_handler`, a uretprobe
/// on the function starting there. A stepped probe runs its instruction in its own XOL slot
/// (`XolSlots::PerProbe`).
pub fn register(
    address: u64,
    method: Method,
    handler: Handler,
    return_handler: Option<Handler>,
) -> Result<(), ProbeError> {
    register_with_slots(address, method, handler, return_handler, XolSlots::PerProbe)
}

/// [`register`] with the XOL slot strategy of a stepped probe (`slots` does not matter to the
/// simulated and detour methods).
pub fn register_with_slots(
    address: u64,
    method: Method,
    handler: Handler,
    return_handler: Option<Handler>,
    slots: XolSlots,
) -> Result<(), ProbeError> {
    if address & 3 != 0 {
        return Err(ProbeError::Misaligned);
    }
    let kernel_address = user::kernel_text_address(address).ok_or(ProbeError::NotText(Text::User))?;
    let _lock = REGISTER.lock();
    if lookup(address).is_some() {
        return Err(ProbeError::AlreadyRegistered);
    }
    let retiring = RETIRING.load(Ordering::Relaxed);
    let index = (0..MAX_UPROBES)
        .find(|&index| published(index).is_none() && retiring & (1 << index) == 0)
        .ok_or(ProbeError::NoSpace)?;
    // SAFETY: kernel_address is user text inside the kernel image, mapped readable.
    let original = unsafe { core::ptr::read_volatile(kernel_address as *const u32) };
    let rules = Rules { text: Text::User, stack_reach: 0, post_handler: false };
    let action = match probes::plan(method, &classify(Insn(original)), &rules) {
        Ok(Plan::Simulate(simulated)) => Action::Simulate(simulated),
        Ok(Plan::SimulateFramePush) => Action::SimulateFramePush,
        Ok(Plan::OutOfLine { hardware_step }) => match slots {
            XolSlots::PerProbe => Action::OutOfLine { hardware_step },
            XolSlots::PerCpu { skip_unchanged } => Action::CpuSlot { hardware_step, skip_unchanged },
        },
        Ok(Plan::Detour) => Action::Detour,
        Err(refusal) => return Err(ProbeError::refused(refusal, Text::User)),
    };
    let probe = Uprobe { address, kernel_address, original, action, handler, return_handler };
    let (offset, words) = xol_words(index, &probe)?;
    let patched = match action {
        Action::Detour => {
            encode_b(address, USER_XOL + detour_offset(index)).map_err(|_| ProbeError::OutOfBranchRange)?.0
        }
        _ => encode_brk(BRK_UPROBE).0,
    };
    write_xol(offset, &words, 0..TASK_SLOTS);
    HITS[index].store(0, Ordering::Relaxed);
    RETURNS[index].store(0, Ordering::Relaxed);
    // SAFETY: the record is unpublished (its pointer is null) and we hold REGISTER.
    unsafe { RECORDS.pointer(index).write(probe) };
    PUBLISHED[index].store(RECORDS.pointer(index), Ordering::Release);
    // SAFETY: user text is kernel image text (its alias is writable); BRK and B may replace an
    // instruction concurrently with its execution (ARM ARM B2.2.5).
    unsafe { patch::write_instruction(kernel_address, patched) };
    Ok(())
}

/// Unregisters the uprobe at `address`, restoring the instruction. The XOL slot and trampoline
/// are poisoned (refilled) and the index freed only after a grace period
/// (`task::cpus::synchronize`, with `REGISTER` released: a CPU spinning on it with IRQs masked
/// would never pass a quiescent point): a hit runs with IRQs masked from the BRK through the
/// stepped slot to the step's return, so a CPU past a quiescent point is done with the probe. A
/// task inside a detour trampoline runs at EL0 with IRQs unmasked, but is never switched away
/// there ([`in_detour_trampoline`]): a task switch, the quiescent point, happens only outside
/// every trampoline, so the grace period covers tasks in trampolines too, on other CPUs (whose
/// IRQ exits defer the reschedule until the task left it; `synchronize` resends its wake-up)
/// and on this one (the caller runs only once such a task was switched away, outside)
/// (docs/design/races.md).
pub fn unregister(address: u64) -> Result<(), ProbeError> {
    let index = {
        let _lock = REGISTER.lock();
        let (index, probe) = lookup(address).ok_or(ProbeError::NotRegistered)?;
        if wrong_removal() == WrongRemoval::PoisonBeforeRestore {
            poison(index);
        }
        // SAFETY: as in register: the original instruction replaces the BRK/B.
        unsafe { patch::write_instruction(probe.kernel_address, probe.original) };
        PUBLISHED[index].store(core::ptr::null_mut(), Ordering::Release);
        RETIRING.fetch_or(1 << index, Ordering::Relaxed);
        index
    };
    if wrong_removal() != WrongRemoval::NoGracePeriod {
        crate::task::cpus::synchronize();
    }
    let _lock = REGISTER.lock();
    if wrong_removal() != WrongRemoval::PoisonBeforeRestore {
        poison(index);
    }
    RETIRING.fetch_and(!(1 << index), Ordering::Relaxed);
    Ok(())
}

/// Refills index `index`'s XOL slot and detour trampoline in every XOL page.
fn poison(index: usize) {
    write_xol(slot_offset(index), &FILLER, 0..TASK_SLOTS);
    write_xol(detour_offset(index), &FILLER, 0..TASK_SLOTS);
}

/// Test-only wrong removal sequences (the race tests show each is caught).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum WrongRemoval {
    None = 0,
    /// The XOL slot and trampoline poisoned before the word is restored, while the BRK or B
    /// still leads there.
    PoisonBeforeRestore = 1,
    /// No grace period between the unpublish and the poisoning.
    NoGracePeriod = 2,
    /// A task interrupted inside a detour trampoline may be switched away there (the bug
    /// before issue 22's fix: its switch is a quiescent point, and the grace period can end
    /// while its PC is still in the trampoline).
    PreemptibleTrampoline = 3,
}

static WRONG_REMOVAL: AtomicUsize = AtomicUsize::new(WrongRemoval::None as usize);

pub fn set_wrong_removal(wrong: WrongRemoval) {
    WRONG_REMOVAL.store(wrong as usize, Ordering::Relaxed);
}

fn wrong_removal() -> WrongRemoval {
    match WRONG_REMOVAL.load(Ordering::Relaxed) {
        1 => WrongRemoval::PoisonBeforeRestore,
        2 => WrongRemoval::NoGracePeriod,
        3 => WrongRemoval::PreemptibleTrampoline,
        _ => WrongRemoval::None,
    }
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
/// `WrongRemoval::PreemptibleTrampoline` puts the bug back).
#[unsafe(link_section = ".text.noprobe")]
#[cold]
#[inline(never)]
fn trampoline_irq_exit() -> bool {
    if wrong_removal() == WrongRemoval::PreemptibleTrampoline {
        return false;
    }
    TRAMPOLINE_IRQ_EXITS.fetch_add(1, Ordering::Relaxed);
    true
}

/// IRQ exits that found a user task in a detour trampoline (and left it running), since boot.
pub fn trampoline_irq_exits() -> u64 {
    TRAMPOLINE_IRQ_EXITS.load(Ordering::Relaxed)
}

/// Indices unpublished whose slots are not yet poisoned (waiting for the grace period): not
/// reused until then. Written under `REGISTER`.
static RETIRING: AtomicU64 = AtomicU64::new(0);

const _: () = assert!(MAX_UPROBES <= 64, "one u64 bitmap");

/// Hits and return-handler runs of the uprobe at `address`.
pub fn counts(address: u64) -> Option<(u64, u64)> {
    lookup(address).map(|(index, _)| (HITS[index].load(Ordering::Relaxed), RETURNS[index].load(Ordering::Relaxed)))
}

/// The user address of the detour trampoline of the uprobe at `address`, if it is a detour.
pub fn detour_trampoline(address: u64) -> Option<u64> {
    lookup(address)
        .filter(|(_, probe)| matches!(probe.action, Action::Detour))
        .map(|(index, _)| USER_XOL + detour_offset(index))
}

pub use super::uretprobe::missed_returns;

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
            BRK_URETPROBE => uretprobe::on_return(frame),
            _ => false,
        },
        ExceptionClass::SoftwareStepLowerEl => {
            finish_step(frame, true) || finish_cpu_slot_step(frame, true) || foreign_step(frame)
        }
        ExceptionClass::Svc64 => on_detour(frame),
        _ => false,
    }
}

/// The record at `index` if it was unpublished and its grace period has not ended (`RETIRING`):
/// the record stays as it was until the index is poisoned and freed.
#[unsafe(link_section = ".text.noprobe")]
#[cold]
fn retiring(index: usize) -> Option<&'static Uprobe> {
    // SAFETY: a retiring index's record was initialised at its registration and is not written
    // again before `RETIRING` is cleared, after the grace period.
    (RETIRING.load(Ordering::Relaxed) & (1 << index) != 0).then(|| unsafe { &*RECORDS.pointer(index) })
}

/// Test-only: called with a software-step exception from EL0 that no uprobe step owns (the race
/// tests step an EL0 task); true when it took it. 0: none.
static FOREIGN_STEP_HOOK: AtomicUsize = AtomicUsize::new(0);

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
    HITS[index].fetch_add(1, Ordering::Relaxed);
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
        &Action::OutOfLine { hardware_step } => {
            let step = step_state();
            step.index.store(index, Ordering::Relaxed);
            step.spsr.store(frame.spsr, Ordering::Relaxed);
            step.hardware_step.store(hardware_step, Ordering::Relaxed);
            frame.elr = USER_XOL + slot_offset(index);
            // IRQs stay masked for the one instruction, so the step state is per CPU.
            frame.spsr |= SPSR_IF;
            if hardware_step {
                frame.spsr |= SPSR_SS;
                // KDE stays as it is, so EL1 is never stepped.
                set_mdscr(MDSCR_SS, true);
            }
        }
        &Action::CpuSlot { hardware_step, skip_unchanged } => {
            frame.elr = fill_cpu_slot(probe, skip_unchanged);
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
        Action::Detour => return false,
    }
    true
}

/// Whether this CPU's slot is held by a hit in progress (from the BRK to the step back), per CPU.
static CPU_SLOT_HELD: [AtomicBool; CPUS] = [const { AtomicBool::new(false) }; CPUS];
/// Hits that found their CPU's slot held and waited for it (`XolSlots::PerCpu`).
static SLOT_WAITS: AtomicU64 = AtomicU64::new(0);

/// Hits of `XolSlots::PerCpu` probes that had to wait for their CPU's slot, since boot. None can
/// today: a hit holds its slot with IRQs masked on its CPU from the BRK to the step back, so the
/// next hit on that CPU comes after (Linux steps with IRQs on and a task may sleep holding its
/// slot: there tasks wait for a free one).
pub fn slot_waits() -> u64 {
    SLOT_WAITS.load(Ordering::Relaxed)
}

/// How long a hit waits for its CPU's slot before taking it anyway (said in the log).
const SLOT_WAIT_MS: u64 = 10;

/// Takes this CPU's slot in the current task's XOL page and writes `[insn, BRK #0x120]` into
/// it (unless `skip_unchanged` and it already holds them); returns the slot's user address.
#[unsafe(link_section = ".text.noprobe")]
fn fill_cpu_slot(probe: &Uprobe, skip_unchanged: bool) -> u64 {
    let cpu = this_cpu_index();
    if CPU_SLOT_HELD[cpu].swap(true, Ordering::Acquire) {
        SLOT_WAITS.fetch_add(1, Ordering::Relaxed);
        if !crate::arch::cpu::wait_until(SLOT_WAIT_MS, || !CPU_SLOT_HELD[cpu].swap(true, Ordering::Acquire)) {
            defmt::error!("uprobe: cpu {=usize}'s XOL slot still held after {=u64} ms: taken", cpu, SLOT_WAIT_MS);
        }
    }
    let offset = cpu_slot_offset(cpu);
    let words = [probe.original, encode_brk(BRK_UPROBE_STEP).0];
    // SAFETY: the current task's XOL page, offset inside it (the assertion by CPU_SLOTS_OFFSET).
    let slot = unsafe { user::xol_page(crate::task::current().0).add(offset as usize / 4) };
    // SAFETY: two words of this CPU's slot, kernel data; only this CPU reads or writes it now.
    let unchanged = unsafe { slot.read_volatile() == words[0] && slot.add(1).read_volatile() == words[1] };
    if !(skip_unchanged && unchanged) {
        // SAFETY: this CPU's slot of the running task's XOL page: no other CPU executes it (the
        // task runs here, IRQs masked until its step back).
        unsafe { patch::write_code_alias(slot, &words) };
    }
    USER_XOL + offset
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
    let probe = unsafe { &*RECORDS.pointer(index) };
    if !matches!(probe.action, Action::CpuSlot { .. }) {
        return false;
    }
    return_from_step(frame, step, probe, hardware_step);
    CPU_SLOT_HELD[cpu].store(false, Ordering::Release);
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
    let probe = unsafe { &*RECORDS.pointer(index) };
    return_from_step(frame, step, probe, hardware_step);
    true
}

#[unsafe(link_section = ".text.noprobe")]
fn on_detour(frame: &mut ExceptionFrame) -> bool {
    let offset = frame.elr.wrapping_sub(4).wrapping_sub(USER_XOL + DETOUR_OFFSET);
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
    HITS[index].fetch_add(1, Ordering::Relaxed);
    let resume = frame.elr;
    frame.elr = probe.address;
    (probe.handler)(registers(frame));
    frame.elr = resume;
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
            CPU_SLOT_HELD[this_cpu_index()].store(false, Ordering::Release);
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
        && matches!(probe.action, Action::Detour)
    {
        return probe.address;
    }
    elr
}
