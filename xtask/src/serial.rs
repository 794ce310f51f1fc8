//! Reading a kernel's log from a serial line: a Raspberry Pi 4's USB-serial adapter, or the
//! pseudo-terminal QEMU `raspi4b` gives its UART (the same path, tested without hardware).
//! A run ends at the kernel's sentinel line `tracelab: exit status N`.

use crate::Failure;
use crate::log::{KernelLog, LogLine, exit_sentinel};
use crate::qemu::{Ending, Silence};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// An open serial port.
pub type Port = Box<dyn serialport::SerialPort>;

/// How long one read waits, so the reader notices when its run is over.
const READ_POLL: Duration = Duration::from_millis(200);

/// Opens a tty raw at `baud`, 8N1, no flow control (defmt frames are binary: no line
/// discipline may touch them).
pub fn open(path: &Path, baud: u32) -> Result<Port, Failure> {
    let name = path.to_string_lossy();
    serialport::new(name.as_ref(), baud)
        .data_bits(serialport::DataBits::Eight)
        .parity(serialport::Parity::None)
        .stop_bits(serialport::StopBits::One)
        .flow_control(serialport::FlowControl::None)
        .timeout(READ_POLL)
        .open()
        .map_err(|error| Failure::usage(open_error(path, &error)))
}

/// The reason a port did not open, with what to do when it is a permission problem.
fn open_error(path: &Path, error: &serialport::Error) -> String {
    let denied = matches!(error.kind(), serialport::ErrorKind::Io(std::io::ErrorKind::PermissionDenied))
        || error.to_string().contains("Permission denied");
    if !denied {
        return format!("{}: {error}", path.display());
    }
    match device_group(path) {
        Some(group) => format!(
            "{}: permission denied; add yourself to its group with `sudo usermod -aG {group} $USER` and log \
             in again (or run once with sudo)",
            path.display()
        ),
        None => format!(
            "{}: permission denied, and its group may not open it either; run with sudo, or let your \
             user open it (a udev rule for the adapter, or `sudo chmod a+rw {}` until it is unplugged)",
            path.display(),
            path.display()
        ),
    }
}

/// The name of the group owning the device file (often `dialout` or `uucp`), when that group
/// may read and write it and is not root's.
fn device_group(path: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let metadata = std::fs::metadata(path).ok()?;
    if metadata.mode() & 0o060 != 0o060 || metadata.gid() == 0 {
        return None;
    }
    let gid = metadata.gid().to_string();
    let groups = std::fs::read_to_string("/etc/group").ok()?;
    groups.lines().find_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        (fields.nth(1)? == gid).then(|| name.to_string())
    })
}

pub struct SerialRun {
    pub log: Vec<LogLine>,
    /// The sentinel's status; None if the line ended or the timeout passed first.
    pub status: Option<i32>,
    /// How the run ended: the sentinel, the timeout or the line closing.
    pub ending: Ending,
}

/// Decodes `port` with the kernel ELF (log table and symbols) until the sentinel, end of stream
/// or `timeout`, handing each line to `on_line` as it is decoded.
pub fn read_run(
    port: Port,
    elf_path: &Path,
    timeout: Option<Duration>,
    on_line: &mut dyn FnMut(&LogLine),
) -> Result<SerialRun, Failure> {
    let elf = std::fs::read(elf_path).map_err(|error| Failure::usage(format!("{}: {error}", elf_path.display())))?;
    let mut log = KernelLog::with_symbols(&elf, elf_path)?;
    let (sender, receiver) = std::sync::mpsc::channel::<Vec<u8>>();
    // The reader ends with the stream, or when this run is over (it polls `done`).
    let done = Arc::new(AtomicBool::new(false));
    let reader_done = done.clone();
    std::thread::spawn(move || {
        let mut port = port;
        let mut buffer = [0u8; 4096];
        while !reader_done.load(Ordering::Relaxed) {
            match port.read(&mut buffer) {
                Ok(0) => break,
                Ok(count) => {
                    if sender.send(buffer[..count].to_vec()).is_err() {
                        break;
                    }
                }
                Err(error) if error.kind() == std::io::ErrorKind::TimedOut => {}
                Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
    });
    let start = Instant::now();
    let mut status = None;
    let mut closed = false;
    let (mut last_output, mut last_line) = (start, None);
    while status.is_none() {
        let wait = timeout.map_or(Duration::from_secs(3600), |timeout| timeout.saturating_sub(start.elapsed()));
        if wait.is_zero() {
            break;
        }
        match receiver.recv_timeout(wait.min(Duration::from_millis(200))) {
            Ok(bytes) => {
                last_output = Instant::now();
                for line in log.feed(&bytes) {
                    on_line(&line);
                    status = status.or(exit_sentinel(&line.text));
                    last_line = Some(line.text.clone());
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                closed = true;
                break;
            }
        }
    }
    done.store(true, Ordering::Relaxed);
    let silence = Silence {
        after_s: start.elapsed().as_secs(),
        quiet_s: if last_line.is_some() { last_output.elapsed().as_secs() } else { start.elapsed().as_secs() },
        last_line,
    };
    let ending = match status {
        Some(status) => Ending::Exited(status),
        None if closed => Ending::LineClosed(silence),
        None => Ending::TimedOut(silence),
    };
    Ok(SerialRun { log: log.into_lines(), status, ending })
}

#[derive(clap::Args)]
pub struct MonitorArgs {
    /// The serial port, e.g. /dev/ttyUSB0.
    #[arg(long)]
    pub serial: PathBuf,
    #[arg(long, default_value = "115200")]
    pub baud: u32,
    /// The kernel ELF that is on the card (default: the rpi4 build of --variant).
    #[arg(long)]
    pub elf: Option<PathBuf>,
    #[arg(long, value_enum, default_value = "prod")]
    pub variant: crate::build::BuildVariant,
    /// Give up after this many seconds (default: wait for the sentinel).
    #[arg(long)]
    pub timeout: Option<u64>,
    /// How lines are printed: `default`, or `linux` (the shapes Linux's tools read:
    /// docs/reference/log-format.md).
    #[arg(long = "log", value_enum, default_value = "default", value_name = "STYLE")]
    pub log_style: crate::log::LogStyle,
}

/// `cargo xtask monitor`: decode a board's log until its sentinel, streaming it to the console
/// that `console` makes from the kernel ELF; exit with its status.
pub fn monitor<Console: FnMut(&LogLine)>(
    args: &MonitorArgs,
    console: impl FnOnce(&[u8]) -> Console,
) -> Result<u8, Failure> {
    let elf_path = match &args.elf {
        Some(path) => path.clone(),
        None => crate::build::kernel(crate::build::Board::Rpi4, args.variant)?.elf,
    };
    let port = open(&args.serial, args.baud)?;
    eprintln!("xtask: reading {} with {}; power on the board", args.serial.display(), elf_path.display());
    let elf = std::fs::read(&elf_path).map_err(|error| Failure::usage(format!("{}: {error}", elf_path.display())))?;
    let run = read_run(port, &elf_path, args.timeout.map(Duration::from_secs), &mut console(&elf))?;
    match run.ending {
        Ending::Exited(status) => Ok(status.clamp(0, 255) as u8),
        ending => Err(Failure {
            status: if ending.timed_out() { 124 } else { 1 },
            message: format!("{}: {ending}", args.serial.display()),
        }),
    }
}
