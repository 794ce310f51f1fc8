//! `sweep.inject=reenter-twice`: reaches the probe hit path's "re-entered twice" panic, which
//! the no-probe rules keep the sweep from reaching (it needs probed code inside the performance of
//! a re-entered hit). Three probes: `first`'s handler calls `second`, whose hit is re-entered
//! (performed as a missed hit); a test-only fault (`inject::Fault::ReenteredRunsHandler`) makes
//! that performance run `second`'s handler, which calls `third`: its hit must panic naming the
//! three probes. xtask's failure path (`reenter-twice`) expects that panic and exit status 3.

use core::hint::black_box;

use crate::probes::{self as kprobes, Method, Registers, kretprobe};

#[inline(never)]
fn first(value: u64) -> u64 {
    black_box(value).wrapping_mul(0x9e37_79b9) ^ 0x19
}

#[inline(never)]
fn second(value: u64) -> u64 {
    black_box(value).rotate_left(11) ^ 0x1919
}

#[inline(never)]
fn third(value: u64) -> u64 {
    black_box(value).wrapping_add(0x19_0019) ^ 0x4
}

fn call_second(_: &mut Registers) {
    black_box(second(black_box(2)));
}

fn call_third(_: &mut Registers) {
    black_box(third(black_box(3)));
}

fn ignore(_: &mut Registers) {}

/// A brk-step probe (re-entered hits of BRK probes go through the re-entry check; a detour's
/// are counted missed in its trampoline) on the first word of `function` that accepts one.
fn probe(function: fn(u64) -> u64, handler: fn(&mut Registers)) -> Option<u64> {
    let start = kretprobe::attach_address(function as *const () as u64);
    (0..8)
        .map(|index| start + 4 * index)
        .find(|&address| kprobes::register(address, Method::BrkStep, handler, None).is_ok())
}

/// Arms the three probes and calls `first`: does not return (the hit path panics), or logs why
/// the probes could not be armed and returns.
pub fn run() {
    let armed = [probe(third, ignore), probe(second, call_third), probe(first, call_second)];
    let [Some(third_at), Some(second_at), Some(first_at)] = armed else {
        defmt::error!("sweep: reenter-twice: a target refused every probe");
        return;
    };
    defmt::info!(
        "sweep: reenter-twice: probes at {=u64:#x} (first), {=u64:#x} (second), {=u64:#x} (third)",
        first_at,
        second_at,
        third_at
    );
    crate::inject::set(crate::inject::Fault::ReenteredRunsHandler, true);
    black_box(first(black_box(1)));
    crate::inject::set(crate::inject::Fault::ReenteredRunsHandler, false);
    defmt::error!("sweep: reenter-twice: the third hit did not panic");
    for address in [first_at, second_at, third_at] {
        let _ = kprobes::unregister(address);
    }
}
