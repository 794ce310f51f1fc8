//! One A64 instruction word, its bit fields, and the form in which the decoder's answer is
//! kept ([`Description`], filled in by `decode.rs`).
//!
//! Field positions follow the Arm ARM (DDI 0487), chapter C4 "A64 Instruction
//! Set Encoding"; the identity of a word comes from the primary decoder
//! (disarm64, generated from the GNU binutils opcode tables).

use disarm64::decoder::InsnId;
use disarm64_defn::InsnFeatureSet;

/// A 32-bit A64 instruction word, in the CPU's (little-endian) bit order.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Insn(pub u32);

impl Insn {
    /// The raw word.
    pub const fn word(self) -> u32 {
        self.0
    }

    /// Bits `[lsb + width - 1 : lsb]`, zero-extended.
    pub(crate) const fn field(self, lsb: u32, width: u32) -> u32 {
        (self.0 >> lsb) & ((1 << width) - 1)
    }

    /// Bit `n`.
    pub(crate) const fn bit(self, n: u32) -> bool {
        (self.0 >> n) & 1 == 1
    }

    /// Bits `[lsb + width - 1 : lsb]`, sign-extended (the Arm ARM's `SignExtend`).
    pub(crate) const fn signed_field(self, lsb: u32, width: u32) -> i64 {
        let shift = 64 - width;
        (((self.field(lsb, width) as u64) << shift) as i64) >> shift
    }

    /// Register field `Rt`/`Rd` (bits `[4:0]`).
    pub(crate) const fn rd(self) -> u8 {
        self.field(0, 5) as u8
    }

    /// Register field `Rn` (bits `[9:5]`).
    pub(crate) const fn rn(self) -> u8 {
        self.field(5, 5) as u8
    }

    /// Register field `Rt2` (bits `[14:10]`).
    pub(crate) const fn rt2(self) -> u8 {
        self.field(10, 5) as u8
    }

    /// Register field `Rm` (bits `[20:16]`).
    pub(crate) const fn rm(self) -> u8 {
        self.field(16, 5) as u8
    }

    /// The immediate of `BRK #imm16`, or `None` if this is not a BRK.
    pub const fn brk_immediate(self) -> Option<u16> {
        if self.0 & 0xffe0_001f == 0xd420_0000 { Some(self.field(5, 16) as u16) } else { None }
    }
}

/// The decoder's view of an allocated word, reduced to what probes care about.
///
/// The categories are the ones the cross-check compares against the second
/// decoder; they are defined by the decoder's instruction class and operands
/// so that they mean the same for every extension the tables know.
#[derive(Clone, Copy, Debug)]
pub struct Description {
    /// Lower-case mnemonic of the base instruction (an alias such as `mov`
    /// is reported under its base, e.g. `orr`).
    pub mnemonic: &'static str,
    /// The decoder's identity and table entry (feature set, flags, operands);
    /// `None` for the few instructions its tables lack.
    pub(crate) entry: Option<(InsnId, &'static disarm64::Insn)>,
    /// Writes PC other than by falling through: B, BL, B.cond, BC.cond, CB*,
    /// TB*, BR*, BLR*, RET*, ERET*, DRPS. Exception-generating instructions
    /// are not counted here.
    pub is_branch: bool,
    /// Accesses data memory through an address operand: loads, stores,
    /// atomics, prefetches, memory-tag accesses, SIMD/SVE/SME loads and stores.
    pub is_load_store: bool,
    /// Reads PC as data or as a branch base: ADR, ADRP, immediate branches and
    /// literal loads.
    pub is_pc_relative: bool,
}

impl Description {
    /// The architecture feature the instruction belongs to, as the tables
    /// name it (`V8`, `LSE`, `PAC`, `MOPS`, ...).
    pub fn feature(&self) -> impl core::fmt::Display + use<> {
        struct Feature(Option<InsnFeatureSet>);
        impl core::fmt::Display for Feature {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                match self.0 {
                    Some(feature) => write!(f, "{feature}"),
                    None => f.write_str("PAUTH_LR"),
                }
            }
        }
        Feature(self.entry.map(|(_, definition)| definition.feature_set))
    }
}
