//! Host tests for `simulate`: each simulated form on a fake register file and
//! memory, with expected results worked out by hand from the Arm ARM (DDI
//! 0487) C6.2 pseudocode. Words were assembled with `llvm-mc`.

use probes::{
    Access, Classification, Condition, Exception, Fault, Insn, Memory, Registers, Simulated, SimulationConfig,
    classify, simulate,
};

/// RAM at `[base, base + len)`; everything else faults.
struct FakeMemory {
    base: u64,
    bytes: Vec<u8>,
}

impl FakeMemory {
    fn new(base: u64, len: usize) -> Self {
        Self { base, bytes: vec![0; len] }
    }

    fn range(&self, address: u64, size: u64, access: Access) -> Result<usize, Fault> {
        let fault = Fault { address, access };
        let offset = address.checked_sub(self.base).ok_or(fault)?;
        let end = offset.checked_add(size).ok_or(fault)?;
        if end > self.bytes.len() as u64 {
            // Report the first byte that is not RAM, as an MMU would.
            let address = self.base + (self.bytes.len() as u64).max(offset);
            return Err(Fault { address, access });
        }
        Ok(offset as usize)
    }

    fn u64_at(&self, address: u64) -> u64 {
        let at = (address - self.base) as usize;
        u64::from_le_bytes(self.bytes[at..at + 8].try_into().unwrap())
    }

    fn put_u64(&mut self, address: u64, value: u64) {
        let at = (address - self.base) as usize;
        self.bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
    }

    fn put_u32(&mut self, address: u64, value: u32) {
        let at = (address - self.base) as usize;
        self.bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
    }
}

impl Memory for FakeMemory {
    fn read_u32(&mut self, address: u64) -> Result<u32, Fault> {
        let at = self.range(address, 4, Access::Read)?;
        Ok(u32::from_le_bytes(self.bytes[at..at + 4].try_into().unwrap()))
    }

    fn read_u64(&mut self, address: u64) -> Result<u64, Fault> {
        let at = self.range(address, 8, Access::Read)?;
        Ok(u64::from_le_bytes(self.bytes[at..at + 8].try_into().unwrap()))
    }

    fn write_pair(&mut self, address: u64, values: [u64; 2]) -> Result<(), Fault> {
        let at = self.range(address, 16, Access::Write)?;
        self.bytes[at..at + 8].copy_from_slice(&values[0].to_le_bytes());
        self.bytes[at + 8..at + 16].copy_from_slice(&values[1].to_le_bytes());
        Ok(())
    }
}

const PC: u64 = 0x4008_1234;
const RAM: u64 = 0x8000_0000;
const NZCV: u64 = 28;
const BTYPE: u64 = 10;

fn decoded(word: u32) -> Simulated {
    match classify(Insn(word)) {
        Classification::Simulate(form) => form,
        other => panic!("{word:#010x}: {other:?}"),
    }
}

fn registers() -> Registers {
    let mut registers = Registers { pc: PC, sp: RAM + 0x100, ..Registers::default() };
    for (n, x) in registers.x.iter_mut().enumerate() {
        *x = 0x1111 * n as u64;
    }
    registers
}

fn run_with(
    word: u32,
    registers: &mut Registers,
    memory: &mut FakeMemory,
    config: &SimulationConfig,
) -> Result<(), Exception> {
    simulate(&decoded(word), registers, memory, config)
}

fn run(word: u32, registers: &mut Registers, memory: &mut FakeMemory) -> Result<(), Exception> {
    run_with(word, registers, memory, &SimulationConfig::default())
}

#[test]
fn push_frame_record() {
    // stp x29, x30, [sp, #-16]!
    let mut memory = FakeMemory::new(RAM, 0x200);
    let mut r = registers();
    let before = r;
    run(0xa9bf_7bfd, &mut r, &mut memory).unwrap();
    assert_eq!(memory.u64_at(RAM + 0xf0), before.x[29]);
    assert_eq!(memory.u64_at(RAM + 0xf8), before.x[30]);
    assert_eq!(r, Registers { sp: RAM + 0xf0, pc: PC + 4, ..before });
}

#[test]
fn pop_frame_record() {
    // ldp x29, x30, [sp], #16
    let mut memory = FakeMemory::new(RAM, 0x200);
    memory.put_u64(RAM + 0x100, 0xfeed);
    memory.put_u64(RAM + 0x108, 0xbeef);
    let mut r = registers();
    let mut expected = r;
    run(0xa8c1_7bfd, &mut r, &mut memory).unwrap();
    expected.x[29] = 0xfeed;
    expected.x[30] = 0xbeef;
    expected.sp = RAM + 0x110;
    expected.pc = PC + 4;
    assert_eq!(r, expected);
}

#[test]
fn pair_fault_leaves_registers_unchanged() {
    // stp x29, x30, [sp, #-16]! with the second doubleword outside RAM.
    let mut memory = FakeMemory::new(RAM, 0x200);
    let mut r = registers();
    r.sp = RAM + 0x208;
    let before = r;
    let error = run(0xa9bf_7bfd, &mut r, &mut memory).unwrap_err();
    assert_eq!(error, Exception::DataAbort(Fault { address: RAM + 0x200, access: Access::Write }));
    assert_eq!(r, before);
    // ldp x29, x30, [sp], #16 below RAM.
    r.sp = RAM - 16;
    let before = r;
    let error = run(0xa8c1_7bfd, &mut r, &mut memory).unwrap_err();
    assert!(matches!(error, Exception::DataAbort(Fault { access: Access::Read, .. })));
    assert_eq!(r, before);
}

#[test]
fn sp_alignment_is_checked_on_sp_before_the_offset() {
    let mut memory = FakeMemory::new(RAM, 0x400);
    let checked = SimulationConfig { sp_alignment_check: true, ..SimulationConfig::default() };
    let mut r = registers();
    r.sp = RAM + 0x108; // 8-aligned only: sp - 16 is a valid address.
    let before = r;
    let error = run_with(0xa9bf_7bfd, &mut r, &mut memory, &checked).unwrap_err();
    assert_eq!(error, Exception::SpAlignment { sp: RAM + 0x108 });
    assert_eq!(r, before);
    // Without SCTLR.SA the same push succeeds.
    run(0xa9bf_7bfd, &mut r, &mut memory).unwrap();
    assert_eq!(r.sp, RAM + 0xf8);
    // An Xn base is never SP-alignment checked: stp x0, x1, [x2, #504].
    let mut r = registers();
    r.x[2] = RAM + 1;
    run_with(0xa91f_8440, &mut r, &mut memory, &checked).unwrap();
    assert_eq!(memory.u64_at(RAM + 1 + 504), r.x[0]);
}

#[test]
fn pair_offsets_and_register_31() {
    let mut memory = FakeMemory::new(RAM, 0x1000);
    // stp x0, x1, [x2, #-512]: the minimum offset, no writeback.
    let mut r = registers();
    r.x[2] = RAM + 0x800;
    let before = r;
    run(0xa920_0440, &mut r, &mut memory).unwrap();
    assert_eq!(memory.u64_at(RAM + 0x600), before.x[0]);
    assert_eq!(memory.u64_at(RAM + 0x608), before.x[1]);
    assert_eq!(r, Registers { pc: PC + 4, ..before });
    // stp xzr, xzr, [sp, #-16]!: Rt = 31 stores zero, Rn = 31 is SP.
    let mut r = registers();
    r.sp = RAM + 0x100;
    memory.put_u64(RAM + 0xf0, 7);
    run(0xa9bf_7fff, &mut r, &mut memory).unwrap();
    assert_eq!((memory.u64_at(RAM + 0xf0), memory.u64_at(RAM + 0xf8)), (0, 0));
    assert_eq!(r.sp, RAM + 0xf0);
    // ldp x3, x4, [sp, #8]: signed offset, SP unchanged.
    memory.put_u64(RAM + 0xf8, 0x33);
    memory.put_u64(RAM + 0x100, 0x44);
    run(0xa940_93e3, &mut r, &mut memory).unwrap();
    assert_eq!((r.x[3], r.x[4], r.sp), (0x33, 0x44, RAM + 0xf0));
    // An address that wraps below zero faults instead of panicking.
    let mut r = registers();
    r.x[2] = 0x100;
    let error = run(0xa920_0440, &mut r, &mut memory).unwrap_err();
    assert_eq!(error, Exception::DataAbort(Fault { address: 0x100u64.wrapping_sub(512), access: Access::Write }));
}

#[test]
fn move_register() {
    let mut memory = FakeMemory::new(RAM, 0);
    let mut r = registers();
    r.x[1] = 0xffff_ffff_1234_5678;
    run(0x2a01_03e0, &mut r, &mut memory).unwrap(); // mov w0, w1: zero-extends
    assert_eq!(r.x[0], 0x1234_5678);
    run(0xaa01_03e0, &mut r, &mut memory).unwrap(); // mov x0, x1
    assert_eq!(r.x[0], 0xffff_ffff_1234_5678);
    run(0xaa1f_03e0, &mut r, &mut memory).unwrap(); // mov x0, xzr
    assert_eq!(r.x[0], 0);
    assert_eq!(r.pc, PC + 12);
}

#[test]
fn add_sub_immediate_with_sp() {
    let mut memory = FakeMemory::new(RAM, 0);
    let mut r = registers();
    r.x[1] = 0x1000;
    run(0x9100_003f, &mut r, &mut memory).unwrap(); // mov sp, x1
    assert_eq!(r.sp, 0x1000);
    run(0xd100_43ff, &mut r, &mut memory).unwrap(); // sub sp, sp, #16
    assert_eq!(r.sp, 0xff0);
    run(0xd140_07ff, &mut r, &mut memory).unwrap(); // sub sp, sp, #1, lsl #12
    assert_eq!(r.sp, 0xffff_ffff_ffff_fff0);
    run(0x9100_03e1, &mut r, &mut memory).unwrap(); // mov x1, sp
    assert_eq!(r.x[1], 0xffff_ffff_ffff_fff0);
    // add w0, w1, #4095: 32-bit wrap, zero-extended, flags untouched.
    r.x[1] = 0xffff_ffff;
    r.pstate = 0b1010 << NZCV;
    run(0x113f_fc20, &mut r, &mut memory).unwrap();
    assert_eq!(r.x[0], 0xffe);
    assert_eq!(r.pstate, 0b1010 << NZCV);
    // 32-bit write to SP: mov wsp, w1 (add wsp, w1, #0) zero-extends.
    r.x[1] = 0xdead_beef_8000_0000;
    run(0x1100_003f, &mut r, &mut memory).unwrap();
    assert_eq!(r.sp, 0x8000_0000);
}

fn flags_after(word: u32, set: impl FnOnce(&mut Registers)) -> (u64, Registers) {
    let mut memory = FakeMemory::new(RAM, 0);
    let mut r = registers();
    r.pstate = (0b1111 << NZCV) | 0x3c5; // other bits must survive
    set(&mut r);
    run(word, &mut r, &mut memory).unwrap();
    assert_eq!(r.pstate & !(0xf << NZCV), 0x3c5 & !(0b11 << BTYPE));
    ((r.pstate >> NZCV) & 0xf, r)
}

#[test]
fn add_sub_flags_follow_add_with_carry() {
    // adds x0, x1, #1: signed overflow 0x7fff... + 1.
    let (nzcv, r) = flags_after(0xb100_0420, |r| r.x[1] = i64::MAX as u64);
    assert_eq!((nzcv, r.x[0]), (0b1001, 1 << 63));
    // adds x0, x1, #1: unsigned carry out, zero result.
    let (nzcv, r) = flags_after(0xb100_0420, |r| r.x[1] = u64::MAX);
    assert_eq!((nzcv, r.x[0]), (0b0110, 0));
    // cmp w2, #0 with w2 = 0: x + NOT(0) + 1 carries out; Z set.
    let (nzcv, r) = flags_after(0x7100_005f, |r| r.x[2] = 0xffff_ffff_0000_0000);
    assert_eq!(nzcv, 0b0110);
    assert_eq!(r.x[2], 0xffff_ffff_0000_0000); // Rd = 31 is WZR: nothing written
    // cmn x3, #1 with x3 = -1: result 0, carry out.
    let (nzcv, _) = flags_after(0xb100_047f, |r| r.x[3] = u64::MAX);
    assert_eq!(nzcv, 0b0110);
    // cmp sp, #4095, lsl #12 with SP = 0x1000: borrow (C clear), negative.
    let (nzcv, r) = flags_after(0xf17f_ffff, |r| r.sp = 0x1000);
    assert_eq!(nzcv, 0b1000);
    assert_eq!(r.sp, 0x1000); // Rd = 31 with S is XZR, not SP
    // cmp w2, #0 with w2 = 0x8000_0000: negative, no overflow.
    let (nzcv, _) = flags_after(0x7100_005f, |r| r.x[2] = 0x8000_0000);
    assert_eq!(nzcv, 0b1010);
}

#[test]
fn immediate_branches() {
    let mut memory = FakeMemory::new(RAM, 0);
    let mut r = registers();
    run(0x1400_0000, &mut r, &mut memory).unwrap(); // b #0: to itself
    assert_eq!(r.pc, PC);
    run(0x9400_0001, &mut r, &mut memory).unwrap(); // bl #4
    assert_eq!((r.pc, r.x[30]), (PC + 4, PC + 4));
    let mut r = registers();
    run(0x15ff_ffff, &mut r, &mut memory).unwrap(); // last reachable target
    assert_eq!(r.pc, PC + (1 << 27) - 4);
    let mut r = registers();
    run(0x1600_0000, &mut r, &mut memory).unwrap(); // first reachable target
    assert_eq!(r.pc, PC - (1 << 27));
}

#[test]
fn condition_holds_matches_the_arm_arm_table() {
    for nzcv in 0u8..16 {
        let (n, z, c, v) = (nzcv & 8 != 0, nzcv & 4 != 0, nzcv & 2 != 0, nzcv & 1 != 0);
        let expected = [
            z,               // EQ
            !z,              // NE
            c,               // CS
            !c,              // CC
            n,               // MI
            !n,              // PL
            v,               // VS
            !v,              // VC
            c && !z,         // HI
            !(c && !z),      // LS
            n == v,          // GE
            n != v,          // LT
            !z && n == v,    // GT
            !(!z && n == v), // LE
            true,            // AL
            true,            // NV behaves as AL
        ];
        for (bits, expected) in expected.into_iter().enumerate() {
            assert_eq!(Condition::from_field(bits as u8).holds(nzcv), expected, "{bits} {nzcv:04b}");
        }
    }
}

#[test]
fn conditional_branches() {
    let mut memory = FakeMemory::new(RAM, 0);
    let mut r = registers();
    r.pstate = 0b0100 << NZCV; // Z
    run(0x5400_0040, &mut r, &mut memory).unwrap(); // b.eq #8: taken
    assert_eq!(r.pc, PC + 8);
    r.pc = PC;
    r.pstate = 0;
    run(0x5400_0040, &mut r, &mut memory).unwrap(); // not taken
    assert_eq!(r.pc, PC + 4);
    r.pc = PC;
    run(0x5400_006f, &mut r, &mut memory).unwrap(); // b.nv #12: always
    assert_eq!(r.pc, PC + 12);
    r.pc = PC;
    run(0x54ff_ffee, &mut r, &mut memory).unwrap(); // b.al #-4
    assert_eq!(r.pc, PC - 4);
    r.pc = PC;
    run(0x5400_0091, &mut r, &mut memory).unwrap(); // bc.ne #16, Z clear
    assert_eq!(r.pc, PC + 16);
}

#[test]
fn compare_and_test_branches() {
    let mut memory = FakeMemory::new(RAM, 0);
    let mut r = registers();
    r.x[0] = 0;
    run(0xb47f_ffe0, &mut r, &mut memory).unwrap(); // cbz x0, #1048572
    assert_eq!(r.pc, PC + (1 << 20) - 4);
    // cbnz w1, #-1048576 with only bit 32 set: W1 is zero, not taken.
    let mut r = registers();
    r.x[1] = 1 << 32;
    run(0x3580_0001, &mut r, &mut memory).unwrap();
    assert_eq!(r.pc, PC + 4);
    r.pc = PC;
    r.x[1] = 1;
    run(0x3580_0001, &mut r, &mut memory).unwrap();
    assert_eq!(r.pc, PC - (1 << 20));
    // cbz xzr, #8: register 31 is the zero register, always taken.
    let mut r = registers();
    run(0xb400_005f, &mut r, &mut memory).unwrap();
    assert_eq!(r.pc, PC + 8);
    // tbz x2, #63, #32764
    let mut r = registers();
    r.x[2] = 1 << 63;
    run(0xb6fb_ffe2, &mut r, &mut memory).unwrap();
    assert_eq!(r.pc, PC + 4);
    r.pc = PC;
    r.x[2] = !(1 << 63);
    run(0xb6fb_ffe2, &mut r, &mut memory).unwrap();
    assert_eq!(r.pc, PC + (1 << 15) - 4);
    // tbnz w3, #0, #-32768
    let mut r = registers();
    r.x[3] = 1;
    run(0x3704_0003, &mut r, &mut memory).unwrap();
    assert_eq!(r.pc, PC - (1 << 15));
}

#[test]
fn register_branches_and_btype() {
    let mut memory = FakeMemory::new(RAM, 0);
    let guarded = SimulationConfig { guarded_page: true, ..SimulationConfig::default() };
    let btype = |r: &Registers| (r.pstate >> BTYPE) & 0b11;
    // br x16 in a guarded page: BTYPE 01 (x16/x17 may target "BTI c").
    let mut r = registers();
    run_with(0xd61f_0200, &mut r, &mut memory, &guarded).unwrap();
    assert_eq!((r.pc, btype(&r)), (0x1111 * 16, 0b01));
    // br x16 built from another register number: br x1 is encoded 0xd61f0020.
    let mut r = registers();
    run_with(0xd61f_0020, &mut r, &mut memory, &guarded).unwrap();
    assert_eq!((r.pc, btype(&r)), (0x1111, 0b11));
    let mut r = registers();
    run(0xd61f_0020, &mut r, &mut memory).unwrap();
    assert_eq!(btype(&r), 0b01);
    // blr x30: the target is read before X30 is written.
    let mut r = registers();
    let target = r.x[30];
    run(0xd63f_03c0, &mut r, &mut memory).unwrap();
    assert_eq!((r.pc, r.x[30], btype(&r)), (target, PC + 4, 0b10));
    // ret clears BTYPE; ret x1.
    let mut r = registers();
    r.pstate = 0b11 << BTYPE;
    run(0xd65f_0020, &mut r, &mut memory).unwrap();
    assert_eq!((r.pc, btype(&r)), (0x1111, 0));
    // br xzr: register 31 is the zero register.
    let mut r = registers();
    run(0xd61f_03e0, &mut r, &mut memory).unwrap();
    assert_eq!(r.pc, 0);
}

#[test]
fn branch_targets_drop_the_tag_with_instruction_tbi() {
    let mut memory = FakeMemory::new(RAM, 0);
    let tbi = SimulationConfig { instruction_tbi: [true, true], ..SimulationConfig::default() };
    let mut r = registers();
    r.x[0] = 0x5a00_0000_1234_5678;
    run_with(0xd61f_0000, &mut r, &mut memory, &tbi).unwrap(); // br x0
    assert_eq!(r.pc, 0x0000_0000_1234_5678);
    let mut r = registers();
    r.x[0] = 0x5aff_8000_0000_1000; // upper half (bit 55 set)
    run_with(0xd61f_0000, &mut r, &mut memory, &tbi).unwrap();
    assert_eq!(r.pc, 0xffff_8000_0000_1000);
    let mut r = registers();
    r.x[0] = 0x5a00_0000_1234_5678;
    run(0xd61f_0000, &mut r, &mut memory).unwrap(); // TBI off: kept
    assert_eq!(r.pc, 0x5a00_0000_1234_5678);
}

#[test]
fn adr_and_adrp() {
    let mut memory = FakeMemory::new(RAM, 0);
    let mut r = registers();
    run(0x707f_ffe0, &mut r, &mut memory).unwrap(); // adr x0, #1048575
    assert_eq!(r.x[0], PC + 0xf_ffff);
    r.pc = PC;
    run(0x1080_0000, &mut r, &mut memory).unwrap(); // adr x0, #-1048576
    assert_eq!(r.x[0], PC - 0x10_0000);
    r.pc = PC;
    run(0xf07f_ffe0, &mut r, &mut memory).unwrap(); // adrp x0, #4294963200
    assert_eq!(r.x[0], 0x4008_1000 + 0xffff_f000);
    r.pc = PC;
    run(0x9080_0001, &mut r, &mut memory).unwrap(); // adrp x1, #-4294967296
    assert_eq!(r.x[1], 0x4008_1000u64.wrapping_sub(1 << 32));
    assert_eq!(r.pc, PC + 4);
}

#[test]
fn literal_loads() {
    let mut memory = FakeMemory::new(PC - 0x100, 0x200);
    memory.put_u64(PC + 8, 0x8765_4321_8000_0001);
    memory.put_u64(PC - 8, 0x0123_4567_89ab_cdef);
    let mut r = registers();
    run(0x1800_0040, &mut r, &mut memory).unwrap(); // ldr w0, #8: zero-extends
    assert_eq!(r.x[0], 0x8000_0001);
    r.pc = PC;
    run(0x58ff_ffc0, &mut r, &mut memory).unwrap(); // ldr x0, #-8
    assert_eq!(r.x[0], 0x0123_4567_89ab_cdef);
    // ldrsw x0, #8 (0x98000040): sign-extends.
    r.pc = PC;
    run(0x9800_0040, &mut r, &mut memory).unwrap();
    assert_eq!(r.x[0], 0xffff_ffff_8000_0001);
    // ldr xzr, #4: the load happens, the result is discarded.
    r.pc = PC;
    let before = r;
    run(0x5800_003f, &mut r, &mut memory).unwrap();
    assert_eq!(r, Registers { pc: PC + 4, ..before });
    // ldrsw x0, #1048572: outside memory, faults, X0 unchanged.
    r.pc = PC;
    memory.put_u32(PC, 0);
    let before = r;
    let error = run(0x987f_ffe0, &mut r, &mut memory).unwrap_err();
    assert_eq!(error, Exception::DataAbort(Fault { address: PC + 0xf_fffc, access: Access::Read }));
    assert_eq!(r, before);
}

#[test]
fn nop_keeps_pstate_but_clears_btype() {
    let mut memory = FakeMemory::new(RAM, 0);
    let mut r = registers();
    r.pstate = (0b1001 << NZCV) | (0b11 << BTYPE) | 0x3c5;
    let before = r;
    run(0xd503_201f, &mut r, &mut memory).unwrap();
    assert_eq!(r, Registers { pc: PC + 4, pstate: before.pstate & !(0b11 << BTYPE), ..before });
}
