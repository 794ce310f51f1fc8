//! The lock-free table that the per-call path reads: sites, sets, ops.
//!
//! Only the [`Registry`](crate::Registry) writes it, under the kernel's
//! lock; every field is an atomic that is changed by single stores, so the
//! per-call path needs no lock (see "Concurrency" in the crate docs).

use core::sync::atomic::{AtomicU64, Ordering};

use crate::Error;

/// An acquire load for the per-call path. With the `kernel` feature it is
/// the `atomic_load` intrinsic itself: `AtomicU64::load` is a function that
/// LLVM will not inline into a function built with the sanitizer off, so it
/// would be an out-of-line, instrumented call on every traced call. Always
/// inlined, so it is instrumented or not as its caller is: every caller is
/// built with the sanitizer off.
#[inline(always)]
fn load_acquire(word: &AtomicU64) -> u64 {
    #[cfg(feature = "kernel")]
    {
        let pointer = word as *const AtomicU64 as *const u64;
        // SAFETY: `AtomicU64` has the same in-memory representation as
        // `u64`; `pointer` comes from a reference, so it is valid and
        // aligned; and the access is atomic, exactly what `AtomicU64::load`
        // performs.
        unsafe { core::intrinsics::atomic_load::<u64, { core::intrinsics::AtomicOrdering::Acquire }>(pointer) }
    }
    #[cfg(not(feature = "kernel"))]
    word.load(Ordering::Acquire)
}

/// A relaxed load for the per-call path (see [`load_acquire`]).
#[inline(always)]
fn load_relaxed(word: &AtomicU64) -> u64 {
    #[cfg(feature = "kernel")]
    {
        let pointer = word as *const AtomicU64 as *const u64;
        // SAFETY: as in `load_acquire`.
        unsafe { core::intrinsics::atomic_load::<u64, { core::intrinsics::AtomicOrdering::Relaxed }>(pointer) }
    }
    #[cfg(not(feature = "kernel"))]
    word.load(Ordering::Relaxed)
}

/// A tracer's index in the registry: `0..64 * TRACER_WORDS`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct TracerId(pub u16);

impl TracerId {
    /// The index as a `usize`.
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

/// A set of tracers: one bit per [`TracerId`], `64 * TRACER_WORDS` bits.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct TracerSet<const TRACER_WORDS: usize> {
    words: [u64; TRACER_WORDS],
}

impl<const TRACER_WORDS: usize> TracerSet<TRACER_WORDS> {
    /// The empty set.
    pub const EMPTY: Self = Self { words: [0; TRACER_WORDS] };

    /// The set whose bit `64 * i + j` is bit `j` of `words[i]`.
    pub const fn from_words(words: [u64; TRACER_WORDS]) -> Self {
        Self { words }
    }

    /// The bits, 64 tracers per word.
    pub const fn words(&self) -> [u64; TRACER_WORDS] {
        self.words
    }

    /// Whether `tracer` is in the set.
    #[inline]
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    pub fn contains(&self, tracer: TracerId) -> bool {
        let index = tracer.0 as usize;
        index < 64 * TRACER_WORDS && self.words[index / 64] & 1 << (index % 64) != 0
    }

    /// Adds `tracer`; ignored if it is beyond the set's capacity.
    pub fn insert(&mut self, tracer: TracerId) {
        let index = tracer.index();
        if index < 64 * TRACER_WORDS {
            self.words[index / 64] |= 1 << (index % 64);
        }
    }

    /// Removes `tracer`.
    pub fn remove(&mut self, tracer: TracerId) {
        let index = tracer.index();
        if index < 64 * TRACER_WORDS {
            self.words[index / 64] &= !(1 << (index % 64));
        }
    }

    /// How many tracers are in the set.
    pub fn len(&self) -> usize {
        self.words.iter().map(|word| word.count_ones() as usize).sum()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.words.iter().all(|&word| word == 0)
    }

    /// The only member, if the set has exactly one.
    pub fn single(&self) -> Option<TracerId> {
        let mut iter = self.iter();
        let first = iter.next()?;
        if iter.next().is_some() { None } else { Some(first) }
    }

    /// The intersection of two sets.
    #[inline]
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    pub fn and(mut self, other: &Self) -> Self {
        let mut index = 0;
        while index < TRACER_WORDS {
            self.words[index] &= other.words[index];
            index += 1;
        }
        self
    }

    /// The members in increasing order.
    #[inline]
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    pub fn iter(&self) -> TracerSetIter<TRACER_WORDS> {
        TracerSetIter { words: self.words, word: 0 }
    }
}

impl<const TRACER_WORDS: usize> IntoIterator for TracerSet<TRACER_WORDS> {
    type Item = TracerId;
    type IntoIter = TracerSetIter<TRACER_WORDS>;

    #[inline]
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

/// Iterator over a [`TracerSet`]: one `trailing_zeros` per member, one
/// test per empty word, so walking a set costs `TRACER_WORDS + members`.
#[derive(Clone, Debug)]
pub struct TracerSetIter<const TRACER_WORDS: usize> {
    words: [u64; TRACER_WORDS],
    word: usize,
}

impl<const TRACER_WORDS: usize> Iterator for TracerSetIter<TRACER_WORDS> {
    type Item = TracerId;

    #[inline]
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    fn next(&mut self) -> Option<TracerId> {
        while self.word < TRACER_WORDS {
            let bits = self.words[self.word];
            if bits != 0 {
                self.words[self.word] = bits & (bits - 1);
                return Some(TracerId((self.word * 64 + bits.trailing_zeros() as usize) as u16));
            }
            self.word += 1;
        }
        None
    }
}

/// What one slot of a site index probe holds.
enum Probe {
    /// The entry's site.
    Found(usize),
    /// An empty slot: the entry is not in the table.
    Empty,
    /// Another entry's site: the probe goes on.
    Other,
}

/// What the per-call path reads, shared between CPUs without a lock.
///
/// `SITES` is the capacity of the callsite table, `64 * TRACER_WORDS` the
/// number of tracers, `VECTORS` the number of vector slots of
/// [`Scheme::Vector`](crate::Scheme::Vector). The kernel keeps one in a
/// static next to the locked [`Registry`](crate::Registry) that fills it:
/// about `8 * (SITES * (2 + TRACER_WORDS) + TRACER_WORDS * (65 + VECTORS))`
/// bytes (130 KiB for 4096 sites, 128 tracers and 64 vectors; the site
/// index is 8 of the 32 bytes per site).
///
/// `repr(C)` in the order rustc chose for the fields before the site index
/// was added, the index last: the list and vector functions address the
/// table's fields by constant offsets, and their icount rows stay as they
/// were.
#[repr(C)]
pub struct DispatchTable<const SITES: usize, const TRACER_WORDS: usize, const VECTORS: usize> {
    /// For each site, the tracers whose filter contains it. A tracer's bits
    /// are set before it is published in `registered` and cleared only after
    /// a grace period following its unregistration.
    pub(crate) site_tracers: [[AtomicU64; TRACER_WORDS]; SITES],
    /// Entries `E` of the initialised table, sorted, written once by
    /// `Registry::initialise` before any site calls the trampoline.
    pub(crate) entries: [AtomicU64; SITES],
    /// Each tracer's ops address, written before it is published.
    pub(crate) ops: [[AtomicU64; 64]; TRACER_WORDS],
    /// Each vector slot's tracers, written before a literal points at the
    /// slot and not changed until a grace period after none does.
    pub(crate) vectors: [[AtomicU64; TRACER_WORDS]; VECTORS],
    /// The published tracers.
    pub(crate) registered: [AtomicU64; TRACER_WORDS],
    pub(crate) site_count: AtomicU64,
    /// The site index: an open-addressing hash table of `4 * SITES` slots,
    /// four 16-bit slots per word (slot `s` is bits `16 * (s % 4)..` of word
    /// `s / 4`), each `site + 1` or 0 for empty. Written with `entries`
    /// (see [`DispatchTable::site_index`]).
    pub(crate) index: [AtomicU64; SITES],
    /// The longest probe sequence of an entry in `index` (1: at its home).
    pub(crate) longest_probe: AtomicU64,
}

impl<const SITES: usize, const TRACER_WORDS: usize, const VECTORS: usize> Default
    for DispatchTable<SITES, TRACER_WORDS, VECTORS>
{
    fn default() -> Self {
        Self::new()
    }
}

impl<const SITES: usize, const TRACER_WORDS: usize, const VECTORS: usize> DispatchTable<SITES, TRACER_WORDS, VECTORS> {
    /// Number of tracers the table holds.
    pub const TRACERS: usize = 64 * TRACER_WORDS;

    /// Slots of the site index: 4 per site, so it is at most a quarter full.
    pub const INDEX_SLOTS: usize = 4 * SITES;

    /// The most slots a lookup probes: `initialise` refuses entries that
    /// would be further from their home slot, so this bounds every lookup,
    /// of an entry or not.
    pub const MAX_PROBES: usize = 16;

    /// An empty table, for a static.
    pub const fn new() -> Self {
        const { assert!(SITES < 1 << 16, "a site index slot holds site + 1 in 16 bits") };
        Self {
            entries: [const { AtomicU64::new(0) }; SITES],
            site_count: AtomicU64::new(0),
            site_tracers: [const { [const { AtomicU64::new(0) }; TRACER_WORDS] }; SITES],
            registered: [const { AtomicU64::new(0) }; TRACER_WORDS],
            ops: [const { [const { AtomicU64::new(0) }; 64] }; TRACER_WORDS],
            vectors: [const { [const { AtomicU64::new(0) }; TRACER_WORDS] }; VECTORS],
            index: [const { AtomicU64::new(0) }; SITES],
            longest_probe: AtomicU64::new(0),
        }
    }

    /// Number of sites in the table (0 before initialisation).
    #[inline]
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    pub fn site_count(&self) -> usize {
        let count = load_acquire(&self.site_count);
        if count < SITES as u64 { count as usize } else { SITES }
    }

    /// The entry address `E` of `site`.
    pub fn entry(&self, site: usize) -> Option<u64> {
        if site < self.site_count() { Some(self.entries[site].load(Ordering::Relaxed)) } else { None }
    }

    /// The index of the site whose entry is `entry`: the list function's
    /// ip-to-site step (the trampoline's `x30` gives the entry through
    /// [`CallSite::from_return_address`](crate::CallSite::from_return_address)).
    ///
    /// Constant time, whatever the number of sites: a linear probe of the
    /// site index from the entry's home slot ([`DispatchTable::home_slot`]),
    /// one index load and one entry load per slot, until the entry, an empty
    /// slot, or the table's longest probe (at most [`Self::MAX_PROBES`]:
    /// `initialise` refuses entries further from their home). With at most
    /// `SITES` entries in `4 * SITES` slots nearly every entry is at its home
    /// (744 of the `prod` kernel's 759): that slot is checked inline, the
    /// rest of the probe out of line.
    #[inline]
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    pub fn site_index(&self, entry: u64) -> Option<usize> {
        let count = self.site_count();
        if count == 0 {
            return None;
        }
        // The home slot inline (where nearly every entry is), the rest of
        // the probe out of line: the caller's own loop keeps its registers.
        let home = Self::home_slot(entry);
        match self.probe(home, entry, count) {
            Probe::Found(site) => Some(site),
            Probe::Empty => None,
            Probe::Other => self.probe_beyond_home(home, entry, count),
        }
    }

    /// Whether `entry` sits at its home slot of the site index, where [`Self::site_index`]
    /// finds it without the out-of-line probe.
    pub fn at_home(&self, entry: u64) -> bool {
        let count = self.site_count();
        count != 0 && matches!(self.probe(Self::home_slot(entry), entry, count), Probe::Found(_))
    }

    /// Slot `slot` of the probe for `entry` (in a table of `count` sites).
    #[inline(always)]
    fn probe(&self, slot: usize, entry: u64, count: usize) -> Probe {
        let value = (load_relaxed(&self.index[slot / 4]) >> (slot % 4 * 16)) as u16 as usize;
        if value == 0 {
            return Probe::Empty;
        }
        let site = value - 1;
        if site < count && load_relaxed(&self.entries[site]) == entry { Probe::Found(site) } else { Probe::Other }
    }

    /// The probe after the home slot: at most `longest_probe - 1` more slots
    /// (every entry is within `longest_probe` of its home; written before
    /// `site_count`), never more than [`Self::MAX_PROBES`] in all.
    #[inline(never)]
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    fn probe_beyond_home(&self, home: usize, entry: u64, count: usize) -> Option<usize> {
        let longest = load_relaxed(&self.longest_probe);
        let limit = if longest < Self::MAX_PROBES as u64 { longest as usize } else { Self::MAX_PROBES };
        let mut slot = home;
        let mut probes = 1;
        while probes < limit {
            slot = if slot + 1 < Self::INDEX_SLOTS { slot + 1 } else { 0 };
            match self.probe(slot, entry, count) {
                Probe::Found(site) => return Some(site),
                Probe::Empty => return None,
                Probe::Other => probes += 1,
            }
        }
        None
    }

    /// The longest probe sequence of an entry in the site index, in slots
    /// (1: every entry is at its home slot; 0 before initialisation).
    pub fn longest_probe(&self) -> usize {
        self.longest_probe.load(Ordering::Relaxed) as usize
    }

    /// Where the probe for `entry` starts in the site index: a multiplicative
    /// (Fibonacci) hash of `entry >> 3` (entries are 8-aligned), scaled to
    /// `4 * SITES` slots by its high half (`umulh`, a shift when `SITES` is a
    /// power of two).
    #[inline(always)]
    pub fn home_slot(entry: u64) -> usize {
        let hash = (entry >> 3).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        ((hash as u128 * Self::INDEX_SLOTS as u128) >> 64) as usize
    }

    /// Writes `entries` (sorted) as sites `0..` and builds the site index over
    /// them; nothing is published (`site_count` is the caller's). Fails with
    /// [`Error::SiteIndexProbe`] at the first entry that would be more than
    /// [`Self::MAX_PROBES`] slots from its home. Returns the longest probe.
    pub(crate) fn write_entries(&self, entries: impl IntoIterator<Item = u64>) -> Result<usize, Error> {
        for word in &self.index {
            word.store(0, Ordering::Relaxed);
        }
        let mut longest = 0;
        for (site, entry) in entries.into_iter().enumerate() {
            self.entries[site].store(entry, Ordering::Relaxed);
            let mut slot = Self::home_slot(entry);
            let mut probes = 1;
            while self.index_slot(slot) != 0 {
                if probes == Self::MAX_PROBES {
                    return Err(Error::SiteIndexProbe { entry, limit: Self::MAX_PROBES });
                }
                slot = (slot + 1) % Self::INDEX_SLOTS;
                probes += 1;
            }
            let word = &self.index[slot / 4];
            let value = (site as u64 + 1) << (slot % 4 * 16);
            word.store(word.load(Ordering::Relaxed) | value, Ordering::Relaxed);
            longest = longest.max(probes);
        }
        self.longest_probe.store(longest as u64, Ordering::Relaxed);
        Ok(longest)
    }

    /// Slot `slot` of the site index: `site + 1`, or 0 if empty.
    fn index_slot(&self, slot: usize) -> u16 {
        (self.index[slot / 4].load(Ordering::Relaxed) >> (slot % 4 * 16)) as u16
    }

    /// Empties slot `slot` of the site index: the host tests use it to show
    /// that the lookup depends on the index (the entry stored there is no
    /// longer found, and a probe through it stops there). Not a fault switch:
    /// no production path asks for it.
    pub fn clear_index_slot(&self, slot: usize) {
        if let Some(word) = self.index.get(slot / 4) {
            word.fetch_and(!(0xffff << (slot % 4 * 16)), Ordering::Relaxed);
        }
    }

    /// The published tracers: what the seed's list function walks.
    #[inline]
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    pub fn registered(&self) -> TracerSet<TRACER_WORDS> {
        let mut words = [0; TRACER_WORDS];
        let mut index = 0;
        while index < TRACER_WORDS {
            words[index] = load_acquire(&self.registered[index]);
            index += 1;
        }
        TracerSet { words }
    }

    /// Whether published tracer `tracer` traces `site`: two loads, O(1).
    #[inline]
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    pub fn traces(&self, site: usize, tracer: TracerId) -> bool {
        let index = tracer.0 as usize;
        if site >= SITES || index >= Self::TRACERS {
            return false;
        }
        let bit = 1 << (index % 64);
        load_acquire(&self.registered[index / 64]) & bit != 0
            && load_relaxed(&self.site_tracers[site][index / 64]) & bit != 0
    }

    /// The published tracers that trace `site`, read in `2 * TRACER_WORDS`
    /// loads: a list function that walks this instead of every registered
    /// tracer costs nothing per irrelevant tracer.
    #[inline]
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    pub fn relevant(&self, site: usize) -> TracerSet<TRACER_WORDS> {
        if site >= SITES {
            return TracerSet::EMPTY;
        }
        let mut words = self.registered().words;
        let mut index = 0;
        while index < TRACER_WORDS {
            words[index] &= load_relaxed(&self.site_tracers[site][index]);
            index += 1;
        }
        TracerSet { words }
    }

    /// The ops address registered for `tracer` (0 if never registered).
    #[inline]
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    pub fn ops_address(&self, tracer: TracerId) -> u64 {
        let index = tracer.0 as usize;
        if index >= Self::TRACERS {
            return 0;
        }
        load_relaxed(&self.ops[index / 64][index % 64])
    }

    /// The tracers of vector slot `slot` that are still published: what the
    /// kernel's vector function walks (`TRACER_WORDS + members` steps, no
    /// site lookup). An unregistered tracer drops out at once, before the
    /// `apply` that retargets the sites.
    #[inline]
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    pub fn vector(&self, slot: usize) -> TracerSet<TRACER_WORDS> {
        if slot >= VECTORS {
            return TracerSet::EMPTY;
        }
        let mut words = self.registered().words;
        let mut index = 0;
        while index < TRACER_WORDS {
            words[index] &= load_relaxed(&self.vectors[slot][index]);
            index += 1;
        }
        TracerSet { words }
    }
}
