//! The panic handler: report the panic once, stop the other CPUs, print every CPU's trace and
//! end the run with the panic status.
//!
//! It stands at the top with `main.rs` (it names the test that was running, the stack walkers
//! and the CPU bring-up's stop requests); nothing calls it but a `panic!`.

use crate::arch::{cpu, percpu};
use crate::power::{self, ExitStatus};
use crate::{stacktrace, task, tests};
use core::sync::atomic::{AtomicUsize, Ordering};

#[panic_handler]
fn panic(info: &core::panic::PanicInfo) -> ! {
    /// The CPU reporting a panic (`NO_CPU`: none).
    static PANICKING: AtomicUsize = AtomicUsize::new(NO_CPU);
    const NO_CPU: usize = usize::MAX;
    cpu::mask_interrupts();
    let me = percpu::this_cpu_index();
    let (file, line) = info.location().map_or(("?", 0), |location| (location.file(), location.line()));
    match PANICKING.compare_exchange(NO_CPU, me, Ordering::SeqCst, Ordering::SeqCst) {
        Ok(_) => {}
        // A panic while reporting a panic: report nothing more, just stop with the status.
        Err(reporter) if reporter == me => power::exit_silently(ExitStatus::Panic),
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
    power::exit(ExitStatus::Panic)
}
