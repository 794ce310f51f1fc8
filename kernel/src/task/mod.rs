//! Kernel tasks and a round-robin scheduler, preempted by the timer tick.
//!
//! Each task owns a stack slot (stacks.rs): a stack and a shadow call stack, each followed (in
//! the direction it grows) by an unmapped guard. The boot context is task 0 (the boot CPU's
//! idle task: it runs the kernel's main line and waits in `wfi`); each secondary CPU idles in a
//! task of its own (the table's last `CPUS - 1` entries, on the CPUs' idle slots). A task switch
//! saves and loads SP and x18 with all of DAIF masked (context.S). A stack or shadow-stack
//! overflow faults on its guard; exception entry moves to the CPU's overflow stacks and the task
//! is killed with a report (stacktrace.rs).
//!
//! SMP: one run queue (the task table) behind one IRQ-safe spin lock (`RUN_QUEUE`), `current`
//! per CPU (`PerCpu::current_task`). A task runs on the CPUs of its mask (`spawn_on`,
//! `set_affinity`; a task spawned with `spawn` stays on its spawner's CPU). The lock is held
//! across `switch_to` and released by the task switched to (after its own `switch_to`, or in
//! `task_started` for a new one), and each task records the CPU it runs on: a task's context is
//! fully saved before any other CPU can pick it, so no task ever runs on two CPUs at once.
pub mod cpus;
pub mod cross_call;
pub mod stacks;
pub mod user;

use crate::arch::cpu;
use crate::arch::percpu::{self, CPUS};
use crate::sync::{Hooks, IrqMask};
use core::sync::atomic::{AtomicBool, Ordering};
use stacks::{SHADOW_STACK_SIZE, Slot, TASK_SLOTS};

/// Entries of the task table: the task slots, then one idle task per secondary CPU.
pub const TASKS: usize = TASK_SLOTS + CPUS - 1;

/// A set of CPUs, bit n for CPU n.
#[derive(Clone, Copy, PartialEq, Eq, Debug, defmt::Format)]
pub struct CpuMask(pub u8);

impl CpuMask {
    pub const fn one(cpu: usize) -> Self {
        Self(1 << cpu)
    }

    pub const fn contains(self, cpu: usize) -> bool {
        self.0 & (1 << cpu) != 0
    }
}

/// `on_cpu` of a task no CPU runs.
const NOT_RUNNING: u8 = u8::MAX;

/// What switch_to saves: x19-x28, x29, x30, SP, x18, DAIF (offsets used by context.S).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct Context {
    callee_saved: [u64; 10],
    fp: u64,
    lr: u64,
    sp: u64,
    x18: u64,
    daif: u64,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug, defmt::Format)]
pub enum KillReason {
    StackOverflow,
    ShadowStackOverflow,
    /// An EL0 task's fault (reported by task/user.rs, which keeps its ESR, FAR and PC).
    UserFault,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug, defmt::Format)]
pub enum State {
    Free,
    Runnable,
    Exited,
    Killed(KillReason),
}

#[derive(Clone, Copy, PartialEq, Eq, Debug, defmt::Format)]
pub struct TaskId(pub usize);

struct Task {
    name: &'static str,
    state: State,
    context: Context,
    /// Deepest shadow-call-stack use seen when the task ended, in entries.
    shadow_high_water: usize,
    /// The EL0 half of a user task (inactive for kernel tasks).
    user: user::UserTask,
    /// The CPUs it may run on.
    affinity: CpuMask,
    /// The CPU running it (`NOT_RUNNING` when none): set and cleared with the run queue locked.
    on_cpu: u8,
}

struct Scheduler {
    tasks: [Task; TASKS],
}

/// The task table (the one run queue), guarded by `RUN_QUEUE`: not an `IrqSpinLock`, because
/// `schedule` leaves through `switch_to` with the lock held and the task switched to releases it
/// (a guard cannot cross that), and the context switch is a hot path.
static mut SCHEDULER: Scheduler = Scheduler {
    tasks: [const {
        Task {
            name: "",
            state: State::Free,
            context: Context::zeroed(),
            shadow_high_water: 0,
            user: user::UserTask::NONE,
            affinity: CpuMask(0),
            on_cpu: NOT_RUNNING,
        }
    }; TASKS],
};

/// The run queue's lock: taken with IRQs masked, held across `switch_to`.
static RUN_QUEUE: AtomicBool = AtomicBool::new(false);

/// Failed attempts of CPU `cpu` to take the run queue's lock so far (another CPU held it),
/// counted on the failure path only, in the per-CPU data. The retry loop is inlined into every
/// user of the task table, so whether a stretch of code ran it depends on the other CPUs: the
/// probe sweep compares the hit counts of a pass only if this did not move.
pub fn run_queue_retries(cpu: usize) -> u64 {
    percpu::cpu_data(cpu).run_queue_retries.load(Ordering::Relaxed)
}

/// Runs `f` holding the run queue's lock, IRQs masked (a test makes another CPU wait for it).
pub fn with_run_queue_locked<R>(f: impl FnOnce() -> R) -> R {
    locked(|_| f())
}

/// Takes the run queue's lock. IRQs must be masked (an IRQ on this CPU could reschedule).
#[inline(always)]
fn lock_run_queue() {
    while RUN_QUEUE.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
        percpu::this_cpu().run_queue_retries.fetch_add(1, Ordering::Relaxed);
        while RUN_QUEUE.load(Ordering::Relaxed) {
            core::hint::spin_loop();
        }
    }
}

#[inline(always)]
fn unlock_run_queue() {
    RUN_QUEUE.store(false, Ordering::Release);
}

impl Context {
    const fn zeroed() -> Self {
        Self { callee_saved: [0; 10], fp: 0, lr: 0, sp: 0, x18: 0, daif: 0 }
    }
}

unsafe extern "C" {
    fn switch_to(prev: *mut Context, next: *const Context);
    fn task_trampoline();
}

// A new task's first instruction (switch_to returns here the first time, IRQs masked, the run
// queue locked): x19 = entry, x20 = argument, x21 = the DAIF it starts with, x29 = its final
// frame marker.
core::arch::global_asm!(
    r#"
    .section .text.noprobe, "ax"
    .global task_trampoline
task_trampoline:
    bl      task_started
    msr     daif, x21
    mov     x0, x20
    blr     x19
    bl      task_exit_current
"#
);

/// A new task's first Rust: the switch to it is complete, so the run queue is unlocked.
#[unsafe(no_mangle)]
extern "C" fn task_started() {
    unlock_run_queue();
}

/// The scheduler. Callers hold the run queue's lock (`locked`, or `schedule`'s callers).
fn scheduler() -> &'static mut Scheduler {
    // SAFETY: every caller holds RUN_QUEUE with IRQs masked, and no caller keeps the reference
    // across a point where another holder could run (switch_to is reached through raw pointers).
    unsafe { &mut *core::ptr::addr_of_mut!(SCHEDULER) }
}

/// Task `index`'s EL0 half, reached without the run queue's lock: only the task itself (its
/// exception handlers, IRQs masked), its spawner before it first runs, and readers after it
/// ended touch it. A raw projection, so no reference to the whole table is made.
fn user_state(index: usize) -> &'static mut user::UserTask {
    // SAFETY: see above; the table is a static, and other CPUs holding the lock touch other
    // fields or other tasks' entries.
    unsafe { &mut (*core::ptr::addr_of_mut!(SCHEDULER)).tasks[index].user }
}

/// Runs `f` on the task table with IRQs masked and the run queue locked.
fn locked<T>(f: impl FnOnce(&mut Scheduler) -> T) -> T {
    let _masked = IrqMask::new();
    lock_run_queue();
    let result = f(scheduler());
    unlock_run_queue();
    result
}

/// The task table index of CPU `cpu`'s idle task.
pub const fn idle_task(cpu: usize) -> usize {
    if cpu == 0 { 0 } else { TASK_SLOTS + cpu - 1 }
}

/// The stack slot of task `index` (a task slot, or a secondary's idle slot).
pub fn task_slot(index: usize) -> Slot {
    if index < TASK_SLOTS { stacks::slot(index) } else { stacks::idle_slot(index - TASK_SLOTS + 1) }
}

/// Makes the boot context task 0, the boot CPU's idle task.
pub fn init() {
    stacks::init_this_cpu();
    write_shadow_magic(task_slot(0));
    become_idle(0);
}

/// Makes the running context CPU `cpu`'s idle task (on that CPU, before its IRQs are unmasked).
pub fn become_idle(cpu: usize) {
    let index = idle_task(cpu);
    locked(|scheduler| {
        let task = &mut scheduler.tasks[index];
        task.name = "idle";
        task.state = State::Runnable;
        task.affinity = CpuMask::one(cpu);
        task.on_cpu = cpu as u8;
    });
    percpu::this_cpu().current_task.store(index, Ordering::Relaxed);
}

fn write_shadow_magic(slot: Slot) {
    // SAFETY: the magic slot is the last word of the slot's mapped shadow-call-stack page.
    unsafe { core::ptr::write_volatile((slot.shadow_stack_end() - 8) as *mut u64, unwind::SCS_END_MAGIC) };
}

#[derive(Debug, defmt::Format)]
pub enum SpawnError {
    NoFreeSlot,
}

/// What runs when a task slot is given to a new task (kernel or user), IRQs masked: owners of
/// per-task state (kretprobe return instances) drop what the slot's last task left.
static SPAWN_HOOKS: Hooks<fn(usize), 2> = Hooks::new("task spawn hooks");

/// Adds `hook(slot index)` to what every spawn runs. At init.
pub fn on_spawn(hook: fn(usize)) {
    SPAWN_HOOKS.register(hook);
}

/// Starts `entry(argument)` as a new task on this CPU, runnable at the next scheduling point.
pub fn spawn(name: &'static str, entry: extern "C" fn(u64), argument: u64) -> Result<TaskId, SpawnError> {
    spawn_on(CpuMask::one(percpu::this_cpu_index()), name, entry, argument)
}

/// Starts `entry(argument)` as a new task that runs on the CPUs of `affinity`.
pub fn spawn_on(
    affinity: CpuMask,
    name: &'static str,
    entry: extern "C" fn(u64),
    argument: u64,
) -> Result<TaskId, SpawnError> {
    let id = spawn_with(affinity, name, entry, argument, 0)?;
    kick(affinity);
    Ok(id)
}

/// Spawns a task that starts with DAIF = `daif`, without waking other CPUs.
fn spawn_with(
    affinity: CpuMask,
    name: &'static str,
    entry: extern "C" fn(u64),
    argument: u64,
    daif: u64,
) -> Result<TaskId, SpawnError> {
    assert!(affinity.0 != 0, "an empty CPU mask");
    locked(|scheduler| {
        let index = (1..TASK_SLOTS)
            .find(|&index| {
                let task = &scheduler.tasks[index];
                task.state != State::Runnable && task.on_cpu == NOT_RUNNING
            })
            .ok_or(SpawnError::NoFreeSlot)?;
        let slot = stacks::slot(index);
        for hook in SPAWN_HOOKS.iter() {
            hook(index);
        }
        // A clean shadow stack (its high-water mark is read from it) with its end marker.
        // SAFETY: the slot's shadow-stack page is mapped and belongs to no live task.
        unsafe { core::ptr::write_bytes(slot.shadow_stack_base() as *mut u8, 0, SHADOW_STACK_SIZE as usize) };
        write_shadow_magic(slot);
        // The final frame marker at the top of the stack: frame-pointer walks end there.
        let marker = slot.stack_top() - 48;
        // SAFETY: the top of the slot's stack is mapped and unused.
        unsafe { core::ptr::write_bytes(marker as *mut u8, 0, 48) };
        let mut context = Context::zeroed();
        context.callee_saved[0] = entry as usize as u64;
        context.callee_saved[1] = argument;
        context.callee_saved[2] = daif;
        context.fp = marker;
        context.lr = task_trampoline as *const () as u64;
        context.sp = marker;
        context.x18 = slot.shadow_stack_base();
        // switch_to enters the trampoline with IRQs masked (the run queue stays locked until
        // `task_started`); the trampoline then sets `daif`.
        context.daif = 0x3c0;
        scheduler.tasks[index] = Task {
            name,
            state: State::Runnable,
            context,
            shadow_high_water: 0,
            user: user::UserTask::NONE,
            affinity,
            on_cpu: NOT_RUNNING,
        };
        Ok(TaskId(index))
    })
}

/// Asks the other online CPUs of `cpus` to look at the run queue (a wake-up SGI: the task they
/// run reschedules at the end of it).
fn kick(cpus: CpuMask) {
    let me = percpu::this_cpu_index();
    for cpu in (0..CPUS).filter(|&cpu| cpu != me && cpus.contains(cpu) && self::cpus::is_online(cpu)) {
        crate::drivers::interrupts::send_wake(cpu);
    }
}

/// Moves task `id` to the CPUs of `affinity`: a task running on a CPU outside it leaves that CPU
/// at its next scheduling point (at once when it is the caller: it yields).
pub fn set_affinity(id: TaskId, affinity: CpuMask) {
    assert!(affinity.0 != 0, "an empty CPU mask");
    let running_on = locked(|scheduler| {
        let task = &mut scheduler.tasks[id.0];
        task.affinity = affinity;
        task.on_cpu
    });
    let me = percpu::this_cpu_index();
    kick(affinity);
    if usize::from(running_on) == me && !affinity.contains(me) {
        yield_now();
    } else if running_on != NOT_RUNNING && !affinity.contains(usize::from(running_on)) {
        crate::drivers::interrupts::send_wake(usize::from(running_on));
    }
}

/// The CPU the caller runs on (it may move at any scheduling point).
pub fn this_cpu() -> usize {
    percpu::this_cpu_index()
}

/// The next task for CPU `me` after `current`, round robin over the task slots: a runnable task
/// that may run here and that no other CPU runs; this CPU's idle task when there is none.
#[inline(always)]
fn pick_next(scheduler: &Scheduler, me: usize, current: usize) -> usize {
    let start = if current < TASK_SLOTS { current } else { TASK_SLOTS - 1 };
    (1..=TASK_SLOTS)
        .map(|step| (start + step) % TASK_SLOTS)
        .find(|&index| {
            let task = &scheduler.tasks[index];
            task.state == State::Runnable
                && task.affinity.contains(me)
                && (task.on_cpu == NOT_RUNNING || index == current)
        })
        .unwrap_or_else(|| idle_task(me))
}

/// Switches to the next runnable task, if there is another (returns whether it switched). IRQs
/// masked, run queue unlocked.
fn schedule() -> bool {
    lock_run_queue();
    switch_locked()
}

/// `schedule` with the run queue locked by the caller; returns with it unlocked (in the task it
/// switched back to, maybe on another CPU).
fn switch_locked() -> bool {
    let scheduler = scheduler();
    let cpu = percpu::this_cpu();
    let me = cpu.index.load(Ordering::Relaxed) as usize;
    let current = cpu.current_task.load(Ordering::Relaxed);
    quiescent_point(cpu);
    let next = pick_next(scheduler, me, current);
    if next == current {
        if scheduler.tasks[current].state != State::Runnable {
            panic!("no runnable task on CPU {} (the idle task ended)", me);
        }
        unlock_run_queue();
        return false;
    }
    scheduler.tasks[current].on_cpu = NOT_RUNNING;
    scheduler.tasks[next].on_cpu = me as u8;
    cpu.current_task.store(next, Ordering::Relaxed);
    cpu.context_switches.fetch_add(1, Ordering::Relaxed);
    user::switch_address_space(next);
    let prev_context = core::ptr::addr_of_mut!(scheduler.tasks[current].context);
    let next_context = core::ptr::addr_of!(scheduler.tasks[next].context);
    // SAFETY: both contexts live in the static scheduler; next was saved by switch_to or built by
    // spawn; IRQs are masked and the run queue is locked (no other CPU touches either context:
    // prev counts as running here until the task switched to releases the lock).
    unsafe { switch_to(prev_context, next_context) };
    // Back in this task, switched to by a CPU that locked the run queue for it.
    unlock_run_queue();
    true
}

/// Gives the CPU to the next runnable task; returns whether another task ran.
pub fn yield_now() -> bool {
    let _masked = IrqMask::new();
    schedule()
}

/// The timer tick asks for a task switch at the end of the IRQ.
pub fn tick() {
    percpu::this_cpu().need_resched.store(true, Ordering::Relaxed);
}

/// The end of every IRQ (the trap layer), back on the interrupted task's stack with IRQs
/// masked: switches tasks if the tick (or a wake-up SGI) asked for it.
pub fn irq_exit() {
    if percpu::this_cpu().need_resched.swap(false, Ordering::Relaxed) {
        schedule();
    }
}

/// An idle task's loop (IRQs unmasked): each pass is a quiescent point; the tick or a wake-up
/// SGI ends `wfi`, and the end of that IRQ switches to whatever became runnable here.
pub fn idle_loop() -> ! {
    loop {
        quiescent_point(percpu::this_cpu());
        cpu::wait_for_interrupt();
    }
}

/// This CPU is outside every tracer (and every other read-side section the grace period of
/// `cpus::synchronize` covers). The count is a release store (what this CPU did in a tracer
/// before is visible before it), followed by a full barrier: a later load of a patched literal
/// or instruction cannot be satisfied before the count is visible, so a waiter that still sees
/// the old count had published its patch before this CPU loads it (store-buffering order).
#[inline(always)]
fn quiescent_point(cpu: &percpu::PerCpu) {
    cpu.quiescent.store(cpu.quiescent.load(Ordering::Relaxed) + 1, Ordering::Release);
    core::sync::atomic::fence(Ordering::SeqCst);
}

/// The end of a task's entry function (`task_trampoline`): checks the shadow stack's end marker,
/// records its high-water mark, and never returns.
#[unsafe(no_mangle)]
pub(crate) extern "C" fn task_exit_current() -> ! {
    cpu::mask_interrupts();
    let index = current().0;
    let slot = task_slot(index);
    // SAFETY: the magic slot is mapped.
    let magic = unsafe { core::ptr::read_volatile((slot.shadow_stack_end() - 8) as *const u64) };
    if magic != unwind::SCS_END_MAGIC {
        panic!("task {}: shadow call stack end marker overwritten ({:#x})", current_name(), magic);
    }
    let high_water = shadow_high_water(slot);
    lock_run_queue();
    let scheduler = scheduler();
    scheduler.tasks[index].shadow_high_water = high_water;
    scheduler.tasks[index].state = State::Exited;
    // Wakes a `join` waiting with `wfe` on another CPU (it reads the state under the lock).
    cpu::send_event();
    switch_locked();
    unreachable!("an exited task was resumed");
}

/// Ends the current task after an overflow (called on the overflow stacks). Never returns.
pub fn kill_current(reason: KillReason) -> ! {
    cpu::mask_interrupts();
    let index = current().0;
    if index == 0 || index >= TASK_SLOTS {
        panic!("{:?} in the idle task", defmt::Debug2Format(&reason));
    }
    let high_water = shadow_high_water(task_slot(index));
    lock_run_queue();
    let scheduler = scheduler();
    scheduler.tasks[index].shadow_high_water = high_water;
    scheduler.tasks[index].state = State::Killed(reason);
    cpu::send_event();
    switch_locked();
    unreachable!("a killed task was resumed");
}

/// Entries in use at the deepest point: the last non-zero slot below the end marker.
fn shadow_high_water(slot: Slot) -> usize {
    let slots = (SHADOW_STACK_SIZE / 8) as usize - 1;
    (0..slots)
        .rev()
        // SAFETY: reads within the slot's mapped shadow-stack page.
        .find(|&index| unsafe { core::ptr::read_volatile((slot.shadow_stack_base() + index as u64 * 8) as *const u64) } != 0)
        .map_or(0, |index| index + 1)
}

/// The current task's shadow-stack high-water mark so far, in entries.
pub fn shadow_high_water_now() -> usize {
    shadow_high_water(current_slot())
}

/// The running task: this CPU's `current_task`, read with IRQs masked (so the read and the CPU
/// it was read on agree). A task that moves to another CPU finds itself there too.
#[inline(always)]
pub fn current() -> TaskId {
    // Not an `IrqMask`: the sanitizer-exempt walkers inline this, and in `full` the mask's drop
    // glue would be an instrumented out-of-line call there.
    let daif = cpu::mask_interrupts();
    let index = percpu::this_cpu().current_task.load(Ordering::Relaxed);
    cpu::restore_interrupts(daif); // raw mask pair: see above
    TaskId(index)
}

pub fn current_name() -> &'static str {
    let index = current().0;
    locked(|scheduler| scheduler.tasks[index].name)
}

pub fn state(id: TaskId) -> State {
    locked(|scheduler| scheduler.tasks[id.0].state)
}

/// The shadow-stack high-water mark of an ended task, in entries (8 bytes each).
pub fn shadow_high_water_of(id: TaskId) -> usize {
    locked(|scheduler| scheduler.tasks[id.0].shadow_high_water)
}

/// The current task's stack slot.
pub fn current_slot() -> Slot {
    task_slot(current().0)
}

/// Yields until task `id` has ended; returns how it ended. With nothing else to run here (the
/// task runs on another CPU) it waits in `wfe`: the task's end sends an event, and the tick
/// (an interrupt) ends the wait too.
pub fn join(id: TaskId) -> State {
    loop {
        match state(id) {
            State::Runnable => {
                if !yield_now() {
                    cpu::wait_for_event();
                }
            }
            ended => return ended,
        }
    }
}

/// The tick rate `hz=N` asks for (1..=10000; default 100), for `drivers::timer::start`.
pub fn tick_hz_from_args(args: &crate::args::Args) -> u64 {
    let mut hz = 100;
    for value in args.values(protocol::cmdline::HZ) {
        match value.parse::<u64>() {
            Ok(value) if (1..=10_000).contains(&value) => hz = value,
            _ => defmt::warn!("cmdline: hz={=str} is not in 1..=10000, keeping {=u64}", value, hz),
        }
    }
    hz
}
