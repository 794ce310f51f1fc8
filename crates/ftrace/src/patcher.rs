//! The text-patching trait: how the registry reads and writes kernel text.

/// Reads and writes the kernel's text. The kernel implements it with a
/// writable alias of the text and cache maintenance; tests implement it over
/// a buffer and record every write.
///
/// The [`Registry`](crate::Registry) issues writes in the order that makes
/// each intermediate state safe for a CPU running the site concurrently
/// (see the crate docs); an implementation must keep that order visible:
/// - every write is observed by other CPUs after all of the caller's earlier
///   writes, both the earlier patches and the [`DispatchTable`](crate::DispatchTable)
///   stores (e.g. `dmb ish` or `dsb ish` before the store, or a release
///   store), so a CPU that executes a new `bl` finds the literal written
///   before it, and a CPU that loads a new literal finds the vector it points at;
/// - [`write_u64`](Self::write_u64) is one single-copy-atomic 64-bit store
///   (`str x`, to an 8-aligned address): a CPU in the trampoline loads
///   either the old or the new ops address, never half of each;
/// - [`write_u32`](Self::write_u32) is one 32-bit store followed by the
///   cache maintenance that makes it visible to instruction fetch
///   (`dc cvau; dsb ish; ic ivau; dsb ish`), or that maintenance is done for
///   all writes in [`synchronize`](Self::synchronize).
pub trait TextPatcher {
    /// The order in which enabling a site writes its literal and its `bl`:
    /// [`EnableOrder::LiteralFirst`] unless the implementation asks for the
    /// wrong one.
    fn enable_order(&self) -> EnableOrder {
        EnableOrder::LiteralFirst
    }

    /// The instruction word at `address` (4-aligned).
    fn read_u32(&self, address: u64) -> u32;

    /// Replaces the instruction word at `address` (4-aligned).
    fn write_u32(&mut self, address: u64, instruction: u32);

    /// Replaces the doubleword at `address` (8-aligned) in one
    /// single-copy-atomic store.
    fn write_u64(&mut self, address: u64, value: u64);

    /// The doubleword at `address` (8-aligned), little-endian.
    fn read_u64(&self, address: u64) -> u64 {
        u64::from(self.read_u32(address)) | u64::from(self.read_u32(address + 4)) << 32
    }

    /// Called once at the end of every [`Registry::initialise`](crate::Registry::initialise)
    /// and [`Registry::apply`](crate::Registry::apply) that wrote anything:
    /// finish deferred cache maintenance and make every CPU context-synchronise
    /// (an IPI running `isb`), so that all instruction writes so far are what
    /// every CPU executes from now on.
    fn synchronize(&mut self) {}
}

/// The order of the two stores that enable a site.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum EnableOrder {
    /// The literal, then the `bl`: a CPU that executes the new `bl` finds the
    /// literal it loads. The correct order.
    LiteralFirst,
    /// The `bl` before the literal: a known-wrong order, which the kernel
    /// asks for only when its fault switch `FtraceBlBeforeLiteral` is on, so
    /// that its race tests show they catch it.
    BlFirst,
}
