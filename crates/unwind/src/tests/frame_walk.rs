//! Frame-pointer walker: chains, corrupted records, exception boundaries, PAC.

use super::{IntoTrace, LAYOUT, SyntheticMemory, TEXT, sign};
use crate::{
    Corruption, EntryKind, FrameMarker, FrameWalker, MAX_FRAMES, StackKind, StackRange, StopReason, Trace, TraceOptions,
};

const TASK: StackRange = StackRange::new(0x4010_0000, 0x4010_4000, StackKind::Task);
const IRQ: StackRange = StackRange::new(0x4020_0000, 0x4020_1000, StackKind::Irq);
const OVERFLOW: StackRange = StackRange::new(0x4030_0000, 0x4030_1000, StackKind::Overflow);
const STACKS: [StackRange; 3] = [OVERFLOW, IRQ, TASK];

/// Return addresses of made-up functions.
const fn code(n: u64) -> u64 {
    TEXT + 0x100 * n + 4
}

/// Writes a frame record {fp, lr} at `at`.
fn record(memory: &mut SyntheticMemory, at: u64, fp: u64, lr: u64) {
    memory.write_words(at, &[fp, lr]);
}

fn marker(memory: &mut SyntheticMemory, at: u64, marker: FrameMarker) {
    memory.write_words(at, &marker.to_words());
}

/// A task chain of `depth` records 0x40 apart from the stack's top, closed by
/// a final marker; returns the newest record's address.
fn task_chain(memory: &mut SyntheticMemory, depth: u64, lr: impl Fn(u64) -> u64) -> u64 {
    let end = TASK.high - FrameMarker::SIZE;
    marker(memory, end, FrameMarker::final_frame());
    let newest = end - 0x40 * depth;
    for index in 0..depth {
        let at = newest + 0x40 * index;
        record(memory, at, at + 0x40, lr(index));
    }
    newest
}

fn walk(memory: &SyntheticMemory, fp: u64, options: TraceOptions) -> Trace {
    FrameWalker::new(memory, &STACKS, LAYOUT).trace_from_frame(fp, options)
}

fn corrupt(address: u64, corruption: Corruption) -> StopReason {
    StopReason::Corrupt { address, corruption }
}

#[test]
fn normal_chain_ends_at_the_final_marker() {
    let mut memory = SyntheticMemory::new();
    let fp = task_chain(&mut memory, 3, code);
    let trace = walk(&memory, fp, TraceOptions::ALL);
    assert_eq!(trace.addresses(), &[code(0), code(1), code(2)]);
    assert!(trace.entries().all(|entry| entry.kind == EntryKind::ReturnAddress));
    assert_eq!(trace.stop_reason(), StopReason::EndOfTask);
    assert!(trace.stop_reason().is_complete());
    memory.assert_reads_inside(&STACKS);
}

#[test]
fn zero_frame_pointer_ends_an_unmarked_chain() {
    let mut memory = SyntheticMemory::new();
    record(&mut memory, TASK.high - 0x40, TASK.high - 0x20, code(1));
    record(&mut memory, TASK.high - 0x20, 0, code(2));
    let trace = walk(&memory, TASK.high - 0x40, TraceOptions::ALL);
    assert_eq!(trace.addresses(), &[code(1), code(2)]);
    assert_eq!(trace.stop_reason(), StopReason::NullFramePointer);
}

#[test]
fn pac_signed_and_unsigned_return_addresses_are_stripped() {
    let mut memory = SyntheticMemory::new();
    let fp =
        task_chain(
            &mut memory,
            4,
            |index| {
                if index % 2 == 0 { sign(code(index), 0xa5a5 + index as u16) } else { code(index) }
            },
        );
    let trace = walk(&memory, fp, TraceOptions::ALL);
    assert_eq!(trace.addresses(), &[code(0), code(1), code(2), code(3)]);
    assert_eq!(trace.stop_reason(), StopReason::EndOfTask);
}

#[test]
fn high_half_return_addresses_are_stripped_to_the_high_half() {
    let kernel_code = 0xffff_ff80_0008_1234_u64;
    let mut memory = SyntheticMemory::new();
    let fp = task_chain(&mut memory, 2, |index| sign(kernel_code + 8 * index, 0x1234));
    assert_ne!(sign(kernel_code, 0x1234), kernel_code, "the test PAC must change the address");
    let trace = walk(&memory, fp, TraceOptions::ALL);
    assert_eq!(trace.addresses(), &[kernel_code, kernel_code + 8]);
}

#[test]
fn misaligned_frame_pointer_is_corrupt() {
    let mut memory = SyntheticMemory::new();
    record(&mut memory, TASK.high - 0x40, TASK.high - 0x1c, code(1));
    let trace = walk(&memory, TASK.high - 0x40, TraceOptions::ALL);
    assert_eq!(trace.addresses(), &[code(1)]);
    assert_eq!(trace.stop_reason(), corrupt(TASK.high - 0x1c, Corruption::Misaligned));
}

#[test]
fn record_outside_every_stack_is_corrupt_and_not_read() {
    let mut memory = SyntheticMemory::new();
    memory.readable_everywhere = true;
    record(&mut memory, TASK.high - 0x40, 0x5000_0000, code(1));
    let trace = walk(&memory, TASK.high - 0x40, TraceOptions::ALL);
    assert_eq!(trace.stop_reason(), corrupt(0x5000_0000, Corruption::OutsideStacks));
    memory.assert_reads_inside(&STACKS);
}

#[test]
fn record_straddling_the_stack_top_is_outside() {
    let mut memory = SyntheticMemory::new();
    memory.readable_everywhere = true;
    record(&mut memory, TASK.high - 0x40, TASK.high - 8, code(1));
    let trace = walk(&memory, TASK.high - 0x40, TraceOptions::ALL);
    assert_eq!(trace.stop_reason(), corrupt(TASK.high - 8, Corruption::OutsideStacks));
    memory.assert_reads_inside(&STACKS);
}

#[test]
fn backward_pointer_and_self_cycle_are_not_monotonic() {
    let mut memory = SyntheticMemory::new();
    let (a, b) = (TASK.high - 0x80, TASK.high - 0x40);
    record(&mut memory, a, b, code(1));
    record(&mut memory, b, a, code(2)); // cycle a -> b -> a
    let trace = walk(&memory, a, TraceOptions::ALL);
    assert_eq!(trace.addresses(), &[code(1), code(2)]);
    assert_eq!(trace.stop_reason(), corrupt(a, Corruption::NotMonotonic));

    let mut memory = SyntheticMemory::new();
    record(&mut memory, a, a, code(1)); // points at itself
    let trace = walk(&memory, a, TraceOptions::ALL);
    assert_eq!(trace.stop_reason(), corrupt(a, Corruption::NotMonotonic));
}

#[test]
fn cycle_across_stacks_breaks_the_stack_order() {
    let mut memory = SyntheticMemory::new();
    let irq_record = IRQ.high - 0x40;
    let task_record = TASK.high - 0x40;
    record(&mut memory, irq_record, task_record, code(1));
    record(&mut memory, task_record, irq_record + 0x10, code(2)); // back up into the IRQ stack
    let trace = walk(&memory, irq_record, TraceOptions::ALL);
    assert_eq!(trace.addresses(), &[code(1), code(2)]);
    assert_eq!(trace.stop_reason(), corrupt(irq_record + 0x10, Corruption::StackOrder));
}

#[test]
fn stacks_may_be_skipped_in_order() {
    // Overflow stack straight to the task stack (no IRQ in between) is allowed.
    let mut memory = SyntheticMemory::new();
    let fp = task_chain(&mut memory, 1, code);
    record(&mut memory, OVERFLOW.low + 0x100, fp, code(9));
    let trace = walk(&memory, OVERFLOW.low + 0x100, TraceOptions::ALL);
    assert_eq!(trace.addresses(), &[code(9), code(0)]);
    assert_eq!(trace.stop_reason(), StopReason::EndOfTask);
}

#[test]
fn zero_return_address_is_corrupt() {
    let mut memory = SyntheticMemory::new();
    record(&mut memory, TASK.high - 0x40, TASK.high - 0x20, 0);
    let trace = walk(&memory, TASK.high - 0x40, TraceOptions::ALL);
    assert_eq!(trace.stop_reason(), corrupt(TASK.high - 0x40, Corruption::ZeroReturnAddress));

    // A PAC on a null address is a lower-half word, refused before any stripping.
    let mut memory = SyntheticMemory::new();
    record(&mut memory, TASK.high - 0x40, TASK.high - 0x20, sign(0, 0x7fff));
    let trace = walk(&memory, TASK.high - 0x40, TraceOptions::ALL);
    assert_eq!(trace.stop_reason(), corrupt(TASK.high - 0x40, Corruption::LowerHalfAddress));
}

#[test]
fn ttbr0_return_address_in_a_frame_record_is_corrupt() {
    // A user-space (TTBR0) address, signed or not: never a kernel return address, and
    // stripping it with the kernel's `orr` would turn it into one.
    for lr in [0x0000_0040_0012_3456, sign(0x0000_0000_4008_0104, 0x1234)] {
        let mut memory = SyntheticMemory::new();
        let fp = task_chain(&mut memory, 3, |index| if index == 1 { lr } else { code(index) });
        let trace = walk(&memory, fp, TraceOptions::ALL);
        assert_eq!(trace.addresses(), &[code(0)]);
        assert_eq!(trace.stop_reason(), corrupt(fp + 0x40, Corruption::LowerHalfAddress));
    }
}

#[test]
fn buffer_shorter_than_the_depth_stops_at_its_length() {
    let mut memory = SyntheticMemory::new();
    let fp = task_chain(&mut memory, 10, code);
    let walker = FrameWalker::new(&memory, &STACKS, LAYOUT);
    let mut buffer = [core::mem::MaybeUninit::uninit(); 3];
    let walked = walker.walk_from_frame(fp, TraceOptions::new(1, 8), &mut buffer);
    assert_eq!(walked.len, 3);
    assert_eq!(walked.stop, StopReason::DepthLimit);
    assert_eq!(walked.entries(&buffer), &[code(1), code(2), code(3)]);
    // The same walk into a long enough buffer goes on.
    let mut buffer = [core::mem::MaybeUninit::uninit(); 64];
    let walked = walker.walk_from_frame(fp, TraceOptions::new(1, 8), &mut buffer);
    assert_eq!(walked.len, 8);
    // A buffer of nothing: a depth limit before the first entry.
    let walked = walker.walk_from_frame(fp, TraceOptions::ALL, &mut []);
    assert_eq!((walked.len, walked.stop), (0, StopReason::DepthLimit));
}

#[test]
fn instrumented_walk_is_the_same_walk() {
    let mut memory = SyntheticMemory::new();
    let fp = irq_scenario(&mut memory, 0x4008_0abc);
    let walker = FrameWalker::new(&memory, &STACKS, LAYOUT);
    let mut plain = [core::mem::MaybeUninit::uninit(); 64];
    let mut checked = [core::mem::MaybeUninit::uninit(); 64];
    let start = crate::FrameStart::Record(fp);
    let first = walker.walk(start, TraceOptions::new(1, 64), &mut plain);
    let second = walker.walk_instrumented(start, TraceOptions::new(1, 64), &mut checked);
    assert_eq!(first, second);
    assert_eq!(first.entries(&plain), second.entries(&checked));
    assert_eq!(first.len, 4);
}

#[test]
fn unreadable_stack_word_stops_the_walk() {
    let memory = SyntheticMemory::new();
    let trace = walk(&memory, TASK.high - 0x40, TraceOptions::ALL);
    assert!(trace.is_empty());
    assert_eq!(trace.stop_reason(), StopReason::Unreadable { address: TASK.high - 0x40 });
}

/// An IRQ taken in the task: handler frames on the IRQ stack, a boundary
/// marker, then the interrupted task's frames.
fn irq_scenario(memory: &mut SyntheticMemory, interrupted_pc: u64) -> u64 {
    let task_fp = task_chain(memory, 2, code);
    let marker_at = IRQ.high - 0x100;
    marker(memory, marker_at, FrameMarker::exception_boundary(interrupted_pc, task_fp));
    record(memory, marker_at - 0x40, marker_at, sign(code(20), 7));
    record(memory, marker_at - 0x80, marker_at - 0x40, code(21));
    marker_at - 0x80
}

#[test]
fn exception_boundary_continues_in_the_interrupted_context() {
    let mut memory = SyntheticMemory::new();
    let elr = 0x4008_0abc;
    let fp = irq_scenario(&mut memory, elr);
    let trace = walk(&memory, fp, TraceOptions::ALL);
    assert_eq!(trace.addresses(), &[code(21), code(20), elr, code(0), code(1)]);
    let kinds: Vec<_> = trace.entries().map(|entry| entry.kind).collect();
    assert_eq!(kinds[2], EntryKind::ExceptionPc);
    assert_eq!(kinds.iter().filter(|kind| **kind == EntryKind::ExceptionPc).count(), 1);
    assert_eq!(trace.stop_reason(), StopReason::EndOfTask);
    memory.assert_reads_inside(&STACKS);
}

#[test]
fn exception_boundary_within_one_stack() {
    // A synchronous exception taken on the task stack: the marker sits below
    // the interrupted frames, which is still upward progress.
    let mut memory = SyntheticMemory::new();
    let task_fp = task_chain(&mut memory, 2, code);
    let marker_at = task_fp - 0x200;
    marker(&mut memory, marker_at, FrameMarker::exception_boundary(0, task_fp));
    record(&mut memory, marker_at - 0x30, marker_at, code(30));
    let trace = walk(&memory, marker_at - 0x30, TraceOptions::ALL);
    // A null ELR (branch to 0) is reported, not taken for corruption.
    assert_eq!(trace.addresses(), &[code(30), 0, code(0), code(1)]);
    assert_eq!(trace.entry(1).map(|entry| entry.kind), Some(EntryKind::ExceptionPc));
    assert_eq!(trace.stop_reason(), StopReason::EndOfTask);
}

#[test]
fn boundary_back_into_a_left_stack_is_corrupt() {
    let mut memory = SyntheticMemory::new();
    let marker_at = TASK.high - 0x100;
    marker(&mut memory, marker_at, FrameMarker::exception_boundary(code(1), IRQ.high - 0x40));
    let trace = walk(&memory, marker_at, TraceOptions::ALL);
    assert_eq!(trace.addresses(), &[code(1)]);
    assert_eq!(trace.stop_reason(), corrupt(IRQ.high - 0x40, Corruption::StackOrder));
}

#[test]
fn unknown_and_truncated_markers_are_corrupt() {
    let mut memory = SyntheticMemory::new();
    let at = TASK.high - 0x100;
    memory.write_words(at, &[0, 0, 7, code(1), TASK.high - 0x40]);
    let trace = walk(&memory, at, TraceOptions::ALL);
    assert!(trace.is_empty());
    assert_eq!(trace.stop_reason(), corrupt(at, Corruption::UnknownMarkerKind));

    let mut memory = SyntheticMemory::new();
    memory.readable_everywhere = true;
    let at = TASK.high - 0x20; // a 16-byte record fits, the 40-byte marker does not
    memory.write_words(at, &[0, 0]);
    let trace = walk(&memory, at, TraceOptions::ALL);
    assert_eq!(trace.stop_reason(), corrupt(at, Corruption::MarkerTruncated));
    memory.assert_reads_inside(&STACKS);
}

#[test]
fn marker_layout_matches_the_documented_offsets() {
    assert_eq!(FrameMarker::SIZE, 40);
    assert_eq!(FrameMarker::KIND_OFFSET, 16);
    assert_eq!(FrameMarker::PC_OFFSET, 24);
    assert_eq!(FrameMarker::INTERRUPTED_FP_OFFSET, 32);
    assert_eq!(FrameMarker::exception_boundary(0x10, 0x20).to_words(), [0, 0, 1, 0x10, 0x20]);
    assert_eq!(FrameMarker::final_frame().to_words(), [0; 5]);
}

#[test]
fn skip_and_max_depth() {
    let mut memory = SyntheticMemory::new();
    let fp = task_chain(&mut memory, 5, code);

    let trace = walk(&memory, fp, TraceOptions::new(1, 2));
    assert_eq!(trace.addresses(), &[code(1), code(2)]);
    assert_eq!(trace.stop_reason(), StopReason::DepthLimit);

    // Exactly as deep as the chain: the walk still sees the final marker.
    let trace = walk(&memory, fp, TraceOptions::new(0, 5));
    assert_eq!(trace.len(), 5);
    assert_eq!(trace.stop_reason(), StopReason::EndOfTask);

    let trace = walk(&memory, fp, TraceOptions::new(10, 64));
    assert!(trace.is_empty());
    assert_eq!(trace.stop_reason(), StopReason::EndOfTask);

    let trace = walk(&memory, fp, TraceOptions::new(0, 0));
    assert!(trace.is_empty());
    assert_eq!(trace.stop_reason(), StopReason::DepthLimit);
}

#[test]
fn long_chain_fills_the_trace() {
    let mut memory = SyntheticMemory::new();
    let fp = task_chain(&mut memory, 100, code);
    let trace = walk(&memory, fp, TraceOptions::new(0, 1000));
    assert_eq!(trace.len(), MAX_FRAMES);
    assert_eq!(trace.entry(63).map(|entry| entry.address), Some(code(63)));
    assert_eq!(trace.stop_reason(), StopReason::DepthLimit);
}

#[test]
fn walk_from_context_reports_the_pc_first() {
    let mut memory = SyntheticMemory::new();
    let fp = task_chain(&mut memory, 2, code);
    let walker = FrameWalker::new(&memory, &STACKS, LAYOUT);
    let trace = walker.trace_from_context(0x4008_0f00, fp, TraceOptions::ALL);
    assert_eq!(trace.addresses(), &[0x4008_0f00, code(0), code(1)]);
    assert_eq!(trace.entry(0).map(|entry| entry.kind), Some(EntryKind::ExceptionPc));
    assert_eq!(trace.entry(1).map(|entry| entry.kind), Some(EntryKind::ReturnAddress));

    let trace = walker.trace_from_context(0x4008_0f00, fp, TraceOptions::new(1, 64));
    assert_eq!(trace.addresses(), &[code(0), code(1)]);
}

#[test]
fn stop_reasons_print() {
    let reason = corrupt(0x1234, Corruption::NotMonotonic);
    assert_eq!(reason.to_string(), "corrupted at 0x1234: frame pointer not moving up");
    assert_eq!(StopReason::EndOfTask.to_string(), "end of task");
}
