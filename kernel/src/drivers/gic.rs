//! GICv2 (GIC-400) and GICv3 interrupt controllers, enough for private interrupts on one CPU
//! (GICv2 architecture spec IHI0048B ch. 4; GICv3 spec IHI0069 ch. 12).

use core::ptr::{read_volatile, write_volatile};

/// An interrupt controller as the device tree describes it (virtual addresses).
#[derive(Clone, Copy, Debug, defmt::Format)]
pub enum GicConfig {
    V2 { distributor: u64, cpu_interface: u64 },
    V3 { distributor: u64, redistributor: u64 },
}

/// Interrupt IDs 1020-1023 are special (spurious and friends): nothing to handle, nothing to end.
pub const SPECIAL_INTID_START: u32 = 1020;

pub struct Gic {
    config: GicConfig,
}

// Distributor registers, common to both versions.
const GICD_CTLR: u64 = 0x000;
const GICD_ISENABLER: u64 = 0x100;
const GICD_IPRIORITYR: u64 = 0x400;
// GICv2 CPU interface.
const GICC_CTLR: u64 = 0x000;
const GICC_PMR: u64 = 0x004;
const GICC_IAR: u64 = 0x00c;
const GICC_EOIR: u64 = 0x010;
// GICv3 redistributor: RD_base frame, then SGI_base frame 64 KiB above.
const GICR_WAKER: u64 = 0x0014;
const GICR_SGI_BASE: u64 = 0x1_0000;
const GICR_IGROUPR0: u64 = GICR_SGI_BASE + 0x0080;
const GICR_ISENABLER0: u64 = GICR_SGI_BASE + 0x0100;
const GICR_IPRIORITYR: u64 = GICR_SGI_BASE + 0x0400;

fn write32(address: u64, value: u32) {
    // SAFETY: callers pass registers of the GIC, mapped as device memory by mm::init and owned
    // by the single `Gic`.
    unsafe { write_volatile(address as *mut u32, value) }
}

fn read32(address: u64) -> u32 {
    // SAFETY: as in write32.
    unsafe { read_volatile(address as *const u32) }
}

fn write8(address: u64, value: u8) {
    // SAFETY: as in write32 (priority registers are byte-accessible).
    unsafe { write_volatile(address as *mut u8, value) }
}

impl Gic {
    /// Enables the distributor and this CPU's interface, with every priority unmasked.
    pub fn init(config: GicConfig) -> Self {
        match config {
            GicConfig::V2 { distributor, cpu_interface } => {
                write32(distributor + GICD_CTLR, 1);
                write32(cpu_interface + GICC_PMR, 0xff);
                write32(cpu_interface + GICC_CTLR, 1);
            }
            GicConfig::V3 { distributor, redistributor } => {
                // Affinity routing, group 1 enabled.
                write32(distributor + GICD_CTLR, (1 << 4) | (1 << 1));
                let waker = read32(redistributor + GICR_WAKER);
                write32(redistributor + GICR_WAKER, waker & !(1 << 1));
                while read32(redistributor + GICR_WAKER) & (1 << 2) != 0 {}
                write32(redistributor + GICR_IGROUPR0, u32::MAX);
                icc_sre_el1_enable();
                icc_write_pmr(0xff);
                icc_write_igrpen1(1);
            }
        }
        Self { config }
    }

    /// Enables a private (PPI) interrupt of this CPU.
    pub fn enable_private(&self, intid: u32) {
        assert!((16..32).contains(&intid), "not a PPI: {}", intid);
        match self.config {
            GicConfig::V2 { distributor, .. } => {
                write8(distributor + GICD_IPRIORITYR + intid as u64, 0x80);
                write32(distributor + GICD_ISENABLER, 1 << intid);
            }
            GicConfig::V3 { redistributor, .. } => {
                write8(redistributor + GICR_IPRIORITYR + intid as u64, 0x80);
                write32(redistributor + GICR_ISENABLER0, 1 << intid);
            }
        }
    }

    /// Acknowledges the highest-priority pending interrupt.
    pub fn acknowledge(&self) -> u32 {
        match self.config {
            GicConfig::V2 { cpu_interface, .. } => read32(cpu_interface + GICC_IAR) & 0x3ff,
            GicConfig::V3 { .. } => icc_read_iar1() & 0xff_ffff,
        }
    }

    pub fn end_of_interrupt(&self, intid: u32) {
        match self.config {
            GicConfig::V2 { cpu_interface, .. } => write32(cpu_interface + GICC_EOIR, intid),
            GicConfig::V3 { .. } => icc_write_eoir1(intid),
        }
    }

    pub fn version(&self) -> u8 {
        match self.config {
            GicConfig::V2 { .. } => 2,
            GicConfig::V3 { .. } => 3,
        }
    }
}

// GICv3 CPU interface system registers (ICC_*_EL1), which aarch64-cpu does not provide.

fn icc_sre_el1_enable() {
    // SAFETY: sets ICC_SRE_EL1.SRE (system-register access to the CPU interface); boot.S allowed
    // it from EL2 (ICC_SRE_EL2.Enable) when the kernel was entered there.
    unsafe {
        core::arch::asm!(
            "mrs {t}, S3_0_C12_C12_5",
            "orr {t}, {t}, #1",
            "msr S3_0_C12_C12_5, {t}",
            "isb",
            t = out(reg) _,
            options(nostack),
        )
    }
}

fn icc_write_pmr(value: u64) {
    // SAFETY: ICC_PMR_EL1 only sets the priority mask.
    unsafe { core::arch::asm!("msr S3_0_C4_C6_0, {}", in(reg) value, options(nostack)) }
}

fn icc_write_igrpen1(value: u64) {
    // SAFETY: ICC_IGRPEN1_EL1 enables group 1 interrupts for this CPU.
    unsafe { core::arch::asm!("msr S3_0_C12_C12_7, {}", "isb", in(reg) value, options(nostack)) }
}

fn icc_read_iar1() -> u32 {
    let value: u64;
    // SAFETY: reading ICC_IAR1_EL1 acknowledges the interrupt, which is what the caller wants.
    unsafe { core::arch::asm!("mrs {}, S3_0_C12_C12_0", out(reg) value, options(nostack)) };
    value as u32
}

fn icc_write_eoir1(intid: u32) {
    // SAFETY: ICC_EOIR1_EL1 ends an interrupt this CPU acknowledged.
    unsafe { core::arch::asm!("msr S3_0_C12_C12_1, {}", in(reg) intid as u64, options(nostack)) }
}
