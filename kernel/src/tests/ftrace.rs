//! ftrace on real text: callsite initialisation, the three dispatch schemes, exact tracer
//! counts per filter combination, restored text, IRQ context, the recursion guard, backtraces
//! through the trampoline, and refused requests.

use super::{Context, Outcome, Test, Verdict, check, check_eq, fail};
use crate::arch::cpu;
use crate::ftrace::{self, Error, Ops, Regs, Scheme, Symbols, tracers::Counter};
use crate::stacktrace::{self, Mode};
use crate::{symbols::callsites, task::stacks};
use ::ftrace::{MOV_X9_X30, NOP, SiteState, TracerId, glob_match, is_bl_to};
use core::hint::black_box;
use core::sync::atomic::{AtomicU64, Ordering};
use unwind::TraceOptions;

pub const TESTS: &[Test] = &[
    Test { name: "ftrace_callsites_initialised_and_notrace_untouched", run: callsites_initialised },
    Test { name: "ftrace_traced_functions_return_the_same_results", run: same_results },
    Test { name: "ftrace_tracers_fire_as_their_filters_say", run: filters },
    Test { name: "ftrace_unregister_restores_the_text", run: restores_text },
    Test { name: "ftrace_traces_irq_context", run: irq_context },
    Test { name: "ftrace_recursion_guard_skips_nested_calls", run: recursion_guard },
    Test { name: "ftrace_tracers_call_nothing_traced", run: tracers_call_nothing_traced },
    Test { name: "ftrace_backtraces_through_the_trampoline", run: backtraces },
    Test { name: "ftrace_refuses_bad_requests", run: bad_requests },
];

const SCHEMES: [Scheme; 3] = [Scheme::List, Scheme::CallOps, Scheme::Vector];

fn untraceable_build() -> Option<Outcome> {
    (callsites::entries().is_empty()).then_some(Ok(Verdict::Skipped("variant plain has no patchable entries")))
}

// Traced functions: ordinary Rust, each with its patchable entry.

#[inline(never)]
fn traced_pair_a(x: u64) -> u64 {
    black_box(x).wrapping_mul(3).wrapping_add(1)
}

#[inline(never)]
fn traced_pair_b(x: u64) -> u64 {
    black_box(x) ^ 0x5a5a
}

#[inline(never)]
fn traced_c(x: u64) -> u64 {
    black_box(x).rotate_left(7)
}

/// Eight register arguments.
#[inline(never)]
#[allow(clippy::too_many_arguments, reason = "the test is about passing eight register arguments")]
fn traced_eight(a: u64, b: u64, c: u64, d: u64, e: u64, f: u64, g: u64, h: u64) -> u64 {
    black_box(a) + 2 * b + 3 * c + 4 * d + 5 * e + 6 * f + 7 * g + 8 * h
}

/// Ten arguments: two on the stack, found through the SP the trampoline restores.
#[inline(never)]
#[allow(clippy::too_many_arguments, reason = "the test is about passing arguments on the stack")]
fn traced_ten(a: u64, b: u64, c: u64, d: u64, e: u64, f: u64, g: u64, h: u64, i: u64, j: u64) -> u64 {
    black_box(a)
        ^ b.rotate_left(1)
        ^ c.rotate_left(2)
        ^ d.rotate_left(3)
        ^ e.rotate_left(4)
        ^ f.rotate_left(5)
        ^ g.rotate_left(6)
        ^ h.rotate_left(7)
        ^ i.rotate_left(8)
        ^ j.rotate_left(9)
}

/// A large result: returned through memory at x8.
#[inline(never)]
fn traced_big(seed: u64) -> [u64; 8] {
    let mut out = [0; 8];
    for (index, word) in out.iter_mut().enumerate() {
        *word = black_box(seed).wrapping_mul(index as u64 + 1);
    }
    out
}

fn address(function: fn(u64) -> u64) -> u64 {
    function as *const () as u64
}

fn words(function: u64) -> [u32; 4] {
    // SAFETY: the patchable entry (8 bytes before the function and its first 8) is mapped text.
    core::array::from_fn(|index| unsafe { core::ptr::read_volatile((function - 8 + 4 * index as u64) as *const u32) })
}

fn literal(function: u64) -> u64 {
    // SAFETY: as in `words`; the literal is 8-aligned.
    unsafe { core::ptr::read_volatile((function - 8) as *const u64) }
}

fn register_at(ops: &'static Ops, functions: &[u64]) -> Result<TracerId, Error> {
    ftrace::register_where(ops, |entry| functions.contains(&(entry + 8)))
}

fn run_all(calls: u64) -> u64 {
    let mut sum = 0;
    for index in 0..calls {
        sum ^= traced_pair_a(index) ^ traced_pair_b(index) ^ traced_c(index);
    }
    sum
}

fn unregister_all(tracers: &[TracerId]) -> Result<(), Error> {
    tracers.iter().try_for_each(|&tracer| ftrace::unregister(tracer).map(|_| ()))
}

// --- tests -------------------------------------------------------------------------------

fn callsites_initialised(_: &Context) -> Outcome {
    if let Some(skip) = untraceable_build() {
        return skip;
    }
    let (traceable, total) = ftrace::site_counts();
    check_eq!(total, callsites::entries().len());
    check!(traceable > 0 && traceable < total);
    let Some(symbols) = Symbols::get() else { return Err(fail("no embedded symbol table")) };
    let mut notrace = 0;
    for &entry in callsites::entries() {
        let function = entry + 8;
        let name = symbols.name_at(function).unwrap_or("");
        let state = ftrace::site_state(function);
        let excluded = crate::probes::is_noprobe(function) || glob_match("*kernel::ftrace::*", name);
        if excluded {
            notrace += 1;
            check!(state == Some(SiteState::Uninitialised));
            check!(words(function) == [NOP; 4]);
        } else if let Some(SiteState::Disabled { .. }) = state {
            check!(words(function)[2] == MOV_X9_X30 && words(function)[3] == NOP);
        }
    }
    check!(notrace > 0);
    let a = address(traced_pair_a);
    check!(matches!(ftrace::site_state(a), Some(SiteState::Disabled { .. } | SiteState::Calling { .. })));
    check_eq!(words(a)[2], MOV_X9_X30);
    check_eq!(symbols.address_of("kernel::tests::ftrace::traced_pair_a").unwrap_or(0), a);
    Ok(Verdict::Passed)
}

fn call_everything(seed: u64) -> (u64, u64, u64, [u64; 8]) {
    let f = black_box(traced_eight as fn(u64, u64, u64, u64, u64, u64, u64, u64) -> u64);
    let g = black_box(traced_ten as fn(u64, u64, u64, u64, u64, u64, u64, u64, u64, u64) -> u64);
    (
        run_all(seed),
        f(seed, seed + 1, seed + 2, seed + 3, seed + 4, seed + 5, seed + 6, seed + 7),
        g(seed, seed + 1, seed + 2, seed + 3, seed + 4, seed + 5, seed + 6, seed + 7, seed + 8, seed + 9),
        traced_big(seed),
    )
}

static SAME_A: Counter = Counter::new();
static SAME_B: Counter = Counter::new();

fn same_results(_: &Context) -> Outcome {
    if let Some(skip) = untraceable_build() {
        return skip;
    }
    let expected = call_everything(11);
    let functions = [
        address(traced_pair_a),
        address(traced_pair_b),
        address(traced_c),
        traced_eight as *const () as u64,
        traced_ten as *const () as u64,
        traced_big as *const () as u64,
    ];
    for scheme in SCHEMES {
        check!(ftrace::set_scheme(scheme).is_ok());
        let Ok(one) = register_at(&SAME_A.ops, &functions) else { return Err(fail("register A")) };
        let Ok(two) = register_at(&SAME_B.ops, &functions[..2]) else { return Err(fail("register B")) };
        SAME_A.reset();
        SAME_B.reset();
        let traced = call_everything(11);
        let (hits_a, hits_b) = (SAME_A.hits(), SAME_B.hits());
        check!(unregister_all(&[one, two]).is_ok());
        check!(traced == expected);
        // run_all(11): 11 calls each of a, b, c; then eight, ten, big once.
        check_eq!(hits_a, 3 * 11 + 3);
        check_eq!(hits_b, 2 * 11);
    }
    check!(ftrace::set_scheme(Scheme::CallOps).is_ok());
    Ok(Verdict::Passed)
}

static FILTER: [Counter; 4] = [Counter::new(), Counter::new(), Counter::new(), Counter::new()];

/// Four tracers: A on a (by address); B on a and b (by name pattern `traced_pair_*`); C on c; D on nothing the test calls
/// (irrelevant). Every scheme must give the exact counts, and the schemes' text differs as
/// designed: under call-ops, b's literal is B's own ops and a's the list ops; under vector, a's
/// literal is a vector ops; under list, every traced literal is the list ops.
fn filters(_: &Context) -> Outcome {
    if let Some(skip) = untraceable_build() {
        return skip;
    }
    let (a, b) = (address(traced_pair_a), address(traced_pair_b));
    // A boot tracer (`ftrace=*`) also traces them: then the literals are not this test's.
    let alone = [a, b].iter().all(|&function| matches!(ftrace::site_state(function), Some(SiteState::Disabled { .. })));
    for scheme in SCHEMES {
        check!(ftrace::set_scheme(scheme).is_ok());
        let tracers = [
            register_at(&FILTER[0].ops, &[a]),
            ftrace::register(&FILTER[1].ops, "kernel::tests::ftrace::traced_pair_*"),
            ftrace::register(&FILTER[2].ops, "kernel::tests::ftrace::traced_c"),
            ftrace::register(&FILTER[3].ops, "kernel::tests::ftrace::traced_eight"),
        ];
        let [Ok(ta), Ok(tb), Ok(tc), Ok(td)] = tracers else { return Err(fail("register")) };
        FILTER.iter().for_each(Counter::reset);
        let (literal_a, literal_b) = (literal(a), literal(b));
        check!(is_bl_to(a + 4, words(a)[3], literal_target_trampoline()));
        run_all(25);
        let hits: [u64; 4] = core::array::from_fn(|index| FILTER[index].hits());
        check!(unregister_all(&[ta, tb, tc, td]).is_ok());
        check!(hits == [25, 50, 25, 0]);
        let own_b = &FILTER[1].ops as *const Ops as u64;
        match scheme {
            _ if !alone => {}
            Scheme::List => check!(literal_a == literal_b),
            Scheme::CallOps => check!(literal_b == own_b && literal_a != own_b && literal_a != literal_b),
            Scheme::Vector => check!(literal_b == own_b && literal_a != literal_b),
        }
    }
    check!(ftrace::set_scheme(Scheme::CallOps).is_ok());
    Ok(Verdict::Passed)
}

/// The trampoline's address, from a site that calls it: the `bl` target of `traced_pair_a`'s call
/// slot while traced (used above only through `is_bl_to`).
fn literal_target_trampoline() -> u64 {
    let a = address(traced_pair_a);
    ::ftrace::decode_bl(a + 4, words(a)[3]).unwrap_or(0)
}

static RESTORE: Counter = Counter::new();

fn restores_text(_: &Context) -> Outcome {
    if let Some(skip) = untraceable_build() {
        return skip;
    }
    let functions = [address(traced_pair_a), address(traced_pair_b), traced_big as *const () as u64];
    let mut before = [([0; 4], 0); 3];
    for scheme in SCHEMES {
        check!(ftrace::set_scheme(scheme).is_ok());
        before = core::array::from_fn(|index| (words(functions[index]), literal(functions[index])));
        let Ok(tracer) = register_at(&RESTORE.ops, &functions) else { return Err(fail("register")) };
        for &function in &functions {
            check!(::ftrace::decode_bl(function + 4, words(function)[3]).is_some());
            check!(matches!(ftrace::site_state(function), Some(SiteState::Calling { .. })));
        }
        check!(ftrace::unregister(tracer).is_ok());
        for (index, &function) in functions.iter().enumerate() {
            check!((words(function), literal(function)) == before[index]);
        }
    }
    for (index, &function) in functions.iter().enumerate() {
        // Nothing else traces them (unless a boot tracer does): back to `mov x9, x30; nop`.
        if let Some(SiteState::Disabled { .. }) = ftrace::site_state(function) {
            check!(before[index].0[2..] == [MOV_X9_X30, NOP]);
        }
    }
    check!(ftrace::set_scheme(Scheme::CallOps).is_ok());
    Ok(Verdict::Passed)
}

static IN_IRQ: AtomicU64 = AtomicU64::new(0);
static IN_TASK: AtomicU64 = AtomicU64::new(0);

/// Counts calls by the stack they run on (the traced function's SP at entry).
#[sanitize(kernel_hwaddress = "off")]
unsafe extern "C" fn note_context(_: u64, _: u64, _: &Ops, regs: &mut Regs) {
    let counter = if stacks::this_irq_slot().contains_stack(regs.sp) { &IN_IRQ } else { &IN_TASK };
    counter.fetch_add(1, Ordering::Relaxed);
}

static CONTEXT: Ops = Ops { func: note_context, private: 0 };

/// `stacktrace::capture` runs in the timer IRQ when a capture is armed (three times: FP, SCS and
/// SFrame from inside the handler).
fn irq_context(_: &Context) -> Outcome {
    if let Some(skip) = untraceable_build() {
        return skip;
    }
    let Ok(tracer) = ftrace::register(&CONTEXT, "kernel::stacktrace::capture") else {
        return Err(fail("kernel::stacktrace::capture is not traceable"));
    };
    IN_IRQ.store(0, Ordering::Relaxed);
    IN_TASK.store(0, Ordering::Relaxed);
    stacktrace::arm_irq_capture();
    let capture = loop {
        if let Some(capture) = stacktrace::take_irq_capture() {
            break capture;
        }
        cpu::wait_for_interrupt();
    };
    let (in_irq, in_task) = (IN_IRQ.load(Ordering::Relaxed), IN_TASK.load(Ordering::Relaxed));
    check!(ftrace::unregister(tracer).is_ok());
    check_eq!(in_irq, 3);
    check_eq!(in_task, 0);
    // The traces taken through the trampoline in the IRQ still reach the interrupted task (the
    // shadow stack's, chained from the IRQ's, without frame pointers).
    let reaching = if crate::build_info::FRAME_POINTERS { &capture.frame_pointer } else { &capture.shadow };
    check!(reaching.addresses().len() > 2);
    Ok(Verdict::Passed)
}

static NESTED_CALLS: AtomicU64 = AtomicU64::new(0);

/// A tracer that calls a function it traces: the guard must skip the inner call.
#[sanitize(kernel_hwaddress = "off")]
unsafe extern "C" fn calls_traced(ip: u64, _: u64, _: &Ops, _: &mut Regs) {
    NESTED_CALLS.fetch_add(1, Ordering::Relaxed);
    black_box(traced_c(ip));
}

static NESTING: Ops = Ops { func: calls_traced, private: 0 };

fn recursion_guard(_: &Context) -> Outcome {
    if let Some(skip) = untraceable_build() {
        return skip;
    }
    let Ok(tracer) = register_at(&NESTING, &[address(traced_c)]) else { return Err(fail("register")) };
    NESTED_CALLS.store(0, Ordering::Relaxed);
    let before = ftrace::recursions();
    for index in 0..10 {
        black_box(traced_c(index));
    }
    let (calls, recursions) = (NESTED_CALLS.load(Ordering::Relaxed), ftrace::recursions() - before);
    check!(ftrace::unregister(tracer).is_ok());
    // Ten outer calls ran the tracer; each tracer call's own traced_c was skipped (at least
    // those: a boot tracer on `*` adds the core functions the tracer calls).
    check_eq!(calls, 10);
    check!(recursions >= 10);
    Ok(Verdict::Passed)
}

static EVERY_CALL: Counter = Counter::new();

/// The tracers call nothing traced: with the function tracer and a counting tracer on every
/// traceable function, traced calls make the recursion guard skip nothing. The probe sweep with
/// a tracer on everything found the function tracer's atomics out of line in `full`, each a
/// call of a traced `core` function that the guard then skipped (five per record); they are
/// single instructions now (`tracers.rs`). With `core`'s `AtomicU64::load` in place of
/// `load_relaxed` in the function tracer this fails in `full`.
fn tracers_call_nothing_traced(_: &Context) -> Outcome {
    if let Some(skip) = untraceable_build() {
        return skip;
    }
    let function_tracer = &ftrace::tracers::FUNCTION_TRACER;
    EVERY_CALL.reset();
    function_tracer.clear();
    let Ok(counter) = ftrace::register_where(&EVERY_CALL.ops, |_| true) else { return Err(fail("register")) };
    let Ok(function) = ftrace::register_where(&function_tracer.ops, |_| true) else {
        let _ = ftrace::unregister(counter);
        return Err(fail("register"));
    };
    let (sum, recursions) = {
        // On this CPU throughout: the guard's count is per CPU.
        let _mask = crate::sync::IrqMask::new();
        let before = ftrace::recursions();
        (run_all(10), ftrace::recursions() - before)
    };
    let written = function_tracer.written();
    check!(unregister_all(&[function, counter]).is_ok());
    check_eq!(sum, run_all(10));
    check!(EVERY_CALL.hits() >= 30 && written >= 30);
    check_eq!(recursions, 0);
    Ok(Verdict::Passed)
}

/// The walkers of [`capture_traces`], in the order of [`TRACES`].
const TRACE_MODES: [Mode; 3] = [Mode::FramePointer, Mode::ShadowCallStack, Mode::SFrame];
static TRACES: [[AtomicU64; 8]; 3] = [const { [const { AtomicU64::new(0) }; 8] }; 3];

/// Whether this build has `mode`'s walker: frame records, the shadow call stack.
fn walker_built(mode: Mode) -> bool {
    match mode {
        Mode::FramePointer => crate::build_info::FRAME_POINTERS,
        Mode::ShadowCallStack => crate::build_info::SHADOW_CALL_STACK,
        Mode::SFrame => true,
    }
}

/// Captures a trace with each walker this build has, from inside the tracer (the SFrame walk
/// crosses the trampoline and the call slot by their rows).
unsafe extern "C" fn capture_traces(_: u64, _: u64, _: &Ops, _: &mut Regs) {
    for (index, mode) in TRACE_MODES.into_iter().enumerate() {
        if !mode.available() || !walker_built(mode) {
            continue;
        }
        let trace = stacktrace::capture(mode, TraceOptions::ALL);
        for (slot, &address) in TRACES[index].iter().zip(trace.addresses()) {
            slot.store(address, Ordering::Relaxed);
        }
    }
}

static CAPTURE: Ops = Ops { func: capture_traces, private: 0 };

#[inline(never)]
fn call_traced_b_here() -> u64 {
    black_box(traced_pair_b(black_box(3)))
}

fn backtraces(_: &Context) -> Outcome {
    if let Some(skip) = untraceable_build() {
        return skip;
    }
    let Ok(tracer) = register_at(&CAPTURE, &[address(traced_pair_b)]) else { return Err(fail("register")) };
    let result = call_traced_b_here();
    check!(ftrace::unregister(tracer).is_ok());
    check_eq!(result, 3 ^ 0x5a5a);
    let function_of = |address: u64| callsites::function_containing(address - 4).map(|(start, _)| start);
    let stored =
        |index: usize| -> [u64; 8] { core::array::from_fn(|slot| TRACES[index][slot].load(Ordering::Relaxed)) };
    for (index, mode) in TRACE_MODES.into_iter().enumerate() {
        // No frame walk without frame pointers, no shadow walk without the shadow call stack.
        if !walker_built(mode) {
            continue;
        }
        let addresses = stored(index);
        // ... capture_traces <- trampoline <- traced_pair_b (its body, E + 16) <- call_traced_b_here.
        let traced = address(traced_pair_b);
        let position = addresses.iter().position(|&entry| function_of(entry) == Some(traced));
        let Some(position) = position else { return Err(fail("traced function missing from the trace")) };
        check!(position + 1 < addresses.len());
        check_eq!(function_of(addresses[position + 1]).unwrap_or(0), call_traced_b_here as *const () as u64);
    }
    // By its rows the SFrame walk gives the frame walk's entries: the trampoline, the call slot
    // (its return, E + 16) and the traced function's callers.
    if walker_built(Mode::FramePointer) {
        check!(stored(2)[1..] == stored(0)[1..]);
    }
    Ok(Verdict::Passed)
}

static BAD: Counter = Counter::new();

fn bad_requests(_: &Context) -> Outcome {
    if let Some(skip) = untraceable_build() {
        return skip;
    }
    check!(ftrace::register(&BAD.ops, "no::such::function*") == Err(Error::NoMatch));
    // Only no-trace functions match: nothing to trace.
    check!(ftrace::register(&BAD.ops, "kernel::ftrace::*") == Err(Error::NoMatch));
    let Ok(tracer) = register_at(&BAD.ops, &[address(traced_pair_a)]) else { return Err(fail("register")) };
    check!(ftrace::unregister(tracer).is_ok());
    check!(matches!(ftrace::unregister(tracer), Err(Error::Registry(::ftrace::Error::NotRegistered { .. }))));
    // The registry is still usable.
    let Ok(tracer) = register_at(&BAD.ops, &[address(traced_pair_a)]) else { return Err(fail("re-register")) };
    BAD.reset();
    black_box(traced_pair_a(1));
    check!(ftrace::unregister(tracer).is_ok());
    check_eq!(BAD.hits(), 1);
    Ok(Verdict::Passed)
}
