//! The checkable claims of `docs/architecture.md`: each `git grep` in a `sh lint` block must print
//! nothing, so the document cannot drift from the tree.
//!
//! A block is a fenced code block whose info string is `sh lint`. In it, `#` lines state a claim
//! and every following `git grep ...` line checks it; a blank line ends the claim. The block stays
//! a valid shell script, so a reader can paste it.

use std::path::Path;
use std::process::Command;

/// The document whose greps `cargo xtask lint` runs, relative to the workspace root.
pub const DOCUMENT: &str = "docs/architecture.md";

/// One command of a `sh lint` block, with the claim it checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// The claim, from the `#` lines above the command (joined by spaces).
    pub claim: String,
    /// The command as the document spells it, for the failure message.
    pub command: String,
    /// The command's words, as a shell would split them; the first two are `git` and `grep`.
    pub words: Vec<String>,
    /// The command's line in the document (1-based), for the failure message.
    pub line: usize,
}

/// A check that did not hold, or could not run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub check: Check,
    /// The lines the grep printed (or why it could not run).
    pub output: Vec<String>,
}

/// The checks of every `sh lint` block of `text`, or the first malformed line.
pub fn extract(text: &str) -> Result<Vec<Check>, String> {
    let mut checks = Vec::new();
    let mut in_block = false;
    let mut claim: Vec<&str> = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let number = index + 1;
        let trimmed = line.trim();
        if let Some(info) = trimmed.strip_prefix("```") {
            if in_block {
                in_block = false;
            } else {
                in_block = info.split_whitespace().eq(["sh", "lint"]);
                claim.clear();
            }
            continue;
        }
        if !in_block {
            continue;
        }
        if trimmed.is_empty() {
            claim.clear();
        } else if let Some(text) = trimmed.strip_prefix('#') {
            claim.push(text.trim());
        } else {
            let words = split_words(trimmed).map_err(|error| format!("line {number}: {error}"))?;
            if words.len() < 3 || words[0] != "git" || words[1] != "grep" {
                return Err(format!("line {number}: a lint block runs only `git grep ...`, found `{trimmed}`"));
            }
            if claim.is_empty() {
                return Err(format!("line {number}: a grep without a claim (`# ...` line above it)"));
            }
            checks.push(Check { claim: claim.join(" "), command: trimmed.to_owned(), words, line: number });
        }
    }
    if in_block {
        return Err("a `sh lint` block is not closed".into());
    }
    Ok(checks)
}

/// Splits a command line the way `sh` does for the quoting a grep needs: single quotes keep
/// everything, double quotes keep everything but `\"` and `\\`, a bare backslash escapes one
/// character. No expansion of any kind.
pub fn split_words(line: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            ' ' | '\t' => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            '\'' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => word.push(c),
                        None => return Err("unclosed single quote".into()),
                    }
                }
            }
            '"' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(c @ ('"' | '\\' | '$' | '`')) => word.push(c),
                            Some(c) => {
                                word.push('\\');
                                word.push(c);
                            }
                            None => return Err("unclosed double quote".into()),
                        },
                        Some(c) => word.push(c),
                        None => return Err("unclosed double quote".into()),
                    }
                }
            }
            '\\' => {
                in_word = true;
                word.push(chars.next().ok_or("a backslash at the end of the line")?);
            }
            '|' | ';' | '&' | '<' | '>' | '$' | '`' => {
                return Err(format!("`{c}` unquoted: a lint grep is one command, without pipes or expansion"));
            }
            c => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        words.push(word);
    }
    Ok(words)
}

/// Runs one check in `root`: `Ok(())` when the grep printed nothing (git grep exits 1),
/// the printed lines when it found something, and a line saying why when it could not run.
pub fn run(check: &Check, root: &Path) -> Result<(), Violation> {
    let violation = |output: Vec<String>| Violation { check: check.clone(), output };
    let missing = missing_paths(check, root);
    if !missing.is_empty() {
        return Err(violation(
            missing.iter().map(|path| format!("{path}: no such path (a grep over nothing holds vacuously)")).collect(),
        ));
    }
    let output = Command::new(&check.words[0])
        .args(&check.words[1..])
        .current_dir(root)
        .output()
        .map_err(|error| violation(vec![format!("cannot run git: {error}")]))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    match output.status.code() {
        Some(1) if stdout.trim().is_empty() && output.stderr.is_empty() => Ok(()),
        Some(0) | Some(1) => Err(violation(stdout.lines().map(str::to_owned).collect())),
        _ => {
            let stderr = String::from_utf8_lossy(&output.stderr);
            Err(violation(vec![format!("the grep itself failed ({}): {}", output.status, stderr.trim())]))
        }
    }
}

/// The plain paths after the grep's `--` that do not exist in `root` (exclusions and globs
/// aside): a claim about a file that was renamed would otherwise pass forever.
fn missing_paths(check: &Check, root: &Path) -> Vec<String> {
    let Some(separator) = check.words.iter().position(|word| word == "--") else { return Vec::new() };
    check.words[separator + 1..]
        .iter()
        .filter(|path| !path.starts_with(':') && !path.contains(['*', '?', '[']))
        .filter(|path| !root.join(path).exists())
        .cloned()
        .collect()
}

/// Every check of `document` (relative to `root`) run in `root`: the violations, or why the
/// document could not be read.
pub fn check_document(root: &Path, document: &str) -> Result<Vec<Violation>, String> {
    let text = std::fs::read_to_string(root.join(document)).map_err(|error| format!("{document}: {error}"))?;
    let checks = extract(&text).map_err(|error| format!("{document}: {error}"))?;
    if checks.is_empty() {
        return Err(format!("{document}: no `sh lint` block: its claims would go unchecked"));
    }
    Ok(checks.iter().filter_map(|check| run(check, root).err()).collect())
}

/// The failure text for one violation: the claim, the document line and what the grep found.
pub fn describe(document: &str, violation: &Violation) -> String {
    let mut text = format!(
        "{document}:{}: claim does not hold: {}\n  $ {}\n",
        violation.check.line, violation.check.claim, violation.check.command
    );
    for line in &violation.output {
        text.push_str("  ");
        text.push_str(line);
        text.push('\n');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = r#"# A document

Prose, and a block that is not a lint block:

```sh
git grep -n 'not run'
```

```sh lint
# Layer 1 names nothing above it.
git grep -n -E 'crate::(task|probes)\b' -- kernel/src/arch "kernel/src/sync.rs"

# Two lines of claim,
# joined.
git grep -n -F 'x\y' -- docs
git grep -n zzz -- ':!docs'
```
"#;

    #[test]
    fn extracts_each_grep_with_its_claim() {
        let checks = extract(SAMPLE).unwrap();
        assert_eq!(checks.len(), 3);
        assert_eq!(checks[0].claim, "Layer 1 names nothing above it.");
        assert_eq!(
            checks[0].words,
            ["git", "grep", "-n", "-E", r"crate::(task|probes)\b", "--", "kernel/src/arch", "kernel/src/sync.rs"]
        );
        assert_eq!(checks[0].line, 11);
        assert_eq!(checks[1].claim, "Two lines of claim, joined.");
        assert_eq!(checks[1].words, ["git", "grep", "-n", "-F", r"x\y", "--", "docs"]);
        assert_eq!(checks[2].claim, "Two lines of claim, joined.");
        assert_eq!(checks[2].words[5], ":!docs");
    }

    #[test]
    fn refuses_what_is_not_one_grep() {
        let piped = "```sh lint\n# c\ngit grep -n x | wc -l\n```\n";
        assert!(extract(piped).unwrap_err().contains("line 3"));
        let other = "```sh lint\n# c\nrm -rf x\n```\n";
        assert!(extract(other).unwrap_err().contains("only `git grep"));
        let bare = "```sh lint\ngit grep -n x\n```\n";
        assert!(extract(bare).unwrap_err().contains("without a claim"));
        assert!(extract("```sh lint\n# c\n").unwrap_err().contains("not closed"));
        assert!(split_words("git grep 'x").is_err());
    }

    /// A scratch git repository with one tracked file, removed on drop.
    struct Scratch(std::path::PathBuf);

    impl Scratch {
        fn new(name: &str, file: &str, text: &str) -> Self {
            let dir = std::env::temp_dir().join(format!("xtask-lint-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join(file), text).unwrap();
            for args in [&["init", "-q"][..], &["add", file]] {
                assert!(Command::new("git").args(args).current_dir(&dir).status().unwrap().success());
            }
            Self(dir)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn a_grep_that_finds_lines_is_reported_with_its_claim() {
        let document = "```sh lint\n# Nothing calls up.\ngit grep -n -E 'crate::tests' -- src\n\n\
                        # Nothing is missing.\ngit grep -n -F 'absent words' -- src\n```\n";
        let scratch = Scratch::new("claims", "doc.md", document);
        std::fs::create_dir_all(scratch.0.join("src")).unwrap();
        std::fs::write(scratch.0.join("src/low.rs"), "fn f() { crate::tests::run() }\n").unwrap();
        assert!(Command::new("git").args(["add", "src"]).current_dir(&scratch.0).status().unwrap().success());

        let violations = check_document(&scratch.0, "doc.md").unwrap();
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert_eq!(violations[0].check.claim, "Nothing calls up.");
        assert_eq!(violations[0].output, ["src/low.rs:1:fn f() { crate::tests::run() }"]);
        let text = describe("doc.md", &violations[0]);
        assert!(text.starts_with("doc.md:3: claim does not hold: Nothing calls up."), "{text}");
        assert!(text.contains("src/low.rs:1:"), "{text}");
    }

    #[test]
    fn a_grep_over_a_path_that_does_not_exist_is_reported() {
        let scratch = Scratch::new("missing", "low.rs", "fn f() {}\n");
        let document = "```sh lint\n# Nothing calls up.\ngit grep -n -F 'crate::tests' -- src/renamed.rs\n```\n";
        std::fs::write(scratch.0.join("architecture.md"), document).unwrap();
        let violations = check_document(&scratch.0, "architecture.md").unwrap();
        assert_eq!(violations.len(), 1);
        assert!(violations[0].output[0].starts_with("src/renamed.rs: no such path"), "{:?}", violations[0].output);
    }

    #[test]
    fn a_grep_that_cannot_run_is_reported() {
        let document = "```sh lint\n# Bad pattern.\ngit grep -n -E 'a(' -- .\n```\n";
        let scratch = Scratch::new("broken", "doc.md", document);
        let violations = check_document(&scratch.0, "doc.md").unwrap();
        assert_eq!(violations.len(), 1);
        assert!(violations[0].output[0].starts_with("the grep itself failed"), "{:?}", violations[0].output);
    }
}
