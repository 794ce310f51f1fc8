//! Trap routing tests: the table's decisions for owned and unowned exceptions, and that an
//! unowned exception really reaches the unexpected path (where only the tests' hook can stop the
//! report). The report itself ends the run, so xtask's `unowned-brk` failure path checks it.

use super::{Context, Outcome, Test, Verdict, catch, check, check_eq, fail};
use crate::arch::exception::{BRK_BENCH, BRK_KPROBE, BRK_KPROBE_STEP, BRK_TEST, BRK_UNOWNED, Esr, ExceptionClass};
use crate::trap::{Level, Owner, route};

pub const TESTS: &[Test] = &[
    Test { name: "trap_unowned_brk_is_unexpected", run: unowned_brk_is_unexpected },
    Test { name: "trap_unowned_svc_is_unexpected", run: unowned_svc_is_unexpected },
    Test { name: "trap_unowned_class_is_unexpected", run: unowned_class_is_unexpected },
    Test { name: "trap_udf_reaches_the_unexpected_path", run: udf_reaches_the_unexpected_path },
    Test { name: "trap_this_cpu_is_tpidr_el1", run: this_cpu_is_tpidr_el1 },
];

fn brk(immediate: u16) -> Esr {
    Esr::new(Esr::EC_BRK, immediate as u32)
}

fn svc(immediate: u16) -> Esr {
    Esr::new(Esr::EC_SVC64, immediate as u32)
}

fn unowned_brk_is_unexpected(_: &Context) -> Outcome {
    check!(route(brk(BRK_UNOWNED), Level::El1) == Owner::Unexpected);
    check!(route(brk(BRK_TEST), Level::El1) == Owner::Unexpected);
    check!(route(brk(BRK_UNOWNED), Level::El0) == Owner::Unexpected);
    // A kernel BRK from EL0 belongs to nobody either.
    check!(route(brk(BRK_KPROBE), Level::El0) == Owner::Unexpected);
    // The owned ones next to them.
    check!(route(brk(BRK_KPROBE), Level::El1) == Owner::Kprobe);
    check!(route(brk(BRK_KPROBE_STEP), Level::El1) == Owner::KprobeStep);
    check!(route(brk(BRK_BENCH), Level::El1) == Owner::BenchResume);
    check!(route(brk(crate::arch::exception::BRK_HARNESS_ENTER), Level::El1) == Owner::TestHook);
    check!(route(brk(crate::probes::uprobe::BRK_UPROBE), Level::El0) == Owner::Uprobe);
    Ok(Verdict::Passed)
}

fn unowned_svc_is_unexpected(_: &Context) -> Outcome {
    check!(route(svc(0x1234), Level::El0) == Owner::Unexpected);
    check!(route(svc(crate::task::user::SVC_SYSCALL), Level::El0) == Owner::Syscall);
    check!(route(svc(crate::probes::uprobe::SVC_UPROBE_DETOUR), Level::El0) == Owner::Uprobe);
    // The kernel makes no SVCs.
    check!(route(svc(crate::task::user::SVC_SYSCALL), Level::El1) == Owner::Unexpected);
    Ok(Verdict::Passed)
}

fn unowned_class_is_unexpected(_: &Context) -> Outcome {
    let class = |class: ExceptionClass| Esr::new(class as u8, 0);
    for unowned in [
        ExceptionClass::Unknown,
        ExceptionClass::SystemRegisterTrap,
        ExceptionClass::PointerAuthFailure,
        ExceptionClass::InstructionAbort,
        ExceptionClass::PcAlignment,
        ExceptionClass::SpAlignment,
        ExceptionClass::SoftwareStepLowerEl,
    ] {
        if route(class(unowned), Level::El1) != Owner::Unexpected {
            defmt::error!("  {} at EL1 has an owner", unowned);
            return Err(fail("an unowned exception class has an owner at EL1"));
        }
    }
    check!(route(class(ExceptionClass::SoftwareStep), Level::El1) == Owner::KprobeSoftwareStep);
    check!(route(class(ExceptionClass::DataAbort), Level::El1) == Owner::UserAccessFixup);
    check!(route(class(ExceptionClass::DataAbortLowerEl), Level::El0) == Owner::UserFault);
    check!(route(class(ExceptionClass::SoftwareStepLowerEl), Level::El0) == Owner::Uprobe);
    Ok(Verdict::Passed)
}

/// An undefined instruction at EL1 is routed to the unexpected path, where the tests' hook (and
/// only it) stops the report: `catch` sees it with its syndrome.
fn udf_reaches_the_unexpected_path(_: &Context) -> Outcome {
    let mut resumed = false;
    let caught = catch(ExceptionClass::Unknown, || {
        // SAFETY: the undefined instruction is caught by `catch`, which resumes after it.
        unsafe { core::arch::asm!("udf #0x5a", options(nomem, nostack)) };
        resumed = true;
    });
    check!(resumed);
    let Some(caught) = caught else {
        return Err(fail("no undefined-instruction exception was taken"));
    };
    check!(Esr(caught.esr).class() == ExceptionClass::Unknown);
    check!(route(Esr(caught.esr), Level::El1) == Owner::Unexpected);
    Ok(Verdict::Passed)
}

/// `this_cpu()` is TPIDR_EL1's per-CPU data, and vectors.S's IRQ path writes the fields Rust reads.
fn this_cpu_is_tpidr_el1(_: &Context) -> Outcome {
    let tpidr: u64;
    // SAFETY: reads the per-CPU pointer register.
    unsafe { core::arch::asm!("mrs {}, tpidr_el1", out(reg) tpidr, options(nomem, nostack, preserves_flags)) };
    let cpu = crate::arch::percpu::this_cpu();
    check_eq!(cpu as *const _ as u64, tpidr);
    check_eq!(crate::arch::percpu::this_cpu_index(), 0);
    let irq = crate::task::stacks::this_irq_slot();
    check_eq!(cpu.irq_stack_top.load(core::sync::atomic::Ordering::Relaxed), irq.stack_top());
    Ok(Verdict::Passed)
}
