//! The report's peer column: Linux's figure for the lab row it compares with (the mapping of
//! docs/reference/bench.md, suite `linux`), and Linux's cost over the lab's, measured the same
//! way (`cargo xtask peer linux`: the same QEMU, CPU variant and icount settings).

use super::report::{ColumnKind, ExtraColumn, TableRow};
use super::results::Row;
use super::{Mode, number};
use crate::qemu::CpuVariant;

/// A lab row Linux's case compares with (Linux's metric is always `per_hit`, with the mechanism
/// alone: `tracing_on=0`).
struct LabRow {
    suite: &'static str,
    case: &'static str,
    params: &'static [(&'static str, &'static str)],
    metric: &'static str,
}

/// Which lab row each Linux case compares with.
const MAPPING: &[(&str, LabRow)] = &[
    ("kprobe", LabRow { suite: "probes", case: "kprobe-nop", params: &[("method", "single-step")], metric: "per_hit" }),
    (
        "kretprobe",
        LabRow { suite: "probes", case: "kretprobe-nop", params: &[("method", "single-step")], metric: "per_hit" },
    ),
    (
        "uprobe-nop",
        LabRow { suite: "probes", case: "uprobe-nop", params: &[("method", "single-step")], metric: "per_hit" },
    ),
    (
        "uprobe-push",
        LabRow { suite: "probes", case: "uprobe-push", params: &[("method", "single-step")], metric: "per_hit" },
    ),
    (
        "uprobe-ret",
        LabRow { suite: "probes", case: "uprobe-ret", params: &[("method", "simulate")], metric: "per_hit" },
    ),
    (
        "uretprobe-nop",
        LabRow { suite: "probes", case: "uretprobe-nop", params: &[("method", "single-step")], metric: "per_hit" },
    ),
    (
        "uretprobe-push",
        LabRow { suite: "probes", case: "uretprobe-push", params: &[("method", "single-step")], metric: "per_hit" },
    ),
    (
        "uretprobe-ret",
        LabRow { suite: "probes", case: "uretprobe-ret", params: &[("method", "simulate")], metric: "per_hit" },
    ),
    (
        "ftrace-one-ops",
        LabRow {
            suite: "ftrace",
            case: "call-ops",
            params: &[("relevant", "1"), ("irrelevant", "0")],
            metric: "overhead",
        },
    ),
    (
        "ftrace-unrelated-ops",
        LabRow {
            suite: "ftrace",
            case: "call-ops",
            params: &[("relevant", "1"), ("irrelevant", "1")],
            metric: "overhead",
        },
    ),
    (
        "ftrace-two-ops",
        LabRow {
            suite: "ftrace",
            case: "call-ops",
            params: &[("relevant", "2"), ("irrelevant", "0")],
            metric: "overhead",
        },
    ),
    // Linux's `per_hit` is the traced loop minus the loop: the lab's `overhead`.
    (
        "ftrace-graph",
        LabRow {
            suite: "ftrace",
            case: "graph",
            params: &[("relevant", "1"), ("irrelevant", "0")],
            metric: "overhead",
        },
    ),
    // Stack traces: the recorded depth the lab also measures (8), and the nearest one to 12 (the
    // other recorded depths, 7, 9 and 10, are nearest to 8 as well: one Linux row per lab row).
    (
        "stacktrace-task-pid-nr-ns",
        LabRow { suite: "stacktrace", case: "fp", params: &[("depth", "8")], metric: "per_trace" },
    ),
    (
        "stacktrace-generic-fillattr",
        LabRow { suite: "stacktrace", case: "fp", params: &[("depth", "16")], metric: "per_trace" },
    ),
];

/// The mechanism-alone figure the column shows.
const TRACING_OFF: (&str, &str) = ("tracing_on", "0");

/// Linux's row for a lab table row, if the mapping names one.
fn linux_row<'a>(peer: &'a [Row], table: &TableRow) -> Option<&'a Row> {
    let (linux_case, _) = MAPPING.iter().find(|(_, lab)| {
        lab.suite == table.suite
            && lab.case == table.case
            && lab.metric == table.metric
            && lab.params.len() == table.params.len()
            && lab.params.iter().all(|(key, value)| table.params.iter().any(|(k, v)| k == key && v == value))
    })?;
    peer.iter().find(|row| {
        row.case == *linux_case
            && row.metric == "per_hit"
            && row.params.iter().any(|(key, value)| key == TRACING_OFF.0 && value == TRACING_OFF.1)
    })
}

/// The lab's icount figure for a table row on Linux's CPU variant, to divide by.
fn lab_figure(lab: &[Row], table: &TableRow, cpu: CpuVariant) -> Option<f64> {
    lab.iter()
        .find(|row| {
            row.suite == table.suite
                && row.case == table.case
                && row.params == table.params
                && row.metric == table.metric
                && row.variant == table.variant
                && row.mode == Mode::Icount
                && row.cpu == cpu
        })
        .map(|row| row.median)
}

/// The peer column: `Linux N (Rx)`, N Linux's instructions for the same operation with the
/// mechanism alone, R Linux's over the lab's on the same CPU variant under icount.
pub fn column<'a>(lab: &'a [Row], peer: &'a [Row]) -> ExtraColumn<'a> {
    ExtraColumn {
        header: "Linux 6.12, mechanism alone (Linux / lab)".into(),
        kind: ColumnKind::Peer,
        cell: Box::new(move |table: &TableRow| {
            let linux = linux_row(peer, table)?;
            let ratio = lab_figure(lab, table, linux.cpu)
                .filter(|lab| *lab > 0.0)
                .map_or(String::new(), |lab| format!(" ({:.1}x)", linux.median / lab));
            Some(format!("{}{ratio}", number(linux.median)))
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::BuildVariant;

    fn row(suite: &str, case: &str, params: &[(&str, &str)], metric: &str, median: f64) -> Row {
        Row {
            suite: suite.into(),
            case: case.into(),
            params: params.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            cpu: CpuVariant::MaxNoPauth,
            variant: BuildVariant::Prod,
            mode: Mode::Icount,
            metric: metric.into(),
            unit: "insn".into(),
            median,
            min: median,
            max: median,
            n: 1,
            samples: vec![median],
        }
    }

    fn table<'a>(row: &'a Row) -> TableRow<'a> {
        TableRow { suite: &row.suite, case: &row.case, params: &row.params, metric: &row.metric, variant: row.variant }
    }

    #[test]
    fn a_mapped_row_gets_linux_figure_and_ratio_and_others_none() {
        let lab = vec![
            row("probes", "kprobe-nop", &[("method", "single-step")], "per_hit", 341.0),
            row("probes", "kprobe-nop", &[("method", "detour")], "per_hit", 80.0),
            row("ftrace", "call-ops", &[("relevant", "1"), ("irrelevant", "0")], "overhead", 50.0),
        ];
        let peer = vec![
            row("linux", "kprobe", &[("tracing_on", "1"), ("kernel", "k")], "per_hit", 900.0),
            row("linux", "kprobe", &[("tracing_on", "0"), ("kernel", "k")], "per_hit", 734.0),
            row("linux", "ftrace-one-ops", &[("tracing_on", "0"), ("kernel", "k")], "per_hit", 176.0),
        ];
        let column = column(&lab, &peer);
        assert_eq!((column.cell)(&table(&lab[0])).as_deref(), Some("734 (2.2x)"));
        assert_eq!((column.cell)(&table(&lab[1])), None, "detour is not what Linux runs");
        assert_eq!((column.cell)(&table(&lab[2])).as_deref(), Some("176 (3.5x)"));
        assert_eq!((column.cell)(&table(&peer[0])), None, "a Linux row is not a lab row");
    }

    /// Linux rows whose lab row is new and not in the committed baseline yet (`bench
    /// --update-baseline` takes it in; then it leaves this list, which the test enforces).
    const AWAITING_BASELINE: &[&str] = &["ftrace-graph"];

    #[test]
    fn every_mapped_lab_row_exists_in_the_baseline() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/baseline/icount.json");
        let text = std::fs::read_to_string(path).unwrap();
        let baseline = crate::bench::results::parse(&text).unwrap();
        for (linux, lab) in MAPPING {
            let present = baseline.rows.iter().any(|row| {
                row.suite == lab.suite
                    && row.case == lab.case
                    && row.metric == lab.metric
                    && lab.params.iter().all(|(k, v)| row.params.iter().any(|(rk, rv)| rk == k && rv == v))
            });
            assert!(
                present != AWAITING_BASELINE.contains(linux),
                "{linux}: lab row {} {} {:?} {} {}",
                lab.suite,
                lab.case,
                lab.params,
                lab.metric,
                if present { "is in the baseline now: take it off AWAITING_BASELINE" } else { "missing" }
            );
        }
    }
}
