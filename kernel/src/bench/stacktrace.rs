//! Suite `stacktrace`: what one stack trace costs, frame-pointer walk vs shadow-call-stack copy
//! vs SFrame walk, with and without the stack depot, at depths 4 to 64 (BENCH.md).
//!
//! A recursion of `depth` frames is built, then the leaf takes N traces of exactly `depth`
//! entries through `stacktrace::collect_frames`, `collect_shadow` or `collect_sframe` (the entry
//! points every collection uses),
//! into a buffer on the stack; per_trace = (that loop - the same loop without the trace) / N.
//! With `+depot`, each trace is also saved in the depot: after the first save it is a lookup hit,
//! as most of the allocation stacks a sanitizer saves are.

use super::{Label, Plan, row, row_windows};
use crate::stacktrace::{self, Mode};
use core::hint::black_box;
use core::mem::MaybeUninit;
use unwind::TraceOptions;

const DEPTHS: [usize; 5] = [4, 8, 16, 32, 64];
const CASES: [(&str, Mode, bool); 6] = [
    ("fp", Mode::FramePointer, false),
    ("scs", Mode::ShadowCallStack, false),
    ("fp+depot", Mode::FramePointer, true),
    ("scs+depot", Mode::ShadowCallStack, true),
    ("sframe", Mode::SFrame, false),
    ("sframe+depot", Mode::SFrame, true),
];

/// `trace_once`'s walker: its const parameter.
const FRAMES: u8 = 0;
const SHADOW: u8 = 1;
const SFRAME: u8 = 2;

/// Recurses `remaining` more frames, then measures at the leaf.
#[inline(never)]
fn recurse(remaining: usize, leaf: &mut dyn FnMut()) -> usize {
    if remaining == 0 {
        leaf();
        return 0;
    }
    black_box(recurse(remaining - 1, leaf)) + 1
}

/// One trace of `depth` entries through the walker's own entry point (no mode dispatch: one
/// function per walker, as the heap and `save_stack` reach them), saved in the depot with `DEPOT`.
#[inline(never)]
#[sanitize(kernel_hwaddress = "off")]
fn trace_once<const WALKER: u8, const DEPOT: bool>(depth: usize) {
    let mut buffer = [MaybeUninit::uninit(); unwind::MAX_FRAMES];
    let options = TraceOptions::new(0, depth);
    let walked = match WALKER {
        SHADOW => stacktrace::collect_shadow(options, &mut buffer),
        SFRAME => stacktrace::collect_sframe(options, &mut buffer),
        _ => stacktrace::collect_frames(options, &mut buffer),
    };
    // What the heap and `save_stack` use of a walk: its entries (the stop reason is for
    // reports, which print it from a `Trace`).
    let entries = walked.entries(&buffer);
    if DEPOT {
        let _ = black_box(stacktrace::DEPOT.save(entries));
    } else {
        black_box(entries);
    }
}

/// The trace function of a case.
fn trace_function(mode: Mode, depot: bool) -> fn(usize) {
    match (mode, depot) {
        (Mode::FramePointer, false) => trace_once::<FRAMES, false>,
        (Mode::ShadowCallStack, false) => trace_once::<SHADOW, false>,
        (Mode::SFrame, false) => trace_once::<SFRAME, false>,
        (Mode::FramePointer, true) => trace_once::<FRAMES, true>,
        (Mode::ShadowCallStack, true) => trace_once::<SHADOW, true>,
        (Mode::SFrame, true) => trace_once::<SFRAME, true>,
    }
}

#[inline(never)]
fn nothing(_depth: usize) {
    black_box(());
}

/// The two windows behind a `per_trace` figure: N traces, and the same loop calling an empty
/// function.
#[derive(Clone, Copy, Default)]
struct TraceWindows {
    cost: u64,
    alone: u64,
    iterations: u64,
}

impl TraceWindows {
    fn per_trace(self) -> f64 {
        (self.cost as f64 - self.alone as f64) / self.iterations as f64
    }
}

/// Both windows of `depth`-entry traces at the caller's point.
#[inline(always)]
fn measure_traces(plan: &Plan, mode: Mode, depth: usize, depot: bool) -> TraceWindows {
    let iterations: u64 = if plan.icount { 1_000 } else { 20_000 };
    let body = black_box(trace_function(mode, depot));
    let empty = black_box(nothing as fn(usize));
    let alone = plan.measure(|| (0..iterations).for_each(|_| empty(depth)));
    let cost = plan.measure(|| (0..iterations).for_each(|_| body(depth)));
    TraceWindows { cost, alone, iterations }
}

/// What one trace of `depth` entries costs at the caller's point: N traces minus the same loop
/// calling an empty function, per trace. The demo measures its point with this too.
pub(crate) fn per_trace(plan: &Plan, mode: Mode, depth: usize, depot: bool) -> f64 {
    measure_traces(plan, mode, depth, depot).per_trace()
}

pub fn run(plan: &Plan) {
    if !crate::build_info::SHADOW_CALL_STACK {
        defmt::warn!("bench stacktrace: variant without a shadow call stack, scs cases skipped");
    }
    if !crate::build_info::FRAME_POINTERS {
        defmt::warn!("bench stacktrace: variant without frame pointers, fp cases refused (not measured)");
    }
    for _ in 0..plan.reps {
        for depth in DEPTHS {
            let params = Label::new(format_args!("depth={depth}"));
            let params = params.as_str();
            for (case, mode, depot) in CASES {
                if (mode == Mode::ShadowCallStack && !crate::build_info::SHADOW_CALL_STACK) || !mode.available() {
                    continue;
                }
                let mut windows = TraceWindows::default();
                recurse(depth, &mut || windows = measure_traces(plan, mode, depth, depot));
                row("stacktrace", case, params, "per_trace", plan.unit(), windows.per_trace());
                row_windows(
                    "stacktrace",
                    case,
                    params,
                    "per_trace",
                    windows.cost,
                    Some(windows.alone),
                    windows.iterations,
                );
            }
        }
    }
}
