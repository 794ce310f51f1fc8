//! A fake kernel text for the host tests: a word buffer that logs writes.
#![allow(dead_code, reason = "each test file uses a different part")]

use ftrace::{
    CallSite, Config, DispatchTable, EnableOrder, NOP, PACIASP, Registry, SCS_PUSH, Scheme, TextPatcher, VectorOps,
};

/// Where the fake text starts.
pub const BASE: u64 = 0x4008_0000;
/// Bytes per fake function: 4 patchable NOPs, paciasp, SCS push, 2 more words.
pub const FUNCTION_BYTES: u64 = 32;
/// The trampoline, after the functions.
pub const TRAMPOLINE: u64 = BASE + 0x10_0000;
pub const NOP_OPS: u64 = 0xffff_0000_0001_0000;
pub const LIST_OPS: u64 = 0xffff_0000_0002_0000;
pub const VECTOR_OPS: VectorOps = VectorOps { base: 0xffff_0000_0003_0000, stride: 0x40 };

pub const SITES: usize = 16;
pub type Table = DispatchTable<SITES, 2, 4>;
pub type Reg<'t> = Registry<'t, SITES, 2, 4>;

/// The ops address of fake tracer `n`.
pub const fn tracer_ops(n: u64) -> u64 {
    0xffff_0000_1000_0000 + n * 0x100
}

pub fn config(scheme: Scheme) -> Config {
    Config { trampoline: TRAMPOLINE, nop_ops: NOP_OPS, list_ops: LIST_OPS, vector_ops: VECTOR_OPS, scheme }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Write {
    U32 { address: u64, value: u32 },
    U64 { address: u64, value: u64 },
    Synchronize,
}

#[derive(Clone, Debug)]
pub struct Text {
    pub base: u64,
    pub words: Vec<u32>,
    pub log: Vec<Write>,
    /// The order the registry is asked to enable sites in.
    pub enable_order: EnableOrder,
}

impl Text {
    /// `functions` fake functions as the compiler leaves them.
    pub fn new(functions: usize) -> Self {
        let mut words = Vec::new();
        for _ in 0..functions {
            words.extend_from_slice(&[NOP, NOP, NOP, NOP, PACIASP, SCS_PUSH, 0xd503_23bf, 0xd65f_03c0]);
        }
        Self { base: BASE, words, log: Vec::new(), enable_order: EnableOrder::LiteralFirst }
    }

    /// The entries `E` of the functions, in reverse (the registry sorts).
    pub fn entries(&self) -> Vec<u64> {
        (0..self.words.len() as u64 / (FUNCTION_BYTES / 4)).rev().map(|i| BASE + i * FUNCTION_BYTES).collect()
    }

    fn index(&self, address: u64) -> usize {
        assert_eq!(address % 4, 0, "misaligned access {address:#x}");
        ((address - self.base) / 4) as usize
    }

    pub fn word(&self, address: u64) -> u32 {
        self.words[self.index(address)]
    }

    pub fn set_word(&mut self, address: u64, value: u32) {
        let index = self.index(address);
        self.words[index] = value;
    }

    /// Applies one logged write (for replays).
    pub fn replay(&mut self, write: Write) {
        match write {
            Write::U32 { address, value } => self.set_word(address, value),
            Write::U64 { address, value } => {
                self.set_word(address, value as u32);
                self.set_word(address + 4, (value >> 32) as u32);
            }
            Write::Synchronize => {}
        }
    }

    pub fn site(&self, index: usize) -> CallSite {
        CallSite::new(BASE + index as u64 * FUNCTION_BYTES).unwrap()
    }

    /// Writes to `address` in the log.
    pub fn writes_to(&self, address: u64) -> usize {
        self.log
            .iter()
            .filter(|write| match write {
                Write::U32 { address: a, .. } => *a == address,
                Write::U64 { address: a, .. } => *a == address || *a + 4 == address,
                Write::Synchronize => false,
            })
            .count()
    }

    /// The log without synchronisations, then cleared.
    pub fn take_log(&mut self) -> Vec<Write> {
        self.log.drain(..).filter(|write| *write != Write::Synchronize).collect()
    }
}

impl TextPatcher for Text {
    fn enable_order(&self) -> EnableOrder {
        self.enable_order
    }

    fn read_u32(&self, address: u64) -> u32 {
        self.word(address)
    }

    fn write_u32(&mut self, address: u64, instruction: u32) {
        self.log.push(Write::U32 { address, value: instruction });
        self.set_word(address, instruction);
    }

    fn write_u64(&mut self, address: u64, value: u64) {
        assert_eq!(address % 8, 0, "literal store to {address:#x} is not single-copy atomic");
        self.log.push(Write::U64 { address, value });
        self.set_word(address, value as u32);
        self.set_word(address + 4, (value >> 32) as u32);
    }

    fn synchronize(&mut self) {
        self.log.push(Write::Synchronize);
    }
}

/// A text of `SITES` functions and an initialised registry over it.
pub fn setup(table: &Table, scheme: Scheme) -> (Text, Reg<'_>) {
    let mut text = Text::new(SITES);
    let mut registry = Reg::new(table);
    let entries = text.entries();
    assert_eq!(registry.initialise(entries, config(scheme), &mut text, |_| true), Ok(SITES));
    text.log.clear();
    (text, registry)
}
