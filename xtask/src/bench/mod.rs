//! `cargo xtask bench`: runs benchmark suites in QEMU per CPU variant and mode, and writes
//! results.json, report.md and one SVG chart per suite; compares two runs; keeps the icount
//! baseline that `cargo xtask test` gates on (the contract is docs/reference/bench.md).

mod calibrate;
mod chart;
mod compare;
mod complete;
pub mod events;
pub mod gate;
mod mca;
mod peer;
mod report;
mod report_out;
pub mod results;
mod shard;
mod summary;

pub use report::number;
pub use shard::merge;

use crate::Failure;
use crate::build::{self, Board, BuildVariant, KernelImage};
use crate::qemu::{self, CpuVariant, Machine};
use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use protocol::suite;
use results::{Provenance, Row, Sample};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// A suite the kernel can run (`protocol::suite`'s list), and what xtask adds to it: the build
/// variant it runs on unless `--variant` says, and its line of help.
#[derive(Clone, Copy)]
pub struct Suite {
    pub name: &'static str,
    pub default_variant: BuildVariant,
    /// One line for `bench --help`.
    pub about: &'static str,
}

impl Suite {
    const fn of(suite: suite::Suite) -> Self {
        use suite::Suite::*;
        let (default_variant, about) = match suite {
            Baseline => (
                BuildVariant::Prod,
                "the measuring loop alone, a plain call, a PAC-signed call, an SCS call, a BRK round trip",
            ),
            Stacktrace => (
                BuildVariant::Prod,
                "one stack trace by frame records or shadow call stack, with and without the depot, depth 4..64",
            ),
            Depot => {
                (BuildVariant::Prod, "stack depot insert and lookup per op, and its size and hit rate when saturated")
            }
            Probes => (
                BuildVariant::Prod,
                "k/u(ret)probe cost per hit for each method on nop, push and ret targets; unprobed calls",
            ),
            Ftrace => (
                BuildVariant::Prod,
                "a traced call's cost with list, call-ops and vector schemes, 0..100 relevant/irrelevant tracers, and the function-graph tracer",
            ),
            KasanBoot => (
                BuildVariant::Full,
                "an allocation-heavy workload on the sanitizer heap with each way of collecting stacks",
            ),
            Cpus => (
                BuildVariant::Prod,
                "depot hits, traced calls and kprobe hits on 1, 2.. CPUs at once (--smp N), with contention counters",
            ),
            CpusHeap => (
                BuildVariant::Full,
                "the sanitizer heap's alloc+free with stack collection on 1, 2.. CPUs at once (--smp N)",
            ),
            KasanReplay => (
                BuildVariant::Full,
                "Linux's recorded boot allocations replayed on the sanitizer heap with each way of collecting stacks",
            ),
        };
        Self { name: suite.name(), default_variant, about }
    }
}

/// Every suite in `protocol::suite`'s order.
pub const SUITES: [Suite; suite::Suite::ALL.len()] = {
    let mut suites = [Suite::of(suite::Suite::ALL[0]); suite::Suite::ALL.len()];
    let mut index = 1;
    while index < suites.len() {
        suites[index] = Suite::of(suite::Suite::ALL[index]);
        index += 1;
    }
    suites
};

/// The suites' names as clap's possible values, each with its line of help, so `bench --help`
/// lists them and a typo gets clap's "did you mean".
fn suite_parser() -> impl TypedValueParser<Value = &'static Suite> {
    PossibleValuesParser::new(SUITES.iter().map(|suite| PossibleValue::new(suite.name).help(suite.about)))
        .map(|name| SUITES.iter().find(|suite| suite.name == name).expect("clap checked the name"))
}

#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum ModeArg {
    Icount,
    Wall,
    Both,
}

/// How a figure was measured.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Mode {
    /// `-icount shift=0,sleep=off`: the PMU cycle counter counts retired instructions.
    Icount,
    /// No icount: virtual nanoseconds that track host time (the cost of emulation).
    Wall,
    /// A real board: PMU cycles.
    Hardware,
}

impl Mode {
    pub const ALL: [Mode; 3] = [Self::Icount, Self::Wall, Self::Hardware];

    pub fn name(self) -> &'static str {
        match self {
            Self::Icount => "icount",
            Self::Wall => "wall",
            Self::Hardware => "hardware",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|mode| mode.name() == name)
    }
}

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub command: Option<BenchCommand>,
    /// Suites to run (default: all).
    #[arg(value_parser = suite_parser())]
    pub suites: Vec<&'static Suite>,
    /// CPU variants (repeatable; default: all five).
    #[arg(long = "cpu", value_parser = CpuVariant::parse)]
    pub cpus: Vec<CpuVariant>,
    /// Build variant for every suite (default: each suite's own, `prod` for most).
    #[arg(long, value_enum)]
    pub variant: Option<BuildVariant>,
    /// Rows measured this way carry the param `granules=short` (docs/reference/bench.md).
    #[command(flatten)]
    pub sanitizer: build::SanitizerArgs,
    /// icount: instruction counts, deterministic; wall: virtual ns of TCG emulation, N reps.
    #[arg(long, value_enum, default_value = "both")]
    pub mode: ModeArg,
    /// Repetitions per case in wall mode (icount is deterministic: one rep).
    #[arg(long, default_value = "5", value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub reps: u32,
    /// CPUs the kernel runs on (1..=4; default 1: every row is a single-CPU measurement).
    #[arg(long, default_value = "1", value_parser = crate::qemu::parse_smp)]
    pub smp: u8,
    /// Output directory (default: target/bench, under CARGO_TARGET_DIR when set).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Also keep this run's results.json and report.md under NAME, for `bench compare`
    /// (in target/bench/saved/NAME).
    #[arg(long, value_name = "NAME")]
    pub save: Option<String>,
    /// Let --save replace a run saved under the same name.
    #[arg(long, requires = "save")]
    pub force: bool,
    /// Also write docs/results-style pages (one <suite>.md per suite) into DIR.
    #[arg(long, value_name = "DIR")]
    pub report: Option<PathBuf>,
    /// Run the gate's suites (icount, max,pauth=off, prod) and write the icount baseline that
    /// `cargo xtask test` checks against (xtask/baseline/icount.json). Commit it with the reason
    /// for every row that rose.
    #[arg(long, conflicts_with_all = ["suites", "cpus", "variant", "mode", "serial", "kasan_short_granules"])]
    pub update_baseline: bool,
    #[arg(long, value_enum, default_value = "virt")]
    pub board: Board,
    /// Serial device of a real board (mode `hardware`; the board runs what its SD card's
    /// cmdline.txt says, see `cargo xtask sdimage --run bench`).
    #[arg(long)]
    pub serial: Option<PathBuf>,
    #[command(flatten)]
    pub boot_files: crate::bootfiles::BootFileArgs,
    /// Seconds before one QEMU run counts as hung.
    #[arg(long, default_value = "900")]
    pub timeout: u64,
    /// Sends QEMU SIGTERM once N row lines arrived, as a user's `kill` would: the check in
    /// `cargo xtask test` that a killed run exits non-zero and writes nothing (board virt).
    #[arg(long, hide = true, value_name = "N")]
    pub terminate_qemu_after_rows: Option<u32>,
    /// Run part K of N of the (variant, CPU, mode) runs, round-robin in the order they run,
    /// and write shard.json beside results.json (default --out: target/shard/bench-K-of-N)
    /// for `cargo xtask merge`. Every row comes whole from one run, so merged rows are the
    /// unsharded run's.
    #[arg(long, value_name = "K/N", value_parser = crate::shard::Shard::parse,
          conflicts_with_all = ["update_baseline", "save", "report", "serial", "terminate_qemu_after_rows"])]
    pub shard: Option<crate::shard::Shard>,
    /// Also count, in each row's windows, exceptions, barriers, maintenance, memory traffic
    /// and branches (a QEMU plugin; icount mode on board virt): new metrics `METRIC.EVENT`.
    #[arg(long, conflicts_with = "update_baseline")]
    pub events: bool,
    /// Linux's rows beside the lab's in report.md (a peer column): `linux` measures Linux first
    /// (as `cargo xtask peer linux`), RUN reads another peer run's results.json or its directory.
    #[arg(long, value_name = "linux|RUN")]
    pub peer: Option<String>,
    /// With --events: also model the Cortex-A72's caches on every access (per-access callbacks,
    /// slower): metrics `METRIC.l1i_misses`, `.l1d_misses`, `.l2_misses`; `cold` empties the
    /// model at each kernel probe target's entry (`METRIC.l1d_misses_cold`, ...).
    #[arg(long, requires = "events", value_enum, num_args = 0..=1, default_missing_value = "warm")]
    pub cache: Option<CacheArg>,
}

/// `--cache warm|cold` (`--events`).
#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum CacheArg {
    Warm,
    Cold,
}

#[derive(clap::Subcommand)]
pub enum BenchCommand {
    /// Compare two runs (saved names or results.json paths): per suite, each row's old and new
    /// value, difference and ratio. Exit 2 when the runs are not comparable.
    Compare {
        /// The run before the change: a name given to --save, a results.json or its directory.
        old: String,
        /// The run after the change.
        new: String,
    },
    /// Fit the cycle model's parameters (within their ranges) to a board's PMU cycles and print
    /// them beside the one parameter set: EVENTS an icount `--events` run, BOARD a `--board rpi4`
    /// run (saved names or results.json paths). Changes no parameter.
    Calibrate {
        /// The icount run with `--events`.
        events: String,
        /// The board run (mode hardware).
        board: String,
    },
    /// The stack walkers' loop bodies (frame walk, shadow call stack copy) from the `prod`
    /// kernel: llvm-mca-19's cycles per iteration on its Cortex-A72 model beside the cycle
    /// model's (needs Debian's llvm-19).
    Mca,
    /// Write one page per suite (<suite>.md: provenance, tables, what each metric means) from
    /// one results.json.
    Report {
        /// A name given to --save, a results.json or its directory (default: target/bench).
        #[arg(long)]
        from: Option<String>,
        /// Directory to write the pages into. The workspace's tracked docs/results is replaced
        /// only when named here or with --force.
        out: Option<PathBuf>,
        /// Without a directory: replace the tracked docs/results.
        #[arg(long)]
        force: bool,
        /// Linux's rows beside the lab's (a peer column): `linux` for the last `cargo xtask peer
        /// linux` run, or a results.json or its directory.
        #[arg(long, value_name = "linux|RUN")]
        peer: Option<String>,
    },
}

pub fn run(args: &BenchArgs) -> Result<u8, Failure> {
    match &args.command {
        Some(BenchCommand::Compare { old, new }) => return compare::run(old, new),
        Some(BenchCommand::Calibrate { events, board }) => return calibrate::run(events, board),
        Some(BenchCommand::Mca) => return mca::run(),
        Some(BenchCommand::Report { from, out, force, peer }) => {
            let out = report_out::output_dir(out.as_deref(), *force)?;
            let from = from.clone().unwrap_or_else(|| target_dir().join("bench").display().to_string());
            let (_, results) = load(&from)?;
            return write_pages(&out, &results, peer_rows(peer.as_deref())?.as_deref());
        }
        None => {}
    }
    // `--peer linux` measures Linux first (`cargo xtask peer linux`), so that a failed peer run
    // costs no lab run; another peer run is read before anything builds.
    if args.peer.as_deref() == Some("linux") {
        let linux = crate::peer::PeerArgs {
            kernel: crate::peer::PeerKernel::Linux,
            fetch_only: false,
            alloc_trace: false,
            replace_trace: false,
            events: args.events,
        };
        crate::peer::run(&linux)?;
    }
    let peer = peer_rows(args.peer.as_deref())?;
    if args.serial.is_some() && args.board != Board::Rpi4 {
        return Err(Failure::usage("--serial reads a real board's results: it needs --board rpi4"));
    }
    if args.update_baseline && args.board != Board::Virt {
        return Err(Failure::usage("the icount baseline is measured on board virt"));
    }
    if args.terminate_qemu_after_rows.is_some() && args.board != Board::Virt {
        return Err(Failure::usage("--terminate-qemu-after-rows stops QEMU on board virt"));
    }
    if args.events && (args.board != Board::Virt || args.mode != ModeArg::Icount) {
        return Err(Failure::usage("--events counts in QEMU's icount mode: it needs --mode icount on board virt"));
    }
    let saved = match &args.save {
        Some(name) => Some(save_slot(&saved_root(), name, args.force)?),
        None => None,
    };
    let suites: Vec<&Suite> = if args.update_baseline {
        gate::SUITES.iter().map(|name| SUITES.iter().find(|suite| suite.name == *name).expect("known suite")).collect()
    } else if args.suites.is_empty() {
        SUITES.iter().collect()
    } else {
        args.suites.clone()
    };
    let mut cpus = match args.board {
        _ if args.update_baseline => vec![gate::CPU],
        Board::Virt if args.cpus.is_empty() => CpuVariant::ALL.to_vec(),
        Board::Virt => args.cpus.clone(),
        Board::Rpi4 if args.cpus.iter().all(|&cpu| cpu == CpuVariant::CortexA72) => vec![CpuVariant::CortexA72],
        Board::Rpi4 => return Err(Failure::usage("board rpi4 is a Cortex-A72: --cpu can only be cortex-a72")),
    };
    let modes = match (args.board, &args.serial, args.mode) {
        _ if args.update_baseline => vec![Mode::Icount],
        (_, Some(_), _) => vec![Mode::Hardware],
        (_, None, ModeArg::Icount) => vec![Mode::Icount],
        (_, None, ModeArg::Wall) => vec![Mode::Wall],
        (_, None, ModeArg::Both) => vec![Mode::Icount, Mode::Wall],
    };
    // One kernel build per build variant, running every suite that uses it.
    let mut by_variant: Vec<(BuildVariant, Vec<&str>)> = Vec::new();
    for suite in &suites {
        let variant = args.variant.unwrap_or(suite.default_variant);
        match by_variant.iter_mut().find(|(existing, _)| *existing == variant) {
            Some((_, names)) => names.push(suite.name),
            None => by_variant.push((variant, vec![suite.name])),
        }
    }
    if args.variant == Some(BuildVariant::Mte) {
        // `mte` needs MTE: refused where asked for explicitly, left out of the default CPUs.
        for &cpu in if args.cpus.is_empty() { &[][..] } else { &cpus[..] } {
            BuildVariant::Mte.check_machine(args.board, cpu.name())?;
        }
        BuildVariant::Mte.check_machine(args.board, "")?;
        cpus.retain(|&cpu| cpu != CpuVariant::CortexA72);
    }
    if args.serial.is_some() && by_variant.len() > 1 {
        return Err(Failure::usage("a board runs one kernel: give --variant when the suites' default variants differ"));
    }
    let dtb = match (args.board, &args.serial) {
        (Board::Rpi4, None) => {
            qemu::ensure_installed()?;
            Some(crate::bootfiles::get(&args.boot_files)?.dtb)
        }
        (Board::Virt, _) => {
            qemu::ensure_installed()?;
            None
        }
        (Board::Rpi4, Some(_)) => None,
    };
    if let Some(plan) = summary::plan(&by_variant, cpus.len(), &modes, args.reps) {
        eprintln!("xtask: {plan}");
    }
    let variants: Vec<BuildVariant> = by_variant.iter().map(|(variant, _)| *variant).collect();
    let sanitizer = args.sanitizer.options(&variants)?;
    let images = by_variant
        .iter()
        .map(|(variant, _)| build::kernel_with(args.board, *variant, sanitizer))
        .collect::<Result<Vec<_>, _>>()?;
    let cache = match args.cache {
        None => ::events::window::CacheMode::Off,
        Some(CacheArg::Warm) => ::events::window::CacheMode::Warm,
        Some(CacheArg::Cold) => ::events::window::CacheMode::Cold,
    };
    let plugin = if args.events { Some(events::Plugin { library: events::build_plugin()?, cache }) } else { None };

    // The tree as it is when the kernels were built: a commit made while QEMU runs is not theirs.
    // icount is deterministic and runs one rep whatever --reps says.
    let reps = if modes == [Mode::Icount] { 1 } else { args.reps };
    let mut provenance = provenance(args.board, reps);
    let runs = (by_variant.len() * cpus.len() * modes.len()) as u64;
    // Every (variant, CPU, mode) run in the order below is one unit of `--shard`'s partition.
    let owns = |ordinal: usize| args.shard.is_none_or(|shard| shard.owns(ordinal));
    let runs = (0..runs as usize).filter(|&ordinal| owns(ordinal)).count() as u64;
    let mut ordinal = 0;
    let mut plan = Vec::new();
    let progress = indicatif::ProgressBar::new(runs).with_style(
        indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} {elapsed} {msg}").expect("valid template"),
    );
    let mut samples = Vec::new();
    for ((variant, names), image) in by_variant.iter().zip(&images) {
        for &cpu in &cpus {
            for &mode in &modes {
                plan.push(shard::run_key(*variant, cpu, mode));
                ordinal += 1;
                if !owns(ordinal - 1) {
                    continue;
                }
                progress.set_message(format!("{} -cpu {} {}", names.join(","), cpu.name(), mode.name()));
                if let Some(path) = &args.serial {
                    progress.println(format!("reading {}: power on the Raspberry Pi 4", path.display()));
                }
                let plan = RunPlan {
                    board: args.board,
                    image,
                    variant: *variant,
                    suites: names,
                    cpu,
                    mode,
                    reps: args.reps,
                    timeout: Duration::from_secs(args.timeout),
                    dtb: dtb.clone(),
                    serial: args.serial.as_deref(),
                    smp: args.smp,
                    terminate_after_rows: args.terminate_qemu_after_rows,
                    events: plugin.as_ref(),
                };
                match measure(&plan) {
                    Ok(mut more) => {
                        // Another build of the same variant: its rows keep the suite's cases
                        // and are told apart by a param, so existing rows keep their identity.
                        if sanitizer.short_granules {
                            for sample in &mut more {
                                sample.params.push(("granules".into(), "short".into()));
                            }
                        }
                        samples.append(&mut more)
                    }
                    Err(failure) => {
                        progress.finish_and_clear();
                        return Err(failure);
                    }
                }
                progress.inc(1);
            }
        }
    }
    progress.finish_and_clear();
    let rows = results::as_written(&Row::aggregate(&samples));
    provenance.date = Some(utc_now());
    let out = args.out.clone().unwrap_or_else(|| match args.shard {
        Some(part) => part.directory(crate::shard::Kind::Bench),
        None => target_dir().join("bench"),
    });
    let json = results::to_json(&provenance, &rows);
    let report = events::render(&provenance, &rows, peer.as_deref());
    let charted = events::charted(&rows);
    let out_lock = lock_dir(&out)?;
    write_file(&out.join("results.json"), &json)?;
    write_file(&out.join("report.md"), &report)?;
    // A shard may hold no run of a suite: no chart for it.
    for suite in suites.iter().filter(|suite| rows.iter().any(|row| row.suite == suite.name)) {
        let path = out.join(report::chart_file(suite.name));
        draw_chart(&path, suite.name, &charted)?;
    }
    if let Some(part) = args.shard {
        shard::save(args, part, &suites, &out, &plan)?;
    }
    drop(out_lock);
    print!("{}", summary::summary(&rows, &out.join("report.md")));
    eprintln!("xtask: wrote {}/results.json, report.md and one SVG per suite", out.display());
    if let Some(slot) = saved {
        let _slot_lock = lock_dir(&slot)?;
        write_file(&slot.join("results.json"), &json)?;
        write_file(&slot.join("report.md"), &report)?;
        for suite in &suites {
            draw_chart(&slot.join(report::chart_file(suite.name)), suite.name, &charted)?;
        }
        eprintln!("xtask: saved as {} (compare with `cargo xtask bench compare`)", slot.display());
    }
    let results = results::Results { schema: results::SCHEMA, provenance, rows };
    if let Some(dir) = &args.report {
        write_pages(dir, &results, peer.as_deref())?;
    }
    if args.update_baseline {
        gate::update(&results, &json)?;
    }
    Ok(0)
}

/// What one kernel run measures: some suites of one build, on one CPU variant, in one mode.
pub struct RunPlan<'a> {
    pub board: Board,
    pub image: &'a KernelImage,
    pub variant: BuildVariant,
    pub suites: &'a [&'a str],
    pub cpu: CpuVariant,
    pub mode: Mode,
    pub reps: u32,
    pub timeout: Duration,
    pub dtb: Option<PathBuf>,
    /// A real board's serial line: the board runs what its SD card says.
    pub serial: Option<&'a Path>,
    /// CPUs (`Machine::smp`).
    pub smp: u8,
    /// SIGTERM to QEMU after this many row lines (`--terminate-qemu-after-rows`, virt only).
    pub terminate_after_rows: Option<u32>,
    /// The events plugin to load (`--events`, icount on virt).
    pub events: Option<&'a events::Plugin>,
}

/// Runs the kernel's bench mode once and returns its samples, or why the run failed.
pub fn measure(plan: &RunPlan) -> Result<Vec<Sample>, Failure> {
    let el = if plan.board == Board::Rpi4 { 2 } else { 1 };
    let machine = Machine {
        board: plan.board,
        cpu: plan.cpu,
        el,
        gic: 2,
        icount: plan.mode == Mode::Icount,
        dtb: plan.dtb.clone(),
        mte: plan.variant == BuildVariant::Mte,
        smp: plan.smp,
    };
    let reps = if plan.mode == Mode::Icount { 1 } else { plan.reps };
    let clock = if plan.mode == Mode::Wall { "ns" } else { "cycles" };
    let mut bootargs = format!(
        "run=bench bench={} reps={reps} clock={clock} icount={} exit=semihosting",
        plan.suites.join(","),
        u8::from(plan.mode == Mode::Icount)
    );
    if plan.mode == Mode::Wall {
        // The wall-mode `cpus` windows run at most one vCPU per host core.
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
        bootargs.push_str(&format!(" {}={cores}", protocol::cmdline::BENCH_HOST_CPUS));
    }
    let plugin = match plan.events {
        Some(plugin) => {
            bootargs.push_str(&format!(" {}=1", protocol::cmdline::BENCH_EVENTS));
            let file = format!("windows-{}-{}.txt", plan.variant.name(), plan.cpu.name().replace([',', '='], "_"));
            Some(events::PluginRun::new(plugin, &plan.image.elf, target_dir().join("events-plugin").join(file))?)
        }
        None => None,
    };
    let extra = plugin.as_ref().map_or(&[][..], |plugin| &plugin.qemu_args[..]);
    let (ending, log) = match (plan.board, plan.serial) {
        (Board::Virt, _) => {
            let mut rows = 0;
            let result =
                qemu::run_watched_with(&machine, plan.image, &bootargs, extra, Some(plan.timeout), &mut |line| {
                    rows += u32::from(protocol::bench::Row::fields(&line.text).is_some());
                    match plan.terminate_after_rows {
                        Some(after) if rows >= after => qemu::Watch::Terminate,
                        _ => qemu::Watch::Continue,
                    }
                })?;
            (result.ending, result.log)
        }
        // QEMU raspi4b, read through a pseudo-terminal as a real board's serial line.
        (Board::Rpi4, None) => {
            let result = qemu::run_via_pty(&machine, plan.image, &bootargs, plan.timeout)?;
            (result.ending, result.log)
        }
        // The board runs what its cmdline.txt says (`cargo xtask sdimage --run bench`).
        (Board::Rpi4, Some(path)) => {
            let port = crate::serial::open(path, 115_200)?;
            let result = crate::serial::read_run(port, &plan.image.elf, Some(plan.timeout), &mut |_| {})?;
            (result.ending, result.log)
        }
    };
    // A run counts only when it finished: the kernel's closing line with status 0, and every
    // suite's rows with their reps (complete.rs). Otherwise nothing of it is kept. A board
    // reading its SD card ran what the card says, which its plan line tells.
    let texts = || log.iter().map(|line| line.text.as_str());
    let (suites, reps) = match (plan.serial, complete::announced(texts())) {
        (Some(_), Some((reps, suites))) => (suites, reps),
        _ => (plan.suites.to_vec(), reps),
    };
    let incomplete = complete::missing(texts(), &suites, reps);
    let problem = match (&ending, incomplete) {
        (qemu::Ending::Exited(0), None) => None,
        (qemu::Ending::Exited(0), Some(incomplete)) => {
            Some(format!("the kernel exited with status 0, but {incomplete}"))
        }
        (ending, None) => Some(ending.to_string()),
        (ending, Some(incomplete)) => Some(format!("{ending}; {incomplete}")),
    };
    if let Some(problem) = problem {
        const SHOWN: usize = 40;
        if log.len() > SHOWN {
            eprintln!("  (the last {SHOWN} of the kernel's {} lines)", log.len());
        }
        for line in &log[log.len().saturating_sub(SHOWN)..] {
            eprintln!("  {line}");
        }
        return Err(Failure {
            status: if ending.timed_out() { 124 } else { 1 },
            message: format!(
                "bench run {} -cpu {} {} counts for nothing, nothing written: {problem}",
                plan.board.name(),
                plan.cpu.name(),
                plan.mode.name()
            ),
        });
    }
    let mut samples = Vec::new();
    for line in &log {
        if let Some(row) = protocol::bench::Row::from_line(&line.text) {
            let row =
                row.ok_or_else(|| Failure { status: 1, message: format!("malformed bench row: {}", line.text) })?;
            samples.push(Sample::from_row(&row, plan.cpu, plan.variant, plan.mode));
        }
    }
    if let Some(plugin) = &plugin {
        let windows = events::read_windows(&plugin.windows)?;
        let lines: Vec<&str> = log.iter().map(|line| line.text.as_str()).collect();
        let mut counted = events::samples(&lines, &windows, &samples)?;
        samples.append(&mut counted);
    }
    Ok(samples)
}

/// Cargo's target directory: CARGO_TARGET_DIR when set (as cargo reads it), else the
/// workspace's `target`.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .filter(|dir| !dir.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| build::workspace_root().join("target"))
}

/// Where `--save NAME` keeps a run.
fn saved_dir(name: &str) -> PathBuf {
    saved_root().join(name)
}

fn saved_root() -> PathBuf {
    target_dir().join("bench/saved")
}

/// Checks NAME (a directory under `root`) before any QEMU run, so a refused --save costs nothing.
fn save_slot(root: &Path, name: &str, force: bool) -> Result<PathBuf, Failure> {
    let valid = !name.is_empty()
        && !name.starts_with('.')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !valid {
        return Err(Failure::usage(format!(
            "--save {name:?}: a name is letters, digits, '-', '_' and '.' (not first)"
        )));
    }
    let slot = root.join(name);
    if slot.join("results.json").exists() && !force {
        return Err(Failure::usage(format!("--save {name}: {} exists; add --force to replace it", slot.display())));
    }
    Ok(slot)
}

/// Resolves a run given as a saved name, a results.json or a directory holding one, and reads
/// it. Returns the file read and its contents; unreadable or unknown files are exit 2.
pub fn load(run: &str) -> Result<(PathBuf, results::Results), Failure> {
    let as_name = !run.contains('/') && !run.ends_with(".json");
    let mut path = if as_name && saved_dir(run).is_dir() { saved_dir(run) } else { PathBuf::from(run) };
    if path.is_dir() {
        path = path.join("results.json");
    }
    let text = std::fs::read_to_string(&path).map_err(|error| {
        let hint = if as_name { format!(" (no run saved as '{run}' either)") } else { String::new() };
        Failure::usage(format!("{}: {error}{hint}", path.display()))
    })?;
    let results = results::parse(&text).map_err(|error| Failure::usage(format!("{}: {error}", path.display())))?;
    Ok((path, results))
}

/// Writes one output whole (temporary file and rename, see `crate::atomic`): a command reading
/// it while another bench writes never sees half a file.
fn write_file(path: &Path, text: &str) -> Result<(), Failure> {
    crate::atomic::write_creating_dirs(path, text.as_bytes())
        .map(|_| ())
        .map_err(|error| Failure::usage(format!("{}: {error}", path.display())))
}

/// Draws `suite`'s chart beside `path` and renames it over `path`, as every output
/// (`crate::atomic`).
fn draw_chart(path: &Path, suite: &str, rows: &[Row]) -> Result<(), Failure> {
    let drawn = crate::atomic::temporary_path(path);
    chart::draw(&drawn, suite, rows)
        .and_then(|()| Ok(std::fs::rename(&drawn, path)?))
        .map_err(|error| Failure::usage(format!("{}: {error}", path.display())))
}

/// Serialises the bench commands writing into `dir`, so its results.json and report.md come
/// from one run.
fn lock_dir(dir: &Path) -> Result<crate::atomic::Lock, Failure> {
    crate::atomic::lock_dir(dir, "bench results")
        .map_err(|error| Failure::usage(format!("lock for {}: {error}", dir.display())))
}

/// The rows of a Linux peer run (`--peer`): `linux` names the last `cargo xtask peer linux`.
fn peer_rows(peer: Option<&str>) -> Result<Option<Vec<Row>>, Failure> {
    let Some(peer) = peer else { return Ok(None) };
    let run = if peer == "linux" {
        crate::peer::fetch::peer_dir().join("linux").display().to_string()
    } else {
        peer.to_string()
    };
    let (path, results) = load(&run).map_err(|error| {
        Failure::usage(format!("--peer {peer}: {} (run `cargo xtask peer linux` first)", error.message))
    })?;
    if !results.rows.iter().any(|row| row.suite == protocol::suite::LINUX) {
        return Err(Failure::usage(format!("--peer {peer}: {} holds no `linux` rows", path.display())));
    }
    Ok(Some(results.rows))
}

/// docs/results-style pages: one <suite>.md per suite in `results`.
fn write_pages(dir: &Path, results: &results::Results, peer: Option<&[Row]>) -> Result<u8, Failure> {
    let pages = events::pages(&results.provenance, &results.rows, peer);
    let charted = events::charted(&results.rows);
    let _lock = lock_dir(dir)?;
    for (suite, text) in &pages {
        write_file(&dir.join(format!("{suite}.md")), text)?;
        draw_chart(&dir.join(report::chart_file(suite)), suite, &charted)?;
    }
    let names: Vec<_> = pages.iter().map(|(suite, _)| format!("{suite}.md and .svg")).collect();
    eprintln!("xtask: wrote {} in {}", names.join(", "), dir.display());
    Ok(0)
}

/// One line of a command's output, or None when the command is missing or fails.
fn command_line(program: &str, args: &[&str]) -> Option<String> {
    Command::new(program)
        .args(args)
        .current_dir(build::workspace_root())
        .output()
        .ok()
        .filter(|output| output.status.success())
        .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_string())
        .filter(|text| !text.is_empty())
}

/// What a results.json records about where its figures were made.
pub fn provenance(board: Board, reps: u32) -> Provenance {
    Provenance {
        commit: command_line("git", &["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".into()),
        describe: command_line("git", &["describe", "--always", "--dirty"]),
        // In the workspace root, rustup picks the kernel's toolchain from rust-toolchain.toml.
        rustc: command_line("rustc", &["-V"]),
        qemu: qemu::version(),
        host_cpu: host_cpu(),
        reps: Some(reps),
        date: Some(utc_now()),
        board: board.name().into(),
    }
}

/// The host CPU's model: x86 says `model name`; arm64 Linux has no model name, only the
/// implementer and part numbers.
fn host_cpu() -> Option<String> {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let field = |name: &str| {
        cpuinfo.lines().find_map(|line| {
            let (key, value) = line.split_once(':')?;
            (key.trim() == name).then(|| value.trim().to_string())
        })
    };
    let cores = cpuinfo.lines().filter(|line| line.starts_with("processor")).count();
    let model = field("model name").or_else(|| {
        Some(format!(
            "{} implementer {} part {}",
            std::env::consts::ARCH,
            field("CPU implementer")?,
            field("CPU part")?
        ))
    })?;
    Some(if cores > 0 { format!("{model} ({cores} CPUs)") } else { model })
}

/// Now, UTC, `YYYY-MM-DD HH:MM:SS`.
fn utc_now() -> String {
    let seconds = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |since| since.as_secs());
    utc_text(seconds)
}

/// Formats seconds since 1970 as a UTC date (the proleptic Gregorian calendar, as `date -u`).
fn utc_text(seconds: u64) -> String {
    let (days, time) = (seconds / 86_400, seconds % 86_400);
    // Howard Hinnant's days-to-civil, on eras of 400 years starting 0000-03-01.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z - era * 146_097;
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 { month_index + 3 } else { month_index - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}", time / 3600, time % 3600 / 60, time % 60)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    #[derive(Parser)]
    #[command(name = "cargo xtask bench")]
    struct Bench {
        #[command(flatten)]
        args: BenchArgs,
    }

    #[test]
    fn help_lists_every_suite_with_a_line() {
        let help = Bench::command().render_long_help().to_string();
        for suite in SUITES {
            let listed = help.lines().any(|line| {
                line.trim_start().starts_with(&format!("- {}:", suite.name)) && line.ends_with(suite.about)
            });
            assert!(listed, "{} missing from:\n{help}", suite.name);
        }
    }

    #[test]
    fn subcommands_and_suites_parse() {
        let compare = Bench::try_parse_from(["bench", "compare", "a", "b"]).expect("compare parses");
        assert!(matches!(compare.args.command, Some(BenchCommand::Compare { .. })));
        let suites = Bench::try_parse_from(["bench", "baseline", "depot", "--mode", "icount"]).expect("suites parse");
        assert_eq!(suites.args.suites.iter().map(|suite| suite.name).collect::<Vec<_>>(), ["baseline", "depot"]);
        assert!(Bench::try_parse_from(["bench", "baselin"]).is_err());
        assert!(Bench::try_parse_from(["bench", "--update-baseline", "probes"]).is_err());
        assert!(Bench::try_parse_from(["bench", "--force"]).is_err(), "--force needs --save");
    }

    #[test]
    fn save_refuses_bad_names_and_existing_runs_without_force() {
        let root = std::env::temp_dir().join(format!("tracelab-saved-{}", std::process::id()));
        for name in ["", ".hidden", "a/b", "a b"] {
            assert_eq!(save_slot(&root, name, false).unwrap_err().status, 2, "{name:?}");
        }
        assert_eq!(save_slot(&root, "a", false).expect("a free name"), root.join("a"));
        write_file(&root.join("a/results.json"), "{}").unwrap();
        let failure = save_slot(&root, "a", false).unwrap_err();
        assert!(failure.status == 2 && failure.message.contains("--force"), "{}", failure.message);
        assert_eq!(save_slot(&root, "a", true).expect("--force replaces"), root.join("a"));
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn utc_dates_match_date_u() {
        assert_eq!(utc_text(0), "1970-01-01 00:00:00");
        // `date -u -d @1795440000`
        assert_eq!(utc_text(1_795_440_000), "2026-11-23 13:20:00");
        assert_eq!(utc_text(951_782_400), "2000-02-29 00:00:00");
    }
}
