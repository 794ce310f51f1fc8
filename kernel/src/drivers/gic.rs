//! GICv2 (GIC-400) and GICv3 interrupt controllers: private interrupts on every CPU and SGIs
//! between CPUs (GICv2 architecture spec IHI0048B ch. 4; GICv3 spec IHI0069 ch. 12).
//!
//! Each CPU sets up its own CPU interface (`init_this_cpu`): on GICv2 the distributor's banked
//! registers and GICC are the calling CPU's; on GICv3 each CPU has its own redistributor, found by
//! its affinity (GICR_TYPER) among the frames the device tree's region holds.

use crate::arch::percpu::{CPUS, this_cpu_index};
use core::ptr::{read_volatile, write_volatile};
use core::sync::atomic::{AtomicU64, Ordering};

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
const GICD_ITARGETSR: u64 = 0x800;
const GICD_SGIR: u64 = 0xf00;
// GICv2 CPU interface.
const GICC_CTLR: u64 = 0x000;
const GICC_PMR: u64 = 0x004;
const GICC_IAR: u64 = 0x00c;
const GICC_EOIR: u64 = 0x010;
// GICv3 redistributor: RD_base frame, then SGI_base frame 64 KiB above.
const GICR_TYPER: u64 = 0x0008;
const GICR_WAKER: u64 = 0x0014;
/// One redistributor: RD_base and SGI_base, 64 KiB each (no VLPI frames on GICv3 without GICv4).
pub const GICR_FRAME_SIZE: u64 = 0x2_0000;
/// GICR_TYPER.Last: the last redistributor of the region.
const GICR_TYPER_LAST: u64 = 1 << 4;
const GICR_SGI_BASE: u64 = 0x1_0000;
const GICR_IGROUPR0: u64 = GICR_SGI_BASE + 0x0080;
const GICR_ISENABLER0: u64 = GICR_SGI_BASE + 0x0100;
const GICR_IPRIORITYR: u64 = GICR_SGI_BASE + 0x0400;

/// Per CPU: GICv2, its CPU interface mask (GICD_ITARGETSR0 as that CPU reads it); GICv3, its
/// MPIDR affinity. Written by each CPU in `init_this_cpu`, read by senders of SGIs.
static SGI_TARGET: [AtomicU64; CPUS] = [const { AtomicU64::new(0) }; CPUS];
/// Per CPU on GICv3: its redistributor's RD_base (virtual).
static REDISTRIBUTOR: [AtomicU64; CPUS] = [const { AtomicU64::new(0) }; CPUS];

/// Priority of every interrupt the kernel enables (all unmasked by PMR 0xff).
const PRIORITY: u8 = 0x80;

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
    /// Enables the distributor, then this (the boot) CPU's interface.
    pub fn init(config: GicConfig) -> Self {
        match config {
            GicConfig::V2 { distributor, .. } => write32(distributor + GICD_CTLR, 1),
            // Affinity routing, group 1 enabled.
            GicConfig::V3 { distributor, .. } => write32(distributor + GICD_CTLR, (1 << 4) | (1 << 1)),
        }
        let gic = Self { config };
        gic.init_this_cpu();
        gic
    }

    /// Sets up the calling CPU's interface with every priority unmasked and records how SGIs
    /// reach it. Once per CPU, on that CPU.
    pub fn init_this_cpu(&self) {
        let cpu = this_cpu_index();
        match self.config {
            GicConfig::V2 { distributor, cpu_interface } => {
                // The first ITARGETSR bytes (SGIs and PPIs) read as the reading CPU's own mask.
                SGI_TARGET[cpu].store(u64::from(read32(distributor + GICD_ITARGETSR) & 0xff), Ordering::Relaxed);
                write32(cpu_interface + GICC_PMR, 0xff);
                write32(cpu_interface + GICC_CTLR, 1);
            }
            GicConfig::V3 { redistributor, .. } => {
                let mpidr = crate::arch::cpu::mpidr();
                // GICR_TYPER[63:32] is Aff3.Aff2.Aff1.Aff0 of the frame's CPU.
                let affinity = ((mpidr >> 8) & 0xff00_0000) | (mpidr & 0xff_ffff);
                let frame = find_redistributor(redistributor, affinity)
                    .unwrap_or_else(|| panic!("no GICv3 redistributor for MPIDR {mpidr:#x}"));
                REDISTRIBUTOR[cpu].store(frame, Ordering::Relaxed);
                SGI_TARGET[cpu].store(mpidr, Ordering::Relaxed);
                let waker = read32(frame + GICR_WAKER);
                write32(frame + GICR_WAKER, waker & !(1 << 1));
                while read32(frame + GICR_WAKER) & (1 << 2) != 0 {}
                write32(frame + GICR_IGROUPR0, u32::MAX);
                icc_sre_el1_enable();
                icc_write_pmr(0xff);
                icc_write_igrpen1(1);
            }
        }
    }

    /// Enables a private interrupt (SGI or PPI) of this CPU.
    pub fn enable_private(&self, intid: u32) {
        assert!(intid < 32, "not an SGI or PPI: {}", intid);
        match self.config {
            GicConfig::V2 { distributor, .. } => {
                write8(distributor + GICD_IPRIORITYR + intid as u64, PRIORITY);
                write32(distributor + GICD_ISENABLER, 1 << intid);
            }
            GicConfig::V3 { .. } => {
                let frame = REDISTRIBUTOR[this_cpu_index()].load(Ordering::Relaxed);
                write8(frame + GICR_IPRIORITYR + intid as u64, PRIORITY);
                write32(frame + GICR_ISENABLER0, 1 << intid);
            }
        }
    }

    /// Sends SGI `intid` (0..16) to CPU `cpu`, which must have run `init_this_cpu`.
    pub fn send_sgi(&self, intid: u32, cpu: usize) {
        assert!(intid < 16, "not an SGI: {}", intid);
        let target = SGI_TARGET[cpu].load(Ordering::Relaxed);
        match self.config {
            GicConfig::V2 { distributor, .. } => {
                // SAFETY: orders this CPU's earlier stores (the message) before the interrupt.
                unsafe { core::arch::asm!("dsb ish", options(nostack, preserves_flags)) };
                // TargetListFilter 0: the CPUs in the target list.
                write32(distributor + GICD_SGIR, ((target as u32) << 16) | intid);
            }
            GicConfig::V3 { .. } => {
                // ICC_SGI1R_EL1: Aff3 [55:48], Aff2 [39:32], INTID [27:24], Aff1 [23:16],
                // TargetList [15:0] (one bit per Aff0 value below 16).
                let value = (((target >> 32) & 0xff) << 48)
                    | (((target >> 16) & 0xff) << 32)
                    | (u64::from(intid) << 24)
                    | (((target >> 8) & 0xff) << 16)
                    | (1 << (target & 0xf));
                icc_write_sgi1r(value);
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

/// The RD_base of the redistributor whose GICR_TYPER names `affinity`, walking the region's
/// frames until the one marked Last.
fn find_redistributor(region: u64, affinity: u64) -> Option<u64> {
    for index in 0..CPUS as u64 {
        let frame = region + index * GICR_FRAME_SIZE;
        // SAFETY: GICR_TYPER of a mapped redistributor frame (mm maps CPUS frames, the region
        // permitting; the walk stops at the frame marked Last).
        let typer = unsafe { read_volatile((frame + GICR_TYPER) as *const u64) };
        if typer >> 32 == affinity {
            return Some(frame);
        }
        if typer & GICR_TYPER_LAST != 0 {
            break;
        }
    }
    None
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

fn icc_write_sgi1r(value: u64) {
    // SAFETY: ICC_SGI1R_EL1 generates a group 1 SGI; `dsb` orders the sender's stores (the
    // message) before it, `isb` makes it take effect now.
    unsafe { core::arch::asm!("dsb ish", "msr S3_0_C12_C11_5, {}", "isb", in(reg) value, options(nostack)) }
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
