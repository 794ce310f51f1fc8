//! arm64 stack walkers: PAC-aware frame records, the shadow call stack, SFrame tables.
//!
//! Pure logic over a [`StackMemory`] trait: the kernel implements it with
//! plain loads, tests with synthetic (and hostile) memory images. No
//! allocation, no `unsafe`, callable from exception context.
//!
//! # Two walkers, one trace
//!
//! - [`FrameWalker`] follows AAPCS64 frame records `{fp, lr}` from x29.
//! - [`ShadowWalker`] copies the in-use entries of the shadow call stack
//!   (`-Zsanitizer=shadow-call-stack`, x18), newest first.
//!
//! Both write into a buffer the caller provides (`&mut [MaybeUninit<u64>]`:
//! nothing is zeroed, no trace is returned by value), honour
//! [`TraceOptions::skip`] and [`TraceOptions::max_depth`] the same way, and
//! return a small [`Walked`] (entries written, which are exception PCs, and the
//! [`StopReason`]), so the kernel can switch mode at run time and print why a
//! backtrace ended. A buffer shorter than `max_depth` ends the walk with
//! [`StopReason::DepthLimit`] at its length. [`Trace`] is such a buffer with
//! its [`Walked`], for callers that keep or print a trace.
//!
//! Each walker is one loop (`FrameWalker::walk`, `ShadowWalker::walk`), which
//! every caller uses: the kernel's heap, `save_stack`, reports, the timer tick,
//! the benches. The loops keep every check below per frame; what is not needed
//! per frame (which stacks, the trampoline of hijacked returns, the copy's
//! length) is computed once per walk.
//!
//! # What an entry is
//!
//! Kernel code lives in the upper (TTBR1) half. A saved return address is
//! first tested on its raw, still-signed word: bit 55 clear means zero, the SCS
//! end magic or a TTBR0 value, none of which is a kernel return address
//! ([`Corruption::ZeroReturnAddress`], [`StopReason::ShadowZeroEntry`],
//! [`Corruption::EndMagicInUse`], [`Corruption::LowerHalfAddress`]; a frame
//! record of two zeros is a marker, below). Then its PAC is stripped by the
//! [`AddressLayout`]: one `orr` of the bits above the VA size (unconditional,
//! because not every saved LR is signed; equal to XPACLRI for kernel code
//! pointers). Entries from frame records and the SCS are **return addresses**, the instruction after the `BL`
//! ([`EntryKind::ReturnAddress`]); the PC of an interrupted context is exact
//! ([`EntryKind::ExceptionPc`]) and may be 0 (a branch to null). A symbolizer
//! looks up `address - 1` for return addresses and `address` for exact PCs.
//!
//! # Frame walk invariants
//!
//! The caller declares its stacks as an ordered slice of [`StackRange`], e.g.
//! `[overflow, irq, task]`: the walk may start in any of them and may move
//! only to a stack later in the slice. Each step checks that the record
//! address is 8-aligned, that the 16-byte record lies wholly inside one
//! declared stack, and that within a stack each record is at a strictly
//! higher address than the previous one; and that the saved return address is
//! not zero. Hence:
//!
//! - **Termination**: at most `sum(stack sizes) / 8` steps, on any memory.
//! - **Bounds**: the walker calls [`StackMemory::read_u64`] only for words
//!   inside the stack of the record being read, even if other memory would be
//!   readable.
//!
//! # Exception boundaries: the marker record
//!
//! Exception entry writes a [`FrameMarker`] on the stack and points x29 at
//! it (the walker checks that all 40 bytes lie in one declared stack):
//!
//! | offset | word                                                      |
//! |--------|-----------------------------------------------------------|
//! | 0      | 0 (fp)                                                    |
//! | 8      | 0 (lr)                                                    |
//! | 16     | kind: 0 = final frame of a task, 1 = exception boundary   |
//! | 24     | interrupted PC (ELR_EL1), for kind 1                      |
//! | 32     | interrupted x29, for kind 1                               |
//!
//! Kind 0 ends the walk with [`StopReason::EndOfTask`]. Kind 1 reports the
//! interrupted PC as an [`EntryKind::ExceptionPc`] and continues from the
//! interrupted x29 (which must still obey the order and monotonicity rules).
//! Any other kind is [`Corruption::UnknownMarkerKind`]. The offsets are the
//! constants on [`FrameMarker`], for the kernel's entry code.
//!
//! # Shadow call stack
//!
//! The SCS grows up; x18 points to the next free slot; slot 0 is a task's
//! first real entry and the last slot of the area holds [`SCS_END_MAGIC`],
//! which is never reported. [`ShadowWalker::walk`] checks alignment and
//! `base <= x18 <= end - 8` for each [`ShadowSegment`] and reads only
//! `[base, x18)`; each slot is checked for zero (the end, Zircon's
//! convention), the end magic and TTBR0 values. An interrupted context's segment can follow the current one
//! (IRQ-time traces): its PC is reported first, as the frame walker does.
//!
//! # Where the two differ
//!
//! In a prologue between the SCS push and `mov x29, sp` (and in an epilogue
//! between the `ldp` of x29 and the SCS pop) the SCS trace of an interrupted
//! context has one extra entry; [`view_difference`] tells from the function's
//! instructions whether a PC is in such a window.
//!
//! # SFrame tables
//!
//! [`SFrameWalker`] unwinds by a table of rows (binutils' SFrame v2 format, [`sframe`]) that
//! xtask converts from the compiler's `.eh_frame` after linking: per instruction, the CFA as
//! SP or FP plus an offset and where the return address and the caller's FP are. It writes the
//! same buffer with the same checks (bounds, a strictly rising CFA, alignment, PAC stripping by
//! layout, the final marker, the return-probe repair) and is right in prologues and epilogues,
//! where frame records are not valid. Lookup is a binary search of the function descriptors.
//!
//! # Hijacked returns
//!
//! Return probes replace a function's return address by a trampoline. Given a
//! [`ReturnRepair`] (`with_repair`), both walkers report the real return
//! address instead, matched by the frame record's address or the shadow-stack
//! slot; [`ReturnStack`] is the return-instance stack that answers it. The
//! trampoline's address is read once per walk; the frame walk compares each
//! return address with it (in the same branch as the depth limit), the shadow
//! walk scans the entries it copied, so a caller passes a repair only when a
//! return may be hijacked in the contexts it walks.
//!
//! # The `kernel` feature
//!
//! Builds the walkers with `#[sanitize(kernel_hwaddress = "off")]`
//! ([`FrameWalker::walk_instrumented`] is the same loop without it, to measure
//! what the sanitizer's checks cost an unwinder). Their hot paths avoid core helpers (`?`, iterator adapters, derived `PartialEq`)
//! because LLVM does not inline instrumented code into uninstrumented code;
//! checked by building for the kernel target with the sanitizer in outline
//! mode: no `__hwasan_*` call is left in the walkers. The kernel's
//! [`StackMemory`] implementation and strip function should be exempt too.
#![cfg_attr(not(test), no_std)]
#![cfg_attr(feature = "kernel", feature(sanitize))]
#![deny(clippy::undocumented_unsafe_blocks)]

/// `?` without the `Try` trait. With the `kernel` feature the walkers are not
/// instrumented, and LLVM does not inline instrumented code (core's
/// `Try::branch`, iterator adapters, derived `PartialEq`) into uninstrumented
/// code: each such helper would stay an out-of-line, instrumented call. So the
/// hot paths use only built-in operations and this macro.
macro_rules! or_stop {
    ($result:expr) => {
        match $result {
            Ok(value) => value,
            Err(stop) => return stop,
        }
    };
    ($result:expr, Err) => {
        match $result {
            Ok(value) => value,
            Err(stop) => return Err(stop),
        }
    };
}

mod frame;
mod pac;
mod prologue;
mod repair;
pub mod sframe;
mod sframe_walk;
mod shadow;
mod stack;
mod trace;

#[cfg(test)]
mod tests;

pub use frame::{FRAME_RECORD_SIZE, FrameMarker, FrameStart, FrameWalker};
pub use pac::{AddressLayout, UPPER_HALF_BIT, strip_pac_va_bits};
pub use prologue::{SCS_POP, SCS_PUSH, ViewDifference, view_difference};
pub use repair::{HijackedReturn, ReturnRepair, ReturnStack, ReturnStackFull};
pub use sframe::{CfaBase, RowLookup, SFrameTable, TableError, UnwindRow};
pub use sframe_walk::{ExceptionFrameLayout, Registers, SFrameStart, SFrameWalker};
pub use shadow::{SCS_END_MAGIC, ShadowSegment, ShadowStack, ShadowWalker};
pub use stack::{StackKind, StackMemory, StackRange, StackSet};
pub use trace::{Corruption, EntryKind, MAX_FRAMES, StopReason, Trace, TraceEntry, TraceOptions, Walked};
