//! Cross-CPU calls that cross: every CPU calls the next one at the same moment (a ring), with
//! IRQs unmasked (tasks) and masked (as an IRQ handler sends), so each sender waits while a call
//! is posted to its own CPU.

use super::{Context, ONE_CPU, Outcome, Verdict, check, check_eq, cross_call_echo};
use crate::arch::cpu;
use crate::sync::IrqMask;
use crate::task::cross_call::{self, CrossCallError};
use crate::task::{self, CpuMask, State, cpus, stacks::CPUS};
use crate::tests::{Failure, fail};
use core::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// Rounds per run; odd rounds send with IRQs masked.
const ROUNDS: u64 = 64;
/// The wait of each call in a ring round (a correct ring finishes long before).
const RING_MS: u64 = 100;
/// The wait of each call in the round without serving (each must time out).
const WRONG_MS: u64 = 5;

/// The CPUs in the ring, and how many reached the barrier so far (all rounds).
static RING: AtomicUsize = AtomicUsize::new(0);
static ARRIVED: AtomicUsize = AtomicUsize::new(0);
/// The round's call timeout, and whether every round is masked.
static TIMEOUT_MS: AtomicU64 = AtomicU64::new(RING_MS);
static ALL_MASKED: AtomicBool = AtomicBool::new(false);
/// Calls that returned a wrong value or an error, and the timeouts among them.
static WRONG: AtomicU64 = AtomicU64::new(0);
static TIMEOUTS: AtomicU64 = AtomicU64::new(0);
/// CPUs waiting for a call now, and the most at once (the overlap witness).
static CALLING: AtomicUsize = AtomicUsize::new(0);
static MOST_CALLING: AtomicUsize = AtomicUsize::new(0);

/// All ring CPUs reach barrier number `barrier` (counted from 1 over the whole run) together.
fn barrier(barrier: usize) {
    let target = barrier * RING.load(Ordering::Relaxed);
    if ARRIVED.fetch_add(1, Ordering::AcqRel) + 1 == target {
        cpu::send_event();
    }
    while ARRIVED.load(Ordering::Acquire) < target {
        cpu::wait_for_event();
    }
}

/// One ring member, pinned to CPU `cpu`: each round, after the barrier, calls the next CPU.
extern "C" fn ring_member(cpu: u64) {
    let cpu = cpu as usize;
    let ring = RING.load(Ordering::Relaxed);
    let all_masked = ALL_MASKED.load(Ordering::Relaxed);
    let rounds = if all_masked { 1 } else { ROUNDS };
    let milliseconds = TIMEOUT_MS.load(Ordering::Relaxed);
    for round in 0..rounds {
        // Masked before the barrier: no CPU of a masked round takes the wake-up SGI until its
        // own call is over.
        let mask = (all_masked || round % 2 == 1).then(IrqMask::new);
        barrier(2 * round as usize + 1);
        let argument = round * 100 + cpu as u64;
        let target = (cpu + 1) % ring;
        let inside = CALLING.fetch_add(1, Ordering::AcqRel) + 1;
        MOST_CALLING.fetch_max(inside, Ordering::Relaxed);
        let result = cross_call::run_on_within(target, cross_call_echo, argument, milliseconds);
        CALLING.fetch_sub(1, Ordering::AcqRel);
        // Every call of a round is over before any CPU masks IRQs for the next (a CPU waiting
        // masked at the barrier answers no call). Without serving, unmasked only then: a CPU
        // unmasking early would answer a call still waiting for it.
        if all_masked {
            barrier(2 * round as usize + 2);
            drop(mask);
        } else {
            drop(mask);
            barrier(2 * round as usize + 2);
        }
        if result != Ok(argument * 7 + target as u64) {
            WRONG.fetch_add(1, Ordering::Relaxed);
        }
        if matches!(result, Err(CrossCallError::Timeout { .. })) {
            TIMEOUTS.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Runs the ring on every online CPU; returns (wrong calls, timeouts, most CPUs waiting at once).
fn run_ring(all_masked: bool, milliseconds: u64) -> Result<(u64, u64, usize), Failure> {
    let ring = cpus::online();
    RING.store(ring, Ordering::Relaxed);
    ARRIVED.store(0, Ordering::Relaxed);
    ALL_MASKED.store(all_masked, Ordering::Relaxed);
    TIMEOUT_MS.store(milliseconds, Ordering::Relaxed);
    WRONG.store(0, Ordering::Relaxed);
    TIMEOUTS.store(0, Ordering::Relaxed);
    MOST_CALLING.store(0, Ordering::Relaxed);
    let mut ids = [None; CPUS];
    // Every member spawned before this task can be preempted: a member on this CPU run at a tick
    // between the spawns masks IRQs at its first barrier, which then waits for members this task
    // has not spawned yet (the all-masked run hung the 4-CPU run without icount in CI).
    let spawning = IrqMask::new();
    for (cpu, id) in ids.iter_mut().enumerate().take(ring) {
        *id =
            Some(task::spawn_on(CpuMask::one(cpu), "ring-member", ring_member, cpu as u64).map_err(|_| fail("spawn"))?);
    }
    drop(spawning);
    for id in ids.iter().take(ring) {
        check!(task::join(id.expect("spawned above")) == State::Exited);
    }
    Ok((WRONG.load(Ordering::Relaxed), TIMEOUTS.load(Ordering::Relaxed), MOST_CALLING.load(Ordering::Relaxed)))
}

/// Every online CPU calls the next one at the same moment, 64 rounds, every other round with
/// IRQs masked: every call returns its right value, none times out. Each sender's own CPU has a
/// call posted while it waits: a masked sender serves it from its wait (with a lock held across
/// the wait and IRQs masked, every masked round deadlocked until the calls timed out). The
/// fault that stops the serving brings that back and must make a masked round's calls
/// time out. Overlap witness: the most CPUs waiting for a call at once, at least 2 (a masked
/// round holds every CPU in its wait until the ring completes).
pub(super) fn smp_cross_calls_to_each_other_at_once(_: &Context) -> Outcome {
    if cpus::online() < 2 {
        return Ok(Verdict::Skipped(ONE_CPU));
    }
    crate::inject::set(crate::inject::Fault::CrossCallWaitWithoutServing, true);
    let wrong_way = run_ring(true, WRONG_MS);
    crate::inject::set(crate::inject::Fault::CrossCallWaitWithoutServing, false);
    let (wrong, timeouts, _) = wrong_way?;
    defmt::info!("  without serving while masked: {=u64} of {=usize} calls timed out", timeouts, cpus::online());
    check_eq!(timeouts, cpus::online() as u64);
    check_eq!(wrong, timeouts);
    // The timed-out calls run once their CPUs unmask IRQs; the mailboxes are free after.
    check!(cpu::wait_until(RING_MS, || (0..cpus::online()).all(cross_call::is_idle)));
    let (wrong, timeouts, most) = run_ring(false, RING_MS)?;
    defmt::info!(
        "  overlap witness: at most {=usize} of {=usize} CPUs waiting for a call at once",
        most,
        cpus::online()
    );
    check_eq!(timeouts, 0);
    check_eq!(wrong, 0);
    check!(most >= 2);
    Ok(Verdict::Passed)
}
