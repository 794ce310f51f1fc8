//! Emulates the simulated instructions on a register file and a memory.
//!
//! Each form follows the pseudocode of its Arm ARM (DDI 0487) C6.2 entry and
//! the shared functions of J1 (`AddWithCarry`, `ConditionHolds`,
//! `AArch64.BranchAddr`, `CheckSPAlignment`). The result of an instruction is
//! computed in full, then memory is accessed, and registers are written only
//! after every access succeeded: a fault leaves the register file unchanged,
//! as the real instruction would.

use core::fmt;

/// PSTATE.{N,Z,C,V} in the SPSR layout, bits `[31:28]`.
const NZCV_SHIFT: u32 = 28;
/// PSTATE.BTYPE in the SPSR layout, bits `[11:10]`.
const BTYPE_SHIFT: u32 = 10;
const BTYPE_MASK: u64 = 0b11 << BTYPE_SHIFT;

/// A general-purpose register number, 0..=31. What 31 means (SP or the zero
/// register) depends on the instruction, as in the Arm ARM.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Register(u8);

impl Register {
    /// Register `number`, or `None` if it is above 31.
    pub const fn new(number: u8) -> Option<Self> {
        if number <= 31 { Some(Self(number)) } else { None }
    }

    /// From a 5-bit instruction field (higher bits are ignored).
    pub(crate) const fn from_field(field: u8) -> Self {
        Self(field & 31)
    }

    /// The register number.
    pub const fn number(self) -> u8 {
        self.0
    }
}

/// A condition code (Arm ARM C1.2.4), as encoded in B.cond.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Condition(u8);

impl Condition {
    /// From a 4-bit field (higher bits are ignored).
    pub const fn from_field(field: u8) -> Self {
        Self(field & 0xf)
    }

    /// The 4-bit encoding.
    pub const fn bits(self) -> u8 {
        self.0
    }

    /// `ConditionHolds(cond)` for flags `nzcv` (N in bit 3 .. V in bit 0).
    /// Part of the simulator: see `simulate` for why it is no-probe text.
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    #[cfg_attr(feature = "kernel", unsafe(link_section = ".text.noprobe"))]
    #[cfg_attr(feature = "kernel", allow(unsafe_code, reason = "the no-probe link_section above, nothing else"))]
    pub const fn holds(self, nzcv: u8) -> bool {
        let (n, z, c, v) = (nzcv & 8 != 0, nzcv & 4 != 0, nzcv & 2 != 0, nzcv & 1 != 0);
        let result = match self.0 >> 1 {
            0b000 => z,
            0b001 => c,
            0b010 => n,
            0b011 => v,
            0b100 => c && !z,
            0b101 => n == v,
            0b110 => n == v && !z,
            _ => true,
        };
        // cond<0> inverts, except for 0b1111 which is also "always".
        if self.0 & 1 == 1 && self.0 != 0b1111 { !result } else { result }
    }
}

/// Which register branch (C6.2 BR, BLR, RET).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum IndirectBranch {
    /// BR Xn.
    Br,
    /// BLR Xn: X30 = PC + 4.
    Blr,
    /// RET Xn.
    Ret,
}

/// What a literal load reads and how it extends it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum LiteralSize {
    /// LDR Wt: 32 bits, zero-extended.
    Word,
    /// LDR Xt: 64 bits.
    Doubleword,
    /// LDRSW Xt: 32 bits, sign-extended.
    SignedWord,
}

/// Addressing mode of a load/store pair.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Indexing {
    /// `[Xn|SP], #imm`: access at the base, then base += imm.
    PostIndex,
    /// `[Xn|SP, #imm]!`: base += imm, then access at the new base.
    PreIndex,
    /// `[Xn|SP, #imm]`: access at base + imm, no writeback.
    SignedOffset,
}

/// The pre-decoded form of a simulated instruction, computed once when the
/// probe is registered so that the hit path does not decode again.
///
/// Offsets are byte offsets, already scaled and sign-extended.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Simulated {
    /// NOP, YIELD, BTI, PRFM (literal): PC += 4.
    Nop,
    /// B or, with `link`, BL.
    Branch { offset: i64, link: bool },
    /// B.cond and BC.cond.
    BranchConditional { condition: Condition, offset: i64 },
    /// CBZ or, with `if_nonzero`, CBNZ; `rt` = 31 is the zero register.
    CompareBranch { rt: Register, is_64: bool, if_nonzero: bool, offset: i64 },
    /// TBZ or, with `if_nonzero`, TBNZ of bit `bit` (0..=63).
    TestBranch { rt: Register, bit: u8, if_nonzero: bool, offset: i64 },
    /// BR, BLR, RET; `rn` = 31 is the zero register.
    BranchRegister { rn: Register, kind: IndirectBranch },
    /// ADR or, with `page`, ADRP; `rd` = 31 is the zero register.
    Adr { rd: Register, offset: i64, page: bool },
    /// LDR (literal) and LDRSW (literal) of a general-purpose register.
    LoadLiteral { rt: Register, size: LiteralSize, offset: i64 },
    /// STP or, with `load`, LDP of two X registers; `rn` = 31 is SP, `rt` and
    /// `rt2` = 31 are the zero register.
    LoadStorePair { load: bool, rt: Register, rt2: Register, rn: Register, offset: i64, indexing: Indexing },
    /// MOV (register) = ORR Rd, ZR, Rm; 31 is the zero register on both sides.
    MoveRegister { rd: Register, rm: Register, is_64: bool },
    /// ADD, SUB, ADDS, SUBS (immediate): `rn` = 31 is SP; `rd` = 31 is SP
    /// without `set_flags` and the zero register with it (CMP/CMN).
    AddSubImmediate { rd: Register, rn: Register, immediate: u64, subtract: bool, set_flags: bool, is_64: bool },
}

/// The interrupted context the simulator reads and writes.
///
/// `pstate` is in the SPSR_ELx layout: the simulator reads and writes NZCV
/// (bits `[31:28]`) and BTYPE (bits `[11:10]`) only, and keeps every other bit.
/// `x`/`set_x` are only called with `n` < 31: the simulator resolves register
/// 31 to SP or the zero register itself.
pub trait RegisterFile {
    /// X`n`, `n` < 31.
    fn x(&self, n: u8) -> u64;
    /// Sets X`n`, `n` < 31.
    fn set_x(&mut self, n: u8, value: u64);
    /// The stack pointer of the interrupted context.
    fn sp(&self) -> u64;
    /// Sets the stack pointer of the interrupted context.
    fn set_sp(&mut self, value: u64);
    /// Address of the probed instruction on entry; the next PC on return.
    fn pc(&self) -> u64;
    /// Sets the PC to resume at.
    fn set_pc(&mut self, value: u64);
    /// Saved PSTATE (SPSR layout).
    fn pstate(&self) -> u64;
    /// Sets the PSTATE to resume with.
    fn set_pstate(&mut self, value: u64);
}

/// A register file laid out like Linux's `struct user_pt_regs`, so that an
/// exception frame with that layout can be used directly.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
#[repr(C)]
pub struct Registers {
    /// X0..X30.
    pub x: [u64; 31],
    /// Stack pointer.
    pub sp: u64,
    /// Program counter.
    pub pc: u64,
    /// PSTATE in the SPSR layout.
    pub pstate: u64,
}

impl RegisterFile for Registers {
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    fn x(&self, n: u8) -> u64 {
        self.x[usize::from(n)]
    }
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    fn set_x(&mut self, n: u8, value: u64) {
        self.x[usize::from(n)] = value;
    }
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    fn sp(&self) -> u64 {
        self.sp
    }
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    fn set_sp(&mut self, value: u64) {
        self.sp = value;
    }
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    fn pc(&self) -> u64 {
        self.pc
    }
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    fn set_pc(&mut self, value: u64) {
        self.pc = value;
    }
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    fn pstate(&self) -> u64 {
        self.pstate
    }
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    fn set_pstate(&mut self, value: u64) {
        self.pstate = value;
    }
}

/// Whether a failed access was a read or a write.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Access {
    /// A load.
    Read,
    /// A store.
    Write,
}

/// A memory access that did not complete (a data abort, or an alignment fault
/// the memory itself checks).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Fault {
    /// The faulting address.
    pub address: u64,
    /// Read or write.
    pub access: Access,
}

/// Data memory as the probed instruction would see it.
///
/// The kernel implements these with the same access the instruction makes
/// (e.g. one `stp` for [`Memory::write_pair`]), so that alignment checks,
/// tag checks, single-copy atomicity and ordering match the original; see the
/// crate docs for what is and is not preserved.
pub trait Memory {
    /// Reads 32 bits at `address`.
    fn read_u32(&mut self, address: u64) -> Result<u32, Fault>;
    /// Reads 64 bits at `address`.
    fn read_u64(&mut self, address: u64) -> Result<u64, Fault>;
    /// Reads 64 bits at `address` and 64 bits at `address + 8` (LDP).
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    fn read_pair(&mut self, address: u64) -> Result<[u64; 2], Fault> {
        // A `match`, not `?`: see `access!`.
        match (self.read_u64(address), self.read_u64(address.wrapping_add(8))) {
            (Ok(first), Ok(second)) => Ok([first, second]),
            (Err(fault), _) | (_, Err(fault)) => Err(fault),
        }
    }
    /// Writes `values[0]` at `address` and `values[1]` at `address + 8` (STP).
    /// On a fault, memory may be partly written (as with a real STP that
    /// faults), but the simulator leaves registers unchanged.
    fn write_pair(&mut self, address: u64, values: [u64; 2]) -> Result<(), Fault>;
}

/// Unwraps a memory access or returns its fault as a data abort. Written out
/// instead of `?`/`map_err`: those are `core` generics that the kernel would
/// instantiate with sanitizer instrumentation on the hit path.
macro_rules! access {
    ($access:expr) => {
        match $access {
            Ok(value) => value,
            Err(fault) => return Err(Exception::DataAbort(fault)),
        }
    };
}

/// Properties of the probed context that the Arm ARM pseudocode reads from
/// system registers.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct SimulationConfig {
    /// SCTLR_ELx.SA (SA0 for EL0) is set: an SP-based load/store with SP not
    /// 16-byte aligned takes an SP alignment fault (`CheckSPAlignment`).
    pub sp_alignment_check: bool,
    /// The probed instruction is in a BTI-guarded page (affects the BTYPE
    /// that BR writes).
    pub guarded_page: bool,
    /// Top-byte-ignore applies to instruction addresses (TCR_ELx.TBIx = 1 and
    /// TBIDx = 0) for `[lower half, upper half]`: branch targets then get
    /// bits `[63:56]` from bit 55 (`AArch64.BranchAddr` at EL0/EL1).
    pub instruction_tbi: [bool; 2],
}

/// Why a simulated instruction did not complete; registers are unchanged.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Exception {
    /// A memory access faulted.
    DataAbort(Fault),
    /// SP was not 16-byte aligned for an SP-based access with the check on.
    SpAlignment { sp: u64 },
}

impl fmt::Display for Exception {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::DataAbort(fault) => {
                write!(f, "data abort ({:?}) at {:#x}", fault.access, fault.address)
            }
            Self::SpAlignment { sp } => write!(f, "SP alignment fault, SP = {sp:#x}"),
        }
    }
}

/// Executes `insn` on `registers` and `memory` as the CPU would have at
/// `registers.pc()`, leaving the PC at the next instruction to run.
/// On `Err`, no register (PC, SP, PSTATE included) has changed.
#[allow(clippy::question_mark, reason = "`?` is a core generic, instrumented on the hit path: see `access!`")]
#[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
// The probe hit path runs it: a probe inside it is hit from inside a hit, and the nested BRK has
// no owner (the whole-kernel probe sweep found it, `full`, a random set with a simulated probe
// in the heap). In the kernel every instantiation goes to no-probe text, and so does everything
// it calls: its helpers are no-probe text too, and it calls no `core` generic (`full`
// instantiates those instrumented and out of line, in probeable text; the kernel test
// `probe_simulator_calls_only_noprobe_text` checks every branch out of it).
#[cfg_attr(feature = "kernel", unsafe(link_section = ".text.noprobe"))]
#[cfg_attr(feature = "kernel", allow(unsafe_code, reason = "the no-probe link_section above, nothing else"))]
#[inline]
pub fn simulate<R, M>(
    insn: &Simulated,
    registers: &mut R,
    memory: &mut M,
    config: &SimulationConfig,
) -> Result<(), Exception>
where
    R: RegisterFile + ?Sized,
    M: Memory + ?Sized,
{
    let pc = registers.pc();
    let next = pc.wrapping_add(4);
    // `wrapping_add` of the two's-complement offset, not `wrapping_add_signed`: a `core` generic
    // that `full` instantiates instrumented, out of line, in probeable text.
    let relative = |offset: i64| pc.wrapping_add(offset as u64);
    // BTYPE written by this instruction (Arm ARM D8.4 "BTI"): only BR and BLR
    // set a non-zero value.
    let mut btype = 0b00;
    let mut new_pc = next;
    match *insn {
        Simulated::Nop => {}
        Simulated::Branch { offset, link } => {
            if link {
                write_zr(registers, 30, next);
            }
            new_pc = branch_address(relative(offset), config);
        }
        Simulated::BranchConditional { condition, offset } => {
            if condition.holds(nzcv(registers)) {
                new_pc = branch_address(relative(offset), config);
            }
        }
        Simulated::CompareBranch { rt, is_64, if_nonzero, offset } => {
            let operand = read_zr(registers, rt, is_64);
            if (operand != 0) == if_nonzero {
                new_pc = branch_address(relative(offset), config);
            }
        }
        Simulated::TestBranch { rt, bit, if_nonzero, offset } => {
            let operand = read_zr(registers, rt, true);
            if ((operand >> (bit & 63)) & 1 == 1) == if_nonzero {
                new_pc = branch_address(relative(offset), config);
            }
        }
        Simulated::BranchRegister { rn, kind } => {
            // The target is read before BLR writes X30 (BLR X30 is valid).
            let target = read_zr(registers, rn, true);
            btype = match kind {
                IndirectBranch::Br if config.guarded_page && !matches!(rn.0, 16 | 17) => 0b11,
                IndirectBranch::Br => 0b01,
                IndirectBranch::Blr => 0b10,
                IndirectBranch::Ret => 0b00,
            };
            // `matches!`, not the derived `PartialEq` (out of line in `full`, see `relative`).
            if matches!(kind, IndirectBranch::Blr) {
                write_zr(registers, 30, next);
            }
            new_pc = branch_address(target, config);
        }
        Simulated::Adr { rd, offset, page } => {
            let base = if page { pc & !0xfff } else { pc };
            write_zr(registers, rd.0, base.wrapping_add(offset as u64));
        }
        Simulated::LoadLiteral { rt, size, offset } => {
            let address = relative(offset);
            let value = match size {
                LiteralSize::Word => u64::from(access!(memory.read_u32(address))),
                LiteralSize::Doubleword => access!(memory.read_u64(address)),
                LiteralSize::SignedWord => access!(memory.read_u32(address)) as i32 as i64 as u64,
            };
            write_zr(registers, rt.0, value);
        }
        Simulated::LoadStorePair { load, rt, rt2, rn, offset, indexing } => {
            let result = load_store_pair(registers, memory, config, load, [rt, rt2], rn, offset, indexing);
            if let Err(exception) = result {
                return Err(exception);
            }
        }
        Simulated::MoveRegister { rd, rm, is_64 } => {
            let value = read_zr(registers, rm, is_64);
            write_zr(registers, rd.0, value);
        }
        Simulated::AddSubImmediate { rd, rn, immediate, subtract, set_flags, is_64 } => {
            let operand1 = if rn.0 == 31 { registers.sp() } else { registers.x(rn.0) };
            let (operand2, carry_in) = if subtract { (!immediate, true) } else { (immediate, false) };
            let (result, flags) = add_with_carry(operand1, operand2, carry_in, is_64);
            if set_flags {
                let pstate = registers.pstate() & !(0xf << NZCV_SHIFT);
                registers.set_pstate(pstate | (u64::from(flags) << NZCV_SHIFT));
                write_zr(registers, rd.0, result);
            } else if rd.0 == 31 {
                registers.set_sp(result);
            } else {
                registers.set_x(rd.0, result);
            }
        }
    }
    registers.set_pstate((registers.pstate() & !BTYPE_MASK) | (btype << BTYPE_SHIFT));
    registers.set_pc(new_pc);
    Ok(())
}

/// LDP/STP (X registers), C6.2: every check and access happens before the
/// first register write.
#[allow(clippy::too_many_arguments, reason = "the decoded fields of one instruction")]
#[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
#[cfg_attr(feature = "kernel", unsafe(link_section = ".text.noprobe"))]
#[cfg_attr(feature = "kernel", allow(unsafe_code, reason = "the no-probe link_section above, nothing else"))]
fn load_store_pair<R, M>(
    registers: &mut R,
    memory: &mut M,
    config: &SimulationConfig,
    load: bool,
    [rt, rt2]: [Register; 2],
    rn: Register,
    offset: i64,
    indexing: Indexing,
) -> Result<(), Exception>
where
    R: RegisterFile + ?Sized,
    M: Memory + ?Sized,
{
    let base = if rn.0 == 31 {
        let sp = registers.sp();
        // CheckSPAlignment() checks SP itself, before the offset is added.
        if config.sp_alignment_check && sp & 0xf != 0 {
            return Err(Exception::SpAlignment { sp });
        }
        sp
    } else {
        registers.x(rn.0)
    };
    let updated = base.wrapping_add(offset as u64);
    let address = if matches!(indexing, Indexing::PostIndex) { base } else { updated };
    if load {
        let [first, second] = access!(memory.read_pair(address));
        write_zr(registers, rt.0, first);
        write_zr(registers, rt2.0, second);
    } else {
        let values = [read_zr(registers, rt, true), read_zr(registers, rt2, true)];
        access!(memory.write_pair(address, values));
    }
    if !matches!(indexing, Indexing::SignedOffset) {
        if rn.0 == 31 {
            registers.set_sp(updated);
        } else {
            registers.set_x(rn.0, updated);
        }
    }
    Ok(())
}

/// PSTATE.NZCV as a 4-bit value.
#[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
#[cfg_attr(feature = "kernel", unsafe(link_section = ".text.noprobe"))]
#[cfg_attr(feature = "kernel", allow(unsafe_code, reason = "the no-probe link_section above, nothing else"))]
fn nzcv<R: RegisterFile + ?Sized>(registers: &R) -> u8 {
    ((registers.pstate() >> NZCV_SHIFT) & 0xf) as u8
}

/// `X[n]` (or `W[n]` zero-extended) where 31 is the zero register.
#[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
#[cfg_attr(feature = "kernel", unsafe(link_section = ".text.noprobe"))]
#[cfg_attr(feature = "kernel", allow(unsafe_code, reason = "the no-probe link_section above, nothing else"))]
fn read_zr<R: RegisterFile + ?Sized>(registers: &R, n: Register, is_64: bool) -> u64 {
    let value = if n.0 == 31 { 0 } else { registers.x(n.0) };
    if is_64 { value } else { value & 0xffff_ffff }
}

/// `X[n] = value` where 31 is the zero register (the write is discarded).
#[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
#[cfg_attr(feature = "kernel", unsafe(link_section = ".text.noprobe"))]
#[cfg_attr(feature = "kernel", allow(unsafe_code, reason = "the no-probe link_section above, nothing else"))]
fn write_zr<R: RegisterFile + ?Sized>(registers: &mut R, n: u8, value: u64) {
    if n < 31 {
        registers.set_x(n, value);
    }
}

/// `AddWithCarry(x, y, carry_in)` on 32 or 64 bits: the result (zero-extended
/// to 64 bits) and NZCV.
#[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
#[cfg_attr(feature = "kernel", unsafe(link_section = ".text.noprobe"))]
#[cfg_attr(feature = "kernel", allow(unsafe_code, reason = "the no-probe link_section above, nothing else"))]
pub(crate) fn add_with_carry(x: u64, y: u64, carry_in: bool, is_64: bool) -> (u64, u8) {
    let (bits, mask) = if is_64 { (64, u64::MAX) } else { (32, 0xffff_ffff) };
    let (x, y) = (x & mask, y & mask);
    let unsigned_sum = u128::from(x) + u128::from(y) + u128::from(carry_in);
    let result = (unsigned_sum as u64) & mask;
    let signed = |value: u64| -> i128 { i128::from(((value << (64 - bits)) as i64) >> (64 - bits)) };
    let signed_sum = signed(x) + signed(y) + i128::from(carry_in);
    let n = (result >> (bits - 1)) & 1 == 1;
    let z = result == 0;
    let c = u128::from(result) != unsigned_sum;
    let v = signed(result) != signed_sum;
    let flags = (u8::from(n) << 3) | (u8::from(z) << 2) | (u8::from(c) << 1) | u8::from(v);
    (result, flags)
}

/// `AArch64.BranchAddr` for EL0/EL1: with TBI for instruction addresses,
/// bits `[63:56]` of the target become copies of bit 55.
#[cfg_attr(feature = "kernel", unsafe(link_section = ".text.noprobe"))]
#[cfg_attr(feature = "kernel", allow(unsafe_code, reason = "the no-probe link_section above, nothing else"))]
#[inline(always)]
fn branch_address(target: u64, config: &SimulationConfig) -> u64 {
    let upper_half = (target >> 55) & 1 == 1;
    if config.instruction_tbi[usize::from(upper_half)] { (((target << 8) as i64) >> 8) as u64 } else { target }
}
