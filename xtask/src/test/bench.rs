//! The bench harness under icount: identical rows run to run, and instructions counted exactly.

use super::matrix::DEFAULT_PAUTH_CPU;
use super::tally::Tally;
use crate::Failure;
use crate::build::{self, Board};
use crate::qemu::{self, CpuVariant, Machine};
use protocol::bench::Row;
use std::time::Duration;

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
