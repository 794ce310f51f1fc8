//! Suite `probes`, EL0 part: unprobed user calls, uprobe and uretprobe hits on `nop`, `push`
//! and `ret` targets in user space.
//!
//! Same shape as the kernel rows (bench/probes.rs), but everything measured runs at EL0: a user
//! task (IRQs masked at EL0, so no tick lands in it) reads the counter itself (PMCCNTR_EL0 or
//! CNTVCT_EL0, opened to EL0 by task/user.rs), calls the target N times through `blr`, reads
//! the counter again and exits with the difference. The loop without the call is the yardstick
//! for `user-call-*`; the unprobed call loop is the yardstick for `uprobe-*` and `uretprobe-*`.
//! A uprobe hit costs the user -> kernel -> user round trip (two for the stepping methods); a
//! uretprobe hit adds the return trampoline's round trip. The handler counts hits.

use core::sync::atomic::{AtomicU64, Ordering};

use super::{Clock, Label, Plan, row};
use crate::probes::uprobe as uprobes;
use crate::probes::{Method, Registers};
use crate::task::user::{self, Options};

core::arch::global_asm!(
    r#"
    .section .text.user, "ax"
    .balign 16
    .global user_bench_target_nop
user_bench_target_nop:
    nop
    ret
    .balign 16
    .global user_bench_target_push
user_bench_target_push:
    stp     x29, x30, [sp, #-16]!
    ldp     x29, x30, [sp], #16
    ret
    .balign 16
    .global user_bench_target_ret
user_bench_target_ret:
    ret

// x0 = iterations (>= 1), x1 = target, x2 = clock (0: PMCCNTR_EL0, 1: CNTVCT_EL0);
// exit(counter after - counter before).
.macro USER_BENCH_LOOP name, body:vararg
    .balign 16
    .global \name
\name:
    mov     x19, x0
    mov     x20, x1
    mov     x22, x2
    isb
    cbnz    x22, 1f
    mrs     x21, pmccntr_el0
    b       2f
1:  mrs     x21, cntvct_el0
2:  \body
    subs    x19, x19, #1
    b.ne    2b
    isb
    cbnz    x22, 3f
    mrs     x0, pmccntr_el0
    b       4f
3:  mrs     x0, cntvct_el0
4:  sub     x0, x0, x21
    mov     x8, #0
    svc     #0
.endm
    USER_BENCH_LOOP user_bench_loop_alone, nop
    USER_BENCH_LOOP user_bench_loop_call, blr x20
"#
);

unsafe extern "C" {
    static user_bench_target_nop: u32;
    static user_bench_target_push: u32;
    static user_bench_target_ret: u32;
    static user_bench_loop_alone: u32;
    static user_bench_loop_call: u32;
}

static HITS: AtomicU64 = AtomicU64::new(0);

fn count_hit(_: &mut Registers) {
    HITS.fetch_add(1, Ordering::Relaxed);
}

fn count_return(_: &mut Registers) {}

/// One EL0 run of `body` over `target`, on the plan's clock.
fn measure(plan: &Plan, body: u64, iterations: u64, target: u64) -> Option<u64> {
    let clock = u64::from(plan.clock == Clock::Nanoseconds);
    let options = Options { irqs_masked: true, unmap_lowest_stack_page: false };
    let ticks = match user::run(body, [iterations, target, clock], options) {
        Ok(ticks) => ticks,
        Err(fault) => {
            defmt::error!("bench uprobes: user loop faulted: {}", fault);
            return None;
        }
    };
    Some(match plan.clock {
        Clock::Cycles => ticks,
        Clock::Nanoseconds => (ticks as u128 * 1_000_000_000 / crate::drivers::timer::frequency() as u128) as u64,
    })
}

pub fn run(plan: &Plan) {
    let iterations: u64 = if plan.icount { 10_000 } else { 20_000 };
    let address = |symbol: *const u32| user::user_address(symbol as u64);
    let (alone, call) = (address(&raw const user_bench_loop_alone), address(&raw const user_bench_loop_call));
    let targets: [(&str, u64, &[Method]); 3] = [
        ("nop", address(&raw const user_bench_target_nop), &Method::ALL),
        ("push", address(&raw const user_bench_target_push), &Method::ALL),
        // A `ret` cannot run out of line: simulate and detour only.
        ("ret", address(&raw const user_bench_target_ret), &[Method::Simulate, Method::Detour]),
    ];
    let unit = plan.unit();
    for _ in 0..plan.reps {
        let Some(loop_alone) = measure(plan, alone, iterations, targets[0].1) else { return };
        for (name, target, methods) in targets {
            let Some(unprobed) = measure(plan, call, iterations, target) else { return };
            let case = Label::new(format_args!("user-call-{name}"));
            row(
                "probes",
                case.as_str(),
                "-",
                "per_call",
                unit,
                (unprobed as f64 - loop_alone as f64) / iterations as f64,
            );
            for (prefix, returns) in [("uprobe-", None), ("uretprobe-", Some(count_return as crate::probes::Handler))] {
                let case = Label::new(format_args!("{prefix}{name}"));
                for &method in methods {
                    if let Err(error) = uprobes::register(target, method, count_hit, returns) {
                        defmt::error!("bench uprobes: {=str} {}: {}", case.as_str(), method, error);
                        continue;
                    }
                    HITS.store(0, Ordering::Relaxed);
                    let probed = measure(plan, call, iterations, target);
                    let counts = uprobes::counts(target);
                    let hits = HITS.load(Ordering::Relaxed);
                    let expected = Some((iterations, if returns.is_some() { iterations } else { 0 }));
                    if uprobes::unregister(target).is_err() || hits != iterations || counts != expected {
                        defmt::error!(
                            "bench uprobes: {=str} {}: {=u64} hits for {=u64} calls",
                            case.as_str(),
                            method,
                            hits,
                            iterations
                        );
                        continue;
                    }
                    let Some(probed) = probed else { continue };
                    super::probes::hit_rows(case.as_str(), method, probed, unprobed, iterations, unit);
                }
            }
        }
    }
}
