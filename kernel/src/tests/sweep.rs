//! Rules the probe sweep (`kernel/src/sweep`) found missing, each checked where it applies.

use alloc::vec::Vec;

use super::{Context, Failure, Outcome, Test, Verdict, check};
use crate::mm::kasan::CHECKS_COMPILED_IN;
use crate::probes::{self as kprobes, Method, ProbeError, Registers};
use crate::symbols::Symbols;
use probes::{Classification, Insn, Simulated, classify};

pub const TESTS: &[Test] = &[
    Test { name: "probe_sweep_refuses_sanitizer_check_thunks", run: refuses_check_thunks },
    Test { name: "probe_sweep_refuses_the_simulator", run: refuses_the_simulator },
    Test { name: "probe_sweep_refuses_the_irq_exit", run: refuses_the_irq_exit },
    Test { name: "probe_simulator_calls_only_noprobe_text", run: simulator_calls_only_noprobe_text },
    Test { name: "probe_sanitizer_helpers_call_only_noprobe_text", run: sanitizer_helpers_call_only_noprobe_text },
    Test { name: "probe_sweep_exempts_the_heap_locks_callees", run: exempts_the_heap_locks_callees },
    Test { name: "probe_sweep_exemptions_name_functions", run: exemptions_name_functions },
];

/// On several CPUs the heap lock's retry loop and contended path run as often as the other CPUs
/// make them, so the sweep does not compare hit counts there (`sweep::contended`). In `full` the
/// core atomics they call are out of line: the 4-CPU sample found `atomic_load::<u64>` (the
/// contended acquire's per-CPU count) hit on the other CPUs in some methods' batches and not in
/// others'. The buddy allocator's free walks and merges the free lists the other CPUs' passes
/// change (when it was the `buddy_system_allocator` crate, the whole 4-CPU sweep in `full`
/// counted every word of its out-of-line `dealloc` differently by method on CPU 0: 74
/// failures, e.g. `+0xc8`: single-step 35, brk-step 30); it is now the block table
/// (`mm/kasan/blocks.rs`). The rule: every call out of the heap's
/// locked sections to a core atomic (the lock's retry loop and contended path) or to the buddy
/// allocator lands in a function the sweep exempts. Other callees (the guard's `deref`) run once
/// per acquire and stay compared. Both builds have a locked section out of line; in `full`
/// (core instrumented, its atomics out of line) the scan must find some.
fn exempts_the_heap_locks_callees(_: &Context) -> Outcome {
    let Some(symbols) = Symbols::get() else {
        return Err(Failure { expression: "the embedded symbol table (xtask fills it)", file: file!(), line: line!() });
    };
    if crate::symbols::callsites::entries().is_empty() {
        // The sweep does not run in `plain` either.
        return Ok(Verdict::Skipped("no patchable entries to find the functions by (variant plain)"));
    }
    let mut sections = 0;
    let mut callees = 0;
    for start in crate::symbols::callsites::entries().iter().map(|entry| entry + 8) {
        let Some(name) = symbols.name_at(start) else { continue };
        // The locked sections, out of line or inlined into the heap's entries.
        if !name.starts_with("kernel::mm::kasan::heap::") {
            continue;
        }
        sections += 1;
        let Some(end) = function_end(&symbols, start) else { continue };
        for at in (start..end).step_by(4) {
            // SAFETY: kernel text between two symbols, mapped readable, 4-aligned.
            let word = unsafe { core::ptr::read_volatile(at as *const u32) };
            let Some(target) = branch_target(at, word) else { continue };
            if (start..end).contains(&target) || kprobes::is_noprobe(target) {
                continue;
            }
            let callee = symbols.name_at(target).unwrap_or("?");
            let allocator =
                callee.starts_with("kernel::mm::kasan::blocks::") || callee.starts_with("<kernel::mm::kasan::blocks::");
            if !callee.starts_with("core::sync::atomic::") && !allocator {
                continue;
            }
            callees += 1;
            if !crate::sweep::contended(callee) {
                defmt::error!("{=str}+{=u64:#x} calls {=str}: counts compared", name, at - start, callee);
                check!(false);
            }
        }
    }
    check!(sections > 0 && (callees > 0 || !CHECKS_COMPILED_IN));
    // The grace period's wait loop runs as long as the other CPUs take to answer (the whole prod
    // sweep on 4 CPUs: `synchronize+0x240` counted 520, 535 and 115 times by three methods).
    check!(crate::sweep::contended("kernel::task::cpus::synchronize"));
    Ok(Verdict::Passed)
}

/// The sweep's exemptions by exact name must name functions of this kernel, or a rename would
/// bring back the false failures they exist for: the scheduler's pick, whose path on the other
/// CPUs depends on CPU 0's tasks (`paced_by_cpu0`; the whole 4-CPU prod sweep counted
/// `switch_locked+0x144` once on the other CPUs under simulate, never under detour), the
/// grace period's wait (`contended`), and the code a tracer on every function runs per traced
/// call (`per_traced_call`; the whole 4-CPU `full` sweep with a tracer: 249 words of the list
/// dispatcher and the counting tracer differed between methods).
fn exemptions_name_functions(_: &Context) -> Outcome {
    let Some(symbols) = Symbols::get() else {
        return Err(Failure { expression: "the embedded symbol table (xtask fills it)", file: file!(), line: line!() });
    };
    if crate::symbols::callsites::entries().is_empty() {
        return Ok(Verdict::Skipped("no patchable entries to find the functions by (variant plain)"));
    }
    for (name, exempt) in [
        ("kernel::task::switch_locked", crate::sweep::paced_by_cpu0 as fn(&str) -> bool),
        ("kernel::task::cpus::synchronize", crate::sweep::contended),
        ("kernel::ftrace::trampoline::list_func", crate::sweep::per_traced_call),
        ("kernel::ftrace::tracers::count", crate::sweep::per_traced_call),
    ] {
        check!(exempt(name));
        let start = symbols.address_of(name);
        if start.is_none() {
            defmt::error!("the sweep exempts {=str}: no such function", name);
        }
        // A function the sweep walks: one of the patchable entries' functions.
        let walked =
            |start| crate::symbols::callsites::function_containing(start).map(|(first, _)| first) == Some(start);
        check!(start.is_some_and(walked));
    }
    check!(!crate::sweep::paced_by_cpu0("kernel::task::irq_exit"));
    check!(!crate::sweep::per_traced_call("kernel::ftrace::set_scheme"));
    Ok(Verdict::Passed)
}

fn ignore(_: &mut Registers) {}

#[inline(never)]
fn checked_store(address: *mut u64, value: u64) {
    // SAFETY: `address` points at a live u64 (the caller's local).
    unsafe { address.write_volatile(value) }
}

/// The sweep single-stepped `__hwasan_check_x8_*`: every instrumented access calls the check
/// thunks, the probe hit path too, so the probe recursed until the stack overflowed. They are
/// no-probe text now (kernel.ld). The thunk is found as the target of the `BL` the compiler put
/// before the store in `checked_store`. Only `full` has check thunks; there the `BL` must be
/// found before the function's return, so a build that lost the checks fails rather than skips.
fn refuses_check_thunks(_: &Context) -> Outcome {
    if !CHECKS_COMPILED_IN {
        return Ok(Verdict::Skipped("no sanitizer check thunks in this build (only `full` has kernel-hwaddress)"));
    }
    let mut slot = 0u64;
    checked_store(&mut slot, 7);
    check!(slot == 7);
    let start = checked_store as *const () as u64;
    let mut thunk = None;
    for index in 0..16 {
        let at = start + 4 * index;
        // SAFETY: kernel text, mapped readable; the scan stops at the function's return, so it
        // reads only `checked_store`'s own words.
        let word = unsafe { core::ptr::read_volatile(at as *const u32) };
        // RET, RETAA, RETAB: the end of `checked_store`, no BL before it.
        if word & 0xffff_fc1f == 0xd65f_0000 || word == 0xd65f_0bff || word == 0xd65f_0fff {
            break;
        }
        // BL: bits [31:26] = 100101; imm26 is a signed word offset.
        if word >> 26 == 0b100101 {
            thunk = Some(at.wrapping_add((((word << 6) as i32 >> 6) as i64 * 4) as u64));
            break;
        }
    }
    let Some(thunk) = thunk else {
        return Err(Failure {
            expression: "a BL to a check thunk before checked_store returns",
            file: file!(),
            line: line!(),
        });
    };
    for method in Method::ALL {
        let refused = kprobes::register(thunk, method, ignore, None);
        if refused.is_ok() {
            let _ = kprobes::unregister(thunk);
        }
        check!(matches!(refused, Err(ProbeError::NoProbe(_))));
    }
    Ok(Verdict::Passed)
}

/// The whole-kernel sweep in `full` hit a probe inside the instruction simulator from inside a
/// simulated hit (a random set with probes in both `kasan::heap::free` and the simulator): the
/// nested BRK had no owner and the kernel stopped. The hit path's simulator is no-probe text in
/// every build (its `link_section`, crates/probes); this fails without it.
fn refuses_the_simulator(_: &Context) -> Outcome {
    let simulator = kprobes::simulator_text();
    for method in Method::ALL {
        let refused = kprobes::register(simulator, method, ignore, None);
        if refused.is_ok() {
            let _ = kprobes::unregister(simulator);
        }
        check!(matches!(refused, Err(ProbeError::NoProbe(_))));
    }
    Ok(Verdict::Passed)
}

/// The IRQ exit reads this CPU's probe status to decide whether it may switch tasks: a probe
/// stepped on that load reads its own hit's status, so while it is armed no IRQ exit on any CPU
/// reschedules and no grace period ends (found by the whole prod sweep on 4 CPUs:
/// `trap_irq_exit+0x44:single-step` hung it). Every word of it is refused, with every method.
fn refuses_the_irq_exit(_: &Context) -> Outcome {
    let Some(symbols) = Symbols::get() else {
        return Err(Failure { expression: "the embedded symbol table (xtask fills it)", file: file!(), line: line!() });
    };
    let start = crate::trap::irq_exit_text();
    check!(symbols.name_at(start) == Some("trap_irq_exit"));
    let Some(end) = function_end(&symbols, start) else {
        return Err(Failure { expression: "the end of trap_irq_exit", file: file!(), line: line!() });
    };
    for at in (start..end).step_by(4) {
        for method in Method::ALL {
            let refused = kprobes::register(at, method, ignore, None);
            if refused.is_ok() {
                let _ = kprobes::unregister(at);
            }
            check!(matches!(refused, Err(ProbeError::NoProbe(_))));
        }
    }
    Ok(Verdict::Passed)
}

/// Longest function the branch scan reads (words); a longer one is a failure, not a cut.
const MAX_SCANNED_WORDS: u64 = 4096;
/// Functions the scan may reach from its roots through no-probe callees.
const MAX_SCANNED_FUNCTIONS: usize = 64;

/// A branch out of no-probe code into text a probe may be placed on.
#[derive(Clone, Copy)]
struct ProbeableCallee {
    caller: u64,
    at: u64,
    target: u64,
}

/// The target of a B, BL, B.cond, CBZ/CBNZ or TBZ/TBNZ at `at` (decoded by the probes crate).
fn branch_target(at: u64, word: u32) -> Option<u64> {
    let offset = match classify(Insn(word)) {
        Classification::Simulate(
            Simulated::Branch { offset, .. }
            | Simulated::BranchConditional { offset, .. }
            | Simulated::CompareBranch { offset, .. }
            | Simulated::TestBranch { offset, .. },
        ) => offset,
        _ => return None,
    };
    Some(at.wrapping_add(offset as u64))
}

/// Where the function starting at `start` ends: the next function symbol's address, or the probe
/// slot area (an asm symbol the function table leaves out) that follows the last no-probe function.
fn function_end(symbols: &Symbols, start: u64) -> Option<u64> {
    let slots = kprobes::slot_area_address();
    (1..=MAX_SCANNED_WORDS).map(|word| start + 4 * word).find(|&at| at == slots || symbols.name_at(at).is_some())
}

/// Every branch out of `roots` (function starts) and, transitively, out of the no-probe
/// functions they branch to, whose target is not no-probe text. Err names what could not be
/// scanned.
fn probeable_callees(symbols: &Symbols, roots: &[u64]) -> Result<Vec<ProbeableCallee>, &'static str> {
    let mut pending: Vec<u64> = roots.to_vec();
    let mut scanned: Vec<u64> = Vec::new();
    let mut found = Vec::new();
    while let Some(start) = pending.pop() {
        if scanned.contains(&start) {
            continue;
        }
        if scanned.len() == MAX_SCANNED_FUNCTIONS {
            return Err("more functions reachable from the simulator than the scan allows");
        }
        scanned.push(start);
        let Some(end) = function_end(symbols, start) else {
            defmt::error!("no symbol after {=u64:#x} {=str}", start, symbols.name_at(start).unwrap_or("?"));
            return Err("a function without a symbol after it (too long?)");
        };
        for at in (start..end).step_by(4) {
            // SAFETY: kernel text between two symbols, mapped readable, 4-aligned.
            let word = unsafe { core::ptr::read_volatile(at as *const u32) };
            let Some(target) = branch_target(at, word) else { continue };
            if (start..end).contains(&target) {
                continue;
            }
            if !kprobes::is_noprobe(target) {
                found.push(ProbeableCallee { caller: start, at, target });
            } else if symbols.name_at(target).is_some() {
                pending.push(target);
            }
        }
    }
    Ok(found)
}

fn report_callees(symbols: &Symbols, callees: &[ProbeableCallee]) {
    for callee in callees {
        defmt::error!(
            "{=str}+{=u64:#x} branches to {=u64:#x} {=str}: probeable text",
            symbols.name_at(callee.caller).unwrap_or("?"),
            callee.at - callee.caller,
            callee.target,
            symbols.name_at(callee.target).unwrap_or("(not a function start)")
        );
    }
}

/// The sanitizer's memory helpers (`__hwasan_memcpy`, `memmove`, `memset`, `loadN`, `storeN`)
/// are no-probe text that the probe hit path itself runs (its copies of frames and slots), so a
/// probe on anything they call is hit from inside every hit. The whole-kernel sweep in `full`
/// found `kasan::abi::untag` out of line in probeable text, called by them; it is always
/// inlined now. The rule: every branch out of them, and out of the no-probe functions they
/// reach, lands in no-probe text (the scan and its control are the simulator test's), but for
/// the primitives they wrap (`memcpy`, `memmove`, `memset`: probeable, as Linux's are, and swept
/// like any function; a probe there that a hit reaches is re-entered and counted missed) and the
/// tag-mismatch report (`abi::record`: once per finding, which ends the run). With `untag` out of line
/// (`#[inline(never)]`) this fails in `full`.
fn sanitizer_helpers_call_only_noprobe_text(_: &Context) -> Outcome {
    let Some(symbols) = Symbols::get() else {
        return Err(Failure { expression: "the embedded symbol table (xtask fills it)", file: file!(), line: line!() });
    };
    let helpers = ["__hwasan_memcpy", "__hwasan_memmove", "__hwasan_memset", "__hwasan_loadN", "__hwasan_storeN"];
    let roots: Vec<u64> = helpers.iter().filter_map(|&name| symbols.address_of(name)).collect();
    if CHECKS_COMPILED_IN {
        // `full` calls them: all five must be there to scan.
        check!(roots.len() == helpers.len());
    }
    for &root in &roots {
        check!(kprobes::is_noprobe(root));
    }
    let callees = match probeable_callees(&symbols, &roots) {
        Ok(callees) => callees,
        Err(expression) => return Err(Failure { expression, file: file!(), line: line!() }),
    };
    let callees: Vec<ProbeableCallee> = callees
        .into_iter()
        .filter(|callee| {
            symbols.name_at(callee.caller) != Some("kernel::mm::kasan::abi::record")
                && !matches!(symbols.name_at(callee.target), Some("memcpy" | "memmove" | "memset"))
        })
        .collect();
    report_callees(&symbols, &callees);
    check!(callees.is_empty());
    Ok(Verdict::Passed)
}

/// A probeable function a no-probe function calls: the scan must find this call.
#[inline(never)]
fn probeable_callee(value: u64) -> u64 {
    core::hint::black_box(value).wrapping_mul(3)
}

#[unsafe(link_section = ".text.noprobe")]
#[inline(never)]
fn noprobe_caller(value: u64) -> u64 {
    probeable_callee(value) + 1
}

/// The simulator runs inside every simulated hit, so a probe on anything it calls is hit from
/// inside a hit: re-entered on every simulated hit, and a re-entered simulated probe re-enters
/// again (the whole-kernel sweep in `full` found `core::num::wrapping_add_signed`, `Indexing`'s
/// derived `PartialEq`, `Condition::holds` out of line in probeable text). The rule: every branch
/// out of the simulator's instantiations (kernel and user) and `simulate_hit`, and out of any
/// no-probe function they reach, lands in no-probe text. The control: a no-probe function
/// calling a probeable one must be caught.
fn simulator_calls_only_noprobe_text(_: &Context) -> Outcome {
    let Some(symbols) = Symbols::get() else {
        return Err(Failure { expression: "the embedded symbol table (xtask fills it)", file: file!(), line: line!() });
    };
    check!(noprobe_caller(2) == 7);
    let control = noprobe_caller as *const () as u64;
    let caught = probeable_callees(&symbols, &[control]);
    check!(
        matches!(&caught, Ok(callees) if callees.len() == 1 && callees[0].target == probeable_callee as *const () as u64)
    );
    let roots: Vec<u64> = kprobes::simulator_functions().iter().map(|&(_, address)| address).collect();
    for &root in &roots {
        check!(symbols.name_at(root).is_some() && kprobes::is_noprobe(root));
    }
    let callees = match probeable_callees(&symbols, &roots) {
        Ok(callees) => callees,
        Err(expression) => return Err(Failure { expression, file: file!(), line: line!() }),
    };
    report_callees(&symbols, &callees);
    check!(callees.is_empty());
    Ok(Verdict::Passed)
}
