//! `cargo xtask lint`: rustfmt and clippy (`-D warnings`) on the host crates, xtask, and the
//! kernel for each board, built as the `full` variant (the one with every attribute in use), and
//! as `mte` on virt (the code only that variant compiles).

use crate::Failure;
use crate::build::{self, Board, BuildVariant, KERNEL_TARGET};
use std::process::Command;

fn cargo(what: &str, configure: impl FnOnce(&mut Command)) -> Result<(), Failure> {
    eprintln!("xtask: {what}");
    let mut command = Command::new(env!("CARGO"));
    command.current_dir(build::workspace_root());
    configure(&mut command);
    let status = command.status().map_err(|error| Failure::usage(format!("cannot run cargo: {error}")))?;
    if status.success() { Ok(()) } else { Err(Failure { status: 1, message: format!("{what} failed") }) }
}

pub fn run() -> Result<u8, Failure> {
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
                .args(["--", "-D", "warnings"]);
        })?;
    }
    println!("lint: clean");
    Ok(0)
}
