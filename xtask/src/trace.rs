//! The function tracer's ring, streamed over the kernel log, written as Linux's `trace` file and
//! as Chrome/Perfetto JSON (`traceEvents`).
//!
//! The kernel sends `ftrace ring: KEPT of WRITTEN calls, HZ Hz, cpu N, task NAME-ID`, one
//! `ftrace record: TIMESTAMP IP PARENT` line per record (counter ticks, raw addresses) and
//! `ftrace ring end` (kernel/src/ftrace/tracers.rs). Over the log rather than semihosting files,
//! so a Raspberry Pi's serial line carries it too. Addresses become function names here, with
//! the ELF's symbol table.

use crate::log::{LogLine, LogStyle};
use object::{Object, ObjectSection, ObjectSymbol, SectionKind, SymbolKind};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// One function-tracer record: the traced function's entry and its caller's return address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record {
    pub timestamp: u64,
    pub ip: u64,
    pub parent: u64,
}

/// One streamed ring.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ring {
    pub records: Vec<Record>,
    /// Calls the tracer saw (more than `records.len()` when the ring wrapped).
    pub written: u64,
    /// Counter frequency: timestamps are ticks of it.
    pub hertz: u64,
    pub cpu: u32,
    /// `NAME-ID` of the task that ran the window, or `<...>-0`.
    pub task: String,
    /// CPUs online when the ring was streamed (the boot's `CPUs: N online`), Linux's `#P:`.
    pub online: u32,
}

/// Collects rings from decoded log lines as they arrive.
#[derive(Default)]
pub struct RingReader {
    current: Option<Ring>,
    /// The boot's `CPUs: N online`, once seen.
    online: Option<u32>,
}

/// What a line meant to the reader.
pub enum Fed {
    /// Not a ring line.
    Other,
    /// A ring line, kept.
    Consumed,
    /// The last line of a ring: here it is.
    Complete(Ring),
}

impl RingReader {
    pub fn feed(&mut self, text: &str) -> Fed {
        if let Some(count) = text.strip_prefix("CPUs: ").and_then(|rest| rest.strip_suffix(" online")) {
            self.online = count.parse().ok();
            return Fed::Other;
        }
        if let Some(header) = text.strip_prefix("ftrace ring: ") {
            self.current = parse_header(header);
            if let Some(ring) = self.current.as_mut() {
                ring.online = self.online.unwrap_or(1);
            }
            return Fed::Consumed;
        }
        if let Some(record) = text.strip_prefix("ftrace record: ") {
            if let (Some(ring), Some(record)) = (self.current.as_mut(), parse_record(record)) {
                ring.records.push(record);
            }
            return Fed::Consumed;
        }
        if text == "ftrace ring end" {
            return self.current.take().map_or(Fed::Consumed, Fed::Complete);
        }
        Fed::Other
    }
}

/// Every complete ring in a run's log.
pub fn rings(log: &[LogLine]) -> Vec<Ring> {
    let mut reader = RingReader::default();
    log.iter()
        .filter_map(|line| match reader.feed(&line.text) {
            Fed::Complete(ring) => Some(ring),
            _ => None,
        })
        .collect()
}

fn number(text: &str) -> Option<u64> {
    match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

/// `KEPT of WRITTEN calls, HZ Hz, cpu N, task NAME-ID`
fn parse_header(text: &str) -> Option<Ring> {
    let words: Vec<&str> = text.split_whitespace().collect();
    match words.as_slice() {
        [_, "of", written, "calls,", hertz, "Hz,", "cpu", cpu, "task", task] => Some(Ring {
            records: Vec::new(),
            written: number(written)?,
            hertz: number(hertz)?,
            cpu: cpu.trim_end_matches(',').parse().ok()?,
            task: task.to_string(),
            online: 1,
        }),
        _ => None,
    }
}

fn parse_record(text: &str) -> Option<Record> {
    let mut words = text.split_whitespace().map(number);
    Some(Record { timestamp: words.next()??, ip: words.next()??, parent: words.next()?? })
}

/// Function symbols of the kernel ELF: the function containing an address.
pub struct FunctionTable {
    /// (start, end, demangled name without hash), sorted by start.
    functions: Vec<(u64, u64, String)>,
    /// The ELF's own name of each function, in the same order (v0-mangled Rust symbols are one
    /// `[A-Za-z0-9_]` token; asm labels are their own names).
    mangled: Vec<String>,
}

impl FunctionTable {
    pub fn from_elf(elf: &[u8]) -> Option<Self> {
        let file = object::File::parse(elf).ok()?;
        // Functions, and the untyped labels asm code defines in executable sections (the
        // bench's probe targets, the boot code); not the `$x` mapping symbols.
        let in_text = |symbol: &object::Symbol| {
            symbol.section_index().and_then(|index| file.section_by_index(index).ok()).map(|section| section.kind())
                == Some(SectionKind::Text)
        };
        let mut functions: Vec<(u64, u64, String, String)> = file
            .symbols()
            .filter(|symbol| {
                symbol.kind() == SymbolKind::Text
                    || (symbol.kind() == SymbolKind::Unknown
                        && in_text(symbol)
                        && symbol.name().is_ok_and(|name| !name.is_empty() && !name.starts_with('$')))
            })
            .filter(|symbol| symbol.is_definition() || symbol.kind() == SymbolKind::Unknown)
            .filter_map(|symbol| {
                let name = symbol.name().ok()?;
                let demangled = format!("{:#}", rustc_demangle::demangle(name));
                Some((symbol.address(), symbol.size(), demangled, name.to_string()))
            })
            .collect();
        // Of aliases at one address, keep the one with a size (as the log's symbolizer does).
        functions.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        functions.dedup_by_key(|(start, _, _, _)| *start);
        // A symbol without a size (asm) reaches to the next one.
        let starts: Vec<u64> = functions.iter().map(|(start, _, _, _)| *start).collect();
        let (functions, mangled) = functions
            .into_iter()
            .enumerate()
            .map(|(index, (start, size, name, mangled))| {
                let next = starts.get(index + 1).copied().unwrap_or(u64::MAX);
                ((start, if size == 0 { next } else { start + size }, name), mangled)
            })
            .unzip();
        Some(Self { functions, mangled })
    }

    /// A table of `(start, end, ELF name)` functions.
    #[cfg(test)]
    pub fn from_list(functions: &[(u64, u64, &str)]) -> Self {
        let demangled = |name: &str| format!("{:#}", rustc_demangle::demangle(name));
        Self {
            functions: functions.iter().map(|(start, end, name)| (*start, *end, demangled(name))).collect(),
            mangled: functions.iter().map(|(_, _, name)| name.to_string()).collect(),
        }
    }

    /// The index of the function whose code holds `address`.
    fn index(&self, address: u64) -> Option<usize> {
        let index = self.functions.partition_point(|(start, _, _)| *start <= address).checked_sub(1)?;
        (address < self.functions[index].1).then_some(index)
    }

    /// The start, end and name of the function whose code holds `address`.
    pub fn extent(&self, address: u64) -> Option<(u64, u64, &str)> {
        let (start, end, name) = &self.functions[self.index(address)?];
        Some((*start, *end, name.as_str()))
    }

    /// The name of the function holding `address` as `style` prints names: demangled, or the
    /// ELF's own (mangled) name for Linux's tools.
    fn name_in(&self, address: u64, style: LogStyle) -> Option<&str> {
        let index = self.index(address)?;
        Some(match style {
            LogStyle::Default => &self.functions[index].2,
            LogStyle::Linux => &self.mangled[index],
        })
    }

    /// The function a record's `ip` is the entry of (the trampoline passes the symbol address).
    pub fn traced_function(&self, ip: u64) -> String {
        self.traced_function_in(ip, LogStyle::Default)
    }

    /// [`Self::traced_function`], named as `style` names functions.
    pub fn traced_function_in(&self, ip: u64, style: LogStyle) -> String {
        self.name_in(ip, style).map_or_else(|| format!("{ip:#x}"), str::to_string)
    }

    /// The function a return address returns into (the call is the instruction before it).
    pub fn caller(&self, return_address: u64) -> String {
        self.caller_in(return_address, LogStyle::Default)
    }

    /// [`Self::caller`], named as `style` names functions.
    pub fn caller_in(&self, return_address: u64, style: LogStyle) -> String {
        let name = return_address.checked_sub(4).and_then(|address| self.name_in(address, style));
        name.map_or_else(|| format!("{return_address:#x}"), str::to_string)
    }
}

/// `TASK-PID` split for Linux's column layout (`%16s-%-7d`).
fn task_columns(task: &str) -> (&str, &str) {
    task.rsplit_once('-').unwrap_or((task, "0"))
}

/// Linux's timestamp column (kernel/trace/trace_output.c, `trace_print_time`: `" %5lu.%06lu"`).
fn seconds(ticks: u64, hertz: u64) -> String {
    let hertz = hertz.max(1);
    let micros = (ticks as u128 * 1_000_000 / hertz as u128) as u64;
    format!(" {:>5}.{:06}", micros / 1_000_000, micros % 1_000_000)
}

/// The lines of one record in Linux's `trace` format (irq-info off), functions named as
/// `style` names them: `            TASK-PID     [CPU]  TIMESTAMP: function <-caller`.
pub fn trace_line(ring: &Ring, record: &Record, symbols: &FunctionTable, style: LogStyle) -> String {
    let (name, pid) = task_columns(&ring.task);
    format!(
        "{name:>16}-{pid:<7} [{:03}] {}: {} <-{}",
        ring.cpu,
        seconds(record.timestamp, ring.hertz),
        symbols.traced_function_in(record.ip, style),
        symbols.caller_in(record.parent, style)
    )
}

/// Linux's `trace` file for one ring (`# tracer: function`); `#P:` is the CPUs online.
pub fn trace_text(ring: &Ring, symbols: &FunctionTable, style: LogStyle) -> String {
    let mut text = String::new();
    let _ = writeln!(text, "# tracer: function\n#");
    let (kept, written, online) = (ring.records.len(), ring.written, ring.online);
    let _ = writeln!(text, "# entries-in-buffer/entries-written: {kept}/{written}   #P:{online}\n#");
    let _ = writeln!(text, "#           TASK-PID     CPU#     TIMESTAMP  FUNCTION");
    let _ = writeln!(text, "#              | |         |         |         |");
    for record in &ring.records {
        let _ = writeln!(text, "{}", trace_line(ring, record, symbols, style));
    }
    text
}

/// Chrome trace-event JSON (what Perfetto's UI opens): one instant event per traced call, its
/// caller in `args`. Timestamps in microseconds.
pub fn trace_json(ring: &Ring, symbols: &FunctionTable) -> String {
    let (name, pid) = task_columns(&ring.task);
    let pid: u64 = pid.parse().unwrap_or(0);
    let hertz = ring.hertz.max(1) as f64;
    let events: Vec<serde_json::Value> = ring
        .records
        .iter()
        .map(|record| {
            serde_json::json!({
                "name": symbols.traced_function(record.ip),
                "cat": "function",
                "ph": "i",
                "s": "t",
                "ts": record.timestamp as f64 * 1e6 / hertz,
                "pid": pid,
                "tid": ring.cpu,
                "args": { "caller": symbols.caller(record.parent), "ip": format!("{:#x}", record.ip) },
            })
        })
        .collect();
    let metadata = [
        serde_json::json!({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}}),
        serde_json::json!({"name": "thread_name", "ph": "M", "pid": pid, "tid": ring.cpu,
            "args": {"name": format!("cpu {}", ring.cpu)}}),
    ];
    let document = serde_json::json!({
        "traceEvents": metadata.into_iter().chain(events).collect::<Vec<_>>(),
        "displayTimeUnit": "ns",
        "otherData": { "tracer": "function", "entries": ring.records.len(), "written": ring.written },
    });
    serde_json::to_string_pretty(&document).unwrap_or_default()
}

/// Where the trace files go: `target/trace/` of the workspace (or `CARGO_TARGET_DIR`).
pub fn output_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::build::workspace_root().join("target"))
        .join("trace")
}

/// Writes the last ring of a run as `trace.txt` (names as `style` prints them) and `trace.json`
/// in `dir`; returns the paths.
pub fn write(ring: &Ring, symbols: &FunctionTable, style: LogStyle, dir: &Path) -> std::io::Result<[PathBuf; 2]> {
    std::fs::create_dir_all(dir)?;
    // Two traced runs write one directory: one after the other, each file whole.
    let _lock = crate::atomic::lock_dir(dir, "trace output")?;
    let text = dir.join("trace.txt");
    let json = dir.join("trace.json");
    crate::atomic::write(&text, trace_text(ring, symbols, style).as_bytes())?;
    crate::atomic::write(&json, trace_json(ring, symbols).as_bytes())?;
    Ok([text, json])
}

#[cfg(test)]
mod tests {
    use super::*;

    // Rust's v0 mangling of `kernel::demo::caller`, `::traced` and `::other`.
    const CALLER: &str = "_RNvNtCs1a2b3c_6kernel4demo6caller";
    const TRACED: &str = "_RNvNtCs1a2b3c_6kernel4demo6traced";
    const OTHER: &str = "_RNvNtCs1a2b3c_6kernel4demo5other";

    fn symbols() -> FunctionTable {
        FunctionTable::from_list(&[(0x1000, 0x1040, CALLER), (0x1048, 0x1080, TRACED), (0x1088, 0x10c0, OTHER)])
    }

    fn ring() -> Ring {
        let mut reader = RingReader::default();
        let lines = [
            "CPUs: 4 online",
            "ftrace ring: 2 of 5 calls, 62500000 Hz, cpu 0, task boot-0",
            "ftrace record: 62500000 0x1048 0x1014",
            "ftrace record: 125000001 0x1088 0x1050",
            "ftrace ring end",
        ];
        let mut complete = None;
        for line in lines {
            if let Fed::Complete(ring) = reader.feed(line) {
                complete = Some(ring);
            }
        }
        complete.expect("a complete ring")
    }

    #[test]
    fn reader_collects_a_whole_ring() {
        let ring = ring();
        assert_eq!(ring.written, 5);
        assert_eq!(ring.hertz, 62_500_000);
        assert_eq!(ring.task, "boot-0");
        assert_eq!(ring.online, 4);
        assert_eq!(
            ring.records,
            [
                Record { timestamp: 62_500_000, ip: 0x1048, parent: 0x1014 },
                Record { timestamp: 125_000_001, ip: 0x1088, parent: 0x1050 },
            ]
        );
    }

    #[test]
    fn reader_ignores_other_lines_and_an_unterminated_ring() {
        let mut reader = RingReader::default();
        assert!(matches!(reader.feed("tracelab: exit status 0"), Fed::Other));
        assert!(matches!(reader.feed("ftrace ring: 1 of 1 calls, 10 Hz, cpu 0, task x-1"), Fed::Consumed));
        assert!(matches!(reader.feed("ftrace record: 1 0x10 0x20"), Fed::Consumed));
        let log: Vec<LogLine> = ["ftrace ring: 1 of 1 calls, 10 Hz, cpu 0, task x-1", "ftrace record: 1 0x10 0x20"]
            .iter()
            .map(|text| LogLine::plain(*text))
            .collect();
        assert!(rings(&log).is_empty());
    }

    #[test]
    fn text_is_linux_trace_format() {
        let text = trace_text(&ring(), &symbols(), LogStyle::Default);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "# tracer: function");
        assert!(lines.contains(&"# entries-in-buffer/entries-written: 2/5   #P:4"));
        // The timestamp column as Linux's: `[%03d] ` then ` %5lu.%06lu`.
        assert_eq!(
            lines[6],
            "            boot-0       [000]      1.000000: kernel::demo::traced <-kernel::demo::caller"
        );
        assert_eq!(
            lines[7],
            "            boot-0       [000]      2.000000: kernel::demo::other <-kernel::demo::traced"
        );
        assert_eq!(lines.len(), 8);
        // In Linux's shape the names are the ELF's, one token each.
        let text = trace_text(&ring(), &symbols(), LogStyle::Linux);
        assert_eq!(
            text.lines().nth(6),
            Some(format!("            boot-0       [000]      1.000000: {TRACED} <-{CALLER}").as_str())
        );
    }

    #[test]
    fn json_is_trace_events() {
        let json: serde_json::Value = serde_json::from_str(&trace_json(&ring(), &symbols())).unwrap();
        let events = json["traceEvents"].as_array().unwrap();
        let calls: Vec<_> = events.iter().filter(|event| event["ph"] == "i").collect();
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0]["name"], "kernel::demo::traced");
        assert_eq!(calls[0]["args"]["caller"], "kernel::demo::caller");
        assert!((calls[1]["ts"].as_f64().unwrap() - 2_000_000.016).abs() < 1e-6);
        assert!(events.iter().any(|event| event["ph"] == "M" && event["args"]["name"] == "boot"));
    }

    #[test]
    fn unknown_addresses_stay_numeric() {
        let symbols = symbols();
        assert_eq!(symbols.traced_function(0x9000), "0x9000");
        assert_eq!(symbols.caller(0x1040), "kernel::demo::caller");
        assert_eq!(symbols.caller(0x1045 + 0x100), "0x1145");
        assert_eq!(symbols.caller_in(0x1040, LogStyle::Linux), CALLER);
    }
}
