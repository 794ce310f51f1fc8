//! Function tracing with call ops: the kernel side of `crates/ftrace`.
//!
//! Every instrumented function starts with the patchable entry of
//! `-Zpatchable-function-entry=4,2` (layout and state machine in `crates/ftrace`):
//! `[ops literal] sym: mov x9, x30; bl ftrace_trampoline`. This module
//! - finds the callsites (`callsites::entries()`, i.e. `__patchable_function_entries`) and
//!   their names (`symbols.rs`: the table xtask embeds), and initialises every traceable one
//!   at boot (`init`): literal := nop ops, `NOP -> mov x9, x30`, once;
//! - keeps the tracer registry behind a lock taken with interrupts masked, resolves a tracer's
//!   name pattern to callsite indices once, at registration, and patches through the text
//!   alias (`KernelPatcher`: 64-bit literal stores, one-instruction `NOP <-> BL` swaps with
//!   cache maintenance);
//! - provides the trampoline and the nop/list/vector ops (`trampoline.rs`) and the tracers
//!   (`tracers.rs`).
//!
//! Dispatch schemes ([`Scheme`]): `List` (every traced site calls the list function, which
//! tests every registered tracer), `CallOps` (a site with exactly one tracer calls it directly
//! through its literal; others the list: the seed) and `Vector` (as `CallOps`, and a site with
//! several tracers calls a vector of exactly those: beyond the seed).
//!
//! Never traced (`NO_TRACE`, sites left as four NOPs at `init`): the probe/exception/noprobe
//! text, this module and `crates/ftrace`, logging, the sanitizer runtime, text patching. The
//! trampoline is assembly (no patchable entry). Anything else a tracer calls is skipped by the
//! per-CPU recursion guard, so tracing `*` cannot recurse.
//!
//! Freeing: `unregister` returns only after a grace period, so the caller may then reuse the
//! tracer's memory. Tracers run with IRQs masked inside the trampoline and never switch tasks,
//! so a CPU that passed a quiescent point (a task switch, an idle pass: `task::cpus::
//! synchronize`) after the patch is done with any tracer it entered before; on the calling CPU
//! the period has elapsed as soon as the caller is not itself inside a tracer.

pub mod graph;
pub mod tracers;
mod trampoline;

use core::fmt;

pub use crate::symbols::Symbols;
pub use ftrace::{Applied, Scheme};
use ftrace::{Config, DispatchTable, EnableOrder, Registry, TextPatcher, TracerId, VectorOps, glob_match};
pub use trampoline::{Ops, Regs};

use crate::arch::patch;
use crate::inject::{self, Fault};
use crate::symbols::callsites;
use crate::sync::IrqSpinLock;

/// Callsite capacity (as `callsites`).
pub const SITES: usize = 4096;
/// 64 tracers per word.
pub const TRACER_WORDS: usize = 2;
/// Vector slots of `Scheme::Vector`.
pub const VECTORS: usize = 64;

static TABLE: DispatchTable<SITES, TRACER_WORDS, VECTORS> = DispatchTable::new();
static REGISTRY: IrqSpinLock<Registry<'static, SITES, TRACER_WORDS, VECTORS>> = IrqSpinLock::new(Registry::new(&TABLE));

/// Name patterns of functions never traced: what the trampoline, the tracers, logging and the
/// exception, probe and sanitizer paths run through (plus `.text.noprobe`, by address).
const NO_TRACE: &[&str] = &[
    "*kernel::ftrace::*",
    "ftrace::*",
    "<ftrace::*",
    "*kernel::log::*",
    "*defmt::*",
    "_defmt_*",
    "__defmt_*",
    "*kernel::drivers::pl011::*",
    "*kernel::mm::kasan::abi::*",
    "*kernel::mm::kasan::report::*",
    "*kernel::mm::kasan::record::*",
    "*kernel::mm::kasan::recording::*",
    "*kernel::mm::kasan::shadow::*",
    "*kernel::mm::kasan::storage::*",
    "*kernel::mm::kasan::ring::*",
    "*kernel::symbols::names::*",
    "protocol::*",
    "<protocol::*",
    "*kernel::arch::aarch64::exception::*",
    "*kernel::arch::aarch64::patch::*",
    "*kernel::probes::*",
    "*kernel::probes::uprobe::*",
    "*kernel::probes::uretprobe::*",
    "probes::*",
    "<probes::*",
    "*kernel::panic*",
    // The graph tracer's exit runs outside the recursion guard: what it calls must not be traced.
    "unwind::repair::*",
    "<unwind::repair::*",
];

/// Why an ftrace request failed.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Error {
    /// From the registry or the patch planner.
    Registry(ftrace::Error),
    /// The image has no embedded symbol table (not built by xtask): name filters cannot work.
    NoSymbols,
    /// The pattern matches no traceable function.
    NoMatch,
    /// Called from inside a tracer (the grace period would wait for itself).
    InsideTracer,
}

impl From<ftrace::Error> for Error {
    fn from(error: ftrace::Error) -> Self {
        Self::Registry(error)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Registry(error) => error.fmt(f),
            Self::NoSymbols => f.write_str("no embedded symbol table (build the kernel with xtask)"),
            Self::NoMatch => f.write_str("pattern matches no traceable function"),
            Self::InsideTracer => f.write_str("called from inside a tracer"),
        }
    }
}

impl defmt::Format for Error {
    fn format(&self, f: defmt::Formatter) {
        defmt::write!(f, "{}", defmt::Display2Format(self));
    }
}

/// Kernel text through the writable alias.
struct KernelPatcher;

impl TextPatcher for KernelPatcher {
    /// The wrong order only under `inject::Fault::FtraceBlBeforeLiteral` (the race tests show
    /// they catch it).
    fn enable_order(&self) -> EnableOrder {
        if inject::on(Fault::FtraceBlBeforeLiteral) { EnableOrder::BlFirst } else { EnableOrder::LiteralFirst }
    }

    fn read_u32(&self, address: u64) -> u32 {
        // SAFETY: the registry only reads callsite words: 4-aligned kernel text, mapped readable.
        unsafe { core::ptr::read_volatile(address as *const u32) }
    }

    fn write_u32(&mut self, address: u64, instruction: u32) {
        // SAFETY: a callsite word of kernel text; the registry writes only NOP <-> BL at run time
        // (concurrently modifiable) and `mov x9, x30` once at init. The barrier orders it after
        // the earlier literal and table stores.
        unsafe {
            core::arch::asm!("dmb ish", options(nostack, preserves_flags));
            patch::write_instruction(address, instruction);
        }
    }

    fn write_u64(&mut self, address: u64, value: u64) {
        // SAFETY: an 8-aligned callsite literal in kernel text; one `str` through the alias.
        unsafe { patch::write_literal(address, value) };
    }
}

fn is_notrace(entry: u64, symbols: &Option<Symbols>) -> bool {
    let function = entry + 8;
    if crate::probes::is_noprobe(function) {
        return true;
    }
    let name = symbols.as_ref().and_then(|symbols| symbols.name_at(function)).unwrap_or("");
    NO_TRACE.iter().any(|pattern| glob_match(pattern, name))
}

/// Initialises every traceable callsite (boot, before anything is traced). Returns how many.
pub fn init() -> Result<usize, Error> {
    let symbols = Symbols::get();
    let config = Config {
        trampoline: trampoline::trampoline_address(),
        nop_ops: &trampoline::NOP_OPS as *const Ops as u64,
        list_ops: &trampoline::LIST_OPS as *const Ops as u64,
        vector_ops: VectorOps {
            base: &trampoline::VECTOR_OPS[0] as *const Ops as u64,
            stride: size_of::<Ops>() as u64,
        },
        scheme: Scheme::CallOps,
    };
    crate::task::on_spawn(graph::forget_task);
    let result =
        REGISTRY.lock().initialise(callsites::entries().iter().copied(), config, &mut KernelPatcher, |entry| {
            !is_notrace(entry, &symbols)
        });
    Ok(result?)
}

/// Runs `f` on the registry (the lock masks interrupts: a tick cannot take it on this CPU).
fn with_registry<T>(f: impl FnOnce(&mut Registry<'static, SITES, TRACER_WORDS, VECTORS>) -> T) -> T {
    f(&mut REGISTRY.lock())
}

/// Registers `ops` for every traceable function whose name matches `pattern` (`*`, `?`), and
/// patches its sites. The set is resolved now; nothing matches names per call.
pub fn register(ops: &'static Ops, pattern: &str) -> Result<TracerId, Error> {
    let symbols = Symbols::get().ok_or(Error::NoSymbols)?;
    register_where(ops, |entry| symbols.name_at(entry + 8).is_some_and(|name| glob_match(pattern, name)))
}

/// Registers `ops` for the traceable functions whose start address satisfies `filter`.
pub fn register_where(ops: &'static Ops, mut filter: impl FnMut(u64) -> bool) -> Result<TracerId, Error> {
    with_registry(|registry| {
        let mut matched = 0;
        let tracer = registry.register_where(ops as *const Ops as u64, |_, entry| {
            let traced = filter(entry);
            matched += usize::from(traced);
            traced
        })?;
        if matched == 0 {
            registry.unregister(tracer)?;
            registry.apply(&mut KernelPatcher)?;
            return Err(Error::NoMatch);
        }
        let applied = registry.apply(&mut KernelPatcher)?;
        Ok((tracer, applied.generation))
    })
    // Frees the vector slots this apply retired (a site moving from set {A, B} to {A, B, C}):
    // without it, registering many tracers one by one would run out of slots.
    .map(|(tracer, generation)| after_grace_period(generation, tracer))
}

/// Stops `tracer` and returns once no CPU can still be inside it: its ops may then be reused.
pub fn unregister(tracer: TracerId) -> Result<Applied, Error> {
    if trampoline::this_cpu().inside_tracer() {
        return Err(Error::InsideTracer);
    }
    let ops = with_registry(|registry| {
        let ops = TABLE.ops_address(tracer);
        registry.unregister(tracer)?;
        Ok((registry.apply(&mut KernelPatcher)?, ops))
    })
    .map(|(applied, ops)| (after_grace_period(applied.generation, applied), ops));
    ops.map(|(applied, ops)| {
        graph::unregistered(ops);
        applied
    })
}

/// Switches the dispatch scheme and re-targets every traced site (literal stores only).
pub fn set_scheme(scheme: Scheme) -> Result<Applied, Error> {
    with_registry(|registry| {
        registry.set_scheme(scheme)?;
        Ok(registry.apply(&mut KernelPatcher)?)
    })
    .map(|applied| after_grace_period(applied.generation, applied))
}

/// Waits for a grace period, outside the registry lock (a CPU spinning on that lock with IRQs
/// masked could not pass a quiescent point), then frees what applies up to `generation`
/// retired (a later generation's grace period, which began after ours, covers ours too).
fn after_grace_period<T>(generation: u64, result: T) -> T {
    grace_period();
    with_registry(|registry| registry.grace_period_elapsed(generation));
    result
}

/// Waits until no CPU can still run a tracer through the ops or vectors an apply retired: the
/// caller is not inside a tracer (checked; and after the apply this CPU's own calls load the new
/// literals), and every other online CPU passed a quiescent point. `inject::Fault::FtraceNoGracePeriod`
/// ends it at once (the test that shows `unregister` waits for the other CPUs).
fn grace_period() {
    debug_assert!(!trampoline::this_cpu().inside_tracer());
    if inject::on(Fault::FtraceNoGracePeriod) {
        return;
    }
    crate::task::cpus::synchronize();
}

/// How many times a tracer called a traced function and the guard skipped it.
pub fn recursions() -> u64 {
    trampoline::this_cpu().recursions.load(core::sync::atomic::Ordering::Relaxed)
}

/// The callsite state of the function starting at `function`, for tests and the dump.
pub fn site_state(function: u64) -> Option<ftrace::SiteState> {
    with_registry(|registry| {
        let site = TABLE.site_index(function - 8)?;
        registry.site_state(site)
    })
}

/// Whether `function`'s site is at its home slot of the site index (the list function finds
/// it without the out-of-line probe).
pub fn site_at_home(function: u64) -> bool {
    TABLE.at_home(function - 8)
}

/// Number of initialised (traceable) sites and of all sites.
pub fn site_counts() -> (usize, usize) {
    with_registry(|registry| {
        let total = registry.site_count();
        let traceable = (0..total)
            .filter(|&site| !matches!(registry.site_state(site), Some(ftrace::SiteState::Uninitialised) | None))
            .count();
        (traceable, total)
    })
}
