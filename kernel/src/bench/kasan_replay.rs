//! Suite `kasan-replay`: what collecting alloc/free stacks costs the sanitizer heap on a real
//! allocation stream, Linux's boot as `cargo xtask peer linux --alloc-trace` recorded it.
//!
//! xtask converts the committed trace into `protocol::replay`'s blob and QEMU's `-device
//! loader` puts it at [`BLOB_ADDRESS`] for this suite's runs alone; the kernel checks it with
//! the protocol's reader and replays its events in the recorded order: each allocation with its
//! requested size from the innermost frame function of its recorded stack (`crate::replay`), so
//! the walkers and the depot see Linux's stacks; each free from the replay loop (the trace
//! records no free stacks). On a run with fewer CPUs than the trace recorded, every event runs
//! on this CPU; with as many (`--smp 4`), each recorded CPU's events run on a CPU of their own,
//! in the recorded order across CPUs (see [`together`]). Every object's first and last byte is
//! written through an instrumented store, so the replay is a sanitizer workload too: it makes
//! no bad access and must end with no report; `inject::Fault::ReplayPlantsBugs` plants an
//! off-by-one write and a use after free at random points ([`Planted`]).
//!
//! Memory: the trace's live set peaks at 9.8 MB requested, about 18.5 MB in the heap's buddy
//! blocks (a block is the request plus header and guard granules, rounded to a power of two),
//! more than the 16 MiB heap. The trace is therefore replayed in windows of [`WINDOW`]
//! allocations: at a window's end the objects still live are freed (`window_frees`) and a later
//! free of one of them is counted, not replayed (`frees_across_windows`); the heap's blocks then
//! peak at 8,284,672 bytes (`heap_peak_blocks`). An allocation the heap refuses anyway is
//! counted (`failed_allocations`), and so is the later free of its slot (`frees_of_failed`):
//! nothing is skipped silently, since it would change the depot's counts. The slot table (one
//! pointer per slot of the blob) lies in the replay's own RAM after the blob, not in the heap it
//! measures, and the rest of that RAM becomes stack depot pools ([`grant_depot_pools`]), so that
//! the depot holds every replayed stack.
//!
//! Cases, as `kasan-boot`'s (same heap stack modes and sampling): `no-stacks`, `fp`,
//! `fp-no-depot`, `scs`, `scs-no-depot`, `fp-instrumented`, `scs-sample8`, `fp-sample8`; each
//! replays the whole trace once, measured. Rows per case: `total`, `overhead_pct` relative to
//! `no-stacks`; on `fp` and `scs`, `walk_per_collection` and `depot_per_collection` as in
//! `kasan-boot` (collections = allocations + frees the replay made); on one CPU, on
//! `no-stacks`, `alloc_per_call` and `free_per_call` from a timed replay; on several, per case
//! the `cpus` suite's contention counters per heap call (`cas_failures`, `lock_spins`,
//! `gate_waits`). Case `depot`: what the first collecting case (`fp`) added to the stack depot:
//! `records`, `bytes`, `hit_rate` (percent of its saves that found their stack),
//! `hash_collisions`, `full` (saves the depot had no room for) and `pools_added` (the pools the
//! replay's RAM gave it). Case `trace`: the blob's `distinct_stacks`, `allocations` and `frees`
//! (recorded), and what this replay did with them (`failed_allocations`, `frees_of_failed`,
//! `window_frees`, `frees_across_windows`, `reports`: sanitizer reports during the replays),
//! and on one CPU `heap_peak_blocks`: the heap's peak in buddy blocks while replaying, the
//! kernel's own objects included. Rows of a run on several CPUs carry the param `cpus=N`.

use super::{Clock, Label, Plan, row};
use crate::arch::mmu::VA_OFFSET;
use crate::arch::{counters, cpu, percpu};
use crate::inject::{self, Fault};
use crate::mm::kasan::HARDWARE_TAGS;
use crate::mm::kasan::heap::{self, Stacks};
use crate::mm::kasan::recording;
use crate::mm::kasan::report::BugType;
use crate::mm::kasan::shadow::SHORT_GRANULES;
use crate::replay::{Path, context};
use crate::stacktrace;
use crate::sync::IrqMask;
use crate::task::{self, CpuMask, cpus as online_cpus, stacks::CPUS};
use core::hint::black_box;
use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use protocol::replay::{BLOB_ADDRESS, Blob, Event, MAX_RECORDED_DEPTH, REGION_SIZE, SLOTS_OFFSET};

const SUITE: &str = "kasan-replay";

/// kasan-boot's cases but its last two, the SFrame walks: the replay's frame functions carry no
/// call-frame information, so an SFrame walk stops in them.
const CASES: &[(&str, Stacks, u32)] = super::kasan_boot::CASES.split_at(super::kasan_boot::CASES.len() - 2).0;
const _: () = {
    let boot = &super::kasan_boot::CASES;
    assert!(
        matches!(boot[boot.len() - 2].1, Stacks::SFrame) && matches!(boot[boot.len() - 1].1, Stacks::SFrameNoDepot)
    );
};

/// Allocations per window: the committed trace's blocks peak near 8.3 MB in each, against the
/// heap's 16 MiB.
pub const WINDOW: u32 = 30_000;

/// Slot values that are not objects (the heap's addresses are far above them).
const EMPTY: u64 = 0;
/// The slot's allocation failed: its free is counted, not replayed.
const FAILED: u64 = 1;
/// The slot's object was freed at its window's end.
const CLOSED: u64 = 2;

/// The blob QEMU loaded for this suite, checked, and its slot table; `None` (said why) when the
/// run has no blob or its slots do not fit the replay's RAM.
fn loaded() -> Option<(Blob<'static>, &'static mut [u64])> {
    let base = BLOB_ADDRESS + VA_OFFSET;
    if heap::range().1 > base {
        defmt::error!("bench kasan-replay: the heap reaches into the replay's RAM at {=u64:#x}", BLOB_ADDRESS);
        return None;
    }
    // SAFETY: [BLOB_ADDRESS, +REGION_SIZE) is RAM of the linear map above the heap (checked
    // above) that nothing else in the kernel uses; QEMU loaded the blob into its first part
    // before the kernel started. Only this suite reads it, on one CPU.
    let bytes: &'static [u8] = unsafe { core::slice::from_raw_parts(base as *const u8, SLOTS_OFFSET) };
    let blob = match Blob::parse(bytes) {
        Ok(blob) => blob,
        Err(error) => {
            defmt::error!(
                "bench kasan-replay: no replay blob at {=u64:#x} ({=str}): run it through `cargo xtask bench kasan-replay`",
                BLOB_ADDRESS,
                match error {
                    protocol::replay::BlobError::NotABlob => "no magic",
                    protocol::replay::BlobError::OtherVersion(_) => "another version",
                    protocol::replay::BlobError::Truncated => "truncated",
                    protocol::replay::BlobError::TooManyFrames(_) => "too many frames",
                }
            );
            return None;
        }
    };
    let slots = blob.header.slots as usize;
    if slots * 8 > REGION_SIZE - SLOTS_OFFSET {
        defmt::error!("bench kasan-replay: {=usize} slots do not fit the replay's RAM", slots);
        return None;
    }
    // SAFETY: the slot table's part of the replay's RAM, after the blob's part (disjoint from
    // `bytes`), 8-byte aligned, mapped, and used by this suite alone; zeroed before use.
    let table = unsafe { core::slice::from_raw_parts_mut((base + SLOTS_OFFSET as u64) as *mut u64, slots) };
    Some((blob, table))
}

/// Gives the stack depot the rest of the replay's RAM, after the slot table, as pools of
/// [`stackdepot::MAX_POOL_BYTES`] each, once per boot; returns the pools added.
///
/// The kernel's four 256 KiB pools hold about 5,400 of the committed trace's replayed stacks
/// (about 200 bytes a record: its recorded frames plus the lab's own); its 9,197 need about
/// 1.9 MB.
/// The depot takes more pools at run time (`DEPOT` names 16), so the suite's own RAM makes the
/// room, and the kernel's pools, which every other suite measures, stay as they are. The records
/// are permanent, so the pools are too: nothing else in the kernel uses that RAM, and the suite
/// runs last of all (`protocol::suite`'s order).
fn grant_depot_pools(slots: usize) -> usize {
    static GRANTED: AtomicUsize = AtomicUsize::new(usize::MAX);
    let granted = GRANTED.load(Ordering::Relaxed);
    if granted != usize::MAX {
        return granted;
    }
    let mut start = (SLOTS_OFFSET + slots * 8).next_multiple_of(stackdepot::RECORD_ALIGN);
    let mut added = 0;
    while start + stackdepot::MAX_POOL_BYTES <= REGION_SIZE {
        // SAFETY: [start, +MAX_POOL_BYTES) lies in the replay's RAM (checked against
        // REGION_SIZE) after the slot table, mapped, above the heap (`loaded` checked it) and
        // used by nothing else; GRANTED makes this run once per boot, so each range is handed
        // out once and the depot owns it for good.
        let pool = unsafe {
            core::slice::from_raw_parts_mut(
                (BLOB_ADDRESS + VA_OFFSET + start as u64) as *mut u8,
                stackdepot::MAX_POOL_BYTES,
            )
        };
        if stacktrace::DEPOT.add_pool(pool).is_err() {
            break;
        }
        added += 1;
        start += stackdepot::MAX_POOL_BYTES;
    }
    GRANTED.store(added, Ordering::Relaxed);
    added
}

/// What one replay did.
#[derive(Clone, Copy, Default)]
struct Counts {
    /// Heap calls that collect a stack (allocations and frees made).
    collections: u64,
    /// Allocations replayed (made or failed).
    allocations: u64,
    failed: u64,
    frees_of_failed: u64,
    window_frees: u64,
    frees_across_windows: u64,
    /// Counter ticks and calls of the timed allocations and frees.
    alloc: (u64, u64),
    free: (u64, u64),
    /// The heap's peak bytes in buddy blocks, read after each allocation of the timed replay.
    peak: usize,
}

impl Counts {
    const ZERO: Self = Self {
        collections: 0,
        allocations: 0,
        failed: 0,
        frees_of_failed: 0,
        window_frees: 0,
        frees_across_windows: 0,
        alloc: (0, 0),
        free: (0, 0),
        peak: 0,
    };

    /// Adds another CPU's counts of the same replay (its untimed ones).
    fn add(&mut self, other: &Self) {
        self.collections += other.collections;
        self.allocations += other.allocations;
        self.failed += other.failed;
        self.frees_of_failed += other.frees_of_failed;
        self.window_frees += other.window_frees;
        self.frees_across_windows += other.frees_across_windows;
    }
}

/// One allocation's request and result, which the leaf reads through the path's context word.
struct Call {
    size: usize,
    timed: bool,
    object: Option<u64>,
    cost: u64,
}

/// The innermost frame of a replayed stack: the allocation itself.
extern "C" fn allocate_leaf(cursor: *const usize) {
    // SAFETY: the leaf of a Path built by `replay` below, whose context word is a live `Call`
    // no one else touches during the call.
    let call = unsafe { &mut *(context(cursor) as *mut Call) };
    if call.timed {
        let start = counters::cycles();
        call.object = heap::allocate(call.size, 16);
        call.cost = counters::cycles() - start;
    } else {
        call.object = heap::allocate(call.size, 16);
    }
}

fn free_timed(object: u64, timed: bool, counts: &mut Counts) {
    if timed {
        let start = counters::cycles();
        heap::free(object);
        let cost = counters::cycles() - start;
        counts.free = (counts.free.0 + cost, counts.free.1 + 1);
    } else {
        heap::free(object);
    }
    counts.collections += 1;
}

/// Frees the objects still live at a window's end (or the replay's).
fn close_window(slots: &[AtomicU64], timed: bool, counts: &mut Counts) {
    for slot in slots {
        let object = slot.load(Ordering::Relaxed);
        if object > CLOSED {
            free_timed(object, timed, counts);
            counts.window_frees += 1;
            slot.store(CLOSED, Ordering::Relaxed);
        }
    }
}

/// Makes one recorded allocation from the innermost frame function of its stack, into `slot`.
fn allocate(blob: &Blob, slot: &AtomicU64, size: u32, stack: u32, timed: bool, counts: &mut Counts) {
    counts.allocations += 1;
    let mut call = Call { size: size as usize, timed, object: None, cost: 0 };
    let frames = Frames::of(blob.stack(stack).expect("the reader checked every stack"));
    let path = Path::new(frames.iter(), allocate_leaf, &raw mut call as usize);
    path.call();
    if timed {
        counts.alloc = (counts.alloc.0 + call.cost, counts.alloc.1 + 1);
        counts.peak = counts.peak.max(heap::usage().1);
    }
    let value = match call.object {
        Some(object) => {
            counts.collections += 1;
            if size > 0 {
                // SAFETY: object has `size` bytes; instrumented stores, checked against the
                // object's tag.
                unsafe {
                    (object as *mut u8).write_volatile(1);
                    (object as *mut u8).add(size as usize - 1).write_volatile(1);
                }
            }
            object
        }
        None => {
            counts.failed += 1;
            FAILED
        }
    };
    slot.store(value, Ordering::Relaxed);
}

/// Makes one recorded free of `slot` (number `index`), or counts it when there is nothing to
/// free.
fn free(slot: &AtomicU64, index: u32, timed: bool, counts: &mut Counts) {
    match slot.swap(EMPTY, Ordering::Relaxed) {
        FAILED => counts.frees_of_failed += 1,
        CLOSED => counts.frees_across_windows += 1,
        EMPTY => panic!("the blob frees slot {index}, which holds nothing"),
        object => free_timed(object, timed, counts),
    }
}

/// The slot table as the replay shares it between CPUs.
fn shared(slots: &mut [u64]) -> &[AtomicU64] {
    // SAFETY: AtomicU64 has u64's size and alignment, and the exclusive borrow of `slots` is
    // held for as long as the returned view, so every access goes through the atomics.
    unsafe { &*(core::ptr::from_mut::<[u64]>(slots) as *const [AtomicU64]) }
}

/// Bugs the replay plants at random points of its stream (`inject::Fault::ReplayPlantsBugs`),
/// and what the sanitizer said about each.
#[derive(Clone, Copy, Debug, Default)]
pub struct Planted {
    /// The off-by-one write follows the first allocation from this one on whose next byte has
    /// another tag: an object that fills its last 16-byte granule (a granule has one tag, as in
    /// Linux's tag-based modes), or, in builds with the software tags' short granules, any
    /// object but one whose next byte is its last granule's tag byte (writing it would change
    /// the tag, not overrun the object).
    pub off_by_one_from: u32,
    /// The use after free follows the first free of an object after this allocation.
    pub use_after_free_after: u32,
    /// Reports each planted access raised and the last one's type; `None`: not planted (the
    /// prefix ended first).
    pub off_by_one: Option<(u64, Option<BugType>)>,
    pub use_after_free: Option<(u64, Option<BugType>)>,
}

/// Writes the byte just past an object of `size` bytes, inside the recording scope (which also
/// turns MTE's checks back on after the fault it resumes from).
#[inline(never)]
fn write_one_past(object: u64, size: u32) -> (u64, Option<BugType>) {
    let (reports, last) = recording::scope(|| {
        // SAFETY: the planted bug: one byte past a live heap object, inside its block's guard
        // granule (the heap's blocks end with one), so mapped heap memory and nothing else's;
        // the sanitizer reports the store and, recording, lets it through into the guard.
        unsafe { (object as *mut u8).add(size as usize).write_volatile(0xbb) };
    });
    (reports, last.map(|report| report.bug))
}

/// Reads the first byte of an object just freed, inside the recording scope.
#[inline(never)]
fn read_freed(object: u64) -> (u64, Option<BugType>) {
    let (reports, last) = recording::scope(|| {
        // SAFETY: the planted bug: the object's block was freed just now and nothing has been
        // allocated since, so it is mapped heap memory that nothing else holds; a read changes
        // nothing, and the sanitizer reports it.
        black_box(unsafe { (object as *const u8).read_volatile() });
    });
    (reports, last.map(|report| report.bug))
}

/// Replays the blob's events in order, in windows of [`WINDOW`] allocations, up to (not
/// including) allocation number `limit`, planting `planting`'s bugs when given.
#[inline(never)]
fn replay(blob: &Blob, slots: &mut [u64], timed: bool, limit: u32, mut planting: Option<&mut Planted>) -> Counts {
    let mut counts = Counts::default();
    slots.fill(EMPTY);
    let slots = shared(slots);
    let mut allocations = 0u32;
    for event in blob.events().take(blob.header.events as usize) {
        match event {
            Event::Allocate { slot, size, stack, .. } => {
                if allocations == limit {
                    break;
                }
                if allocations > 0 && allocations.is_multiple_of(WINDOW) {
                    close_window(slots, timed, &mut counts);
                }
                allocations += 1;
                let slot = &slots[slot as usize];
                allocate(blob, slot, size, stack, timed, &mut counts);
                if let Some(planted) = planting.as_deref_mut() {
                    let object = slot.load(Ordering::Relaxed);
                    let overruns = size > 0
                        && if SHORT_GRANULES && !HARDWARE_TAGS { size % 16 != 15 } else { size.is_multiple_of(16) };
                    if planted.off_by_one.is_none()
                        && allocations > planted.off_by_one_from
                        && object > CLOSED
                        && overruns
                    {
                        planted.off_by_one = Some(write_one_past(object, size));
                    }
                }
            }
            Event::Free { slot: index, .. } => {
                let slot = &slots[index as usize];
                let object = slot.load(Ordering::Relaxed);
                free(slot, index, timed, &mut counts);
                if let Some(planted) = planting.as_deref_mut()
                    && planted.use_after_free.is_none()
                    && allocations > planted.use_after_free_after
                    && object > CLOSED
                {
                    planted.use_after_free = Some(read_freed(object));
                }
            }
        }
    }
    close_window(slots, timed, &mut counts);
    black_box(counts)
}

/// A recorded stack's frame IDs, gathered so [`Path::new`] can take them outermost first.
struct Frames {
    ids: [u16; MAX_RECORDED_DEPTH],
    len: usize,
}

impl Frames {
    fn of(stack: impl Iterator<Item = u16>) -> Self {
        let mut frames = Self { ids: [0; MAX_RECORDED_DEPTH], len: 0 };
        for frame in stack {
            assert!(frames.len < MAX_RECORDED_DEPTH, "a replayed stack deeper than {MAX_RECORDED_DEPTH}");
            frames.ids[frames.len] = frame;
            frames.len += 1;
        }
        frames
    }

    fn iter(&self) -> impl DoubleEndedIterator<Item = u16> + '_ {
        self.ids[..self.len].iter().copied()
    }
}

/// What a replay of a prefix did, for the kernel's test of it.
pub struct Prefix {
    pub allocations: u64,
    pub failed: u64,
    pub frees_of_failed: u64,
    pub frees_across_windows: u64,
    /// Sanitizer reports during the replay.
    pub reports: u64,
    /// The depot's lookups and hits during the replay.
    pub lookups: u64,
    pub hits: u64,
    /// The bugs planted (`inject::Fault::ReplayPlantsBugs` on), and how each was reported.
    pub planted: Option<Planted>,
}

/// Replays the whole trace as [`replay_prefix`] does, with the depot given the replay's room
/// first (as the suite gives it), so that every stack it collects, and whatever else saves
/// stacks meanwhile (the profiler's samples), finds a place.
pub fn replay_whole(mode: Stacks) -> Option<Prefix> {
    let (_, slots) = loaded()?;
    grant_depot_pools(slots.len());
    replay_prefix(u32::MAX, mode)
}

/// Replays the trace's first `allocations` allocations (and the events between them) with the
/// heap's stacks in `mode`, as the suite does; `None` when no blob was loaded.
pub fn replay_prefix(allocations: u32, mode: Stacks) -> Option<Prefix> {
    let (blob, slots) = loaded()?;
    let saved = (heap::stacks(), stacktrace::stack_sample());
    heap::set_stacks(mode);
    stacktrace::set_stack_sample(1);
    let (reports, depot) = (crate::mm::kasan::report::count(), stacktrace::DEPOT.stats());
    let mut planted = inject::on(Fault::ReplayPlantsBugs).then(|| {
        // Points drawn from the cycle counter, in the prefix's first half so that frees follow.
        let mut seed = counters::cycles() | 1;
        let mut draw = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % u64::from(allocations.max(2) / 2)) as u32
        };
        let planted = Planted { off_by_one_from: draw(), use_after_free_after: draw(), ..Planted::default() };
        defmt::info!(
            "replay: planting an off-by-one write after allocation {=u32}, a use after free after {=u32}",
            planted.off_by_one_from,
            planted.use_after_free_after
        );
        planted
    });
    let counts = replay(&blob, slots, false, allocations, planted.as_mut());
    let after = stacktrace::DEPOT.stats();
    heap::set_stacks(saved.0);
    stacktrace::set_stack_sample(saved.1);
    Some(Prefix {
        allocations: counts.allocations,
        failed: counts.failed,
        frees_of_failed: counts.frees_of_failed,
        frees_across_windows: counts.frees_across_windows,
        reports: crate::mm::kasan::report::count() - reports,
        lookups: after.lookups - depot.lookups,
        hits: after.hits - depot.hits,
        planted,
    })
}

/// The replay on as many CPUs as the trace recorded: what its streams share.
///
/// Each recorded CPU's events run on a CPU of their own, from a task pinned there, every
/// stream from the same call site of [`stream_worker`], so that a recorded stack gives the same
/// lab stack on every CPU and the depot's records stay the trace's distinct stacks. The recorded
/// order across CPUs is kept whole: event `i` (in the blob's order) waits until [`NEXT`] is
/// `i`, and its CPU then sets it to `i + 1`. So a free of an object allocated on another CPU
/// comes after its allocation, a slot is taken again only after its free, and a window closes
/// where it closes on one CPU; what runs at once is one event with the end of the one before
/// (its stores, its CPU's walk to its next event) and the waiting CPUs' polls. That order is
/// the trace's own: Linux's CPUs did run at once, but the trace holds no finer order than its
/// timestamps' interleaving, and a looser one (each slot's events in order only) could not tell
/// a closed window's object from the next one in its slot without the blob naming each free's
/// allocation.
mod together {
    use super::Counts;
    use crate::sync::IrqSpinLock;
    use core::sync::atomic::{AtomicBool, AtomicU64};
    use protocol::replay::Blob;

    /// The blob and the slot table (address, slots) of the replay being run.
    pub(super) static SHARED: IrqSpinLock<Option<(Blob<'static>, usize, usize)>> = IrqSpinLock::new(None);
    /// The next event to run, in the blob's order.
    pub(super) static NEXT: AtomicU64 = AtomicU64::new(0);
    /// The run a worker belongs to: it starts when [`START`] holds it.
    pub(super) static START: AtomicU64 = AtomicU64::new(0);
    pub(super) static RUNS: AtomicU64 = AtomicU64::new(0);
    /// Streams ready and done, bit n for recorded CPU n; [`ALL`] the streams of the run.
    pub(super) static READY: AtomicU64 = AtomicU64::new(0);
    pub(super) static DONE: AtomicU64 = AtomicU64::new(0);
    pub(super) static ALL: AtomicU64 = AtomicU64::new(0);
    /// A stream gave up waiting for its turn: the run is not a replay of the trace.
    pub(super) static ABORTED: AtomicBool = AtomicBool::new(false);
    /// The window's cost in raw clock ticks ([`NANOSECONDS`] says which clock), and the streams'
    /// counts added up.
    pub(super) static COST: AtomicU64 = AtomicU64::new(0);
    pub(super) static NANOSECONDS: AtomicBool = AtomicBool::new(false);
    pub(super) static TOTALS: IrqSpinLock<Counts> = IrqSpinLock::new(Counts::ZERO);
}

/// How long a stream waits for the others to start, or for its turn: a window's closing frees
/// (tens of millions of instructions) may come between two of its events.
const TURN_MS: u64 = 60_000;

fn clock_ticks() -> u64 {
    if together::NANOSECONDS.load(Ordering::Relaxed) { counters::virtual_count() } else { counters::cycles() }
}

/// One recorded CPU's events (`me`), each in its turn (see [`together`]).
#[inline(never)]
fn stream(blob: &Blob, slots: &[AtomicU64], me: u32) -> Counts {
    use together::{ABORTED, NEXT};
    let mut counts = Counts::default();
    let mut allocations = 0u32;
    let events = u64::from(blob.header.events);
    for (index, event) in blob.events().take(events as usize).enumerate() {
        let (recorded, closes_window) = match event {
            Event::Allocate { cpu, .. } => {
                let closes = allocations > 0 && allocations.is_multiple_of(WINDOW);
                allocations += 1;
                (cpu, closes)
            }
            Event::Free { cpu, .. } => (cpu, false),
        };
        if recorded != me {
            continue;
        }
        if !cpu::wait_until(TURN_MS, || NEXT.load(Ordering::Acquire) == index as u64) {
            defmt::error!("bench kasan-replay: cpu {=u32}: event {=usize} never came", me, index);
            ABORTED.store(true, Ordering::Relaxed);
            return counts;
        }
        if closes_window {
            close_window(slots, false, &mut counts);
        }
        match event {
            Event::Allocate { slot, size, stack, .. } => {
                allocate(blob, &slots[slot as usize], size, stack, false, &mut counts)
            }
            Event::Free { slot, .. } => free(&slots[slot as usize], slot, false, &mut counts),
        }
        NEXT.store(index as u64 + 1, Ordering::Release);
        cpu::send_event();
    }
    // The stream that finds every event made closes the last window, once.
    if cpu::wait_until(TURN_MS, || NEXT.load(Ordering::Acquire) >= events)
        && NEXT.compare_exchange(events, events + 1, Ordering::AcqRel, Ordering::Relaxed).is_ok()
    {
        close_window(slots, false, &mut counts);
    }
    counts
}

/// A recorded CPU's stream as a task pinned to its CPU: the argument is the run << 8 | the
/// recorded CPU. Stream 0 runs on the CPU that started the replay and measures the window: from
/// when every stream is ready to when every one is done.
extern "C" fn stream_worker(argument: u64) {
    use together::*;
    let (run, me) = (argument >> 8, (argument & 0xff) as u32);
    let Some((blob, address, len)) = *SHARED.lock() else { return };
    // SAFETY: the slot table `replay_on_cpus` shared: `len` AtomicU64s at `address`, borrowed
    // by it until every stream is joined.
    let slots = unsafe { core::slice::from_raw_parts(address as *const AtomicU64, len) };
    let _mask = IrqMask::new();
    let all = ALL.load(Ordering::Relaxed);
    READY.fetch_or(1 << me, Ordering::Release);
    cpu::send_event();
    let start = if me == 0 {
        if !cpu::wait_until(TURN_MS, || READY.load(Ordering::Acquire) == all) {
            ABORTED.store(true, Ordering::Relaxed);
        }
        let start = clock_ticks();
        START.store(run, Ordering::Release);
        cpu::send_event();
        start
    } else {
        if !cpu::wait_until(TURN_MS, || START.load(Ordering::Acquire) == run) {
            ABORTED.store(true, Ordering::Relaxed);
        }
        0
    };
    let counts = if ABORTED.load(Ordering::Relaxed) { Counts::ZERO } else { stream(&blob, slots, me) };
    TOTALS.lock().add(&counts);
    DONE.fetch_or(1 << me, Ordering::Release);
    cpu::send_event();
    if me == 0 {
        if !cpu::wait_until(TURN_MS, || DONE.load(Ordering::Acquire) == all) {
            ABORTED.store(true, Ordering::Relaxed);
        }
        COST.store(clock_ticks() - start, Ordering::Relaxed);
    }
}

/// One replay of the whole trace with each of its `cpus` recorded CPUs' events on a CPU of its
/// own: the window's cost on the plan's clock and what the streams did, or `None` (said why).
fn replay_on_cpus(plan: &Plan, blob: &Blob<'static>, slots: &mut [u64], cpus: usize) -> Option<(u64, Counts)> {
    use together::*;
    slots.fill(EMPTY);
    let slots = shared(slots);
    *SHARED.lock() = Some((*blob, slots.as_ptr() as usize, slots.len()));
    NANOSECONDS.store(matches!(plan.clock, Clock::Nanoseconds), Ordering::Relaxed);
    NEXT.store(0, Ordering::Relaxed);
    READY.store(0, Ordering::Relaxed);
    DONE.store(0, Ordering::Relaxed);
    ABORTED.store(false, Ordering::Relaxed);
    ALL.store((1 << cpus) - 1, Ordering::Relaxed);
    *TOTALS.lock() = Counts::ZERO;
    let run = RUNS.fetch_add(1, Ordering::Relaxed) + 1;
    let me = percpu::this_cpu_index();
    let targets = core::iter::once(me).chain((0..CPUS).filter(|&other| other != me && online_cpus::is_online(other)));
    let mut workers = [None; CPUS];
    for (recorded, target) in targets.take(cpus).enumerate() {
        match task::spawn_on(CpuMask::one(target), "replay-stream", stream_worker, run << 8 | recorded as u64) {
            Ok(id) => workers[recorded] = Some(id),
            Err(_) => {
                defmt::error!("bench kasan-replay: cannot start a stream on cpu {=usize}", target);
                ABORTED.store(true, Ordering::Relaxed);
            }
        }
    }
    // A stream that never saw its start is released by ABORTED: every one ends and is joined.
    if workers.iter().flatten().count() != cpus {
        START.store(run, Ordering::Release);
        cpu::send_event();
    }
    for id in workers.into_iter().flatten() {
        task::join(id);
    }
    *SHARED.lock() = None;
    if ABORTED.load(Ordering::Relaxed) || DONE.load(Ordering::Acquire) != ALL.load(Ordering::Relaxed) {
        defmt::error!("bench kasan-replay: the replay on {=usize} CPUs did not finish", cpus);
        return None;
    }
    let ticks = COST.load(Ordering::Relaxed);
    let cost = match plan.clock {
        Clock::Cycles => ticks,
        Clock::Nanoseconds => (ticks as u128 * 1_000_000_000 / crate::drivers::timer::frequency() as u128) as u64,
    };
    Some((cost, *TOTALS.lock()))
}

/// The contention counters of the `cpus` suite, added up over the kernel and the depot.
fn contention() -> (u64, u64, u64) {
    let depot = stackdepot::contention();
    (depot.cas_failures, depot.lock_spins + crate::sync::lock_spins(), depot.gate_waits)
}

pub fn run(plan: &Plan) {
    if !crate::build_info::SHADOW_CALL_STACK {
        defmt::warn!("bench kasan-replay: this build has no shadow call stack; run it on `full`");
        return;
    }
    if !crate::build_info::FRAME_POINTERS {
        defmt::warn!(
            "bench kasan-replay: this build has no frame pointers (its cases walk frame records); run it on `full`"
        );
        return;
    }
    if !crate::mm::kasan::CHECKS_COMPILED_IN && !HARDWARE_TAGS {
        defmt::warn!(
            "bench kasan-replay: build without tag checks (not `full` or `mte`): figures are not a sanitizer kernel's"
        );
    }
    let Some((blob, slots)) = loaded() else {
        return;
    };
    let pools_added = grant_depot_pools(slots.len());
    // Every recorded CPU's stream on its own CPU when the run has as many; else all on this one.
    let recorded = blob.header.cpus as usize;
    let cpus = if recorded > 1 && online_cpus::online() >= recorded { recorded } else { 1 };
    let label = Label::new(format_args!("cpus={cpus}"));
    let params = if cpus == 1 { "-" } else { label.as_str() };
    let saved = (heap::stacks(), stacktrace::stack_sample());
    let reports_before = crate::mm::kasan::report::count();
    let mut depot = None;
    let mut last = Counts::default();
    let mut peak = None;
    for _ in 0..plan.reps {
        let mut totals = [0.0f64; CASES.len()];
        let mut collections = 0.0;
        for (index, &(name, mode, sample)) in CASES.iter().enumerate() {
            heap::set_stacks(mode);
            stacktrace::set_stack_sample(sample);
            let before = stacktrace::DEPOT.stats();
            let contended = contention();
            let (total, counts) = if cpus == 1 {
                let mut counts = Counts::default();
                (plan.measure(|| counts = replay(&blob, slots, false, u32::MAX, None)), counts)
            } else {
                let Some(result) = replay_on_cpus(plan, &blob, slots, cpus) else { return };
                result
            };
            let total = total as f64;
            if name == "fp" && depot.is_none() {
                depot = Some((before, stacktrace::DEPOT.stats()));
            }
            if index == 0 {
                collections = counts.collections as f64;
            }
            last = counts;
            totals[index] = total;
            row(SUITE, name, params, "total", plan.unit(), total);
            let no_stacks = totals[0];
            let overhead = if no_stacks > 0.0 { (total - no_stacks) * 100.0 / no_stacks } else { 0.0 };
            row(SUITE, name, params, "overhead_pct", "percent", overhead);
            if cpus > 1 {
                // Per heap call, as the `cpus` suite's per operation.
                let after = contention();
                let calls = (counts.collections as f64).max(1.0);
                for (metric, value) in [
                    ("cas_failures", after.0 - contended.0),
                    ("lock_spins", after.1 - contended.1),
                    ("gate_waits", after.2 - contended.2),
                ] {
                    row(SUITE, name, params, metric, "per_op", value as f64 / calls);
                }
            }
        }
        let total_of = |name: &str| CASES.iter().position(|case| case.0 == name).map_or(0.0, |index| totals[index]);
        for (case, no_depot) in [("fp", "fp-no-depot"), ("scs", "scs-no-depot")] {
            let walk = (total_of(no_depot) - total_of("no-stacks")) / collections.max(1.0);
            let save = (total_of(case) - total_of(no_depot)) / collections.max(1.0);
            row(SUITE, case, params, "walk_per_collection", plan.unit(), walk);
            row(SUITE, case, params, "depot_per_collection", plan.unit(), save);
        }
        if cpus == 1 {
            // The mean cost of one heap call, timed one by one on the cycle counter.
            heap::set_stacks(Stacks::None);
            stacktrace::set_stack_sample(1);
            let masked = crate::sync::IrqMask::new();
            let timed = replay(&blob, slots, true, u32::MAX, None);
            drop(masked);
            peak = Some(timed.peak);
            for (metric, (cost, calls)) in [("alloc_per_call", timed.alloc), ("free_per_call", timed.free)] {
                row(SUITE, "no-stacks", params, metric, plan.unit(), cost as f64 / calls.max(1) as f64);
            }
        }
    }
    heap::set_stacks(saved.0);
    stacktrace::set_stack_sample(saved.1);
    let (before, after) = depot.unwrap_or_default();
    let lookups = after.lookups - before.lookups;
    let hits = after.hits - before.hits;
    row(SUITE, "depot", params, "records", "records", after.records as f64 - before.records as f64);
    row(SUITE, "depot", params, "bytes", "bytes", after.bytes as f64 - before.bytes as f64);
    row(SUITE, "depot", params, "hit_rate", "percent", hits as f64 * 100.0 / lookups.max(1) as f64);
    row(SUITE, "depot", params, "hash_collisions", "records", (after.collisions - before.collisions) as f64);
    // A save that missed and added no record found the depot full: what the heap keeps as
    // `STACK_DEPOT_FULL` in place of the stack.
    let full = (after.misses - before.misses).saturating_sub((after.records - before.records) as u64);
    row(SUITE, "depot", params, "full", "records", full as f64);
    row(SUITE, "depot", params, "pools_added", "count", pools_added as f64);
    let header = blob.header;
    let reports = crate::mm::kasan::report::count() - reports_before;
    for (metric, value) in [
        ("distinct_stacks", u64::from(header.stacks)),
        ("allocations", u64::from(header.allocations)),
        ("frees", u64::from(header.frees)),
        ("failed_allocations", last.failed),
        ("frees_of_failed", last.frees_of_failed),
        ("window_frees", last.window_frees),
        ("frees_across_windows", last.frees_across_windows),
        ("reports", reports),
    ] {
        row(SUITE, "trace", params, metric, "count", value as f64);
    }
    if let Some(peak) = peak {
        row(SUITE, "trace", params, "heap_peak_blocks", "bytes", peak as f64);
    }
}
