//! Host tests for the instruction words and the callsite layout arithmetic.

use ftrace::{
    BRANCH_MAX_BACKWARD, BRANCH_MAX_FORWARD, BranchError, CallSite, MOV_X9_X30, MisalignedEntry, NOP, NOP_LITERAL,
    decode_bl, encode_bl, is_bl_to,
};

#[test]
fn fixed_words_match_their_encodings() {
    // ORR (shifted register), 64-bit: sf=1 opc=01 01010 shift=00 N=0 Rm imm6=0 Rn Rd.
    let (sf, opc, fixed, shift, n) = (1, 0b01, 0b01010, 0b00, 0);
    let orr = |rd: u32, rn: u32, rm: u32| {
        sf << 31 | opc << 29 | fixed << 24 | shift << 22 | n << 21 | rm << 16 | rn << 5 | rd
    };
    assert_eq!(MOV_X9_X30, orr(9, 31, 30));
    assert_eq!(MOV_X9_X30, 0xaa1e_03e9);
    // HINT #0.
    assert_eq!(NOP, 0xd503_201f);
    assert_eq!(NOP_LITERAL, 0xd503_201f_d503_201f);
}

#[test]
fn bl_words_and_limits() {
    assert_eq!(encode_bl(0x1000, 0x1004), Ok(0x9400_0001));
    assert_eq!(encode_bl(0x1004, 0x1000), Ok(0x97ff_ffff));
    let from = 0xffff_8000_1000_000c;
    assert_eq!(BRANCH_MAX_FORWARD, (128 << 20) - 4);
    assert_eq!(BRANCH_MAX_BACKWARD, -(128 << 20));
    assert_eq!(encode_bl(from, from + (1 << 27) - 4), Ok(0x95ff_ffff));
    assert_eq!(encode_bl(from, from - (1 << 27)), Ok(0x9600_0000));
    // PC arithmetic wraps modulo 2^64.
    assert_eq!(encode_bl(0, u64::MAX - 3), Ok(0x97ff_ffff));
}

#[test]
fn out_of_range_bl_is_an_error_never_a_wrong_branch() {
    let from = 0x4000_000c;
    for to in [from + (1 << 27), from - (1 << 27) - 4, from + (1 << 40), 0xffff_8000_0000_0000] {
        assert_eq!(encode_bl(from, to), Err(BranchError::OutOfRange { from, to }));
    }
    assert_eq!(encode_bl(from + 2, from), Err(BranchError::Misaligned { from: from + 2, to: from }));
    assert_eq!(encode_bl(from, from + 1), Err(BranchError::Misaligned { from, to: from + 1 }));
    assert!(BranchError::OutOfRange { from, to: 0 }.to_string().contains("128 MiB"));
}

#[test]
fn bl_round_trips_over_the_whole_range() {
    let from = 0x4008_0000_u64;
    let mut offset = BRANCH_MAX_BACKWARD;
    while offset <= BRANCH_MAX_FORWARD {
        let to = from.wrapping_add(offset as u64);
        let word = encode_bl(from, to).unwrap();
        assert_eq!(decode_bl(from, word), Some(to), "offset {offset}");
        assert!(is_bl_to(from, word, to));
        offset += 0x1_0004; // Steps through every imm26 bit pattern class.
    }
    assert_eq!(decode_bl(from, NOP), None);
    assert_eq!(decode_bl(from, 0x1400_0001), None); // B, not BL.
}

#[test]
fn callsite_layout() {
    let site = CallSite::new(0x4008_0040).unwrap();
    assert_eq!(site.entry(), 0x4008_0040);
    assert_eq!(site.literal(), 0x4008_0040);
    assert_eq!(site.function(), 0x4008_0048);
    assert_eq!(site.call(), 0x4008_004c);
    assert_eq!(site.return_address(), 0x4008_0050);
    // What the trampoline computes from x30: bic x11, x30, #7; ldr x11, [x11, #-16].
    assert_eq!(CallSite::from_return_address(site.return_address()), site);
    assert_eq!((site.return_address() & !7) - 16, site.literal());
    assert_eq!(site.bl_to(0x4008_004c + 0x100), Ok(0x9400_0040));
    assert_eq!(CallSite::new(0x4008_0044), Err(MisalignedEntry { entry: 0x4008_0044 }));
}
