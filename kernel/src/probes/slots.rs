//! The probe slot area: out-of-line slots and detour trampolines, generated at registration.
//!
//! A 32 KiB area of kernel text (`.text.probe_slots`, inside the no-probe range of kernel.ld)
//! filled with `BRK #0x006`, cut into 64 chunks of 512 bytes, one per probe that needs code.
//! It is written through the text alias (`arch::patch`), never executed writable. Encodings are
//! the Arm ARM's (DDI 0487) C6.2 entries of the instructions named beside each.

use probes::{Classification, IndirectBranch, LiteralSize, Simulated, encode_b, encode_brk};

use super::ProbeError;
use crate::arch::exception::BRK_KPROBE_STEP;
use crate::arch::patch;

/// Bytes per chunk, and chunks in the area.
const CHUNK_SIZE: u64 = 512;
pub const CHUNKS: usize = 64;
const CHUNK_WORDS: usize = (CHUNK_SIZE / 4) as usize;

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
}

pub fn chunk_address(chunk: usize) -> u64 {
    // SAFETY: only the address of the asm-defined area is taken.
    let base = unsafe { &probe_slot_area as *const u32 as u64 };
    base + chunk as u64 * CHUNK_SIZE
}

/// Writes `words` at `at` through the text alias.
fn write(at: u64, words: &[u32]) {
    for (index, &word) in words.iter().enumerate() {
        // SAFETY: `at` is a chunk of the slot area (kernel text) that no CPU executes while its
        // probe is being registered or unregistered.
        unsafe { patch::write_instruction(at + 4 * index as u64, word) };
    }
}

/// An XOL slot: the instruction, then `BRK #0x006` (the way back for brk-step; a safety net for
/// single-step, whose step exception comes first).
pub fn write_out_of_line(slot: u64, instruction: u32) {
    write(slot, &[instruction, encode_brk(BRK_KPROBE_STEP).0]);
}

/// Refills a chunk with `BRK #0x006` when its probe is unregistered.
pub fn clear(chunk: u64) {
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

/// Bytes the trampoline reserves below SP: x0..x30, sp, pc, pstate (the `Registers` layout).
const SAVE_AREA: u32 = 34 * 8;
const _: () = assert!(SAVE_AREA as usize == core::mem::size_of::<probes::Registers>() && SAVE_AREA.is_multiple_of(16));

/// Literal pool position (words from the chunk start), 8-aligned.
const LITERALS: usize = 112;

const fn sub_sp_immediate(immediate: u32) -> u32 {
    0xd100_03ff | (immediate << 10) // SUB SP, SP, #imm
}
const fn add_immediate(rd: u32, rn: u32, immediate: u32) -> u32 {
    0x9100_0000 | (immediate << 10) | (rn << 5) | rd // ADD Xd|SP, Xn|SP, #imm
}
const fn stp_sp(rt: u32, rt2: u32, offset: u32) -> u32 {
    0xa900_03e0 | ((offset / 8) << 15) | (rt2 << 10) | rt // STP Xt, Xt2, [SP, #offset]
}
const fn ldp_sp(rt: u32, rt2: u32, offset: u32) -> u32 {
    0xa940_03e0 | ((offset / 8) << 15) | (rt2 << 10) | rt // LDP Xt, Xt2, [SP, #offset]
}
const fn str_sp(rt: u32, offset: u32) -> u32 {
    0xf900_03e0 | ((offset / 8) << 10) | rt // STR Xt, [SP, #offset]
}
const fn ldr_sp(rt: u32, offset: u32) -> u32 {
    0xf940_03e0 | ((offset / 8) << 10) | rt // LDR Xt, [SP, #offset]
}
const fn ldr_literal(rt: u32, from_word: usize, to_word: usize) -> u32 {
    0x5800_0000 | ((((to_word as i64 - from_word as i64) as u32) & 0x7ffff) << 5) | rt // LDR Xt, label
}
const MRS_X1_NZCV: u32 = 0xd53b_4201;
const MSR_NZCV_X1: u32 = 0xd51b_4201;
const BLR_X16: u32 = 0xd63f_0200;
const fn br(rn: u32) -> u32 {
    0xd61f_0000 | (rn << 5)
}

/// A trampoline being assembled: code from word 0, literals from `LITERALS`.
struct Assembler {
    base: u64,
    code: [u32; CHUNK_WORDS],
    length: usize,
    literals: usize,
}

impl Assembler {
    fn emit(&mut self, word: u32) {
        self.code[self.length] = word;
        self.length += 1;
    }

    /// `LDR Xrt, =value` from a literal in the pool.
    fn load_literal(&mut self, rt: u32, value: u64) {
        let at = LITERALS + 2 * self.literals;
        self.code[at] = value as u32;
        self.code[at + 1] = (value >> 32) as u32;
        self.literals += 1;
        let from = self.length;
        self.emit(ldr_literal(rt, from, at));
    }

    fn here(&self) -> u64 {
        self.base + 4 * self.length as u64
    }

    /// `B to` from the next word.
    fn branch(&mut self, to: u64) -> Result<(), ProbeError> {
        let word = encode_b(self.here(), to).map_err(|_| ProbeError::OutOfBranchRange)?;
        self.emit(word.0);
        Ok(())
    }
}

/// Generates the detour trampoline for the probe at `address` (record `probe`) in the chunk at
/// `base`: save, call `detour_entry(probe, &mut registers)`, restore, the displaced instruction
/// (re-encoded if it depends on the PC), branch back.
pub fn write_detour(
    base: u64,
    address: u64,
    original: u32,
    classification: &Classification,
    probe: u64,
) -> Result<(), ProbeError> {
    let mut asm = Assembler { base, code: [encode_brk(BRK_KPROBE_STEP).0; CHUNK_WORDS], length: 0, literals: 0 };
    // Save: AArch64 has no red zone, so SP moves first; kernel SP is 16-aligned at every
    // instruction boundary (SCTLR_EL1.SA is set), and SAVE_AREA keeps it so.
    asm.emit(sub_sp_immediate(SAVE_AREA));
    for pair in 0..15 {
        asm.emit(stp_sp(2 * pair, 2 * pair + 1, 16 * pair));
    }
    asm.emit(str_sp(30, 240));
    asm.emit(add_immediate(0, 31, SAVE_AREA)); // the SP before the trampoline
    asm.emit(MRS_X1_NZCV);
    asm.load_literal(2, address);
    asm.emit(0xa900_03e0 | (31 << 15) | (2 << 10)); // STP X0, X2, [SP, #248]: sp, pc
    asm.emit(str_sp(1, 264)); // pstate: NZCV
    asm.load_literal(0, probe);
    asm.emit(add_immediate(1, 31, 0)); // MOV X1, SP
    asm.load_literal(16, super::hit::detour_entry as *const () as u64);
    asm.emit(BLR_X16);
    asm.emit(ldr_sp(1, 264));
    asm.emit(MSR_NZCV_X1);
    for pair in 0..15 {
        asm.emit(ldp_sp(2 * pair, 2 * pair + 1, 16 * pair));
    }
    asm.emit(ldr_sp(30, 240));
    asm.emit(add_immediate(31, 31, SAVE_AREA));
    let next = address + 4;
    let target = |offset: i64| address.wrapping_add_signed(offset);
    match *classification {
        Classification::Reject(reason) => return Err(ProbeError::Rejected(reason)),
        Classification::StepOutOfLine
        | Classification::Simulate(
            Simulated::LoadStorePair { .. } | Simulated::MoveRegister { .. } | Simulated::AddSubImmediate { .. },
        )
        | Classification::Simulate(Simulated::BranchRegister {
            kind: IndirectBranch::Br | IndirectBranch::Ret, ..
        }) => {
            asm.emit(original);
            asm.branch(next)?;
        }
        Classification::Simulate(Simulated::Nop) => asm.branch(next)?,
        Classification::Simulate(Simulated::Branch { offset, link }) => {
            if link {
                asm.load_literal(30, next);
            }
            asm.branch(target(offset))?;
        }
        Classification::Simulate(Simulated::BranchRegister { rn, kind: IndirectBranch::Blr }) => {
            if rn.number() == 30 {
                return Err(ProbeError::DetourBlrX30);
            }
            asm.load_literal(30, next);
            asm.emit(br(u32::from(rn.number())));
        }
        Classification::Simulate(Simulated::BranchConditional { condition, offset }) => {
            asm.emit(0x5400_0040 | u32::from(condition.bits())); // B.cond .+8
            asm.branch(next)?;
            asm.branch(target(offset))?;
        }
        Classification::Simulate(Simulated::CompareBranch { offset, .. }) => {
            asm.emit((original & !(0x7ffff << 5)) | (2 << 5)); // CBZ/CBNZ Rt, .+8
            asm.branch(next)?;
            asm.branch(target(offset))?;
        }
        Classification::Simulate(Simulated::TestBranch { offset, .. }) => {
            asm.emit((original & !(0x3fff << 5)) | (2 << 5)); // TBZ/TBNZ Rt, #bit, .+8
            asm.branch(next)?;
            asm.branch(target(offset))?;
        }
        Classification::Simulate(Simulated::Adr { rd, offset, page }) => {
            if rd.number() != 31 {
                let base = if page { address & !0xfff } else { address };
                asm.load_literal(u32::from(rd.number()), base.wrapping_add_signed(offset));
            }
            asm.branch(next)?;
        }
        Classification::Simulate(Simulated::LoadLiteral { rt, size, offset }) => {
            let rt = u32::from(rt.number());
            if rt != 31 {
                asm.load_literal(rt, target(offset));
                asm.emit(match size {
                    LiteralSize::Word => 0xb940_0000 | (rt << 5) | rt, // LDR Wt, [Xt]
                    LiteralSize::Doubleword => 0xf940_0000 | (rt << 5) | rt, // LDR Xt, [Xt]
                    LiteralSize::SignedWord => 0xb980_0000 | (rt << 5) | rt, // LDRSW Xt, [Xt]
                });
            }
            asm.branch(next)?;
        }
    }
    debug_assert!(asm.length <= LITERALS && LITERALS + 2 * asm.literals <= CHUNK_WORDS);
    let used = LITERALS + 2 * asm.literals;
    write(base, &asm.code[..asm.length]);
    write(base + 4 * LITERALS as u64, &asm.code[LITERALS..used]);
    Ok(())
}
