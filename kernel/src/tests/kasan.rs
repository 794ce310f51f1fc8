//! The sanitizer heap's bug corpus, modelled on Linux's KASAN unit tests (kasan_test_c.c): each
//! case provokes one bug in recover mode and checks the report (bug type, access size,
//! direction, and that the alloc and free stacks name the function that allocated and freed).
//!
//! Access checks exist in the `full` build (the compiler's) and in `mte` (the hardware's, KASAN
//! HW_TAGS; where MTE differs, the case says so and asserts what MTE does, see
//! docs/design/mte.md): the corpus skips elsewhere. The free-path checks
//! (double and invalid free) belong to the allocator and run in every build. Cases that SW_TAGS
//! cannot catch (an overflow inside the last granule, a tag collision) are checked as not caught;
//! with short granules (`--kasan-short-granules`) the first is caught, and checked as such.
//! Recover mode lets each bad access the compiler checked happen (the runtime's intrinsics do
//! not carry out a reported one): bad writes within a granule of an object land in the guard
//! granules around it (heap.rs), never in a header or a free-list link; the `kasan_sound_*`
//! cases prove it, and that the heap still works after each.

use super::{Context, Failure, Outcome, Test, Verdict, check, check_eq, fail};
use crate::mm::kasan::heap::{self, Stacks};
use crate::mm::kasan::record;
use crate::mm::kasan::recording;
use crate::mm::kasan::report::{BugType, Report};
use crate::mm::kasan::storage::{TagStorage, tag_of, untagged, with_tag};
use crate::mm::kasan::{self, CHECKS_COMPILED_IN, HARDWARE_TAGS, Tags};
use alloc::boxed::Box;
use alloc::string::String;
use alloc::vec::Vec;
use core::hint::black_box;

pub const TESTS: &[Test] = &[
    Test { name: "kasan_tag_generator", run: kasan_tag_generator },
    Test { name: "kasan_tag_generator_fair", run: kasan_tag_generator_fair },
    Test { name: "kasan_tag_reused_block", run: kasan_tag_reused_block },
    Test { name: "kasan_heap_large_alignments", run: kasan_heap_large_alignments },
    Test { name: "kasan_heap_tags_objects", run: kasan_heap_tags_objects },
    Test { name: "kasan_heap_no_false_positives", run: kasan_heap_no_false_positives },
    Test { name: "kasan_oob_right_small", run: kasan_oob_right_small },
    Test { name: "kasan_oob_left_small", run: kasan_oob_left_small },
    Test { name: "kasan_oob_right_large", run: kasan_oob_right_large },
    Test { name: "kasan_oob_left_large", run: kasan_oob_left_large },
    Test { name: "kasan_oob_right_page", run: kasan_oob_right_page },
    Test { name: "kasan_oob_left_page", run: kasan_oob_left_page },
    Test { name: "kasan_realloc_grow_oob", run: kasan_realloc_grow_oob },
    Test { name: "kasan_realloc_shrink_oob", run: kasan_realloc_shrink_oob },
    Test { name: "kasan_realloc_moved_uaf", run: kasan_realloc_moved_uaf },
    Test { name: "kasan_uaf_read", run: kasan_uaf_read },
    Test { name: "kasan_uaf_write", run: kasan_uaf_write },
    Test { name: "kasan_uaf_after_reuse", run: kasan_uaf_after_reuse },
    Test { name: "kasan_double_free", run: kasan_double_free },
    Test { name: "kasan_invalid_free", run: kasan_invalid_free },
    Test { name: "kasan_memset_oob", run: kasan_memset_oob },
    Test { name: "kasan_memcpy_oob", run: kasan_memcpy_oob },
    Test { name: "kasan_memmove_oob", run: kasan_memmove_oob },
    Test { name: "kasan_box_oob_and_uaf", run: kasan_box_oob_and_uaf },
    Test { name: "kasan_vec_oob_and_uaf", run: kasan_vec_oob_and_uaf },
    Test { name: "kasan_string_oob_and_uaf", run: kasan_string_oob_and_uaf },
    Test { name: "kasan_stack_modes", run: kasan_stack_modes },
    Test { name: "kasan_not_caught_inside_last_granule", run: kasan_not_caught_inside_last_granule },
    Test { name: "kasan_not_caught_tag_collision", run: kasan_not_caught_tag_collision },
    Test { name: "kasan_sound_memmove_negative_size", run: kasan_sound_memmove_negative_size },
    Test { name: "kasan_sound_intrinsic_not_carried_out", run: kasan_sound_intrinsic_not_carried_out },
    Test { name: "kasan_sound_overflow_spares_metadata", run: kasan_sound_overflow_spares_metadata },
    Test { name: "kasan_sound_overflow_spares_free_list", run: kasan_sound_overflow_spares_free_list },
    Test { name: "kasan_sound_double_free_after_ring_wrap", run: kasan_sound_double_free_after_ring_wrap },
    Test { name: "kasan_sound_match_all_free_realloc", run: kasan_sound_match_all_free_realloc },
    Test { name: "kasan_sound_prefers_live_object", run: kasan_sound_prefers_live_object },
    Test { name: "kasan_sound_realloc_after_free", run: kasan_sound_realloc_after_free },
    Test { name: "kasan_sound_zero_size", run: kasan_sound_zero_size },
    Test { name: "kasan_sound_bad_frees", run: kasan_sound_bad_frees },
    Test { name: "kasan_sound_forgotten_live_object", run: kasan_sound_forgotten_live_object },
    Test { name: "kasan_sound_forgotten_freed_object", run: kasan_sound_forgotten_freed_object },
    Test { name: "kasan_sound_stale_free_after_reuse", run: kasan_sound_stale_free_after_reuse },
    Test { name: "kasan_sound_overflow_into_freed_neighbour", run: kasan_sound_overflow_into_freed_neighbour },
    Test { name: "kasan_kmalloc_oob_right", run: linux::kasan_kmalloc_oob_right },
    Test { name: "kasan_kmalloc_oob_left", run: linux::kasan_kmalloc_oob_left },
    Test { name: "kasan_kmalloc_node_oob_right", run: linux::kasan_kmalloc_node_oob_right },
    Test { name: "kasan_kmalloc_track_caller_oob_right", run: linux::kasan_kmalloc_track_caller_oob_right },
    Test { name: "kasan_kmalloc_big_oob_right", run: linux::kasan_kmalloc_big_oob_right },
    Test { name: "kasan_kmalloc_large_oob_right", run: linux::kasan_kmalloc_large_oob_right },
    Test { name: "kasan_kmalloc_large_uaf", run: linux::kasan_kmalloc_large_uaf },
    Test { name: "kasan_kmalloc_large_invalid_free", run: linux::kasan_kmalloc_large_invalid_free },
    Test { name: "kasan_krealloc_more_oob", run: linux::kasan_krealloc_more_oob },
    Test { name: "kasan_krealloc_less_oob", run: linux::kasan_krealloc_less_oob },
    Test { name: "kasan_krealloc_large_more_oob", run: linux::kasan_krealloc_large_more_oob },
    Test { name: "kasan_krealloc_large_less_oob", run: linux::kasan_krealloc_large_less_oob },
    Test { name: "kasan_krealloc_uaf", run: linux::kasan_krealloc_uaf },
    Test { name: "kasan_kmalloc_oob_16", run: linux::kasan_kmalloc_oob_16 },
    Test { name: "kasan_kmalloc_uaf_16", run: linux::kasan_kmalloc_uaf_16 },
    Test { name: "kasan_kmalloc_oob_in_memset", run: linux::kasan_kmalloc_oob_in_memset },
    Test { name: "kasan_kmalloc_oob_memset_2", run: linux::kasan_kmalloc_oob_memset_2 },
    Test { name: "kasan_kmalloc_oob_memset_4", run: linux::kasan_kmalloc_oob_memset_4 },
    Test { name: "kasan_kmalloc_oob_memset_8", run: linux::kasan_kmalloc_oob_memset_8 },
    Test { name: "kasan_kmalloc_oob_memset_16", run: linux::kasan_kmalloc_oob_memset_16 },
    Test { name: "kasan_kmalloc_memmove_negative_size", run: linux::kasan_kmalloc_memmove_negative_size },
    Test { name: "kasan_kmalloc_memmove_invalid_size", run: linux::kasan_kmalloc_memmove_invalid_size },
    Test { name: "kasan_kmalloc_uaf", run: linux::kasan_kmalloc_uaf },
    Test { name: "kasan_kmalloc_uaf_memset", run: linux::kasan_kmalloc_uaf_memset },
    Test { name: "kasan_kmalloc_uaf2", run: linux::kasan_kmalloc_uaf2 },
    Test { name: "kasan_kmalloc_uaf3", run: linux::kasan_kmalloc_uaf3 },
    Test { name: "kasan_kmalloc_double_kzfree", run: linux::kasan_kmalloc_double_kzfree },
    Test { name: "kasan_atomics", run: linux::kasan_atomics },
    Test { name: "kasan_memchr", run: linux::kasan_memchr },
    Test { name: "kasan_memcmp", run: linux::kasan_memcmp },
    Test { name: "kasan_strings", run: linux::kasan_strings },
    Test { name: "kasan_bitops_tags", run: linux::kasan_bitops_tags },
    Test { name: "kasan_match_all_not_assigned", run: linux::kasan_match_all_not_assigned },
    Test { name: "kasan_match_all_ptr_tag", run: linux::kasan_match_all_ptr_tag },
    Test { name: "kasan_match_all_mem_tag", run: linux::kasan_match_all_mem_tag },
    Test { name: "kasan_rust_uaf", run: linux::kasan_rust_uaf },
];

/// Why the negative-size memmove cases do not run with MTE.
const NO_RANGE_CHECK: &str = "MTE checks each access, not an intrinsic's range: a (size_t)-2 memmove faults inside the copy, and resuming it would run over memory";

const NO_CHECKS: &str = "no tag checks in this build (`full` has kernel-hwaddress, `mte` the hardware's)";

/// Whether accesses are checked: by the compiler's checks (`full`) or by MTE (`mte`).
const CHECKED: bool = CHECKS_COMPILED_IN || HARDWARE_TAGS;

/// An instrumented access of each kind (the `full` build puts a tag check in each).
#[inline(never)]
fn read_u8(address: u64) -> u8 {
    // SAFETY: tests pass addresses of heap memory (RAM, mapped), possibly past an object or
    // freed: exactly what the sanitizer must catch; the value read is not trusted.
    unsafe { (address as *const u8).read_volatile() }
}

#[inline(never)]
fn write_u8(address: u64, value: u8) {
    // SAFETY: as in read_u8; the heap memory written is owned by the test or free.
    unsafe { (address as *mut u8).write_volatile(value) }
}

#[inline(never)]
fn read_u16(address: u64) -> u16 {
    // SAFETY: as in read_u8.
    unsafe { (address as *const u16).read_unaligned() }
}

#[inline(never)]
fn read_u64(address: u64) -> u64 {
    // SAFETY: as in read_u8.
    unsafe { (address as *const u64).read_volatile() }
}

#[inline(never)]
fn write_u64(address: u64, value: u64) {
    // SAFETY: as in write_u8.
    unsafe { (address as *mut u64).write_volatile(value) }
}

/// Always inlined, so that the allocation stack's first frame is the test function's.
#[inline(always)]
fn allocate(size: usize) -> u64 {
    heap::allocate(size, 16).expect("the heap has room")
}

/// Whether a saved stack names `function` (one of its frames lies in it).
fn names(stack: u32, function: u64) -> bool {
    let mut buffer = [0; stackdepot::MAX_FRAMES];
    record::saved_frames(stack, &mut buffer).iter().any(|&address| {
        crate::symbols::callsites::function_containing(address).is_some_and(|(start, _)| start == function)
    })
}

/// What a case expects to be reported.
struct Expect {
    bug: BugType,
    size: u64,
    write: bool,
    /// The function that allocated (and freed, for use-after-free and double free).
    site: u64,
}

/// Runs `bug` in recover mode and checks that it caused exactly the expected report.
fn expect_report(expect: Expect, bug: impl FnOnce()) -> Result<Report, Failure> {
    expect_reports(expect, 1..=1, bug)
}

/// Runs `bug` in recover mode and checks that it caused `count` reports, the last as expected
/// (a string helper that goes on reading a freed string reports each byte).
fn expect_reports(
    expect: Expect,
    count: core::ops::RangeInclusive<u64>,
    bug: impl FnOnce(),
) -> Result<Report, Failure> {
    let (reports, report) = recording::scope(bug);
    check!(count.contains(&reports));
    let Some(report) = report else {
        return Err(fail("no report recorded"));
    };
    check!(report.bug == expect.bug);
    // A tag check fault's syndrome has no access size under QEMU (ISV clear): size 0, which
    // Linux's HW_TAGS reports too.
    if !(HARDWARE_TAGS && report.size == 0) {
        check_eq!(report.size, expect.size);
    }
    // MTE faults on the first access that mismatches: the load of a read-modify-write (atomics,
    // bitops) or of a copy (memmove reads its source first) comes before the store.
    if !(HARDWARE_TAGS && expect.write && !report.write) {
        check!(report.write == expect.write);
    }
    let Some(object) = report.object else {
        return Err(fail("the report names no object"));
    };
    check!(object.alloc_task.is_some());
    check!(names(object.alloc_stack, expect.site));
    let freed = matches!(expect.bug, BugType::UseAfterFree | BugType::DoubleFree);
    check!(object.free_task.is_some() == freed);
    if freed {
        check!(names(object.free_stack, expect.site));
    }
    Ok(report)
}

/// Whether a report of an intrinsic's bad range starting at `start` (`len` bytes) has the
/// address it must: the range's start from the software runtime, which checks a whole range
/// first; the first mismatching access's from MTE, which faults inside the intrinsic's loop.
fn reported_range(address: u64, start: u64, len: u64) -> bool {
    if HARDWARE_TAGS { (start..start + len).contains(&address) } else { address == start }
}

/// An object tag other than `object`'s.
fn other_tag(object: u64) -> u8 {
    let tag = tag_of(object);
    if tag == Tags::LAST_OBJECT_TAG { Tags::FIRST_OBJECT_TAG } else { tag + 1 }
}

fn site(function: fn(&Context) -> Outcome) -> u64 {
    function as usize as u64
}

fn kasan_tag_generator(_: &Context) -> Outcome {
    let draw = |seed: u32| {
        Tags::seed(seed);
        core::array::from_fn::<u8, 64, _>(|_| Tags::random_tag())
    };
    // The same seed gives the same tags (reproducible runs), another seed others.
    check!(draw(0x1234) == draw(0x1234));
    check!(draw(0x1234) != draw(0x4321));
    // Every draw is an object tag, and every object tag comes up.
    Tags::seed(7);
    let mut seen = [false; 256];
    for _ in 0..20_000 {
        let tag = Tags::random_tag();
        check!(Tags::is_object_tag(tag));
        seen[tag as usize] = true;
    }
    check!((Tags::FIRST_OBJECT_TAG..=Tags::LAST_OBJECT_TAG).all(|tag| seen[tag as usize]));
    let object_tags = (Tags::LAST_OBJECT_TAG - Tags::FIRST_OBJECT_TAG) as usize + 1;
    check_eq!(object_tags, if HARDWARE_TAGS { 14 } else { 238 });
    check_eq!(seen.iter().filter(|seen| **seen).count(), object_tags);
    Ok(Verdict::Passed)
}

/// Draws of the tag generator in a test.
const FAIR_DRAWS: u32 = 1_000_000;

/// Pearson's chi-square statistic of `counts` (draws per tag) against the uniform distribution,
/// times 1000.
fn chi_square_milli(counts: &[u32]) -> u64 {
    let (bins, draws) = (counts.len() as u64, counts.iter().map(|&count| count as u64).sum::<u64>());
    // sum((count - draws/bins)^2 / (draws/bins)) = sum((bins*count - draws)^2) / (bins*draws)
    let scaled: u64 = counts.iter().map(|&count| (bins * count as u64).abs_diff(draws).pow(2)).sum();
    scaled * 1000 / (bins * draws)
}

/// The generator's tags are uniform over their range: over 10^6 draws the chi-square statistic
/// stays under its 0.1% upper quantile (310.0 for the shadow's 237 degrees of freedom, 34.5 for
/// MTE's 13), computed for the software generator in every build and, in build variant `mte`,
/// for IRG too. The detector is checked against the generator's former mapping (the top byte's
/// remainder modulo 238, 18 tags twice as likely), which it must reject.
fn kasan_tag_generator_fair(_: &Context) -> Outcome {
    use crate::mm::kasan::shadow::{self, OBJECT_TAGS, ShadowTags};
    const SEED: u32 = 0x5eed_fa17;
    /// 1000 x the chi-square quantiles of probability 0.999.
    const BOUND_237: u64 = 310_013;
    const BOUND_13: u64 = 34_528;
    let saved = shadow::states();
    ShadowTags::seed(SEED);
    let mut counts = [0u32; OBJECT_TAGS as usize];
    for _ in 0..FAIR_DRAWS / 10_000 {
        // As the heap draws: with IRQs masked, a while at a time.
        let _masked = crate::sync::IrqMask::new();
        for _ in 0..10_000 {
            counts[(ShadowTags::random_tag() - ShadowTags::FIRST_OBJECT_TAG) as usize] += 1;
        }
    }
    shadow::restore(saved);
    // The former mapping over the same generator's states.
    let mut former = [0u32; OBJECT_TAGS as usize];
    let mut state = shadow::seed_of(SEED, 0);
    for _ in 0..FAIR_DRAWS {
        state = shadow::next_state(state);
        former[((state >> 24) % OBJECT_TAGS) as usize] += 1;
    }
    let (fair, biased) = (chi_square_milli(&counts), chi_square_milli(&former));
    defmt::info!(
        "kasan tags: chi-square over {=u32} draws, {=u32} degrees of freedom: {=u64}.{=u64:03} (bound {=u64}.{=u64:03}); the former mapping's {=u64}.{=u64:03}",
        FAIR_DRAWS,
        OBJECT_TAGS - 1,
        fair / 1000,
        fair % 1000,
        BOUND_237 / 1000,
        BOUND_237 % 1000,
        biased / 1000,
        biased % 1000
    );
    check!(fair <= BOUND_237);
    check!(biased > BOUND_237);
    if HARDWARE_TAGS {
        Tags::seed(SEED);
        let mut counts = [0u32; 14];
        for _ in 0..FAIR_DRAWS {
            counts[(Tags::random_tag() - Tags::FIRST_OBJECT_TAG) as usize] += 1;
        }
        let irg = chi_square_milli(&counts);
        defmt::info!(
            "kasan tags: IRG's chi-square over {=u32} draws, 13 degrees of freedom: {=u64}.{=u64:03} (bound {=u64}.{=u64:03})",
            FAIR_DRAWS,
            irg / 1000,
            irg % 1000,
            BOUND_13 / 1000,
            BOUND_13 % 1000
        );
        check!(irg <= BOUND_13);
    }
    Ok(Verdict::Passed)
}

/// Two live objects of `size` bytes in buddy blocks (neither block can merge while the other is
/// live, so a freed one is handed out again at once), the lower block's first.
fn buddy_pair(size: usize) -> Result<(u64, u64), Failure> {
    let block_size = (32 + (size as u64).next_multiple_of(16) + 16).next_power_of_two();
    let block = |object: u64| untagged(object) - 32;
    let mut objects = [0u64; 8];
    for index in 0..objects.len() {
        objects[index] = allocate(size);
        let new = objects[index];
        if let Some(&other) = objects[..index].iter().find(|&&other| block(other) ^ block(new) == block_size) {
            for &object in objects[..index].iter().filter(|&&object| object != other) {
                heap::free(object);
            }
            return Ok(if block(other) < block(new) { (other, new) } else { (new, other) });
        }
    }
    for object in objects {
        heap::free(object);
    }
    Err(fail("no two buddy blocks among eight allocations"))
}

/// 20,000 times one object freed and its block handed out again at once: how often the new
/// object gets the old tag, the tag a stale pointer to the old one carries. With MTE the heap
/// gives IRG the old tag as an exclusion: never. The shadow's generator does not exclude it: 1
/// in 238 expected (and at most twice that checked).
fn kasan_tag_reused_block(_: &Context) -> Outcome {
    const REUSES: u32 = 20_000;
    let stacks = heap::stacks();
    heap::set_stacks(Stacks::None);
    let (mut object, neighbour) = buddy_pair(48)?;
    let (mut same, mut moved) = (0u32, 0u32);
    for _ in 0..REUSES {
        let previous = object;
        heap::free(previous);
        object = allocate(48);
        moved += u32::from(untagged(object) != untagged(previous));
        same += u32::from(tag_of(object) == tag_of(previous));
    }
    heap::free(object);
    heap::free(neighbour);
    heap::set_stacks(stacks);
    let object_tags = (Tags::LAST_OBJECT_TAG - Tags::FIRST_OBJECT_TAG) as u32 + 1;
    defmt::info!(
        "kasan tags: {=u32} of {=u32} reuses of one block got the freed object's tag back ({=u32} tags)",
        same,
        REUSES,
        object_tags
    );
    check_eq!(moved, 0);
    if HARDWARE_TAGS {
        check_eq!(same, 0);
    } else {
        check!(same <= 2 * REUSES / object_tags);
    }
    Ok(Verdict::Passed)
}

/// Alignments of 64 KiB and more, up to the largest the heap serves (`heap::MAX_ALIGN`, half its
/// largest block): each allocation succeeds exactly when a free block of twice the alignment
/// exists, is aligned, tagged with its guards, usable whole, reported past its end, moved by a
/// reallocation to an aligned place, and freed; through Rust's allocator too. An alignment
/// above the largest is refused, said and counted, and allocates nothing.
fn kasan_heap_large_alignments(_: &Context) -> Outcome {
    let (requested, _) = heap::usage();
    let site = site(kasan_heap_large_alignments);
    for log2 in 16..=heap::MAX_ALIGN.trailing_zeros() {
        let align = 1u64 << log2;
        let fits = heap::largest_free_block() >= 2 * align;
        // Up to 1 MiB the 16 MiB heap has room; beyond, it depends on what is live.
        check!(fits || log2 > 20);
        let Some(object) = heap::allocate(100, align as usize) else {
            check!(!fits);
            continue;
        };
        check!(fits);
        check_eq!(untagged(object) % align, 0);
        let tag = tag_of(object);
        check!(Tags::is_object_tag(tag));
        check_eq!(Tags::object_tag(untagged(object)), tag);
        check_eq!(Tags::memory_tag(untagged(object) - 16), Tags::INVALID);
        check_eq!(Tags::memory_tag(untagged(object) + 112), Tags::INVALID);
        let (count, _) = recording::scope(|| {
            for offset in 0..100 {
                write_u8(object + offset, offset as u8);
            }
        });
        check_eq!(count, 0);
        if CHECKED {
            expect_report(Expect { bug: BugType::OutOfBounds, size: 1, write: false, site }, || {
                black_box(read_u8(object + 112));
            })?;
        }
        // Grown past its block (twice the alignment), it moves to another aligned block.
        let moved = heap::reallocate(object, align as usize, align as usize + 64);
        let Some(moved) = moved else {
            check!(heap::largest_free_block() < 4 * align);
            heap::free(object);
            continue;
        };
        check_eq!(untagged(moved) % align, 0);
        check!(untagged(moved) != untagged(object));
        check_eq!(read_u8(moved + 99), 99);
        let (count, _) = recording::scope(|| heap::free(moved));
        check_eq!(count, 0);
    }
    // Rust's allocator: a 64 KiB-aligned page.
    let layout = core::alloc::Layout::from_size_align(4096, 1 << 16).map_err(|_| fail("layout"))?;
    // SAFETY: a layout of non-zero size; freed below with the same layout.
    let page = unsafe { alloc::alloc::alloc(layout) };
    check!(!page.is_null());
    check_eq!(page as u64 % (1 << 16), 0);
    // SAFETY: allocated above with this layout.
    unsafe { alloc::alloc::dealloc(page, layout) };
    // Above the largest alignment: refused, said and counted.
    let refused = heap::refused_alignments();
    check!(heap::allocate(100, 2 * heap::MAX_ALIGN as usize).is_none());
    check_eq!(heap::refused_alignments(), refused + 1);
    check_eq!(heap::usage().0, requested);
    check!(heap::audit().is_ok());
    Ok(Verdict::Passed)
}

fn kasan_heap_tags_objects(_: &Context) -> Outcome {
    let mut objects = [0u64; 32];
    for (index, object) in objects.iter_mut().enumerate() {
        *object = allocate(1 + index * 37);
        let tag = tag_of(*object);
        check!(Tags::is_object_tag(tag));
        check_eq!(*object % 16, 0);
        // Every granule of the object carries its tag, the header granule before it does not.
        // With short granules a partly used last granule holds its length, the tag in its last byte.
        let untagged = untagged(*object);
        let size = 1 + index as u64 * 37;
        for granule in (0..size).step_by(16) {
            check_eq!(Tags::object_tag(untagged + granule), tag);
            let used = (size - granule).min(16);
            let expected = if kasan::SHORT_GRANULES && used < 16 { used as u8 } else { tag };
            check_eq!(Tags::memory_tag(untagged + granule), expected);
        }
        check_eq!(Tags::memory_tag(untagged - 16), Tags::INVALID);
    }
    for object in objects {
        heap::free(object);
        check_eq!(Tags::memory_tag(untagged(object)), Tags::INVALID);
    }
    // Tags vary (238 values; 32 objects all alike would mean a broken generator).
    check!(objects.iter().any(|object| tag_of(*object) != tag_of(objects[0])));
    Ok(Verdict::Passed)
}

fn kasan_heap_no_false_positives(_: &Context) -> Outcome {
    let (count, _) = recording::scope(|| {
        let mut numbers: Vec<u64> = Vec::new();
        for value in 0..1000 {
            numbers.push(value * value);
        }
        let mut text = String::new();
        for word in ["tag", "based", "sanitizer", "heap"] {
            text.push_str(word);
            text.push(' ');
        }
        let boxed: Box<[u8]> = numbers.iter().map(|value| *value as u8).collect();
        let mut copy = numbers.clone();
        copy.reverse();
        copy.truncate(10);
        copy.shrink_to_fit();
        black_box((numbers.iter().sum::<u64>(), text.len(), boxed.len(), copy[9]));
    });
    check_eq!(count, 0);
    Ok(Verdict::Passed)
}

fn kasan_oob_right_small(_: &Context) -> Outcome {
    if !CHECKED {
        return Ok(Verdict::Skipped(NO_CHECKS));
    }
    // The bad write lands in the trailing guard granule (recover mode lets it happen).
    let object = allocate(96);
    let expect = Expect { bug: BugType::OutOfBounds, size: 1, write: true, site: site(kasan_oob_right_small) };
    let report = expect_report(expect, || write_u8(object + 96, 0x5a))?;
    check_eq!(report.address, object + 96);
    check_eq!(report.pointer_tag, tag_of(object));
    check_eq!(report.memory_tag, Tags::INVALID);
    heap::free(object);
    Ok(Verdict::Passed)
}

fn kasan_oob_left_small(_: &Context) -> Outcome {
    if !CHECKED {
        return Ok(Verdict::Skipped(NO_CHECKS));
    }
    let object = allocate(15);
    let expect = Expect { bug: BugType::OutOfBounds, size: 1, write: false, site: site(kasan_oob_left_small) };
    let report = expect_report(expect, || {
        black_box(read_u8(object - 1));
    })?;
    check_eq!(report.address, object - 1);
    heap::free(object);
    Ok(Verdict::Passed)
}

fn kasan_oob_right_large(_: &Context) -> Outcome {
    if !CHECKED {
        return Ok(Verdict::Skipped(NO_CHECKS));
    }
    let object = allocate(40_000);
    let expect = Expect { bug: BugType::OutOfBounds, size: 8, write: false, site: site(kasan_oob_right_large) };
    expect_report(expect, || {
        black_box(read_u64(object + 40_000));
    })?;
    heap::free(object);
    Ok(Verdict::Passed)
}

fn kasan_oob_left_large(_: &Context) -> Outcome {
    if !CHECKED {
        return Ok(Verdict::Skipped(NO_CHECKS));
    }
    let object = allocate(40_000);
    let expect = Expect { bug: BugType::OutOfBounds, size: 8, write: false, site: site(kasan_oob_left_large) };
    expect_report(expect, || {
        black_box(read_u64(object - 8));
    })?;
    heap::free(object);
    Ok(Verdict::Passed)
}

fn kasan_oob_right_page(_: &Context) -> Outcome {
    if !CHECKED {
        return Ok(Verdict::Skipped(NO_CHECKS));
    }
    let object = heap::allocate(4096, 4096).expect("the heap has room");
    check_eq!(object % 4096, 0);
    let expect = Expect { bug: BugType::OutOfBounds, size: 1, write: false, site: site(kasan_oob_right_page) };
    expect_report(expect, || {
        black_box(read_u8(object + 4096));
    })?;
    heap::free(object);
    Ok(Verdict::Passed)
}

fn kasan_oob_left_page(_: &Context) -> Outcome {
    if !CHECKED {
        return Ok(Verdict::Skipped(NO_CHECKS));
    }
    let object = heap::allocate(4096, 4096).expect("the heap has room");
    let expect = Expect { bug: BugType::OutOfBounds, size: 8, write: false, site: site(kasan_oob_left_page) };
    expect_report(expect, || {
        black_box(read_u64(object - 8));
    })?;
    heap::free(object);
    Ok(Verdict::Passed)
}

fn kasan_realloc_grow_oob(_: &Context) -> Outcome {
    if !CHECKED {
        return Ok(Verdict::Skipped(NO_CHECKS));
    }
    // 160 bytes in a 256-byte block (header, guard, object, trailing guard): 192 still fits.
    let object = allocate(160);
    let grown = heap::reallocate(object, 16, 192).expect("the heap has room");
    check_eq!(grown, object);
    // The last byte of the new size is fine, the next one (the trailing guard) is not.
    let (count, _) = recording::scope(|| write_u8(grown + 191, 1));
    check_eq!(count, 0);
    let expect = Expect { bug: BugType::OutOfBounds, size: 1, write: true, site: site(kasan_realloc_grow_oob) };
    expect_report(expect, || write_u8(grown + 192, 1))?;
    heap::free(grown);
    Ok(Verdict::Passed)
}

fn kasan_realloc_shrink_oob(_: &Context) -> Outcome {
    if !CHECKED {
        return Ok(Verdict::Skipped(NO_CHECKS));
    }
    let object = allocate(240);
    let shrunk = heap::reallocate(object, 16, 192).expect("the heap has room");
    let (count, _) = recording::scope(|| {
        black_box(read_u8(shrunk + 191));
    });
    check_eq!(count, 0);
    let expect = Expect { bug: BugType::OutOfBounds, size: 1, write: false, site: site(kasan_realloc_shrink_oob) };
    let report = expect_report(expect, || {
        black_box(read_u8(shrunk + 192));
    })?;
    check_eq!(report.object.map_or(0, |object| object.size), 192);
    heap::free(shrunk);
    Ok(Verdict::Passed)
}

fn kasan_realloc_moved_uaf(_: &Context) -> Outcome {
    if !CHECKED {
        return Ok(Verdict::Skipped(NO_CHECKS));
    }
    // Growing past the block moves the object: the old pointer is freed.
    let object = allocate(32);
    write_u64(object, 0x1234);
    let moved = heap::reallocate(object, 16, 1000).expect("the heap has room");
    check!(untagged(moved) != untagged(object));
    check_eq!(read_u64(moved), 0x1234);
    let expect = Expect { bug: BugType::UseAfterFree, size: 8, write: false, site: site(kasan_realloc_moved_uaf) };
    expect_report(expect, || {
        black_box(read_u64(object));
    })?;
    heap::free(moved);
    Ok(Verdict::Passed)
}

fn kasan_uaf_read(_: &Context) -> Outcome {
    if !CHECKED {
        return Ok(Verdict::Skipped(NO_CHECKS));
    }
    let object = allocate(64);
    heap::free(object);
    let expect = Expect { bug: BugType::UseAfterFree, size: 8, write: false, site: site(kasan_uaf_read) };
    let report = expect_report(expect, || {
        black_box(read_u64(object + 8));
    })?;
    check_eq!(report.object.map_or(0, |object| object.address), object);
    Ok(Verdict::Passed)
}

fn kasan_uaf_write(_: &Context) -> Outcome {
    if !CHECKED {
        return Ok(Verdict::Skipped(NO_CHECKS));
    }
    let object = allocate(20);
    heap::free(object);
    let expect = Expect { bug: BugType::UseAfterFree, size: 1, write: true, site: site(kasan_uaf_write) };
    expect_report(expect, || write_u8(object + 19, 7))?;
    Ok(Verdict::Passed)
}

fn kasan_uaf_after_reuse(_: &Context) -> Outcome {
    if !CHECKED {
        return Ok(Verdict::Skipped(NO_CHECKS));
    }
    let stale = allocate(64);
    heap::free(stale);
    // The buddy allocator hands the same block out again; make sure the new object's tag
    // differs from the stale pointer's (else the access would be a tag collision, 1 in 238).
    let mut reused = allocate(64);
    let mut tries = 0;
    while tag_of(reused) == tag_of(stale) && tries < 8 {
        heap::free(reused);
        reused = allocate(64);
        tries += 1;
    }
    check_eq!(untagged(reused), untagged(stale));
    check!(tag_of(reused) != tag_of(stale));
    let expect = Expect { bug: BugType::UseAfterFree, size: 8, write: false, site: site(kasan_uaf_after_reuse) };
    let report = expect_report(expect, || {
        black_box(read_u64(stale));
    })?;
    check_eq!(report.memory_tag, tag_of(reused));
    check_eq!(report.object.map_or(0, |object| object.address), stale);
    heap::free(reused);
    Ok(Verdict::Passed)
}

fn kasan_double_free(_: &Context) -> Outcome {
    let object = allocate(48);
    heap::free(object);
    let (count, report) = recording::scope(|| heap::free(object));
    check_eq!(count, 1);
    let Some(report) = report else {
        return Err(fail("no report recorded"));
    };
    check!(report.bug == BugType::DoubleFree);
    check_eq!(report.address, object);
    // Stacks need frame pointers and the function table (builds `full` and `prod`).
    if crate::build_info::SHADOW_CALL_STACK {
        let Some(freed) = report.object else {
            return Err(fail("the report names no object"));
        };
        check!(names(freed.alloc_stack, site(kasan_double_free)));
        check!(names(freed.free_stack, site(kasan_double_free)));
        // The faulting pc is the free's caller, not the heap's own code.
        let free_function = heap::free as fn(u64) as usize as u64;
        check!(report.pc != 0);
        check!(
            crate::symbols::callsites::function_containing(report.pc).is_some_and(|(start, _)| start != free_function)
        );
    }
    // The heap is intact: the block is handed out again.
    let again = allocate(48);
    check_eq!(untagged(again), untagged(object));
    heap::free(again);
    Ok(Verdict::Passed)
}

fn kasan_invalid_free(_: &Context) -> Outcome {
    static NOT_HEAP: u64 = 0;
    let object = allocate(64);
    for bad in [object + 16, &NOT_HEAP as *const u64 as u64, object + 1] {
        let (count, report) = recording::scope(|| heap::free(bad));
        check_eq!(count, 1);
        check!(report.is_some_and(|report| report.bug == BugType::InvalidFree && report.address == bad));
    }
    // The object's start with another tag: a stale pointer to an object that started there, a
    // double free (Linux's rule: an object's start whose tag does not match).
    let wrong_tag = with_tag(object, other_tag(object));
    let (count, report) = recording::scope(|| heap::free(wrong_tag));
    check_eq!(count, 1);
    check!(report.is_some_and(|report| report.bug == BugType::DoubleFree && report.address == wrong_tag));
    // None of them freed the object: it is still live and its real free works.
    check_eq!(Tags::memory_tag(untagged(object)), tag_of(object));
    let (count, _) = recording::scope(|| heap::free(object));
    check_eq!(count, 0);
    Ok(Verdict::Passed)
}

fn kasan_memset_oob(_: &Context) -> Outcome {
    if !CHECKED {
        return Ok(Verdict::Skipped(NO_CHECKS));
    }
    let object = allocate(64);
    let expect = Expect { bug: BugType::OutOfBounds, size: 32, write: true, site: site(kasan_memset_oob) };
    let report = expect_report(expect, || {
        // SAFETY: deliberately straddles the object's end (the granules after it are heap
        // memory, mapped): the sanitizer must report it.
        unsafe { core::ptr::write_bytes((object + 48) as *mut u8, 0xaa, black_box(32)) }
    })?;
    check!(reported_range(report.address, object + 48, 32));
    heap::free(object);
    Ok(Verdict::Passed)
}

fn kasan_memcpy_oob(_: &Context) -> Outcome {
    if !CHECKED {
        return Ok(Verdict::Skipped(NO_CHECKS));
    }
    let object = allocate(64);
    let mut destination = [0u8; 64];
    let expect = Expect { bug: BugType::OutOfBounds, size: 40, write: false, site: site(kasan_memcpy_oob) };
    let report = expect_report(expect, || {
        // SAFETY: the source deliberately straddles the object's end (see kasan_memset_oob).
        unsafe { core::ptr::copy_nonoverlapping((object + 32) as *const u8, destination.as_mut_ptr(), black_box(40)) }
    })?;
    check!(reported_range(report.address, object + 32, 40));
    black_box(&destination);
    heap::free(object);
    Ok(Verdict::Passed)
}

fn kasan_memmove_oob(_: &Context) -> Outcome {
    if !CHECKED {
        return Ok(Verdict::Skipped(NO_CHECKS));
    }
    let object = allocate(64);
    let expect = Expect { bug: BugType::OutOfBounds, size: 32, write: true, site: site(kasan_memmove_oob) };
    let report = expect_report(expect, || {
        // SAFETY: the overlapping destination deliberately straddles the object's end.
        unsafe { core::ptr::copy(object as *const u8, (object + 40) as *mut u8, black_box(32)) }
    })?;
    check!(reported_range(report.address, object + 40, 32));
    heap::free(object);
    Ok(Verdict::Passed)
}

fn kasan_box_oob_and_uaf(_: &Context) -> Outcome {
    if !CHECKED {
        return Ok(Verdict::Skipped(NO_CHECKS));
    }
    let boxed = Box::new([7u64; 4]);
    let address = &*boxed as *const [u64; 4] as u64;
    check!(Tags::is_object_tag(tag_of(address)));
    let site = site(kasan_box_oob_and_uaf);
    expect_report(Expect { bug: BugType::OutOfBounds, size: 8, write: false, site }, || {
        black_box(read_u64(address + 32));
    })?;
    drop(black_box(boxed));
    expect_report(Expect { bug: BugType::UseAfterFree, size: 8, write: false, site }, || {
        black_box(read_u64(address));
    })?;
    Ok(Verdict::Passed)
}

fn kasan_vec_oob_and_uaf(_: &Context) -> Outcome {
    if !CHECKED {
        return Ok(Verdict::Skipped(NO_CHECKS));
    }
    let mut numbers: Vec<u32> = Vec::with_capacity(12);
    numbers.extend(0..12);
    let address = numbers.as_ptr() as u64;
    let site = site(kasan_vec_oob_and_uaf);
    // 12 u32 = 48 bytes, a whole number of granules: the 13th element is out of bounds.
    expect_report(Expect { bug: BugType::OutOfBounds, size: 1, write: false, site }, || {
        black_box(read_u8(address + 48));
    })?;
    drop(black_box(numbers));
    expect_report(Expect { bug: BugType::UseAfterFree, size: 1, write: false, site }, || {
        black_box(read_u8(address + 4));
    })?;
    Ok(Verdict::Passed)
}

fn kasan_string_oob_and_uaf(_: &Context) -> Outcome {
    if !CHECKED {
        return Ok(Verdict::Skipped(NO_CHECKS));
    }
    let mut text = String::with_capacity(32);
    text.push_str("a tag-based sanitizer heap");
    let address = text.as_ptr() as u64;
    let site = site(kasan_string_oob_and_uaf);
    expect_report(Expect { bug: BugType::OutOfBounds, size: 1, write: false, site }, || {
        black_box(read_u8(address + 32));
    })?;
    drop(black_box(text));
    expect_report(Expect { bug: BugType::UseAfterFree, size: 1, write: false, site }, || {
        black_box(read_u8(address));
    })?;
    Ok(Verdict::Passed)
}

fn kasan_stack_modes(_: &Context) -> Outcome {
    if !crate::build_info::SHADOW_CALL_STACK {
        return Ok(Verdict::Skipped("stacks need frame pointers and the shadow call stack (builds full, prod)"));
    }
    let site = site(kasan_stack_modes);
    let mut result = Ok(Verdict::Passed);
    // Without frame pointers the frame-walk modes are refused (their walks save nothing).
    for mode in Stacks::ALL.into_iter().filter(|mode| mode.available()) {
        heap::set_stacks(mode);
        let object = allocate(24);
        heap::free(object);
        let (Some(allocated), Some(freed)) = (heap::newest_entry(object, false), heap::newest_entry(object, true))
        else {
            result = Err(fail("no ring entries for the object"));
            break;
        };
        let depot = !matches!(
            mode,
            Stacks::None | Stacks::FramePointerNoDepot | Stacks::ShadowCallStackNoDepot | Stacks::SFrameNoDepot
        );
        let saved = allocated.stack != 0 && freed.stack != 0;
        let named = names(allocated.stack, site) && names(freed.stack, site);
        if saved != depot || (depot && !named) {
            defmt::error!("  stack mode {=str}: saved {=bool}, names the test {=bool}", mode.name(), saved, named);
            result = Err(fail("stacks not saved as the mode says"));
            break;
        }
    }
    heap::set_stacks(Stacks::DEFAULT);
    result
}

/// An overflow inside an object's last granule: SW_TAGS's blind spot (documented not caught),
/// caught with short granules (`--kasan-short-granules`). Asserts what each build does, so it
/// fails if either changes.
fn kasan_not_caught_inside_last_granule(_: &Context) -> Outcome {
    if !CHECKED {
        return Ok(Verdict::Skipped(NO_CHECKS));
    }
    let object = allocate(13);
    if kasan::SHORT_GRANULES {
        // The granule's memory tag is 13 (bytes used), its last byte the tag: each byte past the
        // end is caught, reads and writes, every byte before it passes. Byte 15 (the tag byte)
        // is only read: a recovered write there would change the tag.
        let (count, _) = recording::scope(|| {
            for offset in 0..13 {
                black_box(read_u8(object + offset));
            }
            write_u8(object + 12, 1);
        });
        check_eq!(count, 0);
        for offset in 13..16 {
            let (count, report) = recording::scope(|| {
                black_box(read_u8(object + offset));
            });
            check_eq!(count, 1);
            check!(report.is_some_and(|report| report.bug == BugType::OutOfBounds
                && report.address == object + offset
                && report.memory_tag == 13
                && report.pointer_tag == tag_of(object)));
        }
        let (count, _) = recording::scope(|| write_u8(object + 13, 1));
        check_eq!(count, 1);
        // A 2-byte read that starts inside and ends past the object, and one through the
        // runtime's range check (an odd size, `__hwasan_loadN`'s rule).
        let (count, _) = recording::scope(|| {
            black_box(read_u16(object + 12));
        });
        check_eq!(count, 1);
        let (count, _) = recording::scope(|| {
            let mut copy = [0u8; 13];
            // SAFETY: reads the 13 bytes of the live object (no report expected) through the
            // runtime's memcpy check, then 14 (one past the end).
            unsafe { core::ptr::copy_nonoverlapping(object as *const u8, copy.as_mut_ptr(), black_box(13)) };
            let mut longer = [0u8; 14];
            // SAFETY: as above, one byte too many: reported and not carried out.
            unsafe { core::ptr::copy_nonoverlapping(object as *const u8, longer.as_mut_ptr(), black_box(14)) };
            black_box((copy, longer));
        });
        check_eq!(count, 1);
    } else {
        // 13 bytes occupy one granule; bytes 13-15 carry the object's tag too.
        let (count, _) = recording::scope(|| {
            for offset in 13..16 {
                write_u8(object + offset, 1);
            }
        });
        check_eq!(count, 0);
    }
    // The next granule is caught.
    let (count, _) = recording::scope(|| {
        black_box(read_u8(object + 16));
    });
    check_eq!(count, 1);
    heap::free(object);
    Ok(Verdict::Passed)
}

fn kasan_not_caught_tag_collision(_: &Context) -> Outcome {
    if !CHECKED {
        return Ok(Verdict::Skipped(NO_CHECKS));
    }
    // Allocate until an object gets the first one's tag: a pointer to the first object that
    // strays into the other is then not caught.
    let first = allocate(32);
    let mut held = Vec::new();
    let twin = loop {
        let candidate = allocate(32);
        if tag_of(candidate) == tag_of(first) {
            break candidate;
        }
        held.push(candidate);
        if held.len() > 4000 {
            return Err(fail("no tag collision in 4000 allocations"));
        }
    };
    let stray = first.wrapping_add(untagged(twin).wrapping_sub(untagged(first)));
    check_eq!(stray, twin);
    let (count, _) = recording::scope(|| write_u64(stray, 1));
    check_eq!(count, 0);
    for object in held.into_iter().chain([first, twin]) {
        heap::free(object);
    }
    Ok(Verdict::Passed)
}

/// Allocates and frees 64 objects of each size, writing and reading them whole, and checks that
/// nothing was reported and no object overlaps another: the heap a recovered bug left behind
/// still works. One checked memset and instrumented loads per object, no call per byte (the
/// corpus runs under `ftrace=*` too).
fn churn(sizes: &[usize]) -> Outcome {
    let mut overlaps = 0;
    let (count, _) = recording::scope(|| {
        for &size in sizes {
            let mut objects = [0u64; 64];
            for (index, object) in objects.iter_mut().enumerate() {
                *object = allocate(size);
                // SAFETY: a live object of `size` bytes, written whole.
                unsafe { core::ptr::write_bytes(*object as *mut u8, index as u8, size) };
            }
            for (index, object) in objects.iter().enumerate() {
                // SAFETY: as above, read whole (instrumented loads).
                let bytes = unsafe { core::slice::from_raw_parts(*object as *const u8, size) };
                if bytes.iter().any(|&byte| byte != index as u8) {
                    overlaps += 1;
                }
            }
            for object in objects {
                heap::free(object);
            }
        }
    });
    check_eq!(count, 0);
    check_eq!(overlaps, 0);
    Ok(Verdict::Passed)
}

fn kasan_sound_memmove_negative_size(_: &Context) -> Outcome {
    if !CHECKED {
        return Ok(Verdict::Skipped(NO_CHECKS));
    }
    if HARDWARE_TAGS {
        return Ok(Verdict::Skipped(NO_RANGE_CHECK));
    }
    // Linux's kmalloc_memmove_negative_size: (size_t)-2 wraps a naive range check.
    let object = allocate(64);
    for offset in 0..64 {
        write_u8(object + offset, offset as u8);
    }
    let site = site(kasan_sound_memmove_negative_size);
    let report = expect_report(Expect { bug: BugType::OutOfBounds, size: u64::MAX - 1, write: false, site }, || {
        // SAFETY: deliberately a size that overflows the address space: the sanitizer must
        // report it and move nothing.
        unsafe { core::ptr::copy((object + 4) as *const u8, object as *mut u8, black_box(usize::MAX - 1)) }
    })?;
    check_eq!(report.address, object + 4);
    for offset in 0..64 {
        check_eq!(read_u8(object + offset), offset as u8);
    }
    let (count, _) = recording::scope(|| heap::free(object));
    check_eq!(count, 0);
    churn(&[48, 64, 80])
}

fn kasan_sound_intrinsic_not_carried_out(_: &Context) -> Outcome {
    if !CHECKED {
        return Ok(Verdict::Skipped(NO_CHECKS));
    }
    let object = allocate(112);
    let past = untagged(object) + 112;
    // SAFETY: the granule after the object is the block's (untagged read of heap memory).
    let before = unsafe { (past as *const u64).read_volatile() };
    let site = site(kasan_sound_intrinsic_not_carried_out);
    expect_report(Expect { bug: BugType::OutOfBounds, size: 16, write: true, site }, || {
        // SAFETY: deliberately straddles the object's end: reported, so not carried out.
        unsafe { core::ptr::write_bytes((object + 104) as *mut u8, 0xaa, black_box(16)) }
    })?;
    // SAFETY: as above.
    let after = unsafe { (past as *const u64).read_volatile() };
    if HARDWARE_TAGS {
        // Expected otherwise with MTE: the fault came from inside the intrinsic, which goes on
        // with checks suppressed after the report (as Linux's HW_TAGS with kasan.fault=report):
        // the write is carried out, into the trailing guard granule.
        check_eq!(after, 0xaaaa_aaaa_aaaa_aaaa);
        heap::free(object);
        return Ok(Verdict::Passed);
    }
    check_eq!(after, before);
    check!(read_u8(object + 104) != 0xaa || read_u8(object + 111) != 0xaa);
    heap::free(object);
    Ok(Verdict::Passed)
}

fn kasan_sound_overflow_spares_metadata(_: &Context) -> Outcome {
    if !CHECKED {
        return Ok(Verdict::Skipped(NO_CHECKS));
    }
    // Sizes with no slack in the old layout (2^k - 16): a recovered store one granule past the
    // object hit the next block's header.
    let site = site(kasan_sound_overflow_spares_metadata);
    for size in [112u64, 240, 496, 1008] {
        let objects: [u64; 4] = core::array::from_fn(|_| allocate(size as usize));
        for &object in &objects {
            expect_report(Expect { bug: BugType::OutOfBounds, size: 8, write: true, site }, || {
                write_u64(object + size, u64::MAX)
            })?;
            expect_report(Expect { bug: BugType::OutOfBounds, size: 8, write: true, site }, || {
                write_u64(object + size + 8, u64::MAX)
            })?;
            expect_report(Expect { bug: BugType::OutOfBounds, size: 8, write: true, site }, || {
                write_u64(object - 8, u64::MAX)
            })?;
            expect_report(Expect { bug: BugType::OutOfBounds, size: 8, write: true, site }, || {
                write_u64(object - 16, u64::MAX)
            })?;
        }
        // Every object is still whole and frees cleanly.
        let (count, _) = recording::scope(|| {
            for &object in &objects {
                black_box(read_u64(object + size - 8));
                heap::free(object);
            }
        });
        check_eq!(count, 0);
        churn(&[size as usize - 16, size as usize, size as usize + 16])?;
    }
    Ok(Verdict::Passed)
}

fn kasan_sound_overflow_spares_free_list(_: &Context) -> Outcome {
    if !CHECKED {
        return Ok(Verdict::Skipped(NO_CHECKS));
    }
    // Linux's krealloc_more_oob: 201 grown to 235, a write at 235 + one granule; the block
    // after may be free, its first word a free-list link.
    let site = site(kasan_sound_overflow_spares_free_list);
    let object = allocate(201);
    let after = allocate(201);
    heap::free(after);
    let grown = heap::reallocate(object, 16, 235).expect("the heap has room");
    let end = round_up16(235);
    expect_report(Expect { bug: BugType::OutOfBounds, size: 8, write: true, site }, || {
        write_u64(grown + end, u64::MAX)
    })?;
    expect_report(Expect { bug: BugType::OutOfBounds, size: 8, write: true, site }, || {
        write_u64(grown + end + 8, u64::MAX)
    })?;
    heap::free(grown);
    churn(&[200, 235, 256])
}

fn round_up16(size: u64) -> u64 {
    (size + 15) & !15
}

fn kasan_sound_double_free_after_ring_wrap(_: &Context) -> Outcome {
    let object = allocate(48);
    // A live neighbour keeps the freed block from merging; the churn uses another block order.
    let neighbour = allocate(48);
    heap::free(object);
    for _ in 0..(crate::mm::kasan::ring::RING_ENTRIES / 2 + 64) {
        let other = allocate(1000);
        heap::free(other);
    }
    check!(heap::newest_entry(object, true).is_none());
    let (count, report) = recording::scope(|| heap::free(object));
    check_eq!(count, 1);
    check!(report.is_some_and(|report| report.bug == BugType::DoubleFree && report.address == object));
    heap::free(neighbour);
    Ok(Verdict::Passed)
}

fn kasan_sound_match_all_free_realloc(_: &Context) -> Outcome {
    // An untagged kernel pointer carries 0xFF, which every access accepts: free and realloc do.
    let object = allocate(40);
    let (count, _) = recording::scope(|| heap::free(with_tag(object, Tags::MATCH_ALL)));
    check_eq!(count, 0);
    check_eq!(Tags::memory_tag(untagged(object)), Tags::INVALID);
    let again = allocate(40);
    let mut grown = None;
    let (count, _) = recording::scope(|| grown = heap::reallocate(with_tag(again, Tags::MATCH_ALL), 16, 64));
    check_eq!(count, 0);
    let Some(grown) = grown else {
        return Err(fail("realloc of a match-all pointer returned null"));
    };
    check!(Tags::is_object_tag(tag_of(grown)));
    let moved = heap::reallocate(with_tag(grown, Tags::MATCH_ALL), 16, 4000).expect("the heap has room");
    check_eq!(Tags::memory_tag(untagged(grown)), Tags::INVALID);
    let (count, _) = recording::scope(|| heap::free(moved));
    check_eq!(count, 0);
    Ok(Verdict::Passed)
}

fn kasan_sound_prefers_live_object(_: &Context) -> Outcome {
    if !CHECKED {
        return Ok(Verdict::Skipped(NO_CHECKS));
    }
    // A dead neighbour with the live object's tag, in the block right after it: an overflow
    // past the live object is its out-of-bounds, not the dead one's use-after-free.
    let live = allocate(112);
    let mut neighbour = allocate(112);
    let mut tries = 0;
    while tag_of(neighbour) != tag_of(live) {
        heap::free(neighbour);
        neighbour = allocate(112);
        tries += 1;
        if tries > 4000 {
            return Err(fail("no neighbour with the same tag"));
        }
    }
    heap::free(neighbour);
    let site = site(kasan_sound_prefers_live_object);
    for offset in [112, 120, 128] {
        let report = expect_report(Expect { bug: BugType::OutOfBounds, size: 1, write: false, site }, || {
            black_box(read_u8(live + offset));
        })?;
        check_eq!(report.object.map_or(0, |object| object.address), live);
    }
    heap::free(live);
    Ok(Verdict::Passed)
}

fn kasan_sound_realloc_after_free(_: &Context) -> Outcome {
    // Linux's krealloc_uaf: reallocating a freed object is a use-after-free, and changes nothing.
    let object = allocate(201);
    heap::free(object);
    let (count, report) = recording::scope(|| {
        black_box(heap::reallocate(object, 16, 19));
    });
    check_eq!(count, 1);
    check!(report.is_some_and(|report| report.bug == BugType::UseAfterFree && report.address == object));
    check_eq!(Tags::memory_tag(untagged(object)), Tags::INVALID);
    churn(&[19, 201])
}

fn kasan_sound_zero_size(_: &Context) -> Outcome {
    let object = allocate(0);
    check!(Tags::is_object_tag(tag_of(object)));
    // No granule is the object's.
    check_eq!(Tags::memory_tag(untagged(object)), Tags::INVALID);
    if CHECKED {
        let site = site(kasan_sound_zero_size);
        expect_report(Expect { bug: BugType::OutOfBounds, size: 1, write: false, site }, || {
            black_box(read_u8(object));
        })?;
    }
    let (count, _) = recording::scope(|| heap::free(object));
    check_eq!(count, 0);
    let (count, report) = recording::scope(|| heap::free(object));
    check_eq!(count, 1);
    check!(report.is_some_and(|report| report.bug == BugType::DoubleFree));
    Ok(Verdict::Passed)
}

fn kasan_sound_bad_frees(_: &Context) -> Outcome {
    // Never allocated (inside a free block), interior, unaligned, out of the heap, just below
    // the heap, at the heap's end: each reported as an invalid free, nothing freed. A wrong tag
    // at an object's start: a double free.
    let object = allocate(64);
    let big = allocate(8000);
    heap::free(big);
    let (start, end) = heap::range();
    let other_tag = other_tag(object);
    let bad = [
        with_tag(untagged(big) + 1040, tag_of(object)),
        object + 32,
        object + 8,
        with_tag(start, tag_of(object)),
        with_tag(start + 16, Tags::MATCH_ALL),
        with_tag(start - 64, tag_of(object)),
        with_tag(end, tag_of(object)),
        with_tag(end - 16, tag_of(object)),
        0x10,
        with_tag(object, Tags::INVALID),
    ];
    for pointer in bad {
        let (count, report) = recording::scope(|| heap::free(pointer));
        check_eq!(count, 1);
        check!(report.is_some_and(|report| report.bug == BugType::InvalidFree && report.address == pointer));
    }
    // A live object's start with another tag, and a freed object's start: double frees.
    for pointer in [with_tag(object, other_tag), big] {
        let (count, report) = recording::scope(|| heap::free(pointer));
        check_eq!(count, 1);
        check!(report.is_some_and(|report| report.bug == BugType::DoubleFree && report.address == pointer));
    }
    check_eq!(Tags::memory_tag(untagged(object)), tag_of(object));
    let (count, _) = recording::scope(|| heap::free(object));
    check_eq!(count, 0);
    churn(&[64, 8000])
}

/// Enough allocations and frees (of a block order no test object here uses) that the stack ring
/// has forgotten everything before them.
fn forget_ring() {
    for _ in 0..(crate::mm::kasan::ring::RING_ENTRIES / 2 + 64) {
        let other = allocate(1000);
        heap::free(other);
    }
}

/// A one-byte read at `address` reported once as `bug`, of an object the stack ring no longer
/// remembers: the report's object, which has no stacks.
fn forgotten_report(bug: BugType, address: u64) -> Result<crate::mm::kasan::report::Object, Failure> {
    let (count, report) = recording::scope(|| {
        black_box(read_u8(address));
    });
    check_eq!(count, 1);
    let Some(report) = report else {
        return Err(fail("no report recorded"));
    };
    check!(report.bug == bug);
    let Some(found) = report.object else {
        return Err(fail("the report names no object"));
    };
    check!(!found.remembered);
    check!(found.alloc_task.is_none() && found.free_task.is_none());
    Ok(found)
}

/// A live object the stack ring has forgotten: an overflow into its guards or slack is its
/// out-of-bounds, and the report names it, not remembered, with no stacks (the ring alone named
/// a same-tag object up to a page away with that object's stacks, or none).
fn kasan_sound_forgotten_live_object(_: &Context) -> Outcome {
    if !CHECKED {
        return Ok(Verdict::Skipped(NO_CHECKS));
    }
    let object = allocate(100);
    forget_ring();
    check!(heap::newest_entry(object, false).is_none());
    // Left guard, trailing guard, slack (block of 256 bytes from 32 before the object).
    for address in [object - 1, object + 112, object + 200] {
        let found = forgotten_report(BugType::OutOfBounds, address)?;
        check_eq!(found.address, object);
        check_eq!(found.size, 100);
    }
    heap::free(object);
    Ok(Verdict::Passed)
}

/// A freed object the stack ring has forgotten (its block kept from merging by its live buddy):
/// a stale read of it is its use-after-free, and the report names it, not remembered.
fn kasan_sound_forgotten_freed_object(_: &Context) -> Outcome {
    if !CHECKED {
        return Ok(Verdict::Skipped(NO_CHECKS));
    }
    let (object, neighbour) = buddy_pair(48)?;
    heap::free(object);
    forget_ring();
    check!(heap::newest_entry(object, true).is_none());
    let found = forgotten_report(BugType::UseAfterFree, object + 40)?;
    check_eq!(found.address, object);
    check_eq!(found.size, 48);
    heap::free(neighbour);
    Ok(Verdict::Passed)
}

/// A stale pointer freed after its block went to another object and the stack ring wrapped: a
/// double free (Linux's word for a free of an object's start that does not match), where the
/// ring alone had forgotten the free and called it an invalid free. The new object stays live.
fn kasan_sound_stale_free_after_reuse(_: &Context) -> Outcome {
    let (stale, neighbour) = buddy_pair(48)?;
    heap::free(stale);
    let mut reused = allocate(48);
    while tag_of(reused) == tag_of(stale) {
        heap::free(reused);
        reused = allocate(48);
    }
    check_eq!(untagged(reused), untagged(stale));
    forget_ring();
    check!(heap::newest_entry(stale, true).is_none());
    let (count, report) = recording::scope(|| heap::free(stale));
    check_eq!(count, 1);
    check!(report.is_some_and(|report| report.bug == BugType::DoubleFree && report.address == stale));
    check_eq!(Tags::memory_tag(untagged(reused)), tag_of(reused));
    let (count, _) = recording::scope(|| {
        heap::free(reused);
        heap::free(neighbour);
    });
    check_eq!(count, 0);
    Ok(Verdict::Passed)
}

/// An access 17 to 32 bytes past a live object of 80 bytes (no slack: its block ends 16 bytes
/// after it) lands in the guard of the next block, whose freed object has the live object's
/// tag: the live object's out-of-bounds (the nearest live object within 64 bytes comes before a
/// freed object's block), not the freed neighbour's use-after-free.
fn kasan_sound_overflow_into_freed_neighbour(_: &Context) -> Outcome {
    if !CHECKED {
        return Ok(Verdict::Skipped(NO_CHECKS));
    }
    let (live, mut neighbour) = buddy_pair(80)?;
    check_eq!(untagged(neighbour), untagged(live) + 128);
    while tag_of(neighbour) != tag_of(live) {
        heap::free(neighbour);
        neighbour = allocate(80);
        check_eq!(untagged(neighbour), untagged(live) + 128);
    }
    heap::free(neighbour);
    let site = site(kasan_sound_overflow_into_freed_neighbour);
    for distance in 17..=32 {
        let address = live + 80 - 1 + distance;
        let report = expect_report(Expect { bug: BugType::OutOfBounds, size: 1, write: false, site }, || {
            black_box(read_u8(address));
        })?;
        check_eq!(report.object.map_or(0, |object| object.address), live);
    }
    heap::free(live);
    Ok(Verdict::Passed)
}

/// The cases of Linux's `mm/kasan/kasan_test_c.c` that apply to a heap-only tag-based sanitizer
/// (no slab caches, mempools, vmalloc, page allocator, RCU, workqueues or user copies), with
/// Linux's sizes and offsets (granule 16, `KMALLOC_MAX_CACHE_SIZE` 8192, `OOB_TAG_OFF` 16).
/// Each asserts the bug type, access size, direction, tags and the first frame of the stacks,
/// then audits the heap ([`audit`]).
///
/// Left out, and why: `ksize_unpoisons_memory`, `ksize_uaf` (no usable-size API);
/// `kasan_stack_oob`, `kasan_alloca_oob_left/right`, `kasan_global_oob_left/right` (only the
/// heap is tagged: no stack or global instrumentation); `kmem_cache_*`, `kmem_cache_rcu_*`,
/// `kmem_cache_bulk`, `mempool_*` (no slab caches, no mempools); `vmalloc_*`, `vmap_tags`,
/// `vm_map_ram_tags` (no vmalloc); `page_alloc_oob_right`, `page_alloc_uaf`, `kfree_via_page`,
/// `kfree_via_phys` (no page-allocator API beside the heap); `rcu_uaf`, `workqueue_uaf` (no RCU,
/// no workqueues); `copy_user_test_oob` (user copies do not go through the heap's checks);
/// `kasan_bitops_generic` (generic KASAN only). Linux's generic-only halves that overflow inside
/// the last granule (`kmalloc_oob_16`'s copy, `kmalloc_oob_right`'s `ptr[size]`, the krealloc
/// helpers' `ptr2[size2]`) are caught with short granules (`--kasan-short-granules`) and
/// checked as not caught without them.
mod linux {
    use super::*;
    use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

    const GRANULE: usize = 16;
    const KMALLOC_MAX_CACHE_SIZE: usize = 8192;
    const OOB_TAG_OFF: usize = GRANULE;

    /// Whether the first frame of a saved stack lies in `function`.
    fn first_frame_in(stack: u32, function: u64) -> bool {
        let mut buffer = [0; stackdepot::MAX_FRAMES];
        record::saved_frames(stack, &mut buffer).first().is_some_and(|&address| {
            crate::symbols::callsites::function_containing(address).is_some_and(|(start, _)| start == function)
        })
    }

    /// `expect_report`, plus: the pointer and memory tags, and stacks whose first frame is the
    /// test function's (when stacks are collected: builds with frame pointers).
    fn expect(
        bug: BugType,
        size: u64,
        write: bool,
        site: u64,
        memory_tag: Option<u8>,
        access: impl FnOnce(),
    ) -> Result<Report, Failure> {
        let report = expect_report(Expect { bug, size, write, site }, access)?;
        check_eq!(report.pointer_tag, tag_of(report.address));
        if let Some(memory_tag) = memory_tag {
            check_eq!(report.memory_tag, memory_tag);
        }
        if let Some(object) = report.object {
            check!(first_frame_in(object.alloc_stack, site));
            if object.free_task.is_some() {
                check!(first_frame_in(object.free_stack, site));
            }
        }
        Ok(report)
    }

    /// The heap audit after a case: every live header and its shadow (heap::audit), then 64
    /// allocations and frees of each of the victim's and its neighbours' sizes, written and
    /// read whole, with no report; then the headers again.
    fn audit(sizes: &[usize]) -> Outcome {
        if let Err(problem) = heap::audit() {
            return Err(fail(problem));
        }
        let mut neighbours = Vec::new();
        for &size in sizes {
            neighbours.extend([size.saturating_sub(GRANULE).max(1), size, size + GRANULE]);
        }
        churn(&neighbours)?;
        if let Err(problem) = heap::audit() {
            return Err(fail(problem));
        }
        Ok(Verdict::Passed)
    }

    #[inline(never)]
    fn read_u128(address: u64) -> u128 {
        // SAFETY: as in read_u8 (a 16-byte access: the check covers all of it).
        unsafe { (address as *const u128).read_volatile() }
    }

    #[inline(never)]
    fn memset(address: u64, byte: u8, count: usize) {
        // SAFETY: tests pass heap ranges, possibly bad: the sanitizer must report them.
        unsafe { core::ptr::write_bytes(address as *mut u8, byte, black_box(count)) }
    }

    #[inline(never)]
    fn memmove(destination: u64, source: u64, count: usize) {
        // SAFETY: as in memset.
        unsafe { core::ptr::copy(source as *const u8, destination as *mut u8, black_box(count)) }
    }

    #[inline(never)]
    fn memcpy(destination: u64, source: u64, count: usize) {
        // SAFETY: as in memset.
        unsafe { core::ptr::copy_nonoverlapping(source as *const u8, destination as *mut u8, black_box(count)) }
    }

    fn site(function: fn(&Context) -> Outcome) -> u64 {
        super::site(function)
    }

    const OOB: BugType = BugType::OutOfBounds;
    const UAF: BugType = BugType::UseAfterFree;
    const INVALID: Option<u8> = Some(Tags::INVALID);

    pub fn kasan_kmalloc_oob_right(_: &Context) -> Outcome {
        if !CHECKED {
            return Ok(Verdict::Skipped(NO_CHECKS));
        }
        let size = 128 - GRANULE - 5;
        let ptr = allocate(size);
        let here = site(kasan_kmalloc_oob_right);
        // Linux's generic-only half: inside the last granule (short granules only).
        write_inside_last_granule(ptr + size as u64, size, here)?;
        let report = expect(OOB, 1, true, here, INVALID, || write_u8(ptr + size as u64 + 5, b'y'))?;
        check_eq!(report.address, ptr + 112);
        expect(OOB, 1, false, here, INVALID, || {
            black_box(read_u8(ptr + (size + GRANULE + 5) as u64));
        })?;
        heap::free(ptr);
        audit(&[107])
    }

    pub fn kasan_kmalloc_oob_left(_: &Context) -> Outcome {
        if !CHECKED {
            return Ok(Verdict::Skipped(NO_CHECKS));
        }
        let ptr = allocate(15);
        expect(OOB, 1, false, site(kasan_kmalloc_oob_left), INVALID, || {
            black_box(read_u8(ptr - 1));
        })?;
        heap::free(ptr);
        audit(&[15])
    }

    pub fn kasan_kmalloc_node_oob_right(_: &Context) -> Outcome {
        if !CHECKED {
            return Ok(Verdict::Skipped(NO_CHECKS));
        }
        let ptr = allocate(4096);
        expect(OOB, 1, false, site(kasan_kmalloc_node_oob_right), INVALID, || {
            black_box(read_u8(ptr + 4096));
        })?;
        heap::free(ptr);
        audit(&[4096])
    }

    pub fn kasan_kmalloc_track_caller_oob_right(_: &Context) -> Outcome {
        if !CHECKED {
            return Ok(Verdict::Skipped(NO_CHECKS));
        }
        let size = 128 - GRANULE;
        let ptr = allocate(size);
        expect(OOB, 1, true, site(kasan_kmalloc_track_caller_oob_right), INVALID, || {
            write_u8(ptr + size as u64, b'y')
        })?;
        heap::free(ptr);
        audit(&[112])
    }

    pub fn kasan_kmalloc_big_oob_right(_: &Context) -> Outcome {
        let size = KMALLOC_MAX_CACHE_SIZE - 256;
        if !CHECKED {
            return Ok(Verdict::Skipped(NO_CHECKS));
        }
        let ptr = allocate(size);
        // Linux's `ptr[size]`: the size is a multiple of the granule, so the first byte past
        // the object is the first of the trailing guard.
        let report =
            expect(OOB, 1, true, site(kasan_kmalloc_big_oob_right), INVALID, || write_u8(ptr + size as u64, 0))?;
        check_eq!(report.address, ptr + size as u64);
        heap::free(ptr);
        audit(&[size])
    }

    pub fn kasan_kmalloc_large_oob_right(_: &Context) -> Outcome {
        let size = KMALLOC_MAX_CACHE_SIZE + 10;
        if !CHECKED {
            return Ok(Verdict::Skipped(NO_CHECKS));
        }
        let ptr = allocate(size);
        expect(OOB, 1, true, site(kasan_kmalloc_large_oob_right), INVALID, || {
            write_u8(ptr + (size + OOB_TAG_OFF) as u64, 0)
        })?;
        heap::free(ptr);
        audit(&[size])
    }

    pub fn kasan_kmalloc_large_uaf(_: &Context) -> Outcome {
        let size = KMALLOC_MAX_CACHE_SIZE + 10;
        if !CHECKED {
            return Ok(Verdict::Skipped(NO_CHECKS));
        }
        let ptr = allocate(size);
        heap::free(ptr);
        expect(UAF, 1, false, site(kasan_kmalloc_large_uaf), INVALID, || {
            black_box(read_u8(ptr));
        })?;
        audit(&[size])
    }

    pub fn kasan_kmalloc_large_invalid_free(_: &Context) -> Outcome {
        let size = KMALLOC_MAX_CACHE_SIZE + 10;
        if !CHECKED {
            return Ok(Verdict::Skipped(NO_CHECKS));
        }
        let ptr = allocate(size);
        let here = site(kasan_kmalloc_large_invalid_free);
        let (count, report) = recording::scope(|| heap::free(ptr + 1));
        check_eq!(count, 1);
        let Some(report) = report else {
            return Err(fail("no report recorded"));
        };
        check!(report.bug == BugType::InvalidFree);
        check_eq!(report.address, ptr + 1);
        // The pointer's tag, and the memory tag of the object's first granule (the same).
        check_eq!(report.pointer_tag, tag_of(ptr));
        check_eq!(report.memory_tag, tag_of(ptr));
        // The object the pointer points into, allocated by this function and not freed.
        let Some(object) = report.object else {
            return Err(fail("the report names no object"));
        };
        check_eq!(object.address, ptr);
        check_eq!(object.size as usize, size);
        check!(object.alloc_task.is_some());
        check!(names(object.alloc_stack, here));
        check!(first_frame_in(object.alloc_stack, here));
        check!(object.free_task.is_none());
        let (count, _) = recording::scope(|| heap::free(ptr));
        check_eq!(count, 0);
        audit(&[size])
    }

    /// A 1-byte write at `address`, past its object's end but inside its last granule: caught
    /// with short granules (memory tag: the bytes used), SW_TAGS's documented blind spot without
    /// (checked as not caught). Linux runs these halves for generic KASAN only. Inlined: the
    /// allocation stack's first frame stays the test's.
    #[inline(always)]
    fn write_inside_last_granule(address: u64, object_size: usize, here: u64) -> Outcome {
        // The granule's last byte holds a short granule's tag: a recovered write must miss it.
        check!(address % 16 != 15);
        if kasan::SHORT_GRANULES {
            let used = object_size % GRANULE;
            let report = expect(OOB, 1, true, here, Some(used as u8), || write_u8(address, b'x'))?;
            check_eq!(report.address, address);
        } else {
            let (count, _) = recording::scope(|| write_u8(address, b'x'));
            check_eq!(count, 0);
        }
        Ok(Verdict::Passed)
    }

    /// Linux's krealloc_more_oob_helper.
    #[inline(always)]
    fn krealloc_more(size1: usize, size2: usize, here: u64) -> Outcome {
        let ptr1 = allocate(size1);
        let ptr2 = heap::reallocate(ptr1, 16, size2).expect("the heap has room");
        let (count, _) = recording::scope(|| {
            write_u8(ptr2 + size1 as u64 - 1, b'x');
            write_u8(ptr2 + size1 as u64, b'x');
            write_u8(ptr2 + size2 as u64 - 1, b'x');
        });
        check_eq!(count, 0);
        write_inside_last_granule(ptr2 + size2 as u64, size2, here)?;
        let aligned = round_up16(size2 as u64);
        let report = expect(OOB, 1, true, here, INVALID, || write_u8(ptr2 + aligned, b'x'))?;
        check_eq!(report.address, ptr2 + aligned);
        heap::free(ptr2);
        Ok(Verdict::Passed)
    }

    /// Linux's krealloc_less_oob_helper: after shrinking, the first aligned offset past the new
    /// size, the middle between the sizes, the old size's last byte and the old size itself
    /// (218, 234 and 235 for 235 -> 201) are each reported where they are written.
    #[inline(always)]
    fn krealloc_less(size1: usize, size2: usize, here: u64) -> Outcome {
        let middle = size2 + (size1 - size2) / 2;
        // Linux's own precondition: new size, middle and old size lie in separate granules.
        check!(round_up16(size2 as u64) <= middle as u64 & !15);
        check!(round_up16(middle as u64) <= size1 as u64 & !15);
        let ptr1 = allocate(size1);
        let ptr2 = heap::reallocate(ptr1, 16, size2).expect("the heap has room");
        let (count, _) = recording::scope(|| write_u8(ptr2 + size2 as u64 - 1, b'x'));
        check_eq!(count, 0);
        write_inside_last_granule(ptr2 + size2 as u64, size2, here)?;
        write_inside_last_granule(ptr2 + size2 as u64 + 2, size2, here)?;
        let aligned = round_up16(size2 as u64);
        for offset in [aligned, middle as u64, size1 as u64 - 1, size1 as u64] {
            let report = expect(OOB, 1, true, here, INVALID, || write_u8(ptr2 + offset, b'x'))?;
            check_eq!(report.address, ptr2 + offset);
        }
        heap::free(ptr2);
        Ok(Verdict::Passed)
    }

    pub fn kasan_krealloc_more_oob(_: &Context) -> Outcome {
        if !CHECKED {
            return Ok(Verdict::Skipped(NO_CHECKS));
        }
        krealloc_more(201, 235, site(kasan_krealloc_more_oob))?;
        audit(&[201, 235])
    }

    pub fn kasan_krealloc_less_oob(_: &Context) -> Outcome {
        if !CHECKED {
            return Ok(Verdict::Skipped(NO_CHECKS));
        }
        // Linux's sizes: middle 218, size1 235.
        check_eq!(201 + (235 - 201) / 2, 218);
        krealloc_less(235, 201, site(kasan_krealloc_less_oob))?;
        audit(&[201, 235])
    }

    pub fn kasan_krealloc_large_more_oob(_: &Context) -> Outcome {
        let (size1, size2) = (KMALLOC_MAX_CACHE_SIZE + 201, KMALLOC_MAX_CACHE_SIZE + 235);
        if !CHECKED {
            return Ok(Verdict::Skipped(NO_CHECKS));
        }
        krealloc_more(size1, size2, site(kasan_krealloc_large_more_oob))?;
        audit(&[size1, size2])
    }

    pub fn kasan_krealloc_large_less_oob(_: &Context) -> Outcome {
        let (size1, size2) = (KMALLOC_MAX_CACHE_SIZE + 235, KMALLOC_MAX_CACHE_SIZE + 201);
        if !CHECKED {
            return Ok(Verdict::Skipped(NO_CHECKS));
        }
        krealloc_less(size1, size2, site(kasan_krealloc_large_less_oob))?;
        audit(&[size1, size2])
    }

    pub fn kasan_krealloc_uaf(_: &Context) -> Outcome {
        if !CHECKED {
            return Ok(Verdict::Skipped(NO_CHECKS));
        }
        let (size1, size2) = (201, 19);
        let ptr1 = allocate(size1);
        heap::free(ptr1);
        let here = site(kasan_krealloc_uaf);
        let mut ptr2 = Some(0);
        let report = expect(UAF, 1, false, here, INVALID, || ptr2 = heap::reallocate(ptr1, 16, size2))?;
        check!(ptr2.is_none());
        check_eq!(report.address, ptr1);
        expect(UAF, 1, false, here, INVALID, || {
            black_box(read_u8(ptr1));
        })?;
        audit(&[201, 19])
    }

    pub fn kasan_kmalloc_oob_16(_: &Context) -> Outcome {
        if !CHECKED {
            return Ok(Verdict::Skipped(NO_CHECKS));
        }
        // Linux runs this one for generic KASAN only: a 16-byte copy into a 13-byte object
        // stays in its last granule, caught with short granules only (checked as such in each
        // build); then the use-after-free of the source.
        let ptr1 = allocate(16 - 3);
        let ptr2 = allocate(16);
        let here = site(kasan_kmalloc_oob_16);
        if kasan::SHORT_GRANULES {
            let report = expect(OOB, 16, true, here, Some(13), || memcpy(ptr1, ptr2, 16))?;
            check_eq!(report.address, ptr1);
        } else {
            let (count, _) = recording::scope(|| memcpy(ptr1, ptr2, 16));
            check_eq!(count, 0);
        }
        heap::free(ptr2);
        let report = expect(UAF, 16, false, here, INVALID, || {
            black_box(read_u128(ptr2));
        })?;
        check_eq!(report.address, ptr2);
        heap::free(ptr1);
        audit(&[13, 16])
    }

    pub fn kasan_kmalloc_uaf_16(_: &Context) -> Outcome {
        if !CHECKED {
            return Ok(Verdict::Skipped(NO_CHECKS));
        }
        let ptr1 = allocate(16);
        let ptr2 = allocate(16);
        heap::free(ptr2);
        expect(UAF, 16, false, site(kasan_kmalloc_uaf_16), INVALID, || {
            let value = read_u128(ptr2);
            // SAFETY: ptr1 is a live 16-byte object.
            unsafe { (ptr1 as *mut u128).write_volatile(value) };
        })?;
        heap::free(ptr1);
        audit(&[16])
    }

    pub fn kasan_kmalloc_oob_in_memset(_: &Context) -> Outcome {
        if !CHECKED {
            return Ok(Verdict::Skipped(NO_CHECKS));
        }
        let size = 128 - GRANULE;
        let ptr = allocate(size);
        let report = expect(OOB, (size + GRANULE) as u64, true, site(kasan_kmalloc_oob_in_memset), INVALID, || {
            memset(ptr, 0, size + GRANULE)
        })?;
        check!(reported_range(report.address, ptr, (size + GRANULE) as u64));
        heap::free(ptr);
        audit(&[112])
    }

    /// Linux's kmalloc_oob_memset_N: `memset(ptr + size - (N - 1), 0, N)` on 112 bytes. Inlined:
    /// the allocation stack's first frame is the test's.
    #[inline(always)]
    fn oob_memset(count: usize, here: u64) -> Outcome {
        let size = 128 - GRANULE;
        let ptr = allocate(size);
        let start = ptr + (size - (count - 1)) as u64;
        let report = expect(OOB, count as u64, true, here, INVALID, || memset(start, 0, count))?;
        check!(reported_range(report.address, start, count as u64));
        heap::free(ptr);
        Ok(Verdict::Passed)
    }

    pub fn kasan_kmalloc_oob_memset_2(_: &Context) -> Outcome {
        if !CHECKED {
            return Ok(Verdict::Skipped(NO_CHECKS));
        }
        oob_memset(2, site(kasan_kmalloc_oob_memset_2))?;
        audit(&[112])
    }

    pub fn kasan_kmalloc_oob_memset_4(_: &Context) -> Outcome {
        if !CHECKED {
            return Ok(Verdict::Skipped(NO_CHECKS));
        }
        oob_memset(4, site(kasan_kmalloc_oob_memset_4))?;
        audit(&[112])
    }

    pub fn kasan_kmalloc_oob_memset_8(_: &Context) -> Outcome {
        if !CHECKED {
            return Ok(Verdict::Skipped(NO_CHECKS));
        }
        oob_memset(8, site(kasan_kmalloc_oob_memset_8))?;
        audit(&[112])
    }

    pub fn kasan_kmalloc_oob_memset_16(_: &Context) -> Outcome {
        if !CHECKED {
            return Ok(Verdict::Skipped(NO_CHECKS));
        }
        oob_memset(16, site(kasan_kmalloc_oob_memset_16))?;
        audit(&[112])
    }

    pub fn kasan_kmalloc_memmove_negative_size(_: &Context) -> Outcome {
        if !CHECKED {
            return Ok(Verdict::Skipped(NO_CHECKS));
        }
        if HARDWARE_TAGS {
            return Ok(Verdict::Skipped(NO_RANGE_CHECK));
        }
        let size = 64;
        let ptr = allocate(size);
        memset(ptr, 0, size);
        let invalid_size = (-2isize) as usize;
        let report = expect(OOB, invalid_size as u64, false, site(kasan_kmalloc_memmove_negative_size), None, || {
            memmove(ptr, ptr + 4, invalid_size)
        })?;
        check!(reported_range(report.address, ptr + 4, size as u64));
        heap::free(ptr);
        audit(&[64])
    }

    pub fn kasan_kmalloc_memmove_invalid_size(_: &Context) -> Outcome {
        if !CHECKED {
            return Ok(Verdict::Skipped(NO_CHECKS));
        }
        let size = 64;
        let ptr = allocate(size);
        memset(ptr, 0, size);
        let report = expect(OOB, size as u64, false, site(kasan_kmalloc_memmove_invalid_size), INVALID, || {
            memmove(ptr, ptr + 4, size)
        })?;
        check!(reported_range(report.address, ptr + 4, size as u64));
        heap::free(ptr);
        audit(&[64])
    }

    pub fn kasan_kmalloc_uaf(_: &Context) -> Outcome {
        if !CHECKED {
            return Ok(Verdict::Skipped(NO_CHECKS));
        }
        let ptr = allocate(10);
        heap::free(ptr);
        expect(UAF, 1, false, site(kasan_kmalloc_uaf), INVALID, || {
            black_box(read_u8(ptr + 8));
        })?;
        audit(&[10])
    }

    pub fn kasan_kmalloc_uaf_memset(_: &Context) -> Outcome {
        if !CHECKED {
            return Ok(Verdict::Skipped(NO_CHECKS));
        }
        let size = 33;
        let ptr = allocate(size);
        heap::free(ptr);
        let report = expect(UAF, size as u64, true, site(kasan_kmalloc_uaf_memset), INVALID, || memset(ptr, 0, size))?;
        check_eq!(report.address, ptr);
        audit(&[33])
    }

    pub fn kasan_kmalloc_uaf2(_: &Context) -> Outcome {
        if !CHECKED {
            return Ok(Verdict::Skipped(NO_CHECKS));
        }
        let size = 43;
        let ptr1 = allocate(size);
        heap::free(ptr1);
        let mut ptr2 = allocate(size);
        // Linux retries on a tag collision too (a collision is not caught).
        let mut tries = 0;
        while tag_of(ptr2) == tag_of(ptr1) && tries < 8 {
            heap::free(ptr2);
            ptr2 = allocate(size);
            tries += 1;
        }
        check!(ptr1 != ptr2);
        // Byte 40 lies in the last granule, short (11 bytes used) with short granules.
        let reused_tag = if kasan::SHORT_GRANULES { (size % GRANULE) as u8 } else { tag_of(ptr2) };
        let memory_tag = if untagged(ptr1) == untagged(ptr2) { Some(reused_tag) } else { INVALID };
        let report = expect(UAF, 1, false, site(kasan_kmalloc_uaf2), memory_tag, || {
            black_box(read_u8(ptr1 + 40));
        })?;
        check_eq!(report.object.map_or(0, |object| object.address), ptr1);
        heap::free(ptr2);
        audit(&[43])
    }

    pub fn kasan_kmalloc_uaf3(_: &Context) -> Outcome {
        if !CHECKED {
            return Ok(Verdict::Skipped(NO_CHECKS));
        }
        let size = 100;
        let ptr1 = allocate(size);
        heap::free(ptr1);
        let ptr2 = allocate(size);
        heap::free(ptr2);
        expect(UAF, 1, false, site(kasan_kmalloc_uaf3), INVALID, || {
            black_box(read_u8(ptr1 + 8));
        })?;
        audit(&[100])
    }

    pub fn kasan_kmalloc_double_kzfree(_: &Context) -> Outcome {
        if !CHECKED {
            return Ok(Verdict::Skipped(NO_CHECKS));
        }
        let ptr = allocate(16);
        // kfree_sensitive: zero, then free.
        memset(ptr, 0, 16);
        heap::free(ptr);
        let (count, report) = recording::scope(|| {
            heap::free(ptr);
        });
        check_eq!(count, 1);
        let Some(report) = report else {
            return Err(fail("no report recorded"));
        };
        check!(report.bug == BugType::DoubleFree);
        check_eq!(report.address, ptr);
        check_eq!(report.pointer_tag, tag_of(ptr));
        check_eq!(report.memory_tag, Tags::INVALID);
        let here = site(kasan_kmalloc_double_kzfree);
        check!(
            report.object.is_some_and(
                |object| first_frame_in(object.alloc_stack, here) && first_frame_in(object.free_stack, here)
            )
        );
        audit(&[16])
    }

    pub fn kasan_atomics(_: &Context) -> Outcome {
        if !CHECKED {
            return Ok(Verdict::Skipped(NO_CHECKS));
        }
        let a1 = allocate(48);
        let a2 = allocate(8);
        let here = site(kasan_atomics);
        // Out of bounds of a1 (its first granule past the end) and, after free, of a2.
        for (target, bug) in [(a1 + 48, OOB), (a2, UAF)] {
            if bug == UAF {
                heap::free(a2);
            }
            // SAFETY: deliberately a bad word (heap memory, mapped, aligned): every atomic
            // access to it must be reported.
            let word = unsafe { &*(target as *const AtomicU32) };
            // SAFETY: the same word, 8-byte aligned (a1 + 48 and a2 are granule-aligned).
            let wide = unsafe { &*(target as *const AtomicU64) };
            expect(bug, 4, false, here, INVALID, || {
                black_box(word.load(Ordering::SeqCst));
            })?;
            expect(bug, 4, true, here, INVALID, || word.store(42, Ordering::SeqCst))?;
            expect(bug, 4, true, here, INVALID, || {
                black_box(word.swap(42, Ordering::SeqCst));
            })?;
            expect(bug, 4, true, here, INVALID, || {
                black_box(word.compare_exchange(21, 42, Ordering::SeqCst, Ordering::SeqCst)).ok();
            })?;
            expect(bug, 4, true, here, INVALID, || {
                black_box(word.fetch_add(1, Ordering::SeqCst));
            })?;
            expect(bug, 4, true, here, INVALID, || {
                black_box(word.fetch_sub(1, Ordering::SeqCst));
            })?;
            expect(bug, 8, true, here, INVALID, || {
                black_box(wide.fetch_and(0xff, Ordering::SeqCst));
            })?;
            expect(bug, 8, true, here, INVALID, || {
                black_box(wide.fetch_or(0xff, Ordering::SeqCst));
            })?;
            expect(bug, 8, true, here, INVALID, || {
                black_box(wide.fetch_xor(0xff, Ordering::SeqCst));
            })?;
        }
        heap::free(a1);
        audit(&[48, 8])
    }

    pub fn kasan_memchr(_: &Context) -> Outcome {
        if !CHECKED {
            return Ok(Verdict::Skipped(NO_CHECKS));
        }
        // Linux: 24 bytes, rounded up to OOB_TAG_OFF (32); memchr over size + 1.
        let size = round_up16(24) as usize;
        let ptr = allocate(size);
        memset(ptr, 0, size);
        let report = expect(OOB, 1, false, site(kasan_memchr), INVALID, || {
            black_box(memchr(ptr, b'1', size + 1));
        })?;
        check_eq!(report.address, ptr + size as u64);
        heap::free(ptr);
        audit(&[32])
    }

    /// A byte-wise memchr (the kernel has no C string library; Rust's slice search would read
    /// whole words and report another access size than Linux's byte-wise test).
    #[inline(never)]
    fn memchr(address: u64, byte: u8, count: usize) -> Option<usize> {
        (0..count).find(|&index| read_u8(address + index as u64) == byte)
    }

    #[inline(never)]
    fn memcmp(left: u64, right: u64, count: usize) -> i32 {
        for index in 0..count as u64 {
            let (a, b) = (read_u8(left + index), read_u8(right + index));
            if a != b {
                return a as i32 - b as i32;
            }
        }
        0
    }

    #[inline(never)]
    fn strlen(address: u64) -> usize {
        let mut length = 0;
        while read_u8(address + length as u64) != 0 {
            length += 1;
        }
        length
    }

    pub fn kasan_memcmp(_: &Context) -> Outcome {
        if !CHECKED {
            return Ok(Verdict::Skipped(NO_CHECKS));
        }
        let size = round_up16(24) as usize;
        let ptr = allocate(size);
        let arr = [0u8; 33];
        memset(ptr, 0, size);
        let report = expect(OOB, 1, false, site(kasan_memcmp), INVALID, || {
            black_box(memcmp(ptr, arr.as_ptr() as u64, size + 1));
        })?;
        check_eq!(report.address, ptr + size as u64);
        heap::free(ptr);
        audit(&[32])
    }

    pub fn kasan_strings(_: &Context) -> Outcome {
        if !CHECKED {
            return Ok(Verdict::Skipped(NO_CHECKS));
        }
        let size = 128;
        let ptr = allocate(size);
        memset(ptr, 0, size);
        write_u8(ptr, b'a');
        heap::free(ptr);
        let here = site(kasan_strings);
        let other = b"abc\0";
        // strlen, strchr, strcmp on the freed string. strlen goes on reading the freed bytes
        // (recover mode), one report each up to the first zero (freed memory keeps no promise
        // about its contents: at most the 128 bytes up to the terminator).
        let report = expect_reports(Expect { bug: UAF, size: 1, write: false, site: here }, 1..=128, || {
            black_box(strlen(ptr));
        })?;
        check!(untagged(report.address) >= untagged(ptr) && untagged(report.address) < untagged(ptr) + 128);
        expect(UAF, 1, false, here, INVALID, || {
            black_box(memchr(ptr, b'z', 1));
        })?;
        expect(UAF, 1, false, here, INVALID, || {
            black_box(memcmp(ptr, other.as_ptr() as u64, 1));
        })?;
        audit(&[128])
    }

    pub fn kasan_bitops_tags(_: &Context) -> Outcome {
        if !CHECKED {
            return Ok(Verdict::Skipped(NO_CHECKS));
        }
        // Linux: 48 zeroed bytes, bit ops at bits + 48 with nr = BITS_PER_LONG (the word at
        // bits + 56) and nr = BITS_PER_LONG + BITS_PER_BYTE (the same word).
        let bits = allocate(48);
        memset(bits, 0, 48);
        let here = site(kasan_bitops_tags);
        for nr in [64u64, 72] {
            let word_address = bits + 48 + (nr / 64) * 8;
            let mask = 1u64 << (nr % 64);
            // SAFETY: a deliberately out-of-bounds, aligned word of heap memory.
            let word = unsafe { &*(word_address as *const AtomicU64) };
            expect(OOB, 8, true, here, INVALID, || {
                black_box(word.fetch_or(mask, Ordering::SeqCst)); // set_bit
            })?;
            expect(OOB, 8, true, here, INVALID, || {
                black_box(word.fetch_and(!mask, Ordering::SeqCst)); // clear_bit
            })?;
            expect(OOB, 8, true, here, INVALID, || {
                black_box(word.fetch_xor(mask, Ordering::SeqCst)); // change_bit
            })?;
            expect(OOB, 8, false, here, INVALID, || {
                black_box(word.load(Ordering::Relaxed) & mask != 0); // test_bit
            })?;
        }
        heap::free(bits);
        audit(&[48])
    }

    pub fn kasan_match_all_not_assigned(_: &Context) -> Outcome {
        if !CHECKED {
            return Ok(Verdict::Skipped(NO_CHECKS));
        }
        // No object ever gets the match-all tag (or the invalid one).
        for index in 0..1000 {
            let size = 1 + index % 1024;
            let ptr = allocate(size);
            let tag = tag_of(ptr);
            heap::free(ptr);
            check!(Tags::is_object_tag(tag));
        }
        audit(&[1024])
    }

    pub fn kasan_match_all_ptr_tag(_: &Context) -> Outcome {
        if !CHECKED {
            return Ok(Verdict::Skipped(NO_CHECKS));
        }
        let ptr = allocate(128);
        let tag = tag_of(ptr);
        // The match-all pointer tag accesses anything.
        let (count, _) = recording::scope(|| {
            write_u8(with_tag(ptr, Tags::MATCH_ALL), 0);
            black_box(read_u8(with_tag(ptr, Tags::MATCH_ALL)));
        });
        check_eq!(count, 0);
        // Every other tag is reported (one in 16 of the object tags, and the invalid tag).
        for other in (Tags::FIRST_OBJECT_TAG..=Tags::LAST_OBJECT_TAG).step_by(16).chain([Tags::INVALID]) {
            if other == tag {
                continue;
            }
            let (count, report) = recording::scope(|| write_u8(with_tag(ptr, other), 0));
            check_eq!(count, 1);
            check!(report.is_some_and(|report| report.pointer_tag == other && report.memory_tag == tag));
        }
        heap::free(ptr);
        audit(&[128])
    }

    /// The memory tags Linux's `match_all_mem_tag` gives the object's first granule in turn:
    /// every value from the least tag its generator draws to the match-all 0xFF, and under
    /// SW_TAGS, to keep the reports few, only the first and last eight (0x00-0x07 and
    /// 0xF8-0xFF: Linux's SW_TAGS draws from 0x00). The shadow's generator draws from 0x10
    /// (0x01-0x0F are short-granule lengths), so its own first eight, 0x10-0x17, come too. With
    /// MTE, HW_TAGS' range: 0xF0-0xFF, all sixteen.
    fn mem_tags_to_try() -> Vec<u8> {
        if HARDWARE_TAGS {
            (Tags::FIRST_OBJECT_TAG..=0xff).collect()
        } else {
            (0x00..=0x07).chain(Tags::FIRST_OBJECT_TAG..Tags::FIRST_OBJECT_TAG + 8).chain(0xf8..=0xff).collect()
        }
    }

    pub fn kasan_match_all_mem_tag(_: &Context) -> Outcome {
        if !CHECKED {
            return Ok(Verdict::Skipped(NO_CHECKS));
        }
        // No memory tag is match-all: whatever tag the first granule carries but the pointer's,
        // a write through the pointer is reported with that memory tag.
        let ptr = allocate(128);
        let tag = tag_of(ptr);
        check!(tag != Tags::MATCH_ALL);
        // A short granule's length (0x01-0x0F) is checked against the tag in the granule's last
        // byte (the object's byte 15 here): keep that byte unlike any pointer tag.
        write_u8(ptr + 15, 0);
        let here = site(kasan_match_all_mem_tag);
        let mut tried = 0;
        for memory_tag in mem_tags_to_try().into_iter().filter(|&memory_tag| memory_tag != tag) {
            Tags::set_range_tag(ptr, 16, memory_tag);
            let report = expect(OOB, 1, true, here, Some(memory_tag), || write_u8(ptr, 0));
            Tags::set_range_tag(ptr, 16, tag);
            check_eq!(report?.pointer_tag, tag);
            tried += 1;
        }
        check!(tried >= if HARDWARE_TAGS { 15 } else { 23 });
        heap::free(ptr);
        audit(&[128])
    }

    #[allow(clippy::same_item_push, reason = "Linux's shape: the Vec grows push by push, reallocated as it goes")]
    pub fn kasan_rust_uaf(_: &Context) -> Outcome {
        if !CHECKED {
            return Ok(Verdict::Skipped(NO_CHECKS));
        }
        // Linux's kasan_test_rust.rs: a Vec grown by 4096 pushes, a pointer to its element 2048,
        // the Vec dropped, the element read.
        let mut numbers: Vec<u8> = Vec::new();
        for _ in 0..4096 {
            numbers.push(0x42);
        }
        let address = core::ptr::addr_of_mut!(numbers[2048]) as u64;
        let buffer = numbers.as_ptr() as u64;
        drop(black_box(numbers));
        let expect_site = site(kasan_rust_uaf);
        let report = expect_report(Expect { bug: UAF, size: 1, write: false, site: expect_site }, || {
            black_box(read_u8(address));
        })?;
        check_eq!(report.address, address);
        check_eq!(report.memory_tag, Tags::INVALID);
        check_eq!(report.object.map_or(0, |object| untagged(object.address)), untagged(buffer));
        audit(&[4096])
    }
}
