//! `save_stack(mode)`: frame-pointer, shadow-call-stack or SFrame traces of the running context
//! (task or IRQ), optionally deduplicated in the stack depot; and the backtraces printed by reports.
//!
//! Glue between crates/unwind (the walkers), the stack slots (task/stacks.rs: which stacks are
//! declared to the walker, in the order a walk may move between them) and crates/stackdepot.
//! Every caller goes through [`collect`] (or [`capture`], which keeps a [`Trace`] for cold
//! paths): the heap, `save_stack`, reports, the timer tick, the benches. It writes return
//! addresses into the caller's buffer, PAC-stripped by the kernel's address layout (kernel code is
//! in TTBR1); an interrupted context's PC is exact. Returns hijacked by kretprobes show their real
//! address (`probes::kretprobe::Repair`), and so do returns hijacked by the function-graph tracer
//! (`ftrace::graph`), asked only when a return may be hijacked in the walked contexts. xtask
//! symbolizes lines of the form `  fp #N 0x...`. In a build without frame pointers (`nofp`)
//! every frame-record walk is refused and [`Mode::DEFAULT`] is the SFrame walk.

use crate::arch::cpu;
use crate::arch::exception::ExceptionFrame;
use crate::arch::percpu;
use crate::arch::uninstrumented;
use crate::inject::{self, Fault};
use crate::probes::kretprobe::{self, Repair};
use crate::sync::{IrqSpinLock, StaticBlocks};
use crate::task::stacks::{self, SLOT_SIZE, Slot};
use core::cell::UnsafeCell;
use core::mem::MaybeUninit;
use core::sync::atomic::{AtomicPtr, AtomicU8, AtomicU32, AtomicU64, Ordering};
use stackdepot::{DepotError, DepotHandle, StackDepot};
use unwind::{
    AddressLayout, Corruption, ExceptionFrameLayout, FrameStart, FrameWalker, Registers, ReturnRepair, RowLookup,
    SFrameStart, SFrameTable, SFrameWalker, ShadowSegment, ShadowStack, ShadowWalker, StackKind, StackMemory,
    StackRange, StackSet, StopReason, TableError, Trace, TraceOptions, UnwindRow, Walked,
};

/// Which walker.
#[derive(Clone, Copy, PartialEq, Eq, Debug, defmt::Format)]
pub enum Mode {
    /// Follow frame records from x29.
    FramePointer,
    /// Copy the shadow call stack.
    ShadowCallStack,
    /// Unwind SP, FP and the return address by the SFrame table ([`sframe_table`]), which
    /// describes every instruction of compiled code, prologues and epilogues included.
    SFrame,
}

impl Mode {
    /// The walker of a trace where no mode is asked for (reports, the demo, `save_stack`'s
    /// initial mode): the frame walk, or the SFrame walk in a build without frame pointers, which
    /// follows the same frames by the table.
    pub const DEFAULT: Mode = if crate::build_info::FRAME_POINTERS { Mode::FramePointer } else { Mode::SFrame };

    /// The walker's name as the command line, the bench and printed traces say it.
    pub const fn name(self) -> &'static str {
        match self {
            Mode::FramePointer => "fp",
            Mode::ShadowCallStack => "scs",
            Mode::SFrame => "sframe",
        }
    }

    /// Whether this build can walk in this mode: a frame-record walk needs frame pointers
    /// ([`crate::build_info::FRAME_POINTERS`]); the others always run.
    pub const fn available(self) -> bool {
        !matches!(self, Mode::FramePointer) || crate::build_info::FRAME_POINTERS
    }
}

/// The kernel's address layout: `64 - T1SZ` VA bits (TCR_EL1), code in the upper half.
pub const LAYOUT: AddressLayout = AddressLayout::new(64 - ((crate::arch::mmu::TCR >> 16) & 0x3f) as u32);

/// Kernel memory as the walkers read it: plain loads. Only addresses inside declared (mapped)
/// stacks are ever read: the walkers guarantee it. Inlined into the walkers, which are exempt
/// from the sanitizer, so the loads are unchecked, and the frame walk's two become one `ldp`.
struct KernelMemory;

impl StackMemory for KernelMemory {
    #[inline(always)]
    fn read_u64(&self, address: u64) -> Option<u64> {
        // SAFETY: the walkers read only 8-aligned words inside the stacks this module declares,
        // which are mapped; stack words are plain data that no one writes during the walk.
        Some(unsafe { *(address as *const u64) })
    }

    #[inline(always)]
    fn read_pair(&self, address: u64) -> Option<(u64, u64)> {
        let (first, second);
        // SAFETY: as above (a frame record: two words inside a declared stack). One `ldp`, so
        // that the compiler neither splits the record nor moves half of it past a branch;
        // reads memory, no stack, no flags.
        unsafe {
            core::arch::asm!(
                "ldp {first}, {second}, [{address}]",
                address = in(reg) address,
                first = lateout(reg) first,
                second = lateout(reg) second,
                options(nostack, readonly, preserves_flags)
            )
        };
        Some((first, second))
    }

    #[inline(always)]
    fn read_below(&self, slot: &mut u64) -> Option<u64> {
        let value;
        // SAFETY: as above (the walker asks only for in-use shadow-stack slots). The load's
        // pre-index writes the new slot address back; reads memory, no stack, no flags.
        unsafe {
            core::arch::asm!(
                "ldr {value}, [{slot}, #-8]!",
                slot = inout(reg) *slot,
                value = lateout(reg) value,
                options(nostack, readonly, preserves_flags)
            )
        };
        Some(value)
    }
}

/// Kernel memory read the way an instrumented unwinder reads it: `read_volatile`, each word
/// through the compiler's tag check (bench case `fp-instrumented`).
struct CheckedMemory;

impl StackMemory for CheckedMemory {
    #[inline(always)]
    fn read_u64(&self, address: u64) -> Option<u64> {
        // SAFETY: as for KernelMemory.
        Some(unsafe { core::ptr::read_volatile(address as *const u64) })
    }
}

fn stack_range(slot: Slot, kind: StackKind) -> StackRange {
    StackRange::new(slot.stack_base(), slot.stack_top(), kind)
}

fn shadow_stack(slot: Slot) -> ShadowStack {
    ShadowStack::new(slot.shadow_stack_base(), slot.shadow_stack_end())
}

/// The slot holding `address` (slots are SLOT_SIZE-aligned: see task/stacks.rs).
#[inline(always)]
fn slot_of(address: u64) -> Slot {
    Slot(address & !(SLOT_SIZE - 1))
}

/// Where the running code is: on the IRQ or overflow stack of this CPU, or a task's.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Place {
    Task,
    Irq,
    Overflow,
}

#[inline(always)]
fn stack_pointer() -> u64 {
    let sp: u64;
    // SAFETY: reads SP.
    unsafe { core::arch::asm!("mov {}, sp", out(reg) sp, options(nomem, nostack, preserves_flags)) };
    sp
}

unsafe extern "C" {
    /// The first stack slot (kernel.ld; task/stacks.rs reads it too).
    static __stack_slots_start: u8;
    /// Where hijacked returns land (probes/kretprobe.rs).
    static kretprobe_trampoline: u32;
    /// The SFrame table's reservation (kernel.ld), filled by xtask after linking.
    static __sframe_start: u8;
    static __sframe_end: u8;
}

/// The address of a symbol of the kernel image, PC-relative in two instructions (`adrp`, `add`:
/// the image spans far less than their +-4 GiB) where the large code model builds a 64-bit
/// constant in four. For the walks' fixed cost.
macro_rules! image_address {
    ($symbol:path) => {{
        let address: u64;
        // SAFETY: computes an address from the PC and a link-time offset; reads no memory,
        // writes only `address`, no flags.
        unsafe {
            core::arch::asm!(
                "adrp {address}, {symbol}",
                "add {address}, {address}, :lo12:{symbol}",
                address = out(reg) address,
                symbol = sym $symbol,
                options(pure, nomem, nostack, preserves_flags)
            )
        };
        address
    }};
}

/// The index of `slot` among the stack slots (task slots first, in task-slot order).
#[inline(always)]
fn slot_index(slot: Slot) -> u64 {
    let start: u64;
    // SAFETY: `adrp` computes the 4 KiB page of the symbol from the PC; reads no memory, writes
    // only `start`, no flags. kernel.ld aligns the slots to SLOT_SIZE (task/stacks.rs checks it
    // at boot), so the page is the symbol's address: one instruction, no `add`.
    unsafe {
        core::arch::asm!(
            "adrp {start}, {symbol}",
            start = out(reg) start,
            symbol = sym __stack_slots_start,
            options(pure, nomem, nostack, preserves_flags)
        )
    };
    slot.0.wrapping_sub(start) / SLOT_SIZE
}

/// [`Repair`] with the trampoline's address built PC-relative ([`image_address`]): the frame
/// walk compares every return address with it, and builds it once per walk.
struct WalkRepair;

impl ReturnRepair for WalkRepair {
    #[inline(always)]
    fn trampoline(&self) -> u64 {
        image_address!(kretprobe_trampoline)
    }

    fn frame_return(&self, record: u64) -> Option<u64> {
        Repair.frame_return(record)
    }

    fn shadow_return(&self, slot: u64) -> Option<u64> {
        Repair.shadow_return(slot)
    }
}

/// [`WalkRepair`] and the function-graph tracer's returns: for walks that may meet both.
struct GraphWalkRepair;

impl ReturnRepair for GraphWalkRepair {
    #[inline(always)]
    fn trampoline(&self) -> u64 {
        image_address!(kretprobe_trampoline)
    }

    fn frame_return(&self, record: u64) -> Option<u64> {
        Repair.frame_return(record)
    }

    fn shadow_return(&self, slot: u64) -> Option<u64> {
        Repair.shadow_return(slot)
    }

    /// One load: 0 until the graph tracer is first registered.
    #[inline(always)]
    fn graph_trampoline(&self) -> u64 {
        crate::ftrace::graph::walk_trampoline()
    }

    fn graph_frame_return(&self, record: u64) -> Option<u64> {
        crate::ftrace::graph::frame_return(record)
    }

    fn graph_shadow_return(&self, slot: u64) -> Option<u64> {
        crate::ftrace::graph::shadow_return(slot)
    }
}

/// The trampoline the inlined frame walk compares return addresses with: the kretprobes', or 0
/// while graph returns may exist (from a graph registration until none is left), which makes
/// every frame walk compare both trampolines. A load where the address was built: the walk pays one branch for the
/// graph tracer, not a second compare per frame.
static FRAME_WALK_TRAMPOLINE: AtomicPtr<u32> = AtomicPtr::new(&raw const kretprobe_trampoline as *mut u32);

/// The function-graph tracer may hijack returns (`true`: frame walks compare both
/// trampolines), or no graph return is left anywhere (`false`).
pub fn walk_graph_returns(on: bool) {
    let trampoline = if on { core::ptr::null_mut() } else { &raw const kretprobe_trampoline as *mut u32 };
    FRAME_WALK_TRAMPOLINE.store(trampoline, Ordering::Release);
}

/// [`FRAME_WALK_TRAMPOLINE`], PC-relative in two instructions.
#[inline(always)]
fn frame_walk_trampoline() -> u64 {
    let address: u64;
    // SAFETY: an aligned 64-bit load of an atomic (a relaxed load), its address PC-relative;
    // reads only that word, no flags.
    unsafe {
        core::arch::asm!(
            "adrp {address}, {symbol}",
            "ldr {address}, [{address}, :lo12:{symbol}]",
            address = out(reg) address,
            symbol = sym FRAME_WALK_TRAMPOLINE,
            options(pure, readonly, nostack, preserves_flags)
        )
    };
    address
}

/// The repair of [`collect_frames`]' inlined walk: its fast-path trampoline is the loaded
/// [`FRAME_WALK_TRAMPOLINE`] (two instructions, as building the address took), and when that
/// reads 0 the walk compares both trampolines ([`ReturnRepair::trampolines`]).
struct FrameRepair;

impl ReturnRepair for FrameRepair {
    #[inline(always)]
    fn trampoline(&self) -> u64 {
        frame_walk_trampoline()
    }

    fn frame_return(&self, record: u64) -> Option<u64> {
        Repair.frame_return(record)
    }

    fn shadow_return(&self, slot: u64) -> Option<u64> {
        Repair.shadow_return(slot)
    }

    fn trampolines(&self) -> (u64, u64) {
        GraphWalkRepair.trampolines()
    }

    fn graph_frame_return(&self, record: u64) -> Option<u64> {
        crate::ftrace::graph::frame_return(record)
    }

    fn graph_shadow_return(&self, slot: u64) -> Option<u64> {
        crate::ftrace::graph::shadow_return(slot)
    }
}

/// Which kind of slot `slot` is, from its index alone (no per-CPU load: the sanitizer-exempt
/// walk path could not inline one in `full`): the task slots come first, then per CPU its IRQ
/// slot and its overflow slot (task/stacks.rs), so a CPU's overflow slot follows its IRQ slot.
#[inline(always)]
fn place_of(slot: Slot) -> Place {
    let index = slot_index(slot);
    // The secondaries' idle slots (after the per-CPU pairs) hold tasks' stacks too.
    if index < stacks::TASK_SLOTS as u64 || index >= (stacks::TASK_SLOTS + 2 * stacks::CPUS) as u64 {
        Place::Task
    } else if (index - stacks::TASK_SLOTS as u64).is_multiple_of(2) {
        Place::Irq
    } else {
        Place::Overflow
    }
}

/// The stacks a walk from `here` (the running slot) may visit, innermost first.
#[inline(always)]
fn declared_stacks(place: Place, here: Slot, buffer: &mut [StackRange; 3]) -> &[StackRange] {
    let count = match place {
        Place::Task => {
            buffer[0] = stack_range(here, StackKind::Task);
            1
        }
        Place::Irq => {
            buffer[0] = stack_range(here, StackKind::Irq);
            buffer[1] = stack_range(crate::task::current_slot(), StackKind::Task);
            2
        }
        Place::Overflow => {
            buffer[0] = stack_range(here, StackKind::Overflow);
            // This CPU's IRQ slot is the one before its overflow slot.
            buffer[1] = stack_range(Slot(here.0 - SLOT_SIZE), StackKind::Irq);
            buffer[2] = stack_range(crate::task::current_slot(), StackKind::Task);
            3
        }
    };
    &buffer[..count]
}

#[inline(always)]
fn frame_pointer() -> u64 {
    let fp;
    // SAFETY: reads x29.
    unsafe { core::arch::asm!("mov {}, x29", out(reg) fp, options(nomem, nostack, preserves_flags)) };
    fp
}

/// The stacks a frame walk from the running code may visit: SP's stack first, its bounds from
/// SP alone (all a walk that stays in it needs); the whole list (which needs the slot's kind and,
/// from an IRQ or overflow stack, the current task) only when the walk asks for it.
///
/// Interior mutability by hand (no `OnceCell`): the walk is exempt from the sanitizer, and
/// core's generic cell code would be an instrumented out-of-line call, with an instrumented
/// `memcpy`, at every walk that reaches a task's final marker.
struct RunningStacks {
    here: Slot,
    /// 0 until [`StackSet::declared`] first runs, then the number of stacks in `ranges`.
    count: UnsafeCell<usize>,
    ranges: UnsafeCell<MaybeUninit<[StackRange; 3]>>,
}

impl RunningStacks {
    #[inline(always)]
    fn new(here: Slot) -> Self {
        Self { here, count: UnsafeCell::new(0), ranges: UnsafeCell::new(MaybeUninit::uninit()) }
    }
}

impl StackSet for RunningStacks {
    #[inline(always)]
    fn first_records(&self) -> (u64, u64) {
        (self.here.stack_base(), self.here.stack_top() - unwind::FRAME_RECORD_SIZE)
    }

    #[sanitize(kernel_hwaddress = "off")]
    #[inline(never)]
    fn declared(&self) -> &[StackRange] {
        // SAFETY: RunningStacks is not Sync (UnsafeCell) and belongs to one walk. `ranges` is
        // written only while `count` is 0, before any slice of it was handed out, and read only
        // for the `count` stacks written then.
        unsafe {
            let count = self.count.get();
            if *count == 0 {
                let mut ranges = [StackRange::new(0, 0, StackKind::Task); 3];
                *count = declared_stacks(place_of(self.here), self.here, &mut ranges).len();
                *self.ranges.get() = MaybeUninit::new(ranges);
            }
            let ranges = (*self.ranges.get()).as_ptr().cast::<StackRange>();
            &*core::ptr::slice_from_raw_parts(ranges, *count)
        }
    }
}

/// Collects the running context's frame records into `buffer`: entry 0 is the return address
/// of the function this is inlined into (into its caller; before `options.skip`), then its
/// callers, as far as `options.max_depth` and the buffer's length allow. One of the two entry
/// points of every collection (with [`collect_shadow`]); callers that pick the walker at run
/// time go through [`collect`]. Always inlined, so the walk costs no call of its own: call it
/// from a function exempt from the sanitizer (`#[sanitize(kernel_hwaddress = "off")]`), whose
/// frame record and shadow-stack push must exist (a non-leaf function: it calls the walk's
/// slow paths).
///
/// Fixed cost outside the loop: SP's slot (two instructions give the stack's bounds), x29, the
/// trampoline of hijacked returns, the buffer's bounds; the other declared stacks are worked
/// out only if the walk leaves SP's stack.
///
/// In a build without frame pointers x29 is an ordinary register: the walk is refused
/// ([`StopReason::NoFramePointers`], nothing read); the test is a constant, so other builds
/// carry no trace of it.
#[inline(always)]
pub fn collect_frames(options: TraceOptions, buffer: &mut [MaybeUninit<u64>]) -> Walked {
    if !crate::build_info::FRAME_POINTERS {
        return FRAMES_REFUSED;
    }
    let stacks = RunningStacks::new(slot_of(stack_pointer()));
    let walker = FrameWalker::over(&KernelMemory, &stacks, LAYOUT).with_repair(&FrameRepair);
    walker.walk(FrameStart::Record(frame_pointer()), options, buffer)
}

/// Copies the running context's shadow call stack into `buffer`, chained into the interrupted
/// task's in IRQ context: the same entries as [`collect_frames`] (entry 0 is this function's own
/// return address, into its caller). Always inlined, as `collect_frames`.
///
/// Fixed cost outside the loop, for a task without hijacked returns (the common case, inlined):
/// x18 and its slot, whether that slot is a task's (one compare) and the task's count of
/// hijacked returns (one load), the buffer's bounds. Anything else (an IRQ's chained walk, a
/// repair) is [`collect_shadow_chained`], out of line.
#[inline(always)]
pub fn collect_shadow(options: TraceOptions, buffer: &mut [MaybeUninit<u64>]) -> Walked {
    // The newest entry is this function's own return address (its caller): the same first
    // entry as the frame walk from this function's frame record. x18 lies in the first page of
    // its slot, whatever the context.
    let x18 = cpu::shadow_call_stack_pointer();
    let here = slot_of(x18);
    let index = slot_index(here);
    // A task's slot names the task (task slots come first, one per task): its count of hijacked
    // returns is read without testing SP against the IRQ stack or reading the scheduler.
    if index < stacks::TASK_SLOTS as u64
        && kretprobe::outstanding_in_task_slot(index as usize) == 0
        && crate::ftrace::graph::walk_trampoline() == 0
    {
        let segment = ShadowSegment::current(shadow_stack(here), x18);
        return ShadowWalker::new(&KernelMemory, LAYOUT).walk(&[segment], options, buffer);
    }
    collect_shadow_chained(x18, options, buffer)
}

/// [`collect_shadow`] from `x18` (the caller's: this function's own push lies above it and is
/// not copied) with the repair of hijacked returns, chained into the interrupted task's shadow
/// stack when `x18` is on this CPU's IRQ shadow stack.
#[inline(never)]
#[sanitize(kernel_hwaddress = "off")]
fn collect_shadow_chained(x18: u64, options: TraceOptions, buffer: &mut [MaybeUninit<u64>]) -> Walked {
    let here = slot_of(x18);
    let mut segments = [ShadowSegment::current(shadow_stack(here), x18); 2];
    let mut count = 1;
    let cpu = stacks::this_cpu();
    if uninstrumented::load_u64(&cpu.irq_shadow_stack) == here.0 {
        let frame = uninstrumented::load_pointer(&cpu.irq_frame);
        if !frame.is_null() {
            // SAFETY: irq_frame points to the interrupted context's saved frame while the IRQ
            // runs (context.S), and this code runs inside that IRQ (x18 is on this CPU's IRQ
            // shadow stack).
            let frame = unsafe { &*frame };
            segments[1] = ShadowSegment::interrupted(shadow_stack(crate::task::current_slot()), frame.x[18], frame.elr);
            count = 2;
        }
    }
    ShadowWalker::new(&KernelMemory, LAYOUT).with_repair(&GraphWalkRepair).walk(&segments[..count], options, buffer)
}

/// The kernel's SFrame table: `.sframe` (kernel.ld's reservation in read-only data, filled by
/// xtask/src/sframe.rs from the compiler's `.eh_frame` after linking), its header checked. The
/// header's sub-sections must lie inside the reservation, and every lookup bounds-checks its
/// reads against them, so a corrupt entry met during a walk stops it (`UnwindTable`) rather
/// than reading past the table. [`Fault::SFrameTableTruncated`] shows the table cut after its
/// header. Always inlined: a walk's fixed cost is the two addresses and the header's checks.
#[inline(always)]
pub fn sframe_table() -> Result<SFrameTable<'static>, TableError> {
    let start = image_address!(__sframe_start);
    let end = image_address!(__sframe_end);
    let length = if uninstrumented::load_bool(inject::flag(Fault::SFrameTableTruncated)) {
        unwind::sframe::HEADER_SIZE
    } else {
        (end - start) as usize
    };
    // SAFETY: [__sframe_start, __sframe_end) is the reservation in the kernel's read-only data
    // (kernel.ld), mapped for the kernel's lifetime and written only before the image is loaded.
    let bytes = unsafe { core::slice::from_raw_parts(start as *const u8, length) };
    SFrameTable::new(bytes, start)
}

/// Where the vectors' exception frame keeps the interrupted SP and x30, from its boundary
/// marker: the SFrame walk's hint for crossing from a handler into the interrupted context.
const EXCEPTION_FRAME: ExceptionFrameLayout = ExceptionFrameLayout {
    sp: core::mem::offset_of!(ExceptionFrame, sp) as i64 - core::mem::offset_of!(ExceptionFrame, boundary) as i64,
    lr: core::mem::offset_of!(ExceptionFrame, x) as i64 + 30 * 8
        - core::mem::offset_of!(ExceptionFrame, boundary) as i64,
};

/// What a walk reports when the table is refused: no entries, the table's address.
#[inline(never)]
#[cold]
fn table_refused() -> Walked {
    let address = image_address!(__sframe_start);
    Walked { len: 0, exception_pcs: 0, stop: StopReason::Corrupt { address, corruption: Corruption::UnwindTable } }
}

/// Rows found in the table, by the address looked up: direct-mapped, one word per entry (the
/// address's low 32 bits, then the row packed in 32 bits, never 0: `UnwindRow::pack`), so an
/// entry is read and written in one access and CPUs filling it at once cannot tear it. A walk
/// meets the same return addresses again and again (the heap's call sites, a tick's callers):
/// a hit replaces the search of ~800 functions and the scan of a function's rows by one load.
/// The table never changes, so an entry is never stale; rows that do not pack are not cached.
static ROW_CACHE: [AtomicU64; ROW_CACHE_ENTRIES] = [const { AtomicU64::new(0) }; ROW_CACHE_ENTRIES];
/// 16 KiB: the return addresses of the kernel's hot paths fit with few conflicts.
const ROW_CACHE_ENTRIES: usize = 2048;

/// The entry of `pc`: its instruction index folded with the bits above, so that call sites a
/// multiple of the cache's span apart (8 KiB of text) do not all meet in one entry. Two terms
/// are enough: the kernel's text is a few MiB, so the bits from 24 up are the same everywhere.
#[inline(always)]
fn row_cache_index(pc: u64) -> usize {
    ((pc >> 2) ^ (pc >> 13)) as usize % ROW_CACHE_ENTRIES
}

/// The table with [`ROW_CACHE`] in front of it. Addresses outside the table's 4 GiB window
/// (which the kernel's text shares) go to the table.
struct CachedRows<'t> {
    table: &'t SFrameTable<'t>,
    /// The window's upper 32 bits.
    window: u64,
}

impl RowLookup for CachedRows<'_> {
    /// Inlined into the walk, which is exempt from the sanitizer; its one memory access is the
    /// entry's uninstrumented load.
    #[inline(always)]
    fn find(&self, pc: u64) -> Result<Option<UnwindRow>, TableError> {
        let entry = &ROW_CACHE[row_cache_index(pc)];
        let word = uninstrumented::load_u64(entry);
        // Both halves in one compare: the address's low half, and a row (never 0) in the high.
        let packed = if pc >> 32 == self.window && word & 0xffff_ffff == pc & 0xffff_ffff && word >> 32 != 0 {
            (word >> 32) as u32
        } else {
            self.fill(pc, entry)
        };
        // Rows decode in registers on the hot path; what a packed word cannot say (no row, a
        // corrupt entry, a row too large to pack) is asked of the table again, out of line.
        if packed != 0 { Ok(Some(UnwindRow::unpack(packed))) } else { self.table_find(pc) }
    }

    /// The walker's fast path: a hit is the entry's load and one compare of its key; a miss is
    /// 0, "ask `find`": the walker's full step then fills the entry, and the fast path's loop
    /// calls nothing (its state stays in registers). Same exemption and access as
    /// [`Self::find`].
    #[inline(always)]
    fn find_packed(&self, pc: u64) -> u32 {
        let word = uninstrumented::load_u64(&ROW_CACHE[row_cache_index(pc)]);
        // The key is the entry's low half under the window's upper half: `pc` less the window
        // against the low half, zero-extended (one compare). An empty entry's row is 0.
        if pc.wrapping_sub(self.window << 32) == word & 0xffff_ffff { (word >> 32) as u32 } else { 0 }
    }
}

impl CachedRows<'_> {
    /// A cache miss: the row from the table, packed (0 if there is none, the entry is corrupt
    /// or the row does not pack), and cached if it packs and `pc` is in the window.
    #[inline(never)]
    #[sanitize(kernel_hwaddress = "off")]
    fn fill(&self, pc: u64, entry: &AtomicU64) -> u32 {
        let (Ok(Some(row)), cacheable) = self.table_or_slot(pc) else {
            return 0;
        };
        let Some(packed) = row.pack() else {
            return 0;
        };
        if cacheable && pc >> 32 == self.window {
            uninstrumented::store_u64(entry, (packed as u64) << 32 | pc & 0xffff_ffff);
        }
        packed
    }

    /// The table's answer where no packed row can give it.
    #[cold]
    #[inline(never)]
    #[sanitize(kernel_hwaddress = "off")]
    fn table_find(&self, pc: u64) -> Result<Option<UnwindRow>, TableError> {
        self.table_or_slot(pc).0
    }

    /// The table's row at `pc`; where it has none, the row of the instruction a kprobe's XOL
    /// slot at `pc` stands for (the slot runs it in the probed function's frame). A slot's row
    /// is not to be cached (`false`): the chunk's next probe is in another function.
    #[inline(always)]
    fn table_or_slot(&self, pc: u64) -> (Result<Option<UnwindRow>, TableError>, bool) {
        match self.table.find(pc) {
            Ok(None) => match crate::probes::kprobe::slot_stands_for(pc) {
                Some(probed) => (self.table.find(probed), false),
                None => (Ok(None), true),
            },
            found => (found, true),
        }
    }
}

/// The point a call-site walk starts from: a return address into the running function (the
/// instruction after this one's `adr`, so the lookup at `pc - 1` finds this point's row), and
/// its SP and x29 at that point.
#[inline(always)]
fn call_site() -> (u64, u64, u64) {
    let (pc, sp, fp);
    // SAFETY: reads the PC (`adr` of the next instruction), SP and x29 into three registers;
    // reads no memory, no stack, no flags. Not `pure`: each inlined copy has its own PC.
    unsafe {
        core::arch::asm!(
            "adr {pc}, 2f",
            "2:",
            "mov {sp}, sp",
            "mov {fp}, x29",
            pc = out(reg) pc,
            sp = out(reg) sp,
            fp = out(reg) fp,
            options(nomem, nostack, preserves_flags)
        )
    };
    (pc, sp, fp)
}

/// Unwinds the running context by the SFrame table into `buffer`: the same entries as
/// [`collect_frames`] (entry 0 is the return address of the function this is inlined into).
/// Always inlined, as `collect_frames`; from an IRQ stack the walk ends at the exception
/// boundary (the vectors have no rows: the marker's interrupted PC is the last entry).
///
/// Fixed cost outside the loop: the table's header, the call site's PC, SP and x29, SP's slot,
/// the trampoline of hijacked returns, the buffer's bounds.
#[inline(always)]
pub fn collect_sframe(options: TraceOptions, buffer: &mut [MaybeUninit<u64>]) -> Walked {
    let Ok(table) = sframe_table() else {
        return table_refused();
    };
    let (pc, sp, fp) = call_site();
    let stacks = RunningStacks::new(slot_of(sp));
    let rows = CachedRows { table: &table, window: table.address() >> 32 };
    let walker = SFrameWalker::over(&KernelMemory, &stacks, &rows, LAYOUT)
        .with_repair(&GraphWalkRepair)
        .with_exception_frames(EXCEPTION_FRAME);
    walker.walk(SFrameStart::CallSite { pc, sp, fp }, options, buffer)
}

/// [`collect_frames`], [`collect_shadow`] or [`collect_sframe`], for callers that pick the walker at run time
/// (`save_stack`, the heap, the profiler, reports). Always inlined: the entry the walk reports
/// first is the return address of the function this is inlined into.
#[inline(always)]
pub fn collect(mode: Mode, options: TraceOptions, buffer: &mut [MaybeUninit<u64>]) -> Walked {
    match mode {
        Mode::FramePointer => collect_frames(options, buffer),
        Mode::ShadowCallStack => collect_shadow(options, buffer),
        Mode::SFrame => collect_sframe(options, buffer),
    }
}

/// [`collect_frames`]'s walk compiled with the sanitizer's checks, its memory read a plain
/// `read_volatile`: what an instrumented unwinder costs (bench `kasan-boot`, `fp-instrumented`).
/// Always inlined, as `collect_frames` (the instrumented part is the walk itself).
/// Refused without frame pointers, as `collect_frames`.
#[inline(always)]
pub fn collect_instrumented(options: TraceOptions, buffer: &mut [MaybeUninit<u64>]) -> Walked {
    if !crate::build_info::FRAME_POINTERS {
        return FRAMES_REFUSED;
    }
    let stacks = RunningStacks::new(slot_of(stack_pointer()));
    let walker = FrameWalker::over(&CheckedMemory, &stacks, LAYOUT).with_repair(&WalkRepair);
    walker.walk_instrumented(FrameStart::Record(frame_pointer()), options, buffer)
}

/// What a frame-record walk reports in a build without frame pointers: no entries, refused.
pub const FRAMES_REFUSED: Walked = Walked { len: 0, exception_pcs: 0, stop: StopReason::NoFramePointers };

/// The trace of the running context, from the caller of this function outward, kept in a
/// [`Trace`] (reports, tests, the timer tick's capture: the cold paths).
#[inline(never)]
#[sanitize(kernel_hwaddress = "off")]
pub fn capture(mode: Mode, options: TraceOptions) -> Trace {
    let mut trace = Trace::new();
    trace.fill(|buffer| collect(mode, options, buffer));
    trace
}

/// Traces of an interrupted context, from its saved frame (for reports): FP from its x29 and
/// PC; SCS from its x18 and PC; SFrame from its PC, SP, x29 and x30.
pub fn of_frame(frame: &ExceptionFrame, slot: Slot, mode: Mode) -> Trace {
    // Hijacked returns are known for the running task only.
    let repair = (slot == crate::task::current_slot()).then_some(&GraphWalkRepair as &dyn ReturnRepair);
    let mut trace = Trace::new();
    match mode {
        Mode::FramePointer if !crate::build_info::FRAME_POINTERS => {
            trace.fill(|_| FRAMES_REFUSED);
        }
        Mode::FramePointer => {
            let stacks = [stack_range(slot, StackKind::Task)];
            let walker = FrameWalker::new(&KernelMemory, &stacks, LAYOUT);
            let walker = if let Some(repair) = repair { walker.with_repair(repair) } else { walker };
            trace.fill(|buffer| walker.walk_from_context(frame.elr, frame.x[29], TraceOptions::ALL, buffer));
        }
        Mode::ShadowCallStack => {
            // After a shadow-stack overflow x18 is one past the last slot: report what is there.
            let x18 = frame.x[18].min(slot.shadow_stack_end() - 8);
            let segment = ShadowSegment::interrupted(shadow_stack(slot), x18, frame.elr);
            let walker = ShadowWalker::new(&KernelMemory, LAYOUT);
            let walker = if let Some(repair) = repair { walker.with_repair(repair) } else { walker };
            trace.fill(|buffer| walker.walk(&[segment], TraceOptions::ALL, buffer));
        }
        Mode::SFrame => {
            trace.fill(|buffer| collect_sframe_of(frame, slot, TraceOptions::ALL, buffer));
        }
    }
    trace
}

/// The SFrame walk of an interrupted context from its saved PC, SP, x29 and x30 (its PC first,
/// as an exception PC), on the task stack of `slot`: what a walk from the handler cannot give
/// (the vectors have no rows, so it stops at the exception boundary). For reports, the IRQ
/// capture and the profiler's samples.
#[inline(never)]
#[sanitize(kernel_hwaddress = "off")]
pub fn collect_sframe_of(
    frame: &ExceptionFrame,
    slot: Slot,
    options: TraceOptions,
    buffer: &mut [MaybeUninit<u64>],
) -> Walked {
    let Ok(table) = sframe_table() else {
        return table_refused();
    };
    // Hijacked returns are known for the running task only.
    let repair = (slot == crate::task::current_slot()).then_some(&Repair as &dyn ReturnRepair);
    let stacks = [stack_range(slot, StackKind::Task)];
    let rows = CachedRows { table: &table, window: table.address() >> 32 };
    let walker = SFrameWalker::new(&KernelMemory, &stacks, &rows, LAYOUT).with_exception_frames(EXCEPTION_FRAME);
    let walker = if let Some(repair) = repair { walker.with_repair(repair) } else { walker };
    let registers = Registers { pc: frame.elr, sp: frame.sp, fp: frame.x[29], lr: frame.x[30] };
    walker.walk(SFrameStart::Interrupted(registers), options, buffer)
}

/// Prints a trace, one symbolizable line per entry, and why it ended.
pub fn print(label: &str, trace: &Trace) {
    for (index, entry) in trace.entries().enumerate() {
        defmt::error!("  {=str} #{=usize} {=u64:#x}", label, index, entry.address);
    }
    defmt::error!("  {=str}: {=usize} frames, {}", label, trace.len(), defmt::Display2Format(&trace.stop_reason()));
}

/// Both backtraces of the running context, as Zircon's panic handler prints them: the
/// [`Mode::DEFAULT`] walk (`fp`, or `sframe` without frame pointers), then `scs`.
#[inline(never)]
pub fn print_both() {
    print(Mode::DEFAULT.name(), &capture(Mode::DEFAULT, TraceOptions::ALL));
    if crate::build_info::SHADOW_CALL_STACK {
        print("scs", &capture(Mode::ShadowCallStack, TraceOptions::ALL));
    }
}

/// Both backtraces of an interrupted context, as [`print_both`].
pub fn print_both_of(frame: &ExceptionFrame, slot: Slot) {
    print(Mode::DEFAULT.name(), &of_frame(frame, slot, Mode::DEFAULT));
    if crate::build_info::SHADOW_CALL_STACK {
        print("scs", &of_frame(frame, slot, Mode::ShadowCallStack));
    }
}

/// A CPU stopped by a panic on another: both backtraces of the context it stopped in, after a
/// `cpu N:` line (a context in EL0 has no kernel trace).
pub fn print_stopped_cpu(cpu: usize, frame: &ExceptionFrame, slot: Slot) {
    defmt::error!("cpu {=usize}: stopped at {=u64:#x}", cpu, frame.elr);
    if frame.spsr & SPSR_MODE == 0 {
        defmt::error!("  in EL0: no kernel trace");
    } else {
        print_both_of(frame, slot);
    }
}

/// SPSR.M[3:0]: 0 is EL0t.
const SPSR_MODE: u64 = 0b1111;

/// The kernel's stack depot and its pool memory (permanent records: traces are never freed).
pub static DEPOT: StackDepot<4096, 16> = StackDepot::new();
const POOL_SIZE: usize = 256 << 10;
static DEPOT_POOLS: StaticBlocks<4, POOL_SIZE> = StaticBlocks::new();

pub fn init_depot() {
    while let Some(pool) = DEPOT_POOLS.claim() {
        DEPOT.add_pool(pool).expect("the depot takes four pools");
    }
}

/// The mode `save_stack` uses (switchable at run time).
static MODE: AtomicU8 = AtomicU8::new(Mode::DEFAULT as u8);

pub fn set_mode(mode: Mode) {
    MODE.store(mode as u8, Ordering::Relaxed);
}

pub fn mode() -> Mode {
    match MODE.load(Ordering::Relaxed) {
        mode if mode == Mode::ShadowCallStack as u8 => Mode::ShadowCallStack,
        mode if mode == Mode::SFrame as u8 => Mode::SFrame,
        _ => Mode::FramePointer,
    }
}

/// Saves the caller's stack in the current mode into the depot.
#[inline(never)]
#[sanitize(kernel_hwaddress = "off")]
pub fn save_stack(skip: usize) -> Result<DepotHandle, DepotError> {
    let mut buffer = [MaybeUninit::uninit(); unwind::MAX_FRAMES];
    let walked = collect(mode(), TraceOptions::new(skip, unwind::MAX_FRAMES), &mut buffer);
    DEPOT.save(walked.entries(&buffer))
}

/// A stack word whose handle part is 0 and whose spare bits (27..32, never set in a depot
/// handle) say why no stack was saved: the allocation was not sampled (`kasan.stack_sample`).
pub const STACK_NOT_SAMPLED: u32 = 1 << 27;
/// The stack was collected but the depot was full.
pub const STACK_DEPOT_FULL: u32 = 2 << 27;

const _: () = assert!(stackdepot::SPARE_BITS == 5 && stackdepot::OFFSET_BITS + stackdepot::POOL_BITS == 27);

/// The word a sanitizer keeps for a collected stack: the raw depot handle, or a reason with
/// handle 0 (`Full`: [`STACK_DEPOT_FULL`]; any other failure: 0).
#[inline(always)]
pub fn stack_word(saved: Result<DepotHandle, DepotError>) -> u32 {
    match saved {
        Ok(handle) => handle.to_raw(),
        Err(DepotError::Full) => STACK_DEPOT_FULL,
        Err(_) => 0,
    }
}

/// What a report prints for a stack word that holds no handle, if it says why.
pub fn unsaved_reason(word: u32) -> Option<&'static str> {
    match word {
        STACK_NOT_SAMPLED => Some("(stack not sampled)"),
        STACK_DEPOT_FULL => Some("(stack not saved: depot full)"),
        _ => None,
    }
}

/// `kasan.stack_sample=N`: one allocation stack in N is collected (free stacks always).
static STACK_SAMPLE: AtomicU32 = AtomicU32::new(1);

/// Collects 1 in `every` allocation stacks from now on (`every` >= 1; 0 counts as 1).
pub fn set_stack_sample(every: u32) {
    STACK_SAMPLE.store(every.max(1), Ordering::Relaxed);
}

/// CPU `cpu`'s first sampling state for `tag-seed` `seed`: the seed in the high half and its
/// complement in the low half, XORed with (cpu + 1) times the golden-ratio constant, low bit set
/// (never 0, xorshift's fixed point). Each CPU its own stream, each stream fixed by the seed and
/// the CPU number alone.
pub const fn sample_seed(seed: u32, cpu: usize) -> u64 {
    let mixed = ((seed as u64) << 32 | (!seed) as u64) ^ (cpu as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    mixed | 1
}

/// The sampling draw's next state (xorshift64).
#[inline(always)]
pub const fn next_sample_state(mut x: u64) -> u64 {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    x
}

/// Whether a draw that produced state `x` collects the stack at period `every`: the high 32
/// bits scaled to 0..every, 0 with probability 1/every.
#[inline(always)]
pub const fn sampled(x: u64, every: u32) -> bool {
    ((x >> 32) * every as u64) >> 32 == 0
}

/// Seeds every CPU's sampling draw from the heap's `tag-seed` ([`sample_seed`]), so that a
/// run's choices on each CPU are reproducible.
pub fn seed_stack_sample(seed: u32) {
    for cpu in 0..percpu::CPUS {
        percpu::cpu_data(cpu).allocation_sample.store(sample_seed(seed, cpu), Ordering::Relaxed);
    }
}

/// The sampling period (1: every allocation stack).
pub fn stack_sample() -> u32 {
    STACK_SAMPLE.load(Ordering::Relaxed)
}

/// Whether this allocation's stack is collected: always with N = 1, else a pseudo-random draw
/// of probability 1/N from this CPU's state (in the per-CPU data). Not a counter: a counter
/// aliases with call sites that allocate periodically (every Nth allocation of a loop would
/// always be the same site). Callers run in task context with IRQs unmasked, so the draw is
/// made with IRQs masked (the state's load and store must not interleave with an IRQ on this
/// CPU, and the task must not move to another CPU between them).
#[inline(always)]
pub fn sample_allocation() -> bool {
    let every = uninstrumented::load_u32(&STACK_SAMPLE);
    if every <= 1 {
        return true;
    }
    // Not an `IrqMask`, not `inject::on`: in `full` their drop glue and core's atomic load are
    // instrumented out-of-line calls, which this sanitizer-exempt path cannot inline.
    let daif = cpu::mask_interrupts();
    let state = if uninstrumented::load_bool(inject::flag(Fault::StackSampleStateShared)) {
        &percpu::cpu_data(0).allocation_sample
    } else {
        &percpu::this_cpu().allocation_sample
    };
    let x = next_sample_state(uninstrumented::load_u64(state));
    uninstrumented::store_u64(state, x);
    cpu::restore_interrupts(daif); // raw mask pair: see above
    sampled(x, every)
}

/// A capture taken by the timer tick in IRQ context (the stack-trace tests arm it).
pub struct IrqCapture {
    pub frame_pointer: Trace,
    pub shadow: Trace,
    /// The SFrame walk of the interrupted context from its saved registers.
    pub sframe: Trace,
    /// The SFrame walk from inside the handler, across the exception frame (the vectors have no
    /// rows: the walk crosses by the frame's layout).
    pub sframe_from_handler: Trace,
    /// The interrupted PC.
    pub pc: u64,
    /// The interrupted SP (0 when no frame was saved).
    pub sp: u64,
}

/// The CPU whose next tick captures, plus one (0: none): every CPU ticks, the arming task's
/// CPU captures.
static IRQ_CAPTURE_ARMED: core::sync::atomic::AtomicUsize = core::sync::atomic::AtomicUsize::new(0);
static IRQ_CAPTURE: IrqSpinLock<Option<IrqCapture>> = IrqSpinLock::new(None);

/// Asks this CPU's next timer tick to capture both traces in IRQ context.
pub fn arm_irq_capture() {
    *IRQ_CAPTURE.lock() = None;
    IRQ_CAPTURE_ARMED.store(stacks::this_cpu().index.load(Ordering::Relaxed) as usize + 1, Ordering::Release);
}

/// The capture, once the tick has taken it.
pub fn take_irq_capture() -> Option<IrqCapture> {
    IRQ_CAPTURE.lock().take()
}

/// Called by the timer tick (IRQ context).
pub fn on_tick() {
    let cpu = stacks::this_cpu();
    let armed_for = cpu.index.load(Ordering::Relaxed) as usize + 1;
    if IRQ_CAPTURE_ARMED.load(Ordering::Relaxed) != armed_for
        || IRQ_CAPTURE_ARMED.compare_exchange(armed_for, 0, Ordering::Acquire, Ordering::Relaxed).is_err()
    {
        return;
    }
    *IRQ_CAPTURE.lock() = Some(capture_interrupted());
}

/// Both traces from inside an IRQ handler (through the IRQ stack into the interrupted context),
/// the SFrame walk of the interrupted context, and the interrupted PC.
#[inline(never)]
pub fn capture_interrupted() -> IrqCapture {
    let frame = stacks::this_cpu().irq_frame.load(Ordering::Relaxed);
    // SAFETY: called inside the IRQ whose interrupted frame this is (context.S).
    let (pc, sp) = if frame.is_null() { (0, 0) } else { unsafe { ((*frame).elr, (*frame).sp) } };
    let frame_pointer = capture(Mode::FramePointer, TraceOptions::ALL);
    let shadow = capture(Mode::ShadowCallStack, TraceOptions::ALL);
    let sframe_from_handler = capture(Mode::SFrame, TraceOptions::ALL);
    let sframe = if frame.is_null() {
        Trace::new()
    } else {
        // SAFETY: as above.
        of_frame(unsafe { &*frame }, crate::task::current_slot(), Mode::SFrame)
    };
    IrqCapture { frame_pointer, shadow, sframe, sframe_from_handler, pc, sp }
}

/// `kasan.stack_sample=N` (N >= 1, default 1): collect one allocation stack in N, for
/// `set_stack_sample`.
pub fn stack_sample_from_args(args: &crate::args::Args) -> u32 {
    let mut every = 1;
    for value in args.values(protocol::cmdline::KASAN_STACK_SAMPLE) {
        match value.parse::<u32>() {
            Ok(value) if value >= 1 => every = value,
            _ => defmt::warn!("cmdline: kasan.stack_sample={=str} is not a number >= 1, keeping {=u32}", value, every),
        }
    }
    every
}
