//! Which probe methods an instruction allows, and why one is refused: the rules kernel probes
//! and user probes share, decided once at registration.

use crate::classify::{Classification, RejectReason};
use crate::simulate::{Indexing, IndirectBranch, Simulated};

/// How a hit performs the displaced instruction.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[cfg_attr(feature = "kernel", derive(defmt::Format))]
pub enum Method {
    /// Out of line, from a slot `[insn, BRK]`, under hardware single-step.
    SingleStep,
    /// Out of line, from the same slot; its BRK brings the CPU back.
    BrkStep,
    /// Emulated by [`simulate`](crate::simulate()) in the trap handler.
    Simulate,
    /// The probed word branches to a trampoline; no exception (kernel) or one SVC (user).
    Detour,
}

impl Method {
    pub const ALL: [Method; 4] = [Self::SingleStep, Self::BrkStep, Self::Simulate, Self::Detour];

    /// The name used in bench rows (`method=...`).
    pub const fn name(self) -> &'static str {
        match self {
            Self::SingleStep => "single-step",
            Self::BrkStep => "brk-step",
            Self::Simulate => "simulate",
            Self::Detour => "detour",
        }
    }
}

/// Whose text a probe is on: the rules differ where the trap handler's position differs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Text {
    /// EL1 code: the BRK handler runs on the probed context's stack.
    Kernel,
    /// EL0 code: the handler runs on the kernel stack, user memory is reached unprivileged.
    User,
}

impl Text {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Kernel => "kernel text",
            Self::User => "user text",
        }
    }
}

/// What a registration asks for besides the method.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Rules {
    pub text: Text,
    /// Kernel text: how far below SP a simulated SP-based access or SP move may reach (exception
    /// entry leaves only a gap below the interrupted SP).
    pub stack_reach: i64,
    /// A post-handler was asked for (a kernel detour cannot run one).
    pub post_handler: bool,
}

/// What a hit does, decided at registration.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Plan {
    /// Simulate this pre-decoded form.
    Simulate(Simulated),
    /// `stp x29, x30, [sp, #-16]!`, the frame push that starts most functions: one store pair,
    /// SP -= 16, PC += 4, BTYPE = 0 (Linux's `simulate_stp_fp_lr_sp_64`), the result
    /// [`simulate`](crate::simulate()) gives, without its general dispatch.
    SimulateFramePush,
    /// Run from a slot, stepping in hardware if `hardware_step`.
    OutOfLine { hardware_step: bool },
    /// Branch to a trampoline that performs the instruction.
    Detour,
}

/// Why a method is refused for an instruction.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Refusal {
    /// `classify` rejects the instruction.
    Rejected(RejectReason),
    /// The instruction reads or writes the PC, so it cannot run from another address.
    NeedsOriginalPc,
    /// `Simulate` on an instruction that is stepped, not simulated.
    NotSimulated,
    /// `Simulate` on an SP-based form that could reach below the allowed stack reach, move SP
    /// down by more than that, or set SP from another register.
    StackBeyondGap,
    /// `Detour` on `BLR X30`.
    DetourBlrX30,
    /// `Detour` with a post-handler (kernel): the trampoline runs handlers before only.
    DetourPostHandler,
}

/// Whether a simulated form gives the same result from any address (so it can also run from a
/// slot or inline in a trampoline).
pub const fn runs_anywhere(simulated: &Simulated) -> bool {
    matches!(
        simulated,
        Simulated::Nop
            | Simulated::LoadStorePair { .. }
            | Simulated::MoveRegister { .. }
            | Simulated::AddSubImmediate { .. }
    )
}

/// `stp x29, x30, [sp, #-16]!`.
pub const fn is_frame_push(simulated: &Simulated) -> bool {
    matches!(
        simulated,
        Simulated::LoadStorePair { load: false, rt, rt2, rn, offset: -16, indexing: Indexing::PreIndex }
            if rt.number() == 29 && rt2.number() == 30 && rn.number() == 31
    )
}

/// Decides how `method` performs an instruction classified as `classification`.
pub fn plan(method: Method, classification: &Classification, rules: &Rules) -> Result<Plan, Refusal> {
    let simulated = match *classification {
        Classification::Reject(reason) => return Err(Refusal::Rejected(reason)),
        Classification::Simulate(simulated) => Some(simulated),
        Classification::StepOutOfLine => None,
    };
    match method {
        Method::Simulate => {
            let simulated = simulated.ok_or(Refusal::NotSimulated)?;
            if rules.text == Text::Kernel {
                check_stack_reach(&simulated, rules.stack_reach)?;
            }
            Ok(if is_frame_push(&simulated) { Plan::SimulateFramePush } else { Plan::Simulate(simulated) })
        }
        Method::SingleStep | Method::BrkStep => match simulated {
            Some(simulated) if !runs_anywhere(&simulated) => Err(Refusal::NeedsOriginalPc),
            _ => Ok(Plan::OutOfLine { hardware_step: method == Method::SingleStep }),
        },
        Method::Detour => match rules.text {
            // The kernel trampoline relocates every PC-relative form (`relocate.rs`).
            Text::Kernel if rules.post_handler => Err(Refusal::DetourPostHandler),
            Text::Kernel => match simulated {
                Some(Simulated::BranchRegister { rn, kind: IndirectBranch::Blr }) if rn.number() == 30 => {
                    Err(Refusal::DetourBlrX30)
                }
                _ => Ok(Plan::Detour),
            },
            // The user trampoline `[SVC, insn, B back]` runs the instruction unchanged: only the
            // forms that give the same result anywhere, and RET/BR (they leave by register).
            Text::User => match simulated {
                Some(simulated)
                    if !runs_anywhere(&simulated)
                        && !matches!(
                            simulated,
                            Simulated::BranchRegister { kind: IndirectBranch::Ret | IndirectBranch::Br, .. }
                        ) =>
                {
                    Err(Refusal::NeedsOriginalPc)
                }
                _ => Ok(Plan::Detour),
            },
        },
    }
}

/// The kernel's stack-reach rule for simulated SP-based forms.
fn check_stack_reach(simulated: &Simulated, reach: i64) -> Result<(), Refusal> {
    match *simulated {
        Simulated::LoadStorePair { rn, offset, indexing, .. } if rn.number() == 31 => {
            // Post-index accesses at SP and moves SP by offset; the others access SP + offset.
            let lowest = if indexing == Indexing::PostIndex { offset.min(0) } else { offset };
            if lowest < -reach { Err(Refusal::StackBeyondGap) } else { Ok(()) }
        }
        Simulated::AddSubImmediate { rd, rn, immediate, subtract, set_flags: false, .. } if rd.number() == 31 => {
            let moves_down = if subtract { immediate as i64 } else { -(immediate as i64) };
            if rn.number() != 31 || moves_down > reach { Err(Refusal::StackBeyondGap) } else { Ok(()) }
        }
        _ => Ok(()),
    }
}
