//! xtask: the only build logic of tracelab. Builds the kernel variants, runs them in QEMU, tests.
//!
//! Exit codes: 0 success, 1 test failures, 2 bad usage or missing environment, 124 a QEMU run
//! killed on timeout.

mod apt;
mod atomic;
mod bench;
mod bootfiles;
mod build;
mod demo;
mod flash;
mod function_graph;
mod ksyms;
mod lint;
mod log;
mod measure;
mod names;
mod peer;
mod probe_spec;
mod profile;
mod qemu;
mod replay;
mod sdimage;
mod serial;
mod setup;
mod sframe;
mod shard;
mod stress;
mod test;
mod trace;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use std::process::{Command as Process, ExitCode};

#[derive(Parser)]
#[command(
    name = "cargo xtask",
    bin_name = "cargo xtask",
    about = "Build, run and test the tracelab kernel",
    after_help = "Start with `cargo xtask qemu` (a demonstration) and `cargo xtask test`; \
                  `cargo xtask help COMMAND` explains each command.",
    arg_required_else_help = true,
    version
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Build the kernel, boot it in QEMU and stream its decoded log; exits with the kernel's status.
    Qemu(qemu::QemuArgs),
    /// Host crate tests, then the kernel test suite in QEMU across build variants, CPU variants,
    /// entry levels and GICs (the default set; `--matrix` for all). Ends with `N passed, N failed`.
    Test(test::TestArgs),
    /// Benchmark suites in QEMU per CPU variant and mode: results.json, report.md, SVG charts.
    Bench(bench::BenchArgs),
    /// A kernel workload under the sampling profiler: folded stacks and flame graphs per unwinder
    /// (FP, SCS) and their difference under target/profile/WORKLOAD, FP/SCS agreement, costs.
    Profile(profile::ProfileArgs),
    /// A bootable Raspberry Pi 4 SD card image (MBR + FAT32), no root needed.
    Sdimage(sdimage::SdImageArgs),
    /// rustfmt --check and clippy -D warnings on everything, the kernel for each board.
    Lint,
    /// Write the SD card image to a removable, unmounted block device.
    Flash(flash::FlashArgs),
    /// Decode a board's defmt log from a serial port until its exit sentinel.
    Monitor(serial::MonitorArgs),
    /// Long runs: `stress probes` sweeps every probe-able kernel instruction with every method.
    Stress(stress::StressArgs),
    /// Add up the shards of one `stress probes`, `test --matrix` or `bench` run (`--shard K/N`)
    /// into one coverage summary, one tally or one results.json; refuses shards that differ.
    Merge(shard::MergeArgs),
    /// Time each build variant's first build and `cargo xtask test`, and size target/: the
    /// README's figures, printed with the commit, the CPU and the load.
    Measure(measure::MeasureArgs),
    /// Install what the host needs (QEMU 10 through apt) and fetch the Raspberry Pi 4 boot
    /// files, saying first what it will do; `--dry-run` only says.
    Setup(setup::SetupArgs),
    /// Debian's arm64 Linux in the same QEMU: fetched through a private apt configuration under
    /// target/peer/, booted with a small init that measures Linux's own probes and tracers.
    Peer(peer::PeerArgs),
}

/// An error that ends xtask with a specific exit status and a one-line message.
#[derive(Debug)]
pub struct Failure {
    pub status: u8,
    pub message: String,
}

impl Failure {
    /// Bad usage or a missing environment (exit 2).
    pub fn usage(message: impl Into<String>) -> Self {
        Self { status: 2, message: message.into() }
    }
}

fn main() -> ExitCode {
    // clap's whole message (valid values, "did you mean", the missing argument, the usage
    // line); help and version exit 0, errors and a bare `cargo xtask` (which lists the
    // subcommands) exit 2.
    let mut command = Cli::command();
    // `--version` names the commit too; git runs only when it is asked for.
    if matches!(std::env::args().nth(1).as_deref(), Some("--version" | "-V")) {
        // Once per process: clap keeps the text for the command's life.
        let text: &'static str = Box::leak(version().into_boxed_str());
        command = command.version(text);
    }
    let cli = Cli::from_arg_matches(&command.get_matches()).unwrap_or_else(|error| error.exit());
    let result = match cli.command {
        Command::Qemu(args) => qemu::run_interactive(&args, |elf| demo::console(elf, args.log_style)),
        Command::Test(args) => test::run(&args),
        Command::Bench(args) => bench::run(&args),
        Command::Profile(args) => profile::run(&args),
        Command::Sdimage(args) => sdimage::run(&args),
        Command::Flash(args) => flash::run(&args),
        Command::Lint => lint::run(),
        Command::Monitor(args) => serial::monitor(&args, |elf| demo::console(elf, args.log_style)),
        Command::Stress(args) => stress::run(&args),
        Command::Merge(args) => shard::run(&args),
        Command::Setup(args) => setup::run(&args),
        Command::Measure(args) => measure::run(&args),
        Command::Peer(args) => peer::run(&args),
    };
    match result {
        Ok(status) => ExitCode::from(status),
        Err(failure) => {
            eprintln!("xtask: {}", failure.message);
            ExitCode::from(failure.status)
        }
    }
}

/// xtask's version and the commit of the tree it runs from: `0.1.0 (commit 1a2b3c4d5e6f,
/// 2026-11-27)`, `with uncommitted changes` when the tracked files differ from it. A tree without
/// its own git repository (an unpacked tarball, even inside another repository) says so.
fn version() -> String {
    version_of(&build::workspace_root())
}

/// [`version`] of the tree at `root`.
fn version_of(root: &std::path::Path) -> String {
    let git = |args: &[&str]| {
        Process::new("git")
            .args(args)
            .current_dir(root)
            .output()
            .ok()
            .filter(|output| output.status.success())
            .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_string())
    };
    let version = env!("CARGO_PKG_VERSION");
    let own_repository = git(&["rev-parse", "--show-toplevel"])
        .and_then(|top| std::fs::canonicalize(top).ok())
        .is_some_and(|top| std::fs::canonicalize(root).is_ok_and(|root| root == top));
    let commit = own_repository.then(|| git(&["log", "-1", "--format=%h %cs", "--abbrev=12"])).flatten();
    let Some((commit, date)) = commit.as_deref().and_then(|text| text.split_once(' ')) else {
        return format!("{version} (commit unknown: {} is not a git checkout)", root.display());
    };
    let changed = git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|text| !text.is_empty());
    format!("{version} (commit {commit}, {date}{})", if changed { ", with uncommitted changes" } else { "" })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_names_the_commit_or_says_there_is_none() {
        let this = version();
        assert!(this.starts_with(concat!(env!("CARGO_PKG_VERSION"), " (commit ")), "{this}");
        // An unpacked tarball, alone or inside another repository: not its commit.
        let scratch = std::env::temp_dir().join(format!("tracelab-version-{}", std::process::id()));
        let tree = scratch.join("tracelab");
        std::fs::create_dir_all(&tree).unwrap();
        let expected = format!(" (commit unknown: {} is not a git checkout)", tree.display());
        assert_eq!(version_of(&tree), format!("{}{expected}", env!("CARGO_PKG_VERSION")));
        let init = Process::new("git").args(["init", "-q"]).current_dir(&scratch).status();
        if init.is_ok_and(|status| status.success()) {
            assert_eq!(version_of(&tree), format!("{}{expected}", env!("CARGO_PKG_VERSION")));
        }
        std::fs::remove_dir_all(&scratch).unwrap();
    }
}
