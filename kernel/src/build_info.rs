//! What xtask compiled: the build variant and the instrumentation it implies.

/// The build variant xtask compiled (full, prod, plain, mte or nofp), so the kernel knows which
/// instrumentation to expect.
pub const VARIANT: &str = match option_env!("TRACELAB_VARIANT") {
    Some(variant) => variant,
    None => "unknown",
};

/// Whether the kernel is built with the shadow call stack (x18 reserved and used).
pub const SHADOW_CALL_STACK: bool = matches!(VARIANT.as_bytes(), b"full" | b"prod" | b"mte" | b"nofp");

/// Whether x29 holds frame records a walk may follow. `nofp` is built without frame pointers:
/// x29 is an ordinary register there, so every frame-record walk is refused, not attempted
/// (`plain` keeps the compiler's default and its walks stay best effort: see the tests).
pub const FRAME_POINTERS: bool = !matches!(VARIANT.as_bytes(), b"nofp");
