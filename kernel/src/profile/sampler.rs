//! The sample path (hard-IRQ context): walk, cut at the interrupted PC, save in the depot,
//! count per (FP handle, SCS handle, SFrame handle); and the per-CPU tables' dump.

use super::{Clock, Request, SHARE_CHECK_AFTER, SHARE_LIMIT_PERCENT};
use crate::arch::counters;
use crate::drivers::pmu;
use crate::inject::{self, Fault};
use crate::stacktrace::{self, DEPOT, Mode};
use crate::sync::IrqSpinLock;
use crate::task::stacks::{self, CPUS};
use core::mem::MaybeUninit;
use core::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use stackdepot::{DepotError, DepotHandle};
use unwind::TraceOptions;

/// Which walkers each sample runs.
#[derive(Clone, Copy, PartialEq, Eq, defmt::Format)]
pub enum Unwinders {
    FramePointer,
    ShadowCallStack,
    /// The frame and shadow walks.
    Both,
    /// The SFrame walk of the interrupted context, from its saved registers.
    SFrame,
    /// All three.
    All,
}

impl Unwinders {
    pub const fn name(self) -> &'static str {
        match self {
            Self::FramePointer => "fp",
            Self::ShadowCallStack => "scs",
            Self::Both => "both",
            Self::SFrame => "sframe",
            Self::All => "all",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "fp" => Some(Self::FramePointer),
            "scs" => Some(Self::ShadowCallStack),
            "both" => Some(Self::Both),
            "sframe" => Some(Self::SFrame),
            "all" => Some(Self::All),
            _ => None,
        }
    }

    const fn bits(self) -> u8 {
        match self {
            Self::FramePointer => FP,
            Self::ShadowCallStack => SCS,
            Self::Both => FP | SCS,
            Self::SFrame => SFRAME,
            Self::All => FP | SCS | SFRAME,
        }
    }
}

const FP: u8 = 1;
const SCS: u8 = 2;
const TIMER: u8 = 4;
const SFRAME: u8 = 8;

/// What the sample path runs: the unwinder bits and TIMER when the tick is the clock; 0 = off.
static ACTIVE: AtomicU8 = AtomicU8::new(0);
static REFUSED: AtomicBool = AtomicBool::new(false);
static STARTED_AT: AtomicU64 = AtomicU64::new(0);
static STOPPED_AT: AtomicU64 = AtomicU64::new(0);

/// Counters of one profile (relaxed: one CPU writes each sample's, the dump reads after stop).
struct Counters {
    samples: AtomicU64,
    stored: AtomicU64,
    lost_depot_full: AtomicU64,
    lost_depot_busy: AtomicU64,
    lost_table_full: AtomicU64,
    /// A walk that did not reach the interrupted PC (no IRQ frame, a corrupted chain).
    lost_unwound: AtomicU64,
    fp_walk: AtomicU64,
    scs_walk: AtomicU64,
    sframe_walk: AtomicU64,
    /// Counter ticks of the sample path, from its first instruction to its last.
    handler: AtomicU64,
    /// PMU clock only: events from the overflow to the sample path: the exception entry and
    /// the GIC, plus however long IRQs were masked when the counter overflowed.
    entry: AtomicU64,
    /// The least of those among samples not delayed: the entry path alone, which is what the
    /// profiler's share counts per sample (a masked window is the workload's own time).
    entry_min: AtomicU64,
    /// PMU clock only: samples whose delivery came more than DELAYED events after the
    /// overflow (IRQs were masked there): they land where the mask ended, not where it began.
    delayed: AtomicU64,
}

/// Events from overflow to sample beyond which a sample counts as delayed: the entry path
/// alone is about 180 instructions.
const DELAYED: u64 = 1000;

static COUNTERS: Counters = Counters {
    samples: AtomicU64::new(0),
    stored: AtomicU64::new(0),
    lost_depot_full: AtomicU64::new(0),
    lost_depot_busy: AtomicU64::new(0),
    lost_table_full: AtomicU64::new(0),
    lost_unwound: AtomicU64::new(0),
    fp_walk: AtomicU64::new(0),
    scs_walk: AtomicU64::new(0),
    sframe_walk: AtomicU64::new(0),
    handler: AtomicU64::new(0),
    entry: AtomicU64::new(0),
    entry_min: AtomicU64::new(u64::MAX),
    delayed: AtomicU64::new(0),
};

fn add(counter: &AtomicU64, value: u64) {
    counter.fetch_add(value, Ordering::Relaxed);
}

/// Distinct (FP handle, SCS handle, SFrame handle) triples and their counts: open addressing
/// on the triple (each handle 32 bits, 0 for a walker not run).
const TABLE_SIZE: usize = 2048;

struct Table {
    keys: [u128; TABLE_SIZE],
    counts: [u32; TABLE_SIZE],
}

impl Table {
    const fn new() -> Self {
        Self { keys: [0; TABLE_SIZE], counts: [0; TABLE_SIZE] }
    }

    /// Empties the table in place: a new `Table` assigned through the lock would be built on
    /// the stack first (40 KiB, more than the boot stack the profiled workload runs on).
    fn clear(&mut self) {
        self.keys.fill(0);
        self.counts.fill(0);
    }

    /// Counts one sample of `key` (never 0); false when the table is full.
    fn count(&mut self, key: u128) -> bool {
        let folded = (key as u64) ^ ((key >> 64) as u64).rotate_left(32);
        let mut index = (folded.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 53) as usize % TABLE_SIZE;
        for _ in 0..TABLE_SIZE {
            if self.keys[index] == key || self.keys[index] == 0 {
                self.keys[index] = key;
                self.counts[index] += 1;
                return true;
            }
            index = (index + 1) % TABLE_SIZE;
        }
        false
    }
}

/// One table per CPU: a sample touches only its own CPU's (the lock masks IRQs and is
/// uncontended while one CPU runs; it keeps the dump from racing a late sample).
static TABLES: [IrqSpinLock<Table>; CPUS] = [const { IrqSpinLock::new(Table::new()) }; CPUS];

pub(super) fn start(request: &Request, event: Option<pmu::Event>) -> Result<(), &'static str> {
    for table in &TABLES {
        table.lock().clear();
    }
    for counter in [
        &COUNTERS.samples,
        &COUNTERS.stored,
        &COUNTERS.lost_depot_full,
        &COUNTERS.lost_depot_busy,
        &COUNTERS.lost_table_full,
        &COUNTERS.lost_unwound,
        &COUNTERS.fp_walk,
        &COUNTERS.scs_walk,
        &COUNTERS.sframe_walk,
        &COUNTERS.handler,
        &COUNTERS.entry,
        &COUNTERS.delayed,
    ] {
        counter.store(0, Ordering::Relaxed);
    }
    COUNTERS.entry_min.store(u64::MAX, Ordering::Relaxed);
    REFUSED.store(false, Ordering::Relaxed);
    // `profile.break=fp|scs` turns on that unwinder's fault (`inject`).
    inject::set(Fault::ProfileBrokenFramePointer, request.broken == Some(Mode::FramePointer));
    inject::set(Fault::ProfileBrokenShadowCallStack, request.broken == Some(Mode::ShadowCallStack));
    let timer = if request.clock == Clock::Timer { TIMER } else { 0 };
    let unwinders = if crate::build_info::SHADOW_CALL_STACK {
        request.unwinders.bits()
    } else {
        request.unwinders.bits() & (FP | SFRAME)
    };
    if unwinders == 0 {
        defmt::error!("profile: this build has no shadow call stack (variant {=str})", crate::build_info::VARIANT);
        return Err("no shadow call stack");
    }
    // Without frame pointers the frame walk is refused: `all` samples with the other two, and
    // a request for the frame walk alone (or with SCS) is refused.
    let unwinders = if crate::build_info::FRAME_POINTERS || unwinders & FP == 0 {
        unwinders
    } else if request.unwinders == Unwinders::All {
        defmt::info!("profile: no frame pointers in this build: sampling with scs and sframe");
        unwinders & !FP
    } else {
        defmt::error!(
            "profile: this build has no frame pointers (variant {=str}): the fp walk is refused; use scs, sframe or all",
            crate::build_info::VARIANT
        );
        return Err("no frame pointers");
    };
    STARTED_AT.store(counters::virtual_count(), Ordering::Relaxed);
    ACTIVE.store(unwinders | timer, Ordering::Release);
    if let (Clock::Pmu { every }, Some(event)) = (request.clock, event)
        && let Err(error) = pmu::start(event, every)
    {
        ACTIVE.store(0, Ordering::Release);
        defmt::error!("profile: PMU: {}", error);
        return Err("PMU");
    }
    Ok(())
}

/// What one profile measured.
pub(super) struct Summary {
    pub samples: u64,
    pub refused: bool,
}

pub(super) fn stop() -> Summary {
    pmu::stop();
    ACTIVE.store(0, Ordering::Release);
    STOPPED_AT.store(counters::virtual_count(), Ordering::Relaxed);
    Summary { samples: COUNTERS.samples.load(Ordering::Relaxed), refused: REFUSED.load(Ordering::Relaxed) }
}

impl Summary {
    pub(super) fn print(&self, request: &Request, event: Option<pmu::Event>) {
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let period = match request.clock {
            Clock::Pmu { every } => every,
            Clock::Timer => crate::drivers::timer::frequency() / crate::drivers::timer::hz().max(1),
        };
        defmt::info!(
            "profile: summary clock={=str} period={=u64} counter_hz={=u64} samples={=u64} stored={=u64} lost_depot_full={=u64} lost_depot_busy={=u64} lost_table_full={=u64} lost_unwound={=u64} fp_walk={=u64} scs_walk={=u64} sframe_walk={=u64} handler={=u64} entry={=u64} entry_min={=u64} delayed={=u64} workload={=u64} refused={=bool}",
            event.map_or("timer", pmu::Event::name),
            period,
            crate::drivers::timer::frequency(),
            get(&COUNTERS.samples),
            get(&COUNTERS.stored),
            get(&COUNTERS.lost_depot_full),
            get(&COUNTERS.lost_depot_busy),
            get(&COUNTERS.lost_table_full),
            get(&COUNTERS.lost_unwound),
            get(&COUNTERS.fp_walk),
            get(&COUNTERS.scs_walk),
            get(&COUNTERS.sframe_walk),
            get(&COUNTERS.handler),
            get(&COUNTERS.entry),
            if get(&COUNTERS.entry_min) == u64::MAX { 0 } else { get(&COUNTERS.entry_min) },
            get(&COUNTERS.delayed),
            get(&STOPPED_AT).wrapping_sub(get(&STARTED_AT)),
            self.refused
        );
    }
}

/// PMU overflow (IRQ context, registered with the interrupt dispatch).
pub fn on_pmu_overflow() {
    if !pmu::overflowed() {
        return;
    }
    let entry = pmu::since_overflow();
    let active = ACTIVE.load(Ordering::Acquire);
    if active != 0 && active & TIMER == 0 {
        add(&COUNTERS.entry, entry);
        if entry > DELAYED {
            add(&COUNTERS.delayed, 1);
        } else {
            COUNTERS.entry_min.fetch_min(entry, Ordering::Relaxed);
        }
        sample(active);
    }
    pmu::rearm();
}

/// Timer tick consumer (IRQ context).
pub fn on_tick() {
    let active = ACTIVE.load(Ordering::Acquire);
    if active & TIMER != 0 {
        sample(active);
    }
}

/// Why one walker's stack was not counted.
enum Lost {
    Unwound,
    Depot(DepotError),
}

fn sample(active: u8) {
    let begin = counters::virtual_count();
    add(&COUNTERS.samples, 1);
    let frame = stacks::this_cpu().irq_frame.load(Ordering::Relaxed);
    let outcome = if frame.is_null() {
        Err(Lost::Unwound)
    } else {
        // SAFETY: irq_frame points to the interrupted context's saved frame while the IRQ runs
        // (context.S), and this runs inside that IRQ.
        let frame = unsafe { &*frame };
        // M[3:0] = 0: EL0t. A user context's stacks are not the kernel walkers' to read: its
        // PC alone is counted (the host shows it as user code).
        let user = frame.spsr & 0xf == 0;
        let walk = |bit: u8, mode: Mode, cost: &AtomicU64| -> Result<u32, Lost> {
            if active & bit == 0 {
                return Ok(0);
            }
            let broken = inject::on(if mode == Mode::FramePointer {
                Fault::ProfileBrokenFramePointer
            } else {
                Fault::ProfileBrokenShadowCallStack
            });
            let start = counters::virtual_count();
            let saved = save_interrupted(mode, frame.elr, user, broken);
            add(cost, counters::virtual_count() - start);
            saved.map(DepotHandle::to_raw)
        };
        let sframe = || -> Result<u32, Lost> {
            if active & SFRAME == 0 {
                return Ok(0);
            }
            let start = counters::virtual_count();
            let saved = save_interrupted_sframe(frame, user);
            add(&COUNTERS.sframe_walk, counters::virtual_count() - start);
            saved.map(DepotHandle::to_raw)
        };
        walk(FP, Mode::FramePointer, &COUNTERS.fp_walk).and_then(|fp| {
            walk(SCS, Mode::ShadowCallStack, &COUNTERS.scs_walk)
                .and_then(|scs| sframe().map(|sframe| (fp, scs, sframe)))
        })
    };
    match outcome {
        Ok((fp, scs, sframe)) => {
            let key = u128::from(fp) << 64 | u128::from(scs) << 32 | u128::from(sframe);
            if TABLES[crate::arch::percpu::this_cpu_index()].lock().count(key) {
                add(&COUNTERS.stored, 1);
            } else {
                add(&COUNTERS.lost_table_full, 1);
            }
        }
        Err(Lost::Unwound) | Err(Lost::Depot(DepotError::Empty | DepotError::TooManyFrames)) => {
            add(&COUNTERS.lost_unwound, 1)
        }
        Err(Lost::Depot(DepotError::Busy)) => add(&COUNTERS.lost_depot_busy, 1),
        Err(Lost::Depot(_)) => add(&COUNTERS.lost_depot_full, 1),
    }
    let end = counters::virtual_count();
    add(&COUNTERS.handler, end - begin);
    check_share(end);
}

/// Stops sampling when the profiler's share of the time since the start passes the limit.
fn check_share(now: u64) {
    let samples = COUNTERS.samples.load(Ordering::Relaxed);
    if samples < SHARE_CHECK_AFTER {
        return;
    }
    let entry = match COUNTERS.entry_min.load(Ordering::Relaxed) {
        u64::MAX => 0,
        least => least * samples,
    };
    let cost = COUNTERS.handler.load(Ordering::Relaxed) + entry;
    let elapsed = now.wrapping_sub(STARTED_AT.load(Ordering::Relaxed));
    if cost * 100 > SHARE_LIMIT_PERCENT * elapsed {
        ACTIVE.store(0, Ordering::Release);
        pmu::stop();
        REFUSED.store(true, Ordering::Relaxed);
    }
}

/// One walk of the interrupted context, cut so that its first entry is the interrupted PC,
/// saved in the depot without spinning (the interrupted code may hold the depot's lock).
#[inline(never)]
#[sanitize(kernel_hwaddress = "off")]
fn save_interrupted(mode: Mode, pc: u64, user: bool, broken: bool) -> Result<DepotHandle, Lost> {
    if user {
        return DEPOT.try_save(&[pc]).map_err(Lost::Depot);
    }
    let mut buffer = [MaybeUninit::uninit(); unwind::MAX_FRAMES];
    let walked = stacktrace::collect(mode, TraceOptions::ALL, &mut buffer);
    let entries = walked.entries(&buffer);
    // The IRQ path's own frames come first; the interrupted context starts at its exact PC.
    let Some(first) = entries.iter().position(|&address| address == pc) else {
        return Err(Lost::Unwound);
    };
    let entries = &entries[first..];
    let entries = if broken { &entries[..1] } else { entries };
    DEPOT.try_save(entries).map_err(Lost::Depot)
}

/// The SFrame walk of the interrupted context from its saved registers (its PC first), saved
/// in the depot without spinning.
#[inline(never)]
#[sanitize(kernel_hwaddress = "off")]
fn save_interrupted_sframe(frame: &crate::arch::exception::ExceptionFrame, user: bool) -> Result<DepotHandle, Lost> {
    if user {
        return DEPOT.try_save(&[frame.elr]).map_err(Lost::Depot);
    }
    let mut buffer = [MaybeUninit::uninit(); unwind::MAX_FRAMES];
    let walked = stacktrace::collect_sframe_of(frame, crate::task::current_slot(), TraceOptions::ALL, &mut buffer);
    DEPOT.try_save(walked.entries(&buffer)).map_err(Lost::Depot)
}

/// Prints every counted triple with its stacks (`[]` for an unwinder not run), one line each.
pub(super) fn dump() {
    let mut fp = [0u64; stackdepot::MAX_FRAMES];
    let mut scs = [0u64; stackdepot::MAX_FRAMES];
    let mut sframe = [0u64; stackdepot::MAX_FRAMES];
    for table in &TABLES {
        let table = table.lock();
        for (&key, &count) in table.keys.iter().zip(table.counts.iter()) {
            if key == 0 {
                continue;
            }
            let fetch = |raw: u32, buffer: &mut [u64; stackdepot::MAX_FRAMES]| -> usize {
                DepotHandle::from_raw(raw).and_then(|handle| DEPOT.fetch(handle, buffer)).map_or(0, <[u64]>::len)
            };
            let fp_len = fetch((key >> 64) as u32, &mut fp);
            let scs_len = fetch((key >> 32) as u32, &mut scs);
            let sframe_len = fetch(key as u32, &mut sframe);
            defmt::info!(
                "profile: sample {=u32} fp {=[?]} scs {=[?]} sframe {=[?]}",
                count,
                &fp[..fp_len],
                &scs[..scs_len],
                &sframe[..sframe_len]
            );
        }
    }
}
