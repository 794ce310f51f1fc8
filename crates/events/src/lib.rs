//! The events behind each bench figure: which arm64 instructions count as which event.
//!
//! The QEMU plugin in `crates/events-plugin` (GPL-2.0-or-later, outside the workspace) asks
//! [`classify`] once per instruction it translates and adds the answer to per-CPU counters on
//! every execution; between the two counter reads that open and close a measured window it
//! writes one [`window`] line. This crate holds that pure logic under the workspace's licence so
//! that it is tested on the host like the other crates, and so that xtask parses the lines with
//! the same names the plugin writes. Nothing here depends on QEMU. [`cache`] is the cache model
//! with the Cortex-A72's geometry that the plugin's cache mode feeds.
//! [`model`] costs a row's events as modelled (uncalibrated) Cortex-A72 cycles. [`count`] is
//! the plugin's whole-run mode: every instruction of a run, split at a user program's marks.
#![cfg_attr(not(test), no_std)]
#![forbid(unsafe_code)]

extern crate alloc;

pub mod cache;
pub mod classify;
pub mod count;
pub mod model;
pub mod window;

pub use classify::{Branch, Class, classify};
pub use window::{Counter, VectorEntry, WindowCounts};
