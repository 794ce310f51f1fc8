//! Probes: kernel probes, kernel return probes, user probes and user return probes.
//!
//! A probe displaces one instruction of text and performs it on every hit in the way its
//! [`Method`] says (single-step, brk-step, simulate, detour). What is shared lives once:
//! - the method rules and refusals, and the detour relocator, in `crates/probes` (`probes::plan`,
//!   `probes::detour_trampoline`), tested on the host;
//! - one error type, [`ProbeError`], whose text-dependent refusals name the [`Text`];
//! - one register-file adapter over the exception frame (`frame.rs`);
//! - the step bits (`arch::step`) and text/XOL writes (`arch::patch`);
//! - the two cells that need `unsafe impl Sync` (`cells.rs`).
//!
//! Files: `kprobe.rs` (registration) and `hit.rs` (its hit path, `.text.noprobe`), `slots.rs`
//! (XOL slots and detour trampolines in kernel text), `refuse.rs` (where a kernel probe may not
//! go), `kretprobe.rs`, `uprobe.rs` (EL0 probes and their trap entry) and `uretprobe.rs`.
//!
//! Adding a method: its `Method` variant and rule in `crates/probes/src/plan.rs`, its `Action`
//! and hit arm in `kprobe.rs`/`hit.rs` and in `uprobe.rs` (and a trampoline shape in
//! `crates/probes/src/relocate.rs` if it needs code).

mod cells;
mod error;
mod frame;
mod hit;
pub mod kprobe;
pub mod kretprobe;
mod refuse;
mod slots;
pub mod uprobe;
pub mod uretprobe;

pub use error::ProbeError;
pub use hit::{
    must_not_preempt, on_brk, on_software_step, on_step_brk, set_reentered_runs_handler, set_reentry_handling,
    simulator_functions, simulator_text,
};
pub use kprobe::{
    SLOT_AREA_SIZE, counts, first_patchable_entry, register, register_all, slot_area_address, unregister,
    unregister_all,
};
pub use probes::{Method, Registers, Text};
pub use refuse::is_noprobe;

/// A handler: sees (and may change) the probed context's registers. For a kernel probe `pc` is
/// the probed address in a pre-handler and the next PC in a post-handler; for a user probe, the
/// probed address (for a return handler, the real return address, with x0 the return value).
/// Changing `pc` or `sp` is not supported.
pub type Handler = fn(&mut Registers);

/// Makes debug exceptions (software step) possible at EL1 and hooks the probes into task
/// lifecycle: called once at boot.
pub fn init() {
    crate::arch::step::unlock_debug();
    // A reused task slot must not inherit return instances or an old XOL page.
    crate::task::on_spawn(kretprobe::forget_task);
    crate::task::user::on_spawn(uprobe::on_new_user_task);
}
