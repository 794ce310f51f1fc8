//! Host tests of the per-method plan and refusal rules shared by kernel and user probes.

use probes::{Classification, Insn, Method, Plan, Refusal, Rules, Text, classify, plan};

const KERNEL: Rules = Rules { text: Text::Kernel, stack_reach: 240, post_handler: false };
const USER: Rules = Rules { text: Text::User, stack_reach: 0, post_handler: false };

fn planned(word: u32, method: Method, rules: Rules) -> Result<Plan, Refusal> {
    plan(method, &classify(Insn(word)), &rules)
}

#[test]
fn frame_push_takes_the_direct_path_in_both_texts() {
    for rules in [KERNEL, USER] {
        assert_eq!(planned(0xa9bf_7bfd, Method::Simulate, rules), Ok(Plan::SimulateFramePush));
    }
    // STP X29, X30, [SP, #-32]! is simulated the general way.
    assert!(matches!(planned(0xa9be_7bfd, Method::Simulate, KERNEL), Ok(Plan::Simulate(_))));
}

#[test]
fn pc_relative_forms_cannot_run_out_of_line() {
    for word in [0x9400_0010u32, 0x1000_0080, 0x5800_0040, 0x5400_0040] {
        for method in [Method::SingleStep, Method::BrkStep] {
            assert_eq!(planned(word, method, KERNEL), Err(Refusal::NeedsOriginalPc), "{word:#x}");
            assert_eq!(planned(word, method, USER), Err(Refusal::NeedsOriginalPc), "{word:#x}");
        }
        // The kernel detour relocates them; the user trampoline runs them unchanged: refused.
        assert_eq!(planned(word, Method::Detour, KERNEL), Ok(Plan::Detour));
        assert_eq!(planned(word, Method::Detour, USER), Err(Refusal::NeedsOriginalPc));
    }
    // RET leaves by register: fine in a user trampoline.
    assert_eq!(planned(0xd65f_03c0, Method::Detour, USER), Ok(Plan::Detour));
}

#[test]
fn stepped_forms_are_not_simulated() {
    let word = 0x8b02_0020; // ADD X0, X1, X2 (shifted register)
    assert_eq!(classify(Insn(word)), Classification::StepOutOfLine);
    assert_eq!(planned(word, Method::Simulate, KERNEL), Err(Refusal::NotSimulated));
    assert_eq!(planned(word, Method::SingleStep, KERNEL), Ok(Plan::OutOfLine { hardware_step: true }));
    assert_eq!(planned(word, Method::BrkStep, USER), Ok(Plan::OutOfLine { hardware_step: false }));
}

#[test]
fn kernel_stack_reach_and_detour_rules() {
    // STP X0, X1, [SP, #-256]! reaches below 240 bytes; SUB SP, SP, #256 moves too far; both
    // are fine for user text, whose handler runs on another stack.
    for word in [0xa9b0_07e0u32, 0xd104_03ff] {
        assert_eq!(planned(word, Method::Simulate, KERNEL), Err(Refusal::StackBeyondGap), "{word:#x}");
        assert!(matches!(planned(word, Method::Simulate, USER), Ok(Plan::Simulate(_))), "{word:#x}");
    }
    // MOV SP, X0 sets SP from another register.
    assert_eq!(planned(0x9100_001f, Method::Simulate, KERNEL), Err(Refusal::StackBeyondGap));
    assert_eq!(planned(0xd63f_03c0, Method::Detour, KERNEL), Err(Refusal::DetourBlrX30));
    let with_post = Rules { post_handler: true, ..KERNEL };
    assert_eq!(planned(0xd503_201f, Method::Detour, with_post), Err(Refusal::DetourPostHandler));
    assert!(matches!(planned(0xd420_0000, Method::Simulate, USER), Err(Refusal::Rejected(_))));
}
