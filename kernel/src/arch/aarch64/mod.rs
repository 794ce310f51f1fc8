//! AArch64 support: boot, exception vectors, translation tables, PAuth, text patching.

pub mod counters;
pub mod cpu;
pub mod esr;
pub mod exception;
pub mod mmu;
#[cfg_attr(
    not(feature = "mte"),
    allow(
        dead_code,
        reason = "only build variant `mte` takes tag faults and seeds IRG; the others call init_this_cpu, a no-op"
    )
)]
pub mod mte;
pub mod park;
pub mod patch;
pub mod percpu;
pub mod semihosting;
pub mod smp;
pub mod stack;
pub mod step;
pub mod uninstrumented;

use mmu::{Descriptor, VA_OFFSET};

/// HCR_EL2 for running the kernel at EL1: RW (EL1 is AArch64), APK and API (PAuth keys and
/// instructions do not trap to EL2).
const HCR_EL2: u64 = (1 << 31) | (1 << 40) | (1 << 41);
/// HCR_EL2.ATA: EL1 may access allocation tags (set by boot.S only when the CPU has MTE).
const HCR_EL2_ATA: u64 = 1 << 56;
/// SCTLR_EL1 with the MMU and caches off: only the RES1 bits of ARMv8.0 (11, 20, 22, 23, 28, 29).
const SCTLR_MMU_OFF: u64 = 0x30D0_0800;
/// SCTLR_EL1 with the MMU (M), data and instruction caches (C, I) and SP alignment checks (SA).
const SCTLR_MMU_ON: u64 = SCTLR_MMU_OFF | 1 | (1 << 2) | (1 << 3) | (1 << 12);
/// SCTLR_EL1.EnIA: PACIASP/AUTIASP use the IA key instead of acting as NOPs.
const SCTLR_ENIA: u64 = 1 << 31;
/// SPSR for EL1h with D, A, I and F masked.
const SPSR_EL1H_MASKED: u64 = 0x3c5;

core::arch::global_asm!(
    include_str!("boot.S"),
    hcr_el2 = const HCR_EL2,
    hcr_ata = const HCR_EL2_ATA,
    sctlr_mmu_off = const SCTLR_MMU_OFF,
    sctlr_mmu_on = const SCTLR_MMU_ON,
    sctlr_enia = const SCTLR_ENIA,
    spsr_el1h_masked = const SPSR_EL1H_MASKED,
    shadow_page_attrs = const Descriptor::SHADOW_PAGE_ATTRS,
    table = const Descriptor::TABLE,
    ram_block = const Descriptor::early_ram_block(crate::board::CONFIG.load_address),
    device_block = const Descriptor::early_device_block(crate::board::CONFIG.console_uart),
    ram_gib = const crate::board::CONFIG.load_address >> 30,
    device_gib = const crate::board::CONFIG.console_uart >> 30,
    linear_shadow_l1 = const mmu::l1_index(mmu::shadow_of(VA_OFFSET)),
    alias_shadow_l1 = const mmu::l1_index(mmu::shadow_of(mmu::TEXT_ALIAS_OFFSET)),
    mair = const mmu::MAIR,
    tcr = const mmu::TCR,
    key_lo_seed = const 0x7472_6163_656c_6162_u64, // "tracelab"
    key_hi_seed = const 0x9e37_79b9_7f4a_7c15_u64,
    tcr_epd0 = const mmu::TCR_EPD0,
    boot_ttbr1 = const core::mem::offset_of!(smp::SecondaryBoot, ttbr1),
    boot_tcr = const core::mem::offset_of!(smp::SecondaryBoot, tcr),
    boot_sctlr_extra = const core::mem::offset_of!(smp::SecondaryBoot, sctlr_extra),
    boot_apia_lo = const core::mem::offset_of!(smp::SecondaryBoot, apia_lo),
    boot_apia_hi = const core::mem::offset_of!(smp::SecondaryBoot, apia_hi),
    boot_stack_top = const core::mem::offset_of!(smp::SecondaryBoot, stack_top),
    boot_scs_base = const core::mem::offset_of!(smp::SecondaryBoot, scs_base),
    boot_block_shift = const smp::BOOT_BLOCK_SHIFT,
    boot_blocks = const percpu::CPUS,
);

core::arch::global_asm!(
    include_str!("vectors.S"),
    stack_bit = const stack::STACK_BIT,
    scs_check = const crate::build_info::SHADOW_CALL_STACK as u8,
    mte_checks = const mte::ENABLED_IN_BUILD as u8,
    scs_mask = const stack::SHADOW_STACK_MASK,
    percpu_overflow_shadow_stack = const core::mem::offset_of!(percpu::PerCpu, overflow_shadow_stack),
    frame_size = const core::mem::size_of::<exception::ExceptionFrame>(),
    gap = const exception::STACK_GAP,
    off_sp = const core::mem::offset_of!(exception::ExceptionFrame, sp),
    off_elr = const core::mem::offset_of!(exception::ExceptionFrame, elr),
    off_esr = const core::mem::offset_of!(exception::ExceptionFrame, esr),
    off_marker = const core::mem::offset_of!(exception::ExceptionFrame, boundary),
    off_tpidr_el0 = const core::mem::offset_of!(exception::ExceptionFrame, tpidr_el0),
    percpu_user_kernel_x18 = const core::mem::offset_of!(percpu::PerCpu, user_kernel_x18),
    percpu_pauth_keys = const core::mem::offset_of!(percpu::PerCpu, pauth_keys),
    percpu_kernel_apia = const core::mem::offset_of!(percpu::PerCpu, kernel_apia),
    percpu_user_apia = const core::mem::offset_of!(percpu::PerCpu, user_apia),
    marker_exception = const exception::BOUNDARY_KIND_EXCEPTION,
);

const _: () = assert!(
    crate::board::CONFIG.load_address >> 30 != crate::board::CONFIG.console_uart >> 30,
    "the early map gives RAM and the console separate 1 GiB blocks"
);

core::arch::global_asm!(
    include_str!("context.S"),
    frame_size = const core::mem::size_of::<exception::ExceptionFrame>(),
    gap = const exception::STACK_GAP,
    percpu_irq_frame = const core::mem::offset_of!(percpu::PerCpu, irq_frame),
    percpu_irq_stack_top = const core::mem::offset_of!(percpu::PerCpu, irq_stack_top),
    percpu_irq_shadow_stack = const core::mem::offset_of!(percpu::PerCpu, irq_shadow_stack),
    percpu_overflow_stack_top = const core::mem::offset_of!(percpu::PerCpu, overflow_stack_top),
    percpu_overflow_shadow_stack = const core::mem::offset_of!(percpu::PerCpu, overflow_shadow_stack),
);
