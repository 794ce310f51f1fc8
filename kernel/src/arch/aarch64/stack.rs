//! Stack-slot geometry: the shape of every kernel stack and shadow call stack, which exception
//! entry (vectors.S) tests from a register alone.
//!
//! A slot is 64 KiB, 64 KiB-aligned (kernel.ld):
//!
//! | offset        | contents                                                   |
//! |---------------|------------------------------------------------------------|
//! | 0 .. 4 KiB    | shadow call stack, grows up; last slot holds SCS_END_MAGIC |
//! | 4 .. 32 KiB   | unmapped guard (above the SCS, below the stack)            |
//! | 32 .. 64 KiB  | stack, grows down                                          |
//!
//! The alignment makes both overflows testable before anything is stored (vectors.S): a valid
//! SP has bit 15 set (it lies in the upper half of its slot), a valid x18 has bits 12-15 clear
//! (it lies in the first 4 KiB). Which slot is whose is the task layer's business
//! (task/stacks.rs).

pub const SLOT_SIZE: u64 = 64 << 10;
pub const SHADOW_STACK_SIZE: u64 = 4 << 10;
pub const STACK_SIZE: u64 = 32 << 10;
/// Bit of a valid SP that vectors.S tests (set in the upper half of a slot).
pub const STACK_BIT: u64 = 15;
/// Bits of a valid x18 that vectors.S tests (all clear in the shadow call stack page).
pub const SHADOW_STACK_MASK: u64 = (SLOT_SIZE - 1) & !(SHADOW_STACK_SIZE - 1);

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
