//! The sanitizer heap: the kernel's global allocator, a tag layer over a buddy allocator.
//!
//! # Layout of a block
//!
//! `buddy_system_allocator` hands out power-of-two blocks. The tag layer puts one header granule
//! two granules below the object (at the block's start unless the alignment exceeds 32), a guard
//! granule right before the object, the object (its size rounded up to 16) and at least one
//! guard granule after it:
//!
//! ```text
//! block:  [ header | guard | object, 16-byte granules ... | guard | slack up to the power of two ]
//! tags:     0xFE     0xFE    T T T T ...                    0xFE    0xFE
//! ```
//!
//! The object's tag T comes from the tag storage's generator (storage.rs, shadow.rs) and is
//! written to the shadow of each of its granules and to the pointer's top byte. Header, guards
//! and slack keep the "invalid" tag 0xFE, so an access just left or right of an object always
//! mismatches (a redzone that Linux's SW_TAGS does not have: there, neighbours differ only by
//! tag, 1/238 collisions). Free re-tags the object 0xFE. The backing allocator only ever sees
//! untagged (0xFF, match-all) pointers, so its own instrumented accesses to free blocks pass.
//!
//! # Metadata that a recovered overflow cannot reach
//!
//! In recover mode a reported store the compiler inserted is carried out. The guards make sure
//! that no such store within one granule of an object lands in metadata: left of the object it
//! hits the guard, right of it the trailing guard; the header (and, once the block is free, the
//! buddy allocator's free-list link, the block's first word) is two granules away from its own
//! object and one guard granule away from the previous block's. Nothing reads the guards. The
//! cost is memory: a block holds `32 + round_up(size, 16) + 16` bytes rounded up to a power of
//! two (a 112-byte object takes a 256-byte block instead of 128); no instruction on the alloc
//! and free paths. The runtime's own intrinsics (abi.rs) never carry out a reported access.
//! `check_free` still checks the header (magic, state, tag, geometry inside the heap, and that
//! the shadow agrees), so a wild write further away is refused, not trusted.
//!
//! # Metadata: header and stack ring
//!
//! The header holds what the free path needs (requested size, block order, offset, tag, a
//! live/freed state and a live magic) and is the only way to recognise the start of a live
//! object. Stacks live apart, in a stack ring as in Linux's tag-based KASAN: every allocation
//! and free appends {tagged pointer, size, depot handle, task, alloc/free} to a ring of
//! `RING_ENTRIES`; a report searches it backward, newest first, for the object the faulting
//! pointer's tag belongs to, preferring an object that is live now. The header's first word
//! (the magic) is overwritten by the buddy allocator's free-list link once the block is free;
//! its second (size, offset, order, tag, state) is not, so a double free is recognised after
//! the ring wrapped, and the ring still names both stacks of a use-after-free until it wraps.
//!
//! # Stacks, locks and interrupts
//!
//! The stack of each alloc and free is collected outside the lock (`collect_stack`: a frame
//! record walk or a shadow-call-stack copy through `stacktrace::collect`, as Linux's SW_TAGS
//! saves them), in the mode chosen at run time ([`set_stacks`]: none, fp, scs, each with or without the depot; `-no-depot` collects the
//! trace and drops it: the walk's cost without the depot's). With
//! `kasan.stack_sample=N` one allocation stack in N is collected (free stacks always). The lock
//! covers the backing allocator, the header and the ring, and is taken with IRQs masked, so an
//! interrupt can never spin on a lock its own CPU holds. The heap refuses IRQ context (panics):
//! the tick path never allocates, which also keeps the depot's miss-path spin lock out of IRQs.
//!
//! # Hot path
//!
//! alloc: collect stack -> mask IRQs, lock, buddy alloc, draw a tag, header, ring entry, unlock
//! -> tag the object's shadow (one byte per granule). free: collect stack -> mask, lock, check
//! the pointer (tag vs shadow, header magic), re-tag 0xFE, ring entry, buddy free -> unlock.
//!
//! # Short granules
//!
//! With `--kasan-short-granules` (`full` only) an object whose size is not a multiple of 16 has
//! a short last granule (shadow.rs): its memory tag is the number of bytes used and its last
//! byte, past the object's end, holds the object's tag, so an access past the end inside that
//! granule is caught. Free re-tags every granule 0xFE as before; the tag byte stays behind in
//! memory nobody owns. A recovered store the compiler let through can overwrite the tag byte
//! (as in HWASan); the audit checks it.
//!
//! # Build variants
//!
//! Tags are assigned in every build: the shadow exists in all of them, and the free-path checks
//! (double free, invalid free) need them. Only `full` has compiler-inserted access checks; in
//! `prod` and `plain` the tags in pointers are ignored by the MMU (TBI) and by everything else.

use super::Tags;
use super::record::{self, HeapView};
use super::report::BugType;
use super::ring::{Found, Ring, RingEntry};
use super::storage::{TagStorage, tag_of, untagged, with_tag};
use crate::stacktrace::{self, Mode};
use crate::sync::IrqMask;
use buddy_system_allocator::Heap;
use core::alloc::{GlobalAlloc, Layout};
use core::sync::atomic::{AtomicU8, AtomicU64, Ordering};

/// Largest block: 2^(ORDER-1) bytes.
const ORDER: usize = 28;
const GRANULE: u64 = Tags::GRANULE;
const INVALID: u8 = Tags::INVALID;
/// The heap's size, taken from the start of free RAM.
pub const HEAP_SIZE: u64 = 16 << 20;

const LIVE_MAGIC: u64 = 0x4c49_5645_0000_0000;
/// `Header::state` of a live and of a freed object.
const LIVE: u8 = 0x4c;
const FREED: u8 = 0x46;
/// The header's distance below the object, and the object's least offset in its block: header
/// granule, then a guard granule, then the object.
const HEADER_BELOW: u64 = 2 * GRANULE;
/// The guard granule every block keeps after its object (the least slack).
const TRAILING_GUARD: u64 = GRANULE;

/// The header granule, two granules below each object (at the block's start when the object's
/// alignment is at most 32). Its first word is the word the buddy allocator's free-list link
/// overwrites when the block is free; everything a freed header must still say (state, tag,
/// offset) is in the second.
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

impl Header {
    fn offset(&self) -> u64 {
        1 << (self.offset_log2 & 31)
    }
}

struct State {
    backing: Heap<ORDER>,
    ring: Ring,
}

/// The heap's state. A raw spin mutex (counted like `IrqSpinLock`'s) rather than an
/// `IrqSpinLock`: a report raised inside the heap's own critical section must see the lock held
/// (`find_object`'s `try_lock`), which `IrqSpinLock` does not offer; `locked` masks IRQs around
/// every `lock`, as `IrqSpinLock` would.
static STATE: spin::mutex::Mutex<State, crate::sync::CountedSpin> =
    spin::mutex::Mutex::new(State { backing: Heap::new(), ring: Ring::new() });
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
    // SAFETY: [free_base, +size) is mapped RAM that nothing else uses (mm::Layout.free), given
    // to the heap once.
    unsafe { STATE.lock().backing.init(free_base as usize, size as usize) };
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
/// `IrqSpinLock`: a report needs `try_lock` on the same state (`find_object`).
#[sanitize(kernel_hwaddress = "off")]
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
    if size > u32::MAX as u64 || align > u16::MAX as u64 {
        return None;
    }
    let rounded = round_up(size, GRANULE);
    let offset = align.max(HEADER_BELOW);
    let block_size = (offset + rounded + TRAILING_GUARD).next_power_of_two().max(align);
    let layout = Layout::from_size_align(block_size as usize, align as usize).ok()?;
    let (block, tag) = locked(|state| {
        let block = state.backing.alloc(layout).ok()?.as_ptr() as u64;
        let tag = Tags::random_tag();
        let object = block + offset;
        let order = block_size.trailing_zeros() as u8;
        let header = Header {
            magic: LIVE_MAGIC ^ object,
            size: size as u32,
            offset_log2: offset.trailing_zeros() as u8,
            order,
            tag,
            state: LIVE,
        };
        // SAFETY: the header granule lies in the block just allocated (offset >= 32).
        unsafe { ((object - HEADER_BELOW) as *mut Header).write(header) };
        let pointer = with_tag(object, tag);
        let entry = RingEntry {
            pointer,
            size: size as u32,
            stack,
            task: current_task(),
            offset: offset as u16,
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

/// Why a free was refused.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum BadFree {
    Double,
    Invalid,
}

/// The header two granules below `object` (untagged, in the heap).
#[inline(always)]
fn header_of(object: u64) -> Header {
    // SAFETY: callers checked that object - 32 lies in the heap, mapped RAM; an untagged read.
    unsafe { ((object - HEADER_BELOW) as *const Header).read() }
}

/// Whether `header`'s geometry fits an object at `object` in the heap: the block it implies is
/// aligned, inside the heap, and holds header, guard, object and trailing guard.
#[inline(always)]
fn plausible(header: &Header, object: u64) -> bool {
    let (start, end) = range();
    let order = header.order as u64;
    let offset_log2 = header.offset_log2 as u64;
    if !(5..ORDER as u64).contains(&order) || !(5..=15).contains(&offset_log2) || offset_log2 >= order {
        return false;
    }
    let block = object.wrapping_sub(header.offset());
    let block_size = 1 << order;
    block.is_multiple_of(block_size)
        && block >= start
        && block <= end - block_size
        && header.offset() + round_up(header.size as u64, GRANULE) + TRAILING_GUARD <= block_size
}

/// Checks that `pointer` is the start of a live object with its tag (or the match-all tag,
/// which any access accepts too); its header if so.
#[sanitize(kernel_hwaddress = "off")]
fn check_free(state: &State, pointer: u64) -> Result<Header, BadFree> {
    let tag = tag_of(pointer);
    let address = untagged(pointer);
    let (start, end) = range();
    let tag_acceptable = Tags::is_object_tag(tag) || tag == Tags::MATCH_ALL;
    if !tag_acceptable || !address.is_multiple_of(GRANULE) || address < start + HEADER_BELOW || address >= end {
        return Err(BadFree::Invalid);
    }
    let header = header_of(address);
    let tag_matches = tag == Tags::MATCH_ALL || tag == header.tag;
    let live = header.state == LIVE && header.magic == LIVE_MAGIC ^ address && plausible(&header, address);
    if !live || !tag_matches {
        // Freed already? The header says so while the block is free or until it is reused (the
        // state byte is not the word the buddy allocator's free-list link overwrites); the ring
        // remembers recent frees of a block live again under another tag.
        let freed_header = header.state == FREED && tag_matches && plausible(&header, address);
        let freed_in_ring =
            state
                .ring
                .newest_first()
                .find(|entry| {
                    if tag == Tags::MATCH_ALL { untagged(entry.pointer) == address } else { entry.pointer == pointer }
                })
                .is_some_and(|entry| entry.freed);
        return Err(if freed_header || freed_in_ring { BadFree::Double } else { BadFree::Invalid });
    }
    // The shadow agrees with the header: the object's first granule (if it has one) carries its
    // tag, the guard granule before it is invalid.
    let first_granule_ok = header.size == 0 || Tags::object_tag(address) == header.tag;
    if !first_granule_ok || Tags::memory_tag(address - GRANULE) != INVALID {
        return Err(BadFree::Invalid);
    }
    Ok(header)
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
        let freed = Header { magic: 0, state: FREED, ..header };
        // SAFETY: the header granule of a live object (checked), still ours until dealloc.
        unsafe { ((object - HEADER_BELOW) as *mut Header).write(freed) };
        let entry = RingEntry {
            pointer: with_tag(object, header.tag),
            size: header.size,
            stack,
            task: current_task(),
            offset: header.offset() as u16,
            order: header.order,
            freed: true,
        };
        state.ring.push(entry);
        let layout = Layout::from_size_align(1 << header.order, GRANULE as usize).expect("a power of two");
        // SAFETY: block and layout are those of the live allocation the header describes.
        unsafe { state.backing.dealloc(core::ptr::NonNull::new(block as *mut u8).expect("heap block"), layout) };
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
        let resized = Header { size: new_size as u32, ..header };
        // SAFETY: the header granule of a live object (checked).
        unsafe { ((object - HEADER_BELOW) as *mut Header).write(resized) };
        let entry = RingEntry {
            pointer: tagged,
            size: new_size as u32,
            stack,
            task: current_task(),
            offset: header.offset() as u16,
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

/// Whether the ring entry's object is live now: its header says so, with the entry's tag.
#[sanitize(kernel_hwaddress = "off")]
fn is_live(entry: &RingEntry) -> bool {
    let object = untagged(entry.pointer);
    let (start, end) = range();
    if object < start + HEADER_BELOW || object >= end {
        return false;
    }
    let header = header_of(object);
    header.state == LIVE && header.magic == LIVE_MAGIC ^ object && header.tag == tag_of(entry.pointer)
}

/// What the stack ring knows about the object a faulting pointer meant (ring.rs); None when
/// the heap is locked (a report from inside the heap's own critical section).
#[sanitize(kernel_hwaddress = "off")]
pub fn find_object(address: u64) -> Found {
    // Live with the entry's size too: with MTE's 14 tags a stale entry often has the tag of the
    // object live at its address now.
    let live_now = |entry: &RingEntry| is_live(entry) && header_of(untagged(entry.pointer)).size == entry.size;
    STATE.try_lock()?.ring.find_object(address, live_now)
}

/// What the heap knows about a faulting address, for the record step: the object the ring
/// attributes it to, the heap's range and its stack-collection mode.
#[sanitize(kernel_hwaddress = "off")]
pub fn view(address: u64) -> HeapView {
    HeapView { found: find_object(address), range: range(), stack_mode: stacks().name() }
}

/// The heap audit the corpus runs after each case: every live object the stack ring remembers
/// has a plausible header (geometry inside the heap, its tag, its size) and the shadow the
/// layout says (header and guard granules invalid, the object's granules its tag, the slack
/// invalid). Objects allocated before the ring wrapped are not seen; the backing allocator's
/// free lists are private to it and are exercised by the caller's allocations instead. The
/// number of live objects checked, or what is wrong.
#[sanitize(kernel_hwaddress = "off")]
pub fn audit() -> Result<usize, &'static str> {
    locked(|state| {
        let mut checked = 0;
        for (index, entry) in state.ring.newest_first().enumerate() {
            if entry.freed || !is_live(entry) {
                continue;
            }
            let object = untagged(entry.pointer);
            let header = header_of(object);
            if !plausible(&header, object) {
                return Err("a live header is implausible");
            }
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
                if Tags::memory_tag(granule) != expected {
                    return Err("a live block's shadow disagrees with its header");
                }
                if short && Tags::object_tag(granule) != header.tag {
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

/// Backing allocator statistics: bytes requested by users, bytes in allocated blocks.
pub fn usage() -> (usize, usize) {
    locked(|state| (state.backing.stats_alloc_user(), state.backing.stats_alloc_actual()))
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
