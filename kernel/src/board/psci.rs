//! The PSCI conduit: how the kernel calls the firmware's Power State Coordination Interface
//! (Arm DEN0022, PSCI 1.1; calls follow the SMC Calling Convention, DEN0028, SMC32/HVC32).
//!
//! The device tree's `/psci` node says which instruction reaches the firmware (`method`): `hvc`
//! on QEMU `virt` entered at EL1 (QEMU plays the hypervisor), `smc` with `virtualization=on`
//! (QEMU plays EL3). Secondary CPUs are started through CPU_ON (arch/aarch64/smp.rs).

/// The instruction that carries a PSCI call to the firmware.
#[derive(Clone, Copy, PartialEq, Eq, Debug, defmt::Format)]
pub enum PsciConduit {
    Hvc,
    Smc,
}

/// PSCI_VERSION (DEN0022 5.1.1): no arguments, returns major << 16 | minor.
const PSCI_VERSION: u32 = 0x8400_0000;
/// CPU_ON, SMC64 (DEN0022 5.1.4): target MPIDR, entry point (physical), context id (x0 there).
const CPU_ON: u32 = 0xC400_0003;

impl PsciConduit {
    /// The device tree's spelling of `method`.
    pub fn from_method(method: &str) -> Option<Self> {
        match method {
            "hvc" => Some(Self::Hvc),
            "smc" => Some(Self::Smc),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Hvc => "hvc",
            Self::Smc => "smc",
        }
    }

    /// The firmware's PSCI version as (major, minor).
    pub fn version(self) -> (u16, u16) {
        let version = self.call(PSCI_VERSION, 0, 0, 0) as u32;
        ((version >> 16) as u16, version as u16)
    }

    /// Starts the CPU whose MPIDR affinity is `mpidr` at physical `entry`, MMU off, with `context`
    /// in x0, at the caller's exception level. Returns PSCI's status (0, or a negative error).
    pub fn cpu_on(self, mpidr: u64, entry: u64, context: u64) -> i64 {
        self.call(CPU_ON, mpidr, entry, context) as i64
    }

    /// One SMCCC call: function id in w0, arguments in x1-x3, result in x0. SMCCC 1.1 lets the
    /// firmware clobber x4-x17 as well (x0-x3 are results), so all of them are declared
    /// clobbered; no memory is passed, and the call does not touch the stack.
    fn call(self, function: u32, argument1: u64, argument2: u64, argument3: u64) -> u64 {
        let result: u64;
        match self {
            // SAFETY: a PSCI call through the conduit the device tree names: the firmware
            // handles it and returns; registers per SMCCC, declared below.
            Self::Hvc => unsafe {
                core::arch::asm!(
                    "hvc #0",
                    inout("x0") u64::from(function) => result,
                    inout("x1") argument1 => _, inout("x2") argument2 => _, inout("x3") argument3 => _,
                    out("x4") _, out("x5") _, out("x6") _, out("x7") _, out("x8") _, out("x9") _,
                    out("x10") _, out("x11") _, out("x12") _, out("x13") _, out("x14") _, out("x15") _,
                    out("x16") _, out("x17") _,
                    options(nostack),
                )
            },
            // SAFETY: as above, through SMC.
            Self::Smc => unsafe {
                core::arch::asm!(
                    "smc #0",
                    inout("x0") u64::from(function) => result,
                    inout("x1") argument1 => _, inout("x2") argument2 => _, inout("x3") argument3 => _,
                    out("x4") _, out("x5") _, out("x6") _, out("x7") _, out("x8") _, out("x9") _,
                    out("x10") _, out("x11") _, out("x12") _, out("x13") _, out("x14") _, out("x15") _,
                    out("x16") _, out("x17") _,
                    options(nostack),
                )
            },
        }
        result
    }
}
