//! Demo part 2: one stack trace of the same point taken both ways, and what each costs.
//!
//! The point is `innermost`, three named calls below the demo. Both traces skip the helper that
//! takes them, so both start at the same return address. Lines: `demo: stacks #N fp=.. scs=..`
//! (0 where a walk has no entry), then each walk's length and stop reason. Without frame
//! pointers the first walk is the SFrame walk (`Mode::DEFAULT`), named `sframe=` and `sframe`. The cost is the bench
//! stacktrace suite's case at the deepest of its depths the point has, measured here with the
//! bench's own measurement (`bench::stacktrace::per_trace`).

use super::cost;
use crate::bench::{Label, Plan, stacktrace as bench};
use crate::stacktrace::{self, Mode};
use core::hint::black_box;
use unwind::{Trace, TraceOptions};

/// The bench stacktrace suite's depths.
const BENCH_DEPTHS: [usize; 5] = [4, 8, 16, 32, 64];

pub fn show(plan: &Plan) {
    if crate::build_info::VARIANT == "plain" {
        defmt::info!(
            "demo: skipped: variant plain has neither frame records in every function nor a shadow call stack (use --variant prod or full)"
        );
        return;
    }
    outer(plan);
}

#[inline(never)]
fn outer(plan: &Plan) {
    middle(plan);
    black_box(());
}

#[inline(never)]
fn middle(plan: &Plan) {
    innermost(plan);
    black_box(());
}

#[inline(never)]
fn innermost(plan: &Plan) {
    let (frames, shadow) = both();
    let walker = Mode::DEFAULT.name();
    let rows = frames.len().max(shadow.len());
    for index in 0..rows {
        let address = |trace: &Trace| trace.entry(index).map_or(0, |entry| entry.address);
        defmt::info!(
            "demo: stacks #{=usize} {=str}={=u64:#x} scs={=u64:#x}",
            index,
            walker,
            address(&frames),
            address(&shadow)
        );
    }
    defmt::info!(
        "demo: stacks: {=str} {=usize} frames ({}), scs {=usize} frames ({})",
        walker,
        frames.len(),
        defmt::Display2Format(&frames.stop_reason()),
        shadow.len(),
        defmt::Display2Format(&shadow.stop_reason())
    );
    // The depot keeps one record per distinct trace: the second save finds the first.
    let saves = [stacktrace::DEPOT.save(frames.addresses()), stacktrace::DEPOT.save(frames.addresses())];
    match saves {
        [Ok(first), Ok(second)] => defmt::info!(
            "demo: stacks: {=str} trace saved in the depot twice: handles {=u32:#x} and {=u32:#x} ({=str})",
            walker,
            first.to_raw(),
            second.to_raw(),
            if first == second { "one record" } else { "two records" }
        ),
        _ => defmt::error!("demo: stacks: the depot refused the trace"),
    }
    // The bench's case for this point: the deepest of its depths both walks reach here.
    let reach = frames.len().min(shadow.len());
    let Some(depth) = BENCH_DEPTHS.into_iter().rev().find(|&depth| depth <= reach) else {
        defmt::warn!("demo: stack too shallow ({=usize} frames) to measure", reach);
        return;
    };
    let params = Label::new(format_args!("depth={depth}"));
    for mode in [Mode::DEFAULT, Mode::ShadowCallStack] {
        cost("stacktrace", mode.name(), params.as_str(), "per_trace", plan, bench::per_trace(plan, mode, depth, false));
    }
}

/// Both traces of `innermost`'s frame, from the same return address. The second `capture` must
/// not be a tail call (LLVM makes it one when nothing follows it): the shadow walk would start
/// after this frame is gone, one entry behind the frame walk.
#[inline(never)]
fn both() -> (Trace, Trace) {
    let options = TraceOptions::new(1, unwind::MAX_FRAMES);
    let both = (stacktrace::capture(Mode::DEFAULT, options), stacktrace::capture(Mode::ShadowCallStack, options));
    black_box(&both);
    both
}
