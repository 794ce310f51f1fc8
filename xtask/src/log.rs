//! The kernel log: defmt frames from the serial stream, decoded and symbolized with the kernel ELF.

use crate::Failure;
use defmt_decoder::{DecodeError, Table};
use std::fmt;

/// The status in the kernel's final line `tracelab: exit status N`.
pub fn exit_sentinel(line: &str) -> Option<i32> {
    line.strip_prefix("tracelab: exit status ")?.trim().parse().ok()
}

#[derive(Clone, Debug)]
pub struct LogLine {
    pub level: Option<defmt_parser::Level>,
    /// Seconds since the kernel's counter started (`S.UUUUUU`), from the record's defmt timestamp.
    pub timestamp: Option<String>,
    pub text: String,
}

impl fmt::Display for LogLine {
    /// dmesg's shape: `[    1.234567] text`, with `WARN `/`ERROR` before warnings and errors.
    /// The timestamp column has a fixed width, so a KTAP parser that strips the prefix of its
    /// `KTAP version 1` line from every line reads the results.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use defmt_parser::Level;
        if let Some(timestamp) = &self.timestamp {
            write!(f, "[{timestamp:>12}] ")?;
        }
        match self.level {
            Some(Level::Warn) => write!(f, "WARN  {}", self.text),
            Some(Level::Error) => write!(f, "ERROR {}", self.text),
            _ => write!(f, "{}", self.text),
        }
    }
}

/// Decodes a byte stream into log lines; bytes that do not form a frame are reported once.
/// Backtrace lines (`fp #N 0x...`, `scs #N 0x...`) are symbolized in place (see `Frame`).
pub struct KernelLog {
    table: &'static Table,
    decoder: Box<dyn defmt_decoder::StreamDecoder + Send + Sync + 'static>,
    lines: Vec<LogLine>,
    symbolizer: Option<Symbolizer>,
}

/// One symbolized code address, printed the way Linux prints a backtrace entry:
/// `FUNCTION+0xOFF/0xSIZE`, then the address and the source line (`file:line`), and the
/// inlined function the line belongs to when it is not FUNCTION itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub address: u64,
    /// The ELF function symbol holding the address, demangled without its hash.
    pub function: String,
    /// `address` minus the function's start.
    pub offset: u64,
    /// The function's size in bytes.
    pub size: u64,
    /// `file:line` of the instruction, paths shortened to what follows `/src/`.
    pub location: Option<String>,
    /// The innermost inlined function at that line, when it differs from `function`.
    pub inlined: Option<String>,
}

impl Frame {
    /// `FUNCTION+0xOFF/0xSIZE`, as in Linux's backtraces and `%pS`.
    pub fn symbol(&self) -> String {
        format!("{}+{:#x}/{:#x}", self.function, self.offset, self.size)
    }
}

impl fmt::Display for Frame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {:#x}", self.symbol(), self.address)?;
        if let Some(location) = &self.location {
            write!(f, " {location}")?;
        }
        if let Some(inlined) = &self.inlined {
            write!(f, " (inlined {inlined})")?;
        }
        Ok(())
    }
}

/// A function symbol: start address, size, demangled name.
#[derive(Clone, Debug)]
struct FunctionSymbol {
    start: u64,
    size: u64,
    name: String,
}

/// The kernel ELF's function symbols (for FUNCTION+OFF/SIZE) and its DWARF line tables.
pub struct Symbolizer {
    /// Sorted by start address.
    functions: Vec<FunctionSymbol>,
    lines: Option<addr2line::Loader>,
}

impl Symbolizer {
    pub fn new(elf_path: &std::path::Path) -> Option<Self> {
        let data = std::fs::read(elf_path).ok()?;
        let file = object::File::parse(&*data).ok()?;
        let functions = function_symbols(&file);
        Some(Self { functions, lines: addr2line::Loader::new(elf_path).ok() })
    }

    #[cfg(test)]
    fn from_symbols(symbols: &[(u64, u64, &str)]) -> Self {
        let mut functions: Vec<_> =
            symbols.iter().map(|&(start, size, name)| FunctionSymbol { start, size, name: name.to_string() }).collect();
        functions.sort_by_key(|symbol| symbol.start);
        Self { functions, lines: None }
    }

    /// The function holding `address`: the last symbol starting at or before it whose extent
    /// covers it.
    fn function_at(&self, address: u64) -> Option<&FunctionSymbol> {
        let index = self.functions.partition_point(|symbol| symbol.start <= address).checked_sub(1)?;
        let symbol = &self.functions[index];
        (address < symbol.start + symbol.size.max(1)).then_some(symbol)
    }

    /// The frame of a return address. The function and line are those of the call instruction
    /// before it (a call may be a function's last instruction), the offset that of the return
    /// address itself, as Linux prints it.
    pub fn return_address(&self, address: u64) -> Option<Frame> {
        self.frame(address, address.checked_sub(4)?)
    }

    fn frame(&self, address: u64, lookup: u64) -> Option<Frame> {
        let symbol = self.function_at(lookup)?;
        let (location, innermost) = self.line_of(lookup);
        let inlined = innermost.filter(|inner| *inner != symbol.name);
        Some(Frame {
            address,
            function: symbol.name.clone(),
            offset: address - symbol.start,
            size: symbol.size,
            location,
            inlined,
        })
    }

    /// The innermost `file:line` at `address` and the (inlined) function it belongs to.
    fn line_of(&self, address: u64) -> (Option<String>, Option<String>) {
        let Some(mut frames) = self.lines.as_ref().and_then(|loader| loader.find_frames(address).ok()) else {
            return (None, None);
        };
        let Ok(Some(frame)) = frames.next() else { return (None, None) };
        let function = frame.function.as_ref().and_then(|name| name.demangle().ok().map(|name| name.into_owned()));
        let location = frame.location.map(|location| {
            let file = location.file.unwrap_or("?");
            let file = file.rsplit_once("/src/").map_or(file, |(_, tail)| tail);
            format!("{file}:{}", location.line.unwrap_or(0))
        });
        (location, function)
    }

    /// Rewrites a backtrace line (`  fp #N 0xADDR`, `  scs #N 0xADDR`) as
    /// `  fp #N FUNCTION+0xOFF/0xSIZE 0xADDR file:line`, and appends `function <- caller` to a
    /// function-tracer record (`ftrace #N t=TICKS ip=0x.. parent=0x..`).
    fn annotate(&self, text: &str) -> Option<String> {
        if let Some(record) = text.strip_prefix("ftrace #") {
            let field = |name: &str| {
                let value = record.split_whitespace().find_map(|word| word.strip_prefix(name))?;
                u64::from_str_radix(value.strip_prefix("0x")?, 16).ok()
            };
            let (ip, parent) = (field("ip=")?, field("parent=")?);
            // The record's ip is the call site in the patchable entry, before the symbol.
            let function = self.return_address(ip + 4)?.function;
            let caller = self.return_address(parent).map_or_else(|| "?".into(), |frame| frame.symbol());
            return Some(format!("{text} {function} <- {caller}"));
        }
        let indent = &text[..text.len() - text.trim_start().len()];
        let mut words = text.split_whitespace();
        let label = words.next()?;
        let index = words.next()?;
        let address = words.next()?;
        if !matches!(label, "fp" | "scs") || !index.starts_with('#') || words.next().is_some() {
            return None;
        }
        let address = u64::from_str_radix(address.strip_prefix("0x")?, 16).ok()?;
        let frame = self.return_address(address)?;
        Some(format!("{indent}{label} {index} {frame}"))
    }
}

/// The defined function symbols of `file`, demangled without hashes, sorted by address. defmt's
/// interned strings are symbols too (names with spaces and `=`): not code, left out.
fn function_symbols(file: &object::File) -> Vec<FunctionSymbol> {
    use object::{Object, ObjectSymbol, SymbolKind};
    let mut functions: Vec<FunctionSymbol> = file
        .symbols()
        .filter(|symbol| symbol.kind() == SymbolKind::Text && symbol.is_definition())
        .filter_map(|symbol| {
            let name = symbol.name().ok()?;
            (!name.contains(' ') && !name.contains('=')).then(|| FunctionSymbol {
                start: symbol.address(),
                size: symbol.size(),
                name: format!("{:#}", rustc_demangle::demangle(name)),
            })
        })
        .collect();
    // Of aliases at one address, keep the one with a size.
    functions.sort_by(|a, b| a.start.cmp(&b.start).then(b.size.cmp(&a.size)));
    functions.dedup_by_key(|symbol| symbol.start);
    functions
}

impl KernelLog {
    /// A decoder that also symbolizes backtraces with the ELF at `elf_path`.
    pub fn with_symbols(elf: &[u8], elf_path: &std::path::Path) -> Result<Self, Failure> {
        let mut log = Self::new(elf)?;
        log.symbolizer = Symbolizer::new(elf_path);
        Ok(log)
    }

    pub fn new(elf: &[u8]) -> Result<Self, Failure> {
        let table = Table::parse(elf)
            .map_err(|error| Failure::usage(format!("kernel ELF has a bad defmt table: {error}")))?
            .ok_or_else(|| Failure::usage("kernel ELF has no defmt table"))?;
        // The decoder borrows the table; one table per QEMU run, so leaking it is bounded.
        let table: &'static Table = Box::leak(Box::new(table));
        Ok(Self { table, decoder: table.new_stream_decoder(), lines: Vec::new(), symbolizer: None })
    }

    /// Feeds received bytes; returns the lines completed by them.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<LogLine> {
        self.decoder.received(bytes);
        let mut new = Vec::new();
        loop {
            match self.decoder.decode() {
                Ok(frame) => {
                    let text = frame.display_message().to_string();
                    let text =
                        self.symbolizer.as_ref().and_then(|symbolizer| symbolizer.annotate(&text)).unwrap_or(text);
                    let timestamp = frame.display_timestamp().map(|timestamp| timestamp.to_string());
                    new.push(LogLine { level: frame.level(), timestamp, text })
                }
                Err(DecodeError::UnexpectedEof) => break,
                Err(DecodeError::Malformed) if self.table.encoding().can_recover() => new.push(LogLine {
                    level: None,
                    timestamp: None,
                    text: "[xtask: malformed defmt frame skipped]".into(),
                }),
                Err(DecodeError::Malformed) => break,
            }
        }
        self.lines.extend(new.iter().cloned());
        new
    }

    pub fn into_lines(self) -> Vec<LogLine> {
        self.lines
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn symbolizer() -> Symbolizer {
        Symbolizer::from_symbols(&[
            (0xffff_0000_4008_0000, 0x120, "kernel::kernel_main"),
            (0xffff_0000_4008_0120, 0x40, "kernel::stacktrace::walk"),
            (0xffff_0000_4008_0200, 0x10, "kernel::tests::ftrace::traced_leaf"),
        ])
    }

    #[test]
    fn backtrace_lines_take_linux_shape() {
        let symbolizer = symbolizer();
        assert_eq!(
            symbolizer.annotate("  fp #3 0xffff000040080034").as_deref(),
            Some("  fp #3 kernel::kernel_main+0x34/0x120 0xffff000040080034")
        );
        assert_eq!(
            symbolizer.annotate("scs #0 0xffff000040080130").as_deref(),
            Some("scs #0 kernel::stacktrace::walk+0x10/0x40 0xffff000040080130")
        );
        // A return address just past a function that ends in a call (a `-> !` call) belongs to
        // that function: the lookup uses the call instruction.
        let end = symbolizer.return_address(0xffff_0000_4008_0120).unwrap();
        assert_eq!(end.symbol(), "kernel::kernel_main+0x120/0x120");
        // Outside every function, and lines that are not backtraces, stay as they are.
        assert_eq!(symbolizer.annotate("  fp #4 0x10"), None);
        assert_eq!(symbolizer.annotate("fp #1 0xffff000040080034 extra"), None);
        assert_eq!(symbolizer.annotate("kp #1 0xffff000040080034"), None);
    }

    #[test]
    fn frame_display_puts_address_and_line_after_the_symbol() {
        let frame = Frame {
            address: 0xffff_0000_4008_0034,
            function: "kernel::kernel_main".into(),
            offset: 0x34,
            size: 0x120,
            location: Some("main.rs:105".into()),
            inlined: Some("kernel::boot::finish".into()),
        };
        assert_eq!(
            frame.to_string(),
            "kernel::kernel_main+0x34/0x120 0xffff000040080034 main.rs:105 (inlined kernel::boot::finish)"
        );
    }

    #[test]
    fn ftrace_records_name_function_and_caller() {
        let text = "ftrace #2 t=100 ip=0xffff000040080204 parent=0xffff000040080048";
        assert_eq!(
            symbolizer().annotate(text).unwrap(),
            format!("{text} kernel::tests::ftrace::traced_leaf <- kernel::kernel_main+0x48/0x120")
        );
    }

    #[test]
    fn log_lines_show_their_timestamp_like_dmesg() {
        let line =
            LogLine { level: Some(defmt_parser::Level::Error), timestamp: Some("1.234567".into()), text: "x".into() };
        assert_eq!(line.to_string(), "[    1.234567] ERROR x");
        let line = LogLine { level: Some(defmt_parser::Level::Info), timestamp: None, text: "y".into() };
        assert_eq!(line.to_string(), "y");
    }
}
