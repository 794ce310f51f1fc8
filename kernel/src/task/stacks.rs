//! Stack slots: where every kernel stack and shadow call stack lives, and the per-CPU data that
//! exception entry reads through TPIDR_EL1.
//!
//! A slot is 64 KiB, 64 KiB-aligned (kernel.ld):
//!
//! | offset        | contents                                                   |
//! |---------------|------------------------------------------------------------|
//! | 0 .. 4 KiB    | shadow call stack, grows up; last slot holds SCS_END_MAGIC |
//! | 4 .. 32 KiB   | unmapped guard (above the SCS, below the stack)            |
//! | 32 .. 64 KiB  | stack, grows down                                          |
//!
//! The alignment makes both overflows testable from a register alone, before anything is
//! stored (vectors.S): a valid SP has bit 15 set (it lies in the upper half of its slot), a valid
//! x18 has bits 12-15 clear (it lies in the first 4 KiB). Slot 0 is the boot task's; each CPU
//! owns an IRQ slot and an overflow slot after the task slots.

use crate::arch::exception::ExceptionFrame;
use core::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

pub const SLOT_SIZE: u64 = 64 << 10;
pub const SHADOW_STACK_SIZE: u64 = 4 << 10;
pub const STACK_SIZE: u64 = 32 << 10;
/// Bit of a valid SP that vectors.S tests (set in the upper half of a slot).
pub const STACK_BIT: u64 = 15;
/// Bits of a valid x18 that vectors.S tests (all clear in the shadow call stack page).
pub const SHADOW_STACK_MASK: u64 = (SLOT_SIZE - 1) & !(SHADOW_STACK_SIZE - 1);

pub const TASK_SLOTS: usize = 8;
pub const CPUS: usize = 1;
/// Task slots, then per CPU an IRQ slot and an overflow slot (kernel.ld reserves this many).
pub const SLOTS: usize = TASK_SLOTS + 2 * CPUS;

const _: () = assert!(SHADOW_STACK_MASK == 0xf000);
const _: () = assert!(1 << STACK_BIT == STACK_SIZE);

/// One slot, by its base address.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Slot(pub u64);

impl Slot {
    pub const fn shadow_stack_base(self) -> u64 {
        self.0
    }
    /// One past the last shadow-stack slot (the magic sits at end - 8).
    pub const fn shadow_stack_end(self) -> u64 {
        self.0 + SHADOW_STACK_SIZE
    }
    pub const fn stack_base(self) -> u64 {
        self.0 + SLOT_SIZE - STACK_SIZE
    }
    pub const fn stack_top(self) -> u64 {
        self.0 + SLOT_SIZE
    }
    pub fn contains_stack(self, address: u64) -> bool {
        (self.stack_base()..self.stack_top()).contains(&address)
    }
}

/// The slots between two linker symbols.
pub fn slots(start: u64, end: u64) -> impl Iterator<Item = Slot> {
    assert!(
        start.is_multiple_of(SLOT_SIZE) && (end - start) == SLOTS as u64 * SLOT_SIZE,
        "kernel.ld reserves {} stack slots",
        SLOTS
    );
    (0..SLOTS as u64).map(move |index| Slot(start + index * SLOT_SIZE))
}

unsafe extern "C" {
    static __stack_slots_start: u8;
}

/// Slot `index` (tasks first, then each CPU's IRQ and overflow slots).
pub fn slot(index: usize) -> Slot {
    assert!(index < SLOTS);
    // SAFETY: only the address of the linker symbol is taken.
    Slot(unsafe { &__stack_slots_start as *const u8 as u64 } + index as u64 * SLOT_SIZE)
}

pub fn irq_slot(cpu: usize) -> Slot {
    slot(TASK_SLOTS + 2 * cpu)
}

pub fn overflow_slot(cpu: usize) -> Slot {
    slot(TASK_SLOTS + 2 * cpu + 1)
}

/// Per-CPU data. vectors.S and context.S read the first fields by offset (see arch/mod.rs).
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
    }
}; CPUS];

/// This CPU's data.
pub fn this_cpu() -> &'static PerCpu {
    &PER_CPU[0]
}

/// Fills this CPU's stack addresses and points TPIDR_EL1 at its data. Called once, first thing.
pub fn init_this_cpu() {
    let cpu = 0;
    let data = &PER_CPU[cpu];
    for slot in [irq_slot(cpu), overflow_slot(cpu)] {
        // SAFETY: the magic slot is the last word of a mapped shadow-call-stack page.
        unsafe { core::ptr::write_volatile((slot.shadow_stack_end() - 8) as *mut u64, unwind::SCS_END_MAGIC) };
    }
    data.irq_stack_top.store(irq_slot(cpu).stack_top(), Ordering::Relaxed);
    data.irq_shadow_stack.store(irq_slot(cpu).shadow_stack_base(), Ordering::Relaxed);
    data.overflow_stack_top.store(overflow_slot(cpu).stack_top(), Ordering::Relaxed);
    data.overflow_shadow_stack.store(overflow_slot(cpu).shadow_stack_base(), Ordering::Relaxed);
    // SAFETY: TPIDR_EL1 is the kernel's per-CPU pointer register; nothing else uses it.
    unsafe {
        core::arch::asm!("msr tpidr_el1, {}", "isb", in(reg) data as *const PerCpu, options(nostack, preserves_flags))
    };
}
