//! ARM PrimeCell PL011 UART, transmit side (PL011 TRM DDI0183, section 3).

use core::ptr::{read_volatile, write_volatile};

const DR: usize = 0x00;
const FR: usize = 0x18;
const IBRD: usize = 0x24;
const FBRD: usize = 0x28;
const LCRH: usize = 0x2c;
const CR: usize = 0x30;
const ICR: usize = 0x44;
const FR_TXFF: u32 = 1 << 5;
const FR_BUSY: u32 = 1 << 3;

pub struct Pl011 {
    base: *mut u32,
}

// SAFETY: the registers are only reached through `&mut self` or under the console lock.
unsafe impl Send for Pl011 {}

impl Pl011 {
    /// # Safety
    /// `base` must be the virtual address of a PL011's registers, mapped as device memory, and
    /// no other `Pl011` may exist for the same device.
    pub const unsafe fn new(base: u64) -> Self {
        Self { base: base as *mut u32 }
    }

    fn write_register(&mut self, offset: usize, value: u32) {
        // SAFETY: offset is one of the PL011 registers inside the mapped block (see `new`).
        unsafe { write_volatile(self.base.byte_add(offset), value) }
    }

    fn read_register(&self, offset: usize) -> u32 {
        // SAFETY: as in write_register.
        unsafe { read_volatile(self.base.byte_add(offset)) }
    }

    /// 115200 8N1 with FIFOs, transmit and receive enabled.
    pub fn init(&mut self, clock_hz: u32) {
        while self.read_register(FR) & FR_BUSY != 0 {}
        self.write_register(CR, 0);
        self.write_register(ICR, 0x7ff);
        // Divisor = clock / (16 * baud), as 16.6 fixed point.
        let divisor_x64 = (clock_hz as u64 * 4 / 115_200) as u32;
        self.write_register(IBRD, divisor_x64 >> 6);
        self.write_register(FBRD, divisor_x64 & 0x3f);
        self.write_register(LCRH, (0b11 << 5) | (1 << 4));
        self.write_register(CR, (1 << 0) | (1 << 8) | (1 << 9));
    }

    pub fn write_bytes(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            while self.read_register(FR) & FR_TXFF != 0 {}
            self.write_register(DR, byte as u32);
        }
    }

    /// Waits until the last byte has left the shifter (before the machine stops).
    pub fn drain(&self) {
        while self.read_register(FR) & FR_BUSY != 0 {}
    }
}
