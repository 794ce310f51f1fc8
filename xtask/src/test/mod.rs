//! `cargo xtask test`: host crate tests, then the kernel suite in QEMU over a configuration matrix.
//!
//! Kernel tests on `virt` run under `-icount shift=0,sleep=off`: deterministic, and timer IRQs
//! arrive at exactly the instruction their deadline names (the IRQ-time stack-trace test at
//! random points needs that). `raspi4b` runs without icount: its four cores share the icount
//! budget and tick delivery on CPU 0 became irregular (5 to 24 ticks in a 20-tick window); the
//! random-point test is skipped there and says why.
//! The whole matrix (`--matrix`) on `virt` is every build variant (full, prod, plain) x every
//! CPU variant x entry at EL1 and EL2 x GICv2 and GICv3. The default set leaves out two of the
//! three PAuth algorithms: under icount QARMA5, QARMA3 and the IMPLEMENTATION DEFINED algorithm
//! execute the same instructions (only their emulation time differs, QARMA5 ten times dearer),
//! so one of them, beside `pauth=off` and the Cortex-A72, keeps every distinct path. On QEMU
//! `raspi4b` (the Pi 4 board) every build variant runs once: Cortex-A72, EL2, GIC-400. Each kernel
//! test counts once per configuration it ran in. `--filter` runs one configuration unless
//! `--matrix` is given (`--smp N`: on N CPUs). Every configuration above runs on one CPU; the
//! default set adds the suite on 4 CPUs (`smp 4`): virt with max,pauth-impdef=on at EL1/GICv2
//! per build variant, the first variant also at EL2 (PSCI through SMC) and with GICv3, and
//! raspi4b (spin table). When `full` is in the set, the `kasan_` corpus runs once more in the
//! short-granule build (`--kasan-short-granules`; virt, EL1, GICv2, `max,pauth=off` if selected).

mod args;
mod bench;
mod concurrent;
mod configuration;
mod docs_commands;
mod failure;
mod host;
mod ktap;
mod list;
mod matrix;
mod rpi4;
mod shard;
mod tally;

use crate::Failure;
use crate::build::{self, Board, BuildVariant};
use crate::qemu::{self, CpuVariant};
use matrix::Selection;
use std::time::Instant;
use tally::Tally;

pub use args::TestArgs;
pub use shard::merge;

pub fn run(args: &TestArgs) -> Result<u8, Failure> {
    let start = Instant::now();
    let mut tally = Tally::default();
    crate::names::check_test_filter(&args.filter)?;
    if !args.no_host && !args.list && shard::owns_the_rest(args) {
        host::host_tests(&mut tally)?;
    }
    qemu::ensure_installed()?;
    let selection = Selection::new(args);
    let sanitizer = args.sanitizer.options(&selection.variants)?;
    selection.describe(args);
    let Selection { variants, cpus, boards, .. } = &selection;
    let rpi4_dtb = if boards.contains(&Board::Rpi4) && cpus.contains(&CpuVariant::CortexA72) {
        let files = crate::bootfiles::get(&args.boot_files)?;
        eprintln!("xtask: {}", files.source);
        Some(files.dtb)
    } else {
        None
    };
    let outcome = configuration::run_selection(&selection, sanitizer, rpi4_dtb.as_ref(), args, &mut tally)?;
    if outcome.unmatched {
        println!("no kernel test name contains `{}`", args.filter);
        return Ok(2);
    }
    let mut timed_out = outcome.timed_out;
    timed_out |=
        shard::owns_the_rest(args) && configuration::kasan_short_granules(&selection, sanitizer, args, &mut tally)?;
    // A listing runs nothing else: its failures are listings that went wrong.
    if args.list {
        tally.failures.iter().for_each(|failure| println!("failed: {failure}"));
        return Ok(if timed_out {
            124
        } else if tally.failed == 0 {
            0
        } else {
            1
        });
    }
    if args.filter.is_empty() && rpi4_dtb.is_some() && shard::owns_the_rest(args) {
        rpi4::rpi4_checks(&args.boot_files, &mut tally)?;
    }
    if args.filter.is_empty() && shard::owns_the_rest(args) {
        let image = build::kernel(Board::Virt, BuildVariant::Full)?;
        failure::failure_paths(&image, &mut tally)?;
        if variants.contains(&BuildVariant::Mte) && boards.contains(&Board::Virt) {
            failure::mte_failure_paths(&mut tally)?;
        }
        let prod = build::kernel(Board::Virt, BuildVariant::Prod)?;
        bench::bench_harness(&prod, &mut tally)?;
        bench::killed_bench_writes_nothing(&mut tally)?;
        concurrent::demo_and_bench_at_once(&mut tally)?;
        docs_commands::docs_commands(&mut tally)?;
        crate::profile::self_test(&mut |name, problem| tally.check(name, problem.as_ref()))?;
        crate::probe_spec::self_test(&mut |name, problem| tally.check(name, problem.as_ref()))?;
        tally.check("icount regression gate", crate::bench::gate::check(&prod)?.as_ref());
        tally.check("events plugin counts", crate::bench::events::self_test(&prod)?.as_ref());
        let (passed, failures) = crate::demo::test(&args.variants, &args.cpus, &args.boards)?;
        tally.passed += passed;
        tally.failed += failures.len() as u64;
        tally.failures.extend(failures);
    }
    eprintln!("xtask: test took {:.0} s", start.elapsed().as_secs_f64());
    if let Some(part) = args.shard {
        shard::save(args, part, &tally, timed_out)?;
    }
    for failure in &tally.failures {
        println!("failed: {failure}");
    }
    println!("{} passed, {} failed, {} skipped", tally.passed, tally.failed, tally.skipped);
    if timed_out {
        return Ok(124);
    }
    Ok(if tally.failed == 0 { 0 } else { 1 })
}
