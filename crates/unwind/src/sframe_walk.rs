//! The SFrame walker: unwinds SP, FP and the return address by an SFrame table's rows.
//!
//! Where the frame walker trusts x29 to point at a frame record, this walker asks the table
//! how the current instruction's frame is laid out, so it is right in prologues and epilogues,
//! where the record is not yet (or no longer) valid. Each step, from a frame's (pc, sp, fp):
//!
//! 1. the row at `pc` (at `pc - 1` for return addresses, which may lie just past a call that
//!    ends its function): none means code without call-frame information, where the walk ends
//!    at a task's final marker (`fp` points at it, as for the frame walker) or stops with
//!    [`StopReason::NoUnwindInfo`];
//! 2. CFA = SP or FP + offset: 16-aligned, inside the stack the walk is in, strictly above the
//!    previous CFA (the first frame's may equal its SP: a leaf with no frame);
//! 3. the return address, from its slot (8-aligned, inside `[sp, cfa)`) or, for the interrupted
//!    frame only, from x30; bit 55 set (zero and lower-half words are refused, as the other
//!    walkers do), PAC stripped by the [`AddressLayout`], repaired if it is a return probe's
//!    or the function-graph tracer's trampoline;
//! 4. the caller's FP from its slot (same checks), or x29 unchanged.
//!
//! The caller's frame is then (return address, CFA, FP). The CFA strictly increases inside one
//! stack, so a walk takes at most `stack size / 16` steps on any memory and any table, and reads
//! memory only inside `[sp, cfa)` of the frame being unwound (plus a marker's 40 bytes, inside
//! the stack, at the end).

use core::mem::MaybeUninit;

use crate::frame::{FRAME_RECORD_SIZE, FrameMarker, repair_or_depth_limit};
use crate::pac::AddressLayout;
use crate::repair::ReturnRepair;
use crate::sframe::{
    CfaBase, PACKED_FP_BASED, PACKED_RECORD, RowLookup, SFrameTable, packed_cfa_offset, packed_record,
};
use crate::stack::{StackMemory, StackRange, StackSet};
use crate::trace::{Corruption, Sink, StopReason, TraceOptions, Walked};

/// The registers a walk starts from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Registers {
    /// The PC.
    pub pc: u64,
    /// SP.
    pub sp: u64,
    /// x29.
    pub fp: u64,
    /// x30 (read only for an interrupted context whose row says the return address is in it).
    pub lr: u64,
}

/// Where an SFrame walk starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SFrameStart {
    /// An interrupted context: its PC first (as an exception PC), then its callers. Its row may
    /// say the return address is still in x30 (a leaf, a prologue or an epilogue).
    Interrupted(Registers),
    /// A call site: `pc` is a return address into the function whose SP and x29 are given (the
    /// walker's caller, say); not reported. The first entry is that function's return address.
    CallSite {
        /// The return address into the function.
        pc: u64,
        /// The function's SP.
        sp: u64,
        /// The function's x29.
        fp: u64,
    },
}

/// Where the kernel's exception frame keeps the interrupted SP and x30, as offsets from its
/// boundary marker (the marker itself holds the interrupted PC and x29): the unwind hint that
/// lets a walk cross from a handler's frames into the interrupted context, whose registers the
/// vectors saved (the vectors themselves have no rows).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExceptionFrameLayout {
    /// Offset of the interrupted SP's word from the marker.
    pub sp: i64,
    /// Offset of the interrupted x30's word from the marker.
    pub lr: i64,
}

/// Walks frames by an [`SFrameTable`] (or a [`RowLookup`] in front of one) over `memory`,
/// reading only inside `stacks`.
pub struct SFrameWalker<'a, M: ?Sized, S: ?Sized = [StackRange], T: ?Sized = SFrameTable<'a>> {
    memory: &'a M,
    stacks: &'a S,
    table: &'a T,
    layout: AddressLayout,
    repair: Option<&'a dyn ReturnRepair>,
    exception_frames: Option<ExceptionFrameLayout>,
}

/// What a frame without a row leads to.
enum NoRow {
    /// The walk ends.
    Stop(StopReason),
    /// An exception boundary: the interrupted context, the marker and the marker's stack.
    Interrupted { registers: Registers, marker: u64, marker_stack: usize },
}

/// One frame being unwound.
#[derive(Clone, Copy)]
struct Frame {
    pc: u64,
    sp: u64,
    fp: u64,
    /// x30, when known (the interrupted frame).
    lr: Option<u64>,
    /// `pc` is exact (look it up as is) rather than a return address (look up `pc - 1`).
    exact: bool,
}

/// What the fast path carries from frame to frame: a return address, its frame's SP and x29.
#[derive(Clone, Copy)]
struct FastFrame {
    pc: u64,
    sp: u64,
    fp: u64,
}

impl<'a, M, T> SFrameWalker<'a, M, [StackRange], T>
where
    M: StackMemory + ?Sized,
    T: RowLookup + ?Sized,
{
    /// A walker over `memory` limited to `stacks`, reading `table`.
    pub fn new(memory: &'a M, stacks: &'a [StackRange], table: &'a T, layout: AddressLayout) -> Self {
        Self { memory, stacks, table, layout, repair: None, exception_frames: None }
    }
}

impl<'a, M, S, T> SFrameWalker<'a, M, S, T>
where
    M: StackMemory + ?Sized,
    S: StackSet + ?Sized,
    T: RowLookup + ?Sized,
{
    /// A walker over `memory` limited to the stacks `stacks` declares (see [`StackSet`]).
    pub fn over(memory: &'a M, stacks: &'a S, table: &'a T, layout: AddressLayout) -> Self {
        Self { memory, stacks, table, layout, repair: None, exception_frames: None }
    }

    /// Crosses exception boundaries: at a marker, the walk goes on in the interrupted context,
    /// its SP and x30 read from the exception frame as `layout` says (without it, the walk
    /// reports the interrupted PC and stops there).
    pub fn with_exception_frames(mut self, layout: ExceptionFrameLayout) -> Self {
        self.exception_frames = Some(layout);
        self
    }

    /// Reports the real return address where a frame holds `repair`'s trampoline.
    pub fn with_repair(mut self, repair: &'a dyn ReturnRepair) -> Self {
        self.repair = Some(repair);
        self
    }

    /// The SFrame walk into `buffer`.
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    pub fn walk(&self, start: SFrameStart, options: TraceOptions, buffer: &mut [MaybeUninit<u64>]) -> Walked {
        let mut sink = Sink::new(options, buffer);
        let upper = self.layout.upper_bits();
        // 0 never equals a stripped address (its upper bits are set): no repair, no match. While
        // graph returns may exist (`graph` not 0) every frame takes the full step, which
        // compares both trampolines; the fast step compares one.
        let (trampoline, graph) = match self.repair {
            Some(repair) => repair.trampolines(),
            None => (0, 0),
        };
        let mut frame = match start {
            SFrameStart::Interrupted(registers) => {
                if let Err(stop) = sink.push(self.layout.strip(registers.pc), true) {
                    return sink.finish(stop);
                }
                Frame { pc: registers.pc, sp: registers.sp, fp: registers.fp, lr: Some(registers.lr), exact: true }
            }
            SFrameStart::CallSite { pc, sp, fp } => Frame { pc, sp, fp, lr: None, exact: false },
        };
        let (mut stack_index, mut stack) = match self.stack_of(frame.sp) {
            Some(found) => found,
            None => {
                return sink.finish(StopReason::Corrupt { address: frame.sp, corruption: Corruption::OutsideStacks });
            }
        };
        if frame.sp & 15 != 0 {
            return sink.finish(StopReason::Corrupt { address: frame.sp, corruption: Corruption::Misaligned });
        }
        // The first frame's CFA may equal its SP (a leaf without a frame); every later one must
        // be strictly above the previous CFA, which is that frame's SP.
        let mut floor = frame.sp;
        loop {
            // Return-address frames go through the fast step first; the frame it refuses (a row
            // it does not cover, a check that fails, the trampoline, a full phase) is taken
            // again by the full step below, which says why it stops or moves on.
            if !frame.exact && graph == 0 {
                let start = FastFrame { pc: frame.pc, sp: frame.sp, fp: frame.fp };
                let (fast, cursor) = fast_frames(
                    self.memory,
                    self.table,
                    start,
                    FastBounds { high: stack.high, upper, trampoline, end: sink.phase_end() },
                    sink.cursor(),
                );
                if cursor != sink.cursor() {
                    sink.sync(cursor);
                    frame = Frame { pc: fast.pc, sp: fast.sp, fp: fast.fp, lr: None, exact: false };
                    floor = fast.sp + 1;
                }
            }
            let lookup = if frame.exact { frame.pc } else { frame.pc.wrapping_sub(1) };
            let row = match self.table.find(lookup) {
                Ok(Some(row)) => row,
                Ok(None) => match self.no_row(&mut sink, &frame, stack_index) {
                    NoRow::Stop(stop) => return sink.finish(stop),
                    NoRow::Interrupted { registers, marker, marker_stack } => {
                        // The interrupted context is in the marker's stack above its exception
                        // frame, or in a stack later in the walk's order: each crossing moves up
                        // or on, so crossings end.
                        let corrupt = |corruption| StopReason::Corrupt { address: registers.sp, corruption };
                        let (index, range) = match self.stack_of(registers.sp) {
                            Some(found) => found,
                            None => return sink.finish(corrupt(Corruption::OutsideStacks)),
                        };
                        if index < marker_stack || (index == marker_stack && registers.sp <= marker) {
                            return sink.finish(corrupt(Corruption::NotMonotonic));
                        }
                        if registers.sp & 15 != 0 {
                            return sink.finish(corrupt(Corruption::Misaligned));
                        }
                        (stack_index, stack) = (index, range);
                        floor = registers.sp;
                        frame = Frame {
                            pc: registers.pc,
                            sp: registers.sp,
                            fp: registers.fp,
                            lr: Some(registers.lr),
                            exact: true,
                        };
                        continue;
                    }
                },
                Err(_) => {
                    return sink.finish(StopReason::Corrupt { address: frame.pc, corruption: Corruption::UnwindTable });
                }
            };
            let base = match row.cfa_base {
                CfaBase::StackPointer => frame.sp,
                CfaBase::FramePointer => frame.fp,
            };
            let cfa = base.wrapping_add(row.cfa_offset as i64 as u64);
            if cfa < floor || cfa > stack.high {
                return sink.finish(StopReason::Corrupt { address: cfa, corruption: Corruption::CfaNotMonotonic });
            }
            if cfa & 15 != 0 {
                return sink.finish(StopReason::Corrupt { address: cfa, corruption: Corruption::Misaligned });
            }
            let raw = match row.ra_offset {
                Some(offset) => or_stop!(self.read_slot(&sink, &frame, cfa, offset)),
                None => match frame.lr {
                    Some(lr) => lr,
                    None => {
                        return sink.finish(StopReason::Corrupt {
                            address: cfa,
                            corruption: Corruption::ReturnAddressInRegister,
                        });
                    }
                },
            };
            if !AddressLayout::is_upper_half(raw) {
                let corruption = if raw == 0 { Corruption::ZeroReturnAddress } else { Corruption::LowerHalfAddress };
                return sink.finish(StopReason::Corrupt { address: cfa, corruption });
            }
            let mut address = raw | upper;
            if address == trampoline || address == graph {
                address = self.repaired(cfa, address);
            }
            let fp = match row.fp_offset {
                Some(offset) => or_stop!(self.read_slot(&sink, &frame, cfa, offset)),
                None => frame.fp,
            };
            if let Err(stop) = sink.push(address, false) {
                return sink.finish(stop);
            }
            // Strictly above from here on: `cfa + 1` cannot overflow, `cfa <= stack.high`.
            floor = cfa + 1;
            frame = Frame { pc: address, sp: cfa, fp, lr: None, exact: false };
        }
    }

    /// Reads the slot at `cfa + offset` of `frame`: 8-aligned, inside `[sp, cfa)`. Always
    /// inlined into the (exempt) walk.
    #[inline(always)]
    fn read_slot(&self, sink: &Sink, frame: &Frame, cfa: u64, offset: i32) -> Result<u64, Walked> {
        let slot = cfa.wrapping_add(offset as i64 as u64);
        if offset >= 0 || slot < frame.sp || slot & 7 != 0 {
            return Err(sink.finish(StopReason::Corrupt { address: slot, corruption: Corruption::SlotOutsideFrame }));
        }
        match self.memory.read_u64(slot) {
            Some(word) => Ok(word),
            None => Err(sink.finish(StopReason::Unreadable { address: slot })),
        }
    }

    /// The real return address of the frame whose CFA is `cfa` (a kretprobe's or the graph
    /// tracer's trampoline, or a chain of both): the return instance whose entry SP is that CFA
    /// (the hijacked function's SP at entry), asked as the frame walker asks for a record
    /// inside that function's frame.
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    #[inline(never)]
    #[cold]
    fn repaired(&self, cfa: u64, address: u64) -> u64 {
        match self.repair {
            Some(repair) => repair.repaired_frame(address, cfa - FRAME_RECORD_SIZE),
            None => address,
        }
    }

    /// The stack holding `sp` (`low <= sp <= high`: an empty stack's SP is its top), and its
    /// index in the declared order.
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    fn stack_of(&self, sp: u64) -> Option<(usize, StackRange)> {
        let (low, last_record) = self.stacks.first_records();
        if sp >= low && low <= last_record && sp <= last_record + FRAME_RECORD_SIZE {
            return Some((0, self.stacks.declared()[0]));
        }
        let stacks = self.stacks.declared();
        let mut index = 0;
        while index < stacks.len() {
            if stacks[index].low != 0 && sp >= stacks[index].low && sp <= stacks[index].high {
                return Some((index, stacks[index]));
            }
            index += 1;
        }
        None
    }

    /// The stack, from `first` on in the declared order, holding the `size` bytes at `address`.
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    fn holding(&self, first: usize, address: u64, size: u64) -> Option<(usize, StackRange)> {
        let stacks = self.stacks.declared();
        let mut index = first;
        while index < stacks.len() {
            if stacks[index].contains(address, size) {
                return Some((index, stacks[index]));
            }
            index += 1;
        }
        None
    }

    /// No row covers `frame.pc`: the end of a task if x29 points at a final marker (the task's
    /// first function was called from its trampoline, as for the frame walker); at an exception
    /// marker the interrupted PC, then (with an [`ExceptionFrameLayout`]) the interrupted
    /// context to walk on; otherwise code without unwind information. The marker is in the
    /// frame's stack at or above its SP, or in a stack later in the declared order (a handler
    /// on the IRQ stack, its exception frame on the interrupted task's).
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    #[inline(never)]
    fn no_row(&self, sink: &mut Sink, frame: &Frame, stack_index: usize) -> NoRow {
        let marker = frame.fp;
        let no_info = NoRow::Stop(StopReason::NoUnwindInfo { pc: frame.pc });
        if marker & 7 != 0 {
            return no_info;
        }
        let (marker_stack, range) = match self.holding(stack_index, marker, FrameMarker::SIZE) {
            Some(found) => found,
            None => return no_info,
        };
        if marker_stack == stack_index && marker < frame.sp {
            return no_info;
        }
        match self.memory.read_pair(marker) {
            Some((0, 0)) => {}
            _ => return no_info,
        }
        match self.memory.read_u64(marker + FrameMarker::KIND_OFFSET) {
            Some(FrameMarker::KIND_FINAL) => NoRow::Stop(StopReason::EndOfTask),
            Some(FrameMarker::KIND_EXCEPTION) => {
                let pc = match self.memory.read_u64(marker + FrameMarker::PC_OFFSET) {
                    Some(pc) => pc,
                    None => return NoRow::Stop(StopReason::Unreadable { address: marker + FrameMarker::PC_OFFSET }),
                };
                if let Err(reason) = sink.push(self.layout.strip(pc), true) {
                    return NoRow::Stop(reason);
                }
                let Some(layout) = self.exception_frames else {
                    return NoRow::Stop(StopReason::ExceptionBoundary);
                };
                let read = |address: u64| {
                    if address & 7 != 0 || !range.contains(address, 8) {
                        return Err(StopReason::Corrupt { address, corruption: Corruption::MarkerTruncated });
                    }
                    match self.memory.read_u64(address) {
                        Some(word) => Ok(word),
                        None => Err(StopReason::Unreadable { address }),
                    }
                };
                let words = (
                    read(marker + FrameMarker::INTERRUPTED_FP_OFFSET),
                    read(marker.wrapping_add(layout.sp as u64)),
                    read(marker.wrapping_add(layout.lr as u64)),
                );
                match words {
                    (Ok(fp), Ok(sp), Ok(lr)) => {
                        NoRow::Interrupted { registers: Registers { pc, sp, fp, lr }, marker, marker_stack }
                    }
                    (Err(reason), _, _) | (_, Err(reason), _) | (_, _, Err(reason)) => NoRow::Stop(reason),
                }
            }
            Some(_) => NoRow::Stop(StopReason::Corrupt { address: marker, corruption: Corruption::UnknownMarkerKind }),
            None => NoRow::Stop(StopReason::Unreadable { address: marker + FrameMarker::KIND_OFFSET }),
        }
    }
}

/// What the fast path checks against, fixed for a run of fast frames: the stack's top, the
/// PAC-stripping bits, the trampoline of hijacked returns and where the phase ends.
#[derive(Clone, Copy)]
struct FastBounds {
    high: u64,
    upper: u64,
    trampoline: u64,
    end: *mut u64,
}

/// Frames on the fast path from `frame` (a return address, its frame's SP and x29), each: the
/// packed row (one cache load in the kernel) saving RA and FP as a frame record, CFA above SP,
/// at most the stack's top and 16-aligned, the record at or above SP (it ends at or below the
/// CFA by construction) read in one pair, the RA's bit 55, PAC stripped, not the trampoline and
/// room in the phase; the entry is written at `cursor` and the caller's frame is next. Returns
/// the first frame it refused, for the full step, and the cursor past the entries it wrote.
///
/// Out of line, so that the loop's state lives in registers and the lookup's fields are loaded
/// once (the references are arguments, which the buffer's stores cannot alias).
#[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
#[inline(never)]
fn fast_frames<M, T>(
    memory: &M,
    table: &T,
    frame: FastFrame,
    bounds: FastBounds,
    mut cursor: *mut u64,
) -> (FastFrame, *mut u64)
where
    M: StackMemory + ?Sized,
    T: RowLookup + ?Sized,
{
    // A packed record is at most 2064 bytes below the CFA: with SP (and so every CFA above it)
    // at 2064 or more, it cannot wrap.
    if frame.sp < 2064 {
        return (frame, cursor);
    }
    let (mut pc, mut sp, mut fp) = (frame.pc, frame.sp, frame.fp);
    loop {
        let packed = table.find_packed(pc.wrapping_sub(1));
        // Also refuses 0 (no packed row).
        if packed & PACKED_RECORD == 0 {
            break;
        }
        let base = if packed & PACKED_FP_BASED != 0 { fp } else { sp };
        let cfa = base.wrapping_add(packed_cfa_offset(packed));
        if cfa & 15 != 0 || cfa <= sp || cfa > bounds.high {
            break;
        }
        // `cfa > sp >= 2064`: no wrap, so the record is in `[sp, cfa)` once at or above SP.
        let record = packed_record(packed, cfa);
        if record < sp {
            break;
        }
        let (caller_fp, raw) = match memory.read_pair(record) {
            Some(pair) => pair,
            None => break,
        };
        if !AddressLayout::is_upper_half(raw) {
            break;
        }
        let address = raw | bounds.upper;
        if repair_or_depth_limit(address, bounds.trampoline, cursor, bounds.end) {
            break;
        }
        // SAFETY: cursor < end <= the buffer's end (checked just above).
        unsafe { cursor.write(address) };
        cursor = cursor.wrapping_add(1);
        pc = address;
        sp = cfa;
        fp = caller_fp;
    }
    (FastFrame { pc, sp, fp }, cursor)
}
