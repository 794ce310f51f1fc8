//! Why a probe (kernel or user) was not registered or unregistered.

use core::fmt;

use probes::{Refusal, RejectReason, Text};

/// One error type for every probe kind; refusals that depend on whose text the probe is on
/// carry the [`Text`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ProbeError {
    /// `crates/probes` rejects the instruction.
    Rejected(RejectReason),
    /// The address is not 4-byte aligned.
    Misaligned,
    /// The address is not in the text the probe kind needs.
    NotText(Text),
    /// A kernel probe on EL0 code (`.text.user`): its BRK would trap from EL0 as a user fault;
    /// probe it with a uprobe.
    UserText,
    /// A probe is already registered at this address.
    AlreadyRegistered,
    /// No probe is registered at this address (e.g. unregistering twice).
    NotRegistered,
    /// A load-exclusive precedes the address within `probes::EXCLUSIVE_WINDOW` instructions with
    /// no store-exclusive in between: the trap would clear the exclusive monitor.
    InsideExclusiveSequence,
    /// The address is in code the probe machinery runs through (the named region).
    NoProbe(&'static str),
    /// A patchable function entry (the 4 words at each `__patchable_function_entries` address):
    /// ftrace owns it.
    FtraceCallsite,
    /// The instruction reads or writes the PC, so it cannot run from an out-of-line slot (or, on
    /// user text, from the detour trampoline).
    NeedsOriginalPc(Text),
    /// `Simulate` on an instruction that `crates/probes` steps rather than simulates.
    NotSimulated,
    /// `Simulate` on an SP-based form that could store below `SP - (STACK_GAP - 16)`, move SP
    /// down by more than that, or set SP from another register: exception entry only leaves
    /// `STACK_GAP` bytes free below the interrupted SP.
    StackBeyondGap,
    /// `Detour` on `BLR X30`: the return address and the target share the only free register.
    DetourBlrX30,
    /// `Detour` with a post-handler: the trampoline calls handlers before the displaced
    /// instruction only (as Linux's optprobes, which refuse post-handlers too).
    DetourPostHandler,
    /// A branch between the probe, its trampoline and the target is beyond +-128 MiB.
    OutOfBranchRange,
    /// `Detour` on `LDR XZR, <literal>` whose literal is beyond +-1 MiB of the trampoline: the
    /// load (kept for its fault) can only be re-encoded PC-relative.
    DetourLiteralOutOfRange,
    /// Every probe record, or every slot chunk, is in use.
    NoSpace,
}

impl ProbeError {
    /// The refusal `plan` gave, for a probe on `text`.
    pub const fn refused(refusal: Refusal, text: Text) -> Self {
        match refusal {
            Refusal::Rejected(reason) => Self::Rejected(reason),
            Refusal::NeedsOriginalPc => Self::NeedsOriginalPc(text),
            Refusal::NotSimulated => Self::NotSimulated,
            Refusal::StackBeyondGap => Self::StackBeyondGap,
            Refusal::DetourBlrX30 => Self::DetourBlrX30,
            Refusal::DetourPostHandler => Self::DetourPostHandler,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Rejected(reason) => reason.as_str(),
            Self::Misaligned => "address is not 4-byte aligned",
            Self::NotText(Text::Kernel) => "address is not kernel text",
            Self::NotText(Text::User) => "address is not user text",
            Self::UserText => "address is EL0 code (.text.user): use uprobes",
            Self::AlreadyRegistered => "a probe is already registered at this address",
            Self::NotRegistered => "no probe is registered at this address",
            Self::InsideExclusiveSequence => "inside an LDXR/STXR sequence (the trap clears the exclusive monitor)",
            Self::NoProbe(region) => region,
            Self::FtraceCallsite => "patchable function entry: owned by ftrace",
            Self::NeedsOriginalPc(Text::Kernel) => {
                "instruction reads or writes the PC: cannot run out of line (use simulate or detour)"
            }
            Self::NeedsOriginalPc(Text::User) => {
                "instruction reads or writes the PC: cannot run out of line (use simulate; detour for RET/BR)"
            }
            Self::NotSimulated => "instruction is stepped, not simulated, by crates/probes",
            Self::StackBeyondGap => {
                "simulated SP-based access could reach below SP - (STACK_GAP - 16): the exception frame"
            }
            Self::DetourBlrX30 => "detour cannot rewrite BLR X30 (no free register for the return address)",
            Self::DetourPostHandler => "detour runs handlers before the instruction only: no post-handler",
            Self::OutOfBranchRange => "branch beyond +-128 MiB between probe, trampoline and target",
            Self::DetourLiteralOutOfRange => "detour cannot reach the literal of LDR XZR (beyond +-1 MiB)",
            Self::NoSpace => "no free probe record or slot",
        }
    }
}

impl fmt::Display for ProbeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl defmt::Format for ProbeError {
    fn format(&self, f: defmt::Formatter) {
        defmt::write!(f, "{=str}", self.as_str())
    }
}
