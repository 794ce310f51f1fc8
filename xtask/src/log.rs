//! The kernel log: defmt frames from the serial stream, decoded with the kernel ELF.

use crate::Failure;
use defmt_decoder::{DecodeError, Table};
use std::fmt;

#[derive(Clone, Debug)]
pub struct LogLine {
    pub level: Option<defmt_parser::Level>,
    pub text: String,
    /// Seconds since boot (`0.001234`), printed before the line as dmesg does.
    pub timestamp: Option<String>,
}

impl fmt::Display for LogLine {
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
/// Backtrace lines (`fp #N 0x...`, `scs #N 0x...`) get the function and file:line appended.
pub struct KernelLog {
    table: &'static Table,
    decoder: Box<dyn defmt_decoder::StreamDecoder + Send + Sync + 'static>,
    lines: Vec<LogLine>,
    symbolizer: Option<Symbolizer>,
}

/// addr2line over the kernel ELF.
pub struct Symbolizer(addr2line::Loader);

impl Symbolizer {
    pub fn new(elf_path: &std::path::Path) -> Option<Self> {
        addr2line::Loader::new(elf_path).ok().map(Self)
    }

    /// `function (file:line)` for a return address: the call instruction before it.
    pub fn describe_return_address(&self, address: u64) -> Option<String> {
        let lookup = address.checked_sub(4)?;
        let mut frames = self.0.find_frames(lookup).ok()?;
        let mut innermost = None;
        while let Ok(Some(frame)) = frames.next() {
            let function = frame.function.as_ref().and_then(|name| name.demangle().ok().map(|name| name.into_owned()));
            let location = frame.location.map(|location| {
                let file = location.file.unwrap_or("?");
                let file = file.rsplit_once("/src/").map_or(file, |(_, tail)| tail);
                format!("{file}:{}", location.line.unwrap_or(0))
            });
            // The outermost frame is the real function; inlined ones come first.
            innermost.get_or_insert((function.clone(), location.clone()));
            if let (Some(function), Some(location)) = (function, location) {
                return Some(format!("{function} ({location})"));
            }
        }
        // defmt's interned strings are symbols too (names with spaces and `=`): not code.
        let symbol = self
            .0
            .find_symbol(lookup)
            .filter(|name| !name.contains(' ') && !name.contains('='))
            .map(|name| addr2line::demangle_auto(name.into(), None).into_owned());
        match (innermost, symbol) {
            (Some((Some(function), location)), _) => Some(format!("{function} ({})", location.unwrap_or_default())),
            (_, Some(symbol)) => Some(symbol),
            _ => None,
        }
    }

    /// Appends the symbol to a backtrace line, or `function <- caller` to a function-tracer
    /// record (`ftrace #N t=TICKS ip=0x.. parent=0x..`).
    fn annotate(&self, text: &str) -> Option<String> {
        if let Some(record) = text.strip_prefix("ftrace #") {
            let field = |name: &str| {
                let value = record.split_whitespace().find_map(|word| word.strip_prefix(name))?;
                u64::from_str_radix(value.strip_prefix("0x")?, 16).ok()
            };
            let (ip, parent) = (field("ip=")?, field("parent=")?);
            let function = self.describe_return_address(ip + 4)?;
            let function = function.split(" (").next().unwrap_or(&function);
            let caller = self.describe_return_address(parent).unwrap_or_else(|| "?".into());
            return Some(format!("{text} {function} <- {caller}"));
        }
        let mut words = text.split_whitespace();
        let label = words.next()?;
        let index = words.next()?;
        let address = words.next()?;
        if !matches!(label, "fp" | "scs") || !index.starts_with('#') || words.next().is_some() {
            return None;
        }
        let address = u64::from_str_radix(address.strip_prefix("0x")?, 16).ok()?;
        Some(format!("{text} {}", self.describe_return_address(address)?))
    }
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
                    new.push(LogLine { level: frame.level(), text, timestamp })
                }
                Err(DecodeError::UnexpectedEof) => break,
                Err(DecodeError::Malformed) if self.table.encoding().can_recover() => new.push(LogLine {
                    level: None,
                    text: "[xtask: malformed defmt frame skipped]".into(),
                    timestamp: None,
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
