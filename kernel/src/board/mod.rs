//! Boards: one const `BoardConfig` each, chosen by one Cargo feature.
//!
//! A board holds only what the kernel needs before the device tree is parsed (where the loader
//! puts the image, the console) and what the device tree cannot tell. The types a device tree
//! fills (`Region`, `GicRegions`, `PsciConduit`, the whole `Platform`) live here too: dt.rs fills
//! them, and nothing here depends on the parser.

#[cfg(all(feature = "board-qemu-virt", feature = "board-rpi4"))]
compile_error!("select exactly one board feature: board-qemu-virt or board-rpi4");
#[cfg(not(any(feature = "board-qemu-virt", feature = "board-rpi4")))]
compile_error!("select a board feature: board-qemu-virt or board-rpi4");

#[cfg(feature = "board-qemu-virt")]
mod qemu_virt;
#[cfg(feature = "board-qemu-virt")]
pub use qemu_virt::CONFIG;
#[cfg(feature = "board-rpi4")]
mod rpi4;
#[cfg(feature = "board-rpi4")]
pub use rpi4::CONFIG;

mod psci;
pub use psci::PsciConduit;

/// A physical address range.
#[derive(Clone, Copy, Debug, defmt::Format)]
pub struct Region {
    pub base: u64,
    pub size: u64,
}

impl Region {
    pub fn end(&self) -> u64 {
        self.base + self.size
    }
}

#[derive(Clone, Copy, Debug)]
pub enum GicRegions {
    V2 { distributor: Region, cpu_interface: Region },
    V3 { distributor: Region, redistributor: Region },
}

/// The CPUs the device tree lists (`/cpus/cpu@N`), by MPIDR affinity (`reg`), in its order.
#[derive(Clone, Copy)]
pub struct CpuList {
    pub mpidr: [u64; Self::MAX],
    /// Entries filled (at most `MAX`).
    pub count: usize,
    /// CPUs the device tree lists, also those beyond `MAX`.
    pub listed: usize,
}

impl CpuList {
    /// The most CPUs the kernel keeps per-CPU data for.
    pub const MAX: usize = crate::arch::percpu::CPUS;
    pub const EMPTY: Self = Self { mpidr: [0; Self::MAX], count: 0, listed: 0 };
}

/// The machine the kernel runs on: the board's constants completed by the device tree (or by
/// the board's fallback without one).
pub struct Platform {
    /// Where the device tree blob itself lies (empty without one).
    pub dtb: Region,
    pub ram: Region,
    pub gic: GicRegions,
    /// INTID of the EL1 virtual timer.
    pub virtual_timer_intid: u32,
    /// INTID of the PMU overflow interrupt (a PPI), if the device tree names one.
    pub pmu_intid: Option<u32>,
    pub bootargs: &'static str,
    pub model: &'static str,
    /// How to reach the firmware's PSCI (the `/psci` node's `method`); None without that node
    /// (the Pi 4's firmware: its secondaries wait on the spin table).
    pub psci: Option<PsciConduit>,
    /// The CPUs (empty without a device tree).
    pub cpus: CpuList,
    /// Whether anything came from the board's fallback instead of the device tree.
    pub used_fallback: bool,
}

impl Platform {
    /// What the board says when there is no device tree.
    pub fn fallback(board: &BoardConfig) -> Self {
        Self {
            dtb: Region { base: 0, size: 0 },
            ram: board.fallback.ram,
            gic: board.fallback.gic,
            virtual_timer_intid: board.fallback.virtual_timer_intid,
            pmu_intid: None,
            bootargs: "",
            model: board.name,
            psci: board.fallback.psci,
            cpus: CpuList::EMPTY,
            used_fallback: true,
        }
    }
}

/// How the console's pins reach the UART, when the firmware does not route them.
#[allow(dead_code, reason = "each board uses only the variants its own hardware needs")]
pub enum ConsolePinmux {
    /// BCM2711 GPIO block at this physical address: GPIO14/15 to ALT0 (PL011 TXD0/RXD0).
    Bcm2711Gpio { base: u64 },
}

/// What the kernel assumes when the loader passes no device tree.
pub struct Fallback {
    pub ram: Region,
    pub gic: GicRegions,
    pub virtual_timer_intid: u32,
    pub psci: Option<PsciConduit>,
}

pub struct BoardConfig {
    pub name: &'static str,
    /// The SoC, for the banner.
    pub soc: &'static str,
    /// Physical address the loader puts the raw image at (kernel.ld links it there).
    pub load_address: u64,
    /// PL011 used as the console from the first instruction of Rust code.
    pub console_uart: u64,
    /// The PL011's reference clock, to program 115200 baud.
    pub console_clock_hz: u32,
    pub console_pinmux: Option<ConsolePinmux>,
    /// Whether the kernel may end a run with semihosting when the command line does not say.
    pub semihosting_by_default: bool,
    /// Where secondary CPUs wait for a start address (physical), to be parked. Boards with
    /// PSCI start their secondaries through `Platform::psci` instead (CPU_ON), from the DT.
    pub secondary_spin_table: &'static [u64],
    /// Used when there is no device tree, or its memory node is empty (firmware fills it in).
    pub fallback: Fallback,
}
