//! Raspberry Pi 4 boot files: the firmware (`start4.elf`, `fixup4.dat`) from Debian's
//! `raspi-firmware` and the device tree `bcm2711-rpi-4-b.dtb` from Debian's arm64 kernel
//! package, fetched with `apt-get download` under a private apt configuration in the target
//! directory (the machine's own apt sources are read, for their mirror and keyring, never
//! written; no root needed), unpacked with `dpkg -x` and cached; or taken from the user
//! (`--firmware DIR`, `--dtb FILE`).

use crate::Failure;
use std::path::{Path, PathBuf};
use std::process::Command;

const FIRMWARE_PACKAGE: &str = "raspi-firmware";
const KERNEL_METAPACKAGE: &str = "linux-image-arm64";
pub const DTB_NAME: &str = "bcm2711-rpi-4-b.dtb";

pub struct BootFiles {
    pub start4: PathBuf,
    pub fixup4: PathBuf,
    pub dtb: PathBuf,
    /// Where they came from, for the user.
    pub source: String,
}

#[derive(clap::Args, Clone, Default)]
pub struct BootFileArgs {
    /// Directory holding start4.elf and fixup4.dat (default: fetched from Debian and cached).
    #[arg(long)]
    pub firmware: Option<PathBuf>,
    /// The Pi 4 device tree (default: bcm2711-rpi-4-b.dtb fetched from Debian and cached).
    #[arg(long)]
    pub dtb: Option<PathBuf>,
}

pub fn cache_dir() -> PathBuf {
    crate::build::target_dir().join("rpi4-boot")
}

fn existing(path: PathBuf) -> Result<PathBuf, Failure> {
    if path.is_file() { Ok(path) } else { Err(Failure::usage(format!("{} does not exist", path.display()))) }
}

/// The boot files, from the user's paths or the cache (fetching into it when needed).
pub fn get(args: &BootFileArgs) -> Result<BootFiles, Failure> {
    let cache = cache_dir();
    let cached = |name: &str| cache.join(name);
    let need_fetch = || {
        (args.firmware.is_none() && !(cached("start4.elf").is_file() && cached("fixup4.dat").is_file()))
            || (args.dtb.is_none() && !cached(DTB_NAME).is_file())
    };
    // Two commands that both find the cache empty fetch one after the other; the second then
    // finds the files there.
    let _lock = if need_fetch() {
        Some(
            crate::atomic::lock_dir(&cache, "Raspberry Pi 4 boot files")
                .map_err(|error| Failure::usage(format!("lock for {}: {error}", cache.display())))?,
        )
    } else {
        None
    };
    if need_fetch() {
        fetch(&cache).map_err(|failure| {
            Failure::usage(format!(
                "cannot fetch the Raspberry Pi 4 boot files: {}; use `--board virt` (no boot files \
                 needed), or give your own with `--firmware DIR --dtb FILE`",
                failure.message
            ))
        })?;
    }
    let (start4, fixup4, firmware_source) = match &args.firmware {
        Some(dir) => (
            existing(dir.join("start4.elf"))?,
            existing(dir.join("fixup4.dat"))?,
            format!("firmware from {}", dir.display()),
        ),
        None => (
            cached("start4.elf"),
            cached("fixup4.dat"),
            format!("firmware from Debian {FIRMWARE_PACKAGE} ({})", read_note(&cache, "firmware")),
        ),
    };
    let (dtb, dtb_source) = match &args.dtb {
        Some(path) => (existing(path.clone())?, format!("device tree {}", path.display())),
        None => (cached(DTB_NAME), format!("device tree from Debian {}", read_note(&cache, "kernel"))),
    };
    Ok(BootFiles { start4, fixup4, dtb, source: format!("{firmware_source}; {dtb_source}") })
}

fn read_note(cache: &Path, what: &str) -> String {
    std::fs::read_to_string(cache.join(format!("{what}.package"))).unwrap_or_default().trim().to_string()
}

fn run(command: &mut Command, what: &str) -> Result<String, Failure> {
    let output = command.output().map_err(|error| Failure::usage(format!("{what}: {error}")))?;
    if !output.status.success() {
        return Err(Failure::usage(format!(
            "{what} failed: {}",
            String::from_utf8_lossy(&output.stderr).lines().last().unwrap_or("no output")
        )));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Downloads and unpacks both packages into `cache`, keeping only the files tracelab uses.
fn fetch(cache: &Path) -> Result<(), Failure> {
    // The mirror and keyring the machine already uses for its Debian release.
    let (source, suite) = crate::apt::machine_debian_source().map_err(Failure::usage)?;
    eprintln!(
        "xtask: fetching Raspberry Pi 4 boot files from Debian {suite} ({}) into {}",
        source.uri,
        cache.display()
    );
    let apt = cache.join("apt");
    for dir in ["lists/partial", "cache/archives/partial", "download", "sources.list.d"] {
        std::fs::create_dir_all(apt.join(dir))
            .map_err(|error| Failure::usage(format!("{}: {error}", apt.display())))?;
    }
    let sources = apt.join("sources.list.d/debian.sources");
    let status = apt.join("status");
    let write = |path: &Path, text: &str| {
        std::fs::write(path, text).map_err(|error| Failure::usage(format!("{}: {error}", path.display())))
    };
    write(&sources, &crate::apt::deb822_entry(&source, &suite, &["main", "non-free-firmware"], Some("arm64")))?;
    write(&status, "")?;
    let options: Vec<String> = [
        "Dir::Etc::SourceList=/dev/null".into(),
        format!("Dir::Etc::SourceParts={}", apt.join("sources.list.d").display()),
        format!("Dir::State::Lists={}", apt.join("lists").display()),
        format!("Dir::State::status={}", status.display()),
        format!("Dir::Cache={}", apt.join("cache").display()),
        "APT::Architecture=arm64".into(),
        "APT::Architectures::=arm64".into(),
        "Debug::NoLocking=1".into(),
        "APT::Sandbox::User=root".into(),
    ]
    .iter()
    .flat_map(|option| ["-o".to_string(), option.clone()])
    .collect();
    run(Command::new("apt-get").args(&options).args(["-q", "update"]), "apt-get update (private configuration)")?;
    // The metapackage names the current kernel package.
    let depends =
        run(Command::new("apt-cache").args(&options).args(["depends", KERNEL_METAPACKAGE]), "apt-cache depends")?;
    let kernel_package = depends
        .lines()
        .find_map(|line| line.trim().strip_prefix("Depends: ").filter(|name| name.starts_with("linux-image-")))
        .ok_or_else(|| Failure::usage(format!("{KERNEL_METAPACKAGE} names no kernel package")))?
        .to_string();
    let download = apt.join("download");
    run(
        Command::new("apt-get")
            .args(&options)
            .args(["-q", "download", FIRMWARE_PACKAGE, &kernel_package])
            .current_dir(&download),
        "apt-get download",
    )?;
    let unpacked = apt.join("unpacked");
    let _ = std::fs::remove_dir_all(&unpacked);
    let mut versions = Vec::new();
    for entry in std::fs::read_dir(&download).map_err(|error| Failure::usage(error.to_string()))? {
        let deb = entry.map_err(|error| Failure::usage(error.to_string()))?.path();
        if deb.extension().is_some_and(|extension| extension == "deb") {
            run(Command::new("dpkg").arg("-x").arg(&deb).arg(&unpacked), "dpkg -x")?;
            versions.push(deb.file_name().unwrap_or_default().to_string_lossy().into_owned());
        }
    }
    let find = |name: &str| -> Result<PathBuf, Failure> {
        find_file(&unpacked, name).ok_or_else(|| Failure::usage(format!("{name} not found in the downloaded packages")))
    };
    for name in ["start4.elf", "fixup4.dat", DTB_NAME] {
        // Whole files by rename: a running QEMU may be reading the old ones.
        let found = find(name)?;
        let bytes = std::fs::read(&found).map_err(|error| Failure::usage(format!("{}: {error}", found.display())))?;
        crate::atomic::write(&cache.join(name), &bytes).map_err(|error| Failure::usage(error.to_string()))?;
    }
    let firmware = versions.iter().find(|name| name.starts_with(FIRMWARE_PACKAGE)).cloned().unwrap_or_default();
    let kernel = versions.iter().find(|name| name.starts_with("linux-image")).cloned().unwrap_or_default();
    write(&cache.join("firmware.package"), &firmware)?;
    write(&cache.join("kernel.package"), &kernel)?;
    // Keep the three files, not the 400 MB of packages.
    let _ = std::fs::remove_dir_all(&unpacked);
    let _ = std::fs::remove_dir_all(&download);
    Ok(())
}

fn find_file(dir: &Path, name: &str) -> Option<PathBuf> {
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if let Some(found) = find_file(&path, name) {
                return Some(found);
            }
        } else if path.file_name().is_some_and(|file| file == name) {
            return Some(path);
        }
    }
    None
}
