//! Host tests of the depot: dedup, handles, capacity, eviction, concurrency.

mod basic;
mod compare;
mod concurrency;
mod contention;
mod eviction;

use std::sync::Mutex;
use std::sync::atomic::AtomicPtr;

/// Keeps the leaked pools reachable, so that Miri's leak check accepts them.
static LEAKED_POOLS: Mutex<Vec<AtomicPtr<u8>>> = Mutex::new(Vec::new());

/// A leaked, deliberately misaligned pool of `bytes` usable bytes.
pub fn pool(bytes: usize) -> &'static mut [u8] {
    let memory: &'static mut [u8] = Box::leak(vec![0u8; bytes + 32].into_boxed_slice());
    LEAKED_POOLS.lock().unwrap().push(AtomicPtr::new(memory.as_mut_ptr()));
    // Start 3 bytes past a 16-byte boundary: the depot realigns, dropping 13.
    let start = memory.as_ptr().align_offset(16) + 3;
    &mut memory[start..start + 13 + bytes]
}

/// A distinct made-up trace for `id`, `len` frames long.
pub fn trace(id: u64, len: usize) -> Vec<u64> {
    (0..len as u64).map(|depth| 0xffff_8000_0008_0000 + id * 0x1000 + depth * 4).collect()
}
