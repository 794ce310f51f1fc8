//! The shadow-call-stack walker: copies in-use SCS entries, newest first.

use core::mem::MaybeUninit;

use crate::pac::AddressLayout;
use crate::repair::ReturnRepair;
use crate::stack::StackMemory;
use crate::trace::{Corruption, Sink, StopReason, TraceOptions, Walked};

/// Non-canonical magic in the last slot of every shadow-stack area; checked
/// when a task dies and never reported by the walker. Bit 55 is clear (a
/// lower-half pattern), so the walk's one test that rejects zero and TTBR0
/// values rejects it too.
pub const SCS_END_MAGIC: u64 = 0x5C21_AB1E_5CA1_AB1E;

// The walk rejects the magic with the same bit-55 test as zero and TTBR0 values.
const _: () = assert!(!AddressLayout::is_upper_half(SCS_END_MAGIC));

/// A shadow-call-stack area `[base, end)`. It grows up from `base` (slot 0 is
/// the first real entry); the last slot, `end - 8`, holds [`SCS_END_MAGIC`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ShadowStack {
    /// Address of slot 0.
    pub base: u64,
    /// One past the end-magic slot.
    pub end: u64,
}

impl ShadowStack {
    /// The area `[base, end)`.
    pub const fn new(base: u64, end: u64) -> Self {
        Self { base, end }
    }

    /// The address of the end-magic slot, or `None` for a malformed area.
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    pub const fn magic_slot(&self) -> Option<u64> {
        if self.base & 7 != 0 || self.end & 7 != 0 || self.end <= self.base {
            return None;
        }
        Some(self.end - 8)
    }
}

/// The in-use part of one shadow stack: `[stack.base, pointer)`, where
/// `pointer` is x18 (the next free slot) of the context it belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ShadowSegment {
    /// The area.
    pub stack: ShadowStack,
    /// The context's x18.
    pub pointer: u64,
    /// For an interrupted context: its PC (ELR), reported before its entries
    /// (as the frame walker does at an exception boundary).
    pub interrupted_pc: Option<u64>,
}

impl ShadowSegment {
    /// The running context's segment.
    pub const fn current(stack: ShadowStack, pointer: u64) -> Self {
        Self { stack, pointer, interrupted_pc: None }
    }

    /// An interrupted context's segment, chained after the current one.
    pub const fn interrupted(stack: ShadowStack, pointer: u64, pc: u64) -> Self {
        Self { stack, pointer, interrupted_pc: Some(pc) }
    }
}

/// Walks shadow call stacks over `memory`, reading only in-use slots.
pub struct ShadowWalker<'a, M: ?Sized> {
    memory: &'a M,
    layout: AddressLayout,
    repair: Option<&'a dyn ReturnRepair>,
}

impl<'a, M> ShadowWalker<'a, M>
where
    M: StackMemory + ?Sized,
{
    /// A walker over `memory`; `layout` strips PACs (the SCS holds signed LRs).
    pub fn new(memory: &'a M, layout: AddressLayout) -> Self {
        Self { memory, layout, repair: None }
    }

    /// Reports the real return address where a slot holds `repair`'s trampoline. Only pass a
    /// repair when a return may be hijacked: the slots are then checked after the copy.
    pub fn with_repair(mut self, repair: &'a dyn ReturnRepair) -> Self {
        self.repair = Some(repair);
        self
    }

    /// Copies the segments' entries into `buffer`, newest first: the first segment is the
    /// running context, each next one the context it interrupted. Reads only
    /// `[base, pointer)` of each segment, after checking that `base`, `end`,
    /// `pointer` are 8-aligned and `base <= pointer <= end - 8`.
    ///
    /// Always inlined, so it is instrumented as its caller is (the kernel's callers are exempt
    /// from the sanitizer).
    #[inline(always)]
    pub fn walk(&self, segments: &[ShadowSegment], options: TraceOptions, buffer: &mut [MaybeUninit<u64>]) -> Walked {
        let mut sink = Sink::new(options, buffer);
        let trampoline = match self.repair {
            Some(repair) => repair.trampoline(),
            None => 0,
        };
        let mut index = 0;
        while index < segments.len() {
            if let Err(stop) = self.copy_segment(&segments[index], &mut sink, trampoline) {
                return sink.finish(stop);
            }
            index += 1;
        }
        sink.finish(StopReason::EndOfShadowStack)
    }

    /// Copies one segment; `Err` stops the whole walk.
    ///
    /// The shadow-stack loop, the only one in the tree: per slot, one load (pre-indexed),
    /// bit 55 of the raw word (zero, the end magic and TTBR0 values go to the slow path),
    /// one `orr` (PAC strip), the store, and one compare for both the segment's base and the
    /// depth limit (the copy's length is computed before the loop). A hijacked return is
    /// found by its slot after the copy, only when a repair was given.
    #[inline(always)]
    fn copy_segment(&self, segment: &ShadowSegment, sink: &mut Sink, trampoline: u64) -> Result<(), StopReason> {
        let Some(magic_slot) = segment.stack.magic_slot() else {
            return Err(StopReason::Corrupt {
                address: segment.stack.base,
                corruption: Corruption::ShadowPointerOutOfBounds,
            });
        };
        // Alignment and `base <= pointer <= magic_slot` in one compare: the pointer's offset from
        // the (8-aligned) base, rotated right by 3, is its slot count if the offset is aligned
        // and has a low bit in its top bits (so is larger than any slot count) if not; a pointer
        // below the base wraps to a huge offset.
        let offset = segment.pointer.wrapping_sub(segment.stack.base);
        // By hand, not `rotate_right`: a core function the exempt walkers would not inline.
        #[allow(clippy::manual_rotate, reason = "`rotate_right` is a call in the exempt walker (kernel, `full`)")]
        let slots = (offset >> 3) | (offset << 61);
        if slots > (magic_slot - segment.stack.base) / 8 {
            let corruption =
                if segment.pointer & 7 != 0 { Corruption::Misaligned } else { Corruption::ShadowPointerOutOfBounds };
            return Err(StopReason::Corrupt { address: segment.pointer, corruption });
        }
        if let Some(pc) = segment.interrupted_pc {
            or_stop!(sink.push(self.layout.strip(pc), true), Err);
        }
        let upper = self.layout.upper_bits();
        let base = segment.stack.base;
        // Newest first: from the slot below x18 down to slot 0, in runs that each end at the
        // base or at the end of the sink's phase, whichever is first.
        let mut slot = segment.pointer;
        loop {
            let room = (sink.end - sink.dst) as u64;
            let available = (slot - base) / 8;
            let stop_at = if available > room { slot - 8 * room } else { base };
            let first = sink.dst;
            let from = slot;
            let mut cursor = sink.cursor();
            // A read pointer of its own (pre-decremented), not used after the loop.
            let mut at = slot;
            while at > stop_at {
                let raw = match self.memory.read_below(&mut at) {
                    Some(raw) => raw,
                    None => {
                        sink.sync(cursor);
                        return Err(StopReason::Unreadable { address: at });
                    }
                };
                if !AddressLayout::is_upper_half(raw) {
                    sink.sync(cursor);
                    return Err(rejected_slot(at, raw));
                }
                // SAFETY: at most `room` entries are written from the cursor: inside the phase.
                unsafe { cursor.write(raw | upper) };
                cursor = cursor.wrapping_add(1);
            }
            slot = stop_at;
            sink.sync(cursor);
            if trampoline != 0 && sink.keeping() {
                repair_run(self.repair, sink.base(), first, sink.dst, from);
            }
            if slot == base {
                return Ok(());
            }
            // The run stopped short of the base: the phase is full.
            if !sink.next_phase() {
                return Err(StopReason::DepthLimit);
            }
        }
    }
}

/// Replaces hijacked returns (either trampoline) among entries `first..last` of `base` (copied
/// from the slots below `from`, newest first).
#[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
#[inline(never)]
#[cold]
fn repair_run(repair: Option<&dyn ReturnRepair>, base: *mut u64, first: usize, last: usize, from: u64) {
    let Some(repair) = repair else {
        return;
    };
    let (trampoline, graph) = repair.trampolines();
    let mut index = first;
    while index < last {
        // SAFETY: entries first..last were written by the copy (the caller's buffer).
        let entry = unsafe { base.add(index) };
        // SAFETY: as above.
        let address = unsafe { entry.read() };
        if address == trampoline || (graph != 0 && address == graph) {
            let slot = from - 8 * (index - first + 1) as u64;
            // SAFETY: as above.
            unsafe { entry.write(repair.repaired_shadow(address, slot)) };
        }
        index += 1;
    }
}

/// Why a slot whose bit 55 is clear stops the walk.
#[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
#[inline(never)]
#[cold]
fn rejected_slot(slot: u64, raw: u64) -> StopReason {
    match raw {
        0 => StopReason::ShadowZeroEntry,
        SCS_END_MAGIC => StopReason::Corrupt { address: slot, corruption: Corruption::EndMagicInUse },
        _ => StopReason::Corrupt { address: slot, corruption: Corruption::LowerHalfAddress },
    }
}
