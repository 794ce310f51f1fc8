//! Host test of the detour relocator: every PC-relative form it accepts, relocated into a
//! trampoline and run there through the crate's simulator, must have the effect the original
//! instruction has at its original address (registers, flags, memory written and loaded, next
//! PC), at the edges
//! of each form's offset range. Input words are encoded here by hand from the Arm ARM C6.2
//! layouts, independently of the crate's encoders.

use std::collections::HashMap;

use probes::{
    Classification, Fault, Insn, LITERAL_POOL, Memory, RegisterFile, Registers, RelocateError, Simulated,
    SimulationConfig, TRAMPOLINE_WORDS, Trampoline, classify, encode_brk, relocate, simulate,
};

/// Sparse memory: written bytes, and a fixed pseudo-random byte everywhere else, so that loads
/// from any address give the same value to the original and to the relocated sequence.
#[derive(Clone, Default, PartialEq, Eq, Debug)]
struct SparseMemory {
    written: HashMap<u64, u8>,
    /// Every load's address and size in bytes, in order (a load into XZR leaves no other trace).
    loads: Vec<(u64, u8)>,
}

fn background(address: u64) -> u8 {
    (address.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as u8
}

impl SparseMemory {
    fn byte(&self, address: u64) -> u8 {
        self.written.get(&address).copied().unwrap_or_else(|| background(address))
    }
    fn bytes<const N: usize>(&self, address: u64) -> [u8; N] {
        core::array::from_fn(|index| self.byte(address.wrapping_add(index as u64)))
    }
    fn put(&mut self, address: u64, bytes: &[u8]) {
        for (index, &byte) in bytes.iter().enumerate() {
            self.written.insert(address.wrapping_add(index as u64), byte);
        }
    }
}

impl Memory for SparseMemory {
    fn read_u32(&mut self, address: u64) -> Result<u32, Fault> {
        self.loads.push((address, 4));
        Ok(u32::from_le_bytes(self.bytes(address)))
    }
    fn read_u64(&mut self, address: u64) -> Result<u64, Fault> {
        self.loads.push((address, 8));
        Ok(u64::from_le_bytes(self.bytes(address)))
    }
    fn write_pair(&mut self, address: u64, values: [u64; 2]) -> Result<(), Fault> {
        self.put(address, &values[0].to_le_bytes());
        self.put(address.wrapping_add(8), &values[1].to_le_bytes());
        Ok(())
    }
}

/// The kernel's EL1 configuration (kprobes' hit path).
const CONFIG: SimulationConfig =
    SimulationConfig { sp_alignment_check: true, guarded_page: false, instruction_tbi: [true, true] };
const NZCV_MASK: u64 = 0xf << 28;
const BTYPE_MASK: u64 = 3 << 10;
const MIB: i64 = 1 << 20;
/// The probed address: kernel text, not page-aligned (ADRP must drop the low bits).
const ADDRESS: u64 = 0xffff_0000_4012_3a5c;
/// Where trampolines sit relative to the probe (before, after, far after), clear of every
/// target the tests branch to or load from.
const TRAMPOLINE_DELTAS: [i64; 3] = [-0x4000, 0x10_1000, 100 * MIB];

fn initial_registers(pc: u64, seed: u64) -> Registers {
    let mut registers = Registers::default();
    for (n, x) in registers.x.iter_mut().enumerate() {
        *x = (n as u64 + 1).wrapping_mul(0x0101_0101_0101_0101) ^ seed;
    }
    registers.sp = 0xffff_0000_8000_0000;
    registers.pc = pc;
    registers.pstate = 0x3c5 | (seed & 0xf) << 28;
    registers
}

/// Performs the one word at the PC. The trampoline's loads through a register (`LDR Xt, [Xt]`
/// and its W/SW forms) are stepped, not simulated, by the crate: they are modelled here from
/// C6.2 "LDR (immediate)" and "LDRSW (immediate)", unsigned offset.
fn execute(word: u32, registers: &mut Registers, memory: &mut SparseMemory) {
    match classify(Insn(word)) {
        Classification::Simulate(form) => simulate(&form, registers, memory, &CONFIG).expect("no fault"),
        Classification::StepOutOfLine => {
            let (rt, rn, immediate) = (word & 31, (word >> 5) & 31, u64::from((word >> 10) & 0xfff));
            let base = if rn == 31 { registers.sp } else { registers.x[rn as usize] };
            let value = match word & 0xffc0_0000 {
                0xf940_0000 => memory.read_u64(base + 8 * immediate).unwrap(),
                0xb940_0000 => u64::from(memory.read_u32(base + 4 * immediate).unwrap()),
                0xb980_0000 => memory.read_u32(base + 4 * immediate).unwrap() as i32 as i64 as u64,
                _ => panic!("{word:#010x}: not a form the relocator emits"),
            };
            if rt != 31 {
                registers.x[rt as usize] = value;
            }
            registers.pc += 4;
        }
        Classification::Reject(reason) => panic!("{word:#010x} at {:#x} in a trampoline: {reason:?}", registers.pc),
    }
}

/// What the original does at `ADDRESS`, and what the relocated sequence does from `base`.
fn compare(word: u32, base: u64, seed: u64, registers_setup: impl Fn(&mut Registers)) -> Result<(), RelocateError> {
    let classification = classify(Insn(word));
    let Classification::Simulate(form) = classification else { panic!("{word:#010x}: {classification:?}") };

    let mut expected = initial_registers(ADDRESS, seed);
    registers_setup(&mut expected);
    let mut relocated = expected;
    relocated.pc = base;
    let mut expected_memory = SparseMemory::default();
    simulate(&form, &mut expected, &mut expected_memory, &CONFIG).expect("original does not fault");

    let mut trampoline = Trampoline::new(base, encode_brk(0x006).0);
    relocate(&mut trampoline, ADDRESS, word, &classification)?;
    let mut memory = SparseMemory::default();
    for (index, word) in trampoline.words().iter().enumerate() {
        memory.put(base + 4 * index as u64, &word.to_le_bytes());
    }
    let chunk = base..base + 4 * TRAMPOLINE_WORDS as u64;
    let mut steps = 0;
    while chunk.contains(&relocated.pc) {
        let at = relocated.pc;
        assert!(at < base + 4 * LITERAL_POOL as u64, "{word:#010x}: ran into the literal pool at {at:#x}");
        let fetched = u32::from_le_bytes(memory.bytes(at));
        execute(fetched, &mut relocated, &mut memory);
        steps += 1;
        assert!(steps <= 8, "{word:#010x}: relocated sequence does not leave the trampoline");
    }
    // BLR becomes `LDR X30, =next; BR Xn`: BR writes BTYPE 01 where BLR writes 10 (the kernel
    // is not built with BTI, so nothing checks it); every other bit must agree.
    let pstate_mask = match form {
        Simulated::BranchRegister { kind: probes::IndirectBranch::Blr, .. } => !BTYPE_MASK,
        _ => !0,
    };
    let context = format!("{word:#010x} ({form:?}) from trampoline {base:#x}, seed {seed:#x}");
    assert_eq!(relocated.pc, expected.pc, "next PC: {context}");
    assert_eq!(relocated.x, expected.x, "x0..x30: {context}");
    assert_eq!(relocated.sp, expected.sp, "sp: {context}");
    assert_eq!(relocated.pstate & pstate_mask, expected.pstate & pstate_mask, "pstate: {context}");
    assert_eq!(relocated.pstate & NZCV_MASK, expected.pstate & NZCV_MASK);
    memory.written.retain(|address, _| !chunk.contains(address));
    assert_eq!(memory.written, expected_memory.written, "memory: {context}");
    // The trampoline's own literals are the relocation's business; every other load must stay.
    memory.loads.retain(|(address, _)| !chunk.contains(address));
    assert_eq!(memory.loads, expected_memory.loads, "loads: {context}");
    Ok(())
}

/// Relocates and compares; a refusal is allowed only when a branch between the trampoline and
/// `target` really cannot reach (with slack for the branch's position in the trampoline).
fn check(word: u32, target: u64, seeds: &[u64], setup: impl Fn(&mut Registers, u64) + Copy) -> usize {
    let mut compared = 0;
    for delta in TRAMPOLINE_DELTAS {
        let base = ADDRESS.wrapping_add_signed(delta) & !0x1ff;
        for &seed in seeds {
            match compare(word, base, seed, |registers| setup(registers, seed)) {
                Ok(()) => compared += 1,
                Err(RelocateError::OutOfBranchRange) => {
                    let distance = target.wrapping_sub(base) as i64;
                    assert!(
                        !(-(128 * MIB) + 0x200..=128 * MIB - 0x200).contains(&distance),
                        "{word:#010x}: refused a reachable target {target:#x} from {base:#x}"
                    );
                }
                Err(RelocateError::LiteralOutOfRange) => {
                    let distance = target.wrapping_sub(base) as i64;
                    assert!(
                        !(-MIB + 0x200..=MIB - 0x200).contains(&distance),
                        "{word:#010x}: refused a reachable literal {target:#x} from {base:#x}"
                    );
                }
                Err(error) => panic!("{word:#010x}: {error:?}"),
            }
        }
    }
    compared
}

fn no_setup(_: &mut Registers, _: u64) {}

fn target(offset: i64) -> u64 {
    ADDRESS.wrapping_add_signed(offset)
}

const ALL_FLAGS: [u64; 16] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15];

#[test]
fn b_and_bl_at_every_edge() {
    let offsets = [-128 * MIB, -128 * MIB + 4, -4, 0, 4, 8, 64 * MIB, 128 * MIB - 4];
    let mut compared = 0;
    for offset in offsets {
        for link in [false, true] {
            let word = (u32::from(link) << 31) | 0x1400_0000 | ((offset >> 2) as u32 & 0x03ff_ffff);
            compared += check(word, target(offset), &[0], no_setup);
        }
    }
    assert!(compared >= 36, "{compared}");
}

#[test]
fn b_cond_every_condition_and_flags() {
    let offsets = [-MIB, -MIB + 4, -4, 0, 4, 8, MIB - 4];
    let mut compared = 0;
    for offset in offsets {
        for condition in 0..16 {
            let word = 0x5400_0000 | (((offset >> 2) as u32 & 0x7ffff) << 5) | condition;
            compared += check(word, target(offset), &ALL_FLAGS, no_setup);
        }
    }
    assert_eq!(compared, 7 * 16 * 16 * 3);
}

#[test]
fn cbz_cbnz_both_sizes() {
    let offsets = [-MIB, -4, 0, 8, MIB - 4];
    let values = [0, 1, 0x1_0000_0000, 0x8000_0000, u64::MAX];
    let mut compared = 0;
    for offset in offsets {
        for (is_64, if_nonzero, rt) in
            [(false, false, 0), (true, false, 5), (false, true, 30), (true, true, 17), (true, false, 31)]
        {
            let word = (u32::from(is_64) << 31)
                | 0x3400_0000
                | (u32::from(if_nonzero) << 24)
                | (((offset >> 2) as u32 & 0x7ffff) << 5)
                | rt;
            let seeds: Vec<u64> = (0..values.len() as u64).collect();
            compared += check(word, target(offset), &seeds, move |registers, seed| {
                if rt != 31 {
                    registers.x[rt as usize] = values[seed as usize];
                }
            });
        }
    }
    assert_eq!(compared, 5 * 5 * 5 * 3);
}

#[test]
fn tbz_tbnz_low_and_high_bits() {
    let offsets = [-32 * 1024, -4, 0, 8, 32 * 1024 - 4];
    let mut compared = 0;
    for offset in offsets {
        for bit in [0u32, 5, 31, 32, 47, 63] {
            for if_nonzero in [false, true] {
                let rt = 3 + bit % 20;
                let word = ((bit >> 5) << 31)
                    | 0x3600_0000
                    | (u32::from(if_nonzero) << 24)
                    | ((bit & 31) << 19)
                    | (((offset >> 2) as u32 & 0x3fff) << 5)
                    | rt;
                compared += check(word, target(offset), &[0, 1], move |registers, seed| {
                    let value = registers.x[rt as usize];
                    registers.x[rt as usize] = if seed == 0 { value & !(1 << bit) } else { value | 1 << bit };
                });
            }
        }
    }
    assert_eq!(compared, 5 * 6 * 2 * 2 * 3);
}

#[test]
fn adr_and_adrp_at_every_edge() {
    let mut compared = 0;
    for offset in [-MIB, -MIB + 1, -1, 0, 3, MIB - 1] {
        for rd in [0, 17, 30, 31] {
            let immediate = offset as u32;
            let word = ((immediate & 3) << 29) | 0x1000_0000 | (((immediate >> 2) & 0x7ffff) << 5) | rd;
            compared += check(word, target(0), &[0], no_setup);
        }
    }
    for pages in [-(1i64 << 20), -(1 << 20) + 1, -1, 0, 1, (1 << 20) - 1] {
        for rd in [0, 9, 30, 31] {
            let immediate = pages as u32;
            let word = (1 << 31) | ((immediate & 3) << 29) | 0x1000_0000 | (((immediate >> 2) & 0x7ffff) << 5) | rd;
            compared += check(word, target(0), &[0], no_setup);
        }
    }
    assert_eq!(compared, 2 * 6 * 4 * 3);
}

#[test]
fn load_literal_every_size() {
    let mut compared = 0;
    for offset in [-MIB, -4, 0, 4, 12, MIB - 4] {
        for opc in [0u32, 1, 2] {
            for rt in [0, 16, 30, 31] {
                let word = (opc << 30) | 0x1800_0000 | (((offset >> 2) as u32 & 0x7ffff) << 5) | rt;
                compared += check(word, target(offset), &[0], no_setup);
            }
        }
    }
    // LDR XZR reaches its literal PC-relative from the trampoline: of the 6 offsets x 3
    // trampolines, 6 are within +-1 MiB of it, the others are refused.
    assert_eq!(compared, 6 * 3 * 3 * 3 + 3 * 6);
}

#[test]
fn register_branches_and_position_independent_forms() {
    let mut compared = 0;
    for rn in [0u32, 16, 29] {
        for opcode in [0xd61f_0000u32, 0xd63f_0000, 0xd65f_0000] {
            compared += check(opcode | (rn << 5), target(0), &[0], no_setup);
        }
    }
    // NOP, the frame push, MOV X3, X7, ADDS X0, SP, #16, SUB SP, SP, #32.
    for word in [0xd503_201f, 0xa9bf_7bfd, 0xaa07_03e3, 0xb100_43e0, 0xd100_83ff] {
        compared += check(word, target(4), &ALL_FLAGS[..4], no_setup);
    }
    assert_eq!(compared, 9 * 3 + 5 * 4 * 3);
}

#[test]
fn blr_x30_is_refused() {
    let word = 0xd63f_03c0; // BLR X30
    let mut trampoline = Trampoline::new(ADDRESS + 0x1000, 0);
    assert_eq!(relocate(&mut trampoline, ADDRESS, word, &classify(Insn(word))), Err(RelocateError::BlrX30));
}

#[test]
fn detour_trampoline_saves_calls_restores_and_fits() {
    let word = 0x9400_0010; // BL .+64
    let base = ADDRESS + 0x20_0000;
    let (probe, entry, refuse) = (0x1234, 0x5678, 0x9abc);
    let trampoline =
        probes::detour_trampoline(base, 0, ADDRESS, word, &classify(Insn(word)), probe, entry, refuse).expect("fits");
    assert!(trampoline.code().len() <= LITERAL_POOL);
    // Literals: the probed address, the probe, the entry (beyond BL's reach from here), the
    // probe and the refusal stub again, then BL's return address.
    let literal = |index: usize| {
        u64::from(trampoline.literals()[2 * index]) | u64::from(trampoline.literals()[2 * index + 1]) << 32
    };
    assert_eq!((0..6).map(literal).collect::<Vec<_>>(), [ADDRESS, probe, entry, probe, refuse, ADDRESS + 4]);
    let code = trampoline.code();
    assert_eq!(code[0], 0xa9af_07e0, "STP X0, X1, [SP, #-272]!");
    assert_eq!(code[1], 0xa9010fe2, "STP X2, X3, [SP, #16]");
    // After the entry: the handler's sp and pc against x19 and x21, a skip over the refusal.
    let call = code.iter().position(|&word| word == 0xd63f_0200).expect("BLR X16");
    assert_eq!(
        code[call + 1..call + 5],
        [0xa94f_87e0, 0xeb13_001f, 0xfa55_0020, 0x5400_00a0],
        "LDP X0, X1, [SP, #248]; CMP X0, X19; CCMP X1, X21, #0, EQ; B.EQ .+20"
    );
    assert_eq!(code[call + 8], 0xd63f_0200, "BLR X16 (the refusal stub)");
    assert_eq!(code[code.len() - 3], 0xa8d1_07e0, "LDP X0, X1, [SP], #272");
    let mut registers = initial_registers(base + 4 * (code.len() as u64 - 1), 0);
    probes::simulate(
        &match classify(Insn(code[code.len() - 1])) {
            Classification::Simulate(form) => form,
            other => panic!("{other:?}"),
        },
        &mut registers as &mut dyn RegisterFile,
        &mut SparseMemory::default(),
        &CONFIG,
    )
    .unwrap();
    assert_eq!(registers.pc, ADDRESS + 64);
}

#[test]
fn detour_trampoline_calls_with_bl_in_reach() {
    let word = 0xd503_201f; // NOP
    let base = ADDRESS + 0x20_0000;
    let (entry, refuse) = (ADDRESS + 0x1000, ADDRESS + 0x1040);
    let trampoline =
        probes::detour_trampoline(base, 0, ADDRESS, word, &classify(Insn(word)), 0x1234, entry, refuse).expect("fits");
    let code = trampoline.code();
    let calls: Vec<u64> = code
        .iter()
        .enumerate()
        .filter(|(_, word)| *word & 0xfc00_0000 == 0x9400_0000)
        .map(|(index, word)| {
            let at = base + 4 * index as u64;
            at.wrapping_add_signed(i64::from(((word << 6) as i32) >> 6) * 4)
        })
        .collect();
    assert_eq!(calls, [entry, refuse]);
    // No literal for either stub: the probed address and the probe twice.
    assert_eq!(trampoline.literals().len(), 2 * 3);
}

/// The relocated word at `index` of `trampoline`'s code, decoded by the crate.
fn relocated_form(trampoline: &Trampoline, index: usize) -> Simulated {
    match classify(Insn(trampoline.code()[index])) {
        Classification::Simulate(form) => form,
        other => panic!("{:#010x}: {other:?}", trampoline.code()[index]),
    }
}

#[test]
fn ldr_xzr_literal_keeps_its_load() {
    // LDR XZR, .+0x100; LDR WZR, .-8; LDRSW XZR, .+0xffffc: the load is the only effect left
    // (it can fault), so the relocated sequence must still perform it, from the trampoline.
    for (word, offset, size) in [(0x5800_081f_u32, 0x100_i64, 8u8), (0x18ff_ffdf, -8, 4), (0x987f_ffff, MIB - 4, 4)] {
        let base = (ADDRESS + 0x1_0000) & !0x1ff;
        let mut trampoline = Trampoline::new(base, encode_brk(0x006).0);
        relocate(&mut trampoline, ADDRESS, word, &classify(Insn(word))).expect("within +-1 MiB");
        assert_eq!(trampoline.code().len(), 2, "{word:#010x}: the load, then B next");
        let Simulated::LoadLiteral { rt, offset: relocated, .. } = relocated_form(&trampoline, 0) else {
            panic!("{word:#010x}: relocated as {:#010x}", trampoline.code()[0]);
        };
        assert_eq!(rt.number(), 31);
        assert_eq!(base.wrapping_add_signed(relocated), target(offset), "{word:#010x}: the same literal");
        assert!(trampoline.code()[0] & 0xff00_0000 == word & 0xff00_0000, "{word:#010x}: the same size");
        let mut registers = initial_registers(base, 0);
        let mut memory = SparseMemory::default();
        for _ in 0..2 {
            let fetched = trampoline.code()[((registers.pc - base) / 4) as usize];
            execute(fetched, &mut registers, &mut memory);
        }
        assert_eq!(memory.loads, [(target(offset), size)], "{word:#010x}");
        assert_eq!(registers.pc, ADDRESS + 4);
    }
}

#[test]
fn ldr_xzr_literal_beyond_reach_is_refused() {
    let word = 0x5800_001f; // LDR XZR, .
    for base in [(ADDRESS + 2 * MIB as u64) & !0x1ff, (ADDRESS - 2 * MIB as u64) & !0x1ff] {
        let mut trampoline = Trampoline::new(base, 0);
        assert_eq!(
            relocate(&mut trampoline, ADDRESS, word, &classify(Insn(word))),
            Err(RelocateError::LiteralOutOfRange)
        );
    }
}

#[test]
fn blr_becomes_ldr_x30_then_br() {
    // BLR X7 relocates as `LDR X30, =next; BR X7`. BR writes BTYPE 01 where BLR writes 10: a
    // target starting with `BTI c` would trap under BTI. Latent (the kernel is built without
    // BTI); this pins the sequence so that enabling BTI meets this test.
    let word = 0xd63f_00e0; // BLR X7
    let base = (ADDRESS + 0x2_0000) & !0x1ff;
    let mut trampoline = Trampoline::new(base, encode_brk(0x006).0);
    relocate(&mut trampoline, ADDRESS, word, &classify(Insn(word))).expect("relocates");
    let code = trampoline.code();
    let literal_offset = 4 * LITERAL_POOL as i64;
    assert_eq!(code, [probes::ldr_literal(30, literal_offset).0, probes::br(7).0]);
    assert_eq!(code, [0x5800_0e1e, 0xd61f_00e0], "LDR X30, .+448; BR X7");
    let literals = trampoline.literals();
    assert_eq!(u64::from(literals[0]) | u64::from(literals[1]) << 32, ADDRESS + 4);

    let mut registers = initial_registers(base, 0);
    registers.x[7] = ADDRESS + 0x40_0000;
    let mut memory = SparseMemory::default();
    for (index, word) in trampoline.words().iter().enumerate() {
        memory.put(base + 4 * index as u64, &word.to_le_bytes());
    }
    execute(code[0], &mut registers, &mut memory);
    execute(code[1], &mut registers, &mut memory);
    assert_eq!(registers.x[30], ADDRESS + 4);
    assert_eq!(registers.pc, ADDRESS + 0x40_0000);
    assert_eq!(registers.pstate & BTYPE_MASK, 1 << 10, "BR's BTYPE (BLR would give 10)");
}
