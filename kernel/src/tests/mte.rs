//! Tests of the hardware tag mode (build variant `mte`, KASAN HW_TAGS): what MTE itself must do
//! for the heap's tags to mean anything. Skipped in the other variants.
//!
//! The corpus (kasan.rs) runs in `mte` too; these check the mechanism under it: the tag STG
//! writes is the tag LDG reads, a mismatch faults at once in sync mode and at the next check
//! point in async mode, checks off means no fault (the detector's switch), the match-all tag
//! matches everything, and IRG excludes what GCR_EL1 excludes.

use super::{Context, Outcome, Test, Verdict, check, check_eq};
use crate::arch::mte::{self, CheckMode};
use crate::mm::kasan::Tags;
use crate::mm::kasan::heap;
use crate::mm::kasan::recording;
use crate::mm::kasan::report::{self, BugType};
use crate::mm::kasan::storage::{TagStorage, tag_of, untagged, with_tag};
use core::hint::black_box;

pub const TESTS: &[Test] = &[
    Test { name: "mte_ldg_reads_what_stg_wrote", run: mte_ldg_reads_what_stg_wrote },
    Test { name: "mte_sync_fault_reported_at_access", run: mte_sync_fault_reported_at_access },
    Test { name: "mte_async_fault_reported_at_check_point", run: mte_async_fault_reported_at_check_point },
    Test { name: "mte_checks_off_no_fault", run: mte_checks_off_no_fault },
    Test { name: "mte_match_all_pointer_accesses_anything", run: mte_match_all_pointer_accesses_anything },
    Test { name: "mte_irg_excludes_gcr_exclusions", run: mte_irg_excludes_gcr_exclusions },
];

const NOT_MTE: &str = "build variant `mte` only (MTE allocation tags)";

#[inline(never)]
fn read_u64(address: u64) -> u64 {
    // SAFETY: tests pass heap addresses (mapped RAM), possibly with a mismatching tag: exactly
    // what MTE must catch; the value read is not trusted.
    unsafe { (address as *const u64).read_volatile() }
}

/// Runs `f` in check mode `mode`, then back in the boot mode (sync by default).
fn in_mode<R>(mode: CheckMode, f: impl FnOnce() -> R) -> R {
    let boot = mte::mode();
    mte::switch_mode(mode);
    let result = f();
    mte::switch_mode(boot);
    result
}

fn mte_ldg_reads_what_stg_wrote(_: &Context) -> Outcome {
    if !crate::mm::kasan::HARDWARE_TAGS {
        return Ok(Verdict::Skipped(NOT_MTE));
    }
    let object = heap::allocate(96, 16).expect("the heap has room");
    let address = untagged(object);
    // Every granule of the object carries the pointer's logical tag, in hardware.
    for granule in (0..96).step_by(16) {
        check_eq!(0xf0 | mte::allocation_tag(address + granule), tag_of(object));
    }
    // Each of the 16 tags, written by STG (one granule) and ST2G (two), reads back by LDG.
    for tag in 0..16u8 {
        // SAFETY: the object's own granules (the test owns it); retagged back below.
        unsafe { mte::set_tags(address, 48, with_tag(address, 0xf0 | tag)) };
        for granule in [0, 16, 32] {
            check_eq!(mte::allocation_tag(address + granule), tag);
        }
    }
    Tags::set_range_tag(address, 96, tag_of(object));
    check_eq!(Tags::memory_tag(address + 80), tag_of(object));
    heap::free(object);
    check_eq!(Tags::memory_tag(address), Tags::INVALID);
    Ok(Verdict::Passed)
}

fn mte_sync_fault_reported_at_access(_: &Context) -> Outcome {
    if !crate::mm::kasan::HARDWARE_TAGS {
        return Ok(Verdict::Skipped(NOT_MTE));
    }
    let object = heap::allocate(64, 16).expect("the heap has room");
    heap::free(object);
    let (mut at_access, mut suppressed) = (0, false);
    let (count, last) = in_mode(CheckMode::Sync, || {
        recording::scope(|| {
            let before = report::count();
            black_box(read_u64(object + 8));
            // Reported before the next instruction: a synchronous data abort, after which the
            // context went on with checks suppressed (PSTATE.TCO)...
            at_access = report::count() - before;
            suppressed = mte::checks_suppressed();
        })
    });
    check_eq!(at_access, 1);
    check!(suppressed);
    // ... until the recording scope turned them back on.
    check!(!mte::checks_suppressed());
    check_eq!(count, 1);
    let Some(last) = last else {
        return Err(super::fail("no report recorded"));
    };
    check!(last.bug == BugType::UseAfterFree);
    check_eq!(last.address, object + 8);
    check_eq!(last.pointer_tag, tag_of(object));
    check_eq!(last.memory_tag, Tags::INVALID);
    check!(!last.write);
    // The faulting PC is the load's, in read_u64.
    let function = crate::symbols::callsites::function_containing(last.pc).map(|(start, _)| start);
    check_eq!(function.unwrap_or(0), read_u64 as fn(u64) -> u64 as usize as u64);
    Ok(Verdict::Passed)
}

fn mte_async_fault_reported_at_check_point(_: &Context) -> Outcome {
    if !crate::mm::kasan::HARDWARE_TAGS {
        return Ok(Verdict::Skipped(NOT_MTE));
    }
    let object = heap::allocate(64, 16).expect("the heap has room");
    heap::free(object);
    let (mut at_access, mut after_check_point) = (u64::MAX, u64::MAX);
    let (count, last) = in_mode(CheckMode::Async, || {
        recording::scope(|| {
            let before = report::count();
            black_box(read_u64(object));
            // No abort: the fault only set TFSR_EL1.TF1.
            at_access = report::count() - before;
            // A check point: the next timer interrupt's entry.
            crate::arch::cpu::wait_for_interrupt();
            after_check_point = report::count() - before;
        })
    });
    check_eq!(at_access, 0);
    check_eq!(after_check_point, 1);
    check_eq!(count, 1);
    check!(last.is_some_and(|report| report.bug == BugType::InvalidAccess && report.address == 0));
    Ok(Verdict::Passed)
}

fn mte_checks_off_no_fault(_: &Context) -> Outcome {
    if !crate::mm::kasan::HARDWARE_TAGS {
        return Ok(Verdict::Skipped(NOT_MTE));
    }
    // The detector's switch: the same use-after-free as above with TCF = 0 is not reported, so
    // the reports above come from the hardware's check and from nothing else.
    let object = heap::allocate(64, 16).expect("the heap has room");
    heap::free(object);
    let (count, _) = in_mode(CheckMode::None, || {
        recording::scope(|| {
            black_box(read_u64(object));
        })
    });
    check_eq!(count, 0);
    let (count, _) = recording::scope(|| {
        black_box(read_u64(object));
    });
    check_eq!(count, 1);
    Ok(Verdict::Passed)
}

fn mte_match_all_pointer_accesses_anything(_: &Context) -> Outcome {
    if !crate::mm::kasan::HARDWARE_TAGS {
        return Ok(Verdict::Skipped(NOT_MTE));
    }
    let object = heap::allocate(64, 16).expect("the heap has room");
    let live_tag = tag_of(object);
    heap::free(object);
    // A freed granule (0xE), the header granule (0xE) and a live object's (its tag): a pointer
    // with the match-all tag 0xF reads them all without a report (TCR_EL1.TCMA1).
    let other = heap::allocate(64, 16).expect("the heap has room");
    let (count, _) = recording::scope(|| {
        for address in [object, object - 32, other, other + 48] {
            black_box(read_u64(with_tag(address, Tags::MATCH_ALL)));
        }
    });
    check_eq!(count, 0);
    // The same freed granule through its old tag is reported (the check is on).
    check!(live_tag != Tags::INVALID);
    let (count, _) = recording::scope(|| {
        black_box(read_u64(object));
    });
    check_eq!(count, 1);
    heap::free(other);
    Ok(Verdict::Passed)
}

fn mte_irg_excludes_gcr_exclusions(_: &Context) -> Outcome {
    if !crate::mm::kasan::HARDWARE_TAGS {
        return Ok(Verdict::Skipped(NOT_MTE));
    }
    let base = untagged(0);
    let mut seen = [0u32; 16];
    for _ in 0..4000 {
        seen[((mte::random_tag(base) >> 56) & 0xf) as usize] += 1;
    }
    // GCR_EL1 excludes 0xE and 0xF: never drawn; the 14 others all are.
    check_eq!(seen[0xe] + seen[0xf], 0);
    check!(seen[..0xe].iter().all(|&count| count > 0));
    // IRG's own exclusion operand adds to GCR's: only 0x8-0xD remain.
    let mut seen = [0u32; 16];
    for _ in 0..4000 {
        seen[((mte::random_tag_excluding(base, 0xff) >> 56) & 0xf) as usize] += 1;
    }
    check!(seen[..8].iter().all(|&count| count == 0));
    check_eq!(seen[0xe] + seen[0xf], 0);
    check!(seen[8..0xe].iter().all(|&count| count > 0));
    Ok(Verdict::Passed)
}
