//! The random-IRQ test's ground truth: the known call chain, each walk judged against it.
//!
//! A random chain's functions follow from its seed (one draw per level), so the functions an
//! interrupted context's callers must be are known without any walker: the interrupted function
//! at level `j`, the chain functions of levels `j - 1` down to 0, then the test function that
//! started the chain. Which level an interrupted PC is at (a chain calls the same three
//! functions again and again) follows from the interrupted SP: each chain function records its
//! body's SP (its SP at its call to the next level, the next level's SP at entry), and the
//! interrupted function's SP at its PC is its entry SP plus what its instructions up to the PC
//! moved it by, decoded here from its text (64-bit `sub`/`add` on SP, pre- and post-indexed
//! loads and stores on SP). The same decode places the PC in its function's prologue (before
//! `mov x29, sp` links the frame record), body or epilogue (after the `ldp` that unlinks it).
//!
//! Each walk (frame records and shadow call stack from the IRQ handler across the exception
//! boundary, SFrame from the saved registers) is then right (its functions start with the known
//! chain, or are the chain's up to the buffer's end), incomplete (it stops inside the chain,
//! with nothing wrong before) or wrong.

use crate::stacktrace::IrqCapture;
use crate::symbols::callsites;
use unwind::{EntryKind, StopReason, Trace};

/// Levels a chain has at most (the test's depths are 1 to 100), plus the leaf.
pub(super) const LEVELS: usize = 101;

/// Records the calling chain function's body SP (always inlined into it: its own SP) in
/// `body_sp`, by the levels below it (`remaining`). The records live in the chain, on the
/// stack: a static here would move the kernel's other statics (and the compiler's merged
/// groups of them) in every build.
#[inline(always)]
pub(super) fn record_body_sp(body_sp: &mut [u64; LEVELS], remaining: usize) {
    if let Some(slot) = body_sp.get_mut(remaining) {
        *slot = current_sp();
    }
}

/// SP of the function this is inlined into.
#[inline(always)]
pub(super) fn current_sp() -> u64 {
    let sp: u64;
    // SAFETY: reads SP into a register; no memory, no stack, no flags.
    unsafe { core::arch::asm!("mov {}, sp", out(reg) sp, options(nomem, nostack, preserves_flags)) };
    sp
}

/// Where in its function an interrupted PC is (without frame pointers, the shadow call stack's
/// push and pop stand for the frame record's link and unlink).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Window {
    /// Before the frame record is linked (`mov x29, sp`).
    Prologue,
    /// The frame record linked.
    Body,
    /// After the frame record is unlinked (`ldp x29, x30, ...`), up to the return.
    Epilogue,
}

const WINDOWS: [(Window, &str); 3] =
    [(Window::Prologue, "prologue"), (Window::Body, "body"), (Window::Epilogue, "epilogue")];
const WALKERS: [&str; 3] = ["fp", "scs", "sframe"];

/// What the SP-moving instruction `word` adds to SP, if it moves SP.
fn sp_change(word: u32) -> Option<i64> {
    const SP: u32 = 31;
    let base = (word >> 5) & 31;
    // ADD/SUB (immediate), 64-bit, Rd = Rn = SP.
    if word & 0x3f80_03ff == 0x1100_03ff && word >> 31 == 1 {
        let immediate = i64::from((word >> 10) & 0xfff) << if word & (1 << 22) != 0 { 12 } else { 0 };
        return Some(if word & (1 << 30) != 0 { -immediate } else { immediate });
    }
    // LDP/STP (64-bit), pre- or post-indexed on SP.
    if matches!(word & 0xffc0_0000, 0xa980_0000 | 0xa880_0000 | 0xa9c0_0000 | 0xa8c0_0000) && base == SP {
        return Some(i64::from(((word >> 15) & 0x7f) as i32) << 57 >> 57 << 3);
    }
    // LDR/STR (64-bit register), pre- or post-indexed on SP.
    if matches!(word & 0xffe0_0c00, 0xf800_0c00 | 0xf800_0400 | 0xf840_0c00 | 0xf840_0400) && base == SP {
        return Some(i64::from(((word >> 12) & 0x1ff) as i32) << 55 >> 55);
    }
    None
}

/// `str x30, [x18], #8` and `ldr x30, [x18, #-8]!`: the shadow call stack's push and pop.
const SCS_PUSH: u32 = 0xf800_865e;
const SCS_POP: u32 = 0xf85f_8e5e;

/// Where the body starts: `add x29, sp, #imm` (`mov x29, sp` is `#0`) links the frame record;
/// without frame pointers, the shadow call stack's push saves the return address.
fn links_frame(word: u32) -> bool {
    if crate::build_info::FRAME_POINTERS { word & 0xff80_03ff == 0x9100_03fd } else { word == SCS_PUSH }
}

/// Where the epilogue starts: a 64-bit LDP (post-indexed, signed offset or pre-indexed) loading
/// x29 unlinks the record; without frame pointers, the shadow call stack's pop.
fn unlinks_frame(word: u32) -> bool {
    if crate::build_info::FRAME_POINTERS {
        matches!(word & 0xffc0_0000, 0xa8c0_0000 | 0xa940_0000 | 0xa9c0_0000)
            && (word & 31 == 29 || (word >> 10) & 31 == 29)
    } else {
        word == SCS_POP
    }
}

/// `ret`, `b` or `br`: code after it is reached by a branch from the body.
fn leaves(word: u32) -> bool {
    const RET: u32 = 0xd65f_03c0;
    word == RET || word & 0xfc00_0000 == 0x1400_0000 || word & 0xffff_fc1f == 0xd61f_0000
}

/// The window of `code[index]` and how far SP is below its value at the function's entry.
fn position(code: &[u32], index: usize) -> (Window, i64) {
    let (mut linked, mut unlinked, mut delta, mut deepest) = (false, false, 0i64, 0i64);
    for &word in &code[..index.min(code.len())] {
        if links_frame(word) {
            linked = true;
            unlinked = false;
        } else if unlinks_frame(word) {
            linked = false;
            unlinked = true;
        }
        if let Some(change) = sp_change(word) {
            delta += change;
            deepest = deepest.min(delta);
        }
        // After a return or tail call, code is reached from the body: frame linked, SP deepest.
        if leaves(word) {
            (linked, unlinked, delta) = (true, false, deepest);
        }
    }
    let window = if linked {
        Window::Body
    } else if unlinked {
        Window::Epilogue
    } else {
        Window::Prologue
    };
    (window, -delta)
}

/// The chain a capture is judged against: its functions by level (the leaf's last), the body
/// SPs its run recorded (by the levels below), the test function that called level 0, and
/// that function's SP.
pub(super) struct KnownChain<'a> {
    pub(super) functions: &'a [u64],
    pub(super) body_sp: &'a [u64; LEVELS],
    pub(super) outer: u64,
    pub(super) outer_sp: u64,
}

/// Right, incomplete and wrong walks per window and walker, and the landings not placed.
#[derive(Default)]
pub(super) struct Tally {
    counts: [[[u32; 3]; 3]; 3],
    unplaced: u32,
}

impl Tally {
    /// Judges the walks of `capture` (taken in a chain function or the leaf) against `chain`.
    /// Returns the SFrame walk's judgement (0 right, 1 incomplete, 2 wrong), or `None` if the
    /// landing could not be placed at one level.
    pub(super) fn judge(&mut self, capture: &IrqCapture, chain: &KnownChain) -> Option<usize> {
        let Some((start, _)) = callsites::function_containing(capture.pc) else {
            self.unplaced += 1;
            return None;
        };
        let index = ((capture.pc - start) / 4) as usize;
        // SAFETY: [start, pc] is kernel text of one function, readable.
        let code = unsafe { core::slice::from_raw_parts(start as *const u32, index + 1) };
        let (window, below_entry) = position(code, index);
        let entry_sp = capture.sp + below_entry as u64;
        let levels = chain.functions.len();
        let caller_sp = |level: usize| {
            if level == 0 { chain.outer_sp } else { chain.body_sp[levels - 1 - level] }
        };
        let mut placed = (0..levels).filter(|&level| chain.functions[level] == start && caller_sp(level) == entry_sp);
        let (Some(level), None) = (placed.next(), placed.next()) else {
            self.unplaced += 1;
            return None;
        };
        let expected =
            || core::iter::once(start).chain((0..level).rev().map(|below| chain.functions[below])).chain([chain.outer]);
        let window_index = WINDOWS.iter().position(|(known, _)| *known == window).unwrap_or(1);
        let mut sframe = 0;
        for (walker, trace) in [&capture.frame_pointer, &capture.shadow, &capture.sframe].into_iter().enumerate() {
            // Without frame pointers the frame walk is refused: nothing to judge.
            if walker == 0 && !crate::build_info::FRAME_POINTERS {
                continue;
            }
            let judgement = judged(trace, expected(), level + 2);
            self.counts[window_index][walker][judgement] += 1;
            sframe = judgement;
        }
        Some(sframe)
    }

    /// One line per window: right / incomplete / wrong of each walker.
    pub(super) fn print(&self) {
        defmt::info!("  ground truth (known chain): right/incomplete/wrong; {=u32} landings not placed", self.unplaced);
        for (index, (_, name)) in WINDOWS.iter().enumerate() {
            let counts = &self.counts[index];
            // Without frame pointers the frame walk is refused, not judged: its counts stay 0.
            let fp = if crate::build_info::FRAME_POINTERS { WALKERS[0] } else { "fp (refused)" };
            defmt::info!(
                "  {=str}: {=str} {=u32}/{=u32}/{=u32}, {=str} {=u32}/{=u32}/{=u32}, {=str} {=u32}/{=u32}/{=u32}",
                name,
                fp,
                counts[0][0],
                counts[0][1],
                counts[0][2],
                WALKERS[1],
                counts[1][0],
                counts[1][1],
                counts[1][2],
                WALKERS[2],
                counts[2][0],
                counts[2][1],
                counts[2][2],
            );
        }
    }
}

/// 0 right, 1 incomplete, 2 wrong: the functions of `trace` from its exception PC on against
/// the `length` functions `expected` yields. A walk that agrees up to the buffer's end (the
/// depth limit) is right: the walker did not stop, the buffer did.
fn judged(trace: &Trace, expected: impl Iterator<Item = u64>, length: usize) -> usize {
    let Some(from) = trace.entries().position(|entry| entry.kind == EntryKind::ExceptionPc) else {
        // It never reached the interrupted context.
        return 1;
    };
    let mut functions = trace.entries().skip(from).map(|entry| {
        let address = if entry.kind == EntryKind::ExceptionPc { entry.address } else { entry.address - 4 };
        callsites::function_containing(address).map_or(0, |(start, _)| start)
    });
    let mut seen = 0;
    for known in expected {
        match functions.next() {
            Some(function) if function == known => seen += 1,
            Some(_) => return 2,
            // A walk the buffer cut (64 entries; chains are up to 100 deep) is right so far.
            None if trace.stop_reason() == StopReason::DepthLimit => return 0,
            None => return 1,
        }
    }
    if seen == length { 0 } else { 1 }
}
