//! Probe requests (`--kprobe`, `--kretprobe`, `stress probes --probe`) checked on the host.
//!
//! The kernel honours these requests at boot (`kernel/src/demo/boot_probes.rs`, the sweep's
//! `sweep.probe=` in `kernel/src/sweep/mod.rs`), where a mistake is one WARN line in a run that
//! goes on. xtask checks them first, in two steps, and a mistake exits 2 with the reason:
//! [`parse`] checks the syntax and the method before anything builds; [`KernelText::check`]
//! then resolves the symbol in the built image's own symbol table (the `.ksyms` section the
//! kernel reads), applies the kernel's address rules (`kernel/src/probes/refuse.rs`) and asks
//! `crates/probes` for the method's plan on the instruction there, before QEMU starts.

use crate::Failure;
use crate::names::{close_names, did_you_mean};
use object::{Object, ObjectSection, ObjectSymbol};
use probes::{AddressRefusal, Insn, KernelLayout, Method, Plan, Refusal, Rules, Text};
use std::path::Path;

/// The flag a request came from: each has its own syntax.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Flag {
    /// `--kprobe SYMBOL[+OFFSET]:METHOD`: a bare symbol means its first instruction after the
    /// patchable entry.
    Kprobe,
    /// `--kretprobe SYMBOL:METHOD`: the method of its entry probe.
    Kretprobe,
    /// `stress probes --probe FUNCTION+OFFSET:METHOD`: an offset from the function's symbol, as a
    /// sweep failure prints it.
    SweepProbe,
}

impl Flag {
    pub fn name(self) -> &'static str {
        match self {
            Self::Kprobe => "--kprobe",
            Self::Kretprobe => "--kretprobe",
            Self::SweepProbe => "--probe",
        }
    }

    fn syntax(self) -> &'static str {
        match self {
            Self::Kprobe => "SYMBOL[+OFFSET]:METHOD",
            Self::Kretprobe => "SYMBOL:METHOD",
            Self::SweepProbe => "FUNCTION+OFFSET:METHOD",
        }
    }
}

/// A request whose syntax is right.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeSpec {
    pub flag: Flag,
    /// As the user wrote it.
    pub text: String,
    pub symbol: String,
    pub offset: Option<u64>,
    pub method: Method,
}

fn method_names() -> String {
    Method::ALL.map(Method::name).join(", ")
}

/// Checks the syntax of `text` given to `flag`: the kernel's own parse (`boot_probes::register`,
/// the sweep's `parse_place`), plus what it would only find at boot.
pub fn parse(flag: Flag, text: &str) -> Result<ProbeSpec, String> {
    let fail = |reason: String| Err(format!("{} {text}: {reason}", flag.name()));
    if text.contains(char::is_whitespace) {
        return fail(match flag {
            Flag::SweepProbe => {
                "no spaces: write the function's name without them, as a sweep failure prints it".into()
            }
            _ => "no spaces: the kernel's command line is split at them".into(),
        });
    }
    // The method follows the last colon that is not half of a path's `::`.
    let Some((target, method)) = text.rsplit_once(':').filter(|(target, _)| !target.ends_with(':')) else {
        return fail(format!("expected {} with METHOD one of {}", flag.syntax(), method_names()));
    };
    let Some(method) = Method::ALL.into_iter().find(|known| known.name() == method) else {
        let close = close_names(method, Method::ALL.map(Method::name));
        return fail(format!("unknown method `{method}`{}: one of {}", did_you_mean(&close), method_names()));
    };
    // The kernel splits a kprobe at its first `+`, the sweep at its last.
    let split = match flag {
        Flag::SweepProbe => target.rsplit_once('+'),
        _ => target.split_once('+'),
    };
    let (symbol, offset) = match split {
        Some((symbol, offset)) => (symbol, Some(offset)),
        None => (target, None),
    };
    if symbol.is_empty() {
        return fail(format!(
            "expected {}: no {}",
            flag.syntax(),
            flag.syntax().split(['[', '+', ':']).next().unwrap_or("")
        ));
    }
    let offset = match offset {
        None => None,
        Some(number) => {
            let value = match number.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16).ok(),
                None => number.parse().ok(),
            };
            let Some(value) = value else {
                return fail(format!("the offset `{number}` is not a number (decimal or 0x-hex)"));
            };
            if value % 4 != 0 {
                return fail(format!(
                    "offset {value:#x} is not on an instruction boundary (A64 instructions are 4 bytes: \
                     0x0, 0x4, 0x8, ...)"
                ));
            }
            Some(value)
        }
    };
    match (flag, offset) {
        (Flag::Kretprobe, Some(_)) => return fail("a kretprobe takes a function, not an offset".into()),
        (Flag::SweepProbe, None) => {
            return fail("expected FUNCTION+OFFSET:METHOD (the offset from the function's symbol, e.g. +0x8)".into());
        }
        _ => {}
    }
    Ok(ProbeSpec { flag, text: text.to_string(), symbol: symbol.to_string(), offset, method })
}

/// [`parse`] of every request, all mistakes in one exit-2 failure.
pub fn parse_all<'a>(requests: impl IntoIterator<Item = (Flag, &'a String)>) -> Result<Vec<ProbeSpec>, Failure> {
    let mut specs = Vec::new();
    let mut mistakes = Vec::new();
    for (flag, text) in requests {
        match parse(flag, text) {
            Ok(spec) => specs.push(spec),
            Err(mistake) => mistakes.push(mistake),
        }
    }
    if mistakes.is_empty() { Ok(specs) } else { Err(Failure::usage(mistakes.join("\nxtask: "))) }
}

/// Where a request resolved and what a hit will do there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placed {
    pub address: u64,
    /// `SYMBOL+0xOFF`.
    pub place: String,
    pub disassembly: String,
    pub plan: Plan,
}

/// The parts of a built kernel image the probe rules read.
pub struct KernelText<'data> {
    file: object::File<'data>,
    /// The kernel's own symbol table (`ksyms.rs` wrote it): what `kprobe=` resolves against.
    symbols: protocol::ksyms::Table<'data>,
    text: (u64, u64),
    user_text: (u64, u64),
    noprobe: (u64, u64),
    /// `__patchable_function_entries`: the first NOP of each instrumented function's entry.
    patchable: Vec<u64>,
}

impl<'data> KernelText<'data> {
    pub fn parse(elf: &'data [u8]) -> Result<Self, String> {
        let file = object::File::parse(elf).map_err(|error| format!("kernel ELF: {error}"))?;
        let section = |name: &str| -> Result<&'data [u8], String> {
            file.section_by_name(name)
                .ok_or_else(|| format!("kernel ELF has no {name} section"))?
                .data()
                .map_err(|error| format!("{name}: {error}"))
        };
        let symbols = protocol::ksyms::Table::new(section(".ksyms")?)
            .ok_or("the kernel ELF's .ksyms holds no symbol table (not built by xtask)")?;
        let mut patchable: Vec<u64> = match file.section_by_name("__patchable_function_entries") {
            Some(entries) => entries
                .data()
                .map_err(|error| error.to_string())?
                .chunks_exact(8)
                .map(|chunk| u64::from_le_bytes(chunk.try_into().expect("8 bytes")))
                .collect(),
            // The `plain` variant has no ftrace entries.
            None => Vec::new(),
        };
        patchable.sort_unstable();
        let linker = |name: &str| -> Result<u64, String> {
            file.symbols()
                .find(|symbol| symbol.name() == Ok(name))
                .map(|symbol| symbol.address())
                .ok_or_else(|| format!("kernel ELF has no symbol {name}"))
        };
        Ok(Self {
            text: (linker("__kernel_start")?, linker("__text_end")?),
            user_text: (linker("__user_text_start")?, linker("__user_text_end")?),
            noprobe: (linker("__noprobe_start")?, linker("__noprobe_end")?),
            symbols,
            patchable,
            file,
        })
    }

    /// The instruction word at `address`, from the section that holds it.
    fn word(&self, address: u64) -> Option<u32> {
        let section = self
            .file
            .sections()
            .find(|section| (section.address()..section.address() + section.size()).contains(&address))?;
        let data = section.data().ok()?;
        let at = (address - section.address()) as usize;
        Some(u32::from_le_bytes(data.get(at..at + 4)?.try_into().ok()?))
    }

    /// The function called `name` (the sweep ignores spaces) and where the next one starts.
    fn function(&self, name: &str, ignore_spaces: bool) -> Option<(usize, u64, u64)> {
        let compact = |text: &str| text.chars().filter(|&c| c != ' ').collect::<String>();
        let wanted = if ignore_spaces { compact(name) } else { name.to_string() };
        let index = (0..self.symbols.len()).find(|&index| {
            let candidate = self.symbols.name(index);
            if ignore_spaces { compact(candidate) == wanted } else { candidate == wanted }
        })?;
        let start = self.symbols.address(index);
        let end = (index + 1..self.symbols.len())
            .map(|next| self.symbols.address(next))
            .find(|&next| next > start)
            .unwrap_or(self.text.1);
        Some((index, start, end))
    }

    fn instrumented(&self, function: u64) -> bool {
        self.patchable.binary_search(&function.wrapping_sub(8)).is_ok()
    }

    /// The kernel's `kretprobe::attach_address`: past ftrace's two entry words when it owns them.
    fn attach_address(&self, function: u64) -> u64 {
        if self.instrumented(function) { function + 8 } else { function }
    }

    /// The instruction at `address`, as `crates/probes`' decoder prints it, with its word.
    pub fn disassemble(&self, address: u64) -> String {
        match self.word(address) {
            Some(word) => format!("{} [{word:#010x}]", disassemble_word(address, word)),
            None => "(not in the image)".into(),
        }
    }

    /// The kernel's address rules (`crates/probes`' `KernelLayout::check` and
    /// `inside_exclusive_sequence`, as `refuse::check_address` and `check_exclusive_window` apply
    /// them), on the image's layout and words.
    fn check_address(&self, address: u64) -> Result<(), String> {
        let layout = KernelLayout {
            text: self.text.0..self.text.1,
            user_text: self.user_text.0..self.user_text.1,
            noprobe: self.noprobe.0..self.noprobe.1,
            patchable_entries: &self.patchable,
        };
        layout.check(address).map_err(|refusal| {
            match refusal {
                AddressRefusal::NotText => "address is not kernel text",
                AddressRefusal::UserText => "address is EL0 code (.text.user): probe it with a uprobe",
                AddressRefusal::NoProbe => {
                    "no-probe text: boot code, exception vectors and handlers, the probe hit path and slots, \
                     logging or the sanitizer runtime"
                }
                AddressRefusal::FtraceCallsite => {
                    "patchable function entry: owned by ftrace (probe the first instruction after it)"
                }
            }
            .to_string()
        })?;
        if probes::inside_exclusive_sequence(address, self.text.0, |at| self.word(at)) {
            return Err("inside an LDXR/STXR sequence (the trap clears the exclusive monitor)".into());
        }
        Ok(())
    }

    /// Resolves `spec` and plans its method on the instruction there; Err: why not, with the
    /// instruction and what would work (close names, other methods, the next instruction that
    /// takes the method).
    pub fn check(&self, spec: &ProbeSpec) -> Result<Placed, String> {
        let fail = |reason: String| Err(format!("{} {}: {reason}", spec.flag.name(), spec.text));
        let Some((_, function, end)) = self.function(&spec.symbol, spec.flag == Flag::SweepProbe) else {
            let names = (0..self.symbols.len()).map(|index| self.symbols.name(index));
            let close = close_names(&spec.symbol, names);
            return fail(format!("no function `{}` in the kernel's symbol table{}", spec.symbol, did_you_mean(&close)));
        };
        if spec.flag == Flag::SweepProbe && !self.instrumented(function) {
            return fail(format!(
                "`{}` is not swept: the sweep probes the functions with a patchable entry (ftrace's)",
                spec.symbol
            ));
        }
        let address = match spec.offset {
            Some(offset) => function + offset,
            None => self.attach_address(function),
        };
        let place = format!("{}+{:#x}", spec.symbol, address - function);
        if address >= end {
            return fail(format!(
                "offset {:#x} is past the end of `{}` ({} bytes)",
                address - function,
                spec.symbol,
                end - function
            ));
        }
        let at = format!("\n    {place} ({address:#x}): {}", self.disassemble(address));
        if let Err(reason) = self.check_address(address) {
            return fail(format!("{reason}{at}"));
        }
        let word = self
            .word(address)
            .ok_or_else(|| format!("{} {}: {place} is not in the image", spec.flag.name(), spec.text))?;
        match plan_word(word, spec.method) {
            Ok(plan) => Ok(Placed { address, place, disassembly: self.disassemble(address), plan }),
            Err(refusal) => {
                let others: Vec<&str> = Method::ALL
                    .into_iter()
                    .filter(|&method| method != spec.method && plan_word(word, method).is_ok())
                    .map(Method::name)
                    .collect();
                let mut help = match others.as_slice() {
                    [] => "\n    no method takes this instruction".to_string(),
                    others => format!("\n    methods that take it: {}", others.join(", ")),
                };
                if spec.flag != Flag::Kretprobe
                    && let Some(next) = (address + 4..end).step_by(4).find(|&next| {
                        self.check_address(next).is_ok()
                            && self.word(next).is_some_and(|word| plan_word(word, spec.method).is_ok())
                    })
                {
                    help.push_str(&format!(
                        "\n    the next instruction that {} takes: {}+{:#x}:{} ({})",
                        spec.method.name(),
                        spec.symbol,
                        next - function,
                        spec.method.name(),
                        self.disassemble(next)
                    ));
                }
                fail(format!("{} refuses it: {}{at}{help}", spec.method.name(), refusal_reason(refusal)))
            }
        }
    }
}

/// `crates/probes`' plan for `method` on `word` in kernel text, with the kernel's rules for a
/// boot probe (no post-handler).
fn plan_word(word: u32, method: Method) -> Result<Plan, Refusal> {
    let rules = Rules { text: Text::Kernel, stack_reach: probes::KERNEL_STACK_REACH, post_handler: false };
    probes::plan(method, &probes::classify(Insn(word)), &rules)
}

/// The kernel's words for a refusal (`ProbeError::as_str`, kernel text).
fn refusal_reason(refusal: Refusal) -> String {
    match refusal {
        Refusal::Rejected(reason) => reason.as_str().into(),
        Refusal::NeedsOriginalPc => {
            "instruction reads or writes the PC: cannot run out of line (use simulate or detour)".into()
        }
        Refusal::NotSimulated => "instruction is stepped, not simulated, by crates/probes".into(),
        Refusal::StackBeyondGap => {
            "simulated SP-based access could reach below SP - (STACK_GAP - 16): the exception frame".into()
        }
        Refusal::DetourBlrX30 => "detour cannot rewrite BLR X30 (no free register for the return address)".into(),
        Refusal::DetourPostHandler => "detour runs handlers before the instruction only: no post-handler".into(),
    }
}

/// The A64 instruction `word` at `address`, by disarm64 (the decoder `crates/probes` uses).
pub fn disassemble_word(address: u64, word: u32) -> String {
    match disarm64::decoder::decode(word) {
        Some(opcode) => {
            let mut text = String::new();
            match disarm64::format_insn::format_insn_pc(address, &mut text, &opcode) {
                // The decoder pads the mnemonic with tabs; one space reads better in a message.
                Ok(()) => text.split_whitespace().collect::<Vec<_>>().join(" "),
                Err(_) => format!(".inst {word:#010x}"),
            }
        }
        None => format!(".inst {word:#010x} (unallocated)"),
    }
}

/// Checks every spec against the image at `elf` (built for `variant`): prints where each one
/// goes, or exits 2 with every refusal.
pub fn check_image(specs: &[ProbeSpec], elf: &Path, variant: &str) -> Result<(), Failure> {
    if specs.is_empty() {
        return Ok(());
    }
    let data = std::fs::read(elf).map_err(|error| Failure::usage(format!("{}: {error}", elf.display())))?;
    let text = KernelText::parse(&data).map_err(Failure::usage)?;
    let mut refused = Vec::new();
    // The kernel keeps one probe per address: a second request there is refused at boot.
    let mut taken: Vec<(u64, &ProbeSpec)> = Vec::new();
    for spec in specs {
        match text.check(spec) {
            Ok(placed) if let Some((_, first)) = taken.iter().find(|(address, _)| *address == placed.address) => {
                refused.push(format!(
                    "{} {}: {} ({:#x}) is already probed by {} {}: one probe per address",
                    spec.flag.name(),
                    spec.text,
                    placed.place,
                    placed.address,
                    first.flag.name(),
                    first.text
                ));
            }
            Ok(placed) => {
                taken.push((placed.address, spec));
                eprintln!(
                    "xtask: {} {}: {} ({:#x}): {} ({})",
                    spec.flag.name(),
                    spec.text,
                    placed.place,
                    placed.address,
                    placed.disassembly,
                    plan_name(&placed.plan)
                );
            }
            Err(reason) => refused.push(reason),
        }
    }
    if refused.is_empty() {
        Ok(())
    } else {
        Err(Failure::usage(format!("{}\n(variant {variant}; nothing was run)", refused.join("\nxtask: "))))
    }
}

fn plan_name(plan: &Plan) -> &'static str {
    match plan {
        Plan::Simulate(_) | Plan::SimulateFramePush => "simulated",
        Plan::OutOfLine { hardware_step: true } => "stepped out of line, single-step",
        Plan::OutOfLine { hardware_step: false } => "stepped out of line, brk-step",
        Plan::Detour => "detoured",
    }
}

/// A probe example one of the `--help` texts shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HelpExample {
    /// `qemu` or `stress probes`.
    pub command: &'static str,
    pub flag: Flag,
    pub text: String,
}

/// Every `--kprobe`, `--kretprobe` and `stress probes --probe` example in the help texts: the
/// backquoted requests (`SYMBOL...:METHOD`, not the syntax itself) of each flag's help.
pub fn help_examples() -> Vec<HelpExample> {
    use clap::Args;
    let qemu = crate::qemu::QemuArgs::augment_args(clap::Command::new("qemu"));
    let stress = crate::stress::StressArgs::augment_args(clap::Command::new("stress"));
    let sweep = stress.find_subcommand("probes").expect("stress has `probes`").clone();
    let flags = [
        ("qemu", &qemu, "kprobe", Flag::Kprobe),
        ("qemu", &qemu, "kretprobe", Flag::Kretprobe),
        ("stress probes", &sweep, "probe", Flag::SweepProbe),
    ];
    let mut examples = Vec::new();
    for (command, arguments, long, flag) in flags {
        let Some(argument) = arguments.get_arguments().find(|argument| argument.get_long() == Some(long)) else {
            continue;
        };
        let help = argument.get_long_help().or(argument.get_help()).map(ToString::to_string).unwrap_or_default();
        examples.extend(
            help.split('`')
                .skip(1)
                .step_by(2)
                .filter(|quoted| quoted.contains(':') && !quoted.contains(['=', ' ']) && !quoted.contains("METHOD"))
                .map(|quoted| HelpExample { command, flag, text: quoted.to_string() }),
        );
    }
    examples
}

/// The variants an example runs in by default: `qemu`'s `full`, `stress probes`' `full` and `prod`.
fn default_variants(flag: Flag) -> &'static [crate::build::BuildVariant] {
    use crate::build::BuildVariant;
    match flag {
        Flag::SweepProbe => &[BuildVariant::Full, BuildVariant::Prod],
        Flag::Kprobe | Flag::Kretprobe => &[BuildVariant::Full],
    }
}

/// The checks `cargo xtask test` runs: every help example resolves and plans in its default
/// variants' images; a wrong request given to `cargo xtask qemu` and `stress probes` exits 2
/// before QEMU starts. Each is reported as one check.
pub fn self_test(report: &mut dyn FnMut(&str, Option<String>)) -> Result<(), Failure> {
    let examples = help_examples();
    report(
        "help texts show a probe example for --kprobe, --kretprobe and stress --probe",
        [Flag::Kprobe, Flag::Kretprobe, Flag::SweepProbe]
            .into_iter()
            .find(|flag| !examples.iter().any(|example| example.flag == *flag))
            .map(|flag| format!("no example of {}", flag.name())),
    );
    for variant in [crate::build::BuildVariant::Full, crate::build::BuildVariant::Prod] {
        let chosen: Vec<&HelpExample> =
            examples.iter().filter(|example| default_variants(example.flag).contains(&variant)).collect();
        if chosen.is_empty() {
            continue;
        }
        let image = crate::build::kernel(crate::build::Board::Virt, variant)?;
        let data =
            std::fs::read(&image.elf).map_err(|error| Failure::usage(format!("{}: {error}", image.elf.display())))?;
        let text = KernelText::parse(&data).map_err(Failure::usage)?;
        for example in chosen {
            let problem = parse(example.flag, &example.text).and_then(|spec| text.check(&spec)).err();
            report(
                &format!(
                    "help example `cargo xtask {} {} {}` resolves and plans in variant {}",
                    example.command,
                    example.flag.name(),
                    example.text,
                    variant.name()
                ),
                problem,
            );
        }
    }
    let refused = [
        (&["qemu", "--kprobe", "nope:simulate"][..], "no function `nope`"),
        (&["stress", "probes", "--probe", "foo"][..], "expected FUNCTION+OFFSET:METHOD"),
    ];
    for (args, reason) in refused {
        let problem = exits_2_before_qemu(args, reason)?;
        report(&format!("`cargo xtask {}` exits 2 before QEMU starts", args.join(" ")), problem);
    }
    Ok(())
}

/// How long a refused request may take: a build that finds the image current, and the check.
const REFUSAL_WITHIN: std::time::Duration = std::time::Duration::from_secs(90);

/// Runs this xtask with `args` as a child, with a `qemu-system-aarch64` first on PATH that notes
/// every start other than a version query and then runs the real one: None when the child exits
/// 2 within [`REFUSAL_WITHIN`], says `reason` and started no QEMU.
fn exits_2_before_qemu(args: &[&str], reason: &str) -> Result<Option<String>, Failure> {
    use std::os::unix::fs::PermissionsExt;
    use std::time::Instant;
    let paths = std::env::var_os("PATH").unwrap_or_default();
    let real = std::env::split_paths(&paths)
        .map(|dir| dir.join("qemu-system-aarch64"))
        .find(|path| path.is_file())
        .ok_or_else(|| Failure::usage("qemu-system-aarch64 is not on PATH"))?;
    let scratch = std::env::temp_dir().join(format!("tracelab-refusal-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).map_err(|error| Failure::usage(format!("{}: {error}", scratch.display())))?;
    let started = scratch.join("started");
    let wrapper = scratch.join("qemu-system-aarch64");
    let script = format!(
        "#!/bin/sh\ncase \"$1\" in --version|-version) ;; *) echo \"$*\" >> '{}' ;; esac\nexec '{}' \"$@\"\n",
        started.display(),
        real.display()
    );
    let written = std::fs::write(&wrapper, script)
        .and_then(|()| std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)));
    written.map_err(|error| Failure::usage(format!("{}: {error}", wrapper.display())))?;
    let mut path = vec![scratch.clone()];
    path.extend(std::env::split_paths(&paths));
    let exe = std::env::current_exe().map_err(|error| Failure::usage(format!("xtask's own path: {error}")))?;
    let start = Instant::now();
    let output = std::process::Command::new(exe)
        .args(args)
        .env("PATH", std::env::join_paths(path).map_err(|error| Failure::usage(error.to_string()))?)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|error| Failure::usage(format!("cannot run xtask: {error}")))?;
    let elapsed = start.elapsed();
    let qemu_started = std::fs::read_to_string(&started).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&scratch);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let problem = if !qemu_started.is_empty() {
        Some(format!("QEMU started: {}", qemu_started.trim()))
    } else if output.status.code() != Some(2) {
        Some(format!("exit status {}, expected 2; stderr: {}", output.status, stderr.trim()))
    } else if !stderr.contains(reason) {
        Some(format!("the message does not say `{reason}`: {}", stderr.trim()))
    } else if elapsed > REFUSAL_WITHIN {
        Some(format!("took {:.0} s (at most {} s)", elapsed.as_secs_f64(), REFUSAL_WITHIN.as_secs()))
    } else {
        None
    };
    Ok(problem)
}

#[cfg(test)]
mod tests {
    use super::*;
    use probes::RejectReason;

    fn refused(flag: Flag, text: &str) -> String {
        parse(flag, text).expect_err(text)
    }

    #[test]
    fn the_syntax_is_checked_before_anything_builds() {
        let spec = parse(Flag::Kprobe, "kernel::task::tick+0x8:simulate").expect("valid");
        assert_eq!((spec.symbol.as_str(), spec.offset, spec.method), ("kernel::task::tick", Some(8), Method::Simulate));
        let bare = parse(Flag::Kretprobe, "kernel::task::tick:brk-step").expect("valid");
        assert_eq!((bare.offset, bare.method), (None, Method::BrkStep));
        let sweep = parse(Flag::SweepProbe, "<a<1,2>>::find+12:detour").expect("valid");
        assert_eq!((sweep.symbol.as_str(), sweep.offset), ("<a<1,2>>::find", Some(12)));

        assert!(refused(Flag::SweepProbe, "foo").contains("expected FUNCTION+OFFSET:METHOD"));
        // `::` is a path, not the method's colon.
        assert!(refused(Flag::Kprobe, "kernel::task::tick").contains("expected SYMBOL[+OFFSET]:METHOD"));
        let typo = refused(Flag::Kprobe, "tick:simulat");
        assert!(typo.contains("did you mean `simulate`?"), "{typo}");
        assert!(typo.contains("single-step, brk-step, simulate, detour"), "{typo}");
        assert!(refused(Flag::Kprobe, "tick+2:simulate").contains("not on an instruction boundary"));
        assert!(refused(Flag::Kprobe, "tick+zz:simulate").contains("not a number"));
        assert!(refused(Flag::Kretprobe, "tick+4:simulate").contains("not an offset"));
        assert!(refused(Flag::SweepProbe, "tick:simulate").contains("FUNCTION+OFFSET:METHOD"));
        assert!(refused(Flag::Kprobe, ":simulate").contains("no SYMBOL"));
        assert!(refused(Flag::Kprobe, "a b:simulate").contains("no spaces"));
    }

    #[test]
    fn every_mistake_is_named_at_once() {
        let requests = ["nope:simulate".to_string(), "x+1:detour".to_string(), "y:step".to_string()];
        let failure = parse_all(requests.iter().map(|text| (Flag::Kprobe, text))).expect_err("two mistakes");
        assert_eq!(failure.status, 2);
        assert_eq!(failure.message.matches("--kprobe").count(), 2, "{}", failure.message);
    }

    #[test]
    fn plans_of_real_instructions() {
        const PUSH: u32 = 0xa9bf_7bfd; // stp x29, x30, [sp, #-16]!
        const RET: u32 = 0xd65f_03c0; // ret
        const PACIASP: u32 = 0xd503_233f;
        const MSR_DAIF: u32 = 0xd51b_4220; // msr daif, x0
        const DEEP_PUSH: u32 = 0xa9b0_7bfd; // stp x29, x30, [sp, #-256]!
        assert_eq!(plan_word(PUSH, Method::Simulate), Ok(Plan::SimulateFramePush));
        assert!(matches!(plan_word(PUSH, Method::BrkStep), Ok(Plan::OutOfLine { hardware_step: false })));
        assert_eq!(plan_word(RET, Method::SingleStep), Err(Refusal::NeedsOriginalPc));
        assert_eq!(plan_word(PACIASP, Method::Simulate), Err(Refusal::NotSimulated));
        assert!(plan_word(PACIASP, Method::BrkStep).is_ok());
        assert_eq!(plan_word(MSR_DAIF, Method::Detour), Err(Refusal::Rejected(RejectReason::SystemRegisterWrite)));
        assert_eq!(plan_word(DEEP_PUSH, Method::Simulate), Err(Refusal::StackBeyondGap));
        assert_eq!(disassemble_word(0x1000, PUSH), "stp x29, x30, [sp, #-16]!");
        assert_eq!(disassemble_word(0x1000, RET), "ret x30");
    }

    #[test]
    fn the_help_examples_are_found_and_parse() {
        let examples = help_examples();
        for flag in [Flag::Kprobe, Flag::Kretprobe, Flag::SweepProbe] {
            assert!(examples.iter().any(|example| example.flag == flag), "no example of {}", flag.name());
        }
        for example in &examples {
            parse(example.flag, &example.text).unwrap_or_else(|mistake| panic!("{mistake}"));
        }
    }

    /// The exclusive-window rule xtask applies is `crates/probes`' (its own tests cover the
    /// window); the kinds it reads must be the kernel's.
    #[test]
    fn exclusives_are_told_apart() {
        use probes::{Exclusive, exclusive_kind};
        assert!(matches!(exclusive_kind(0xc85f_7c20), Some(Exclusive::Load))); // ldxr x0, [x1]
        assert!(matches!(exclusive_kind(0xc802_7c20), Some(Exclusive::Store))); // stxr w2, x0, [x1]
        assert!(exclusive_kind(0xa9bf_7bfd).is_none());
    }
}
