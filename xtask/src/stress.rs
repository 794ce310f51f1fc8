//! `cargo xtask stress probes`: the probe sweep (kernel `run=sweep`) over the whole kernel, and
//! the deterministic sample `cargo xtask test` runs.
//!
//! The kernel prints its coverage (`sweep coverage:`, `sweep probed:`, `sweep refused:`,
//! `sweep missed:`) and one `sweep FAILED:` line per failing probe (function+offset, word,
//! method); xtask adds the disassembled instruction (`llvm-objdump` of rustup's `llvm-tools`, if
//! installed) and the command that repeats exactly that probe. A run that dies names the batch it died in.

use crate::Failure;
use crate::build::{self, Board, BuildVariant};
use crate::probe_spec::Flag;
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
    /// Repeat exactly one probe: `FUNCTION+OFFSET:METHOD`, as a failure prints it (e.g.
    /// `kernel::task::tick+0x8:brk-step`); checked against each variant's image before it boots.
    #[arg(long)]
    pub probe: Option<String>,
    /// Repeat one random set of the run with this `--seed` and `--functions` (as a hang in one
    /// prints it).
    #[arg(long)]
    pub set: Option<u64>,
    /// With `--set`: only these members, `A..B` (0 <= A < B <= 48).
    #[arg(long, default_value = "0..48")]
    pub members: String,
    /// Milliseconds CPU 0 may make no progress before another CPU reports the run hung (kernel
    /// default: 5000 more than its own wait for a pass, 2000 times the patience factor: 7 s under
    /// icount, 45 s without; a loaded host may need more).
    #[arg(long)]
    pub watchdog: Option<u64>,
    /// Sweep a seeded sample of this many functions (0: all).
    #[arg(long, default_value = "0")]
    pub functions: usize,
    #[arg(long, default_value = "1")]
    pub seed: u64,
    /// Only the functions whose names start with this (the sample and random sets draw from them).
    #[arg(long)]
    pub only: Option<String>,
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
    /// Run QEMU with `-icount` (one instruction per virtual ns, the vCPUs in turn on one host
    /// thread): the kernel's `sweep time:` lines are then the guest's own time, the same
    /// whatever else the host runs (slower in wall time on several CPUs).
    #[arg(long)]
    pub icount: bool,
    /// Sweep part K of N (1-based: functions and random sets round-robin, each single probe
    /// with its function) and write its counts to shard.json for `cargo xtask merge`.
    #[arg(long, value_name = "K/N", value_parser = crate::shard::Shard::parse, conflicts_with_all = ["probe", "set"])]
    pub shard: Option<crate::shard::Shard>,
    /// With --shard: the directory shard.json goes to (default: target/shard/sweep-K-of-N).
    #[arg(long, requires = "shard")]
    pub out: Option<std::path::PathBuf>,
}

pub fn run(args: &StressArgs) -> Result<u8, Failure> {
    let Target::Probes(args) = &args.target;
    // The repeated probe's syntax before anything builds, its instruction in each image before it boots.
    let probe = crate::probe_spec::parse_all(args.probe.iter().map(|text| (Flag::SweepProbe, text)))?;
    let variants =
        if args.variants.is_empty() { vec![BuildVariant::Full, BuildVariant::Prod] } else { args.variants.clone() };
    // Every variant's image before the first boots, so a refusal in the last wastes no run.
    if !probe.is_empty() {
        for &variant in &variants {
            crate::probe_spec::check_image(&probe, &build::kernel(Board::Virt, variant)?.elf, variant.name())?;
        }
    }
    let mut failed = 0;
    let mut shard_runs = Vec::new();
    let mut images = Vec::new();
    for &variant in &variants {
        let image = build::kernel(Board::Virt, variant)?;
        if args.shard.is_some() {
            images.push(format!("{}:{}", variant.name(), crate::shard::file_hash(&image.raw)?));
        }
        let mut extras = vec![String::new()];
        if args.ftrace && variant != BuildVariant::Plain {
            extras.extend(["list", "call-ops", "vector"].map(|scheme| format!("sweep.ftrace={scheme}")));
        }
        for extra in extras {
            let mut words = format!("sweep.seed={} sweep.functions={} {extra}", args.seed, args.functions);
            if let Some(probe) = &args.probe {
                words = format!("sweep.probe={probe}");
            } else if let Some(set) = args.set {
                words = format!("{words} sweep.set={set} sweep.members={}", args.members);
            }
            if let Some(only) = &args.only {
                words = format!("{words} sweep.only={only}");
            }
            if let Some(watchdog) = args.watchdog {
                words = format!("{words} sweep.watchdog={watchdog}");
            }
            if let Some(shard) = args.shard {
                words = format!("{words} sweep.shard={}", shard.name());
            }
            let run = Run { image: &image, variant, cpu: args.cpu, smp: args.smp, icount: args.icount };
            let outcome = sweep(&run, &words, Duration::from_secs(args.timeout), Print::Always)?;
            failed += u8::from(!outcome.passed);
            let label = format!("variant {} {}", variant.name(), if extra.is_empty() { "no tracer" } else { &extra });
            shard_runs.push(crate::shard::coverage::run_entry(&label, outcome.passed, &outcome.coverage));
            if let Some(hung) = outcome.hung {
                name_hanging_probe(&run, &hung, &words, Duration::from_secs(args.hang_timeout))?;
            }
        }
    }
    if let Some(shard) = args.shard {
        let names: Vec<_> = variants.iter().map(|variant| variant.name()).collect();
        let parameters = shard_parameters(args, &names, &images);
        let directory = args.out.clone().unwrap_or_else(|| shard.directory(crate::shard::Kind::Sweep));
        crate::shard::coverage::write_shard(&directory, shard, parameters, shard_runs)?;
    }
    Ok(if failed == 0 { 0 } else { 1 })
}

/// What a sweep shard's stamp records of its run: everything that decides what it sweeps and how
/// its counts come out, so that `merge` refuses shards of different runs (under `-icount` the
/// vCPUs run in turn, which changes the counts that depend on the other CPUs' timing).
fn shard_parameters(args: &ProbesArgs, variants: &[&str], images: &[String]) -> String {
    format!(
        "stress probes variants={} cpu={} smp={} icount={} seed={} functions={} only={} ftrace={} images={}",
        variants.join(","),
        args.cpu.name(),
        args.smp,
        args.icount,
        args.seed,
        args.functions,
        args.only.as_deref().unwrap_or(""),
        args.ftrace,
        images.join(",")
    )
}

/// What a sweep run runs on.
#[derive(Clone, Copy)]
pub struct Run<'a> {
    pub image: &'a build::KernelImage,
    pub variant: BuildVariant,
    pub cpu: CpuVariant,
    pub smp: u8,
    /// QEMU with `-icount` (and the kernel told so: `icount=1`).
    pub icount: bool,
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
}

/// A part of a random set as the kernel names it (`sweep batch: random set K members A..B`):
/// members `first..end` of set `set`, which the kernel finds again from the run's seed,
/// `sweep.functions` and the set's index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetPart {
    pub set: u64,
    pub first: u64,
    pub end: u64,
}

impl SetPart {
    fn parse(text: &str) -> Option<SetPart> {
        let (set, members) = text.strip_prefix("random set ")?.split_once(" members ")?;
        let (first, end) = members.trim().split_once("..")?;
        Some(SetPart { set: set.parse().ok()?, first: first.parse().ok()?, end: end.parse().ok()? })
    }

    /// The kernel words that run exactly this part (with the run's seed and sweep.functions).
    fn words(&self) -> String {
        format!("sweep.set={} sweep.members={}..{}", self.set, self.first, self.end)
    }

    fn describe(&self) -> String {
        format!("random set {} members {}..{}", self.set, self.first, self.end)
    }
}

/// What a hung run was doing: a batch of one function's words, or (part of) a random set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Hung {
    Words(Batch),
    Set(SetPart),
}

impl Hung {
    fn parse(text: &str) -> Option<Hung> {
        Batch::parse(text).map(Hung::Words).or_else(|| SetPart::parse(text).map(Hung::Set))
    }

    /// The hung batch or set, as the sweep's lines name it.
    fn describe(hung: Option<&Hung>) -> String {
        match hung {
            Some(Hung::Words(batch)) => format!("batch {} ({} words)", batch.probe(), batch.words),
            Some(Hung::Set(part)) => part.describe(),
            None => "nothing hung".into(),
        }
    }
}

/// Something `bisect` halves.
pub trait Halving: Clone {
    fn size(&self) -> u64;
    fn halves(&self) -> (Self, Self);
}

impl Halving for Batch {
    fn size(&self) -> u64 {
        self.words
    }

    fn halves(&self) -> (Batch, Batch) {
        let first = self.words / 2;
        let left = Batch { words: first, ..self.clone() };
        let right = Batch { offset: self.offset + 4 * first, words: self.words - first, ..self.clone() };
        (left, right)
    }
}

impl Halving for SetPart {
    fn size(&self) -> u64 {
        self.end - self.first
    }

    fn halves(&self) -> (SetPart, SetPart) {
        let middle = self.first + self.size() / 2;
        (SetPart { end: middle, ..self.clone() }, SetPart { first: middle, ..self.clone() })
    }
}

/// Halves `batch` while one half hangs (`hangs` runs it) until one probe remains: Ok(that
/// probe), or Err(the smallest batch that hangs while neither of its halves does alone).
pub fn bisect<B: Halving>(
    batch: &B,
    mut hangs: impl FnMut(&B) -> Result<bool, Failure>,
) -> Result<Result<B, B>, Failure> {
    let mut hanging = batch.clone();
    while hanging.size() > 1 {
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

/// The words of a sweep run that a repeat of one of its batches keeps (the injected bug, the
/// tracer, the watchdog; the seed and sample size that a random set is found again from).
fn carried_words(words: &str) -> String {
    words
        .split_whitespace()
        .filter(|word| {
            ["sweep.inject=", "sweep.ftrace=", "sweep.watchdog=", "sweep.seed=", "sweep.functions=", "sweep.only="]
                .iter()
                .any(|key| word.starts_with(key))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The value of `KEY=` among `words`, or "0".
fn word_value<'a>(words: &'a str, key: &str) -> &'a str {
    words.split_whitespace().find_map(|word| word.strip_prefix(key)?.strip_prefix('=')).unwrap_or("0")
}

/// A run hung in `hung`: halves it until one probe remains and prints that probe (disassembled,
/// its method and the command that repeats it). Returns the probe (`FUNCTION+0xOFF:METHOD`,
/// without spaces), if the halving found one.
pub fn name_hanging_probe(run: &Run, hung: &Hung, words: &str, timeout: Duration) -> Result<Option<String>, Failure> {
    match hung {
        Hung::Words(batch) => name_hanging_word(run, batch, words, timeout),
        Hung::Set(part) => name_hanging_member(run, part, words, timeout),
    }
}

/// [`name_hanging_probe`] of a batch of one function's words.
fn name_hanging_word(run: &Run, batch: &Batch, words: &str, timeout: Duration) -> Result<Option<String>, Failure> {
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
            Ok(Some(probe.probe()))
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

/// [`name_hanging_probe`] of a random set: halves the set's members (`sweep.set=K
/// sweep.members=A..B`, found again from the run's seed and sample) down to one.
fn name_hanging_member(run: &Run, part: &SetPart, words: &str, timeout: Duration) -> Result<Option<String>, Failure> {
    let carried = carried_words(words);
    println!("  halving the hanging {}", part.describe());
    // Each member as the runs named it: index -> (probe, address).
    let mut members = std::collections::BTreeMap::new();
    let found = bisect(part, |half| {
        let outcome = sweep(run, &format!("{} {carried}", half.words()), timeout, Print::Never)?;
        println!("    {}: {}", half.describe(), if outcome.hung.is_some() { "hangs" } else { "runs" });
        members.extend(outcome.members.into_iter().map(|member| (member.index, (member.probe, member.address))));
        Ok(outcome.hung.is_some())
    })?;
    let repeat = |part: &SetPart| {
        format!(
            "cargo xtask stress probes --variant {} --cpu {} --smp {} --seed {} --functions {}{} --set {} --members {}..{}",
            run.variant.name(),
            run.cpu.name(),
            run.smp,
            word_value(words, "sweep.seed"),
            word_value(words, "sweep.functions"),
            words
                .split_whitespace()
                .find_map(|word| word.strip_prefix("sweep.only="))
                .map_or(String::new(), |only| format!(" --only '{only}'")),
            part.set,
            part.first,
            part.end
        )
    };
    match found {
        Ok(single) => {
            let Some((probe, address)) = members.get(&single.first).cloned() else {
                println!("  {}: the runs did not name member {}", single.describe(), single.first);
                return Ok(None);
            };
            let method = probe.rsplit_once(':').map_or("?", |(_, method)| method);
            println!(
                "  the hanging probe: random set {} member {}: {probe} (method {method})",
                single.set, single.first
            );
            println!("    {}", disassemble(&run.image.elf, address));
            println!(
                "    repeat: cargo xtask stress probes --variant {} --cpu {} --smp {} --probe '{probe}'",
                run.variant.name(),
                run.cpu.name(),
                run.smp
            );
            println!("    repeat in its set: {}", repeat(&single));
            Ok(Some(probe))
        }
        Err(whole) => {
            let again = sweep(run, &format!("{} {carried}", whole.words()), timeout, Print::Never)?;
            let verdict = if again.hung.is_some() {
                "hang together, neither half alone"
            } else {
                "did not hang again: not repeatable"
            };
            println!("  {} {verdict}:", whole.describe());
            for index in whole.first..whole.end {
                if let Some((probe, address)) = members.get(&index) {
                    println!("    member {index}: {probe} ({address:#x})");
                }
            }
            println!("    repeat: {}", repeat(&whole));
            Ok(None)
        }
    }
}

/// A random set's member as a `sweep.set=` run names it (`sweep member: I PROBE (0xADDRESS)`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub index: u64,
    /// `FUNCTION+0xOFF:METHOD`, without spaces (as `--probe` takes it).
    pub probe: String,
    pub address: u64,
    /// CPU 0's hits in the run's pass (`sweep member hits: I N`; 0 if the run did not get there).
    pub hits: u64,
}

impl Member {
    fn parse(text: &str) -> Option<Member> {
        let (index, rest) = text.split_once(' ')?;
        let (probe, address) = rest.rsplit_once(" (0x")?;
        Some(Member {
            index: index.parse().ok()?,
            probe: probe.replace(' ', ""),
            address: u64::from_str_radix(address.strip_suffix(')')?, 16).ok()?,
            hits: 0,
        })
    }
}

pub struct Outcome {
    pub passed: bool,
    /// What the run hung in (a QEMU timeout, or a `sweep hung:` line).
    pub hung: Option<Hung>,
    /// The members a `sweep.set=` run armed.
    pub members: Vec<Member>,
    /// The first probe's address of a `sweep.probe=` run (`sweep probe address:`).
    pub address: Option<u64>,
    /// The coverage lines, joined (for the test tally's line).
    pub summary: String,
    /// The coverage lines (what `merge` adds up over shards).
    pub coverage: Vec<String>,
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
    let Run { image, variant, cpu, smp, icount } = *run;
    let machine =
        Machine { board: Board::Virt, cpu, el: 1, gic: 3, icount, dtb: None, mte: variant == BuildVariant::Mte, smp };
    // A slow tick: the workload must run the same code on every pass (see kernel/src/sweep).
    let bootargs = format!("run=sweep hz=10 exit=semihosting icount={} {words}", u8::from(icount));
    let result = qemu::run(&machine, image, &bootargs, Some(timeout), &mut |_| {})?;
    let mut last_batch = None;
    let mut coverage = Vec::new();
    let mut failures = Vec::new();
    let mut hung_in_kernel = false;
    let mut address = None;
    let mut members: Vec<Member> = Vec::new();
    let mut progress = None;
    for line in &result.log {
        let text = line.text.as_str();
        if let Some(batch) = text.strip_prefix("sweep batch: ") {
            last_batch = Some(batch.to_string());
        } else if let Some(member) = text.strip_prefix("sweep member: ") {
            members.extend(Member::parse(member));
        } else if let Some(hits) = text.strip_prefix("sweep member hits: ") {
            let (index, count) = hits.split_once(' ').unwrap_or_default();
            if let Some(member) = members.iter_mut().find(|member| index.parse() == Ok(member.index)) {
                member.hits = count.trim().parse().unwrap_or(0);
            }
        } else if text.starts_with("sweep progress:") {
            progress = Some(text.to_string());
        } else if let Some(at) = text.strip_prefix("sweep probe address: 0x") {
            address = u64::from_str_radix(at.trim(), 16).ok();
        } else if text.starts_with("sweep coverage:")
            || text.starts_with("sweep probed:")
            || text.starts_with("sweep refused:")
            || text.starts_with("sweep missed:")
            || text.starts_with("sweep done:")
            || text.starts_with("sweep cpus:")
            || text.starts_with("sweep time:")
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
        if result.ending.timed_out() || hung_in_kernel { last_batch.as_deref().and_then(Hung::parse) } else { None };
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
        if let Some(progress) = &progress {
            println!("  last {progress}");
        }
        let during = last_batch
            .as_deref()
            .map_or_else(|| "before its first batch".into(), |batch| format!("during batch {batch}"));
        match result.status {
            None => println!("  {} {during}", result.ending),
            Some(status) if failures.is_empty() || !coverage.iter().any(|line| line.starts_with("sweep done:")) => {
                println!("  exited with status {status} {during}; kernel log:");
                for line in result.log.iter().rev().take(60).collect::<Vec<_>>().into_iter().rev() {
                    println!("    {line}");
                }
            }
            Some(_) => {}
        }
    }
    Ok(Outcome { passed, hung, members, address, summary: coverage.join("; "), coverage, failures })
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
    let run = Run { image, variant, cpu, smp: 1, icount: false };
    let words = "sweep.seed=19 sweep.functions=32 sweep.singles=16 sweep.ftrace=vector";
    let outcome = sweep(&run, words, Duration::from_secs(120), Print::OnFailure)?;
    if outcome.passed {
        println!("probe sweep sample [variant {}]: ok: {}", variant.name(), outcome.summary);
    }
    // Once, in the cheaper build: the sharding is xtask's and the kernel's partition, the same
    // code in every variant.
    let sharded = variant != BuildVariant::Prod || shards_add_up(&run, words, &outcome)?;
    let everywhere = Run { smp: 4, ..run };
    let words = "sweep.seed=19 sweep.functions=8 sweep.singles=8";
    // A real hang ends at the kernel's watchdog (CPU 0 silent for 5 s); QEMU's timeout only
    // bounds a slow run: 4 vCPUs on a loaded host with fewer cores take well over 100 s here.
    let on_four = sweep(&everywhere, words, Duration::from_secs(300), Print::OnFailure)?;
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
    // The kretprobe returns check, shown to fail: the detour pass's returns read one high.
    let injected = "sweep.seed=19 sweep.functions=4 sweep.singles=0 sweep.inject=miscount-returns";
    let miscounted = sweep(&run, injected, Duration::from_secs(120), Print::Never)?;
    let returns_caught =
        !miscounted.passed && miscounted.failures.iter().any(|line| line.contains("kretprobe: returns differ"));
    println!(
        "probe sweep check [variant {}, kretprobe returns miscounted]: {}",
        variant.name(),
        if returns_caught { "ok: caught as returns differing" } else { "FAILED: the returns check did not fire" }
    );
    let named = hang_is_named(&run)?;
    let set_named = set_hang_is_named(&run)?;
    Ok(outcome.passed && on_four.passed && detected && returns_caught && named && set_named && sharded)
}

/// The sample run again as two shards (`sweep.shard=1/2` and `2/2`), each written as
/// `stress probes --shard` writes it, then loaded, checked and added up as `merge` does: the
/// sum must equal the unsharded sample's counts (`whole`), all but its time.
fn shards_add_up(run: &Run, words: &str, whole: &Outcome) -> Result<bool, Failure> {
    use crate::shard::{Shard, coverage};
    let label = format!("probe sweep check [variant {}, the sample as 2 shards merged]", run.variant.name());
    let root = build::target_dir().join("shard").join("sample-check");
    let _ = std::fs::remove_dir_all(&root);
    let parameters = format!("sample {words}");
    let started = std::time::Instant::now();
    for index in 1..=2 {
        let shard = Shard { index, count: 2 };
        let words = format!("{words} sweep.shard={}", shard.name());
        let outcome = sweep(run, &words, Duration::from_secs(120), Print::OnFailure)?;
        let entry = coverage::run_entry("sample", outcome.passed, &outcome.coverage);
        coverage::write_shard(&root.join(index.to_string()), shard, parameters.clone(), vec![entry])?;
    }
    let merged = crate::shard::load(std::slice::from_ref(&root)).and_then(|shards| {
        crate::shard::check(&shards).and_then(|()| coverage::totals(&shards)).map_err(Failure::usage)
    })?;
    let whole = coverage::Coverage::parse(whole.coverage.iter().map(String::as_str));
    let verdict = match (merged.first(), whole) {
        (Some(merged), Some(whole)) if merged.stopped.is_empty() && merged.passed => {
            merged.total.same_counts(&whole).map(|()| merged.total.lines()[0].clone())
        }
        (Some(merged), _) if !merged.stopped.is_empty() || !merged.passed => Err("a shard failed".into()),
        _ => Err("the unsharded sample did not finish".into()),
    };
    match &verdict {
        Ok(coverage) => println!(
            "{label}: ok: equal to the unsharded sample's counts ({coverage}; the shards took {:.1} s)",
            started.elapsed().as_secs_f64()
        ),
        Err(differences) => println!("{label}: FAILED: {differences}"),
    }
    Ok(verdict.is_ok())
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
    println!(
        "probe sweep check [variant {}, a probe that hangs]: expecting a hang: the handler of \
         {HANGING_FUNCTION}+{HANGING_OFFSET:#x} spins; halving batch {} must name it",
        run.variant.name(),
        batch.probe()
    );
    let whole = sweep(run, &format!("{} {inject}", batch.words()), timeout, Print::Never)?;
    let named = match &whole.hung {
        Some(hung @ Hung::Words(words)) if *words == batch => name_hanging_probe(run, hung, &inject, timeout)?,
        _ => None,
    };
    let expected = Batch { offset: HANGING_OFFSET, words: 1, ..batch };
    let passed = named.as_deref() == Some(expected.probe().as_str());
    println!(
        "probe sweep check [variant {}, a probe that hangs]: {}",
        run.variant.name(),
        if passed {
            format!("ok: halving named {}", expected.probe())
        } else {
            format!(
                "FAILED: expected {}, halving gave {} (the whole run: {})",
                expected.probe(),
                named.as_deref().unwrap_or("nothing"),
                Hung::describe(whole.hung.as_ref())
            )
        }
    );
    Ok(passed)
}

/// The random sets `set_hang_is_named` arms: those of a run with seed 19 over the workload's own
/// functions (random words of the whole kernel are mostly code the workload does not run).
const SET_RUN_WORDS: &str = "sweep.seed=19 sweep.functions=0 sweep.only=kernel::sweep::workload::";

/// A random set with one probe whose handler spins: a first run arms random set 0 (or 1, 2, 3:
/// the first with a member the workload runs on CPU 0) and says which members CPU 0 hit; one of
/// those is made to hang (`sweep.inject=hang@`); the whole set must hang (on 2 CPUs with a 1 s
/// watchdog, as `hang_is_named`), and halving its members must name exactly that probe.
fn set_hang_is_named(run: &Run) -> Result<bool, Failure> {
    let run = &Run { smp: 2, ..*run };
    let timeout = Duration::from_secs(HANG_TEST_TIMEOUT_S);
    let mut target = None;
    for set in 0..4 {
        let part = SetPart { set, first: 0, end: protocol::sweep::SET_MEMBERS as u64 };
        let outcome =
            sweep(run, &format!("{SET_RUN_WORDS} {} sweep.watchdog=1000", part.words()), timeout, Print::Never)?;
        if let Some(member) = outcome.members.iter().find(|member| member.hits > 0) {
            target = Some((SetPart { end: outcome.members.len() as u64, ..part }, member.clone()));
            break;
        }
    }
    let label = format!("probe sweep check [variant {}, a random set that hangs]", run.variant.name());
    let Some((part, member)) = target else {
        println!("{label}: FAILED: no member of random sets 0 to 3 ran on CPU 0");
        return Ok(false);
    };
    let place = member.probe.rsplit_once(':').map_or(member.probe.as_str(), |(place, _)| place);
    println!(
        "{label}: expecting a hang: the handler of {} member {} ({}) spins; halving the set must name it",
        part.describe(),
        member.index,
        member.probe
    );
    let words = format!("{SET_RUN_WORDS} sweep.inject=hang@{place} sweep.watchdog=1000");
    let whole = sweep(run, &format!("{} {words}", part.words()), timeout, Print::Never)?;
    let named = match &whole.hung {
        Some(Hung::Set(hung)) if *hung == part => name_hanging_probe(run, &Hung::Set(part.clone()), &words, timeout)?,
        _ => None,
    };
    let passed = named.as_deref() == Some(member.probe.as_str());
    if passed {
        println!("{label}: ok: halving named {} member {}: {}", part.describe(), member.index, member.probe);
    } else {
        println!(
            "{label}: FAILED: expected {} member {}: {}, halving gave {} (the whole run: {})",
            part.describe(),
            member.index,
            member.probe,
            named.as_deref().unwrap_or("nothing"),
            Hung::describe(whole.hung.as_ref())
        );
    }
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
        assert_eq!(Batch::parse("random set 3 members 0..48"), None);
        assert_eq!(Hung::parse("random set 3 members 24..48"), Some(Hung::Set(SetPart { set: 3, first: 24, end: 48 })));
        assert_eq!(SetPart { set: 3, first: 24, end: 36 }.words(), "sweep.set=3 sweep.members=24..36");
        let member =
            Member::parse("17 <stackdepot::depot::StackDepot<4096, 16>>::find+0xc8:detour (0xffffff80400f0a50)");
        assert_eq!(
            member,
            Some(Member {
                index: 17,
                probe: "<stackdepot::depot::StackDepot<4096,16>>::find+0xc8:detour".into(),
                address: 0xffff_ff80_400f_0a50,
                hits: 0
            })
        );
        let words = "sweep.seed=19 sweep.functions=0 sweep.set=3 sweep.inject=hang@f+0x8 sweep.watchdog=1000";
        assert_eq!(carried_words(words), "sweep.seed=19 sweep.functions=0 sweep.inject=hang@f+0x8 sweep.watchdog=1000");
        assert_eq!(word_value(words, "sweep.seed"), "19");
    }

    /// Halving finds the one hanging word at every position of a whole batch, running at most
    /// two halves per level, and says so when only the whole batch hangs.
    #[test]
    fn halving_names_the_hanging_probe() {
        let words = protocol::sweep::BATCH_WORDS as u64;
        let batch = Batch { function: "f".into(), offset: 0x40, method: "simulate".into(), words };
        let levels = 2 * (u64::BITS - (words - 1).leading_zeros());
        for hanging in 0..words {
            let at = 0x40 + 4 * hanging;
            let mut runs = 0;
            let found = bisect(&batch, |half| {
                runs += 1;
                Ok((half.offset..half.offset + 4 * half.words).contains(&at))
            })
            .unwrap();
            assert_eq!(found, Ok(Batch { offset: at, words: 1, ..batch.clone() }));
            assert!(runs <= levels, "{runs} runs");
        }
        // Two probes that hang only together: no half hangs alone.
        let together = bisect(&batch, |half| Ok(half.words == words)).unwrap();
        assert_eq!(together, Err(batch.clone()));
    }

    /// A shard's stamp tells a run under `-icount` from one without, so `merge` refuses to add
    /// them up.
    #[test]
    fn shard_stamp_records_icount() {
        #[derive(clap::Parser)]
        struct Command {
            #[command(flatten)]
            probes: ProbesArgs,
        }
        let parse = |words: &[&str]| <Command as clap::Parser>::parse_from(words).probes;
        let images = ["0123abcd".to_string()];
        let plain = shard_parameters(&parse(&["probes", "--smp", "4"]), &["prod"], &images);
        let icount = shard_parameters(&parse(&["probes", "--smp", "4", "--icount"]), &["prod"], &images);
        assert!(plain.contains(" icount=false "), "{plain}");
        assert!(icount.contains(" icount=true "), "{icount}");
        assert_ne!(plain, icount);
    }

    /// The same for a random set's members, at every position of a whole set; `--members`'
    /// default is the whole set.
    #[test]
    fn halving_names_the_hanging_member() {
        let members = protocol::sweep::SET_MEMBERS as u64;
        #[derive(clap::Parser)]
        struct Command {
            #[command(flatten)]
            probes: ProbesArgs,
        }
        let parsed = <Command as clap::Parser>::parse_from(["probes"]);
        assert_eq!(parsed.probes.members, format!("0..{members}"));
        let set = SetPart { set: 5, first: 0, end: members };
        for hanging in 0..members {
            let mut runs = 0;
            let found = bisect(&set, |half| {
                runs += 1;
                assert!(half.first < half.end && half.end <= members);
                Ok((half.first..half.end).contains(&hanging))
            })
            .unwrap();
            assert_eq!(found, Ok(SetPart { set: 5, first: hanging, end: hanging + 1 }));
            assert!(runs <= 12, "{runs} runs");
        }
        assert_eq!(bisect(&set, |half| Ok(half.size() == members)).unwrap(), Err(set.clone()));
    }
}
