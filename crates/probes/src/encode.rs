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

/// Whether `word` is a `B` (C6.2.26: bits [31:26] = 000101), to any target: the word a detour
/// arms.
pub const fn is_b(word: u32) -> bool {
    word & 0xfc00_0000 == 0x1400_0000
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

// The encoders below are the few forms a detour trampoline is built from (`relocate.rs`). Each
// takes register numbers 0..=31 (31 = SP or XZR as the form says) and byte offsets; callers keep
// offsets in range (the relocator's own offsets are small constants or checked first).

/// The low `bits` bits of `offset / 4`: a signed word-offset field.
const fn word_field(offset: i64, bits: u32) -> u32 {
    ((offset >> 2) as u32) & ((1 << bits) - 1)
}

/// Largest reach of a 19-bit word offset (B.cond, CBZ/CBNZ, LDR literal).
pub const IMM19_MAX_FORWARD: i64 = (1 << 20) - 4;
/// Largest backward reach of a 19-bit word offset.
pub const IMM19_MAX_BACKWARD: i64 = -(1 << 20);

/// `ADD Xd|SP, Xn|SP, #immediate` (C6.2 "ADD (immediate)", 64-bit, no shift): `immediate < 4096`.
pub const fn add_immediate(rd: u8, rn: u8, immediate: u16) -> Insn {
    Insn(0x9100_0000 | ((immediate as u32 & 0xfff) << 10) | ((rn as u32) << 5) | rd as u32)
}

/// `SUB Xd|SP, Xn|SP, #immediate` (C6.2 "SUB (immediate)", 64-bit, no shift).
pub const fn sub_immediate(rd: u8, rn: u8, immediate: u16) -> Insn {
    Insn(0xd100_0000 | ((immediate as u32 & 0xfff) << 10) | ((rn as u32) << 5) | rd as u32)
}

/// `MOV Xd|SP, Xn|SP` (the `ADD #0` alias used with SP).
pub const fn mov_sp(rd: u8, rn: u8) -> Insn {
    add_immediate(rd, rn, 0)
}

/// `STP Xt, Xt2, [Xn|SP, #offset]` (C6.2 "STP", signed offset): `offset` a multiple of 8 in
/// [-512, 504].
pub const fn stp_offset(rt: u8, rt2: u8, rn: u8, offset: i64) -> Insn {
    Insn(0xa900_0000 | (((offset / 8) as u32 & 0x7f) << 15) | ((rt2 as u32) << 10) | ((rn as u32) << 5) | rt as u32)
}

/// `STP Xt, Xt2, [Xn|SP, #offset]!` (C6.2 "STP", pre-index): `offset` a multiple of 8 in
/// [-512, 504].
pub const fn stp_pre_index(rt: u8, rt2: u8, rn: u8, offset: i64) -> Insn {
    Insn(0xa980_0000 | (((offset / 8) as u32 & 0x7f) << 15) | ((rt2 as u32) << 10) | ((rn as u32) << 5) | rt as u32)
}

/// `LDP Xt, Xt2, [Xn|SP], #offset` (C6.2 "LDP", post-index).
pub const fn ldp_post_index(rt: u8, rt2: u8, rn: u8, offset: i64) -> Insn {
    Insn(0xa8c0_0000 | (((offset / 8) as u32 & 0x7f) << 15) | ((rt2 as u32) << 10) | ((rn as u32) << 5) | rt as u32)
}

/// `CMP Xn, Xm` (C6.2 "CMP (shifted register)": `SUBS XZR, Xn, Xm`).
pub const fn cmp_register(rn: u8, rm: u8) -> Insn {
    Insn(0xeb00_001f | ((rm as u32) << 16) | ((rn as u32) << 5))
}

/// `CCMP Xn, Xm, #nzcv, condition` (C6.2 "CCMP (register)"): the flags of `CMP Xn, Xm` if
/// `condition` holds, else `nzcv`.
pub const fn ccmp_register(rn: u8, rm: u8, nzcv: u8, condition: u8) -> Insn {
    Insn(
        0xfa40_0000 | ((rm as u32) << 16) | ((condition as u32 & 0xf) << 12) | ((rn as u32) << 5) | (nzcv as u32 & 0xf),
    )
}

/// `LDP Xt, Xt2, [Xn|SP, #offset]` (C6.2 "LDP", signed offset).
pub const fn ldp_offset(rt: u8, rt2: u8, rn: u8, offset: i64) -> Insn {
    Insn(0xa940_0000 | (((offset / 8) as u32 & 0x7f) << 15) | ((rt2 as u32) << 10) | ((rn as u32) << 5) | rt as u32)
}

/// `STR Xt, [Xn|SP, #offset]` (C6.2 "STR (immediate)", unsigned offset): a multiple of 8 below
/// 32 KiB.
pub const fn str_unsigned(rt: u8, rn: u8, offset: u32) -> Insn {
    Insn(0xf900_0000 | (((offset / 8) & 0xfff) << 10) | ((rn as u32) << 5) | rt as u32)
}

/// `LDR Xt, [Xn|SP, #offset]` (C6.2 "LDR (immediate)", 64-bit, unsigned offset).
pub const fn ldr_unsigned(rt: u8, rn: u8, offset: u32) -> Insn {
    Insn(0xf940_0000 | (((offset / 8) & 0xfff) << 10) | ((rn as u32) << 5) | rt as u32)
}

/// `LDR Wt, [Xn|SP, #offset]` (C6.2 "LDR (immediate)", 32-bit, unsigned offset).
pub const fn ldr_w_unsigned(rt: u8, rn: u8, offset: u32) -> Insn {
    Insn(0xb940_0000 | (((offset / 4) & 0xfff) << 10) | ((rn as u32) << 5) | rt as u32)
}

/// `LDRSW Xt, [Xn|SP, #offset]` (C6.2 "LDRSW (immediate)", unsigned offset).
pub const fn ldrsw_unsigned(rt: u8, rn: u8, offset: u32) -> Insn {
    Insn(0xb980_0000 | (((offset / 4) & 0xfff) << 10) | ((rn as u32) << 5) | rt as u32)
}

/// `LDR Xt, label` (C6.2 "LDR (literal)", 64-bit), `offset` bytes from the instruction.
pub const fn ldr_literal(rt: u8, offset: i64) -> Insn {
    Insn(0x5800_0000 | (word_field(offset, 19) << 5) | rt as u32)
}

/// `LDR Wt, label` (C6.2 "LDR (literal)", 32-bit), `offset` bytes from the instruction.
pub const fn ldr_w_literal(rt: u8, offset: i64) -> Insn {
    Insn(0x1800_0000 | (word_field(offset, 19) << 5) | rt as u32)
}

/// `LDRSW Xt, label` (C6.2 "LDRSW (literal)"), `offset` bytes from the instruction.
pub const fn ldrsw_literal(rt: u8, offset: i64) -> Insn {
    Insn(0x9800_0000 | (word_field(offset, 19) << 5) | rt as u32)
}

/// `MRS Xt, NZCV` (C6.2 "MRS", op0=3 op1=3 CRn=4 CRm=2 op2=0).
pub const fn mrs_nzcv(rt: u8) -> Insn {
    Insn(0xd53b_4200 | rt as u32)
}

/// `MSR NZCV, Xt` (C6.2 "MSR (register)").
pub const fn msr_nzcv(rt: u8) -> Insn {
    Insn(0xd51b_4200 | rt as u32)
}

/// `BR Xn` (C6.2 "BR").
pub const fn br(rn: u8) -> Insn {
    Insn(0xd61f_0000 | ((rn as u32) << 5))
}

/// `BLR Xn` (C6.2 "BLR").
pub const fn blr(rn: u8) -> Insn {
    Insn(0xd63f_0000 | ((rn as u32) << 5))
}

/// `B.cond label` (C6.2 "B.cond"), `offset` bytes from the instruction, within imm19's reach.
pub const fn b_cond(condition: u8, offset: i64) -> Insn {
    Insn(0x5400_0000 | (word_field(offset, 19) << 5) | (condition as u32 & 0xf))
}

/// `CBZ`/`CBNZ Rt, label` (C6.2 "CBZ", "CBNZ"), 64-bit if `is_64`, within imm19's reach.
pub const fn compare_branch(rt: u8, is_64: bool, if_nonzero: bool, offset: i64) -> Insn {
    Insn(((is_64 as u32) << 31) | 0x3400_0000 | ((if_nonzero as u32) << 24) | (word_field(offset, 19) << 5) | rt as u32)
}

/// `TBZ`/`TBNZ Rt, #bit, label` (C6.2 "TBZ", "TBNZ"), `offset` within +-32 KiB.
pub const fn test_branch(rt: u8, bit: u8, if_nonzero: bool, offset: i64) -> Insn {
    Insn(
        (((bit as u32 >> 5) & 1) << 31)
            | 0x3600_0000
            | ((if_nonzero as u32) << 24)
            | ((bit as u32 & 0x1f) << 19)
            | (word_field(offset, 14) << 5)
            | rt as u32,
    )
}
