//! tracelab: a bare-metal arm64 kernel that is a laboratory for kernel instrumentation.
//!
//! This file is the init order and the `run=` dispatch (the modes are run.rs); see the README for
//! the architecture.

#![no_std]
#![no_main]
#![feature(sanitize)]

extern crate alloc;

mod arch;
mod args;
mod bench;
mod board;
mod build_info;
mod demo;
mod drivers;
mod dt;
mod ftrace;
mod inject;
mod log;
mod mm;
mod panic;
mod power;
mod probes;
mod profile;
mod replay;
mod run;
mod stacktrace;
mod sweep;
mod symbols;
mod sync;
mod task;
mod tests;
mod trap;

use arch::{cpu, mmu::VA_OFFSET};
use power::ExitStatus;
use run::Mode;

#[unsafe(no_mangle)]
extern "C" fn kernel_main(dtb_pa: u64, entry_el: u64) -> ! {
    task::init();
    log::init(board::CONFIG.console_uart + VA_OFFSET, board::CONFIG.console_clock_hz);
    let platform = platform(dtb_pa);
    // Each subsystem reads its own words; every reader runs here, so a bad word is reported
    // whatever the run.
    let args = args::Args::new(platform.bootargs);
    power::set_exit(power::Exit::from_args(&args));
    let options = run::Options::from_args(&args);
    let smp = task::cpus::Options::from_args(&args);
    let kasan = mm::kasan::options::Options::from_args(&args);
    let stack_sample = stacktrace::stack_sample_from_args(&args);
    let hz = task::tick_hz_from_args(&args);
    let boot_probes = demo::boot_probes::Requests::from_args(&args);
    let boot_trace = ftrace::tracers::BootTrace::from_args(&args);
    let bench = bench::Request::from_args(&args, options.icount);
    let profile = profile::Request::from_args(&args);
    arch::cpu::set_patience(options.icount);
    if arch::mte::ENABLED_IN_BUILD && !arch::mte::available() {
        defmt::error!("MTE: not available (mte=on missing?)");
        power::exit(ExitStatus::Unsupported);
    }
    let layout = match mm::init(&platform) {
        Ok(layout) => layout,
        Err(error) => panic!("memory init: {:?}", defmt::Debug2Format(&error)),
    };
    inject::set(inject::Fault::LocalTlbi, smp.local_tlbi);
    inject_from_args(&args);
    stacktrace::init_depot();
    // Tag checks on before the heap hands out the first tagged pointer (and tags its memory).
    arch::mte::choose_mode(kasan.mode);
    arch::mte::init_this_cpu();
    mm::kasan::heap::init(layout.free.base + VA_OFFSET, layout.free.size, kasan.tag_seed);
    mm::kasan::report::set_policy(kasan.fault_panic, kasan.multi_shot);
    stacktrace::seed_stack_sample(kasan.tag_seed);
    stacktrace::set_stack_sample(stack_sample);
    symbols::callsites::init();
    drivers::interrupts::init(layout.gic, platform.virtual_timer_intid);
    drivers::timer::on_tick(task::tick);
    drivers::timer::on_tick(stacktrace::on_tick);
    profile::init(platform.pmu_intid);
    drivers::timer::start(hz);
    // Before the secondaries: each runs the per-CPU half as it comes up.
    task::user::init();
    // Each secondary sets up its own GIC interface (after the distributor) and its own tick (at
    // the rate the boot CPU's set).
    let bring_up = task::cpus::bring_up(
        platform.psci,
        &platform.cpus,
        board::CONFIG.secondary_spin_table,
        smp.limit,
        smp.broken,
        smp.late,
    );
    probes::init();
    let traceable = ftrace::init();

    if options.mode == Mode::Demo {
        demo::heading("banner");
    }
    defmt::info!(
        "tracelab {=str} (variant {=str}, board {=str}, SoC {=str}, model {=str})",
        env!("CARGO_PKG_VERSION"),
        build_info::VARIANT,
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
    defmt::info!("Command line: {=str}", args.line());
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
    defmt::info!("Timer: {=u64} Hz counter, {=u64} Hz tick", drivers::timer::frequency(), hz);
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
    demo::boot_probes::register_all(&boot_probes);
    let boot_tracer = boot_trace.any_pattern().and_then(|pattern| {
        let tracer = ftrace::tracers::trace_from_boot(&boot_trace)?;
        Some(run::BootTracer { tracer, pattern })
    });

    match options.mode {
        Mode::Demo => run::demo(options.icount, boot_tracer),
        Mode::Bench => run::bench(&bench, options.icount),
        Mode::Profile => {
            let context = profile::workload::Context { icount: options.icount, expect_pauth: options.expect_pauth };
            run::profile(&profile, &context)
        }
        Mode::Panic => run::panic(),
        Mode::Fault => run::fault(),
        Mode::UnownedBrk => run::unowned_brk(),
        Mode::UseAfterFree => run::use_after_free(),
        Mode::Hang => run::hang(),
        Mode::Sweep => run::sweep(&args),
        Mode::Test => run::test(&options, boot_tracer),
        Mode::List => run::list(&options),
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

/// `inject=NAME,...` (test-only): the named fault switches on from boot.
fn inject_from_args(args: &args::Args) {
    for name in args.values(protocol::cmdline::INJECT).flat_map(|names| names.split(',')) {
        match inject::by_name(name) {
            Some(fault) => inject::set(fault, true),
            None => defmt::warn!("cmdline: inject={=str} names no fault switch", name),
        }
    }
}
