//! Kernel return-probe tests: return values and registers through the trampoline under PAC and
//! SCS, every entry method, recursion, nesting, missed hits, and the walkers' repair.

use crate::sync::IrqSpinLock;
use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::{Context, Failure, Outcome, Test, Verdict, check, check_eq, fail};
use crate::arch::cpu;
use crate::probes::kretprobe::{self, INSTANCES_PER_CONTEXT};
use crate::probes::{Method, ProbeError, Registers, Text};
use crate::stacktrace::{self, Mode};
use unwind::{Trace, TraceOptions};

pub const TESTS: &[Test] = &[
    Test { name: "kretprobe_returns_through_pac_and_scs", run: kretprobe_returns_through_pac_and_scs },
    Test { name: "kretprobe_on_asm_targets_every_method", run: kretprobe_on_asm_targets_every_method },
    Test { name: "kretprobe_group_in_one_hold", run: kretprobe_group_in_one_hold },
    Test { name: "kretprobe_recursion_returns_in_order", run: kretprobe_recursion_returns_in_order },
    Test { name: "kretprobe_pool_exhaustion_is_missed", run: kretprobe_pool_exhaustion_is_missed },
    Test { name: "kretprobe_nesting_and_handler_hits", run: kretprobe_nesting_and_handler_hits },
    Test { name: "kretprobe_unregistered_while_hijacked", run: kretprobe_unregistered_while_hijacked },
    Test { name: "kretprobe_fp_trace_shows_real_callers", run: kretprobe_fp_trace_shows_real_callers },
    Test { name: "kretprobe_scs_trace_shows_real_callers", run: kretprobe_scs_trace_shows_real_callers },
    Test { name: "kretprobe_sframe_trace_shows_real_callers", run: kretprobe_sframe_trace_shows_real_callers },
];

core::arch::global_asm!(
    r#"
    .section .text.kretprobe_tests, "ax"
    .balign 16
// x0, x1: arguments, x2: target. Calls the target with x19..x28 set to patterns; returns its x0
// in x0 and, in x1, a bit per callee-saved register (and SP) that came back changed. Its CFI
// lets the SFrame walk cross it.
    .global kretprobe_test_call
kretprobe_test_call:
    .cfi_startproc
    stp     x29, x30, [sp, #-96]!
    .cfi_def_cfa_offset 96
    .cfi_offset x30, -88
    .cfi_offset x29, -96
    mov     x29, sp
    stp     x19, x20, [sp, #16]
    stp     x21, x22, [sp, #32]
    stp     x23, x24, [sp, #48]
    stp     x25, x26, [sp, #64]
    stp     x27, x28, [sp, #80]
    .irp n, 19,20,21,22,23,24,25,26,27,28
    movz    x\n, #0x\n\n
    movk    x\n, #0xc5a1, lsl #48
    .endr
    mov     x9, sp
    str     x9, [sp, #-16]!
    .cfi_def_cfa_offset 112
    blr     x2
    ldr     x9, [sp], #16
    .cfi_def_cfa_offset 96
    mov     x1, #0
    mov     x10, sp
    cmp     x9, x10
    cset    x10, ne
    orr     x1, x1, x10, lsl #31
    .irp n, 19,20,21,22,23,24,25,26,27,28
    movz    x9, #0x\n\n
    movk    x9, #0xc5a1, lsl #48
    cmp     x\n, x9
    cset    x10, ne
    orr     x1, x1, x10, lsl #\n
    .endr
    ldp     x19, x20, [sp, #16]
    ldp     x21, x22, [sp, #32]
    ldp     x23, x24, [sp, #48]
    ldp     x25, x26, [sp, #64]
    ldp     x27, x28, [sp, #80]
    ldp     x29, x30, [sp], #96
    .cfi_def_cfa_offset 0
    .cfi_restore x29
    .cfi_restore x30
    ret
    .cfi_endproc

// Leaf helpers for a non-leaf caller (whose prologue has run, since it calls): the LR in its
// frame record, and the newest entry of its shadow call stack.
    .global kretprobe_caller_record_lr
kretprobe_caller_record_lr:
    .cfi_startproc
    ldr     x0, [x29, #8]
    ret
    .cfi_endproc
    .global kretprobe_caller_shadow_top
kretprobe_caller_shadow_top:
    .cfi_startproc
    ldr     x0, [x18, #-8]
    ret
    .cfi_endproc
"#
);

#[repr(C)]
struct Checked {
    value: u64,
    changed: u64,
}

unsafe extern "C" {
    fn kretprobe_test_call(a: u64, b: u64, target: u64) -> Checked;
    fn kretprobe_caller_record_lr() -> u64;
    fn kretprobe_caller_shadow_top() -> u64;
    fn bench_probe_target_nop();
    fn bench_probe_target_push();
    fn bench_probe_target_ret();
}

fn call_checked(target: u64, a: u64, b: u64) -> Checked {
    // SAFETY: the targets here are functions of two u64 arguments (or none) that return x0.
    unsafe { kretprobe_test_call(a, b, target) }
}

/// What the handlers saw, in order.
const LOG_SIZE: usize = 96;
static LOG: [AtomicU64; LOG_SIZE] = [const { AtomicU64::new(0) }; LOG_SIZE];
static LOGGED: AtomicUsize = AtomicUsize::new(0);

fn log(value: u64) {
    let index = LOGGED.fetch_add(1, Ordering::Relaxed);
    if index < LOG_SIZE {
        LOG[index].store(value, Ordering::Relaxed);
    }
}

fn logged() -> usize {
    LOGGED.load(Ordering::Relaxed)
}

fn log_at(index: usize) -> u64 {
    LOG[index].load(Ordering::Relaxed)
}

fn clear_log() {
    LOGGED.store(0, Ordering::Relaxed);
}

/// Entry: remembers x0 (the first argument) for the return handler.
fn remember_x0(registers: &mut Registers, data: &mut u64) -> bool {
    *data = registers.x[0];
    true
}

/// Return: logs the argument and the return value, and adds 1000 to the return value.
fn log_and_add_1000(registers: &mut Registers, data: u64) {
    log(data);
    log(registers.x[0]);
    check_real_return(registers);
    registers.x[0] += 1000;
}

/// x30 and pc hold the real return address (not the trampoline).
fn check_real_return(registers: &Registers) {
    if registers.x[30] == kretprobe::trampoline() || registers.pc != registers.x[30] {
        log(u64::MAX);
    }
}

/// What the probed function saw of its own hijacked return: its frame record's LR and its SCS
/// slot, raw.
static SEEN_LR: AtomicU64 = AtomicU64::new(0);
static SEEN_SLOT: AtomicU64 = AtomicU64::new(0);

#[inline(never)]
fn sum(a: u64, b: u64) -> u64 {
    core::hint::black_box(a) + core::hint::black_box(b)
}

/// A non-leaf Rust function: patchable entry, `paciasp`, SCS push, frame record.
#[inline(never)]
extern "C" fn add_target(a: u64, b: u64) -> u64 {
    // Without frame pointers x29 holds anything: nothing is read through it.
    if crate::build_info::FRAME_POINTERS {
        // SAFETY: with frame records (full, prod), this non-leaf function has one at x29 when
        // it calls; in `plain` the word read is some other frame's, which is only stored.
        SEEN_LR.store(unsafe { kretprobe_caller_record_lr() }, Ordering::Relaxed);
    }
    if crate::build_info::SHADOW_CALL_STACK {
        // SAFETY: SCS builds: its prologue pushed x30 at x18 - 8 before it calls.
        SEEN_SLOT.store(unsafe { kretprobe_caller_shadow_top() }, Ordering::Relaxed);
    }
    sum(a, b)
}

type Function = extern "C" fn(u64, u64) -> u64;

fn function_address(function: Function) -> u64 {
    function as *const () as u64
}

fn kretprobe_returns_through_pac_and_scs(_: &Context) -> Outcome {
    let target = function_address(add_target);
    let signs = crate::build_info::SHADOW_CALL_STACK && cpu::PointerAuth::detect() != cpu::PointerAuth::None;
    let mut methods_run = 0;
    for method in Method::ALL {
        if !register_rust(target, method, Some(remember_x0), log_and_add_1000, 4)? {
            // `paciasp` (pac-ret builds) or a single-register `str x30` (plain) is stepped, not
            // simulated: the only refusal expected.
            check!(method == Method::Simulate);
            continue;
        }
        clear_log();
        SEEN_LR.store(0, Ordering::Relaxed);
        let x18_before = cpu::shadow_call_stack_pointer();
        let result = call_checked(target, 20, 22);
        let x18_after = cpu::shadow_call_stack_pointer();
        let counts = kretprobe::counts(target);
        check!(kretprobe::unregister(target).is_ok());
        check_eq!(result.value, 1042);
        check_eq!(result.changed, 0);
        check_eq!(x18_before, x18_after);
        check_eq!(logged(), 2);
        check_eq!(log_at(0), 20);
        check_eq!(log_at(1), 42);
        check!(counts == Some((1, 0)));
        check_eq!(kretprobe::outstanding(), 0);
        // The function's own record held the trampoline, signed by its `paciasp` where the build
        // and CPU sign: authentication at its return is what let it come back.
        let lr = SEEN_LR.load(Ordering::Relaxed);
        if FRAME_RECORDS {
            check_eq!(cpu::strip_pac(lr), kretprobe::trampoline());
            check_eq!(lr != kretprobe::trampoline(), signs);
        }
        if crate::build_info::SHADOW_CALL_STACK {
            check_eq!(cpu::strip_pac(SEEN_SLOT.load(Ordering::Relaxed)), kretprobe::trampoline());
        }
        // Unprobed again: the plain sum.
        check_eq!(call_checked(target, 20, 22).value, 42);
        methods_run += 1;
    }
    check!(if crate::build_info::SHADOW_CALL_STACK { methods_run == 3 } else { methods_run >= 3 });
    Ok(Verdict::Passed)
}

fn kretprobe_on_asm_targets_every_method(_: &Context) -> Outcome {
    let targets: [(u64, &[Method]); 3] = [
        (bench_probe_target_nop as *const () as u64, &Method::ALL),
        (bench_probe_target_push as *const () as u64, &Method::ALL),
        (bench_probe_target_ret as *const () as u64, &[Method::Simulate, Method::Detour]),
    ];
    for (target, methods) in targets {
        check_eq!(kretprobe::attach_address(target), target);
        for &method in methods {
            if let Err(error) = kretprobe::register(target, method, Some(remember_x0), log_and_add_1000, 4) {
                defmt::error!("  {}: {}", method, error);
                return Err(fail("kretprobe registered"));
            }
            clear_log();
            let x18_before = cpu::shadow_call_stack_pointer();
            let first = call_checked(target, 7, 0);
            let second = call_checked(target, 8, 0);
            check_eq!(x18_before, cpu::shadow_call_stack_pointer());
            let counts = kretprobe::counts(target);
            check!(kretprobe::unregister(target).is_ok());
            // The targets leave x0 as it is.
            check_eq!(first.value, 1007);
            check_eq!(second.value, 1008);
            check_eq!(first.changed | second.changed, 0);
            check_eq!(logged(), 4);
            check!(log_at(0) == 7 && log_at(1) == 7 && log_at(2) == 8 && log_at(3) == 8);
            check!(counts == Some((2, 0)));
        }
    }
    // A `ret` cannot run out of line: the entry probe says so.
    let ret = bench_probe_target_ret as *const () as u64;
    check!(
        kretprobe::register(ret, Method::SingleStep, None, log_and_add_1000, 1)
            == Err(ProbeError::NeedsOriginalPc(Text::Kernel))
    );
    check!(kretprobe::counts(ret).is_none());
    check!(kretprobe::unregister(ret) == Err(ProbeError::NotRegistered));
    Ok(Verdict::Passed)
}

/// A group of kretprobes (as the probe sweep's kretprobe pass uses them): registered, moved to
/// another method and unregistered in one hold of the other CPUs each, every member's returns
/// and counts kept across the change; a refused member does not stop the others.
fn kretprobe_group_in_one_hold(_: &Context) -> Outcome {
    let (nop, push, ret) = (
        bench_probe_target_nop as *const () as u64,
        bench_probe_target_push as *const () as u64,
        bench_probe_target_ret as *const () as u64,
    );
    let holds = crate::task::cpus::holds();
    let mut results = [Ok(()); 3];
    kretprobe::register_all(&[nop, push, ret], Method::SingleStep, None, count_return, 4, &mut results);
    check!(results == [Ok(()), Ok(()), Err(ProbeError::NeedsOriginalPc(Text::Kernel))]);
    check_eq!(crate::task::cpus::holds(), holds + 1);
    check!(kretprobe::counts(ret).is_none());
    RETURNS.store(0, Ordering::Relaxed);
    let calls = |value| (call_checked(nop, value, 0).value, call_checked(push, value, 0).value);
    check!(calls(5) == (5, 5));
    check_eq!(RETURNS.load(Ordering::Relaxed), 2);
    let mut changed = [Err(ProbeError::NotRegistered); 3];
    check!(kretprobe::change_method_all(&[nop, push, ret], Method::Detour, &mut changed).is_ok());
    check!(changed == [Ok(()), Ok(()), Err(ProbeError::NotRegistered)]);
    check_eq!(crate::task::cpus::holds(), holds + 2);
    check!(calls(6) == (6, 6));
    check_eq!(RETURNS.load(Ordering::Relaxed), 4);
    check!(kretprobe::counts(nop) == Some((2, 0)) && kretprobe::counts(push) == Some((2, 0)));
    check!(kretprobe::unregister_all(&[nop, ret, push]) == Err(ProbeError::NotRegistered));
    check_eq!(crate::task::cpus::holds(), holds + 3);
    check!(kretprobe::counts(nop).is_none() && kretprobe::counts(push).is_none());
    check!(calls(7) == (7, 7));
    check_eq!(RETURNS.load(Ordering::Relaxed), 4);
    check_eq!(kretprobe::outstanding(), 0);
    Ok(Verdict::Passed)
}

/// `n + (n - 1) + ... + 0`, recursively, each level a probed call.
#[inline(never)]
extern "C" fn recurse(n: u64, _: u64) -> u64 {
    if n == 0 { 0 } else { n + core::hint::black_box(recurse as Function)(n - 1, 0) }
}

/// Registers a kretprobe on a Rust function: `Ok(false)` where the method cannot perform the
/// function's first instruction (`paciasp` is not simulated; a `cbz` cannot run out of line).
fn register_rust(
    function: u64,
    method: Method,
    entry: Option<kretprobe::EntryHandler>,
    handler: kretprobe::ReturnHandler,
    max_active: u32,
) -> Result<bool, Failure> {
    match kretprobe::register(function, method, entry, handler, max_active) {
        Ok(()) => Ok(true),
        Err(ProbeError::NotSimulated | ProbeError::NeedsOriginalPc(Text::Kernel)) => Ok(false),
        Err(error) => {
            defmt::error!("  {}: {}", method, error);
            Err(fail("kretprobe registered"))
        }
    }
}

/// Whether the build keeps frame records (`-Cforce-frame-pointers=non-leaf`: full, prod, mte).
const FRAME_RECORDS: bool =
    !matches!(crate::build_info::VARIANT.as_bytes(), b"plain") && crate::build_info::FRAME_POINTERS;

fn kretprobe_recursion_returns_in_order(_: &Context) -> Outcome {
    const DEPTH: u64 = 8;
    let target = function_address(recurse);
    let mut methods_run = 0;
    for method in Method::ALL {
        if !register_rust(target, method, Some(remember_x0), log_and_add_1000, 16)? {
            continue;
        }
        methods_run += 1;
        clear_log();
        let result = call_checked(target, DEPTH, 0);
        let counts = kretprobe::counts(target);
        check!(kretprobe::unregister(target).is_ok());
        // Innermost first: level n returns sum(0..=n) plus 1000 for each level below it (their
        // handlers changed what it added up), then its own handler adds 1000.
        check_eq!(logged(), 2 * (DEPTH as usize + 1));
        for level in 0..=DEPTH {
            let index = 2 * level as usize;
            check_eq!(log_at(index), level);
            check_eq!(log_at(index + 1), level * (level + 1) / 2 + 1000 * level);
        }
        check_eq!(result.value, DEPTH * (DEPTH + 1) / 2 + 1000 * (DEPTH + 1));
        check_eq!(result.changed, 0);
        check!(counts == Some((DEPTH + 1, 0)));
        check_eq!(kretprobe::outstanding(), 0);
    }
    check!(methods_run >= 2);
    Ok(Verdict::Passed)
}

fn kretprobe_pool_exhaustion_is_missed(_: &Context) -> Outcome {
    let target = function_address(recurse);
    // Detour performs any first instruction of a Rust function.
    let method = Method::Detour;
    // max_active 3 of 9 calls: the three outermost are hijacked, the rest missed.
    check!(kretprobe::register(target, method, Some(remember_x0), log_and_add_1000, 3).is_ok());
    clear_log();
    let result = call_checked(target, 8, 0);
    let counts = kretprobe::counts(target);
    check!(kretprobe::unregister(target).is_ok());
    check!(counts == Some((3, 6)));
    check_eq!(logged(), 6);
    check!(log_at(0) == 6 && log_at(2) == 7 && log_at(4) == 8);
    check_eq!(result.value, 36 + 3000);
    // The context's instance stack: INSTANCES_PER_CONTEXT hijacked, the deeper calls missed.
    let depth = INSTANCES_PER_CONTEXT as u64 + 5;
    check!(kretprobe::register(target, method, None, count_return, u32::MAX).is_ok());
    RETURNS.store(0, Ordering::Relaxed);
    let result = call_checked(target, depth, 0);
    let counts = kretprobe::counts(target);
    check!(kretprobe::unregister(target).is_ok());
    check!(counts == Some((INSTANCES_PER_CONTEXT as u64, depth + 1 - INSTANCES_PER_CONTEXT as u64)));
    check_eq!(RETURNS.load(Ordering::Relaxed), INSTANCES_PER_CONTEXT as u64);
    check_eq!(result.value, depth * (depth + 1) / 2);
    check_eq!(kretprobe::outstanding(), 0);
    Ok(Verdict::Passed)
}

static RETURNS: AtomicU64 = AtomicU64::new(0);

fn count_return(_: &mut Registers, _: u64) {
    RETURNS.fetch_add(1, Ordering::Relaxed);
}

#[inline(never)]
extern "C" fn inner(a: u64, b: u64) -> u64 {
    sum(a, b) * 2
}

#[inline(never)]
extern "C" fn outer(a: u64, b: u64) -> u64 {
    core::hint::black_box(inner as Function)(a, b) + 1
}

/// Outer's return handler calls the probed `inner`: a hit from a return handler is missed.
fn outer_returns(registers: &mut Registers, data: u64) {
    log(data);
    log(registers.x[0]);
    log(core::hint::black_box(inner as Function)(1, 1));
}

fn kretprobe_nesting_and_handler_hits(_: &Context) -> Outcome {
    let (inner_address, outer_address) = (function_address(inner), function_address(outer));
    let mut methods_run = 0;
    for method in Method::ALL {
        if !register_rust(inner_address, method, Some(remember_x0), log_and_add_1000, 4)? {
            continue;
        }
        if !register_rust(outer_address, method, Some(remember_x0), outer_returns, 4)? {
            check!(kretprobe::unregister(inner_address).is_ok());
            continue;
        }
        methods_run += 1;
        check!(
            kretprobe::register(outer_address, method, None, outer_returns, 4) == Err(ProbeError::AlreadyRegistered)
        );
        clear_log();
        let result = call_checked(outer_address, 3, 4);
        let inner_counts = kretprobe::counts(inner_address);
        let outer_counts = kretprobe::counts(outer_address);
        check!(kretprobe::unregister(inner_address).is_ok());
        check!(kretprobe::unregister(outer_address).is_ok());
        // inner returns 14 (+1000 by its handler), outer 1015; outer's handler's own call of
        // inner is missed: 4, unchanged.
        check_eq!(logged(), 5);
        check!(log_at(0) == 3 && log_at(1) == 14 && log_at(2) == 3 && log_at(3) == 1015 && log_at(4) == 4);
        check_eq!(result.value, 1015);
        check_eq!(result.changed, 0);
        check!(inner_counts == Some((1, 1)));
        check!(outer_counts == Some((1, 0)));
    }
    check!(methods_run >= 2);
    Ok(Verdict::Passed)
}

/// Unregisters its own kretprobe while its return is hijacked.
#[inline(never)]
extern "C" fn unregisters_itself(a: u64, _: u64) -> u64 {
    let unregistered = kretprobe::unregister(function_address(unregisters_itself)).is_ok();
    sum(a, u64::from(unregistered))
}

fn kretprobe_unregistered_while_hijacked(_: &Context) -> Outcome {
    let target = function_address(unregisters_itself);
    let mut methods_run = 0;
    for method in Method::ALL {
        if !register_rust(target, method, Some(remember_x0), log_and_add_1000, 1)? {
            continue;
        }
        methods_run += 1;
        clear_log();
        let result = call_checked(target, 5, 0);
        // Back at the real caller, without the handler (+1: the body's unregister succeeded).
        check_eq!(result.value, 6);
        check_eq!(result.changed, 0);
        check_eq!(logged(), 0);
        check!(kretprobe::counts(target).is_none());
        check_eq!(kretprobe::outstanding(), 0);
    }
    check!(methods_run >= 3);
    Ok(Verdict::Passed)
}

/// The traces `traced` takes in its body and its return handler takes at its return.
static BODY_TRACE: IrqSpinLock<Trace> = IrqSpinLock::new(Trace::new());
static HANDLER_TRACE: IrqSpinLock<Trace> = IrqSpinLock::new(Trace::new());
static TRACE_MODE: AtomicUsize = AtomicUsize::new(0);

/// The walker of [`traced`]'s and [`trace_at_return`]'s traces, as an index of [`TRACE_MODES`].
const TRACE_MODES: [Mode; 3] = [Mode::FramePointer, Mode::ShadowCallStack, Mode::SFrame];

fn trace_mode() -> Mode {
    TRACE_MODES[TRACE_MODE.load(Ordering::Relaxed)]
}

#[inline(never)]
extern "C" fn traced(a: u64, _: u64) -> u64 {
    let trace = stacktrace::capture(trace_mode(), TraceOptions::ALL);
    *BODY_TRACE.lock() = trace;
    sum(a, 1)
}

fn trace_at_return(_: &mut Registers, _: u64) {
    let trace = stacktrace::capture(trace_mode(), TraceOptions::ALL);
    *HANDLER_TRACE.lock() = trace;
}

/// One call site for the probed and the unprobed runs (not a tail call), so the newest
/// [`same_callers`] entries of both traces are the same; older ones are the test's own (its loop
/// may be peeled into two call sites).
#[inline(never)]
fn call_traced() -> u64 {
    core::hint::black_box(call_checked(function_address(traced), 1, 0).value)
}

/// `traced`'s call of `capture`, its return into `kretprobe_test_call` (the hijacked one), and
/// in a frame-pointer or SFrame trace that one's return into `call_traced` (the asm pushes no
/// SCS entry).
fn same_callers(mode: Mode) -> usize {
    if mode == Mode::ShadowCallStack { 2 } else { 3 }
}

fn kretprobe_fp_trace_shows_real_callers(_: &Context) -> Outcome {
    if let Some(skipped) = super::no_frame_pointers() {
        return skipped;
    }
    if !FRAME_RECORDS {
        return Ok(Verdict::Skipped("variant plain keeps no frame records"));
    }
    traces_show_real_callers(Mode::FramePointer)
}

fn kretprobe_scs_trace_shows_real_callers(_: &Context) -> Outcome {
    if !crate::build_info::SHADOW_CALL_STACK {
        return Ok(Verdict::Skipped("no shadow call stack in this build"));
    }
    traces_show_real_callers(Mode::ShadowCallStack)
}

/// The SFrame walk crosses `kretprobe_trampoline` by its rows (its return address repaired by
/// the CFA, as in the hijacked function's own frame).
fn kretprobe_sframe_trace_shows_real_callers(_: &Context) -> Outcome {
    traces_show_real_callers(Mode::SFrame)
}

fn traces_show_real_callers(mode: Mode) -> Outcome {
    let index = TRACE_MODES.iter().position(|&each| each == mode).expect("a walker of TRACE_MODES");
    TRACE_MODE.store(index, Ordering::Relaxed);
    let target = function_address(traced);
    let trampoline = kretprobe::trampoline();
    let mut unprobed = Trace::new();
    let same = same_callers(mode);
    // Run 0 unprobed, then once per method, all from one call site (the same callers).
    for run in 0..=Method::ALL.len() {
        let method = run.checked_sub(1).map(|index| Method::ALL[index]);
        if let Some(method) = method
            && !register_rust(target, method, None, trace_at_return, 1)?
        {
            continue;
        }
        let result = call_traced();
        if method.is_some() {
            check!(kretprobe::unregister(target).is_ok());
        }
        check_eq!(result, 2);
        let (body, at_return) = (BODY_TRACE.lock().clone(), HANDLER_TRACE.lock().clone());
        if method.is_none() {
            check!(body.stop_reason().is_complete() && body.len() >= 3);
            unprobed = body;
            continue;
        }
        // In the body: the unprobed trace; the hijacked return shows its real address.
        check!(body.stop_reason().is_complete() && body.len() == unprobed.len());
        if body.addresses()[..same] != unprobed.addresses()[..same] {
            stacktrace::print("probed", &body);
            stacktrace::print("unprobed", &unprobed);
            return Err(fail("the trace in a probed function shows the real callers"));
        }
        // At the return: the handler's own callers (up to the trampoline's frame), then the
        // callers of `traced` from its return address (index 1 of the body trace) on.
        check!(at_return.stop_reason().is_complete());
        check!(at_return.addresses().iter().all(|&address| address != trampoline));
        let callers = unprobed.len() - 1;
        check!(at_return.len() > callers);
        let from = at_return.len() - callers;
        if at_return.addresses()[from..from + same - 1] != unprobed.addresses()[1..same] {
            stacktrace::print("at return", &at_return);
            stacktrace::print("unprobed", &unprobed);
            return Err(fail("the trace at the return shows the real callers of the probed function"));
        }
    }
    Ok(Verdict::Passed)
}
