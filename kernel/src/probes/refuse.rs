//! Where a probe may not go: outside kernel text, the no-probe ranges (Linux's NOKPROBE),
//! ftrace's patchable entries, and LDXR/STXR sequences (ARM ARM B2.9: a trap clears the
//! exclusive monitor, so a probe inside the sequence would make it fail forever).

use super::ProbeError;

/// How many instructions before the probed one are searched for a load-exclusive: Linux's
/// `arm_kprobe_decode_insn` scans back to the function start; without symbols we scan a fixed
/// window, longer than any LDXR..STXR loop the compiler emits for `core` atomics.
pub const EXCLUSIVE_WINDOW: u64 = 16;

unsafe extern "C" {
    static __kernel_start: u8;
    static __text_end: u8;
    static __noprobe_start: u8;
    static __noprobe_end: u8;
    static __patchable_function_entries_start: u64;
    static __patchable_function_entries_end: u64;
}

fn symbol<T>(address: &T) -> u64 {
    address as *const T as u64
}

/// The kernel text range, `[start, end)`.
pub fn text() -> (u64, u64) {
    // SAFETY: linker symbols; only their addresses are taken.
    unsafe { (symbol(&__kernel_start), symbol(&__text_end)) }
}

/// Checks everything that depends on the address only.
pub fn check_address(address: u64) -> Result<(), ProbeError> {
    let (start, end) = text();
    if !(start..end).contains(&address) {
        return Err(ProbeError::NotText(probes::Text::Kernel));
    }
    let (user_start, user_length) = crate::task::user::user_text();
    if (user_start..user_start + user_length).contains(&address) {
        return Err(ProbeError::UserText);
    }
    if is_noprobe(address) {
        return Err(ProbeError::NoProbe(
            "no-probe text: boot code, exception vectors and handlers, the probe hit path and slots, logging or the sanitizer runtime",
        ));
    }
    if is_ftrace_callsite(address) {
        return Err(ProbeError::FtraceCallsite);
    }
    Ok(())
}

/// Whether `address` is in the no-probe text (kernel.ld's `__noprobe_start..__noprobe_end`).
pub fn is_noprobe(address: u64) -> bool {
    // SAFETY: linker symbols; only their addresses are taken.
    let (start, end) = unsafe { (symbol(&__noprobe_start), symbol(&__noprobe_end)) };
    (start..end).contains(&address)
}

/// Whether `address` is one of the 4 words of a patchable function entry (`-Zpatchable-function
/// -entry=4,2`: two words before the symbol, two after; each table entry is the first).
/// ftrace will own them (`mov x9, x30` / `bl ftrace_caller`), so probes refuse them rather than
/// fight over the word; a probe at the function's first real instruction is the way in.
fn is_ftrace_callsite(address: u64) -> bool {
    patchable_entries().iter().any(|&entry| (entry..entry + 16).contains(&address))
}

/// `__patchable_function_entries`: the first NOP of every instrumented function's entry.
pub fn patchable_entries() -> &'static [u64] {
    // SAFETY: the linker script brackets the (read-only) section with these symbols; its
    // entries are u64s.
    unsafe {
        let start = &__patchable_function_entries_start as *const u64;
        let end = &__patchable_function_entries_end as *const u64;
        core::slice::from_raw_parts(start, end.offset_from(start) as usize)
    }
}

/// Refuses an address preceded (within `EXCLUSIVE_WINDOW` instructions) by a load-exclusive
/// with no store-exclusive after it.
pub fn check_exclusive_window(address: u64) -> Result<(), ProbeError> {
    let (start, _) = text();
    for back in 1..=EXCLUSIVE_WINDOW {
        let Some(at) = address.checked_sub(4 * back).filter(|&at| at >= start) else {
            break;
        };
        // SAFETY: `at` is 4-aligned kernel text, mapped readable.
        let word = unsafe { core::ptr::read_volatile(at as *const u32) };
        match exclusive_kind(word) {
            Some(Exclusive::Store) => break,
            Some(Exclusive::Load) => return Err(ProbeError::InsideExclusiveSequence),
            None => {}
        }
    }
    Ok(())
}

enum Exclusive {
    Load,
    Store,
}

/// Load/store exclusive (C4.1.94, "Load/store exclusive register/pair": bits [29:24] = 001000,
/// o2 = 0), excluding CASP (bit 31 = 0 with o1 = 1).
fn exclusive_kind(word: u32) -> Option<Exclusive> {
    let exclusive_group = word & 0x3f80_0000 == 0x0800_0000;
    let casp = word >> 31 == 0 && word & (1 << 21) != 0;
    if !exclusive_group || casp {
        return None;
    }
    Some(if word & (1 << 22) != 0 { Exclusive::Load } else { Exclusive::Store })
}
