//! The cross compiler for the peer's init: Debian's `gcc-aarch64-linux-gnu`, a host package.
//!
//! It is installed the way `cargo xtask setup` installs QEMU: through the machine's own apt,
//! by xtask when it runs as root (saying first what it runs), else as one command for the user.
//! A host package and not the private arm64 root: the compiler is an amd64 program, and
//! `libc6-dev-arm64-cross` gives it the static glibc the init links against.

use crate::Failure;
use crate::apt::Host;
use std::process::{Command, Stdio};

/// The compiler the init is built with.
pub const CROSS_GCC: &str = "aarch64-linux-gnu-gcc";
/// Debian's packages for it: the compiler and the arm64 C library (static `libc.a` included).
const PACKAGES: [&str; 2] = ["gcc-aarch64-linux-gnu", "libc6-dev-arm64-cross"];

/// Makes sure [`CROSS_GCC`] runs: installs it through apt as root, else fails with the command.
pub fn ensure_cross_compiler() -> Result<(), Failure> {
    if compiler_version().is_some() {
        return Ok(());
    }
    let command = format!("apt-get install -y --no-install-recommends {}", PACKAGES.join(" "));
    let host = Host::probe();
    if !(host.has_apt && host.is_root) {
        return Err(Failure::usage(format!(
            "{CROSS_GCC} is missing: install it with `sudo {command}` (or your system's arm64 cross gcc)"
        )));
    }
    eprintln!("xtask: {CROSS_GCC} is missing; running: {command}");
    let status = Command::new("sh").args(["-c", &command]).status();
    if !status.is_ok_and(|status| status.success()) || compiler_version().is_none() {
        return Err(Failure::usage(format!("`{command}` did not give a working {CROSS_GCC}")));
    }
    Ok(())
}

/// The first line of `aarch64-linux-gnu-gcc --version`, recorded with the results.
pub fn compiler_version() -> Option<String> {
    let output = Command::new(CROSS_GCC).arg("--version").stderr(Stdio::null()).output().ok()?;
    output.status.success().then(|| String::from_utf8_lossy(&output.stdout).lines().next().unwrap_or("").to_string())
}
