//! Encodings the decoder's tables match but the Arm ARM leaves unallocated.
//!
//! disarm64 matches each word against binutils' opcode/mask pairs only; it
//! does not run binutils' per-operand checks, so some reserved field values
//! decode as an instruction. Each rule below is the Arm ARM (DDI 0487) C6.2
//! or C7.2 pseudocode's `UNDEFINED` (or the C4.1 encoding table's
//! "unallocated") for the named form. The cross-check found the general
//! purpose, FP and load/store rules; the Advanced SIMD element-size rules
//! ([`SimdRule`], one table per encoding class) cover every class whose
//! entries leave `size`, `Q`, `immh`, `imm5` or a structure `opcode` free,
//! and were checked against LLVM 14's disassembler on 400,000 random words
//! of the Advanced SIMD encoding space (no disagreement except extensions
//! LLVM 14 lacks: FP8, FAMINMAX, F16F32DOT, the FMMLA forms).

use disarm64::decoder::InsnId;
use disarm64_defn::InsnClass;

use crate::insn::{Description, Insn};

/// True if the decoded `insn` is in fact unallocated (or always UNDEFINED).
pub(crate) fn is_reserved(insn: Insn, description: &Description) -> bool {
    let Some((id, definition)) = description.entry else {
        return false;
    };
    if let Some(rule) = advsimd_rule(definition.class, definition.mask, insn) {
        return rule.is_undefined(insn);
    }
    let sf = insn.bit(31);
    match definition.class {
        // ADD/SUB (immediate): bit 23 set is the tagged (ADDG) or min/max
        // (CSSC) group, whose own entries decode separately; bits[28:23] =
        // 100011 otherwise is unallocated.
        InsnClass::ADDSUB_IMM => {
            matches!(
                id,
                InsnId::ADD_Rd_SP_Rn_SP_AIMM
                    | InsnId::ADDS_Rd_Rn_SP_AIMM
                    | InsnId::SUB_Rd_SP_Rn_SP_AIMM
                    | InsnId::SUBS_Rd_Rn_SP_AIMM
            ) && insn.bit(23)
        }
        // ADD/SUB (shifted register): shift = 11 (ROR) is reserved, and 32-bit
        // forms need imm6<5> = 0; logical (shifted register) has only the latter.
        InsnClass::ADDSUB_SHIFT => insn.field(22, 2) == 0b11 || (!sf && insn.bit(15)),
        InsnClass::LOG_SHIFT => !sf && insn.bit(15),
        // ADD/SUB (extended register): a left shift (imm3) above 4 is UNDEFINED (C6.2 "ADD
        // (extended register)": "if shift > 4 then UNDEFINED").
        InsnClass::ADDSUB_EXT => insn.field(10, 3) > 4,
        // MOVN/MOVZ/MOVK: 32-bit forms need hw<1> = 0 (C6.2 "MOVZ": "if sf == '0' && hw<1> == '1'
        // then UNDEFINED").
        InsnClass::MOVEWIDE => !sf && insn.bit(22),
        // SBFM/BFM/UBFM: N must equal sf; 32-bit forms need immr<5> = imms<5> = 0.
        InsnClass::BITFIELD => insn.bit(22) != sf || (!sf && (insn.bit(21) || insn.bit(15))),
        // EXTR: N must equal sf; 32-bit needs imms<5> = 0.
        InsnClass::EXTRACT => insn.bit(22) != sf || (!sf && insn.bit(15)),
        // AND/ORR/EOR/ANDS (immediate): DecodeBitMasks' UNDEFINED cases.
        InsnClass::LOG_IMM => !valid_bit_mask(insn, sf),
        // Scalar FP: ftype = 10 is unallocated, except FMOV to/from the top
        // half of a vector (sf=1, ftype=10, rmode=01, opcode=11x).
        InsnClass::FLOATDP1
        | InsnClass::FLOATDP2
        | InsnClass::FLOATDP3
        | InsnClass::FLOATCMP
        | InsnClass::FLOATCCMP
        | InsnClass::FLOATSEL
        | InsnClass::FLOATIMM
        | InsnClass::FLOAT2FIX
        | InsnClass::FLOAT2INT => {
            let top_half_fmov = definition.class == InsnClass::FLOAT2INT
                && sf
                && insn.field(19, 2) == 0b01
                && insn.field(17, 2) == 0b11;
            let fcvt_to_same = description.mnemonic == "fcvt" && insn.field(15, 2) == insn.field(22, 2);
            // FP to/from fixed point: 32-bit needs scale<5> = 1.
            let fixed_scale = definition.class == InsnClass::FLOAT2FIX && !sf && !insn.bit(15);
            (insn.field(22, 2) == 0b10 && !top_half_fmov) || fcvt_to_same || fixed_scale
        }
        // LDR (literal), SIMD&FP: opc = 11 is unallocated.
        InsnClass::LOADLIT => insn.bit(26) && insn.field(30, 2) == 0b11,
        InsnClass::LDST_POS
        | InsnClass::LDST_IMM9
        | InsnClass::LDST_UNSCALED
        | InsnClass::LDST_REGOFF
        | InsnClass::LDST_UNPRIV => {
            // SIMD&FP registers: opc<1> = 1 means 128-bit, only with size = 00.
            let simd_size = insn.bit(26) && insn.bit(23) && insn.field(30, 2) != 0;
            // Register offset: option<1> = 0 (bit 14) is UNDEFINED.
            let bad_option = definition.class == InsnClass::LDST_REGOFF && !insn.bit(14);
            simd_size || bad_option
        }
        InsnClass::LSE_ATOMIC => {
            // CASP: Rs and Rt must be even (C6.2 CASP: "if Rs<0> == '1' then UNDEFINED").
            description.mnemonic.starts_with("casp") && (insn.bit(16) || insn.bit(0))
        }
        _ => {
            matches!(id, InsnId::MSR_SYSREG_Rt | InsnId::MRS_Rt_SYSREG)
            // MSR/MRS (register) need op0 = 1x; op0 = 00 is not a system register.
            && !insn.bit(20)
        }
    }
}

/// `DecodeBitMasks(N, imms, immr, TRUE)` succeeds (C6.2 "AND (immediate)").
fn valid_bit_mask(insn: Insn, sf: bool) -> bool {
    let n = insn.field(22, 1);
    let imms = insn.field(10, 6);
    if !sf && n == 1 {
        return false;
    }
    let combined = (n << 6) | (!imms & 0x3f);
    if combined == 0 {
        return false;
    }
    let len = 31 - combined.leading_zeros();
    if len < 1 {
        return false;
    }
    let levels = (1 << len) - 1;
    imms & levels != levels
}

/// An Advanced SIMD `UNDEFINED` condition on the element size and `Q`, as the
/// Arm ARM (C7.2) pseudocode states it for every instruction of the group.
/// Fields: `size` bits `[23:22]`, `sz` bit 22, `Q` bit 30, `immh` bits `[22:19]`,
/// `imm5` bits `[20:16]`; for structure loads/stores `size` is bits `[11:10]`.
#[derive(Clone, Copy)]
enum SimdRule {
    /// Every size the entry matches is allocated.
    Allocated,
    /// `if size:Q == '110' then UNDEFINED` (no 1D arrangement).
    NoOneD,
    /// `if size == '11' then UNDEFINED`.
    NotD,
    /// Scalar compare with zero, ABS, NEG: `if size != '11' then UNDEFINED`.
    OnlyD,
    /// PMUL, CNT: `if size != '00' then UNDEFINED` (bytes only).
    OnlyB,
    /// NOT, RBIT: `size<1> == '1'` is unallocated.
    NotOrRbit,
    /// `if size == '00' || size == '11' then UNDEFINED` (H and S only).
    OnlyHS,
    /// `if size != '10' then UNDEFINED` (SDOT/UDOT).
    OnlyS,
    /// ADDV, SADDLV, SMAXV, ...: `if size:Q == '100' || size == '11'`.
    AcrossLanes,
    /// FMAXV, FMINNMV, ...: `if sz:Q != '01' then UNDEFINED`.
    FpAcrossLanes,
    /// Floating point: `if sz:Q == '10' then UNDEFINED` (no 1D).
    FpNoOneD,
    /// `if sz == '1' then UNDEFINED` (FMLAL/FMLSL, URECPE, URSQRTE).
    SzZero,
    /// `if sz == '0' then UNDEFINED` (FCVTXN).
    SzOne,
    /// FCADD, FCMLA (vector): `if size == '00' || size:Q == '110'`.
    Complex,
    /// FCMLA (by element): `size` H or S; S needs `L == '0'` and `Q == '1'`;
    /// H with `Q == '0'` needs `H == '0'`.
    ComplexElement,
    /// FMLA, FMLS, FMUL, FMULX (by element, single/double): `sz:L == '11'`,
    /// and for vectors also `sz:Q == '10'`.
    FpElement,
    /// Three same, by `opcode` (bits `[15:11]`): [`THREE_SAME_BY_OPCODE`].
    ThreeSame,
    /// Scalar three same, by `opcode`: [`SCALAR_THREE_SAME_BY_OPCODE`].
    ScalarThreeSame,
    /// REV16, REV32, REV64: `if UInt(o0:U) + UInt(size) >= 3 then UNDEFINED`.
    Reverse,
    /// Shift by immediate (vector): `if immh<3>:Q == '10' then UNDEFINED`;
    /// `immh == '0000'` is the modified-immediate group, never a shift.
    ShiftNoOneD,
    /// Narrowing and lengthening shifts (vector): `if immh<3> == '1'`
    /// (and `immh == '0000'`, as above).
    ShiftNarrow,
    /// Fixed-point conversions (vector): `immh == '000x'` or `immh<3>:Q == '10'`.
    FixedPoint,
    /// Scalar shift of a D register only: `if immh<3> != '1' then UNDEFINED`.
    ScalarShiftD,
    /// Scalar SQSHL, UQSHL, SQSHLU (immediate): `immh == '0000'` is unallocated.
    ScalarShiftAny,
    /// Scalar narrowing shifts: `immh == '0000'` or `immh<3> == '1'`.
    ScalarShiftNarrow,
    /// Scalar fixed-point conversions: `if immh == '000x' then UNDEFINED`.
    ScalarFixedPoint,
    /// EXT: `if Q == '0' && imm4<3> == '1' then UNDEFINED`.
    Extract,
    /// DUP (element, general): with `size = LowestSetBit(imm5)`,
    /// `size > 3`, or `size == 3 && Q == '0'`.
    Duplicate,
    /// INS (element, general): `if imm5 == 'x0000' then UNDEFINED`.
    Insert,
    /// SMOV: B or H to W (`Q == '0'`), B, H or S to X (`Q == '1'`).
    SignedMove,
    /// UMOV: B, H or S to W (`Q == '0'`), D to X (`Q == '1'`).
    UnsignedMove,
    /// LD/ST (multiple structures): `opcode` must name a form, and
    /// `if size:Q == '110' && selem != 1 then UNDEFINED`.
    MultipleStructures,
    /// LD/ST (single structure): the checks on `scale = opcode<2:1>`:
    /// replicate needs `L == '1'` and `S == '0'`; H needs `size<0> == '0'`;
    /// S/D needs `size<1> == '0'`, and D needs `S == '0'`.
    SingleStructure,
}

/// One table row: the first row of a class with `word & mask == value`
/// gives the rule. Masks select `U` (bit 29) and the `opcode` field.
type Rows = &'static [(u32, u32, SimdRule)];

/// Advanced SIMD three same and three same (extra), C4.1.95.
const THREE_SAME: Rows = &[
    // FCMLA (vector): U=1, bit 21 = 0, bits `[15:10]` = 110xx1.
    (0x2020_e400, 0x2000_c400, SimdRule::Complex),
    // FCADD: U=1, bit 21 = 0, bits `[15:10]` = 111x01.
    (0x2020_ec00, 0x2000_e400, SimdRule::Complex),
    // FMLAL/FMLSL (vector), opcode 11101 (U=0), FMLAL2/FMLSL2 11001 (U=1).
    (0x2020_fc00, 0x0020_ec00, SimdRule::SzZero),
    (0x2020_fc00, 0x2020_cc00, SimdRule::SzZero),
    // SQRDMLAH/SQRDMLSH (vector and scalar): U=1, opcode 000x.
    (0x2020_f400, 0x2000_8400, SimdRule::OnlyHS),
    // PMUL: U=1, opcode 10011.
    (0x2020_f800, 0x2020_9800, SimdRule::OnlyB),
    // The rest of three same (bit 21 = 1), by opcode.
    (0x0020_0000, 0x0020_0000, SimdRule::ThreeSame),
    (0, 0, SimdRule::Allocated),
];

/// Advanced SIMD three same, indexed by `opcode` (bits `[15:11]`), as in the
/// C4.1.95 encoding table; the U=1 twin of each row has the same rule.
const THREE_SAME_BY_OPCODE: [SimdRule; 32] = {
    use SimdRule::{Allocated, FpNoOneD, NoOneD, NotD, OnlyHS};
    [
        NotD,      // 00000 SHADD, UHADD
        NoOneD,    // 00001 SQADD, UQADD
        NotD,      // 00010 SRHADD, URHADD
        Allocated, // 00011 AND, BIC, ORR, ORN, EOR, BSL, BIT, BIF (size is opc2)
        NotD,      // 00100 SHSUB, UHSUB
        NoOneD,    // 00101 SQSUB, UQSUB
        NoOneD,    // 00110 CMGT, CMHI
        NoOneD,    // 00111 CMGE, CMHS
        NoOneD,    // 01000 SSHL, USHL
        NoOneD,    // 01001 SQSHL, UQSHL
        NoOneD,    // 01010 SRSHL, URSHL
        NoOneD,    // 01011 SQRSHL, UQRSHL
        NotD,      // 01100 SMAX, UMAX
        NotD,      // 01101 SMIN, UMIN
        NotD,      // 01110 SABD, UABD
        NotD,      // 01111 SABA, UABA
        NoOneD,    // 10000 ADD, SUB
        NoOneD,    // 10001 CMTST, CMEQ
        NotD,      // 10010 MLA, MLS
        NotD,      // 10011 MUL (PMUL above)
        NotD,      // 10100 SMAXP, UMAXP
        NotD,      // 10101 SMINP, UMINP
        OnlyHS,    // 10110 SQDMULH, SQRDMULH
        NoOneD,    // 10111 ADDP
        // 11xxx: FMAXNM, FMLA, FADD, FMULX, FCMEQ, FMAX, FRECPS, FMINNM, ...
        FpNoOneD, FpNoOneD, FpNoOneD, FpNoOneD, FpNoOneD, FpNoOneD, FpNoOneD, FpNoOneD,
    ]
};

/// Advanced SIMD scalar three same, indexed by `opcode` (bits `[15:11]`).
const SCALAR_THREE_SAME_BY_OPCODE: [SimdRule; 32] = {
    use SimdRule::{Allocated, OnlyD, OnlyHS};
    // Opcodes without a scalar instruction have no table entry to reach
    // this; `Allocated` there changes nothing.
    let mut rules = [Allocated; 32];
    rules[0b00110] = OnlyD; // CMGT, CMHI
    rules[0b00111] = OnlyD; // CMGE, CMHS
    rules[0b01000] = OnlyD; // SSHL, USHL
    rules[0b01010] = OnlyD; // SRSHL, URSHL
    rules[0b10000] = OnlyD; // ADD, SUB
    rules[0b10001] = OnlyD; // CMTST, CMEQ
    rules[0b10110] = OnlyHS; // SQDMULH, SQRDMULH
    // SQADD, SQSUB, SQSHL, SQRSHL (and U forms): any size; 11xxx FP: S or D.
    rules
};

/// Advanced SIMD two-register miscellaneous, opcode bits `[16:12]`.
const TWO_REG_MISC: Rows = &[
    // FSCALE (FEAT_FP8) sits in this class with a three-same layout (bit 10
    // = 1, Rm at bits `[20:16]`): `if sz:Q == '10' then UNDEFINED`.
    (0x0000_0400, 0x0000_0400, SimdRule::FpNoOneD),
    // REV64 (U=0, 00000), REV16 (U=0, 00001), REV32 (U=1, 00000).
    (0x0001_e000, 0x0000_0000, SimdRule::Reverse),
    // CNT (U=0, 00101): bytes only; NOT, RBIT (U=1, 00101): size<1> = 0.
    (0x2001_f000, 0x0000_5000, SimdRule::OnlyB),
    (0x2001_f000, 0x2000_5000, SimdRule::NotOrRbit),
    // SADDLP/UADDLP (00010), SADALP/UADALP (00110), CLS/CLZ (00100).
    (0x0001_b000, 0x0000_2000, SimdRule::NotD),
    (0x0001_f000, 0x0000_4000, SimdRule::NotD),
    // XTN, SQXTUN, SHLL (1001x), SQXTN/UQXTN (10100): no D source.
    (0x0001_e000, 0x0001_2000, SimdRule::NotD),
    (0x0001_f000, 0x0001_4000, SimdRule::NotD),
    // FCVTXN (U=1, size<1>=0, 10110): double source only; FCVTN, FCVTL.
    (0x2081_f000, 0x2001_6000, SimdRule::SzOne),
    (0x0001_e000, 0x0001_6000, SimdRule::Allocated),
    // URECPE/URSQRTE (size<1>=1, 11100): single only.
    (0x0081_f000, 0x0081_c000, SimdRule::SzZero),
    // Floating point: opcode 11xxx, and 011xx with size<1>=1.
    (0x0001_8000, 0x0001_8000, SimdRule::FpNoOneD),
    (0x0081_c000, 0x0080_c000, SimdRule::FpNoOneD),
    // Integer (SUQADD, CLS, SQABS, CMGT zero, ABS, NEG, ...): no 1D.
    (0, 0, SimdRule::NoOneD),
];

/// Advanced SIMD scalar two-register miscellaneous.
const SCALAR_TWO_REG_MISC: Rows = &[
    // CMGT, CMEQ, CMLT, ABS, CMGE, CMLE, NEG (010xx): D only.
    (0x0001_c000, 0x0000_8000, SimdRule::OnlyD),
    // SQXTUN (1001x), SQXTN/UQXTN (10100): no D source.
    (0x0001_e000, 0x0001_2000, SimdRule::NotD),
    (0x0001_f000, 0x0001_4000, SimdRule::NotD),
    // FCVTXN (U=1, 10110).
    (0x2001_f000, 0x2001_6000, SimdRule::SzOne),
    (0, 0, SimdRule::Allocated),
];

/// Advanced SIMD across lanes, opcode bits `[16:12]`.
const ACROSS_LANES: Rows = &[
    // FMAXNMV, FMAXV, FMINNMV, FMINV: single (U=1, 011xx) 4S only.
    (0x2001_c000, 0x2000_c000, SimdRule::FpAcrossLanes),
    (0, 0, SimdRule::AcrossLanes),
];

/// Advanced SIMD (scalar) shift by immediate, opcode bits `[15:11]`.
const SHIFT_IMMEDIATE: Rows = &[
    // SCVTF/UCVTF (11100), FCVTZS/FCVTZU (11111).
    (0x0000_fc00, 0x0000_e400, SimdRule::FixedPoint),
    (0x0000_fc00, 0x0000_fc00, SimdRule::FixedPoint),
    // SHRN..UQRSHRN (100xx), SSHLL/USHLL (10100).
    (0x0000_e000, 0x0000_8000, SimdRule::ShiftNarrow),
    (0x0000_fc00, 0x0000_a400, SimdRule::ShiftNarrow),
    // SSHR, SSRA, SRSHR, SRSRA, SHL, SLI, SRI, SQSHLU, SQSHL, UQSHL.
    (0, 0, SimdRule::ShiftNoOneD),
];

const SCALAR_SHIFT_IMMEDIATE: Rows = &[
    (0x0000_fc00, 0x0000_e400, SimdRule::ScalarFixedPoint),
    (0x0000_fc00, 0x0000_fc00, SimdRule::ScalarFixedPoint),
    (0x0000_e000, 0x0000_8000, SimdRule::ScalarShiftNarrow),
    // SQSHLU (01100), SQSHL/UQSHL (01110): any element size.
    (0x0000_ec00, 0x0000_6400, SimdRule::ScalarShiftAny),
    // SSHR, SSRA, SRSHR, SRSRA, SHL, SLI, SRI: D only.
    (0, 0, SimdRule::ScalarShiftD),
];

/// Advanced SIMD (scalar) x indexed element, opcode bits `[15:12]`.
const BY_ELEMENT: Rows = &[
    // FCMLA (by element): U=1, opcode 0xx1.
    (0x2000_9000, 0x2000_1000, SimdRule::ComplexElement),
    // FMLA (0001), FMLS (0101), FMUL/FMULX (1001) with size<1> = 1.
    (0x0080_b000, 0x0080_1000, SimdRule::FpElement),
    (0x0080_f000, 0x0080_9000, SimdRule::FpElement),
    // SDOT/UDOT (1110).
    (0x0000_f000, 0x0000_e000, SimdRule::OnlyS),
    // MUL, MLA, MLS, SQDMULH, SQRDMULH, SQRDMLAH, SQRDMLSH and the long
    // forms (SMLAL, SQDMULL, ...): H and S only.
    (0, 0, SimdRule::OnlyHS),
];

/// Advanced SIMD three different, opcode bits `[15:12]`.
const THREE_DIFFERENT: Rows = &[
    // SQDMLAL (1001), SQDMLSL (1011), SQDMULL (1101): H and S only.
    (0x0000_d000, 0x0000_9000, SimdRule::OnlyHS),
    (0x0000_f000, 0x0000_d000, SimdRule::OnlyHS),
    // PMULL (1110) has its own entries for 8B and 1D.
    (0x0000_f000, 0x0000_e000, SimdRule::Allocated),
    // The rest have no D source.
    (0, 0, SimdRule::NotD),
];

/// Advanced SIMD copy, op bit 29 and imm4 bits `[14:11]`.
const COPY: Rows = &[
    // INS (element).
    (0x2000_0000, 0x2000_0000, SimdRule::Insert),
    // DUP (element) 0000, DUP (general) 0001, INS (general) 0011,
    // SMOV 0101, UMOV 0111.
    (0x0000_7000, 0x0000_0000, SimdRule::Duplicate),
    (0x0000_7800, 0x0000_1800, SimdRule::Insert),
    (0x0000_7800, 0x0000_2800, SimdRule::SignedMove),
    (0x0000_7800, 0x0000_3800, SimdRule::UnsignedMove),
];

/// Advanced SIMD scalar pairwise: ADDP (U=0, 11011) is D only; the FP
/// forms take S or D.
const SCALAR_PAIRWISE: Rows = &[(0x2001_f000, 0x0001_b000, SimdRule::OnlyD), (0, 0, SimdRule::Allocated)];

const SCALAR_THREE_SAME: Rows = &[(0x0020_0000, 0x0020_0000, SimdRule::ScalarThreeSame), (0, 0, SimdRule::Allocated)];
const EVERY_SIZE_BUT_1D: Rows = &[(0, 0, SimdRule::NoOneD)];
const ONLY_S: Rows = &[(0, 0, SimdRule::OnlyS)];
const EXTRACT: Rows = &[(0, 0, SimdRule::Extract)];
const MULTIPLE_STRUCTURES: Rows = &[(0, 0, SimdRule::MultipleStructures)];
const SINGLE_STRUCTURE: Rows = &[(0, 0, SimdRule::SingleStructure)];

/// The Advanced SIMD rule for `insn`, decoded as an entry of `class` with
/// opcode mask `mask`, if one applies.
fn advsimd_rule(class: InsnClass, mask: u32, insn: Insn) -> Option<SimdRule> {
    // An entry that fixes `size` itself (bits `[23:22]`) allows only that size.
    let size_fixed = mask & 0x00c0_0000 == 0x00c0_0000;
    let rows = match class {
        InsnClass::ASIMDSAME if !size_fixed => THREE_SAME,
        InsnClass::ASIMDMISC if !size_fixed => TWO_REG_MISC,
        InsnClass::ASISDMISC if !size_fixed => SCALAR_TWO_REG_MISC,
        InsnClass::ASIMDALL if !size_fixed => ACROSS_LANES,
        InsnClass::ASIMDELEM | InsnClass::ASISDELEM if !size_fixed => BY_ELEMENT,
        InsnClass::ASIMDDIFF | InsnClass::ASISDDIFF if !size_fixed => THREE_DIFFERENT,
        InsnClass::ASIMDPERM if !size_fixed => EVERY_SIZE_BUT_1D,
        InsnClass::ASISDSAME if !size_fixed => SCALAR_THREE_SAME,
        InsnClass::ASISDPAIR if !size_fixed => SCALAR_PAIRWISE,
        // DUP (element), scalar: `imm5 == 'x0000'` is UNDEFINED.
        InsnClass::ASISDONE => &[(0, 0, SimdRule::Insert)],
        InsnClass::DOTPRODUCT if !size_fixed => ONLY_S,
        InsnClass::ASIMDSHF => SHIFT_IMMEDIATE,
        InsnClass::ASISDSHF => SCALAR_SHIFT_IMMEDIATE,
        InsnClass::ASIMDINS => COPY,
        InsnClass::ASIMDEXT => EXTRACT,
        InsnClass::ASISDLSE | InsnClass::ASISDLSEP => MULTIPLE_STRUCTURES,
        InsnClass::ASISDLSO | InsnClass::ASISDLSOP => SINGLE_STRUCTURE,
        _ => return None,
    };
    rows.iter().find(|&&(mask, value, _)| insn.word() & mask == value).map(|&(_, _, rule)| rule)
}

impl SimdRule {
    /// True if `insn` hits this rule's `UNDEFINED` condition.
    fn is_undefined(self, insn: Insn) -> bool {
        let size = insn.field(22, 2);
        let sz = insn.bit(22);
        let q = insn.bit(30);
        let immh = insn.field(19, 4);
        let imm5 = insn.field(16, 5);
        match self {
            Self::Allocated => false,
            Self::NoOneD => size == 0b11 && !q,
            Self::NotD => size == 0b11,
            Self::OnlyD => size != 0b11,
            Self::OnlyB => size != 0b00,
            Self::NotOrRbit => size & 0b10 != 0,
            Self::ThreeSame => THREE_SAME_BY_OPCODE[insn.field(11, 5) as usize].is_undefined(insn),
            Self::ScalarThreeSame => SCALAR_THREE_SAME_BY_OPCODE[insn.field(11, 5) as usize].is_undefined(insn),
            Self::OnlyHS => size == 0b00 || size == 0b11,
            Self::OnlyS => size != 0b10,
            Self::AcrossLanes => size == 0b11 || (size == 0b10 && !q),
            Self::FpAcrossLanes => sz || !q,
            Self::FpNoOneD => sz && !q,
            Self::SzZero => sz,
            Self::SzOne => !sz,
            Self::Complex => size == 0b00 || (size == 0b11 && !q),
            Self::ComplexElement => match size {
                0b01 => insn.bit(11) && !q,
                0b10 => insn.bit(21) || !q,
                _ => true,
            },
            // Bit 28 is 1 in the scalar group, which has no Q.
            Self::FpElement => sz && (insn.bit(21) || (!q && !insn.bit(28))),
            Self::Reverse => (insn.field(12, 1) << 1 | insn.field(29, 1)) + size >= 3,
            Self::ShiftNoOneD => immh == 0 || (immh >> 3 == 1 && !q),
            Self::ShiftNarrow => immh == 0 || immh >> 3 == 1,
            Self::FixedPoint => immh >> 1 == 0 || (immh >> 3 == 1 && !q),
            Self::ScalarShiftD => immh >> 3 == 0,
            Self::ScalarShiftAny => immh == 0,
            Self::ScalarShiftNarrow => immh == 0 || immh >> 3 == 1,
            Self::ScalarFixedPoint => immh >> 1 == 0,
            Self::Extract => !q && insn.bit(14),
            Self::Duplicate => imm5 & 0xf == 0 || (imm5 & 0xf == 0b1000 && !q),
            Self::Insert => imm5 & 0xf == 0,
            Self::SignedMove => {
                let allowed = imm5 & 1 == 1 || imm5 & 0b11 == 0b10 || (q && imm5 & 0b111 == 0b100);
                !allowed
            }
            Self::UnsignedMove => {
                let to_w = imm5 & 1 == 1 || imm5 & 0b11 == 0b10 || imm5 & 0b111 == 0b100;
                if q { imm5 & 0xf != 0b1000 } else { !to_w }
            }
            Self::MultipleStructures => {
                let size = insn.field(10, 2);
                match insn.field(12, 4) {
                    // LD4/ST4, LD3/ST3, LD2/ST2.
                    0b0000 | 0b0100 | 0b1000 => size == 0b11 && !q,
                    // LD1/ST1 with four, three, one and two registers.
                    0b0010 | 0b0110 | 0b0111 | 0b1010 => false,
                    _ => true,
                }
            }
            Self::SingleStructure => {
                let (load, s, size) = (insn.bit(22), insn.bit(12), insn.field(10, 2));
                match insn.field(14, 2) {
                    0b11 => !load || s,
                    0b01 => size & 0b01 != 0,
                    0b10 => size & 0b10 != 0 || (size == 0b01 && s),
                    _ => false,
                }
            }
        }
    }
}
