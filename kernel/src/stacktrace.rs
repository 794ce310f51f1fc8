//! `save_stack(mode)`: frame-pointer or shadow-call-stack traces of the running context (task or
//! IRQ), optionally deduplicated in the stack depot; and the backtraces printed by reports.
//!
//! Glue between crates/unwind (the walkers), the stack slots (task/stacks.rs: which stacks are
//! declared to the walker, in the order a walk may move between them) and crates/stackdepot.
//! Every address is a return address (the instruction after the BL), PAC-stripped with XPACLRI;
//! an interrupted context's PC is exact. Returns hijacked by kretprobes show their real address
//! (`probes::kretprobe::Repair`). xtask symbolizes lines of the form `  fp #N 0x...`.

use crate::arch::cpu;
use crate::arch::exception::ExceptionFrame;
use crate::probes::kretprobe::Repair;
use crate::task::stacks::{self, Slot};
use core::sync::atomic::{AtomicU8, Ordering};
use stackdepot::{DepotError, DepotHandle, StackDepot};
use unwind::{
    FrameWalker, ReturnRepair, ShadowSegment, ShadowStack, ShadowWalker, StackKind, StackMemory, StackRange, Trace,
    TraceOptions,
};

/// Which walker.
#[derive(Clone, Copy, PartialEq, Eq, Debug, defmt::Format)]
pub enum Mode {
    /// Follow frame records from x29.
    FramePointer,
    /// Copy the shadow call stack.
    ShadowCallStack,
}

/// Kernel memory as the walkers read it. Only addresses inside declared (mapped) stacks are
/// ever read: the walkers guarantee it.
struct KernelMemory;

impl StackMemory for KernelMemory {
    #[inline(always)]
    fn read_u64(&self, address: u64) -> Option<u64> {
        let value;
        // SAFETY: the walkers read only 8-aligned words inside the stacks this module declares,
        // which are mapped. An asm load: not sanitizer-instrumented.
        unsafe {
            core::arch::asm!("ldr {v}, [{a}]", a = in(reg) address, v = out(reg) value, options(nostack, readonly, preserves_flags))
        };
        Some(value)
    }
}

fn strip(address: u64) -> u64 {
    cpu::strip_pac(address)
}

fn stack_range(slot: Slot, kind: StackKind) -> StackRange {
    StackRange::new(slot.stack_base(), slot.stack_top(), kind)
}

fn shadow_stack(slot: Slot) -> ShadowStack {
    ShadowStack::new(slot.shadow_stack_base(), slot.shadow_stack_end())
}

/// Where the running code is: on the IRQ or overflow stack of this CPU, or a task's.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Place {
    Task,
    Irq,
    Overflow,
}

fn current_place() -> Place {
    let sp: u64;
    // SAFETY: reads SP.
    unsafe { core::arch::asm!("mov {}, sp", out(reg) sp, options(nomem, nostack, preserves_flags)) };
    if stacks::this_irq_slot().contains_stack(sp) {
        Place::Irq
    } else if stacks::this_overflow_slot().contains_stack(sp) {
        Place::Overflow
    } else {
        Place::Task
    }
}

/// The stacks a walk from here may visit, innermost first.
fn declared_stacks(place: Place, buffer: &mut [StackRange; 3]) -> &[StackRange] {
    let task = stack_range(crate::task::current_slot(), StackKind::Task);
    let count = match place {
        Place::Task => {
            buffer[0] = task;
            1
        }
        Place::Irq => {
            buffer[0] = stack_range(stacks::this_irq_slot(), StackKind::Irq);
            buffer[1] = task;
            2
        }
        Place::Overflow => {
            buffer[0] = stack_range(stacks::this_overflow_slot(), StackKind::Overflow);
            buffer[1] = stack_range(stacks::this_irq_slot(), StackKind::Irq);
            buffer[2] = task;
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

/// The trace of the running context, from the caller of this function outward.
#[inline(never)]
#[sanitize(kernel_hwaddress = "off")]
pub fn capture(mode: Mode, options: TraceOptions) -> Trace {
    let place = current_place();
    match mode {
        Mode::FramePointer => {
            let mut buffer = [StackRange::new(0, 0, StackKind::Task); 3];
            let stacks = declared_stacks(place, &mut buffer);
            FrameWalker::new(&KernelMemory, stacks, strip)
                .with_repair(&Repair)
                .walk_from_frame(frame_pointer(), options)
        }
        Mode::ShadowCallStack => {
            // The newest entry is this function's own return address (its caller): the same
            // first entry as the frame walk from this function's frame record.
            let x18 = cpu::shadow_call_stack_pointer();
            let here = match place {
                Place::Task => crate::task::current_slot(),
                Place::Irq => stacks::this_irq_slot(),
                Place::Overflow => stacks::this_overflow_slot(),
            };
            let mut segments = [ShadowSegment::current(shadow_stack(here), x18); 2];
            let mut count = 1;
            let frame = stacks::this_cpu().irq_frame.load(Ordering::Relaxed);
            if place == Place::Irq && !frame.is_null() {
                // SAFETY: irq_frame points to the interrupted context's saved frame while the IRQ
                // runs (context.S), and this code runs inside that IRQ.
                let frame = unsafe { &*frame };
                segments[1] =
                    ShadowSegment::interrupted(shadow_stack(crate::task::current_slot()), frame.x[18], frame.elr);
                count = 2;
            }
            ShadowWalker::new(&KernelMemory, strip).with_repair(&Repair).walk(&segments[..count], options)
        }
    }
}

/// Traces of an interrupted context, from its saved frame (for reports): FP from its x29 and
/// PC; SCS from its x18 and PC.
pub fn of_frame(frame: &ExceptionFrame, slot: Slot, mode: Mode) -> Trace {
    // Hijacked returns are known for the running task only.
    let repair = (slot == crate::task::current_slot()).then_some(&Repair as &dyn ReturnRepair);
    match mode {
        Mode::FramePointer => {
            let stacks = [stack_range(slot, StackKind::Task)];
            let walker = FrameWalker::new(&KernelMemory, &stacks, strip);
            let walker = if let Some(repair) = repair { walker.with_repair(repair) } else { walker };
            walker.walk_from_context(frame.elr, frame.x[29], TraceOptions::ALL)
        }
        Mode::ShadowCallStack => {
            // After a shadow-stack overflow x18 is one past the last slot: report what is there.
            let x18 = frame.x[18].min(slot.shadow_stack_end() - 8);
            let segment = ShadowSegment::interrupted(shadow_stack(slot), x18, frame.elr);
            let walker = ShadowWalker::new(&KernelMemory, strip);
            let walker = if let Some(repair) = repair { walker.with_repair(repair) } else { walker };
            walker.walk(&[segment], TraceOptions::ALL)
        }
    }
}

/// Prints a trace, one symbolizable line per entry, and why it ended.
pub fn print(label: &str, trace: &Trace) {
    for (index, entry) in trace.entries().enumerate() {
        defmt::error!("  {=str} #{=usize} {=u64:#x}", label, index, entry.address);
    }
    defmt::error!("  {=str}: {=usize} frames, {}", label, trace.len(), defmt::Display2Format(&trace.stop_reason()));
}

/// Both backtraces of the running context, as Zircon's panic handler prints them.
#[inline(never)]
pub fn print_both() {
    print("fp", &capture(Mode::FramePointer, TraceOptions::ALL));
    if crate::SHADOW_CALL_STACK {
        print("scs", &capture(Mode::ShadowCallStack, TraceOptions::ALL));
    }
}

/// Both backtraces of an interrupted context.
pub fn print_both_of(frame: &ExceptionFrame, slot: Slot) {
    print("fp", &of_frame(frame, slot, Mode::FramePointer));
    if crate::SHADOW_CALL_STACK {
        print("scs", &of_frame(frame, slot, Mode::ShadowCallStack));
    }
}

/// The kernel's stack depot and its pool memory (permanent records: traces are never freed).
pub static DEPOT: StackDepot<4096, 16> = StackDepot::new();
const POOL_SIZE: usize = 256 << 10;
static mut DEPOT_POOLS: [[u8; POOL_SIZE]; 4] = [[0; POOL_SIZE]; 4];

pub fn init_depot() {
    // SAFETY: the pools are handed to the depot once, at init, and never touched again here.
    let pools = unsafe { &mut *core::ptr::addr_of_mut!(DEPOT_POOLS) };
    for pool in pools.iter_mut() {
        DEPOT.add_pool(pool).expect("the depot takes four pools");
    }
}

/// The mode `save_stack` uses (switchable at run time).
static MODE: AtomicU8 = AtomicU8::new(0);

pub fn set_mode(mode: Mode) {
    MODE.store(mode as u8, Ordering::Relaxed);
}

pub fn mode() -> Mode {
    if MODE.load(Ordering::Relaxed) == Mode::ShadowCallStack as u8 { Mode::ShadowCallStack } else { Mode::FramePointer }
}

/// Saves the caller's stack in the current mode into the depot.
#[inline(never)]
pub fn save_stack(skip: usize) -> Result<DepotHandle, DepotError> {
    let trace = capture(mode(), TraceOptions::new(skip + 1, unwind::MAX_FRAMES));
    DEPOT.save(trace.addresses())
}

/// A capture taken by the timer tick in IRQ context (the stack-trace tests arm it).
pub struct IrqCapture {
    pub frame_pointer: Trace,
    pub shadow: Trace,
    /// The interrupted PC.
    pub pc: u64,
}

static IRQ_CAPTURE_ARMED: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);
static IRQ_CAPTURE_DONE: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);
static mut IRQ_CAPTURE: IrqCapture = IrqCapture { frame_pointer: Trace::new(), shadow: Trace::new(), pc: 0 };

/// Asks the next timer tick to capture both traces in IRQ context.
pub fn arm_irq_capture() {
    IRQ_CAPTURE_DONE.store(false, Ordering::Relaxed);
    IRQ_CAPTURE_ARMED.store(true, Ordering::Release);
}

/// The capture, once the tick has taken it.
pub fn take_irq_capture() -> Option<&'static IrqCapture> {
    if !IRQ_CAPTURE_DONE.swap(false, Ordering::Acquire) {
        return None;
    }
    // SAFETY: DONE was set (release) after the IRQ wrote the capture, and the IRQ writes again
    // only after the next arm_irq_capture, which the caller does after it is done reading.
    Some(unsafe { &*core::ptr::addr_of!(IRQ_CAPTURE) })
}

/// Called by the timer tick (IRQ context).
pub fn on_tick() {
    if !IRQ_CAPTURE_ARMED.swap(false, Ordering::Acquire) {
        return;
    }
    let frame = stacks::this_cpu().irq_frame.load(Ordering::Relaxed);
    // SAFETY: the tick runs inside the IRQ whose interrupted frame this is (context.S).
    let pc = if frame.is_null() { 0 } else { unsafe { (*frame).elr } };
    let frame_pointer = capture(Mode::FramePointer, TraceOptions::ALL);
    let shadow = capture(Mode::ShadowCallStack, TraceOptions::ALL);
    // SAFETY: only this IRQ path writes IRQ_CAPTURE, between arm and DONE (see take_irq_capture).
    unsafe { *core::ptr::addr_of_mut!(IRQ_CAPTURE) = IrqCapture { frame_pointer, shadow, pc } };
    IRQ_CAPTURE_DONE.store(true, Ordering::Release);
}
