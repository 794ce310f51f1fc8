//! Seeded random memory images: the walkers terminate and stay in bounds.
//!
//! A xorshift generator instead of proptest keeps the build light. Each case
//! is reproducible from its seed, printed on failure.

use std::collections::HashMap;

use super::{IntoTrace, LAYOUT, SyntheticMemory, TEXT, XorShift, shadow_trace};
use crate::{
    FrameWalker, MAX_FRAMES, SCS_END_MAGIC, ShadowSegment, ShadowStack, ShadowWalker, StackKind, StackRange,
    StopReason, TraceOptions,
};

const CASES: u64 = if cfg!(miri) { 50 } else { 20_000 };

/// Stacks placed in a small window so that they sometimes overlap, with
/// sizes and bounds that are sometimes not 8-aligned.
fn random_stacks(rng: &mut XorShift) -> Vec<StackRange> {
    let kinds = [StackKind::Overflow, StackKind::Irq, StackKind::Task];
    let count = 1 + rng.below(3) as usize;
    (0..count)
        .map(|index| {
            let mut low = 0x1_0000 + rng.below(0x800) * 8;
            let mut size = 16 + rng.below(64) * 8;
            if rng.chance(10) {
                low += rng.below(8);
            }
            if rng.chance(10) {
                size += rng.below(8);
            }
            StackRange::new(low, low + size, kinds[index])
        })
        .collect()
}

/// A word that is likely to matter to a walker: pointers into the stacks
/// (forwards, backwards, misaligned, just outside), zeros, markers' kinds.
fn interesting_word(rng: &mut XorShift, stacks: &[StackRange]) -> u64 {
    let stack = stacks[rng.below(stacks.len() as u64) as usize];
    match rng.below(20) {
        0 | 1 => 0,
        2 | 3 => rng.below(3),
        4 => stack.low + rng.below(stack.high - stack.low + 1),
        5 => stack.high - rng.below(24),
        6 => stack.low.wrapping_sub(rng.below(24)),
        7 => u64::MAX - rng.below(64),
        8 => rng.next_u64(),
        _ => (stack.low + rng.below(stack.high - stack.low)) & !7,
    }
}

fn random_image(rng: &mut XorShift, stacks: &[StackRange]) -> SyntheticMemory {
    let mut memory = SyntheticMemory::new();
    memory.readable_everywhere = true;
    // How record-shaped the image is: some images give long walks, others many ways to end.
    let structured = [40, 60, 90][rng.below(3) as usize];
    for stack in stacks {
        let mut address = stack.low & !7;
        while address < stack.high {
            // Mostly record-shaped pairs (a forward pointer, then a signed kernel return
            // address), so that walks are long as well as hostile.
            let record_word = (address - (stack.low & !7)) % 16 == 0;
            let word = if !rng.chance(structured) {
                interesting_word(rng, stacks)
            } else if record_word {
                address + 16 * (1 + rng.below(3))
            } else {
                super::sign(TEXT + rng.below(0x1_0000) * 4, rng.below(0x1_0000) as u16)
            };
            memory.write(address, word);
            address += 8;
        }
    }
    memory
}

/// The bound the crate docs promise: at most `size / 8` records per stack,
/// each costing at most five reads.
fn read_bound(stacks: &[StackRange]) -> usize {
    stacks.iter().map(|stack| 5 * (stack.high.saturating_sub(stack.low) / 8 + 1) as usize).sum()
}

#[test]
fn frame_walker_terminates_and_stays_inside_the_stacks() {
    let mut reasons = HashMap::new();
    let mut longest_walk = 0;
    for seed in 1..=CASES {
        let mut rng = XorShift::new(seed);
        let stacks = random_stacks(&mut rng);
        let mut memory = random_image(&mut rng, &stacks);
        memory.max_reads = read_bound(&stacks);
        let start = interesting_word(&mut rng, &stacks);
        let walker = FrameWalker::new(&memory, &stacks, LAYOUT);
        // Skip everything, so that only the walk's own rules can end it.
        let never_full = TraceOptions::new(usize::MAX, MAX_FRAMES);
        let trace = walker.trace_from_frame(start, never_full);
        assert!(trace.is_empty(), "seed {seed}");
        memory.assert_reads_inside(&stacks);
        longest_walk = longest_walk.max(memory.reads.borrow().len());
        let reason = match trace.stop_reason() {
            StopReason::Corrupt { corruption, .. } => format!("{corruption:?}"),
            other => format!("{other:?}").split(' ').next().unwrap_or_default().to_owned(),
        };
        *reasons.entry(reason).or_insert(0) += 1;
        let trace = walker.trace_from_context(start ^ 4, start, TraceOptions::ALL);
        assert!(trace.len() <= MAX_FRAMES, "seed {seed}");
        memory.assert_reads_inside(&stacks);
    }
    // The generator must reach every way a walk can end, or it proves little.
    if !cfg!(miri) {
        for reason in [
            "EndOfTask",
            "NullFramePointer",
            "Misaligned",
            "OutsideStacks",
            "NotMonotonic",
            "StackOrder",
            "ZeroReturnAddress",
            "LowerHalfAddress",
            "MarkerTruncated",
            "UnknownMarkerKind",
        ] {
            assert!(reasons.contains_key(reason), "no walk ended with {reason}: {reasons:?}");
        }
        assert!(longest_walk >= 20, "walks too short to mean much: {longest_walk} reads");
        eprintln!("stop reasons: {reasons:?}, longest walk {longest_walk} reads");
    }
}

#[test]
fn random_chains_are_followed_exactly() {
    // Well-formed random chains: the walker must report every return address.
    for seed in 1..=CASES / 10 {
        let mut rng = XorShift::new(seed);
        let task = StackRange::new(0x2_0000, 0x2_0000 + 0x2000, StackKind::Task);
        let mut memory = SyntheticMemory::new();
        let depth = rng.below(40);
        let mut at = task.high - 40;
        memory.write_words(at, &[0, 0, 0, 0, 0]);
        let mut expected = Vec::new();
        for _ in 0..depth {
            let below = at - 16 - 8 * rng.below(8);
            let lr = TEXT + rng.below(0x1_0000) * 4;
            memory.write_words(below, &[at, super::sign(lr, rng.below(0x1_0000) as u16)]);
            expected.push(lr);
            at = below;
        }
        expected.reverse();
        let trace = FrameWalker::new(&memory, &[task], LAYOUT).trace_from_frame(at, TraceOptions::ALL);
        assert_eq!(trace.addresses(), expected, "seed {seed}");
        assert_eq!(trace.stop_reason(), crate::StopReason::EndOfTask, "seed {seed}");
    }
}

#[test]
fn shadow_walker_reads_only_in_use_slots() {
    for seed in 1..=CASES {
        let mut rng = XorShift::new(seed);
        let base = 0x3_0000 + rng.below(64) * 8 + if rng.chance(5) { 4 } else { 0 };
        let end = base + 8 * rng.below(40) + if rng.chance(5) { 2 } else { 0 };
        let stack = ShadowStack::new(base, end);
        let mut memory = SyntheticMemory::new();
        memory.readable_everywhere = true;
        for slot in 0..40 {
            let word = match rng.below(8) {
                0 => 0,
                1 => SCS_END_MAGIC,
                _ => rng.next_u64(),
            };
            memory.write((base & !7) + 8 * slot, word);
        }
        let pointer = base.wrapping_add(rng.below(48) * 8).wrapping_sub(32) ^ (rng.below(2) * 4);
        let segments = [ShadowSegment::current(stack, pointer), ShadowSegment::interrupted(stack, pointer, 0x1234)];
        let trace = shadow_trace(&ShadowWalker::new(&memory, LAYOUT), &segments, TraceOptions::new(usize::MAX, 64));
        assert!(trace.is_empty());
        let in_use = StackRange::new(base, pointer.min(end.saturating_sub(8)), StackKind::Other);
        memory.assert_reads_inside(&[in_use]);
        assert!(memory.reads.borrow().len() <= 2 * 40, "seed {seed}");
    }
}
