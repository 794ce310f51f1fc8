//! Encoders for the few instructions the kernel writes: B, BL, BRK and NOP.
//!
//! Encodings from the Arm ARM (DDI 0487) C6.2 "B", "BL", "BRK", "NOP".

use core::fmt;

use crate::insn::Insn;

/// `NOP` (HINT #0).
pub const NOP: Insn = Insn(0xd503_201f);

/// Largest forward reach of B/BL: `imm26` is a signed word offset.
pub const BRANCH_MAX_FORWARD: i64 = (1 << 27) - 4;
/// Largest backward reach of B/BL.
pub const BRANCH_MAX_BACKWARD: i64 = -(1 << 27);

/// Why a B/BL cannot be encoded. A branch that cannot reach is an error,
/// never a wrong branch.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum BranchError {
    /// `from` or `to` is not 4-byte aligned.
    Misaligned { from: u64, to: u64 },
    /// `to - from` is outside [-128 MiB, +128 MiB - 4].
    OutOfRange { from: u64, to: u64 },
}

impl fmt::Display for BranchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Misaligned { from, to } => {
                write!(f, "branch from {from:#x} to {to:#x}: not 4-byte aligned")
            }
            Self::OutOfRange { from, to } => {
                write!(f, "branch from {from:#x} to {to:#x}: beyond +-128 MiB")
            }
        }
    }
}

/// `B to`, placed at `from`.
pub fn encode_b(from: u64, to: u64) -> Result<Insn, BranchError> {
    encode_branch(0x1400_0000, from, to)
}

/// `BL to`, placed at `from`.
pub fn encode_bl(from: u64, to: u64) -> Result<Insn, BranchError> {
    encode_branch(0x9400_0000, from, to)
}

fn encode_branch(opcode: u32, from: u64, to: u64) -> Result<Insn, BranchError> {
    if (from | to) & 3 != 0 {
        return Err(BranchError::Misaligned { from, to });
    }
    // PC arithmetic is modulo 2^64, so the wrapped difference is the offset
    // the CPU will add.
    let offset = to.wrapping_sub(from) as i64;
    if !(BRANCH_MAX_BACKWARD..=BRANCH_MAX_FORWARD).contains(&offset) {
        return Err(BranchError::OutOfRange { from, to });
    }
    let imm26 = ((offset >> 2) as u32) & 0x03ff_ffff;
    Ok(Insn(opcode | imm26))
}

/// `BRK #imm16`.
pub const fn encode_brk(imm16: u16) -> Insn {
    Insn(0xd420_0000 | ((imm16 as u32) << 5))
}
