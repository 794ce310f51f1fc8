//! Function-graph tracer tests: entry and exit events in call order, return values and
//! addresses through the hijacked return under PAC and SCS, the counted overflow, traces taken
//! inside a graph-traced function (frame records and shadow stack), and a kretprobe on the
//! same function.

use core::hint::black_box;
use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::{Context, Outcome, Test, Verdict, check, check_eq, fail};
use crate::ftrace::{self, graph};
use crate::probes::{Method, ProbeError, Registers, Text, kretprobe};
use crate::stacktrace::{self, Mode};
use crate::symbols::callsites;
use crate::sync::IrqSpinLock;
use unwind::{Trace, TraceOptions};

pub const TESTS: &[Test] = &[
    Test { name: "fgraph_records_calls_and_returns_in_order", run: records_calls_and_returns },
    Test { name: "fgraph_overflow_is_counted_and_returns_stay_right", run: overflow_is_counted },
    Test { name: "fgraph_fp_trace_shows_real_callers", run: fp_trace_shows_real_callers },
    Test { name: "fgraph_scs_trace_shows_real_callers", run: scs_trace_shows_real_callers },
    Test { name: "fgraph_sframe_trace_shows_real_callers", run: sframe_trace_shows_real_callers },
    Test { name: "fgraph_and_kretprobe_on_one_function", run: with_kretprobe },
];

fn untraceable_build() -> Option<Outcome> {
    (callsites::entries().is_empty()).then_some(Ok(Verdict::Skipped("variant plain has no patchable entries")))
}

fn address(function: fn(u64) -> u64) -> u64 {
    function as *const () as u64
}

fn register_at(functions: &[u64]) -> Result<::ftrace::TracerId, ftrace::Error> {
    graph::register_where(|entry| functions.contains(&(entry + 8)))
}

#[inline(never)]
fn graph_inner(x: u64) -> u64 {
    black_box(x).wrapping_mul(5) ^ 3
}

#[inline(never)]
fn graph_outer(x: u64) -> u64 {
    let first = graph_inner(black_box(x));
    first.wrapping_add(graph_inner(black_box(x + 1)))
}

/// This CPU's events, oldest first.
fn events() -> impl Iterator<Item = graph::Event> {
    let cpu = crate::arch::percpu::this_cpu_index();
    (0..).map_while(move |index| graph::event(cpu, index))
}

fn records_calls_and_returns(_: &Context) -> Outcome {
    if let Some(skip) = untraceable_build() {
        return skip;
    }
    let expected = graph_outer(7);
    let (outer, inner) = (address(graph_outer), address(graph_inner));
    graph::clear();
    let Ok(tracer) = register_at(&[outer, inner]) else { return Err(fail("register")) };
    let result = black_box(graph_outer as fn(u64) -> u64)(7);
    check!(ftrace::unregister(tracer).is_ok());
    check_eq!(result, expected);
    check_eq!(graph::outstanding(), 0);
    // No registration and no return left: the walkers compare one trampoline again.
    check_eq!(graph::walk_trampoline(), 0);
    // outer { inner(); inner(); }: entries and exits with their depths, exits carrying the entry
    // time, times never going back.
    let shape =
        [(outer, 0, false), (inner, 1, false), (inner, 1, true), (inner, 1, false), (inner, 1, true), (outer, 0, true)];
    let mut seen = 0;
    let mut last_time = 0;
    let mut entry_times = [0u64; 2];
    for event in events() {
        check!(seen < shape.len());
        let (function, depth, exit) = shape[seen];
        check_eq!(event.function, function);
        check_eq!(event.depth, depth);
        check_eq!(event.exit.is_some(), exit);
        check!(event.time >= last_time);
        last_time = event.time;
        match event.exit {
            None => entry_times[depth as usize] = event.time,
            Some(entry_time) => check_eq!(entry_time, entry_times[depth as usize]),
        }
        seen += 1;
    }
    check_eq!(seen, shape.len());
    Ok(Verdict::Passed)
}

#[inline(never)]
fn graph_recurse(n: u64) -> u64 {
    if n == 0 { 0 } else { n + black_box(graph_recurse as fn(u64) -> u64)(n - 1) }
}

fn overflow_is_counted(_: &Context) -> Outcome {
    if let Some(skip) = untraceable_build() {
        return skip;
    }
    const CALLS: u64 = graph::DEPTH as u64 + 16;
    graph::clear();
    let Ok(tracer) = register_at(&[address(graph_recurse)]) else { return Err(fail("register")) };
    let result = black_box(graph_recurse as fn(u64) -> u64)(CALLS - 1);
    check!(ftrace::unregister(tracer).is_ok());
    // Every return went back to its caller: the sum is right and nothing is left outstanding.
    check_eq!(result, CALLS * (CALLS - 1) / 2);
    check_eq!(graph::outstanding(), 0);
    // The calls beyond the stack's depth were neither recorded nor hijacked, and counted.
    check_eq!(graph::overflows(), CALLS - graph::DEPTH as u64);
    check_eq!(events().filter(|event| event.exit.is_none()).count(), graph::DEPTH);
    check_eq!(events().filter(|event| event.exit.is_some()).count(), graph::DEPTH);
    graph::clear();
    Ok(Verdict::Passed)
}

/// The trace `graph_body` takes in its body.
static BODY_TRACE: IrqSpinLock<Trace> = IrqSpinLock::new(Trace::new());
static TRACE_MODE: AtomicUsize = AtomicUsize::new(0);

fn trace_mode() -> Mode {
    match TRACE_MODE.load(Ordering::Relaxed) {
        1 => Mode::ShadowCallStack,
        2 => Mode::SFrame,
        _ => Mode::FramePointer,
    }
}

#[inline(never)]
fn graph_body(x: u64) -> u64 {
    let trace = stacktrace::capture(trace_mode(), TraceOptions::ALL);
    *BODY_TRACE.lock() = trace;
    black_box(x) + 1
}

/// One call site for the traced and the untraced runs, so both traces have the same callers.
#[inline(never)]
fn call_graph_body() -> u64 {
    black_box(black_box(graph_body as fn(u64) -> u64)(1))
}

const FRAME_RECORDS: bool = !matches!(crate::build_info::VARIANT.as_bytes(), b"plain");

fn fp_trace_shows_real_callers(_: &Context) -> Outcome {
    if let Some(skip) = untraceable_build() {
        return skip;
    }
    if !FRAME_RECORDS {
        return Ok(Verdict::Skipped("variant plain keeps no frame records"));
    }
    if !crate::build_info::FRAME_POINTERS {
        return Ok(Verdict::Skipped("variant nofp has no frame pointers: frame-record walks are refused"));
    }
    traces_show_real_callers(Mode::FramePointer, false)
}

fn sframe_trace_shows_real_callers(_: &Context) -> Outcome {
    if let Some(skip) = untraceable_build() {
        return skip;
    }
    if stacktrace::sframe_table().is_err() {
        return Ok(Verdict::Skipped("no SFrame table in this image"));
    }
    traces_show_real_callers(Mode::SFrame, false)
}

fn scs_trace_shows_real_callers(_: &Context) -> Outcome {
    if let Some(skip) = untraceable_build() {
        return skip;
    }
    if !crate::build_info::SHADOW_CALL_STACK {
        return Ok(Verdict::Skipped("no shadow call stack in this build"));
    }
    traces_show_real_callers(Mode::ShadowCallStack, false)
}

/// Traces from inside `graph_body`, untraced, then graph-traced (and, with `probed`, with a
/// kretprobe on it too): the same callers, no trampoline among them.
fn traces_show_real_callers(mode: Mode, probed: bool) -> Outcome {
    let index = match mode {
        Mode::ShadowCallStack => 1,
        Mode::SFrame => 2,
        _ => 0,
    };
    TRACE_MODE.store(index, Ordering::Relaxed);
    check_eq!(call_graph_body(), 2);
    let untraced = BODY_TRACE.lock().clone();
    check!(untraced.stop_reason().is_complete() && untraced.len() >= 3);
    let body = address(graph_body);
    let Ok(tracer) = register_at(&[body]) else { return Err(fail("register")) };
    let probe = if probed { register_kretprobe(body)? } else { false };
    let result = call_graph_body();
    if probe {
        check!(kretprobe::unregister(body).is_ok());
    }
    check!(ftrace::unregister(tracer).is_ok());
    check_eq!(result, 2);
    let traced = BODY_TRACE.lock().clone();
    let trampolines = [graph::trampoline(), kretprobe::trampoline()];
    check!(traced.addresses().iter().all(|address| !trampolines.contains(address)));
    // The newest two entries (into `graph_body`, and its hijacked return into `call_graph_body`)
    // are the same in both runs; older ones are this function's two call sites, then the same.
    if !traced.stop_reason().is_complete()
        || traced.len() != untraced.len()
        || traced.addresses()[..2] != untraced.addresses()[..2]
        || traced.addresses()[3..] != untraced.addresses()[3..]
    {
        stacktrace::print("graph-traced", &traced);
        stacktrace::print("untraced", &untraced);
        return Err(fail("the trace in a graph-traced function shows the real callers"));
    }
    Ok(Verdict::Passed)
}

/// Registers a kretprobe with [`log_probe_entry`] and [`log_probe_return`] on `function` by the
/// first method that can perform its first instruction; `Ok(false)` if none can.
fn register_kretprobe(function: u64) -> Result<bool, super::Failure> {
    for method in Method::ALL {
        match kretprobe::register(function, method, Some(log_probe_entry), log_probe_return, 4) {
            Ok(()) => return Ok(true),
            Err(ProbeError::NotSimulated | ProbeError::NeedsOriginalPc(Text::Kernel)) => continue,
            Err(error) => {
                defmt::error!("  {}: {}", method, error);
                return Err(fail("kretprobe registered"));
            }
        }
    }
    Ok(false)
}

/// When the kretprobe's entry and return handlers ran (PMCCNTR_EL0, the graph tracer's clock).
static PROBE_ENTRY_TIME: AtomicU64 = AtomicU64::new(0);
static PROBE_RETURN_TIME: AtomicU64 = AtomicU64::new(0);
/// The real return address the kretprobe saw at entry (x30) and at its return.
static PROBE_ENTRY_X30: AtomicU64 = AtomicU64::new(0);
static PROBE_RETURN_X30: AtomicU64 = AtomicU64::new(0);

fn log_probe_entry(registers: &mut Registers, _: &mut u64) -> bool {
    PROBE_ENTRY_TIME.store(crate::arch::counters::cycles(), Ordering::Relaxed);
    PROBE_ENTRY_X30.store(registers.x[30], Ordering::Relaxed);
    true
}

fn log_probe_return(registers: &mut Registers, _: u64) {
    PROBE_RETURN_TIME.store(crate::arch::counters::cycles(), Ordering::Relaxed);
    PROBE_RETURN_X30.store(registers.x[30], Ordering::Relaxed);
}

/// Both fire: the graph entry, then the probe's entry (which sees the graph trampoline as the
/// return address); at the return the probe's handler (returning to the graph trampoline), then
/// the graph exit. Each return is restored, and traces inside the function show real callers.
fn with_kretprobe(_: &Context) -> Outcome {
    if let Some(skip) = untraceable_build() {
        return skip;
    }
    let body = address(graph_body);
    let expected = call_graph_body();
    graph::clear();
    let Ok(tracer) = register_at(&[body]) else { return Err(fail("register")) };
    if !register_kretprobe(body)? {
        check!(ftrace::unregister(tracer).is_ok());
        return Ok(Verdict::Skipped("no probe method performs this function's first instruction"));
    }
    let result = call_graph_body();
    let counts = kretprobe::counts(body);
    check!(kretprobe::unregister(body).is_ok());
    check!(ftrace::unregister(tracer).is_ok());
    check_eq!(result, expected);
    check!(counts == Some((1, 0)));
    check_eq!(graph::outstanding(), 0);
    check_eq!(kretprobe::outstanding(), 0);
    // The probe saw the graph trampoline as the return address, at entry and at its return.
    check_eq!(PROBE_ENTRY_X30.load(Ordering::Relaxed), graph::trampoline());
    check_eq!(PROBE_RETURN_X30.load(Ordering::Relaxed), graph::trampoline());
    let mut graph_events = events().filter(|event| event.function == body);
    let (Some(entry), Some(exit), None) = (graph_events.next(), graph_events.next(), graph_events.next()) else {
        return Err(fail("one graph entry and one exit"));
    };
    check!(entry.exit.is_none() && exit.exit == Some(entry.time));
    check!(entry.time <= PROBE_ENTRY_TIME.load(Ordering::Relaxed));
    check!(PROBE_RETURN_TIME.load(Ordering::Relaxed) <= exit.time);
    // Traces inside the function resolve the probe's trampoline, then the graph's.
    if FRAME_RECORDS && crate::build_info::FRAME_POINTERS {
        traces_show_real_callers(Mode::FramePointer, true)?;
    }
    if crate::build_info::SHADOW_CALL_STACK {
        traces_show_real_callers(Mode::ShadowCallStack, true)?;
    }
    if stacktrace::sframe_table().is_ok() {
        traces_show_real_callers(Mode::SFrame, true)?;
    }
    Ok(Verdict::Passed)
}
