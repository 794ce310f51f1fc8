//! KASAN-style reports of the sanitizer heap: what went wrong, on which object, and the stacks
//! that allocated and freed it.
//!
//! A report is handed everything it prints ([`Evidence`]): the sanitizer's record step
//! (record.rs) gathers it from a tag mismatch of the compiler's checks (abi.rs), an MTE tag check
//! fault (mte.rs) or the heap's free path (double and invalid free): the bug, the access, the
//! object the stack ring attributes the address to, its allocation and free stacks and the
//! memory state around the address. This module reads no heap, tag storage or hardware state;
//! it applies the policy, counts, keeps the last report for the recording scope
//! (recording.rs) and prints. The report:
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
//! An object the stack ring no longer remembers (the heap's block table still knows its address,
//! size and state) has the line `(object not remembered): ...` where its stacks would be: no
//! other object's stacks stand in for its own.
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
//! printed (later ones are counted). The recording scope, in which tests provoke reports, is
//! multi-shot and never stops the kernel.

use super::storage::untagged;
use crate::stacktrace;
use crate::sync::IrqSpinLock;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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
    /// Whether the stack ring still remembers the object (else it came from the heap's block
    /// table, and has no stacks).
    pub remembered: bool,
}

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

/// A stack the depot saved for the object (its allocation or its free), as the report prints it.
#[derive(Clone, Copy)]
pub struct SavedStack {
    /// The task that allocated or freed; None when the ring has no such entry (nothing printed).
    pub task: Option<u16>,
    /// The saved frames, innermost first: `frames[..depth]`; None when the depot has no stack.
    pub depth: Option<usize>,
    pub frames: [u64; stackdepot::MAX_FRAMES],
    /// Why no stack was saved (`stacktrace::unsaved_reason`), when the handle says; else the
    /// report names the heap's stack mode.
    pub unsaved_reason: Option<&'static str>,
}

impl SavedStack {
    /// No ring entry: nothing to print.
    pub const NONE: Self = Self { task: None, depth: None, frames: [0; stackdepot::MAX_FRAMES], unsaved_reason: None };
}

/// Granules per row of the memory state, and rows above and below the buggy one (Linux's).
pub const GRANULES_PER_ROW: usize = 16;
pub const ROWS_AROUND: u64 = 2;
/// Rows the memory state can hold: the buggy one and `ROWS_AROUND` on each side.
pub const MEMORY_ROWS: usize = 2 * ROWS_AROUND as usize + 1;

/// The memory tags around a buggy address in the heap, read when the report was recorded.
#[derive(Clone, Copy)]
pub struct MemoryState {
    /// The buggy address (untagged).
    pub address: u64,
    /// Bytes per row (`GRANULES_PER_ROW` granules), the first row shown and the number shown.
    pub row_bytes: u64,
    pub first_row: u64,
    pub rows: usize,
    /// The memory tag of each granule of each row.
    pub memory_tags: [[u8; GRANULES_PER_ROW]; MEMORY_ROWS],
    /// With short granules: each granule's object tag where it differs from its memory tag (a
    /// short granule's tag byte), None where they agree (HWASan's second table).
    pub short_granule_tags: Option<[[Option<u8>; GRANULES_PER_ROW]; MEMORY_ROWS]>,
}

impl MemoryState {
    /// The address of the row `row` (0: the first shown).
    fn row(&self, row: usize) -> u64 {
        self.first_row + row as u64 * self.row_bytes
    }

    /// The row holding the buggy address.
    fn buggy_row(&self) -> u64 {
        self.address & !(self.row_bytes - 1)
    }

    /// The column of the `^` under the buggy granule: past `>`, 16 digits, `:` and three
    /// characters per granule before it.
    fn marker_column(&self) -> usize {
        let granule = self.row_bytes / GRANULES_PER_ROW as u64;
        1 + 16 + 1 + 3 * ((self.address - self.buggy_row()) / granule) as usize
    }
}

/// Everything one report prints, gathered by the record step (record.rs).
#[derive(Clone, Copy)]
pub struct Evidence {
    pub report: Report,
    /// The object's allocation and free stacks (task None when the ring has no such entry).
    pub allocated: SavedStack,
    pub freed: SavedStack,
    /// The memory tags around the buggy address; None when it is not in the heap.
    pub memory: Option<MemoryState>,
    /// An asynchronous MTE tag check fault: the hardware kept no address, so the report has
    /// only the check point's stack, in Linux's format for it.
    pub asynchronous: bool,
}

static PANIC_ON_FAULT: AtomicBool = AtomicBool::new(false);
static MULTI_SHOT: AtomicBool = AtomicBool::new(false);
static RECORDING: AtomicBool = AtomicBool::new(false);
/// Inside a counting scope (recording.rs): reports are counted and kept, not printed.
static COUNTING: AtomicBool = AtomicBool::new(false);
static REPORTS: AtomicU64 = AtomicU64::new(0);
/// The last report while recording: written by the reporting path (a task, or an exception
/// taken on it), read by the recording scope.
static LAST: IrqSpinLock<Option<Report>> = IrqSpinLock::new(None);

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

/// Starts recording (the recording scope, recording.rs): every report is printed and kept,
/// none stops the kernel. The report count so far, for [`stop_recording`].
pub fn start_recording() -> u64 {
    let before = REPORTS.load(Ordering::SeqCst);
    *LAST.lock() = None;
    RECORDING.store(true, Ordering::SeqCst);
    before
}

/// Starts recording without printing (the recording scope's counting mode): the report count
/// before.
pub fn start_counting() -> u64 {
    COUNTING.store(true, Ordering::SeqCst);
    start_recording()
}

/// Stops recording: the reports since [`start_recording`] returned `before`, and the last.
pub fn stop_recording(before: u64) -> (u64, Option<Report>) {
    RECORDING.store(false, Ordering::SeqCst);
    COUNTING.store(false, Ordering::SeqCst);
    (REPORTS.load(Ordering::SeqCst) - before, LAST.lock().take())
}

/// Counts a report, prints it when the policy says so, keeps it when recording, and stops the
/// kernel under `kasan.fault=panic`. Returns when recovering or recording.
#[inline(never)]
#[sanitize(kernel_hwaddress = "off")]
pub fn publish(evidence: &Evidence) {
    let first = REPORTS.fetch_add(1, Ordering::SeqCst) == 0;
    let recording = RECORDING.load(Ordering::SeqCst);
    let counting = recording && COUNTING.load(Ordering::SeqCst);
    if !counting && (recording || first || MULTI_SHOT.load(Ordering::Relaxed)) {
        if evidence.asynchronous {
            print_asynchronous();
        } else {
            print(evidence);
        }
    }
    if recording {
        *LAST.lock() = Some(evidence.report);
    } else if PANIC_ON_FAULT.load(Ordering::Relaxed) {
        defmt::error!("Kernel panic - not syncing: kasan.fault=panic set ...");
        crate::power::exit(crate::power::ExitStatus::Panic);
    }
}

/// An asynchronous tag check fault's report: no address, the check point's stack.
#[inline(never)]
#[sanitize(kernel_hwaddress = "off")]
fn print_asynchronous() {
    defmt::error!("{=str}", RULE);
    defmt::error!("BUG: KASAN: invalid-access");
    defmt::error!("Asynchronous fault: no details available");
    defmt::error!("");
    defmt::error!("Call trace:");
    let trace = stacktrace::capture(stacktrace::Mode::DEFAULT, TraceOptions::ALL);
    for (index, entry) in trace.entries().enumerate() {
        defmt::error!("  fp #{=usize} {=u64:#x}", index, entry.address);
    }
    defmt::error!("{=str}", RULE);
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

#[inline(never)]
#[sanitize(kernel_hwaddress = "off")]
fn print(evidence: &Evidence) {
    use core::fmt::Write;
    let report = &evidence.report;
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
    // runtime frames included, when that frame is not found. `fp #N` is the report's frame
    // format whatever the walker: the default one (SFrame in a build without frame pointers).
    defmt::error!("Call trace:");
    let trace = stacktrace::capture(stacktrace::Mode::DEFAULT, TraceOptions::ALL);
    let skip = trace.entries().position(|entry| entry.address == report.pc).unwrap_or(0);
    for (index, entry) in trace.entries().skip(skip).enumerate() {
        defmt::error!("  fp #{=usize} {=u64:#x}", index, entry.address);
    }
    if let Some(object) = report.object {
        if object.remembered {
            print_saved("Allocated by", &evidence.allocated, report.stack_mode);
            print_saved("Freed by", &evidence.freed, report.stack_mode);
        } else {
            defmt::error!("");
            defmt::error!("(object not remembered): the stack ring no longer holds its allocation or free");
        }
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
    if let Some(memory) = &evidence.memory {
        print_memory_state(memory);
    }
    defmt::error!("{=str}", RULE);
}

/// The memory tags of the rows around the buggy address, `>` on its row, `^` under its granule.
fn print_memory_state(memory: &MemoryState) {
    use core::fmt::Write;
    defmt::error!("");
    defmt::error!("Memory state around the buggy address:");
    for (index, tags) in memory.memory_tags.iter().enumerate().take(memory.rows) {
        let row = memory.row(index);
        let mut line = Line::new();
        let _ = write!(line, "{}{:016x}:", if row == memory.buggy_row() { '>' } else { ' ' }, row);
        for tag in tags {
            let _ = write!(line, " {tag:02x}");
        }
        defmt::error!("{=str}", line.as_str());
        if row == memory.buggy_row() {
            print_marker(memory.marker_column());
        }
    }
    if let Some(short_granule_tags) = &memory.short_granule_tags {
        print_short_granule_tags(memory, short_granule_tags);
    }
}

/// The `^` under the buggy granule.
fn print_marker(column: usize) {
    use core::fmt::Write;
    let mut marker = Line::new();
    for _ in 0..column {
        let _ = marker.write_str(" ");
    }
    let _ = marker.write_str("^");
    defmt::error!("{=str}", marker.as_str());
}

/// HWASan's second table, for kernels with short granules: the tag kept in the last byte of
/// each short granule (`..` for the others) in the buggy row and its neighbours, since the
/// memory state shows only the short granules' lengths.
fn print_short_granule_tags(memory: &MemoryState, tags: &[[Option<u8>; GRANULES_PER_ROW]; MEMORY_ROWS]) {
    use core::fmt::Write;
    defmt::error!("Tags for short granules around the buggy address (one tag corresponds to 16 bytes):");
    let buggy_row = memory.buggy_row();
    for (index, row_tags) in tags.iter().enumerate().take(memory.rows) {
        let row = memory.row(index);
        if row + memory.row_bytes < buggy_row || row > buggy_row + memory.row_bytes {
            continue;
        }
        let mut line = Line::new();
        let _ = write!(line, "{}{:016x}:", if row == buggy_row { '>' } else { ' ' }, row);
        for tag in row_tags {
            let _ = match tag {
                None => line.write_str(" .."),
                Some(tag) => write!(line, " {tag:02x}"),
            };
        }
        defmt::error!("{=str}", line.as_str());
        if row == buggy_row {
            print_marker(memory.marker_column());
        }
    }
}

/// A stack saved in the depot, in the symbolizable `fp #N` format.
fn print_saved(what: &str, saved: &SavedStack, stack_mode: &str) {
    let Some(task) = saved.task else {
        return;
    };
    defmt::error!("");
    defmt::error!("{=str} task {=u16}:", what, task);
    match saved.depth {
        Some(depth) => {
            for (index, address) in saved.frames[..depth].iter().enumerate() {
                defmt::error!("  fp #{=usize} {=u64:#x}", index, address);
            }
        }
        None => match saved.unsaved_reason {
            Some(reason) => defmt::error!("  {=str}", reason),
            None => defmt::error!("  (no stack saved: heap stack mode {=str})", stack_mode),
        },
    }
}
