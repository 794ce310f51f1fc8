//! Build variants (named sets of instrumentation flags) and the kernel build itself.

use crate::Failure;
use object::{Object, ObjectSection};
use std::path::{Path, PathBuf};
use std::process::Command;

pub const KERNEL_TARGET: &str = "aarch64-unknown-none-softfloat";

/// The sanitizer's shadow offset; kernel/src/arch/aarch64/mmu.rs has the same constant
/// (`SHADOW_OFFSET`) and its `sanitizer_checks_run` test fails if they disagree.
const HWASAN_MAPPING_OFFSET: &str = "0xFFFFFFC800000000";

/// Short granules off (the `full` default, Linux's SW_TAGS) and on (`--kasan-short-granules`).
const SHORT_GRANULES_OFF: &str = "-Cllvm-args=-hwasan-use-short-granules=0";
const SHORT_GRANULES_ON: &str = "-Cllvm-args=-hwasan-use-short-granules=1";

#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum BuildVariant {
    /// SCS + pac-ret + patchable entries + frame pointers + kernel-hwaddress.
    Full,
    /// Everything but kernel-hwaddress: what a production kernel with SCS, PAC and ftrace is.
    Prod,
    /// No instrumentation at all.
    Plain,
    /// `prod` plus a heap whose tags are MTE allocation tags (KASAN HW_TAGS): no compiler
    /// checks, the hardware checks every access. QEMU `virt` with `mte=on` and `-cpu max` only.
    Mte,
    /// `prod` without frame pointers (SCS, PAC, patchable entries and the SFrame table stay):
    /// x29 is an ordinary register, so the kernel refuses every frame-record walk and traces
    /// by the shadow call stack and the SFrame table. What frame pointers cost.
    Nofp,
}

impl BuildVariant {
    /// The variants every CPU and board runs (the test matrix's default set).
    pub const ALL: [BuildVariant; 3] = [Self::Full, Self::Prod, Self::Plain];
    /// The variants of the whole test matrix, `mte` included (which needs QEMU's emulated MTE).
    /// `nofp` is not among them: it differs from `prod` only in frame pointers, so the default
    /// set runs it in one configuration of its own.
    pub const EVERY: [BuildVariant; 4] = [Self::Full, Self::Prod, Self::Plain, Self::Mte];
    /// Every variant there is (for reading back the variant a figure names).
    pub const KNOWN: [BuildVariant; 5] = [Self::Full, Self::Prod, Self::Plain, Self::Mte, Self::Nofp];

    pub fn name(self) -> &'static str {
        match self {
            Self::Full => "full",
            Self::Prod => "prod",
            Self::Plain => "plain",
            Self::Mte => "mte",
            Self::Nofp => "nofp",
        }
    }

    /// Refuses a board or CPU this variant cannot run on (before anything is built): `mte`
    /// needs MTE, which only QEMU `virt` with `-cpu max` emulates.
    pub fn check_machine(self, board: Board, cpu: &str) -> Result<(), Failure> {
        if self == Self::Mte && (board == Board::Rpi4 || cpu == "cortex-a72") {
            return Err(Failure::usage(format!(
                "--variant mte needs MTE: board virt with a max CPU (not board {} with --cpu {cpu})",
                board.name()
            )));
        }
        Ok(())
    }

    /// rustc flags for the kernel and every crate it links (core and alloc included, through
    /// -Zbuild-std: rustc refuses to mix crates built with different sanitizer/x18/PAC settings).
    pub fn rustflags(self) -> Vec<&'static str> {
        let instrumented = [
            "-Zfixed-x18",
            "-Zbranch-protection=pac-ret",
            "-Zpatchable-function-entry=4,2",
            "-Zmin-function-alignment=8",
            "-Zunstable-options",
        ];
        // Every instrumented variant but `nofp` keeps a frame record in each non-leaf function.
        let frame_pointers = ["-Cforce-frame-pointers=non-leaf"];
        match self {
            Self::Plain => vec![],
            Self::Prod => [&["-Zsanitizer=shadow-call-stack"][..], &instrumented, &frame_pointers].concat(),
            // The target leaves frame pointers to the compiler (no `frame-pointer` in its spec):
            // `no` says so explicitly, and LLVM then uses x29 as a general-purpose register.
            Self::Nofp => {
                [&["-Zsanitizer=shadow-call-stack"][..], &instrumented, &["-Cforce-frame-pointers=no"]].concat()
            }
            // The assembler needs the memtag extension for IRG/STG/LDG; no code generation
            // changes (LLVM emits MTE instructions only for the memtag sanitizer).
            Self::Mte => {
                [&["-Zsanitizer=shadow-call-stack"][..], &instrumented, &frame_pointers, &["-Ctarget-feature=+mte"]]
                    .concat()
            }
            Self::Full => [
                &["-Zsanitizer=shadow-call-stack,kernel-hwaddress"][..],
                &instrumented,
                &frame_pointers,
                // The outline scheme (as Linux's SW_TAGS): each access calls a
                // __hwasan_check_x<R> thunk that reads the shadow at
                // sbfx(addr, 4, 52) + offset and tail-calls __hwasan_tag_mismatch on a mismatch.
                &[
                    "-Cllvm-args=-hwasan-inline-fast-path-checks=0",
                    SHORT_GRANULES_OFF,
                    "-Cllvm-args=-hwasan-instrument-stack=0",
                    // memcpy/memmove/memset become calls to __hwasan_mem*, which check the
                    // whole range once (mm/sanitizer.rs) before doing the operation.
                    "-Cllvm-args=-hwasan-kernel-mem-intrinsic-prefix=1",
                ],
            ]
            .concat(),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum Board {
    /// QEMU `virt`.
    Virt,
    /// Raspberry Pi 4 (QEMU `raspi4b`, or the real board from an SD card).
    Rpi4,
}

impl Board {
    pub fn feature(self) -> &'static str {
        match self {
            Self::Virt => "board-qemu-virt",
            Self::Rpi4 => "board-rpi4",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Virt => "virt",
            Self::Rpi4 => "rpi4",
        }
    }
}

pub struct KernelImage {
    pub elf: PathBuf,
    pub raw: PathBuf,
}

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the workspace").to_path_buf()
}

/// Cargo's target directory: `CARGO_TARGET_DIR` (relative to the current directory, as cargo
/// reads it) or `target/` at the workspace root.
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR").filter(|dir| !dir.is_empty()) {
        Some(dir) => std::env::current_dir().unwrap_or_else(|_| workspace_root()).join(dir),
        None => workspace_root().join("target"),
    }
}

/// Options of the `full` variant's sanitizer that change its code: each combination is a
/// build of its own (own target directory: core and alloc carry the checks too).
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
pub struct SanitizerOptions {
    /// HWASan's short granules: the shadow byte of an object's partly used last granule holds
    /// the used length (1..15) and the granule's last byte the tag, so an access past the end
    /// inside that granule is caught (Linux's SW_TAGS cannot).
    pub short_granules: bool,
}

impl SanitizerOptions {
    /// The target-directory suffix and the log's name for these options ("" for the default).
    pub fn suffix(self) -> &'static str {
        if self.short_granules { "-short-granules" } else { "" }
    }
}

/// The command-line flag for [`SanitizerOptions`] (flattened into qemu, test and bench).
#[derive(clap::Args, Clone, Copy, Default, Debug)]
pub struct SanitizerArgs {
    /// With --variant full only: build with short granules (`-hwasan-use-short-granules=1`,
    /// `__hwasan_check_*_short_v2` thunks): overflows inside an object's last granule are caught.
    #[arg(long)]
    pub kasan_short_granules: bool,
}

impl SanitizerArgs {
    /// The options for `variant`; refused (exit 2) when asked for on a variant without the
    /// sanitizer's checks.
    pub fn options(self, variants: &[BuildVariant]) -> Result<SanitizerOptions, Failure> {
        if self.kasan_short_granules
            && let Some(other) = variants.iter().find(|variant| **variant != BuildVariant::Full)
        {
            return Err(Failure::usage(format!(
                "--kasan-short-granules needs --variant full (got {}; valid: full)",
                other.name()
            )));
        }
        Ok(SanitizerOptions { short_granules: self.kasan_short_granules })
    }
}

/// Every rustc flag of a kernel build in `variant`.
pub fn kernel_rustflags(variant: BuildVariant) -> Vec<String> {
    kernel_rustflags_with(variant, SanitizerOptions::default())
}

/// Every rustc flag of a kernel build in `variant` with the sanitizer's `options` (`full` only).
pub fn kernel_rustflags_with(variant: BuildVariant, options: SanitizerOptions) -> Vec<String> {
    let short_granules = variant == BuildVariant::Full && options.short_granules;
    let mut flags = variant
        .rustflags()
        .iter()
        .map(|flag| match *flag {
            SHORT_GRANULES_OFF if short_granules => SHORT_GRANULES_ON.to_string(),
            flag => flag.to_string(),
        })
        .collect::<Vec<_>>();
    // The kernel runs in the upper half but defmt's interned strings are symbols at 1..65535
    // (their addresses are the log ids): only the large code model reaches both.
    flags.push("-Ccode-model=large".to_string());
    if variant == BuildVariant::Full {
        flags.push(format!("-Cllvm-args=-hwasan-mapping-offset={HWASAN_MAPPING_OFFSET}"));
    }
    flags
}

/// The kernel crate's features for `board` in `variant` (`mte` selects the MTE tag storage).
pub fn kernel_features(board: Board, variant: BuildVariant) -> String {
    match variant {
        BuildVariant::Mte => format!("{},mte", board.feature()),
        _ => board.feature().to_string(),
    }
}

/// Builds the kernel for `board` in `variant`, checks its patchable entries, writes a raw image.
pub fn kernel(board: Board, variant: BuildVariant) -> Result<KernelImage, Failure> {
    kernel_with(board, variant, SanitizerOptions::default())
}

/// [`kernel`] with the sanitizer's `options` (which only `full` accepts: see [`SanitizerArgs`]).
pub fn kernel_with(board: Board, variant: BuildVariant, options: SanitizerOptions) -> Result<KernelImage, Failure> {
    variant.check_machine(board, "")?;
    let root = workspace_root();
    let options = if variant == BuildVariant::Full { options } else { SanitizerOptions::default() };
    let build_name = format!("{}{}", variant.name(), options.suffix());
    // One target directory per build variant, shared by both boards: core, alloc and every
    // dependency are built once per variant (they do not depend on the board feature), only the
    // kernel crate twice. Each board's artifacts are copied to their own directory.
    let kernel_dir = target_dir().join("kernel");
    let artifact_dir = kernel_dir.join(board.name()).join(&build_name);
    // Cargo copies its artifact here; xtask reads it and writes the finished images (symbols
    // and SFrame filled) one level up, so cargo's copy and a running command's mapped image
    // are never the same file.
    let linked_dir = artifact_dir.join("linked");
    let target_dir = kernel_dir.join(&build_name);
    let flags = kernel_rustflags_with(variant, options);
    // Two commands building this board and variant at once: cargo serialises itself, but the
    // post-link steps (symbols, SFrame, the raw image) must not interleave with another
    // command's, so the whole build holds the lock.
    let lock_path = kernel_dir.join(board.name()).join(format!("{build_name}.lock"));
    let _lock = crate::atomic::Lock::acquire(&lock_path, &format!("kernel build {}/{build_name}", board.name()))
        .map_err(|error| Failure::usage(format!("{}: {error}", lock_path.display())))?;
    eprintln!("xtask: building kernel ({}, variant {build_name})", board.name());
    let status = Command::new(env!("CARGO"))
        .current_dir(&root)
        .args(["build", "--release", "--package", "kernel", "--target", KERNEL_TARGET])
        .args(["-Zbuild-std=core,alloc,compiler_builtins", "-Zbuild-std-features=compiler-builtins-mem"])
        .args(["--no-default-features", "--features", &kernel_features(board, variant)])
        .arg("--target-dir")
        .arg(&target_dir)
        .args(["-Zunstable-options", "--artifact-dir"])
        .arg(&linked_dir)
        .env_remove("RUSTFLAGS")
        .env("CARGO_ENCODED_RUSTFLAGS", flags.join("\x1f"))
        .env("TRACELAB_VARIANT", variant.name())
        .env("TRACELAB_KASAN_SHORT_GRANULES", if options.short_granules { "1" } else { "0" })
        .env("DEFMT_LOG", "info")
        // build-std compiles core's NEON intrinsics (`#[target_feature(enable = "neon")]` in
        // stdarch) for a softfloat target, which rustc's future-incompatibility lint flags
        // (rust-lang/rust#134375): the code is the toolchain's, not ours, and nothing here calls
        // it. Cargo would print its notice after every kernel build; `never` only stops the
        // notice (the report stays in the variant's target directory,
        // `.future-incompat-report.json`).
        .env("CARGO_FUTURE_INCOMPAT_REPORT_FREQUENCY", "never")
        // One codegen unit: which functions LLVM inlines into a hot path (the probe hit, the
        // trap entry, the walkers) then depends on the code, not on how the kernel crate
        // happened to be split into units, so an icount row moves only when its path changes.
        .env("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "1")
        .status()
        .map_err(|error| Failure::usage(format!("cannot run cargo: {error}")))?;
    if !status.success() {
        return Err(Failure { status: 1, message: format!("kernel build failed (variant {})", variant.name()) });
    }
    let linked = linked_dir.join("kernel");
    let mut data = std::fs::read(&linked).map_err(|error| Failure::usage(format!("{}: {error}", linked.display())))?;
    // The symbol table goes into the image (ELF and raw alike), refilled from the symbols.
    crate::ksyms::embed(&mut data)?;
    // The SFrame table, converted from `.eh_frame` and validated against it (not loaded).
    crate::sframe::embed(&mut data)?;
    let elf = artifact_dir.join("kernel");
    let file = object::File::parse(&*data).map_err(|error| Failure::usage(format!("{}: {error}", elf.display())))?;
    if variant != BuildVariant::Plain {
        check_patchable_entries(&file)?;
    }
    let raw = elf.with_extension("bin");
    // Replaced by a rename, or left alone when unchanged: another command may be running this
    // image, with the ELF mapped by its symbolizer.
    let write = |path: &Path, bytes: &[u8]| {
        crate::atomic::write(path, bytes).map_err(|error| Failure::usage(format!("{}: {error}", path.display())))
    };
    write(&raw, &raw_image(&file)?)?;
    write(&elf, &data)?;
    Ok(KernelImage { elf, raw })
}

/// Every instrumented function's two pre-symbol NOPs must form an 8-aligned slot: call-ops
/// tracing keeps a 64-bit ops pointer there.
fn check_patchable_entries(file: &object::File) -> Result<(), Failure> {
    let section = file
        .section_by_name("__patchable_function_entries")
        .ok_or_else(|| Failure { status: 1, message: "no __patchable_function_entries section".into() })?;
    let data = section.data().map_err(|error| Failure { status: 1, message: error.to_string() })?;
    let entries: Vec<u64> = data.chunks_exact(8).map(|chunk| u64::from_le_bytes(chunk.try_into().unwrap())).collect();
    let misaligned: Vec<_> = entries.iter().filter(|&&entry| entry % 8 != 0).collect();
    if entries.is_empty() || !misaligned.is_empty() {
        return Err(Failure {
            status: 1,
            message: format!(
                "{} patchable function entries, {} not 8-aligned (first: {:#x?})",
                entries.len(),
                misaligned.len(),
                misaligned.first()
            ),
        });
    }
    Ok(())
}

/// The loadable segments laid out by physical address, as the boot loader expects.
fn raw_image(file: &object::File) -> Result<Vec<u8>, Failure> {
    let object::File::Elf64(elf) = file else {
        return Err(Failure::usage("kernel is not ELF64"));
    };
    let endian = elf.endian();
    use object::read::elf::ProgramHeader;
    let segments: Vec<_> = elf
        .elf_program_headers()
        .iter()
        .filter(|header| header.p_type(endian) == object::elf::PT_LOAD && header.p_filesz(endian) > 0)
        .collect();
    let base = segments
        .iter()
        .map(|header| header.p_paddr(endian))
        .min()
        .ok_or_else(|| Failure::usage("no loadable segment"))?;
    let mut image = Vec::new();
    for header in segments {
        let offset = (header.p_paddr(endian) - base) as usize;
        let data = header.data(endian, elf.data()).map_err(|_| Failure::usage("bad segment"))?;
        if image.len() < offset + data.len() {
            image.resize(offset + data.len(), 0);
        }
        image[offset..offset + data.len()].copy_from_slice(data);
    }
    Ok(image)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mte_refuses_machines_without_mte() {
        let refused = [(Board::Rpi4, "cortex-a72"), (Board::Virt, "cortex-a72"), (Board::Rpi4, "")];
        for (board, cpu) in refused {
            let failure = BuildVariant::Mte.check_machine(board, cpu).expect_err("refused");
            assert_eq!(failure.status, 2);
            assert!(!failure.message.contains('\n'));
        }
        assert!(BuildVariant::Mte.check_machine(Board::Virt, "max,pauth-impdef=on").is_ok());
        assert!(BuildVariant::Prod.check_machine(Board::Rpi4, "cortex-a72").is_ok());
    }
}
