//! Per-CPU data, reached through TPIDR_EL1: exception entry (vectors.S, context.S) reads its
//! first fields by offset (see arch/aarch64/mod.rs), Rust through `this_cpu()`.

use super::exception::ExceptionFrame;
use super::stack::Slot;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};

/// CPUs the kernel can bring up (kernel.ld reserves an IRQ and an overflow slot for each, and an
/// idle slot for each secondary).
pub const CPUS: usize = 4;

/// A CPU's ftrace recursion guard (ftrace/trampoline.rs reads and writes it by offset:
/// `guard` at 0, `recursions` at 8): non-zero while a tracer runs on the CPU.
#[repr(C)]
pub struct TracerGuard {
    pub guard: AtomicU64,
    pub recursions: AtomicU64,
}

#[repr(C)]
pub struct PerCpu {
    pub irq_stack_top: AtomicU64,
    pub irq_shadow_stack: AtomicU64,
    pub overflow_stack_top: AtomicU64,
    pub overflow_shadow_stack: AtomicU64,
    /// The interrupted context while an IRQ runs on the IRQ stack (null otherwise): what the
    /// walkers need to continue into the interrupted task (its x29, PC and x18).
    pub irq_frame: AtomicPtr<ExceptionFrame>,
    /// IRQs handled, for tests.
    pub irqs: AtomicU64,
    /// The running user task's kernel shadow-call-stack pointer: written by every return to EL0,
    /// loaded into x18 by every entry from EL0 (vectors.S).
    pub user_kernel_x18: AtomicU64,
    /// 1 when user tasks run with their own APIA key (FEAT_PAuth): vectors.S then loads
    /// `user_apia` on every return to EL0 and `kernel_apia` on every entry from EL0.
    pub pauth_keys: AtomicU64,
    pub kernel_apia: [AtomicU64; 2],
    /// The running user task's APIA key (set when the scheduler switches to it).
    pub user_apia: [AtomicU64; 2],
    /// This CPU's index (0 for the boot CPU).
    pub index: AtomicU64,
    /// The task running on this CPU (its index in the scheduler's table); written by this CPU's
    /// scheduler with the run queue locked.
    pub current_task: AtomicUsize,
    /// Set by this CPU's tick (or a reschedule SGI): switch tasks at the end of the IRQ.
    pub need_resched: AtomicBool,
    /// Task switches this CPU made.
    pub context_switches: AtomicU64,
    /// Timer ticks this CPU took.
    pub ticks: AtomicU64,
    /// Bumped each time this CPU passes a quiescent point (a task switch, an idle pass): a
    /// grace period waits until every other online CPU's count moved.
    pub quiescent: AtomicU64,
    /// Failed attempts to take the run queue's lock (owned by `task`; here so that the retry
    /// path reaches it from TPIDR_EL1 and the uncontended path needs no address of its own).
    pub run_queue_retries: AtomicU64,
    /// This CPU's ftrace recursion guard.
    pub tracer: TracerGuard,
    /// This CPU's kernel-probe state, owned by `probes::hit` (here so that the hit path reaches
    /// it from TPIDR_EL1 in one instruction).
    pub probe: ProbeControl,
    /// The user-probe step state this CPU's EL0 probe hits use (owned by `probes::uprobe`):
    /// `user_step_own` (set by `init_this_cpu`); a test-only switch of `probes::uprobe` points
    /// every CPU at one CPU's, the single shared state of before SMP.
    pub user_step: AtomicPtr<UserStepControl>,
    pub user_step_own: UserStepControl,
    /// This CPU's allocation-stack sampling draw (xorshift64 state, owned by `stacktrace`):
    /// per CPU so that two CPUs drawing at once neither race nor steal each other's draws, and a
    /// run's choices on each CPU follow from `tag-seed` alone.
    pub allocation_sample: AtomicU64,
}

/// A CPU's kernel-probe state (Linux's per-CPU `kprobe_ctlblk`): what the hit path is doing and
/// for which probes. Addresses of probe records, not their type: arch knows nothing of probes;
/// only `probes::hit` reads or writes these, on their own CPU.
pub struct ProbeControl {
    /// `probes::hit`'s status code (idle, handling, stepping, re-entered, ...).
    pub status: AtomicU32,
    /// The probe being handled (or stepped), null when idle.
    pub current: AtomicPtr<()>,
    /// The probe a re-entered hit interrupted (restored when the re-entered one is done).
    pub previous: AtomicPtr<()>,
    /// The interrupted SPSR while a probe's slot is being stepped.
    pub step_spsr: AtomicU64,
}

/// A CPU's user-probe step (Linux's per-task `arch_uprobe_task`, per CPU here: IRQs stay masked
/// from the BRK to the step's return): the probe index being stepped (`usize::MAX`: none), the
/// SPSR at the hit and whether the step is a hardware one. Only `probes::uprobe` uses it.
pub struct UserStepControl {
    pub index: AtomicUsize,
    pub spsr: AtomicU64,
    pub hardware_step: AtomicBool,
}

static PER_CPU: [PerCpu; CPUS] = [const {
    PerCpu {
        irq_stack_top: AtomicU64::new(0),
        irq_shadow_stack: AtomicU64::new(0),
        overflow_stack_top: AtomicU64::new(0),
        overflow_shadow_stack: AtomicU64::new(0),
        irq_frame: AtomicPtr::new(core::ptr::null_mut()),
        irqs: AtomicU64::new(0),
        user_kernel_x18: AtomicU64::new(0),
        pauth_keys: AtomicU64::new(0),
        kernel_apia: [const { AtomicU64::new(0) }; 2],
        user_apia: [const { AtomicU64::new(0) }; 2],
        index: AtomicU64::new(0),
        current_task: AtomicUsize::new(0),
        need_resched: AtomicBool::new(false),
        context_switches: AtomicU64::new(0),
        ticks: AtomicU64::new(0),
        quiescent: AtomicU64::new(0),
        run_queue_retries: AtomicU64::new(0),
        tracer: TracerGuard { guard: AtomicU64::new(0), recursions: AtomicU64::new(0) },
        probe: ProbeControl {
            status: AtomicU32::new(0),
            current: AtomicPtr::new(core::ptr::null_mut()),
            previous: AtomicPtr::new(core::ptr::null_mut()),
            step_spsr: AtomicU64::new(0),
        },
        user_step: AtomicPtr::new(core::ptr::null_mut()),
        user_step_own: UserStepControl {
            index: AtomicUsize::new(usize::MAX),
            spsr: AtomicU64::new(0),
            hardware_step: AtomicBool::new(false),
        },
        allocation_sample: AtomicU64::new(0x9e37_79b9_7f4a_7c15),
    }
}; CPUS];

impl PerCpu {
    /// This CPU's IRQ stack slot (from its stack top: no slot arithmetic on the way).
    #[inline(always)]
    pub fn irq_slot(&self) -> Slot {
        Slot(self.irq_stack_top.load(Ordering::Relaxed) - super::stack::SLOT_SIZE)
    }

    /// This CPU's overflow stack slot.
    #[inline(always)]
    pub fn overflow_slot(&self) -> Slot {
        Slot(self.overflow_stack_top.load(Ordering::Relaxed) - super::stack::SLOT_SIZE)
    }
}

/// This CPU's data (TPIDR_EL1, set by `init_this_cpu` before anything else runs).
#[inline(always)]
pub fn this_cpu() -> &'static PerCpu {
    let data: u64;
    // SAFETY: reads the kernel's per-CPU pointer register; no memory is touched.
    unsafe { core::arch::asm!("mrs {}, tpidr_el1", out(reg) data, options(nomem, nostack, preserves_flags)) };
    debug_assert!(data != 0, "this_cpu() before init_this_cpu()");
    // SAFETY: TPIDR_EL1 holds the address of this CPU's entry of PER_CPU (init_this_cpu wrote
    // it, nothing else writes the register), a static that lives forever.
    unsafe { &*(data as *const PerCpu) }
}

/// CPU `cpu`'s data (another CPU's only to read: its owner writes it).
pub fn cpu_data(cpu: usize) -> &'static PerCpu {
    &PER_CPU[cpu]
}

/// This CPU's index.
#[inline(always)]
pub fn this_cpu_index() -> usize {
    this_cpu().index.load(Ordering::Relaxed) as usize
}

/// Fills CPU `cpu`'s stack addresses from its IRQ and overflow slots and points TPIDR_EL1 at its
/// data. Called once per CPU, on that CPU, first thing.
pub fn init_this_cpu(cpu: usize, irq: Slot, overflow: Slot) {
    let data = &PER_CPU[cpu];
    for slot in [irq, overflow] {
        // SAFETY: the magic slot is the last word of a mapped shadow-call-stack page.
        unsafe { core::ptr::write_volatile((slot.shadow_stack_end() - 8) as *mut u64, unwind::SCS_END_MAGIC) };
    }
    data.index.store(cpu as u64, Ordering::Relaxed);
    data.irq_stack_top.store(irq.stack_top(), Ordering::Relaxed);
    data.irq_shadow_stack.store(irq.shadow_stack_base(), Ordering::Relaxed);
    data.overflow_stack_top.store(overflow.stack_top(), Ordering::Relaxed);
    data.overflow_shadow_stack.store(overflow.shadow_stack_base(), Ordering::Relaxed);
    data.user_step.store(core::ptr::from_ref(&data.user_step_own).cast_mut(), Ordering::Relaxed);
    // SAFETY: TPIDR_EL1 is the kernel's per-CPU pointer register; nothing else uses it.
    unsafe {
        core::arch::asm!("msr tpidr_el1, {}", "isb", in(reg) data as *const PerCpu, options(nostack, preserves_flags))
    };
}
