//! The 32-bit depot handle: pool index + 1 and record offset, 0 = failure.

use core::num::NonZeroU32;

/// Records are 16-byte aligned inside their pool, so offsets lose 4 bits.
pub const RECORD_ALIGN: usize = 16;
/// Bits 0..14: the record's byte offset in its pool, divided by 16.
pub const OFFSET_BITS: u32 = 14;
/// Bits 14..27: the pool index plus one (so that no valid handle is 0).
pub const POOL_BITS: u32 = 13;
/// Bits 27..32: spare, always 0 in a handle the depot returns (reserved;
/// Linux lets callers keep flags there).
pub const SPARE_BITS: u32 = 32 - OFFSET_BITS - POOL_BITS;
/// The largest pool a handle can address (256 KiB); the rest of a larger pool is unused.
pub const MAX_POOL_BYTES: usize = (1 << OFFSET_BITS) * RECORD_ALIGN;
/// The most pools a handle can name.
pub const MAX_POOLS: usize = (1 << POOL_BITS) - 1;

const OFFSET_MASK: u32 = (1 << OFFSET_BITS) - 1;
const POOL_MASK: u32 = (1 << POOL_BITS) - 1;

/// A reference to a depot record, `(pool + 1) << 14 | offset / 16`.
///
/// Never 0: store `handle.to_raw()` in object metadata and use 0 for "no
/// trace"; `Option<DepotHandle>` is 32 bits too.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DepotHandle(NonZeroU32);

impl DepotHandle {
    /// The handle of the record at byte `offset` (16-aligned) of pool `pool`.
    pub(crate) const fn new(pool: usize, offset: usize) -> Option<Self> {
        if pool >= MAX_POOLS || !offset.is_multiple_of(RECORD_ALIGN) || offset >= MAX_POOL_BYTES {
            return None;
        }
        let raw = ((pool as u32 + 1) << OFFSET_BITS) | (offset / RECORD_ALIGN) as u32;
        match NonZeroU32::new(raw) {
            Some(raw) => Some(Self(raw)),
            None => None,
        }
    }

    /// The handle stored as `raw`; `None` for 0 (failure) or non-zero spare bits.
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    #[inline]
    pub const fn from_raw(raw: u32) -> Option<Self> {
        if raw >> (OFFSET_BITS + POOL_BITS) != 0 || (raw >> OFFSET_BITS) & POOL_MASK == 0 {
            return None;
        }
        match NonZeroU32::new(raw) {
            Some(raw) => Some(Self(raw)),
            None => None,
        }
    }

    /// The handle a bucket-chain link holds (0 ends the chain). Only the depot makes links,
    /// from handles: no format check (a pool index the depot does not have is refused where
    /// it is used).
    #[inline(always)]
    pub(crate) const fn from_link(link: u32) -> Option<Self> {
        match NonZeroU32::new(link) {
            Some(raw) => Some(Self(raw)),
            None => None,
        }
    }

    /// The 32-bit value to store.
    pub const fn to_raw(self) -> u32 {
        self.0.get()
    }

    /// Index of the pool (in the order pools were added).
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    #[inline]
    pub const fn pool(self) -> usize {
        ((self.0.get() >> OFFSET_BITS) & POOL_MASK) as usize - 1
    }

    /// Byte offset of the record in its pool.
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    #[inline]
    pub const fn offset(self) -> usize {
        (self.0.get() & OFFSET_MASK) as usize * RECORD_ALIGN
    }
}
