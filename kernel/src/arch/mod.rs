//! Architecture support; tracelab is arm64 only, so this re-exports `aarch64`.

pub mod aarch64;
pub use aarch64::*;
