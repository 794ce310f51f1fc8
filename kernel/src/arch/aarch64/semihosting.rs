//! Arm semihosting (Arm's "Semihosting for AArch32 and AArch64", 6.4.2 SYS_EXIT): how a run
//! under QEMU `-semihosting` hands its exit status to the host.

/// SYS_EXIT with ADP_Stopped_ApplicationExit and `status`: QEMU (with `-semihosting`) exits
/// with that status. Returns only where no debugger or emulator takes the call.
pub fn exit(status: u8) {
    let block = [0x2_0026_u64, status as u64];
    // SAFETY: HLT #0xf000 is the A64 semihosting trap; x0 = SYS_EXIT, x1 = the parameter block,
    // which lives on this stack for the duration of the call. It reads the block and may end
    // the run; it clobbers nothing else (x0 carries the return value, unused here).
    unsafe { core::arch::asm!("hlt #0xf000", in("x0") 0x18_u64, in("x1") block.as_ptr(), options(nostack)) };
}
