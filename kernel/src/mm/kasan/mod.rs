//! The tag-based sanitizer (KASAN in the manner of Linux's SW_TAGS): heap, tag storage,
//! stack ring, reports and the compiler ABI.
//!
//! Layering, lowest first (each file uses only those above it in this list):
//! - `storage.rs`: the tag-storage seam (`TagStorage`, the `Tags` implementation in use,
//!   pointer-tag helpers); `shadow.rs`: the software shadow behind it.
//! - `ring.rs`: the stack ring of recent allocations and frees.
//! - `report.rs`: classification and KASAN-style reports, and [`recording`], the one scope in
//!   which tests provoke reports.
//! - `heap.rs`: the sanitizer heap (global allocator), which writes the ring and reports bad
//!   frees.
//! - `abi.rs`: what the compiler calls (`__hwasan_tag_mismatch`, `__hwasan_{load,store}N`,
//!   `__hwasan_mem*`), which asks the heap for the faulting object and reports.

pub mod abi;
pub mod heap;
#[cfg(feature = "mte")]
pub mod mte;
pub mod options;
pub mod report;
pub mod ring;
#[cfg_attr(
    feature = "mte",
    allow(
        dead_code,
        reason = "build variant `mte` keeps its tags in MTE, not in the shadow (only DEFAULT_SEED is used)"
    )
)]
pub mod shadow;
pub mod storage;

pub use report::recording;
pub use shadow::SHORT_GRANULES;

/// Whether this kernel was built with the sanitizer's checks (build variant `full`).
pub const CHECKS_COMPILED_IN: bool = matches!(crate::build_info::VARIANT.as_bytes(), b"full");
/// Whether this kernel's heap tags are MTE allocation tags that the hardware checks on every
/// access (build variant `mte`, KASAN HW_TAGS).
pub const HARDWARE_TAGS: bool = cfg!(feature = "mte");
