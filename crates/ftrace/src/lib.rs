//! ftrace with call ops: callsite model, tracer registry and patch planner.
//!
//! The kernel is built with `-Zpatchable-function-entry=4,2` and
//! `-Zmin-function-alignment=8`. This crate decides what every callsite's
//! text should be, for the registered tracers and a dispatch [`Scheme`], and
//! patches it through a [`TextPatcher`] in an order that is safe while other
//! CPUs run the code. It never calls a function pointer: ops objects, the
//! trampoline and the list/vector functions are the kernel's, known here
//! only by address. `no_std`, no `alloc`; no `unsafe` but the two intrinsic
//! loads of the `kernel` feature.
//!
//! # Callsite layout
//!
//! `__patchable_function_entries` records, per function, the address `E` of
//! the first of the two NOPs before the symbol (8-aligned, checked by
//! xtask and again by [`Registry::initialise`]):
//!
//! ```text
//! E + 0   literal (2 words)   NOP NOP -> 64-bit ops address (nop ops at init)
//! E + 8   symbol              NOP -> mov x9, x30     once, at initialisation
//! E + 12  call slot           NOP <-> bl trampoline  at run time
//! E + 16  paciasp             (pac-ret builds; never touched)
//! E + 20  str x30, [x18], #8  (SCS builds; never touched)
//! ```
//!
//! The trampoline finds the literal from x30 = `E + 16` with
//! `bic x11, x30, #7; ldr x11, [x11, #-16]` ([`CallSite::from_return_address`]
//! does the same arithmetic) and x9 holds the traced function's own return
//! address. `bl` reaches +-128 MiB: [`encode_bl`] returns
//! [`BranchError::OutOfRange`] rather than a wrong branch, and
//! `initialise` checks every traceable site before writing anything.
//!
//! Only the call slot changes at run time because `NOP <-> BL` is one of the
//! instructions the Arm ARM (B2.2.5, concurrent modification and execution)
//! allows to be patched while another CPU executes it; `NOP -> MOV` is not,
//! so the `mov x9, x30` is written once, by `initialise`, at boot, and a
//! second `initialise` fails with [`Error::AlreadyInitialised`]. The literal
//! is data: a single-copy-atomic 64-bit store swaps it.
//!
//! # State machine of a callsite
//!
//! [`SiteState`]: `Uninitialised` (four NOPs; only sites that the kernel
//! excluded at `initialise`, forever) -> `Disabled { literal }`
//! (`mov; nop`, literal = nop ops) <-> `Calling { literal }`
//! (`mov; bl trampoline`). [`Registry::apply`] computes each site's
//! [`Target`] (disabled, one tracer's own ops, the list ops, or a vector)
//! from the tracers that trace it and the scheme, and makes the fewest
//! writes, in this order:
//!
//! | transition | writes, in order |
//! |---|---|
//! | disabled -> calling | literal := ops (if different); then call slot `NOP -> BL` |
//! | calling -> calling (ops change) | literal := ops: one 64-bit store, no instruction write |
//! | calling -> disabled | literal := nop ops (if different); then call slot `BL -> NOP` |
//! | unchanged | nothing |
//!
//! Enabling writes the literal first so that a CPU that executes the new
//! `bl` finds its ops. Disabling points the literal at the nop ops first (as
//! Linux does) so that CPUs still executing the old `bl` stop calling the
//! tracer at the data store rather than after resynchronising. Before
//! writing a site, `apply` reads it back and fails with
//! [`Error::UnexpectedInstruction`] / [`Error::UnexpectedLiteral`] if it is
//! not what the registry left there.
//!
//! # Schemes
//!
//! - [`Scheme::List`]: every traced site's literal is the list ops. The
//!   kernel's list function maps the site ([`DispatchTable::site_index`]:
//!   a hash index built by `initialise`, constant time, one probe for most
//!   sites, at most [`DispatchTable::MAX_PROBES`]) and tests each registered tracer with
//!   [`DispatchTable::traces`] (O(1): two loads), or walks only the relevant
//!   ones with [`DispatchTable::relevant`].
//! - [`Scheme::CallOps`] (the seed): a site traced by exactly one tracer
//!   holds that tracer's ops and the trampoline calls it directly; any other
//!   traced site the list ops.
//! - [`Scheme::Vector`] (beyond the seed): as `CallOps`, and a site traced by
//!   two or more tracers holds the ops of a vector slot: an immutable tracer
//!   set ([`DispatchTable::vector`]) shared by all sites with the same set.
//!   The kernel provides `VECTORS` ops objects at
//!   [`VectorOps::address`]`(slot)`, each `{ func: vector_func, slot }`; its
//!   vector function walks the slot's set, so two relevant tracers no longer
//!   fall back to the list and irrelevant tracers cost nothing. With all
//!   slots taken a site falls back to the list ops ([`Applied::vector_fallbacks`]).
//!
//! The scheme can change at run time ([`Registry::set_scheme`], then
//! `apply`): that is only literal stores.
//!
//! # Filters
//!
//! The kernel resolves a filter to site indices once, at registration, with
//! its symbol table and [`glob_match`] (`*`, `?`):
//! [`Registry::register`] takes the indices, [`Registry::register_where`] a
//! predicate over `(index, entry)`. Per tracer the set is one bit per site in
//! the [`DispatchTable`]; nothing matches names per call.
//!
//! # Concurrency
//!
//! The [`Registry`] lives behind the kernel's ftrace lock; every update goes
//! through it. What the per-call path reads is the [`DispatchTable`], in a
//! static, read without a lock: every field is an atomic that the registry
//! changes with single stores, so a reader sees each word old or new:
//! - entries and the site index are written once by `initialise`, before
//!   any `bl` exists and before `site_count` is stored with release (the
//!   lookup loads it with acquire first and finds nothing while it is 0);
//! - a tracer's site bits and ops address are written before its bit in
//!   `registered` is set with a release store; readers load `registered`
//!   with acquire first. `unregister` clears that bit at once, so the list
//!   and vector functions stop calling it immediately;
//! - a vector slot's set is written before the literal store that makes it
//!   reachable (the [`TextPatcher`] orders each write after earlier ones) and
//!   never changes while reachable; the trampoline reaches it through the
//!   literal by address dependency;
//! - slots are reused only after a grace period: `apply` retires the
//!   unregistered tracers and unused vector slots with its
//!   [`Applied::generation`]; [`Registry::grace_period_elapsed`]`(generation)`,
//!   called once every CPU has been outside the trampoline and the tracers
//!   since then, frees them (clears their bits) and tells the kernel which
//!   tracers' memory it may now free. Until then a CPU that loaded an old
//!   literal, vector or tracer id still finds it intact.
//!
//! A reader racing an update may miss a tracer being registered or call one
//! being unregistered, never a freed one, and never a half-written literal.
//!
//! # Errors
//!
//! [`Error`]: configuration and table errors (`initialise` twice, misaligned
//! or duplicate entries, too many sites, an entry too far from its home slot
//! in the site index, `bl` out of range, text that is not four NOPs) are found before the first write; registration errors
//! (registry full, unknown or uninitialised site, null ops) before the
//! tracer is published; text that changed behind the registry's back stops
//! `apply` at that site.
//!
//! # Memory
//!
//! No allocation: capacities are const generics. The kernel's likely
//! `DispatchTable<4096, 2, 64>` (4096 sites, 128 tracers, 64 vectors) is
//! about 130 KiB, its `Registry` about 160 KiB (40 bytes per site), both
//! zero-initialised statics (`const fn new`).
//!
//! # Cargo feature `kernel`
//!
//! Enables `#![feature(sanitize, core_intrinsics)]` and builds the per-call
//! read path ([`DispatchTable`]'s `site_count`, `site_index`, `registered`,
//! `traces`, `relevant`, `ops_address`, `vector`, [`TracerSet`]'s
//! iteration, [`CallSite::from_return_address`]) with
//! `#[sanitize(kernel_hwaddress = "off")]`: it runs on every traced call.
//! A function built with the sanitizer off does not get instrumented
//! callees inlined, and `AtomicU64::load` and slice iterators are such
//! callees, so the path uses no core function: its loads are the
//! `atomic_load` intrinsic (inlined helpers in `dispatch.rs`) and its loops
//! are index loops. The kernel's list and vector functions must be marked
//! the same way, or these calls stay out of line. Checked by disassembling a
//! list, "relevant" and vector function over `DispatchTable<4096, 2, 64>`
//! built with `-Zsanitizer=kernel-hwaddress` (calls scheme): everything
//! inlined, no `__hwasan` reference, `ldar` for `registered` and plain `ldr`
//! for the rest. The update side (`Registry`) stays instrumented.
#![cfg_attr(not(test), no_std)]
#![cfg_attr(feature = "kernel", feature(sanitize, core_intrinsics))]
#![cfg_attr(
    feature = "kernel",
    allow(internal_features, reason = "the per-call path's loads are the atomic_load intrinsic, see dispatch.rs")
)]

mod callsite;
mod dispatch;
mod error;
mod glob;
mod patcher;
mod registry;

pub use callsite::{
    BRANCH_MAX_BACKWARD, BRANCH_MAX_FORWARD, BranchError, CallSite, MOV_X9_X30, MisalignedEntry, NOP, NOP_LITERAL,
    PACIASP, SCS_PUSH, decode_bl, encode_bl, is_bl_to,
};
pub use dispatch::{DispatchTable, TracerId, TracerSet, TracerSetIter};
pub use error::Error;
pub use glob::glob_match;
pub use patcher::{EnableOrder, TextPatcher};
pub use registry::{Applied, Config, Reclaimed, Registry, Scheme, SiteState, Target, TracerState, VectorOps};
