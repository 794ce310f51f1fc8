//! `cargo xtask peer linux`: Debian's arm64 Linux in the lab's QEMU, measured from its own init.
//!
//! The kernel package comes through a private apt configuration ([`fetch`]), the init is C
//! built with Debian's cross gcc ([`toolchain`]) and packed into an initramfs
//! ([`initramfs`]); it prints a line protocol ([`protocol`]) from which [`linux`] writes suite
//! `linux` rows. docs/design/peer.md says what each row contains and how it maps to the lab's.

pub mod alloc;
pub mod fetch;
pub mod initramfs;
pub mod linux;
pub mod profile;
pub mod protocol;
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
    /// Instead of the timings: boot on 4 CPUs with the kmem events and a stack per event, run
    /// a short workload, take the trace out through a virtio disk and convert it to the
    /// committed allocation trace (xtask/data/linux/kmem-boot.trace.gz) under
    /// target/peer/linux/alloc/, with the boot's instruction count from the events plugin;
    /// the committed file is replaced only when the records are the same.
    #[arg(long, conflicts_with = "fetch_only")]
    pub alloc_trace: bool,
    /// With --alloc-trace: replace the committed trace even when the records differ.
    #[arg(long, requires = "alloc_trace")]
    pub replace_trace: bool,
    /// Count each row's exceptions per hit with the events plugin beside the measuring boot
    /// (metric `per_hit.exceptions`); the vector table's address comes from a previous run's
    /// console, or a plain run first.
    #[arg(long, conflicts_with_all = ["fetch_only", "alloc_trace"])]
    pub events: bool,
}

/// The package's configuration options that decide what the rows contain.
const CONFIG_FACTS: &[&str] = &[
    "CONFIG_CC_VERSION_TEXT",
    "CONFIG_SHADOW_CALL_STACK",
    "CONFIG_ARM64_PTR_AUTH_KERNEL",
    "CONFIG_ARM64_BTI_KERNEL",
    "CONFIG_HAVE_KPROBES_ON_FTRACE",
    "CONFIG_KPROBES_ON_FTRACE",
    "CONFIG_DYNAMIC_FTRACE_WITH_CALL_OPS",
    "CONFIG_DYNAMIC_FTRACE_WITH_ARGS",
    "CONFIG_FUNCTION_PROFILER",
    "CONFIG_FPROBE",
    "CONFIG_UNMAP_KERNEL_AT_EL0",
    "CONFIG_MITIGATE_SPECTRE_BRANCH_HISTORY",
    "CONFIG_PREEMPT_VOLUNTARY",
    "CONFIG_HZ",
];

/// `cargo xtask peer KERNEL`.
pub fn run(args: &PeerArgs) -> Result<u8, Failure> {
    let PeerKernel::Linux = args.kernel;
    let package = fetch::fetch_kernel()?;
    toolchain::ensure_cross_compiler()?;
    eprintln!(
        "xtask: {} {} in {}, init built with {}",
        package.name,
        package.version,
        package.root.display(),
        toolchain::compiler_version().unwrap_or_default()
    );
    let config = std::fs::read_to_string(package.config()).unwrap_or_default();
    for option in CONFIG_FACTS {
        println!("config {}", config_value(&config, option));
    }
    if args.fetch_only {
        return Ok(0);
    }
    if args.alloc_trace {
        linux::record_allocations(&package, args.replace_trace)?;
    } else {
        linux::measure(&package, args.events)?;
    }
    Ok(0)
}

/// `OPTION=value` as the package's `boot/config-*` sets it, or `OPTION is not set`.
fn config_value(config: &str, option: &str) -> String {
    config
        .lines()
        .find(|line| line.strip_prefix(option).is_some_and(|rest| rest.starts_with('=')))
        .map(str::to_string)
        .unwrap_or_else(|| format!("{option} is not set"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn config_values_set_and_unset() {
        let config = "CONFIG_HZ_250=y\nCONFIG_HZ=250\n# CONFIG_SHADOW_CALL_STACK is not set\n";
        assert_eq!(super::config_value(config, "CONFIG_HZ"), "CONFIG_HZ=250");
        assert_eq!(super::config_value(config, "CONFIG_SHADOW_CALL_STACK"), "CONFIG_SHADOW_CALL_STACK is not set");
    }
}
