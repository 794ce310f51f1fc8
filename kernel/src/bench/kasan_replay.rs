//! Suite `kasan-replay`: what collecting alloc/free stacks costs the sanitizer heap on a real
//! allocation stream, Linux's boot as `cargo xtask peer linux --alloc-trace` recorded it.
//!
//! xtask converts the committed trace into `protocol::replay`'s blob and QEMU's `-device
//! loader` puts it at [`BLOB_ADDRESS`] for this suite's runs alone; the kernel checks it with
//! the protocol's reader and replays its events in the recorded order on this CPU (every
//! recorded CPU's events on one): each allocation with its requested size from the innermost
//! frame function of its recorded stack (`crate::replay`), so the walkers and the depot see
//! Linux's stacks; each free from the replay loop (the trace records no free stacks). Every
//! object's first and last byte is written through an instrumented store, so the replay is a
//! sanitizer workload too: it makes no bad access and must end with no report.
//!
//! Memory: the trace's live set peaks at 9.8 MB requested, about 18.5 MB in the heap's buddy
//! blocks (a block is the request plus header and guard granules, rounded to a power of two),
//! more than the 16 MiB heap. The trace is therefore replayed in windows of [`WINDOW`]
//! allocations: at a window's end the objects still live are freed (`window_frees`) and a later
//! free of one of them is counted, not replayed (`frees_across_windows`); the heap's blocks then
//! peak at 8,284,672 bytes (`heap_peak_blocks`). An allocation the heap refuses anyway is counted (`failed_allocations`),
//! and so is the later free of its slot (`frees_of_failed`): nothing is skipped silently, since
//! it would change the depot's counts. The slot table (one pointer per slot of the blob) lies in
//! the replay's own RAM after the blob, not in the heap it measures.
//!
//! Cases, as `kasan-boot`'s (same heap stack modes and sampling): `no-stacks`, `fp`,
//! `fp-no-depot`, `scs`, `scs-no-depot`, `fp-instrumented`, `scs-sample8`, `fp-sample8`; each
//! replays the whole trace once, measured. Rows per case: `total`, `overhead_pct` relative to
//! `no-stacks`; on `fp` and `scs`, `walk_per_collection` and `depot_per_collection` as in
//! `kasan-boot` (collections = allocations + frees the replay made); on `no-stacks`,
//! `alloc_per_call` and `free_per_call` from a timed replay. Case `depot`: what the first
//! collecting case (`fp`) added to the stack depot: `records`, `bytes`, `hit_rate` (percent of
//! its saves that found their stack), `hash_collisions`. Case `trace`: the blob's
//! `distinct_stacks`, `allocations` and `frees` (recorded), and what this replay did with them
//! (`failed_allocations`, `frees_of_failed`, `window_frees`, `frees_across_windows`, `reports`:
//! sanitizer reports during the replays), and `heap_peak_blocks`: the heap's peak in buddy
//! blocks while replaying, the kernel's own objects included.

use super::{Plan, row};
use crate::arch::counters;
use crate::arch::mmu::VA_OFFSET;
use crate::mm::kasan::heap::{self, Stacks};
use crate::replay::{Path, context};
use crate::stacktrace;
use core::hint::black_box;
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
fn close_window(slots: &mut [u64], timed: bool, counts: &mut Counts) {
    for slot in slots.iter_mut() {
        if *slot > CLOSED {
            free_timed(*slot, timed, counts);
            counts.window_frees += 1;
            *slot = CLOSED;
        }
    }
}

/// Replays the blob's events in order, in windows of [`WINDOW`] allocations, up to (not
/// including) allocation number `limit`.
#[inline(never)]
fn replay(blob: &Blob, slots: &mut [u64], timed: bool, limit: u32) -> Counts {
    let mut counts = Counts::default();
    slots.fill(EMPTY);
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
                counts.allocations += 1;
                let mut call = Call { size: size as usize, timed, object: None, cost: 0 };
                let frames = Frames::of(blob.stack(stack).expect("the reader checked every stack"));
                let path = Path::new(frames.iter(), allocate_leaf, &raw mut call as usize);
                path.call();
                if timed {
                    counts.alloc = (counts.alloc.0 + call.cost, counts.alloc.1 + 1);
                    counts.peak = counts.peak.max(heap::usage().1);
                }
                slots[slot as usize] = match call.object {
                    Some(object) => {
                        counts.collections += 1;
                        if size > 0 {
                            // SAFETY: object has `size` bytes; instrumented stores, checked
                            // against the object's tag.
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
            }
            Event::Free { slot, .. } => {
                let object = core::mem::replace(&mut slots[slot as usize], EMPTY);
                match object {
                    FAILED => counts.frees_of_failed += 1,
                    CLOSED => counts.frees_across_windows += 1,
                    EMPTY => panic!("the blob frees slot {slot}, which holds nothing"),
                    object => free_timed(object, timed, &mut counts),
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
}

/// Replays the trace's first `allocations` allocations (and the events between them) with the
/// heap's stacks in `mode`, as the suite does; `None` when no blob was loaded.
pub fn replay_prefix(allocations: u32, mode: Stacks) -> Option<Prefix> {
    let (blob, slots) = loaded()?;
    let saved = (heap::stacks(), stacktrace::stack_sample());
    heap::set_stacks(mode);
    stacktrace::set_stack_sample(1);
    let (reports, depot) = (crate::mm::kasan::report::count(), stacktrace::DEPOT.stats());
    let counts = replay(&blob, slots, false, allocations);
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
    })
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
    if !crate::mm::kasan::CHECKS_COMPILED_IN {
        defmt::warn!("bench kasan-replay: build without tag checks (not `full`): figures are not a sanitizer kernel's");
    }
    let Some((blob, slots)) = loaded() else {
        return;
    };
    let saved = (heap::stacks(), stacktrace::stack_sample());
    let reports_before = crate::mm::kasan::report::count();
    let mut depot = None;
    let mut last = Counts::default();
    let mut peak = 0;
    for _ in 0..plan.reps {
        let mut totals = [0.0f64; CASES.len()];
        let mut collections = 0.0;
        for (index, &(name, mode, sample)) in CASES.iter().enumerate() {
            heap::set_stacks(mode);
            stacktrace::set_stack_sample(sample);
            let before = stacktrace::DEPOT.stats();
            let mut counts = Counts::default();
            let total = plan.measure(|| counts = replay(&blob, slots, false, u32::MAX)) as f64;
            if name == "fp" && depot.is_none() {
                depot = Some((before, stacktrace::DEPOT.stats()));
            }
            if index == 0 {
                collections = counts.collections as f64;
            }
            last = counts;
            totals[index] = total;
            row(SUITE, name, "-", "total", plan.unit(), total);
            let no_stacks = totals[0];
            let overhead = if no_stacks > 0.0 { (total - no_stacks) * 100.0 / no_stacks } else { 0.0 };
            row(SUITE, name, "-", "overhead_pct", "percent", overhead);
        }
        let total_of = |name: &str| CASES.iter().position(|case| case.0 == name).map_or(0.0, |index| totals[index]);
        for (case, no_depot) in [("fp", "fp-no-depot"), ("scs", "scs-no-depot")] {
            let walk = (total_of(no_depot) - total_of("no-stacks")) / collections.max(1.0);
            let save = (total_of(case) - total_of(no_depot)) / collections.max(1.0);
            row(SUITE, case, "-", "walk_per_collection", plan.unit(), walk);
            row(SUITE, case, "-", "depot_per_collection", plan.unit(), save);
        }
        // The mean cost of one heap call, timed one by one on the cycle counter.
        heap::set_stacks(Stacks::None);
        stacktrace::set_stack_sample(1);
        let masked = crate::sync::IrqMask::new();
        let timed = replay(&blob, slots, true, u32::MAX);
        drop(masked);
        peak = timed.peak;
        for (metric, (cost, calls)) in [("alloc_per_call", timed.alloc), ("free_per_call", timed.free)] {
            row(SUITE, "no-stacks", "-", metric, plan.unit(), cost as f64 / calls.max(1) as f64);
        }
    }
    heap::set_stacks(saved.0);
    stacktrace::set_stack_sample(saved.1);
    let (before, after) = depot.unwrap_or_default();
    let lookups = after.lookups - before.lookups;
    let hits = after.hits - before.hits;
    row(SUITE, "depot", "-", "records", "records", after.records as f64 - before.records as f64);
    row(SUITE, "depot", "-", "bytes", "bytes", after.bytes as f64 - before.bytes as f64);
    row(SUITE, "depot", "-", "hit_rate", "percent", hits as f64 * 100.0 / lookups.max(1) as f64);
    row(SUITE, "depot", "-", "hash_collisions", "records", (after.collisions - before.collisions) as f64);
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
        row(SUITE, "trace", "-", metric, "count", value as f64);
    }
    row(SUITE, "trace", "-", "heap_peak_blocks", "bytes", peak as f64);
}
