//! Cross-CPU calls: run a function on another CPU and wait for its result, with a timeout.
//!
//! Each CPU has one mailbox (function, argument, result and two sequence numbers). `run_on`
//! takes the target's mailbox (one sender at a time), posts the call with a Release store of
//! `posted`, sends the wake-up SGI and waits in `wfe` (bounded by the timer's event stream) until
//! the target's `served` reaches the posted sequence. The target runs [`serve`] when it takes the
//! wake-up SGI, runs the function and publishes the result with a Release store of `served`,
//! then `sev`. A call that does not finish in time is reported with the CPU's index, and the
//! mailbox stays owned by that call until it finishes (`Busy`).
//!
//! The sender waits with IRQs as its caller had them, as Linux's `smp_call_function_single` does:
//! a task waits with IRQs unmasked, so this CPU still answers the others' wake-ups meanwhile (their
//! calls, text-patch holds, grace periods, a panic's stop). A caller with IRQs masked (an IRQ
//! handler) serves the calls posted to its own CPU while it waits, so two CPUs calling each other
//! at once both finish instead of both timing out (with a lock held across the wait and IRQs
//! masked, they did). A served function therefore runs either in the wake-up SGI or in such a
//! masked wait; it must not make cross-CPU calls itself.

use super::stacks::CPUS;
use crate::arch::{percpu, smp};
use crate::inject::{self, Fault};
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
    /// An earlier call to this CPU timed out and has not finished yet, another sender kept its
    /// mailbox for the whole timeout, or this CPU's own interrupted context owns it.
    Busy(usize),
    /// The CPU did not finish the call within the timeout (milliseconds).
    Timeout { cpu: usize, milliseconds: u64 },
}

impl fmt::Display for CrossCallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::NoSuchCpu(cpu) => write!(f, "cpu {cpu}: no such CPU (at most {CPUS})"),
            Self::Offline(cpu) => write!(f, "cpu {cpu}: not online"),
            Self::Busy(cpu) => write!(f, "cpu {cpu}: its mailbox is still taken by an earlier call"),
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

/// Per target CPU: the CPU (index + 1) whose sender owns its mailbox, from taking it until its
/// call is served or timed out; 0 when free.
static SENDERS: [AtomicUsize; CPUS] = [const { AtomicUsize::new(0) }; CPUS];

/// Runs `function(argument)` on CPU `cpu` and returns its result, waiting at most
/// [`TIMEOUT_MS`]. On the calling CPU itself the function runs directly.
pub fn run_on(cpu: usize, function: fn(u64) -> u64, argument: u64) -> Result<u64, CrossCallError> {
    run_on_within(cpu, function, argument, TIMEOUT_MS)
}

/// [`run_on`] with a timeout of `milliseconds` (times the patience factor), for the call and,
/// before it, for taking the mailbox from another sender.
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
    let masked = crate::arch::cpu::interrupts_masked();
    take_mailbox(cpu, masked, milliseconds)?;
    let outcome = post_and_wait(cpu, function, argument, masked, milliseconds);
    SENDERS[cpu].store(0, Ordering::Release);
    crate::arch::cpu::send_event();
    outcome
}

/// Takes CPU `cpu`'s mailbox for this sender, waiting up to `milliseconds` while another sender
/// has it. Busy at once when IRQs are masked and this CPU's sender owns it: that is the context
/// this one interrupted (or a task preempted here), which cannot go on before this one returns.
fn take_mailbox(cpu: usize, masked: bool, milliseconds: u64) -> Result<(), CrossCallError> {
    let me = percpu::this_cpu_index() + 1;
    let take = || SENDERS[cpu].compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed).is_ok();
    if take() {
        return Ok(());
    }
    if masked && SENDERS[cpu].load(Ordering::Relaxed) == me {
        return Err(CrossCallError::Busy(cpu));
    }
    let taken = crate::arch::cpu::wait_until(milliseconds, || {
        serve_while_masked(masked);
        take()
    });
    if taken { Ok(()) } else { Err(CrossCallError::Busy(cpu)) }
}

/// Posts the call into CPU `cpu`'s mailbox (owned by this sender) and waits for its result.
fn post_and_wait(
    cpu: usize,
    function: fn(u64) -> u64,
    argument: u64,
    masked: bool,
    milliseconds: u64,
) -> Result<u64, CrossCallError> {
    let mailbox = &MAILBOXES[cpu];
    let served = mailbox.served.load(Ordering::Acquire);
    if mailbox.posted.load(Ordering::Relaxed) != served {
        return Err(CrossCallError::Busy(cpu));
    }
    let sequence = served.wrapping_add(1);
    mailbox.function.store(function as usize, Ordering::Relaxed);
    mailbox.argument.store(argument, Ordering::Relaxed);
    mailbox.posted.store(sequence, Ordering::Release);
    crate::drivers::interrupts::send_wake(cpu);
    let done = crate::arch::cpu::wait_until(milliseconds, || {
        serve_while_masked(masked);
        mailbox.served.load(Ordering::Acquire) == sequence
    });
    if !done {
        return Err(CrossCallError::Timeout { cpu, milliseconds: crate::arch::cpu::patience_ms(milliseconds) });
    }
    Ok(mailbox.result.load(Ordering::Relaxed))
}

/// A sender waiting with IRQs masked answers the calls posted to its own CPU (it would take no
/// wake-up SGI until it returns). `inject::Fault::CrossCallWaitWithoutServing` turns this off,
/// and two CPUs calling each other with IRQs masked time out (the test shows it).
#[inline(always)]
fn serve_while_masked(masked: bool) {
    if masked && !inject::on(Fault::CrossCallWaitWithoutServing) {
        serve();
    }
}

/// Whether CPU `cpu` has no call pending (an earlier timed-out call has finished).
pub fn is_idle(cpu: usize) -> bool {
    cpu < CPUS && MAILBOXES[cpu].posted.load(Ordering::Acquire) == MAILBOXES[cpu].served.load(Ordering::Acquire)
}

/// Runs the call posted to this CPU, if any, and wakes its sender. Called by this CPU with IRQs
/// masked when it takes the wake-up SGI, or while it waits for a call of its own with IRQs
/// masked: no lock, no allocation.
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
