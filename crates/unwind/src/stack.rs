//! The stacks a walk may read: the memory-access trait and declared ranges.

/// Read access to the memory that holds stacks.
///
/// The kernel implements it with plain loads (mark that implementation
/// `#[sanitize(kernel_hwaddress = "off")]` too: stack words are not tagged
/// objects, and the walkers are exempt for speed); tests implement
/// it over synthetic memory images. The walkers call it only for addresses whose
/// 8 bytes lie inside a declared stack, so an implementation may assume that but
/// must not rely on it for memory safety: returning `None` stops the walk.
pub trait StackMemory {
    /// Reads the 64-bit word at `address` (8-aligned), or `None` if unreadable.
    fn read_u64(&self, address: u64) -> Option<u64>;

    /// Reads the 16 bytes at `address` (8-aligned) as two words: a frame record `{fp, lr}`.
    /// The default reads them one by one; an implementation with plain loads lets the
    /// compiler make one `ldp` of them.
    #[inline(always)]
    #[allow(clippy::manual_map, reason = "`Option::map` is a core helper the uninstrumented walkers would not inline")]
    fn read_pair(&self, address: u64) -> Option<(u64, u64)> {
        match self.read_u64(address) {
            Some(first) => match self.read_u64(address + 8) {
                Some(second) => Some((first, second)),
                None => None,
            },
            None => None,
        }
    }

    /// Moves `*slot` down one word and reads the word there: the shadow-stack copy's step
    /// (newest first). The default is `read_u64(*slot - 8)`; a kernel implementation can make
    /// it one pre-indexed load.
    #[inline(always)]
    fn read_below(&self, slot: &mut u64) -> Option<u64> {
        *slot -= 8;
        self.read_u64(*slot)
    }
}

impl<M: StackMemory + ?Sized> StackMemory for &M {
    #[inline(always)]
    fn read_u64(&self, address: u64) -> Option<u64> {
        (**self).read_u64(address)
    }

    #[inline(always)]
    fn read_pair(&self, address: u64) -> Option<(u64, u64)> {
        (**self).read_pair(address)
    }

    #[inline(always)]
    fn read_below(&self, slot: &mut u64) -> Option<u64> {
        (**self).read_below(slot)
    }
}

/// What a declared stack is used for (informational: the walk order is the
/// order of the declaration, not the kind).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StackKind {
    /// A task's (thread's) kernel stack.
    Task,
    /// A per-CPU interrupt stack.
    Irq,
    /// A per-CPU stack for handling a stack overflow.
    Overflow,
    /// Any other stack (early boot, a test's synthetic stack...).
    Other,
}

/// One stack: the bytes `[low, high)`; frame records live inside it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StackRange {
    /// Lowest address of the stack (inclusive).
    pub low: u64,
    /// One past the highest address (exclusive): the initial stack pointer.
    pub high: u64,
    /// What the stack is for.
    pub kind: StackKind,
}

impl StackRange {
    /// A stack covering `[low, high)`. An empty or inverted range contains nothing.
    #[inline(always)]
    pub const fn new(low: u64, high: u64, kind: StackKind) -> Self {
        Self { low, high, kind }
    }

    /// Whether the `size` bytes at `address` lie wholly inside this stack
    /// (without overflow, whatever the inputs).
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    #[inline]
    pub const fn contains(&self, address: u64, size: u64) -> bool {
        // `address + size <= high`, written so that nothing can overflow.
        address >= self.low && size <= self.high && address <= self.high - size
    }
}

/// The stacks a frame walk may visit, in walk order (see [`crate::FrameWalker`]).
///
/// A walk that stays in the stack it started in (the common case: a task's own stack) asks
/// only for [`first_records`](Self::first_records), where a frame record may lie in the first
/// declared stack; the full list is asked for only when the walk starts outside that stack or
/// leaves it (a marker, a move to the next stack, a refused record). So an implementation may
/// compute the list on demand: the kernel's costs nothing on the walk's fast path.
pub trait StackSet {
    /// The lowest and the highest address a 16-byte frame record may start at in the first
    /// declared stack (`low` and `high - 16`), or `(1, 0)` (nothing) if there is no such stack
    /// or it is too small. `low` is never 0.
    fn first_records(&self) -> (u64, u64);

    /// Every declared stack, in walk order; the first is the one
    /// [`first_records`](Self::first_records) describes.
    fn declared(&self) -> &[StackRange];
}

impl StackSet for [StackRange] {
    #[inline(always)]
    #[allow(clippy::len_zero, reason = "`is_empty` is a core function, which the exempt walkers would not inline")]
    fn first_records(&self) -> (u64, u64) {
        // Indexing, not `first()`: a core helper the exempt walkers would not inline.
        if self.len() == 0 || self[0].low == 0 || self[0].high < 16 || self[0].high - 16 < self[0].low {
            return (1, 0);
        }
        (self[0].low, self[0].high - 16)
    }

    #[inline(always)]
    fn declared(&self) -> &[StackRange] {
        self
    }
}
