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

/// What the ring (with the block table) knows about the object a faulting pointer meant.
#[derive(Clone, Copy)]
pub struct Found {
    /// The entry that names the object: its free when it is freed, else its allocation.
    pub entry: RingEntry,
    /// When `entry` is a free, the allocation entry before it.
    pub allocation: Option<RingEntry>,
    /// Whether the ring still holds the object's entries. When not, `entry` comes from the
    /// block table (address, size, tag, live or freed) with no stack, and the report says the
    /// object is not remembered rather than print another object's stacks.
    pub remembered: bool,
}

/// What the block table says about the heap's objects now, as the classification asks it: the
/// heap implements it over its table (the ring does not know the table). The entries it returns
/// are built from the table and carry no stack.
pub trait Objects {
    /// Whether the object a ring entry names is live now, with the entry's size.
    fn is_live(&self, entry: &RingEntry) -> bool;
    /// The live object with `tag` whose block holds `address` (untagged).
    fn live_holding(&self, address: u64, tag: u8) -> Option<RingEntry>;
    /// The live object with `tag` nearest to `address`, within [`ADJACENT`] bytes of it.
    fn live_near(&self, address: u64, tag: u8) -> Option<RingEntry>;
    /// A freed object with `tag` whose bytes (`in_object`), or else whose block, hold
    /// `address`, as the table still describes it.
    fn freed_holding(&self, address: u64, tag: u8, in_object: bool) -> Option<RingEntry>;
}

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

    /// Whether the object's bytes hold `address` (untagged).
    pub fn object_contains(&self, address: u64) -> bool {
        let start = untagged(self.pointer);
        (start..start + self.size as u64).contains(&address)
    }

    /// How far `address` (untagged) lies outside the object's bytes (0: inside).
    pub fn distance(&self, address: u64) -> u64 {
        let start = untagged(self.pointer);
        let end = start + self.size as u64;
        if address < start { start - address } else { address.saturating_sub(end) }
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

    /// What the ring and the block table (`objects`) know about the object a faulting pointer
    /// meant, by the first of these rules that finds one among the objects with the pointer's
    /// tag:
    /// 1. the live object whose block holds the address (the table: at most one): an access to
    ///    its guards or slack is its out-of-bounds, whatever the ring still remembers;
    /// 2. a freed object whose bytes hold the address and which nothing has replaced at its
    ///    address since (the ring, newest first): a stale pointer's use-after-free;
    /// 3. the nearest live object within [`ADJACENT`] bytes (the table): an overflow out of its
    ///    block (the ring's older entries with the same tag often held blocks around a live
    ///    object, since the heap hands the same blocks out again and again, and a live pointer
    ///    that overflows is the bug its report must name): so an access past a live object into
    ///    the guard of a freed neighbour with the same tag is the live object's out-of-bounds;
    /// 4. a freed object whose bytes hold the address as the table still describes it (one the
    ///    ring forgot);
    /// 5. the newest ring entry whose block holds the address (a freed object, perhaps since
    ///    reused);
    /// 6. a freed object whose block holds the address as the table describes it;
    /// 7. the nearest object within a page in the ring, live ones first.
    ///
    /// An object the table finds is looked up in the ring for its stacks; if the ring forgot
    /// it, it is returned not remembered, and its report prints no stacks rather than those of
    /// a same-tag object up to a page away, which is what the ring alone would name.
    #[sanitize(kernel_hwaddress = "off")]
    pub fn find_object(&self, address: u64, objects: &impl Objects) -> Option<Found> {
        let tag = tag_of(address);
        let untagged = untagged(address);
        let same_tag = || self.newest_first().filter(|entry| tag_of(entry.pointer) == tag);
        // A freed object that nothing has replaced at its address since (the newest entry about
        // it), whose bytes hold the address.
        let freed_in_object = || {
            same_tag().find(|entry| {
                let start = super::storage::untagged(entry.pointer);
                entry.freed
                    && entry.object_contains(untagged)
                    && self
                        .newest_first()
                        .find(|newer| super::storage::untagged(newer.pointer) == start)
                        .is_some_and(|newest| core::ptr::eq(newest, *entry))
            })
        };
        let nearest = || {
            same_tag()
                .enumerate()
                .filter(|(_, entry)| entry.distance(untagged) < 4096)
                .min_by_key(|(newness, entry)| {
                    (entry.distance(untagged), !(!entry.freed && objects.is_live(entry)), *newness)
                })
                .map(|(_, entry)| entry)
        };
        objects
            .live_holding(untagged, tag)
            .map(|live| self.remembered(live))
            .or_else(|| freed_in_object().map(|entry| self.with_allocation(*entry)))
            .or_else(|| objects.live_near(untagged, tag).map(|live| self.remembered(live)))
            .or_else(|| objects.freed_holding(untagged, tag, true).map(|freed| self.remembered(freed)))
            .or_else(|| {
                same_tag().find(|entry| entry.block_contains(untagged)).map(|entry| self.with_allocation(*entry))
            })
            .or_else(|| objects.freed_holding(untagged, tag, false).map(|freed| self.remembered(freed)))
            .or_else(|| nearest().map(|entry| self.with_allocation(*entry)))
    }

    /// An object the block table describes (`object`: no stack), with its ring entries when the
    /// ring still holds them: the newest entry with its tagged address, size and state.
    fn remembered(&self, object: RingEntry) -> Found {
        let same = |entry: &&RingEntry| {
            entry.pointer == object.pointer && entry.freed == object.freed && entry.size == object.size
        };
        match self.newest_first().find(same) {
            Some(entry) => self.with_allocation(*entry),
            None => Found { entry: object, allocation: None, remembered: false },
        }
    }

    /// A ring entry, with the allocation entry before it when it is a free.
    fn with_allocation(&self, entry: RingEntry) -> Found {
        let allocation = if entry.freed {
            self.newest_first().find(|older| older.pointer == entry.pointer && !older.freed).copied()
        } else {
            None
        };
        Found { entry, allocation, remembered: true }
    }
}
