//! report.md and the docs/results pages: what the modes measure, one table per suite, metric and
//! build variant with the CPU variants as columns (median and min..max, to the digits the mode
//! supports), what each metric means, and the fidelity check (pairs of cases whose order flips
//! between CPU variants or modes). Callers may add columns of their own (`ExtraColumn`).

use super::Mode;
use super::results::{Provenance, Row};
use crate::build::BuildVariant;
use crate::qemu::CpuVariant;
use std::cmp::Ordering;
use std::fmt::Write;

/// A figure as tables print it: whole numbers from 100 up, three decimals at most below.
pub fn number(value: f64) -> String {
    if value.abs() >= 100.0 {
        format!("{value:.0}")
    } else {
        let text = format!("{value:.3}");
        let text = text.trim_end_matches('0').trim_end_matches('.');
        if text == "-0" { "0".into() } else { text.to_string() }
    }
}

/// A difference: `+N` for a rise, `-N` for a drop, `0` for none.
pub fn signed(value: f64) -> String {
    let text = number(value);
    if value > 0.0 && text != "0" { format!("+{text}") } else { text }
}

/// `value` rounded to a multiple of `10^place` and printed with no digit past it (`place` 1: tens,
/// -1: one decimal).
fn to_place(value: f64, place: i32) -> String {
    let step = 10f64.powi(place);
    let rounded = (value / step).round() * step;
    let text = if place >= 0 { format!("{rounded:.0}") } else { format!("{rounded:.*}", (-place) as usize) };
    if text.trim_start_matches('-').chars().all(|c| c == '0' || c == '.') { "0".into() } else { text }
}

/// An instruction count: exact, so whole instructions, or one decimal where a per-op figure's
/// fraction is real (a loop's count over N operations).
pub fn instructions(value: f64) -> String {
    let tenths = (value * 10.0).round();
    if tenths % 10.0 == 0.0 { to_place(value, 0) } else { to_place(value, -1) }
}

/// The last digit a noisy figure can show: that of its spread (max - min), a second one when the
/// spread starts with 1 or 2 (a spread of 12 says the units digit still means something); with
/// no spread measured (one rep), three significant digits. Never finer than 0.001.
pub fn noisy_place(median: f64, min: f64, max: f64) -> i32 {
    let spread = max - min;
    let place = if spread > 0.0 {
        let place = spread.log10().floor() as i32;
        if spread / 10f64.powi(place) < 3.0 { place - 1 } else { place }
    } else if median != 0.0 {
        median.abs().log10().floor() as i32 - 2
    } else {
        0
    };
    place.max(-3)
}

/// A figure of `row` to the digits its mode supports: icount instruction counts exactly (see
/// `instructions`), noisy wall and hardware figures to the place their spread allows, counts of
/// other units (records, bytes, percent, rates) as `number`.
pub fn figure(row: &Row, value: f64) -> String {
    match row.mode {
        Mode::Icount if row.unit == "insn" => instructions(value),
        Mode::Wall | Mode::Hardware if row.min < row.max || is_timed(&row.unit) => {
            to_place(value, noisy_place(row.median, row.min, row.max))
        }
        _ => number(value),
    }
}

/// Units that time something (and so vary between reps), as opposed to counts.
fn is_timed(unit: &str) -> bool {
    matches!(unit, "ns" | "cycles" | "insn" | "hits_per_s")
}

/// A table cell: the median, and `(min..max)` when the reps differ.
pub fn cell(row: &Row) -> String {
    if row.min < row.max {
        format!("{} ({}..{})", figure(row, row.median), figure(row, row.min), figure(row, row.max))
    } else {
        figure(row, row.median)
    }
}

/// One table row as an extra column sees it: a case and its params under one metric of one
/// build variant (the measured columns are its modes and CPU variants).
#[derive(Clone, Copy)]

pub struct TableRow<'a> {
    pub suite: &'a str,
    pub case: &'a str,
    pub params: &'a [(String, String)],
    pub metric: &'a str,
    pub variant: BuildVariant,
}

/// Where an extra column stands in a table.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum ColumnKind {
    /// Another system's figure for the same row (Linux's, measured its own way): right after the
    /// measured columns, so the two read side by side.
    Peer,
    /// A further figure of the same row (an event count per operation, say): after the peers.
    Metric,
}

/// An extra column's text for a table row, or None where it knows nothing of the row.
pub type ExtraCell<'a> = Box<dyn Fn(&TableRow) -> Option<String> + 'a>;

/// A column a caller adds beside the measured ones. `cell` gives the text for a table row, or
/// `None` where the column knows nothing of it (printed `-`); a table shows the column only when
/// it has a cell for one of its rows, so a column about one suite leaves the others alone.
/// `render_with` and `pages_with` take a list of them; `render` and `pages` take none.
pub struct ExtraColumn<'a> {
    pub header: String,
    pub kind: ColumnKind,
    pub cell: ExtraCell<'a>,
}

/// What a metric of a suite means, and the section of docs/reference/bench.md that defines it.
struct Meaning {
    suite: &'static str,
    metric: &'static str,
    text: &'static str,
}

const MEANINGS: &[Meaning] = &[
    Meaning {
        suite: "baseline",
        metric: "per_op",
        text: "one operation: (the measured loop - the same loop without it) / N; `loop` is the empty loop's own cost per iteration",
    },
    Meaning {
        suite: "stacktrace",
        metric: "per_trace",
        text: "one stack trace of `depth` frames: the walk (and, for `+depot`, storing it in the stack depot)",
    },
    Meaning {
        suite: "depot",
        metric: "per_op",
        text: "one depot operation on a `depth`-frame stack: `insert-miss` stores a new stack, `lookup-hit` finds a stored one",
    },
    Meaning {
        suite: "depot",
        metric: "records",
        text: "stacks the depot holds after `distinct` distinct stacks were inserted and each looked up 100 times",
    },
    Meaning { suite: "depot", metric: "bytes", text: "memory those records take" },
    Meaning {
        suite: "depot",
        metric: "hash_collisions",
        text: "records whose hash equals another record's (the hash miss count)",
    },
    Meaning { suite: "depot", metric: "hit_rate", text: "percent of lookups that found their stack" },
    Meaning {
        suite: "kasan-boot",
        metric: "total",
        text: "the whole allocation-heavy workload on the sanitizer heap with the case's way of collecting stacks",
    },
    Meaning { suite: "kasan-boot", metric: "overhead_pct", text: "`total` relative to `no-stacks`, in percent" },
    Meaning {
        suite: "kasan-boot",
        metric: "allocator_pct",
        text: "the allocator's share of the `no-stacks` total (alloc and free calls timed one by one)",
    },
    Meaning {
        suite: "kasan-boot",
        metric: "walk_per_collection",
        text: "on `fp` and `scs`: (X-no-depot - no-stacks) / collections, the walk's share of one collection",
    },
    Meaning {
        suite: "kasan-boot",
        metric: "depot_per_collection",
        text: "on `fp` and `scs`: (X - X-no-depot) / collections, the depot's share of one collection",
    },
    Meaning {
        suite: "kasan-boot",
        metric: "alloc_per_call",
        text: "on `no-stacks`: one allocation call, timed one by one (counter reads included)",
    },
    Meaning {
        suite: "kasan-boot",
        metric: "free_per_call",
        text: "on `no-stacks`: one free call, timed one by one (counter reads included)",
    },
    Meaning { suite: "kasan-boot", metric: "records", text: "stacks in the depot after the workload" },
    Meaning { suite: "kasan-boot", metric: "bytes", text: "memory those records take" },
    Meaning { suite: "kasan-boot", metric: "hash_collisions", text: "records whose hash equals another record's" },
    Meaning {
        suite: "probes",
        metric: "per_hit",
        text: "one probe hit with the method: the probed call minus the same call unprobed",
    },
    Meaning {
        suite: "probes",
        metric: "hits_per_s",
        text: "probed calls per second of the clock (under icount a synthetic clock of one instruction per ns, not a speed: charted in wall and hardware modes only)",
    },
    Meaning { suite: "probes", metric: "per_call", text: "one unprobed call of the target, for reference" },
    Meaning {
        suite: "ftrace",
        metric: "per_call",
        text: "one call of a trivial traced function with `relevant` tracers on it and `irrelevant` tracers elsewhere",
    },
    Meaning { suite: "ftrace", metric: "overhead", text: "`per_call` minus the row with no tracer (0/0)" },
    Meaning {
        suite: "cpus",
        metric: "per_op",
        text: "system-wide: the window of `cpus` CPUs running the loop at once, minus the same window with an empty loop, over all CPUs' operations",
    },
    Meaning {
        suite: "cpus",
        metric: "per_call",
        text: "system-wide, as `per_op`: one call of a traced function (call-ops) with the `tracer` counting it",
    },
    Meaning { suite: "cpus", metric: "overhead", text: "`per_call` minus the `tracer=none` row of the same `cpus`" },
    Meaning {
        suite: "cpus",
        metric: "per_hit",
        text: "system-wide: the probed window minus the same window unprobed, over all CPUs' hits",
    },
    Meaning {
        suite: "cpus",
        metric: "cas_failures",
        text: "compare-and-swaps that lost a race and retried (the depot's `put`, the shared tracer's counter), per operation",
    },
    Meaning {
        suite: "cpus",
        metric: "lock_spins",
        text: "spins waiting for a spin lock (depot, heap, IrqSpinLock), per operation",
    },
    Meaning {
        suite: "cpus",
        metric: "gate_waits",
        text: "depot reclaim passes that found readers still inside the read gate (freed records held back), per operation",
    },
    Meaning {
        suite: "cpus-heap",
        metric: "per_op",
        text: "system-wide: one allocation and free with stack collection, the window of `cpus` CPUs minus an empty loop's",
    },
    Meaning { suite: "cpus-heap", metric: "cas_failures", text: "as in `cpus` (the depot behind stack collection)" },
    Meaning { suite: "cpus-heap", metric: "lock_spins", text: "spins waiting for the heap's lock, per operation" },
    Meaning { suite: "cpus-heap", metric: "gate_waits", text: "as in `cpus`" },
];

fn meaning(suite: &str, metric: &str) -> &'static str {
    MEANINGS
        .iter()
        .find(|meaning| meaning.suite == suite && meaning.metric == metric)
        .map_or("(not described in the bench contract yet)", |meaning| meaning.text)
}

/// Items in first-seen order.
pub(super) fn distinct<T: PartialEq>(items: impl IntoIterator<Item = T>) -> Vec<T> {
    let mut seen = Vec::new();
    for item in items {
        if !seen.contains(&item) {
            seen.push(item);
        }
    }
    seen
}

/// Beside every table of build variant `mte` (KASAN HW_TAGS on QEMU's emulated MTE).
const MTE_NOTE: &str = " Build variant `mte`: the hardware's tag check costs no instruction, so icount rows count only \
the tagging instructions (IRG, STG, ST2G, LDG); wall figures are emulated MTE (QEMU TCG), which performs nothing like \
MTE hardware.";

fn mode_unit(mode: Mode, unit: &str) -> String {
    match mode {
        Mode::Icount if unit == "insn" => "icount insn".into(),
        Mode::Wall if unit == "ns" => "wall ns".into(),
        Mode::Hardware if unit == "cycles" => "cycles".into(),
        _ => format!("{} {unit}", mode.name()),
    }
}

/// A table's column of figures: its header, mode and the CPU variants it shows (several when
/// their icount figures agree on every row; the first one's rows are printed).
pub(super) struct MeasuredColumn {
    pub header: String,
    pub mode: Mode,
    pub cpus: Vec<CpuVariant>,
}

/// The measured columns of one table: a column per mode and CPU variant, icount columns of CPU
/// variants that agree on every row merged into one.
pub(super) fn measured_columns(group: &[&Row], labels: &[(&str, &Vec<(String, String)>)]) -> Vec<MeasuredColumn> {
    let mut columns = Vec::new();
    for mode in Mode::ALL {
        let in_mode: Vec<&Row> = group.iter().copied().filter(|row| row.mode == mode).collect();
        let Some(first) = in_mode.first() else { continue };
        let unit = mode_unit(mode, &first.unit);
        let cpus: Vec<CpuVariant> =
            CpuVariant::ALL.into_iter().filter(|cpu| in_mode.iter().any(|row| row.cpu == *cpu)).collect();
        let agree = labels.iter().all(|(case, params)| {
            let medians = distinct(
                in_mode
                    .iter()
                    .filter(|row| row.case == *case && row.params == **params)
                    .map(|row| row.median.to_bits()),
            );
            medians.len() <= 1
        });
        if mode == Mode::Icount && cpus.len() > 1 && agree {
            columns.push(MeasuredColumn { header: format!("{unit} (all {} CPU variants)", cpus.len()), mode, cpus });
        } else {
            for cpu in cpus {
                columns.push(MeasuredColumn { header: format!("{unit} `{}`", cpu.name()), mode, cpus: vec![cpu] });
            }
        }
    }
    columns
}

/// The sentence under a table's heading that says what its cells hold.
fn cells_explained(group: &[&Row]) -> String {
    let noisy = group.iter().any(|row| row.min < row.max);
    let icount = group.iter().any(|row| row.mode == Mode::Icount);
    let mut parts = Vec::new();
    if icount {
        parts.push("icount cells are exact (one deterministic rep: min = max)");
    }
    if noisy {
        parts.push("other cells are the median (min..max of the reps), to the digits the spread supports");
    } else if group.iter().any(|row| row.mode != Mode::Icount) {
        parts.push("other cells are single reps, to three significant digits");
    }
    let mut text = parts.join("; ");
    if !text.is_empty() {
        text = format!(" {}.", upper_first(&text));
    }
    text
}

/// One table per (build variant, metric) of a suite: a row per case and params, a column per
/// mode and CPU variant (icount columns of CPU variants that agree on every row become one),
/// then the caller's extra columns that know one of its rows (peers first).
fn suite_tables<'a>(rows: &[&'a Row], link: Option<&str>, extras: &[ExtraColumn]) -> String {
    let mut text = String::new();
    let Some(suite) = rows.first().map(|row| row.suite.as_str()) else { return text };
    for (variant, metric) in distinct(rows.iter().map(|row| (row.variant, row.metric.as_str()))) {
        let group: Vec<&'a Row> =
            rows.iter().copied().filter(|row| row.variant == variant && row.metric == metric).collect();
        let _ = writeln!(text, "### `{metric}`, build variant `{}`\n", variant.name());
        let _ = write!(text, "{}.", upper_first(meaning(suite, metric)));
        if let Some(link) = link {
            let _ = write!(text, " ([contract]({link}))");
        }
        if variant == BuildVariant::Mte {
            text.push_str(MTE_NOTE);
        }
        text.push_str(&cells_explained(&group));
        text.push_str("\n\n");
        let keys = distinct(group.iter().flat_map(|row| row.params.iter().map(|(key, _)| key.as_str())));
        // A case's rows together (fp 4, 8, 16, then scs 4, 8, 16), whatever order the kernel
        // printed them in.
        let cases = distinct(group.iter().map(|row| row.case.as_str()));
        let mut labels = distinct(group.iter().map(|row| (row.case.as_str(), &row.params)));
        labels.sort_by_key(|(case, _)| cases.iter().position(|known| known == case));
        let columns = measured_columns(&group, &labels);
        let table_row = |&(case, params): &(&'a str, &'a Vec<(String, String)>)| TableRow {
            suite,
            case,
            params: params.as_slice(),
            metric,
            variant,
        };
        let mut shown: Vec<&ExtraColumn> = Vec::new();
        for kind in [ColumnKind::Peer, ColumnKind::Metric] {
            shown.extend(extras.iter().filter(|extra| {
                extra.kind == kind && labels.iter().any(|label| (extra.cell)(&table_row(label)).is_some())
            }));
        }
        text.push_str("| case |");
        for key in &keys {
            let _ = write!(text, " {key} |");
        }
        for column in &columns {
            let _ = write!(text, " {} |", column.header);
        }
        for extra in &shown {
            let _ = write!(text, " {} |", extra.header);
        }
        text.push_str("\n|---|");
        text.push_str(&"---:|".repeat(keys.len() + columns.len() + shown.len()));
        text.push('\n');
        for label in &labels {
            let (case, params) = label;
            let _ = write!(text, "| {case} |");
            for key in &keys {
                let value = params.iter().find(|(name, _)| name == key).map_or("-", |(_, value)| value.as_str());
                let _ = write!(text, " {value} |");
            }
            for column in &columns {
                let value = group
                    .iter()
                    .find(|row| {
                        row.case == *case
                            && row.params == **params
                            && row.mode == column.mode
                            && row.cpu == column.cpus[0]
                    })
                    .map_or("-".into(), |row| cell(row));
                let _ = write!(text, " {value} |");
            }
            for extra in &shown {
                let value = (extra.cell)(&table_row(label)).unwrap_or_else(|| "-".into());
                let _ = write!(text, " {value} |");
            }
            text.push('\n');
        }
        text.push('\n');
    }
    text
}

fn upper_first(text: &str) -> String {
    let mut chars = text.chars();
    chars.next().map(|first| first.to_uppercase().chain(chars).collect()).unwrap_or_default()
}

/// How two rows of one configuration order, when their min..max ranges do not overlap.
fn order(a: &Row, b: &Row) -> Option<Ordering> {
    if a.max < b.min {
        Some(Ordering::Less)
    } else if a.min > b.max {
        Some(Ordering::Greater)
    } else {
        None
    }
}

fn configuration(row: &Row) -> String {
    format!("`{}` {}", row.cpu.name(), row.mode.name())
}

/// Every pair of cases (same suite, metric and build variant) that one configuration (CPU
/// variant and mode) orders one way and another the other way, both with non-overlapping
/// min..max ranges: where an emulated figure would mislead about hardware.
pub fn fidelity_flips(rows: &[&Row]) -> Vec<String> {
    let mut flips = Vec::new();
    for (suite, variant, metric) in
        distinct(rows.iter().map(|row| (row.suite.as_str(), row.variant, row.metric.as_str())))
    {
        let group: Vec<&Row> = rows
            .iter()
            .copied()
            .filter(|row| row.suite == suite && row.variant == variant && row.metric == metric)
            .collect();
        let labels = distinct(group.iter().map(|row| (row.case.as_str(), &row.params)));
        let configurations = distinct(group.iter().map(|row| (row.cpu, row.mode)));
        let find = |label: &(&str, &Vec<(String, String)>), (cpu, mode): (CpuVariant, Mode)| {
            group
                .iter()
                .copied()
                .find(|row| row.case == label.0 && row.params == *label.1 && row.cpu == cpu && row.mode == mode)
        };
        for (index, a) in labels.iter().enumerate() {
            for b in &labels[index + 1..] {
                let mut less: Option<(&Row, &Row)> = None;
                let mut greater: Option<(&Row, &Row)> = None;
                for &configuration in &configurations {
                    let (Some(row_a), Some(row_b)) = (find(a, configuration), find(b, configuration)) else { continue };
                    match order(row_a, row_b) {
                        Some(Ordering::Less) => less = less.or(Some((row_a, row_b))),
                        Some(Ordering::Greater) => greater = greater.or(Some((row_a, row_b))),
                        _ => {}
                    }
                }
                if let (Some((a_less, b_less)), Some((a_more, b_more))) = (less, greater) {
                    let name = |row: &Row| {
                        if row.params.is_empty() {
                            row.case.clone()
                        } else {
                            format!("{} {}", row.case, row.params_text())
                        }
                    };
                    flips.push(format!(
                        "`{suite}` `{metric}`: `{}` < `{}` under {} ({} vs {} {}), but > under {} ({} vs {} {})",
                        name(a_less),
                        name(b_less),
                        configuration(a_less),
                        range(a_less),
                        range(b_less),
                        a_less.unit,
                        configuration(a_more),
                        range(a_more),
                        range(b_more),
                        a_more.unit
                    ));
                }
            }
        }
    }
    flips
}

fn range(row: &Row) -> String {
    if row.min == row.max {
        figure(row, row.median)
    } else {
        format!("{}..{}", figure(row, row.min), figure(row, row.max))
    }
}

fn fidelity_section(rows: &[&Row], heading: &str) -> String {
    let mut text = format!(
        "{heading} Fidelity\n\nPairs of cases whose order flips between CPU variants or between icount and wall, \
         each order backed by non-overlapping min..max ranges. Such a pair means an emulated figure ranks two \
         mechanisms differently from another way of measuring them (QARMA5 emulation once made unwinding look ten \
         times dearer than the shadow call stack).\n\n"
    );
    let configurations = distinct(rows.iter().map(|row| (row.cpu, row.mode)));
    let flips = fidelity_flips(rows);
    if configurations.len() < 2 {
        text.push_str("Only one configuration (CPU variant and mode) was measured: nothing to compare.\n\n");
    } else if flips.is_empty() {
        let _ = writeln!(text, "None among {} configurations.\n", configurations.len());
    } else {
        for flip in flips {
            let _ = writeln!(text, "- {flip}");
        }
        text.push('\n');
    }
    text
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
        let list: Vec<_> = icount
            .iter()
            .map(|(cpu, row)| format!("{} instructions under `{}`", figure(row, row.median), cpu.name()))
            .collect();
        let _ = write!(text, " A PAC-signed call (bl, paciasp, autiasp, ret) costs {}.", list.join(", "));
    }
    text.push('\n');
    let wall = pac(Mode::Wall);
    text.push_str(
        "- **wall** (no icount): the counters run on virtual nanoseconds that track host time, so \
         figures are what the emulation costs on this host, medians of N reps with min and max, \
         noisy (+-30% between runs), so a cell shows only the digits its min..max spread supports. This is where QEMU's software PAC algorithms show: QARMA5 \
         costs hundreds of ns per PAC operation under TCG.",
    );
    if !wall.is_empty() {
        let list: Vec<_> = wall.iter().map(|(cpu, row)| format!("{} ns under `{}`", cell(row), cpu.name())).collect();
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

fn suites_of(rows: &[Row]) -> Vec<&str> {
    distinct(rows.iter().map(|row| row.suite.as_str()))
}

fn provenance_lines(provenance: &Provenance, rows: &[&Row]) -> String {
    let mut text = String::new();
    let describe = provenance.describe.as_deref().unwrap_or(&provenance.commit);
    let _ = writeln!(text, "- commit: `{describe}`");
    if let Some(date) = &provenance.date {
        let _ = writeln!(text, "- date: {date} UTC");
    }
    let _ = writeln!(text, "- QEMU {}, board `{}`", provenance.qemu, provenance.board);
    let cpus = distinct(rows.iter().map(|row| format!("`{}`", row.cpu.name())));
    let _ = writeln!(text, "- CPU variants: {}", cpus.join(", "));
    let variants = distinct(rows.iter().map(|row| format!("`{}`", row.variant.name())));
    let _ = writeln!(text, "- build variant: {}", variants.join(", "));
    let modes = distinct(rows.iter().map(|row| row.mode));
    let reps = provenance.reps.map(|reps| format!(" of {reps} reps")).unwrap_or_default();
    let modes: Vec<String> = modes
        .iter()
        .map(|mode| match mode {
            Mode::Icount => "icount (instruction counts, deterministic, one rep)".to_string(),
            Mode::Wall => format!("wall (virtual ns of TCG emulation, medians{reps})"),
            Mode::Hardware => format!("hardware (PMU cycles, medians{reps})"),
        })
        .collect();
    let _ = writeln!(text, "- mode: {}", modes.join("; "));
    if let Some(host) = &provenance.host_cpu {
        let _ = writeln!(text, "- host CPU: {host}");
    }
    if let Some(rustc) = &provenance.rustc {
        let _ = writeln!(text, "- {rustc}");
    }
    text
}

/// The chart's file name beside report.md and the pages (`chart::draw` writes it).
pub fn chart_file(suite: &str) -> String {
    format!("{suite}.svg")
}

/// How report.md and a page show a suite's chart: a relative image link to the SVG beside them.
fn chart_link(suite: &str) -> String {
    format!("![`{suite}` chart: every panel of the tables below]({})\n\n", chart_file(suite))
}

/// report.md: provenance, what the modes measure, then per suite its chart, tables and fidelity.
pub fn render(provenance: &Provenance, rows: &[Row]) -> String {
    render_with(provenance, rows, &[])
}

/// `render` with the caller's extra columns in the tables.
pub fn render_with(provenance: &Provenance, rows: &[Row], extras: &[ExtraColumn]) -> String {
    let all: Vec<&Row> = rows.iter().collect();
    let mut text = format!("# tracelab benchmark report\n\n{}\n", provenance_lines(provenance, &all));
    text.push_str(&modes_explained(rows));
    for suite in suites_of(rows) {
        let in_suite: Vec<&Row> = rows.iter().filter(|row| row.suite == suite).collect();
        let _ = writeln!(text, "## {suite}\n");
        text.push_str(&chart_link(suite));
        text.push_str(&suite_tables(&in_suite, None, extras));
    }
    text.push_str(&fidelity_section(&all, "##"));
    text
}

/// The docs/results pages: `(suite, markdown)`, one per suite, linking each metric to its
/// definition in docs/reference/bench.md.
pub fn pages(provenance: &Provenance, rows: &[Row]) -> Vec<(String, String)> {
    pages_with(provenance, rows, &[])
}

/// `pages` with the caller's extra columns in the tables.
pub fn pages_with(provenance: &Provenance, rows: &[Row], extras: &[ExtraColumn]) -> Vec<(String, String)> {
    suites_of(rows)
        .into_iter()
        .map(|suite| {
            let in_suite: Vec<&Row> = rows.iter().filter(|row| row.suite == suite).collect();
            let mut text = format!(
                "# Bench results: `{suite}`\n\n\
                 Generated by `cargo xtask bench report` from one results.json: do not edit by hand, \
                 regenerate (see [the bench contract](../reference/bench.md#generated-results)).\n\n"
            );
            text.push_str(&provenance_lines(provenance, &in_suite));
            if in_suite.iter().all(|row| row.mode == Mode::Icount) {
                text.push_str(
                    "\nThis run is icount only: instruction counts, which are the same for every PAuth \
                     algorithm. What TCG emulation costs in time (wall mode) is not in it: \
                     `cargo xtask bench SUITE --mode wall` measures that.\n",
                );
            }
            text.push_str("\n## Metrics\n\n");
            for metric in distinct(in_suite.iter().map(|row| row.metric.as_str())) {
                let units = distinct(
                    in_suite.iter().filter(|row| row.metric == metric).map(|row| mode_unit(row.mode, &row.unit)),
                );
                let _ = writeln!(
                    text,
                    "- `{metric}` ({}): {} ([contract](../reference/bench.md#{}))",
                    units.join(", "),
                    meaning(suite, metric),
                    suite
                );
            }
            text.push_str("\n## Chart\n\n");
            text.push_str(&chart_link(suite));
            text.push_str("## Tables\n\n");
            text.push_str(&suite_tables(&in_suite, Some(&format!("../reference/bench.md#{suite}")), extras));
            text.push_str(&fidelity_section(&in_suite, "##"));
            (suite.to_string(), text)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::results::tests::provenance;
    use crate::bench::results::{Row, Sample};
    use crate::build::BuildVariant;

    fn rows(lines: &[(&str, CpuVariant, Mode, &[f64])]) -> Vec<Row> {
        let samples: Vec<Sample> = lines
            .iter()
            .flat_map(|(line, cpu, mode, values)| {
                values.iter().map(move |value| {
                    Sample::parse(&format!("{line} {value}"), *cpu, BuildVariant::Prod, *mode).expect("valid row")
                })
            })
            .collect();
        Row::aggregate(&samples)
    }

    const OFF: CpuVariant = CpuVariant::MaxNoPauth;
    const QARMA5: CpuVariant = CpuVariant::MaxQarma5;

    #[test]
    fn cpu_variants_are_columns_and_agreeing_icount_columns_merge() {
        let rows = rows(&[
            ("stacktrace fp depth=4 per_trace insn", OFF, Mode::Icount, &[843.0]),
            ("stacktrace fp depth=4 per_trace insn", QARMA5, Mode::Icount, &[843.0]),
            ("stacktrace fp depth=4 per_trace ns", OFF, Mode::Wall, &[632.0]),
            ("stacktrace fp depth=4 per_trace ns", QARMA5, Mode::Wall, &[5049.0]),
        ]);
        let text = render(&provenance(), &rows);
        assert!(
            text.contains(
                "| case | depth | icount insn (all 2 CPU variants) | wall ns `max,pauth-qarma5=on` | wall ns `max,pauth=off` |"
            ),
            "{text}"
        );
        // Wall figures of one rep: three significant digits.
        assert!(text.contains("| fp | 4 | 843 | 5050 | 632 |"), "{text}");
    }

    #[test]
    fn figures_show_the_digits_their_mode_supports() {
        // icount: whole instructions, one decimal where the fraction is real.
        assert_eq!(instructions(843.0), "843");
        assert_eq!(instructions(2.001), "2");
        assert_eq!(instructions(197.152), "197.2");
        assert_eq!(instructions(0.04), "0");
        // Noisy figures: the spread's leading digit, a second one when it starts with 1 or 2.
        assert_eq!(noisy_place(1323.4, 1290.0, 1340.0), 1);
        assert_eq!(noisy_place(1323.4, 1315.0, 1327.0), 0);
        assert_eq!(noisy_place(5.43, 5.1, 5.6), -1);
        assert_eq!(noisy_place(5049.0, 5049.0, 5049.0), 1);
        assert_eq!(noisy_place(0.0012, 0.0011, 0.0012), -3);
        let wall =
            rows(&[("probes kprobe-push method=simulate per_hit ns", OFF, Mode::Wall, &[1301.7, 1323.4, 1338.2])]);
        assert_eq!(cell(&wall[0]), "1320 (1300..1340)");
        let tight =
            rows(&[("probes kprobe-push method=simulate per_hit ns", OFF, Mode::Wall, &[1315.2, 1323.4, 1327.9])]);
        assert_eq!(cell(&tight[0]), "1323 (1315..1328)");
        let small =
            rows(&[("ftrace call-ops relevant=1,irrelevant=0 overhead ns", OFF, Mode::Wall, &[2.04, 2.51, 3.3])]);
        assert_eq!(cell(&small[0]), "2.5 (2.0..3.3)");
        let exact = rows(&[("stacktrace fp+depot depth=4 per_trace insn", OFF, Mode::Icount, &[197.152])]);
        assert_eq!(cell(&exact[0]), "197.2");
        // Counts keep their figures.
        let rate = rows(&[("depot saturation distinct=1 hit_rate percent", OFF, Mode::Icount, &[99.01])]);
        assert_eq!(cell(&rate[0]), "99.01");
    }

    #[test]
    fn every_table_shows_the_spread_and_says_so() {
        let rows = rows(&[
            ("ftrace call-ops relevant=1,irrelevant=0 overhead insn", OFF, Mode::Icount, &[3.0]),
            ("ftrace call-ops relevant=1,irrelevant=0 overhead ns", OFF, Mode::Wall, &[2.04, 2.51, 3.3]),
        ]);
        let text = render(&provenance(), &rows);
        assert!(text.contains("| call-ops | 1 | 0 | 3 | 2.5 (2.0..3.3) |"), "{text}");
        assert!(
            text.contains("Icount cells are exact (one deterministic rep: min = max); other cells are the median (min..max of the reps)"),
            "{text}"
        );
    }

    #[test]
    fn report_and_pages_embed_their_charts() {
        let rows = rows(&[("baseline call - per_op insn", OFF, Mode::Icount, &[2.0])]);
        let text = render(&provenance(), &rows);
        assert!(
            text.contains("## baseline\n\n![`baseline` chart: every panel of the tables below](baseline.svg)\n"),
            "{text}"
        );
        let pages = pages(&provenance(), &rows);
        assert!(pages[0].1.contains("## Chart\n\n![`baseline` chart: every panel of the tables below](baseline.svg)"));
        assert_eq!(chart_file("baseline"), "baseline.svg");
    }

    #[test]
    fn extra_columns_stand_beside_the_measured_ones_where_they_know_a_row() {
        let rows = rows(&[
            ("ftrace call-ops relevant=1,irrelevant=0 overhead insn", OFF, Mode::Icount, &[3.0]),
            ("ftrace list relevant=1,irrelevant=0 overhead insn", OFF, Mode::Icount, &[12.0]),
            ("baseline call - per_op insn", OFF, Mode::Icount, &[2.0]),
        ]);
        let extras = [
            ExtraColumn {
                header: "L1D refills per op".into(),
                kind: ColumnKind::Metric,
                cell: Box::new(|row: &TableRow| (row.suite == "ftrace").then(|| "0.5".to_string())),
            },
            ExtraColumn {
                header: "Linux ns".into(),
                kind: ColumnKind::Peer,
                cell: Box::new(|row: &TableRow| {
                    (row.case == "call-ops" && row.metric == "overhead").then(|| "1.87".to_string())
                }),
            },
        ];
        let text = render_with(&provenance(), &rows, &extras);
        // Peers first, then further metrics; a row the column does not know gets `-`.
        assert!(
            text.contains(
                "| case | relevant | irrelevant | icount insn `max,pauth=off` | Linux ns | L1D refills per op |"
            ),
            "{text}"
        );
        assert!(text.contains("| call-ops | 1 | 0 | 3 | 1.87 | 0.5 |"), "{text}");
        assert!(text.contains("| list | 1 | 0 | 12 | - | 0.5 |"), "{text}");
        // A table whose rows no column knows is left as it was.
        assert!(text.contains("| case | icount insn `max,pauth=off` |\n|---|---:|\n| call | 2 |"), "{text}");
        let pages = pages_with(&provenance(), &rows, &extras);
        assert!(pages.iter().any(|(suite, text)| suite == "ftrace" && text.contains("| Linux ns |")));
    }

    #[test]
    fn fidelity_flags_an_order_flip_with_separate_ranges_only() {
        // icount: fp dearer than scs; wall under QARMA5: scs dearer, ranges apart: a flip.
        // Under pauth=off wall the ranges overlap: no order, so no second flip from it.
        let flipped = rows(&[
            ("stacktrace fp - per_trace insn", OFF, Mode::Icount, &[1300.0]),
            ("stacktrace scs - per_trace insn", OFF, Mode::Icount, &[1000.0]),
            ("stacktrace fp - per_trace ns", QARMA5, Mode::Wall, &[500.0, 600.0]),
            ("stacktrace scs - per_trace ns", QARMA5, Mode::Wall, &[700.0, 800.0]),
            ("stacktrace fp - per_trace ns", OFF, Mode::Wall, &[500.0, 600.0]),
            ("stacktrace scs - per_trace ns", OFF, Mode::Wall, &[550.0, 650.0]),
        ]);
        let all: Vec<&Row> = flipped.iter().collect();
        let flips = fidelity_flips(&all);
        assert_eq!(flips.len(), 1, "{flips:?}");
        assert!(
            flips[0].contains("`fp` < `scs` under `max,pauth-qarma5=on` wall (500..600 vs 700..800 ns)"),
            "{}",
            flips[0]
        );
        // The same figures with overlapping QARMA5 ranges flag nothing.
        let overlapping = rows(&[
            ("stacktrace fp - per_trace insn", OFF, Mode::Icount, &[1300.0]),
            ("stacktrace scs - per_trace insn", OFF, Mode::Icount, &[1000.0]),
            ("stacktrace fp - per_trace ns", QARMA5, Mode::Wall, &[500.0, 750.0]),
            ("stacktrace scs - per_trace ns", QARMA5, Mode::Wall, &[700.0, 800.0]),
        ]);
        let all: Vec<&Row> = overlapping.iter().collect();
        assert!(fidelity_flips(&all).is_empty());
    }

    #[test]
    fn pages_link_every_metric_to_the_contract() {
        let rows = rows(&[
            ("depot saturation distinct=1 records records", OFF, Mode::Icount, &[1.0]),
            ("depot saturation distinct=1 hit_rate percent", OFF, Mode::Icount, &[100.0]),
        ]);
        let pages = pages(&provenance(), &rows);
        assert_eq!(pages.len(), 1);
        let (suite, text) = &pages[0];
        assert_eq!(suite, "depot");
        assert!(text.contains("- commit: `abc1234-dirty`") && text.contains("- date: 2026-11-23 19:00:00 UTC"));
        assert!(text.contains("- `hit_rate` (icount percent): percent of lookups that found their stack ([contract](../reference/bench.md#depot))"), "{text}");
        assert!(text.contains("This run is icount only"));
    }

    #[test]
    fn the_pages_links_lead_to_headings_of_the_contract() {
        let contract = std::fs::read_to_string(crate::build::workspace_root().join("docs/reference/bench.md"))
            .expect("the bench contract is in the repository");
        assert!(contract.lines().any(|line| line == "### Generated results"));
        for suite in super::super::SUITES {
            assert!(
                contract.lines().any(|line| line == format!("### {}", suite.name)),
                "no section for {}",
                suite.name
            );
        }
    }

    #[test]
    fn every_contract_metric_has_a_meaning() {
        for (suite, metric) in [
            ("baseline", "per_op"),
            ("stacktrace", "per_trace"),
            ("probes", "per_hit"),
            ("ftrace", "overhead"),
            ("kasan-boot", "overhead_pct"),
            ("kasan-boot", "alloc_per_call"),
            ("kasan-boot", "free_per_call"),
            ("cpus", "per_op"),
            ("cpus", "cas_failures"),
            ("cpus-heap", "lock_spins"),
        ] {
            assert!(!meaning(suite, metric).starts_with("(not described"), "{suite} {metric}");
        }
    }
}
