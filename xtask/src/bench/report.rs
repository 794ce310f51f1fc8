//! report.md: what the modes measure (with baseline figures), then one table per suite, CPU
//! variant, build variant and mode.

use super::Mode;
use super::results::Row;
use crate::qemu::CpuVariant;
use std::fmt::Write;

fn number(value: f64) -> String {
    if value.abs() >= 100.0 {
        format!("{value:.0}")
    } else {
        let text = format!("{value:.3}");
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

fn find<'a>(rows: &'a [Row], suite: &str, case: &str, cpu: CpuVariant, mode: Mode) -> Option<&'a Row> {
    rows.iter().find(|row| row.suite == suite && row.case == case && row.cpu == cpu && row.mode == mode)
}

/// The paragraph that says what each mode measures, with the baseline's PAC-signed call.
fn modes_explained(rows: &[Row]) -> String {
    let mut text = String::from("## What the numbers mean\n\n");
    text.push_str(
        "A per-op figure is (the measured loop - the same loop without the mechanism) / N, so the \
         loop's own cost cancels; the `baseline` suite's `loop` row shows that loop cost. Every \
         measured window runs with interrupts masked. These are QEMU TCG figures, never hardware \
         figures.\n\n",
    );
    let pac = |mode| {
        CpuVariant::ALL
            .iter()
            .filter_map(|&cpu| find(rows, "baseline", "call-pac", cpu, mode).map(|row| (cpu, row)))
            .collect::<Vec<_>>()
    };
    let icount = pac(Mode::Icount);
    text.push_str(
        "- **icount** (`-icount shift=0,sleep=off`): the PMU cycle counter counts retired \
         instructions, one per instruction whatever it is, so figures are instruction counts: \
         deterministic (a second run gives the same numbers) and identical for every PAuth \
         algorithm. Use them for ratios and for what a mechanism executes.",
    );
    if !icount.is_empty() {
        let list: Vec<_> =
            icount.iter().map(|(cpu, row)| format!("{} under `{}`", number(row.median), cpu.name())).collect();
        let _ = write!(text, " A PAC-signed call (bl, paciasp, autiasp, ret) costs {} instructions.", list.join(", "));
    }
    text.push('\n');
    let wall = pac(Mode::Wall);
    text.push_str(
        "- **wall** (no icount): the counters run on virtual nanoseconds that track host time, so \
         figures are what the emulation costs on this host, medians of N reps with min and max, \
         noisy (+-30% between runs). This is where QEMU's software PAC algorithms show: QARMA5 \
         costs hundreds of ns per PAC operation under TCG.",
    );
    if !wall.is_empty() {
        let list: Vec<_> =
            wall.iter().map(|(cpu, row)| format!("{} ns under `{}`", number(row.median), cpu.name())).collect();
        let _ = write!(text, " A PAC-signed call costs {}", list.join(", "));
        let off = find(rows, "baseline", "call-pac", CpuVariant::MaxNoPauth, Mode::Wall);
        let qarma5 = find(rows, "baseline", "call-pac", CpuVariant::MaxQarma5, Mode::Wall);
        if let (Some(off), Some(qarma5)) = (off, qarma5)
            && off.median > 0.0
        {
            let _ = write!(
                text,
                ": QARMA5 is {:.0}x the cost of the same call with PAuth off, though both execute the same instructions",
                qarma5.median / off.median
            );
        }
        text.push('.');
    }
    text.push_str(
        "\n- **hardware** (`--board rpi4 --serial PATH`): a real Raspberry Pi 4 (Cortex-A72), the PMU \
         cycle counter in CPU cycles. The only mode whose figures are hardware figures.\n\n",
    );
    text
}

pub fn render(commit: &str, qemu: &str, board: &str, rows: &[Row]) -> String {
    let mut text = format!("# tracelab benchmark report\n\ncommit `{commit}`, QEMU {qemu}, board `{board}`.\n\n");
    text.push_str(&modes_explained(rows));
    let mut suites: Vec<&str> = Vec::new();
    for row in rows {
        if !suites.contains(&row.suite.as_str()) {
            suites.push(&row.suite);
        }
    }
    for suite in suites {
        let _ = writeln!(text, "## {suite}\n");
        let mut tables: Vec<(CpuVariant, &str, Mode)> = Vec::new();
        for row in rows.iter().filter(|row| row.suite == suite) {
            let key = (row.cpu, row.variant.name(), row.mode);
            if !tables.contains(&key) {
                tables.push(key);
            }
        }
        for (cpu, variant, mode) in tables {
            let _ = writeln!(text, "### `{}`, variant `{variant}`, mode `{}`\n", cpu.name(), mode.name());
            text.push_str(
                "| case | params | metric | median | min | max | n | unit |\n|---|---|---|---:|---:|---:|---:|---|\n",
            );
            for row in rows
                .iter()
                .filter(|row| row.suite == suite && row.cpu == cpu && row.variant.name() == variant && row.mode == mode)
            {
                let _ = writeln!(
                    text,
                    "| {} | {} | {} | {} | {} | {} | {} | {} |",
                    row.case,
                    row.params_text(),
                    row.metric,
                    number(row.median),
                    number(row.min),
                    number(row.max),
                    row.n,
                    row.unit
                );
            }
            text.push('\n');
        }
    }
    text
}
