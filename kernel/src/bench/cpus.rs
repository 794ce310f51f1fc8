//! Suites `cpus` and `cpus-heap`: one operation loop on 1, 2, ... CPUs at once.
//!
//! Each measured window runs the same loop on `cpus` CPUs: this CPU and one task pinned to each
//! other CPU (pinned tasks rather than cross-CPU calls: calls are served in the wake-up IRQ,
//! where the sanitizer heap refuses to run). The tasks report ready, wait in `wfe` for the start
//! flag, run the loop with IRQs masked and report done with `sev`; this CPU opens the window,
//! raises the flag, runs its own loop and waits in `wfe` for the others. Under icount the cycle
//! counter counts every vCPU's instructions (docs/design/smp.md), so a window's count is
//! system-wide: `per_op` is (window - the same window with an empty loop) / all CPUs'
//! operations. In wall mode (multi-threaded TCG) it is the window's virtual ns per operation,
//! `cpus` <= the host's cores on QEMU (`bench.host-cpus`, from xtask); a board (mode hardware)
//! runs every online CPU.
//!
//! Contention is counted, not guessed from time: per operation, the depot's failed CASes, lock
//! spins and read-gate retries (`stackdepot::contention`), the kernel's spin-lock retries
//! (`sync::lock_spins`: the heap's lock, `IrqSpinLock`s) and the shared ftrace counter's failed
//! CASes. Each counter moves only on a retry branch, so single-CPU paths are as long as before.
//!
//! Cases (`cpus`): `depot-lookup-hit` (params `depot` permanent|evicting, `traces` same|disjoint;
//! the evicting depot's save takes a reference and the loop drops it with `put`); `traced-call`
//! (call-ops; `tracer` none|per-cpu|shared); `kprobe-push` per `method`; `uprobe-push` per
//! `method` (each CPU's calls from an EL0 task on it, against the same window unprobed);
//! `uprobe-xol` per stepping `method` and XOL `slots` strategy (per-probe|per-cpu|per-cpu-skip),
//! with the slot waits per hit. `cpus-heap`:
//! `heap-alloc-free` (64-byte objects, stacks collected from the shadow call stack).

use core::hint::black_box;
use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::{Clock, Label, Plan, row};
use crate::arch::{cpu, percpu};
use crate::ftrace::{self, Scheme, tracers::PerCpuCounter, tracers::SharedCounter};
use crate::mm::kasan::heap::{self, Stacks};
use crate::probes::uprobe::{self, XolSlots};
use crate::probes::{self as kprobes, Method, Registers};
use crate::sync::{IrqMask, StaticBlocks};
use crate::task::{self, CpuMask, cpus as online_cpus, stacks::CPUS, user};
use stackdepot::StackDepot;

/// How long a CPU waits for the start flag, and this CPU for the others to finish (counter
/// time; under icount one instruction is one ns).
const WAIT_MS: u64 = 5_000;

/// What every CPU runs `iterations` times in the window; `cpu` is its index among the CPUs
/// taking part (0 = this CPU), which picks its trace.
type Operation = fn(cpu: usize, iterations: u64);

static OPERATION: AtomicUsize = AtomicUsize::new(0);
static ITERATIONS: AtomicU64 = AtomicU64::new(0);
/// The window's start flag: a worker starts when it holds the window number it was given.
static START: AtomicU64 = AtomicU64::new(0);
static WINDOWS: AtomicU64 = AtomicU64::new(0);
/// Workers ready and done, bit n for CPU n.
static READY: AtomicU64 = AtomicU64::new(0);
static DONE: AtomicU64 = AtomicU64::new(0);

/// A worker task pinned to one CPU: the argument is its window number and its index.
extern "C" fn worker(argument: u64) {
    let (window, index) = (argument >> 8, (argument & 0xff) as usize);
    let me = percpu::this_cpu_index();
    let _mask = IrqMask::new();
    READY.fetch_or(1 << me, Ordering::Release);
    cpu::send_event();
    if !cpu::wait_until(WAIT_MS, || START.load(Ordering::Acquire) == window) {
        defmt::error!("bench cpus: cpu {=usize}: no start flag within {=u64} ms", me, WAIT_MS);
        return;
    }
    let address = OPERATION.load(Ordering::Relaxed);
    // SAFETY: `OPERATION` holds an `Operation` stored by `together` before it spawned this task
    // (the spawn orders the store before the task runs).
    let operation = unsafe { core::mem::transmute::<usize, Operation>(address) };
    operation(index, ITERATIONS.load(Ordering::Relaxed));
    DONE.fetch_or(1 << me, Ordering::Release);
    cpu::send_event();
}

/// The CPUs other than this one that a window of `cpus` CPUs uses: the first online ones.
fn others(cpus: usize) -> u64 {
    let me = percpu::this_cpu_index();
    (0..CPUS)
        .filter(|&other| other != me && online_cpus::is_online(other))
        .take(cpus - 1)
        .fold(0, |mask, other| mask | 1 << other)
}

/// One window of `operation` on `cpus` CPUs: its cost on the plan's clock, or None (said why).
fn together(plan: &Plan, cpus: usize, operation: Operation, iterations: u64) -> Option<u64> {
    let others = others(cpus);
    if others.count_ones() as usize != cpus - 1 {
        defmt::error!("bench cpus: {=usize} CPUs asked, {=usize} online", cpus, online_cpus::online());
        return None;
    }
    let window = WINDOWS.fetch_add(1, Ordering::Relaxed) + 1;
    OPERATION.store(operation as usize, Ordering::Relaxed);
    ITERATIONS.store(iterations, Ordering::Relaxed);
    READY.store(0, Ordering::Relaxed);
    DONE.store(0, Ordering::Relaxed);
    let mut workers = [None; CPUS];
    for (index, other) in (0..CPUS).filter(|other| others & 1 << other != 0).enumerate() {
        let argument = window << 8 | (index + 1) as u64;
        match task::spawn_on(CpuMask::one(other), "bench-cpus", worker, argument) {
            Ok(id) => workers[other] = Some(id),
            Err(_) => defmt::error!("bench cpus: cannot start a task on cpu {=usize}", other),
        }
    }
    let ready = cpu::wait_until(WAIT_MS, || READY.load(Ordering::Acquire) == others);
    let cost = ready.then(|| {
        plan.measure(|| {
            START.store(window, Ordering::Release);
            cpu::send_event();
            operation(0, iterations);
            cpu::wait_until(WAIT_MS, || DONE.load(Ordering::Acquire) == others);
        })
    });
    // Releases workers that started late, so every one ends and can be joined.
    START.store(window, Ordering::Release);
    cpu::send_event();
    for id in workers.into_iter().flatten() {
        task::join(id);
    }
    let missing = others & !(if ready { DONE.load(Ordering::Acquire) } else { READY.load(Ordering::Acquire) });
    if missing != 0 {
        let what = if ready { "did not finish" } else { "did not start" };
        defmt::error!("bench cpus: cpus {=u64:#x} {=str} within {=u64} ms", missing, what, WAIT_MS);
        return None;
    }
    cost
}

/// The CPU counts to measure: 1, 2 and every online CPU (the board's CPUs), in wall mode at most
/// the host's cores (`bench.host-cpus`, which xtask passes): a window with more vCPUs than host
/// cores would time the host's scheduler. Icount windows count instructions, so they run every
/// online CPU whatever the host.
fn cpu_counts(plan: &Plan) -> impl Iterator<Item = usize> {
    let online = online_cpus::online();
    let limit = match (plan.clock, plan.host_cpus) {
        (Clock::Nanoseconds, Some(host)) => online.min(host),
        _ => online,
    };
    [1, 2, online]
        .into_iter()
        .enumerate()
        .filter(move |&(at, cpus)| cpus <= limit && (at < 2 || cpus > 2))
        .map(|(_, cpus)| cpus)
}

/// Contention counters, all sources, at one moment.
#[derive(Clone, Copy)]
struct Counters {
    depot: stackdepot::Contention,
    lock_spins: u64,
    shared_cas: u64,
}

fn counters() -> Counters {
    Counters {
        depot: stackdepot::contention(),
        lock_spins: crate::sync::lock_spins(),
        shared_cas: SHARED.cas_failures(),
    }
}

/// One case's rows for one window: `per_op` (or `metric`) against `alone`, and each counter
/// per operation.
#[allow(clippy::too_many_arguments, reason = "one row set: its name, params, measures and counters")]
fn rows(
    suite: &str,
    case: &str,
    params: &str,
    metric: &str,
    plan: &Plan,
    cost: u64,
    alone: u64,
    operations: u64,
    before: Counters,
) {
    let after = counters();
    let per = |value: u64| value as f64 / operations as f64;
    row(suite, case, params, metric, plan.unit(), (cost as f64 - alone as f64) / operations as f64);
    row(
        suite,
        case,
        params,
        "cas_failures",
        "per_op",
        per(after.depot.cas_failures - before.depot.cas_failures + after.shared_cas - before.shared_cas),
    );
    row(
        suite,
        case,
        params,
        "lock_spins",
        "per_op",
        per(after.depot.lock_spins - before.depot.lock_spins + after.lock_spins - before.lock_spins),
    );
    row(suite, case, params, "gate_waits", "per_op", per(after.depot.gate_waits - before.depot.gate_waits));
}

/// The empty loop: what a window costs without an operation.
fn nothing(_: usize, iterations: u64) {
    for iteration in 0..iterations {
        black_box(iteration);
    }
}

// --- depot ---------------------------------------------------------------------------------

static PERMANENT: StackDepot<1024, 2> = StackDepot::new();
static EVICTING: StackDepot<1024, 2, true> = StackDepot::with_eviction();
static DEPOT_POOLS: StaticBlocks<2, { 256 << 10 }> = StaticBlocks::new();
/// Whether the CPUs save one trace (0) or one each (their index).
static DISJOINT: AtomicUsize = AtomicUsize::new(0);
const DEPTH: usize = 16;

fn trace(index: usize, frames: &mut [u64; 64]) -> &[u64] {
    super::depot::synthetic_stack(index as u64, 0xc0de, DEPTH, frames)
}

fn save_permanent(cpu: usize, iterations: u64) {
    let mut frames = [0; 64];
    let frames = trace(cpu * DISJOINT.load(Ordering::Relaxed), &mut frames);
    for _ in 0..iterations {
        let _ = black_box(PERMANENT.save(black_box(frames)));
    }
}

fn save_evicting(cpu: usize, iterations: u64) {
    let mut frames = [0; 64];
    let frames = trace(cpu * DISJOINT.load(Ordering::Relaxed), &mut frames);
    for _ in 0..iterations {
        if let Ok(handle) = EVICTING.save(black_box(frames)) {
            let _ = EVICTING.put(handle);
        }
    }
}

/// Stores every CPU's trace in `depot` (and keeps it: one reference never dropped), so that each
/// later save is a lookup hit. Whether all were stored.
fn store_all<const EVICTABLE: bool>(depot: &StackDepot<1024, 2, EVICTABLE>) -> bool {
    let mut frames = [0; 64];
    (0..CPUS).all(|index| depot.save(trace(index, &mut frames)).is_ok())
}

fn depot_rows(plan: &Plan, cpus: usize, iterations: u64, alone: u64) {
    let stored: [fn() -> bool; 2] = [|| store_all(&PERMANENT), || store_all(&EVICTING)];
    for ((name, operation), store) in
        [("permanent", save_permanent as Operation), ("evicting", save_evicting as Operation)].into_iter().zip(stored)
    {
        for (traces, disjoint) in [("same", 0), ("disjoint", 1)] {
            if !store() {
                defmt::error!("bench cpus: depot {=str}: cannot store the traces", name);
                return;
            }
            DISJOINT.store(disjoint, Ordering::Relaxed);
            let before = counters();
            let Some(cost) = together(plan, cpus, operation, iterations) else { continue };
            let params = Label::new(format_args!("cpus={cpus},depot={name},traces={traces}"));
            rows(
                "cpus",
                "depot-lookup-hit",
                params.as_str(),
                "per_op",
                plan,
                cost,
                alone,
                cpus as u64 * iterations,
                before,
            );
        }
    }
}

// --- ftrace --------------------------------------------------------------------------------

static PER_CPU: PerCpuCounter = PerCpuCounter::new();
static SHARED: SharedCounter = SharedCounter::new();

/// The traced function: an ordinary Rust function with its patchable entry.
#[inline(never)]
fn traced(x: u64) -> u64 {
    x.wrapping_add(1)
}

fn traced_calls(_: usize, iterations: u64) {
    let function = black_box(traced as fn(u64) -> u64);
    let mut value = 0;
    for _ in 0..iterations {
        value = function(value);
    }
    black_box(value);
}

fn ftrace_rows(plan: &Plan, cpus: usize, iterations: u64, alone: u64) {
    if crate::symbols::callsites::entries().is_empty() {
        defmt::error!("bench cpus: this build has no patchable entries (variant plain)");
        return;
    }
    if let Err(error) = ftrace::set_scheme(Scheme::CallOps) {
        defmt::error!("bench cpus: scheme call-ops: {}", error);
        return;
    }
    let calls = cpus as u64 * iterations;
    let mut untraced = None;
    for tracer in ["none", "per-cpu", "shared"] {
        PER_CPU.reset();
        SHARED.reset();
        let ops = match tracer {
            "per-cpu" => Some(&PER_CPU.ops),
            "shared" => Some(&SHARED.ops),
            _ => None,
        };
        let function = traced as *const () as u64;
        let id = match ops.map(|ops| ftrace::register_where(ops, |entry| entry + 8 == function)) {
            Some(Ok(id)) => Some(id),
            Some(Err(error)) => {
                defmt::error!("bench cpus: register {=str}: {}", tracer, error);
                continue;
            }
            None => None,
        };
        let before = counters();
        let cost = together(plan, cpus, traced_calls, iterations);
        if let Some(id) = id
            && let Err(error) = ftrace::unregister(id)
        {
            defmt::error!("bench cpus: unregister {=str}: {}", tracer, error);
        }
        let counted = match tracer {
            "per-cpu" => PER_CPU.hits(),
            "shared" => SHARED.hits(),
            _ => calls,
        };
        let Some(cost) = cost else { continue };
        if counted != calls {
            defmt::error!("bench cpus: tracer {=str} counted {=u64} of {=u64} calls", tracer, counted, calls);
            continue;
        }
        let params = Label::new(format_args!("cpus={cpus},tracer={tracer}"));
        rows("cpus", "traced-call", params.as_str(), "per_call", plan, cost, alone, calls, before);
        let base = *untraced.get_or_insert(cost);
        row(
            "cpus",
            "traced-call",
            params.as_str(),
            "overhead",
            plan.unit(),
            (cost as f64 - base as f64) / calls as f64,
        );
    }
}

// --- kprobes -------------------------------------------------------------------------------

/// Hits per CPU, each in its own cache line.
#[repr(align(64))]
struct HitLine(AtomicU64);
static HITS: [HitLine; CPUS] = [const { HitLine(AtomicU64::new(0)) }; CPUS];

fn count_hit(_: &mut Registers) {
    let hits = &HITS[percpu::this_cpu_index()].0;
    hits.store(hits.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
}

fn probed_calls(_: usize, iterations: u64) {
    let target = black_box(super::probes::bench_probe_target_push as *const () as u64);
    // SAFETY: the loop calls the asm target `push`, which only touches the frame it pushes and
    // pops (probed or not).
    unsafe { super::probes::bench_probe_loop_call(iterations, target) };
}

fn kprobe_rows(plan: &Plan, cpus: usize, iterations: u64) {
    let calls = cpus as u64 * iterations;
    let Some(unprobed) = together(plan, cpus, probed_calls, iterations) else { return };
    let target = super::probes::bench_probe_target_push as *const () as u64;
    for method in Method::ALL {
        if let Err(error) = kprobes::register(target, method, count_hit, None) {
            defmt::error!("bench cpus: kprobe {}: {}", method, error);
            continue;
        }
        HITS.iter().for_each(|line| line.0.store(0, Ordering::Relaxed));
        let before = counters();
        let cost = together(plan, cpus, probed_calls, iterations);
        let unregistered = kprobes::unregister(target);
        let hits: u64 = HITS.iter().map(|line| line.0.load(Ordering::Relaxed)).sum();
        let Some(cost) = cost else { continue };
        if unregistered.is_err() || hits != calls {
            defmt::error!("bench cpus: kprobe {}: {=u64} hits counted for {=u64} calls", method, hits, calls);
            continue;
        }
        let params = Label::new(format_args!("cpus={cpus},method={}", method.name()));
        rows("cpus", "kprobe-push", params.as_str(), "per_hit", plan, cost, unprobed, calls, before);
    }
}

// --- uprobes -------------------------------------------------------------------------------

unsafe extern "C" {
    /// The `probes` suite's EL0 call loop and its `push` target (bench/probes/user.rs).
    static user_bench_loop_call: u32;
    static user_bench_target_push: u32;
}

/// User tasks that faulted in a window (a window with one is not a row).
static USER_FAULTS: AtomicU64 = AtomicU64::new(0);

/// The EL0 loop's and the target's user addresses.
fn user_loop() -> (u64, u64) {
    (
        user::user_address(&raw const user_bench_loop_call as u64),
        user::user_address(&raw const user_bench_target_push as u64),
    )
}

/// This CPU's calls of the uprobe target, from an EL0 task on this CPU (IRQs masked at EL0, as
/// the `probes` suite's user rows): its spawn and join are in the window, and in the unprobed
/// window it is measured against.
fn user_calls(_: usize, iterations: u64) {
    let (program, target) = user_loop();
    let options = user::Options { irqs_masked: true, unmap_lowest_stack_page: false };
    if user::run(program, [iterations, target, 1], options).is_err() {
        USER_FAULTS.fetch_add(1, Ordering::Relaxed);
    }
}

/// One window of uprobe'd EL0 calls (`method`, `slots`) on `cpus` CPUs: its cost and the slot
/// waits in it, or None (said why).
fn uprobe_window(plan: &Plan, cpus: usize, iterations: u64, method: Method, slots: XolSlots) -> Option<(u64, u64)> {
    let calls = cpus as u64 * iterations;
    let (_, target) = user_loop();
    if let Err(error) = uprobe::register_with_slots(target, method, count_hit, None, slots) {
        defmt::error!("bench cpus: uprobe {} {}: {}", method, slots, error);
        return None;
    }
    HITS.iter().for_each(|line| line.0.store(0, Ordering::Relaxed));
    USER_FAULTS.store(0, Ordering::Relaxed);
    let waits = uprobe::slot_waits();
    let cost = together(plan, cpus, user_calls, iterations);
    let waits = uprobe::slot_waits() - waits;
    let unregistered = uprobe::unregister(target);
    let hits: u64 = HITS.iter().map(|line| line.0.load(Ordering::Relaxed)).sum();
    let faults = USER_FAULTS.load(Ordering::Relaxed);
    if unregistered.is_err() || hits != calls || faults != 0 {
        defmt::error!(
            "bench cpus: uprobe {} {}: {=u64} hits counted for {=u64} calls, {=u64} user faults",
            method,
            slots,
            hits,
            calls,
            faults
        );
        return None;
    }
    Some((cost?, waits))
}

fn uprobe_rows(plan: &Plan, cpus: usize, iterations: u64) {
    let calls = cpus as u64 * iterations;
    USER_FAULTS.store(0, Ordering::Relaxed);
    let Some(unprobed) = together(plan, cpus, user_calls, iterations) else { return };
    for method in Method::ALL {
        let before = counters();
        let Some((cost, _)) = uprobe_window(plan, cpus, iterations, method, XolSlots::PerProbe) else { continue };
        let params = Label::new(format_args!("cpus={cpus},method={}", method.name()));
        rows("cpus", "uprobe-push", params.as_str(), "per_hit", plan, cost, unprobed, calls, before);
    }
    // The XOL slot strategies, for the methods that step the instruction out of line.
    let strategies = [
        ("per-probe", XolSlots::PerProbe),
        ("per-cpu", XolSlots::PerCpu { skip_unchanged: false }),
        ("per-cpu-skip", XolSlots::PerCpu { skip_unchanged: true }),
    ];
    for method in [Method::SingleStep, Method::BrkStep] {
        for (name, slots) in strategies {
            let before = counters();
            let Some((cost, waits)) = uprobe_window(plan, cpus, iterations, method, slots) else { continue };
            let params = Label::new(format_args!("cpus={cpus},method={},slots={name}", method.name()));
            rows("cpus", "uprobe-xol", params.as_str(), "per_hit", plan, cost, unprobed, calls, before);
            row("cpus", "uprobe-xol", params.as_str(), "slot_waits", "per_op", waits as f64 / calls as f64);
        }
    }
}

/// Suite `cpus`.
pub fn run(plan: &Plan) {
    let iterations: u64 = if plan.icount { 2_000 } else { 20_000 };
    for _ in 0..DEPOT_POOLS_WANTED.swap(0, Ordering::Relaxed) {
        if let Some(pool) = DEPOT_POOLS.claim() {
            let _ = PERMANENT.add_pool(pool);
        }
        if let Some(pool) = DEPOT_POOLS.claim() {
            let _ = EVICTING.add_pool(pool);
        }
    }
    for _ in 0..plan.reps {
        for cpus in cpu_counts(plan) {
            let Some(alone) = together(plan, cpus, nothing, iterations) else { continue };
            depot_rows(plan, cpus, iterations, alone);
            ftrace_rows(plan, cpus, iterations, alone);
            kprobe_rows(plan, cpus, iterations);
            uprobe_rows(plan, cpus, iterations);
        }
    }
}

/// The depots get their pools once (a second `run` finds them there).
static DEPOT_POOLS_WANTED: AtomicUsize = AtomicUsize::new(1);

// --- heap ----------------------------------------------------------------------------------

static FAILED_ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

fn allocate_free(_: usize, iterations: u64) {
    for _ in 0..iterations {
        match heap::allocate(black_box(64), 16) {
            Some(pointer) => heap::free(pointer),
            None => {
                FAILED_ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Suite `cpus-heap` (on `full` by default: the sanitizer kernel).
pub fn run_heap(plan: &Plan) {
    let iterations: u64 = if plan.icount { 1_000 } else { 5_000 };
    let saved = heap::stacks();
    heap::set_stacks(if crate::build_info::SHADOW_CALL_STACK { Stacks::ShadowCallStack } else { Stacks::FramePointer });
    for _ in 0..plan.reps {
        for cpus in cpu_counts(plan) {
            let Some(alone) = together(plan, cpus, nothing, iterations) else { continue };
            FAILED_ALLOCATIONS.store(0, Ordering::Relaxed);
            let before = counters();
            let Some(cost) = together(plan, cpus, allocate_free, iterations) else { continue };
            let failed = FAILED_ALLOCATIONS.load(Ordering::Relaxed);
            if failed != 0 {
                defmt::error!("bench cpus-heap: {=u64} allocations failed", failed);
                continue;
            }
            let params = Label::new(format_args!("cpus={cpus}"));
            rows(
                "cpus-heap",
                "heap-alloc-free",
                params.as_str(),
                "per_op",
                plan,
                cost,
                alone,
                cpus as u64 * iterations,
                before,
            );
        }
    }
    heap::set_stacks(saved);
}
