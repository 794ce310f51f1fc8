//! QEMU TCG plugin: per-window event counts of the tracelab kernel's bench windows.
//!
//! Every translated instruction is classified once (`events::classify`) and gets inline
//! per-vCPU adds for its classes, so counting costs no callback. A window is what the kernel
//! measures between two `mrs Xt, pmccntr_el0` on one vCPU: an execution callback on that
//! instruction snapshots the vCPU's counters before the instruction counts itself, so a window
//! holds the instructions from its opening read to just before its closing one, which is what
//! the PMCCNTR_EL0 difference counts under `-icount shift=0`. The markers are the counter reads
//! the kernel already makes, so loading the plugin moves no icount figure.
//!
//! Two events need run time: whether a conditional branch was taken (the branch stores its
//! fall-through address; the first instruction of the next block compares its own address
//! with it, in a callback that runs only when a branch is pending), and exceptions, which API
//! v4 cannot report: they are counted as executions of the 16 vector entries at
//! `vectors=ADDRESS` (each entry's first instruction).
//!
//! With `cache=on` every instruction fetch (once per 64-byte line entered) and every data
//! access (its physical address, from a per-access callback) also goes through the cache model
//! of `events::cache` (the Cortex-A72's), whose misses are counted like the other events: far
//! dearer to emulate than the inline counts, so it is a mode of its own.
//!
//! The kernel's row marker (`hint #0x7f`, outside every window) gets a line saying how many
//! windows its vCPU had closed, so that xtask can find the windows a row's figure came from.
//!
//! With `count=on` it does none of that and counts a whole run instead ([`count`]): every
//! instruction of every vCPU, split at the counter reads of the guest's user programs.
// SPDX-License-Identifier: GPL-2.0-or-later

use events::cache::{Access, Hierarchy, Misses};
use events::window::CacheMode;
use events::{Branch, Class, Counter, VectorEntry, WindowCounts, classify};
use qemu_plugin::install::{Args, Info};
use qemu_plugin::plugin::{HasCallbacks, Register};
use qemu_plugin::register;
use qemu_plugin::sys::{qemu_plugin_cond, qemu_plugin_op, qemu_plugin_scoreboard, qemu_plugin_u64};
use qemu_plugin::{MemRW, PluginId, TranslationBlock, VCPUIndex};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

mod count;

/// The scoreboard's element: the counters, then the pending fall-through address.
const PENDING: usize = Counter::COUNT;
const ELEMENT_WORDS: usize = Counter::COUNT + 1;

/// What the execution callbacks share: the per-vCPU scoreboard and the windows.
struct Windows {
    /// `qemu_plugin_scoreboard *`, as an address so that the closures are `Send`.
    scoreboard: usize,
    state: Mutex<WindowState>,
}

#[derive(Default)]
struct WindowState {
    /// Per vCPU: the counters at the window's opening read, while one is open.
    open: Vec<Option<[u64; Counter::COUNT]>>,
    /// Per vCPU: the windows closed so far.
    closed: Vec<usize>,
    /// One line per closed window and per row marker, in the order they came.
    lines: Vec<String>,
}

impl WindowState {
    /// `vcpu`'s index in the per-vCPU vectors, grown on its first use.
    fn slot(&mut self, vcpu: VCPUIndex) -> usize {
        let slot = vcpu as usize;
        if self.open.len() <= slot {
            self.open.resize(slot + 1, None);
            self.closed.resize(slot + 1, 0);
        }
        slot
    }
}

impl Windows {
    fn entry(&self, index: usize) -> qemu_plugin_u64 {
        qemu_plugin_u64 { score: self.scoreboard as *mut qemu_plugin_scoreboard, offset: index * 8 }
    }

    fn counters(&self, vcpu: VCPUIndex) -> [u64; Counter::COUNT] {
        let mut values = [0; Counter::COUNT];
        for (index, value) in values.iter_mut().enumerate() {
            *value = qemu_plugin::qemu_plugin_u64_get(self.entry(index), vcpu);
        }
        values
    }

    /// A counter read on `vcpu`: opens a window, or closes the open one and keeps its line.
    fn marker(&self, vcpu: VCPUIndex) {
        let now = self.counters(vcpu);
        let mut state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let slot = state.slot(vcpu);
        match state.open[slot].take() {
            None => state.open[slot] = Some(now),
            Some(opened) => {
                let mut line = String::new();
                let _ = WindowCounts::between(vcpu, &opened, &now).write_line(&mut line);
                state.lines.push(line);
                state.closed[slot] += 1;
            }
        }
    }

    /// The kernel's row marker on `vcpu`: notes how many windows that vCPU had closed.
    fn row(&self, vcpu: VCPUIndex) {
        let mut state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let slot = state.slot(vcpu);
        let line = format!("{}cpu={vcpu} windows={}", events::window::ROW_PREFIX, state.closed[slot]);
        state.lines.push(line);
    }

    /// One access through the cache model; its misses go to `vcpu`'s counters.
    fn cache_access(&self, model: &Mutex<Hierarchy>, vcpu: VCPUIndex, kind: Access, address: u64, size: usize) {
        let mut model = model.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let before = model.misses;
        model.access(vcpu as usize, kind, address, size);
        let Misses { l1i, l1d, l2 } = model.misses;
        for (counter, added) in [
            (Counter::L1iMisses, l1i - before.l1i),
            (Counter::L1dMisses, l1d - before.l1d),
            (Counter::L2Misses, l2 - before.l2),
        ] {
            if added > 0 {
                let _ = qemu_plugin::qemu_plugin_u64_add(self.entry(counter.index()), vcpu, added);
            }
        }
    }

    /// The first instruction of a block ran while a conditional branch was pending.
    fn resolve_branch(&self, vcpu: VCPUIndex, block_start: u64) {
        let pending = self.entry(PENDING);
        if qemu_plugin::qemu_plugin_u64_get(pending, vcpu) != block_start {
            let _ = qemu_plugin::qemu_plugin_u64_add(self.entry(Counter::TakenBranches.index()), vcpu, 1);
        }
        qemu_plugin::qemu_plugin_u64_set(pending, vcpu, 0);
    }
}

struct EventsPlugin {
    windows: Option<Arc<Windows>>,
    /// `cache=warm|cold`: the cache model every fetch and data access goes through.
    cache: Option<Arc<Mutex<Hierarchy>>>,
    /// `evict=ADDRESS:...` (`cache=cold`): executing one of these empties the model.
    evict: Vec<u64>,
    cache_mode: CacheMode,
    out: Option<PathBuf>,
    vectors: Option<u64>,
    /// `count=on`: the whole-run count instead of the windows.
    count_mode: bool,
    count: Option<Arc<count::WholeRunCount>>,
}

impl EventsPlugin {
    /// The inline adds one instruction of class `class` at `vaddr` gets.
    fn increments(&self, class: &Class, vaddr: u64) -> Vec<(Counter, u64)> {
        let mut adds = vec![(Counter::Instructions, 1)];
        let mut flag = |on: bool, counter: Counter| {
            if on {
                adds.push((counter, 1));
            }
        };
        flag(class.load, Counter::Loads);
        flag(class.store, Counter::Stores);
        flag(class.branch.always_taken(), Counter::TakenBranches);
        flag(class.branch.indirect() && class.branch != Branch::Return, Counter::IndirectBranches);
        flag(class.branch.call(), Counter::Calls);
        flag(class.branch == Branch::Return, Counter::Returns);
        flag(class.eret, Counter::ExceptionReturns);
        flag(class.isb, Counter::Isb);
        flag(class.dsb, Counter::Dsb);
        flag(class.dmb, Counter::Dmb);
        flag(class.cache_maintenance, Counter::CacheMaintenance);
        flag(class.tlbi, Counter::Tlbi);
        flag(class.system_register, Counter::SystemRegisters);
        flag(class.pointer_authentication, Counter::PointerAuthentication);
        if class.bytes_loaded > 0 {
            adds.push((Counter::BytesLoaded, class.bytes_loaded.into()));
        }
        if class.bytes_stored > 0 {
            adds.push((Counter::BytesStored, class.bytes_stored.into()));
        }
        if let Some(base) = self.vectors {
            let offset = vaddr.wrapping_sub(base);
            if offset < 16 * VectorEntry::STRIDE && offset % VectorEntry::STRIDE == 0 {
                adds.push((Counter::Exceptions, 1));
                adds.push((Counter::Vector(VectorEntry((offset / VectorEntry::STRIDE) as u8)), 1));
            }
        }
        adds
    }
}

impl Register for EventsPlugin {
    fn register(&mut self, id: PluginId, args: &Args, _: &Info) -> qemu_plugin::Result<()> {
        for argument in &args.raw {
            match argument.split_once('=') {
                Some(("out", path)) => self.out = Some(PathBuf::from(path)),
                Some(("cache", mode))
                    if [CacheMode::Warm, CacheMode::Cold].iter().any(|known| known.name() == mode) =>
                {
                    self.cache = Some(Arc::new(Mutex::new(Hierarchy::pi4(4))));
                    self.cache_mode = if mode == "cold" { CacheMode::Cold } else { CacheMode::Warm };
                }
                Some(("cache", "off")) => self.cache = None,
                Some(("count", "on")) => self.count_mode = true,
                Some(("count", "off")) => self.count_mode = false,
                Some(("evict", addresses)) => {
                    for address in addresses.split(':') {
                        let digits = address.trim_start_matches("0x");
                        self.evict.push(u64::from_str_radix(digits, 16).map_err(|error| {
                            qemu_plugin::Error::from(std::io::Error::other(format!("evict={address}: {error}")))
                        })?);
                    }
                }
                Some(("vectors", address)) => {
                    let digits = address.trim_start_matches("0x");
                    self.vectors = Some(u64::from_str_radix(digits, 16).map_err(|error| {
                        qemu_plugin::Error::from(std::io::Error::other(format!("vectors={address}: {error}")))
                    })?);
                }
                _ => {
                    return Err(std::io::Error::other(format!(
                        "unknown argument {argument:?} (out=PATH, vectors=0xADDRESS, cache=off|warm|cold, evict=0xADDRESS:..., count=on|off)"
                    ))
                    .into());
                }
            }
        }
        if self.count_mode {
            let counter = count::WholeRunCount::new(self.vectors);
            self.count = Some(counter.clone());
            let out = self.out.clone();
            return qemu_plugin::qemu_plugin_register_atexit_cb(id, move |_| {
                let text = counter.text();
                match &out {
                    Some(path) => {
                        let partial = path.with_extension("partial");
                        if std::fs::write(&partial, &text).and_then(|()| std::fs::rename(&partial, path)).is_err() {
                            eprintln!("events plugin: cannot write {}", path.display());
                        }
                    }
                    None => print!("{text}"),
                }
            });
        }
        // SAFETY: QEMU allocates one zeroed element per vCPU and grows the scoreboard as vCPUs
        // appear; the element size is a whole number of u64 entries.
        let scoreboard = unsafe { qemu_plugin::sys::qemu_plugin_scoreboard_new(ELEMENT_WORDS * 8) };
        let windows = Arc::new(Windows { scoreboard: scoreboard as usize, state: Mutex::default() });
        self.windows = Some(windows.clone());
        let out = self.out.clone();
        let cache = if self.cache.is_some() { self.cache_mode.name() } else { "off" };
        qemu_plugin::qemu_plugin_register_atexit_cb(id, move |_| {
            let state = windows.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            let mut text = String::new();
            for line in &state.lines {
                text.push_str(line);
                text.push('\n');
            }
            let unclosed = state.open.iter().filter(|window| window.is_some()).count();
            let windows: usize = state.closed.iter().sum();
            text.push_str(&format!(
                "{}windows={windows} unclosed={unclosed} cache={cache}\n",
                events::window::END_PREFIX
            ));
            match &out {
                Some(path) => {
                    let partial = path.with_extension("partial");
                    if std::fs::write(&partial, &text).and_then(|()| std::fs::rename(&partial, path)).is_err() {
                        eprintln!("events plugin: cannot write {}", path.display());
                    }
                }
                None => print!("{text}"),
            }
        })
    }
}

impl HasCallbacks for EventsPlugin {
    fn on_translation_block_translate(&mut self, _: PluginId, tb: TranslationBlock) -> qemu_plugin::Result<()> {
        if let Some(counter) = &self.count {
            counter.translate(tb);
            return Ok(());
        }
        let Some(windows) = self.windows.clone() else { return Ok(()) };
        let block_start = tb.vaddr();
        let mut previous_vaddr = block_start;
        for (index, instruction) in tb.instructions().enumerate() {
            let vaddr = instruction.vaddr();
            let bytes = instruction.data();
            let word = match bytes.as_slice() {
                [a, b, c, d] => u32::from_le_bytes([*a, *b, *c, *d]),
                _ => 0,
            };
            let class = classify(word);
            // Order matters: the pending branch is resolved before a marker snapshots, and the
            // marker snapshots before this instruction's own adds.
            if index == 0 {
                let resolver = windows.clone();
                instruction.register_conditional_execute_callback(
                    move |vcpu| resolver.resolve_branch(vcpu, block_start),
                    qemu_plugin_cond::QEMU_PLUGIN_COND_NE,
                    windows.entry(PENDING),
                    0,
                );
            }
            if class.window_marker {
                let marker = windows.clone();
                instruction.register_execute_callback(move |vcpu| marker.marker(vcpu));
            }
            if class.row_marker {
                let marker = windows.clone();
                instruction.register_execute_callback(move |vcpu| marker.row(vcpu));
            }
            if let Some(model) = &self.cache {
                // Emptied before this instruction is fetched: the hit starts cold.
                if self.cache_mode == CacheMode::Cold && self.evict.contains(&vaddr) {
                    let model = model.clone();
                    instruction.register_execute_callback(move |_| {
                        model.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clear();
                    });
                }
                // A fetch per line entered: the instructions after it in the same line hit.
                if index == 0 || vaddr / LINE != previous_vaddr / LINE {
                    let (fetcher, model) = (windows.clone(), model.clone());
                    instruction.register_execute_callback(move |vcpu| {
                        fetcher.cache_access(&model, vcpu, Access::Fetch, vaddr, 4)
                    });
                }
                if class.load || class.store {
                    let (accessor, model) = (windows.clone(), model.clone());
                    instruction.register_memory_access_callback(
                        move |vcpu, info, address| {
                            // Device accesses (the UART) are not cached.
                            let Some(physical) = info.hwaddr(address).filter(|hwaddr| !hwaddr.is_io()) else {
                                return;
                            };
                            let size = 1usize << info.size_shift();
                            accessor.cache_access(&model, vcpu, Access::Data, physical.hwaddr(), size);
                        },
                        MemRW::QEMU_PLUGIN_MEM_RW,
                    );
                }
            }
            previous_vaddr = vaddr;
            for (counter, amount) in self.increments(&class, vaddr) {
                qemu_plugin::qemu_plugin_register_vcpu_insn_exec_inline_per_vcpu(
                    instruction.clone(),
                    qemu_plugin_op::QEMU_PLUGIN_INLINE_ADD_U64,
                    windows.entry(counter.index()),
                    amount,
                );
            }
            if class.branch == Branch::Conditional {
                qemu_plugin::qemu_plugin_register_vcpu_insn_exec_inline_per_vcpu(
                    instruction.clone(),
                    qemu_plugin_op::QEMU_PLUGIN_INLINE_STORE_U64,
                    windows.entry(PENDING),
                    vaddr + 4,
                );
            }
        }
        Ok(())
    }
}

/// The model's line size, for fetches.
const LINE: u64 = events::cache::A72_L1I.line as u64;

register!(EventsPlugin {
    windows: None,
    cache: None,
    evict: Vec::new(),
    cache_mode: CacheMode::Off,
    out: None,
    vectors: None,
    count_mode: false,
    count: None
});
