//! Benchmark result rows: the kernel writes one log line per case, metric and rep, and xtask
//! reads them back with the one parser here.
//!
//! A row is `bench row: SUITE CASE PARAMS METRIC UNIT VALUE`: six fields separated by spaces,
//! PARAMS `-` or `key=value,...`, VALUE a number. The kernel writes it with defmt, whose format
//! strings must be literals: its writer spells the prefix itself and checks it against
//! [`ROW_PREFIX`] with a `const` assertion.
//!
//! Each suite's rows sit between `bench suite: SUITE` and `bench suite end: SUITE rows=N`, N the
//! rows the kernel wrote for it: xtask counts a suite only when its closing line came and as many
//! rows arrived, so a run cut short (QEMU killed, a timeout, a kernel that stopped printing)
//! never passes for a finished one.

/// What starts every row's line in the kernel's log.
pub const ROW_PREFIX: &str = "bench row: ";

/// What starts the line the kernel writes before its first suite: `bench plan: reps=N
/// suites=SUITE,...` (`suites=all` when none was named), what a board running its SD card's
/// command line was asked for.
pub const PLAN_PREFIX: &str = "bench plan: ";

/// The plan line's reps and suites (`all`: every suite).
pub fn plan(line: &str) -> Option<(u32, &str)> {
    let (reps, suites) = line.strip_prefix(PLAN_PREFIX)?.split_once(' ')?;
    Some((reps.strip_prefix("reps=")?.parse().ok()?, suites.trim().strip_prefix("suites=")?))
}

/// What starts the line the kernel writes before a suite's rows: `bench suite: SUITE`.
pub const SUITE_PREFIX: &str = "bench suite: ";

/// What starts the line the kernel writes after a suite's rows: `bench suite end: SUITE rows=N`.
pub const SUITE_END_PREFIX: &str = "bench suite end: ";

/// Rows a suite measures once per run whatever `reps=` says, as (suite, case): state read after
/// the measured work (a depot's size and hit rate when saturated, the sanitizer heap's depot
/// after its boots), not a cost repeated per rep. Every other row has one value per rep.
pub const ONCE_PER_RUN: [(&str, &str); 4] =
    [("depot", "saturation"), ("kasan-boot", "depot"), ("kasan-replay", "depot"), ("kasan-replay", "trace")];

/// Whether a row of `suite` and `case` is measured once per run ([`ONCE_PER_RUN`]).
pub fn once_per_run(suite: &str, case: &str) -> bool {
    ONCE_PER_RUN.iter().any(|&(once_suite, once_case)| once_suite == suite && once_case == case)
}

/// A suite's closing line: the suite and the rows the kernel wrote for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SuiteEnd<'a> {
    pub suite: &'a str,
    pub rows: u64,
}

impl<'a> SuiteEnd<'a> {
    /// The closing line's fields, or None when `line` is not `bench suite end: SUITE rows=N`.
    pub fn from_line(line: &'a str) -> Option<Self> {
        let (suite, rows) = line.strip_prefix(SUITE_END_PREFIX)?.split_once(" rows=")?;
        Some(Self { suite, rows: rows.trim().parse().ok()? })
    }
}

/// The suite a line opens (`bench suite: SUITE`), or None.
pub fn suite_start(line: &str) -> Option<&str> {
    line.strip_prefix(SUITE_PREFIX)
}

/// One row's fields, borrowed from its line.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Row<'a> {
    pub suite: &'a str,
    pub case: &'a str,
    /// `-` (none) or `key=value,...`; [`Row::params`] splits it.
    pub params: &'a str,
    pub metric: &'a str,
    pub unit: &'a str,
    pub value: f64,
}

impl<'a> Row<'a> {
    /// The fields of a log line that is a row (after [`ROW_PREFIX`]), or None when it is not one.
    pub fn fields(line: &'a str) -> Option<&'a str> {
        line.strip_prefix(ROW_PREFIX)
    }

    /// A log line's row: None when the line is not a row, `Some(None)` when it is one but its
    /// fields are malformed.
    pub fn from_line(line: &'a str) -> Option<Option<Self>> {
        Self::fields(line).map(Self::parse)
    }

    /// Parses a row's six fields (the text after [`ROW_PREFIX`]); None when a field is missing,
    /// one is left over, PARAMS is not `-` or `key=value,...`, or VALUE is not a number.
    pub fn parse(fields: &'a str) -> Option<Self> {
        let mut words = fields.split_whitespace();
        let mut next = || words.next();
        let row = Self {
            suite: next()?,
            case: next()?,
            params: next()?,
            metric: next()?,
            unit: next()?,
            value: next()?.parse().ok()?,
        };
        let well_formed =
            next().is_none() && (row.params == "-" || row.params.split(',').all(|pair| pair.split_once('=').is_some()));
        well_formed.then_some(row)
    }

    /// The params as (key, value) pairs, none for `-`.
    pub fn params(&self) -> impl Iterator<Item = (&'a str, &'a str)> + use<'a> {
        let params = if self.params == "-" { "" } else { self.params };
        params.split(',').filter(|pair| !pair.is_empty()).filter_map(|pair| pair.split_once('='))
    }
}

/// What starts the line that ties a row to its measured windows, written after the row when
/// the kernel runs with `bench.events=1` (`cargo xtask bench --events`):
/// `bench events: SUITE CASE PARAMS METRIC measured=A reference=B per=N`. The row's figure is
/// (A - B) / N (B `-`: A / N), A and B the costs of two windows on the cycle counter. Just
/// before the line the kernel executes the marker `hint #0x7f`, at which the events plugin
/// notes how many windows the CPU had closed: the windows are the latest ones before the marker
/// with those costs, and xtask gives each counted event the same arithmetic.
pub const EVENTS_PREFIX: &str = "bench events: ";

/// A row's windows (see [`EVENTS_PREFIX`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct RowWindows<'a> {
    pub suite: &'a str,
    pub case: &'a str,
    pub params: &'a str,
    pub metric: &'a str,
    pub measured: u64,
    pub reference: Option<u64>,
    pub per: u64,
}

impl<'a> RowWindows<'a> {
    /// A log line's windows: None when the line is not one, `Some(None)` when malformed.
    pub fn from_line(line: &'a str) -> Option<Option<Self>> {
        let fields = line.strip_prefix(EVENTS_PREFIX)?;
        let mut words = fields.split_whitespace();
        let mut next = || words.next();
        let mut parse = || -> Option<Self> {
            let (suite, case, params, metric) = (next()?, next()?, next()?, next()?);
            let measured = next()?.strip_prefix("measured=")?.parse().ok()?;
            let reference = match next()?.strip_prefix("reference=")? {
                "-" => None,
                cost => Some(cost.parse().ok()?),
            };
            let per = next()?.strip_prefix("per=")?.parse().ok()?;
            Some(Self { suite, case, params, metric, measured, reference, per })
        };
        let windows = parse();
        Some(windows.filter(|windows| next().is_none() && windows.per > 0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_is_read_back_field_by_field() {
        let row = Row::from_line("bench row: probes kprobe-push method=simulate,depth=4 per_hit insn 300")
            .expect("a row")
            .expect("well formed");
        assert_eq!(
            (row.suite, row.case, row.metric, row.unit, row.value),
            ("probes", "kprobe-push", "per_hit", "insn", 300.0)
        );
        assert_eq!(row.params().collect::<Vec<_>>(), [("method", "simulate"), ("depth", "4")]);
        let plain = Row::parse("baseline call - per_op insn 2.0").expect("a row");
        assert_eq!((plain.params, plain.value), ("-", 2.0));
        assert_eq!(plain.params().count(), 0);
    }

    #[test]
    fn suites_open_and_close_with_their_row_count() {
        assert_eq!(suite_start("bench suite: depot"), Some("depot"));
        assert_eq!(suite_start("bench suite end: depot rows=3"), None);
        assert_eq!(SuiteEnd::from_line("bench suite end: depot rows=3"), Some(SuiteEnd { suite: "depot", rows: 3 }));
        assert_eq!(SuiteEnd::from_line("bench suite end: depot rows=x"), None);
        assert_eq!(SuiteEnd::from_line("bench suite: depot"), None);
        assert!(once_per_run("depot", "saturation") && !once_per_run("depot", "insert-miss"));
        assert_eq!(plan("bench plan: reps=5 suites=baseline,depot"), Some((5, "baseline,depot")));
        assert_eq!(plan("bench plan: reps=1 suites=all"), Some((1, "all")));
        assert_eq!(plan("bench plan: reps=x suites=all"), None);
    }

    #[test]
    fn other_lines_are_not_rows_and_malformed_rows_are_said_so() {
        assert_eq!(Row::from_line("bench suite: baseline"), None);
        assert_eq!(Row::from_line("INFO bench row: baseline call - per_op insn 2"), None);
        for malformed in [
            "baseline call - per_op insn",
            "baseline call - per_op insn two",
            "baseline call - per_op insn 2 extra",
            "baseline call method per_op insn 2",
        ] {
            assert_eq!(Row::parse(malformed), None, "{malformed}");
            assert_eq!(Row::from_line(&format!("{ROW_PREFIX}{malformed}")), Some(None), "{malformed}");
        }
    }

    #[test]
    fn a_rows_windows_read_back() {
        let line = "bench events: probes kprobe-push method=simulate per_hit measured=1900 reference=40 per=10";
        let windows = RowWindows::from_line(line).expect("an events line").expect("well formed");
        assert_eq!(
            (windows.case, windows.measured, windows.reference, windows.per),
            ("kprobe-push", 1900, Some(40), 10)
        );
        let alone = "bench events: baseline loop - per_op measured=20010 reference=- per=10000";
        assert_eq!(RowWindows::from_line(alone).flatten().map(|windows| windows.reference), Some(None));
        assert_eq!(RowWindows::from_line("bench row: baseline loop - per_op insn 2"), None);
        for malformed in [
            "bench events: baseline loop - per_op measured=0 reference=- per=0",
            "bench events: baseline loop - per_op measured=0 reference=-",
            "bench events: baseline loop - per_op measured=x reference=- per=1",
            "bench events: baseline loop - per_op measured=0 reference=- per=1 extra",
        ] {
            assert_eq!(RowWindows::from_line(malformed), Some(None), "{malformed}");
        }
    }
}
