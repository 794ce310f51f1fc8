//! Samples from the kernel, aggregated into results.json rows, and results.json itself:
//! written in schema 2, read in schema 1 and 2 (docs/reference/bench.md).

use super::Mode;
use crate::build::BuildVariant;
use crate::qemu::CpuVariant;
use protocol::bench;
use serde_json::{Map, Value, json};

/// The schema this xtask writes. Schema 2 extends schema 1 (every row keeps its fields) with
/// each row's samples and the run's provenance.
pub const SCHEMA: u64 = 2;

/// One measured value: one rep of one case's metric in one configuration.
#[derive(Clone)]
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
    /// Parses a row's fields, `SUITE CASE PARAMS METRIC UNIT VALUE` (`protocol::bench::Row`).
    #[cfg(test)]
    pub fn parse(fields: &str, cpu: CpuVariant, variant: BuildVariant, mode: Mode) -> Option<Self> {
        bench::Row::parse(fields).map(|row| Self::from_row(&row, cpu, variant, mode))
    }

    /// The sample a row measured in this configuration.
    pub fn from_row(row: &bench::Row, cpu: CpuVariant, variant: BuildVariant, mode: Mode) -> Self {
        Self {
            suite: row.suite.into(),
            case: row.case.into(),
            params: row.params().map(|(key, value)| (key.to_string(), value.to_string())).collect(),
            metric: row.metric.into(),
            unit: row.unit.into(),
            value: row.value,
            cpu,
            variant,
            mode,
        }
    }
}

/// One results.json row: the reps of one (suite, case, params, cpu, variant, mode, metric).
#[derive(Clone, Debug, PartialEq)]
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
    /// Every rep's value in the order measured; empty for rows read from a schema 1 file.
    pub samples: Vec<f64>,
}

impl Row {
    /// Groups samples (keeping first-seen order) and takes median, min and max of each group.
    pub fn aggregate(samples: &[Sample]) -> Vec<Row> {
        let mut rows: Vec<Row> = Vec::new();
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
            match rows.iter_mut().find(|row| same(row)) {
                Some(row) => row.samples.push(sample.value),
                None => rows.push(Row {
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
                    samples: vec![sample.value],
                }),
            }
        }
        for row in &mut rows {
            let mut values = row.samples.clone();
            values.sort_by(f64::total_cmp);
            let middle = values.len() / 2;
            row.median =
                if values.len() % 2 == 1 { values[middle] } else { (values[middle - 1] + values[middle]) / 2.0 };
            row.min = values[0];
            row.max = values[values.len() - 1];
            row.n = values.len();
        }
        rows
    }

    pub fn params_text(&self) -> String {
        if self.params.is_empty() {
            return "-".into();
        }
        self.params.iter().map(|(key, value)| format!("{key}={value}")).collect::<Vec<_>>().join(",")
    }

    /// The case with its params, as charts and tables name one measured thing.
    pub fn label(&self) -> String {
        if self.params.is_empty() { self.case.clone() } else { format!("{} {}", self.case, self.params_text()) }
    }

    /// Whether `other` is the same row of another run (everything but the figures).
    pub fn same_row(&self, other: &Row) -> bool {
        self.suite == other.suite
            && self.case == other.case
            && self.params == other.params
            && self.cpu == other.cpu
            && self.variant == other.variant
            && self.mode == other.mode
            && self.metric == other.metric
    }

    /// Whether the min..max ranges of two rows share a point.
    pub fn overlaps(&self, other: &Row) -> bool {
        self.min <= other.max && other.min <= self.max
    }
}

/// Where and from what a results.json was made. Fields that schema 1 did not have are `None`
/// when read from a schema 1 file.
#[derive(Clone, Debug, Default)]
pub struct Provenance {
    /// `git rev-parse --short HEAD`.
    pub commit: String,
    /// `git describe --always --dirty`: says whether the tree had uncommitted changes.
    pub describe: Option<String>,
    /// `rustc -V` of the kernel's toolchain.
    pub rustc: Option<String>,
    pub qemu: String,
    /// The host CPU's model name (/proc/cpuinfo): wall figures depend on it.
    pub host_cpu: Option<String>,
    /// Repetitions asked for in wall mode.
    pub reps: Option<u32>,
    /// When the run finished, UTC, `YYYY-MM-DD HH:MM:SS`.
    pub date: Option<String>,
    pub board: String,
}

/// A results.json: provenance and rows.
#[derive(Clone, Debug)]
pub struct Results {
    pub schema: u64,
    pub provenance: Provenance,
    pub rows: Vec<Row>,
}

/// Rounds a figure to what its mode can tell: icount figures are exact ratios of integer counts,
/// wall figures carry three significant decimals at most.
fn figure(value: f64) -> Value {
    let rounded = (value * 1000.0).round() / 1000.0;
    if rounded.fract() == 0.0 && rounded.abs() < 9.0e15 { json!(rounded as i64) } else { json!(rounded) }
}

/// results.json in schema 2. `board` extends the contract (virt, rpi4): QEMU `raspi4b` and `virt`
/// rows can both say `cortex-a72` and `wall`.
pub fn to_json(provenance: &Provenance, rows: &[Row]) -> String {
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
                "samples": row.samples.iter().map(|&value| figure(value)).collect::<Vec<_>>(),
            })
        })
        .collect();
    let document = json!({
        "schema": SCHEMA,
        "commit": provenance.commit,
        "describe": provenance.describe,
        "date": provenance.date,
        "rustc": provenance.rustc,
        "qemu": provenance.qemu,
        "host_cpu": provenance.host_cpu,
        "reps": provenance.reps,
        "board": provenance.board,
        "rows": rows,
    });
    serde_json::to_string_pretty(&document).expect("JSON values serialize") + "\n"
}

/// The rows as a results.json holds them (figures rounded as written), so that what a run
/// prints and compares equals what a later reader of its file sees.
pub fn as_written(rows: &[Row]) -> Vec<Row> {
    let text = to_json(&Provenance::default(), rows);
    parse(&text).expect("results.json written by this xtask parses").rows
}

/// Reads a results.json of schema 1 or 2. The error says what is wrong in one line.
pub fn parse(text: &str) -> Result<Results, String> {
    let document: Value = serde_json::from_str(text).map_err(|error| format!("not JSON: {error}"))?;
    let schema = document["schema"].as_u64().ok_or("no `schema` number")?;
    if !(1..=SCHEMA).contains(&schema) {
        return Err(format!("unknown schema {schema} (this xtask reads 1 to {SCHEMA})"));
    }
    let text_field = |name: &str| document[name].as_str().map(str::to_string);
    let provenance = Provenance {
        commit: text_field("commit").unwrap_or_else(|| "unknown".into()),
        describe: text_field("describe"),
        rustc: text_field("rustc"),
        qemu: text_field("qemu").unwrap_or_else(|| "unknown".into()),
        host_cpu: text_field("host_cpu"),
        reps: document["reps"].as_u64().and_then(|reps| u32::try_from(reps).ok()),
        date: text_field("date"),
        // Schema 1 files before `board` came from `virt`, the only board then.
        board: text_field("board").unwrap_or_else(|| "virt".into()),
    };
    let rows = document["rows"].as_array().ok_or("no `rows` array")?;
    let rows =
        rows.iter().enumerate().map(|(index, row)| parse_row(row).map_err(|error| format!("row {index}: {error}")));
    Ok(Results { schema, provenance, rows: rows.collect::<Result<_, _>>()? })
}

fn parse_row(row: &Value) -> Result<Row, String> {
    let text = |name: &str| row[name].as_str().map(str::to_string).ok_or_else(|| format!("no `{name}` text"));
    let number = |name: &str| row[name].as_f64().ok_or_else(|| format!("no `{name}` number"));
    let params = match &row["params"] {
        Value::Object(map) => map
            .iter()
            .map(|(key, value)| match value {
                Value::String(text) => Ok((key.clone(), text.clone())),
                Value::Number(number) => Ok((key.clone(), number.to_string())),
                _ => Err(format!("param `{key}` is neither a number nor a string")),
            })
            .collect::<Result<Vec<_>, _>>()?,
        Value::Null => Vec::new(),
        _ => return Err("`params` is not an object".into()),
    };
    let variant = text("variant")?;
    let variant = BuildVariant::KNOWN
        .into_iter()
        .find(|known| known.name() == variant)
        .ok_or_else(|| format!("unknown build variant '{variant}'"))?;
    let mode = text("mode")?;
    let mode = Mode::parse(&mode).ok_or_else(|| format!("unknown mode '{mode}'"))?;
    let samples = match &row["samples"] {
        Value::Array(values) => {
            values.iter().map(|value| value.as_f64().ok_or("a sample is not a number")).collect::<Result<_, _>>()?
        }
        _ => Vec::new(),
    };
    Ok(Row {
        suite: text("suite")?,
        case: text("case")?,
        params,
        cpu: CpuVariant::parse(&text("cpu")?)?,
        variant,
        mode,
        metric: text("metric")?,
        unit: text("unit")?,
        median: number("median")?,
        min: number("min")?,
        max: number("max")?,
        n: row["n"].as_u64().map_or(1, |n| n as usize),
        samples,
    })
}

#[cfg(test)]
pub mod tests {
    use super::*;

    pub fn sample(fields: &str, value_mode: Mode) -> Sample {
        Sample::parse(fields, CpuVariant::MaxNoPauth, BuildVariant::Prod, value_mode).expect("valid row")
    }

    /// Rows as the kernel would print them (`SUITE CASE PARAMS METRIC UNIT VALUE`), one rep each.
    pub fn rows(lines: &[&str], mode: Mode) -> Vec<Row> {
        Row::aggregate(&lines.iter().map(|line| sample(line, mode)).collect::<Vec<_>>())
    }

    pub fn provenance() -> Provenance {
        Provenance {
            commit: "abc1234".into(),
            describe: Some("abc1234-dirty".into()),
            rustc: Some("rustc 1.97.0-nightly".into()),
            qemu: "10.0.2".into(),
            host_cpu: Some("Test CPU".into()),
            reps: Some(5),
            date: Some("2026-11-23 19:00:00".into()),
            board: "virt".into(),
        }
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
        assert_eq!(wall.samples, vec![5.0, 1.0, 3.0, 10.0]);
        let icount = &rows[1];
        assert_eq!((icount.median, icount.n), (2.0, 1));
    }

    #[test]
    fn json_rows_carry_the_contract_fields() {
        let rows = rows(&["stacktrace scs depth=16 per_trace insn 61"], Mode::Icount);
        let document: Value = serde_json::from_str(&to_json(&provenance(), &rows)).unwrap();
        assert_eq!(document["schema"], 2);
        for field in ["commit", "describe", "date", "rustc", "qemu", "host_cpu", "reps", "board"] {
            assert!(!document[field].is_null(), "missing {field}");
        }
        let row = &document["rows"][0];
        for field in [
            "suite", "case", "params", "cpu", "variant", "mode", "metric", "unit", "median", "min", "max", "n",
            "samples",
        ] {
            assert!(!row[field].is_null(), "missing {field}");
        }
        assert_eq!(row["params"]["depth"], 16);
        assert_eq!(row["cpu"], "max,pauth=off");
        assert_eq!(row["variant"], "prod");
        assert_eq!(row["median"], 61);
        assert_eq!(row["samples"], json!([61]));
    }

    #[test]
    fn schema_2_reads_back_what_it_wrote() {
        let samples: Vec<Sample> = ["1.5", "2", "9"]
            .iter()
            .map(|value| sample(&format!("probes kprobe-nop method=simulate per_hit ns {value}"), Mode::Wall))
            .collect();
        let written = Row::aggregate(&samples);
        let read = parse(&to_json(&provenance(), &written)).expect("own output parses");
        assert_eq!(read.schema, 2);
        assert_eq!(read.rows, written);
        assert_eq!(read.provenance.describe.as_deref(), Some("abc1234-dirty"));
        assert_eq!(read.provenance.reps, Some(5));
    }

    #[test]
    fn rows_as_written_carry_the_file_s_rounding() {
        let rows = rows(&["baseline loop - per_op insn 2.00098"], Mode::Icount);
        let written = as_written(&rows);
        assert_eq!((written[0].median, written[0].samples.as_slice()), (2.001, [2.001].as_slice()));
    }

    /// A row as commit 4a5dd3b wrote it (schema 1: no samples, no provenance beyond commit/qemu).
    pub const SCHEMA_1: &str = r#"{
      "schema": 1, "commit": "4a5dd3b", "qemu": "10.0.2", "board": "virt",
      "rows": [
        {"suite": "baseline", "case": "loop", "params": {}, "cpu": "max,pauth=off", "variant": "prod",
         "mode": "icount", "metric": "per_op", "unit": "insn", "median": 2.001, "min": 2.001,
         "max": 2.001, "n": 1},
        {"suite": "stacktrace", "case": "fp", "params": {"depth": 16}, "cpu": "max,pauth=off",
         "variant": "prod", "mode": "icount", "metric": "per_trace", "unit": "insn", "median": 1388,
         "min": 1388, "max": 1388, "n": 1}
      ]
    }"#;

    #[test]
    fn schema_1_still_reads() {
        let read = parse(SCHEMA_1).expect("schema 1 parses");
        assert_eq!(read.schema, 1);
        assert_eq!(read.provenance.commit, "4a5dd3b");
        assert!(read.provenance.describe.is_none());
        assert_eq!(read.rows.len(), 2);
        assert_eq!(read.rows[1].params, vec![("depth".to_string(), "16".to_string())]);
        assert_eq!(read.rows[1].median, 1388.0);
        assert!(read.rows[1].samples.is_empty());
    }

    #[test]
    fn unknown_schema_and_broken_files_are_errors() {
        assert!(parse(&SCHEMA_1.replace("\"schema\": 1", "\"schema\": 3")).unwrap_err().contains("unknown schema 3"));
        assert!(parse("{").is_err());
        assert!(parse(r#"{"schema": 1}"#).unwrap_err().contains("rows"));
        assert!(parse(&SCHEMA_1.replace("max,pauth=off", "max,pauth=maybe")).unwrap_err().contains("row 0"));
    }
}
