//! actionlint on the CI workflows in `.github/workflows`, when actionlint is installed.
//!
//! actionlint is a Go program (`go install github.com/rhysd/actionlint/cmd/actionlint@latest`);
//! lint looks for it on PATH and where `go install` puts it (`$GOBIN`, `$GOPATH/bin`,
//! `~/go/bin`). It is not fetched when missing: building it takes a Go toolchain and a minute,
//! and the workflows change rarely; lint says it skipped them.

use std::path::PathBuf;
use std::process::Command;

/// Where actionlint is, if anywhere.
fn actionlint() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .map(|directory| directory.join("actionlint"));
    let go_bin = [
        std::env::var_os("GOBIN").map(PathBuf::from),
        std::env::var_os("GOPATH").map(|path| PathBuf::from(path).join("bin")),
        std::env::var_os("HOME").map(|home| PathBuf::from(home).join("go/bin")),
    ]
    .into_iter()
    .flatten()
    .map(|directory| directory.join("actionlint"));
    on_path.chain(go_bin).find(|path| path.is_file())
}

/// Ok when actionlint passes every workflow or is not installed (said on stderr), else Err.
pub fn check() -> Result<(), String> {
    let directory = crate::build::workspace_root().join(".github/workflows");
    let mut workflows: Vec<PathBuf> = std::fs::read_dir(&directory)
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|extension| extension == "yml" || extension == "yaml"))
        .collect();
    workflows.sort();
    if workflows.is_empty() {
        return Ok(());
    }
    let Some(tool) = actionlint() else {
        eprintln!("xtask: the CI workflows: actionlint not installed, skipped");
        return Ok(());
    };
    eprintln!("xtask: the CI workflows ({})", tool.display());
    let status = Command::new(&tool)
        .args(&workflows)
        .current_dir(crate::build::workspace_root())
        .status()
        .map_err(|error| format!("cannot run {}: {error}", tool.display()))?;
    if status.success() { Ok(()) } else { Err("actionlint found problems in .github/workflows".into()) }
}
