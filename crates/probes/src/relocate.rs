//! The detour relocator: builds a probe's trampoline, and re-encodes the displaced instruction
//! so that it has, from the trampoline, the effect it had at its original address.
//!
//! A trampoline is one chunk of `TRAMPOLINE_WORDS` words: code from word 0, a literal pool of
//! 64-bit values from word [`LITERAL_POOL`]. [`detour_trampoline`] saves the registers in the
//! [`Registers`](crate::Registers) layout below SP, calls `entry(probe, &mut registers)`,
//! calls `refuse(probe, &mut registers)` if the handler changed the saved `pc` or `sp` (a
//! detour cannot redirect: see below), restores the registers, then [`relocate`]s the
//! displaced instruction and branches back. Encodings are the named encoders of `encode.rs`
//! (Arm ARM C6.2).
//!
//! Why a detour refuses a change of `pc` or `sp` rather than honouring it (Linux's contract: a
//! pre-handler that sets the PC and returns nonzero skips the instruction): after the restore
//! every register holds the probed context's value, so no register is left to branch to an
//! arbitrary PC, and SP is the trampoline's own until its last instruction. The check costs
//! four instructions on the hit (the expected SP and PC stay in x19 and x21, callee-saved
//! across the entry, and are compared with `CMP`/`CCMP`); the call to `refuse` is off the
//! path.
//!
//! What the relocated forms do not reproduce:
//! - `BLR Xn` becomes `LDR X30, =next; BR Xn`. `BR` sets PSTATE.BTYPE to 01 (11 from a guarded
//!   page unless Xn is x16 or x17) where `BLR` sets 10, so a target whose landing pad is
//!   `BTI c` would take a Branch Target exception under BTI (`BTI j` or `BTI jc` would pass).
//!   This is latent: the kernel is built without BTI and its text is not mapped guarded. A
//!   `BLR` from the trampoline is no remedy (its link would point into the trampoline); under
//!   BTI the relocator would have to load the return address and branch through x16 or x17
//!   into a `BTI c`-compatible target, or refuse `BLR`.
//! - `LDR Xt, <literal>` becomes `LDR Xt, =address; LDR Xt, [Xt]`: the same load, which faults
//!   where the original does. With `Rt` = XZR there is no register to hold the address, so the
//!   load is re-encoded PC-relative from the trampoline (`LDR XZR, <literal>` again), which
//!   reaches +-1 MiB; a literal farther away is refused ([`RelocateError::LiteralOutOfRange`])
//!   rather than relocated without its load.

use crate::classify::{Classification, RejectReason};
use crate::encode::{
    IMM19_MAX_BACKWARD, IMM19_MAX_FORWARD, add_immediate, b_cond, blr, br, ccmp_register, cmp_register, compare_branch,
    encode_b, encode_bl, ldp_offset, ldp_post_index, ldr_literal, ldr_unsigned, ldr_w_literal, ldr_w_unsigned,
    ldrsw_literal, ldrsw_unsigned, mov_sp, mrs_nzcv, msr_nzcv, stp_offset, stp_pre_index, test_branch,
};
use crate::simulate::{IndirectBranch, LiteralSize, Simulated};

/// Words per trampoline chunk (512 bytes).
pub const TRAMPOLINE_WORDS: usize = 128;
/// Where the literal pool starts, in words from the chunk start (8-byte aligned).
pub const LITERAL_POOL: usize = 112;

const SP: u8 = 31;
/// Bytes the trampoline reserves below SP: x0..x30, sp, pc, pstate (the `Registers` layout),
/// a multiple of 16 so SP stays aligned (SCTLR_EL1.SA).
const SAVE_AREA: u16 = 34 * 8;
const _: () = assert!(SAVE_AREA as usize == core::mem::size_of::<crate::Registers>() && SAVE_AREA.is_multiple_of(16));
/// Offsets in the save area (the `Registers` fields).
const SAVED_X30: u32 = 30 * 8;
const SAVED_SP: i64 = 31 * 8;
const SAVED_PC: i64 = 32 * 8;
const SAVED_PSTATE: u32 = 33 * 8;
/// Where the trampoline keeps the SP before it and the probed address across the entry call
/// (callee-saved in the AAPCS64; saved and restored with the others, so the context's values
/// come back). Not x20: the kernel's entry stub keeps its return address there.
const EXPECTED_SP: u8 = 19;
const EXPECTED_PC: u8 = 21;
/// Condition codes (C1.2.4).
const EQ: u8 = 0b0000;

/// Why a detour cannot be built.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum RelocateError {
    /// `classify` rejects the instruction.
    Rejected(RejectReason),
    /// `BLR X30`: the return address and the target share the only free register.
    BlrX30,
    /// A branch between the trampoline and the probe or the target is beyond +-128 MiB.
    OutOfBranchRange,
    /// The code or the literal pool does not fit in the chunk.
    TooLong,
    /// `LDR XZR, <literal>` (any size) whose literal is beyond +-1 MiB of the trampoline: the
    /// load can only be kept PC-relative, since no register is free to hold its address.
    LiteralOutOfRange,
}

/// A trampoline being assembled at `base`: code from word 0, literals from [`LITERAL_POOL`].
#[derive(Clone, Debug)]
pub struct Trampoline {
    base: u64,
    words: [u32; TRAMPOLINE_WORDS],
    code_length: usize,
    literal_count: usize,
}

impl Trampoline {
    /// An empty trampoline at `base` (4-aligned), every word `filler`.
    pub const fn new(base: u64, filler: u32) -> Self {
        Self { base, words: [filler; TRAMPOLINE_WORDS], code_length: 0, literal_count: 0 }
    }

    /// Where the trampoline sits.
    pub const fn base(&self) -> u64 {
        self.base
    }

    /// The code, from word 0.
    pub fn code(&self) -> &[u32] {
        &self.words[..self.code_length]
    }

    /// The literal pool, from word [`LITERAL_POOL`].
    pub fn literals(&self) -> &[u32] {
        &self.words[LITERAL_POOL..LITERAL_POOL + 2 * self.literal_count]
    }

    /// Every word of the chunk (unused ones hold the filler).
    pub const fn words(&self) -> &[u32; TRAMPOLINE_WORDS] {
        &self.words
    }

    fn emit(&mut self, word: crate::Insn) -> Result<(), RelocateError> {
        if self.code_length == LITERAL_POOL {
            return Err(RelocateError::TooLong);
        }
        self.words[self.code_length] = word.0;
        self.code_length += 1;
        Ok(())
    }

    fn here(&self) -> u64 {
        self.base + 4 * self.code_length as u64
    }

    /// `BL to` from the next word, or `LDR X16, =to; BLR X16` if `to` is beyond BL's reach.
    fn call(&mut self, to: u64) -> Result<(), RelocateError> {
        match encode_bl(self.here(), to) {
            Ok(word) => self.emit(word),
            Err(_) => {
                self.load_literal(16, to)?;
                self.emit(blr(16))
            }
        }
    }

    /// `LDR Xrt, =value` from a new literal in the pool.
    fn load_literal(&mut self, rt: u8, value: u64) -> Result<(), RelocateError> {
        let at = LITERAL_POOL + 2 * self.literal_count;
        if at + 2 > TRAMPOLINE_WORDS {
            return Err(RelocateError::TooLong);
        }
        self.words[at] = value as u32;
        self.words[at + 1] = (value >> 32) as u32;
        self.literal_count += 1;
        let offset = 4 * (at as i64 - self.code_length as i64);
        self.emit(ldr_literal(rt, offset))
    }

    /// `B to` from the next word.
    fn branch(&mut self, to: u64) -> Result<(), RelocateError> {
        let word = encode_b(self.here(), to).map_err(|_| RelocateError::OutOfBranchRange)?;
        self.emit(word)
    }
}

/// Builds the detour trampoline at `base` for the probe at `address` displacing `original`:
/// save, `entry(probe, &mut registers)` (registers: x0..x30, the SP before the trampoline,
/// pc = `address`, pstate = NZCV), `refuse(probe, &mut registers)` if the saved pc or sp is no
/// longer what it was (`refuse` puts them back), restore, the relocated instruction, branch
/// back. `entry` and `refuse` are called with `BL` when in reach.
#[allow(clippy::too_many_arguments, reason = "the trampoline's inputs, each a distinct address or word")]
pub fn detour_trampoline(
    base: u64,
    filler: u32,
    address: u64,
    original: u32,
    classification: &Classification,
    probe: u64,
    entry: u64,
    refuse: u64,
) -> Result<Trampoline, RelocateError> {
    let mut asm = Trampoline::new(base, filler);
    // AArch64 has no red zone, so SP moves first (with the first pair).
    asm.emit(stp_pre_index(0, 1, SP, -i64::from(SAVE_AREA)))?;
    for pair in 1..15u8 {
        asm.emit(stp_offset(2 * pair, 2 * pair + 1, SP, 16 * i64::from(pair)))?;
    }
    asm.emit(add_immediate(EXPECTED_SP, SP, SAVE_AREA))?; // the SP before the trampoline
    asm.emit(stp_offset(30, EXPECTED_SP, SP, SAVED_X30.into()))?; // x30, sp
    asm.emit(mrs_nzcv(1))?;
    asm.load_literal(EXPECTED_PC, address)?;
    asm.emit(stp_offset(EXPECTED_PC, 1, SP, SAVED_PC))?; // pc, pstate: NZCV
    asm.load_literal(0, probe)?;
    asm.emit(mov_sp(1, SP))?;
    asm.call(entry)?;
    // The handler's sp and pc must be the saved ones; else `refuse` (off the hit path).
    asm.emit(ldp_offset(0, 1, SP, SAVED_SP))?;
    asm.emit(cmp_register(0, EXPECTED_SP))?;
    asm.emit(ccmp_register(1, EXPECTED_PC, 0, EQ))?;
    let skip = asm.code_length;
    asm.emit(b_cond(EQ, 0))?; // patched below, over the call
    asm.load_literal(0, probe)?;
    asm.emit(mov_sp(1, SP))?;
    asm.call(refuse)?;
    asm.words[skip] = b_cond(EQ, 4 * (asm.code_length - skip) as i64).0;
    asm.emit(ldr_unsigned(1, SP, SAVED_PSTATE))?;
    asm.emit(msr_nzcv(1))?;
    for pair in 1..15u8 {
        asm.emit(ldp_offset(2 * pair, 2 * pair + 1, SP, 16 * i64::from(pair)))?;
    }
    asm.emit(ldr_unsigned(30, SP, SAVED_X30))?;
    asm.emit(ldp_post_index(0, 1, SP, i64::from(SAVE_AREA)))?;
    relocate(&mut asm, address, original, classification)?;
    Ok(asm)
}

/// Appends to `asm` a sequence with the effect `original` has at `address` (registers, flags,
/// memory and the next PC), ending in a branch to where the original would continue.
pub fn relocate(
    asm: &mut Trampoline,
    address: u64,
    original: u32,
    classification: &Classification,
) -> Result<(), RelocateError> {
    let next = address.wrapping_add(4);
    let target = |offset: i64| address.wrapping_add_signed(offset);
    // The conditional forms branch over the fall-through `B next` to the taken `B target`.
    const OVER_ONE: i64 = 8;
    match *classification {
        Classification::Reject(reason) => return Err(RelocateError::Rejected(reason)),
        Classification::StepOutOfLine
        | Classification::Simulate(
            Simulated::LoadStorePair { .. } | Simulated::MoveRegister { .. } | Simulated::AddSubImmediate { .. },
        )
        | Classification::Simulate(Simulated::BranchRegister {
            kind: IndirectBranch::Br | IndirectBranch::Ret, ..
        }) => {
            asm.emit(crate::Insn(original))?;
            asm.branch(next)?;
        }
        Classification::Simulate(Simulated::Nop) => asm.branch(next)?,
        Classification::Simulate(Simulated::Branch { offset, link }) => {
            if link {
                asm.load_literal(30, next)?;
            }
            asm.branch(target(offset))?;
        }
        Classification::Simulate(Simulated::BranchRegister { rn, kind: IndirectBranch::Blr }) => {
            if rn.number() == 30 {
                return Err(RelocateError::BlrX30);
            }
            // BR, not BLR, so that X30 is `next`: BTYPE differs (latent, see the module notes).
            asm.load_literal(30, next)?;
            asm.emit(br(rn.number()))?;
        }
        Classification::Simulate(Simulated::BranchConditional { condition, offset }) => {
            asm.emit(b_cond(condition.bits(), OVER_ONE))?;
            asm.branch(next)?;
            asm.branch(target(offset))?;
        }
        Classification::Simulate(Simulated::CompareBranch { rt, is_64, if_nonzero, offset }) => {
            asm.emit(compare_branch(rt.number(), is_64, if_nonzero, OVER_ONE))?;
            asm.branch(next)?;
            asm.branch(target(offset))?;
        }
        Classification::Simulate(Simulated::TestBranch { rt, bit, if_nonzero, offset }) => {
            asm.emit(test_branch(rt.number(), injected::test_bit(bit), if_nonzero, OVER_ONE))?;
            asm.branch(next)?;
            asm.branch(target(offset))?;
        }
        Classification::Simulate(Simulated::Adr { rd, offset, page }) => {
            if rd.number() != 31 {
                let pc = injected::adr_pc(address);
                let base = if page { pc & !0xfff } else { pc };
                asm.load_literal(rd.number(), base.wrapping_add_signed(offset))?;
            }
            asm.branch(next)?;
        }
        Classification::Simulate(Simulated::LoadLiteral { rt, size, offset }) => {
            let rt = rt.number();
            let literal = injected::literal_address(target(offset));
            if rt != 31 {
                asm.load_literal(rt, literal)?;
                asm.emit(match size {
                    LiteralSize::Word => ldr_w_unsigned(rt, rt, 0),
                    LiteralSize::Doubleword => ldr_unsigned(rt, rt, 0),
                    LiteralSize::SignedWord => ldrsw_unsigned(rt, rt, 0),
                })?;
            } else {
                // The load into XZR is kept for its fault; only a PC-relative form can address it.
                let from_here = literal.wrapping_sub(asm.here()) as i64;
                if !(IMM19_MAX_BACKWARD..=IMM19_MAX_FORWARD).contains(&from_here) {
                    return Err(RelocateError::LiteralOutOfRange);
                }
                asm.emit(match size {
                    LiteralSize::Word => ldr_w_literal(rt, from_here),
                    LiteralSize::Doubleword => ldr_literal(rt, from_here),
                    LiteralSize::SignedWord => ldrsw_literal(rt, from_here),
                })?;
            }
            asm.branch(next)?;
        }
    }
    Ok(())
}

/// Deliberate relocator bugs for the independent check (`tools/check_relocator.py`), which must
/// find each of them. Only the `injected-bugs` feature compiles the switch; without it every
/// function here is the identity and the kernel never builds it.
pub mod injected {
    /// A deliberate bug in the relocated sequences.
    #[derive(Clone, Copy, PartialEq, Eq, Debug)]
    pub enum Bug {
        /// `LDR (literal)` loads from 4 bytes past its literal.
        LiteralOffsetByFour,
        /// `TBZ`/`TBNZ` test bit `b40` only, dropping `b5` (bits 32..=63 become 0..=31).
        TestBitHighDropped,
        /// `ADR`/`ADRP` are based at the probed address + 4.
        AdrBasedAtNextPc,
    }

    impl Bug {
        /// Every bug, in the order the check reports them.
        pub const ALL: [Self; 3] = [Self::LiteralOffsetByFour, Self::TestBitHighDropped, Self::AdrBasedAtNextPc];

        /// The name the check's command line uses.
        pub const fn name(self) -> &'static str {
            match self {
                Self::LiteralOffsetByFour => "literal-offset-by-4",
                Self::TestBitHighDropped => "tbz-bit5-dropped",
                Self::AdrBasedAtNextPc => "adr-based-at-pc-plus-4",
            }
        }
    }

    #[cfg(feature = "injected-bugs")]
    static ACTIVE: core::sync::atomic::AtomicU8 = core::sync::atomic::AtomicU8::new(0);

    /// Makes the relocator commit `bug` from now on (`None`: relocate correctly).
    #[cfg(feature = "injected-bugs")]
    pub fn inject(bug: Option<Bug>) {
        let value = bug.map_or(0, |bug| 1 + Bug::ALL.iter().position(|&each| each == bug).unwrap_or(0) as u8);
        ACTIVE.store(value, core::sync::atomic::Ordering::Relaxed);
    }

    #[cfg(feature = "injected-bugs")]
    fn active(bug: Bug) -> bool {
        let value = ACTIVE.load(core::sync::atomic::Ordering::Relaxed);
        value != 0 && Bug::ALL.get(usize::from(value) - 1) == Some(&bug)
    }

    #[cfg(not(feature = "injected-bugs"))]
    const fn active(_: Bug) -> bool {
        false
    }

    pub(super) fn literal_address(address: u64) -> u64 {
        if active(Bug::LiteralOffsetByFour) { address.wrapping_add(4) } else { address }
    }

    pub(super) fn test_bit(bit: u8) -> u8 {
        if active(Bug::TestBitHighDropped) { bit & 31 } else { bit }
    }

    pub(super) fn adr_pc(address: u64) -> u64 {
        if active(Bug::AdrBasedAtNextPc) { address.wrapping_add(4) } else { address }
    }
}
