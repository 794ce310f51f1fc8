//! Fuzz target: on any memory image both walkers end and stay in bounds.
//!
//! The input is read as: one byte for how many stacks (1-3), per stack a
//! 16-bit offset and 16-bit size inside a 64 KiB window (so stacks may
//! overlap or be misaligned), the start frame pointer and PC, then the
//! window's contents. Memory outside the stacks is readable too, so only the
//! walker's own checks keep it in bounds; a read counter catches loops.
#![no_main]

use std::cell::Cell;

use libfuzzer_sys::fuzz_target;
use unwind::{
    FrameWalker, ShadowSegment, ShadowStack, ShadowWalker, StackKind, StackMemory, StackRange,
    TraceOptions, strip_pac_va_bits,
};

const WINDOW: u64 = 0x1_0000;
const BASE: u64 = 0x4000_0000;

struct Image<'a> {
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
        let offset = address.wrapping_sub(BASE) as usize;
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

fuzz_target!(|input: &[u8]| {
    let mut data = input;
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
    let fp = BASE + u64::from_le_bytes(take::<8>(&mut data)) % (WINDOW + 0x100);
    let pc = u64::from_le_bytes(take::<8>(&mut data));
    let strip = |address| strip_pac_va_bits(address, 39);
    let bound: usize = stacks.iter().map(|stack| 5 * (stack.high - stack.low) as usize / 8 + 5).sum();
    let image = Image { bytes: data, allowed: &stacks, reads: Cell::new(0), max_reads: bound };

    let walker = FrameWalker::new(&image, &stacks, strip);
    let trace = walker.walk_from_frame(fp, TraceOptions::new(usize::MAX, 64));
    assert!(trace.is_empty());
    image.reads.set(0);
    let trace = walker.walk_from_context(pc, fp, TraceOptions::ALL);
    assert!(trace.len() <= 64);

    // The shadow walker over the first stack as an SCS area, x18 from the input.
    let area = ShadowStack::new(stacks[0].low, stacks[0].high);
    let in_use = [StackRange::new(area.base, fp.min(area.end.saturating_sub(8)), StackKind::Other)];
    let image = Image { bytes: data, allowed: &in_use, reads: Cell::new(0), max_reads: 2 * 0x1000 / 8 };
    let segments = [ShadowSegment::current(area, fp), ShadowSegment::interrupted(area, fp, pc)];
    let trace = ShadowWalker::new(&image, strip).walk(&segments, TraceOptions::new(usize::MAX, 64));
    assert!(trace.is_empty());
});
