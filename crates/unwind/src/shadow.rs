//! The shadow-call-stack walker: copies in-use SCS entries, newest first.

use crate::repair::{ReturnRepair, repaired};
use crate::stack::StackMemory;
use crate::trace::{Corruption, EntryKind, StopReason, Trace, TraceBuilder, TraceOptions};

/// Non-canonical magic in the last slot of every shadow-stack area; checked
/// when a task dies and never reported by the walker.
pub const SCS_END_MAGIC: u64 = 0x5CA1_AB1E_5CA1_AB1E;

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
pub struct ShadowWalker<'a, M: ?Sized, S> {
    memory: &'a M,
    strip: S,
    /// The repair and its trampoline address (read once, not per frame).
    repair: Option<(&'a dyn ReturnRepair, u64)>,
}

impl<'a, M, S> ShadowWalker<'a, M, S>
where
    M: StackMemory + ?Sized,
    S: Fn(u64) -> u64,
{
    /// A walker over `memory`; `strip` removes PACs (the SCS holds signed LRs).
    pub fn new(memory: &'a M, strip: S) -> Self {
        Self { memory, strip, repair: None }
    }

    /// Reports the real return address where a slot holds `repair`'s trampoline.
    pub fn with_repair(mut self, repair: &'a dyn ReturnRepair) -> Self {
        self.repair = Some((repair, repair.trampoline()));
        self
    }

    /// Copies the segments' entries, newest first: the first segment is the
    /// running context, each next one the context it interrupted. Reads only
    /// `[base, pointer)` of each segment, after checking that `base`, `end`,
    /// `pointer` are 8-aligned and `base <= pointer <= end - 8`.
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    pub fn walk(&self, segments: &[ShadowSegment], options: TraceOptions) -> Trace {
        let mut builder = TraceBuilder::new(options);
        let mut stop = StopReason::EndOfShadowStack;
        let mut index = 0;
        while index < segments.len() {
            if let Err(reason) = self.walk_segment(&segments[index], &mut builder) {
                stop = reason;
                break;
            }
            index += 1;
        }
        builder.finish(stop)
    }

    /// Copies one segment; `Err` stops the whole walk.
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    fn walk_segment(&self, segment: &ShadowSegment, builder: &mut TraceBuilder) -> Result<(), StopReason> {
        let Some(magic_slot) = segment.stack.magic_slot() else {
            return Err(StopReason::Corrupt {
                address: segment.stack.base,
                corruption: Corruption::ShadowPointerOutOfBounds,
            });
        };
        if segment.pointer & 7 != 0 {
            return Err(StopReason::Corrupt { address: segment.pointer, corruption: Corruption::Misaligned });
        }
        if segment.pointer < segment.stack.base || segment.pointer > magic_slot {
            return Err(StopReason::Corrupt {
                address: segment.pointer,
                corruption: Corruption::ShadowPointerOutOfBounds,
            });
        }
        if let Some(pc) = segment.interrupted_pc {
            or_stop!(builder.push((self.strip)(pc), EntryKind::ExceptionPc), Err);
        }
        // Newest first: from the slot below x18 down to slot 0.
        let mut slot = segment.pointer;
        while slot > segment.stack.base {
            slot -= 8;
            match self.memory.read_u64(slot) {
                None => return Err(StopReason::Unreadable { address: slot }),
                Some(0) => return Err(StopReason::ShadowZeroEntry),
                Some(SCS_END_MAGIC) => {
                    return Err(StopReason::Corrupt { address: slot, corruption: Corruption::EndMagicInUse });
                }
                Some(signed) => {
                    let address = repaired(self.repair, (self.strip)(signed), None, slot);
                    or_stop!(builder.push(address, EntryKind::ReturnAddress), Err);
                }
            }
        }
        Ok(())
    }
}
