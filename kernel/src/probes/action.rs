//! What a probe hit does with its displaced instruction: one vocabulary for both halves.
//!
//! Built at registration from the method's [`Plan`] (`crates/probes`, shared rules) and the
//! place the registry gave the probe's code; kernel and user hit paths match on it.

use core::convert::Infallible;

use probes::{Plan, Simulated};

/// What a hit does after the (pre-)handler. `PerCpu` is what the user-only variant holds:
/// [`CpuSlot`] for user probes; `Infallible` (the default) for kernel probes, whose actions
/// therefore cannot hold it, and whose hit path's match needs no case for it (one more case
/// there costs each stepped and frame-push hit a compare and a branch).
#[derive(Clone, Copy)]
pub enum Action<PerCpu = Infallible> {
    /// Simulate this pre-decoded form.
    Simulate(Simulated),
    /// `stp x29, x30, [sp, #-16]!`, the frame push that starts most functions, performed
    /// directly (`Plan::SimulateFramePush`).
    SimulateFramePush,
    /// Run `[insn, BRK]` at `slot` (a slot-area chunk, or the probe's slot in the XOL page),
    /// stepping it in hardware if `hardware_step`.
    OutOfLine { slot: u64, hardware_step: bool },
    /// The probed word is `B trampoline`: a kernel hit never traps, a user hit takes one SVC.
    Detour { trampoline: u64 },
    /// User probes only: out of line in this CPU's XOL slot (see [`CpuSlot`]).
    CpuSlot(PerCpu),
}

/// A user probe's instruction run out of line in this CPU's XOL slot, written at every hit
/// (Linux's dynamic XOL slots).
#[derive(Clone, Copy)]
pub struct CpuSlot {
    /// Step it in hardware (else a BRK after it brings the CPU back).
    pub hardware_step: bool,
    /// Do not rewrite the slot when it already holds the instruction.
    pub skip_unchanged: bool,
}

impl<PerCpu> Action<PerCpu> {
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
}

impl Action<CpuSlot> {
    /// An out-of-line action moved into this CPU's slot (user probes' per-CPU slot strategy);
    /// any other action as it is.
    #[inline]
    pub const fn in_cpu_slot(self, skip_unchanged: bool) -> Self {
        match self {
            Self::OutOfLine { hardware_step, .. } => Self::CpuSlot(CpuSlot { hardware_step, skip_unchanged }),
            other => other,
        }
    }
}
