//! Contention counters: failed CASes, lock spins and read-gate waits, for every depot.
//!
//! Counted only where contention already happened, never on a path that succeeds first time:
//! a failed compare-and-swap in `put`, each spin of a depot's lock (its relax strategy), and
//! each reclaim pass that finds readers of the previous phase still inside the read gate (the
//! unlinked records wait for a later pass). The lookup-hit path (`save` up to a hit, with its
//! reference CAS and read-gate entry) is left as it was: a counter there lengthened the
//! permanent depot's hit by 2 to 3 instructions (icount), so a hit's reference CAS failures
//! are not counted, only `put`'s. One set for the whole crate (it knows no CPU): a bench reads
//! the change around its window, where one depot is in use.

use core::sync::atomic::{AtomicU64, Ordering};

use crate::access::increment;

static CAS_FAILURES: AtomicU64 = AtomicU64::new(0);
static LOCK_SPINS: AtomicU64 = AtomicU64::new(0);
static GATE_WAITS: AtomicU64 = AtomicU64::new(0);

/// Contention events since boot, all depots.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Contention {
    /// `put`'s reference-count and dying-list compare-and-swaps that lost a race and retried.
    pub cas_failures: u64,
    /// Spins waiting for a depot's lock (the miss path, `collect`, `add_pool`).
    pub lock_spins: u64,
    /// Reclaim passes that found readers still inside the read gate's previous phase.
    pub gate_waits: u64,
}

/// The counters now.
pub fn contention() -> Contention {
    Contention {
        cas_failures: CAS_FAILURES.load(Ordering::Relaxed),
        lock_spins: LOCK_SPINS.load(Ordering::Relaxed),
        gate_waits: GATE_WAITS.load(Ordering::Relaxed),
    }
}

#[inline(always)]
pub(crate) fn cas_failed() {
    increment(&CAS_FAILURES);
}

#[inline(always)]
pub(crate) fn gate_waited() {
    increment(&GATE_WAITS);
}

/// The depot lock's relax strategy: `spin`'s own, counted. It runs only while the lock is
/// held by someone else, so an uncontended lock is exactly `SpinMutex::lock`.
pub(crate) struct CountedSpin;

impl spin::RelaxStrategy for CountedSpin {
    #[inline(always)]
    fn relax() {
        increment(&LOCK_SPINS);
        core::hint::spin_loop();
    }
}
