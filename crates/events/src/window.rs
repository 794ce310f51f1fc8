//! The counts of one measured window and the line the plugin writes for it.
//!
//! A window is what the kernel measures between two reads of PMCCNTR_EL0 on one CPU
//! (`counters::cycles()`, or the user-probe bench's own pair): the plugin snapshots its
//! counters at both reads and writes the difference as one line,
//! `events window: cpu=0 insn=125 loads=3 ... vector.sync.current_spx=1 ...`, in the order the
//! windows closed. Every counter is written on every line, so a line missing one is malformed.

/// One counted event class, in the order the line spells them.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Counter {
    /// Instructions executed, the window's opening counter read included and its closing one
    /// not: the same count as the PMCCNTR_EL0 difference under `-icount shift=0`.
    Instructions,
    Loads,
    Stores,
    BytesLoaded,
    BytesStored,
    /// Branches that went somewhere else than the next instruction (calls and returns
    /// included, `eret` and exception entries not).
    TakenBranches,
    /// Branches to a register's address, returns included.
    IndirectBranches,
    Calls,
    Returns,
    /// Exceptions taken: executions of the first instruction of any of the 16 vector entries.
    Exceptions,
    ExceptionReturns,
    Isb,
    Dsb,
    Dmb,
    CacheMaintenance,
    Tlbi,
    SystemRegisters,
    PointerAuthentication,
    /// Modelled misses (`crate::cache`), counted only in the plugin's cache mode (0 otherwise).
    L1iMisses,
    L1dMisses,
    L2Misses,
    /// Per vector entry, in entry order.
    Vector(VectorEntry),
}

/// One of the 16 entries of an exception vector table (ARM ARM D1.10.2): the exception's kind
/// and where it came from.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct VectorEntry(pub u8);

impl VectorEntry {
    const SOURCES: [&str; 4] = ["current_sp0", "current_spx", "lower_a64", "lower_a32"];
    const KINDS: [&str; 4] = ["sync", "irq", "fiq", "serror"];
    /// Each entry is 0x80 bytes long.
    pub const STRIDE: u64 = 0x80;

    pub fn kind(self) -> &'static str {
        Self::KINDS[(self.0 % 4) as usize]
    }

    pub fn source(self) -> &'static str {
        Self::SOURCES[(self.0 / 4) as usize]
    }

    /// The entry's offset from VBAR.
    pub fn offset(self) -> u64 {
        self.0 as u64 * Self::STRIDE
    }
}

impl Counter {
    pub const COUNT: usize = FIXED.len() + 16;

    /// Every counter, in line order.
    pub fn all() -> impl Iterator<Item = Counter> {
        (0..Self::COUNT).map(Counter::from_index)
    }

    pub fn from_index(index: usize) -> Counter {
        match FIXED.get(index) {
            Some(counter) => *counter,
            None => Counter::Vector(VectorEntry((index - FIXED.len()) as u8)),
        }
    }

    /// The counter's place in a line and in the plugin's per-CPU scoreboard.
    pub fn index(self) -> usize {
        match self {
            Counter::Vector(entry) => FIXED.len() + entry.0 as usize,
            fixed => Counter::all().position(|counter| counter == fixed).unwrap_or(0),
        }
    }

    /// The key on a window line; for the fixed counters also the bench metric's suffix.
    pub fn name(self) -> &'static str {
        use Counter::*;
        match self {
            Instructions => "insn",
            Loads => "loads",
            Stores => "stores",
            BytesLoaded => "bytes_loaded",
            BytesStored => "bytes_stored",
            TakenBranches => "taken_branches",
            IndirectBranches => "indirect_branches",
            Calls => "calls",
            Returns => "returns",
            Exceptions => "exceptions",
            ExceptionReturns => "eret",
            Isb => "isb",
            Dsb => "dsb",
            Dmb => "dmb",
            CacheMaintenance => "dc_ic",
            Tlbi => "tlbi",
            SystemRegisters => "msr_mrs",
            PointerAuthentication => "pac",
            L1iMisses => "l1i_misses",
            L1dMisses => "l1d_misses",
            L2Misses => "l2_misses",
            Vector(entry) => VECTOR_NAMES[entry.0 as usize],
        }
    }
}

/// The counters before the vector entries, in line order.
const FIXED: [Counter; 21] = {
    use Counter::*;
    [
        Instructions,
        Loads,
        Stores,
        BytesLoaded,
        BytesStored,
        TakenBranches,
        IndirectBranches,
        Calls,
        Returns,
        Exceptions,
        ExceptionReturns,
        Isb,
        Dsb,
        Dmb,
        CacheMaintenance,
        Tlbi,
        SystemRegisters,
        PointerAuthentication,
        L1iMisses,
        L1dMisses,
        L2Misses,
    ]
};

impl Counter {
    /// A modelled miss count, meaningful only from the plugin's cache mode.
    pub fn modelled(self) -> bool {
        matches!(self, Counter::L1iMisses | Counter::L1dMisses | Counter::L2Misses)
    }
}

const VECTOR_NAMES: [&str; 16] = [
    "vector.sync.current_sp0",
    "vector.irq.current_sp0",
    "vector.fiq.current_sp0",
    "vector.serror.current_sp0",
    "vector.sync.current_spx",
    "vector.irq.current_spx",
    "vector.fiq.current_spx",
    "vector.serror.current_spx",
    "vector.sync.lower_a64",
    "vector.irq.lower_a64",
    "vector.fiq.lower_a64",
    "vector.serror.lower_a64",
    "vector.sync.lower_a32",
    "vector.irq.lower_a32",
    "vector.fiq.lower_a32",
    "vector.serror.lower_a32",
];

/// The line prefix; xtask keeps only lines that start with it.
pub const PREFIX: &str = "events window: ";

/// The line the plugin writes where the kernel's row marker ran: `events row: cpu=C windows=N`,
/// N the windows CPU C had closed by then. The k-th such line belongs to the k-th
/// `bench events:` line of the kernel's log.
pub const ROW_PREFIX: &str = "events row: ";

/// Reads a row marker's line: (cpu, windows closed).
pub fn parse_row(line: &str) -> Option<(u32, usize)> {
    let (cpu, windows) = line.strip_prefix(ROW_PREFIX)?.split_once(' ')?;
    Some((cpu.strip_prefix("cpu=")?.parse().ok()?, windows.strip_prefix("windows=")?.parse().ok()?))
}

/// Whether and how the plugin ran its cache model.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub enum CacheMode {
    /// No model: the miss counters stay 0.
    #[default]
    Off,
    /// The model runs across the whole boot: a measuring loop's hits find what the previous
    /// ones left.
    Warm,
    /// As `Warm`, but the model is emptied whenever an eviction address (a probe target's first
    /// instruction) executes: every hit starts with empty caches.
    Cold,
}

impl CacheMode {
    pub fn name(self) -> &'static str {
        match self {
            CacheMode::Off => "off",
            CacheMode::Warm => "warm",
            CacheMode::Cold => "cold",
        }
    }
}

/// The plugin's last line, written when QEMU exits: `events end: windows=N unclosed=M
/// cache=off|warm|cold`. A file without it, or with windows left open, is not a whole run's.
pub const END_PREFIX: &str = "events end: ";

/// Reads the end line: (windows, unclosed, the cache mode).
pub fn parse_end(line: &str) -> Option<(usize, usize, CacheMode)> {
    let mut words = line.strip_prefix(END_PREFIX)?.split(' ');
    let windows = words.next()?.strip_prefix("windows=")?.parse().ok()?;
    let unclosed = words.next()?.strip_prefix("unclosed=")?.parse().ok()?;
    let cache = words.next()?.strip_prefix("cache=")?;
    let cache = [CacheMode::Off, CacheMode::Warm, CacheMode::Cold].into_iter().find(|mode| mode.name() == cache)?;
    words.next().is_none().then_some((windows, unclosed, cache))
}

/// What one window counted on one CPU.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct WindowCounts {
    pub cpu: u32,
    pub values: [u64; Counter::COUNT],
}

impl WindowCounts {
    pub fn get(&self, counter: Counter) -> u64 {
        self.values[counter.index()]
    }

    /// `closed - opened`, counter by counter (the plugin's counters only grow).
    pub fn between(cpu: u32, opened: &[u64; Counter::COUNT], closed: &[u64; Counter::COUNT]) -> Self {
        let mut values = [0; Counter::COUNT];
        for (value, (open, close)) in values.iter_mut().zip(opened.iter().zip(closed)) {
            *value = close.wrapping_sub(*open);
        }
        Self { cpu, values }
    }

    /// Writes the window's line (without a newline).
    pub fn write_line(&self, out: &mut impl core::fmt::Write) -> core::fmt::Result {
        write!(out, "{PREFIX}cpu={}", self.cpu)?;
        for counter in Counter::all() {
            write!(out, " {}={}", counter.name(), self.get(counter))?;
        }
        Ok(())
    }

    /// Reads a line `write_line` wrote; `None` for any other line or a malformed one.
    pub fn parse(line: &str) -> Option<Self> {
        let mut fields = line.strip_prefix(PREFIX)?.split(' ');
        let cpu = fields.next()?.strip_prefix("cpu=")?.parse().ok()?;
        let mut values = [0; Counter::COUNT];
        for counter in Counter::all() {
            let (key, value) = fields.next()?.split_once('=')?;
            if key != counter.name() {
                return None;
            }
            values[counter.index()] = value.parse().ok()?;
        }
        fields.next().is_none().then_some(Self { cpu, values })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_have_distinct_places_and_names() {
        let counters: Vec<Counter> = Counter::all().collect();
        assert_eq!(counters.len(), Counter::COUNT);
        for (index, counter) in counters.iter().enumerate() {
            assert_eq!(counter.index(), index);
            assert_eq!(Counter::from_index(index), *counter);
        }
        let mut names: Vec<&str> = counters.iter().map(|counter| counter.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), Counter::COUNT);
        let entry = VectorEntry(5);
        assert_eq!((entry.kind(), entry.source(), entry.offset()), ("irq", "current_spx", 0x280));
        assert_eq!(Counter::Vector(entry).name(), "vector.irq.current_spx");
    }

    #[test]
    fn a_line_reads_back_and_a_short_one_does_not() {
        let opened = [1; Counter::COUNT];
        let mut closed = [1; Counter::COUNT];
        closed[Counter::Instructions.index()] = 126;
        closed[Counter::Vector(VectorEntry(4)).index()] = 3;
        let window = WindowCounts::between(1, &opened, &closed);
        assert_eq!(window.get(Counter::Instructions), 125);
        assert_eq!(window.get(Counter::Vector(VectorEntry(4))), 2);
        let mut line = String::new();
        window.write_line(&mut line).unwrap();
        assert!(line.starts_with("events window: cpu=1 insn=125 loads=0 "), "{line}");
        assert_eq!(WindowCounts::parse(&line), Some(window));
        let short = line.rsplit_once(' ').unwrap().0;
        assert_eq!(WindowCounts::parse(short), None);
        assert_eq!(WindowCounts::parse(&format!("{line} extra=1")), None);
        assert_eq!(WindowCounts::parse("bench row: baseline loop - per_op insn 2"), None);
        assert_eq!(parse_end("events end: windows=12 unclosed=0 cache=off"), Some((12, 0, CacheMode::Off)));
        assert_eq!(parse_end("events end: windows=12 unclosed=0 cache=cold"), Some((12, 0, CacheMode::Cold)));
        assert_eq!(parse_end("events end: windows=12 unclosed=0 cache=on"), None);
        assert_eq!(parse_end("events end: windows=12 unclosed=0"), None);
        assert_eq!(parse_row("events row: cpu=0 windows=7"), Some((0, 7)));
        assert_eq!(parse_row("events row: cpu=0"), None);
    }
}
