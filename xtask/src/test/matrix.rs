//! Which configurations one `cargo xtask test` runs: the default set, `--matrix`, `--filter`.

use super::args::TestArgs;
use crate::build::{Board, BuildVariant};
use crate::qemu::CpuVariant;

/// The PAuth algorithm the default set keeps: QEMU's default for `max`, the cheapest to emulate.
pub const DEFAULT_PAUTH_CPU: CpuVariant = CpuVariant::MaxImpdef;

/// The configurations one `cargo xtask test` runs.
pub struct Selection {
    pub variants: Vec<BuildVariant>,
    pub cpus: Vec<CpuVariant>,
    pub boards: Vec<Board>,
    /// (entry exception level, GIC version) on virt.
    pub levels: Vec<(u8, u8)>,
    /// The suite again with `ftrace=*` per instrumented build variant.
    pub ftrace: bool,
    /// CPU variants left out, and why.
    pub trimmed: Vec<CpuVariant>,
    /// CPUs of the configurations above (`--smp`).
    pub smp: u8,
    /// The suite on 4 CPUs: (entry level, GIC version) per build variant on virt with
    /// `DEFAULT_PAUTH_CPU`, the first variant's also at EL2 and with GICv3 and on raspi4b.
    pub smp4: bool,
    /// The suite once in build variant `nofp` (virt, [`NOFP_CONFIGURATION`]): when no variant
    /// was named (a named `nofp` runs in the configurations above instead).
    pub nofp: bool,
}

/// Build variant `nofp`'s one configuration in the default set (CPU, EL, GIC): it differs from
/// `prod` only in frame pointers, which no CPU, level or GIC changes.
pub const NOFP_CONFIGURATION: (CpuVariant, u8, u8) = (DEFAULT_PAUTH_CPU, 1, 2);

/// (entry level, GIC version) of the `smp 4` configurations every build variant runs, and those
/// only the first variant adds: bring-up through SMC from EL2 and the GICv3 redistributors.
pub const SMP4_LEVELS: [(u8, u8); 1] = [(1, 2)];
pub const SMP4_FIRST_VARIANT_LEVELS: [(u8, u8); 2] = [(2, 2), (1, 3)];

pub const ALL_LEVELS: [(u8, u8); 4] = [(1, 2), (1, 3), (2, 2), (2, 3)];
/// Build variant `mte`'s configurations (CPU, EL, GIC): IMPDEF PAuth at EL1/GICv2 and with EL2
/// entry (HCR_EL2.ATA)/GICv3, and QARMA5 at EL1, in the default set and in --matrix alike.
pub const MTE_CONFIGURATIONS: [(CpuVariant, u8, u8); 3] =
    [(CpuVariant::MaxImpdef, 1, 2), (CpuVariant::MaxImpdef, 2, 3), (CpuVariant::MaxQarma5, 1, 2)];

impl Selection {
    pub fn new(args: &TestArgs) -> Self {
        let given_or = |given: &[CpuVariant], default: &[CpuVariant]| {
            if given.is_empty() { default.to_vec() } else { given.to_vec() }
        };
        if !args.filter.is_empty() && !args.matrix {
            // One configuration: the first of what was asked for, else the demo's machine.
            let board = args.boards.first().copied().unwrap_or(Board::Virt);
            let cpu = args.cpus.first().copied().unwrap_or(match board {
                Board::Virt => DEFAULT_PAUTH_CPU,
                Board::Rpi4 => CpuVariant::CortexA72,
            });
            return Self {
                variants: vec![args.variants.first().copied().unwrap_or(BuildVariant::Full)],
                cpus: vec![cpu],
                boards: vec![board],
                levels: vec![(1, 2)],
                ftrace: false,
                trimmed: Vec::new(),
                smp: args.smp,
                smp4: false,
                nofp: false,
            };
        }
        let default_cpus = [CpuVariant::MaxNoPauth, DEFAULT_PAUTH_CPU, CpuVariant::CortexA72];
        let cpus =
            if args.matrix { given_or(&args.cpus, &CpuVariant::ALL) } else { given_or(&args.cpus, &default_cpus) };
        Self {
            variants: if args.variants.is_empty() { BuildVariant::EVERY.to_vec() } else { args.variants.clone() },
            trimmed: CpuVariant::ALL.into_iter().filter(|cpu| args.cpus.is_empty() && !cpus.contains(cpu)).collect(),
            cpus,
            boards: if args.boards.is_empty() { vec![Board::Virt, Board::Rpi4] } else { args.boards.clone() },
            levels: ALL_LEVELS.to_vec(),
            ftrace: true,
            smp: args.smp,
            smp4: true,
            nofp: args.variants.is_empty(),
        }
    }

    /// The CPU the `ftrace=*` runs use: one with PAuth, so call-ops meets signed return addresses.
    pub fn ftrace_cpu(&self) -> CpuVariant {
        [CpuVariant::MaxQarma3, DEFAULT_PAUTH_CPU, CpuVariant::MaxQarma5]
            .into_iter()
            .find(|cpu| self.cpus.contains(cpu))
            .unwrap_or(self.cpus[0])
    }

    /// Says what will run, and what the default set leaves out and why.
    pub fn describe(&self, args: &TestArgs) {
        let names = |cpus: &[CpuVariant]| cpus.iter().map(|cpu| cpu.name()).collect::<Vec<_>>().join(", ");
        // `mte` has its own configurations (said below); the matrix line is the others'.
        let matrix_variants: Vec<_> = self.variants.iter().filter(|variant| **variant != BuildVariant::Mte).collect();
        let variants = matrix_variants.iter().map(|variant| variant.name()).collect::<Vec<_>>().join(", ");
        let kind = if args.matrix {
            "the whole matrix (--matrix)"
        } else if !args.filter.is_empty() {
            "one configuration (--filter without --matrix)"
        } else {
            "the default set"
        };
        eprintln!("xtask: kernel test configurations, {kind}:");
        if self.boards.contains(&Board::Virt)
            && self.variants.contains(&BuildVariant::Mte)
            && (args.filter.is_empty() || args.matrix)
        {
            let configurations: Vec<_> =
                MTE_CONFIGURATIONS.iter().map(|(cpu, el, gic)| format!("{} EL{el}/GICv{gic}", cpu.name())).collect();
            eprintln!("  virt,mte=on: variant mte in {} (rpi4 and cortex-a72 have no MTE)", configurations.join(", "));
        }
        if self.boards.contains(&Board::Virt) && !matrix_variants.is_empty() {
            let levels = self.levels.iter().map(|(el, gic)| format!("EL{el}/GICv{gic}")).collect::<Vec<_>>().join(", ");
            let runs = matrix_variants.len() * self.cpus.len() * self.levels.len();
            eprintln!(
                "  virt: variants {variants} x CPUs {} x {levels} ({runs} QEMU {})",
                names(&self.cpus),
                if runs == 1 { "run" } else { "runs" }
            );
            if self.ftrace {
                let traced: Vec<_> = matrix_variants
                    .iter()
                    .filter(|variant| ***variant != BuildVariant::Plain)
                    .map(|v| v.name())
                    .collect();
                eprintln!(
                    "  virt: the suite under `ftrace=*` (every traceable function traced from boot), -cpu {} EL1/GICv3: {}",
                    self.ftrace_cpu().name(),
                    traced.join(", ")
                );
            }
        }
        if self.nofp && self.boards.contains(&Board::Virt) {
            let (cpu, el, gic) = NOFP_CONFIGURATION;
            eprintln!(
                "  virt: variant nofp (prod without frame pointers) in {} EL{el}/GICv{gic} (one QEMU run)",
                cpu.name()
            );
        }
        if self.smp != 1 {
            eprintln!("  the configurations above on {} CPUs (--smp)", self.smp);
        }
        if self.smp4 {
            let first = self.variants.first().map_or("", |variant| variant.name());
            if self.boards.contains(&Board::Virt) && self.cpus.contains(&DEFAULT_PAUTH_CPU) {
                eprintln!(
                    "  smp 4: virt -cpu {} EL1/GICv2: variants {variants}; EL2/GICv2 and EL1/GICv3: {first}",
                    DEFAULT_PAUTH_CPU.name()
                );
            }
            if self.boards.contains(&Board::Rpi4) && self.cpus.contains(&CpuVariant::CortexA72) {
                eprintln!("  smp 4: rpi4: {first}");
            }
        }
        if self.boards.contains(&Board::Rpi4) && self.cpus.contains(&CpuVariant::CortexA72) {
            eprintln!("  rpi4 (QEMU raspi4b, cortex-a72, EL2, GIC-400): variants {variants}");
        }
        if !self.trimmed.is_empty() {
            eprintln!(
                "  trimmed: {}: under icount every PAuth algorithm executes the same instructions as {} \
                 (they differ only in emulation time); `--matrix` runs them",
                names(&self.trimmed),
                DEFAULT_PAUTH_CPU.name()
            );
        }
        if args.filter.is_empty() && self.variants.contains(&BuildVariant::Full) && !args.sanitizer.kasan_short_granules
        {
            eprintln!("  virt: the `kasan_` corpus in full with --kasan-short-granules, EL1/GICv2 (one QEMU run)");
        }
        if args.filter.is_empty() {
            eprintln!("  then: the rpi4 SD card image and serial checks, the failure paths, the bench harness");
        }
    }
}
