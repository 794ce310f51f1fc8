//! Fuzz target: on any table and memory image the SFrame walker ends and stays in bounds.
//!
//! The input is read as: one byte of mode (even: the table is raw bytes from the input; odd: a
//! valid table of three functions with up to seven bytes overwritten by the input; bit 1:
//! exception frames are crossed with the kernel's layout), a 16-bit
//! table length and the table's bytes (raw mode), one byte for how many stacks (1-3), per stack
//! a 16-bit offset and a 16-bit size inside a 64 KiB window, the start's PC, SP and x29 (both
//! near the first stack) and x30, then the memory from the lowest stack up. Memory outside the
//! stacks is readable too, so only the walker's own checks keep it in bounds; a read counter
//! catches loops.
#![no_main]

use std::cell::Cell;
use std::mem::MaybeUninit;

use libfuzzer_sys::fuzz_target;
use unwind::sframe::encode::{Function, table};
use unwind::{
    AddressLayout, CfaBase, ExceptionFrameLayout, Registers, SFrameStart, SFrameTable, SFrameWalker, StackKind,
    StackMemory, StackRange, TraceOptions, UnwindRow,
};

const WINDOW: u64 = 0x1_0000;
const BASE: u64 = 0x4000_0000;
const TEXT: u64 = 0xffff_ff80_4008_0000;
const SECTION: u64 = TEXT + 0x10_0000;

struct Image<'a> {
    /// The memory from `origin` up (0xa5 past its end).
    origin: u64,
    bytes: &'a [u8],
    allowed: &'a [StackRange],
    reads: Cell<usize>,
    max_reads: usize,
}

impl StackMemory for Image<'_> {
    fn read_u64(&self, address: u64) -> Option<u64> {
        assert!(
            self.allowed.iter().any(|stack| stack.contains(address, 8)),
            "read at {address:#x} outside {:x?}",
            self.allowed
        );
        self.reads.set(self.reads.get() + 1);
        assert!(self.reads.get() <= self.max_reads, "more reads than the termination bound");
        let offset = address.wrapping_sub(self.origin) as usize;
        let mut word = [0u8; 8];
        for (index, byte) in word.iter_mut().enumerate() {
            *byte = self.bytes.get(offset + index).copied().unwrap_or(0xa5);
        }
        Some(u64::from_le_bytes(word))
    }
}

fn take<const N: usize>(data: &mut &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    for (slot, byte) in out.iter_mut().zip(data.iter()) {
        *slot = *byte;
    }
    *data = data.get(N..).unwrap_or(&[]);
    out
}

/// Three functions with a prologue, a body and an epilogue each (what the converter writes).
fn valid_table() -> Vec<u8> {
    let saved = |base, offset| UnwindRow {
        cfa_base: base,
        cfa_offset: offset,
        ra_offset: Some(-8),
        fp_offset: Some(-16),
        ra_signed: true,
    };
    let signed = UnwindRow { ra_signed: true, ..UnwindRow::ENTRY };
    let functions: Vec<Function> = (0..3)
        .map(|index| Function {
            start: TEXT + 0x100 * index,
            size: 0x80,
            rows: vec![
                (0, UnwindRow::ENTRY),
                (4, signed),
                (12, saved(CfaBase::StackPointer, 32)),
                (16, saved(CfaBase::FramePointer, 16)),
                (0x70, signed),
                (0x7c, UnwindRow::ENTRY),
            ],
        })
        .collect();
    table(&functions, SECTION).expect("a valid table")
}

fuzz_target!(|input: &[u8]| {
    let mut data = input;
    let mode = take::<1>(&mut data)[0];
    let bytes = if mode & 1 == 0 {
        let length = usize::from(u16::from_le_bytes(take::<2>(&mut data))).min(data.len());
        let (raw, rest) = data.split_at(length);
        data = rest;
        raw.to_vec()
    } else {
        let mut bytes = valid_table();
        for _ in 0..mode >> 5 {
            let [at, value] = take::<2>(&mut data);
            let at = usize::from(at) % bytes.len();
            bytes[at] = value;
        }
        bytes
    };
    let Ok(sframe) = SFrameTable::new(&bytes, SECTION) else { return };
    let _ = sframe.check();

    let count = 1 + take::<1>(&mut data)[0] as usize % 3;
    let kinds = [StackKind::Overflow, StackKind::Irq, StackKind::Task];
    let stacks: Vec<StackRange> = (0..count)
        .map(|index| {
            let [a, b, c, d] = take::<4>(&mut data);
            let low = BASE + u64::from(u16::from_le_bytes([a, b])) % WINDOW;
            let size = u64::from(u16::from_le_bytes([c, d])) % 0x1000;
            StackRange::new(low, low + size, kinds[index])
        })
        .collect();
    let pc = TEXT + u64::from_le_bytes(take::<8>(&mut data)) % 0x400;
    // SP and x29 near the first stack (a little past either end too), so most walks start.
    let near = |word: u64| stacks[0].low.wrapping_sub(0x20) + word % (stacks[0].high - stacks[0].low + 0x40);
    let sp = near(u64::from_le_bytes(take::<8>(&mut data)));
    let fp = near(u64::from_le_bytes(take::<8>(&mut data)));
    let lr = u64::from_le_bytes(take::<8>(&mut data));
    let layout = AddressLayout::new(39);
    // Per frame at most two slot reads; the CFA rises by 16 at least; a marker is 3 more. With
    // exception frames crossed (the mode's bit 1, the kernel's layout), a crossing reads 7 words
    // and moves SP up by 16 at least or to a later stack.
    let crossing = mode & 2 != 0;
    let per_step = if crossing { 7 } else { 2 };
    let bound: usize =
        stacks.iter().map(|stack| per_step * ((stack.high - stack.low) as usize / 16 + 2) + 3).sum();
    // The input's bytes start at the lowest stack, so short inputs fill the stacks.
    let origin = stacks.iter().map(|stack| stack.low).min().unwrap_or(BASE);
    let image = Image { origin, bytes: data, allowed: &stacks, reads: Cell::new(0), max_reads: bound };
    let walker = SFrameWalker::new(&image, &stacks, &sframe, layout);
    let walker = if crossing { walker.with_exception_frames(ExceptionFrameLayout { sp: -40, lr: -48 }) } else { walker };
    let starts = [
        SFrameStart::Interrupted(Registers { pc, sp, fp, lr }),
        SFrameStart::CallSite { pc, sp, fp },
    ];
    for start in starts {
        let mut buffer = [MaybeUninit::uninit(); 64];
        image.reads.set(0);
        let walked = walker.walk(start, TraceOptions::new(usize::MAX, 64), &mut buffer);
        assert_eq!(walked.len, 0);
        image.reads.set(0);
        let walked = walker.walk(start, TraceOptions::ALL, &mut buffer);
        assert!(walked.len <= 64);
        let kept: Vec<u64> = walked.entries(&buffer).to_vec();
        // A short buffer: the same first entries, at most its length.
        image.reads.set(0);
        let short_len = 1 + (sp as usize % 7);
        let mut short = vec![MaybeUninit::uninit(); short_len];
        let walked = walker.walk(start, TraceOptions::ALL, &mut short);
        assert!(walked.len <= short_len);
        assert_eq!(walked.entries(&short), &kept[..walked.len]);
    }
});
