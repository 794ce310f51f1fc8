//! `cargo xtask measure`: first-build times, the test run's time and target/'s size, with the
//! commit, the machine's CPU and the load they were measured under: the README's figures.

use crate::Failure;
use crate::build::{self, Board, BuildVariant};
use std::path::Path;
use std::process::Command;
use std::time::Instant;

#[derive(clap::Args, Debug)]
pub struct MeasureArgs {
    /// Build variants whose first build is timed (repeatable; default: every variant). Each is
    /// built for virt into an empty scratch target directory (removed afterwards), as a fresh
    /// clone builds it.
    #[arg(long = "variant", value_enum)]
    pub variants: Vec<BuildVariant>,
    /// Skip the first builds.
    #[arg(long)]
    pub no_builds: bool,
    /// Skip timing `cargo xtask test` (the whole default set, host tests included: the longest
    /// part).
    #[arg(long)]
    pub no_test: bool,
    /// Build one variant for virt and exit: how the first builds are timed, each in a child
    /// process whose CARGO_TARGET_DIR is the scratch directory.
    #[arg(long, hide = true, value_enum)]
    pub build_only: Option<BuildVariant>,
}

pub fn run(args: &MeasureArgs) -> Result<u8, Failure> {
    if let Some(variant) = args.build_only {
        build::kernel(Board::Virt, variant)?;
        return Ok(0);
    }
    let xtask = std::env::current_exe().map_err(|error| Failure::usage(format!("this xtask's path: {error}")))?;
    println!("tracelab measure: xtask {}", crate::version());
    println!("machine: {}, {} CPUs", cpu_model(), cores());
    println!("load average at the start: {}", load_average());
    let mut failed = false;
    if !args.no_builds {
        let variants = if args.variants.is_empty() { &BuildVariant::EVERY[..] } else { &args.variants[..] };
        let scratch = build::target_dir().join("measure-first-builds");
        // Two measures at once would remove each other's scratch builds.
        let lock_path = build::target_dir().join("measure-first-builds.lock");
        let _lock = crate::atomic::Lock::acquire(&lock_path, "first-build measurement")
            .map_err(|error| Failure::usage(format!("{}: {error}", lock_path.display())))?;
        let mut total = 0;
        for &variant in variants {
            // One variant at a time, removed once sized: a scratch build never holds more than
            // one variant's disk.
            let _ = std::fs::remove_dir_all(&scratch);
            let started = Instant::now();
            let status = Command::new(&xtask)
                .args(["measure", "--build-only", variant.name()])
                .env("CARGO_TARGET_DIR", &scratch)
                .status()
                .map_err(|error| Failure::usage(format!("cannot run xtask: {error}")))?;
            let seconds = started.elapsed().as_secs_f64();
            failed |= !status.success();
            let size = disk_use(&scratch);
            total += size;
            println!(
                "first build, variant {} (virt, empty target directory): {}, {}{}",
                variant.name(),
                minutes(seconds),
                gigabytes(size),
                if status.success() { "" } else { " (FAILED)" }
            );
        }
        let _ = std::fs::remove_dir_all(&scratch);
        println!("first builds together: {} of target directory", gigabytes(total));
    }
    if !args.no_test {
        let started = Instant::now();
        let output = Command::new(&xtask)
            .arg("test")
            .output()
            .map_err(|error| Failure::usage(format!("cannot run xtask test: {error}")))?;
        let seconds = started.elapsed().as_secs_f64();
        let stdout = String::from_utf8_lossy(&output.stdout);
        let counts = stdout.lines().rev().find(|line| line.contains(" passed, ")).unwrap_or("no counts");
        failed |= !output.status.success();
        println!("cargo xtask test (kernels already built): {} ({counts})", minutes(seconds));
        // The run's own summary of what failed, so a failed timing says why.
        stdout.lines().filter(|line| line.starts_with("failed: ")).for_each(|line| println!("  {line}"));
    }
    println!("target/ after these runs: {}", gigabytes(disk_use(&build::target_dir())));
    println!("load average at the end: {}", load_average());
    Ok(if failed { 1 } else { 0 })
}

fn minutes(seconds: f64) -> String {
    format!("{:.0} s ({:.1} min)", seconds, seconds / 60.0)
}

fn gigabytes(bytes: u64) -> String {
    format!("{:.1} GB", bytes as f64 / 1e9)
}

/// Bytes allocated on disk under `path`, as `du` counts them (each inode once: cargo hard-links
/// its artifacts).
fn disk_use(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    fn walk(path: &Path, seen: &mut std::collections::HashSet<(u64, u64)>) -> u64 {
        let Ok(metadata) = std::fs::symlink_metadata(path) else { return 0 };
        if !seen.insert((metadata.dev(), metadata.ino())) {
            return 0;
        }
        let mut total = metadata.blocks() * 512;
        if metadata.is_dir()
            && let Ok(entries) = std::fs::read_dir(path)
        {
            total += entries.flatten().map(|entry| walk(&entry.path(), seen)).sum::<u64>();
        }
        total
    }
    walk(path, &mut std::collections::HashSet::new())
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|line| line.starts_with("model name"))
                .and_then(|line| line.split_once(':'))
                .map(|(_, model)| model.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".to_string())
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// /proc/loadavg's 1, 5 and 15 minute averages: a figure needs the load it was measured under.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|text| text.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".to_string())
}
