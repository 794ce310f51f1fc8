//! Kernel probes: register a handler on a kernel text address, and run it on every hit.
//!
//! A kernel probe performs its displaced instruction in the way its [`Method`] says:
//! - [`Method::SingleStep`]: a `BRK #0x004` traps; the handler runs; the instruction executes from
//!   the probe's out-of-line (XOL) slot `[insn, BRK #0x006]` under hardware single-step
//!   (MDSCR_EL1.SS, SPSR.SS; ARM ARM D2.12), and the step exception resumes at `address + 4`.
//! - [`Method::BrkStep`]: the same slot, but the `BRK #0x006` after the instruction brings the CPU
//!   back (Linux kprobes' way), no hardware step.
//! - [`Method::Simulate`]: `crates/probes` emulates the instruction on the saved registers and
//!   memory in the BRK handler; no slot. The frame push `stp x29, x30, [sp, #-16]!` is performed
//!   directly (`Plan::SimulateFramePush`).
//! - [`Method::Detour`]: the instruction is replaced by `B trampoline`; the per-probe trampoline
//!   saves the registers, calls the pre-handler, restores, performs the displaced instruction
//!   (relocated by `crates/probes`) and branches back; no exception at all.
//!
//! Slots and trampolines are generated once, at registration (`kprobe_slots.rs`); the hit path
//! (`kprobe_hit.rs`) finds a probe by PC in a lock-free table and never allocates or decodes. What a
//! probe may not be placed on, and why, is in `refuse.rs`, `probes::plan` and [`ProbeError`].

use core::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use super::action::Action;
use super::cells::Records;
use super::kprobe_slots as slots;
use super::{Handler, ProbeError, refuse};
use crate::arch::exception::BRK_KPROBE;
use crate::arch::patch;
use crate::inject::{self, Fault};
use probes::{Insn, Method, Plan, Rules, Text, classify, encode_brk};

/// One registered probe. Written only under [`REGISTRY`] while unpublished; read lock-free by
/// the hit path once published in [`TABLE`].
pub struct Probe {
    pub(super) address: u64,
    original: u32,
    pub(super) action: Action,
    pub(super) pre: Handler,
    pub(super) post: Option<Handler>,
    /// Slot-area chunk owned by this probe, if any.
    chunk: Option<usize>,
    pub(super) hits: AtomicU64,
    pub(super) missed: AtomicU64,
    /// Detour hits whose pre-handler changed `pc` or `sp`, refused (`kprobe_hit.rs`).
    pub(super) refused: AtomicU64,
}

/// Probe records, and the number of them.
const MAX_PROBES: usize = slots::CHUNKS;

static RECORDS: Records<Probe, MAX_PROBES> = Records::new();

fn record_pointer(record: usize) -> *mut Probe {
    RECORDS.pointer(record)
}

/// Open-addressed PC -> probe table: null = empty, `TOMBSTONE` = removed.
const TABLE_SIZE: usize = 256;
static TABLE: [AtomicPtr<Probe>; TABLE_SIZE] = [const { AtomicPtr::new(core::ptr::null_mut()) }; TABLE_SIZE];
const TOMBSTONE: *mut Probe = core::ptr::dangling_mut::<Probe>();

/// The records of the probes being unregistered, between their unpublish and the end of the
/// hold that restores their words (one bit per record): lookups no longer find them, but a CPU
/// that fetched a BRK before the restore may still take it and must perform it (`retiring`).
/// Written under [`REGISTRY`].
static RETIRING: AtomicU64 = AtomicU64::new(0);

/// The probe at `address` if it is being unregistered and its word may still hold its BRK (a
/// BRK no published probe owns: the hit path's cold side).
pub(super) fn retiring(address: u64) -> Option<&'static Probe> {
    let mut retiring = RETIRING.load(Ordering::Acquire);
    while retiring != 0 {
        // SAFETY: a set bit names a live record (cleared before the record is freed).
        let probe = unsafe { &*record_pointer(retiring.trailing_zeros() as usize) };
        if probe.address == address {
            return Some(probe);
        }
        retiring &= retiring - 1;
    }
    None
}

/// Registration state: which records and slot chunks are taken.
struct Registry {
    records_used: u64,
    chunks_used: u64,
}

/// A raw spin lock, not an `IrqSpinLock`: its holder holds the other CPUs
/// (`task::cpus::with_others_held`, a wake SGI each must take), so a CPU waiting for it must
/// wait with IRQs unmasked, or neither would ever go on.
static REGISTRY: spin::Mutex<Registry> = spin::Mutex::new(Registry { records_used: 0, chunks_used: 0 });

const _: () = assert!(MAX_PROBES <= 64 && slots::CHUNKS <= 64, "one u64 bitmap each");

#[inline(always)]
fn table_index(address: u64) -> usize {
    ((address >> 2).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as usize % TABLE_SIZE
}

/// The probe at `address`, if one is published. Lock-free, O(1) expected.
#[inline(always)]
pub(super) fn lookup(address: u64) -> Option<&'static Probe> {
    let mut index = table_index(address);
    for _ in 0..TABLE_SIZE {
        let entry = TABLE[index].load(Ordering::Acquire);
        if entry.is_null() {
            return None;
        }
        if entry != TOMBSTONE {
            // SAFETY: published entries point at initialised records in RECORDS (see Records).
            let probe = unsafe { &*entry };
            if probe.address == address {
                return Some(probe);
            }
        }
        index = (index + 1) % TABLE_SIZE;
    }
    None
}

/// Registers a probe at kernel text `address`. `post` runs after the displaced instruction
/// (not with `Detour`).
pub fn register(address: u64, method: Method, pre: Handler, post: Option<Handler>) -> Result<(), ProbeError> {
    let mut result = [Ok(())];
    register_all(&[(address, method)], pre, post, &mut result);
    result[0]
}

/// Registers a probe at each `(address, method)` of `probes`, with the same handlers, and puts
/// each one's outcome in `results` (Linux's `register_kprobes`, though a refusal does not undo
/// the others): every probe is prepared and published first, then all the words are armed in
/// one hold of the other CPUs. A hold is an SGI round trip through every CPU; the probe sweep
/// arms 48 words a batch.
pub fn register_all(
    probes: &[(u64, Method)],
    pre: Handler,
    post: Option<Handler>,
    results: &mut [Result<(), ProbeError>],
) {
    let mut registry = REGISTRY.lock();
    let mut words = [(0u64, 0u32); MAX_PROBES];
    let mut count = 0;
    for (&(address, method), result) in probes.iter().zip(results.iter_mut()) {
        *result = prepare(&mut registry, address, method, pre, post).map(|patched| {
            // `None`: a test-only fault already wrote the branch.
            if let Some(patched) = patched {
                words[count] = (address, patched);
                count += 1;
            }
        });
    }
    write_probed_words(&words[..count]);
}

/// Register's first half, under the registry lock: the probe refused or its record, slot or
/// trampoline written and the probe published; returns the word that arms it (its BRK or its
/// branch), still to be written.
fn prepare(
    registry: &mut Registry,
    address: u64,
    method: Method,
    pre: Handler,
    post: Option<Handler>,
) -> Result<Option<u32>, ProbeError> {
    if address & 3 != 0 {
        return Err(ProbeError::Misaligned);
    }
    refuse::check_address(address)?;
    if lookup(address).is_some() {
        return Err(ProbeError::AlreadyRegistered);
    }
    // SAFETY: address is 4-aligned kernel text (checked above), always mapped readable.
    let original = unsafe { core::ptr::read_volatile(address as *const u32) };
    refuse::check_exclusive_window(address)?;
    let classification = classify(Insn(original));
    let rules = Rules { text: Text::Kernel, stack_reach: probes::KERNEL_STACK_REACH, post_handler: post.is_some() };
    let plan =
        probes::plan(method, &classification, &rules).map_err(|refusal| ProbeError::refused(refusal, Text::Kernel))?;
    let record = (!registry.records_used).trailing_zeros() as usize;
    if record >= MAX_PROBES {
        return Err(ProbeError::NoSpace);
    }
    let chunk = if matches!(plan, Plan::OutOfLine { .. } | Plan::Detour) {
        let chunk = (!registry.chunks_used).trailing_zeros() as usize;
        if chunk >= slots::CHUNKS {
            return Err(ProbeError::NoSpace);
        }
        Some(chunk)
    } else {
        None
    };
    let place = chunk.map_or(0, slots::chunk_address);
    let action = Action::planned(plan, place, place);
    let mut early_branch = false;
    match action {
        Action::OutOfLine { slot, .. } => slots::write_out_of_line(slot, original),
        Action::Detour { trampoline } => {
            let probe_pointer = record_pointer(record) as u64;
            if inject::on(Fault::DetourBranchBeforeTrampoline)
                && let Ok(branch) = probes::encode_b(address, trampoline)
            {
                // SAFETY: as the final write below (deliberately too early: a test-only fault).
                unsafe { patch::write_instruction(address, branch.word()) };
                early_branch = true;
            }
            slots::write_detour(trampoline, address, original, &classification, probe_pointer)?;
        }
        Action::Simulate(_) | Action::SimulateFramePush => {}
        Action::CpuSlot(never) => match never {},
    }
    let probe = Probe {
        address,
        original,
        action,
        pre,
        post,
        chunk,
        hits: AtomicU64::new(0),
        missed: AtomicU64::new(0),
        refused: AtomicU64::new(0),
    };
    // SAFETY: the record is free (its bit is clear) and unpublished; we hold the lock.
    unsafe { record_pointer(record).write(probe) };
    registry.records_used |= 1 << record;
    if let Some(chunk) = chunk {
        registry.chunks_used |= 1 << chunk;
    }
    publish(address, record_pointer(record));
    let patched = match action {
        Action::Detour { trampoline } => match probes::encode_b(address, trampoline) {
            Ok(branch) => branch.word(),
            Err(_) => {
                unpublish(address);
                release(registry, record, chunk);
                return Err(ProbeError::OutOfBranchRange);
            }
        },
        _ => encode_brk(BRK_KPROBE).word(),
    };
    Ok((!early_branch).then_some(patched))
}

/// Unregisters the probe at `address`, restoring the original instruction, and returns once no
/// CPU can still be inside its handler, XOL slot or detour trampoline ([`unregister_all`] with
/// one address).
pub fn unregister(address: u64) -> Result<(), ProbeError> {
    unregister_all(&[address])
}

/// Unregisters the probes at every address of `addresses` with one hold and one grace period
/// for them all (Linux's `unregister_kprobes`), and returns once no CPU can still be inside any
/// of their handlers, XOL slots or detour trampolines:
/// - Under the registry lock each probe is unpublished (and marked `RETIRING`), then all their
///   words are restored in one hold of the other CPUs (`write_probed_words`). A CPU that
///   fetched a BRK before its restore may take it meanwhile and finds the probe as retiring.
///   BRK hits run with IRQs masked from the BRK to the end of the slot, so once every other CPU
///   took the hold's SGI none is inside such a probe.
/// - A detour's hits run with the IRQs of the probed code, so if the batch has a detour the lock
///   is dropped for a grace period (`task::cpus::synchronize`: a CPU spinning on the lock would
///   never pass a quiescent point).
/// - Then each slot or trampoline is poisoned (refilled with `BRK #0x006`, which no CPU that is
///   not stepping that slot may execute: a late executor faults) and the record and chunk freed.
///
/// An address that holds no probe is skipped, the others are unregistered, and the first such
/// error is returned. Call it with no lock held that another CPU may spin on with IRQs masked.
pub fn unregister_all(addresses: &[u64]) -> Result<(), ProbeError> {
    let mut retired = [None::<Retired>; MAX_PROBES];
    let mut first_error = Ok(());
    let registry = REGISTRY.lock();
    let mut words = [(0u64, 0u32); MAX_PROBES];
    let mut count = 0;
    let mut needs_grace_period = false;
    let no_grace_period = inject::on(Fault::KprobeFreedWithoutGracePeriod);
    for &address in addresses {
        // An address given twice is not found the second time: it is unpublished already.
        let Some(probe) = lookup(address) else {
            first_error = first_error.and(Err(ProbeError::NotRegistered));
            continue;
        };
        let record = (0..MAX_PROBES).find(|&record| core::ptr::eq(record_pointer(record), probe));
        let cleared = inject::on(Fault::DetourTrampolineClearedFirst);
        if cleared && let Some(chunk) = probe.chunk {
            slots::clear(slots::chunk_address(chunk));
        }
        if let Some(record) = record {
            RETIRING.fetch_or(1 << record, Ordering::Release);
        }
        unpublish(address);
        needs_grace_period |= matches!(probe.action, Action::Detour { .. }) && !no_grace_period;
        retired[count] = Some(Retired { record, chunk: probe.chunk, cleared });
        words[count] = (address, probe.original);
        count += 1;
    }
    if no_grace_period {
        for &(address, original) in &words[..count] {
            // SAFETY: as in `write_probed_words` (deliberately not holding the other CPUs
            // either: nothing waits for a CPU inside the probe; a test-only fault).
            unsafe { patch::write_instruction(address, original) };
        }
    } else {
        write_probed_words(&words[..count]);
    }
    // Every other CPU took the hold's SGI after the restores: none can take these BRKs any more.
    // (Only this lock's holder sets bits.)
    RETIRING.store(0, Ordering::Release);
    // The records and chunks stay taken (their bits set) until the grace period has elapsed.
    drop(registry);
    if needs_grace_period {
        crate::task::cpus::synchronize();
    }
    retired.into_iter().flatten().for_each(finish);
    first_error
}

/// A probe disarmed and unpublished whose trampoline and record are not free yet.
#[derive(Clone, Copy)]
struct Retired {
    record: Option<usize>,
    chunk: Option<usize>,
    /// Its trampoline was cleared before the restore (the test-only `Fault::DetourTrampolineClearedFirst`).
    cleared: bool,
}

/// Unregister's second half, after the grace period: the trampoline cleared (poisoned) and the
/// record and chunk freed.
fn finish(retired: Retired) {
    let mut registry = REGISTRY.lock();
    if !retired.cleared
        && let Some(chunk) = retired.chunk
    {
        slots::clear(slots::chunk_address(chunk));
    }
    if let Some(record) = retired.record {
        release(&mut registry, record, retired.chunk);
    }
}

/// Arms (BRK or B) or disarms (the original) the probed words, `(address, word)`, at kernel text
/// addresses, in one hold of every other CPU (`task::cpus::with_others_held`): an arbitrary
/// instruction <-> BRK or B is not a change ARM ARM B2.2.5 allows concurrently with execution,
/// and a CPU that executed or fetched the old word meanwhile could keep running it after a later
/// grace period (seen as a stale translated block under multi-threaded TCG: docs/design/smp.md).
/// One hold for the batch: a hold is an SGI round trip through every CPU.
fn write_probed_words(words: &[(u64, u32)]) {
    let write_all = || {
        for &(address, word) in words {
            // SAFETY: address is a probed kernel text word (4-aligned, checked at registration),
            // and no other CPU runs meanwhile (but under the test-only `Fault::KprobePatchedUnheld`).
            unsafe { patch::write_instruction(address, word) }
        }
    };
    if words.is_empty() {
        return;
    }
    if inject::on(Fault::KprobePatchedUnheld) {
        write_all();
    } else {
        crate::task::cpus::with_others_held(write_all);
    }
}

fn release(registry: &mut Registry, record: usize, chunk: Option<usize>) {
    // The record's bytes stay as they are (Probe has no destructor); its bit marks it free.
    registry.records_used &= !(1 << record);
    if let Some(chunk) = chunk {
        registry.chunks_used &= !(1 << chunk);
    }
}

fn publish(address: u64, probe: *mut Probe) {
    let mut index = table_index(address);
    loop {
        let entry = TABLE[index].load(Ordering::Relaxed);
        if entry.is_null() || entry == TOMBSTONE {
            TABLE[index].store(probe, Ordering::Release);
            return;
        }
        index = (index + 1) % TABLE_SIZE;
    }
}

fn unpublish(address: u64) {
    let mut index = table_index(address);
    for _ in 0..TABLE_SIZE {
        let entry = TABLE[index].load(Ordering::Relaxed);
        if entry.is_null() {
            return;
        }
        // SAFETY: published entries point at live records.
        if entry != TOMBSTONE && unsafe { (*entry).address } == address {
            TABLE[index].store(TOMBSTONE, Ordering::Release);
            return;
        }
        index = (index + 1) % TABLE_SIZE;
    }
}

/// Hits and missed (re-entrant) hits of the probe at `address`.
pub fn counts(address: u64) -> Option<(u64, u64)> {
    lookup(address).map(|probe| (probe.hits.load(Ordering::Relaxed), probe.missed.load(Ordering::Relaxed)))
}

/// How many hits of the detour probe at `address` had a pre-handler's change of `pc` or `sp`
/// refused (a detour cannot redirect; other methods' hits are not counted here).
pub fn refused_changes(address: u64) -> Option<u64> {
    lookup(address).map(|probe| probe.refused.load(Ordering::Relaxed))
}

/// The start of the slot area (for the no-probe checks in the tests).
pub fn slot_area_address() -> u64 {
    slots::chunk_address(0)
}

/// The slot area's size in bytes.
pub const SLOT_AREA_SIZE: u64 = slots::AREA_SIZE;

/// The first patchable function entry outside the no-probe text, if the build has any (for the
/// tests).
pub fn first_patchable_entry() -> Option<u64> {
    refuse::patchable_entries().iter().copied().find(|&entry| !refuse::is_noprobe(entry))
}
