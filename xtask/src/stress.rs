//! `cargo xtask stress probes`: the probe sweep (kernel `run=sweep`) over the whole kernel, and
//! the deterministic sample `cargo xtask test` runs.
//!
//! The kernel prints its coverage (`sweep coverage:`, `sweep probed:`, `sweep refused:`,
//! `sweep missed:`) and one `sweep FAILED:` line per failing probe (function+offset, word,
//! method); xtask adds the disassembled instruction (`llvm-objdump` of rustup's `llvm-tools`, if
//! installed) and the command that repeats exactly that probe. A run that dies names the batch it died in.

use crate::Failure;
use crate::build::{self, Board, BuildVariant};
use crate::qemu::{self, CpuVariant, Machine};
use std::process::Command;
use std::time::Duration;

#[derive(clap::Args)]
pub struct StressArgs {
    #[command(subcommand)]
    pub target: Target,
}

#[derive(clap::Subcommand)]
pub enum Target {
    /// Every accepted instruction of every probe-able kernel function, with every method.
    Probes(ProbesArgs),
}

#[derive(clap::Args)]
pub struct ProbesArgs {
    /// Build variants (repeatable; default: full and prod).
    #[arg(long = "variant", value_enum)]
    pub variants: Vec<BuildVariant>,
    #[arg(long, value_parser = CpuVariant::parse, default_value = "max,pauth=off")]
    pub cpu: CpuVariant,
    /// Repeat exactly one probe: `FUNCTION+OFFSET:METHOD` (as a failure prints it).
    #[arg(long)]
    pub probe: Option<String>,
    /// Sweep a seeded sample of this many functions (0: all).
    #[arg(long, default_value = "0")]
    pub functions: usize,
    #[arg(long, default_value = "1")]
    pub seed: u64,
    /// Also sweep with a counting tracer on every traceable function, in each scheme.
    #[arg(long)]
    pub ftrace: bool,
    /// Seconds before a QEMU run counts as hung.
    #[arg(long, default_value = "3000")]
    pub timeout: u64,
}

pub fn run(args: &StressArgs) -> Result<u8, Failure> {
    let Target::Probes(args) = &args.target;
    let variants =
        if args.variants.is_empty() { vec![BuildVariant::Full, BuildVariant::Prod] } else { args.variants.clone() };
    let mut failed = 0;
    for variant in variants {
        let image = build::kernel(Board::Virt, variant)?;
        let mut extras = vec![String::new()];
        if args.ftrace && variant != BuildVariant::Plain {
            extras.extend(["list", "call-ops", "vector"].map(|scheme| format!("sweep.ftrace={scheme}")));
        }
        for extra in extras {
            let mut words = format!("sweep.seed={} sweep.functions={} {extra}", args.seed, args.functions);
            if let Some(probe) = &args.probe {
                words = format!("sweep.probe={probe}");
            }
            let outcome = sweep(&image, variant, args.cpu, &words, Duration::from_secs(args.timeout), Print::Always)?;
            failed += u8::from(!outcome.passed);
        }
    }
    Ok(if failed == 0 { 0 } else { 1 })
}

pub struct Outcome {
    pub passed: bool,
    /// The coverage lines, joined (for the test tally's line).
    pub summary: String,
    /// The kernel's `sweep FAILED:` and `sweep:` lines.
    pub failures: Vec<String>,
}

/// When `sweep` prints its report.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Print {
    Always,
    OnFailure,
    /// A run that is meant to fail (the sweep's own checks shown to fire).
    Never,
}

/// One sweep run on virt; prints the coverage, failures (disassembled) and how to repeat them.
pub fn sweep(
    image: &build::KernelImage,
    variant: BuildVariant,
    cpu: CpuVariant,
    words: &str,
    timeout: Duration,
    print: Print,
) -> Result<Outcome, Failure> {
    let machine = Machine {
        board: Board::Virt,
        cpu,
        el: 1,
        gic: 3,
        icount: false,
        dtb: None,
        mte: variant == BuildVariant::Mte,
        smp: 1,
    };
    // A slow tick: the workload must run the same code on every pass (see kernel/src/sweep).
    let bootargs = format!("run=sweep hz=10 exit=semihosting {words}");
    let result = qemu::run(&machine, image, &bootargs, Some(timeout), false)?;
    let mut last_batch = None;
    let mut coverage = Vec::new();
    let mut failures = Vec::new();
    for line in &result.log {
        let text = line.text.as_str();
        if let Some(batch) = text.strip_prefix("sweep batch: ") {
            last_batch = Some(batch.to_string());
        } else if text.starts_with("sweep coverage:")
            || text.starts_with("sweep probed:")
            || text.starts_with("sweep refused:")
            || text.starts_with("sweep missed:")
            || text.starts_with("sweep done:")
            || text.starts_with("sweep: probe hit")
        {
            coverage.push(text.to_string());
        } else if text.starts_with("sweep FAILED:") || text.starts_with("sweep:") {
            failures.push(text.to_string());
        }
    }
    let label = format!("{} variant {} {words}", machine.describe(), variant.name());
    // QEMU exits 0 on SIGTERM too: the kernel's own verdict line must be there.
    let passed = result.status == Some(0) && coverage.iter().any(|line| line == "sweep done: 0 failures");
    if print == Print::Always || (print == Print::OnFailure && !passed) {
        println!(
            "stress probes [{label}]: {} ({:.1} s)",
            if passed { "ok" } else { "FAILED" },
            result.elapsed.as_secs_f64()
        );
        for line in &coverage {
            println!("  {line}");
        }
    }
    if !passed && print != Print::Never {
        for line in &failures {
            println!("  {line}");
            if let Some(repeat) = repeatable(line) {
                if let Some(address) = address_of(line) {
                    println!("    {}", disassemble(&image.elf, address));
                }
                println!(
                    "    repeat: cargo xtask stress probes --variant {} --cpu {} --probe '{repeat}'",
                    variant.name(),
                    cpu.name()
                );
            }
        }
        match result.status {
            None => println!("  killed after {} s during batch {last_batch:?}", timeout.as_secs()),
            Some(status) if failures.is_empty() => {
                println!("  exited with status {status} during batch {last_batch:?}; kernel log:");
                for line in result.log.iter().rev().take(60).collect::<Vec<_>>().into_iter().rev() {
                    println!("    {line}");
                }
            }
            Some(_) => {}
        }
    }
    Ok(Outcome { passed, summary: coverage.join("; "), failures })
}

/// `FUNCTION+0xOFF:METHOD` from a `sweep FAILED: ... at FUNCTION+0xOFF (...) insn ... method M`.
fn repeatable(line: &str) -> Option<String> {
    let (_, rest) = line.split_once(" at ")?;
    // Names hold spaces (`<StackDepot<4096, 16>>::find`): the place ends at the address.
    // The kernel splits its command line at spaces and matches names ignoring them.
    let (place, _) = rest.split_once(" (0x")?;
    let method = rest.rsplit_once(" method ")?.1.trim();
    Some(format!("{}:{method}", place.replace(' ', "")))
}

fn address_of(line: &str) -> Option<u64> {
    let (_, rest) = line.split_once(" (0x")?;
    u64::from_str_radix(rest.split(')').next()?, 16).ok()
}

/// The instruction at `address`, by `llvm-objdump` (rustup's `llvm-tools`), if there is one.
fn disassemble(elf: &std::path::Path, address: u64) -> String {
    let sysroot = Command::new("rustc").args(["--print", "sysroot"]).current_dir(build::workspace_root()).output();
    let Ok(sysroot) = sysroot else { return "(no rustc to find llvm-objdump)".into() };
    let sysroot = String::from_utf8_lossy(&sysroot.stdout).trim().to_string();
    let tool = std::fs::read_dir(format!("{sysroot}/lib/rustlib"))
        .ok()
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path().join("bin/llvm-objdump"))
        .find(|path| path.exists());
    let Some(tool) = tool else { return "(llvm-objdump not found: rustup component add llvm-tools)".into() };
    let output = Command::new(tool)
        .args(["-d", "--no-show-raw-insn"])
        .arg(format!("--start-address={address:#x}"))
        .arg(format!("--stop-address={:#x}", address + 4))
        .arg(elf)
        .output();
    match output {
        Ok(output) => String::from_utf8_lossy(&output.stdout)
            .lines()
            .rev()
            .find(|line| line.trim_start().starts_with(&format!("{address:x}:")))
            .map_or_else(|| "(not disassembled)".into(), |line| line.trim().to_string()),
        Err(error) => format!("(llvm-objdump: {error})"),
    }
}

/// The CI sample `cargo xtask test` runs: a fixed seed's 32 functions, every method, with a
/// counting tracer on every traceable function (the vector scheme) at the same time. Prints one
/// line; true if it passed.
pub fn sample(image: &build::KernelImage, variant: BuildVariant, cpu: CpuVariant) -> Result<bool, Failure> {
    let words = "sweep.seed=19 sweep.functions=32 sweep.singles=16 sweep.ftrace=vector";
    let outcome = sweep(image, variant, cpu, words, Duration::from_secs(120), Print::OnFailure)?;
    if outcome.passed {
        println!("probe sweep sample [variant {}]: ok: {}", variant.name(), outcome.summary);
    }
    // The sweep's own check, shown to fail: workload passes on the caller's stack save new
    // traces from each call site, which the new-stack check must report.
    let injected = "sweep.seed=19 sweep.functions=4 sweep.singles=0 sweep.inject=callers-stack";
    let caught = sweep(image, variant, cpu, injected, Duration::from_secs(120), Print::Never)?;
    let detected = !caught.passed && caught.failures.iter().any(|line| line.contains("new stack traces"));
    println!(
        "probe sweep check [variant {}, passes on the caller's stack]: {}",
        variant.name(),
        if detected { "ok: caught as new stack traces" } else { "FAILED: the new-stack check did not fire" }
    );
    Ok(outcome.passed && detected)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_line_gives_the_probe_to_repeat() {
        let line = "sweep FAILED: hit count differs in a random set at <stackdepot::depot::StackDepot<4096, 16>>::find+0xc8 \
                    (0xffffff80400f0a50) insn 0xf2fffff9 method single-step";
        assert_eq!(
            repeatable(line).as_deref(),
            Some("<stackdepot::depot::StackDepot<4096,16>>::find+0xc8:single-step")
        );
        assert_eq!(address_of(line), Some(0xffff_ff80_400f_0a50));
        assert_eq!(repeatable("sweep: the unprobed workload could not run"), None);
    }
}
