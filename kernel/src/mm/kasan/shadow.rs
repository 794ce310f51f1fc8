//! Software tag storage: one shadow byte per 16-byte granule at `mmu::shadow_of(address)`, and
//! a per-CPU generator that draws object tags.
//!
//! A tag is the top byte of a pointer and the shadow byte of each granule it may touch. Three
//! kinds of value are reserved:
//! - 0xFF is kernel-hwaddress's match-all tag: the tag of every untagged kernel pointer
//!   (TTBR1 addresses with TBI1 have top byte 0xFF), so it is never given to an object.
//! - 0xFE marks memory no object owns: freed objects, the heap's free blocks, the header
//!   granule before each object and the slack after it.
//! - 0x00-0x0F: the compiler's inline checks treat a shadow byte below 16 as a short granule
//!   (PLATFORM.md), even with short granules off; the outline checks here would not, but
//!   keeping out of that range keeps both schemes sound.
//!
//! That leaves 0x10..=0xFD: 238 object tags. With short granules (`--kasan-short-granules`,
//! HWASan's scheme; Linux's SW_TAGS has none) 0x01..=0x0F are in use too, as lengths: the
//! memory tag of an object's partly used last granule is the number of bytes it uses, and the
//! granule's last byte (never part of the object) holds the object's tag.
//!
//! The generator is a 32-bit LCG per CPU, seeded from the `tag-seed=` boot parameter, so a run's
//! tags are reproducible: CPU `n` starts from `tag-seed ^ n * 0x9E37_79B9` ([`seed_of`]; CPU 0
//! from the seed itself), and each CPU steps only its own state, so the tags a CPU draws depend
//! on the seed and on what that CPU allocated, never on what the other CPUs do at the same time.

use super::storage::{self, TagStorage, untagged};
use crate::arch::percpu::CPUS;
use crate::arch::uninstrumented;
use crate::inject::{self, Fault};
use core::sync::atomic::{AtomicPtr, AtomicU32, Ordering};

/// The default seed when the command line gives none.
pub const DEFAULT_SEED: u32 = 0x7472_6163;

/// Whether this kernel was built with short granules (xtask's `--kasan-short-granules`, which
/// also switches the compiler's check thunks to `__hwasan_check_*_short_v2`).
pub const SHORT_GRANULES: bool = match option_env!("TRACELAB_KASAN_SHORT_GRANULES") {
    Some(value) => matches!(value.as_bytes(), b"1"),
    None => false,
};

/// One generator per CPU, indexed by the CPU's index. Atomics only so that a static can hold
/// them: each is read and written by its own CPU alone, with interrupts masked.
static STATE: [AtomicU32; CPUS] = {
    let mut states = [const { AtomicU32::new(0) }; CPUS];
    let mut cpu = 0;
    while cpu < CPUS {
        states[cpu] = AtomicU32::new(seed_of(DEFAULT_SEED, cpu));
        cpu += 1;
    }
    states
};

/// Per CPU, the generator state it draws from: its own (`STATE[cpu]`), or CPU 0's for every CPU
/// while [`Fault::TagStateShared`] is on. Chosen when the generators are seeded or restored (a
/// cold path), so that a draw follows one pointer and asks no fault switch.
static DRAWS_FROM: [AtomicPtr<AtomicU32>; CPUS] = {
    let mut pointers = [const { AtomicPtr::new(core::ptr::null_mut()) }; CPUS];
    let mut cpu = 0;
    while cpu < CPUS {
        pointers[cpu] = AtomicPtr::new(core::ptr::from_ref(&STATE[cpu]).cast_mut());
        cpu += 1;
    }
    pointers
};

/// Points every CPU at the state it draws from (see [`DRAWS_FROM`]). Called with no CPU drawing
/// (boot, tests).
fn choose_states() {
    let shared = inject::on(Fault::TagStateShared);
    for (cpu, pointer) in DRAWS_FROM.iter().enumerate() {
        let state = if shared { &STATE[0] } else { &STATE[cpu] };
        pointer.store(core::ptr::from_ref(state).cast_mut(), Ordering::Relaxed);
    }
}

/// The first state of CPU `cpu`'s generator for `seed`: the seed mixed with the CPU number by
/// the golden-ratio constant, so the CPUs' sequences differ; CPU 0's is the seed itself.
pub const fn seed_of(seed: u32, cpu: usize) -> u32 {
    seed ^ (cpu as u32).wrapping_mul(0x9e37_79b9)
}

/// The generator's step: the state after `state`. Always inlined, as the body of `next` it was.
#[inline(always)]
pub const fn next_state(state: u32) -> u32 {
    state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223)
}

/// The object tag drawn when the generator steps to `state`: the state scaled onto the object
/// tags by a multiply and a shift (`state * 238 / 2^32`), which reads the high bits, an LCG's
/// random ones. The generator has full period (every 32-bit state comes once per 2^32 draws), so
/// each tag is drawn from 18,046,081 or 18,046,082 of the 2^32 states: uniform to 1 part in 18
/// million. (A remainder of the top byte, `% 238`, gave 18 tags two of the 256 byte values each:
/// drawn twice as often as the other 220.) Always inlined, as the body of `next` it was.
#[inline(always)]
pub const fn tag_of_state(state: u32) -> u8 {
    ShadowTags::FIRST_OBJECT_TAG + ((state as u64 * OBJECT_TAGS as u64) >> 32) as u8
}

/// Every CPU's generator state (tests that reseed put them back afterwards with [`restore`]).
pub fn states() -> [u32; CPUS] {
    core::array::from_fn(|cpu| STATE[cpu].load(Ordering::Relaxed))
}

/// Puts back generator states taken by [`states`], and points each CPU at its own state again
/// (or at CPU 0's while [`Fault::TagStateShared`] is on).
pub fn restore(states: [u32; CPUS]) {
    for (state, value) in STATE.iter().zip(states) {
        state.store(value, Ordering::Relaxed);
    }
    choose_states();
}

/// The shadow-memory implementation of [`TagStorage`].
pub struct ShadowTags;

impl TagStorage for ShadowTags {
    const GRANULE: u64 = storage::GRANULE;
    const MATCH_ALL: u8 = storage::MATCH_ALL;
    const INVALID: u8 = 0xfe;
    const FIRST_OBJECT_TAG: u8 = 0x10;
    const LAST_OBJECT_TAG: u8 = 0xfd;
    const SHORT_GRANULES: bool = SHORT_GRANULES;

    // Always inlined wrappers around the uninstrumented shadow accesses below, so that a call
    // through the seam is the same code as the direct call it replaced.
    #[inline(always)]
    fn set_range_tag(address: u64, size: u64, tag: u8) {
        set_memory_tag(address, size, tag)
    }

    #[inline(always)]
    fn memory_tag(address: u64) -> u8 {
        memory_tag(address)
    }

    #[inline(always)]
    fn tag_object(address: u64, size: u64, tag: u8) {
        let used = size % Self::GRANULE;
        if !Self::SHORT_GRANULES || used == 0 {
            set_memory_tag(address, size.next_multiple_of(Self::GRANULE), tag);
            return;
        }
        let last = address + size - used;
        set_memory_tag(address, last - address, tag);
        set_memory_tag(last, Self::GRANULE, used as u8);
        store_byte(last + Self::GRANULE - 1, tag);
    }

    #[inline(always)]
    fn object_tag(address: u64) -> u8 {
        let tag = memory_tag(address);
        if Self::SHORT_GRANULES && is_short(tag) { load_byte(address | (Self::GRANULE - 1)) } else { tag }
    }

    #[inline(always)]
    fn short_granule_accepts(granule: u64, memory_tag: u8, pointer_tag: u8, end: u64) -> bool {
        Self::SHORT_GRANULES
            && is_short(memory_tag)
            && end.wrapping_sub(granule) <= memory_tag as u64
            && load_byte(granule | (Self::GRANULE - 1)) == pointer_tag
    }

    #[inline(always)]
    fn random_tag() -> u8 {
        next()
    }

    /// The same draw: with 238 tags a successor repeats its predecessor's tag 1 time in 238,
    /// and excluding it would cost the allocation a compare and a second draw.
    #[inline(always)]
    fn random_tag_replacing(_previous: u8) -> u8 {
        next()
    }

    /// Also chooses the state each CPU draws from: [`Fault::TagStateShared`] takes effect at
    /// the next seeding.
    fn seed(seed: u32) {
        for (cpu, state) in STATE.iter().enumerate() {
            state.store(seed_of(seed, cpu), Ordering::Relaxed);
        }
        choose_states();
    }
}

/// How many tags the generator draws from (0x10..=0xFD).
pub const OBJECT_TAGS: u32 = (ShadowTags::LAST_OBJECT_TAG - ShadowTags::FIRST_OBJECT_TAG) as u32 + 1;

/// The next object tag of this CPU. Callers run with interrupts masked (the heap does), so the
/// load and store cannot interleave with another user of the same CPU's state; no other CPU
/// touches it ([`Fault::TagStateShared`] gives every CPU CPU 0's state, the race the per-CPU
/// state removes; a test shows that its check sees it).
///
/// On the allocation path, where every call is costly in the `full` image: this function is
/// uninstrumented and makes none: its loads and store are `arch::uninstrumented`'s single
/// instructions, where core's atomic methods would each be a call to an instrumented function.
#[sanitize(kernel_hwaddress = "off")]
fn next() -> u8 {
    // A CPU's index is below CPUS (percpu::init_this_cpu is given one of the CPUS slots); the
    // remainder (CPUS is a power of two: an `and`) lets the compiler drop the bounds check.
    let state = uninstrumented::load_pointer(&DRAWS_FROM[uninstrumented::this_cpu_index() % CPUS]);
    // SAFETY: DRAWS_FROM's entries only ever point at entries of STATE, a static.
    let state = unsafe { &*state };
    let next = next_state(uninstrumented::load_u32(state));
    uninstrumented::store_u32(state, next);
    tag_of_state(next)
}

/// The tag the shadow holds for the granule of `address`. Always inlined (as is
/// `set_memory_tag`): the range checks and the heap, all uninstrumented, call it per granule or
/// per object, and whether LLVM would inline it on its own depends on codegen-unit partitioning.
/// Its only access is the asm load, which no sanitizer instruments, so the callers' sanitizer
/// setting does not matter.
#[inline(always)]
fn memory_tag(address: u64) -> u8 {
    let tag: u8;
    // SAFETY: every address instrumented code can touch has a mapped shadow byte (mm::init).
    // An asm load: a generic core function (read_volatile) would be instrumented itself and
    // check the shadow's own (unmapped) shadow.
    unsafe {
        core::arch::asm!("ldrb {t:w}, [{a}]", a = in(reg) crate::arch::mmu::shadow_of(address), t = out(reg) tag, options(nostack, readonly, preserves_flags))
    };
    tag
}

/// Writes `tag` to the shadow of every granule of `[address, address + size)` (size a multiple
/// of 16). Uses asm stores: the shadow has no shadow of its own. Always inlined, see
/// `memory_tag`.
#[inline(always)]
fn set_memory_tag(address: u64, size: u64, tag: u8) {
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

/// Whether a memory tag is a short granule's length.
#[inline(always)]
fn is_short(memory_tag: u8) -> bool {
    (1..ShadowTags::GRANULE as u8).contains(&memory_tag)
}

/// Reads a short granule's tag byte. An asm load: the sanitizer's own runtime reads it, and an
/// instrumented read would be checked against the very shadow byte being decoded.
#[inline(always)]
fn load_byte(address: u64) -> u8 {
    let byte: u8;
    // SAFETY: short granules exist only in the heap (mapped RAM); the read is untagged.
    unsafe {
        core::arch::asm!("ldrb {b:w}, [{a}]", a = in(reg) untagged(address), b = out(reg) byte, options(nostack, readonly, preserves_flags))
    };
    byte
}

/// Writes a short granule's tag byte (uninstrumented, see `load_byte`).
#[inline(always)]
fn store_byte(address: u64, byte: u8) {
    // SAFETY: the byte is the last of an object's last granule, which the heap owns and the
    // object never uses (its size ends before it).
    unsafe {
        core::arch::asm!("strb {b:w}, [{a}]", a = in(reg) untagged(address), b = in(reg) byte as u32, options(nostack, preserves_flags))
    };
}
