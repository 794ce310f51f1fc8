//! The tag-storage seam: where a granule's memory tag lives and how an object's tag is drawn.
//!
//! A trait of associated functions and constants, implemented by a zero-sized type per kind of
//! storage (the software shadow, `shadow.rs`; the hardware's MTE allocation tags, `hw_tags.rs`)
//! and selected once, at the top of the sanitizer, by the `Tags` alias (`mm/kasan/mod.rs`). Not
//! `dyn`: every call is resolved at compile time and inlined as before, so the memory-tag read
//! in the runtime's range checks and the tag writes on alloc/free cost exactly what the shadow's
//! `ldrb`/`str` cost. A trait rather than a cfg-selected module so that the compiler checks
//! that a second implementation provides the same functions and constants.
//!
//! Pointer tags (the top byte, ignored by the MMU with TBI) are the same in every
//! implementation: they are plain functions here, and this file names no implementation.

/// Bytes covered by one memory tag: MTE's granule, which the shadow follows.
pub const GRANULE: u64 = 16;

/// The tag of untagged kernel pointers (TTBR1 addresses with TBI1 have top byte 0xFF): the
/// match-all tag of every implementation.
pub const MATCH_ALL: u8 = 0xff;

/// Tag storage: the granule, the reserved tag values, and the three operations the heap and
/// the runtime need.
pub trait TagStorage {
    /// Bytes covered by one memory tag.
    const GRANULE: u64;
    /// The tag of untagged pointers; matches every memory tag, never given to an object.
    const MATCH_ALL: u8;
    /// The memory tag of granules no live object owns (freed objects, headers, slack).
    const INVALID: u8;
    /// The first and last tags [`TagStorage::random_tag`] draws.
    const FIRST_OBJECT_TAG: u8;
    const LAST_OBJECT_TAG: u8;
    /// Whether an object's partly used last granule is a short granule (HWASan's): its memory
    /// tag is the number of bytes used (1..15) and its last byte holds the object's tag.
    const SHORT_GRANULES: bool;

    /// Gives every granule of `[address, address + size)` (size a multiple of the granule)
    /// memory tag `tag`.
    fn set_range_tag(address: u64, size: u64, tag: u8);
    /// The memory tag of the granule holding `address` (with short granules, a length 1..15
    /// for an object's partly used last granule).
    fn memory_tag(address: u64) -> u8;
    /// Tags the object of `size` bytes at `address` (granule-aligned) with `tag`: every granule
    /// it touches, the last one short when [`TagStorage::SHORT_GRANULES`] and partly used.
    fn tag_object(address: u64, size: u64, tag: u8);
    /// The tag of the object owning the granule of `address`: its memory tag, or the tag kept in
    /// a short granule's last byte.
    fn object_tag(address: u64) -> u8;
    /// Whether an access ending at `end` (exclusive, untagged) through a pointer tagged
    /// `pointer_tag` may touch the granule at `granule` whose memory tag `memory_tag` differs from
    /// the pointer's: only a short granule that the access stays inside of, with the
    /// pointer's tag in its last byte (the rule of the compiler's `_short_v2` check thunks).
    fn short_granule_accepts(granule: u64, memory_tag: u8, pointer_tag: u8, end: u64) -> bool;
    /// The next object tag of this CPU's generator. Callers run with interrupts masked.
    fn random_tag() -> u8;
    /// The next object tag for an object that starts where the freed object tagged `previous`
    /// started (0: none did), never `previous` where the storage can exclude a tag at no cost:
    /// a stale pointer to the freed object then mismatches its successor. Callers run with
    /// interrupts masked.
    fn random_tag_replacing(previous: u8) -> u8;
    /// Seeds every CPU's generator (`tag-seed=`), so that a run's tags are reproducible.
    fn seed(seed: u32);

    /// Whether `tag` can be an object's tag.
    #[inline(always)]
    fn is_object_tag(tag: u8) -> bool {
        tag >= Self::FIRST_OBJECT_TAG && tag <= Self::LAST_OBJECT_TAG
    }
}

/// `address` with its top byte replaced by `tag`.
pub const fn with_tag(address: u64, tag: u8) -> u64 {
    (address & !(0xff << 56)) | ((tag as u64) << 56)
}

/// The tag in the top byte of `address`.
pub const fn tag_of(address: u64) -> u8 {
    (address >> 56) as u8
}

/// `address` as an untagged kernel pointer (top byte: the match-all tag).
pub const fn untagged(address: u64) -> u64 {
    with_tag(address, MATCH_ALL)
}
