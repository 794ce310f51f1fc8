//! The defmt global logger: rzCOBS-framed, timestamped defmt records on the console PL011.
//!
//! xtask decodes the stream with the kernel ELF. A record begun while another is being written
//! (an exception or panic inside a log call) first closes the interrupted frame with a 0x00
//! delimiter, so the decoder drops that one record and resynchronises.

use crate::arch::cpu;
use crate::drivers::pl011::Pl011;
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

static CONSOLE: spin::Mutex<Option<Pl011>> = spin::Mutex::new(None);
static NESTING: AtomicU32 = AtomicU32::new(0);
/// A `static mut`, not a lock: a record begun inside an exception taken while another record is
/// being written (a fault or BRK in a log call, a panic) must still log, so `acquire` cannot wait
/// for the interrupted record to release anything. Its only users are `acquire`/`write`/`release`,
/// with interrupts masked on this CPU; the nested record closes the interrupted frame first.
static mut ENCODER: defmt::Encoder = defmt::Encoder::new();
/// The DAIF the outermost record found, restored when it ends (nested records leave it alone).
static SAVED_DAIF: AtomicU64 = AtomicU64::new(0);

/// Takes the console PL011 at virtual address `base`, routing its pins first if the board says.
pub fn init(base: u64, clock_hz: u32) {
    if let Some(crate::board::ConsolePinmux::Bcm2711Gpio { base }) = crate::board::CONFIG.console_pinmux {
        // SAFETY: the board's GPIO block lies in the early device mapping, and nothing else uses
        // GPIO14/15.
        unsafe { crate::drivers::bcm2711_gpio::route_uart0(base + crate::arch::mmu::VA_OFFSET) };
    }
    // SAFETY: the board's console is mapped as device memory from the first Rust instruction
    // (boot.S's early device block, then the final tables), and only this logger owns it.
    let mut uart = unsafe { Pl011::new(base) };
    uart.init(clock_hz);
    *CONSOLE.lock() = Some(uart);
}

#[unsafe(link_section = ".text.noprobe")]
fn write_console(bytes: &[u8]) {
    // Interrupts are masked while a record is written, so this lock is never contended on one CPU;
    // a nested record (exception during logging) forces it rather than deadlocking.
    let mut guard = CONSOLE.try_lock();
    if guard.is_none() {
        // SAFETY: the holder is the record this one interrupted on the same CPU; it cannot run
        // until this one returns.
        unsafe { CONSOLE.force_unlock() };
        guard = CONSOLE.try_lock();
    }
    if let Some(Some(uart)) = guard.as_deref_mut() {
        uart.write_bytes(bytes);
    }
}

/// Waits until everything logged has left the UART.
pub fn drain() {
    if let Some(Some(uart)) = CONSOLE.try_lock().as_deref() {
        uart.drain();
    }
}

// Every record carries the time since the counter started, shown like dmesg's `[    1.234567]`.
defmt::timestamp!("{=u64:us}", uptime_us());

/// Microseconds of CNTVCT_EL0 (0 while its frequency reads 0, as it may before firmware sets it).
#[unsafe(link_section = ".text.noprobe")]
fn uptime_us() -> u64 {
    let (count, frequency) = (crate::drivers::timer::counter(), crate::drivers::timer::frequency());
    if frequency == 0 {
        return 0;
    }
    count / frequency * 1_000_000 + count % frequency * 1_000_000 / frequency
}

#[defmt::global_logger]
struct Logger;

// SAFETY: acquire/release bracket every record with interrupts masked on the only CPU; nested
// records (exceptions while logging) are handled by closing the interrupted frame first.
unsafe impl defmt::Logger for Logger {
    #[unsafe(link_section = ".text.noprobe")]
    fn acquire() {
        let daif = cpu::mask_interrupts();
        if NESTING.fetch_add(1, Ordering::Acquire) == 0 {
            SAVED_DAIF.store(daif, Ordering::Relaxed);
        } else {
            write_console(&[0]);
        }
        // SAFETY: interrupts are masked and nesting is handled above, so the encoder has one user.
        unsafe { (*core::ptr::addr_of_mut!(ENCODER)).start_frame(write_console) }
    }

    unsafe fn flush() {}

    #[unsafe(link_section = ".text.noprobe")]
    unsafe fn release() {
        // SAFETY: called after acquire, with interrupts masked.
        unsafe { (*core::ptr::addr_of_mut!(ENCODER)).end_frame(write_console) };
        if NESTING.fetch_sub(1, Ordering::Release) == 1 {
            cpu::restore_interrupts(SAVED_DAIF.load(Ordering::Relaxed));
        }
    }

    #[unsafe(link_section = ".text.noprobe")]
    unsafe fn write(bytes: &[u8]) {
        // SAFETY: called between acquire and release, with interrupts masked.
        unsafe { (*core::ptr::addr_of_mut!(ENCODER)).write(bytes, write_console) }
    }
}
