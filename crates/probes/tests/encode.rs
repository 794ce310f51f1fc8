//! Host tests for the encoders: exact words, range limits, and a round trip
//! through `classify` and `simulate`.

use probes::{
    BRANCH_MAX_BACKWARD, BRANCH_MAX_FORWARD, BranchError, Classification, Fault, Insn, Memory, NOP, Registers,
    Simulated, SimulationConfig, classify, encode_b, encode_bl, encode_brk, is_b, simulate,
};

struct NoMemory;

impl Memory for NoMemory {
    fn read_u32(&mut self, address: u64) -> Result<u32, Fault> {
        Err(Fault { address, access: probes::Access::Read })
    }
    fn read_u64(&mut self, address: u64) -> Result<u64, Fault> {
        Err(Fault { address, access: probes::Access::Read })
    }
    fn write_pair(&mut self, address: u64, _: [u64; 2]) -> Result<(), Fault> {
        Err(Fault { address, access: probes::Access::Write })
    }
}

#[test]
fn nop_and_brk() {
    assert_eq!(NOP, Insn(0xd503_201f));
    assert_eq!(classify(NOP), Classification::Simulate(Simulated::Nop));
    // brk #0x4 (Linux's kprobe immediate), as llvm-mc encodes it.
    assert_eq!(encode_brk(0x004), Insn(0xd420_0080));
    for imm16 in 0..=u16::MAX {
        assert_eq!(encode_brk(imm16).brk_immediate(), Some(imm16));
    }
    assert_eq!(Insn(0xd440_0000).brk_immediate(), None); // hlt #0
    assert_eq!(NOP.brk_immediate(), None);
}

#[test]
fn b_is_told_from_bl_and_brk() {
    let from = 0xffff_8000_1000_0000;
    for to in [from, from + (1 << 27) - 4, from - (1 << 27)] {
        assert!(is_b(encode_b(from, to).unwrap().0));
        assert!(!is_b(encode_bl(from, to).unwrap().0));
    }
    assert!(!is_b(encode_brk(0x004).0));
    assert!(!is_b(NOP.0));
}

#[test]
fn branch_words() {
    let from = 0xffff_8000_1000_0000;
    assert_eq!(encode_b(from, from), Ok(Insn(0x1400_0000)));
    assert_eq!(encode_bl(0x1000, 0x1004), Ok(Insn(0x9400_0001)));
    // The last and first reachable targets.
    assert_eq!(encode_b(from, from + (1 << 27) - 4), Ok(Insn(0x15ff_ffff)));
    assert_eq!(encode_b(from, from - (1 << 27)), Ok(Insn(0x1600_0000)));
    assert_eq!(encode_bl(from, from - (1 << 27)), Ok(Insn(0x9600_0000)));
    // PC arithmetic wraps modulo 2^64.
    assert_eq!(encode_b(0, u64::MAX - 3), Ok(Insn(0x17ff_ffff)));
    assert_eq!(encode_b(u64::MAX - 3, 0), Ok(Insn(0x1400_0001)));
}

#[test]
fn out_of_range_and_misaligned_branches_are_errors() {
    let from = 0x4000_0000u64;
    for to in [from + (1 << 27), from - (1 << 27) - 4, from + (1 << 40), 0] {
        assert_eq!(encode_b(from, to), Err(BranchError::OutOfRange { from, to }));
        assert_eq!(encode_bl(from, to), Err(BranchError::OutOfRange { from, to }));
    }
    assert_eq!(encode_b(from + 2, from), Err(BranchError::Misaligned { from: from + 2, to: from }));
    assert_eq!(encode_b(from, from + 1), Err(BranchError::Misaligned { from, to: from + 1 }));
    assert!(BranchError::OutOfRange { from, to: 0 }.to_string().contains("128 MiB"));
}

#[test]
fn encoded_branches_land_where_asked() {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for _ in 0..10_000 {
        let from = next() & !3;
        let offset = (next() as i64 >> 36) & !3; // within about +-128 MiB
        let to = from.wrapping_add_signed(offset);
        let result = encode_bl(from, to);
        if !(BRANCH_MAX_BACKWARD..=BRANCH_MAX_FORWARD).contains(&offset) {
            assert!(result.is_err());
            continue;
        }
        let Classification::Simulate(form) = classify(result.unwrap()) else { panic!() };
        let mut registers = Registers { pc: from, ..Registers::default() };
        simulate(&form, &mut registers, &mut NoMemory, &SimulationConfig::default()).unwrap();
        assert_eq!((registers.pc, registers.x[30]), (to, from.wrapping_add(4)));
    }
}
