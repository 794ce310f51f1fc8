//! Return-instance stack and the walkers' repair of hijacked return addresses.

use super::{IntoTrace, LAYOUT, SyntheticMemory, TEXT, shadow_trace, sign};
use crate::{
    FrameMarker, FrameWalker, HijackedReturn, ReturnRepair, ReturnStack, ReturnStackFull, SCS_END_MAGIC, ShadowSegment,
    ShadowStack, ShadowWalker, StackKind, StackRange, TraceOptions,
};

const TASK: StackRange = StackRange::new(0x4010_0000, 0x4010_4000, StackKind::Task);
const TASK_SCS: ShadowStack = ShadowStack::new(0x4040_0000, 0x4040_0400);
const TRAMPOLINE: u64 = TEXT + 0x1_0000;

const fn code(n: u64) -> u64 {
    TEXT + 0x100 * n + 4
}

fn hijack(entry_sp: u64, shadow_slot: u64, real: u64) -> HijackedReturn {
    HijackedReturn { entry_sp, shadow_slot, real, cookie: 0, data: 0 }
}

struct Repair<'a>(&'a ReturnStack<8>);

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

/// A chain of 5 frames 0x40 apart, newest first: f0 (the walk's start) called by f1 .. f4;
/// f1 and f3 are probed, so their records hold the (signed) trampoline. Instance i's entry SP
/// is the top of f_i's frame (the record of its caller lies at entry_sp - 0x10 .. above).
fn hijacked_chain(memory: &mut SyntheticMemory, returns: &mut ReturnStack<8>) -> u64 {
    let end = TASK.high - FrameMarker::SIZE;
    memory.write_words(end, &FrameMarker::final_frame().to_words());
    let newest = end - 0x40 * 5;
    let record_of = |index: u64| newest + 0x40 * index;
    for index in 0..5 {
        let lr = if index == 1 || index == 3 { sign(TRAMPOLINE, 0x1234 + index as u16) } else { code(index) };
        memory.write_words(record_of(index), &[record_of(index) + 0x40, lr]);
    }
    // Oldest first: f3 entered at SP = top of its frame (record_of(3) + 0x30), then f1.
    returns.push(hijack(record_of(3) + 0x30, TASK_SCS.base + 8, code(3))).unwrap();
    returns.push(hijack(record_of(1) + 0x30, TASK_SCS.base + 24, code(1))).unwrap();
    newest
}

#[test]
fn frame_walk_reports_the_real_callers() {
    let mut memory = SyntheticMemory::new();
    let mut returns = ReturnStack::new();
    let fp = hijacked_chain(&mut memory, &mut returns);
    let stacks = [TASK];
    let plain = FrameWalker::new(&memory, &stacks, LAYOUT).trace_from_frame(fp, TraceOptions::ALL);
    assert_eq!(plain.addresses(), &[code(0), TRAMPOLINE, code(2), TRAMPOLINE, code(4)]);
    let repair = Repair(&returns);
    let walker = FrameWalker::new(&memory, &stacks, LAYOUT).with_repair(&repair);
    let trace = walker.trace_from_frame(fp, TraceOptions::ALL);
    assert_eq!(trace.addresses(), &[code(0), code(1), code(2), code(3), code(4)]);
    // Skipping entries does not shift the pairing: it is by location, not by count.
    let trace = walker.trace_from_frame(fp, TraceOptions::new(2, 64));
    assert_eq!(trace.addresses(), &[code(2), code(3), code(4)]);
    let trace = walker.trace_from_frame(fp + 0x80, TraceOptions::ALL);
    assert_eq!(trace.addresses(), &[code(2), code(3), code(4)]);
}

#[test]
fn unknown_hijack_stays_visible() {
    let mut memory = SyntheticMemory::new();
    let mut returns = ReturnStack::new();
    let fp = hijacked_chain(&mut memory, &mut returns);
    // No instance left for either hijack: the walker reports the trampoline, never a guess.
    returns.pop();
    returns.pop();
    let repair = Repair(&returns);
    let stacks = [TASK];
    let trace = FrameWalker::new(&memory, &stacks, LAYOUT).with_repair(&repair).trace_from_frame(fp, TraceOptions::ALL);
    assert_eq!(trace.addresses(), &[code(0), TRAMPOLINE, code(2), TRAMPOLINE, code(4)]);
}

#[test]
fn shadow_walk_reports_the_real_callers() {
    let mut memory = SyntheticMemory::new();
    let mut returns = ReturnStack::<8>::new();
    memory.write(TASK_SCS.end - 8, SCS_END_MAGIC);
    // Slots oldest first: code(4), f3's (hijacked), code(2), f1's (hijacked), code(0).
    let slots = [code(4), sign(TRAMPOLINE, 7), code(2), sign(TRAMPOLINE, 9), code(0)];
    memory.write_words(TASK_SCS.base, &slots);
    returns.push(hijack(0x4010_3f00, TASK_SCS.base + 8, code(3))).unwrap();
    returns.push(hijack(0x4010_3e00, TASK_SCS.base + 24, code(1))).unwrap();
    let x18 = TASK_SCS.base + 8 * slots.len() as u64;
    let segment = [ShadowSegment::current(TASK_SCS, x18)];
    let plain = shadow_trace(&ShadowWalker::new(&memory, LAYOUT), &segment, TraceOptions::ALL);
    assert_eq!(plain.addresses(), &[code(0), TRAMPOLINE, code(2), TRAMPOLINE, code(4)]);
    let repair = Repair(&returns);
    let trace = shadow_trace(&ShadowWalker::new(&memory, LAYOUT).with_repair(&repair), &segment, TraceOptions::ALL);
    assert_eq!(trace.addresses(), &[code(0), code(1), code(2), code(3), code(4)]);
}

#[test]
fn tail_call_between_probed_functions_resolves_to_the_outer_real_address() {
    let mut returns = ReturnStack::<8>::new();
    returns.push(hijack(0x1000, 0x80, code(1))).unwrap();
    // The tail-called probed function entered at the same SP with x30 = the trampoline.
    returns.push(hijack(0x1000, 0x80, TRAMPOLINE)).unwrap();
    assert_eq!(returns.frame_return(0xff0, TRAMPOLINE), Some(code(1)));
    assert_eq!(returns.shadow_return(0x80, TRAMPOLINE), Some(code(1)));
    // Returning: the newest pops first and returns to the trampoline, which pops the next.
    assert_eq!(returns.top_at(0x1000).map(|entry| entry.real), Some(TRAMPOLINE));
    returns.pop();
    assert_eq!(returns.top_at(0x1000).map(|entry| entry.real), Some(code(1)));
}

#[test]
fn abandoned_entries_are_dropped_and_reported() {
    let mut returns = ReturnStack::<8>::new();
    for (index, sp) in [0x1000, 0xf00, 0xe00, 0xd00].into_iter().enumerate() {
        returns.push(hijack(sp, 0, code(index as u64))).unwrap();
    }
    let mut dropped = Vec::new();
    // A return into the trampoline at SP 0xf00: the frames of 0xe00 and 0xd00 are gone.
    returns.drop_abandoned(0xf00, |entry| dropped.push(entry.entry_sp));
    assert_eq!(dropped, [0xd00, 0xe00]);
    assert_eq!(returns.top_at(0xf00).map(|entry| entry.real), Some(code(1)));
    assert_eq!(returns.top_at(0xf08), None);
    assert_eq!(returns.pop().map(|entry| entry.entry_sp), Some(0xf00));
    assert_eq!(returns.len(), 1);
    returns.clear();
    assert!(returns.is_empty());
    assert_eq!(returns.pop(), None);
}

#[test]
fn full_stack_refuses_without_losing_entries() {
    let mut returns = ReturnStack::<2>::new();
    returns.push(hijack(0x1000, 0, code(0))).unwrap();
    returns.push(hijack(0xf00, 0, code(1))).unwrap();
    assert_eq!(returns.push(hijack(0xe00, 0, code(2))), Err(ReturnStackFull));
    assert_eq!(returns.entries().iter().map(|entry| entry.real).collect::<Vec<_>>(), [code(0), code(1)]);
}

const GRAPH: u64 = TEXT + 0x2_0000;

/// Return probes' instances and the function-graph tracer's, each with its own trampoline.
struct BothRepair<'a> {
    probes: &'a ReturnStack<8>,
    graph: &'a ReturnStack<8>,
}

impl ReturnRepair for BothRepair<'_> {
    fn trampoline(&self) -> u64 {
        TRAMPOLINE
    }
    fn frame_return(&self, record: u64) -> Option<u64> {
        self.probes.frame_return(record, TRAMPOLINE)
    }
    fn shadow_return(&self, slot: u64) -> Option<u64> {
        self.probes.shadow_return(slot, TRAMPOLINE)
    }
    fn graph_trampoline(&self) -> u64 {
        GRAPH
    }
    fn graph_frame_return(&self, record: u64) -> Option<u64> {
        self.graph.frame_return(record, GRAPH)
    }
    fn graph_shadow_return(&self, slot: u64) -> Option<u64> {
        self.graph.shadow_return(slot, GRAPH)
    }
}

/// As [`hijacked_chain`], with f1 graph-traced only and f3 both graph-traced and probed: the
/// graph hook ran first, so f3's probe instance saved the graph trampoline as its "real" return.
fn graph_chain(memory: &mut SyntheticMemory, probes: &mut ReturnStack<8>, graph: &mut ReturnStack<8>) -> u64 {
    let end = TASK.high - FrameMarker::SIZE;
    memory.write_words(end, &FrameMarker::final_frame().to_words());
    let newest = end - 0x40 * 5;
    let record_of = |index: u64| newest + 0x40 * index;
    for index in 0..5 {
        let lr = match index {
            1 => sign(GRAPH, 0x55),
            3 => sign(TRAMPOLINE, 0x66),
            _ => code(index),
        };
        memory.write_words(record_of(index), &[record_of(index) + 0x40, lr]);
    }
    graph.push(hijack(record_of(3) + 0x30, TASK_SCS.base + 8, code(3))).unwrap();
    probes.push(hijack(record_of(3) + 0x30, TASK_SCS.base + 8, GRAPH)).unwrap();
    graph.push(hijack(record_of(1) + 0x30, TASK_SCS.base + 24, code(1))).unwrap();
    newest
}

#[test]
fn frame_walk_repairs_graph_returns_and_chains_through_a_probe() {
    let mut memory = SyntheticMemory::new();
    let (mut probes, mut graph) = (ReturnStack::new(), ReturnStack::new());
    let fp = graph_chain(&mut memory, &mut probes, &mut graph);
    let stacks = [TASK];
    let plain = FrameWalker::new(&memory, &stacks, LAYOUT).trace_from_frame(fp, TraceOptions::ALL);
    assert_eq!(plain.addresses(), &[code(0), GRAPH, code(2), TRAMPOLINE, code(4)]);
    let repair = BothRepair { probes: &probes, graph: &graph };
    let walker = FrameWalker::new(&memory, &stacks, LAYOUT).with_repair(&repair);
    assert_eq!(
        walker.trace_from_frame(fp, TraceOptions::ALL).addresses(),
        &[code(0), code(1), code(2), code(3), code(4)]
    );
    assert_eq!(walker.trace_from_frame(fp, TraceOptions::new(1, 2)).addresses(), &[code(1), code(2)]);
    // A repair that says no graph return can be outstanding leaves the graph trampoline seen.
    let probes_only = Repair(&probes);
    let walker = FrameWalker::new(&memory, &stacks, LAYOUT).with_repair(&probes_only);
    assert_eq!(walker.trace_from_frame(fp, TraceOptions::ALL).addresses(), &[code(0), GRAPH, code(2), GRAPH, code(4)]);
}

#[test]
fn shadow_walk_repairs_graph_returns_and_chains_through_a_probe() {
    let mut memory = SyntheticMemory::new();
    let (mut probes, mut graph) = (ReturnStack::<8>::new(), ReturnStack::<8>::new());
    memory.write(TASK_SCS.end - 8, SCS_END_MAGIC);
    let slots = [code(4), sign(TRAMPOLINE, 7), code(2), sign(GRAPH, 9), code(0)];
    memory.write_words(TASK_SCS.base, &slots);
    graph.push(hijack(0x4010_3f00, TASK_SCS.base + 8, code(3))).unwrap();
    probes.push(hijack(0x4010_3f00, TASK_SCS.base + 8, GRAPH)).unwrap();
    graph.push(hijack(0x4010_3e00, TASK_SCS.base + 24, code(1))).unwrap();
    let x18 = TASK_SCS.base + 8 * slots.len() as u64;
    let segment = [ShadowSegment::current(TASK_SCS, x18)];
    let repair = BothRepair { probes: &probes, graph: &graph };
    let trace = shadow_trace(&ShadowWalker::new(&memory, LAYOUT).with_repair(&repair), &segment, TraceOptions::ALL);
    assert_eq!(trace.addresses(), &[code(0), code(1), code(2), code(3), code(4)]);
}

#[test]
fn tail_call_from_a_probed_function_into_a_graph_traced_one_resolves_across_owners() {
    let (mut probes, mut graph) = (ReturnStack::<8>::new(), ReturnStack::<8>::new());
    // f (probed) tail-calls g (graph-traced) at the same SP: g's graph instance saved the probe
    // trampoline, f's probe instance the real caller.
    probes.push(hijack(0x1000, 0x80, code(1))).unwrap();
    graph.push(hijack(0x1000, 0x80, TRAMPOLINE)).unwrap();
    let repair = BothRepair { probes: &probes, graph: &graph };
    assert_eq!(repair.repaired_frame(GRAPH, 0xff0), code(1));
    assert_eq!(repair.repaired_shadow(GRAPH, 0x80), code(1));
    // An address that is no trampoline is returned as read; one without an instance too.
    assert_eq!(repair.repaired_frame(code(5), 0xff0), code(5));
    assert_eq!(repair.repaired_frame(GRAPH, 0x2000), GRAPH);
}
