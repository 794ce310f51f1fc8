//! The trace both walkers produce: entries, options, and why the walk stopped.

use core::fmt;

/// Most entries a [`Trace`] holds (the stack depot's record limit too).
pub const MAX_FRAMES: usize = 64;

/// How much of a walk to keep.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceOptions {
    /// Entries to drop from the newest end (the walker's own callers, usually).
    pub skip: usize,
    /// Entries to keep after skipping; clamped to [`MAX_FRAMES`].
    pub max_depth: usize,
}

impl TraceOptions {
    /// Keep everything, up to [`MAX_FRAMES`].
    pub const ALL: Self = Self { skip: 0, max_depth: MAX_FRAMES };

    /// Skip `skip` entries, then keep at most `max_depth`.
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
    /// A corrupted record or pointer at `address`.
    Corrupt {
        /// The frame pointer, marker or shadow-stack pointer at fault.
        address: u64,
        /// What it violated.
        corruption: Corruption,
    },
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
            Self::Unreadable { address } => write!(f, "unreadable at {address:#x}"),
            Self::Corrupt { address, corruption } => {
                write!(f, "corrupted at {address:#x}: {corruption}")
            }
        }
    }
}

/// A stack trace of at most [`MAX_FRAMES`] entries, newest first, with the
/// reason the walk stopped. Fixed size, no allocation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trace {
    addresses: [u64; MAX_FRAMES],
    /// Bit `i` set: entry `i` is an [`EntryKind::ExceptionPc`].
    exception_pcs: u64,
    len: usize,
    stop: StopReason,
}

impl Trace {
    /// An empty trace (stop reason [`StopReason::DepthLimit`] until a walk sets it).
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    pub const fn new() -> Self {
        Self { addresses: [0; MAX_FRAMES], exception_pcs: 0, len: 0, stop: StopReason::DepthLimit }
    }

    /// The addresses, newest first: what the stack depot stores.
    pub fn addresses(&self) -> &[u64] {
        &self.addresses[..self.len]
    }

    /// Number of entries.
    pub const fn len(&self) -> usize {
        self.len
    }

    /// Whether the trace has no entries.
    pub const fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Entry `index` (0 = newest).
    pub fn entry(&self, index: usize) -> Option<TraceEntry> {
        (index < self.len).then(|| TraceEntry {
            address: self.addresses[index],
            kind: if self.exception_pcs & (1 << index) != 0 {
                EntryKind::ExceptionPc
            } else {
                EntryKind::ReturnAddress
            },
        })
    }

    /// All entries, newest first.
    pub fn entries(&self) -> impl Iterator<Item = TraceEntry> + '_ {
        (0..self.len).filter_map(|index| self.entry(index))
    }

    /// Why the walk stopped.
    pub const fn stop_reason(&self) -> StopReason {
        self.stop
    }
}

impl Default for Trace {
    fn default() -> Self {
        Self::new()
    }
}

/// Fills a [`Trace`], applying the options. Shared by both walkers so that
/// skip and depth mean the same in both modes.
pub(crate) struct TraceBuilder {
    trace: Trace,
    to_skip: usize,
    max_depth: usize,
}

impl TraceBuilder {
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    pub(crate) fn new(options: TraceOptions) -> Self {
        Self {
            trace: Trace::new(),
            to_skip: options.skip,
            max_depth: if options.max_depth < MAX_FRAMES { options.max_depth } else { MAX_FRAMES },
        }
    }

    /// Records an entry, or skips it while `skip` lasts. Fails with
    /// [`StopReason::DepthLimit`] when the entry would be kept but the trace is full.
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    #[inline]
    pub(crate) fn push(&mut self, address: u64, kind: EntryKind) -> Result<(), StopReason> {
        if self.to_skip > 0 {
            self.to_skip -= 1;
            return Ok(());
        }
        let index = self.trace.len;
        if index >= self.max_depth {
            return Err(StopReason::DepthLimit);
        }
        self.trace.addresses[index] = address;
        if matches!(kind, EntryKind::ExceptionPc) {
            self.trace.exception_pcs |= 1 << index;
        }
        self.trace.len = index + 1;
        Ok(())
    }

    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    pub(crate) fn finish(mut self, stop: StopReason) -> Trace {
        self.trace.stop = stop;
        self.trace
    }
}
