//! Where a kernel probe may go: the address rules the kernel and xtask both apply.
//!
//! The kernel applies them when a probe registers (`kernel/src/probes/refuse.rs`, reading its
//! own linker symbols and text); xtask applies them to a built image before it boots
//! (`xtask/src/probe_spec.rs`, reading the ELF). Both read the same layout, so the rules live
//! here once: a word that one accepts the other accepts.

use core::ops::Range;

/// Bytes below the interrupted SP that the kernel's exception entry leaves untouched (its
/// vectors): a probe may emulate stores there, and the return path stashes x0/x1 there.
pub const KERNEL_STACK_GAP: usize = 256;

/// How far below SP a simulated SP-based access may reach in kernel text ([`Rules::stack_reach`]
/// for [`Text::Kernel`]): the gap less the 16 bytes the return path stashes there.
///
/// [`Rules::stack_reach`]: crate::Rules::stack_reach
/// [`Text::Kernel`]: crate::Text::Kernel
pub const KERNEL_STACK_REACH: i64 = KERNEL_STACK_GAP as i64 - 16;

/// How many instructions before the probed one are searched for a load-exclusive: Linux's
/// `arm_kprobe_decode_insn` scans back to the function start; without symbols we scan a fixed
/// window, longer than any LDXR..STXR loop the compiler emits for `core` atomics.
pub const EXCLUSIVE_WINDOW: u64 = 16;

/// The kernel image's regions the rules read, as addresses.
#[derive(Clone, Debug)]
pub struct KernelLayout<'a> {
    /// Kernel text (`__kernel_start..__text_end`).
    pub text: Range<u64>,
    /// EL0 code inside it (`.text.user`): uprobes' business.
    pub user_text: Range<u64>,
    /// No-probe text (`__noprobe_start..__noprobe_end`).
    pub noprobe: Range<u64>,
    /// `__patchable_function_entries`: the first NOP of every instrumented function's entry.
    pub patchable_entries: &'a [u64],
}

/// Why an address takes no probe, whatever the method.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum AddressRefusal {
    /// Outside kernel text.
    NotText,
    /// EL0 code (`.text.user`).
    UserText,
    /// No-probe text: boot code, exception vectors and handlers, the probe hit path and slots,
    /// logging or the sanitizer runtime (Linux's NOKPROBE).
    NoProbe,
    /// One of the words of a patchable function entry: ftrace owns them.
    FtraceCallsite,
}

impl KernelLayout<'_> {
    /// Checks everything that depends on the address only, in the kernel's order.
    pub fn check(&self, address: u64) -> Result<(), AddressRefusal> {
        if !self.text.contains(&address) {
            return Err(AddressRefusal::NotText);
        }
        if self.user_text.contains(&address) {
            return Err(AddressRefusal::UserText);
        }
        if self.noprobe.contains(&address) {
            return Err(AddressRefusal::NoProbe);
        }
        if self.is_ftrace_callsite(address) {
            return Err(AddressRefusal::FtraceCallsite);
        }
        Ok(())
    }

    /// Whether `address` is one of the 4 words of a patchable function entry
    /// (`-Zpatchable-function-entry=4,2`: two words before the symbol, two after; each table
    /// entry is the first). ftrace owns them (`mov x9, x30` / `bl ftrace_caller`), so probes
    /// refuse them rather than fight over the word; a probe at the function's first real
    /// instruction is the way in.
    pub fn is_ftrace_callsite(&self, address: u64) -> bool {
        self.patchable_entries.iter().any(|&entry| (entry..entry + 16).contains(&address))
    }
}

/// Whether `address` is inside an LDXR..STXR sequence: a load-exclusive precedes it within
/// [`EXCLUSIVE_WINDOW`] instructions (not before `text_start`) with no store-exclusive between
/// (ARM ARM B2.9: a trap clears the exclusive monitor, so a probe there would make the sequence
/// fail forever). `word` reads the instruction at an address; `None` ends the search.
pub fn inside_exclusive_sequence(address: u64, text_start: u64, mut word: impl FnMut(u64) -> Option<u32>) -> bool {
    for back in 1..=EXCLUSIVE_WINDOW {
        let Some(at) = address.checked_sub(4 * back).filter(|&at| at >= text_start) else {
            break;
        };
        match word(at).and_then(exclusive_kind) {
            Some(Exclusive::Store) => break,
            Some(Exclusive::Load) => return true,
            None => {}
        }
    }
    false
}

/// The two halves of an exclusive sequence.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Exclusive {
    Load,
    Store,
}

/// Load/store exclusive (C4.1.94, "Load/store exclusive register/pair": bits [29:24] = 001000,
/// o2 = 0), excluding CASP (bit 31 = 0 with o1 = 1).
pub fn exclusive_kind(word: u32) -> Option<Exclusive> {
    let exclusive_group = word & 0x3f80_0000 == 0x0800_0000;
    let casp = word >> 31 == 0 && word & (1 << 21) != 0;
    if !exclusive_group || casp {
        return None;
    }
    Some(if word & (1 << 22) != 0 { Exclusive::Load } else { Exclusive::Store })
}

#[cfg(test)]
mod tests {
    use super::*;

    const LDXR: u32 = 0xc85f_7c20; // ldxr x0, [x1]
    const LDAXR: u32 = 0xc85f_fc20; // ldaxr x0, [x1]
    const STXR: u32 = 0xc802_7c20; // stxr w2, x0, [x1]
    const STP_PUSH: u32 = 0xa9bf_7bfd; // stp x29, x30, [sp, #-16]!
    const CASP: u32 = 0x4820_7c82; // casp x0, x1, x2, x3, [x4]
    const NOP: u32 = 0xd503_201f;

    #[test]
    fn exclusives_are_told_apart() {
        assert_eq!(exclusive_kind(LDXR), Some(Exclusive::Load));
        assert_eq!(exclusive_kind(LDAXR), Some(Exclusive::Load));
        assert_eq!(exclusive_kind(STXR), Some(Exclusive::Store));
        assert_eq!(exclusive_kind(STP_PUSH), None);
        assert_eq!(exclusive_kind(CASP), None);
        assert_eq!(exclusive_kind(NOP), None);
    }

    /// `text` as words from address `base`.
    fn reader(base: u64, text: &[u32]) -> impl FnMut(u64) -> Option<u32> + '_ {
        move |at| text.get(usize::try_from(at.checked_sub(base)? / 4).ok()?).copied()
    }

    #[test]
    fn the_window_covers_the_words_after_a_load_exclusive() {
        let base = 0x1000;
        // ldxr; 16 nops; stxr; nop
        let mut text = vec![LDXR];
        text.extend([NOP; 16]);
        text.extend([STXR, NOP]);
        let inside = |index: u64| inside_exclusive_sequence(base + 4 * index, base, reader(base, &text));
        assert!(!inside(0), "the load-exclusive itself is the plan's business");
        for index in 1..=EXCLUSIVE_WINDOW {
            assert!(inside(index), "word {index} follows the ldxr within the window");
        }
        assert!(!inside(EXCLUSIVE_WINDOW + 1), "the window ends {EXCLUSIVE_WINDOW} words after the ldxr");
        assert!(!inside(18), "past the stxr the sequence is closed");
    }

    #[test]
    fn a_store_exclusive_closes_the_sequence() {
        let base = 0x2000;
        let text = [LDXR, NOP, STXR, NOP, NOP];
        let inside = |index: u64| inside_exclusive_sequence(base + 4 * index, base, reader(base, &text));
        assert!(inside(1));
        assert!(inside(2), "the store-exclusive is inside its own sequence");
        assert!(!inside(3));
        assert!(!inside(4));
    }

    #[test]
    fn the_search_stops_at_the_text_start_and_at_unreadable_words() {
        let base = 0x3000;
        let text = [LDXR, NOP, NOP];
        assert!(!inside_exclusive_sequence(base + 8, base + 4, reader(base, &text)), "the ldxr is before the text");
        assert!(!inside_exclusive_sequence(base + 8, base, |_| None));
        assert!(!inside_exclusive_sequence(0, 0, reader(base, &text)), "no address below 0");
    }

    #[test]
    fn address_rules_apply_in_order() {
        let patchable = [0x1100, 0x1200];
        let layout = KernelLayout {
            text: 0x1000..0x9000,
            user_text: 0x8000..0x8800,
            noprobe: 0x1000..0x1080,
            patchable_entries: &patchable,
        };
        assert_eq!(layout.check(0xfff), Err(AddressRefusal::NotText));
        assert_eq!(layout.check(0x9000), Err(AddressRefusal::NotText));
        assert_eq!(layout.check(0x8000), Err(AddressRefusal::UserText));
        assert_eq!(layout.check(0x1000), Err(AddressRefusal::NoProbe));
        for word in 0..4 {
            assert_eq!(layout.check(0x1200 + 4 * word), Err(AddressRefusal::FtraceCallsite));
        }
        assert_eq!(layout.check(0x1110), Ok(()), "the first word after the entry");
        assert_eq!(layout.check(0x10fc), Ok(()));
        assert_eq!(layout.check(0x8800), Ok(()));
    }

    #[test]
    fn the_kernel_stack_reach_leaves_the_stash() {
        assert_eq!(KERNEL_STACK_REACH, 240);
    }
}
