//! QEMU: CPU variants, machine options, and runs under a kill-on-drop timeout.

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
    /// of single-step, brk-step, simulate, detour (e.g. `kernel::task::tick:simulate`); its hits
    /// and cost per hit are printed at the end. Repeatable.
    #[arg(long = "kprobe", value_name = "SYMBOL[+OFFSET]:METHOD")]
    pub kprobes: Vec<String>,
    /// Register a kretprobe at boot: SYMBOL:METHOD (the method of its entry probe). Repeatable.
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

    fn command(&self, image: &build::KernelImage, bootargs: &str, gdb: bool) -> Command {
        let mut command = self.machine_command();
        command.args(["-display", "none", "-monitor", "none", "-serial", "stdio"]);
        self.common_args(&mut command, image, bootargs);
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

pub struct RunResult {
    /// QEMU's exit status (the kernel's, through semihosting); None if killed on timeout.
    pub status: Option<i32>,
    pub log: Vec<LogLine>,
    pub stderr: String,
    pub elapsed: Duration,
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
    ensure_installed()?;
    let elf = std::fs::read(&image.elf).map_err(|error| Failure::usage(format!("{}: {error}", image.elf.display())))?;
    let start = Instant::now();
    let mut child = QemuProcess(
        machine
            .command(image, bootargs, timeout.is_none())
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
    // The kernel's last line. A kernel that could not use semihosting (a panic before it read
    // its command line on a board without it by default) parks after printing it: then the
    // sentinel's status is the run's, as when reading a real board's serial line.
    let mut sentinel: Option<(i32, Instant)> = None;
    let status = loop {
        while let Ok(bytes) = receiver.try_recv() {
            for line in log.feed(&bytes) {
                on_line(&line);
                if let Some(status) = exit_sentinel(&line.text) {
                    sentinel = Some((status, Instant::now()));
                }
            }
        }
        if let Some(status) = child.0.try_wait().map_err(|error| Failure::usage(error.to_string()))? {
            break Some(status.code().unwrap_or(-1));
        }
        if let Some((status, seen)) = sentinel
            && seen.elapsed() > Duration::from_secs(2)
        {
            let _ = child.0.kill();
            break Some(status);
        }
        if timeout.is_some_and(|timeout| start.elapsed() > timeout) {
            let _ = child.0.kill();
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let _ = stdout_reader.join();
    while let Ok(bytes) = receiver.try_recv() {
        for line in log.feed(&bytes) {
            on_line(&line);
        }
    }
    drop(child);
    let stderr = stderr_reader.join().unwrap_or_default();
    Ok(RunResult { status, log: log.into_lines(), stderr, elapsed: start.elapsed() })
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
    for spec in args.kprobes.iter().chain(&args.kretprobes) {
        if spec.split_whitespace().count() != 1 || !spec.contains(':') {
            return Err(Failure::usage(format!("--kprobe/--kretprobe {spec:?}: expected SYMBOL[+OFFSET]:METHOD")));
        }
    }
    ensure_installed()?;
    if args.board == Board::Rpi4 {
        let files = crate::bootfiles::get(&args.boot_files)?;
        eprintln!("xtask: {}", files.source);
        machine.dtb = Some(files.dtb);
    }
    let image = build::kernel_with(args.board, args.variant, args.sanitizer.options(&[args.variant])?)?;
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
    match result.status {
        Some(status) => Ok(status.clamp(0, 255) as u8),
        None => Err(Failure {
            status: 124,
            message: format!("QEMU ({}) killed after {} s timeout", machine.describe(), args.timeout),
        }),
    }
}

// Installation lives with the rest of the host set-up.
pub use crate::setup::{ensure_qemu as ensure_installed, qemu_version as version};
