//! User return probes (uretprobes): a uprobe with a return handler.
//!
//! At the hit (before the displaced instruction, so before any `paciasp` or push of x30) the
//! user's x30 is saved on the task's return-instance stack and replaced by the uretprobe
//! trampoline `BRK #0x121` in the XOL page; the trampoline's BRK pops the instance, resumes the
//! task at the real return address and the user hit path (`uprobe_hit.rs`) runs the probe's
//! return handler. Nested and recursive calls push one instance each.

use core::sync::atomic::{AtomicU64, Ordering};

use super::cells::PerContext;
use super::uprobe_xol::{MAX_UPROBES, RETURN_TRAMPOLINE_OFFSET, write_xol};
use crate::arch::exception::ExceptionFrame;
use crate::task::stacks::TASK_SLOTS;
use crate::task::user::USER_XOL;
use probes::encode_brk;

/// BRK immediate of the return trampoline.
pub const BRK_URETPROBE: u16 = 0x121;
/// Where the uretprobe trampoline sits in the XOL page.
pub const RETURN_TRAMPOLINE: u64 = USER_XOL + RETURN_TRAMPOLINE_OFFSET;
/// Return instances per task (deeper nesting is counted as missed and not hijacked).
const MAX_RETURN_DEPTH: usize = 64;

/// One task's return instances: (real return address, probe index).
struct ReturnStack {
    depth: usize,
    instances: [(u64, usize); MAX_RETURN_DEPTH],
}

static RETURN_STACKS: PerContext<ReturnStack, TASK_SLOTS> = PerContext::new(
    [const { core::cell::UnsafeCell::new(ReturnStack { depth: 0, instances: [(0, 0); MAX_RETURN_DEPTH] }) };
        TASK_SLOTS],
);
static MISSED_RETURNS: AtomicU64 = AtomicU64::new(0);
/// Returns through the trampoline, per probe index (reset when the index is registered).
static RETURNS: [AtomicU64; MAX_UPROBES] = [const { AtomicU64::new(0) }; MAX_UPROBES];

/// Task `slot`'s return instances.
#[inline(always)]
fn return_stack(slot: usize) -> &'static mut ReturnStack {
    // SAFETY: a task's stack is used by that task's EL0 exception handlers (IRQs masked) and
    // reset at spawn, before the task runs (`cells::PerContext`).
    unsafe { &mut *RETURN_STACKS.get(slot) }
}

/// Function entries whose return could not be hijacked (return-instance stack full).
pub fn missed_returns() -> u64 {
    MISSED_RETURNS.load(Ordering::Relaxed)
}

/// Returns of the functions probed by uprobe `index` since its registration.
pub(super) fn returns(index: usize) -> u64 {
    RETURNS[index].load(Ordering::Relaxed)
}

/// Uprobe `index` is being registered: no returns counted yet.
pub(super) fn clear_returns(index: usize) {
    RETURNS[index].store(0, Ordering::Relaxed);
}

/// A new task in `slot`: no return instances.
pub(super) fn reset(slot: usize) {
    return_stack(slot).depth = 0;
}

/// Writes the return trampoline into task `slot`'s XOL page.
pub(super) fn write_trampoline(slot: usize) {
    write_xol(RETURN_TRAMPOLINE_OFFSET, &[encode_brk(BRK_URETPROBE).0], slot..slot + 1);
}

/// At a hit of uprobe `index` with a return handler: hijack the return.
#[unsafe(link_section = ".text.noprobe")]
pub(super) fn hijack_return(frame: &mut ExceptionFrame, index: usize) {
    let stack = return_stack(crate::task::current().0);
    if stack.depth == MAX_RETURN_DEPTH {
        MISSED_RETURNS.fetch_add(1, Ordering::Relaxed);
        return;
    }
    stack.instances[stack.depth] = (frame.x[30], index);
    stack.depth += 1;
    frame.x[30] = RETURN_TRAMPOLINE;
}

/// `BRK #0x121` from the return trampoline: pops the task's newest return instance and
/// resumes it at the real return address; returns the index of the probe whose return this is
/// (its handler is the caller's to run). `None` if no instance is waiting there.
#[unsafe(link_section = ".text.noprobe")]
#[inline(always)]
pub(super) fn pop_return(frame: &mut ExceptionFrame) -> Option<usize> {
    let stack = return_stack(crate::task::current().0);
    if frame.elr != RETURN_TRAMPOLINE || stack.depth == 0 {
        return None;
    }
    stack.depth -= 1;
    let (return_address, index) = stack.instances[stack.depth];
    frame.elr = return_address;
    RETURNS[index].fetch_add(1, Ordering::Relaxed);
    Some(index)
}
