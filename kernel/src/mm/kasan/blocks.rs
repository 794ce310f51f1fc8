//! The heap's block table: a buddy allocator whose metadata lives beside the heap, not in it.
//!
//! Every piece of allocator state is in a side table indexed by 64-byte block ([`index`]: one
//! subtraction and one shift from an address): the object entry of each live or freed object
//! (requested size, block order, offset in its block, tag, live/freed state), and the free lists,
//! doubly linked by block index, with the order of each free block. Nothing is kept in the heap's
//! own memory, so a store that the sanitizer reports and recover mode then carries out (at any
//! distance from its object, or through a stale pointer into a freed or split block) can change
//! data, never the allocator's view of which blocks are free or how large an object is.
//!
//! Sizes, for the 16 MiB heap at a 64-byte least block (2^18 indices):
//! - object entries: 8 bytes each (2 MiB), at the index of the object's address (not its
//!   block's: with an alignment of 64 or more the object starts inside its block), so a free
//!   finds its entry with one shift and one load. Two live objects never share an index (each
//!   lies in its own block of at least 64 bytes). A freed object's entry stays FREED until
//!   another object starts in the same 64 bytes, which is how a free of a stale pointer is told
//!   to be a double free long after the stack ring forgot it.
//! - free-list links: 8 bytes each (2 MiB), at the free block's index: next and previous
//!   index + 1 (0: none), so the table starts all zero and lies in `.bss`.
//! - free orders: 1 byte each (256 KiB): the order of the free block starting there, 0 when no
//!   free block starts there; a free reads its buddy's byte to decide whether to merge.
//! - per order the list head, and one word whose bit k says list k is not empty, so an
//!   allocation finds the smallest free block that fits with one `rbit`/`clz`.
//!
//! The table is private to the heap and used under its lock.

/// log2 of the least block: a 32-byte left guard, one granule of object, the trailing guard.
pub const MIN_ORDER: u32 = 6;
/// log2 of the largest block: the whole heap.
pub const MAX_ORDER: u32 = 24;
/// log2 of an object's least offset in its block: the two guard granules before it.
pub const MIN_OFFSET_LOG2: u32 = 5;
/// Indices in the table: one per least block of the heap.
pub const BLOCKS: usize = 1 << (MAX_ORDER - MIN_ORDER);

/// `ObjectEntry::state` of an index where no object ever started.
pub const NEVER: u8 = 0;
/// `ObjectEntry::state` of a live and of a freed object.
pub const LIVE: u8 = 0x4c;
pub const FREED: u8 = 0x46;

/// What the heap knows about the object starting in one 64-byte index.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ObjectEntry {
    /// Requested size in bytes.
    pub size: u32,
    /// log2 of (object address - block address).
    pub offset_log2: u8,
    /// log2 of the block size.
    pub order: u8,
    pub tag: u8,
    /// NEVER, LIVE or FREED.
    pub state: u8,
}

impl ObjectEntry {
    pub const NONE: Self = Self { size: 0, offset_log2: 0, order: 0, tag: 0, state: NEVER };

    pub fn offset(&self) -> u64 {
        1 << (self.offset_log2 & 31)
    }
}

/// A free block's neighbours in its order's list, as index + 1 (0: none).
#[derive(Clone, Copy)]
struct FreeLink {
    next: u32,
    previous: u32,
}

/// The block table of one heap.
pub struct BlockTable {
    start: u64,
    end: u64,
    objects: [ObjectEntry; BLOCKS],
    links: [FreeLink; BLOCKS],
    free_order: [u8; BLOCKS],
    /// Per order, the first free block's index + 1 (0: empty).
    heads: [u32; MAX_ORDER as usize + 1],
    /// Bit k set: the list of order k is not empty.
    nonempty: u32,
    /// Bytes users asked for, and bytes in allocated blocks.
    user_bytes: usize,
    block_bytes: usize,
}

impl BlockTable {
    /// An empty table (all zero: it lies in `.bss`).
    pub const fn new() -> Self {
        Self {
            start: 0,
            end: 0,
            objects: [ObjectEntry::NONE; BLOCKS],
            links: [FreeLink { next: 0, previous: 0 }; BLOCKS],
            free_order: [0; BLOCKS],
            heads: [0; MAX_ORDER as usize + 1],
            nonempty: 0,
            user_bytes: 0,
            block_bytes: 0,
        }
    }

    /// Hands `[start, end)` (64-byte aligned, at most 2^MAX_ORDER bytes) to the table: the
    /// range is cut into the largest blocks aligned to their size, each put on its free list.
    pub fn init(&mut self, start: u64, end: u64) {
        assert!(start.is_multiple_of(1 << MIN_ORDER) && end - start <= 1 << MAX_ORDER, "heap range for the table");
        self.start = start;
        self.end = end;
        let mut current = start;
        while current + (1 << MIN_ORDER) <= end {
            let aligned = current & current.wrapping_neg();
            let fits = 1 << (63 - (end - current).leading_zeros());
            let size = aligned.min(fits).min(1 << MAX_ORDER);
            self.push(current, size.trailing_zeros());
            current += size;
        }
    }

    /// The table index of `address` (in the heap, untagged): its 64-byte block's.
    #[inline(always)]
    pub fn index(&self, address: u64) -> usize {
        ((address.wrapping_sub(self.start) >> MIN_ORDER) as usize) % BLOCKS
    }

    /// The entry of the object starting in the 64 bytes of `address` (in the heap).
    #[inline(always)]
    pub fn object(&self, address: u64) -> ObjectEntry {
        self.objects[self.index(address)]
    }

    #[inline(always)]
    pub fn set_object(&mut self, address: u64, entry: ObjectEntry) {
        let index = self.index(address);
        self.objects[index] = entry;
    }

    /// Every object entry (live or freed) whose block, as the entry describes it, holds
    /// `address` (in the heap, untagged), with the object's address: for each order, the block
    /// of that order around the address, and each offset an object can have in it (about 190
    /// entries read; for reports, never on the allocation path). At most one is live (live
    /// blocks never overlap); a freed entry stays until another object starts in its 64 bytes,
    /// so freed ones may describe blocks since merged or split again.
    pub fn holding(&self, address: u64) -> impl Iterator<Item = (u64, ObjectEntry)> + '_ {
        (MIN_ORDER..=MAX_ORDER).flat_map(move |order| {
            let block = address & !((1u64 << order) - 1);
            let inside = block >= self.start && block.wrapping_add(1 << order) <= self.end;
            (MIN_OFFSET_LOG2..order).filter(move |_| inside).filter_map(move |offset_log2| {
                let object = block + (1 << offset_log2);
                let entry = self.object(object);
                (entry.state != NEVER && u32::from(entry.order) == order && u32::from(entry.offset_log2) == offset_log2)
                    .then_some((object, entry))
            })
        })
    }

    /// log2 of the largest free block (None: the heap is full).
    pub fn largest_free_order(&self) -> Option<u32> {
        (self.nonempty != 0).then(|| 31 - self.nonempty.leading_zeros())
    }

    /// Bytes users asked for, and bytes in allocated blocks.
    pub fn usage(&self) -> (usize, usize) {
        (self.user_bytes, self.block_bytes)
    }

    /// Counts `size` requested bytes more (or fewer) in live objects.
    #[inline(always)]
    pub fn account(&mut self, added: usize, removed: usize) {
        self.user_bytes = self.user_bytes + added - removed;
    }

    #[inline(always)]
    fn push(&mut self, block: u64, order: u32) {
        let index = self.index(block);
        let head = self.heads[order as usize];
        self.links[index] = FreeLink { next: head, previous: 0 };
        if head != 0 {
            self.links[(head as usize - 1) % BLOCKS].previous = index as u32 + 1;
        }
        self.heads[order as usize] = index as u32 + 1;
        self.free_order[index] = order as u8;
        self.nonempty |= 1 << order;
    }

    #[inline(always)]
    fn unlink(&mut self, index: usize, order: u32) {
        let FreeLink { next, previous } = self.links[index];
        if previous != 0 {
            self.links[(previous as usize - 1) % BLOCKS].next = next;
        } else {
            self.heads[order as usize] = next;
            if next == 0 {
                self.nonempty &= !(1 << order);
            }
        }
        if next != 0 {
            self.links[(next as usize - 1) % BLOCKS].previous = previous;
        }
        self.free_order[index] = 0;
    }

    /// A block of 2^order bytes (aligned to its size), split from the smallest free block that
    /// holds it; None when there is none.
    #[inline(always)]
    pub fn allocate(&mut self, order: u32) -> Option<u64> {
        let order = order.max(MIN_ORDER);
        let candidates = self.nonempty & (u32::MAX << (order & 31));
        if order > MAX_ORDER || candidates == 0 {
            return None;
        }
        let mut found = candidates.trailing_zeros();
        let index = (self.heads[found as usize] as usize - 1) % BLOCKS;
        self.unlink(index, found);
        let block = self.start + ((index as u64) << MIN_ORDER);
        while found > order {
            found -= 1;
            self.push(block + (1 << found), found);
        }
        self.block_bytes += 1 << order;
        Some(block)
    }

    /// Gives the block of 2^order bytes at `block` back, merged with its free buddies.
    #[inline(always)]
    pub fn free(&mut self, block: u64, order: u32) {
        self.block_bytes -= 1 << order;
        let (mut block, mut order) = (block, order);
        while order < MAX_ORDER {
            let buddy = block ^ (1 << order);
            if buddy < self.start || buddy + (1 << order) > self.end {
                break;
            }
            let buddy_index = self.index(buddy);
            if self.free_order[buddy_index] as u32 != order {
                break;
            }
            self.unlink(buddy_index, order);
            block = block.min(buddy);
            order += 1;
        }
        self.push(block, order);
    }

    /// Checks the free lists: every listed block lies in the heap, aligned to its order, says
    /// its order, links back to its predecessor, and no two listed blocks overlap a live
    /// object's index; the free bytes plus the allocated bytes make the heap. The number of
    /// free blocks, or what is wrong.
    pub fn audit(&self) -> Result<usize, &'static str> {
        let mut free_bytes = 0u64;
        let mut blocks = 0;
        for order in MIN_ORDER..=MAX_ORDER {
            let mut previous = 0u32;
            let mut next = self.heads[order as usize];
            if (next != 0) != (self.nonempty & (1 << order) != 0) {
                return Err("a free list's non-empty bit is wrong");
            }
            while next != 0 {
                let index = next as usize - 1;
                if index >= BLOCKS || blocks > BLOCKS {
                    return Err("a free list runs out of the table");
                }
                let block = self.start + ((index as u64) << MIN_ORDER);
                if !block.is_multiple_of(1 << order) || block + (1 << order) > self.end {
                    return Err("a free block is misaligned or outside the heap");
                }
                if self.free_order[index] as u32 != order || self.links[index].previous != previous {
                    return Err("a free block's order or back link is wrong");
                }
                free_bytes += 1 << order;
                blocks += 1;
                previous = next;
                next = self.links[index].next;
            }
        }
        let heap = self.end - self.start;
        let usable = heap - heap % (1 << MIN_ORDER);
        if free_bytes + self.block_bytes as u64 != usable {
            return Err("free and allocated blocks do not make the heap");
        }
        Ok(blocks)
    }
}
