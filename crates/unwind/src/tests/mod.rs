//! Host tests of the walkers over synthetic memory images.

mod frame_walk;
mod prologue;
mod property;
mod repair;
mod sframe_table;
mod sframe_walk;
mod shadow_walk;
mod stack_set;

use std::cell::RefCell;
use std::collections::BTreeMap;

use crate::{
    AddressLayout, FrameWalker, ShadowSegment, ShadowWalker, StackMemory, StackRange, Trace, TraceOptions,
    strip_pac_va_bits,
};

/// Virtual-address bits of the synthetic machine (TnSZ = 25).
pub const VA_BITS: u32 = 39;

/// The synthetic machine's address layout (what the walkers strip with).
pub const LAYOUT: AddressLayout = AddressLayout::new(VA_BITS);

/// Kernel text of the synthetic machine (upper half, like the kernel's).
pub const TEXT: u64 = 0xffff_ff80_4008_0000;

/// The tests' PAC stripper: a VA-size mask, as on a CPU without XPACLRI.
pub fn strip(address: u64) -> u64 {
    strip_pac_va_bits(address, VA_BITS)
}

#[test]
fn layout_strip_equals_the_va_mask_for_upper_half_words() {
    for pac in [0, 1, 0x1234, 0xffff] {
        let signed = sign(TEXT + 0x44, pac);
        assert!(AddressLayout::is_upper_half(signed));
        assert_eq!(LAYOUT.strip_upper(signed), TEXT + 0x44);
        assert_eq!(LAYOUT.strip(signed), strip(signed));
    }
}

/// Walks into a fresh [`Trace`] (the tests keep and compare whole traces).
pub trait IntoTrace {
    fn trace_from_frame(&self, fp: u64, options: TraceOptions) -> Trace;
    fn trace_from_context(&self, pc: u64, fp: u64, options: TraceOptions) -> Trace;
}

impl<M: StackMemory + ?Sized> IntoTrace for FrameWalker<'_, M> {
    fn trace_from_frame(&self, fp: u64, options: TraceOptions) -> Trace {
        let mut trace = Trace::new();
        trace.fill(|buffer| self.walk_from_frame(fp, options, buffer));
        trace
    }

    fn trace_from_context(&self, pc: u64, fp: u64, options: TraceOptions) -> Trace {
        let mut trace = Trace::new();
        trace.fill(|buffer| self.walk_from_context(pc, fp, options, buffer));
        trace
    }
}

/// The shadow walk into a fresh [`Trace`].
pub fn shadow_trace<M: StackMemory + ?Sized>(
    walker: &ShadowWalker<'_, M>,
    segments: &[ShadowSegment],
    options: TraceOptions,
) -> Trace {
    let mut trace = Trace::new();
    trace.fill(|buffer| walker.walk(segments, options, buffer));
    trace
}

/// Signs `address` with a made-up 16-bit PAC in bits [54:39].
pub fn sign(address: u64, pac: u16) -> u64 {
    let field = ((1u64 << 55) - 1) & !((1u64 << VA_BITS) - 1);
    (address & !field) | ((u64::from(pac) << VA_BITS) & field)
}

/// Sparse memory that records every read. With `readable_everywhere`, words
/// that were never written read as an address-derived value, so a walker that
/// strayed out of its stacks would not be stopped by the memory.
#[derive(Default)]
pub struct SyntheticMemory {
    pub words: BTreeMap<u64, u64>,
    pub readable_everywhere: bool,
    pub reads: RefCell<Vec<u64>>,
    /// Panic after this many reads (0: no limit): a looping walker fails fast.
    pub max_reads: usize,
}

impl SyntheticMemory {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn write(&mut self, address: u64, value: u64) {
        assert_eq!(address % 8, 0, "synthetic words are 8-aligned");
        self.words.insert(address, value);
    }

    pub fn write_words(&mut self, address: u64, values: &[u64]) {
        for (index, value) in values.iter().enumerate() {
            self.write(address + 8 * index as u64, *value);
        }
    }

    /// Asserts that every read so far lay wholly inside one of `stacks`.
    pub fn assert_reads_inside(&self, stacks: &[StackRange]) {
        for &address in self.reads.borrow().iter() {
            assert!(
                stacks.iter().any(|stack| stack.contains(address, 8)),
                "read at {address:#x} outside the declared stacks {stacks:x?}"
            );
        }
    }
}

impl StackMemory for SyntheticMemory {
    fn read_u64(&self, address: u64) -> Option<u64> {
        let mut reads = self.reads.borrow_mut();
        reads.push(address);
        assert!(self.max_reads == 0 || reads.len() <= self.max_reads, "more than {} reads: a loop?", self.max_reads);
        match self.words.get(&address) {
            Some(&value) => Some(value),
            None if self.readable_everywhere => Some(address.rotate_left(17) ^ 0x9e37_79b9_7f4a_7c15),
            None => None,
        }
    }
}

/// A tiny seeded generator (xorshift64*), to keep the build free of proptest.
pub struct XorShift(u64);

impl XorShift {
    pub fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform-ish in `0..bound` (bound > 0).
    pub fn below(&mut self, bound: u64) -> u64 {
        self.next_u64() % bound
    }

    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}
