//! KASAN-style reports of the sanitizer heap: what went wrong, on which object, and the stacks
//! that allocated and freed it.
//!
//! Two sources: tag mismatches from the compiler's checks (abi.rs, after it decoded address,
//! size and direction) and the heap's free path (double and invalid free). Both callers pass
//! the object the stack ring (ring.rs) attributes the address to, so this module depends on
//! neither the heap nor the runtime. A mismatch is classified from that entry: the newest with
//! the pointer's tag whose
//! block holds the address; a free entry makes it a use-after-free, an allocation an
//! out-of-bounds; no entry, an invalid access (a wild or foreign-tagged pointer). The report:
//!
//! ```text
//! ==================================================================
//! BUG: KASAN: use-after-free
//! Read of size 8 at addr 0x5a...: pointer tag 0x5a, memory tag 0xfe, by task 0 (idle)
//! The buggy address belongs to the object at 0x5a... of 24 bytes, 16 bytes inside it
//! Faulting stack:
//!   fp #0 0x...                      <- xtask appends function and file:line
//! Allocated by task 0:
//!   fp #0 0x...
//! Freed by task 0:
//!   fp #0 0x...
//! ==================================================================
//! ```
//!
//! Then the kernel stops (panic mode, the default) or continues (recover mode: `kasan=recover`
//! on the command line, or inside [`recording`], the one scope tests use to provoke reports and
//! check the last one).

use super::ring::RingEntry;
use super::storage::{TagStorage, Tags, tag_of, untagged};
use crate::stacktrace;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use stackdepot::DepotHandle;
use unwind::TraceOptions;

#[derive(Clone, Copy, PartialEq, Eq, Debug, defmt::Format)]
pub enum BugType {
    OutOfBounds,
    UseAfterFree,
    DoubleFree,
    InvalidFree,
    /// A mismatch the ring cannot attribute to an object.
    InvalidAccess,
}

impl BugType {
    pub fn name(self) -> &'static str {
        match self {
            Self::OutOfBounds => "out-of-bounds",
            Self::UseAfterFree => "use-after-free",
            Self::DoubleFree => "double-free",
            Self::InvalidFree => "invalid-free",
            Self::InvalidAccess => "invalid-access",
        }
    }
}

/// The object a report is about, from the stack ring.
#[derive(Clone, Copy, Debug)]
pub struct Object {
    /// Tagged address of the object.
    pub address: u64,
    pub size: u32,
    /// Raw depot handles (0: not saved) and task ids.
    pub alloc_stack: u32,
    pub alloc_task: Option<u16>,
    pub free_stack: u32,
    pub free_task: Option<u16>,
}

/// One tag mismatch, as the compiler's check reported it.
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

/// What the ring knows about a faulting address's object: the entry, and the allocation entry
/// before it when that entry is a free.
pub type Found = Option<(RingEntry, Option<RingEntry>)>;

/// One report, as recorded for tests.
#[derive(Clone, Copy, Debug)]
pub struct Report {
    pub bug: BugType,
    /// The access (or the pointer freed).
    pub address: u64,
    pub size: u64,
    pub write: bool,
    pub pointer_tag: u8,
    pub memory_tag: u8,
    /// Where the bad access or free happened (PAC-stripped return address of the check).
    pub pc: u64,
    pub object: Option<Object>,
    /// The heap's stack-collection mode, named when a stack was not saved.
    pub stack_mode: &'static str,
}

static RECOVER: AtomicBool = AtomicBool::new(false);
static RECORDING: AtomicBool = AtomicBool::new(false);
static REPORTS: AtomicU64 = AtomicU64::new(0);
static LAST: spin::Mutex<Option<Report>> = spin::Mutex::new(None);

/// Continue after reports instead of stopping the kernel (`kasan=recover`).
pub fn set_recover(recover: bool) {
    RECOVER.store(recover, Ordering::Relaxed);
}

/// Runs `f` in recover mode; how many reports it caused (mismatches and bad frees) and the last.
pub fn recording(f: impl FnOnce()) -> (u64, Option<Report>) {
    let before = REPORTS.load(Ordering::SeqCst);
    *LAST.lock() = None;
    RECORDING.store(true, Ordering::SeqCst);
    f();
    RECORDING.store(false, Ordering::SeqCst);
    (REPORTS.load(Ordering::SeqCst) - before, LAST.lock().take())
}

/// Reports a tag mismatch from the compiler's checks, attributed to `found`. Returns when
/// recovering or recording.
#[sanitize(kernel_hwaddress = "off")]
pub fn report_mismatch(mismatch: &Mismatch, found: Found, stack_mode: &'static str) {
    let bug = match found {
        Some((entry, _)) if entry.freed => BugType::UseAfterFree,
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
        object: found.map(|(entry, allocation)| object_of(entry, allocation)),
        stack_mode,
    };
    publish(&report);
}

/// What the heap's free path knows about a refused free.
pub struct BadFree {
    pub bug: BugType,
    pub pointer: u64,
    /// The memory tag at the pointer, or None when it is not heap memory.
    pub memory_tag: Option<u8>,
    pub found: Found,
    /// The start of the heap's free function: the report names the frame after it.
    pub free_function: u64,
    pub stack_mode: &'static str,
}

/// Reports a double or invalid free, found by the heap's free path.
#[inline(never)]
#[sanitize(kernel_hwaddress = "off")]
pub fn report_bad_free(bad: BadFree) {
    let BadFree { bug, pointer, memory_tag, found, free_function, stack_mode } = bad;
    // Where the free was called: the frame after the heap's free.
    let trace = stacktrace::capture(stacktrace::Mode::FramePointer, TraceOptions::ALL);
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
        object: found.map(|(entry, allocation)| object_of(entry, allocation)),
        stack_mode,
    };
    publish(&report);
}

fn object_of(entry: RingEntry, allocation: Option<RingEntry>) -> Object {
    let (alloc, free) = if entry.freed { (allocation, Some(entry)) } else { (Some(entry), None) };
    Object {
        address: entry.pointer,
        size: entry.size,
        alloc_stack: alloc.map_or(0, |entry| entry.stack),
        alloc_task: alloc.map(|entry| entry.task),
        free_stack: free.map_or(0, |entry| entry.stack),
        free_task: free.map(|entry| entry.task),
    }
}

#[sanitize(kernel_hwaddress = "off")]
fn publish(report: &Report) {
    REPORTS.fetch_add(1, Ordering::SeqCst);
    print(report);
    let recording = RECORDING.load(Ordering::SeqCst);
    if recording {
        *LAST.lock() = Some(*report);
    }
    if !recording && !RECOVER.load(Ordering::Relaxed) {
        crate::exit(crate::ExitStatus::Panic);
    }
}

const RULE: &str = "==================================================================";

#[inline(never)]
#[sanitize(kernel_hwaddress = "off")]
fn print(report: &Report) {
    defmt::error!("{=str}", RULE);
    defmt::error!("BUG: KASAN: {=str}", report.bug.name());
    let task = crate::task::current().0;
    match report.bug {
        BugType::DoubleFree | BugType::InvalidFree => defmt::error!(
            "Free of addr {=u64:#x}: pointer tag {=u8:#x}, memory tag {=u8:#x}, by task {=usize}",
            report.address,
            report.pointer_tag,
            report.memory_tag,
            task
        ),
        _ => defmt::error!(
            "{=str} of size {=u64} at addr {=u64:#x}: pointer tag {=u8:#x}, memory tag {=u8:#x}, by task {=usize}",
            if report.write { "Write" } else { "Read" },
            report.size,
            report.address,
            report.pointer_tag,
            report.memory_tag,
            task
        ),
    }
    if let Some(object) = report.object {
        let offset = untagged(report.address) as i64 - untagged(object.address) as i64;
        let (distance, place) = if offset < 0 {
            (-offset, "to the left of")
        } else if offset >= object.size as i64 {
            (offset - object.size as i64, "to the right of")
        } else {
            (offset, "inside")
        };
        defmt::error!(
            "The buggy address belongs to the object at {=u64:#x} of {=u32} bytes: {=i64} bytes {=str} it (offset {=i64})",
            object.address,
            object.size,
            distance,
            place,
            offset
        );
    } else {
        defmt::error!("The buggy address belongs to no object the stack ring remembers");
    }
    // The faulting stack from the bad access (or the free's caller) outward; the whole trace,
    // runtime frames included, when that frame is not found.
    defmt::error!("Faulting stack:");
    let trace = stacktrace::capture(stacktrace::Mode::FramePointer, TraceOptions::ALL);
    let skip = trace.entries().position(|entry| entry.address == report.pc).unwrap_or(0);
    for (index, entry) in trace.entries().skip(skip).enumerate() {
        defmt::error!("  fp #{=usize} {=u64:#x}", index, entry.address);
    }
    if let Some(object) = report.object {
        print_saved("Allocated by", object.alloc_task, object.alloc_stack, report.stack_mode);
        print_saved("Freed by", object.free_task, object.free_stack, report.stack_mode);
    }
    defmt::error!("{=str}", RULE);
}

/// A stack saved in the depot, in the symbolizable `fp #N` format.
fn print_saved(what: &str, task: Option<u16>, stack: u32, stack_mode: &str) {
    let Some(task) = task else {
        return;
    };
    defmt::error!("{=str} task {=u16}:", what, task);
    let mut frames = [0; stackdepot::MAX_FRAMES];
    match DepotHandle::from_raw(stack).and_then(|handle| stacktrace::DEPOT.fetch(handle, &mut frames)) {
        Some(frames) => {
            for (index, address) in frames.iter().enumerate() {
                defmt::error!("  fp #{=usize} {=u64:#x}", index, address);
            }
        }
        None => defmt::error!("  (no stack saved: heap stack mode {=str})", stack_mode),
    }
}

/// The frames of a saved stack (tests check which functions it names).
pub fn saved_frames(stack: u32, buffer: &mut [u64; stackdepot::MAX_FRAMES]) -> &[u64] {
    DepotHandle::from_raw(stack).and_then(|handle| stacktrace::DEPOT.fetch(handle, buffer)).unwrap_or(&[])
}
