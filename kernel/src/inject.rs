//! Test-only fault and wrong-sequence switches, in one table, never set outside tests.
//!
//! A test (or a test-only command-line word) turns a [`Fault`] on to make one mechanism take a
//! known-wrong path, and shows that its checks catch it; production code asks [`on`] at each site
//! where a fault changes the path, one load and a branch, which is what the separate atomics
//! cost before. The switches are compiled into every image `cargo xtask test` builds: those are
//! the images the icount gate measures. A leaf: it names nothing of the kernel, so every layer
//! may ask it.

use core::sync::atomic::{AtomicBool, Ordering};

macro_rules! faults {
    ($($(#[$doc:meta])* $variant:ident = $name:literal,)*) => {
        /// One test-only wrong path. `name()` is its command-line spelling (`inject=NAME`).
        #[derive(Clone, Copy, PartialEq, Eq, Debug, defmt::Format)]
        #[repr(u8)]
        pub enum Fault {
            $($(#[$doc])* $variant,)*
        }

        impl Fault {
            pub const ALL: &'static [Fault] = &[$(Fault::$variant,)*];

            /// The command-line spelling.
            pub const fn name(self) -> &'static str {
                match self {
                    $(Fault::$variant => $name,)*
                }
            }
        }
    };
}

faults! {
    /// Kernel detour registration: the branch to the trampoline is written before the
    /// trampoline.
    DetourBranchBeforeTrampoline = "detour-branch-first",
    /// Kernel detour removal: the trampoline is cleared before the original instruction is
    /// back.
    DetourTrampolineClearedFirst = "detour-trampoline-cleared-first",
    /// Kernel probe removal: the slot or trampoline is freed (poisoned) without waiting for the
    /// CPUs inside the probe (no hold while the word is restored, no grace period).
    KprobeFreedWithoutGracePeriod = "kprobe-no-grace-period",
    /// Kernel probe arming and disarming: the probed word is written while the other CPUs run.
    KprobePatchedUnheld = "kprobe-unheld",
    /// A re-entered kernel probe hit is handled as a fresh one (its handlers run, it counts).
    ReentryUnhandled = "reentry-unhandled",
    /// A re-entered hit, while it is performed, runs its pre-handler (which reaches the
    /// "re-entered twice" panic).
    ReenteredRunsHandler = "reenter-twice",
    /// Every CPU uses CPU 0's user single-step state (the single global state of one CPU).
    UserStepStateShared = "user-step-state-shared",
    /// Uprobe removal: the XOL slot and trampoline are poisoned before the word is restored.
    UprobePoisonBeforeRestore = "uprobe-poison-first",
    /// Uprobe removal: no grace period between the unpublish and the poisoning.
    UprobeFreedWithoutGracePeriod = "uprobe-no-grace-period",
    /// A task interrupted inside a user detour trampoline may be switched away there.
    UprobePreemptibleTrampoline = "uprobe-preemptible-trampoline",
    /// ftrace: enabling a site writes its BL before its literal.
    FtraceBlBeforeLiteral = "ftrace-bl-first",
    /// ftrace: grace periods end at once.
    FtraceNoGracePeriod = "ftrace-no-grace-period",
    /// Cross-CPU calls: a sender waiting with IRQs masked does not serve its own mailbox.
    CrossCallWaitWithoutServing = "cross-call-no-serving",
    /// TLB invalidations after a mapping change stay on this CPU (`tlbi` + `dsb nsh`).
    LocalTlbi = "local-tlbi",
    /// Allocation-stack sampling: every CPU draws from CPU 0's state (one state shared by all).
    StackSampleStateShared = "stack-sample-state-shared",
    /// The profiler's frame-pointer walks keep only the interrupted PC (`profile.break=fp`): an
    /// unwinder that stops at the exception boundary.
    ProfileBrokenFramePointer = "profile-broken-fp",
    /// The profiler's shadow-call-stack walks keep only the interrupted PC (`profile.break=scs`).
    ProfileBrokenShadowCallStack = "profile-broken-scs",
    /// The sanitizer's tag generator: every CPU draws from CPU 0's state (one state shared by
    /// all CPUs, unsynchronised).
    TagStateShared = "tag-state-shared",
    /// The SFrame walk sees its table cut after the header (`stacktrace::sframe_table`): a
    /// corrupt table, which every walk must refuse.
    SFrameTableTruncated = "sframe-table-truncated",
    /// The boot replay (`bench::kasan_replay`) plants two bugs at random points of its stream:
    /// a write one byte past an object just allocated, and a read of an object just freed.
    ReplayPlantsBugs = "replay-plants-bugs",
    /// The sanitizer heap writes each object's header in band, two granules below the object,
    /// and its free trusts that header (the layout before the block table): a recovered store
    /// that reaches it makes a valid free refused.
    HeapHeaderInBand = "heap-header-in-band",
}

const COUNT: usize = Fault::ALL.len();

static ON: [AtomicBool; COUNT] = [const { AtomicBool::new(false) }; COUNT];

/// Whether `fault` is on: one load and a branch at the site that asks.
#[inline(always)]
pub fn on(fault: Fault) -> bool {
    ON[fault as usize].load(Ordering::Relaxed)
}

/// `fault`'s flag, for a site that loads it itself: a sanitizer-exempt path in `full`, where
/// core's atomic load would be an instrumented out-of-line call.
#[inline(always)]
pub fn flag(fault: Fault) -> &'static AtomicBool {
    &ON[fault as usize]
}

/// Turns `fault` on or off (tests, and test-only command-line words at boot).
pub fn set(fault: Fault, on: bool) {
    ON[fault as usize].store(on, Ordering::Relaxed);
}

/// The fault named `name` (its command-line spelling).
pub fn by_name(name: &str) -> Option<Fault> {
    Fault::ALL.iter().copied().find(|fault| fault.name() == name)
}

/// `fault` on until the value is dropped (a test that fails halfway still turns it off).
#[must_use = "the fault is turned off again as soon as the value is dropped"]
pub struct Injected(Fault);

impl Injected {
    pub fn new(fault: Fault) -> Self {
        set(fault, true);
        Self(fault)
    }
}

impl Drop for Injected {
    fn drop(&mut self) {
        set(self.0, false);
    }
}
