//! The tracers: a counting tracer (the bench's relevant tracer) and a function tracer that
//! records `(timestamp, ip, parent ip)` into a ring buffer, streamed whole to xtask.
//!
//! Both run inside the trampoline with IRQs masked and the CPU's recursion guard held, so a
//! per-CPU counter or ring slot needs no atomic read-modify-write: only this CPU writes it.

use core::mem::offset_of;
use core::sync::atomic::{AtomicU64, Ordering};

use super::trampoline::{Ops, Regs};
use crate::args::Args;
use crate::task::stacks::CPUS;
use protocol::cmdline as key;

/// Counts its calls per CPU. Its `ops` is what gets registered.
#[repr(C)]
pub struct Counter {
    pub ops: Ops,
    hits: [AtomicU64; CPUS],
}

impl Counter {
    pub const fn new() -> Self {
        Self { ops: Ops { func: count, private: 0 }, hits: [const { AtomicU64::new(0) }; CPUS] }
    }

    /// Calls so far, all CPUs.
    pub fn hits(&self) -> u64 {
        self.hits.iter().map(|hits| hits.load(Ordering::Relaxed)).sum()
    }

    pub fn reset(&self) {
        self.hits.iter().for_each(|hits| hits.store(0, Ordering::Relaxed));
    }
}

#[sanitize(kernel_hwaddress = "off")]
unsafe extern "C" fn count(_: u64, _: u64, ops: &Ops, _: &mut Regs) {
    // SAFETY: `count` is only ever the `func` of a `Counter`'s `ops`, its first field
    // (`repr(C)`), so the ops address is the counter's.
    let counter = unsafe { &*(ops as *const Ops as *const Counter) };
    // Only this CPU writes its counter, with IRQs masked: a load and a store are enough (in
    // asm: see the note on the tracers' atomics below).
    // SAFETY: an aligned load and store of this CPU's `hits` atomic (interior mutability), at
    // its offset in the counter: a relaxed load and a relaxed store.
    unsafe {
        core::arch::asm!(
            "ldr {n}, [{c}, #{hits}]",
            "add {n}, {n}, #1",
            "str {n}, [{c}, #{hits}]",
            c = in(reg) counter as *const Counter,
            hits = const offset_of!(Counter, hits),
            n = out(reg) _,
            options(nostack, preserves_flags)
        )
    };
}

/// One CPU's counter alone in its cache line, so CPUs counting side by side share no line.
#[repr(C, align(64))]
struct CounterLine(AtomicU64);

/// Counts its calls per CPU, each CPU in its own cache line, indexed by the calling CPU (the
/// `cpus` bench's per-CPU tracer). Its `ops` is what gets registered.
#[repr(C)]
pub struct PerCpuCounter {
    pub ops: Ops,
    hits: [CounterLine; CPUS],
}

impl PerCpuCounter {
    pub const fn new() -> Self {
        Self { ops: Ops { func: count_this_cpu, private: 0 }, hits: [const { CounterLine(AtomicU64::new(0)) }; CPUS] }
    }

    /// Calls so far, all CPUs.
    pub fn hits(&self) -> u64 {
        self.hits.iter().map(|line| line.0.load(Ordering::Relaxed)).sum()
    }

    pub fn reset(&self) {
        self.hits.iter().for_each(|line| line.0.store(0, Ordering::Relaxed));
    }
}

#[sanitize(kernel_hwaddress = "off")]
unsafe extern "C" fn count_this_cpu(_: u64, _: u64, ops: &Ops, _: &mut Regs) {
    // SAFETY: `count_this_cpu` is only ever the `func` of a `PerCpuCounter`'s `ops`, its first
    // field (`repr(C)`), so the ops address is the counter's.
    let counter = unsafe { &*(ops as *const Ops as *const PerCpuCounter) };
    let hits = &counter.hits[crate::arch::percpu::this_cpu_index()].0;
    // Only this CPU writes its line, with IRQs masked: a load and a store.
    store_release(hits, load_relaxed(hits) + 1);
}

/// Counts its calls in one atomic that every CPU increments (the `cpus` bench's shared
/// counter, against [`PerCpuCounter`]): a compare-and-swap loop, so each lost race is counted
/// in `cas_failures` (an `ldadd` would hide it in the cache protocol).
#[repr(C)]
pub struct SharedCounter {
    pub ops: Ops,
    hits: AtomicU64,
    cas_failures: AtomicU64,
}

impl SharedCounter {
    pub const fn new() -> Self {
        Self { ops: Ops { func: count_shared, private: 0 }, hits: AtomicU64::new(0), cas_failures: AtomicU64::new(0) }
    }

    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    /// Increments that lost a race to another CPU and retried.
    pub fn cas_failures(&self) -> u64 {
        self.cas_failures.load(Ordering::Relaxed)
    }

    pub fn reset(&self) {
        self.hits.store(0, Ordering::Relaxed);
        self.cas_failures.store(0, Ordering::Relaxed);
    }
}

#[sanitize(kernel_hwaddress = "off")]
unsafe extern "C" fn count_shared(_: u64, _: u64, ops: &Ops, _: &mut Regs) {
    // SAFETY: `count_shared` is only ever the `func` of a `SharedCounter`'s `ops`, its first
    // field (`repr(C)`), so the ops address is the counter's.
    let counter = unsafe { &*(ops as *const Ops as *const SharedCounter) };
    let mut current = counter.hits.load(Ordering::Relaxed);
    while let Err(actual) =
        counter.hits.compare_exchange_weak(current, current + 1, Ordering::Relaxed, Ordering::Relaxed)
    {
        current = actual;
        counter.cas_failures.fetch_add(1, Ordering::Relaxed);
    }
}

// The tracers' atomics as single instructions. The tracers are built without the sanitizer
// (they run for every traced call) and LLVM does not inline core's instrumented `AtomicU64`
// methods into them: in `full` each load or store was an out-of-line call to a traced core
// function, which entered the trampoline again only for the recursion guard to skip it (five
// per function-tracer record: 1.66 M skipped for 332 k recorded calls in one test under
// `ftrace=*`). `prod` inlines the methods into the same instructions.

/// A relaxed atomic load, as one `ldr`.
#[inline(always)]
fn load_relaxed(atomic: &AtomicU64) -> u64 {
    let value: u64;
    // SAFETY: an aligned 64-bit load of an atomic's own memory: a relaxed atomic load.
    unsafe {
        core::arch::asm!("ldr {v}, [{a}]", a = in(reg) atomic.as_ptr(), v = lateout(reg) value, options(nostack, readonly, preserves_flags))
    };
    value
}

/// A release atomic store, as one `stlr`.
#[inline(always)]
fn store_release(atomic: &AtomicU64, value: u64) {
    // SAFETY: an aligned 64-bit store-release to an atomic's own memory: a release atomic
    // store (earlier loads and stores are ordered before it).
    unsafe {
        core::arch::asm!("stlr {v}, [{a}]", a = in(reg) atomic.as_ptr(), v = in(reg) value, options(nostack, preserves_flags))
    };
}

/// One function-tracer record.
#[derive(Clone, Copy)]
#[repr(C)]
pub struct Record {
    /// CNTVCT_EL0 at the call.
    pub timestamp: u64,
    pub ip: u64,
    pub parent_ip: u64,
}

const RING: usize = 4096;

/// One ring slot: a `Record` in relaxed atomics. A relaxed store is the same `str` as a plain
/// one, and a reader racing the writer sees a mixed record at worst, never undefined behaviour.
/// 32 bytes, not 24: atomics cannot pair into one `stp`, and a power-of-two stride (a shifted
/// add, no multiply) wins that instruction back, so `record` stays as long as it was.
#[repr(C, align(32))]
struct Slot {
    timestamp: AtomicU64,
    ip: AtomicU64,
    parent_ip: AtomicU64,
}

/// The function tracer: a ring of the last `RING` calls (per CPU; one CPU here).
pub struct FunctionTracer {
    pub ops: Ops,
    ring: [Slot; RING],
    /// Records written so far (the next slot is `written % RING`).
    written: AtomicU64,
}

pub static FUNCTION_TRACER: FunctionTracer = FunctionTracer {
    ops: Ops { func: record, private: 0 },
    ring: [const { Slot { timestamp: AtomicU64::new(0), ip: AtomicU64::new(0), parent_ip: AtomicU64::new(0) } }; RING],
    written: AtomicU64::new(0),
};

#[sanitize(kernel_hwaddress = "off")]
unsafe extern "C" fn record(ip: u64, parent_ip: u64, _: &Ops, _: &mut Regs) {
    let tracer = &FUNCTION_TRACER;
    let written = load_relaxed(&tracer.written);
    let timestamp: u64;
    // SAFETY: reads the virtual counter; no memory access.
    unsafe { core::arch::asm!("mrs {}, cntvct_el0", out(reg) timestamp, options(nomem, nostack, preserves_flags)) };
    // Only this CPU writes the ring, with IRQs masked and the recursion guard held: plain relaxed
    // stores, no read-modify-write; the release on `written` publishes the slot.
    let slot = &tracer.ring[written as usize % RING];
    // SAFETY: aligned stores to the slot's three atomics (interior mutability), at their
    // offsets in the `repr(C)` slot: relaxed atomic stores.
    unsafe {
        core::arch::asm!(
            "str {t}, [{s}, #{timestamp}]",
            "str {ip}, [{s}, #{ip_at}]",
            "str {p}, [{s}, #{parent_at}]",
            s = in(reg) slot as *const Slot,
            t = in(reg) timestamp,
            ip = in(reg) ip,
            p = in(reg) parent_ip,
            timestamp = const offset_of!(Slot, timestamp),
            ip_at = const offset_of!(Slot, ip),
            parent_at = const offset_of!(Slot, parent_ip),
            options(nostack, preserves_flags)
        )
    };
    store_release(&tracer.written, written + 1);
}

impl FunctionTracer {
    /// Records written since the last `clear`.
    pub fn written(&self) -> u64 {
        self.written.load(Ordering::Acquire)
    }

    pub fn clear(&self) {
        self.written.store(0, Ordering::Release);
    }

    /// The `i`-th of the records still in the ring, oldest first (call with the tracer off).
    pub fn get(&self, index: u64) -> Option<Record> {
        let written = self.written();
        let kept = written.min(RING as u64);
        (index < kept).then(|| {
            let slot = &self.ring[((written - kept + index) % RING as u64) as usize];
            Record {
                timestamp: slot.timestamp.load(Ordering::Relaxed),
                ip: slot.ip.load(Ordering::Relaxed),
                parent_ip: slot.parent_ip.load(Ordering::Relaxed),
            }
        })
    }

    /// Streams every record still in the ring, oldest first, for xtask to write as Linux's
    /// `trace` file and as Chrome/Perfetto JSON (xtask/src/trace.rs): a header line
    /// `ftrace ring: KEPT of WRITTEN calls, HZ Hz, cpu 0, task NAME-ID`, one
    /// `ftrace record: TIMESTAMP IP PARENT` line per record (raw: xtask symbolizes), then
    /// `ftrace ring end`. Over the log, so it works on a serial line (no semihosting files).
    /// `task` is the one task that ran the traced window, or `<...>-0` when that is not known:
    /// a record holds no task, which would lengthen every traced call. Call with the tracer off.
    pub fn stream(&self, task: &str) {
        let written = self.written();
        let kept = written.min(RING as u64);
        defmt::info!(
            "ftrace ring: {=u64} of {=u64} calls, {=u64} Hz, cpu 0, task {=str}",
            kept,
            written,
            crate::drivers::timer::frequency(),
            task
        );
        for index in 0..kept {
            if let Some(record) = self.get(index) {
                defmt::info!(
                    "ftrace record: {=u64} {=u64:#x} {=u64:#x}",
                    record.timestamp,
                    record.ip,
                    record.parent_ip
                );
            }
        }
        defmt::info!("ftrace ring end");
    }
}

/// `ftrace=PATTERN ftrace-scheme=list|call-ops|vector`: the function tracer on every function
/// matching PATTERN from boot to the end of the run, then its last records dumped;
/// `ftrace-graph=PATTERN`: the function-graph tracer instead (`ftrace=` wins if both are given).
#[derive(Clone, Copy)]
pub struct BootTrace {
    pub pattern: Option<&'static str>,
    /// The dispatch scheme (default call-ops).
    pub scheme: super::Scheme,
    /// `ftrace-graph=PATTERN`.
    pub graph: Option<&'static str>,
}

impl BootTrace {
    pub fn from_args(args: &Args) -> Self {
        let mut trace = Self { pattern: None, scheme: super::Scheme::CallOps, graph: None };
        for (name, value) in args.pairs() {
            match (name, value) {
                (key::FTRACE, pattern) => trace.pattern = Some(pattern),
                (key::FTRACE_GRAPH, pattern) => trace.graph = Some(pattern),
                (key::FTRACE_SCHEME, "list") => trace.scheme = super::Scheme::List,
                (key::FTRACE_SCHEME, "call-ops") => trace.scheme = super::Scheme::CallOps,
                (key::FTRACE_SCHEME, "vector") => trace.scheme = super::Scheme::Vector,
                (key::FTRACE_SCHEME, other) => Args::ignoring(key::FTRACE_SCHEME, other),
                _ => {}
            }
        }
        trace
    }

    /// The pattern of the tracer this boot starts, if any.
    pub fn any_pattern(&self) -> Option<&'static str> {
        self.pattern.or(self.graph)
    }
}

/// The graph tracer's boot registration, if `ftrace-graph=` started it (so that
/// `stop_boot_trace` streams the graph's events rather than the function tracer's ring).
static BOOT_GRAPH: AtomicU64 = AtomicU64::new(u64::MAX);

/// `ftrace=PATTERN` or `ftrace-graph=PATTERN`: the function tracer (or the graph tracer) on
/// PATTERN under `scheme`, from now to `stop_boot_trace`. Errors are reported and tracing stays
/// off.
pub fn trace_from_boot(trace: &BootTrace) -> Option<ftrace::TracerId> {
    if let Err(error) = super::set_scheme(trace.scheme) {
        defmt::error!("ftrace: scheme: {}", error);
        return None;
    }
    let (pattern, registered) = match (trace.pattern, trace.graph) {
        (Some(pattern), _) => {
            FUNCTION_TRACER.clear();
            (pattern, super::register(&FUNCTION_TRACER.ops, pattern))
        }
        (None, Some(pattern)) => {
            super::graph::clear();
            let registered = super::graph::register(pattern);
            if let Ok(tracer) = registered {
                BOOT_GRAPH.store(u64::from(tracer.0), Ordering::Relaxed);
            }
            (pattern, registered)
        }
        (None, None) => return None,
    };
    let kind = if trace.pattern.is_some() { "function" } else { "function_graph" };
    match registered {
        Ok(tracer) => {
            defmt::info!("ftrace: {=str} tracer on {=str}", kind, pattern);
            Some(tracer)
        }
        Err(error) => {
            defmt::error!("ftrace: cannot trace {=str}: {}", pattern, error);
            None
        }
    }
}

/// Stops the boot tracer and streams its whole ring (the graph's events in `unit`: `insn` under
/// icount, `ns` otherwise).
pub fn stop_boot_trace(tracer: ftrace::TracerId, icount: bool) {
    let graph = BOOT_GRAPH.load(Ordering::Relaxed) == u64::from(tracer.0);
    match super::unregister(tracer) {
        Ok(_) if graph => {
            defmt::info!("ftrace: {=u64} graph events recorded", super::graph::written());
            super::graph::stream(if icount { "insn" } else { "ns" });
        }
        Ok(_) => {
            defmt::info!("ftrace: {=u64} calls recorded", FUNCTION_TRACER.written());
            // Tasks switched while tracing from boot: the ring cannot say which ran a call.
            FUNCTION_TRACER.stream("<...>-0");
        }
        Err(error) => defmt::error!("ftrace: cannot stop the boot tracer: {}", error),
    }
    defmt::info!("ftrace: {=u64} recursive calls skipped by the guard", super::recursions());
}
