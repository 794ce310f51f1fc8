//! Multi-CPU bring-up: every CPU the kernel tried to start runs kernel code with its own per-CPU
//! data. (The `smp_*` concurrency tests come with scheduling on every CPU.)

use super::{Context, Outcome, Test, Verdict, check, check_eq};
use crate::arch::percpu;
use crate::task::{cpus, stacks};
use core::sync::atomic::Ordering;

pub const TESTS: &[Test] = &[Test { name: "secondary_cpus_are_online", run: secondary_cpus_are_online }];

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
