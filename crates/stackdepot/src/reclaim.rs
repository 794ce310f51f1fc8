//! When an evicted record may be reused: a two-phase reader gate (no RCU).
//!
//! Lock-free lookups run inside [`ReadGate::enter`]; the depot lock holder
//! unlinks records, and reuses one only after every lookup that could have
//! reached it has left. The gate has an epoch and two reader counters, one
//! per epoch parity:
//!
//! - A reader increments `readers[epoch & 1]`, issues a `SeqCst` fence,
//!   re-reads the epoch and retries if it moved; it decrements on leaving.
//! - The lock holder unlinks a batch of records, advances the epoch ([`flip`])
//!   and later ([`previous_phase_drained`]) issues a `SeqCst` fence and reads
//!   the counter of the previous parity. When that reads 0, the batch is free.
//!
//! Why that is safe: take a reader and the fences of both sides. If the
//! reader's fence comes first in the `SeqCst` order, the lock holder's read
//! of the counter sees the reader's increment (unless it has already left).
//! If the lock holder's fence comes first, the reader sees the new epoch (and
//! retries into the other counter) and sees the unlinks, so it cannot reach
//! the batch. A reader registered under the new epoch is waited for at the
//! next flip, which comes only after this batch is free.
//!
//! Why it makes progress (unlike a single counter, which a steady stream of
//! lookups can keep above zero forever): after a flip, new readers register
//! in the other counter, so the previous one drains as soon as the lookups
//! already in flight finish. Nothing ever waits: the depot retries on its next
//! miss, and meanwhile allocates fresh pool memory.
//!
//! [`flip`]: ReadGate::flip
//! [`previous_phase_drained`]: ReadGate::previous_phase_drained

use core::sync::atomic::{AtomicUsize, Ordering, fence};

pub(crate) struct ReadGate {
    epoch: AtomicUsize,
    readers: [AtomicUsize; 2],
}

/// Proof of being inside the gate; leaving is dropping it.
pub(crate) struct ReadGuard<'a> {
    counter: &'a AtomicUsize,
}

impl ReadGate {
    pub(crate) const fn new() -> Self {
        Self { epoch: AtomicUsize::new(0), readers: [AtomicUsize::new(0), AtomicUsize::new(0)] }
    }

    #[inline]
    pub(crate) fn enter(&self) -> ReadGuard<'_> {
        loop {
            let epoch = self.epoch.load(Ordering::Acquire);
            let counter = &self.readers[epoch & 1];
            counter.fetch_add(1, Ordering::Relaxed);
            fence(Ordering::SeqCst);
            if self.epoch.load(Ordering::Relaxed) == epoch {
                return ReadGuard { counter };
            }
            counter.fetch_sub(1, Ordering::Release);
        }
    }

    /// Starts a grace period for everything unlinked so far (lock held).
    pub(crate) fn flip(&self) {
        self.epoch.fetch_add(1, Ordering::Release);
    }

    /// Whether every reader that entered before the last flip has left (lock held).
    pub(crate) fn previous_phase_drained(&self) -> bool {
        fence(Ordering::SeqCst);
        let previous = self.epoch.load(Ordering::Relaxed).wrapping_sub(1) & 1;
        self.readers[previous].load(Ordering::Acquire) == 0
    }

    /// Readers currently inside (both phases), for tests and statistics.
    #[cfg(test)]
    pub(crate) fn readers(&self) -> usize {
        self.readers.iter().map(|counter| counter.load(Ordering::Relaxed)).sum()
    }
}

impl Drop for ReadGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        self.counter.fetch_sub(1, Ordering::Release);
    }
}
