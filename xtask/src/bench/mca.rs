//! `bench mca`: the walker loops' cycles per iteration by llvm-mca beside the cycle model's.
//!
//! The cycle model (`events::model`) costs instructions by class, additively, at the Cortex-A72's
//! issue throughputs; it cannot see dependencies. For the straight-line bodies of the stack
//! walkers' loops a scheduler can: this pass takes each loop's body out of the built kernel ELF
//! (the shortest cycle of the function's control flow that makes no call: one frame walked, one
//! shadow-stack entry copied), hands it to Debian's `llvm-mca-19 -mcpu=cortex-a72` (LLVM's
//! scheduling model for the A72 is its Cortex-A57 model) and prints its cycles per iteration
//! beside the model's for the same instructions. The body's forward exits are taken as not
//! taken, its closing branch as taken: the iteration of a walk that goes on.

use crate::Failure;
use crate::build;
use events::model::Costs;
use events::{Branch, Counter, classify};
use object::{Object, ObjectSymbol};
use std::collections::VecDeque;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

/// The tools, from Debian's `llvm-19` package.
const MCA: &str = "llvm-mca-19";
const OBJDUMP: &str = "llvm-objdump-19";
/// Iterations llvm-mca simulates: enough for its steady state to swamp the first iteration.
const ITERATIONS: u32 = 1000;
/// The label every address operand becomes: llvm-mca assembles the body, it does not run it.
const LABEL: &str = "mca_loop";

/// The loops: their name and the function (demangled, hash-free) whose body holds them. The
/// `stacktrace` suite's `trace_once` instances inline each walker's entry point whole, so the
/// loop is the one the suite's `fp` and `scs` rows time.
pub const LOOPS: [(&str, &str); 2] = [
    ("frame walk (`fp`)", "kernel::bench::stacktrace::trace_once::<0, false>"),
    ("shadow call stack copy (`scs`)", "kernel::bench::stacktrace::trace_once::<1, false>"),
];

/// One disassembled instruction.
#[derive(Clone, Debug, PartialEq)]
pub struct Instruction {
    pub address: u64,
    pub word: u32,
    /// Mnemonic and operands as llvm-objdump prints them.
    pub text: String,
}

/// `llvm-objdump -d` lines (`ADDRESS: WORD \t TEXT`), in address order; other lines are skipped.
pub fn parse_disassembly(text: &str) -> Vec<Instruction> {
    text.lines()
        .filter_map(|line| {
            let (address, rest) = line.split_once(':')?;
            let address = u64::from_str_radix(address.trim(), 16).ok()?;
            let rest = rest.trim_start();
            let (word, text) = rest.split_once(char::is_whitespace)?;
            let word = u32::from_str_radix(word, 16).ok()?;
            Some(Instruction { address, word, text: text.trim().to_string() })
        })
        .collect()
}

/// The address a direct branch goes to, as llvm-objdump prints it (`b.ne 0xffff... <f+0x34>`).
fn branch_target(instruction: &Instruction) -> Option<u64> {
    instruction
        .text
        .split(|c: char| c.is_whitespace() || c == ',')
        .filter_map(|token| token.strip_prefix("0x"))
        .find_map(|digits| u64::from_str_radix(digits, 16).ok())
}

/// The instructions control can go to after `index`: the next one, a branch's target, both.
fn successors(instructions: &[Instruction], index: usize) -> Vec<usize> {
    let at = |address: u64| instructions.iter().position(|instruction| instruction.address == address);
    let next = (index + 1 < instructions.len()).then_some(index + 1);
    let target = || branch_target(&instructions[index]).and_then(at);
    match classify(instructions[index].word).branch {
        Branch::None => next.into_iter().collect(),
        Branch::Conditional => next.into_iter().chain(target()).collect(),
        Branch::Jump => target().into_iter().collect(),
        // A loop that calls is not straight-line code; returns and indirect jumps leave it.
        Branch::Call | Branch::IndirectCall | Branch::IndirectJump | Branch::Return => Vec::new(),
    }
}

/// The loop body: the shortest cycle of the control flow through no call, starting at its
/// lowest address (the first such cycle by address where two are as short). None if the code
/// has no such cycle.
pub fn loop_body(instructions: &[Instruction]) -> Option<Vec<Instruction>> {
    let mut best: Option<Vec<usize>> = None;
    for header in 0..instructions.len() {
        // Breadth-first from the header; the first path back to it is a shortest cycle.
        let mut previous = vec![usize::MAX; instructions.len()];
        let mut queue = VecDeque::from([header]);
        let mut closing = None;
        while let Some(index) = queue.pop_front() {
            let successors = successors(instructions, index);
            if successors.contains(&header) {
                closing = Some(index);
                break;
            }
            for successor in successors {
                if previous[successor] == usize::MAX {
                    previous[successor] = index;
                    queue.push_back(successor);
                }
            }
        }
        let Some(mut index) = closing else { continue };
        let mut cycle = vec![index];
        while index != header {
            index = previous[index];
            cycle.push(index);
        }
        cycle.reverse();
        if best.as_ref().is_none_or(|best| cycle.len() < best.len()) {
            best = Some(cycle);
        }
    }
    let mut cycle = best?;
    let lowest = cycle.iter().enumerate().min_by_key(|(_, index)| **index).map_or(0, |(position, _)| position);
    cycle.rotate_left(lowest);
    Some(cycle.into_iter().map(|index| instructions[index].clone()).collect())
}

/// The body as assembly llvm-mca reads: comments and symbol annotations dropped, every address
/// operand a label at the top (branches need a target to assemble; where it points does not
/// change what llvm-mca schedules).
pub fn assembly(body: &[Instruction]) -> String {
    let mut text = format!("{LABEL}:\n");
    for instruction in body {
        let mut line = instruction.text.split("//").next().unwrap_or("").to_string();
        if let Some(start) = line.find(" <") {
            line.truncate(start);
        }
        let operands: Vec<String> = line
            .split(',')
            .map(|operand| {
                let trimmed = operand.trim_end();
                // The last token of the mnemonic's field or an operand of its own: `0x...`
                // without `#` is an address, `#0x...` an immediate.
                let last = trimmed.rfind(char::is_whitespace).map_or(0, |position| position + 1);
                if trimmed[last..].starts_with("0x") {
                    format!("{}{LABEL}", &trimmed[..last])
                } else {
                    trimmed.to_string()
                }
            })
            .collect();
        text.push('\t');
        text.push_str(operands.join(",").trim());
        text.push('\n');
    }
    text
}

/// What llvm-mca says of a block: its iterations, total cycles and block reciprocal throughput.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct McaSummary {
    pub iterations: f64,
    pub total_cycles: f64,
    pub block_reciprocal_throughput: f64,
}

impl McaSummary {
    pub fn cycles_per_iteration(&self) -> f64 {
        self.total_cycles / self.iterations
    }
}

/// Reads llvm-mca's summary lines (`Iterations:`, `Total Cycles:`, `Block RThroughput:`).
pub fn parse_mca(text: &str) -> Option<McaSummary> {
    let field = |name: &str| {
        text.lines().find_map(|line| line.trim().strip_prefix(name).and_then(|value| value.trim().parse::<f64>().ok()))
    };
    Some(McaSummary {
        iterations: field("Iterations:")?,
        total_cycles: field("Total Cycles:")?,
        block_reciprocal_throughput: field("Block RThroughput:")?,
    })
}

/// The body's events per iteration: its instructions by class, and its taken branches (those
/// whose successor in the cycle is their target; the last one closes the loop).
pub fn events_per_iteration(body: &[Instruction]) -> impl Fn(Counter) -> f64 + use<> {
    let mut counts = [0.0f64; Counter::COUNT];
    for (position, instruction) in body.iter().enumerate() {
        let class = classify(instruction.word);
        let next = body[(position + 1) % body.len()].address;
        let taken = match class.branch {
            Branch::None => false,
            Branch::Conditional | Branch::Jump => next != instruction.address + 4,
            _ => true,
        };
        let mut add = |counter: Counter, on: bool| {
            if on {
                counts[counter.index()] += 1.0;
            }
        };
        add(Counter::Instructions, true);
        add(Counter::Loads, class.load);
        add(Counter::Stores, class.store);
        add(Counter::TakenBranches, taken);
        add(Counter::IndirectBranches, class.branch.indirect() && class.branch != Branch::Return);
        add(Counter::Isb, class.isb);
        add(Counter::Dsb, class.dsb);
        add(Counter::Dmb, class.dmb);
        add(Counter::SystemRegisters, class.system_register);
        add(Counter::PointerAuthentication, class.pointer_authentication);
    }
    move |counter: Counter| counts[counter.index()]
}

/// One loop's figures.
#[derive(Clone, Debug)]
pub struct LoopFigures {
    pub name: &'static str,
    pub body: Vec<Instruction>,
    pub model: f64,
    pub mca: McaSummary,
}

/// A tool's path, or the error that says how to get it.
fn tool(name: &str) -> Result<(), Failure> {
    match Command::new(name).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status() {
        Ok(status) if status.success() => Ok(()),
        _ => Err(Failure::usage(format!(
            "{name} not found: `bench mca` needs Debian's LLVM 19 tools (apt-get install llvm-19)"
        ))),
    }
}

/// The function `name` (demangled, hash-free) of the ELF: its address range.
fn function_range(elf: &Path, name: &str) -> Result<(u64, u64), Failure> {
    let data = std::fs::read(elf).map_err(|error| Failure::usage(format!("{}: {error}", elf.display())))?;
    let file = object::File::parse(&*data).map_err(|error| Failure::usage(format!("{}: {error}", elf.display())))?;
    file.symbols()
        .find(|symbol| {
            symbol.size() > 0
                && symbol.name().is_ok_and(|mangled| format!("{:#}", rustc_demangle::demangle(mangled)) == name)
        })
        .map(|symbol| (symbol.address(), symbol.address() + symbol.size()))
        .ok_or_else(|| Failure { status: 1, message: format!("{}: no function {name}", elf.display()) })
}

fn run_tool(command: &mut Command, input: Option<&str>) -> Result<String, Failure> {
    let failed = |error: String| Failure { status: 1, message: error };
    let mut child = command
        .stdin(if input.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|error| failed(format!("{command:?}: {error}")))?;
    if let (Some(input), Some(mut stdin)) = (input, child.stdin.take()) {
        stdin.write_all(input.as_bytes()).map_err(|error| failed(format!("{command:?}: {error}")))?;
    }
    let output = child.wait_with_output().map_err(|error| failed(format!("{command:?}: {error}")))?;
    if !output.status.success() {
        return Err(failed(format!("{command:?} failed: {}", String::from_utf8_lossy(&output.stderr).trim())));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Every loop of [`LOOPS`] in the kernel ELF `elf`: its body, the model's and llvm-mca's cycles.
pub fn analyse(elf: &Path) -> Result<Vec<LoopFigures>, Failure> {
    tool(MCA)?;
    tool(OBJDUMP)?;
    let costs = Costs::a72();
    let mut figures = Vec::new();
    for (name, function) in LOOPS {
        let (start, stop) = function_range(elf, function)?;
        let disassembly = run_tool(
            Command::new(OBJDUMP)
                .arg("-d")
                .arg(format!("--start-address={start:#x}"))
                .arg(format!("--stop-address={stop:#x}"))
                .arg(elf),
            None,
        )?;
        let body = loop_body(&parse_disassembly(&disassembly))
            .ok_or_else(|| Failure { status: 1, message: format!("{function}: no loop without a call") })?;
        let report = run_tool(
            Command::new(MCA).args(["-mtriple=aarch64", "-mcpu=cortex-a72", &format!("-iterations={ITERATIONS}"), "-"]),
            Some(&assembly(&body)),
        )?;
        let mca = parse_mca(&report)
            .ok_or_else(|| Failure { status: 1, message: format!("{MCA}: no summary for {function}") })?;
        figures.push(LoopFigures { name, model: costs.cycles(events_per_iteration(&body)), body, mca });
    }
    Ok(figures)
}

/// The table `bench mca` prints, and each body.
pub fn render(figures: &[LoopFigures]) -> String {
    let mut text = String::from(
        "| loop | instructions | loads | stores | modelled cycles per iteration (model: uncalibrated) | llvm-mca cycles per iteration | llvm-mca block reciprocal throughput |\n|---|---:|---:|---:|---:|---:|---:|\n",
    );
    for loop_figures in figures {
        let events = events_per_iteration(&loop_figures.body);
        text.push_str(&format!(
            "| {} | {} | {} | {} | {:.2} | {:.2} | {:.2} |\n",
            loop_figures.name,
            loop_figures.body.len(),
            events(Counter::Loads),
            events(Counter::Stores),
            loop_figures.model,
            loop_figures.mca.cycles_per_iteration(),
            loop_figures.mca.block_reciprocal_throughput
        ));
    }
    for loop_figures in figures {
        text.push_str(&format!("\n{}:\n", loop_figures.name));
        for instruction in &loop_figures.body {
            let shown = instruction.text.split(" <").next().unwrap_or("");
            text.push_str(&format!("    {:#x}: {shown}\n", instruction.address));
        }
    }
    text
}

/// `cargo xtask bench mca`: builds the kernel (virt, `prod`: the `stacktrace` suite's build)
/// and prints the table.
pub fn run() -> Result<u8, Failure> {
    tool(MCA)?;
    tool(OBJDUMP)?;
    let image = build::kernel(build::Board::Virt, build::BuildVariant::Prod)?;
    print!("{}", render(&analyse(&image.elf)?));
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `trace_once::<0, false>` (the frame walk) and `<1, false>` (the SCS copy) of a `prod`
    /// kernel, as llvm-objdump-19 prints them, and llvm-mca-19's summary of the frame walk's body.
    const FRAME_WALK: &str = include_str!("../../fixtures/mca/frame-walk.objdump");
    const SHADOW_COPY: &str = include_str!("../../fixtures/mca/shadow-copy.objdump");
    const MCA_REPORT: &str = include_str!("../../fixtures/mca/frame-walk.mca");

    fn addresses(body: &[Instruction]) -> Vec<u64> {
        body.iter().map(|instruction| instruction.address & 0xfff).collect()
    }

    #[test]
    fn the_frame_walk_body_is_one_frame() {
        let body = loop_body(&parse_disassembly(FRAME_WALK)).expect("a loop");
        // Load the record, test its return address, store the entry, check the next record.
        assert_eq!(
            addresses(&body),
            [0x660, 0x664, 0x668, 0x708, 0x70c, 0x710, 0x714, 0x718, 0x71c, 0x720, 0x724, 0x728]
        );
        let events = events_per_iteration(&body);
        assert_eq!((events(Counter::Loads), events(Counter::Stores)), (1.0, 1.0));
        // `tbnz` to the entry's store and `b.ls` back: two taken branches.
        assert_eq!(events(Counter::TakenBranches), 2.0);
        // 8 others at 0.5, a load, a store, two taken branches at 1.
        assert_eq!(Costs::a72().cycles(events), 8.0 * 0.5 + 4.0);
    }

    #[test]
    fn the_shadow_copy_body_is_one_entry() {
        let body = loop_body(&parse_disassembly(SHADOW_COPY)).expect("a loop");
        assert_eq!(addresses(&body), [0xbac, 0xbb0, 0xbb4, 0xbb8, 0xbbc, 0xbc0]);
        let events = events_per_iteration(&body);
        assert_eq!(events(Counter::TakenBranches), 1.0);
        assert_eq!(Costs::a72().cycles(events), 3.0 * 0.5 + 3.0);
    }

    #[test]
    fn the_assembly_has_labels_for_addresses_and_keeps_immediates() {
        let body = loop_body(&parse_disassembly(FRAME_WALK)).expect("a loop");
        let text = assembly(&body);
        assert!(text.starts_with("mca_loop:\n"), "{text}");
        assert!(text.contains("\ttbnz\tx10, #0x37, mca_loop\n"), "{text}");
        assert!(text.contains("\tb.ls\tmca_loop\n"), "{text}");
        assert!(text.contains("\torr\tx10, x10, #0xffffff8000000000\n"), "{text}");
        assert!(!text.contains('<') && !text.contains("//"), "{text}");
    }

    #[test]
    fn the_mca_summary_is_read() {
        let summary = parse_mca(MCA_REPORT).expect("a summary");
        assert_eq!(summary.iterations, 1000.0);
        assert!(summary.cycles_per_iteration() > 1.0 && summary.block_reciprocal_throughput > 1.0, "{summary:?}");
        assert_eq!(parse_mca("Iterations: 10\n"), None);
    }

    #[test]
    fn code_without_a_call_free_loop_has_no_body() {
        let straight = "ffffff80400bd7d8: d503201f \tnop\nffffff80400bd7dc: d65f03c0 \tret\n";
        assert_eq!(loop_body(&parse_disassembly(straight)), None);
    }
}
