//! Cross-CPU calls, and patch races found deterministically.
//!
//! The patcher is stepped one store at a time: `arch::patch`'s test-only step hook runs after
//! every single instruction or literal store, on the patching CPU (CPU 0), inside the patcher's
//! locks. At point 0 (before the first store) and after every store, every other CPU runs the
//! patched site to completion through `cross_call::run_on` (one CPU at a time), and the outcome
//! is classified as the sequence's "before" or "after" behaviour, or as wrong (a wrong result,
//! an unexpected hit count, a fault). Each sweep then checks its own coverage: every planned
//! (point, CPU) interleaving was checked, both behaviours were seen, and the behaviour switched
//! exactly once, at the store the design names. See docs/design/races.md.

use super::{Context, Outcome, Test, Verdict, check, check_eq};
use crate::arch::exception::ExceptionFrame;
use crate::arch::{patch, percpu, step};
use crate::ftrace::{self, Scheme, tracers::Counter};
use crate::inject::{self, Fault};
use crate::probes::{self as kprobes, Method, Registers};
use crate::sync::IrqSpinLock;
use crate::task::cross_call::{self, CrossCallError};
use crate::task::{cpus, stacks::CPUS};
use core::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

mod calls;
mod grace;
mod ugrace;
mod uprobe;

pub const TESTS: &[Test] = &[
    Test { name: "cross_call_runs_on_every_cpu", run: cross_call_runs_on_every_cpu },
    Test { name: "cross_call_reports_what_failed", run: cross_call_reports_what_failed },
    Test { name: "smp_cross_calls_to_each_other_at_once", run: calls::smp_cross_calls_to_each_other_at_once },
    Test { name: "race_kprobe_arm_disarm", run: race_kprobe_arm_disarm },
    Test { name: "race_ftrace_enable_disable", run: race_ftrace_enable_disable },
    Test { name: "race_ftrace_literal_swaps", run: race_ftrace_literal_swaps },
    Test { name: "race_wrong_sequences_are_caught", run: race_wrong_sequences_are_caught },
    Test { name: "race_kprobe_unregister_waits", run: grace::race_kprobe_unregister_waits },
    Test { name: "race_brk_after_unpublish_resumes", run: grace::race_brk_after_unpublish_resumes },
    Test {
        name: "race_unregister_without_grace_period_is_caught",
        run: grace::race_unregister_without_grace_period_is_caught,
    },
    Test { name: "race_uprobe_insert_remove", run: uprobe::race_uprobe_insert_remove },
    Test { name: "race_uprobe_wrong_sequence_is_caught", run: uprobe::race_uprobe_wrong_sequence_is_caught },
    Test { name: "race_uprobe_unregister_waits", run: ugrace::race_uprobe_unregister_waits },
    Test {
        name: "race_uprobe_detour_preempted_in_trampoline",
        run: ugrace::race_uprobe_detour_preempted_in_trampoline,
    },
];

const ONE_CPU: &str = "one CPU (run with --smp N)";

// The site runner. `race_call(argument, function, landing)` paints the 1 KiB below its frame,
// calls `function(argument)` with every callee-saved register and x18 saved, and at `1:` (where
// the race trap hook resumes a call that faulted: `landing` holds the SP and that address)
// measures how deep the call wrote below the frame into `landing[2]`. A plain leaf function
// writes at most its own frame record; the ftrace trampoline writes 128 bytes.
core::arch::global_asm!(
    r#"
    .section .text.noprobe, "ax"
    .balign 4
    .global race_call
race_call:
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
    mov     x6, #{paint}
    sub     x5, x3, #{depth}
0:  str     x6, [x5], #8
    cmp     x5, x3
    b.ne    0b
    blr     x1
1:  mov     x3, sp
    mov     x6, #{paint}
    sub     x5, x3, #{depth}
2:  cmp     x5, x3
    b.eq    3f
    ldr     x7, [x5]
    cmp     x7, x6
    b.ne    3f
    add     x5, x5, #8
    b       2b
3:  sub     x7, x3, x5
    ldp     x18, x2, [sp, #96]
    str     x7, [x2, #16]
    ldp     x19, x20, [sp, #16]
    ldp     x21, x22, [sp, #32]
    ldp     x23, x24, [sp, #48]
    ldp     x25, x26, [sp, #64]
    ldp     x27, x28, [sp, #80]
    ldp     x29, x30, [sp], #112
    ret

    .section .text.race_targets, "ax"
    .balign 8
    .global race_probe_target
race_probe_target:
    mov     x1, x0
    add     x0, x1, #5
    ret
"#,
    paint = const PAINT,
    depth = const PAINTED_BYTES,
);

/// The painted word (a logical immediate) and how far below the frame it is painted.
const PAINT: u64 = 0x5555_5555_5555_5555;
const PAINTED_BYTES: u64 = 1024;
/// A call that wrote this deep below its caller went through the ftrace trampoline.
const TRAMPOLINE_DEPTH: u64 = 128;

unsafe extern "C" {
    /// Runs `function(argument)`; see the asm above. `landing` points at a `Landing`'s words.
    fn race_call(argument: u64, function: u64, landing: *mut u64) -> u64;
    fn race_probe_target(argument: u64) -> u64;
}

/// Where a faulting site call resumes, per CPU: [SP, resume address, depth written], and
/// whether a call is running (the trap hook takes a fault only then).
#[repr(C)]
struct Landing {
    words: [AtomicU64; 3],
    armed: AtomicBool,
    /// The ESR of the fault taken, 0 if none.
    fault: AtomicU64,
}

static LANDINGS: [Landing; CPUS] = [const {
    Landing { words: [const { AtomicU64::new(0) }; 3], armed: AtomicBool::new(false), fault: AtomicU64::new(0) }
}; CPUS];

/// The tests' trap hook calls this first: a synchronous exception on a CPU running a site call
/// ends that call at its landing (recorded as a fault) instead of ending the run.
#[unsafe(link_section = ".text.noprobe")]
pub fn on_trap(frame: &mut ExceptionFrame) -> bool {
    if grace::on_step(frame) {
        return true;
    }
    let landing = &LANDINGS[percpu::this_cpu_index()];
    if !landing.armed.load(Ordering::Relaxed) {
        return false;
    }
    landing.armed.store(false, Ordering::Relaxed);
    landing.fault.store(frame.esr | 1 << 63, Ordering::Relaxed);
    frame.sp = landing.words[0].load(Ordering::Relaxed);
    frame.x[29] = frame.sp;
    frame.elr = landing.words[1].load(Ordering::Relaxed);
    frame.spsr &= !step::SPSR_SS;
    step::set_mdscr(step::MDSCR_KDE | step::MDSCR_SS, false);
    // A fault in a poisoned XOL slot leaves this CPU's probe state "stepping": the execution
    // ended, so is the hit.
    let probe = &percpu::this_cpu().probe;
    probe.status.store(0, Ordering::Relaxed);
    probe.current.store(core::ptr::null_mut(), Ordering::Relaxed);
    true
}

/// What one execution of the site did, on the CPU that ran it.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
struct Execution {
    result: u64,
    hits: u64,
    depth: u64,
    /// ESR | 1 << 63 of a fault, else 0.
    fault: u64,
}

/// Per CPU: what its last execution did (written by that CPU, read after `run_on` returned).
static EXECUTIONS: [[AtomicU64; 4]; CPUS] = [const { [const { AtomicU64::new(0) }; 4] }; CPUS];

/// The site the executing CPUs call, and where they count hits.
static SITE: AtomicU64 = AtomicU64::new(0);
static HIT_SOURCE: AtomicUsize = AtomicUsize::new(KPROBE_HITS);
const KPROBE_HITS: usize = 0;
const FTRACE_HITS: usize = 1;

/// Kprobe hits, counted by the race probes' pre-handler on whichever CPU hits.
static PROBE_HITS: AtomicU64 = AtomicU64::new(0);
/// The ftrace tracers of the race tests (per-CPU counters).
static TRACER: Counter = Counter::new();
static SECOND_TRACER: Counter = Counter::new();

fn count_hit(_: &mut Registers) {
    PROBE_HITS.fetch_add(1, Ordering::Relaxed);
}

fn hits() -> u64 {
    match HIT_SOURCE.load(Ordering::Relaxed) {
        KPROBE_HITS => PROBE_HITS.load(Ordering::Relaxed),
        _ => TRACER.hits() + SECOND_TRACER.hits(),
    }
}

/// A site runner: `race_call`, or `grace::race_step_call` (the same contract).
type Runner = unsafe extern "C" fn(u64, u64, *mut u64) -> u64;

/// Runs on an executing CPU (through `run_on`): one call of the site, recorded in `EXECUTIONS`.
fn execute(argument: u64) -> u64 {
    execute_with(argument, race_call)
}

/// One call of the site through `runner`, recorded in `EXECUTIONS`.
fn execute_with(argument: u64, runner: Runner) -> u64 {
    let cpu = percpu::this_cpu_index();
    let landing = &LANDINGS[cpu];
    let before = hits();
    landing.fault.store(0, Ordering::Relaxed);
    landing.armed.store(true, Ordering::Relaxed);
    // SAFETY: SITE is a function taking and returning one u64 (the race targets); the runner
    // preserves every register the ABI says a call preserves, also after a fault (the trap hook
    // resumes it at its landing with its SP).
    let result = unsafe { runner(argument, SITE.load(Ordering::Relaxed), landing.words.as_ptr() as *mut u64) };
    landing.armed.store(false, Ordering::Relaxed);
    if landing.fault.load(Ordering::Relaxed) != 0 {
        // A kretprobe's hijacked return of the call that faulted is abandoned: dropped now (the
        // record's active count), not at the next hit in this context.
        let sp: u64;
        // SAFETY: reads SP.
        unsafe { core::arch::asm!("mov {}, sp", out(reg) sp, options(nomem, nostack, preserves_flags)) };
        kprobes::kretprobe::drop_abandoned_returns(sp);
    }
    let record = &EXECUTIONS[cpu];
    record[0].store(result, Ordering::Relaxed);
    record[1].store(hits().wrapping_sub(before), Ordering::Relaxed);
    record[2].store(landing.words[2].load(Ordering::Relaxed), Ordering::Relaxed);
    record[3].store(landing.fault.load(Ordering::Relaxed), Ordering::Relaxed);
    0
}

/// Runs the site once on `cpu` with `argument` and returns what it did; `None` when the CPU
/// could not run it (the reason is logged).
type Executor = fn(usize, u64) -> Option<Execution>;

/// The kernel sites' executor: one call through `run_on`.
fn kernel_execution(cpu: usize, argument: u64) -> Option<Execution> {
    match cross_call::run_on(cpu, execute, argument) {
        Ok(_) => Some(last_execution(cpu)),
        Err(error) => {
            defmt::error!("  cpu {=usize}: {}", cpu, error);
            None
        }
    }
}

fn last_execution(cpu: usize) -> Execution {
    let record = &EXECUTIONS[cpu];
    Execution {
        result: record[0].load(Ordering::Relaxed),
        hits: record[1].load(Ordering::Relaxed),
        depth: record[2].load(Ordering::Relaxed),
        fault: record[3].load(Ordering::Relaxed),
    }
}

/// One behaviour of the site: the hits a call counts and, for ftrace, whether it went through
/// the trampoline (`None`: not observed).
#[derive(Clone, Copy)]
struct Behaviour {
    hits: u64,
    trampoline: Option<bool>,
}

impl Behaviour {
    fn matches(&self, execution: &Execution, expected_result: u64) -> bool {
        execution.fault == 0
            && execution.result == expected_result
            && execution.hits == self.hits
            && self.trampoline.is_none_or(|entered| entered == (execution.depth >= TRAMPOLINE_DEPTH))
    }
}

/// A patch sequence under test: its name, what the site does before and after it, the stores
/// the design says it makes, and the store after which the behaviour is "after".
struct Sequence {
    name: &'static str,
    before: Behaviour,
    after: Behaviour,
    stores: usize,
    /// `None`: the sequence changes nothing a call can observe (a scheme change: the tracers
    /// are called either way); every execution must still be "before" (= "after").
    switch_at: Option<usize>,
    /// The site's result for an argument.
    result: fn(u64) -> u64,
}

/// What a sweep saw.
#[derive(Clone, Copy)]
struct Sweep {
    name: &'static str,
    before: Behaviour,
    after: Behaviour,
    result: fn(u64) -> u64,
    executor: Executor,
    /// The current point: 0 before the first store, n after the n-th.
    point: usize,
    checked: usize,
    wrong: usize,
    unreachable: usize,
    last_before: Option<usize>,
    first_after: Option<usize>,
    /// The last "before" seen after an "after" (the behaviour went back).
    before_after_after: Option<usize>,
}

static SWEEP: IrqSpinLock<Option<Sweep>> = IrqSpinLock::new(None);

/// Has every other online CPU run the site once, and classifies each execution.
fn observe(sweep: &mut Sweep) {
    for cpu in (0..cpus::online()).filter(|&cpu| cpu != percpu::this_cpu_index()) {
        let argument = (sweep.point * CPUS + cpu) as u64 + 1000;
        let expected = (sweep.result)(argument);
        match (sweep.executor)(cpu, argument) {
            None => {
                sweep.unreachable += 1;
                if sweep.unreachable <= 3 {
                    defmt::error!("  race {=str}: point {=usize}, cpu {=usize}: not run", sweep.name, sweep.point, cpu);
                }
            }
            Some(execution) => {
                sweep.checked += 1;
                if sweep.before.matches(&execution, expected) {
                    sweep.last_before = Some(sweep.point);
                    if sweep.first_after.is_some() {
                        sweep.before_after_after = Some(sweep.point);
                    }
                } else if sweep.after.matches(&execution, expected) {
                    sweep.first_after.get_or_insert(sweep.point);
                } else {
                    sweep.wrong += 1;
                    if sweep.wrong <= 3 {
                        defmt::warn!(
                            "  race {=str}: point {=usize}, cpu {=usize}: neither before nor after: result {=u64:#x} (expected {=u64:#x}), hits {=u64}, depth {=u64}, fault esr {=u64:#x}",
                            sweep.name,
                            sweep.point,
                            cpu,
                            execution.result,
                            expected,
                            execution.hits,
                            execution.depth,
                            execution.fault & !(1 << 63)
                        );
                    }
                }
            }
        }
    }
}

/// The step hook: one more store done; every other CPU runs the site.
fn on_store(_address: u64) {
    let mut sweep = SWEEP.lock();
    if let Some(sweep) = sweep.as_mut() {
        sweep.point += 1;
        observe(sweep);
    }
}

/// Why a sweep is not what the design says (the first check that failed).
#[derive(Clone, Copy, PartialEq, Eq, Debug, defmt::Format)]
enum Finding {
    Correct,
    /// Some execution was neither "before" nor "after".
    WrongBehaviour,
    /// The behaviour switched elsewhere than at the named store, or went back.
    SwitchedElsewhere,
    /// The stores or interleavings were not the planned number, or a CPU was unreachable.
    Coverage,
    /// Direction (b): unregistration returned while a CPU was still held inside the probe.
    NotWaited,
}

/// Runs `patcher` stepped, with every other CPU running the site at every point; checks and
/// prints the sweep. Returns the first failed check.
fn sweep(sequence: &Sequence, patcher: impl FnOnce() -> bool) -> Finding {
    sweep_with(sequence, kernel_execution, patcher)
}

/// [`sweep`] with the site run by `executor`. A wrong execution is reported before missing
/// coverage: an executor killed by a wrong execution (an EL0 task) runs no later point.
fn sweep_with(sequence: &Sequence, executor: Executor, patcher: impl FnOnce() -> bool) -> Finding {
    let mut state = Sweep {
        name: sequence.name,
        before: sequence.before,
        after: sequence.after,
        result: sequence.result,
        executor,
        point: 0,
        checked: 0,
        wrong: 0,
        unreachable: 0,
        last_before: None,
        first_after: None,
        before_after_after: None,
    };
    observe(&mut state);
    *SWEEP.lock() = Some(state);
    patch::set_step_hook(Some(on_store));
    let patched = patcher();
    patch::set_step_hook(None);
    let state = SWEEP.lock().take().expect("the sweep was installed above");
    let others = cpus::online() - 1;
    let planned = (sequence.stores + 1) * others;
    defmt::info!(
        "race {=str}: {=usize} interleavings ({=usize} stores: {=usize} points x {=usize} CPUs; planned {=usize}), before up to point {=?}, after from point {=?} (design: {=?}), {=usize} wrong",
        sequence.name,
        state.checked,
        state.point,
        state.point + 1,
        others,
        planned,
        state.last_before,
        state.first_after,
        sequence.switch_at,
        state.wrong
    );
    if state.wrong != 0 {
        Finding::WrongBehaviour
    } else if !patched || state.unreachable != 0 || state.point != sequence.stores || state.checked != planned {
        Finding::Coverage
    } else if state.before_after_after.is_some()
        || state.first_after != sequence.switch_at
        || state.last_before != Some(sequence.switch_at.map_or(sequence.stores, |store| store - 1))
    {
        Finding::SwitchedElsewhere
    } else {
        Finding::Correct
    }
}

fn needs_cpus() -> Option<Verdict> {
    (cpus::online() < 2).then_some(Verdict::Skipped(ONE_CPU))
}

fn cross_call_echo(argument: u64) -> u64 {
    argument * 7 + percpu::this_cpu_index() as u64
}

/// Every online CPU runs a call and returns its result: on itself directly, on the others
/// through the mailbox (their CPU index in the result shows where it ran).
fn cross_call_runs_on_every_cpu(_: &Context) -> Outcome {
    if let Some(skip) = needs_cpus() {
        return Ok(skip);
    }
    for round in 0..3u64 {
        for cpu in 0..cpus::online() {
            let result = cross_call::run_on(cpu, cross_call_echo, round * 100 + cpu as u64);
            check!(result == Ok((round * 100 + cpu as u64) * 7 + cpu as u64));
        }
    }
    Ok(Verdict::Passed)
}

/// Set by the test to let `hold_until_released` return.
static RELEASE: AtomicBool = AtomicBool::new(false);

/// A call that does not finish until the test says so.
fn hold_until_released(argument: u64) -> u64 {
    while !RELEASE.load(Ordering::Acquire) {
        // SAFETY: waits for an event (the test's `sev`); no memory is touched.
        unsafe { core::arch::asm!("wfe", options(nomem, nostack, preserves_flags)) };
    }
    argument
}

/// A call to a CPU that does not exist or is not online returns that error at once; a call
/// that does not finish in time returns a timeout naming the CPU, the mailbox reports busy until
/// the call has finished, and then works again.
fn cross_call_reports_what_failed(_: &Context) -> Outcome {
    check!(cross_call::run_on(CPUS, cross_call_echo, 1) == Err(CrossCallError::NoSuchCpu(CPUS)));
    let online = cpus::online();
    if online < CPUS {
        check!(cross_call::run_on(online, cross_call_echo, 1) == Err(CrossCallError::Offline(online)));
    }
    if let Some(skip) = needs_cpus() {
        return Ok(skip);
    }
    // Another CPU than this one (the runner spreads tests over the CPUs; a call to this CPU
    // runs directly and would hold it forever).
    let cpu = if crate::arch::percpu::this_cpu_index() == online - 1 { online - 2 } else { online - 1 };
    RELEASE.store(false, Ordering::Release);
    let timed_out = cross_call::run_on_within(cpu, hold_until_released, 5, 2);
    check!(timed_out == Err(CrossCallError::Timeout { cpu, milliseconds: crate::arch::cpu::patience_ms(2) }));
    check!(cross_call::run_on(cpu, cross_call_echo, 1) == Err(CrossCallError::Busy(cpu)));
    RELEASE.store(true, Ordering::Release);
    // SAFETY: wakes the held CPU from `wfe`; the `dsb` makes RELEASE visible first.
    unsafe { core::arch::asm!("dsb ish", "sev", options(nomem, nostack, preserves_flags)) };
    check!(crate::arch::cpu::wait_until(100, || cross_call::is_idle(cpu)));
    check!(cross_call::run_on(cpu, cross_call_echo, 2) == Ok(14 + cpu as u64));
    Ok(Verdict::Passed)
}

fn unlock_debug(_: u64) -> u64 {
    step::unlock_debug();
    0
}

/// Every other CPU can take software-step exceptions (the OS lock is per CPU, cleared at boot
/// only on CPU 0).
fn unlock_debug_everywhere() -> bool {
    (1..cpus::online()).all(|cpu| cross_call::run_on(cpu, unlock_debug, 0).is_ok())
}

fn probe_result(argument: u64) -> u64 {
    argument + 5
}

const NOT_HIT: Behaviour = Behaviour { hits: 0, trampoline: None };
const HIT: Behaviour = Behaviour { hits: 1, trampoline: None };

/// The words of the probe's slot-area chunk that are not filler: what unregistering clears.
fn chunk_words_in_use() -> usize {
    let filler = probes::encode_brk(crate::arch::exception::BRK_KPROBE_STEP).0;
    let area = kprobes::slot_area_address();
    // SAFETY: the slot area is mapped kernel text.
    (0..kprobes::SLOT_AREA_SIZE / 4)
        .filter(|&word| unsafe { core::ptr::read_volatile((area + 4 * word) as *const u32) } != filler)
        .count()
}

/// The stores registering a probe makes, by the design: the slot's two words (instruction,
/// BRK #6) for the stepped methods, the whole trampoline (code and literal pool) for detour,
/// then the BRK or B at the probed address.
fn registration_stores(method: Method, address: u64) -> usize {
    match method {
        Method::Simulate => 1,
        Method::SingleStep | Method::BrkStep => 3,
        Method::Detour => {
            // SAFETY: kernel text, readable.
            let original = unsafe { core::ptr::read_volatile(address as *const u32) };
            let classification = probes::classify(probes::Insn(original));
            let base = kprobes::slot_area_address();
            let filler = probes::encode_brk(crate::arch::exception::BRK_KPROBE_STEP).0;
            match probes::detour_trampoline(base, filler, address, original, &classification, base, base, base) {
                Ok(trampoline) => trampoline.code().len() + trampoline.literals().len() + 1,
                Err(_) => 0,
            }
        }
    }
}

/// One probe's arming and disarming, stepped: `(register verdict, unregister verdict)`.
fn race_probe(method: Method) -> (Finding, Finding) {
    let address = race_probe_target as *const () as u64;
    SITE.store(address, Ordering::Relaxed);
    HIT_SOURCE.store(KPROBE_HITS, Ordering::Relaxed);
    let in_use = chunk_words_in_use();
    let stores = registration_stores(method, address);
    let arm = Sequence {
        name: method_name(method, true),
        before: NOT_HIT,
        after: HIT,
        stores,
        switch_at: Some(stores),
        result: probe_result,
    };
    let armed = sweep(&arm, || kprobes::register(address, method, count_hit, None).is_ok());
    let cleared = chunk_words_in_use() - in_use;
    let disarm = Sequence {
        name: method_name(method, false),
        before: HIT,
        after: NOT_HIT,
        stores: 1 + cleared,
        switch_at: Some(1),
        result: probe_result,
    };
    let disarmed = sweep(&disarm, || kprobes::unregister(address).is_ok());
    (armed, disarmed)
}

fn method_name(method: Method, arm: bool) -> &'static str {
    match (method, arm) {
        (Method::SingleStep, true) => "kprobe single-step arm",
        (Method::SingleStep, false) => "kprobe single-step disarm",
        (Method::BrkStep, true) => "kprobe brk-step arm",
        (Method::BrkStep, false) => "kprobe brk-step disarm",
        (Method::Simulate, true) => "kprobe simulate arm",
        (Method::Simulate, false) => "kprobe simulate disarm",
        (Method::Detour, true) => "kprobe detour install",
        (Method::Detour, false) => "kprobe detour removal",
    }
}

/// Every kprobe method's arming (slot or trampoline, then BRK or B) and disarming (original
/// word, then the slot cleared), stepped store by store with every other CPU calling the probed
/// function at each point: "before" until the BRK or B is stored, "after" from there on.
fn race_kprobe_arm_disarm(_: &Context) -> Outcome {
    if let Some(skip) = needs_cpus() {
        return Ok(skip);
    }
    check!(unlock_debug_everywhere());
    for method in Method::ALL {
        let (armed, disarmed) = race_probe(method);
        check!(armed == Finding::Correct);
        check!(disarmed == Finding::Correct);
    }
    Ok(Verdict::Passed)
}

#[inline(never)]
extern "C" fn race_traced(argument: u64) -> u64 {
    argument.wrapping_mul(3).wrapping_add(1)
}

fn traced_result(argument: u64) -> u64 {
    argument.wrapping_mul(3).wrapping_add(1)
}

const UNTRACED: Behaviour = Behaviour { hits: 0, trampoline: Some(false) };
const TRACED: Behaviour = Behaviour { hits: 1, trampoline: Some(true) };

/// One tracer's registration and unregistration on the race site under `scheme`, stepped.
fn race_tracer(scheme: Scheme, names: [&'static str; 2]) -> (Finding, Finding) {
    let function = race_traced as *const () as u64;
    SITE.store(function, Ordering::Relaxed);
    HIT_SOURCE.store(FTRACE_HITS, Ordering::Relaxed);
    if ftrace::set_scheme(scheme).is_err() {
        return (Finding::Coverage, Finding::Coverage);
    }
    // Enabling: the literal (nop ops -> the tracer or the list), then NOP -> BL: "after" from
    // the BL. Disabling: the literal back to nop ops (the tracer is no longer called), then
    // BL -> NOP: "after" from the literal.
    let enable = Sequence {
        name: names[0],
        before: UNTRACED,
        after: TRACED,
        stores: 2,
        switch_at: Some(2),
        result: traced_result,
    };
    let mut tracer = None;
    let enabled = sweep(&enable, || {
        tracer = ftrace::register_where(&TRACER.ops, |entry| entry + 8 == function).ok();
        tracer.is_some()
    });
    let Some(tracer) = tracer else { return (enabled, Finding::Coverage) };
    let disable = Sequence {
        name: names[1],
        before: TRACED,
        after: Behaviour { hits: 0, trampoline: None },
        stores: 2,
        switch_at: Some(1),
        result: traced_result,
    };
    let disabled = sweep(&disable, || ftrace::unregister(tracer).is_ok());
    (enabled, disabled)
}

/// ftrace's NOP <-> BL and literal stores under `call-ops` and `vector` (one tracer: the literal
/// is the tracer's ops) and `list` (the list ops), stepped with every other CPU calling the traced function at each point.
fn race_ftrace_enable_disable(_: &Context) -> Outcome {
    if let Some(skip) = needs_cpus() {
        return Ok(skip);
    }
    if ftrace::site_state(race_traced as *const () as u64).is_none() {
        return Ok(Verdict::Skipped("no patchable function entries (plain)"));
    }
    let call_ops = race_tracer(Scheme::CallOps, ["ftrace call-ops enable", "ftrace call-ops disable"]);
    let list = race_tracer(Scheme::List, ["ftrace list enable", "ftrace list disable"]);
    let vector = race_tracer(Scheme::Vector, ["ftrace vector enable", "ftrace vector disable"]);
    check!(ftrace::set_scheme(Scheme::CallOps).is_ok());
    check!(call_ops == (Finding::Correct, Finding::Correct));
    check!(list == (Finding::Correct, Finding::Correct));
    check!(vector == (Finding::Correct, Finding::Correct));
    Ok(Verdict::Passed)
}

const TRACED_ONCE: Behaviour = Behaviour { hits: 1, trampoline: Some(true) };
const TRACED_TWICE: Behaviour = Behaviour { hits: 2, trampoline: Some(true) };

/// A one-store literal sequence on the race site (already traced), stepped.
fn literal_sweep(name: &'static str, before: Behaviour, after: Behaviour, patcher: impl FnOnce() -> bool) -> Finding {
    let switch_at = (before.hits != after.hits).then_some(1);
    sweep(&Sequence { name, before, after, stores: 1, switch_at, result: traced_result }, patcher)
}

/// The call-ops literal swaps while the BL stays: a second tracer joins the site (the literal
/// goes from the first tracer's ops to the list or a vector: one store, "after" from it), the
/// scheme changes with both tracing (list <-> vector: the same calls either way), and the
/// second tracer leaves (back to the first's ops); with one tracer, call-ops <-> list.
fn race_ftrace_literal_swaps(_: &Context) -> Outcome {
    if let Some(skip) = needs_cpus() {
        return Ok(skip);
    }
    let function = race_traced as *const () as u64;
    if ftrace::site_state(function).is_none() {
        return Ok(Verdict::Skipped("no patchable function entries (plain)"));
    }
    SITE.store(function, Ordering::Relaxed);
    HIT_SOURCE.store(FTRACE_HITS, Ordering::Relaxed);
    let on_site = move |entry: u64| entry + 8 == function;
    check!(ftrace::set_scheme(Scheme::CallOps).is_ok());
    let Ok(first) = ftrace::register_where(&TRACER.ops, on_site) else { return Err(super::fail("first tracer")) };
    let mut findings = [Finding::Correct; 8];
    // One tracer: call-ops -> list -> call-ops swaps its own ops for the list ops and back.
    findings[6] =
        literal_sweep("ftrace scheme change call-ops -> list (own ops -> list)", TRACED_ONCE, TRACED_ONCE, || {
            ftrace::set_scheme(Scheme::List).is_ok()
        });
    findings[7] =
        literal_sweep("ftrace scheme change list -> call-ops (list -> own ops)", TRACED_ONCE, TRACED_ONCE, || {
            ftrace::set_scheme(Scheme::CallOps).is_ok()
        });
    for (index, (scheme, other)) in
        [(Scheme::CallOps, Scheme::Vector), (Scheme::Vector, Scheme::CallOps)].into_iter().enumerate()
    {
        let mut second = None;
        findings[3 * index] =
            literal_sweep(scheme_name(scheme, "second tracer joins"), TRACED_ONCE, TRACED_TWICE, || {
                second = ftrace::register_where(&SECOND_TRACER.ops, on_site).ok();
                second.is_some()
            });
        findings[3 * index + 1] =
            literal_sweep(scheme_name(other, "scheme change to"), TRACED_TWICE, TRACED_TWICE, || {
                ftrace::set_scheme(other).is_ok()
            });
        findings[3 * index + 2] =
            literal_sweep(scheme_name(other, "second tracer leaves"), TRACED_TWICE, TRACED_ONCE, || {
                second.is_some_and(|tracer| ftrace::unregister(tracer).is_ok())
            });
    }
    check!(ftrace::unregister(first).is_ok());
    check!(ftrace::set_scheme(Scheme::CallOps).is_ok());
    check!(findings == [Finding::Correct; 8]);
    Ok(Verdict::Passed)
}

fn scheme_name(scheme: Scheme, what: &'static str) -> &'static str {
    match (scheme, what) {
        (Scheme::CallOps, "second tracer joins") => "ftrace call-ops: second tracer joins (own ops -> list)",
        (Scheme::Vector, "second tracer joins") => "ftrace vector: second tracer joins (own ops -> vector)",
        (Scheme::Vector, "scheme change to") => "ftrace scheme change call-ops -> vector (list -> vector)",
        (Scheme::CallOps, "scheme change to") => "ftrace scheme change vector -> call-ops (vector -> list)",
        (Scheme::Vector, _) => "ftrace vector: second tracer leaves (vector -> own ops)",
        _ => "ftrace call-ops: second tracer leaves (list -> own ops)",
    }
}

/// The test-only wrong sequences make their race sweeps fail: the BL enabled before the
/// call-ops literal (the site calls nop ops through the trampoline: neither behaviour), the
/// branch to a detour trampoline written before the trampoline, and the trampoline cleared
/// before the original instruction is back (the branch lands in filler: a fault).
fn race_wrong_sequences_are_caught(_: &Context) -> Outcome {
    if let Some(skip) = needs_cpus() {
        return Ok(skip);
    }
    check!(unlock_debug_everywhere());
    inject::set(Fault::DetourBranchBeforeTrampoline, true);
    let (installed, removed) = race_probe(Method::Detour);
    inject::set(Fault::DetourBranchBeforeTrampoline, false);
    check_eq!(installed as u64, Finding::WrongBehaviour as u64);
    check_eq!(removed as u64, Finding::Correct as u64);

    inject::set(Fault::DetourTrampolineClearedFirst, true);
    let (installed, removed) = race_probe(Method::Detour);
    inject::set(Fault::DetourTrampolineClearedFirst, false);
    check_eq!(installed as u64, Finding::Correct as u64);
    check_eq!(removed as u64, Finding::WrongBehaviour as u64);

    if ftrace::site_state(race_traced as *const () as u64).is_some() {
        crate::inject::set(crate::inject::Fault::FtraceBlBeforeLiteral, true);
        let (enabled, disabled) = race_tracer(Scheme::CallOps, ["ftrace BL before literal", "ftrace disable"]);
        crate::inject::set(crate::inject::Fault::FtraceBlBeforeLiteral, false);
        check_eq!(enabled as u64, Finding::WrongBehaviour as u64);
        check_eq!(disabled as u64, Finding::Correct as u64);
    }
    // The correct sequences pass again afterwards (nothing stuck).
    check!(race_probe(Method::Detour) == (Finding::Correct, Finding::Correct));
    Ok(Verdict::Passed)
}
