//! Where a probe may not go: outside kernel text, the no-probe ranges (Linux's NOKPROBE),
//! ftrace's patchable entries, and LDXR/STXR sequences (ARM ARM B2.9: a trap clears the
//! exclusive monitor, so a probe inside the sequence would make it fail forever). The rules are
//! `crates/probes`' (`KernelLayout`, `inside_exclusive_sequence`), shared with xtask's checks of
//! a built image; this module gives them the running kernel's layout and text.

use super::ProbeError;
use probes::{AddressRefusal, KernelLayout};

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

/// The kernel's own layout, for `crates/probes`' address rules.
fn layout() -> KernelLayout<'static> {
    let (start, end) = text();
    let (user_start, user_length) = crate::task::user::user_text();
    // SAFETY: linker symbols; only their addresses are taken.
    let noprobe = unsafe { symbol(&__noprobe_start)..symbol(&__noprobe_end) };
    KernelLayout {
        text: start..end,
        user_text: user_start..user_start + user_length,
        noprobe,
        patchable_entries: patchable_entries(),
    }
}

/// Checks everything that depends on the address only.
pub fn check_address(address: u64) -> Result<(), ProbeError> {
    layout().check(address).map_err(|refusal| match refusal {
        AddressRefusal::NotText => ProbeError::NotText(probes::Text::Kernel),
        AddressRefusal::UserText => ProbeError::UserText,
        AddressRefusal::NoProbe => ProbeError::NoProbe(
            "no-probe text: boot code, exception vectors and handlers, the probe hit path and slots, logging or the sanitizer runtime",
        ),
        AddressRefusal::FtraceCallsite => ProbeError::FtraceCallsite,
    })
}

/// Whether `address` is in the no-probe text (kernel.ld's `__noprobe_start..__noprobe_end`).
pub fn is_noprobe(address: u64) -> bool {
    // SAFETY: linker symbols; only their addresses are taken.
    let (start, end) = unsafe { (symbol(&__noprobe_start), symbol(&__noprobe_end)) };
    (start..end).contains(&address)
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

/// Refuses an address preceded (within `probes::EXCLUSIVE_WINDOW` instructions) by a
/// load-exclusive with no store-exclusive after it. `original` reads the instruction at an
/// address as the code has it (a probe's original where one is armed).
pub fn check_exclusive_window(address: u64, original: impl Fn(u64) -> u32) -> Result<(), ProbeError> {
    let (start, _) = text();
    // The search reads only from `start` up to below `address` (checked to be text).
    if probes::inside_exclusive_sequence(address, start, |at| Some(original(at))) {
        return Err(ProbeError::InsideExclusiveSequence);
    }
    Ok(())
}
