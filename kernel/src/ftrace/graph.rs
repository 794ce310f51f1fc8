//! The function-graph tracer: entry through a call-ops site, return through a hijacked x30.
//!
//! # Entry
//!
//! The tracer is an ordinary ftrace ops ([`GRAPH`]), so a traced function reaches it through its
//! call-ops site: `mov x9, x30; bl ftrace_trampoline` -> `ftrace_graph_entry_shim` (asm, adds the
//! shadow slot) -> [`graph_entry`], with IRQs masked and the CPU's recursion guard held. It
//! pushes a [`HijackedReturn`] `{entry SP, x18 at entry, real return, function, entry time}` on
//! the context's [`ReturnStack`] (the task's, or this CPU's IRQ context's, as return probes do),
//! records an entry event in this CPU's ring, and replaces `Regs::lr` by
//! `ftrace_graph_return`. A full stack ([`DEPTH`] returns) is counted in [`overflows`] and the
//! call is neither recorded nor hijacked: never a wrong return.
//!
//! # Shadow call stack and pointer authentication
//!
//! The trampoline reloads x30 from `Regs::lr` when it returns into the function body, at
//! `E + 16`, which is before the function's own `paciasp` and its shadow-stack push (`E + 16`,
//! `E + 20`: the callsite layout of `crates/ftrace`). So the hook writes the one place x30 comes
//! from: the prologue signs `ftrace_graph_return` with the entry SP and pushes that signed value
//! to the slot the instance records; the epilogue reloads it from that slot (SCS builds) and
//! `autiasp` authenticates it with the same SP. Every copy (x30, the frame record, the SCS slot)
//! holds the same hijacked address, and nothing the epilogue checks was changed behind it.
//!
//! # Return
//!
//! The function's `ret` lands in `ftrace_graph_return` (asm, `.text.noprobe`, Linux's
//! `return_to_handler`) with SP and x18 as at entry and x0..x7 holding the return value. It
//! saves x0..x7 and a frame record `{x29, trampoline}`, masks IRQs, and calls
//! [`ftrace_graph_exit`], which drops abandoned instances (below SP), pops the top one (its entry
//! SP is SP), records an exit event with the entry time, and gives back the real address; the
//! trampoline restores x0..x7 and DAIF and returns there.
//!
//! # With a return probe on the same function
//!
//! Both fire. The graph hook runs first at entry (the call slot precedes the function's first
//! instruction, where a kretprobe attaches), so the kretprobe saves `ftrace_graph_return` as its
//! real address and puts its own trampoline in x30. At the return the kretprobe's handler runs
//! first and returns into `ftrace_graph_return`, which records the exit and returns to the
//! caller: entries graph then probe, returns probe then graph, each restored by its owner. The
//! walkers resolve the chain (`unwind::ReturnRepair::repaired_frame`).
//!
//! # Output
//!
//! [`stream`] writes every CPU's ring for xtask, which prints Linux's `function_graph` format
//! (xtask/src/trace.rs). Times are PMCCNTR_EL0: instructions under `-icount shift=0`, virtual
//! nanoseconds under TCG otherwise (QEMU's cycle counter runs at 1 GHz of virtual time), cycles
//! on hardware; the stream's header says which.

use core::cell::UnsafeCell;
use core::mem::offset_of;
use core::sync::atomic::{AtomicU64, Ordering};

use unwind::{HijackedReturn, ReturnStack};

use super::trampoline::{Ops, Regs};
use crate::probes::cells::PerContext;
use crate::task::TASKS;
use crate::task::stacks::{self, CPUS};

/// Hijacked returns per context (Linux's `FTRACE_RETFUNC_DEPTH` is 50; the kernel's deepest
/// paths stay well below).
pub const DEPTH: usize = 64;
/// Events kept per CPU (the newest; older ones are overwritten).
pub const RING: usize = 2048;

/// Contexts as return probes count them: the task table's entries, then one IRQ context per CPU.
const IRQ_CONTEXTS: usize = TASKS;
const CONTEXT_COUNT: usize = IRQ_CONTEXTS + CPUS;

/// The graph return stacks, one per context, changed only by code running in that context with
/// IRQs masked (entry, exit, task start) and read by walkers in that context or an IRQ above it.
static RETURNS: PerContext<ReturnStack<DEPTH>, CONTEXT_COUNT> =
    PerContext::new([const { UnsafeCell::new(ReturnStack::new()) }; CONTEXT_COUNT]);

/// What the walkers compare return addresses with: `ftrace_graph_return` from the first
/// registration on (graph returns may be outstanding after the tracer stops, until their
/// functions return), 0 before. One load per walk.
static WALK_TRAMPOLINE: AtomicU64 = AtomicU64::new(0);

/// The event kinds of a ring slot's `depth` word (top bit).
const EXIT_BIT: u64 = 1 << 63;

/// One ring slot: an entry `{time, function, depth, 0}` or an exit `{time, function, depth |
/// EXIT_BIT, entry time}`. Relaxed atomics: a reader racing the writer sees a mixed slot at
/// worst; 32 bytes, a shifted index.
#[repr(C, align(32))]
struct Slot {
    time: AtomicU64,
    function: AtomicU64,
    depth: AtomicU64,
    entry_time: AtomicU64,
}

/// One CPU's events, written only by that CPU with IRQs masked.
#[repr(C)]
struct CpuRing {
    slots: [Slot; RING],
    /// Events written so far (the next slot is `written % RING`).
    written: AtomicU64,
    /// Calls not traced because the context's return stack was full.
    overflows: AtomicU64,
}

static RINGS: [CpuRing; CPUS] = [const {
    CpuRing {
        slots: [const {
            Slot {
                time: AtomicU64::new(0),
                function: AtomicU64::new(0),
                depth: AtomicU64::new(0),
                entry_time: AtomicU64::new(0),
            }
        }; RING],
        written: AtomicU64::new(0),
        overflows: AtomicU64::new(0),
    }
}; CPUS];

/// The graph tracer's ops: what its sites' literals point at.
pub static GRAPH: Ops = Ops { func: ftrace_graph_entry_shim, private: 0 };

core::arch::global_asm!(
    r#"
    .section .text.noprobe, "ax"
    .balign 8
    .global ftrace_graph_entry_shim
ftrace_graph_entry_shim:
    // Called by ftrace_trampoline as ops.func(ip, parent_ip, ops, regs), which pushed two slots
    // on the SCS in SCS builds: x18 - 16 is the slot the traced function's prologue will use.
    .if {scs}
    sub     x4, x18, #16
    .else
    mov     x4, xzr
    .endif
    b       {entry}
    .size ftrace_graph_entry_shim, . - ftrace_graph_entry_shim

    .balign 16
    .global ftrace_graph_return
ftrace_graph_return:
    // Reached by a graph-traced function's `ret`: x30 = this address, SP and x18 as at its entry,
    // x0..x7 the return value (x8 and x9..x17 are dead across a return).
    sub     sp, sp, #96
    stp     x29, x30, [sp]              // a frame record holding this trampoline (walkers repair it)
    mov     x29, sp
    stp     x0, x1, [sp, #16]
    stp     x2, x3, [sp, #32]
    stp     x4, x5, [sp, #48]
    stp     x6, x7, [sp, #64]
    mrs     x9, daif
    str     x9, [sp, #80]
    msr     daifset, #3
    add     x0, sp, #96                 // SP at the traced function's entry
    bl      ftrace_graph_exit
    mov     x30, x0                     // the real return address
    ldr     x9, [sp, #80]
    msr     daif, x9
    ldp     x0, x1, [sp, #16]
    ldp     x2, x3, [sp, #32]
    ldp     x4, x5, [sp, #48]
    ldp     x6, x7, [sp, #64]
    ldr     x29, [sp]
    add     sp, sp, #96
    ret
    .size ftrace_graph_return, . - ftrace_graph_return
"#,
    scs = const crate::build_info::SHADOW_CALL_STACK as u8,
    entry = sym graph_entry,
);

unsafe extern "C" {
    fn ftrace_graph_entry_shim(ip: u64, parent_ip: u64, ops: &Ops, regs: &mut Regs);
    static ftrace_graph_return: u32;
}

/// Where graph-traced functions return to.
#[inline(always)]
pub fn trampoline() -> u64 {
    // SAFETY: only the address of the asm-defined symbol is taken.
    unsafe { &ftrace_graph_return as *const u32 as u64 }
}

/// The address walkers must repair, or 0 while the graph tracer was never on (one load).
#[inline(always)]
pub fn walk_trampoline() -> u64 {
    let address: u64;
    // SAFETY: an aligned 64-bit load of an atomic (a relaxed load), its address PC-relative
    // (`adrp`, `ldr`: two instructions where the large code model builds it in four); reads
    // only that word, no flags.
    unsafe {
        core::arch::asm!(
            "adrp {address}, {symbol}",
            "ldr {address}, [{address}, :lo12:{symbol}]",
            address = out(reg) address,
            symbol = sym WALK_TRAMPOLINE,
            options(pure, readonly, nostack, preserves_flags)
        )
    };
    address
}

/// PMCCNTR_EL0 (see the module docs for what it counts). No barrier: the entry and exit points
/// are themselves the measured boundaries.
#[inline(always)]
fn now() -> u64 {
    let value;
    // SAFETY: reads a counter; no memory, no flags.
    unsafe { core::arch::asm!("mrs {}, pmccntr_el0", out(reg) value, options(nomem, nostack, preserves_flags)) };
    value
}

/// The context (the task's table index, or this CPU's IRQ context) whose stack holds `sp`.
#[inline(always)]
fn context_index(sp: u64) -> usize {
    if stacks::this_irq_slot().contains_stack(sp) {
        IRQ_CONTEXTS + crate::arch::percpu::this_cpu_index()
    } else {
        crate::task::current().0
    }
}

/// Appends one event to this CPU's ring (IRQs masked: only this CPU writes it).
#[inline(always)]
fn record(time: u64, function: u64, depth: u64, entry_time: u64) {
    let ring = &RINGS[crate::arch::percpu::this_cpu_index()];
    let written = ring.written.load(Ordering::Relaxed);
    let slot = &ring.slots[written as usize % RING];
    // SAFETY: aligned stores to the slot's four atomics (interior mutability), at their offsets in
    // the `repr(C)` slot: relaxed atomic stores, as two `stp`s.
    unsafe {
        core::arch::asm!(
            "stp {t}, {f}, [{s}, #{time}]",
            "stp {d}, {e}, [{s}, #{depth_at}]",
            s = in(reg) slot as *const Slot,
            t = in(reg) time,
            f = in(reg) function,
            d = in(reg) depth,
            e = in(reg) entry_time,
            time = const offset_of!(Slot, time),
            depth_at = const offset_of!(Slot, depth),
            options(nostack, preserves_flags)
        )
    };
    ring.written.store(written + 1, Ordering::Release);
}

const _: () = assert!(offset_of!(Slot, function) == 8 && offset_of!(Slot, entry_time) == 24);

/// The entry hook (through `ftrace_graph_entry_shim`): IRQs masked, recursion guard held.
#[sanitize(kernel_hwaddress = "off")]
#[unsafe(link_section = ".text.noprobe")]
unsafe extern "C" fn graph_entry(ip: u64, parent_ip: u64, _: &Ops, regs: &mut Regs, shadow_slot: u64) {
    let sp = regs.sp;
    // SAFETY: IRQs are masked and this is the context that owns the stack (see RETURNS).
    let stack = unsafe { &mut *RETURNS.get(context_index(sp)) };
    stack.drop_abandoned(sp, |_| {});
    let time = now();
    let depth = stack.len() as u64;
    let instance = HijackedReturn { entry_sp: sp, shadow_slot, real: parent_ip, cookie: ip, data: time };
    if stack.push(instance).is_err() {
        let overflows = &RINGS[crate::arch::percpu::this_cpu_index()].overflows;
        overflows.store(overflows.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        return;
    }
    record(time, ip, depth, 0);
    regs.lr = trampoline();
}

/// Called by `ftrace_graph_return` (IRQs masked) with the SP the traced function returned with;
/// returns where it really returns to.
#[unsafe(no_mangle)]
#[sanitize(kernel_hwaddress = "off")]
#[unsafe(link_section = ".text.noprobe")]
extern "C" fn ftrace_graph_exit(sp: u64) -> u64 {
    // SAFETY: IRQs are masked and this is the context that owns the stack (see RETURNS).
    let stack = unsafe { &mut *RETURNS.get(context_index(sp)) };
    stack.drop_abandoned(sp, |_| {});
    let Some(instance) = stack.top_at(sp) else {
        panic!("ftrace graph return reached at SP {:#x} with no hijacked return there", sp);
    };
    stack.pop();
    record(now(), instance.cookie, stack.len() as u64 | EXIT_BIT, instance.data);
    instance.real
}

/// A new task starts in task slot `index`: its context has no graph returns.
pub fn forget_task(index: usize) {
    let _mask = crate::sync::IrqMask::new();
    // SAFETY: the slot belongs to no running context (spawn is choosing it), IRQs are masked.
    unsafe { (*RETURNS.get(index)).clear() };
}

/// Graph returns outstanding in the current context (for the tests).
pub fn outstanding() -> usize {
    let sp: u64;
    // SAFETY: reads SP.
    unsafe { core::arch::asm!("mov {}, sp", out(reg) sp, options(nomem, nostack, preserves_flags)) };
    let _mask = crate::sync::IrqMask::new();
    // SAFETY: read in the context that owns the stack, IRQs masked (see RETURNS).
    unsafe { (*RETURNS.get(context_index(sp))).len() }
}

/// Calls not traced because a return stack was full, all CPUs.
pub fn overflows() -> u64 {
    RINGS.iter().map(|ring| ring.overflows.load(Ordering::Relaxed)).sum()
}

/// Forgets every recorded event and overflow (call with the tracer off).
pub fn clear() {
    for ring in &RINGS {
        ring.written.store(0, Ordering::Release);
        ring.overflows.store(0, Ordering::Relaxed);
    }
}

/// Events recorded so far, all CPUs.
pub fn written() -> u64 {
    RINGS.iter().map(|ring| ring.written.load(Ordering::Acquire)).sum()
}

/// Registers the graph tracer on every traceable function matching `pattern`.
pub fn register(pattern: &str) -> Result<::ftrace::TracerId, super::Error> {
    start_clock();
    super::register(&GRAPH, pattern)
}

/// Registers the graph tracer on the traceable functions whose start satisfies `filter`.
pub fn register_where(filter: impl FnMut(u64) -> bool) -> Result<::ftrace::TracerId, super::Error> {
    start_clock();
    super::register_where(&GRAPH, filter)
}

/// The counter must run, and the walkers must know the trampoline before the first hijack.
fn start_clock() {
    crate::arch::counters::start_cycle_counter();
    WALK_TRAMPOLINE.store(trampoline(), Ordering::Release);
}

/// One recorded event, oldest first per CPU.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Event {
    pub time: u64,
    pub function: u64,
    pub depth: u64,
    /// `Some(entry time)` for an exit.
    pub exit: Option<u64>,
}

/// CPU `cpu`'s `index`-th kept event, oldest first (call with the tracer off).
pub fn event(cpu: usize, index: u64) -> Option<Event> {
    let ring = RINGS.get(cpu)?;
    let written = ring.written.load(Ordering::Acquire);
    let kept = written.min(RING as u64);
    (index < kept).then(|| {
        let slot = &ring.slots[((written - kept + index) % RING as u64) as usize];
        let depth = slot.depth.load(Ordering::Relaxed);
        Event {
            time: slot.time.load(Ordering::Relaxed),
            function: slot.function.load(Ordering::Relaxed),
            depth: depth & !EXIT_BIT,
            exit: (depth & EXIT_BIT != 0).then(|| slot.entry_time.load(Ordering::Relaxed)),
        }
    })
}

/// Streams every CPU's ring for xtask (xtask/src/trace.rs writes Linux's `function_graph`
/// output): `ftrace graph: CPUS cpus, UNIT, OVERFLOWS overflows`, then per CPU with events
/// `ftrace graph cpu: CPU KEPT of WRITTEN events`, one `ftrace graph entry: TIME FUNCTION DEPTH`
/// or `ftrace graph exit: TIME FUNCTION DEPTH ENTRY_TIME` per event, and `ftrace graph end`.
/// `unit` is `insn` under icount, `ns` otherwise. Call with the tracer off.
pub fn stream(unit: &str) {
    defmt::info!(
        "ftrace graph: {=usize} cpus, {=str}, {=u64} overflows",
        crate::task::cpus::online(),
        unit,
        overflows()
    );
    for (cpu, ring) in RINGS.iter().enumerate() {
        let written = ring.written.load(Ordering::Acquire);
        if written == 0 {
            continue;
        }
        defmt::info!("ftrace graph cpu: {=usize} {=u64} of {=u64} events", cpu, written.min(RING as u64), written);
        let mut index = 0;
        while let Some(event) = event(cpu, index) {
            match event.exit {
                None => {
                    defmt::info!("ftrace graph entry: {=u64} {=u64:#x} {=u64}", event.time, event.function, event.depth)
                }
                Some(entry_time) => defmt::info!(
                    "ftrace graph exit: {=u64} {=u64:#x} {=u64} {=u64}",
                    event.time,
                    event.function,
                    event.depth,
                    entry_time
                ),
            }
            index += 1;
        }
    }
    defmt::info!("ftrace graph end");
}

/// The real return address for the frame record at `record` holding the graph trampoline (the
/// walkers' repair, `stacktrace.rs`).
pub fn frame_return(record: u64) -> Option<u64> {
    // SAFETY: read from the context that owns the stack or an IRQ above it (see RETURNS).
    unsafe { (*RETURNS.get(context_index(record))).frame_return(record, trampoline()) }
}

/// The real return address for the shadow-stack slot at `slot` holding the graph trampoline.
pub fn shadow_return(slot: u64) -> Option<u64> {
    let irq = RETURNS.get(IRQ_CONTEXTS + crate::arch::percpu::this_cpu_index());
    let task = RETURNS.get(crate::task::current().0);
    // SAFETY: as above.
    unsafe { (*task).shadow_return(slot, trampoline()).or_else(|| (*irq).shadow_return(slot, trampoline())) }
}
