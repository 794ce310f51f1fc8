//! Suite `kasan-boot`: what collecting alloc/free stacks costs a tag-based sanitizer
//! kernel that allocates the way a booting kernel does.
//!
//! The workload: 24 distinct "subsystem init" functions, each reached through a recursion of
//! its own depth (3 to 26 frames) and allocating from its own call site, so the stacks differ in
//! site and depth. Sizes follow a fixed pseudo-random sequence skewed to small objects (16 B to
//! 4 KiB, some odd sizes); every object is written and read back whole through instrumented
//! 8-byte accesses; objects go into a table of 256 live slots and a slot's previous object is
//! freed when it is reused, so frees come in mixed order and lifetimes vary. The same sequence
//! runs for every case; the heap's stack mode is the only difference:
//! `no-stacks`, `fp` (frame-pointer unwind + depot), `fp-no-depot` (unwind only), `scs` (shadow
//! call stack copy + depot), `scs-no-depot`, all through `stacktrace::collect`, the kernel's one
//! walker path (the `fp-unwinder`/`scs-unwinder` cases of the heap's former private loops are
//! retired: they would equal `fp`/`scs`); `fp-instrumented`: `fp` with the walker and its
//! memory read compiled with the sanitizer's checks (each frame-record word through the check
//! thunk, as Linux builds its unwinder by default); `fp-sample8`, `scs-sample8`: `fp`, `scs` with
//! one allocation stack in 8 collected (`kasan.stack_sample=8`; free stacks always); `sframe`
//! and `sframe-no-depot`: the walk by the SFrame table, with and without the depot. Each case
//! runs once unmeasured first, so the depot already holds the workload's stacks (steady state:
//! saves are lookup hits, as most are in a running kernel) and one case's new records are not
//! charged to another.
//!
//! Rows: `total` per case, `overhead_pct` relative to `no-stacks`; on `fp`, `scs` and `sframe`,
//! `walk_per_collection` ((X-no-depot - no-stacks) / collections) and `depot_per_collection`
//! ((X - X-no-depot) / collections), derived from the case totals, where collections = the
//! workload's allocations + frees; the allocator's share of the `no-stacks` total
//! (`allocator_pct`: alloc and free calls timed one by one); the depot after the workload
//! (`records`, `bytes`, `hash_collisions`, case `depot`); from the timed run, the mean cost of
//! one call (`alloc_per_call`, `free_per_call` on `no-stacks`: instructions under icount, the
//! counter reads around each call included).

use super::{Plan, row, row_windows};
use crate::arch::counters;
use crate::mm::kasan::Tags;
use crate::mm::kasan::heap::{self, Stacks};
use crate::mm::kasan::storage::TagStorage;
use crate::stacktrace;
use core::hint::black_box;

/// The cases: name, heap stack mode, allocation-stack sampling period (`kasan.stack_sample`).
/// The SFrame walks come last: the replay takes every case before them (`kasan_replay`).
pub(super) const CASES: [(&str, Stacks, u32); 10] = [
    ("no-stacks", Stacks::None, 1),
    ("fp", Stacks::FramePointer, 1),
    ("fp-no-depot", Stacks::FramePointerNoDepot, 1),
    ("scs", Stacks::ShadowCallStack, 1),
    ("scs-no-depot", Stacks::ShadowCallStackNoDepot, 1),
    ("fp-instrumented", Stacks::FramePointerInstrumented, 1),
    ("scs-sample8", Stacks::ShadowCallStack, 8),
    ("fp-sample8", Stacks::FramePointer, 8),
    ("sframe", Stacks::SFrame, 1),
    ("sframe-no-depot", Stacks::SFrameNoDepot, 1),
];

/// Allocations per run.
const ALLOCATIONS: usize = 3000;
const LIVE_SLOTS: usize = 256;

/// The deterministic sequence of sizes and slots.
struct Sequence(u32);

impl Sequence {
    fn next(&mut self) -> u32 {
        self.0 = self.0.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        self.0 >> 8
    }

    fn size(&mut self) -> usize {
        let random = self.next();
        let size = match random % 16 {
            0..=7 => 16 + random as usize % 112,
            8..=12 => 128 + random as usize % 384,
            13..=14 => 512 + random as usize % 1536,
            _ => 2048 + random as usize % 2048,
        };
        if random & 0x100 != 0 { size } else { size & !15 }
    }
}

/// What a run does with its objects, and the time spent in the allocator when `timed`.
struct Workload {
    live: [u64; LIVE_SLOTS],
    sequence: Sequence,
    timed: bool,
    allocator: u64,
    /// Heap calls that collect a stack (allocations and frees).
    collections: u64,
    /// Counter ticks and calls of the timed allocations and frees.
    alloc: (u64, u64),
    free: (u64, u64),
}

impl Workload {
    fn new(timed: bool) -> Self {
        Self {
            live: [0; LIVE_SLOTS],
            sequence: Sequence(0x6b61_7361),
            timed,
            allocator: 0,
            collections: 0,
            alloc: (0, 0),
            free: (0, 0),
        }
    }

    fn timed<R>(&mut self, is_alloc: bool, f: impl FnOnce() -> R) -> R {
        if !self.timed {
            return f();
        }
        let start = counters::cycles();
        let result = f();
        let cost = counters::cycles() - start;
        self.allocator += cost;
        let call = if is_alloc { &mut self.alloc } else { &mut self.free };
        *call = (call.0 + cost, call.1 + 1);
        result
    }

    /// Allocates, fills and checks one object; stores it in a slot, freeing the slot's old one.
    #[inline(never)]
    fn allocate_here(&mut self) {
        let size = self.sequence.size();
        let slot = self.sequence.next() as usize % LIVE_SLOTS;
        let object = self.timed(true, || heap::allocate(size, 16)).expect("the bench heap has room");
        self.collections += 1;
        let words = size / 8;
        for index in 0..words {
            // SAFETY: object has size bytes; words * 8 <= size. Instrumented stores.
            unsafe { ((object as *mut u64).add(index)).write_volatile(index as u64) };
        }
        let mut sum = 0;
        for index in 0..words {
            // SAFETY: as above; instrumented loads.
            sum += unsafe { ((object as *const u64).add(index)).read_volatile() };
        }
        black_box(sum);
        let old = core::mem::replace(&mut self.live[slot], object);
        if old != 0 {
            self.timed(false, || heap::free(old));
            self.collections += 1;
        }
    }

    fn free_all(&mut self) {
        for slot in 0..LIVE_SLOTS {
            let old = core::mem::replace(&mut self.live[slot], 0);
            if old != 0 {
                self.timed(false, || heap::free(old));
                self.collections += 1;
            }
        }
    }
}

/// Recurses `depth` frames, then allocates `count` objects from the caller's site.
#[inline(never)]
fn descend(depth: usize, count: usize, workload: &mut Workload, site: fn(&mut Workload)) {
    if depth == 0 {
        for _ in 0..count {
            site(workload);
        }
        return;
    }
    descend(depth - 1, count, black_box(workload), site);
    black_box(());
}

macro_rules! subsystems {
    ($($name:ident),* $(,)?) => {
        $(
            #[inline(never)]
            fn $name(workload: &mut Workload) {
                workload.allocate_here();
                black_box(());
            }
        )*
        const SUBSYSTEMS: &[fn(&mut Workload)] = &[$($name),*];
    };
}

subsystems!(
    init_memory,
    init_irq,
    init_timers,
    init_sched,
    init_rcu,
    init_workqueues,
    init_vfs,
    init_dcache,
    init_inodes,
    init_block,
    init_net,
    init_sockets,
    init_tty,
    init_console,
    init_pci,
    init_usb,
    init_input,
    init_crypto,
    init_security,
    init_audit,
    init_modules,
    init_kobjects,
    init_sysfs,
    init_procfs,
);

/// One boot: each subsystem in turn allocates a batch from its depth, until ALLOCATIONS.
#[inline(never)]
fn boot(workload: &mut Workload) {
    let mut done = 0;
    let mut round = 0;
    while done < ALLOCATIONS {
        for (index, subsystem) in SUBSYSTEMS.iter().enumerate() {
            let count = 1 + (index + round) % 5;
            let depth = 3 + index;
            descend(depth, count, workload, *subsystem);
            done += count;
        }
        round += 1;
    }
    workload.free_all();
}

pub fn run(plan: &Plan) {
    if !crate::build_info::SHADOW_CALL_STACK {
        defmt::warn!("bench kasan-boot: this build has no shadow call stack; run it on `full`");
        return;
    }
    if !crate::mm::kasan::CHECKS_COMPILED_IN {
        defmt::warn!("bench kasan-boot: build without tag checks (not `full`): figures are not a sanitizer kernel's");
    }
    if !crate::build_info::FRAME_POINTERS {
        defmt::warn!("bench kasan-boot: variant without frame pointers, fp cases refused (not measured)");
    }
    let saved = (heap::stacks(), stacktrace::stack_sample());
    // Collections per boot (the same in every case: the sequence is fixed).
    let collections = {
        let mut workload = Workload::new(false);
        heap::set_stacks(Stacks::None);
        boot(&mut workload);
        workload.collections as f64
    };
    for _ in 0..plan.reps {
        // Each case's window, for its events (`bench.events=1`).
        let mut windows = [0u64; CASES.len()];
        let mut totals = [0.0f64; CASES.len()];
        for (index, &(name, mode, sample)) in CASES.iter().enumerate() {
            // Without frame pointers the frame-walk cases are refused: no row.
            if !mode.available() {
                continue;
            }
            heap::set_stacks(mode);
            stacktrace::set_stack_sample(sample);
            boot(&mut Workload::new(false));
            let window = plan.measure(|| boot(&mut Workload::new(false)));
            let total = window as f64;
            windows[index] = window;
            totals[index] = total;
            row("kasan-boot", name, "-", "total", plan.unit(), total);
            row_windows("kasan-boot", name, "-", "total", window, None, 1);
            let no_stacks = totals[0];
            let overhead = if no_stacks > 0.0 { (total - no_stacks) * 100.0 / no_stacks } else { 0.0 };
            row("kasan-boot", name, "-", "overhead_pct", "percent", overhead);
        }
        let index_of = |name: &str| CASES.iter().position(|case| case.0 == name).unwrap_or(0);
        let total_of = |name: &str| totals[index_of(name)];
        let window_of = |name: &str| windows[index_of(name)];
        for (case, no_depot) in [("fp", "fp-no-depot"), ("scs", "scs-no-depot"), ("sframe", "sframe-no-depot")] {
            if CASES.iter().any(|&(name, mode, _)| name == case && !mode.available()) {
                continue;
            }
            let walk = (total_of(no_depot) - total_of("no-stacks")) / collections;
            let depot = (total_of(case) - total_of(no_depot)) / collections;
            row("kasan-boot", case, "-", "walk_per_collection", plan.unit(), walk);
            let per = collections as u64;
            row_windows(
                "kasan-boot",
                case,
                "-",
                "walk_per_collection",
                window_of(no_depot),
                Some(window_of("no-stacks")),
                per,
            );
            row("kasan-boot", case, "-", "depot_per_collection", plan.unit(), depot);
            row_windows(
                "kasan-boot",
                case,
                "-",
                "depot_per_collection",
                window_of(case),
                Some(window_of(no_depot)),
                per,
            );
        }
        // The allocator's share of a no-stacks boot (alloc and free calls timed one by one).
        heap::set_stacks(Stacks::None);
        // Timed on the cycle counter in every mode, as the calls inside are.
        let mut workload = Workload::new(true);
        let masked = crate::sync::IrqMask::new();
        let start = counters::cycles();
        boot(&mut workload);
        let total = (counters::cycles() - start) as f64;
        drop(masked);
        let share = if total > 0.0 { workload.allocator as f64 * 100.0 / total } else { 0.0 };
        row("kasan-boot", "no-stacks", "-", "allocator_pct", "percent", share);
        for (metric, (cost, calls)) in [("alloc_per_call", workload.alloc), ("free_per_call", workload.free)] {
            row("kasan-boot", "no-stacks", "-", metric, plan.unit(), cost as f64 / calls.max(1) as f64);
        }
    }
    heap::set_stacks(saved.0);
    stacktrace::set_stack_sample(saved.1);
    let stats = stacktrace::DEPOT.stats();
    row("kasan-boot", "depot", "-", "records", "records", stats.records as f64);
    row("kasan-boot", "depot", "-", "bytes", "bytes", stats.bytes as f64);
    row("kasan-boot", "depot", "-", "hash_collisions", "records", stats.collisions as f64);
    let (user, blocks) = heap::usage();
    defmt::info!(
        "bench kasan-boot: heap after the runs: {=usize} bytes requested, {=usize} in blocks; object tags {=u8}..{=u8}",
        user,
        blocks,
        Tags::FIRST_OBJECT_TAG,
        Tags::LAST_OBJECT_TAG
    );
}
