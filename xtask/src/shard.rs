//! `--shard K/N` for the long runs and `cargo xtask merge`, which adds the shards' outputs up.
//!
//! A sharded run does part K of N of the whole run: round-robin over a stable ordering (the
//! sweep's functions and random sets, `test --matrix`'s configuration runs, `bench`'s
//! (variants, CPU, mode) runs), never hash order, so every machine computes the same partition
//! and the parts are balanced to one unit. Each shard writes `shard.json` into its output
//! directory (`target/shard/KIND-K-of-N/` unless `--out` says): what ran (`kind`), which shard,
//! the commit and the parameters that decide what the whole run does, and its counts (the
//! sweep's coverage lines, the test tally; a bench shard's rows are its `results.json` beside
//! it). `merge` refuses shards of different kinds, commits, parameters or shard counts, and a
//! missing or duplicate shard, with exit status 2 and the directories it compared.

pub mod coverage;

use crate::Failure;
use crate::build;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

/// Shard K of N (1-based), as `--shard K/N` gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shard {
    pub index: u32,
    pub count: u32,
}

impl Shard {
    /// `K/N` with 1 <= K <= N; clap reports the message and exits 2 otherwise.
    pub fn parse(text: &str) -> Result<Shard, String> {
        let refuse = || format!("`{text}` is not a shard: K/N with 1 <= K <= N, e.g. 2/4");
        let (index, count) = text.split_once('/').ok_or_else(refuse)?;
        let index: u32 = index.trim().parse().map_err(|_| refuse())?;
        let count: u32 = count.trim().parse().map_err(|_| refuse())?;
        if index == 0 || index > count {
            return Err(refuse());
        }
        Ok(Shard { index, count })
    }

    /// Whether unit `ordinal` (0-based, in the run's stable order) is this shard's.
    pub fn owns(self, ordinal: usize) -> bool {
        ordinal % self.count as usize == (self.index - 1) as usize
    }

    /// `K/N`, as `--shard` takes it and the stamp records it.
    pub fn name(self) -> String {
        format!("{}/{}", self.index, self.count)
    }

    /// Where a shard of `kind` writes unless told: `target/shard/KIND-K-of-N`.
    pub fn directory(self, kind: Kind) -> PathBuf {
        build::target_dir().join("shard").join(format!("{}-{}-of-{}", kind.name(), self.index, self.count))
    }
}

/// Which command's shard a directory holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `stress probes`: coverage lines per (variant, tracer scheme) run.
    Sweep,
    /// `test --matrix`: the tally of passed, failed and skipped tests.
    Test,
    /// `bench`: results.json beside the stamp.
    Bench,
}

impl Kind {
    const ALL: [Kind; 3] = [Kind::Sweep, Kind::Test, Kind::Bench];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Sweep => "sweep",
            Kind::Test => "test",
            Kind::Bench => "bench",
        }
    }

    fn parse(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|kind| kind.name() == name)
    }
}

/// What a shard's `shard.json` says of it, besides its counts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stamp {
    pub kind: Kind,
    pub shard: Shard,
    /// `git rev-parse HEAD`, with `-dirty` when tracked files differ from it.
    pub commit: String,
    /// What decides the whole run's work (variants, CPUs, seed, ...), one text: shards merge
    /// only when theirs are equal. Timeouts and output paths are not part of it.
    pub parameters: String,
}

/// The commit a shard ran: HEAD, and `-dirty` when tracked files were changed.
pub fn commit() -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .current_dir(build::workspace_root())
            .output()
            .ok()
            .filter(|output| output.status.success())
            .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_string())
    };
    let Some(head) = git(&["rev-parse", "HEAD"]) else { return "unknown".into() };
    let dirty = git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|text| !text.is_empty());
    if dirty { format!("{head}-dirty") } else { head }
}

/// FNV-1a of a file's bytes, in hex: a sweep shard's stamp names its kernel images (the raw
/// image: no debug paths), since the counts are its words and a `-dirty` commit names no tree.
pub fn file_hash(path: &Path) -> Result<String, Failure> {
    let bytes = std::fs::read(path).map_err(|error| Failure::usage(format!("{}: {error}", path.display())))?;
    let hash = bytes
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |hash, &byte| (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3));
    Ok(format!("{hash:016x}"))
}

/// Writes `DIRECTORY/shard.json`: the stamp and the shard's counts (`payload`'s fields).
pub fn write(directory: &Path, stamp: &Stamp, payload: Value) -> Result<PathBuf, Failure> {
    let mut document = json!({
        "kind": stamp.kind.name(),
        "shard": stamp.shard.name(),
        "commit": stamp.commit,
        "parameters": stamp.parameters,
    });
    if let (Some(document), Value::Object(fields)) = (document.as_object_mut(), payload) {
        document.extend(fields);
    }
    let path = directory.join("shard.json");
    let text = serde_json::to_string_pretty(&document).expect("JSON values serialize") + "\n";
    std::fs::create_dir_all(directory)
        .and_then(|()| {
            // Written whole and renamed: a merge reading the directory never sees half a file.
            let partial = directory.join("shard.json.partial");
            std::fs::write(&partial, text)?;
            std::fs::rename(&partial, &path)
        })
        .map_err(|error| Failure::usage(format!("{}: {error}", path.display())))?;
    eprintln!("xtask: shard {} of this {} run written to {}", stamp.shard.name(), stamp.kind.name(), path.display());
    Ok(path)
}

/// One shard as `merge` read it.
#[derive(Clone, Debug)]
pub struct Loaded {
    pub directory: PathBuf,
    pub stamp: Stamp,
    pub document: Value,
}

fn read_stamp(document: &Value) -> Result<Stamp, String> {
    let text = |name: &str| document[name].as_str().ok_or_else(|| format!("no `{name}` text"));
    let kind = text("kind")?;
    Ok(Stamp {
        kind: Kind::parse(kind).ok_or_else(|| format!("unknown kind `{kind}`"))?,
        shard: Shard::parse(text("shard")?)?,
        commit: text("commit")?.to_string(),
        parameters: text("parameters")?.to_string(),
    })
}

/// The shards under each of `paths`: a directory holding `shard.json`, or one whose
/// subdirectories do (as a CI job downloads each shard's artifact into one).
pub fn load(paths: &[PathBuf]) -> Result<Vec<Loaded>, Failure> {
    let mut shards = Vec::new();
    for path in paths {
        let directories: Vec<PathBuf> = if path.join("shard.json").is_file() {
            vec![path.clone()]
        } else {
            let mut below: Vec<PathBuf> = std::fs::read_dir(path)
                .map_err(|error| Failure::usage(format!("{}: {error}", path.display())))?
                .flatten()
                .map(|entry| entry.path())
                .filter(|below| below.join("shard.json").is_file())
                .collect();
            below.sort();
            below
        };
        if directories.is_empty() {
            return Err(Failure::usage(format!(
                "{}: no shard.json there nor in its subdirectories (a sharded run writes one)",
                path.display()
            )));
        }
        for directory in directories {
            let file = directory.join("shard.json");
            let text = std::fs::read_to_string(&file)
                .map_err(|error| Failure::usage(format!("{}: {error}", file.display())))?;
            let document: Value = serde_json::from_str(&text)
                .map_err(|error| Failure::usage(format!("{}: not JSON: {error}", file.display())))?;
            let stamp =
                read_stamp(&document).map_err(|error| Failure::usage(format!("{}: {error}", file.display())))?;
            shards.push(Loaded { directory, stamp, document });
        }
    }
    Ok(shards)
}

/// Whether `shards` are exactly shards 1 to N of one run: Err(why not), naming the directories.
pub fn check(shards: &[Loaded]) -> Result<(), String> {
    let Some(first) = shards.first() else { return Err("no shards to merge".into()) };
    let at = |shard: &Loaded| format!("shard {} ({})", shard.stamp.shard.name(), shard.directory.display());
    for shard in &shards[1..] {
        let (a, b) = (&first.stamp, &shard.stamp);
        if a.kind != b.kind {
            return Err(format!("{} is a {} shard, {} a {} shard", at(first), a.kind.name(), at(shard), b.kind.name()));
        }
        if a.commit != b.commit {
            return Err(format!(
                "shards of different commits: {} ran {}, {} ran {}",
                at(first),
                a.commit,
                at(shard),
                b.commit
            ));
        }
        if a.parameters != b.parameters {
            return Err(format!(
                "shards of different runs: {} has parameters `{}`, {} has `{}`",
                at(first),
                a.parameters,
                at(shard),
                b.parameters
            ));
        }
        if a.shard.count != b.shard.count {
            return Err(format!("{} and {} split the run differently", at(first), at(shard)));
        }
    }
    let count = first.stamp.shard.count;
    for index in 1..=count {
        let given: Vec<&Loaded> = shards.iter().filter(|shard| shard.stamp.shard.index == index).collect();
        match given.as_slice() {
            [] => return Err(format!("shard {index}/{count} is missing (given: {})", given_list(shards))),
            [_] => {}
            [one, another, ..] => {
                return Err(format!(
                    "shard {index}/{count} is given twice: {} and {}",
                    one.directory.display(),
                    another.directory.display()
                ));
            }
        }
    }
    Ok(())
}

fn given_list(shards: &[Loaded]) -> String {
    let mut names: Vec<_> = shards.iter().map(|shard| shard.stamp.shard.name()).collect();
    names.sort();
    names.join(", ")
}

#[derive(clap::Args)]
pub struct MergeArgs {
    /// Shards' output directories (each holding a shard.json, or holding such directories):
    /// all N shards of one `stress probes`, `test --matrix` or `bench` run.
    #[arg(required = true, value_name = "DIR")]
    pub directories: Vec<PathBuf>,
    /// Where the merged output goes (default: target/merge/KIND).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// `cargo xtask merge DIR...`: checks the shards belong together and writes one coverage
/// summary, one tally or one results.json; exits as the unsharded run would have.
pub fn run(args: &MergeArgs) -> Result<u8, Failure> {
    let mut shards = load(&args.directories)?;
    check(&shards).map_err(|why| Failure::usage(format!("merge refused: {why}")))?;
    shards.sort_by_key(|shard| shard.stamp.shard.index);
    let kind = shards[0].stamp.kind;
    let out = args.out.clone().unwrap_or_else(|| build::target_dir().join("merge").join(kind.name()));
    eprintln!(
        "xtask: merging {} {} shards of commit {} ({})",
        shards.len(),
        kind.name(),
        shards[0].stamp.commit,
        shards[0].stamp.parameters
    );
    match kind {
        Kind::Sweep => coverage::merge(&shards, &out),
        Kind::Test => crate::test::merge(&shards, &out),
        Kind::Bench => crate::bench::merge(&shards, &out),
    }
}

/// Writes `text` to `path` (its directory made first), as a usage failure if it cannot.
pub fn write_text(path: &Path, text: &str) -> Result<(), Failure> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|error| Failure::usage(format!("{}: {error}", parent.display())))?;
    }
    std::fs::write(path, text).map_err(|error| Failure::usage(format!("{}: {error}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shard_is_k_of_n() {
        assert_eq!(Shard::parse("2/3"), Ok(Shard { index: 2, count: 3 }));
        assert_eq!(Shard::parse("1/1"), Ok(Shard { index: 1, count: 1 }));
        for bad in ["0/3", "4/3", "x", "1/0", "/3", "1/", "-1/3", "1/3/4", ""] {
            let error = Shard::parse(bad).unwrap_err();
            assert!(error.contains("K/N with 1 <= K <= N"), "{bad}: {error}");
        }
    }

    /// Round-robin: every unit in exactly one shard, the shards' sizes within one of each other.
    #[test]
    fn shards_partition_units_round_robin() {
        for count in 1..=7u32 {
            for units in 0..40usize {
                let shards: Vec<Shard> = (1..=count).map(|index| Shard { index, count }).collect();
                for unit in 0..units {
                    assert_eq!(shards.iter().filter(|shard| shard.owns(unit)).count(), 1);
                }
                let sizes: Vec<usize> =
                    shards.iter().map(|shard| (0..units).filter(|&unit| shard.owns(unit)).count()).collect();
                assert!(sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1, "{sizes:?}");
            }
        }
        // The same partition whatever else varies: shard 2 of 3 is units 1, 4, 7, ...
        let shard = Shard { index: 2, count: 3 };
        assert_eq!((0..10).filter(|&unit| shard.owns(unit)).collect::<Vec<_>>(), [1, 4, 7]);
    }

    fn shard(index: u32, count: u32, commit: &str, parameters: &str) -> Loaded {
        Loaded {
            directory: PathBuf::from(format!("shards/{index}-{commit}")),
            stamp: Stamp {
                kind: Kind::Sweep,
                shard: Shard { index, count },
                commit: commit.into(),
                parameters: parameters.into(),
            },
            document: Value::Null,
        }
    }

    #[test]
    fn merge_refuses_shards_of_other_runs_and_missing_or_duplicate_ones() {
        let whole = [shard(1, 3, "a", "p"), shard(3, 3, "a", "p"), shard(2, 3, "a", "p")];
        assert_eq!(check(&whole), Ok(()));
        let missing = check(&whole[..2]).unwrap_err();
        assert!(missing.contains("shard 2/3 is missing (given: 1/3, 3/3)"), "{missing}");
        let twice = check(&[whole[0].clone(), whole[1].clone(), whole[2].clone(), shard(2, 3, "a", "p")]).unwrap_err();
        assert!(twice.contains("shard 2/3 is given twice"), "{twice}");
        let commits = check(&[whole[0].clone(), shard(2, 3, "b", "p"), whole[1].clone()]).unwrap_err();
        assert!(commits.contains("shards of different commits") && commits.contains("ran b"), "{commits}");
        let parameters = check(&[whole[0].clone(), shard(2, 3, "a", "q"), whole[1].clone()]).unwrap_err();
        assert!(parameters.contains("shards of different runs"), "{parameters}");
        let split = check(&[whole[0].clone(), shard(2, 2, "a", "p")]).unwrap_err();
        assert!(split.contains("split the run differently"), "{split}");
        let mut test = shard(2, 3, "a", "p");
        test.stamp.kind = Kind::Test;
        let kinds = check(&[whole[0].clone(), test, whole[1].clone()]).unwrap_err();
        assert!(kinds.contains("is a sweep shard") && kinds.contains("a test shard"), "{kinds}");
        assert!(check(&[]).is_err());
    }

    #[test]
    fn a_written_stamp_reads_back() {
        let directory = std::env::temp_dir().join(format!("xtask-shard-stamp-{}", std::process::id()));
        let stamp = Stamp {
            kind: Kind::Test,
            shard: Shard { index: 2, count: 5 },
            commit: "0123abcd".into(),
            parameters: "matrix variants=full".into(),
        };
        write(&directory, &stamp, json!({ "tally": { "passed": 3 } })).unwrap();
        let loaded = load(std::slice::from_ref(&directory)).unwrap();
        assert_eq!(loaded.len(), 1);
        assert_eq!(loaded[0].stamp, stamp);
        assert_eq!(loaded[0].document["tally"]["passed"], 3);
        // A directory holding shard directories, as a CI job downloads artifacts into one.
        let parent = std::env::temp_dir().join(format!("xtask-shard-parent-{}", std::process::id()));
        write(&parent.join("one"), &stamp, json!({})).unwrap();
        write(&parent.join("two"), &Stamp { shard: Shard { index: 1, count: 5 }, ..stamp.clone() }, json!({})).unwrap();
        let below = load(std::slice::from_ref(&parent)).unwrap();
        assert_eq!(below.iter().map(|shard| shard.stamp.shard.index).collect::<Vec<_>>(), [2, 1]);
        assert!(load(&[directory.join("nothing-here")]).is_err());
        let _ = std::fs::remove_dir_all(&directory);
        let _ = std::fs::remove_dir_all(&parent);
    }
}
