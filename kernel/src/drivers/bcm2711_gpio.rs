//! BCM2711 GPIO: route PL011 UART0 to GPIO14/15 (BCM2711 ARM Peripherals, section 5.3).
//!
//! The Pi 4 firmware gives the PL011 to Bluetooth and the mini UART to the header pins; the
//! kernel takes the PL011 back by selecting ALT0 on GPIO14 (TXD0) and GPIO15 (RXD0).

use core::ptr::{read_volatile, write_volatile};

const GPFSEL1: u64 = 0x04;
const GPIO_PUP_PDN_CNTRL_REG0: u64 = 0xe4;
const ALT0: u32 = 0b100;

/// # Safety
/// `base` must be the virtual address of the BCM2711 GPIO registers, mapped as device memory.
pub unsafe fn route_uart0(base: u64) {
    // SAFETY: GPFSEL1 and the pull register are inside the GPIO block (caller's contract).
    unsafe {
        let fsel = (base + GPFSEL1) as *mut u32;
        let mut value = read_volatile(fsel);
        value &= !((0b111 << 12) | (0b111 << 15));
        value |= (ALT0 << 12) | (ALT0 << 15);
        write_volatile(fsel, value);
        // No pull on TXD0, pull-up on RXD0 (an idle line reads high).
        let pull = (base + GPIO_PUP_PDN_CNTRL_REG0) as *mut u32;
        let mut value = read_volatile(pull);
        value &= !((0b11 << 28) | (0b11 << 30));
        value |= 0b01 << 30;
        write_volatile(pull, value);
    }
}
