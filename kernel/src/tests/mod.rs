//! The in-kernel test registry: named tests, run in order, one result line each.
//!
//! Line formats (xtask parses them): `test start: NAME`, `test ok: NAME`,
//! `test skipped: NAME (REASON)`, `test FAILED: NAME`, then
//! `tests done: P passed, F failed, S skipped`. A failing check also prints the expression,
//! file and line. A test that hangs is named by its start line; one that panics by the panic.
//! Beside them, the same results in KTAP (the kernel's test output format, read by kunit.py and
//! other TAP parsers): `KTAP version 1`, the plan `1..N`, then `ok N NAME`,
//! `ok N NAME # SKIP REASON` or `not ok N NAME`. `run=list` prints the selected names
//! instead, `test list: NAME` each and `tests listed: N`, and runs none.

mod fgraph;
mod foundation;
mod ftrace;
mod kasan;
mod kasan_fuzz;
mod kretprobe;
mod mte;
mod probes;
mod race;
mod replay;
mod smp;
mod stacktrace;
mod sweep;
mod trap;
mod user;

use crate::arch::exception::{Esr, ExceptionClass, ExceptionFrame, TEST_BRK_FIRST, TEST_BRK_LAST};
use crate::sync::IrqSpinLock;
use core::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

/// Why a test did not pass.
pub struct Failure {
    pub expression: &'static str,
    pub file: &'static str,
    pub line: u32,
}

pub enum Verdict {
    Passed,
    /// The test does not apply to this build or CPU (e.g. SCS checks in the `plain` variant).
    Skipped(&'static str),
}

pub type Outcome = Result<Verdict, Failure>;

pub struct Test {
    pub name: &'static str,
    pub run: fn(&Context) -> Outcome,
}

/// What a test may need to know about the run.
#[derive(Clone, Copy)]
pub struct Context {
    /// The PAuth algorithm xtask says this CPU variant has (`expect-pauth=`), if given.
    pub expect_pauth: Option<&'static str>,
    /// Whether QEMU runs with `-icount` (`icount=1`): timer IRQs land at exact instructions.
    pub icount: bool,
    /// Whether the filter selected one test alone (long runs, such as the whole sanitizer
    /// fuzz, run only then).
    pub alone: bool,
}

/// Why a test that needs frame records is skipped in a build without frame pointers.
pub const NO_FRAME_POINTERS: &str = "variant nofp has no frame pointers: frame-record walks are refused";

/// The skip of a test that needs frame records, in a build without frame pointers.
pub fn no_frame_pointers() -> Option<Outcome> {
    (!crate::build_info::FRAME_POINTERS).then_some(Ok(Verdict::Skipped(NO_FRAME_POINTERS)))
}

/// Fails the test with the expression and location when `condition` is false.
macro_rules! check {
    ($condition:expr) => {
        if !$condition {
            return Err($crate::tests::Failure { expression: stringify!($condition), file: file!(), line: line!() });
        }
    };
}

/// Fails the test, printing both values, when they differ.
macro_rules! check_eq {
    ($left:expr, $right:expr) => {{
        let (left, right) = ($left, $right);
        if left != right {
            defmt::error!("  left:  {=u64:#x}\n  right: {=u64:#x}", left as u64, right as u64);
            return Err($crate::tests::Failure {
                expression: concat!(stringify!($left), " == ", stringify!($right)),
                file: file!(),
                line: line!(),
            });
        }
    }};
}
pub(crate) use {check, check_eq};

/// A failure with a message instead of an expression.
pub fn fail(what: &'static str) -> Failure {
    Failure { expression: what, file: file!(), line: line!() }
}

/// Every test, in order.
const TESTS: &[&[Test]] = &[
    foundation::TESTS,
    trap::TESTS,
    stacktrace::TESTS,
    probes::TESTS,
    ftrace::TESTS,
    kretprobe::TESTS,
    fgraph::TESTS,
    sweep::TESTS,
    kasan::TESTS,
    kasan_fuzz::TESTS,
    mte::TESTS,
    user::TESTS,
    smp::TESTS,
    race::TESTS,
    replay::TESTS,
];

/// The tests' trap hook (installed by `run`): the probe tests' harness BRKs, then whatever a
/// `catch` expects; everything else stays unexpected.
#[unsafe(link_section = ".text.noprobe")]
fn on_trap(frame: &mut ExceptionFrame) -> bool {
    if (TEST_BRK_FIRST..=TEST_BRK_LAST).contains(&Esr(frame.esr).immediate())
        && Esr(frame.esr).class() == ExceptionClass::Brk
        && probes::on_brk(frame)
    {
        return true;
    }
    if race::on_trap(frame) {
        return true;
    }
    let class = Esr(frame.esr).class();
    if EXPECTED_CLASS.load(Ordering::SeqCst) == class as u64 + 1 {
        EXPECTED_CLASS.store(0, Ordering::SeqCst);
        *CAUGHT.lock() = Some(Caught { esr: frame.esr, far: frame.far, elr: frame.elr });
        frame.elr += 4;
        return true;
    }
    false
}

/// What a test-provoked exception looked like.
#[derive(Clone, Copy, Debug, defmt::Format)]
pub struct Caught {
    pub esr: u64,
    pub far: u64,
    pub elr: u64,
}

/// Exception class (plus one) that the running test expects to take and step over; 0 if none.
static EXPECTED_CLASS: AtomicU64 = AtomicU64::new(0);
static CAUGHT: IrqSpinLock<Option<Caught>> = IrqSpinLock::new(None);

/// Runs `f`, expecting it to raise one synchronous exception of `class` at EL1 that nothing in
/// the kernel owns. The tests' trap hook records it and resumes after the faulting instruction.
/// Returns what was caught, if anything.
pub fn catch(class: ExceptionClass, f: impl FnOnce()) -> Option<Caught> {
    *CAUGHT.lock() = None;
    EXPECTED_CLASS.store(class as u64 + 1, Ordering::SeqCst);
    f();
    EXPECTED_CLASS.store(0, Ordering::SeqCst);
    CAUGHT.lock().take()
}

static CURRENT: AtomicPtr<&'static str> = AtomicPtr::new(core::ptr::null_mut());

/// The test running now, for panic and exception reports.
pub fn current() -> Option<&'static str> {
    let current = CURRENT.load(Ordering::Relaxed);
    // SAFETY: CURRENT is null or points into the static TESTS table.
    (!current.is_null()).then(|| unsafe { *current })
}

pub struct Summary {
    pub passed: u32,
    pub failed: u32,
    pub skipped: u32,
}

/// Per CPU: tests it ran.
static TESTS_RUN: [AtomicU64; crate::task::stacks::CPUS] = [const { AtomicU64::new(0) }; crate::task::stacks::CPUS];

/// The test a secondary runs for `run_spread`, and its outcome.
static SPREAD_JOB: IrqSpinLock<Option<(TestFn, Context)>> = IrqSpinLock::new(None);
type TestFn = fn(&Context) -> Outcome;
static SPREAD_OUTCOME: IrqSpinLock<Option<Outcome>> = IrqSpinLock::new(None);

pub(super) extern "C" fn spread_task(_: u64) {
    let (run, context) = SPREAD_JOB.lock().take().expect("run_spread set the job");
    let outcome = run(&context);
    TESTS_RUN[crate::task::this_cpu()].fetch_add(1, Ordering::Relaxed);
    *SPREAD_OUTCOME.lock() = Some(outcome);
}

/// Runs test number `index` on one of the online CPUs in turn: every `online`-th test in the
/// main line on CPU 0 as before, the others in a task pinned to their CPU (the runner waits for
/// it). On one CPU, every test in the main line.
fn run_spread(index: usize, test: &Test, context: &Context) -> Outcome {
    // The (index mod online)-th online CPU: a CPU that did not come up may leave a gap.
    let online = crate::task::cpus::online();
    let cpu = (0..crate::task::stacks::CPUS)
        .filter(|&cpu| crate::task::cpus::is_online(cpu))
        .nth(index % online)
        .unwrap_or(0);
    if cpu == 0 || CPU0_ONLY.contains(&test.name) {
        let outcome = (test.run)(context);
        TESTS_RUN[crate::task::this_cpu()].fetch_add(1, Ordering::Relaxed);
        return outcome;
    }
    *SPREAD_JOB.lock() = Some((test.run, *context));
    let id = crate::task::spawn_on(crate::task::CpuMask::one(cpu), "test", spread_task, 0)
        .map_err(|_| fail("a free task slot for the test on its CPU"))?;
    let ended = crate::task::join(id);
    match SPREAD_OUTCOME.lock().take() {
        Some(outcome) => outcome,
        None => {
            defmt::error!("  the test's task on cpu {=usize} ended {}", cpu, ended);
            Err(fail("the test's task returned"))
        }
    }
}

/// Tests that stay on CPU 0's main line: they check that they run on the boot CPU, or need the
/// main line's deep stack of callers (a spread test's task has three frames below it).
const CPU0_ONLY: &[&str] = &["trap_this_cpu_is_tpidr_el1", "short_buffer_stops_at_its_length"];

/// Per CPU: context switches, IRQs (timer ticks and wake-up SGIs) and tests run.
fn print_cpu_summary() {
    for (cpu, tests_run) in TESTS_RUN.iter().enumerate().filter(|&(cpu, _)| crate::task::cpus::is_online(cpu)) {
        let data = crate::arch::percpu::cpu_data(cpu);
        defmt::info!(
            "cpu {=usize}: {=u64} context switches, {=u64} IRQs ({=u64} ticks, {=u64} wake-ups), {=u64} tests run",
            cpu,
            data.context_switches.load(Ordering::Relaxed),
            data.ticks.load(Ordering::Relaxed) + crate::task::cpus::wakes(cpu),
            data.ticks.load(Ordering::Relaxed),
            crate::task::cpus::wakes(cpu),
            tests_run.load(Ordering::Relaxed)
        );
    }
}

/// The tests `filter` selects, in the order `run` runs them: `test list: NAME` each, then
/// `tests listed: N`.
pub fn list(filter: &str) {
    let selected = TESTS.iter().flat_map(|tests| tests.iter()).filter(|test| test.name.contains(filter));
    let mut count = 0;
    for test in selected {
        defmt::info!("test list: {=str}", test.name);
        count += 1;
    }
    defmt::info!("tests listed: {=usize}", count);
}

pub fn run(filter: &str, expect_pauth: Option<&'static str>, icount: bool) -> Summary {
    crate::trap::install_test_hook(on_trap);
    let mut summary = Summary { passed: 0, failed: 0, skipped: 0 };
    let selected = || TESTS.iter().flat_map(|tests| tests.iter()).filter(|test| test.name.contains(filter));
    let context = Context { expect_pauth, icount, alone: selected().count() == 1 };
    defmt::info!("KTAP version 1");
    defmt::info!("1..{=usize}", selected().count());
    for (index, test) in selected().enumerate() {
        let number = index + 1;
        CURRENT.store(&test.name as *const &'static str as *mut _, Ordering::Relaxed);
        defmt::info!("test start: {=str}", test.name);
        match run_spread(index, test, &context) {
            Ok(Verdict::Passed) => {
                summary.passed += 1;
                defmt::info!("test ok: {=str}", test.name);
                defmt::info!("ok {=usize} {=str}", number, test.name);
            }
            Ok(Verdict::Skipped(reason)) => {
                summary.skipped += 1;
                defmt::info!("test skipped: {=str} ({=str})", test.name, reason);
                defmt::info!("ok {=usize} {=str} # SKIP {=str}", number, test.name, reason);
            }
            Err(failure) => {
                summary.failed += 1;
                defmt::error!(
                    "test FAILED: {=str}: check `{=str}` at {=str}:{=u32}",
                    test.name,
                    failure.expression,
                    failure.file,
                    failure.line
                );
                defmt::info!("not ok {=usize} {=str}", number, test.name);
            }
        }
    }
    CURRENT.store(core::ptr::null_mut(), Ordering::Relaxed);
    print_cpu_summary();
    defmt::info!(
        "shadow call stack high-water mark of the test task: {=usize} of {=u64} entries",
        crate::task::shadow_high_water_now(),
        crate::task::stacks::SHADOW_STACK_SIZE / 8 - 1
    );
    defmt::info!(
        "tests done: {=u32} passed, {=u32} failed, {=u32} skipped",
        summary.passed,
        summary.failed,
        summary.skipped
    );
    summary
}
