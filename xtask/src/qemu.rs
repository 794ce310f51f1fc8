//! QEMU: CPU variants, machine options, and runs under a kill-on-drop timeout. A run counts
//! only with the kernel's closing line: [`Ending`] says how each one ended.

use crate::Failure;
use crate::build::{self, Board, BuildVariant};
use crate::log::{KernelLog, LogLine, exit_sentinel};
use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The QEMU 10 CPU models tracelab runs on: four PAuth settings of `max` and the Pi 4's core.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum CpuVariant {
    MaxQarma5,
    MaxQarma3,
    MaxImpdef,
    MaxNoPauth,
    CortexA72,
}

impl CpuVariant {
    pub const ALL: [CpuVariant; 5] =
        [Self::MaxQarma5, Self::MaxQarma3, Self::MaxImpdef, Self::MaxNoPauth, Self::CortexA72];

    /// The `-cpu` argument, which is also the variant's name everywhere in tracelab.
    pub fn name(self) -> &'static str {
        match self {
            Self::MaxQarma5 => "max,pauth-qarma5=on",
            Self::MaxQarma3 => "max,pauth-qarma3=on",
            Self::MaxImpdef => "max,pauth-impdef=on",
            Self::MaxNoPauth => "max,pauth=off",
            Self::CortexA72 => "cortex-a72",
        }
    }

    /// What the kernel's banner must say on its `PAuth:` line.
    pub fn expected_pauth(self) -> &'static str {
        match self {
            Self::MaxQarma5 => "QARMA5",
            Self::MaxQarma3 => "QARMA3",
            Self::MaxImpdef => "IMPDEF",
            Self::MaxNoPauth | Self::CortexA72 => "none",
        }
    }

    pub fn parse(name: &str) -> Result<Self, String> {
        Self::ALL.into_iter().find(|cpu| cpu.name() == name).ok_or_else(|| {
            let names: Vec<_> = Self::ALL.iter().map(|cpu| cpu.name()).collect();
            format!("unknown CPU variant '{name}' (expected one of: {})", names.join(", "))
        })
    }
}

#[derive(clap::Args)]
pub struct QemuArgs {
    /// CPU variant: max,pauth-qarma5=on | max,pauth-qarma3=on | max,pauth-impdef=on |
    /// max,pauth=off | cortex-a72 (default: max,pauth-impdef=on on virt, cortex-a72 on rpi4)
    #[arg(long, value_parser = CpuVariant::parse)]
    pub cpu: Option<CpuVariant>,
    #[arg(long, value_enum, default_value = "virt")]
    pub board: Board,
    #[arg(long, value_enum, default_value = "full")]
    pub variant: BuildVariant,
    #[command(flatten)]
    pub sanitizer: build::SanitizerArgs,
    /// Exception level QEMU enters the kernel at on virt (2 = `virtualization=on`); rpi4: 2.
    #[arg(long, value_parser = clap::value_parser!(u8).range(1..=2))]
    pub el: Option<u8>,
    /// GIC version on virt (rpi4: the GIC-400, v2).
    #[arg(long, value_parser = clap::value_parser!(u8).range(2..=3))]
    pub gic: Option<u8>,
    /// CPUs (1..=4): QEMU's -smp on virt; on rpi4 (always 4 cores) how many the kernel starts.
    #[arg(long, default_value = "1", value_parser = parse_smp)]
    pub smp: u8,
    #[command(flatten)]
    pub boot_files: crate::bootfiles::BootFileArgs,
    /// What the kernel runs: the demonstration of every mechanism, the kernel test suite, the
    /// benchmarks, or a failure path (a use-after-free the sanitizer stops, a panic).
    #[arg(long, value_enum, default_value = "demo")]
    pub run: RunMode,
    /// With --run test: only tests whose name contains this; with --run bench: the suites
    /// (comma-separated, e.g. `baseline,probes`).
    #[arg(long)]
    pub filter: Option<String>,
    /// Trace every function whose name matches PATTERN (`*`, `?`) from boot to the end of the
    /// run, e.g. `kernel::task::*`; the whole ring is written to target/trace/trace.txt (Linux's
    /// `trace` format) and trace.json (Perfetto).
    #[arg(long, value_name = "PATTERN")]
    pub ftrace: Option<String>,
    /// Trace every function whose name matches PATTERN (`*`, `?`) with the function-graph
    /// tracer from boot to the end of the run: its entries and returns, printed in Linux's
    /// `function_graph` format (durations in instructions under icount, virtual ns otherwise) and
    /// written whole to target/trace/function_graph.txt. Not with --ftrace.
    #[arg(long, value_name = "PATTERN", conflicts_with = "ftrace")]
    pub ftrace_graph: Option<String>,
    /// The function tracer's dispatch scheme (default call-ops).
    #[arg(long, value_enum)]
    pub ftrace_scheme: Option<FtraceScheme>,
    /// What the sanitizer does after a report outside the demo: `panic` stops the kernel (the
    /// default), `report` (or `recover`) reports and goes on.
    #[arg(long, value_enum, value_name = "ON_FAULT")]
    pub kasan: Option<KasanOnFault>,
    /// Seed of the sanitizer heap's tag generator (decimal or 0x-hex): the same seed, the same tags.
    #[arg(long, value_name = "SEED")]
    pub tag_seed: Option<String>,
    /// Register a kprobe at boot, as Linux's `kprobe_event=`: SYMBOL[+OFFSET]:METHOD, METHOD one
    /// of single-step, brk-step, simulate, detour (e.g. `kernel::task::tick:brk-step`); a bare
    /// SYMBOL probes its first instruction after ftrace's entry. Checked before QEMU starts (the
    /// symbol, and the method on the instruction there); its hits and cost per hit are printed
    /// at the end. Repeatable.
    #[arg(long = "kprobe", value_name = "SYMBOL[+OFFSET]:METHOD")]
    pub kprobes: Vec<String>,
    /// Register a kretprobe at boot: SYMBOL:METHOD, the method of its entry probe (e.g.
    /// `kernel::demo::depot_statistics:brk-step`). Repeatable.
    #[arg(long = "kretprobe", value_name = "SYMBOL:METHOD")]
    pub kretprobes: Vec<String>,
    /// Run without `-icount`: costs are then virtual ns, i.e. TCG emulation time on this host,
    /// not hardware time (the default counts instructions, deterministically).
    #[arg(long)]
    pub no_icount: bool,
    /// Wait for a debugger on tcp::1234 (no timeout); prints the gdb command line.
    #[arg(long)]
    pub gdb: bool,
    /// Extra kernel command line words, passed as they are (e.g. `hz=250`).
    #[arg(long, default_value = "")]
    pub append: String,
    /// Kill QEMU after this many seconds.
    #[arg(long, default_value = "60")]
    pub timeout: u64,
    /// How lines are printed: `default`, or `linux` (the shapes Linux's tools read, the trace
    /// file's names included: docs/reference/log-format.md).
    #[arg(long = "log", value_enum, default_value = "default", value_name = "STYLE")]
    pub log_style: crate::log::LogStyle,
}

/// `--smp N`: 1..=4 (the kernel keeps per-CPU data for four CPUs; the Pi 4 has four cores).
pub fn parse_smp(text: &str) -> Result<u8, String> {
    match text.parse::<u8>() {
        Ok(count @ 1..=4) => Ok(count),
        _ => Err("expected a CPU count in 1..=4".to_string()),
    }
}

/// `--run`: the kernel's `run=` word.
#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum RunMode {
    Demo,
    Test,
    Bench,
    UseAfterFree,
    Panic,
    /// A BRK nobody owns: the unexpected-exception report (an Oops with `--log linux`), exit 3.
    UnownedBrk,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum FtraceScheme {
    List,
    CallOps,
    Vector,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum KasanOnFault {
    Panic,
    #[value(alias = "recover")]
    Report,
}

impl QemuArgs {
    /// `--kprobe` and `--kretprobe`, their syntax checked (before anything builds).
    pub fn probe_specs(&self) -> Result<Vec<crate::probe_spec::ProbeSpec>, Failure> {
        use crate::probe_spec::Flag;
        let kprobes = self.kprobes.iter().map(|text| (Flag::Kprobe, text));
        crate::probe_spec::parse_all(kprobes.chain(self.kretprobes.iter().map(|text| (Flag::Kretprobe, text))))
    }

    /// The kernel command line these flags mean (kernel/src/args.rs lists who reads each key), `--append` last.
    pub fn bootargs(&self, cpu: CpuVariant) -> String {
        let icount = !self.no_icount;
        let mut words = vec![
            format!("run={}", clap::ValueEnum::to_possible_value(&self.run).expect("no skipped variants").get_name()),
            "exit=semihosting".to_string(),
            format!("expect-pauth={}", cpu.expected_pauth()),
            format!("icount={}", u8::from(icount)),
        ];
        match (self.run, &self.filter) {
            (RunMode::Test, Some(filter)) => words.push(format!("filter={filter}")),
            (RunMode::Bench, Some(suites)) => words.push(format!("bench={suites}")),
            _ => {}
        }
        if self.run == RunMode::Bench {
            words.push(format!("clock={}", if icount { "cycles" } else { "ns" }));
        }
        // Under icount every tick waited for costs its interval in instructions (test/configuration.rs).
        if self.run == RunMode::Test && icount {
            words.push("hz=1000".into());
        }
        if let Some(pattern) = &self.ftrace {
            words.push(format!("ftrace={pattern}"));
        }
        if let Some(pattern) = &self.ftrace_graph {
            words.push(format!("ftrace-graph={pattern}"));
        }
        if let Some(scheme) = self.ftrace_scheme {
            let name = clap::ValueEnum::to_possible_value(&scheme).expect("no skipped variants");
            words.push(format!("ftrace-scheme={}", name.get_name()));
        }
        match self.kasan {
            Some(KasanOnFault::Panic) => words.push("kasan=panic".into()),
            Some(KasanOnFault::Report) => words.push("kasan=recover".into()),
            None => {}
        }
        if let Some(seed) = &self.tag_seed {
            words.push(format!("tag-seed={seed}"));
        }
        words.extend(self.kprobes.iter().map(|spec| format!("kprobe={spec}")));
        words.extend(self.kretprobes.iter().map(|spec| format!("kretprobe={spec}")));
        if !self.append.trim().is_empty() {
            words.push(self.append.trim().to_string());
        }
        words.join(" ")
    }
}

/// One QEMU run of one kernel image.
pub struct Machine {
    pub board: Board,
    pub cpu: CpuVariant,
    pub el: u8,
    pub gic: u8,
    /// `-icount shift=0,sleep=off`: one instruction per virtual ns, deterministic runs.
    pub icount: bool,
    /// The device tree QEMU passes (`raspi4b` needs one for the command line to arrive).
    pub dtb: Option<std::path::PathBuf>,
    /// `virt,mte=on`: QEMU emulates the Memory Tagging Extension (build variant `mte`).
    pub mte: bool,
    /// CPUs the kernel runs on (1..=4): QEMU's `-smp` on virt; on raspi4b, which always has 4,
    /// the kernel's `cpus=` (`Machine::bootargs`).
    pub smp: u8,
}

impl Machine {
    pub fn describe(&self) -> String {
        format!("{} -cpu {} EL{} GICv{} smp {}", self.board.name(), self.cpu.name(), self.el, self.gic, self.smp)
    }

    /// The kernel command line words this emulated machine needs: `cpus=N` where the board's CPUs exist
    /// whatever QEMU's `-smp` (raspi4b) and the kernel starts only the boot CPU by default.
    pub fn bootargs(&self) -> Option<String> {
        (self.board == Board::Rpi4 || self.smp != 1).then(|| format!("cpus={}", self.smp))
    }

    /// Checks the combination before anything is built or run.
    pub fn validate(&self) -> Result<(), Failure> {
        if self.board == Board::Rpi4 {
            if self.cpu != CpuVariant::CortexA72 {
                return Err(Failure::usage(format!(
                    "board rpi4 is a Cortex-A72: --cpu {} is not possible there",
                    self.cpu.name()
                )));
            }
            if self.el != 2 || self.gic != 2 {
                return Err(Failure::usage(
                    "board rpi4 enters at EL2 and has a GIC-400 (v2): --el 1 and --gic 3 are virt-only",
                ));
            }
        }
        Ok(())
    }

    fn command(&self, image: &build::KernelImage, bootargs: &str, gdb: bool, extra: &[String]) -> Command {
        let mut command = self.machine_command();
        command.args(["-display", "none", "-monitor", "none", "-serial", "stdio"]);
        self.common_args(&mut command, image, bootargs);
        command.args(extra);
        if gdb {
            command.args(["-s", "-S"]);
        }
        command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        command
    }

    /// qemu-system-aarch64 with the machine, CPU and device tree.
    fn machine_command(&self) -> Command {
        let mut command = Command::new("qemu-system-aarch64");
        match self.board {
            Board::Virt => {
                let mut machine = String::from("virt");
                if self.el == 2 {
                    machine.push_str(",virtualization=on");
                }
                machine.push_str(&format!(",gic-version={}", self.gic));
                if self.mte {
                    machine.push_str(",mte=on");
                }
                let smp = self.smp.to_string();
                command.args(["-machine", &machine, "-cpu", self.cpu.name(), "-smp", &smp, "-m", "128M"]);
            }
            // raspi4b: four Cortex-A72 (the secondaries wait in QEMU's spin table; the kernel's
            // `cpus=` says how many it starts) and 2 GiB; the raw image is loaded at 0x80000 and
            // entered at EL2, as the firmware does.
            Board::Rpi4 => {
                command.args(["-machine", "raspi4b"]);
            }
        }
        if let Some(dtb) = &self.dtb {
            command.arg("-dtb").arg(dtb);
        }
        command
    }

    /// The UART on a pseudo-terminal, the monitor on stdio, the CPU stopped until `cont`.
    fn pty_command(&self, image: &build::KernelImage, bootargs: &str) -> Command {
        let mut command = self.machine_command();
        command.args(["-display", "none", "-serial", "pty", "-monitor", "stdio", "-S"]);
        self.common_args(&mut command, image, bootargs);
        command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        command
    }

    fn common_args(&self, command: &mut Command, image: &build::KernelImage, bootargs: &str) {
        let bootargs = match self.bootargs() {
            Some(words) => format!("{bootargs} {words}"),
            None => bootargs.to_string(),
        };
        command
            .args(["-semihosting-config", "enable=on,target=native", "-no-reboot"])
            .arg("-kernel")
            .arg(&image.raw)
            .args(["-append", &bootargs]);
        // The blob's address is in virt's RAM layout.
        if self.board == Board::Virt && crate::replay::wants_blob(&bootargs) {
            match crate::replay::loader_device() {
                Ok(device) => {
                    command.args(["-device", &device]);
                }
                // The kernel then finds no blob and its suite fails the run, saying so.
                Err(error) => eprintln!("xtask: the replay's blob: {error}"),
            }
        }
        if self.icount {
            command.args(["-icount", "shift=0,sleep=off"]);
        }
    }
}

/// QEMU under a guard that kills it when dropped (timeout, error or Ctrl-C unwinding).
struct QemuProcess(Child);

impl Drop for QemuProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// How a QEMU run ended. Only the kernel's closing line `tracelab: exit status N` says the
/// kernel finished: QEMU exits 0 when a signal (SIGTERM, SIGINT, SIGHUP) stops it, so its own
/// status means nothing without that line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ending {
    /// The kernel's closing line, with its status (QEMU's agreed, or QEMU was ended after it).
    Exited(i32),
    /// Still running at the timeout, and killed.
    TimedOut(Silence),
    /// QEMU stopped on a signal before the closing line: its own `terminating on signal N from
    /// pid P (NAME)`, or the signal that killed it.
    Signal { signal: String, silence: Silence },
    /// QEMU exited with a status (None: none, a crash) before the closing line.
    NoClosingLine { qemu_status: Option<i32>, silence: Silence },
    /// The closing line says one status, QEMU's exit another.
    Disagrees { sentinel: i32, qemu_status: i32 },
    /// A serial line (a board's, or QEMU's pseudo-terminal) closed before the closing line.
    LineClosed(Silence),
}

/// What the kernel printed last, and how long before the run ended: a kernel that stops
/// printing shows as a long quiet before a timeout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Silence {
    /// The run's length in whole seconds.
    pub after_s: u64,
    /// Seconds since the last byte arrived (the whole run when nothing did).
    pub quiet_s: u64,
    pub last_line: Option<String>,
}

impl std::fmt::Display for Silence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.last_line {
            None => write!(f, "the kernel printed nothing in {} s", self.after_s),
            Some(line) if self.quiet_s >= 2 => {
                write!(f, "the kernel printed nothing in its last {} s; its last line: `{line}`", self.quiet_s)
            }
            Some(line) => write!(f, "its last line: `{line}`"),
        }
    }
}

impl Ending {
    pub fn timed_out(&self) -> bool {
        matches!(self, Self::TimedOut(_))
    }
}

impl std::fmt::Display for Ending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Exited(status) => write!(f, "the kernel exited with status {status}"),
            Self::TimedOut(silence) => write!(f, "no exit within {} s ({silence})", silence.after_s),
            Self::Signal { signal, silence } => {
                write!(f, "QEMU {signal} before the kernel's closing line ({silence})")
            }
            Self::NoClosingLine { qemu_status: Some(status), silence } => write!(
                f,
                "QEMU exited with status {status} without the kernel's closing line `tracelab: exit status N` ({silence})"
            ),
            Self::NoClosingLine { qemu_status: None, silence } => {
                write!(f, "QEMU ended without an exit status or the kernel's closing line ({silence})")
            }
            Self::Disagrees { sentinel, qemu_status } => {
                write!(f, "the kernel's closing line says status {sentinel}, QEMU exited with {qemu_status}")
            }
            Self::LineClosed(silence) => {
                write!(f, "the serial line closed before the kernel's closing line ({silence})")
            }
        }
    }
}

pub struct RunResult {
    /// The kernel's status from its closing line; None when the run did not finish (`ending`
    /// says why).
    pub status: Option<i32>,
    pub ending: Ending,
    pub log: Vec<LogLine>,
    pub stderr: String,
    pub elapsed: Duration,
}

/// What a line handed to [`run_watched`]'s watcher asks of the run.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Watch {
    Continue,
    /// Send QEMU SIGTERM, as a user's `kill` would (the check that a killed run counts for nothing).
    Terminate,
}

/// Boots `image` with `bootargs`, decoding the log as it arrives and handing each line to
/// `on_line` as it is decoded (the caller's console, or nothing).
pub fn run(
    machine: &Machine,
    image: &build::KernelImage,
    bootargs: &str,
    timeout: Option<Duration>,
    on_line: &mut dyn FnMut(&LogLine),
) -> Result<RunResult, Failure> {
    run_watched(machine, image, bootargs, timeout, &mut |line| {
        on_line(line);
        Watch::Continue
    })
}

/// [`run`], where each line's watcher may stop QEMU with SIGTERM.
pub fn run_watched(
    machine: &Machine,
    image: &build::KernelImage,
    bootargs: &str,
    timeout: Option<Duration>,
    on_line: &mut dyn FnMut(&LogLine) -> Watch,
) -> Result<RunResult, Failure> {
    run_watched_with(machine, image, bootargs, &[], timeout, on_line)
}

/// [`run_watched`] with further QEMU arguments (`-plugin ...` for `bench --events`).
pub fn run_watched_with(
    machine: &Machine,
    image: &build::KernelImage,
    bootargs: &str,
    extra: &[String],
    timeout: Option<Duration>,
    on_line: &mut dyn FnMut(&LogLine) -> Watch,
) -> Result<RunResult, Failure> {
    ensure_installed()?;
    let elf = std::fs::read(&image.elf).map_err(|error| Failure::usage(format!("{}: {error}", image.elf.display())))?;
    let start = Instant::now();
    let mut child = QemuProcess(
        machine
            .command(image, bootargs, timeout.is_none(), extra)
            .spawn()
            .map_err(|error| Failure::usage(format!("cannot start qemu-system-aarch64: {error}")))?,
    );
    let mut stdout = child.0.stdout.take().expect("piped");
    let mut stderr = child.0.stderr.take().expect("piped");
    let stderr_reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let (sender, receiver) = std::sync::mpsc::channel::<Vec<u8>>();
    let stdout_reader = std::thread::spawn(move || {
        let mut buffer = [0u8; 4096];
        while let Ok(count) = stdout.read(&mut buffer) {
            if count == 0 || sender.send(buffer[..count].to_vec()).is_err() {
                break;
            }
        }
    });
    let mut log = KernelLog::with_symbols(&elf, &image.elf)?;
    // The kernel's closing line. A kernel that could not use semihosting (a panic before it
    // read its command line on a board without it by default) parks after printing it: then
    // the line's status is the run's, as when reading a real board's serial line.
    let mut sentinel: Option<(i32, Instant)> = None;
    let mut last_output = start;
    let mut last_line: Option<String> = None;
    let mut terminated = false;
    let mut watch = |line: &LogLine, sentinel: &mut Option<(i32, Instant)>, last_line: &mut Option<String>| {
        if sentinel.is_none()
            && let Some(status) = exit_sentinel(&line.text)
        {
            *sentinel = Some((status, Instant::now()));
        }
        *last_line = Some(line.text.clone());
        on_line(line)
    };
    // QEMU's own exit: Ok(code) or Err(the signal that ended it); None while it runs or when
    // xtask killed it.
    let exit: Option<Result<i32, String>> = loop {
        while let Ok(bytes) = receiver.try_recv() {
            last_output = Instant::now();
            for line in log.feed(&bytes) {
                if watch(&line, &mut sentinel, &mut last_line) == Watch::Terminate && !terminated {
                    terminated = true;
                    terminate(&child.0);
                }
            }
        }
        if let Some(status) = child.0.try_wait().map_err(|error| Failure::usage(error.to_string()))? {
            break Some(exit_of(status));
        }
        if sentinel.is_some_and(|(_, seen)| seen.elapsed() > Duration::from_secs(2)) {
            let _ = child.0.kill();
            break None;
        }
        if timeout.is_some_and(|timeout| start.elapsed() > timeout) {
            let _ = child.0.kill();
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let _ = stdout_reader.join();
    // What is left arrived within the last poll: it does not move `last_output`.
    while let Ok(bytes) = receiver.try_recv() {
        for line in log.feed(&bytes) {
            watch(&line, &mut sentinel, &mut last_line);
        }
    }
    drop(child);
    let stderr = stderr_reader.join().unwrap_or_default();
    let elapsed = start.elapsed();
    let silence = Silence {
        after_s: elapsed.as_secs(),
        quiet_s: if last_line.is_some() { last_output.elapsed().as_secs() } else { elapsed.as_secs() },
        last_line,
    };
    let ending = ending_of(sentinel.map(|(status, _)| status), exit, &stderr, silence);
    let status = match ending {
        Ending::Exited(status) => Some(status),
        _ => None,
    };
    Ok(RunResult { status, ending, log: log.into_lines(), stderr, elapsed })
}

/// Sends QEMU SIGTERM (QEMU then says `terminating on signal 15` and exits 0).
fn terminate(child: &Child) {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// QEMU's exit: its code, or the signal that killed it.
fn exit_of(status: std::process::ExitStatus) -> Result<i32, String> {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => Ok(code),
        (None, Some(signal)) => Err(format!("was killed by signal {signal}")),
        (None, None) => Err("ended without a status".into()),
    }
}

/// How a run ended, from the kernel's closing line (`sentinel`), QEMU's exit (None: xtask
/// killed it, after the closing line or at the timeout) and QEMU's stderr, where QEMU names a
/// signal that stopped it.
fn ending_of(sentinel: Option<i32>, exit: Option<Result<i32, String>>, stderr: &str, silence: Silence) -> Ending {
    let signal_line = stderr.lines().find_map(|line| {
        let at = line.find("terminating on signal")?;
        Some(line[at..].trim().to_string())
    });
    match (sentinel, exit) {
        (Some(sentinel), Some(Ok(code))) if code != sentinel && signal_line.is_none() => {
            Ending::Disagrees { sentinel, qemu_status: code }
        }
        (Some(sentinel), _) => Ending::Exited(sentinel),
        (None, None) => Ending::TimedOut(silence),
        (None, Some(Err(signal))) => Ending::Signal { signal, silence },
        (None, Some(Ok(code))) => match signal_line {
            Some(signal) => Ending::Signal { signal, silence },
            None => Ending::NoClosingLine { qemu_status: Some(code), silence },
        },
    }
}

/// Boots `image` with its UART on a pseudo-terminal and reads the log through
/// `serial::open`/`serial::read_run`, the path a real board's serial line takes.
pub fn run_via_pty(
    machine: &Machine,
    image: &build::KernelImage,
    bootargs: &str,
    timeout: Duration,
) -> Result<crate::serial::SerialRun, Failure> {
    use std::io::{BufRead, Write};
    ensure_installed()?;
    let mut child = QemuProcess(
        machine
            .pty_command(image, bootargs)
            .spawn()
            .map_err(|error| Failure::usage(format!("cannot start qemu-system-aarch64: {error}")))?,
    );
    // QEMU names the pseudo-terminal on stdout (the monitor) before it runs anything.
    let stdout = child.0.stdout.take().expect("piped");
    let (sender, receiver) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            if sender.send(line).is_err() {
                break;
            }
        }
    });
    let pty = loop {
        let line = receiver
            .recv_timeout(Duration::from_secs(30))
            .map_err(|_| Failure::usage("QEMU did not name the pseudo-terminal of its serial port"))?;
        if let Some(rest) = line.split("char device redirected to ").nth(1) {
            break rest.split_whitespace().next().unwrap_or_default().to_string();
        }
    };
    let port = crate::serial::open(std::path::Path::new(&pty), 115_200)?;
    let mut monitor = child.0.stdin.take().expect("piped");
    monitor.write_all(b"cont\n").map_err(|error| Failure::usage(format!("QEMU monitor: {error}")))?;
    let run = crate::serial::read_run(port, &image.elf, Some(timeout), &mut |_| {})?;
    let _ = monitor.write_all(b"quit\n");
    drop(child);
    Ok(run)
}

/// `cargo xtask qemu`: build, boot, stream the log to the console that `console` makes from the
/// kernel ELF, exit with the kernel's status.
pub fn run_interactive<Console: FnMut(&LogLine)>(
    args: &QemuArgs,
    console: impl FnOnce(&[u8]) -> Console,
) -> Result<u8, Failure> {
    let (default_cpu, default_el) = match args.board {
        Board::Virt => (CpuVariant::MaxImpdef, 1),
        Board::Rpi4 => (CpuVariant::CortexA72, 2),
    };
    let mut machine = Machine {
        board: args.board,
        cpu: args.cpu.unwrap_or(default_cpu),
        el: args.el.unwrap_or(default_el),
        gic: args.gic.unwrap_or(2),
        icount: !args.no_icount,
        dtb: None,
        mte: args.variant == BuildVariant::Mte,
        smp: args.smp,
    };
    machine.validate()?;
    args.variant.check_machine(machine.board, machine.cpu.name())?;
    if args.filter.is_some() && !matches!(args.run, RunMode::Test | RunMode::Bench) {
        return Err(Failure::usage("--filter selects tests (--run test) or bench suites (--run bench)"));
    }
    if args.run == RunMode::Test
        && let Some(filter) = &args.filter
    {
        crate::names::check_test_filter(filter)?;
    }
    if let Some(pattern) = &args.ftrace_graph {
        crate::function_graph::check_pattern(pattern).map_err(Failure::usage)?;
    }
    let probes = args.probe_specs()?;
    ensure_installed()?;
    if args.board == Board::Rpi4 {
        let files = crate::bootfiles::get(&args.boot_files)?;
        eprintln!("xtask: {}", files.source);
        machine.dtb = Some(files.dtb);
    }
    let image = build::kernel_with(args.board, args.variant, args.sanitizer.options(&[args.variant])?)?;
    crate::probe_spec::check_image(&probes, &image.elf, args.variant.name())?;
    let bootargs = args.bootargs(machine.cpu);
    eprintln!(
        "xtask: booting {} (variant {}{}): {bootargs}",
        machine.describe(),
        args.variant.name(),
        if machine.icount { ", -icount" } else { "" }
    );
    if args.gdb {
        eprintln!(
            "xtask: QEMU waits for a debugger; in another terminal: gdb-multiarch -q {} -ex 'target remote :1234'",
            image.elf.display()
        );
    }
    let timeout = (!args.gdb).then(|| Duration::from_secs(args.timeout));
    let elf = std::fs::read(&image.elf).map_err(|error| Failure::usage(format!("{}: {error}", image.elf.display())))?;
    let result = run(&machine, &image, &bootargs, timeout, &mut console(&elf))?;
    if !result.stderr.trim().is_empty() {
        eprint!("{}", result.stderr);
    }
    match result.ending {
        Ending::Exited(status) => Ok(status.clamp(0, 255) as u8),
        ending => Err(Failure {
            status: if ending.timed_out() { 124 } else { 1 },
            message: format!("QEMU ({}): {ending}", machine.describe()),
        }),
    }
}

// Installation lives with the rest of the host set-up.
pub use crate::setup::{ensure_qemu as ensure_installed, qemu_version as version};

#[cfg(test)]
mod tests {
    use super::*;

    fn silence(last_line: Option<&str>) -> Silence {
        Silence { after_s: 30, quiet_s: 25, last_line: last_line.map(str::to_string) }
    }

    #[test]
    fn only_the_closing_line_makes_a_finished_run() {
        // QEMU exits 0 on SIGTERM and says why on stderr: a signal, not a success.
        let stderr = "qemu-system-aarch64: terminating on signal 15 from pid 4242 (kill)\n";
        let ending = ending_of(None, Some(Ok(0)), stderr, silence(Some("bench row: baseline loop - per_op ns 2")));
        assert!(
            matches!(&ending, Ending::Signal { signal, .. } if signal == "terminating on signal 15 from pid 4242 (kill)")
        );
        assert!(
            ending
                .to_string()
                .starts_with("QEMU terminating on signal 15 from pid 4242 (kill) before the kernel's closing line")
        );
        // Killed outright (SIGKILL): no status, the signal.
        let killed = ending_of(None, Some(Err("was killed by signal 9".into())), "", silence(None));
        assert_eq!(
            killed.to_string(),
            "QEMU was killed by signal 9 before the kernel's closing line (the kernel printed nothing in 30 s)"
        );
        // Exit 0 without the line.
        let silent = ending_of(None, Some(Ok(0)), "", silence(Some("bench suite: baseline")));
        assert_eq!(
            silent,
            Ending::NoClosingLine { qemu_status: Some(0), silence: silence(Some("bench suite: baseline")) }
        );
        // Timeout: a kernel that stopped printing says for how long, and what it printed last.
        let hung = ending_of(None, None, "", silence(Some("test start: smp_churn")));
        assert!(hung.timed_out());
        assert_eq!(
            hung.to_string(),
            "no exit within 30 s (the kernel printed nothing in its last 25 s; its last line: `test start: smp_churn`)"
        );
    }

    #[test]
    fn the_closing_line_gives_the_status() {
        assert_eq!(ending_of(Some(3), Some(Ok(3)), "", silence(None)), Ending::Exited(3));
        // Parked after its line (no semihosting): xtask ended QEMU.
        assert_eq!(ending_of(Some(0), None, "", silence(None)), Ending::Exited(0));
        // A signal after the line does not undo a finished run.
        assert_eq!(
            ending_of(Some(0), Some(Ok(0)), "terminating on signal 2 from pid 1 (sh)", silence(None)),
            Ending::Exited(0)
        );
        assert_eq!(
            ending_of(Some(0), Some(Ok(1)), "", silence(None)),
            Ending::Disagrees { sentinel: 0, qemu_status: 1 }
        );
    }
}
