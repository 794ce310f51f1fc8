//! The plugin's whole-run count (`count=on`): every instruction every vCPU executed from reset
//! to QEMU's exit, with the running total at each counter read a user program made.
//!
//! A guest's own program marks its phases by reading the virtual counter (`mrs Xt,
//! cntvct_el0`) at EL0, which Linux allows: the plugin notes the machine's total at each such
//! read, so a run is split at the points the program timed without loading anything extra into
//! it. Reads from kernel addresses (the clock sources, the scheduler's clock) are not marks.
//! Given the guest kernel's vector table (`vectors=ADDRESS`), it also counts exceptions taken,
//! as executions of the table's 16 entries (each entry's first instruction).
//! Under `-icount` the vCPUs run one at a time in a fixed order, so the totals at the marks are
//! those of one deterministic interleaving.

use alloc::vec::Vec;
use core::fmt::Write;

/// `mrs Xt, cntvct_el0` (op0=3, op1=3, CRn=14, CRm=0, op2=2) without its Rt field.
const CNTVCT_READ: u32 = 0xd53b_e040;

/// Whether the instruction `word` at `vaddr` is a mark: a read of the virtual counter from a
/// user address (the lower, TTBR0 half of the address space).
pub fn is_user_counter_read(word: u32, vaddr: u64) -> bool {
    word & !0x1f == CNTVCT_READ && vaddr >> 63 == 0
}

/// A mark's line: `events count mark: cpu=C pc=0xADDRESS instructions=N exceptions=E`, N and
/// E the machine's totals (all vCPUs) before the marking read itself.
pub const MARK_PREFIX: &str = "events count mark: ";

/// The last line, written when QEMU exits: `events count: instructions=N exceptions=E vcpus=V
/// marks=M`.
pub const END_PREFIX: &str = "events count: ";

/// One user counter read and the machine's totals when it ran.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Mark {
    pub cpu: u32,
    pub pc: u64,
    pub instructions: u64,
    /// Exceptions taken (0 when the plugin was given no vector table).
    pub exceptions: u64,
}

impl Mark {
    /// Writes the mark's line (without a newline).
    pub fn write_line(&self, out: &mut impl Write) -> core::fmt::Result {
        write!(
            out,
            "{MARK_PREFIX}cpu={} pc={:#x} instructions={} exceptions={}",
            self.cpu, self.pc, self.instructions, self.exceptions
        )
    }

    /// Reads a line `write_line` wrote.
    pub fn parse(line: &str) -> Option<Self> {
        let mut words = line.strip_prefix(MARK_PREFIX)?.split(' ');
        let cpu = words.next()?.strip_prefix("cpu=")?.parse().ok()?;
        let pc = u64::from_str_radix(words.next()?.strip_prefix("pc=0x")?, 16).ok()?;
        let instructions = words.next()?.strip_prefix("instructions=")?.parse().ok()?;
        let exceptions = words.next()?.strip_prefix("exceptions=")?.parse().ok()?;
        words.next().is_none().then_some(Self { cpu, pc, instructions, exceptions })
    }
}

/// A whole run's count as the plugin wrote it.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct WholeRun {
    /// Every instruction every vCPU executed.
    pub instructions: u64,
    /// Every exception taken (0 without a vector table).
    pub exceptions: u64,
    /// The vCPUs that executed any.
    pub vcpus: u32,
    /// The user counter reads, in the order they ran.
    pub marks: Vec<Mark>,
}

impl WholeRun {
    /// Writes the end line (without a newline).
    pub fn write_end(&self, out: &mut impl Write) -> core::fmt::Result {
        write!(
            out,
            "{END_PREFIX}instructions={} exceptions={} vcpus={} marks={}",
            self.instructions,
            self.exceptions,
            self.vcpus,
            self.marks.len()
        )
    }

    /// Reads the plugin's lines. `None` unless the end line is there and agrees with the marks
    /// before it (a run cut short writes no end line).
    pub fn parse(text: &str) -> Option<Self> {
        let mut run = Self::default();
        let mut ended = false;
        for line in text.lines() {
            if let Some(mark) = Mark::parse(line) {
                run.marks.push(mark);
            } else if let Some(end) = line.strip_prefix(END_PREFIX) {
                let mut words = end.split(' ');
                run.instructions = words.next()?.strip_prefix("instructions=")?.parse().ok()?;
                run.exceptions = words.next()?.strip_prefix("exceptions=")?.parse().ok()?;
                run.vcpus = words.next()?.strip_prefix("vcpus=")?.parse().ok()?;
                let marks: usize = words.next()?.strip_prefix("marks=")?.parse().ok()?;
                if marks != run.marks.len() || words.next().is_some() {
                    return None;
                }
                ended = true;
            }
        }
        ended.then_some(run)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_counter_reads_are_marks_and_kernel_ones_are_not() {
        assert!(is_user_counter_read(0xd53b_e040, 0x40_1000)); // mrs x0, cntvct_el0
        assert!(is_user_counter_read(0xd53b_e053, 0x40_1000)); // mrs x19, cntvct_el0
        assert!(!is_user_counter_read(0xd53b_e040, 0xffff_8000_8001_0000));
        assert!(!is_user_counter_read(0xd53b_e020, 0x40_1000)); // mrs x0, cntpct_el0
        assert!(!is_user_counter_read(0xd53b_9d00, 0x40_1000)); // mrs x0, pmccntr_el0
    }

    #[test]
    fn lines_read_back_and_a_run_without_its_end_does_not() {
        let mut run = WholeRun { instructions: 3_000_000_123, exceptions: 41_000, vcpus: 4, marks: Vec::new() };
        run.marks.push(Mark { cpu: 2, pc: 0x40_0a1c, instructions: 1_500_000_000, exceptions: 20_000 });
        run.marks.push(Mark { cpu: 0, pc: 0x40_0a44, instructions: 1_600_000_000, exceptions: 21_002 });
        let mut text = alloc::string::String::new();
        for mark in &run.marks {
            mark.write_line(&mut text).unwrap();
            text.push('\n');
        }
        let marks_only = text.clone();
        run.write_end(&mut text).unwrap();
        text.push('\n');
        assert_eq!(WholeRun::parse(&text), Some(run));
        assert_eq!(WholeRun::parse(&marks_only), None);
        let one_mark_lost = text.lines().skip(1).collect::<Vec<_>>().join("\n");
        assert_eq!(WholeRun::parse(&one_mark_lost), None);
    }
}
