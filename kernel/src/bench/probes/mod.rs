//! Suite `probes`: unprobed calls and probe hits (kprobe, kretprobe, uprobe, uretprobe) on
//! `nop`, `push` and `ret` targets, every method that applies.
//!
//! The targets are assembly functions whose first instruction is exactly `nop`,
//! `stp x29, x30, [sp, #-16]!` or `ret` (the uprobes STP thread's bpf bench targets); a Rust function would
//! start with the patchable NOPs and `paciasp`. One loop calls the target indirectly (`blr`) N
//! times; the same loop without the call is the yardstick for `per_call`, and the unprobed call
//! loop is the yardstick for `per_hit`. Handlers count hits (as a bpf program would). The kernel
//! loops are in `kernel.rs`, the EL0 ones in `user.rs`; every probe kind goes through the one
//! loop [`method_rows`].

/// The asm of the three targets in `section`, named `{prefix}_nop`, `{prefix}_push` and
/// `{prefix}_ret`: one text for the kernel and the EL0 copies.
macro_rules! probe_targets {
    ($section:literal, $prefix:literal) => {
        concat!(
            "    .section ",
            $section,
            ", \"ax\"\n",
            "    .balign 16\n",
            "    .global ",
            $prefix,
            "_nop\n",
            "    .type ",
            $prefix,
            "_nop, %function\n",
            $prefix,
            "_nop:\n",
            "    nop\n",
            "    ret\n",
            "    .size ",
            $prefix,
            "_nop, . - ",
            $prefix,
            "_nop\n",
            "    .balign 16\n",
            "    .global ",
            $prefix,
            "_push\n",
            "    .type ",
            $prefix,
            "_push, %function\n",
            $prefix,
            "_push:\n",
            "    stp     x29, x30, [sp, #-16]!\n",
            "    ldp     x29, x30, [sp], #16\n",
            "    ret\n",
            "    .size ",
            $prefix,
            "_push, . - ",
            $prefix,
            "_push\n",
            "    .balign 16\n",
            "    .global ",
            $prefix,
            "_ret\n",
            "    .type ",
            $prefix,
            "_ret, %function\n",
            $prefix,
            "_ret:\n",
            "    ret\n",
            "    .size ",
            $prefix,
            "_ret, . - ",
            $prefix,
            "_ret\n",
        )
    };
}

mod kernel;
mod user;

use core::sync::atomic::{AtomicU64, Ordering};

use super::{Label, Plan, row, row_windows};
use crate::probes::{Method, ProbeError, Registers};

pub use kernel::run;
pub(crate) use kernel::{bench_probe_loop_call, bench_probe_target_push, measure};

/// Iterations per measured loop (the demo measures with the same count, so its figures are the
/// bench's).
pub(crate) fn iterations(plan: &Plan) -> u64 {
    if plan.icount { 10_000 } else { 20_000 }
}

/// The methods that apply to each target: a `ret` cannot run out of line.
const TARGET_METHODS: [(&str, &[Method]); 3] =
    [("nop", &Method::ALL), ("push", &Method::ALL), ("ret", &[Method::Simulate, Method::Detour])];

static HITS: AtomicU64 = AtomicU64::new(0);
static RETURNS: AtomicU64 = AtomicU64::new(0);

fn count_hit(_: &mut Registers) {
    HITS.fetch_add(1, Ordering::Relaxed);
}

/// One probe kind as the bench drives it.
struct Kind {
    /// The bench log's name for it.
    name: &'static str,
    register: fn(target: u64, method: Method) -> Result<(), ProbeError>,
    unregister: fn(target: u64) -> Result<(), ProbeError>,
    /// Whether the probe saw every one of `iterations` calls (its handlers' and its own counts).
    all_seen: fn(target: u64, iterations: u64) -> bool,
}

/// The `per_hit` and `hits_per_s` rows of `case` for every method: register, run the probed
/// loop (`measure`, None if it faulted), check every call was seen, unregister.
fn method_rows(
    plan: &Plan,
    kind: &Kind,
    case: &str,
    target: u64,
    methods: &[Method],
    unprobed: u64,
    measure: &dyn Fn() -> Option<u64>,
) {
    let iterations = iterations(plan);
    for &method in methods {
        if let Err(error) = (kind.register)(target, method) {
            defmt::error!("bench {=str}: {=str} {}: {}", kind.name, case, method, error);
            continue;
        }
        HITS.store(0, Ordering::Relaxed);
        RETURNS.store(0, Ordering::Relaxed);
        let probed = measure();
        let seen = (kind.all_seen)(target, iterations);
        if (kind.unregister)(target).is_err() || !seen {
            defmt::error!(
                "bench {=str}: {=str} {}: {=u64} hits, {=u64} returns counted for {=u64} calls",
                kind.name,
                case,
                method,
                HITS.load(Ordering::Relaxed),
                RETURNS.load(Ordering::Relaxed),
                iterations
            );
            continue;
        }
        let Some(probed) = probed else { continue };
        hit_rows(case, method, probed, unprobed, iterations, plan.unit());
    }
}

/// The `per_hit` and `hits_per_s` rows of one probed case and method: `probed` and `unprobed`
/// are the same loop of `iterations` calls with and without the probe.
fn hit_rows(case: &str, method: Method, probed: u64, unprobed: u64, iterations: u64, unit: &str) {
    let params = Label::new(format_args!("method={}", method.name()));
    let per_hit = (probed as f64 - unprobed as f64) / iterations as f64;
    row("probes", case, params.as_str(), "per_hit", unit, per_hit);
    row_windows("probes", case, params.as_str(), "per_hit", probed, Some(unprobed), iterations);
    // icount: one instruction per virtual ns (shift=0); wall: virtual ns.
    let seconds = probed as f64 / 1e9;
    row("probes", case, params.as_str(), "hits_per_s", "hits_per_s", iterations as f64 / seconds);
}

/// The `per_call` row of a call loop against the loop without the call.
fn call_row(plan: &Plan, case: &str, unprobed: u64, alone: u64) {
    let iterations = iterations(plan);
    row("probes", case, "-", "per_call", plan.unit(), (unprobed as f64 - alone as f64) / iterations as f64);
    row_windows("probes", case, "-", "per_call", unprobed, Some(alone), iterations);
}
