//! Relaxed atomic accesses as single instructions, for code the sanitizer must not instrument.
//!
//! In the `full` image, a function marked `#[sanitize(kernel_hwaddress = "off")]` (the heap's
//! allocation path, the walkers) cannot inline core's atomic methods: they are instrumented, and
//! LLVM does not inline across differing sanitizer attributes, so each `load`/`store` would be an
//! out-of-line call with its own shadow check, PAC and shadow-stack push. These are the same
//! accesses written in asm, which no sanitizer instruments and which inline anywhere. Each is one
//! naturally aligned `ldr`/`ldrb`/`str` of the atomic's own memory: a single-copy atomic access,
//! which is what a relaxed atomic access compiles to on AArch64 (Arm ARM B2.2.1).

use super::percpu::PerCpu;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64};

/// `atomic.load(Relaxed)`, as one `ldr`.
#[inline(always)]
pub fn load_u32(atomic: &AtomicU32) -> u32 {
    let value: u32;
    // SAFETY: an aligned 32-bit load of an atomic's own memory: a relaxed atomic load. Reads
    // `a`, writes `v`; no stack, flags untouched.
    unsafe {
        core::arch::asm!("ldr {v:w}, [{a}]", a = in(reg) atomic as *const AtomicU32, v = lateout(reg) value, options(nostack, readonly, preserves_flags))
    };
    value
}

/// `atomic.load(Relaxed)`, as one `ldrb` (an `AtomicBool` holds 0 or 1).
#[inline(always)]
pub fn load_bool(atomic: &AtomicBool) -> bool {
    let value: u32;
    // SAFETY: a byte load of an atomic's own memory: a relaxed atomic load (as `load_u32`).
    unsafe {
        core::arch::asm!("ldrb {v:w}, [{a}]", a = in(reg) atomic as *const AtomicBool, v = lateout(reg) value, options(nostack, readonly, preserves_flags))
    };
    value != 0
}

/// `atomic.load(Relaxed)`, as one `ldr`.
#[inline(always)]
pub fn load_u64(atomic: &AtomicU64) -> u64 {
    let value: u64;
    // SAFETY: an aligned 64-bit load of an atomic's own memory: a relaxed atomic load (as
    // `load_u32`).
    unsafe {
        core::arch::asm!("ldr {v}, [{a}]", a = in(reg) atomic as *const AtomicU64, v = lateout(reg) value, options(nostack, readonly, preserves_flags))
    };
    value
}

/// `atomic.load(Relaxed)`, as one `ldr`.
#[inline(always)]
pub fn load_pointer<T>(atomic: &AtomicPtr<T>) -> *mut T {
    let value: *mut T;
    // SAFETY: an aligned 64-bit load of an atomic's own memory: a relaxed atomic load (as
    // `load_u32`).
    unsafe {
        core::arch::asm!("ldr {v}, [{a}]", a = in(reg) atomic as *const AtomicPtr<T>, v = lateout(reg) value, options(nostack, readonly, preserves_flags))
    };
    value
}

/// `atomic.store(value, Relaxed)`, as one `str`.
#[inline(always)]
pub fn store_u32(atomic: &AtomicU32, value: u32) {
    // SAFETY: an aligned 32-bit store to an atomic's own memory (interior mutability): a
    // relaxed atomic store. Reads `a` and `v`; no stack, flags untouched.
    unsafe {
        core::arch::asm!("str {v:w}, [{a}]", a = in(reg) atomic as *const AtomicU32, v = in(reg) value, options(nostack, preserves_flags))
    };
}

/// `atomic.store(value, Relaxed)`, as one `str`.
#[inline(always)]
pub fn store_u64(atomic: &AtomicU64, value: u64) {
    // SAFETY: an aligned 64-bit store to an atomic's own memory (interior mutability): a
    // relaxed atomic store (as `store_u32`).
    unsafe {
        core::arch::asm!("str {v}, [{a}]", a = in(reg) atomic as *const AtomicU64, v = in(reg) value, options(nostack, preserves_flags))
    };
}

/// `percpu::this_cpu_index()`: TPIDR_EL1 and one load of this CPU's `PerCpu::index`.
#[inline(always)]
pub fn this_cpu_index() -> usize {
    let index: usize;
    // SAFETY: TPIDR_EL1 holds the address of this CPU's `PerCpu` (percpu::init_this_cpu wrote it
    // before anything ran on this CPU), whose `index` field only init_this_cpu writes. Writes
    // `i` only; no stack, flags untouched.
    unsafe {
        core::arch::asm!(
            "mrs {i}, tpidr_el1",
            "ldr {i}, [{i}, #{offset}]",
            i = out(reg) index,
            offset = const core::mem::offset_of!(PerCpu, index),
            options(nostack, readonly, preserves_flags),
        )
    };
    index
}
