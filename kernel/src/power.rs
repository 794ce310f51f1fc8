//! How a run ends: the sentinel line xtask waits for, then the exit status handed to QEMU
//! through semihosting, or, on hardware, the CPU parked.

use crate::arch::{cpu, semihosting};
use crate::args::Args;
use crate::log;
use core::sync::atomic::{AtomicBool, Ordering};
use protocol::cmdline as key;

/// How a run ends; xtask reads it as QEMU's exit status.
pub use protocol::ExitStatus;

/// Whether `exit` leaves through semihosting (else it parks the CPU).
static SEMIHOSTING: AtomicBool = AtomicBool::new(crate::board::CONFIG.semihosting_by_default);

/// Where the exit status goes (`exit=semihosting|park`; default: the board's).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// To the host, through semihosting (QEMU's exit status).
    Semihosting,
    /// Nowhere: the CPU parks (hardware without a debugger).
    Park,
}

impl Exit {
    pub fn from_args(args: &Args) -> Self {
        let mut exit = if crate::board::CONFIG.semihosting_by_default { Self::Semihosting } else { Self::Park };
        for value in args.values(key::EXIT) {
            match value {
                "semihosting" => exit = Self::Semihosting,
                "park" => exit = Self::Park,
                _ => Args::ignoring(key::EXIT, value),
            }
        }
        exit
    }
}

/// Chooses where `exit` hands the status. At boot, before anything can end the run.
pub fn set_exit(exit: Exit) {
    SEMIHOSTING.store(exit == Exit::Semihosting, Ordering::Relaxed);
}

/// Ends the run: prints the sentinel line xtask waits for, then leaves QEMU through semihosting
/// (which carries the status) or, on hardware, parks the CPU.
pub fn exit(status: ExitStatus) -> ! {
    cpu::mask_interrupts();
    defmt::info!("tracelab: exit status {=u8}", status as u8);
    log::drain();
    if SEMIHOSTING.load(Ordering::Relaxed) {
        semihosting::exit(status as u8);
    }
    park()
}

/// Ends the run with `status` at once: no sentinel line, no log drained. For a panic inside the
/// panic report, where printing is what failed.
pub fn exit_silently(status: ExitStatus) -> ! {
    semihosting::exit(status as u8);
    park()
}

fn park() -> ! {
    loop {
        cpu::wait_for_interrupt();
    }
}
