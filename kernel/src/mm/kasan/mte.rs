//! Hardware tag storage (KASAN HW_TAGS): object tags are MTE allocation tags, and the hardware
//! checks every access; tag check faults come here from the trap table and go to the same
//! report path as the software mode's mismatches.
//!
//! Tags keep the software mode's byte form so that the heap and the reports do not change: a
//! pointer's top byte is 0xF0 | logical tag (bits [59:56]; bits [63:60] stay ones, as in every
//! TTBR1 pointer), a granule's memory tag is 0xF0 | its 4-bit allocation tag, and Linux prints
//! HW_TAGS tags the same way (`Pointer tag: [f3], memory tag: [fe]`). Reserved, as in Linux:
//! 0xFF (tag 0xF) is the untagged kernel pointer's, unchecked under TCR_EL1.TCMA1, so it matches
//! every granule; 0xFE marks memory no object owns. IRG draws the 14 others (GCR_EL1 excludes
//! 0xE and 0xF). Unlike the shadow there are no short granules: the tag covers whole granules.

use super::report::{self, Mismatch};
use super::storage::{TagStorage, untagged, with_tag};
use crate::arch::exception::ExceptionFrame;
use crate::arch::mte;

/// The MTE implementation of [`TagStorage`].
pub struct MteTags;

impl TagStorage for MteTags {
    const GRANULE: u64 = 16;
    const MATCH_ALL: u8 = 0xff;
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

    fn seed(seed: u32) {
        mte::seed(seed)
    }
}

/// ESR_ELx.ISS of a data abort: ISV (the syndrome holds the access size), SAS (log2 size), WnR.
const ISS_ISV: u64 = 1 << 24;
const ISS_SAS_SHIFT: u64 = 22;
const ISS_WNR: u64 = 1 << 6;
const ISS_DFSC_MASK: u64 = 0x3f;

/// Whether a data abort's syndrome is a synchronous tag check fault.
#[inline(always)]
pub const fn is_tag_check_fault(esr: u64) -> bool {
    esr & ISS_DFSC_MASK == mte::DFSC_TAG_CHECK
}

/// A synchronous tag check fault at EL1 (the trap table's owner): reported as the software
/// mode's mismatch is, with the object from the stack ring. The access did not happen; the
/// context resumes at it with PSTATE.TCO set, so it is carried out unchecked (as Linux's
/// `kasan.fault=report` goes on after a report), and the context runs unchecked until
/// [`super::report::recording`] or the next report path turns checks back on.
#[sanitize(kernel_hwaddress = "off")]
pub fn on_tag_check_fault(frame: &mut ExceptionFrame) -> bool {
    let esr = frame.esr;
    // FAR_EL1[63:60] are UNKNOWN after a tag check fault; [59:56] hold the logical tag.
    let pointer_tag = 0xf0 | ((frame.far >> 56) & 0xf) as u8;
    let address = with_tag(frame.far, pointer_tag);
    // Without ISV the size is not known (Linux reports size 0 too, and prints no size).
    let size = if esr & ISS_ISV != 0 { 1 << ((esr >> ISS_SAS_SHIFT) & 3) } else { 0 };
    let mismatch = Mismatch {
        address,
        size,
        write: esr & ISS_WNR != 0,
        pointer_tag,
        memory_tag: MteTags::memory_tag(address),
        return_address: frame.elr,
    };
    let found = super::heap::find_object(address);
    report::report_mismatch(&mismatch, found, super::heap::stacks().name());
    frame.spsr |= mte::SPSR_TCO;
    true
}

/// A check point for asynchronous tag check faults (exception entry and exit, task switch):
/// reports one if TFSR_EL1 says the code before it faulted. Linux's report has no address then.
#[inline(always)]
pub fn check_async(pc: u64) {
    if mte::take_async_fault() {
        report::report_async(pc);
    }
}
