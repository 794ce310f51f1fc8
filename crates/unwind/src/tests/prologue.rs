//! The SCS/frame-record window helper on hand-made instruction sequences.

use crate::{SCS_POP, SCS_PUSH, ViewDifference, view_difference};

const NOP: u32 = 0xd503_201f;
const PACIASP: u32 = 0xd503_233f;
const AUTIASP: u32 = 0xd503_23bf;
const RET: u32 = 0xd65f_03c0;
const BL: u32 = 0x97ff_fffb;
const STP_PRE_32: u32 = 0xa9be_7bfd; // stp x29, x30, [sp, #-32]!
const MOV_X29_SP: u32 = 0x9100_03fd;
const LDP_POST_32: u32 = 0xa8c2_7bfd; // ldp x29, x30, [sp], #32
const SUB_SP_64: u32 = 0xd101_03ff; // sub sp, sp, #64
const STP_OFFSET_48: u32 = 0xa903_7bfd; // stp x29, x30, [sp, #48]
const ADD_X29_SP_48: u32 = 0x9100_c3fd; // add x29, sp, #48
const LDP_OFFSET_48: u32 = 0xa943_7bfd; // ldp x29, x30, [sp, #48]
const ADD_SP_64: u32 = 0x9101_03ff; // add sp, sp, #64
const LDP_X19_X20: u32 = 0xa941_53f3; // ldp x19, x20, [sp, #16]
const B_BACK: u32 = 0x17ff_ffef; // b <somewhere>
const CBZ_X0: u32 = 0xb400_0040; // cbz x0, +8

use ViewDifference::{Agree, FramesHaveExtraFrame, ShadowHasExtraFrame};

fn views(code: &[u32]) -> Vec<ViewDifference> {
    (0..=code.len()).map(|index| view_difference(code, index)).collect()
}

#[test]
fn compiler_prologue_and_epilogue() {
    let code = [NOP, NOP, PACIASP, SCS_PUSH, STP_PRE_32, MOV_X29_SP, BL, LDP_POST_32, SCS_POP, AUTIASP, RET];
    assert_eq!(
        views(&code),
        [
            Agree,
            Agree,
            Agree,
            Agree, // up to and at the push
            ShadowHasExtraFrame,
            ShadowHasExtraFrame, // at stp, at mov x29
            Agree,
            Agree,               // body, at ldp
            ShadowHasExtraFrame, // x29 restored, SCS not yet popped
            Agree,
            Agree,
            Agree,
        ]
    );
}

#[test]
fn large_frame_prologue_and_split_epilogue() {
    let code = [
        PACIASP,
        SCS_PUSH,
        SUB_SP_64,
        STP_OFFSET_48,
        ADD_X29_SP_48,
        BL,
        LDP_OFFSET_48,
        LDP_X19_X20,
        ADD_SP_64,
        SCS_POP,
        AUTIASP,
        RET,
    ];
    let expected = [
        Agree,
        Agree, // before and at the push
        ShadowHasExtraFrame,
        ShadowHasExtraFrame,
        ShadowHasExtraFrame, // sub, stp, add x29
        Agree,
        Agree, // body, at the ldp of x29
        ShadowHasExtraFrame,
        ShadowHasExtraFrame,
        ShadowHasExtraFrame, // ldp x19, add sp, pop
        Agree,
        Agree,
        Agree,
    ];
    assert_eq!(views(&code), expected);
}

#[test]
fn code_after_an_early_return_runs_with_the_prologue_done() {
    let code = [
        PACIASP,
        SCS_PUSH,
        STP_PRE_32,
        MOV_X29_SP,
        CBZ_X0, // 0..=4
        LDP_POST_32,
        SCS_POP,
        AUTIASP,
        RET, // 5..=8: early return
        BL,
        LDP_POST_32,
        SCS_POP,
        AUTIASP,
        RET, // 9..=13: the other path
    ];
    let views = views(&code);
    assert_eq!(views[6], ShadowHasExtraFrame);
    assert_eq!(views[9], Agree, "after ret: body state, frame linked and SCS pushed");
    assert_eq!(views[10], Agree);
    assert_eq!(views[11], ShadowHasExtraFrame);
    assert_eq!(views[12], Agree);
}

#[test]
fn tail_call_ends_a_path_too() {
    let code = [PACIASP, SCS_PUSH, STP_PRE_32, MOV_X29_SP, LDP_POST_32, SCS_POP, AUTIASP, B_BACK, BL, RET];
    let views = views(&code);
    assert_eq!(views[5], ShadowHasExtraFrame);
    assert_eq!(views[7], Agree);
    assert_eq!(views[8], Agree, "after the tail call: body state");
}

#[test]
fn reversed_hand_written_order_gives_the_frame_view_the_extra_entry() {
    let code = [STP_PRE_32, MOV_X29_SP, SCS_PUSH, BL, SCS_POP, LDP_POST_32, RET];
    assert_eq!(views(&code), [Agree, Agree, FramesHaveExtraFrame, Agree, Agree, FramesHaveExtraFrame, Agree, Agree]);
}

#[test]
fn leaf_functions_and_out_of_range_indices_agree() {
    let leaf = [NOP, NOP, LDP_X19_X20, RET];
    assert!(views(&leaf).iter().all(|view| *view == Agree));
    let code = [SCS_PUSH, STP_PRE_32];
    assert_eq!(view_difference(&code, 100), ShadowHasExtraFrame);
    assert_eq!(view_difference(&[], 3), Agree);
}
