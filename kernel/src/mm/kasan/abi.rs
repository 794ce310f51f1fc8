//! The compiler ABI of the tag-based sanitizer: `__hwasan_tag_mismatch`, called by the
//! compiler's outlined checks (`__hwasan_check_x<R>_<info>`) when a pointer's tag differs from
//! its memory's, `__hwasan_{load,store}N` and the memory intrinsics `__hwasan_mem*`.
//!
//! Build variant `full` compiles every function with `-Zsanitizer=kernel-hwaddress` in the
//! outline scheme (see xtask's build variants): each load/store first calls a check thunk that
//! compares the pointer's top byte with the shadow byte of its granule. Untagged kernel pointers
//! carry 0xFF, the match-all tag, and the shadow of everything but future heap objects holds 0xFF.
//! This runtime decodes each mismatch (address, size, read/write, tags), looks up the object in
//! the heap's stack ring and hands both to the record step (record.rs), which gathers the rest of
//! the KASAN-style report (report.rs). Memory intrinsics
//! and odd-sized accesses are checked over their whole range here (`check_range`).

use super::Tags;
use super::heap;
use super::record::{self, Mismatch};
use super::storage::TagStorage;

// The thunk's calling convention (LLVM's HWASan outlined checks, same as Linux's
// kasan_sw_tags.S): x0 = address, x1 = access info; the thunk has already reserved 256 bytes of
// stack and stored x0/x1 at [sp] and x29/x30 at [sp, #232]. Everything but x16/x17 must survive,
// so x2-x15 (caller-saved under AAPCS) are saved here before calling Rust.
//
// `__hwasan_tag_mismatch_v2` is what the short-granule thunks (`__hwasan_check_x<R>_<info>_short_v2`,
// `--kasan-short-granules`) tail-call, with the same convention: they read the shadow through
// x20 (the shadow base every instrumented function loads; callee-saved, so nothing here
// touches it) and call only once the short-granule rule too has refused the access. The v1
// entry keeps the thunks without that rule correct in a short-granule kernel: the Rust side
// applies the rule again before reporting (`sanitizer_tag_mismatch`).
core::arch::global_asm!(
    r#"
    .section .text.sanitizer, "ax"
    .global __hwasan_tag_mismatch
    .global __hwasan_tag_mismatch_v2
__hwasan_tag_mismatch:
__hwasan_tag_mismatch_v2:
    stp     x2, x3, [sp, #16]
    stp     x4, x5, [sp, #32]
    stp     x6, x7, [sp, #48]
    stp     x8, x9, [sp, #64]
    stp     x10, x11, [sp, #80]
    stp     x12, x13, [sp, #96]
    stp     x14, x15, [sp, #112]
    add     x29, sp, #232
    mov     x2, x30
    bl      sanitizer_tag_mismatch
    ldp     x2, x3, [sp, #16]
    ldp     x4, x5, [sp, #32]
    ldp     x6, x7, [sp, #48]
    ldp     x8, x9, [sp, #64]
    ldp     x10, x11, [sp, #80]
    ldp     x12, x13, [sp, #96]
    ldp     x14, x15, [sp, #112]
    ldp     x29, x30, [sp, #232]
    ldp     x0, x1, [sp], #256
    ret
"#
);

/// Checks an access of `size` bytes at once: accesses whose size is not a power of two up to 16
/// (the compiler calls these with AAPCS, e.g. block copies of arrays) and the memory
/// intrinsics. A mismatch anywhere in the range is reported as the whole access (its start and
/// size, as KASAN does), with the memory tag of the first mismatching granule. Whether it
/// mismatched.
///
/// Always inlined into the `__hwasan_*` entries below (uninstrumented, in `.text.sanitizer`),
/// whose attributes its body takes: a call per access would cost a frame each time.
#[inline(always)]
fn check_range(address: u64, size: u64, write: bool, return_address: u64) -> bool {
    let pointer_tag = (address >> 56) as u8;
    let untagged = address | (0xff << 56);
    // A range that runs past the end of the address space (a negative size, `(size_t)-2`) is
    // reported whatever the pointer's tag: no granule loop could cover it.
    let Some(end) = untagged.checked_add(size) else {
        let memory_tag = Tags::memory_tag(untagged);
        record(Mismatch { address, size, write, pointer_tag, memory_tag, return_address });
        return true;
    };
    if pointer_tag == Tags::MATCH_ALL || size == 0 {
        return false;
    }
    let mut granule = untagged & !(Tags::GRANULE - 1);
    while granule < end {
        let memory_tag = Tags::memory_tag(granule);
        if memory_tag != pointer_tag && !Tags::short_granule_accepts(granule, memory_tag, pointer_tag, end) {
            record(Mismatch { address, size, write, pointer_tag, memory_tag, return_address });
            return true;
        }
        granule += Tags::GRANULE;
    }
    false
}

#[unsafe(no_mangle)]
#[sanitize(kernel_hwaddress = "off")]
#[unsafe(link_section = ".text.sanitizer")]
extern "C" fn __hwasan_loadN(address: u64, size: u64) {
    let _ = check_range(address, size, false, return_address());
}

#[unsafe(no_mangle)]
#[sanitize(kernel_hwaddress = "off")]
#[unsafe(link_section = ".text.sanitizer")]
extern "C" fn __hwasan_storeN(address: u64, size: u64) {
    let _ = check_range(address, size, true, return_address());
}

// The memory intrinsics of instrumented code (`-hwasan-kernel-mem-intrinsic-prefix=1` turns
// llvm.memcpy/memmove/memset into these): the whole range is checked once, then the operation
// runs on untagged pointers, so that core's (instrumented) memcpy does not report each word of
// a range already reported. A reported range is not touched, in every mode: recovering from a
// report must not let the runtime itself overwrite the heap.
unsafe extern "C" {
    fn memcpy(destination: *mut u8, source: *const u8, count: usize) -> *mut u8;
    fn memmove(destination: *mut u8, source: *const u8, count: usize) -> *mut u8;
    fn memset(destination: *mut u8, byte: i32, count: usize) -> *mut u8;
}

/// `address` with the match-all tag, unless it is a low (TTBR0, tag 0x00) address.
///
/// Always inlined: its callers are no-probe sanitizer text (`__hwasan_mem*`), which the probe
/// hit path itself calls; out of line it was an ordinary, probeable function under them (the
/// `full` probe sweep spent 848 s of virtual time in batches probing it).
#[inline(always)]
fn untag(address: u64) -> u64 {
    if address >> 56 == 0 { address } else { address | (0xff << 56) }
}

#[unsafe(no_mangle)]
#[sanitize(kernel_hwaddress = "off")]
#[unsafe(link_section = ".text.sanitizer")]
unsafe extern "C" fn __hwasan_memcpy(destination: *mut u8, source: *const u8, count: usize) -> *mut u8 {
    let from = return_address();
    if check_range(source as u64, count as u64, false, from)
        || check_range(destination as u64, count as u64, true, from)
    {
        return destination;
    }
    // SAFETY: the compiler calls this in place of memcpy, with memcpy's contract.
    unsafe { memcpy(untag(destination as u64) as *mut u8, untag(source as u64) as *const u8, count) };
    destination
}

#[unsafe(no_mangle)]
#[sanitize(kernel_hwaddress = "off")]
#[unsafe(link_section = ".text.sanitizer")]
unsafe extern "C" fn __hwasan_memmove(destination: *mut u8, source: *const u8, count: usize) -> *mut u8 {
    let from = return_address();
    if check_range(source as u64, count as u64, false, from)
        || check_range(destination as u64, count as u64, true, from)
    {
        return destination;
    }
    // SAFETY: the compiler calls this in place of memmove, with memmove's contract.
    unsafe { memmove(untag(destination as u64) as *mut u8, untag(source as u64) as *const u8, count) };
    destination
}

#[unsafe(no_mangle)]
#[sanitize(kernel_hwaddress = "off")]
#[unsafe(link_section = ".text.sanitizer")]
unsafe extern "C" fn __hwasan_memset(destination: *mut u8, byte: i32, count: usize) -> *mut u8 {
    if check_range(destination as u64, count as u64, true, return_address()) {
        return destination;
    }
    // SAFETY: the compiler calls this in place of memset, with memset's contract.
    unsafe { memset(untag(destination as u64) as *mut u8, byte, count) };
    destination
}

#[inline(always)]
fn return_address() -> u64 {
    let lr: u64;
    // SAFETY: reads x30 (this inlined call's caller's return address); no memory access.
    unsafe { core::arch::asm!("mov {}, x30", out(reg) lr, options(nomem, nostack, preserves_flags)) };
    crate::arch::cpu::strip_pac(lr)
}

#[unsafe(no_mangle)]
#[sanitize(kernel_hwaddress = "off")]
#[unsafe(link_section = ".text.sanitizer")]
extern "C" fn sanitizer_tag_mismatch(address: u64, info: u64, return_address: u64) {
    let memory_tag = Tags::memory_tag(address);
    let size = 1 << (info & 0xf);
    let pointer_tag = (address >> 56) as u8;
    let end = untag(address).wrapping_add(size);
    if Tags::short_granule_accepts(untag(address) & !(Tags::GRANULE - 1), memory_tag, pointer_tag, end) {
        return;
    }
    let write = info & 0x10 != 0;
    record(Mismatch {
        address,
        size,
        write,
        pointer_tag,
        memory_tag,
        return_address: crate::arch::cpu::strip_pac(return_address),
    });
    if Tags::SHORT_GRANULES && write {
        retag_short_granules(untag(address), end);
    }
}

/// Before a reported store the compiler checked is carried out (recover mode): every short
/// granule whose tag byte the store `[start, end)` overwrites gets its object's tag as its
/// memory tag, read from that byte while it is intact. The granule stops being short (an
/// access past the object's end inside it is no longer caught) but its object's valid
/// accesses, the runtime's intrinsics over it and its free keep passing; left short, the
/// clobbered byte would make every one of them a report. The runtime's own intrinsics never
/// carry out a reported store, so they need no repair.
#[cold]
#[inline(never)]
#[sanitize(kernel_hwaddress = "off")]
#[unsafe(link_section = ".text.sanitizer")]
fn retag_short_granules(start: u64, end: u64) {
    let mut granule = start & !(Tags::GRANULE - 1);
    while granule < end {
        let tag_byte = granule + Tags::GRANULE - 1;
        let memory_tag = Tags::memory_tag(granule);
        let short = memory_tag != 0 && (memory_tag as u64) < Tags::GRANULE;
        if short && (start..end).contains(&tag_byte) {
            let object_tag = Tags::object_tag(granule);
            if Tags::is_object_tag(object_tag) {
                Tags::set_range_tag(granule, Tags::GRANULE, object_tag);
            }
        }
        granule += Tags::GRANULE;
    }
}

/// Hands a mismatch and what the heap knows about its address to the record step (record.rs),
/// which returns to the access when a test records reports or the kernel runs in recover mode,
/// else stops the kernel. Out of line: the range checks inline around it stay small.
#[cold]
#[inline(never)]
#[sanitize(kernel_hwaddress = "off")]
#[unsafe(link_section = ".text.sanitizer")]
fn record(mismatch: Mismatch) {
    record::mismatch(&mismatch, heap::view(mismatch.address));
}
