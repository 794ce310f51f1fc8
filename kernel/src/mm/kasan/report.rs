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
//! BUG: KASAN: slab-use-after-free in kernel::tests::kasan::kasan_uaf_read+0x4c/0x130
//! Read of size 8 at addr 5aff000040123418 by task idle/0
//! Pointer tag: [5a], memory tag: [fe]
//!
//! Call trace:
//!   fp #0 0x...                      <- xtask appends function and file:line
//!
//! Allocated by task 0:
//!   fp #0 0x...
//!
//! Freed by task 0:
//!   fp #0 0x...
//!
//! The buggy address belongs to the object at ffff000040123400
//! The buggy address is located 24 bytes inside of
//!  64-byte region [ffff000040123400, ffff000040123440)
//!
//! Memory state around the buggy address:
//!  ffff000040123200: fe fe 5a 5a 5a 5a fe fe fe fe fe fe fe fe fe fe
//! >ffff000040123300: fe fe fe fe fe fe fe fe fe fe fe fe fe fe fe fe
//!                       ^
//! ==================================================================
//! ```
//!
//! With short granules (`--kasan-short-granules`) the memory tag of an object's partly used
//! last granule is its length (`0d`: 13 bytes used), as HWASan prints it, and a second table,
//! HWASan's "Tags for short granules around the buggy address", shows the tag in each short
//! granule's last byte.
//!
//! Linux's layout and bug names (6.3+): tools that parse Linux's KASAN reports parse these. The
//! function after `in` is the faulting one, `NAME+0xOFF/0xSIZE` from the kernel's own symbol
//! tables (the callsite table and `.ksyms`); the stacks are addresses that xtask symbolizes.
//! Object addresses are untagged, as Linux prints them.
//!
//! Policy, as Linux's: `kasan.fault=report` (the default) continues after a report,
//! `kasan.fault=panic` stops the kernel; without `kasan.multi_shot` only the first report is
//! printed (later ones are counted). [`recording`], the one scope in which tests provoke reports,
//! is multi-shot and never stops the kernel.

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
            Self::OutOfBounds => "slab-out-of-bounds",
            Self::UseAfterFree => "slab-use-after-free",
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

static PANIC_ON_FAULT: AtomicBool = AtomicBool::new(false);
static MULTI_SHOT: AtomicBool = AtomicBool::new(false);
static RECORDING: AtomicBool = AtomicBool::new(false);
static REPORTS: AtomicU64 = AtomicU64::new(0);
static LAST: spin::Mutex<Option<Report>> = spin::Mutex::new(None);

/// The report policy: stop the kernel after a report (`kasan.fault=panic`), print every report
/// rather than the first (`kasan.multi_shot`).
pub fn set_policy(panic_on_fault: bool, multi_shot: bool) {
    PANIC_ON_FAULT.store(panic_on_fault, Ordering::Relaxed);
    MULTI_SHOT.store(multi_shot, Ordering::Relaxed);
}

/// Reports so far (mismatches and bad frees, printed or not).
pub fn count() -> u64 {
    REPORTS.load(Ordering::SeqCst)
}

/// Runs `f` multi-shot without stopping the kernel; how many reports it caused (mismatches and bad frees) and the last.
pub fn recording(f: impl FnOnce()) -> (u64, Option<Report>) {
    let before = REPORTS.load(Ordering::SeqCst);
    *LAST.lock() = None;
    RECORDING.store(true, Ordering::SeqCst);
    f();
    #[cfg(feature = "mte")]
    {
        // A synchronous tag check fault resumed its context with checks suppressed (mte.rs); an
        // asynchronous one is reported at this check point.
        crate::arch::mte::resume_checks();
        super::mte::check_async(0);
    }
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

/// Reports an asynchronous tag check fault (MTE, `kasan.mode=async|asymm`), seen at a check
/// point after the access: the hardware kept no address, so the report has only the check
/// point's stack, in Linux's format for it.
#[cfg(feature = "mte")]
#[inline(never)]
#[sanitize(kernel_hwaddress = "off")]
pub fn report_async(pc: u64) {
    let first = REPORTS.fetch_add(1, Ordering::SeqCst) == 0;
    let recording = RECORDING.load(Ordering::SeqCst);
    if recording || first || MULTI_SHOT.load(Ordering::Relaxed) {
        defmt::error!("{=str}", RULE);
        defmt::error!("BUG: KASAN: invalid-access");
        defmt::error!("Asynchronous fault: no details available");
        defmt::error!("");
        defmt::error!("Call trace:");
        let trace = stacktrace::capture(stacktrace::Mode::FramePointer, TraceOptions::ALL);
        for (index, entry) in trace.entries().enumerate() {
            defmt::error!("  fp #{=usize} {=u64:#x}", index, entry.address);
        }
        defmt::error!("{=str}", RULE);
    }
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
    if recording {
        *LAST.lock() = Some(report);
    } else if PANIC_ON_FAULT.load(Ordering::Relaxed) {
        defmt::error!("Kernel panic - not syncing: kasan.fault=panic set ...");
        crate::power::exit(crate::power::ExitStatus::Panic);
    }
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
    let first = REPORTS.fetch_add(1, Ordering::SeqCst) == 0;
    let recording = RECORDING.load(Ordering::SeqCst);
    if recording || first || MULTI_SHOT.load(Ordering::Relaxed) {
        print(report);
    }
    if recording {
        *LAST.lock() = Some(*report);
    } else if PANIC_ON_FAULT.load(Ordering::Relaxed) {
        defmt::error!("Kernel panic - not syncing: kasan.fault=panic set ...");
        crate::power::exit(crate::power::ExitStatus::Panic);
    }
}

const RULE: &str = "==================================================================";

/// One line of text built on the stack (defmt has no runtime-width padding).
struct Line {
    bytes: [u8; 160],
    len: usize,
}

impl Line {
    fn new() -> Self {
        Self { bytes: [0; 160], len: 0 }
    }

    fn as_str(&self) -> &str {
        core::str::from_utf8(&self.bytes[..self.len]).unwrap_or("?")
    }
}

impl core::fmt::Write for Line {
    fn write_str(&mut self, text: &str) -> core::fmt::Result {
        let room = self.bytes.len() - self.len;
        let take = text.len().min(room);
        self.bytes[self.len..self.len + take].copy_from_slice(&text.as_bytes()[..take]);
        self.len += take;
        Ok(())
    }
}

/// `NAME+0xOFF/0xSIZE` of the function holding `pc`, from the callsite table and `.ksyms`.
fn write_symbol(line: &mut Line, pc: u64) {
    use core::fmt::Write;
    let function = crate::symbols::callsites::function_containing(pc);
    let name = function.and_then(|(start, _)| crate::symbols::Symbols::get()?.name_at(start));
    let _ = match (function, name) {
        (Some((start, next)), Some(name)) => write!(line, "{name}+{:#x}/{:#x}", pc - start, next - start),
        _ => write!(line, "{pc:#x}"),
    };
}

/// Granules per row of the memory state, and rows above and below the buggy one (Linux's).
const GRANULES_PER_ROW: u64 = 16;
const ROWS_AROUND: u64 = 2;

#[inline(never)]
#[sanitize(kernel_hwaddress = "off")]
fn print(report: &Report) {
    use core::fmt::Write;
    let task = crate::task::current().0;
    let task_name = crate::task::current_name();
    defmt::error!("{=str}", RULE);
    let mut title = Line::new();
    let _ = write!(title, "BUG: KASAN: {} in ", report.bug.name());
    write_symbol(&mut title, report.pc);
    defmt::error!("{=str}", title.as_str());
    match report.bug {
        BugType::DoubleFree | BugType::InvalidFree => {
            defmt::error!("Free of addr {=u64:016x} by task {=str}/{=usize}", report.address, task_name, task)
        }
        // A hardware tag check fault whose syndrome has no size (Linux prints none either).
        _ if report.size == 0 => defmt::error!(
            "{=str} at addr {=u64:016x} by task {=str}/{=usize}",
            if report.write { "Write" } else { "Read" },
            report.address,
            task_name,
            task
        ),
        _ => defmt::error!(
            "{=str} of size {=u64} at addr {=u64:016x} by task {=str}/{=usize}",
            if report.write { "Write" } else { "Read" },
            report.size,
            report.address,
            task_name,
            task
        ),
    }
    defmt::error!("Pointer tag: [{=u8:02x}], memory tag: [{=u8:02x}]", report.pointer_tag, report.memory_tag);
    defmt::error!("");
    // The faulting stack from the bad access (or the free's caller) outward; the whole trace,
    // runtime frames included, when that frame is not found.
    defmt::error!("Call trace:");
    let trace = stacktrace::capture(stacktrace::Mode::FramePointer, TraceOptions::ALL);
    let skip = trace.entries().position(|entry| entry.address == report.pc).unwrap_or(0);
    for (index, entry) in trace.entries().skip(skip).enumerate() {
        defmt::error!("  fp #{=usize} {=u64:#x}", index, entry.address);
    }
    if let Some(object) = report.object {
        print_saved("Allocated by", object.alloc_task, object.alloc_stack, report.stack_mode);
        print_saved("Freed by", object.free_task, object.free_stack, report.stack_mode);
        let start = untagged(object.address);
        let end = start + object.size as u64;
        let address = untagged(report.address);
        let (distance, place) = if address < start {
            (start - address, "to the left of")
        } else if address >= end {
            (address - end, "to the right of")
        } else {
            (address - start, "inside of")
        };
        defmt::error!("");
        defmt::error!("The buggy address belongs to the object at {=u64:016x}", start);
        defmt::error!("The buggy address is located {=u64} bytes {=str}", distance, place);
        defmt::error!(" {=u32}-byte region [{=u64:016x}, {=u64:016x})", object.size, start, end);
    } else {
        defmt::error!("");
        defmt::error!("The buggy address belongs to no object the stack ring remembers");
    }
    print_memory_state(untagged(report.address));
    defmt::error!("{=str}", RULE);
}

/// The memory tags of the rows around the buggy address, `>` on its row, `^` under its granule.
fn print_memory_state(address: u64) {
    use core::fmt::Write;
    let (start, end) = crate::mm::kasan::heap::range();
    if !(start..end).contains(&address) {
        return;
    }
    let row_bytes = GRANULES_PER_ROW * Tags::GRANULE;
    let buggy_row = address & !(row_bytes - 1);
    defmt::error!("");
    defmt::error!("Memory state around the buggy address:");
    let first = buggy_row.saturating_sub(ROWS_AROUND * row_bytes).max(start);
    let last = (buggy_row + ROWS_AROUND * row_bytes).min(end - row_bytes);
    let mut row = first;
    while row <= last {
        let mut line = Line::new();
        let _ = write!(line, "{}{:016x}:", if row == buggy_row { '>' } else { ' ' }, row);
        for granule in 0..GRANULES_PER_ROW {
            let _ = write!(line, " {:02x}", Tags::memory_tag(row + granule * Tags::GRANULE));
        }
        defmt::error!("{=str}", line.as_str());
        if row == buggy_row {
            let column = 1 + 16 + 1 + 3 * ((address - row) / Tags::GRANULE) as usize;
            let mut marker = Line::new();
            for _ in 0..column {
                let _ = marker.write_str(" ");
            }
            let _ = marker.write_str("^");
            defmt::error!("{=str}", marker.as_str());
        }
        row += row_bytes;
    }
    if Tags::SHORT_GRANULES {
        print_short_granule_tags(address, buggy_row, start, end);
    }
}

/// HWASan's second table, for kernels with short granules: the tag kept in the last byte of
/// each short granule (`..` for the others) in the buggy row and its neighbours, since the
/// memory state shows only the short granules' lengths.
fn print_short_granule_tags(address: u64, buggy_row: u64, start: u64, end: u64) {
    use core::fmt::Write;
    let row_bytes = GRANULES_PER_ROW * Tags::GRANULE;
    defmt::error!("Tags for short granules around the buggy address (one tag corresponds to 16 bytes):");
    let first = buggy_row.saturating_sub(row_bytes).max(start);
    let last = (buggy_row + row_bytes).min(end - row_bytes);
    let mut row = first;
    while row <= last {
        let mut line = Line::new();
        let _ = write!(line, "{}{:016x}:", if row == buggy_row { '>' } else { ' ' }, row);
        for granule in 0..GRANULES_PER_ROW {
            let granule = row + granule * Tags::GRANULE;
            let memory_tag = Tags::memory_tag(granule);
            if Tags::object_tag(granule) == memory_tag {
                let _ = line.write_str(" ..");
            } else {
                let _ = write!(line, " {:02x}", Tags::object_tag(granule));
            }
        }
        defmt::error!("{=str}", line.as_str());
        if row == buggy_row {
            let column = 1 + 16 + 1 + 3 * ((address - row) / Tags::GRANULE) as usize;
            let mut marker = Line::new();
            for _ in 0..column {
                let _ = marker.write_str(" ");
            }
            let _ = marker.write_str("^");
            defmt::error!("{=str}", marker.as_str());
        }
        row += row_bytes;
    }
}

/// A stack saved in the depot, in the symbolizable `fp #N` format.
fn print_saved(what: &str, task: Option<u16>, stack: u32, stack_mode: &str) {
    let Some(task) = task else {
        return;
    };
    defmt::error!("");
    defmt::error!("{=str} task {=u16}:", what, task);
    let mut frames = [0; stackdepot::MAX_FRAMES];
    match DepotHandle::from_raw(stack).and_then(|handle| stacktrace::DEPOT.fetch(handle, &mut frames)) {
        Some(frames) => {
            for (index, address) in frames.iter().enumerate() {
                defmt::error!("  fp #{=usize} {=u64:#x}", index, address);
            }
        }
        None => match crate::stacktrace::unsaved_reason(stack) {
            Some(reason) => defmt::error!("  {=str}", reason),
            None => defmt::error!("  (no stack saved: heap stack mode {=str})", stack_mode),
        },
    }
}

/// The frames of a saved stack (tests check which functions it names).
pub fn saved_frames(stack: u32, buffer: &mut [u64; stackdepot::MAX_FRAMES]) -> &[u64] {
    DepotHandle::from_raw(stack).and_then(|handle| stacktrace::DEPOT.fetch(handle, buffer)).unwrap_or(&[])
}
