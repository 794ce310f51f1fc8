//! The tag-based sanitizer (KASAN in the manner of Linux's SW_TAGS, or HW_TAGS with MTE): heap,
//! tag storage, stack ring, the record step, reports and the compiler ABI.
//!
//! Layering, lowest first (each file uses only those above it in this list):
//! - `storage.rs`: the tag-storage seam (`TagStorage`, pointer-tag helpers); `shadow.rs` (the
//!   software shadow) and `hw_tags.rs` (MTE allocation tags) implement it; this file chooses
//!   the implementation in use, [`Tags`].
//! - `ring.rs`: the stack ring of recent allocations and frees.
//! - `report.rs`: KASAN-style reports of what it is handed, the policy and the report count.
//! - `record.rs`: the record step, which gathers what a report prints (object, heap range,
//!   stacks, memory state) and hands it to the report.
//! - `blocks.rs`: the block table, the heap's buddy allocator with all its metadata in a side
//!   table (never in the heap's memory).
//! - `heap.rs`: the sanitizer heap (global allocator), which writes the ring, records bad frees
//!   and tells the record step what it knows about an address.
//! - `abi.rs`: what the compiler calls (`__hwasan_tag_mismatch`, `__hwasan_{load,store}N`,
//!   `__hwasan_mem*`); `mte.rs`: MTE tag check faults. Both record through the heap's view.
//! - `recording.rs`: the recording scope in which tests provoke reports.

pub mod abi;
pub mod blocks;
pub mod heap;
#[cfg(feature = "mte")]
pub mod hw_tags;
#[cfg(feature = "mte")]
pub mod mte;
pub mod options;
pub mod record;
pub mod recording;
pub mod report;
pub mod ring;
#[cfg_attr(
    feature = "mte",
    allow(
        dead_code,
        reason = "build variant `mte` keeps its heap's tags in MTE, not in the shadow (DEFAULT_SEED and the \
                  generator's per-CPU test use it)"
    )
)]
pub mod shadow;
pub mod storage;

pub use shadow::SHORT_GRANULES;

/// The tag storage in use: MTE allocation tags in build variant `mte`, else the software shadow.
#[cfg(feature = "mte")]
pub type Tags = hw_tags::MteTags;
/// The tag storage in use: MTE allocation tags in build variant `mte`, else the software shadow.
#[cfg(not(feature = "mte"))]
pub type Tags = shadow::ShadowTags;

/// Whether this kernel was built with the sanitizer's checks (build variant `full`).
pub const CHECKS_COMPILED_IN: bool = matches!(crate::build_info::VARIANT.as_bytes(), b"full");
/// Whether this kernel's heap tags are MTE allocation tags that the hardware checks on every
/// access (build variant `mte`, KASAN HW_TAGS).
pub const HARDWARE_TAGS: bool = cfg!(feature = "mte");
