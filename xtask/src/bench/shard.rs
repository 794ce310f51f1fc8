//! `bench --shard K/N`: a shard's stamp beside its results.json, and `merge` joining the rows.
//!
//! The unit of the partition is a kernel run (variants, CPU variant, mode), not a rep: a row's
//! samples all come from one run, so each row is whole in one shard and merging keeps its
//! samples, median, min and max exactly. Splitting a row's reps over shards would pool samples
//! taken on different machines under different loads into one median, which measures neither.

use super::results::{self, Provenance, Row};
use super::{Mode, Suite};
use crate::Failure;
use crate::build::BuildVariant;
use crate::qemu::CpuVariant;
use crate::shard::{Kind, Loaded, Shard, Stamp};
use serde_json::json;
use std::path::Path;

/// A run's place in the partition, as the stamp lists the whole run's plan.
pub fn run_key(variant: BuildVariant, cpu: CpuVariant, mode: Mode) -> String {
    format!("{} {} {}", variant.name(), cpu.name(), mode.name())
}

fn row_key(row: &Row) -> String {
    run_key(row.variant, row.cpu, row.mode)
}

/// What decides a bench run's work: suites, variant, CPUs, modes, reps, CPUs of the machine, board.
fn parameters(args: &super::BenchArgs, suites: &[&Suite]) -> String {
    let cpus: Vec<_> = args.cpus.iter().map(|cpu| cpu.name()).collect();
    format!(
        "bench suites={} variant={} cpus={} mode={} reps={} smp={} board={} kasan-short-granules={}",
        suites.iter().map(|suite| suite.name).collect::<Vec<_>>().join(","),
        args.variant.map_or("default", |variant| variant.name()),
        if cpus.is_empty() { "all".to_string() } else { format!("[{}]", cpus.join(" ")) },
        format!("{:?}", args.mode).to_lowercase(),
        args.reps,
        args.smp,
        args.board.name(),
        args.sanitizer.kasan_short_granules
    )
}

/// Writes OUT/shard.json: the stamp and the whole run's plan (every run's key, in order).
pub fn save(
    args: &super::BenchArgs,
    shard: Shard,
    suites: &[&Suite],
    out: &Path,
    plan: &[String],
) -> Result<(), Failure> {
    let stamp =
        Stamp { kind: Kind::Bench, shard, commit: crate::shard::commit(), parameters: parameters(args, suites) };
    crate::shard::write(out, &stamp, json!({ "plan": plan })).map(|_| ())
}

/// One text of the shards' provenances: the value when they agree, else each distinct one.
fn agreed(values: impl Iterator<Item = Option<String>>) -> Option<String> {
    let mut distinct: Vec<String> = Vec::new();
    for value in values.flatten() {
        if !distinct.contains(&value) {
            distinct.push(value);
        }
    }
    (!distinct.is_empty()).then(|| distinct.join(" | "))
}

/// The shards' rows in the unsharded run's order (by the plan, then as each run wrote them),
/// and one provenance: the latest date, and the QEMU, rustc and host CPU of each machine.
pub fn join(shards: &[(Vec<String>, results::Results)]) -> Result<results::Results, String> {
    let plan = &shards.first().ok_or("no shards")?.0;
    let mut rows: Vec<Row> = shards.iter().flat_map(|(_, results)| results.rows.iter().cloned()).collect();
    if let Some(row) = rows.iter().find(|row| !plan.contains(&row_key(row))) {
        return Err(format!("row {} ({}) is of no run in the plan", row.label(), row_key(row)));
    }
    rows.sort_by_key(|row| plan.iter().position(|key| *key == row_key(row)));
    let provenances: Vec<&Provenance> = shards.iter().map(|(_, results)| &results.provenance).collect();
    let first = provenances[0];
    let provenance = Provenance {
        commit: first.commit.clone(),
        describe: first.describe.clone(),
        rustc: agreed(provenances.iter().map(|p| p.rustc.clone())),
        qemu: agreed(provenances.iter().map(|p| Some(p.qemu.clone()))).unwrap_or_default(),
        host_cpu: agreed(provenances.iter().map(|p| p.host_cpu.clone())),
        reps: first.reps,
        date: provenances.iter().filter_map(|p| p.date.clone()).max(),
        board: first.board.clone(),
    };
    Ok(results::Results { schema: results::SCHEMA, provenance, rows })
}

/// `merge` of bench shards: OUT/results.json, report.md and one SVG per suite, as the
/// unsharded run writes them.
pub fn merge(shards: &[Loaded], out: &Path) -> Result<u8, Failure> {
    let mut read = Vec::new();
    for shard in shards {
        let refuse = |why: String| Failure::usage(format!("merge refused: {}: {why}", shard.directory.display()));
        let plan: Vec<String> = shard.document["plan"]
            .as_array()
            .ok_or_else(|| refuse("shard.json has no `plan`".into()))?
            .iter()
            .filter_map(|key| key.as_str().map(str::to_string))
            .collect();
        let path = shard.directory.join("results.json");
        let text = std::fs::read_to_string(&path).map_err(|error| refuse(format!("results.json: {error}")))?;
        let results = results::parse(&text).map_err(|error| refuse(format!("results.json: {error}")))?;
        read.push((plan, results));
    }
    if read.iter().any(|(plan, _)| *plan != read[0].0) {
        return Err(Failure::usage("merge refused: the shards' plans of runs differ"));
    }
    let results = join(&read).map_err(|why| Failure::usage(format!("merge refused: {why}")))?;
    let json = results::to_json(&results.provenance, &results.rows);
    let report = super::report::render(&results.provenance, &results.rows);
    super::write_file(&out.join("results.json"), &json)?;
    super::write_file(&out.join("report.md"), &report)?;
    let mut suites: Vec<&str> = Vec::new();
    for row in &results.rows {
        if !suites.contains(&row.suite.as_str()) {
            suites.push(&row.suite);
        }
    }
    for suite in &suites {
        super::draw_chart(&out.join(super::report::chart_file(suite)), suite, &results.rows)?;
    }
    print!("{}", super::summary::summary(&results.rows, &out.join("report.md")));
    eprintln!(
        "xtask: wrote {}/results.json, report.md and one SVG per suite ({} shards merged)",
        out.display(),
        shards.len()
    );
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(cpu: CpuVariant, mode: Mode, case: &str, samples: &[f64]) -> results::Sample {
        results::Sample {
            suite: "baseline".into(),
            case: case.into(),
            params: Vec::new(),
            metric: "cycles".into(),
            unit: "cycles".into(),
            value: samples[0],
            cpu,
            variant: BuildVariant::Prod,
            mode,
        }
    }

    /// Runs split over two shards, joined: the same rows, in the same order, as one run's.
    #[test]
    fn joined_shards_are_the_unsharded_rows() {
        let runs = [
            (CpuVariant::MaxNoPauth, Mode::Icount),
            (CpuVariant::MaxNoPauth, Mode::Wall),
            (CpuVariant::CortexA72, Mode::Icount),
            (CpuVariant::CortexA72, Mode::Wall),
            (CpuVariant::MaxQarma5, Mode::Icount),
        ];
        let plan: Vec<String> = runs.iter().map(|&(cpu, mode)| run_key(BuildVariant::Prod, cpu, mode)).collect();
        let samples_of = |index: usize, (cpu, mode): (CpuVariant, Mode)| {
            let mut samples = Vec::new();
            for rep in 0..3 {
                for case in ["loop", "call"] {
                    samples.push(results::Sample {
                        value: (10 * index + rep) as f64 + if case == "call" { 0.5 } else { 0.0 },
                        ..row(cpu, mode, case, &[0.0])
                    });
                }
            }
            samples
        };
        let whole: Vec<results::Sample> =
            runs.iter().enumerate().flat_map(|(index, &run)| samples_of(index, run)).collect();
        let whole = results::as_written(&Row::aggregate(&whole));
        let shard = |index: u32| {
            let shard = Shard { index, count: 2 };
            let samples: Vec<results::Sample> = runs
                .iter()
                .enumerate()
                .filter(|(ordinal, _)| shard.owns(*ordinal))
                .flat_map(|(ordinal, &run)| samples_of(ordinal, run))
                .collect();
            let rows = results::as_written(&Row::aggregate(&samples));
            (plan.clone(), results::Results { schema: results::SCHEMA, provenance: Provenance::default(), rows })
        };
        // Given in either order.
        let joined = join(&[shard(2), shard(1)]).unwrap();
        assert_eq!(
            results::to_json(&Provenance::default(), &joined.rows),
            results::to_json(&Provenance::default(), &whole)
        );
        // A row of no planned run is refused.
        let (_, mut stray) = shard(1);
        stray.rows[0].cpu = CpuVariant::MaxQarma3;
        assert!(join(&[(plan.clone(), stray)]).unwrap_err().contains("of no run in the plan"));
    }

    #[test]
    fn provenance_names_each_machine_once() {
        let values = ["qemu 10.0.2", "qemu 10.0.3", "qemu 10.0.2"].map(|text| Some(text.to_string()));
        assert_eq!(agreed(values.into_iter()).as_deref(), Some("qemu 10.0.2 | qemu 10.0.3"));
        assert_eq!(agreed([None, None].into_iter()), None);
    }
}
