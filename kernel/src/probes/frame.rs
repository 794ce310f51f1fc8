//! The saved exception frame as the `probes` crate's register file, for every probe kind.

use crate::arch::exception::ExceptionFrame;
use probes::{RegisterFile, Registers};

const _: () = {
    use core::mem::offset_of;
    assert!(offset_of!(ExceptionFrame, x) == offset_of!(Registers, x));
    assert!(offset_of!(ExceptionFrame, sp) == offset_of!(Registers, sp));
    assert!(offset_of!(ExceptionFrame, elr) == offset_of!(Registers, pc));
    assert!(offset_of!(ExceptionFrame, spsr) == offset_of!(Registers, pstate));
};

/// The frame's first 34 words, as the `probes` crate's register file (same layout, checked
/// above). Changes go straight into what the exception return restores.
#[inline(always)]
pub fn registers(frame: &mut ExceptionFrame) -> &mut Registers {
    // SAFETY: both are repr(C) with x[31], sp, pc/elr, pstate/spsr at the same offsets, and the
    // frame is larger; the borrow of the frame is handed on.
    unsafe { &mut *(frame as *mut ExceptionFrame).cast::<Registers>() }
}

/// The saved registers as the simulator's register file, with accessors the compiler inlines
/// into the `simulate` instantiation (the crate's own `Registers` impl is not inlinable across
/// crates, and a call per register access was a third of a simulated hit).
pub struct FrameRegisters<'a>(pub &'a mut Registers);

impl RegisterFile for FrameRegisters<'_> {
    #[inline(always)]
    fn x(&self, n: u8) -> u64 {
        self.0.x[usize::from(n) % 31]
    }
    #[inline(always)]
    fn set_x(&mut self, n: u8, value: u64) {
        self.0.x[usize::from(n) % 31] = value;
    }
    #[inline(always)]
    fn sp(&self) -> u64 {
        self.0.sp
    }
    #[inline(always)]
    fn set_sp(&mut self, value: u64) {
        self.0.sp = value;
    }
    #[inline(always)]
    fn pc(&self) -> u64 {
        self.0.pc
    }
    #[inline(always)]
    fn set_pc(&mut self, value: u64) {
        self.0.pc = value;
    }
    #[inline(always)]
    fn pstate(&self) -> u64 {
        self.0.pstate
    }
    #[inline(always)]
    fn set_pstate(&mut self, value: u64) {
        self.0.pstate = value;
    }
}
