//! The sanitizer heap: the kernel's global allocator, a tag layer over a buddy allocator.
//!
//! # Layout of a block
//!
//! The block table (blocks.rs) hands out power-of-two blocks. The tag layer puts two guard
//! granules before the object (at the block's start unless the alignment exceeds 32), the object
//! (its size rounded up to 16) and at least one guard granule after it:
//!
//! ```text
//! block:  [ guard | guard | object, 16-byte granules ... | guard | slack up to the power of two ]
//! tags:     0xFE    0xFE    T T T T ...                    0xFE    0xFE
//! ```
//!
//! The object's tag T comes from the tag storage's generator (storage.rs, shadow.rs) and is
//! written to the shadow of each of its granules and to the pointer's top byte. Guards and
//! slack keep the "invalid" tag 0xFE, so an access just left or right of an object always
//! mismatches (a redzone that Linux's SW_TAGS does not have: there, neighbours differ only by
//! tag, 1/238 collisions). Free re-tags the object 0xFE. The block table never touches the heap's
//! memory.
//!
//! # Metadata out of reach
//!
//! In recover mode a reported store the compiler inserted is carried out, whatever its distance
//! from its object. So nothing the allocator relies on lies in the heap: the header (requested
//! size, block order, offset, tag, live/freed state) and the free lists are in the block table
//! (blocks.rs), a side table indexed by 64-byte block, found with one shift and one load. A
//! recovered store two granules out, a stale pointer writing into a freed block or into blocks
//! since split from it, an overlong intrinsic under MTE resumed with checks suspended: each can
//! change data in the heap, never which blocks are free or how large an object is, so every
//! valid free still works and the next allocation still finds a sound free list. The guards
//! stay (the left one is two granules: where the in-band header was): they keep an access just
//! left or right of an object on an invalid tag. The runtime's own intrinsics (abi.rs) never
//! carry out a reported access. `check_free` checks the pointer against the table (live, its
//! tag, the geometry it implies) and the shadow (first granule tagged, guard invalid).
//!
//! The test-only switch `inject=heap-header-in-band` writes the old in-band header too and
//! trusts it on free: a recovered store that reaches it makes a valid free refused, which the
//! soundness fuzz (tests/kasan_fuzz.rs) must notice.
//!
//! # Metadata: table and stack ring
//!
//! The table's object entry is the only way to recognise the start of a live object. Stacks
//! live apart, in a stack ring as in Linux's tag-based KASAN: every allocation and free appends
//! {tagged pointer, size, depot handle, task, alloc/free} to a ring of `RING_ENTRIES`; a report
//! asks the table (through ring.rs's `Objects`, which `TableObjects` implements) and the ring,
//! newest first, for the object the faulting pointer's tag belongs to, the live object holding
//! the address first, and takes that object's stacks from the ring while it remembers them. A
//! freed object's entry stays FREED until another object starts in the same 64 bytes, so a
//! double free is recognised after the ring wrapped, and a report names the object after the
//! ring forgot its stacks.
//!
//! # Stacks, locks and interrupts
//!
//! The stack of each alloc and free is collected outside the lock (`collect_stack`: a frame
//! record walk or a shadow-call-stack copy through `stacktrace::collect`, as Linux's SW_TAGS
//! saves them), in the mode chosen at run time ([`set_stacks`]: none, fp, scs, each with or without the depot; `-no-depot` collects the
//! trace and drops it: the walk's cost without the depot's). With
//! `kasan.stack_sample=N` one allocation stack in N is collected (free stacks always). The lock
//! covers the block table and the ring, and is taken with IRQs masked, so an
//! interrupt can never spin on a lock its own CPU holds. The heap refuses IRQ context (panics):
//! the tick path never allocates, which also keeps the depot's miss-path spin lock out of IRQs.
//!
//! # Hot path
//!
//! alloc: collect stack -> mask IRQs, lock, pop a free block (split it), draw a tag, object
//! entry, ring entry, unlock -> tag the object's shadow (one byte per granule). free: collect
//! stack -> mask, lock, check the pointer (its object entry, tag vs shadow), re-tag 0xFE, ring
//! entry, merge the block with its free buddies -> unlock.
//!
//! # Short granules
//!
//! With `--kasan-short-granules` (`full` only) an object whose size is not a multiple of 16 has
//! a short last granule (shadow.rs): its memory tag is the number of bytes used and its last
//! byte, past the object's end, holds the object's tag, so an access past the end inside that
//! granule is caught. Free re-tags every granule 0xFE as before; the tag byte stays behind in
//! memory nobody owns. A recovered store the compiler let through can overwrite the tag byte
//! (as in HWASan): the report re-tags such a granule first, with its object's tag read from the
//! byte while it is intact (abi.rs, `retag_short_granules`), so the object's later valid
//! accesses, a valid intrinsic over it and its free still pass (left alone, the clobbered byte
//! made each of them a report, and a reported intrinsic is not carried out). The granule then
//! stops being short: an access past the end inside it is no longer caught for that object.
//! The audit accepts such a granule and checks every other short granule's tag byte.
//!
//! # Build variants
//!
//! Tags are assigned in every build: the shadow exists in all of them, and the free-path checks
//! (double free, invalid free) need them. Only `full` has compiler-inserted access checks; in
//! `prod` and `plain` the tags in pointers are ignored by the MMU (TBI) and by everything else.

use super::Tags;
use super::blocks::{self, BlockTable, FREED, LIVE, NEVER, ObjectEntry};
use super::record::{self, HeapView};
use super::report::BugType;
use super::ring::{ADJACENT, Found, Objects, Ring, RingEntry};
use super::storage::{TagStorage, tag_of, untagged, with_tag};
use crate::arch::uninstrumented;
use crate::inject::{self, Fault};
use crate::stacktrace::{self, Mode};
use crate::sync::IrqMask;
use core::alloc::{GlobalAlloc, Layout};
use core::sync::atomic::{AtomicU8, AtomicU64, Ordering};

const GRANULE: u64 = Tags::GRANULE;
const INVALID: u8 = Tags::INVALID;
/// The heap's size, taken from the start of free RAM.
pub const HEAP_SIZE: u64 = 1 << blocks::MAX_ORDER;

/// The object's least offset in its block: two guard granules, then the object.
const HEADER_BELOW: u64 = 2 * GRANULE;
const _: () = assert!(HEADER_BELOW == 1 << blocks::MIN_OFFSET_LOG2, "the table's least object offset");
/// The in-band header's magic (test-only layout, `Fault::HeapHeaderInBand`).
const LIVE_MAGIC: u64 = 0x4c49_5645_0000_0000;
/// The guard granule every block keeps after its object (the least slack).
const TRAILING_GUARD: u64 = GRANULE;
/// The largest alignment the heap serves: half its largest block. The guards before an object
/// lie in its own block, so an object aligned to A starts A bytes into a block of at least 2A
/// bytes (aligned to its size, as every buddy block is). A larger alignment is refused.
pub const MAX_ALIGN: u64 = 1 << (blocks::MAX_ORDER - 1);

/// The in-band header the heap kept two granules below each object before the block table
/// (blocks.rs) held it, written and trusted again only under the test-only
/// `Fault::HeapHeaderInBand`, so that the soundness fuzz can show it notices metadata within
/// reach of a recovered store.
#[repr(C)]
#[derive(Clone, Copy)]
struct Header {
    /// LIVE_MAGIC xor the object's untagged address while live; the free-list link once free.
    magic: u64,
    /// Requested size in bytes.
    size: u32,
    /// log2 of (object address - block address).
    offset_log2: u8,
    /// log2 of the block size.
    order: u8,
    tag: u8,
    /// LIVE or FREED.
    state: u8,
}

struct State {
    table: BlockTable,
    ring: Ring,
}

/// The heap's state. A raw spin mutex (counted like `IrqSpinLock`'s) rather than an
/// `IrqSpinLock`: a report raised inside the heap's own critical section must see the lock held
/// (`find_object`'s `try_lock`), which `IrqSpinLock` does not offer; `locked` masks IRQs around
/// every `lock`, as `IrqSpinLock` would.
static STATE: spin::mutex::Mutex<State, crate::sync::CountedSpin> =
    spin::mutex::Mutex::new(State { table: BlockTable::new(), ring: Ring::new() });
static HEAP_START: AtomicU64 = AtomicU64::new(0);
static HEAP_END: AtomicU64 = AtomicU64::new(0);

/// How alloc and free collect their stacks (switchable at run time). Every mode that walks
/// goes through `stacktrace::collect`, the kernel's one walker path.
#[derive(Clone, Copy, PartialEq, Eq, Debug, defmt::Format)]
#[repr(u8)]
pub enum Stacks {
    None,
    FramePointer,
    FramePointerNoDepot,
    ShadowCallStack,
    ShadowCallStackNoDepot,
    /// The frame walk compiled with the sanitizer's checks on every word it reads (as Linux
    /// builds its unwinder by default), with the depot.
    FramePointerInstrumented,
    /// The SFrame walk (`stacktrace::collect_sframe`), with the depot.
    SFrame,
    SFrameNoDepot,
}

impl Stacks {
    /// The heap's stacks at boot: the frame walk with the depot, or the SFrame walk in a build
    /// without frame pointers (which refuses frame walks).
    pub const DEFAULT: Self = if crate::build_info::FRAME_POINTERS { Self::FramePointer } else { Self::SFrame };

    pub const ALL: [Self; 8] = [
        Self::None,
        Self::FramePointer,
        Self::FramePointerNoDepot,
        Self::ShadowCallStack,
        Self::ShadowCallStackNoDepot,
        Self::FramePointerInstrumented,
        Self::SFrame,
        Self::SFrameNoDepot,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::None => "no-stacks",
            Self::FramePointer => "fp",
            Self::FramePointerNoDepot => "fp-no-depot",
            Self::ShadowCallStack => "scs",
            Self::ShadowCallStackNoDepot => "scs-no-depot",
            Self::FramePointerInstrumented => "fp-instrumented",
            Self::SFrame => "sframe",
            Self::SFrameNoDepot => "sframe-no-depot",
        }
    }

    /// Whether this build can collect stacks this way: a frame walk needs frame pointers.
    pub fn available(self) -> bool {
        self.walker().is_none_or(|(mode, ..)| mode.available())
    }

    /// Which walk, whether to save in the depot, whether the walk is the instrumented one.
    fn walker(self) -> Option<(Mode, bool, bool)> {
        match self {
            Self::None => None,
            Self::FramePointer => Some((Mode::FramePointer, true, false)),
            Self::FramePointerNoDepot => Some((Mode::FramePointer, false, false)),
            Self::ShadowCallStack => Some((Mode::ShadowCallStack, true, false)),
            Self::ShadowCallStackNoDepot => Some((Mode::ShadowCallStack, false, false)),
            Self::FramePointerInstrumented => Some((Mode::FramePointer, true, true)),
            Self::SFrame => Some((Mode::SFrame, true, false)),
            Self::SFrameNoDepot => Some((Mode::SFrame, false, false)),
        }
    }
}

static STACKS: AtomicU8 = AtomicU8::new(Stacks::DEFAULT as u8);

pub fn set_stacks(stacks: Stacks) {
    STACKS.store(stacks as u8, Ordering::Relaxed);
}

pub fn stacks() -> Stacks {
    Stacks::ALL.into_iter().find(|mode| *mode as u8 == STACKS.load(Ordering::Relaxed)).unwrap_or(Stacks::None)
}

/// Gives the heap its memory (the first HEAP_SIZE bytes of `free`, a kernel VA range) and seeds
/// the tag generator. Free memory is tagged invalid.
#[sanitize(kernel_hwaddress = "off")]
pub fn init(free_base: u64, free_size: u64, tag_seed: u32) {
    let size = free_size.min(HEAP_SIZE) & !(crate::arch::mmu::PAGE_SIZE - 1);
    assert!(size > 0, "no free RAM for the heap");
    Tags::seed(tag_seed);
    Tags::set_range_tag(free_base, size, INVALID);
    STATE.lock().table.init(free_base, free_base + size);
    HEAP_START.store(free_base, Ordering::Relaxed);
    HEAP_END.store(free_base + size, Ordering::Relaxed);
}

/// The heap's address range (untagged).
pub fn range() -> (u64, u64) {
    (HEAP_START.load(Ordering::Relaxed), HEAP_END.load(Ordering::Relaxed))
}

fn assert_not_in_irq() {
    let sp: u64;
    // SAFETY: reads SP.
    unsafe { core::arch::asm!("mov {}, sp", out(reg) sp, options(nomem, nostack, preserves_flags)) };
    assert!(!crate::task::stacks::this_irq_slot().contains_stack(sp), "the heap is not for IRQ context");
}

/// Collects the stack of allocate/free's caller in the current mode: the raw depot handle, or
/// handle 0 with the reason in the spare bits (`stacktrace::STACK_NOT_SAMPLED` for an allocation
/// that `kasan.stack_sample` left out, `STACK_DEPOT_FULL`), or 0 (no stacks, no depot).
///
/// Through `stacktrace::collect` (inlined here), the walker path every other user takes; its
/// first entry (the return into allocate/free) is skipped. The buffer is not zeroed: the
/// walk writes the entries it reports.
#[inline(never)]
#[sanitize(kernel_hwaddress = "off")]
fn collect_stack(allocation: bool) -> u32 {
    let Some((mode, depot, instrumented)) = stacks().walker() else {
        return 0;
    };
    if allocation && !stacktrace::sample_allocation() {
        return stacktrace::STACK_NOT_SAMPLED;
    }
    let mut buffer = [core::mem::MaybeUninit::uninit(); unwind::MAX_FRAMES];
    let options = unwind::TraceOptions::new(1, unwind::MAX_FRAMES);
    let walked = if instrumented {
        stacktrace::collect_instrumented(options, &mut buffer)
    } else {
        stacktrace::collect(mode, options, &mut buffer)
    };
    let frames = walked.entries(&buffer);
    if !depot {
        core::hint::black_box(frames);
        return 0;
    }
    stacktrace::stack_word(stacktrace::DEPOT.save(frames))
}

fn current_task() -> u16 {
    crate::task::current().0 as u16
}

fn round_up(value: u64, to: u64) -> u64 {
    (value + to - 1) & !(to - 1)
}

/// Runs `f` on the locked state with IRQs masked (the mask is taken before the lock and
/// dropped after it, so an interrupt never spins on a lock its own CPU holds). Not an
/// `IrqSpinLock`: a report needs `try_lock` on the same state (`find_object`). Always inlined
/// (and so compiled as its callers are, all exempt from the sanitizer): out of line, each
/// caller's closure reached every variable it captured through a pointer to it, on the
/// allocation and free paths.
#[inline(always)]
fn locked<R>(f: impl FnOnce(&mut State) -> R) -> R {
    let _mask = IrqMask::new();
    f(&mut STATE.lock())
}

/// Allocates `size` bytes aligned to `align` (at least 16); the tagged pointer, or None when the
/// heap is exhausted. A zero-byte object owns no granule: every access to it is reported.
#[inline(never)]
#[sanitize(kernel_hwaddress = "off")]
pub fn allocate(size: usize, align: usize) -> Option<u64> {
    assert_not_in_irq();
    let stack = collect_stack(true);
    allocate_with_stack(size, align, stack)
}

/// The allocation itself, recording `stack` (allocate's, or reallocate's when it moves an
/// object: its caller is the one that asked). Always inlined: allocate's code stays one body.
#[inline(always)]
fn allocate_with_stack(size: usize, align: usize, stack: u32) -> Option<u64> {
    let size = size as u64;
    let align = (align as u64).max(GRANULE);
    if size > u32::MAX as u64 {
        return None;
    }
    if align > MAX_ALIGN {
        return refuse_alignment(size, align);
    }
    let rounded = round_up(size, GRANULE);
    let offset = align.max(HEADER_BELOW);
    let block_size = (offset + rounded + TRAILING_GUARD).next_power_of_two().max(align);
    let order = block_size.trailing_zeros();
    let (block, tag) = locked(|state| {
        let block = state.table.allocate(order)?;
        let object = block + offset;
        // The tag of the freed object that started in the same 64 bytes, which a stale pointer
        // to it carries (0: none did; no live object can start there): excluded where the tag
        // storage can (MTE's IRG).
        let tag = Tags::random_tag_replacing(state.table.object(object).tag);
        let order = order as u8;
        let entry =
            ObjectEntry { size: size as u32, offset_log2: offset.trailing_zeros() as u8, order, tag, state: LIVE };
        state.table.set_object(object, entry);
        state.table.account(size as usize, 0);
        if uninstrumented::load_bool(inject::flag(Fault::HeapHeaderInBand)) {
            write_header_in_band(object, entry);
        }
        let pointer = with_tag(object, tag);
        let entry = RingEntry {
            pointer,
            size: size as u32,
            stack,
            task: current_task(),
            offset_log2: offset.trailing_zeros() as u8,
            order,
            freed: false,
        };
        state.ring.push(entry);
        Some((block, tag))
    })?;
    // The block is ours: tag the object outside the lock (the rest of the block is already
    // invalid: blocks are tagged 0xFE while free).
    if Tags::SHORT_GRANULES {
        Tags::tag_object(block + offset, size, tag);
    } else {
        Tags::set_range_tag(block + offset, rounded, tag);
    }
    Some(with_tag(block + offset, tag))
}

static REFUSED_ALIGNMENTS: AtomicU64 = AtomicU64::new(0);

/// An alignment above [`MAX_ALIGN`]: no block of the heap can hold the object with its guards.
/// Said on the console with the reason (the allocation-failure message Rust's `alloc` prints
/// next names only the size), counted, and nothing allocated.
#[cold]
#[inline(never)]
#[sanitize(kernel_hwaddress = "off")]
fn refuse_alignment(size: u64, align: u64) -> Option<u64> {
    REFUSED_ALIGNMENTS.fetch_add(1, Ordering::Relaxed);
    defmt::error!(
        "kasan heap: alignment {=u64:#x} of a {=u64}-byte allocation refused: the largest it serves is {=u64:#x} (half its largest block)",
        align,
        size,
        MAX_ALIGN
    );
    None
}

/// Allocations refused for their alignment (above [`MAX_ALIGN`]) since boot.
pub fn refused_alignments() -> u64 {
    REFUSED_ALIGNMENTS.load(Ordering::Relaxed)
}

/// Why a free was refused.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum BadFree {
    Double,
    Invalid,
}

/// The in-band header (test-only layout): written two granules below the object.
#[cold]
#[inline(never)]
#[sanitize(kernel_hwaddress = "off")]
fn write_header_in_band(object: u64, entry: ObjectEntry) {
    let header = Header {
        magic: LIVE_MAGIC ^ object,
        size: entry.size,
        offset_log2: entry.offset_log2,
        order: entry.order,
        tag: entry.tag,
        state: entry.state,
    };
    // SAFETY: the first guard granule lies in the object's block (offset >= 32), which the heap
    // owns; an untagged write.
    unsafe { ((object - HEADER_BELOW) as *mut Header).write(header) };
}

/// Whether the in-band header (test-only layout) still says what the table says about the live
/// object at `object`: the old layout's free trusted it, so a clobbered one refused the free.
#[cold]
#[inline(never)]
#[sanitize(kernel_hwaddress = "off")]
fn header_in_band_agrees(object: u64, entry: &ObjectEntry) -> bool {
    // SAFETY: object - 32 lies in the object's block (checked live), mapped RAM; untagged.
    let header = unsafe { ((object - HEADER_BELOW) as *const Header).read() };
    header.magic == LIVE_MAGIC ^ object
        && header.state == LIVE
        && header.size == entry.size
        && header.order == entry.order
        && header.offset_log2 == entry.offset_log2
        && header.tag == entry.tag
}

/// Whether `entry`'s geometry fits an object at `object` in the heap: the block it implies is
/// aligned, inside the heap, and holds the guards, the object and the trailing guard. Rejects a
/// pointer inside the first 64 bytes of an object (which share its index) too.
#[inline(always)]
fn plausible(entry: &ObjectEntry, object: u64) -> bool {
    let (start, end) = range();
    let order = entry.order as u32;
    let offset_log2 = entry.offset_log2 as u32;
    if !(blocks::MIN_ORDER..=blocks::MAX_ORDER).contains(&order)
        || !(blocks::MIN_OFFSET_LOG2..=MAX_ALIGN.trailing_zeros()).contains(&offset_log2)
        || offset_log2 >= order
    {
        return false;
    }
    let block = object.wrapping_sub(entry.offset());
    let block_size = 1 << order;
    block.is_multiple_of(block_size)
        && block >= start
        && block <= end - block_size
        && entry.offset() + round_up(entry.size as u64, GRANULE) + TRAILING_GUARD <= block_size
}

/// Checks that `pointer` is the start of a live object with its tag (or the match-all tag,
/// which any access accepts too); its table entry if so.
#[sanitize(kernel_hwaddress = "off")]
fn check_free(state: &State, pointer: u64) -> Result<ObjectEntry, BadFree> {
    let tag = tag_of(pointer);
    let address = untagged(pointer);
    let (start, end) = range();
    let tag_acceptable = Tags::is_object_tag(tag) || tag == Tags::MATCH_ALL;
    if !tag_acceptable || !address.is_multiple_of(GRANULE) || address < start + HEADER_BELOW || address >= end {
        return Err(BadFree::Invalid);
    }
    let header = state.table.object(address);
    let tag_matches = tag == Tags::MATCH_ALL || tag == header.tag;
    let live = header.state == LIVE && plausible(&header, address);
    if !live || !tag_matches {
        return Err(refused(state, pointer, &header));
    }
    // The shadow agrees with the header: the object's first granule (if it has one) carries its
    // tag, the guard granule before it is invalid.
    let first_granule_ok = header.size == 0 || Tags::object_tag(address) == header.tag;
    if !first_granule_ok || Tags::memory_tag(address - GRANULE) != INVALID {
        return Err(BadFree::Invalid);
    }
    if uninstrumented::load_bool(inject::flag(Fault::HeapHeaderInBand)) && !header_in_band_agrees(address, &header) {
        return Err(BadFree::Invalid);
    }
    Ok(header)
}

/// Why `check_free` refuses `pointer`, whose table entry (`header`) is no live object's with
/// its tag. Linux's rule (its slab free check): a pointer to where an object starts, or
/// started, that does not free a live object with its tag is a double free, a stale pointer to
/// an object freed before. The table says an object started here until another object starts
/// in the same 64 bytes, so this holds after the stack ring wrapped and after another object
/// took the block (the ring alone then made it an invalid free). The ring also remembers
/// recent frees at an address whose entry an object starting 32 bytes away (in the same 64
/// bytes) replaced. Out of line and cold: the free path's registers stay its own.
#[cold]
#[inline(never)]
#[sanitize(kernel_hwaddress = "off")]
fn refused(state: &State, pointer: u64, header: &ObjectEntry) -> BadFree {
    let (tag, address) = (tag_of(pointer), untagged(pointer));
    let object_start = header.state != NEVER && plausible(header, address);
    let freed_in_ring = state
        .ring
        .newest_first()
        .find(
            |entry| if tag == Tags::MATCH_ALL { untagged(entry.pointer) == address } else { entry.pointer == pointer },
        )
        .is_some_and(|entry| entry.freed);
    if object_start || freed_in_ring { BadFree::Double } else { BadFree::Invalid }
}

/// Frees the object at `pointer` (as returned by [`allocate`], or with the match-all tag). A
/// pointer that is not the start of a live object with its tag is reported (double free or
/// invalid free) and left alone.
#[inline(never)]
#[sanitize(kernel_hwaddress = "off")]
pub fn free(pointer: u64) {
    assert_not_in_irq();
    let stack = collect_stack(false);
    let verdict = locked(|state| {
        let header = check_free(state, pointer)?;
        let object = untagged(pointer);
        Tags::set_range_tag(object, round_up(header.size as u64, GRANULE), INVALID);
        let block = object - header.offset();
        state.table.set_object(object, ObjectEntry { state: FREED, ..header });
        state.table.account(0, header.size as usize);
        let entry = RingEntry {
            pointer: with_tag(object, header.tag),
            size: header.size,
            stack,
            task: current_task(),
            offset_log2: header.offset_log2,
            order: header.order,
            freed: true,
        };
        state.ring.push(entry);
        state.table.free(block, header.order as u32);
        Ok(())
    });
    if let Err(bad) = verdict {
        let bug = match bad {
            BadFree::Double => BugType::DoubleFree,
            BadFree::Invalid => BugType::InvalidFree,
        };
        refuse_free(bug, pointer, free as fn(u64) as usize as u64);
        // Not a tail call: the report finds the free's caller after this function's frame.
        core::hint::black_box(pointer);
    }
}

/// Reports a free or reallocation that `check_free` refused. Out of line and cold, so that the
/// free path's own code stays what it was; the report finds the caller after the frame of
/// `function` (free or reallocate).
#[cold]
#[inline(never)]
#[sanitize(kernel_hwaddress = "off")]
fn refuse_free(bug: BugType, pointer: u64, function: u64) {
    let (start, end) = range();
    let in_heap = (start..end).contains(&untagged(pointer));
    let memory_tag = if in_heap { Some(Tags::memory_tag(untagged(pointer))) } else { None };
    let found = if in_heap { find_object(pointer) } else { None };
    record::bad_free(
        bug,
        pointer,
        memory_tag,
        function,
        HeapView { found, range: (start, end), stack_mode: stacks().name() },
    );
}

/// What a reallocation found under the lock.
enum Resize {
    /// Resized in place: the tagged pointer.
    InPlace(u64),
    /// Does not fit its block: the tagged pointer and the old size.
    Move(u64, usize),
}

/// Resizes the object at `pointer` to `new_size`, in place when it fits in its block (the tag
/// stays, granules past the new size become invalid), else by moving it. A freed pointer is a
/// use-after-free (as Linux's krealloc reports it), any other bad pointer an invalid free; both
/// return None and leave the heap alone.
#[inline(never)]
#[sanitize(kernel_hwaddress = "off")]
pub fn reallocate(pointer: u64, align: usize, new_size: usize) -> Option<u64> {
    assert_not_in_irq();
    let stack = collect_stack(true);
    let resize = locked(|state| {
        let header = check_free(state, pointer)?;
        let object = untagged(pointer);
        let tagged = with_tag(object, header.tag);
        let new_rounded = round_up(new_size as u64, GRANULE);
        if new_size as u64 > u32::MAX as u64 || header.offset() + new_rounded + TRAILING_GUARD > 1 << header.order {
            return Ok(Resize::Move(tagged, header.size as usize));
        }
        let old_rounded = round_up(header.size as u64, GRANULE);
        if Tags::SHORT_GRANULES {
            // The old last granule may be short and the new one may be: tag the object anew.
            Tags::tag_object(object, new_size as u64, header.tag);
            if new_rounded < old_rounded {
                Tags::set_range_tag(object + new_rounded, old_rounded - new_rounded, INVALID);
            }
        } else if new_rounded > old_rounded {
            Tags::set_range_tag(object + old_rounded, new_rounded - old_rounded, header.tag);
        } else {
            Tags::set_range_tag(object + new_rounded, old_rounded - new_rounded, INVALID);
        }
        let resized = ObjectEntry { size: new_size as u32, ..header };
        state.table.set_object(object, resized);
        state.table.account(new_size, header.size as usize);
        if uninstrumented::load_bool(inject::flag(Fault::HeapHeaderInBand)) {
            write_header_in_band(object, resized);
        }
        let entry = RingEntry {
            pointer: tagged,
            size: new_size as u32,
            stack,
            task: current_task(),
            offset_log2: header.offset_log2,
            order: header.order,
            freed: false,
        };
        state.ring.push(entry);
        Ok(Resize::InPlace(tagged))
    });
    match resize {
        Ok(Resize::InPlace(tagged)) => Some(tagged),
        Ok(Resize::Move(old, old_size)) => {
            let new = allocate_with_stack(new_size, align, stack)?;
            // SAFETY: both are live objects of at least min(old, new) bytes; untagged copies
            // (the sizes are the heap's own, not the caller's).
            unsafe {
                core::ptr::copy_nonoverlapping(
                    untagged(old) as *const u8,
                    untagged(new) as *mut u8,
                    old_size.min(new_size),
                )
            };
            free(old);
            Some(new)
        }
        Err(bad) => {
            let bug = match bad {
                BadFree::Double => BugType::UseAfterFree,
                BadFree::Invalid => BugType::InvalidFree,
            };
            refuse_free(bug, pointer, reallocate as fn(u64, usize, usize) -> Option<u64> as usize as u64);
            core::hint::black_box(pointer);
            None
        }
    }
}

/// The table entry of the live object the ring entry names (its tag, starting at its address),
/// if that object is live now.
#[sanitize(kernel_hwaddress = "off")]
fn live_entry(table: &BlockTable, entry: &RingEntry) -> Option<ObjectEntry> {
    let object = untagged(entry.pointer);
    let (start, end) = range();
    if object < start + HEADER_BELOW || object >= end {
        return None;
    }
    let header = table.object(object);
    (header.state == LIVE && header.tag == tag_of(entry.pointer) && plausible(&header, object)).then_some(header)
}

/// The block table as the stack ring's classification asks it (ring.rs, `Objects`).
struct TableObjects<'a>(&'a BlockTable);

/// A table entry as a ring entry without a stack.
#[sanitize(kernel_hwaddress = "off")]
fn table_entry((object, entry): (u64, ObjectEntry)) -> RingEntry {
    RingEntry {
        pointer: with_tag(object, entry.tag),
        size: entry.size,
        stack: 0,
        task: 0,
        offset_log2: entry.offset_log2,
        order: entry.order,
        freed: entry.state == FREED,
    }
}

impl Objects for TableObjects<'_> {
    /// Live with the entry's size too: with MTE's 14 tags a stale entry often has the tag of
    /// the object live at its address now.
    #[sanitize(kernel_hwaddress = "off")]
    fn is_live(&self, entry: &RingEntry) -> bool {
        live_entry(self.0, entry).is_some_and(|live| live.size == entry.size)
    }

    #[sanitize(kernel_hwaddress = "off")]
    fn live_holding(&self, address: u64, tag: u8) -> Option<RingEntry> {
        let mut holding = self.0.holding(address);
        holding.find(|(_, entry)| entry.state == LIVE && entry.tag == tag).map(table_entry)
    }

    /// Every block within ADJACENT of the address holds the address, or the address ADJACENT
    /// before or after it (blocks are at least ADJACENT bytes, aligned to their size).
    #[sanitize(kernel_hwaddress = "off")]
    fn live_near(&self, address: u64, tag: u8) -> Option<RingEntry> {
        [address.wrapping_sub(ADJACENT), address, address + ADJACENT]
            .into_iter()
            .flat_map(|point| self.0.holding(point))
            .filter(|(_, entry)| entry.state == LIVE && entry.tag == tag)
            .map(table_entry)
            .filter(|entry| entry.distance(address) <= ADJACENT)
            .min_by_key(|entry| entry.distance(address))
    }

    #[sanitize(kernel_hwaddress = "off")]
    fn freed_holding(&self, address: u64, tag: u8, in_object: bool) -> Option<RingEntry> {
        let holding = self.0.holding(address).filter(|(_, entry)| entry.state == FREED && entry.tag == tag);
        holding.map(table_entry).find(|entry| !in_object || entry.object_contains(address))
    }
}

/// What the stack ring and the block table know about the object a faulting pointer meant
/// (ring.rs); None when the heap is locked (a report from inside the heap's own critical
/// section).
#[sanitize(kernel_hwaddress = "off")]
pub fn find_object(address: u64) -> Option<Found> {
    let state = STATE.try_lock()?;
    state.ring.find_object(address, &TableObjects(&state.table))
}

/// What the heap knows about a faulting address, for the record step: the object the ring
/// attributes it to, the heap's range and its stack-collection mode.
#[sanitize(kernel_hwaddress = "off")]
pub fn view(address: u64) -> HeapView {
    HeapView { found: find_object(address), range: range(), stack_mode: stacks().name() }
}

/// The heap audit the corpus runs after each case: the block table's free lists are sound
/// (blocks.rs), and every live object the stack ring remembers has a plausible table entry
/// (geometry inside the heap, its tag, its size) and the shadow the layout says (guard granules
/// invalid, the object's granules its tag, the slack invalid). Objects allocated before the
/// ring wrapped are not seen. The number of live objects checked, or what is wrong.
#[sanitize(kernel_hwaddress = "off")]
pub fn audit() -> Result<usize, &'static str> {
    locked(|state| {
        state.table.audit()?;
        let mut checked = 0;
        for (index, entry) in state.ring.newest_first().enumerate() {
            if entry.freed {
                continue;
            }
            let Some(header) = live_entry(&state.table, entry) else {
                continue;
            };
            let object = untagged(entry.pointer);
            // Only the newest entry about an address says what is there now (a reallocation in
            // place adds one, a later object may have the same tag); looked for only when the
            // header and the entry differ.
            let superseded = || state.ring.newest_first().take(index).any(|newer| untagged(newer.pointer) == object);
            if (header.size != entry.size || header.order != entry.order) && !superseded() {
                return Err("a live header disagrees with the ring");
            }
            let rounded = round_up(header.size as u64, GRANULE);
            let block = object - header.offset();
            let block_end = block + (1 << header.order);
            let used_in_last = header.size as u64 % GRANULE;
            let mut granule = object - HEADER_BELOW;
            while granule < block_end {
                let in_object = (object..object + rounded).contains(&granule);
                let short =
                    Tags::SHORT_GRANULES && in_object && granule + GRANULE == object + rounded && used_in_last != 0;
                let expected = match (in_object, short) {
                    (true, true) => used_in_last as u8,
                    (true, false) => header.tag,
                    (false, _) => INVALID,
                };
                let memory_tag = Tags::memory_tag(granule);
                // A short granule whose tag byte a reported store overwrote carries the
                // object's tag instead (abi.rs, `retag_short_granules`).
                let retagged = short && memory_tag == header.tag;
                if memory_tag != expected && !retagged {
                    return Err("a live block's shadow disagrees with its header");
                }
                if short && !retagged && Tags::object_tag(granule) != header.tag {
                    return Err("a live object's short granule lost its tag byte");
                }
                granule += GRANULE;
            }
            checked += 1;
        }
        Ok(checked)
    })
}

/// The newest ring entries about `pointer` (tests read the stacks recorded for an object).
#[sanitize(kernel_hwaddress = "off")]
pub fn newest_entry(pointer: u64, freed: bool) -> Option<RingEntry> {
    locked(|state| state.ring.newest_first().find(|entry| entry.pointer == pointer && entry.freed == freed).copied())
}

/// Block table statistics: bytes requested by users, bytes in allocated blocks.
#[sanitize(kernel_hwaddress = "off")]
pub fn usage() -> (usize, usize) {
    locked(|state| state.table.usage())
}

/// The size of the largest free block (0: none): an alignment up to half of it is served.
#[sanitize(kernel_hwaddress = "off")]
pub fn largest_free_block() -> u64 {
    locked(|state| state.table.largest_free_order().map_or(0, |order| 1 << order))
}

/// The kernel's global allocator.
pub struct SanitizerHeap;

// SAFETY: allocate returns blocks of at least layout.size() bytes aligned to layout.align(),
// owned by the caller until free; free and reallocate accept only live objects.
unsafe impl GlobalAlloc for SanitizerHeap {
    #[sanitize(kernel_hwaddress = "off")]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        allocate(layout.size(), layout.align()).map_or(core::ptr::null_mut(), |pointer| pointer as *mut u8)
    }

    #[sanitize(kernel_hwaddress = "off")]
    unsafe fn dealloc(&self, pointer: *mut u8, _layout: Layout) {
        free(pointer as u64)
    }

    #[sanitize(kernel_hwaddress = "off")]
    unsafe fn realloc(&self, pointer: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        reallocate(pointer as u64, layout.align(), new_size).map_or(core::ptr::null_mut(), |pointer| pointer as *mut u8)
    }
}

#[global_allocator]
static GLOBAL: SanitizerHeap = SanitizerHeap;
