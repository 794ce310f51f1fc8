//! The sanitizer heap's bug corpus, modelled on Linux's KASAN unit tests (kasan_test_c.c): each
//! case provokes one bug in recover mode and checks the report (bug type, access size,
//! direction, and that the alloc and free stacks name the function that allocated and freed).
//!
//! Access checks exist only in the `full` build: the corpus skips elsewhere. The free-path checks
//! (double and invalid free) belong to the allocator and run in every build. Cases that SW_TAGS
//! cannot catch (an overflow inside the last granule, a tag collision) are checked as not caught.
//! Recover mode lets each bad access the compiler checked happen (the runtime's intrinsics do
//! not carry out a reported one): bad writes within a granule of an object land in the guard
//! granules around it (heap.rs), never in a header or a free-list link; the `kasan_sound_*`
//! cases prove it, and that the heap still works after each.

use super::{Context, Failure, Outcome, Test, Verdict, check, check_eq, fail};
use crate::mm::kasan::heap::{self, Stacks};
use crate::mm::kasan::report::{self, BugType, Report};
use crate::mm::kasan::storage::{TagStorage, Tags, tag_of, untagged, with_tag};
use crate::mm::kasan::{self, CHECKS_COMPILED_IN};
use alloc::boxed::Box;
use alloc::string::String;
use alloc::vec::Vec;
use core::hint::black_box;

pub const TESTS: &[Test] = &[
    Test { name: "kasan_tag_generator", run: kasan_tag_generator },
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
];

const NO_CHECKS: &str = "no compiler tag checks in this build (only `full` has kernel-hwaddress)";

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
fn read_u64(address: u64) -> u64 {
    // SAFETY: as in read_u8.
    unsafe { (address as *const u64).read_volatile() }
}

#[inline(never)]
fn write_u64(address: u64, value: u64) {
    // SAFETY: as in write_u8.
    unsafe { (address as *mut u64).write_volatile(value) }
}

fn allocate(size: usize) -> u64 {
    heap::allocate(size, 16).expect("the heap has room")
}

/// Whether a saved stack names `function` (one of its frames lies in it).
fn names(stack: u32, function: u64) -> bool {
    let mut buffer = [0; stackdepot::MAX_FRAMES];
    report::saved_frames(stack, &mut buffer).iter().any(|&address| {
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
    let (count, report) = kasan::recording(bug);
    check_eq!(count, 1);
    let Some(report) = report else {
        return Err(fail("no report recorded"));
    };
    check!(report.bug == expect.bug);
    check_eq!(report.size, expect.size);
    check!(report.write == expect.write);
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
    check_eq!(seen.iter().filter(|seen| **seen).count(), 238);
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
        let untagged = untagged(*object);
        for granule in (0..(1 + index as u64 * 37)).step_by(16) {
            check_eq!(Tags::memory_tag(untagged + granule), tag);
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
    let (count, _) = kasan::recording(|| {
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
    if !CHECKS_COMPILED_IN {
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
    if !CHECKS_COMPILED_IN {
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
    if !CHECKS_COMPILED_IN {
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
    if !CHECKS_COMPILED_IN {
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
    if !CHECKS_COMPILED_IN {
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
    if !CHECKS_COMPILED_IN {
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
    if !CHECKS_COMPILED_IN {
        return Ok(Verdict::Skipped(NO_CHECKS));
    }
    // 160 bytes in a 256-byte block (header, guard, object, trailing guard): 192 still fits.
    let object = allocate(160);
    let grown = heap::reallocate(object, 16, 192).expect("the heap has room");
    check_eq!(grown, object);
    // The last byte of the new size is fine, the next one (the trailing guard) is not.
    let (count, _) = kasan::recording(|| write_u8(grown + 191, 1));
    check_eq!(count, 0);
    let expect = Expect { bug: BugType::OutOfBounds, size: 1, write: true, site: site(kasan_realloc_grow_oob) };
    expect_report(expect, || write_u8(grown + 192, 1))?;
    heap::free(grown);
    Ok(Verdict::Passed)
}

fn kasan_realloc_shrink_oob(_: &Context) -> Outcome {
    if !CHECKS_COMPILED_IN {
        return Ok(Verdict::Skipped(NO_CHECKS));
    }
    let object = allocate(240);
    let shrunk = heap::reallocate(object, 16, 192).expect("the heap has room");
    let (count, _) = kasan::recording(|| {
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
    if !CHECKS_COMPILED_IN {
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
    if !CHECKS_COMPILED_IN {
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
    if !CHECKS_COMPILED_IN {
        return Ok(Verdict::Skipped(NO_CHECKS));
    }
    let object = allocate(20);
    heap::free(object);
    let expect = Expect { bug: BugType::UseAfterFree, size: 1, write: true, site: site(kasan_uaf_write) };
    expect_report(expect, || write_u8(object + 19, 7))?;
    Ok(Verdict::Passed)
}

fn kasan_uaf_after_reuse(_: &Context) -> Outcome {
    if !CHECKS_COMPILED_IN {
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
    let (count, report) = kasan::recording(|| heap::free(object));
    check_eq!(count, 1);
    let Some(report) = report else {
        return Err(fail("no report recorded"));
    };
    check!(report.bug == BugType::DoubleFree);
    check_eq!(report.address, object);
    // Stacks need frame pointers and the function table (builds `full` and `prod`).
    if crate::SHADOW_CALL_STACK {
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
    let other_tag = if tag_of(object) == Tags::LAST_OBJECT_TAG { Tags::FIRST_OBJECT_TAG } else { tag_of(object) + 1 };
    for bad in [object + 16, with_tag(object, other_tag), &NOT_HEAP as *const u64 as u64, object + 1] {
        let (count, report) = kasan::recording(|| heap::free(bad));
        check_eq!(count, 1);
        check!(report.is_some_and(|report| report.bug == BugType::InvalidFree && report.address == bad));
    }
    // None of them freed the object: it is still live and its real free works.
    check_eq!(Tags::memory_tag(untagged(object)), tag_of(object));
    let (count, _) = kasan::recording(|| heap::free(object));
    check_eq!(count, 0);
    Ok(Verdict::Passed)
}

fn kasan_memset_oob(_: &Context) -> Outcome {
    if !CHECKS_COMPILED_IN {
        return Ok(Verdict::Skipped(NO_CHECKS));
    }
    let object = allocate(64);
    let expect = Expect { bug: BugType::OutOfBounds, size: 32, write: true, site: site(kasan_memset_oob) };
    let report = expect_report(expect, || {
        // SAFETY: deliberately straddles the object's end (the granules after it are heap
        // memory, mapped): the sanitizer must report it.
        unsafe { core::ptr::write_bytes((object + 48) as *mut u8, 0xaa, black_box(32)) }
    })?;
    check_eq!(report.address, object + 48);
    heap::free(object);
    Ok(Verdict::Passed)
}

fn kasan_memcpy_oob(_: &Context) -> Outcome {
    if !CHECKS_COMPILED_IN {
        return Ok(Verdict::Skipped(NO_CHECKS));
    }
    let object = allocate(64);
    let mut destination = [0u8; 64];
    let expect = Expect { bug: BugType::OutOfBounds, size: 40, write: false, site: site(kasan_memcpy_oob) };
    let report = expect_report(expect, || {
        // SAFETY: the source deliberately straddles the object's end (see kasan_memset_oob).
        unsafe { core::ptr::copy_nonoverlapping((object + 32) as *const u8, destination.as_mut_ptr(), black_box(40)) }
    })?;
    check_eq!(report.address, object + 32);
    black_box(&destination);
    heap::free(object);
    Ok(Verdict::Passed)
}

fn kasan_memmove_oob(_: &Context) -> Outcome {
    if !CHECKS_COMPILED_IN {
        return Ok(Verdict::Skipped(NO_CHECKS));
    }
    let object = allocate(64);
    let expect = Expect { bug: BugType::OutOfBounds, size: 32, write: true, site: site(kasan_memmove_oob) };
    let report = expect_report(expect, || {
        // SAFETY: the overlapping destination deliberately straddles the object's end.
        unsafe { core::ptr::copy(object as *const u8, (object + 40) as *mut u8, black_box(32)) }
    })?;
    check_eq!(report.address, object + 40);
    heap::free(object);
    Ok(Verdict::Passed)
}

fn kasan_box_oob_and_uaf(_: &Context) -> Outcome {
    if !CHECKS_COMPILED_IN {
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
    if !CHECKS_COMPILED_IN {
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
    if !CHECKS_COMPILED_IN {
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
    if !crate::SHADOW_CALL_STACK {
        return Ok(Verdict::Skipped("stacks need frame pointers and the shadow call stack (builds full, prod)"));
    }
    let site = site(kasan_stack_modes);
    let mut result = Ok(Verdict::Passed);
    for mode in Stacks::ALL {
        heap::set_stacks(mode);
        let object = allocate(24);
        heap::free(object);
        let (Some(allocated), Some(freed)) = (heap::newest_entry(object, false), heap::newest_entry(object, true))
        else {
            result = Err(fail("no ring entries for the object"));
            break;
        };
        let depot = !matches!(mode, Stacks::None | Stacks::FramePointerNoDepot | Stacks::ShadowCallStackNoDepot);
        let saved = allocated.stack != 0 && freed.stack != 0;
        let named = names(allocated.stack, site) && names(freed.stack, site);
        if saved != depot || (depot && !named) {
            defmt::error!("  stack mode {=str}: saved {=bool}, names the test {=bool}", mode.name(), saved, named);
            result = Err(fail("stacks not saved as the mode says"));
            break;
        }
    }
    heap::set_stacks(Stacks::FramePointer);
    result
}

fn kasan_not_caught_inside_last_granule(_: &Context) -> Outcome {
    if !CHECKS_COMPILED_IN {
        return Ok(Verdict::Skipped(NO_CHECKS));
    }
    // 13 bytes occupy one granule; bytes 13-15 carry the object's tag too (no short granules).
    let object = allocate(13);
    let (count, _) = kasan::recording(|| {
        for offset in 13..16 {
            write_u8(object + offset, 1);
        }
    });
    check_eq!(count, 0);
    // The next granule is caught.
    let (count, _) = kasan::recording(|| {
        black_box(read_u8(object + 16));
    });
    check_eq!(count, 1);
    heap::free(object);
    Ok(Verdict::Passed)
}

fn kasan_not_caught_tag_collision(_: &Context) -> Outcome {
    if !CHECKS_COMPILED_IN {
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
    let (count, _) = kasan::recording(|| write_u64(stray, 1));
    check_eq!(count, 0);
    for object in held.into_iter().chain([first, twin]) {
        heap::free(object);
    }
    Ok(Verdict::Passed)
}

/// Allocates and frees 64 objects of each size, writing and reading them whole, and checks that
/// nothing was reported: the heap a recovered bug left behind still works.
fn churn(sizes: &[usize]) -> Outcome {
    let (count, _) = kasan::recording(|| {
        for &size in sizes {
            let mut objects = [0u64; 64];
            for (index, object) in objects.iter_mut().enumerate() {
                *object = allocate(size);
                for offset in 0..size as u64 {
                    write_u8(*object + offset, index as u8);
                }
            }
            for (index, object) in objects.iter().enumerate() {
                for offset in 0..size as u64 {
                    if read_u8(*object + offset) != index as u8 {
                        // An object overlapping another: count it as a report.
                        write_u8(*object + size as u64 + 16, 0);
                    }
                }
            }
            for object in objects {
                heap::free(object);
            }
        }
    });
    check_eq!(count, 0);
    Ok(Verdict::Passed)
}

fn kasan_sound_memmove_negative_size(_: &Context) -> Outcome {
    if !CHECKS_COMPILED_IN {
        return Ok(Verdict::Skipped(NO_CHECKS));
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
    let (count, _) = kasan::recording(|| heap::free(object));
    check_eq!(count, 0);
    churn(&[48, 64, 80])
}

fn kasan_sound_intrinsic_not_carried_out(_: &Context) -> Outcome {
    if !CHECKS_COMPILED_IN {
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
    check_eq!(unsafe { (past as *const u64).read_volatile() }, before);
    check!(read_u8(object + 104) != 0xaa || read_u8(object + 111) != 0xaa);
    heap::free(object);
    Ok(Verdict::Passed)
}

fn kasan_sound_overflow_spares_metadata(_: &Context) -> Outcome {
    if !CHECKS_COMPILED_IN {
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
        let (count, _) = kasan::recording(|| {
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
    if !CHECKS_COMPILED_IN {
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
    let (count, report) = kasan::recording(|| heap::free(object));
    check_eq!(count, 1);
    check!(report.is_some_and(|report| report.bug == BugType::DoubleFree && report.address == object));
    heap::free(neighbour);
    Ok(Verdict::Passed)
}

fn kasan_sound_match_all_free_realloc(_: &Context) -> Outcome {
    // An untagged kernel pointer carries 0xFF, which every access accepts: free and realloc do.
    let object = allocate(40);
    let (count, _) = kasan::recording(|| heap::free(with_tag(object, Tags::MATCH_ALL)));
    check_eq!(count, 0);
    check_eq!(Tags::memory_tag(untagged(object)), Tags::INVALID);
    let again = allocate(40);
    let mut grown = None;
    let (count, _) = kasan::recording(|| grown = heap::reallocate(with_tag(again, Tags::MATCH_ALL), 16, 64));
    check_eq!(count, 0);
    let Some(grown) = grown else {
        return Err(fail("realloc of a match-all pointer returned null"));
    };
    check!(Tags::is_object_tag(tag_of(grown)));
    let moved = heap::reallocate(with_tag(grown, Tags::MATCH_ALL), 16, 4000).expect("the heap has room");
    check_eq!(Tags::memory_tag(untagged(grown)), Tags::INVALID);
    let (count, _) = kasan::recording(|| heap::free(moved));
    check_eq!(count, 0);
    Ok(Verdict::Passed)
}

fn kasan_sound_prefers_live_object(_: &Context) -> Outcome {
    if !CHECKS_COMPILED_IN {
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
    let (count, report) = kasan::recording(|| {
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
    if CHECKS_COMPILED_IN {
        let site = site(kasan_sound_zero_size);
        expect_report(Expect { bug: BugType::OutOfBounds, size: 1, write: false, site }, || {
            black_box(read_u8(object));
        })?;
    }
    let (count, _) = kasan::recording(|| heap::free(object));
    check_eq!(count, 0);
    let (count, report) = kasan::recording(|| heap::free(object));
    check_eq!(count, 1);
    check!(report.is_some_and(|report| report.bug == BugType::DoubleFree));
    Ok(Verdict::Passed)
}

fn kasan_sound_bad_frees(_: &Context) -> Outcome {
    // Never allocated (inside a free block), interior, wrong tag, unaligned, out of the heap,
    // just below the heap, at the heap's end: each reported as an invalid free, nothing freed.
    let object = allocate(64);
    let big = allocate(8000);
    heap::free(big);
    let (start, end) = heap::range();
    let other_tag = if tag_of(object) == Tags::LAST_OBJECT_TAG { Tags::FIRST_OBJECT_TAG } else { tag_of(object) + 1 };
    let bad = [
        with_tag(untagged(big) + 1024, tag_of(object)),
        object + 32,
        with_tag(object, other_tag),
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
        let (count, report) = kasan::recording(|| heap::free(pointer));
        check_eq!(count, 1);
        check!(report.is_some_and(|report| report.bug == BugType::InvalidFree && report.address == pointer));
    }
    check_eq!(Tags::memory_tag(untagged(object)), tag_of(object));
    let (count, _) = kasan::recording(|| heap::free(object));
    check_eq!(count, 0);
    churn(&[64, 8000])
}
