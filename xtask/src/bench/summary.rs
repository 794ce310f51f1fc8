//! What `bench` prints on stdout: a plan line with an estimate before the QEMU runs, and a few
//! headline rows per suite after them (the full tables stay in report.md).

use super::Mode;
use super::report::{self, distinct};
use super::results::Row;
use crate::build::BuildVariant;
use std::fmt::Write;
use std::path::Path;

/// Seconds of QEMU one pass of a suite takes (icount: the one rep; wall: each rep), rounded up
/// from icount runs on an AMD EPYC host with 2 CPUs: the gate's five suites take about 16 s
/// together, `probes` alone about 4 s. A wall rep runs the same loops, so it is taken to cost a
/// pass too. A plan's estimate, never a limit: `--timeout` is the limit.
fn seconds_per_pass(suite: &str) -> f64 {
    match suite {
        "baseline" => 1.0,
        "stacktrace" => 3.0,
        "depot" => 5.0,
        "probes" => 4.0,
        "ftrace" => 3.0,
        "kasan-boot" => 10.0,
        "cpus" => 15.0,
        "cpus-heap" => 8.0,
        "kasan-replay" => 30.0,
        _ => 10.0,
    }
}

/// Starting QEMU and booting to the bench plan line.
const BOOT_SECONDS: f64 = 1.0;

/// The plan of a multi-boot run (more than one QEMU boot): how many boots and an estimated
/// time, said to be an estimate. None for a single boot, which needs no warning.
pub fn plan(by_variant: &[(BuildVariant, Vec<&str>)], cpus: usize, modes: &[Mode], reps: u32) -> Option<String> {
    let boots = by_variant.len() * cpus * modes.len();
    if boots < 2 {
        return None;
    }
    let mut seconds = 0.0;
    for (_, suites) in by_variant {
        let pass: f64 = suites.iter().map(|suite| seconds_per_pass(suite)).sum();
        for mode in modes {
            let passes = if *mode == Mode::Icount { 1.0 } else { f64::from(reps) };
            seconds += cpus as f64 * (BOOT_SECONDS + pass * passes);
        }
    }
    let modes: Vec<&str> = modes.iter().map(|mode| mode.name()).collect();
    let reps =
        if modes.iter().any(|mode| *mode != "icount") { format!(", {reps} reps in wall mode") } else { String::new() };
    Some(format!(
        "bench plan: {boots} QEMU boots ({} x {} x {}: {}{reps}); \
         estimate: about {} of QEMU (typical per-suite costs, not a measurement), plus kernel builds",
        counted(by_variant.len(), "build variant"),
        counted(cpus, "CPU variant"),
        counted(modes.len(), "mode"),
        modes.join(", "),
        duration(seconds)
    ))
}

/// `1 mode`, `2 modes`.
fn counted(count: usize, what: &str) -> String {
    if count == 1 { format!("1 {what}") } else { format!("{count} {what}s") }
}

/// `40 s`, `7 min`, `1 h 5 min`.
fn duration(seconds: f64) -> String {
    let seconds = seconds.ceil() as u64;
    match seconds {
        0..=89 => format!("{seconds} s"),
        90..=3599 => format!("{} min", seconds.div_ceil(60)),
        _ => format!("{} h {} min", seconds / 3600, (seconds % 3600).div_ceil(60)),
    }
}

/// A suite's headline: the metric and the rows an engineer looks at first.
struct Headline {
    suite: &'static str,
    metric: &'static str,
    /// Which (case, params) rows of that metric (params as `key=value` pairs).
    pick: fn(&str, &[(String, String)]) -> bool,
}

fn param<'a>(params: &'a [(String, String)], key: &str) -> Option<&'a str> {
    params.iter().find(|(name, _)| name == key).map(|(_, value)| value.as_str())
}

const HEADLINES: &[Headline] = &[
    Headline { suite: "baseline", metric: "per_op", pick: |_, _| true },
    Headline { suite: "stacktrace", metric: "per_trace", pick: |_, params| param(params, "depth") == Some("16") },
    Headline { suite: "depot", metric: "per_op", pick: |_, params| param(params, "depth") == Some("16") },
    Headline { suite: "probes", metric: "per_hit", pick: |case, _| matches!(case, "kprobe-push" | "uprobe-push") },
    Headline {
        suite: "ftrace",
        metric: "overhead",
        pick: |_, params| {
            param(params, "relevant") == Some("1") && matches!(param(params, "irrelevant"), Some("0" | "100"))
        },
    },
    Headline { suite: "kasan-boot", metric: "overhead_pct", pick: |_, _| true },
    Headline { suite: "cpus", metric: "per_hit", pick: |case, _| case == "kprobe-push" },
    Headline { suite: "cpus-heap", metric: "per_op", pick: |_, _| true },
];

/// At most this many rows per suite: the summary is a glance, report.md has the rest.
const ROWS_PER_SUITE: usize = 10;

/// The stdout summary: per suite, its headline metric's chosen rows (a suite without a
/// headline: its first metric's first rows) with the same columns as report.md's table, then
/// where the full report is.
pub fn summary(rows: &[Row], report: &Path) -> String {
    let mut text = String::new();
    for suite in distinct(rows.iter().map(|row| row.suite.as_str())) {
        let in_suite: Vec<&Row> = rows.iter().filter(|row| row.suite == suite).collect();
        let headline = HEADLINES.iter().find(|headline| headline.suite == suite);
        let metric = headline
            .map(|headline| headline.metric)
            .filter(|metric| in_suite.iter().any(|row| row.metric == *metric))
            .unwrap_or(&in_suite[0].metric);
        let variant = in_suite.iter().find(|row| row.metric == metric).map(|row| row.variant);
        let group: Vec<&Row> = in_suite
            .iter()
            .copied()
            .filter(|row| row.metric == metric && Some(row.variant) == variant)
            .filter(|row| {
                headline.is_none_or(|headline| headline.metric != metric || (headline.pick)(&row.case, &row.params))
            })
            .collect();
        let cases = distinct(group.iter().map(|row| row.case.as_str()));
        let mut labels = distinct(group.iter().map(|row| (row.case.as_str(), &row.params)));
        labels.sort_by_key(|(case, _)| cases.iter().position(|known| known == case));
        let shown = labels.len().min(ROWS_PER_SUITE);
        let columns = report::measured_columns(&group, &labels);
        let mut table: Vec<Vec<String>> = vec![
            std::iter::once("case".to_string())
                .chain(columns.iter().map(|column| column.header.replace('`', "")))
                .collect(),
        ];
        for (case, params) in &labels[..shown] {
            let mut line = vec![if params.is_empty() {
                (*case).to_string()
            } else {
                format!(
                    "{case} {}",
                    params.iter().map(|(key, value)| format!("{key}={value}")).collect::<Vec<_>>().join(",")
                )
            }];
            for column in &columns {
                let row = group.iter().find(|row| {
                    row.case == *case && row.params == **params && row.mode == column.mode && row.cpu == column.cpus[0]
                });
                line.push(row.map_or("-".into(), |row| report::cell(row)));
            }
            table.push(line);
        }
        let more = if labels.len() > shown { format!(", {} of {} rows", shown, labels.len()) } else { String::new() };
        let variant = variant.map_or("", BuildVariant::name);
        let _ = writeln!(text, "{suite}: {metric} (build variant {variant}{more})");
        let widths: Vec<usize> =
            (0..table[0].len()).map(|index| table.iter().map(|line| line[index].len()).max().unwrap_or(0)).collect();
        for line in &table {
            let cells: Vec<String> = line
                .iter()
                .zip(&widths)
                .enumerate()
                .map(
                    |(index, (cell, width))| {
                        if index == 0 { format!("{cell:<width$}") } else { format!("{cell:>width$}") }
                    },
                )
                .collect();
            let _ = writeln!(text, "  {}", cells.join("  ").trim_end());
        }
        text.push('\n');
    }
    let _ = writeln!(text, "Every table, chart and the fidelity check: {}", report.display());
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::results::tests::rows;

    #[test]
    fn a_multi_boot_plan_says_its_boots_and_that_its_time_is_an_estimate() {
        let by_variant =
            vec![(BuildVariant::Prod, vec!["baseline", "probes"]), (BuildVariant::Full, vec!["kasan-boot"])];
        let line = plan(&by_variant, 5, &[Mode::Icount, Mode::Wall], 5).expect("20 boots");
        assert!(
            line.starts_with(
                "bench plan: 20 QEMU boots (2 build variants x 5 CPU variants x 2 modes: icount, wall, 5 reps in wall mode)"
            ),
            "{line}"
        );
        // prod: 5 x (1 + 5) + 5 x (1 + 25) = 160; full: 5 x 11 + 5 x 51 = 310: 470 s, 8 min.
        assert!(line.contains("estimate: about 8 min of QEMU"), "{line}");
        assert!(plan(&[(BuildVariant::Prod, vec!["probes"])], 1, &[Mode::Icount], 1).is_none());
        assert_eq!(duration(40.0), "40 s");
        assert_eq!(duration(3700.0), "1 h 2 min");
    }

    #[test]
    fn the_summary_shows_headline_rows_only() {
        let all = rows(
            &[
                "probes kprobe-push method=simulate per_hit insn 192",
                "probes kprobe-nop method=simulate per_hit insn 240",
                "probes kprobe-push method=simulate hits_per_s hits_per_s 5208300.781",
                "depot saturation distinct=1 records records 1",
            ],
            Mode::Icount,
        );
        let text = summary(&all, Path::new("out/report.md"));
        assert!(text.contains("probes: per_hit (build variant prod)"), "{text}");
        let line = text.lines().find(|line| line.starts_with("  kprobe-push method=simulate ")).expect("headline row");
        assert!(line.ends_with(" 192"), "{text}");
        assert!(!text.contains("kprobe-nop") && !text.contains("5208300"), "{text}");
        // A suite without its headline metric shows its first metric.
        assert!(text.contains("depot: records") && text.contains("saturation distinct=1"), "{text}");
        assert!(text.ends_with("Every table, chart and the fidelity check: out/report.md\n"));
    }
}
