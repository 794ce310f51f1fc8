//! Hijacked returns: the return-instance stack of return probes, and how the walkers repair the
//! return addresses they replaced.
//!
//! A return probe (kretprobe, uretprobe, a function-graph tracer) hijacks a function's return at
//! its entry: x30 is saved in a [`HijackedReturn`] and replaced by a trampoline address, so the
//! function returns into the trampoline, which runs the return handler and then goes to the real
//! address. Until then the trampoline address, not the caller, is what the function's frame
//! record and shadow-call-stack slot hold, and what a walker would report.
//!
//! # Instances
//!
//! A [`ReturnStack`] holds the hijacked returns of one context (a task, or a CPU's IRQ context),
//! oldest first. An instance is keyed by where the function's return lands:
//! - `entry_sp`: SP at the function's entry, which is SP again when it returns to the trampoline
//!   (the call/return pair leaves SP unchanged). Entries are pushed in non-increasing `entry_sp`
//!   order: a callee's SP is at or below its caller's. Equal SPs come from a tail call of a
//!   probed function by a probed function (the second hijack saves the trampoline as "real").
//! - `shadow_slot`: x18 at entry, the shadow-call-stack slot the function's prologue pushes x30
//!   to (builds with SCS only).
//!
//! At the trampoline, entries whose `entry_sp` is below SP belong to frames that are gone without
//! returning (a caught fault, a killed context): they are *abandoned* and dropped first, as Linux
//! does when it meets an orphaned instance. The top entry must then have `entry_sp == SP`.
//!
//! # Repair
//!
//! A walker that reads the trampoline address asks a [`ReturnRepair`] for the real one:
//! - a frame record at address `record` lies in the frame of the probed function, below its
//!   `entry_sp` and at or above the `entry_sp` of any function it called; so its instance is the
//!   newest one with `entry_sp > record` ([`ReturnStack::frame_return`]);
//! - a shadow-stack slot is the instance's `shadow_slot` exactly ([`ReturnStack::shadow_return`]).
//!
//! Both match by location, not by counting trampolines met: a trace that skips entries, starts in
//! an IRQ, or is taken while an instance is being pushed or popped still pairs each hijacked
//! return with its own instance. A real address that is itself the trampoline (the tail-call
//! case) resolves through the next older instance at the same SP.

/// One hijacked return. `repr(C)`: the function-graph tracer pushes and pops entries in asm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct HijackedReturn {
    /// SP at the function's entry (and at its return into the trampoline).
    pub entry_sp: u64,
    /// x18 at the function's entry: the shadow-stack slot its prologue pushes x30 to.
    pub shadow_slot: u64,
    /// The real return address (x30 at entry, before the prologue signs it).
    pub real: u64,
    /// The owner's word (which probe).
    pub cookie: u64,
    /// The owner's per-instance data (e.g. what an entry handler wants its return handler to see).
    pub data: u64,
}

impl HijackedReturn {
    /// An all-zero entry (for array initialisers).
    pub const EMPTY: Self = Self { entry_sp: 0, shadow_slot: 0, real: 0, cookie: 0, data: 0 };
}

/// What a walker asks when it reads a hijacked return address.
///
/// Two owners hijack returns, each with its own trampoline: return probes ([`Self::trampoline`])
/// and the function-graph tracer ([`Self::graph_trampoline`], 0 when no graph return can be
/// outstanding in the walked contexts). One function may be hijacked by both: the graph tracer
/// hooks the return first (its call slot runs before the function's first instruction, where a
/// return probe attaches), so the probe's saved "real" address is the graph trampoline, which
/// [`Self::repaired_frame`] and [`Self::repaired_shadow`] resolve in turn. A walker calls those
/// two for any address equal to either trampoline.
pub trait ReturnRepair {
    /// The (PAC-stripped) address that stands for a hijacked return.
    fn trampoline(&self) -> u64;
    /// The real return address for the frame record at `record` that holds the trampoline.
    fn frame_return(&self, record: u64) -> Option<u64>;
    /// The real return address for the shadow-stack slot at `slot` that holds the trampoline.
    fn shadow_return(&self, slot: u64) -> Option<u64>;

    /// The function-graph tracer's return trampoline, or 0 when no graph return can be
    /// outstanding (then a walker compares one address per frame, as without the tracer).
    fn graph_trampoline(&self) -> u64 {
        0
    }
    /// Both trampolines, for a walk that compares both: `(probes', graph tracer's)`. A repair
    /// whose [`Self::trampoline`] is a fast-path word that reads 0 while graph returns may exist
    /// (the kernel's frame walk) gives the real pair here.
    fn trampolines(&self) -> (u64, u64) {
        (self.trampoline(), self.graph_trampoline())
    }
    /// The real return address for the frame record at `record` that holds the graph trampoline.
    fn graph_frame_return(&self, _record: u64) -> Option<u64> {
        None
    }
    /// The real return address for the shadow-stack slot at `slot` that holds the graph
    /// trampoline.
    fn graph_shadow_return(&self, _slot: u64) -> Option<u64> {
        None
    }

    /// What the frame record at `record` returns to, given the (stripped) `address` it holds:
    /// `address` itself unless it is a trampoline; through both owners' instances otherwise (a
    /// probe's real address may be the graph trampoline, a tail call's the probe's). An address
    /// no instance accounts for is returned as read.
    fn repaired_frame(&self, address: u64, record: u64) -> u64 {
        repaired(
            self,
            address,
            |repair, graph| {
                if graph { repair.graph_frame_return(record) } else { repair.frame_return(record) }
            },
        )
    }

    /// What the shadow-stack slot at `slot` returns to, given the (stripped) `address` it holds
    /// (as [`Self::repaired_frame`]).
    fn repaired_shadow(&self, address: u64, slot: u64) -> u64 {
        repaired(
            self,
            address,
            |repair, graph| {
                if graph { repair.graph_shadow_return(slot) } else { repair.shadow_return(slot) }
            },
        )
    }
}

/// Resolves `address` through at most [`MAX_CHAIN`] trampolines; `ask(repair, graph)` asks the
/// graph tracer's instances (`graph`) or the probes'.
#[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
fn repaired<R: ReturnRepair + ?Sized>(repair: &R, address: u64, mut ask: impl FnMut(&R, bool) -> Option<u64>) -> u64 {
    let (probe, graph) = repair.trampolines();
    let mut address = address;
    let mut step = 0;
    while step < MAX_CHAIN {
        let real = if address == probe && probe != 0 {
            ask(repair, false)
        } else if address == graph && graph != 0 {
            ask(repair, true)
        } else {
            return address;
        };
        match real {
            Some(real) => address = real,
            None => return address,
        }
        step += 1;
    }
    address
}

/// Trampolines one return address may pass through: a return probe's, then the graph tracer's,
/// then, for a tail call between hijacked functions, the caller's pair.
const MAX_CHAIN: usize = 4;

/// The push failed: the stack is full (the hit counts as missed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReturnStackFull;

/// The hijacked returns of one context, oldest first, at most `N`.
///
/// `repr(C)`: the entries from offset 0, then the length at [`Self::LEN_OFFSET`], for code that
/// pushes and pops in asm (the function-graph tracer's entry and return). Such code keeps the
/// same order: an entry is written before the length grows.
#[derive(Debug)]
#[repr(C)]
pub struct ReturnStack<const N: usize> {
    entries: [HijackedReturn; N],
    len: usize,
}

impl<const N: usize> Default for ReturnStack<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> ReturnStack<N> {
    /// Where the length lies (after `N` entries of `size_of::<HijackedReturn>()` bytes).
    pub const LEN_OFFSET: usize = core::mem::offset_of!(Self, len);

    /// An empty stack.
    pub const fn new() -> Self {
        Self { entries: [HijackedReturn::EMPTY; N], len: 0 }
    }

    /// The live entries, oldest first.
    pub fn entries(&self) -> &[HijackedReturn] {
        &self.entries[..self.len]
    }

    /// Number of live entries.
    pub const fn len(&self) -> usize {
        self.len
    }

    /// Whether no return is hijacked.
    pub const fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Drops the entries whose frames are gone: `entry_sp` below `sp`, the SP of a function
    /// entry or of a return into the trampoline. Each dropped entry is passed to `abandoned`.
    pub fn drop_abandoned(&mut self, sp: u64, mut abandoned: impl FnMut(&HijackedReturn)) {
        while self.len > 0 && self.entries[self.len - 1].entry_sp < sp {
            self.len -= 1;
            abandoned(&self.entries[self.len]);
        }
    }

    /// Records a hijacked return (after [`Self::drop_abandoned`] at the same SP). The entry is
    /// written before the length grows, so a walker interrupting the push never reads a
    /// half-written entry.
    pub fn push(&mut self, entry: HijackedReturn) -> Result<(), ReturnStackFull> {
        if self.len >= N {
            return Err(ReturnStackFull);
        }
        self.entries[self.len] = entry;
        core::sync::atomic::compiler_fence(core::sync::atomic::Ordering::Release);
        self.len += 1;
        Ok(())
    }

    /// The newest entry, if its function returns at `sp` (after [`Self::drop_abandoned`]).
    pub fn top_at(&self, sp: u64) -> Option<HijackedReturn> {
        let top = *self.entries[..self.len].last()?;
        (top.entry_sp == sp).then_some(top)
    }

    /// Removes the newest entry.
    pub fn pop(&mut self) -> Option<HijackedReturn> {
        self.len = self.len.checked_sub(1)?;
        Some(self.entries[self.len])
    }

    /// Forgets every entry (a new task in this context).
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// The real return address for a frame record at `record` holding `trampoline`: the newest
    /// entry with `entry_sp > record`, resolved through tail-call chains.
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    pub fn frame_return(&self, record: u64, trampoline: u64) -> Option<u64> {
        let mut index = self.len;
        while index > 0 {
            index -= 1;
            if self.entries[index].entry_sp > record {
                return self.resolve(index, trampoline);
            }
        }
        None
    }

    /// The real return address for the shadow-stack slot at `slot` holding `trampoline`.
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    pub fn shadow_return(&self, slot: u64, trampoline: u64) -> Option<u64> {
        let mut index = self.len;
        while index > 0 {
            index -= 1;
            if self.entries[index].shadow_slot == slot {
                return self.resolve(index, trampoline);
            }
        }
        None
    }

    /// Entry `index`'s real address, or, while that is the trampoline itself (a tail call between
    /// probed functions), the next older entry's at the same SP.
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    fn resolve(&self, mut index: usize, trampoline: u64) -> Option<u64> {
        loop {
            let entry = self.entries[index];
            if entry.real != trampoline {
                return Some(entry.real);
            }
            if index == 0 || self.entries[index - 1].entry_sp != entry.entry_sp {
                return None;
            }
            index -= 1;
        }
    }
}
