//! The replay blob: Linux's recorded allocations as xtask writes them and the kernel reads them.
//!
//! xtask converts the committed `tracelab-alloc-trace 1` file into this blob (`xtask/src/
//! replay.rs`); only the `kasan-replay` suite's runs load it into the guest, so other images do
//! not carry it. All integers are little-endian:
//!
//! ```text
//! MAGIC, then HEADER_WORDS u32: version, cpus, frames, stacks, slots, allocations, frees,
//!   frees_unrecorded, frees_null, live_at_end, stacks_truncated, frees_implied, frame_ids,
//!   events
//! stack_offsets: (stacks + 1) u32    index into frame_ids of each stack's first frame
//! frame_ids: frame_ids u16           per stack, innermost frame first; padded to 4 bytes
//! events                             an allocation: word, size, stack; a free: word
//!                                    word = FREE_BIT (frees) | cpu << CPU_SHIFT | slot
//! ```
//!
//! A frame ID names one of the kernel's frame functions ([`FRAME_FUNCTIONS`] of them, each
//! [`FRAME_FUNCTION_STRIDE`] bytes apart): one per distinct recorded return address. A slot
//! names a live allocation: the kernel keeps `slots` pointers, not Linux's addresses.

/// The first bytes of a blob.
pub const MAGIC: [u8; 8] = *b"TLREPLAY";
/// The layout's version.
pub const VERSION: u32 = 1;
/// The header's `u32`s after [`MAGIC`].
pub const HEADER_WORDS: usize = 14;
/// Set in an event's first word when it is a free.
pub const FREE_BIT: u32 = 1 << 31;
/// Where an event's CPU starts in its first word (3 bits: up to 8 recorded CPUs).
pub const CPU_SHIFT: u32 = 28;
/// The slot's bits in an event's first word.
pub const SLOT_MASK: u32 = (1 << CPU_SHIFT) - 1;
/// The innermost frames a replayed stack keeps: the lab's 64-frame trace depth (Linux's
/// `KASAN_STACK_DEPTH` is 64 too) minus 16 for the lab's own frames around them.
pub const MAX_RECORDED_DEPTH: usize = 48;
/// The kernel's frame functions: distinct recorded return addresses a blob may use (Linux's
/// boot trace has 4341).
pub const FRAME_FUNCTIONS: usize = 4608;
/// Bytes between two frame functions: eight instructions.
pub const FRAME_FUNCTION_STRIDE: usize = 32;
/// Where QEMU's `-device loader` puts the blob in the guest (physical, `virt`'s RAM starting at
/// 1 GiB): the last [`REGION_SIZE`] of the suite's 128 MiB guest, above the kernel image, the
/// sanitizer's shadow and the 16 MiB heap, which take RAM from its start.
pub const BLOB_ADDRESS: u64 = 0x4000_0000 + (128 << 20) - REGION_SIZE as u64;
/// The RAM the replay keeps for itself at [`BLOB_ADDRESS`]: the blob, then (at
/// [`SLOTS_OFFSET`]) its slot table, one pointer per slot.
pub const REGION_SIZE: usize = 8 << 20;
/// The largest blob the region holds, and where the slot table starts in it.
pub const SLOTS_OFFSET: usize = 4 << 20;

/// The blob's counts, as its header gives them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Header {
    pub cpus: u32,
    pub frames: u32,
    pub stacks: u32,
    pub slots: u32,
    pub allocations: u32,
    pub frees: u32,
    /// Counted by the recording, not replayed: frees of allocations made before it started.
    pub frees_unrecorded: u32,
    /// Counted by the recording, not replayed: frees of NULL.
    pub frees_null: u32,
    pub live_at_end: u32,
    /// Stacks deeper than [`MAX_RECORDED_DEPTH`], cut to their innermost frames.
    pub stacks_truncated: u32,
    /// Frees the trace lacks, replayed where Linux allocated the address again.
    pub frees_implied: u32,
    pub frame_ids: u32,
    pub events: u32,
}

impl Header {
    /// The header's words in their order in the blob.
    pub fn words(&self) -> [u32; HEADER_WORDS] {
        [
            VERSION,
            self.cpus,
            self.frames,
            self.stacks,
            self.slots,
            self.allocations,
            self.frees,
            self.frees_unrecorded,
            self.frees_null,
            self.live_at_end,
            self.stacks_truncated,
            self.frees_implied,
            self.frame_ids,
            self.events,
        ]
    }
}

/// Why a blob is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlobError {
    NotABlob,
    OtherVersion(u32),
    /// A part ends past the blob, or an offset or ID points outside its table.
    Truncated,
    TooManyFrames(u32),
}

/// One event of the replay, in the trace's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    Allocate { cpu: u32, slot: u32, size: u32, stack: u32 },
    Free { cpu: u32, slot: u32 },
}

fn word_at(bytes: &[u8], offset: usize) -> Option<u32> {
    let word = bytes.get(offset..offset.checked_add(4)?)?;
    Some(u32::from_le_bytes([word[0], word[1], word[2], word[3]]))
}

/// A checked view of a blob's bytes.
#[derive(Clone, Copy, Debug)]
pub struct Blob<'a> {
    pub header: Header,
    offsets: &'a [u8],
    frame_ids: &'a [u8],
    events: &'a [u8],
}

impl<'a> Blob<'a> {
    /// Checks the magic, version and part lengths, and that every stack lies within the frame
    /// IDs and every frame ID names a frame function.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, BlobError> {
        if bytes.get(..MAGIC.len()) != Some(&MAGIC[..]) {
            return Err(BlobError::NotABlob);
        }
        let mut words = [0; HEADER_WORDS];
        for (index, word) in words.iter_mut().enumerate() {
            *word = word_at(bytes, MAGIC.len() + 4 * index).ok_or(BlobError::Truncated)?;
        }
        let [
            version,
            cpus,
            frames,
            stacks,
            slots,
            allocations,
            frees,
            frees_unrecorded,
            frees_null,
            live_at_end,
            stacks_truncated,
            frees_implied,
            frame_ids,
            events,
        ] = words;
        if version != VERSION {
            return Err(BlobError::OtherVersion(version));
        }
        if frames as usize > FRAME_FUNCTIONS {
            return Err(BlobError::TooManyFrames(frames));
        }
        let header = Header {
            cpus,
            frames,
            stacks,
            slots,
            allocations,
            frees,
            frees_unrecorded,
            frees_null,
            live_at_end,
            stacks_truncated,
            frees_implied,
            frame_ids,
            events,
        };
        let offsets_start = MAGIC.len() + 4 * HEADER_WORDS;
        let ids_start = offsets_start + 4 * (stacks as usize + 1);
        let ids_end = ids_start + 2 * frame_ids as usize;
        let blob = Self {
            header,
            offsets: bytes.get(offsets_start..ids_start).ok_or(BlobError::Truncated)?,
            frame_ids: bytes.get(ids_start..ids_end).ok_or(BlobError::Truncated)?,
            events: bytes.get(ids_end.next_multiple_of(4)..).ok_or(BlobError::Truncated)?,
        };
        for stack in 0..stacks {
            for frame in blob.stack(stack).ok_or(BlobError::Truncated)? {
                if u32::from(frame) >= frames {
                    return Err(BlobError::Truncated);
                }
            }
        }
        Ok(blob)
    }

    /// A stack's frame IDs, innermost first.
    pub fn stack(&self, stack: u32) -> Option<impl Iterator<Item = u16> + 'a> {
        let start = word_at(self.offsets, 4 * stack as usize)? as usize;
        let end = word_at(self.offsets, 4 * stack as usize + 4)? as usize;
        let ids = self.frame_ids.get(2 * start..2 * end.max(start))?;
        Some(ids.chunks_exact(2).map(|pair| u16::from_le_bytes([pair[0], pair[1]])))
    }

    /// The events in order; a blob cut short ends the iteration early (the caller compares
    /// the count with [`Header::events`]).
    pub fn events(&self) -> impl Iterator<Item = Event> + 'a {
        let bytes = self.events;
        let mut offset = 0;
        core::iter::from_fn(move || {
            let first = word_at(bytes, offset)?;
            let (cpu, slot) = ((first & !FREE_BIT) >> CPU_SHIFT, first & SLOT_MASK);
            if first & FREE_BIT != 0 {
                offset += 4;
                return Some(Event::Free { cpu, slot });
            }
            let event =
                Event::Allocate { cpu, slot, size: word_at(bytes, offset + 4)?, stack: word_at(bytes, offset + 8)? };
            offset += 12;
            Some(event)
        })
    }
}
