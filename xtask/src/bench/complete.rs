//! Whether a bench run's log is a finished run: every suite asked for opened, closed with as
//! many rows as the kernel says it wrote, and every (suite, case, params, metric) row holds its
//! reps. A run that is not finished counts for nothing (no results.json, no saved run, no baseline).
//!
//! How the expected rows are known: the kernel cannot announce a suite's rows before it runs
//! them (how many CPU counts the `cpus` suites measure, which methods a target accepts, are found
//! while running), but it can count what it wrote. So a suite's closing line carries its row
//! count, which proves the suite ran to its end and that no row was lost on the way; and within
//! a finished suite, every row it wrote must have one value per rep (`reps=`), except the rows
//! `protocol::bench::ONCE_PER_RUN` names, which have one. A suite cut short has no closing line,
//! and the reps its rows have so far say how far it got.

use protocol::bench::{Row, SuiteEnd, once_per_run, suite_start};
use protocol::suite::Suite;

/// One row's identity within a run (its CPU, variant and mode are the run's).
#[derive(PartialEq, Eq)]
struct Key<'a> {
    suite: &'a str,
    case: &'a str,
    params: &'a str,
    metric: &'a str,
}

impl Key<'_> {
    fn name(&self) -> String {
        let params = if self.params == "-" { String::new() } else { format!(" {}", self.params) };
        format!("{} {}{params} {}", self.suite, self.case, self.metric)
    }
}

/// A suite asked for, as its log shows it.
#[derive(Default)]
struct SuiteSeen {
    opened: bool,
    /// The rows its closing line says the kernel wrote.
    closed: Option<u64>,
    /// The rows that arrived between its opening and closing lines.
    rows: u64,
}

/// The reps and suites the kernel says it runs (`bench plan:`): what a board that runs its SD
/// card's command line was asked for, which xtask did not choose.
pub fn announced<'a>(log: impl IntoIterator<Item = &'a str>) -> Option<(u32, Vec<&'a str>)> {
    let (reps, suites) = log.into_iter().find_map(protocol::bench::plan)?;
    let suites = match suites {
        "all" => Suite::ALL.iter().map(|suite| suite.name()).collect(),
        names => names.split(',').filter(|name| !name.is_empty()).collect(),
    };
    Some((reps, suites))
}

/// Incomplete rows named in full before the rest are counted.
const NAMED_ROWS: usize = 4;

/// What keeps `log` (the kernel's lines) from being a finished run of `suites` with `reps` reps
/// per row, in one line; None when it is one.
pub fn missing<'a>(log: impl IntoIterator<Item = &'a str>, suites: &[&str], reps: u32) -> Option<String> {
    let mut seen: Vec<(&str, SuiteSeen)> = suites.iter().map(|&suite| (suite, SuiteSeen::default())).collect();
    let mut counts: Vec<(Key, u64)> = Vec::new();
    let mut current: Option<usize> = None;
    for text in log {
        if let Some(suite) = suite_start(text) {
            current = seen.iter().position(|(name, _)| *name == suite);
            if let Some(index) = current {
                seen[index].1.opened = true;
            }
        } else if let Some(end) = SuiteEnd::from_line(text) {
            if let Some((_, suite)) = seen.iter_mut().find(|(name, _)| *name == end.suite) {
                suite.closed = Some(end.rows);
            }
            current = None;
        } else if let Some(Some(row)) = Row::from_line(text) {
            if let Some(index) = current {
                seen[index].1.rows += 1;
            }
            let key = Key { suite: row.suite, case: row.case, params: row.params, metric: row.metric };
            match counts.iter_mut().find(|(known, _)| *known == key) {
                Some((_, count)) => *count += 1,
                None => counts.push((key, 1)),
            }
        }
    }

    let mut short = Vec::new();
    for (key, count) in &counts {
        let expected = if once_per_run(key.suite, key.case) { 1 } else { u64::from(reps) };
        if *count < expected {
            short.push(format!("{count} of {expected} reps of {}", key.name()));
        } else if *count > expected {
            short.push(format!("{count} values of {}, expected {expected}", key.name()));
        }
    }
    let mut problems = Vec::new();
    if !short.is_empty() {
        let more = short.len().saturating_sub(NAMED_ROWS);
        short.truncate(NAMED_ROWS);
        let more = if more > 0 { format!(" and {more} more rows") } else { String::new() };
        problems.push(format!("incomplete: {}{more}", short.join(", ")));
    }
    let unstarted: Vec<&str> = seen.iter().filter(|(_, suite)| !suite.opened).map(|(name, _)| *name).collect();
    for (name, suite) in seen.iter().filter(|(_, suite)| suite.opened) {
        match suite.closed {
            None => problems.push(format!("suite {name} did not finish (no `bench suite end` line)")),
            Some(0) => problems.push(format!("suite {name} wrote no rows (its warnings above say why)")),
            Some(written) if written != suite.rows => {
                problems.push(format!("suite {name}: the kernel wrote {written} rows, {} arrived", suite.rows))
            }
            Some(_) => {}
        }
    }
    match unstarted.as_slice() {
        [] => {}
        [name] => problems.push(format!("suite {name} did not start")),
        names => problems.push(format!("suites {} did not start", names.join(", "))),
    }
    (!problems.is_empty()).then(|| problems.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A finished run of `baseline` (two cases) and `depot` (one per-rep row, one saturation
    /// row measured once) with `reps` reps, as the kernel logs it.
    fn finished(reps: u32) -> Vec<String> {
        let mut log = vec!["bench suite: baseline".to_string()];
        for rep in 0..reps {
            log.push(format!("bench row: baseline loop - per_op ns {}", 2 + rep));
            log.push(format!("bench row: baseline call - per_op ns {}", 4 + rep));
        }
        log.push(format!("bench suite end: baseline rows={}", 2 * reps));
        log.push("bench suite: depot".into());
        for rep in 0..reps {
            log.push(format!("bench row: depot insert-miss depth=16 per_op ns {}", 700 + rep));
            if rep == 0 {
                log.push("bench row: depot saturation distinct=1 records records 1".into());
            }
        }
        log.push(format!("bench suite end: depot rows={}", reps + 1));
        log.extend(["bench done".into(), "tracelab: exit status 0".into()]);
        log
    }

    fn check(log: &[String], reps: u32) -> Option<String> {
        missing(log.iter().map(String::as_str), &["baseline", "depot"], reps)
    }

    #[test]
    fn the_kernel_s_plan_names_reps_and_suites() {
        let log = ["tracelab: banner", "bench plan: reps=3 suites=depot,baseline", "bench suite: baseline"];
        assert_eq!(announced(log), Some((3, vec!["depot", "baseline"])));
        let all = announced(["bench plan: reps=1 suites=all"]).unwrap();
        assert_eq!(all.1.len(), Suite::ALL.len());
        assert_eq!(announced(["bench suite: baseline"]), None);
    }

    #[test]
    fn a_finished_run_passes_with_its_once_per_run_rows() {
        assert_eq!(check(&finished(5), 5), None);
        assert_eq!(check(&finished(1), 1), None);
    }

    #[test]
    fn a_log_cut_after_some_reps_names_what_is_missing() {
        // Killed after 20 of 1000 reps: cut the log after the 40th row line.
        let log = finished(1000);
        let cut: Vec<String> = log.iter().take(1 + 40).cloned().collect();
        assert_eq!(
            check(&cut, 1000).unwrap(),
            "incomplete: 20 of 1000 reps of baseline loop per_op, 20 of 1000 reps of baseline call per_op; \
             suite baseline did not finish (no `bench suite end` line); suite depot did not start"
        );
        // Cut after the first row line: one rep of one row.
        assert_eq!(
            check(&log[..2], 1000).unwrap(),
            "incomplete: 1 of 1000 reps of baseline loop per_op; suite baseline did not finish \
             (no `bench suite end` line); suite depot did not start"
        );
        // Cut before anything.
        assert_eq!(check(&[], 5).unwrap(), "suites baseline, depot did not start");
    }

    #[test]
    fn a_finished_suite_with_a_lost_row_or_a_short_row_fails() {
        // A row lost in transit: the closing line's count disagrees.
        let mut lost = finished(3);
        lost.remove(1);
        assert_eq!(
            check(&lost, 3).unwrap(),
            "incomplete: 2 of 3 reps of baseline loop per_op; suite baseline: the kernel wrote 6 rows, 5 arrived"
        );
        // The kernel skipped a rep of one row (its closing line counts what it wrote).
        let mut skipped = finished(3);
        skipped.remove(1);
        let end = skipped.iter().position(|line| line.starts_with("bench suite end: baseline")).unwrap();
        skipped[end] = "bench suite end: baseline rows=5".into();
        assert_eq!(check(&skipped, 3).unwrap(), "incomplete: 2 of 3 reps of baseline loop per_op");
        // A row measured once per run written per rep is not the contract either.
        let mut twice = finished(2);
        twice.insert(8, "bench row: depot saturation distinct=1 records records 1".into());
        let end = twice.iter().position(|line| line.starts_with("bench suite end: depot")).unwrap();
        twice[end] = "bench suite end: depot rows=4".into();
        assert_eq!(
            check(&twice, 2).unwrap(),
            "incomplete: 2 values of depot saturation distinct=1 records, expected 1"
        );
    }

    #[test]
    fn a_suite_without_rows_and_many_short_rows_are_said_briefly() {
        let empty = ["bench suite: baseline", "bench suite end: baseline rows=0"];
        assert_eq!(
            missing(empty, &["baseline"], 1).unwrap(),
            "suite baseline wrote no rows (its warnings above say why)"
        );
        let mut log = vec!["bench suite: baseline".to_string()];
        log.extend((0..6).map(|case| format!("bench row: baseline case{case} - per_op ns 1")));
        let message = missing(log.iter().map(String::as_str), &["baseline"], 2).unwrap();
        assert!(message.starts_with("incomplete: 1 of 2 reps of baseline case0 per_op, "), "{message}");
        assert!(message.contains("1 of 2 reps of baseline case3 per_op and 2 more rows; "), "{message}");
    }
}
