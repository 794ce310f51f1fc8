//! Many std threads saving, fetching and evicting at once.
//!
//! Plain std threads with many iterations (not loom: loom would need the
//! depot's atomics swapped for its own). Under Miri the counts are cut down
//! and Miri checks the memory model and the pool cast instead.

use std::collections::HashMap;
use std::sync::Mutex;
use std::thread;

use super::{pool, trace};
use crate::{DepotError, DepotHandle, MAX_FRAMES, StackDepot};

const THREADS: u64 = if cfg!(miri) { 3 } else { 8 };
const OPERATIONS: usize = if cfg!(miri) { 60 } else { 20_000 };
const TRACES: u64 = 48;
const POOLS: usize = if cfg!(miri) { 2 } else { 8 };

fn frames_of(id: u64) -> Vec<u64> {
    trace(id, 1 + (id as usize * 7) % MAX_FRAMES)
}

/// xorshift64*: each thread's own reproducible sequence.
struct Rng(u64);

impl Rng {
    fn below(&mut self, bound: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % bound
    }
}

fn fetch<const B: usize, const P: usize, const E: bool>(depot: &StackDepot<B, P, E>, handle: DepotHandle) -> Vec<u64> {
    let mut buffer = [0; MAX_FRAMES];
    depot.fetch(handle, &mut buffer).unwrap().to_vec()
}

#[test]
fn saves_lookups_and_evictions_race_without_loss_duplication_or_early_reuse() {
    let depot = &StackDepot::<64, POOLS, true>::with_eviction();
    for _ in 0..POOLS {
        depot.add_pool(pool(64 * 1024)).unwrap();
    }
    // Per trace: the handle the current holders share, and how many hold it.
    let holders: Vec<Mutex<(u32, usize)>> = (0..TRACES).map(|_| Mutex::new((0, 0))).collect();
    let holders = &holders;

    let full: usize = thread::scope(|scope| {
        let workers: Vec<_> = (0..THREADS)
            .map(|thread_index| {
                scope.spawn(move || {
                    let mut rng = Rng(0x9e37_79b9 + thread_index * 0x1234_5678_9abc);
                    let mut held: Vec<(u64, DepotHandle)> = Vec::new();
                    let mut full = 0;
                    for _ in 0..OPERATIONS {
                        if held.is_empty() || (held.len() < 6 && rng.below(100) < 55) {
                            let id = rng.below(TRACES);
                            let frames = frames_of(id);
                            let handle = match depot.save(&frames) {
                                Ok(handle) => handle,
                                Err(DepotError::Full) => {
                                    full += 1;
                                    continue;
                                }
                                Err(error) => panic!("save failed: {error:?}"),
                            };
                            // A record reused under a lookup would hold another trace.
                            assert_eq!(fetch(depot, handle), frames, "trace {id}");
                            let mut slot = holders[id as usize].lock().unwrap();
                            if slot.1 > 0 {
                                assert_eq!(slot.0, handle.to_raw(), "two live records for trace {id}");
                            }
                            *slot = (handle.to_raw(), slot.1 + 1);
                            held.push((id, handle));
                        } else {
                            let (id, handle) = held.swap_remove(rng.below(held.len() as u64) as usize);
                            assert_eq!(fetch(depot, handle), frames_of(id), "record changed while held");
                            let mut slot = holders[id as usize].lock().unwrap();
                            slot.1 -= 1;
                            depot.put(handle).unwrap();
                        }
                    }
                    for (id, handle) in held {
                        let mut slot = holders[id as usize].lock().unwrap();
                        slot.1 -= 1;
                        depot.put(handle).unwrap();
                    }
                    full
                })
            })
            .collect();
        workers.into_iter().map(|worker| worker.join().unwrap()).sum()
    });

    depot.collect();
    let stats = depot.stats();
    let created = stats.misses - full as u64;
    assert_eq!(stats.lookups, stats.hits + stats.misses);
    assert_eq!(stats.records, 0, "every record was evicted: {stats:?}");
    assert_eq!(stats.evictions, created, "nothing lost: {stats:?}");
    let carved = (stats.bytes / 544) as u64;
    assert!(carved <= POOLS as u64 * (64 * 1024 / 544));
    if !cfg!(miri) {
        assert!(carved < created, "evicted records were reused: {stats:?}");
    }
    // Full is allowed while a lookup preempted inside the read gate holds back
    // reuse (8 threads on few cores), but never for good.
    assert!(depot.save(&frames_of(1)).is_ok(), "the depot recovered from being full");
    eprintln!("{stats:?}, depot full {full} times, {carved} records carved");
}

#[test]
fn concurrent_saves_to_a_permanent_depot_agree_on_handles() {
    let depot = &StackDepot::<256, 4>::new();
    for _ in 0..4 {
        depot.add_pool(pool(64 * 1024)).unwrap();
    }
    let per_thread: Vec<HashMap<u64, DepotHandle>> = thread::scope(|scope| {
        (0..THREADS)
            .map(|thread_index| {
                scope.spawn(move || {
                    let mut rng = Rng(0x5eed + thread_index * 0x9e37_79b9_7f4a);
                    let mut seen = HashMap::new();
                    for _ in 0..OPERATIONS / 2 {
                        let id = rng.below(300);
                        let handle = depot.save(&frames_of(id)).unwrap();
                        assert_eq!(*seen.entry(id).or_insert(handle), handle, "handle changed");
                    }
                    seen
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|worker| worker.join().unwrap())
            .collect()
    });
    let mut all: HashMap<u64, DepotHandle> = HashMap::new();
    for seen in &per_thread {
        for (id, handle) in seen {
            assert_eq!(*all.entry(*id).or_insert(*handle), *handle, "two records for trace {id}");
        }
    }
    assert_eq!(depot.stats().records, all.len(), "one record per distinct trace");
    for (id, handle) in all {
        assert_eq!(fetch(depot, handle), frames_of(id));
    }
}
