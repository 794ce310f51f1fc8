//! The frame-pointer walker: follows {fp, lr} records across declared stacks.

use core::mem::offset_of;

use crate::repair::{ReturnRepair, repaired};
use crate::stack::{StackMemory, StackRange};
use crate::trace::{Corruption, EntryKind, StopReason, Trace, TraceBuilder, TraceOptions};

/// Size of an AAPCS64 frame record {fp, lr}.
pub const FRAME_RECORD_SIZE: u64 = 16;

/// The marker record exception entry writes on the stack, at the address it
/// then puts in x29 (see the crate docs for the protocol).
///
/// `fp` and `lr` are zero, which no real frame record has (a real record has a
/// non-zero return address), so the walker recognizes it by its first 16 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameMarker {
    /// Always 0.
    pub fp: u64,
    /// Always 0.
    pub lr: u64,
    /// [`FrameMarker::KIND_FINAL`] or [`FrameMarker::KIND_EXCEPTION`].
    pub kind: u64,
    /// The interrupted PC (ELR_EL1), for an exception boundary; 0 otherwise.
    pub pc: u64,
    /// The interrupted x29, for an exception boundary; 0 otherwise.
    pub interrupted_fp: u64,
}

impl FrameMarker {
    /// Kind word of the final frame of a task: the walk ends cleanly.
    pub const KIND_FINAL: u64 = 0;
    /// Kind word of an exception boundary: the walk goes on in the interrupted context.
    pub const KIND_EXCEPTION: u64 = 1;
    /// Bytes the whole marker occupies (all of them must lie in one declared stack).
    pub const SIZE: u64 = core::mem::size_of::<Self>() as u64;
    /// Offset of the kind word.
    pub const KIND_OFFSET: u64 = offset_of!(Self, kind) as u64;
    /// Offset of the interrupted PC.
    pub const PC_OFFSET: u64 = offset_of!(Self, pc) as u64;
    /// Offset of the interrupted x29.
    pub const INTERRUPTED_FP_OFFSET: u64 = offset_of!(Self, interrupted_fp) as u64;

    /// The marker closing a task's chain.
    pub const fn final_frame() -> Self {
        Self { fp: 0, lr: 0, kind: Self::KIND_FINAL, pc: 0, interrupted_fp: 0 }
    }

    /// The marker of an exception taken at `pc` while x29 was `interrupted_fp`.
    pub const fn exception_boundary(pc: u64, interrupted_fp: u64) -> Self {
        Self { fp: 0, lr: 0, kind: Self::KIND_EXCEPTION, pc, interrupted_fp }
    }

    /// The marker as the five words exception entry stores, lowest address first.
    pub const fn to_words(&self) -> [u64; 5] {
        [self.fp, self.lr, self.kind, self.pc, self.interrupted_fp]
    }
}

/// Walks frame records over `memory`, reading only inside `stacks`.
///
/// `stacks` is ordered: the walk may start in any of them but may only move to
/// a stack later in the slice, e.g. `[overflow, irq, task]`. `strip` removes
/// the pointer-authentication code from a signed address (XPACLRI in the
/// kernel, [`crate::strip_pac_va_bits`] in tests).
pub struct FrameWalker<'a, M: ?Sized, S> {
    memory: &'a M,
    stacks: &'a [StackRange],
    strip: S,
    /// The repair and its trampoline address (read once, not per frame).
    repair: Option<(&'a dyn ReturnRepair, u64)>,
}

/// Where the walk is: the stack it is in and the last record it read there.
#[derive(Clone, Copy)]
struct Position {
    stack: usize,
    record: u64,
}

impl<'a, M, S> FrameWalker<'a, M, S>
where
    M: StackMemory + ?Sized,
    S: Fn(u64) -> u64,
{
    /// A walker over `memory` limited to `stacks` (ordered, see the type docs).
    pub fn new(memory: &'a M, stacks: &'a [StackRange], strip: S) -> Self {
        Self { memory, stacks, strip, repair: None }
    }

    /// Reports the real return address where a record holds `repair`'s trampoline.
    pub fn with_repair(mut self, repair: &'a dyn ReturnRepair) -> Self {
        self.repair = Some((repair, repair.trampoline()));
        self
    }

    /// Walks from the frame record at `fp` (x29 of the function whose callers
    /// are wanted). The first entry is the return address saved in that record.
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    pub fn walk_from_frame(&self, fp: u64, options: TraceOptions) -> Trace {
        let mut builder = TraceBuilder::new(options);
        let stop = self.walk_chain(fp, &mut builder);
        builder.finish(stop)
    }

    /// Walks an interrupted context: `pc` (its ELR) first, as an
    /// [`EntryKind::ExceptionPc`], then the chain from its x29 `fp`.
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    pub fn walk_from_context(&self, pc: u64, fp: u64, options: TraceOptions) -> Trace {
        let mut builder = TraceBuilder::new(options);
        let stop = match builder.push((self.strip)(pc), EntryKind::ExceptionPc) {
            Ok(()) => self.walk_chain(fp, &mut builder),
            Err(stop) => stop,
        };
        builder.finish(stop)
    }

    /// The walk proper.
    ///
    /// Terminates on any memory contents: every step either stops or moves to
    /// a strictly higher record in the same stack, or into a stack later in the
    /// declared order, and the stacks are finite, so there are at most
    /// `sum(stack size) / 8` steps, each reading at most five words that all
    /// lie inside the stack of the record being read.
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    fn walk_chain(&self, mut fp: u64, builder: &mut TraceBuilder) -> StopReason {
        let mut position = None;
        loop {
            if fp == 0 {
                return StopReason::NullFramePointer;
            }
            let here = match self.locate(fp, position) {
                Ok(here) => here,
                Err(corruption) => return StopReason::Corrupt { address: fp, corruption },
            };
            let next_fp = or_stop!(self.read(fp));
            let lr = or_stop!(self.read(fp + 8));
            if next_fp == 0 && lr == 0 {
                let (pc, interrupted_fp) = or_stop!(self.read_marker(fp, here.stack));
                or_stop!(builder.push((self.strip)(pc), EntryKind::ExceptionPc));
                fp = interrupted_fp;
            } else {
                let return_address = repaired(self.repair, (self.strip)(lr), Some(fp), 0);
                if return_address == 0 {
                    return StopReason::Corrupt { address: fp, corruption: Corruption::ZeroReturnAddress };
                }
                or_stop!(builder.push(return_address, EntryKind::ReturnAddress));
                fp = next_fp;
            }
            position = Some(here);
        }
    }

    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    #[inline]
    fn read(&self, address: u64) -> Result<u64, StopReason> {
        match self.memory.read_u64(address) {
            Some(word) => Ok(word),
            None => Err(StopReason::Unreadable { address }),
        }
    }

    /// Checks that a record at `fp` may be read from `position`, and where it is.
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    #[inline]
    fn locate(&self, fp: u64, position: Option<Position>) -> Result<Position, Corruption> {
        if fp & 7 != 0 {
            return Err(Corruption::Misaligned);
        }
        let stacks = self.stacks;
        let first_allowed = match position {
            Some(Position { stack, record }) => {
                if stacks[stack].contains(fp, FRAME_RECORD_SIZE) && fp > record {
                    return Ok(Position { stack, record: fp });
                }
                stack + 1
            }
            None => 0,
        };
        let mut index = first_allowed;
        while index < stacks.len() {
            if stacks[index].contains(fp, FRAME_RECORD_SIZE) {
                return Ok(Position { stack: index, record: fp });
            }
            index += 1;
        }
        // Refused: say why.
        if let Some(Position { stack, .. }) = position
            && stacks[stack].contains(fp, FRAME_RECORD_SIZE)
        {
            return Err(Corruption::NotMonotonic);
        }
        let mut index = 0;
        while index < first_allowed {
            if stacks[index].contains(fp, FRAME_RECORD_SIZE) {
                return Err(Corruption::StackOrder);
            }
            index += 1;
        }
        Err(Corruption::OutsideStacks)
    }

    /// Reads the rest of a marker at `fp`: `Err(EndOfTask)` for a final frame,
    /// `Ok((pc, fp))` of the interrupted context for an exception boundary.
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    #[inline]
    fn read_marker(&self, fp: u64, stack: usize) -> Result<(u64, u64), StopReason> {
        if !self.stacks[stack].contains(fp, FrameMarker::SIZE) {
            return Err(StopReason::Corrupt { address: fp, corruption: Corruption::MarkerTruncated });
        }
        match or_stop!(self.read(fp + FrameMarker::KIND_OFFSET), Err) {
            FrameMarker::KIND_FINAL => Err(StopReason::EndOfTask),
            FrameMarker::KIND_EXCEPTION => Ok((
                or_stop!(self.read(fp + FrameMarker::PC_OFFSET), Err),
                or_stop!(self.read(fp + FrameMarker::INTERRUPTED_FP_OFFSET), Err),
            )),
            _ => Err(StopReason::Corrupt { address: fp, corruption: Corruption::UnknownMarkerKind }),
        }
    }
}
