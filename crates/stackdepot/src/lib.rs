//! The stack depot: deduplicated stack traces behind 32-bit handles.
//!
//! Allocation and free paths (the tag-based sanitizer, leak tracking) save a
//! trace per object; most traces repeat, so the depot stores each distinct
//! trace once and hands out a [`DepotHandle`] to keep in the object's
//! metadata. No allocator: records are carved from pools the caller hands in
//! ([`StackDepot::add_pool`]); no `alloc`, no panics on the save path.
//!
//! # Handle format
//!
//! A `u32`: bits 0..14 the record's byte offset in its pool divided by 16
//! (records are 16-byte aligned, pools at most 256 KiB), bits 14..27 the pool
//! index plus one (up to 8191 pools), bits 27..32 spare and always 0. So 0 is
//! never a handle and means "no trace" / failure in raw form.
//!
//! # Concurrency model
//!
//! - **Hit path, lock-free**: hash the frames, load the bucket head (acquire),
//!   follow the chain comparing hash, length and frames. Records are
//!   published by a release store of the bucket head after being written, and
//!   never change while published. Pools are read only through atomics, so
//!   even a stale handle is memory-safe (only its answer can be wrong).
//! - **Miss path, one spin lock**: search again, carve a record (free list
//!   first, then the current pool), link it at the head of its bucket.
//!   [`StackDepot::try_save`] fails with [`DepotError::Busy`] instead of
//!   spinning, for callers that may have interrupted the lock holder.
//! - **Capacity**: when the pools are used up, saves fail with
//!   [`DepotError::Full`]; [`StackDepot::add_pool`] may add room at any time.
//!
//! # Eviction (optional, [`StackDepot::with_eviction`])
//!
//! As Linux 6.8: records are fixed-size (64 frames) and reference-counted.
//! `save` returns a reference, [`StackDepot::get`] takes another,
//! [`StackDepot::put`] drops one; a lookup takes its reference only from a
//! non-zero count, so a record whose count reached 0 stays dead. `put` is
//! lock-free (it pushes the dead record on a lock-free stack), so it is safe
//! in IRQ context; the next miss path unlinks dead records.
//!
//! Memory is reused only when no lookup can still see it, without RCU:
//! lookups run inside a two-phase reader gate (an epoch and two reader
//! counters, see `reclaim.rs`); unlinked records wait for a flip of the epoch
//! and for the previous phase's counter to read 0 after a `SeqCst` fence.
//! The cost is two atomic read-modify-writes and a fence per lookup on
//! evicting depots only; permanent depots skip the gate. Nothing waits for
//! readers: records not yet free are retried at the next miss, and fresh pool
//! memory is used meanwhile. A lookup that is preempted inside the gate holds
//! back reuse for as long as it is off the CPU (as an RCU reader would hold
//! back a grace period), so the kernel should save with preemption disabled;
//! the concurrency test shows the effect with 8 threads on 2 cores.
//!
//! # The `kernel` feature
//!
//! Enables `#![feature(sanitize, core_intrinsics)]` and builds the lookup-hit
//! path with kernel-hwaddress off, as Linux builds its stack depot without
//! KASAN: [`StackDepot::save`] and [`StackDepot::try_save`] up to a hit
//! (argument checks, [`hash_frames`], the bucket chain walk, the record and
//! pool lookups, the frame compare, the hit counter) and [`DepotHandle`]'s
//! decoding. `#[sanitize(kernel_hwaddress = "off")]` stops LLVM from inlining
//! instrumented callees, so that path calls no core function: its atomics are
//! the `atomic_load` / `atomic_xadd` intrinsics (always-inlined helpers in
//! `access.rs`), its loops are index loops, its `Option`s are matched rather
//! than `?`-propagated, and pools are published as a base pointer and a
//! length (plain atomics) rather than through `spin::Once`, whose `get` it
//! could not inline. `lookups` is not counted: it is `hits + misses`. The miss
//! path (the spin lock, `insert`, carving a record), [`StackDepot::fetch`],
//! `get`/`put` and the evicting depot's read gate stay instrumented.
//! Without the feature the same code uses the ordinary atomic methods (and
//! `slice_from_raw_parts` for a pool's slice); the host tests and Miri run
//! both ways (`--features kernel` too).
//!
//! Checked by disassembling the `full` kernel: `save` inlines the whole
//! hit path for the permanent depot (hash, bucket `ldar`, pool and record
//! header `ldar`s, a plain `ldr` per frame compared, an `ldxr`/`stxr` hit
//! count), with no `__hwasan` thunk and no `bl` until the miss path or an
//! evicting depot's read gate. Measured (`kasan-boot`, icount): a lookup
//! hit for the heap's ~22-frame traces went from ~1,810 instructions
//! (every record load through an out-of-line atomic method and a
//! `__hwasan_check_x*` thunk) to ~427, about its `prod` cost; see README.md,
//! "`kasan-boot`".
#![cfg_attr(not(test), no_std)]
#![cfg_attr(feature = "kernel", feature(sanitize, core_intrinsics))]
#![cfg_attr(
    feature = "kernel",
    allow(internal_features, reason = "the hit path's atomics are intrinsics, see access.rs")
)]

mod access;
mod contention;
mod depot;
mod handle;
mod hash;
mod reclaim;
mod record;

#[cfg(test)]
mod tests;

pub use contention::{Contention, contention};
pub use depot::{DepotError, DepotStats, StackDepot};
pub use handle::{DepotHandle, MAX_POOL_BYTES, MAX_POOLS, OFFSET_BITS, POOL_BITS, RECORD_ALIGN, SPARE_BITS};
pub use hash::{crc32c_u64_portable, hash_frames, hash_frames_portable};

/// Most frames in one record (Linux's limit too).
pub const MAX_FRAMES: usize = 64;
