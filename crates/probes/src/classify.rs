//! Decides, for any A64 word, whether a probe simulates, steps or rejects it.
//!
//! The policy follows Linux's `arch/arm64/kernel/probes/decode-insn.c`
//! (`aarch64_insn_is_steppable`, `arm_probe_decode_insn`); the encodings of
//! the simulated forms follow the Arm ARM (DDI 0487) sections named on each.

use core::fmt;

use disarm64::decoder::InsnId;
use disarm64_defn::{InsnClass, InsnFeatureSet, InsnFlags};

use crate::insn::{Description, Insn};
use crate::simulate::{Condition, Indexing, IndirectBranch, LiteralSize, Register, Simulated};

/// What a probe can do with the instruction it displaces.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Classification {
    /// Emulate it in the BRK handler with [`simulate`](crate::simulate()),
    /// from this pre-decoded form.
    Simulate(Simulated),
    /// Execute it unchanged from an out-of-line slot at another address:
    /// it neither reads PC nor changes the flow of control, and produces the
    /// same result wherever it sits.
    StepOutOfLine,
    /// The probe must not be placed on it, for the stated reason.
    Reject(RejectReason),
}

/// Why an instruction cannot be probed.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum RejectReason {
    /// No instruction is allocated to this encoding.
    Unallocated,
    /// UDF: permanently undefined.
    PermanentlyUndefined,
    /// SVC, HVC, SMC, BRK, HLT, DCPS*, TCANCEL.
    ExceptionGenerating,
    /// ERET, ERETAA, ERETAB, DRPS.
    ExceptionReturn,
    /// MSR (register or immediate), MSRR, and PSTATE writes (CFINV, XAFLAG,
    /// AXFLAG, SMSTART/SMSTOP).
    SystemRegisterWrite,
    /// MRS DAIF: the slot runs with interrupts masked, so it would read the
    /// wrong value.
    DaifRead,
    /// A hint other than NOP, YIELD, BTI and the PAC-signing hints.
    UnsafeHint,
    /// LDXR/STXR and friends.
    Exclusive,
    /// BRAA, BLRAA, RETAA and the other pointer-authenticating branches.
    AuthenticatingBranch,
    /// A branch this crate does not simulate (e.g. FEAT_CMPBR compare-and-branch).
    BranchNotSimulated,
    /// A PC-relative instruction that is not simulated (SIMD&FP literal loads).
    PcRelativeNotSimulated,
    /// FEAT_MOPS prologue/main/epilogue memory copy and set.
    MemoryCopySet,
    /// MOVPRFX: the following instruction must be its partner.
    Prefix,
    /// FEAT_TME TSTART/TCOMMIT: a transaction cannot span the trap.
    Transactional,
}

impl RejectReason {
    /// A message a user can read.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Unallocated => "unallocated encoding",
            Self::PermanentlyUndefined => "permanently undefined instruction (UDF)",
            Self::ExceptionGenerating => "exception-generating instruction (SVC/HVC/SMC/BRK/HLT/DCPS)",
            Self::ExceptionReturn => "exception return (ERET/DRPS)",
            Self::SystemRegisterWrite => "system register or PSTATE write (MSR)",
            Self::DaifRead => "MRS DAIF: interrupts are masked while stepping, so it would read the wrong value",
            Self::UnsafeHint => "hint with side effects (WFE/WFI/SEV/ESB/CSDB/AUT*...): not stepped",
            Self::Exclusive => "exclusive load/store: stepping it would clear the monitor",
            Self::AuthenticatingBranch => "PAC-authenticating branch (not simulated exactly, cannot run out of line)",
            Self::BranchNotSimulated => "branch that is not simulated and cannot run out of line",
            Self::PcRelativeNotSimulated => "PC-relative load not simulated",
            Self::MemoryCopySet => "memory copy/set (MOPS) must run as one sequence",
            Self::Prefix => "MOVPRFX must be followed by the instruction it prefixes",
            Self::Transactional => "transactional memory instruction (TME)",
        }
    }
}

impl fmt::Display for RejectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Classifies one instruction word. Total: every `u32` gets an answer.
pub fn classify(insn: Insn) -> Classification {
    match insn.describe() {
        Some(description) => classify_allocated(insn, &description),
        None => Classification::Reject(RejectReason::Unallocated),
    }
}

fn classify_allocated(insn: Insn, description: &Description) -> Classification {
    use Classification::{Reject, Simulate, StepOutOfLine};
    if let Some(simulated) = simulated_form(insn, description) {
        return Simulate(simulated);
    }
    if let Some(reason) = reject_reason(insn, description) {
        return Reject(reason);
    }
    // Everything that changes PC or reads it has been simulated or rejected
    // above; `debug_assert` keeps that invariant honest in tests.
    debug_assert!(!description.is_branch && !description.is_pc_relative);
    StepOutOfLine
}

fn reject_reason(insn: Insn, description: &Description) -> Option<RejectReason> {
    let Some((id, definition)) = description.entry else {
        // Only FEAT_PAuth_LR's PC-relative forms come without a table entry.
        return Some(if description.is_branch {
            RejectReason::AuthenticatingBranch
        } else {
            RejectReason::PcRelativeNotSimulated
        });
    };
    let reason = match id {
        InsnId::UDF_UNDEFINED => RejectReason::PermanentlyUndefined,
        InsnId::ERET | InsnId::ERETAA | InsnId::ERETAB | InsnId::DRPS => RejectReason::ExceptionReturn,
        InsnId::LDXR_Rt_ADDR_SIMPLE
        | InsnId::LDXRB_Rt_ADDR_SIMPLE
        | InsnId::LDXRH_Rt_ADDR_SIMPLE
        | InsnId::LDAXR_Rt_ADDR_SIMPLE
        | InsnId::LDAXRB_Rt_ADDR_SIMPLE
        | InsnId::LDAXRH_Rt_ADDR_SIMPLE
        | InsnId::LDXP_Rt_Rt2_ADDR_SIMPLE
        | InsnId::LDAXP_Rt_Rt2_ADDR_SIMPLE
        | InsnId::STXR_Rs_Rt_ADDR_SIMPLE
        | InsnId::STXRB_Rs_Rt_ADDR_SIMPLE
        | InsnId::STXRH_Rs_Rt_ADDR_SIMPLE
        | InsnId::STLXR_Rs_Rt_ADDR_SIMPLE
        | InsnId::STLXRB_Rs_Rt_ADDR_SIMPLE
        | InsnId::STLXRH_Rs_Rt_ADDR_SIMPLE
        | InsnId::STXP_Rs_Rt_Rt2_ADDR_SIMPLE
        | InsnId::STLXP_Rs_Rt_Rt2_ADDR_SIMPLE => RejectReason::Exclusive,
        InsnId::BRAA_Rn_Rd_SP
        | InsnId::BRAAZ_Rn
        | InsnId::BRAB_Rn_Rd_SP
        | InsnId::BRABZ_Rn
        | InsnId::BLRAA_Rn_Rd_SP
        | InsnId::BLRAAZ_Rn
        | InsnId::BLRAB_Rn_Rd_SP
        | InsnId::BLRABZ_Rn
        | InsnId::RETAA
        | InsnId::RETAB => RejectReason::AuthenticatingBranch,
        _ if definition.class == InsnClass::EXCEPTION => RejectReason::ExceptionGenerating,
        _ if matches!(
            definition.feature_set,
            InsnFeatureSet::MOPS | InsnFeatureSet::MOPS_GO | InsnFeatureSet::MOPS_MEMTAG
        ) =>
        {
            RejectReason::MemoryCopySet
        }
        _ if definition.feature_set == InsnFeatureSet::TME => RejectReason::Transactional,
        _ if definition.flags.contains(InsnFlags::RESTRICTED_NEXT_INSN_SET) => RejectReason::Prefix,
        _ if is_system_register_write(insn)
            || matches!(definition.class, InsnClass::SME_START | InsnClass::SME_STOP) =>
        {
            RejectReason::SystemRegisterWrite
        }
        // MRS DAIF, Arm ARM C5.2.2: op0=3 op1=3 CRn=4 CRm=2 op2=1.
        _ if insn.word() & 0xffff_ffe0 == 0xd53b_4220 => RejectReason::DaifRead,
        _ if is_hint(insn) => match hint_policy(insn) {
            HintPolicy::Unsafe => RejectReason::UnsafeHint,
            // NOP/YIELD/BTI are simulated before we get here.
            HintPolicy::Step | HintPolicy::Simulate => return None,
        },
        _ if description.is_branch => RejectReason::BranchNotSimulated,
        _ if description.is_pc_relative => RejectReason::PcRelativeNotSimulated,
        _ => return None,
    };
    Some(reason)
}

/// HINT, Arm ARM C6.2 "HINT": `1101 0101 0000 0011 0010 CRm op2 11111`.
fn is_hint(insn: Insn) -> bool {
    insn.word() & 0xffff_f01f == 0xd503_201f
}

/// MSR (immediate) and the other PSTATE writes (C5.1.3: op0=00, CRn=0100,
/// Rt=11111), MSR (register) (L=0, op0=1x) and MSRR (FEAT_SYSREG128).
fn is_system_register_write(insn: Insn) -> bool {
    let word = insn.word();
    word & 0xfff8_f01f == 0xd500_401f || word & 0xfff0_0000 == 0xd510_0000 || word & 0xfff0_0000 == 0xd550_0000
}

enum HintPolicy {
    Simulate,
    Step,
    Unsafe,
}

/// The hint number CRm:op2 decides; the list matches Linux's
/// `aarch64_insn_is_steppable_hint`, plus YIELD simulated as a NOP.
fn hint_policy(insn: Insn) -> HintPolicy {
    match insn.field(5, 7) {
        // NOP, YIELD, BTI, BTI c, BTI j, BTI jc: no architectural effect when
        // executed (BTI's check is on arrival, which the BRK has taken over).
        0 | 1 | 32 | 34 | 36 | 38 => HintPolicy::Simulate,
        // XPACLRI, PACIA1716, PACIB1716, PACIAZ, PACIASP, PACIBZ, PACIBSP:
        // they compute from registers only, and cannot fault.
        7 | 8 | 10 | 24 | 25 | 26 | 27 => HintPolicy::Step,
        _ => HintPolicy::Unsafe,
    }
}

/// The pre-decoded form of a simulated instruction, or `None`.
fn simulated_form(insn: Insn, description: &Description) -> Option<Simulated> {
    let (id, _) = description.entry?;
    let rd = Register::from_field(insn.rd());
    let rn = Register::from_field(insn.rn());
    let is_64 = insn.bit(31);
    let simulated = match id {
        _ if is_hint(insn) => match hint_policy(insn) {
            HintPolicy::Simulate => Simulated::Nop,
            _ => return None,
        },
        // C6.2 B, BL: imm26 at [25:0], scaled by 4.
        InsnId::B_ADDR_PCREL26 | InsnId::BL_ADDR_PCREL26 => {
            Simulated::Branch { offset: insn.signed_field(0, 26) << 2, link: insn.bit(31) }
        }
        // C6.2 B.cond, BC.cond: imm19 at [23:5], cond at [3:0].
        InsnId::B_C_ADDR_PCREL19 | InsnId::BC_C_ADDR_PCREL19 => Simulated::BranchConditional {
            condition: Condition::from_field(insn.field(0, 4) as u8),
            offset: insn.signed_field(5, 19) << 2,
        },
        // C6.2 CBZ, CBNZ: sf at 31, op at 24, imm19 at [23:5].
        InsnId::CBZ_Rt_ADDR_PCREL19 | InsnId::CBNZ_Rt_ADDR_PCREL19 => {
            Simulated::CompareBranch { rt: rd, is_64, if_nonzero: insn.bit(24), offset: insn.signed_field(5, 19) << 2 }
        }
        // C6.2 TBZ, TBNZ: b5 at 31, op at 24, b40 at [23:19], imm14 at [18:5].
        InsnId::TBZ_Rt_BIT_NUM_ADDR_PCREL14 | InsnId::TBNZ_Rt_BIT_NUM_ADDR_PCREL14 => Simulated::TestBranch {
            rt: rd,
            bit: ((insn.field(31, 1) << 5) | insn.field(19, 5)) as u8,
            if_nonzero: insn.bit(24),
            offset: insn.signed_field(5, 14) << 2,
        },
        InsnId::BR_Rn => Simulated::BranchRegister { rn, kind: IndirectBranch::Br },
        InsnId::BLR_Rn => Simulated::BranchRegister { rn, kind: IndirectBranch::Blr },
        InsnId::RET_Rn => Simulated::BranchRegister { rn, kind: IndirectBranch::Ret },
        // C6.2 ADR: immhi at [23:5], immlo at [30:29].
        InsnId::ADR_Rd_ADDR_PCREL21 => Simulated::Adr { rd, offset: adr_immediate(insn), page: false },
        // C6.2 ADRP: the same immediate, in 4 KiB pages.
        InsnId::ADRP_Rd_ADDR_ADRP => Simulated::Adr { rd, offset: adr_immediate(insn) << 12, page: true },
        // C6.2 LDR (literal), LDRSW (literal): opc at [31:30], V=0.
        InsnId::LDR_Rt_ADDR_PCREL19 | InsnId::LDRSW_Rt_ADDR_PCREL19 => Simulated::LoadLiteral {
            rt: rd,
            size: match insn.field(30, 2) {
                0b00 => LiteralSize::Word,
                0b01 => LiteralSize::Doubleword,
                _ => LiteralSize::SignedWord,
            },
            offset: insn.signed_field(5, 19) << 2,
        },
        // PRFM (literal) is a hint with no architectural effect.
        InsnId::PRFM_PRFOP_ADDR_PCREL19 => Simulated::Nop,
        // The tables have one entry for the signed-offset form and one for
        // both indexed forms (named after its W qualifier); the bits decide.
        InsnId::STP_Rt_Rt2_ADDR_SIMM7
        | InsnId::LDP_Rt_Rt2_ADDR_SIMM7
        | InsnId::STP_Rt_W_Rt2_W_ADDR_SIMM7_S_S
        | InsnId::LDP_Rt_W_Rt2_W_ADDR_SIMM7_S_S => {
            return load_store_pair(insn);
        }
        InsnId::ORR_Rd_Rn_Rm_SFT => return move_register(insn),
        InsnId::ADD_Rd_SP_Rn_SP_AIMM
        | InsnId::SUB_Rd_SP_Rn_SP_AIMM
        | InsnId::ADDS_Rd_Rn_SP_AIMM
        | InsnId::SUBS_Rd_Rn_SP_AIMM => Simulated::AddSubImmediate {
            rd,
            rn,
            // C6.2 ADD (immediate): sh at 22 shifts imm12 (at [21:10]) by 12.
            immediate: u64::from(insn.field(10, 12)) << (12 * insn.field(22, 1)),
            subtract: insn.bit(30),
            set_flags: insn.bit(29),
            is_64,
        },
        _ => return None,
    };
    Some(simulated)
}

/// `SignExtend(immhi:immlo)` of ADR/ADRP.
fn adr_immediate(insn: Insn) -> i64 {
    let immediate = (insn.field(5, 19) << 2) | insn.field(29, 2);
    Insn(immediate).signed_field(0, 21)
}

/// STP/LDP of X registers (C6.2 STP, LDP): `opc=10 101 V=0 idx L imm7 Rt2 Rn Rt`.
/// W-register, LDPSW and SIMD&FP pairs are stepped instead.
fn load_store_pair(insn: Insn) -> Option<Simulated> {
    if insn.field(30, 2) != 0b10 || insn.bit(26) {
        return None;
    }
    let indexing = match insn.field(23, 2) {
        0b01 => Indexing::PostIndex,
        0b11 => Indexing::PreIndex,
        0b10 => Indexing::SignedOffset,
        // 0b00 is STNP/LDNP, which the decoder names differently.
        _ => return None,
    };
    let load = insn.bit(22);
    let (t, t2, n) = (insn.rd(), insn.rt2(), insn.rn());
    let writeback = indexing != Indexing::SignedOffset;
    // CONSTRAINED UNPREDICTABLE (Arm ARM K1.2.x, "LDP"/"STP"): writeback onto
    // a transfer register, or LDP loading one register twice. Stepping runs
    // the real CPU's chosen behaviour; simulating would have to guess it.
    if writeback && n != 31 && (t == n || t2 == n) {
        return None;
    }
    if load && t == t2 {
        return None;
    }
    Some(Simulated::LoadStorePair {
        load,
        rt: Register::from_field(t),
        rt2: Register::from_field(t2),
        rn: Register::from_field(n),
        offset: insn.signed_field(15, 7) << 3,
        indexing,
    })
}

/// MOV (register), C6.2: the alias `ORR <Xd>, XZR, <Xm>` with LSL #0.
fn move_register(insn: Insn) -> Option<Simulated> {
    // shift at [23:22] = 00, N at 21 = 0, imm6 at [15:10] = 0, Rn = 31.
    if insn.field(21, 3) != 0 || insn.field(10, 6) != 0 || insn.rn() != 31 {
        return None;
    }
    Some(Simulated::MoveRegister {
        rd: Register::from_field(insn.rd()),
        rm: Register::from_field(insn.rm()),
        is_64: insn.bit(31),
    })
}
