//! `cargo xtask lint`: the tree's own checks first (the greps of `docs/architecture.md`, the
//! words of the project's making, actionlint on the CI workflows when it is installed), then
//! rustfmt and clippy (`-D warnings`) on the host crates, xtask, and the kernel for each board,
//! built as the `full` variant (the one with every attribute in use), and as `mte` on virt (the
//! code only that variant compiles).

mod claims;
mod words;
mod workflows;

use crate::Failure;
use crate::build::{self, Board, BuildVariant, KERNEL_TARGET};
use std::process::Command;

/// The greps of `docs/architecture.md`: `Ok` when every claim holds, else each failing claim
/// with the lines that contradict it.
fn architecture_claims() -> Result<(), String> {
    eprintln!("xtask: the claims of {}", claims::DOCUMENT);
    let violations = claims::check_document(&build::workspace_root(), claims::DOCUMENT)?;
    if violations.is_empty() {
        return Ok(());
    }
    for violation in &violations {
        eprint!("{}", claims::describe(claims::DOCUMENT, violation));
    }
    Err(format!("{} claim(s) of {} do not hold", violations.len(), claims::DOCUMENT))
}

/// The words of the project's making, in every tracked file.
fn project_words() -> Result<(), String> {
    eprintln!("xtask: words about how the project was made, in tracked files");
    let hits = words::scan_tracked(&build::workspace_root())?;
    if hits.is_empty() {
        return Ok(());
    }
    for hit in &hits {
        eprintln!("{}:{}: {}: {}", hit.path, hit.line, hit.reason, hit.text);
    }
    Err(format!("{} line(s) speak of how the project was made (patterns in xtask/src/lint/words.rs)", hits.len()))
}

fn cargo(what: &str, configure: impl FnOnce(&mut Command)) -> Result<(), Failure> {
    eprintln!("xtask: {what}");
    let mut command = Command::new(env!("CARGO"));
    command.current_dir(build::workspace_root());
    configure(&mut command);
    let status = command.status().map_err(|error| Failure::usage(format!("cannot run cargo: {error}")))?;
    if status.success() { Ok(()) } else { Err(Failure { status: 1, message: format!("{what} failed") }) }
}

pub fn run() -> Result<u8, Failure> {
    // The tree's own checks take seconds: run both and report both before the slow toolchain
    // ones, and fail at the end so one finding does not hide the other.
    let findings: Vec<String> =
        [architecture_claims(), project_words(), workflows::check()].into_iter().filter_map(Result::err).collect();
    cargo("rustfmt --check", |command| {
        command.args(["fmt", "--all", "--", "--check"]);
    })?;
    cargo("clippy (host crates and xtask)", |command| {
        command.args(["clippy", "--workspace", "--exclude", "kernel", "--all-targets", "--", "-D", "warnings"]);
    })?;
    // `mte` compiles code (cfg feature `mte`) that no other variant does; virt only.
    let kernels =
        [(Board::Virt, BuildVariant::Full), (Board::Rpi4, BuildVariant::Full), (Board::Virt, BuildVariant::Mte)];
    for (board, variant) in kernels {
        cargo(&format!("clippy (kernel, {}, {})", board.name(), variant.name()), |command| {
            let flags = build::kernel_rustflags(variant);
            command
                .args(["clippy", "--release", "--package", "kernel", "--target", KERNEL_TARGET])
                .args(["-Zbuild-std=core,alloc,compiler_builtins", "-Zbuild-std-features=compiler-builtins-mem"])
                .args(["--no-default-features", "--features", &build::kernel_features(board, variant)])
                .arg("--target-dir")
                .arg(build::target_dir().join(if variant == BuildVariant::Mte {
                    "kernel/clippy-mte"
                } else {
                    "kernel/clippy"
                }))
                .env_remove("RUSTFLAGS")
                .env("CARGO_ENCODED_RUSTFLAGS", flags.join("\x1f"))
                .env("TRACELAB_VARIANT", variant.name())
                // As in build.rs: no notice about core's NEON intrinsics under build-std.
                .env("CARGO_FUTURE_INCOMPAT_REPORT_FREQUENCY", "never")
                .args(["--", "-D", "warnings"]);
        })?;
    }
    if !findings.is_empty() {
        return Err(Failure { status: 1, message: findings.join("; ") });
    }
    println!("lint: clean");
    Ok(0)
}
