//! User-space probes (uprobes) on EL0 code: registration, the records and their publication.
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
//!   is `[SVC #0x550, insn, B address + 4]`: one (cheaper, SVC) round trip, then the displaced
//!   instruction runs natively at EL0.
//!
//! Where a stepped probe's instruction runs ([`XolSlots`], chosen per probe at registration):
//! `PerProbe` (the default) is the probe's own slot, written once at registration (and into
//! each new space); `PerCpu` is this CPU's slot, rewritten at every hit (Linux's dynamic XOL
//! slots), optionally skipping the write and its cache maintenance when the slot already holds
//! the instruction. A `PerCpu` hit holds its CPU's slot from the BRK to the step back (IRQs
//! masked) and counts a wait if it ever finds the slot held ([`slot_waits`]).
//!
//! Files: this one (registration), `uprobe_hit.rs` (the hit path, `.text.noprobe`),
//! `uprobe_xol.rs` (the XOL page), `uretprobe.rs` (return instances). Records are published
//! lock-free (`cells::Records`, one pointer per index), so a hit takes no lock.

use core::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use super::action::{Action, CpuSlot};
use super::cells::Records;
use super::uprobe_xol::{FILLER, SVC_DETOUR, detour_offset, slot_offset, write_xol};
use super::{Handler, ProbeError, uretprobe};
use crate::arch::patch;
use crate::arch::percpu::{CPUS, cpu_data};
use crate::inject::{self, Fault};
use crate::sync::IrqSpinLock;
use crate::task::stacks::TASK_SLOTS;
use crate::task::user::{self, USER_XOL};
use probes::{Insn, Method, Rules, Text, classify, encode_b, encode_brk};

/// BRK immediate of a uprobe (Linux's uprobe value); the step back's and the detour SVC's are
/// the XOL page's, the return's is `uretprobe::BRK_URETPROBE`.
pub const BRK_UPROBE: u16 = 0x005;
pub use super::uprobe_xol::{BRK_UPROBE_STEP, MAX_UPROBES, SVC_UPROBE_DETOUR, slot_waits};
pub use super::uretprobe::missed_returns;

/// Where a stepped uprobe's displaced instruction runs.
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

/// One uprobe's record. `repr(C)` with the hit count first: the hit path's counter increment is
/// an exclusive-load/store pair on the record pointer itself, with no offset to add.
#[repr(C)]
pub(super) struct Uprobe {
    /// Hits since registration.
    pub(super) hits: AtomicU64,
    pub(super) address: u64,
    kernel_address: u64,
    pub(super) original: u32,
    pub(super) action: Action<CpuSlot>,
    pub(super) handler: Handler,
    pub(super) return_handler: Option<Handler>,
}

/// Probe records by index (the index names its XOL slot and trampoline), and the published
/// pointer to each (null: free).
static RECORDS: Records<Uprobe, MAX_UPROBES> = Records::new();
static PUBLISHED: [AtomicPtr<Uprobe>; MAX_UPROBES] = [const { AtomicPtr::new(core::ptr::null_mut()) }; MAX_UPROBES];
/// Serialises registration; the hit path never takes it.
static REGISTER: IrqSpinLock<()> = IrqSpinLock::new(());

/// Indices unpublished whose slots are not yet poisoned (waiting for the grace period): not
/// reused until then. Written under `REGISTER`.
static RETIRING: AtomicU64 = AtomicU64::new(0);

const _: () = assert!(MAX_UPROBES <= 64, "one u64 bitmap");

/// No step in flight (`UserStepControl::index`).
pub(super) const NO_STEP: usize = usize::MAX;

/// The published record at `index`, if any.
#[inline(always)]
pub(super) fn published(index: usize) -> Option<&'static Uprobe> {
    let pointer = PUBLISHED[index].load(Ordering::Acquire);
    // SAFETY: a published pointer points at an initialised record (see `cells::Records`).
    (!pointer.is_null()).then(|| unsafe { &*pointer })
}

#[inline(always)]
pub(super) fn lookup(address: u64) -> Option<(usize, &'static Uprobe)> {
    (0..MAX_UPROBES).find_map(|index| published(index).filter(|probe| probe.address == address).map(|p| (index, p)))
}

/// The record at `index`, published or not.
///
/// # Safety
/// A probe of `index` was registered, and the grace period after its unpublish has not ended
/// (the caller's hit began before it, and holds it off).
#[inline(always)]
pub(super) unsafe fn record(index: usize) -> &'static Uprobe {
    // SAFETY: the caller's contract: the record was initialised at registration and is
    // rewritten only by a new registration of the index, after that grace period.
    unsafe { &*RECORDS.pointer(index) }
}

/// The record at `index` if it was unpublished and its grace period has not ended (`RETIRING`):
/// the record stays as it was until the index is poisoned and freed.
#[unsafe(link_section = ".text.noprobe")]
#[cold]
pub(super) fn retiring(index: usize) -> Option<&'static Uprobe> {
    // SAFETY: a retiring index's record was initialised at its registration and is not written
    // again before `RETIRING` is cleared, after the grace period.
    (RETIRING.load(Ordering::Relaxed) & (1 << index) != 0).then(|| unsafe { &*RECORDS.pointer(index) })
}

/// The words a probe owns in every XOL page: (offset, words).
fn xol_words(index: usize, probe: &Uprobe) -> Result<(u64, [u32; 3]), ProbeError> {
    match probe.action {
        Action::OutOfLine { .. } => {
            Ok((slot_offset(index), [probe.original, encode_brk(BRK_UPROBE_STEP).0, encode_brk(BRK_UPROBE_STEP).0]))
        }
        Action::Detour { trampoline } => {
            let back = encode_b(trampoline + 8, probe.address + 4).map_err(|_| ProbeError::OutOfBranchRange)?;
            Ok((detour_offset(index), [SVC_DETOUR, probe.original, back.0]))
        }
        Action::Simulate(_) | Action::SimulateFramePush | Action::CpuSlot(_) => {
            Ok((slot_offset(index), [encode_brk(BRK_UPROBE_STEP).0; 3]))
        }
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

/// Points every CPU's step state where the test-only `Fault::UserStepStateShared` says: at its
/// own (the correct state), or at CPU 0's, the single global state uprobes had before SMP (two
/// CPUs stepping at once then overwrite each other's). Called under `REGISTER` while no index
/// is published or retiring, so no step is in flight; the hit path only loads the pointer. A
/// CPU already pointing where the fault says is left alone, so without the fault nothing is
/// ever written here.
fn point_step_states() {
    let shared = inject::on(Fault::UserStepStateShared);
    let first = &cpu_data(0).user_step_own;
    for cpu in 0..CPUS {
        let data = cpu_data(cpu);
        let state = core::ptr::from_ref(if shared { first } else { &data.user_step_own }).cast_mut();
        if data.user_step.load(Ordering::Relaxed) != state {
            data.user_step_own.index.store(NO_STEP, Ordering::Relaxed);
            data.user_step.store(state, Ordering::Release);
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
    if retiring == 0 && (0..MAX_UPROBES).all(|index| published(index).is_none()) {
        point_step_states();
    }
    let index = (0..MAX_UPROBES)
        .find(|&index| published(index).is_none() && retiring & (1 << index) == 0)
        .ok_or(ProbeError::NoSpace)?;
    // SAFETY: kernel_address is user text inside the kernel image, mapped readable.
    let original = unsafe { core::ptr::read_volatile(kernel_address as *const u32) };
    let rules = Rules { text: Text::User, stack_reach: 0, post_handler: false };
    let plan = probes::plan(method, &classify(Insn(original)), &rules)
        .map_err(|refusal| ProbeError::refused(refusal, Text::User))?;
    let planned = Action::planned(plan, USER_XOL + slot_offset(index), USER_XOL + detour_offset(index));
    let action = match slots {
        XolSlots::PerProbe => planned,
        XolSlots::PerCpu { skip_unchanged } => planned.in_cpu_slot(skip_unchanged),
    };
    let probe = Uprobe { hits: AtomicU64::new(0), address, kernel_address, original, action, handler, return_handler };
    let (offset, words) = xol_words(index, &probe)?;
    let patched = match action {
        Action::Detour { trampoline } => encode_b(address, trampoline).map_err(|_| ProbeError::OutOfBranchRange)?.0,
        _ => encode_brk(BRK_UPROBE).0,
    };
    write_xol(offset, &words, 0..TASK_SLOTS);
    uretprobe::clear_returns(index);
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
/// there (`uprobe_hit::in_detour_trampoline`): a task switch, the quiescent point, happens only outside
/// every trampoline, so the grace period covers tasks in trampolines too, on other CPUs (whose
/// IRQ exits defer the reschedule until the task left it; `synchronize` resends its wake-up)
/// and on this one (the caller runs only once such a task was switched away, outside)
/// (docs/design/races.md).
pub fn unregister(address: u64) -> Result<(), ProbeError> {
    // Test-only wrong sequences, read once so that one removal follows one of them.
    let poison_first = inject::on(Fault::UprobePoisonBeforeRestore);
    let no_grace_period = inject::on(Fault::UprobeFreedWithoutGracePeriod);
    let index = {
        let _lock = REGISTER.lock();
        let (index, probe) = lookup(address).ok_or(ProbeError::NotRegistered)?;
        if poison_first {
            poison(index);
        }
        // SAFETY: as in register: the original instruction replaces the BRK/B.
        unsafe { patch::write_instruction(probe.kernel_address, probe.original) };
        PUBLISHED[index].store(core::ptr::null_mut(), Ordering::Release);
        RETIRING.fetch_or(1 << index, Ordering::Relaxed);
        index
    };
    if !no_grace_period {
        crate::task::cpus::synchronize();
    }
    let _lock = REGISTER.lock();
    if !poison_first {
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

/// Hits and return-handler runs of the uprobe at `address`.
pub fn counts(address: u64) -> Option<(u64, u64)> {
    lookup(address).map(|(index, probe)| (probe.hits.load(Ordering::Relaxed), uretprobe::returns(index)))
}

/// The user address of the detour trampoline of the uprobe at `address`, if it is a detour.
pub fn detour_trampoline(address: u64) -> Option<u64> {
    lookup(address).and_then(|(_, probe)| match probe.action {
        Action::Detour { trampoline } => Some(trampoline),
        _ => None,
    })
}
