//! Boards: one const `BoardConfig` each, chosen by one Cargo feature.
//!
//! A board holds only what the kernel needs before the device tree is parsed (where the loader
//! puts the image, the console) and what the device tree cannot tell.

#[cfg(all(feature = "board-qemu-virt", feature = "board-rpi4"))]
compile_error!("select exactly one board feature: board-qemu-virt or board-rpi4");
#[cfg(not(any(feature = "board-qemu-virt", feature = "board-rpi4")))]
compile_error!("select a board feature: board-qemu-virt or board-rpi4");

#[cfg(feature = "board-qemu-virt")]
mod qemu_virt;
#[cfg(feature = "board-qemu-virt")]
pub use qemu_virt::CONFIG;

pub struct BoardConfig {
    pub name: &'static str,
    /// Physical address the loader puts the raw image at (kernel.ld links it there).
    pub load_address: u64,
    /// PL011 used as the console from the first instruction of Rust code.
    pub console_uart: u64,
    /// The PL011's reference clock, to program 115200 baud.
    pub console_clock_hz: u32,
    /// Whether the kernel may end a run with semihosting when the command line does not say.
    pub semihosting_by_default: bool,
}
