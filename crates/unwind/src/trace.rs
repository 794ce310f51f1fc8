//! The trace both walkers produce: entries, options, and why the walk stopped.

use core::fmt;
use core::mem::MaybeUninit;

/// Most entries a [`Trace`] holds (the stack depot's record limit too).
pub const MAX_FRAMES: usize = 64;

/// How much of a walk to keep.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceOptions {
    /// Entries to drop from the newest end (the walker's own callers, usually).
    pub skip: usize,
    /// Entries to keep after skipping; clamped to [`MAX_FRAMES`] and to the caller's buffer.
    pub max_depth: usize,
}

impl TraceOptions {
    /// Keep everything, up to [`MAX_FRAMES`].
    pub const ALL: Self = Self { skip: 0, max_depth: MAX_FRAMES };

    /// Skip `skip` entries, then keep at most `max_depth`.
    #[inline(always)]
    pub const fn new(skip: usize, max_depth: usize) -> Self {
        Self { skip, max_depth }
    }
}

impl Default for TraceOptions {
    fn default() -> Self {
        Self::ALL
    }
}

/// What an entry's address means.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EntryKind {
    /// A PAC-stripped return address: the instruction after the `BL`, so the
    /// call site is `address - 4`. Symbolize `address - 1` to stay inside the
    /// calling function when the call is its last instruction.
    ReturnAddress,
    /// The exact PC of an interrupted context (ELR of an exception boundary,
    /// or the PC a walk was started from): the instruction that was about to run.
    ExceptionPc,
}

/// One entry of a trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TraceEntry {
    /// The address (PAC-stripped).
    pub address: u64,
    /// Whether it is a return address or an exact PC.
    pub kind: EntryKind,
}

/// What a record was found to violate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Corruption {
    /// A frame pointer or shadow-stack pointer not 8-aligned.
    Misaligned,
    /// A frame record not wholly inside any declared stack still allowed.
    OutsideStacks,
    /// A frame pointer that does not move to a strictly higher address within a stack.
    NotMonotonic,
    /// A frame pointer back into a stack that the walk already left.
    StackOrder,
    /// A frame record with a zero return address but a non-zero frame pointer.
    ZeroReturnAddress,
    /// A marker record whose 40 bytes do not fit in its stack.
    MarkerTruncated,
    /// A marker record whose kind word is neither final (0) nor exception (1).
    UnknownMarkerKind,
    /// A shadow-stack pointer outside `[base, end - 8]`, or a bad shadow stack.
    ShadowPointerOutOfBounds,
    /// The shadow stack's end magic found among the in-use entries.
    EndMagicInUse,
    /// A saved return address in the lower (TTBR0, bit 55 clear) half: kernel code is in the
    /// upper half, so a frame record or shadow-stack slot holding one is not a kernel return.
    LowerHalfAddress,
    /// A CFA that does not move to a strictly higher address (the first frame's may equal SP),
    /// or that leaves the stack the walk is in.
    CfaNotMonotonic,
    /// A saved-register slot outside the frame it belongs to (below SP or at or above the CFA).
    SlotOutsideFrame,
    /// A caller's row says its return address is still in x30 (only the interrupted frame's
    /// x30 is known).
    ReturnAddressInRegister,
    /// The unwind table's entry for this PC is corrupt.
    UnwindTable,
}

/// Why a walk stopped. Every walk ends with exactly one reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StopReason {
    /// The final-frame marker of a task: the frame walk is complete.
    EndOfTask,
    /// A zero frame pointer where a record was expected (a chain not closed
    /// by a marker, e.g. early boot): complete as far as anyone can tell.
    NullFramePointer,
    /// Every in-use shadow-stack entry of every segment was copied.
    EndOfShadowStack,
    /// A zero shadow-stack entry (Zircon's convention for the oldest frame).
    ShadowZeroEntry,
    /// The trace filled up (`max_depth`); older frames may exist.
    DepthLimit,
    /// The memory-access trait could not read `address`.
    Unreadable {
        /// The word that could not be read.
        address: u64,
    },
    /// No unwind row covers `pc` (code without call-frame information: hand-written assembly),
    /// and its frame is not the end of a task.
    NoUnwindInfo {
        /// The PC (an exact PC or a return address) no row covers.
        pc: u64,
    },
    /// An exception boundary: the interrupted PC was reported, but the unwind table does not
    /// describe the exception frame, so the interrupted context's SP is unknown.
    ExceptionBoundary,
    /// A corrupted record or pointer at `address`.
    Corrupt {
        /// The frame pointer, marker or shadow-stack pointer at fault.
        address: u64,
        /// What it violated.
        corruption: Corruption,
    },
    /// The build has no frame pointers (x29 is an ordinary register): a frame-record walk
    /// was refused, not attempted. Nothing was read.
    NoFramePointers,
}

impl StopReason {
    /// Whether the walk reached the natural end of the stack(s).
    pub const fn is_complete(&self) -> bool {
        matches!(self, Self::EndOfTask | Self::NullFramePointer | Self::EndOfShadowStack | Self::ShadowZeroEntry)
    }
}

impl fmt::Display for Corruption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Misaligned => "misaligned pointer",
            Self::OutsideStacks => "record outside the stacks",
            Self::NotMonotonic => "frame pointer not moving up",
            Self::StackOrder => "frame pointer back into a stack already left",
            Self::ZeroReturnAddress => "zero return address",
            Self::MarkerTruncated => "marker record truncated by the stack end",
            Self::UnknownMarkerKind => "unknown marker kind",
            Self::ShadowPointerOutOfBounds => "shadow stack pointer out of bounds",
            Self::EndMagicInUse => "shadow stack end magic in use",
            Self::LowerHalfAddress => "return address in the lower (TTBR0) half",
            Self::CfaNotMonotonic => "CFA not moving up",
            Self::SlotOutsideFrame => "saved register outside its frame",
            Self::ReturnAddressInRegister => "caller's return address still in x30",
            Self::UnwindTable => "corrupted unwind table",
        })
    }
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::EndOfTask => f.write_str("end of task"),
            Self::NullFramePointer => f.write_str("null frame pointer"),
            Self::EndOfShadowStack => f.write_str("end of shadow stack"),
            Self::ShadowZeroEntry => f.write_str("zero shadow stack entry"),
            Self::DepthLimit => f.write_str("depth limit"),
            Self::NoUnwindInfo { pc } => write!(f, "no unwind information for {pc:#x}"),
            Self::ExceptionBoundary => f.write_str("exception boundary (interrupted frame not described)"),
            Self::Unreadable { address } => write!(f, "unreadable at {address:#x}"),
            Self::Corrupt { address, corruption } => {
                write!(f, "corrupted at {address:#x}: {corruption}")
            }
            Self::NoFramePointers => f.write_str("refused: this build has no frame pointers"),
        }
    }
}

/// What a walk wrote into the caller's buffer: `len` entries from index 0, newest first.
///
/// Small and returned in registers or one stack slot: the addresses themselves are never
/// copied, the walkers write them where the caller wants them (no zeroing, no trace by value).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Walked {
    /// Entries written (and initialised) at the start of the buffer.
    pub len: usize,
    /// Bit `i` set: entry `i` is an [`EntryKind::ExceptionPc`].
    pub exception_pcs: u64,
    /// Why the walk stopped.
    pub stop: StopReason,
}

impl Walked {
    /// The entries the walk initialised in `buffer` (the buffer it was given).
    #[inline(always)]
    pub fn entries<'b>(&self, buffer: &'b [MaybeUninit<u64>]) -> &'b [u64] {
        let len = if self.len < buffer.len() { self.len } else { buffer.len() };
        // SAFETY: a walk initialises entries 0..len of the buffer it is given (clamped above
        // for a buffer other than the one walked), and MaybeUninit<u64> has u64's layout.
        unsafe { &*core::ptr::slice_from_raw_parts(buffer.as_ptr().cast::<u64>(), len) }
    }
}

/// A stack trace of at most [`MAX_FRAMES`] entries, newest first, with the reason the walk
/// stopped: a caller-owned buffer that a walk fills in place ([`Trace::fill`]), for callers that
/// keep or print a trace. Creating one writes nothing to the buffer.
#[derive(Clone)]
pub struct Trace {
    addresses: [MaybeUninit<u64>; MAX_FRAMES],
    walked: Walked,
}

impl Trace {
    /// An empty trace (stop reason [`StopReason::DepthLimit`] until a walk sets it).
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    pub const fn new() -> Self {
        Self {
            addresses: [MaybeUninit::uninit(); MAX_FRAMES],
            walked: Walked { len: 0, exception_pcs: 0, stop: StopReason::DepthLimit },
        }
    }

    /// Runs `walk` on this trace's buffer and keeps what it reports.
    #[inline(always)]
    pub fn fill(&mut self, walk: impl FnOnce(&mut [MaybeUninit<u64>]) -> Walked) -> &mut Self {
        let walked = walk(&mut self.addresses);
        self.walked = Walked { len: if walked.len < MAX_FRAMES { walked.len } else { MAX_FRAMES }, ..walked };
        self
    }

    /// The addresses, newest first: what the stack depot stores.
    pub fn addresses(&self) -> &[u64] {
        self.walked.entries(&self.addresses)
    }

    /// Number of entries.
    pub const fn len(&self) -> usize {
        self.walked.len
    }

    /// Whether the trace has no entries.
    pub const fn is_empty(&self) -> bool {
        self.walked.len == 0
    }

    /// Entry `index` (0 = newest).
    pub fn entry(&self, index: usize) -> Option<TraceEntry> {
        let address = *self.addresses().get(index)?;
        let kind = if self.walked.exception_pcs & (1 << index) != 0 {
            EntryKind::ExceptionPc
        } else {
            EntryKind::ReturnAddress
        };
        Some(TraceEntry { address, kind })
    }

    /// All entries, newest first.
    pub fn entries(&self) -> impl Iterator<Item = TraceEntry> + '_ {
        (0..self.len()).filter_map(|index| self.entry(index))
    }

    /// Why the walk stopped.
    pub const fn stop_reason(&self) -> StopReason {
        self.walked.stop
    }
}

impl Default for Trace {
    fn default() -> Self {
        Self::new()
    }
}

impl PartialEq for Trace {
    fn eq(&self, other: &Self) -> bool {
        self.addresses() == other.addresses() && self.walked == other.walked
    }
}

impl Eq for Trace {}

impl fmt::Debug for Trace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Trace").field("addresses", &self.addresses()).field("walked", &self.walked).finish()
    }
}

/// Where walkers write entries: the caller's buffer, with skipping and the depth limit.
///
/// Skipped entries are written too, into the start of the buffer, and overwritten once the
/// skip is used up: so the hot loops have one bound (`end`) and no skip test per entry.
pub(crate) struct Sink {
    base: *mut u64,
    /// Next index to write.
    pub(crate) dst: usize,
    /// Where the current phase ends: the skip's remainder (while skipping) or the depth limit.
    pub(crate) end: usize,
    /// Entries that may be kept: `min(max_depth, buffer length, MAX_FRAMES)`.
    limit: usize,
    /// Entries still to skip once the current phase ends (the phase itself counts `end`).
    skipping: bool,
    skip_after: usize,
    exception_pcs: u64,
}

impl Sink {
    #[inline(always)]
    pub(crate) fn new(options: TraceOptions, buffer: &mut [MaybeUninit<u64>]) -> Self {
        let mut limit = if options.max_depth < MAX_FRAMES { options.max_depth } else { MAX_FRAMES };
        if buffer.len() < limit {
            limit = buffer.len();
        }
        let mut sink = Self {
            base: buffer.as_mut_ptr().cast::<u64>(),
            dst: 0,
            end: limit,
            limit,
            skipping: false,
            skip_after: 0,
            exception_pcs: 0,
        };
        if options.skip > 0 {
            sink.start_skip(options.skip);
        }
        sink
    }

    /// Starts (or goes on) skipping `skip` entries into the buffer's first slots.
    #[inline(always)]
    fn start_skip(&mut self, skip: usize) {
        self.dst = 0;
        if skip == 0 {
            self.skipping = false;
            self.end = self.limit;
        } else if skip <= self.limit {
            self.skipping = true;
            self.end = skip;
            self.skip_after = 0;
        } else {
            self.skipping = true;
            self.end = self.limit;
            self.skip_after = skip - self.limit;
        }
    }

    /// Called when `dst == end`: true if the walk may go on (a skipping phase ended), false
    /// when an entry would be kept in a full buffer (the depth limit).
    #[inline(always)]
    pub(crate) fn next_phase(&mut self) -> bool {
        if !self.skipping || self.limit == 0 {
            return false;
        }
        self.start_skip(self.skip_after);
        true
    }

    /// Writes `address` at `dst` (the caller checked `dst < end`).
    #[inline(always)]
    pub(crate) fn write(&mut self, address: u64) {
        // SAFETY: dst < end <= limit <= the buffer's length.
        unsafe { self.base.add(self.dst).write(address) };
        self.dst += 1;
    }

    /// Records `address` (for an exception PC: `exact`), moving to the next phase if needed.
    #[inline(always)]
    pub(crate) fn push(&mut self, address: u64, exact: bool) -> Result<(), StopReason> {
        if self.dst == self.end && !self.next_phase() {
            return Err(StopReason::DepthLimit);
        }
        if exact && !self.skipping {
            self.exception_pcs |= 1 << self.dst;
        }
        self.write(address);
        Ok(())
    }

    /// Where the next entry goes, for a hot loop that writes through a pointer.
    #[inline(always)]
    pub(crate) fn cursor(&self) -> *mut u64 {
        self.base.wrapping_add(self.dst)
    }

    /// Where the current phase ends, as a pointer (see [`Self::cursor`]).
    #[inline(always)]
    pub(crate) fn phase_end(&self) -> *mut u64 {
        self.base.wrapping_add(self.end)
    }

    /// Takes back a hot loop's cursor (a pointer from [`Self::cursor`], advanced by the
    /// entries it wrote, never past [`Self::phase_end`]).
    #[inline(always)]
    pub(crate) fn sync(&mut self, cursor: *mut u64) {
        self.dst = (cursor as usize - self.base as usize) / 8;
    }

    /// The buffer's start (for a repair after a copy).
    #[inline(always)]
    pub(crate) fn base(&self) -> *mut u64 {
        self.base
    }

    /// Whether entries are being kept (not skipped).
    #[inline(always)]
    pub(crate) fn keeping(&self) -> bool {
        !self.skipping
    }

    /// The walk's result: kept entries only (a walk that ended while skipping kept none).
    #[inline(always)]
    pub(crate) fn finish(&self, stop: StopReason) -> Walked {
        let len = if self.skipping { 0 } else { self.dst };
        Walked { len, exception_pcs: self.exception_pcs, stop }
    }
}
