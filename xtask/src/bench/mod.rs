//! `cargo xtask bench`: runs benchmark suites in QEMU per CPU variant and mode, and writes
//! results.json, report.md and one SVG chart per suite (the contract is shared/BENCH.md).

mod chart;
mod report;
mod results;

use crate::Failure;
use crate::build::{self, Board, BuildVariant};
use crate::qemu::{self, CpuVariant, Machine};
use protocol::suite;
use results::{Row, Sample};
use std::path::PathBuf;
use std::time::Duration;

/// A suite the kernel can run, and the build variant it runs on unless `--variant` says.
pub struct Suite {
    pub name: &'static str,
    pub default_variant: BuildVariant,
}

pub const SUITES: &[Suite] = &[
    Suite { name: suite::BASELINE, default_variant: BuildVariant::Prod },
    Suite { name: suite::STACKTRACE, default_variant: BuildVariant::Prod },
    Suite { name: suite::DEPOT, default_variant: BuildVariant::Prod },
    Suite { name: suite::PROBES, default_variant: BuildVariant::Prod },
    Suite { name: suite::FTRACE, default_variant: BuildVariant::Prod },
    Suite { name: suite::KASAN_BOOT, default_variant: BuildVariant::Full },
];

fn parse_suite(name: &str) -> Result<&'static Suite, String> {
    SUITES.iter().find(|suite| suite.name == name).ok_or_else(|| {
        let names: Vec<_> = SUITES.iter().map(|suite| suite.name).collect();
        format!("unknown suite '{name}' (available: {})", names.join(", "))
    })
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
    pub fn name(self) -> &'static str {
        match self {
            Self::Icount => "icount",
            Self::Wall => "wall",
            Self::Hardware => "hardware",
        }
    }
}

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Suites to run (default: all): baseline, probes
    #[arg(value_parser = parse_suite)]
    pub suites: Vec<&'static Suite>,
    /// CPU variants (repeatable; default: all five).
    #[arg(long = "cpu", value_parser = CpuVariant::parse)]
    pub cpus: Vec<CpuVariant>,
    /// Build variant for every suite (default: each suite's own, `prod` for most).
    #[arg(long, value_enum)]
    pub variant: Option<BuildVariant>,
    #[arg(long, value_enum, default_value = "both")]
    pub mode: ModeArg,
    /// Repetitions per case in wall mode (icount is deterministic: one rep).
    #[arg(long, default_value = "5", value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub reps: u32,
    /// Output directory.
    #[arg(long, default_value = "target/bench")]
    pub out: PathBuf,
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
}

pub fn run(args: &BenchArgs) -> Result<u8, Failure> {
    if args.serial.is_some() && args.board != Board::Rpi4 {
        return Err(Failure::usage("--serial reads a real board's results: it needs --board rpi4"));
    }
    let suites: Vec<&Suite> = if args.suites.is_empty() { SUITES.iter().collect() } else { args.suites.clone() };
    let cpus = match args.board {
        Board::Virt if args.cpus.is_empty() => CpuVariant::ALL.to_vec(),
        Board::Virt => args.cpus.clone(),
        Board::Rpi4 if args.cpus.iter().all(|&cpu| cpu == CpuVariant::CortexA72) => vec![CpuVariant::CortexA72],
        Board::Rpi4 => return Err(Failure::usage("board rpi4 is a Cortex-A72: --cpu can only be cortex-a72")),
    };
    let modes = match (args.board, &args.serial, args.mode) {
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
    let images =
        by_variant.iter().map(|(variant, _)| build::kernel(args.board, *variant)).collect::<Result<Vec<_>, _>>()?;

    let runs = (by_variant.len() * cpus.len() * modes.len()) as u64;
    let progress = indicatif::ProgressBar::new(runs).with_style(
        indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} {elapsed} {msg}").expect("valid template"),
    );
    let timeout = Duration::from_secs(args.timeout);
    let mut samples = Vec::new();
    for ((variant, names), image) in by_variant.iter().zip(&images) {
        for &cpu in &cpus {
            for &mode in &modes {
                let el = if args.board == Board::Rpi4 { 2 } else { 1 };
                let machine =
                    Machine { board: args.board, cpu, el, gic: 2, icount: mode == Mode::Icount, dtb: dtb.clone() };
                progress.set_message(format!("{} -cpu {} {}", names.join(","), cpu.name(), mode.name()));
                let reps = if mode == Mode::Icount { 1 } else { args.reps };
                let clock = if mode == Mode::Wall { "ns" } else { "cycles" };
                let bootargs = format!(
                    "run=bench bench={} reps={reps} clock={clock} icount={} exit=semihosting",
                    names.join(","),
                    u8::from(mode == Mode::Icount)
                );
                let (status, log) = match (args.board, &args.serial) {
                    (Board::Virt, _) => {
                        let result = qemu::run(&machine, image, &bootargs, Some(timeout), false)?;
                        (result.status, result.log)
                    }
                    // QEMU raspi4b, read through a pseudo-terminal as a real board's serial line.
                    (Board::Rpi4, None) => {
                        let result = qemu::run_via_pty(&machine, image, &bootargs, timeout)?;
                        (result.status, result.log)
                    }
                    // The board runs what its cmdline.txt says (`cargo xtask sdimage --run bench`).
                    (Board::Rpi4, Some(path)) => {
                        progress.println(format!("reading {}: power on the Raspberry Pi 4", path.display()));
                        let port = crate::serial::open(path, 115_200)?;
                        let result = crate::serial::read_run(port, &image.elf, Some(timeout), false)?;
                        (result.status, result.log)
                    }
                };
                let failed = match status {
                    None => Some(format!("no exit sentinel within {} s", args.timeout)),
                    Some(0) => None,
                    Some(status) => Some(format!("kernel exited with status {status}")),
                };
                if let Some(problem) = failed {
                    progress.finish_and_clear();
                    for line in &log {
                        eprintln!("  {line}");
                    }
                    let status = if status.is_none() { 124 } else { 1 };
                    return Err(Failure {
                        status,
                        message: format!(
                            "bench run {} -cpu {} {}: {problem}",
                            args.board.name(),
                            cpu.name(),
                            mode.name()
                        ),
                    });
                }
                for line in &log {
                    if let Some(fields) = line.text.strip_prefix("bench row: ") {
                        let sample = Sample::parse(fields, cpu, *variant, mode).ok_or_else(|| Failure {
                            status: 1,
                            message: format!("malformed bench row: {}", line.text),
                        })?;
                        samples.push(sample);
                    }
                }
                progress.inc(1);
            }
        }
    }
    progress.finish_and_clear();
    let rows = Row::aggregate(&samples);
    std::fs::create_dir_all(&args.out).map_err(|error| Failure::usage(format!("{}: {error}", args.out.display())))?;
    let write = |name: &str, text: String| -> Result<PathBuf, Failure> {
        let path = args.out.join(name);
        std::fs::write(&path, text).map_err(|error| Failure::usage(format!("{}: {error}", path.display())))?;
        Ok(path)
    };
    let commit = git_commit();
    let qemu_version = qemu::version();
    write("results.json", results::to_json(&commit, &qemu_version, args.board.name(), &rows))?;
    let report = write("report.md", report::render(&commit, &qemu_version, args.board.name(), &rows))?;
    for suite in &suites {
        let path = args.out.join(format!("{}.svg", suite.name));
        chart::draw(&path, suite.name, &rows)
            .map_err(|error| Failure::usage(format!("{}: {error}", path.display())))?;
    }
    println!("{}", std::fs::read_to_string(&report).unwrap_or_default());
    eprintln!("xtask: wrote {}/results.json, report.md and one SVG per suite", args.out.display());
    Ok(0)
}

fn git_commit() -> String {
    std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(build::workspace_root())
        .output()
        .ok()
        .filter(|output| output.status.success())
        .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}
