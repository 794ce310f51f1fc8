//! One measured boot of Debian's Linux: the init built and packed, QEMU run, suite `linux` rows.
//!
//! The machine is the lab's (`virt`, GICv2, entry at EL1, `-cpu max,pauth=off`, `-icount
//! shift=0,sleep=off`) with the memory Debian's kernel needs (512 MiB against the lab's
//! 128 MiB) and one CPU. Each row's figure is the init's (probed - base) / iterations in CNTVCT
//! ticks, which under icount at CNTFRQ 1 GHz are instructions (checked: the `cntfrq` fact).

use super::fetch::{KernelPackage, peer_dir};
use super::initramfs::{Entry, archive};
use super::protocol::{Measurement, Report};
use super::toolchain::CROSS_GCC;
use crate::Failure;
use crate::bench::Mode;
use crate::bench::results::{Row, to_json};
use crate::build::{Board, BuildVariant, workspace_root};
use crate::qemu::CpuVariant;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The suite Linux's rows belong to: host-only, the kernel never runs it.
pub const SUITE: &str = protocol::suite::LINUX;
/// The CPU the rows are measured on: the lab's without pointer authentication, whose QEMU
/// emulation would otherwise weigh on Linux's PAC-signed kernel and not on the mechanisms.
pub const CPU: CpuVariant = CpuVariant::MaxNoPauth;
/// The cases the init measures, each with `tracing_on` 1 and 0, in the init's order.
pub const CASES: &[&str] = &[
    "kprobe",
    "kretprobe",
    "ftrace-one-ops",
    "ftrace-unrelated-ops",
    "ftrace-two-ops",
    "uprobe-nop",
    "uprobe-push",
    "uprobe-ret",
    "uretprobe-nop",
    "uretprobe-push",
    "uretprobe-ret",
    "stacktrace-getppid",
    "stacktrace-task-pid-nr-ns",
    "stacktrace-vfs-fstat",
    "stacktrace-vfs-getattr-nosec",
    "stacktrace-generic-fillattr",
    "ftrace-graph",
];
/// The init's source, relative to the workspace root.
const INIT_SOURCE: &str = "xtask/peer-init/init.c";
/// What Linux is told: its console on the PL011, no address randomisation for the kernel
/// (`nokaslr`, so that addresses match from one boot to the next) nor for user space.
const COMMAND_LINE: &str = "console=ttyAMA0 nokaslr norandmaps quiet";
/// A boot with every measurement takes about 20 s of host time; this is ample.
const TIMEOUT: Duration = Duration::from_secs(300);
/// The allocation trace's boot with its instruction count takes about 140 s of host time on a
/// quiet machine and half as much again on a loaded one.
const ALLOC_TIMEOUT: Duration = Duration::from_secs(900);

/// The init's fact naming Linux's vector table (`vectors` in /proc/kallsyms).
const VECTORS_FACT: &str = "symbol.vectors";

/// Boots `package` with the measuring init; writes target/peer/linux/{console.log,results.json}.
/// With `events`, the events plugin counts beside it and each row gets its exceptions per hit.
pub fn measure(package: &KernelPackage, events: bool) -> Result<Report, Failure> {
    let out = peer_dir().join("linux");
    let plugin_run = if events {
        let vectors = match previous_vectors(&out) {
            Some(vectors) => vectors,
            None => {
                eprintln!("xtask: a run without the plugin first, for the vector table's address");
                measure(package, false)?;
                previous_vectors(&out).ok_or_else(|| Failure {
                    status: 1,
                    message: format!("the init printed no `{VECTORS_FACT}` fact"),
                })?
            }
        };
        let count_file = out.join("count.txt");
        let _ = std::fs::remove_file(&count_file);
        let argument = format!(
            "{},count=on,vectors={vectors:#x},out={}",
            crate::bench::events::build_plugin()?.display(),
            count_file.display()
        );
        Some((count_file, vec!["-plugin".to_string(), argument]))
    } else {
        None
    };
    let init = build_init(&out)?;
    let initramfs = out.join("initramfs.cpio");
    let data = std::fs::read(&init).map_err(|error| Failure::usage(format!("{}: {error}", init.display())))?;
    write_renamed(
        &initramfs,
        &archive(&[
            Entry::Directory { path: "dev" },
            Entry::CharDevice { path: "dev/console", major: 5, minor: 1 },
            Entry::Directory { path: "proc" },
            Entry::Directory { path: "sys" },
            Entry::File { path: "init", mode: 0o755, data: &data },
        ]),
    )?;
    let started = Instant::now();
    let mut words = qemu_words(package, &initramfs);
    if let Some((_, plugin_words)) = &plugin_run {
        words.extend(plugin_words.iter().cloned());
    }
    eprintln!("xtask: booting {} {} ({})", package.name, package.version, words.join(" "));
    let console = boot_with(&words, TIMEOUT)?;
    write_renamed(&out.join("console.log"), console.as_bytes())?;
    let report = Report::parse(&console);
    report.check(CASES).map_err(|problems| Failure {
        status: 1,
        message: format!("the Linux run does not count ({}): {problems}", out.join("console.log").display()),
    })?;
    if report.fact("cntfrq") != Some("1000000000") {
        return Err(Failure { status: 1, message: "CNTFRQ is not 1 GHz: ticks are not instructions".into() });
    }
    eprintln!("xtask: the Linux run took {:.0} s", started.elapsed().as_secs_f64());
    let mut rows = rows(&report, package);
    let mut exceptions = Vec::new();
    if let Some((count_file, _)) = &plugin_run {
        let text = std::fs::read_to_string(count_file).map_err(|error| {
            Failure::usage(format!("the events plugin wrote nothing ({}: {error})", count_file.display()))
        })?;
        let run = ::events::count::WholeRun::parse(&text).ok_or_else(|| Failure {
            status: 1,
            message: format!("{}: not a whole run's count", count_file.display()),
        })?;
        exceptions = super::profile::per_row(&report, &run).map_err(|message| Failure { status: 1, message })?;
        let per_hit = rows.iter().filter(|row| row.metric == "per_hit").cloned().collect::<Vec<_>>();
        for (row, events) in per_hit.into_iter().zip(&exceptions) {
            let value = events.exceptions_per_hit;
            rows.push(Row {
                metric: "per_hit.exceptions".into(),
                unit: "events".into(),
                median: value,
                min: value,
                max: value,
                samples: vec![value],
                ..row
            });
        }
    }
    let mut provenance = crate::bench::provenance(Board::Virt, 1);
    provenance.rustc = None;
    write_renamed(&out.join("results.json"), to_json(&provenance, &rows).as_bytes())?;
    print_table(&report);
    for events in &exceptions {
        println!(
            "events {:<28} tracing_on={} exceptions per hit {:>5.2} (plugin's instructions per hit {:.1})",
            events.case, events.tracing_on, events.exceptions_per_hit, events.instructions_per_hit
        );
    }
    eprintln!("xtask: wrote {}", out.join("results.json").display());
    Ok(report)
}

/// Linux's vector table as the last run's console gave it (the same every boot: `nokaslr`).
fn previous_vectors(out: &Path) -> Option<u64> {
    let console = std::fs::read_to_string(out.join("console.log")).ok()?;
    let address = Report::parse(&console).fact(VECTORS_FACT)?.to_string();
    u64::from_str_radix(address.trim_start_matches("0x"), 16).ok()
}

/// The init, built with static glibc; rebuilt every run (it takes a second).
fn build_init(out: &Path) -> Result<PathBuf, Failure> {
    std::fs::create_dir_all(out).map_err(|error| Failure::usage(format!("{}: {error}", out.display())))?;
    let binary = out.join("init");
    let partial = out.join("init.partial");
    let source = workspace_root().join(INIT_SOURCE);
    let status = Command::new(CROSS_GCC)
        .args(["-static", "-O2", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&partial)
        .arg(&source)
        .status()
        .map_err(|error| Failure::usage(format!("cannot run {CROSS_GCC}: {error}")))?;
    if !status.success() {
        return Err(Failure::usage(format!("{CROSS_GCC} could not build {}", source.display())));
    }
    std::fs::rename(&partial, &binary).map_err(|error| Failure::usage(format!("{}: {error}", binary.display())))?;
    Ok(binary)
}

/// QEMU's arguments: the lab's machine (qemu.rs `Machine`) with Linux's memory and initramfs.
fn qemu_words(package: &KernelPackage, initramfs: &Path) -> Vec<String> {
    [
        "-machine",
        "virt,gic-version=2",
        "-cpu",
        CPU.name(),
        "-smp",
        "1",
        "-m",
        "512M",
        "-icount",
        "shift=0,sleep=off",
        "-display",
        "none",
        "-monitor",
        "none",
        "-serial",
        "stdio",
        "-no-reboot",
    ]
    .iter()
    .map(|word| word.to_string())
    .chain([
        "-kernel".into(),
        package.image().display().to_string(),
        "-initrd".into(),
        initramfs.display().to_string(),
        "-append".into(),
        COMMAND_LINE.into(),
    ])
    .collect()
}

/// QEMU killed when dropped (a timeout or an error on the way).
struct Qemu(Child);

impl Drop for Qemu {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The whole console of one boot with QEMU's arguments `words`, which ends when Linux powers
/// the machine off, or an error after `timeout`.
fn boot_with(words: &[String], timeout: Duration) -> Result<String, Failure> {
    crate::setup::ensure_qemu()?;
    let mut qemu = Qemu(
        Command::new("qemu-system-aarch64")
            .args(words)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|error| Failure::usage(format!("cannot run qemu-system-aarch64: {error}")))?,
    );
    let mut stdout = qemu.0.stdout.take().expect("stdout is piped");
    let reader = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = stdout.read_to_end(&mut bytes);
        bytes
    });
    let started = Instant::now();
    let status = loop {
        if let Some(status) = qemu.0.try_wait().map_err(|error| Failure::usage(error.to_string()))? {
            break status;
        }
        if started.elapsed() > timeout {
            return Err(Failure {
                status: 124,
                message: format!("Linux did not power off in {} s", timeout.as_secs()),
            });
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let console = String::from_utf8_lossy(&reader.join().unwrap_or_default()).into_owned();
    if !status.success() {
        return Err(Failure { status: 1, message: format!("QEMU exited with {status}") });
    }
    Ok(console)
}

/// Suite `linux` rows: per case and `tracing_on`, `per_hit` (the mechanism) and `loop` (the
/// loop around it), in instructions; params name the kernel package.
fn rows(report: &Report, package: &KernelPackage) -> Vec<Row> {
    let row = |measurement: &Measurement, metric: &str, value: f64| Row {
        suite: SUITE.into(),
        case: measurement.case.clone(),
        params: params(report, measurement, package),
        cpu: CPU,
        // The lab's build the rows compare with; Linux's own build is the `kernel` param.
        variant: BuildVariant::Prod,
        mode: Mode::Icount,
        metric: metric.into(),
        unit: "insn".into(),
        median: value,
        min: value,
        max: value,
        n: 1,
        samples: vec![value],
    };
    report
        .measurements
        .iter()
        .flat_map(|measurement| {
            [row(measurement, "per_hit", measurement.per_hit()), row(measurement, "loop", measurement.loop_cost())]
        })
        .collect()
}

/// `tracing_on`, `depth` for a stack trace (the frames the guest's traces held) and `kernel`
/// (the package and its version).
fn params(report: &Report, measurement: &Measurement, package: &KernelPackage) -> Vec<(String, String)> {
    let mut params = vec![("tracing_on".to_string(), measurement.tracing_on.to_string())];
    if let Some(depth) = report.fact(&format!("depth.{}", measurement.case)) {
        params.push(("depth".into(), depth.to_string()));
    }
    params.push(("kernel".into(), format!("{}={}", package.name, package.version)));
    params
}

fn print_table(report: &Report) {
    println!("{:<28} {:>14} {:>14} {:>10}", "linux case", "tracing_on=1", "tracing_on=0", "loop");
    for case in CASES {
        let find = |on: u8| report.measurements.iter().find(|row| row.case == *case && row.tracing_on == on);
        let (Some(on), Some(off)) = (find(1), find(0)) else { continue };
        println!("{case:<28} {:>14.1} {:>14.1} {:>10.1}", on.per_hit(), off.per_hit(), on.loop_cost());
    }
    for (name, value) in &report.facts {
        println!("fact {name}: {value}");
    }
}

/// Writes `path` through a temporary file and a rename: a reader never sees half a file.
fn write_renamed(path: &Path, bytes: &[u8]) -> Result<(), Failure> {
    let partial = path.with_extension("partial");
    std::fs::write(&partial, bytes)
        .and_then(|()| std::fs::rename(&partial, path))
        .map_err(|error| Failure::usage(format!("{}: {error}", path.display())))
}

/// The allocation trace's boot: the kmem events with a stack each from `trace_init` on, four
/// CPUs, a buffer of 64 MiB per CPU that never fills (`nooverwrite`: a full buffer would drop
/// events, and every CPU's `overrun` and `dropped events` are checked to be 0), and 4 GiB of
/// memory, without which the secondary CPUs' buffers cannot be allocated at bring-up.
pub const ALLOC_COMMAND_LINE: &str = "console=ttyAMA0 nokaslr norandmaps quiet no_hash_pointers \
     trace_event=kmem:kmalloc,kmem:kfree,kmem:kmem_cache_alloc,kmem:kmem_cache_free \
     trace_options=stacktrace,nooverwrite,sym-offset trace_buf_size=64M -- alloc";
/// Where the converted trace is committed, relative to the workspace root.
pub const ALLOC_TRACE: &str = "xtask/data/linux/kmem-boot.trace.gz";
/// The init's workload, as the trace's provenance says it.
const WORKLOAD: &str = "16 processes exec'd from /init, each writing, reading and removing a 64 KiB file on a \
                        tmpfs four times and making 64 pipe round trips with a forked child";
/// The disk the init writes the `trace` file to (virtio-blk, raw, sparse).
const DISK_BYTES: u64 = 1 << 30;

/// The init's counter reads in `-- alloc`, in the order they run: the plugin's marks, named as
/// the trace's provenance names the machine's instruction total at each.
const ALLOC_MARKS: [&str; 4] = [
    "instructions.workload_start",
    "instructions.workload_end",
    "instructions.transport_start",
    "instructions.transport_end",
];

/// Boots with the kmem events, takes the trace out through a virtio disk and converts it to
/// target/peer/linux/alloc/, counting the boot's instructions with the events plugin
/// (`count=on`). The committed trace is replaced when the records are the same or `replace`.
pub fn record_allocations(package: &KernelPackage, replace: bool) -> Result<(), Failure> {
    let out = peer_dir().join("linux/alloc");
    let plugin = crate::bench::events::build_plugin()?;
    let init = build_init(&out)?;
    let data = std::fs::read(&init).map_err(|error| Failure::usage(format!("{}: {error}", init.display())))?;
    let module_path = package.modules().join("kernel/drivers/block/virtio_blk.ko.xz");
    let module =
        std::fs::read(&module_path).map_err(|error| Failure::usage(format!("{}: {error}", module_path.display())))?;
    let initramfs = out.join("initramfs.cpio");
    write_renamed(
        &initramfs,
        &archive(&[
            Entry::Directory { path: "dev" },
            Entry::CharDevice { path: "dev/console", major: 5, minor: 1 },
            Entry::Directory { path: "proc" },
            Entry::Directory { path: "sys" },
            Entry::File { path: "init", mode: 0o755, data: &data },
            Entry::File { path: "virtio_blk.ko.xz", mode: 0o644, data: &module },
        ]),
    )?;
    let disk = out.join("disk.raw");
    let _ = std::fs::remove_file(&disk);
    std::fs::File::create(&disk)
        .and_then(|file| file.set_len(DISK_BYTES))
        .map_err(|error| Failure::usage(format!("{}: {error}", disk.display())))?;
    let mut words = qemu_words(package, &initramfs);
    let set = |words: &mut Vec<String>, key: &str, value: &str| {
        let at = words.iter().position(|word| word == key).expect("the lab's words have it");
        words[at + 1] = value.into();
    };
    set(&mut words, "-smp", "4");
    set(&mut words, "-m", "4G");
    set(&mut words, "-append", ALLOC_COMMAND_LINE);
    words.extend([
        "-drive".into(),
        format!("file={},format=raw,if=none,id=trace", disk.display()),
        "-device".into(),
        "virtio-blk-pci,drive=trace".into(),
    ]);
    // The plugin observes: it adds no instruction to the guest, and the trace's `qemu` line
    // names the machine without it.
    let count_file = out.join("count.txt");
    let _ = std::fs::remove_file(&count_file);
    let plugin_words = ["-plugin".to_string(), format!("{},count=on,out={}", plugin.display(), count_file.display())];
    let started = Instant::now();
    eprintln!("xtask: booting for the allocation trace ({} {})", words.join(" "), plugin_words.join(" "));
    let console = boot_with(&[words.clone(), plugin_words.to_vec()].concat(), ALLOC_TIMEOUT)?;
    write_renamed(&out.join("console.log"), console.as_bytes())?;
    let boot_seconds = started.elapsed().as_secs_f64();
    let report = Report::parse(&console);
    let fail = |message: String| Failure { status: 1, message };
    report.check(&[]).map_err(|problems| fail(format!("the allocation boot does not count: {problems}")))?;
    if report.fact("cpus") != Some("4") {
        return Err(fail(format!("{} CPUs online, expected 4", report.fact("cpus").unwrap_or("?"))));
    }
    let lost: Vec<&(String, String)> = report
        .facts
        .iter()
        .filter(|(name, value)| {
            ["overrun", "commit_overrun", "dropped_events"].iter().any(|counter| name.ends_with(counter))
                && value != "0"
        })
        .collect();
    if !lost.is_empty() {
        return Err(fail(format!("the trace buffers lost events: {lost:?}")));
    }
    let bytes = std::fs::read(&disk).map_err(|error| Failure::usage(format!("{}: {error}", disk.display())))?;
    let end = bytes.iter().position(|&byte| byte == 0).unwrap_or(bytes.len());
    let trace = String::from_utf8_lossy(&bytes[..end]);
    if Some(end.to_string().as_str()) != report.fact("transport.bytes") {
        return Err(fail(format!("{end} bytes on the disk, the init wrote {:?}", report.fact("transport.bytes"))));
    }
    let count_text = std::fs::read_to_string(&count_file).map_err(|error| {
        Failure::usage(format!("the events plugin wrote no count ({}: {error})", count_file.display()))
    })?;
    let count = events::count::WholeRun::parse(&count_text)
        .ok_or_else(|| fail(format!("{}: not a whole run's count", count_file.display())))?;
    if count.marks.len() != ALLOC_MARKS.len() {
        return Err(fail(format!(
            "{} user counter reads in the run, the init makes {}: {:?}",
            count.marks.len(),
            ALLOC_MARKS.len(),
            count.marks
        )));
    }
    let mut provenance: Vec<(String, String)> = vec![
        ("kernel".into(), format!("{}={}", package.name, package.version)),
        // Paths relative to the workspace: the file names what ran, not where.
        ("qemu".into(), words.join(" ").replace(&format!("{}/", workspace_root().display()), "")),
        ("workload".into(), WORKLOAD.into()),
        ("regenerate".into(), "cargo xtask peer linux --alloc-trace".into()),
        ("recording".into(), "from trace_init: allocations before it are not in the trace".into()),
    ];
    for (name, value) in &report.facts {
        if name.starts_with("counter.")
            || ["entries", "overrun", "dropped_events"].iter().any(|counter| name.ends_with(counter))
        {
            provenance.push((name.clone(), value.clone()));
        }
    }
    provenance.push((
        "instructions.counted_by".into(),
        "the events plugin's count=on beside the QEMU line above: every instruction of every vCPU from reset, \
         totals at the init's counter reads"
            .into(),
    ));
    for (name, mark) in ALLOC_MARKS.iter().zip(&count.marks) {
        provenance.push((name.to_string(), mark.instructions.to_string()));
    }
    provenance.push(("instructions.run".into(), count.instructions.to_string()));
    let (text, counts) = super::alloc::convert(&trace, &provenance);
    if counts.without_stack != 0 || counts.allocations == 0 {
        return Err(fail(format!("the converted trace is not whole: {counts:?}")));
    }
    // The whole boot, reset to the end of the workload (recording stopped), per recorded
    // allocation: what a replay's per-allocation cost is a fraction of.
    let boot_instructions = count.marks[1].instructions;
    let per_allocation = boot_instructions as f64 / counts.allocations as f64;
    let text =
        super::alloc::with_meta(&text, &[("instructions_per_allocation".into(), format!("{per_allocation:.1}"))]);
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    std::io::Write::write_all(&mut encoder, text.as_bytes()).expect("writing to a Vec cannot fail");
    let compressed = encoder.finish().expect("writing to a Vec cannot fail");
    let recorded = out.join("kmem-boot.trace.gz");
    write_renamed(&recorded, &compressed)?;
    eprintln!(
        "xtask: {} allocations, {} frees ({} of unrecorded allocations dropped, {} of NULL), {} stacks; \
         {} MB of trace text out through virtio-blk, boot and transport {boot_seconds:.0} s; wrote {} ({} KiB)",
        counts.allocations,
        counts.frees,
        counts.frees_unrecorded,
        counts.frees_null,
        counts.stacks,
        end / 1_000_000,
        recorded.display(),
        compressed.len() / 1024
    );
    eprintln!(
        "xtask: {} instructions from reset to the workload's end ({per_allocation:.1} per allocation), \
         {} to the workload's start, {} in the whole run on {} vCPUs",
        boot_instructions, count.marks[0].instructions, count.instructions, count.vcpus
    );
    let committed = workspace_root().join(ALLOC_TRACE);
    let comparison = match std::fs::read(&committed) {
        Ok(bytes) => {
            let mut old = String::new();
            flate2::read::GzDecoder::new(&bytes[..])
                .read_to_string(&mut old)
                .map_err(|error| Failure::usage(format!("{}: {error}", committed.display())))?;
            Some(super::alloc::Comparison::of(&old, &text))
        }
        Err(_) => None,
    };
    match &comparison {
        Some(comparison) => eprintln!("xtask: against {ALLOC_TRACE}: {}", comparison.summary()),
        None => eprintln!("xtask: no committed trace at {ALLOC_TRACE}"),
    }
    if replace || comparison.as_ref().is_none_or(|comparison| comparison.identical_records) {
        if let Some(parent) = committed.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|error| Failure::usage(format!("{}: {error}", parent.display())))?;
        }
        write_renamed(&committed, &compressed)?;
        eprintln!("xtask: wrote {}", committed.display());
    } else {
        eprintln!("xtask: {ALLOC_TRACE} kept (--replace-trace replaces it with {})", recorded.display());
    }
    Ok(())
}
