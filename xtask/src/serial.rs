//! Reading a kernel's log from a serial line: a Raspberry Pi 4's USB-serial adapter, or the
//! pseudo-terminal QEMU `raspi4b` gives its UART (the same path, tested without hardware).
//! A run ends at the kernel's sentinel line `tracelab: exit status N`.

use crate::Failure;
use crate::log::{KernelLog, LogLine};
use crate::qemu::exit_sentinel;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Opens a tty in raw mode at `baud` (defmt frames are binary: no line discipline may touch them).
pub fn open(path: &Path, baud: u32) -> Result<std::fs::File, Failure> {
    let status = Command::new("stty")
        .arg("-F")
        .arg(path)
        .args([&baud.to_string(), "raw", "-echo", "-ixon", "-ixoff", "-crtscts", "cs8", "-cstopb", "-parenb"])
        .status()
        .map_err(|error| Failure::usage(format!("cannot run stty: {error}")))?;
    if !status.success() {
        return Err(Failure::usage(format!("{}: not a serial port (stty failed)", path.display())));
    }
    std::fs::File::open(path).map_err(|error| Failure::usage(format!("{}: {error}", path.display())))
}

pub struct SerialRun {
    pub log: Vec<LogLine>,
    /// The sentinel's status; None if the line ended or the timeout passed first.
    pub status: Option<i32>,
}

/// Decodes `port` with the kernel ELF (log table and symbols) until the sentinel, end of stream
/// or `timeout`.
pub fn read_run(
    port: std::fs::File,
    elf_path: &Path,
    timeout: Option<Duration>,
    echo: bool,
) -> Result<SerialRun, Failure> {
    let elf = std::fs::read(elf_path).map_err(|error| Failure::usage(format!("{}: {error}", elf_path.display())))?;
    let mut log = KernelLog::with_symbols(&elf, elf_path)?;
    // Demo lines rendered, the function tracer's ring written to target/trace/ (as for QEMU).
    let mut presenter = echo.then(|| crate::demo::Presenter::new(&elf));
    let (sender, receiver) = std::sync::mpsc::channel::<Vec<u8>>();
    // The reader thread blocks in read(); it ends with the stream (or with the process).
    std::thread::spawn(move || {
        let mut port = port;
        let mut buffer = [0u8; 4096];
        while let Ok(count) = port.read(&mut buffer) {
            if count == 0 || sender.send(buffer[..count].to_vec()).is_err() {
                break;
            }
        }
    });
    let start = Instant::now();
    let mut status = None;
    while status.is_none() {
        let wait = timeout.map_or(Duration::from_secs(3600), |timeout| timeout.saturating_sub(start.elapsed()));
        if wait.is_zero() {
            break;
        }
        match receiver.recv_timeout(wait.min(Duration::from_millis(200))) {
            Ok(bytes) => {
                for line in log.feed(&bytes) {
                    if let Some(presenter) = presenter.as_mut() {
                        presenter.present(&line).iter().for_each(|text| println!("{text}"));
                    }
                    status = status.or(exit_sentinel(&line.text));
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    Ok(SerialRun { log: log.into_lines(), status })
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
}

/// `cargo xtask monitor`: decode a board's log until its sentinel; exit with its status.
pub fn monitor(args: &MonitorArgs) -> Result<u8, Failure> {
    let elf_path = match &args.elf {
        Some(path) => path.clone(),
        None => crate::build::kernel(crate::build::Board::Rpi4, args.variant)?.elf,
    };
    let port = open(&args.serial, args.baud)?;
    eprintln!("xtask: reading {} with {}; power on the board", args.serial.display(), elf_path.display());
    let run = read_run(port, &elf_path, args.timeout.map(Duration::from_secs), true)?;
    match run.status {
        Some(status) => Ok(status.clamp(0, 255) as u8),
        None => Err(Failure {
            status: 124,
            message: format!("no `tracelab: exit status` line from {}", args.serial.display()),
        }),
    }
}
