//! Kernel tasks and a round-robin scheduler, preempted by the timer tick.
//!
//! Each task owns a stack slot (stacks.rs): a stack and a shadow call stack, each followed (in
//! the direction it grows) by an unmapped guard. The boot context is task 0 ("idle": it runs
//! the kernel's main line and waits in `wfi`). A task switch saves and loads SP and x18 with all
//! of DAIF masked (context.S). A stack or shadow-stack overflow faults on its guard; exception
//! entry moves to the CPU's overflow stacks and the task is killed with a report (stacktrace.rs).
//! The scheduler state is only touched with IRQs masked on this (single) CPU.

pub mod cpus;
pub mod cross_call;
pub mod stacks;
pub mod user;

use crate::arch::cpu;
use crate::sync::{Hooks, IrqMask};
use core::sync::atomic::{AtomicBool, Ordering};
use stacks::{SHADOW_STACK_SIZE, Slot, TASK_SLOTS};

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
}

struct Scheduler {
    tasks: [Task; TASK_SLOTS],
    current: usize,
}

/// A `static mut`, not a lock: `schedule` leaves through `switch_to` with raw pointers into the
/// task table and the next task resumes inside its own `schedule`, so no guard could be held
/// across the switch, and the context switch is a hot path. Every access runs with IRQs masked
/// (`with_irqs_masked`, or inside an exception or IRQ) on the one CPU.
static mut SCHEDULER: Scheduler = Scheduler {
    tasks: [const {
        Task {
            name: "",
            state: State::Free,
            context: Context::zeroed(),
            shadow_high_water: 0,
            user: user::UserTask::NONE,
        }
    }; TASK_SLOTS],
    current: 0,
};
static NEED_RESCHED: AtomicBool = AtomicBool::new(false);

impl Context {
    const fn zeroed() -> Self {
        Self { callee_saved: [0; 10], fp: 0, lr: 0, sp: 0, x18: 0, daif: 0 }
    }
}

unsafe extern "C" {
    fn switch_to(prev: *mut Context, next: *const Context);
    fn task_trampoline();
}

// A new task's first instruction (switch_to returns here the first time): x19 = entry,
// x20 = argument, x29 = its final frame marker.
core::arch::global_asm!(
    r#"
    .section .text.noprobe, "ax"
    .global task_trampoline
task_trampoline:
    mov     x0, x20
    blr     x19
    bl      task_exit_current
"#
);

/// The scheduler. Callers hold IRQs masked (single CPU: nothing else can run).
fn scheduler() -> &'static mut Scheduler {
    // SAFETY: every caller runs with IRQs masked on the only CPU, and no caller keeps the
    // reference across a point where another caller could run (switch_to is reached through
    // raw pointers).
    unsafe { &mut *core::ptr::addr_of_mut!(SCHEDULER) }
}

fn with_irqs_masked<T>(f: impl FnOnce() -> T) -> T {
    let _masked = IrqMask::new();
    f()
}

/// Makes the boot context task 0.
pub fn init() {
    stacks::init_this_cpu();
    with_irqs_masked(|| {
        let task = &mut scheduler().tasks[0];
        task.name = "idle";
        task.state = State::Runnable;
        write_shadow_magic(stacks::slot(0));
    });
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

/// Starts `entry(argument)` as a new task, runnable at the next scheduling point.
pub fn spawn(name: &'static str, entry: extern "C" fn(u64), argument: u64) -> Result<TaskId, SpawnError> {
    with_irqs_masked(|| {
        let scheduler = scheduler();
        let index = (1..TASK_SLOTS)
            .find(|&index| !matches!(scheduler.tasks[index].state, State::Runnable))
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
        context.fp = marker;
        context.lr = task_trampoline as *const () as u64;
        context.sp = marker;
        context.x18 = slot.shadow_stack_base();
        context.daif = 0; // interrupts on
        scheduler.tasks[index] =
            Task { name, state: State::Runnable, context, shadow_high_water: 0, user: user::UserTask::NONE };
        Ok(TaskId(index))
    })
}

/// Switches to the next runnable task, if there is another. IRQs must be masked.
fn schedule() {
    let scheduler = scheduler();
    let current = scheduler.current;
    let next = (1..=TASK_SLOTS)
        .map(|step| (current + step) % TASK_SLOTS)
        .find(|&index| scheduler.tasks[index].state == State::Runnable);
    let Some(next) = next else { panic!("no runnable task (the idle task ended)") };
    if next == current {
        return;
    }
    scheduler.current = next;
    user::switch_address_space(next);
    let prev_context = core::ptr::addr_of_mut!(scheduler.tasks[current].context);
    let next_context = core::ptr::addr_of!(scheduler.tasks[next].context);
    // SAFETY: both contexts live in the static scheduler; next was saved by switch_to or built by
    // spawn; IRQs are masked.
    unsafe { switch_to(prev_context, next_context) };
}

/// Gives the CPU to the next runnable task.
pub fn yield_now() {
    with_irqs_masked(schedule);
}

/// The timer tick asks for a task switch at the end of the IRQ.
pub fn tick() {
    NEED_RESCHED.store(true, Ordering::Relaxed);
}

/// The end of every IRQ (the trap layer), back on the interrupted task's stack with IRQs
/// masked: switches tasks if the tick asked for it.
pub fn irq_exit() {
    if NEED_RESCHED.swap(false, Ordering::Relaxed) {
        schedule();
    }
}

/// The end of a task's entry function (`task_trampoline`): checks the shadow stack's end marker,
/// records its high-water mark, and never returns.
#[unsafe(no_mangle)]
pub(crate) extern "C" fn task_exit_current() -> ! {
    cpu::mask_interrupts();
    let scheduler = scheduler();
    let index = scheduler.current;
    let slot = stacks::slot(index);
    // SAFETY: the magic slot is mapped.
    let magic = unsafe { core::ptr::read_volatile((slot.shadow_stack_end() - 8) as *const u64) };
    if magic != unwind::SCS_END_MAGIC {
        panic!("task {}: shadow call stack end marker overwritten ({:#x})", scheduler.tasks[index].name, magic);
    }
    scheduler.tasks[index].shadow_high_water = shadow_high_water(slot);
    scheduler.tasks[index].state = State::Exited;
    schedule();
    unreachable!("an exited task was resumed");
}

/// Ends the current task after an overflow (called on the overflow stacks). Never returns.
pub fn kill_current(reason: KillReason) -> ! {
    cpu::mask_interrupts();
    let scheduler = scheduler();
    let index = scheduler.current;
    if index == 0 {
        panic!("{:?} in the idle task", defmt::Debug2Format(&reason));
    }
    scheduler.tasks[index].shadow_high_water = shadow_high_water(stacks::slot(index));
    scheduler.tasks[index].state = State::Killed(reason);
    schedule();
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

/// The running task. A plain read: `current` changes only in schedule(), and a task that reads
/// it is, by then, the current task again.
pub fn current() -> TaskId {
    // SAFETY: a word-sized read of a field only the scheduler writes; see above.
    TaskId(unsafe { core::ptr::addr_of!(SCHEDULER.current).read_volatile() })
}

pub fn current_name() -> &'static str {
    with_irqs_masked(|| {
        let scheduler = scheduler();
        scheduler.tasks[scheduler.current].name
    })
}

pub fn state(id: TaskId) -> State {
    with_irqs_masked(|| scheduler().tasks[id.0].state)
}

/// The shadow-stack high-water mark of an ended task, in entries (8 bytes each).
pub fn shadow_high_water_of(id: TaskId) -> usize {
    with_irqs_masked(|| scheduler().tasks[id.0].shadow_high_water)
}

/// The current task's stack slot.
pub fn current_slot() -> Slot {
    stacks::slot(current().0)
}

/// Yields until task `id` has ended; returns how it ended.
pub fn join(id: TaskId) -> State {
    loop {
        match state(id) {
            State::Runnable => yield_now(),
            ended => return ended,
        }
    }
}
