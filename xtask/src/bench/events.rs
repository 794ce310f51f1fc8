//! `bench --events`: the events plugin's per-window counts turned into metrics of each row.
//!
//! xtask builds the plugin (`crates/events-plugin`, its own GPL-2.0-or-later workspace) with
//! the pinned toolchain, loads it into each icount run with the kernel's vector table address,
//! and boots the kernel with `bench.events=1`, so that after each row it can tie to its windows
//! the kernel says which (`protocol::bench::RowWindows`). A row whose figure is
//! (window A - window B) / N gets, for each counted event, the metric
//! `METRIC.EVENT` = (count in A - count in B) / N: `per_hit.exceptions`, `per_op.dsb`, ...
//! The instruction counts double as a check: the plugin's (A - B) / N must be the row's own
//! figure, or the windows were numbered differently on the two sides and nothing is kept.

use super::report::{self, ColumnKind, ExtraColumn, TableRow};
use super::results::{Provenance, Row, Sample};
use crate::Failure;
use crate::build;
use events::model::{self, Costs};
use events::window::CacheMode;
use events::{Counter, WindowCounts};
use object::{Object, ObjectSymbol};
use protocol::bench::RowWindows;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The plugin's manifest, relative to the workspace root.
const MANIFEST: &str = "crates/events-plugin/Cargo.toml";
/// The symbol of the kernel's vector table (vectors.S): the plugin counts executions of its 16
/// entries as exceptions taken.
const VECTORS_SYMBOL: &str = "exception_vectors";

/// The plugin as a run loads it.
pub struct Plugin {
    pub library: PathBuf,
    /// `--cache`: the cache mode (per-access callbacks through the Cortex-A72 cache model).
    pub cache: CacheMode,
}

/// The kernel probe targets whose first instruction empties the model in the cold cache mode,
/// so that every hit on them (and every unprobed call) starts with empty caches.
const COLD_TARGETS: [&str; 3] = ["bench_probe_target_nop", "bench_probe_target_push", "bench_probe_target_ret"];
/// The user probe targets (`.text.user`, run at EL0 from `USER_TEXT`), likewise for the
/// `uprobe-*`, `uretprobe-*` and `user-call-*` rows.
const COLD_USER_TARGETS: [&str; 3] = ["user_bench_target_nop", "user_bench_target_push", "user_bench_target_ret"];
/// Where user tasks see `.text.user` (`USER_TEXT` in kernel/src/task/user.rs): the address a
/// user target's first instruction runs at is this plus its offset from `__user_text_start`.
const USER_TEXT: u64 = 0x40_0000;
const USER_TEXT_START_SYMBOL: &str = "__user_text_start";
/// The ftrace suite's traced function (`bench::ftrace::target`, demangled without its hash):
/// emptying the model at its first instruction makes every traced call, its dispatch
/// included, start cold.
const COLD_FTRACE_TARGET: &str = "kernel::bench::ftrace::target";

/// Builds the plugin (release, pinned toolchain: cargo runs from the workspace root, whose
/// `rust-toolchain.toml` rustup reads) into `target/events-plugin` and returns the library.
pub fn build_plugin() -> Result<PathBuf, Failure> {
    let root = build::workspace_root();
    let target = super::target_dir().join("events-plugin");
    eprintln!("xtask: building the events plugin");
    let status = Command::new(env!("CARGO"))
        .current_dir(&root)
        .args(["build", "--release", "--quiet", "--manifest-path", MANIFEST, "--target-dir"])
        .arg(&target)
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .status()
        .map_err(|error| Failure::usage(format!("cannot run cargo: {error}")))?;
    if !status.success() {
        return Err(Failure { status: 1, message: "events plugin build failed".into() });
    }
    Ok(target.join("release/libtracelab_events_plugin.so"))
}

/// What one icount run with the plugin needs: its QEMU arguments and where it writes.
pub struct PluginRun {
    pub windows: PathBuf,
    pub qemu_args: Vec<String>,
}

impl PluginRun {
    /// Arguments for a run of the kernel `elf`, writing its windows to `windows` (removed first,
    /// so a stale file cannot pass for this run's).
    pub fn new(plugin: &Plugin, elf: &Path, windows: PathBuf) -> Result<Self, Failure> {
        let data = std::fs::read(elf).map_err(|error| Failure::usage(format!("{}: {error}", elf.display())))?;
        let file =
            object::File::parse(&*data).map_err(|error| Failure::usage(format!("{}: {error}", elf.display())))?;
        let address = |name: &str| {
            file.symbols()
                .find(|symbol| symbol.name() == Ok(name))
                .map(|symbol| symbol.address())
                .ok_or_else(|| Failure { status: 1, message: format!("kernel ELF has no {name}") })
        };
        let vectors = address(VECTORS_SYMBOL)?;
        let _ = std::fs::remove_file(&windows);
        let mut argument = format!(
            "{},out={},vectors={vectors:#x},cache={}",
            plugin.library.display(),
            windows.display(),
            plugin.cache.name()
        );
        if plugin.cache == CacheMode::Cold {
            let mut targets = COLD_TARGETS.into_iter().map(address).collect::<Result<Vec<_>, _>>()?;
            let user_text = address(USER_TEXT_START_SYMBOL)?;
            for name in COLD_USER_TARGETS {
                targets.push(USER_TEXT + (address(name)? - user_text));
            }
            let traced = file
                .symbols()
                .find(|symbol| {
                    symbol
                        .name()
                        .is_ok_and(|name| format!("{:#}", rustc_demangle::demangle(name)) == COLD_FTRACE_TARGET)
                })
                .ok_or_else(|| Failure { status: 1, message: format!("kernel ELF has no {COLD_FTRACE_TARGET}") })?;
            targets.push(traced.address());
            let targets: Vec<String> = targets.iter().map(|target| format!("{target:#x}")).collect();
            argument.push_str(&format!(",evict={}", targets.join(":")));
        }
        Ok(Self { windows, qemu_args: vec!["-plugin".into(), argument] })
    }
}

/// What the plugin wrote for one run.
#[derive(Debug, Default)]
pub struct PluginLog {
    /// Per vCPU, its windows in closing order.
    pub windows: Vec<Vec<WindowCounts>>,
    /// Each row marker's (vCPU, windows it had closed), in the order they ran.
    pub rows: Vec<(u32, usize)>,
    /// How the cache model ran.
    pub cache: CacheMode,
}

/// Reads the plugin's file. A file without its end line, or with a window left open, is not a
/// whole run's.
pub fn read_windows(path: &Path) -> Result<PluginLog, Failure> {
    let text = std::fs::read_to_string(path).map_err(|error| Failure {
        status: 1,
        message: format!("events plugin wrote nothing ({}: {error})", path.display()),
    })?;
    let mut log = PluginLog::default();
    let mut end = None;
    for line in text.lines() {
        if let Some(window) = WindowCounts::parse(line) {
            let cpu = window.cpu as usize;
            if log.windows.len() <= cpu {
                log.windows.resize(cpu + 1, Vec::new());
            }
            log.windows[cpu].push(window);
        } else if let Some(row) = events::window::parse_row(line) {
            log.rows.push(row);
        } else if let Some(counts) = events::window::parse_end(line) {
            end = Some(counts);
        } else {
            return Err(Failure { status: 1, message: format!("{}: not a plugin line: {line}", path.display()) });
        }
    }
    let windows: usize = log.windows.iter().map(Vec::len).sum();
    match end {
        Some((count, 0, cache)) if count == windows => Ok(PluginLog { cache, ..log }),
        Some((count, unclosed, _)) => Err(Failure {
            status: 1,
            message: format!("{}: {count} windows said, {windows} read, {unclosed} left open", path.display()),
        }),
        None => Err(Failure { status: 1, message: format!("{}: no end line (QEMU did not exit)", path.display()) }),
    }
}

/// The unit of an event metric.
fn unit(counter: Counter) -> &'static str {
    match counter {
        Counter::BytesLoaded | Counter::BytesStored => "bytes",
        _ => "events",
    }
}

/// The event metrics of every row the kernel tied to its windows: one sample per counter
/// (vector entries only where the row's count is not zero), shaped like the row's own sample.
/// The k-th `bench events:` line belongs to the plugin's k-th row marker; its windows are the
/// latest of that vCPU's windows before the marker whose instruction counts are the costs the
/// line names (under icount a window's cost is its instruction count).
pub fn samples(log: &[&str], plugin: &PluginLog, rows: &[Sample]) -> Result<Vec<Sample>, Failure> {
    let mut samples = Vec::new();
    let tied: Vec<(&str, RowWindows)> = log
        .iter()
        .filter_map(|line| RowWindows::from_line(line).map(|parsed| (*line, parsed)))
        .map(|(line, parsed)| {
            parsed
                .map(|parsed| (line, parsed))
                .ok_or_else(|| Failure { status: 1, message: format!("malformed events line: {line}") })
        })
        .collect::<Result<_, _>>()?;
    if tied.len() != plugin.rows.len() {
        return Err(Failure {
            status: 1,
            message: format!(
                "{} events lines in the log, {} row markers seen by the plugin",
                tied.len(),
                plugin.rows.len()
            ),
        });
    }
    for ((line, tied), &(cpu, closed)) in tied.iter().zip(&plugin.rows) {
        let before = plugin.windows.get(cpu as usize).map_or(&[][..], |windows| &windows[..closed.min(windows.len())]);
        let window = |cost: u64| {
            before.iter().rev().find(|window| window.get(Counter::Instructions) == cost).ok_or_else(|| Failure {
                status: 1,
                message: format!("{line}: no window of {cost} instructions on CPU {cpu} before the row marker"),
            })
        };
        let measured = window(tied.measured)?;
        let reference = tied.reference.map(window).transpose()?;
        let per_operation = |counter: Counter| {
            let base = reference.map_or(0.0, |reference| reference.get(counter) as f64);
            (measured.get(counter) as f64 - base) / tied.per as f64
        };
        let params: Vec<(String, String)> = if tied.params == "-" {
            Vec::new()
        } else {
            tied.params
                .split(',')
                .filter_map(|pair| pair.split_once('='))
                .map(|(key, value)| (key.to_string(), value.to_string()))
                .collect()
        };
        // The row this line follows: the last one of that identity (a rep's).
        let Some(row) = rows.iter().rev().find(|row| {
            row.suite == tied.suite && row.case == tied.case && row.metric == tied.metric && row.params == params
        }) else {
            return Err(Failure { status: 1, message: format!("{line}: no such row") });
        };
        let shown = |counter: &Counter| {
            *counter != Counter::Instructions && (plugin.cache != CacheMode::Off || !counter.modelled())
        };
        for counter in Counter::all().filter(shown) {
            let value = per_operation(counter);
            if matches!(counter, Counter::Vector(_)) && value == 0.0 {
                continue;
            }
            // Cold misses are other figures than warm ones: `l1d_misses_cold`.
            let cold = if counter.modelled() && plugin.cache == CacheMode::Cold { "_cold" } else { "" };
            samples.push(Sample {
                metric: format!("{}.{}{cold}", tied.metric, counter.name()),
                unit: unit(counter).into(),
                value,
                ..row.clone()
            });
        }
        // The cycle model's figure for the row, from the same events: labelled as a model in
        // its unit and wherever it is shown.
        let cold = if plugin.cache == CacheMode::Cold { "_cold" } else { "" };
        samples.push(Sample {
            metric: format!("{}.{}{cold}", tied.metric, model::METRIC),
            unit: model::UNIT.into(),
            value: Costs::a72().cycles(per_operation),
            ..row.clone()
        });
    }
    Ok(samples)
}

/// The counters report tables show beside each row's figure, in this order (every counter is
/// in results.json).
const COLUMNS: [Counter; 16] = [
    Counter::Exceptions,
    Counter::ExceptionReturns,
    Counter::Isb,
    Counter::Dsb,
    Counter::Dmb,
    Counter::CacheMaintenance,
    Counter::Tlbi,
    Counter::SystemRegisters,
    Counter::PointerAuthentication,
    Counter::Loads,
    Counter::Stores,
    Counter::TakenBranches,
    Counter::IndirectBranches,
    Counter::L1iMisses,
    Counter::L1dMisses,
    Counter::L2Misses,
];

/// An event metric (`per_hit.exceptions`, `per_hit.l1d_misses_cold`): its row's metric and the
/// event's name.
fn event_metric(metric: &str) -> Option<(&str, &str)> {
    let (row_metric, event) = metric.split_once('.')?;
    let counter = event.strip_suffix("_cold").unwrap_or(event);
    (counter == model::METRIC || Counter::all().any(|known| known.name() == counter)).then_some((row_metric, event))
}

/// Whether a results.json metric is one of the plugin's events or the model's figure.
pub fn is_event_metric(metric: &str) -> bool {
    event_metric(metric).is_some()
}

/// The rows without the event metrics: what tables show as rows of their own.
pub fn measured(rows: &[Row]) -> Vec<Row> {
    rows.iter().filter(|row| event_metric(&row.metric).is_none()).cloned().collect()
}

/// The events a chart gives panels of their own, per operation: what the instruction counts
/// weigh alike and a core does not (exceptions, barriers, cache and TLB maintenance, modelled
/// misses).
const CHARTED: [Counter; 9] = [
    Counter::Exceptions,
    Counter::Isb,
    Counter::Dsb,
    Counter::Dmb,
    Counter::CacheMaintenance,
    Counter::Tlbi,
    Counter::L1iMisses,
    Counter::L1dMisses,
    Counter::L2Misses,
];

/// The rows charts draw: the measured rows, then the charted events' rows and the model's
/// figures (each event metric a panel, labelled by its unit). An event metric that is zero on
/// every row of its suite gets no panel: bars of nothing say what its table column says.
pub fn charted(rows: &[Row]) -> Vec<Row> {
    let shown = |event: &str| {
        let counter = event.strip_suffix("_cold").unwrap_or(event);
        counter == model::METRIC || CHARTED.iter().any(|charted| charted.name() == counter)
    };
    let mut charted = measured(rows);
    charted.extend(
        rows.iter()
            .filter(|row| event_metric(&row.metric).is_some_and(|(_, event)| shown(event)))
            .filter(|row| {
                rows.iter().any(|other| other.suite == row.suite && other.metric == row.metric && other.median != 0.0)
            })
            .cloned(),
    );
    charted
}

/// One table column per shown event, holding the events per operation of each row's figure
/// (several CPU variants' values, in the table's order, where they differ).
pub fn columns(rows: &[Row]) -> Vec<ExtraColumn<'_>> {
    let names = COLUMNS.into_iter().flat_map(|counter| {
        let cold = counter.modelled().then(|| format!("{}_cold", counter.name()));
        core::iter::once(counter.name().to_string()).chain(cold)
    });
    // The model's figures last, headed by what they are: never a measurement.
    let modelled = [model::METRIC.to_string(), format!("{}_cold", model::METRIC)];
    names
        .chain(modelled)
        .filter(|name| rows.iter().any(|row| event_metric(&row.metric).is_some_and(|(_, event)| event == name)))
        .map(|name| ExtraColumn {
            header: match name.strip_prefix(model::METRIC) {
                Some("") => model::LABEL.to_string(),
                Some(_) => format!("cold {}", model::LABEL),
                None => format!("{name} (events)"),
            },
            kind: ColumnKind::Metric,
            cell: Box::new(move |table: &TableRow| {
                let metric = format!("{}.{name}", table.metric);
                let values: Vec<String> = report::distinct(
                    rows.iter()
                        .filter(|row| {
                            row.suite == table.suite
                                && row.case == table.case
                                && row.params == table.params
                                && row.variant == table.variant
                                && row.metric == metric
                        })
                        .map(|row| report::number(row.median)),
                );
                (!values.is_empty()).then(|| values.join(" / "))
            }),
        })
        .collect()
}

/// report.md: the measured rows' tables with the event columns and, given Linux's rows, the peer
/// column (a run without either renders as the report always did).
pub fn render(provenance: &Provenance, rows: &[Row], peer: Option<&[Row]>) -> String {
    let mut columns = columns(rows);
    columns.extend(peer.map(|peer| super::peer::column(rows, peer)));
    if columns.is_empty() {
        report::render(provenance, rows)
    } else {
        report::render_with(provenance, &measured(rows), &columns)
    }
}

/// The docs/results pages, likewise.
pub fn pages(provenance: &Provenance, rows: &[Row], peer: Option<&[Row]>) -> Vec<(String, String)> {
    let mut columns = columns(rows);
    columns.extend(peer.map(|peer| super::peer::column(rows, peer)));
    if columns.is_empty() {
        report::pages(provenance, rows)
    } else {
        report::pages_with(provenance, &measured(rows), &columns)
    }
}

/// What `cargo xtask test` checks (`check [events plugin counts]`): the plugin builds, and one
/// icount run of `baseline` and `probes` with it gives the counts the code fixes: a BRK round
/// trip is one exception and one `eret`, a PAC-signed call two PAC instructions, a call two
/// taken branches (`blr`, `ret`); a kprobe hit takes two exceptions single-stepped or BRK-stepped, one
/// simulated, none through a detour. None when all hold, else what did not.
pub fn self_test(image: &build::KernelImage) -> Result<Option<String>, Failure> {
    let plugin = Plugin { library: build_plugin()?, cache: CacheMode::Off };
    let plan = super::RunPlan {
        board: build::Board::Virt,
        image,
        variant: build::BuildVariant::Prod,
        suites: &["baseline", "probes"],
        cpu: crate::qemu::CpuVariant::MaxNoPauth,
        mode: super::Mode::Icount,
        reps: 1,
        timeout: std::time::Duration::from_secs(300),
        dtb: None,
        serial: None,
        smp: 1,
        terminate_after_rows: None,
        events: Some(&plugin),
    };
    let samples = match super::measure(&plan) {
        Ok(samples) => samples,
        Err(failure) => return Ok(Some(failure.message)),
    };
    let value = |suite: &str, case: &str, method: Option<&str>, metric: &str| {
        samples
            .iter()
            .find(|sample| {
                sample.suite == suite
                    && sample.case == case
                    && sample.metric == metric
                    && method.is_none_or(|method| {
                        sample.params.iter().any(|(key, value)| key == "method" && value == method)
                    })
            })
            .map(|sample| sample.value)
    };
    let expected = [
        ("baseline", "brk-roundtrip", None, "per_op.exceptions", 1.0),
        ("baseline", "brk-roundtrip", None, "per_op.vector.sync.current_spx", 1.0),
        ("baseline", "brk-roundtrip", None, "per_op.eret", 1.0),
        ("baseline", "call-pac", None, "per_op.pac", 2.0),
        ("baseline", "call-scs", None, "per_op.stores", 1.0),
        ("baseline", "call-scs", None, "per_op.bytes_stored", 8.0),
        ("baseline", "call", None, "per_op.taken_branches", 2.0),
        ("baseline", "call", None, "per_op.calls", 1.0),
        ("probes", "kprobe-push", Some("single-step"), "per_hit.exceptions", 2.0),
        ("probes", "kprobe-push", Some("brk-step"), "per_hit.exceptions", 2.0),
        ("probes", "kprobe-push", Some("simulate"), "per_hit.exceptions", 1.0),
        ("probes", "kprobe-push", Some("detour"), "per_hit.exceptions", 0.0),
    ];
    let wrong: Vec<String> = expected
        .iter()
        .filter_map(|&(suite, case, method, metric, want)| {
            let got = value(suite, case, method, metric);
            (got != Some(want))
                .then(|| format!("{suite} {case} {} {metric}: {got:?}, not {want}", method.unwrap_or("-")))
        })
        .collect();
    Ok((!wrong.is_empty()).then(|| wrong.join("; ")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::Mode;
    use crate::build::BuildVariant;
    use crate::qemu::CpuVariant;

    fn window(cpu: u32, instructions: u64, exceptions: u64) -> WindowCounts {
        let mut values = [0; Counter::COUNT];
        values[Counter::Instructions.index()] = instructions;
        values[Counter::Exceptions.index()] = exceptions;
        values[Counter::Vector(events::VectorEntry(4)).index()] = exceptions;
        WindowCounts { cpu, values }
    }

    fn row(value: f64) -> Sample {
        Sample {
            suite: "probes".into(),
            case: "kprobe-push".into(),
            params: vec![("method".into(), "single-step".into())],
            metric: "per_hit".into(),
            unit: "insn".into(),
            value,
            cpu: CpuVariant::ALL[0],
            variant: BuildVariant::Prod,
            mode: Mode::Icount,
        }
    }

    #[test]
    fn a_rows_events_take_its_arithmetic() {
        // Two windows of 31000 instructions: the later one before the marker is the row's.
        let plugin = PluginLog {
            windows: vec![vec![window(0, 31_000, 0), window(0, 1000, 0), window(0, 31_000, 200), window(0, 31_000, 9)]],
            rows: vec![(0, 3)],
            cache: CacheMode::Off,
        };
        let line = "bench events: probes kprobe-push method=single-step per_hit measured=31000 reference=1000 per=100";
        let samples = samples(&[line], &plugin, &[row(300.0)]).unwrap();
        let find = |metric: &str| samples.iter().find(|sample| sample.metric == metric).map(|sample| sample.value);
        assert_eq!(find("per_hit.exceptions"), Some(2.0));
        assert_eq!(find("per_hit.vector.sync.current_spx"), Some(2.0));
        assert_eq!(find("per_hit.vector.irq.current_spx"), None);
        assert_eq!(find("per_hit.dsb"), Some(0.0));
        // The model's figure rides along, in its own unit: 300 instructions at 0.5 cycles and
        // two exceptions at 40.
        assert_eq!(find("per_hit.model_cycles"), Some(300.0 * 0.5 + 2.0 * 40.0));
        let modelled = samples.iter().find(|sample| sample.metric == "per_hit.model_cycles").unwrap();
        assert_eq!(modelled.unit, "cycles (model)");
        assert!(samples.iter().all(|sample| sample.case == "kprobe-push" && sample.params == row(0.0).params));
    }

    #[test]
    fn charts_get_a_panel_per_event_that_happened() {
        use crate::bench::results::Row;
        let samples = [
            ("per_hit", "insn", [300.0, 120.0]),
            ("per_hit.exceptions", "events", [2.0, 1.0]),
            ("per_hit.tlbi", "events", [0.0, 0.0]),
            ("per_hit.loads", "events", [40.0, 30.0]),
            ("per_hit.model_cycles", "cycles (model)", [230.0, 100.0]),
        ]
        .into_iter()
        .flat_map(|(metric, unit, values)| {
            ["single-step", "simulate"].into_iter().zip(values).map(move |(method, value)| Sample {
                metric: metric.into(),
                unit: unit.into(),
                params: vec![("method".into(), method.into())],
                ..row(value)
            })
        })
        .collect::<Vec<_>>();
        let rows = Row::aggregate(&samples);
        let charted = charted(&rows);
        let metrics: Vec<&str> = charted.iter().map(|row| row.metric.as_str()).collect();
        // Exceptions and the model get panels; tlbi never happened; loads stay in the table.
        assert_eq!(
            metrics,
            [
                "per_hit",
                "per_hit",
                "per_hit.exceptions",
                "per_hit.exceptions",
                "per_hit.model_cycles",
                "per_hit.model_cycles"
            ]
        );
        let panels = crate::bench::chart::panels("probes", &charted, None);
        let titles: Vec<&str> = panels.iter().map(|panel| panel.title.as_str()).collect();
        assert!(titles.iter().any(|title| title.starts_with("probes: per_hit.exceptions,")), "{titles:?}");
        let exceptions = panels.iter().find(|panel| panel.title.starts_with("probes: per_hit.exceptions")).unwrap();
        assert_eq!(exceptions.axis, "events per operation (QEMU plugin)");
        let modelled = panels.iter().find(|panel| panel.title.starts_with("probes: per_hit.model_cycles")).unwrap();
        assert_eq!(modelled.axis, "cycles (model)");
    }

    #[test]
    fn a_row_without_its_windows_is_refused() {
        let plugin = PluginLog {
            windows: vec![vec![window(0, 1000, 0), window(0, 31_000, 200)]],
            rows: vec![(0, 2)],
            cache: CacheMode::Off,
        };
        let line = "bench events: probes kprobe-push method=single-step per_hit measured=31000 reference=1000 per=100";
        let missing =
            "bench events: probes kprobe-push method=single-step per_hit measured=31001 reference=1000 per=100";
        assert!(samples(&[missing], &plugin, &[row(300.0)]).is_err());
        let early = PluginLog { rows: vec![(0, 1)], ..plugin };
        assert!(samples(&[line], &early, &[row(300.0)]).is_err());
        let unmarked = PluginLog { rows: Vec::new(), ..early };
        assert!(samples(&[line], &unmarked, &[row(300.0)]).is_err());
    }

    #[test]
    fn a_file_without_its_end_is_refused() {
        let dir = std::env::temp_dir().join(format!("tracelab-events-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("windows.txt");
        let mut line = String::new();
        window(0, 5, 0).write_line(&mut line).unwrap();
        std::fs::write(&path, format!("{line}\n")).unwrap();
        assert!(read_windows(&path).is_err());
        std::fs::write(
            &path,
            format!("{line}\nevents row: cpu=0 windows=1\nevents end: windows=1 unclosed=0 cache=off\n"),
        )
        .unwrap();
        let log = read_windows(&path).unwrap();
        assert_eq!((log.windows[0].len(), log.rows.clone()), (1, vec![(0, 1)]));
        std::fs::write(&path, format!("{line}\nevents end: windows=1 unclosed=1 cache=off\n")).unwrap();
        assert!(read_windows(&path).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
