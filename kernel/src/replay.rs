//! Linux's recorded stacks rebuilt in the lab: the frame functions a replayed call goes through.
//!
//! The `kasan-replay` suite performs a Linux boot's allocations with their recorded stacks
//! (`protocol::replay`). Each distinct recorded return address is one frame function here, by
//! index: [`FRAME_FUNCTIONS`] copies of one eight-instruction body, [`FRAME_FUNCTION_STRIDE`]
//! bytes apart, so frame function `i` is at a fixed offset and needs no table. Each loads the
//! next function's address from a path and calls it from its single `blr`: its return address
//! is the same wherever frame `i` appears, so identical Linux stacks give identical lab stacks
//! and stacks that share their outer frames share them here. Each keeps a frame record (for
//! the frame-pointer walkers) and, in builds with a shadow call stack, pushes x30 on it as the
//! compiler's functions do (for the SCS walkers). The pool costs 144 KiB of text; a trace with
//! more distinct return addresses than the pool is refused by xtask's converter rather than
//! folded, as folding would merge distinct stacks in the depot.

use protocol::replay::{FRAME_FUNCTION_STRIDE, FRAME_FUNCTIONS, MAX_RECORDED_DEPTH};

// Each body: with a shadow call stack `str x30, [x18], #8` first and `ldr x30, [x18, #-8]!`
// before `ret`, else NOPs in their place, so the stride is the same in every build. x0 is the
// cursor into the path (advanced past the loaded entry), x9 the loaded address: both
// caller-saved, so the path's last entry, a C-ABI function, sees x0 pointing after it.
// `.text.noprobe`: a probe or a traced entry here would change the stacks being measured.
core::arch::global_asm!(
    r#"
    .section .text.noprobe.replay_frames, "ax"
    .balign {stride}
    .global replay_frame_functions
replay_frame_functions:
    .rept {count}
    .if {scs}
    str     x30, [x18], #8
    .else
    nop
    .endif
    stp     x29, x30, [sp, #-16]!
    mov     x29, sp
    ldr     x9, [x0], #8
    blr     x9
    ldp     x29, x30, [sp], #16
    .if {scs}
    ldr     x30, [x18, #-8]!
    .else
    nop
    .endif
    ret
    .endr
    .size replay_frame_functions, . - replay_frame_functions
    "#,
    stride = const FRAME_FUNCTION_STRIDE,
    count = const FRAME_FUNCTIONS,
    scs = const crate::build_info::SHADOW_CALL_STACK as u8,
);

unsafe extern "C" {
    /// The first frame function; the others follow at [`FRAME_FUNCTION_STRIDE`].
    static replay_frame_functions: [u8; FRAME_FUNCTION_STRIDE * FRAME_FUNCTIONS];
}

/// Where frame function `frame`'s `blr` returns to: the return address a walker reports for it.
pub const RETURN_OFFSET: usize = 5 * 4;

/// The address of frame function `frame`.
pub fn frame_function(frame: u16) -> usize {
    assert!((frame as usize) < FRAME_FUNCTIONS, "frame function {frame} is past the pool");
    // Only the symbol's address is taken: the bytes are code and never read here.
    let base = (&raw const replay_frame_functions) as usize;
    base + frame as usize * FRAME_FUNCTION_STRIDE
}

/// What a replayed stack calls at its innermost frame: the C ABI, with the path's cursor in
/// x0, pointing after the leaf's own entry, at [`Path::context`]'s word.
pub type Leaf = extern "C" fn(cursor: *const usize);

/// The functions of one replayed call, outermost first, then the leaf and a context word.
pub struct Path {
    entries: [usize; MAX_RECORDED_DEPTH + 2],
    len: usize,
}

impl Path {
    /// The path through `stack` (frame IDs, innermost first, at most [`MAX_RECORDED_DEPTH`])
    /// to `leaf`, which reads `context` at its cursor.
    pub fn new(stack: impl DoubleEndedIterator<Item = u16>, leaf: Leaf, context: usize) -> Self {
        let mut path = Self { entries: [0; MAX_RECORDED_DEPTH + 2], len: 0 };
        for frame in stack.rev() {
            assert!(path.len < MAX_RECORDED_DEPTH, "a replayed stack deeper than {MAX_RECORDED_DEPTH}");
            path.entries[path.len] = frame_function(frame);
            path.len += 1;
        }
        path.entries[path.len] = leaf as usize;
        path.entries[path.len + 1] = context;
        path.len += 2;
        path
    }

    /// Calls the path's functions in turn, each from the one before, the leaf last.
    #[inline(never)]
    pub fn call(&self) {
        // SAFETY: entry 0 is a frame function or the leaf, both C-ABI functions taking one
        // pointer argument; a frame function reads the next entry at x0 and calls it, and
        // every entry up to the leaf is a function (Path::new wrote them), the leaf's cursor
        // pointing at the context word inside `self.entries`, which outlives the call.
        let first: Leaf = unsafe { core::mem::transmute::<usize, Leaf>(self.entries[0]) };
        first(self.entries[1..self.len].as_ptr());
        core::hint::black_box(());
    }
}

/// The context word a leaf's cursor points at.
///
/// # Safety
/// `cursor` must be the x0 a [`Path::call`]'s leaf received, during that call.
pub unsafe fn context(cursor: *const usize) -> usize {
    // SAFETY: the caller's contract: cursor points at the path's context word.
    unsafe { cursor.read() }
}
