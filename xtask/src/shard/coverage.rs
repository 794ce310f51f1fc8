//! The probe sweep's coverage lines as counts: read from a run's log, added up over shards.

use super::{Kind, Loaded, Shard, Stamp};
use crate::Failure;
use serde_json::Value;
use std::path::Path;

/// A sweep run's `sweep coverage:`, `sweep probed:`, `sweep refused:`, `sweep missed:`,
/// `sweep cpus:` and `sweep done:` lines, as numbers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Coverage {
    pub functions: u64,
    /// Functions whose counts were not compared (`with counts not compared`).
    pub exempt: u64,
    pub instructions: u64,
    pub batches: u64,
    /// The kernel's own time for the sweep: summed over shards (machine time), never compared.
    pub milliseconds: u64,
    /// Per method, in the kernel's order: (method, probes armed, kretprobes armed).
    pub probed: Vec<(String, u64, u64)>,
    /// Per refusal reason, in the order first seen: (reason, count).
    pub refused: Vec<(String, u64)>,
    pub missed: u64,
    /// On several CPUs: (CPUs, the other CPUs' passes, batches whose CPU 0 pass waited).
    /// Passes and waits depend on timing: summed, never compared.
    pub cpus: Option<(u64, u64, u64)>,
    pub failures: u64,
}

/// The numbers of `text` in order (digits only, thousands never separated in these lines).
fn numbers(text: &str) -> Vec<u64> {
    text.split(|c: char| !c.is_ascii_digit()).filter(|part| !part.is_empty()).filter_map(|n| n.parse().ok()).collect()
}

impl Coverage {
    /// The coverage of a run's lines; None without `sweep done:` (the run did not finish).
    pub fn parse<'a>(lines: impl IntoIterator<Item = &'a str>) -> Option<Coverage> {
        let mut coverage = Coverage::default();
        let mut done = false;
        for line in lines {
            if let Some(rest) = line.strip_prefix("sweep coverage: ") {
                let [functions, exempt, instructions, batches, milliseconds] = numbers(rest)[..] else { return None };
                (coverage.functions, coverage.exempt, coverage.instructions) = (functions, exempt, instructions);
                (coverage.batches, coverage.milliseconds) = (batches, milliseconds);
            } else if let Some(rest) = line.strip_prefix("sweep probed: ") {
                let (method, counts) = rest.split_once(' ')?;
                let [armed, kretprobes] = numbers(counts)[..] else { return None };
                coverage.probed.push((method.to_string(), armed, kretprobes));
            } else if let Some(rest) = line.strip_prefix("sweep refused: ") {
                let (count, reason) = rest.split_once(' ')?;
                coverage.refused.push((reason.to_string(), count.parse().ok()?));
            } else if let Some(rest) = line.strip_prefix("sweep missed: ") {
                coverage.missed = *numbers(rest).first()?;
            } else if let Some(rest) = line.strip_prefix("sweep cpus: ") {
                // `4 (cpu 0 and 3 looping the workload: P passes); W batches' counts on cpu 0
                // ...`: the CPU numbers are not counts.
                let values = numbers(rest);
                let [cpus, _, _, passes, waited, ..] = values[..] else { return None };
                coverage.cpus = Some((cpus, passes, waited));
            } else if let Some(rest) = line.strip_prefix("sweep done: ") {
                coverage.failures = *numbers(rest).first()?;
                done = true;
            }
        }
        done.then_some(coverage)
    }

    /// Adds another shard's counts to these.
    pub fn add(&mut self, other: &Coverage) {
        self.functions += other.functions;
        self.exempt += other.exempt;
        self.instructions += other.instructions;
        self.batches += other.batches;
        self.milliseconds += other.milliseconds;
        for (method, armed, kretprobes) in &other.probed {
            match self.probed.iter_mut().find(|(known, ..)| known == method) {
                Some((_, sum_armed, sum_kretprobes)) => {
                    *sum_armed += armed;
                    *sum_kretprobes += kretprobes;
                }
                None => self.probed.push((method.clone(), *armed, *kretprobes)),
            }
        }
        for (reason, count) in &other.refused {
            match self.refused.iter_mut().find(|(known, _)| known == reason) {
                Some((_, sum)) => *sum += count,
                None => self.refused.push((reason.clone(), *count)),
            }
        }
        self.missed += other.missed;
        self.cpus = match (self.cpus, other.cpus) {
            (Some((cpus, passes, waited)), Some((_, more_passes, more_waited))) => {
                Some((cpus, passes + more_passes, waited + more_waited))
            }
            (mine, theirs) => mine.or(theirs),
        };
        self.failures += other.failures;
    }

    /// The counts a whole run and its merged shards must share: all but the time, the other
    /// CPUs' passes and the waits for the run queue (timing decides those). Err(what differs).
    pub fn same_counts(&self, other: &Coverage) -> Result<(), String> {
        let mut differences = Vec::new();
        let mut compare = |what: &str, a: String, b: String| {
            if a != b {
                differences.push(format!("{what} {a} vs {b}"));
            }
        };
        compare("functions", self.functions.to_string(), other.functions.to_string());
        compare("not compared", self.exempt.to_string(), other.exempt.to_string());
        compare("instructions", self.instructions.to_string(), other.instructions.to_string());
        compare("batches", self.batches.to_string(), other.batches.to_string());
        compare("probed", format!("{:?}", self.probed), format!("{:?}", other.probed));
        let sorted = |refused: &[(String, u64)]| {
            let mut refused = refused.to_vec();
            refused.sort();
            refused.iter().map(|(reason, count)| format!("{count} {reason}")).collect::<Vec<_>>().join(", ")
        };
        compare("refused", sorted(&self.refused), sorted(&other.refused));
        compare("missed", self.missed.to_string(), other.missed.to_string());
        compare("cpus", format!("{:?}", self.cpus.map(|c| c.0)), format!("{:?}", other.cpus.map(|c| c.0)));
        compare("failures", self.failures.to_string(), other.failures.to_string());
        if differences.is_empty() { Ok(()) } else { Err(differences.join("; ")) }
    }

    /// The lines as the kernel prints them.
    pub fn lines(&self) -> Vec<String> {
        let mut lines = vec![format!(
            "sweep coverage: {} functions ({} with counts not compared), {} instructions, {} batches, {} ms",
            self.functions, self.exempt, self.instructions, self.batches, self.milliseconds
        )];
        for (method, armed, kretprobes) in &self.probed {
            lines.push(format!("sweep probed: {method} {armed} (kretprobes {kretprobes})"));
        }
        for (reason, count) in &self.refused {
            lines.push(format!("sweep refused: {count} {reason}"));
        }
        lines.push(format!("sweep missed: {} re-entered hits (from inside a probe handler)", self.missed));
        if let Some((cpus, passes, waited)) = self.cpus {
            lines.push(format!(
                "sweep cpus: {cpus} (cpu 0 and {} looping the workload: {passes} passes); {waited} batches' counts \
                 on cpu 0 not compared (it waited for the run queue)",
                cpus - 1
            ));
        }
        lines.push(format!("sweep done: {} failures", self.failures));
        lines
    }
}

/// One (variant, tracer scheme) run of a sweep shard, as its `shard.json` holds it.
struct ShardRun {
    label: String,
    passed: bool,
    coverage: Vec<String>,
}

fn runs_of(shard: &Loaded) -> Result<Vec<ShardRun>, String> {
    let runs = shard.document["runs"].as_array().ok_or("no `runs` array")?;
    runs.iter()
        .map(|run| {
            Ok(ShardRun {
                label: run["label"].as_str().ok_or("a run without `label`")?.to_string(),
                passed: run["passed"].as_bool().ok_or("a run without `passed`")?,
                coverage: run["coverage"]
                    .as_array()
                    .ok_or("a run without `coverage`")?
                    .iter()
                    .map(|line| line.as_str().map(str::to_string).ok_or("a coverage line is not text"))
                    .collect::<Result<_, _>>()?,
            })
        })
        .collect()
}

/// A sweep run's entry in its shard's `shard.json`.
pub fn run_entry(label: &str, passed: bool, coverage: &[String]) -> Value {
    serde_json::json!({ "label": label, "passed": passed, "coverage": coverage })
}

/// Writes a sweep shard's `shard.json`: its stamp and one entry per run ([`run_entry`]).
pub fn write_shard(directory: &Path, shard: Shard, parameters: String, runs: Vec<Value>) -> Result<(), Failure> {
    let stamp = Stamp { kind: Kind::Sweep, shard, commit: super::commit(), parameters };
    super::write(directory, &stamp, serde_json::json!({ "runs": runs })).map(|_| ())
}

/// One run (variant, tracer scheme) of merged sweep shards.
pub struct RunTotal {
    pub label: String,
    /// The sum of the shards' counts (of those that finished).
    pub total: Coverage,
    /// Every shard's run passed.
    pub passed: bool,
    /// Shards whose run did not finish (no `sweep done:`).
    pub stopped: Vec<String>,
}

/// The shards' counts added up per run; Err when the shards did not run the same runs.
pub fn totals(shards: &[Loaded]) -> Result<Vec<RunTotal>, String> {
    let mut per_shard = Vec::new();
    for shard in shards {
        per_shard.push(runs_of(shard).map_err(|error| format!("{}/shard.json: {error}", shard.directory.display()))?);
    }
    let Some(first) = per_shard.first() else { return Ok(Vec::new()) };
    let labels: Vec<String> = first.iter().map(|run| run.label.clone()).collect();
    for (shard, runs) in shards.iter().zip(&per_shard) {
        let these: Vec<String> = runs.iter().map(|run| run.label.clone()).collect();
        if these != labels {
            return Err(format!(
                "shard {} ({}) ran [{}], shard {} ran [{}]",
                shard.stamp.shard.name(),
                shard.directory.display(),
                these.join("; "),
                shards[0].stamp.shard.name(),
                labels.join("; ")
            ));
        }
    }
    Ok(labels
        .iter()
        .enumerate()
        .map(|(position, label)| {
            let mut run =
                RunTotal { label: label.clone(), total: Coverage::default(), passed: true, stopped: Vec::new() };
            for (shard, runs) in shards.iter().zip(&per_shard) {
                run.passed &= runs[position].passed;
                match Coverage::parse(runs[position].coverage.iter().map(String::as_str)) {
                    Some(coverage) => run.total.add(&coverage),
                    None => run.stopped.push(shard.stamp.shard.name()),
                }
            }
            run
        })
        .collect())
}

/// `merge` of sweep shards: per run (variant, tracer scheme), the sum of the shards' counts,
/// printed and written to `OUT/coverage.txt`; exit 1 when a shard's run failed or stopped.
pub fn merge(shards: &[Loaded], out: &Path) -> Result<u8, Failure> {
    let runs = totals(shards).map_err(|why| Failure::usage(format!("merge refused: {why}")))?;
    let mut text = String::new();
    let mut failed = false;
    for run in &runs {
        let verdict = if !run.stopped.is_empty() {
            format!("FAILED: shard {} did not finish", run.stopped.join(", "))
        } else if run.passed && run.total.failures == 0 {
            "ok".to_string()
        } else {
            "FAILED".to_string()
        };
        failed |= verdict != "ok";
        let heading = format!("stress probes [{}], {} shards merged: {verdict}", run.label, shards.len());
        println!("{heading}");
        text.push_str(&heading);
        text.push('\n');
        for line in run.total.lines() {
            println!("  {line}");
            text.push_str(&format!("  {line}\n"));
        }
    }
    let path = out.join("coverage.txt");
    super::write_text(&path, &text)?;
    eprintln!("xtask: wrote {}", path.display());
    Ok(u8::from(failed))
}

#[cfg(test)]
mod tests {
    use super::*;

    const WHOLE: &str = "sweep coverage: 32 functions (2 with counts not compared), 3000 instructions, 260 batches, 4100 ms
sweep probed: single-step 2000 (kretprobes 30)
sweep probed: brk-step 2001 (kretprobes 30)
sweep probed: simulate 1100 (kretprobes 3)
sweep probed: detour 2600 (kretprobes 31)
sweep refused: 700 no-probe text
sweep refused: 40 ftrace callsite
sweep missed: 4 re-entered hits (from inside a probe handler)
sweep cpus: 4 (cpu 0 and 3 looping the workload: 9000 passes); 3 batches' counts on cpu 0 not compared (it waited for the run queue)
sweep done: 0 failures";

    #[test]
    fn coverage_lines_read_and_print_the_same() {
        let coverage = Coverage::parse(WHOLE.lines()).unwrap();
        assert_eq!(coverage.functions, 32);
        assert_eq!(coverage.cpus, Some((4, 9000, 3)));
        assert_eq!(coverage.refused[1], ("ftrace callsite".to_string(), 40));
        assert_eq!(coverage.lines().join("\n"), WHOLE);
        // A run that stopped before its last line did not finish.
        assert_eq!(Coverage::parse(WHOLE.lines().take(9)), None);
    }

    /// Two shards written as `stress probes --shard` writes them, loaded, checked and merged.
    #[test]
    fn merge_writes_the_sum_of_written_shards() {
        let root = std::env::temp_dir().join(format!("xtask-sweep-merge-{}", std::process::id()));
        let lines = |text: &str| text.lines().map(str::to_string).collect::<Vec<_>>();
        for (index, passed) in [(1, true), (2, true)] {
            let runs = vec![run_entry("variant prod no tracer", passed, &lines(WHOLE))];
            write_shard(&root.join(index.to_string()), Shard { index, count: 2 }, "p".into(), runs).unwrap();
        }
        let shards = super::super::load(std::slice::from_ref(&root)).unwrap();
        super::super::check(&shards).unwrap();
        let runs = totals(&shards).unwrap();
        assert_eq!(runs.len(), 1);
        assert_eq!((runs[0].total.functions, runs[0].total.batches), (64, 520));
        assert_eq!(merge(&shards, &root.join("out")).unwrap(), 0);
        let written = std::fs::read_to_string(root.join("out/coverage.txt")).unwrap();
        assert!(written.starts_with("stress probes [variant prod no tracer], 2 shards merged: ok\n"), "{written}");
        assert!(written.contains("  sweep probed: simulate 2200 (kretprobes 6)\n"), "{written}");
        // A shard whose run died is named, and the merge fails.
        let runs = vec![run_entry("variant prod no tracer", false, &lines(WHOLE)[..3])];
        write_shard(&root.join("2"), Shard { index: 2, count: 2 }, "p".into(), runs).unwrap();
        let shards = super::super::load(std::slice::from_ref(&root)).unwrap();
        assert_eq!(totals(&shards).unwrap()[0].stopped, ["2/2"]);
        assert_eq!(merge(&shards, &root.join("out")).unwrap(), 1);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn shards_add_up_to_the_whole_run() {
        let first = "sweep coverage: 16 functions (1 with counts not compared), 1800 instructions, 150 batches, 2000 ms
sweep probed: single-step 1200 (kretprobes 15)
sweep probed: brk-step 1201 (kretprobes 15)
sweep probed: simulate 600 (kretprobes 1)
sweep probed: detour 1500 (kretprobes 16)
sweep refused: 40 ftrace callsite
sweep refused: 300 no-probe text
sweep missed: 1 re-entered hits (from inside a probe handler)
sweep cpus: 4 (cpu 0 and 3 looping the workload: 5000 passes); 1 batches' counts on cpu 0 not compared (it waited for the run queue)
sweep done: 0 failures";
        let second = "sweep coverage: 16 functions (1 with counts not compared), 1200 instructions, 110 batches, 2100 ms
sweep probed: single-step 800 (kretprobes 15)
sweep probed: brk-step 800 (kretprobes 15)
sweep probed: simulate 500 (kretprobes 2)
sweep probed: detour 1100 (kretprobes 15)
sweep refused: 400 no-probe text
sweep missed: 3 re-entered hits (from inside a probe handler)
sweep cpus: 4 (cpu 0 and 3 looping the workload: 4100 passes); 0 batches' counts on cpu 0 not compared (it waited for the run queue)
sweep done: 0 failures";
        let mut merged = Coverage::parse(first.lines()).unwrap();
        merged.add(&Coverage::parse(second.lines()).unwrap());
        let whole = Coverage::parse(WHOLE.lines()).unwrap();
        assert_eq!(merged.same_counts(&whole), Ok(()));
        assert_eq!((merged.milliseconds, merged.cpus), (4100, Some((4, 9100, 1))));
        let mut off = merged.clone();
        off.probed[2].1 += 1;
        off.missed += 1;
        let differences = off.same_counts(&whole).unwrap_err();
        assert!(differences.contains("probed") && differences.contains("missed 5 vs 4"), "{differences}");
    }
}
