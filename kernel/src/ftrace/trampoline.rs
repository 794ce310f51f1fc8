//! The per-call path: the trampoline every enabled callsite branches to, and the ops functions
//! it may call (nop, list, vector).
//!
//! A traced function starts with `mov x9, x30; bl ftrace_trampoline`, so on entry x30 is the
//! callsite's return address `E + 16` (back into the function body) and x9 the traced
//! function's own return address (into its caller, unsigned: `paciasp` has not run yet). The
//! trampoline
//! 1. saves x0-x8 (arguments and the indirect-result register) and two frame records, one for
//!    the traced function `{caller's x29, x9}` and, below it, one for itself `{that record,
//!    x30}`, so a frame-pointer walk from a tracer sees tracer -> trampoline -> traced function
//!    -> caller;
//! 2. masks IRQs and FIQs, and takes this CPU's recursion guard (a tracer that calls a traced
//!    function skips it, counted in `recursions`); with IRQs masked the guard is exact per CPU
//!    and a tracer never runs twice on one CPU at once;
//! 3. in shadow-call-stack builds pushes x9 then x30 on the SCS, so an SCS walk from a tracer
//!    shows the same two frames (x18 is back where it was on return);
//! 4. loads the ops address from the literal at `E = x30 - 16` and calls
//!    `ops.func(ip, parent_ip, ops, regs)`;
//! 5. restores everything and returns into the body with x30 = the real return address.
//!
//! x9-x17 are free at a function's entry (AAPCS64 temporaries that carry no argument).

use core::mem::offset_of;
use core::sync::atomic::Ordering;

use ::ftrace::TracerId;

use super::{TABLE, VECTORS};

/// What a tracer sees of the traced call: the argument registers as they were at entry.
#[repr(C)]
pub struct Regs {
    pub x: [u64; 9],
    /// DAIF at entry (the trampoline's own; restored on the way out).
    daif: u64,
    /// The caller's frame pointer; with `lr`, the traced function's frame record.
    pub fp: u64,
    /// The traced function's return address (the parent ip).
    pub lr: u64,
    /// SP at the traced function's entry.
    pub sp: u64,
    /// The traced function's address.
    pub pc: u64,
}

/// A tracer's ops: what a callsite literal points at.
#[repr(C)]
pub struct Ops {
    pub func: TracerFn,
    /// Whatever the ops' owner keeps here (the vector slot for vector ops).
    pub private: u64,
}

/// `ops.func(ip, parent_ip, ops, regs)`: called with IRQs masked and the recursion guard held.
pub type TracerFn = unsafe extern "C" fn(ip: u64, parent_ip: u64, ops: &Ops, regs: &mut Regs);

/// One CPU's trampoline state: `guard` is non-zero while a tracer runs on it. It lives in the
/// CPU's per-CPU data (the trampoline finds it through TPIDR_EL1, as cheaply as a static).
pub type CpuState = crate::arch::percpu::TracerGuard;

/// This CPU's trampoline state.
pub fn this_cpu() -> &'static CpuState {
    &crate::arch::percpu::this_cpu().tracer
}

impl CpuState {
    pub fn inside_tracer(&self) -> bool {
        self.guard.load(Ordering::Acquire) != 0
    }
}

const FRAME: usize = 128;
const _: () = {
    assert!(offset_of!(Regs, x) == 0 && offset_of!(Regs, daif) == 72 && offset_of!(Regs, fp) == 80);
    assert!(offset_of!(Regs, lr) == 88 && offset_of!(Regs, sp) == 96 && offset_of!(Regs, pc) == 104);
    assert!(size_of::<Regs>() == 112 && FRAME == 16 + size_of::<Regs>());
    // The traced function's frame (its record: Regs.fp and Regs.lr, then Regs.sp and Regs.pc)
    // is the top of the save area, as the CFI below and the converter's call-slot rows say.
    assert!(16 + offset_of!(Regs, fp) == FRAME - ::ftrace::CallSite::CALLER_FRAME as usize);
    assert!(offset_of!(Ops, func) == 0 && offset_of!(CpuState, guard) == 0 && offset_of!(CpuState, recursions) == 8);
};

core::arch::global_asm!(
    r#"
    .section .text.noprobe.ftrace, "ax"
    .balign 8
    .global ftrace_trampoline
ftrace_trampoline:
    sub     sp, sp, #128                // [sp]: the trampoline's frame record; [sp + 16]: Regs
    stp     x0, x1, [sp, #16]
    stp     x2, x3, [sp, #32]
    stp     x4, x5, [sp, #48]
    stp     x6, x7, [sp, #64]
    stp     x29, x9, [sp, #96]          // Regs.fp/lr: the traced function's frame record
    // CFI from here (xtask converts it into the SFrame table): the trampoline's frame is the
    // 96 bytes below the traced function's record, its caller the call slot's return, whose
    // rows the converter adds (`CallSite::CALLER_FRAME`: that record at the bottom of 32 bytes).
    // Before the record is written no table can say where x9 is: those five words have no rows.
    .cfi_startproc
    .cfi_def_cfa_offset {own}
    add     x29, sp, #96
    stp     x29, x30, [sp]              // the trampoline's, returning into the traced function
    .cfi_offset x29, -{own}
    .cfi_offset x30, -({own} - 8)
    mov     x29, sp
    add     x10, sp, #128
    sub     x11, x30, #8                // ip: the symbol, E + 8
    stp     x10, x11, [sp, #112]        // Regs.sp/pc
    mrs     x12, daif
    stp     x8, x12, [sp, #80]
    msr     daifset, #3
    mrs     x13, tpidr_el1              // this CPU's recursion guard
    add     x13, x13, #{percpu_tracer}
    ldr     x14, [x13]
    cbnz    x14, 2f
    mov     x14, #1
    str     x14, [x13]
    .if {scs}
    str     x9, [x18], #8
    str     x30, [x18], #8
    .endif
    mov     x0, x11
    mov     x1, x9
    ldur    x2, [x30, #-16]             // the callsite's ops literal
    add     x3, sp, #16
    ldr     x4, [x2]
    blr     x4
    .if {scs}
    sub     x18, x18, #16
    .endif
    mrs     x13, tpidr_el1              // this CPU's recursion guard
    add     x13, x13, #{percpu_tracer}
    str     xzr, [x13]
1:  ldp     x8, x12, [sp, #80]
    msr     daif, x12
    ldp     x0, x1, [sp, #16]
    ldp     x2, x3, [sp, #32]
    ldp     x4, x5, [sp, #48]
    ldp     x6, x7, [sp, #64]
    ldp     x29, x9, [sp, #96]
    ldr     x10, [sp, #8]
    // From here the return address is in x10: no rows (a table cannot name x10).
    .cfi_endproc
    add     sp, sp, #128
    mov     x30, x9
    ret     x10
    .cfi_startproc
    .cfi_def_cfa_offset {own}
    .cfi_offset x29, -{own}
    .cfi_offset x30, -({own} - 8)
2:  ldr     x14, [x13, #8]              // recursion: count it and skip the tracer
    add     x14, x14, #1
    str     x14, [x13, #8]
    b       1b
    .cfi_endproc
    .size ftrace_trampoline, . - ftrace_trampoline
"#,
    scs = const crate::build_info::SHADOW_CALL_STACK as u8,
    percpu_tracer = const offset_of!(crate::arch::percpu::PerCpu, tracer),
    own = const FRAME - ::ftrace::CallSite::CALLER_FRAME as usize,
);

unsafe extern "C" {
    fn ftrace_trampoline();
}

pub fn trampoline_address() -> u64 {
    ftrace_trampoline as *const () as u64
}

/// The ops of every initialised but untraced site (never called: its `bl` is a NOP).
pub static NOP_OPS: Ops = Ops { func: nop_func, private: 0 };
/// The list ops: walk every registered tracer and test whether it traces this site.
pub static LIST_OPS: Ops = Ops { func: list_func, private: 0 };
/// Vector slot `i`'s ops: walk slot `i`'s tracer set.
pub static VECTOR_OPS: [Ops; VECTORS] = {
    let mut ops = [const { Ops { func: vector_func, private: 0 } }; VECTORS];
    let mut slot = 0;
    while slot < VECTORS {
        ops[slot].private = slot as u64;
        slot += 1;
    }
    ops
};

#[sanitize(kernel_hwaddress = "off")]
unsafe extern "C" fn nop_func(_: u64, _: u64, _: &Ops, _: &mut Regs) {}

/// The seed's `ftrace_ops_list_func`: the site's index (the table's hash index: constant time),
/// then every registered tracer, each tested against the site (two loads).
#[sanitize(kernel_hwaddress = "off")]
unsafe extern "C" fn list_func(ip: u64, parent_ip: u64, _: &Ops, regs: &mut Regs) {
    let Some(site) = TABLE.site_index(ip - 8) else { return };
    for tracer in TABLE.registered() {
        if TABLE.traces(site, tracer) {
            let ops = TABLE.ops_address(tracer) as *const Ops;
            // SAFETY: a registered tracer's ops address is a live `Ops` (ftrace::register takes
            // `&'static Ops` and unregister waits for a grace period before returning).
            unsafe { ((*ops).func)(ip, parent_ip, &*ops, regs) };
        }
    }
}

/// A vector slot's function: every tracer of the slot's set, no site lookup, no irrelevant
/// tracer looked at. Plain index loops over the set's words (one `rbit; clz` and one
/// `bits & (bits - 1)` per member): the hot loop of the `vector` scheme.
#[sanitize(kernel_hwaddress = "off")]
unsafe extern "C" fn vector_func(ip: u64, parent_ip: u64, ops: &Ops, regs: &mut Regs) {
    let set = TABLE.vector(ops.private as usize).words();
    let mut word = 0;
    while word < set.len() {
        let mut bits = set[word];
        while bits != 0 {
            let tracer = TracerId((word * 64) as u16 + bits.trailing_zeros() as u16);
            bits &= bits - 1;
            let ops = TABLE.ops_address(tracer) as *const Ops;
            // SAFETY: as in `list_func`.
            unsafe { ((*ops).func)(ip, parent_ip, &*ops, regs) };
        }
        word += 1;
    }
}
