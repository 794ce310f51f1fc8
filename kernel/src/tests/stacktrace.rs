//! Tasks, overflow detection, and the frame-pointer, shadow-call-stack and SFrame walkers on real
//! stacks: random recursive call chains, IRQs at random and at known points, PAC bits, corrupted
//! records and tables.

use super::{Context, Outcome, Test, Verdict, check, check_eq};
use crate::arch::cpu;
use crate::stacktrace::{self, Mode};
use crate::sync::IrqMask;
use crate::task::{self, KillReason, State};
use crate::{drivers::timer, symbols::callsites};
use alloc::vec::Vec;
use core::hint::black_box;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use unwind::{Trace, TraceOptions, ViewDifference};

mod ground_truth;

pub const TESTS: &[Test] = &[
    Test { name: "tasks_are_preempted_by_the_timer", run: tasks_are_preempted_by_the_timer },
    Test { name: "stack_overflow_kills_only_the_task", run: stack_overflow_kills_only_the_task },
    Test { name: "shadow_stack_overflow_kills_only_the_task", run: shadow_stack_overflow_kills_only_the_task },
    Test { name: "shadow_stack_high_water_mark", run: shadow_stack_high_water_mark },
    Test { name: "fp_and_scs_traces_agree_on_random_chains", run: fp_and_scs_traces_agree_on_random_chains },
    Test { name: "sframe_and_fp_traces_agree_on_random_chains", run: sframe_and_fp_traces_agree_on_random_chains },
    Test { name: "corrupted_sframe_table_is_refused", run: corrupted_sframe_table_is_refused },
    Test { name: "traces_agree_in_irqs_at_random_points", run: traces_agree_in_irqs_at_random_points },
    Test { name: "traces_agree_in_an_irq_at_a_known_point", run: traces_agree_in_an_irq_at_a_known_point },
    Test { name: "corrupted_frame_record_stops_the_walk", run: corrupted_frame_record_stops_the_walk },
    Test { name: "save_stack_switches_mode_at_run_time", run: save_stack_switches_mode_at_run_time },
    Test { name: "short_buffer_stops_at_its_length", run: short_buffer_stops_at_its_length },
    Test {
        name: "depot_hash_instruction_matches_the_portable_crc",
        run: depot_hash_instruction_matches_the_portable_crc,
    },
    Test { name: "full_depot_keeps_handle_zero_and_says_why", run: full_depot_keeps_handle_zero_and_says_why },
    Test { name: "sampled_allocation_stacks", run: sampled_allocation_stacks },
];

fn no_scs() -> Option<Outcome> {
    (!crate::build_info::SHADOW_CALL_STACK).then_some(Ok(Verdict::Skipped("variant plain has no shadow call stack")))
}

// --- tasks ---------------------------------------------------------------------------------

static STOP: AtomicBool = AtomicBool::new(false);
static SPINS: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

extern "C" fn spinner(index: u64) {
    while !STOP.load(Ordering::Relaxed) {
        SPINS[index as usize].fetch_add(1, Ordering::Relaxed);
    }
}

fn tasks_are_preempted_by_the_timer(_: &Context) -> Outcome {
    STOP.store(false, Ordering::Relaxed);
    for spins in &SPINS {
        spins.store(0, Ordering::Relaxed);
    }
    let first = task::spawn("spinner-0", spinner, 0).map_err(|_| super::fail("spawn failed"))?;
    let second = task::spawn("spinner-1", spinner, 1).map_err(|_| super::fail("spawn failed"))?;
    // This task never yields: the others only run if the tick preempts it.
    let until = timer::ticks() + 20;
    while timer::ticks() < until {
        core::hint::spin_loop();
    }
    STOP.store(true, Ordering::Relaxed);
    check!(task::join(first) == State::Exited);
    check!(task::join(second) == State::Exited);
    check!(SPINS[0].load(Ordering::Relaxed) > 0);
    check!(SPINS[1].load(Ordering::Relaxed) > 0);
    Ok(Verdict::Passed)
}

/// Recurses with a 1 KiB frame until the stack's guard page stops it.
#[inline(never)]
fn deep(depth: u64) -> u64 {
    if depth == u64::MAX {
        return 0;
    }
    let mut frame = [depth; 128];
    black_box(&mut frame);
    deep(depth + 1).wrapping_add(frame[(depth % 128) as usize])
}

extern "C" fn overflow_stack(_: u64) {
    black_box(deep(0));
}

fn stack_overflow_kills_only_the_task(_: &Context) -> Outcome {
    let _ = crate::trap::take_last_overflow();
    let id = task::spawn("overflow-stack", overflow_stack, 0).map_err(|_| super::fail("spawn failed"))?;
    check!(task::join(id) == State::Killed(KillReason::StackOverflow));
    check!(crate::trap::take_last_overflow() == Some(KillReason::StackOverflow));
    // The kernel goes on: this task still runs, calls, and takes the timer tick.
    let ticks = timer::ticks();
    while timer::ticks() == ticks {}
    Ok(Verdict::Passed)
}

core::arch::global_asm!(
    r#"
    .section .text.test_recursion, "ax"
    // scs_recurse(n): n nested calls, each pushing its LR on the shadow call stack and a 16-byte
    // frame record on the stack (the shadow stack fills long before the stack).
    .global scs_recurse
scs_recurse:
    str     x30, [x18], #8
    stp     x29, x30, [sp, #-16]!
    mov     x29, sp
    subs    x0, x0, #1
    b.eq    1f
    bl      scs_recurse
1:  ldp     x29, x30, [sp], #16
    ldr     x30, [x18, #-8]!
    ret
"#
);

unsafe extern "C" {
    fn scs_recurse(depth: u64);
}

extern "C" fn recurse_task(depth: u64) {
    // SAFETY: scs_recurse only uses its own stack frames and shadow-stack entries.
    unsafe { scs_recurse(depth) };
}

fn shadow_stack_overflow_kills_only_the_task(_: &Context) -> Outcome {
    if let Some(skipped) = no_scs() {
        return skipped;
    }
    let _ = crate::trap::take_last_overflow();
    // 4 KiB of shadow stack is 511 entries: 1500 calls overflow it; their 24 KiB of frame
    // records fit in the 32 KiB stack, and the shadow stack overflows 8 KiB in.
    let id = task::spawn("overflow-scs", recurse_task, 1500).map_err(|_| super::fail("spawn failed"))?;
    check!(task::join(id) == State::Killed(KillReason::ShadowStackOverflow));
    check!(crate::trap::take_last_overflow() == Some(KillReason::ShadowStackOverflow));
    Ok(Verdict::Passed)
}

fn shadow_stack_high_water_mark(_: &Context) -> Outcome {
    if let Some(skipped) = no_scs() {
        return skipped;
    }
    let id = task::spawn("recurse-100", recurse_task, 100).map_err(|_| super::fail("spawn failed"))?;
    check!(task::join(id) == State::Exited);
    let high_water = task::shadow_high_water_of(id);
    // 100 entries of scs_recurse plus the task entry's few.
    check!((100..110).contains(&high_water));
    Ok(Verdict::Passed)
}

// --- random call chains ----------------------------------------------------------------------

/// What a chain does at its deepest point.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Leaf {
    /// Capture both traces and compare them.
    Compare,
    /// Capture the frame and SFrame traces and compare them.
    CompareSFrame,
    /// Spin a little (IRQs land anywhere in the chain).
    Spin,
    /// Wait for the timer IRQ at a known instruction.
    WaitForInterrupt,
}

struct Chain {
    seed: u64,
    leaf: Leaf,
    depth: usize,
    /// Set by a Compare leaf: Ok(where its frame record was and the LR saved in it).
    result: Option<Result<SavedReturn, &'static str>>,
    /// Each chain function's body SP, by the levels below it (the random-IRQ test's ground truth).
    body_sp: [u64; ground_truth::LEVELS],
}

impl Chain {
    fn random(&mut self) -> u64 {
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        self.seed
    }
}

#[inline(always)]
fn next(chain: &mut Chain, depth: usize) -> u64 {
    if depth == 0 {
        return leaf(chain);
    }
    match chain.random() % 3 {
        0 => chain_small(chain, depth - 1),
        1 => chain_medium(chain, depth - 1),
        _ => chain_large(chain, depth - 1),
    }
}

#[inline(never)]
fn chain_small(chain: &mut Chain, depth: usize) -> u64 {
    ground_truth::record_body_sp(&mut chain.body_sp, depth);
    black_box(next(chain, depth)).wrapping_add(1)
}

#[inline(never)]
fn chain_medium(chain: &mut Chain, depth: usize) -> u64 {
    let mut local = [depth as u64; 6];
    black_box(&mut local);
    ground_truth::record_body_sp(&mut chain.body_sp, depth);
    black_box(next(chain, depth)).wrapping_add(local[depth % 6])
}

#[inline(never)]
fn chain_large(chain: &mut Chain, depth: usize) -> u64 {
    let mut local = [depth as u64; 24];
    black_box(&mut local);
    ground_truth::record_body_sp(&mut chain.body_sp, depth);
    black_box(next(chain, depth)).wrapping_add(local[depth % 24])
}

fn is_chain_function(address: u64) -> bool {
    let starts = [chain_small as *const () as u64, chain_medium as *const () as u64, chain_large as *const () as u64];
    callsites::function_containing(address).is_some_and(|(start, _)| starts.contains(&start))
}

/// A chain function or the leaf: where IRQ captures are compared.
fn is_chain_code(address: u64) -> bool {
    let starts = [
        chain_small as *const () as u64,
        chain_medium as *const () as u64,
        chain_large as *const () as u64,
        leaf as *const () as u64,
    ];
    callsites::function_containing(address).is_some_and(|(start, _)| starts.contains(&start))
}

#[inline(never)]
fn leaf(chain: &mut Chain) -> u64 {
    match chain.leaf {
        Leaf::Compare => chain.result = Some(compare_at_leaf(chain.depth)),
        Leaf::CompareSFrame => chain.result = Some(compare_sframe_at_leaf(chain.depth)),
        Leaf::Spin => {
            for _ in 0..(chain.random() % 4) {
                core::hint::spin_loop();
            }
        }
        Leaf::WaitForInterrupt => wait_here(),
    }
    black_box(0)
}

/// Both traces from one function; entry 0 of each is a return address into it. The second
/// `capture` must not be a tail call: LLVM makes it one when nothing follows it (seen with one
/// codegen unit), and the shadow walk then starts after this function's frame is gone, one
/// entry behind the frame walk. Reading the pair after the calls keeps this function's frame.
#[inline(never)]
fn capture_both() -> (Trace, Trace) {
    let both = (
        stacktrace::capture(Mode::FramePointer, TraceOptions::ALL),
        stacktrace::capture(Mode::ShadowCallStack, TraceOptions::ALL),
    );
    black_box(&both);
    both
}

/// Where `compare_at_leaf`'s frame record was and the return address saved in it (as stored:
/// with its PAC under PAuth).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct SavedReturn {
    frame: u64,
    saved: u64,
}

#[inline(never)]
fn compare_at_leaf(depth: usize) -> Result<SavedReturn, &'static str> {
    let (fp, scs) = capture_both();
    if fp.addresses()[1..] != scs.addresses()[1..] {
        stacktrace::print("fp", &fp);
        stacktrace::print("scs", &scs);
        return Err("FP and SCS traces differ");
    }
    // Entry 0 returns into capture_both, 1 into this function, 2 into leaf, and the next
    // `depth` (as far as the trace reaches) into the chain functions.
    let in_function = |address: u64, function: u64| {
        callsites::function_containing(address - 4).is_some_and(|(start, _)| start == function)
    };
    if !in_function(fp.addresses()[2], leaf as *const () as u64) {
        return Err("entry 2 does not return into leaf");
    }
    let chain_entries = depth.min(fp.len() - 3);
    if !fp.addresses()[3..3 + chain_entries].iter().all(|&address| is_chain_function(address - 4)) {
        return Err("a stripped return address is not in a chain function");
    }
    // The saved LR of this function's frame record: signed iff the CPU has PAuth.
    let frame: u64;
    // SAFETY: reads x29 of this non-leaf function.
    unsafe { core::arch::asm!("mov {}, x29", out(reg) frame, options(nomem, nostack)) };
    // SAFETY: x29 + 8 is this function's saved LR.
    let saved = unsafe { core::ptr::read_volatile((frame + 8) as *const u64) };
    Ok(SavedReturn { frame, saved })
}

fn fp_and_scs_traces_agree_on_random_chains(_: &Context) -> Outcome {
    if let Some(skipped) = super::no_frame_pointers() {
        return skipped;
    }
    if let Some(skipped) = no_scs() {
        return skipped;
    }
    let mut chain =
        Chain { seed: 0x5eed_7ace, leaf: Leaf::Compare, depth: 0, result: None, body_sp: [0; ground_truth::LEVELS] };
    let mut saved = Vec::with_capacity(2000);
    for _ in 0..2000 {
        chain.depth = 1 + (chain.random() % 100) as usize;
        chain.result = None;
        let depth = chain.depth;
        black_box(next(&mut chain, depth));
        match chain.result {
            Some(Ok(frame)) => saved.push(frame),
            Some(Err(what)) => {
                defmt::error!("  chain depth {=usize}: {=str}", chain.depth, what);
                return Err(super::fail(what));
            }
            None => return Err(super::fail("the leaf did not run")),
        }
    }
    // Saved LRs carry PAC bits under PAuth and never without it. The PAC is a function of the
    // return address and SP, so the chains that leave compare_at_leaf's frame at the same
    // address sign the same way: count each distinct frame once (a PAC can be all zeros by
    // chance, about 1 in 2^15 per distinct frame, so allow one).
    saved.sort_unstable();
    saved.dedup();
    let unsigned = saved.iter().filter(|frame| cpu::strip_pac(frame.saved) == frame.saved).count();
    let has_pauth = cpu::PointerAuth::detect() != cpu::PointerAuth::None;
    defmt::info!("  {=usize} distinct frames, {=usize} with an unsigned return address", saved.len(), unsigned);
    // The chains are random: far fewer distinct frames would mean they no longer vary.
    check!(saved.len() >= 200);
    check!(if has_pauth { unsigned <= 1 } else { unsigned == saved.len() });
    Ok(Verdict::Passed)
}

/// The frame and SFrame traces from one function, as [`capture_both`].
#[inline(never)]
fn capture_fp_and_sframe() -> (Trace, Trace) {
    let both = (
        stacktrace::capture(Mode::FramePointer, TraceOptions::ALL),
        stacktrace::capture(Mode::SFrame, TraceOptions::ALL),
    );
    black_box(&both);
    both
}

/// At a chain's leaf: the SFrame walk gives the frame walk's entries (after entry 0, a return
/// into `capture_fp_and_sframe` from its two calls) and ends the same way, at the task's end.
#[inline(never)]
fn compare_sframe_at_leaf(depth: usize) -> Result<SavedReturn, &'static str> {
    let (fp, sframe) = capture_fp_and_sframe();
    if fp.addresses()[1..] != sframe.addresses()[1..] || fp.stop_reason() != sframe.stop_reason() {
        stacktrace::print("fp", &fp);
        stacktrace::print("sframe", &sframe);
        return Err("FP and SFrame traces differ");
    }
    // Entry 2 returns into leaf, the next `depth` (as far as the trace reaches) into the chain.
    let chain_entries = depth.min(sframe.len() - 3);
    if !sframe.addresses()[3..3 + chain_entries].iter().all(|&address| is_chain_function(address - 4)) {
        return Err("an SFrame entry is not in a chain function");
    }
    // No saved return to report: the frame test counts those.
    Ok(SavedReturn { frame: 0, saved: 0 })
}

fn sframe_and_fp_traces_agree_on_random_chains(_: &Context) -> Outcome {
    if let Some(skipped) = super::no_frame_pointers() {
        return skipped;
    }
    if crate::build_info::VARIANT == "plain" {
        return Ok(Verdict::Skipped("variant plain keeps no frame records"));
    }
    let mut chain = Chain {
        seed: 0x5f4a_3e00,
        leaf: Leaf::CompareSFrame,
        depth: 0,
        result: None,
        body_sp: [0; ground_truth::LEVELS],
    };
    for _ in 0..500 {
        chain.depth = 1 + (chain.random() % 100) as usize;
        chain.result = None;
        let depth = chain.depth;
        black_box(next(&mut chain, depth));
        match chain.result {
            Some(Ok(_)) => {}
            Some(Err(what)) => {
                defmt::error!("  chain depth {=usize}: {=str}", chain.depth, what);
                return Err(super::fail(what));
            }
            None => return Err(super::fail("the leaf did not run")),
        }
    }
    Ok(Verdict::Passed)
}

/// The loaded table passes the whole-table check; cut after its header (a test-only switch),
/// every SFrame walk is refused with `UnwindTable` and no entry, and works again once restored.
fn corrupted_sframe_table_is_refused(_: &Context) -> Outcome {
    use unwind::{Corruption, StopReason, TableError};
    let rows = stacktrace::sframe_table().and_then(|table| table.check());
    defmt::info!("  loaded SFrame table: {=usize} rows", rows.unwrap_or(0));
    check!(rows.is_ok_and(|rows| rows > 1000));
    {
        let _cut = crate::inject::Injected::new(crate::inject::Fault::SFrameTableTruncated);
        check!(stacktrace::sframe_table().err() == Some(TableError::Truncated));
        let trace = black_box(stacktrace::capture(Mode::SFrame, TraceOptions::ALL));
        let refused = matches!(trace.stop_reason(), StopReason::Corrupt { corruption: Corruption::UnwindTable, .. });
        if !refused {
            stacktrace::print("sframe", &trace);
        }
        check!(refused && trace.is_empty());
    }
    let trace = black_box(stacktrace::capture(Mode::SFrame, TraceOptions::ALL));
    check!(trace.len() > 2 && trace.stop_reason() == StopReason::EndOfTask);
    Ok(Verdict::Passed)
}

/// The SFrame walk of an interrupted context against the frame and shadow walks' part past the
/// exception boundary (from the interrupted PC on): equal to the one that holds the extra frame
/// of a prologue/epilogue window (or to both outside one), or one frame longer still where both
/// miss the caller (from the first instruction until the shadow-stack push, and after the pop):
/// the table describes every instruction. Compared as far as the shorter trace reaches.
fn sframe_agrees(capture: &stacktrace::IrqCapture, difference: ViewDifference) -> bool {
    fn after_boundary(trace: &Trace) -> &[u64] {
        let addresses = trace.addresses();
        let from = trace.entries().position(|entry| entry.kind == unwind::EntryKind::ExceptionPc);
        from.map_or(&addresses[..0], |from| &addresses[from..])
    }
    let reference = match difference {
        ViewDifference::ShadowHasExtraFrame => after_boundary(&capture.shadow),
        _ => after_boundary(&capture.frame_pointer),
    };
    let sframe = capture.sframe.addresses();
    if reference.is_empty() || sframe.is_empty() || sframe[0] != reference[0] {
        return false;
    }
    let same = sframe.iter().zip(reference).all(|(a, b)| a == b);
    let one_more = sframe.len() > 1 && sframe[2..].iter().zip(&reference[1..]).all(|(a, b)| a == b);
    same || one_more
}

/// Compares an IRQ-time capture: equal, or one frame apart where the helper says the interrupted
/// PC is in a prologue/epilogue window.
fn check_irq_capture(capture: &stacktrace::IrqCapture, require_agreement: bool) -> Result<bool, &'static str> {
    let Some((start, _)) = callsites::function_containing(capture.pc) else { return Ok(false) };
    if !is_chain_code(capture.pc) && !require_agreement {
        return Ok(false);
    }
    // SAFETY: [start, pc] is kernel text of one function, readable.
    let code = unsafe { core::slice::from_raw_parts(start as *const u32, ((capture.pc - start) / 4 + 1) as usize) };
    // Without frame pointers the SFrame walk is held against the shadow walk alone: equal, or
    // one frame longer where the return address is not pushed yet (or popped already).
    let difference = if crate::build_info::FRAME_POINTERS {
        unwind::view_difference(code, code.len() - 1)
    } else {
        ViewDifference::ShadowHasExtraFrame
    };
    let (fp, scs) = (capture.frame_pointer.addresses(), capture.shadow.addresses());
    let agree = match difference {
        _ if !crate::build_info::FRAME_POINTERS => true,
        ViewDifference::Agree => fp[1..] == scs[1..],
        ViewDifference::ShadowHasExtraFrame => one_extra(scs, fp),
        ViewDifference::FramesHaveExtraFrame => one_extra(fp, scs),
    };
    if !agree {
        return Err("IRQ-time traces differ beyond the prologue/epilogue window");
    }
    // From the handler, across the exception frame, the SFrame walk gives the walk from the
    // saved registers (up to where the 64-entry buffer cuts either).
    let crossed = {
        let from_handler = capture.sframe_from_handler.addresses();
        let from = capture.sframe_from_handler.entries().position(|entry| entry.kind == unwind::EntryKind::ExceptionPc);
        let (crossed, saved) =
            (from.map_or(&from_handler[..0], |from| &from_handler[from..]), capture.sframe.addresses());
        !crossed.is_empty() && crossed.iter().zip(saved).all(|(a, b)| a == b)
    };
    if !crossed {
        stacktrace::print("sframe from the handler", &capture.sframe_from_handler);
        stacktrace::print("sframe", &capture.sframe);
        return Err("the SFrame walk from the handler does not cross into the interrupted context");
    }
    if !sframe_agrees(capture, difference) {
        stacktrace::print("fp", &capture.frame_pointer);
        stacktrace::print("scs", &capture.shadow);
        stacktrace::print("sframe", &capture.sframe);
        return Err("the SFrame walk of the interrupted context differs from the frame and shadow walks");
    }
    if require_agreement && difference != ViewDifference::Agree {
        return Err("the known point is in a prologue/epilogue window");
    }
    Ok(true)
}

/// `longer` is `shorter` with one entry inserted (after entry 0, which differs by call site),
/// up to the shorter one's length (traces are capped at 64 entries).
fn one_extra(longer: &[u64], shorter: &[u64]) -> bool {
    let (longer, shorter) = (&longer[1..], &shorter[1..]);
    let Some(split) = (0..shorter.len()).find(|&index| longer.get(index) != Some(&shorter[index])) else {
        return longer.len() == shorter.len() + 1 || longer.len() == shorter.len();
    };
    longer.len() > split + 1 && longer[split + 1..].iter().zip(&shorter[split..]).all(|(a, b)| a == b)
}

/// The functions of the chain a run from `seed` with `depth` levels calls, by level, the leaf
/// last: one draw per level picks its function, as [`next`] draws it.
fn known_functions(seed: u64, depth: usize) -> [u64; ground_truth::LEVELS] {
    let mut functions = [0u64; ground_truth::LEVELS];
    let mut draws = Chain { seed, leaf: Leaf::Spin, depth, result: None, body_sp: [0; ground_truth::LEVELS] };
    let starts = [chain_small as *const () as u64, chain_medium as *const () as u64, chain_large as *const () as u64];
    for function in functions.iter_mut().take(depth) {
        *function = starts[(draws.random() % 3) as usize];
    }
    functions[depth] = leaf as *const () as u64;
    functions
}

/// A capture taken in the SGI handler of the CPU a cross-CPU call interrupted.
static CROSS_CAPTURE: crate::sync::IrqSpinLock<Option<stacktrace::IrqCapture>> = crate::sync::IrqSpinLock::new(None);
/// Set by the chain runner once it has checked enough landings: the firing CPU stops.
static CROSS_DONE: AtomicBool = AtomicBool::new(false);

/// Runs in the interrupted CPU's wake-up SGI handler (`cross_call::serve`).
fn capture_interrupted_here(_: u64) -> u64 {
    *CROSS_CAPTURE.lock() = Some(stacktrace::capture_interrupted());
    0
}

/// The firing half of [`traces_agree_at_cross_cpu_irqs`], on another CPU: cross-CPU calls to
/// `cpu` at random moments (0 to 100 microseconds apart) until the chain runner has enough.
/// Returns how many it sent.
pub(super) fn fire_cross_cpu_irqs(cpu: usize) -> u64 {
    let mut seed = 0x5eed_0000 ^ cpu as u64;
    let mut sent = 0;
    let deadline = timer::counter() + timer::frequency() * cpu::patience_ms(2000) / 1000;
    while !CROSS_DONE.load(Ordering::Acquire) && timer::counter() < deadline {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        let until = timer::counter() + (seed >> 33) % (timer::frequency() / 10_000);
        while timer::counter() < until {}
        if task::cross_call::run_on(cpu, capture_interrupted_here, 0).is_ok() {
            sent += 1;
        }
    }
    sent
}

/// IRQ-time traces at random points without icount: multi-threaded TCG takes a timer IRQ
/// mostly at counter reads, but an interrupt another vCPU raises at the start of the next
/// translated block, which is anywhere a branch leads (a callee's first instruction, the
/// middle of a prologue): the wake-up SGI of a cross-CPU call from [`fire_cross_cpu_irqs`]
/// interrupts this CPU's random chains. Each landing in a chain function is checked as the
/// tick's are. Resets the shared state first; `CROSS_DONE` tells the firing CPU to stop.
#[inline(never)]
pub(super) fn traces_agree_at_cross_cpu_irqs() -> Outcome {
    if let Some(skipped) = no_scs() {
        CROSS_DONE.store(true, Ordering::Release);
        return skipped;
    }
    let mut chain =
        Chain { seed: 0x0c0f_fee0, leaf: Leaf::Spin, depth: 0, result: None, body_sp: [0; ground_truth::LEVELS] };
    let (mut checked, mut landed) = (0u32, 0u32);
    let mut tally = ground_truth::Tally::default();
    let outer = traces_agree_at_cross_cpu_irqs as *const () as u64;
    let outer_sp = ground_truth::current_sp();
    let deadline = timer::counter() + timer::frequency() * cpu::patience_ms(2000) / 1000;
    let outcome = loop {
        if checked >= 200 {
            break Ok(Verdict::Passed);
        }
        if timer::counter() >= deadline {
            defmt::error!("  {=u32} of 200 landings in chain functions ({=u32} IRQs)", checked, landed);
            break Err(super::fail("200 cross-CPU IRQs landed in chain functions in time"));
        }
        chain.depth = 1 + (chain.random() % 100) as usize;
        let depth = chain.depth;
        let functions = known_functions(chain.seed, depth);
        black_box(next(&mut chain, depth));
        let Some(capture) = CROSS_CAPTURE.lock().take() else { continue };
        landed += 1;
        match check_irq_capture(&capture, false) {
            Ok(true) => {
                checked += 1;
                // The run recorded its levels' SPs, the same in every run of this seed and depth,
                // so those of the interrupted levels are in `body_sp` once it has returned.
                let known = ground_truth::KnownChain {
                    functions: &functions[..=depth],
                    body_sp: &chain.body_sp,
                    outer,
                    outer_sp,
                };
                if tally.judge(&capture, &known) == Some(2) {
                    stacktrace::print("sframe", &capture.sframe);
                    defmt::error!("  interrupted PC {=u64:#x}", capture.pc);
                    break Err(super::fail("the SFrame walk differs from the known chain"));
                }
            }
            Ok(false) => {}
            Err(what) => {
                defmt::error!("  interrupted PC {=u64:#x}", capture.pc);
                break Err(super::fail(what));
            }
        }
    };
    CROSS_DONE.store(true, Ordering::Release);
    if outcome.is_ok() {
        defmt::info!("  {=u32} cross-CPU IRQs landed in a chain function ({=u32} taken)", checked, landed);
        tally.print();
    }
    outcome
}

/// Clears the cross-CPU landing state before a round.
pub(super) fn reset_cross_cpu_irqs() {
    CROSS_DONE.store(false, Ordering::Release);
    *CROSS_CAPTURE.lock() = None;
}

pub(super) fn traces_agree_in_irqs_at_random_points(context: &Context) -> Outcome {
    if let Some(skipped) = no_scs() {
        return skipped;
    }
    if !context.icount {
        return Ok(Verdict::Skipped("needs -icount: without it TCG takes timer IRQs at counter reads, not anywhere"));
    }
    let mut chain =
        Chain { seed: 0x1a2b_3c4d, leaf: Leaf::Spin, depth: 0, result: None, body_sp: [0; ground_truth::LEVELS] };
    let (mut checked, mut attempts) = (0, 0);
    let mut tally = ground_truth::Tally::default();
    let outer = traces_agree_in_irqs_at_random_points as *const () as u64;
    let outer_sp = ground_truth::current_sp();
    // The cap only bounds the run (the test needs 200 landings). Under `full ftrace=*` 200 took
    // 1979 tries while the tracers made out-of-line traced calls (ftrace/tracers.rs), and with
    // every function traced most IRQs land in the tracer, so the cap leaves room for that.
    while checked < 200 && attempts < 6000 {
        attempts += 1;
        chain.depth = 1 + (chain.random() % 100) as usize;
        // Replay the same chain (same seed) until the tick, due at a random point of the next
        // 100 microseconds, lands. Under `-icount` (how xtask runs the tests) QEMU delivers it at
        // exactly that instruction; without icount TCG notices timers mostly at counter reads.
        let (seed, depth) = (chain.seed, chain.depth);
        let delay = chain.random() % (timer::frequency() / 10_000);
        // The known chain; one run records the levels' SPs before the tick is armed.
        let functions = known_functions(seed, depth);
        chain.seed = seed;
        black_box(next(&mut chain, depth));
        // Every replay of the chain records the same SPs.
        let body_sp = chain.body_sp;
        let deadline = timer::counter() + timer::frequency() / 10;
        {
            let _mask = IrqMask::new();
            stacktrace::arm_irq_capture();
            timer::fire_in(delay);
        }
        let capture = loop {
            chain.seed = seed;
            black_box(next(&mut chain, depth));
            if let Some(capture) = stacktrace::take_irq_capture() {
                break capture;
            }
            check!(timer::counter() < deadline);
        };
        match check_irq_capture(&capture, false) {
            Ok(true) => {
                checked += 1;
                let known =
                    ground_truth::KnownChain { functions: &functions[..=depth], body_sp: &body_sp, outer, outer_sp };
                // Every instruction of the chain has a row: the SFrame walk is never wrong there.
                if tally.judge(&capture, &known) == Some(2) {
                    stacktrace::print("sframe", &capture.sframe);
                    defmt::error!("  interrupted PC {=u64:#x}", capture.pc);
                    return Err(super::fail("the SFrame walk differs from the known chain"));
                }
            }
            Ok(false) => {}
            Err(what) => {
                defmt::error!("  interrupted PC {=u64:#x}", capture.pc);
                return Err(super::fail(what));
            }
        }
    }
    defmt::info!("  {=u32} IRQs landed in a chain function ({=u32} tries)", checked, attempts);
    tally.print();
    check!(checked >= 200);
    Ok(Verdict::Passed)
}

/// Waits for the timer IRQ at a known instruction: the `wfi` below, after the frame is set up.
#[inline(never)]
fn wait_here() {
    let mask = IrqMask::new();
    // An opaque call, so this function is never a leaf: under `-Cforce-frame-pointers=non-leaf`
    // a leaf has no frame record, and once `arm_irq_capture` was inlined here (its calls then
    // only the sanitizer's check thunks, which do not count as calls) the frame-pointer trace
    // missed this frame that the shadow stack holds, at a point where the two must agree.
    core::hint::black_box(stacktrace::arm_irq_capture as fn())();
    timer::fire_in(timer::frequency() / 10_000);
    // IRQs stay masked while waiting: the wfi completes when the IRQ is pending, then the IRQ
    // is taken right after, at a known PC (the instruction after the wfi).
    cpu::wait_for_interrupt();
    drop(mask);
}

fn traces_agree_in_an_irq_at_a_known_point(_: &Context) -> Outcome {
    if let Some(skipped) = super::no_frame_pointers() {
        return skipped;
    }
    if let Some(skipped) = no_scs() {
        return skipped;
    }
    let mut chain =
        Chain { seed: 42, leaf: Leaf::WaitForInterrupt, depth: 30, result: None, body_sp: [0; ground_truth::LEVELS] };
    black_box(next(&mut chain, 30));
    let deadline = timer::counter() + timer::frequency() / 10;
    let capture = loop {
        if let Some(capture) = stacktrace::take_irq_capture() {
            break capture;
        }
        check!(timer::counter() < deadline);
    };
    check!(callsites::function_containing(capture.pc).map(|(start, _)| start) == Some(wait_here as *const () as u64));
    check!(check_irq_capture(&capture, true) == Ok(true));
    // The interrupted part of the trace reaches through the whole chain.
    check!(capture.frame_pointer.addresses().iter().filter(|&&address| is_chain_function(address - 4)).count() >= 25);
    Ok(Verdict::Passed)
}

// --- corrupted records -------------------------------------------------------------------------

#[inline(never)]
fn walk_with_corrupted_record(bad_fp: u64) -> unwind::StopReason {
    let frame: u64;
    // SAFETY: reads x29 of this non-leaf function.
    unsafe { core::arch::asm!("mov {}, x29", out(reg) frame, options(nomem, nostack)) };
    // SAFETY: [x29] is this function's saved caller frame pointer; restored below before
    // returning.
    let saved = unsafe { core::ptr::read_volatile(frame as *const u64) };
    // SAFETY: as above.
    unsafe { core::ptr::write_volatile(frame as *mut u64, bad_fp) };
    let trace = black_box(stacktrace::capture(Mode::FramePointer, TraceOptions::ALL));
    // SAFETY: as above.
    unsafe { core::ptr::write_volatile(frame as *mut u64, saved) };
    trace.stop_reason()
}

fn corrupted_frame_record_stops_the_walk(_: &Context) -> Outcome {
    if let Some(skipped) = super::no_frame_pointers() {
        return skipped;
    }
    use unwind::{Corruption, StopReason};
    // `plain` is built without forced frame pointers: x29 need not hold this function's record,
    // so which word the test corrupts depends on register allocation (it passed by luck before
    // code elsewhere changed).
    if crate::build_info::VARIANT == "plain" {
        return Ok(Verdict::Skipped("variant plain keeps no frame records"));
    }
    let corruption = |reason| match reason {
        StopReason::Corrupt { corruption, .. } => Some(corruption),
        _ => None,
    };
    check!(corruption(walk_with_corrupted_record(0x1234_5671)) == Some(Corruption::Misaligned));
    check!(corruption(walk_with_corrupted_record(0xffff_ff80_0000_1000)) == Some(Corruption::OutsideStacks));
    let sp: u64;
    // SAFETY: reads SP.
    unsafe { core::arch::asm!("mov {}, sp", out(reg) sp, options(nomem, nostack)) };
    // A record below the current one: walks must only go up the stack.
    check!(corruption(walk_with_corrupted_record(sp - 64)).is_some());
    check!(walk_with_corrupted_record(0) == StopReason::NullFramePointer);
    Ok(Verdict::Passed)
}

/// Saves the caller's caller's stack with the given mode (skipping the return into the caller,
/// so that two calls from different lines of one function save the same stack).
#[inline(never)]
fn save_here(mode: Mode) -> Result<stackdepot::DepotHandle, stackdepot::DepotError> {
    stacktrace::set_mode(mode);
    stacktrace::save_stack(1)
}

fn save_stack_switches_mode_at_run_time(_: &Context) -> Outcome {
    if let Some(skipped) = no_scs() {
        return skipped;
    }
    let before = stacktrace::mode();
    // Without frame pointers the frame walk is refused: the SFrame walk stands in for it.
    let fp = save_here(Mode::DEFAULT);
    let scs = save_here(Mode::ShadowCallStack);
    let sframe = save_here(Mode::SFrame);
    stacktrace::set_mode(before);
    let (Ok(fp), Ok(scs), Ok(sframe)) = (fp, scs, sframe) else { return Err(super::fail("save_stack failed")) };
    check!(fp == sframe);
    // Both walkers see the same return addresses from the same call site: one depot record.
    if fp != scs {
        let mut frames = [0u64; unwind::MAX_FRAMES];
        for (label, handle) in [("fp", fp), ("scs", scs)] {
            for (index, address) in stacktrace::DEPOT.fetch(handle, &mut frames).unwrap_or(&[]).iter().enumerate() {
                defmt::error!("  {=str} #{=usize} {=u64:#x}", label, index, address);
            }
        }
    }
    check!(fp == scs);
    let mut frames = [0u64; unwind::MAX_FRAMES];
    let Some(saved) = stacktrace::DEPOT.fetch(fp, &mut frames) else { return Err(super::fail("fetch failed")) };
    // Entry 0 returns into this test's caller: the test runner, or the task the runner pinned to
    // another CPU (on several CPUs the runner spreads the tests).
    let callers = [super::run as *const () as u64, super::spread_task as *const () as u64];
    let caller = callsites::function_containing(saved[0] - 4).map(|(start, _)| start);
    check!(caller.is_some_and(|caller| callers.contains(&caller)));
    Ok(Verdict::Passed)
}

// --- one walker path: buffers, the depot, sampling --------------------------------------------

/// The same walk into a 3-entry buffer: the first three entries, then the depth limit.
#[inline(never)]
fn collect_both_lengths(mode: Mode) -> Result<(), &'static str> {
    let mut long = [core::mem::MaybeUninit::uninit(); unwind::MAX_FRAMES];
    let mut short = [core::mem::MaybeUninit::uninit(); 3];
    let full = stacktrace::collect(mode, TraceOptions::ALL, &mut long);
    let cut = stacktrace::collect(mode, TraceOptions::ALL, &mut short);
    if full.len <= 3 || cut.len != 3 || cut.stop != unwind::StopReason::DepthLimit {
        return Err("a 3-entry buffer did not stop the walk at 3 with the depth limit");
    }
    // Entry 0 returns into this function from two different calls: compare the callers.
    if full.entries(&long)[1..3] != cut.entries(&short)[1..3] {
        return Err("the short walk's entries differ from the long walk's");
    }
    Ok(())
}

fn short_buffer_stops_at_its_length(_: &Context) -> Outcome {
    if crate::build_info::VARIANT == "plain" {
        return Ok(Verdict::Skipped("variant plain keeps no frame records"));
    }
    if crate::build_info::FRAME_POINTERS {
        collect_both_lengths(Mode::FramePointer).map_err(super::fail)?;
    } else {
        check!(
            stacktrace::capture(Mode::FramePointer, TraceOptions::ALL).stop_reason()
                == unwind::StopReason::NoFramePointers
        );
    }
    if crate::build_info::SHADOW_CALL_STACK {
        collect_both_lengths(Mode::ShadowCallStack).map_err(super::fail)?;
    }
    collect_both_lengths(Mode::SFrame).map_err(super::fail)?;
    Ok(Verdict::Passed)
}

fn depot_hash_instruction_matches_the_portable_crc(_: &Context) -> Outcome {
    // The kernel hashes with `crc32cx`, the host tests with the bit-by-bit CRC: they must agree.
    let mut state = 0x1234_5678_9abc_def1_u64;
    let mut frames = [0u64; 64];
    for length in 1..=64 {
        for frame in frames.iter_mut().take(length) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            *frame = state;
        }
        check_eq!(stackdepot::hash_frames(&frames[..length]), stackdepot::hash_frames_portable(&frames[..length]));
    }
    Ok(Verdict::Passed)
}

fn full_depot_keeps_handle_zero_and_says_why(_: &Context) -> Outcome {
    static SMALL: stackdepot::StackDepot<16, 1> = stackdepot::StackDepot::new();
    static POOL: crate::sync::StaticBlocks<1, 512> = crate::sync::StaticBlocks::new();
    // The test runs once per boot: a second run would find the pool claimed.
    let Some(pool) = POOL.claim() else {
        return Err(super::fail("the small depot's pool was claimed before"));
    };
    if SMALL.add_pool(pool).is_err() {
        return Err(super::fail("the small depot refused its pool"));
    }
    let mut word = 0;
    for id in 0..64u64 {
        let frames = [0xffff_ff80_4008_0000 + id * 0x40, 0xffff_ff80_4008_1000];
        word = stacktrace::stack_word(SMALL.save(&frames));
        if stackdepot::DepotHandle::from_raw(word).is_none() {
            break;
        }
    }
    // The depot filled up: the heap's word holds handle 0 and the reason.
    check_eq!(word, stacktrace::STACK_DEPOT_FULL);
    check_eq!(word & ((1 << 27) - 1), 0);
    check!(stackdepot::DepotHandle::from_raw(word).is_none());
    check!(stacktrace::unsaved_reason(word) == Some("(stack not saved: depot full)"));
    check!(stacktrace::unsaved_reason(0).is_none());
    Ok(Verdict::Passed)
}

fn sampled_allocation_stacks(_: &Context) -> Outcome {
    use crate::mm::kasan::heap::{self, Stacks};
    let every = stacktrace::stack_sample();
    // The draw: about 1 in 8, and not a counter (a counter would pick one residue mod 8 only).
    stacktrace::set_stack_sample(8);
    let mut sampled = [0u32; 8];
    for index in 0..800usize {
        if stacktrace::sample_allocation() {
            sampled[index % 8] += 1;
        }
    }
    let total: u32 = sampled.iter().sum();
    defmt::info!("  {=u32} of 800 draws sampled, by index mod 8: {=[?]}", total, sampled[..]);
    // 100 expected; 4 standard deviations either side.
    let draws_ok = (60..=140).contains(&total) && sampled.iter().filter(|&&count| count > 0).count() >= 6;
    // The heap: an allocation left out is marked, its free is saved all the same. (One object:
    // the stack ring is shared with the sanitizer's tests.)
    let (mode, mut marked, mut free_saved) = (heap::stacks(), false, false);
    if crate::build_info::SHADOW_CALL_STACK {
        heap::set_stacks(Stacks::DEFAULT);
        // 1 in 2^32: this allocation is not sampled.
        stacktrace::set_stack_sample(u32::MAX);
        if let Some(object) = heap::allocate(48, 16) {
            marked = heap::newest_entry(object, false).map(|entry| entry.stack) == Some(stacktrace::STACK_NOT_SAMPLED);
            heap::free(object);
            let freed = heap::newest_entry(object, true).map_or(0, |entry| entry.stack);
            free_saved = stackdepot::DepotHandle::from_raw(freed).is_some();
        }
        heap::set_stacks(mode);
    } else {
        (marked, free_saved) = (true, true);
    }
    stacktrace::set_stack_sample(every);
    check!(draws_ok);
    check!(marked);
    check!(free_saved);
    check!(stacktrace::unsaved_reason(stacktrace::STACK_NOT_SAMPLED) == Some("(stack not sampled)"));
    Ok(Verdict::Passed)
}
