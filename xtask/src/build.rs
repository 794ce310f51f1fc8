//! Build variants (named sets of instrumentation flags) and the kernel build itself.

use crate::Failure;
use object::{Object, ObjectSection};
use std::path::{Path, PathBuf};
use std::process::Command;

pub const KERNEL_TARGET: &str = "aarch64-unknown-none-softfloat";

/// The sanitizer's shadow offset; kernel/src/arch/aarch64/mmu.rs has the same constant
/// (`SHADOW_OFFSET`) and its `sanitizer_checks_run` test fails if they disagree.
const HWASAN_MAPPING_OFFSET: &str = "0xFFFFFFC800000000";

#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum BuildVariant {
    /// SCS + pac-ret + patchable entries + frame pointers + kernel-hwaddress.
    Full,
    /// Everything but kernel-hwaddress: what a production kernel with SCS, PAC and ftrace is.
    Prod,
    /// No instrumentation at all.
    Plain,
}

impl BuildVariant {
    pub const ALL: [BuildVariant; 3] = [Self::Full, Self::Prod, Self::Plain];

    pub fn name(self) -> &'static str {
        match self {
            Self::Full => "full",
            Self::Prod => "prod",
            Self::Plain => "plain",
        }
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
            "-Cforce-frame-pointers=non-leaf",
        ];
        match self {
            Self::Plain => vec![],
            Self::Prod => [&["-Zsanitizer=shadow-call-stack"][..], &instrumented].concat(),
            Self::Full => [
                &["-Zsanitizer=shadow-call-stack,kernel-hwaddress"][..],
                &instrumented,
                // The outline scheme (as Linux's SW_TAGS): each access calls a
                // __hwasan_check_x<R> thunk that reads the shadow at
                // sbfx(addr, 4, 52) + offset and tail-calls __hwasan_tag_mismatch on a mismatch.
                &[
                    "-Cllvm-args=-hwasan-inline-fast-path-checks=0",
                    "-Cllvm-args=-hwasan-use-short-granules=0",
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

/// Every rustc flag of a kernel build in `variant`.
pub fn kernel_rustflags(variant: BuildVariant) -> Vec<String> {
    let mut flags = variant.rustflags().iter().map(|flag| flag.to_string()).collect::<Vec<_>>();
    // The kernel runs in the upper half but defmt's interned strings are symbols at 1..65535
    // (their addresses are the log ids): only the large code model reaches both.
    flags.push("-Ccode-model=large".to_string());
    if variant == BuildVariant::Full {
        flags.push(format!("-Cllvm-args=-hwasan-mapping-offset={HWASAN_MAPPING_OFFSET}"));
    }
    flags
}

/// Builds the kernel for `board` in `variant`, checks its patchable entries, writes a raw image.
pub fn kernel(board: Board, variant: BuildVariant) -> Result<KernelImage, Failure> {
    let root = workspace_root();
    // One target directory per build variant, shared by both boards: core, alloc and every
    // dependency are built once per variant (they do not depend on the board feature), only the
    // kernel crate twice. Each board's artifacts are copied to their own directory.
    let kernel_dir = target_dir().join("kernel");
    let artifact_dir = kernel_dir.join(board.name()).join(variant.name());
    let target_dir = kernel_dir.join(variant.name());
    let flags = kernel_rustflags(variant);
    eprintln!("xtask: building kernel ({}, variant {})", board.name(), variant.name());
    let status = Command::new(env!("CARGO"))
        .current_dir(&root)
        .args(["build", "--release", "--package", "kernel", "--target", KERNEL_TARGET])
        .args(["-Zbuild-std=core,alloc,compiler_builtins", "-Zbuild-std-features=compiler-builtins-mem"])
        .args(["--no-default-features", "--features", board.feature()])
        .arg("--target-dir")
        .arg(&target_dir)
        .args(["-Zunstable-options", "--artifact-dir"])
        .arg(&artifact_dir)
        .env_remove("RUSTFLAGS")
        .env("CARGO_ENCODED_RUSTFLAGS", flags.join("\x1f"))
        .env("TRACELAB_VARIANT", variant.name())
        .env("DEFMT_LOG", "info")
        // One codegen unit: which functions LLVM inlines into a hot path (the probe hit, the
        // trap entry, the walkers) then depends on the code, not on how the kernel crate
        // happened to be split into units, so an icount row moves only when its path changes.
        .env("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "1")
        .status()
        .map_err(|error| Failure::usage(format!("cannot run cargo: {error}")))?;
    if !status.success() {
        return Err(Failure { status: 1, message: format!("kernel build failed (variant {})", variant.name()) });
    }
    let elf = artifact_dir.join("kernel");
    let mut data = std::fs::read(&elf).map_err(|error| Failure::usage(format!("{}: {error}", elf.display())))?;
    // The symbol table goes into the linked image (ELF and raw alike): the artifact copy is
    // rewritten in place (idempotent: the section is refilled from the symbols).
    crate::ksyms::embed(&mut data)?;
    std::fs::write(&elf, &data).map_err(|error| Failure::usage(format!("{}: {error}", elf.display())))?;
    let file = object::File::parse(&*data).map_err(|error| Failure::usage(format!("{}: {error}", elf.display())))?;
    if variant != BuildVariant::Plain {
        check_patchable_entries(&file)?;
    }
    let raw = elf.with_extension("bin");
    std::fs::write(&raw, raw_image(&file)?).map_err(|error| Failure::usage(format!("{}: {error}", raw.display())))?;
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
