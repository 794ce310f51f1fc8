//! The sweep on every CPU: a task pinned to each other CPU runs the workload in a loop while
//! CPU 0 arms and disarms each batch.
//!
//! Each batch is an epoch: CPU 0 registers its probes, then [`armed`] starts a new epoch, and
//! before disarming it waits ([`wait_for_passes`]) until every other CPU has completed a whole
//! pass that began in that epoch, so every probe the background pass executes was armed for
//! at least one pass on every CPU. A background pass whose results differ from that CPU's
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
/// Per CPU: passes whose results differed from its reference, and the epoch the last began in.
static MISMATCHES: [AtomicU64; CPUS] = [const { AtomicU64::new(0) }; CPUS];
static MISMATCH_EPOCH: [AtomicU64; CPUS] = [const { AtomicU64::new(0) }; CPUS];
/// Per CPU: completed passes (the figure the report prints).
static PASSES: [AtomicU64; CPUS] = [const { AtomicU64::new(0) }; CPUS];
/// Per CPU: set once its reference pass is done; cleared when its loop ends.
static READY: [AtomicBool; CPUS] = [const { AtomicBool::new(false) }; CPUS];

/// The longest wait of a background loop between passes (milliseconds).
const BREATH_LIMIT_MS: u64 = 50;

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
    while RUNNING.load(Ordering::Acquire) {
        watch_cpu0(cpu, &mut seen);
        let epoch = EPOCH.load(Ordering::Acquire);
        let pass_started = crate::drivers::timer::counter();
        let results = workload::background_pass();
        let pass_took = crate::drivers::timer::counter().wrapping_sub(pass_started);
        if results != reference {
            MISMATCH_EPOCH[cpu].store(epoch, Ordering::Relaxed);
            MISMATCHES[cpu].fetch_add(1, Ordering::Release);
        }
        PASSES[cpu].fetch_add(1, Ordering::Relaxed);
        COMPLETED_IN[cpu].store(epoch, Ordering::Release);
        crate::arch::cpu::send_event();
        // A breath with IRQs unmasked between passes, as long as the pass (at least 1 ms):
        // four CPUs allocating back to back keep the heap's lock contended, a CPU spinning for
        // it has IRQs masked, and on a host with fewer cores than QEMU has CPUs the holder's
        // thread is preempted by the spinners' (a grace period then waited over 100 ms).
        let breath_started = crate::drivers::timer::counter();
        let breath = pass_took.max(crate::drivers::timer::frequency() / 1000);
        let _ = crate::arch::cpu::wait_until(BREATH_LIMIT_MS, || {
            crate::drivers::timer::counter().wrapping_sub(breath_started) >= breath
        });
    }
    READY[cpu].store(false, Ordering::Release);
    crate::arch::cpu::send_event();
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
    let limit = match WATCHDOG_MS.load(Ordering::Relaxed) {
        0 => default_watchdog_ms(),
        set => set,
    };
    if silent_ms >= limit && !REPORTED.swap(true, Ordering::AcqRel) {
        defmt::error!("sweep hung: cpu {=usize} saw cpu 0 make no progress for {=u64} ms", cpu, silent_ms);
        panic!("sweep hung: cpu 0 made no progress for {} ms", silent_ms);
    }
}

/// A new batch is armed: returns its epoch.
pub fn armed() -> u64 {
    EPOCH.fetch_add(1, Ordering::AcqRel) + 1
}

/// Mismatches so far on each CPU (to compare after a batch).
pub fn mismatches() -> [u64; CPUS] {
    core::array::from_fn(|cpu| MISMATCHES[cpu].load(Ordering::Acquire))
}

/// The epoch the last mismatching pass on `cpu` began in.
pub fn mismatch_epoch(cpu: usize) -> u64 {
    MISMATCH_EPOCH[cpu].load(Ordering::Relaxed)
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
    for (cpu, id) in background.tasks.iter().enumerate() {
        let Some(id) = *id else { continue };
        task::join(id);
        if let Err(error) = task::cross_call::run_on_within(cpu, restart_tick, 0, PASS_TIMEOUT_MS) {
            defmt::error!("sweep: restarting the tick: {}", error);
        }
    }
}
