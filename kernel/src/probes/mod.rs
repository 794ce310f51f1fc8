//! Probes: kernel probes, kernel return probes, user probes and user return probes.
//!
//! A probe displaces one instruction of text and performs it on every hit in the way its
//! [`Method`] says (single-step, brk-step, simulate, detour). What is shared lives once:
//! - the method rules and refusals, and the detour relocator, in `crates/probes` (`probes::plan`,
//!   `probes::detour_trampoline`), tested on the host;
//! - one error type, [`ProbeError`], whose text-dependent refusals name the [`Text`];
//! - one vocabulary of what a hit does, [`Action`](action::Action), built from the method's
//!   `probes::Plan` (`action.rs`);
//! - one register-file adapter over the exception frame (`frame.rs`);
//! - the step bits (`arch::step`) and text/XOL writes (`arch::patch`);
//! - the two cells that need `unsafe impl Sync` (`cells.rs`).
//!
//! The two halves have one shape, a registry, its hit path (`.text.noprobe`) and the place the
//! displaced instructions run:
//! - kernel: `kprobe.rs`, `kprobe_hit.rs`, `kprobe_slots.rs` (XOL slots and detour trampolines
//!   in kernel text), with `refuse.rs` (where a kernel probe may not go) and `kretprobe.rs`;
//! - user: `uprobe.rs`, `uprobe_hit.rs` (the EL0 trap entry), `uprobe_xol.rs` (the XOL page),
//!   with `uretprobe.rs`.
//!
//! Each hit path depends on its registry, each registry on its code area; nothing points back.
//!
//! Adding a method: its `Method` variant and rule in `crates/probes/src/plan.rs`, its `Action`
//! in `action.rs`, and its hit arm in `kprobe_hit.rs` and `uprobe_hit.rs` (and a trampoline
//! shape in `crates/probes/src/relocate.rs` if it needs code).

mod action;
pub(crate) mod cells;
mod error;
mod frame;
pub mod kprobe;
mod kprobe_hit;
mod kprobe_slots;
pub mod kretprobe;
mod refuse;
pub mod uprobe;
pub mod uprobe_hit;
mod uprobe_xol;
pub mod uretprobe;

pub use error::ProbeError;
pub use kprobe::{
    SLOT_AREA_SIZE, SLOT_CHUNK_SIZE, SLOT_CHUNKS, counts, first_patchable_entry, refused_changes, register,
    register_all, replace_all, slot_area_address, slot_chunks_in_use, table_entries_in_use, unregister, unregister_all,
};
pub use kprobe_hit::{on_brk, on_software_step, on_step_brk, simulator_functions, simulator_text};
pub use probes::{Method, Registers, Text};
pub use refuse::is_noprobe;

/// A handler: sees (and may change) the probed context's registers. For a kernel probe `pc` is
/// the probed address in a pre-handler and the next PC in a post-handler; for a user probe, the
/// probed address (for a return handler, the real return address, with x0 the return value).
/// Changing `pc` or `sp` is not supported: a kernel detour refuses it (counted by
/// [`refused_changes`], logged, undone).
pub type Handler = fn(&mut Registers);

/// Whether a task interrupted at `pc` on this CPU must not be switched away (the trap layer
/// then keeps the reschedule for the first IRQ exit outside): it is inside kernel-probe code,
/// a detour trampoline or XOL slot, or a probe's handler, or at EL0 inside a uprobe's detour
/// trampoline. A task preempted there would pass a quiescent point (the switch) while still
/// inside memory that `unregister` poisons and reuses after its grace period (Linux's optprobes
/// need `synchronize_rcu_tasks` for this; here preemption simply waits: the code inside is
/// short and never blocks).
#[unsafe(link_section = ".text.noprobe")]
pub fn must_not_preempt(pc: u64) -> bool {
    kprobe_hit::must_not_preempt(pc) || uprobe_hit::in_detour_trampoline(pc)
}

/// Makes debug exceptions (software step) possible at EL1 and hooks the probes into task
/// lifecycle: called once at boot.
pub fn init() {
    crate::arch::step::unlock_debug();
    // A reused task slot must not inherit return instances or an old XOL page.
    crate::task::on_spawn(kretprobe::forget_task);
    crate::task::user::on_spawn(uprobe::on_new_user_task);
}
