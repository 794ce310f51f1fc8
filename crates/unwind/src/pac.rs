//! PAC stripping without the instruction: by the address layout (walkers, tests, no PAuth).

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

/// Bit 55 of an address: set in the upper (TTBR1) half, where kernel code lives, and never part
/// of a PAC, so it tells a kernel return address from zero, the SCS end magic and any TTBR0
/// value with one test of the raw, still-signed word.
pub const UPPER_HALF_BIT: u32 = 55;

/// How the walkers strip PACs: by the address layout, with one `orr` of the bits above the
/// virtual-address size, instead of an `xpaclri` round trip through x30.
///
/// Exact for upper-half code addresses (the top byte of a code pointer is all ones: no tag),
/// which is all the walkers let through: a saved return address whose bit 55 is clear is
/// rejected before it is stripped ([`crate::Corruption::LowerHalfAddress`], or the zero and
/// end-magic stops). Exception PCs, which may be anything (0, a user PC), use [`Self::strip`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AddressLayout {
    /// Bits `[63:va_bits]`.
    upper: u64,
    va_bits: u32,
}

impl AddressLayout {
    /// The layout of a `va_bits`-bit address space (`64 - T1SZ`; 39 for T1SZ = 25), clamped to
    /// `1..=55`.
    pub const fn new(va_bits: u32) -> Self {
        let va_bits = if va_bits == 0 {
            1
        } else if va_bits > 55 {
            55
        } else {
            va_bits
        };
        Self { upper: !((1u64 << va_bits) - 1), va_bits }
    }

    /// The virtual-address size.
    pub const fn va_bits(&self) -> u32 {
        self.va_bits
    }

    /// The bits a PAC may occupy, and the canonical ones above them: what the `orr` sets.
    pub const fn upper_bits(&self) -> u64 {
        self.upper
    }

    /// Whether a raw saved word can be a kernel return address (bit 55 set).
    #[inline(always)]
    pub const fn is_upper_half(raw: u64) -> bool {
        raw & (1 << UPPER_HALF_BIT) != 0
    }

    /// Strips an upper-half word (checked with [`Self::is_upper_half`] first): one `orr`.
    #[inline(always)]
    pub const fn strip_upper(&self, raw: u64) -> u64 {
        raw | self.upper
    }

    /// Strips any address as XPACI does ([`strip_pac_va_bits`]): for exception PCs.
    #[inline(always)]
    pub const fn strip(&self, address: u64) -> u64 {
        if Self::is_upper_half(address) { address | self.upper } else { address & !self.upper }
    }
}
