//! The run modes (`run=`): what the kernel does once it is up, each a function of its own.
//!
//! `kernel_main` calls exactly one, on the boot stack (32 KiB), and the test suite's deepest
//! chains need most of that stack below it. So each mode is never inlined: with one codegen
//! unit, a mode inlined into `kernel_main` puts its locals in `kernel_main`'s frame for every
//! other mode (once 26 KiB of it). And each starts by checking the headroom it was left, so a
//! frame that grows fails at once, by name, instead of overflowing somewhere deep.

use crate::arch::cpu;
use crate::args::Args;
use crate::power::{ExitStatus, exit};
use crate::{bench, demo, ftrace, mm, profile, sweep, task, tests};
use core::sync::atomic::{AtomicBool, Ordering};
use protocol::cmdline as key;

/// What to run (`run=`; default the demo).
#[derive(Clone, Copy, PartialEq, Eq, defmt::Format)]
pub enum Mode {
    Demo,
    Test,
    /// The tests `filter=` selects, in run order, without running them (kunit's
    /// `kunit.action=list`).
    List,
    Bench,
    /// Failure paths, for xtask to check that they end runs as they must.
    Panic,
    Fault,
    /// A BRK immediate nobody owns: the unexpected-exception report stops the kernel.
    UnownedBrk,
    Hang,
    /// A deliberate use-after-free outside any test: the sanitizer's report stops the kernel.
    UseAfterFree,
    /// A workload under the sampling profiler (`profile.*`).
    Profile,
    /// The probe sweep (`sweep/`): its own `sweep.*` words say what to sweep.
    Sweep,
}

/// The run's own options: the mode and what xtask says about the machine it runs on.
#[derive(Clone, Copy)]
pub struct Options {
    pub mode: Mode,
    /// `filter=SUBSTRING`: the tests whose names contain it.
    pub filter: &'static str,
    /// `icount=1`: QEMU runs with `-icount` (instruction-exact time).
    pub icount: bool,
    /// `expect-pauth=QARMA5|QARMA3|IMPDEF|none`: what xtask knows the CPU variant has.
    pub expect_pauth: Option<&'static str>,
}

impl Options {
    pub fn from_args(args: &Args) -> Self {
        let mut options = Self { mode: Mode::Demo, filter: "", icount: false, expect_pauth: None };
        for (name, value) in args.pairs() {
            match (name, value) {
                (key::RUN, mode) => match Mode::parse(mode) {
                    Some(mode) => options.mode = mode,
                    None => Args::ignoring(key::RUN, mode),
                },
                (key::FILTER, filter) => options.filter = filter,
                (key::ICOUNT, flag) => options.icount = flag == "1",
                (key::EXPECT_PAUTH, name) => options.expect_pauth = Some(name),
                _ => {}
            }
        }
        options
    }
}

impl Mode {
    fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "demo" => Self::Demo,
            "test" => Self::Test,
            "list" => Self::List,
            "bench" => Self::Bench,
            "sweep" => Self::Sweep,
            "panic" => Self::Panic,
            "fault" => Self::Fault,
            "unowned-brk" => Self::UnownedBrk,
            "hang" => Self::Hang,
            "use-after-free" => Self::UseAfterFree,
            "profile" => Self::Profile,
            _ => return None,
        })
    }
}

/// The function tracer started at boot (`ftrace=`), which a run mode stops at its end.
#[derive(Clone, Copy)]
pub struct BootTracer {
    pub tracer: ::ftrace::TracerId,
    pub pattern: &'static str,
}

/// The boot stack a run mode must still have below its own frame: the test suite checks that a
/// test starts with at most 8 KiB of the 32 KiB used (`boot_stack_leaves_the_tests_room`), and
/// the deepest tests and workloads need the rest.
const MIN_HEADROOM: u64 = 24 << 10;

/// Panics unless the boot stack has `MIN_HEADROOM` left below the caller's frame. Inlined, so
/// that SP is the run mode's own.
#[inline(always)]
fn check_headroom(mode: &str) {
    let sp: u64;
    // SAFETY: reads SP into a register; no memory is touched.
    unsafe { core::arch::asm!("mov {}, sp", out(reg) sp, options(nomem, nostack, preserves_flags)) };
    let boot = task::stacks::slot(0);
    if !boot.contains_stack(sp) {
        panic!("run={}: not on the boot stack (sp {:#x})", mode, sp);
    }
    let headroom = sp - boot.stack_base();
    if headroom < MIN_HEADROOM {
        panic!("run={}: {} bytes of the boot stack left at the mode's start, {} needed", mode, headroom, MIN_HEADROOM);
    }
}

#[inline(never)]
pub fn demo(icount: bool, boot_tracer: Option<BootTracer>) -> ! {
    check_headroom("demo");
    demo::run(&demo::Options { icount, boot_trace: boot_tracer.map(|boot| boot.pattern) });
    if let Some(boot) = boot_tracer {
        ftrace::tracers::stop_boot_trace(boot.tracer, icount);
    }
    demo::boot_probes::report(icount);
    exit(ExitStatus::Success)
}

#[inline(never)]
pub fn bench(request: &bench::Request, icount: bool) -> ! {
    check_headroom("bench");
    let result = bench::run(request.suites, &request.plan);
    demo::boot_probes::report(icount);
    match result {
        Ok(()) => exit(ExitStatus::Success),
        Err(_) => exit(ExitStatus::TestsFailed),
    }
}

#[inline(never)]
pub fn profile(request: &profile::Request, context: &profile::workload::Context) -> ! {
    check_headroom("profile");
    let result = profile::run(request, context);
    demo::boot_probes::report(context.icount);
    match result {
        Ok(true) => exit(ExitStatus::Success),
        // The profile is dumped either way; the status says the workload failed.
        Ok(false) => exit(ExitStatus::TestsFailed),
        Err(_) => exit(ExitStatus::UsageError),
    }
}

#[inline(never)]
pub fn test(options: &Options, boot_tracer: Option<BootTracer>) -> ! {
    check_headroom("test");
    let summary = tests::run(options.filter, options.expect_pauth, options.icount);
    if let Some(boot) = boot_tracer {
        ftrace::tracers::stop_boot_trace(boot.tracer, options.icount);
    }
    demo::boot_probes::report(options.icount);
    exit(if summary.failed == 0 { ExitStatus::Success } else { ExitStatus::TestsFailed })
}

#[inline(never)]
pub fn list(options: &Options) -> ! {
    check_headroom("list");
    tests::list(options.filter);
    exit(ExitStatus::Success)
}

#[inline(never)]
pub fn sweep(args: &Args) -> ! {
    check_headroom("sweep");
    let passed = sweep::run(args);
    exit(if passed { ExitStatus::Success } else { ExitStatus::TestsFailed })
}

#[inline(never)]
pub fn panic() -> ! {
    check_headroom("panic");
    if task::cpus::online() > 1 {
        start_panic_witness();
    }
    panic!("deliberate panic (run=panic)")
}

#[inline(never)]
pub fn fault() -> ! {
    check_headroom("fault");
    // SAFETY: deliberately reads an unmapped address (the boot stack's guard page) to check
    // that an unexpected exception is reported and ends the run.
    unsafe { core::ptr::read_volatile(mm::boot_stack_guard() as *const u64) };
    unreachable!("the guard page was readable")
}

#[inline(never)]
pub fn unowned_brk() -> ! {
    check_headroom("unowned-brk");
    // SAFETY: deliberately raises a BRK nobody owns, to check that the trap layer's
    // unexpected-exception report ends the run.
    unsafe { core::arch::asm!("brk #{}", const crate::arch::exception::BRK_UNOWNED, options(nomem, nostack)) };
    unreachable!("an unowned BRK returned")
}

#[inline(never)]
pub fn use_after_free() -> ! {
    check_headroom("use-after-free");
    let object = alloc::boxed::Box::new(0x5a_u64);
    let address = &*object as *const u64;
    drop(object);
    let reports = mm::kasan::report::count();
    // SAFETY: deliberately reads freed heap memory (still mapped RAM) to check that the
    // sanitizer reports it (and stops the kernel with kasan.fault=panic).
    let value = unsafe { core::ptr::read_volatile(address) };
    // With MTE in async mode the read only set a flag: this is its check point.
    #[cfg(feature = "mte")]
    mm::kasan::mte::check_async(0);
    if mm::kasan::report::count() > reports {
        // kasan.fault=report: the report was printed and the kernel goes on.
        exit(ExitStatus::Success)
    }
    defmt::error!("use-after-free not caught (read {=u64:#x}): no sanitizer checks in this build", value);
    exit(ExitStatus::TestsFailed)
}

#[inline(never)]
pub fn hang() -> ! {
    check_headroom("hang");
    defmt::info!("test start: deliberate_hang");
    loop {
        cpu::wait_for_interrupt();
    }
}

/// Set by `panic_witness` once it runs.
static PANIC_WITNESS_RUNNING: AtomicBool = AtomicBool::new(false);

/// `run=panic` on several CPUs: CPU 1 waits in this known function when CPU 0 panics, so the
/// report must show it under `cpu 1:` (xtask's failure path `panic-stops-cpus`).
#[inline(never)]
extern "C" fn panic_witness(_: u64) {
    PANIC_WITNESS_RUNNING.store(true, Ordering::Release);
    cpu::send_event();
    loop {
        cpu::wait_for_event();
    }
}

/// Set by the `run=panic` CPU just before it panics: `panic_too` panics at the same time.
static PANIC_NOW: AtomicBool = AtomicBool::new(false);

/// `run=panic` on 3 or more CPUs: CPU 2 panics too, while CPU 0 reports its panic (IRQs masked,
/// so no stop request gets in first). Whichever loses the race must stop and show its trace in
/// the winner's report, not exit silently.
#[inline(never)]
extern "C" fn panic_too(_: u64) {
    cpu::mask_interrupts();
    PANIC_WITNESS_RUNNING.store(true, Ordering::Release);
    cpu::send_event();
    while !PANIC_NOW.load(Ordering::Acquire) {
        core::hint::spin_loop();
    }
    // Lets CPU 0 claim the report first (it then waits up to 100 ms for this CPU to stop), so
    // the report names this CPU as the second; either order is handled the same way.
    cpu::wait_until(10, || false);
    panic!("second deliberate panic (run=panic, cpu 2)")
}

/// Runs `panic_witness` on CPU 1 (and `panic_too` on CPU 2) and waits until each runs (at most
/// a second each).
fn start_panic_witness() {
    let witnesses: [(usize, &str, extern "C" fn(u64)); 2] =
        [(1, "panic_witness", panic_witness), (2, "panic_too", panic_too)];
    for (cpu, name, entry) in witnesses.into_iter().filter(|&(cpu, ..)| cpu < task::cpus::online()) {
        PANIC_WITNESS_RUNNING.store(false, Ordering::Relaxed);
        let spawned = task::spawn_on(task::CpuMask::one(cpu), name, entry, 0);
        let running = spawned.is_ok() && cpu::wait_until(1000, || PANIC_WITNESS_RUNNING.load(Ordering::Acquire));
        if !running {
            defmt::error!("run=panic: cpu {=usize} did not start {=str}", cpu, name);
        }
    }
    PANIC_NOW.store(true, Ordering::Release);
}
