//! The kernel command line (`/chosen/bootargs`) as a read-only key -> value view.
//!
//! Words are `KEY=VALUE` or a bare `KEY` (value ""), separated by white space; a key may come
//! more than once, and each reader applies its values in order, so the last one wins. The keys
//! are `protocol::cmdline`'s, which xtask spells too. Each subsystem reads its own options from
//! an `Args` (a `from_args` beside the type it fills, called from `kernel_main`); this file knows
//! no subsystem. The keys each subsystem reads:
//!
//! - the run (run.rs): `run=demo|test|bench|sweep|profile|panic|fault|unowned-brk|hang|use-after-free`
//!   (the last five exercise the failure paths), `filter=SUBSTRING` (tests), `icount=0|1`,
//!   `expect-pauth=QARMA5|QARMA3|IMPDEF|none` (what xtask knows the CPU variant has);
//! - `exit=semihosting|park` (power.rs), `hz=N` (the tick), `cpus=N`, and the test-only
//!   `smp.fail-cpu=N smp.late-cpu=N smp.tlbi=local|broadcast` (task/cpus.rs);
//! - benchmarks: `bench=SUITE,... reps=N clock=cycles|ns bench.host-cpus=N` (bench/);
//! - function tracing from boot: `ftrace=PATTERN ftrace-scheme=list|call-ops|vector` (ftrace/);
//! - probes from boot: `kprobe=SYMBOL[+OFFSET]:METHOD`, `kretprobe=SYMBOL:METHOD`, repeatable
//!   (demo/boot_probes.rs);
//! - the sanitizer (mm/kasan/options.rs): `tag-seed=N` (decimal or 0x-hex: the tag generator's
//!   seed), `kasan.fault=report|panic` (default report: continue after a report),
//!   `kasan.multi_shot` (print every report, not only the first; `=0|1` too), the older
//!   `kasan=panic|recover` (fault=panic; fault=report with multi-shot) and
//!   `kasan.mode=sync|async|asymm` (build variant `mte`: what a tag check fault does);
//! - `kasan.stack_sample=N` (collect one allocation stack in N, N >= 1; stacktrace.rs);
//! - the profiler: `profile.workload=NAME profile.unwinder=fp|scs|both profile.every=N
//!   profile.clock=pmu|timer profile.break=fp|scs` (profile/);
//! - the probe sweep: `sweep.*` (sweep/);
//! - test-only fault switches from boot: `inject=NAME,...` (inject.rs, read in main.rs).

use protocol::cmdline as key;

/// The boot arguments, read by each subsystem for its own keys.
#[derive(Clone, Copy)]
pub struct Args {
    line: &'static str,
}

impl Args {
    /// A view over `line`; warns once about each word whose key nobody reads.
    pub fn new(line: &'static str) -> Self {
        let args = Self { line };
        for (word, key) in args.line.split_whitespace().map(|word| (word, split(word).0)) {
            if !key::ALL.contains(&key) && !is_for_linux(key) {
                Self::warn_unknown(word);
            }
        }
        args
    }

    /// The whole line, as the bootloader gave it.
    pub fn line(&self) -> &'static str {
        self.line
    }

    /// Every word as `(key, value)`, in order (a bare word has the value "").
    pub fn pairs(&self) -> impl Iterator<Item = (&'static str, &'static str)> {
        self.line.split_whitespace().map(split)
    }

    /// The words written `KEY=VALUE` (bare words left out), in order.
    pub fn assignments(&self) -> impl Iterator<Item = (&'static str, &'static str)> {
        self.line.split_whitespace().filter_map(|word| word.split_once('='))
    }

    /// Every value of `key`, in order.
    pub fn values(&self, key: &'static str) -> impl Iterator<Item = &'static str> {
        self.pairs().filter(move |&(word_key, _)| word_key == key).map(|(_, value)| value)
    }

    /// The warning for a value its key's reader does not know: the same words as for an unknown
    /// key, since such a word is ignored as a whole.
    pub fn ignoring(key: &str, value: &str) {
        defmt::warn!("cmdline: ignoring unknown argument {=str}={=str}", key, value);
    }

    fn warn_unknown(word: &str) {
        defmt::warn!("cmdline: ignoring unknown argument {=str}", word);
    }
}

fn split(word: &'static str) -> (&'static str, &'static str) {
    word.split_once('=').unwrap_or((word, ""))
}

/// A decimal or `0x`-prefixed hexadecimal u32.
pub fn parse_u32(text: &str) -> Option<u32> {
    match text.strip_prefix("0x") {
        Some(hex) => u32::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

/// Words the Raspberry Pi firmware puts before `cmdline.txt` for Linux (module parameters such as
/// `8250.nr_uarts=1`, `coherent_pool=1M`, `console=...`): not for tracelab, and not typos. Keys
/// with a dot are not checked either: the `sweep.*` family and the test-only switches are read
/// where they are used.
fn is_for_linux(key: &str) -> bool {
    key.contains('.')
        || key.contains('_')
        || matches!(
            key,
            "console" | "cma" | "root" | "rootfstype" | "rootwait" | "quiet" | "splash" | "video" | "earlycon"
        )
}
