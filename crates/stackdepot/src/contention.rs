//! Contention counters: failed CASes, lock spins and read-gate retries, for every depot.
//!
//! Counted only on the retry branches (a failed compare-and-swap, a failed lock attempt, a
//! reader that entered the gate as it flipped), never on a path that succeeds first time, so an
//! uncontended save costs what it did. One set for the whole crate: a bench reads the change
//! around its window, where one depot is in use. Shared atomics rather than per-CPU ones (the
//! crate knows no CPU): they are written only when contention already happened.

use core::sync::atomic::{AtomicU64, Ordering};
use spin::mutex::{SpinMutex, SpinMutexGuard};

use crate::access::increment;

static CAS_FAILURES: AtomicU64 = AtomicU64::new(0);
static LOCK_SPINS: AtomicU64 = AtomicU64::new(0);
static GATE_RETRIES: AtomicU64 = AtomicU64::new(0);

/// Contention events since boot, all depots.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Contention {
    /// Reference-count and dying-list compare-and-swaps that lost a race and retried.
    pub cas_failures: u64,
    /// Failed attempts to take a depot's lock (the miss path, `collect`).
    pub lock_spins: u64,
    /// Read-gate entries retried because eviction flipped the gate meanwhile.
    pub gate_retries: u64,
}

/// The counters now.
pub fn contention() -> Contention {
    Contention {
        cas_failures: CAS_FAILURES.load(Ordering::Relaxed),
        lock_spins: LOCK_SPINS.load(Ordering::Relaxed),
        gate_retries: GATE_RETRIES.load(Ordering::Relaxed),
    }
}

#[cold]
#[inline(never)]
#[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
pub(crate) fn cas_failed() {
    increment(&CAS_FAILURES);
}

#[cold]
#[inline(never)]
#[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
pub(crate) fn gate_retried() {
    increment(&GATE_RETRIES);
}

/// Takes `mutex`, counting each failed attempt.
#[inline]
pub(crate) fn lock<T>(mutex: &SpinMutex<T>) -> SpinMutexGuard<'_, T> {
    match mutex.try_lock() {
        Some(guard) => guard,
        None => lock_contended(mutex),
    }
}

#[cold]
#[inline(never)]
fn lock_contended<T>(mutex: &SpinMutex<T>) -> SpinMutexGuard<'_, T> {
    loop {
        increment(&LOCK_SPINS);
        core::hint::spin_loop();
        if let Some(guard) = mutex.try_lock() {
            return guard;
        }
    }
}
