//! The defmt global logger: rzCOBS-framed, timestamped defmt records on the console PL011.
//!
//! xtask decodes the stream with the kernel ELF. A record begun while another is being written
//! (an exception or panic inside a log call) first closes the interrupted frame with a 0x00
//! delimiter, so the decoder drops that one record and resynchronises.
//!
//! One console for every CPU: a CPU owns it for a whole record (`OWNER`), so records (lines)
//! from different CPUs never interleave; the others wait with `wfe`, woken by the owner's `sev`.
//! A CPU that waits longer than `TAKEOVER_MS` (the owner stopped or hung inside a record, e.g. it
//! panicked there and was halted) takes the console over and cuts the stuck record with 0x00:
//! no CPU can deadlock on a CPU that will never release it.

use crate::arch::{cpu, percpu};
use crate::drivers::pl011::Pl011;
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// A raw `spin::Mutex`, not an `IrqSpinLock`: only the console's owner CPU takes it, inside a
/// record (IRQs already masked by `acquire`), and a nested record must be able to force it
/// (`write_console`), which an `IrqSpinLock` does not offer.
static CONSOLE: spin::Mutex<Option<Pl011>> = spin::Mutex::new(None);
/// The CPU writing a record (its index + 1; 0: none).
static OWNER: AtomicU32 = AtomicU32::new(0);
/// Records open on the owner CPU (more than 1: an exception or panic inside a record).
static NESTING: AtomicU32 = AtomicU32::new(0);
/// How long a CPU waits for another's record before taking the console over. A record is a line
/// of at most a few hundred bytes: ~30 ms at 115200 baud on a real board.
const TAKEOVER_MS: u64 = 200;
/// A `static mut`, not a lock: a record begun inside an exception taken while another record is
/// being written (a fault or BRK in a log call, a panic) must still log, so `acquire` cannot wait
/// for the interrupted record to release anything. Its only users are `acquire`/`write`/`release`,
/// with interrupts masked on the CPU that owns the console; the nested record closes the
/// interrupted frame first.
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
    // Only the console's owner CPU writes, with interrupts masked, so this lock is never contended;
    // a nested record (exception during logging) or a takeover forces it rather than deadlocking.
    let mut guard = CONSOLE.try_lock();
    if guard.is_none() {
        // SAFETY: the holder is the record this one interrupted on the same CPU (it cannot run
        // until this one returns) or a CPU that stopped inside a record (`take_console`).
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

/// Makes CPU `me` (index + 1) the console's owner: at once when free, else after the owner's
/// record (`wfe` until its `sev`), or after `TAKEOVER_MS` whatever the owner does.
#[unsafe(link_section = ".text.noprobe")]
fn take_console(me: u32) {
    if OWNER.compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed).is_ok() {
        return;
    }
    let start = crate::drivers::timer::counter();
    let patience = crate::drivers::timer::frequency() * crate::arch::cpu::patience_ms(TAKEOVER_MS) / 1000;
    let saved = cpu::event_stream_on();
    loop {
        // SAFETY: waits for an event: the owner's `sev` after its release store (one sent between
        // the failed exchange and here stays in the event register: no lost wake-up), or the
        // event stream, so that a stuck owner is noticed.
        unsafe { core::arch::asm!("wfe", options(nomem, nostack, preserves_flags)) };
        if OWNER.compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed).is_ok() {
            break;
        }
        if crate::drivers::timer::counter().wrapping_sub(start) > patience {
            OWNER.store(me, Ordering::Relaxed);
            // SAFETY: orders the takeover before this CPU's console writes.
            unsafe { core::arch::asm!("dmb ish", options(nostack, preserves_flags)) };
            write_console(&[0]);
            break;
        }
    }
    cpu::event_stream_restore(saved);
}

// SAFETY: acquire/release bracket every record with interrupts masked, on the CPU that owns the
// console (`OWNER`); nested records (exceptions while logging) are handled by closing the
// interrupted frame first.
unsafe impl defmt::Logger for Logger {
    #[unsafe(link_section = ".text.noprobe")]
    fn acquire() {
        // Not an `IrqMask`: the record ends in `release`, another of defmt's calls, so the
        // outermost record's DAIF waits in `SAVED_DAIF`.
        let daif = cpu::mask_interrupts();
        let me = percpu::this_cpu_index() as u32 + 1;
        if OWNER.load(Ordering::Relaxed) == me {
            NESTING.fetch_add(1, Ordering::Relaxed);
            write_console(&[0]);
        } else {
            take_console(me);
            NESTING.store(1, Ordering::Relaxed);
            SAVED_DAIF.store(daif, Ordering::Relaxed);
        }
        // SAFETY: this CPU owns the console with interrupts masked and nesting is handled above,
        // so the encoder has one user.
        unsafe { (*core::ptr::addr_of_mut!(ENCODER)).start_frame(write_console) }
    }

    unsafe fn flush() {}

    #[unsafe(link_section = ".text.noprobe")]
    unsafe fn release() {
        // SAFETY: called after acquire, with interrupts masked.
        unsafe { (*core::ptr::addr_of_mut!(ENCODER)).end_frame(write_console) };
        if NESTING.fetch_sub(1, Ordering::Relaxed) == 1 {
            let daif = SAVED_DAIF.load(Ordering::Relaxed);
            OWNER.store(0, Ordering::Release);
            // SAFETY: wakes CPUs waiting in `take_console`; `dsb` makes the release store visible
            // before the event.
            unsafe { core::arch::asm!("dsb ish", "sev", options(nostack, preserves_flags)) };
            cpu::restore_interrupts(daif); // raw mask pair: see above
        }
    }

    #[unsafe(link_section = ".text.noprobe")]
    unsafe fn write(bytes: &[u8]) {
        // SAFETY: called between acquire and release, with interrupts masked.
        unsafe { (*core::ptr::addr_of_mut!(ENCODER)).write(bytes, write_console) }
    }
}
