//! The replay's frame functions on real stacks: Linux's stacks rebuilt, sharing kept.

use super::{Context, Outcome, Test, Verdict, check, check_eq};
use crate::arch::cpu;
use crate::bench::kasan_replay;
use crate::mm::kasan::heap::Stacks;
use crate::replay::{self, Path, RETURN_OFFSET};
use crate::stacktrace::{self, Mode};
use unwind::{Trace, TraceOptions};

pub const TESTS: &[Test] = &[
    Test { name: "replayed_stacks_share_what_linux_shares", run: replayed_stacks_share_what_linux_shares },
    Test { name: "replayed_boot_prefix_is_clean", run: replayed_boot_prefix_is_clean },
    Test { name: "replayed_boot_catches_planted_bugs", run: replayed_boot_catches_planted_bugs },
];

/// Where a leaf puts the traces taken inside a replayed stack.
struct Captured {
    modes: [Option<Trace>; 2],
}

extern "C" fn capture_at_leaf(cursor: *const usize) {
    // SAFETY: this is the leaf of the Path::call below; its context word is a Captured's address.
    let captured = unsafe { &mut *(replay::context(cursor) as *mut Captured) };
    // Without frame pointers the frame walk is refused: the shadow stack alone is checked.
    if crate::build_info::FRAME_POINTERS {
        captured.modes[0] = Some(stacktrace::capture(Mode::FramePointer, TraceOptions::ALL));
    }
    if crate::build_info::SHADOW_CALL_STACK {
        captured.modes[1] = Some(stacktrace::capture(Mode::ShadowCallStack, TraceOptions::ALL));
    }
}

/// The return addresses of `stack` (innermost first) replayed, from the leaf's caller outward.
#[inline(never)]
fn replayed(stack: &[u16]) -> [Option<Trace>; 2] {
    let mut captured = Captured { modes: [None, None] };
    Path::new(stack.iter().copied(), capture_at_leaf, &mut captured as *mut Captured as usize).call();
    captured.modes
}

fn addresses(trace: &Trace) -> impl Iterator<Item = u64> + '_ {
    trace.addresses().iter().map(|&address| cpu::strip_pac(address))
}

fn replayed_stacks_share_what_linux_shares(_: &Context) -> Outcome {
    if !crate::build_info::SHADOW_CALL_STACK {
        // Variant plain keeps no frame records in the lab's own functions to walk through.
        return Ok(Verdict::Skipped("variant plain has no frame pointers nor shadow call stack"));
    }
    // Two Linux stacks sharing their two outer frames, one of them twice, and one sharing only
    // the innermost frame's function, at a frame ID near the pool's end.
    let stacks: [&[u16]; 4] = [&[2, 1, 0], &[3, 1, 0], &[2, 1, 0], &[4607, 7]];
    // One call site for every stack (an unrolled `map` would give each its own return
    // address, and the lab's frames would differ).
    let mut traces = alloc::vec::Vec::new();
    for stack in core::hint::black_box(&stacks[..]) {
        traces.push(replayed(stack));
    }
    for mode in 0..2 {
        let Some(first) = &traces[0][mode] else { continue };
        for (stack, trace) in stacks.iter().zip(&traces) {
            let trace = trace[mode].as_ref().ok_or(super::fail("a mode traced one stack and not another"))?;
            // Entry 0 is the capture's return into the leaf, entry 1 the leaf's into the
            // innermost frame function; then one entry per recorded frame.
            let frames: alloc::vec::Vec<u64> = addresses(trace).skip(1).take(stack.len()).collect();
            check_eq!(frames.len(), stack.len());
            for (&frame, &address) in stack.iter().zip(&frames) {
                check_eq!(address, (replay::frame_function(frame) + RETURN_OFFSET) as u64);
            }
            // The lab's own frames outside the replayed ones are the same for every stack.
            check!(addresses(trace).skip(1 + stack.len()).eq(addresses(first).skip(1 + stacks[0].len())));
        }
        check!(traces[0][mode] == traces[2][mode]);
        check!(traces[0][mode] != traces[1][mode]);
    }
    check!(traces[0][0].is_some() || !crate::build_info::FRAME_POINTERS);
    Ok(Verdict::Passed)
}

/// Allocations of the trace's prefix: a few seconds of QEMU per mode; the whole trace is
/// `cargo xtask bench kasan-replay`.
const PREFIX: u32 = 10_000;

/// The first allocations of Linux's recorded boot, replayed through the sanitizer heap with
/// frame-pointer and shadow-call-stack collection: every allocation made, no report, and the
/// depot finding repeated stacks.
fn replayed_boot_prefix_is_clean(_: &Context) -> Outcome {
    // xtask loads the blob for QEMU virt; the prefix is the suite's: a `full` sanitizer heap
    // on one CPU.
    if !crate::mm::kasan::CHECKS_COMPILED_IN || crate::board::CONFIG.name != "qemu-virt" {
        return Ok(Verdict::Skipped("the replay runs on QEMU virt in variant full"));
    }
    if crate::arch::smp::online_count() != 1 {
        return Ok(Verdict::Skipped("the replay runs on one CPU"));
    }
    for mode in [Stacks::FramePointer, Stacks::ShadowCallStack] {
        let prefix = kasan_replay::replay_prefix(PREFIX, mode).ok_or(super::fail("no replay blob was loaded"))?;
        check_eq!(prefix.allocations, u64::from(PREFIX));
        check_eq!(prefix.failed + prefix.frees_of_failed, 0);
        // The prefix stays inside the first window.
        check_eq!(prefix.frees_across_windows, 0);
        check_eq!(prefix.reports, 0);
        check!(prefix.hits > 0 && prefix.hits < prefix.lookups);
    }
    Ok(Verdict::Passed)
}

/// Allocations of the planted replay: its bugs' points are drawn in the first half.
const PLANTED_PREFIX: u32 = 4_000;

/// The replay with bugs planted at random points (`inject::Fault::ReplayPlantsBugs`): an
/// off-by-one write reported as out of bounds, a use after free as one, and no other report.
/// Fails when the sanitizer misses either or names it wrongly.
fn replayed_boot_catches_planted_bugs(_: &Context) -> Outcome {
    use crate::mm::kasan::report::BugType;
    let tagged = crate::mm::kasan::CHECKS_COMPILED_IN || crate::mm::kasan::HARDWARE_TAGS;
    if !tagged || crate::board::CONFIG.name != "qemu-virt" {
        return Ok(Verdict::Skipped("the replay runs on QEMU virt in variants full and mte"));
    }
    if crate::arch::smp::online_count() != 1 {
        return Ok(Verdict::Skipped("the replay runs on one CPU"));
    }
    let prefix = {
        let _bugs = crate::inject::Injected::new(crate::inject::Fault::ReplayPlantsBugs);
        kasan_replay::replay_prefix(PLANTED_PREFIX, Stacks::ShadowCallStack)
            .ok_or(super::fail("no replay blob was loaded"))?
    };
    let planted = prefix.planted.ok_or(super::fail("the switch planted nothing"))?;
    let (reports, bug) = planted.off_by_one.ok_or(super::fail("the off-by-one write was not planted"))?;
    check_eq!(reports, 1);
    check!(bug == Some(BugType::OutOfBounds));
    let (reports, bug) = planted.use_after_free.ok_or(super::fail("the use after free was not planted"))?;
    check_eq!(reports, 1);
    check!(bug == Some(BugType::UseAfterFree));
    check_eq!(prefix.reports, 2);
    check_eq!(prefix.failed, 0);
    Ok(Verdict::Passed)
}
