//! The hit path's record compare and hash, on every length that exercises their quad, pair and
//! odd-frame steps.

use core::sync::atomic::AtomicU64;

use crate::hash::{hash_frames, hash_frames_portable};
use crate::record::frames_equal;

fn frames(length: usize, salt: u64) -> Vec<u64> {
    (0..length as u64).map(|index| 0xffff_ff80_4008_0000 + (index * 0x40 + salt) * 4).collect()
}

#[test]
fn a_record_equals_its_frames_and_no_frame_is_skipped() {
    for length in 1..=13 {
        let wanted = frames(length, 7);
        let stored: Vec<AtomicU64> = wanted.iter().map(|frame| AtomicU64::new(*frame)).collect();
        // SAFETY: `stored` holds `length` words.
        assert!(unsafe { frames_equal(stored.as_ptr(), &wanted) }, "length {length}");
        for differing in 0..length {
            let mut other = wanted.clone();
            other[differing] ^= 4;
            // SAFETY: as above.
            assert!(!unsafe { frames_equal(stored.as_ptr(), &other) }, "length {length}, frame {differing}");
        }
    }
}

#[test]
fn the_hash_reads_every_frame_of_every_length() {
    for length in 1..=13 {
        let base = frames(length, 3);
        let hash = hash_frames(&base);
        assert_eq!(hash, hash_frames_portable(&base), "length {length}");
        for differing in 0..length {
            let mut other = base.clone();
            other[differing] ^= 4;
            assert_ne!(hash, hash_frames(&other), "length {length}, frame {differing}");
        }
    }
}
