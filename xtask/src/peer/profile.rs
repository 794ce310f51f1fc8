//! `cargo xtask peer linux --events`: the events plugin's count beside a measuring boot, as
//! exceptions per hit of each row.
//!
//! The plugin runs in its whole-run mode (`count=on`) with Linux's vector table (`vectors`,
//! whose address the init reads from /proc/kallsyms: under `nokaslr` it is the same every
//! boot). Its marks are the init's own counter reads, two per timed loop, so every loop is a
//! window without a marker added to the guest: a row's `minimum` runs the loop without the
//! mechanism `repetitions` times, then with it as often, and the rows come in the order the
//! init prints them. Of each group the window with the fewest instructions is the one the row's
//! minimum timed (under icount a loop's ticks are its instructions).

use super::protocol::{Measurement, Report};
use events::count::{Mark, WholeRun};

/// The events of one timed loop: the plugin's totals between its two counter reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoopEvents {
    pub instructions: u64,
    pub exceptions: u64,
}

/// A row's events per hit: (probed loop - loop) / iterations, of the minimal windows.
#[derive(Clone, Debug, PartialEq)]
pub struct RowEvents {
    pub case: String,
    pub tracing_on: u8,
    pub instructions_per_hit: f64,
    pub exceptions_per_hit: f64,
}

/// The window a pair of marks bounds.
fn window(open: &Mark, close: &Mark) -> LoopEvents {
    LoopEvents { instructions: close.instructions - open.instructions, exceptions: close.exceptions - open.exceptions }
}

/// The group's loop with the fewest instructions.
fn minimal(windows: &[LoopEvents]) -> LoopEvents {
    *windows.iter().min_by_key(|window| window.instructions).expect("a group has its repetitions")
}

/// Each row's events per hit, from the run's marks. An error names what does not line up: the
/// marks must be exactly the init's counter reads, four per repetition of every row.
pub fn per_row(report: &Report, run: &WholeRun) -> Result<Vec<RowEvents>, String> {
    let expected: u64 = report.measurements.iter().map(|row| 4 * row.repetitions).sum();
    if run.marks.len() as u64 != expected {
        return Err(format!("{} user counter reads in the run, the rows' loops make {expected}", run.marks.len()));
    }
    let windows: Vec<LoopEvents> = run.marks.chunks(2).map(|pair| window(&pair[0], &pair[1])).collect();
    let mut at = 0;
    let mut rows = Vec::new();
    for Measurement { case, tracing_on, iterations, repetitions, .. } in &report.measurements {
        let count = *repetitions as usize;
        let base = minimal(&windows[at..at + count]);
        let probed = minimal(&windows[at + count..at + 2 * count]);
        at += 2 * count;
        let per_hit = |probed: u64, base: u64| (probed as f64 - base as f64) / *iterations as f64;
        rows.push(RowEvents {
            case: case.clone(),
            tracing_on: *tracing_on,
            instructions_per_hit: per_hit(probed.instructions, base.instructions),
            exceptions_per_hit: per_hit(probed.exceptions, base.exceptions),
        });
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn marks(loops: &[(u64, u64)]) -> Vec<Mark> {
        let mut marks = Vec::new();
        let (mut instructions, mut exceptions) = (1_000_000, 50);
        for &(loop_instructions, loop_exceptions) in loops {
            marks.push(Mark { cpu: 0, pc: 0x40_0a00, instructions, exceptions });
            instructions += loop_instructions;
            exceptions += loop_exceptions;
            marks.push(Mark { cpu: 0, pc: 0x40_0a20, instructions, exceptions });
            // Between loops: the init's tracefs writes, with their own exceptions.
            instructions += 90_000;
            exceptions += 7;
        }
        marks
    }

    #[test]
    fn each_rows_minimal_windows_give_its_events_per_hit() {
        let console = "peer 1 row kprobe tracing_on=1 iterations=10 repetitions=2 base=5000 probed=12000 hits=20\n\
                       peer 1 row kprobe tracing_on=0 iterations=10 repetitions=2 base=5000 probed=9000 hits=20\n";
        let report = Report::parse(console);
        assert_eq!(report.measurements.len(), 2);
        // Per row: two loops without the probe, two with it; one of each pair took a timer
        // interrupt, which the minimum leaves out.
        let loops =
            [(5_000, 10), (5_300, 11), (12_400, 31), (12_000, 30), (5_000, 10), (5_000, 10), (9_000, 30), (9_200, 31)];
        let run = WholeRun { instructions: 0, exceptions: 0, vcpus: 1, marks: marks(&loops) };
        let rows = per_row(&report, &run).unwrap();
        assert_eq!(
            rows[0],
            RowEvents { case: "kprobe".into(), tracing_on: 1, instructions_per_hit: 700.0, exceptions_per_hit: 2.0 }
        );
        assert_eq!(
            rows[1],
            RowEvents { case: "kprobe".into(), tracing_on: 0, instructions_per_hit: 400.0, exceptions_per_hit: 2.0 }
        );
        let short = WholeRun { marks: marks(&loops[..7]), ..run };
        assert!(per_row(&report, &short).unwrap_err().contains("14 user counter reads"));
    }
}
