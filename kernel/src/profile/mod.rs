//! The sampling profiler: a periodic interrupt captures the interrupted context's FP and/or SCS
//! stack, saves it in the stack depot and counts it per depot handle; the host folds the dump.
//!
//! Two clocks: PMU event counter 0's overflow every N events (`drivers::pmu`: under
//! `-icount shift=0` every N instructions exactly, so a profile is bit-identical run to run)
//! and the timer tick (a tick consumer, at the tick's rate). Samples are taken in hard-IRQ
//! context through `stacktrace::collect`, the walk chained from the IRQ stack into the
//! interrupted task; what lies above the interrupted PC (the IRQ path itself) is cut off. The
//! dump (`profile: sample ...` and `profile: summary ...` lines) is what `cargo xtask profile`
//! reads (xtask/src/profile.rs).

mod sampler;
pub mod workload;

pub use sampler::{Unwinders, on_pmu_overflow, on_tick};

use crate::args::Args;
use crate::drivers::pmu;
use crate::stacktrace::Mode;
use protocol::cmdline as key;

/// The profiler's share of the workload (its handler's instructions over the workload's) above
/// which sampling stops and the run is refused: the period leaves the workload too little room.
pub const SHARE_LIMIT_PERCENT: u64 = 25;

/// Samples taken before the share is checked (a few, so one slow first sample that inserts new
/// depot records does not decide).
pub const SHARE_CHECK_AFTER: u64 = 16;

/// Which clock drives the samples.
#[derive(Clone, Copy, PartialEq, Eq, defmt::Format)]
pub enum Clock {
    /// PMU event counter 0 overflowing every `every` events.
    Pmu { every: u64 },
    /// Every timer tick (`hz=`).
    Timer,
}

/// `run=profile`: what to profile and how (`profile.*` on the command line).
#[derive(Clone, Copy)]
pub struct Request {
    pub workload: &'static str,
    pub unwinders: Unwinders,
    pub clock: Clock,
    /// `profile.break=fp|scs`: turns on `inject::Fault::ProfileBrokenFramePointer` or
    /// `ProfileBrokenShadowCallStack` for the run (that unwinder's walks keep only the
    /// interrupted PC, as an unwinder that stops at the exception boundary would).
    pub broken: Option<Mode>,
}

impl Request {
    pub const fn new() -> Self {
        Self { workload: "", unwinders: Unwinders::Both, clock: Clock::Pmu { every: 100_003 }, broken: None }
    }

    /// `profile.workload=NAME profile.unwinder=fp|scs|both|sframe|all profile.every=N profile.clock=pmu|timer
    /// profile.break=fp|scs`.
    pub fn from_args(args: &Args) -> Self {
        let mut request = Self::new();
        for (name, value) in args.pairs() {
            match (name, value) {
                (key::PROFILE_WORKLOAD, name) => request.workload = name,
                (key::PROFILE_UNWINDER, name) => match Unwinders::parse(name) {
                    Some(unwinders) => request.unwinders = unwinders,
                    None => defmt::warn!(
                        "cmdline: profile.unwinder={=str} is not fp|scs|both|sframe|all, keeping both",
                        name
                    ),
                },
                (key::PROFILE_EVERY, every) => match every.parse::<u64>() {
                    Ok(every) if every >= 1 => request.clock = Clock::Pmu { every },
                    _ => defmt::warn!("cmdline: profile.every={=str} is not a number >= 1", every),
                },
                (key::PROFILE_CLOCK, "timer") => request.clock = Clock::Timer,
                (key::PROFILE_BREAK, "fp") => request.broken = Some(Mode::FramePointer),
                (key::PROFILE_BREAK, "scs") => request.broken = Some(Mode::ShadowCallStack),
                _ => {}
            }
        }
        request
    }
}

/// Registers the PMU clock's interrupt handler. At init, before interrupts are unmasked. The
/// timer clock's tick consumer is registered by `run` only when it is asked for, so that no
/// other run's tick carries the profiler.
pub fn init(pmu_intid: Option<u32>) {
    match pmu_intid {
        Some(intid) => defmt::info!("profile: PMU overflow interrupt {=u32}", intid),
        None => defmt::info!("profile: no PMU overflow interrupt in the device tree (the timer clock still samples)"),
    }
    if let Some(intid) = pmu_intid {
        crate::drivers::interrupts::register_private(intid, on_pmu_overflow);
    }
    PMU_INTID.call_once(|| pmu_intid);
}

static PMU_INTID: spin::Once<Option<u32>> = spin::Once::new();

/// Runs the requested workload under the profiler and dumps the profile. Ok(workload passed).
// Never inlined: kernel_main runs every mode from the boot stack (32 KiB), and the test suite
// with it; a mode inlined there puts its locals in kernel_main's frame for every other mode
// (one codegen unit inlined this one: 26 KiB, and deep test chains overflowed).
#[inline(never)]
pub fn run(request: &Request, context: &workload::Context) -> Result<bool, &'static str> {
    let Some(workload) = workload::find(request.workload) else {
        defmt::error!("profile: unknown workload {=str} (known: {=str})", request.workload, workload::NAMES);
        return Err("unknown workload");
    };
    let event = match request.clock {
        Clock::Pmu { .. } => {
            if PMU_INTID.get().copied().flatten().is_none() {
                defmt::error!("profile: the device tree names no PMU interrupt: use the timer clock (profile.hz)");
                return Err("no PMU interrupt");
            }
            // INST_RETIRED where QEMU counts it (under icount), else CPU cycles.
            Some(if pmu::Event::InstructionsRetired.implemented() {
                pmu::Event::InstructionsRetired
            } else {
                pmu::Event::CpuCycles
            })
        }
        Clock::Timer => {
            // Registered here, not at init (a Hooks place is taken atomically, and a tick reads
            // each place once, so a tick running meanwhile sees it or not): only runs that
            // sample on the tick pay for the consumer.
            crate::drivers::timer::on_tick(on_tick);
            None
        }
    };
    defmt::info!(
        "profile: workload {=str}, unwinders {=str}, clock {=str}, event {=str}",
        workload.name,
        request.unwinders.name(),
        match request.clock {
            Clock::Pmu { .. } => "pmu",
            Clock::Timer => "timer",
        },
        event.map_or("timer tick", pmu::Event::name)
    );
    sampler::start(request, event)?;
    let passed = (workload.run)(context);
    let summary = sampler::stop();
    sampler::dump();
    summary.print(request, event);
    if summary.refused {
        defmt::error!(
            "profile: refused: the profiler took more than {=u64}% of the workload after {=u64} samples (period too small)",
            SHARE_LIMIT_PERCENT,
            summary.samples
        );
        return Err("period too small");
    }
    Ok(passed)
}
