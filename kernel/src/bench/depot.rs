//! Suite `depot`: the stack depot on its own (BENCH.md). `insert-miss` and `lookup-hit` per
//! operation at depths 16 and 64; `lookup-hit-mixed`: 256 stored depth-16 stacks looked up in a
//! fixed pseudo-random order (each lookup a different record and chain, as a sanitizer's saves
//! are); `saturation` with 1, 1,024 and 65,536 distinct stacks, each inserted and then looked
//! up 100 times: records, bytes, hash collisions and hit rate.
//!
//! Traces are synthesized (kernel-text-like addresses from a seeded generator) so that the depot
//! sees exactly the number of distinct stacks each case asks for. Each case uses a depot of its
//! own, built in static memory (no allocator).

use super::{Label, Plan, row, row_windows};
use crate::sync::StaticBlocks;
use core::hint::black_box;
use stackdepot::StackDepot;

const POOL_SIZE: usize = 256 << 10;
const POOLS: usize = 96;
/// 24 MiB of pool memory, handed out to the cases' depots as they need it: 10 MiB for the
/// per-operation cases (every insert-miss is a new record), 10.3 MiB for 65,536 distinct stacks.
static POOL_MEMORY: StaticBlocks<POOLS, POOL_SIZE> = StaticBlocks::new();

type BenchDepot = StackDepot<65536, 48>;
static DEPOT_OPS: BenchDepot = StackDepot::new();
static DEPOT_SATURATION: [BenchDepot; 3] = [const { StackDepot::new() }; 3];

/// Gives `depot` `count` more pools.
fn grow(depot: &BenchDepot, count: usize) -> bool {
    for _ in 0..count {
        let Some(pool) = POOL_MEMORY.claim() else {
            return false;
        };
        if depot.add_pool(pool).is_err() {
            return false;
        }
    }
    true
}

/// Distinct stack number `index` of `depth` frames (frames look like kernel return addresses).
pub(super) fn synthetic_stack(index: u64, salt: u64, depth: usize, frames: &mut [u64; 64]) -> &[u64] {
    let mut state = index.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ salt ^ 0x5851_f42d_4c95_7f2d;
    for frame in frames.iter_mut().take(depth) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        *frame = 0xffff_ff80_4008_0000 + (state & 0xf_fffc);
    }
    &frames[..depth]
}

pub fn run(plan: &Plan) {
    let iterations: u64 = if plan.icount { 1_000 } else { 2_000 };
    grow(&DEPOT_OPS, 40);
    let mut salt = 0;
    for rep in 0..plan.reps {
        for depth in [16usize, 64] {
            let params = Label::new(format_args!("depth={depth}"));
            let params = params.as_str();
            let mut frames = [0u64; 64];
            // insert-miss: new stacks each time; the loop alone builds the same stacks.
            salt += 1;
            let alone = plan.measure(|| {
                for index in 0..iterations {
                    black_box(synthetic_stack(index, salt, depth, &mut frames));
                }
            });
            let cost = plan.measure(|| {
                for index in 0..iterations {
                    let _ = black_box(DEPOT_OPS.save(synthetic_stack(index, salt, depth, &mut frames)));
                }
            });
            per_op_rows("insert-miss", params, plan.unit(), cost, alone, iterations);
            // lookup-hit: one stack already in the depot, saved again and again.
            let existing = synthetic_stack(0, salt, depth, &mut frames);
            let existing: [u64; 64] = core::array::from_fn(|index| existing.get(index).copied().unwrap_or(0));
            let alone = plan.measure(|| {
                for _ in 0..iterations {
                    black_box(&existing[..depth]);
                }
            });
            let cost = plan.measure(|| {
                for _ in 0..iterations {
                    let _ = black_box(DEPOT_OPS.save(black_box(&existing[..depth])));
                }
            });
            per_op_rows("lookup-hit", params, plan.unit(), cost, alone, iterations);
        }
        lookup_hit_mixed(plan, iterations, &mut salt);
        // Saturation: counts, not times; once.
        if rep == 0 {
            for (depot, distinct) in DEPOT_SATURATION.iter().zip([1u64, 1024, 65536]) {
                saturation(depot, distinct);
            }
        }
    }
}

/// Stacks of `lookup-hit-mixed`.
const MIXED: usize = 256;

/// `lookup-hit-mixed`: every lookup a hit on one of 256 depth-16 stacks, in a fixed
/// pseudo-random order, so no lookup finds its record (or its chain) where the previous left it.
fn lookup_hit_mixed(plan: &Plan, iterations: u64, salt: &mut u64) {
    *salt += 1;
    // On the heap, filled before the measured window opens.
    let mut stacks = alloc::vec![[0u64; 16]; MIXED];
    let mut frames = [0u64; 64];
    for (index, stack) in stacks.iter_mut().enumerate() {
        stack.copy_from_slice(synthetic_stack(index as u64, *salt, 16, &mut frames));
        let _ = DEPOT_OPS.save(stack);
    }
    // The order: the top byte of a multiplicative hash of the step (Fibonacci hashing), the
    // same in both loops.
    const _: () = assert!(MIXED == 256);
    let order = |step: u64| (step.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as usize;
    let stacks = &*stacks;
    let alone = plan.measure(|| {
        for step in 0..iterations {
            black_box(&stacks[order(black_box(step))][..]);
        }
    });
    let cost = plan.measure(|| {
        for step in 0..iterations {
            let _ = black_box(DEPOT_OPS.save(black_box(&stacks[order(black_box(step))][..])));
        }
    });
    per_op_rows("lookup-hit-mixed", "depth=16", plan.unit(), cost, alone, iterations);
}

/// The `per_op` row of a case measured as `cost` against the loop `alone`, and its windows for
/// the events (`bench.events=1`). Out of line, so that the measuring code hands it the two
/// windows and keeps nothing live after them.
#[inline(never)]
fn per_op_rows(case: &str, params: &str, unit: &str, cost: u64, alone: u64, iterations: u64) {
    row("depot", case, params, "per_op", unit, (cost as f64 - alone as f64) / iterations as f64);
    row_windows("depot", case, params, "per_op", cost, Some(alone), iterations);
}

fn saturation(depot: &BenchDepot, distinct: u64) {
    const DEPTH: usize = 16;
    // About 150 bytes a record: 65,536 stacks need ~10 MiB.
    let pools = (distinct as usize * 160).div_ceil(POOL_SIZE) + 1;
    if !grow(depot, pools) {
        defmt::warn!("bench depot: no pool memory left for saturation {=u64}", distinct);
        return;
    }
    let mut frames = [0u64; 64];
    let mut failed = 0u64;
    for index in 0..distinct {
        failed += u64::from(depot.save(synthetic_stack(index, 0xd15, DEPTH, &mut frames)).is_err());
    }
    for _ in 0..100 {
        for index in 0..distinct {
            failed += u64::from(depot.save(synthetic_stack(index, 0xd15, DEPTH, &mut frames)).is_err());
        }
    }
    let stats = depot.stats();
    let params = Label::new(format_args!("distinct={distinct}"));
    let params = params.as_str();
    row("depot", "saturation", params, "records", "records", stats.records as f64);
    row("depot", "saturation", params, "bytes", "bytes", stats.bytes as f64);
    row("depot", "saturation", params, "hash_collisions", "records", stats.collisions as f64);
    let hit_rate = if stats.lookups == 0 { 0.0 } else { stats.hits as f64 * 100.0 / stats.lookups as f64 };
    row("depot", "saturation", params, "hit_rate", "percent", hit_rate);
    if failed != 0 {
        defmt::warn!("bench depot: {=u64} saves failed at saturation {=u64}", failed, distinct);
    }
}
