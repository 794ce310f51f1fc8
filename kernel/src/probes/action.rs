//! What a probe hit does with its displaced instruction: one vocabulary for both halves.
//!
//! Built at registration from the method's [`Plan`] (`crates/probes`, shared rules) and the
//! place the registry gave the probe's code; kernel and user hit paths match on it.

use probes::{Plan, Simulated};

/// What a hit does after the (pre-)handler.
#[derive(Clone, Copy)]
pub enum Action {
    /// Simulate this pre-decoded form.
    Simulate(Simulated),
    /// `stp x29, x30, [sp, #-16]!`, the frame push that starts most functions, performed
    /// directly (`Plan::SimulateFramePush`).
    SimulateFramePush,
    /// Run `[insn, BRK]` at `slot` (a slot-area chunk, or the probe's slot in the XOL page),
    /// stepping it in hardware if `hardware_step`.
    OutOfLine { slot: u64, hardware_step: bool },
    /// User probes only: out of line in this CPU's XOL slot, written at every hit (Linux's
    /// dynamic XOL slots); with `skip_unchanged`, not rewritten when it already holds the
    /// instruction.
    CpuSlot { hardware_step: bool, skip_unchanged: bool },
    /// The probed word is `B trampoline`: a kernel hit never traps, a user hit takes one SVC.
    Detour { trampoline: u64 },
}

impl Action {
    /// The action `plan` asks for, its out-of-line code at `slot` or its trampoline at
    /// `trampoline` (an address the plan does not use is ignored).
    #[inline]
    pub const fn planned(plan: Plan, slot: u64, trampoline: u64) -> Self {
        match plan {
            Plan::Simulate(simulated) => Self::Simulate(simulated),
            Plan::SimulateFramePush => Self::SimulateFramePush,
            Plan::OutOfLine { hardware_step } => Self::OutOfLine { slot, hardware_step },
            Plan::Detour => Self::Detour { trampoline },
        }
    }

    /// An out-of-line action moved into this CPU's slot (user probes' per-CPU slot strategy);
    /// any other action as it is.
    #[inline]
    pub const fn in_cpu_slot(self, skip_unchanged: bool) -> Self {
        match self {
            Self::OutOfLine { hardware_step, .. } => Self::CpuSlot { hardware_step, skip_unchanged },
            other => other,
        }
    }
}
