//! Two xtask commands at once in one checkout: a demo and a bench on the same image both finish.

use super::tally::Tally;
use crate::Failure;
use crate::build::{self, Board, BuildVariant};
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Output};
use std::time::Instant;

/// `cargo xtask qemu` (the demo: `full` on virt by default) and `cargo xtask bench baseline` on the same
/// `full` image, started together as this xtask's children, as a user running the demo in one
/// terminal and a bench in another. Both build the image: one waits for the other's build lock,
/// then finds the image current and leaves it alone while the other runs it with the ELF mapped
/// by its symbolizer. Both must exit 0 with their whole output (the kernel's closing line, a
/// results.json), and the image must still be the file both started from: rewritten in place
/// (the `XTASK_TEST_WRITE_IN_PLACE` switch, as xtask once did), a reader of the mapping can
/// die of SIGBUS, and this check fails on the changed file even when the timing spares it.
pub fn demo_and_bench_at_once(tally: &mut Tally) -> Result<(), Failure> {
    let image = build::kernel(Board::Virt, BuildVariant::Full)?;
    let before = identity(&image.elf)?;
    let out = crate::bench::target_dir().join("check-concurrent-bench");
    let _ = std::fs::remove_dir_all(&out);
    let xtask = std::env::current_exe().map_err(|error| Failure::usage(format!("this xtask's path: {error}")))?;
    println!(
        "a demo and a bench at once on the full image: expecting both to exit 0, the kernel's closing line, \
         a results.json, and the image left alone"
    );
    let started = Instant::now();
    let mut demo = Command::new(&xtask);
    // As the README writes it (the documented-commands check counts on this run).
    demo.arg("qemu");
    let mut bench = Command::new(&xtask);
    bench.args(["bench", "baseline", "--variant", "full", "--mode", "icount", "--cpu"]);
    bench.args([crate::bench::gate::CPU.name(), "--out"]).arg(&out);
    let (demo, bench) = std::thread::scope(|scope| {
        let demo = scope.spawn(|| demo.output());
        let bench = scope.spawn(|| bench.output());
        (demo.join().expect("the demo's thread"), bench.join().expect("the bench's thread"))
    });
    let demo = demo.map_err(|error| Failure::usage(format!("cannot run xtask qemu: {error}")))?;
    let bench = bench.map_err(|error| Failure::usage(format!("cannot run xtask bench: {error}")))?;
    let after = identity(&image.elf)?;
    let waited =
        [&demo, &bench].iter().any(|output| String::from_utf8_lossy(&output.stderr).contains("waiting for lock"));
    println!(
        "  both done in {:.1} s; {}",
        started.elapsed().as_secs_f64(),
        if waited { "one waited for the other's build lock" } else { "neither waited for a lock" }
    );
    let mut problems = Vec::new();
    if let Some(problem) = failed("the demo", &demo) {
        problems.push(problem);
    } else if !String::from_utf8_lossy(&demo.stdout).contains("tracelab: exit status 0") {
        problems.push("the demo's output has no `tracelab: exit status 0`".to_string());
    }
    if let Some(problem) = failed("the bench", &bench) {
        problems.push(problem);
    } else {
        match crate::bench::load(&out.join("results.json").to_string_lossy()) {
            Ok((_, results)) if results.rows.is_empty() => problems.push("the bench's results.json has no rows".into()),
            Ok(_) => {}
            Err(failure) => problems.push(format!("the bench's results: {}", failure.message)),
        }
    }
    if before != after {
        problems.push(format!(
            "{} was rewritten while the other command ran it (inode, size, mtime {before:?} -> {after:?})",
            image.elf.display()
        ));
    }
    let problem = (!problems.is_empty()).then(|| problems.join("; "));
    if problem.is_some() {
        for (name, output) in [("demo", &demo), ("bench", &bench)] {
            println!("  {name}'s error output:");
            for line in
                String::from_utf8_lossy(&output.stderr).lines().rev().take(15).collect::<Vec<_>>().into_iter().rev()
            {
                println!("    {line}");
            }
        }
    }
    tally.check("a demo and a bench at once both finish", problem.as_ref());
    let _ = std::fs::remove_dir_all(&out);
    Ok(())
}

/// The file's inode, size and modification time: what a rewrite in place or a rename changes.
fn identity(path: &std::path::Path) -> Result<(u64, u64, i64, i64), Failure> {
    let metadata = std::fs::metadata(path).map_err(|error| Failure::usage(format!("{}: {error}", path.display())))?;
    Ok((metadata.ino(), metadata.size(), metadata.mtime(), metadata.mtime_nsec()))
}

/// Why a child command failed (a signal, such as the SIGBUS of a truncated mapping, or a
/// non-zero exit), or None when it exited 0.
fn failed(name: &str, output: &Output) -> Option<String> {
    match (output.status.code(), output.status.signal()) {
        (Some(0), _) => None,
        (Some(code), _) => Some(format!("{name} exited {code}")),
        (None, Some(signal)) => Some(format!("{name} was killed by signal {signal}")),
        (None, None) => Some(format!("{name} ended without an exit status")),
    }
}
