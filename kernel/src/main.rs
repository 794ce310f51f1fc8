//! tracelab: a bare-metal arm64 kernel that is a laboratory for kernel instrumentation.
//!
//! This file is the init order and nothing else; see the README for the architecture.

#![no_std]
#![no_main]
#![feature(sanitize)]

extern crate alloc;

mod arch;
mod bench;
mod board;
mod cmdline;
mod demo;
mod drivers;
mod dt;
mod ftrace;
mod inject;
mod log;
mod mm;
mod probes;
mod profile;
mod stacktrace;
mod sweep;
mod symbols;
mod sync;
mod task;
mod tests;
mod trap;

use arch::{cpu, mmu::VA_OFFSET};
use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// The build variant xtask compiled (full, prod or plain), so the kernel knows which
/// instrumentation to expect.
pub const BUILD_VARIANT: &str = match option_env!("TRACELAB_VARIANT") {
    Some(variant) => variant,
    None => "unknown",
};

/// Whether the kernel is built with the shadow call stack (x18 reserved and used).
pub const SHADOW_CALL_STACK: bool = matches!(BUILD_VARIANT.as_bytes(), b"full" | b"prod" | b"mte");

/// How a run ends; xtask reads it as QEMU's exit status.
pub use protocol::ExitStatus;

static SEMIHOSTING: AtomicBool = AtomicBool::new(board::CONFIG.semihosting_by_default);

#[unsafe(no_mangle)]
extern "C" fn kernel_main(dtb_pa: u64, entry_el: u64) -> ! {
    task::init();
    log::init(board::CONFIG.console_uart + VA_OFFSET, board::CONFIG.console_clock_hz);
    let platform = platform(dtb_pa);
    let cmdline = cmdline::CommandLine::parse(platform.bootargs, board::CONFIG.semihosting_by_default);
    SEMIHOSTING.store(cmdline.semihosting, Ordering::Relaxed);
    arch::cpu::set_patience(cmdline.icount);
    if arch::mte::ENABLED_IN_BUILD && !arch::mte::available() {
        defmt::error!("MTE: not available (mte=on missing?)");
        exit(ExitStatus::Unsupported);
    }
    let layout = match mm::init(&platform) {
        Ok(layout) => layout,
        Err(error) => panic!("memory init: {:?}", defmt::Debug2Format(&error)),
    };
    inject::set(inject::Fault::LocalTlbi, cmdline.smp_local_tlbi);
    stacktrace::init_depot();
    // Tag checks on before the heap hands out the first tagged pointer (and tags its memory).
    arch::mte::choose_mode(cmdline.kasan_mode);
    arch::mte::init_this_cpu();
    mm::kasan::heap::init(layout.free.base + VA_OFFSET, layout.free.size, cmdline.tag_seed);
    mm::kasan::report::set_policy(cmdline.kasan_fault_panic, cmdline.kasan_multi_shot);
    stacktrace::seed_stack_sample(cmdline.tag_seed);
    stacktrace::set_stack_sample(cmdline.stack_sample);
    symbols::callsites::init();
    drivers::interrupts::init(layout.gic, platform.virtual_timer_intid);
    drivers::timer::on_tick(task::tick);
    drivers::timer::on_tick(stacktrace::on_tick);
    profile::init(platform.pmu_intid);
    drivers::timer::start(cmdline.hz);
    // Before the secondaries: each runs the per-CPU half as it comes up.
    task::user::init();
    // Each secondary sets up its own GIC interface (after the distributor) and its own tick (at
    // the rate the boot CPU's set).
    let bring_up = task::cpus::bring_up(
        platform.psci,
        &platform.cpus,
        board::CONFIG.secondary_spin_table,
        cmdline.cpus,
        cmdline.smp_fail_cpu,
        cmdline.smp_late_cpu,
    );
    probes::init();
    let traceable = ftrace::init();

    if cmdline.run == cmdline::Run::Demo {
        demo::heading("banner");
    }
    defmt::info!(
        "tracelab {=str} (variant {=str}, board {=str}, SoC {=str}, model {=str})",
        env!("CARGO_PKG_VERSION"),
        BUILD_VARIANT,
        board::CONFIG.name,
        board::CONFIG.soc,
        platform.model
    );
    defmt::info!("CPU: {=str} (MIDR {=u64:#x}), entered at EL{=u64}", cpu::core_name(), cpu::midr(), entry_el);
    match bring_up.failure {
        None if bring_up.online == bring_up.wanted => defmt::info!("CPUs: {=usize} online", bring_up.online),
        failure => {
            let (cpu, reason) = failure.map_or((0, "not online"), |(cpu, error)| (cpu, error.describe()));
            defmt::error!(
                "CPUs: {=usize} of {=usize} online (cpu {=usize}: {=str})",
                bring_up.online,
                bring_up.wanted,
                cpu,
                reason
            )
        }
    }
    defmt::info!("Command line: {=str}", platform.bootargs);
    defmt::info!("PAuth: {=str}", cpu::PointerAuth::detect().name());
    if arch::mte::ENABLED_IN_BUILD {
        defmt::info!("MTE: enabled ({=str})", arch::mte::mode().name());
    } else {
        let mte = match cpu::mte_level() {
            0 => "none",
            1 => "instructions only",
            _ => "yes",
        };
        defmt::info!("MTE: {=str}", mte);
    }
    defmt::info!("TBI: kernel (TTBR1) and user (TTBR0) top bytes ignored");
    defmt::info!("Timer: {=u64} Hz counter, {=u64} Hz tick", drivers::timer::frequency(), cmdline.hz);
    defmt::info!("GIC: v{=u8}", drivers::interrupts::gic_version());
    match platform.psci {
        Some(conduit) => {
            let (major, minor) = conduit.version();
            defmt::info!("PSCI: {=str} (version {=u16}.{=u16})", conduit.name(), major, minor)
        }
        None => defmt::info!("PSCI: none"),
    }
    match traceable {
        Ok(traceable) => {
            defmt::info!(
                "ftrace: {=usize} of {=usize} callsites traceable",
                traceable,
                symbols::callsites::entries().len()
            )
        }
        Err(error) => defmt::error!("ftrace: init failed: {}", error),
    }
    defmt::info!(
        "Memory: RAM {=u64:#x}..{=u64:#x} ({=u64} MiB), shadow {=u64:#x}..{=u64:#x}, free {=u64} MiB, {=usize} page tables",
        layout.ram.base,
        layout.ram.end(),
        layout.ram.size >> 20,
        layout.shadow.base,
        layout.shadow.end(),
        layout.free.size >> 20,
        layout.tables_used
    );
    cpu::enable_interrupts();
    demo::boot_probes::register_all(&cmdline.boot_probes);
    let boot_tracer =
        cmdline.ftrace.and_then(|pattern| ftrace::tracers::trace_from_boot(pattern, cmdline.ftrace_scheme));

    match cmdline.run {
        cmdline::Run::Demo => {
            demo::run(&demo::Options { icount: cmdline.icount, boot_trace: boot_tracer.and(cmdline.ftrace) });
            if let Some(tracer) = boot_tracer {
                ftrace::tracers::stop_boot_trace(tracer);
            }
            demo::boot_probes::report(cmdline.icount);
            exit(ExitStatus::Success)
        }
        cmdline::Run::Bench => {
            let plan = bench::Plan {
                clock: cmdline.bench_clock,
                icount: cmdline.icount,
                reps: cmdline.bench_reps,
                host_cpus: cmdline.bench_host_cpus,
            };
            let result = bench::run(cmdline.bench_suites, &plan);
            demo::boot_probes::report(cmdline.icount);
            match result {
                Ok(()) => exit(ExitStatus::Success),
                Err(_) => exit(ExitStatus::TestsFailed),
            }
        }
        cmdline::Run::Profile => {
            let context = profile::workload::Context { icount: cmdline.icount, expect_pauth: cmdline.expect_pauth };
            let result = profile::run(&cmdline.profile, &context);
            demo::boot_probes::report(cmdline.icount);
            match result {
                Ok(true) => exit(ExitStatus::Success),
                // The profile is dumped either way; the status says the workload failed.
                Ok(false) => exit(ExitStatus::TestsFailed),
                Err(_) => exit(ExitStatus::UsageError),
            }
        }
        cmdline::Run::Panic => {
            if task::cpus::online() > 1 {
                start_panic_witness();
            }
            panic!("deliberate panic (run=panic)")
        }
        cmdline::Run::Fault => {
            // SAFETY: deliberately reads an unmapped address (the boot stack's guard page) to
            // check that an unexpected exception is reported and ends the run.
            unsafe { core::ptr::read_volatile(mm::boot_stack_guard() as *const u64) };
            unreachable!("the guard page was readable")
        }
        cmdline::Run::UnownedBrk => {
            // SAFETY: deliberately raises a BRK nobody owns, to check that the trap layer's
            // unexpected-exception report ends the run.
            unsafe { core::arch::asm!("brk #{}", const arch::exception::BRK_UNOWNED, options(nomem, nostack)) };
            unreachable!("an unowned BRK returned")
        }
        cmdline::Run::UseAfterFree => {
            let object = alloc::boxed::Box::new(0x5a_u64);
            let address = &*object as *const u64;
            drop(object);
            let reports = mm::kasan::report::count();
            // SAFETY: deliberately reads freed heap memory (still mapped RAM) to check that the
            // sanitizer reports it (and stops the kernel with kasan.fault=panic).
            let value = unsafe { core::ptr::read_volatile(address) };
            // With MTE in async mode the read only set a flag: this is its check point.
            #[cfg(feature = "mte")]
            mm::kasan::mte::check_async(0);
            if mm::kasan::report::count() > reports {
                // kasan.fault=report: the report was printed and the kernel goes on.
                exit(ExitStatus::Success)
            }
            defmt::error!("use-after-free not caught (read {=u64:#x}): no sanitizer checks in this build", value);
            exit(ExitStatus::TestsFailed)
        }
        cmdline::Run::Hang => {
            defmt::info!("test start: deliberate_hang");
            loop {
                cpu::wait_for_interrupt();
            }
        }
        cmdline::Run::Sweep => {
            let passed = sweep::run(platform.bootargs);
            exit(if passed { ExitStatus::Success } else { ExitStatus::TestsFailed })
        }
        cmdline::Run::Test => {
            let summary = tests::run(cmdline.filter, cmdline.expect_pauth, cmdline.icount);
            if let Some(tracer) = boot_tracer {
                ftrace::tracers::stop_boot_trace(tracer);
            }
            demo::boot_probes::report(cmdline.icount);
            exit(if summary.failed == 0 { ExitStatus::Success } else { ExitStatus::TestsFailed })
        }
    }
}

/// The platform from the device tree at `dtb_pa`, or the board's fallback without one.
fn platform(dtb_pa: u64) -> board::Platform {
    let board = &board::CONFIG;
    // Only the GiB holding the image is mapped this early; a device tree elsewhere (or the Pi 4
    // firmware's 0x100 without one) is checked for its magic inside that GiB only.
    let parsed = if dtb_pa >> 30 == board.load_address >> 30 {
        // SAFETY: dtb_pa lies in the early-mapped GiB of RAM; the loader hands a device tree
        // there to the kernel, and only Platform::parse (dt.rs) uses it.
        unsafe { board::Platform::parse(dtb_pa + VA_OFFSET, dtb_pa, board) }
    } else {
        Err(dt::DtError::BadHeader)
    };
    match parsed {
        Ok(platform) => {
            if platform.used_fallback {
                defmt::warn!(
                    "device tree has no RAM size: using the board's {=u64:#x}+{=u64:#x}",
                    platform.ram.base,
                    platform.ram.size
                );
            }
            platform
        }
        Err(dt::DtError::BadHeader) => {
            defmt::warn!("no device tree at {=u64:#x}: using the board's fallback configuration", dtb_pa);
            board::Platform::fallback(board)
        }
        Err(error) => panic!("device tree at {:#x}: {:?}", dtb_pa, defmt::Debug2Format(&error)),
    }
}

/// Ends the run: prints the sentinel line xtask waits for, then leaves QEMU through semihosting
/// (which carries the status) or, on hardware, parks the CPU.
pub fn exit(status: ExitStatus) -> ! {
    cpu::mask_interrupts();
    defmt::info!("tracelab: exit status {=u8}", status as u8);
    log::drain();
    if SEMIHOSTING.load(Ordering::Relaxed) {
        semihosting_exit(status as u8);
    }
    loop {
        cpu::wait_for_interrupt();
    }
}

/// SYS_EXIT with ADP_Stopped_ApplicationExit and the status (Arm semihosting spec, 6.4.2): QEMU
/// (with `-semihosting`) exits with that status.
fn semihosting_exit(status: u8) {
    let block = [0x2_0026_u64, status as u64];
    // SAFETY: HLT #0xf000 is the A64 semihosting trap; x0 = SYS_EXIT, x1 = the parameter block,
    // which lives on this stack for the duration of the call.
    unsafe { core::arch::asm!("hlt #0xf000", in("x0") 0x18_u64, in("x1") block.as_ptr(), options(nostack)) };
}

/// Set by `panic_witness` once it runs.
static PANIC_WITNESS_RUNNING: AtomicBool = AtomicBool::new(false);

/// `run=panic` on several CPUs: CPU 1 waits in this known function when CPU 0 panics, so the
/// report must show it under `cpu 1:` (xtask's failure path `panic-stops-cpus`).
#[inline(never)]
extern "C" fn panic_witness(_: u64) {
    PANIC_WITNESS_RUNNING.store(true, Ordering::Release);
    cpu::send_event();
    loop {
        cpu::wait_for_event();
    }
}

/// Set by the `run=panic` CPU just before it panics: `panic_too` panics at the same time.
static PANIC_NOW: AtomicBool = AtomicBool::new(false);

/// `run=panic` on 3 or more CPUs: CPU 2 panics too, while CPU 0 reports its panic (IRQs masked,
/// so no stop request gets in first). Whichever loses the race must stop and show its trace in
/// the winner's report, not exit silently.
#[inline(never)]
extern "C" fn panic_too(_: u64) {
    cpu::mask_interrupts();
    PANIC_WITNESS_RUNNING.store(true, Ordering::Release);
    cpu::send_event();
    while !PANIC_NOW.load(Ordering::Acquire) {
        core::hint::spin_loop();
    }
    // Lets CPU 0 claim the report first (it then waits up to 100 ms for this CPU to stop), so
    // the report names this CPU as the second; either order is handled the same way.
    cpu::wait_until(10, || false);
    panic!("second deliberate panic (run=panic, cpu 2)")
}

/// Runs `panic_witness` on CPU 1 (and `panic_too` on CPU 2) and waits until each runs (at most
/// a second each).
fn start_panic_witness() {
    let helpers: [(usize, &str, extern "C" fn(u64)); 2] =
        [(1, "panic_witness", panic_witness), (2, "panic_too", panic_too)];
    for (cpu, name, entry) in helpers.into_iter().filter(|&(cpu, ..)| cpu < task::cpus::online()) {
        PANIC_WITNESS_RUNNING.store(false, Ordering::Relaxed);
        let spawned = task::spawn_on(task::CpuMask::one(cpu), name, entry, 0);
        let running = spawned.is_ok() && cpu::wait_until(1000, || PANIC_WITNESS_RUNNING.load(Ordering::Acquire));
        if !running {
            defmt::error!("run=panic: cpu {=usize} did not start {=str}", cpu, name);
        }
    }
    PANIC_NOW.store(true, Ordering::Release);
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo) -> ! {
    /// The CPU reporting a panic (`NO_CPU`: none).
    static PANICKING: AtomicUsize = AtomicUsize::new(NO_CPU);
    const NO_CPU: usize = usize::MAX;
    cpu::mask_interrupts();
    let me = arch::percpu::this_cpu_index();
    let (file, line) = info.location().map_or(("?", 0), |location| (location.file(), location.line()));
    match PANICKING.compare_exchange(NO_CPU, me, Ordering::SeqCst, Ordering::SeqCst) {
        Ok(_) => {}
        Err(reporter) if reporter == me => {
            // A panic while reporting a panic: report nothing more, just stop with the status.
            semihosting_exit(ExitStatus::Panic as u8);
            loop {
                cpu::wait_for_interrupt();
            }
        }
        Err(reporter) => {
            // Another CPU reports a panic: say this one's, then stop as the others do (the
            // report shows this CPU's trace under `cpu N:`).
            defmt::error!(
                "cpu {=usize}: panicked at {=str}:{=u32} while cpu {=usize} reports a panic: {}",
                me,
                file,
                line,
                reporter,
                defmt::Display2Format(&info.message())
            );
            task::cpus::stop_this_cpu_in_panic()
        }
    }
    defmt::error!("panicked at {=str}:{=u32}: {}", file, line, defmt::Display2Format(&info.message()));
    let (stopped, others) = task::cpus::stop_others();
    if others != 0 {
        defmt::error!("panic: stopped {=usize} of {=usize} other CPUs", stopped, others);
    }
    if let Some(test) = tests::current() {
        defmt::error!("  while running test {=str}", test);
    }
    stacktrace::print_both();
    for other in (0..task::stacks::CPUS).filter(|&other| other != me) {
        if let Some((frame, slot)) = task::cpus::stopped_context(other) {
            stacktrace::print_stopped_cpu(other, frame, slot);
        }
    }
    exit(ExitStatus::Panic)
}
