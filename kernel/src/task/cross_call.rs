//! Cross-CPU calls: run a function on another CPU and wait for its result, with a timeout.
//!
//! Each CPU has one mailbox (function, argument, result and two sequence numbers). `run_on`
//! takes the target's sender lock, posts the call with a Release store of `posted`, sends the
//! wake-up SGI and waits in `wfe` (bounded by the timer's event stream) until the target's
//! `served` reaches the posted sequence. The target runs [`serve`] when it takes the wake-up
//! SGI (today its idle loop; later its IRQ handler), runs the function and publishes the result
//! with a Release store of `served`, then `sev`. A call that does not finish in time is reported
//! with the CPU's index, and the mailbox stays owned by that call until it finishes (`Busy`).

use super::stacks::CPUS;
use crate::arch::{percpu, smp};
use crate::sync::IrqSpinLock;
use core::fmt;
use core::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// How long `run_on` waits for a call by default, in milliseconds of counter time.
pub const TIMEOUT_MS: u64 = 100;

/// Why a cross-CPU call did not run.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum CrossCallError {
    /// No such CPU in this kernel (index >= `CPUS`).
    NoSuchCpu(usize),
    /// The CPU is not online (never started, or failed to come up).
    Offline(usize),
    /// An earlier call to this CPU timed out and has not finished yet.
    Busy(usize),
    /// The CPU did not finish the call within the timeout (milliseconds).
    Timeout { cpu: usize, milliseconds: u64 },
}

impl fmt::Display for CrossCallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::NoSuchCpu(cpu) => write!(f, "cpu {cpu}: no such CPU (at most {CPUS})"),
            Self::Offline(cpu) => write!(f, "cpu {cpu}: not online"),
            Self::Busy(cpu) => write!(f, "cpu {cpu}: still running an earlier call that timed out"),
            Self::Timeout { cpu, milliseconds } => write!(f, "cpu {cpu}: call not finished within {milliseconds} ms"),
        }
    }
}

impl defmt::Format for CrossCallError {
    fn format(&self, f: defmt::Formatter) {
        defmt::write!(f, "{}", defmt::Display2Format(self));
    }
}

/// One CPU's mailbox. `posted` and `served` are call sequence numbers: a call is pending while
/// they differ. Only the sender (under `SENDERS[cpu]`) writes `function`, `argument` and
/// `posted`; only the target CPU writes `result` and `served`.
struct Mailbox {
    function: AtomicUsize,
    argument: AtomicU64,
    result: AtomicU64,
    posted: AtomicU64,
    served: AtomicU64,
    /// Set while the target runs a call: a nested `serve` (an IRQ during a call) returns at once.
    serving: AtomicBool,
}

static MAILBOXES: [Mailbox; CPUS] = [const {
    Mailbox {
        function: AtomicUsize::new(0),
        argument: AtomicU64::new(0),
        result: AtomicU64::new(0),
        posted: AtomicU64::new(0),
        served: AtomicU64::new(0),
        serving: AtomicBool::new(false),
    }
}; CPUS];

/// One sender at a time per target CPU (IRQ-safe: a sender may be an IRQ handler).
static SENDERS: [IrqSpinLock<()>; CPUS] = [const { IrqSpinLock::new(()) }; CPUS];

/// Runs `function(argument)` on CPU `cpu` and returns its result, waiting at most
/// [`TIMEOUT_MS`]. On the calling CPU itself the function runs directly.
pub fn run_on(cpu: usize, function: fn(u64) -> u64, argument: u64) -> Result<u64, CrossCallError> {
    run_on_within(cpu, function, argument, TIMEOUT_MS)
}

/// [`run_on`] with a timeout of `milliseconds`.
pub fn run_on_within(
    cpu: usize,
    function: fn(u64) -> u64,
    argument: u64,
    milliseconds: u64,
) -> Result<u64, CrossCallError> {
    if cpu >= CPUS {
        return Err(CrossCallError::NoSuchCpu(cpu));
    }
    if cpu == percpu::this_cpu_index() {
        return Ok(function(argument));
    }
    if !smp::is_online(cpu) {
        return Err(CrossCallError::Offline(cpu));
    }
    let mailbox = &MAILBOXES[cpu];
    let _sender = SENDERS[cpu].lock();
    let served = mailbox.served.load(Ordering::Acquire);
    if mailbox.posted.load(Ordering::Relaxed) != served {
        return Err(CrossCallError::Busy(cpu));
    }
    let sequence = served.wrapping_add(1);
    mailbox.function.store(function as usize, Ordering::Relaxed);
    mailbox.argument.store(argument, Ordering::Relaxed);
    mailbox.posted.store(sequence, Ordering::Release);
    crate::drivers::interrupts::send_wake(cpu);
    let done = crate::arch::cpu::wait_until(milliseconds, || mailbox.served.load(Ordering::Acquire) == sequence);
    if !done {
        return Err(CrossCallError::Timeout { cpu, milliseconds: crate::arch::cpu::patience_ms(milliseconds) });
    }
    Ok(mailbox.result.load(Ordering::Relaxed))
}

/// Whether CPU `cpu` has no call pending (an earlier timed-out call has finished).
pub fn is_idle(cpu: usize) -> bool {
    cpu < CPUS && MAILBOXES[cpu].posted.load(Ordering::Acquire) == MAILBOXES[cpu].served.load(Ordering::Acquire)
}

/// Runs the call posted to this CPU, if any, and wakes its sender. Called by this CPU when it
/// takes the wake-up SGI, with IRQs masked (idle loop or IRQ handler): no lock, no allocation.
pub fn serve() {
    let mailbox = &MAILBOXES[percpu::this_cpu_index()];
    let posted = mailbox.posted.load(Ordering::Acquire);
    if posted == mailbox.served.load(Ordering::Relaxed) || mailbox.serving.swap(true, Ordering::Acquire) {
        return;
    }
    let address = mailbox.function.load(Ordering::Relaxed);
    // SAFETY: `function` holds a `fn(u64) -> u64` stored by `run_on_within` before its Release
    // store of `posted`, which the Acquire load above observed.
    let function: fn(u64) -> u64 = unsafe { core::mem::transmute::<usize, fn(u64) -> u64>(address) };
    let result = function(mailbox.argument.load(Ordering::Relaxed));
    mailbox.result.store(result, Ordering::Relaxed);
    mailbox.served.store(posted, Ordering::Release);
    mailbox.serving.store(false, Ordering::Relaxed);
    // SAFETY: wakes the sender waiting in `wfe`; the `dsb` makes `served` visible first.
    unsafe { core::arch::asm!("dsb ish", "sev", options(nomem, nostack, preserves_flags)) };
}
