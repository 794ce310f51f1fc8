//! What xtask compiled: the build variant and the instrumentation it implies.

/// The build variant xtask compiled (full, prod, plain or mte), so the kernel knows which
/// instrumentation to expect.
pub const VARIANT: &str = match option_env!("TRACELAB_VARIANT") {
    Some(variant) => variant,
    None => "unknown",
};

/// Whether the kernel is built with the shadow call stack (x18 reserved and used).
pub const SHADOW_CALL_STACK: bool = matches!(VARIANT.as_bytes(), b"full" | b"prod" | b"mte");
