//! The tracer registry, each site's state machine, and the patch planner.
//!
//! Everything here runs under the kernel's ftrace lock; what the per-call
//! path needs is published to the [`DispatchTable`] with single stores.

use core::sync::atomic::Ordering;

use crate::callsite::{CallSite, MOV_X9_X30, NOP};
use crate::dispatch::{DispatchTable, TracerId, TracerSet};
use crate::error::Error;
use crate::patcher::{EnableOrder, TextPatcher};

/// How a site traced by some tracers dispatches to them.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Scheme {
    /// Every traced site's literal is the list ops; the kernel's list
    /// function finds the site and tests each tracer (the seed's "before").
    List,
    /// A site traced by exactly one tracer holds that tracer's ops; any
    /// other traced site the list ops (the seed's "after").
    CallOps,
    /// As `CallOps`, but a site traced by two or more tracers holds a vector
    /// ops: one of `VECTORS` immutable tracer sets, shared by every site with
    /// the same set, which the kernel's vector function walks without a site
    /// lookup and without looking at irrelevant tracers. When all slots are
    /// taken, such a site uses the list ops (slower, still correct).
    Vector,
}

/// Where the kernel's vector ops objects are: slot `i`'s object is at
/// `base + i * stride`. Only [`Scheme::Vector`] uses it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct VectorOps {
    /// Address of slot 0's ops object.
    pub base: u64,
    /// Distance between two slots' ops objects.
    pub stride: u64,
}

impl VectorOps {
    /// No vector ops: [`Scheme::Vector`] then behaves as [`Scheme::CallOps`].
    pub const NONE: Self = Self { base: 0, stride: 0 };

    /// The ops address of slot `slot`.
    pub const fn address(self, slot: usize) -> u64 {
        self.base.wrapping_add(self.stride.wrapping_mul(slot as u64))
    }
}

/// What the kernel provides at initialisation.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Config {
    /// The trampoline every enabled call slot branches to (within
    /// +-128 MiB of every traceable site).
    pub trampoline: u64,
    /// The ops whose function does nothing: the literal of every site that is
    /// not traced.
    pub nop_ops: u64,
    /// The ops whose function walks the registered tracers.
    pub list_ops: u64,
    /// The vector ops objects ([`Scheme::Vector`]).
    pub vector_ops: VectorOps,
    /// The scheme `apply` plans for (changeable with `Registry::set_scheme`).
    pub scheme: Scheme,
}

/// The state of one callsite's text.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum SiteState {
    /// As the compiler left it: four NOPs. Only sites excluded at
    /// `initialise` stay here, for good.
    Uninitialised,
    /// `mov x9, x30; nop`: the function runs untraced. `literal` is what the
    /// literal slot holds (the nop ops).
    Disabled { literal: u64 },
    /// `mov x9, x30; bl trampoline`: the trampoline calls the ops at
    /// `literal`.
    Calling { literal: u64 },
}

/// What a site should dispatch to, before it is turned into a literal.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Target<const TRACER_WORDS: usize> {
    /// No tracer traces it.
    Disabled,
    /// Exactly one tracer traces it and the scheme allows calling it directly.
    Own(TracerId),
    /// The list ops.
    List,
    /// A vector ops with exactly these tracers.
    Vector(TracerSet<TRACER_WORDS>),
}

/// Where a tracer slot is in its life.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum TracerState {
    /// Free for `register`.
    Free,
    /// Published: the list and vector functions call it, and `apply` patches
    /// its sites.
    Registered,
    /// Unpublished by `unregister`; sites may still call it directly until
    /// the next `apply`.
    Unregistered,
    /// No site refers to it since `apply` returned `generation`; it becomes
    /// free (and its memory may be freed) at `grace_period_elapsed(g)` with
    /// `g >= generation`.
    Retired { generation: u64 },
}

/// What one `apply` did.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct Applied {
    /// Pass it to `grace_period_elapsed` once every CPU has been outside the
    /// trampoline and all tracers since this `apply` returned.
    pub generation: u64,
    /// Sites that went from disabled to calling.
    pub enabled: usize,
    /// Sites that went from calling to disabled.
    pub disabled: usize,
    /// Calling sites whose literal changed.
    pub retargeted: usize,
    /// 64-bit literal stores.
    pub literal_writes: usize,
    /// Instruction writes (all NOP <-> BL).
    pub instruction_writes: usize,
    /// Sites that wanted a vector but got the list ops: no free slot.
    pub vector_fallbacks: usize,
}

/// What one `grace_period_elapsed` freed.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Reclaimed<const TRACER_WORDS: usize> {
    /// Tracers now free: the kernel may free their ops and reuse the ids.
    pub tracers: TracerSet<TRACER_WORDS>,
    /// Vector slots now free.
    pub vectors: usize,
}

#[derive(Clone, Copy, Debug)]
struct SiteRecord {
    entry: u64,
    state: SiteState,
    /// The vector slot its literal points at.
    vector: Option<usize>,
}

#[derive(Clone, Copy, Debug)]
enum TracerSlot {
    Free,
    Registered { ops: u64 },
    Unregistered,
    Retired { generation: u64 },
}

#[derive(Clone, Copy, Debug)]
enum VectorSlot<const TRACER_WORDS: usize> {
    Free,
    InUse { users: usize, tracers: TracerSet<TRACER_WORDS> },
    Retired { generation: u64 },
}

/// The registry of tracers and the state of every callsite. The kernel
/// keeps it behind its ftrace lock; it publishes what the per-call path
/// needs to `table`.
pub struct Registry<'table, const SITES: usize, const TRACER_WORDS: usize, const VECTORS: usize> {
    table: &'table DispatchTable<SITES, TRACER_WORDS, VECTORS>,
    config: Option<Config>,
    site_count: usize,
    sites: [SiteRecord; SITES],
    tracers: [[TracerSlot; 64]; TRACER_WORDS],
    vectors: [VectorSlot<TRACER_WORDS>; VECTORS],
    generation: u64,
}

impl<'table, const SITES: usize, const TRACER_WORDS: usize, const VECTORS: usize>
    Registry<'table, SITES, TRACER_WORDS, VECTORS>
{
    /// An empty registry that publishes to `table`.
    pub const fn new(table: &'table DispatchTable<SITES, TRACER_WORDS, VECTORS>) -> Self {
        Self {
            table,
            config: None,
            site_count: 0,
            sites: [SiteRecord { entry: 0, state: SiteState::Uninitialised, vector: None }; SITES],
            tracers: [[TracerSlot::Free; 64]; TRACER_WORDS],
            vectors: [VectorSlot::Free; VECTORS],
            generation: 0,
        }
    }

    /// The table this registry publishes to.
    pub fn table(&self) -> &'table DispatchTable<SITES, TRACER_WORDS, VECTORS> {
        self.table
    }

    /// Takes the callsites from `entries` (the contents of
    /// `__patchable_function_entries`, any order), sorts them (site indices
    /// are positions in that order), and initialises every site for which
    /// `traceable(entry)` holds: literal := nop ops, then `NOP -> mov x9, x30`.
    /// The others stay [`SiteState::Uninitialised`] for good.
    ///
    /// This is the only place that writes `mov x9, x30`, so it runs once, at
    /// boot, while no other CPU runs the patched functions; a second call
    /// fails with [`Error::AlreadyInitialised`]. It also writes the entries
    /// and the site index that [`DispatchTable::site_index`] reads. Every
    /// entry is checked (alignment, duplicates, distance from its home slot
    /// in the site index, four NOPs, `bl` in range) before the first write
    /// to the text, so on error the text is untouched.
    pub fn initialise(
        &mut self,
        entries: impl IntoIterator<Item = u64>,
        config: Config,
        patcher: &mut impl TextPatcher,
        mut traceable: impl FnMut(u64) -> bool,
    ) -> Result<usize, Error> {
        if self.config.is_some() {
            return Err(Error::AlreadyInitialised);
        }
        if config.nop_ops == 0 || config.list_ops == 0 {
            return Err(Error::NullAddress);
        }
        let mut count = 0;
        for entry in entries {
            let record = self.sites.get_mut(count).ok_or(Error::TooManySites { capacity: SITES })?;
            CallSite::new(entry).map_err(|error| Error::MisalignedEntry { entry: error.entry })?;
            *record = SiteRecord { entry, state: SiteState::Uninitialised, vector: None };
            count += 1;
        }
        let sites = &mut self.sites[..count];
        sites.sort_unstable_by_key(|site| site.entry);
        if let Some(pair) = sites.windows(2).find(|pair| pair[0].entry == pair[1].entry) {
            return Err(Error::DuplicateEntry { entry: pair[0].entry });
        }
        // Unpublished until `site_count` below: no reader looks at them yet.
        self.table.write_entries(sites.iter().map(|site| site.entry))?;
        // Check everything first: an error leaves the text as it was.
        let mut initialised = 0;
        for site in sites.iter_mut() {
            if !traceable(site.entry) {
                continue;
            }
            let call_site = CallSite { entry: site.entry };
            for address in [call_site.literal(), call_site.literal() + 4, call_site.function(), call_site.call()] {
                expect_instruction(patcher, address, NOP)?;
            }
            call_site.bl_to(config.trampoline)?;
            // Marks the site for the write pass below.
            site.state = SiteState::Disabled { literal: config.nop_ops };
            initialised += 1;
        }
        for site in sites.iter() {
            if let SiteState::Disabled { literal } = site.state {
                let call_site = CallSite { entry: site.entry };
                // The call slot is still a NOP, so nothing reads the literal
                // or runs into the trampoline yet: the order is free here.
                patcher.write_u64(call_site.literal(), literal);
                patcher.write_u32(call_site.function(), MOV_X9_X30);
            }
        }
        self.table.site_count.store(count as u64, Ordering::Release);
        if initialised > 0 {
            patcher.synchronize();
        }
        self.site_count = count;
        self.config = Some(config);
        Ok(initialised)
    }

    /// The configuration given to `initialise`, with the current scheme.
    pub fn config(&self) -> Option<Config> {
        self.config
    }

    /// Selects the scheme that the next `apply` plans for.
    pub fn set_scheme(&mut self, scheme: Scheme) -> Result<(), Error> {
        self.config.as_mut().ok_or(Error::NotInitialised)?.scheme = scheme;
        Ok(())
    }

    /// Number of sites in the table.
    pub fn site_count(&self) -> usize {
        self.site_count
    }

    /// The call site at index `site`.
    pub fn call_site(&self, site: usize) -> Option<CallSite> {
        self.sites[..self.site_count].get(site).map(|record| CallSite { entry: record.entry })
    }

    /// The current state of `site`'s text.
    pub fn site_state(&self, site: usize) -> Option<SiteState> {
        self.sites[..self.site_count].get(site).map(|record| record.state)
    }

    /// The vector slot `site`'s literal points at, if any.
    pub fn site_vector(&self, site: usize) -> Option<usize> {
        self.sites[..self.site_count].get(site).and_then(|record| record.vector)
    }

    /// Where tracer slot `tracer` is in its life (`None`: beyond capacity).
    pub fn tracer_state(&self, tracer: TracerId) -> Option<TracerState> {
        let index = tracer.index();
        let slot = self.tracers.get(index / 64)?[index % 64];
        Some(match slot {
            TracerSlot::Free => TracerState::Free,
            TracerSlot::Registered { .. } => TracerState::Registered,
            TracerSlot::Unregistered => TracerState::Unregistered,
            TracerSlot::Retired { generation } => TracerState::Retired { generation },
        })
    }

    /// Registers the tracer whose ops object is at `ops`, tracing the sites
    /// whose indices `sites` yields (the kernel resolves its filter, e.g.
    /// with [`glob_match`](crate::glob_match) over the symbol names, to site
    /// indices). The set is stored once; nothing matches names per call.
    ///
    /// The tracer is published at once: its sites that are on the list ops
    /// call it from now on; the next `apply` patches its other sites.
    pub fn register(&mut self, ops: u64, sites: impl IntoIterator<Item = usize>) -> Result<TracerId, Error> {
        let tracer = self.prepare_register(ops)?;
        for site in sites {
            let error = match self.sites[..self.site_count].get(site) {
                None => Some(Error::NoSuchSite { site }),
                Some(record) if record.state == SiteState::Uninitialised => Some(Error::SiteNotInitialised { site }),
                Some(_) => None,
            };
            if let Some(error) = error {
                // The tracer is not published: clearing its bits is invisible.
                self.clear_tracer_bits(tracer);
                return Err(error);
            }
            self.set_tracer_bit(site, tracer);
        }
        self.publish(tracer, ops);
        Ok(tracer)
    }

    /// Registers a tracer for every initialised site `(index, entry)` for
    /// which `filter` holds.
    pub fn register_where(&mut self, ops: u64, mut filter: impl FnMut(usize, u64) -> bool) -> Result<TracerId, Error> {
        let tracer = self.prepare_register(ops)?;
        for site in 0..self.site_count {
            let record = self.sites[site];
            if record.state != SiteState::Uninitialised && filter(site, record.entry) {
                self.set_tracer_bit(site, tracer);
            }
        }
        self.publish(tracer, ops);
        Ok(tracer)
    }

    /// Unpublishes `tracer`: the list and vector functions stop calling it
    /// at once; sites that call it directly keep doing so until the next
    /// `apply`. Its slot (and the kernel's ops object) must not be reused or
    /// freed before [`TracerState::Free`]: after that `apply` and a grace
    /// period (`grace_period_elapsed`).
    pub fn unregister(&mut self, tracer: TracerId) -> Result<(), Error> {
        let index = tracer.index();
        let slot = self.tracers.get_mut(index / 64).map(|word| &mut word[index % 64]);
        let Some(slot @ TracerSlot::Registered { .. }) = slot else {
            return Err(Error::NotRegistered { tracer });
        };
        *slot = TracerSlot::Unregistered;
        let registered = &self.table.registered[index / 64];
        registered.store(registered.load(Ordering::Relaxed) & !(1 << (index % 64)), Ordering::Release);
        Ok(())
    }

    /// What `site` should dispatch to under the current registry and
    /// scheme (`None`: no such site, or uninitialised).
    pub fn target(&self, site: usize) -> Option<Target<TRACER_WORDS>> {
        let config = self.config?;
        let record = self.sites[..self.site_count].get(site)?;
        if record.state == SiteState::Uninitialised {
            return None;
        }
        let relevant = self.table.relevant(site);
        Some(match (config.scheme, relevant.len()) {
            (_, 0) => Target::Disabled,
            (Scheme::List, _) => Target::List,
            (Scheme::CallOps | Scheme::Vector, 1) => Target::Own(relevant.iter().next()?),
            (Scheme::CallOps, _) => Target::List,
            (Scheme::Vector, _) => Target::Vector(relevant),
        })
    }

    /// Brings every initialised site to its [`target`](Self::target) with
    /// the fewest writes, each in a safe order (see the crate docs):
    /// - disabled -> calling: literal := ops (if different), then `NOP -> BL`;
    /// - calling -> calling: literal := ops (one 64-bit store);
    /// - calling -> disabled: literal := nop ops (if different), then `BL -> NOP`.
    ///
    /// Before writing a site it checks that the text is what it wrote there
    /// last. Tracers unregistered before this call, and vector slots no
    /// longer used, retire with the returned generation.
    pub fn apply(&mut self, patcher: &mut impl TextPatcher) -> Result<Applied, Error> {
        let config = self.config.ok_or(Error::NotInitialised)?;
        self.generation += 1;
        let mut applied = Applied { generation: self.generation, ..Applied::default() };
        let result = (0..self.site_count).try_for_each(|site| self.apply_site(site, config, patcher, &mut applied));
        if applied.literal_writes + applied.instruction_writes > 0 {
            patcher.synchronize();
        }
        result?;
        let generation = self.generation;
        for slot in self.tracers.iter_mut().flatten() {
            if let TracerSlot::Unregistered = slot {
                *slot = TracerSlot::Retired { generation };
            }
        }
        Ok(applied)
    }

    /// Frees the tracer and vector slots retired by `apply`s up to
    /// `generation`. Call it only once every CPU has passed a point outside
    /// the trampoline and every tracer (a quiescent state) since the `apply`
    /// that returned `generation` returned: then no CPU can still hold a
    /// literal, vector or tracer id that referred to them.
    pub fn grace_period_elapsed(&mut self, generation: u64) -> Reclaimed<TRACER_WORDS> {
        let mut reclaimed = Reclaimed { tracers: TracerSet::EMPTY, vectors: 0 };
        for index in 0..64 * TRACER_WORDS {
            let slot = &mut self.tracers[index / 64][index % 64];
            if let TracerSlot::Retired { generation: retired } = *slot
                && retired <= generation
            {
                *slot = TracerSlot::Free;
                let tracer = TracerId(index as u16);
                self.clear_tracer_bits(tracer);
                self.table.ops[index / 64][index % 64].store(0, Ordering::Relaxed);
                reclaimed.tracers.insert(tracer);
            }
        }
        for slot in self.vectors.iter_mut() {
            if let VectorSlot::Retired { generation: retired } = *slot
                && retired <= generation
            {
                *slot = VectorSlot::Free;
                reclaimed.vectors += 1;
            }
        }
        reclaimed
    }

    fn prepare_register(&self, ops: u64) -> Result<TracerId, Error> {
        if self.config.is_none() {
            return Err(Error::NotInitialised);
        }
        if ops == 0 {
            return Err(Error::NullAddress);
        }
        let index = self
            .tracers
            .iter()
            .flatten()
            .position(|slot| matches!(slot, TracerSlot::Free))
            .ok_or(Error::RegistryFull)?;
        Ok(TracerId(index as u16))
    }

    fn set_tracer_bit(&self, site: usize, tracer: TracerId) {
        let index = tracer.index();
        let word = &self.table.site_tracers[site][index / 64];
        word.store(word.load(Ordering::Relaxed) | 1 << (index % 64), Ordering::Relaxed);
    }

    fn clear_tracer_bits(&self, tracer: TracerId) {
        let index = tracer.index();
        for tracers in &self.table.site_tracers[..self.site_count] {
            let word = &tracers[index / 64];
            word.store(word.load(Ordering::Relaxed) & !(1 << (index % 64)), Ordering::Relaxed);
        }
    }

    /// Publishes a tracer whose site bits are written: its ops address
    /// first, then its bit in `registered` with release, which the per-call
    /// path loads with acquire before it reads the bits or the ops.
    fn publish(&mut self, tracer: TracerId, ops: u64) {
        let index = tracer.index();
        self.table.ops[index / 64][index % 64].store(ops, Ordering::Relaxed);
        let registered = &self.table.registered[index / 64];
        registered.store(registered.load(Ordering::Relaxed) | 1 << (index % 64), Ordering::Release);
        self.tracers[index / 64][index % 64] = TracerSlot::Registered { ops };
    }

    fn tracer_ops(&self, tracer: TracerId) -> Option<u64> {
        let index = tracer.index();
        match self.tracers.get(index / 64)?[index % 64] {
            TracerSlot::Registered { ops } => Some(ops),
            _ => None,
        }
    }

    fn apply_site(
        &mut self,
        site: usize,
        config: Config,
        patcher: &mut impl TextPatcher,
        applied: &mut Applied,
    ) -> Result<(), Error> {
        let Some(target) = self.target(site) else { return Ok(()) };
        let record = self.sites[site];
        let call_site = CallSite { entry: record.entry };
        // Keep the current vector if it has exactly the wanted set: vector
        // contents never change while a literal points at them.
        let keep_vector = match (target, record.vector) {
            (Target::Vector(wanted), Some(slot)) => {
                matches!(self.vectors[slot], VectorSlot::InUse { tracers, .. } if tracers == wanted)
            }
            _ => false,
        };
        if keep_vector {
            return Ok(());
        }
        let (literal, vector) = match target {
            Target::Disabled => (None, None),
            Target::Own(tracer) => (Some(self.tracer_ops(tracer).ok_or(Error::NotRegistered { tracer })?), None),
            Target::List => (Some(config.list_ops), None),
            Target::Vector(tracers) => match self.find_vector(&tracers, config.vector_ops) {
                Some(slot) => (Some(config.vector_ops.address(slot)), Some(slot)),
                None => {
                    applied.vector_fallbacks += 1;
                    (Some(config.list_ops), None)
                }
            },
        };
        let bl = call_site.bl_to(config.trampoline)?;
        // Check the text is what this registry left there, before any write.
        match (record.state, literal) {
            (SiteState::Uninitialised, _) | (SiteState::Disabled { .. }, None) => return Ok(()),
            (SiteState::Calling { literal: old }, Some(new)) if old == new && record.vector == vector => {
                return Ok(());
            }
            (SiteState::Disabled { literal: old }, Some(_)) => {
                expect_literal(patcher, call_site.literal(), old)?;
                expect_instruction(patcher, call_site.function(), MOV_X9_X30)?;
                expect_instruction(patcher, call_site.call(), NOP)?;
            }
            (SiteState::Calling { literal: old }, _) => {
                expect_literal(patcher, call_site.literal(), old)?;
                expect_instruction(patcher, call_site.call(), bl)?;
            }
        }
        // A new vector's set is in the table before a literal points at it.
        if let (Some(slot), Target::Vector(tracers)) = (vector, target) {
            self.hold_vector(slot, tracers);
        }
        let new_state = match (record.state, literal) {
            (SiteState::Disabled { literal: old }, Some(new)) => {
                // The literal first: a CPU that executes the new BL must find it (the
                // patcher may ask for the wrong order, `EnableOrder::BlFirst`).
                let bl_first = patcher.enable_order() == EnableOrder::BlFirst;
                if bl_first {
                    patcher.write_u32(call_site.call(), bl);
                }
                if old != new {
                    patcher.write_u64(call_site.literal(), new);
                    applied.literal_writes += 1;
                }
                if !bl_first {
                    patcher.write_u32(call_site.call(), bl);
                }
                applied.instruction_writes += 1;
                applied.enabled += 1;
                SiteState::Calling { literal: new }
            }
            (SiteState::Calling { literal: old }, Some(new)) => {
                if old != new {
                    patcher.write_u64(call_site.literal(), new);
                    applied.literal_writes += 1;
                }
                applied.retargeted += 1;
                SiteState::Calling { literal: new }
            }
            (SiteState::Calling { literal: old }, None) => {
                // The nop ops first, as Linux does: a CPU that still executes
                // the old BL (before it resynchronises) stops calling the
                // tracer as soon as this store is visible.
                if old != config.nop_ops {
                    patcher.write_u64(call_site.literal(), config.nop_ops);
                    applied.literal_writes += 1;
                }
                patcher.write_u32(call_site.call(), NOP);
                applied.instruction_writes += 1;
                applied.disabled += 1;
                SiteState::Disabled { literal: config.nop_ops }
            }
            (state, _) => state,
        };
        if let Some(slot) = record.vector {
            self.release_vector(slot);
        }
        self.sites[site].state = new_state;
        self.sites[site].vector = vector;
        Ok(())
    }

    /// A slot holding exactly `tracers` (shared), or a free one; `None` if
    /// every slot is in use or waiting for a grace period.
    fn find_vector(&self, tracers: &TracerSet<TRACER_WORDS>, vector_ops: VectorOps) -> Option<usize> {
        if vector_ops == VectorOps::NONE {
            return None;
        }
        let shared = self
            .vectors
            .iter()
            .position(|slot| matches!(slot, VectorSlot::InUse { tracers: held, .. } if held == tracers));
        shared.or_else(|| self.vectors.iter().position(|slot| matches!(slot, VectorSlot::Free)))
    }

    /// Takes a user of `slot` for `tracers`, filling a free slot in the
    /// table before the caller's literal store makes it reachable.
    fn hold_vector(&mut self, slot: usize, tracers: TracerSet<TRACER_WORDS>) {
        match &mut self.vectors[slot] {
            VectorSlot::InUse { users, .. } => *users += 1,
            free => {
                *free = VectorSlot::InUse { users: 1, tracers };
                for (word, bits) in self.table.vectors[slot].iter().zip(tracers.words()) {
                    word.store(bits, Ordering::Relaxed);
                }
            }
        }
    }

    fn release_vector(&mut self, slot: usize) {
        if let Some(VectorSlot::InUse { users, .. }) = self.vectors.get_mut(slot) {
            *users -= 1;
            if *users == 0 {
                self.vectors[slot] = VectorSlot::Retired { generation: self.generation };
            }
        }
    }
}

fn expect_instruction(patcher: &impl TextPatcher, address: u64, expected: u32) -> Result<(), Error> {
    let found = patcher.read_u32(address);
    if found != expected {
        return Err(Error::UnexpectedInstruction { address, expected, found });
    }
    Ok(())
}

fn expect_literal(patcher: &impl TextPatcher, address: u64, expected: u64) -> Result<(), Error> {
    let found = patcher.read_u64(address);
    if found != expected {
        return Err(Error::UnexpectedLiteral { address, expected, found });
    }
    Ok(())
}
