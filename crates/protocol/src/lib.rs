//! The protocol between the tracelab kernel and xtask: names and numbers both sides spell.
//!
//! xtask builds the kernel, writes its symbol table, boots it with a command line and reads
//! its exit status and benchmark rows; the kernel reads the same command line and table and
//! reports through the same status and names. Each constant lives here once, so that the two
//! cannot drift. Log-line prefixes stay literals where defmt needs them (its format strings
//! must be literals); where xtask parses such a line, the prefix and the parser live here and
//! the kernel checks its literal against the prefix with [`same_str`] (`bench::ROW_PREFIX`).
#![cfg_attr(not(any(test, feature = "writer")), no_std)]
#![forbid(unsafe_code)]

pub mod bench;
pub mod ksyms;
pub mod replay;

/// How a kernel run ends: the semihosting exit code, which QEMU turns into its exit status.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
pub enum ExitStatus {
    Success = 0,
    TestsFailed = 1,
    /// A request the kernel refuses (`run=profile`: an unknown workload, a period too small).
    UsageError = 2,
    /// A panic, an unexpected exception, a KASAN report in panic mode.
    Panic = 3,
    /// The build needs a CPU feature the machine lacks (variant `mte` without `mte=on`).
    Unsupported = 4,
}

impl ExitStatus {
    pub const fn code(self) -> i32 {
        self as i32
    }
}

/// The probe sweep's batch shapes, shared by the kernel's sweep and xtask, which halves a batch
/// or a random set that hangs.
pub mod sweep {
    /// Consecutive words of a function a batch arms at once (`sweep.words=N`: at most this).
    pub const BATCH_WORDS: usize = 120;
    /// Members of a random set (`sweep.members=A..B`: `B` at most this).
    pub const SET_MEMBERS: usize = 48;
}

/// Benchmark suites: one list, in the order the kernel runs them when none is named. The kernel
/// maps each to its function and xtask adds each one's help text and default build variant,
/// both by an exhaustive `match`, so a suite added here does not build until both sides have it.
pub mod suite {
    #[derive(Clone, Copy, PartialEq, Eq, Debug)]
    pub enum Suite {
        Baseline,
        Stacktrace,
        Depot,
        Probes,
        Ftrace,
        KasanBoot,
        Cpus,
        CpusHeap,
        KasanReplay,
    }

    impl Suite {
        /// Every suite, in run order.
        pub const ALL: [Suite; 9] = [
            Self::Baseline,
            Self::Stacktrace,
            Self::Depot,
            Self::Probes,
            Self::Ftrace,
            Self::KasanBoot,
            Self::Cpus,
            Self::CpusHeap,
            Self::KasanReplay,
        ];

        /// The name on the command line (`bench=NAME,...`) and in the SUITE field of its rows.
        pub const fn name(self) -> &'static str {
            match self {
                Self::Baseline => "baseline",
                Self::Stacktrace => "stacktrace",
                Self::Depot => "depot",
                Self::Probes => "probes",
                Self::Ftrace => "ftrace",
                Self::KasanBoot => "kasan-boot",
                Self::Cpus => "cpus",
                Self::CpusHeap => "cpus-heap",
                Self::KasanReplay => "kasan-replay",
            }
        }

        pub fn from_name(name: &str) -> Option<Self> {
            Self::ALL.into_iter().find(|suite| suite.name() == name)
        }
    }

    /// Linux's own mechanisms measured in the same QEMU (`cargo xtask peer linux`): a suite
    /// of results.json rows that only the host measures. It is not in [`Suite::ALL`], so the
    /// kernel never runs it and `bench` never asks for it.
    pub const LINUX: &str = "linux";

    /// Suites whose rows come from the host, never from the kernel.
    pub const HOST_ONLY: [&str; 1] = [LINUX];

    impl Suite {
        /// Whether `name` is a host-only suite ([`HOST_ONLY`]).
        pub fn is_host_only(name: &str) -> bool {
            HOST_ONLY.contains(&name)
        }
    }

    pub const BASELINE: &str = Suite::Baseline.name();
    pub const STACKTRACE: &str = Suite::Stacktrace.name();
    pub const DEPOT: &str = Suite::Depot.name();
    pub const PROBES: &str = Suite::Probes.name();
    pub const FTRACE: &str = Suite::Ftrace.name();
    pub const KASAN_BOOT: &str = Suite::KasanBoot.name();
    pub const CPUS: &str = Suite::Cpus.name();
    pub const CPUS_HEAP: &str = Suite::CpusHeap.name();
    pub const KASAN_REPLAY: &str = Suite::KasanReplay.name();
}

/// Workloads of `run=profile` (`profile.workload=`), as `cargo xtask profile` names them.
pub mod profile {
    pub const KASAN_BOOT: &str = "kasan-boot";
    pub const PROBES: &str = "probes";
    pub const FTRACE: &str = "ftrace";
    pub const TESTS: &str = "tests";
    pub const KNOWN_SHAPE: &str = "known-shape";
    /// Linux's recorded boot allocations replayed once, stacks collected by frame walk.
    pub const REPLAY: &str = "replay";
    pub const WORKLOADS: [&str; 6] = [KASAN_BOOT, PROBES, FTRACE, TESTS, KNOWN_SHAPE, REPLAY];
}

/// Keys of the kernel command line (`/chosen/bootargs`), each written `KEY=VALUE`.
pub mod cmdline {
    pub const RUN: &str = "run";
    pub const FILTER: &str = "filter";
    pub const HZ: &str = "hz";
    /// How many CPUs to bring up (1..=4; the boot CPU counts). On boards whose secondaries
    /// all exist (raspi4b) this chooses; elsewhere it caps the device tree's CPUs.
    pub const CPUS: &str = "cpus";
    /// Test-only: start this CPU with an MPIDR no CPU has, so PSCI refuses it and the banner and
    /// the `secondary_cpus_are_online` test must report it.
    pub const SMP_FAIL_CPU: &str = "smp.fail-cpu";
    /// Test-only: hold this CPU before it arrives in `secondary_main` until the boot CPU has
    /// given up on it, then let it go: it must park, and the banner and the
    /// `secondary_cpus_are_online` test must report it.
    pub const SMP_LATE_CPU: &str = "smp.late-cpu";
    /// Test-only: `smp.tlbi=local` makes the kernel's TLB invalidations after a mapping change
    /// local (`tlbi ...` + `dsb nsh`) instead of broadcast, so `smp_tlb_shootdown` must fail.
    pub const SMP_TLBI: &str = "smp.tlbi";
    pub const EXIT: &str = "exit";
    pub const EXPECT_PAUTH: &str = "expect-pauth";
    pub const BENCH: &str = "bench";
    pub const REPS: &str = "reps";
    pub const CLOCK: &str = "clock";
    pub const ICOUNT: &str = "icount";
    /// The host's cores (`bench.host-cpus=N`, wall mode): the `cpus` suites measure at most
    /// this many CPUs at once, since more vCPUs than host cores would time the host's
    /// scheduler, not the kernel.
    pub const BENCH_HOST_CPUS: &str = "bench.host-cpus";
    /// `bench.events=1`: after each row it can tie to its windows, the kernel writes which
    /// (`bench::EVENTS_PREFIX`), for the events plugin's counts (`cargo xtask bench --events`).
    pub const BENCH_EVENTS: &str = "bench.events";
    /// Test-only: `inject=NAME,...` turns on the kernel's named fault switches (`kernel/src/inject.rs`)
    /// from boot, for failure paths that must be caught before any test runs.
    pub const INJECT: &str = "inject";
    pub const FTRACE: &str = "ftrace";
    pub const FTRACE_SCHEME: &str = "ftrace-scheme";
    /// `ftrace-graph=PATTERN`: the function-graph tracer on PATTERN from boot to the end of the
    /// run, its events then streamed (`cargo xtask qemu --ftrace-graph`).
    pub const FTRACE_GRAPH: &str = "ftrace-graph";
    pub const TAG_SEED: &str = "tag-seed";
    pub const KASAN: &str = "kasan";
    pub const KASAN_FAULT: &str = "kasan.fault";
    pub const KASAN_MULTI_SHOT: &str = "kasan.multi_shot";
    pub const KASAN_MODE: &str = "kasan.mode";
    pub const KASAN_STACK_SAMPLE: &str = "kasan.stack_sample";
    pub const KPROBE: &str = "kprobe";
    pub const KRETPROBE: &str = "kretprobe";
    pub const PROFILE_WORKLOAD: &str = "profile.workload";
    pub const PROFILE_UNWINDER: &str = "profile.unwinder";
    pub const PROFILE_EVERY: &str = "profile.every";
    pub const PROFILE_CLOCK: &str = "profile.clock";
    pub const PROFILE_BREAK: &str = "profile.break";
    /// Every key above: the kernel warns about a word whose key is none of these (keys with a
    /// dot or an underscore aside: the `sweep.*` family, and Linux's module parameters that
    /// firmware adds).
    pub const ALL: [&str; 32] = [
        RUN,
        FILTER,
        HZ,
        CPUS,
        SMP_FAIL_CPU,
        SMP_LATE_CPU,
        SMP_TLBI,
        EXIT,
        EXPECT_PAUTH,
        BENCH,
        REPS,
        CLOCK,
        ICOUNT,
        FTRACE,
        FTRACE_SCHEME,
        FTRACE_GRAPH,
        TAG_SEED,
        KASAN,
        KASAN_FAULT,
        KASAN_MULTI_SHOT,
        KASAN_MODE,
        KASAN_STACK_SAMPLE,
        KPROBE,
        KRETPROBE,
        PROFILE_WORKLOAD,
        PROFILE_UNWINDER,
        PROFILE_EVERY,
        PROFILE_CLOCK,
        PROFILE_BREAK,
        BENCH_HOST_CPUS,
        BENCH_EVENTS,
        INJECT,
    ];
}

/// Where each board's loader puts the raw image (physical); kernel.ld links the image there.
pub mod load_address {
    pub const QEMU_VIRT: u64 = 0x4008_0000;
    pub const RPI4: u64 = 0x0008_0000;
}

/// Whether two strings are equal, where `==` cannot run: in a `const` assertion (the kernel
/// ties the literals of its defmt format strings to this crate's constants with it).
pub const fn same_str(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut index = 0;
    while index < a.len() {
        if a[index] != b[index] {
            return false;
        }
        index += 1;
    }
    true
}

/// The kernel's linear map: VA = PA + VA_OFFSET, for RAM, the image and devices (TTBR1, 39-bit).
pub const VA_OFFSET: u64 = 0xFFFF_FF80_0000_0000;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suite_names_are_distinct_and_read_back() {
        use suite::Suite;
        for (index, suite) in Suite::ALL.iter().enumerate() {
            assert!(!Suite::ALL[index + 1..].iter().any(|other| other.name() == suite.name()), "{suite:?} twice");
            assert_eq!(Suite::from_name(suite.name()), Some(*suite));
            assert!(!Suite::is_host_only(suite.name()), "{suite:?} is the kernel's");
        }
        assert_eq!(Suite::from_name("baselin"), None);
    }

    #[test]
    fn const_str_equality() {
        assert!(same_str("bench row: ", "bench row: "));
        assert!(!same_str("bench row: ", "bench row:"));
        assert!(!same_str("abc", "abd"));
    }

    #[test]
    fn command_line_keys_are_distinct() {
        for (index, key) in cmdline::ALL.iter().enumerate() {
            assert!(!cmdline::ALL[index + 1..].contains(key), "{key} twice");
        }
    }

    #[test]
    fn exit_codes_match_what_xtask_expects_of_qemu() {
        assert_eq!(ExitStatus::Success.code(), 0);
        assert_eq!(ExitStatus::TestsFailed.code(), 1);
        assert_eq!(ExitStatus::Panic.code(), 3);
    }

    #[test]
    fn load_addresses_lie_in_the_linear_map() {
        for address in [load_address::QEMU_VIRT, load_address::RPI4] {
            assert!(address.checked_add(VA_OFFSET).is_some());
            assert_eq!(address % 0x1_0000, 0, "loaders want 64 KiB alignment");
        }
    }
}
