//! The sweep on every CPU: a task pinned to each other CPU runs the workload in a loop while
//! CPU 0 arms and disarms each batch.
//!
//! Each batch is an epoch: CPU 0 registers its probes, then [`armed`] starts a new epoch, and
//! before disarming it waits ([`wait_for_passes`]) until every other CPU has completed a whole
//! pass that began in that epoch, so every probe the background pass executes was armed for
//! at least one pass on every CPU. Each other CPU runs one pass per epoch, begun when the epoch
//! opens, and is idle until the next (each kretprobe of the kretprobe pass opens one too, so
//! the other CPUs run the workload under it). A background pass whose results differ from that CPU's
//! unprobed reference is counted with the epoch it began in. The other CPUs take no tick
//! during the sweep (as CPU 0): their loop is the only thing they run besides IRQs.

use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::workload;
use crate::task::stacks::CPUS;
use crate::task::{self, CpuMask, TaskId};

/// Set while the background loops run.
static RUNNING: AtomicBool = AtomicBool::new(false);
/// The batch now armed (0: none yet).
static EPOCH: AtomicU64 = AtomicU64::new(0);
/// Per CPU: the epoch in which its last completed pass began (`u64::MAX`: none yet).
static COMPLETED_IN: [AtomicU64; CPUS] = [const { AtomicU64::new(u64::MAX) }; CPUS];
/// Per CPU: the epoch its last pass began in (`u64::MAX`: none yet).
static STARTED_IN: [AtomicU64; CPUS] = [const { AtomicU64::new(u64::MAX) }; CPUS];
/// Per CPU: passes whose results differed from its reference, and the epoch the last began in.
static MISMATCHES: [AtomicU64; CPUS] = [const { AtomicU64::new(0) }; CPUS];
static MISMATCH_EPOCH: [AtomicU64; CPUS] = [const { AtomicU64::new(0) }; CPUS];
/// Per CPU: completed passes (the figure the report prints).
static PASSES: [AtomicU64; CPUS] = [const { AtomicU64::new(0) }; CPUS];
/// Per CPU: set once its reference pass is done; cleared when its loop ends.
static READY: [AtomicBool; CPUS] = [const { AtomicBool::new(false) }; CPUS];

/// CPU 0's progress: bumped at every batch's start and end ([`heartbeat`]), with the counter
/// time of the last bump.
static HEARTBEAT: AtomicU64 = AtomicU64::new(0);
static HEARTBEAT_AT: AtomicU64 = AtomicU64::new(0);
/// Set by the one CPU that reports CPU 0 hung.
static REPORTED: AtomicBool = AtomicBool::new(false);

/// How long CPU 0 may make no progress before a background CPU reports it hung (milliseconds;
/// `sweep.watchdog=MS`; 0: [`default_watchdog_ms`]).
static WATCHDOG_MS: AtomicU64 = AtomicU64::new(0);

/// `sweep.watchdog=MS` (the hang check uses a short one: its runs hang on purpose).
pub fn set_watchdog(milliseconds: u64) {
    WATCHDOG_MS.store(milliseconds, Ordering::Relaxed);
}

/// The watchdog's limit (milliseconds): `sweep.watchdog`, or [`default_watchdog_ms`].
fn watchdog_limit_ms() -> u64 {
    match WATCHDOG_MS.load(Ordering::Relaxed) {
        0 => default_watchdog_ms(),
        set => set,
    }
}

/// The watchdog when `sweep.watchdog` is not given: a batch takes tens of milliseconds (about 80
/// in `full` on 4 CPUs), but CPU 0 may wait up to [`PASS_TIMEOUT_MS`] (times the patience factor,
/// 20 without icount) for a pass, and a grace period up to 1 s (times the factor), before it
/// reports a stuck CPU itself: the watchdog waits 5 s longer than the pass wait (at 2 s it fired
/// while CPU 0 waited on a slow CPU; an unscaled 5 s could fire without icount while a grace
/// period still legitimately waited).
fn default_watchdog_ms() -> u64 {
    crate::arch::cpu::patience_ms(PASS_TIMEOUT_MS) + 5000
}

/// How long CPU 0 waits for another CPU to finish a pass before it names that CPU as hung.
pub const PASS_TIMEOUT_MS: u64 = 2000;

/// The other CPUs' loops, while they run.
pub struct Background {
    tasks: [Option<TaskId>; CPUS],
}

fn stop_tick(_: u64) -> u64 {
    crate::drivers::timer::fire_in(1 << 60);
    0
}

fn restart_tick(_: u64) -> u64 {
    crate::drivers::timer::start_this_cpu();
    0
}

/// The CPUs other than the caller's that are online.
fn others() -> impl Iterator<Item = usize> {
    let me = task::this_cpu();
    (0..CPUS).filter(move |&cpu| cpu != me && task::cpus::is_online(cpu))
}

extern "C" fn background_loop(cpu: u64) {
    let cpu = cpu as usize;
    // Warm-up (the depot inserts this CPU's traces), then the reference.
    let _ = workload::background_pass();
    let reference = workload::background_pass();
    READY[cpu].store(true, Ordering::Release);
    crate::arch::cpu::send_event();
    let mut seen = (u64::MAX, 0);
    // The epoch this CPU's last pass began in: one whole pass per epoch is all CPU 0 waits for.
    let mut passed_in = u64::MAX;
    while RUNNING.load(Ordering::Acquire) {
        watch_cpu0(cpu, &mut seen);
        let epoch = EPOCH.load(Ordering::Acquire);
        if epoch == passed_in {
            idle_until_next_epoch(epoch);
            continue;
        }
        passed_in = epoch;
        STARTED_IN[cpu].store(epoch, Ordering::Release);
        crate::arch::cpu::send_event();
        let results = workload::background_pass();
        if results != reference {
            MISMATCH_EPOCH[cpu].store(epoch, Ordering::Relaxed);
            MISMATCHES[cpu].fetch_add(1, Ordering::Release);
        }
        PASSES[cpu].fetch_add(1, Ordering::Relaxed);
        COMPLETED_IN[cpu].store(epoch, Ordering::Release);
        crate::arch::cpu::send_event();
    }
    READY[cpu].store(false, Ordering::Release);
    crate::arch::cpu::send_event();
}

/// Sleeps in `wfi` (IRQs unmasked around it) until CPU 0 opens an epoch after `epoch` or ends
/// the loops; both send the wake-up SGI ([`armed`], [`stop`]). The passes CPU 0 does not wait
/// for, back to back (about ten per batch and CPU on 4 CPUs), contended for the heap's and the
/// run queue's locks with CPU 0's own pass, and a vCPU spinning in `wfe` (a yield under TCG)
/// took the host cores CPU 0's vCPU and the holds' answers needed: CPU 0's pass and its holds
/// were most of a batch's time. IRQs are masked from the check to the `wfi` (which a pending
/// IRQ still ends), so a wake-up sent in between is not lost. This CPU's timer, stopped for the
/// sweep, is armed for a quarter of the watchdog's limit meanwhile, so a CPU 0 that makes no
/// progress is still reported; it fires only if CPU 0 opens no epoch for that long.
fn idle_until_next_epoch(epoch: u64) {
    let limit = watchdog_limit_ms();
    crate::drivers::timer::fire_in(crate::drivers::timer::frequency() * limit / 4000);
    let daif = crate::arch::cpu::mask_interrupts();
    if EPOCH.load(Ordering::Acquire) == epoch && RUNNING.load(Ordering::Acquire) {
        crate::arch::cpu::wait_for_interrupt();
    }
    crate::arch::cpu::restore_interrupts(daif);
    // The tick stays stopped (`stop_tick`): the timer's handler re-arms it one tick on.
    crate::drivers::timer::fire_in(1 << 60);
}

/// Starts a looping task on every other online CPU (none on one CPU); returns when each has
/// its reference, or names the CPU that did not get there.
pub fn start() -> Result<Background, &'static str> {
    let mut background = Background { tasks: [None; CPUS] };
    heartbeat();
    RUNNING.store(true, Ordering::Release);
    for cpu in others() {
        // Not the default 100 ms: under QEMU with more CPUs than host cores a CPU answered later.
        if let Err(error) = task::cross_call::run_on_within(cpu, stop_tick, 0, PASS_TIMEOUT_MS) {
            defmt::error!("sweep: stopping the tick: {}", error);
            return Err("sweep: a CPU did not take the cross call");
        }
        let id = task::spawn_on(CpuMask::one(cpu), "sweep-cpu", background_loop, cpu as u64)
            .map_err(|_| "sweep: no task slot for a background loop")?;
        background.tasks[cpu] = Some(id);
    }
    let ready = || others().all(|cpu| READY[cpu].load(Ordering::Acquire));
    if !crate::arch::cpu::wait_until(PASS_TIMEOUT_MS, ready) {
        return Err("sweep: a background loop did not finish its reference pass");
    }
    Ok(background)
}

/// CPUs running a background loop.
pub fn count(background: &Background) -> usize {
    background.tasks.iter().flatten().count()
}

/// CPU 0 made progress (a batch started or ended).
pub fn heartbeat() {
    HEARTBEAT_AT.store(crate::drivers::timer::counter(), Ordering::Relaxed);
    HEARTBEAT.fetch_add(1, Ordering::Release);
}

/// The watchdog, on a background CPU between passes: CPU 0 stuck in one batch for
/// `WATCHDOG_MS` (a handler or slot that never returns, code under a probe that loops) ends
/// the run. The last `sweep batch:` line names the batch; xtask halves it to the probe.
fn watch_cpu0(cpu: usize, seen: &mut (u64, u64)) {
    let beat = HEARTBEAT.load(Ordering::Acquire);
    let now = crate::drivers::timer::counter();
    if beat != seen.0 {
        *seen = (beat, now);
        return;
    }
    let silent_ms = now.wrapping_sub(seen.1) * 1000 / crate::drivers::timer::frequency();
    let limit = watchdog_limit_ms();
    if silent_ms >= limit && !REPORTED.swap(true, Ordering::AcqRel) {
        defmt::error!("sweep hung: cpu {=usize} saw cpu 0 make no progress for {=u64} ms", cpu, silent_ms);
        panic!("sweep hung: cpu 0 made no progress for {} ms", silent_ms);
    }
}

/// A new batch is armed: returns its epoch, in which each other CPU starts one pass (woken
/// from its idle `wfi` by the wake-up SGI).
pub fn armed() -> u64 {
    let epoch = EPOCH.fetch_add(1, Ordering::AcqRel) + 1;
    wake_others();
    epoch
}

fn wake_others() {
    for cpu in others() {
        crate::drivers::interrupts::send_wake(cpu);
    }
}

/// Mismatches so far on each CPU (to compare after a batch).
pub fn mismatches() -> [u64; CPUS] {
    core::array::from_fn(|cpu| MISMATCHES[cpu].load(Ordering::Acquire))
}

/// The epoch the last mismatching pass on `cpu` began in.
pub fn mismatch_epoch(cpu: usize) -> u64 {
    MISMATCH_EPOCH[cpu].load(Ordering::Relaxed)
}

/// Waits until every background CPU has begun a pass in `epoch` or later: the wake-up SGI that
/// ends its idle reschedules it at the IRQ's end, under the run queue's lock, and CPU 0's pass,
/// begun meanwhile, found that lock taken in about one batch in five (on 4 CPUs) rather than
/// one in twenty-five, and those batches' CPU 0 counts are not compared (`Count::waited`). Err
/// names the first CPU that did not within [`PASS_TIMEOUT_MS`].
pub fn wait_for_starts(background: &Background, epoch: u64) -> Result<(), usize> {
    let started = |cpu: usize| {
        let started = STARTED_IN[cpu].load(Ordering::Acquire);
        started != u64::MAX && started >= epoch
    };
    let running = || background.tasks.iter().enumerate().filter(|(_, id)| id.is_some()).map(|(cpu, _)| cpu);
    if crate::arch::cpu::wait_until(PASS_TIMEOUT_MS, || running().all(started)) {
        Ok(())
    } else {
        Err(running().find(|&cpu| !started(cpu)).unwrap_or(usize::MAX))
    }
}

/// Waits until every background CPU completed a pass that began in `epoch` or later; Err names
/// the first that did not within [`PASS_TIMEOUT_MS`] (it hung, or is stuck in a probe).
pub fn wait_for_passes(background: &Background, epoch: u64) -> Result<(), usize> {
    let done = |cpu: usize| {
        let completed = COMPLETED_IN[cpu].load(Ordering::Acquire);
        completed != u64::MAX && completed >= epoch
    };
    let running = || background.tasks.iter().enumerate().filter(|(_, id)| id.is_some()).map(|(cpu, _)| cpu);
    if crate::arch::cpu::wait_until(PASS_TIMEOUT_MS, || running().all(done)) {
        Ok(())
    } else {
        Err(running().find(|&cpu| !done(cpu)).unwrap_or(usize::MAX))
    }
}

/// Completed background passes, summed over CPUs.
pub fn passes() -> u64 {
    PASSES.iter().map(|passes| passes.load(Ordering::Relaxed)).sum()
}

/// Ends the loops, waits for their tasks, restarts the other CPUs' ticks.
pub fn stop(background: Background) {
    RUNNING.store(false, Ordering::Release);
    wake_others();
    for (cpu, id) in background.tasks.iter().enumerate() {
        let Some(id) = *id else { continue };
        task::join(id);
        if let Err(error) = task::cross_call::run_on_within(cpu, restart_tick, 0, PASS_TIMEOUT_MS) {
            defmt::error!("sweep: restarting the tick: {}", error);
        }
    }
}
