//! The kernel's KTAP lines read back, so what KTAP parsers see agrees with what xtask counts.

/// The kernel's KTAP lines: `KTAP version 1`, the plan `1..N`, `ok N NAME [# SKIP REASON]`,
/// `not ok N NAME`. Lines before the version line and other lines are not KTAP's.
#[derive(Debug, Default, PartialEq)]
pub struct Ktap {
    pub plan: Option<usize>,
    pub results: Vec<KtapResult>,
}

#[derive(Debug, PartialEq)]
pub struct KtapResult {
    ok: bool,
    number: usize,
    name: String,
    /// The reason after `# SKIP`.
    skip: Option<String>,
}

impl Ktap {
    pub fn parse<'a>(lines: impl Iterator<Item = &'a str>) -> Self {
        let mut ktap = Self::default();
        let mut lines = lines.skip_while(|line| line.trim() != "KTAP version 1").skip(1);
        for line in lines.by_ref() {
            let line = line.trim();
            if let Some(count) = line.strip_prefix("1..").and_then(|count| count.parse().ok()) {
                ktap.plan = Some(count);
                continue;
            }
            let (ok, rest) = match (line.strip_prefix("ok "), line.strip_prefix("not ok ")) {
                (Some(rest), _) => (true, rest),
                (_, Some(rest)) => (false, rest),
                _ => continue,
            };
            let Some((number, rest)) = rest.split_once(' ') else { continue };
            let Ok(number) = number.parse() else { continue };
            let (name, directive) = match rest.split_once(" # ") {
                Some((name, directive)) => (name, Some(directive)),
                None => (rest, None),
            };
            let skip =
                directive.and_then(|directive| directive.strip_prefix("SKIP")).map(|reason| reason.trim().to_string());
            ktap.results.push(KtapResult { ok, number, name: name.to_string(), skip });
        }
        ktap
    }

    /// Checks the plan, the numbering and the counts against the `test ok/skipped/FAILED` lines.
    pub fn agrees_with(&self, passed: u64, failed: u64, skipped: u64) -> Result<(), String> {
        let plan = self.plan.ok_or("no `KTAP version 1` and `1..N` plan")?;
        if self.results.len() != plan {
            return Err(format!("plan 1..{plan} but {} results", self.results.len()));
        }
        if let Some((index, result)) =
            self.results.iter().enumerate().find(|(index, result)| result.number != index + 1)
        {
            return Err(format!("result {} is numbered {}", index + 1, result.number));
        }
        let count = |ok: bool, skip: bool| {
            self.results.iter().filter(|result| result.ok == ok && result.skip.is_some() == skip).count() as u64
        };
        let (ktap_passed, ktap_skipped, ktap_failed) = (count(true, false), count(true, true), count(false, false));
        if (ktap_passed, ktap_failed, ktap_skipped) != (passed, failed, skipped) {
            return Err(format!(
                "{ktap_passed} ok, {ktap_failed} not ok, {ktap_skipped} skipped; the result lines say \
                 {passed} passed, {failed} failed, {skipped} skipped"
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RUN: &str = "banner\nKTAP version 1\n1..3\ntest start: a\ntest ok: a\nok 1 a\n\
                       test skipped: b c (no SCS in plain)\nok 2 b c # SKIP no SCS in plain\n\
                       ERROR test FAILED: d\nnot ok 3 d\ntests done: 1 passed, 1 failed, 1 skipped";

    #[test]
    fn ktap_lines_are_parsed() {
        let ktap = Ktap::parse(RUN.lines());
        assert_eq!(ktap.plan, Some(3));
        assert_eq!(
            ktap.results[1],
            KtapResult { ok: true, number: 2, name: "b c".into(), skip: Some("no SCS in plain".into()) }
        );
        assert_eq!(ktap.results[2], KtapResult { ok: false, number: 3, name: "d".into(), skip: None });
        assert_eq!(ktap.agrees_with(1, 1, 1), Ok(()));
    }

    #[test]
    fn ktap_disagreements_are_found() {
        let ktap = Ktap::parse(RUN.lines());
        assert!(ktap.agrees_with(2, 0, 1).unwrap_err().contains("1 ok, 1 not ok, 1 skipped"));
        let short = Ktap::parse(RUN.replace("1..3", "1..4").lines());
        assert_eq!(short.agrees_with(1, 1, 1), Err("plan 1..4 but 3 results".into()));
        let renumbered = Ktap::parse(RUN.replace("not ok 3", "not ok 5").lines());
        assert_eq!(renumbered.agrees_with(1, 1, 1), Err("result 3 is numbered 5".into()));
        // Without the version line nothing is KTAP.
        let unversioned = Ktap::parse(RUN.replace("KTAP version 1", "").lines());
        assert_eq!(unversioned, Ktap::default());
        assert!(unversioned.agrees_with(1, 1, 1).is_err());
    }
}
