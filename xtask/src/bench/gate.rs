//! The standing icount regression gate: `cargo xtask test` measures the gate's suites under
//! icount and fails when a row costs more than the committed baseline allows.
//!
//! Instruction counts are deterministic, so any rise is real; the tolerance (the larger of 1%
//! and 3 instructions) only absorbs what a build's layout may shift (alignment, a literal pool).
//! Rows below baseline pass and are printed as improvements. A new row (not in the baseline) is
//! listed, not failed: new work brings new rows, and `cargo xtask bench --update-baseline` takes
//! them in. A baseline row the run did not measure fails the gate: a row that disappears is a
//! cost no longer watched, and a run that lost rows is not a finished run.

use super::results::{self, Results, Row};
use super::{Mode, RunPlan};
use crate::Failure;
use crate::build::{self, Board, BuildVariant, KernelImage};
use crate::qemu::CpuVariant;
use protocol::suite;
use std::path::PathBuf;
use std::time::Duration;

/// The suites the gate runs: one QEMU run of about 16 s under icount on the prod kernel.
pub const SUITES: [&str; 5] = [suite::BASELINE, suite::PROBES, suite::FTRACE, suite::STACKTRACE, suite::DEPOT];
/// Under icount every PAuth setting counts the same instructions; `pauth=off` is the cheapest to
/// emulate.
pub const CPU: CpuVariant = CpuVariant::MaxNoPauth;
/// The build the gate measures, the one `cargo xtask test` builds anyway.
pub const VARIANT: BuildVariant = BuildVariant::Prod;
/// Only rows in this unit are gated: the other units (hits per second, depot sizes, rates) are
/// derived from them or describe a workload, not a cost.
const GATED_UNIT: &str = "insn";

/// The committed baseline.
pub fn baseline_path() -> PathBuf {
    build::workspace_root().join("xtask/baseline/icount.json")
}

/// The rise a row may show before the gate fails it.
fn allowance(baseline: f64) -> f64 {
    (baseline.abs() * 0.01).max(3.0)
}

/// What the gate found.
#[derive(Default, Debug)]
pub struct Verdict {
    /// Gated rows above their allowance: `(row, baseline figure)`.
    pub regressions: Vec<(Row, f64)>,
    /// Gated rows within their allowance but above the baseline: `(row, baseline figure)`.
    pub tolerated: Vec<(Row, f64)>,
    /// Gated rows below their baseline: `(row, baseline figure)`.
    pub improvements: Vec<(Row, f64)>,
    /// Rows this run has and the baseline has not.
    pub new_rows: Vec<Row>,
    /// Baseline rows this run did not produce.
    pub missing_rows: Vec<Row>,
    /// Gated rows compared.
    pub checked: usize,
}

/// Compares a run's rows with the baseline's.
pub fn judge(baseline: &[Row], run: &[Row]) -> Verdict {
    let mut verdict = Verdict::default();
    for row in run {
        let Some(base) = baseline.iter().find(|base| base.same_row(row)) else {
            verdict.new_rows.push(row.clone());
            continue;
        };
        if row.unit != GATED_UNIT || base.unit != GATED_UNIT {
            continue;
        }
        verdict.checked += 1;
        let rise = row.median - base.median;
        if rise > allowance(base.median) {
            verdict.regressions.push((row.clone(), base.median));
        } else if rise > 0.0 {
            verdict.tolerated.push((row.clone(), base.median));
        } else if rise < 0.0 {
            verdict.improvements.push((row.clone(), base.median));
        }
    }
    verdict.missing_rows = baseline.iter().filter(|base| !run.iter().any(|row| row.same_row(base))).cloned().collect();
    verdict
}

fn name(row: &Row) -> String {
    format!("{} {} {} {}", row.suite, row.case, row.params_text(), row.metric)
}

fn change(row: &Row, base: f64) -> String {
    let rise = row.median - base;
    let percent = if base == 0.0 { String::new() } else { format!(", {:+.2}%", rise * 100.0 / base) };
    let number = super::report::number;
    format!("{} -> {} {} ({}{percent})", number(base), number(row.median), row.unit, super::report::signed(rise))
}

impl Verdict {
    /// The gate's lines for the test log, and the failure (naming the rows) if any.
    pub fn render(&self, baseline_commit: &str) -> (String, Option<String>) {
        let mut text = format!(
            "icount gate: {} rows checked against the baseline of commit {baseline_commit} (`-cpu {}`, variant {})\n",
            self.checked,
            CPU.name(),
            VARIANT.name()
        );
        for (row, base) in &self.regressions {
            text += &format!("  ABOVE BASELINE {}: {}\n", name(row), change(row, *base));
        }
        for (row, base) in &self.tolerated {
            text += &format!("  within tolerance {}: {}\n", name(row), change(row, *base));
        }
        for (row, base) in &self.improvements {
            text += &format!("  improvement {}: {}\n", name(row), change(row, *base));
        }
        for row in &self.new_rows {
            text += &format!("  new row (not in the baseline) {}\n", name(row));
        }
        for row in &self.missing_rows {
            text += &format!("  baseline row not measured {}\n", name(row));
        }
        if !self.improvements.is_empty() || !self.new_rows.is_empty() {
            text += "  (`cargo xtask bench --update-baseline` takes improvements and new rows in)\n";
        }
        let mut failures = Vec::new();
        if !self.regressions.is_empty() {
            let names: Vec<_> = self.regressions.iter().map(|(row, _)| name(row)).collect();
            let rows = if names.len() == 1 { "row" } else { "rows" };
            failures.push(format!("{} {rows} above the icount baseline: {}", names.len(), names.join("; ")));
        }
        if !self.missing_rows.is_empty() {
            let names: Vec<_> = self.missing_rows.iter().map(name).collect();
            let rows = if names.len() == 1 { "row" } else { "rows" };
            failures.push(format!(
                "{} baseline {rows} not measured (a row removed on purpose leaves with \
                 `cargo xtask bench --update-baseline`): {}",
                names.len(),
                names.join("; ")
            ));
        }
        (text, (!failures.is_empty()).then(|| failures.join("; ")))
    }
}

/// The gate as `cargo xtask test` runs it on the prod kernel it built: returns the problem
/// (which fails the gate's one test) or None.
pub fn check(image: &KernelImage) -> Result<Option<String>, Failure> {
    let path = baseline_path();
    let baseline = match std::fs::read_to_string(&path)
        .map_err(|error| error.to_string())
        .and_then(|text| results::parse(&text))
    {
        Ok(baseline) => baseline,
        Err(error) => {
            return Ok(Some(format!(
                "{}: {error} (write it with `cargo xtask bench --update-baseline`)",
                path.display()
            )));
        }
    };
    let plan = RunPlan {
        board: Board::Virt,
        image,
        variant: VARIANT,
        suites: &SUITES,
        cpu: CPU,
        mode: Mode::Icount,
        reps: 1,
        timeout: Duration::from_secs(300),
        dtb: None,
        serial: None,
        smp: 1,
        terminate_after_rows: None,
        events: None,
    };
    let started = std::time::Instant::now();
    let rows = match super::measure(&plan) {
        Ok(samples) => results::as_written(&Row::aggregate(&samples)),
        Err(failure) => return Ok(Some(failure.message)),
    };
    println!("icount gate: {} measured in {:.1} s", SUITES.join(", "), started.elapsed().as_secs_f64());
    let (text, failure) = judge(&baseline.rows, &rows).render(&baseline.provenance.commit);
    print!("{text}");
    Ok(failure)
}

/// `bench --update-baseline`: writes the run as the new baseline, after showing what changed.
pub fn update(run: &Results, json: &str) -> Result<(), Failure> {
    let path = baseline_path();
    if let Ok(old) =
        std::fs::read_to_string(&path).map_err(|error| error.to_string()).and_then(|text| results::parse(&text))
    {
        println!("{}", super::compare::render("baseline", &old, "this run", run));
        let verdict = judge(&old.rows, &run.rows);
        if !verdict.regressions.is_empty() {
            let names: Vec<_> = verdict.regressions.iter().map(|(row, _)| name(row)).collect();
            eprintln!("xtask: the new baseline raises {}: say why in the commit that updates it", names.join("; "));
        }
        if !verdict.missing_rows.is_empty() {
            let names: Vec<_> = verdict.missing_rows.iter().map(name).collect();
            eprintln!("xtask: the new baseline drops {}: say why in the commit that updates it", names.join("; "));
        }
    }
    super::write_file(&path, json)?;
    eprintln!("xtask: wrote {} (commit it)", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::results::tests::rows;

    fn baseline() -> Vec<Row> {
        rows(
            &[
                "baseline call - per_op insn 2",
                "stacktrace fp depth=64 per_trace insn 3404",
                "probes kprobe-nop method=simulate hits_per_s hits_per_s 5000000",
                "depot insert-miss depth=16 per_op insn 700",
            ],
            Mode::Icount,
        )
    }

    #[test]
    fn a_row_above_its_allowance_fails_the_gate_by_name() {
        // 3404 allows 34 (1%), 2 allows 3.
        let run = rows(
            &[
                "baseline call - per_op insn 6",
                "stacktrace fp depth=64 per_trace insn 3439",
                "probes kprobe-nop method=simulate hits_per_s hits_per_s 5000000",
                "depot insert-miss depth=16 per_op insn 700",
            ],
            Mode::Icount,
        );
        let verdict = judge(&baseline(), &run);
        assert_eq!(verdict.regressions.len(), 2);
        let (text, failure) = verdict.render("abc1234");
        let failure = failure.expect("the gate fails");
        assert!(failure.contains("baseline call - per_op") && failure.contains("stacktrace fp depth=64 per_trace"));
        assert!(
            text.contains("ABOVE BASELINE stacktrace fp depth=64 per_trace: 3404 -> 3439 insn (+35, +1.03%)"),
            "{text}"
        );
    }

    #[test]
    fn rises_within_allowance_and_drops_pass() {
        let run = rows(
            &[
                "baseline call - per_op insn 5",
                "stacktrace fp depth=64 per_trace insn 3438",
                // Fewer hits per second is not gated: the per-hit row carries the cost.
                "probes kprobe-nop method=simulate hits_per_s hits_per_s 10",
                "depot insert-miss depth=16 per_op insn 650",
            ],
            Mode::Icount,
        );
        let verdict = judge(&baseline(), &run);
        assert!(verdict.regressions.is_empty(), "{verdict:?}");
        assert_eq!((verdict.tolerated.len(), verdict.improvements.len(), verdict.checked), (2, 1, 3));
        let (text, failure) = verdict.render("abc1234");
        assert!(failure.is_none());
        assert!(
            text.contains("improvement depot insert-miss depth=16 per_op: 700 -> 650 insn (-50, -7.14%)"),
            "{text}"
        );
    }

    #[test]
    fn new_rows_are_listed_and_unmeasured_baseline_rows_fail() {
        let run = rows(&["baseline call - per_op insn 2", "baseline brand-new - per_op insn 99"], Mode::Icount);
        let verdict = judge(&baseline(), &run);
        let (text, failure) = verdict.render("abc1234");
        assert_eq!((verdict.new_rows.len(), verdict.missing_rows.len()), (1, 3));
        assert!(text.contains("new row (not in the baseline) baseline brand-new - per_op"));
        assert!(text.contains("baseline row not measured stacktrace fp depth=64 per_trace"));
        let failure = failure.expect("unmeasured baseline rows fail the gate");
        assert!(failure.starts_with("3 baseline rows not measured"), "{failure}");
        assert!(failure.contains("depot insert-miss depth=16 per_op"), "{failure}");
        // A new row alone does not fail it.
        let mut with_new = baseline();
        with_new.extend(rows(&["baseline brand-new - per_op insn 99"], Mode::Icount));
        assert!(judge(&baseline(), &with_new).render("abc1234").1.is_none());
    }

    #[test]
    fn the_committed_baseline_is_what_the_gate_measures() {
        let text = std::fs::read_to_string(baseline_path()).expect("the baseline is committed");
        let baseline = results::parse(&text).expect("the baseline parses");
        assert!(!baseline.rows.is_empty());
        for row in &baseline.rows {
            assert_eq!((row.cpu, row.variant, row.mode), (CPU, VARIANT, Mode::Icount), "{}", name(row));
            assert!(SUITES.contains(&row.suite.as_str()), "{}", name(row));
        }
        for suite in SUITES {
            assert!(baseline.rows.iter().any(|row| row.suite == suite), "no {suite} rows in the baseline");
        }
    }
}
