//! Multi-CPU: every CPU the kernel tried to start runs kernel code with its own per-CPU data,
//! takes its tick, runs tasks pinned to it, and tasks move between CPUs.

use super::{Context, Failure, Outcome, Test, Verdict, check, check_eq, fail};
use crate::arch::{cpu, percpu};
use crate::probes::kretprobe;
use crate::probes::{Method, ProbeError, Registers, Text};
use crate::stacktrace::{self, IrqCapture};
use crate::task::{self, CpuMask, State, cpus, stacks};
use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use unwind::Trace;

pub const TESTS: &[Test] = &[
    Test { name: "secondary_cpus_are_online", run: secondary_cpus_are_online },
    Test { name: "wake_sgi_reaches_every_cpu", run: wake_sgi_reaches_every_cpu },
    Test { name: "smp_tasks_run_on_every_cpu", run: smp_tasks_run_on_every_cpu },
    Test { name: "smp_kretprobe_migrates", run: smp_kretprobe_migrates },
    Test { name: "smp_tlb_shootdown", run: smp_tlb_shootdown },
];

/// Each wanted CPU is online and set up its own per-CPU entry (index, IRQ and overflow stacks):
/// only code running on that CPU writes those (`secondary_main`). `smp.fail-cpu=N` makes this
/// fail (xtask's failure paths check that it does).
fn secondary_cpus_are_online(_: &Context) -> Outcome {
    let wanted = cpus::wanted();
    check!(wanted >= 1);
    for cpu in 0..wanted {
        if !cpus::is_online(cpu) {
            defmt::error!("  cpu {=usize} of {=usize} is not online", cpu, wanted);
        }
        check!(cpus::is_online(cpu));
        let data = percpu::cpu_data(cpu);
        check_eq!(data.index.load(Ordering::Relaxed), cpu as u64);
        check_eq!(data.irq_stack_top.load(Ordering::Relaxed), stacks::irq_slot(cpu).stack_top());
        check_eq!(data.overflow_stack_top.load(Ordering::Relaxed), stacks::overflow_slot(cpu).stack_top());
    }
    check_eq!(cpus::online(), wanted);
    if wanted == 1 { Ok(Verdict::Skipped("one CPU (run with --smp N)")) } else { Ok(Verdict::Passed) }
}

/// Each secondary takes a wake-up SGI sent to it, and only it: the GIC routes by the target the
/// CPU recorded for itself (GICv2 interface mask, GICv3 affinity and its own redistributor).
fn wake_sgi_reaches_every_cpu(_: &Context) -> Outcome {
    let wanted = cpus::wanted();
    if wanted == 1 {
        return Ok(Verdict::Skipped("one CPU (run with --smp N)"));
    }
    let initial: [u64; stacks::CPUS] = core::array::from_fn(cpus::wakes);
    for target in 1..wanted {
        let before: [u64; stacks::CPUS] = core::array::from_fn(cpus::wakes);
        crate::drivers::interrupts::send_wake(target);
        check!(cpu::wait_until(100, || cpus::wakes(target) > before[target]));
        check_eq!(cpus::wakes(target), before[target] + 1);
        for other in (1..wanted).filter(|&other| other != target) {
            check_eq!(cpus::wakes(other), before[other]);
        }
    }
    // One wake each in all: none was delivered twice or to a CPU it was not sent to.
    for (cpu, &count) in initial.iter().enumerate().take(wanted).skip(1) {
        check_eq!(cpus::wakes(cpu), count + 1);
    }
    check_eq!(crate::drivers::interrupts::unhandled(), 0);
    Ok(Verdict::Passed)
}

/// Per CPU: the CPU a task pinned there saw itself on (plus one), and the ticks it saw there.
static RAN_ON: [AtomicUsize; stacks::CPUS] = [const { AtomicUsize::new(0) }; stacks::CPUS];
static TICKS_SEEN: [AtomicU64; stacks::CPUS] = [const { AtomicU64::new(0) }; stacks::CPUS];

/// A task pinned to CPU `cpu`: records where it runs, and waits there for two of its ticks
/// (with IRQs unmasked, yielding in between).
extern "C" fn pinned_task(cpu: u64) {
    let cpu = cpu as usize;
    let ticks = &percpu::cpu_data(cpu).ticks;
    let start = ticks.load(Ordering::Relaxed);
    let deadline = crate::drivers::timer::counter() + crate::drivers::timer::frequency() / 2;
    while ticks.load(Ordering::Relaxed) < start + 2 && crate::drivers::timer::counter() < deadline {
        task::yield_now();
    }
    TICKS_SEEN[cpu].store(ticks.load(Ordering::Relaxed) - start, Ordering::Relaxed);
    RAN_ON[cpu].store(task::this_cpu() + 1, Ordering::Release);
}

/// A task spawned on each CPU runs there (never elsewhere: its CPU mask holds one CPU) and sees
/// that CPU's tick advance.
fn smp_tasks_run_on_every_cpu(_: &Context) -> Outcome {
    let wanted = cpus::wanted();
    if wanted == 1 {
        return Ok(Verdict::Skipped("one CPU (run with --smp N)"));
    }
    let mut ids = [None; stacks::CPUS];
    for (cpu, id) in ids.iter_mut().enumerate().take(wanted) {
        RAN_ON[cpu].store(0, Ordering::Relaxed);
        *id = Some(task::spawn_on(CpuMask::one(cpu), "pinned", pinned_task, cpu as u64).map_err(|_| fail("spawn"))?);
    }
    for (cpu, id) in ids.iter().enumerate().take(wanted) {
        check!(task::join(id.expect("spawned above")) == State::Exited);
        check_eq!(RAN_ON[cpu].load(Ordering::Acquire), cpu + 1);
        check!(TICKS_SEEN[cpu].load(Ordering::Relaxed) >= 2);
    }
    Ok(Verdict::Passed)
}

/// The migration test's CPUs: the task starts on `FROM` and moves to `TO`.
static FROM: AtomicUsize = AtomicUsize::new(0);
static TO: AtomicUsize = AtomicUsize::new(0);
/// What the migrating task saw: its CPU at entry and after the move, the call's result.
static ENTERED_ON: AtomicUsize = AtomicUsize::new(0);
static MOVED_TO: AtomicUsize = AtomicUsize::new(0);
static RESULT: AtomicU64 = AtomicU64::new(0);
/// What the return handler saw: its CPU (plus one) and the return value.
static RETURNED_ON: AtomicUsize = AtomicUsize::new(0);
static RETURNED: AtomicU64 = AtomicU64::new(0);
static CAPTURE: crate::sync::IrqSpinLock<Option<IrqCapture>> = crate::sync::IrqSpinLock::new(None);

/// The probed call: moves its task from `FROM` to `TO` while its return is hijacked, then has
/// `TO`'s tick capture both traces in IRQ context while it spins in its own body.
#[inline(never)]
extern "C" fn migrating_call(a: u64, b: u64) -> u64 {
    ENTERED_ON.store(task::this_cpu(), Ordering::Relaxed);
    let to = TO.load(Ordering::Relaxed);
    task::set_affinity(task::current(), CpuMask::one(to));
    MOVED_TO.store(task::this_cpu(), Ordering::Relaxed);
    stacktrace::arm_irq_capture();
    let ticks = &percpu::cpu_data(to).ticks;
    let start = ticks.load(Ordering::Relaxed);
    let deadline = crate::drivers::timer::counter() + crate::drivers::timer::frequency() / 2;
    while ticks.load(Ordering::Relaxed) == start && crate::drivers::timer::counter() < deadline {
        core::hint::spin_loop();
    }
    *CAPTURE.lock() = stacktrace::take_irq_capture();
    a + b
}

extern "C" fn migrating_task(_: u64) {
    let call: extern "C" fn(u64, u64) -> u64 = core::hint::black_box(migrating_call);
    RESULT.store(call(20, 22), Ordering::Relaxed);
}

fn on_migrated_return(registers: &mut Registers, _: u64) {
    RETURNED_ON.store(task::this_cpu() + 1, Ordering::Relaxed);
    RETURNED.store(registers.x[0], Ordering::Relaxed);
    registers.x[0] += 1000;
}

/// Runs the migrating task once; its IRQ-time traces (frame pointer, shadow call stack).
fn run_migrating_task() -> Result<(Trace, Trace), Failure> {
    let from = FROM.load(Ordering::Relaxed);
    ENTERED_ON.store(usize::MAX, Ordering::Relaxed);
    MOVED_TO.store(usize::MAX, Ordering::Relaxed);
    RETURNED_ON.store(0, Ordering::Relaxed);
    *CAPTURE.lock() = None;
    let id = task::spawn_on(CpuMask::one(from), "migrating", migrating_task, 0).map_err(|_| fail("spawn"))?;
    check!(task::join(id) == State::Exited);
    check_eq!(ENTERED_ON.load(Ordering::Relaxed), from);
    check_eq!(MOVED_TO.load(Ordering::Relaxed), TO.load(Ordering::Relaxed));
    let capture = CAPTURE.lock().take().ok_or(fail("the tick on the new CPU captured the task"))?;
    Ok((capture.frame_pointer, capture.shadow))
}

/// The tail of an IRQ-time trace that is the task's callers: the interrupted PC's caller on.
fn callers(trace: &Trace) -> &[u64] {
    let addresses = trace.addresses();
    &addresses[addresses.len().saturating_sub(2)..]
}

/// A task with a hijacked return (a kretprobe, each method) moves to another CPU inside the
/// probed call: the call returns there with the right value through the handler, which runs on
/// the new CPU, and the new CPU's IRQ-time traces of the task show its real callers (the same
/// as without the probe), not the trampoline.
fn smp_kretprobe_migrates(_: &Context) -> Outcome {
    let wanted = cpus::wanted();
    if wanted == 1 {
        return Ok(Verdict::Skipped("one CPU (run with --smp N)"));
    }
    let (from, to) = (1, if wanted > 2 { 2 } else { 0 });
    FROM.store(from, Ordering::Relaxed);
    TO.store(to, Ordering::Relaxed);
    let (unprobed_fp, unprobed_scs) = run_migrating_task()?;
    check_eq!(RESULT.load(Ordering::Relaxed), 42);
    let target = migrating_call as *const () as u64;
    let trampoline = kretprobe::trampoline();
    let mut methods_run = 0;
    for method in Method::ALL {
        match kretprobe::register(target, method, None, on_migrated_return, 1) {
            Ok(()) => {}
            Err(ProbeError::NotSimulated | ProbeError::NeedsOriginalPc(Text::Kernel)) => continue,
            Err(error) => {
                defmt::error!("  {}: {}", method, error);
                return Err(fail("kretprobe registered"));
            }
        }
        methods_run += 1;
        let traces = run_migrating_task();
        let counts = kretprobe::counts(target);
        check!(kretprobe::unregister(target).is_ok());
        let (fp, scs) = traces?;
        check!(counts == Some((1, 0)));
        check_eq!(RETURNED_ON.load(Ordering::Relaxed), to + 1);
        check_eq!(RETURNED.load(Ordering::Relaxed), 42);
        check_eq!(RESULT.load(Ordering::Relaxed), 1042);
        let frame_records = crate::BUILD_VARIANT != "plain";
        for (mode, kept, probed, unprobed) in
            [("fp", frame_records, &fp, &unprobed_fp), ("scs", crate::SHADOW_CALL_STACK, &scs, &unprobed_scs)]
        {
            if !kept {
                continue; // this build keeps no frame records, or no shadow call stack
            }
            let right = probed.stop_reason().is_complete()
                && probed.addresses().len() == unprobed.addresses().len()
                && !probed.addresses().contains(&trampoline)
                && callers(probed) == callers(unprobed);
            if !right {
                defmt::error!("  {}: {} trace after the move", method, mode);
                stacktrace::print("probed", probed);
                stacktrace::print("unprobed", unprobed);
                return Err(fail("IRQ-time traces of the moved task show its real callers"));
            }
        }
    }
    check!(methods_run >= 2);
    Ok(Verdict::Passed)
}

/// The shootdown test's phases: observers touch the page (and count themselves), then wait for
/// the change; what each read after it.
static TOUCHED: AtomicUsize = AtomicUsize::new(0);
static CHANGED: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);
static SEEN_BEFORE: [AtomicU64; stacks::CPUS] = [const { AtomicU64::new(0) }; stacks::CPUS];
static SEEN_AFTER: [AtomicU64; stacks::CPUS] = [const { AtomicU64::new(0) }; stacks::CPUS];

/// What frame `index` of the test page holds.
const fn frame_mark(index: usize) -> u64 {
    0x7157_0000_0000_0000 | index as u64
}

fn read_test_page() -> u64 {
    // SAFETY: mm::init maps TLB_TEST_PAGE (to one of the two test frames) for good.
    unsafe { core::ptr::read_volatile(crate::arch::mmu::TLB_TEST_PAGE as *const u64) }
}

/// On its CPU: reads the test page (its TLB now holds the translation), waits with `wfe` for
/// the change, reads it again.
extern "C" fn tlb_observer(cpu: u64) {
    let cpu = cpu as usize;
    SEEN_BEFORE[cpu].store(read_test_page(), Ordering::Relaxed);
    TOUCHED.fetch_add(1, Ordering::Release);
    cpu::send_event();
    let deadline = crate::drivers::timer::counter() + crate::drivers::timer::frequency() / 2;
    while !CHANGED.load(Ordering::Acquire) && crate::drivers::timer::counter() < deadline {
        cpu::wait_for_event();
    }
    SEEN_AFTER[cpu].store(read_test_page(), Ordering::Relaxed);
}

/// A kernel mapping changed on one CPU is seen changed on the others, which had touched the
/// page first (their TLBs held the old translation): the change is invalidated with a broadcast
/// `tlbi vaae1is`. Under `smp.tlbi=local` the invalidation stays on this CPU and the others keep
/// reading the old frame: this test fails (xtask's failure path `smp-local-tlbi`).
fn smp_tlb_shootdown(_: &Context) -> Outcome {
    let wanted = cpus::wanted();
    if wanted == 1 {
        return Ok(Verdict::Skipped("one CPU (run with --smp N)"));
    }
    let me = task::this_cpu();
    for index in 0..2 {
        let frame = (crate::mm::tlb_test_frame(index) + crate::arch::mmu::VA_OFFSET) as *mut u64;
        // SAFETY: the test frames are this test's own page-aligned static pages.
        unsafe { core::ptr::write_volatile(frame, frame_mark(index)) };
    }
    crate::arch::mmu::retarget_test_page(crate::mm::tlb_test_frame(0));
    check_eq!(read_test_page(), frame_mark(0));
    TOUCHED.store(0, Ordering::Relaxed);
    CHANGED.store(false, Ordering::Relaxed);
    let mut ids = [None; stacks::CPUS];
    let observers = (0..wanted).filter(|&cpu| cpu != me);
    for cpu in observers.clone() {
        SEEN_BEFORE[cpu].store(0, Ordering::Relaxed);
        SEEN_AFTER[cpu].store(0, Ordering::Relaxed);
        ids[cpu] = Some(
            task::spawn_on(CpuMask::one(cpu), "tlb-observer", tlb_observer, cpu as u64).map_err(|_| fail("spawn"))?,
        );
    }
    check!(cpu::wait_until(500, || TOUCHED.load(Ordering::Acquire) == wanted - 1));
    crate::arch::mmu::retarget_test_page(crate::mm::tlb_test_frame(1));
    check_eq!(read_test_page(), frame_mark(1));
    CHANGED.store(true, Ordering::Release);
    cpu::send_event();
    for cpu in observers {
        check!(task::join(ids[cpu].expect("spawned above")) == State::Exited);
        check_eq!(SEEN_BEFORE[cpu].load(Ordering::Relaxed), frame_mark(0));
        let after = SEEN_AFTER[cpu].load(Ordering::Relaxed);
        if after != frame_mark(1) {
            defmt::error!("  cpu {=usize} still reads the old frame after the change", cpu);
        }
        check_eq!(after, frame_mark(1));
    }
    Ok(Verdict::Passed)
}
