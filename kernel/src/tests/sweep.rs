//! Rules the probe sweep (`kernel/src/sweep`) found missing, each checked where it applies.

use super::{Context, Failure, Outcome, Test, Verdict, check};
use crate::mm::kasan::CHECKS_COMPILED_IN;
use crate::probes::{self as kprobes, Method, ProbeError, Registers};

pub const TESTS: &[Test] = &[
    Test { name: "probe_sweep_refuses_sanitizer_check_thunks", run: refuses_check_thunks },
    Test { name: "probe_sweep_refuses_the_simulator", run: refuses_the_simulator },
];

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
