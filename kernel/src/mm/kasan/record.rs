//! The sanitizer's record step: from a tag mismatch (the compiler's checks, abi.rs; an MTE tag
//! check fault, mte.rs), a refused free (heap.rs) or an asynchronous tag check fault, it
//! gathers everything the report prints (the bug, the access, the object the stack ring
//! attributes the address to, its allocation and free stacks from the depot, the memory tags
//! around the address) and hands it to the report (report.rs).
//!
//! What the heap knows about an address comes in as a [`HeapView`], which the heap fills: this
//! file calls neither the heap nor the MTE fault path, so both can call it.

use super::Tags;
use super::report::{self, BugType, Evidence, GRANULES_PER_ROW, MEMORY_ROWS, MemoryState, Object, Report, SavedStack};
use super::ring::Found;
use super::storage::{TagStorage, tag_of, untagged};
use crate::stacktrace;
use stackdepot::DepotHandle;
use unwind::TraceOptions;

/// One tag mismatch, as the compiler's check (or the MTE fault's syndrome) reported it.
#[derive(Clone, Copy, Debug, defmt::Format)]
pub struct Mismatch {
    pub address: u64,
    pub size: u64,
    pub write: bool,
    pub pointer_tag: u8,
    pub memory_tag: u8,
    /// Where the instrumented code resumes after the check.
    pub return_address: u64,
}

/// What the heap knows about a faulting address when it is reported.
#[derive(Clone, Copy)]
pub struct HeapView {
    /// What the stack ring and the block table attribute the address to (None when they know
    /// nothing, or the heap was locked).
    pub found: Option<Found>,
    /// The heap's address range (untagged): the memory state is shown only inside it.
    pub range: (u64, u64),
    /// The heap's stack-collection mode, named when a stack was not saved.
    pub stack_mode: &'static str,
}

/// Records a tag mismatch attributed by `heap`: classified from the ring's entry (a free entry
/// makes it a use-after-free, an allocation an out-of-bounds; no entry, an invalid access: a
/// wild or foreign-tagged pointer). Returns when recovering or recording.
#[inline(never)]
#[sanitize(kernel_hwaddress = "off")]
pub fn mismatch(mismatch: &Mismatch, heap: HeapView) {
    let bug = match heap.found {
        Some(found) if found.entry.freed => BugType::UseAfterFree,
        Some(_) => BugType::OutOfBounds,
        None => BugType::InvalidAccess,
    };
    let report = Report {
        bug,
        address: mismatch.address,
        size: mismatch.size,
        write: mismatch.write,
        pointer_tag: mismatch.pointer_tag,
        memory_tag: mismatch.memory_tag,
        pc: mismatch.return_address,
        object: heap.found.map(object_of),
        stack_mode: heap.stack_mode,
    };
    report::publish(&gather(report, &heap));
}

/// Records a double or invalid free (or a reallocation of a freed object: `bug` is then a
/// use-after-free) of `pointer`, found by the heap's free path. `memory_tag` is the tag at the
/// pointer (None: not heap memory); `free_function` is the start of the heap function that
/// refused it: the report names the frame after it.
#[inline(never)]
#[sanitize(kernel_hwaddress = "off")]
pub fn bad_free(bug: BugType, pointer: u64, memory_tag: Option<u8>, free_function: u64, heap: HeapView) {
    // Where the free was called: the frame after the heap's free.
    let trace = stacktrace::capture(stacktrace::Mode::DEFAULT, TraceOptions::ALL);
    let mut entries = trace.entries().map(|entry| entry.address);
    let pc = entries
        .by_ref()
        .find(|&address| {
            crate::symbols::callsites::function_containing(address).is_some_and(|(start, _)| start == free_function)
        })
        .and_then(|_| entries.next())
        .unwrap_or(0);
    let report = Report {
        bug,
        address: pointer,
        // A reallocation of a freed object reads it (Linux's krealloc checks one byte).
        size: if bug == BugType::UseAfterFree { 1 } else { 0 },
        write: bug != BugType::UseAfterFree,
        pointer_tag: tag_of(pointer),
        memory_tag: memory_tag.unwrap_or(Tags::MATCH_ALL),
        pc,
        object: heap.found.map(object_of),
        stack_mode: heap.stack_mode,
    };
    report::publish(&gather(report, &heap));
}

/// Records an asynchronous tag check fault (MTE, `kasan.mode=async|asymm`), seen at a check
/// point after the access: the hardware kept no address, so the report has only the check
/// point's stack.
#[cfg(feature = "mte")]
#[inline(never)]
#[sanitize(kernel_hwaddress = "off")]
pub fn asynchronous(pc: u64) {
    let report = Report {
        bug: BugType::InvalidAccess,
        address: 0,
        size: 0,
        write: false,
        pointer_tag: Tags::MATCH_ALL,
        memory_tag: Tags::MATCH_ALL,
        pc,
        object: None,
        stack_mode: "",
    };
    report::publish(&Evidence {
        report,
        allocated: SavedStack::NONE,
        freed: SavedStack::NONE,
        memory: None,
        asynchronous: true,
    });
}

/// The frames of a saved stack (tests check which functions it names).
pub fn saved_frames(stack: u32, buffer: &mut [u64; stackdepot::MAX_FRAMES]) -> &[u64] {
    DepotHandle::from_raw(stack).and_then(|handle| stacktrace::DEPOT.fetch(handle, buffer)).unwrap_or(&[])
}

/// The report's object from what the ring found: its entry and, when that entry is a free, the
/// allocation entry before it; no stacks when the ring no longer remembers the object.
fn object_of(found: Found) -> Object {
    let Found { entry, allocation, remembered } = found;
    let (alloc, free) = match (remembered, entry.freed) {
        (false, _) => (None, None),
        (true, true) => (allocation, Some(entry)),
        (true, false) => (Some(entry), None),
    };
    Object {
        address: entry.pointer,
        size: entry.size,
        alloc_stack: alloc.map_or(0, |entry| entry.stack),
        alloc_task: alloc.map(|entry| entry.task),
        free_stack: free.map_or(0, |entry| entry.stack),
        free_task: free.map(|entry| entry.task),
        remembered,
    }
}

/// Everything `report` prints beside the report itself: the object's stacks and the memory
/// state around the address.
#[sanitize(kernel_hwaddress = "off")]
fn gather(report: Report, heap: &HeapView) -> Evidence {
    let (allocated, freed) = match report.object {
        Some(object) => (saved(object.alloc_task, object.alloc_stack), saved(object.free_task, object.free_stack)),
        None => (SavedStack::NONE, SavedStack::NONE),
    };
    Evidence {
        report,
        allocated,
        freed,
        memory: memory_state(heap.range, untagged(report.address)),
        asynchronous: false,
    }
}

/// The stack of `task`'s allocation or free, from the depot (or why it was not saved).
fn saved(task: Option<u16>, stack: u32) -> SavedStack {
    let mut saved = SavedStack { task, ..SavedStack::NONE };
    if task.is_none() {
        return saved;
    }
    let mut frames = [0; stackdepot::MAX_FRAMES];
    match DepotHandle::from_raw(stack).and_then(|handle| stacktrace::DEPOT.fetch(handle, &mut frames)) {
        Some(fetched) => {
            let depth = fetched.len();
            saved.frames[..depth].copy_from_slice(fetched);
            saved.depth = Some(depth);
        }
        None => saved.unsaved_reason = stacktrace::unsaved_reason(stack),
    }
    saved
}

/// The memory tags of the rows around `address` (untagged), `report::ROWS_AROUND` on each side
/// of its row, clipped to the heap; None when the address is not in the heap.
#[sanitize(kernel_hwaddress = "off")]
fn memory_state((start, end): (u64, u64), address: u64) -> Option<MemoryState> {
    if !(start..end).contains(&address) {
        return None;
    }
    let row_bytes = GRANULES_PER_ROW as u64 * Tags::GRANULE;
    let buggy_row = address & !(row_bytes - 1);
    let first_row = buggy_row.saturating_sub(report::ROWS_AROUND * row_bytes).max(start);
    let last_row = (buggy_row + report::ROWS_AROUND * row_bytes).min(end - row_bytes);
    let mut memory = MemoryState {
        address,
        row_bytes,
        first_row,
        rows: 0,
        memory_tags: [[0; GRANULES_PER_ROW]; MEMORY_ROWS],
        short_granule_tags: None,
    };
    let mut short_granule_tags = [[None; GRANULES_PER_ROW]; MEMORY_ROWS];
    let mut row = first_row;
    while row <= last_row && memory.rows < MEMORY_ROWS {
        let tags = memory.memory_tags[memory.rows].iter_mut().zip(&mut short_granule_tags[memory.rows]);
        for (granule, (memory_tag, short_granule_tag)) in tags.enumerate() {
            let granule_address = row + granule as u64 * Tags::GRANULE;
            *memory_tag = Tags::memory_tag(granule_address);
            if Tags::SHORT_GRANULES {
                let object_tag = Tags::object_tag(granule_address);
                *short_granule_tag = (object_tag != *memory_tag).then_some(object_tag);
            }
        }
        memory.rows += 1;
        row += row_bytes;
    }
    if Tags::SHORT_GRANULES {
        memory.short_granule_tags = Some(short_granule_tags);
    }
    Some(memory)
}
