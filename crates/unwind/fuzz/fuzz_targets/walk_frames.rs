//! Fuzz target: on any memory image both walkers end and stay in bounds.
//!
//! It calls the walkers' entry points with caller buffers (including short
//! ones), and the instrumented frame walk, which must agree with the plain one.
//!
//! The input is read as: one byte for how many stacks (1-3), per stack a
//! 16-bit offset and 16-bit size inside a 64 KiB window (so stacks may
//! overlap or be misaligned), the start frame pointer and PC, then the
//! window's contents. Memory outside the stacks is readable too, so only the
//! walker's own checks keep it in bounds; a read counter catches loops.
#![no_main]

use std::cell::Cell;
use std::mem::MaybeUninit;

use libfuzzer_sys::fuzz_target;
use unwind::{
    AddressLayout, FrameStart, FrameWalker, ShadowSegment, ShadowStack, ShadowWalker, StackKind, StackMemory,
    StackRange, TraceOptions,
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
    let layout = AddressLayout::new(39);
    let bound: usize = stacks.iter().map(|stack| 5 * (stack.high - stack.low) as usize / 8 + 5).sum();
    let image = Image { bytes: data, allowed: &stacks, reads: Cell::new(0), max_reads: bound };
    let mut buffer = [MaybeUninit::uninit(); 64];

    let walker = FrameWalker::new(&image, &stacks, layout);
    let walked = walker.walk_from_frame(fp, TraceOptions::new(usize::MAX, 64), &mut buffer);
    assert_eq!(walked.len, 0);
    image.reads.set(0);
    let walked = walker.walk_from_context(pc, fp, TraceOptions::ALL, &mut buffer);
    assert!(walked.len <= 64);
    let kept: Vec<u64> = walked.entries(&buffer).to_vec();
    image.reads.set(0);
    let mut checked = [MaybeUninit::uninit(); 64];
    let again = walker.walk_instrumented(FrameStart::Context { pc, fp }, TraceOptions::ALL, &mut checked);
    assert_eq!(again, walked);
    assert_eq!(again.entries(&checked), &kept[..]);
    // A short buffer: the same first entries, at most its length.
    image.reads.set(0);
    let short_len = 1 + (fp as usize % 7);
    let mut short = vec![MaybeUninit::uninit(); short_len];
    let walked = walker.walk_from_context(pc, fp, TraceOptions::ALL, &mut short);
    assert!(walked.len <= short_len);
    assert_eq!(walked.entries(&short), &kept[..walked.len]);

    // The shadow walker over the first stack as an SCS area, x18 from the input.
    let area = ShadowStack::new(stacks[0].low, stacks[0].high);
    let in_use = [StackRange::new(area.base, fp.min(area.end.saturating_sub(8)), StackKind::Other)];
    let image = Image { bytes: data, allowed: &in_use, reads: Cell::new(0), max_reads: 2 * 0x1000 / 8 };
    let segments = [ShadowSegment::current(area, fp), ShadowSegment::interrupted(area, fp, pc)];
    let walked = ShadowWalker::new(&image, layout).walk(&segments, TraceOptions::new(usize::MAX, 64), &mut buffer);
    assert_eq!(walked.len, 0);
    image.reads.set(0);
    let walked = ShadowWalker::new(&image, layout).walk(&segments, TraceOptions::ALL, &mut short);
    assert!(walked.len <= short_len);
});
