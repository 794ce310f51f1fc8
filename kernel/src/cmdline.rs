//! The kernel command line (`/chosen/bootargs`): what to run and how.
//!
//! `run=demo|test|sweep|profile|panic|fault|unowned-brk|hang|use-after-free` (the last five exercise the failure paths), `filter=SUBSTRING` (tests), `hz=N` (tick rate), `cpus=N` (CPUs to bring up), `exit=semihosting|park`,
//! `expect-pauth=QARMA5|QARMA3|IMPDEF|none` (what xtask knows the CPU variant has);
//! benchmarks: `run=bench bench=SUITE,... reps=N clock=cycles|ns icount=0|1`;
//! function tracing from boot: `ftrace=PATTERN ftrace-scheme=list|call-ops|vector`; the sanitizer
//! heap: `tag-seed=N` (decimal or 0x-hex: the tag generator's seed), `kasan.fault=report|panic` (default report: continue after a
//! report), `kasan.multi_shot` (print every report, not only the first; `=0|1` too), and the
//! older `kasan=panic|recover` (fault=panic; fault=report with multi-shot);
//! probes from boot: `kprobe=SYMBOL[+OFFSET]:METHOD`, `kretprobe=SYMBOL:METHOD` (repeatable);
//! `kasan.stack_sample=N` (collect one allocation stack in N, N >= 1; default 1);
//! the profiler: `run=profile profile.workload=NAME profile.unwinder=fp|scs|both profile.every=N
//! profile.clock=pmu|timer profile.break=fp|scs` (profile/mod.rs).
//! `kasan.mode=sync|async|asymm` (build variant `mte`: what a tag check fault does; default sync).
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
    /// A workload under the sampling profiler (`profile.*`).
    Profile,
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
    /// `bench.host-cpus=N`: the host's cores (xtask passes it in wall mode).
    pub bench_host_cpus: Option<usize>,
    /// QEMU runs with `-icount` (xtask says so): instruction-exact time.
    pub icount: bool,
    /// `ftrace=PATTERN`: the function tracer on every function matching PATTERN from boot to
    /// the end of the run, then its last records dumped.
    pub ftrace: Option<&'static str>,
    /// `ftrace-scheme=list|call-ops|vector`: the dispatch scheme (default call-ops).
    pub ftrace_scheme: crate::ftrace::Scheme,
    /// Seed of the heap's tag generator (`tag-seed=`): the same seed gives the same tags.
    pub tag_seed: u32,
    /// Stop the kernel after a KASAN report (`kasan.fault=panic`) instead of continuing.
    pub kasan_fault_panic: bool,
    /// Print every KASAN report, not only the first (`kasan.multi_shot`).
    pub kasan_multi_shot: bool,
    /// `kprobe=`/`kretprobe=` requests, registered at boot (demo/boot_probes.rs).
    pub boot_probes: crate::demo::boot_probes::Requests,
    /// `kasan.stack_sample=N`: one allocation stack in N is collected (free stacks always).
    pub stack_sample: u32,
    /// `run=profile`: `profile.workload=NAME profile.unwinder=fp|scs|both profile.every=N
    /// profile.clock=pmu|timer profile.break=fp|scs` (the last is the test-only broken unwinder).
    pub profile: crate::profile::Request,
    /// `kasan.mode=`: what an MTE tag check fault does (build variant `mte`).
    pub kasan_mode: crate::arch::mte::CheckMode,
    /// `cpus=N`: CPUs to bring up, the boot CPU included (None: every CPU the machine has, or
    /// only the boot CPU where the board says so).
    pub cpus: Option<usize>,
    /// `smp.fail-cpu=N` (test-only): CPU N is started with an MPIDR no CPU has.
    pub smp_fail_cpu: Option<usize>,
    /// `smp.late-cpu=N` (test-only): CPU N is held before it arrives until the boot CPU has given
    /// up on it, then let go (it must park, not come online).
    pub smp_late_cpu: Option<usize>,
    /// `smp.tlbi=local` (test-only): TLB invalidations after a mapping change stay local.
    pub smp_local_tlbi: bool,
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
            bench_host_cpus: None,
            icount: false,
            ftrace: None,
            ftrace_scheme: crate::ftrace::Scheme::CallOps,
            tag_seed: crate::mm::kasan::shadow::DEFAULT_SEED,
            kasan_fault_panic: false,
            kasan_multi_shot: false,
            boot_probes: crate::demo::boot_probes::Requests::new(),
            stack_sample: 1,
            profile: crate::profile::Request::new(),
            kasan_mode: crate::arch::mte::CheckMode::Sync,
            cpus: None,
            smp_fail_cpu: None,
            smp_late_cpu: None,
            smp_local_tlbi: false,
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
                (key::BENCH_HOST_CPUS, cpus) => match cpus.parse::<usize>() {
                    Ok(cpus) if cpus >= 1 => line.bench_host_cpus = Some(cpus),
                    _ => defmt::warn!("cmdline: bench.host-cpus={=str} is not a positive number", cpus),
                },
                (key::RUN, "panic") => line.run = Run::Panic,
                (key::RUN, "fault") => line.run = Run::Fault,
                (key::RUN, "unowned-brk") => line.run = Run::UnownedBrk,
                (key::RUN, "hang") => line.run = Run::Hang,
                (key::RUN, "use-after-free") => line.run = Run::UseAfterFree,
                (key::RUN, "profile") => line.run = Run::Profile,
                (key::PROFILE_WORKLOAD, name) => line.profile.workload = name,
                (key::PROFILE_UNWINDER, name) => match crate::profile::Unwinders::parse(name) {
                    Some(unwinders) => line.profile.unwinders = unwinders,
                    None => defmt::warn!("cmdline: profile.unwinder={=str} is not fp|scs|both, keeping both", name),
                },
                (key::PROFILE_EVERY, every) => match every.parse::<u64>() {
                    Ok(every) if every >= 1 => line.profile.clock = crate::profile::Clock::Pmu { every },
                    _ => defmt::warn!("cmdline: profile.every={=str} is not a number >= 1", every),
                },
                (key::PROFILE_CLOCK, "timer") => line.profile.clock = crate::profile::Clock::Timer,
                (key::PROFILE_CLOCK, "pmu") => {}
                (key::PROFILE_BREAK, "fp") => line.profile.broken = Some(crate::stacktrace::Mode::FramePointer),
                (key::PROFILE_BREAK, "scs") => line.profile.broken = Some(crate::stacktrace::Mode::ShadowCallStack),
                (key::FILTER, filter) => line.filter = filter,
                (key::TAG_SEED, seed) => match parse_u32(seed) {
                    Some(seed) => line.tag_seed = seed,
                    None => defmt::warn!("cmdline: tag-seed={=str} is not a 32-bit number", seed),
                },
                (key::KASAN, "panic") => line.kasan_fault_panic = true,
                (key::KASAN, "recover") => (line.kasan_fault_panic, line.kasan_multi_shot) = (false, true),
                ("kasan.fault", "report") => line.kasan_fault_panic = false,
                ("kasan.fault", "panic") => line.kasan_fault_panic = true,
                ("kasan.fault", other) => {
                    defmt::warn!("cmdline: kasan.fault={=str} is not report|panic, keeping report", other)
                }
                ("kasan.mode", mode) => match crate::arch::mte::CheckMode::parse(mode) {
                    Some(mode) => line.kasan_mode = mode,
                    None => defmt::warn!("cmdline: kasan.mode={=str} is not sync|async|asymm, keeping sync", mode),
                },
                ("kasan.multi_shot", "" | "1" | "on") => line.kasan_multi_shot = true,
                ("kasan.multi_shot", "0" | "off") => line.kasan_multi_shot = false,
                ("kasan.multi_shot", other) => {
                    defmt::warn!("cmdline: kasan.multi_shot={=str} is not 0|1, keeping single-shot", other)
                }
                (key::KASAN_STACK_SAMPLE, every) => match every.parse::<u32>() {
                    Ok(every) if every >= 1 => line.stack_sample = every,
                    _ => defmt::warn!(
                        "cmdline: kasan.stack_sample={=str} is not a number >= 1, keeping {=u32}",
                        every,
                        line.stack_sample
                    ),
                },
                (key::HZ, hz) => match hz.parse::<u64>() {
                    Ok(hz) if (1..=10_000).contains(&hz) => line.hz = hz,
                    _ => defmt::warn!("cmdline: hz={=str} is not in 1..=10000, keeping {=u64}", hz, line.hz),
                },
                (key::CPUS, cpus) => match cpus.parse::<usize>() {
                    Ok(cpus) if (1..=crate::arch::percpu::CPUS).contains(&cpus) => line.cpus = Some(cpus),
                    _ => defmt::warn!(
                        "cmdline: cpus={=str} is not in 1..={=usize}, ignored",
                        cpus,
                        crate::arch::percpu::CPUS
                    ),
                },
                (key::SMP_FAIL_CPU, cpu) => match cpu.parse::<usize>() {
                    Ok(cpu) => line.smp_fail_cpu = Some(cpu),
                    _ => defmt::warn!("cmdline: smp.fail-cpu={=str} is not a CPU number", cpu),
                },
                (key::SMP_LATE_CPU, cpu) => match cpu.parse::<usize>() {
                    Ok(cpu) => line.smp_late_cpu = Some(cpu),
                    _ => defmt::warn!("cmdline: smp.late-cpu={=str} is not a CPU number", cpu),
                },
                (key::SMP_TLBI, "local") => line.smp_local_tlbi = true,
                (key::SMP_TLBI, "broadcast") => line.smp_local_tlbi = false,
                (key::EXIT, "semihosting") => line.semihosting = true,
                (key::EXIT, "park") => line.semihosting = false,
                (key::EXPECT_PAUTH, name) => line.expect_pauth = Some(name),
                (key::KPROBE, spec) => line.boot_probes.push(crate::demo::boot_probes::Kind::Kprobe, spec),
                (key::KRETPROBE, spec) => line.boot_probes.push(crate::demo::boot_probes::Kind::Kretprobe, spec),
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
