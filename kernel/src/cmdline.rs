//! The kernel command line (`/chosen/bootargs`): what to run and how.
//!
//! `run=demo|test|sweep|panic|fault|unowned-brk|hang|use-after-free` (the last five exercise the failure paths), `filter=SUBSTRING` (tests), `hz=N` (tick rate), `exit=semihosting|park`,
//! `expect-pauth=QARMA5|QARMA3|IMPDEF|none` (what xtask knows the CPU variant has);
//! benchmarks: `run=bench bench=SUITE,... reps=N clock=cycles|ns icount=0|1`;
//! function tracing from boot: `ftrace=PATTERN ftrace-scheme=list|call-ops|vector`; the sanitizer
//! heap: `tag-seed=N` (decimal or 0x-hex: the tag generator's seed), `kasan=panic|recover`.
//! The keys are `protocol::cmdline`'s, which xtask spells too.

use protocol::cmdline as key;

#[derive(Clone, Copy, PartialEq, Eq, defmt::Format)]
pub enum Run {
    Demo,
    Test,
    Bench,
    /// Failure paths, for xtask to check that they end runs as they must.
    Panic,
    Fault,
    /// A BRK immediate nobody owns: the unexpected-exception report stops the kernel.
    UnownedBrk,
    Hang,
    /// A deliberate use-after-free outside any test: the sanitizer's report stops the kernel.
    UseAfterFree,
    /// The probe sweep (`sweep/`): its own `sweep.*` words say what to sweep.
    Sweep,
}

pub struct CommandLine {
    pub run: Run,
    pub filter: &'static str,
    pub hz: u64,
    pub semihosting: bool,
    pub expect_pauth: Option<&'static str>,
    pub bench_suites: &'static str,
    pub bench_reps: u32,
    pub bench_clock: crate::bench::Clock,
    /// QEMU runs with `-icount` (xtask says so): instruction-exact time.
    pub icount: bool,
    /// `ftrace=PATTERN`: the function tracer on every function matching PATTERN from boot to
    /// the end of the run, then its last records dumped.
    pub ftrace: Option<&'static str>,
    /// `ftrace-scheme=list|call-ops|vector`: the dispatch scheme (default call-ops).
    pub ftrace_scheme: crate::ftrace::Scheme,
    /// Seed of the heap's tag generator (`tag-seed=`): the same seed gives the same tags.
    pub tag_seed: u32,
    /// Continue after a KASAN report instead of stopping (`kasan=recover`).
    pub kasan_recover: bool,
}

impl CommandLine {
    pub fn parse(bootargs: &'static str, semihosting_by_default: bool) -> Self {
        let mut line = Self {
            run: Run::Demo,
            filter: "",
            hz: 100,
            semihosting: semihosting_by_default,
            expect_pauth: None,
            bench_suites: "",
            bench_reps: 1,
            bench_clock: crate::bench::Clock::Cycles,
            icount: false,
            ftrace: None,
            ftrace_scheme: crate::ftrace::Scheme::CallOps,
            tag_seed: crate::mm::kasan::shadow::DEFAULT_SEED,
            kasan_recover: false,
        };
        for word in bootargs.split_whitespace() {
            let (key, value) = word.split_once('=').unwrap_or((word, ""));
            match (key, value) {
                (key::RUN, "demo") => line.run = Run::Demo,
                (key::RUN, "test") => line.run = Run::Test,
                (key::RUN, "bench") => line.run = Run::Bench,
                (key::RUN, "sweep") => line.run = Run::Sweep,
                (key::BENCH, suites) => line.bench_suites = suites,
                (key::REPS, reps) => match reps.parse::<u32>() {
                    Ok(reps) if reps >= 1 => line.bench_reps = reps,
                    _ => defmt::warn!("cmdline: reps={=str} is not a positive number", reps),
                },
                (key::CLOCK, "cycles") => line.bench_clock = crate::bench::Clock::Cycles,
                (key::CLOCK, "ns") => line.bench_clock = crate::bench::Clock::Nanoseconds,
                (key::ICOUNT, flag) => line.icount = flag == "1",
                (key::RUN, "panic") => line.run = Run::Panic,
                (key::RUN, "fault") => line.run = Run::Fault,
                (key::RUN, "unowned-brk") => line.run = Run::UnownedBrk,
                (key::RUN, "hang") => line.run = Run::Hang,
                (key::RUN, "use-after-free") => line.run = Run::UseAfterFree,
                (key::FILTER, filter) => line.filter = filter,
                (key::TAG_SEED, seed) => match parse_u32(seed) {
                    Some(seed) => line.tag_seed = seed,
                    None => defmt::warn!("cmdline: tag-seed={=str} is not a 32-bit number", seed),
                },
                (key::KASAN, "panic") => line.kasan_recover = false,
                (key::KASAN, "recover") => line.kasan_recover = true,
                (key::HZ, hz) => match hz.parse::<u64>() {
                    Ok(hz) if (1..=10_000).contains(&hz) => line.hz = hz,
                    _ => defmt::warn!("cmdline: hz={=str} is not in 1..=10000, keeping {=u64}", hz, line.hz),
                },
                (key::EXIT, "semihosting") => line.semihosting = true,
                (key::EXIT, "park") => line.semihosting = false,
                (key::EXPECT_PAUTH, name) => line.expect_pauth = Some(name),
                (key::FTRACE, pattern) => line.ftrace = Some(pattern),
                (key::FTRACE_SCHEME, "list") => line.ftrace_scheme = crate::ftrace::Scheme::List,
                (key::FTRACE_SCHEME, "call-ops") => line.ftrace_scheme = crate::ftrace::Scheme::CallOps,
                (key::FTRACE_SCHEME, "vector") => line.ftrace_scheme = crate::ftrace::Scheme::Vector,
                _ if is_for_linux(key) => {}
                _ => defmt::warn!("cmdline: ignoring unknown argument {=str}", word),
            }
        }
        line
    }
}

/// A decimal or `0x`-prefixed hexadecimal u32.
fn parse_u32(text: &str) -> Option<u32> {
    match text.strip_prefix("0x") {
        Some(hex) => u32::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

/// Words the Raspberry Pi firmware puts before `cmdline.txt` for Linux (module parameters such as
/// `8250.nr_uarts=1`, `coherent_pool=1M`, `console=...`): not for tracelab, and not typos.
fn is_for_linux(key: &str) -> bool {
    key.contains('.')
        || key.contains('_')
        || matches!(
            key,
            "console" | "cma" | "root" | "rootfstype" | "rootwait" | "quiet" | "splash" | "video" | "earlycon"
        )
}
