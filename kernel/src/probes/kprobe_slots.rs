//! The probe slot area: out-of-line slots and detour trampolines, generated at registration.
//!
//! A 128 KiB area of kernel text (`.text.probe_slots`, inside the no-probe range of kernel.ld)
//! filled with `BRK #0x006`, cut into 256 chunks of 512 bytes, one per probe that needs code:
//! enough for two batches of the probe sweep (120 probes each) while one replaces the other
//! (`kprobe::replace_all`: the retiring batch's chunks are freed only after its grace period).
//! It is written through the text alias (`arch::patch`), never executed writable. The trampolines
//! are built by `crates/probes` (`relocate.rs`, with its named encoders and host tests).

use core::sync::atomic::{AtomicU64, Ordering};

use probes::{Classification, LITERAL_POOL, RelocateError, TRAMPOLINE_WORDS, detour_trampoline, encode_brk};

use super::ProbeError;
use crate::arch::exception::BRK_KPROBE_STEP;
use crate::arch::patch;

/// Bytes per chunk, and chunks in the area.
pub const CHUNK_SIZE: u64 = 512;
pub const CHUNKS: usize = 256;
const CHUNK_WORDS: usize = (CHUNK_SIZE / 4) as usize;
/// Bytes in the slot area (every XOL slot and detour trampoline).
pub const AREA_SIZE: u64 = CHUNK_SIZE * CHUNKS as u64;

core::arch::global_asm!(
    r#"
    .section .text.probe_slots, "ax"
    .balign 4096
    .global probe_slot_area
probe_slot_area:
    .fill {words}, 4, {filler}
"#,
    words = const CHUNKS * CHUNK_WORDS,
    filler = const encode_brk(BRK_KPROBE_STEP).0,
);

unsafe extern "C" {
    static probe_slot_area: u32;
    /// Where every detour trampoline calls: the hit path's entry stub (`kprobe_hit.rs`), named
    /// here by its link name so that the trampolines' builder does not depend on the hit path.
    static probe_detour_entry: u32;
    /// Where a trampoline calls when the pre-handler changed pc or sp (`kprobe_hit.rs`).
    static probe_detour_refuse: u32;
}

/// The detour entry stub's address (what trampolines call).
#[inline(always)]
pub fn detour_entry_address() -> u64 {
    // SAFETY: only the address of the asm-defined label is taken.
    unsafe { &probe_detour_entry as *const u32 as u64 }
}

/// The stub a trampoline calls to refuse a pre-handler's change of pc or sp.
fn detour_refuse_address() -> u64 {
    // SAFETY: only the address of the asm-defined label is taken.
    unsafe { &probe_detour_refuse as *const u32 as u64 }
}

pub fn chunk_address(chunk: usize) -> u64 {
    // SAFETY: only the address of the asm-defined area is taken.
    let base = unsafe { &probe_slot_area as *const u32 as u64 };
    base + chunk as u64 * CHUNK_SIZE
}

/// Writes `words` at `at` through the text alias.
fn write(at: u64, words: &[u32]) {
    // SAFETY: `at` is a chunk of the slot area (kernel text) that no CPU executes while its
    // probe is being registered or unregistered.
    unsafe { patch::write_instructions(at, words) };
}

/// The probed address of each chunk's XOL slot, 0 for a chunk without one (free, or a detour
/// trampoline): where a walker looks up the rows of an address in the slot, which runs the
/// probed instruction in the probed function's frame. Written after the slot, cleared with it.
static SLOT_OWNERS: [AtomicU64; CHUNKS] = [const { AtomicU64::new(0) }; CHUNKS];

/// The chunk holding `pc`, if it is in the slot area.
#[sanitize(kernel_hwaddress = "off")]
fn chunk_of(pc: u64) -> Option<usize> {
    let offset = pc.wrapping_sub(chunk_address(0));
    (offset < AREA_SIZE).then_some((offset / CHUNK_SIZE) as usize)
}

/// An XOL slot for the instruction at `probed` (`instruction`), at the start of its chunk: the
/// instruction, then `BRK #0x006` (the way back for brk-step; a safety net for single-step,
/// whose step exception comes first).
pub fn write_out_of_line(slot: u64, instruction: u32, probed: u64) {
    let chunk = chunk_of(slot).filter(|&chunk| chunk_address(chunk) == slot);
    let chunk = chunk.expect("an XOL slot starts a chunk of the slot area");
    write(slot, &[instruction, encode_brk(BRK_KPROBE_STEP).0]);
    SLOT_OWNERS[chunk].store(probed, Ordering::Release);
}

/// Where `pc`, in an XOL slot, stands in the probed function: the probed instruction (the slot's
/// first word: not run yet) or the one after it (the slot's `BRK`, or the step exception's PC:
/// the instruction has run, and an XOL slot never holds a branch). `None` elsewhere, in a
/// detour trampoline or a free chunk. Read by walkers, without the registry's lock: a chunk
/// being reused may answer for its previous probe, whose slot no CPU is running any more.
#[sanitize(kernel_hwaddress = "off")]
pub fn probed_address(pc: u64) -> Option<u64> {
    let chunk = chunk_of(pc)?;
    let offset = pc - chunk_address(chunk);
    let owner = SLOT_OWNERS[chunk].load(Ordering::Acquire);
    (owner != 0 && offset <= 4).then_some(owner + offset)
}

/// Refills a chunk with `BRK #0x006` when its probe is unregistered.
pub fn clear(chunk: u64) {
    if let Some(index) = chunk_of(chunk) {
        SLOT_OWNERS[index].store(0, Ordering::Release);
    }
    let filler = [encode_brk(BRK_KPROBE_STEP).0; CHUNK_WORDS];
    // Only the words that differ, to keep the cache maintenance short.
    for (index, &word) in filler.iter().enumerate() {
        let at = chunk + 4 * index as u64;
        // SAFETY: `at` is slot-area text, readable.
        if unsafe { core::ptr::read_volatile(at as *const u32) } != word {
            write(at, &[word]);
        }
    }
}

const _: () = assert!(CHUNK_WORDS == TRAMPOLINE_WORDS, "one trampoline per chunk");

/// Generates the detour trampoline for the probe at `address` (record `probe`) in the chunk at
/// `base` (`probes::detour_trampoline`: save, call `detour_hit(probe, &mut registers)` through
/// `probe_detour_entry`, and `detour_refused` through `probe_detour_refuse` if the pre-handler
/// changed pc or sp, restore, the relocated instruction, branch back).
pub fn write_detour(
    base: u64,
    address: u64,
    original: u32,
    classification: &Classification,
    probe: u64,
) -> Result<(), ProbeError> {
    let (entry, refuse) = (detour_entry_address(), detour_refuse_address());
    let filler = encode_brk(BRK_KPROBE_STEP).0;
    let trampoline =
        detour_trampoline(base, filler, address, original, classification, probe, entry, refuse).map_err(|error| {
            match error {
                RelocateError::Rejected(reason) => ProbeError::Rejected(reason),
                RelocateError::BlrX30 => ProbeError::DetourBlrX30,
                RelocateError::OutOfBranchRange => ProbeError::OutOfBranchRange,
                RelocateError::TooLong => ProbeError::NoSpace,
                RelocateError::LiteralOutOfRange => ProbeError::DetourLiteralOutOfRange,
            }
        })?;
    write(base, trampoline.code());
    write(base + 4 * LITERAL_POOL as u64, trampoline.literals());
    Ok(())
}
