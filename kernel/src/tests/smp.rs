//! Multi-CPU: every CPU the kernel tried to start runs kernel code with its own per-CPU data,
//! takes its tick, runs tasks pinned to it, and tasks move between CPUs.

use super::{Context, Failure, Outcome, Test, Verdict, check, check_eq, fail};
use crate::arch::{cpu, percpu};
use crate::inject::{self, Fault};
use crate::probes::kretprobe;
use crate::probes::{Method, ProbeError, Registers, Text, uprobe as uprobes};
use crate::stacktrace::{self, IrqCapture};
use crate::sync::IrqMask;
use crate::task::user;
use crate::task::{self, CpuMask, State, cpus, stacks};
use core::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use unwind::Trace;

pub const TESTS: &[Test] = &[
    Test { name: "secondary_cpus_are_online", run: secondary_cpus_are_online },
    Test { name: "wake_sgi_reaches_every_cpu", run: wake_sgi_reaches_every_cpu },
    Test { name: "smp_tasks_run_on_every_cpu", run: smp_tasks_run_on_every_cpu },
    Test { name: "smp_kretprobe_migrates", run: smp_kretprobe_migrates },
    Test { name: "smp_tlb_shootdown", run: smp_tlb_shootdown },
    Test { name: "smp_depot_concurrent_saves", run: smp_depot_concurrent_saves },
    Test { name: "smp_kprobe_hits_every_cpu", run: smp_kprobe_hits_every_cpu },
    Test { name: "smp_heap_concurrent_alloc_free", run: smp_heap_concurrent_alloc_free },
    Test { name: "smp_traces_agree_in_irqs_every_cpu", run: smp_traces_agree_in_irqs_every_cpu },
    Test { name: "smp_ftrace_unregister_waits_for_other_cpus", run: smp_ftrace_unregister_waits_for_other_cpus },
    Test { name: "smp_kretprobe_irq_context_per_cpu", run: smp_kretprobe_irq_context_per_cpu },
    Test { name: "smp_kretprobe_hits_while_another_cpu_returns", run: smp_kretprobe_hits_while_another_cpu_returns },
    Test { name: "smp_heap_use_after_free_reported", run: smp_heap_use_after_free_reported },
    Test { name: "smp_uprobe_hits_every_cpu_at_once", run: smp_uprobe_hits_every_cpu_at_once },
    Test { name: "smp_uprobe_shared_step_state_is_caught", run: smp_uprobe_shared_step_state_is_caught },
    Test { name: "smp_uprobe_cpu_slots_every_cpu_at_once", run: smp_uprobe_cpu_slots_every_cpu_at_once },
    Test { name: "smp_run_queue_retries_count_waits", run: smp_run_queue_retries_count_waits },
    Test { name: "smp_stack_sample_draws_per_cpu", run: smp_stack_sample_draws_per_cpu },
    Test { name: "smp_tag_generator_per_cpu", run: smp_tag_generator_per_cpu },
    Test { name: "smp_tag_generator_shared_state_is_caught", run: smp_tag_generator_shared_state_is_caught },
    // Last: without kprobe unregistration's grace period it would end the run.
    Test { name: "smp_probe_and_tracer_churn", run: smp_probe_and_tracer_churn },
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
        let frame_records = crate::build_info::VARIANT != "plain" && crate::build_info::FRAME_POINTERS;
        for (mode, kept, probed, unprobed) in [
            ("fp", frame_records, &fp, &unprobed_fp),
            ("scs", crate::build_info::SHADOW_CALL_STACK, &scs, &unprobed_scs),
        ] {
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

/// Traces the depot test saves: `DEPOT_TRACES` of them, every CPU all of them, each CPU in its
/// own order, `DEPOT_ROUNDS` times.
const DEPOT_TRACES: usize = 48;
const DEPOT_ROUNDS: usize = 40;
/// Rounds whose every save starts at a barrier of all savers.
const BARRIER_ROUNDS: usize = 4;
/// Per CPU and trace: the raw handle it got (0: none yet), and a handle that differed from the
/// one it got before (a trace stored twice).
static DEPOT_HANDLES: [[AtomicU64; DEPOT_TRACES]; stacks::CPUS] =
    [const { [const { AtomicU64::new(0) }; DEPOT_TRACES] }; stacks::CPUS];
static DEPOT_ERRORS: AtomicU64 = AtomicU64::new(0);
/// CPUs inside `DEPOT.save` now, and the most seen at once (the overlap witness).
static INSIDE: AtomicUsize = AtomicUsize::new(0);
static MOST_INSIDE: AtomicUsize = AtomicUsize::new(0);
/// Set by the runner when every saver is spawned: they start together.
static GO: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);

/// Trace `index` of a run (`salt` makes each run's traces new to the depot): frames that look
/// like kernel return addresses, of lengths 3..=18.
fn depot_trace(index: usize, salt: u64, buffer: &mut [u64; 18]) -> &[u64] {
    let length = 3 + index % 16;
    for (depth, frame) in buffer.iter_mut().enumerate().take(length) {
        *frame = 0xffff_ff80_4000_0000 + salt * 0x10_0000 + (index as u64) * 0x1000 + depth as u64 * 4;
    }
    &buffer[..length]
}

static DEPOT_SALT: AtomicU64 = AtomicU64::new(0);
/// The savers taking part, and how many arrived at the barrier so far (round 0).
static SAVERS: AtomicUsize = AtomicUsize::new(0);
static ARRIVED: AtomicUsize = AtomicUsize::new(0);

/// One CPU's saves: all traces, many rounds; checks that each save of a trace gives the same
/// handle.
extern "C" fn depot_saver(cpu: u64) {
    let cpu = cpu as usize;
    let salt = DEPOT_SALT.load(Ordering::Relaxed);
    while !GO.load(Ordering::Acquire) {
        cpu::wait_for_event();
    }
    let mut buffer = [0; 18];
    let savers = SAVERS.load(Ordering::Relaxed);
    for round in 0..DEPOT_ROUNDS {
        for step in 0..DEPOT_TRACES {
            if round < BARRIER_ROUNDS {
                // All CPUs reach each trace together: in round 0 they race to insert it, later
                // to look it up.
                let arrived = ARRIVED.fetch_add(1, Ordering::AcqRel) + 1;
                let target = (round * DEPOT_TRACES + step + 1) * savers;
                if arrived == target {
                    cpu::send_event();
                }
                while ARRIVED.load(Ordering::Acquire) < target {
                    cpu::wait_for_event();
                }
            }
            // The barrier rounds in one order for all, then each CPU in its own.
            let index = if round < BARRIER_ROUNDS { step } else { (step * (2 * cpu + 1) + round) % DEPOT_TRACES };
            let frames = depot_trace(index, salt, &mut buffer);
            let inside = INSIDE.fetch_add(1, Ordering::AcqRel) + 1;
            MOST_INSIDE.fetch_max(inside, Ordering::Relaxed);
            let saved = crate::stacktrace::DEPOT.save(frames);
            INSIDE.fetch_sub(1, Ordering::AcqRel);
            let Ok(handle) = saved else {
                DEPOT_ERRORS.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            let raw = u64::from(handle.to_raw());
            let seen = DEPOT_HANDLES[cpu][index].swap(raw, Ordering::Relaxed);
            if seen != 0 && seen != raw {
                DEPOT_ERRORS.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Every CPU saves an overlapping set of new traces into the stack depot at once: each handle
/// gives back exactly its trace, and all CPUs got the same handle for a trace (none stored
/// twice). Prints its overlap witness, the most CPUs inside `save` at once; without icount it
/// must reach 2 (under icount the CPUs take turns in long slices, so it is only printed).
fn smp_depot_concurrent_saves(context: &Context) -> Outcome {
    let wanted = cpus::wanted();
    if wanted == 1 {
        return Ok(Verdict::Skipped("one CPU (run with --smp N)"));
    }
    let salt = DEPOT_SALT.fetch_add(1, Ordering::Relaxed) + 1 + (crate::drivers::timer::counter() & 0xff) * 64;
    DEPOT_SALT.store(salt, Ordering::Relaxed);
    for handles in &DEPOT_HANDLES {
        for handle in handles {
            handle.store(0, Ordering::Relaxed);
        }
    }
    DEPOT_ERRORS.store(0, Ordering::Relaxed);
    MOST_INSIDE.store(0, Ordering::Relaxed);
    GO.store(false, Ordering::Relaxed);
    SAVERS.store(wanted, Ordering::Relaxed);
    ARRIVED.store(0, Ordering::Relaxed);
    let before = crate::stacktrace::DEPOT.stats();
    let mut ids = [None; stacks::CPUS];
    for (cpu, id) in ids.iter_mut().enumerate().take(wanted) {
        *id =
            Some(task::spawn_on(CpuMask::one(cpu), "depot-saver", depot_saver, cpu as u64).map_err(|_| fail("spawn"))?);
    }
    GO.store(true, Ordering::Release);
    cpu::send_event();
    for id in ids.iter().take(wanted) {
        check!(task::join(id.expect("spawned above")) == State::Exited);
    }
    let after = crate::stacktrace::DEPOT.stats();
    let most = MOST_INSIDE.load(Ordering::Relaxed);
    defmt::info!("  overlap witness: at most {=usize} of {=usize} CPUs inside the depot's save at once", most, wanted);
    check_eq!(DEPOT_ERRORS.load(Ordering::Relaxed), 0);
    // Exactly one new record per trace.
    check_eq!(after.records - before.records, DEPOT_TRACES);
    let mut buffer = [0; 18];
    let mut fetched = [0; unwind::MAX_FRAMES];
    for index in 0..DEPOT_TRACES {
        let raw = DEPOT_HANDLES[0][index].load(Ordering::Relaxed);
        for handles in DEPOT_HANDLES.iter().take(wanted) {
            check_eq!(handles[index].load(Ordering::Relaxed), raw);
        }
        let handle = stackdepot::DepotHandle::from_raw(raw as u32).ok_or(fail("a handle for every trace"))?;
        let frames = crate::stacktrace::DEPOT.fetch(handle, &mut fetched).ok_or(fail("the handle fetches"))?;
        check!(frames == depot_trace(index, salt, &mut buffer));
    }
    if !context.icount {
        check!(most >= 2);
    }
    Ok(Verdict::Passed)
}

/// Calls of the probed function per CPU and method.
const CALLS_PER_CPU: u64 = 10_000;
static PROBE_HITS: AtomicU64 = AtomicU64::new(0);
static WRONG_RESULTS: AtomicU64 = AtomicU64::new(0);
/// CPUs inside a call of the probed function (its BRK, handler and step included) now, and the
/// most at once (the overlap witness).
static IN_PROBED_CALL: AtomicUsize = AtomicUsize::new(0);
static MOST_IN_PROBED_CALL: AtomicUsize = AtomicUsize::new(0);
/// Callers running (they start when all are).
static READY: AtomicUsize = AtomicUsize::new(0);

#[inline(never)]
extern "C" fn probed_sum(a: u64, b: u64) -> u64 {
    a.wrapping_mul(3).wrapping_add(b)
}

fn count_concurrent_hit(_: &mut Registers) {
    PROBE_HITS.fetch_add(1, Ordering::Relaxed);
}

/// One CPU's calls of the probed function, started together with the others.
extern "C" fn probed_caller(cpu: u64) {
    // Starts when every caller is running.
    if READY.fetch_add(1, Ordering::AcqRel) + 1 == SAVERS.load(Ordering::Relaxed) {
        cpu::send_event();
    }
    while READY.load(Ordering::Acquire) < SAVERS.load(Ordering::Relaxed) {
        cpu::wait_for_event();
    }
    let call: extern "C" fn(u64, u64) -> u64 = core::hint::black_box(probed_sum);
    for index in 0..CALLS_PER_CPU {
        let inside = IN_PROBED_CALL.fetch_add(1, Ordering::AcqRel) + 1;
        MOST_IN_PROBED_CALL.fetch_max(inside, Ordering::Relaxed);
        let result = call(index, cpu);
        IN_PROBED_CALL.fetch_sub(1, Ordering::AcqRel);
        if result != index.wrapping_mul(3).wrapping_add(cpu) {
            WRONG_RESULTS.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Every CPU calls one kprobe'd function 10,000 times at once, per method: the hit count is
/// exactly the number of calls (none missed: the hit state is per CPU), every call returns the
/// right value. Prints its overlap witness, the most CPUs inside a probed call at once (per
/// method, and the most over all methods, which without icount must reach 2: a detour hit is
/// short enough that a loaded 2-core host may run its callers one after the other).
fn smp_kprobe_hits_every_cpu(context: &Context) -> Outcome {
    let wanted = cpus::wanted();
    if wanted == 1 {
        return Ok(Verdict::Skipped("one CPU (run with --smp N)"));
    }
    // After the patchable-entry NOPs, which ftrace owns (where the build has them).
    let target = kretprobe::attach_address(probed_sum as *const () as u64);
    let (mut methods_run, mut witness) = (0, 0);
    for method in Method::ALL {
        match crate::probes::register(target, method, count_concurrent_hit, None) {
            Ok(()) => {}
            Err(ProbeError::NotSimulated | ProbeError::NeedsOriginalPc(Text::Kernel)) => continue,
            Err(error) => {
                defmt::error!("  {}: {}", method, error);
                return Err(fail("kprobe registered"));
            }
        }
        methods_run += 1;
        PROBE_HITS.store(0, Ordering::Relaxed);
        WRONG_RESULTS.store(0, Ordering::Relaxed);
        MOST_IN_PROBED_CALL.store(0, Ordering::Relaxed);
        READY.store(0, Ordering::Relaxed);
        SAVERS.store(wanted, Ordering::Relaxed);
        let mut ids = [None; stacks::CPUS];
        let mut spawned = Ok(());
        for (cpu, id) in ids.iter_mut().enumerate().take(wanted) {
            match task::spawn_on(CpuMask::one(cpu), "probed-caller", probed_caller, cpu as u64) {
                Ok(spawned_id) => *id = Some(spawned_id),
                Err(_) => spawned = Err(fail("spawn")),
            }
        }
        for id in ids.iter().take(wanted).flatten() {
            task::join(*id);
        }
        let counts = crate::probes::counts(target);
        check!(crate::probes::unregister(target).is_ok());
        spawned?;
        let most = MOST_IN_PROBED_CALL.load(Ordering::Relaxed);
        defmt::info!("  {}: at most {=usize} of {=usize} CPUs inside the probed call at once", method, most, wanted);
        let calls = CALLS_PER_CPU * wanted as u64;
        check_eq!(WRONG_RESULTS.load(Ordering::Relaxed), 0);
        check_eq!(PROBE_HITS.load(Ordering::Relaxed), calls);
        check!(counts == Some((calls, 0)));
        witness = witness.max(most);
    }
    check!(methods_run >= 2);
    defmt::info!("  overlap witness: at most {=usize} of {=usize} CPUs inside a probed call at once", witness, wanted);
    if !context.icount {
        check!(witness >= 2);
    }
    Ok(Verdict::Passed)
}

/// Allocations per CPU in the heap test.
const HEAP_ROUNDS: usize = 1500;
static HEAP_WRONG: AtomicU64 = AtomicU64::new(0);
/// CPUs inside `heap::allocate` or `heap::free` now, and the most at once (the overlap witness).
static IN_HEAP: AtomicUsize = AtomicUsize::new(0);
static MOST_IN_HEAP: AtomicUsize = AtomicUsize::new(0);

fn in_heap<T>(f: impl FnOnce() -> T) -> T {
    let inside = IN_HEAP.fetch_add(1, Ordering::AcqRel) + 1;
    MOST_IN_HEAP.fetch_max(inside, Ordering::Relaxed);
    let result = f();
    IN_HEAP.fetch_sub(1, Ordering::AcqRel);
    result
}

/// One CPU's allocations: objects of varied sizes, filled and checked word by word (every
/// access tag-checked in `full`), freed; a few kept alive across rounds so frees interleave.
extern "C" fn heap_worker(cpu: u64) {
    if READY.fetch_add(1, Ordering::AcqRel) + 1 == SAVERS.load(Ordering::Relaxed) {
        cpu::send_event();
    }
    while READY.load(Ordering::Acquire) < SAVERS.load(Ordering::Relaxed) {
        cpu::wait_for_event();
    }
    let mut kept = [0u64; 4];
    for round in 0..HEAP_ROUNDS {
        // The use-after-free test's window (see `uaf_task`): wait it out.
        while UAF_WINDOW.load(Ordering::Acquire) {
            cpu::wait_for_event();
        }
        let words = 1 + (round * 7 + cpu as usize * 13) % 60;
        let Some(object) = in_heap(|| crate::mm::kasan::heap::allocate(words * 8, 16)) else {
            HEAP_WRONG.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        let pattern = (cpu << 56) | (round as u64) << 16;
        for word in 0..words {
            // SAFETY: `object` holds `words` words, allocated above and not yet freed.
            unsafe { core::ptr::write_volatile((object as *mut u64).add(word), pattern | word as u64) };
        }
        for word in 0..words {
            // SAFETY: as above.
            if unsafe { core::ptr::read_volatile((object as *const u64).add(word)) } != pattern | word as u64 {
                HEAP_WRONG.fetch_add(1, Ordering::Relaxed);
            }
        }
        let slot = round % kept.len();
        let old = core::mem::replace(&mut kept[slot], object);
        if old != 0 {
            in_heap(|| crate::mm::kasan::heap::free(old));
        }
    }
    for object in kept.into_iter().filter(|&object| object != 0) {
        in_heap(|| crate::mm::kasan::heap::free(object));
    }
}

/// Every CPU allocates, fills, checks and frees heap objects at once, with stack collection as
/// configured: no sanitizer report (no false positive), every word reads back, the heap's audit
/// passes after. Prints its overlap witness (CPUs inside allocate/free at once); without icount
/// it must reach 2.
fn smp_heap_concurrent_alloc_free(context: &Context) -> Outcome {
    let wanted = cpus::wanted();
    if wanted == 1 {
        return Ok(Verdict::Skipped("one CPU (run with --smp N)"));
    }
    HEAP_WRONG.store(0, Ordering::Relaxed);
    MOST_IN_HEAP.store(0, Ordering::Relaxed);
    READY.store(0, Ordering::Relaxed);
    SAVERS.store(wanted, Ordering::Relaxed);
    let reports = crate::mm::kasan::report::count();
    let mut ids = [None; stacks::CPUS];
    for (cpu, id) in ids.iter_mut().enumerate().take(wanted) {
        *id =
            Some(task::spawn_on(CpuMask::one(cpu), "heap-worker", heap_worker, cpu as u64).map_err(|_| fail("spawn"))?);
    }
    for id in ids.iter().take(wanted).flatten() {
        check!(task::join(*id) == State::Exited);
    }
    let most = MOST_IN_HEAP.load(Ordering::Relaxed);
    defmt::info!("  overlap witness: at most {=usize} of {=usize} CPUs inside the heap at once", most, wanted);
    check_eq!(crate::mm::kasan::report::count(), reports);
    check_eq!(HEAP_WRONG.load(Ordering::Relaxed), 0);
    check!(crate::mm::kasan::heap::audit().is_ok());
    if !context.icount {
        check!(most >= 2);
    }
    Ok(Verdict::Passed)
}

/// The random-point trace test's context and outcome, for the task that runs it on a CPU.
static AGREE_CONTEXT: crate::sync::IrqSpinLock<Option<Context>> = crate::sync::IrqSpinLock::new(None);
static AGREE_OUTCOME: crate::sync::IrqSpinLock<Option<Outcome>> = crate::sync::IrqSpinLock::new(None);

extern "C" fn agree_task(_: u64) {
    let context = AGREE_CONTEXT.lock().take().expect("set by the test");
    let outcome = if context.icount {
        super::stacktrace::traces_agree_in_irqs_at_random_points(&context)
    } else {
        super::stacktrace::traces_agree_at_cross_cpu_irqs()
    };
    *AGREE_OUTCOME.lock() = Some(outcome);
}

/// Cross-CPU calls sent by the firing task (without icount).
static FIRED: AtomicU64 = AtomicU64::new(0);

extern "C" fn fire_task(target: u64) {
    FIRED.store(super::stacktrace::fire_cross_cpu_irqs(target as usize), Ordering::Release);
}

/// IRQ-time frame-pointer and shadow-call-stack traces agree (or differ by the predicted window
/// frame) at 200 random interrupted points, on every CPU in turn, in a task pinned to each CPU
/// (its IRQ stack, its capture). Under icount the IRQ is the CPU's tick, due at a random
/// instruction (the stacktrace suite's random-point test). Without icount (multi-threaded TCG
/// takes a timer IRQ mostly at counter reads) it is the wake-up SGI of a cross-CPU call that the
/// next CPU sends at random moments, taken at the start of whatever translated block comes next.
fn smp_traces_agree_in_irqs_every_cpu(context: &Context) -> Outcome {
    let wanted = cpus::wanted();
    if wanted == 1 {
        return Ok(Verdict::Skipped("one CPU (run with --smp N)"));
    }
    for cpu in 0..wanted {
        *AGREE_CONTEXT.lock() = Some(*context);
        super::stacktrace::reset_cross_cpu_irqs();
        let id = task::spawn_on(CpuMask::one(cpu), "traces-agree", agree_task, 0).map_err(|_| fail("spawn"))?;
        let firing = if context.icount {
            None
        } else {
            let next = (cpu + 1) % wanted;
            Some(task::spawn_on(CpuMask::one(next), "irq-firing", fire_task, cpu as u64).map_err(|_| fail("spawn"))?)
        };
        task::join(id);
        if let Some(firing) = firing {
            task::join(firing);
            defmt::info!("  cpu {=usize}: {=u64} cross-CPU calls sent", cpu, FIRED.load(Ordering::Acquire));
        }
        match AGREE_OUTCOME.lock().take() {
            Some(Ok(Verdict::Passed)) => {}
            Some(Ok(Verdict::Skipped(reason))) => return Ok(Verdict::Skipped(reason)),
            Some(Err(failure)) => {
                defmt::error!("  on cpu {=usize}", cpu);
                return Err(failure);
            }
            None => return Err(fail("the test's task returned")),
        }
    }
    Ok(Verdict::Passed)
}

/// The grace-period test: the slow tracer is running on the other CPU; this CPU is unregistering.
static SLOW_INSIDE: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);
static SLOW_ENTERED: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);
static UNREGISTERING: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);
/// Set by the unregistering CPU once it has looked whether the tracer was still running.
static SAMPLED: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);

/// A tracer that stays inside (IRQs masked, as every tracer) until the other CPU has started to
/// unregister it (at most 50 ms), then until that CPU has looked whether it is still inside (a
/// skipped grace period lets it look at once) or 20 ms (times the wait patience: without icount a
/// loaded host may hold the other vCPU that long) have passed, which a real grace period waits
/// out.
#[sanitize(kernel_hwaddress = "off")]
unsafe extern "C" fn slow_tracer(_: u64, _: u64, _: &crate::ftrace::Ops, _: &mut crate::ftrace::Regs) {
    SLOW_INSIDE.store(true, Ordering::Release);
    SLOW_ENTERED.store(true, Ordering::Release);
    let frequency = crate::drivers::timer::frequency();
    let deadline = crate::drivers::timer::counter() + frequency / 20;
    while !UNREGISTERING.load(Ordering::Acquire) && crate::drivers::timer::counter() < deadline {
        core::hint::spin_loop();
    }
    let linger = crate::drivers::timer::counter() + frequency * cpu::patience_ms(20) / 1000;
    while !SAMPLED.load(Ordering::Acquire) && crate::drivers::timer::counter() < linger {
        core::hint::spin_loop();
    }
    SLOW_INSIDE.store(false, Ordering::Release);
}

static SLOW: crate::ftrace::Ops = crate::ftrace::Ops { func: slow_tracer, private: 0 };

#[inline(never)]
fn grace_target(x: u64) -> u64 {
    core::hint::black_box(x) + 1
}

extern "C" fn grace_caller(_: u64) {
    core::hint::black_box(grace_target(1));
}

/// One round: CPU 1 enters the slow tracer; this CPU unregisters it meanwhile. Whether CPU 1 was
/// still inside when `unregister` returned.
fn unregister_while_inside() -> Result<bool, Failure> {
    let target = grace_target as *const () as u64;
    let tracer = crate::ftrace::register_where(&SLOW, |entry| entry + 8 == target)
        .map_err(|_| fail("grace_target is traceable"))?;
    SLOW_INSIDE.store(false, Ordering::Relaxed);
    SLOW_ENTERED.store(false, Ordering::Relaxed);
    UNREGISTERING.store(false, Ordering::Relaxed);
    SAMPLED.store(false, Ordering::Relaxed);
    let other = if task::this_cpu() == 1 { 0 } else { 1 };
    let id = task::spawn_on(CpuMask::one(other), "grace-caller", grace_caller, 0).map_err(|_| fail("spawn"))?;
    let entered = cpu::wait_until(100, || SLOW_ENTERED.load(Ordering::Acquire));
    UNREGISTERING.store(true, Ordering::Release);
    let unregistered = crate::ftrace::unregister(tracer).is_ok();
    let still_inside = SLOW_INSIDE.load(Ordering::Acquire);
    SAMPLED.store(true, Ordering::Release);
    task::join(id);
    check!(entered && unregistered);
    Ok(still_inside)
}

/// `ftrace::unregister` returns only when no other CPU can still be inside the tracer: with
/// another CPU inside it (IRQs masked), unregister waits for that CPU's quiescent point, so the
/// tracer has been left by then. With grace periods skipped (`inject::Fault::FtraceNoGracePeriod`) the same round
/// must see the other CPU still inside: the check can fail.
fn smp_ftrace_unregister_waits_for_other_cpus(_: &Context) -> Outcome {
    if cpus::wanted() == 1 {
        return Ok(Verdict::Skipped("one CPU (run with --smp N)"));
    }
    if crate::symbols::callsites::entries().is_empty() {
        return Ok(Verdict::Skipped("variant plain has no patchable entries"));
    }
    crate::inject::set(crate::inject::Fault::FtraceNoGracePeriod, true);
    let without = unregister_while_inside();
    crate::inject::set(crate::inject::Fault::FtraceNoGracePeriod, false);
    check!(without?);
    check!(!unregister_while_inside()?);
    Ok(Verdict::Passed)
}

/// The IRQ-context kretprobe test's two calls: role 0 enters first and returns first, role 1
/// enters second and returns second, each in the wake-up SGI of its own CPU.
static IRQ_ENTERED: [core::sync::atomic::AtomicBool; 2] = [const { core::sync::atomic::AtomicBool::new(false) }; 2];
static IRQ_LEFT: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);
static IN_IRQ_CALL: AtomicUsize = AtomicUsize::new(0);
static MOST_IN_IRQ_CALL: AtomicUsize = AtomicUsize::new(0);
static IRQ_RETURNS: AtomicU64 = AtomicU64::new(0);
/// How long one side waits for the other inside the IRQ.
const IRQ_WAIT_MS: u64 = 200;

/// The kretprobe'd function: role 0 waits inside until role 1 is inside too, then returns
/// first; role 1 waits until role 0 has returned. Returns `role + 1` when the other side came.
#[inline(never)]
fn irq_probed(role: u64) -> u64 {
    let inside = IN_IRQ_CALL.fetch_add(1, Ordering::AcqRel) + 1;
    MOST_IN_IRQ_CALL.fetch_max(inside, Ordering::Relaxed);
    IRQ_ENTERED[role as usize].store(true, Ordering::Release);
    cpu::send_event();
    let met = if role == 0 {
        cpu::wait_until(IRQ_WAIT_MS, || IRQ_ENTERED[1].load(Ordering::Acquire))
    } else {
        cpu::wait_until(IRQ_WAIT_MS, || IRQ_LEFT.load(Ordering::Acquire))
    };
    IN_IRQ_CALL.fetch_sub(1, Ordering::AcqRel);
    if met { role + 1 } else { 0 }
}

/// Role 0's caller (its call returns here, tagged 0xa000).
#[inline(never)]
fn irq_caller_first(_: u64) -> u64 {
    let probed: fn(u64) -> u64 = core::hint::black_box(irq_probed);
    let result = probed(0) + 0xa000;
    IRQ_LEFT.store(true, Ordering::Release);
    cpu::send_event();
    result
}

/// Role 1's caller: calls once role 0 is inside (its call returns here, tagged 0xb000).
#[inline(never)]
fn irq_caller_second(_: u64) -> u64 {
    if !cpu::wait_until(IRQ_WAIT_MS, || IRQ_ENTERED[0].load(Ordering::Acquire)) {
        return 0;
    }
    let probed: fn(u64) -> u64 = core::hint::black_box(irq_probed);
    probed(1) + 0xb000
}

fn on_irq_return(_: &mut Registers, _: u64) {
    IRQ_RETURNS.fetch_add(1, Ordering::Relaxed);
}

static IRQ_RESULTS: [AtomicU64; 2] = [const { AtomicU64::new(0) }; 2];

/// A sender task: cross-calls its role's caller on its target CPU (IRQ context there).
extern "C" fn irq_sender(role: u64) {
    let (target, caller): (usize, fn(u64) -> u64) =
        if role == 0 { (2, irq_caller_first) } else { (3.min(cpus::wanted() - 1), irq_caller_second) };
    let result = task::cross_call::run_on_within(target, caller, 0, 4 * IRQ_WAIT_MS).unwrap_or(u64::MAX);
    IRQ_RESULTS[role as usize].store(result, Ordering::Relaxed);
}

/// A kretprobe'd function called in IRQ context on two CPUs at once (the wake-up SGI serving a
/// cross-call on CPUs 2 and 3, sent by tasks on CPUs 0 and 1), the first to enter returning
/// first: each return goes back to its own caller, because each CPU's IRQ context has its own
/// return-instance stack (with one shared stack the first return pops the second's instance
/// and lands in the other caller). Per method; overlap witness: both inside at once.
fn smp_kretprobe_irq_context_per_cpu(_: &Context) -> Outcome {
    if cpus::wanted() < 4 {
        return Ok(Verdict::Skipped("needs 4 CPUs: two sending, two in IRQ context (run with --smp 4)"));
    }
    let target = irq_probed as *const () as u64;
    let mut methods_run = 0;
    for method in Method::ALL {
        match kretprobe::register(target, method, None, on_irq_return, 2) {
            Ok(()) => {}
            Err(ProbeError::NotSimulated | ProbeError::NeedsOriginalPc(Text::Kernel)) => continue,
            Err(error) => {
                defmt::error!("  {}: {}", method, error);
                return Err(fail("kretprobe registered"));
            }
        }
        methods_run += 1;
        for flag in &IRQ_ENTERED {
            flag.store(false, Ordering::Relaxed);
        }
        IRQ_LEFT.store(false, Ordering::Relaxed);
        IRQ_RETURNS.store(0, Ordering::Relaxed);
        MOST_IN_IRQ_CALL.store(0, Ordering::Relaxed);
        let spawn = |role: u64| task::spawn_on(CpuMask::one(role as usize), "irq-sender", irq_sender, role);
        // Both spawned before either runs: on CPU 0 the first spawn's wake-up switched to sender
        // 0 at once, which then waited for CPU 2 with IRQs masked (the cross call's sender lock)
        // while CPU 2 waited for role 1, whose sender was not spawned yet (seen on smp 4, GICv3,
        // when the test landed on CPU 0's main line: role 0 timed out, 1 of 2 inside at once).
        let senders = {
            let _mask = IrqMask::new();
            [spawn(0), spawn(1)]
        };
        let joined = senders.map(|sender| sender.map(task::join));
        let counts = kretprobe::counts(target);
        check!(kretprobe::unregister(target).is_ok());
        check!(joined.iter().all(|state| matches!(state, Ok(State::Exited))));
        let results = [IRQ_RESULTS[0].load(Ordering::Relaxed), IRQ_RESULTS[1].load(Ordering::Relaxed)];
        let most = MOST_IN_IRQ_CALL.load(Ordering::Relaxed);
        defmt::info!(
            "  {}: results {=u64:#x} {=u64:#x}, most inside at once {=usize}",
            method,
            results[0],
            results[1],
            most
        );
        check_eq!(results[0], 0xa001);
        check_eq!(results[1], 0xb002);
        check_eq!(IRQ_RETURNS.load(Ordering::Relaxed), 2);
        check!(counts == Some((2, 0)));
        check!(most >= 2);
    }
    check!(methods_run >= 2);
    Ok(Verdict::Passed)
}

/// Set while the first return handler holds its CPU; `RETURN_RELEASE` lets it go.
static RETURN_HOLDING: AtomicBool = AtomicBool::new(false);
static RETURN_RELEASE: AtomicBool = AtomicBool::new(false);
/// The next return handler to run holds its CPU (one shot).
static HOLD_NEXT_RETURN: AtomicBool = AtomicBool::new(false);

/// The kretprobe'd function of `smp_kretprobe_hits_while_another_cpu_returns`.
#[inline(never)]
fn returned_while_held(value: u64) -> u64 {
    core::hint::black_box(value) + 1
}

/// Its return handler: the first one holds its CPU (IRQs masked, inside the handler) until
/// released.
fn hold_in_return_handler(_: &mut Registers, _: u64) {
    if HOLD_NEXT_RETURN.swap(false, Ordering::Relaxed) {
        RETURN_HOLDING.store(true, Ordering::Release);
        cpu::send_event();
        cpu::wait_until(IRQ_WAIT_MS, || RETURN_RELEASE.load(Ordering::Acquire));
    }
}

/// A kretprobe hit on one CPU while another CPU runs the same kretprobe's return handler is a
/// hit, not a miss: the in-return-handler flag is per context. One flag for all made every CPU
/// miss its hits while any CPU ran a return handler (the probe sweep on 4 CPUs: returns counted
/// on CPU 0 differed by method). Another CPU calls the function in a cross call and is held in
/// its return handler while this one calls it; per method. With the flag read for all contexts
/// this fails (counts (1, 1)).
fn smp_kretprobe_hits_while_another_cpu_returns(_: &Context) -> Outcome {
    if cpus::wanted() < 2 {
        return Ok(Verdict::Skipped("one CPU (run with --smp N)"));
    }
    let target = returned_while_held as *const () as u64;
    let mut methods_run = 0;
    for method in Method::ALL {
        match kretprobe::register(target, method, None, hold_in_return_handler, 4) {
            Ok(()) => {}
            Err(ProbeError::NotSimulated | ProbeError::NeedsOriginalPc(Text::Kernel)) => continue,
            Err(error) => {
                defmt::error!("  {}: {}", method, error);
                return Err(fail("kretprobe registered"));
            }
        }
        methods_run += 1;
        RETURN_HOLDING.store(false, Ordering::Relaxed);
        RETURN_RELEASE.store(false, Ordering::Relaxed);
        HOLD_NEXT_RETURN.store(true, Ordering::Relaxed);
        let (held, result) = {
            // On this CPU throughout; the other CPU runs the call in its IRQ context.
            let _mask = IrqMask::new();
            let other = (task::this_cpu() + 1) % cpus::wanted();
            // Posted without waiting (a 0 ms timeout): the other CPU is held in the handler.
            let _ = task::cross_call::run_on_within(other, returned_while_held, 1, 0);
            let held = cpu::wait_until(IRQ_WAIT_MS, || RETURN_HOLDING.load(Ordering::Acquire));
            let result = returned_while_held(41);
            RETURN_RELEASE.store(true, Ordering::Release);
            cpu::send_event();
            cpu::wait_until(IRQ_WAIT_MS, || task::cross_call::is_idle(other));
            (held, result)
        };
        let counts = kretprobe::counts(target);
        check!(kretprobe::unregister(target).is_ok());
        if counts != Some((2, 0)) {
            defmt::error!("  {}: counts {}", method, counts);
        }
        check!(held);
        check_eq!(result, 42);
        check!(counts == Some((2, 0)));
    }
    check!(methods_run >= 2);
    Ok(Verdict::Passed)
}

/// Register/unregister rounds per kprobe method and per ftrace scheme (fewer under icount, where
/// CPUs take turns in slices of millions of instructions and each ftrace unregister's grace
/// period waits for the others' turns).
const CHURN_ROUNDS: usize = 1000;
const CHURN_ROUNDS_ICOUNT: usize = 50;
/// ftrace rounds without icount: each patch of kernel text makes TCG stop every vCPU to drop its
/// translations, about 25 ms a round on this host with three callers, so 1,000 rounds per
/// scheme would add over a minute to CI.
const TRACER_CHURN_ROUNDS: usize = 100;
/// kprobe rounds per method without icount: each registration and each unregistration holds
/// every other CPU while it writes the probed word (`task::cpus::with_others_held`), and the
/// unregistration waits for a grace period too: 10 to 60 ms a round on this loaded 2-core host.
/// Before the hold, 1,000 rounds failed 4 runs of 4 (docs/design/smp.md).
const KPROBE_CHURN_ROUNDS: usize = 200;
/// Other CPUs calling the target: one. With three spinning through the ftrace trampoline on a
/// 2-core host shared with other QEMUs, a caller's vCPU thread was starved past the grace
/// period's 100 ms of wall-clock time (its panic names the CPU) in three runs of three; kprobe
/// unregistration waits for a grace period too.
const CHURN_CALLING_CPUS: usize = 1;
static CHURN_STOP: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);
static CHURN_CALLS: AtomicU64 = AtomicU64::new(0);
static CHURN_HITS: AtomicU64 = AtomicU64::new(0);
static CHURN_WRONG: AtomicU64 = AtomicU64::new(0);
/// Callers inside a call of the target now (sampled by the patching CPU: the overlap witness).
static IN_CHURN_CALL: AtomicUsize = AtomicUsize::new(0);
static CHURN_CALLERS: AtomicUsize = AtomicUsize::new(0);

#[inline(never)]
extern "C" fn churn_target(a: u64, b: u64) -> u64 {
    a.wrapping_mul(5) ^ b
}

/// One other CPU's calls of the target in a tight loop until the patcher is done.
extern "C" fn churn_caller(cpu: u64) {
    CHURN_CALLERS.fetch_add(1, Ordering::AcqRel);
    cpu::send_event();
    let call: extern "C" fn(u64, u64) -> u64 = core::hint::black_box(churn_target);
    let mut index = 0u64;
    while !CHURN_STOP.load(Ordering::Acquire) {
        IN_CHURN_CALL.fetch_add(1, Ordering::AcqRel);
        let result = call(index, cpu);
        IN_CHURN_CALL.fetch_sub(1, Ordering::AcqRel);
        CHURN_CALLS.fetch_add(1, Ordering::Relaxed);
        if result != index.wrapping_mul(5) ^ cpu {
            CHURN_WRONG.fetch_add(1, Ordering::Relaxed);
        }
        index += 1;
    }
}

fn count_churn_hit(_: &mut Registers) {
    CHURN_HITS.fetch_add(1, Ordering::Relaxed);
}

#[sanitize(kernel_hwaddress = "off")]
unsafe extern "C" fn churn_tracer(_: u64, _: u64, _: &crate::ftrace::Ops, _: &mut crate::ftrace::Regs) {
    CHURN_HITS.fetch_add(1, Ordering::Relaxed);
}

static CHURN_OPS: crate::ftrace::Ops = crate::ftrace::Ops { func: churn_tracer, private: 0 };

/// Leaves the patch in place until it was hit (the hit count moved from `hits`) or for 1 ms:
/// other CPUs may run their already translated code a while before they see a patch.
fn dwell(hits: u64) {
    cpu::wait_until(1, || CHURN_HITS.load(Ordering::Relaxed) != hits);
}

/// What one patcher (a kprobe method or an ftrace scheme) did to the callers.
struct Churned {
    calls: u64,
    hits: u64,
    wrong: u64,
    /// The most CPUs in the target's patch window at once: this one (patching) and the callers
    /// inside a call of the target when it looked.
    witness: usize,
}

/// Runs `round` `rounds` times on this CPU while `callers` other CPUs call the target; `round`
/// returns the callers it saw inside a call while the patch was in place (or an error).
fn churn(rounds: usize, callers: usize, mut round: impl FnMut() -> Result<usize, Failure>) -> Result<Churned, Failure> {
    let me = task::this_cpu();
    let caller_cpus = || (0..cpus::wanted()).filter(move |&cpu| cpu != me).take(callers);
    let others = caller_cpus().count();
    CHURN_STOP.store(false, Ordering::Relaxed);
    CHURN_CALLS.store(0, Ordering::Relaxed);
    CHURN_HITS.store(0, Ordering::Relaxed);
    CHURN_WRONG.store(0, Ordering::Relaxed);
    CHURN_CALLERS.store(0, Ordering::Relaxed);
    let mut ids = [None; stacks::CPUS];
    let mut outcome = Ok(0);
    for cpu in caller_cpus() {
        match task::spawn_on(CpuMask::one(cpu), "churn-caller", churn_caller, cpu as u64) {
            Ok(id) => ids[cpu] = Some(id),
            Err(_) => outcome = Err(fail("spawn")),
        }
    }
    if outcome.is_ok() && !cpu::wait_until(1000, || CHURN_CALLERS.load(Ordering::Acquire) == others) {
        outcome = Err(fail("the callers started within 1 s"));
    }
    let mut witness = 1;
    for _ in 0..rounds {
        if outcome.is_err() {
            break;
        }
        match round() {
            Ok(inside) => witness = witness.max(1 + inside),
            Err(failure) => outcome = Err(failure),
        }
    }
    CHURN_STOP.store(true, Ordering::Release);
    for id in ids.iter().flatten() {
        task::join(*id);
    }
    outcome?;
    Ok(Churned {
        calls: CHURN_CALLS.load(Ordering::Relaxed),
        hits: CHURN_HITS.load(Ordering::Relaxed),
        wrong: CHURN_WRONG.load(Ordering::Relaxed),
        witness,
    })
}

/// The probed word the step hook watches, and its stores made with every other CPU held or not.
static STEPPED_WORD: AtomicU64 = AtomicU64::new(0);
static HELD_STORES: AtomicU64 = AtomicU64::new(0);
static UNHELD_STORES: AtomicU64 = AtomicU64::new(0);

fn count_probed_word_store(address: u64) {
    if address == STEPPED_WORD.load(Ordering::Relaxed) {
        let count = if cpus::others_held() { &HELD_STORES } else { &UNHELD_STORES };
        count.fetch_add(1, Ordering::Relaxed);
    }
}

/// Arms and disarms a single-step kprobe at `target` once with the patcher stepped: the stores
/// of the probed word made with every other CPU held, and the others.
fn probed_word_stores(target: u64) -> Result<(u64, u64), Failure> {
    STEPPED_WORD.store(target, Ordering::Relaxed);
    HELD_STORES.store(0, Ordering::Relaxed);
    UNHELD_STORES.store(0, Ordering::Relaxed);
    crate::arch::patch::set_step_hook(Some(count_probed_word_store));
    let registered = crate::probes::register(target, Method::SingleStep, count_churn_hit, None).is_ok();
    let unregistered = registered && crate::probes::unregister(target).is_ok();
    crate::arch::patch::set_step_hook(None);
    check!(unregistered);
    Ok((HELD_STORES.load(Ordering::Relaxed), UNHELD_STORES.load(Ordering::Relaxed)))
}

/// A kprobe (each method) and an ftrace tracer (each scheme) registered and unregistered 50
/// times under icount (without: tracers 100 times, kprobes 200, see `TRACER_CHURN_ROUNDS` and
/// `KPROBE_CHURN_ROUNDS`) while another CPU calls the target in a tight loop (one: see
/// `CHURN_CALLING_CPUS`): every call returns the right value, no fault or undefined instruction
/// ends the run, the handler's hits never exceed the calls. Overlap witness: the most CPUs in
/// the patch window at once (the patching one and callers inside a call of the target), >= 2
/// without icount; without icount the probes and tracers must also have been hit. Then the
/// probed word's two stores (arm, disarm) must be made with every other CPU held, and the
/// test-only wrong sequence (`Fault::KprobePatchedUnheld`) must be caught by that check.
fn smp_probe_and_tracer_churn(context: &Context) -> Outcome {
    if cpus::wanted() == 1 {
        return Ok(Verdict::Skipped("one CPU (run with --smp N)"));
    }
    let rounds = if context.icount { CHURN_ROUNDS_ICOUNT } else { CHURN_ROUNDS };
    let function = churn_target as *const () as u64;
    let target = kretprobe::attach_address(function);
    let (mut witness, mut hits, mut patchers) = (0, 0, 0);
    let mut report = |churned: Churned| -> Result<(), Failure> {
        defmt::info!(
            "    {=u64} calls, {=u64} hits, at most {=usize} CPUs in the patch window",
            churned.calls,
            churned.hits,
            churned.witness
        );
        check_eq!(churned.wrong, 0);
        check!(churned.hits <= churned.calls);
        witness = witness.max(churned.witness);
        hits += churned.hits;
        patchers += 1;
        Ok(())
    };
    if crate::ftrace::site_state(function).is_some() {
        for scheme in [crate::ftrace::Scheme::CallOps, crate::ftrace::Scheme::List, crate::ftrace::Scheme::Vector] {
            check!(crate::ftrace::set_scheme(scheme).is_ok());
            let churned = churn(rounds.min(TRACER_CHURN_ROUNDS), CHURN_CALLING_CPUS, || {
                let hits = CHURN_HITS.load(Ordering::Relaxed);
                let tracer = crate::ftrace::register_where(&CHURN_OPS, |entry| entry + 8 == function)
                    .map_err(|_| fail("tracer registered"))?;
                let inside = IN_CHURN_CALL.load(Ordering::Acquire);
                dwell(hits);
                crate::ftrace::unregister(tracer).map_err(|_| fail("tracer unregistered"))?;
                Ok(inside)
            });
            let restored = crate::ftrace::set_scheme(crate::ftrace::Scheme::CallOps).is_ok();
            defmt::info!("  ftrace {}:", defmt::Debug2Format(&scheme));
            report(churned?)?;
            check!(restored);
        }
    }
    for method in Method::ALL {
        match crate::probes::register(target, method, count_churn_hit, None) {
            Ok(()) => check!(crate::probes::unregister(target).is_ok()),
            Err(ProbeError::NotSimulated | ProbeError::NeedsOriginalPc(Text::Kernel)) => continue,
            Err(error) => {
                defmt::error!("  {}: {}", method, error);
                return Err(fail("kprobe registered"));
            }
        }
        let churned = churn(rounds.min(KPROBE_CHURN_ROUNDS), CHURN_CALLING_CPUS, || {
            let hits = CHURN_HITS.load(Ordering::Relaxed);
            crate::probes::register(target, method, count_churn_hit, None).map_err(|_| fail("kprobe registered"))?;
            let inside = IN_CHURN_CALL.load(Ordering::Acquire);
            dwell(hits);
            crate::probes::unregister(target).map_err(|_| fail("kprobe unregistered"))?;
            Ok(inside)
        })?;
        defmt::info!("  kprobe {}:", method);
        report(churned)?;
    }
    // The probed word is armed and disarmed with every other CPU held (the cause of the stale
    // BRK and B without icount, docs/design/smp.md); the wrong sequence must be caught.
    for (unheld, held, order) in [(false, true, "None"), (true, false, "Unheld")] {
        inject::set(Fault::KprobePatchedUnheld, unheld);
        let stores = probed_word_stores(target);
        inject::set(Fault::KprobePatchedUnheld, false);
        let (held_stores, unheld_stores) = stores?;
        defmt::info!(
            "  probed word stores ({=str}): {=u64} with the other CPUs held, {=u64} not",
            order,
            held_stores,
            unheld_stores
        );
        check_eq!(held_stores, if held { 2 } else { 0 });
        check_eq!(unheld_stores, if held { 0 } else { 2 });
    }
    check!(patchers >= if context.icount { 2 } else { 1 });
    defmt::info!("  overlap witness: at most {=usize} CPUs in a patch window at once", witness);
    if !context.icount {
        check!(witness >= 2);
        check!(hits > 0);
    }
    Ok(Verdict::Passed)
}

/// The use-after-free task's report and its task id.
static UAF_REPORT: crate::sync::IrqSpinLock<Option<(u64, Option<crate::mm::kasan::report::Report>)>> =
    crate::sync::IrqSpinLock::new(None);
static UAF_TASK: AtomicUsize = AtomicUsize::new(usize::MAX);

/// Allocates the object the use-after-free task misuses (a frame of its own: the alloc stack
/// must name it).
#[inline(never)]
fn uaf_allocate() -> Option<u64> {
    in_heap(|| crate::mm::kasan::heap::allocate(64, 16))
}

/// Frees it (a frame of its own: the free stack must name it).
#[inline(never)]
fn uaf_free(object: u64) {
    in_heap(|| crate::mm::kasan::heap::free(object));
}

#[inline(never)]
fn uaf_read(address: u64) -> u64 {
    // SAFETY: deliberately reads a freed heap object (mapped memory): the sanitizer must report
    // it, in recover mode.
    unsafe { core::ptr::read_volatile(address as *const u64) }
}

/// On its CPU, once the heap workers run: allocates, frees, then reads the freed object.
extern "C" fn uaf_task(_: u64) {
    while READY.load(Ordering::Acquire) < SAVERS.load(Ordering::Relaxed) {
        cpu::wait_for_event();
    }
    UAF_TASK.store(task::current().0, Ordering::Relaxed);
    // Another CPU may allocate the freed granules (and push the object out of the stack ring)
    // between the free and the read: then the access is still caught, but as an invalid access
    // to an object the ring no longer remembers, as Linux's tag-based KASAN reports it. Each
    // attempt must be reported; the first reported as a use-after-free is kept.
    // The other CPUs pause between this CPU's allocation and its read (each finishes the round
    // it is in: a few ring entries), so their traffic cannot overrun the stack ring in between;
    // they allocate and free before and after every attempt.
    let mut kept = None;
    for _ in 0..UAF_ATTEMPTS {
        UAF_WINDOW.store(true, Ordering::SeqCst);
        let Some(object) = uaf_allocate() else {
            UAF_WINDOW.store(false, Ordering::Release);
            cpu::send_event();
            return;
        };
        uaf_free(object);
        let (reports, report) = crate::mm::kasan::recording::scope(|| {
            core::hint::black_box(uaf_read(object + 8));
        });
        UAF_WINDOW.store(false, Ordering::Release);
        cpu::send_event();
        let use_after_free =
            report.as_ref().is_some_and(|report| report.bug == crate::mm::kasan::report::BugType::UseAfterFree);
        if reports != 1 || use_after_free {
            kept = Some((reports, report));
            break;
        }
        kept = Some((reports, report));
    }
    *UAF_REPORT.lock() = kept;
}

/// Set while the use-after-free task allocates, frees and reads its object: the heap workers
/// wait before their next round.
static UAF_WINDOW: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);

/// Use-after-free attempts before the test gives up finding one whose object was not reused.
const UAF_ATTEMPTS: usize = 8;

/// Whether the saved stack `handle` has a frame in `function`.
fn stack_names(handle: u32, function: u64) -> bool {
    let mut buffer = [0; stackdepot::MAX_FRAMES];
    crate::mm::kasan::record::saved_frames(handle, &mut buffer).iter().any(|&address| {
        crate::symbols::callsites::function_containing(address).is_some_and(|(start, _)| start == function)
    })
}

/// A deliberate use-after-free on one CPU while every other CPU allocates and frees: it is
/// reported once, as a use-after-free of that object, with the alloc and free stacks of that
/// CPU's task (its task id, frames in `uaf_allocate` and `uaf_free`), and the others' heap work
/// stays right. Overlap witness: CPUs inside allocate/free at once, >= 2 without icount.
fn smp_heap_use_after_free_reported(context: &Context) -> Outcome {
    let wanted = cpus::wanted();
    if wanted == 1 {
        return Ok(Verdict::Skipped("one CPU (run with --smp N)"));
    }
    if !crate::mm::kasan::CHECKS_COMPILED_IN && !crate::mm::kasan::HARDWARE_TAGS {
        return Ok(Verdict::Skipped("no tag checks in this build (`full` or `mte`)"));
    }
    let uaf_cpu = if task::this_cpu() == 1 { 0 } else { 1 };
    HEAP_WRONG.store(0, Ordering::Relaxed);
    MOST_IN_HEAP.store(0, Ordering::Relaxed);
    READY.store(0, Ordering::Relaxed);
    SAVERS.store(wanted - 1, Ordering::Relaxed);
    UAF_TASK.store(usize::MAX, Ordering::Relaxed);
    *UAF_REPORT.lock() = None;
    let mut ids = [None; stacks::CPUS];
    for (cpu, id) in ids.iter_mut().enumerate().take(wanted) {
        let spawned = if cpu == uaf_cpu {
            task::spawn_on(CpuMask::one(cpu), "uaf", uaf_task, 0)
        } else {
            task::spawn_on(CpuMask::one(cpu), "heap-worker", heap_worker, cpu as u64)
        };
        *id = Some(spawned.map_err(|_| fail("spawn"))?);
    }
    for id in ids.iter().take(wanted).flatten() {
        check!(task::join(*id) == State::Exited);
    }
    let (reports, report) = UAF_REPORT.lock().take().ok_or(fail("the use-after-free task ran"))?;
    let most = MOST_IN_HEAP.load(Ordering::Relaxed);
    defmt::info!("  overlap witness: at most {=usize} of {=usize} CPUs in the heap at once", most, wanted);
    check_eq!(reports, 1);
    let report = report.ok_or(fail("a report was recorded"))?;
    check!(report.bug == crate::mm::kasan::report::BugType::UseAfterFree);
    let object = report.object.ok_or(fail("the report names the object"))?;
    let task = UAF_TASK.load(Ordering::Relaxed) as u16;
    check!(object.alloc_task == Some(task));
    check!(object.free_task == Some(task));
    check!(stack_names(object.alloc_stack, uaf_allocate as *const () as u64));
    check!(stack_names(object.free_stack, uaf_free as *const () as u64));
    check_eq!(HEAP_WRONG.load(Ordering::Relaxed), 0);
    if !context.icount {
        check!(most >= 2);
    }
    Ok(Verdict::Passed)
}

// --- uprobes hit on every CPU at once -------------------------------------------------------

core::arch::global_asm!(
    r#"
    .section .text.user, "ax"
// x0 = target, x1 = calls (>= 1), x2 = start counter value: waits until CNTVCT_EL0 reaches x2
// (so that every CPU's task starts together), then calls target(i, x2) for i in 0..calls;
// exit(calls whose result was not i + x2).
    .balign 16
    .global smp_user_probed_calls
smp_user_probed_calls:
    mov     x19, x0
    mov     x20, x1
    mov     x21, x2
    mov     x22, #0
    mov     x23, #0
1:  mrs     x9, cntvct_el0
    cmp     x9, x21
    b.lo    1b
2:  mov     x0, x23
    mov     x1, x21
    blr     x19
    add     x9, x23, x21
    cmp     x0, x9
    cinc    x22, x22, ne
    add     x23, x23, #1
    cmp     x23, x20
    b.ne    2b
    mov     x0, x22
    mov     x8, #0
    svc     #0
// The probed function: a frame push (every uprobe method applies), x0 + x1.
    .balign 16
    .global smp_user_probed_sum
smp_user_probed_sum:
    stp     x29, x30, [sp, #-16]!
    mov     x29, sp
    add     x0, x0, x1
    ldp     x29, x30, [sp], #16
    ret
"#
);

unsafe extern "C" {
    static smp_user_probed_calls: u32;
    static smp_user_probed_sum: u32;
}

/// Uprobe hits per CPU calling task, and its calls.
const UPROBE_CALLS_PER_CPU: u64 = 2_000;
/// Handler runs per CPU (each its own line: the count is not what is contended).
#[repr(align(64))]
struct UprobeHitLine(AtomicU64);
static UPROBE_HITS: [UprobeHitLine; stacks::CPUS] = [const { UprobeHitLine(AtomicU64::new(0)) }; stacks::CPUS];
/// CPUs inside the uprobe handler now, and the most at once (the overlap witness).
static IN_UPROBE_HANDLER: AtomicUsize = AtomicUsize::new(0);
static MOST_IN_UPROBE_HANDLER: AtomicUsize = AtomicUsize::new(0);

fn count_uprobe_hit(_: &mut Registers) {
    let inside = IN_UPROBE_HANDLER.fetch_add(1, Ordering::AcqRel) + 1;
    MOST_IN_UPROBE_HANDLER.fetch_max(inside, Ordering::Relaxed);
    let hits = UPROBE_HITS[percpu::this_cpu_index()].0.fetch_add(1, Ordering::Relaxed) + 1;
    if hits == 1 {
        // A CPU's first hit waits (bounded) for another CPU inside: on a loaded host the vCPUs
        // may otherwise run one after the other, and the witness would say so.
        cpu::wait_until(20, || IN_UPROBE_HANDLER.load(Ordering::Acquire) >= 2);
    }
    // Stays a little, so that the CPUs' handlers (and the steps around them) overlap.
    for spin in 0..64 {
        core::hint::black_box(spin);
    }
    IN_UPROBE_HANDLER.fetch_sub(1, Ordering::AcqRel);
}

/// What one round of concurrent uprobe hits did.
struct UprobeRound {
    /// Calls whose result was wrong (over every task that exited).
    wrong: u64,
    /// Tasks killed by a fault (a step not recognised, ...).
    killed: usize,
    /// Handler runs, and the probe's own hit count.
    handled: u64,
    counted: Option<(u64, u64)>,
    /// The overlap witness.
    most: usize,
}

/// An EL0 task on each of the `wanted` CPUs calls the uprobe'd `smp_user_probed_sum`
/// `UPROBE_CALLS_PER_CPU` times, all starting at one counter value.
fn uprobe_round(method: Method, slots: uprobes::XolSlots, wanted: usize) -> Result<UprobeRound, Failure> {
    // Only the addresses of the asm symbols are taken.
    let program = user::user_address(&raw const smp_user_probed_calls as u64);
    let target = user::user_address(&raw const smp_user_probed_sum as u64);
    if let Err(error) = uprobes::register_with_slots(target, method, count_uprobe_hit, None, slots) {
        defmt::error!("  {} {}: {}", method, slots, error);
        return Err(fail("uprobe registered"));
    }
    UPROBE_HITS.iter().for_each(|line| line.0.store(0, Ordering::Relaxed));
    MOST_IN_UPROBE_HANDLER.store(0, Ordering::Relaxed);
    let start = crate::drivers::timer::counter() + crate::drivers::timer::frequency() * cpu::patience_ms(5) / 1000;
    let mut ids = [None; stacks::CPUS];
    for (cpu, id) in ids.iter_mut().enumerate().take(wanted) {
        // Masked from spawn to the move, so the task never starts on this CPU (`user::run_on`).
        let _masked = IrqMask::new();
        if let Ok(spawned) =
            user::spawn("uprobe-caller", program, [target, UPROBE_CALLS_PER_CPU, start], user::Options::DEFAULT)
        {
            task::set_affinity(spawned, CpuMask::one(cpu));
            *id = Some(spawned);
        }
    }
    let (mut wrong, mut killed) = (0, 0);
    for id in ids.iter().take(wanted).flatten() {
        task::join(*id);
        match (user::exit_code(*id), user::fault(*id)) {
            (Some(code), _) => wrong += code,
            _ => killed += 1,
        }
    }
    let counted = uprobes::counts(target);
    check!(uprobes::unregister(target).is_ok());
    check!(ids.iter().take(wanted).all(Option::is_some));
    Ok(UprobeRound {
        wrong,
        killed,
        handled: UPROBE_HITS.iter().map(|line| line.0.load(Ordering::Relaxed)).sum(),
        counted,
        most: MOST_IN_UPROBE_HANDLER.load(Ordering::Relaxed),
    })
}

/// An EL0 task on every CPU calls one uprobe'd user function 2,000 times, all at once, per
/// method: every call returns the right value, no task faults, the handler ran and the probe
/// counted exactly once per call (the step state is per CPU: `percpu::UserStepControl`). Overlap
/// witness: the most CPUs inside the uprobe handler at once, over all methods, at least 2.
fn smp_uprobe_hits_every_cpu_at_once(_: &Context) -> Outcome {
    let wanted = cpus::wanted();
    if wanted == 1 {
        return Ok(Verdict::Skipped("one CPU (run with --smp N)"));
    }
    let calls = UPROBE_CALLS_PER_CPU * wanted as u64;
    let mut witness = 0;
    for method in Method::ALL {
        let round = uprobe_round(method, uprobes::XolSlots::PerProbe, wanted)?;
        defmt::info!(
            "  {}: at most {=usize} of {=usize} CPUs inside the uprobe handler at once",
            method,
            round.most,
            wanted
        );
        check_eq!(round.killed, 0);
        check_eq!(round.wrong, 0);
        check_eq!(round.handled, calls);
        check!(round.counted == Some((calls, 0)));
        witness = witness.max(round.most);
    }
    defmt::info!(
        "  overlap witness: at most {=usize} of {=usize} CPUs inside the uprobe handler at once",
        witness,
        wanted
    );
    check!(witness >= 2);
    Ok(Verdict::Passed)
}

/// The previous test's check can fail: with the uprobe step state made one for all CPUs again
/// (the test-only `Fault::UserStepStateShared`, applied at the round's registration), the same concurrent hits of the
/// stepping methods go wrong (a CPU finishes another's step and clears it, its own step back is
/// then nobody's: the task is killed; or a hit is lost). Under icount (deterministic; without it
/// the collisions depend on the host).
fn smp_uprobe_shared_step_state_is_caught(context: &Context) -> Outcome {
    let wanted = cpus::wanted();
    if wanted == 1 {
        return Ok(Verdict::Skipped("one CPU (run with --smp N)"));
    }
    if !context.icount {
        return Ok(Verdict::Skipped("icount only (the collisions are deterministic there)"));
    }
    let calls = UPROBE_CALLS_PER_CPU * wanted as u64;
    for method in [Method::SingleStep, Method::BrkStep] {
        inject::set(Fault::UserStepStateShared, true);
        let round = uprobe_round(method, uprobes::XolSlots::PerProbe, wanted);
        // A task killed mid-step leaves no step armed on its CPU (trap's `user_fault`); the next
        // registration points every CPU at its own state again.
        inject::set(Fault::UserStepStateShared, false);
        let round = round?;
        defmt::info!(
            "  {} with one shared step state: {=usize} of {=usize} tasks killed, {=u64} wrong results, {=u64} of {=u64} hits handled",
            method,
            round.killed,
            wanted,
            round.wrong,
            round.handled,
            calls
        );
        check!(round.killed > 0 || round.wrong > 0 || round.handled != calls || round.counted != Some((calls, 0)));
    }
    Ok(Verdict::Passed)
}

/// The per-CPU XOL slot strategy on every CPU at once: an EL0 task on every CPU calls a
/// stepped uprobe whose instruction runs in that CPU's slot, rewritten at each hit (with and
/// without skipping an unchanged slot), per stepping method: every result right, no task
/// faulted, handler runs and the probe's count exactly the calls, and no hit waited for a slot.
fn smp_uprobe_cpu_slots_every_cpu_at_once(_: &Context) -> Outcome {
    let wanted = cpus::wanted();
    if wanted == 1 {
        return Ok(Verdict::Skipped("one CPU (run with --smp N)"));
    }
    let calls = UPROBE_CALLS_PER_CPU * wanted as u64;
    let mut witness = 0;
    for skip_unchanged in [false, true] {
        let slots = uprobes::XolSlots::PerCpu { skip_unchanged };
        for method in [Method::SingleStep, Method::BrkStep] {
            let waits = uprobes::slot_waits();
            let round = uprobe_round(method, slots, wanted)?;
            defmt::info!(
                "  {} {}: at most {=usize} of {=usize} CPUs inside the uprobe handler at once",
                method,
                slots,
                round.most,
                wanted
            );
            check_eq!(round.killed, 0);
            check_eq!(round.wrong, 0);
            check_eq!(round.handled, calls);
            check!(round.counted == Some((calls, 0)));
            check_eq!(uprobes::slot_waits(), waits);
            witness = witness.max(round.most);
        }
    }
    check!(witness >= 2);
    Ok(Verdict::Passed)
}

/// The CPU whose waits `run_queue_holder` waits to see, its retries before, and whether the
/// holder has the lock.
static WAITER: AtomicUsize = AtomicUsize::new(0);
static WAITER_RETRIES: AtomicU64 = AtomicU64::new(0);
static RUN_QUEUE_HELD: AtomicBool = AtomicBool::new(false);

/// Holds the run queue's lock until the waiting CPU's retry count moves (at most 1 s).
extern "C" fn run_queue_holder(_: u64) {
    task::with_run_queue_locked(|| {
        RUN_QUEUE_HELD.store(true, Ordering::Release);
        let waiter = WAITER.load(Ordering::Relaxed);
        let before = WAITER_RETRIES.load(Ordering::Relaxed);
        cpu::wait_until(1000, || task::run_queue_retries(waiter) != before);
    });
}

/// A CPU that finds the run queue's lock held counts its failed attempts
/// (`task::run_queue_retries`): the probe sweep compares a pass's hit counts only when CPU 0's
/// count did not move, since the lock's retry loop is inlined into every user of the task table
/// (the whole 4-CPU `full` sweep with a list tracer: `task::join+0x70..0x7c`, the retry's
/// `clrex`, `isb` and `ldrb`, counted 13 on CPU 0 with single-step and 0 with brk-step and
/// detour). Another CPU holds the lock until this CPU's count moves; without the count it lets
/// go after 1 s and the check fails.
fn smp_run_queue_retries_count_waits(_: &Context) -> Outcome {
    if cpus::online() < 2 {
        return Ok(Verdict::Skipped("one CPU (run with --smp N)"));
    }
    // Masked: this test stays on this CPU from the count to the lock.
    let _masked = IrqMask::new();
    let me = percpu::this_cpu_index();
    WAITER.store(me, Ordering::Relaxed);
    WAITER_RETRIES.store(task::run_queue_retries(me), Ordering::Relaxed);
    RUN_QUEUE_HELD.store(false, Ordering::Relaxed);
    let holder_cpu = (me + 1) % cpus::online();
    let holder =
        task::spawn_on(CpuMask::one(holder_cpu), "run-queue-holder", run_queue_holder, 0).map_err(|_| fail("spawn"))?;
    check!(cpu::wait_until(1000, || RUN_QUEUE_HELD.load(Ordering::Acquire)));
    let before = WAITER_RETRIES.load(Ordering::Relaxed);
    // Takes the lock the holder has.
    let _ = task::state(holder);
    let retries = task::run_queue_retries(me) - before;
    defmt::info!(
        "  cpu {=usize} retried the run queue's lock {=u64} times while cpu {=usize} held it",
        me,
        retries,
        holder_cpu
    );
    check!(retries > 0);
    drop(_masked);
    check!(task::join(holder) == State::Exited);
    Ok(Verdict::Passed)
}

/// Draws per CPU in `smp_stack_sample_draws_per_cpu`, at period `SAMPLE_EVERY`.
const SAMPLE_DRAWS: usize = 4096;
const SAMPLE_EVERY: u32 = 2;
/// The seed the sampling test draws from (any value: each CPU's stream follows from it).
const SAMPLE_TEST_SEED: u32 = 0x5a3c_0f17;
/// CPUs ready to draw; the drawing CPUs start together once all are.
static SAMPLE_READY: AtomicUsize = AtomicUsize::new(0);
/// Per CPU: the fingerprint of its draws' decisions (plus one: 0 means it did not draw).
static SAMPLE_SEEN: [AtomicU64; stacks::CPUS] = [const { AtomicU64::new(0) }; stacks::CPUS];

/// A fold of `SAMPLE_DRAWS` decisions in order: any reordering, loss or foreign draw changes it.
fn sample_fingerprint(decisions: impl Iterator<Item = bool>) -> u64 {
    decisions
        .fold(0xcbf2_9ce4_8422_2325, |hash, sampled| (hash ^ u64::from(sampled) ^ 0x100).wrapping_mul(0x0100_0000_01b3))
}

/// What CPU `cpu` draws after `seed_stack_sample(SAMPLE_TEST_SEED)` when it alone uses its state.
fn expected_sample_fingerprint(cpu: usize) -> u64 {
    let mut state = stacktrace::sample_seed(SAMPLE_TEST_SEED, cpu);
    sample_fingerprint((0..SAMPLE_DRAWS).map(|_| {
        state = stacktrace::next_sample_state(state);
        stacktrace::sampled(state, SAMPLE_EVERY)
    }))
}

/// A task pinned to one CPU: waits for the others, then draws with IRQs masked (nothing else on
/// its CPU draws in between) and records the fingerprint.
extern "C" fn sample_drawer(participants: u64) {
    let _masked = IrqMask::new();
    SAMPLE_READY.fetch_add(1, Ordering::AcqRel);
    let together = cpu::wait_until(1000, || SAMPLE_READY.load(Ordering::Acquire) >= participants as usize);
    let fingerprint = sample_fingerprint((0..SAMPLE_DRAWS).map(|_| stacktrace::sample_allocation()));
    if together {
        SAMPLE_SEEN[percpu::this_cpu_index()].store(fingerprint.wrapping_add(1), Ordering::Release);
    }
}

/// Every CPU's draws at once; how many CPUs drew exactly their own stream.
fn draw_on_every_cpu(cpus: usize) -> Result<usize, Failure> {
    stacktrace::seed_stack_sample(SAMPLE_TEST_SEED);
    SAMPLE_READY.store(0, Ordering::Relaxed);
    let mut ids = [None; stacks::CPUS];
    // Every drawer spawned before this task can be preempted: the drawer on this CPU, run at a
    // tick between the spawns, would mask IRQs and wait for drawers not spawned yet.
    let spawning = IrqMask::new();
    for (cpu, id) in ids.iter_mut().enumerate().take(cpus) {
        SAMPLE_SEEN[cpu].store(0, Ordering::Relaxed);
        *id = Some(
            task::spawn_on(CpuMask::one(cpu), "sample-drawer", sample_drawer, cpus as u64)
                .map_err(|_| fail("spawn"))?,
        );
    }
    drop(spawning);
    let mut own_streams = 0;
    for (cpu, id) in ids.iter().enumerate().take(cpus) {
        check!(task::join(id.expect("spawned above")) == State::Exited);
        let seen = SAMPLE_SEEN[cpu].load(Ordering::Acquire);
        check!(seen != 0);
        if seen - 1 == expected_sample_fingerprint(cpu) {
            own_streams += 1;
        }
    }
    Ok(own_streams)
}

/// Allocation-stack sampling keeps its draw per CPU: with every CPU drawing at once, each CPU's
/// decisions are exactly the single-CPU stream for its seed and CPU number
/// (`stacktrace::sample_seed`). With the fault that points every CPU at CPU 0's state (the one
/// shared state the draw once had), the CPUs other than 0 draw CPU 0's stream and the check sees
/// it: the detector can fail.
fn smp_stack_sample_draws_per_cpu(_: &Context) -> Outcome {
    let cpus = cpus::online();
    if cpus < 2 {
        return Ok(Verdict::Skipped("one CPU (run with --smp N)"));
    }
    // The run's own draws continue where they were once the test is done.
    let saved: [u64; stacks::CPUS] =
        core::array::from_fn(|cpu| percpu::cpu_data(cpu).allocation_sample.load(Ordering::Relaxed));
    let every = stacktrace::stack_sample();
    stacktrace::set_stack_sample(SAMPLE_EVERY);
    let per_cpu = draw_on_every_cpu(cpus);
    let shared = {
        let _fault = crate::inject::Injected::new(crate::inject::Fault::StackSampleStateShared);
        draw_on_every_cpu(cpus)
    };
    stacktrace::set_stack_sample(every);
    for (cpu, state) in saved.iter().enumerate() {
        percpu::cpu_data(cpu).allocation_sample.store(*state, Ordering::Relaxed);
    }
    let (per_cpu, shared) = (per_cpu?, shared?);
    defmt::info!("  {=usize} CPUs drew their own stream; with one shared state, {=usize}", per_cpu, shared);
    check_eq!(per_cpu, cpus);
    check!(shared < cpus);
    Ok(Verdict::Passed)
}

/// Tags each CPU draws in the tag generator tests.
const TAG_DRAWS: usize = 512;
/// The seed the tag generator tests draw from.
const TAG_TEST_SEED: u32 = 0x5eed_7a65;
/// CPUs drawing tags (the first `TAG_DRAWERS` CPUs), and those ready with IRQs masked.
const TAG_DRAWERS: usize = 2;
static TAGS_READY: AtomicUsize = AtomicUsize::new(0);
static TAGS_GO: AtomicBool = AtomicBool::new(false);
/// Per drawing CPU: draws that differed from the single-CPU sequence for its seed.
static TAG_MISMATCHES: [AtomicU64; TAG_DRAWERS] = [const { AtomicU64::new(0) }; TAG_DRAWERS];

/// One CPU's draws: with IRQs masked (as the heap draws), it waits for the other drawer, the
/// last to arrive seeds every CPU's generator, then both draw at once and compare each tag with
/// the sequence a single CPU draws from its seed (`shadow::seed_of`).
extern "C" fn tag_drawer(cpu: u64) {
    use crate::mm::kasan::shadow::{self, ShadowTags};
    use crate::mm::kasan::storage::TagStorage;
    let _masked = IrqMask::new();
    let cpu = cpu as usize;
    if TAGS_READY.fetch_add(1, Ordering::AcqRel) + 1 == TAG_DRAWERS {
        ShadowTags::seed(TAG_TEST_SEED);
        TAGS_GO.store(true, Ordering::Release);
        cpu::send_event();
    }
    while !TAGS_GO.load(Ordering::Acquire) {
        cpu::wait_for_event();
    }
    let mut state = shadow::seed_of(TAG_TEST_SEED, percpu::this_cpu_index());
    let mut mismatches = 0;
    for _ in 0..TAG_DRAWS {
        state = shadow::next_state(state);
        if ShadowTags::random_tag() != shadow::tag_of_state(state) {
            mismatches += 1;
        }
    }
    TAG_MISMATCHES[cpu].store(mismatches, Ordering::Relaxed);
}

/// Runs `tag_drawer` on CPUs 0 and 1 at once, with every CPU drawing from CPU 0's state when
/// `shared` (`Fault::TagStateShared`, which takes effect when the drawers seed); each drawer's
/// mismatches. The fault is off again and the generators' states are put back afterwards, so
/// the run's later tags are what they would have been.
fn tag_round(shared: bool) -> Result<[u64; TAG_DRAWERS], Failure> {
    let saved = crate::mm::kasan::shadow::states();
    let injected = shared.then(|| crate::inject::Injected::new(crate::inject::Fault::TagStateShared));
    TAGS_READY.store(0, Ordering::Relaxed);
    TAGS_GO.store(false, Ordering::Relaxed);
    let mut ids = [None; TAG_DRAWERS];
    // Both drawers spawned before this task can be preempted: the drawer on this CPU, run at a
    // tick between the spawns, would mask IRQs and wait for a drawer not spawned yet.
    let spawning = IrqMask::new();
    for (cpu, id) in ids.iter_mut().enumerate() {
        TAG_MISMATCHES[cpu].store(u64::MAX, Ordering::Relaxed);
        *id = Some(task::spawn_on(CpuMask::one(cpu), "tag-drawer", tag_drawer, cpu as u64).map_err(|_| fail("spawn"))?);
    }
    drop(spawning);
    let mut exited = true;
    for id in ids.iter().flatten() {
        exited &= task::join(*id) == State::Exited;
    }
    drop(injected);
    crate::mm::kasan::shadow::restore(saved);
    check!(exited);
    Ok(core::array::from_fn(|cpu| TAG_MISMATCHES[cpu].load(Ordering::Relaxed)))
}

/// The sanitizer's tag generator is per CPU: two CPUs drawing at once each draw exactly the
/// sequence one CPU draws alone from its seed (`tag-seed` mixed with its number), so a run's
/// tags stay reproducible on several CPUs.
fn smp_tag_generator_per_cpu(_: &Context) -> Outcome {
    if cpus::online() < TAG_DRAWERS {
        return Ok(Verdict::Skipped("one CPU (run with --smp N)"));
    }
    let mismatches = tag_round(false)?;
    defmt::info!("  tags unlike the single-CPU sequence: cpu 0 {=u64}, cpu 1 {=u64}", mismatches[0], mismatches[1]);
    check_eq!(mismatches[0], 0);
    check_eq!(mismatches[1], 0);
    Ok(Verdict::Passed)
}

/// The previous test's check can fail: with every CPU drawing from CPU 0's state
/// (`Fault::TagStateShared`), CPU 1's tags are not its own sequence's.
fn smp_tag_generator_shared_state_is_caught(_: &Context) -> Outcome {
    if cpus::online() < TAG_DRAWERS {
        return Ok(Verdict::Skipped("one CPU (run with --smp N)"));
    }
    let mismatches = tag_round(true)?;
    defmt::info!(
        "  with one shared state, tags unlike the single-CPU sequence: cpu 0 {=u64}, cpu 1 {=u64}",
        mismatches[0],
        mismatches[1]
    );
    check!(mismatches[1] > 0);
    Ok(Verdict::Passed)
}
