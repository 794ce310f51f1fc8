//! `test --shard K/N`: a shard's tally in its shard.json, and `merge` adding the tallies up.

use super::args::TestArgs;
use super::tally::Tally;
use crate::Failure;
use crate::shard::{Kind, Loaded, Shard, Stamp};
use serde_json::{Value, json};
use std::path::Path;

/// Whether this run does the work of configuration run `ordinal` (0-based, in the order
/// `run_selection` lists them); every run's own without `--shard`.
pub fn owns(args: &TestArgs, ordinal: usize) -> bool {
    args.shard.is_none_or(|shard| shard.owns(ordinal))
}

/// Whether this run does what is not a configuration of the matrix: the host tests, the
/// short-granule corpus and the checks after the configurations. Shard 1 does them.
pub fn owns_the_rest(args: &TestArgs) -> bool {
    args.shard.is_none_or(|shard| shard.index == 1)
}

/// What decides a `test` run's work: every option but the timeout and the output directory.
fn parameters(args: &TestArgs) -> String {
    let names =
        |names: Vec<&str>| if names.is_empty() { "default".to_string() } else { format!("[{}]", names.join(" ")) };
    format!(
        "test matrix={} filter={} variants={} cpus={} boards={} smp={} kasan-short-granules={} no-host={}",
        args.matrix,
        args.filter,
        names(args.variants.iter().map(|variant| variant.name()).collect()),
        names(args.cpus.iter().map(|cpu| cpu.name()).collect()),
        names(args.boards.iter().map(|board| board.name()).collect()),
        args.smp,
        args.sanitizer.kasan_short_granules,
        args.no_host
    )
}

/// Writes this shard's tally (and whether a run timed out) to its shard.json.
pub fn save(args: &TestArgs, shard: Shard, tally: &Tally, timed_out: bool) -> Result<(), Failure> {
    let stamp = Stamp { kind: Kind::Test, shard, commit: crate::shard::commit(), parameters: parameters(args) };
    let directory = args.out.clone().unwrap_or_else(|| shard.directory(Kind::Test));
    let tally = json!({
        "passed": tally.passed,
        "failed": tally.failed,
        "skipped": tally.skipped,
        "failures": tally.failures,
        "timed_out": timed_out,
    });
    crate::shard::write(&directory, &stamp, json!({ "tally": tally })).map(|_| ())
}

fn tally_of(document: &Value) -> Result<(Tally, bool), String> {
    let tally = &document["tally"];
    let count = |name: &str| tally[name].as_u64().ok_or_else(|| format!("no `tally.{name}` number"));
    let failures = tally["failures"]
        .as_array()
        .ok_or("no `tally.failures` array")?
        .iter()
        .map(|line| line.as_str().map(str::to_string).ok_or("a failure is not text"))
        .collect::<Result<_, _>>()?;
    let timed_out = tally["timed_out"].as_bool().ok_or("no `tally.timed_out`")?;
    Ok((Tally { passed: count("passed")?, failed: count("failed")?, skipped: count("skipped")?, failures }, timed_out))
}

/// The shards' tallies added up: Err names the shard whose file is wrong.
fn total(shards: &[Loaded]) -> Result<(Tally, bool), String> {
    let mut total = Tally::default();
    let mut timed_out = false;
    for shard in shards {
        let (tally, timed) =
            tally_of(&shard.document).map_err(|error| format!("{}/shard.json: {error}", shard.directory.display()))?;
        total.passed += tally.passed;
        total.failed += tally.failed;
        total.skipped += tally.skipped;
        total.failures.extend(tally.failures);
        timed_out |= timed;
    }
    Ok((total, timed_out))
}

/// `merge` of test shards: the failures and `N passed, N failed, N skipped` as the unsharded
/// run prints them, OUT/tally.json, and its exit status (124 if a run timed out, 1 on failures).
pub fn merge(shards: &[Loaded], out: &Path) -> Result<u8, Failure> {
    let (tally, timed_out) = total(shards).map_err(|why| Failure::usage(format!("merge refused: {why}")))?;
    for failure in &tally.failures {
        println!("failed: {failure}");
    }
    let summary = format!("{} passed, {} failed, {} skipped", tally.passed, tally.failed, tally.skipped);
    println!("{summary} ({} shards merged)", shards.len());
    let document = json!({
        "passed": tally.passed,
        "failed": tally.failed,
        "skipped": tally.skipped,
        "failures": tally.failures,
        "timed_out": timed_out,
    });
    let path = out.join("tally.json");
    crate::shard::write_text(&path, &(serde_json::to_string_pretty(&document).expect("JSON values serialize") + "\n"))?;
    eprintln!("xtask: wrote {}", path.display());
    Ok(if timed_out {
        124
    } else if tally.failed == 0 {
        0
    } else {
        1
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Command {
        #[command(flatten)]
        test: TestArgs,
    }

    fn args(line: &[&str]) -> Result<TestArgs, clap::Error> {
        Command::try_parse_from(std::iter::once("test").chain(line.iter().copied())).map(|command| command.test)
    }

    #[test]
    fn shards_split_configurations_and_shard_one_does_the_rest() {
        let second = args(&["--matrix", "--shard", "2/3"]).unwrap();
        assert_eq!((0..9).filter(|&ordinal| owns(&second, ordinal)).collect::<Vec<_>>(), [1, 4, 7]);
        assert!(!owns_the_rest(&second));
        assert!(owns_the_rest(&args(&["--matrix", "--shard", "1/3"]).unwrap()));
        let whole = args(&["--matrix"]).unwrap();
        assert!((0..9).all(|ordinal| owns(&whole, ordinal)) && owns_the_rest(&whole));
        for bad in ["0/3", "4/3", "x"] {
            let error = args(&["--matrix", "--shard", bad]).err().expect("refused");
            assert_eq!(error.exit_code(), 2, "{bad}");
            assert!(error.to_string().contains("K/N with 1 <= K <= N"), "{bad}: {error}");
        }
        // The stamp's parameters leave out what does not change the run's work.
        let slow = args(&["--matrix", "--shard", "1/3", "--timeout", "999"]).unwrap();
        assert_eq!(parameters(&slow), parameters(&second));
        assert_ne!(
            parameters(&args(&["--matrix", "--variant", "prod", "--shard", "1/3"]).unwrap()),
            parameters(&second)
        );
    }

    #[test]
    fn tallies_add_up_and_keep_every_failure() {
        let root = std::env::temp_dir().join(format!("xtask-test-merge-{}", std::process::id()));
        let stamp = |index| Stamp {
            kind: Kind::Test,
            shard: Shard { index, count: 2 },
            commit: "c".into(),
            parameters: "p".into(),
        };
        let tally = |passed: u64, failures: &[&str], timed_out: bool| json!({ "tally": { "passed": passed, "failed": failures.len(), "skipped": 1, "failures": failures, "timed_out": timed_out } });
        crate::shard::write(&root.join("a"), &stamp(1), tally(10, &[], false)).unwrap();
        crate::shard::write(&root.join("b"), &stamp(2), tally(7, &["kernel test x [virt]"], false)).unwrap();
        let shards = crate::shard::load(std::slice::from_ref(&root)).unwrap();
        let (total, timed_out) = total(&shards).unwrap();
        assert_eq!((total.passed, total.failed, total.skipped, timed_out), (17, 1, 2, false));
        assert_eq!(total.failures, ["kernel test x [virt]"]);
        assert_eq!(merge(&shards, &root.join("out")).unwrap(), 1);
        crate::shard::write(&root.join("b"), &stamp(2), tally(7, &[], true)).unwrap();
        let shards = crate::shard::load(std::slice::from_ref(&root)).unwrap();
        assert_eq!(merge(&shards, &root.join("out")).unwrap(), 124);
        let _ = std::fs::remove_dir_all(&root);
    }
}
