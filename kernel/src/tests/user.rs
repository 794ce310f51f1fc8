//! EL0 tests: syscalls, TLS across switches, user faults, uprobes (every method) and uretprobes.
//!
//! The user programs below are asm in `.text.user`, mapped read-only executable at EL0. Each ends
//! with `exit(code)`; the kernel side compares codes (and fault records) of probed and unprobed
//! runs of the same program, so a method that performs the displaced instruction wrongly changes
//! a code and fails the test.

use core::sync::atomic::{AtomicU64, Ordering};

use super::{Context, Outcome, Test, Verdict, check, check_eq};
use crate::arch::exception::{ExceptionClass, FaultStatus};
use crate::drivers::timer;
use crate::probes::{self, Method, ProbeError, Registers, Text, uprobe as uprobes};
use crate::task::user::{self, ENOSYS, Options, USER_STACK_BASE, USER_STACK_TOP, USER_TEXT, UserFault};
use crate::task::{self, KillReason, State};

pub const TESTS: &[Test] = &[
    Test { name: "user syscalls, TLS and yield", run: user_syscalls_tls_and_yield },
    Test { name: "user faults kill the task with ESR, FAR and PC", run: user_faults_kill_the_task },
    Test { name: "user tasks sign with their own PAC key", run: user_tasks_sign_with_their_own_key },
    Test { name: "user uprobe methods match the unprobed run", run: uprobe_methods_match_unprobed_run },
    Test { name: "user uprobe stack faults match the unprobed store", run: uprobe_stack_faults_match_unprobed_store },
    Test { name: "user uprobe handler sees user registers (PAN on where present)", run: uprobe_handler_sees_registers },
    Test { name: "user uprobe uretprobe recursion and nesting", run: uretprobe_recursion_and_nesting },
    Test { name: "user uprobe refusals say why", run: uprobe_refusals_say_why },
    Test { name: "user uprobe detour honours a pc change", run: uprobe_detour_honours_pc_change },
    Test { name: "user uprobe detour honours an sp change", run: uprobe_detour_honours_sp_change },
    Test { name: "smp_uprobes_every_cpu", run: smp_uprobes_every_cpu },
];

core::arch::global_asm!(
    r#"
    .section .text.user, "ax"
    .balign 16
// x0 = TLS value, x1 = rounds, x2 = spin time (counter units): TPIDR_EL0 must survive yields
// and preemption; the counter must advance; an unknown syscall returns -ENOSYS.
// exit(x0 ^ 1), or exit(0xbad).
    .global user_prog_tls
user_prog_tls:
    msr     tpidr_el0, x0
    mov     x19, x0
    mov     x20, x1
    mov     x8, #2
    svc     #0
    mov     x21, x0
1:  mov     x8, #1
    svc     #0
    mrs     x9, tpidr_el0
    cmp     x9, x19
    b.ne    9f
    mov     x10, #500
2:  subs    x10, x10, #1
    b.ne    2b
    subs    x20, x20, #1
    b.ne    1b
    mov     x8, #2
    svc     #0
    cmp     x0, x21
    b.ls    9f
    // Spin x2 counter units without yielding: only the tick's IRQ from EL0 switches tasks.
    mov     x8, #2
    svc     #0
    add     x21, x0, x2
5:  mrs     x9, tpidr_el0
    cmp     x9, x19
    b.ne    9f
    mrs     x10, cntvct_el0
    cmp     x10, x21
    b.lo    5b
    mov     x8, #99
    svc     #0
    cmn     x0, #38
    b.ne    9f
    eor     x0, x19, #1
    mov     x8, #0
    svc     #0
9:  mov     x0, #0xbad
    mov     x8, #0
    svc     #0

// x0 = pointer, x1 = modifier: exit(PACIA(x0, x1)) if AUTIA gives the pointer back, else 0xbad.
// (Encoded: assemblers want FEAT_PAuth enabled for the mnemonics.)
    .global user_prog_pac
user_prog_pac:
    mov     x19, x0
    .inst   0xdac10020                       // pacia x0, x1
    mov     x20, x0
    .inst   0xdac11020                       // autia x0, x1
    cmp     x0, x19
    b.ne    9f
    mov     x0, x20
    mov     x8, #0
    svc     #0
9:  mov     x0, #0xbad
    mov     x8, #0
    svc     #0

// x0 = address, x1 = 0 load / 1 store / 2 branch to it.
    .global user_prog_fault
user_prog_fault:
    cmp     x1, #1
    b.eq    1f
    b.hi    2f
    .global user_prog_fault_load
user_prog_fault_load:
    ldr     x0, [x0]
    b       3f
1:
    .global user_prog_fault_store
user_prog_fault_store:
    str     x1, [x0]
    b       3f
2:  br      x0
3:  mov     x8, #0
    svc     #0

// x0 = target, x1 = 1 to include what the target left below SP: calls the target 3 times with
// known registers and a canary below SP, and exits with a checksum of everything it returned.
    .global user_prog_diff
user_prog_diff:
    mov     x19, x0
    mov     x23, x1
    mov     x20, #0
    mov     x21, #3
1:  lsl     x0, x21, #8
    add     x0, x0, #0x11
    mov     x1, #0x22
    add     x1, x1, x21
    mov     x29, #0x2900
    add     x29, x29, x21
    mov     x9, #0xdead
    stp     x9, x9, [sp, #-16]
    blr     x19
    ldp     x9, x10, [sp, #-16]
    mul     x9, x9, x23
    mul     x10, x10, x23
    eor     x20, x20, x0
    ror     x20, x20, #7
    eor     x20, x20, x1
    ror     x20, x20, #7
    eor     x20, x20, x9
    ror     x20, x20, #7
    eor     x20, x20, x10
    ror     x20, x20, #7
    eor     x20, x20, x29
    ror     x20, x20, #7
    mov     x11, sp
    eor     x20, x20, x11
    subs    x21, x21, #1
    b.ne    1b
    mov     x0, x20
    mov     x8, #0
    svc     #0

// x0 = target, x1 = SP to run it on.
    .global user_prog_stack_fault
user_prog_stack_fault:
    mov     sp, x1
    blr     x0
    mov     x8, #0
    svc     #0

// x0 = function, x1 = its argument: exit(function(argument)).
    .global user_prog_call
user_prog_call:
    mov     x19, x0
    mov     x0, x1
    blr     x19
    mov     x8, #0
    svc     #0

    .balign 16
    .global user_test_nop
user_test_nop:
    nop
    add     x0, x0, #1
    ret
    .balign 16
    .global user_test_push
user_test_push:
    stp     x29, x30, [sp, #-16]!
    mov     x29, sp
    add     x0, x0, x1
    ldp     x29, x30, [sp], #16
    ret
    .balign 16
    .global user_test_ret
user_test_ret:
    ret
    .balign 16
    .global user_test_mul
user_test_mul:
    mul     x0, x0, x1
    ret
    .balign 16
    .global user_test_sp
user_test_sp:
    mov     x0, sp
    ret
    .balign 16
    .global user_test_svc
user_test_svc:
    svc     #0
    ret
// n(n+1)/2, recursively.
    .balign 16
    .global user_recurse
user_recurse:
    stp     x29, x30, [sp, #-32]!
    mov     x29, sp
    str     x0, [sp, #16]
    cbz     x0, 1f
    sub     x0, x0, #1
    bl      user_recurse
    ldr     x1, [sp, #16]
    add     x0, x0, x1
1:  ldp     x29, x30, [sp], #32
    ret
// user_recurse(x0) + 100.
    .balign 16
    .global user_outer
user_outer:
    stp     x29, x30, [sp, #-16]!
    mov     x29, sp
    bl      user_recurse
    add     x0, x0, #100
    ldp     x29, x30, [sp], #16
    ret
"#
);

unsafe extern "C" {
    static user_prog_tls: u32;
    static user_prog_fault: u32;
    static user_prog_pac: u32;
    static user_prog_fault_load: u32;
    static user_prog_fault_store: u32;
    static user_prog_diff: u32;
    static user_prog_stack_fault: u32;
    static user_prog_call: u32;
    static user_test_nop: u32;
    static user_test_push: u32;
    static user_test_ret: u32;
    static user_test_mul: u32;
    static user_test_sp: u32;
    static user_test_svc: u32;
    static user_recurse: u32;
    static user_outer: u32;
}

/// The user VA of a `.text.user` symbol.
fn at(symbol: *const u32) -> u64 {
    user::user_address(symbol as u64)
}

static HITS: AtomicU64 = AtomicU64::new(0);
static RETURNS: AtomicU64 = AtomicU64::new(0);

/// Bit n: a uprobe handler ran on CPU n.
static HIT_CPUS: AtomicU64 = AtomicU64::new(0);

fn count_hit(_: &mut Registers) {
    HITS.fetch_add(1, Ordering::Relaxed);
    HIT_CPUS.fetch_or(1 << task::this_cpu(), Ordering::Relaxed);
}

fn count_return(_: &mut Registers) {
    RETURNS.fetch_add(1, Ordering::Relaxed);
}

fn run(entry: u64, arguments: [u64; 3]) -> Result<u64, UserFault> {
    user::run(entry, arguments, Options::DEFAULT)
}

fn user_syscalls_tls_and_yield(_: &Context) -> Outcome {
    check_eq!(ENOSYS, -38i64 as u64);
    // SAFETY (for every `at(&raw const symbol)` in this file): only the address of an asm
    // symbol is taken.
    let entry = at(&raw const user_prog_tls);
    // Two tasks, each with its own TPIDR_EL0, yielding to each other 20 times.
    let magics = [0x1111_2222_3333_4444u64, 0x5555_6666_7777_8888];
    // Then each spins for 4 ticks without yielding, so the timer IRQ preempts it at EL0.
    let spin = 4 * timer::frequency() / timer::hz();
    let ticks_before = timer::ticks();
    let mut ids = [task::TaskId(0); 2];
    for (id, magic) in ids.iter_mut().zip(magics) {
        *id = user::spawn("user-tls", entry, [magic, 20, spin], Options::DEFAULT)
            .map_err(|_| super::fail("spawn failed"))?;
    }
    for (id, magic) in ids.into_iter().zip(magics) {
        check!(task::join(id) == State::Exited);
        check_eq!(user::exit_code(id).unwrap_or(0), magic ^ 1);
        check!(user::fault(id).is_none());
    }
    check!(timer::ticks() - ticks_before >= 4);
    Ok(Verdict::Passed)
}

fn user_tasks_sign_with_their_own_key(_: &Context) -> Outcome {
    if crate::arch::cpu::PointerAuth::detect() == crate::arch::cpu::PointerAuth::None {
        return Ok(Verdict::Skipped("no PAuth on this CPU"));
    }
    let (pointer, modifier) = (USER_TEXT + 0x40, 0x1234_5678u64);
    let kernel_signed: u64;
    // SAFETY: PACIA of a value in a register with the kernel's key (the CPU has PAuth): no memory.
    unsafe {
        core::arch::asm!(".inst 0xdac10020", inout("x0") pointer => kernel_signed, in("x1") modifier,
            options(nomem, nostack, preserves_flags))
    };
    let entry = at(&raw const user_prog_pac);
    let first = run(entry, [pointer, modifier, 0]).map_err(|_| super::fail("user PAC program faulted"))?;
    let second = run(entry, [pointer, modifier, 0]).map_err(|_| super::fail("user PAC program faulted"))?;
    // Each signed (and authenticated) with a key of its own: neither the kernel's nor each other's.
    check!(first != 0xbad && second != 0xbad);
    check!(first != pointer && second != pointer);
    check!(first != kernel_signed);
    check!(second != kernel_signed);
    check!(first != second);
    // The kernel's own PAC-signed returns still authenticate after the switches (this function
    // returns through them), and its key still signs as before.
    let again: u64;
    // SAFETY: as above.
    unsafe {
        core::arch::asm!(".inst 0xdac10020", inout("x0") pointer => again, in("x1") modifier,
            options(nomem, nostack, preserves_flags))
    };
    check_eq!(again, kernel_signed);
    Ok(Verdict::Passed)
}

fn user_faults_kill_the_task(_: &Context) -> Outcome {
    let entry = at(&raw const user_prog_fault);
    let kernel_address = &HITS as *const AtomicU64 as u64;
    // (address, kind, class, fault status, write, pc)
    let load_pc = at(&raw const user_prog_fault_load);
    let store_pc = at(&raw const user_prog_fault_store);
    let cases: [(u64, u64, ExceptionClass, bool, u64); 4] = [
        (0x1000, 0, ExceptionClass::DataAbortLowerEl, false, load_pc),
        (kernel_address, 0, ExceptionClass::DataAbortLowerEl, false, load_pc),
        (USER_TEXT, 1, ExceptionClass::DataAbortLowerEl, true, store_pc),
        (USER_STACK_TOP - 16, 2, ExceptionClass::InstructionAbortLowerEl, false, USER_STACK_TOP - 16),
    ];
    for (address, kind, class, write, pc) in cases {
        let id = user::spawn("user-fault", entry, [address, kind, 0], Options::DEFAULT)
            .map_err(|_| super::fail("spawn failed"))?;
        check!(task::join(id) == State::Killed(KillReason::UserFault));
        let Some(fault) = user::fault(id) else { return Err(super::fail("no fault recorded")) };
        check!(ExceptionClass::of(fault.esr) == class);
        check_eq!(fault.far, address);
        check_eq!(fault.pc, pc);
        check_eq!(fault.esr & (1 << 6) != 0 && class == ExceptionClass::DataAbortLowerEl, write);
        let status = FaultStatus::of(fault.esr);
        match address {
            0x1000 => check!(matches!(status, FaultStatus::Translation { .. })),
            _ => check!(matches!(status, FaultStatus::Permission { .. })),
        }
    }
    Ok(Verdict::Passed)
}

/// Targets and the methods that apply to their first instruction.
fn targets() -> [(&'static str, u64, &'static [Method]); 4] {
    [
        ("nop", at(&raw const user_test_nop), &Method::ALL),
        ("push", at(&raw const user_test_push), &Method::ALL),
        ("ret", at(&raw const user_test_ret), &[Method::Simulate, Method::Detour]),
        ("mul", at(&raw const user_test_mul), &[Method::SingleStep, Method::BrkStep, Method::Detour]),
    ]
}

fn uprobe_methods_match_unprobed_run(_: &Context) -> Outcome {
    let program = at(&raw const user_prog_diff);
    for (name, target, methods) in targets() {
        for uretprobe in [false, true] {
            // A uretprobe changes the return address the target pushes: leave the stack out.
            let with_stack = u64::from(!uretprobe);
            let unprobed = run(program, [target, with_stack, 0]).map_err(|_| super::fail("unprobed run faulted"))?;
            for &method in methods {
                HITS.store(0, Ordering::Relaxed);
                RETURNS.store(0, Ordering::Relaxed);
                let returns = uretprobe.then_some(count_return as probes::Handler);
                if let Err(error) = uprobes::register(target, method, count_hit, returns) {
                    defmt::error!("  {=str} {}: {}", name, method, error);
                    return Err(super::fail("register failed"));
                }
                let probed = run(program, [target, with_stack, 0]);
                let counts = uprobes::counts(target);
                check!(uprobes::unregister(target).is_ok());
                if probed != Ok(unprobed) {
                    defmt::error!(
                        "  {=str} {} uretprobe={=bool}: {=u64:#x} vs {=u64:#x}",
                        name,
                        method,
                        uretprobe,
                        probed.unwrap_or(0),
                        unprobed
                    );
                    return Err(super::fail("probed run differs from the unprobed run"));
                }
                check_eq!(HITS.load(Ordering::Relaxed), 3);
                check_eq!(RETURNS.load(Ordering::Relaxed), if uretprobe { 3 } else { 0 });
                check!(counts == Some((3, if uretprobe { 3 } else { 0 })));
            }
        }
    }
    Ok(Verdict::Passed)
}

fn uprobe_stack_faults_match_unprobed_store(_: &Context) -> Outcome {
    let program = at(&raw const user_prog_stack_fault);
    let target = at(&raw const user_test_push);
    // `stp x29, x30, [sp, #-16]!` with SP 16 bytes into the unmapped lowest stack page... so the
    // store lands at USER_STACK_BASE, which is not mapped.
    let sp = USER_STACK_BASE + 16;
    let options = Options { irqs_masked: false, unmap_lowest_stack_page: true };
    let Err(unprobed) = user::run(program, [target, sp, 0], options) else {
        return Err(super::fail("the unprobed store did not fault"));
    };
    check_eq!(unprobed.pc, target);
    check_eq!(unprobed.far, USER_STACK_BASE);
    check!(ExceptionClass::of(unprobed.esr) == ExceptionClass::DataAbortLowerEl);
    check!(matches!(FaultStatus::of(unprobed.esr), FaultStatus::Translation { .. }));
    for method in Method::ALL {
        check!(uprobes::register(target, method, count_hit, None).is_ok());
        let probed = user::run(program, [target, sp, 0], options);
        check!(uprobes::unregister(target).is_ok());
        let Err(probed) = probed else {
            return Err(super::fail("the probed store did not fault"));
        };
        if probed != unprobed {
            defmt::error!("  {}: probed {} vs unprobed {}", method, probed, unprobed);
            return Err(super::fail("the probed fault differs from the unprobed one"));
        }
    }
    Ok(Verdict::Passed)
}

/// What the handler saw: x0, x1, pc, and whether a kernel read of user text faulted.
static SEEN: spin::Mutex<[u64; 4]> = spin::Mutex::new([0; 4]);

fn inspect_and_change(registers: &mut Registers) {
    let faulted = super::catch(ExceptionClass::DataAbort, || {
        // SAFETY: an ordinary (privileged) read of mapped user text, in asm so that no sanitizer
        // check looks for its shadow; under PAN it faults and `catch` resumes after it.
        unsafe {
            core::arch::asm!("ldr {v:w}, [{a}]", a = in(reg) USER_TEXT, v = out(reg) _, options(nostack, readonly))
        };
    });
    *SEEN.lock() = [registers.x[0], registers.x[1], registers.pc, u64::from(faulted.is_some())];
    registers.x[1] = 1000;
}

fn uprobe_handler_sees_registers(_: &Context) -> Outcome {
    let program = at(&raw const user_prog_call);
    let target = at(&raw const user_test_push);
    for method in Method::ALL {
        *SEEN.lock() = [0; 4];
        check!(uprobes::register(target, method, inspect_and_change, None).is_ok());
        // user_prog_call: x0 = 7, x1 = 7 at the target (mov x0, x1 leaves x1 as passed).
        let result = run(program, [target, 7, 0]);
        check!(uprobes::unregister(target).is_ok());
        let seen = *SEEN.lock();
        check_eq!(seen[0], 7);
        check_eq!(seen[1], 7);
        check_eq!(seen[2], target);
        check_eq!(seen[3], u64::from(user::pan_enabled()));
        // The handler's x1 = 1000 reached the target: 7 + 1000.
        check!(result == Ok(1007));
    }
    Ok(Verdict::Passed)
}

static RETURN_VALUES: spin::Mutex<([u64; 8], usize)> = spin::Mutex::new(([0; 8], 0));

fn record_return(registers: &mut Registers) {
    let mut values = RETURN_VALUES.lock();
    let index = values.1;
    if index < values.0.len() {
        values.0[index] = registers.x[0];
    }
    values.1 += 1;
    RETURNS.fetch_add(1, Ordering::Relaxed);
}

fn uretprobe_recursion_and_nesting(_: &Context) -> Outcome {
    let program = at(&raw const user_prog_call);
    let recurse = at(&raw const user_recurse);
    let outer = at(&raw const user_outer);
    check!(run(program, [outer, 5, 0]) == Ok(115));
    for method in Method::ALL {
        *RETURN_VALUES.lock() = ([0; 8], 0);
        HITS.store(0, Ordering::Relaxed);
        RETURNS.store(0, Ordering::Relaxed);
        check!(uprobes::register(recurse, method, count_hit, Some(record_return)).is_ok());
        check!(uprobes::register(outer, method, count_hit, Some(record_return)).is_ok());
        let result = run(program, [outer, 5, 0]);
        check!(uprobes::unregister(recurse).is_ok());
        check!(uprobes::unregister(outer).is_ok());
        check!(result == Ok(115));
        check_eq!(HITS.load(Ordering::Relaxed), 7);
        check_eq!(RETURNS.load(Ordering::Relaxed), 7);
        // Innermost first: recurse(0..=5) return 0, 1, 3, 6, 10, 15, then outer 115.
        let (values, count) = *RETURN_VALUES.lock();
        check_eq!(count, 7);
        check!(values[..7] == [0, 1, 3, 6, 10, 15, 115]);
    }
    check_eq!(uprobes::missed_returns(), 0);
    Ok(Verdict::Passed)
}

fn uprobe_refusals_say_why(_: &Context) -> Outcome {
    let push = at(&raw const user_test_push);
    let kernel = uprobe_refusals_say_why as *const () as u64;
    check!(uprobes::register(kernel, Method::Simulate, count_hit, None) == Err(ProbeError::NotText(Text::User)));
    check!(uprobes::register(push + 2, Method::Simulate, count_hit, None) == Err(ProbeError::Misaligned));
    check!(
        uprobes::register(at(&raw const user_test_mul), Method::Simulate, count_hit, None)
            == Err(ProbeError::NotSimulated)
    );
    check!(
        uprobes::register(at(&raw const user_test_ret), Method::SingleStep, count_hit, None)
            == Err(ProbeError::NeedsOriginalPc(Text::User))
    );
    check!(matches!(
        uprobes::register(at(&raw const user_test_svc), Method::BrkStep, count_hit, None),
        Err(ProbeError::Rejected(_))
    ));
    check!(uprobes::register(push, Method::Simulate, count_hit, None).is_ok());
    check!(uprobes::register(push, Method::Detour, count_hit, None) == Err(ProbeError::AlreadyRegistered));
    check!(uprobes::unregister(push).is_ok());
    check!(uprobes::unregister(push) == Err(ProbeError::NotRegistered));
    Ok(Verdict::Passed)
}

/// A handler asking to skip the instruction, Linux-style (a new PC: here the `ret` after it),
/// that also sets x0.
fn skip_instruction(registers: &mut Registers) {
    registers.pc += 4;
    registers.x[0] = 1000;
}

fn uprobe_detour_honours_pc_change(_: &Context) -> Outcome {
    let program = at(&raw const user_prog_call);
    let target = at(&raw const user_test_mul);
    // user_prog_call: x0 = x1 = 7 at `mul x0, x0, x1`.
    check!(run(program, [target, 7, 0]) == Ok(49));
    check!(uprobes::register(target, Method::Detour, skip_instruction, None).is_ok());
    let result = run(program, [target, 7, 0]);
    let counts = uprobes::counts(target);
    check!(uprobes::unregister(target).is_ok());
    // Skipped, the handler's x0 comes back; performed, 1000 * 7.
    check!(result == Ok(1000));
    check!(counts == Some((1, 0)));
    Ok(Verdict::Passed)
}

/// A handler moving SP down by 64 bytes.
fn move_stack_pointer(registers: &mut Registers) {
    registers.sp -= 64;
}

fn uprobe_detour_honours_sp_change(_: &Context) -> Outcome {
    let program = at(&raw const user_prog_call);
    let target = at(&raw const user_test_sp);
    // `mov x0, sp` returns the SP the target runs on (user_prog_call exits at once after it).
    let unprobed = run(program, [target, 0, 0]).map_err(|_| super::fail("unprobed run faulted"))?;
    check!(uprobes::register(target, Method::Detour, move_stack_pointer, None).is_ok());
    let result = run(program, [target, 0, 0]);
    check!(uprobes::unregister(target).is_ok());
    // The displaced instruction ran with the handler's SP.
    check!(result == Ok(unprobed - 64));
    Ok(Verdict::Passed)
}

/// An EL0 task pinned to each CPU in turn hits a uprobe (each method): the probed run exits as
/// the unprobed one, the handler runs on that CPU, three hits each. Needs every CPU's own EL0
/// state (TTBR0 walks, its copy of the kernel's APIA key for the key switch on entry).
fn smp_uprobes_every_cpu(_: &Context) -> Outcome {
    let wanted = task::cpus::wanted();
    if wanted == 1 {
        return Ok(Verdict::Skipped("one CPU (run with --smp N)"));
    }
    let program = at(&raw const user_prog_diff);
    let target = at(&raw const user_test_push);
    let unprobed = run(program, [target, 1, 0]).map_err(|_| super::fail("unprobed run faulted"))?;
    for method in Method::ALL {
        check!(uprobes::register(target, method, count_hit, None).is_ok());
        for cpu in 0..wanted {
            HITS.store(0, Ordering::Relaxed);
            HIT_CPUS.store(0, Ordering::Relaxed);
            let probed = user::run_on(cpu, program, [target, 1, 0], Options::DEFAULT);
            if probed != Ok(unprobed) {
                defmt::error!("  {} on cpu {=usize}: {}", method, cpu, probed);
                check!(uprobes::unregister(target).is_ok());
                return Err(super::fail("the probed run on this CPU differs from the unprobed run"));
            }
            check_eq!(HITS.load(Ordering::Relaxed), 3);
            check_eq!(HIT_CPUS.load(Ordering::Relaxed), 1 << cpu);
        }
        check!(uprobes::unregister(target).is_ok());
    }
    Ok(Verdict::Passed)
}
