//! The depot: bucket chains over caller-provided pools, lookup and insertion.

use core::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use spin::mutex::SpinMutex;

use crate::MAX_FRAMES;
use crate::access::{increment, load_acquire_pointer, load_acquire_u32, load_relaxed_usize, pool_words};
use crate::contention::{self, CountedSpin};
use crate::handle::{DepotHandle, MAX_POOL_BYTES, MAX_POOLS, RECORD_ALIGN};
use crate::hash::hash_frames;
use crate::reclaim::ReadGate;
use crate::record::{EVICTABLE_RECORD_BYTES, HEADER_WORDS, Record, SATURATED, frames_equal, header, record_bytes};

/// Why the depot could not do what was asked. Never a panic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DepotError {
    /// A trace with no frames.
    Empty,
    /// A trace longer than [`MAX_FRAMES`].
    TooManyFrames,
    /// The depot is full: no pool has room and no evicted record is free.
    Full,
    /// [`StackDepot::try_save`] missed and the lock was taken.
    Busy,
    /// More pools than the depot (or the handle format) can name.
    TooManyPools,
    /// A pool too small for one record after alignment.
    PoolTooSmall,
    /// A handle that does not name a record of this depot.
    InvalidHandle,
    /// `get`/`put` on a depot without eviction.
    NotEvictable,
    /// `get`/`put` on a record whose count is already 0.
    NoReference,
}

/// Counters since the depot was created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DepotStats {
    /// Records on the bucket chains (evicted ones leave at the next miss).
    pub records: usize,
    /// Pool bytes carved into records so far (evicted records are reused, not returned).
    pub bytes: usize,
    /// Saves attempted (past the argument checks): `hits + misses`.
    pub lookups: u64,
    /// Saves that found their trace.
    pub hits: u64,
    /// Saves that did not (new record, or failure): see `lookups`.
    pub misses: u64,
    /// Records compared because their hash matched but whose frames differed.
    pub collisions: u64,
    /// Records evicted (reference count dropped to 0 and unlinked).
    pub evictions: u64,
}

/// What only the lock holder touches.
struct State {
    pools_added: usize,
    /// Where new records are carved: pool index and byte offset.
    bump_pool: usize,
    bump_offset: usize,
    /// Unlinked since the last flip of the read gate (raw handle list).
    pending: u32,
    /// Unlinked before the last flip; free once that phase's readers have left.
    waiting: u32,
    /// Reusable records.
    free: u32,
}

/// A pool as the hit path reads it: its length, then its base, stored once
/// (by `add_pool`, under the lock); a null base means "not added yet". Plain
/// atomics rather than a `spin::Once`, whose `get` the uninstrumented hit
/// path could not inline (see `access.rs`).
struct PoolSlot {
    base: AtomicPtr<AtomicU64>,
    words: AtomicUsize,
}

#[derive(Default)]
struct Counters {
    records: AtomicUsize,
    bytes: AtomicUsize,
    hits: AtomicU64,
    misses: AtomicU64,
    collisions: AtomicU64,
    evictions: AtomicU64,
}

/// A deduplicating store of stack traces (see the crate docs).
///
/// `BUCKETS` (a power of two) is the hash-table size, `POOLS` the most pools
/// that can be added, `EVICTABLE` whether records are reference-counted
/// ([`with_eviction`](Self::with_eviction)): a type parameter, so that the
/// hit path of a depot without eviction tests nothing for it. Usable in a
/// `static`: everything is const-initialized.
pub struct StackDepot<const BUCKETS: usize, const POOLS: usize, const EVICTABLE: bool = false> {
    buckets: [AtomicU32; BUCKETS],
    pools: [PoolSlot; POOLS],
    gate: ReadGate,
    /// Lock-free stack of records whose count reached 0 (raw handles).
    dying: AtomicU32,
    state: SpinMutex<State, CountedSpin>,
    counters: Counters,
}

impl<const BUCKETS: usize, const POOLS: usize> StackDepot<BUCKETS, POOLS, false> {
    /// A depot of permanent records, each sized to its trace.
    pub const fn new() -> Self {
        Self::empty()
    }
}

impl<const BUCKETS: usize, const POOLS: usize> StackDepot<BUCKETS, POOLS, true> {
    /// A depot with eviction: every record holds up to [`MAX_FRAMES`] frames
    /// (so any freed record fits any trace) and a reference count; `save`
    /// returns a reference, [`get`](Self::get) takes another, [`put`](Self::put)
    /// drops one.
    pub const fn with_eviction() -> Self {
        Self::empty()
    }
}

impl<const BUCKETS: usize, const POOLS: usize, const EVICTABLE: bool> StackDepot<BUCKETS, POOLS, EVICTABLE> {
    const VALID: () = assert!(BUCKETS.is_power_of_two() && POOLS <= MAX_POOLS && POOLS > 0);
    const fn empty() -> Self {
        let () = Self::VALID;
        Self {
            buckets: [const { AtomicU32::new(0) }; BUCKETS],
            pools: [const { PoolSlot { base: AtomicPtr::new(core::ptr::null_mut()), words: AtomicUsize::new(0) } };
                POOLS],
            gate: ReadGate::new(),
            dying: AtomicU32::new(0),
            state: SpinMutex::new(State {
                pools_added: 0,
                bump_pool: 0,
                bump_offset: 0,
                pending: 0,
                waiting: 0,
                free: 0,
            }),
            counters: Counters {
                records: AtomicUsize::new(0),
                bytes: AtomicUsize::new(0),
                hits: AtomicU64::new(0),
                misses: AtomicU64::new(0),
                collisions: AtomicU64::new(0),
                evictions: AtomicU64::new(0),
            },
        }
    }

    /// Whether records are reference-counted and evictable.
    pub const fn is_evictable(&self) -> bool {
        EVICTABLE
    }

    /// Hands `memory` to the depot for records, for good. Only the first
    /// [`MAX_POOL_BYTES`] after 16-byte alignment are used.
    pub fn add_pool(&self, memory: &'static mut [u8]) -> Result<(), DepotError> {
        let start = memory.as_ptr().align_offset(RECORD_ALIGN);
        let usable = memory.len().saturating_sub(start).min(MAX_POOL_BYTES) & !(RECORD_ALIGN - 1);
        if usable < if EVICTABLE { EVICTABLE_RECORD_BYTES } else { record_bytes(1) } {
            return Err(DepotError::PoolTooSmall);
        }
        let mut state = self.state.lock();
        let index = state.pools_added;
        if index >= POOLS {
            return Err(DepotError::TooManyPools);
        }
        let bytes = &mut memory[start..start + usable];
        // SAFETY: `bytes` is 16-aligned (align_offset above), so aligned for
        // AtomicU64, and `usable` is a multiple of 16, so `usable / 8` words
        // cover exactly these bytes. They are initialized, and every bit
        // pattern is a valid AtomicU64 (same size and validity as u64). The
        // `&'static mut` borrow is consumed here, so nothing else can reach
        // the bytes for the rest of the program: the shared, interior-mutable
        // view we make is the only one.
        let words = unsafe { core::slice::from_raw_parts(bytes.as_mut_ptr().cast::<AtomicU64>(), usable / 8) };
        let slot = &self.pools[index];
        slot.words.store(words.len(), Ordering::Relaxed);
        // Publish: a reader that sees the base sees the length.
        slot.base.store(words.as_ptr().cast_mut(), Ordering::Release);
        state.pools_added = index + 1;
        Ok(())
    }

    /// Stores `frames` (or finds them) and returns their handle. Lock-free when
    /// the trace is already there; otherwise takes the depot's spin lock, so
    /// callers that may interrupt a lock holder (IRQ context) use
    /// [`try_save`](Self::try_save) instead. With eviction, the handle holds
    /// one reference.
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    #[inline]
    pub fn save(&self, frames: &[u64]) -> Result<DepotHandle, DepotError> {
        self.save_with(frames, true)
    }

    /// [`save`](Self::save) that never spins: [`DepotError::Busy`] if the
    /// trace is new and the lock is taken.
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    #[inline]
    pub fn try_save(&self, frames: &[u64]) -> Result<DepotHandle, DepotError> {
        self.save_with(frames, false)
    }

    ///
    /// Up to a hit, nothing here is instrumented with the `kernel` feature
    /// (see the crate docs); the miss path (`insert`) is.
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    #[inline]
    fn save_with(&self, frames: &[u64], spin: bool) -> Result<DepotHandle, DepotError> {
        // `len` rather than `is_empty`: a core function, not inlined here.
        let len = frames.len();
        if len == 0 {
            return Err(DepotError::Empty);
        }
        if len > MAX_FRAMES {
            return Err(DepotError::TooManyFrames);
        }
        let hash = hash_frames(frames);
        let found = if EVICTABLE {
            let _inside = self.gate.enter();
            self.find_inline(hash, frames, true)
        } else {
            self.find_inline(hash, frames, true)
        };
        if let Some(handle) = found {
            increment(&self.counters.hits);
            return Ok(handle);
        }
        let result = self.insert(hash, frames, spin);
        let counter = if matches!(result, Ok((_, true))) { &self.counters.hits } else { &self.counters.misses };
        counter.fetch_add(1, Ordering::Relaxed);
        result.map(|(handle, _)| handle)
    }

    /// The miss path, under the lock: search again, then carve a record and
    /// publish it at the head of its bucket. `Ok((handle, found))`. Out of line and cold: the
    /// hit path inlined into its callers then saves only the registers a lookup needs.
    #[inline(never)]
    #[cold]
    fn insert(&self, hash: u32, frames: &[u64], spin: bool) -> Result<(DepotHandle, bool), DepotError> {
        let mut state = if spin { self.state.lock() } else { self.state.try_lock().ok_or(DepotError::Busy)? };
        if EVICTABLE {
            self.unlink_dying(&mut state);
        }
        // Chains change only under the lock, so no read gate is needed here.
        if let Some(handle) = self.find(hash, frames, false) {
            return Ok((handle, true));
        }
        if EVICTABLE {
            self.reclaim(&mut state);
        }
        let (handle, record) = self.allocate(&mut state, frames.len())?;
        let bucket = &self.buckets[hash as usize & (BUCKETS - 1)];
        let count = if EVICTABLE { 1 } else { SATURATED };
        record.write(bucket.load(Ordering::Relaxed), hash, count, frames);
        // Publish: a reader that sees the new head sees the whole record.
        bucket.store(handle.to_raw(), Ordering::Release);
        self.counters.records.fetch_add(1, Ordering::Relaxed);
        Ok((handle, false))
    }

    /// [`find_inline`](Self::find_inline) for the miss path: exempt from the sanitizer as the
    /// hit path is (the miss path around it is instrumented).
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    #[inline]
    fn find(&self, hash: u32, frames: &[u64], count_collisions: bool) -> Option<DepotHandle> {
        self.find_inline(hash, frames, count_collisions)
    }

    /// Walks `hash`'s chain for `frames`; with eviction, takes a reference
    /// (skipping dying records). Callers are inside the read gate or hold the lock. Always
    /// inlined (the hit path, exempt from the sanitizer, keeps the chain walk in registers).
    ///
    /// Per record: its address from the link (one pool-base load, nothing re-validated: see
    /// [`chained_record`](Self::chained_record)), its first two header words
    /// (one `ldp`: the next link and the hash, the frame count), then, on a hash match, the
    /// frames. The bucket head is read with acquire ordering, which makes every record of the
    /// chain visible (each was written before a release store of a head that this one follows),
    /// so the header words are relaxed loads.
    #[inline(always)]
    #[allow(clippy::question_mark, reason = "`?` is a call to `Try::branch`, which the exempt path would not inline")]
    fn find_inline(&self, hash: u32, frames: &[u64], count_collisions: bool) -> Option<DepotHandle> {
        let len = frames.len() as u64;
        let mut link = load_acquire_u32(&self.buckets[hash as usize & (BUCKETS - 1)]);
        loop {
            let Some(handle) = DepotHandle::from_link(link) else {
                return None;
            };
            // SAFETY: `link` was read from this depot's bucket or from a chained record's
            // next link (under the read gate or the lock: the chain is the depot's own).
            let record = unsafe { self.chained_record(handle) };
            // SAFETY: a chained record's header is in its pool (`chained_record`).
            let (head, sizes) = unsafe { header(record) };
            if head >> 32 == u64::from(hash) {
                // SAFETY: a chained record holds the frames its header counts (`chained_record`),
                // and `len` of them are read only if the count is `len`.
                if sizes >> 32 == len && unsafe { frames_equal(record.wrapping_add(HEADER_WORDS), frames) } {
                    // SAFETY: word 1 of the record, as above.
                    if !EVICTABLE || acquire_reference(unsafe { &*record.wrapping_add(1) }) {
                        return Some(handle);
                    }
                } else if count_collisions {
                    increment(&self.counters.collisions);
                }
            }
            link = head as u32;
        }
    }

    /// The first word of the record that a chain link names.
    ///
    /// # Safety
    ///
    /// `handle` is a link of one of this depot's bucket chains (a bucket head or a record's
    /// next link). Every such link is a handle that `insert` made for a record it carved wholly
    /// inside an added pool, with as many frame words as its header counts (an evictable
    /// depot's records all have room for [`MAX_FRAMES`], whatever trace they hold after reuse),
    /// and pools are never removed: so its pool index names an added pool and the record's
    /// words are readable from the pointer returned. Nothing is checked again here.
    #[inline(always)]
    unsafe fn chained_record(&self, handle: DepotHandle) -> *const AtomicU64 {
        // SAFETY: the pool index of a chain link is below POOLS (the caller's contract).
        let slot = unsafe { &*self.pools.as_ptr().wrapping_add(handle.pool()) };
        load_acquire_pointer(&slot.base).cast_const().wrapping_add(handle.offset() / 8)
    }

    /// A free record, or fresh pool memory.
    fn allocate(&self, state: &mut State, frames: usize) -> Result<(DepotHandle, Record<'_>), DepotError> {
        if let Some(handle) = DepotHandle::from_raw(state.free) {
            let record = self.record(handle).ok_or(DepotError::InvalidHandle)?;
            state.free = record.list_link().load(Ordering::Relaxed) as u32;
            return Ok((handle, record));
        }
        let bytes = if EVICTABLE { EVICTABLE_RECORD_BYTES } else { record_bytes(frames) };
        loop {
            let pool = self.pool(state.bump_pool).ok_or(DepotError::Full)?;
            if state.bump_offset + bytes <= pool.len() * 8 {
                let handle = DepotHandle::new(state.bump_pool, state.bump_offset).ok_or(DepotError::Full)?;
                let record = Record::at(pool, state.bump_offset / 8).ok_or(DepotError::Full)?;
                state.bump_offset += bytes;
                self.counters.bytes.fetch_add(bytes, Ordering::Relaxed);
                return Ok((handle, record));
            }
            state.bump_pool += 1;
            state.bump_offset = 0;
        }
    }

    /// The record `handle` names for `get`/`put`: evictable records are all
    /// [`EVICTABLE_RECORD_BYTES`] long and carved from the start of their
    /// pool, so any other offset is a forged handle (refused, lest a `put`
    /// free the middle of a live record).
    fn counted_record(&self, handle: DepotHandle) -> Result<Record<'_>, DepotError> {
        if !EVICTABLE {
            return Err(DepotError::NotEvictable);
        }
        if !handle.offset().is_multiple_of(EVICTABLE_RECORD_BYTES) {
            return Err(DepotError::InvalidHandle);
        }
        self.record(handle).ok_or(DepotError::InvalidHandle)
    }

    /// Pool `index`, if it was added.
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    #[inline]
    #[allow(clippy::cmp_null, reason = "`is_null` is a core function, which the exempt path would not inline")]
    fn pool(&self, index: usize) -> Option<&'static [AtomicU64]> {
        if index >= POOLS {
            return None;
        }
        let slot = &self.pools[index];
        let base = load_acquire_pointer(&slot.base);
        if base == core::ptr::null_mut() {
            return None;
        }
        let words = load_relaxed_usize(&slot.words);
        // SAFETY: a non-null base was stored by `add_pool`, with release
        // ordering after the length (acquired above), from a
        // `&'static [AtomicU64]` of `words` elements that it keeps for the
        // rest of the program; neither field changes afterwards.
        Some(unsafe { pool_words(base, words) })
    }

    /// The record `handle` names, if it lies in a pool of this depot.
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    #[inline]
    fn record(&self, handle: DepotHandle) -> Option<Record<'_>> {
        match self.pool(handle.pool()) {
            Some(pool) => Record::at(pool, handle.offset() / 8),
            None => None,
        }
    }

    /// Copies the frames of `handle` into `buffer`. With eviction the caller
    /// must hold a reference: after the last `put` the record may hold
    /// another trace (still memory-safe: pools are only ever read atomically).
    pub fn fetch<'b>(&self, handle: DepotHandle, buffer: &'b mut [u64; MAX_FRAMES]) -> Option<&'b [u64]> {
        let record = self.record(handle)?;
        let mut len = 0;
        for (slot, frame) in buffer.iter_mut().zip(record.frames()) {
            *slot = frame;
            len += 1;
        }
        Some(&buffer[..len])
    }

    /// Takes another reference on a record the caller holds one on.
    pub fn get(&self, handle: DepotHandle) -> Result<(), DepotError> {
        let record = self.counted_record(handle)?;
        if acquire_reference(record.count_word()) { Ok(()) } else { Err(DepotError::NoReference) }
    }

    /// Drops a reference. Lock-free (IRQ-safe): the last one queues the record,
    /// and the next miss path unlinks it and frees it once no lookup can still
    /// see it (see the crate docs). Dropping a reference one does not hold is
    /// a use-after-free of the record (memory-safe, but another trace's record
    /// may be freed); handles that are not record starts are refused.
    pub fn put(&self, handle: DepotHandle) -> Result<(), DepotError> {
        let record = self.counted_record(handle)?;
        let word = record.count_word();
        let mut current = word.load(Ordering::Relaxed);
        loop {
            let count = current as u32;
            if count == 0 {
                return Err(DepotError::NoReference);
            }
            if count == SATURATED {
                return Ok(());
            }
            // Release: our reads of the record happen before its reuse.
            match word.compare_exchange_weak(current, current - 1, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) if count == 1 => break,
                Ok(_) => return Ok(()),
                Err(actual) => {
                    contention::cas_failed();
                    current = actual;
                }
            }
        }
        let link = record.list_link();
        let mut head = self.dying.load(Ordering::Relaxed);
        loop {
            link.store(u64::from(head), Ordering::Relaxed);
            match self.dying.compare_exchange_weak(head, handle.to_raw(), Ordering::Release, Ordering::Relaxed) {
                Ok(_) => return Ok(()),
                Err(actual) => {
                    contention::cas_failed();
                    head = actual;
                }
            }
        }
    }

    /// Unlinks the records whose count reached 0 and frees what can be freed
    /// (the miss path does this too). Spins on the lock.
    pub fn collect(&self) {
        if EVICTABLE {
            let mut state = self.state.lock();
            self.unlink_dying(&mut state);
            self.reclaim(&mut state);
        }
    }

    /// Takes the whole dying stack and unlinks each record from its chain
    /// into `pending`. A dying record's count is 0 for good (references are
    /// only taken from non-zero counts), so it is on exactly one chain.
    fn unlink_dying(&self, state: &mut State) {
        let mut link = self.dying.swap(0, Ordering::Acquire);
        while let Some(handle) = DepotHandle::from_raw(link) {
            let Some(record) = self.record(handle) else {
                return;
            };
            link = record.list_link().load(Ordering::Relaxed) as u32;
            self.unlink(handle, record);
            record.list_link().store(u64::from(state.pending), Ordering::Relaxed);
            state.pending = handle.to_raw();
            self.counters.records.fetch_sub(1, Ordering::Relaxed);
            self.counters.evictions.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Removes `handle` from its bucket chain. Its own `next` is left intact,
    /// so a lookup standing on it still reaches the rest of the chain.
    fn unlink(&self, handle: DepotHandle, record: Record<'_>) {
        let bucket = &self.buckets[record.hash() as usize & (BUCKETS - 1)];
        let target = handle.to_raw();
        if bucket.load(Ordering::Relaxed) == target {
            bucket.store(record.next(), Ordering::Release);
            return;
        }
        let mut link = bucket.load(Ordering::Relaxed);
        while let Some(previous) = DepotHandle::from_raw(link).and_then(|handle| self.record(handle)) {
            link = previous.next();
            if link == target {
                previous.set_next(record.next());
                return;
            }
        }
    }

    /// Moves unlinked records towards the free list through the read gate's
    /// two phases: `waiting` is freed once the phase before the last flip has
    /// drained; then `pending` becomes `waiting` under a new flip.
    fn reclaim(&self, state: &mut State) {
        if state.waiting != 0 {
            if self.gate.previous_phase_drained() {
                let batch = core::mem::take(&mut state.waiting);
                self.free_all(state, batch);
            } else {
                contention::gate_waited();
            }
        }
        if state.waiting == 0 && state.pending != 0 {
            state.waiting = core::mem::take(&mut state.pending);
            self.gate.flip();
            if self.gate.previous_phase_drained() {
                let batch = core::mem::take(&mut state.waiting);
                self.free_all(state, batch);
            } else {
                contention::gate_waited();
            }
        }
    }

    fn free_all(&self, state: &mut State, mut link: u32) {
        while let Some(record) = DepotHandle::from_raw(link).and_then(|handle| self.record(handle)) {
            let next = record.list_link().load(Ordering::Relaxed) as u32;
            record.list_link().store(u64::from(state.free), Ordering::Relaxed);
            state.free = link;
            link = next;
        }
    }

    /// The counters (each read on its own: a snapshot only when quiet).
    pub fn stats(&self) -> DepotStats {
        let counters = &self.counters;
        let hits = counters.hits.load(Ordering::Relaxed);
        let misses = counters.misses.load(Ordering::Relaxed);
        DepotStats {
            records: counters.records.load(Ordering::Relaxed),
            bytes: counters.bytes.load(Ordering::Relaxed),
            lookups: hits + misses,
            hits,
            misses,
            collisions: counters.collisions.load(Ordering::Relaxed),
            evictions: counters.evictions.load(Ordering::Relaxed),
        }
    }

    /// Runs `body` while holding the depot lock (tests of the non-spinning path).
    #[cfg(test)]
    pub(crate) fn with_lock_held<T>(&self, body: impl FnOnce() -> T) -> T {
        let _state = self.state.lock();
        body()
    }

    #[cfg(test)]
    pub(crate) fn record_for_test(&self, handle: DepotHandle) -> Record<'_> {
        self.record(handle).unwrap()
    }

    /// Runs `body` as a lookup still inside the read gate would.
    #[cfg(test)]
    pub(crate) fn with_reader_inside<T>(&self, body: impl FnOnce() -> T) -> T {
        let _inside = self.gate.enter();
        assert!(self.gate.readers() > 0);
        body()
    }
}

impl<const BUCKETS: usize, const POOLS: usize> Default for StackDepot<BUCKETS, POOLS, false> {
    fn default() -> Self {
        Self::new()
    }
}

/// Increments a reference count unless it is 0 (a dying record must stay
/// dead) or saturated (permanent).
#[inline]
fn acquire_reference(word: &AtomicU64) -> bool {
    let mut current = word.load(Ordering::Relaxed);
    loop {
        let count = current as u32;
        if count == 0 {
            return false;
        }
        if count == SATURATED {
            return true;
        }
        // At SATURATED - 1 the increment saturates: the record becomes permanent.
        match word.compare_exchange_weak(current, current + 1, Ordering::Acquire, Ordering::Relaxed) {
            Ok(_) => return true,
            Err(actual) => current = actual,
        }
    }
}
