//! Frame walks over a [`StackSet`] that declares its stacks on demand (the kernel's shape).

use core::cell::Cell;

use super::{LAYOUT, SyntheticMemory, TEXT};
use crate::{Corruption, FrameMarker, FrameWalker, StackKind, StackRange, StackSet, StopReason, Trace, TraceOptions};

const TASK: StackRange = StackRange::new(0x4010_0000, 0x4010_4000, StackKind::Task);
const IRQ: StackRange = StackRange::new(0x4020_0000, 0x4020_1000, StackKind::Irq);

/// Declares `stacks`, counting how often the whole list is asked for.
struct CountingSet<'a> {
    stacks: &'a [StackRange],
    asked: Cell<usize>,
}

impl StackSet for CountingSet<'_> {
    fn first_records(&self) -> (u64, u64) {
        self.stacks.first_records()
    }

    fn declared(&self) -> &[StackRange] {
        self.asked.set(self.asked.get() + 1);
        self.stacks
    }
}

const fn code(n: u64) -> u64 {
    TEXT + 0x100 * n + 4
}

/// A chain of `depth` records 0x40 apart below `top - 40`, closed by a final marker there.
fn chain(memory: &mut SyntheticMemory, top: u64, depth: u64) -> u64 {
    let end = top - FrameMarker::SIZE;
    memory.write_words(end, &FrameMarker::final_frame().to_words());
    let newest = end - 0x40 * depth;
    for index in 0..depth {
        let at = newest + 0x40 * index;
        memory.write_words(at, &[at + 0x40, code(index)]);
    }
    newest
}

fn both(memory: &SyntheticMemory, stacks: &[StackRange], fp: u64, options: TraceOptions) -> (Trace, Trace, usize) {
    let set = CountingSet { stacks, asked: Cell::new(0) };
    let mut lazy = Trace::new();
    lazy.fill(|buffer| FrameWalker::over(memory, &set, LAYOUT).walk_from_frame(fp, options, buffer));
    let mut eager = Trace::new();
    eager.fill(|buffer| FrameWalker::new(memory, stacks, LAYOUT).walk_from_frame(fp, options, buffer));
    (lazy, eager, set.asked.get())
}

#[test]
fn a_walk_that_stays_in_the_first_stack_never_asks_for_the_list() {
    let mut memory = SyntheticMemory::new();
    let fp = chain(&mut memory, TASK.high, 20);
    // Up to the depth limit, before the final marker (whose bounds are checked on the list).
    for depth in [1, 5, 19] {
        let (lazy, eager, asked) = both(&memory, &[TASK, IRQ], fp, TraceOptions::new(0, depth));
        assert_eq!(lazy, eager);
        assert_eq!(asked, 0, "depth {depth}");
    }
    let (lazy, eager, _) = both(&memory, &[TASK, IRQ], fp, TraceOptions::ALL);
    assert_eq!(lazy, eager);
    assert_eq!(lazy.len(), 20);
}

#[test]
fn a_walk_that_leaves_the_first_stack_asks_and_agrees() {
    // An IRQ chain whose oldest record points into the task stack (a stack later in the order).
    let mut memory = SyntheticMemory::new();
    let task_fp = chain(&mut memory, TASK.high, 3);
    let irq_fp = IRQ.high - 0x200;
    memory.write_words(irq_fp, &[irq_fp + 0x40, code(30)]);
    memory.write_words(irq_fp + 0x40, &[task_fp, code(31)]);
    let (lazy, eager, asked) = both(&memory, &[IRQ, TASK], irq_fp, TraceOptions::ALL);
    assert_eq!(lazy, eager);
    assert_eq!(lazy.addresses(), &[code(30), code(31), code(0), code(1), code(2)]);
    assert!(asked > 0);
}

#[test]
fn every_start_gets_the_verdict_of_the_full_check() {
    // The fast start checks alignment and bounds itself and sends every start it refuses to
    // the full check: what each start gives, whichever way it went.
    let mut memory = SyntheticMemory::new();
    let task_fp = chain(&mut memory, TASK.high, 3);
    let irq_fp = chain(&mut memory, IRQ.high, 2);
    let outside = |address| StopReason::Corrupt { address, corruption: Corruption::OutsideStacks };
    let cases = [
        (0, StopReason::NullFramePointer, 0),
        (8, outside(8), 0),
        (irq_fp, StopReason::EndOfTask, 2),
        (irq_fp + 4, StopReason::Corrupt { address: irq_fp + 4, corruption: Corruption::Misaligned }, 0),
        (IRQ.low - 16, outside(IRQ.low - 16), 0),
        (IRQ.low, StopReason::Unreadable { address: IRQ.low }, 0),
        (IRQ.high - 16, StopReason::Corrupt { address: IRQ.high - 16, corruption: Corruption::MarkerTruncated }, 0),
        (IRQ.high - 8, outside(IRQ.high - 8), 0),
        (IRQ.high, outside(IRQ.high), 0),
        (task_fp, StopReason::EndOfTask, 3),
        (TASK.high - 8, outside(TASK.high - 8), 0),
        (u64::MAX - 7, outside(u64::MAX - 7), 0),
    ];
    for (fp, stop, len) in cases {
        let (lazy, eager, _) = both(&memory, &[IRQ, TASK], fp, TraceOptions::ALL);
        assert_eq!(lazy, eager, "start {fp:#x}");
        assert_eq!((lazy.stop_reason(), lazy.len()), (stop, len), "start {fp:#x}");
    }
}

#[test]
fn a_first_stack_too_small_for_a_record_holds_none() {
    for stack in [StackRange::new(0x1000, 0x1008, StackKind::Other), StackRange::new(0, 0x1000, StackKind::Other)] {
        let stacks = [stack];
        assert_eq!(stacks[..].first_records(), (1, 0));
    }
    let stacks: [StackRange; 0] = [];
    assert_eq!(stacks[..].first_records(), (1, 0));
    assert_eq!([TASK][..].first_records(), (TASK.low, TASK.high - 16));
}
