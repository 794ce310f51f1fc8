//! The probe sweep: every instruction of real kernel code that the probe subsystem
//! accepts, probed with every method its plan allows, while a workload runs through that code.
//!
//! For each function of the symbol table (`symbols::callsites` starts, `.ksyms` names; a
//! function ends where the next starts) and each method, every word of the function is offered
//! to `probes::register` at once (in batches of [`BATCH`]); the refused ones are counted by
//! reason. Then the workload runs once, the probes are removed (in the hold that arms the next
//! batch, `kprobes::replace_all`), and the sweep checks:
//! - the workload's results (checksum of its data, sum of its return values) equal the
//!   unprobed run's;
//! - the probed words are the original ones again (a word the next batch probes again, once
//!   that batch is removed) and the slot area (XOL slots, detour trampolines) is
//!   byte-identical to before (its hash per chunk; a chunk the next batch holds, once that
//!   batch is removed); the whole text at the end;
//! - per instruction, every method gives the same hit count. Which instructions ran is known
//!   from the methods agreeing: they are four independent mechanisms (a hardware step, a BRK
//!   from a slot, the simulator, a branch to a trampoline) and the workload is deterministic
//!   (the depot was warmed up, nothing allocates between passes, the tick is held off and
//!   hits taken in IRQ context are not counted), so an instruction one method saw run and another did not, or a probe on code
//!   that did not run being hit, shows up as a disagreement; the workload's own entry points
//!   are checked to have been hit.
//!
//! Then random sets of [`SET_MEMBERS`] probes across the kernel at once, single probes one at a time (each
//! drawn from the seed and its index: a function, then one of the probes its batches accepted), and
//! a kretprobe on every function entry that allows one (its returns counted per method,
//! [`KRETPROBE_GROUP`] functions at a time).
//! A death (unexpected exception, hang, sanitizer report) ends the run with the last
//! `sweep batch:` line naming the batch (`FUNCTION+OFFSET:METHOD words N`);
//! `sweep.probe=FUNCTION+OFFSET:METHOD` repeats exactly one probe, with `sweep.words=N` the N
//! words from there (xtask halves a hanging batch with it until one probe remains).
//!
//! On several CPUs (`everywhere`) the other CPUs loop on the workload while CPU 0 sweeps:
//! their passes' results must equal their own unprobed reference, each probe counts CPU 0's
//! pass exactly and the other CPUs' hits summed (compared as zero or not, see `Count`), and a
//! watchdog on them names the batch CPU 0 stopped in.
//!
//! Command-line words (ignored by `cmdline`, which leaves dotted keys alone):
//! `sweep.seed=N`, `sweep.functions=N` (a seeded sample of N functions; 0 or absent: all),
//! `sweep.only=PREFIX` (only functions whose names start with it), `sweep.set=K` and
//! `sweep.members=A..B` (random set K of the run with that seed and sample, members A to B),
//! `sweep.singles=N` (single probes), `sweep.probe=...`, `sweep.words=N` (words from the
//! probe's on, at once: xtask halves a hanging batch with it), `sweep.watchdog=MS` (on several
//! CPUs, how long CPU 0 may make no progress), `sweep.inject=hang@FUNCTION+OFFSET` (that probe's
//! handler spins on CPU 0: the test of the halving), `sweep.ftrace=list|call-ops|vector`
//! (a counting tracer on every traceable function during the sweep), `sweep.inject=callers-stack`
//! (a test of the sweep itself: workload passes on the caller's stack, which its new-stack
//! check must catch), `sweep.inject=miscount-returns` (a test of the sweep itself: every
//! kretprobe's returns read one high in the detour pass, which the returns check must catch),
//! `sweep.inject=reenter-twice` (no sweep: the hit path's re-entered-twice
//! panic, `reentry`), `sweep.shard=K/N` (one of N shards of the run, see `Shard`).

mod everywhere;
mod reentry;
mod timing;
mod workload;

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use crate::args::Args;
use crate::probes::{self as kprobes, Method, ProbeError, Registers, kretprobe};
use crate::symbols::Symbols;
use workload::{Checksum, Results};

/// Probes armed at once: the registry has 256 records and slot chunks, two batches' worth while
/// one replaces the other (`kprobes::replace_all`) and one for the workload's own probe. A batch's
/// cost is mostly fixed (its hold, its grace period, a workload pass on every CPU), so the
/// number of batches decides a whole sweep's time: 120 words take most functions in one.
const BATCH: usize = protocol::sweep::BATCH_WORDS;
/// Members of a random set (its identity: `sweep.set=K` finds the same ones in every run).
const SET_MEMBERS: usize = protocol::sweep::SET_MEMBERS;
/// Kretprobes registered at once in the kretprobe pass: their entry probes are armed, swapped
/// from method to method and disarmed in one hold each.
const KRETPROBE_GROUP: usize = 16;
/// Chunks of the probe slot area (`probes/kprobe_slots.rs`), each hashed on its own.
const SLOT_CHUNKS: usize = kprobes::SLOT_CHUNKS;
const _: () = assert!(2 * BATCH < SLOT_CHUNKS, "two batches and the workload's probe");
const _: () = assert!(KRETPROBE_GROUP < kretprobe::MAX_KRETPROBES);
/// Longest function the sweep walks (instructions); longer ones are cut (and say so).
const MAX_FUNCTION_WORDS: u64 = 4096;
/// Functions between `sweep progress:` lines.
const PROGRESS_EVERY: usize = 25;
/// Random sets a whole sweep arms (as many as 8192 probes make in batches of [`BATCH`]).
const WHOLE_SWEEP_SETS: usize = 170;

/// The probes armed now, their hit counts, and whether hits count (only while the workload runs).
static ARMED: [AtomicU64; BATCH] = [const { AtomicU64::new(0) }; BATCH];
static HITS: [AtomicU64; BATCH] = [const { AtomicU64::new(0) }; BATCH];
static ARMED_COUNT: AtomicUsize = AtomicUsize::new(0);
/// The first probe's address when the batch's probes are consecutive words (a function's
/// batch: a hit's index is its offset from there), else 0 (a random set: searched).
static ARMED_BASE: AtomicU64 = AtomicU64::new(0);
static COUNTING: AtomicBool = AtomicBool::new(false);
/// Hits on the other CPUs (their background loops), counted while the whole batch is armed.
static HITS_ELSEWHERE: [AtomicU64; BATCH] = [const { AtomicU64::new(0) }; BATCH];
static COUNTING_ELSEWHERE: AtomicBool = AtomicBool::new(false);
/// `sweep.inject=hang@FUNCTION+OFFSET`: the probe there spins in its handler (0: none).
static HANG_AT: AtomicU64 = AtomicU64::new(0);
/// The kretprobe group's entry (attach) addresses, and each member's returns on CPU 0.
static KRETPROBE_ENTRIES: [AtomicU64; KRETPROBE_GROUP] = [const { AtomicU64::new(0) }; KRETPROBE_GROUP];
static RETURNS: [AtomicU64; KRETPROBE_GROUP] = [const { AtomicU64::new(0) }; KRETPROBE_GROUP];

fn in_irq(sp: u64) -> bool {
    crate::task::stacks::this_irq_slot().contains_stack(sp)
}

/// The sweep's pre-handler: counts a hit of the probed PC while the workload runs, CPU 0's
/// counted pass in `HITS`, the other CPUs' loops in `HITS_ELSEWHERE`.
fn count_hit(registers: &mut Registers) {
    let on_cpu0 = crate::task::this_cpu() == 0;
    if registers.pc == HANG_AT.load(Ordering::Relaxed) && on_cpu0 {
        // The test of hang bisection: a handler that never returns (xtask must name this
        // probe). On CPU 0 only: on several CPUs the others' watchdog then reports it at once.
        loop {
            core::hint::spin_loop();
        }
    }
    let counting = if on_cpu0 { &COUNTING } else { &COUNTING_ELSEWHERE };
    if !counting.load(Ordering::Relaxed) || in_irq(registers.sp) {
        return;
    }
    let count = ARMED_COUNT.load(Ordering::Relaxed);
    let base = ARMED_BASE.load(Ordering::Relaxed);
    let index = if base != 0 {
        Some((registers.pc.wrapping_sub(base) / 4) as usize).filter(|&index| index < count)
    } else {
        (0..count).find(|&index| ARMED[index].load(Ordering::Relaxed) == registers.pc)
    };
    if let Some(index) = index {
        let hits = if on_cpu0 { &HITS } else { &HITS_ELSEWHERE };
        hits[index].fetch_add(1, Ordering::Relaxed);
    }
}

/// `sweep.inject=miscount-returns`: the detour pass's returns are read one high, so the
/// kretprobe pass's returns check must fail (CI runs it: the check is shown to catch a miscount
/// between passes with the same members registered).
static MISCOUNT_RETURNS: AtomicBool = AtomicBool::new(false);

/// The kretprobe group's entry handler: which member was entered, for its return.
fn kretprobe_entered(registers: &mut Registers, member: &mut u64) -> bool {
    let found = KRETPROBE_ENTRIES.iter().position(|entry| entry.load(Ordering::Relaxed) == registers.pc);
    *member = found.unwrap_or(0) as u64;
    found.is_some()
}

fn count_return(registers: &mut Registers, member: u64) {
    if COUNTING.load(Ordering::Relaxed) && crate::task::this_cpu() == 0 && !in_irq(registers.sp) {
        RETURNS[member as usize].fetch_add(1, Ordering::Relaxed);
    }
}

/// What the sweep was asked to do.
struct Options {
    seed: u64,
    functions: usize,
    singles: usize,
    probe: Option<(&'static str, u64, Method)>,
    /// Words from `probe` on, armed at once (`sweep.words=N`, at most [`BATCH`]).
    words: usize,
    /// `sweep.inject=hang@FUNCTION+OFFSET`.
    hang: Option<(&'static str, u64)>,
    ftrace: Option<crate::ftrace::Scheme>,
    /// `sweep.inject=reenter-twice`: no sweep, the hit path's re-entered-twice panic instead.
    reenter_twice: bool,
    /// `sweep.set=K`: random set K alone (with the seed and `sweep.functions` of the run it
    /// was in), members `sweep.members=A..B` of it (default: all).
    set: Option<usize>,
    members: (usize, usize),
    /// `sweep.only=PREFIX`: only the functions whose names start so.
    only: Option<&'static str>,
    shard: Shard,
}

/// `sweep.shard=K/N`: the part of a run that shard K of N sweeps, so that N machines share a
/// whole sweep and the sums of their counts are the whole run's. Round-robin over the run's
/// stable orders: function I of the chosen functions (symbol-table order) and random set I
/// belong to shard `I % N + 1`, and a single probe to the shard of its function. Every part of
/// a run is decided by the seed and its own index, never by what another shard swept, so each
/// batch arms exactly what it arms in the whole run.
#[derive(Clone, Copy)]
struct Shard {
    /// 0-based.
    index: usize,
    count: usize,
}

impl Shard {
    const WHOLE: Shard = Shard { index: 0, count: 1 };

    fn owns(self, ordinal: usize) -> bool {
        ordinal % self.count == self.index
    }
}

fn options_from_args(args: &Args) -> Result<Options, &'static str> {
    let mut options = Options {
        seed: 1,
        functions: 0,
        singles: 64,
        probe: None,
        words: 1,
        hang: None,
        ftrace: None,
        reenter_twice: false,
        set: None,
        members: (0, SET_MEMBERS),
        only: None,
        shard: Shard::WHOLE,
    };
    for (key, value) in args.assignments() {
        let number = || value.parse::<u64>().map_err(|_| "sweep: a number was expected");
        match key {
            "sweep.seed" => options.seed = number()?,
            "sweep.functions" => options.functions = number()? as usize,
            "sweep.singles" => options.singles = number()? as usize,
            "sweep.probe" => {
                let (place, method) = value.rsplit_once(':').ok_or("sweep.probe=FUNCTION+OFFSET:METHOD")?;
                let (name, offset) = parse_place(place).ok_or("sweep.probe=FUNCTION+OFFSET:METHOD")?;
                let method = Method::ALL.into_iter().find(|m| m.name() == method).ok_or("sweep.probe: bad method")?;
                options.probe = Some((name, offset, method));
            }
            "sweep.watchdog" => everywhere::set_watchdog(number()?),
            "sweep.set" => options.set = Some(number()? as usize),
            "sweep.only" => options.only = Some(value),
            "sweep.shard" => {
                let (index, count) = value.split_once('/').ok_or("sweep.shard=K/N")?;
                match (index.parse::<usize>(), count.parse::<usize>()) {
                    (Ok(index), Ok(count)) if (1..=count).contains(&index) => {
                        options.shard = Shard { index: index - 1, count }
                    }
                    _ => return Err("sweep.shard=K/N: 1 <= K <= N"),
                }
            }
            "sweep.members" => {
                let (first, end) = value.split_once("..").ok_or("sweep.members=A..B")?;
                let (first, end) = (first.parse().ok(), end.parse().ok());
                match (first, end) {
                    (Some(first), Some(end)) if first < end && end <= SET_MEMBERS => options.members = (first, end),
                    _ => return Err("sweep.members=A..B: 0 <= A < B <= 48"),
                }
            }
            "sweep.words" => match number()? as usize {
                words @ 1..=BATCH => options.words = words,
                _ => return Err("sweep.words: 1 to 120 words"),
            },
            "sweep.inject" => match value.split_once('@') {
                None if value == "callers-stack" => workload::ON_CALLERS_STACK.store(true, Ordering::Relaxed),
                None if value == "reenter-twice" => options.reenter_twice = true,
                None if value == "miscount-returns" => MISCOUNT_RETURNS.store(true, Ordering::Relaxed),
                Some(("hang", place)) => {
                    options.hang = Some(parse_place(place).ok_or("sweep.inject=hang@FUNCTION+OFFSET")?)
                }
                _ => return Err("sweep.inject=callers-stack|miscount-returns|reenter-twice|hang@FUNCTION+OFFSET"),
            },
            "sweep.ftrace" => {
                options.ftrace = Some(match value {
                    "list" => crate::ftrace::Scheme::List,
                    "call-ops" => crate::ftrace::Scheme::CallOps,
                    "vector" => crate::ftrace::Scheme::Vector,
                    _ => return Err("sweep.ftrace=list|call-ops|vector"),
                })
            }
            _ => {}
        }
    }
    Ok(options)
}

/// `FUNCTION+OFFSET` (offset decimal or 0x hex).
fn parse_place(place: &'static str) -> Option<(&'static str, u64)> {
    let (name, offset) = place.rsplit_once('+')?;
    let offset = match offset.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => offset.parse(),
    };
    Some((name, offset.ok()?))
}

/// A function of the symbol table: its start, its end (the next start), its name.
#[derive(Clone, Copy)]
struct Function {
    start: u64,
    end: u64,
    name: &'static str,
}

fn functions(symbols: &Symbols) -> Vec<Function> {
    let mut starts: Vec<u64> = crate::symbols::callsites::entries().iter().map(|entry| entry + 8).collect();
    starts.sort_unstable();
    starts.dedup();
    let (_, text_end) = text();
    let mut functions = Vec::with_capacity(starts.len());
    for (index, &start) in starts.iter().enumerate() {
        let next = starts.get(index + 1).copied().unwrap_or(text_end);
        let end = next.min(start + 4 * MAX_FUNCTION_WORDS);
        let name = symbols.name_at(start).unwrap_or("?");
        if name.starts_with("kernel::sweep::") && !name.starts_with("kernel::sweep::workload::") {
            // The sweep's own bookkeeping runs between register and unregister: not the workload.
            continue;
        }
        if name == "kernel::sweep::workload::probed_leaf" {
            // The workload's own probe goes there (the probe registry's part of the workload).
            continue;
        }
        functions.push(Function { start, end, name });
    }
    functions
}

unsafe extern "C" {
    static __kernel_start: u8;
    static __text_end: u8;
}

fn text() -> (u64, u64) {
    (&raw const __kernel_start as u64, &raw const __text_end as u64)
}

fn hash_range(start: u64, end: u64) -> u64 {
    let mut sum = Checksum::new();
    for at in (start..end).step_by(8) {
        // SAFETY: kernel text, mapped readable, 8-aligned.
        sum.add(unsafe { core::ptr::read_volatile(at as *const u64) });
    }
    sum.value()
}

fn slot_chunk_start(chunk: usize) -> u64 {
    kprobes::slot_area_address() + chunk as u64 * kprobes::SLOT_CHUNK_SIZE
}

fn slot_chunk_hash(chunk: usize) -> u64 {
    hash_range(slot_chunk_start(chunk), slot_chunk_start(chunk) + kprobes::SLOT_CHUNK_SIZE)
}

/// Whether slot area chunk `chunk` holds only the filler a free chunk holds (`BRK #0x006`):
/// a plain comparison, cheaper than the hash for the check after every batch.
fn slot_chunk_is_filler(chunk: usize) -> bool {
    let filler = u64::from(probes::encode_brk(crate::arch::exception::BRK_KPROBE_STEP).0);
    let filler = filler | filler << 32;
    let start = slot_chunk_start(chunk);
    for at in (start..start + kprobes::SLOT_CHUNK_SIZE).step_by(8) {
        // SAFETY: the slot area is kernel text, mapped readable, 8-aligned.
        if unsafe { core::ptr::read_volatile(at as *const u64) } != filler {
            return false;
        }
    }
    true
}

fn word_at(address: u64) -> u32 {
    // SAFETY: 4-aligned kernel text, mapped readable.
    unsafe { core::ptr::read_volatile(address as *const u32) }
}

/// Counts: probes armed per method, refusals per reason, failures.
struct Tally {
    armed: [u64; 4],
    refused: Vec<(&'static str, u64)>,
    failures: u64,
    batches: u64,
    kretprobes: [u64; 4],
    /// Functions whose counts were not compared (`count_exempt`).
    exempt: u64,
    /// Batches whose CPU 0 pass waited for the run queue's lock (`Count::waited`).
    waited: u64,
    /// Probe hits taken while this CPU was already handling a probe (its handler called probed
    /// code): performed without handlers, counted as missed (Linux's `kprobe_reenter`).
    missed: u64,
}

impl Tally {
    fn refuse(&mut self, error: ProbeError) {
        let reason = error.as_str();
        match self.refused.iter_mut().find(|(known, _)| *known == reason) {
            Some((_, count)) => *count += 1,
            None => self.refused.push((reason, 1)),
        }
    }
}

fn method_index(method: Method) -> usize {
    Method::ALL.iter().position(|&known| known == method).unwrap_or(0)
}

struct Sweep {
    reference: Results,
    /// Each slot area chunk's hash before the sweep: after a batch is removed, every chunk no
    /// probe holds must hash the same.
    slot_chunks: [u64; SLOT_CHUNKS],
    /// The chunks that held only filler before the sweep (compared as such, not hashed), a bit
    /// each.
    slot_filler: [u64; SLOT_CHUNKS / 64],
    /// The batch still armed after its pass (see [`Armed`]).
    armed: Option<Box<Armed>>,
    /// The batch buffers not in `armed` (two in all: the armed batch's and the next one's).
    buffers: Vec<Box<Armed>>,
    symbols: Symbols,
    tally: Tally,
    /// The other CPUs' workload loops (None on one CPU).
    background: Option<everywhere::Background>,
}

/// A probe the sweep failed on: everything needed to repeat it.
fn report(sweep: &mut Sweep, address: u64, method: Method, what: &str) {
    let (name, offset) = place(&sweep.symbols, address);
    defmt::error!(
        "sweep FAILED: {=str} at {=str}+{=u64:#x} ({=u64:#x}) insn {=u32:#010x} method {=str}",
        what,
        name,
        offset,
        address,
        word_at(address),
        method.name()
    );
    sweep.tally.failures += 1;
}

/// What one probe counted in a batch: CPU 0's counted pass, exactly (the workload is
/// deterministic), and the other CPUs' loops summed. How many passes the loops ran while the
/// batch was armed varies (at least one each, see `everywhere`), so of that sum only whether it
/// is zero is compared: an instruction the loops execute is hit on them under every method.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Count {
    cpu0: u64,
    elsewhere: u64,
    /// CPU 0 waited for the run queue's lock during its pass (`task::run_queue_retries`): the
    /// lock's retry loop, inlined into every user of the task table, ran there a number of times
    /// the other CPUs decided, so CPU 0's count is not compared. A pass that never waited runs
    /// none of it.
    waited: bool,
}

impl Count {
    /// Whether two counts of one probe agree: CPU 0's exactly (unless either pass waited for the
    /// run queue), the other CPUs' as zero or not (not in the code `paced_by_cpu0` names, on
    /// several CPUs).
    fn agrees(self, other: Count, function: &str) -> bool {
        let elsewhere = !(SEVERAL_CPUS.load(Ordering::Relaxed) && paced_by_cpu0(function));
        (self.waited || other.waited || self.cpu0 == other.cpu0)
            && (!elsewhere || (self.elsewhere > 0) == (other.elsewhere > 0))
    }
}

/// A batch left armed after its pass and its counts: the next batch disarms it in the hold that
/// arms itself (`kprobes::replace_all`: one hold a batch, not two), or [`disarm`] does alone
/// before anything else runs the workload. The checks that need it disarmed (its words
/// restored, the slot area, the other CPUs' results up to its removal) run then. Two of these
/// are allocated before the reference pass and reused (`Sweep::buffers`): a batch allocates
/// nothing, and its arrays stay off the stack.
struct Armed {
    probes: [(u64, Method); BATCH],
    count: usize,
    /// Each probe's registration outcome.
    outcomes: [Result<(), ProbeError>; BATCH],
    /// Which of `probes` were accepted.
    accepted: [bool; BATCH],
    /// Each probe's original word.
    originals: [u32; BATCH],
    /// The accepted probes' addresses, to unregister.
    addresses: [u64; BATCH],
    registered: usize,
    /// Each probe's counts (None: refused).
    hits: [Option<Count>; BATCH],
    label: &'static str,
    /// `everywhere::mismatches()` before its pass.
    mismatches_before: [u64; crate::task::stacks::CPUS],
}

impl Armed {
    fn new() -> Box<Armed> {
        Box::new(Armed {
            probes: [(0, Method::SingleStep); BATCH],
            count: 0,
            outcomes: [Ok(()); BATCH],
            accepted: [false; BATCH],
            originals: [0; BATCH],
            addresses: [0; BATCH],
            registered: 0,
            hits: [None; BATCH],
            label: "",
            mismatches_before: [0; crate::task::stacks::CPUS],
        })
    }

    /// The original word at `address` if this batch accepted a probe there.
    fn original_at(&self, address: u64) -> Option<u32> {
        (0..self.count)
            .find(|&index| self.accepted[index] && self.probes[index].0 == address)
            .map(|index| self.originals[index])
    }
}

/// Arms `probes` (disarming the batch still armed in the same hold), runs the workload, and
/// leaves the batch armed for the next one to disarm (see [`Armed`]); returns its counts (None
/// where refused), final when it returns; the checks of its removal follow it. Allocates
/// nothing: the workload must find the heap as every other pass left it (its free lists decide
/// how long `alloc` loops).
fn batch<'s>(sweep: &'s mut Sweep, probes: &[(u64, Method)], label: &'static str) -> &'s [Option<Count>] {
    everywhere::heartbeat();
    let mut clock = timing::Clock::start();
    let mut next = sweep.buffers.pop().expect("a free batch buffer");
    let count = probes.len();
    next.count = count;
    next.label = label;
    next.probes[..count].copy_from_slice(probes);
    for (index, &(address, _)) in probes.iter().enumerate() {
        // The word under a probe of the batch still armed is that probe's original.
        next.originals[index] =
            sweep.armed.as_ref().and_then(|previous| previous.original_at(address)).unwrap_or_else(|| word_at(address));
        next.accepted[index] = false;
        ARMED[index].store(address, Ordering::Relaxed);
        HITS[index].store(0, Ordering::Relaxed);
        HITS_ELSEWHERE[index].store(0, Ordering::Relaxed);
    }
    let consecutive = probes.iter().enumerate().all(|(index, &(address, _))| address == probes[0].0 + 4 * index as u64);
    ARMED_BASE.store(if consecutive && count > 0 { probes[0].0 } else { 0 }, Ordering::Relaxed);
    ARMED_COUNT.store(count, Ordering::Relaxed);
    // The whole batch is armed in one hold of the other CPUs, not one per probe (on 4 CPUs under
    // TCG a hold is milliseconds, and 96 of them were most of a batch), and the same hold
    // disarms the batch before it (`replace_all`).
    clock.lap(timing::Phase::Checks);
    let previous = sweep.armed.take();
    let retire = previous.as_ref().map_or(&[][..], |previous| &previous.addresses[..previous.registered]);
    let disarmed = kprobes::replace_all(retire, probes, count_hit, None, &mut next.outcomes[..count]);
    clock.lap(timing::Phase::Register);
    if let Some(previous) = previous {
        let outcomes = &next.outcomes[..count];
        let holds =
            |address: u64| probes.iter().zip(outcomes).any(|(&(probe, _), result)| probe == address && result.is_ok());
        removed(sweep, &previous, disarmed, holds);
        sweep.buffers.push(previous);
        clock.lap(timing::Phase::Checks);
    }
    for (index, &(_, method)) in probes.iter().enumerate() {
        match next.outcomes[index] {
            Ok(()) => {
                next.accepted[index] = true;
                sweep.tally.armed[method_index(method)] += 1;
            }
            Err(error) => sweep.tally.refuse(error),
        }
    }
    everywhere::heartbeat();
    sweep.tally.batches += 1;
    let armed_any = next.accepted[..count].iter().any(|&armed| armed);
    let mut new_traces = 0;
    let mut waited = false;
    next.mismatches_before = everywhere::mismatches();
    let results = if armed_any {
        let traces = crate::stacktrace::DEPOT.stats().records;
        let epoch = everywhere::armed();
        COUNTING_ELSEWHERE.store(true, Ordering::Release);
        COUNTING.store(true, Ordering::Relaxed);
        let retries = crate::task::run_queue_retries(0);
        let results = workload::run();
        COUNTING.store(false, Ordering::Relaxed);
        clock.lap(timing::Phase::Pass);
        waited = crate::task::run_queue_retries(0) != retries;
        sweep.tally.waited += u64::from(waited);
        if let Some(background) = &sweep.background
            && let Err(cpu) = everywhere::wait_for_passes(background, epoch)
        {
            // Another CPU is stuck (in a probe's handler or slot, or the code under it): the run
            // cannot go on; the last `sweep batch:` line names the batch, xtask halves it.
            defmt::error!(
                "sweep hung: cpu {=usize} completed no pass within {=u64} ms during {=str}",
                cpu,
                everywhere::PASS_TIMEOUT_MS,
                label
            );
            panic!("sweep hung on cpu {}", cpu);
        }
        clock.lap(timing::Phase::Waiting);
        COUNTING_ELSEWHERE.store(false, Ordering::Release);
        new_traces = crate::stacktrace::DEPOT.stats().records - traces;
        results
    } else {
        Some(sweep.reference)
    };
    // The probes' missed hits, and the addresses the next batch (or `disarm`) unregisters with
    // one hold and one grace period (`replace_all`, `unregister_all`), not one per probe: on 4
    // CPUs a 48-detour batch spent seconds in grace periods. Once that returns no CPU is inside
    // a removed probe's slot or handler, and a later batch may reuse them.
    next.registered = 0;
    for index in (0..count).filter(|&index| next.accepted[index]) {
        let (address, method) = probes[index];
        match kprobes::counts(address) {
            Some((_, missed)) => {
                sweep.tally.missed += missed;
                next.addresses[next.registered] = address;
                next.registered += 1;
            }
            None => {
                defmt::error!("sweep: unregister: {}", ProbeError::NotRegistered);
                report(sweep, address, method, "unregister failed");
            }
        }
    }
    let blame = |sweep: &mut Sweep, next: &Armed, what: &str| {
        for (index, &(address, method)) in probes.iter().enumerate() {
            if next.accepted[index] {
                report(sweep, address, method, what);
            }
        }
    };
    if armed_any && results != Some(sweep.reference) {
        defmt::error!("sweep: {=str}: the workload's results differ from the unprobed run's", label);
        blame(sweep, &next, "results differ (one of these probes)");
    }
    // Every pass saves the same stacks (the workload runs on a task of its own), so the
    // warm-up saved them all: a new one means a probe showed in a trace (a slot or trampoline
    // address where a return address belongs).
    if new_traces != 0 {
        defmt::error!(
            "sweep: {=str}: the probed pass saved {=usize} stacks the unprobed ones did not",
            label,
            new_traces
        );
        blame(sweep, &next, "new stack traces (one of these probes)");
    }
    for index in 0..count {
        next.hits[index] = next.accepted[index].then(|| Count {
            cpu0: HITS[index].load(Ordering::Relaxed),
            elsewhere: HITS_ELSEWHERE[index].load(Ordering::Relaxed),
            waited,
        });
    }
    clock.lap(timing::Phase::Checks);
    everywhere::heartbeat();
    &sweep.armed.insert(next).hits[..count]
}

/// Disarms the batch still armed, alone (one hold, and a grace period after detours), and
/// checks its removal: before anything but the next batch runs the workload or probes, and at
/// the end of a run.
fn disarm(sweep: &mut Sweep) {
    let Some(armed) = sweep.armed.take() else { return };
    everywhere::heartbeat();
    let mut clock = timing::Clock::start();
    let disarmed = kprobes::unregister_all(&armed.addresses[..armed.registered]);
    clock.lap(timing::Phase::Unregister);
    ARMED_COUNT.store(0, Ordering::Relaxed);
    removed(sweep, &armed, disarmed, |_| false);
    sweep.buffers.push(armed);
    clock.lap(timing::Phase::Checks);
    everywhere::heartbeat();
}

/// The checks of a batch once it is disarmed (`disarmed`: the unregistering's outcome):
/// results on the other CPUs until then, its words restored, the slot area's free chunks as
/// before. `held(address)`: the next batch armed a probe there (its word is checked when that
/// batch is removed: its original is this batch's).
fn removed(sweep: &mut Sweep, armed: &Armed, disarmed: Result<(), ProbeError>, held: impl Fn(u64) -> bool) {
    let probes = &armed.probes[..armed.count];
    let label = armed.label;
    if let Err(error) = disarmed {
        defmt::error!("sweep: {=str}: unregister: {}", label, error);
        report(sweep, armed.addresses[0], probes[0].1, "unregister failed");
    }
    let mismatches_after = everywhere::mismatches();
    for cpu in (0..mismatches_after.len()).filter(|&cpu| mismatches_after[cpu] != armed.mismatches_before[cpu]) {
        defmt::error!(
            "sweep: {=str}: the workload's results differ on cpu {=usize} (a pass begun in batch epoch {=u64})",
            label,
            cpu,
            everywhere::mismatch_epoch(cpu)
        );
        for (index, &(address, method)) in probes.iter().enumerate() {
            if armed.accepted[index] {
                report(sweep, address, method, "results differ on another CPU (one of these probes)");
            }
        }
    }
    for (index, &(address, method)) in probes.iter().enumerate() {
        if !held(address) && word_at(address) != armed.originals[index] {
            report(sweep, address, method, "text not restored");
        }
    }
    // Every chunk no probe holds now (the next batch's are checked when it is removed) must be
    // as it was before the sweep: a slot or trampoline of this batch left behind, or written
    // outside its chunk, shows here.
    if !slot_chunks_as_before(sweep) {
        defmt::error!("sweep: {=str}: the slot area differs after unregistering", label);
        sweep.tally.failures += 1;
    }
}

/// Every word of `function` with `method`, in batches, into `hits` (None: refused).
fn sweep_function(sweep: &mut Sweep, function: Function, method: Method, hits: &mut [Option<Count>]) {
    let words = ((function.end - function.start) / 4) as usize;
    for first in (0..words).step_by(BATCH) {
        let count = (words - first).min(BATCH);
        // What xtask repeats (and halves, if this batch hangs): `sweep.probe=` and `sweep.words=`.
        defmt::info!(
            "sweep batch: {=str}+{=u64:#x}:{=str} words {=usize}",
            function.name,
            4 * first as u64,
            method.name(),
            count
        );
        let mut probes = [(0u64, method); BATCH];
        for (index, probe) in probes[..count].iter_mut().enumerate() {
            probe.0 = function.start + 4 * (first + index) as u64;
        }
        hits[first..first + count].copy_from_slice(batch(sweep, &probes[..count], function.name));
    }
}

/// Functions whose hit counts depend on what is probed, not only on the workload: the probe
/// registry (its table walk, the slot chunks it clears and the workload's own probe's chunk
/// depend on which probes the batch holds; so do methods such as
/// `<kernel::probes::kprobe::Retiring>::unpublish_all`, whose search for the workload's probe's
/// record walks past the batch's records, out of line in `full`) and the task exit's shadow-stack high-water scan (the handlers run on the probed
/// task's shadow stack, so a probe makes it deeper). Their results, text and slots are checked;
/// their counts are not compared.
fn count_exempt(name: &str) -> bool {
    name.starts_with("kernel::probes::")
        || name.starts_with("<kernel::probes::")
        || name == "task_exit_current"
        || (SEVERAL_CPUS.load(Ordering::Relaxed)
            && (contended(name) || (TRACING_EVERYWHERE.load(Ordering::Relaxed) && per_traced_call(name))))
}

/// Set when the other CPUs loop on the workload.
static SEVERAL_CPUS: AtomicBool = AtomicBool::new(false);
/// Set while the sweep's counting tracer is on every traceable function (`sweep.ftrace`).
static TRACING_EVERYWHERE: AtomicBool = AtomicBool::new(false);

/// Code whose path on CPU 0 depends on what the other CPUs do at the same time, so its counts
/// vary from pass to pass with no probe at fault: the heap's locked section spins for the lock
/// (`ldrb`/`cbz`/`isb`/`clrex` retry, hit 0 to 4 times on CPU 0) and walks free lists the other
/// CPUs' passes change (the whole prod sweep on 4 CPUs: 49 words of this one function, and no
/// other, differed between methods). The whole heap module: `locked` is generic and may be
/// inlined into its callers, which then hold the lock's retry and its per-CPU spin count (the
/// 4-CPU prod sample since the spin count is per CPU: `heap::reallocate+0x45c`, the spin count's
/// `mrs tpidr_el1`, hit once with brk-step and never with single-step). In `full` the core atomics are out of line, and the lock's
/// retry and its contended path call them (`atomic_compare_exchange_weak::<u8>`,
/// `atomic_load::<u8>`, and `atomic_load::<u64>` for the per-CPU contention count, which only a
/// contended acquire reads: the 4-CPU sample in `full` saw it run 94 times on the other CPUs in
/// its single-step batch, 664 in simulate, 0 in brk-step and detour), and the buddy allocator's
/// block table (`mm/kasan/blocks.rs`), whose free walks and merges follow free lists the other
/// CPUs' passes change (when the allocator was the `buddy_system_allocator` crate, the whole
/// 4-CPU sweep in `full` counted every word of its out-of-line `dealloc` differently by
/// method on CPU 0, e.g. `+0xc8` hit 35 times with single-step and 30 with brk-step). Their results, text and
/// slots are still checked. The kernel test `probe_sweep_exempts_the_heap_locks_callees` checks
/// that every call out of the locked section lands here or in no-probe text. The grace period
/// (`task::cpus::synchronize`, which the workload's unregisters call on CPU 0) loops until the
/// other CPUs answer: the whole prod sweep on 4 CPUs counted `synchronize+0x240` (`ldar`) 520
/// times with single-step, 535 with brk-step, 115 with detour.
pub fn contended(name: &str) -> bool {
    name.starts_with("kernel::mm::kasan::heap::")
        || name.starts_with("core::sync::atomic::")
        || name.starts_with("kernel::mm::kasan::blocks::")
        || name.starts_with("<kernel::mm::kasan::blocks::")
        || name == "kernel::task::cpus::synchronize"
}

/// Code the other CPUs run at an IRQ's exit whose path there depends on what CPU 0's tasks are
/// doing at that instant: the scheduler's pick (`pick_next`, inlined into `switch_locked`)
/// checks each task slot's state and affinity, and CPU 0's workload tasks become runnable and
/// exit while the SGIs of its holds and grace periods land on the other CPUs. The whole prod
/// sweep on 4 CPUs, once a batch took two holds rather than 96 (so the other CPUs' IRQ exits
/// became rare), counted `switch_locked+0x144` (`b.eq`, the affinity check of one slot) once on
/// the other CPUs under simulate and never under detour. CPU 0's counts there stay compared
/// (its pick sees the other CPUs' pinned tasks, always runnable); the kernel test
/// `probe_sweep_exemptions_name_functions` checks the name is a function.
pub fn paced_by_cpu0(name: &str) -> bool {
    name == "kernel::task::switch_locked"
}

/// With a tracer on every function (`sweep.ftrace`): the tracer's own code that runs once for
/// every traced call, so its count on CPU 0 is the number of traced calls CPU 0 made, the calls
/// out of `contended` code included. In `full` the core atomics are traced functions called out
/// of line, and the heap lock's retry and the grace period's wait loop call them as often as the
/// other CPUs make them wait. The list scheme's dispatcher and the counting tracer: the whole
/// `full` sweep on 4 CPUs with a tracer counted `list_func`'s words 1,636 times on CPU 0 with
/// single-step, 1,932 with brk-step, 1,418 with simulate and 1,158 with detour in one batch;
/// 249 words differed with the list scheme, 12 with call-ops and 15 with vector, all in these
/// two functions (`prod` inlines the atomics: its sweep with a tracer found none). Their
/// results, text and slots are still checked; the kernel test
/// `probe_sweep_exemptions_name_functions` checks each name is a function.
pub fn per_traced_call(name: &str) -> bool {
    name == "kernel::ftrace::trampoline::list_func" || name == "kernel::ftrace::tracers::count"
}

/// The function holding `address` and the offset in it.
fn place(symbols: &Symbols, address: u64) -> (&'static str, u64) {
    match crate::symbols::callsites::function_containing(address) {
        Some((start, _)) => (symbols.name_at(start).unwrap_or("?"), address - start),
        None => ("?", 0),
    }
}

/// The name of the function holding `address`.
fn name_of(symbols: &Symbols, address: u64) -> &'static str {
    crate::symbols::callsites::function_containing(address).and_then(|(start, _)| symbols.name_at(start)).unwrap_or("?")
}

/// The per-method hit counts of one function must agree word by word.
fn compare_methods(sweep: &mut Sweep, function: Function, per_method: &[Vec<Option<Count>>]) {
    if count_exempt(function.name) {
        sweep.tally.exempt += 1;
        return;
    }
    for (index, address) in (function.start..function.end).step_by(4).enumerate() {
        let mut seen: Option<(Method, Count)> = None;
        for method in Method::ALL {
            let Some(hits) = per_method[method_index(method)].get(index).copied().flatten() else { continue };
            match seen {
                None => seen = Some((method, hits)),
                // The counts are compared with the first method's pass that did not wait.
                Some((_, first_hits)) if first_hits.waited && !hits.waited => seen = Some((method, hits)),
                Some((first, first_hits)) if !first_hits.agrees(hits, function.name) => {
                    defmt::error!(
                        "sweep: hit counts differ: {=str} {=u64} (other CPUs {=u64}), {=str} {=u64} (other CPUs {=u64})",
                        first.name(),
                        first_hits.cpu0,
                        first_hits.elsewhere,
                        method.name(),
                        hits.cpu0,
                        hits.elsewhere
                    );
                    report(sweep, address, method, "hit count differs between methods");
                }
                Some(_) => {}
            }
        }
    }
}

/// Kretprobes on each function of `group` (at most [`KRETPROBE_GROUP`]) with each method: each
/// one's returns must agree across methods. The group is registered at once and stays
/// registered from one method to the next: its entry probes are armed in one hold
/// (`kretprobe::register_all`), swapped to the next method in one (`change_method_all`), and
/// disarmed in one with one grace period (`unregister_all`), where a kretprobe at a time took
/// five holds and a grace period per function (the kretprobe pass was a seventh of a whole
/// 4-CPU sweep). A member refused a method is unregistered and registered again with the next.
fn sweep_kretprobes(sweep: &mut Sweep, group: &[Function]) {
    let members = group.len().min(KRETPROBE_GROUP);
    let mut functions = [0u64; KRETPROBE_GROUP];
    for (member, function) in group[..members].iter().enumerate() {
        functions[member] = function.start;
        KRETPROBE_ENTRIES[member].store(kretprobe::attach_address(function.start), Ordering::Relaxed);
    }
    let address = |member: usize| kretprobe::attach_address(functions[member]);
    let mut registered = [false; KRETPROBE_GROUP];
    // Per member, the returns counted in each pass by the members whose returns that pass
    // hijacked (registered and returned at least once, a bit each): only passes with the same
    // such members are compared. Another member's hijacked return changes what the workload runs
    // (a walk meeting an outstanding return takes the repairing path:
    // `stacktrace::collect_shadow`), and methods refuse different members (a `ret` is refused
    // by the stepping methods), so two passes that hijack different members may differ with no
    // probe at fault (seen: a slice index inside the shadow walk's repairing path, called only
    // while the workload task's own return was hijacked, 0 returns with that member refused, 2
    // with it registered). A member refused by one method that never returns changes nothing.
    let mut seen: [[Option<(u32, u64)>; Method::ALL.len()]; KRETPROBE_GROUP] =
        [[None; Method::ALL.len()]; KRETPROBE_GROUP];
    for method in Method::ALL {
        everywhere::heartbeat();
        let mut clock = timing::Clock::start();
        // The registered members change method, the others (first method, or refused the last
        // one) register: one hold each, when there are any.
        let mut outcomes = [Ok(()); KRETPROBE_GROUP];
        let split = |registered_now: bool, outcomes: &mut [Result<(), ProbeError>]| {
            let mut picked = [0u64; KRETPROBE_GROUP];
            let mut which = [0usize; KRETPROBE_GROUP];
            let mut count = 0;
            for member in (0..members).filter(|&member| registered[member] == registered_now) {
                picked[count] = functions[member];
                which[count] = member;
                count += 1;
            }
            if count == 0 {
                return;
            }
            let mut results = [Ok(()); KRETPROBE_GROUP];
            if registered_now {
                if let Err(error) = kretprobe::change_method_all(&picked[..count], method, &mut results[..count]) {
                    defmt::error!("sweep: kretprobe: disarming the entry probes: {}", error);
                }
            } else {
                let results = &mut results[..count];
                kretprobe::register_all(&picked[..count], method, Some(kretprobe_entered), count_return, 16, results);
            }
            for (index, &member) in which[..count].iter().enumerate() {
                outcomes[member] = results[index];
            }
        };
        split(true, &mut outcomes);
        split(false, &mut outcomes);
        for member in 0..members {
            registered[member] = outcomes[member].is_ok();
        }
        clock.lap(timing::Phase::KretprobeRegister);
        if !slot_chunks_as_before(sweep) {
            report(sweep, address(0), method, "kretprobe: slot area differs (one of this group)");
        }
        clock.lap(timing::Phase::Checks);
        if !registered[..members].iter().any(|&registered| registered) {
            continue;
        }
        for member in (0..members).filter(|&member| registered[member]) {
            sweep.tally.kretprobes[method_index(method)] += 1;
            RETURNS[member].store(0, Ordering::Relaxed);
        }
        let traces = crate::stacktrace::DEPOT.stats().records;
        COUNTING.store(true, Ordering::Relaxed);
        let results = workload::run();
        COUNTING.store(false, Ordering::Relaxed);
        clock.lap(timing::Phase::KretprobePass);
        // A hijacked return the walkers did not repair would save a trace with the trampoline.
        let new_traces = crate::stacktrace::DEPOT.stats().records != traces;
        let differ = results != Some(sweep.reference);
        // The members whose returns were hijacked in this pass (registered, and returned).
        let set = (0..members)
            .filter(|&member| registered[member] && RETURNS[member].load(Ordering::Relaxed) != 0)
            .fold(0u32, |set, member| set | 1 << member);
        for member in (0..members).filter(|&member| registered[member]) {
            if new_traces {
                report(sweep, functions[member], method, "kretprobe: new stack traces (one of this group)");
            }
            if differ {
                report(sweep, address(member), method, "kretprobe: results differ (one of this group)");
            }
            let miscount = MISCOUNT_RETURNS.load(Ordering::Relaxed) && method == Method::Detour;
            let returns = RETURNS[member].load(Ordering::Relaxed) + u64::from(miscount);
            let passes = &mut seen[member];
            match passes.iter().flatten().find(|(with, _)| *with == set) {
                Some(&(_, first)) if first != returns && !count_exempt(group[member].name) => {
                    report(sweep, address(member), method, "kretprobe: returns differ")
                }
                Some(_) => {}
                None => {
                    if let Some(free) = passes.iter_mut().find(|pass| pass.is_none()) {
                        *free = Some((set, returns));
                    }
                }
            }
        }
        clock.lap(timing::Phase::Checks);
    }
    let mut left = [0u64; KRETPROBE_GROUP];
    let mut count = 0;
    for member in (0..members).filter(|&member| registered[member]) {
        left[count] = functions[member];
        count += 1;
    }
    if count > 0 {
        let mut clock = timing::Clock::start();
        let _ = kretprobe::unregister_all(&left[..count]);
        if sweep.background.is_some() {
            crate::task::cpus::synchronize();
        }
        clock.lap(timing::Phase::KretprobeUnregister);
        if !slot_chunks_as_before(sweep) {
            report(sweep, address(0), Method::Detour, "kretprobe: slot area differs (one of this group)");
        }
    }
    for entry in &KRETPROBE_ENTRIES {
        entry.store(0, Ordering::Relaxed);
    }
}

/// Whether every chunk of the slot area that no probe holds is as it was before the sweep.
fn slot_chunks_as_before(sweep: &Sweep) -> bool {
    let in_use = kprobes::slot_chunks_in_use();
    let bit = |bits: &[u64], chunk: usize| bits[chunk / 64] & (1 << (chunk % 64)) != 0;
    (0..SLOT_CHUNKS).filter(|&chunk| !bit(&in_use, chunk)).all(|chunk| {
        if bit(&sweep.slot_filler, chunk) {
            slot_chunk_is_filler(chunk)
        } else {
            slot_chunk_hash(chunk) == sweep.slot_chunks[chunk]
        }
    })
}

/// The reference pass again, now that everything the sweep keeps is allocated: the heap is in
/// the state every probed pass will find.
fn rerun_reference(sweep: &mut Sweep) -> bool {
    everywhere::heartbeat();
    let _ = workload::run();
    match workload::run() {
        Some(results) => {
            sweep.reference = results;
            true
        }
        None => {
            defmt::error!("sweep: the unprobed workload could not run");
            false
        }
    }
}

/// The longest function a sample draws, in words: a sample checks the rules on many functions,
/// and one decoder of thousands of words (`disarm64::decoder_full::decode_index`) made the 4-CPU
/// CI sample in `full` run over its 300 s (about 50 batches of 48 words per method). The whole
/// sweep takes every function.
const SAMPLE_MAX_WORDS: u64 = 512;

/// The functions a run sweeps: all, or a sample of `functions` of them drawn by `rng` among
/// those of at most [`SAMPLE_MAX_WORDS`].
fn choose(all: &[Function], functions: usize, rng: &mut Rng) -> Vec<Function> {
    let drawable = all.iter().filter(|function| (function.end - function.start) / 4 <= SAMPLE_MAX_WORDS).count();
    if functions == 0 || functions >= drawable {
        return all.to_vec();
    }
    let mut picked: Vec<usize> = Vec::new();
    while picked.len() < functions {
        let index = rng.below(all.len());
        if !picked.contains(&index) && (all[index].end - all[index].start) / 4 <= SAMPLE_MAX_WORDS {
            picked.push(index);
        }
    }
    picked.sort_unstable();
    picked.into_iter().map(|index| all[index]).collect()
}

/// Random sets a run arms: [`WHOLE_SWEEP_SETS`] in a whole sweep, 4 in a sample.
fn set_count(functions: usize) -> usize {
    if functions == 0 { WHOLE_SWEEP_SETS } else { 4 }
}

/// Candidates drawn for one random set (about two in three are accepted).
const SET_CANDIDATES: usize = 192;

/// Random set `set`'s members: the first [`SET_MEMBERS`] candidates (distinct words of `chosen`, each
/// with a method) that `probes::register` accepts, drawn by a generator of the seed and the set
/// index only, so that `sweep.set=K` (with the run's seed and `sweep.functions`) finds the same
/// members and xtask can halve a hanging set. Each candidate is registered and at once
/// unregistered, before the other CPUs run the workload (a grace period then costs little).
fn find_set(chosen: &[Function], seed: u64, set: usize) -> Vec<(u64, Method)> {
    let mut members = Vec::with_capacity(SET_MEMBERS);
    if chosen.is_empty() {
        return members;
    }
    let mut rng = Rng((seed.max(1).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ (set as u64 + 1).wrapping_mul(0xbf58_476d_1ce4_e5b9))
        | 1);
    // The candidates are tried a chunk at a time: `register_all` arms a chunk in one hold and
    // `unregister_all` disarms it in one, where a candidate at a time took two holds per
    // accepted candidate (about a hundred a set). Each is prepared before any word is written,
    // so a candidate is accepted or refused as it would be alone; a chunk ends before a second
    // draw of an address it holds (refused with one method, it may be accepted with another),
    // so the members are the first `SET_MEMBERS` accepted draws of `SET_CANDIDATES`, as one at a time.
    let mut drawn = 0;
    let mut pending = None;
    while members.len() < SET_MEMBERS && (pending.is_some() || drawn < SET_CANDIDATES) {
        let mut chunk = [(0u64, Method::ALL[0]); SET_MEMBERS];
        let mut count = 0;
        while count < SET_MEMBERS {
            let candidate = match pending.take() {
                Some(candidate) => candidate,
                None if drawn < SET_CANDIDATES => {
                    drawn += 1;
                    let function = chosen[rng.below(chosen.len())];
                    let words = ((function.end - function.start) / 4).max(1) as usize;
                    let address = function.start + 4 * rng.below(words) as u64;
                    (address, Method::ALL[rng.below(Method::ALL.len())])
                }
                None => break,
            };
            if members.iter().any(|&(known, _)| known == candidate.0) {
                continue;
            }
            if chunk[..count].iter().any(|&(known, _)| known == candidate.0) {
                pending = Some(candidate);
                break;
            }
            chunk[count] = candidate;
            count += 1;
        }
        let mut results = [Ok(()); SET_MEMBERS];
        kprobes::register_all(&chunk[..count], ignore_hit, None, &mut results);
        let mut accepted = [0u64; SET_MEMBERS];
        let mut armed = 0;
        for (&(address, method), result) in chunk[..count].iter().zip(results) {
            if result.is_ok() {
                accepted[armed] = address;
                armed += 1;
                if members.len() < SET_MEMBERS {
                    members.push((address, method));
                }
            }
        }
        let _ = kprobes::unregister_all(&accepted[..armed]);
    }
    members
}

fn ignore_hit(_: &mut Registers) {}

/// Single probe `single`'s generator, seeded with the run's seed and the single's index only
/// (as a random set's is), so that every shard of a run draws the same singles: its first draw
/// is the function (an index of the chosen functions), its second, once that function is swept,
/// one of the probes its batches accepted.
fn single_rng(seed: u64, single: usize) -> Rng {
    Rng((seed.max(1).wrapping_mul(0xd6e8_feb8_6659_fd93) ^ (single as u64 + 1).wrapping_mul(0x94d0_49bb_1331_11eb)) | 1)
}

/// A small xorshift generator: the sample and the random sets depend on the seed only.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Runs the sweep the command line asks for; true if nothing failed.
pub fn run(args: &Args) -> bool {
    let options = match options_from_args(args) {
        Ok(options) => options,
        Err(message) => {
            defmt::error!("{=str}", message);
            return false;
        }
    };
    let Some(symbols) = Symbols::get() else {
        defmt::error!("sweep: no .ksyms table (an image not built by xtask)");
        return false;
    };
    if options.reenter_twice {
        reentry::run();
        return false;
    }
    let started = crate::drivers::timer::counter();
    // No tick during the sweep: a tick landing in a probed pass preempts it (one more
    // `schedule`, seen as single-step 10 vs brk-step 11 hits on `kernel::task::schedule` in
    // `full`), so the passes would not run the same code. The scheduler still switches at the
    // workload's yields. The periodic tick restarts at the end.
    crate::drivers::timer::fire_in(1 << 60);
    let tracer = options.ftrace.and_then(|scheme| {
        static EVERYWHERE: crate::ftrace::tracers::Counter = crate::ftrace::tracers::Counter::new();
        crate::ftrace::set_scheme(scheme).ok()?;
        let tracer = crate::ftrace::register_where(&EVERYWHERE.ops, |_| true).ok()?;
        defmt::info!("sweep: a counting tracer on every traceable function ({=str})", scheme_name(scheme));
        Some(tracer)
    });
    if options.ftrace.is_some() && tracer.is_none() {
        defmt::error!("sweep: could not trace every function");
        return false;
    }
    TRACING_EVERYWHERE.store(tracer.is_some(), Ordering::Relaxed);
    let mut all = functions(&symbols);
    if let Some(prefix) = options.only {
        all.retain(|function| function.name.starts_with(prefix));
    }
    let mut rng = Rng(options.seed.max(1).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let chosen = choose(&all, options.functions, &mut rng);
    // The random sets' members, found while the other CPUs are idle (see `find_set`): every set
    // of the run (of a shard: its own, the others stay empty and are skipped), or the one
    // `sweep.set=K` repeats.
    let shard = options.shard;
    let mut clock = timing::Clock::start();
    let sets: Vec<Vec<(u64, Method)>> = match options.set {
        Some(set) => alloc::vec![find_set(&chosen, options.seed, set)],
        None if options.probe.is_none() => (0..set_count(options.functions))
            .map(|set| if shard.owns(set) { find_set(&chosen, options.seed, set) } else { Vec::new() })
            .collect(),
        None => Vec::new(),
    };
    clock.lap(timing::Phase::FindSets);
    // The other CPUs loop on the workload from here to the end (their own warm-up and
    // reference first), so CPU 0's reference passes find the heap as the probed ones will.
    SEVERAL_CPUS.store(crate::task::cpus::online() > 1, Ordering::Relaxed);
    let background = if crate::task::cpus::online() > 1 {
        match everywhere::start() {
            Ok(background) => Some(background),
            Err(message) => {
                defmt::error!("{=str}", message);
                return false;
            }
        }
    } else {
        None
    };
    // Warm-up: the depot inserts the workload's traces, the heap reaches its steady state.
    let Some(_) = workload::run() else {
        defmt::error!("sweep: the unprobed workload could not run");
        return false;
    };
    let Some(reference) = workload::run() else {
        defmt::error!("sweep: the unprobed workload could not run");
        return false;
    };
    if workload::run() != Some(reference) {
        defmt::error!("sweep: the unprobed workload is not deterministic");
        return false;
    }
    let (text_start, text_end) = text();
    let text_before = hash_range(text_start, text_end);
    let mut sweep = Sweep {
        reference,
        slot_chunks: core::array::from_fn(slot_chunk_hash),
        slot_filler: (0..SLOT_CHUNKS).filter(|&chunk| slot_chunk_is_filler(chunk)).fold(
            [0; SLOT_CHUNKS / 64],
            |mut bits, chunk| {
                bits[chunk / 64] |= 1 << (chunk % 64);
                bits
            },
        ),
        armed: None,
        buffers: alloc::vec![Armed::new(), Armed::new()],
        symbols,
        tally: Tally {
            armed: [0; 4],
            refused: Vec::with_capacity(64),
            failures: 0,
            batches: 0,
            kretprobes: [0; 4],
            exempt: 0,
            waited: 0,
            missed: 0,
        },
        background,
    };
    let without_spaces = |text: &'static str| text.chars().filter(|&c| c != ' ');
    let find = |name: &'static str| all.iter().find(|function| without_spaces(function.name).eq(without_spaces(name)));
    if let Some((name, offset)) = options.hang {
        let Some(function) = find(name) else {
            defmt::error!("sweep: no function {=str}", name);
            return false;
        };
        defmt::info!("sweep: the probe at {=str}+{=u64:#x} will hang (sweep.inject)", name, offset);
        HANG_AT.store(function.start + offset, Ordering::Relaxed);
    }
    let mut swept = 0usize;
    let mut instructions = 0u64;
    if let Some((name, offset, method)) = options.probe {
        // xtask's repeat line drops the spaces of names like `<StackDepot<4096, 16>>::find`
        // (the command line is split at spaces).
        let Some(function) = find(name) else {
            defmt::error!("sweep: no function {=str}", name);
            return false;
        };
        let words = options.words.min(((function.end - function.start).saturating_sub(offset) / 4) as usize).max(1);
        let mut probes = [(0u64, method); BATCH];
        for (index, probe) in probes[..words].iter_mut().enumerate() {
            probe.0 = function.start + offset + 4 * index as u64;
        }
        if !rerun_reference(&mut sweep) {
            return false;
        }
        defmt::info!("sweep probe address: {=u64:#x}", probes[0].0);
        defmt::info!("sweep batch: {=str}+{=u64:#x}:{=str} words {=usize}", name, offset, method.name(), words);
        let first = batch(&mut sweep, &probes[..words], name)[0];
        disarm(&mut sweep);
        if words == 1 {
            defmt::info!("sweep: probe hit {=u64} times", first.map_or(0, |count| count.cpu0));
        }
        swept = 1;
        instructions = words as u64;
    } else if let Some(set) = options.set {
        let members = &sets[0];
        let (first, end) = (options.members.0, options.members.1.min(members.len()));
        if first >= end {
            defmt::error!("sweep.set: random set {=usize} has {=usize} members", set, members.len());
            return false;
        }
        if !rerun_reference(&mut sweep) {
            return false;
        }
        // What xtask names when this part of the set hangs.
        for (index, &(address, method)) in members.iter().enumerate().take(end).skip(first) {
            let (name, offset) = place(&sweep.symbols, address);
            defmt::info!(
                "sweep member: {=usize} {=str}+{=u64:#x}:{=str} ({=u64:#x})",
                index,
                name,
                offset,
                method.name(),
                address
            );
        }
        defmt::info!("sweep batch: random set {=usize} members {=usize}..{=usize}", set, first, end);
        let hits = batch(&mut sweep, &members[first..end], "random set").to_vec();
        disarm(&mut sweep);
        for (index, hits) in (first..end).zip(hits) {
            defmt::info!("sweep member hits: {=usize} {=u64}", index, hits.map_or(0, |hits| hits.cpu0));
        }
        instructions = (end - first) as u64;
    } else {
        // Everything the sweep keeps is allocated now, before the reference pass (see `batch`).
        // Each random set member's count in its own function's batches (None: refused there).
        let mut expected: Vec<Vec<Option<Count>>> = sets.iter().map(|set| alloc::vec![None; set.len()]).collect();
        let mut set_hits: Vec<Option<Count>> = Vec::with_capacity(SET_MEMBERS);
        // Functions whose kretprobes wait for their group (`sweep_kretprobes`).
        let mut kretprobe_group: Vec<Function> = Vec::with_capacity(KRETPROBE_GROUP);
        let words = MAX_FUNCTION_WORDS as usize;
        let mut per_method: Vec<Vec<Option<Count>>> = (0..4).map(|_| alloc::vec![None; words]).collect();
        // Each single probe's function (an index of `chosen`), and the probe drawn among the
        // probes its batches accepted (None: not this shard's, or none was accepted there).
        let draw_function = |single| single_rng(options.seed, single).below(chosen.len().max(1));
        let single_functions: Vec<usize> = (0..options.singles).map(draw_function).collect();
        let mut singles: Vec<Option<(u64, Method, Count)>> = alloc::vec![None; options.singles];
        let mut workload_entries_hit = 0;
        let shard_functions = (0..chosen.len()).filter(|&ordinal| shard.owns(ordinal)).count();
        if !rerun_reference(&mut sweep) {
            return false;
        }
        for (ordinal, &function) in chosen.iter().enumerate().filter(|&(ordinal, _)| shard.owns(ordinal)) {
            for method in Method::ALL {
                sweep_function(&mut sweep, function, method, &mut per_method[method_index(method)]);
            }
            compare_methods(&mut sweep, function, &per_method);
            for (set, expected) in sets.iter().zip(&mut expected) {
                for (&(address, method), expected) in set.iter().zip(expected.iter_mut()) {
                    if (function.start..function.end).contains(&address) {
                        *expected = per_method[method_index(method)][((address - function.start) / 4) as usize];
                    }
                }
            }
            let per_method = &per_method;
            let accepted = || {
                (function.start..function.end).step_by(4).enumerate().flat_map(|(index, address)| {
                    Method::ALL.into_iter().filter_map(move |method| {
                        per_method[method_index(method)][index].map(|hits| (address, method, hits))
                    })
                })
            };
            let accepted_count = accepted().count();
            if function.name.starts_with("kernel::sweep::workload::") {
                workload_entries_hit += accepted().filter(|(_, _, hits)| hits.cpu0 > 0).count();
            }
            for (single, _) in single_functions.iter().enumerate().filter(|&(_, &drawn)| drawn == ordinal) {
                if accepted_count > 0 {
                    let mut rng = single_rng(options.seed, single);
                    rng.below(chosen.len());
                    singles[single] = accepted().nth(rng.below(accepted_count));
                }
            }
            disarm(&mut sweep);
            kretprobe_group.push(function);
            if kretprobe_group.len() == KRETPROBE_GROUP {
                sweep_kretprobes(&mut sweep, &kretprobe_group);
                kretprobe_group.clear();
            }
            swept += 1;
            instructions += (function.end - function.start) / 4;
            if swept.is_multiple_of(PROGRESS_EVERY) {
                // A run stopped before the end (xtask's timeout) still tells how far it got.
                defmt::info!(
                    "sweep progress: {=usize} of {=usize} functions, {=u64} instructions, {=u64} batches, {=u64} ms",
                    swept,
                    shard_functions,
                    instructions,
                    sweep.tally.batches,
                    (crate::drivers::timer::counter() - started) * 1000 / crate::drivers::timer::frequency()
                );
            }
        }
        if !kretprobe_group.is_empty() {
            sweep_kretprobes(&mut sweep, &kretprobe_group);
        }
        // Probes on the workload's own code that ran must have been hit (the count is not 0).
        let workload_probed = chosen
            .iter()
            .enumerate()
            .any(|(ordinal, function)| shard.owns(ordinal) && function.name == "kernel::sweep::workload::run");
        if workload_probed && workload_entries_hit == 0 {
            defmt::error!("sweep: no probe on the workload's own code was hit");
            sweep.tally.failures += 1;
        }
        // Random sets across the kernel: each probe's count must be its count when armed with
        // its own function's words.
        for (index, (set, expected)) in sets.iter().zip(&expected).enumerate().filter(|(_, (set, _))| !set.is_empty()) {
            defmt::info!("sweep batch: random set {=usize} members 0..{=usize}", index, set.len());
            set_hits.clear();
            set_hits.extend_from_slice(batch(&mut sweep, set, "random set"));
            for ((&(address, method), expected), hits) in set.iter().zip(expected).zip(set_hits.iter().copied()) {
                // Refused among its function's words (not compared), accepted alone.
                let Some(expected) = *expected else { continue };
                let name = name_of(&sweep.symbols, address);
                if !hits.is_some_and(|hits| hits.agrees(expected, name)) && !count_exempt(name) {
                    report(&mut sweep, address, method, "hit count differs in a random set");
                }
            }
        }
        for &(address, method, expected) in singles.iter().flatten() {
            defmt::info!("sweep batch: single {=u64:#x} method {=str}", address, method.name());
            let hits = batch(&mut sweep, &[(address, method)], "single")[0];
            let name = name_of(&sweep.symbols, address);
            if !hits.is_some_and(|hits| hits.agrees(expected, name)) && !count_exempt(name) {
                report(&mut sweep, address, method, "hit count differs when probed alone");
            }
        }
        disarm(&mut sweep);
    }
    if let Some(tracer) = tracer
        && crate::ftrace::unregister(tracer).is_err()
    {
        defmt::error!("sweep: the tracer could not be removed");
        sweep.tally.failures += 1;
    }
    if hash_range(text_start, text_end) != text_before && tracer.is_none() {
        defmt::error!("sweep: kernel text differs from before the sweep");
        sweep.tally.failures += 1;
    }
    let background_cpus = sweep.background.as_ref().map_or(0, everywhere::count);
    if let Some(background) = sweep.background.take() {
        everywhere::stop(background);
    }
    crate::drivers::timer::start(crate::drivers::timer::hz());
    let elapsed_ms = (crate::drivers::timer::counter() - started) * 1000 / crate::drivers::timer::frequency();
    let tally = &sweep.tally;
    defmt::info!(
        "sweep coverage: {=usize} functions ({=u64} with counts not compared), {=u64} instructions, {=u64} batches, {=u64} ms",
        swept,
        tally.exempt,
        instructions,
        tally.batches,
        elapsed_ms
    );
    for method in Method::ALL {
        defmt::info!(
            "sweep probed: {=str} {=u64} (kretprobes {=u64})",
            method.name(),
            tally.armed[method_index(method)],
            tally.kretprobes[method_index(method)]
        );
    }
    for &(reason, count) in &tally.refused {
        defmt::info!("sweep refused: {=u64} {=str}", count, reason);
    }
    defmt::info!("sweep missed: {=u64} re-entered hits (from inside a probe handler)", tally.missed);
    if background_cpus > 0 {
        defmt::info!(
            "sweep cpus: {=usize} (cpu 0 and {=usize} looping the workload: {=u64} passes); {=u64} batches' counts on cpu 0 not compared (it waited for the run queue)",
            background_cpus + 1,
            background_cpus,
            everywhere::passes(),
            tally.waited
        );
    }
    timing::report(tally.batches);
    defmt::info!("sweep done: {=u64} failures", tally.failures);
    tally.failures == 0
}

fn scheme_name(scheme: crate::ftrace::Scheme) -> &'static str {
    match scheme {
        crate::ftrace::Scheme::List => "list",
        crate::ftrace::Scheme::CallOps => "call-ops",
        crate::ftrace::Scheme::Vector => "vector",
    }
}
