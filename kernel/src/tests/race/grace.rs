//! Patch races, direction (b): one executing CPU is stepped instruction by instruction (hardware
//! software step, MDSCR_EL1.SS/KDE) through a kprobe's site, its detour trampoline and the
//! handler entry; at every point it is held while the test's CPU runs the whole unregistration
//! (restore the word, unpublish, grace period, poison and free the slot or trampoline). A correct
//! grace period returns only after the held CPU resumed; every execution is the probe's old behaviour
//! (a hit) or the new one (no hit), never a fault in poisoned memory. See docs/design/races.md.

use super::{
    Behaviour, Execution, Finding, HIT, HIT_SOURCE, KPROBE_HITS, NOT_HIT, PROBE_HITS, SITE, chunk_words_in_use,
    execute_with, last_execution, needs_cpus, probe_result, race_probe_target, race_traced, traced_result,
    unlock_debug_everywhere,
};
use crate::arch::counters::virtual_count;
use crate::arch::exception::{Esr, ExceptionClass, ExceptionFrame};
use crate::arch::{cpu, percpu, step};
use crate::ftrace::{self, Ops, Regs};
use crate::inject::{self, Fault};
use crate::probes::{self as kprobes, Method, Registers, kretprobe};
use crate::task::cross_call;
use crate::tests::{Context, Outcome, Verdict, check, check_eq};
use core::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

// `race_step_call(argument, function, landing)`: as `race_call` without the stack painting.
// It unmasks debug exceptions (PSTATE.D) just before the `blr`: with MDSCR_EL1.SS set and
// PSTATE.SS clear the step is active-pending, so the first step exception is taken there (ELR =
// `race_step_blr`); each step exception returns with SPSR.SS set, so exactly one instruction
// runs before the next. A faulting call resumes at `1:` (the race trap hook).
core::arch::global_asm!(
    r#"
    .section .text.noprobe, "ax"
    .balign 4
    .global race_step_call
race_step_call:
    stp     x29, x30, [sp, #-112]!
    mov     x29, sp
    stp     x19, x20, [sp, #16]
    stp     x21, x22, [sp, #32]
    stp     x23, x24, [sp, #48]
    stp     x25, x26, [sp, #64]
    stp     x27, x28, [sp, #80]
    stp     x18, x2, [sp, #96]
    mov     x3, sp
    adr     x4, 1f
    stp     x3, x4, [x2]
    str     xzr, [x2, #16]
    msr     daifclr, #8
    .global race_step_blr
race_step_blr:
    blr     x1
1:  msr     daifset, #8
    ldp     x18, x2, [sp, #96]
    ldp     x19, x20, [sp, #16]
    ldp     x21, x22, [sp, #32]
    ldp     x23, x24, [sp, #48]
    ldp     x25, x26, [sp, #64]
    ldp     x27, x28, [sp, #80]
    ldp     x29, x30, [sp], #112
    ret

    // A kprobe BRK no probe owns (never executed: `race_brk_after_unpublish_resumes` hands its
    // address to the hit path in a made-up frame).
    .balign 4
    .global race_stray_brk
race_stray_brk:
    brk     #0x004
"#
);

unsafe extern "C" {
    fn race_step_call(argument: u64, function: u64, landing: *mut u64) -> u64;
    static race_step_blr: u32;
    static race_stray_brk: u32;
}

/// How long the executing CPU is held at its point after the unpublish, in milliseconds of
/// counter time (the grace period's own limit is 100 ms).
const HOLD_MS: u64 = 1;
/// What a (b) sweep unregisters: a kprobe (by method) on `race_probe_target`, or an ftrace
/// tracer on `race_traced`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Target {
    Kprobe(Method),
    /// A kretprobe on `race_probe_target`, entered by a kprobe of this method: its entry handler
    /// and its return handler each count a hit.
    Kretprobe(Method),
    Ftrace,
}

/// The target of the sweep running now (0: kprobe, 1: ftrace), for the hold's "patched" test.
static FTRACE_TARGET: AtomicBool = AtomicBool::new(false);
/// The tracer registered by the ftrace sweep.
static TRACER_ID: AtomicU64 = AtomicU64::new(0);
/// `NOP`, what an ftrace site's `BL` becomes when disabled.
const NOP: u32 = 0xd503_201f;

impl Target {
    fn site(self) -> u64 {
        match self {
            Self::Kprobe(_) | Self::Kretprobe(_) => race_probe_target as *const () as u64,
            Self::Ftrace => race_traced as *const () as u64,
        }
    }

    /// The stepped part of the site: `race_probe_target`'s three instructions, or the traced
    /// function's `mov x9, x30; bl ftrace_trampoline` (the trampoline's entry is the last point).
    fn site_bytes(self) -> u64 {
        match self {
            Self::Kprobe(_) | Self::Kretprobe(_) => 12,
            Self::Ftrace => 8,
        }
    }

    fn result(self) -> fn(u64) -> u64 {
        match self {
            Self::Kprobe(_) | Self::Kretprobe(_) => probe_result,
            Self::Ftrace => traced_result,
        }
    }

    fn register(self) -> bool {
        match self {
            Self::Kprobe(method) => kprobes::register(self.site(), method, hold_in_handler, None).is_ok(),
            Self::Kretprobe(method) => {
                kretprobe::register(self.site(), method, Some(hold_at_entry), count_return, 4).is_ok()
            }
            Self::Ftrace => {
                let function = self.site();
                match ftrace::register_where(&HOLD_OPS, |entry| entry + 8 == function) {
                    Ok(tracer) => {
                        TRACER_ID.store(u64::from(tracer.0), Ordering::Relaxed);
                        true
                    }
                    Err(_) => false,
                }
            }
        }
    }

    fn unregister(self) -> bool {
        match self {
            Self::Kprobe(_) => kprobes::unregister(self.site()).is_ok(),
            Self::Kretprobe(_) => kretprobe::unregister(self.site()).is_ok(),
            Self::Ftrace => {
                let tracer = ::ftrace::TracerId(TRACER_ID.load(Ordering::Relaxed) as u16);
                ftrace::unregister(tracer).is_ok()
            }
        }
    }

    /// The first point that must be "before" (a hit): after the probed word for kprobes (the hit
    /// has begun); for ftrace only the tracer itself (up to the trampoline's entry, the site
    /// still reads the literal the unregistration replaced with the nop ops).
    fn switch_at(self, points: usize) -> usize {
        match self {
            // A detour's B is restored only once every other CPU is held (kprobe::unregister),
            // so a CPU released at the word after the unpublish still runs the trampoline.
            Self::Kprobe(Method::Detour) | Self::Kretprobe(Method::Detour) => 0,
            Self::Kprobe(_) | Self::Kretprobe(_) => 2,
            Self::Ftrace => points,
        }
    }

    /// What a call does while the probe is registered: one hit, or for a kretprobe two (the
    /// entry and the return: the held CPU's whole call runs before the grace period ends, so
    /// its return still finds the kretprobe live).
    fn before(self) -> Behaviour {
        match self {
            Self::Kretprobe(_) => Behaviour { hits: 2, trampoline: None },
            _ => HIT,
        }
    }
}

/// The kretprobe's entry handler: counts and holds like the kprobe pre-handler; hijacks.
fn hold_at_entry(_: &mut Registers, _: &mut u64) -> bool {
    hold_hit();
    true
}

/// The kretprobe's return handler.
fn count_return(_: &mut Registers, _: u64) {
    PROBE_HITS.fetch_add(1, Ordering::Relaxed);
}

/// Whether the unregistration has changed the text (a lock-free read, as on the hit path).
fn patched() -> bool {
    if FTRACE_TARGET.load(Ordering::Relaxed) {
        let call = race_traced as *const () as u64 + 4;
        // SAFETY: the traced function's second word: mapped kernel text.
        unsafe { core::ptr::read_volatile(call as *const u32) == NOP }
    } else {
        kprobes::counts(race_probe_target as *const () as u64).is_none()
    }
}

/// The ftrace sweep's tracer: counts the hit and holds like the kprobe pre-handler.
unsafe extern "C" fn hold_tracer(_: u64, _: u64, _: &Ops, _: &mut Regs) {
    hold_hit();
}

static HOLD_OPS: Ops = Ops { func: hold_tracer, private: 0 };

/// The site being stepped (`Target::site`) and its stepped length.
static STEP_SITE: AtomicU64 = AtomicU64::new(0);
static STEP_SITE_BYTES: AtomicU64 = AtomicU64::new(0);
/// The slot area's bytes.
const SLOT_AREA_BYTES: u64 = kprobes::SLOT_AREA_SIZE;
const NO_POINT: usize = usize::MAX;
/// Without `-icount` (QEMU's raspi4b, a board) a host that stops running a vCPU for 100 ms makes
/// the held executor look stuck to the grace period, which then panics (measured on raspi4b with
/// the 2-core host loaded: `grace period: cpu 1 passed no quiescent point within 100 ms`).
const NEEDS_ICOUNT: &str = "needs -icount (holds a CPU against 100 ms wall-clock limits)";

/// The stepper's state: which CPU is stepped (index + 1, 0 = none), the points it passed in
/// this execution, where it is held, and what it saw.
static STEPPED_CPU: AtomicUsize = AtomicUsize::new(0);
/// The executing CPU: the next online CPU after the one running the test (which may migrate
/// between points, so each point runs with its IRQs masked and picks again).
static EXECUTOR: AtomicUsize = AtomicUsize::new(1);
static POINTS: AtomicUsize = AtomicUsize::new(0);
static POINTS_IN_SLOTS: AtomicUsize = AtomicUsize::new(0);
/// Points in a detour trampoline's return half (after its call of the handler returned).
static POINTS_RETURNING: AtomicUsize = AtomicUsize::new(0);
/// The PC of the previous point (a call out of the trampoline is seen at the next one).
static LAST_PC: AtomicU64 = AtomicU64::new(0);
/// Set while a hardware breakpoint waits for the return into a trampoline.
static RETURN_ARMED: AtomicBool = AtomicBool::new(false);
/// Set from that breakpoint on, in this execution.
static RETURNED: AtomicBool = AtomicBool::new(false);
static HOLD_AT: AtomicUsize = AtomicUsize::new(NO_POINT);
static HOLD_IN_HANDLER: AtomicBool = AtomicBool::new(false);
static HELD: AtomicBool = AtomicBool::new(false);
static HELD_PC: AtomicU64 = AtomicU64::new(0);
static RESUMED_AT: AtomicU64 = AtomicU64::new(0);
static UNPUBLISHED_SEEN: AtomicBool = AtomicBool::new(false);

fn blr_address() -> u64 {
    // SAFETY: only the address of the asm label is taken.
    unsafe { &race_step_blr as *const u32 as u64 }
}

fn in_slot_area(pc: u64) -> bool {
    let area = kprobes::slot_area_address();
    (area..area + SLOT_AREA_BYTES).contains(&pc)
}

/// Where stepping goes on: the `blr`, the probed function, the slot area (trampolines, slots).
/// The first point outside (the handler's entry, or the return to `race_step_call`) is the last:
/// handlers and what they call are not stepped (they may use LDXR/STXR loops, which a step's
/// exception return would keep failing).
fn stepped_region(pc: u64) -> bool {
    let site = STEP_SITE.load(Ordering::Relaxed);
    let bytes = STEP_SITE_BYTES.load(Ordering::Relaxed);
    pc == blr_address() || (site..site + bytes).contains(&pc) || in_slot_area(pc)
}

/// Holds this CPU (IRQs and debug exceptions masked: it passes no quiescent point) after
/// telling the test's CPU where: until the probe is unpublished (the unregistration has restored
/// the word), then `HOLD_MS` more; records when it resumed, and whether it saw the unpublish.
fn hold(pc: u64) {
    HELD_PC.store(pc, Ordering::Relaxed);
    HELD.store(true, Ordering::Release);
    cpu::send_event();
    let unpublished = cpu::wait_until(100, patched);
    UNPUBLISHED_SEEN.store(unpublished, Ordering::Relaxed);
    cpu::wait_until(HOLD_MS, || false);
    RESUMED_AT.store(virtual_count(), Ordering::Release);
}

fn stop_stepping(frame: &mut ExceptionFrame) {
    frame.spsr &= !step::SPSR_SS;
    step::set_mdscr(step::MDSCR_KDE | step::MDSCR_SS, false);
    STEPPED_CPU.store(0, Ordering::Relaxed);
}

/// ESR_ELx.EC of a hardware breakpoint taken at the current EL (ARM ARM D24.2.40).
const EC_BREAKPOINT_CURRENT_EL: u64 = 0x31;
/// MDSCR_EL1.MDE: hardware breakpoints and watchpoints enabled.
const MDSCR_MDE: u64 = 1 << 15;
/// DBGBCR_EL1: enabled (E), EL1 only (PMC = 0b01), all four bytes of an A64 instruction (BAS).
const BREAKPOINT_EL1: u64 = 1 | 0b01 << 1 | 0b1111 << 5;

/// Arms breakpoint 0 at `address` (EL1 code), or disarms it (`None`).
fn set_breakpoint(address: Option<u64>) {
    let control = if address.is_some() { BREAKPOINT_EL1 } else { 0 };
    // SAFETY: writes breakpoint 0's value and control registers (debug state, no memory); the
    // `isb` makes them apply to the next instruction fetch.
    unsafe {
        core::arch::asm!(
            "msr dbgbvr0_el1, {value}",
            "msr dbgbcr0_el1, {control}",
            "isb",
            value = in(reg) address.unwrap_or(0),
            control = in(reg) control,
            options(nomem, nostack, preserves_flags)
        )
    };
    // KDE too: breakpoints at EL1 need it (stepping stopped with it clear).
    step::set_mdscr(MDSCR_MDE | step::MDSCR_KDE, address.is_some());
    RETURN_ARMED.store(address.is_some(), Ordering::Relaxed);
}

/// A software-step exception on the stepped CPU, or its breakpoint at the return into a detour
/// trampoline (called first by the race trap hook): one more point; held there if it is the
/// point under test; stepping goes on inside the stepped region. A call out of the trampoline
/// (the handler's entry, not stepped) arms a breakpoint at its return address, where stepping
/// starts again: the trampoline's return half (restore, relocated instruction, branch back) and
/// the rest of the probed function are stepped too.
#[unsafe(link_section = ".text.noprobe")]
pub fn on_step(frame: &mut ExceptionFrame) -> bool {
    let breakpoint = (frame.esr >> 26) & 0x3f == EC_BREAKPOINT_CURRENT_EL;
    if !(Esr(frame.esr).class() == ExceptionClass::SoftwareStep || breakpoint && RETURN_ARMED.load(Ordering::Relaxed))
        || STEPPED_CPU.load(Ordering::Relaxed) != percpu::this_cpu_index() + 1
    {
        return false;
    }
    if breakpoint {
        set_breakpoint(None);
        step::set_mdscr(step::MDSCR_KDE | step::MDSCR_SS, true);
        RETURNED.store(true, Ordering::Relaxed);
    }
    if RETURNED.load(Ordering::Relaxed) {
        POINTS_RETURNING.store(POINTS_RETURNING.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }
    let point = POINTS.load(Ordering::Relaxed);
    POINTS.store(point + 1, Ordering::Relaxed);
    if in_slot_area(frame.elr) {
        POINTS_IN_SLOTS.store(POINTS_IN_SLOTS.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }
    if point == HOLD_AT.load(Ordering::Relaxed) {
        hold(frame.elr);
    }
    let last = LAST_PC.swap(frame.elr, Ordering::Relaxed);
    if stepped_region(frame.elr) {
        frame.spsr |= step::SPSR_SS;
    } else {
        stop_stepping(frame);
        let returns_to = frame.x[30];
        if in_slot_area(last) && returns_to == last + 4 {
            // Re-entered by `STEPPED_CPU` at the breakpoint.
            STEPPED_CPU.store(percpu::this_cpu_index() + 1, Ordering::Relaxed);
            set_breakpoint(Some(returns_to));
        }
    }
    true
}

/// The probe's pre-handler: counts the hit; on the executing CPU, holds there when told (the
/// last point: a CPU inside the handler, about to return into the slot or trampoline).
fn hold_in_handler(_: &mut Registers) {
    hold_hit();
}

fn hold_hit() {
    PROBE_HITS.fetch_add(1, Ordering::Relaxed);
    if percpu::this_cpu_index() == EXECUTOR.load(Ordering::Relaxed) && HOLD_IN_HANDLER.load(Ordering::Relaxed) {
        hold(0);
    }
}

/// Runs on the executing CPU (through the cross-call mailbox): one stepped call, with every
/// exception masked but the debug ones `race_step_call` unmasks around its `blr` (the mailbox
/// may be served with IRQs unmasked: a step must not land in the IRQ vector, and the held CPU
/// must pass no quiescent point).
fn execute_stepped(argument: u64) -> u64 {
    let daif: u64;
    // SAFETY: reads DAIF and masks every exception; no memory is touched.
    unsafe { core::arch::asm!("mrs {}, daif", "msr daifset, #0xf", out(reg) daif, options(nostack)) };
    POINTS.store(0, Ordering::Relaxed);
    POINTS_IN_SLOTS.store(0, Ordering::Relaxed);
    POINTS_RETURNING.store(0, Ordering::Relaxed);
    RETURNED.store(false, Ordering::Relaxed);
    LAST_PC.store(0, Ordering::Relaxed);
    STEPPED_CPU.store(percpu::this_cpu_index() + 1, Ordering::Relaxed);
    step::set_mdscr(step::MDSCR_KDE | step::MDSCR_SS, true);
    execute_with(argument, race_step_call);
    // A call that left no stepped point (or faulted) still ends stepping here, and a
    // breakpoint that never hit (the call faulted in the handler) is disarmed.
    if RETURN_ARMED.load(Ordering::Relaxed) {
        set_breakpoint(None);
    }
    step::set_mdscr(step::MDSCR_KDE | step::MDSCR_SS, false);
    STEPPED_CPU.store(0, Ordering::Relaxed);
    // SAFETY: restores the DAIF read above.
    unsafe { core::arch::asm!("msr daif, {}", in(reg) daif, options(nostack)) };
    0
}

/// What one (b) sweep saw.
struct GraceSweep {
    name: &'static str,
    planned: usize,
    checked: usize,
    /// Executions that were neither the hit nor the restored instruction.
    wrong: usize,
    /// Points at which unregistration returned before the held CPU resumed.
    not_waited: usize,
    /// Points never reached, executions that did not finish, freed chunks not poisoned.
    lost: usize,
    last_after: Option<usize>,
    first_before: Option<usize>,
    after_after_before: bool,
    /// The first point the design says is "before".
    switch_at: usize,
}

impl GraceSweep {
    fn finding(&self) -> Finding {
        if self.checked != self.planned || self.lost != 0 {
            Finding::Coverage
        } else if self.wrong != 0 {
            Finding::WrongBehaviour
        } else if self.not_waited != 0 {
            Finding::NotWaited
        } else if self.after_after_before
            || self.last_after != self.switch_at.checked_sub(1)
            || self.first_before != Some(self.switch_at)
        {
            Finding::SwitchedElsewhere
        } else {
            Finding::Correct
        }
    }
}

/// The probe's behaviour after unregistration (the original instruction, no hit); before it is
/// `Target::before`.
const AFTER: Behaviour = NOT_HIT;

/// One point: the probe registered, the executor held at `point` (or in the handler), this CPU
/// unregisters; then the execution and the wait are checked. IRQs stay masked here, so the test
/// cannot migrate to the executor's CPU meanwhile.
fn check_point(sweep: &mut GraceSweep, target: Target, point: usize, in_handler: bool, in_use: usize) {
    let masked = cpu::mask_interrupts();
    choose_executor();
    check_point_here(sweep, target, point, in_handler, in_use);
    cpu::restore_interrupts(masked);
}

/// The executor for this point: the next online CPU after this one.
fn choose_executor() -> usize {
    let executor = (percpu::this_cpu_index() + 1) % crate::task::cpus::online();
    EXECUTOR.store(executor, Ordering::Relaxed);
    executor
}

fn check_point_here(sweep: &mut GraceSweep, target: Target, point: usize, in_handler: bool, in_use: usize) {
    let executor = EXECUTOR.load(Ordering::Relaxed);
    if !target.register() {
        sweep.lost += 1;
        return;
    }
    HELD.store(false, Ordering::Relaxed);
    UNPUBLISHED_SEEN.store(false, Ordering::Relaxed);
    HOLD_AT.store(if in_handler { NO_POINT } else { point }, Ordering::Relaxed);
    HOLD_IN_HANDLER.store(in_handler, Ordering::Relaxed);
    let argument = 2000 + point as u64;
    // Posted without waiting (a 0 ms timeout): the executor is held while this CPU unregisters.
    let _ = cross_call::run_on_within(executor, execute_stepped, argument, 0);
    let held = cpu::wait_until(100, || HELD.load(Ordering::Acquire));
    let unregistered = target.unregister();
    let returned = virtual_count();
    let finished = cpu::wait_until(100, || cross_call::is_idle(executor));
    HOLD_AT.store(NO_POINT, Ordering::Relaxed);
    HOLD_IN_HANDLER.store(false, Ordering::Relaxed);
    let unpublished = UNPUBLISHED_SEEN.load(Ordering::Relaxed);
    if !held || !finished || !unregistered || !unpublished {
        sweep.lost += 1;
        defmt::error!(
            "  race {=str}: point {=usize}, cpu {=usize}: held {=bool}, unpublished while held {=bool}, unregistered {=bool}, finished {=bool}",
            sweep.name,
            point,
            executor,
            held,
            unpublished,
            unregistered,
            finished
        );
        return;
    }
    sweep.checked += 1;
    if chunk_words_in_use() != in_use {
        sweep.lost += 1;
        defmt::warn!("  race {=str}: point {=usize}: the freed chunk is not poisoned", sweep.name, point);
    }
    let resumed = RESUMED_AT.load(Ordering::Acquire);
    if returned <= resumed {
        sweep.not_waited += 1;
    }
    let execution: Execution = last_execution(executor);
    let expected = (target.result())(argument);
    if target.before().matches(&execution, expected) {
        sweep.first_before.get_or_insert(point);
    } else if AFTER.matches(&execution, expected) {
        sweep.last_after = Some(point);
        if sweep.first_before.is_some() {
            sweep.after_after_before = true;
        }
    } else {
        sweep.wrong += 1;
        if sweep.wrong <= 3 {
            defmt::warn!(
                "  race {=str}: point {=usize} (pc {=u64:#x}), cpu {=usize}: neither before nor after: result {=u64:#x} (expected {=u64:#x}), hits {=u64}, fault esr {=u64:#x}",
                sweep.name,
                point,
                HELD_PC.load(Ordering::Relaxed),
                executor,
                execution.result,
                expected,
                execution.hits,
                execution.fault & !(1 << 63)
            );
        }
    }
}

/// Direction (b) for one target: a dry stepped call counts the points (the `blr`, the probed
/// word, every trampoline instruction up to the handler's entry, or the BRK and what follows it;
/// for ftrace the site's two words and the trampoline's entry), then each point and the handler
/// are checked once.
fn race_unregister(target: Target, name: &'static str) -> Finding {
    let site = target.site();
    SITE.store(site, Ordering::Relaxed);
    HIT_SOURCE.store(KPROBE_HITS, Ordering::Relaxed);
    STEP_SITE.store(site, Ordering::Relaxed);
    STEP_SITE_BYTES.store(target.site_bytes(), Ordering::Relaxed);
    FTRACE_TARGET.store(target == Target::Ftrace, Ordering::Relaxed);
    let in_use = chunk_words_in_use();
    if !target.register() {
        return Finding::Coverage;
    }
    HOLD_AT.store(NO_POINT, Ordering::Relaxed);
    HOLD_IN_HANDLER.store(false, Ordering::Relaxed);
    let masked = cpu::mask_interrupts();
    let executor = choose_executor();
    let dry = cross_call::run_on(executor, execute_stepped, 1999);
    let dry_hit = dry.is_ok() && target.before().matches(&last_execution(executor), (target.result())(1999));
    cpu::restore_interrupts(masked);
    let points = POINTS.load(Ordering::Relaxed);
    let in_slots = POINTS_IN_SLOTS.load(Ordering::Relaxed);
    let returning = POINTS_RETURNING.load(Ordering::Relaxed);
    if !target.unregister() || !dry_hit {
        return Finding::Coverage;
    }
    let mut sweep = GraceSweep {
        name,
        planned: points + 1,
        checked: 0,
        wrong: 0,
        not_waited: 0,
        lost: 0,
        last_after: None,
        first_before: None,
        after_after_before: false,
        switch_at: target.switch_at(points),
    };
    for point in 0..=points {
        check_point(&mut sweep, target, point, point == points, in_use);
    }
    // The design's points: the blr, the probed word, then (detour) every trampoline
    // instruction up to the call of the handler, which is stepped into, and from the return
    // into the trampoline on its return half and the rest of the function; for ftrace the blr,
    // the two site words and the trampoline's entry.
    let shape = match target {
        Target::Kprobe(Method::Detour) | Target::Kretprobe(Method::Detour) => in_slots > 0 && returning > 0,
        Target::Kprobe(_) | Target::Kretprobe(_) => points >= 2,
        Target::Ftrace => points == 4,
    };
    defmt::info!(
        "race {=str}: {=usize} interleavings ({=usize} stepped points, {=usize} in the trampoline, {=usize} after the handler returned, + the handler; planned {=usize}), after up to point {=?}, before from point {=?} (design: before from {=usize}), {=usize} wrong, {=usize} not waited for",
        name,
        sweep.checked,
        points,
        in_slots,
        returning,
        sweep.planned,
        sweep.last_after,
        sweep.first_before,
        sweep.switch_at,
        sweep.wrong,
        sweep.not_waited
    );
    if !shape { Finding::Coverage } else { sweep.finding() }
}

fn kretprobe_name(method: Method) -> &'static str {
    match method {
        Method::Detour => "kretprobe (detour entry) unregister (b)",
        _ => "kretprobe (single-step entry) unregister (b)",
    }
}

fn unregister_name(method: Method) -> &'static str {
    match method {
        Method::SingleStep => "kprobe single-step unregister (b)",
        Method::BrkStep => "kprobe brk-step unregister (b)",
        Method::Simulate => "kprobe simulate unregister (b)",
        Method::Detour => "kprobe detour unregister (b)",
    }
}

/// Every kprobe method's unregistration against a CPU held at each point of a hit: the
/// unregistration returns only after the held CPU resumed, the freed slot or trampoline is
/// poisoned, and each execution is a hit (held past the probed word) or the restored
/// instruction (held before it).
pub fn race_kprobe_unregister_waits(context: &Context) -> Outcome {
    if let Some(skip) = needs_cpus() {
        return Ok(skip);
    }
    if !context.icount {
        return Ok(Verdict::Skipped(NEEDS_ICOUNT));
    }
    check!(unlock_debug_everywhere());
    for method in Method::ALL {
        check_eq!(race_unregister(Target::Kprobe(method), unregister_name(method)) as u64, Finding::Correct as u64);
    }
    for method in [Method::Detour, Method::SingleStep] {
        let name = kretprobe_name(method);
        check_eq!(race_unregister(Target::Kretprobe(method), name) as u64, Finding::Correct as u64);
    }
    if ftrace::site_state(race_traced as *const () as u64).is_some() {
        check_eq!(race_unregister(Target::Ftrace, "ftrace unregister (b)") as u64, Finding::Correct as u64);
    }
    Ok(Verdict::Passed)
}

/// Freeing a detour trampoline or an XOL slot without the grace period (test-only
/// `Fault::KprobeFreedWithoutGracePeriod`) is caught: the held CPU resumes into the poisoned trampoline or
/// slot (a fault). Then the correct sequence passes again.
pub fn race_unregister_without_grace_period_is_caught(context: &Context) -> Outcome {
    if let Some(skip) = needs_cpus() {
        return Ok(skip);
    }
    if !context.icount {
        return Ok(Verdict::Skipped(NEEDS_ICOUNT));
    }
    check!(unlock_debug_everywhere());
    for (method, name) in [
        (Method::Detour, "kprobe detour unregister without grace period (b)"),
        (Method::SingleStep, "kprobe single-step unregister without grace period (b)"),
        (Method::BrkStep, "kprobe brk-step unregister without grace period (b)"),
    ] {
        inject::set(Fault::KprobeFreedWithoutGracePeriod, true);
        let wrong = race_unregister(Target::Kprobe(method), name);
        inject::set(Fault::KprobeFreedWithoutGracePeriod, false);
        check_eq!(wrong as u64, Finding::WrongBehaviour as u64);
        check_eq!(race_unregister(Target::Kprobe(method), unregister_name(method)) as u64, Finding::Correct as u64);
    }
    // A kretprobe whose detour entry probe is freed without the grace period: the held CPU
    // faults in the poison, also after its entry handler hijacked the return (the return half);
    // the abandoned instance is dropped at the landing, so nothing is left outstanding.
    let name = "kretprobe (detour entry) unregister without grace period (b)";
    inject::set(Fault::KprobeFreedWithoutGracePeriod, true);
    let wrong = race_unregister(Target::Kretprobe(Method::Detour), name);
    inject::set(Fault::KprobeFreedWithoutGracePeriod, false);
    check_eq!(wrong as u64, Finding::WrongBehaviour as u64);
    check_eq!(outstanding_returns_elsewhere(), 0);
    let name = kretprobe_name(Method::Detour);
    check_eq!(race_unregister(Target::Kretprobe(Method::Detour), name) as u64, Finding::Correct as u64);
    // ftrace: the tracers here are statics, so nothing is poisoned; the unregistration returning
    // while a CPU is still inside the tracer is what shows.
    if ftrace::site_state(race_traced as *const () as u64).is_some() {
        crate::inject::set(crate::inject::Fault::FtraceNoGracePeriod, true);
        let wrong = race_unregister(Target::Ftrace, "ftrace unregister without grace period (b)");
        crate::inject::set(crate::inject::Fault::FtraceNoGracePeriod, false);
        check_eq!(wrong as u64, Finding::NotWaited as u64);
        check_eq!(race_unregister(Target::Ftrace, "ftrace unregister (b)") as u64, Finding::Correct as u64);
    }
    Ok(Verdict::Passed)
}

fn outstanding_returns(_: u64) -> u64 {
    kretprobe::outstanding() as u64
}

/// Hijacked returns outstanding in the other CPUs' cross-call contexts (where the executors
/// ran), summed.
fn outstanding_returns_elsewhere() -> u64 {
    let this = percpu::this_cpu_index();
    (0..crate::task::cpus::online())
        .filter(|&cpu| cpu != this)
        .map(|cpu| cross_call::run_on(cpu, outstanding_returns, 0).unwrap_or(u64::MAX))
        .fold(0, u64::saturating_add)
}

/// A `BRK #0x004` trap whose probe is no longer published (it was unpublished between the BRK
/// and the lookup) resumes at the word if the word is no longer a BRK (the unregistration put the
/// instruction back), and stays unexpected if it still is one (a BRK nobody registered). The hit
/// path is called on a made-up frame: the window between the two cannot be stepped (the BRK
/// handler runs with debug exceptions masked).
pub fn race_brk_after_unpublish_resumes(_: &Context) -> Outcome {
    let frame =
        |elr: u64| ExceptionFrame { x: [0; 31], sp: 0, elr, spsr: 0, esr: 0, far: 0, boundary: [0; 5], tpidr_el0: 0 };
    let restored = race_probe_target as *const () as u64;
    check!(kprobes::counts(restored).is_none());
    let mut resumed = frame(restored);
    check!(kprobes::on_brk(&mut resumed));
    check_eq!(resumed.elr, restored);
    // SAFETY: only the address of the asm label is taken.
    let stray = unsafe { &race_stray_brk as *const u32 as u64 };
    let mut unexpected = frame(stray);
    check!(!kprobes::on_brk(&mut unexpected));
    Ok(Verdict::Passed)
}
