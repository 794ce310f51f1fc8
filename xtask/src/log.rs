//! The kernel log: defmt frames from the serial stream, decoded and symbolized with the kernel ELF.

#[cfg(test)]
mod linux_tools;

use crate::Failure;
use defmt_decoder::{DecodeError, Table};
use std::fmt;

/// The status in the kernel's final line `tracelab: exit status N`.
pub fn exit_sentinel(line: &str) -> Option<i32> {
    line.strip_prefix("tracelab: exit status ")?.trim().parse().ok()
}

/// How log lines are printed: xtask's own shape (the default), or the shapes Linux's tools read
/// (`--log linux`: no level words, `Call trace:` blocks of ` FUNCTION+0xOFF/0xSIZE` lines, symbol
/// names as the ELF's v0-mangled tokens, a panic as `Kernel panic - not syncing:`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogStyle {
    #[default]
    Default,
    Linux,
}

#[derive(Clone, Debug)]
pub struct LogLine {
    pub level: Option<defmt_parser::Level>,
    /// Seconds since the kernel's counter started (`S.UUUUUU`), from the record's defmt timestamp.
    pub timestamp: Option<String>,
    /// The line in xtask's shape: what the runner's and the demo's checks read.
    pub text: String,
    /// The line in Linux's shape, when it differs from `text`; several lines when Linux prints
    /// a header before it (`Call trace:` before a trace's first frame).
    pub linux: Option<String>,
}

impl LogLine {
    /// A line with no level, timestamp or Linux shape of its own.
    pub fn plain(text: impl Into<String>) -> Self {
        Self { level: None, timestamp: None, text: text.into(), linux: None }
    }

    /// The line as `style` prints it: Linux's shape is dmesg's, the timestamp alone before
    /// each line.
    pub fn render(&self, style: LogStyle) -> String {
        match (style, &self.linux) {
            (LogStyle::Default, _) => self.to_string(),
            (LogStyle::Linux, linux) => {
                let text = linux.as_deref().unwrap_or(&self.text);
                let prefix = self.timestamp.as_ref().map(|timestamp| format!("[{timestamp:>12}] ")).unwrap_or_default();
                text.split('\n').map(|line| format!("{prefix}{line}")).collect::<Vec<_>>().join("\n")
            }
        }
    }
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
    linux: LinuxState,
}

/// What Linux's shape of a line depends on in the lines before it.
#[derive(Default)]
pub struct LinuxState {
    /// Whether the last line was a trace's frame or the header Linux prints before frames: a
    /// frame after anything else opens a `Call trace:` block.
    in_trace: bool,
    /// The message of the panic being reported, for Linux's closing `---[ end ... ]---`.
    panic: Option<String>,
    /// The faulting PC while an unexpected-exception report (Linux's Oops) is being printed:
    /// its register line becomes `lr :`/`sp :`, and the kernel's closing line ends it as Linux
    /// ends an Oops.
    oops: Option<u64>,
}

/// One symbolized code address, printed the way Linux prints a backtrace entry:
/// `FUNCTION+0xOFF/0xSIZE`, then the address and the source line (`file:line`), and the
/// inlined function the line belongs to when it is not FUNCTION itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub address: u64,
    /// The ELF function symbol holding the address, demangled without its hash.
    pub function: String,
    /// The same symbol as the ELF names it (Rust's v0 mangling: `_R...`, one token).
    pub mangled: String,
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

    /// `MANGLED+0xOFF/0xSIZE`: the symbol as `nm` and kallsyms name it, one token that Linux's
    /// tools (decode_stacktrace.sh, syzkaller) read as a function name.
    pub fn linux_symbol(&self) -> String {
        format!("{}+{:#x}/{:#x}", self.mangled, self.offset, self.size)
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

/// A function symbol: start address, size, demangled name and the ELF's own name.
#[derive(Clone, Debug)]
pub struct FunctionSymbol {
    pub start: u64,
    pub size: u64,
    pub name: String,
    pub mangled: String,
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

    /// A symbolizer of `(start, size, ELF name)` symbols, without line tables.
    #[cfg(test)]
    pub fn from_symbols(symbols: &[(u64, u64, &str)]) -> Self {
        let mut functions: Vec<_> = symbols
            .iter()
            .map(|&(start, size, mangled)| FunctionSymbol {
                start,
                size,
                name: format!("{:#}", rustc_demangle::demangle(mangled)),
                mangled: mangled.to_string(),
            })
            .collect();
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

    /// The frame of a code address itself (the `pc :` and `lr :` lines of an Oops, which Linux
    /// prints with `%pS`, not `%pB`).
    pub fn code_address(&self, address: u64) -> Option<Frame> {
        self.frame(address, address)
    }

    fn frame(&self, address: u64, lookup: u64) -> Option<Frame> {
        let symbol = self.function_at(lookup)?;
        let (location, innermost) = self.line_of(lookup);
        let inlined = innermost.filter(|inner| *inner != symbol.name);
        Some(Frame {
            address,
            function: symbol.name.clone(),
            mangled: symbol.mangled.clone(),
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

    /// The function named `name` (demangled without its hash, as the kernel's `.ksyms` names
    /// it) whose extent holds `offset`.
    fn function_named(&self, name: &str, offset: u64) -> Option<&FunctionSymbol> {
        self.functions.iter().find(|symbol| symbol.name == name && offset <= symbol.size)
    }

    /// The frame of the kernel's `BUG: KASAN: TYPE in NAME+0xOFF/0xSIZE` (or `in 0xADDR`):
    /// (`BUG: KASAN: TYPE`, frame). The kernel sizes a function up to the next one in its
    /// callsite table (alignment padding included); the frame takes the ELF's size, as every
    /// other line does.
    fn bug_line<'a>(&self, text: &'a str) -> Option<(&'a str, Frame)> {
        let (title, symbol) = text.rsplit_once(" in ")?;
        if !title.starts_with("BUG: KASAN: ") {
            return None;
        }
        let address = match symbol.rsplit_once('+') {
            Some((name, rest)) => {
                let offset = u64::from_str_radix(rest.split_once('/')?.0.strip_prefix("0x")?, 16).ok()?;
                self.function_named(name, offset)?.start + offset
            }
            None => u64::from_str_radix(symbol.strip_prefix("0x")?, 16).ok()?,
        };
        // The report's address is the return address of the compiler's check.
        Some((title, self.return_address(address)?))
    }

    /// A function-tracer record's traced function and caller frames
    /// (`ftrace #N t=TICKS ip=0x.. parent=0x..`).
    fn ftrace_record(&self, record: &str) -> Option<(Frame, Option<Frame>)> {
        let field = |name: &str| {
            let value = record.split_whitespace().find_map(|word| word.strip_prefix(name))?;
            u64::from_str_radix(value.strip_prefix("0x")?, 16).ok()
        };
        let (ip, parent) = (field("ip=")?, field("parent=")?);
        // The record's ip is the call site in the patchable entry, before the symbol.
        Some((self.return_address(ip + 4)?, self.return_address(parent)))
    }

    /// Rewrites a backtrace line (`  fp #N 0xADDR`, `  scs #N 0xADDR`) as
    /// `  fp #N FUNCTION+0xOFF/0xSIZE 0xADDR file:line`, the sanitizer's `BUG: KASAN:` line with
    /// the ELF's size, and appends `function <- caller` to a function-tracer record
    /// (`ftrace #N t=TICKS ip=0x.. parent=0x..`).
    fn annotate(&self, text: &str) -> Option<String> {
        if let Some(record) = text.strip_prefix("ftrace #") {
            let (function, caller) = self.ftrace_record(record)?;
            let caller = caller.map_or_else(|| "?".into(), |frame| frame.symbol());
            return Some(format!("{text} {} <- {caller}", function.function));
        }
        if let Some((title, frame)) = self.bug_line(text) {
            return Some(format!("{title} in {}", frame.symbol()));
        }
        let (indent, label, index, address) = backtrace_line(text)?;
        let frame = self.return_address(address)?;
        Some(format!("{indent}{label} {index} {frame}"))
    }

    /// The Linux shapes of the lines this symbolizer knows: a backtrace line as arm64 Linux
    /// prints a frame (` MANGLED+0xOFF/0xSIZE`, no address or source line), the `BUG: KASAN:`
    /// line with its function as one token, a function-tracer record as `function <-caller`.
    fn linux(&self, text: &str) -> Option<String> {
        if let Some(record) = text.strip_prefix("ftrace #") {
            let (function, caller) = self.ftrace_record(record)?;
            let caller = caller.map_or_else(|| "?".into(), |frame| frame.mangled);
            return Some(format!("{text} {} <-{caller}", function.mangled));
        }
        if let Some((title, frame)) = self.bug_line(text) {
            return Some(format!("{title} in {}", frame.linux_symbol()));
        }
        let (_, _, _, address) = backtrace_line(text)?;
        Some(
            self.return_address(address)
                .map_or_else(|| format!(" {address:#x}"), |frame| format!(" {}", frame.linux_symbol())),
        )
    }
}

/// A backtrace line `  LABEL #N 0xADDR` (LABEL `fp`, `scs` or `sframe`): (indent, label, `#N`,
/// address).
fn backtrace_line(text: &str) -> Option<(&str, &str, &str, u64)> {
    let indent = &text[..text.len() - text.trim_start().len()];
    let mut words = text.split_whitespace();
    let (label, index, address) = (words.next()?, words.next()?, words.next()?);
    if !matches!(label, "fp" | "scs" | "sframe") || !index.starts_with('#') || words.next().is_some() {
        return None;
    }
    Some((indent, label, index, u64::from_str_radix(address.strip_prefix("0x")?, 16).ok()?))
}

/// Lines after which Linux prints frames without a `Call trace:` of their own.
fn opens_trace(text: &str) -> bool {
    text == "Call trace:"
        || ((text.starts_with("Allocated by task ") || text.starts_with("Freed by task ")) && text.ends_with(':'))
}

/// The Linux shape of a kernel line (`text`, as the kernel printed it), None when it is the
/// same; `state` carries what it depends on from the lines before. A frame after anything but
/// a frame or a trace's header gets the `Call trace:` header arm64 Linux prints. The panic
/// handler's `panicked at FILE:LINE: MESSAGE` becomes Linux's
/// `Kernel panic - not syncing: MESSAGE`, the location on the line after it, and the kernel's
/// closing line after it is preceded by Linux's `---[ end Kernel panic - not syncing: MESSAGE ]---`.
pub fn linux_shape(symbolizer: Option<&Symbolizer>, text: &str, state: &mut LinuxState) -> Option<String> {
    let frame = backtrace_line(text).is_some();
    let was_in_trace = std::mem::replace(&mut state.in_trace, frame || opens_trace(text));
    if frame {
        let line =
            symbolizer.and_then(|symbolizer| symbolizer.linux(text)).unwrap_or_else(|| format!(" {}", text.trim()));
        return Some(if was_in_trace { line } else { format!("Call trace:\n{line}") });
    }
    if let Some(rest) = text.strip_prefix("panicked at ")
        && let Some((location, message)) = rest.split_once(": ")
    {
        state.panic = Some(message.to_string());
        return Some(format!("Kernel panic - not syncing: {message}\npanicked at {location}"));
    }
    if exit_sentinel(text).is_some()
        && let Some(message) = state.panic.take()
    {
        return Some(format!("---[ end Kernel panic - not syncing: {message} ]---\n{text}"));
    }
    if let Some(report) = ExceptionReport::parse(text) {
        state.oops = Some(report.elr);
        return Some(report.linux(symbolizer));
    }
    if let Some(pc) = state.oops {
        if let Some(registers) = oops_registers(symbolizer, text, pc) {
            return Some(registers);
        }
        if exit_sentinel(text).is_some() {
            state.oops = None;
            let fatal = "Kernel panic - not syncing: Oops: Fatal exception";
            return Some(format!("---[ end trace 0000000000000000 ]---\n{fatal}\n---[ end {fatal} ]---\n{text}"));
        }
    }
    symbolizer.and_then(|symbolizer| symbolizer.linux(text))
}

/// The kernel's unexpected-exception line (`arch::exception::report`):
/// `WHAT: CLASS (ESR 0x..) at ELR 0x.., FAR 0x.., SPSR 0x..`.
struct ExceptionReport {
    esr: u64,
    elr: u64,
    far: u64,
}

impl ExceptionReport {
    fn parse(text: &str) -> Option<Self> {
        let rest = text
            .strip_prefix("unexpected synchronous exception: ")
            .or_else(|| text.strip_prefix("exception from an unexpected vector: "))?;
        let field = |name: &str| {
            let (_, value) = rest.split_once(name)?;
            let value = value.split([',', ')', ' ']).next()?;
            u64::from_str_radix(value.strip_prefix("0x")?, 16).ok()
        };
        Some(Self { esr: field("(ESR ")?, elr: field(" at ELR ")?, far: field(", FAR ")? })
    }

    /// Linux arm64's Oops header for this syndrome (`die()`'s `Internal error: MSG: ESR [#1]`,
    /// after `die_kernel_fault()`'s `Unable to handle kernel ...` for an abort), then `pc :`.
    fn linux(&self, symbolizer: Option<&Symbolizer>) -> String {
        const PAGE_SIZE: u64 = 4096;
        let class = self.esr >> 26;
        let mut lines = Vec::new();
        let oops = match class {
            // Instruction and data aborts taken at EL1.
            0x21 | 0x25 => {
                let what = if self.far < PAGE_SIZE { "NULL pointer dereference" } else { "paging request" };
                lines.push(format!("Unable to handle kernel {what} at virtual address {:016x}", self.far));
                lines.push("Mem abort info:".into());
                lines.push(format!("  ESR = {:#018x}", self.esr));
                let name = if class == 0x25 { "DABT" } else { "IABT" };
                lines.push(format!("  EC = {class:#04x}: {name} (current EL), IL = 32 bits"));
                "Oops"
            }
            0x3c => "Oops - BRK",
            0x00 => "Oops - Undefined instruction",
            _ => "Oops",
        };
        lines.push(format!("Internal error: {oops}: {:016x} [#1] SMP", self.esr));
        lines.push("Modules linked in:".into());
        lines.push(format!("pc : {}", code_symbol(symbolizer, self.elr)));
        lines.join("\n")
    }
}

/// The report's register line (`  x29 0x.. x30 0x.. sp 0x.. x18 0x..`) as an Oops prints
/// registers: `lr :` (its PAC stripped, as Linux does, with the VA size of the kernel text
/// `pc` is in), `sp :`, then the general registers it has.
fn oops_registers(symbolizer: Option<&Symbolizer>, text: &str, pc: u64) -> Option<String> {
    let words: Vec<&str> = text.split_whitespace().collect();
    let [_, x29, _, x30, _, sp, _, x18] = words.as_slice() else { return None };
    if !(words[0] == "x29" && words[2] == "x30" && words[4] == "sp" && words[6] == "x18") {
        return None;
    }
    let value = |word: &str| u64::from_str_radix(word.strip_prefix("0x")?, 16).ok();
    let (x29, x30, sp, x18) = (value(x29)?, value(x30)?, value(sp)?, value(x18)?);
    let x30 = if pc.leading_ones() > 8 { unwind::strip_pac_va_bits(x30, 64 - pc.leading_ones()) } else { x30 };
    Some(format!("lr : {}\nsp : {sp:016x}\nx29: {x29:016x} x18: {x18:016x}", code_symbol(symbolizer, x30)))
}

/// `MANGLED+0xOFF/0xSIZE` of a code address, or the address itself.
fn code_symbol(symbolizer: Option<&Symbolizer>, address: u64) -> String {
    symbolizer
        .and_then(|symbolizer| symbolizer.code_address(address))
        .map_or_else(|| format!("{address:#x}"), |frame| frame.linux_symbol())
}

/// The defined function symbols of `file`, demangled without hashes, sorted by address. defmt's
/// interned strings are symbols too (names with spaces and `=`): not code, left out.
pub fn function_symbols(file: &object::File) -> Vec<FunctionSymbol> {
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
                mangled: name.to_string(),
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
        Ok(Self {
            table,
            decoder: table.new_stream_decoder(),
            lines: Vec::new(),
            symbolizer: None,
            linux: LinuxState::default(),
        })
    }

    /// Feeds received bytes; returns the lines completed by them.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<LogLine> {
        self.decoder.received(bytes);
        let mut new = Vec::new();
        loop {
            match self.decoder.decode() {
                Ok(frame) => {
                    let raw = frame.display_message().to_string();
                    let linux = linux_shape(self.symbolizer.as_ref(), &raw, &mut self.linux);
                    let text = self.symbolizer.as_ref().and_then(|symbolizer| symbolizer.annotate(&raw)).unwrap_or(raw);
                    let timestamp = frame.display_timestamp().map(|timestamp| timestamp.to_string());
                    new.push(LogLine { level: frame.level(), timestamp, text, linux })
                }
                Err(DecodeError::UnexpectedEof) => break,
                Err(DecodeError::Malformed) if self.table.encoding().can_recover() => {
                    new.push(LogLine::plain("[xtask: malformed defmt frame skipped]"))
                }
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

    // Rust's v0 mangling of `kernel::kernel_main`, `kernel::stacktrace::walk` and
    // `kernel::tests::ftrace::traced_leaf`, as the ELF names them.
    const KERNEL_MAIN: &str = "_RNvCs1a2b3c_6kernel11kernel_main";
    const WALK: &str = "_RNvNtCs1a2b3c_6kernel10stacktrace4walk";
    const TRACED_LEAF: &str = "_RNvNtNtCs1a2b3c_6kernel5tests6ftrace11traced_leaf";

    fn symbolizer() -> Symbolizer {
        Symbolizer::from_symbols(&[
            (0xffff_0000_4008_0000, 0x120, KERNEL_MAIN),
            (0xffff_0000_4008_0120, 0x40, WALK),
            (0xffff_0000_4008_0200, 0x10, TRACED_LEAF),
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
        assert_eq!(
            symbolizer.annotate("  sframe #1 0xffff000040080034").as_deref(),
            Some("  sframe #1 kernel::kernel_main+0x34/0x120 0xffff000040080034")
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
            mangled: KERNEL_MAIN.into(),
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
        let line = LogLine {
            level: Some(defmt_parser::Level::Error),
            timestamp: Some("1.234567".into()),
            text: "x".into(),
            linux: None,
        };
        assert_eq!(line.to_string(), "[    1.234567] ERROR x");
        // Linux's shape has no level word, and a header line gets its own timestamp.
        assert_eq!(line.render(LogStyle::Linux), "[    1.234567] x");
        let line = LogLine { linux: Some("Call trace:\n f+0x4/0x8".into()), ..line };
        assert_eq!(line.render(LogStyle::Linux), "[    1.234567] Call trace:\n[    1.234567]  f+0x4/0x8");
        assert_eq!(line.render(LogStyle::Default), "[    1.234567] ERROR x");
        let line = LogLine { level: Some(defmt_parser::Level::Info), ..LogLine::plain("y") };
        assert_eq!(line.to_string(), "y");
    }

    #[test]
    fn the_bug_line_takes_the_elf_size() {
        // The kernel sizes the function to the next callsite (0x40); the ELF says 0x34.
        let symbolizer = Symbolizer::from_symbols(&[(0x1000, 0x34, KERNEL_MAIN)]);
        let text = "BUG: KASAN: slab-use-after-free in kernel::kernel_main+0x20/0x40";
        assert_eq!(
            symbolizer.annotate(text).as_deref(),
            Some("BUG: KASAN: slab-use-after-free in kernel::kernel_main+0x20/0x34")
        );
        // A report whose function the kernel could not name gives its address.
        assert_eq!(
            symbolizer.annotate("BUG: KASAN: double-free in 0x1024").as_deref(),
            Some("BUG: KASAN: double-free in kernel::kernel_main+0x24/0x34")
        );
        assert_eq!(
            symbolizer.linux(text).as_deref(),
            Some("BUG: KASAN: slab-use-after-free in _RNvCs1a2b3c_6kernel11kernel_main+0x20/0x34")
        );
    }

    #[test]
    fn linux_shape_opens_a_call_trace_and_drops_addresses() {
        let symbolizer = symbolizer();
        let mut state = LinuxState::default();
        let mut shape = |text: &str| linux_shape(Some(&symbolizer), text, &mut state);
        assert_eq!(
            shape("panicked at kernel/src/main.rs:129: deliberate panic").as_deref(),
            Some("Kernel panic - not syncing: deliberate panic\npanicked at kernel/src/main.rs:129")
        );
        assert_eq!(
            shape("  fp #0 0xffff000040080034").as_deref(),
            Some("Call trace:\n _RNvCs1a2b3c_6kernel11kernel_main+0x34/0x120")
        );
        assert_eq!(
            shape("  fp #1 0xffff000040080130").as_deref(),
            Some(" _RNvNtCs1a2b3c_6kernel10stacktrace4walk+0x10/0x40")
        );
        assert_eq!(shape("  fp #2 0x10").as_deref(), Some(" 0x10"));
        assert_eq!(shape("  fp: 3 frames, end of chain"), None);
        assert_eq!(shape("Allocated by task 0:"), None);
        assert_eq!(
            shape("  fp #0 0xffff000040080034").as_deref(),
            Some(" _RNvCs1a2b3c_6kernel11kernel_main+0x34/0x120")
        );
        let record = "ftrace #2 t=100 ip=0xffff000040080204 parent=0xffff000040080048";
        assert_eq!(shape(record), Some(format!("{record} {TRACED_LEAF} <-{KERNEL_MAIN}")));
        // The panic's closing line, once.
        assert_eq!(
            shape("tracelab: exit status 3").as_deref(),
            Some("---[ end Kernel panic - not syncing: deliberate panic ]---\ntracelab: exit status 3")
        );
        assert_eq!(shape("tracelab: exit status 3"), None);
    }

    #[test]
    fn an_unexpected_exception_takes_the_shape_of_an_oops() {
        let symbolizer = symbolizer();
        let mut state = LinuxState::default();
        let mut shape = |text: &str| linux_shape(Some(&symbolizer), text, &mut state);
        let brk =
            "unexpected synchronous exception: Brk (ESR 0xf20001ff) at ELR 0xffff000040080034, FAR 0x0, SPSR 0x3c5";
        assert_eq!(
            shape(brk).as_deref(),
            Some(concat!(
                "Internal error: Oops - BRK: 00000000f20001ff [#1] SMP\n",
                "Modules linked in:\n",
                "pc : _RNvCs1a2b3c_6kernel11kernel_main+0x34/0x120"
            ))
        );
        assert_eq!(shape("  immediate: 0x1ff (no owner)"), None);
        assert_eq!(
            shape("  x29 0xffff000040ff0f80 x30 0x9a80000040080130 sp 0xffff000040ff0f70 x18 0xffff000041000010")
                .as_deref(),
            Some(concat!(
                "lr : _RNvNtCs1a2b3c_6kernel10stacktrace4walk+0x10/0x40\n",
                "sp : ffff000040ff0f70\n",
                "x29: ffff000040ff0f80 x18: ffff000041000010"
            ))
        );
        assert_eq!(
            shape("tracelab: exit status 3").as_deref(),
            Some(concat!(
                "---[ end trace 0000000000000000 ]---\n",
                "Kernel panic - not syncing: Oops: Fatal exception\n",
                "---[ end Kernel panic - not syncing: Oops: Fatal exception ]---\n",
                "tracelab: exit status 3"
            ))
        );
        // Outside an Oops a register-shaped line is left alone.
        assert_eq!(shape("  x29 0x1 x30 0x2 sp 0x3 x18 0x4"), None);
        let abort = "unexpected synchronous exception: DataAbort (ESR 0x96000004) at ELR 0x10, FAR 0x8, SPSR 0x3c5";
        assert_eq!(
            shape(abort).as_deref(),
            Some(concat!(
                "Unable to handle kernel NULL pointer dereference at virtual address 0000000000000008\n",
                "Mem abort info:\n",
                "  ESR = 0x0000000096000004\n",
                "  EC = 0x25: DABT (current EL), IL = 32 bits\n",
                "Internal error: Oops: 0000000096000004 [#1] SMP\n",
                "Modules linked in:\n",
                "pc : 0x10"
            ))
        );
    }
}
