//! Fuzz target: `classify` and `simulate` never panic on any word and state.
#![no_main]

use libfuzzer_sys::fuzz_target;
use probes::{
    Access, Classification, Fault, Insn, Memory, Registers, SimulationConfig, classify, simulate,
};

/// Memory backed by the fuzz input: reads come from it, and an address whose
/// low byte is above a threshold from the input faults.
struct InputMemory<'a> {
    data: &'a [u8],
    fault_above: u8,
}

impl InputMemory<'_> {
    fn value(&self, address: u64, access: Access) -> Result<u64, Fault> {
        if address as u8 > self.fault_above {
            return Err(Fault { address, access });
        }
        let mut bytes = [0; 8];
        for (i, byte) in bytes.iter_mut().enumerate() {
            let index = (address as usize).wrapping_add(i) % self.data.len().max(1);
            *byte = self.data.get(index).copied().unwrap_or(0);
        }
        Ok(u64::from_le_bytes(bytes))
    }
}

impl Memory for InputMemory<'_> {
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

fuzz_target!(|data: &[u8]| {
    let Some((word, rest)) = data.split_first_chunk::<4>() else {
        return;
    };
    let Classification::Simulate(form) = classify(Insn(u32::from_le_bytes(*word))) else {
        return;
    };
    let mut words = rest.chunks(8).map(|chunk| {
        let mut bytes = [0; 8];
        bytes[..chunk.len()].copy_from_slice(chunk);
        u64::from_le_bytes(bytes)
    });
    let mut next = || words.next().unwrap_or(0);
    let mut registers = Registers {
        x: core::array::from_fn(|_| next()),
        sp: next(),
        pc: next(),
        pstate: next(),
    };
    let flags = next();
    let config = SimulationConfig {
        sp_alignment_check: flags & 1 != 0,
        guarded_page: flags & 2 != 0,
        instruction_tbi: [flags & 4 != 0, flags & 8 != 0],
    };
    let before = registers;
    let mut memory = InputMemory {
        data: rest,
        fault_above: (flags >> 8) as u8,
    };
    if simulate(&form, &mut registers, &mut memory, &config).is_err() {
        assert_eq!(registers, before, "a fault changed registers");
    }
});
