//! Suite `baseline`: the yardsticks for every per-hit figure. A counted loop alone, and the same
//! loop with a plain call, a PAC-signed call, a call with a shadow-call-stack push/pop, and a BRK
//! exception round trip. The loops are assembly so that every build variant and CPU executes
//! exactly the same instructions around the mechanism measured.

use super::{Plan, row, row_windows};
use crate::arch::exception::BRK_BENCH;

// Each loop: x0 = iterations (>= 1), counter in x19 (callee-saved, so the called function may use
// any caller-saved register), and x18 pointed at a scratch shadow stack for the duration (in the
// `plain` variant x18 is an ordinary register; interrupts are masked while a loop runs). Every
// loop has the same prologue and epilogue, so (case - loop) / N is the mechanism alone.
core::arch::global_asm!(
    r#"
.macro BENCH_LOOP name, body:vararg
    .section .text.bench, "ax"
    .balign 16
    .global \name
    .type \name, %function
\name:
    stp     x29, x30, [sp, #-32]!
    stp     x18, x19, [sp, #16]
    mov     x29, sp
    adrp    x18, bench_scratch_shadow_stack
    add     x18, x18, :lo12:bench_scratch_shadow_stack
    mov     x19, x0
1:  \body
    subs    x19, x19, #1
    b.ne    1b
    ldp     x18, x19, [sp, #16]
    ldp     x29, x30, [sp], #32
    ret
    .size \name, . - \name
.endm

    BENCH_LOOP bench_loop_alone,
    BENCH_LOOP bench_loop_call, bl bench_plain_function
    BENCH_LOOP bench_loop_call_pac, bl bench_pac_function
    BENCH_LOOP bench_loop_call_scs, bl bench_scs_function
    BENCH_LOOP bench_loop_brk, brk #{brk}

    .section .text.bench, "ax"
    .type bench_plain_function, %function
bench_plain_function:
    ret
    .size bench_plain_function, . - bench_plain_function
    .type bench_pac_function, %function
bench_pac_function:
    paciasp
    autiasp
    ret
    .size bench_pac_function, . - bench_pac_function
    .type bench_scs_function, %function
bench_scs_function:
    str     x30, [x18], #8
    ldr     x30, [x18, #-8]!
    ret
    .size bench_scs_function, . - bench_scs_function

    .section .bss.bench, "aw", @nobits
    // Aligned like a stack slot's shadow stack (task/stacks.rs), so that exception entry's
    // shadow-stack overflow check accepts x18 while the BRK loop runs.
    .balign 65536
bench_scratch_shadow_stack:
    .skip 64
"#,
    brk = const BRK_BENCH,
);

unsafe extern "C" {
    fn bench_loop_alone(iterations: u64);
    fn bench_loop_call(iterations: u64);
    fn bench_loop_call_pac(iterations: u64);
    fn bench_loop_call_scs(iterations: u64);
    fn bench_loop_brk(iterations: u64);
}

type Loop = unsafe extern "C" fn(u64);

/// The loop alone first: every other case is measured against it.
const CASES: [(&str, Loop); 5] = [
    ("loop", bench_loop_alone),
    ("call", bench_loop_call),
    ("call-pac", bench_loop_call_pac),
    ("call-scs", bench_loop_call_scs),
    ("brk-roundtrip", bench_loop_brk),
];

pub fn run(plan: &Plan) {
    // icount is exact, so fewer iterations suffice; wall mode needs enough work per sample to
    // swamp counter resolution and host noise.
    let iterations: u64 = if plan.icount { 10_000 } else { 100_000 };
    for _ in 0..plan.reps {
        let mut alone = 0;
        for (case, body) in CASES {
            // The same indirect call for every case, its target loaded before the window opens.
            let body = core::hint::black_box(body);
            // SAFETY: the loops only touch their own stack frame and the scratch shadow stack;
            // the BRK loop's exception is resumed by the BRK_BENCH fast path in exception.rs.
            let cost = plan.measure(|| unsafe { body(iterations) });
            let per_op = if case == "loop" {
                alone = cost;
                cost as f64 / iterations as f64
            } else {
                (cost as f64 - alone as f64) / iterations as f64
            };
            row("baseline", case, "-", "per_op", plan.unit(), per_op);
            let reference = (case != "loop").then_some(alone);
            row_windows("baseline", case, "-", "per_op", cost, reference, iterations);
        }
    }
}
