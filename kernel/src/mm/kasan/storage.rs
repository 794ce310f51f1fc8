//! The tag-storage seam: where a granule's memory tag lives and how an object's tag is drawn.
//!
//! A trait of associated functions and constants, implemented by a zero-sized type and
//! selected once by the [`Tags`] alias (the software shadow, `shadow.rs`, or in build variant `mte`
//! the hardware's MTE allocation tags, `mte.rs`). Not `dyn`: every
//! call is resolved at compile time and inlined as before, so the memory-tag read in the
//! runtime's range checks and the tag writes on alloc/free cost exactly what the shadow's
//! `ldrb`/`str` cost. A trait rather than a cfg-selected module so that the compiler checks
//! that a second implementation provides the same functions and constants.
//!
//! Pointer tags (the top byte, ignored by the MMU with TBI) are the same in every
//! implementation: they are plain functions here.

#[cfg(feature = "mte")]
pub use super::mte::MteTags as Tags;
#[cfg(not(feature = "mte"))]
pub use super::shadow::ShadowTags as Tags;

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

    /// Gives every granule of `[address, address + size)` (size a multiple of the granule)
    /// memory tag `tag`.
    fn set_range_tag(address: u64, size: u64, tag: u8);
    /// The memory tag of the granule holding `address`.
    fn memory_tag(address: u64) -> u8;
    /// The next object tag of this CPU's generator. Callers run with interrupts masked.
    fn random_tag() -> u8;
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
    with_tag(address, Tags::MATCH_ALL)
}
