//! The sweep's workload: one deterministic pass over the kernel code the probes are on, folded
//! into a checksum that a probed run must reproduce exactly.
//!
//! It runs the heap's alloc/free path (and, in `full`, the sanitizer's tagging and stack
//! collection), both walkers, the stack depot (hit path: the warm-up run inserted the traces),
//! a scheduler switch to a task and back, the ftrace registry (a tracer registered, hit and
//! removed) and the probe registry (a probe registered, hit and removed). Everything it folds in
//! must be the same on every run: addresses of heap blocks are not (the tags differ), so only
//! contents, counts and return addresses are.

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::probes::{self as kprobes, Method, Registers};
use crate::stacktrace::{self, Mode};
use crate::sync::IrqSpinLock;
use unwind::TraceOptions;

/// FNV-1a over 64-bit words: enough to tell two runs' results apart.
pub struct Checksum(u64);

impl Checksum {
    pub const fn new() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
    pub fn add(&mut self, word: u64) {
        for byte in word.to_le_bytes() {
            self.0 = (self.0 ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    pub fn value(&self) -> u64 {
        self.0
    }
}

/// The workload's results: a checksum of its data, and its functions' return values.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Results {
    pub checksum: u64,
    pub returned: u64,
}

/// `sweep.inject=callers-stack`: passes run on the caller's stack, as they once did, so the
/// sweep's new-stack check must fail (CI runs it: the check is shown to catch what it is for).
pub static ON_CALLERS_STACK: AtomicBool = AtomicBool::new(false);

/// The last pass's results, from its task (`None`: a part could not run).
static PASS: IrqSpinLock<Option<Results>> = IrqSpinLock::new(None);

/// One pass, on a task of its own. `None` only if a part could not run (no task slot, no
/// tracer, no probe): the sweep reports that as a failure of the probes armed at the time.
///
/// A task, not a call: the stacks the pass saves (the depot, the sanitizer heap's alloc/free
/// stacks) then end at the task's entry, the same on every pass. Called from the sweep's
/// different call sites, each would save new traces (its own callers), the depot's bucket
/// chains would grow during the sweep and `StackDepot::find`'s hit counts would depend on when
/// it was probed (seen as a random set disagreeing with its function's own pass in `full`).
pub fn run() -> Option<Results> {
    if ON_CALLERS_STACK.load(Ordering::Relaxed) {
        return pass();
    }
    *PASS.lock() = None;
    let task = crate::task::spawn("sweep-pass", pass_task, 0).ok()?;
    crate::task::join(task);
    PASS.lock().take()
}

extern "C" fn pass_task(_: u64) {
    let results = pass();
    *PASS.lock() = results;
}

#[inline(never)]
fn pass() -> Option<Results> {
    let mut sum = Checksum::new();
    let mut returned = 0u64;
    returned = returned.wrapping_add(heap(&mut sum));
    returned = returned.wrapping_add(walkers(&mut sum));
    returned = returned.wrapping_add(switch(&mut sum)?);
    returned = returned.wrapping_add(ftrace_registry(&mut sum)?);
    returned = returned.wrapping_add(probe_registry(&mut sum)?);
    Some(Results { checksum: sum.value(), returned })
}

/// The part of a pass the other CPUs loop on (`sweep/everywhere.rs`): the heap, both walkers
/// and the depot. Not the switch, the ftrace or the probe registry parts: their state (a
/// tracer, the workload's own probe, a task slot per CPU) is one per kernel.
#[inline(never)]
pub fn background_pass() -> Results {
    let mut sum = Checksum::new();
    let mut returned = heap(&mut sum);
    returned = returned.wrapping_add(walkers(&mut sum));
    Results { checksum: sum.value(), returned }
}

/// Allocations of several sizes (several buddy orders), filled, read back, freed in another
/// order than allocated; a growing Vec (realloc).
#[inline(never)]
fn heap(sum: &mut Checksum) -> u64 {
    let mut boxes: Vec<Box<[u64]>> = Vec::new();
    for (index, size) in [1usize, 3, 16, 33, 100, 257, 600].into_iter().enumerate() {
        let block: Box<[u64]> = (0..size).map(|word| (word as u64) * 0x9e37 + index as u64).collect();
        boxes.push(block);
    }
    let mut total = 0u64;
    while let Some(block) = if boxes.len().is_multiple_of(2) { boxes.pop() } else { Some(boxes.remove(0)) } {
        for &word in block.iter() {
            total = total.wrapping_add(word);
        }
        sum.add(block.len() as u64);
    }
    let mut growing = Vec::new();
    for value in 0..300u64 {
        growing.push(value ^ 0x55);
    }
    sum.add(growing.iter().sum());
    sum.add(total);
    total
}

/// Both walkers from two depths, and the depot: the same stack saved twice gives one handle.
#[inline(never)]
fn walkers(sum: &mut Checksum) -> u64 {
    let mut depth = 0;
    for _ in 0..2 {
        depth += nested_capture(3, sum);
    }
    depth
}

/// Frames from `nested_capture(0)` up to `pass`.
const OWN_FRAMES: usize = 6;

#[inline(never)]
fn nested_capture(levels: u32, sum: &mut Checksum) -> u64 {
    if levels > 0 {
        return core::hint::black_box(nested_capture(levels - 1, sum)) + 1;
    }
    let mut frames = 0;
    let modes: &[Mode] =
        if crate::build_info::SHADOW_CALL_STACK { &[Mode::DEFAULT, Mode::ShadowCallStack] } else { &[Mode::DEFAULT] };
    for &mode in modes {
        let trace = stacktrace::capture(mode, TraceOptions::new(0, unwind::MAX_FRAMES));
        // The workload's own frames only (nested_capture x4, walkers, pass): the task's entry
        // frames above them are not the workload's code.
        for &address in trace.addresses().iter().take(OWN_FRAMES) {
            sum.add(address);
        }
        frames += trace.addresses().len().min(OWN_FRAMES) as u64;
    }
    let first = stacktrace::save_stack(0);
    let second = stacktrace::save_stack(0);
    sum.add(u64::from(first.is_ok() && first == second));
    frames
}

static SWITCHED: AtomicU64 = AtomicU64::new(0);

extern "C" fn switched_task(argument: u64) {
    let mut value = argument;
    for round in 0..4 {
        value = value.rotate_left(7) ^ round;
        crate::task::yield_now();
    }
    SWITCHED.store(value, Ordering::Relaxed);
}

/// A task that yields back and forth with this one: both directions of `switch_to`.
#[inline(never)]
fn switch(sum: &mut Checksum) -> Option<u64> {
    SWITCHED.store(0, Ordering::Relaxed);
    let task = crate::task::spawn("sweep-switch", switched_task, 0x1234).ok()?;
    crate::task::join(task);
    let value = SWITCHED.load(Ordering::Relaxed);
    sum.add(value);
    Some(value)
}

static TRACER: crate::ftrace::tracers::Counter = crate::ftrace::tracers::Counter::new();

/// A body no other function has: identical functions are merged into one symbol (this one
/// once took `tests::ftrace::traced_pair_a`'s place).
#[inline(never)]
fn traced_leaf(value: u64) -> u64 {
    core::hint::black_box(value).wrapping_mul(0x5eed_0019).rotate_left(19) ^ 0x19
}

/// A tracer on `traced_leaf`, called a few times, removed. Builds without patchable entries
/// (`plain`) have no ftrace: the part is skipped the same way on every run.
#[inline(never)]
fn ftrace_registry(sum: &mut Checksum) -> Option<u64> {
    if crate::symbols::callsites::entries().is_empty() {
        return Some(0);
    }
    TRACER.reset();
    let tracer =
        crate::ftrace::register_where(&TRACER.ops, |entry| entry + 8 == traced_leaf as *const () as u64).ok()?;
    let mut value = 0;
    for round in 0..5 {
        value += traced_leaf(round);
    }
    crate::ftrace::unregister(tracer).ok()?;
    sum.add(TRACER.hits());
    sum.add(value);
    Some(value)
}

static PROBED: AtomicU64 = AtomicU64::new(0);

fn count_probed(_: &mut Registers) {
    PROBED.fetch_add(1, Ordering::Relaxed);
}

#[inline(never)]
fn probed_leaf(value: u64) -> u64 {
    core::hint::black_box(value).rotate_right(19) ^ 0x5eed_0019_00a5
}

/// A simulate probe on `probed_leaf`'s first accepted word, hit, removed: the registry's
/// register, publish, hit and unregister paths (those not in `.text.noprobe`).
#[inline(never)]
fn probe_registry(sum: &mut Checksum) -> Option<u64> {
    let start = probed_leaf as *const () as u64;
    PROBED.store(0, Ordering::Relaxed);
    let address = (0..8)
        .map(|index| start + 4 * index)
        .find(|&address| kprobes::register(address, Method::BrkStep, count_probed, None).is_ok())?;
    let mut value = 0;
    for round in 0..3 {
        value += probed_leaf(round);
    }
    kprobes::unregister(address).ok()?;
    // Not the address: the sweep may hold the first words itself.
    sum.add(PROBED.load(Ordering::Relaxed));
    Some(value)
}
