//! xtask: the only build logic of tracelab. Builds the kernel variants, runs them in QEMU, tests.
//!
//! Exit codes: 0 success, 1 test failures, 2 bad usage or missing environment, 124 a QEMU run
//! killed on timeout.

mod apt;
mod bench;
mod bootfiles;
mod build;
mod demo;
mod flash;
mod ksyms;
mod lint;
mod log;
mod profile;
mod qemu;
mod sdimage;
mod serial;
mod setup;
mod sframe;
mod stress;
mod test;
mod trace;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "cargo xtask",
    bin_name = "cargo xtask",
    about = "Build, run and test the tracelab kernel",
    after_help = "Start with `cargo xtask qemu` (a demonstration) and `cargo xtask test`; \
                  `cargo xtask help COMMAND` explains each command.",
    arg_required_else_help = true
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
    /// Install what the host needs (QEMU 10 through apt) and fetch the Raspberry Pi 4 boot
    /// files, saying first what it will do; `--dry-run` only says.
    Setup(setup::SetupArgs),
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
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Qemu(args) => qemu::run_interactive(&args, demo::console),
        Command::Test(args) => test::run(&args),
        Command::Bench(args) => bench::run(&args),
        Command::Profile(args) => profile::run(&args),
        Command::Sdimage(args) => sdimage::run(&args),
        Command::Flash(args) => flash::run(&args),
        Command::Lint => lint::run(),
        Command::Monitor(args) => serial::monitor(&args, demo::console),
        Command::Stress(args) => stress::run(&args),
        Command::Setup(args) => setup::run(&args),
    };
    match result {
        Ok(status) => ExitCode::from(status),
        Err(failure) => {
            eprintln!("xtask: {}", failure.message);
            ExitCode::from(failure.status)
        }
    }
}
