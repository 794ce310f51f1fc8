//! Where the sweep's time goes: the counter time CPU 0 spends in each phase of a batch and of
//! the kretprobe pass, summed over the run and printed at its end (`sweep time:`), so that a
//! change meant to make the sweep cheaper is judged by the phase it shortens.

use core::sync::atomic::{AtomicU64, Ordering};

/// A phase of CPU 0's work.
#[derive(Clone, Copy)]
pub enum Phase {
    /// Arming a batch: `replace_all`, one hold of the other CPUs that also disarms the batch
    /// before (and a grace period after its detours).
    Register,
    /// CPU 0's own counted pass of the workload.
    Pass,
    /// Waiting for every other CPU to complete a pass begun while the batch was armed.
    Waiting,
    /// Disarming a batch alone (before a kretprobe pass, at the end): `unregister_all`, one
    /// hold and (with a detour) one grace period.
    Unregister,
    /// The batch's checks: words, slot area, results, new stacks.
    Checks,
    /// The kretprobe pass: registering one kretprobe, or changing its entry probe's method (one
    /// hold).
    KretprobeRegister,
    /// The kretprobe pass: CPU 0's pass of the workload under it.
    KretprobePass,
    /// The kretprobe pass: unregistering it after the last method and the grace period after.
    KretprobeUnregister,
    /// Finding the random sets' members (before the other CPUs loop).
    FindSets,
}

const PHASES: usize = 9;

static SPENT: [AtomicU64; PHASES] = [const { AtomicU64::new(0) }; PHASES];

/// A running clock: each [`Clock::lap`] charges the time since the last to a phase.
pub struct Clock(u64);

impl Clock {
    pub fn start() -> Self {
        Clock(crate::drivers::timer::counter())
    }

    /// Charges the time since the last lap (or the start) to `phase`.
    pub fn lap(&mut self, phase: Phase) {
        let now = crate::drivers::timer::counter();
        SPENT[phase as usize].fetch_add(now.wrapping_sub(self.0), Ordering::Relaxed);
        self.0 = now;
    }
}

fn milliseconds(phase: Phase) -> u64 {
    SPENT[phase as usize].load(Ordering::Relaxed) * 1000 / crate::drivers::timer::frequency()
}

/// Prints the run's phases (milliseconds of CPU 0's time, summed over the run).
pub fn report(batches: u64) {
    defmt::info!(
        "sweep time: {=u64} batches: register {=u64} ms, cpu 0 pass {=u64} ms, waiting for the other cpus {=u64} ms, unregister {=u64} ms, checks {=u64} ms",
        batches,
        milliseconds(Phase::Register),
        milliseconds(Phase::Pass),
        milliseconds(Phase::Waiting),
        milliseconds(Phase::Unregister),
        milliseconds(Phase::Checks)
    );
    defmt::info!(
        "sweep time: kretprobe pass: register {=u64} ms, cpu 0 pass {=u64} ms, unregister and grace period {=u64} ms; finding the random sets {=u64} ms",
        milliseconds(Phase::KretprobeRegister),
        milliseconds(Phase::KretprobePass),
        milliseconds(Phase::KretprobeUnregister),
        milliseconds(Phase::FindSets)
    );
}
