//! MTE tag check faults (KASAN HW_TAGS): synchronous ones come here from the trap table,
//! asynchronous ones are seen at check points; both go to the sanitizer's record step
//! (record.rs), as the software mode's mismatches do. The tags themselves are `hw_tags.rs`'s.

use super::record::{self, Mismatch};
use super::storage::{TagStorage, with_tag};
use super::{Tags, heap};
use crate::arch::exception::ExceptionFrame;
use crate::arch::mte;

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
/// the recording scope (`recording.rs`) or the next report path turns checks back on.
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
        memory_tag: Tags::memory_tag(address),
        return_address: frame.elr,
    };
    record::mismatch(&mismatch, heap::view(address));
    frame.spsr |= mte::SPSR_TCO;
    true
}

/// A check point for asynchronous tag check faults (exception entry and exit, task switch):
/// reports one if TFSR_EL1 says the code before it faulted. Linux's report has no address then.
#[inline(always)]
pub fn check_async(pc: u64) {
    if mte::take_async_fault() {
        record::asynchronous(pc);
    }
}
