//! Patch races for uprobes, direction (b): one EL0 executor (`uprobe.rs`'s, driven through its
//! gate) is stepped instruction by instruction with hardware single-step from EL0 (MDSCR_EL1.SS,
//! SPSR.SS; KDE stays clear, so EL1 code is never stepped) from the gate's return through the
//! call of the probed user function, its BRK or B, the XOL slot or detour trampoline, and back to
//! the executor's loop; one more point holds it inside the probe's handler. At each point it is
//! held (in the step exception, IRQs masked) while the test's CPU runs the whole
//! `uprobe::unregister` (restore, unpublish, grace period, slot and trampoline poisoned). The
//! unregistration must return only after the executor resumed, and the call must be the hit
//! ("before") or the restored instruction ("after"). The step exceptions reach this file through
//! `uprobe_hit::set_foreign_step_hook` (a step that no uprobe armed). See docs/design/races.md.
//!
//! Also: a user task preempted inside a detour trampoline, on one CPU (an IRQ made
//! pending at the trampoline's displaced instruction by the probe's handler).

use super::uprobe::{
    EXECUTORS, MAILBOXES, NONE, TARGET_HITS, ended, executor_entry, race_user_after_gate, race_user_run,
    race_user_target, start_executor, start_executors, stop_executors, user_address, with_gate,
};
use super::{Behaviour, Execution, Finding, HIT, NOT_HIT, needs_cpus};
use crate::arch::counters::virtual_count;
use crate::arch::exception::{ExceptionClass, ExceptionFrame};
use crate::arch::step::{MDSCR_SS, SPSR_SS, set_mdscr};
use crate::arch::{cpu, percpu};
use crate::inject::{self, Fault};
use crate::probes::uprobe as uprobes;
use crate::probes::uprobe_hit;
use crate::probes::{Method, Registers};
use crate::sync::IrqMask;
use crate::task::user::{self, USER_XOL, UserFault};
use crate::task::{CpuMask, KillReason, State, TaskId};
use crate::tests::{Context, Outcome, Verdict, check, check_eq};
use core::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

const NO_POINT: usize = usize::MAX;
/// How long the held executor stays held after the unpublish (counter time).
const HOLD_MS: u64 = 1;

/// The stepped CPU (index + 1, 0: none), the points it passed in this call, where it is held.
static STEPPED_CPU: AtomicUsize = AtomicUsize::new(0);
static POINTS: AtomicUsize = AtomicUsize::new(0);
static POINTS_IN_XOL: AtomicUsize = AtomicUsize::new(0);
/// The point at which the executor was about to run the probed word.
static PROBED_POINT: AtomicUsize = AtomicUsize::new(NO_POINT);
static HOLD_AT: AtomicUsize = AtomicUsize::new(NO_POINT);
static HOLD_IN_HANDLER: AtomicBool = AtomicBool::new(false);
static EXECUTOR: AtomicUsize = AtomicUsize::new(NONE);
static HELD: AtomicBool = AtomicBool::new(false);
static UNPUBLISHED_SEEN: AtomicBool = AtomicBool::new(false);
static RESUMED_AT: AtomicU64 = AtomicU64::new(0);

fn target() -> u64 {
    user_address(&raw const race_user_target)
}

/// The gate hands this CPU's executor a stepped call (EL1, IRQs masked).
pub(super) fn start_stepping_here() {
    POINTS.store(0, Ordering::Relaxed);
    POINTS_IN_XOL.store(0, Ordering::Relaxed);
    PROBED_POINT.store(NO_POINT, Ordering::Relaxed);
    STEPPED_CPU.store(percpu::this_cpu_index() + 1, Ordering::Relaxed);
    set_mdscr(MDSCR_SS, true);
}

/// The executor reported its call: stepping is over (a uprobe's own step may have ended it).
pub(super) fn stop_stepping_here() {
    if STEPPED_CPU.load(Ordering::Relaxed) == percpu::this_cpu_index() + 1 {
        STEPPED_CPU.store(0, Ordering::Relaxed);
        set_mdscr(MDSCR_SS, false);
    }
}

/// From the gate's return to the call, the probed function, and the XOL page.
fn stepped_region(pc: u64) -> bool {
    let after_gate = user_address(&raw const race_user_after_gate);
    let run = user_address(&raw const race_user_run);
    (after_gate..run + 8).contains(&pc)
        || (target()..target() + 12).contains(&pc)
        || (USER_XOL..USER_XOL + 4096).contains(&pc)
}

/// Holds this CPU until the uprobe is unpublished, then `HOLD_MS` more.
fn hold() {
    HELD.store(true, Ordering::Release);
    cpu::send_event();
    let unpublished = cpu::wait_until(100, || uprobes::counts(target()).is_none());
    UNPUBLISHED_SEEN.store(unpublished, Ordering::Relaxed);
    cpu::wait_until(HOLD_MS, || false);
    RESUMED_AT.store(virtual_count(), Ordering::Release);
}

/// A software-step exception from EL0 that no uprobe armed: one more point of the stepped call.
#[unsafe(link_section = ".text.noprobe")]
fn on_step(frame: &mut ExceptionFrame) -> bool {
    if STEPPED_CPU.load(Ordering::Relaxed) != percpu::this_cpu_index() + 1 {
        return false;
    }
    let point = POINTS.load(Ordering::Relaxed);
    POINTS.store(point + 1, Ordering::Relaxed);
    if (USER_XOL..USER_XOL + 4096).contains(&frame.elr) {
        POINTS_IN_XOL.store(POINTS_IN_XOL.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }
    if frame.elr == target() && PROBED_POINT.load(Ordering::Relaxed) == NO_POINT {
        PROBED_POINT.store(point, Ordering::Relaxed);
    }
    if point == HOLD_AT.load(Ordering::Relaxed) {
        hold();
    }
    if stepped_region(frame.elr) {
        frame.spsr |= SPSR_SS;
    } else {
        frame.spsr &= !SPSR_SS;
        STEPPED_CPU.store(0, Ordering::Relaxed);
        set_mdscr(MDSCR_SS, false);
    }
    true
}

/// The race uprobe's handler under (b): counts, and holds the executor when told.
fn count_and_hold(_: &mut Registers) {
    let cpu = percpu::this_cpu_index();
    TARGET_HITS[cpu].fetch_add(1, Ordering::Relaxed);
    if cpu == EXECUTOR.load(Ordering::Relaxed) && HOLD_IN_HANDLER.load(Ordering::Relaxed) {
        hold();
    }
}

/// The executor for this point (IRQs masked by the caller, so the test stays on this CPU): the
/// next CPU after this one that has an executor (the test task may have moved since the
/// executors were started).
fn choose_executor() -> usize {
    let this = percpu::this_cpu_index();
    let online = crate::task::cpus::online();
    let executor = (1..online)
        .map(|step| (this + step) % online)
        .find(|&cpu| EXECUTORS[cpu].load(Ordering::Relaxed) != NONE)
        .unwrap_or(NONE);
    EXECUTOR.store(executor, Ordering::Relaxed);
    executor
}

/// Posts a stepped call with `argument` to `cpu`'s executor; the sequence number it will serve.
fn post_stepped(cpu: usize, argument: u64) -> u64 {
    let mailbox = &MAILBOXES[cpu];
    mailbox.stepped.store(true, Ordering::Relaxed);
    mailbox.argument.store(argument, Ordering::Relaxed);
    let sequence = mailbox.posted.load(Ordering::Relaxed) + 1;
    mailbox.posted.store(sequence, Ordering::Release);
    cpu::send_event();
    sequence
}

/// Waits for the call `sequence` on `cpu`: what it did, or `None` (it did not finish).
fn finished(cpu: usize, sequence: u64) -> Option<Execution> {
    let id = TaskId(EXECUTORS[cpu].load(Ordering::Relaxed));
    let mailbox = &MAILBOXES[cpu];
    let served = || mailbox.served.load(Ordering::Acquire) == sequence;
    cpu::wait_until(100, || served() || ended(id));
    if served() {
        mailbox.stepped.store(false, Ordering::Relaxed);
        return Some(Execution {
            result: mailbox.result.load(Ordering::Relaxed),
            hits: mailbox.hits.load(Ordering::Relaxed),
            depth: 0,
            fault: 0,
        });
    }
    if ended(id) {
        let esr = crate::task::user::fault(id).map_or(0, |fault| fault.esr);
        // A new executor for the next point.
        start_executor(cpu, executor_entry());
        return Some(Execution { result: 0, hits: 0, depth: 0, fault: esr | 1 << 63 });
    }
    None
}

/// What one (b) sweep saw.
#[derive(Default)]
struct Sweep {
    checked: usize,
    wrong: usize,
    not_waited: usize,
    lost: usize,
    last_after: Option<usize>,
    first_before: Option<usize>,
    after_after_before: bool,
}

fn result(argument: u64) -> u64 {
    argument + 5
}

/// One point: the uprobe registered, the executor held at `point` (or in the handler), this CPU
/// unregisters; then the wait and the execution are checked.
fn check_point(sweep: &mut Sweep, name: &str, method: Method, point: usize, in_handler: bool) {
    let executor = choose_executor();
    if uprobes::register(target(), method, count_and_hold, None).is_err() {
        sweep.lost += 1;
        return;
    }
    HELD.store(false, Ordering::Relaxed);
    UNPUBLISHED_SEEN.store(false, Ordering::Relaxed);
    HOLD_AT.store(if in_handler { NO_POINT } else { point }, Ordering::Relaxed);
    HOLD_IN_HANDLER.store(in_handler, Ordering::Relaxed);
    let argument = 3000 + point as u64;
    let sequence = post_stepped(executor, argument);
    let held = cpu::wait_until(100, || HELD.load(Ordering::Acquire));
    let unregistered = uprobes::unregister(target()).is_ok();
    let returned = virtual_count();
    let execution = finished(executor, sequence);
    HOLD_AT.store(NO_POINT, Ordering::Relaxed);
    HOLD_IN_HANDLER.store(false, Ordering::Relaxed);
    let Some(execution) = execution.filter(|_| held && unregistered && UNPUBLISHED_SEEN.load(Ordering::Relaxed)) else {
        sweep.lost += 1;
        defmt::error!(
            "  race {=str}: point {=usize}, cpu {=usize}: held {=bool}, unregistered {=bool}, call finished {=bool}",
            name,
            point,
            executor,
            held,
            unregistered,
            execution.is_some()
        );
        return;
    };
    sweep.checked += 1;
    if returned <= RESUMED_AT.load(Ordering::Acquire) {
        sweep.not_waited += 1;
    }
    let expected = result(argument);
    let before: Behaviour = HIT;
    if before.matches(&execution, expected) {
        sweep.first_before.get_or_insert(point);
    } else if NOT_HIT.matches(&execution, expected) {
        sweep.last_after = Some(point);
        sweep.after_after_before |= sweep.first_before.is_some();
    } else {
        sweep.wrong += 1;
        if sweep.wrong <= 3 {
            defmt::warn!(
                "  race {=str}: point {=usize}, cpu {=usize}: neither before nor after: result {=u64:#x} (expected {=u64:#x}), hits {=u64}, fault esr {=u64:#x}",
                name,
                point,
                executor,
                execution.result,
                expected,
                execution.hits,
                execution.fault & !(1 << 63)
            );
        }
    }
}

/// Direction (b) for one uprobe method: a dry stepped call counts the points, then each point
/// and the handler are checked once. "after" (the restored word, no hit) while the executor had
/// not yet run the probed word; "before" (one hit) from the point after it.
fn race_unregister(method: Method, name: &'static str) -> Finding {
    let masked = cpu::mask_interrupts();
    let executor = choose_executor();
    HOLD_AT.store(NO_POINT, Ordering::Relaxed);
    HOLD_IN_HANDLER.store(false, Ordering::Relaxed);
    if uprobes::register(target(), method, count_and_hold, None).is_err() {
        return Finding::Coverage;
    }
    let sequence = post_stepped(executor, 2999);
    let dry = finished(executor, sequence);
    cpu::restore_interrupts(masked);
    let points = POINTS.load(Ordering::Relaxed);
    let in_xol = POINTS_IN_XOL.load(Ordering::Relaxed);
    let probed = PROBED_POINT.load(Ordering::Relaxed);
    if uprobes::unregister(target()).is_err() || !dry.is_some_and(|dry| HIT.matches(&dry, result(2999))) {
        return Finding::Coverage;
    }
    let mut sweep = Sweep::default();
    for point in 0..=points {
        let masked = cpu::mask_interrupts();
        check_point(&mut sweep, name, method, point, point == points);
        cpu::restore_interrupts(masked);
    }
    // A hit begins at the BRK, or at the detour trampoline's SVC (one point after the B).
    let switch_at = probed.saturating_add(if method == Method::Detour { 2 } else { 1 });
    defmt::info!(
        "race {=str}: {=usize} interleavings ({=usize} stepped points, {=usize} in the XOL page, + the handler; planned {=usize}), after up to point {=?}, before from point {=?} (design: before from {=usize}), {=usize} wrong, {=usize} not waited for",
        name,
        sweep.checked,
        points,
        in_xol,
        points + 1,
        sweep.last_after,
        sweep.first_before,
        switch_at,
        sweep.wrong,
        sweep.not_waited
    );
    if sweep.checked != points + 1 || sweep.lost != 0 || probed == NO_POINT {
        Finding::Coverage
    } else if sweep.wrong != 0 {
        Finding::WrongBehaviour
    } else if sweep.not_waited != 0 {
        Finding::NotWaited
    } else if sweep.after_after_before
        || sweep.last_after != Some(switch_at - 1)
        || sweep.first_before != Some(switch_at)
    {
        Finding::SwitchedElsewhere
    } else {
        Finding::Correct
    }
}

fn name(method: Method, wrong: bool) -> &'static str {
    match (method, wrong) {
        (Method::SingleStep, false) => "uprobe single-step unregister (b)",
        (Method::BrkStep, false) => "uprobe brk-step unregister (b)",
        (Method::Simulate, false) => "uprobe simulate unregister (b)",
        (Method::Detour, false) => "uprobe detour unregister (b)",
        (Method::SingleStep, true) => "uprobe single-step unregister, poisoned before restore (b)",
        (Method::BrkStep, true) => "uprobe brk-step unregister, poisoned before restore (b)",
        (Method::Simulate, true) => "uprobe simulate unregister, poisoned before restore (b)",
        (Method::Detour, true) => "uprobe detour unregister, poisoned before restore (b)",
    }
}

/// Every uprobe method's unregistration against an EL0 task held at each point of a hit: the
/// unregistration returns only after the task resumed, and each call is a hit (held past the
/// probed word) or the restored instruction (held before it). The wrong removal (the slot and
/// trampoline poisoned before the word is restored) is caught for the methods that run them.
pub(super) fn race_uprobe_unregister_waits(context: &Context) -> Outcome {
    if let Some(skip) = needs_cpus() {
        return Ok(skip);
    }
    if !context.icount {
        return Ok(Verdict::Skipped("needs -icount (holds a CPU against 100 ms wall-clock limits)"));
    }
    with_gate(|| {
        uprobe_hit::set_foreign_step_hook(Some(on_step));
        start_executors();
        let mut findings = [Finding::Correct; 7];
        for (index, method) in Method::ALL.into_iter().enumerate() {
            findings[index] = race_unregister(method, name(method, false));
        }
        inject::set(Fault::UprobePoisonBeforeRestore, true);
        for (index, method) in [Method::Detour, Method::SingleStep, Method::BrkStep].into_iter().enumerate() {
            findings[4 + index] = race_unregister(method, name(method, true));
        }
        inject::set(Fault::UprobePoisonBeforeRestore, false);
        inject::set(Fault::UprobeFreedWithoutGracePeriod, true);
        // Simulate uses no slot: without the grace period nothing faults, and the unregistration
        // returning while the executor is held is what shows.
        let no_grace = race_unregister(Method::Simulate, "uprobe simulate unregister without grace period (b)");
        inject::set(Fault::UprobeFreedWithoutGracePeriod, false);
        let exited = stop_executors();
        uprobe_hit::set_foreign_step_hook(None);
        for finding in &findings[..4] {
            check_eq!(*finding as u64, Finding::Correct as u64);
        }
        for finding in &findings[4..] {
            check_eq!(*finding as u64, Finding::WrongBehaviour as u64);
        }
        check_eq!(no_grace as u64, Finding::NotWaited as u64);
        check_eq!(exited, true);
        Ok(Verdict::Passed)
    })
}

// A user task preempted inside a detour trampoline. `race_udetour_loop(spin)` calls
// `race_udetour_target(i)` (`add x0, x0, #1; ret`, probed on its `add` with a detour) for
// i = 1, 2, ... until `spin` counter units have passed, checking each result; exit(calls), or
// exit(UDETOUR_BAD) at the first wrong result.
core::arch::global_asm!(
    r#"
    .section .text.user, "ax"
    .balign 16
    .global race_udetour_loop
race_udetour_loop:
    mov     x19, x0
    mov     x8, #2
    svc     #0
    add     x19, x19, x0
    mov     x20, #0
1:  add     x20, x20, #1
    mov     x0, x20
    bl      race_udetour_target
    add     x9, x20, #1
    cmp     x0, x9
    b.ne    9f
    mrs     x10, cntvct_el0
    cmp     x10, x19
    b.lo    1b
    mov     x0, x20
    mov     x8, #0
    svc     #0
9:  mov     x0, #-1
    mov     x8, #0
    svc     #0
    .balign 16
    .global race_udetour_target
race_udetour_target:
    add     x0, x0, #1
    ret
"#
);

unsafe extern "C" {
    static race_udetour_loop: u32;
    static race_udetour_target: u32;
}

/// `race_udetour_loop`'s exit code when a call returned a wrong result.
const UDETOUR_BAD: u64 = u64::MAX;
/// How long the unregistering task waits for the first hit (ms, times the patience factor).
const UDETOUR_WAIT_MS: u64 = 100;

/// Set before a run: the next hit makes the tick pending on its CPU.
static UDETOUR_ARM: AtomicBool = AtomicBool::new(false);
/// Set by that hit: the unregistering task may go.
static UDETOUR_RELEASED: AtomicBool = AtomicBool::new(false);
static UDETOUR_HITS: AtomicU64 = AtomicU64::new(0);
/// What the unregistering task did: `PENDING`, `UNREGISTERED`, `FAILED` or `TIMED_OUT`.
static UDETOUR_UNREGISTER: AtomicUsize = AtomicUsize::new(PENDING);
const PENDING: usize = 0;
const UNREGISTERED: usize = 1;
const FAILED: usize = 2;
const TIMED_OUT: usize = 3;

/// The detour's handler (in the task's `SVC #0x550` exception, IRQs masked). On the armed hit
/// it brings this CPU's tick forward to now: pending until the `eret` to trampoline + 4 unmasks
/// IRQs, taken there, and the tick asks for a reschedule (`need_resched`) at that IRQ's exit.
/// (Not the wake-up SGI: a uniprocessor GICv2 has no target list to send one to itself.)
fn preempt_after_svc(_: &mut Registers) {
    UDETOUR_HITS.fetch_add(1, Ordering::Relaxed);
    if UDETOUR_ARM.swap(false, Ordering::Relaxed) {
        crate::drivers::timer::fire_in(0);
        UDETOUR_RELEASED.store(true, Ordering::Release);
    }
}

/// The kernel task on the user task's CPU: yields until the armed hit released it, then
/// unregisters the probe at `target` (IRQs masked, so no tick moves the user task on before the
/// trampoline is poisoned).
extern "C" fn unregister_when_released(target: u64) {
    let deadline = virtual_count() + cpu::patience_ms(UDETOUR_WAIT_MS) * crate::drivers::timer::frequency() / 1000;
    while !UDETOUR_RELEASED.load(Ordering::Acquire) {
        if virtual_count() > deadline {
            UDETOUR_UNREGISTER.store(TIMED_OUT, Ordering::Release);
            return;
        }
        crate::task::yield_now();
    }
    let masked = cpu::mask_interrupts();
    let unregistered = uprobes::unregister(target).is_ok();
    cpu::restore_interrupts(masked);
    UDETOUR_UNREGISTER.store(if unregistered { UNREGISTERED } else { FAILED }, Ordering::Release);
}

/// What one preempted run did.
struct PreemptedRun {
    trampoline: u64,
    ended: State,
    exit_code: Option<u64>,
    fault: Option<UserFault>,
    hits: u64,
    unregister: usize,
    trampoline_irq_exits: u64,
    rescheduled_before_hit: u64,
}

/// One run: the detour registered, the user task and the unregistering task pinned to this
/// CPU, the first hit makes an IRQ pending at trampoline + 4 and releases the unregistering
/// task; both are waited for.
fn preempted_run(spin: u64) -> Result<PreemptedRun, crate::tests::Failure> {
    let target = user_address(&raw const race_udetour_target);
    let entry = user_address(&raw const race_udetour_loop);
    UDETOUR_HITS.store(0, Ordering::Relaxed);
    UDETOUR_RELEASED.store(false, Ordering::Relaxed);
    UDETOUR_UNREGISTER.store(PENDING, Ordering::Relaxed);
    UDETOUR_ARM.store(true, Ordering::Relaxed);
    if uprobes::register(target, Method::Detour, preempt_after_svc, None).is_err() {
        return Err(crate::tests::fail("detour uprobe registration"));
    }
    let trampoline = uprobes::detour_trampoline(target).unwrap_or(0);
    let exits_before = uprobe_hit::trampoline_irq_exits();
    let rescheduled_before = uprobe_hit::rescheduled_before_hit();
    let spawned = {
        // Masked from the first spawn to the second, so both start on this CPU.
        let _masked = IrqMask::new();
        let cpu = percpu::this_cpu_index();
        user::spawn("udetour-user", entry, [spin, 0, 0], user::Options::DEFAULT).and_then(|user| {
            crate::task::spawn_on(CpuMask::one(cpu), "udetour-unregister", unregister_when_released, target)
                .map(|kernel| (user, kernel))
        })
    };
    let Ok((user_task, kernel_task)) = spawned else {
        let _ = uprobes::unregister(target);
        return Err(crate::tests::fail("free task slots for the user task and the unregistering task"));
    };
    let ended = crate::task::join(user_task);
    crate::task::join(kernel_task);
    let unregister = UDETOUR_UNREGISTER.load(Ordering::Acquire);
    if unregister != UNREGISTERED {
        let _ = uprobes::unregister(target);
    }
    Ok(PreemptedRun {
        trampoline,
        ended,
        exit_code: user::exit_code(user_task),
        fault: user::fault(user_task),
        hits: UDETOUR_HITS.load(Ordering::Relaxed),
        unregister,
        trampoline_irq_exits: uprobe_hit::trampoline_irq_exits() - exits_before,
        rescheduled_before_hit: uprobe_hit::rescheduled_before_hit() - rescheduled_before,
    })
}

fn log_run(name: &str, run: &PreemptedRun) {
    defmt::info!(
        "  {=str}: trampoline {=u64:#x}, task {}, exit {=?}, fault {=?}, {=u64} hits, unregister {=usize}, {=u64} IRQ exits deferred in a trampoline, {=u64} detour SVCs rescheduled before the hit",
        name,
        run.trampoline,
        run.ended,
        run.exit_code,
        run.fault,
        run.hits,
        run.unregister,
        run.trampoline_irq_exits,
        run.rescheduled_before_hit
    );
}

/// A user task whose detour hit is followed by an IRQ at trampoline + 4 (the tick its handler
/// brings forward) while a kernel task on the same CPU waits to unregister the probe. With the
/// bug put back (`Fault::UprobePreemptibleTrampoline`) the task is switched away at + 4, the
/// unregistration (its grace period passes: the task is switched away) poisons the trampoline,
/// and the task resumes into `BRK #0x120` filler: killed with its fault at trampoline + 4. With
/// the fix, the IRQ exit at + 4 switches nothing (counted); the task is switched away at its
/// next detour SVC, before the hit, at the probed address (outside the trampoline), the
/// unregistration runs then, and the task finishes with every result right. Then the index
/// is reused: a new detour at the same trampoline is hit by every call. One CPU: every
/// configuration.
pub(super) fn race_uprobe_detour_preempted_in_trampoline(context: &Context) -> Outcome {
    let target = user_address(&raw const race_udetour_target);
    let entry = user_address(&raw const race_udetour_loop);
    let spin = 4 * crate::drivers::timer::frequency() / crate::drivers::timer::hz();
    inject::set(Fault::UprobePreemptibleTrampoline, true);
    let wrong = preempted_run(spin);
    inject::set(Fault::UprobePreemptibleTrampoline, false);
    let wrong = wrong?;
    log_run("preemptible trampoline (the bug)", &wrong);
    check!(wrong.trampoline != 0);
    check_eq!(wrong.unregister, UNREGISTERED);
    check!(wrong.ended == State::Killed(KillReason::UserFault));
    let Some(fault) = wrong.fault else { return Err(crate::tests::fail("the preempted task's fault")) };
    // Switched away at + 4 (the displaced instruction), resumed there into the filler.
    check_eq!(fault.pc, wrong.trampoline + 4);
    check!(ExceptionClass::of(fault.esr) == ExceptionClass::Brk);
    check_eq!(fault.esr & 0xffff, u64::from(uprobes::BRK_UPROBE_STEP));
    check_eq!(wrong.hits, 1);
    check_eq!(wrong.trampoline_irq_exits, 0);

    let right = preempted_run(spin)?;
    log_run("fixed", &right);
    check_eq!(right.unregister, UNREGISTERED);
    check!(right.ended == State::Exited);
    check!(right.fault.is_none());
    let calls = right.exit_code.unwrap_or(UDETOUR_BAD);
    check!(calls != UDETOUR_BAD);
    // The IRQ at + 4 was taken and deferred; the task was switched away before its second hit
    // (at its next detour SVC, `reschedule_before_hit`: without icount a tick may do it first,
    // in the few instructions outside the trampoline), the unregistering task ran then, and
    // every later call ran the restored instruction.
    check!(right.trampoline_irq_exits >= 1);
    check_eq!(right.hits, 1);
    check!(calls > 1);
    check!(right.rescheduled_before_hit >= u64::from(context.icount));
    check!(uprobes::counts(target).is_none());

    // The index is free again and its trampoline rewritten: every call is a hit.
    UDETOUR_HITS.store(0, Ordering::Relaxed);
    UDETOUR_ARM.store(false, Ordering::Relaxed);
    check!(uprobes::register(target, Method::Detour, preempt_after_svc, None).is_ok());
    let reused = uprobes::detour_trampoline(target);
    let cpu = crate::task::this_cpu();
    let again = user::run_on(cpu, entry, [crate::drivers::timer::frequency() / 1000, 0, 0], user::Options::DEFAULT);
    check!(uprobes::unregister(target).is_ok());
    check_eq!(reused.unwrap_or(0), wrong.trampoline);
    let Ok(calls) = again else { return Err(crate::tests::fail("the run on the reused index faulted")) };
    check!(calls != UDETOUR_BAD);
    check_eq!(UDETOUR_HITS.load(Ordering::Relaxed), calls);
    Ok(Verdict::Passed)
}
