//! Benchmarks: each suite measures its cases and emits one row per case, metric and rep.
//!
//! A row is one defmt record `bench row: SUITE CASE PARAMS METRIC UNIT VALUE` (PARAMS is `-` or
//! `key=value,...`; `protocol::bench` reads it back), decoded by `cargo xtask bench`, which
//! aggregates reps into results.json (the contract is docs/reference/bench.md). Every measured
//! window runs with interrupts masked, so neither the tick nor anything else lands in it.
//! Each suite's rows sit between `bench suite: SUITE` and `bench suite end: SUITE rows=N`: xtask
//! takes a suite only when its closing line came and N rows arrived.

mod baseline;
mod cpus;
mod depot;
mod ftrace;
mod kasan_boot;
pub(crate) mod kasan_replay;
pub(crate) mod probes;
pub(crate) mod stacktrace;

use crate::arch::counters;
use crate::args::Args;
use crate::sync::IrqMask;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use protocol::cmdline as key;
use protocol::suite::Suite;

/// What a measurement counts, chosen by xtask per mode.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Clock {
    /// PMCCNTR_EL0: instructions under `-icount shift=0`, cycles on hardware.
    Cycles,
    /// CNTVCT_EL0 converted to nanoseconds (virtual time under TCG: what emulation costs).
    Nanoseconds,
}

impl Clock {
    pub fn unit(self, icount: bool) -> &'static str {
        match (self, icount) {
            (Self::Cycles, true) => "insn",
            (Self::Cycles, false) => "cycles",
            (Self::Nanoseconds, _) => "ns",
        }
    }
}

/// How a suite should run, from the command line (`bench=SUITE,... reps=N clock=... icount=1`).
pub struct Plan {
    pub clock: Clock,
    pub icount: bool,
    pub reps: u32,
    /// `bench.host-cpus=N`: the cores of the host that runs the vCPUs (wall mode), which caps
    /// the CPUs a wall-mode window runs at once; `None`: not given, no cap beyond the board's.
    pub host_cpus: Option<usize>,
}

/// `run=bench`: the suites to run (`bench=SUITE,...`) and how.
pub struct Request {
    pub suites: &'static str,
    pub plan: Plan,
}

impl Request {
    /// `bench=SUITE,... reps=N clock=cycles|ns bench.host-cpus=N`; `icount` is whether QEMU counts instructions.
    pub fn from_args(args: &Args, icount: bool) -> Self {
        let mut request = Self { suites: "", plan: Plan { clock: Clock::Cycles, icount, reps: 1, host_cpus: None } };
        for (name, value) in args.pairs() {
            match (name, value) {
                (key::BENCH, suites) => request.suites = suites,
                (key::REPS, reps) => match reps.parse::<u32>() {
                    Ok(reps) if reps >= 1 => request.plan.reps = reps,
                    _ => defmt::warn!("cmdline: reps={=str} is not a positive number", reps),
                },
                (key::CLOCK, "cycles") => request.plan.clock = Clock::Cycles,
                (key::CLOCK, "ns") => request.plan.clock = Clock::Nanoseconds,
                (key::CLOCK, other) => Args::ignoring(key::CLOCK, other),
                (key::BENCH_EVENTS, "1") => EVENTS.store(true, Ordering::Relaxed),
                (key::BENCH_EVENTS, other) => Args::ignoring(key::BENCH_EVENTS, other),
                (key::BENCH_HOST_CPUS, cpus) => match cpus.parse::<usize>() {
                    Ok(cpus) if cpus >= 1 => request.plan.host_cpus = Some(cpus),
                    _ => defmt::warn!("cmdline: bench.host-cpus={=str} is not a positive number", cpus),
                },
                _ => {}
            }
        }
        request
    }
}

impl Plan {
    /// Runs `body` with interrupts masked and returns what it cost on this plan's clock.
    #[inline(always)]
    pub fn measure(&self, body: impl FnOnce()) -> u64 {
        let _mask = IrqMask::new();
        match self.clock {
            Clock::Cycles => {
                let start = counters::cycles();
                body();
                counters::cycles() - start
            }
            Clock::Nanoseconds => {
                let start = counters::virtual_count();
                body();
                let ticks = counters::virtual_count() - start;
                (ticks as u128 * 1_000_000_000 / crate::drivers::timer::frequency() as u128) as u64
            }
        }
    }

    pub fn unit(&self) -> &'static str {
        self.clock.unit(self.icount)
    }
}

/// A case name or params string for a row, formatted on the stack:
/// `Label::new(format_args!("kprobe-{target}"))`. Longer text is cut at 48 bytes.
pub struct Label {
    bytes: [u8; 48],
    length: usize,
}

impl Label {
    pub fn new(text: core::fmt::Arguments) -> Self {
        let mut label = Self { bytes: [0; 48], length: 0 };
        let _ = core::fmt::Write::write_fmt(&mut label, text);
        label
    }

    pub fn as_str(&self) -> &str {
        core::str::from_utf8(&self.bytes[..self.length]).unwrap_or("?")
    }
}

impl core::fmt::Write for Label {
    fn write_str(&mut self, text: &str) -> core::fmt::Result {
        let room = self.bytes.len() - self.length;
        let take = text.len().min(room);
        self.bytes[self.length..self.length + take].copy_from_slice(&text.as_bytes()[..take]);
        self.length += take;
        if take < text.len() { Err(core::fmt::Error) } else { Ok(()) }
    }
}

/// `bench.events=1`: say each row's windows after it (a property of the boot, like the command
/// line it comes from).
static EVENTS: AtomicBool = AtomicBool::new(false);

/// After a row whose figure is (`measured` - `reference`) / `per` (or `measured` / `per`), the
/// two windows' costs on the cycle counter: marks the place in the instruction stream (the
/// events plugin notes how many windows this CPU had closed when `hint #0x7f` ran) and says
/// the costs, so that xtask finds the windows among those and gives the plugin's counts the
/// row's arithmetic. Nothing without `bench.events=1`; never inside a window, so no figure
/// moves, and the measuring code is not touched.
#[inline(never)]
pub fn row_windows(
    suite: &str,
    case: &str,
    params: &str,
    metric: &str,
    measured: u64,
    reference: Option<u64>,
    per: u64,
) {
    if !EVENTS.load(Ordering::Relaxed) {
        return;
    }
    // SAFETY: a hint the architecture leaves unallocated executes as a NOP (ARM ARM C6.2.126
    // HINT); the plugin recognises it. No register or memory is touched.
    unsafe { core::arch::asm!("hint #0x7f", options(nomem, nostack, preserves_flags)) };
    match reference {
        Some(reference) => defmt::info!(
            "bench events: {=str} {=str} {=str} {=str} measured={=u64} reference={=u64} per={=u64}",
            suite,
            case,
            params,
            metric,
            measured,
            reference,
            per
        ),
        None => defmt::info!(
            "bench events: {=str} {=str} {=str} {=str} measured={=u64} reference=- per={=u64}",
            suite,
            case,
            params,
            metric,
            measured,
            per
        ),
    }
}

const _: () =
    assert!(protocol::same_str(protocol::bench::EVENTS_PREFIX, "bench events: "), "the events line's literals");

/// Emits one result row. defmt wants a literal format string: its prefix is
/// `protocol::bench::ROW_PREFIX`, which xtask's one reader parses (checked below).
#[inline(never)]
pub fn row(suite: &str, case: &str, params: &str, metric: &str, unit: &str, value: f64) {
    defmt::info!("bench row: {=str} {=str} {=str} {=str} {=str} {=f64}", suite, case, params, metric, unit, value);
    ROWS_WRITTEN.fetch_add(1, Ordering::Relaxed);
}

/// Rows written since boot, for each suite's closing line (a suite's rows may come from any CPU).
static ROWS_WRITTEN: AtomicU64 = AtomicU64::new(0);

const _: () = assert!(protocol::same_str(protocol::bench::ROW_PREFIX, "bench row: "), "the row's literal above");
const _: () = assert!(protocol::same_str(protocol::bench::PLAN_PREFIX, "bench plan: "), "the plan's literal below");
const _: () = assert!(protocol::same_str(protocol::bench::SUITE_PREFIX, "bench suite: "), "the suite's literal below");
const _: () =
    assert!(protocol::same_str(protocol::bench::SUITE_END_PREFIX, "bench suite end: "), "the end's literal below");

/// The function that runs each suite of `protocol::suite`'s list: an exhaustive match, so a
/// suite added to the list does not build until it has its function here.
fn runner(suite: Suite) -> fn(&Plan) {
    match suite {
        Suite::Baseline => baseline::run,
        Suite::Stacktrace => stacktrace::run,
        Suite::Depot => depot::run,
        Suite::Probes => probes::run,
        Suite::Ftrace => ftrace::run,
        Suite::KasanBoot => kasan_boot::run,
        Suite::Cpus => cpus::run,
        Suite::CpusHeap => cpus::run_heap,
        Suite::KasanReplay => kasan_replay::run,
    }
}

/// Runs the named suites (comma-separated; empty = all), in the list's order.
pub fn run(names: &str, plan: &Plan) -> Result<(), &'static str> {
    counters::start_cycle_counter();
    for name in names.split(',').filter(|name| !name.is_empty()) {
        if Suite::from_name(name).is_none() {
            defmt::error!("bench: unknown suite {=str}", name);
            return Err("unknown suite");
        }
    }
    // What a finished run must hold (xtask reads it where the board ran its own command line).
    defmt::info!("bench plan: reps={=u32} suites={=str}", plan.reps, if names.is_empty() { "all" } else { names });
    for suite in Suite::ALL {
        if names.is_empty() || names.split(',').any(|name| name == suite.name()) {
            defmt::info!("bench suite: {=str}", suite.name());
            let before = ROWS_WRITTEN.load(Ordering::Relaxed);
            // Called through an opaque pointer: each suite is compiled as a function of its own,
            // so what the dispatcher prints cannot change how a suite's measured loops are built.
            core::hint::black_box(runner(suite))(plan);
            let rows = ROWS_WRITTEN.load(Ordering::Relaxed) - before;
            defmt::info!("bench suite end: {=str} rows={=u64}", suite.name(), rows);
        }
    }
    defmt::info!("bench done");
    Ok(())
}
