//! The hash over a trace's frames (bucket choice and a fast first compare).

/// Hashes `frames` to 32 bits: a multiply-xorshift per frame and a
/// murmur3-style finalizer; the length is mixed in first.
///
/// An index loop rather than an iterator: with the `kernel` feature it is not
/// instrumented, and LLVM would not inline an instrumented `Iterator::next`.
#[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
#[inline]
pub fn hash_frames(frames: &[u64]) -> u32 {
    let mut hash = 0x9e37_79b9_7f4a_7c15_u64 ^ frames.len() as u64;
    let mut index = 0;
    while index < frames.len() {
        hash = (hash ^ frames[index]).wrapping_mul(0xff51_afd7_ed55_8ccd);
        hash ^= hash >> 29;
        index += 1;
    }
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    hash ^= hash >> 33;
    (hash as u32) ^ ((hash >> 32) as u32)
}
