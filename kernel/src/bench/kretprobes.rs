//! Suite `probes`, kretprobe rows: `kretprobe-{nop,push,ret}` x method, `per_hit` and
//! `hits_per_s`.
//!
//! The same asm targets and call loop as the kprobe rows (`probes.rs`); a kretprobe enters
//! through a probe of the given method on the target's first instruction (asm: no patchable
//! entry) and returns through `kretprobe_trampoline`. The return handler counts hits. `per_hit`
//! is the probed loop minus the unprobed call loop, per call: the entry probe, the instance push,
//! the trampoline and the return handler together.

use core::sync::atomic::{AtomicU64, Ordering};

use super::probes::{
    bench_probe_loop_call, bench_probe_target_nop, bench_probe_target_push, bench_probe_target_ret, hit_rows, measure,
};
use super::{Label, Plan};
use crate::probes::kretprobe;
use crate::probes::{Method, Registers};

static RETURNS: AtomicU64 = AtomicU64::new(0);

fn count_return(_: &mut Registers, _: u64) {
    RETURNS.fetch_add(1, Ordering::Relaxed);
}

pub fn run(plan: &Plan) {
    let iterations: u64 = if plan.icount { 10_000 } else { 20_000 };
    let targets: [(&str, u64, &[Method]); 3] = [
        ("nop", bench_probe_target_nop as *const () as u64, &Method::ALL),
        ("push", bench_probe_target_push as *const () as u64, &Method::ALL),
        // A `ret` cannot run out of line: simulate and detour only.
        ("ret", bench_probe_target_ret as *const () as u64, &[Method::Simulate, Method::Detour]),
    ];
    let unit = plan.unit();
    for _ in 0..plan.reps {
        for (name, target, methods) in targets {
            let unprobed = measure(plan, bench_probe_loop_call, iterations, target);
            let case = Label::new(format_args!("kretprobe-{name}"));
            for &method in methods {
                if let Err(error) = kretprobe::register(target, method, None, count_return, 1) {
                    defmt::error!("bench kretprobes: {=str} {}: {}", name, method, error);
                    continue;
                }
                RETURNS.store(0, Ordering::Relaxed);
                let probed = measure(plan, bench_probe_loop_call, iterations, target);
                let returns = RETURNS.load(Ordering::Relaxed);
                if kretprobe::unregister(target).is_err() || returns != iterations {
                    defmt::error!(
                        "bench kretprobes: {=str} {}: {=u64} returns for {=u64} calls",
                        name,
                        method,
                        returns,
                        iterations
                    );
                    continue;
                }
                hit_rows(case.as_str(), method, probed, unprobed, iterations, unit);
            }
        }
    }
}
