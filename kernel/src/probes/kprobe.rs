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
    /// The word that arms it (its BRK or its branch), written by the hold after `prepare`.
    armed: u32,
    /// Slot-area chunk owned by this probe, if any.
    chunk: Option<u8>,
    pub(super) hits: AtomicU64,
    pub(super) missed: AtomicU64,
    /// Detour hits whose pre-handler changed `pc` or `sp`, refused (`kprobe_hit.rs`).
    pub(super) refused: AtomicU64,
}

/// Probe records, and the number of them: two sweep batches of 120 at once while
/// [`replace_all`] swaps one for the next, and the workload's own probe.
const MAX_PROBES: usize = slots::CHUNKS;

static RECORDS: Records<Probe, MAX_PROBES> = Records::new();

fn record_pointer(record: usize) -> *mut Probe {
    RECORDS.pointer(record)
}

/// Open-addressed PC -> probe table: null = empty, `TOMBSTONE` = removed. Four entries per
/// record, so that with every record published a miss still meets an empty entry within a few
/// (a lookup's cost on the hit path does not depend on the size: one multiply and one shift).
const TABLE_SHIFT: u32 = 10;
const TABLE_SIZE: usize = 1 << TABLE_SHIFT;
static TABLE: [AtomicPtr<Probe>; TABLE_SIZE] = [const { AtomicPtr::new(core::ptr::null_mut()) }; TABLE_SIZE];
const TOMBSTONE: *mut Probe = core::ptr::dangling_mut::<Probe>();

/// The records of the probes being unregistered, between their unpublish and the end of the
/// hold that restores their words (one bit per record): lookups no longer find them, but a CPU
/// that fetched a BRK before the restore may still take it and must perform it (`retiring`).
/// Written under [`REGISTRY`].
static RETIRING: [AtomicU64; MAX_PROBES / 64] = [const { AtomicU64::new(0) }; MAX_PROBES / 64];

/// The probe at `address` if it is being unregistered and its word may still hold its BRK (a
/// BRK no published probe owns: the hit path's cold side).
pub(super) fn retiring(address: u64) -> Option<&'static Probe> {
    for (word, bits) in RETIRING.iter().enumerate() {
        let mut retiring = bits.load(Ordering::Acquire);
        while retiring != 0 {
            // SAFETY: a set bit names a live record (cleared before the record is freed).
            let probe = unsafe { &*record_pointer(64 * word + retiring.trailing_zeros() as usize) };
            if probe.address == address {
                return Some(probe);
            }
            retiring &= retiring - 1;
        }
    }
    None
}

/// The instruction the code at `address` holds for its readers: a published or retiring probe's
/// original, or the text's word. Registration plans on it and scans it for exclusives, so that a
/// probe still armed (or being disarmed in the same hold) does not show its BRK or branch.
fn original_word(address: u64) -> u32 {
    // SAFETY: callers pass 4-aligned kernel text (checked by `refuse::check_address`, or below
    // an address so checked and not below the text's start), always mapped readable.
    let word = unsafe { core::ptr::read_volatile(address as *const u32) };
    // Only a BRK or a B can be a probe's (the exclusive scan reads 16 words a probe: most are
    // neither, and skip the table and the retiring list).
    if word != encode_brk(BRK_KPROBE).word() && !probes::is_b(word) {
        return word;
    }
    lookup(address).or_else(|| retiring(address)).map_or(word, |probe| probe.original)
}

/// Which records or slot chunks are taken: a bit each.
#[derive(Clone, Copy)]
struct Taken([u64; MAX_PROBES / 64]);

impl Taken {
    const NONE: Taken = Taken([0; MAX_PROBES / 64]);

    /// The lowest free index, if any.
    fn first_free(&self) -> Option<usize> {
        let (word, bits) = self.0.iter().enumerate().find(|&(_, &bits)| bits != u64::MAX)?;
        Some(64 * word + (!bits).trailing_zeros() as usize)
    }

    fn take(&mut self, index: usize) {
        self.0[index / 64] |= 1 << (index % 64);
    }

    fn free(&mut self, index: usize) {
        self.0[index / 64] &= !(1 << (index % 64));
    }
}

/// Registration state: which records and slot chunks are taken.
struct Registry {
    records_used: Taken,
    chunks_used: Taken,
}

/// A raw spin lock, not an `IrqSpinLock`: its holder holds the other CPUs
/// (`task::cpus::with_others_held`, a wake SGI each must take), so a CPU waiting for it must
/// wait with IRQs unmasked, or neither would ever go on.
static REGISTRY: spin::Mutex<Registry> =
    spin::Mutex::new(Registry { records_used: Taken::NONE, chunks_used: Taken::NONE });

const _: () = assert!(MAX_PROBES == slots::CHUNKS, "one `Taken` shape for records and chunks");
const _: () = assert!(MAX_PROBES.is_multiple_of(64), "RETIRING and Taken: whole u64 bitmaps");
const _: () = assert!(MAX_PROBES <= 256, "Retired, Arming and Probe keep indices in bytes");
const _: () = assert!(TABLE_SIZE >= 4 * MAX_PROBES, "the table stays at most a quarter full");

#[inline(always)]
fn table_index(address: u64) -> usize {
    ((address >> 2).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - TABLE_SHIFT)) as usize
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
/// arms 120 words a batch.
pub fn register_all(
    probes: &[(u64, Method)],
    pre: Handler,
    post: Option<Handler>,
    results: &mut [Result<(), ProbeError>],
) {
    let mut registry = REGISTRY.lock();
    let mut arming = Arming::new();
    arming.prepare_all(&mut registry, &[], probes, pre, post, results);
    write_probed_words(None, Some(&arming));
}

/// Probes prepared and still to be armed (their records: each holds its address and the word
/// that arms it), and the records whose publication waits for the hold (a probe at an address
/// being disarmed in the same hold). Record indices, a byte each: two batches' worth of these
/// and of [`Retiring`] sit on the caller's stack.
struct Arming {
    records: [u8; MAX_PROBES],
    count: usize,
    /// Records to publish inside the hold, before the words are written.
    deferred: [u8; MAX_PROBES],
    deferred_count: usize,
}

impl Arming {
    fn new() -> Self {
        Self { records: [0; MAX_PROBES], count: 0, deferred: [0; MAX_PROBES], deferred_count: 0 }
    }

    /// Prepares each probe of `probes` (its outcome in `results`). A probe at an address of
    /// `retiring` (unpublished, its word still armed) is published only inside the hold, after
    /// that word is restored: published earlier, a CPU taking the old BRK would find the new
    /// probe and perform it with the old one's word.
    fn prepare_all(
        &mut self,
        registry: &mut Registry,
        retiring: &[u64],
        probes: &[(u64, Method)],
        pre: Handler,
        post: Option<Handler>,
        results: &mut [Result<(), ProbeError>],
    ) {
        for (index, (&(address, method), result)) in probes.iter().zip(results.iter_mut()).enumerate() {
            let defer = retiring.contains(&address);
            // A deferred probe is not published yet: an earlier one at the same address counts.
            if defer && probes[..index].iter().any(|&(earlier, _)| earlier == address) {
                *result = Err(ProbeError::AlreadyRegistered);
                continue;
            }
            *result = prepare(registry, address, method, pre, post, !defer).map(|(record, to_arm)| {
                if defer {
                    self.deferred[self.deferred_count] = record as u8;
                    self.deferred_count += 1;
                }
                // False: a test-only fault already wrote the branch.
                if to_arm {
                    self.records[self.count] = record as u8;
                    self.count += 1;
                }
            });
        }
    }
}

/// Register's first half, under the registry lock: the probe refused or its record, slot or
/// trampoline written and the probe published (unless `publish_now` is false: the caller
/// publishes it); returns its record and whether the word that arms it (its BRK or its branch,
/// `Probe::armed`) is still to be written.
fn prepare(
    registry: &mut Registry,
    address: u64,
    method: Method,
    pre: Handler,
    post: Option<Handler>,
    publish_now: bool,
) -> Result<(usize, bool), ProbeError> {
    if address & 3 != 0 {
        return Err(ProbeError::Misaligned);
    }
    refuse::check_address(address)?;
    if lookup(address).is_some() {
        return Err(ProbeError::AlreadyRegistered);
    }
    let original = original_word(address);
    refuse::check_exclusive_window(address, original_word)?;
    let classification = classify(Insn(original));
    let rules = Rules { text: Text::Kernel, stack_reach: probes::KERNEL_STACK_REACH, post_handler: post.is_some() };
    let plan =
        probes::plan(method, &classification, &rules).map_err(|refusal| ProbeError::refused(refusal, Text::Kernel))?;
    let record = registry.records_used.first_free().ok_or(ProbeError::NoSpace)?;
    let chunk = if matches!(plan, Plan::OutOfLine { .. } | Plan::Detour) {
        Some(registry.chunks_used.first_free().ok_or(ProbeError::NoSpace)?)
    } else {
        None
    };
    let place = chunk.map_or(0, slots::chunk_address);
    let action = Action::planned(plan, place, place);
    let mut early_branch = false;
    match action {
        Action::OutOfLine { slot, .. } => slots::write_out_of_line(slot, original, address),
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
    let armed = match action {
        Action::Detour { trampoline } => match probes::encode_b(address, trampoline) {
            Ok(branch) => branch.word(),
            Err(_) => return Err(ProbeError::OutOfBranchRange),
        },
        _ => encode_brk(BRK_KPROBE).word(),
    };
    let probe = Probe {
        address,
        original,
        armed,
        action,
        pre,
        post,
        chunk: chunk.map(|chunk| chunk as u8),
        hits: AtomicU64::new(0),
        missed: AtomicU64::new(0),
        refused: AtomicU64::new(0),
    };
    // SAFETY: the record is free (its bit is clear) and unpublished; we hold the lock.
    unsafe { record_pointer(record).write(probe) };
    registry.records_used.take(record);
    if let Some(chunk) = chunk {
        registry.chunks_used.take(chunk);
    }
    if publish_now {
        publish(address, record_pointer(record));
    }
    Ok((record, !early_branch))
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
    let mut registry = REGISTRY.lock();
    let mut retiring = Retiring::new();
    let first_error = retiring.unpublish_all(&mut registry, addresses);
    write_probed_words(Some(&retiring), None);
    retiring.finish_all(registry);
    first_error
}

/// Unregisters the probes at `retire` and registers `probes` (outcomes in `results`, as
/// [`register_all`]) with one hold of the other CPUs for both: the words of `retire` are
/// restored and those of `probes` armed in the same hold, then one grace period if a retired
/// probe was a detour, as [`unregister_all`]. The probe sweep swaps each batch for the next
/// with it: one hold a batch instead of two.
///
/// Sound as the two calls in turn: the new probes' records and chunks are others than the
/// retiring ones' (those are freed only after the grace period), so no CPU still inside a
/// retired slot or trampoline finds it rewritten; registration reads a retiring probe's
/// original, not its BRK (`original_word`); and a new probe at a retired address is published
/// only inside the hold, after the restore (`Arming::prepare_all`). Returns the first error of
/// the unregistering, as [`unregister_all`].
pub fn replace_all(
    retire: &[u64],
    probes: &[(u64, Method)],
    pre: Handler,
    post: Option<Handler>,
    results: &mut [Result<(), ProbeError>],
) -> Result<(), ProbeError> {
    let mut registry = REGISTRY.lock();
    let mut retiring = Retiring::new();
    let first_error = retiring.unpublish_all(&mut registry, retire);
    let mut arming = Arming::new();
    arming.prepare_all(&mut registry, retire, probes, pre, post, results);
    write_probed_words(Some(&retiring), Some(&arming));
    retiring.finish_all(registry);
    first_error
}

/// Probes unpublished and marked `RETIRING`, whose words are still to be restored (each
/// record holds its address and original word until `finish` frees it).
struct Retiring {
    retired: [Retired; MAX_PROBES],
    count: usize,
    needs_grace_period: bool,
    no_grace_period: bool,
}

impl Retiring {
    fn new() -> Self {
        Self {
            retired: [Retired { record: 0, chunk: None, cleared: false }; MAX_PROBES],
            count: 0,
            needs_grace_period: false,
            no_grace_period: inject::on(Fault::KprobeFreedWithoutGracePeriod),
        }
    }

    /// Unpublishes the probe at each address and marks it retiring; the first address that
    /// holds no probe is the error (the others are still unpublished).
    fn unpublish_all(&mut self, _registry: &mut Registry, addresses: &[u64]) -> Result<(), ProbeError> {
        let mut first_error = Ok(());
        for &address in addresses {
            // An address given twice is not found the second time: it is unpublished already.
            let Some(probe) = lookup(address) else {
                first_error = first_error.and(Err(ProbeError::NotRegistered));
                continue;
            };
            let record = RECORDS.index_of(probe);
            let chunk = probe.chunk;
            let cleared = inject::on(Fault::DetourTrampolineClearedFirst);
            if cleared && let Some(chunk) = chunk {
                slots::clear(slots::chunk_address(usize::from(chunk)));
            }
            RETIRING[record / 64].fetch_or(1 << (record % 64), Ordering::Release);
            unpublish(address);
            self.needs_grace_period |= matches!(probe.action, Action::Detour { .. }) && !self.no_grace_period;
            self.retired[self.count] = Retired { record: record as u8, chunk, cleared };
            self.count += 1;
        }
        first_error
    }

    /// After the hold that restored the words: the grace period if one is needed (with the
    /// lock dropped), then each slot or trampoline poisoned and its record and chunk freed.
    fn finish_all(self, registry: spin::MutexGuard<'_, Registry>) {
        // Every other CPU took the hold's SGI after the restores: none can take these BRKs any
        // more. (Only this lock's holder sets bits.)
        for bits in &RETIRING {
            bits.store(0, Ordering::Release);
        }
        // The records and chunks stay taken (their bits set) until the grace period has elapsed.
        drop(registry);
        if self.needs_grace_period {
            crate::task::cpus::synchronize();
        }
        self.retired[..self.count].iter().copied().for_each(finish);
    }
}

/// A probe disarmed and unpublished whose trampoline and record are not free yet.
#[derive(Clone, Copy)]
struct Retired {
    /// Record and chunk indices (below [`MAX_PROBES`] and `slots::CHUNKS`, 256): a byte each
    /// keeps the retiring list of [`replace_all`] small on the caller's stack.
    record: u8,
    chunk: Option<u8>,
    /// Its trampoline was cleared before the restore (the test-only `Fault::DetourTrampolineClearedFirst`).
    cleared: bool,
}

/// Unregister's second half, after the grace period: the trampoline cleared (poisoned) and the
/// record and chunk freed.
fn finish(retired: Retired) {
    let mut registry = REGISTRY.lock();
    let chunk = retired.chunk.map(usize::from);
    if !retired.cleared
        && let Some(chunk) = chunk
    {
        slots::clear(slots::chunk_address(chunk));
    }
    release(&mut registry, usize::from(retired.record), chunk);
}

/// Disarms (the original) the probed words of `retiring`, then publishes the deferred probes of
/// `arming` and arms (BRK or B) its words, at kernel text addresses, in one
/// hold of every other CPU (`task::cpus::with_others_held`): an arbitrary instruction <-> BRK or
/// B is not a change ARM ARM B2.2.5 allows concurrently with execution, and a CPU that executed
/// or fetched the old word meanwhile could keep running it after a later grace period (seen as a
/// stale translated block under multi-threaded TCG: docs/design/smp.md). One hold for all: a
/// hold is an SGI round trip through every CPU.
fn write_probed_words(retiring: Option<&Retiring>, arming: Option<&Arming>) {
    let restores = retiring.map_or(&[][..], |retiring| &retiring.retired[..retiring.count]);
    let write_all = || {
        let write = |address: u64, word: u32| {
            // SAFETY: address is a probed kernel text word (4-aligned, checked at registration),
            // and no other CPU runs meanwhile (but under the test-only
            // `Fault::KprobePatchedUnheld` and `Fault::KprobeFreedWithoutGracePeriod`).
            unsafe { patch::write_instruction(address, word) }
        };
        for retired in restores {
            // SAFETY: a retired record stays written until `finish` frees it, after this hold.
            let probe = unsafe { &*record_pointer(usize::from(retired.record)) };
            write(probe.address, probe.original);
        }
        if let Some(arming) = arming {
            for &record in &arming.deferred[..arming.deferred_count] {
                let probe = record_pointer(usize::from(record));
                // SAFETY: the record was written by `prepare` under the lock its caller holds.
                publish(unsafe { (*probe).address }, probe);
            }
            for &record in &arming.records[..arming.count] {
                // SAFETY: as above.
                let probe = unsafe { &*record_pointer(usize::from(record)) };
                write(probe.address, probe.armed);
            }
        }
    };
    if restores.is_empty() && arming.is_none_or(|arming| arming.count == 0 && arming.deferred_count == 0) {
        return;
    }
    let no_grace_period = !restores.is_empty() && inject::on(Fault::KprobeFreedWithoutGracePeriod);
    if no_grace_period || inject::on(Fault::KprobePatchedUnheld) {
        // Deliberately not holding the other CPUs (test-only faults): without a grace period
        // nothing waits for a CPU inside the probe either.
        write_all();
    } else {
        crate::task::cpus::with_others_held(write_all);
    }
}

fn release(registry: &mut Registry, record: usize, chunk: Option<usize>) {
    // The record's bytes stay as they are (Probe has no destructor); its bit marks it free.
    registry.records_used.free(record);
    if let Some(chunk) = chunk {
        registry.chunks_used.free(chunk);
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
            if TABLE[(index + 1) % TABLE_SIZE].load(Ordering::Relaxed).is_null() {
                empty_trailing_tombstones(index);
            }
            return;
        }
        index = (index + 1) % TABLE_SIZE;
    }
}

/// Empties the run of tombstones that ends at `index`, just before an empty entry. Tombstones
/// only ever accumulate otherwise: every batch of the probe sweep leaves its own, the table fills
/// with them, and then every miss (each registration asks first) walks the whole table; with
/// batches of 120 the sweep's registration slowed until its watchdog fired. Lock-free lookups
/// stay right: a lookup stops at the first empty entry, and no published probe lies between these
/// tombstones and the empty entry after them, so one that passes them meets that entry either way.
/// Called under [`REGISTRY`], as `publish` is.
fn empty_trailing_tombstones(mut index: usize) {
    while TABLE[index].load(Ordering::Relaxed) == TOMBSTONE {
        TABLE[index].store(core::ptr::null_mut(), Ordering::Release);
        index = (index + TABLE_SIZE - 1) % TABLE_SIZE;
    }
}

/// Entries of the PC table in use, published or tombstones (for the tests: with no probe
/// registered it is 0, however many came and went).
pub fn table_entries_in_use() -> usize {
    let _registry = REGISTRY.lock();
    TABLE.iter().filter(|entry| !entry.load(Ordering::Relaxed).is_null()).count()
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

/// The probed address an address in an XOL slot stands for (the slot's instruction, or the one
/// after it once the instruction has run), for a walker's rows; `None` outside the XOL slots.
#[sanitize(kernel_hwaddress = "off")]
pub fn slot_stands_for(pc: u64) -> Option<u64> {
    slots::probed_address(pc)
}

/// The slot area's size in bytes.
pub const SLOT_AREA_SIZE: u64 = slots::AREA_SIZE;

/// The size of one chunk of the slot area: one probe's XOL slot or detour trampoline.
pub const SLOT_CHUNK_SIZE: u64 = slots::CHUNK_SIZE;

/// Which chunks of the slot area a probe holds now (bit N: chunk N, at `slot_area_address() + N *
/// SLOT_CHUNK_SIZE`); every other chunk is as the area started (`BRK #0x006`), which the probe
/// sweep checks after each batch.
pub fn slot_chunks_in_use() -> [u64; SLOT_CHUNKS / 64] {
    REGISTRY.lock().chunks_used.0
}

/// Chunks in the slot area.
pub const SLOT_CHUNKS: usize = slots::CHUNKS;

/// The first patchable function entry outside the no-probe text, if the build has any (for the
/// tests).
pub fn first_patchable_entry() -> Option<u64> {
    refuse::patchable_entries().iter().copied().find(|&entry| !refuse::is_noprobe(entry))
}
