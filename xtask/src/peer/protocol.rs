//! The line protocol of the Linux peer's init (xtask/peer-init/init.c), version 1.
//!
//! Every line the init writes starts with `peer 1 ` and names its kind: `begin RELEASE`,
//! `fact NAME VALUE...`, `row CASE key=value...`, `error TEXT`, `end failures=N`. Other console
//! lines (the kernel's log) are not the init's and are skipped. A run counts only when it has
//! its `end` line with no failure, no `error` line, and every row's hits are those its loops
//! made; [`Report::check`] says which of these is missing.

/// What starts each line of the init's, with the protocol's version.
pub const PREFIX: &str = "peer 1 ";

/// One measurement: the same loop timed without and with the mechanism.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Measurement {
    pub case: String,
    /// Linux's `tracing_on`: 1 the mechanism and its recording, 0 the mechanism only.
    pub tracing_on: u8,
    pub iterations: u64,
    pub repetitions: u64,
    /// The minimum over the repetitions of one loop's CNTVCT ticks, without the mechanism.
    pub base: u64,
    /// The same with the mechanism.
    pub probed: u64,
    /// The hits Linux counted over every repetition of the probed loop; None where it cannot
    /// count them (the function tracer with `tracing_on` 0 commits no event).
    pub hits: Option<u64>,
}

impl Measurement {
    /// `CASE tracing_on=T iterations=N repetitions=R base=B probed=P hits=H` (H -1: not counted).
    pub fn parse(text: &str) -> Option<Self> {
        let mut words = text.split_whitespace();
        let case = words.next()?.to_string();
        let mut field = |key: &str| -> Option<i64> {
            let word = words.next()?;
            word.strip_prefix(key)?.strip_prefix('=')?.parse().ok()
        };
        let tracing_on = u8::try_from(field("tracing_on")?).ok().filter(|value| *value <= 1)?;
        let iterations = u64::try_from(field("iterations")?).ok().filter(|value| *value > 0)?;
        let repetitions = u64::try_from(field("repetitions")?).ok().filter(|value| *value > 0)?;
        let base = u64::try_from(field("base")?).ok()?;
        let probed = u64::try_from(field("probed")?).ok()?;
        let hits = match field("hits")? {
            -1 => None,
            hits => Some(u64::try_from(hits).ok()?),
        };
        words.next().is_none().then_some(Self { case, tracing_on, iterations, repetitions, base, probed, hits })
    }

    /// The mechanism's cost per hit in counter ticks: the two loops' difference over the
    /// iterations (both are minima, so neither carries an interrupt the other lacks).
    pub fn per_hit(&self) -> f64 {
        (self.probed as f64 - self.base as f64) / self.iterations as f64
    }

    /// The loop's own cost per iteration (for a kernel target: the syscall's entry and exit).
    pub fn loop_cost(&self) -> f64 {
        self.base as f64 / self.iterations as f64
    }

    /// Every call of the probed loops is one hit.
    pub fn expected_hits(&self) -> u64 {
        self.iterations * self.repetitions
    }
}

/// What one boot of the init said.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// `begin`'s kernel release, when the line came.
    pub release: Option<String>,
    pub facts: Vec<(String, String)>,
    pub measurements: Vec<Measurement>,
    pub errors: Vec<String>,
    /// `end`'s failure count, when the line came.
    pub failures: Option<u64>,
}

impl Report {
    /// The init's lines among a console's.
    pub fn parse(console: &str) -> Self {
        let mut report = Self::default();
        for line in console.lines() {
            // A line can arrive after kernel output that lacked its newline: find the prefix.
            let Some(start) = line.find(PREFIX) else { continue };
            let line = line[start + PREFIX.len()..].trim_end();
            let (kind, rest) = line.split_once(' ').unwrap_or((line, ""));
            match kind {
                "begin" => report.release = Some(rest.trim().to_string()),
                "fact" => {
                    let (name, value) = rest.split_once(' ').unwrap_or((rest, ""));
                    report.facts.push((name.to_string(), value.trim().to_string()));
                }
                "row" => match Measurement::parse(rest) {
                    Some(measurement) => report.measurements.push(measurement),
                    None => report.errors.push(format!("malformed row: {rest}")),
                },
                "error" => report.errors.push(rest.to_string()),
                "end" => report.failures = rest.trim().strip_prefix("failures=").and_then(|count| count.parse().ok()),
                _ => report.errors.push(format!("unknown line: {line}")),
            }
        }
        report
    }

    pub fn fact(&self, name: &str) -> Option<&str> {
        self.facts.iter().find(|(key, _)| key == name).map(|(_, value)| value.as_str())
    }

    /// `Ok` when the run counts: its `end` line without failures, no error, every expected
    /// case with both `tracing_on` values, and each row's hits those of its loops.
    pub fn check(&self, expected_cases: &[&str]) -> Result<(), String> {
        let mut problems = self.errors.clone();
        match self.failures {
            None => problems.push("the init's `end` line never came".into()),
            Some(0) => {}
            Some(failures) => problems.push(format!("the init counted {failures} failure(s)")),
        }
        for case in expected_cases {
            for tracing_on in [1, 0] {
                let rows =
                    self.measurements.iter().filter(|row| row.case == *case && row.tracing_on == tracing_on).count();
                if rows != 1 {
                    problems.push(format!("{rows} rows of {case} with tracing_on={tracing_on}, expected 1"));
                }
            }
        }
        for row in &self.measurements {
            if let Some(hits) = row.hits
                && hits != row.expected_hits()
            {
                problems.push(format!(
                    "{} tracing_on={}: {hits} hits, expected {}",
                    row.case,
                    row.tracing_on,
                    row.expected_hits()
                ));
            }
            if row.probed < row.base {
                problems.push(format!("{} tracing_on={}: the probed loop was faster", row.case, row.tracing_on));
            }
        }
        if problems.is_empty() { Ok(()) } else { Err(problems.join("; ")) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The console of a real boot of the init (`cargo xtask peer linux`, Debian's
    /// 6.12.95-1~bpo12+1, `-cpu max,pauth=off`, icount), kernel lines included.
    const CONSOLE: &str = include_str!("fixtures/linux-console.txt");

    #[test]
    fn a_real_console_parses_and_counts() {
        let report = Report::parse(CONSOLE);
        assert_eq!(report.release.as_deref(), Some("6.12.95+deb12-arm64"));
        assert_eq!(report.fact("cntfrq"), Some("1000000000"));
        assert_eq!(report.fact("vulnerability.meltdown"), Some("Not affected"));
        assert_eq!(report.check(super::super::linux::CASES), Ok(()));
        let kprobe = report.measurements.iter().find(|row| row.case == "kprobe" && row.tracing_on == 1).unwrap();
        assert_eq!(kprobe.expected_hits(), 10_000);
        assert_eq!(report.fact("depth.stacktrace-getppid"), Some("7"));
        assert!(kprobe.per_hit() > 100.0 && kprobe.loop_cost() > 100.0, "{kprobe:?}");
    }

    #[test]
    fn rows_fields_in_order_and_hits_not_counted() {
        let row =
            Measurement::parse("ftrace-one-ops tracing_on=0 iterations=10 repetitions=2 base=100 probed=150 hits=-1")
                .unwrap();
        assert_eq!(row.hits, None);
        assert_eq!(row.per_hit(), 5.0);
        assert_eq!(row.loop_cost(), 10.0);
        for bad in [
            "kprobe tracing_on=2 iterations=10 repetitions=2 base=1 probed=2 hits=20",
            "kprobe iterations=10 tracing_on=1 repetitions=2 base=1 probed=2 hits=20",
            "kprobe tracing_on=1 iterations=0 repetitions=2 base=1 probed=2 hits=20",
            "kprobe tracing_on=1 iterations=10 repetitions=2 base=1 probed=2 hits=20 extra=1",
            "kprobe tracing_on=1 iterations=10 repetitions=2 base=1 probed=2",
        ] {
            assert_eq!(Measurement::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_run_without_its_end_or_with_wrong_hits_does_not_count() {
        let lines = "[    1.0] kernel line\npeer 1 begin 6.12\n\
                     peer 1 row kprobe tracing_on=1 iterations=10 repetitions=2 base=1 probed=2 hits=20\n\
                     peer 1 row kprobe tracing_on=0 iterations=10 repetitions=2 base=1 probed=2 hits=19\n";
        let report = Report::parse(lines);
        let problems = report.check(&["kprobe"]).unwrap_err();
        assert!(problems.contains("`end` line never came"), "{problems}");
        assert!(problems.contains("kprobe tracing_on=0: 19 hits, expected 20"), "{problems}");
        let finished =
            Report::parse(&format!("{lines}peer 1 error write x: Invalid argument\npeer 1 end failures=1\n"));
        let problems = finished.check(&["kprobe", "uprobe-nop"]).unwrap_err();
        assert!(problems.starts_with("write x: Invalid argument; the init counted 1 failure(s)"), "{problems}");
        assert!(problems.contains("0 rows of uprobe-nop with tracing_on=1"), "{problems}");
    }
}
