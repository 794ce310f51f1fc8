//! Shadow-call-stack walker, and its agreement with the frame walker.

use super::{IntoTrace, LAYOUT, SyntheticMemory, TEXT, shadow_trace, sign};
use crate::{
    Corruption, EntryKind, FrameMarker, FrameWalker, SCS_END_MAGIC, ShadowSegment, ShadowStack, ShadowWalker,
    StackKind, StackRange, StopReason, TraceOptions, ViewDifference, view_difference,
};

/// A 1 KiB task SCS and a 1 KiB IRQ SCS.
const TASK_SCS: ShadowStack = ShadowStack::new(0x4040_0000, 0x4040_0400);
const IRQ_SCS: ShadowStack = ShadowStack::new(0x4041_0000, 0x4041_0400);

const fn code(n: u64) -> u64 {
    TEXT + 0x100 * n + 4
}

/// Pushes `entries` (oldest first) on `stack`, writes its end magic; returns x18.
fn push(memory: &mut SyntheticMemory, stack: ShadowStack, entries: &[u64]) -> u64 {
    memory.write(stack.end - 8, SCS_END_MAGIC);
    memory.write_words(stack.base, entries);
    stack.base + 8 * entries.len() as u64
}

fn walk(memory: &SyntheticMemory, segments: &[ShadowSegment], options: TraceOptions) -> crate::Trace {
    shadow_trace(&ShadowWalker::new(memory, LAYOUT), segments, options)
}

#[test]
fn in_use_entries_newest_first_stripped() {
    let mut memory = SyntheticMemory::new();
    memory.readable_everywhere = true;
    let x18 = push(&mut memory, TASK_SCS, &[sign(code(3), 1), code(2), sign(code(1), 2)]);
    let trace = walk(&memory, &[ShadowSegment::current(TASK_SCS, x18)], TraceOptions::ALL);
    assert_eq!(trace.addresses(), &[code(1), code(2), code(3)]);
    assert!(trace.entries().all(|entry| entry.kind == EntryKind::ReturnAddress));
    assert_eq!(trace.stop_reason(), StopReason::EndOfShadowStack);
    // Only [base, x18) was read.
    let in_use = StackRange::new(TASK_SCS.base, x18, StackKind::Task);
    memory.assert_reads_inside(&[in_use]);
    assert_eq!(memory.reads.borrow().len(), 3);
}

#[test]
fn empty_shadow_stack() {
    let memory = SyntheticMemory::new();
    let trace = walk(&memory, &[ShadowSegment::current(TASK_SCS, TASK_SCS.base)], TraceOptions::ALL);
    assert!(trace.is_empty());
    assert_eq!(trace.stop_reason(), StopReason::EndOfShadowStack);
    assert!(memory.reads.borrow().is_empty());
}

#[test]
fn full_shadow_stack_never_reports_the_end_magic() {
    let mut memory = SyntheticMemory::new();
    let entries: Vec<u64> = (0..127).map(code).collect();
    let x18 = push(&mut memory, TASK_SCS, &entries);
    assert_eq!(x18, TASK_SCS.end - 8, "127 entries fill a 1 KiB SCS up to the magic slot");
    let trace = walk(&memory, &[ShadowSegment::current(TASK_SCS, x18)], TraceOptions::new(63, 64));
    assert_eq!(trace.len(), 64);
    assert_eq!(trace.addresses()[0], code(126 - 63));
    assert_eq!(trace.stop_reason(), StopReason::EndOfShadowStack);
    assert!(!trace.addresses().contains(&SCS_END_MAGIC));
}

#[test]
fn bad_pointers_are_rejected_before_any_read() {
    let mut memory = SyntheticMemory::new();
    memory.readable_everywhere = true;
    let cases = [
        (TASK_SCS, TASK_SCS.base + 4, Corruption::Misaligned),
        (TASK_SCS, TASK_SCS.base - 8, Corruption::ShadowPointerOutOfBounds),
        // Past the magic slot: the SCS overflowed.
        (TASK_SCS, TASK_SCS.end, Corruption::ShadowPointerOutOfBounds),
        (ShadowStack::new(TASK_SCS.base + 4, TASK_SCS.end), TASK_SCS.base + 4, Corruption::ShadowPointerOutOfBounds),
        (ShadowStack::new(TASK_SCS.end, TASK_SCS.base), TASK_SCS.base, Corruption::ShadowPointerOutOfBounds),
    ];
    for (stack, pointer, corruption) in cases {
        let trace = walk(&memory, &[ShadowSegment::current(stack, pointer)], TraceOptions::ALL);
        assert!(trace.is_empty());
        assert!(
            matches!(trace.stop_reason(), StopReason::Corrupt { corruption: found, .. } if found == corruption),
            "{stack:x?} {pointer:#x}: {:?}",
            trace.stop_reason()
        );
    }
    assert!(memory.reads.borrow().is_empty());
}

#[test]
fn zero_entry_stops_the_walk() {
    let mut memory = SyntheticMemory::new();
    let x18 = push(&mut memory, TASK_SCS, &[code(4), 0, code(2), code(1)]);
    let trace = walk(&memory, &[ShadowSegment::current(TASK_SCS, x18)], TraceOptions::ALL);
    assert_eq!(trace.addresses(), &[code(1), code(2)]);
    assert_eq!(trace.stop_reason(), StopReason::ShadowZeroEntry);
}

#[test]
fn end_magic_among_the_entries_is_corrupt() {
    let mut memory = SyntheticMemory::new();
    let x18 = push(&mut memory, TASK_SCS, &[code(2), SCS_END_MAGIC, code(1)]);
    let trace = walk(&memory, &[ShadowSegment::current(TASK_SCS, x18)], TraceOptions::ALL);
    assert_eq!(trace.addresses(), &[code(1)]);
    assert_eq!(
        trace.stop_reason(),
        StopReason::Corrupt { address: TASK_SCS.base + 8, corruption: Corruption::EndMagicInUse }
    );
}

#[test]
fn ttbr0_value_in_a_shadow_stack_slot_is_corrupt() {
    for value in [0x0000_0040_0012_3456, sign(0x0000_0000_4008_0104, 0x4321)] {
        let mut memory = SyntheticMemory::new();
        let x18 = push(&mut memory, TASK_SCS, &[code(3), value, code(1)]);
        let trace = walk(&memory, &[ShadowSegment::current(TASK_SCS, x18)], TraceOptions::ALL);
        assert_eq!(trace.addresses(), &[code(1)]);
        assert_eq!(
            trace.stop_reason(),
            StopReason::Corrupt { address: TASK_SCS.base + 8, corruption: Corruption::LowerHalfAddress }
        );
    }
}

#[test]
fn buffer_shorter_than_the_depth_stops_at_its_length() {
    let mut memory = SyntheticMemory::new();
    let entries: Vec<u64> = (0..10).map(code).collect();
    let x18 = push(&mut memory, TASK_SCS, &entries);
    let walker = ShadowWalker::new(&memory, LAYOUT);
    let mut buffer = [core::mem::MaybeUninit::uninit(); 3];
    let walked = walker.walk(&[ShadowSegment::current(TASK_SCS, x18)], TraceOptions::new(2, 8), &mut buffer);
    assert_eq!(walked.stop, StopReason::DepthLimit);
    assert_eq!(walked.entries(&buffer), &[code(7), code(6), code(5)]);
    // Exactly as many entries as the buffer holds: the walk is complete.
    let walked = walker.walk(&[ShadowSegment::current(TASK_SCS, x18)], TraceOptions::new(7, 8), &mut buffer);
    assert_eq!(walked.stop, StopReason::EndOfShadowStack);
    assert_eq!(walked.entries(&buffer), &[code(2), code(1), code(0)]);
}

#[test]
fn unreadable_entry_stops_the_walk() {
    let memory = SyntheticMemory::new();
    let trace = walk(&memory, &[ShadowSegment::current(TASK_SCS, TASK_SCS.base + 16)], TraceOptions::ALL);
    assert_eq!(trace.stop_reason(), StopReason::Unreadable { address: TASK_SCS.base + 8 });
}

#[test]
fn interrupted_segment_is_chained_after_the_current_one() {
    let mut memory = SyntheticMemory::new();
    let irq_x18 = push(&mut memory, IRQ_SCS, &[code(20), code(21)]);
    let task_x18 = push(&mut memory, TASK_SCS, &[code(1), code(0)]);
    let elr = 0x4008_0abc;
    let segments = [ShadowSegment::current(IRQ_SCS, irq_x18), ShadowSegment::interrupted(TASK_SCS, task_x18, elr)];
    let trace = walk(&memory, &segments, TraceOptions::ALL);
    assert_eq!(trace.addresses(), &[code(21), code(20), elr, code(0), code(1)]);
    assert_eq!(trace.entry(2).map(|entry| entry.kind), Some(EntryKind::ExceptionPc));
    assert_eq!(trace.stop_reason(), StopReason::EndOfShadowStack);

    let trace = walk(&memory, &segments, TraceOptions::new(1, 2));
    assert_eq!(trace.addresses(), &[code(20), elr]);
    assert_eq!(trace.stop_reason(), StopReason::DepthLimit);
}

/// A machine state where both walkers can run: task functions 1 <- 2 <- 3
/// (3 interrupted at `elr`), IRQ handlers 20 <- 21 on the IRQ stacks.
/// `in_prologue`: function 3 was interrupted after its SCS push but before
/// `mov x29, sp`, so x29 still points at function 2's record.
fn both_views(in_prologue: bool) -> (crate::Trace, crate::Trace) {
    let task = StackRange::new(0x4010_0000, 0x4010_4000, StackKind::Task);
    let irq = StackRange::new(0x4020_0000, 0x4020_1000, StackKind::Irq);
    let mut memory = SyntheticMemory::new();
    let elr = 0x4008_0308;
    // Task frame records: function 3's, 2's, 1's (1 is the task's entry).
    let end = task.high - FrameMarker::SIZE;
    memory.write_words(end, &FrameMarker::final_frame().to_words());
    let rec1 = end - 0x40;
    let rec2 = rec1 - 0x40;
    let rec3 = rec2 - 0x40;
    memory.write_words(rec1, &[end, sign(code(0), 1)]);
    memory.write_words(rec2, &[rec1, sign(code(1), 2)]);
    memory.write_words(rec3, &[rec2, sign(code(2), 3)]);
    let interrupted_x29 = if in_prologue { rec2 } else { rec3 };
    // Task SCS: the same return addresses (signed differently: SP is the modifier).
    let task_x18 = push(&mut memory, TASK_SCS, &[sign(code(0), 9), sign(code(1), 8), sign(code(2), 7)]);
    // IRQ stack: marker, then the handlers' records.
    let marker_at = irq.high - 0x100;
    memory.write_words(marker_at, &FrameMarker::exception_boundary(elr, interrupted_x29).to_words());
    memory.write_words(marker_at - 0x40, &[marker_at, code(20)]);
    memory.write_words(marker_at - 0x80, &[marker_at - 0x40, code(21)]);
    let irq_x18 = push(&mut memory, IRQ_SCS, &[code(20), code(21)]);

    let stacks = [irq, task];
    let frames = FrameWalker::new(&memory, &stacks, LAYOUT).trace_from_frame(marker_at - 0x80, TraceOptions::ALL);
    let segments = [ShadowSegment::current(IRQ_SCS, irq_x18), ShadowSegment::interrupted(TASK_SCS, task_x18, elr)];
    let shadow = shadow_trace(&ShadowWalker::new(&memory, LAYOUT), &segments, TraceOptions::ALL);
    (frames, shadow)
}

#[test]
fn both_walkers_agree_outside_the_prologue_window() {
    let (frames, shadow) = both_views(false);
    assert_eq!(frames.addresses(), shadow.addresses());
    assert!(frames.entries().eq(shadow.entries()), "entry kinds agree too");
    assert_eq!(frames.stop_reason(), StopReason::EndOfTask);
    assert_eq!(shadow.stop_reason(), StopReason::EndOfShadowStack);
}

#[test]
fn in_the_prologue_window_the_shadow_trace_has_one_extra_entry() {
    // Function 3: nop; nop; paciasp; str x30,[x18],#8; stp x29,x30,[sp,#-16]!; mov x29,sp
    let function = [0xd503_201f, 0xd503_201f, 0xd503_233f, 0xf800_865e, 0xa9bf_7bfd, 0x9100_03fd];
    let pc_index = 4; // interrupted at the stp
    assert_eq!(view_difference(&function, pc_index), ViewDifference::ShadowHasExtraFrame);

    let (frames, shadow) = both_views(true);
    assert_eq!(shadow.len(), frames.len() + 1);
    // The extra entry is function 3's own return address, right after its PC.
    let pc_at = shadow.entries().position(|entry| entry.kind == EntryKind::ExceptionPc).unwrap();
    let mut without_extra: Vec<u64> = shadow.addresses().to_vec();
    assert_eq!(without_extra.remove(pc_at + 1), code(2));
    assert_eq!(without_extra, frames.addresses());
}
