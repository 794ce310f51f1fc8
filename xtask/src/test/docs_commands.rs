//! Every command the README and docs/ show: run here, run smaller, or excluded with a reason.
//!
//! The commands are the `cargo xtask ...` and `cargo test ...` lines of the Markdown files'
//! fenced code blocks and the inline code spans of their prose (a span may wrap onto the next
//! line). Each one, written as the documentation writes it (whitespace collapsed, a trailing
//! `# comment` dropped), must have an entry in [`ACCOUNTS`]: run as written, run through the same
//! code path with smaller parameters (saying how), or excluded with the reason and the smaller
//! run that covers it. A documented command without an entry fails (a host test and the check
//! in `cargo xtask test` both say so), and so does an entry no document shows any more.

use super::tally::Tally;
use crate::Failure;
use crate::build;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// How one documented command is accounted for.
#[derive(Clone, Copy, Debug)]
pub enum Account {
    /// Run exactly as written (this xtask, from the workspace root), expecting this exit status.
    Verbatim { status: u8 },
    /// Run through the same code path with these arguments instead (a placeholder filled, fewer
    /// reps, one CPU variant, output in a scratch directory): `how` says what changed.
    /// `{scratch}` stands for this check's scratch directory.
    Smaller { args: &'static [&'static str], how: &'static str },
    /// Not run by this check: why, and the run of `cargo xtask test` (or CI) that covers it.
    Excluded { reason: &'static str, covered_by: &'static str },
}

use Account::{Excluded, Smaller, Verbatim};

/// The name the check saves its bench run under (`bench --save`), and compares and reports.
const SAVED: &str = "docs-commands-check";

/// Every documented command, in the order they run. Runs that others reuse come first: the
/// saved bench run feeds `bench compare` and `bench report`.
pub const ACCOUNTS: &[(&str, Account)] = &[
    // Quick: help and refusals.
    ("cargo xtask", Verbatim { status: 2 }),
    ("cargo xtask --version", Verbatim { status: 0 }),
    ("cargo xtask qemu --help", Verbatim { status: 0 }),
    ("cargo xtask bench --help", Verbatim { status: 0 }),
    ("cargo xtask help COMMAND", Smaller { args: &["help", "stress"], how: "COMMAND filled with `stress`" }),
    ("cargo xtask COMMAND --help", Smaller { args: &["profile", "--help"], how: "COMMAND filled with `profile`" }),
    ("cargo xtask setup --dry-run", Verbatim { status: 0 }),
    // The demo and the runs the docs show on the kernel.
    (
        "cargo xtask qemu",
        Excluded {
            reason: "run as written by the check of two commands at once, in this same run",
            covered_by: "check [a demo and a bench at once both finish]",
        },
    ),
    (
        "cargo xtask qemu --append run=panic",
        Excluded {
            reason: "the failure paths' `panic` run (the same kernel command line, status 3 and the report checked)",
            covered_by: "the failure paths of `cargo xtask test`, and the qemu command line's path by the runs here",
        },
    ),
    ("cargo xtask qemu --variant plain --append \"run=test filter=shadow\"", Verbatim { status: 0 }),
    ("cargo xtask qemu --log linux", Verbatim { status: 0 }),
    (
        "cargo xtask qemu --smp N",
        Excluded {
            reason: "the demo on several CPUs: a boot of its own for what the suite's runs on 4 CPUs already boot",
            covered_by: "the smp 4 configurations of `cargo xtask test` and `cargo xtask qemu` here",
        },
    ),
    (
        "cargo xtask qemu --board rpi4",
        Excluded {
            reason: "needs the Pi 4 boot files fetched from Debian, and raspi4b runs without icount (slow)",
            covered_by: "the raspi4b configurations and Pi 4 checks of `cargo xtask test` (same image and boot path)",
        },
    ),
    ("cargo xtask qemu --append \"ftrace=kernel::*\"", Verbatim { status: 0 }),
    (
        "cargo xtask qemu --ftrace-graph PATTERN",
        Excluded {
            reason: "a demo boot of its own for the function-graph tracer the suite already drives",
            covered_by: "the fgraph_* kernel tests of `cargo xtask test` (entry and exit events, returns, walkers) and \
                         xtask's host test of a captured function_graph trace's lines",
        },
    ),
    ("cargo xtask qemu --variant mte", Verbatim { status: 0 }),
    ("cargo xtask qemu --variant nofp", Verbatim { status: 0 }),
    (
        "cargo xtask qemu --variant mte --run use-after-free --kasan report",
        Excluded {
            reason: "a use-after-free in mte, reported and survived: the mte failure paths' own run",
            covered_by: "the mte failure paths of `cargo xtask test` (the HW_TAGS report's fields checked)",
        },
    ),
    ("cargo xtask qemu --variant mte --append kasan.mode=async", Verbatim { status: 0 }),
    // The profiler.
    ("cargo xtask profile --unwinder both kasan-boot", Verbatim { status: 0 }),
    (
        "cargo xtask profile --unwinder both --cpu max,pauth=off kasan-boot",
        Excluded {
            reason: "the README's command on another CPU variant: the same run with QEMU's -cpu changed",
            covered_by: "`cargo xtask profile --unwinder both kasan-boot` here",
        },
    ),
    (
        "cargo xtask profile [--unwinder fp|scs|sframe|both|all] [--every N | --hz N] [--variant V] [--cpu V] [--out DIR] \
         [--timeout S] WORKLOAD",
        Excluded {
            reason: "the synopsis",
            covered_by: "`cargo xtask profile --unwinder both kasan-boot` here, the profiler's self-test in `cargo xtask test`",
        },
    ),
    ("cargo xtask profile --unwinder all --cpu max,pauth=off kasan-boot", Verbatim { status: 0 }),
    (
        "cargo xtask profile --unwinder sframe|all",
        Excluded {
            reason: "names the option's two new values in prose",
            covered_by: "`cargo xtask profile --unwinder all --cpu max,pauth=off kasan-boot` here (all three walkers)",
        },
    ),
    (
        "cargo xtask bench kasan-boot --mode icount --cpu max,pauth=off",
        Excluded {
            reason: "every stack-collection case of the workload (minutes under icount)",
            covered_by: "`cargo xtask profile --unwinder all --cpu max,pauth=off kasan-boot` here (the same workload, every walker)",
        },
    ),
    // Events: one run as the docs show it; the other spellings are covered by it.
    ("cargo xtask bench probes --events --mode icount --cpu max,pauth=off", Verbatim { status: 0 }),
    (
        "cargo xtask bench probes ftrace --events --mode icount --cpu max,pauth=off",
        Excluded {
            reason: "the cycle model's event counts: the ftrace suite's rows beside the probes'",
            covered_by: "`cargo xtask bench probes --events --mode icount --cpu max,pauth=off` here",
        },
    ),
    (
        "cargo xtask bench probes ftrace --events --cache cold --mode icount --cpu max,pauth=off",
        Excluded {
            reason: "the cold cache mode's figures for the uprobe and ftrace rows (a cache model on every access: minutes)",
            covered_by: "`cargo xtask bench probes --events --mode icount --cpu max,pauth=off` here, the cache model's host tests",
        },
    ),
    (
        "cargo xtask bench stacktrace depot kasan-boot --events --mode icount --cpu max,pauth=off",
        Excluded {
            reason: "the other suites' event figures (kasan-boot's workload takes minutes under icount)",
            covered_by: "`cargo xtask bench probes --events --mode icount --cpu max,pauth=off` here (the same row markers)",
        },
    ),
    (
        "cargo xtask bench mca",
        Excluded {
            reason: "needs Debian's LLVM 19 tools (llvm-mca-19, llvm-objdump-19), which the test run does not install",
            covered_by: "the host tests of `bench mca` on a built kernel's disassembly and llvm-mca's report (xtask/fixtures/mca)",
        },
    ),
    (
        "cargo xtask bench calibrate EVENTS BOARD",
        Excluded {
            reason: "the synopsis; a run needs a board's PMU cycles",
            covered_by: "the host test of `bench calibrate` on a synthetic PMU fixture",
        },
    ),
    (
        "cargo xtask bench --events",
        Excluded {
            reason: "names the flag in prose",
            covered_by: "`cargo xtask bench probes --events --mode icount --cpu max,pauth=off` here",
        },
    ),
    (
        "cargo xtask bench ... --events --mode icount",
        Excluded {
            reason: "a template",
            covered_by: "`cargo xtask bench probes --events --mode icount --cpu max,pauth=off` here",
        },
    ),
    (
        "cargo xtask bench SUITE... --events --mode icount",
        Excluded {
            reason: "a template",
            covered_by: "`cargo xtask bench probes --events --mode icount --cpu max,pauth=off` here",
        },
    ),
    (
        "cargo xtask profile",
        Excluded {
            reason: "names the command in prose; a run needs a WORKLOAD",
            covered_by: "`cargo xtask profile --unwinder both kasan-boot` here",
        },
    ),
    (
        "cargo xtask profile [--unwinder fp|scs|sframe|both|all] [--every N | --hz N] [--variant full|prod|plain] [--cpu VARIANT] \
         [--out DIR] [--timeout S] WORKLOAD",
        Excluded {
            reason: "the synopsis",
            covered_by: "`cargo xtask profile --unwinder both kasan-boot` here, the profiler's self-test in `cargo xtask test`",
        },
    ),
    // Benchmarks: one saved run here feeds compare and report.
    (
        "cargo xtask bench baseline --mode icount --cpu max,pauth=off --save a",
        Smaller {
            args: &[
                "bench",
                "baseline",
                "--mode",
                "icount",
                "--cpu",
                "max,pauth=off",
                "--save",
                SAVED,
                "--force",
                "--out",
                "{scratch}/saved-run",
            ],
            how: "saved as `docs-commands-check` (with --force) instead of a user's `a`, its results in a scratch \
                  directory instead of target/bench",
        },
    ),
    (
        "cargo xtask bench compare a b",
        Smaller { args: &["bench", "compare", SAVED, SAVED], how: "the run saved here compared with itself" },
    ),
    (
        "cargo xtask bench compare OLD NEW",
        Smaller {
            args: &["bench", "compare", SAVED, "{scratch}/saved.json"],
            how: "OLD a saved name, NEW a results.json (the same run copied)",
        },
    ),
    (
        "cargo xtask bench report --from RUN docs/results",
        Smaller {
            args: &["bench", "report", "--from", SAVED, "{scratch}/pages"],
            how: "RUN the run saved here, pages written to a scratch directory instead of the tracked docs/results",
        },
    ),
    (
        "cargo xtask bench report [--from RUN] (DIR | --force) [--peer linux|RUN]",
        Excluded { reason: "the synopsis", covered_by: "`bench report --from RUN docs/results` here, run smaller" },
    ),
    // Without DIR or --force it refuses to overwrite the tracked docs/results.
    ("cargo xtask bench report", Verbatim { status: 2 }),
    (
        "cargo xtask bench SUITE --mode wall",
        Smaller {
            args: &[
                "bench",
                "baseline",
                "--mode",
                "wall",
                "--reps",
                "3",
                "--cpu",
                "max,pauth=off",
                "--out",
                "{scratch}/wall",
            ],
            how: "SUITE filled with baseline, 3 reps on one CPU variant",
        },
    ),
    (
        "cargo xtask bench kasan-boot --variant mte --mode icount",
        Excluded {
            reason: "kasan-boot's whole icount run, about half a minute",
            covered_by: "`cargo xtask profile --unwinder both kasan-boot` here (the same workload) and the mte failure paths",
        },
    ),
    (
        "cargo xtask bench cpus --smp 2",
        Excluded {
            reason: "the cpus suite on two CPUs in both modes: minutes",
            covered_by: "the bench harness's icount runs on 4 CPUs and the smp 4 configurations' uprobe slot tests",
        },
    ),
    (
        "cargo xtask bench --smp N",
        Excluded {
            reason: "every suite on N CPUs: the whole bench",
            covered_by: "the bench harness's icount runs on 4 CPUs",
        },
    ),
    (
        "cargo xtask bench SUITE --mode icount --cpu max,pauth=off",
        Excluded {
            reason: "the icount gate's own run",
            covered_by: "the icount regression gate of `cargo xtask test` (baseline, probes, ftrace, stacktrace, depot)",
        },
    ),
    (
        "cargo xtask bench stacktrace --mode icount --cpu max,pauth=off",
        Excluded { reason: "the icount gate's own run", covered_by: "the icount regression gate (suite stacktrace)" },
    ),
    (
        "cargo xtask bench probes --mode icount --cpu max,pauth=off",
        Excluded { reason: "the icount gate's own run", covered_by: "the icount regression gate (suite probes)" },
    ),
    (
        "cargo xtask bench baseline probes --mode icount --cpu max,pauth=off --variant nofp",
        Excluded {
            reason: "a measurement of the nofp image (the suites' rows, about a minute under icount)",
            covered_by: "the icount regression gate (the same suites in prod) and the nofp configuration of `cargo xtask test` (the same image)",
        },
    ),
    (
        "cargo xtask bench probes --mode icount --cpu max,pauth=off --variant prod",
        Excluded { reason: "the icount gate's own run", covered_by: "the icount regression gate (suite probes, prod)" },
    ),
    (
        "cargo xtask bench probes ftrace --mode icount --cpu max,pauth=off --variant prod",
        Excluded {
            reason: "the icount gate's own run",
            covered_by: "the icount regression gate (suites probes and ftrace, prod)",
        },
    ),
    (
        "cargo xtask bench --update-baseline",
        Excluded {
            reason: "rewrites the tracked xtask/baseline/icount.json",
            covered_by: "the icount regression gate (the same suites, CPU and variant, compared instead of written)",
        },
    ),
    (
        "cargo xtask bench kasan-replay --mode icount --cpu max,pauth=off",
        Excluded {
            reason: "the whole replay of Linux's boot allocations in every case: about half a minute",
            covered_by: "the kernel test `replayed_boot_prefix_is_clean` (the trace's first allocations, `fp` and `scs`)",
        },
    ),
    (
        "cargo xtask bench kasan-replay --mode icount --cpu max,pauth=off --smp 4",
        Excluded {
            reason: "the whole replay of Linux's boot allocations on four CPUs in every case: about two minutes",
            covered_by: "the kernel test `replayed_boot_prefix_is_clean` (the trace's first allocations, `fp` and `scs`)",
        },
    ),
    (
        "cargo xtask profile --unwinder all replay",
        Excluded {
            reason: "the whole replay of Linux's boot allocations under the profiler: about two minutes",
            covered_by: "`cargo xtask profile --unwinder all --cpu max,pauth=off kasan-boot` here (every walker) and the kernel test `replayed_boot_prefix_is_clean` (the workload's replay)",
        },
    ),
    (
        "cargo xtask bench kasan-boot",
        Excluded {
            reason: "every CPU variant in both modes",
            covered_by: "`cargo xtask profile --unwinder both kasan-boot` here (the same workload) and the demo checks' bench runs",
        },
    ),
    (
        "cargo xtask bench",
        Excluded {
            reason: "every suite on every CPU variant in both modes: tens of minutes",
            covered_by: "the icount regression gate, the bench harness and the smaller bench runs here",
        },
    ),
    (
        "cargo xtask bench [SUITE...] [--cpu VARIANT]... [--variant full|prod|plain] [--mode icount|wall|both] \
         [--reps N] [--out DIR]",
        Excluded { reason: "the synopsis", covered_by: "the bench runs here and the icount regression gate" },
    ),
    (
        "cargo xtask bench [SUITE...] [--cpu VARIANT]... [--variant full|prod|plain] [--mode icount|wall|both] \
         [--kasan-short-granules] [--reps N] [--out DIR] [--save NAME [--force]] [--report DIR] [--board virt|rpi4] \
         [--serial PATH] [--events [--cache [warm|cold]]] [--peer linux|RUN]",
        Excluded { reason: "the synopsis", covered_by: "the bench runs here and the icount regression gate" },
    ),
    (
        "cargo xtask bench baseline --board rpi4 --serial /dev/ttyUSB0",
        Excluded {
            reason: "reads a real Raspberry Pi 4 on a serial port",
            covered_by: "the serial decoder's host tests and the Pi 4 checks (the same image on QEMU raspi4b)",
        },
    ),
    // The probe sweep: long runs outside the test suite, with a sample inside it.
    (
        "cargo xtask stress probes",
        Excluded {
            reason: "the whole sweep: every probeable word of every function, minutes per tracer scheme",
            covered_by: "the sweep sample of `cargo xtask test` (32 functions in full and prod)",
        },
    ),
    (
        "cargo xtask stress probes --ftrace",
        Excluded { reason: "the whole sweep with tracing", covered_by: "the sweep sample of `cargo xtask test`" },
    ),
    (
        "cargo xtask stress probes --smp 4",
        Excluded {
            reason: "the whole 4-CPU sweep (about an hour for all runs)",
            covered_by: "the sweep sample on 4 CPUs of `cargo xtask test` (8 functions)",
        },
    ),
    (
        "cargo xtask stress probes --smp 4 --watchdog 30000 --ftrace",
        Excluded {
            reason: "the whole 4-CPU sweep with tracing",
            covered_by: "the sweep sample on 4 CPUs of `cargo xtask test`",
        },
    ),
    (
        "cargo xtask stress probes --smp 4 --variant prod --watchdog 30000",
        Excluded {
            reason: "the whole 4-CPU sweep in prod (minutes)",
            covered_by: "the sweep sample on 4 CPUs of `cargo xtask test`",
        },
    ),
    (
        "cargo xtask stress probes [--variant V]... [--cpu V] [--functions N] [--seed N] \
         [--probe FUNCTION+OFFSET:METHOD] [--ftrace] [--timeout S] [--shard K/N [--out DIR]]",
        Excluded { reason: "the synopsis", covered_by: "the sweep samples of `cargo xtask test`" },
    ),
    (
        "cargo xtask stress probes --variant prod",
        Excluded {
            reason: "the whole sweep in prod (minutes)",
            covered_by: "the sweep sample of `cargo xtask test` in prod",
        },
    ),
    (
        "cargo xtask stress probes --smp 4 --variant prod --seed 4 --functions 40 --only kernel::mm",
        Excluded {
            reason: "the sweep's timing subset (19 functions on 4 CPUs: minutes under load)",
            covered_by: "the sweep sample on 4 CPUs of `cargo xtask test` (the same path, 8 functions)",
        },
    ),
    (
        "cargo xtask stress probes --smp 4 --variant prod --seed 4 --functions 40 --only kernel::mm --icount",
        Verbatim { status: 0 },
    ),
    (
        "cargo xtask stress probes --shard K/N",
        Excluded {
            reason: "a part of the whole sweep",
            covered_by: "the sweep sample of `cargo xtask test` in prod, run again as shards 1/2 and 2/2 and merged",
        },
    ),
    ("cargo xtask merge", Verbatim { status: 2 }),
    (
        "cargo xtask merge DIR... [--out DIR]",
        Excluded {
            reason: "the synopsis",
            covered_by: "the merge of the sweep sample's two shards in `cargo xtask test`, and merge's host tests",
        },
    ),
    (
        "cargo xtask merge target/shard",
        Excluded {
            reason: "needs the shards of a whole sweep",
            covered_by: "the merge of the sweep sample's two shards in `cargo xtask test`",
        },
    ),
    (
        "cargo xtask stress probes --probe FUNCTION+OFFSET:METHOD",
        Excluded {
            reason: "a template printed with a failure: FUNCTION+OFFSET:METHOD names the probe that failed",
            covered_by: "the sweep sample of `cargo xtask test` (the same batch path) and the argument checks' tests of --probe",
        },
    ),
    // The figures' own command: the disk part only (its builds and test run are the slow part).
    (
        "cargo xtask measure [--variant V]... [--no-builds] [--no-test]",
        Smaller {
            args: &["measure", "--no-builds", "--no-test"],
            how: "with --no-builds --no-test: the commit, machine, load and target/'s size",
        },
    ),
    (
        "cargo xtask measure --no-builds",
        Excluded {
            reason: "times a whole `cargo xtask test` (about 11 minutes)",
            covered_by: "`cargo xtask measure [--variant V]... [--no-builds] [--no-test]` here, run with --no-builds --no-test",
        },
    ),
    (
        "cargo xtask measure",
        Excluded {
            reason: "builds every variant from an empty target directory and runs the whole test: tens of minutes",
            covered_by: "`measure --no-builds --no-test` here; the builds it times are the builds every run makes",
        },
    ),
    (
        "cargo xtask measure --no-test",
        Excluded {
            reason: "builds every variant from an empty target directory: minutes each",
            covered_by: "`measure --no-builds --no-test` here; the builds it times are the builds every run makes",
        },
    ),
    // The board and the host: not runnable here.
    (
        "cargo xtask setup",
        Excluded {
            reason: "installs QEMU through apt as root",
            covered_by: "`cargo xtask setup --dry-run` here and setup's host tests",
        },
    ),
    (
        "cargo xtask sdimage",
        Excluded {
            reason: "needs the Pi 4 boot files fetched from Debian",
            covered_by: "the Pi 4 checks of `cargo xtask test`, which build and verify an SD image",
        },
    ),
    (
        "cargo xtask sdimage [--variant prod] [--run demo|test|bench] [--bench SUITES] [--reps N]",
        Excluded { reason: "the synopsis", covered_by: "the Pi 4 checks of `cargo xtask test`" },
    ),
    (
        "cargo xtask sdimage --run bench --bench baseline",
        Excluded {
            reason: "needs the Pi 4 boot files fetched from Debian",
            covered_by: "the Pi 4 checks of `cargo xtask test` (the image's command line is a host test of sdimage)",
        },
    ),
    (
        "cargo xtask flash",
        Excluded { reason: "writes a removable block device", covered_by: "flash's host tests on a fake sysfs" },
    ),
    (
        "cargo xtask flash --device /dev/sdX",
        Excluded { reason: "writes a removable block device", covered_by: "flash's host tests on a fake sysfs" },
    ),
    (
        "cargo xtask monitor",
        Excluded { reason: "reads a real board's serial port", covered_by: "the serial decoder's host tests" },
    ),
    (
        "cargo xtask monitor --serial /dev/ttyUSB0",
        Excluded { reason: "reads a real board's serial port", covered_by: "the serial decoder's host tests" },
    ),
    (
        "cargo xtask monitor --serial /dev/ttyUSB0 [--variant prod]",
        Excluded { reason: "reads a real board's serial port", covered_by: "the serial decoder's host tests" },
    ),
    // The test runner and CI themselves.
    ("cargo xtask test", Excluded { reason: "this run itself", covered_by: "CI (`.ci/run`)" }),
    (
        "cargo xtask test --matrix",
        Excluded {
            reason: "every CPU variant: the long form of this run",
            covered_by: "the default set of this run (the algorithms it leaves out execute the same instructions)",
        },
    ),
    (
        "cargo xtask test --filter NAME",
        Excluded { reason: "one configuration of this run", covered_by: "this run's configuration runs" },
    ),
    (
        "cargo xtask test --filter \"user \"",
        Excluded { reason: "one configuration of this run", covered_by: "this run's configuration runs" },
    ),
    (
        "cargo xtask test --filter NAME --smp 4",
        Excluded { reason: "one configuration of this run", covered_by: "this run's smp 4 configurations" },
    ),
    (
        "cargo xtask test --smp N --filter NAME",
        Excluded { reason: "one configuration of this run", covered_by: "this run's smp 4 configurations" },
    ),
    (
        "cargo xtask test --filter NAME --matrix",
        Excluded { reason: "part of the long form of this run", covered_by: "this run's configuration runs" },
    ),
    (
        "cargo xtask test --no-host --filter race --smp 4",
        Excluded { reason: "one configuration of this run", covered_by: "this run's smp 4 configurations" },
    ),
    (
        "cargo xtask test --no-host --filter my_check",
        Excluded { reason: "a template for a new test", covered_by: "this run's configuration runs" },
    ),
    (
        "cargo xtask test --list [--filter NAME]",
        Smaller {
            args: &[
                "test",
                "--list",
                "--no-host",
                "--filter",
                "shadow",
                "--variant",
                "plain",
                "--board",
                "virt",
                "--cpu",
                "max,pauth=off",
            ],
            how: "one configuration (plain, virt, max,pauth=off)",
        },
    ),
    (
        "cargo xtask test --ktap DIR ...",
        Smaller {
            args: &[
                "test",
                "--no-host",
                "--filter",
                "shadow",
                "--variant",
                "plain",
                "--board",
                "virt",
                "--cpu",
                "max,pauth=off",
                "--ktap",
                "{scratch}/ktap",
                "-v",
            ],
            how: "one configuration (plain, virt, max,pauth=off, the `shadow` tests), KTAP into the scratch directory, with -v",
        },
    ),
    (
        "cargo xtask test -v ...",
        Excluded {
            reason: "the same run as `--ktap DIR ...` here",
            covered_by: "the `--ktap DIR ...` run of this check (with -v)",
        },
    ),
    (
        "cargo xtask test --ktap DIR",
        Excluded {
            reason: "the same option as `--ktap DIR ...` here",
            covered_by: "the `--ktap DIR ...` run of this check",
        },
    ),
    (
        "cargo xtask test --filter kasan_ --ktap DIR",
        Excluded {
            reason: "the kasan corpus once more (the slowest tests of the suite)",
            covered_by: "the corpus in this run's configurations, and the `--ktap DIR ...` run of this check",
        },
    ),
    (
        "cargo xtask test --no-host --filter kasan_fuzz_whole --timeout 1500",
        Excluded {
            reason: "the whole sanitizer soundness fuzz runs for minutes (a long run outside the test suite)",
            covered_by: "`kasan_fuzz_sample` and `kasan_fuzz_notices_in_band_header` in this run's configurations (the same \
                         code on fewer sizes and distances)",
        },
    ),
    // Linux beside the lab: long runs outside the test suite.
    (
        "cargo xtask peer linux",
        Excluded {
            reason: "fetches Debian's arm64 kernel package and boots Linux under icount (minutes, 300 MB)",
            covered_by: "the host tests of the init's line protocol and of the allocation-trace converter",
        },
    ),
    (
        "cargo xtask bench probes ftrace stacktrace --mode icount --cpu max,pauth=off --peer linux",
        Excluded {
            reason: "boots Debian's kernel under icount first (fetching its package the first time)",
            covered_by: "the peer column's host tests (the mapping against the baseline's rows) and the bench runs here",
        },
    ),
    (
        "cargo xtask peer linux [--fetch-only | --alloc-trace [--replace-trace] | --events]",
        Excluded { reason: "the synopsis", covered_by: "the host tests of `xtask/src/peer`" },
    ),
    (
        "cargo xtask peer linux --events",
        Excluded {
            reason: "boots Linux under icount with the events plugin counting every instruction",
            covered_by: "the host tests of the row windows (`xtask/src/peer/profile.rs`) and of the count's lines",
        },
    ),
    (
        "cargo xtask peer linux --alloc-trace",
        Excluded {
            reason: "boots Linux on 4 CPUs with 4 GiB and copies 75 MB of trace out",
            covered_by: "the converter's host tests on a fixture recorded from a real run",
        },
    ),
    // Probes from the command line.
    (
        "cargo xtask qemu --kprobe kernel::task::tick:brk-step --kretprobe kernel::demo::depot_statistics:brk-step",
        Verbatim { status: 0 },
    ),
    (
        "cargo xtask qemu --kprobe nope:simulate",
        Excluded {
            reason: "run as written by the argument checks' own check, which also proves QEMU never started",
            covered_by: "check [`cargo xtask qemu --kprobe nope:simulate` exits 2 before QEMU starts]",
        },
    ),
    (
        "cargo xtask stress probes --probe foo",
        Excluded {
            reason: "run as written by the argument checks' own check, which also proves QEMU never started",
            covered_by: "check [`cargo xtask stress probes --probe foo` exits 2 before QEMU starts]",
        },
    ),
    (
        "cargo xtask qemu --run test --filter NAME",
        Excluded {
            reason: "a template: NAME is any test's name",
            covered_by: "`qemu --variant plain --append \"run=test filter=shadow\"` here, and the filter check's host tests",
        },
    ),
    ("cargo xtask lint", Excluded { reason: "a step of its own in CI", covered_by: "CI (`.ci/run`: lint, then test)" }),
    (
        "cargo test -p CRATE",
        Excluded { reason: "one host crate's tests", covered_by: "this run's host tests (every host crate)" },
    ),
    (
        "cargo test -p unwind",
        Excluded {
            reason: "one host crate's tests (alone, cargo would rebuild it with other features)",
            covered_by: "this run's host tests (every host crate)",
        },
    ),
    (
        "cargo test -p xtask sframe",
        Excluded { reason: "part of xtask's tests", covered_by: "this run's host tests (xtask's included)" },
    ),
];

/// One command as the documentation writes it, and where.
#[derive(Debug, PartialEq, Eq)]
pub struct Documented {
    pub command: String,
    /// `path:line` of each place that shows it.
    pub places: Vec<String>,
}

/// The Markdown files whose commands count: the README and everything under docs/.
fn markdown_files(root: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, files: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, files);
            } else if path.extension().is_some_and(|extension| extension == "md") {
                files.push(path);
            }
        }
    }
    let mut files = vec![root.join("README.md")];
    walk(&root.join("docs"), &mut files);
    files.sort();
    files
}

/// Every documented command under `root`, each once, in the order first shown.
pub fn documented(root: &Path) -> Vec<Documented> {
    let mut found: Vec<Documented> = Vec::new();
    for file in markdown_files(root) {
        let Ok(text) = std::fs::read_to_string(&file) else { continue };
        let name = file.strip_prefix(root).unwrap_or(&file).display().to_string();
        for (line, command) in commands_in(&text) {
            let place = format!("{name}:{line}");
            match found.iter_mut().find(|known| known.command == command) {
                Some(known) => known.places.push(place),
                None => found.push(Documented { command, places: vec![place] }),
            }
        }
    }
    found
}

fn is_command(text: &str) -> bool {
    ["cargo xtask", "cargo test"].iter().any(|start| {
        text.strip_prefix(start).is_some_and(|rest| rest.is_empty() || rest.starts_with(char::is_whitespace))
    })
}

fn collapse(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The commands of one Markdown text with their line numbers: fenced lines starting with
/// `cargo xtask`/`cargo test` (a trailing `# comment` dropped, indented continuation lines
/// joined), and inline code spans of the prose that start so (a span may wrap once).
pub fn commands_in(text: &str) -> Vec<(usize, String)> {
    let mut commands = Vec::new();
    let mut prose = String::new();
    let mut fenced = false;
    let lines: Vec<&str> = text.lines().collect();
    let mut index = 0;
    while index < lines.len() {
        let line = lines[index];
        index += 1;
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            prose.push('\n');
            continue;
        }
        if !fenced {
            prose.push_str(line);
            prose.push('\n');
            continue;
        }
        prose.push('\n');
        let trimmed = line.trim();
        if !is_command(trimmed) {
            continue;
        }
        let number = index;
        let mut command = trimmed.to_string();
        while index < lines.len()
            && lines[index].starts_with(char::is_whitespace)
            && lines[index].trim_start().starts_with('[')
        {
            command.push(' ');
            command.push_str(lines[index].trim());
            prose.push('\n');
            index += 1;
        }
        if let Some(at) = command.find(" #") {
            command.truncate(at);
        }
        commands.push((number, collapse(&command)));
    }
    let mut rest = prose.as_str();
    let mut consumed_lines = 1;
    while let Some(open) = rest.find('`') {
        consumed_lines += rest[..open].matches('\n').count();
        let after = &rest[open + 1..];
        let Some(close) = after.find('`') else { break };
        let span = &after[..close];
        if span.matches('\n').count() <= 1 && is_command(&collapse(span)) {
            commands.push((consumed_lines, collapse(span)));
        }
        consumed_lines += span.matches('\n').count();
        rest = &after[close + 1..];
    }
    commands.sort_by_key(|(line, _)| *line);
    commands
}

/// What the documentation and the table disagree on: documented commands without an entry,
/// and entries no document shows.
pub fn unaccounted(found: &[Documented]) -> Vec<String> {
    let mut problems: Vec<String> = found
        .iter()
        .filter(|documented| !ACCOUNTS.iter().any(|(command, _)| *command == documented.command))
        .map(|documented| {
            format!(
                "`{}` ({}) is documented but neither run nor excluded (add it to ACCOUNTS in xtask/src/test/docs_commands.rs)",
                documented.command,
                documented.places.join(", ")
            )
        })
        .collect();
    problems.extend(
        ACCOUNTS
            .iter()
            .filter(|(command, _)| !found.iter().any(|documented| documented.command == *command))
            .map(|(command, _)| format!("`{command}` is in ACCOUNTS but no document shows it any more")),
    );
    for (position, (command, account)) in ACCOUNTS.iter().enumerate() {
        if ACCOUNTS[..position].iter().any(|(earlier, _)| earlier == command) {
            problems.push(format!("`{command}` is in ACCOUNTS twice"));
        }
        let unexplained = match account {
            Excluded { reason, covered_by } => reason.is_empty() || covered_by.is_empty(),
            Smaller { how, .. } => how.is_empty(),
            Verbatim { .. } => false,
        };
        if unexplained {
            problems.push(format!("`{command}` is run smaller or excluded without saying how or why"));
        }
    }
    problems
}

/// A command's words, as a POSIX shell splits them (double and single quotes; no expansions).
fn words(command: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut quote: Option<char> = None;
    for character in command.chars() {
        match (quote, character) {
            (Some(open), _) if character == open => quote = None,
            (Some(_), _) => word.get_or_insert_default().push(character),
            (None, '"' | '\'') => {
                quote = Some(character);
                word.get_or_insert_default();
            }
            (None, _) if character.is_whitespace() => words.extend(word.take()),
            (None, _) => word.get_or_insert_default().push(character),
        }
    }
    words.extend(word);
    words
}

/// Runs every command the table runs (this xtask, from the workspace root) and counts each in
/// the tally, after one check that every documented command is accounted for.
pub fn docs_commands(tally: &mut Tally) -> Result<(), Failure> {
    let root = build::workspace_root();
    let found = documented(&root);
    let problems = unaccounted(&found);
    let excluded = ACCOUNTS.iter().filter(|(_, account)| matches!(account, Excluded { .. })).count();
    println!(
        "documented commands: {} in README.md and docs/; expecting each run or excluded ({} run, {excluded} excluded)",
        found.len(),
        ACCOUNTS.len() - excluded
    );
    for problem in &problems {
        println!("  {problem}");
    }
    let summary = (!problems.is_empty()).then(|| format!("{} documented commands unaccounted for", problems.len()));
    tally.check("every documented command is run or excluded", summary.as_ref());
    let scratch = crate::bench::target_dir().join("check-docs-commands");
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).map_err(|error| Failure::usage(format!("{}: {error}", scratch.display())))?;
    let xtask = std::env::current_exe().map_err(|error| Failure::usage(format!("this xtask's path: {error}")))?;
    let started = Instant::now();
    for (command, account) in ACCOUNTS {
        let (args, expected, how) = match account {
            Verbatim { status } => (words(command)[2..].to_vec(), *status, "as written".to_string()),
            Smaller { args, how } => {
                let scratch = scratch.display().to_string();
                (args.iter().map(|arg| arg.replace("{scratch}", &scratch)).collect(), 0, format!("smaller: {how}"))
            }
            Excluded { .. } => continue,
        };
        if args.iter().any(|arg| arg.ends_with("/saved.json")) {
            // `bench compare OLD NEW` with NEW a results.json: the saved run's, copied.
            let saved = crate::bench::target_dir().join("bench/saved").join(SAVED).join("results.json");
            let _ = std::fs::copy(saved, scratch.join("saved.json"));
        }
        let run_started = Instant::now();
        let output = Command::new(&xtask)
            .args(&args)
            .current_dir(&root)
            .output()
            .map_err(|error| Failure::usage(format!("cannot run xtask: {error}")))?;
        let seconds = run_started.elapsed().as_secs_f64();
        let status = output.status.code();
        let problem = (status != Some(i32::from(expected))).then(|| match status {
            Some(code) => format!("exit {code}, expected {expected}"),
            None => "killed by a signal".to_string(),
        });
        // One line per command: its verdict, how it ran and its time (the CI budget).
        let name = format!("documented command `{command}`");
        match &problem {
            None => {
                println!("check [{name}]: ok ({how}, {seconds:.1} s)");
                tally.passed += 1;
            }
            Some(problem) => {
                println!("check [{name}]: FAILED: {problem} ({how}, {seconds:.1} s)");
                println!("    ran: cargo xtask {}", args.join(" "));
                let stderr = String::from_utf8_lossy(&output.stderr);
                let lines: Vec<&str> = stderr.lines().collect();
                for line in &lines[lines.len().saturating_sub(10)..] {
                    println!("    {line}");
                }
                tally.fail(format!("check [{name}]"));
            }
        }
    }
    println!("documented commands run in {:.0} s", started.elapsed().as_secs_f64());
    let _ = std::fs::remove_dir_all(crate::bench::target_dir().join("bench/saved").join(SAVED));
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_come_from_fences_and_inline_spans() {
        let text = "Run `cargo xtask profile\n--unwinder both kasan-boot` now, not `cargo fmt`.\n\n```\n\
                    cargo xtask qemu     # a comment\ncargo xtask bench [A]\n      [--b C]\nnot cargo xtask\n```\n\
                    and `cargo test -p x`; `cargo xtaskfoo` is none.\n";
        let found: Vec<_> = commands_in(text).into_iter().collect();
        assert_eq!(
            found,
            [
                (1, "cargo xtask profile --unwinder both kasan-boot".to_string()),
                (5, "cargo xtask qemu".to_string()),
                (6, "cargo xtask bench [A] [--b C]".to_string()),
                (10, "cargo test -p x".to_string()),
            ]
        );
    }

    #[test]
    fn words_split_as_a_shell_does() {
        assert_eq!(
            words("cargo xtask qemu --append \"run=test filter=x\" 'a b'"),
            ["cargo", "xtask", "qemu", "--append", "run=test filter=x", "a b"]
        );
    }

    /// The documentation and the table agree: this fails on the host as soon as a document
    /// shows a command nobody accounted for.
    #[test]
    fn every_documented_command_is_run_or_excluded() {
        let found = documented(&build::workspace_root());
        assert!(found.iter().any(|documented| documented.command == "cargo xtask profile --unwinder both kasan-boot"));
        let problems = unaccounted(&found);
        assert!(problems.is_empty(), "{}", problems.join("\n"));
        assert!(ACCOUNTS.iter().any(|(command, account)| {
            *command == "cargo xtask profile --unwinder both kasan-boot" && matches!(account, Verbatim { status: 0 })
        }));
    }
}
