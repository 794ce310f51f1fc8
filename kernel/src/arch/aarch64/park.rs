//! Parks the secondary CPUs that a spin table holds (Pi 4 firmware and QEMU `raspi4b`: cores 1-3
//! poll 0xe0, 0xe8, 0xf0 with `wfe`): they are sent to a `wfi` loop with everything masked, where
//! they stay halted. tracelab runs on one CPU; a polling core would also keep consuming
//! instructions, which under `-icount` is virtual time taken from CPU 0.

use super::mmu::{VA_OFFSET, pa_of};

core::arch::global_asm!(
    r#"
    .section .text.noprobe, "ax"
    .balign 8
    .global park_secondary
park_secondary:
    msr     daifset, #0xf
1:  wfi
    b       1b
"#
);

unsafe extern "C" {
    fn park_secondary();
}

/// Sends every core waiting on `spin_table` (physical addresses) to `park_secondary`.
pub fn park_secondaries(spin_table: &[u64]) {
    let target = pa_of(park_secondary as *const () as u64);
    for &entry in spin_table {
        let address = entry + VA_OFFSET;
        // SAFETY: the spin table lies in RAM the kernel maps (firmware-reserved low memory) and
        // only the waiting cores read it. They run with caches off: clean the line to PoC.
        unsafe {
            core::ptr::write_volatile(address as *mut u64, target);
            core::arch::asm!("dc cvac, {}", in(reg) address, options(nostack, preserves_flags));
        }
    }
    // SAFETY: orders the stores before waking the cores with SEV.
    unsafe { core::arch::asm!("dsb sy", "sev", options(nostack, preserves_flags)) };
}
