//! Kernel return probes: a handler at a function's return, installed at its entry.
//!
//! # Where it attaches
//!
//! A kretprobe is a kernel probe (any [`Method`]) on the function's first instruction that is
//! not a patchable-function-entry NOP: `symbol + 8` where the function has a
//! `__patchable_function_entries` record (the `full` and `prod` builds: `nop; nop; <symbol>:
//! nop; nop; paciasp; str x30, [x18], #8; stp x29, x30, ...`), else `symbol` (the `plain` build,
//! asm functions). The NOPs belong to ftrace. At that instruction x30 is the caller's return
//! address, not yet signed by `paciasp` nor pushed to the shadow call stack, so a trampoline
//! address put there is what the prologue signs and pushes, and what `autiasp` and the SCS pop
//! give back at the return: PAC authentication and the SCS stay balanced. `paciasp` is stepped,
//! not simulated (`crates/probes`), so `Method::Simulate` refuses Rust functions of the
//! pac-ret builds (`ProbeError::NotSimulated`); single-step, brk-step and detour perform it.
//!
//! # The hot path
//!
//! Entry (the probe's pre-handler, IRQs masked): find the kretprobe by PC, run the optional
//! entry handler, push a [`HijackedReturn`] `{entry SP, x18, real x30}` on the context's
//! [`ReturnStack`] (the task's, or this CPU's IRQ context's) and set x30 to
//! `kretprobe_trampoline`. A full stack, `max_active` instances already live, or a hit from a
//! return handler counts a missed hit (Linux's `nmissed`) and leaves the return alone.
//!
//! Return: the function's `ret` lands in `kretprobe_trampoline` (asm, `.text.noprobe`) with SP
//! and x18 as at entry. It pushes x30 (the trampoline) on the SCS again and a frame record
//! `{x29, trampoline}`, so both walkers meet the hijacked address where the function's own
//! record and slot were, saves x0..x30 as [`Registers`] and calls [`kretprobe_return`]. That
//! drops abandoned instances (below SP), takes the top one (whose entry SP is SP), runs the
//! return handler (x0..x7: the return value, changeable; x30 and pc: the real return address),
//! writes the real address into the trampoline's record and SCS slot, pops, and returns; the
//! trampoline restores x0..x8, takes x30 = the real address and returns there. Callee-saved
//! registers are preserved by the call itself, x18 and SP by the trampoline's balanced pushes.
//!
//! # Unwinding
//!
//! [`Repair`] answers the walkers (`crates/unwind`, `ReturnRepair`): a frame record holding the
//! trampoline belongs to the newest instance whose entry SP is above the record, an SCS slot to
//! the instance that recorded it; so traces taken in a probed function or in a return handler
//! show the real callers.

use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};

use super::cells::PerContext;
use super::{Method, ProbeError, Registers, refuse};
use crate::sync::IrqMask;
use crate::task::TASKS;
use crate::task::stacks::{self, CPUS};
use unwind::{HijackedReturn, ReturnRepair, ReturnStack};

/// Runs at the probed function's entry: may look at (and change) the registers, and store one
/// word for the return handler. Returning false leaves this return alone (not a miss).
pub type EntryHandler = fn(&mut Registers, &mut u64) -> bool;
/// Runs at the return: x0..x7 hold the return value (changes take effect), x30 and pc the real
/// return address; the word is what the entry handler stored (0 without one).
pub type ReturnHandler = fn(&mut Registers, u64);

/// Kretprobe records: twice the probe sweep's group ([`register_all`]), so that a record a
/// looping CPU still has a hijacked return of never keeps a group from registering.
pub const MAX_KRETPROBES: usize = 32;
/// Hijacked returns per context (task or IRQ) at a time.
pub const INSTANCES_PER_CONTEXT: usize = 64;

struct Kretprobe {
    /// The function's symbol; 0: the record is free.
    function: AtomicU64,
    /// The probed (attach) address.
    address: AtomicU64,
    /// Set while registered: a return after unregistering still returns, without the handler.
    live: AtomicBool,
    /// The handlers as addresses (`Option<EntryHandler>`, null for none; `ReturnHandler`): written
    /// only under REGISTER while the record is not live and no instance of it is outstanding
    /// (checked), read by the hit path only while `live` (Acquire) or for an outstanding
    /// instance, both after the Release store that published them.
    entry: AtomicPtr<()>,
    handler: AtomicPtr<()>,
    max_active: AtomicU32,
    active: AtomicU32,
    hits: AtomicU64,
    missed: AtomicU64,
}

fn no_handler(_: &mut Registers, _: u64) {}

static RECORDS: [Kretprobe; MAX_KRETPROBES] = [const {
    Kretprobe {
        function: AtomicU64::new(0),
        address: AtomicU64::new(0),
        live: AtomicBool::new(false),
        entry: AtomicPtr::new(core::ptr::null_mut()),
        handler: AtomicPtr::new(no_handler as ReturnHandler as *mut ()),
        max_active: AtomicU32::new(0),
        active: AtomicU32::new(0),
        hits: AtomicU64::new(0),
        missed: AtomicU64::new(0),
    }
}; MAX_KRETPROBES];

/// Serialises kretprobe registration. A raw spin lock, not an `IrqSpinLock`: its holder
/// registers or unregisters the entry kprobe, which holds the other CPUs
/// (`task::cpus::with_others_held`, a wake SGI each must take) and may wait for a grace period,
/// so a CPU waiting for it must wait with IRQs unmasked, or neither would ever go on.
static REGISTER: spin::Mutex<()> = spin::Mutex::new(());

/// The return-instance stacks, one per context (`CONTEXT_COUNT`). A context's stack
/// is changed only by code running in that context with IRQs masked (entry, return, task start),
/// and read by walkers running in that context or in an IRQ that interrupted it; pushes write
/// the entry before the length (`cells::PerContext`).
static CONTEXTS: PerContext<ReturnStack<INSTANCES_PER_CONTEXT>, CONTEXT_COUNT> =
    PerContext::new([const { UnsafeCell::new(ReturnStack::new()) }; CONTEXT_COUNT]);

/// Contexts: the task table's entries (task slots, then the secondaries' idle tasks, as
/// `task::idle_task`), then one IRQ context per CPU. One IRQ context for all CPUs let two CPUs'
/// IRQ handlers push and pop the same stack (the probe sweep on 4 CPUs, a kretprobe on
/// `task::cpus::on_wake_sgi`: "trampoline reached ... with no hijacked return there").
const IRQ_CONTEXTS: usize = TASKS;
const CONTEXT_COUNT: usize = IRQ_CONTEXTS + CPUS;

/// Per context (as `CONTEXTS`), set while a return handler runs in it (IRQs masked): kretprobe
/// hits in that context are then missed. One flag for all made every CPU miss its hits while
/// any CPU ran a return handler (the probe sweep on 4 CPUs: returns counted on CPU 0 differed
/// by method). Per context rather than per CPU: the hit and return paths know their context
/// already, so the hot paths stay as long as with the one flag.
static IN_RETURN_HANDLER: [AtomicBool; CONTEXT_COUNT] = [const { AtomicBool::new(false) }; CONTEXT_COUNT];

core::arch::global_asm!(
    r#"
    .section .text.noprobe, "ax"
    .balign 16
    .global kretprobe_trampoline
kretprobe_trampoline:
    // Reached by a probed function's `ret`: x30 = this address, SP and x18 as at its entry.
    // The CFI (xtask converts it into the SFrame table) says where the return address is: in
    // x30, then in the frame record; either way this address, which a walker repairs by the
    // CFA, the hijacked function's SP at entry.
    .cfi_startproc
    .if {scs}
    str     x30, [x18], #8
    .endif
    stp     x29, x30, [sp, #-16]!
    .cfi_def_cfa_offset 16
    .cfi_offset x30, -8
    .cfi_offset x29, -16
    sub     sp, sp, #{save}
    .cfi_def_cfa_offset ({save} + 16)
    stp     x0, x1, [sp, #0]
    stp     x2, x3, [sp, #16]
    stp     x4, x5, [sp, #32]
    stp     x6, x7, [sp, #48]
    stp     x8, x9, [sp, #64]
    stp     x10, x11, [sp, #80]
    stp     x12, x13, [sp, #96]
    stp     x14, x15, [sp, #112]
    stp     x16, x17, [sp, #128]
    stp     x18, x19, [sp, #144]
    stp     x20, x21, [sp, #160]
    stp     x22, x23, [sp, #176]
    stp     x24, x25, [sp, #192]
    stp     x26, x27, [sp, #208]
    stp     x28, x29, [sp, #224]
    add     x29, sp, #{save}
    add     x9, sp, #({save} + 16)
    stp     x30, x9, [sp, #240]
    mrs     x10, nzcv
    stp     x30, x10, [sp, #256]
    mov     x0, sp
    bl      kretprobe_return
    ldp     x0, x1, [sp, #0]
    ldp     x2, x3, [sp, #16]
    ldp     x4, x5, [sp, #32]
    ldp     x6, x7, [sp, #48]
    ldr     x8, [sp, #64]
    ldr     x30, [sp, #240]                 // the real return address, from kretprobe_return
    add     sp, sp, #{save}
    .cfi_def_cfa_offset 16
    ldr     x29, [sp], #16
    .cfi_def_cfa_offset 0
    .cfi_restore x29
    .cfi_restore x30
    .if {scs}
    sub     x18, x18, #8
    .endif
    ret
    .cfi_endproc
"#,
    scs = const crate::build_info::SHADOW_CALL_STACK as u8,
    save = const core::mem::size_of::<Registers>(),
);

unsafe extern "C" {
    static kretprobe_trampoline: u32;
}

/// The address a hijacked function returns to.
pub fn trampoline() -> u64 {
    // SAFETY: only the address of the asm-defined symbol is taken.
    unsafe { &kretprobe_trampoline as *const u32 as u64 }
}

/// Where a kretprobe on `function` attaches: after its patchable-entry NOPs, if it has them.
pub fn attach_address(function: u64) -> u64 {
    if refuse::patchable_entries().contains(&function.wrapping_sub(8)) { function + 8 } else { function }
}

/// Registers a kretprobe on the function at `function` (its symbol), entered through a probe of
/// `method`, with at most `max_active` returns hijacked at a time (more are missed; 0 misses
/// them all).
pub fn register(
    function: u64,
    method: Method,
    entry: Option<EntryHandler>,
    handler: ReturnHandler,
    max_active: u32,
) -> Result<(), ProbeError> {
    let mut result = [Ok(())];
    register_all(&[function], method, entry, handler, max_active, &mut result);
    result[0]
}

/// Registers a kretprobe on each function of `functions` (at most [`MAX_KRETPROBES`]), all with
/// the same method and handlers, outcomes in `results`: every entry probe is armed in one hold
/// of the other CPUs (`kprobe::register_all`), not one each.
pub fn register_all(
    functions: &[u64],
    method: Method,
    entry: Option<EntryHandler>,
    handler: ReturnHandler,
    max_active: u32,
    results: &mut [Result<(), ProbeError>],
) {
    let _guard = REGISTER.lock();
    let mut taken = [usize::MAX; MAX_KRETPROBES];
    let mut probes = [(0u64, method); MAX_KRETPROBES];
    let mut count = 0;
    for (member, (&function, result)) in functions.iter().zip(results.iter_mut()).enumerate() {
        let known = |record: &Kretprobe| record.function.load(Ordering::Relaxed) == function;
        let free = |record: &Kretprobe| {
            record.function.load(Ordering::Relaxed) == 0 && record.active.load(Ordering::Relaxed) == 0
        };
        if RECORDS.iter().any(known) || functions[..member].contains(&function) {
            *result = Err(ProbeError::AlreadyRegistered);
            continue;
        }
        let Some(index) = RECORDS.iter().position(free).filter(|_| member < MAX_KRETPROBES) else {
            *result = Err(ProbeError::NoSpace);
            continue;
        };
        let record = &RECORDS[index];
        let address = attach_address(function);
        record.entry.store(entry.map_or(core::ptr::null_mut(), |entry| entry as *mut ()), Ordering::Relaxed);
        record.handler.store(handler as *mut (), Ordering::Relaxed);
        record.max_active.store(max_active, Ordering::Relaxed);
        record.hits.store(0, Ordering::Relaxed);
        record.missed.store(0, Ordering::Relaxed);
        record.address.store(address, Ordering::Relaxed);
        record.function.store(function, Ordering::Relaxed);
        record.live.store(true, Ordering::Release);
        taken[member] = index;
        probes[count] = (address, method);
        count += 1;
    }
    let mut armed = [Ok(()); MAX_KRETPROBES];
    super::kprobe::register_all(&probes[..count], on_entry, None, &mut armed);
    let mut armed = armed.into_iter();
    for (&index, result) in taken.iter().zip(results.iter_mut()).filter(|&(&index, _)| index != usize::MAX) {
        *result = armed.next().unwrap_or(Ok(()));
        if result.is_err() {
            RECORDS[index].live.store(false, Ordering::Relaxed);
            RECORDS[index].function.store(0, Ordering::Relaxed);
        }
    }
}

/// Unregisters the kretprobe on `function`. Returns already hijacked still go back to their
/// callers, without the handler.
pub fn unregister(function: u64) -> Result<(), ProbeError> {
    unregister_all(&[function])
}

/// Unregisters the kretprobes on `functions` with one hold and one grace period for all their
/// entry probes (`kprobe::unregister_all`); a function with none is skipped and the first such
/// error returned.
pub fn unregister_all(functions: &[u64]) -> Result<(), ProbeError> {
    let _guard = REGISTER.lock();
    let mut addresses = [0u64; MAX_KRETPROBES];
    let mut count = 0;
    let mut first_error = Ok(());
    for &function in functions {
        match find(function) {
            Some(record) if count < MAX_KRETPROBES => {
                addresses[count] = record.address.load(Ordering::Relaxed);
                count += 1;
            }
            _ => first_error = first_error.and(Err(ProbeError::NotRegistered)),
        }
    }
    let unregistered = super::kprobe::unregister_all(&addresses[..count]);
    for &function in functions {
        if let Some(record) = find(function) {
            record.live.store(false, Ordering::Release);
            record.function.store(0, Ordering::Relaxed);
        }
    }
    first_error.and(unregistered)
}

/// Enters the kretprobes on `functions` through probes of `method` instead of their current
/// ones: the old entry probes are disarmed and the new ones armed in one hold of the other CPUs
/// (`kprobe::replace_all`), the handlers, counts and hijacked returns kept; outcomes in
/// `results`. A kretprobe whose new method is refused is unregistered with the refusal as its
/// outcome. Returns the first error of disarming the old probes.
pub fn change_method_all(
    functions: &[u64],
    method: Method,
    results: &mut [Result<(), ProbeError>],
) -> Result<(), ProbeError> {
    let _guard = REGISTER.lock();
    let mut records: [Option<&Kretprobe>; MAX_KRETPROBES] = [None; MAX_KRETPROBES];
    let mut addresses = [0u64; MAX_KRETPROBES];
    let mut probes = [(0u64, method); MAX_KRETPROBES];
    let mut count = 0;
    for (member, (&function, result)) in functions.iter().zip(results.iter_mut()).enumerate() {
        match find(function) {
            Some(record) if member < MAX_KRETPROBES => {
                records[member] = Some(record);
                addresses[count] = record.address.load(Ordering::Relaxed);
                probes[count] = (addresses[count], method);
                count += 1;
            }
            _ => *result = Err(ProbeError::NotRegistered),
        }
    }
    let mut armed = [Ok(()); MAX_KRETPROBES];
    let disarmed = super::kprobe::replace_all(&addresses[..count], &probes[..count], on_entry, None, &mut armed);
    let mut armed = armed.into_iter();
    for (record, result) in records.iter().zip(results.iter_mut()) {
        let Some(record) = record else { continue };
        *result = armed.next().unwrap_or(Ok(()));
        if result.is_err() {
            record.live.store(false, Ordering::Release);
            record.function.store(0, Ordering::Relaxed);
        }
    }
    disarmed
}

fn find(function: u64) -> Option<&'static Kretprobe> {
    RECORDS.iter().find(|record| function != 0 && record.function.load(Ordering::Relaxed) == function)
}

/// Hits (returns hijacked) and missed hits of the kretprobe on `function`.
pub fn counts(function: u64) -> Option<(u64, u64)> {
    find(function).map(|record| (record.hits.load(Ordering::Relaxed), record.missed.load(Ordering::Relaxed)))
}

/// Hijacked returns outstanding in the current context (for the tests).
pub fn outstanding() -> usize {
    let sp: u64;
    // SAFETY: reads SP.
    unsafe { core::arch::asm!("mov {}, sp", out(reg) sp, options(nomem, nostack, preserves_flags)) };
    // SAFETY: read in the context that owns the stack (see CONTEXTS).
    unsafe { (*context_stack(sp)).len() }
}

/// Hijacked returns outstanding in the task of slot `index` (`index < TASKS`), read by code
/// running on that task's stack: the stack walker's gate, which knows the slot from SP and so
/// skips the IRQ-stack test and the scheduler read [`outstanding`] makes.
#[inline(always)]
pub fn outstanding_in_task_slot(index: usize) -> usize {
    let contexts: *const PerContext<ReturnStack<INSTANCES_PER_CONTEXT>, CONTEXT_COUNT>;
    // SAFETY: CONTEXTS' address, PC-relative (`adrp`, `add`: two instructions where the large
    // code model builds a constant in four; the walkers' fixed cost); no memory, no flags.
    unsafe {
        core::arch::asm!(
            "adrp {address}, {symbol}",
            "add {address}, {address}, :lo12:{symbol}",
            address = out(reg) contexts,
            symbol = sym CONTEXTS,
            options(pure, nomem, nostack, preserves_flags)
        )
    };
    // SAFETY: `contexts` is CONTEXTS; read in the context that owns the stack (the caller runs
    // on it: see CONTEXTS).
    unsafe { (*(*contexts).get(index)).len() }
}

/// Drops the current context's hijacked returns whose frames are gone (entry SP below `sp`, an
/// SP of the caller's frame): calls that never returned, ended by a fault at a landing further
/// up the stack. The next hit in the context would drop them; the race tests drop them at once,
/// so the records' active counts are back before the next registration.
pub fn drop_abandoned_returns(sp: u64) {
    let _mask = IrqMask::new();
    // SAFETY: IRQs are masked and this is the context that owns the stack (see CONTEXTS).
    unsafe { (*context_stack(sp)).drop_abandoned(sp, release) };
}

/// A new task starts in task slot `index`: its context has no hijacked returns.
pub fn forget_task(index: usize) {
    let _mask = IrqMask::new();
    // SAFETY: the slot belongs to no running context (spawn is choosing it), IRQs are masked.
    let stack = unsafe { &mut *CONTEXTS.get(index) };
    while let Some(instance) = stack.pop() {
        release(&instance);
    }
}

/// The return-instance stack of the context running on `sp`.
#[unsafe(link_section = ".text.noprobe")]
#[inline(always)]
fn context_stack(sp: u64) -> *mut ReturnStack<INSTANCES_PER_CONTEXT> {
    CONTEXTS.get(context_index(sp))
}

/// The context (the task's table index, or this CPU's IRQ context) whose stack holds `sp`.
#[unsafe(link_section = ".text.noprobe")]
#[inline(always)]
fn context_index(sp: u64) -> usize {
    if stacks::this_irq_slot().contains_stack(sp) { this_irq_context() } else { crate::task::current().0 }
}

#[unsafe(link_section = ".text.noprobe")]
#[inline(always)]
fn this_irq_context() -> usize {
    IRQ_CONTEXTS + crate::arch::percpu::this_cpu_index()
}

#[unsafe(link_section = ".text.noprobe")]
fn release(instance: &HijackedReturn) {
    if let Some(record) = RECORDS.get(instance.cookie as usize) {
        record.active.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The pre-handler of every kretprobe's entry probe.
#[unsafe(link_section = ".text.noprobe")]
fn on_entry(registers: &mut Registers) {
    let _mask = IrqMask::new();
    hijack(registers);
}

#[unsafe(link_section = ".text.noprobe")]
fn hijack(registers: &mut Registers) {
    let Some(index) = RECORDS.iter().position(|record| {
        record.live.load(Ordering::Acquire) && record.address.load(Ordering::Relaxed) == registers.pc
    }) else {
        return;
    };
    let record = &RECORDS[index];
    let context = context_index(registers.sp);
    // SAFETY: IRQs are masked and this is the context that owns the stack (see CONTEXTS).
    let stack = unsafe { &mut *CONTEXTS.get(context) };
    stack.drop_abandoned(registers.sp, release);
    if IN_RETURN_HANDLER[context].load(Ordering::Relaxed)
        || stack.len() >= INSTANCES_PER_CONTEXT
        || record.active.load(Ordering::Relaxed) >= record.max_active.load(Ordering::Relaxed)
    {
        record.missed.fetch_add(1, Ordering::Relaxed);
        return;
    }
    // SAFETY: the record is live (Acquire above), so `entry` holds what `register` stored: null
    // or an `EntryHandler` (an `Option<fn>` is a nullable code address).
    let entry = unsafe { core::mem::transmute::<*mut (), Option<EntryHandler>>(record.entry.load(Ordering::Relaxed)) };
    let mut data = 0;
    if let Some(entry) = entry
        && !entry(registers, &mut data)
    {
        return;
    }
    let instance = HijackedReturn {
        entry_sp: registers.sp,
        shadow_slot: registers.x[18],
        real: registers.x[30],
        cookie: index as u64,
        data,
    };
    if stack.push(instance).is_err() {
        record.missed.fetch_add(1, Ordering::Relaxed);
        return;
    }
    record.active.fetch_add(1, Ordering::Relaxed);
    record.hits.fetch_add(1, Ordering::Relaxed);
    registers.x[30] = trampoline();
}

/// Called by `kretprobe_trampoline` with the registers at the hijacked return (sp: the SP the
/// function returned with; x30 and pc: the trampoline until set here to the real address).
#[unsafe(no_mangle)]
#[unsafe(link_section = ".text.noprobe")]
extern "C" fn kretprobe_return(registers: &mut Registers) {
    let _mask = IrqMask::new();
    let context = context_index(registers.sp);
    // SAFETY: IRQs are masked and this is the context that owns the stack (see CONTEXTS).
    let stack = unsafe { &mut *CONTEXTS.get(context) };
    stack.drop_abandoned(registers.sp, release);
    let Some(instance) = stack.top_at(registers.sp) else {
        panic!("kretprobe trampoline reached at SP {:#x} with no hijacked return there", registers.sp);
    };
    registers.x[30] = instance.real;
    registers.pc = instance.real;
    if let Some(record) = RECORDS.get(instance.cookie as usize)
        && record.live.load(Ordering::Acquire)
    {
        // SAFETY: the record has an outstanding instance, so `handler` stays the `ReturnHandler`
        // `register` stored (a code address).
        let handler = unsafe { core::mem::transmute::<*mut (), ReturnHandler>(record.handler.load(Ordering::Relaxed)) };
        IN_RETURN_HANDLER[context].store(true, Ordering::Relaxed);
        handler(registers, instance.data);
        IN_RETURN_HANDLER[context].store(false, Ordering::Relaxed);
    }
    // The trampoline's record and SCS slot get the real address before the instance goes, so a
    // walk never meets a trampoline address without its instance.
    // SAFETY: the trampoline pushed its frame record {x29, x30} just below the entry SP, on the
    // stack this code runs on.
    unsafe { core::ptr::write_volatile((registers.sp - 8) as *mut u64, instance.real) };
    if crate::build_info::SHADOW_CALL_STACK {
        // SAFETY: the trampoline pushed x30 at x18 = the slot recorded at entry (SCS builds).
        unsafe { core::ptr::write_volatile(instance.shadow_slot as *mut u64, instance.real) };
    }
    stack.pop();
    release(&instance);
}

/// What the walkers ask about hijacked returns (`stacktrace.rs`).
pub struct Repair;

impl ReturnRepair for Repair {
    fn trampoline(&self) -> u64 {
        trampoline()
    }

    fn frame_return(&self, record: u64) -> Option<u64> {
        // SAFETY: read from the context that owns the stack or an IRQ above it (see CONTEXTS).
        unsafe { (*context_stack(record)).frame_return(record, trampoline()) }
    }

    fn shadow_return(&self, slot: u64) -> Option<u64> {
        let irq = CONTEXTS.get(this_irq_context());
        let task = CONTEXTS.get(crate::task::current().0);
        // SAFETY: as above.
        unsafe { (*task).shadow_return(slot, trampoline()).or_else(|| (*irq).shadow_return(slot, trampoline())) }
    }
}
