//! `classify` and `simulate` never panic, on any word and any register state.
//!
//! The cheap, deterministic companion of the fuzz target in `fuzz/`: seeded
//! random words, plus random words forced into each simulated group so the
//! simulator sees every form, with random registers and a memory that
//! faults at random.

use probes::{Access, Classification, Fault, Insn, Memory, Registers, SimulationConfig, classify, simulate};

struct Xorshift(u64);

impl Xorshift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Memory whose contents and faults are a hash of the address.
struct ChaosMemory(u64);

impl ChaosMemory {
    fn value(&self, address: u64, access: Access) -> Result<u64, Fault> {
        let hash = (address ^ self.0).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        if hash >> 61 == 0 { Err(Fault { address, access }) } else { Ok(hash) }
    }
}

impl Memory for ChaosMemory {
    fn read_u32(&mut self, address: u64) -> Result<u32, Fault> {
        self.value(address, Access::Read).map(|v| v as u32)
    }
    fn read_u64(&mut self, address: u64) -> Result<u64, Fault> {
        self.value(address, Access::Read)
    }
    fn write_pair(&mut self, address: u64, _: [u64; 2]) -> Result<(), Fault> {
        self.value(address, Access::Write).map(drop)
    }
}

/// (mask, value) of each simulated group, so that random fields land in it.
const GROUPS: &[(u32, u32)] = &[
    (0x7c00_0000, 0x1400_0000), // B, BL
    (0xfe00_0000, 0x5400_0000), // B.cond, BC.cond
    (0x7e00_0000, 0x3400_0000), // CBZ, CBNZ
    (0x7e00_0000, 0x3600_0000), // TBZ, TBNZ
    (0xff9f_fc1f, 0xd61f_0000), // BR, BLR, RET
    (0x1f00_0000, 0x1000_0000), // ADR, ADRP
    (0x3b00_0000, 0x1800_0000), // LDR (literal)
    (0x7e00_0000, 0x2800_0000), // load/store pair
    (0x7fe0_ffe0, 0x2a00_03e0), // MOV (register)
    (0x1f80_0000, 0x1100_0000), // ADD/SUB (immediate)
    (0xffff_f01f, 0xd503_201f), // hints
];

#[test]
fn classify_and_simulate_never_panic() {
    let mut rng = Xorshift(0x05ee_d0fc_1a55);
    let mut simulated = 0;
    for round in 0..300_000u32 {
        let random = rng.next() as u32;
        let word = match round as usize % (GROUPS.len() + 1) {
            0 => random,
            group => {
                let (mask, value) = GROUPS[group - 1];
                (random & !mask) | value
            }
        };
        let Classification::Simulate(form) = classify(Insn(word)) else {
            continue;
        };
        simulated += 1;
        let mut registers =
            Registers { x: core::array::from_fn(|_| rng.next()), sp: rng.next(), pc: rng.next(), pstate: rng.next() };
        let config = SimulationConfig {
            sp_alignment_check: rng.next() & 1 == 1,
            guarded_page: rng.next() & 1 == 1,
            instruction_tbi: [rng.next() & 1 == 1, rng.next() & 1 == 1],
        };
        let before = registers;
        if simulate(&form, &mut registers, &mut ChaosMemory(rng.next()), &config).is_err() {
            assert_eq!(registers, before, "{word:#010x}: a fault changed registers");
        }
    }
    assert!(simulated > 100_000, "only {simulated} words reached the simulator");
}
