//! The function-graph tracer's events, streamed over the kernel log, written as Linux's
//! `function_graph` trace (`CPU) duration | func() {`).
//!
//! The kernel sends `ftrace graph: N cpus, UNIT, O overflows`, then per CPU with events
//! `ftrace graph cpu: CPU KEPT of WRITTEN events`, one `ftrace graph entry: TIME FUNCTION DEPTH`
//! or `ftrace graph exit: TIME FUNCTION DEPTH ENTRY_TIME` line per event, and `ftrace graph end`
//! (kernel/src/ftrace/graph.rs). TIME is the cycle counter: instructions under `-icount
//! shift=0`, where one instruction is one virtual nanosecond, and virtual nanoseconds under TCG
//! otherwise; either way the durations print as Linux prints nanoseconds, in microseconds, and
//! the header says which.
//!
//! The layout is Linux's `kernel/trace/trace_functions_graph.c` with its default options
//! (`funcgraph-cpu`, `funcgraph-overhead`, `funcgraph-duration`): an entry followed on its CPU by
//! its own exit is a leaf, `func();` with the duration; any other entry opens `func() {`, closed
//! by `}` with the duration; an exit whose entry the ring no longer holds prints
//! `} /* func */`. Two spaces of indent per depth.

use crate::log::LogStyle;
use crate::trace::FunctionTable;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// One recorded event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    pub time: u64,
    pub function: u64,
    pub depth: u64,
    /// `Some(entry time)` for an exit.
    pub exit: Option<u64>,
}

/// One CPU's kept events, oldest first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuEvents {
    pub cpu: u32,
    /// Events the CPU recorded (more than `events.len()` when its ring wrapped).
    pub written: u64,
    pub events: Vec<Event>,
}

/// One streamed graph trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Graph {
    /// CPUs online (Linux's `#P:`).
    pub online: u32,
    /// `insn` (icount) or `ns`.
    pub unit: String,
    /// Calls not traced because a return stack was full.
    pub overflows: u64,
    pub cpus: Vec<CpuEvents>,
}

/// Collects a graph trace from decoded log lines as they arrive.
#[derive(Default)]
pub struct GraphReader {
    current: Option<Graph>,
}

/// What a line meant to the reader.
pub enum Fed {
    /// Not a graph line.
    Other,
    /// A graph line, kept.
    Consumed,
    /// The last line of a trace: here it is.
    Complete(Graph),
}

fn number(text: &str) -> Option<u64> {
    match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

impl GraphReader {
    pub fn feed(&mut self, text: &str) -> Fed {
        let Some(rest) = text.strip_prefix("ftrace graph") else { return Fed::Other };
        if rest == " end" {
            return self.current.take().map_or(Fed::Consumed, Fed::Complete);
        }
        if let Some(header) = rest.strip_prefix(": ") {
            self.current = parse_header(header);
            return Fed::Consumed;
        }
        let Some(graph) = self.current.as_mut() else { return Fed::Other };
        if let Some(cpu) = rest.strip_prefix(" cpu: ") {
            let words: Vec<&str> = cpu.split_whitespace().collect();
            if let [cpu, _, "of", written, "events"] = words.as_slice()
                && let (Some(cpu), Some(written)) = (number(cpu), number(written))
            {
                graph.cpus.push(CpuEvents { cpu: cpu as u32, written, events: Vec::new() });
            }
            return Fed::Consumed;
        }
        let (words, exit) = match (rest.strip_prefix(" entry: "), rest.strip_prefix(" exit: ")) {
            (Some(words), _) => (words, false),
            (_, Some(words)) => (words, true),
            _ => return Fed::Other,
        };
        let values: Vec<u64> = words.split_whitespace().filter_map(number).collect();
        let event = match (values.as_slice(), exit) {
            ([time, function, depth], false) => Event { time: *time, function: *function, depth: *depth, exit: None },
            ([time, function, depth, entry], true) => {
                Event { time: *time, function: *function, depth: *depth, exit: Some(*entry) }
            }
            _ => return Fed::Consumed,
        };
        if let Some(cpu) = graph.cpus.last_mut() {
            cpu.events.push(event);
        }
        Fed::Consumed
    }
}

/// `N cpus, UNIT, O overflows`
fn parse_header(text: &str) -> Option<Graph> {
    let words: Vec<&str> = text.split_whitespace().collect();
    match words.as_slice() {
        [online, "cpus,", unit, overflows, "overflows"] => Some(Graph {
            online: number(online)? as u32,
            unit: unit.trim_end_matches(',').to_string(),
            overflows: number(overflows)?,
            cpus: Vec::new(),
        }),
        _ => None,
    }
}

/// Linux's overhead mark (`trace_find_mark`): how long the call took, at a glance.
fn mark(nanoseconds: u64) -> char {
    match nanoseconds {
        d if d > 1_000_000_000 => '$',
        d if d > 100_000_000 => '@',
        d if d > 10_000_000 => '*',
        d if d > 1_000_000 => '#',
        d if d > 100_000 => '!',
        d if d > 10_000 => '+',
        _ => ' ',
    }
}

/// Linux's duration column (`print_graph_duration` with `trace_print_graph_duration`): the mark,
/// microseconds with up to three decimals (seven digits at most), ` us `, padded, `|  `.
fn duration(nanoseconds: u64) -> String {
    let micros = (nanoseconds / 1000).to_string();
    let mut text = format!("{} {micros}", mark(nanoseconds));
    let mut length = micros.len();
    if length < 7 {
        let decimals = format!("{:03}", nanoseconds % 1000);
        let decimals = &decimals[..decimals.len().min(7 - length)];
        let _ = write!(text, ".{decimals}");
        length += decimals.len() + 1;
    }
    text.push_str(" us ");
    text.extend(std::iter::repeat_n(' ', 8usize.saturating_sub(length)));
    text + "|  "
}

/// The empty duration column of an opening line (`FLAGS_FILL_FULL`).
const NO_DURATION: &str = "              |  ";

/// Linux's `function_graph` trace: the header (with the kept and written events, `#P:` the CPUs
/// online, and what a duration counts), then the events of all CPUs in time order.
pub fn graph_text(graph: &Graph, symbols: &FunctionTable, style: LogStyle) -> String {
    let mut text = String::new();
    let kept: usize = graph.cpus.iter().map(|cpu| cpu.events.len()).sum();
    let written: u64 = graph.cpus.iter().map(|cpu| cpu.written).sum();
    let _ = writeln!(text, "# tracer: function_graph\n#");
    let _ = writeln!(text, "# entries-in-buffer/entries-written: {kept}/{written}   #P:{}", graph.online);
    let clock = match graph.unit.as_str() {
        "insn" => "instructions (QEMU -icount shift=0: one instruction is one virtual ns), shown as us",
        _ => "virtual ns of QEMU's TCG emulation (not hardware time), shown as us",
    };
    let _ = writeln!(text, "# DURATION counts {clock}");
    if graph.overflows > 0 {
        let _ = writeln!(text, "# {} calls not traced: their return stack was full", graph.overflows);
    }
    let _ = writeln!(text, "#\n# CPU  DURATION                  FUNCTION CALLS");
    let _ = writeln!(text, "# |     |   |                     |   |   |   |");
    for line in graph_lines(graph, symbols, style) {
        let _ = writeln!(text, "{line}");
    }
    text
}

/// The event lines, CPUs merged by time (a CPU's events stay in their order).
pub fn graph_lines(graph: &Graph, symbols: &FunctionTable, style: LogStyle) -> Vec<String> {
    let mut order: Vec<(u64, usize, usize)> = graph
        .cpus
        .iter()
        .enumerate()
        .flat_map(|(cpu, events)| events.events.iter().enumerate().map(move |(index, event)| (event.time, cpu, index)))
        .collect();
    order.sort();
    // An exit already printed as the end of a leaf line.
    let mut consumed = vec![Vec::new(); graph.cpus.len()];
    for (cpu, events) in graph.cpus.iter().enumerate() {
        consumed[cpu] = vec![false; events.events.len()];
    }
    // Functions whose entry line was printed and not yet closed, per CPU and depth.
    let mut open: Vec<Vec<u64>> = vec![Vec::new(); graph.cpus.len()];
    let mut lines = Vec::new();
    for (_, cpu, index) in order {
        if consumed[cpu][index] {
            continue;
        }
        let events = &graph.cpus[cpu].events;
        let event = events[index];
        let prefix = format!(" {}) ", graph.cpus[cpu].cpu);
        let indent = "  ".repeat(event.depth as usize);
        let name = symbols.traced_function_in(event.function, style);
        match event.exit {
            None => match events.get(index + 1) {
                Some(next) if next.exit.is_some() && next.function == event.function && next.depth == event.depth => {
                    consumed[cpu][index + 1] = true;
                    lines.push(format!("{prefix}{}{indent}{name}();", duration(next.time - event.time)));
                }
                _ => {
                    open[cpu].push(event.function);
                    lines.push(format!("{prefix}{NO_DURATION}{indent}{name}() {{"));
                }
            },
            Some(entry_time) => {
                let matched = open[cpu].last() == Some(&event.function);
                let close = if matched {
                    open[cpu].pop();
                    "}".to_string()
                } else {
                    format!("}} /* {name} */")
                };
                lines.push(format!("{prefix}{}{indent}{close}", duration(event.time.saturating_sub(entry_time))));
            }
        }
    }
    lines
}

/// Where the graph trace goes: `function_graph.txt` beside the function tracer's files.
pub fn write(graph: &Graph, symbols: &FunctionTable, style: LogStyle, dir: &Path) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let _lock = crate::atomic::lock_dir(dir, "trace output")?;
    let path = dir.join("function_graph.txt");
    crate::atomic::write(&path, graph_text(graph, symbols, style).as_bytes())?;
    Ok(path)
}

/// Checks `--ftrace-graph PATTERN` before anything builds: one kernel command-line word of a
/// function-name glob (`*`, `?`), not empty.
pub fn check_pattern(pattern: &str) -> Result<(), String> {
    if pattern.is_empty() {
        return Err("--ftrace-graph: the pattern is empty (e.g. `kernel::task::*`)".into());
    }
    if let Some(bad) = pattern.chars().find(|c| c.is_whitespace() || c.is_control() || *c == '=') {
        return Err(format!(
            "--ftrace-graph {pattern:?}: {bad:?} cannot be in a function-name pattern (one kernel command-line word)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use regex::Regex;

    // Rust's v0 mangling of `kernel::demo::outer`, `::inner` and `::leaf`.
    const OUTER: &str = "_RNvNtCs1a2b3c_6kernel4demo5outer";
    const INNER: &str = "_RNvNtCs1a2b3c_6kernel4demo5inner";
    const LEAF: &str = "_RNvNtCs1a2b3c_6kernel4demo4leaf";

    /// Captured from the kernel: the header and the last 40 lines of
    /// `cargo xtask qemu --log linux --ftrace-graph 'kernel::demo::*'`'s
    /// target/trace/function_graph.txt (`(head -7; tail -40) < target/trace/function_graph.txt`).
    const FIXTURE: &str = include_str!("../fixtures/linux/function_graph.txt");

    fn symbols() -> FunctionTable {
        FunctionTable::from_list(&[(0x1000, 0x1040, OUTER), (0x1048, 0x1080, INNER), (0x1088, 0x10c0, LEAF)])
    }

    fn graph(lines: &[&str]) -> Graph {
        let mut reader = GraphReader::default();
        let mut complete = None;
        for line in lines {
            if let Fed::Complete(graph) = reader.feed(line) {
                complete = Some(graph);
            }
        }
        complete.expect("a complete graph")
    }

    /// outer { inner { leaf(); } leaf(); } on CPU 0, then an exit of `inner` on CPU 1 whose entry
    /// the ring lost.
    fn sample() -> Graph {
        graph(&[
            "ftrace graph: 2 cpus, ns, 0 overflows",
            "ftrace graph cpu: 0 8 of 8 events",
            "ftrace graph entry: 1000 0x1000 0",
            "ftrace graph entry: 1100 0x1048 1",
            "ftrace graph entry: 1200 0x1088 2",
            "ftrace graph exit: 1617 0x1088 2 1200",
            "ftrace graph exit: 1700 0x1048 1 1100",
            "ftrace graph entry: 1800 0x1088 1",
            "ftrace graph exit: 13000 0x1088 1 1800",
            "ftrace graph exit: 123456789 0x1000 0 1000",
            "ftrace graph cpu: 1 1 of 3 events",
            "ftrace graph exit: 1650 0x1048 0 900",
            "ftrace graph end",
        ])
    }

    #[test]
    fn reader_collects_every_cpu() {
        let graph = sample();
        assert_eq!((graph.online, graph.unit.as_str(), graph.overflows), (2, "ns", 0));
        assert_eq!(graph.cpus.len(), 2);
        assert_eq!(graph.cpus[0].events.len(), 8);
        assert_eq!(graph.cpus[1].written, 3);
        assert_eq!(graph.cpus[1].events[0], Event { time: 1650, function: 0x1048, depth: 0, exit: Some(900) });
    }

    #[test]
    fn lines_are_linux_function_graph() {
        let lines = graph_lines(&sample(), &symbols(), LogStyle::Default);
        assert_eq!(
            lines,
            [
                " 0)               |  kernel::demo::outer() {",
                " 0)               |    kernel::demo::inner() {",
                " 0)   0.417 us    |      kernel::demo::leaf();",
                " 1)   0.750 us    |  } /* kernel::demo::inner */",
                " 0)   0.600 us    |    }",
                " 0) + 11.200 us   |    kernel::demo::leaf();",
                " 0) @ 123455.7 us |  }",
            ]
        );
    }

    #[test]
    fn durations_follow_trace_print_graph_duration() {
        assert_eq!(duration(0), "  0.000 us    |  ");
        assert_eq!(duration(999_999), "! 999.999 us  |  ");
        assert_eq!(duration(1_234_567_890), "$ 1234567 us  |  ");
        assert_eq!(duration(12_345_678), "* 12345.67 us |  ");
    }

    #[test]
    fn header_says_cpus_and_unit() {
        let text = graph_text(&sample(), &symbols(), LogStyle::Linux);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "# tracer: function_graph");
        assert!(lines.contains(&"# entries-in-buffer/entries-written: 9/11   #P:2"));
        assert!(lines.iter().any(|line| line.contains("virtual ns")));
        assert!(lines.contains(&"# CPU  DURATION                  FUNCTION CALLS"));
        assert!(lines.contains(&"# |     |   |                     |   |   |   |"));
        // Linux's names are the ELF's: one token each.
        assert!(lines.contains(&format!(" 0)               |  {OUTER}() {{").as_str()));
    }

    /// Every line of a function_graph trace, as trace_functions_graph.c prints it with the
    /// default options: ` CPU) `, then the duration column (mark, `N.NNN us`, padding, `|  `) or
    /// its fill, then two spaces per depth and `func() {`, `func();`, `}` or `} /* func */`.
    fn line_pattern() -> Regex {
        Regex::new(
            r"^ \d+\) (?:[ +!#*@$] [0-9]+(?:\.[0-9]+)? us +\|  |              \|  )(?:  )*(?:\S.*\(\) \{|\S.*\(\);|\}(?: /\* \S.* \*/)?)$",
        )
        .unwrap()
    }

    #[test]
    fn fixture_has_the_shape_of_linux_function_graph() {
        let pattern = line_pattern();
        let mut events = 0;
        for line in FIXTURE.lines().skip_while(|line| line.starts_with('#')) {
            assert!(pattern.is_match(line), "not a function_graph line: {line:?}");
            // The column widths hold whatever the duration: `|` at the same place on every line.
            assert_eq!(line.find('|'), Some(18), "{line:?}");
            events += 1;
        }
        assert!(events > 0, "the fixture has event lines");
        assert!(FIXTURE.starts_with("# tracer: function_graph\n"));
        assert!(FIXTURE.lines().any(|line| line.contains("#P:")));
        assert!(FIXTURE.lines().any(|line| line.starts_with("# DURATION counts ")));
        // Leaves and returns both appear: the tracer saw returns, not only entries (the ring's
        // oldest events are gone, so some returns name their function).
        assert!(FIXTURE.lines().any(|line| line.ends_with("();")));
        assert!(FIXTURE.lines().any(|line| line.contains("} /* ")));
    }

    #[test]
    fn sample_lines_match_the_pattern() {
        let pattern = line_pattern();
        for line in graph_lines(&sample(), &symbols(), LogStyle::Default) {
            assert!(pattern.is_match(&line), "{line:?}");
        }
    }

    #[test]
    fn patterns_are_checked_before_a_build() {
        assert!(check_pattern("kernel::task::*").is_ok());
        assert!(check_pattern("").is_err());
        assert!(check_pattern("kernel::a b").is_err());
        assert!(check_pattern("a=b").is_err());
    }
}
