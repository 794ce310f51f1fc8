//! The kernel log: defmt frames from the serial stream, decoded with the kernel ELF.

use crate::Failure;
use defmt_decoder::{DecodeError, Table};
use std::fmt;

#[derive(Clone, Debug)]
pub struct LogLine {
    pub level: Option<defmt_parser::Level>,
    pub text: String,
}

impl fmt::Display for LogLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use defmt_parser::Level;
        match self.level {
            Some(Level::Warn) => write!(f, "WARN  {}", self.text),
            Some(Level::Error) => write!(f, "ERROR {}", self.text),
            _ => write!(f, "{}", self.text),
        }
    }
}

/// Decodes a byte stream into log lines; bytes that do not form a frame are reported once.
pub struct KernelLog {
    table: &'static Table,
    decoder: Box<dyn defmt_decoder::StreamDecoder + Send + Sync + 'static>,
    lines: Vec<LogLine>,
}

impl KernelLog {
    pub fn new(elf: &[u8]) -> Result<Self, Failure> {
        let table = Table::parse(elf)
            .map_err(|error| Failure::usage(format!("kernel ELF has a bad defmt table: {error}")))?
            .ok_or_else(|| Failure::usage("kernel ELF has no defmt table"))?;
        // The decoder borrows the table; one table per QEMU run, so leaking it is bounded.
        let table: &'static Table = Box::leak(Box::new(table));
        Ok(Self { table, decoder: table.new_stream_decoder(), lines: Vec::new() })
    }

    /// Feeds received bytes; returns the lines completed by them.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<LogLine> {
        self.decoder.received(bytes);
        let mut new = Vec::new();
        loop {
            match self.decoder.decode() {
                Ok(frame) => new.push(LogLine { level: frame.level(), text: frame.display_message().to_string() }),
                Err(DecodeError::UnexpectedEof) => break,
                Err(DecodeError::Malformed) if self.table.encoding().can_recover() => {
                    new.push(LogLine { level: None, text: "[xtask: malformed defmt frame skipped]".into() })
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
