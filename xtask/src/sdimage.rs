//! The Raspberry Pi 4 SD card image: an MBR with one FAT32 boot partition (type 0x0C at LBA
//! 2048) holding the firmware, the device tree, `config.txt`, `cmdline.txt` and `kernel8.img`.
//! Made without root (mbrman + fatfs on a plain file), and checked after it is written.

use crate::Failure;
use crate::bootfiles::{self, BootFileArgs, DTB_NAME};
use crate::build::{self, Board, BuildVariant};
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

const SECTOR: u64 = 512;
const PARTITION_START_LBA: u64 = 2048;
const IMAGE_SIZE: u64 = 64 << 20;
/// MBR partition type: FAT32 with LBA addressing, what the Pi 4 boot ROM and firmware read.
const FAT32_LBA: u8 = 0x0c;

/// The firmware's configuration: 64-bit kernel at 0x80000, entered at EL2 by its armstub, PL011
/// console enabled (the kernel routes GPIO14/15 to it itself).
pub const CONFIG_TXT: &str = "\
# tracelab on a Raspberry Pi 4 (written by cargo xtask sdimage)
arm_64bit=1
kernel=kernel8.img
kernel_address=0x80000
enable_uart=1
device_tree=bcm2711-rpi-4-b.dtb
";

/// Where `sdimage` writes and `flash` reads the card image by default.
pub fn default_image_path() -> PathBuf {
    build::target_dir().join("rpi4/tracelab-sd.img")
}

#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum BootRun {
    /// Show the banner and park.
    Demo,
    /// Run the kernel tests and print the sentinel with their status.
    Test,
    /// Run benchmark suites at boot (read them with `cargo xtask bench --board rpi4 --serial`).
    Bench,
}

#[derive(clap::Args)]
pub struct SdImageArgs {
    /// Output image file (default: `rpi4/tracelab-sd.img` in the target directory, which
    /// follows CARGO_TARGET_DIR).
    #[arg(long)]
    pub out: Option<PathBuf>,
    #[arg(long, value_enum, default_value = "prod")]
    pub variant: BuildVariant,
    /// What the kernel does at boot (written to cmdline.txt).
    #[arg(long, value_enum, default_value = "demo")]
    pub run: BootRun,
    /// Suites for `--run bench` (comma-separated; default all).
    #[arg(long, default_value = "")]
    pub bench: String,
    /// Repetitions per case for `--run bench`.
    #[arg(long, default_value = "5")]
    pub reps: u32,
    #[command(flatten)]
    pub boot_files: BootFileArgs,
}

/// A file on the boot partition.
pub struct BootFile {
    pub name: &'static str,
    pub data: Vec<u8>,
}

pub fn cmdline(run: BootRun, bench: &str, reps: u32) -> String {
    match run {
        BootRun::Demo => "run=demo".into(),
        BootRun::Test => "run=test".into(),
        BootRun::Bench => format!("run=bench bench={bench} reps={reps} clock=cycles"),
    }
}

pub fn run(args: &SdImageArgs) -> Result<u8, Failure> {
    let files = bootfiles::get(&args.boot_files)?;
    eprintln!("xtask: {}", files.source);
    let image = build::kernel(Board::Rpi4, args.variant)?;
    let read =
        |path: &Path| std::fs::read(path).map_err(|error| Failure::usage(format!("{}: {error}", path.display())));
    let kernel = read(&image.raw)?;
    let boot_files = vec![
        BootFile { name: "kernel8.img", data: kernel.clone() },
        BootFile { name: "config.txt", data: CONFIG_TXT.as_bytes().to_vec() },
        BootFile { name: "cmdline.txt", data: format!("{}\n", cmdline(args.run, &args.bench, args.reps)).into_bytes() },
        BootFile { name: "start4.elf", data: read(&files.start4)? },
        BootFile { name: "fixup4.dat", data: read(&files.fixup4)? },
        BootFile { name: DTB_NAME, data: read(&files.dtb)? },
    ];
    let out = args.out.clone().unwrap_or_else(default_image_path);
    if let Some(parent) = out.parent() {
        std::fs::create_dir_all(parent).map_err(|error| Failure::usage(format!("{}: {error}", parent.display())))?;
    }
    // Built and verified beside its place, then renamed over it: a `flash` reading the old
    // image meanwhile reads a whole one (`crate::atomic`).
    let building = crate::atomic::temporary_path(&out);
    let built = write(&building, &boot_files)
        .map_err(|error| Failure::usage(format!("{}: {error}", out.display())))
        .and_then(|()| verify(&building, &kernel).map_err(|error| Failure { status: 1, message: error }))
        .and_then(|names| {
            std::fs::rename(&building, &out)
                .map(|()| names)
                .map_err(|error| Failure::usage(format!("{}: {error}", out.display())))
        });
    if built.is_err() {
        let _ = std::fs::remove_file(&building);
    }
    let names = built?;
    println!(
        "wrote {} ({} MiB, variant {}, cmdline `{}`): {}",
        out.display(),
        IMAGE_SIZE >> 20,
        args.variant.name(),
        cmdline(args.run, &args.bench, args.reps),
        names.join(", ")
    );
    println!("the kernel ELF for `cargo xtask monitor`/`bench --serial` is {}", image.elf.display());
    Ok(0)
}

/// Writes the image: MBR, then a FAT32 filesystem holding `files` in the partition.
pub fn write(path: &Path, files: &[BootFile]) -> std::io::Result<()> {
    let mut disk = File::options().read(true).write(true).create(true).truncate(true).open(path)?;
    disk.set_len(IMAGE_SIZE)?;
    let sectors = (IMAGE_SIZE / SECTOR - PARTITION_START_LBA) as u32;
    let mut mbr = mbrman::MBR::new_from(&mut disk, SECTOR as u32, *b"tlab").map_err(std::io::Error::other)?;
    mbr[1] = mbrman::MBRPartitionEntry {
        boot: mbrman::BOOT_INACTIVE,
        first_chs: mbrman::CHS::empty(),
        sys: FAT32_LBA,
        last_chs: mbrman::CHS::empty(),
        starting_lba: PARTITION_START_LBA as u32,
        sectors,
    };
    mbr.write_into(&mut disk).map_err(std::io::Error::other)?;
    let start = PARTITION_START_LBA * SECTOR;
    let mut partition = fscommon::StreamSlice::new(disk, start, IMAGE_SIZE)?;
    fatfs::format_volume(
        &mut partition,
        fatfs::FormatVolumeOptions::new()
            .fat_type(fatfs::FatType::Fat32)
            .bytes_per_cluster(512)
            .volume_label(*b"TRACELAB   "),
    )?;
    let filesystem = fatfs::FileSystem::new(partition, fatfs::FsOptions::new())?;
    for file in files {
        filesystem.root_dir().create_file(file.name)?.write_all(&file.data)?;
    }
    filesystem.unmount()
}

/// Opens an image and checks what the Pi needs: the partition table, the files, config.txt, and
/// that kernel8.img is `kernel` byte for byte. Returns the file names.
pub fn verify(path: &Path, kernel: &[u8]) -> Result<Vec<String>, String> {
    let mut disk = File::open(path).map_err(|error| format!("{}: {error}", path.display()))?;
    let mbr = mbrman::MBR::read_from(&mut disk, SECTOR as u32).map_err(|error| format!("MBR: {error}"))?;
    let partition = &mbr[1];
    if partition.sys != FAT32_LBA || partition.starting_lba as u64 != PARTITION_START_LBA || partition.sectors == 0 {
        return Err(format!(
            "partition 1 is type {:#04x} at LBA {} ({} sectors), not FAT32 (0x0c) at LBA {PARTITION_START_LBA}",
            partition.sys, partition.starting_lba, partition.sectors
        ));
    }
    let end = (partition.starting_lba as u64 + partition.sectors as u64) * SECTOR;
    let slice =
        fscommon::StreamSlice::new(disk, PARTITION_START_LBA * SECTOR, end).map_err(|error| error.to_string())?;
    let filesystem = fatfs::FileSystem::new(slice, fatfs::FsOptions::new()).map_err(|error| format!("FAT: {error}"))?;
    if filesystem.fat_type() != fatfs::FatType::Fat32 {
        return Err(format!("filesystem is {:?}, not FAT32", filesystem.fat_type()));
    }
    let root = filesystem.root_dir();
    let names: Vec<String> = root.iter().filter_map(Result::ok).map(|entry| entry.file_name()).collect();
    for required in ["kernel8.img", "config.txt", "cmdline.txt", "start4.elf", "fixup4.dat", DTB_NAME] {
        if !names.iter().any(|name| name == required) {
            return Err(format!("{required} is missing (files: {})", names.join(", ")));
        }
    }
    let read = |name: &str| -> Result<Vec<u8>, String> {
        let mut data = Vec::new();
        root.open_file(name)
            .and_then(|mut file| file.read_to_end(&mut data))
            .map_err(|error| format!("{name}: {error}"))?;
        Ok(data)
    };
    let config = String::from_utf8(read("config.txt")?).map_err(|_| "config.txt is not UTF-8".to_string())?;
    for line in ["arm_64bit=1", "kernel=kernel8.img", "kernel_address=0x80000", "enable_uart=1"] {
        if !config.lines().any(|existing| existing.trim() == line) {
            return Err(format!("config.txt lacks `{line}`"));
        }
    }
    if read("kernel8.img")? != kernel {
        return Err("kernel8.img differs from the built kernel".into());
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(kernel: &[u8]) -> Vec<BootFile> {
        ["config.txt", "cmdline.txt", "start4.elf", "fixup4.dat", DTB_NAME]
            .into_iter()
            .map(|name| BootFile {
                name,
                data: if name == "config.txt" { CONFIG_TXT.into() } else { name.as_bytes().repeat(100) },
            })
            .chain([BootFile { name: "kernel8.img", data: kernel.to_vec() }])
            .collect()
    }

    #[test]
    fn written_image_verifies_and_a_changed_kernel_does_not() {
        let path = std::env::temp_dir().join(format!("tracelab-sdimage-test-{}.img", std::process::id()));
        let kernel: Vec<u8> = (0..300_000u32).map(|index| (index * 7 + 3) as u8).collect();
        write(&path, &files(&kernel)).unwrap();
        let names = verify(&path, &kernel).unwrap();
        assert_eq!(names.len(), 6);
        let mut other = kernel.clone();
        other[12_345] ^= 1;
        assert!(verify(&path, &other).unwrap_err().contains("kernel8.img differs"));
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn missing_files_and_wrong_partitions_are_reported() {
        let path = std::env::temp_dir().join(format!("tracelab-sdimage-missing-{}.img", std::process::id()));
        let kernel = vec![1, 2, 3];
        let without_dtb: Vec<BootFile> = files(&kernel).into_iter().filter(|file| file.name != DTB_NAME).collect();
        write(&path, &without_dtb).unwrap();
        assert!(verify(&path, &kernel).unwrap_err().contains(DTB_NAME));
        // Corrupt the partition type byte of entry 1 (MBR offset 446 + 4).
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[446 + 4] = 0x83;
        std::fs::write(&path, &bytes).unwrap();
        assert!(verify(&path, &kernel).unwrap_err().contains("not FAT32"));
        let _ = std::fs::remove_file(&path);
    }
}
