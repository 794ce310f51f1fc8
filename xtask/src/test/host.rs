//! The host crates' `cargo test`, whose counts join the tally.

use super::tally::Tally;
use crate::Failure;
use crate::build;
use std::process::Command;

/// `cargo test` for the host crates; their counts join the tally.
pub fn host_tests(tally: &mut Tally) -> Result<(), Failure> {
    eprintln!("xtask: host crate tests");
    let output = Command::new(env!("CARGO"))
        .current_dir(build::workspace_root())
        .args(["test", "--workspace", "--exclude", "kernel"])
        .output()
        .map_err(|error| Failure::usage(format!("cannot run cargo test: {error}")))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let mut seen = false;
    for line in stdout.lines().filter(|line| line.starts_with("test result:")) {
        seen = true;
        let count = |word: &str| -> u64 {
            line.split([';', '.'])
                .find_map(|part| part.trim().strip_suffix(word).and_then(|n| n.trim().parse().ok()))
                .unwrap_or(0)
        };
        tally.passed += count("passed");
        tally.failed += count("failed");
        tally.skipped += count("ignored");
    }
    if !output.status.success() {
        print!("{stdout}");
        eprint!("{}", String::from_utf8_lossy(&output.stderr));
        if !seen {
            tally.failed += 1;
        }
        tally.failures.push("host crate tests (see `cargo test --workspace --exclude kernel`)".into());
        println!("host crate tests: FAILED");
    } else {
        println!("host crate tests: ok");
    }
    Ok(())
}
