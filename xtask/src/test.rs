//! `cargo xtask test`: host crate tests, then the kernel suite in QEMU over a configuration matrix.
//!
//! Kernel tests on `virt` run under `-icount shift=0,sleep=off`: deterministic, and timer IRQs
//! arrive at exactly the instruction their deadline names (the IRQ-time stack-trace test at
//! random points needs that). `raspi4b` runs without icount: its four cores share the icount
//! budget and tick delivery on CPU 0 became irregular (5 to 24 ticks in a 20-tick window); the
//! random-point test is skipped there and says why.
//! The whole matrix (`--matrix`) on `virt` is every build variant (full, prod, plain) x every
//! CPU variant x entry at EL1 and EL2 x GICv2 and GICv3. The default set leaves out two of the
//! three PAuth algorithms: under icount QARMA5, QARMA3 and the IMPLEMENTATION DEFINED algorithm
//! execute the same instructions (only their emulation time differs, QARMA5 ten times dearer),
//! so one of them, beside `pauth=off` and the Cortex-A72, keeps every distinct path. On QEMU
//! `raspi4b` (the Pi 4 board) every build variant runs once: Cortex-A72, EL2, GIC-400. Each kernel
//! test counts once per configuration it ran in. `--filter` runs one configuration unless
//! `--matrix` is given (`--smp N`: on N CPUs). Every configuration above runs on one CPU; the
//! default set adds the suite on 4 CPUs (`smp 4`): virt with max,pauth-impdef=on at EL1/GICv2
//! per build variant, the first variant also at EL2 (PSCI through SMC) and with GICv3, and
//! raspi4b (spin table). When `full` is in the set, the `kasan_` corpus runs once more in the
//! short-granule build (`--kasan-short-granules`; virt, EL1, GICv2, `max,pauth=off` if selected).

use crate::Failure;
use crate::build::{self, Board, BuildVariant};
use crate::qemu::{self, CpuVariant, Machine};
use protocol::ExitStatus;
use std::process::Command;
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct TestArgs {
    /// Only kernel tests whose name contains this, in one configuration (virt, full,
    /// max,pauth-impdef=on, EL1, GICv2; narrowed by --board/--variant/--cpu) unless --matrix.
    #[arg(long, default_value = "")]
    pub filter: String,
    /// Every configuration: all five CPU variants (the default set runs one of the three PAuth
    /// algorithms, which execute the same instructions under icount).
    #[arg(long)]
    pub matrix: bool,
    /// Only these CPU variants (repeatable).
    #[arg(long = "cpu", value_parser = CpuVariant::parse)]
    pub cpus: Vec<CpuVariant>,
    /// Only these build variants (repeatable).
    #[arg(long = "variant", value_enum)]
    pub variants: Vec<BuildVariant>,
    /// Only these boards (repeatable; default: virt and rpi4).
    #[arg(long = "board", value_enum)]
    pub boards: Vec<Board>,
    #[command(flatten)]
    pub sanitizer: build::SanitizerArgs,
    #[command(flatten)]
    pub boot_files: crate::bootfiles::BootFileArgs,
    /// Skip the host crate tests.
    #[arg(long)]
    pub no_host: bool,
    /// CPUs of the configurations asked for (1..=4; --filter runs its one configuration on N
    /// CPUs). The default set adds its own `smp 4` configurations either way.
    #[arg(long, default_value = "1", value_parser = crate::qemu::parse_smp)]
    pub smp: u8,
    /// Seconds before a QEMU run counts as hung and is killed (twice that for runs without icount).
    #[arg(long, default_value = "120")]
    pub timeout: u64,
}

#[derive(Default)]
struct Tally {
    passed: u64,
    failed: u64,
    skipped: u64,
    /// What failed, one line each, repeated at the end of the run (above the counts) so that a
    /// CI log cut to its tail still names every failure.
    failures: Vec<String>,
}

impl Tally {
    fn fail(&mut self, what: String) {
        self.failed += 1;
        self.failures.push(what);
    }
}

/// The PAuth algorithm the default set keeps: QEMU's default for `max`, the cheapest to emulate.
const DEFAULT_PAUTH_CPU: CpuVariant = CpuVariant::MaxImpdef;

/// The configurations one `cargo xtask test` runs.
struct Selection {
    variants: Vec<BuildVariant>,
    cpus: Vec<CpuVariant>,
    boards: Vec<Board>,
    /// (entry exception level, GIC version) on virt.
    levels: Vec<(u8, u8)>,
    /// The suite again with `ftrace=*` per instrumented build variant.
    ftrace: bool,
    /// CPU variants left out, and why.
    trimmed: Vec<CpuVariant>,
    /// CPUs of the configurations above (`--smp`).
    smp: u8,
    /// The suite on 4 CPUs: (entry level, GIC version) per build variant on virt with
    /// `DEFAULT_PAUTH_CPU`, the first variant's also at EL2 and with GICv3 and on raspi4b.
    smp4: bool,
}

/// (entry level, GIC version) of the `smp 4` configurations every build variant runs, and those
/// only the first variant adds: bring-up through SMC from EL2 and the GICv3 redistributors.
const SMP4_LEVELS: [(u8, u8); 1] = [(1, 2)];
const SMP4_FIRST_VARIANT_LEVELS: [(u8, u8); 2] = [(2, 2), (1, 3)];

const ALL_LEVELS: [(u8, u8); 4] = [(1, 2), (1, 3), (2, 2), (2, 3)];
/// Build variant `mte`'s configurations (CPU, EL, GIC): IMPDEF PAuth at EL1/GICv2 and with EL2
/// entry (HCR_EL2.ATA)/GICv3, and QARMA5 at EL1, in the default set and in --matrix alike.
const MTE_CONFIGURATIONS: [(CpuVariant, u8, u8); 3] =
    [(CpuVariant::MaxImpdef, 1, 2), (CpuVariant::MaxImpdef, 2, 3), (CpuVariant::MaxQarma5, 1, 2)];

impl Selection {
    fn new(args: &TestArgs) -> Self {
        let given_or = |given: &[CpuVariant], default: &[CpuVariant]| {
            if given.is_empty() { default.to_vec() } else { given.to_vec() }
        };
        if !args.filter.is_empty() && !args.matrix {
            // One configuration: the first of what was asked for, else the demo's machine.
            let board = args.boards.first().copied().unwrap_or(Board::Virt);
            let cpu = args.cpus.first().copied().unwrap_or(match board {
                Board::Virt => DEFAULT_PAUTH_CPU,
                Board::Rpi4 => CpuVariant::CortexA72,
            });
            return Self {
                variants: vec![args.variants.first().copied().unwrap_or(BuildVariant::Full)],
                cpus: vec![cpu],
                boards: vec![board],
                levels: vec![(1, 2)],
                ftrace: false,
                trimmed: Vec::new(),
                smp: args.smp,
                smp4: false,
            };
        }
        let default_cpus = [CpuVariant::MaxNoPauth, DEFAULT_PAUTH_CPU, CpuVariant::CortexA72];
        let cpus =
            if args.matrix { given_or(&args.cpus, &CpuVariant::ALL) } else { given_or(&args.cpus, &default_cpus) };
        Self {
            variants: if args.variants.is_empty() { BuildVariant::EVERY.to_vec() } else { args.variants.clone() },
            trimmed: CpuVariant::ALL.into_iter().filter(|cpu| args.cpus.is_empty() && !cpus.contains(cpu)).collect(),
            cpus,
            boards: if args.boards.is_empty() { vec![Board::Virt, Board::Rpi4] } else { args.boards.clone() },
            levels: ALL_LEVELS.to_vec(),
            ftrace: true,
            smp: args.smp,
            smp4: true,
        }
    }

    /// The CPU the `ftrace=*` runs use: one with PAuth, so call-ops meets signed return addresses.
    fn ftrace_cpu(&self) -> CpuVariant {
        [CpuVariant::MaxQarma3, DEFAULT_PAUTH_CPU, CpuVariant::MaxQarma5]
            .into_iter()
            .find(|cpu| self.cpus.contains(cpu))
            .unwrap_or(self.cpus[0])
    }

    /// Says what will run, and what the default set leaves out and why.
    fn describe(&self, args: &TestArgs) {
        let names = |cpus: &[CpuVariant]| cpus.iter().map(|cpu| cpu.name()).collect::<Vec<_>>().join(", ");
        // `mte` has its own configurations (said below); the matrix line is the others'.
        let matrix_variants: Vec<_> = self.variants.iter().filter(|variant| **variant != BuildVariant::Mte).collect();
        let variants = matrix_variants.iter().map(|variant| variant.name()).collect::<Vec<_>>().join(", ");
        let kind = if args.matrix {
            "the whole matrix (--matrix)"
        } else if !args.filter.is_empty() {
            "one configuration (--filter without --matrix)"
        } else {
            "the default set"
        };
        eprintln!("xtask: kernel test configurations, {kind}:");
        if self.boards.contains(&Board::Virt)
            && self.variants.contains(&BuildVariant::Mte)
            && (args.filter.is_empty() || args.matrix)
        {
            let configurations: Vec<_> =
                MTE_CONFIGURATIONS.iter().map(|(cpu, el, gic)| format!("{} EL{el}/GICv{gic}", cpu.name())).collect();
            eprintln!("  virt,mte=on: variant mte in {} (rpi4 and cortex-a72 have no MTE)", configurations.join(", "));
        }
        if self.boards.contains(&Board::Virt) && !matrix_variants.is_empty() {
            let levels = self.levels.iter().map(|(el, gic)| format!("EL{el}/GICv{gic}")).collect::<Vec<_>>().join(", ");
            eprintln!(
                "  virt: variants {variants} x CPUs {} x {levels} ({} QEMU runs)",
                names(&self.cpus),
                matrix_variants.len() * self.cpus.len() * self.levels.len()
            );
            if self.ftrace {
                let traced: Vec<_> = matrix_variants
                    .iter()
                    .filter(|variant| ***variant != BuildVariant::Plain)
                    .map(|v| v.name())
                    .collect();
                eprintln!(
                    "  virt: the suite under `ftrace=*` (every traceable function traced from boot), -cpu {} EL1/GICv3: {}",
                    self.ftrace_cpu().name(),
                    traced.join(", ")
                );
            }
        }
        if self.smp != 1 {
            eprintln!("  the configurations above on {} CPUs (--smp)", self.smp);
        }
        if self.smp4 {
            let first = self.variants.first().map_or("", |variant| variant.name());
            if self.boards.contains(&Board::Virt) && self.cpus.contains(&DEFAULT_PAUTH_CPU) {
                eprintln!(
                    "  smp 4: virt -cpu {} EL1/GICv2: variants {variants}; EL2/GICv2 and EL1/GICv3: {first}",
                    DEFAULT_PAUTH_CPU.name()
                );
            }
            if self.boards.contains(&Board::Rpi4) && self.cpus.contains(&CpuVariant::CortexA72) {
                eprintln!("  smp 4: rpi4: {first}");
            }
        }
        if self.boards.contains(&Board::Rpi4) && self.cpus.contains(&CpuVariant::CortexA72) {
            eprintln!("  rpi4 (QEMU raspi4b, cortex-a72, EL2, GIC-400): variants {variants}");
        }
        if !self.trimmed.is_empty() {
            eprintln!(
                "  trimmed: {}: under icount every PAuth algorithm executes the same instructions as {} \
                 (they differ only in emulation time); `--matrix` runs them",
                names(&self.trimmed),
                DEFAULT_PAUTH_CPU.name()
            );
        }
        if args.filter.is_empty() && self.variants.contains(&BuildVariant::Full) && !args.sanitizer.kasan_short_granules
        {
            eprintln!("  virt: the `kasan_` corpus in full with --kasan-short-granules, EL1/GICv2 (one QEMU run)");
        }
        if args.filter.is_empty() {
            eprintln!("  then: the rpi4 SD card image and serial checks, the failure paths, the bench harness");
        }
    }
}

pub fn run(args: &TestArgs) -> Result<u8, Failure> {
    let start = Instant::now();
    let mut tally = Tally::default();
    if !args.no_host {
        host_tests(&mut tally)?;
    }
    qemu::ensure_installed()?;
    let selection = Selection::new(args);
    let sanitizer = args.sanitizer.options(&selection.variants)?;
    selection.describe(args);
    let Selection { variants, cpus, boards, levels, .. } = &selection;
    let mut timed_out = false;
    let mut unmatched = false;
    let rpi4_dtb = if boards.contains(&Board::Rpi4) && cpus.contains(&CpuVariant::CortexA72) {
        let files = crate::bootfiles::get(&args.boot_files)?;
        eprintln!("xtask: {}", files.source);
        Some(files.dtb)
    } else {
        None
    };
    'variants: for &variant in variants {
        let build_name = format!("{}{}", variant.name(), sanitizer.suffix());
        let mte = variant == BuildVariant::Mte;
        if boards.contains(&Board::Virt) {
            let image = build::kernel_with(Board::Virt, variant, sanitizer)?;
            // `mte` runs its own few configurations (emulated MTE makes every run slow), on the
            // CPUs that have MTE; one configuration with --filter.
            let configurations: Vec<(CpuVariant, u8, u8)> = if mte && (args.filter.is_empty() || args.matrix) {
                MTE_CONFIGURATIONS.to_vec()
            } else {
                cpus.iter()
                    .filter(|cpu| !mte || **cpu != CpuVariant::CortexA72)
                    .flat_map(|&cpu| levels.iter().map(move |&(el, gic)| (cpu, el, gic)))
                    .collect()
            };
            for (cpu, el, gic) in configurations {
                {
                    let machine =
                        Machine { board: Board::Virt, cpu, el, gic, icount: true, dtb: None, mte, smp: selection.smp };
                    let run = run_configuration(&machine, &build_name, &image, args, "", &mut tally)?;
                    timed_out |= run.timed_out;
                    // Every configuration registers the same tests: one empty match is all.
                    if run.unmatched {
                        unmatched = true;
                        break 'variants;
                    }
                }
            }
            // The whole suite on 4 CPUs (bring-up through HVC and SMC, GICv2 and GICv3).
            if selection.smp4 && !mte && cpus.contains(&DEFAULT_PAUTH_CPU) {
                let first = Some(&variant) == variants.first();
                let extra = if first { &SMP4_FIRST_VARIANT_LEVELS[..] } else { &[] };
                for &(el, gic) in SMP4_LEVELS.iter().chain(extra) {
                    let cpu = DEFAULT_PAUTH_CPU;
                    let machine =
                        Machine { board: Board::Virt, cpu, el, gic, icount: true, dtb: None, mte: false, smp: 4 };
                    timed_out |= run_configuration(&machine, &build_name, &image, args, "", &mut tally)?.timed_out;
                }
                // The `smp_*` concurrency tests once more without icount: multi-threaded TCG, so
                // the CPUs really overlap (their overlap witnesses must reach 2).
                if first && args.filter.is_empty() {
                    let cpu = DEFAULT_PAUTH_CPU;
                    let machine = Machine {
                        board: Board::Virt,
                        cpu,
                        el: 1,
                        gic: 2,
                        icount: false,
                        dtb: None,
                        mte: false,
                        smp: 4,
                    };
                    let run = run_configuration(&machine, &build_name, &image, args, "filter=smp_", &mut tally)?;
                    timed_out |= run.timed_out;
                }
            }
            // The whole suite again with the function tracer on every traceable function, from
            // boot to the end (ftrace: "tracing `*` does not hang the kernel").
            if variant != BuildVariant::Plain && !mte && selection.ftrace {
                let cpu = selection.ftrace_cpu();
                let machine =
                    Machine { board: Board::Virt, cpu, el: 1, gic: 3, icount: true, dtb: None, mte: false, smp: 1 };
                timed_out |= run_configuration(&machine, &build_name, &image, args, "ftrace=*", &mut tally)?.timed_out;
            }
            if variant != BuildVariant::Plain && !mte && "probe_sweep".contains(args.filter.as_str()) {
                if crate::stress::sample(&image, variant, cpus[0])? {
                    tally.passed += 1;
                } else {
                    tally.fail(format!("probe sweep sample [variant {}]", variant.name()));
                }
            }
        }
        // QEMU raspi4b: the Pi 4's Cortex-A72, entered at EL2, GIC-400, the Pi 4 device tree.
        if let Some(dtb) = rpi4_dtb.as_ref().filter(|_| !mte) {
            let image = build::kernel_with(Board::Rpi4, variant, sanitizer)?;
            let machine = Machine {
                board: Board::Rpi4,
                cpu: CpuVariant::CortexA72,
                el: 2,
                gic: 2,
                icount: false,
                dtb: Some(dtb.clone()),
                mte: false,
                smp: selection.smp,
            };
            let run = run_configuration(&machine, &build_name, &image, args, "", &mut tally)?;
            timed_out |= run.timed_out;
            if run.unmatched {
                unmatched = true;
                break;
            }
            if selection.smp4 && Some(&variant) == variants.first() {
                let machine = Machine { smp: 4, ..machine };
                timed_out |= run_configuration(&machine, &build_name, &image, args, "", &mut tally)?.timed_out;
            }
        }
    }
    if unmatched {
        println!("no kernel test name contains `{}`", args.filter);
        return Ok(2);
    }
    // The sanitizer corpus once more in the short-granule build of `full` (one configuration:
    // what changes is the heap's tagging and the check thunks, not the machine).
    if args.filter.is_empty() && !sanitizer.short_granules && variants.contains(&BuildVariant::Full) {
        let short = build::SanitizerOptions { short_granules: true };
        let image = build::kernel_with(Board::Virt, BuildVariant::Full, short)?;
        let cpu = if cpus.contains(&CpuVariant::MaxNoPauth) { CpuVariant::MaxNoPauth } else { cpus[0] };
        let machine = Machine { board: Board::Virt, cpu, el: 1, gic: 2, icount: true, dtb: None, mte: false, smp: 1 };
        let build_name = format!("full{}", short.suffix());
        let run = run_configuration(&machine, &build_name, &image, args, "filter=kasan_", &mut tally)?;
        timed_out |= run.timed_out;
    }
    if args.filter.is_empty() && rpi4_dtb.is_some() {
        rpi4_checks(&args.boot_files, &mut tally)?;
    }
    if args.filter.is_empty() {
        let image = build::kernel(Board::Virt, BuildVariant::Full)?;
        failure_paths(&image, &mut tally)?;
        if variants.contains(&BuildVariant::Mte) && boards.contains(&Board::Virt) {
            mte_failure_paths(&mut tally)?;
        }
        let prod = build::kernel(Board::Virt, BuildVariant::Prod)?;
        bench_harness(&prod, &mut tally)?;
        crate::profile::self_test(&mut |name, problem| report_check(&mut tally, name, problem.as_ref()))?;
        report_check(&mut tally, "icount regression gate", crate::bench::gate::check(&prod)?.as_ref());
        let (passed, failures) = crate::demo::test(&args.variants, &args.cpus, &args.boards)?;
        tally.passed += passed;
        tally.failed += failures.len() as u64;
        tally.failures.extend(failures);
    }
    eprintln!("xtask: test took {:.0} s", start.elapsed().as_secs_f64());
    for failure in &tally.failures {
        println!("failed: {failure}");
    }
    println!("{} passed, {} failed, {} skipped", tally.passed, tally.failed, tally.skipped);
    if timed_out {
        return Ok(124);
    }
    Ok(if tally.failed == 0 { 0 } else { 1 })
}

/// `cargo test` for the host crates; their counts join the tally.
fn host_tests(tally: &mut Tally) -> Result<(), Failure> {
    eprintln!("xtask: host crate tests");
    let output = Command::new(env!("CARGO"))
        .current_dir(build::workspace_root())
        .args(["test", "--workspace", "--exclude", "kernel"])
        .output()
        .map_err(|error| Failure::usage(format!("cannot run cargo test: {error}")))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let mut seen = false;
    for line in stdout.lines().filter(|line| line.starts_with("test result:")) {
        seen = true;
        let count = |word: &str| -> u64 {
            line.split([';', '.'])
                .find_map(|part| part.trim().strip_suffix(word).and_then(|n| n.trim().parse().ok()))
                .unwrap_or(0)
        };
        tally.passed += count("passed");
        tally.failed += count("failed");
        tally.skipped += count("ignored");
    }
    if !output.status.success() {
        print!("{stdout}");
        eprint!("{}", String::from_utf8_lossy(&output.stderr));
        if !seen {
            tally.failed += 1;
        }
        tally.failures.push("host crate tests (see `cargo test --workspace --exclude kernel`)".into());
        println!("host crate tests: FAILED");
    } else {
        println!("host crate tests: ok");
    }
    Ok(())
}

/// Runs that must fail the right way: a panic and an unexpected exception end with status 3
/// and their report, a hang is killed on timeout with the running test named, a panic on 4 CPUs
/// stops the other three, a CPU that does not come up (or comes too late) is named and fails the bring-up test.
fn failure_paths(image: &build::KernelImage, tally: &mut Tally) -> Result<(), Failure> {
    let machine = Machine {
        board: Board::Virt,
        cpu: CpuVariant::MaxImpdef,
        el: 1,
        gic: 2,
        icount: false,
        dtb: None,
        mte: false,
        smp: 1,
    };
    // (name, CPUs, kernel command line, expected status, expected line)
    let checks: [(&str, u8, &str, Option<i32>, &str); 10] = [
        ("panic", 1, "run=panic exit=semihosting", Some(ExitStatus::Panic.code()), "panicked at kernel/src/run.rs"),
        (
            "fault",
            1,
            "run=fault exit=semihosting",
            Some(ExitStatus::Panic.code()),
            "unexpected synchronous exception: DataAbort",
        ),
        (
            "unowned-brk",
            1,
            "run=unowned-brk exit=semihosting",
            Some(ExitStatus::Panic.code()),
            "unexpected synchronous exception: Brk (ESR 0xf20001ff)",
        ),
        ("hang", 1, "run=hang exit=semihosting", None, "test start: deliberate_hang"),
        (
            "use-after-free",
            1,
            "run=use-after-free kasan.fault=panic exit=semihosting",
            Some(ExitStatus::Panic.code()),
            "BUG: KASAN: slab-use-after-free",
        ),
        // A panic stops the other CPUs by SGI and says so.
        (
            "panic-stops-cpus",
            4,
            "run=panic exit=semihosting",
            Some(ExitStatus::Panic.code()),
            "panic: stopped 3 of 3 other CPUs",
        ),
        // A CPU that PSCI refuses is named in the banner, and the bring-up test fails instead of
        // the kernel waiting for it.
        (
            "cpu-not-online",
            4,
            "run=test filter=secondary_cpus_are_online smp.fail-cpu=2 exit=semihosting",
            Some(ExitStatus::TestsFailed.code()),
            "CPUs: 3 of 4 online (cpu 2: PSCI INVALID_PARAMETERS)",
        ),
        // A CPU that arrives after the boot CPU gave up on it parks: it is reported and stays
        // out (it once came online on another CPU's stack).
        (
            "cpu-late",
            4,
            "run=test filter=secondary_cpus_are_online smp.late-cpu=2 exit=semihosting",
            Some(ExitStatus::TestsFailed.code()),
            "CPUs: 3 of 4 online (cpu 2: no response within the bring-up wait)",
        ),
        // Local TLB invalidation after a kernel mapping change: the other CPUs keep the old
        // translation, and the shootdown test must see it.
        (
            "smp-local-tlbi",
            4,
            "run=test filter=smp_tlb_shootdown smp.tlbi=local exit=semihosting",
            Some(ExitStatus::TestsFailed.code()),
            "test FAILED: smp_tlb_shootdown",
        ),
        // A probe hit while a re-entered hit is performed (a test-only switch makes the
        // performance call probed code): the panic names the three probes.
        (
            "reenter-twice",
            1,
            "run=sweep sweep.inject=reenter-twice exit=semihosting",
            Some(ExitStatus::Panic.code()),
            "panicked at kernel/src/probes/kprobe_hit.rs:*: kprobe re-entered twice: the probe at kernel::sweep::reentry::third+0x\
             *was hit while the probe at kernel::sweep::reentry::second+0x\
             *inside the handling of the probe at kernel::sweep::reentry::first+0x",
        ),
    ];
    for (name, smp, bootargs, expected_status, expected_line) in checks {
        let machine = Machine { smp, dtb: None, ..machine };
        // The panic report shows each stopped CPU's trace: CPU 1 waits in `panic_witness`, CPU 2
        // panics at the same time as CPU 0 in `panic_too` (and stops, as a second panic must).
        let sections: &[(&str, &str)] = if name == "panic-stops-cpus" {
            &[("cpu 1: stopped", "panic_witness"), ("cpu 2: stopped", "panic_too")]
        } else {
            &[]
        };
        failure_path(&machine, image, (name, bootargs, expected_status, expected_line), sections, tally)?;
    }
    Ok(())
}

/// Whether `text` starts with `pattern`'s first `*`-separated piece and holds the others after
/// it, in order.
fn matches_pieces(text: &str, pattern: &str) -> bool {
    let mut pieces = pattern.split('*');
    let Some(mut rest) = text.strip_prefix(pieces.next().unwrap_or("")) else { return false };
    pieces.all(|piece| rest.find(piece).map(|at| rest = &rest[at + piece.len()..]).is_some())
}

/// Whether a `fp #` line of the log's section that starts with `header` (up to the next line
/// that does not start with two spaces) names `function`.
fn names_under(log: &[crate::log::LogLine], header: &str, function: &str) -> bool {
    let Some(start) = log.iter().position(|line| line.text.starts_with(header)) else {
        return false;
    };
    log[start + 1..]
        .iter()
        .take_while(|line| line.text.starts_with("  "))
        .any(|line| line.text.trim_start().starts_with("fp #") && line.text.contains(function))
}

/// Build variant `mte`'s failure paths: without `mte=on` the kernel says MTE is missing and
/// exits non-zero; with it a use-after-free is a hardware tag check fault that
/// `kasan.fault=panic` turns into the end of the run.
fn mte_failure_paths(tally: &mut Tally) -> Result<(), Failure> {
    let image = build::kernel(Board::Virt, BuildVariant::Mte)?;
    let without = Machine {
        board: Board::Virt,
        cpu: CpuVariant::MaxImpdef,
        el: 1,
        gic: 2,
        icount: false,
        dtb: None,
        mte: false,
        smp: 1,
    };
    let missing = (
        "mte-missing",
        "run=test exit=semihosting",
        Some(ExitStatus::Unsupported.code()),
        "MTE: not available (mte=on missing?)",
    );
    failure_path(&without, &image, missing, &[], tally)?;
    let with = Machine { mte: true, ..without };
    let use_after_free = (
        "mte-use-after-free",
        "run=use-after-free kasan.fault=panic exit=semihosting",
        Some(ExitStatus::Panic.code()),
        "BUG: KASAN: slab-use-after-free",
    );
    failure_path(&with, &image, use_after_free, &[], tally)
}

/// One failure path: the run ends with the expected status (None: still running at the
/// timeout) after logging a line that starts with the expected text, and each (header,
/// function) of `sections` has a frame-pointer line naming the function under the header.
fn failure_path(
    machine: &Machine,
    image: &build::KernelImage,
    (name, bootargs, expected_status, expected_line): (&str, &str, Option<i32>, &str),
    sections: &[(&str, &str)],
    tally: &mut Tally,
) -> Result<(), Failure> {
    {
        let timeout = Duration::from_secs(if expected_status.is_none() { 3 } else { 60 });
        let result = qemu::run(machine, image, bootargs, Some(timeout), false)?;
        let logged = result.log.iter().any(|line| matches_pieces(&line.text, expected_line));
        let sentinel_ok = expected_status
            .is_none_or(|status| result.log.iter().any(|line| line.text == format!("tracelab: exit status {status}")));
        let missing: Vec<String> = sections
            .iter()
            .filter(|(header, function)| !names_under(&result.log, header, function))
            .map(|(header, function)| format!("`{function}` under `{header}`"))
            .collect();
        let ok = result.status == expected_status && logged && sentinel_ok && missing.is_empty();
        println!(
            "failure path [{name}]: {}: status {:?} (expected {expected_status:?}), `{expected_line}` {}{}",
            if ok { "ok" } else { "FAILED" },
            result.status,
            if logged { "logged" } else { "missing" },
            if missing.is_empty() { String::new() } else { format!(", missing {}", missing.join(", ")) }
        );
        if ok {
            tally.passed += 1;
        } else {
            tally.fail(format!("failure path [{name}]"));
            for line in &result.log {
                println!("  {line}");
            }
        }
    }
    Ok(())
}

/// The bench harness under icount: two runs of the baseline suite give identical rows, and the
/// counter really counts instructions (a call is `bl` + `ret`, a PAC-signed call adds `paciasp` and
/// `autiasp`, whatever the PAuth algorithm).
fn bench_harness(image: &build::KernelImage, tally: &mut Tally) -> Result<(), Failure> {
    let bootargs = "run=bench bench=baseline reps=1 clock=cycles icount=1 exit=semihosting";
    let mut runs = Vec::new();
    // The last two on 4 CPUs: icount stays deterministic with the secondaries running.
    let machines = [
        (CpuVariant::MaxQarma5, 1),
        (CpuVariant::MaxQarma5, 1),
        (CpuVariant::CortexA72, 1),
        (DEFAULT_PAUTH_CPU, 4),
        (DEFAULT_PAUTH_CPU, 4),
    ];
    for (cpu, smp) in machines {
        let machine = Machine { board: Board::Virt, cpu, el: 1, gic: 2, icount: true, dtb: None, mte: false, smp };
        let result = qemu::run(&machine, image, bootargs, Some(Duration::from_secs(120)), false)?;
        let rows: Vec<String> =
            result.log.iter().filter_map(|line| line.text.strip_prefix("bench row: ").map(str::to_string)).collect();
        runs.push((result.status, rows));
    }
    let per_op = |rows: &[String], case: &str| -> Option<f64> {
        rows.iter().find_map(|row| {
            let words: Vec<_> = row.split_whitespace().collect();
            (words.get(1) == Some(&case)).then(|| words.get(5)?.parse().ok()).flatten()
        })
    };
    let checks = [
        ("icount runs are identical", runs[0].1 == runs[1].1 && !runs[0].1.is_empty()),
        ("icount runs on 4 CPUs are identical", runs[3].1 == runs[4].1 && !runs[3].1.is_empty()),
        ("all bench runs exit 0", runs.iter().all(|(status, _)| *status == Some(0))),
        ("a call is 2 instructions", per_op(&runs[0].1, "call") == Some(2.0)),
        (
            "a PAC-signed call is 4 instructions on QARMA5 and on the A72",
            per_op(&runs[0].1, "call-pac") == Some(4.0) && per_op(&runs[2].1, "call-pac") == Some(4.0),
        ),
    ];
    for (name, ok) in checks {
        println!("bench harness [{name}]: {}", if ok { "ok" } else { "FAILED" });
        if ok {
            tally.passed += 1;
        } else {
            tally.fail(format!("bench harness [{name}]"));
            for row in &runs[0].1 {
                println!("  {row}");
            }
        }
    }
    Ok(())
}

/// The Raspberry Pi 4 paths that need no board: the SD card image (written with the real boot
/// files, then opened and checked), and bench rows read from QEMU `raspi4b` through a
/// pseudo-terminal, as from a real board's serial line.
fn rpi4_checks(boot_files: &crate::bootfiles::BootFileArgs, tally: &mut Tally) -> Result<(), Failure> {
    let image = build::kernel(Board::Rpi4, BuildVariant::Prod)?;
    let files = crate::bootfiles::get(boot_files)?;
    let read = |path: &std::path::Path| std::fs::read(path).map_err(|error| Failure::usage(error.to_string()));
    let kernel = read(&image.raw)?;
    let card = build::target_dir().join("rpi4/test-sd.img");
    std::fs::create_dir_all(card.parent().expect("has a parent")).map_err(|error| Failure::usage(error.to_string()))?;
    let boot = vec![
        crate::sdimage::BootFile { name: "kernel8.img", data: kernel.clone() },
        crate::sdimage::BootFile { name: "config.txt", data: crate::sdimage::CONFIG_TXT.into() },
        crate::sdimage::BootFile { name: "cmdline.txt", data: b"run=test\n".to_vec() },
        crate::sdimage::BootFile { name: "start4.elf", data: read(&files.start4)? },
        crate::sdimage::BootFile { name: "fixup4.dat", data: read(&files.fixup4)? },
        crate::sdimage::BootFile { name: crate::bootfiles::DTB_NAME, data: read(&files.dtb)? },
    ];
    let written = crate::sdimage::write(&card, &boot).map_err(|error| error.to_string());
    let verified = written.and_then(|()| crate::sdimage::verify(&card, &kernel));
    report_check(tally, "rpi4 SD card image verifies", verified.as_ref().err());

    let machine = Machine {
        board: Board::Rpi4,
        cpu: CpuVariant::CortexA72,
        el: 2,
        gic: 2,
        icount: true,
        dtb: Some(files.dtb),
        mte: false,
        smp: 1,
    };
    // `exit=park`, as on the real board: the kernel prints its exit sentinel and parks, and
    // xtask quits QEMU after reading it. With semihosting QEMU could exit (closing the pty and
    // discarding what xtask had not read yet) before the last rows were read: a race seen under load.
    let bootargs = "run=bench bench=baseline reps=1 clock=cycles icount=1 exit=park";
    let run = qemu::run_via_pty(&machine, &image, bootargs, Duration::from_secs(120))?;
    let rows: Vec<_> = run.log.iter().filter_map(|line| line.text.strip_prefix("bench row: ")).collect();
    let call = rows.iter().find(|row| row.starts_with("baseline call - per_op insn "));
    let problem = match (run.status, call) {
        (Some(0), Some(row)) if row.ends_with(" 2") || row.ends_with(" 2.0") => None,
        (status, row) => Some(format!("status {status:?}, call row {row:?}, {} rows", rows.len())),
    };
    report_check(tally, "rpi4 bench rows through a pseudo-terminal", problem.as_ref());
    Ok(())
}

fn report_check(tally: &mut Tally, name: &str, problem: Option<&String>) {
    match problem {
        None => {
            println!("check [{name}]: ok");
            tally.passed += 1;
        }
        Some(problem) => {
            println!("check [{name}]: FAILED: {problem}");
            tally.fail(format!("check [{name}]"));
        }
    }
}

/// How one configuration's run ended, beyond its counts.
struct ConfigurationRun {
    timed_out: bool,
    /// The filter matched no test (the kernel's KTAP plan was `1..0`).
    unmatched: bool,
}

/// One QEMU run of the kernel suite.
fn run_configuration(
    machine: &Machine,
    build_name: &str,
    image: &build::KernelImage,
    args: &TestArgs,
    extra_bootargs: &str,
    tally: &mut Tally,
) -> Result<ConfigurationRun, Failure> {
    // Under icount virtual time is instructions and every tick waited for costs its interval in
    // instructions: a 1 kHz tick. raspi4b runs without icount (see the module docs): 100 Hz.
    let (hz, icount) = if machine.icount { (1000, 1) } else { (100, 0) };
    let mut bootargs =
        format!("run=test hz={hz} icount={icount} exit=semihosting expect-pauth={}", machine.cpu.expected_pauth());
    if !args.filter.is_empty() {
        bootargs.push_str(&format!(" filter={}", args.filter));
    }
    if !extra_bootargs.is_empty() {
        bootargs.push_str(&format!(" {extra_bootargs}"));
    }
    // Without icount the run is wall time on a shared host (4 vCPUs on 2 cores: the `smp_` set's
    // churn holds every CPU per round; 21 s alone, 62 s beside another QEMU): twice the timeout.
    let timeout = if machine.icount { args.timeout } else { 2 * args.timeout };
    let result = qemu::run(machine, image, &bootargs, Some(Duration::from_secs(timeout)), false)?;
    let configuration = format!(
        "{} variant {}{}{extra_bootargs}",
        machine.describe(),
        build_name,
        if extra_bootargs.is_empty() { "" } else { " " }
    );
    let (mut passed, mut failed, mut skipped) = (0, 0, 0);
    let mut failed_tests = Vec::new();
    let mut running = None;
    let mut done = false;
    let mut sentinel = None;
    for line in &result.log {
        let text = line.text.as_str();
        if let Some(name) = text.strip_prefix("test start: ") {
            running = Some(name.to_string());
        } else if text.starts_with("test ok: ") {
            passed += 1;
            running = None;
        } else if text.starts_with("test skipped: ") {
            skipped += 1;
            running = None;
        } else if let Some(name) = text.strip_prefix("test FAILED: ") {
            failed += 1;
            failed_tests.push(name.split(':').next().unwrap_or(name).to_string());
            running = None;
        } else if text.starts_with("tests done: ") {
            done = true;
        } else if let Some(status) = qemu::exit_sentinel(text) {
            sentinel = Some(status);
        }
    }
    let expected_status = if failed == 0 { 0 } else { 1 };
    let mut problems = Vec::new();
    match result.status {
        None => problems.push(format!(
            "killed after {} s timeout{}",
            timeout,
            running.as_ref().map(|name| format!(" while running test {name}")).unwrap_or_default()
        )),
        Some(status) if status != expected_status => problems.push(format!(
            "kernel exited with status {status}{}",
            running.as_ref().map(|name| format!(" during test {name}")).unwrap_or_default()
        )),
        Some(_) => {}
    }
    if result.status.is_some() && sentinel != result.status {
        problems.push(format!("exit sentinel {sentinel:?} does not match QEMU status {:?}", result.status));
    }
    if !done && result.status.is_some() {
        problems.push("no `tests done` line".into());
    }
    let ktap = Ktap::parse(result.log.iter().map(|line| line.text.as_str()));
    if done && !args.filter.is_empty() && ktap.plan == Some(0) && problems.is_empty() {
        return Ok(ConfigurationRun { timed_out: false, unmatched: true });
    }
    if passed + failed + skipped == 0 {
        problems.push("no test ran".into());
    }
    if let Err(problem) = timestamps_run_forward(&result.log) {
        problems.push(problem);
    }
    // The KTAP lines say the same as the result lines, so KTAP parsers see what xtask counts.
    if done && let Err(problem) = ktap.agrees_with(passed, failed, skipped) {
        problems.push(format!("KTAP output: {problem}"));
    }
    // On several CPUs, a test that needs them (`smp_*`, `race_*`, the cross-CPU calls) must run.
    problems.extend(skipped_as_on_one_cpu(result.log.iter().map(|line| line.text.as_str()), machine.smp));
    // Tracing from boot must have traced something and stopped cleanly at the end.
    let traced = |line: &crate::log::LogLine| {
        line.text
            .strip_prefix("ftrace: ")
            .and_then(|rest| rest.split_once(" calls recorded"))
            .is_some_and(|(count, _)| count.parse::<u64>().is_ok_and(|count| count > 0))
    };
    if extra_bootargs.contains("ftrace=") && result.status.is_some() && !result.log.iter().any(traced) {
        problems.push("ftrace= given but no `ftrace: N calls recorded` line with N > 0".into());
    }
    // A run that died counts the test it was in as failed (and the run itself if none was).
    if !problems.is_empty() && (running.is_some() || failed == 0) {
        failed += 1;
    }
    tally.passed += passed;
    tally.failed += failed;
    tally.skipped += skipped;
    tally.failures.extend(failed_tests.iter().map(|name| format!("kernel test {name} [{configuration}]")));
    if !problems.is_empty() {
        tally.failures.push(format!("kernel tests [{configuration}]: {}", problems.join("; ")));
    }
    let verdict = if failed == 0 && problems.is_empty() { "ok" } else { "FAILED" };
    println!(
        "kernel tests [{configuration}]: {verdict}: {passed} passed, {failed} failed, {skipped} skipped ({:.1} s)",
        result.elapsed.as_secs_f64()
    );
    if verdict != "ok" {
        for problem in &problems {
            println!("  {problem}");
        }
        println!("  --- kernel log ---");
        for line in &result.log {
            println!("  {line}");
        }
        if !result.stderr.trim().is_empty() {
            println!("  --- qemu stderr ---\n{}", result.stderr);
        }
    }
    Ok(ConfigurationRun { timed_out: result.status.is_none(), unmatched: false })
}

/// Tests skipped as on one CPU (`test skipped: NAME (one CPU (run with --smp N))`) in a run on
/// `smp` > 1 CPUs: the kernel did not see the others, and the tests that need them did not run.
fn skipped_as_on_one_cpu<'a>(log: impl Iterator<Item = &'a str>, smp: u8) -> Vec<String> {
    if smp <= 1 {
        return Vec::new();
    }
    log.filter_map(|text| text.strip_prefix("test skipped: ")?.strip_suffix(" (one CPU (run with --smp N))"))
        .map(|name| format!("test {name} skipped as on one CPU, on smp {smp}"))
        .collect()
}

/// Every record carries the counter's time (`S.UUUUUU`), and it never runs backwards.
fn timestamps_run_forward(log: &[crate::log::LogLine]) -> Result<(), String> {
    let microseconds = |text: &str| -> Option<u64> {
        let (seconds, micros) = text.split_once('.')?;
        Some(seconds.parse::<u64>().ok()? * 1_000_000 + micros.parse::<u64>().ok()?)
    };
    let mut previous = 0;
    for line in log.iter().filter(|line| line.level.is_some()) {
        let time = line
            .timestamp
            .as_deref()
            .and_then(microseconds)
            .ok_or_else(|| format!("log line without a timestamp: {line}"))?;
        if time < previous {
            return Err(format!("timestamp runs backwards at: {line}"));
        }
        previous = time;
    }
    Ok(())
}

/// The kernel's KTAP lines: `KTAP version 1`, the plan `1..N`, `ok N NAME [# SKIP REASON]`,
/// `not ok N NAME`. Lines before the version line and other lines are not KTAP's.
#[derive(Debug, Default, PartialEq)]
struct Ktap {
    plan: Option<usize>,
    results: Vec<KtapResult>,
}

#[derive(Debug, PartialEq)]
struct KtapResult {
    ok: bool,
    number: usize,
    name: String,
    /// The reason after `# SKIP`.
    skip: Option<String>,
}

impl Ktap {
    fn parse<'a>(lines: impl Iterator<Item = &'a str>) -> Self {
        let mut ktap = Self::default();
        let mut lines = lines.skip_while(|line| line.trim() != "KTAP version 1").skip(1);
        for line in lines.by_ref() {
            let line = line.trim();
            if let Some(count) = line.strip_prefix("1..").and_then(|count| count.parse().ok()) {
                ktap.plan = Some(count);
                continue;
            }
            let (ok, rest) = match (line.strip_prefix("ok "), line.strip_prefix("not ok ")) {
                (Some(rest), _) => (true, rest),
                (_, Some(rest)) => (false, rest),
                _ => continue,
            };
            let Some((number, rest)) = rest.split_once(' ') else { continue };
            let Ok(number) = number.parse() else { continue };
            let (name, directive) = match rest.split_once(" # ") {
                Some((name, directive)) => (name, Some(directive)),
                None => (rest, None),
            };
            let skip =
                directive.and_then(|directive| directive.strip_prefix("SKIP")).map(|reason| reason.trim().to_string());
            ktap.results.push(KtapResult { ok, number, name: name.to_string(), skip });
        }
        ktap
    }

    /// Checks the plan, the numbering and the counts against the `test ok/skipped/FAILED` lines.
    fn agrees_with(&self, passed: u64, failed: u64, skipped: u64) -> Result<(), String> {
        let plan = self.plan.ok_or("no `KTAP version 1` and `1..N` plan")?;
        if self.results.len() != plan {
            return Err(format!("plan 1..{plan} but {} results", self.results.len()));
        }
        if let Some((index, result)) =
            self.results.iter().enumerate().find(|(index, result)| result.number != index + 1)
        {
            return Err(format!("result {} is numbered {}", index + 1, result.number));
        }
        let count = |ok: bool, skip: bool| {
            self.results.iter().filter(|result| result.ok == ok && result.skip.is_some() == skip).count() as u64
        };
        let (ktap_passed, ktap_skipped, ktap_failed) = (count(true, false), count(true, true), count(false, false));
        if (ktap_passed, ktap_failed, ktap_skipped) != (passed, failed, skipped) {
            return Err(format!(
                "{ktap_passed} ok, {ktap_failed} not ok, {ktap_skipped} skipped; the result lines say \
                 {passed} passed, {failed} failed, {skipped} skipped"
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RUN: &str = "banner\nKTAP version 1\n1..3\ntest start: a\ntest ok: a\nok 1 a\n\
                       test skipped: b c (no SCS in plain)\nok 2 b c # SKIP no SCS in plain\n\
                       ERROR test FAILED: d\nnot ok 3 d\ntests done: 1 passed, 1 failed, 1 skipped";

    #[test]
    fn one_cpu_skips_fail_a_run_on_several_cpus() {
        let log = [
            "test skipped: race_kprobe_arm_disarm (one CPU (run with --smp N))",
            "test skipped: ftrace_traces_irq_context (variant plain has no patchable entries)",
            "test ok: cross_call_runs_on_every_cpu",
        ];
        assert_eq!(
            skipped_as_on_one_cpu(log.into_iter(), 4),
            ["test race_kprobe_arm_disarm skipped as on one CPU, on smp 4"]
        );
        assert!(skipped_as_on_one_cpu(log.into_iter(), 1).is_empty());
    }

    #[test]
    fn a_function_is_named_under_its_cpu_only() {
        let log: Vec<crate::log::LogLine> = [
            "cpu 1: stopped at 0xffffff804009f650",
            "  fp #0 kernel::panic_witness+0x28/0x30 0xffffff804009f650",
            "  fp: 1 frames, end of task",
            "cpu 2: stopped at 0xffffff80400ab048",
            "  scs #0 kernel::panic_too+0x90/0x90 0xffffff804009fb78",
            "  fp #0 kernel::task::idle_loop+0x40/0x44 0xffffff80400ab048",
            "tracelab: exit status 3",
            "  fp #0 kernel::panic_too+0x90/0x90 0xffffff804009fb78",
        ]
        .into_iter()
        .map(|text| crate::log::LogLine { level: None, timestamp: None, text: text.into() })
        .collect();
        assert!(names_under(&log, "cpu 1:", "panic_witness"));
        assert!(names_under(&log, "cpu 1: stopped", "panic_witness"));
        assert!(!names_under(&log, "cpu 2:", "panic_witness"));
        // Only frame-pointer lines of the section count, not a later section's lines.
        assert!(!names_under(&log, "cpu 2:", "panic_too"));
        assert!(!names_under(&log, "cpu 3:", "idle_loop"));
    }

    #[test]
    fn timestamps_must_be_present_and_forward() {
        let line = |timestamp: Option<&str>| crate::log::LogLine {
            level: Some(defmt_parser::Level::Info),
            timestamp: timestamp.map(str::to_string),
            text: "x".into(),
        };
        assert_eq!(timestamps_run_forward(&[line(Some("0.000900")), line(Some("1.000001"))]), Ok(()));
        assert!(
            timestamps_run_forward(&[line(Some("1.000001")), line(Some("0.999999"))])
                .unwrap_err()
                .contains("backwards")
        );
        assert!(timestamps_run_forward(&[line(None)]).unwrap_err().contains("without a timestamp"));
    }

    #[test]
    fn ktap_lines_are_parsed() {
        let ktap = Ktap::parse(RUN.lines());
        assert_eq!(ktap.plan, Some(3));
        assert_eq!(
            ktap.results[1],
            KtapResult { ok: true, number: 2, name: "b c".into(), skip: Some("no SCS in plain".into()) }
        );
        assert_eq!(ktap.results[2], KtapResult { ok: false, number: 3, name: "d".into(), skip: None });
        assert_eq!(ktap.agrees_with(1, 1, 1), Ok(()));
    }

    #[test]
    fn ktap_disagreements_are_found() {
        let ktap = Ktap::parse(RUN.lines());
        assert!(ktap.agrees_with(2, 0, 1).unwrap_err().contains("1 ok, 1 not ok, 1 skipped"));
        let short = Ktap::parse(RUN.replace("1..3", "1..4").lines());
        assert_eq!(short.agrees_with(1, 1, 1), Err("plan 1..4 but 3 results".into()));
        let renumbered = Ktap::parse(RUN.replace("not ok 3", "not ok 5").lines());
        assert_eq!(renumbered.agrees_with(1, 1, 1), Err("result 3 is numbered 5".into()));
        // Without the version line nothing is KTAP.
        let unversioned = Ktap::parse(RUN.replace("KTAP version 1", "").lines());
        assert_eq!(unversioned, Ktap::default());
        assert!(unversioned.agrees_with(1, 1, 1).is_err());
    }
}
