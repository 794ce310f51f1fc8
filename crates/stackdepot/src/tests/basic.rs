//! Dedup, handle format, capacity and statistics.

use super::{pool, trace};
use crate::{DepotError, DepotHandle, MAX_FRAMES, MAX_POOL_BYTES, OFFSET_BITS, SPARE_BITS, StackDepot, hash_frames};

type Depot = StackDepot<64, 4>;

fn depot_with_pools(pools: usize, bytes: usize) -> Depot {
    let depot = Depot::new();
    for _ in 0..pools {
        depot.add_pool(pool(bytes)).unwrap();
    }
    depot
}

fn fetch(depot: &Depot, handle: DepotHandle) -> Vec<u64> {
    let mut buffer = [0; MAX_FRAMES];
    depot.fetch(handle, &mut buffer).unwrap().to_vec()
}

#[test]
fn identical_traces_share_one_record() {
    let depot = depot_with_pools(1, 16 * 1024);
    let first = depot.save(&trace(1, 10)).unwrap();
    let other = depot.save(&trace(2, 10)).unwrap();
    let again = depot.save(&trace(1, 10)).unwrap();
    assert_eq!(first, again);
    assert_ne!(first, other);
    assert_eq!(fetch(&depot, first), trace(1, 10));
    assert_eq!(fetch(&depot, other), trace(2, 10));
    // A prefix is a different trace.
    assert_ne!(depot.save(&trace(1, 9)).unwrap(), first);
    let stats = depot.stats();
    assert_eq!((stats.records, stats.lookups, stats.hits, stats.misses), (3, 4, 1, 3));
    assert_eq!(stats.bytes, 112 + 112 + 96, "24-byte header + 8 per frame, 16-aligned");
}

#[test]
fn handles_are_stable_while_the_depot_grows() {
    let depot = depot_with_pools(3, if cfg!(miri) { 4096 } else { 64 * 1024 });
    let count = if cfg!(miri) { 40 } else { 500 };
    let handles: Vec<_> = (0..count).map(|id| depot.save(&trace(id, 1 + id as usize % 64)).unwrap()).collect();
    for (id, handle) in handles.iter().enumerate() {
        assert_eq!(depot.save(&trace(id as u64, 1 + id % 64)), Ok(*handle));
        assert_eq!(fetch(&depot, *handle), trace(id as u64, 1 + id % 64));
    }
    assert_eq!(depot.stats().records, count as usize);
    assert!(handles.iter().any(|handle| handle.pool() == 1), "the second pool was used");
}

#[test]
fn handle_format() {
    let depot = depot_with_pools(2, 1024);
    let first = depot.save(&trace(1, 1)).unwrap();
    assert_eq!(first.to_raw(), 1 << OFFSET_BITS, "pool 0 + 1, offset 0");
    let second = depot.save(&trace(2, 1)).unwrap();
    assert_eq!(second.to_raw(), (1 << OFFSET_BITS) | 2, "offset 32 >> 4");
    assert_eq!((second.pool(), second.offset()), (0, 32));
    for handle in [first, second] {
        assert_eq!(handle.to_raw() >> (32 - SPARE_BITS), 0, "spare bits are 0");
        assert_eq!(DepotHandle::from_raw(handle.to_raw()), Some(handle));
    }
    assert_eq!(DepotHandle::from_raw(0), None);
    assert_eq!(DepotHandle::from_raw(5), None, "pool field 0");
    assert_eq!(DepotHandle::from_raw(1 << 31 | 1 << OFFSET_BITS), None, "spare bits set");
    assert_eq!(size_of::<Option<DepotHandle>>(), 4);
    // A handle into a pool that was never added names nothing.
    let mut buffer = [0; MAX_FRAMES];
    assert_eq!(depot.fetch(DepotHandle::from_raw(3 << OFFSET_BITS).unwrap(), &mut buffer), None);
}

#[test]
fn full_depot_fails_cleanly_and_grows_with_a_pool() {
    let depot = Depot::new();
    assert_eq!(depot.save(&trace(0, 4)), Err(DepotError::Full), "no pool yet");
    depot.add_pool(pool(256)).unwrap(); // 4 records of 4 frames (64 bytes each)
    let handles: Vec<_> = (0..4).map(|id| depot.save(&trace(id, 4)).unwrap()).collect();
    assert_eq!(depot.save(&trace(9, 4)), Err(DepotError::Full));
    assert_eq!(depot.try_save(&trace(9, 4)), Err(DepotError::Full));
    // Existing traces are still found when full.
    assert_eq!(depot.save(&trace(2, 4)), Ok(handles[2]));
    depot.add_pool(pool(256)).unwrap();
    let grown = depot.save(&trace(9, 4)).unwrap();
    assert_eq!(grown.pool(), 1);
    let stats = depot.stats();
    assert_eq!((stats.records, stats.bytes, stats.misses, stats.hits), (5, 5 * 64, 8, 1));
}

#[test]
fn pool_limits() {
    let depot = StackDepot::<8, 1>::new();
    assert_eq!(depot.add_pool(pool(16)), Err(DepotError::PoolTooSmall));
    depot.add_pool(pool(MAX_POOL_BYTES * 2)).unwrap();
    assert_eq!(depot.add_pool(pool(1024)), Err(DepotError::TooManyPools));
    // Only MAX_POOL_BYTES of the big pool are used: 64-frame records of 536 -> 544 bytes.
    if !cfg!(miri) {
        let mut saved = 0;
        while depot.save(&trace(saved, MAX_FRAMES)).is_ok() {
            saved += 1;
        }
        assert_eq!(saved as usize, MAX_POOL_BYTES / 544);
    }
    let evicting = StackDepot::<8, 1, true>::with_eviction();
    assert_eq!(evicting.add_pool(pool(512)), Err(DepotError::PoolTooSmall), "one 64-frame record needs 544");
}

#[test]
fn bad_traces_are_refused() {
    let depot = depot_with_pools(1, 1024);
    assert_eq!(depot.save(&[]), Err(DepotError::Empty));
    assert_eq!(depot.save(&trace(1, MAX_FRAMES + 1)), Err(DepotError::TooManyFrames));
    assert_eq!(depot.stats().records, 0);
}

#[test]
fn hash_collisions_are_told_apart_and_counted() {
    // CRC32C is linear: one-frame traces that differ by its polynomial (reflected,
    // 0x1_05EC_76F1) have the same CRC, hence the same hash.
    let (a, b) = ([0xffff_8000_0012_0da4_u64], [0xffff_8000_0012_0da4_u64 ^ 0x1_05ec_76f1]);
    assert_eq!(hash_frames(&a), hash_frames(&b), "the hash changed: find a new colliding pair");
    let depot = depot_with_pools(1, 1024);
    let first = depot.save(&a).unwrap();
    let second = depot.save(&b).unwrap();
    assert_ne!(first, second);
    assert_eq!(depot.save(&a), Ok(first));
    assert_eq!(depot.save(&b), Ok(second));
    assert_eq!(fetch(&depot, first), a);
    assert_eq!(fetch(&depot, second), b);
    // b's first save met a, then a's second save met b: two collisions.
    assert_eq!(depot.stats().collisions, 2);
}

#[test]
fn try_save_never_spins() {
    let depot = depot_with_pools(1, 1024);
    let known = depot.save(&trace(1, 3)).unwrap();
    depot.with_lock_held(|| {
        assert_eq!(depot.try_save(&trace(1, 3)), Ok(known), "hits need no lock");
        assert_eq!(depot.try_save(&trace(2, 3)), Err(DepotError::Busy));
    });
    assert!(depot.try_save(&trace(2, 3)).is_ok());
    let stats = depot.stats();
    assert_eq!(stats.hits + stats.misses, stats.lookups);
}

#[test]
fn permanent_depot_has_no_references() {
    let depot = depot_with_pools(1, 1024);
    let handle = depot.save(&trace(1, 3)).unwrap();
    assert_eq!(depot.get(handle), Err(DepotError::NotEvictable));
    assert_eq!(depot.put(handle), Err(DepotError::NotEvictable));
}
