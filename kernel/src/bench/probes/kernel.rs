//! Suite `probes`, kernel part: `kernel-call-*`, `kprobe-*` and `kretprobe-*` rows.
//!
//! A kretprobe enters through a probe of the given method on the target's first instruction (asm:
//! no patchable entry) and returns through `kretprobe_trampoline`; its `per_hit` is the entry
//! probe, the instance push, the trampoline and the return handler together.

use core::sync::atomic::Ordering;

use super::{HITS, Kind, RETURNS, TARGET_METHODS, call_row, count_hit, iterations, method_rows};
use crate::bench::{Label, Plan};
use crate::probes::{self as kprobes, Registers, kretprobe};

core::arch::global_asm!(
    probe_targets!(".text.bench_probe_targets", "bench_probe_target"),
    r#"
// x0 = iterations (>= 1), x1 = target; the counter and the target live in callee-saved x19/x20,
// so the target and any probe handler may use every caller-saved register.
.macro PROBE_BENCH_LOOP name, body:vararg
    .balign 16
    .global \name
    .type \name, %function
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
    .size \name, . - \name
.endm
    PROBE_BENCH_LOOP bench_probe_loop_alone,
    PROBE_BENCH_LOOP bench_probe_loop_call, blr x20
"#
);

unsafe extern "C" {
    fn bench_probe_target_nop();
    pub(crate) fn bench_probe_target_push();
    fn bench_probe_target_ret();
    fn bench_probe_loop_alone(iterations: u64, target: u64);
    pub(crate) fn bench_probe_loop_call(iterations: u64, target: u64);
}

type Loop = unsafe extern "C" fn(u64, u64);

pub(crate) fn measure(plan: &Plan, body: Loop, iterations: u64, target: u64) -> u64 {
    // The same indirect call for every case, its target loaded before the window opens.
    let body = core::hint::black_box(body);
    // SAFETY: the loops call `target`, one of the asm targets above (probed or not), which only
    // touch the stack frame they push and pop.
    plan.measure(|| unsafe { body(iterations, target) })
}

fn count_return(_: &mut Registers, _: u64) {
    RETURNS.fetch_add(1, Ordering::Relaxed);
}

const KPROBE: Kind = Kind {
    name: "probes",
    register: |target, method| kprobes::register(target, method, count_hit, None),
    unregister: kprobes::unregister,
    all_seen: |_, iterations| HITS.load(Ordering::Relaxed) == iterations,
};

const KRETPROBE: Kind = Kind {
    name: "kretprobes",
    register: |target, method| kretprobe::register(target, method, None, count_return, 1),
    unregister: kretprobe::unregister,
    all_seen: |_, iterations| RETURNS.load(Ordering::Relaxed) == iterations,
};

/// Every row of the suite: the kernel rows, then the EL0 rows.
pub fn run(plan: &Plan) {
    let iterations = iterations(plan);
    let targets = [
        bench_probe_target_nop as *const () as u64,
        bench_probe_target_push as *const () as u64,
        bench_probe_target_ret as *const () as u64,
    ];
    for _ in 0..plan.reps {
        let alone = measure(plan, bench_probe_loop_alone, iterations, targets[0]);
        for ((name, methods), target) in TARGET_METHODS.into_iter().zip(targets) {
            let unprobed = measure(plan, bench_probe_loop_call, iterations, target);
            call_row(plan, Label::new(format_args!("kernel-call-{name}")).as_str(), unprobed, alone);
            let probed = || Some(measure(plan, bench_probe_loop_call, iterations, target));
            let case = Label::new(format_args!("kprobe-{name}"));
            method_rows(plan, &KPROBE, case.as_str(), target, methods, unprobed, &probed);
        }
    }
    for _ in 0..plan.reps {
        for ((name, methods), target) in TARGET_METHODS.into_iter().zip(targets) {
            let unprobed = measure(plan, bench_probe_loop_call, iterations, target);
            let probed = || Some(measure(plan, bench_probe_loop_call, iterations, target));
            let case = Label::new(format_args!("kretprobe-{name}"));
            method_rows(plan, &KRETPROBE, case.as_str(), target, methods, unprobed, &probed);
        }
    }
    super::user::run(plan);
}
