//! The demo run (`run=demo`, kernel/src/demo/): how `cargo xtask qemu` shows it, and how
//! `cargo xtask test` checks it against the mechanisms rather than a golden text.
//!
//! The kernel prints raw addresses and measured figures; here they are symbolized with the ELF
//! and rendered (traces side by side, the function tracer's ring as Linux's `trace` file), and
//! checked: both stack traces name the same functions frame by frame, every probe's own hit
//! counter reads 1, the sanitizer report's allocation and free stacks name the demo's functions,
//! and every cost printed is within 2 instructions of the bench's icount row for the same case,
//! measured by a bench run of the same kernel in the same configuration.

use crate::Failure;
use crate::build::{self, Board, BuildVariant};
use crate::function_graph;
use crate::log::{LogLine, LogStyle};
use crate::qemu::{self, CpuVariant, Machine};
use crate::trace::{self, Fed, FunctionTable, RingReader};
use protocol::bench::Row;
use std::collections::HashMap;
use std::time::Duration;

/// The kprobe calls' arguments (kernel/src/demo/probes.rs: `ARGUMENTS`).
const ARGUMENTS: [u64; 3] = [0x1111, 0x2222, 0x3333];
/// How far a demo cost may be from the bench's row, in instructions.
const COST_TOLERANCE: f64 = 2.0;
/// Trace lines shown on the console; the file has them all.
const TRACE_LINES_SHOWN: usize = 24;

/// The console of an interactive run (`cargo xtask qemu`, `cargo xtask monitor`): every line
/// as the presenter renders it in `style`, demo lines symbolized and the function tracer's ring
/// written.
pub fn console(elf: &[u8], style: LogStyle) -> impl FnMut(&LogLine) + use<> {
    let mut presenter = Presenter::new(elf, style);
    move |line| presenter.present(line).iter().for_each(|text| println!("{text}"))
}

/// Renders demo lines for the console as they arrive.
pub struct Presenter {
    symbols: Option<FunctionTable>,
    rings: RingReader,
    graphs: function_graph::GraphReader,
    style: LogStyle,
}

impl Presenter {
    pub fn new(elf: &[u8], style: LogStyle) -> Self {
        Self {
            symbols: FunctionTable::from_elf(elf),
            rings: RingReader::default(),
            graphs: function_graph::GraphReader::default(),
            style,
        }
    }

    /// The console lines for one log line (none while a ring streams in).
    pub fn present(&mut self, line: &LogLine) -> Vec<String> {
        let text = line.text.as_str();
        match self.rings.feed(text) {
            Fed::Consumed => return Vec::new(),
            Fed::Complete(ring) => return self.show_ring(&ring),
            Fed::Other => {}
        }
        match self.graphs.feed(text) {
            function_graph::Fed::Consumed => return Vec::new(),
            function_graph::Fed::Complete(graph) => return self.show_graph(&graph),
            function_graph::Fed::Other => {}
        }
        let Some(symbols) = &self.symbols else {
            return vec![line.render(self.style)];
        };
        if let Some(title) = text.strip_prefix("demo: == ").and_then(|rest| rest.strip_suffix(" ==")) {
            return vec![String::new(), format!("== {title} ==")];
        }
        if let Some(row) = text.strip_prefix("demo: stacks #") {
            let Some((index, fp, scs)) = stack_row(row) else { return vec![line.render(self.style)] };
            let describe = |address: u64| if address == 0 { "-".to_string() } else { describe(symbols, address) };
            let mark = if fp == scs { "" } else { "   <- differs" };
            let row = format!("  #{index:<2} {:<58} {}{mark}", describe(fp), describe(scs));
            if index == 0 {
                return vec![format!("      {:<58} {}", "frame records (x29 chain)", "shadow call stack (x18)"), row];
            }
            return vec![row];
        }
        if let Some(cost) = text.strip_prefix("demo cost: ").and_then(Cost::parse) {
            let what = match cost.metric.as_str() {
                "per_trace" => "per trace",
                "per_hit" => "per hit",
                other => other,
            };
            let unit = if cost.unit == "ns" { "virtual ns (TCG emulation time, not hardware)" } else { &cost.unit };
            return vec![format!(
                "  cost: {} {}: {} {unit} {what}   [bench row {} {} {} {}]",
                cost.case,
                cost.params,
                figure(cost.value),
                cost.suite,
                cost.case,
                cost.params,
                cost.metric
            )];
        }
        if let Some(rest) = text.strip_prefix("demo: kprobe target ")
            && let Some(target) = rest.split_whitespace().next().and_then(hex)
        {
            return vec![format!("{}  [{}]", line.render(self.style), describe(symbols, target))];
        }
        if text.starts_with("demo: kprobe ") || text.starts_with("demo: kretprobe ") {
            let names: Vec<String> = ["pc=", "lr=", "to="]
                .iter()
                .filter_map(|key| Some(format!("{key}{}", describe(symbols, field(text, key)?))))
                .collect();
            if !names.is_empty() {
                return vec![format!("{}  [{}]", line.render(self.style), names.join(", "))];
            }
        }
        vec![line.render(self.style)]
    }

    /// The function-graph trace: its header and first lines here, the whole of it in
    /// target/trace/function_graph.txt.
    fn show_graph(&self, graph: &function_graph::Graph) -> Vec<String> {
        let Some(symbols) = &self.symbols else {
            return vec![format!("ftrace graph: {} CPUs' events (no symbols to show them)", graph.cpus.len())];
        };
        let text = function_graph::graph_text(graph, symbols, self.style);
        let header = text.lines().take_while(|line| line.starts_with('#')).count();
        let events = text.lines().count() - header;
        let mut lines: Vec<String> = text.lines().take(header + TRACE_LINES_SHOWN).map(str::to_string).collect();
        if events > TRACE_LINES_SHOWN {
            lines.push(format!("  ... {} more lines", events - TRACE_LINES_SHOWN));
        }
        match function_graph::write(graph, symbols, self.style, &trace::output_dir()) {
            Ok(path) => lines.push(format!("ftrace graph: whole trace written to {}", path.display())),
            Err(error) => lines.push(format!("ftrace graph: cannot write the trace file: {error}")),
        }
        lines
    }

    fn show_ring(&self, ring: &trace::Ring) -> Vec<String> {
        let Some(symbols) = &self.symbols else {
            return vec![format!("ftrace: {} records (no symbols to show them)", ring.records.len())];
        };
        let text = trace::trace_text(ring, symbols, self.style);
        let mut lines: Vec<String> = text.lines().take(6 + TRACE_LINES_SHOWN).map(str::to_string).collect();
        if ring.records.len() > TRACE_LINES_SHOWN {
            lines.push(format!("  ... {} more records", ring.records.len() - TRACE_LINES_SHOWN));
        }
        match trace::write(ring, symbols, self.style, &trace::output_dir()) {
            Ok([text, json]) => {
                lines.push(format!("ftrace: whole ring written to {} and {}", text.display(), json.display()))
            }
            Err(error) => lines.push(format!("ftrace: cannot write the trace files: {error}")),
        }
        lines
    }
}

/// A measured figure: whole numbers as they are, others to one decimal.
fn figure(value: f64) -> String {
    if value.fract() == 0.0 { format!("{value}") } else { format!("{value:.1}") }
}

/// `FUNCTION+0xOFFSET/0xSIZE` (Linux's backtrace form) for a return address or PC.
fn describe(symbols: &FunctionTable, address: u64) -> String {
    match symbols.extent(address) {
        Some((start, end, name)) if end != u64::MAX => format!("{name}+{:#x}/{:#x}", address - start, end - start),
        Some((start, _, name)) => format!("{name}+{:#x}", address - start),
        None => format!("{address:#x}"),
    }
}

fn hex(text: &str) -> Option<u64> {
    u64::from_str_radix(text.strip_prefix("0x")?, 16).ok()
}

/// The value of `key` (e.g. `pc=`) in a line of `key=value` words.
fn field(text: &str, key: &str) -> Option<u64> {
    let value = text.split_whitespace().find_map(|word| word.strip_prefix(key))?;
    hex(value).or_else(|| value.parse().ok())
}

/// `N fp=0x.. scs=0x..` (`sframe=` for `fp=` in a build without frame pointers, whose kernel
/// walks by the SFrame table where it would follow frame records).
fn stack_row(row: &str) -> Option<(usize, u64, u64)> {
    let mut words = row.split_whitespace();
    let index = words.next()?.parse().ok()?;
    let first = words.next()?;
    let fp = hex(first.strip_prefix("fp=").or_else(|| first.strip_prefix("sframe="))?)?;
    let scs = hex(words.next()?.strip_prefix("scs=")?)?;
    Some((index, fp, scs))
}

/// A measured figure: the fields of a bench row (`SUITE CASE PARAMS METRIC UNIT VALUE`).
#[derive(Clone, Debug, PartialEq)]
struct Cost {
    suite: String,
    case: String,
    params: String,
    metric: String,
    unit: String,
    value: f64,
}

impl Cost {
    /// A bench row's fields, or a `demo cost:` line's (the same fields: `protocol::bench::Row`).
    fn parse(text: &str) -> Option<Self> {
        let row = Row::parse(text)?;
        Some(Self {
            suite: row.suite.to_string(),
            case: row.case.to_string(),
            params: row.params.to_string(),
            metric: row.metric.to_string(),
            unit: row.unit.to_string(),
            value: row.value,
        })
    }

    fn key(&self) -> (String, String, String, String) {
        (self.suite.clone(), self.case.clone(), self.params.clone(), self.metric.clone())
    }
}

/// The log line a check looked for, quoted, or that there was none.
fn line_or_none(line: Option<&str>) -> String {
    line.map_or_else(|| "no such line".into(), |line| format!("`{line}`"))
}

/// One named check and what was wrong, if anything (`note`: the figures behind a pass).
struct Check {
    name: String,
    problem: Option<String>,
    note: Option<String>,
}

fn check(name: impl Into<String>, problem: Option<String>) -> Check {
    Check { name: name.into(), problem, note: None }
}

/// The lines of a block that starts with a line beginning `title` and continues with `  fp #N`.
fn report_block<'a>(log: &'a [LogLine], title: &str) -> Vec<&'a str> {
    log.iter()
        .skip_while(|line| !line.text.starts_with(title))
        .skip(1)
        .take_while(|line| line.text.trim_start().starts_with("fp #"))
        .map(|line| line.text.as_str())
        .collect()
}

/// The functions the `fp #N ...` lines of a block return into. The return address is the line's
/// one bare hex word: raw (`fp #N 0xADDR`) or symbolized (`fp #N FUNCTION+0xOFF/0xSIZE 0xADDR file:line`).
fn block_functions(symbols: &FunctionTable, lines: &[&str]) -> Vec<String> {
    lines
        .iter()
        .filter_map(|line| line.split_whitespace().skip(2).find_map(hex))
        .map(|address| symbols.caller(address))
        .collect()
}

/// Checks one demo run's log against the mechanisms; `bench` holds the bench's rows from a run
/// of the same kernel in the same configuration.
fn check_run(
    log: &[LogLine],
    status: Option<i32>,
    symbols: &FunctionTable,
    variant: BuildVariant,
    bench: &[Cost],
) -> Vec<Check> {
    let texts: Vec<&str> = log.iter().map(|line| line.text.as_str()).collect();
    let has = |prefix: &str| texts.iter().any(|text| text.starts_with(prefix));
    let mut checks = vec![check(
        "demo ends with status 0 after all its parts",
        (status != Some(0) || !has("demo: done")).then(|| {
            let status = status.map_or_else(|| "no closing line".into(), |status| format!("exit status {status}"));
            format!("{status}, `demo: done` {}", if has("demo: done") { "logged" } else { "missing" })
        }),
    )];

    // Part 2: the same point walked both ways.
    if variant != BuildVariant::Plain {
        let rows: Vec<(usize, u64, u64)> =
            texts.iter().filter_map(|text| text.strip_prefix("demo: stacks #")).filter_map(stack_row).collect();
        let fp: Vec<String> = rows.iter().filter(|row| row.1 != 0).map(|row| symbols.caller(row.1)).collect();
        let scs: Vec<String> = rows.iter().filter(|row| row.2 != 0).map(|row| symbols.caller(row.2)).collect();
        let expected =
            ["kernel::demo::stacks::innermost", "kernel::demo::stacks::middle", "kernel::demo::stacks::outer"];
        let problem = if fp.len() < expected.len() {
            Some(format!("{} frames", fp.len()))
        } else if fp != scs {
            let at = fp.iter().zip(&scs).position(|(a, b)| a != b).unwrap_or(fp.len().min(scs.len()));
            Some(format!(
                "frame {at} differs: fp {} vs scs {} ({} vs {} frames)",
                fp.get(at).map_or("none", String::as_str),
                scs.get(at).map_or("none", String::as_str),
                fp.len(),
                scs.len()
            ))
        } else if !fp.starts_with(&expected.map(String::from)) {
            Some(format!("the trace does not start at the demo's point: {}", fp[..expected.len()].join(" <- ")))
        } else {
            None
        };
        checks.push(check("demo stack traces: frame records and shadow call stack name the same frames", problem));
    }

    // Part 3: the sanitizer's report (the compiler's checks in `full`, MTE's in `mte`).
    if matches!(variant, BuildVariant::Full | BuildVariant::Mte) {
        let allocated = block_functions(symbols, &report_block(log, "Allocated by task"));
        let freed = block_functions(symbols, &report_block(log, "Freed by task"));
        let faulting = block_functions(symbols, &report_block(log, "Call trace:"));
        let names = |functions: &[String], name: &str| functions.iter().any(|function| function == name);
        let problem = if !has("BUG: KASAN: slab-use-after-free") || !has("demo: kasan: 1 report, slab-use-after-free") {
            Some("no use-after-free report, or not exactly one".to_string())
        } else if !names(&allocated, "kernel::demo::kasan::show")
            || !allocated.iter().any(|f| f.contains("allocate_object"))
        {
            Some(format!("allocation stack {}", allocated.join(" <- ")))
        } else if !freed.iter().any(|f| f.contains("free_object")) || !names(&freed, "kernel::demo::kasan::show") {
            Some(format!("free stack {}", freed.join(" <- ")))
        } else if !faulting.iter().any(|f| f.contains("read_object")) {
            Some(format!("faulting stack {}", faulting.join(" <- ")))
        } else {
            None
        };
        checks.push(check("demo sanitizer report: alloc, free and access stacks are the demo's functions", problem));
    }

    // Part 4: each probe's own counter.
    let target = texts.iter().find_map(|text| {
        text.strip_prefix("demo: kprobe target ").and_then(|rest| hex(rest.split_whitespace().next()?))
    });
    for method in ["single-step", "brk-step", "simulate", "detour"] {
        let prefix = format!("demo: kprobe {method} ");
        let line = texts.iter().find(|text| text.starts_with(&prefix));
        let problem = match line {
            None => Some("no line".to_string()),
            Some(line) => {
                let seen = [field(line, "x0="), field(line, "x1="), field(line, "x2=")];
                if field(line, "hits=") != Some(1) || field(line, "missed=") != Some(0) {
                    Some(format!("counter: {line}"))
                } else if seen != ARGUMENTS.map(Some) {
                    Some(format!("the handler saw {seen:x?}, the call passed {ARGUMENTS:x?}"))
                } else if target.is_none() || field(line, "pc=") != target {
                    Some(format!("pc {:x?} is not the target {target:x?}", field(line, "pc=")))
                } else if field(line, "lr=").map(|lr| symbols.caller(lr)).as_deref()
                    != Some("kernel::demo::probes::call_once")
                {
                    Some("lr does not return into the demo's call".to_string())
                } else {
                    None
                }
            }
        };
        checks.push(check(format!("demo kprobe {method}: hit counter 1, handler saw the call's registers"), problem));
    }
    let kretprobe = texts.iter().find(|text| text.starts_with("demo: kretprobe "));
    checks.push(check(
        "demo kretprobe: hit counter 1, return value seen",
        match kretprobe {
            Some(line) if field(line, "hits=") == Some(1) && field(line, "x0=") == Some(ARGUMENTS[0]) => None,
            other => Some(line_or_none(other.copied())),
        },
    ));
    let uprobe = texts.iter().find(|text| text.starts_with("demo: uprobe "));
    checks.push(check(
        "demo uprobe in an EL0 task: hit counter 1, registers and exit code",
        match uprobe {
            Some(line)
                if field(line, "hits=") == Some(1)
                    && field(line, "x0=") == Some(40)
                    && field(line, "x1=") == Some(2)
                    && line.ends_with("exit code 42") =>
            {
                None
            }
            other => Some(line_or_none(other.copied())),
        },
    ));

    // Part 5: the function tracer's window.
    if variant != BuildVariant::Plain {
        let rings = trace::rings(log);
        let problem = match rings.last() {
            None => Some("no ring streamed".to_string()),
            Some(ring) => {
                let functions: Vec<String> =
                    ring.records.iter().map(|record| symbols.traced_function(record.ip)).collect();
                let prefix = "kernel::demo::ftrace::traced::";
                let called_by_checksum = ring.records.iter().any(|record| {
                    symbols.traced_function(record.ip) == format!("{prefix}mix")
                        && symbols.caller(record.parent) == format!("{prefix}checksum")
                });
                if functions.len() < 5 || !functions.iter().all(|function| function.starts_with(prefix)) {
                    Some(format!("records {}", functions.join(", ")))
                } else if !called_by_checksum {
                    Some("no record of mix called by checksum".to_string())
                } else if ring.written != ring.records.len() as u64 {
                    Some(format!("{} of {} records streamed", ring.records.len(), ring.written))
                } else {
                    None
                }
            }
        };
        checks.push(check("demo function tracer: the window's calls, with their callers", problem));
    }
    // The depot: a trace saved twice is one record (not in plain: no walk there).
    let depot_problem = if !has("demo: depot: ") {
        Some("no statistics line".to_string())
    } else if variant != BuildVariant::Plain && !texts.iter().any(|text| text.ends_with("(one record)")) {
        Some("the demo's trace saved twice did not give one record".to_string())
    } else {
        None
    };
    checks.push(check("demo stack depot: one record per distinct trace, statistics", depot_problem));

    // Every cost against the bench's row for the same case.
    let rows: HashMap<_, _> = bench.iter().map(|row| (row.key(), row)).collect();
    let costs: Vec<Cost> =
        texts.iter().filter_map(|text| text.strip_prefix("demo cost: ")).filter_map(Cost::parse).collect();
    let expected_costs = match variant {
        BuildVariant::Plain => 5,
        _ => 7,
    };
    if costs.len() != expected_costs {
        checks.push(check("demo costs printed", Some(format!("{} costs, expected {expected_costs}", costs.len()))));
    }
    for cost in costs {
        let name = format!(
            "demo cost {} {} {}: within {COST_TOLERANCE} insn of the bench row",
            cost.suite, cost.case, cost.params
        );
        let problem = match rows.get(&cost.key()) {
            None => Some("no bench row for this case".to_string()),
            Some(row) if row.unit != cost.unit => Some(format!("units differ: {} vs {}", cost.unit, row.unit)),
            Some(row) if (row.value - cost.value).abs() > COST_TOLERANCE => Some(format!(
                "demo {} vs bench {} {}",
                crate::bench::number(cost.value),
                crate::bench::number(row.value),
                row.unit
            )),
            Some(_) => None,
        };
        let note = rows.get(&cost.key()).map(|row| {
            use crate::bench::number;
            format!("demo {}, bench {} {}", number(cost.value), number(row.value), row.unit)
        });
        checks.push(Check { note, ..check(name, problem) });
    }
    checks
}

/// What the boot-probe checks probe: the demo calls `heading` once per heading it prints and
/// `depot_statistics` once, in every variant.
const BOOT_PROBED: &str = "kernel::demo::depot_statistics";
const BOOT_PROBED_HEADING: &str = "kernel::demo::heading";

/// `kprobe=`/`kretprobe=` from the command line: a kprobe reports as many hits as the function
/// printed headings, a kretprobe on a function called once 1 hit, each with a cost; an unknown
/// symbol and an offset off an instruction boundary each give one line with the reason, and the
/// run still ends well.
fn boot_probe_checks(machine: &Machine, image: &build::KernelImage, expect: &str) -> Result<Vec<Check>, Failure> {
    let bootargs = format!(
        "run=demo icount=1 exit=semihosting {expect} kprobe={BOOT_PROBED_HEADING}:brk-step \
         kretprobe={BOOT_PROBED}:brk-step kprobe=no::such::function:simulate kprobe={BOOT_PROBED}+2:detour"
    );
    let run = qemu::run(machine, image, &bootargs, Some(Duration::from_secs(120)), &mut |_| {})?;
    let texts: Vec<&str> = run.log.iter().map(|line| line.text.as_str()).collect();
    let line_for = |prefix: String| texts.iter().find(|text| text.starts_with(&prefix)).copied();
    let counted = |kind: &str, function: &str, method: &str, hits: usize| {
        let prefix = format!("{kind}={function}:{method}: ");
        // The end-of-run line, not the registration line.
        match texts.iter().find(|text| text.starts_with(&prefix) && text.contains(" hits, ")) {
            Some(line) if line.starts_with(&format!("{prefix}{hits} hits, 0 missed; a {method} hit costs ")) => None,
            other => Some(format!("expected {hits} hits: {}", line_or_none(other.copied()))),
        }
    };
    // Headings printed once the probe was registered (the banner's comes before).
    let registered = format!("kprobe={BOOT_PROBED_HEADING}:brk-step: registered");
    let headings = texts
        .iter()
        .skip_while(|text| !text.starts_with(&registered))
        .filter(|text| text.starts_with("demo: == "))
        .count();
    let refused = |spec: &str, reason: &str| match line_for(format!("kprobe={spec}: not registered: ")) {
        Some(line) if line.ends_with(reason) => None,
        other => Some(line_or_none(other)),
    };
    let ended = (run.status != Some(0) || !texts.contains(&"demo: done")).then(|| run.ending.to_string());
    Ok(vec![
        check(
            "boot kprobe=: one hit per call and its cost",
            counted("kprobe", BOOT_PROBED_HEADING, "brk-step", headings),
        ),
        check(
            "boot kretprobe= on a function called once: 1 hit and its cost",
            counted("kretprobe", BOOT_PROBED, "brk-step", 1),
        ),
        check(
            "boot kprobe= on an unknown symbol says why",
            refused("no::such::function:simulate", "no such function in the kernel's symbol table"),
        ),
        check(
            "boot kprobe= off an instruction boundary says why",
            refused(&format!("{BOOT_PROBED}+2:detour"), "(A64 instructions are 4 bytes)"),
        ),
        check("boot probes: a refused request does not stop the run", ended),
    ])
}

/// The bench rows of a run's log.
fn bench_rows(log: &[LogLine]) -> Vec<Cost> {
    log.iter().filter_map(|line| Row::fields(&line.text)).filter_map(Cost::parse).collect()
}

/// `cargo xtask test`'s demo checks: per build variant, one demo run and one bench run of the
/// suites its costs come from, same kernel, same machine (virt, EL1, GICv2, the first CPU variant
/// asked for, else `max,pauth=off`), under icount. Returns the count passed and a line per failed check. The bench runs in
/// its own boot rather than the demo printing both: a figure canned or computed differently in
/// the demo could not then agree by construction.
pub fn test(variants: &[BuildVariant], cpus: &[CpuVariant], boards: &[Board]) -> Result<(u64, Vec<String>), Failure> {
    if !boards.is_empty() && !boards.contains(&Board::Virt) {
        return Ok((0, Vec::new()));
    }
    let variants = if variants.is_empty() { &BuildVariant::ALL[..] } else { variants };
    let cpu = cpus.first().copied().unwrap_or(CpuVariant::MaxNoPauth);
    let (mut passed, mut failed) = (0, Vec::new());
    for &variant in variants {
        // `mte` needs QEMU's emulated MTE (and a max CPU: the caller's, unless cortex-a72).
        let mte = variant == BuildVariant::Mte;
        let cpu = if mte && cpu == CpuVariant::CortexA72 { CpuVariant::MaxNoPauth } else { cpu };
        let machine = Machine { board: Board::Virt, cpu, el: 1, gic: 2, icount: true, dtb: None, mte, smp: 1 };
        let image = build::kernel(Board::Virt, variant)?;
        let elf =
            std::fs::read(&image.elf).map_err(|error| Failure::usage(format!("{}: {error}", image.elf.display())))?;
        let symbols = FunctionTable::from_elf(&elf).ok_or_else(|| Failure::usage("kernel ELF has no symbols"))?;
        let expect = format!("expect-pauth={}", cpu.expected_pauth());
        let timeout = Some(Duration::from_secs(120));
        let demo =
            qemu::run(&machine, &image, &format!("run=demo icount=1 exit=semihosting {expect}"), timeout, &mut |_| {})?;
        let suites = if variant == BuildVariant::Plain { "probes" } else { "stacktrace,probes" };
        let bench_args = format!("run=bench bench={suites} reps=1 clock=cycles icount=1 exit=semihosting {expect}");
        let bench = qemu::run(&machine, &image, &bench_args, timeout, &mut |_| {})?;
        println!(
            "demo checks [variant {}]: demo run {:.1} s, bench run ({suites}) {:.1} s",
            variant.name(),
            demo.elapsed.as_secs_f64(),
            bench.elapsed.as_secs_f64()
        );
        let mut checks = check_run(&demo.log, demo.status, &symbols, variant, &bench_rows(&bench.log));
        if bench.status != Some(0) {
            checks.push(check("demo's bench run", Some(format!("bench: {}", bench.ending))));
        }
        checks.extend(boot_probe_checks(&machine, &image, &expect)?);
        let mut any_failed = false;
        for check in &checks {
            let configuration = format!("{} variant {}", machine.describe(), variant.name());
            match &check.problem {
                None => {
                    let note = check.note.as_ref().map(|note| format!(" ({note})")).unwrap_or_default();
                    println!("check [{}, {configuration}]: ok{note}", check.name);
                    passed += 1;
                }
                Some(problem) => {
                    println!("check [{}, {configuration}]: FAILED: {problem}", check.name);
                    failed.push(format!("check [{}, {configuration}]", check.name));
                    any_failed = true;
                }
            }
        }
        if any_failed {
            println!("  --- demo log ---");
            for line in &demo.log {
                println!("  {line}");
            }
        }
    }
    Ok((passed, failed))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(text: &str) -> LogLine {
        LogLine::plain(text)
    }

    fn symbols() -> FunctionTable {
        FunctionTable::from_list(&[
            (0x1000, 0x1100, "kernel::demo::stacks::innermost"),
            (0x1100, 0x1200, "kernel::demo::stacks::middle"),
            (0x1200, 0x1300, "kernel::demo::stacks::outer"),
            (0x1300, 0x1400, "kernel::demo::stacks::show"),
        ])
    }

    fn stack_log(scs_middle: u64) -> Vec<LogLine> {
        vec![
            line("demo: stacks #0 fp=0x1004 scs=0x1004"),
            line(&format!("demo: stacks #1 fp=0x1104 scs={scs_middle:#x}")),
            line("demo: stacks #2 fp=0x1208 scs=0x1208"),
            line("demo: stacks #3 fp=0x130c scs=0x130c"),
            line("demo: done"),
        ]
    }

    fn problem(checks: &[Check], name: &str) -> Option<String> {
        checks.iter().find(|check| check.name.starts_with(name)).and_then(|check| check.problem.clone())
    }

    #[test]
    fn equal_traces_pass_and_a_differing_frame_fails() {
        let checks = check_run(&stack_log(0x1104), Some(0), &symbols(), BuildVariant::Prod, &[]);
        assert_eq!(problem(&checks, "demo stack traces"), None);
        let checks = check_run(&stack_log(0x1008), Some(0), &symbols(), BuildVariant::Prod, &[]);
        assert!(problem(&checks, "demo stack traces").unwrap().starts_with("frame 1 differs"));
    }

    #[test]
    fn a_cost_off_the_bench_row_fails() {
        let bench = [Cost::parse("probes kprobe-push method=simulate per_hit insn 300").unwrap()];
        let log =
            |value: &str| vec![line(&format!("demo cost: probes kprobe-push method=simulate per_hit insn {value}"))];
        let named = |checks: &[Check]| {
            checks.iter().find(|check| check.name.starts_with("demo cost probes")).map(|check| check.problem.clone())
        };
        assert_eq!(named(&check_run(&log("301.5"), Some(0), &symbols(), BuildVariant::Plain, &bench)), Some(None));
        assert!(named(&check_run(&log("303"), Some(0), &symbols(), BuildVariant::Plain, &bench)).unwrap().is_some());
        assert!(named(&check_run(&log("300"), Some(0), &symbols(), BuildVariant::Plain, &[])).unwrap().is_some());
    }

    #[test]
    fn a_probe_counter_other_than_one_fails() {
        let log = |hits: u64| {
            vec![
                line("demo: kprobe target 0x1000 (first instruction: stp x29, x30, [sp, #-16]!)"),
                line(&format!(
                    "demo: kprobe simulate hits={hits} missed=0 x0=0x1111 x1=0x2222 x2=0x3333 sp=0x0 pc=0x1000 lr=0x1104"
                )),
            ]
        };
        let symbols = FunctionTable::from_list(&[
            (0x1000, 0x1100, "bench_probe_target_push"),
            (0x1100, 0x1200, "kernel::demo::probes::call_once"),
        ]);
        let checks = check_run(&log(1), Some(0), &symbols, BuildVariant::Plain, &[]);
        assert_eq!(problem(&checks, "demo kprobe simulate"), None);
        let checks = check_run(&log(2), Some(0), &symbols, BuildVariant::Plain, &[]);
        assert!(problem(&checks, "demo kprobe simulate").is_some());
        assert!(problem(&checks, "demo kprobe detour").is_some());
    }

    #[test]
    fn side_by_side_rows_are_symbolized() {
        let mut presenter = Presenter {
            symbols: Some(symbols()),
            rings: RingReader::default(),
            graphs: function_graph::GraphReader::default(),
            style: LogStyle::Default,
        };
        assert_eq!(presenter.present(&line("demo: stacks #0 fp=0x1104 scs=0x1104")).len(), 2);
        let shown = presenter.present(&line("demo: stacks #1 fp=0x1208 scs=0x1208"));
        assert_eq!(shown.len(), 1);
        assert!(shown[0].contains("kernel::demo::stacks::outer+0x8/0x100"), "{}", shown[0]);
        assert!(!shown[0].contains("differs"));
    }
}
