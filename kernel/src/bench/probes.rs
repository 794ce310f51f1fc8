//! Suite `probes`: unprobed calls and kernel probe hits on `nop`, `push` and `ret` targets.
//!
//! The targets are assembly functions whose first instruction is exactly `nop`,
//! `stp x29, x30, [sp, #-16]!` or `ret` (seed 001's bpf bench targets); a Rust function would
//! start with the patchable NOPs and `paciasp`. One loop calls the target indirectly (`blr`) N
//! times; the same loop without the call is the yardstick for `per_call`, and the unprobed call
//! loop is the yardstick for `per_hit`. The pre-handler counts hits (as a bpf program would).

use core::sync::atomic::{AtomicU64, Ordering};

use super::{Label, Plan, row};
use crate::probes::{self as kprobes, Method, Registers};

core::arch::global_asm!(
    r#"
    .section .text.bench_probe_targets, "ax"
    .balign 16
    .global bench_probe_target_nop
bench_probe_target_nop:
    nop
    ret
    .balign 16
    .global bench_probe_target_push
bench_probe_target_push:
    stp     x29, x30, [sp, #-16]!
    ldp     x29, x30, [sp], #16
    ret
    .balign 16
    .global bench_probe_target_ret
bench_probe_target_ret:
    ret

// x0 = iterations (>= 1), x1 = target; the counter and the target live in callee-saved x19/x20,
// so the target and any probe handler may use every caller-saved register.
.macro PROBE_BENCH_LOOP name, body:vararg
    .balign 16
    .global \name
\name:
    stp     x29, x30, [sp, #-32]!
    stp     x19, x20, [sp, #16]
    mov     x29, sp
    mov     x19, x0
    mov     x20, x1
1:  \body
    subs    x19, x19, #1
    b.ne    1b
    ldp     x19, x20, [sp, #16]
    ldp     x29, x30, [sp], #32
    ret
.endm
    PROBE_BENCH_LOOP bench_probe_loop_alone,
    PROBE_BENCH_LOOP bench_probe_loop_call, blr x20
"#
);

unsafe extern "C" {
    pub(super) fn bench_probe_target_nop();
    pub(crate) fn bench_probe_target_push();
    pub(super) fn bench_probe_target_ret();
    fn bench_probe_loop_alone(iterations: u64, target: u64);
    pub(crate) fn bench_probe_loop_call(iterations: u64, target: u64);
}

static HITS: AtomicU64 = AtomicU64::new(0);

fn count_hit(_: &mut Registers) {
    HITS.fetch_add(1, Ordering::Relaxed);
}

/// Calls per measured loop: the demo measures with the same count, so its figures are the bench's.
pub(crate) fn iterations(plan: &Plan) -> u64 {
    if plan.icount { 10_000 } else { 20_000 }
}

pub(super) type Loop = unsafe extern "C" fn(u64, u64);

pub(crate) fn measure(plan: &Plan, body: Loop, iterations: u64, target: u64) -> u64 {
    // The same indirect call for every case, its target loaded before the window opens.
    let body = core::hint::black_box(body);
    // SAFETY: the loops call `target`, one of the asm targets above (probed or not), which only
    // touch the stack frame they push and pop.
    plan.measure(|| unsafe { body(iterations, target) })
}

pub fn run(plan: &Plan) {
    let iterations = iterations(plan);
    let targets: [(&str, u64, &[Method]); 3] = [
        ("nop", bench_probe_target_nop as *const () as u64, &Method::ALL),
        ("push", bench_probe_target_push as *const () as u64, &Method::ALL),
        // A `ret` cannot run out of line: simulate and detour only.
        ("ret", bench_probe_target_ret as *const () as u64, &[Method::Simulate, Method::Detour]),
    ];
    let unit = plan.unit();
    for _ in 0..plan.reps {
        let alone = measure(plan, bench_probe_loop_alone, iterations, targets[0].1);
        for (name, target, methods) in targets {
            let unprobed = measure(plan, bench_probe_loop_call, iterations, target);
            let mut case = Label::new(format_args!("kernel-call-{name}"));
            row("probes", case.as_str(), "-", "per_call", unit, (unprobed as f64 - alone as f64) / iterations as f64);
            case = Label::new(format_args!("kprobe-{name}"));
            for &method in methods {
                if let Err(error) = kprobes::register(target, method, count_hit, None) {
                    defmt::error!("bench probes: {=str} {}: {}", name, method, error);
                    continue;
                }
                HITS.store(0, Ordering::Relaxed);
                let probed = measure(plan, bench_probe_loop_call, iterations, target);
                let hits = HITS.load(Ordering::Relaxed);
                if kprobes::unregister(target).is_err() || hits != iterations {
                    defmt::error!(
                        "bench probes: {=str} {}: {=u64} hits for {=u64} calls",
                        name,
                        method,
                        hits,
                        iterations
                    );
                    continue;
                }
                hit_rows(case.as_str(), method, probed, unprobed, iterations, unit);
            }
        }
    }
    super::kretprobes::run(plan);
    super::uprobes::run(plan);
}

/// The `per_hit` and `hits_per_s` rows of one probed case and method: `probed` and `unprobed`
/// are the same loop of `iterations` calls with and without the probe.
pub(super) fn hit_rows(case: &str, method: Method, probed: u64, unprobed: u64, iterations: u64, unit: &str) {
    let params = Label::new(format_args!("method={}", method.name()));
    let per_hit = (probed as f64 - unprobed as f64) / iterations as f64;
    row("probes", case, params.as_str(), "per_hit", unit, per_hit);
    // icount: one instruction per virtual ns (shift=0); wall: virtual ns.
    let seconds = probed as f64 / 1e9;
    row("probes", case, params.as_str(), "hits_per_s", "hits_per_s", iterations as f64 / seconds);
}
