//! `cargo xtask bench compare OLD NEW`: did a change make a row cheaper? One table per suite.
//!
//! icount rows are exact, so their difference is the change. Wall (and hardware) rows are noisy:
//! their min..max ranges are shown, and a change whose ranges overlap is marked within noise.

use super::Mode;
use super::report::{number, signed};
use super::results::{Results, Row};
use crate::Failure;
use std::collections::BTreeSet;
use std::fmt::Write;

pub fn run(old: &str, new: &str) -> Result<u8, Failure> {
    let (old_path, old_results) = super::load(old)?;
    let (new_path, new_results) = super::load(new)?;
    comparable(&old_results, &new_results).map_err(Failure::usage)?;
    print!("{}", render(&old_path.display().to_string(), &old_results, &new_path.display().to_string(), &new_results));
    Ok(0)
}

fn set<T: Ord>(rows: &[Row], key: impl Fn(&Row) -> T) -> BTreeSet<T> {
    rows.iter().map(key).collect()
}

fn names(set: &BTreeSet<&'static str>) -> String {
    set.iter().copied().collect::<Vec<_>>().join(" + ")
}

/// Refuses pairs whose figures do not measure the same thing: another mode, another CPU variant
/// or another build of a suite. The error is one line.
pub fn comparable(old: &Results, new: &Results) -> Result<(), String> {
    let modes = |results: &Results| set(&results.rows, |row| row.mode.name());
    if modes(old) != modes(new) {
        return Err(format!(
            "cannot compare {} figures with {} figures (another mode measures another thing)",
            names(&modes(old)),
            names(&modes(new))
        ));
    }
    let cpus = |results: &Results| set(&results.rows, |row| row.cpu.name());
    if cpus(old) != cpus(new) {
        return Err(format!(
            "cannot compare different CPU variants: {} against {}",
            names(&cpus(old)),
            names(&cpus(new))
        ));
    }
    if old.provenance.board != new.provenance.board {
        return Err(format!("cannot compare board {} with board {}", old.provenance.board, new.provenance.board));
    }
    for suite in set(&old.rows, |row| row.suite.clone()) {
        let variants = |results: &Results| {
            results.rows.iter().filter(|row| row.suite == suite).map(|row| row.variant.name()).collect::<BTreeSet<_>>()
        };
        let (before, after) = (variants(old), variants(new));
        if !after.is_empty() && before != after {
            return Err(format!(
                "cannot compare suite {suite} built as {} with {} (different build variants)",
                names(&before),
                names(&after)
            ));
        }
    }
    Ok(())
}

fn describe(label: &str, results: &Results) -> String {
    let provenance = &results.provenance;
    let mut text = format!("{label}: commit {}", provenance.describe.as_deref().unwrap_or(&provenance.commit));
    if let Some(date) = &provenance.date {
        let _ = write!(text, ", {date}");
    }
    let _ = write!(text, ", QEMU {}, schema {}", provenance.qemu, results.schema);
    text
}

/// A figure with its range when it has one.
fn figure(row: &Row) -> String {
    if row.mode == Mode::Icount || row.min == row.max {
        number(row.median)
    } else {
        format!("{} ({}..{})", number(row.median), number(row.min), number(row.max))
    }
}

/// The rows of `rows` that `others` lacks.
fn one_sided<'a>(rows: &[&'a Row], others: &[&Row]) -> Vec<&'a Row> {
    rows.iter().filter(|row| !others.iter().any(|other| other.same_row(row))).copied().collect()
}

/// One table of paired rows (old, new) and the counts of its notes: same, higher, lower, noise.
fn table(text: &mut String, pairs: &[(&Row, &Row)], show_configuration: bool) -> [usize; 4] {
    let (mut same, mut higher, mut lower, mut noise) = (0, 0, 0, 0);
    if pairs.is_empty() {
        return [0; 4];
    }
    *text += "| case | params | metric |";
    if show_configuration {
        *text += " configuration |";
    }
    *text += " old | new | difference | ratio | unit | |\n|---|---|---|";
    if show_configuration {
        *text += "---|";
    }
    *text += "---:|---:|---:|---:|---|---|\n";
    for (before, after) in pairs {
        let difference = after.median - before.median;
        let ratio = if before.median == 0.0 { "-".to_string() } else { format!("{:.3}", after.median / before.median) };
        let note = if difference == 0.0 {
            same += 1;
            ""
        } else if after.mode != Mode::Icount && before.overlaps(after) {
            noise += 1;
            "within noise"
        } else if difference > 0.0 {
            higher += 1;
            "higher"
        } else {
            lower += 1;
            "lower"
        };
        let _ = write!(text, "| {} | {} | {} |", after.case, after.params_text(), after.metric);
        if show_configuration {
            let _ = write!(text, " `{}` {} {} |", after.cpu.name(), after.variant.name(), after.mode.name());
        }
        let _ = writeln!(
            text,
            " {} | {} | {} | {ratio} | {} | {note} |",
            figure(before),
            figure(after),
            signed(difference),
            after.unit
        );
    }
    text.push('\n');
    [same, higher, lower, noise]
}

/// The comparison, one table per suite (in the order the suites first appear). The event
/// metrics of `--events` runs (`per_hit.exceptions`, ...) follow in a table of their own, so
/// that a change's events sit below its figures without mixing into their counts.
pub fn render(old_label: &str, old: &Results, new_label: &str, new: &Results) -> String {
    let mut text =
        format!("# bench compare\n\n- old: {}\n- new: {}\n\n", describe(old_label, old), describe(new_label, new));
    let mut suites: Vec<&str> = Vec::new();
    for row in old.rows.iter().chain(&new.rows) {
        if !suites.contains(&row.suite.as_str()) {
            suites.push(&row.suite);
        }
    }
    // A configuration column only when the rows span more than one.
    let configurations = set(&old.rows, |row| (row.cpu.name(), row.variant.name(), row.mode.name()));
    let show_configuration = configurations.len() > 1;
    for suite in suites {
        let _ = writeln!(text, "## {suite}\n");
        let old_rows: Vec<&Row> = old.rows.iter().filter(|row| row.suite == suite).collect();
        let new_rows: Vec<&Row> = new.rows.iter().filter(|row| row.suite == suite).collect();
        let pairs: Vec<(&Row, &Row)> = new_rows
            .iter()
            .filter_map(|row| old_rows.iter().find(|before| before.same_row(row)).map(|before| (*before, *row)))
            .collect();
        let (event_pairs, pairs): (Vec<_>, Vec<_>) =
            pairs.into_iter().partition(|(_, after)| super::events::is_event_metric(&after.metric));
        let [same, higher, lower, noise] = table(&mut text, &pairs, show_configuration);
        let _ = writeln!(
            text,
            "{} rows compared: {same} unchanged, {higher} higher, {lower} lower, {noise} within noise.",
            pairs.len()
        );
        // One-sided event rows are a run with --events against one without: said in one line.
        let (added, removed) = (one_sided(&new_rows, &old_rows), one_sided(&old_rows, &new_rows));
        for (rows, word) in [(&added, "added"), (&removed, "removed")] {
            for row in rows.iter().filter(|row| !super::events::is_event_metric(&row.metric)) {
                let _ = writeln!(
                    text,
                    "- {word}: {} {} {} ({} {})",
                    row.case,
                    row.params_text(),
                    row.metric,
                    figure(row),
                    row.unit
                );
            }
            let events = rows.iter().filter(|row| super::events::is_event_metric(&row.metric)).count();
            if events > 0 {
                let _ = writeln!(text, "- {word}: {events} event figures (one run counted events, the other did not)");
            }
        }
        if !event_pairs.is_empty() {
            let _ = writeln!(text, "\n### {suite}: events per operation (QEMU plugin; cycles: a model)\n");
            let [same, higher, lower, _] = table(&mut text, &event_pairs, show_configuration);
            let _ = writeln!(
                text,
                "{} event figures compared: {same} unchanged, {higher} higher, {lower} lower.",
                event_pairs.len()
            );
        }
        text.push('\n');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::results::tests::{SCHEMA_1, provenance, rows};
    use crate::bench::results::{self, Row, Sample};
    use crate::build::BuildVariant;
    use crate::qemu::CpuVariant;

    fn results(rows: Vec<Row>) -> Results {
        Results { schema: results::SCHEMA, provenance: provenance(), rows }
    }

    fn wall(lines: &[(&str, &[f64])]) -> Vec<Row> {
        let samples: Vec<Sample> = lines
            .iter()
            .flat_map(|(line, values)| {
                values.iter().map(move |value| {
                    Sample::parse(&format!("{line} {value}"), CpuVariant::MaxNoPauth, BuildVariant::Prod, Mode::Wall)
                        .expect("valid row")
                })
            })
            .collect();
        Row::aggregate(&samples)
    }

    #[test]
    fn identical_runs_show_zero_differences() {
        let run = results(rows(&["baseline call - per_op insn 2", "baseline loop - per_op insn 2.001"], Mode::Icount));
        comparable(&run, &run).expect("comparable");
        let text = render("a", &run, "b", &run);
        assert!(text.contains("| call | - | per_op | 2 | 2 | 0 | 1.000 | insn |  |"), "{text}");
        assert!(text.contains("2 rows compared: 2 unchanged, 0 higher, 0 lower, 0 within noise."), "{text}");
    }

    #[test]
    fn icount_differences_are_exact_and_one_sided_rows_listed() {
        let old = results(rows(
            &["stacktrace fp depth=16 per_trace insn 1388", "stacktrace gone - per_trace insn 5"],
            Mode::Icount,
        ));
        let new = results(rows(
            &["stacktrace fp depth=16 per_trace insn 1311", "stacktrace fresh - per_trace insn 7"],
            Mode::Icount,
        ));
        let text = render("a", &old, "b", &new);
        assert!(text.contains("| fp | depth=16 | per_trace | 1388 | 1311 | -77 | 0.945 | insn | lower |"), "{text}");
        assert!(text.contains("- added: fresh - per_trace (7 insn)"), "{text}");
        assert!(text.contains("- removed: gone - per_trace (5 insn)"), "{text}");
    }

    #[test]
    fn event_deltas_get_a_table_of_their_own() {
        let old = results(rows(
            &[
                "probes kprobe-push method=simulate per_hit insn 120",
                "probes kprobe-push method=simulate per_hit.exceptions events 2",
                "probes kprobe-push method=simulate per_hit.dsb events 1",
            ],
            Mode::Icount,
        ));
        let new = results(rows(
            &[
                "probes kprobe-push method=simulate per_hit insn 110",
                "probes kprobe-push method=simulate per_hit.exceptions events 1",
                "probes kprobe-push method=simulate per_hit.dsb events 1",
                "probes kprobe-push method=simulate per_hit.isb events 1",
            ],
            Mode::Icount,
        ));
        let text = render("a", &old, "b", &new);
        assert!(text.contains("1 rows compared: 0 unchanged, 0 higher, 1 lower, 0 within noise."), "{text}");
        assert!(text.contains("### probes: events per operation"), "{text}");
        assert!(
            text.contains(
                "| kprobe-push | method=simulate | per_hit.exceptions | 2 | 1 | -1 | 0.500 | events | lower |"
            ),
            "{text}"
        );
        assert!(text.contains("2 event figures compared: 1 unchanged, 0 higher, 1 lower."), "{text}");
        assert!(text.contains("- added: 1 event figures"), "{text}");
        // The events table follows the figures' summary.
        assert!(text.find("1 rows compared").unwrap() < text.find("### probes: events").unwrap(), "{text}");
    }

    #[test]
    fn wall_changes_inside_the_spread_are_noise() {
        let old = results(wall(&[
            ("baseline call - per_op ns", &[10.0, 12.0, 14.0]),
            ("baseline call-pac - per_op ns", &[100.0, 110.0, 120.0]),
        ]));
        let new = results(wall(&[
            ("baseline call - per_op ns", &[13.0, 15.0, 17.0]),
            ("baseline call-pac - per_op ns", &[200.0, 210.0, 220.0]),
        ]));
        let text = render("a", &old, "b", &new);
        assert!(
            text.contains("| call | - | per_op | 12 (10..14) | 15 (13..17) | +3 | 1.250 | ns | within noise |"),
            "{text}"
        );
        assert!(
            text.contains("| call-pac | - | per_op | 110 (100..120) | 210 (200..220) | +100 | 1.909 | ns | higher |"),
            "{text}"
        );
    }

    #[test]
    fn a_schema_1_file_compares_with_a_schema_2_run() {
        let old = results::parse(SCHEMA_1).expect("schema 1 parses");
        let new = results(rows(
            &["baseline loop - per_op insn 2.001", "stacktrace fp depth=16 per_trace insn 1311"],
            Mode::Icount,
        ));
        comparable(&old, &new).expect("comparable");
        let text = render("old", &old, "new", &new);
        assert!(text.contains("old: commit 4a5dd3b, QEMU 10.0.2, schema 1"), "{text}");
        assert!(text.contains("| fp | depth=16 | per_trace | 1388 | 1311 | -77 |"), "{text}");
    }

    #[test]
    fn refuses_other_modes_cpus_and_build_variants() {
        let icount = results(rows(&["baseline call - per_op insn 2"], Mode::Icount));
        let wall = results(wall(&[("baseline call - per_op ns", &[10.0])]));
        assert!(comparable(&icount, &wall).unwrap_err().contains("icount figures with wall figures"));
        let mut other_cpu = icount.clone();
        other_cpu.rows[0].cpu = CpuVariant::CortexA72;
        assert!(comparable(&icount, &other_cpu).unwrap_err().contains("different CPU variants"));
        let mut other_build = icount.clone();
        other_build.rows[0].variant = BuildVariant::Full;
        assert!(comparable(&icount, &other_build).unwrap_err().contains("different build variants"));
        for error in [comparable(&icount, &wall), comparable(&icount, &other_cpu), comparable(&icount, &other_build)] {
            assert!(!error.unwrap_err().contains('\n'), "one line");
        }
    }

    #[test]
    fn unreadable_and_unknown_files_are_exit_2() {
        let dir = std::env::temp_dir().join(format!("tracelab-compare-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("good.json");
        std::fs::write(&good, SCHEMA_1).unwrap();
        let future = dir.join("future.json");
        std::fs::write(&future, SCHEMA_1.replace("\"schema\": 1", "\"schema\": 9")).unwrap();
        let broken = dir.join("broken.json");
        std::fs::write(&broken, "{ not json").unwrap();
        let good = good.display().to_string();
        assert_eq!(run(&good, &good).expect("comparable"), 0);
        for other in [future, broken, dir.join("absent.json")] {
            let failure = run(&good, &other.display().to_string()).unwrap_err();
            assert_eq!(failure.status, 2, "{}", failure.message);
        }
        let failure = run(&good, &dir.join("future.json").display().to_string()).unwrap_err();
        assert!(failure.message.contains("unknown schema 9"), "{}", failure.message);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
