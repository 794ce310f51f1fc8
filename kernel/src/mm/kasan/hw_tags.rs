//! Hardware tag storage (KASAN HW_TAGS): object tags are MTE allocation tags, and the hardware
//! checks every access (its tag check faults are `mte.rs`'s).
//!
//! Tags keep the software mode's byte form so that the heap and the reports do not change: a
//! pointer's top byte is 0xF0 | logical tag (bits [59:56]; bits [63:60] stay ones, as in every
//! TTBR1 pointer), a granule's memory tag is 0xF0 | its 4-bit allocation tag, and Linux prints
//! HW_TAGS tags the same way (`Pointer tag: [f3], memory tag: [fe]`). Reserved, as in Linux:
//! 0xFF (tag 0xF) is the untagged kernel pointer's, unchecked under TCR_EL1.TCMA1, so it matches
//! every granule; 0xFE marks memory no object owns. IRG draws the 14 others (GCR_EL1 excludes
//! 0xE and 0xF). Unlike the shadow there are no short granules: the tag covers whole granules.

use super::storage::{self, TagStorage, untagged, with_tag};
use crate::arch::mte;

/// The MTE implementation of [`TagStorage`].
pub struct MteTags;

impl TagStorage for MteTags {
    const GRANULE: u64 = storage::GRANULE;
    const MATCH_ALL: u8 = storage::MATCH_ALL;
    const INVALID: u8 = 0xfe;
    const FIRST_OBJECT_TAG: u8 = 0xf0;
    const LAST_OBJECT_TAG: u8 = 0xfd;
    // MTE has no short granules: the hardware compares whole granules.
    const SHORT_GRANULES: bool = false;

    #[inline(always)]
    fn set_range_tag(address: u64, size: u64, tag: u8) {
        let address = untagged(address);
        // SAFETY: the heap retags only memory it owns (its free RAM, Tagged Normal: mm::init),
        // objects it is handing out or taking back.
        unsafe { mte::set_tags(address, size, with_tag(address, tag)) }
    }

    #[inline(always)]
    fn memory_tag(address: u64) -> u8 {
        0xf0 | mte::allocation_tag(untagged(address) & !(Self::GRANULE - 1))
    }

    #[inline(always)]
    fn tag_object(address: u64, size: u64, tag: u8) {
        Self::set_range_tag(address, size.next_multiple_of(Self::GRANULE), tag);
    }

    #[inline(always)]
    fn object_tag(address: u64) -> u8 {
        Self::memory_tag(address)
    }

    #[inline(always)]
    fn short_granule_accepts(_granule: u64, _memory_tag: u8, _pointer_tag: u8, _end: u64) -> bool {
        false
    }

    #[inline(always)]
    fn random_tag() -> u8 {
        (mte::random_tag(untagged(0)) >> 56) as u8
    }

    /// IRG with `previous` in its exclusion operand (bits [15:0], ORed with GCR_EL1.Exclude
    /// by the instruction itself: no GCR_EL1 write). QEMU's IRG draws by stepping a 4-bit LFSR
    /// offset past the last tag drawn, so without the exclusion an object freed and its block
    /// handed out again at once got the same tag back 1 time in 8 (offsets 0 and 14 of 16 land
    /// on it). The mask is 1 shifted by `previous ^ 0xF0` modulo 64 (one shift, as `lsl`
    /// takes its amount): an object tag 0xF0 + t sets bit t, and 0 (no predecessor) sets bit
    /// 48, which IRG ignores.
    #[inline(always)]
    fn random_tag_replacing(previous: u8) -> u8 {
        let exclude = 1u64.wrapping_shl(u32::from(previous ^ 0xf0));
        (mte::random_tag_excluding(untagged(0), exclude) >> 56) as u8
    }

    fn seed(seed: u32) {
        mte::seed(seed)
    }
}
