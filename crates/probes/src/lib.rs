//! Classify, simulate and encode A64 instructions for kernel probes.
//!
//! A probe replaces an instruction with `BRK`. When the BRK hits, the kernel
//! must still perform the displaced instruction, in one of two ways:
//! simulate it in the handler, or step it from an out-of-line (XOL) slot
//! `[insn, BRK #0x006]` at another address. [`classify`] decides which, once,
//! when the probe is registered; [`simulate`] runs the pre-decoded
//! [`Simulated`] form on every hit without decoding again. [`encode_b`],
//! [`encode_bl`], [`encode_brk`] and [`NOP`] write the instructions the
//! kernel patches in. [`plan`] decides, per [`Method`], how a hit performs
//! an instruction or why the method is refused ([`Refusal`]), for kernel and
//! user text alike; [`detour_trampoline`] builds a detour and [`relocate`]s
//! the displaced instruction with the named encoders of `encode.rs`. Everything here is `no_std` without `alloc` and never
//! panics, so it can run in the BRK exception handler.
//!
//! # What is simulated, stepped and rejected
//!
//! The policy is Linux's (`arch/arm64/kernel/probes/decode-insn.c`), plus
//! the STP simulation of the 2024 uprobes series (Liao Chang, "arm64: uprobes:
//! Simulate STP for pushing fp/lr into user stack", docs/threads.md), LDP, MOV
//! and ADD/SUB, and the newer instructions listed below.
//!
//! **Simulated** (exactly as the Arm ARM C6.2 pseudocode):
//! - `NOP`, `YIELD`, `BTI` (all four), `PRFM (literal)`: no architectural
//!   effect besides PC += 4 (and BTYPE = 0).
//! - `B`, `BL`, `B.cond`, `BC.cond`, `CBZ`, `CBNZ`, `TBZ`, `TBNZ`, `BR`,
//!   `BLR`, `RET`: they write PC, so they cannot run from a slot.
//! - `ADR`, `ADRP`, `LDR (literal)` of W and X registers, `LDRSW (literal)`:
//!   they read PC.
//! - `STP`/`LDP` of X registers in pre-index, post-index and signed-offset
//!   forms, including `stp x29, x30, [sp, #-16]!`: simulated for speed
//!   (the uprobes STP thread: 0.415 -> 1.411 M hits/s for a stepped vs. simulated push).
//! - `MOV (register)` (`ORR Rd, ZR, Rm`), `ADD`, `SUB`, `ADDS`, `SUBS`
//!   (immediate), including every use of SP and the flags.
//!
//! **Stepped out of line**: every other allocated instruction that neither
//! reads nor writes PC, including the PAC-signing hints `PACIASP`, `PACIBSP`,
//! `PACIAZ`, `PACIBZ`, `PACIA1716`, `PACIB1716` and `XPACLRI` (Linux's
//! steppable-hint list), `MRS` of any register but DAIF, barriers, `SYS`
//! (`DC`, `IC`, `TLBI`, `AT`), `CLREX`, non-exclusive loads, stores and
//! atomics (`LDAR`, `STLR`, `CAS`, `LDADD`, ...), and the
//! CONSTRAINED UNPREDICTABLE pairs (`STP`/`LDP` writeback onto a transfer
//! register, `LDP` with Rt = Rt2): stepping them gives whatever the CPU
//! does, which a simulation could only guess.
//!
//! **Rejected** ([`RejectReason`]), and why:
//! - unallocated encodings, and `UDF`;
//! - exception-generating `SVC`, `HVC`, `SMC`, `BRK`, `HLT`, `DCPS1-3`,
//!   `TCANCEL`; exception returns `ERET`, `ERETAA`, `ERETAB`, `DRPS`;
//! - system register and PSTATE writes: `MSR` (register and immediate),
//!   `MSRR`, `CFINV`, `XAFLAG`, `AXFLAG`, `SMSTART`, `SMSTOP`;
//! - `MRS DAIF`: the slot runs with DAIF masked, so it would read the wrong
//!   value (Linux: `aarch64_insn_is_steppable` returns false for it);
//! - hints outside the lists above: `WFE`, `WFI`, `SEV`, `SEVL`, `DGH`,
//!   `ESB`, `PSB`, `TSB`, `CSDB`, `CLRBHB`, `CHKFEAT`, the `AUT*` hints
//!   (they can fault with FEAT_FPAC) and every unassigned hint number;
//! - exclusives `LDXR`, `LDAXR`, `STXR`, `STLXR`, `LDXP`, `LDAXP`, `STXP`,
//!   `STLXP` (and B/H forms): the BRK and the trip through the slot clear
//!   the exclusive monitor, so the sequence would never succeed;
//! - PAC-authenticating branches `BRAA`, `BRAAZ`, `BRAB`, `BRABZ`, `BLRAA`,
//!   `BLRAAZ`, `BLRAB`, `BLRABZ`, `RETAA`, `RETAB`, `RETAASPPC`,
//!   `RETABSPPC` (simulating them exactly would need the PAC algorithm and
//!   keys), and other branches not simulated (FEAT_CMPBR `CB<cc>`);
//! - PC-relative instructions not simulated: SIMD&FP `LDR (literal)`,
//!   `AUTIASPPC`, `AUTIBSPPC`;
//! - FEAT_MOPS `CPY*`/`SET*` (a prologue/main/epilogue sequence), `MOVPRFX`
//!   (must be followed by its partner), FEAT_TME `TSTART`/`TCOMMIT`.
//!
//! The kernel must still refuse probes inside `LDXR`..`STXR` sequences and in
//! code that must not trap (exception entry, the BRK handler itself): that
//! needs context that a single word does not carry. [`KernelLayout`] and
//! [`inside_exclusive_sequence`] are those rules, given the context (the
//! kernel reads its own text, xtask the built image).
//!
//! # Decoders
//!
//! The primary decoder is `disarm64` 0.2 (generated from GNU binutils'
//! opcode tables; `no_std`, no `alloc`): it knows the extensions binutils
//! knows (SVE2, SME2, MOPS, LSUI, CMPBR, ...) and gives each word an instruction class, feature set and
//! operand kinds, from which [`Description`] derives "branch", "load/store"
//! and "PC-relative". It only matches opcode/mask pairs, so `reserved.rs`
//! adds the Arm ARM's UNDEFINED cases it misses, and `decode.rs` adds the four
//! FEAT_PAuth_LR PC-relative forms its tables lack. The simulated forms'
//! fields are then read from the bits exactly as C6.2 lays them out.
//! The decoder costs about 20 s of release build and a large static table
//! (3774 entries); it runs only at registration, never on the hit path.
//!
//! The second decoder, `yaxpeax-arm` 0.5 (hand-written, a dev-dependency),
//! is used by `tests/cross_check.rs` over 1,000,000 seeded random words
//! (875,461 compared; it abstains on 124,539 SVE/SME words). Every
//! disagreement on allocated/branch/load-store/PC-relative was resolved
//! against the Arm ARM, family by family (representatives are unit tests in
//! `tests/classify.rs`), and any new one fails the test:
//! - the primary was wrong, now fixed: reserved values in ADD/SUB
//!   (immediate, shifted, and extended register with a shift above 4), 32-bit
//!   MOVN/MOVZ/MOVK with hw<1> = 1 (these two both decoders accepted; the
//!   relocator check's emulator, QEMU's core, raised them as UNDEFINED), logical (shifted and immediate:
//!   DecodeBitMasks), bitfield, EXTR, scalar FP (`ftype = 10`, FCVT to the
//!   same size, fixed-point scale), SIMD&FP loads/stores (128-bit with size
//!   != 00, literal `opc = 11`), register-offset `option<1> = 0`, CASP with
//!   odd registers, `MSR`/`MRS` with `op0 = 00`; FEAT_PAuth_LR forms
//!   missing from its tables; and reserved Advanced SIMD element sizes
//!   (`size`/`sz`/`Q`/`immh`/`imm5` and structure `opcode` values that
//!   C7.2 makes UNDEFINED, in every Advanced SIMD class: 8,175 words of the
//!   sample that the second decoder rejects too, 8,111 of them formerly
//!   counted as an open family and 64 as "second decoder lacks the
//!   instruction");
//! - the second decoder was wrong (counts in the sample):
//!   - 32,797: it ignores fixed and should-be-one/zero fields in several
//!     groups (exclusives' Rs/Rt2, `SMULH` Ra, conditional compare/select,
//!     structure loads/stores, crypto, `UDF`);
//!   - 1,374: it accepts the same reserved Advanced SIMD sizes as the
//!     primary's tables did (e.g. `shadd` with size = 11), which C7.2 makes
//!     UNDEFINED;
//!   - 36: it rejects allocated FMLAL/FMLSL (vector, FEAT_FHM) with sz = 0
//!     and FRINT64X (vector) 4S;
//!   - 32,403: it does not implement newer extensions (LSUI, CMPBR, MOPS,
//!     CSSC, RCPC3, D128, THE, LSFE, FP8, MTE's STGP, ...), which the test
//!     recognises by name.
//!
//! LLVM 14's disassembler (`llvm-mc`) was the third opinion for the
//! Advanced SIMD families: it rejects all 9,549 sample words that the
//! primary's tables match but the size rules reject, and accepts the 36
//! words yaxpeax-arm rejects.
//!
//! Encodings whose should-be-one/zero fields are wrong are CONSTRAINED
//! UNPREDICTABLE in the Arm ARM (UNDEFINED, or as if the field were right);
//! like binutils, this crate calls them unallocated and rejects them.
//!
//! # The register file and memory contract
//!
//! [`RegisterFile`] is what the kernel's exception frame provides (or use
//! [`Registers`], laid out like Linux's `user_pt_regs`). [`Memory`] performs
//! the accesses; every method may fail with a [`Fault`]. [`simulate`]
//! computes the whole result first, performs every access, and writes
//! registers only after all succeeded, so on `Err` the register file
//! (PC, SP and PSTATE included) is unchanged, as after the real instruction
//! faulting; the kernel then raises the fault as if from the probed address.
//!
//! What is and is not preserved (Mark Rutland's objections to emulated STP):
//! - Single-copy atomicity and ordering are those of the [`Memory`] impl.
//!   `write_pair` carries both doublewords of an STP in one call so that the
//!   kernel can perform one `stp` at the same address: then atomicity
//!   (64-bit per register; 128-bit with FEAT_LSE2 and 16-byte alignment),
//!   alignment faults, MTE tag checks and ordering match the original. An
//!   implementation that splits it into two stores does not have that.
//! - SP alignment (`SCTLR_ELx.SA`) is a [`SimulationConfig`] flag: with it,
//!   an SP-based pair access with SP not 16-byte aligned returns
//!   [`Exception::SpAlignment`] before touching memory.
//! - PSTATE.BTYPE is written as the instruction would (BR: 01, or 11 from a
//!   guarded page unless Xn is x16/x17; BLR: 10; otherwise 00). The BTI
//!   check of the *incoming* BTYPE against the probed instruction is not
//!   performed (the BRK took that check's place); the kernel is not built
//!   with BTI.
//! - Branch targets honour TBI for instruction addresses
//!   (`AArch64.BranchAddr` at EL0/EL1) through [`SimulationConfig`].
//! - Single-step state (PSTATE.SS, MDSCR_EL1.SS) is the kernel's business:
//!   the simulator does not touch it.
//! - Accesses are made with the kernel's privilege: simulating for user
//!   space (uprobes) would need a `Memory` that uses unprivileged accesses.
//!
//! # Cargo feature `kernel`
//!
//! Enables `#![feature(sanitize)]` and builds [`simulate`], its helpers,
//! [`Registers`]' accessors and the default [`Memory::read_pair`] with
//! `#[sanitize(kernel_hwaddress = "off")]`: the probe hit path runs in the
//! BRK handler and must not be instrumented by the tag-based sanitizer. The
//! hit path avoids `?` and `map_err`, whose `core` instantiations would be
//! instrumented. Checked by disassembling an instantiation built with
//! `-Zsanitizer=kernel-hwaddress`: no `__hwasan` reference is left in this
//! crate's hit-path code. The kernel's own [`Memory`] and [`RegisterFile`]
//! impls are its code: exempt them too, or keep the memory accesses checked
//! on purpose (the probed instruction's own access was checked by the
//! instrumentation around it, not by the instruction).
//!
//! # Cargo feature `injected-bugs`
//!
//! Host only: compiles [`injected::inject`], which switches on one of three deliberate relocator
//! bugs so that the independent relocator check (`tools/check_relocator.py`, Unicorn) can show
//! that it catches them. Without the feature the switch does not exist and the relocator's hooks
//! are the identity.
#![cfg_attr(not(test), no_std)]
#![cfg_attr(feature = "kernel", feature(sanitize))]
// Deny, not forbid: the one exception is the simulator's no-probe `link_section` in the kernel
// (an unsafe attribute), allowed where it is written.
#![deny(unsafe_code)]

mod address;
mod classify;
mod decode;
mod encode;
mod insn;
mod plan;
mod relocate;
mod reserved;
mod simulate;

pub use address::{
    AddressRefusal, EXCLUSIVE_WINDOW, Exclusive, KERNEL_STACK_GAP, KERNEL_STACK_REACH, KernelLayout, exclusive_kind,
    inside_exclusive_sequence,
};
pub use classify::{Classification, RejectReason, classify};
pub use encode::{
    BRANCH_MAX_BACKWARD, BRANCH_MAX_FORWARD, BranchError, IMM19_MAX_BACKWARD, IMM19_MAX_FORWARD, NOP, add_immediate,
    b_cond, blr, br, ccmp_register, cmp_register, compare_branch, encode_b, encode_bl, encode_brk, is_b, ldp_offset,
    ldp_post_index, ldr_literal, ldr_unsigned, ldr_w_literal, ldr_w_unsigned, ldrsw_literal, ldrsw_unsigned, mov_sp,
    mrs_nzcv, msr_nzcv, stp_offset, stp_pre_index, str_unsigned, sub_immediate, test_branch,
};
pub use insn::{Description, Insn};
pub use plan::{Method, Plan, Refusal, Rules, Text, is_frame_push, plan, runs_anywhere};
pub use relocate::{LITERAL_POOL, RelocateError, TRAMPOLINE_WORDS, Trampoline, detour_trampoline, injected, relocate};
pub use simulate::{
    Access, Condition, Exception, Fault, Indexing, IndirectBranch, LiteralSize, Memory, Register, RegisterFile,
    Registers, Simulated, SimulationConfig, simulate,
};
