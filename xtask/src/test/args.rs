//! The options of `cargo xtask test`.

use crate::build;
use crate::build::{Board, BuildVariant};
use crate::qemu::CpuVariant;

#[derive(clap::Args)]
pub struct TestArgs {
    /// Only kernel tests whose name contains this, in one configuration (virt, full,
    /// max,pauth-impdef=on, EL1, GICv2; narrowed by --board/--variant/--cpu) unless --matrix.
    #[arg(long, default_value = "")]
    pub filter: String,
    /// Every configuration: all five CPU variants (the default set runs one of the three PAuth
    /// algorithms, which execute the same instructions under icount).
    #[arg(long)]
    pub matrix: bool,
    /// Only these CPU variants (repeatable).
    #[arg(long = "cpu", value_parser = CpuVariant::parse)]
    pub cpus: Vec<CpuVariant>,
    /// Only these build variants (repeatable).
    #[arg(long = "variant", value_enum)]
    pub variants: Vec<BuildVariant>,
    /// Only these boards (repeatable; default: virt and rpi4).
    #[arg(long = "board", value_enum)]
    pub boards: Vec<Board>,
    #[command(flatten)]
    pub sanitizer: build::SanitizerArgs,
    #[command(flatten)]
    pub boot_files: crate::bootfiles::BootFileArgs,
    /// Skip the host crate tests.
    #[arg(long)]
    pub no_host: bool,
    /// CPUs of the configurations asked for (1..=4; --filter runs its one configuration on N
    /// CPUs). The default set adds its own `smp 4` configurations either way.
    #[arg(long, default_value = "1", value_parser = crate::qemu::parse_smp)]
    pub smp: u8,
    /// Seconds before a QEMU run counts as hung and is killed (twice that for runs without icount).
    #[arg(long, default_value = "120")]
    pub timeout: u64,
    /// List the kernel tests each configuration would run (the kernel boots with `run=list`),
    /// run none; host tests, failure paths and benches are not listed.
    #[arg(long)]
    pub list: bool,
    /// Save each configuration's KTAP (what kunit.py parses) as DIR/CONFIGURATION.ktap.
    #[arg(long, value_name = "DIR")]
    pub ktap: Option<std::path::PathBuf>,
    /// Print each kernel test's result line under its configuration's line.
    #[arg(short, long)]
    pub verbose: bool,
    /// How kernel log lines are printed (a failed run's log): `default`, or `linux` (the shapes
    /// Linux's tools read: docs/reference/log-format.md).
    #[arg(long = "log", value_enum, default_value = "default", value_name = "STYLE")]
    pub log_style: crate::log::LogStyle,
    /// Run part K of N of the configuration runs (round-robin in the order `test` lists them;
    /// shard 1 also runs the host tests and the checks after the configurations) and write its
    /// tally to shard.json for `cargo xtask merge`.
    #[arg(long, value_name = "K/N", value_parser = crate::shard::Shard::parse)]
    pub shard: Option<crate::shard::Shard>,
    /// With --shard: the directory shard.json goes to (default: target/shard/test-K-of-N).
    #[arg(long, requires = "shard")]
    pub out: Option<std::path::PathBuf>,
}
