//! The hash over a trace's frames (bucket choice and a fast first compare).
//!
//! CRC32C, one `crc32cx` per frame in the kernel (FEAT_CRC32: the Cortex-A72 and QEMU's
//! `-cpu max` have it; Armv8.1 makes it mandatory), the same function computed bit by bit on the
//! host, where the tests run. The length seeds the CRC, and a xorshift finalizer (one `eor`)
//! folds the high half into the bucket bits. Every bit of a CRC already depends on every input
//! bit, so the multiply-xorshift finalizer it replaced (four more instructions a save) spread
//! nothing that matters; both are bijective, so hash collisions are the CRC's own. Saturation
//! with 65,536 distinct synthetic stacks (bench `depot`) tells whether it collides more than the
//! multiply-xorshift hash it replaced (4-5 instructions a frame against one).

/// Hashes `frames` to 32 bits (see the module docs).
///
/// An index loop rather than an iterator: with the `kernel` feature it is not
/// instrumented, and LLVM would not inline an instrumented `Iterator::next`.
#[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
#[inline]
pub fn hash_frames(frames: &[u64]) -> u32 {
    let len = frames.len();
    let mut crc = !(len as u32);
    // Four frames a step (two pair loads, a pointer that moves), then a pair, then the odd one.
    let mut frame = frames.as_ptr();
    let quads_end = frame.wrapping_add(len & !3);
    if frame != quads_end {
        // SAFETY: the quads lie before quads_end <= the end of `frames`; there is at least one.
        crc = unsafe { crc32c_quads(crc, &mut frame, quads_end) };
    }
    if len & 2 != 0 {
        // SAFETY: the pair after the quads (len & 2: two frames remain at least).
        let (first, second) = unsafe { (*frame, *frame.add(1)) };
        crc = crc32c_u64(crc32c_u64(crc, first), second);
        frame = frame.wrapping_add(2);
    }
    if len & 1 != 0 {
        // SAFETY: the last frame (len is odd, so at least 1).
        crc = crc32c_u64(crc, unsafe { *frame });
    }
    finish(crc)
}

/// The CRC32C of the quads `[*frame, quads_end)` from `crc`; `*frame` ends at `quads_end`.
///
/// In the kernel (arm64) eight instructions per four frames: two post-indexed `ldp`, four
/// `crc32cx`, the loop's compare and branch (LLVM indexes the second pair and adds to the
/// pointer: nine). Elsewhere the same steps in Rust.
///
/// # Safety
///
/// `*frame < quads_end`, `quads_end - *frame` is a whole number of quads, all readable.
#[inline(always)]
unsafe fn crc32c_quads(crc: u32, frame: &mut *const u64, quads_end: *const u64) -> u32 {
    #[cfg(all(feature = "kernel", target_arch = "aarch64"))]
    {
        let mut crc = crc;
        // SAFETY: reads only the quads the caller vouches for (readonly, no stack); CRC32CX
        // (FEAT_CRC32, present on every CPU the kernel runs on) computes on registers; the
        // loop's compare clobbers the flags (no `preserves_flags`).
        unsafe {
            core::arch::asm!(
                ".arch_extension crc",
                "2:",
                "ldp {a}, {b}, [{frame}], #16",
                "crc32cx {crc:w}, {crc:w}, {a}",
                "ldp {a}, {c}, [{frame}], #16",
                "crc32cx {crc:w}, {crc:w}, {b}",
                "crc32cx {crc:w}, {crc:w}, {a}",
                "cmp {frame}, {end}",
                "crc32cx {crc:w}, {crc:w}, {c}",
                "b.ne 2b",
                crc = inout(reg) crc,
                frame = inout(reg) *frame,
                end = in(reg) quads_end,
                a = out(reg) _,
                b = out(reg) _,
                c = out(reg) _,
                options(readonly, nostack)
            )
        };
        crc
    }
    #[cfg(not(all(feature = "kernel", target_arch = "aarch64")))]
    {
        let mut crc = crc;
        while *frame != quads_end {
            // SAFETY: frame .. frame + 3 lie before quads_end (the caller's contract).
            let (first, second, third, fourth) = unsafe { (**frame, *frame.add(1), *frame.add(2), *frame.add(3)) };
            crc = crc32c_u64(crc32c_u64(crc32c_u64(crc32c_u64(crc, first), second), third), fourth);
            *frame = frame.wrapping_add(4);
        }
        crc
    }
}

/// The finalizer: the high half folded into the low one (the bucket bits); bijective, so equal
/// hashes are equal CRCs.
#[inline(always)]
const fn finish(crc: u32) -> u32 {
    crc ^ (crc >> 16)
}

/// One CRC32C step over a 64-bit value (`crc32cx`: reflected polynomial 0x82F63B78, no
/// inversion), with the instruction.
#[cfg(all(feature = "kernel", target_arch = "aarch64"))]
#[inline(always)]
fn crc32c_u64(crc: u32, value: u64) -> u32 {
    let result: u32;
    // SAFETY: CRC32CX only computes on registers (FEAT_CRC32, present on every CPU the kernel
    // runs on); it reads `crc` and `value` and writes `result`, touches no memory or flags.
    unsafe {
        core::arch::asm!(
            ".arch_extension crc",
            "crc32cx {result:w}, {crc:w}, {value}",
            result = lateout(reg) result,
            crc = in(reg) crc,
            value = in(reg) value,
            options(pure, nomem, nostack, preserves_flags)
        )
    };
    result
}

/// One CRC32C step over a 64-bit value, bit by bit (what `crc32cx` computes).
#[cfg(not(all(feature = "kernel", target_arch = "aarch64")))]
#[inline]
fn crc32c_u64(crc: u32, value: u64) -> u32 {
    crc32c_u64_portable(crc, value)
}

/// The portable CRC32C step (the kernel tests it against the instruction).
pub const fn crc32c_u64_portable(mut crc: u32, value: u64) -> u32 {
    let mut bit = 0;
    while bit < 64 {
        let feedback = (crc ^ (value >> bit) as u32) & 1;
        crc = (crc >> 1) ^ (0x82f6_3b78 & 0u32.wrapping_sub(feedback));
        bit += 1;
    }
    crc
}

/// [`hash_frames`] computed with [`crc32c_u64_portable`], whatever the build (tests compare).
pub fn hash_frames_portable(frames: &[u64]) -> u32 {
    let mut crc = !(frames.len() as u32);
    for frame in frames {
        crc = crc32c_u64_portable(crc, *frame);
    }
    finish(crc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_known_answer() {
        // CRC-32C("123456789") = 0xE3069283 (with the usual inversions), fed as one 8-byte word
        // and one byte: check the step against the standard on its first 8 bytes and the byte.
        let mut crc = !0u32;
        crc = crc32c_u64_portable(crc, u64::from_le_bytes(*b"12345678"));
        // The last byte, bit by bit.
        let mut last = crc ^ u32::from(b'9');
        for _ in 0..8 {
            last = (last >> 1) ^ (0x82f6_3b78 & 0u32.wrapping_sub(last & 1));
        }
        assert_eq!(!last, 0xe306_9283);
    }

    #[test]
    fn hash_depends_on_length_and_every_frame() {
        let base = [0xffff_ff80_4008_1234_u64; 16];
        let hash = hash_frames(&base);
        assert_ne!(hash, hash_frames(&base[..15]));
        for index in 0..16 {
            let mut changed = base;
            changed[index] ^= 4;
            assert_ne!(hash, hash_frames(&changed), "frame {index}");
        }
        assert_eq!(hash, hash_frames_portable(&base));
    }
}
