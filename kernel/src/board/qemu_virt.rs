//! QEMU `virt`: RAM at 1 GiB, PL011 at 0x0900_0000; GIC, timer and memory from the DT.

use super::BoardConfig;

pub const CONFIG: BoardConfig = BoardConfig {
    name: "qemu-virt",
    load_address: 0x4008_0000,
    console_uart: 0x0900_0000,
    console_clock_hz: 24_000_000,
    semihosting_by_default: true,
};
