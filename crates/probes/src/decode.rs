//! What the decoder says an instruction word is: the primary decoder's answer, with the four
//! FEAT_PAuth_LR forms its tables lack added and the encodings the Arm ARM leaves unallocated
//! (`reserved.rs`) taken out.
//!
//! Above both the word's fields (`insn.rs`) and the reserved-encoding rules, which read them.

use disarm64::InsnOpcode;
use disarm64::decoder::{self, Opcode};
use disarm64_defn::{InsnClass, InsnOperandClass, InsnOperandKind};

use crate::insn::{Description, Insn};
use crate::reserved::is_reserved;

impl Insn {
    /// What the decoder says about this word, or `None` if it is unallocated.
    pub fn describe(self) -> Option<Description> {
        if let Some(description) = Description::pauth_lr(self) {
            return Some(description);
        }
        let description = Description::of(decoder::decode(self.0)?);
        if is_reserved(self, &description) { None } else { Some(description) }
    }
}

impl Description {
    /// FEAT_PAuth_LR's PC-relative forms (Arm ARM C6.2 "AUTIASPPC",
    /// "RETAASPPC"), which disarm64 0.2's tables do not have:
    /// `AUTI{A,B}SPPC <label>` = 0xf380001f/0xf3a0001f | imm16 << 5 and
    /// `RETA{A,B}SPPC <label>` = 0x5500001f/0x5520001f | imm16 << 5.
    fn pauth_lr(insn: Insn) -> Option<Self> {
        let (mnemonic, is_branch) = match insn.0 & 0xffe0_001f {
            0xf380_001f => ("autiasppc", false),
            0xf3a0_001f => ("autibsppc", false),
            0x5500_001f => ("retaasppc", true),
            0x5520_001f => ("retabsppc", true),
            _ => return None,
        };
        Some(Self { mnemonic, entry: None, is_branch, is_load_store: false, is_pc_relative: true })
    }

    /// What probes care about in the decoder's entry for `opcode`.
    fn of(opcode: Opcode) -> Self {
        let definition = opcode.definition();
        let class = definition.class;
        let is_branch = matches!(
            class,
            InsnClass::BRANCH_IMM
                | InsnClass::BRANCH_REG
                | InsnClass::COMPBRANCH
                | InsnClass::CONDBRANCH
                | InsnClass::TESTBRANCH
        );
        let mut is_pc_relative = false;
        let mut has_address = false;
        for operand in definition.operands {
            match operand.kind {
                InsnOperandKind::ADDR_ADRP
                | InsnOperandKind::ADDR_PCREL14
                | InsnOperandKind::ADDR_PCREL19
                | InsnOperandKind::ADDR_PCREL21
                | InsnOperandKind::ADDR_PCREL26
                | InsnOperandKind::ADDR_PCREL9 => is_pc_relative = true,
                // SVE ADR computes vector addresses without accessing memory.
                InsnOperandKind::SVE_ADDR_ZZ_LSL
                | InsnOperandKind::SVE_ADDR_ZZ_SXTW
                | InsnOperandKind::SVE_ADDR_ZZ_UXTW => {}
                _ if operand.class == InsnOperandClass::ADDRESS => has_address = true,
                // Memory copy/set (FEAT_MOPS) names its addresses as registers.
                InsnOperandKind::MOPS_ADDR_Rd | InsnOperandKind::MOPS_ADDR_Rs | InsnOperandKind::MOPS_WB_Rn => {
                    has_address = true
                }
                _ => {}
            }
        }
        // A literal load is PC-relative and a load; ADR/ADRP and branches are
        // only PC-relative.
        let is_literal_load = class == InsnClass::LOADLIT;
        Self {
            mnemonic: definition.mnemonic,
            entry: Some((opcode.id(), definition)),
            is_branch,
            is_load_store: has_address || is_literal_load,
            is_pc_relative,
        }
    }
}
