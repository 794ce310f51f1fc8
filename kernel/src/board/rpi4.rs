//! Raspberry Pi 4 (BCM2711, Cortex-A72): firmware loads `kernel8.img` at 0x80000 and enters at
//! EL2 with x0 = device tree (BCM2711 ARM Peripherals, sections 5 (GPIO), 11 (UART), 6 (GIC-400)).

use super::{BoardConfig, ConsolePinmux, Fallback, GicRegions, Region};

pub const CONFIG: BoardConfig = BoardConfig {
    name: "rpi4",
    soc: "BCM2711",
    load_address: protocol::load_address::RPI4,
    // PL011 UART0 in the "low peripheral" mode the stock firmware sets up.
    console_uart: 0xfe20_1000,
    // The firmware's init_uart_clock default.
    console_clock_hz: 48_000_000,
    console_pinmux: Some(ConsolePinmux::Bcm2711Gpio { base: 0xfe20_0000 }),
    semihosting_by_default: false,
    // The firmware's armstub8 (and QEMU's boot stub) spin table: core n polls 0xd8 + 8 n.
    secondary_spin_table: &[0xe0, 0xe8, 0xf0],
    // The first RAM region the firmware reports with the default GPU split, the GIC-400 and the
    // virtual timer PPI of bcm2711.dtsi.
    fallback: Fallback {
        ram: Region { base: 0, size: 0x3b40_0000 },
        gic: GicRegions::V2 {
            distributor: Region { base: 0xff84_1000, size: 0x1000 },
            cpu_interface: Region { base: 0xff84_2000, size: 0x2000 },
        },
        virtual_timer_intid: 27,
        psci: None,
    },
};
