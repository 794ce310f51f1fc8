//! `cargo xtask profile`: a kernel workload under the sampling profiler (kernel/src/profile/),
//! its samples folded into symbolized stacks, flame graphs per unwinder, FP-vs-SCS and
//! FP-vs-SFrame.
//!
//! The kernel dumps one `profile: sample COUNT fp [..] scs [..] sframe [..]` line per distinct
//! triple of stacks (addresses, the interrupted PC first; `[]` for an unwinder not run) and a
//! `profile: summary key=value ...` line.
//! Here the stacks are symbolized with the kernel ELF, folded (`root;...;leaf COUNT`, the format
//! flamegraph.pl and inferno read), compared pair by pair (the agreement figure, each
//! difference explained by what the interrupted function's code was doing at its PC) and drawn.

use crate::Failure;
use crate::build::{self, Board, BuildVariant};
use crate::log::Symbolizer;
use crate::qemu::{self, CpuVariant, Machine};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A period below this is refused before anything runs: one sample's path alone costs about
/// 2000 instructions with both unwinders, so the workload would get no room at all. Above it
/// the kernel measures its share and refuses a period that takes more than the limit.
pub const MIN_EVERY: u64 = 2000;
/// The kernel's own limit on its share of the workload (kernel/src/profile/mod.rs).
pub const SHARE_LIMIT_PERCENT: u64 = 25;

#[derive(clap::Args)]
pub struct ProfileArgs {
    /// Which walkers each sample runs (default: both; in variant nofp, which has no frame
    /// pointers, all: there the shadow call stack and the SFrame walk).
    #[arg(long, value_enum)]
    pub unwinder: Option<UnwinderChoice>,
    /// Sample every N instructions (the PMU's INST_RETIRED overflow; exact under icount).
    #[arg(long, default_value_t = 100_003, conflicts_with = "hz")]
    pub every: u64,
    /// Sample on the timer tick instead, at N Hz of virtual time (1..=10000).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub hz: Option<u64>,
    #[arg(long, value_enum, default_value = "full")]
    pub variant: BuildVariant,
    /// CPU variant (default max,pauth-impdef=on).
    #[arg(long, value_parser = CpuVariant::parse)]
    pub cpu: Option<CpuVariant>,
    /// Test only: break one unwinder (its stacks keep only the interrupted PC), to prove that
    /// the known-shape check fails.
    #[arg(long, value_enum, hide = true)]
    pub break_unwinder: Option<BrokenUnwinder>,
    /// Output directory (default target/profile/WORKLOAD).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Kill QEMU after this many seconds.
    #[arg(long, default_value = "600")]
    pub timeout: u64,
    /// kasan-boot | probes | ftrace | tests | known-shape | replay (Linux's boot allocations)
    pub workload: String,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum UnwinderChoice {
    Fp,
    Scs,
    /// fp and scs.
    Both,
    /// The SFrame walk of the interrupted context, from its saved registers.
    Sframe,
    /// fp, scs and sframe.
    All,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum BrokenUnwinder {
    Fp,
    Scs,
}

impl ProfileArgs {
    /// The walkers asked for, or the variant's default: fp and scs, or without frame pointers
    /// every walker the build has (the kernel drops the refused frame walk from `all`).
    pub fn unwinder(&self) -> UnwinderChoice {
        self.unwinder.unwrap_or(if self.variant == BuildVariant::Nofp {
            UnwinderChoice::All
        } else {
            UnwinderChoice::Both
        })
    }
}

/// One profile: folded stacks per unwinder and the kernel's summary.
pub struct Profile {
    /// Folded text per unwinder (`None`: not run).
    pub fp: Option<String>,
    pub scs: Option<String>,
    pub sframe: Option<String>,
    pub summary: BTreeMap<String, u64>,
    pub comparison: Option<Comparison>,
    /// Against the SFrame walk, per other unwinder.
    pub sframe_agreement: Vec<SFrameAgreement>,
    pub workload_passed: bool,
}

/// FP or SCS against the SFrame walk, sample by sample.
#[derive(Default, Debug)]
pub struct SFrameAgreement {
    /// `FP` or `SCS`.
    pub other: &'static str,
    pub samples: u64,
    pub identical: u64,
    /// Differences by kind, with their sample counts.
    pub causes: BTreeMap<&'static str, u64>,
}

/// FP against SCS, sample by sample.
#[derive(Default, Debug)]
pub struct Comparison {
    pub samples: u64,
    pub identical: u64,
    /// Differences by cause, with their sample counts.
    pub causes: BTreeMap<&'static str, u64>,
    /// For the "other" cause: where the stacks part, with sample counts.
    pub other_places: BTreeMap<String, u64>,
}

fn unwinder_word(choice: UnwinderChoice) -> &'static str {
    match choice {
        UnwinderChoice::Fp => "fp",
        UnwinderChoice::Scs => "scs",
        UnwinderChoice::Both => "both",
        UnwinderChoice::Sframe => "sframe",
        UnwinderChoice::All => "all",
    }
}

/// Checks the request before anything is built: exit 2 with the reason.
pub fn validate(args: &ProfileArgs) -> Result<(), Failure> {
    if !protocol::profile::WORKLOADS.contains(&args.workload.as_str()) {
        return Err(Failure::usage(format!(
            "unknown workload '{}' (known: {})",
            args.workload,
            protocol::profile::WORKLOADS.join(", ")
        )));
    }
    if args.hz.is_none() && args.every < MIN_EVERY {
        return Err(Failure::usage(format!(
            "--every {} is too small: it is below one sample's own cost (~{MIN_EVERY} instructions), so the \
             workload would get no room (the kernel refuses any period that puts the profiler above \
             {SHARE_LIMIT_PERCENT}% of the workload; ~10000 is the smallest that passes with both unwinders)",
            args.every
        )));
    }
    if args.variant == BuildVariant::Nofp && matches!(args.unwinder, Some(UnwinderChoice::Fp | UnwinderChoice::Both)) {
        return Err(Failure::usage(
            "variant nofp has no frame pointers, so the kernel refuses frame-record walks: use --unwinder \
             scs|sframe|all (all: scs and sframe there) or --variant full|prod",
        ));
    }
    if args.variant == BuildVariant::Plain && !matches!(args.unwinder(), UnwinderChoice::Fp | UnwinderChoice::Sframe) {
        return Err(Failure::usage(
            "variant plain has no shadow call stack: use --unwinder fp|sframe or --variant full|prod",
        ));
    }
    Ok(())
}

/// Builds, boots and folds one profile.
pub fn collect(args: &ProfileArgs) -> Result<Profile, Failure> {
    validate(args)?;
    let cpu = args.cpu.unwrap_or(CpuVariant::MaxImpdef);
    let image = build::kernel(Board::Virt, args.variant)?;
    let machine = Machine {
        board: Board::Virt,
        cpu,
        el: 1,
        gic: 2,
        icount: true,
        dtb: None,
        mte: args.variant == BuildVariant::Mte,
        smp: 1,
    };
    machine.validate()?;
    let mut words = vec![
        "run=profile".to_string(),
        "exit=semihosting".into(),
        "icount=1".into(),
        format!("expect-pauth={}", cpu.expected_pauth()),
        format!("profile.workload={}", args.workload),
        format!("profile.unwinder={}", unwinder_word(args.unwinder())),
    ];
    match args.hz {
        Some(hz) => words.extend(["profile.clock=timer".into(), format!("hz={hz}")]),
        None => words.push(format!("profile.every={}", args.every)),
    }
    if let Some(broken) = args.break_unwinder {
        words.push(format!("profile.break={}", if broken == BrokenUnwinder::Fp { "fp" } else { "scs" }));
    }
    let run = qemu::run(&machine, &image, &words.join(" "), Some(Duration::from_secs(args.timeout)), &mut |_| {})?;
    let Some(status) = run.status else {
        return Err(Failure {
            status: if run.ending.timed_out() { 124 } else { 1 },
            message: format!("the profiled kernel: {}", run.ending),
        });
    };
    if let Some(line) = run.log.iter().find(|line| line.text.starts_with("profile: refused")) {
        return Err(Failure::usage(line.text.clone()));
    }
    if status == protocol::ExitStatus::UsageError.code() || status == protocol::ExitStatus::Panic.code() {
        let errors: Vec<_> = run.log.iter().filter(|line| line.level == Some(defmt_parser::Level::Error)).collect();
        let message = errors.iter().map(|line| line.text.as_str()).collect::<Vec<_>>().join("; ");
        return Err(Failure {
            status: if status == 2 { 2 } else { 1 },
            message: format!("profile run failed: {message}"),
        });
    }
    let symbolizer = Symbolizer::new(&image.elf)
        .ok_or_else(|| Failure::usage(format!("{}: cannot read its symbols", image.elf.display())))?;
    let elf = std::fs::read(&image.elf).map_err(|error| Failure::usage(format!("{}: {error}", image.elf.display())))?;
    let code = Code::new(&elf)?;
    let mut summary = BTreeMap::new();
    let mut samples = Vec::new();
    for line in &run.log {
        if let Some(rest) = line.text.strip_prefix("profile: summary ") {
            for pair in rest.split_whitespace() {
                if let Some((key, value)) = pair.split_once('=') {
                    let value = match value {
                        "true" => 1,
                        "false" => 0,
                        number => number.parse().unwrap_or(0),
                    };
                    summary.insert(key.to_string(), value);
                }
            }
        } else if let Some(rest) = line.text.strip_prefix("profile: sample ") {
            samples.push(parse_sample(rest).ok_or_else(|| Failure::usage(format!("bad sample line: {}", line.text)))?);
        }
    }
    if summary.is_empty() {
        return Err(Failure::usage("the kernel printed no profile summary"));
    }
    let fold = |pick: fn(&Sample) -> &Vec<u64>| -> Option<String> {
        if samples.iter().all(|sample| pick(sample).is_empty()) {
            return None;
        }
        let mut folded: BTreeMap<String, u64> = BTreeMap::new();
        for sample in &samples {
            let names = symbolize(&symbolizer, &code, pick(sample));
            if names.is_empty() {
                continue;
            }
            *folded.entry(names.iter().rev().cloned().collect::<Vec<_>>().join(";")).or_default() += sample.count;
        }
        Some(folded.iter().map(|(stack, count)| format!("{stack} {count}\n")).collect())
    };
    let fp = fold(|sample| &sample.fp);
    let scs = fold(|sample| &sample.scs);
    let sframe = fold(|sample| &sample.sframe);
    let comparison = (fp.is_some() && scs.is_some()).then(|| compare(&samples, &symbolizer, &code));
    let picks: [(&'static str, StackOf); 2] = [("FP", |sample| &sample.fp), ("SCS", |sample| &sample.scs)];
    let mut sframe_agreement = Vec::new();
    for (name, pick) in picks {
        let mut agreement = SFrameAgreement { other: name, ..SFrameAgreement::default() };
        for sample in samples.iter().filter(|sample| !pick(sample).is_empty() && !sample.sframe.is_empty()) {
            agreement.samples += sample.count;
            let other = symbolize(&symbolizer, &code, pick(sample));
            let sframe = symbolize(&symbolizer, &code, &sample.sframe);
            let cause = if other == sframe {
                agreement.identical += sample.count;
                continue;
            } else if sframe.len() == 1 {
                "SFrame stops at the PC (code without rows: assembly, sanitizer check thunks)"
            } else if one_more(&sframe, &other) {
                "SFrame has the caller the other misses (leaf, prologue or epilogue window)"
            } else if one_more(&other, &sframe) {
                "the other has one more frame"
            } else {
                "other (the walks differ beyond the interrupted function)"
            };
            *agreement.causes.entry(cause).or_default() += sample.count;
        }
        if agreement.samples > 0 {
            sframe_agreement.push(agreement);
        }
    }
    Ok(Profile { fp, scs, sframe, summary, comparison, sframe_agreement, workload_passed: status == 0 })
}

pub fn run(args: &ProfileArgs) -> Result<u8, Failure> {
    let profile = collect(args)?;
    let out = args.out.clone().unwrap_or_else(|| build::target_dir().join("profile").join(&args.workload));
    std::fs::create_dir_all(&out).map_err(|error| Failure::usage(format!("{}: {error}", out.display())))?;
    // Two profiles of one workload write one directory: one after the other, each file whole.
    let _lock = crate::atomic::lock_dir(&out, "profile output")
        .map_err(|error| Failure::usage(format!("lock for {}: {error}", out.display())))?;
    let mut written = Vec::new();
    for (name, folded) in [("fp", &profile.fp), ("scs", &profile.scs), ("sframe", &profile.sframe)] {
        if let Some(folded) = folded {
            write(&out.join(format!("{name}.folded")), folded.as_bytes(), &mut written)?;
            let title = format!("{} ({} unwinder)", args.workload, name.to_uppercase());
            write(&out.join(format!("{name}.svg")), &flame_graph(folded, &title)?, &mut written)?;
        }
    }
    if let (Some(fp), Some(scs)) = (&profile.fp, &profile.scs) {
        let difference = differential(fp, scs)?;
        write(&out.join("fp-vs-scs.folded"), difference.as_bytes(), &mut written)?;
        let title = format!("{}: FP -> SCS (red: more samples in SCS, blue: fewer)", args.workload);
        write(&out.join("fp-vs-scs.svg"), &flame_graph(&difference, &title)?, &mut written)?;
    }
    if let (Some(fp), Some(sframe)) = (&profile.fp, &profile.sframe) {
        let difference = differential(fp, sframe)?;
        write(&out.join("fp-vs-sframe.folded"), difference.as_bytes(), &mut written)?;
        let title = format!("{}: FP -> SFrame (red: more samples in SFrame, blue: fewer)", args.workload);
        write(&out.join("fp-vs-sframe.svg"), &flame_graph(&difference, &title)?, &mut written)?;
    }
    if let (Some(scs), Some(sframe)) = (&profile.scs, &profile.sframe) {
        let difference = differential(scs, sframe)?;
        write(&out.join("scs-vs-sframe.folded"), difference.as_bytes(), &mut written)?;
        let title = format!("{}: SCS -> SFrame (red: more samples in SFrame, blue: fewer)", args.workload);
        write(&out.join("scs-vs-sframe.svg"), &flame_graph(&difference, &title)?, &mut written)?;
    }
    print_report(args, &profile);
    for path in written {
        println!("  wrote {}", path.display());
    }
    Ok(if profile.workload_passed { 0 } else { 1 })
}

fn write(path: &Path, bytes: &[u8], written: &mut Vec<PathBuf>) -> Result<(), Failure> {
    crate::atomic::write(path, bytes).map_err(|error| Failure::usage(format!("{}: {error}", path.display())))?;
    written.push(path.to_path_buf());
    Ok(())
}

fn print_report(args: &ProfileArgs, profile: &Profile) {
    let get = |key: &str| profile.summary.get(key).copied().unwrap_or(0);
    let samples = get("samples").max(1);
    let lost = get("lost_depot_full") + get("lost_depot_busy") + get("lost_table_full") + get("lost_unwound");
    let clock = match args.hz {
        Some(hz) => format!("timer tick at {hz} Hz"),
        None => format!("every {} instructions (PMU INST_RETIRED overflow)", args.every),
    };
    println!("profile {}: {} samples, {clock}", args.workload, get("samples"));
    println!(
        "  lost: {lost} (depot full {}, depot busy {}, sample table full {}, walk did not reach the interrupted PC {})",
        get("lost_depot_full"),
        get("lost_depot_busy"),
        get("lost_table_full"),
        get("lost_unwound")
    );
    if let Some(comparison) = &profile.comparison {
        println!(
            "  FP/SCS agreement: {}/{} samples identical after symbolization ({:.1}%)",
            comparison.identical,
            comparison.samples,
            100.0 * comparison.identical as f64 / comparison.samples.max(1) as f64
        );
        for (cause, count) in &comparison.causes {
            println!("    differ: {cause}: {count}");
        }
        let mut places: Vec<_> = comparison.other_places.iter().collect();
        places.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        for (place, count) in places.iter().take(5) {
            println!("      other, where they part: {place}: {count}");
        }
    }
    for agreement in &profile.sframe_agreement {
        println!(
            "  {}/SFrame agreement: {}/{} samples identical after symbolization ({:.1}%)",
            agreement.other,
            agreement.identical,
            agreement.samples,
            100.0 * agreement.identical as f64 / agreement.samples.max(1) as f64
        );
        for (cause, count) in &agreement.causes {
            println!("    differ: {cause}: {count}");
        }
    }
    let per_sample = |key: &str, ran: bool| {
        if ran { format!("{:.0}", get(key) as f64 / samples as f64) } else { "(not run)".to_string() }
    };
    println!(
        "  cost per sample (instructions): FP walk+depot {}, SCS walk+depot {}, SFrame walk+depot {}, whole sample \
         path {}, interrupt entry {}",
        per_sample("fp_walk", profile.fp.is_some()),
        per_sample("scs_walk", profile.scs.is_some()),
        per_sample("sframe_walk", profile.sframe.is_some()),
        per_sample("handler", true),
        get("entry_min")
    );
    if args.hz.is_none() {
        println!(
            "  delivery: {} of {} samples delayed past IRQ-masked code (they land where the mask ends); \
             mean {:.0} instructions from overflow to sample",
            get("delayed"),
            get("samples"),
            get("entry") as f64 / samples as f64
        );
    }
    println!(
        "  profiler share: {:.2}% of the workload's {} instructions (limit {SHARE_LIMIT_PERCENT}%; exception return not counted)",
        100.0 * (get("handler") + get("entry_min") * get("samples")) as f64 / get("workload").max(1) as f64,
        get("workload")
    );
    if !profile.workload_passed {
        println!("  the workload itself reported a failure (exit status 1); the profile is complete");
    }
}

/// One unwinder's stack of a sample.
type StackOf = fn(&Sample) -> &Vec<u64>;

struct Sample {
    count: u64,
    fp: Vec<u64>,
    scs: Vec<u64>,
    sframe: Vec<u64>,
}

/// `COUNT fp [A, B] scs [C] sframe [D]` (a line without `sframe` has no SFrame stack).
fn parse_sample(text: &str) -> Option<Sample> {
    let (count, rest) = text.split_once(" fp ")?;
    let (fp, rest) = rest.split_once(" scs ")?;
    let (scs, sframe) = rest.split_once(" sframe ").unwrap_or((rest, "[]"));
    let list = |text: &str| -> Option<Vec<u64>> {
        let inner = text.trim().strip_prefix('[')?.strip_suffix(']')?;
        inner.split(',').filter(|word| !word.trim().is_empty()).map(|word| word.trim().parse().ok()).collect()
    };
    Some(Sample { count: count.trim().parse().ok()?, fp: list(fp)?, scs: list(scs)?, sframe: list(sframe)? })
}

/// Function names, innermost first: the first address is an exact PC, the others return
/// addresses (looked up at the call before them).
fn symbolize(symbolizer: &Symbolizer, code: &Code, addresses: &[u64]) -> Vec<String> {
    addresses
        .iter()
        .enumerate()
        .map(|(index, &address)| {
            if address >> 55 & 1 == 0 {
                return "[user]".to_string();
            }
            // return_address looks 4 bytes back: the PC itself is looked up as PC + 4 - 4.
            let lookup = if index == 0 { address + 4 } else { address };
            symbolizer
                .return_address(lookup)
                .map(|frame| frame.function.replace(';', ":"))
                .or_else(|| {
                    code.label_at(if index == 0 { address } else { address - 4 }).map(|label| format!("[asm {label}]"))
                })
                .unwrap_or_else(|| format!("[unknown {address:#x}]"))
        })
        .collect()
}

/// The kernel's code, to decode the interrupted function around its PC, and every symbol, to
/// name assembly without a sized function symbol (the boot code's `high_entry`, the vectors).
struct Code {
    sections: Vec<(u64, Vec<u8>)>,
    /// (address, name), sorted.
    labels: Vec<(u64, String)>,
}

impl Code {
    fn new(elf: &[u8]) -> Result<Self, Failure> {
        use object::{Object, ObjectSection, ObjectSymbol, SectionKind};
        let file = object::File::parse(elf).map_err(|error| Failure::usage(format!("kernel ELF: {error}")))?;
        let sections = file
            .sections()
            .filter(|section| section.kind() == SectionKind::Text)
            .filter_map(|section| Some((section.address(), section.data().ok()?.to_vec())))
            .collect();
        let mut labels: Vec<(u64, String)> = file
            .symbols()
            .filter(|symbol| symbol.kind() == object::SymbolKind::Text || symbol.kind() == object::SymbolKind::Unknown)
            .filter_map(|symbol| Some((symbol.address(), symbol.name().ok()?.to_string())))
            .filter(|(address, name)| *address != 0 && !name.is_empty() && !name.starts_with('$'))
            .collect();
        labels.sort();
        Ok(Self { sections, labels })
    }

    /// The nearest label at or before `address` inside a code section.
    fn label_at(&self, address: u64) -> Option<&str> {
        self.sections.iter().find(|(base, data)| address >= *base && address < base + data.len() as u64)?;
        let index = self.labels.partition_point(|(start, _)| *start <= address).checked_sub(1)?;
        Some(&self.labels[index].1)
    }

    /// The instructions of `start..start + size`.
    fn words(&self, start: u64, size: u64) -> Option<Vec<u32>> {
        let (base, data) =
            self.sections.iter().find(|(base, data)| start >= *base && start + size <= base + data.len() as u64)?;
        let offset = (start - base) as usize;
        Some(
            data[offset..offset + size as usize]
                .chunks_exact(4)
                .map(|word| u32::from_le_bytes([word[0], word[1], word[2], word[3]]))
                .collect(),
        )
    }
}

/// `add x29, sp, #imm`: the instruction that links a frame record.
fn links_frame(instruction: u32) -> bool {
    instruction & 0xff80_03ff == 0x9100_03fd
}

/// Sample by sample: identical symbolized stacks, or why not. When the SCS stack is the FP
/// stack plus the interrupted function's own return address, the interrupted function's code
/// says why (crates/unwind's `view_difference`): its SCS push was done but its frame record not
/// yet (or no longer) linked - in the prologue, in the epilogue, or never (a function that
/// spills x30 to the SCS but keeps no frame record).
fn compare(samples: &[Sample], symbolizer: &Symbolizer, code: &Code) -> Comparison {
    let mut comparison = Comparison::default();
    for sample in samples.iter().filter(|sample| !sample.fp.is_empty() && !sample.scs.is_empty()) {
        comparison.samples += sample.count;
        let fp = symbolize(symbolizer, code, &sample.fp);
        let scs = symbolize(symbolizer, code, &sample.scs);
        if fp == scs {
            comparison.identical += sample.count;
            continue;
        }
        let mut other = None;
        let cause = difference_cause(sample, &fp, &scs, symbolizer, code, &mut other);
        *comparison.causes.entry(cause).or_default() += sample.count;
        if let Some(place) = other {
            *comparison.other_places.entry(place).or_default() += sample.count;
        }
    }
    comparison
}

fn difference_cause(
    sample: &Sample,
    fp: &[String],
    scs: &[String],
    symbolizer: &Symbolizer,
    code: &Code,
    other: &mut Option<String>,
) -> &'static str {
    let pc = sample.scs[0];
    let scs_has_one_more = one_more(scs, fp);
    let fp_has_one_more = one_more(fp, scs);
    let Some(frame) = symbolizer.return_address(pc + 4) else {
        return "PC in code without a function symbol (assembly: exception vectors, sanitizer check thunks)";
    };
    let start = pc + 4 - frame.offset;
    let Some(words) = code.words(start, frame.size) else {
        return "PC in code without a function symbol (no code found)";
    };
    let index = ((pc - start) / 4) as usize;
    match unwind::view_difference(&words, index) {
        unwind::ViewDifference::ShadowHasExtraFrame if scs_has_one_more => {
            match words.iter().position(|&word| links_frame(word)) {
                None => "leaf without frame record (SCS push, no frame record)",
                Some(link) if index <= link => "prologue window (SCS pushed, frame record not yet linked)",
                Some(_) => "epilogue window (frame record unlinked, SCS not yet popped)",
            }
        }
        unwind::ViewDifference::FramesHaveExtraFrame if fp_has_one_more => {
            "frame record without SCS entry (hand-written code)"
        }
        _ => {
            *other = Some(first_divergence(fp, scs));
            "other (the walks differ beyond the interrupted function)"
        }
    }
}

/// Whether `longer` is `shorter` with one more entry right after the PC (the interrupted
/// function's own return address). Walks cut at the depot's 64 frames lose their outermost
/// entry instead of growing.
fn one_more(longer: &[String], shorter: &[String]) -> bool {
    if longer.len() < 2 || shorter.is_empty() || longer[0] != shorter[0] {
        return false;
    }
    if longer.len() == shorter.len() + 1 {
        return longer[2..] == shorter[1..];
    }
    longer.len() == MAX_FRAMES && shorter.len() == MAX_FRAMES && longer[2..] == shorter[1..MAX_FRAMES - 1]
}

/// The depot's (and the walks') frame limit.
const MAX_FRAMES: usize = 64;

/// Where two stacks (innermost first) part, seen from the root: the frames each has there.
fn first_divergence(fp: &[String], scs: &[String]) -> String {
    let short = |name: &str| name.rsplit("::").next().unwrap_or(name).to_string();
    let common = fp.iter().rev().zip(scs.iter().rev()).take_while(|(a, b)| a == b).count();
    let at = |stack: &[String]| {
        stack.len().checked_sub(common + 1).map_or("(end)".to_string(), |index| short(&stack[index]))
    };
    let above = if common == 0 { "(root)".to_string() } else { short(&fp[fp.len() - common]) };
    format!("FP {} / SCS {} above {above}", at(fp), at(scs))
}

fn flame_graph(folded: &str, title: &str) -> Result<Vec<u8>, Failure> {
    let mut options = inferno::flamegraph::Options::default();
    options.title = title.to_string();
    options.count_name = "samples".into();
    // Colours from the names, not random: the same profile gives the same SVG bytes.
    options.hash = true;
    options.deterministic = true;
    let mut svg = Vec::new();
    inferno::flamegraph::from_lines(&mut options, folded.lines(), &mut svg)
        .map_err(|error| Failure::usage(format!("flame graph: {error}")))?;
    Ok(svg)
}

fn differential(before: &str, after: &str) -> Result<String, Failure> {
    let mut out = Vec::new();
    inferno::differential::from_readers(
        inferno::differential::Options::default(),
        before.as_bytes(),
        after.as_bytes(),
        &mut out,
    )
    .map_err(|error| Failure::usage(format!("differential: {error}")))?;
    String::from_utf8(out).map_err(|error| Failure::usage(format!("differential: {error}")))
}

/// Heavy's share of the known-shape samples must be 3/4 within this.
pub const KNOWN_SHAPE_TOLERANCE: f64 = 0.05;
/// The two known stacks must hold at least this fraction of all samples.
pub const KNOWN_SHAPE_COVERAGE: f64 = 0.9;

/// The known-shape workload's check (kernel/src/profile/workload.rs): `shape_heavy` under
/// `shape_heavy_caller` has three times the samples of `shape_light` under
/// `shape_light_caller`. Ok(heavy share), or what is wrong.
pub fn check_known_shape(folded: &str) -> Result<f64, String> {
    let (mut heavy, mut light, mut total) = (0u64, 0u64, 0u64);
    for line in folded.lines() {
        let Some((stack, count)) = line.rsplit_once(' ') else { continue };
        let count: u64 = count.parse().map_err(|_| format!("bad folded line: {line}"))?;
        total += count;
        let frames: Vec<&str> = stack.split(';').collect();
        let under = |caller: &str, callee: &str| {
            frames.windows(2).any(|pair| pair[0].ends_with(caller) && pair[1].ends_with(callee))
        };
        if under("::shape_heavy_caller", "::shape_heavy") {
            heavy += count;
        } else if under("::shape_light_caller", "::shape_light") {
            light += count;
        }
    }
    let known = heavy + light;
    if known == 0 || (known as f64) < KNOWN_SHAPE_COVERAGE * total as f64 {
        return Err(format!(
            "only {known} of {total} samples under the known callers (heavy {heavy}, light {light}; at least {:.0}% expected)",
            100.0 * KNOWN_SHAPE_COVERAGE
        ));
    }
    let share = heavy as f64 / known as f64;
    if (share - 0.75).abs() > KNOWN_SHAPE_TOLERANCE {
        return Err(format!(
            "heavy share {share:.3} (heavy {heavy}, light {light}), expected 0.75 +- {KNOWN_SHAPE_TOLERANCE}"
        ));
    }
    Ok(share)
}

/// The profiler's checks in `cargo xtask test` (one configuration: full, max,pauth=off, the
/// known-shape workload; three short boots): the shape is found with both unwinders; a second
/// run folds to the same bytes (determinism under icount); with the SCS unwinder broken the
/// check fails for SCS and still passes for FP.
pub fn self_test(report: &mut dyn FnMut(&str, Option<String>)) -> Result<(), Failure> {
    let args = |broken: Option<BrokenUnwinder>| ProfileArgs {
        unwinder: Some(UnwinderChoice::Both),
        every: KNOWN_SHAPE_EVERY,
        hz: None,
        variant: BuildVariant::Full,
        cpu: Some(CpuVariant::MaxNoPauth),
        break_unwinder: broken,
        out: None,
        timeout: 120,
        workload: protocol::profile::KNOWN_SHAPE.into(),
    };
    let first = collect(&args(None))?;
    for (name, folded) in [("fp", &first.fp), ("scs", &first.scs)] {
        let problem = match folded {
            Some(folded) => check_known_shape(folded).err(),
            None => Some("no profile".into()),
        };
        report(&format!("profile known-shape ({name})"), problem);
    }
    let agreement = first.comparison.as_ref().filter(|comparison| comparison.samples > 0);
    report(
        "profile FP/SCS agreement on known-shape",
        match agreement {
            Some(comparison) if comparison.identical == comparison.samples => None,
            Some(comparison) => Some(format!(
                "{} of {} samples differ: {}",
                comparison.samples - comparison.identical,
                comparison.samples,
                comparison
                    .causes
                    .iter()
                    .map(|(cause, count)| format!("{count} {cause}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
            None => Some("no samples compared".into()),
        },
    );
    let second = collect(&args(None))?;
    report(
        "profile determinism (two runs, bit-identical folded stacks)",
        (first.fp != second.fp || first.scs != second.scs).then(|| "the two runs' folded stacks differ".to_string()),
    );
    let broken = collect(&args(Some(BrokenUnwinder::Scs)))?;
    let scs_fails = broken.scs.as_deref().map(check_known_shape);
    let fp_passes = broken.fp.as_deref().map(check_known_shape);
    report(
        "profile broken-unwinder switch fails the known-shape check",
        match (scs_fails, fp_passes) {
            (Some(Err(_)), Some(Ok(_))) => None,
            (scs, fp) => {
                let verdict = |check: Option<Result<f64, String>>| match check {
                    None => "no profile".to_string(),
                    Some(Ok(_)) => "passed".to_string(),
                    Some(Err(problem)) => format!("failed ({problem})"),
                };
                Some(format!("with profile.break=scs: SCS check {}, FP check {}", verdict(scs), verdict(fp)))
            }
        },
    );
    Ok(())
}

/// The known-shape test's period: a prime, so the samples do not alias with the burn loop.
pub const KNOWN_SHAPE_EVERY: u64 = 20_011;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_sample_line() {
        let sample = parse_sample("18 fp [1, 2, 3] scs []").expect("parses");
        assert_eq!((sample.count, sample.fp, sample.scs, sample.sframe), (18, vec![1, 2, 3], vec![], vec![]));
        assert!(parse_sample("18 fp [1, x] scs []").is_none());
        let sample = parse_sample("7 fp [] scs [4] sframe [4, 5]").expect("parses");
        assert_eq!((sample.count, sample.fp, sample.scs, sample.sframe), (7, vec![], vec![4], vec![4, 5]));
        assert!(parse_sample("7 fp [] scs [4] sframe [4, y]").is_none());
    }

    #[test]
    fn one_more_frame_after_the_pc_even_when_cut_at_the_depth_limit() {
        let names = |list: &[&str]| list.iter().map(|name| name.to_string()).collect::<Vec<_>>();
        assert!(one_more(&names(&["pc", "own", "a", "root"]), &names(&["pc", "a", "root"])));
        assert!(!one_more(&names(&["pc", "a", "own", "root"]), &names(&["pc", "a", "root"])));
        let deep: Vec<String> = (0..MAX_FRAMES + 1).map(|index| format!("f{index}")).collect();
        let scs = deep[..MAX_FRAMES].to_vec();
        let fp: Vec<String> = deep
            .iter()
            .enumerate()
            .filter(|(index, _)| *index != 1)
            .map(|(_, name)| name.clone())
            .take(MAX_FRAMES)
            .collect();
        assert!(one_more(&scs, &fp));
        assert_eq!(
            first_divergence(
                &names(&["pc", "x::write_u8", "t::test", "root"]),
                &names(&["pc", "x::closure", "t::test", "root"])
            ),
            "FP write_u8 / SCS closure above test"
        );
    }

    #[test]
    fn nofp_refuses_the_frame_walk_and_defaults_to_every_other_walker() {
        let args = |variant, unwinder| ProfileArgs {
            unwinder,
            every: 100_003,
            hz: None,
            variant,
            cpu: None,
            break_unwinder: None,
            out: None,
            timeout: 600,
            workload: "kasan-boot".into(),
        };
        for refused in [UnwinderChoice::Fp, UnwinderChoice::Both] {
            let failure = validate(&args(BuildVariant::Nofp, Some(refused))).expect_err("refused");
            assert_eq!(failure.status, 2);
            assert!(failure.message.contains("no frame pointers"), "{}", failure.message);
        }
        for accepted in [UnwinderChoice::Scs, UnwinderChoice::Sframe, UnwinderChoice::All] {
            assert!(validate(&args(BuildVariant::Nofp, Some(accepted))).is_ok());
        }
        assert_eq!(args(BuildVariant::Nofp, None).unwinder(), UnwinderChoice::All);
        assert_eq!(args(BuildVariant::Prod, None).unwinder(), UnwinderChoice::Both);
    }

    #[test]
    fn known_shape_check_accepts_three_to_one_and_rejects_the_rest() {
        let good = "main;k::shape_heavy_caller;k::shape_heavy 75\nmain;k::shape_light_caller;k::shape_light 25\n";
        assert!((check_known_shape(good).expect("passes") - 0.75).abs() < 1e-9);
        let skewed = "main;k::shape_heavy_caller;k::shape_heavy 60\nmain;k::shape_light_caller;k::shape_light 40\n";
        assert!(check_known_shape(skewed).is_err());
        // A broken unwinder: the callers are gone.
        let truncated = "k::shape_heavy 75\nk::shape_light 25\n";
        assert!(check_known_shape(truncated).is_err());
    }
}
