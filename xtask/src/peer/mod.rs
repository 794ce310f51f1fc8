//! `cargo xtask peer linux`: Debian's arm64 Linux in the lab's QEMU, measured from its own init.
//!
//! The kernel package comes through a private apt configuration ([`fetch`]), the init is C
//! built with Debian's cross gcc ([`toolchain`]); docs/design/peer.md says what is measured.

pub mod fetch;
pub mod toolchain;

use crate::Failure;

/// The kernels the lab can run beside itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PeerKernel {
    /// Debian's `linux-image-6.12.*-arm64-unsigned` from the backports of the machine's release.
    Linux,
}

#[derive(clap::Args)]
pub struct PeerArgs {
    /// The kernel to run beside the lab.
    #[arg(value_enum)]
    pub kernel: PeerKernel,
    /// Only fetch and unpack the kernel package (under target/peer/) and make sure the cross
    /// compiler is there; boot nothing.
    #[arg(long)]
    pub fetch_only: bool,
}

/// `cargo xtask peer KERNEL`.
pub fn run(args: &PeerArgs) -> Result<u8, Failure> {
    match args.kernel {
        PeerKernel::Linux => {}
    }
    let package = fetch::fetch_kernel()?;
    toolchain::ensure_cross_compiler()?;
    eprintln!(
        "xtask: {} {} in {} ({}), {}",
        package.name,
        package.version,
        package.root.display(),
        package.image().display(),
        toolchain::compiler_version().unwrap_or_default()
    );
    if args.fetch_only {
        return Ok(0);
    }
    Ok(0)
}
