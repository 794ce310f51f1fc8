//! Where `bench report` writes its pages: the tracked docs/results only when asked to.

use crate::Failure;
use crate::build;
use std::path::{Path, PathBuf};

/// The directory `bench report` writes into: `out` when given; the workspace's docs/results
/// (tracked: a report there replaces the published figures) only with `force`.
pub fn output_dir(out: Option<&Path>, force: bool) -> Result<PathBuf, Failure> {
    match out {
        Some(out) => Ok(out.to_path_buf()),
        None if force => Ok(build::workspace_root().join("docs/results")),
        None => Err(Failure::usage(
            "bench report: without a directory it would replace the tracked docs/results; \
             name a directory (`cargo xtask bench report DIR`) or add --force to replace docs/results",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docs_results_is_replaced_only_when_asked() {
        let failure = output_dir(None, false).expect_err("refused without a directory");
        assert_eq!(failure.status, 2);
        assert!(failure.message.contains("--force"), "{}", failure.message);
        assert!(output_dir(None, true).expect("forced").ends_with("docs/results"));
        assert_eq!(output_dir(Some(Path::new("/tmp/pages")), false).expect("named"), Path::new("/tmp/pages"));
    }
}
