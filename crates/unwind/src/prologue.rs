//! Where the SCS and frame-record views of an interrupted function differ.
//!
//! With `-Zsanitizer=shadow-call-stack`, `pac-ret` and frame pointers, a
//! non-leaf function starts `paciasp; str x30, [x18], #8; stp x29, x30,
//! [sp, #-N]!; mov x29, sp` and ends `ldp x29, x30, [sp], #N; ldr x30, [x18,
//! #-8]!; autiasp; ret`. Between the SCS push and `mov x29, sp`, and between
//! the `ldp` that restores x29 and the SCS pop, the shadow stack holds the
//! function's own return address but x29 is still (or again) the caller's, so
//! an SCS trace of the interrupted context has one more entry than a frame
//! trace: the interrupted function's return address, right after its PC.

/// `str x30, [x18], #8`: the shadow-call-stack push.
pub const SCS_PUSH: u32 = 0xf800_865e;
/// `ldr x30, [x18, #-8]!`: the shadow-call-stack pop.
pub const SCS_POP: u32 = 0xf85f_8e5e;
/// `ret` (to x30).
const RET: u32 = 0xd65f_03c0;

/// How the two walkers' views of an interrupted function compare at its PC.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ViewDifference {
    /// Both walks see the same frames.
    Agree,
    /// The SCS walk has one extra entry: the function's own return address
    /// (pushed on the SCS, no frame record linked in x29).
    ShadowHasExtraFrame,
    /// The frame walk has one extra entry: a frame record is linked but the
    /// return address is not on the SCS (not emitted by our compiler's
    /// prologue order; possible in hand-written assembly).
    FramesHaveExtraFrame,
}

/// `add x29, sp, #imm` (`mov x29, sp` is `#0`): links the new frame record.
#[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
const fn links_frame(instruction: u32) -> bool {
    instruction & 0xff80_03ff == 0x9100_03fd
}

/// A 64-bit `ldp` (post-index, signed offset or pre-index) loading x29:
/// restores the caller's frame pointer.
#[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
const fn unlinks_frame(instruction: u32) -> bool {
    let is_ldp_x = matches!(instruction & 0xffc0_0000, 0xa8c0_0000 | 0xa940_0000 | 0xa9c0_0000);
    let first = instruction & 0x1f;
    let second = (instruction >> 10) & 0x1f;
    is_ldp_x && (first == 29 || second == 29)
}

/// An unconditional branch away: `ret`, `retaa`/`retab`, `b`, `br`. Code after
/// one is reached only by a branch from the body, where the prologue has run.
#[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
const fn leaves(instruction: u32) -> bool {
    instruction == RET
        || instruction & 0xffff_fbff == 0xd65f_0bff // retaa, retab
        || instruction & 0xfc00_0000 == 0x1400_0000 // b
        || instruction & 0xffff_fc1f == 0xd61f_0000 // br
}

/// Whether the SCS and frame-record views differ for a context interrupted
/// at `code[pc_index]` (not yet executed), by decoding `code`, the function's
/// instructions from its start (the patchable NOPs before the symbol may be
/// included: NOPs change nothing). For an ELR, `pc_index = (elr - start) / 4`.
///
/// A linear decode: the SCS push/pop and the x29 link/unlink are tracked in
/// order; after an unconditional branch (a `ret` or tail call ending an early
/// epilogue) the state is reset to the one after the prologue. A `pc_index`
/// past the end is taken as the end.
#[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
pub fn view_difference(code: &[u32], pc_index: usize) -> ViewDifference {
    let mut pushed = false;
    let mut linked = false;
    // The state the body runs in, once the prologue has established it.
    let mut body = (false, false);
    let end = if pc_index < code.len() { pc_index } else { code.len() };
    let mut index = 0;
    while index < end {
        let instruction = code[index];
        index += 1;
        match instruction {
            SCS_PUSH => pushed = true,
            SCS_POP => pushed = false,
            _ if links_frame(instruction) => linked = true,
            _ if unlinks_frame(instruction) => linked = false,
            _ if leaves(instruction) => (pushed, linked) = body,
            _ => {}
        }
        if pushed || linked {
            body = (body.0 || pushed, body.1 || linked);
        }
    }
    match (pushed, linked) {
        (true, false) => ViewDifference::ShadowHasExtraFrame,
        (false, true) => ViewDifference::FramesHaveExtraFrame,
        _ => ViewDifference::Agree,
    }
}
