//! The frame-pointer walker: follows {fp, lr} records across declared stacks.

use core::mem::offset_of;

use core::mem::MaybeUninit;

use crate::pac::AddressLayout;
use crate::repair::ReturnRepair;
use crate::stack::{StackMemory, StackRange, StackSet};
use crate::trace::{Corruption, Sink, StopReason, TraceOptions, Walked};

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
/// a stack later in the slice, e.g. `[overflow, irq, task]`. `layout` strips
/// the pointer-authentication codes of saved return addresses. A [`StackSet`]
/// other than a slice ([`FrameWalker::over`]) is asked for the whole list only
/// when the walk needs more than the first stack's bounds.
pub struct FrameWalker<'a, M: ?Sized, S: ?Sized = [StackRange]> {
    memory: &'a M,
    stacks: &'a S,
    layout: AddressLayout,
    repair: Option<&'a dyn ReturnRepair>,
}

/// Where the walk is: the stack it is in, the last record it read there, and the highest
/// address a record may start at in that stack (`high - 16`).
#[derive(Clone, Copy)]
struct Position {
    stack: usize,
    record: u64,
    last_record: u64,
}

/// Where a frame walk starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameStart {
    /// The frame record at `fp` (x29 of the function whose callers are wanted): the first
    /// entry is the return address saved in it.
    Record(u64),
    /// An interrupted context: its `pc` (ELR) first, as an exception PC, then the chain from
    /// its x29 `fp`.
    Context {
        /// The interrupted PC.
        pc: u64,
        /// The interrupted x29.
        fp: u64,
    },
}

impl<'a, M> FrameWalker<'a, M>
where
    M: StackMemory + ?Sized,
{
    /// A walker over `memory` limited to `stacks` (ordered, see the type docs).
    pub fn new(memory: &'a M, stacks: &'a [StackRange], layout: AddressLayout) -> Self {
        Self { memory, stacks, layout, repair: None }
    }
}

impl<'a, M, S> FrameWalker<'a, M, S>
where
    M: StackMemory + ?Sized,
    S: StackSet + ?Sized,
{
    /// A walker over `memory` limited to the stacks `stacks` declares (see [`StackSet`]).
    pub fn over(memory: &'a M, stacks: &'a S, layout: AddressLayout) -> Self {
        Self { memory, stacks, layout, repair: None }
    }

    /// Reports the real return address where a record holds `repair`'s trampoline.
    pub fn with_repair(mut self, repair: &'a dyn ReturnRepair) -> Self {
        self.repair = Some(repair);
        self
    }

    /// Walks from the frame record at `fp` into `buffer` (see [`FrameStart::Record`]).
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    #[inline]
    pub fn walk_from_frame(&self, fp: u64, options: TraceOptions, buffer: &mut [MaybeUninit<u64>]) -> Walked {
        self.walk(FrameStart::Record(fp), options, buffer)
    }

    /// Walks an interrupted context into `buffer` (see [`FrameStart::Context`]).
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    #[inline]
    pub fn walk_from_context(
        &self,
        pc: u64,
        fp: u64,
        options: TraceOptions,
        buffer: &mut [MaybeUninit<u64>],
    ) -> Walked {
        self.walk(FrameStart::Context { pc, fp }, options, buffer)
    }

    /// The frame walk: what every caller uses. Always inlined, so it is instrumented as its
    /// caller is (the kernel's callers are exempt from the sanitizer).
    ///
    /// With a repair, the loop compares each return address with [`ReturnRepair::trampoline`];
    /// when that is 0 or [`ReturnRepair::graph_trampoline`] is not, with both of
    /// [`ReturnRepair::trampolines`] (one more `ccmp` per frame). A repair whose
    /// `graph_trampoline` is a constant 0 and whose `trampoline` is a loaded word (0 once graph
    /// returns may exist) costs the walk one branch for the graph tracer.
    #[inline(always)]
    pub fn walk(&self, start: FrameStart, options: TraceOptions, buffer: &mut [MaybeUninit<u64>]) -> Walked {
        let Some(repair) = self.repair else {
            return self.frame_records::<false>(start, options, buffer, (0, 0));
        };
        let trampoline = repair.trampoline();
        if trampoline == 0 || repair.graph_trampoline() != 0 {
            return self.frame_records::<true>(start, options, buffer, repair.trampolines());
        }
        self.frame_records::<false>(start, options, buffer, (trampoline, 0))
    }

    /// The same walk, not inlined and compiled with the sanitizer's checks (no `sanitize`
    /// attribute), so that every word the memory implementation reads with plain loads goes
    /// through the compiler's check, as Linux builds its unwinder by default. For measurements
    /// only (bench `kasan-boot`, case `fp-instrumented`).
    #[inline(never)]
    pub fn walk_instrumented(
        &self,
        start: FrameStart,
        options: TraceOptions,
        buffer: &mut [MaybeUninit<u64>],
    ) -> Walked {
        match self.repair {
            Some(repair) => self.frame_records::<true>(start, options, buffer, repair.trampolines()),
            None => self.frame_records::<false>(start, options, buffer, (0, 0)),
        }
    }

    /// The frame-record loop: the only one in the tree.
    ///
    /// Terminates on any memory contents: every step either stops or moves to
    /// a strictly higher record in the same stack, or into a stack later in the
    /// declared order, and the stacks are finite, so there are at most
    /// `sum(stack size) / 8` steps, each reading at most five words that all
    /// lie inside the stack of the record being read.
    ///
    /// Per record, on the fast path: one pair load; bit 55 of the raw LR (zero, a marker,
    /// a TTBR0 value go to the slow path); one `orr` (PAC strip); the trampoline compare
    /// and the depth limit (one branch for both); the store; then alignment, strict
    /// monotonicity and the stack's bound of the next record (one branch for the three).
    /// Everything else (markers, moving to another stack, repairs, corruption reasons) is
    /// on the slow path. The trampoline is read once per walk; `GRAPH` walks compare the graph
    /// tracer's trampoline too (one more `ccmp`).
    #[inline(always)]
    fn frame_records<const GRAPH: bool>(
        &self,
        start: FrameStart,
        options: TraceOptions,
        buffer: &mut [MaybeUninit<u64>],
        (trampoline, graph): (u64, u64),
    ) -> Walked {
        let mut sink = Sink::new(options, buffer);
        let upper = self.layout.upper_bits();
        // 0 never equals a stripped address (its upper bits are set): no repair, no match.
        let trampoline = opaque(trampoline);
        let mut fp = match start {
            FrameStart::Record(fp) => fp,
            FrameStart::Context { pc, fp } => {
                if let Err(stop) = sink.push(self.layout.strip(pc), true) {
                    return sink.finish(stop);
                }
                fp
            }
        };
        let mut here = match self.enter_first(fp) {
            Ok(here) => here,
            Err(stop) => return sink.finish(stop),
        };
        // The hot loop keeps its write position in a pointer; the sink is synced before any
        // slow path that reads or moves it.
        let mut cursor = sink.cursor();
        let mut end = sink.phase_end();
        let mut last_record = here.last_record;
        'walk: loop {
            // A step that needs the slow path leaves with what it found, `fp` still the
            // record it was reading.
            let event =
                match fast_step::<M, GRAPH>(self.memory, fp, upper, (trampoline, graph), &mut cursor, end, last_record)
                {
                    Ok(next) => {
                        fp = next;
                        continue 'walk;
                    }
                    Err(event) => event,
                };
            sink.sync(cursor);
            if let Event::Unreadable = event {
                return sink.finish(self.unreadable(fp));
            }
            // A full phase ends the walk (or starts the next phase) whatever the record holds:
            // the depth limit needs no second read.
            if let Event::RepairOrFull = event
                && sink.dst == sink.end
                && !sink.next_phase()
            {
                return sink.finish(StopReason::DepthLimit);
            }
            // The slow path reads the record again (it was readable, and a walked stack does
            // not change under the walk), so that the fast step hands over no register but `fp`.
            let (next, raw) = match self.memory.read_pair(fp) {
                Some(pair) => pair,
                None => return sink.finish(self.unreadable(fp)),
            };
            let next = match event {
                Event::Unreadable => return sink.finish(self.unreadable(fp)),
                Event::NotKernel => {
                    if raw == 0 && next == 0 {
                        let marker = fp;
                        let interrupted = match self.read_marker(fp, here.stack) {
                            Ok((pc, interrupted)) => interrupted_context(&mut sink, self.layout.strip(pc), interrupted),
                            Err(stop) => Err(stop),
                        };
                        fp = match interrupted {
                            Ok(interrupted) => interrupted,
                            Err(stop) => return sink.finish(stop),
                        };
                        here = match self.enter(fp, Some(Position { record: marker, ..here })) {
                            Ok(here) => here,
                            Err(stop) => return sink.finish(stop),
                        };
                        cursor = sink.cursor();
                        end = sink.phase_end();
                        last_record = here.last_record;
                        continue;
                    }
                    let corruption =
                        if raw == 0 { Corruption::ZeroReturnAddress } else { Corruption::LowerHalfAddress };
                    return sink.finish(StopReason::Corrupt { address: fp, corruption });
                }
                Event::RepairOrFull => {
                    let mut address = raw | upper;
                    if address == trampoline || (GRAPH && address == graph) {
                        address = self.repaired_frame(fp, address);
                    }
                    if sink.dst == sink.end && !sink.next_phase() {
                        return sink.finish(StopReason::DepthLimit);
                    }
                    if let Err(stop) = sink.push(address, false) {
                        return sink.finish(stop);
                    }
                    if !refused_record(next, fp, last_record) {
                        cursor = sink.cursor();
                        end = sink.phase_end();
                        fp = next;
                        continue;
                    }
                    next
                }
                Event::Refused => next,
            };
            here = match self.enter(next, Some(Position { record: fp, ..here })) {
                Ok(here) => here,
                Err(stop) => return sink.finish(stop),
            };
            cursor = sink.cursor();
            end = sink.phase_end();
            last_record = here.last_record;
            fp = next;
        }
    }

    /// The real return address of the record at `fp` that holds a trampoline.
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    #[inline(never)]
    #[cold]
    fn repaired_frame(&self, fp: u64, address: u64) -> u64 {
        match self.repair {
            Some(repair) => repair.repaired_frame(address, fp),
            None => address,
        }
    }

    /// Which word of the record at `fp` could not be read.
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    #[inline(never)]
    #[cold]
    fn unreadable(&self, fp: u64) -> StopReason {
        let address = match self.memory.read_u64(fp) {
            Some(_) => fp + 8,
            None => fp,
        };
        StopReason::Unreadable { address }
    }

    /// The walk's first record: in the first declared stack (the common case, checked here
    /// without asking for the list: alignment and bounds, as [`Self::enter`] would), else
    /// wherever [`Self::enter`] finds it.
    #[inline(always)]
    fn enter_first(&self, fp: u64) -> Result<Position, StopReason> {
        let (low, last_record) = self.stacks.first_records();
        // `low` is never 0, so this also refuses a null fp (which `enter` then names).
        if fp & 7 == 0 && fp >= low && fp <= last_record {
            return Ok(Position { stack: 0, record: fp, last_record });
        }
        self.enter(fp, None)
    }

    /// Checks a record address the fast path refused or has not seen (the start, after a
    /// marker, a move to another stack): null, alignment, bounds, monotonicity, stack order.
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    #[inline(never)]
    fn enter(&self, fp: u64, position: Option<Position>) -> Result<Position, StopReason> {
        if fp == 0 {
            return Err(StopReason::NullFramePointer);
        }
        match self.locate(fp, position) {
            Ok(stack) => {
                Ok(Position { stack, record: fp, last_record: self.stacks.declared()[stack].high - FRAME_RECORD_SIZE })
            }
            Err(corruption) => Err(StopReason::Corrupt { address: fp, corruption }),
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

    /// Checks that a record at `fp` may be read from `position`; the stack it is in.
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    #[inline]
    fn locate(&self, fp: u64, position: Option<Position>) -> Result<usize, Corruption> {
        if fp & 7 != 0 {
            return Err(Corruption::Misaligned);
        }
        let stacks = self.stacks.declared();
        let first_allowed = match position {
            Some(Position { stack, record, .. }) => {
                if stacks[stack].contains(fp, FRAME_RECORD_SIZE) && fp > record {
                    return Ok(stack);
                }
                stack + 1
            }
            None => 0,
        };
        let mut index = first_allowed;
        while index < stacks.len() {
            if stacks[index].contains(fp, FRAME_RECORD_SIZE) {
                return Ok(index);
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
    #[inline(never)]
    fn read_marker(&self, fp: u64, stack: usize) -> Result<(u64, u64), StopReason> {
        // In the first stack (a task's final marker, usually) the bounds come without the list.
        let (low, last_record) = self.stacks.first_records();
        let fits = if stack == 0 && low <= last_record {
            // `fp + 40 <= high`, `high` being `last_record + 16`.
            fp >= low
                && last_record >= FrameMarker::SIZE - FRAME_RECORD_SIZE
                && fp <= last_record - (FrameMarker::SIZE - FRAME_RECORD_SIZE)
        } else {
            self.stacks.declared()[stack].contains(fp, FrameMarker::SIZE)
        };
        if !fits {
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

/// Why a fast step left the fast path (the slow path reads the record again).
#[derive(Clone, Copy)]
enum Event {
    /// The record could not be read.
    Unreadable,
    /// The saved LR's bit 55 is clear: a marker, zero or a TTBR0 value.
    NotKernel,
    /// The (stripped) return address is the trampoline, or the phase is full: nothing written.
    RepairOrFull,
    /// The entry was written; the saved fp is not a record the fast path may follow.
    Refused,
}

/// One record on the fast path: read `{next, lr}` at `fp`, check the LR's bit 55, strip it,
/// check for the trampolines (the graph tracer's only if `GRAPH`) and the phase's end, write it,
/// check `next`. `Ok(next)` to go on.
#[inline(always)]
fn fast_step<M: StackMemory + ?Sized, const GRAPH: bool>(
    memory: &M,
    fp: u64,
    upper: u64,
    (trampoline, graph): (u64, u64),
    cursor: &mut *mut u64,
    end: *mut u64,
    last_record: u64,
) -> Result<u64, Event> {
    let (next, raw) = match memory.read_pair(fp) {
        Some(pair) => pair,
        None => return Err(Event::Unreadable),
    };
    if !AddressLayout::is_upper_half(raw) {
        return Err(Event::NotKernel);
    }
    let address = raw | upper;
    let slow = if GRAPH {
        repair_either_or_depth_limit(address, trampoline, graph, *cursor, end)
    } else {
        repair_or_depth_limit(address, trampoline, *cursor, end)
    };
    if slow {
        return Err(Event::RepairOrFull);
    }
    // SAFETY: cursor < end <= the buffer's end (checked just above).
    unsafe { cursor.write(address) };
    *cursor = cursor.wrapping_add(1);
    if refused_record(next, fp, last_record) {
        return Err(Event::Refused);
    }
    Ok(next)
}

/// Whether a return address needs the slow path: it is the trampoline (`address ==
/// trampoline`) or the phase is full (`cursor == end`). On arm64 one `cmp`, one `ccmp`, one
/// branch: LLVM splits an `|` of two compares into two branches, so the compares are asm (with
/// the branch as an asm goto); elsewhere (host tests) the same test in Rust.
#[inline(always)]
pub(crate) fn repair_or_depth_limit(address: u64, trampoline: u64, cursor: *mut u64, end: *mut u64) -> bool {
    #[cfg(target_arch = "aarch64")]
    {
        // SAFETY: compares registers and branches to the label; no memory, no stack. Reads
        // `address`, `trampoline`, `cursor`, `end`, clobbers only the flags (no
        // `preserves_flags`).
        unsafe {
            core::arch::asm!(
                "cmp {address}, {trampoline}",
                // Not the trampoline: compare the cursor with the end; else Z = 1.
                "ccmp {cursor}, {end}, #4, ne",
                "b.eq {slow}",
                address = in(reg) address,
                trampoline = in(reg) trampoline,
                cursor = in(reg) cursor as usize,
                end = in(reg) end as usize,
                slow = label { return true; },
                options(nomem, nostack)
            )
        };
        false
    }
    #[cfg(not(target_arch = "aarch64"))]
    {
        (address == trampoline) | (cursor == end)
    }
}

/// [`repair_or_depth_limit`] with two trampolines: one `cmp`, two `ccmp`s, one branch.
#[inline(always)]
fn repair_either_or_depth_limit(address: u64, trampoline: u64, graph: u64, cursor: *mut u64, end: *mut u64) -> bool {
    #[cfg(target_arch = "aarch64")]
    {
        // SAFETY: compares registers and branches to the label; no memory, no stack. Reads
        // `address`, both trampolines, `cursor`, `end`, clobbers only the flags.
        unsafe {
            core::arch::asm!(
                "cmp {address}, {trampoline}",
                // Not the first trampoline: compare with the second; else Z = 1.
                "ccmp {address}, {graph}, #4, ne",
                "ccmp {cursor}, {end}, #4, ne",
                "b.eq {slow}",
                address = in(reg) address,
                trampoline = in(reg) trampoline,
                graph = in(reg) graph,
                cursor = in(reg) cursor as usize,
                end = in(reg) end as usize,
                slow = label { return true; },
                options(nomem, nostack)
            )
        };
        false
    }
    #[cfg(not(target_arch = "aarch64"))]
    {
        (address == trampoline) | (address == graph) | (cursor == end)
    }
}

/// Whether the fast path may not follow `next` from the record at `fp`: `next` misaligned,
/// not above `fp` (strict monotonicity), or above `last_record` (the 16-byte record would not
/// fit in the current stack). On arm64 `tst`, two `ccmp`s, one branch (see
/// [`repair_or_depth_limit`] for why asm); elsewhere the same test in Rust.
#[inline(always)]
fn refused_record(next: u64, fp: u64, last_record: u64) -> bool {
    #[cfg(target_arch = "aarch64")]
    {
        // SAFETY: as in repair_or_depth_limit: registers and flags only.
        unsafe {
            core::arch::asm!(
                // Z = 1 if aligned.
                "tst {next}, #7",
                // Aligned: compare with fp; misaligned: NZCV = 0000 (not HI).
                "ccmp {next}, {fp}, #0, eq",
                // Above fp: compare with the last record; else NZCV = 0010 (HI).
                "ccmp {next}, {last}, #2, hi",
                // Accepted (the walk goes on) on LS; refused falls through.
                "b.ls {accepted}",
                next = in(reg) next,
                fp = in(reg) fp,
                last = in(reg) last_record,
                accepted = label { return false; },
                options(nomem, nostack)
            )
        };
        true
    }
    #[cfg(not(target_arch = "aarch64"))]
    {
        (next & 7 != 0) | (next <= fp) | (next > last_record)
    }
}

/// `value`, which the optimizer may no longer treat as a constant: a trampoline address known
/// at build time would otherwise be rematerialized inside the loop (four instructions per
/// frame in the kernel's large code model) instead of staying in a register.
#[inline(always)]
fn opaque(value: u64) -> u64 {
    #[cfg(target_arch = "aarch64")]
    {
        let mut value = value;
        // SAFETY: an empty asm that "changes" one register: no instruction, no memory, no flags.
        unsafe { core::arch::asm!("/* {0} */", inout(reg) value, options(pure, nomem, nostack, preserves_flags)) };
        value
    }
    #[cfg(not(target_arch = "aarch64"))]
    {
        value
    }
}

/// Records an exception boundary's PC; the interrupted x29 to go on from.
#[inline(always)]
fn interrupted_context(sink: &mut Sink, pc: u64, interrupted_fp: u64) -> Result<u64, StopReason> {
    match sink.push(pc, true) {
        Ok(()) => Ok(interrupted_fp),
        Err(stop) => Err(stop),
    }
}
