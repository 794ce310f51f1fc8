//! The sanitizer heap's soundness fuzz: recovered bad accesses around objects of many sizes.
//!
//! For each size: an object, then recovered one-byte reads and writes at distances left of its
//! start and right of its end, each of which must be reported once, as an out-of-bounds access
//! of that address; stale-pointer writes into the freed object and into a freed block since
//! split into smaller objects, each a use-after-free; overlong `memset`/`memcpy`/`memmove` (and,
//! where the runtime checks ranges, negative sizes), each an out-of-bounds access; then the free
//! of every object, which must pass without a report. Recovered writes carry out garbage (0x41)
//! wherever the granule carries the invalid tag (guards, slack, free and freed blocks: where the
//! heap's metadata was in band) and write back the byte already there elsewhere (a neighbour
//! another part of the kernel owns). An access whose granule carries the pointer's tag (a
//! neighbour with the same tag, 1 in 238 with the shadow's tags, 1 in 14 with MTE's; or, without
//! short granules, the unused bytes of the object's last granule) cannot be caught by tags and is
//! counted as skipped, not tried. Afterwards: the heap audit, 64 allocation/free rounds of each
//! size and its neighbours, written and read whole without a report, and the audit again; the
//! heap's requested bytes must be what they were before.
//!
//! Reports go through the recording scope's counting mode (classified here, not printed). A
//! report that names another object with the same tag as the one the access meant (a freed
//! neighbour of a live object, a live neighbour of a freed one) is a tag collision that no rule
//! can resolve, counted apart and bounded (1 in 238 tags collide with the shadow's tags, 1 in 14
//! with MTE's). The run fails on any crash (the kernel stops), any missed or misclassified
//! report, too many collisions, any report of a valid access or free, or a leaked object; it
//! prints how many bad accesses it tried.
//!
//! `kasan_fuzz_sample` runs in `cargo xtask test`: sizes 1-64, 2^k - 48 and 2^k +- 1, at
//! distances 1, 16, 17, 32, 33, 48 and 64 on each side. `kasan_fuzz_whole` (every size 1-1024 and
//! 2^k - 48 up to 64 KiB, every distance up to 64 left and 65 right, every granule of the stale
//! blocks) runs only when its filter selects it alone (docs/design/kasan.md). With the test-only
//! switch `heap-header-in-band` (the heap's layout before its block table) the fuzz must fail:
//! `kasan_fuzz_notices_in_band_header` proves it.
//!
//! `kasan_sound_short_granule_tag_byte`: with short granules, a recovered store over a short
//! granule's tag byte leaves its object's later valid accesses, intrinsics and free working.

use super::{Context, Failure, Outcome, Test, Verdict, check, check_eq, fail};
use crate::inject::{Fault, Injected};
use crate::mm::kasan::heap;
use crate::mm::kasan::recording;
use crate::mm::kasan::report::{BugType, Report};
use crate::mm::kasan::storage::{TagStorage, tag_of, untagged};
use crate::mm::kasan::{CHECKS_COMPILED_IN, HARDWARE_TAGS, SHORT_GRANULES, Tags};
use alloc::vec::Vec;
use core::hint::black_box;

pub const TESTS: &[Test] = &[
    Test { name: "kasan_fuzz_sample", run: kasan_fuzz_sample },
    Test { name: "kasan_fuzz_notices_in_band_header", run: kasan_fuzz_notices_in_band_header },
    Test { name: "kasan_fuzz_whole", run: kasan_fuzz_whole },
    Test { name: "kasan_sound_short_granule_tag_byte", run: kasan_sound_short_granule_tag_byte },
];

const NO_CHECKS: &str = "no tag checks in this build (`full` has kernel-hwaddress, `mte` the hardware's)";
const GRANULE: u64 = Tags::GRANULE;
/// What a recovered write leaves where it may: the heap's metadata, were it there, would be
/// clobbered with it.
const GARBAGE: u8 = 0x41;
/// The sample's distances past either end of an object.
const SAMPLE_DISTANCES: [u64; 7] = [1, 16, 17, 32, 33, 48, 64];

/// What one fuzz run covers.
struct Plan {
    sizes: Vec<usize>,
    /// Distances left of the object's first byte, and right of its last byte.
    left: Vec<u64>,
    right: Vec<u64>,
    /// Stale writes into every granule of a freed or split block, else into its first and last.
    every_stale_granule: bool,
}

impl Plan {
    fn sample() -> Self {
        let mut sizes: Vec<usize> = (1..=64).collect();
        sizes.extend((7..=12).map(|k| (1 << k) - 48));
        for k in 7..=10 {
            sizes.extend([(1 << k) - 1, (1 << k) + 1]);
        }
        Self { sizes, left: SAMPLE_DISTANCES.to_vec(), right: SAMPLE_DISTANCES.to_vec(), every_stale_granule: false }
    }

    fn whole() -> Self {
        let mut sizes: Vec<usize> = (1..=1024).collect();
        sizes.extend((11..=16).map(|k| (1 << k) - 48));
        Self { sizes, left: (1..=64).collect(), right: (1..=65).collect(), every_stale_granule: true }
    }

    /// A size and its neighbours, for the allocation rounds.
    fn neighbours(size: usize) -> [usize; 3] {
        [size.saturating_sub(1).max(1), size, size + 1]
    }
}

/// Refused frees a tally keeps, to free them once the fault that caused them is off.
const REFUSED_KEPT: usize = 64;

/// What a run saw.
struct Tally {
    /// Bad accesses tried (each must be reported once, with the right type).
    tried: u64,
    reads: u64,
    writes: u64,
    stale: u64,
    intrinsics: u64,
    /// Bad accesses not tried: their granule carries the pointer's tag.
    skipped: u64,
    out_of_bounds: u64,
    use_after_free: u64,
    /// Bad accesses reported as another object's with the same tag (tags cannot tell them
    /// apart: see `collision`).
    collisions: u64,
    /// Bad accesses with no report, with another type, address or direction, or with more
    /// than one report.
    missed: u64,
    misclassified: u64,
    /// Reports of valid accesses or frees.
    false_positives: u64,
    valid_frees: u64,
    /// Valid frees the heap refused (the object is still live: freed later), the first
    /// `REFUSED_KEPT` of them; none of the fuzz's bookkeeping allocates while it writes.
    refused: [u64; REFUSED_KEPT],
    refused_count: usize,
    /// The first problem, for the log: what, the object's size and the distance.
    first_problem: Option<(&'static str, usize, i64)>,
}

impl Tally {
    fn new() -> Self {
        Self {
            tried: 0,
            reads: 0,
            writes: 0,
            stale: 0,
            intrinsics: 0,
            skipped: 0,
            collisions: 0,
            out_of_bounds: 0,
            use_after_free: 0,
            missed: 0,
            misclassified: 0,
            false_positives: 0,
            valid_frees: 0,
            refused: [0; REFUSED_KEPT],
            refused_count: 0,
            first_problem: None,
        }
    }

    fn refused(&self) -> &[u64] {
        &self.refused[..self.refused_count.min(REFUSED_KEPT)]
    }

    fn problem(&mut self, what: &'static str, size: usize, distance: i64) {
        if self.first_problem.is_none() {
            self.first_problem = Some((what, size, distance));
        }
    }

    fn failed(&self) -> bool {
        self.missed + self.misclassified + self.false_positives != 0 || self.refused_count != 0
    }
}

/// An instrumented one-byte read (`full` puts a tag check in it).
#[inline(never)]
fn read_u8(address: u64) -> u8 {
    // SAFETY: heap memory (RAM, mapped), possibly outside the object or freed: what the
    // sanitizer must catch; the value is not trusted.
    unsafe { (address as *const u8).read_volatile() }
}

/// An instrumented one-byte write.
#[inline(never)]
fn write_u8(address: u64, value: u8) {
    // SAFETY: as in read_u8; what it writes is GARBAGE only where no live object is (fuzz
    // `value_for`), else the byte already there.
    unsafe { (address as *mut u8).write_volatile(value) }
}

/// The byte a recovered write at `address` writes: garbage into a granule no live object owns
/// (or into `own`, the object's own last granule: the short granule's tag byte), else the byte
/// already there, read untagged.
fn value_for(address: u64, own: core::ops::Range<u64>) -> u8 {
    if Tags::memory_tag(untagged(address)) == Tags::INVALID || own.contains(&untagged(address)) {
        return GARBAGE;
    }
    // SAFETY: heap memory, read through an untagged (match-all) pointer.
    unsafe { (untagged(address) as *const u8).read_volatile() }
}

/// Whether tags can catch a one-byte access at `address` through a pointer tagged `tag`: its
/// granule does not carry the tag (nor accept it as a short granule).
fn detectable(address: u64, tag: u8) -> bool {
    let address = untagged(address);
    let granule = address & !(GRANULE - 1);
    let memory_tag = Tags::memory_tag(granule);
    memory_tag != tag && !Tags::short_granule_accepts(granule, memory_tag, tag, address + 1)
}

/// One bad access: it must cause exactly one report, of `bug`, whose address lies in
/// `[address, address + length)` (a one-byte access's is the address itself), in the access's
/// direction. Whether it was.
fn bad_access(
    tally: &mut Tally,
    bug: BugType,
    meant: u64,
    address: u64,
    length: u64,
    write: bool,
    access: impl FnOnce(),
) -> bool {
    let (count, report) = recording::counting(access);
    tally.tried += 1;
    match (count, report) {
        (0, _) | (_, None) => tally.missed += 1,
        (1, Some(report)) if collision(&report, meant) => {
            // Accounted for (and bounded), not a problem to name.
            tally.collisions += 1;
            return true;
        }
        (count, Some(report)) if !matches(&report, bug, address, length, write) || count > 1 => {
            tally.misclassified += 1
        }
        _ => {
            match bug {
                BugType::UseAfterFree => tally.use_after_free += 1,
                _ => tally.out_of_bounds += 1,
            }
            return true;
        }
    }
    false
}

/// Whether the report names another object with the tag of `meant`, the object the access
/// meant: a live and a freed object with one tag both fit the address, and tags cannot tell
/// which pointer was meant (1 in 238 with the shadow's tags, 1 in 14 with MTE's; the report's
/// rule is in ring.rs).
fn collision(report: &Report, meant: u64) -> bool {
    report.object.is_some_and(|object| {
        untagged(object.address) != untagged(meant)
            && tag_of(object.address) == tag_of(meant)
            && report.bug != BugType::InvalidAccess
    })
}

fn matches(report: &Report, bug: BugType, address: u64, length: u64, write: bool) -> bool {
    let at = untagged(report.address);
    let start = untagged(address);
    report.bug == bug && report.write == write && (at == start || (at > start && at - start < length))
}

/// A valid operation: no report.
fn valid(tally: &mut Tally, size: usize, operation: impl FnOnce()) {
    let (count, _) = recording::counting(operation);
    if count != 0 {
        tally.false_positives += count;
        tally.problem("valid access reported", size, 0);
    }
}

/// A valid free: no report, or the object is kept in `refused` (still live: freed later).
fn free(tally: &mut Tally, size: usize, object: u64) {
    let (count, _) = recording::counting(|| heap::free(object));
    if count == 0 {
        tally.valid_frees += 1;
    } else {
        if tally.refused_count < REFUSED_KEPT {
            tally.refused[tally.refused_count] = object;
        }
        tally.refused_count += 1;
        tally.problem("valid free refused", size, 0);
    }
}

fn allocate(size: usize) -> Result<u64, Failure> {
    heap::allocate(size, 16).ok_or_else(|| fail("the heap has room"))
}

/// Fills the object with a pattern of its size (valid writes).
fn fill(tally: &mut Tally, object: u64, size: usize) {
    valid(tally, size, || {
        // SAFETY: a live object of `size` bytes, written whole through its tagged pointer.
        unsafe { core::ptr::write_bytes(object as *mut u8, size as u8, size) }
    });
}

/// Reads the object back whole (valid reads): whether the pattern is intact.
fn intact(tally: &mut Tally, object: u64, size: usize) -> bool {
    let mut intact = true;
    valid(tally, size, || {
        // SAFETY: as in `fill`, read whole.
        let bytes = unsafe { core::slice::from_raw_parts(object as *const u8, size) };
        intact = bytes.iter().all(|&byte| byte == size as u8);
    });
    intact
}

/// Recovered reads and writes at the plan's distances left and right of an object of `size`
/// bytes; the object's own bytes must stay as they were, and its free must pass.
fn around(tally: &mut Tally, plan: &Plan, size: usize) -> Result<(), Failure> {
    let object = allocate(size)?;
    fill(tally, object, size);
    let tag = tag_of(object);
    let end = untagged(object) + size as u64;
    let last_granule = (end - 1) & !(GRANULE - 1);
    let own = last_granule..last_granule + GRANULE;
    let left = plan.left.iter().map(|&distance| (object.wrapping_sub(distance), -(distance as i64)));
    let right =
        plan.right.iter().map(|&distance| (object + size as u64 - 1 + distance, (size as u64 - 1 + distance) as i64));
    for (address, distance) in left.chain(right) {
        if !detectable(address, tag) {
            tally.skipped += 2;
            continue;
        }
        let read = bad_access(tally, BugType::OutOfBounds, object, address, 1, false, || {
            black_box(read_u8(address));
        });
        tally.reads += 1;
        if !read {
            tally.problem("recovered read", size, distance);
        }
        // A read re-tags nothing: the write's granule still mismatches.
        let value = value_for(address, own.clone());
        if !bad_access(tally, BugType::OutOfBounds, object, address, 1, true, || write_u8(address, value)) {
            tally.problem("recovered write", size, distance);
        }
        tally.writes += 1;
    }
    if !intact(tally, object, size) {
        tally.misclassified += 1;
        tally.problem("a recovered write changed the object", size, 0);
    }
    free(tally, size, object);
    Ok(())
}

/// The granules a stale pointer writes into, as offsets from the object: every one of the
/// object and its guards, or the first and last of the object. No allocation: the stale writes
/// may land where its header would be.
fn stale_offsets(plan: &Plan, size: usize) -> impl Iterator<Item = i64> {
    let granule = GRANULE as i64;
    let rounded = (size as u64).next_multiple_of(GRANULE) as i64;
    let (first, end, step) = if plan.every_stale_granule {
        (-2 * granule, rounded + granule, granule)
    } else {
        (0, rounded - granule + 1, (rounded - granule).max(granule))
    };
    (first..end).step_by(step as usize)
}

/// Stale writes through `stale` (a freed object of `size` bytes) at the plan's granules: each
/// a use-after-free where tags can tell.
fn stale_writes(tally: &mut Tally, plan: &Plan, stale: u64, size: usize) {
    let tag = tag_of(stale);
    for offset in stale_offsets(plan, size) {
        let address = stale.wrapping_add(offset as u64);
        if !detectable(address, tag) {
            tally.skipped += 1;
            continue;
        }
        let value = value_for(address, 0..0);
        if !bad_access(tally, BugType::UseAfterFree, stale, address, 1, true, || write_u8(address, value)) {
            tally.problem("stale write", size, offset);
        }
        tally.stale += 1;
    }
}

/// A freed object written through its stale pointer; then a freed block split into 64-byte
/// objects (allocated until one lands in it) written through the stale pointer of the object
/// that had it; every object freed.
fn stale(tally: &mut Tally, plan: &Plan, size: usize) -> Result<(), Failure> {
    let object = allocate(size)?;
    free(tally, size, object);
    stale_writes(tally, plan, object, size);

    // A block of at least 128 bytes, then smaller objects carved from it.
    let big_size = size.max(80);
    let big = allocate(big_size)?;
    free(tally, big_size, big);
    let block = untagged(big) - 2 * GRANULE;
    let block_end = untagged(big) + (big_size as u64).next_multiple_of(GRANULE) + GRANULE;
    let mut pieces = [0u64; 32];
    let mut count = 0;
    while count < pieces.len() {
        pieces[count] = allocate(16)?;
        count += 1;
        if (block..block_end).contains(&untagged(pieces[count - 1])) && count >= 2 {
            break;
        }
    }
    let pieces = &pieces[..count];
    // A piece with the stale pointer's tag makes its granules and guards look like its own
    // out-of-bounds accesses: tags cannot tell the two apart (1 in 238), so those writes are
    // skipped, not tried.
    if pieces.iter().any(|&piece| tag_of(piece) == tag_of(big)) {
        tally.skipped += stale_offsets(plan, big_size).count() as u64;
    } else {
        stale_writes(tally, plan, big, big_size);
    }
    for &piece in pieces {
        free(tally, 16, piece);
    }
    Ok(())
}

/// Overlong and (where the runtime checks ranges) negative-size intrinsics on an object of
/// `size` bytes: each reported once as out-of-bounds. An overlong one runs 16 bytes past the
/// end, into the object's own trailing guard: MTE resumes a faulting intrinsic with checks
/// suspended and so carries it out.
fn intrinsics(tally: &mut Tally, size: usize) -> Result<(), Failure> {
    let object = allocate(size)?;
    let other = allocate(size)?;
    fill(tally, object, size);
    let overlong = size + GRANULE as usize;
    let length = overlong as u64;
    let mut ok = true;
    ok &= bad_access(tally, BugType::OutOfBounds, object, object, length, true, || {
        // SAFETY: deliberately past the object's end, into its own block's guard.
        unsafe { core::ptr::write_bytes(object as *mut u8, GARBAGE, black_box(overlong)) }
    });
    ok &= bad_access(tally, BugType::OutOfBounds, object, object, length, false, || {
        // SAFETY: as above; the destination is as long as the source.
        unsafe { core::ptr::copy_nonoverlapping(object as *const u8, other as *mut u8, black_box(overlong)) }
    });
    ok &= bad_access(tally, BugType::OutOfBounds, object, object, length, false, || {
        // SAFETY: as above.
        unsafe { core::ptr::copy(object as *const u8, other as *mut u8, black_box(overlong)) }
    });
    tally.intrinsics += 3;
    if CHECKS_COMPILED_IN {
        // Linux's negative-size cases ((size_t)-2): the runtime reports them and moves nothing.
        let negative = usize::MAX - 1;
        let whole = u64::MAX;
        ok &= bad_access(tally, BugType::OutOfBounds, object, object, whole, true, || {
            // SAFETY: a size past the end of the address space: reported, not carried out.
            unsafe { core::ptr::write_bytes(object as *mut u8, GARBAGE, black_box(negative)) }
        });
        ok &= bad_access(tally, BugType::OutOfBounds, object, object, whole, false, || {
            // SAFETY: as above.
            unsafe { core::ptr::copy_nonoverlapping(object as *const u8, other as *mut u8, black_box(negative)) }
        });
        ok &= bad_access(tally, BugType::OutOfBounds, object, object + 4, whole, false, || {
            // SAFETY: as above.
            unsafe { core::ptr::copy((object + 4) as *const u8, object as *mut u8, black_box(negative)) }
        });
        tally.intrinsics += 3;
    }
    if !ok {
        tally.problem("intrinsic", size, 0);
    }
    if CHECKS_COMPILED_IN && !intact(tally, object, size) {
        // The runtime carries out no reported intrinsic.
        tally.misclassified += 1;
        tally.problem("a reported intrinsic was carried out", size, 0);
    }
    free(tally, size, object);
    free(tally, size, other);
    Ok(())
}

/// 64 rounds of allocating each of `sizes`' neighbouring sizes, written and read whole, then
/// freed: no report, no overlap.
fn churn(tally: &mut Tally, sizes: &[usize]) -> Result<(), Failure> {
    for _ in 0..64 {
        for &size in sizes {
            let objects = Plan::neighbours(size);
            let mut live = [0u64; 3];
            for (slot, &size) in live.iter_mut().zip(&objects) {
                *slot = allocate(size)?;
                fill(tally, *slot, size);
            }
            for (&object, &size) in live.iter().zip(&objects) {
                if !intact(tally, object, size) {
                    tally.misclassified += 1;
                    tally.problem("churned objects overlap", size, 0);
                }
                free(tally, size, object);
            }
        }
    }
    Ok(())
}

/// The whole run of `plan`: what it saw.
fn run(plan: &Plan) -> Result<Tally, Failure> {
    let mut tally = Tally::new();
    for &size in &plan.sizes {
        around(&mut tally, plan, size)?;
        stale(&mut tally, plan, size)?;
        intrinsics(&mut tally, size)?;
    }
    if let Err(problem) = heap::audit() {
        defmt::error!("kasan fuzz: heap audit: {=str}", problem);
        tally.misclassified += 1;
    }
    churn(&mut tally, &plan.sizes)?;
    if let Err(problem) = heap::audit() {
        defmt::error!("kasan fuzz: heap audit after the rounds: {=str}", problem);
        tally.misclassified += 1;
    }
    Ok(tally)
}

/// Prints what a run saw (the count of bad accesses tried first).
fn print(name: &str, tally: &Tally) {
    defmt::info!(
        "kasan fuzz {=str}: {=u64} bad accesses tried ({=u64} reads, {=u64} writes, {=u64} stale writes, {=u64} \
         intrinsics), {=u64} skipped (granule carries the pointer's tag); reports: {=u64} of another object with the same tag, {=u64} out-of-bounds, {=u64} \
         use-after-free; {=u64} missed, {=u64} misclassified, {=u64} false positives; {=u64} valid frees, {=usize} \
         refused",
        name,
        tally.tried,
        tally.reads,
        tally.writes,
        tally.stale,
        tally.intrinsics,
        tally.skipped,
        tally.collisions,
        tally.out_of_bounds,
        tally.use_after_free,
        tally.missed,
        tally.misclassified,
        tally.false_positives,
        tally.valid_frees,
        tally.refused_count
    );
    if let Some((what, size, distance)) = tally.first_problem {
        defmt::error!(
            "kasan fuzz {=str}: first problem: {=str} (size {=usize}, at {=i64})",
            name,
            what,
            size,
            distance
        );
    }
}

/// Runs `plan` and checks it: every bad access reported with its type, no false positive,
/// every valid free done, the heap's requested bytes back where they were.
fn fuzz(name: &str, plan: &Plan) -> Outcome {
    if !(CHECKS_COMPILED_IN || HARDWARE_TAGS) {
        return Ok(Verdict::Skipped(NO_CHECKS));
    }
    let (requested, _) = heap::usage();
    let tally = run(plan)?;
    print(name, &tally);
    check!(tally.tried > 0);
    check_eq!(tally.missed, 0);
    check_eq!(tally.misclassified, 0);
    // Tag collisions: a few per cent of the accesses at most (a neighbour's tag equals the
    // object's 1 time in 14 with MTE, 1 in 238 with the shadow's tags).
    check!(tally.collisions * if HARDWARE_TAGS { 10 } else { 50 } <= tally.tried);
    check_eq!(tally.false_positives, 0);
    check_eq!(tally.refused_count, 0);
    // Every object the run allocated is freed.
    check_eq!(heap::usage().0, requested);
    Ok(Verdict::Passed)
}

fn kasan_fuzz_sample(_: &Context) -> Outcome {
    fuzz("sample", &Plan::sample())
}

/// The whole fuzz: only when the filter selects it alone (`--filter kasan_fuzz_whole`), since it
/// runs for minutes.
fn kasan_fuzz_whole(context: &Context) -> Outcome {
    if !context.alone {
        return Ok(Verdict::Skipped("the whole fuzz runs alone: --filter kasan_fuzz_whole"));
    }
    fuzz("whole", &Plan::whole())
}

/// With the heap's header back in band (`inject=heap-header-in-band`), recovered writes two
/// granules left of objects of the 2^k - 48 family, and stale writes into split blocks, land on
/// headers: the fuzz must see valid frees refused. The objects it leaves live are freed once the
/// switch is off (the block table still holds them).
fn kasan_fuzz_notices_in_band_header(_: &Context) -> Outcome {
    if !(CHECKS_COMPILED_IN || HARDWARE_TAGS) {
        return Ok(Verdict::Skipped(NO_CHECKS));
    }
    let plan = Plan {
        sizes: alloc::vec![80, 208],
        left: alloc::vec![17, 32],
        right: alloc::vec![17, 32],
        every_stale_granule: true,
    };
    let (requested, _) = heap::usage();
    let tally = {
        let _in_band = Injected::new(Fault::HeapHeaderInBand);
        let mut tally = Tally::new();
        for &size in &plan.sizes {
            around(&mut tally, &plan, size)?;
            stale(&mut tally, &plan, size)?;
        }
        tally
    };
    print("in-band header", &tally);
    check!(tally.failed());
    check!(tally.refused_count != 0 && tally.refused_count <= REFUSED_KEPT);
    for &object in tally.refused() {
        let (count, _) = recording::counting(|| heap::free(object));
        check_eq!(count, 0);
    }
    check_eq!(heap::usage().0, requested);
    check!(heap::audit().is_ok());
    Ok(Verdict::Passed)
}

/// A recovered one-byte store to byte 15 of a 13-byte object (its short granule's tag byte) is
/// reported once; afterwards every valid access to the object passes, a valid `memset` and
/// `memcpy` over it are carried out (the runtime skips reported intrinsics, so one reported
/// wrongly would leave the data silently wrong), its free passes and the audit holds.
fn kasan_sound_short_granule_tag_byte(_: &Context) -> Outcome {
    if !CHECKS_COMPILED_IN {
        return Ok(Verdict::Skipped(NO_CHECKS));
    }
    if !SHORT_GRANULES {
        return Ok(Verdict::Skipped("no short granules in this build (`--kasan-short-granules`)"));
    }
    let size = 13;
    let object = allocate(size)?;
    let other = allocate(size)?;
    let mut tally = Tally::new();
    fill(&mut tally, object, size);
    let tag_byte = object + 15;
    check!(bad_access(&mut tally, BugType::OutOfBounds, object, tag_byte, 1, true, || write_u8(tag_byte, GARBAGE)));
    // Every byte of the object, read and written back, then the intrinsics over it.
    check!(intact(&mut tally, object, size));
    valid(&mut tally, size, || {
        for offset in 0..size as u64 {
            write_u8(object + offset, read_u8(object + offset));
        }
    });
    valid(&mut tally, size, || {
        // SAFETY: the live object, whole.
        unsafe { core::ptr::write_bytes(object as *mut u8, 0x5a, black_box(size)) }
    });
    valid(&mut tally, size, || {
        // SAFETY: two live objects of `size` bytes.
        unsafe { core::ptr::copy_nonoverlapping(object as *const u8, other as *mut u8, black_box(size)) }
    });
    check_eq!(tally.false_positives, 0);
    for offset in 0..size as u64 {
        // SAFETY: heap memory read untagged: what the intrinsics left.
        let (mine, copy) = unsafe {
            (
                (untagged(object + offset) as *const u8).read_volatile(),
                (untagged(other + offset) as *const u8).read_volatile(),
            )
        };
        check_eq!(mine, 0x5a);
        check_eq!(copy, 0x5a);
    }
    // Past the end inside the granule is no longer caught for this object (the granule is no
    // longer short); the granule after it still is.
    check!(bad_access(&mut tally, BugType::OutOfBounds, object, object + 16, 1, false, || {
        black_box(read_u8(object + 16));
    }));
    check!(heap::audit().is_ok());
    free(&mut tally, size, object);
    free(&mut tally, size, other);
    check_eq!(tally.refused_count, 0);
    check!(heap::audit().is_ok());
    Ok(Verdict::Passed)
}
