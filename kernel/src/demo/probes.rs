//! Demo part 4: a kprobe hit once with each method, a kretprobe, a uprobe in an EL0 task.
//!
//! The kprobe target is the bench's `push` target (`stp x29, x30, [sp, #-16]!`), so each
//! method's cost per hit is measured exactly as the bench's `kprobe-push` row is: the same loop,
//! call count and counting handler cost (`bench::probes`). The single hit is a direct call with
//! recognisable arguments, seen by a handler that keeps the registers; the hit count printed is
//! the probe subsystem's own counter (`probes::counts`), not the handler's.

use super::cost;
use crate::bench::probes::{bench_probe_loop_call, bench_probe_target_push, iterations, measure};
use crate::bench::{Label, Plan};
use crate::probes::uprobe as uprobes;
use crate::probes::{self as kprobes, Method, Registers, kretprobe};
use crate::task::user::{self, Options};
use core::sync::atomic::{AtomicU64, Ordering};

/// The arguments of the single call: what the handler must see in x0..x2.
const ARGUMENTS: [u64; 3] = [0x1111, 0x2222, 0x3333];

static SEEN: crate::sync::IrqSpinLock<Option<Registers>> = crate::sync::IrqSpinLock::new(None);
static HITS: AtomicU64 = AtomicU64::new(0);

fn keep_registers(registers: &mut Registers) {
    *SEEN.lock() = Some(*registers);
}

/// The bench's handler cost: one relaxed add.
fn count_hit(_: &mut Registers) {
    HITS.fetch_add(1, Ordering::Relaxed);
}

fn count_return(_: &mut Registers, _: u64) {
    HITS.fetch_add(1, Ordering::Relaxed);
}

static RETURNED: crate::sync::IrqSpinLock<Option<(u64, u64)>> = crate::sync::IrqSpinLock::new(None);

fn keep_return(registers: &mut Registers, _: u64) {
    *RETURNED.lock() = Some((registers.x[0], registers.pc));
}

fn target() -> u64 {
    bench_probe_target_push as *const () as u64
}

/// Calls the target once with `ARGUMENTS` in x0..x2.
#[inline(never)]
fn call_once() {
    // SAFETY: the push target is an asm function that only pushes and pops a frame record and
    // returns (x0 unchanged); any AAPCS signature calls it correctly.
    let function: extern "C" fn(u64, u64, u64) -> u64 = unsafe { core::mem::transmute(target()) };
    core::hint::black_box(function(ARGUMENTS[0], ARGUMENTS[1], ARGUMENTS[2]));
}

pub fn show(plan: &Plan) {
    let target = target();
    defmt::info!("demo: kprobe target {=u64:#x} (first instruction: stp x29, x30, [sp, #-16]!)", target);
    let unprobed = unprobed_loop(plan);
    for method in Method::ALL {
        one_method(plan, method, target, unprobed);
    }
    kretprobe_once(plan, target, unprobed);
    uprobe_once();
}

fn one_method(plan: &Plan, method: Method, target: u64, unprobed: u64) {
    *SEEN.lock() = None;
    if let Err(error) = kprobes::register(target, method, keep_registers, None) {
        defmt::error!("demo: kprobe {=str}: {}", method.name(), error);
        return;
    }
    call_once();
    let (hits, missed) = kprobes::counts(target).unwrap_or((0, 0));
    let _ = kprobes::unregister(target);
    match *SEEN.lock() {
        Some(seen) => defmt::info!(
            "demo: kprobe {=str} hits={=u64} missed={=u64} x0={=u64:#x} x1={=u64:#x} x2={=u64:#x} sp={=u64:#x} pc={=u64:#x} lr={=u64:#x}",
            method.name(),
            hits,
            missed,
            seen.x[0],
            seen.x[1],
            seen.x[2],
            seen.sp,
            seen.pc,
            seen.x[30]
        ),
        None => defmt::error!("demo: kprobe {=str}: the handler did not run (hits {=u64})", method.name(), hits),
    }
    if let Some(per_hit) = kprobe_per_hit(plan, method, unprobed) {
        let params = Label::new(format_args!("method={}", method.name()));
        cost("probes", "kprobe-push", params.as_str(), "per_hit", plan, per_hit);
    }
}

/// What a kprobe hit of `method` costs on the push target, as the bench's `kprobe-push` row
/// measures it; `unprobed` is the same loop without the probe (`unprobed_loop`).
pub fn kprobe_per_hit(plan: &Plan, method: Method, unprobed: u64) -> Option<f64> {
    let target = target();
    if let Err(error) = kprobes::register(target, method, count_hit, None) {
        defmt::error!("demo: kprobe {=str}: {}", method.name(), error);
        return None;
    }
    HITS.store(0, Ordering::Relaxed);
    let probed = measure(plan, bench_probe_loop_call, iterations(plan), target);
    let _ = kprobes::unregister(target);
    per_hit(plan, method, probed, unprobed)
}

/// The bench's unprobed call loop on the push target: the yardstick of `per_hit`.
pub fn unprobed_loop(plan: &Plan) -> u64 {
    measure(plan, bench_probe_loop_call, iterations(plan), target())
}

fn per_hit(plan: &Plan, method: Method, probed: u64, unprobed: u64) -> Option<f64> {
    let (counted, iterations) = (HITS.load(Ordering::Relaxed), iterations(plan));
    if counted != iterations {
        defmt::error!("demo: {=str}: {=u64} hits for {=u64} calls", method.name(), counted, iterations);
        return None;
    }
    Some((probed as f64 - unprobed as f64) / iterations as f64)
}

fn kretprobe_once(plan: &Plan, target: u64, unprobed: u64) {
    let method = Method::Simulate;
    *RETURNED.lock() = None;
    if let Err(error) = kretprobe::register(target, method, None, keep_return, 1) {
        defmt::error!("demo: kretprobe: {}", error);
        return;
    }
    call_once();
    let (hits, missed) = kretprobe::counts(target).unwrap_or((0, 0));
    let _ = kretprobe::unregister(target);
    match *RETURNED.lock() {
        Some((value, to)) => defmt::info!(
            "demo: kretprobe {=str} hits={=u64} missed={=u64} returned x0={=u64:#x} to={=u64:#x}",
            method.name(),
            hits,
            missed,
            value,
            to
        ),
        None => defmt::error!("demo: kretprobe: the return handler did not run"),
    }
    if let Some(per_hit) = kretprobe_per_hit(plan, method, unprobed) {
        let params = Label::new(format_args!("method={}", method.name()));
        cost("probes", "kretprobe-push", params.as_str(), "per_hit", plan, per_hit);
    }
}

/// What a kretprobe hit (entry probe of `method`, trampoline, return handler) costs on the push
/// target, as the bench's `kretprobe-push` row measures it.
pub fn kretprobe_per_hit(plan: &Plan, method: Method, unprobed: u64) -> Option<f64> {
    let target = target();
    if let Err(error) = kretprobe::register(target, method, None, count_return, 1) {
        defmt::error!("demo: kretprobe {=str}: {}", method.name(), error);
        return None;
    }
    HITS.store(0, Ordering::Relaxed);
    let probed = measure(plan, bench_probe_loop_call, iterations(plan), target);
    let _ = kretprobe::unregister(target);
    per_hit(plan, method, probed, unprobed)
}

core::arch::global_asm!(
    r#"
    .section .text.user, "ax"
    .balign 16
// x0, x1: two numbers; exit(demo_user_add(x0, x1)).
    .global demo_user_program
demo_user_program:
    bl      demo_user_add
    mov     x8, #0
    svc     #0
    .balign 16
    .global demo_user_add
demo_user_add:
    add     x0, x0, x1
    ret
"#
);

unsafe extern "C" {
    static demo_user_program: u32;
    static demo_user_add: u32;
}

static USER_SEEN: crate::sync::IrqSpinLock<Option<Registers>> = crate::sync::IrqSpinLock::new(None);

fn keep_user_registers(registers: &mut Registers) {
    *USER_SEEN.lock() = Some(*registers);
}

fn uprobe_once() {
    let program = user::user_address(&raw const demo_user_program as u64);
    let add = user::user_address(&raw const demo_user_add as u64);
    let method = Method::SingleStep;
    *USER_SEEN.lock() = None;
    if let Err(error) = uprobes::register(add, method, keep_user_registers, None) {
        defmt::error!("demo: uprobe: {}", error);
        return;
    }
    let result = user::run(program, [40, 2, 0], Options::DEFAULT);
    let (hits, _) = uprobes::counts(add).unwrap_or((0, 0));
    let _ = uprobes::unregister(add);
    match (result, *USER_SEEN.lock()) {
        (Ok(code), Some(seen)) => defmt::info!(
            "demo: uprobe {=str} in EL0 task: hits={=u64} x0={=u64} x1={=u64} pc={=u64:#x} (user VA), exit code {=u64}",
            method.name(),
            hits,
            seen.x[0],
            seen.x[1],
            seen.pc,
            code
        ),
        (Err(fault), _) => defmt::error!("demo: uprobe: the user task faulted: {}", fault),
        (Ok(_), None) => defmt::error!("demo: uprobe: the handler did not run"),
    }
}
