//! `cargo xtask bench calibrate EVENTS BOARD`: the cycle model's parameters fitted to a real
//! core's cycles.
//!
//! EVENTS is an icount run with `--events` (each row's events per operation); BOARD a run on
//! the Pi 4 (`--board rpi4 --serial PATH`, mode hardware: PMU cycles per operation). Every row
//! both runs have (suite, case, params, metric; the CPU variant differs by construction) is one
//! equation: modelled cycles = measured cycles. The fit keeps each parameter within its range
//! (`events::model::calibrate`); the table says which parameters the rows determined, where
//! each landed (at a bound is a sign the model lacks a term), and how far the fitted model
//! stays from the measurement. It prints; it changes no parameter: the one set stays what the
//! docs cite until someone puts the fitted values there with the run that gave them.

use super::Mode;
use super::results::{Results, Row};
use crate::Failure;
use events::Counter;
use events::model::{self, Costs};
use std::fmt::Write;

pub fn run(events_run: &str, board_run: &str) -> Result<u8, Failure> {
    let (events_path, events) = super::load(events_run)?;
    let (board_path, board) = super::load(board_run)?;
    let rows = pair(&events, &board);
    if rows.is_empty() {
        return Err(Failure::usage(format!(
            "no row of {} has both events (an icount --events run) and PMU cycles in {} (a --board rpi4 run)",
            events_path.display(),
            board_path.display()
        )));
    }
    print!("{}", render(&rows));
    Ok(0)
}

/// One calibration equation: a row's label, what each parameter multiplies, and its cycles.
struct Equation {
    label: String,
    coefficients: [f64; 16],
    cycles: f64,
}

/// The rows with events per operation in `events` and hardware cycles in `board`.
fn pair(events: &Results, board: &Results) -> Vec<Equation> {
    let measured = |row: &Row| row.mode == Mode::Hardware && !row.metric.contains('.');
    board
        .rows
        .iter()
        .filter(|row| measured(row))
        .filter_map(|cycles| {
            let same = |row: &&Row| {
                row.mode == Mode::Icount
                    && row.suite == cycles.suite
                    && row.case == cycles.case
                    && row.params == cycles.params
            };
            let event = |counter: Counter| {
                let metric = format!("{}.{}", cycles.metric, counter.name());
                events.rows.iter().filter(same).find(|row| row.metric == metric).map(|row| row.median)
            };
            let instructions =
                events.rows.iter().filter(same).find(|row| row.metric == cycles.metric).map(|row| row.median)?;
            // A row without its events was not an --events row.
            event(Counter::Exceptions)?;
            let count = |counter: Counter| match counter {
                Counter::Instructions => instructions,
                other => event(other).unwrap_or(0.0),
            };
            Some(Equation {
                label: format!("{} {} {}", cycles.suite, cycles.label(), cycles.metric),
                coefficients: model::coefficients(&Costs::a72(), count),
                cycles: cycles.median,
            })
        })
        .collect()
}

fn render(rows: &[Equation]) -> String {
    let equations: Vec<([f64; 16], f64)> = rows.iter().map(|row| (row.coefficients, row.cycles)).collect();
    let (fitted, residual) = model::calibrate(&equations);
    let mut out = String::new();
    let _ = writeln!(out, "cycle model calibration on {} rows (PMU cycles against {})", rows.len(), model::LABEL);
    let _ = writeln!(out, "\n| parameter | one set | fitted | range | |\n|---|---:|---:|---|---|");
    for fit in &fitted {
        let parameter = fit.parameter;
        let note = if parameter.name == "indirect_mispredict_rate" {
            "held: the penalty is fitted"
        } else if !fit.determined {
            "no row pays it: kept"
        } else if fit.value <= parameter.low {
            "at the low end of its range"
        } else if fit.value >= parameter.high {
            "at the high end of its range"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "| `{}` | {} | {:.2} | {}-{} | {note} |",
            parameter.name, parameter.value, fit.value, parameter.low, parameter.high
        );
    }
    let _ = writeln!(out, "\n| row | PMU cycles | modelled, one set | modelled, fitted |\n|---|---:|---:|---:|");
    let one_set: Vec<f64> = model::A72.iter().map(|parameter| parameter.value).collect();
    let fitted_values: Vec<f64> = fitted.iter().map(|fit| fit.value).collect();
    let apply = |coefficients: &[f64; 16], values: &[f64]| -> f64 {
        coefficients.iter().zip(values).map(|(coefficient, value)| coefficient * value).sum()
    };
    for row in rows {
        let _ = writeln!(
            out,
            "| {} | {} | {:.1} | {:.1} |",
            row.label,
            row.cycles,
            apply(&row.coefficients, &one_set),
            apply(&row.coefficients, &fitted_values)
        );
    }
    let _ = writeln!(out, "\nfitted model's largest relative error over the rows: {:.1}%", residual * 100.0);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::BuildVariant;
    use crate::qemu::CpuVariant;

    fn row(metric: &str, mode: Mode, method: &str, value: f64) -> Row {
        Row {
            suite: "probes".into(),
            case: "kprobe-push".into(),
            params: vec![("method".into(), method.into())],
            cpu: CpuVariant::ALL[0],
            variant: BuildVariant::Prod,
            mode,
            metric: metric.into(),
            unit: "-".into(),
            median: value,
            min: value,
            max: value,
            n: 1,
            samples: vec![value],
        }
    }

    fn results(rows: Vec<Row>) -> Results {
        Results { schema: 2, provenance: crate::bench::results::tests::provenance(), rows }
    }

    /// A synthetic PMU fixture: two methods' events from an icount run, and the cycles a core
    /// whose exceptions cost 60 cycles (the one set says 40) would count for them.
    #[test]
    fn a_synthetic_board_run_calibrates_the_exception_cost() {
        let methods = [("single-step", 300.0, 2.0), ("simulate", 180.0, 1.0), ("detour", 80.0, 0.0)];
        let mut icount = Vec::new();
        let mut board = Vec::new();
        for (method, instructions, exceptions) in methods {
            icount.push(row("per_hit", Mode::Icount, method, instructions));
            icount.push(row("per_hit.exceptions", Mode::Icount, method, exceptions));
            // Only "other" instructions and exceptions: 0.5 a cycle, 60 an exception.
            board.push(row("per_hit", Mode::Hardware, method, instructions * 0.5 + exceptions * 60.0));
        }
        board.push(row("per_hit", Mode::Hardware, "brk-step", 1.0));
        let rows = pair(&results(icount), &results(board));
        assert_eq!(rows.len(), 3, "the board row without events is not an equation");
        let table = render(&rows);
        assert!(table.contains("| `exception` | 40 | 60.00 | 20-100 |  |"), "{table}");
        assert!(table.contains("| `dsb` | 30 | 30.00 | 10-100 | no row pays it: kept |"), "{table}");
        assert!(table.contains(model::LABEL));
    }
}
