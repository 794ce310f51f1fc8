//! `run=demo`: every mechanism once, live, in lines xtask renders and checks (xtask/src/demo.rs).
//!
//! Each part starts with a `demo: == TITLE ==` heading. Costs are measured now, with the bench's
//! own measurement code and loop counts (`crate::bench`), and printed as
//! `demo cost: SUITE CASE PARAMS METRIC UNIT VALUE`: the fields of the bench row that measures
//! the same case, so `cargo xtask test` can hold the two side by side. Addresses are printed
//! raw; xtask symbolizes them with the ELF.

pub mod boot_probes;
mod ftrace;
mod kasan;
mod probes;
mod stacks;

use crate::bench::{Clock, Plan};

/// What the run was asked for, from the command line.
pub struct Options {
    /// QEMU runs with `-icount`: costs in instructions, else virtual ns (TCG emulation time).
    pub icount: bool,
    /// The boot tracer (`ftrace=`) owns the function tracer's ring: the ftrace part stands aside.
    pub boot_trace: Option<&'static str>,
}

/// Runs the demonstration's parts in order (the banner has been printed by `kernel_main`).
// Never inlined: kernel_main runs every mode from the boot stack (32 KiB), and the test suite
// with it; a mode inlined there puts its locals in kernel_main's frame for every other mode
// (one codegen unit inlined this one: 26 KiB, and deep test chains overflowed).
#[inline(never)]
pub fn run(options: &Options) {
    crate::arch::counters::start_cycle_counter();
    let plan = Plan {
        clock: if options.icount { Clock::Cycles } else { Clock::Nanoseconds },
        icount: options.icount,
        reps: 1,
        host_cpus: None,
    };
    if options.icount {
        defmt::info!("demo: costs in instructions (QEMU -icount: one per instruction, deterministic)");
    } else {
        defmt::info!("demo: costs in virtual ns: TCG emulation time on this host, not hardware time");
    }
    heading("stack trace: frame records and shadow call stack");
    stacks::show(&plan);
    heading("sanitizer: a use-after-free caught and recovered");
    kasan::show();
    heading("kprobes, a kretprobe and a uprobe");
    probes::show(&plan);
    heading("function tracer");
    ftrace::show(options.boot_trace);
    heading("stack depot");
    depot_statistics();
    defmt::info!("demo: done");
}

/// Not inlined: `cargo xtask test` probes it from the command line and counts the headings.
#[inline(never)]
pub fn heading(title: &str) {
    defmt::info!("demo: == {=str} ==", title);
}

/// One measured cost, in the fields of the bench row for the same case.
fn cost(suite: &str, case: &str, params: &str, metric: &str, plan: &Plan, value: f64) {
    defmt::info!(
        "demo cost: {=str} {=str} {=str} {=str} {=str} {=f64}",
        suite,
        case,
        params,
        metric,
        plan.unit(),
        value
    );
}

/// Not inlined: `cargo xtask test` probes it from the command line (`kprobe=`), once per run.
#[inline(never)]
fn depot_statistics() {
    let stats = crate::stacktrace::DEPOT.stats();
    let hit_rate = if stats.lookups == 0 { 0.0 } else { stats.hits as f64 * 100.0 / stats.lookups as f64 };
    defmt::info!(
        "demo: depot: {=usize} records in {=usize} bytes; {=u64} saves: {=u64} found ({=f64}%), {=u64} new; {=u64} hash collisions, {=u64} evictions",
        stats.records,
        stats.bytes,
        stats.lookups,
        stats.hits,
        hit_rate,
        stats.misses,
        stats.collisions,
        stats.evictions
    );
}
