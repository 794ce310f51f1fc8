//! PAC stripping without the instruction (tests, CPUs without PAuth).

/// Removes a pointer-authentication code the way XPACI does for an untagged
/// code address: bits `[63:va_bits]` become copies of bit 55 (which selects
/// TTBR0 or TTBR1 and is never part of the PAC).
///
/// It equals XPACLRI for kernel return addresses, whose top byte is canonical
/// (code pointers carry no tag). Use it in tests, or on a CPU without PAuth
/// where XPACLRI is a NOP anyway; `va_bits` is `64 - TnSZ` (39 for TnSZ = 25).
/// A `va_bits` outside `1..=55` returns `address` unchanged.
#[inline]
pub const fn strip_pac_va_bits(address: u64, va_bits: u32) -> u64 {
    if va_bits == 0 || va_bits > 55 {
        return address;
    }
    let pac_and_top = !((1u64 << va_bits) - 1);
    if address & (1 << 55) != 0 { address | pac_and_top } else { address & !pac_and_top }
}
