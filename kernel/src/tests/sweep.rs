//! Rules the probe sweep (`kernel/src/sweep`) found missing, each checked where it applies.

use super::{Context, Outcome, Test, Verdict, check};
use crate::probes::{self as kprobes, Method, ProbeError, Registers};

pub const TESTS: &[Test] = &[Test { name: "probe_sweep_refuses_sanitizer_check_thunks", run: refuses_check_thunks }];

fn ignore(_: &mut Registers) {}

#[inline(never)]
fn checked_store(address: *mut u64, value: u64) {
    // SAFETY: `address` points at a live u64 (the caller's local).
    unsafe { address.write_volatile(value) }
}

/// The sweep single-stepped `__hwasan_check_x8_*`: every instrumented access calls the check
/// thunks, the probe hit path too, so the probe recursed until the stack overflowed. They are
/// no-probe text now (kernel.ld). The thunk is found as the target of the `BL` the compiler put
/// before the store in `checked_store` (only the `full` build has one).
fn refuses_check_thunks(_: &Context) -> Outcome {
    let mut slot = 0u64;
    checked_store(&mut slot, 7);
    check!(slot == 7);
    let start = checked_store as *const () as u64;
    let thunk = (0..16).find_map(|index| {
        let at = start + 4 * index;
        // SAFETY: kernel text, mapped readable; the function is longer than the words read up
        // to its first BL, which every `full` build emits for the store.
        let word = unsafe { core::ptr::read_volatile(at as *const u32) };
        // BL: bits [31:26] = 100101; imm26 is a signed word offset.
        (word >> 26 == 0b100101).then(|| at.wrapping_add((((word << 6) as i32 >> 6) as i64 * 4) as u64))
    });
    let Some(thunk) = thunk else {
        return Ok(Verdict::Skipped("no sanitizer check thunks in this build"));
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
