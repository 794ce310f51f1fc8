//! `cargo xtask test --list`: the kernel tests a configuration would run, without running them.
//!
//! Like kunit.py's `--list_tests` (which boots with `kunit.action=list`), each configuration's
//! kernel boots with `run=list` and prints the tests its filter selects, in run order.

use super::configuration::ConfigurationRun;
use super::tally::Tally;
use crate::Failure;
use crate::build::KernelImage;
use crate::qemu::{self, Machine};
use std::time::Duration;

/// The names in a `run=list` log, if it ended with its `tests listed: N` and N agrees.
fn listed<'a>(lines: impl Iterator<Item = &'a str>) -> Result<Vec<&'a str>, String> {
    let mut names = Vec::new();
    for line in lines {
        if let Some(name) = line.strip_prefix("test list: ") {
            names.push(name);
        } else if let Some(count) = line.strip_prefix("tests listed: ") {
            return match count.parse::<usize>() {
                Ok(count) if count == names.len() => Ok(names),
                _ => Err(format!("`tests listed: {count}` after {} names", names.len())),
            };
        }
    }
    Err("no `tests listed: N` line".into())
}

/// Boots `image` on `machine` with `bootargs` (a `run=test` command line, run as `run=list`)
/// and prints `tests [CONFIGURATION]: N` and one indented name per line. A listing that fails
/// counts as a failure in `tally`.
pub fn list_configuration(
    machine: &Machine,
    image: &KernelImage,
    bootargs: &str,
    configuration: &str,
    timeout: Duration,
    tally: &mut Tally,
) -> Result<ConfigurationRun, Failure> {
    let bootargs = bootargs.replacen("run=test", "run=list", 1);
    let result = qemu::run(machine, image, &bootargs, Some(timeout), &mut |_| {})?;
    let texts = || result.log.iter().map(|line| line.text.as_str());
    let listing = match (result.status, listed(texts())) {
        (Some(0), Ok(names)) => Ok(names),
        (_, Err(problem)) => Err(problem),
        (status, Ok(_)) => Err(format!("{} ({status:?})", result.ending)),
    };
    match listing {
        Ok(names) => {
            println!("tests [{configuration}]: {}", names.len());
            names.iter().for_each(|name| println!("  {name}"));
            Ok(ConfigurationRun { timed_out: false, unmatched: names.is_empty() })
        }
        Err(problem) => {
            println!("tests [{configuration}]: listing FAILED: {problem}");
            tally.fail(format!("test list [{configuration}]: {problem}"));
            Ok(ConfigurationRun { timed_out: result.ending.timed_out(), unmatched: false })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_must_end_with_its_count() {
        let log = ["banner", "test list: a", "test list: b c", "tests listed: 2", "tracelab: exit status 0"];
        assert_eq!(listed(log.into_iter()), Ok(vec!["a", "b c"]));
        assert!(listed(log[..3].iter().copied()).unwrap_err().contains("no `tests listed"));
        let short = ["test list: a", "tests listed: 2"];
        assert!(listed(short.into_iter()).unwrap_err().contains("after 1 names"));
    }
}
