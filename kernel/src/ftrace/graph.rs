//! The function-graph tracer: entry through a call-ops site, return through a hijacked x30.
//!
//! # Entry
//!
//! The tracer is an ordinary ftrace ops ([`GRAPH`]), so a traced function reaches it through its
//! call-ops site: `mov x9, x30; bl ftrace_trampoline` -> `ftrace_graph_entry` (asm), with IRQs
//! masked and the CPU's recursion guard held. It pushes a [`HijackedReturn`] `{entry SP, x18 at
//! entry, real return, function, entry time}` on the context's [`ReturnStack`] (the task's, or
//! this CPU's IRQ context's, as return probes do), records an entry event in this CPU's ring,
//! and replaces `Regs::lr` by `ftrace_graph_return`. A full stack ([`DEPTH`] returns) is counted in [`overflows`] and the
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
//! masks IRQs, drops abandoned instances (below SP), pops the top one (its entry SP is SP),
//! records an exit event with the entry time, restores DAIF and returns to the real address. It
//! uses only x9-x17, free after a return, so the return value needs no saving, and it calls
//! nothing (no frame of its own for a walker to meet).
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
//! (xtask/src/function_graph.rs). Times are PMCCNTR_EL0: instructions under `-icount shift=0`, virtual
//! nanoseconds under TCG otherwise (QEMU's cycle counter runs at 1 GHz of virtual time), cycles
//! on hardware; the stream's header says which.

use core::cell::UnsafeCell;
use core::mem::offset_of;
use core::sync::atomic::{AtomicU64, Ordering};

use unwind::{HijackedReturn, ReturnStack};

use super::trampoline::{Ops, Regs};
use crate::arch::percpu::PerCpu;
use crate::probes::cells::PerContext;
use crate::task::TASKS;
use crate::task::stacks::{self, CPUS};

/// Hijacked returns per context (Linux's `FTRACE_RETFUNC_DEPTH` is 50; the kernel's deepest
/// paths stay well below).
pub const DEPTH: usize = 64;
/// Events kept per CPU (the newest; older ones are overwritten). A power of two.
pub const RING: usize = 2048;

/// Contexts as return probes count them: the task table's entries, then one IRQ context per CPU.
const IRQ_CONTEXTS: usize = TASKS;
const CONTEXT_COUNT: usize = IRQ_CONTEXTS + CPUS;

/// The graph return stacks, one per context, changed only by code running in that context with
/// IRQs masked (entry, exit, task start) and read by walkers in that context or an IRQ above it.
static RETURNS: PerContext<ReturnStack<DEPTH>, CONTEXT_COUNT> =
    PerContext::new([const { UnsafeCell::new(ReturnStack::new()) }; CONTEXT_COUNT]);

/// What the walkers compare return addresses with: `ftrace_graph_return` from a registration
/// until no registration is left and no graph return is outstanding (`retire_if_idle`), 0
/// otherwise. One load per walk.
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

/// One CPU's events, written only by that CPU with IRQs masked (64 KiB: a shifted index).
#[repr(C)]
struct CpuRing([Slot; RING]);

/// One CPU's counts, beside its ring.
#[repr(C)]
struct CpuCounts {
    /// Events written so far (the next slot is `written % RING`).
    written: AtomicU64,
    /// Calls not traced because the context's return stack was full.
    overflows: AtomicU64,
}

static RINGS: [CpuRing; CPUS] = [const {
    CpuRing(
        [const {
            Slot {
                time: AtomicU64::new(0),
                function: AtomicU64::new(0),
                depth: AtomicU64::new(0),
                entry_time: AtomicU64::new(0),
            }
        }; RING],
    )
}; CPUS];
static COUNTS: [CpuCounts; CPUS] =
    [const { CpuCounts { written: AtomicU64::new(0), overflows: AtomicU64::new(0) } }; CPUS];

const _: () = {
    assert!(size_of::<CpuRing>() == 1 << 16 && size_of::<Slot>() == 32 && size_of::<CpuCounts>() == 16);
    assert!(offset_of!(Slot, function) == 8 && offset_of!(Slot, depth) == 16 && offset_of!(Slot, entry_time) == 24);
    assert!(offset_of!(CpuCounts, overflows) == 8 && RING.is_power_of_two());
    assert!(size_of::<HijackedReturn>() == 40 && offset_of!(HijackedReturn, entry_sp) == 0);
    assert!(offset_of!(HijackedReturn, real) == 16 && offset_of!(HijackedReturn, cookie) == 24);
    assert!(offset_of!(HijackedReturn, data) == 32);
    assert!(crate::arch::stack::STACK_SIZE < 1 << 16 && DEPTH < 1 << 12);
};

/// The graph tracer's ops: what its sites' literals point at.
pub static GRAPH: Ops = Ops { func: ftrace_graph_entry, private: 0 };

// Both hooks are asm: they run on every traced call, and in asm they use only x9-x17 (free at a
// function's entry and after its return) and touch nothing the traced code can see but the
// return stack, the ring and (entry) `Regs::lr`.
//
// The context: the IRQ context of this CPU if SP is on its IRQ stack (`[top - STACK_SIZE, top)`),
// else the running task's (`PerCpu::current_task`), as `probes::kretprobe` picks it.
core::arch::global_asm!(
    r#"
    .section .text.noprobe, "ax"
    .balign 16
    .global ftrace_graph_entry
ftrace_graph_entry:
    // ops.func(ip x0, parent_ip x1, ops x2, regs x3) from ftrace_trampoline (directly, or through
    // the list or a vector function): IRQs masked, the recursion guard held. A leaf: its CFI
    // (the SFrame table's rows) is the entry's, CFA = SP and the return address in x30.
    .cfi_startproc
    ldr     x10, [x3, #{regs_sp}]               // SP at the traced function's entry
    mrs     x11, tpidr_el1
    ldr     x12, [x11, #{irq_top}]
    sub     x12, x12, x10
    sub     x12, x12, #1
    cmp     x12, #{stack_size}
    b.lo    1f
    ldr     x12, [x11, #{current_task}]
    b       2f
1:  ldr     x12, [x11, #{cpu_index}]
    add     x12, x12, #{irq_contexts}
2:  adrp    x13, {returns}
    add     x13, x13, :lo12:{returns}
    mov     x14, #{stack_bytes}
    madd    x13, x12, x14, x13                  // this context's ReturnStack
    ldr     x12, [x13, #{len}]
    mov     x15, #{entry_bytes}
3:  cbz     x12, 4f                             // drop abandoned entries (entry SP below SP)
    sub     x16, x12, #1
    madd    x17, x16, x15, x13
    ldr     x17, [x17]
    cmp     x17, x10
    b.hs    4f
    mov     x12, x16
    str     x12, [x13, #{len}]
    b       3b
4:  cmp     x12, #{depth}
    b.hs    5f
    .if {scs}
    // The function's shadow slot: where the trampoline pushed its return address (x9, = x1).
    // Called by the trampoline, that is x18 - 16; through the list or a vector function, which
    // pushed their own return addresses above it, a few slots further down.
    sub     x14, x18, #16
6:  ldr     x17, [x14]
    cmp     x17, x1
    b.eq    7f
    sub     x14, x14, #8
    b       6b
7:
    .else
    mov     x14, xzr
    .endif
    madd    x16, x12, x15, x13                  // the new entry
    stp     x10, x14, [x16]                     // entry_sp, shadow_slot
    stp     x1, x0, [x16, #16]                  // real, cookie: the function
    mrs     x17, pmccntr_el0
    str     x17, [x16, #32]                     // data: the entry time
    add     x14, x12, #1
    str     x14, [x13, #{len}]                  // the length after the entry
    ldr     x13, [x11, #{cpu_index}]
    adrp    x14, {rings}
    add     x14, x14, :lo12:{rings}
    add     x14, x14, x13, lsl #16              // this CPU's ring
    adrp    x15, {counts}
    add     x15, x15, :lo12:{counts}
    add     x15, x15, x13, lsl #4               // this CPU's counts
    ldr     x13, [x15]
    and     x16, x13, #{ring_mask}
    add     x16, x14, x16, lsl #5
    stp     x17, x0, [x16]                      // time, function
    stp     x12, xzr, [x16, #16]                // depth, no entry time
    add     x13, x13, #1
    stlr    x13, [x15]                          // publishes the slot
    adrp    x14, ftrace_graph_return
    add     x14, x14, :lo12:ftrace_graph_return
    str     x14, [x3, #{regs_lr}]               // the hijack: x30 when the body starts
    ret
5:  ldr     x13, [x11, #{cpu_index}]            // full: count it, leave the return alone
    adrp    x15, {counts}
    add     x15, x15, :lo12:{counts}
    add     x15, x15, x13, lsl #4
    ldr     x14, [x15, #8]
    add     x14, x14, #1
    str     x14, [x15, #8]
    ret
    .cfi_endproc
    .size ftrace_graph_entry, . - ftrace_graph_entry

    .balign 16
    .global ftrace_graph_return
ftrace_graph_return:
    // Reached by a graph-traced function's `ret`: x30 = this address, SP and x18 as at its
    // entry, x0..x7 (and x8) as it returned them. Pops the top instance, whose entry SP is SP.
    // CFI as a leaf: the return address in x30, this address until the pop, which a walker
    // repairs by the CFA (SP); the path that finds no instance has no rows.
    .cfi_startproc
    mrs     x9, daif
    msr     daifset, #3
    mov     x10, sp
    mrs     x11, tpidr_el1
    ldr     x12, [x11, #{irq_top}]
    sub     x12, x12, x10
    sub     x12, x12, #1
    cmp     x12, #{stack_size}
    b.lo    1f
    ldr     x12, [x11, #{current_task}]
    b       2f
1:  ldr     x12, [x11, #{cpu_index}]
    add     x12, x12, #{irq_contexts}
2:  adrp    x13, {returns}
    add     x13, x13, :lo12:{returns}
    mov     x14, #{stack_bytes}
    madd    x13, x12, x14, x13
    ldr     x12, [x13, #{len}]
    mov     x15, #{entry_bytes}
3:  cbz     x12, 9f                             // nothing hijacked here
    sub     x16, x12, #1
    madd    x14, x16, x15, x13
    ldr     x17, [x14]
    cmp     x17, x10
    b.hs    4f
    mov     x12, x16                            // abandoned (entry SP below SP): drop it
    str     x12, [x13, #{len}]
    b       3b
4:  b.ne    9f                                  // the top instance is an outer frame's
    ldp     x30, x15, [x14, #16]                // the real return address, the function
    ldr     x17, [x14, #32]                     // its entry time
    str     x16, [x13, #{len}]                  // pop
    ldr     x13, [x11, #{cpu_index}]
    adrp    x14, {rings}
    add     x14, x14, :lo12:{rings}
    add     x14, x14, x13, lsl #16
    adrp    x12, {counts}
    add     x12, x12, :lo12:{counts}
    add     x12, x12, x13, lsl #4
    ldr     x11, [x12]
    and     x10, x11, #{ring_mask}
    add     x10, x14, x10, lsl #5
    mrs     x14, pmccntr_el0
    stp     x14, x15, [x10]                     // time, function
    orr     x16, x16, #{exit_bit}
    stp     x16, x17, [x10, #16]                // depth | EXIT_BIT, entry time
    add     x11, x11, #1
    stlr    x11, [x12]
    msr     daif, x9
    ret
    .cfi_endproc
9:  mov     x0, x10
    bl      {lost}
    .size ftrace_graph_return, . - ftrace_graph_return
"#,
    scs = const crate::build_info::SHADOW_CALL_STACK as u8,
    regs_sp = const offset_of!(Regs, sp),
    regs_lr = const offset_of!(Regs, lr),
    irq_top = const offset_of!(PerCpu, irq_stack_top),
    current_task = const offset_of!(PerCpu, current_task),
    cpu_index = const offset_of!(PerCpu, index),
    stack_size = const crate::arch::stack::STACK_SIZE,
    irq_contexts = const IRQ_CONTEXTS,
    returns = sym RETURNS,
    stack_bytes = const size_of::<ReturnStack<DEPTH>>(),
    entry_bytes = const size_of::<HijackedReturn>(),
    len = const ReturnStack::<DEPTH>::LEN_OFFSET,
    depth = const DEPTH,
    rings = sym RINGS,
    counts = sym COUNTS,
    ring_mask = const RING - 1,
    exit_bit = const EXIT_BIT,
    lost = sym ftrace_graph_lost,
);

unsafe extern "C" {
    fn ftrace_graph_entry(ip: u64, parent_ip: u64, ops: &Ops, regs: &mut Regs);
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

/// `ftrace_graph_return` found no instance for its SP: where to return is unknown.
#[unsafe(link_section = ".text.noprobe")]
extern "C" fn ftrace_graph_lost(sp: u64) -> ! {
    panic!("ftrace graph return reached at SP {:#x} with no hijacked return there", sp);
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
    COUNTS.iter().map(|counts| counts.overflows.load(Ordering::Relaxed)).sum()
}

/// Forgets every recorded event and overflow (call with the tracer off).
pub fn clear() {
    for counts in &COUNTS {
        counts.written.store(0, Ordering::Release);
        counts.overflows.store(0, Ordering::Relaxed);
    }
}

/// Events recorded so far, all CPUs.
pub fn written() -> u64 {
    COUNTS.iter().map(|counts| counts.written.load(Ordering::Acquire)).sum()
}

/// The graph tracer's registrations (its ops may be registered more than once).
static REGISTERED: AtomicU64 = AtomicU64::new(0);

/// Registers the graph tracer on every traceable function matching `pattern`.
pub fn register(pattern: &str) -> Result<::ftrace::TracerId, super::Error> {
    start_clock();
    registered(super::register(&GRAPH, pattern))
}

/// Registers the graph tracer on the traceable functions whose start satisfies `filter`.
pub fn register_where(filter: impl FnMut(u64) -> bool) -> Result<::ftrace::TracerId, super::Error> {
    start_clock();
    registered(super::register_where(&GRAPH, filter))
}

fn registered(result: Result<::ftrace::TracerId, super::Error>) -> Result<::ftrace::TracerId, super::Error> {
    match result {
        Ok(_) => {
            REGISTERED.fetch_add(1, Ordering::Relaxed);
        }
        Err(_) => retire_if_idle(),
    }
    result
}

/// The counter must run, and the walkers must know the trampoline before the first hijack.
fn start_clock() {
    crate::arch::counters::start_cycle_counter();
    WALK_TRAMPOLINE.store(trampoline(), Ordering::Release);
    crate::stacktrace::walk_graph_returns(true);
}

/// `ftrace::unregister` stopped a tracer whose ops are `ops`, and its grace period passed.
pub(super) fn unregistered(ops: u64) {
    if ops == &GRAPH as *const Ops as u64 {
        REGISTERED.fetch_sub(1, Ordering::Relaxed);
        retire_if_idle();
    }
}

/// With no graph registration left and no graph return outstanding in any context, the walkers
/// go back to comparing one trampoline. After the grace period no CPU can push an instance, and
/// lengths only fall: a context read as empty stays empty, and a frame holding the trampoline
/// belongs to an instance still counted.
fn retire_if_idle() {
    if REGISTERED.load(Ordering::Relaxed) != 0 {
        return;
    }
    // SAFETY: reads each context's length, a word its owner only lowers from here on (see above).
    let idle = (0..CONTEXT_COUNT).all(|context| unsafe { (*RETURNS.get(context)).is_empty() });
    if idle {
        WALK_TRAMPOLINE.store(0, Ordering::Release);
        crate::stacktrace::walk_graph_returns(false);
    }
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
    let (ring, counts) = (RINGS.get(cpu)?, COUNTS.get(cpu)?);
    let written = counts.written.load(Ordering::Acquire);
    let kept = written.min(RING as u64);
    (index < kept).then(|| {
        let slot = &ring.0[((written - kept + index) % RING as u64) as usize];
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
    for (cpu, counts) in COUNTS.iter().enumerate() {
        let written = counts.written.load(Ordering::Acquire);
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
