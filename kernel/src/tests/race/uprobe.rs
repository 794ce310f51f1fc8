//! Patch races for uprobes, direction (a): the uprobe patcher (the XOL slot or detour trampoline
//! written into every task slot's XOL page, then the BRK or B in user text; on unregistration
//! the word restored, the grace period, the slot and trampoline poisoned) is stepped one store at
//! a time (`arch::patch`'s step hook, also run by `write_code_alias` for each XOL word), and at
//! each point every other CPU runs the probed user function to completion in an EL0 task.
//!
//! The patching CPU cannot spawn a task at a step point (it holds the uprobes' registration lock
//! with IRQs masked, and a spawn writes the new task's XOL page under that lock), so each other
//! CPU runs one EL0 executor task, spawned before the sweep and pinned there. The executor loops
//! at EL0 calling a gate function, whose first instruction carries a uprobe (`Simulate`: no
//! per-CPU step state). The gate's handler, on the executor's CPU with IRQs masked, takes the
//! report of the executor's last call (its result in x0, x1 = 1) and hands it the next command
//! (x0: idle, run with the argument in x1, or exit); it waits for a command at most 1 ms (times
//! the patience) before returning idle, so the executor returns to EL0 with IRQs unmasked at
//! least that often and passes the quiescent points a grace period waits for. See
//! docs/design/races.md.

use super::{Execution, Finding, HIT, NOT_HIT, Sequence, needs_cpus, sweep_with};
use crate::arch::step::{SPSR_IF, SPSR_SS};
use crate::arch::{cpu, percpu};
use crate::inject::{self, Fault};
use crate::probes::uprobe as uprobes;
use crate::probes::{Method, Registers};
use crate::sync::IrqMask;
use crate::task::stacks::{CPUS, TASK_SLOTS};
use crate::task::user::{self, Options};
use crate::task::{self, CpuMask, State, TaskId};
use crate::tests::{Context, Outcome, Verdict, check, check_eq};
use core::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// The gate's commands (x0 on its return).
const IDLE: u64 = 0;
const RUN: u64 = 1;
const EXIT: u64 = 2;

// The EL0 executor: `race_user_executor` calls `race_user_gate` with its last report (x0 =
// result, x1 = 1 after a call, else 0) and does what the gate's handler returned (x0 = command,
// x1 = argument): nothing, one call of `race_user_target`, or `exit(0)`.
core::arch::global_asm!(
    r#"
    .section .text.user, "ax"
    .balign 16
    .global race_user_executor
race_user_executor:
    mov     x19, #0
    mov     x20, #0
0:  mov     x0, x20
    mov     x1, x19
    bl      race_user_gate
    .global race_user_after_gate
race_user_after_gate:
    mov     x19, #0
    cmp     x0, #{run}
    b.eq    1f
    cmp     x0, #{exit}
    b.ne    0b
    mov     x0, #0
    mov     x8, #0
    svc     #0
    .global race_user_run
race_user_run:
1:  mov     x0, x1
    bl      race_user_target
    mov     x20, x0
    mov     x19, #1
    b       0b

    .balign 16
    .global race_user_gate
race_user_gate:
    mov     x2, x0
    ret

    .balign 16
    .global race_user_target
race_user_target:
    mov     x1, x0
    add     x0, x1, #5
    ret
"#,
    run = const RUN,
    exit = const EXIT,
);

unsafe extern "C" {
    static race_user_executor: u32;
    static race_user_gate: u32;
    pub(super) static race_user_after_gate: u32;
    pub(super) static race_user_run: u32;
    pub(super) static race_user_target: u32;
}

pub(super) fn user_address(symbol: *const u32) -> u64 {
    user::user_address(symbol as u64)
}

/// One executor's mailbox: the patcher posts (`posted` + 1 with the argument), the gate serves
/// (`served` = `posted` with the result and the hits the call counted).
pub(super) struct Mailbox {
    pub(super) posted: AtomicU64,
    pub(super) served: AtomicU64,
    pub(super) argument: AtomicU64,
    pub(super) result: AtomicU64,
    pub(super) hits: AtomicU64,
    pub(super) hits_at_run: AtomicU64,
    pub(super) stop: AtomicBool,
    /// The next call runs stepped (direction (b), `ugrace`).
    pub(super) stepped: AtomicBool,
}

pub(super) static MAILBOXES: [Mailbox; CPUS] = [const {
    Mailbox {
        posted: AtomicU64::new(0),
        served: AtomicU64::new(0),
        argument: AtomicU64::new(0),
        result: AtomicU64::new(0),
        hits: AtomicU64::new(0),
        hits_at_run: AtomicU64::new(0),
        stop: AtomicBool::new(false),
        stepped: AtomicBool::new(false),
    }
}; CPUS];

/// The executor task on each CPU (`NONE`: none, or it was killed).
pub(super) static EXECUTORS: [AtomicUsize; CPUS] = [const { AtomicUsize::new(NONE) }; CPUS];
pub(super) const NONE: usize = usize::MAX;

/// Hits of the race uprobe, per CPU (its handler runs on the hitting CPU).
pub(super) static TARGET_HITS: [AtomicU64; CPUS] = [const { AtomicU64::new(0) }; CPUS];

fn count_target_hit(_: &mut Registers) {
    TARGET_HITS[percpu::this_cpu_index()].fetch_add(1, Ordering::Relaxed);
}

/// The gate uprobe's handler, on the executor's CPU (EL0 exception, IRQs masked).
fn gate(registers: &mut Registers) {
    let cpu = percpu::this_cpu_index();
    let mailbox = &MAILBOXES[cpu];
    // Between calls the executor runs with IRQs unmasked (a stepped call masks them).
    registers.pstate &= !SPSR_IF;
    if registers.x[1] == 1 {
        super::ugrace::stop_stepping_here();
        mailbox.result.store(registers.x[0], Ordering::Relaxed);
        let hits = TARGET_HITS[cpu].load(Ordering::Relaxed) - mailbox.hits_at_run.load(Ordering::Relaxed);
        mailbox.hits.store(hits, Ordering::Relaxed);
        mailbox.served.store(mailbox.posted.load(Ordering::Relaxed), Ordering::Release);
        cpu::send_event();
    }
    let pending = || mailbox.posted.load(Ordering::Acquire) != mailbox.served.load(Ordering::Relaxed);
    let stop = || mailbox.stop.load(Ordering::Acquire);
    cpu::wait_until(1, || pending() || stop());
    if pending() {
        mailbox.hits_at_run.store(TARGET_HITS[cpu].load(Ordering::Relaxed), Ordering::Relaxed);
        registers.x[0] = RUN;
        registers.x[1] = mailbox.argument.load(Ordering::Relaxed);
        if mailbox.stepped.load(Ordering::Relaxed) {
            // Stepped from the gate's return on, with IRQs masked at EL0 (no preemption and no
            // quiescent point inside the call: held, the executor must block the grace period).
            registers.pstate |= SPSR_SS | SPSR_IF;
            super::ugrace::start_stepping_here();
        }
    } else if stop() {
        registers.x[0] = EXIT;
    } else {
        registers.x[0] = IDLE;
    }
}

/// Without `-icount` the sweeps pass but are slow: 20 to 50 s of wall time per run of both
/// tests on `virt --smp 4` on the loaded 2-core host (5 runs), against 1.8 s for the whole run
/// under icount, so they run under icount only (every `virt` configuration).
const NEEDS_ICOUNT: &str = "needs -icount (20 to 50 s of wall time without it)";

/// How long the patching CPU waits for one execution.
const EXECUTION_MS: u64 = 100;

pub(super) fn ended(id: TaskId) -> bool {
    !matches!(task::state(id), State::Runnable)
}

/// The uprobe sweeps' executor: one call of the probed user function by `cpu`'s EL0 executor.
/// An execution that killed the executor (a user fault) is a fault; that CPU runs nothing more.
fn user_execution(cpu: usize, argument: u64) -> Option<Execution> {
    let id = EXECUTORS[cpu].load(Ordering::Relaxed);
    if id == NONE {
        // Killed by an earlier (wrong) execution of this sweep: reported then.
        return None;
    }
    let id = TaskId(id);
    let mailbox = &MAILBOXES[cpu];
    mailbox.argument.store(argument, Ordering::Relaxed);
    let sequence = mailbox.posted.load(Ordering::Relaxed) + 1;
    mailbox.posted.store(sequence, Ordering::Release);
    cpu::send_event();
    let served = || mailbox.served.load(Ordering::Acquire) == sequence;
    cpu::wait_until(EXECUTION_MS, || served() || ended(id));
    if served() {
        return Some(Execution {
            result: mailbox.result.load(Ordering::Relaxed),
            hits: mailbox.hits.load(Ordering::Relaxed),
            depth: 0,
            fault: 0,
        });
    }
    if ended(id) {
        EXECUTORS[cpu].store(NONE, Ordering::Relaxed);
        let esr = user::fault(id).map_or(0, |fault| fault.esr);
        return Some(Execution { result: 0, hits: 0, depth: 0, fault: esr | 1 << 63 });
    }
    defmt::error!(
        "  cpu {=usize}: EL0 executor did not finish a call within {=u64} ms",
        cpu,
        cpu::patience_ms(EXECUTION_MS)
    );
    None
}

/// Starts an EL0 executor pinned to every other online CPU.
pub(super) fn start_executors() {
    let entry = user_address(&raw const race_user_executor);
    for cpu in (0..task::cpus::online()).filter(|&cpu| cpu != percpu::this_cpu_index()) {
        start_executor(cpu, entry);
    }
}

/// Starts an EL0 executor pinned to `cpu` (`entry`: `race_user_executor`'s user address).
pub(super) fn start_executor(cpu: usize, entry: u64) {
    let mailbox = &MAILBOXES[cpu];
    mailbox.posted.store(0, Ordering::Relaxed);
    mailbox.served.store(0, Ordering::Relaxed);
    mailbox.stop.store(false, Ordering::Relaxed);
    mailbox.stepped.store(false, Ordering::Relaxed);
    // Masked from spawn to the move, so the task never starts on this CPU.
    let _masked = IrqMask::new();
    let id = user::spawn("race executor", entry, [0; 3], Options::DEFAULT).expect("a free task slot");
    task::set_affinity(id, CpuMask::one(cpu));
    EXECUTORS[cpu].store(id.0, Ordering::Relaxed);
}

pub(super) fn executor_entry() -> u64 {
    user_address(&raw const race_user_executor)
}

/// Tells every executor to exit and waits for each (a killed one has ended already).
pub(super) fn stop_executors() -> bool {
    let mut exited = true;
    for (cpu, executor) in EXECUTORS.iter().enumerate() {
        MAILBOXES[cpu].stop.store(true, Ordering::Release);
        cpu::send_event();
        let id = executor.swap(NONE, Ordering::Relaxed);
        if id != NONE {
            exited &= task::join(TaskId(id)) == State::Exited && user::exit_code(TaskId(id)) == Some(0);
        }
    }
    exited
}

fn probe_result(argument: u64) -> u64 {
    argument + 5
}

fn sequence_name(method: Method, arm: bool) -> &'static str {
    match (method, arm) {
        (Method::SingleStep, true) => "uprobe single-step insert",
        (Method::SingleStep, false) => "uprobe single-step remove",
        (Method::BrkStep, true) => "uprobe brk-step insert",
        (Method::BrkStep, false) => "uprobe brk-step remove",
        (Method::Simulate, true) => "uprobe simulate insert",
        (Method::Simulate, false) => "uprobe simulate remove",
        (Method::Detour, true) => "uprobe detour insert",
        (Method::Detour, false) => "uprobe detour remove",
    }
}

/// The stores the design names. Inserting: the probe's three XOL words (slot `[insn, BRK, BRK]`,
/// filler for simulate, or trampoline `[SVC, insn, B back]`) in each task slot's XOL page, then
/// the BRK or B: "after" from that last store. Removing: the original word (the switch), then
/// after the grace period the slot and the trampoline (four words each) refilled in every page.
const INSERT_STORES: usize = 3 * TASK_SLOTS + 1;
const REMOVE_STORES: usize = 1 + 2 * 4 * TASK_SLOTS;

/// One uprobe's insertion and removal on the race target, stepped, with an EL0 executor on
/// every other CPU: `(insert verdict, remove verdict)`.
fn race_uprobe(method: Method) -> (Finding, Finding) {
    let target = user_address(&raw const race_user_target);
    start_executors();
    let insert = Sequence {
        name: sequence_name(method, true),
        before: NOT_HIT,
        after: HIT,
        stores: INSERT_STORES,
        switch_at: Some(INSERT_STORES),
        result: probe_result,
    };
    let inserted = sweep_with(&insert, user_execution, || {
        uprobes::register(target, method, count_target_hit, None)
            .inspect_err(|error| defmt::error!("  uprobe register: {}", error))
            .is_ok()
    });
    let remove = Sequence {
        name: sequence_name(method, false),
        before: HIT,
        after: NOT_HIT,
        stores: REMOVE_STORES,
        switch_at: Some(1),
        result: probe_result,
    };
    let removed = sweep_with(&remove, user_execution, || uprobes::unregister(target).is_ok());
    if !stop_executors() && removed == Finding::Correct {
        defmt::error!("  an EL0 executor did not exit cleanly");
        return (inserted, Finding::Coverage);
    }
    (inserted, removed)
}

/// Registers the executors' gate; runs `body`; unregisters it.
pub(super) fn with_gate(body: impl FnOnce() -> Outcome) -> Outcome {
    let gate_address = user_address(&raw const race_user_gate);
    check!(uprobes::register(gate_address, Method::Simulate, gate, None).is_ok());
    let outcome = body();
    check!(uprobes::unregister(gate_address).is_ok());
    outcome
}

/// Every uprobe method's insertion (XOL words in every task's page, then BRK or B) and removal
/// (original word, grace period, slot and trampoline poisoned), stepped store by store with an
/// EL0 task on every other CPU calling the probed user function at each point: "before" until
/// the BRK or B is stored, "after" from there on; removal "after" from the restored word.
pub(super) fn race_uprobe_insert_remove(context: &Context) -> Outcome {
    if let Some(skip) = needs_cpus() {
        return Ok(skip);
    }
    if !context.icount {
        return Ok(Verdict::Skipped(NEEDS_ICOUNT));
    }
    with_gate(|| {
        for method in Method::ALL {
            let (inserted, removed) = race_uprobe(method);
            check_eq!(inserted as u64, Finding::Correct as u64);
            check_eq!(removed as u64, Finding::Correct as u64);
        }
        Ok(Verdict::Passed)
    })
}

/// The test-only wrong removal (`inject::Fault::UprobePoisonBeforeRestore`: the slot and trampoline
/// poisoned before the word is restored, while the BRK or B still leads there) is caught: a
/// detour or stepped execution between the two runs into the poison (a user fault: wrong), and
/// a simulated one, which never enters its slot, switches only at the restore, the last store
/// (`SwitchedElsewhere`). The correct sequence passes again afterwards.
pub(super) fn race_uprobe_wrong_sequence_is_caught(context: &Context) -> Outcome {
    if let Some(skip) = needs_cpus() {
        return Ok(skip);
    }
    if !context.icount {
        return Ok(Verdict::Skipped(NEEDS_ICOUNT));
    }
    with_gate(|| {
        inject::set(Fault::UprobePoisonBeforeRestore, true);
        let detour = race_uprobe(Method::Detour);
        let single_step = race_uprobe(Method::SingleStep);
        let simulate = race_uprobe(Method::Simulate);
        inject::set(Fault::UprobePoisonBeforeRestore, false);
        check_eq!(detour.0 as u64, Finding::Correct as u64);
        check_eq!(detour.1 as u64, Finding::WrongBehaviour as u64);
        check_eq!(single_step.1 as u64, Finding::WrongBehaviour as u64);
        check_eq!(simulate.1 as u64, Finding::SwitchedElsewhere as u64);
        check!(race_uprobe(Method::Detour) == (Finding::Correct, Finding::Correct));
        Ok(Verdict::Passed)
    })
}
