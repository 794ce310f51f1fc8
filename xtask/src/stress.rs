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
    /// Seconds before one run of a hanging batch's halves counts as hung.
    #[arg(long, default_value = "60")]
    pub hang_timeout: u64,
    /// CPUs (virt `-smp N`): the other CPUs loop on the workload while CPU 0 sweeps.
    #[arg(long, default_value = "1", value_parser = crate::qemu::parse_smp)]
    pub smp: u8,
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
            let run = Run { image: &image, variant, cpu: args.cpu, smp: args.smp };
            let outcome = sweep(&run, &words, Duration::from_secs(args.timeout), Print::Always)?;
            failed += u8::from(!outcome.passed);
            if let Some(batch) = outcome.hung {
                name_hanging_probe(&run, &batch, &words, Duration::from_secs(args.hang_timeout))?;
            }
        }
    }
    Ok(if failed == 0 { 0 } else { 1 })
}

/// What a sweep run runs on.
#[derive(Clone, Copy)]
pub struct Run<'a> {
    pub image: &'a build::KernelImage,
    pub variant: BuildVariant,
    pub cpu: CpuVariant,
    pub smp: u8,
}

/// One batch as the kernel names it (`sweep batch: NAME+0xOFF:METHOD words N`): `words` words
/// of `function` from `offset`, all with `method`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    /// Without spaces (the kernel's command line is split at spaces; it matches names ignoring them).
    pub function: String,
    pub offset: u64,
    pub method: String,
    pub words: u64,
}

impl Batch {
    fn parse(text: &str) -> Option<Batch> {
        let (probe, words) = text.rsplit_once(" words ")?;
        let (place, method) = probe.rsplit_once(':')?;
        let (function, offset) = place.rsplit_once('+')?;
        let offset = u64::from_str_radix(offset.strip_prefix("0x")?, 16).ok()?;
        Some(Batch {
            function: function.replace(' ', ""),
            offset,
            method: method.to_string(),
            words: words.trim().parse().ok()?,
        })
    }

    /// `FUNCTION+0xOFF:METHOD`, the kernel's `sweep.probe=` and xtask's `--probe`.
    fn probe(&self) -> String {
        format!("{}+{:#x}:{}", self.function, self.offset, self.method)
    }

    /// The kernel words that run exactly this batch.
    fn words(&self) -> String {
        format!("sweep.probe={} sweep.words={}", self.probe(), self.words)
    }

    fn halves(&self) -> (Batch, Batch) {
        let first = self.words / 2;
        let left = Batch { words: first, ..self.clone() };
        let right = Batch { offset: self.offset + 4 * first, words: self.words - first, ..self.clone() };
        (left, right)
    }
}

/// Halves `batch` while one half hangs (`hangs` runs it) until one probe remains: Ok(that
/// probe), or Err(the smallest batch that hangs while neither of its halves does alone).
pub fn bisect(
    batch: &Batch,
    mut hangs: impl FnMut(&Batch) -> Result<bool, Failure>,
) -> Result<Result<Batch, Batch>, Failure> {
    let mut hanging = batch.clone();
    while hanging.words > 1 {
        let (left, right) = hanging.halves();
        if hangs(&left)? {
            hanging = left;
        } else if hangs(&right)? {
            hanging = right;
        } else {
            return Ok(Err(hanging));
        }
    }
    Ok(Ok(hanging))
}

/// The words of a sweep run that a repeat of one of its batches keeps (the injected bug, the tracer).
fn carried_words(words: &str) -> String {
    words
        .split_whitespace()
        .filter(|word| ["sweep.inject=", "sweep.ftrace=", "sweep.watchdog="].iter().any(|key| word.starts_with(key)))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A run hung in `batch`: halves it until one probe remains and prints that probe (disassembled,
/// its method and the command that repeats it). Returns the probe, if the halving found one.
pub fn name_hanging_probe(run: &Run, batch: &Batch, words: &str, timeout: Duration) -> Result<Option<Batch>, Failure> {
    let carried = carried_words(words);
    println!("  halving the hanging batch {} ({} words)", batch.probe(), batch.words);
    let mut address = None;
    let found = bisect(batch, |half| {
        let outcome = sweep(run, &format!("{} {carried}", half.words()), timeout, Print::Never)?;
        println!(
            "    {} words {}: {}",
            half.probe(),
            half.words,
            if outcome.hung.is_some() { "hangs" } else { "runs" }
        );
        if outcome.hung.is_some() {
            address = outcome.address;
        }
        Ok(outcome.hung.is_some())
    })?;
    match found {
        Ok(probe) => {
            println!("  the hanging probe: {} (method {})", probe.probe(), probe.method);
            if let Some(address) = address {
                println!("    {}", disassemble(&run.image.elf, address));
            }
            println!(
                "    repeat: cargo xtask stress probes --variant {} --cpu {} --smp {} --probe '{}'",
                run.variant.name(),
                run.cpu.name(),
                run.smp,
                probe.probe()
            );
            Ok(Some(probe))
        }
        Err(whole) => {
            // Neither half hangs: the whole again tells a hang of two probes together from one
            // that does not repeat (a slow run, a race).
            let again = sweep(run, &format!("{} {carried}", whole.words()), timeout, Print::Never)?;
            if again.hung.is_some() {
                println!("  {} words {} hang together, neither half alone", whole.probe(), whole.words);
            } else {
                println!("  {} words {} did not hang again: not repeatable", whole.probe(), whole.words);
            }
            Ok(None)
        }
    }
}

pub struct Outcome {
    pub passed: bool,
    /// The batch the run hung in (a QEMU timeout, or a `sweep hung:` line).
    pub hung: Option<Batch>,
    /// The first probe's address of a `sweep.probe=` run (`sweep probe address:`).
    pub address: Option<u64>,
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
pub fn sweep(run: &Run, words: &str, timeout: Duration, print: Print) -> Result<Outcome, Failure> {
    let Run { image, variant, cpu, smp } = *run;
    let machine = Machine {
        board: Board::Virt,
        cpu,
        el: 1,
        gic: 3,
        icount: false,
        dtb: None,
        mte: variant == BuildVariant::Mte,
        smp,
    };
    // A slow tick: the workload must run the same code on every pass (see kernel/src/sweep).
    let bootargs = format!("run=sweep hz=10 exit=semihosting {words}");
    let result = qemu::run(&machine, image, &bootargs, Some(timeout), false)?;
    let mut last_batch = None;
    let mut coverage = Vec::new();
    let mut failures = Vec::new();
    let mut hung_in_kernel = false;
    let mut address = None;
    for line in &result.log {
        let text = line.text.as_str();
        if let Some(batch) = text.strip_prefix("sweep batch: ") {
            last_batch = Some(batch.to_string());
        } else if let Some(at) = text.strip_prefix("sweep probe address: 0x") {
            address = u64::from_str_radix(at.trim(), 16).ok();
        } else if text.starts_with("sweep coverage:")
            || text.starts_with("sweep probed:")
            || text.starts_with("sweep refused:")
            || text.starts_with("sweep missed:")
            || text.starts_with("sweep done:")
            || text.starts_with("sweep cpus:")
            || text.starts_with("sweep: probe hit")
        {
            coverage.push(text.to_string());
        } else if text.starts_with("sweep FAILED:") || text.starts_with("sweep:") || text.starts_with("sweep hung:") {
            hung_in_kernel |= text.starts_with("sweep hung:");
            failures.push(text.to_string());
        }
    }
    // Killed at the timeout, or another CPU saw the run stop making progress.
    let hung =
        if result.status.is_none() || hung_in_kernel { last_batch.as_deref().and_then(Batch::parse) } else { None };
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
                    "    repeat: cargo xtask stress probes --variant {} --cpu {} --smp {smp} --probe '{repeat}'",
                    variant.name(),
                    cpu.name()
                );
            }
        }
        match result.status {
            None => println!("  killed after {} s during batch {last_batch:?}", timeout.as_secs()),
            Some(status) if failures.is_empty() || !coverage.iter().any(|line| line.starts_with("sweep done:")) => {
                println!("  exited with status {status} during batch {last_batch:?}; kernel log:");
                for line in result.log.iter().rev().take(60).collect::<Vec<_>>().into_iter().rev() {
                    println!("    {line}");
                }
            }
            Some(_) => {}
        }
    }
    Ok(Outcome { passed, hung, address, summary: coverage.join("; "), failures })
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
/// counting tracer on every traceable function (the vector scheme) at the same time; a smaller
/// one on 4 CPUs (the other three looping on the workload); the new-stack check and the hang
/// bisection shown to work. Prints one line each; true if all passed.
pub fn sample(image: &build::KernelImage, variant: BuildVariant, cpu: CpuVariant) -> Result<bool, Failure> {
    let run = Run { image, variant, cpu, smp: 1 };
    let words = "sweep.seed=19 sweep.functions=32 sweep.singles=16 sweep.ftrace=vector";
    let outcome = sweep(&run, words, Duration::from_secs(120), Print::OnFailure)?;
    if outcome.passed {
        println!("probe sweep sample [variant {}]: ok: {}", variant.name(), outcome.summary);
    }
    let everywhere = Run { smp: 4, ..run };
    let words = "sweep.seed=19 sweep.functions=8 sweep.singles=8";
    let on_four = sweep(&everywhere, words, Duration::from_secs(120), Print::OnFailure)?;
    if on_four.passed {
        println!("probe sweep sample [variant {}, smp 4]: ok: {}", variant.name(), on_four.summary);
    }
    // The sweep's own check, shown to fail: workload passes on the caller's stack save new
    // traces from each call site, which the new-stack check must report.
    let injected = "sweep.seed=19 sweep.functions=4 sweep.singles=0 sweep.inject=callers-stack";
    let caught = sweep(&run, injected, Duration::from_secs(120), Print::Never)?;
    let detected = !caught.passed && caught.failures.iter().any(|line| line.contains("new stack traces"));
    println!(
        "probe sweep check [variant {}, passes on the caller's stack]: {}",
        variant.name(),
        if detected { "ok: caught as new stack traces" } else { "FAILED: the new-stack check did not fire" }
    );
    let named = hang_is_named(&run)?;
    Ok(outcome.passed && on_four.passed && detected && named)
}

/// The probe `hang_is_named` makes hang: a word of the workload's heap part that every pass runs.
const HANGING_FUNCTION: &str = "kernel::sweep::workload::heap";
const HANGING_OFFSET: u64 = 0x1c;

/// A batch of 16 words with one probe whose handler spins (`sweep.inject=hang@...`, on CPU 0):
/// the run must hang, and halving it must name exactly that probe. On 2 CPUs: CPU 1's watchdog
/// ends a hung run after 1 s (`sweep.watchdog=1000`), where one CPU would wait for QEMU's timeout.
fn hang_is_named(run: &Run) -> Result<bool, Failure> {
    let run = &Run { smp: 2, ..*run };
    let batch = Batch { function: HANGING_FUNCTION.into(), offset: 0x10, method: "brk-step".into(), words: 16 };
    let inject = format!("sweep.inject=hang@{HANGING_FUNCTION}+{HANGING_OFFSET:#x} sweep.watchdog=1000");
    let timeout = Duration::from_secs(HANG_TEST_TIMEOUT_S);
    let whole = sweep(run, &format!("{} {inject}", batch.words()), timeout, Print::Never)?;
    let named = match &whole.hung {
        Some(hung) if *hung == batch => name_hanging_probe(run, &batch, &inject, timeout)?,
        _ => None,
    };
    let expected = Batch { offset: HANGING_OFFSET, words: 1, ..batch };
    let passed = named.as_ref() == Some(&expected);
    println!(
        "probe sweep check [variant {}, a probe that hangs]: {}",
        run.variant.name(),
        if passed {
            format!("ok: halving named {}", expected.probe())
        } else {
            format!(
                "FAILED: expected {}, halving gave {named:?} (the whole batch hung: {:?})",
                expected.probe(),
                whole.hung
            )
        }
    );
    Ok(passed)
}

/// Seconds a run of the hang check may take before QEMU is killed (a run that does not hang
/// boots and runs one batch in about a second; one that hangs ends at the watchdog).
const HANG_TEST_TIMEOUT_S: u64 = 20;

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

    #[test]
    fn a_batch_line_gives_the_batch_to_repeat() {
        let batch = Batch::parse("<stackdepot::depot::StackDepot<4096, 16>>::find+0xc0:brk-step words 48").unwrap();
        assert_eq!(batch.function, "<stackdepot::depot::StackDepot<4096,16>>::find");
        assert_eq!((batch.offset, batch.words), (0xc0, 48));
        assert_eq!(
            batch.words(),
            "sweep.probe=<stackdepot::depot::StackDepot<4096,16>>::find+0xc0:brk-step sweep.words=48"
        );
        assert_eq!(Batch::parse("random set 3"), None);
    }

    /// Halving finds the one hanging word at every position of a 48-word batch, running at most
    /// two halves per level, and says so when only the whole batch hangs.
    #[test]
    fn halving_names_the_hanging_probe() {
        let batch = Batch { function: "f".into(), offset: 0x40, method: "simulate".into(), words: 48 };
        for hanging in 0..48u64 {
            let at = 0x40 + 4 * hanging;
            let mut runs = 0;
            let found = bisect(&batch, |half| {
                runs += 1;
                Ok((half.offset..half.offset + 4 * half.words).contains(&at))
            })
            .unwrap();
            assert_eq!(found, Ok(Batch { offset: at, words: 1, ..batch.clone() }));
            assert!(runs <= 12, "{runs} runs");
        }
        // Two probes that hang only together: no half hangs alone.
        let together = bisect(&batch, |half| Ok(half.words == 48)).unwrap();
        assert_eq!(together, Err(batch.clone()));
    }
}
