//! The bench harness under icount: identical rows run to run, and instructions counted exactly;
//! and a bench run whose QEMU is killed counts for nothing.

use super::matrix::DEFAULT_PAUTH_CPU;
use super::tally::Tally;
use crate::Failure;
use crate::build::{self, Board};
use crate::qemu::{self, CpuVariant, Machine};
use protocol::bench::Row;
use std::process::Command;
use std::time::{Duration, Instant};

/// The bench harness under icount: two runs of the baseline suite give identical rows, and the
/// counter really counts instructions (a call is `bl` + `ret`, a PAC-signed call adds `paciasp` and
/// `autiasp`, whatever the PAuth algorithm).
pub fn bench_harness(image: &build::KernelImage, tally: &mut Tally) -> Result<(), Failure> {
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
        let result = qemu::run(&machine, image, bootargs, Some(Duration::from_secs(120)), &mut |_| {})?;
        let rows: Vec<String> =
            result.log.iter().filter_map(|line| Row::fields(&line.text).map(str::to_string)).collect();
        runs.push((result.status, rows));
    }
    let per_op = |rows: &[String], case: &str| -> Option<f64> {
        rows.iter().filter_map(|fields| Row::parse(fields)).find(|row| row.case == case).map(|row| row.value)
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

/// Reps asked of the killed run: far more than it gets through before the signal.
const KILLED_RUN_REPS: &str = "1000";

/// `cargo xtask bench` itself (this xtask, in a child process) on the prod kernel the test run
/// built, with QEMU sent SIGTERM after the first row line, as a user's `kill` would: QEMU then
/// exits 0, and the run must still exit non-zero, name what is missing and write no results.
pub fn killed_bench_writes_nothing(tally: &mut Tally) -> Result<(), Failure> {
    let out = crate::bench::target_dir().join("check-killed-bench");
    let _ = std::fs::remove_dir_all(&out);
    let xtask = std::env::current_exe().map_err(|error| Failure::usage(format!("this xtask's path: {error}")))?;
    println!(
        "bench run killed after its first row: expecting a non-zero exit, `incomplete: N of {KILLED_RUN_REPS} reps` \
         and no results.json"
    );
    let started = Instant::now();
    let output = Command::new(xtask)
        .args(["bench", "baseline", "--mode", "wall", "--reps", KILLED_RUN_REPS, "--timeout", "120"])
        .args(["--cpu", crate::bench::gate::CPU.name(), "--terminate-qemu-after-rows", "1", "--out"])
        .arg(&out)
        .output()
        .map_err(|error| Failure::usage(format!("cannot run xtask bench: {error}")))?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    let verdict = stderr.lines().find(|line| line.starts_with("xtask: bench run")).unwrap_or_default();
    let written: Vec<_> =
        ["results.json", "report.md", "baseline.svg"].into_iter().filter(|name| out.join(name).exists()).collect();
    let reps = format!(" of {KILLED_RUN_REPS} reps of baseline ");
    let problem = if output.status.success() {
        Some("the killed run exited 0".to_string())
    } else if !written.is_empty() {
        Some(format!("the killed run wrote {}", written.join(", ")))
    } else if !(verdict.contains("terminating on signal 15")
        && verdict.contains("incomplete: ")
        && verdict.contains(&reps))
    {
        Some(format!("expected the signal and `incomplete: N{reps}...` in xtask's verdict, got `{verdict}`"))
    } else {
        None
    };
    match output.status.code() {
        Some(code) => println!("  exit {code} in {:.1} s: {verdict}", started.elapsed().as_secs_f64()),
        None => println!("  no exit status in {:.1} s: {verdict}", started.elapsed().as_secs_f64()),
    }
    if problem.is_some() {
        print!("{stderr}");
    }
    tally.check("a killed bench run exits non-zero and writes nothing", problem.as_ref());
    Ok(())
}
