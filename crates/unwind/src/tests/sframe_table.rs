//! SFrame tables: encoding and decoding agree, lookup, and each corruption is caught.

use super::TEXT;
use crate::sframe::encode::{EncodeError, Function, table};
use crate::sframe::{FDE_SIZE, HEADER_SIZE};
use crate::{CfaBase, SFrameTable, TableError, UnwindRow};

/// Where the synthetic section is (function starts are relative to it).
pub const SECTION: u64 = TEXT + 0x10_0000;

pub const fn sp(offset: i32) -> UnwindRow {
    UnwindRow { cfa_base: CfaBase::StackPointer, cfa_offset: offset, ra_offset: None, fp_offset: None, ra_signed: true }
}

pub const fn saved(base: CfaBase, offset: i32, ra: i32, fp: i32) -> UnwindRow {
    UnwindRow { cfa_base: base, cfa_offset: offset, ra_offset: Some(ra), fp_offset: Some(fp), ra_signed: true }
}

/// The rows LLVM emits for `paciasp; str x30, [x18], #8; stp x29, x30, [sp, #-32]!;
/// mov x29, sp; ...body...; ldp x29, x30, [sp]; add sp, sp, #32; ldr x30, [x18, #-8]!;
/// autiasp; ret`, with the epilogue's row after `add sp` rewritten (RA and FP in registers).
pub fn framed(start: u64, size: u32) -> Function {
    let unsigned = UnwindRow { ra_signed: false, ..UnwindRow::ENTRY };
    Function {
        start,
        size,
        rows: vec![
            (0, unsigned),
            (4, sp(0)),
            (12, saved(CfaBase::StackPointer, 32, -24, -32)),
            (16, saved(CfaBase::FramePointer, 32, -24, -32)),
            (size - 16, sp(0)),
            (size - 4, unsigned),
        ],
    }
}

fn sample() -> Vec<Function> {
    vec![
        framed(TEXT + 0x100, 0x40),
        // Out of order on purpose: the encoder sorts.
        framed(TEXT, 0x80),
        // Wide: two-byte row starts, two-byte offsets.
        Function {
            start: TEXT + 0x1000,
            size: 0x2000,
            rows: vec![(0, UnwindRow::ENTRY), (0x1800, saved(CfaBase::StackPointer, 0x400, -0x3f8, -0x400))],
        },
        // Huge: four-byte row starts and offsets.
        Function {
            start: TEXT + 0x4_0000,
            size: 0x2_0000,
            rows: vec![(0, UnwindRow::ENTRY), (0x1_0000, saved(CfaBase::StackPointer, 0x10_0000, -8, -16))],
        },
    ]
}

#[test]
fn every_row_reads_back_at_every_address() {
    let functions = sample();
    let bytes = table(&functions, SECTION).unwrap();
    let sframe = SFrameTable::new(&bytes, SECTION).unwrap();
    assert_eq!(sframe.len(), 4);
    assert_eq!(sframe.check(), Ok(16));
    for function in &functions {
        for offset in (0..function.size).step_by(4) {
            let expected = function.rows.iter().rev().find(|(start, _)| *start <= offset).unwrap().1;
            assert_eq!(sframe.find(function.start + u64::from(offset)), Ok(Some(expected)), "{offset:#x}");
        }
    }
    // Sorted on the way out.
    let starts: Vec<u64> = (0..4).map(|index| sframe.function(index).unwrap().start).collect();
    assert_eq!(starts, [TEXT, TEXT + 0x100, TEXT + 0x1000, TEXT + 0x4_0000]);
}

#[test]
fn addresses_outside_every_function_have_no_row() {
    let bytes = table(&sample(), SECTION).unwrap();
    let sframe = SFrameTable::new(&bytes, SECTION).unwrap();
    for pc in [0, TEXT - 4, TEXT + 0x80, TEXT + 0xfc, TEXT + 0x140, TEXT + 0x3000, TEXT + 0x6_0000, u64::MAX] {
        assert_eq!(sframe.find(pc), Ok(None), "{pc:#x}");
    }
    let empty = table(&[], SECTION).unwrap();
    assert_eq!(SFrameTable::new(&empty, SECTION).unwrap().find(TEXT), Ok(None));
}

#[test]
fn the_header_is_binutils_v2_for_aarch64() {
    let bytes = table(&sample(), SECTION).unwrap();
    assert_eq!(&bytes[..8], &[0xe2, 0xde, 2, 1, 2, 0, 0, 0]);
    assert_eq!(u32::from_le_bytes(bytes[8..12].try_into().unwrap()), 4);
    assert_eq!(u32::from_le_bytes(bytes[12..16].try_into().unwrap()), 16);
    // FDE 0 (the lowest function) starts TEXT - SECTION from the section.
    let start = i32::from_le_bytes(bytes[HEADER_SIZE..HEADER_SIZE + 4].try_into().unwrap());
    assert_eq!(i64::from(start), TEXT as i64 - SECTION as i64);
}

#[test]
fn the_encoder_refuses_what_v2_cannot_say() {
    let far = Function { start: SECTION + (1 << 32), size: 4, rows: vec![(0, UnwindRow::ENTRY)] };
    assert_eq!(table(&[far], SECTION), Err(EncodeError::TooFar { start: SECTION + (1 << 32) }));
    let row = UnwindRow { fp_offset: Some(-16), ..UnwindRow::ENTRY };
    let fp_only = Function { start: TEXT, size: 4, rows: vec![(0, row)] };
    assert_eq!(table(&[fp_only], SECTION), Err(EncodeError::FpWithoutRa { start: TEXT }));
}

/// The sample table with `corrupt` applied, as `new`, `find` at every function and `check` see it.
fn corrupted(corrupt: impl FnOnce(&mut Vec<u8>)) -> Result<(), TableError> {
    let functions = sample();
    let mut bytes = table(&functions, SECTION).unwrap();
    corrupt(&mut bytes);
    let sframe = SFrameTable::new(&bytes, SECTION)?;
    for function in &functions {
        for offset in (0..function.size).step_by(4) {
            sframe.find(function.start + u64::from(offset))?;
        }
    }
    sframe.check().map(|_| ())
}

fn put_u32(bytes: &mut [u8], at: usize, value: u32) {
    bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
}

/// Byte offset of FDE `index`'s field at `field`.
fn fde(index: usize, field: usize) -> usize {
    HEADER_SIZE + index * FDE_SIZE + field
}

/// Byte offset of the rows of the sorted sample's first function (after 4 FDEs).
const ROWS: usize = HEADER_SIZE + 4 * FDE_SIZE;

#[test]
fn each_header_corruption_is_caught() {
    assert_eq!(corrupted(|_| ()), Ok(()));
    assert_eq!(corrupted(|bytes| bytes.truncate(HEADER_SIZE - 1)), Err(TableError::Truncated));
    assert_eq!(corrupted(|bytes| bytes[0] = 0xe3), Err(TableError::BadMagic));
    assert_eq!(corrupted(|bytes| bytes[2] = 1), Err(TableError::UnsupportedVersion));
    assert_eq!(corrupted(|bytes| bytes[3] = 0), Err(TableError::UnsupportedFlags));
    assert_eq!(corrupted(|bytes| bytes[3] = 0x9), Err(TableError::UnsupportedFlags));
    assert_eq!(corrupted(|bytes| bytes[4] = 3), Err(TableError::UnsupportedAbi));
    assert_eq!(corrupted(|bytes| bytes[6] = 0xf8), Err(TableError::UnsupportedAbi));
    assert_eq!(corrupted(|bytes| bytes[7] = 0xff), Err(TableError::Truncated));
    assert_eq!(corrupted(|bytes| put_u32(bytes, 8, 0x1000_0000)), Err(TableError::Truncated));
    assert_eq!(corrupted(|bytes| put_u32(bytes, 16, 0xffff_ffff)), Err(TableError::Truncated));
    assert_eq!(corrupted(|bytes| put_u32(bytes, 24, 0xffff_ff00)), Err(TableError::Truncated));
    assert_eq!(corrupted(|bytes| bytes.truncate(bytes.len() - 1)), Err(TableError::Truncated));
}

#[test]
fn each_function_corruption_is_caught() {
    // FRE type 3 does not exist; PCMASK functions are refused; rows past the sub-section.
    assert_eq!(corrupted(|bytes| bytes[fde(0, 16)] = 3), Err(TableError::BadFunction { index: 0 }));
    assert_eq!(corrupted(|bytes| bytes[fde(1, 16)] |= 0x10), Err(TableError::BadFunction { index: 1 }));
    assert_eq!(corrupted(|bytes| put_u32(bytes, fde(2, 8), 0x10_0000)), Err(TableError::BadFunction { index: 2 }));
    // Too many rows: the scan runs off the sub-section's end.
    assert_eq!(corrupted(|bytes| put_u32(bytes, fde(3, 12), 1000)), Err(TableError::Truncated));
    // Unsorted (the search cannot see it: `check` does), and overlapping.
    assert_eq!(
        corrupted(|bytes| {
            let (first, second) = (bytes[fde(0, 0)..fde(1, 0)].to_vec(), bytes[fde(1, 0)..fde(2, 0)].to_vec());
            bytes[fde(0, 0)..fde(1, 0)].copy_from_slice(&second);
            bytes[fde(1, 0)..fde(2, 0)].copy_from_slice(&first);
        }),
        Err(TableError::Unordered { index: 1 })
    );
    assert_eq!(corrupted(|bytes| put_u32(bytes, fde(0, 4), 0x200)), Err(TableError::Unordered { index: 1 }));
}

#[test]
fn each_row_corruption_is_caught() {
    // The first function's rows: start (1 byte), info, offsets. Row 0 is at ROWS.
    let info = ROWS + 1;
    let bad = Err(TableError::BadRow { index: 0 });
    assert_eq!(corrupted(|bytes| bytes[info] &= !0x1e), bad, "no offsets");
    assert_eq!(corrupted(|bytes| bytes[info] |= 0x1e), bad, "15 offsets");
    assert_eq!(corrupted(|bytes| bytes[info] |= 0x60), bad, "offset width code 3");
    // Row starts: the first not at 0; a later one going back; one past the function's end.
    assert_eq!(corrupted(|bytes| bytes[ROWS] = 4), bad);
    // Row 1 is at ROWS + 3 (start, info, one 1-byte offset); row 2 at ROWS + 6.
    assert_eq!(corrupted(|bytes| bytes[ROWS + 6] = 2), bad);
    assert_eq!(corrupted(|bytes| bytes[ROWS + 6] = 0x80), bad);
    // Row 2's offsets: CFA 32, RA -24, FP -32 (one byte each at ROWS + 8..11).
    assert_eq!(corrupted(|bytes| bytes[ROWS + 8] = 0xf0), bad, "negative CFA offset");
    assert_eq!(corrupted(|bytes| bytes[ROWS + 8] = 33), bad, "unaligned CFA offset");
    assert_eq!(corrupted(|bytes| bytes[ROWS + 9] = 8), bad, "RA above the CFA");
    assert_eq!(corrupted(|bytes| bytes[ROWS + 10] = 0xe4), bad, "unaligned FP slot");
}

#[test]
fn lookups_on_random_bytes_never_panic() {
    let mut rng = super::XorShift::new(0x5f3a);
    let good = table(&sample(), SECTION).unwrap();
    for _ in 0..20_000 {
        let mut bytes = good.clone();
        for _ in 0..1 + rng.below(4) {
            let at = rng.below(bytes.len() as u64) as usize;
            bytes[at] = rng.next_u64() as u8;
        }
        if rng.chance(10) {
            bytes.truncate(rng.below(bytes.len() as u64) as usize);
        }
        if let Ok(sframe) = SFrameTable::new(&bytes, SECTION) {
            let _ = sframe.check();
            for _ in 0..8 {
                let _ = sframe.find(TEXT + rng.below(0x6_0000));
            }
        }
    }
}

#[test]
fn packed_rows_read_back_and_unpackable_rows_are_refused() {
    let mut packed = 0;
    for function in sample() {
        for (_, row) in function.rows {
            // The huge function's frame is past what a packed row holds.
            let Some(word) = row.pack() else {
                assert!(row.cfa_offset > 8184, "{row:?}");
                continue;
            };
            assert_ne!(word, 0);
            assert_eq!(UnwindRow::unpack(word), row);
            packed += 1;
        }
    }
    assert!(packed > 5);
    for base in [CfaBase::StackPointer, CfaBase::FramePointer] {
        for ra_signed in [false, true] {
            for (cfa, ra, fp) in [
                (0, None, None),
                (8184, Some(-8), Some(-2040)),
                (64, Some(-24), Some(-32)),
                (32, Some(-2040), None),
                (48, None, Some(-16)),
            ] {
                let row = UnwindRow { cfa_base: base, cfa_offset: cfa, ra_offset: ra, fp_offset: fp, ra_signed };
                assert_eq!(row.pack().map(UnwindRow::unpack), Some(row));
            }
        }
    }
    // A frame record (RA right above FP) is marked for the walker's fast path; other rows not.
    let record = |ra, fp| UnwindRow { ra_offset: Some(ra), fp_offset: Some(fp), ..UnwindRow::ENTRY };
    assert_ne!(record(-8, -16).pack().unwrap() & crate::sframe::PACKED_RECORD, 0);
    assert_eq!(record(-16, -8).pack().unwrap() & crate::sframe::PACKED_RECORD, 0);
    assert_eq!(record(-8, -32).pack().unwrap() & crate::sframe::PACKED_RECORD, 0);
    for (cfa, ra, fp) in [
        (-16, None, None),
        (12, None, None),
        (8192, None, None),
        (16, Some(-2056), None),
        (16, Some(8), None),
        (16, None, Some(-12)),
    ] {
        let row = UnwindRow {
            cfa_base: CfaBase::StackPointer,
            cfa_offset: cfa,
            ra_offset: ra,
            fp_offset: fp,
            ra_signed: false,
        };
        assert_eq!(row.pack(), None, "{row:?}");
    }
}
