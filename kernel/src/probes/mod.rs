//! Kernel probes: register a handler on a kernel text address, and run it on every hit.
//!
//! A probe displaces one instruction of kernel text and performs it on every hit, in the way
//! the probe's [`Method`] says:
//! - [`Method::SingleStep`]: a `BRK #0x004` traps; the handler runs; the instruction executes from
//!   the probe's out-of-line (XOL) slot `[insn, BRK #0x006]` under hardware single-step
//!   (MDSCR_EL1.SS, SPSR.SS; ARM ARM D2.12), and the step exception resumes at `address + 4`.
//! - [`Method::BrkStep`]: the same slot, but the `BRK #0x006` after the instruction brings the CPU
//!   back (Linux kprobes' way), no hardware step.
//! - [`Method::Simulate`]: `crates/probes` emulates the instruction on the saved registers and
//!   memory in the BRK handler; no slot.
//! - [`Method::Detour`]: the instruction is replaced by `B trampoline`; the per-probe trampoline
//!   saves the registers, calls the pre-handler, restores, performs the displaced instruction
//!   (re-encoded where it depends on the PC) and branches back; no exception at all.
//!
//! Slots and trampolines are generated once, at registration (`slots.rs`); the hit path
//! (`hit.rs`) finds a probe by PC in a lock-free table and never allocates or decodes. What a
//! probe may not be placed on, and why, is in `refuse.rs` and [`ProbeError`].

mod hit;
pub mod kretprobe;
mod refuse;
mod slots;

use core::cell::UnsafeCell;
use core::fmt;
use core::mem::MaybeUninit;
use core::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use crate::arch::exception::{BRK_KPROBE, STACK_GAP};
use crate::arch::patch;
pub use hit::{on_brk, on_software_step, on_step_brk};
use probes::{Classification, Insn, RejectReason, Simulated, classify, encode_brk};
pub use probes::{Indexing, Registers};
pub use refuse::is_noprobe;

/// A handler: sees (and may change) the probed context's registers. `pc` is the probed address
/// in a pre-handler and the next PC in a post-handler. Changing `pc` or `sp` is not supported.
pub type Handler = fn(&mut Registers);

/// How a hit performs the displaced instruction.
#[derive(Clone, Copy, PartialEq, Eq, Debug, defmt::Format)]
pub enum Method {
    SingleStep,
    BrkStep,
    Simulate,
    Detour,
}

impl Method {
    pub const ALL: [Method; 4] = [Self::SingleStep, Self::BrkStep, Self::Simulate, Self::Detour];

    /// The name used in bench rows (`method=...`).
    pub const fn name(self) -> &'static str {
        match self {
            Self::SingleStep => "single-step",
            Self::BrkStep => "brk-step",
            Self::Simulate => "simulate",
            Self::Detour => "detour",
        }
    }
}

/// Why a probe was not registered or unregistered.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ProbeError {
    /// `crates/probes` rejects the instruction.
    Rejected(RejectReason),
    /// The address is not 4-byte aligned.
    Misaligned,
    /// The address is not in kernel text.
    NotKernelText,
    /// The address is EL0 code (`.text.user`): a kernel probe's BRK would trap from EL0 as a
    /// user fault; probe it with `uprobes`.
    UserText,
    /// A probe is already registered at this address.
    AlreadyRegistered,
    /// No probe is registered at this address (e.g. unregistering twice).
    NotRegistered,
    /// A load-exclusive precedes the address within `refuse::EXCLUSIVE_WINDOW` instructions with
    /// no store-exclusive in between: the trap would clear the exclusive monitor.
    InsideExclusiveSequence,
    /// The address is in code the probe machinery runs through (the named region).
    NoProbe(&'static str),
    /// A patchable function entry (the 4 words at each `__patchable_function_entries` address):
    /// ftrace owns it.
    FtraceCallsite,
    /// The instruction reads or writes the PC, so it cannot run from an out-of-line slot: use
    /// `Simulate` or `Detour`.
    NeedsOriginalPc,
    /// `Simulate` on an instruction that `crates/probes` steps rather than simulates.
    NotSimulated,
    /// `Simulate` on an SP-based form that could store below `SP - (STACK_GAP - 16)`, move SP
    /// down by more than that, or set SP from another register: exception entry only leaves
    /// `STACK_GAP` bytes free below the interrupted SP.
    StackBeyondGap,
    /// `Detour` on `BLR X30`: the return address and the target share the only free register.
    DetourBlrX30,
    /// `Detour` with a post-handler: the trampoline calls handlers before the displaced
    /// instruction only (as Linux's optprobes, which refuse post-handlers too).
    DetourPostHandler,
    /// A branch between the probe, its trampoline and the target is beyond +-128 MiB.
    OutOfBranchRange,
    /// Every probe record, or every slot chunk, is in use.
    NoSpace,
}

impl ProbeError {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Rejected(reason) => reason.as_str(),
            Self::Misaligned => "address is not 4-byte aligned",
            Self::NotKernelText => "address is not kernel text",
            Self::UserText => "address is EL0 code (.text.user): use uprobes",
            Self::AlreadyRegistered => "a probe is already registered at this address",
            Self::NotRegistered => "no probe is registered at this address",
            Self::InsideExclusiveSequence => "inside an LDXR/STXR sequence (the trap clears the exclusive monitor)",
            Self::NoProbe(region) => region,
            Self::FtraceCallsite => "patchable function entry: owned by ftrace",
            Self::NeedsOriginalPc => {
                "instruction reads or writes the PC: cannot run out of line (use simulate or detour)"
            }
            Self::NotSimulated => "instruction is stepped, not simulated, by crates/probes",
            Self::StackBeyondGap => {
                "simulated SP-based access could reach below SP - (STACK_GAP - 16): the exception frame"
            }
            Self::DetourBlrX30 => "detour cannot rewrite BLR X30 (no free register for the return address)",
            Self::DetourPostHandler => "detour runs handlers before the instruction only: no post-handler",
            Self::OutOfBranchRange => "branch beyond +-128 MiB between probe, trampoline and target",
            Self::NoSpace => "no free probe record or slot",
        }
    }
}

impl fmt::Display for ProbeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl defmt::Format for ProbeError {
    fn format(&self, f: defmt::Formatter) {
        defmt::write!(f, "{=str}", self.as_str())
    }
}

/// What a hit does after the pre-handler.
#[derive(Clone, Copy)]
enum Action {
    Simulate(Simulated),
    /// Run `[insn, BRK #0x006]` at `slot`, with hardware single-step if `hardware_step`.
    OutOfLine {
        slot: u64,
        hardware_step: bool,
    },
    /// The probed word is `B trampoline`; hits never trap.
    Detour {
        trampoline: u64,
    },
}

/// One registered probe. Written only under [`REGISTRY`] while unpublished; read lock-free by
/// the hit path once published in [`TABLE`].
pub struct Probe {
    address: u64,
    original: u32,
    action: Action,
    pre: Handler,
    post: Option<Handler>,
    /// Slot-area chunk owned by this probe, if any.
    chunk: Option<usize>,
    hits: AtomicU64,
    missed: AtomicU64,
}

/// Probe records, and the number of them.
const MAX_PROBES: usize = slots::CHUNKS;

struct Records([UnsafeCell<MaybeUninit<Probe>>; MAX_PROBES]);

// SAFETY: a record is written only under REGISTRY's lock while no TABLE entry points at it, and
// read by the hit path only after a Release store published it (one CPU: unregistering
// unpublishes first, and no hit can be in flight on another CPU).
unsafe impl Sync for Records {}

static RECORDS: Records = Records([const { UnsafeCell::new(MaybeUninit::uninit()) }; MAX_PROBES]);

fn record_pointer(record: usize) -> *mut Probe {
    RECORDS.0[record].get().cast()
}

/// Open-addressed PC -> probe table: null = empty, `TOMBSTONE` = removed.
const TABLE_SIZE: usize = 256;
static TABLE: [AtomicPtr<Probe>; TABLE_SIZE] = [const { AtomicPtr::new(core::ptr::null_mut()) }; TABLE_SIZE];
const TOMBSTONE: *mut Probe = core::ptr::dangling_mut::<Probe>();

/// Registration state: which records and slot chunks are taken.
struct Registry {
    records_used: u64,
    chunks_used: u64,
}

static REGISTRY: spin::Mutex<Registry> = spin::Mutex::new(Registry { records_used: 0, chunks_used: 0 });

const _: () = assert!(MAX_PROBES <= 64 && slots::CHUNKS <= 64, "one u64 bitmap each");

#[inline(always)]
fn table_index(address: u64) -> usize {
    ((address >> 2).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as usize % TABLE_SIZE
}

/// The probe at `address`, if one is published. Lock-free, O(1) expected.
#[inline(always)]
fn lookup(address: u64) -> Option<&'static Probe> {
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

/// Clears the OS lock and OS double lock so that debug exceptions (software step) can be taken
/// at EL1 (ARM ARM D2.5). MDSCR_EL1.KDE/SS are set only while a slot is stepped.
pub fn init() {
    // SAFETY: writing 0 to OSLAR_EL1 and OSDLR_EL1 unlocks the debug registers; no memory.
    unsafe {
        core::arch::asm!("msr oslar_el1, xzr", "msr osdlr_el1, xzr", "isb", options(nomem, nostack, preserves_flags))
    };
}

/// Registers a probe at kernel text `address`. `post` runs after the displaced instruction
/// (not with `Detour`).
pub fn register(address: u64, method: Method, pre: Handler, post: Option<Handler>) -> Result<(), ProbeError> {
    if address & 3 != 0 {
        return Err(ProbeError::Misaligned);
    }
    refuse::check_address(address)?;
    let mut registry = REGISTRY.lock();
    if lookup(address).is_some() {
        return Err(ProbeError::AlreadyRegistered);
    }
    // SAFETY: address is 4-aligned kernel text (checked above), always mapped readable.
    let original = unsafe { core::ptr::read_volatile(address as *const u32) };
    refuse::check_exclusive_window(address)?;
    let classification = classify(Insn(original));
    if let Classification::Reject(reason) = classification {
        return Err(ProbeError::Rejected(reason));
    }
    let record = (!registry.records_used).trailing_zeros() as usize;
    if record >= MAX_PROBES {
        return Err(ProbeError::NoSpace);
    }
    let needs_chunk = method != Method::Simulate;
    let chunk = if needs_chunk {
        let chunk = (!registry.chunks_used).trailing_zeros() as usize;
        if chunk >= slots::CHUNKS {
            return Err(ProbeError::NoSpace);
        }
        Some(chunk)
    } else {
        None
    };
    let action = match (method, classification) {
        (Method::Simulate, Classification::Simulate(simulated)) => {
            check_stack_gap(&simulated)?;
            Action::Simulate(simulated)
        }
        (Method::Simulate, _) => return Err(ProbeError::NotSimulated),
        (Method::SingleStep | Method::BrkStep, classification) => {
            if let Classification::Simulate(simulated) = classification
                && !runs_anywhere(&simulated)
            {
                return Err(ProbeError::NeedsOriginalPc);
            }
            let slot = slots::chunk_address(chunk.unwrap_or(0));
            slots::write_out_of_line(slot, original);
            Action::OutOfLine { slot, hardware_step: method == Method::SingleStep }
        }
        (Method::Detour, classification) => {
            if post.is_some() {
                return Err(ProbeError::DetourPostHandler);
            }
            let trampoline = slots::chunk_address(chunk.unwrap_or(0));
            let probe_pointer = record_pointer(record) as u64;
            slots::write_detour(trampoline, address, original, &classification, probe_pointer)?;
            Action::Detour { trampoline }
        }
    };
    let probe =
        Probe { address, original, action, pre, post, chunk, hits: AtomicU64::new(0), missed: AtomicU64::new(0) };
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
                release(&mut registry, record, chunk);
                return Err(ProbeError::OutOfBranchRange);
            }
        },
        _ => encode_brk(BRK_KPROBE).word(),
    };
    // SAFETY: address is kernel text; BRK and B may replace any instruction while it runs
    // (ARM ARM B2.2.5 concurrent modification: B, BL, BRK, NOP, ...).
    unsafe { patch::write_instruction(address, patched) };
    Ok(())
}

/// Unregisters the probe at `address`, restoring the original instruction.
pub fn unregister(address: u64) -> Result<(), ProbeError> {
    let mut registry = REGISTRY.lock();
    let Some(probe) = lookup(address) else {
        return Err(ProbeError::NotRegistered);
    };
    let (original, chunk) = (probe.original, probe.chunk);
    let record = (0..MAX_PROBES).find(|&record| core::ptr::eq(record_pointer(record), probe));
    // SAFETY: address is the probed kernel text word; restoring the original is a BRK/B -> insn
    // change the architecture allows concurrently with execution.
    unsafe { patch::write_instruction(address, original) };
    unpublish(address);
    if let Some(chunk) = chunk {
        slots::clear(slots::chunk_address(chunk));
    }
    if let Some(record) = record {
        release(&mut registry, record, chunk);
    }
    Ok(())
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

/// The start of the slot area (for the no-probe checks in the tests).
pub fn slot_area_address() -> u64 {
    slots::chunk_address(0)
}

/// The first patchable function entry outside the no-probe text, if the build has any (for the
/// tests).
pub fn first_patchable_entry() -> Option<u64> {
    refuse::patchable_entries().iter().copied().find(|&entry| !refuse::is_noprobe(entry))
}

/// Whether a simulated form gives the same result from any address (so it can also run from a
/// slot or inline in a trampoline).
fn runs_anywhere(simulated: &Simulated) -> bool {
    matches!(
        simulated,
        Simulated::Nop
            | Simulated::LoadStorePair { .. }
            | Simulated::MoveRegister { .. }
            | Simulated::AddSubImmediate { .. }
    )
}

/// How far below the interrupted SP a simulated access or SP move may reach: the gap exception
/// entry leaves, minus the 16 bytes the return path stashes x0/x1 in.
const SIMULATE_SP_REACH: i64 = STACK_GAP as i64 - 16;

fn check_stack_gap(simulated: &Simulated) -> Result<(), ProbeError> {
    match *simulated {
        Simulated::LoadStorePair { rn, offset, indexing, .. } if rn.number() == 31 => {
            // Post-index accesses at SP and moves SP by offset; the others access SP + offset.
            let reach = if indexing == Indexing::PostIndex { offset.min(0) } else { offset };
            if reach < -SIMULATE_SP_REACH { Err(ProbeError::StackBeyondGap) } else { Ok(()) }
        }
        Simulated::AddSubImmediate { rd, rn, immediate, subtract, set_flags: false, .. } if rd.number() == 31 => {
            let moves_down = if subtract { immediate as i64 } else { -(immediate as i64) };
            if rn.number() != 31 || moves_down > SIMULATE_SP_REACH { Err(ProbeError::StackBeyondGap) } else { Ok(()) }
        }
        _ => Ok(()),
    }
}
