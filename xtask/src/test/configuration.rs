//! One QEMU run of the kernel suite in one configuration, and what makes that run count.

use super::args::TestArgs;
use super::ktap::Ktap;
use super::matrix::{
    DEFAULT_PAUTH_CPU, MTE_CONFIGURATIONS, NOFP_CONFIGURATION, SMP4_FIRST_VARIANT_LEVELS, SMP4_LEVELS, Selection,
};
use super::tally::Tally;
use crate::Failure;
use crate::build::{self, Board, BuildVariant};
use crate::qemu::{self, CpuVariant, Machine};
use std::path::PathBuf;
use std::time::Duration;

/// How the selection's runs ended, beyond their counts.
pub struct Outcome {
    /// A run was killed on its timeout.
    pub timed_out: bool,
    /// The filter matched no test (every configuration registers the same tests).
    pub unmatched: bool,
}

/// The kernel suite in every configuration of `selection`: per build variant, virt's CPUs,
/// levels and `smp 4` runs, the `ftrace=*` run and the probe sweep sample, then raspi4b
/// (`rpi4_dtb`: its device tree, when the selection has it).
pub fn run_selection(
    selection: &Selection,
    sanitizer: build::SanitizerOptions,
    rpi4_dtb: Option<&PathBuf>,
    args: &TestArgs,
    tally: &mut Tally,
) -> Result<Outcome, Failure> {
    let Selection { variants, cpus, boards, levels, .. } = selection;
    let mut timed_out = false;
    let mut unmatched = false;
    // Each configuration run in the order listed here is one unit of `--shard`'s partition.
    let mut ordinal = 0;
    let mut mine = || {
        ordinal += 1;
        super::shard::owns(args, ordinal - 1)
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
                if mine() {
                    let machine =
                        Machine { board: Board::Virt, cpu, el, gic, icount: true, dtb: None, mte, smp: selection.smp };
                    let run = run_configuration(&machine, &build_name, &image, args, "", tally)?;
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
                for &(el, gic) in SMP4_LEVELS.iter().chain(extra).filter(|_| mine()) {
                    let cpu = DEFAULT_PAUTH_CPU;
                    let machine =
                        Machine { board: Board::Virt, cpu, el, gic, icount: true, dtb: None, mte: false, smp: 4 };
                    timed_out |= run_configuration(&machine, &build_name, &image, args, "", tally)?.timed_out;
                }
                // The `smp_*` concurrency tests once more without icount: multi-threaded TCG, so
                // the CPUs really overlap (their overlap witnesses must reach 2).
                if first && args.filter.is_empty() && mine() {
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
                    let run = run_configuration(&machine, &build_name, &image, args, "filter=smp_", tally)?;
                    timed_out |= run.timed_out;
                }
            }
            // The whole suite again with the function tracer on every traceable function, from
            // boot to the end (ftrace: "tracing `*` does not hang the kernel").
            if variant != BuildVariant::Plain && !mte && selection.ftrace && mine() {
                let cpu = selection.ftrace_cpu();
                let machine =
                    Machine { board: Board::Virt, cpu, el: 1, gic: 3, icount: true, dtb: None, mte: false, smp: 1 };
                timed_out |= run_configuration(&machine, &build_name, &image, args, "ftrace=*", tally)?.timed_out;
            }
            if variant != BuildVariant::Plain
                && !mte
                && !args.list
                && "probe_sweep".contains(args.filter.as_str())
                && mine()
            {
                if crate::stress::sample(&image, variant, cpus[0])? {
                    tally.passed += 1;
                } else {
                    tally.fail(format!("probe sweep sample [variant {}]", variant.name()));
                }
            }
        }
        // QEMU raspi4b: the Pi 4's Cortex-A72, entered at EL2, GIC-400, the Pi 4 device tree.
        if let Some(dtb) = rpi4_dtb.filter(|_| !mte) {
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
            if mine() {
                let run = run_configuration(&machine, &build_name, &image, args, "", tally)?;
                timed_out |= run.timed_out;
                if run.unmatched {
                    unmatched = true;
                    break;
                }
            }
            if selection.smp4 && Some(&variant) == variants.first() && mine() {
                let machine = Machine { smp: 4, ..machine };
                timed_out |= run_configuration(&machine, &build_name, &image, args, "", tally)?.timed_out;
            }
        }
    }
    // Build variant `nofp`: the whole suite once, its frame-record tests skipped with their reason.
    if selection.nofp && !unmatched && boards.contains(&Board::Virt) && mine() {
        let image = build::kernel(Board::Virt, BuildVariant::Nofp)?;
        let (cpu, el, gic) = NOFP_CONFIGURATION;
        let machine =
            Machine { board: Board::Virt, cpu, el, gic, icount: true, dtb: None, mte: false, smp: selection.smp };
        timed_out |= run_configuration(&machine, BuildVariant::Nofp.name(), &image, args, "", tally)?.timed_out;
    }
    Ok(Outcome { timed_out, unmatched })
}

/// The sanitizer corpus once more in the short-granule build of `full` (one configuration:
/// what changes is the heap's tagging and the check thunks, not the machine). Returns whether
/// the run was killed on its timeout.
pub fn kasan_short_granules(
    selection: &Selection,
    sanitizer: build::SanitizerOptions,
    args: &TestArgs,
    tally: &mut Tally,
) -> Result<bool, Failure> {
    let (variants, cpus) = (&selection.variants, &selection.cpus);
    let mut timed_out = false;
    // The sanitizer corpus once more in the short-granule build of `full` (one configuration:
    // what changes is the heap's tagging and the check thunks, not the machine).
    if args.filter.is_empty() && !sanitizer.short_granules && variants.contains(&BuildVariant::Full) {
        let short = build::SanitizerOptions { short_granules: true };
        let image = build::kernel_with(Board::Virt, BuildVariant::Full, short)?;
        let cpu = if cpus.contains(&CpuVariant::MaxNoPauth) { CpuVariant::MaxNoPauth } else { cpus[0] };
        let machine = Machine { board: Board::Virt, cpu, el: 1, gic: 2, icount: true, dtb: None, mte: false, smp: 1 };
        let build_name = format!("full{}", short.suffix());
        let run = run_configuration(&machine, &build_name, &image, args, "filter=kasan_", tally)?;
        timed_out |= run.timed_out;
    }
    Ok(timed_out)
}

/// How one configuration's run ended, beyond its counts.
pub struct ConfigurationRun {
    pub timed_out: bool,
    /// The filter matched no test (the kernel's KTAP plan was `1..0`).
    pub unmatched: bool,
}

/// One QEMU run of the kernel suite.
pub fn run_configuration(
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
    // Without icount the run is wall time on a shared host: where the host has fewer cores than
    // the 4 vCPUs, the `smp_` set's churn holds every CPU per round, and another QEMU beside it
    // about triples the run's time. Twice the timeout.
    let timeout = if machine.icount { args.timeout } else { 2 * args.timeout };
    let configuration = format!(
        "{} variant {}{}{extra_bootargs}",
        machine.describe(),
        build_name,
        if extra_bootargs.is_empty() { "" } else { " " }
    );
    if args.list {
        let timeout = Duration::from_secs(timeout);
        return super::list::list_configuration(machine, image, &bootargs, &configuration, timeout, tally);
    }
    let result = qemu::run(machine, image, &bootargs, Some(Duration::from_secs(timeout)), &mut |_| {})?;
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
        } else if let Some(status) = crate::log::exit_sentinel(text) {
            sentinel = Some(status);
        }
    }
    let expected_status = if failed == 0 { 0 } else { 1 };
    let mut problems = Vec::new();
    let during = running.as_ref().map(|name| format!(" during test {name}")).unwrap_or_default();
    match result.status {
        None => problems.push(format!("{}{during}", result.ending)),
        Some(status) if status != expected_status => {
            problems.push(format!("kernel exited with status {status}{during}"))
        }
        Some(_) => {}
    }
    // `result.status` is the first closing line's; a second one means the kernel went on.
    if let (Some(status), Some(last)) = (result.status, sentinel)
        && status != last
    {
        problems.push(format!("two closing lines: exit status {status}, then {last}"));
    }
    if !done && result.status.is_some() {
        problems.push("no `tests done` line".into());
    }
    let ktap = Ktap::parse(result.log.iter().map(|line| line.text.as_str()));
    if let Some(dir) = &args.ktap {
        let saved = super::ktap::save(dir, &configuration, result.log.iter().map(|line| line.text.as_str()));
        saved.map_err(|error| Failure::usage(format!("--ktap {}: {error}", dir.display())))?;
    }
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
    if args.verbose {
        let results = ["test ok: ", "test skipped: ", "test FAILED: "];
        let texts = result.log.iter().map(|line| line.text.as_str());
        texts.filter(|text| results.iter().any(|start| text.starts_with(start))).for_each(|text| println!("  {text}"));
    }
    if verdict != "ok" {
        for problem in &problems {
            println!("  {problem}");
        }
        println!("  --- kernel log ---");
        for line in &result.log {
            println!("  {}", line.render(args.log_style));
        }
        if !result.stderr.trim().is_empty() {
            println!("  --- qemu stderr ---\n{}", result.stderr);
        }
    }
    Ok(ConfigurationRun { timed_out: result.ending.timed_out(), unmatched: false })
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

#[cfg(test)]
mod tests {
    use super::*;

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
    fn timestamps_must_be_present_and_forward() {
        let line = |timestamp: Option<&str>| crate::log::LogLine {
            level: Some(defmt_parser::Level::Info),
            timestamp: timestamp.map(str::to_string),
            text: "x".into(),
            linux: None,
        };
        assert_eq!(timestamps_run_forward(&[line(Some("0.000900")), line(Some("1.000001"))]), Ok(()));
        assert!(
            timestamps_run_forward(&[line(Some("1.000001")), line(Some("0.999999"))])
                .unwrap_err()
                .contains("backwards")
        );
        assert!(timestamps_run_forward(&[line(None)]).unwrap_err().contains("without a timestamp"));
    }
}
