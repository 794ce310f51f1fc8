//! Memory tags for the sanitizer heap: which values a tag may take, and the per-CPU generator
//! that hands them to new objects.
//!
//! A tag is the top byte of a pointer and the shadow byte of each 16-byte granule it may touch.
//! Three kinds of value are reserved:
//! - 0xFF is kernel-hwaddress's match-all tag: the tag of every untagged kernel pointer
//!   (TTBR1 addresses with TBI1 have top byte 0xFF), so it is never given to an object.
//! - 0xFE marks memory no object owns: freed objects, the heap's free blocks, the header
//!   granule before each object and the slack after it.
//! - 0x00-0x0F: the compiler's inline checks treat a shadow byte below 16 as a short granule
//!   (PLATFORM.md), even with short granules off; the outline checks here would not, but
//!   keeping out of that range keeps both schemes sound.
//!
//! That leaves 0x10..=0xFD: 238 object tags. The generator is a 32-bit LCG per CPU (one CPU
//! runs today), seeded from the `tag-seed=` boot parameter, so a run's tags are reproducible.

use core::sync::atomic::{AtomicU32, Ordering};

/// The tag of untagged pointers; matches every memory tag.
pub const MATCH_ALL: u8 = 0xff;
/// The memory tag of granules that belong to no live object.
pub const INVALID: u8 = 0xfe;
/// The smallest and largest tags handed to objects.
pub const FIRST_OBJECT_TAG: u8 = 0x10;
pub const LAST_OBJECT_TAG: u8 = 0xfd;
const OBJECT_TAGS: u32 = (LAST_OBJECT_TAG - FIRST_OBJECT_TAG) as u32 + 1;

/// The default seed when the command line gives none.
pub const DEFAULT_SEED: u32 = 0x7472_6163;

/// One generator per CPU.
static STATE: [AtomicU32; 1] = [AtomicU32::new(DEFAULT_SEED)];

/// Seeds every CPU's generator (each CPU gets a different stream from the same seed).
pub fn seed(seed: u32) {
    for (cpu, state) in STATE.iter().enumerate() {
        state.store(seed ^ (cpu as u32).wrapping_mul(0x9e37_79b9), Ordering::Relaxed);
    }
}

/// The next object tag of this CPU. Callers run with interrupts masked (the heap does), so the
/// load and store cannot interleave with another user of the same CPU's state.
#[sanitize(kernel_hwaddress = "off")]
pub fn next() -> u8 {
    let state = &STATE[0];
    let next = state.load(Ordering::Relaxed).wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
    state.store(next, Ordering::Relaxed);
    // The high bits of an LCG are the random ones.
    FIRST_OBJECT_TAG + ((next >> 24) % OBJECT_TAGS) as u8
}

/// Whether `tag` can be an object's tag.
pub const fn is_object_tag(tag: u8) -> bool {
    tag >= FIRST_OBJECT_TAG && tag <= LAST_OBJECT_TAG
}

/// `address` with its top byte replaced by `tag`.
pub const fn with_tag(address: u64, tag: u8) -> u64 {
    (address & !(0xff << 56)) | ((tag as u64) << 56)
}

/// The tag in the top byte of `address`.
pub const fn tag_of(address: u64) -> u8 {
    (address >> 56) as u8
}

/// `address` as an untagged kernel pointer (top byte 0xFF).
pub const fn untagged(address: u64) -> u64 {
    with_tag(address, MATCH_ALL)
}

/// Writes `tag` to the shadow of every granule of `[address, address + size)` (size a multiple
/// of 16). Uses asm stores: the shadow has no shadow of its own.
#[sanitize(kernel_hwaddress = "off")]
pub fn set_memory_tag(address: u64, size: u64, tag: u8) {
    let first = crate::arch::mmu::shadow_of(untagged(address));
    let word = u64::from_ne_bytes([tag; 8]);
    let mut offset = 0;
    let count = size / 16;
    while offset + 8 <= count {
        // SAFETY: heap addresses are RAM, whose shadow is mapped read-write (mm::init).
        unsafe {
            core::arch::asm!("str {v}, [{a}]", a = in(reg) first + offset, v = in(reg) word, options(nostack, preserves_flags))
        };
        offset += 8;
    }
    while offset < count {
        // SAFETY: as above.
        unsafe {
            core::arch::asm!("strb {v:w}, [{a}]", a = in(reg) first + offset, v = in(reg) tag as u32, options(nostack, preserves_flags))
        };
        offset += 1;
    }
}
