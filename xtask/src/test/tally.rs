//! The counts one `cargo xtask test` adds up, and the failures it names again at the end.

#[derive(Default)]
pub struct Tally {
    pub passed: u64,
    pub failed: u64,
    pub skipped: u64,
    /// What failed, one line each, repeated at the end of the run (above the counts) so that a
    /// CI log cut to its tail still names every failure.
    pub failures: Vec<String>,
}

impl Tally {
    pub fn fail(&mut self, what: String) {
        self.failed += 1;
        self.failures.push(what);
    }

    /// One named check: `ok`, or `FAILED` with what was wrong.
    pub fn check(&mut self, name: &str, problem: Option<&String>) {
        match problem {
            None => {
                println!("check [{name}]: ok");
                self.passed += 1;
            }
            Some(problem) => {
                println!("check [{name}]: FAILED: {problem}");
                self.fail(format!("check [{name}]"));
            }
        }
    }
}
