//! QEMU `virt`: RAM at 1 GiB, PL011 at 0x0900_0000; GIC, timer and memory from the DT.

use super::{BoardConfig, Fallback, GicRegions, PsciConduit, Region};

pub const CONFIG: BoardConfig = BoardConfig {
    name: "qemu-virt",
    soc: "QEMU virt",
    load_address: protocol::load_address::QEMU_VIRT,
    console_uart: 0x0900_0000,
    console_clock_hz: 24_000_000,
    console_pinmux: None,
    semihosting_by_default: true,
    // xtask boots virt with one CPU (-smp 1); PSCI would start others.
    secondary_spin_table: &[],
    // QEMU always passes a device tree; these are its defaults at EL1 (128 MiB, GICv2, PPI 11,
    // PSCI through HVC).
    fallback: Fallback {
        ram: Region { base: 0x4000_0000, size: 128 << 20 },
        gic: GicRegions::V2 {
            distributor: Region { base: 0x0800_0000, size: 0x1_0000 },
            cpu_interface: Region { base: 0x0801_0000, size: 0x1_0000 },
        },
        virtual_timer_intid: 27,
        psci: Some(PsciConduit::Hvc),
    },
};
