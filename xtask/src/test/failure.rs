//! Runs that must fail the right way: the status, the report line and the stopped CPUs' traces.

use super::tally::Tally;
use crate::Failure;
use crate::build::{self, Board, BuildVariant};
use crate::qemu::{self, CpuVariant, Machine};
use protocol::ExitStatus;
use std::time::Duration;

/// Runs that must fail the right way: a panic and an unexpected exception end with status 3
/// and their report, a hang is killed on timeout with the running test named, a panic on 4 CPUs
/// stops the other three, a CPU that does not come up (or comes too late) is named and fails the bring-up test.
pub fn failure_paths(image: &build::KernelImage, tally: &mut Tally) -> Result<(), Failure> {
    let machine = Machine {
        board: Board::Virt,
        cpu: CpuVariant::MaxImpdef,
        el: 1,
        gic: 2,
        icount: false,
        dtb: None,
        mte: false,
        smp: 1,
    };
    // (name, CPUs, kernel command line, expected status, expected line)
    let checks: [(&str, u8, &str, Option<i32>, &str); 10] = [
        ("panic", 1, "run=panic exit=semihosting", Some(ExitStatus::Panic.code()), "panicked at kernel/src/run.rs"),
        (
            "fault",
            1,
            "run=fault exit=semihosting",
            Some(ExitStatus::Panic.code()),
            "unexpected synchronous exception: DataAbort",
        ),
        (
            "unowned-brk",
            1,
            "run=unowned-brk exit=semihosting",
            Some(ExitStatus::Panic.code()),
            "unexpected synchronous exception: Brk (ESR 0xf20001ff)",
        ),
        ("hang", 1, "run=hang exit=semihosting", None, "test start: deliberate_hang"),
        (
            "use-after-free",
            1,
            "run=use-after-free kasan.fault=panic exit=semihosting",
            Some(ExitStatus::Panic.code()),
            "BUG: KASAN: slab-use-after-free",
        ),
        // A panic stops the other CPUs by SGI and says so.
        (
            "panic-stops-cpus",
            4,
            "run=panic exit=semihosting",
            Some(ExitStatus::Panic.code()),
            "panic: stopped 3 of 3 other CPUs",
        ),
        // A CPU that PSCI refuses is named in the banner, and the bring-up test fails instead of
        // the kernel waiting for it.
        (
            "cpu-not-online",
            4,
            "run=test filter=secondary_cpus_are_online smp.fail-cpu=2 exit=semihosting",
            Some(ExitStatus::TestsFailed.code()),
            "CPUs: 3 of 4 online (cpu 2: PSCI INVALID_PARAMETERS)",
        ),
        // A CPU that arrives after the boot CPU gave up on it parks: it is reported and stays
        // out (it once came online on another CPU's stack).
        (
            "cpu-late",
            4,
            "run=test filter=secondary_cpus_are_online smp.late-cpu=2 exit=semihosting",
            Some(ExitStatus::TestsFailed.code()),
            "CPUs: 3 of 4 online (cpu 2: no response within the bring-up wait)",
        ),
        // Local TLB invalidation after a kernel mapping change: the other CPUs keep the old
        // translation, and the shootdown test must see it.
        (
            "smp-local-tlbi",
            4,
            "run=test filter=smp_tlb_shootdown smp.tlbi=local exit=semihosting",
            Some(ExitStatus::TestsFailed.code()),
            "test FAILED: smp_tlb_shootdown",
        ),
        // A probe hit while a re-entered hit is performed (a test-only switch makes the
        // performance call probed code): the panic names the three probes.
        (
            "reenter-twice",
            1,
            "run=sweep sweep.inject=reenter-twice exit=semihosting",
            Some(ExitStatus::Panic.code()),
            "panicked at kernel/src/probes/kprobe_hit.rs:*: kprobe re-entered twice: the probe at kernel::sweep::reentry::third+0x\
             *was hit while the probe at kernel::sweep::reentry::second+0x\
             *inside the handling of the probe at kernel::sweep::reentry::first+0x",
        ),
    ];
    for (name, smp, bootargs, expected_status, expected_line) in checks {
        let machine = Machine { smp, dtb: None, ..machine };
        // The panic report shows each stopped CPU's trace: CPU 1 waits in `panic_witness`, CPU 2
        // panics at the same time as CPU 0 in `panic_too` (and stops, as a second panic must).
        let sections: &[(&str, &str)] = if name == "panic-stops-cpus" {
            &[("cpu 1: stopped", "panic_witness"), ("cpu 2: stopped", "panic_too")]
        } else {
            &[]
        };
        failure_path(&machine, image, (name, bootargs, expected_status, expected_line), sections, tally)?;
    }
    Ok(())
}

/// Whether `text` starts with `pattern`'s first `*`-separated piece and holds the others after
/// it, in order.
fn matches_pieces(text: &str, pattern: &str) -> bool {
    let mut pieces = pattern.split('*');
    let Some(mut rest) = text.strip_prefix(pieces.next().unwrap_or("")) else { return false };
    pieces.all(|piece| rest.find(piece).map(|at| rest = &rest[at + piece.len()..]).is_some())
}

/// Whether a `fp #` line of the log's section that starts with `header` (up to the next line
/// that does not start with two spaces) names `function`.
fn names_under(log: &[crate::log::LogLine], header: &str, function: &str) -> bool {
    let Some(start) = log.iter().position(|line| line.text.starts_with(header)) else {
        return false;
    };
    log[start + 1..]
        .iter()
        .take_while(|line| line.text.starts_with("  "))
        .any(|line| line.text.trim_start().starts_with("fp #") && line.text.contains(function))
}

/// Build variant `mte`'s failure paths: without `mte=on` the kernel says MTE is missing and
/// exits non-zero; with it a use-after-free is a hardware tag check fault that
/// `kasan.fault=panic` turns into the end of the run.
pub fn mte_failure_paths(tally: &mut Tally) -> Result<(), Failure> {
    let image = build::kernel(Board::Virt, BuildVariant::Mte)?;
    let without = Machine {
        board: Board::Virt,
        cpu: CpuVariant::MaxImpdef,
        el: 1,
        gic: 2,
        icount: false,
        dtb: None,
        mte: false,
        smp: 1,
    };
    let missing = (
        "mte-missing",
        "run=test exit=semihosting",
        Some(ExitStatus::Unsupported.code()),
        "MTE: not available (mte=on missing?)",
    );
    failure_path(&without, &image, missing, &[], tally)?;
    let with = Machine { mte: true, ..without };
    let use_after_free = (
        "mte-use-after-free",
        "run=use-after-free kasan.fault=panic exit=semihosting",
        Some(ExitStatus::Panic.code()),
        "BUG: KASAN: slab-use-after-free",
    );
    failure_path(&with, &image, use_after_free, &[], tally)
}

/// One failure path: the run ends with the expected status (None: still running at the
/// timeout) after logging a line that starts with the expected text, and each (header,
/// function) of `sections` has a frame-pointer line naming the function under the header.
fn failure_path(
    machine: &Machine,
    image: &build::KernelImage,
    (name, bootargs, expected_status, expected_line): (&str, &str, Option<i32>, &str),
    sections: &[(&str, &str)],
    tally: &mut Tally,
) -> Result<(), Failure> {
    {
        let timeout = Duration::from_secs(if expected_status.is_none() { 3 } else { 60 });
        let result = qemu::run(machine, image, bootargs, Some(timeout), &mut |_| {})?;
        let logged = result.log.iter().any(|line| matches_pieces(&line.text, expected_line));
        let sentinel_ok = expected_status
            .is_none_or(|status| result.log.iter().any(|line| line.text == format!("tracelab: exit status {status}")));
        let missing: Vec<String> = sections
            .iter()
            .filter(|(header, function)| !names_under(&result.log, header, function))
            .map(|(header, function)| format!("`{function}` under `{header}`"))
            .collect();
        let (expecting, ended_as_expected) = match expected_status {
            None => (format!("a hang (no exit within {} s)", timeout.as_secs()), result.ending.timed_out()),
            Some(status) => (format!("exit status {status}"), result.status == Some(status)),
        };
        let ok = ended_as_expected && logged && sentinel_ok && missing.is_empty();
        println!(
            "failure path [{name}] expecting {expecting}: {}: {}, `{expected_line}` {}{}",
            if ok { "ok" } else { "FAILED" },
            result.ending,
            if logged { "logged" } else { "missing" },
            if missing.is_empty() { String::new() } else { format!(", missing {}", missing.join(", ")) }
        );
        if ok {
            tally.passed += 1;
        } else {
            tally.fail(format!("failure path [{name}]"));
            for line in &result.log {
                println!("  {line}");
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_function_is_named_under_its_cpu_only() {
        let log: Vec<crate::log::LogLine> = [
            "cpu 1: stopped at 0xffffff804009f650",
            "  fp #0 kernel::panic_witness+0x28/0x30 0xffffff804009f650",
            "  fp: 1 frames, end of task",
            "cpu 2: stopped at 0xffffff80400ab048",
            "  scs #0 kernel::panic_too+0x90/0x90 0xffffff804009fb78",
            "  fp #0 kernel::task::idle_loop+0x40/0x44 0xffffff80400ab048",
            "tracelab: exit status 3",
            "  fp #0 kernel::panic_too+0x90/0x90 0xffffff804009fb78",
        ]
        .into_iter()
        .map(crate::log::LogLine::plain)
        .collect();
        assert!(names_under(&log, "cpu 1:", "panic_witness"));
        assert!(names_under(&log, "cpu 1: stopped", "panic_witness"));
        assert!(!names_under(&log, "cpu 2:", "panic_witness"));
        // Only frame-pointer lines of the section count, not a later section's lines.
        assert!(!names_under(&log, "cpu 2:", "panic_too"));
        assert!(!names_under(&log, "cpu 3:", "idle_loop"));
    }
}
