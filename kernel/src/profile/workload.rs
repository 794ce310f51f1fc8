//! The workloads `cargo xtask profile` names: the benches' loops, the test suite, and a
//! workload of known shape that the profiler's own test checks the profile against.

use protocol::profile as names;

/// What a workload needs from the command line.
pub struct Context {
    pub icount: bool,
    pub expect_pauth: Option<&'static str>,
}

pub struct Workload {
    pub name: &'static str,
    /// Runs it; false when it reports a failure of its own (a failed test, a bench error).
    pub run: fn(&Context) -> bool,
}

/// Every workload, in `protocol::profile::WORKLOADS` order.
pub const ALL: [Workload; 6] = [
    Workload { name: names::KASAN_BOOT, run: kasan_boot },
    Workload { name: names::PROBES, run: probes_bench },
    Workload { name: names::FTRACE, run: ftrace_bench },
    Workload { name: names::TESTS, run: tests },
    Workload { name: names::KNOWN_SHAPE, run: known_shape },
    Workload { name: names::REPLAY, run: replay },
];

/// The names, for the error that lists them.
pub const NAMES: &str = "kasan-boot, probes, ftrace, tests, known-shape, replay";

pub fn find(name: &str) -> Option<&'static Workload> {
    ALL.iter().find(|workload| workload.name == name)
}

// Named functions, not closures: they are frames of every profile's stacks.
fn kasan_boot(context: &Context) -> bool {
    bench(protocol::suite::KASAN_BOOT, context)
}

fn probes_bench(context: &Context) -> bool {
    bench(protocol::suite::PROBES, context)
}

fn ftrace_bench(context: &Context) -> bool {
    bench(protocol::suite::FTRACE, context)
}

fn bench(suite: &str, context: &Context) -> bool {
    let plan =
        crate::bench::Plan { clock: crate::bench::Clock::Cycles, icount: context.icount, reps: 1, host_cpus: None };
    crate::bench::run(suite, &plan).is_ok()
}

/// The whole boot trace once through the sanitizer heap, as `kasan-replay`'s `fp` case: fails
/// when no blob was loaded, an allocation failed or the sanitizer reported.
fn replay(_: &Context) -> bool {
    use crate::mm::kasan::heap::Stacks;
    crate::bench::kasan_replay::replay_whole(Stacks::FramePointer)
        .is_some_and(|replayed| replayed.failed == 0 && replayed.reports == 0)
}

fn tests(context: &Context) -> bool {
    crate::tests::run("", context.expect_pauth, context.icount).failed == 0
}

/// Iterations of the light function per round; the heavy one runs three times as many.
const LIGHT_ITERATIONS: u64 = 60_000;
const ROUNDS: u64 = 5;

/// One function burning three times the instructions of its sibling, each under its own
/// caller: `shape_heavy_caller -> shape_heavy` and `shape_light_caller -> shape_light`. Both
/// burners run the same loop (only a constant differs, so the compiler cannot merge them), and
/// both call out once so that they are non-leaf functions with a frame record: their samples
/// then name their caller with either unwinder (a leaf's caller is in x30 only, which neither
/// walker reads). The rounds alternate so that a slow drift cannot favour one side.
fn known_shape(_: &Context) -> bool {
    let mut sum = 0u64;
    for _ in 0..ROUNDS {
        sum = sum.wrapping_add(shape_heavy_caller());
        sum = sum.wrapping_add(shape_light_caller());
    }
    core::hint::black_box(sum);
    true
}

#[inline(never)]
fn shape_heavy_caller() -> u64 {
    shape_heavy(3 * LIGHT_ITERATIONS).wrapping_add(1)
}

#[inline(never)]
fn shape_light_caller() -> u64 {
    shape_light(LIGHT_ITERATIONS).wrapping_add(1)
}

#[inline(never)]
fn shape_heavy(iterations: u64) -> u64 {
    shape_done(burn(iterations, 0x9e37_79b9_7f4a_7c15))
}

#[inline(never)]
fn shape_light(iterations: u64) -> u64 {
    shape_done(burn(iterations, 0xbf58_476d_1ce4_e5b9))
}

/// The loop both burners inline: the same instructions per iteration whatever the constant.
#[inline(always)]
fn burn(iterations: u64, multiplier: u64) -> u64 {
    let mut value = 1u64;
    for index in 0..iterations {
        value = core::hint::black_box(value.wrapping_mul(multiplier).wrapping_add(index));
    }
    value
}

#[inline(never)]
fn shape_done(value: u64) -> u64 {
    core::hint::black_box(value)
}
