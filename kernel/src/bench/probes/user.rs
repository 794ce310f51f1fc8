//! Suite `probes`, EL0 part: `user-call-*`, `uprobe-*` and `uretprobe-*` rows.
//!
//! Everything measured runs at EL0: a user task (IRQs masked at EL0, so no tick lands in it)
//! reads the counter itself (PMCCNTR_EL0 or CNTVCT_EL0, opened to EL0 by task/user.rs), calls
//! the target N times through `blr`, reads the counter again and exits with the difference. A
//! uprobe hit costs the user -> kernel -> user round trip (two for the stepping methods); a
//! uretprobe hit adds the return trampoline's round trip.

use core::sync::atomic::Ordering;

use super::{HITS, Kind, TARGET_METHODS, call_row, count_hit, iterations, method_rows};
use crate::bench::{Clock, Label, Plan};
use crate::probes::{Registers, uprobe};
use crate::task::user::{self, Options};

core::arch::global_asm!(
    probe_targets!(".text.user", "user_bench_target"),
    r#"
// x0 = iterations (>= 1), x1 = target, x2 = clock (0: PMCCNTR_EL0, 1: CNTVCT_EL0);
// exit(counter after - counter before).
.macro USER_BENCH_LOOP name, body:vararg
    .balign 16
    .global \name
    .type \name, %function
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
    .size \name, . - \name
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

/// Does nothing: the probe's own return count is checked (a count here would be measured).
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

const UPROBE: Kind = Kind {
    name: "uprobes",
    register: |target, method| uprobe::register(target, method, count_hit, None),
    unregister: uprobe::unregister,
    all_seen: |target, iterations| {
        HITS.load(Ordering::Relaxed) == iterations && uprobe::counts(target) == Some((iterations, 0))
    },
};

const URETPROBE: Kind = Kind {
    name: "uprobes",
    register: |target, method| uprobe::register(target, method, count_hit, Some(count_return)),
    unregister: uprobe::unregister,
    all_seen: |target, iterations| {
        HITS.load(Ordering::Relaxed) == iterations && uprobe::counts(target) == Some((iterations, iterations))
    },
};

pub fn run(plan: &Plan) {
    let iterations = iterations(plan);
    let address = |symbol: *const u32| user::user_address(symbol as u64);
    let (alone, call) = (address(&raw const user_bench_loop_alone), address(&raw const user_bench_loop_call));
    let targets = [
        address(&raw const user_bench_target_nop),
        address(&raw const user_bench_target_push),
        address(&raw const user_bench_target_ret),
    ];
    for _ in 0..plan.reps {
        let Some(loop_alone) = measure(plan, alone, iterations, targets[0]) else { return };
        for ((name, methods), target) in TARGET_METHODS.into_iter().zip(targets) {
            let Some(unprobed) = measure(plan, call, iterations, target) else { return };
            call_row(plan, Label::new(format_args!("user-call-{name}")).as_str(), unprobed, loop_alone);
            let probed = || measure(plan, call, iterations, target);
            for (prefix, kind) in [("uprobe-", &UPROBE), ("uretprobe-", &URETPROBE)] {
                let case = Label::new(format_args!("{prefix}{name}"));
                method_rows(plan, kind, case.as_str(), target, methods, unprobed, &probed);
            }
        }
    }
}
