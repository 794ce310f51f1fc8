//! `cargo xtask flash`: writes the SD card image to a removable, unmounted whole-disk block
//! device, after confirmation. Everything else is refused with the reason.

use crate::Failure;
use std::io::{BufRead, Read, Write};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct FlashArgs {
    /// The SD card's block device, e.g. /dev/sdb or /dev/mmcblk0 (the whole disk, not a partition).
    #[arg(long)]
    pub device: PathBuf,
    /// The image (default: where `cargo xtask sdimage` writes it).
    #[arg(long)]
    pub image: Option<PathBuf>,
    /// Do not ask for confirmation.
    #[arg(long)]
    pub yes: bool,
}

/// Why a device may not be written, or its size and model when it may.
pub fn check_device(device: &Path, sysfs: &Path, mounts: &str) -> Result<(u64, String), String> {
    let metadata = std::fs::metadata(device).map_err(|error| format!("{}: {error}", device.display()))?;
    if !metadata.file_type().is_block_device() {
        return Err(format!("{} is not a block device", device.display()));
    }
    let name = std::fs::canonicalize(device)
        .ok()
        .and_then(|path| path.file_name().map(|name| name.to_string_lossy().into_owned()))
        .ok_or_else(|| format!("{}: cannot resolve the device name", device.display()))?;
    let block = sysfs.join("class/block").join(&name);
    if block.join("partition").exists() {
        return Err(format!("{} is a partition: give the whole disk", device.display()));
    }
    let read = |file: &str| std::fs::read_to_string(block.join(file)).unwrap_or_default().trim().to_string();
    if read("removable") != "1" {
        return Err(format!("{} is not a removable device ({}/removable is not 1)", device.display(), block.display()));
    }
    // The disk or any of its partitions (sdb1, mmcblk0p1) mounted.
    if let Some(line) = mounts.lines().find(|line| {
        line.split_whitespace()
            .next()
            .is_some_and(|source| source.strip_prefix("/dev/").is_some_and(|source| source.starts_with(&name)))
    }) {
        return Err(format!("{} is mounted: {}", device.display(), line));
    }
    let sectors: u64 = read("size").parse().unwrap_or(0);
    Ok((sectors * 512, read("device/model")))
}

pub fn run(args: &FlashArgs) -> Result<u8, Failure> {
    let image_path = args.image.clone().unwrap_or_else(crate::sdimage::default_image_path);
    let image = std::fs::File::open(&image_path).map_err(|error| {
        Failure::usage(format!("{}: {error} (run `cargo xtask sdimage` first)", image_path.display()))
    })?;
    let image_size = image.metadata().map_err(|error| Failure::usage(error.to_string()))?.len();
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let (size, model) = check_device(&args.device, Path::new("/sys"), &mounts)
        .map_err(|reason| Failure::usage(format!("refusing to flash: {reason}")))?;
    if size != 0 && size < image_size {
        return Err(Failure::usage(format!(
            "{} ({size} bytes) is smaller than the image ({image_size} bytes)",
            args.device.display()
        )));
    }
    println!(
        "about to overwrite {} ({model}, {} MiB) with {} ({} MiB)",
        args.device.display(),
        size >> 20,
        image_path.display(),
        image_size >> 20
    );
    if !args.yes {
        print!("type `yes` to continue: ");
        let _ = std::io::stdout().flush();
        let mut answer = String::new();
        let _ = std::io::stdin().lock().read_line(&mut answer);
        if answer.trim() != "yes" {
            println!("not flashed");
            return Ok(1);
        }
    }
    let mut device = std::fs::OpenOptions::new()
        .write(true)
        .open(&args.device)
        .map_err(|error| Failure::usage(format!("{}: {error}", args.device.display())))?;
    let mut reader = std::io::BufReader::with_capacity(4 << 20, image);
    let mut buffer = vec![0u8; 4 << 20];
    loop {
        let count = reader.read(&mut buffer).map_err(|error| Failure::usage(error.to_string()))?;
        if count == 0 {
            break;
        }
        device
            .write_all(&buffer[..count])
            .map_err(|error| Failure::usage(format!("writing {}: {error}", args.device.display())))?;
    }
    device.sync_all().map_err(|error| Failure::usage(format!("syncing {}: {error}", args.device.display())))?;
    println!("flashed {}: put the card in the Pi 4, connect the serial adapter, power on", args.device.display());
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_what_is_not_a_block_device() {
        let file = std::env::temp_dir().join("tracelab-flash-not-a-device");
        std::fs::write(&file, b"x").unwrap();
        assert!(check_device(&file, Path::new("/sys"), "").unwrap_err().contains("not a block device"));
        assert!(check_device(Path::new("/dev/does-not-exist"), Path::new("/sys"), "").is_err());
        let _ = std::fs::remove_file(&file);
    }

    /// A block device node named loop0 (the machine's, or one made with mknod), and a fake
    /// sysfs that says what it is.
    #[test]
    fn refuses_fixed_partition_and_mounted_devices() {
        let sysfs = std::env::temp_dir().join(format!("tracelab-fake-sysfs-{}", std::process::id()));
        std::fs::create_dir_all(&sysfs).unwrap();
        let is_block =
            |path: &Path| std::fs::metadata(path).is_ok_and(|metadata| metadata.file_type().is_block_device());
        let mut device = PathBuf::from("/dev/loop0");
        if !is_block(&device) {
            device = sysfs.join("loop0");
            let made = std::process::Command::new("mknod").arg(&device).args(["b", "7", "0"]).status();
            assert!(made.is_ok_and(|status| status.success()), "no /dev/loop0 and mknod failed (needs root)");
        }
        let device = device.as_path();
        let block = sysfs.join("class/block/loop0");
        std::fs::create_dir_all(block.join("device")).unwrap();
        std::fs::write(block.join("removable"), "0\n").unwrap();
        std::fs::write(block.join("size"), "131072\n").unwrap();
        assert!(check_device(device, &sysfs, "").unwrap_err().contains("not a removable"));
        std::fs::write(block.join("removable"), "1\n").unwrap();
        std::fs::write(block.join("device/model"), "SD card\n").unwrap();
        assert_eq!(check_device(device, &sysfs, "").unwrap(), (64 << 20, "SD card".to_string()));
        let mounts = "/dev/loop0p1 /media/boot vfat rw 0 0\n";
        assert!(check_device(device, &sysfs, mounts).unwrap_err().contains("is mounted"));
        std::fs::write(block.join("partition"), "1\n").unwrap();
        assert!(check_device(device, &sysfs, "").unwrap_err().contains("is a partition"));
        let _ = std::fs::remove_dir_all(&sysfs);
    }
}
