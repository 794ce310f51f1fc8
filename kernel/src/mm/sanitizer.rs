//! The tag-based sanitizer's runtime entry: `__hwasan_tag_mismatch`, called by the compiler's
//! outlined checks (`__hwasan_check_x<R>_<info>`) when a pointer's tag differs from its memory's.
//!
//! Build variant `full` compiles every function with `-Zsanitizer=kernel-hwaddress` in the
//! outline scheme (see xtask's build variants): each load/store first calls a check thunk that
//! compares the pointer's top byte with the shadow byte of its granule. Untagged kernel pointers
//! carry 0xFF, the match-all tag, and the shadow of everything but future heap objects holds 0xFF.
//! Tagged allocation and KASAN-style reports arrive with the sanitizer heap; this runtime counts
//! mismatches, lets tests provoke them, and otherwise reports one and stops the kernel.

use crate::arch::mmu;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

// The thunk's calling convention (LLVM's HWASan outlined checks, same as Linux's
// kasan_sw_tags.S): x0 = address, x1 = access info; the thunk has already reserved 256 bytes of
// stack and stored x0/x1 at [sp] and x29/x30 at [sp, #232]. Everything but x16/x17 must survive,
// so x2-x15 (caller-saved under AAPCS) are saved here before calling Rust.
core::arch::global_asm!(
    r#"
    .section .text.sanitizer, "ax"
    .global __hwasan_tag_mismatch
__hwasan_tag_mismatch:
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

/// One tag mismatch, as the check reported it.
#[derive(Clone, Copy, Debug, defmt::Format)]
pub struct Mismatch {
    pub address: u64,
    pub size: u64,
    pub write: bool,
    pub pointer_tag: u8,
    pub memory_tag: u8,
    /// Where the instrumented code resumes after the check.
    pub return_address: u64,
}

static MISMATCHES: AtomicU64 = AtomicU64::new(0);
static EXPECTING: AtomicBool = AtomicBool::new(false);
static LAST: spin::Mutex<Option<Mismatch>> = spin::Mutex::new(None);

/// Whether this kernel was built with the sanitizer's checks (build variant `full`).
pub const CHECKS_COMPILED_IN: bool = matches!(crate::BUILD_VARIANT.as_bytes(), b"full");

/// Runs `f` with tag mismatches recorded and resumed from instead of fatal. Returns how many
/// mismatches `f` caused and the last one.
pub fn expect_mismatches(f: impl FnOnce()) -> (u64, Option<Mismatch>) {
    let before = MISMATCHES.load(Ordering::SeqCst);
    *LAST.lock() = None;
    EXPECTING.store(true, Ordering::SeqCst);
    f();
    EXPECTING.store(false, Ordering::SeqCst);
    (MISMATCHES.load(Ordering::SeqCst) - before, LAST.lock().take())
}

/// The tag the shadow holds for the granule of `address`.
#[sanitize(kernel_hwaddress = "off")]
fn memory_tag(address: u64) -> u8 {
    let tag: u8;
    // SAFETY: every address instrumented code can touch has a mapped shadow byte (mm::init).
    // An asm load: a generic core function (read_volatile) would be instrumented itself and
    // check the shadow's own (unmapped) shadow.
    unsafe {
        core::arch::asm!("ldrb {t:w}, [{a}]", a = in(reg) mmu::shadow_of(address), t = out(reg) tag, options(nostack, readonly, preserves_flags))
    };
    tag
}

/// Checks an access of `size` bytes whose size is not a power of two up to 16 (the compiler
/// calls these with AAPCS for such accesses, e.g. block copies of arrays).
#[sanitize(kernel_hwaddress = "off")]
#[unsafe(link_section = ".text.sanitizer")]
fn check_range(address: u64, size: u64, write: bool, return_address: u64) {
    let pointer_tag = (address >> 56) as u8;
    if pointer_tag == MATCH_ALL_TAG || size == 0 {
        return;
    }
    let untagged = address | (0xff << 56);
    let mut granule = untagged & !15;
    while granule < untagged + size {
        if memory_tag(granule) != pointer_tag {
            let bad = (address & (0xff << 56)) | (granule.max(untagged) & !(0xff << 56));
            record(Mismatch {
                address: bad,
                size,
                write,
                pointer_tag,
                memory_tag: memory_tag(granule),
                return_address,
            });
            return;
        }
        granule += 16;
    }
}

/// The tag of an untagged kernel pointer, which matches any memory tag.
const MATCH_ALL_TAG: u8 = 0xff;

#[unsafe(no_mangle)]
#[sanitize(kernel_hwaddress = "off")]
#[unsafe(link_section = ".text.sanitizer")]
extern "C" fn __hwasan_loadN(address: u64, size: u64) {
    check_range(address, size, false, return_address());
}

#[unsafe(no_mangle)]
#[sanitize(kernel_hwaddress = "off")]
#[unsafe(link_section = ".text.sanitizer")]
extern "C" fn __hwasan_storeN(address: u64, size: u64) {
    check_range(address, size, true, return_address());
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
    let memory_tag = memory_tag(address);
    record(Mismatch {
        address,
        size: 1 << (info & 0xf),
        write: info & 0x10 != 0,
        pointer_tag: (address >> 56) as u8,
        memory_tag,
        return_address: crate::arch::cpu::strip_pac(return_address),
    });
}

/// Counts a mismatch; returns to the access when a test expects it, else reports and stops.
#[sanitize(kernel_hwaddress = "off")]
#[unsafe(link_section = ".text.sanitizer")]
fn record(mismatch: Mismatch) {
    MISMATCHES.fetch_add(1, Ordering::SeqCst);
    if EXPECTING.load(Ordering::SeqCst) {
        *LAST.lock() = Some(mismatch);
        return;
    }
    defmt::error!(
        "sanitizer: tag mismatch: {=str} of {=u64} bytes at {=u64:#x} (pointer tag {=u8:#x}, memory tag {=u8:#x}) from {=u64:#x}",
        if mismatch.write { "write" } else { "read" },
        mismatch.size,
        mismatch.address,
        mismatch.pointer_tag,
        mismatch.memory_tag,
        mismatch.return_address
    );
    crate::exit(crate::ExitStatus::Panic);
}
