//! The kernel's symbols, from the two tables the linked image carries about its functions.
//!
//! - `callsites`: where each instrumented function starts (`__patchable_function_entries`,
//!   sorted at boot), for lookups by address: stack-trace tests, reports, probes, ftrace.
//! - `names`: what each function is called (the `.ksyms` table xtask embeds), for lookups by
//!   name and naming a start address: ftrace filters.

pub mod callsites;
mod names;

pub use names::Symbols;
