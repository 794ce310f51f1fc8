//! Host tests of the walkers over synthetic memory images.

mod frame_walk;
mod prologue;
mod property;
mod repair;
mod shadow_walk;

use std::cell::RefCell;
use std::collections::BTreeMap;

use crate::{StackMemory, StackRange, strip_pac_va_bits};

/// Virtual-address bits of the synthetic machine (TnSZ = 25).
pub const VA_BITS: u32 = 39;

/// The tests' PAC stripper: a VA-size mask, as on a CPU without XPACLRI.
pub fn strip(address: u64) -> u64 {
    strip_pac_va_bits(address, VA_BITS)
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
