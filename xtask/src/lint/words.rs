//! The words that speak of how the project was made rather than of the project: rejected in
//! every tracked file, so they do not come back.
//!
//! A reader has no tracker, no work log and no branch list: an issue number, a work session, a
//! branch name, "this machine" or a path outside the repository resolves to nothing. A figure
//! names its commit and the machine (CPU model and cores) it was measured on instead.

use regex::Regex;
use std::path::{Component, Path, PathBuf};
use std::process::Command;

/// What is rejected (case-insensitive), each with the reason printed beside a hit.
pub const PATTERNS: &[(&str, &str)] = &[
    (r"\bsessions?\b", "a work session: say what the code does, and when by commit"),
    (r"\bissues? #?[0-9]+", "a tracker issue number: name the subject"),
    (r"seed 00[0-9]", "a seed number: name the thread by subject, author and date (docs/threads.md)"),
    (r"shared/BENCH|\.\./shared\b", "a path outside the repository"),
    (r"\bthis (\d+-core )?machine\b|\bthis \d+-core host\b", "which machine: name its CPU model and cores"),
    (r"helpers' builds|other engineers'", "who else was building: name the machine and its load"),
    // Only branch names that are not also words of the tree (`udetour` names a race test's tasks).
    (
        r"\b(race2|smp2|smp3|sweep2|sweep3|sweep4|stack2|stack3|urace|uslot|ftindex|depot-fast)\b",
        "a branch name: name the commit",
    ),
];

/// Tracked files the patterns do not apply to, and why.
pub const EXEMPT: &[(&str, &str)] = &[
    ("xtask/src/lint/words.rs", "the pattern list itself"),
    ("docs/threads.md", "recorded third-party data: quotes and titles of Linux mailing-list threads"),
];

/// One rejected line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hit {
    pub path: String,
    pub line: usize,
    pub text: String,
    pub reason: &'static str,
}

/// The compiled patterns.
pub struct Matcher {
    patterns: Vec<(Regex, &'static str)>,
}

impl Default for Matcher {
    fn default() -> Self {
        let patterns = PATTERNS
            .iter()
            .map(|&(pattern, reason)| {
                (Regex::new(&format!("(?i){pattern}")).expect("the word patterns are valid"), reason)
            })
            .collect();
        Self { patterns }
    }
}

impl Matcher {
    /// The reason `line` is rejected, if it is.
    pub fn reject(&self, line: &str) -> Option<&'static str> {
        self.patterns.iter().find(|(pattern, _)| pattern.is_match(line)).map(|&(_, reason)| reason)
    }

    /// Every rejected line of the file `path` (relative to the repository root) holding `text`:
    /// the patterns, and in Markdown a link whose relative target leaves the repository.
    pub fn scan(&self, path: &str, text: &str) -> Vec<Hit> {
        if EXEMPT.iter().any(|&(exempt, _)| exempt == path) {
            return Vec::new();
        }
        let markdown = path.ends_with(".md");
        let mut hits = Vec::new();
        for (index, line) in text.lines().enumerate() {
            let reason = self
                .reject(line)
                .or_else(|| (markdown && links_outside(path, line)).then_some("a link outside the repository"));
            if let Some(reason) = reason {
                hits.push(Hit { path: path.to_owned(), line: index + 1, text: line.trim().to_owned(), reason });
            }
        }
        hits
    }
}

/// Whether a Markdown link on `line` of the file `path` climbs above the repository root.
fn links_outside(path: &str, line: &str) -> bool {
    let directory = Path::new(path).parent().unwrap_or(Path::new(""));
    line.match_indices("](").any(|(start, _)| {
        let target = &line[start + 2..];
        let target = &target[..target.find([')', '#', ' ']).unwrap_or(target.len())];
        if target.contains("://") || target.starts_with("mailto:") || target.starts_with('/') {
            return false;
        }
        let mut depth: isize = 0;
        for component in directory.join(target).components() {
            match component {
                Component::ParentDir => depth -= 1,
                Component::Normal(_) => depth += 1,
                _ => {}
            }
            if depth < 0 {
                return true;
            }
        }
        false
    })
}

/// Every rejected line of the tracked files under `root`.
pub fn scan_tracked(root: &Path) -> Result<Vec<Hit>, String> {
    let output = Command::new("git")
        .args(["ls-files", "-z"])
        .current_dir(root)
        .output()
        .map_err(|error| format!("cannot run git ls-files: {error}"))?;
    if !output.status.success() {
        return Err(format!("git ls-files failed: {}", String::from_utf8_lossy(&output.stderr).trim()));
    }
    let matcher = Matcher::default();
    let mut hits = Vec::new();
    for path in output.stdout.split(|&byte| byte == 0).filter(|path| !path.is_empty()) {
        let path = String::from_utf8_lossy(path).into_owned();
        let full: PathBuf = root.join(&path);
        // Binary files and files deleted from the work tree hold no prose.
        let Ok(bytes) = std::fs::read(&full) else { continue };
        let Ok(text) = String::from_utf8(bytes) else { continue };
        hits.extend(matcher.scan(&path, &text));
    }
    Ok(hits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_the_words_of_the_project_s_making() {
        let matcher = Matcher::default();
        for line in [
            "measured in session 4's CI",
            "Sessions 3 and 5",
            "see issue 23",
            "(issues #22, 23)",
            "the uprobes series (seed 001)",
            "results.json (see ../shared/BENCH.md)",
            "about 10 minutes on this 2-core machine",
            "what this machine needs",
            "on this 2-core host shared with three other helpers' builds",
            "The fix is race2's (ae0cdf2)",
            "at the smp3 branch",
        ] {
            assert!(matcher.reject(line).is_some(), "{line}");
        }
    }

    #[test]
    fn keeps_the_project_s_own_words() {
        let matcher = Matcher::default();
        for line in [
            "the tag-seed argument seeds each CPU's generator",
            "seed 19's 4-CPU sample",
            "an issue with the grace period",
            "uslots_per_cpu and race20",
            "measured on AMD EPYC 7B13 (2 cores) at a0682b2",
            "the shared memory of both CPUs",
            "two_sessions_of",
            "spawn(\"udetour-user\", entry)",
        ] {
            assert_eq!(matcher.reject(line), None, "{line}");
        }
    }

    #[test]
    fn rejects_links_that_leave_the_repository() {
        let matcher = Matcher::default();
        let hits = matcher.scan("docs/reference/bench.md", "as [the notes](../../../shared/BENCH.md) say\n");
        assert_eq!(hits.len(), 1);
        let hits = matcher.scan("docs/reference/bench.md", "see [it](../../../notes/x.md)\n");
        assert_eq!(hits[0].reason, "a link outside the repository");
        assert_eq!(hits[0].line, 1);
        for inside in ["[a](../design/smp.md#figures)", "[b](https://lore.kernel.org/x)", "[c](bench.md)"] {
            assert!(matcher.scan("docs/reference/bench.md", inside).is_empty(), "{inside}");
        }
    }

    #[test]
    fn exempt_files_are_not_scanned() {
        let matcher = Matcher::default();
        assert!(matcher.scan("docs/threads.md", "issue 5 of the series").is_empty());
        assert_eq!(matcher.scan("docs/other.md", "ok\nissue 5 of the series\n")[0].line, 2);
    }
}
