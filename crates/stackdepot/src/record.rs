//! A record's layout in pool memory: three header words, then the frames.
//!
//! Pools are `[AtomicU64]`, so every access (even through a stale handle) is
//! a same-size atomic one: no data race is possible, only a wrong answer.
//! Relaxed atomic loads and stores compile to plain `ldr`/`str` on arm64.
//!
//! | word | bits 0..32                       | bits 32..64            |
//! |------|----------------------------------|------------------------|
//! | 0    | next record in the bucket (raw handle) | hash             |
//! | 1    | reference count                  | number of frames       |
//! | 2    | link in the dying / pending / free lists (raw handle)     |
//! | 3..  | frames                           |                        |

use core::sync::atomic::{AtomicU64, Ordering};

use crate::MAX_FRAMES;
use crate::access::{load_acquire, load_relaxed};
use crate::handle::RECORD_ALIGN;

/// Words before the frames.
pub(crate) const HEADER_WORDS: usize = 3;
/// Reference count of a record that is never freed: permanent records, and
/// evictable ones whose count would overflow (as Linux saturates refcounts).
pub(crate) const SATURATED: u32 = u32::MAX;

/// Bytes of a record holding `frames` frames, rounded to [`RECORD_ALIGN`].
pub(crate) const fn record_bytes(frames: usize) -> usize {
    ((HEADER_WORDS + frames) * 8).next_multiple_of(RECORD_ALIGN)
}

/// Bytes of every record of an evicting depot (any trace fits any freed record).
pub(crate) const EVICTABLE_RECORD_BYTES: usize = record_bytes(MAX_FRAMES);

/// A record's words: at least the header, at most the header and 64 frames.
#[derive(Clone, Copy)]
pub(crate) struct Record<'a> {
    words: &'a [AtomicU64],
}

impl<'a> Record<'a> {
    /// The record starting at word `index` of `pool`, if its header fits.
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    #[inline]
    pub(crate) fn at(pool: &'a [AtomicU64], index: usize) -> Option<Self> {
        if index > pool.len() || pool.len() - index < HEADER_WORDS {
            return None;
        }
        let available = pool.len() - index;
        let len = if available < HEADER_WORDS + MAX_FRAMES { available } else { HEADER_WORDS + MAX_FRAMES };
        Some(Self { words: &pool[index..index + len] })
    }

    /// Raw handle of the next record in the bucket chain (0 ends it).
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    #[inline]
    pub(crate) fn next(&self) -> u32 {
        load_acquire(&self.words[0]) as u32
    }

    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    #[inline]
    pub(crate) fn hash(&self) -> u32 {
        (load_acquire(&self.words[0]) >> 32) as u32
    }

    /// Relinks the chain: the hash half is unchanged while the record is published.
    #[inline]
    pub(crate) fn set_next(&self, next: u32) {
        let hash = u64::from(self.hash()) << 32;
        self.words[0].store(hash | u64::from(next), Ordering::Release);
    }

    /// The frames, clamped to the pool (only a forged handle could need that).
    #[inline]
    pub(crate) fn frames(&self) -> impl Iterator<Item = u64> + 'a {
        let len = ((self.words[1].load(Ordering::Acquire) >> 32) as usize).min(self.words.len() - HEADER_WORDS);
        let words = self.words;
        words[HEADER_WORDS..HEADER_WORDS + len].iter().map(|word| word.load(Ordering::Relaxed))
    }

    /// The reference-count word (count in the low half).
    #[inline]
    pub(crate) fn count_word(&self) -> &'a AtomicU64 {
        &self.words[1]
    }

    #[inline]
    pub(crate) fn list_link(&self) -> &'a AtomicU64 {
        &self.words[2]
    }

    /// Fills an unpublished record (the caller holds the depot lock and the
    /// record is on no chain, or no reader can still see it).
    pub(crate) fn write(&self, next: u32, hash: u32, count: u32, frames: &[u64]) {
        self.words[0].store(u64::from(hash) << 32 | u64::from(next), Ordering::Relaxed);
        self.words[1].store((frames.len() as u64) << 32 | u64::from(count), Ordering::Relaxed);
        self.words[2].store(0, Ordering::Relaxed);
        for (word, frame) in self.words[HEADER_WORDS..].iter().zip(frames) {
            word.store(*frame, Ordering::Relaxed);
        }
    }
}

/// A record's two first header words, `(next | hash << 32, count | frames << 32)`, as the
/// hit path reads them: in the kernel (arm64) one `ldp` (each 64-bit half single-copy atomic:
/// two relaxed atomic loads), elsewhere two relaxed atomic loads.
///
/// # Safety
///
/// `record` points to the first word of a record: [`HEADER_WORDS`] words of a pool.
#[inline(always)]
pub(crate) unsafe fn header(record: *const AtomicU64) -> (u64, u64) {
    #[cfg(all(feature = "kernel", target_arch = "aarch64"))]
    {
        let (first, second): (u64, u64);
        // SAFETY: reads the two words the caller vouches for; no stack, no flags.
        unsafe {
            core::arch::asm!(
                "ldp {first}, {second}, [{record}]",
                record = in(reg) record,
                first = lateout(reg) first,
                second = lateout(reg) second,
                options(readonly, nostack, preserves_flags)
            )
        };
        (first, second)
    }
    #[cfg(not(all(feature = "kernel", target_arch = "aarch64")))]
    {
        // SAFETY: the two words the caller vouches for.
        unsafe { (load_relaxed(&*record), load_relaxed(&*record.wrapping_add(1))) }
    }
}

/// Whether the `frames.len()` words from `stored` equal `frames`: four frames a step (see
/// [`quads_equal`]), then a pair, then the odd frame.
///
/// # Safety
///
/// `frames.len()` words from `stored` lie in one pool.
#[inline(always)]
pub(crate) unsafe fn frames_equal(stored: *const AtomicU64, frames: &[u64]) -> bool {
    let len = frames.len();
    let mut stored = stored;
    let mut wanted = frames.as_ptr();
    let quads_end = wanted.wrapping_add(len & !3);
    if wanted != quads_end {
        // SAFETY: the quads lie before quads_end <= the end of `frames`, and as many words
        // follow `stored` (the caller's contract); there is at least one quad.
        if !unsafe { quads_equal(&mut wanted, &mut stored, quads_end) } {
            return false;
        }
    }
    if len & 2 != 0 {
        // SAFETY: the pair after the quads and its two words, as above.
        let (first, second, word, next) = unsafe { (*wanted, *wanted.add(1), &*stored, &*stored.add(1)) };
        if (load_relaxed(word) != first) | (load_relaxed(next) != second) {
            return false;
        }
        wanted = wanted.wrapping_add(2);
        stored = stored.wrapping_add(2);
    }
    if len & 1 != 0 {
        // SAFETY: the last frame and its word, as above.
        let (frame, word) = unsafe { (*wanted, &*stored) };
        return load_relaxed(word) == frame;
    }
    true
}

/// Whether the quads `[*wanted, quads_end)` equal the words from `*stored`; both pointers end
/// past the last quad compared.
///
/// In the kernel (arm64) eleven instructions per four frames, in four data registers: two `ldp`
/// each side (each 64-bit
/// half of an aligned `ldp` is single-copy atomic: a relaxed atomic load per word), `cmp` and
/// three `ccmp` under one branch (LLVM splits a chain of compares into branches), the loop's
/// compare and branch. Elsewhere (host tests, Miri) the same loop with relaxed atomic loads.
/// Always inlined, so not instrumented in its callers.
///
/// # Safety
///
/// `*wanted < quads_end`, `quads_end - *wanted` is a whole number of quads, all readable, and
/// as many words from `*stored` are in the record's pool.
#[inline(always)]
unsafe fn quads_equal(wanted: &mut *const u64, stored: &mut *const AtomicU64, quads_end: *const u64) -> bool {
    #[cfg(all(feature = "kernel", target_arch = "aarch64"))]
    {
        let equal: u64;
        // SAFETY: reads only the quads the caller vouches for (readonly, no stack); the loop
        // ends at quads_end or at the first quad that differs; `cset` reads the flags of the
        // last compare (EQ: the loop reached the end; NE: a quad differed).
        unsafe {
            core::arch::asm!(
                "2:",
                "ldp {a}, {b}, [{wanted}], #16",
                "ldp {c}, {d}, [{stored}], #16",
                "cmp {a}, {c}",
                // Equal so far: compare the next; else NZCV = 0000 (NE). The loads between
                // leave the flags alone, so four registers carry the quad.
                "ccmp {b}, {d}, #0, eq",
                "ldp {a}, {b}, [{wanted}], #16",
                "ldp {c}, {d}, [{stored}], #16",
                "ccmp {a}, {c}, #0, eq",
                "ccmp {b}, {d}, #0, eq",
                "b.ne 3f",
                "cmp {wanted}, {end}",
                "b.ne 2b",
                "3:",
                "cset {equal}, eq",
                wanted = inout(reg) *wanted,
                stored = inout(reg) *stored,
                end = in(reg) quads_end,
                a = out(reg) _,
                b = out(reg) _,
                c = out(reg) _,
                d = out(reg) _,
                equal = lateout(reg) equal,
                options(readonly, nostack)
            )
        };
        equal != 0
    }
    #[cfg(not(all(feature = "kernel", target_arch = "aarch64")))]
    {
        while *wanted != quads_end {
            let mut index = 0;
            while index < 4 {
                // SAFETY: the quad lies before quads_end (the caller's contract), as do its four
                // record words.
                let (frame, word) = unsafe { (*wanted.add(index), &*stored.add(index)) };
                if load_relaxed(word) != frame {
                    return false;
                }
                index += 1;
            }
            *wanted = wanted.wrapping_add(4);
            *stored = stored.wrapping_add(4);
        }
        true
    }
}
