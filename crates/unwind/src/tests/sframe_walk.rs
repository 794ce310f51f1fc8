//! The SFrame walker over synthetic stacks and hand-made tables, sound and corrupt.

use super::sframe_table::{SECTION, framed, saved, sp};
use super::{IntoTrace, LAYOUT, SyntheticMemory, TEXT, XorShift, sign};
use core::cell::Cell;

use crate::sframe::PACKED_RECORD;
use crate::sframe::encode::{Function, table};
use crate::{
    CfaBase, Corruption, ExceptionFrameLayout, FrameMarker, FrameWalker, HijackedReturn, Registers, ReturnRepair,
    ReturnStack, RowLookup, SFrameStart, SFrameTable, SFrameWalker, StackKind, StackRange, StopReason, TableError,
    Trace, TraceOptions, UnwindRow,
};

const TASK: StackRange = StackRange::new(0x4010_0000, 0x4010_4000, StackKind::Task);
const IRQ: StackRange = StackRange::new(0x4020_0000, 0x4020_1000, StackKind::Irq);

/// Three framed functions A (the newest), B, C, and the trampoline's return address (no row).
const A: u64 = TEXT;
const B: u64 = TEXT + 0x100;
const C: u64 = TEXT + 0x200;
const SIZE: u32 = 0x80;
/// Return addresses: into B (A's caller), into C (B's caller), into the trampoline (C's).
const RETURN_INTO_B: u64 = B + 0x20;
const RETURN_INTO_C: u64 = C + 0x24;
const RETURN_INTO_TRAMPOLINE: u64 = TEXT + 0x1004;
/// The final marker, and the SP the trampoline called C with.
const MARKER: u64 = TASK.high - 0x40;
/// B's and C's frame records (each function's frame is 32 bytes, its record at the bottom).
const C_RECORD: u64 = MARKER - 32;
const B_RECORD: u64 = MARKER - 64;

fn functions() -> Vec<Function> {
    vec![framed(A, SIZE), framed(B, SIZE), framed(C, SIZE)]
}

/// The chain C -> B -> A on the task stack, closed by a final marker; records signed.
fn chain() -> SyntheticMemory {
    let mut memory = SyntheticMemory::new();
    memory.write_words(MARKER, &FrameMarker::final_frame().to_words());
    memory.write_words(C_RECORD, &[MARKER, sign(RETURN_INTO_TRAMPOLINE, 0x11)]);
    memory.write_words(B_RECORD, &[C_RECORD, sign(RETURN_INTO_C, 0x22)]);
    memory
}

fn walk(
    memory: &SyntheticMemory,
    table: &SFrameTable,
    start: SFrameStart,
    options: TraceOptions,
    repair: Option<&dyn ReturnRepair>,
) -> Trace {
    let stacks = [IRQ, TASK];
    let mut walker = SFrameWalker::new(memory, &stacks, table, LAYOUT);
    if let Some(repair) = repair {
        walker = walker.with_repair(repair);
    }
    let mut trace = Trace::new();
    trace.fill(|buffer| walker.walk(start, options, buffer));
    memory.assert_reads_inside(&stacks);
    trace
}

/// A interrupted at `offset` (its frame not built, or already gone): SP is B's, x29 B's record.
fn a_interrupted_at(offset: u64) -> SFrameStart {
    SFrameStart::Interrupted(Registers { pc: A + offset, sp: B_RECORD, fp: B_RECORD, lr: sign(RETURN_INTO_B, 0x33) })
}

fn with_table<T>(functions: &[Function], body: impl FnOnce(&SFrameTable) -> T) -> T {
    let bytes = table(functions, SECTION).unwrap();
    body(&SFrameTable::new(&bytes, SECTION).unwrap())
}

#[test]
fn an_interrupted_prologue_is_walked_whole_where_frame_records_miss_a_caller() {
    let memory = chain();
    with_table(&functions(), |table| {
        let trace = walk(&memory, table, a_interrupted_at(8), TraceOptions::ALL, None);
        assert_eq!(trace.addresses(), &[A + 8, RETURN_INTO_B, RETURN_INTO_C, RETURN_INTO_TRAMPOLINE]);
        assert_eq!(trace.stop_reason(), StopReason::EndOfTask);
        assert_eq!(trace.entry(0).unwrap().kind, crate::EntryKind::ExceptionPc);
        assert_eq!(trace.entry(1).unwrap().kind, crate::EntryKind::ReturnAddress);
        // x29 is still B's record: the frame walk skips B, A's caller.
        let stacks = [IRQ, TASK];
        let frames = FrameWalker::new(&memory, &stacks, LAYOUT).trace_from_context(A + 8, B_RECORD, TraceOptions::ALL);
        assert_eq!(frames.addresses(), &[A + 8, RETURN_INTO_C, RETURN_INTO_TRAMPOLINE]);
    });
}

#[test]
fn every_instruction_of_the_interrupted_function_gives_the_same_callers() {
    with_table(&functions(), |table| {
        for offset in (0..u64::from(SIZE)).step_by(4) {
            // A's frame exists from its `stp` (offset 8 executed: rows from 12) until its
            // epilogue's `add sp` (size - 16): there, SP is 32 lower and A's record holds B's.
            let built = (12..u64::from(SIZE) - 16).contains(&offset);
            let mut memory = chain();
            let start = if built {
                let record = B_RECORD - 32;
                memory.write_words(record, &[B_RECORD, sign(RETURN_INTO_B, 0x44)]);
                let fp = if offset >= 16 { record } else { B_RECORD };
                SFrameStart::Interrupted(Registers { pc: A + offset, sp: record, fp, lr: 0xdead })
            } else {
                a_interrupted_at(offset)
            };
            let trace = walk(&memory, table, start, TraceOptions::ALL, None);
            assert_eq!(
                trace.addresses(),
                &[A + offset, RETURN_INTO_B, RETURN_INTO_C, RETURN_INTO_TRAMPOLINE],
                "offset {offset:#x}"
            );
            assert_eq!(trace.stop_reason(), StopReason::EndOfTask);
        }
    });
}

#[test]
fn a_call_site_start_agrees_with_the_frame_walk() {
    let memory = chain();
    with_table(&functions(), |table| {
        let start = SFrameStart::CallSite { pc: RETURN_INTO_B, sp: B_RECORD, fp: B_RECORD };
        let trace = walk(&memory, table, start, TraceOptions::ALL, None);
        let stacks = [IRQ, TASK];
        let frames = FrameWalker::new(&memory, &stacks, LAYOUT).trace_from_frame(B_RECORD, TraceOptions::ALL);
        assert_eq!(trace, frames);
        assert_eq!(trace.addresses(), &[RETURN_INTO_C, RETURN_INTO_TRAMPOLINE]);
    });
}

#[test]
fn skip_depth_and_short_buffers_behave_as_in_the_other_walkers() {
    let memory = chain();
    with_table(&functions(), |table| {
        let trace = walk(&memory, table, a_interrupted_at(4), TraceOptions::new(1, 2), None);
        assert_eq!(trace.addresses(), &[RETURN_INTO_B, RETURN_INTO_C]);
        assert_eq!(trace.stop_reason(), StopReason::DepthLimit);
        let trace = walk(&memory, table, a_interrupted_at(4), TraceOptions::new(9, 2), None);
        assert!(trace.is_empty());
        let stacks = [IRQ, TASK];
        let walker = SFrameWalker::new(&memory, &stacks, table, LAYOUT);
        let mut short = [core::mem::MaybeUninit::uninit(); 3];
        let walked = walker.walk(a_interrupted_at(4), TraceOptions::ALL, &mut short);
        assert_eq!(walked.entries(&short), &[A + 4, RETURN_INTO_B, RETURN_INTO_C]);
        assert_eq!(walked.stop, StopReason::DepthLimit);
        assert_eq!(walked.exception_pcs, 1);
    });
}

#[test]
fn the_unrewritten_scs_epilogue_row_is_refused() {
    // What LLVM says after `add sp` in an SCS epilogue: RA and FP still at CFA-8 and CFA-16,
    // with CFA = SP, i.e. below SP (dead stack an interrupt may overwrite).
    let mut functions = functions();
    let epilogue = functions[0].rows.iter_mut().find(|(start, _)| *start == SIZE - 16).unwrap();
    epilogue.1 = saved(CfaBase::StackPointer, 0, -8, -16);
    let memory = chain();
    with_table(&functions, |table| {
        let trace = walk(&memory, table, a_interrupted_at(u64::from(SIZE) - 16), TraceOptions::ALL, None);
        assert_eq!(trace.addresses(), &[A + u64::from(SIZE) - 16]);
        assert_eq!(
            trace.stop_reason(),
            StopReason::Corrupt { address: B_RECORD - 8, corruption: Corruption::SlotOutsideFrame }
        );
    });
}

/// Walks the chain with `corrupt` applied to memory and returns how it stopped.
fn stop_with(corrupt: impl FnOnce(&mut SyntheticMemory)) -> StopReason {
    let mut memory = chain();
    corrupt(&mut memory);
    with_table(&functions(), |table| walk(&memory, table, a_interrupted_at(4), TraceOptions::ALL, None).stop_reason())
}

#[test]
fn each_stack_corruption_is_caught() {
    let corrupt = |address, corruption| StopReason::Corrupt { address, corruption };
    // B's saved FP pointing down: C's CFA (FP + 32) would not rise.
    assert_eq!(stop_with(|m| m.write(B_RECORD, B_RECORD - 64)), corrupt(B_RECORD - 32, Corruption::CfaNotMonotonic));
    // ... equal to the previous CFA: not strictly rising.
    assert_eq!(stop_with(|m| m.write(B_RECORD, B_RECORD)), corrupt(C_RECORD, Corruption::CfaNotMonotonic));
    // ... out of the stack.
    assert_eq!(stop_with(|m| m.write(B_RECORD, TASK.high)), corrupt(TASK.high + 32, Corruption::CfaNotMonotonic));
    // ... misaligned.
    assert_eq!(stop_with(|m| m.write(B_RECORD, C_RECORD + 8)), corrupt(MARKER + 8, Corruption::Misaligned));
    // A zero and a lower-half return address.
    assert_eq!(stop_with(|m| m.write(B_RECORD + 8, 0)), corrupt(C_RECORD, Corruption::ZeroReturnAddress));
    assert_eq!(stop_with(|m| m.write(B_RECORD + 8, 0x4000_1234)), corrupt(C_RECORD, Corruption::LowerHalfAddress));
    // An unreadable slot.
    assert_eq!(
        stop_with(|m| {
            m.words.remove(&(C_RECORD + 8));
        }),
        StopReason::Unreadable { address: C_RECORD + 8 }
    );
    // The end: an unknown marker kind; an exception boundary; no marker at all.
    assert_eq!(stop_with(|m| m.write(MARKER + 16, 7)), corrupt(MARKER, Corruption::UnknownMarkerKind));
    assert_eq!(stop_with(|m| m.write(MARKER, 1)), StopReason::NoUnwindInfo { pc: RETURN_INTO_TRAMPOLINE });
    let mut memory = chain();
    memory.write_words(MARKER, &FrameMarker::exception_boundary(sign(C + 8, 0x55), 0).to_words());
    with_table(&functions(), |table| {
        let trace = walk(&memory, table, a_interrupted_at(4), TraceOptions::ALL, None);
        assert_eq!(trace.addresses(), &[A + 4, RETURN_INTO_B, RETURN_INTO_C, RETURN_INTO_TRAMPOLINE, C + 8]);
        assert_eq!(trace.stop_reason(), StopReason::ExceptionBoundary);
        assert_eq!(trace.entry(4).unwrap().kind, crate::EntryKind::ExceptionPc);
    });
}

#[test]
fn each_bad_start_is_caught() {
    let memory = chain();
    with_table(&functions(), |table| {
        let registers = Registers { pc: A + 4, sp: TASK.high + 16, fp: 0, lr: 0 };
        let trace = walk(&memory, table, SFrameStart::Interrupted(registers), TraceOptions::ALL, None);
        assert_eq!(
            trace.stop_reason(),
            StopReason::Corrupt { address: TASK.high + 16, corruption: Corruption::OutsideStacks }
        );
        let registers = Registers { sp: B_RECORD + 8, ..registers };
        let trace = walk(&memory, table, SFrameStart::Interrupted(registers), TraceOptions::ALL, None);
        assert_eq!(
            trace.stop_reason(),
            StopReason::Corrupt { address: B_RECORD + 8, corruption: Corruption::Misaligned }
        );
        // A call site whose row says RA is still in x30: only an interrupted frame has x30.
        let start = SFrameStart::CallSite { pc: A + 5, sp: B_RECORD, fp: B_RECORD };
        let trace = walk(&memory, table, start, TraceOptions::ALL, None);
        assert_eq!(
            trace.stop_reason(),
            StopReason::Corrupt { address: B_RECORD, corruption: Corruption::ReturnAddressInRegister }
        );
        // A PC no function covers.
        let start = SFrameStart::CallSite { pc: TEXT + 0x5001, sp: B_RECORD, fp: 0x1234 };
        let trace = walk(&memory, table, start, TraceOptions::ALL, None);
        assert_eq!(trace.stop_reason(), StopReason::NoUnwindInfo { pc: TEXT + 0x5001 });
    });
}

#[test]
fn each_table_corruption_met_during_a_walk_is_caught() {
    let memory = chain();
    let mut bytes = table(&functions(), SECTION).unwrap();
    // C's FDE (the third) gets an FRE type that does not exist.
    bytes[crate::sframe::HEADER_SIZE + 2 * crate::sframe::FDE_SIZE + 16] = 3;
    let sframe = SFrameTable::new(&bytes, SECTION).unwrap();
    let trace = walk(&memory, &sframe, a_interrupted_at(4), TraceOptions::ALL, None);
    assert_eq!(trace.addresses(), &[A + 4, RETURN_INTO_B, RETURN_INTO_C]);
    assert_eq!(
        trace.stop_reason(),
        StopReason::Corrupt { address: RETURN_INTO_C, corruption: Corruption::UnwindTable }
    );
    // A row (unchecked table) whose RA slot is at the CFA: outside the frame.
    let row = UnwindRow { ra_offset: Some(0), fp_offset: Some(-16), ..sp(16) };
    let bad = vec![Function { start: A, size: SIZE, rows: vec![(0, row)] }];
    with_table(&bad, |table| {
        let trace = walk(&memory, table, a_interrupted_at(4), TraceOptions::ALL, None);
        assert_eq!(
            trace.stop_reason(),
            StopReason::Corrupt { address: B_RECORD + 16, corruption: Corruption::SlotOutsideFrame }
        );
    });
}

const TRAMPOLINE: u64 = TEXT + 0x8000;

struct Repair<'a>(&'a ReturnStack<4>);

impl ReturnRepair for Repair<'_> {
    fn trampoline(&self) -> u64 {
        TRAMPOLINE
    }
    fn frame_return(&self, record: u64) -> Option<u64> {
        self.0.frame_return(record, TRAMPOLINE)
    }
    fn shadow_return(&self, slot: u64) -> Option<u64> {
        self.0.shadow_return(slot, TRAMPOLINE)
    }
}

#[test]
fn hijacked_returns_are_repaired_from_the_saved_slot_and_from_x30() {
    // B is probed: its return address (in its record, and in x30 at its entry) is the
    // trampoline; its instance's entry SP is B's CFA.
    let mut memory = chain();
    memory.write(B_RECORD + 8, sign(TRAMPOLINE, 0x66));
    let mut returns = ReturnStack::new();
    returns
        .push(HijackedReturn { entry_sp: C_RECORD, shadow_slot: 0, real: RETURN_INTO_C, cookie: 0, data: 0 })
        .unwrap();
    let repair = Repair(&returns);
    with_table(&functions(), |table| {
        let plain = walk(&memory, table, a_interrupted_at(4), TraceOptions::ALL, None);
        // Unrepaired, the walk cannot go on: the trampoline is code without rows (the frame walk
        // goes on through the records, reporting the trampoline).
        assert_eq!(plain.addresses(), &[A + 4, RETURN_INTO_B, TRAMPOLINE]);
        assert_eq!(plain.stop_reason(), StopReason::NoUnwindInfo { pc: TRAMPOLINE });
        let repaired = walk(&memory, table, a_interrupted_at(4), TraceOptions::ALL, Some(&repair));
        assert_eq!(repaired.addresses(), &[A + 4, RETURN_INTO_B, RETURN_INTO_C, RETURN_INTO_TRAMPOLINE]);
        // B interrupted at its first instruction: the trampoline is in x30.
        let start =
            SFrameStart::Interrupted(Registers { pc: B, sp: C_RECORD, fp: C_RECORD, lr: sign(TRAMPOLINE, 0x77) });
        let repaired = walk(&memory, table, start, TraceOptions::ALL, Some(&repair));
        assert_eq!(repaired.addresses(), &[B, RETURN_INTO_C, RETURN_INTO_TRAMPOLINE]);
    });
}

#[test]
fn random_stacks_and_starts_terminate_and_stay_inside() {
    let mut rng = XorShift::new(0x5f4a_3e11);
    let bytes = table(&functions(), SECTION).unwrap();
    let sframe = SFrameTable::new(&bytes, SECTION).unwrap();
    let stacks = [IRQ, TASK];
    for case in 0..5_000 {
        let mut memory = SyntheticMemory::new();
        memory.readable_everywhere = true;
        memory.max_reads = 4 * ((TASK.high - TASK.low) as usize / 16 + 8);
        let near = |rng: &mut XorShift| {
            let stack = if rng.chance(50) { TASK } else { IRQ };
            (stack.low + rng.below(stack.high - stack.low + 64)) & !(if rng.chance(80) { 15 } else { 0 })
        };
        for _ in 0..64 {
            let address = near(&mut rng) & !7;
            let value = match rng.below(4) {
                0 => near(&mut rng),
                1 => sign(TEXT + rng.below(0x400), rng.next_u64() as u16),
                2 => 0,
                _ => rng.next_u64(),
            };
            memory.write(address, value);
        }
        let registers = Registers {
            pc: TEXT + rng.below(0x400),
            sp: near(&mut rng),
            fp: near(&mut rng),
            lr: sign(TEXT + rng.below(0x400), 1),
        };
        let start = if rng.chance(50) {
            SFrameStart::Interrupted(registers)
        } else {
            SFrameStart::CallSite { pc: registers.pc, sp: registers.sp, fp: registers.fp }
        };
        let walker = SFrameWalker::new(&memory, &stacks, &sframe, LAYOUT);
        let mut trace = Trace::new();
        trace.fill(|buffer| walker.walk(start, TraceOptions::ALL, buffer));
        // The full step alone (no packed rows) gives the same trace and stop as the fast path.
        let full_step = FullStepOnly(&sframe);
        let mut slow = Trace::new();
        slow.fill(|buffer| {
            SFrameWalker::new(&memory, &stacks, &full_step, LAYOUT).walk(start, TraceOptions::ALL, buffer)
        });
        assert_eq!(trace, slow, "case {case}");
        // Arbitrary packed words: wrong traces allowed, reads outside the stacks not.
        let hostile = HostileRows { table: &sframe, state: Cell::new(rng.next_u64() | 1) };
        let mut ignored = Trace::new();
        ignored.fill(|buffer| {
            SFrameWalker::new(&memory, &stacks, &hostile, LAYOUT).walk(start, TraceOptions::ALL, buffer)
        });
        for &address in memory.reads.borrow().iter() {
            assert!(
                stacks.iter().any(|stack| stack.contains(address, 8)),
                "case {case}: read at {address:#x} outside the stacks"
            );
        }
    }
}

/// The table with no packed rows: every frame takes the walker's full step.
struct FullStepOnly<'t>(&'t SFrameTable<'t>);

impl RowLookup for FullStepOnly<'_> {
    fn find(&self, pc: u64) -> Result<Option<UnwindRow>, TableError> {
        self.0.find(pc)
    }

    fn find_packed(&self, _pc: u64) -> u32 {
        0
    }
}

/// The table, but every packed row a random word (half of them marked as a frame record).
struct HostileRows<'t> {
    table: &'t SFrameTable<'t>,
    state: Cell<u64>,
}

impl RowLookup for HostileRows<'_> {
    fn find(&self, pc: u64) -> Result<Option<UnwindRow>, TableError> {
        self.table.find(pc)
    }

    fn find_packed(&self, _pc: u64) -> u32 {
        let mut x = self.state.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.state.set(x);
        let word = (x >> 16) as u32;
        if x & 1 == 0 { word | PACKED_RECORD } else { word }
    }
}

#[test]
fn an_exception_frame_is_crossed_into_the_interrupted_context() {
    // A handler (A) on the IRQ stack, called from code without rows whose x29 is the boundary
    // marker of an exception frame on the task stack; the frame interrupted B at its second
    // instruction (RA still in x30), B called by C, C by the task's trampoline.
    const IRQ_RECORD: u64 = IRQ.high - 0x40;
    const RETURN_INTO_VECTORS: u64 = TEXT + 0x2004;
    const FRAME_MARKER: u64 = C_RECORD - 0x100;
    let layout = ExceptionFrameLayout { sp: -40, lr: -48 };
    let interrupted = || {
        let mut memory = chain();
        memory.write_words(IRQ_RECORD, &[FRAME_MARKER, sign(RETURN_INTO_VECTORS, 0x66)]);
        memory.write_words(FRAME_MARKER, &FrameMarker::exception_boundary(B + 4, C_RECORD).to_words());
        memory.write(FRAME_MARKER - 40, C_RECORD);
        memory.write(FRAME_MARKER - 48, sign(RETURN_INTO_C, 0x77));
        memory
    };
    let memory = interrupted();
    let start = SFrameStart::CallSite { pc: A + 0x20, sp: IRQ_RECORD, fp: IRQ_RECORD };
    let stacks = [IRQ, TASK];
    with_table(&functions(), |table| {
        let crossing = SFrameWalker::new(&memory, &stacks, table, LAYOUT).with_exception_frames(layout);
        let mut trace = Trace::new();
        trace.fill(|buffer| crossing.walk(start, TraceOptions::ALL, buffer));
        memory.assert_reads_inside(&stacks);
        assert_eq!(trace.addresses(), &[RETURN_INTO_VECTORS, B + 4, RETURN_INTO_C, RETURN_INTO_TRAMPOLINE]);
        assert_eq!(trace.entry(1).unwrap().kind, crate::EntryKind::ExceptionPc);
        assert_eq!(trace.stop_reason(), StopReason::EndOfTask);
        // Without the layout the walk stops at the boundary, its interrupted PC last.
        let stopping = walk(&memory, table, start, TraceOptions::ALL, None);
        assert_eq!(stopping.addresses(), &[RETURN_INTO_VECTORS, B + 4]);
        assert_eq!(stopping.stop_reason(), StopReason::ExceptionBoundary);
        // An interrupted SP at or below the marker in its stack, outside the stacks or
        // misaligned; the saved SP's word outside the marker's stack.
        for (sp, corruption) in [
            (FRAME_MARKER, Corruption::NotMonotonic),
            (TASK.high + 0x100, Corruption::OutsideStacks),
            (C_RECORD + 8, Corruption::Misaligned),
        ] {
            let mut corrupt = interrupted();
            corrupt.write(FRAME_MARKER - 40, sp);
            let mut trace = Trace::new();
            let walker = SFrameWalker::new(&corrupt, &stacks, table, LAYOUT).with_exception_frames(layout);
            trace.fill(|buffer| walker.walk(start, TraceOptions::ALL, buffer));
            assert_eq!(trace.stop_reason(), StopReason::Corrupt { address: sp, corruption });
        }
        let far = ExceptionFrameLayout { sp: 0x10_0000, lr: -48 };
        let walker = SFrameWalker::new(&memory, &stacks, table, LAYOUT).with_exception_frames(far);
        let mut trace = Trace::new();
        trace.fill(|buffer| walker.walk(start, TraceOptions::ALL, buffer));
        assert_eq!(
            trace.stop_reason(),
            StopReason::Corrupt { address: FRAME_MARKER + 0x10_0000, corruption: Corruption::MarkerTruncated }
        );
    });
}
