//! Multi-CPU bring-up: every CPU the kernel tried to start runs kernel code with its own per-CPU
//! data. (The `smp_*` concurrency tests come with scheduling on every CPU.)

use super::{Context, Outcome, Test, Verdict, check, check_eq};
use crate::arch::{cpu, percpu};
use crate::task::{cpus, stacks};
use core::sync::atomic::Ordering;

pub const TESTS: &[Test] = &[
    Test { name: "secondary_cpus_are_online", run: secondary_cpus_are_online },
    Test { name: "wake_sgi_reaches_every_cpu", run: wake_sgi_reaches_every_cpu },
];

/// Each wanted CPU is online and set up its own per-CPU entry (index, IRQ and overflow stacks):
/// only code running on that CPU writes those (`secondary_main`). `smp.fail-cpu=N` makes this
/// fail (xtask's failure paths check that it does).
fn secondary_cpus_are_online(_: &Context) -> Outcome {
    let wanted = cpus::wanted();
    check!(wanted >= 1);
    for cpu in 0..wanted {
        if !cpus::is_online(cpu) {
            defmt::error!("  cpu {=usize} of {=usize} is not online", cpu, wanted);
        }
        check!(cpus::is_online(cpu));
        let data = percpu::cpu_data(cpu);
        check_eq!(data.index.load(Ordering::Relaxed), cpu as u64);
        check_eq!(data.irq_stack_top.load(Ordering::Relaxed), stacks::irq_slot(cpu).stack_top());
        check_eq!(data.overflow_stack_top.load(Ordering::Relaxed), stacks::overflow_slot(cpu).stack_top());
    }
    check_eq!(cpus::online(), wanted);
    if wanted == 1 { Ok(Verdict::Skipped("one CPU (run with --smp N)")) } else { Ok(Verdict::Passed) }
}

/// Each secondary takes a wake-up SGI sent to it, and only it: the GIC routes by the target the
/// CPU recorded for itself (GICv2 interface mask, GICv3 affinity and its own redistributor).
fn wake_sgi_reaches_every_cpu(_: &Context) -> Outcome {
    let wanted = cpus::wanted();
    if wanted == 1 {
        return Ok(Verdict::Skipped("one CPU (run with --smp N)"));
    }
    let initial: [u64; stacks::CPUS] = core::array::from_fn(cpus::wakes);
    for target in 1..wanted {
        let before: [u64; stacks::CPUS] = core::array::from_fn(cpus::wakes);
        crate::drivers::interrupts::send_wake(target);
        check!(cpu::wait_until(100, || cpus::wakes(target) > before[target]));
        check_eq!(cpus::wakes(target), before[target] + 1);
        for other in (1..wanted).filter(|&other| other != target) {
            check_eq!(cpus::wakes(other), before[other]);
        }
    }
    // One wake each in all: none was delivered twice or to a CPU it was not sent to.
    for (cpu, &count) in initial.iter().enumerate().take(wanted).skip(1) {
        check_eq!(cpus::wakes(cpu), count + 1);
    }
    check_eq!(crate::drivers::interrupts::unhandled(), 0);
    Ok(Verdict::Passed)
}
