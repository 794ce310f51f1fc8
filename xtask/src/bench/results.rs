//! Samples from the kernel, aggregated into results.json rows (shared/BENCH.md).

use super::Mode;
use crate::build::BuildVariant;
use crate::qemu::CpuVariant;
use serde_json::{Map, Value, json};

/// One measured value: one rep of one case's metric in one configuration.
pub struct Sample {
    pub suite: String,
    pub case: String,
    pub params: Vec<(String, String)>,
    pub metric: String,
    pub unit: String,
    pub value: f64,
    pub cpu: CpuVariant,
    pub variant: BuildVariant,
    pub mode: Mode,
}

impl Sample {
    /// Parses `SUITE CASE PARAMS METRIC UNIT VALUE` (PARAMS: `-` or `key=value,...`).
    pub fn parse(fields: &str, cpu: CpuVariant, variant: BuildVariant, mode: Mode) -> Option<Self> {
        let mut words = fields.split_whitespace();
        let (suite, case, params, metric, unit, value) =
            (words.next()?, words.next()?, words.next()?, words.next()?, words.next()?, words.next()?);
        let params = if params == "-" {
            Vec::new()
        } else {
            params
                .split(',')
                .map(|pair| pair.split_once('=').map(|(key, value)| (key.to_string(), value.to_string())))
                .collect::<Option<Vec<_>>>()?
        };
        Some(Self {
            suite: suite.into(),
            case: case.into(),
            params,
            metric: metric.into(),
            unit: unit.into(),
            value: value.parse().ok()?,
            cpu,
            variant,
            mode,
        })
    }
}

/// One results.json row: the reps of one (suite, case, params, cpu, variant, mode, metric).
pub struct Row {
    pub suite: String,
    pub case: String,
    pub params: Vec<(String, String)>,
    pub cpu: CpuVariant,
    pub variant: BuildVariant,
    pub mode: Mode,
    pub metric: String,
    pub unit: String,
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub n: usize,
}

impl Row {
    /// Groups samples (keeping first-seen order) and takes median, min and max of each group.
    pub fn aggregate(samples: &[Sample]) -> Vec<Row> {
        let mut rows: Vec<(Row, Vec<f64>)> = Vec::new();
        for sample in samples {
            let same = |row: &Row| {
                row.suite == sample.suite
                    && row.case == sample.case
                    && row.params == sample.params
                    && row.cpu == sample.cpu
                    && row.variant == sample.variant
                    && row.mode == sample.mode
                    && row.metric == sample.metric
            };
            match rows.iter_mut().find(|(row, _)| same(row)) {
                Some((_, values)) => values.push(sample.value),
                None => rows.push((
                    Row {
                        suite: sample.suite.clone(),
                        case: sample.case.clone(),
                        params: sample.params.clone(),
                        cpu: sample.cpu,
                        variant: sample.variant,
                        mode: sample.mode,
                        metric: sample.metric.clone(),
                        unit: sample.unit.clone(),
                        median: 0.0,
                        min: 0.0,
                        max: 0.0,
                        n: 0,
                    },
                    vec![sample.value],
                )),
            }
        }
        rows.into_iter()
            .map(|(mut row, mut values)| {
                values.sort_by(f64::total_cmp);
                let middle = values.len() / 2;
                row.median =
                    if values.len() % 2 == 1 { values[middle] } else { (values[middle - 1] + values[middle]) / 2.0 };
                row.min = values[0];
                row.max = values[values.len() - 1];
                row.n = values.len();
                row
            })
            .collect()
    }

    pub fn params_text(&self) -> String {
        if self.params.is_empty() {
            return "-".into();
        }
        self.params.iter().map(|(key, value)| format!("{key}={value}")).collect::<Vec<_>>().join(",")
    }
}

/// Rounds a figure to what its mode can tell: icount figures are exact ratios of integer counts,
/// wall figures carry three significant decimals at most.
fn figure(value: f64) -> Value {
    let rounded = (value * 1000.0).round() / 1000.0;
    if rounded.fract() == 0.0 && rounded.abs() < 9.0e15 { json!(rounded as i64) } else { json!(rounded) }
}

/// results.json. `board` extends the contract (virt, rpi4): QEMU `raspi4b` and `virt` rows can
/// both say `cortex-a72` and `wall`.
pub fn to_json(commit: &str, qemu: &str, board: &str, rows: &[Row]) -> String {
    let rows: Vec<Value> = rows
        .iter()
        .map(|row| {
            let params: Map<String, Value> = row
                .params
                .iter()
                .map(|(key, value)| {
                    let value = value.parse::<i64>().map(Value::from).unwrap_or_else(|_| Value::from(value.clone()));
                    (key.clone(), value)
                })
                .collect();
            json!({
                "suite": row.suite,
                "case": row.case,
                "params": params,
                "cpu": row.cpu.name(),
                "variant": row.variant.name(),
                "mode": row.mode.name(),
                "metric": row.metric,
                "unit": row.unit,
                "median": figure(row.median),
                "min": figure(row.min),
                "max": figure(row.max),
                "n": row.n,
            })
        })
        .collect();
    let document = json!({ "schema": 1, "commit": commit, "qemu": qemu, "board": board, "rows": rows });
    serde_json::to_string_pretty(&document).expect("JSON values serialize") + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(fields: &str, value_mode: Mode) -> Sample {
        Sample::parse(fields, CpuVariant::MaxNoPauth, BuildVariant::Prod, value_mode).expect("valid row")
    }

    #[test]
    fn parses_rows_with_and_without_params() {
        let plain = sample("baseline call - per_op insn 2", Mode::Icount);
        assert_eq!((plain.suite.as_str(), plain.case.as_str(), plain.value), ("baseline", "call", 2.0));
        assert!(plain.params.is_empty());
        let with = sample("stacktrace scs depth=16,kind=fp per_trace insn 61.5", Mode::Icount);
        assert_eq!(with.params, vec![("depth".into(), "16".into()), ("kind".into(), "fp".into())]);
        assert!(Sample::parse("baseline call", CpuVariant::MaxNoPauth, BuildVariant::Prod, Mode::Icount).is_none());
        assert!(Sample::parse("a b c=d=e, m u 1", CpuVariant::MaxNoPauth, BuildVariant::Prod, Mode::Icount).is_none());
    }

    #[test]
    fn aggregates_median_min_max_per_configuration() {
        let samples: Vec<Sample> = [5.0, 1.0, 3.0, 10.0]
            .iter()
            .map(|value| sample(&format!("baseline call - per_op ns {value}"), Mode::Wall))
            .chain([sample("baseline call - per_op insn 2", Mode::Icount)])
            .collect();
        let rows = Row::aggregate(&samples);
        assert_eq!(rows.len(), 2);
        let wall = &rows[0];
        assert_eq!((wall.median, wall.min, wall.max, wall.n), (4.0, 1.0, 10.0, 4));
        let icount = &rows[1];
        assert_eq!((icount.median, icount.n), (2.0, 1));
    }

    #[test]
    fn json_rows_carry_the_contract_fields() {
        let rows = Row::aggregate(&[sample("stacktrace scs depth=16 per_trace insn 61", Mode::Icount)]);
        let document: Value = serde_json::from_str(&to_json("abc1234", "10.0.2", "virt", &rows)).unwrap();
        assert_eq!(document["schema"], 1);
        let row = &document["rows"][0];
        for field in
            ["suite", "case", "params", "cpu", "variant", "mode", "metric", "unit", "median", "min", "max", "n"]
        {
            assert!(!row[field].is_null(), "missing {field}");
        }
        assert_eq!(row["params"]["depth"], 16);
        assert_eq!(row["cpu"], "max,pauth=off");
        assert_eq!(row["variant"], "prod");
        assert_eq!(row["median"], 61);
    }
}
