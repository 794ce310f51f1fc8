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

/// A run's KTAP as a file kunit.py reads (`kunit.py parse FILE`): from `KTAP version 1` on,
/// the KTAP lines without their timestamps; a failed check's line (`test FAILED: ...`) as a
/// KTAP diagnostic (`# ...`) before its `not ok`.
pub fn document<'a>(lines: impl Iterator<Item = &'a str>) -> String {
    let mut text = String::new();
    for line in lines.map(str::trim).skip_while(|line| *line != "KTAP version 1") {
        let result = line.starts_with("ok ") || line.starts_with("not ok ");
        if line == "KTAP version 1"
            || result
            || line.strip_prefix("1..").is_some_and(|count| count.parse::<usize>().is_ok())
        {
            text.push_str(line);
            text.push('\n');
        } else if line.starts_with("test FAILED: ") {
            text.push_str(&format!("# {line}\n"));
        }
    }
    text
}

/// Writes [`document`] of a configuration's log as `DIR/NAME.ktap`, NAME the configuration's
/// label in lower case with every run of other characters than letters and digits as one `-`.
pub fn save<'a>(
    dir: &std::path::Path,
    configuration: &str,
    lines: impl Iterator<Item = &'a str>,
) -> std::io::Result<std::path::PathBuf> {
    let mut name = String::new();
    for character in configuration.chars() {
        if character.is_ascii_alphanumeric() {
            name.push(character.to_ascii_lowercase());
        } else if !name.is_empty() && !name.ends_with('-') {
            name.push('-');
        }
    }
    let path = dir.join(format!("{}.ktap", name.trim_end_matches('-')));
    std::fs::create_dir_all(dir)?;
    // Written whole and renamed: a reader never sees half a file.
    let partial = path.with_extension("ktap.partial");
    std::fs::write(&partial, document(lines))?;
    std::fs::rename(&partial, &path)?;
    Ok(path)
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
    fn the_saved_document_is_ktap_alone() {
        // The lines as the decoder hands them over: no level word.
        let run = RUN.replace("ERROR ", "");
        assert_eq!(
            document(run.lines()),
            "KTAP version 1\n1..3\nok 1 a\nok 2 b c # SKIP no SCS in plain\n# test FAILED: d\nnot ok 3 d\n"
        );
        let dir = std::env::temp_dir().join(format!("tracelab-ktap-{}", std::process::id()));
        let path = save(&dir, "virt, max,pauth=off, EL1, GICv2 variant full", run.lines()).unwrap();
        assert_eq!(path.file_name().unwrap(), "virt-max-pauth-off-el1-gicv2-variant-full.ktap");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), document(run.lines()));
        std::fs::remove_dir_all(&dir).unwrap();
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
