//! The contention counters move when contention happens (a held lock, a reader in the gate).
//! Other tests run in parallel and share the counters, so each check is "rose by at least".

use super::{pool, trace};
use crate::contention::{CountedSpin, contention};
use crate::{MAX_FRAMES, StackDepot};
use spin::mutex::SpinMutex;
use std::time::{Duration, Instant};

#[test]
fn a_waiter_on_a_held_lock_is_counted() {
    let mutex: &'static SpinMutex<u32, CountedSpin> = Box::leak(Box::new(SpinMutex::new(0)));
    let guard = mutex.lock();
    let before = contention().lock_spins;
    let waiter = std::thread::spawn(move || *mutex.lock() += 1);
    let deadline = Instant::now() + Duration::from_secs(10);
    while contention().lock_spins == before && Instant::now() < deadline {
        std::thread::yield_now();
    }
    drop(guard);
    waiter.join().unwrap();
    assert_eq!(*mutex.lock(), 1);
    assert!(contention().lock_spins > before, "a thread spun on a held lock and no spin was counted");
}

#[test]
fn a_reclaim_held_back_by_a_reader_is_counted() {
    let depot: StackDepot<64, 1, true> = StackDepot::with_eviction();
    depot.add_pool(pool(4096)).unwrap();
    let old = depot.save(&trace(1, 5)).unwrap();
    let before = contention().gate_waits;
    depot.with_reader_inside(|| {
        depot.put(old).unwrap();
        depot.collect(); // unlinks `old` and flips the gate: this reader holds it back
    });
    assert!(contention().gate_waits > before, "reclaim waited for a reader and no wait was counted");
    let mut buffer = [0; MAX_FRAMES];
    assert_eq!(depot.fetch(old, &mut buffer).unwrap(), trace(1, 5));
}
