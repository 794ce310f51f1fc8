//! The callsite layout of `-Zpatchable-function-entry=4,2` and its encoders.
//!
//! Encodings from the Arm ARM (DDI 0487) C6.2 "BL" (encoded by `crates/probes`), "NOP", "ORR (shifted
//! register)" (`MOV (register)` is its alias), "PACIASP" and "STR
//! (immediate)" post-index.

/// `NOP` (HINT #0): what the compiler emits in all four patchable slots.
pub const NOP: u32 = 0xd503_201f;

/// `mov x9, x30` (`orr x9, xzr, x30`): the first post-symbol slot once the
/// site is initialised. It saves the traced function's return address,
/// which the `bl` in the call slot is about to overwrite.
pub const MOV_X9_X30: u32 = 0xaa1e_03e9;

/// `paciasp`: the word at `E + 16` in builds with `-Zbranch-protection=pac-ret`
/// (non-leaf functions only). Never written by this crate.
pub const PACIASP: u32 = 0xd503_233f;

/// `str x30, [x18], #8`: the shadow call stack push after `paciasp` in the
/// production build. Never written by this crate.
pub const SCS_PUSH: u32 = 0xf800_865e;

/// The literal slot as the compiler leaves it: two NOPs, read as one
/// little-endian doubleword.
pub const NOP_LITERAL: u64 = (NOP as u64) << 32 | NOP as u64;

pub use probes::{BRANCH_MAX_BACKWARD, BRANCH_MAX_FORWARD, BranchError};

/// `BL to`, placed at `from`: `crates/probes`' encoder (a branch that cannot
/// reach is an error, never a wrong branch), as a raw word.
pub fn encode_bl(from: u64, to: u64) -> Result<u32, BranchError> {
    probes::encode_bl(from, to).map(|insn| insn.0)
}

/// The target of `instruction` placed at `from`, if it is a `BL`.
pub fn decode_bl(from: u64, instruction: u32) -> Option<u64> {
    if instruction & 0xfc00_0000 != 0x9400_0000 {
        return None;
    }
    // Sign-extend imm26 and scale it to bytes.
    let offset = (((instruction << 6) as i32) >> 4) as i64;
    Some(from.wrapping_add(offset as u64))
}

/// Whether `instruction` at `from` is `bl to` (for the kernel's own checks).
pub fn is_bl_to(from: u64, instruction: u32, to: u64) -> bool {
    decode_bl(from, instruction) == Some(to)
}

/// One instrumented function's patchable entry.
///
/// `entry` (`E`) is the address that `__patchable_function_entries` records:
/// the first of the two NOPs before the symbol.
///
/// ```text
/// E + 0   literal lo   \  the 64-bit ops address, 8-aligned
/// E + 4   literal hi   /  (two NOPs until initialised)
/// E + 8   symbol:      NOP -> mov x9, x30    (once, at initialisation)
/// E + 12  call slot:   NOP <-> bl trampoline (at run time)
/// E + 16  paciasp      (pac-ret builds, non-leaf functions)
/// E + 20  str x30, [x18], #8 (shadow call stack builds)
/// ```
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub struct CallSite {
    pub(crate) entry: u64,
}

/// Why an address is not a patchable entry.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct MisalignedEntry {
    /// The address given.
    pub entry: u64,
}

impl CallSite {
    /// Offset of the 64-bit literal from the entry.
    pub const LITERAL_OFFSET: u64 = 0;
    /// Offset of the function symbol (the `mov x9, x30` slot).
    pub const FUNCTION_OFFSET: u64 = 8;
    /// Offset of the call slot (`NOP` / `bl trampoline`).
    pub const CALL_OFFSET: u64 = 12;
    /// Bytes of the traced function's frame that the trampoline builds on its behalf, at the top
    /// of its save area: the function's frame record (its x29, and x9: its return address), then
    /// its SP and PC. Unwind tables describe the trampoline's own frame as ending below these
    /// bytes and the call slot's return (`E + 16`) as a frame of this size with its record at the
    /// bottom, so a walker by tables sees the two frames the frame walker sees in the two records.
    pub const CALLER_FRAME: u64 = 32;

    /// The call site whose first pre-symbol NOP is at `entry`. The literal
    /// must be 8-aligned for a single-copy-atomic 64-bit store, so `entry`
    /// must be too (`-Zmin-function-alignment=8`).
    pub const fn new(entry: u64) -> Result<Self, MisalignedEntry> {
        if !entry.is_multiple_of(8) {
            return Err(MisalignedEntry { entry });
        }
        Ok(Self { entry })
    }

    /// The call site of a traced function, from the return address that its
    /// `bl trampoline` left in x30 (`E + 16`). This is what the trampoline
    /// computes with `bic x11, x30, #7; sub x11, x11, #16`.
    #[inline]
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    pub const fn from_return_address(return_address: u64) -> Self {
        Self { entry: (return_address & !7).wrapping_sub(Self::CALL_OFFSET + 4) }
    }

    /// `E`, the first pre-symbol NOP and the literal's address.
    #[inline]
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    pub const fn entry(self) -> u64 {
        self.entry
    }

    /// The 8-aligned address of the 64-bit ops literal.
    pub const fn literal(self) -> u64 {
        self.entry + Self::LITERAL_OFFSET
    }

    /// The function symbol's address, where `mov x9, x30` goes.
    pub const fn function(self) -> u64 {
        self.entry + Self::FUNCTION_OFFSET
    }

    /// The call slot, which toggles between `NOP` and `bl trampoline`.
    pub const fn call(self) -> u64 {
        self.entry + Self::CALL_OFFSET
    }

    /// The return address its `bl` leaves in x30.
    pub const fn return_address(self) -> u64 {
        self.call() + 4
    }

    /// `bl trampoline` encoded for this site's call slot.
    pub fn bl_to(self, trampoline: u64) -> Result<u32, BranchError> {
        encode_bl(self.call(), trampoline)
    }
}
