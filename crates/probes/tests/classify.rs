//! Host tests for `classify`: every simulated, stepped and rejected group.
//!
//! Words were assembled with `llvm-mc -triple=aarch64 -show-encoding` and the
//! expected answers follow the Arm ARM (DDI 0487) C6.2 entries and Linux's
//! kprobes policy. The last section pins the cross-check's disagreements.

use probes::{
    Classification, Condition, Indexing, IndirectBranch, Insn, LiteralSize, Register, RejectReason, Simulated, classify,
};

fn class(word: u32) -> Classification {
    classify(Insn(word))
}

fn simulated(word: u32) -> Simulated {
    match class(word) {
        Classification::Simulate(form) => form,
        other => panic!("{word:#010x}: expected Simulate, got {other:?}"),
    }
}

fn rejected(word: u32) -> RejectReason {
    match class(word) {
        Classification::Reject(reason) => reason,
        other => panic!("{word:#010x}: expected Reject, got {other:?}"),
    }
}

fn r(n: u8) -> Register {
    Register::new(n).unwrap()
}

#[test]
fn hints_simulated_as_nop() {
    for word in [
        0xd503_201f, // nop
        0xd503_203f, // yield
        0xd503_241f, // bti
        0xd503_245f, // bti c
        0xd503_249f, // bti j
        0xd503_24df, // bti jc
        0xd800_0080, // prfm pldl1keep, #16 (literal)
    ] {
        assert_eq!(simulated(word), Simulated::Nop, "{word:#010x}");
    }
}

#[test]
fn push_frame_record_is_simulated() {
    // stp x29, x30, [sp, #-16]!
    assert_eq!(
        simulated(0xa9bf_7bfd),
        Simulated::LoadStorePair {
            load: false,
            rt: r(29),
            rt2: r(30),
            rn: r(31),
            offset: -16,
            indexing: Indexing::PreIndex,
        }
    );
    // ldp x29, x30, [sp], #16
    assert_eq!(
        simulated(0xa8c1_7bfd),
        Simulated::LoadStorePair {
            load: true,
            rt: r(29),
            rt2: r(30),
            rn: r(31),
            offset: 16,
            indexing: Indexing::PostIndex,
        }
    );
}

#[test]
fn pair_immediates_at_their_limits() {
    // stp x0, x1, [x2, #504]: imm7 = +63, the maximum.
    let Simulated::LoadStorePair { offset, indexing, .. } = simulated(0xa91f_8440) else { panic!() };
    assert_eq!((offset, indexing), (504, Indexing::SignedOffset));
    // stp x0, x1, [x2, #-512]: imm7 = -64, the minimum.
    let Simulated::LoadStorePair { offset, .. } = simulated(0xa920_0440) else { panic!() };
    assert_eq!(offset, -512);
}

#[test]
fn constrained_unpredictable_pairs_are_stepped() {
    // stp x1, x2, [x1, #16]!  (writeback base is a source: Arm ARM K1)
    assert_eq!(class(0xa981_0821), Classification::StepOutOfLine);
    // ldp x1, x2, [x1], #16   (writeback base is a destination)
    assert_eq!(class(0xa8c1_0821), Classification::StepOutOfLine);
    // ldp x1, x1, [x2]        (Rt == Rt2)
    assert_eq!(class(0xa940_0441), Classification::StepOutOfLine);
    // stp xzr, xzr, [sp, #-16]!: Rt = Rn = 31 is XZR vs SP, not an overlap.
    assert!(matches!(class(0xa9bf_7fff), Classification::Simulate(_)));
}

#[test]
fn other_pairs_are_stepped() {
    for word in [
        0x29bf_07e0, // stp w0, w1, [sp, #-8]!
        0x6940_07e0, // ldpsw x0, x1, [sp]
        0xa800_07e0, // stnp x0, x1, [sp]
        0xadbf_07e0, // stp q0, q1, [sp, #-32]!
    ] {
        assert_eq!(class(word), Classification::StepOutOfLine, "{word:#010x}");
    }
}

#[test]
fn move_and_add_sub_immediate() {
    let mov = |rd, rm, is_64| Simulated::MoveRegister { rd: r(rd), rm: r(rm), is_64 };
    assert_eq!(simulated(0xaa01_03e0), mov(0, 1, true)); // mov x0, x1
    assert_eq!(simulated(0x2a01_03e0), mov(0, 1, false)); // mov w0, w1
    assert_eq!(simulated(0xaa1f_03e0), mov(0, 31, true)); // mov x0, xzr
    // orr x0, x1, x2 is not a move: stepped.
    assert_eq!(class(0xaa02_0020), Classification::StepOutOfLine);
    let add = |rd, rn, immediate, subtract, set_flags, is_64| Simulated::AddSubImmediate {
        rd: r(rd),
        rn: r(rn),
        immediate,
        subtract,
        set_flags,
        is_64,
    };
    assert_eq!(simulated(0x9100_003f), add(31, 1, 0, false, false, true)); // mov sp, x1
    assert_eq!(simulated(0x9100_03e1), add(1, 31, 0, false, false, true)); // mov x1, sp
    assert_eq!(simulated(0xd100_43ff), add(31, 31, 16, true, false, true)); // sub sp, sp, #16
    assert_eq!(simulated(0xd140_07ff), add(31, 31, 4096, true, false, true)); // sub sp, sp, #1, lsl #12
    assert_eq!(simulated(0x113f_fc20), add(0, 1, 4095, false, false, false)); // add w0, w1, #4095
    assert_eq!(simulated(0xf17f_ffff), add(31, 31, 4095 << 12, true, true, true)); // cmp sp, #4095, lsl #12
    assert_eq!(simulated(0xb100_047f), add(31, 3, 1, false, true, true)); // cmn x3, #1
}

#[test]
fn branches_are_simulated() {
    assert_eq!(simulated(0x1400_0000), Simulated::Branch { offset: 0, link: false });
    assert_eq!(simulated(0x9400_0001), Simulated::Branch { offset: 4, link: true });
    // The last and first reachable targets of B.
    assert_eq!(simulated(0x15ff_ffff), Simulated::Branch { offset: (1 << 27) - 4, link: false });
    assert_eq!(simulated(0x1600_0000), Simulated::Branch { offset: -(1 << 27), link: false });
    let cond = |bits, offset| Simulated::BranchConditional { condition: Condition::from_field(bits), offset };
    assert_eq!(simulated(0x5400_0040), cond(0b0000, 8)); // b.eq #8
    assert_eq!(simulated(0x54ff_ffee), cond(0b1110, -4)); // b.al #-4
    assert_eq!(simulated(0x5400_006f), cond(0b1111, 12)); // b.nv #12
    assert_eq!(simulated(0x5400_0091), cond(0b0001, 16)); // bc.ne #16
    assert_eq!(
        simulated(0xb47f_ffe0), // cbz x0, #1048572
        Simulated::CompareBranch { rt: r(0), is_64: true, if_nonzero: false, offset: (1 << 20) - 4 }
    );
    assert_eq!(
        simulated(0x3580_0001), // cbnz w1, #-1048576
        Simulated::CompareBranch { rt: r(1), is_64: false, if_nonzero: true, offset: -(1 << 20) }
    );
    assert_eq!(
        simulated(0xb6fb_ffe2), // tbz x2, #63, #32764
        Simulated::TestBranch { rt: r(2), bit: 63, if_nonzero: false, offset: (1 << 15) - 4 }
    );
    assert_eq!(
        simulated(0x3704_0003), // tbnz w3, #0, #-32768
        Simulated::TestBranch { rt: r(3), bit: 0, if_nonzero: true, offset: -(1 << 15) }
    );
    let indirect = |rn, kind| Simulated::BranchRegister { rn: r(rn), kind };
    assert_eq!(simulated(0xd61f_0200), indirect(16, IndirectBranch::Br)); // br x16
    assert_eq!(simulated(0xd63f_03c0), indirect(30, IndirectBranch::Blr)); // blr x30
    assert_eq!(simulated(0xd65f_03c0), indirect(30, IndirectBranch::Ret)); // ret
    assert_eq!(simulated(0xd65f_0020), indirect(1, IndirectBranch::Ret)); // ret x1
    assert_eq!(simulated(0xd61f_03e0), indirect(31, IndirectBranch::Br)); // br xzr
}

#[test]
fn pc_relative_data_is_simulated() {
    let adr = |rd, offset, page| Simulated::Adr { rd: r(rd), offset, page };
    assert_eq!(simulated(0x707f_ffe0), adr(0, (1 << 20) - 1, false)); // adr x0, #1048575
    assert_eq!(simulated(0x1080_0000), adr(0, -(1 << 20), false)); // adr x0, #-1048576
    assert_eq!(simulated(0xf07f_ffe0), adr(0, (1 << 32) - 4096, true)); // adrp x0, #4294963200
    assert_eq!(simulated(0x9080_0001), adr(1, -(1 << 32), true)); // adrp x1, #-4294967296
    let literal = |rt, size, offset| Simulated::LoadLiteral { rt: r(rt), size, offset };
    assert_eq!(simulated(0x1800_0040), literal(0, LiteralSize::Word, 8)); // ldr w0, #8
    assert_eq!(simulated(0x58ff_ffc0), literal(0, LiteralSize::Doubleword, -8)); // ldr x0, #-8
    assert_eq!(simulated(0x987f_ffe0), literal(0, LiteralSize::SignedWord, (1 << 20) - 4)); // ldrsw
    assert_eq!(simulated(0x5800_003f), literal(31, LiteralSize::Doubleword, 4)); // ldr xzr, #4
}

#[test]
fn stepped_out_of_line() {
    for word in [
        0xd503_233f, // paciasp
        0xd503_20ff, // xpaclri
        0xd53b_4200, // mrs x0, nzcv
        0xf940_0020, // ldr x0, [x1]
        0xf800_8c20, // str x0, [x1, #8]!
        0x8b02_0020, // add x0, x1, x2
        0xd503_3fdf, // isb
        0xd503_3f9f, // dsb sy
        0xd50b_7e20, // dc civac, x0
        0xd503_3f5f, // clrex
        0xc8df_fc20, // ldar x0, [x1]: ordered, not exclusive
        0xc89f_fc20, // stlr x0, [x1]
        0xc8a2_7c20, // cas x0, x1, [x2] (FEAT_LSE): one atomic instruction
    ] {
        assert_eq!(class(word), Classification::StepOutOfLine, "{word:#010x}");
    }
}

#[test]
fn rejected_with_reasons() {
    use RejectReason::*;
    for (word, reason) in [
        (0xd503_205f, UnsafeHint),             // wfe
        (0xd503_207f, UnsafeHint),             // wfi
        (0xd503_209f, UnsafeHint),             // sev
        (0xd503_229f, UnsafeHint),             // csdb
        (0xd503_23bf, UnsafeHint),             // autiasp: may fault with FEAT_FPAC
        (0xd53b_4220, DaifRead),               // mrs x0, daif
        (0xd503_42df, SystemRegisterWrite),    // msr daifset, #2
        (0xd51b_4200, SystemRegisterWrite),    // msr nzcv, x0
        (0xd500_401f, SystemRegisterWrite),    // cfinv
        (0xd503_477f, SystemRegisterWrite),    // smstart
        (0xd400_0001, ExceptionGenerating),    // svc #0
        (0xd400_0002, ExceptionGenerating),    // hvc #0
        (0xd420_0080, ExceptionGenerating),    // brk #4
        (0xd440_0000, ExceptionGenerating),    // hlt #0
        (0x0000_0000, PermanentlyUndefined),   // udf #0
        (0xd69f_03e0, ExceptionReturn),        // eret
        (0xd6bf_03e0, ExceptionReturn),        // drps
        (0xd65f_0bff, AuthenticatingBranch),   // retaa
        (0xd71f_0801, AuthenticatingBranch),   // braa x0, x1
        (0xd63f_083f, AuthenticatingBranch),   // blraaz x1
        (0xc85f_7c20, Exclusive),              // ldxr x0, [x1]
        (0xc802_7c20, Exclusive),              // stxr w2, x0, [x1]
        (0xc87f_8440, Exclusive),              // ldaxp x0, x1, [x2]
        (0x5c00_0040, PcRelativeNotSimulated), // ldr d0, #8
        (0x1901_0440, MemoryCopySet),          // cpyfp [x0]!, [x1]!, x2!
        (0xd523_3060, Transactional),          // tstart x0
        (0x0420_bc20, Prefix),                 // movprfx z0, z1
        (0xffff_ffff, Unallocated),
    ] {
        assert_eq!(rejected(word), reason, "{word:#010x}");
        assert!(!reason.as_str().is_empty());
        assert_eq!(reason.to_string(), reason.as_str());
    }
}

/// Disagreements the cross-check found, resolved by the Arm ARM; each row is
/// one family, with a representative word from the seeded sample.
#[test]
fn decoder_disagreements_resolved_by_the_arm_arm() {
    let allocated = |word: u32| Insn(word).describe().is_some();
    // disarm64 matched these; the Arm ARM says UNDEFINED / unallocated.
    for word in [
        0xb1d3_ae15, // adds (immediate) with bits[28:23] = 100011
        0xabc3_c26b, // adds (shifted register) with shift = ROR
        0x0b80_a511, // add w (shifted register) with imm6<5> = 1
        0x932c_57bf, // sbfm with sf != N
        0x1386_9fd9, // extr with sf != N
        0x9204_fe49, // and (immediate): DecodeBitMasks with imms = 111111
        0x1f92_033c, // fmadd with ftype = 10
        0xdcd1_749c, // ldr (literal, SIMD&FP) with opc = 11
        0xfdcf_58c5, // ldr (SIMD&FP) with size = 11, opc = 11
        0x78f2_a81a, // ldrsh (register) with option<1> = 0
        0xd503_0e37, // msr with op0 = 00 outside the PSTATE/hint groups
    ] {
        assert!(!allocated(word), "{word:#010x}");
        assert_eq!(rejected(word), RejectReason::Unallocated);
    }
    // yaxpeax-arm decoded these; the Arm ARM leaves them unallocated (or, for
    // should-be-one fields, CONSTRAINED UNPREDICTABLE, which we reject too).
    for word in [
        0x2a0a_ee57, // orr w (shifted register) with imm6<5> = 1
        0x3a69_a24e, // "ccmn" with bits[24:21] = 0011
        0x9aa6_51b0, // "csel" with bits[24:21] = 0101
        0x2000_9c82, // "udf" outside bits[31:16] = 0
        0xcd90_0066, // "st1" single structure with bit 31 = 1
        0x0cf8_2d1f, // "ld1" multiple structures with bit 21 = 1
        0x8852_6b87, // "ldxr" with Rs != 11111 (should-be-one)
        0x9b42_67f8, // "smulh" with Ra != 11111 (should-be-one)
        0xcef3_7092, // "sha512su0" with bits[23:21] = 111
        0x9af6_32fd, // "pacga" with bits[31:21] = 10011010111
        0xf39f_8581, // "autiasppc" with Rd != 11111
    ] {
        assert!(!allocated(word), "{word:#010x}");
    }
    // FEAT_PAuth_LR forms that disarm64 lacks but the Arm ARM allocates.
    assert_eq!(rejected(0xf380_001f), RejectReason::PcRelativeNotSimulated); // autiasppc
    assert_eq!(rejected(0xf3bf_ffff), RejectReason::PcRelativeNotSimulated); // autibsppc
    assert_eq!(rejected(0x5500_001f), RejectReason::AuthenticatingBranch); // retaasppc
    assert_eq!(rejected(0x552d_4eff), RejectReason::AuthenticatingBranch); // retabsppc
    // Newer instructions yaxpeax-arm does not know: allocated, and classified.
    assert_eq!(rejected(0xf5cb_180e), RejectReason::BranchNotSimulated); // cbeq (CMPBR)
}

/// The Advanced SIMD family: disarm64's tables leave `size`, `Q`, `immh`,
/// `imm5` or a structure `opcode` free where the Arm ARM (C7.2) makes some
/// values UNDEFINED. One row per rule in `src/reserved.rs`: the reserved
/// word (from the cross-check's sample where it had one) and an allocated
/// neighbour that differs only in the checked field. LLVM 14's disassembler
/// agrees on every word.
#[test]
fn advanced_simd_reserved_sizes_resolved_by_the_arm_arm() {
    for (reserved, allocated, rule) in [
        (0x0efb_0254, 0x0ebb_0254, "saddl: size == 11"),
        (0x4ee8_054a, 0x4ea8_054a, "shadd: size == 11"),
        (0x0ee0_298d, 0x0ea0_298d, "saddlp: size == 11"),
        (0x0ef7_87ef, 0x0eb7_87ef, "add (vector): size:Q == 110"),
        (0x0ee0_8a8a, 0x0ea0_8a8a, "cmgt (zero, vector): size:Q == 110"),
        (0x0ec4_2983, 0x0e84_2983, "trn1: size:Q == 110"),
        (0x5e20_8929, 0x5ee0_8929, "cmgt (zero, scalar): size != 11"),
        (0x5e20_8400, 0x5ee0_8400, "add (scalar): size != 11"),
        (0x0ea0_58df, 0x0e20_58df, "cnt: size != 00"),
        (0x2e60_9e4f, 0x2e20_9e4f, "pmul: size != 00"),
        (0x2ea0_5800, 0x2e60_5800, "rbit/not: size<1> == 1"),
        (0x0fdc_c324, 0x0f9c_c324, "sqdmulh (by element): size == 11"),
        (0x0ee1_d3e8, 0x0ea1_d3e8, "sqdmull: size == 11"),
        (0x2e0f_84e2, 0x2e4f_84e2, "sqrdmlah (vector): size == 00"),
        (0x5e34_b461, 0x5e74_b461, "sqdmulh (scalar): size == 00"),
        (0x4e1b_948f, 0x4e9b_948f, "sdot (vector): size != 10"),
        (0x2f73_e983, 0x2fb3_e983, "udot (by element): size != 10"),
        (0x0eb1_b865, 0x4eb1_b865, "addv: size:Q == 100"),
        (0x2e30_f800, 0x6e30_f800, "fmaxv: sz:Q != 01"),
        (0x0e7a_d609, 0x0e3a_d609, "fadd (vector): sz:Q == 10"),
        (0x0ee1_b944, 0x0ea1_b944, "fcvtzs (vector): sz:Q == 10"),
        (0x0e74_efd2, 0x0e34_efd2, "fmlal (vector): sz == 1"),
        (0x0ee1_ca19, 0x0ea1_ca19, "urecpe: sz == 1"),
        (0x7e21_693e, 0x7e61_693e, "fcvtxn (scalar): sz == 0"),
        (0x6e0b_e52a, 0x6e4b_e52a, "fcadd: size == 00"),
        (0x2f70_78f6, 0x6f70_78f6, "fcmla (by element): H with H == 1, Q == 0"),
        (0x6fa0_1000, 0x6f80_1000, "fcmla (by element): S with L == 1"),
        (0x0fc9_1b3a, 0x0f89_1b3a, "fmla (by element): sz:L == 11"),
        (0x5fe7_1a47, 0x5fa7_1a47, "fmla (by element, scalar): sz:L == 11"),
        (0x2ea0_0b52, 0x2e20_0b52, "rev32: o0:U + size >= 3"),
        (0x0f69_041e, 0x4f69_041e, "sshr (vector): immh<3>:Q == 10"),
        (0x0f05_8dbe, 0x0f0d_8dbe, "rshrn: immh == 0000 (modified immediate, o2 = 1)"),
        (0x0f65_8594, 0x0f25_8594, "shrn: immh<3> == 1"),
        (0x0f4c_fd9f, 0x4f4c_fd9f, "fcvtzs (vector, fixed-point): immh<3>:Q == 10"),
        (0x0f08_e400, 0x0f10_e400, "scvtf (vector, fixed-point): immh == 000x"),
        (0x5f31_070b, 0x5f71_070b, "sshr (scalar): immh<3> == 0"),
        (0x5f03_776d, 0x5f0b_776d, "sqshl (scalar, immediate): immh == 0000"),
        (0x7f50_8f7a, 0x7f10_8f7a, "sqrshrun (scalar): immh<3> == 1"),
        (0x5f05_e6ea, 0x5f25_e6ea, "scvtf (scalar, fixed-point): immh == 000x"),
        (0x2e1a_7330, 0x6e1a_7330, "ext: Q == 0 and imm4<3> == 1"),
        (0x0e08_0f67, 0x4e08_0f67, "dup (general): D with Q == 0"),
        (0x0e00_06ce, 0x0e01_06ce, "dup (element): imm5 == x0000"),
        (0x4e00_1d62, 0x4e01_1d62, "ins (general): imm5 == x0000"),
        (0x6e10_6465, 0x6e11_6465, "ins (element): imm5 == x0000"),
        (0x5e00_0420, 0x5e01_0420, "dup (element, scalar): imm5 == x0000"),
        (0x4e08_2db5, 0x4e04_2db5, "smov: D source"),
        (0x0e00_3c62, 0x0e04_3c62, "umov: imm5 == 00000"),
        (0x5e31_b800, 0x5ef1_b800, "addp (scalar): size != 11"),
        (0x4c40_e750, 0x4c40_a750, "ld/st multiple: opcode 1110 is unallocated"),
        (0x0c40_0c00, 0x4c40_0c00, "ld4 (multiple): size:Q == 110"),
        (0x4d40_5d18, 0x4d40_1d18, "ld1 (single, H): size<0> == 1"),
        (0x0d40_d000, 0x0d40_c000, "ld1r: S == 1"),
        (0x0d00_c000, 0x0d40_c000, "ld1r: L == 0 (no store-replicate)"),
        (0x0d40_9400, 0x0d40_8400, "ld1 (single, D): S == 1"),
    ] {
        assert_eq!(rejected(reserved), RejectReason::Unallocated, "{reserved:#010x} {rule}");
        assert!(Insn(allocated).describe().is_some(), "{allocated:#010x} {rule}");
        assert_eq!(class(allocated), Classification::StepOutOfLine, "{allocated:#010x} {rule}");
    }
    // Sizes that look reserved but are not: the logical group's size field
    // is an opcode (orn), PMULL's 1Q form (FEAT_PMULL), FCVTN from 2D.
    for word in [0x0ee0_1c00, 0x0ee0_e000, 0x0e61_6800] {
        assert_eq!(class(word), Classification::StepOutOfLine, "{word:#010x}");
    }
    // The second decoder is wrong: these are allocated (Arm ARM C7.2
    // FMLAL/FMLSL (vector) with sz = 0, FRINT64X (vector) 4S), and LLVM
    // disassembles them, but yaxpeax-arm 0.5 rejects them.
    for word in [0x0e39_ed2e, 0x4eac_ece5, 0x6e21_fbb6] {
        assert_eq!(class(word), Classification::StepOutOfLine, "{word:#010x}");
    }
}

#[test]
fn add_sub_extended_shift_above_four_is_unallocated() {
    // SUBS W4, W0, W12, UXTW #5 and ADD X0, X0, X12, UXTX #7: C6.2 makes shift > 4 UNDEFINED
    // (QEMU raises it); #4 is the largest allocated shift.
    for (reserved, allocated) in [(0x6b2c_9404_u32, 0x6b2c_9004_u32), (0x8b2c_7c00, 0x8b2c_7000)] {
        assert_eq!(rejected(reserved), RejectReason::Unallocated, "{reserved:#010x}");
        assert_eq!(class(allocated), Classification::StepOutOfLine, "{allocated:#010x}");
    }
}

#[test]
fn move_wide_32_bit_upper_halves_are_unallocated() {
    // MOVK W9, #0xe7c4, LSL #48 and MOVN W17, #0x1fc0, LSL #32: a 32-bit register has no such
    // half (C6.2: UNDEFINED, and QEMU raises it); LSL #16 is the largest allocated shift.
    for (reserved, allocated) in [(0x72fc_f889_u32, 0x72bc_f889_u32), (0x12c3_f811, 0x12a3_f811)] {
        assert_eq!(rejected(reserved), RejectReason::Unallocated, "{reserved:#010x}");
        assert_eq!(class(allocated), Classification::StepOutOfLine, "{allocated:#010x}");
    }
}
