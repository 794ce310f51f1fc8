//! Reference counts, eviction, and reuse only after readers have left.

use super::{pool, trace};
use crate::{DepotError, DepotHandle, MAX_FRAMES, StackDepot};

type Depot = StackDepot<16, 2, true>;

fn evicting_depot(bytes: usize) -> Depot {
    let depot = Depot::with_eviction();
    depot.add_pool(pool(bytes)).unwrap();
    depot
}

#[test]
fn references_keep_a_record_and_the_last_put_frees_it() {
    let depot = evicting_depot(4096);
    let handle = depot.save(&trace(1, 5)).unwrap();
    assert_eq!(depot.save(&trace(1, 5)), Ok(handle)); // second reference
    depot.get(handle).unwrap(); // third
    for _ in 0..3 {
        assert_eq!(depot.save(&trace(1, 5)), Ok(handle), "still referenced");
        depot.put(handle).unwrap();
    }
    for _ in 0..3 {
        depot.put(handle).unwrap();
    }
    assert_eq!(depot.stats().records, 1, "unlinked only at the next miss or collect");
    assert_eq!(depot.put(handle), Err(DepotError::NoReference));
    assert_eq!(depot.get(handle), Err(DepotError::NoReference));
    depot.collect();
    let stats = depot.stats();
    assert_eq!((stats.records, stats.evictions), (0, 1));
}

#[test]
fn evicted_memory_is_reused() {
    let depot = evicting_depot(4096);
    let old = depot.save(&trace(1, 5)).unwrap();
    let bytes = depot.stats().bytes;
    depot.put(old).unwrap();
    // The dead trace is not found again: saving it makes a new record...
    let new = depot.save(&trace(2, 7)).unwrap();
    // ...in the same memory, since no lookup was in flight.
    assert_eq!(new, old);
    assert_eq!(depot.stats().bytes, bytes);
    let mut buffer = [0; MAX_FRAMES];
    assert_eq!(depot.fetch(new, &mut buffer).unwrap(), trace(2, 7));
    let resaved = depot.save(&trace(1, 5)).unwrap();
    assert_ne!(resaved, new);
    assert_eq!(depot.stats().records, 2);
}

#[test]
fn full_evicting_depot_recovers_after_puts() {
    let depot = evicting_depot(2 * 544);
    let first = depot.save(&trace(1, 1)).unwrap();
    let second = depot.save(&trace(2, 64)).unwrap();
    assert_eq!(depot.save(&trace(3, 1)), Err(DepotError::Full));
    depot.put(first).unwrap();
    assert!(depot.save(&trace(3, 1)).is_ok());
    assert_eq!(depot.save(&trace(4, 1)), Err(DepotError::Full));
    depot.put(second).unwrap();
    assert!(depot.save(&trace(4, 1)).is_ok());
}

#[test]
fn a_record_is_not_reused_while_a_lookup_may_see_it() {
    let depot = evicting_depot(4096);
    let old = depot.save(&trace(1, 5)).unwrap();
    depot.with_reader_inside(|| {
        depot.put(old).unwrap();
        depot.collect();
        assert_eq!(depot.stats().evictions, 1);
        // The lookup in flight might stand on `old`: it must not be reused.
        let new = depot.save(&trace(2, 5)).unwrap();
        assert_ne!(new, old);
        let mut buffer = [0; MAX_FRAMES];
        assert_eq!(depot.fetch(old, &mut buffer).unwrap(), trace(1, 5), "old record intact");
    });
    // Once the reader left, the next miss frees and reuses it.
    let reused = depot.save(&trace(3, 5)).unwrap();
    assert_eq!(reused, old);
}

#[test]
fn a_reader_in_the_new_phase_does_not_block_the_old_batch() {
    let depot = evicting_depot(8192);
    let first = depot.save(&trace(1, 5)).unwrap();
    let second = depot.save(&trace(2, 5)).unwrap();
    depot.with_reader_inside(|| {
        depot.put(first).unwrap();
        depot.collect(); // `first` waits for this reader's phase
    });
    depot.with_reader_inside(|| {
        // This reader entered after the flip: it cannot have seen `first`.
        depot.put(second).unwrap();
        depot.collect(); // frees `first`; `second` must wait for this reader
        let a = depot.save(&trace(3, 5)).unwrap();
        let b = depot.save(&trace(4, 5)).unwrap();
        assert!(a == first || b == first, "first was reused");
        assert!(a != second && b != second, "second was not");
    });
}

#[test]
fn saturated_reference_counts_make_a_record_permanent() {
    let depot = evicting_depot(4096);
    let handle = depot.save(&trace(1, 2)).unwrap();
    // Drive the count to the saturation point through the record's word.
    let record = depot.record_for_test(handle);
    record.count_word().fetch_add(u64::from(u32::MAX - 2), core::sync::atomic::Ordering::Relaxed);
    depot.get(handle).unwrap(); // reaches u32::MAX: saturated
    depot.put(handle).unwrap();
    depot.put(handle).unwrap();
    depot.collect();
    assert_eq!(depot.stats().evictions, 0);
    assert_eq!(depot.save(&trace(1, 2)), Ok(handle));
}

#[test]
fn forged_handles_cannot_drop_references() {
    let depot = evicting_depot(4096);
    let handle = depot.save(&trace(1, 2)).unwrap();
    let inside = DepotHandle::from_raw(handle.to_raw() + 2).unwrap(); // 32 bytes in
    assert_eq!(depot.put(inside), Err(DepotError::InvalidHandle));
    assert_eq!(depot.get(inside), Err(DepotError::InvalidHandle));
    let unknown_pool = DepotHandle::from_raw(3 << crate::OFFSET_BITS).unwrap();
    assert_eq!(depot.put(unknown_pool), Err(DepotError::InvalidHandle));
    assert_eq!(depot.save(&trace(1, 2)), Ok(handle));
}
