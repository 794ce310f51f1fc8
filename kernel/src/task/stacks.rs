//! Stack slots: which slot is whose (tasks first, then each CPU's IRQ and overflow slots, then
//! the secondaries' idle slots). The slot geometry (`Slot`, sizes, the bits vectors.S tests) and the per-CPU data live in arch/.

pub use crate::arch::percpu::{CPUS, this_cpu};
pub use crate::arch::stack::{SHADOW_STACK_SIZE, SLOT_SIZE, STACK_SIZE, Slot};

pub const TASK_SLOTS: usize = 8;
/// Task slots, then per CPU an IRQ slot and an overflow slot, then each secondary CPU's idle
/// slot (the boot CPU idles in task 0). kernel.ld reserves this many.
pub const SLOTS: usize = TASK_SLOTS + 2 * CPUS + (CPUS - 1);

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

/// Secondary CPU `cpu`'s idle slot: the stack it starts on.
pub fn idle_slot(cpu: usize) -> Slot {
    assert!((1..CPUS).contains(&cpu));
    slot(TASK_SLOTS + 2 * CPUS + cpu - 1)
}

/// This CPU's IRQ slot.
#[inline(always)]
pub fn this_irq_slot() -> Slot {
    this_cpu().irq_slot()
}

/// This CPU's overflow slot.
#[inline(always)]
pub fn this_overflow_slot() -> Slot {
    this_cpu().overflow_slot()
}

/// Sets up the boot CPU's per-CPU data (TPIDR_EL1) with its IRQ and overflow slots. First thing.
pub fn init_this_cpu() {
    let cpu = 0;
    crate::arch::percpu::init_this_cpu(cpu, irq_slot(cpu), overflow_slot(cpu));
}
