//! The stack ring: every allocation and free appends {tagged pointer, size, depot handle,
//! task, alloc/free} here, as in Linux's tag-based KASAN; a report searches it backward, newest
//! first, for the object a faulting pointer's tag belongs to. The heap owns the one ring (under
//! its lock); the record step only reads entries the heap hands it.

use super::storage::{tag_of, untagged};

/// Entries in the stack ring (each 24 bytes).
pub const RING_ENTRIES: usize = 8192;

/// The distance from a live object within which an access is that object's out-of-bounds
/// before it is a freed object's use-after-free: the reach of Linux's and this kernel's
/// overflow cases (`ptr[size + 64]`), four granules.
pub const ADJACENT: u64 = 64;

/// What the ring knows about a faulting address's object: the entry, and the allocation entry
/// before it when that entry is a free.
pub type Found = Option<(RingEntry, Option<RingEntry>)>;

/// One allocation or free in the stack ring.
#[derive(Clone, Copy, Default)]
pub struct RingEntry {
    /// The object's tagged address.
    pub pointer: u64,
    pub size: u32,
    /// Raw depot handle of the stack (0: not saved).
    pub stack: u32,
    pub task: u16,
    /// log2 of (object address - block address).
    pub offset_log2: u8,
    pub order: u8,
    pub freed: bool,
}

impl RingEntry {
    fn block_start(&self) -> u64 {
        untagged(self.pointer) - (1 << self.offset_log2)
    }

    pub fn block_contains(&self, address: u64) -> bool {
        (self.block_start()..self.block_start() + (1 << self.order)).contains(&address)
    }
}

pub struct Ring {
    entries: [RingEntry; RING_ENTRIES],
    /// Total entries ever written; the newest is at (next - 1) % RING_ENTRIES.
    next: u64,
}

impl Ring {
    pub const fn new() -> Self {
        Self {
            entries: [RingEntry { pointer: 0, size: 0, stack: 0, task: 0, offset_log2: 0, order: 0, freed: false };
                RING_ENTRIES],
            next: 0,
        }
    }

    pub fn push(&mut self, entry: RingEntry) {
        self.entries[(self.next % RING_ENTRIES as u64) as usize] = entry;
        self.next += 1;
    }

    /// Entries newest first.
    pub fn newest_first(&self) -> impl Iterator<Item = &RingEntry> {
        let count = self.next.min(RING_ENTRIES as u64);
        (1..=count).map(move |back| &self.entries[((self.next - back) % RING_ENTRIES as u64) as usize])
    }

    /// What the ring knows about the object a faulting pointer meant, preferring the object
    /// the address belongs to now: a live object (`is_live`) with the pointer's tag whose block
    /// holds the address; else a freed object with that tag whose bytes hold the address and
    /// which nothing has replaced at its address since (a stale pointer); else the nearest live
    /// object with that tag within [`ADJACENT`] bytes of the address (an overflow out of its
    /// block: the ring's older entries with the same tag often held blocks around a live
    /// object, since the heap hands the same blocks out again and again, and a live pointer
    /// that overflows is the bug its report must name); else the newest entry with that tag
    /// whose block holds it (a freed object, perhaps since reused); else the nearest
    /// same-tag object within a page, live ones first. Plus the allocation entry before it when
    /// that entry is a free.
    #[sanitize(kernel_hwaddress = "off")]
    pub fn find_object(&self, address: u64, is_live: impl Fn(&RingEntry) -> bool) -> Found {
        let tag = tag_of(address);
        let untagged = untagged(address);
        let same_tag = || self.newest_first().filter(|entry| tag_of(entry.pointer) == tag);
        let distance = |entry: &RingEntry| {
            let start = super::storage::untagged(entry.pointer);
            let end = start + entry.size as u64;
            if untagged < start { start - untagged } else { untagged.saturating_sub(end) }
        };
        let nearest = || {
            same_tag()
                .enumerate()
                .filter(|(_, entry)| distance(entry) < 4096)
                .min_by_key(|(newness, entry)| (distance(entry), !(!entry.freed && is_live(entry)), *newness))
                .map(|(_, entry)| entry)
        };
        let adjacent_live = || {
            same_tag()
                .filter(|entry| !entry.freed && distance(entry) <= ADJACENT && is_live(entry))
                .min_by_key(|entry| distance(entry))
        };
        // A freed object that nothing has replaced at its address since (the newest entry about
        // it), whose bytes hold the address: a stale pointer's use-after-free.
        let freed_in_object = || {
            same_tag().find(|entry| {
                let start = super::storage::untagged(entry.pointer);
                entry.freed
                    && (start..start + entry.size as u64).contains(&untagged)
                    && self
                        .newest_first()
                        .find(|newer| super::storage::untagged(newer.pointer) == start)
                        .is_some_and(|newest| core::ptr::eq(newest, *entry))
            })
        };
        let found = *same_tag()
            .find(|entry| !entry.freed && entry.block_contains(untagged) && is_live(entry))
            .or_else(freed_in_object)
            .or_else(adjacent_live)
            .or_else(|| same_tag().find(|entry| entry.block_contains(untagged)))
            .or_else(nearest)?;
        let allocation = if found.freed {
            same_tag().find(|entry| entry.pointer == found.pointer && !entry.freed).copied()
        } else {
            None
        };
        Some((found, allocation))
    }
}
