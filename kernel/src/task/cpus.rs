//! Which CPUs run the kernel: the secondaries the machine offers (device tree CPUs through PSCI,
//! or the board's spin table), capped by `cpus=N`, each started on its idle slot.

use super::stacks;
use crate::arch::exception::ExceptionFrame;
use crate::arch::park;
use crate::arch::smp::{self, Release, StartError};
use crate::board::{CpuList, PsciConduit};
use crate::sync::IrqMask;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};

/// CPUs `bring_up` tried to run, the boot CPU included (0 before it ran).
static WANTED: AtomicUsize = AtomicUsize::new(0);

/// CPUs the kernel tried to run (all of them should be online).
pub fn wanted() -> usize {
    WANTED.load(Ordering::Relaxed)
}

/// Per CPU: wake-up SGIs its idle loop took.
static WAKES: [AtomicU64; stacks::CPUS] = [const { AtomicU64::new(0) }; stacks::CPUS];

/// Wake-up SGIs CPU `cpu` took.
pub fn wakes(cpu: usize) -> u64 {
    WAKES[cpu].load(Ordering::Acquire)
}

/// Set by `stop_others`: a CPU that sees it on a wake-up stops for good.
static STOP: AtomicBool = AtomicBool::new(false);
/// Bit n: CPU n stopped on request.
static STOPPED: AtomicU64 = AtomicU64::new(0);
/// Per CPU: the context it was in when it stopped (its IRQ frame, or the frame a second panic
/// built on its own stack) and the task it was running, published before its `STOPPED` bit.
static STOPPED_AT: [AtomicPtr<ExceptionFrame>; stacks::CPUS] =
    [const { AtomicPtr::new(core::ptr::null_mut()) }; stacks::CPUS];
static STOPPED_TASK: [AtomicUsize; stacks::CPUS] = [const { AtomicUsize::new(0) }; stacks::CPUS];

/// The context CPU `cpu` stopped in and the stack slot of the task it ran, if it stopped
/// (`stop_others`, or a panic while another CPU reports one): the panic report walks it.
pub fn stopped_context(cpu: usize) -> Option<(&'static ExceptionFrame, stacks::Slot)> {
    if STOPPED.load(Ordering::Acquire) & (1 << cpu) == 0 {
        return None;
    }
    let frame = STOPPED_AT[cpu].load(Ordering::Relaxed);
    // SAFETY: a stopped CPU never leaves `stop_this_cpu`, so the frame on its stack stays as it
    // was saved; the Acquire load of its `STOPPED` bit orders this read after the save.
    let frame = unsafe { frame.as_ref() }?;
    Some((frame, super::task_slot(STOPPED_TASK[cpu].load(Ordering::Relaxed))))
}

/// Stops every other online CPU (a panic: nothing else runs while the report is printed and the
/// kernel exits): sets `STOP`, sends each the wake-up SGI, waits up to 100 ms for all to confirm.
/// Returns (CPUs that stopped, CPUs asked).
pub fn stop_others() -> (usize, usize) {
    let me = crate::arch::percpu::this_cpu_index();
    let others = smp::online_mask() & !(1 << me);
    STOP.store(true, Ordering::Release);
    for cpu in (0..stacks::CPUS).filter(|cpu| others & (1 << cpu) != 0) {
        crate::drivers::interrupts::send_wake(cpu);
    }
    crate::arch::cpu::wait_until(100, || STOPPED.load(Ordering::Acquire) & others == others);
    let stopped = STOPPED.load(Ordering::Acquire) & others;
    (stopped.count_ones() as usize, others.count_ones() as usize)
}

/// The wake-up SGI (IRQ context, every CPU): after `stop_others` it stops this CPU for good;
/// otherwise it counts the wake-up, serves what other CPUs asked of this one, asks for a
/// reschedule at the end of the IRQ (a task may have been made runnable here) and answers with
/// `sev`.
fn on_wake_sgi() {
    let cpu = crate::arch::percpu::this_cpu_index();
    if STOP.load(Ordering::Acquire) {
        stop_this_cpu(cpu, crate::arch::percpu::this_cpu().irq_frame.load(Ordering::Relaxed));
    }
    WAKES[cpu].fetch_add(1, Ordering::Release);
    serve_hold();
    super::cross_call::serve();
    crate::arch::percpu::this_cpu().need_resched.store(true, Ordering::Relaxed);
    // SAFETY: wakes a CPU waiting for this answer with `wfe`.
    unsafe { core::arch::asm!("dsb ish", "sev", options(nomem, nostack, preserves_flags)) };
}

/// A panic on this CPU while another CPU reports one: stops this CPU as `stop_others` would,
/// leaving this call's context (PC, x29, x18) for the report, which walks it from here to the
/// panicking function.
#[inline(never)]
pub fn stop_this_cpu_in_panic() -> ! {
    crate::arch::cpu::mask_interrupts();
    // SAFETY: an exception frame is plain integers; all zeros is a valid value.
    let mut frame: ExceptionFrame = unsafe { core::mem::zeroed() };
    let (pc, fp, x18): (u64, u64, u64);
    // SAFETY: reads this point's address, x29 and x18; no memory is touched.
    unsafe {
        core::arch::asm!("adr {}, .", "mov {}, x29", "mov {}, x18", out(reg) pc, out(reg) fp, out(reg) x18,
            options(nomem, nostack, preserves_flags));
    }
    frame.elr = pc;
    frame.x[29] = fp;
    frame.x[18] = x18;
    frame.spsr = SPSR_EL1H;
    stop_this_cpu(crate::arch::percpu::this_cpu_index(), &mut frame)
}

/// SPSR.M of EL1 with SP_EL1: the mode a kernel context runs in.
const SPSR_EL1H: u64 = 0b0101;

/// Leaves `frame` (this CPU's interrupted context; it lives on this CPU's stack, which is never
/// left) for the report, confirms the stop to the CPU in `stop_others` and waits forever with
/// interrupts masked.
fn stop_this_cpu(cpu: usize, frame: *mut ExceptionFrame) -> ! {
    crate::arch::cpu::mask_interrupts();
    STOPPED_AT[cpu].store(frame, Ordering::Relaxed);
    STOPPED_TASK[cpu].store(super::current().0, Ordering::Relaxed);
    STOPPED.fetch_or(1 << cpu, Ordering::Release);
    // SAFETY: tells the stopping CPU (waiting with `wfe`) that this one stopped.
    unsafe { core::arch::asm!("dsb ish", "sev", options(nomem, nostack, preserves_flags)) };
    loop {
        crate::arch::cpu::wait_for_interrupt();
    }
}

/// A secondary's life once its arch state is set up: its GIC interface, its idle task (the
/// context it started in), its tick, online; then it idles in `wfi` with IRQs unmasked, running
/// other tasks when the tick or a wake-up SGI reschedules it.
fn secondary_idle(cpu: usize) -> ! {
    crate::drivers::interrupts::init_this_cpu();
    super::become_idle(cpu);
    crate::drivers::timer::start_this_cpu();
    super::user::init_this_cpu();
    smp::mark_this_cpu_online();
    crate::arch::cpu::enable_interrupts();
    super::idle_loop()
}

/// A grace period: waits until every other online CPU has passed a quiescent point (a task
/// switch or an idle pass: `task::quiescent_point`) after the call began. Each is sent a wake-up
/// SGI, whose end reschedules it (a switch or not, a quiescent point), so an idle or busy CPU
/// answers at once rather than at its next tick; again every `RESEND_MS` until it has. Waits with
/// `wfe`; panics naming a CPU that has not answered within `SYNCHRONIZE_MS` times the patience
/// factor (one running with IRQs masked, or stuck).
pub fn synchronize() {
    let me = crate::arch::percpu::this_cpu_index();
    let others = smp::online_mask() & !(1 << me) & !STOPPED.load(Ordering::Acquire);
    if others == 0 {
        return;
    }
    // The caller's patch is visible before the counts are read (see `quiescent_point`).
    core::sync::atomic::fence(Ordering::SeqCst);
    let count = |cpu: usize| crate::arch::percpu::cpu_data(cpu).quiescent.load(Ordering::Acquire);
    let before: [u64; stacks::CPUS] = core::array::from_fn(count);
    let waiting = || (0..stacks::CPUS).filter(move |&cpu| others & (1 << cpu) != 0);
    for cpu in waiting() {
        crate::drivers::interrupts::send_wake(cpu);
    }
    let passed = || waiting().all(|cpu| count(cpu) != before[cpu]);
    // The wake-up is sent again every `RESEND_MS` to the CPUs that have not passed yet: one that
    // took it inside probe code defers its reschedule (trap/mod.rs), and a CPU whose tick is
    // stopped would otherwise take no further IRQ. A CPU that passed between the last check and
    // the timeout completes the period too (the report must name a CPU that really has not).
    // The slices are milliseconds of counter time: the patience factor (no icount) lengthens the
    // whole wait, not the resend interval.
    let mut done = false;
    for slice in 1..=crate::arch::cpu::patience_ms(SYNCHRONIZE_MS) {
        if crate::arch::cpu::wait_exactly(1, passed) {
            done = true;
            break;
        }
        if slice % RESEND_MS != 0 {
            continue;
        }
        for cpu in waiting().filter(|&cpu| count(cpu) == before[cpu]) {
            crate::drivers::interrupts::send_wake(cpu);
        }
    }
    if !done && let Some(stuck) = waiting().find(|&cpu| count(cpu) == before[cpu]) {
        panic!(
            "grace period: cpu {} passed no quiescent point within {} ms",
            stuck,
            crate::arch::cpu::patience_ms(SYNCHRONIZE_MS)
        );
    }
}

/// Runs `change` (a text patch) while every other online CPU is held with IRQs masked in its
/// wake-up SGI, then lets them go; each executes `isb` before it returns (Linux's `stop_machine`
/// around `aarch64_insn_patch_text`). Needed for a change the architecture does not allow
/// concurrently with execution (ARM ARM B2.2.5: both the old and the new instruction must be
/// B, BL, BRK, NOP, ISB, SVC, HVC or SMC; a kprobe arms and disarms any instruction): no other
/// CPU executes, or fetches, the word while it changes, and each passes a context
/// synchronization event after the change (docs/design/smp.md, "Holding the other CPUs").
/// Returns `change`'s result. Panics naming a CPU that was not held within `HOLD_MS` (times the
/// patience factor).
pub fn with_others_held<R>(change: impl FnOnce() -> R) -> R {
    let masked = take_hold_lock();
    let me = crate::arch::percpu::this_cpu_index();
    let others = smp::online_mask() & !(1 << me) & !STOPPED.load(Ordering::Acquire);
    let generation = HOLD_GENERATION.load(Ordering::Relaxed) + 1;
    HOLD_GENERATION.store(generation, Ordering::Release);
    let waiting = || (0..stacks::CPUS).filter(move |&cpu| others & (1 << cpu) != 0);
    for cpu in waiting() {
        crate::drivers::interrupts::send_wake(cpu);
    }
    let held = |cpu: usize| HELD[cpu].load(Ordering::Acquire) == generation;
    if !crate::arch::cpu::wait_until(HOLD_MS, || waiting().all(held))
        && let Some(cpu) = waiting().find(|&cpu| !held(cpu))
    {
        panic!("text patch: cpu {} was not held within {} ms", cpu, crate::arch::cpu::patience_ms(HOLD_MS));
    }
    HOLDER.store(me + 1, Ordering::Relaxed);
    let result = change();
    HOLDER.store(0, Ordering::Relaxed);
    HOLD_RELEASED.store(generation, Ordering::Release);
    crate::arch::cpu::send_event();
    HOLD_LOCK.store(false, Ordering::Release);
    drop(masked);
    result
}

/// Takes `HOLD_LOCK` and returns with IRQs masked until the mask it returns is dropped. While
/// another CPU holds it, this one serves that CPU's hold: it may be spinning with IRQs masked.
#[unsafe(link_section = ".text.noprobe")]
fn take_hold_lock() -> IrqMask {
    loop {
        let masked = IrqMask::new();
        if HOLD_LOCK.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok() {
            return masked;
        }
        serve_hold();
        drop(masked);
        core::hint::spin_loop();
    }
}

/// Whether this CPU runs a `with_others_held` change now, every other online CPU held (for the
/// tests: a text patch that must hold them checks it did).
pub fn others_held() -> bool {
    HOLDER.load(Ordering::Relaxed) == crate::arch::percpu::this_cpu_index() + 1
}

/// How many holds (`with_others_held`) have begun since boot: the tests count a batch's.
pub fn holds() -> u64 {
    HOLD_GENERATION.load(Ordering::Relaxed)
}

/// The CPU (index + 1) whose change runs with the others held; 0: none.
static HOLDER: AtomicUsize = AtomicUsize::new(0);

/// One holder at a time (`with_others_held`).
static HOLD_LOCK: AtomicBool = AtomicBool::new(false);
/// The last hold begun, and the last one whose change is done.
static HOLD_GENERATION: AtomicU64 = AtomicU64::new(0);
static HOLD_RELEASED: AtomicU64 = AtomicU64::new(0);
/// Per CPU: the last hold it joined.
static HELD: [AtomicU64; stacks::CPUS] = [const { AtomicU64::new(0) }; stacks::CPUS];

/// Joins a hold this CPU has not joined yet (IRQs masked: from the wake-up SGI, or while waiting
/// for the hold lock): reports itself held, waits until the change is done, then `isb`. Stops
/// here if a panic stops the CPUs meanwhile. No-probe text with its wait inlined, as Linux keeps
/// stop_machine's loop out of kprobes: a CPU runs it while the word it may be made of changes
/// (the 4-CPU sweep's detour on this function's first word was still taken, stale, after its
/// unregistration: a CPU waiting for the hold lock ran the entry during the write).
#[unsafe(link_section = ".text.noprobe")]
fn serve_hold() {
    let cpu = crate::arch::percpu::this_cpu_index();
    let generation = HOLD_GENERATION.load(Ordering::Acquire);
    if HELD[cpu].load(Ordering::Relaxed) == generation {
        return;
    }
    HELD[cpu].store(generation, Ordering::Release);
    crate::arch::cpu::send_event();
    let released = || {
        // A test stepping the patcher runs the changed code on the held CPUs after each store.
        if crate::arch::patch::is_stepped() {
            super::cross_call::serve();
        }
        HOLD_RELEASED.load(Ordering::Acquire) >= generation || STOP.load(Ordering::Acquire)
    };
    if !crate::arch::cpu::wait_until(HOLD_MS, released) {
        panic!("text patch: cpu {} held for over {} ms", cpu, crate::arch::cpu::patience_ms(HOLD_MS));
    }
    if STOP.load(Ordering::Acquire) {
        stop_this_cpu_in_panic();
    }
    // SAFETY: a context synchronization event: this CPU fetches the changed text anew.
    unsafe { core::arch::asm!("isb", options(nomem, nostack, preserves_flags)) };
}

/// How long a hold waits for the other CPUs to join, and they for its change.
const HOLD_MS: u64 = 1000;

/// How long `synchronize` waits for the other CPUs. A CPU answers when it unmasks IRQs, and
/// under QEMU with more CPUs than host cores a CPU spinning (IRQs masked) for a lock whose
/// holder's thread is preempted took over 100 ms (the probe sweep on 4 CPUs, 2 host cores).
const SYNCHRONIZE_MS: u64 = 1000;

/// How often `synchronize` sends the wake-up again to a CPU that has not passed (a grace period
/// normally ends within one).
const RESEND_MS: u64 = 50;

/// CPUs online now.
pub fn online() -> usize {
    smp::online_count()
}

/// Whether CPU `cpu` reported online.
pub fn is_online(cpu: usize) -> bool {
    smp::is_online(cpu)
}

/// The outcome of bring-up, for the banner.
pub struct BringUp {
    pub online: usize,
    /// CPUs the kernel tried to run, the boot CPU included.
    pub wanted: usize,
    /// The first CPU that did not come up, and why.
    pub failure: Option<(usize, StartError)>,
}

/// How `bring_up` runs, from the command line: `cpus=N` and the test-only `smp.fail-cpu=N`,
/// `smp.late-cpu=N` and `smp.tlbi=local|broadcast` (TLB invalidations after a mapping change
/// stay local, so `smp_tlb_shootdown` must fail).
pub struct Options {
    /// CPUs to bring up, the boot CPU included (None: every CPU the machine has, or only the
    /// boot CPU where the board says so).
    pub limit: Option<usize>,
    pub broken: Option<usize>,
    pub late: Option<usize>,
    pub local_tlbi: bool,
}

impl Options {
    pub fn from_args(args: &crate::args::Args) -> Self {
        use protocol::cmdline as key;
        let mut options = Self { limit: None, broken: None, late: None, local_tlbi: false };
        for (name, value) in args.pairs() {
            match (name, value) {
                (key::CPUS, cpus) => match cpus.parse::<usize>() {
                    Ok(cpus) if (1..=stacks::CPUS).contains(&cpus) => options.limit = Some(cpus),
                    _ => defmt::warn!("cmdline: cpus={=str} is not in 1..={=usize}, ignored", cpus, stacks::CPUS),
                },
                (key::SMP_FAIL_CPU, cpu) => match cpu.parse::<usize>() {
                    Ok(cpu) => options.broken = Some(cpu),
                    _ => defmt::warn!("cmdline: smp.fail-cpu={=str} is not a CPU number", cpu),
                },
                (key::SMP_LATE_CPU, cpu) => match cpu.parse::<usize>() {
                    Ok(cpu) => options.late = Some(cpu),
                    _ => defmt::warn!("cmdline: smp.late-cpu={=str} is not a CPU number", cpu),
                },
                (key::SMP_TLBI, "local") => options.local_tlbi = true,
                (key::SMP_TLBI, "broadcast") => options.local_tlbi = false,
                _ => {}
            }
        }
        options
    }
}

/// MPIDR_EL1's affinity fields (Aff3, Aff2-Aff0), as a device tree's `reg` writes them.
const AFFINITY_MASK: u64 = 0xff_00ff_ffff;

/// Starts the secondaries, one at a time (after the GIC's distributor is set up: each sets up
/// its own interface; and after the boot CPU's tick started: each starts its own at that rate). `limit` is `cpus=N`: without it every CPU the device
/// tree lists runs on PSCI boards, and only the boot CPU on spin-table boards (whose cores always
/// exist, as QEMU's raspi4b has 4). Spin-table cores not started are parked. `broken` (test-only,
/// `smp.fail-cpu=N`) gives CPU N an MPIDR no CPU has on PSCI boards; `late` (test-only,
/// `smp.late-cpu=N`) holds CPU N until the boot CPU has given up on it.
pub fn bring_up(
    psci: Option<PsciConduit>,
    cpus: &CpuList,
    spin_table: &[u64],
    limit: Option<usize>,
    broken: Option<usize>,
    late: Option<usize>,
) -> BringUp {
    smp::mark_boot_cpu_online();
    crate::drivers::interrupts::register_private(crate::drivers::interrupts::SGI_WAKE, on_wake_sgi);
    let mut releases = [None::<Release>; stacks::CPUS - 1];
    let mut available = 0;
    if !spin_table.is_empty() {
        for (release, &entry) in releases.iter_mut().zip(spin_table) {
            *release = Some(Release::SpinTable { entry });
            available += 1;
        }
    } else if let Some(conduit) = psci {
        let boot_mpidr = crate::arch::cpu::mpidr() & AFFINITY_MASK;
        let secondaries = cpus.mpidr[..cpus.count].iter().filter(|&&mpidr| mpidr != boot_mpidr);
        for (release, &mpidr) in releases.iter_mut().zip(secondaries) {
            *release = Some(Release::Psci { conduit, mpidr });
            available += 1;
        }
    }
    let default = if spin_table.is_empty() { available + 1 } else { 1 };
    let wanted = limit.unwrap_or(default).min(available + 1);
    WANTED.store(wanted, Ordering::Relaxed);
    let mut failure = None;
    for (index, release) in releases[..wanted - 1].iter().enumerate() {
        let cpu = index + 1;
        let release = match release.expect("the first `available` releases are filled") {
            Release::Psci { conduit, .. } if broken == Some(cpu) => Release::Psci { conduit, mpidr: AFFINITY_MASK },
            release => release,
        };
        let (idle, irq, overflow) = (stacks::idle_slot(cpu), stacks::irq_slot(cpu), stacks::overflow_slot(cpu));
        let started = smp::start_cpu(cpu, release, (idle, irq, overflow), secondary_idle, late == Some(cpu));
        if let Err(error) = started
            && failure.is_none()
        {
            failure = Some((cpu, error));
        }
    }
    if spin_table.len() >= wanted {
        park::park_secondaries(&spin_table[wanted - 1..]);
    }
    BringUp { online: smp::online_count(), wanted, failure }
}
