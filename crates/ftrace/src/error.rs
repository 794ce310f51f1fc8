//! Why initialising, registering or patching was refused.

use core::fmt;

use crate::callsite::BranchError;
use crate::dispatch::TracerId;

/// Why a [`Registry`](crate::Registry) operation was refused. Every check
/// that can fail is made before the first write of the operation that
/// fails, except [`Error::UnexpectedInstruction`] and
/// [`Error::UnexpectedLiteral`] in `apply`, which stop it at the first
/// site whose text is not what the registry wrote there (the sites before
/// it are patched and recorded consistently).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Error {
    /// `initialise` was called again. It is the only place where `NOP ->
    /// mov x9, x30` is written, because that is not a safe concurrent
    /// modification: never at run time.
    AlreadyInitialised,
    /// Registering or applying before `initialise`.
    NotInitialised,
    /// An ops address (tracer, nop ops, list ops) is 0.
    NullAddress,
    /// More entries than the table's `SITES`.
    TooManySites { capacity: usize },
    /// An entry is not 8-aligned, so its literal cannot be stored atomically.
    MisalignedEntry { entry: u64 },
    /// The same entry twice.
    DuplicateEntry { entry: u64 },
    /// `entry` would be more than `limit` slots from its home slot in the
    /// site index (entries that collide in its hash): the lookup's bound
    /// would not find it.
    SiteIndexProbe { entry: u64, limit: usize },
    /// `bl trampoline` cannot be encoded at a site (checked for every
    /// traceable site at `initialise`).
    Branch(BranchError),
    /// The text at `address` is not what the compiler or the registry left
    /// there: another patcher, a wrong entry, or a wrong layout.
    UnexpectedInstruction { address: u64, expected: u32, found: u32 },
    /// The literal at `address` is not the one the registry wrote.
    UnexpectedLiteral { address: u64, expected: u64, found: u64 },
    /// A site index beyond the table.
    NoSuchSite { site: usize },
    /// A filter names a site that was excluded at `initialise`; tracing it
    /// would need `NOP -> mov x9, x30` at run time.
    SiteNotInitialised { site: usize },
    /// Every tracer slot is registered or waiting for a grace period.
    RegistryFull,
    /// `unregister` of a tracer that is not registered.
    NotRegistered { tracer: TracerId },
}

impl From<BranchError> for Error {
    fn from(error: BranchError) -> Self {
        Self::Branch(error)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::AlreadyInitialised => write!(f, "ftrace already initialised: mov x9, x30 is written only once"),
            Self::NotInitialised => write!(f, "ftrace not initialised"),
            Self::NullAddress => write!(f, "ops address is 0"),
            Self::TooManySites { capacity } => write!(f, "more than {capacity} patchable entries"),
            Self::MisalignedEntry { entry } => write!(f, "patchable entry {entry:#x} is not 8-aligned"),
            Self::DuplicateEntry { entry } => write!(f, "patchable entry {entry:#x} listed twice"),
            Self::SiteIndexProbe { entry, limit } => {
                write!(f, "patchable entry {entry:#x} is more than {limit} slots from its home in the site index")
            }
            Self::Branch(error) => error.fmt(f),
            Self::UnexpectedInstruction { address, expected, found } => {
                write!(f, "text at {address:#x} is {found:#010x}, expected {expected:#010x}")
            }
            Self::UnexpectedLiteral { address, expected, found } => {
                write!(f, "literal at {address:#x} is {found:#x}, expected {expected:#x}")
            }
            Self::NoSuchSite { site } => write!(f, "no callsite {site}"),
            Self::SiteNotInitialised { site } => write!(f, "callsite {site} was not initialised"),
            Self::RegistryFull => write!(f, "no free tracer slot"),
            Self::NotRegistered { tracer } => write!(f, "tracer {} is not registered", tracer.0),
        }
    }
}
