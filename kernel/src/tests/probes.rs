//! Probe tests: probed vs. unprobed execution on random states, handlers, restoration, errors.
//!
//! The differential harness runs one instruction S in EL1t (SP = SP_EL0 = a scratch stack):
//! `BRK #HARNESS_ENTER` saves the caller's frame and rewrites it with a random register file,
//! returning into S; S sits in a scratch text page otherwise filled with `BRK #HARNESS_CAPTURE`
//! landing pads, so S's fall-through and every nearby branch target trap back, and the capture
//! handler records the registers, then resumes the caller as if its BRK had returned.

use core::sync::atomic::{AtomicU64, Ordering};

use super::{Context, Failure, Outcome, Test, Verdict, check, check_eq};
use crate::arch::exception::{BRK_HARNESS_CAPTURE, BRK_HARNESS_ENTER, ExceptionFrame};
use crate::arch::patch;
use crate::probes::{self as kprobes, Method, ProbeError, Registers, Text};
use crate::stacktrace::{self, Mode};
use crate::sync::IrqSpinLock;
use unwind::{Trace, TraceOptions};

pub const TESTS: &[Test] = &[
    Test { name: "probes_match_unprobed_execution", run: probes_match_unprobed_execution },
    Test { name: "probe_handlers_see_registers", run: probe_handlers_see_registers },
    Test { name: "probe_slot_walks_by_the_probed_rows", run: probe_slot_walks_by_the_probed_rows },
    Test { name: "probe_detour_refuses_pc_change", run: probe_detour_refuses_pc_change },
    Test { name: "probe_detour_refuses_sp_change", run: probe_detour_refuses_sp_change },
    Test { name: "probe_refusals_say_why", run: probe_refusals_say_why },
    Test { name: "probe_unregister_all_frees_every_probe", run: probe_unregister_all_frees_every_probe },
    Test { name: "probe_table_keeps_no_tombstones", run: probe_table_keeps_no_tombstones },
    Test { name: "probe_hit_from_handler_is_missed", run: probe_hit_from_handler_is_missed },
    Test { name: "probe_reentry_every_method_pair", run: probe_reentry_every_method_pair },
];

const SCRATCH_WORDS: usize = 1024;
/// S: the middle of the scratch page, so branches of up to +-511 words land on a pad.
const S_INDEX: u64 = 512;

core::arch::global_asm!(
    r#"
    .section .text.probe_scratch, "ax"
    .balign 4096
    .global probe_scratch_page
probe_scratch_page:
    .fill {words}, 4, {capture}

    .section .text.probe_targets, "ax"
    .balign 8
    .global probe_target_add
probe_target_add:
    .cfi_startproc
    add     x0, x0, x1
    ret
    .cfi_endproc
    .global probe_target_mov
probe_target_mov:
    mov     x0, x1
    ret
    .global probe_target_increment
probe_target_increment:
    add     x0, x0, #1
    ret
    .global probe_target_exclusive
probe_target_exclusive:
    ldxr    x0, [x1]
    add     x0, x0, #1
    stxr    w2, x0, [x1]
    ret
"#,
    words = const SCRATCH_WORDS,
    capture = const probes::encode_brk(BRK_HARNESS_CAPTURE).0,
);

unsafe extern "C" {
    static probe_scratch_page: u32;
    fn probe_target_add(a: u64, b: u64) -> u64;
    fn probe_target_mov(a: u64, b: u64) -> u64;
    fn probe_target_increment(a: u64) -> u64;
    static probe_target_exclusive: u32;
}

fn scratch_instruction() -> u64 {
    // SAFETY: only the address of the asm-defined page is taken.
    (unsafe { &probe_scratch_page as *const u32 as u64 }) + 4 * S_INDEX
}

/// The data the instruction under test may touch: a buffer for memory operands, a stack for
/// SP_EL0 and a shadow call stack for x18.
#[repr(C, align(16))]
struct Scratch {
    data: [u64; 256],
    stack: [u64; 1024],
    shadow: [u64; 128],
}

struct Harness {
    active: bool,
    saved: [u64; 34],
    input: Registers,
    output: Registers,
    scratch: Scratch,
}

/// Locked by the test between runs and by the BRK handlers during one; the test never holds the
/// guard across the `BRK #HARNESS_ENTER` it executes (see `run`), so the handlers, taken
/// synchronously on the same CPU, always find it free. The instruction under test reaches the
/// scratch memory by address while nobody holds the guard, as a device would.
static HARNESS: IrqSpinLock<Harness> = IrqSpinLock::new(Harness {
    active: false,
    saved: [0; 34],
    input: Registers { x: [0; 31], sp: 0, pc: 0, pstate: 0 },
    output: Registers { x: [0; 31], sp: 0, pc: 0, pstate: 0 },
    scratch: Scratch { data: [0; 256], stack: [0; 1024], shadow: [0; 128] },
});

fn frame_words(frame: &mut ExceptionFrame) -> &mut [u64; 34] {
    // SAFETY: ExceptionFrame is repr(C) and starts with x[31], sp, elr, spsr (34 u64s).
    unsafe { &mut *(frame as *mut ExceptionFrame).cast::<[u64; 34]>() }
}

fn registers_words(registers: &Registers) -> [u64; 34] {
    let mut words = [0; 34];
    words[..31].copy_from_slice(&registers.x);
    words[31] = registers.sp;
    words[32] = registers.pc;
    words[33] = registers.pstate;
    words
}

/// `BRK #HARNESS_ENTER` / `#HARNESS_CAPTURE` (from the tests' trap hook, tests/mod.rs).
#[unsafe(link_section = ".text.noprobe")]
pub fn on_brk(frame: &mut ExceptionFrame) -> bool {
    let immediate = crate::arch::exception::Esr(frame.esr).immediate();
    if immediate != BRK_HARNESS_ENTER && immediate != BRK_HARNESS_CAPTURE {
        return false;
    }
    let mut harness = HARNESS.lock();
    if immediate == BRK_HARNESS_ENTER && !harness.active {
        harness.saved = *frame_words(frame);
        *frame_words(frame) = registers_words(&harness.input);
        harness.active = true;
        true
    } else if immediate == BRK_HARNESS_CAPTURE && harness.active {
        let words = *frame_words(frame);
        harness.output.x.copy_from_slice(&words[..31]);
        harness.output.sp = words[31];
        harness.output.pc = words[32];
        harness.output.pstate = words[33];
        *frame_words(frame) = harness.saved;
        frame.elr += 4;
        harness.active = false;
        true
    } else {
        false
    }
}

/// Runs S on `input` (with the scratch memory already filled) and returns the captured state.
fn run(input: &Registers) -> Registers {
    // The guard is dropped before the BRK: its handlers take the lock themselves.
    HARNESS.lock().input = *input;
    // SAFETY: the ENTER/CAPTURE pair restores every register of this context (the whole saved
    // frame) and resumes after the BRK; the EL1t run touches only the scratch memory.
    unsafe { core::arch::asm!("brk #{}", const BRK_HARNESS_ENTER, options(nostack)) };
    HARNESS.lock().output
}

/// xorshift64*.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// A random offset in [-n, n] without 0.
    fn nonzero(&mut self, n: i64) -> i64 {
        let magnitude = 1 + self.below(n as u64) as i64;
        if self.next() & 1 == 0 { magnitude } else { -magnitude }
    }
    /// A register number in 0..=30 other than x18 (the shadow call stack the handlers use)
    /// and the ones in `avoid`.
    fn register(&mut self, avoid: &[u32]) -> u32 {
        loop {
            let register = self.below(31) as u32;
            if register != 18 && !avoid.contains(&register) {
                return register;
            }
        }
    }
}

const EL1T_MASKED: u64 = 0x3c4; // M = EL1t, D, A, I, F

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Class {
    Nop,
    Pair { load: bool, indexing: u32, sp_base: bool },
    PushFrame,
    Move,
    AddSubImmediate,
    Adr,
    LoadLiteral,
    Branch,
    BranchConditional,
    CompareBranch,
    TestBranch,
    BranchRegister,
    BranchLinkRegister,
    Return,
    AddRegister,
    EorRegister,
    MultiplyAdd,
    ConditionalSelect,
    LoadRegisterOffset,
    StoreRegisterOffset,
    ReadNzcv,
    PacSign,
    ShadowPush,
}

const CLASSES: &[(&str, Class)] = &[
    ("nop", Class::Nop),
    ("stp post", Class::Pair { load: false, indexing: 1, sp_base: false }),
    ("stp offset", Class::Pair { load: false, indexing: 2, sp_base: false }),
    ("stp pre", Class::Pair { load: false, indexing: 3, sp_base: false }),
    ("ldp post", Class::Pair { load: true, indexing: 1, sp_base: false }),
    ("ldp offset", Class::Pair { load: true, indexing: 2, sp_base: false }),
    ("ldp pre", Class::Pair { load: true, indexing: 3, sp_base: false }),
    ("stp sp post", Class::Pair { load: false, indexing: 1, sp_base: true }),
    ("stp sp offset", Class::Pair { load: false, indexing: 2, sp_base: true }),
    ("stp sp pre", Class::Pair { load: false, indexing: 3, sp_base: true }),
    ("ldp sp post", Class::Pair { load: true, indexing: 1, sp_base: true }),
    ("ldp sp offset", Class::Pair { load: true, indexing: 2, sp_base: true }),
    ("ldp sp pre", Class::Pair { load: true, indexing: 3, sp_base: true }),
    ("stp x29, x30, [sp, #-16]!", Class::PushFrame),
    ("mov", Class::Move),
    ("add/sub/adds/subs imm", Class::AddSubImmediate),
    ("adr/adrp", Class::Adr),
    ("ldr/ldrsw literal", Class::LoadLiteral),
    ("b/bl", Class::Branch),
    ("b.cond", Class::BranchConditional),
    ("cbz/cbnz", Class::CompareBranch),
    ("tbz/tbnz", Class::TestBranch),
    ("br", Class::BranchRegister),
    ("blr", Class::BranchLinkRegister),
    ("ret", Class::Return),
    ("add reg", Class::AddRegister),
    ("eor reg", Class::EorRegister),
    ("madd", Class::MultiplyAdd),
    ("csel", Class::ConditionalSelect),
    ("ldr reg offset", Class::LoadRegisterOffset),
    ("str reg offset", Class::StoreRegisterOffset),
    ("mrs nzcv", Class::ReadNzcv),
    ("paciasp", Class::PacSign),
    ("str x30, [x18], #8", Class::ShadowPush),
];

fn field(value: i64, bits: u32) -> u32 {
    (value as u32) & ((1 << bits) - 1)
}

/// A random instruction of `class`.
fn encode(class: Class, rng: &mut Rng) -> u32 {
    let rd = rng.register(&[]);
    match class {
        Class::Nop => 0xd503_201f,
        Class::Pair { load, indexing, sp_base } => {
            let rn = if sp_base { 31 } else { rng.register(&[]) };
            let rt = rng.register(&[rn]);
            let rt2 = rng.register(&[rn, rt]);
            // SP-based: within the reach `simulate` accepts (STACK_GAP - 16 below SP); loads
            // not from below SP, which is dead space (no red zone) that a detour trampoline uses.
            let imm7 = match (sp_base, load) {
                (true, false) => rng.below(61) as i64 - 30,
                (true, true) => rng.below(31) as i64,
                (false, _) => rng.below(128) as i64 - 64,
            };
            0xa800_0000
                | (indexing << 23)
                | (u32::from(load) << 22)
                | (field(imm7, 7) << 15)
                | (rt2 << 10)
                | (rn << 5)
                | rt
        }
        Class::PushFrame => 0xa9bf_7bfd,
        Class::Move => 0xaa00_03e0 | (rng.register(&[]) << 16) | rd,
        Class::AddSubImmediate => {
            let (subtract, set_flags) = (rng.below(2) as u32, rng.below(2) as u32);
            let rn = if rng.below(3) == 0 { 31 } else { rng.register(&[]) };
            // SP as destination only from SP with a small immediate (no large SP moves).
            let to_sp = set_flags == 0 && rn == 31 && rng.below(2) == 0;
            let (rd, shift, immediate) = if to_sp {
                (31, 0, rng.below(15) as u32 * 16)
            } else {
                (rd, rng.below(2) as u32, rng.below(4096) as u32)
            };
            0x9100_0000 | (subtract << 30) | (set_flags << 29) | (shift << 22) | (immediate << 10) | (rn << 5) | rd
        }
        Class::Adr => {
            let immediate = rng.next() as i64;
            0x1000_0000
                | ((rng.below(2) as u32) << 31)
                | (field(immediate, 2) << 29)
                | (field(immediate >> 2, 19) << 5)
                | rd
        }
        Class::LoadLiteral => {
            let opcode = [0x1800_0000, 0x5800_0000, 0x9800_0000][rng.below(3) as usize];
            // Not at S or S - 4: those read the probed word itself.
            let offset = loop {
                let offset = rng.nonzero(256);
                if offset != -1 {
                    break offset;
                }
            };
            opcode | (field(offset, 19) << 5) | rd
        }
        Class::Branch => [0x1400_0000, 0x9400_0000][rng.below(2) as usize] | field(rng.nonzero(256), 26),
        Class::BranchConditional => 0x5400_0000 | (field(rng.nonzero(256), 19) << 5) | rng.below(16) as u32,
        Class::CompareBranch => {
            0x3400_0000
                | ((rng.below(2) as u32) << 31)
                | ((rng.below(2) as u32) << 24)
                | (field(rng.nonzero(256), 19) << 5)
                | tested_register(rng)
        }
        Class::TestBranch => {
            let bit = rng.below(64) as u32;
            0x3600_0000
                | ((bit >> 5) << 31)
                | ((rng.below(2) as u32) << 24)
                | ((bit & 31) << 19)
                | (field(rng.nonzero(256), 14) << 5)
                | tested_register(rng)
        }
        Class::BranchRegister => 0xd61f_0000 | (rng.register(&[]) << 5),
        Class::BranchLinkRegister => 0xd63f_0000 | (rng.register(&[30]) << 5),
        Class::Return => 0xd65f_0000 | (if rng.below(2) == 0 { 30 } else { rng.register(&[]) } << 5),
        Class::AddRegister => 0x8b00_0000 | (rng.register(&[]) << 16) | (rng.register(&[]) << 5) | rd,
        Class::EorRegister => 0xca00_0000 | (rng.register(&[]) << 16) | (rng.register(&[]) << 5) | rd,
        Class::MultiplyAdd => {
            0x9b00_0000 | (rng.register(&[]) << 16) | (rng.register(&[]) << 10) | (rng.register(&[]) << 5) | rd
        }
        Class::ConditionalSelect => {
            0x9a80_0000 | (rng.register(&[]) << 16) | ((rng.below(16) as u32) << 12) | (rng.register(&[]) << 5) | rd
        }
        Class::LoadRegisterOffset | Class::StoreRegisterOffset => {
            let rn = rng.register(&[]);
            let rm = rng.register(&[rn]);
            let rt = rng.register(&[rn, rm]);
            let opcode = if class == Class::LoadRegisterOffset { 0xf860_7800 } else { 0xf820_7800 };
            opcode | (rm << 16) | (rn << 5) | rt
        }
        Class::ReadNzcv => 0xd53b_4200 | rd,
        Class::PacSign => 0xd503_233f,
        Class::ShadowPush => 0xf800_865e,
    }
}

/// The register a CBZ/TBZ tests: the zero register sometimes, never x18 (`prepare` sets the
/// tested register to 0 or all ones, and x18 must stay the shadow call stack pointer).
fn tested_register(rng: &mut Rng) -> u32 {
    if rng.below(8) == 0 { 31 } else { rng.register(&[]) }
}

const DATA_MIDDLE: u64 = 128 * 8;

/// Adjusts a random register file so that `word`'s operands are in bounds: memory bases in the
/// data buffer, indirect branch targets on a landing pad, zero/bit tests both ways.
fn prepare(class: Class, word: u32, rng: &mut Rng, registers: &mut Registers, data: u64) {
    let rn = ((word >> 5) & 31) as usize;
    let rt = (word & 31) as usize;
    let rm = ((word >> 16) & 31) as usize;
    let pad = |rng: &mut Rng| scratch_instruction().wrapping_add_signed(4 * rng.nonzero(500));
    match class {
        Class::Pair { sp_base: false, .. } => {
            registers.x[rn] = data + DATA_MIDDLE + (rng.below(65) * 8) - 256;
        }
        Class::LoadRegisterOffset | Class::StoreRegisterOffset => {
            registers.x[rn] = data + DATA_MIDDLE + (rng.below(65) * 8) - 256;
            registers.x[rm] = (rng.below(65) as i64 - 32) as u64;
        }
        Class::CompareBranch | Class::TestBranch if rt < 31 => {
            if rng.below(2) == 0 {
                registers.x[rt] = 0;
            } else if rng.below(2) == 0 {
                registers.x[rt] = u64::MAX;
            }
        }
        Class::BranchRegister | Class::BranchLinkRegister | Class::Return => registers.x[rn] = pad(rng),
        _ => {}
    }
}

/// The methods that apply to `class`, and the error the others must give.
fn expected_error(class: Class, method: Method) -> Option<ProbeError> {
    let steppable = matches!(
        class,
        Class::AddRegister
            | Class::EorRegister
            | Class::MultiplyAdd
            | Class::ConditionalSelect
            | Class::LoadRegisterOffset
            | Class::StoreRegisterOffset
            | Class::ReadNzcv
            | Class::PacSign
            | Class::ShadowPush
    );
    let needs_pc = matches!(
        class,
        Class::Adr
            | Class::LoadLiteral
            | Class::Branch
            | Class::BranchConditional
            | Class::CompareBranch
            | Class::TestBranch
            | Class::BranchRegister
            | Class::BranchLinkRegister
            | Class::Return
    );
    match method {
        Method::Simulate if steppable => Some(ProbeError::NotSimulated),
        Method::SingleStep | Method::BrkStep if needs_pc => Some(ProbeError::NeedsOriginalPc(Text::Kernel)),
        _ => None,
    }
}

static PRE_HITS: AtomicU64 = AtomicU64::new(0);
static POST_HITS: AtomicU64 = AtomicU64::new(0);
static WRONG_PC: AtomicU64 = AtomicU64::new(0);

fn count_pre(registers: &mut Registers) {
    PRE_HITS.fetch_add(1, Ordering::Relaxed);
    if registers.pc != scratch_instruction() {
        WRONG_PC.fetch_add(1, Ordering::Relaxed);
    }
}

fn count_post(_: &mut Registers) {
    POST_HITS.fetch_add(1, Ordering::Relaxed);
}

/// Encodings per class and random states per encoding.
const ENCODINGS: usize = 4;
const STATES: usize = 8;

/// What a run leaves behind: registers, flags, next PC, and the memory it may have written.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Observed {
    registers: Registers,
    memory_hash: u64,
}

fn hash(words: &[u64]) -> u64 {
    words.iter().fold(0xcbf2_9ce4_8422_2325_u64, |hash, &word| (hash ^ word).wrapping_mul(0x100_0000_01b3))
}

/// Where below SP the instruction itself stores a pair (an offset from SP), if it does. The
/// rest of the stack below SP is dead space (AArch64 has no red zone), which the detour
/// trampoline uses; so the stack is compared from SP up, plus this pair.
fn stack_store_below(class: Class, word: u32) -> Option<i64> {
    match class {
        Class::Pair { load: false, indexing: 2 | 3, sp_base: true } => {
            Some(((((word >> 15) & 0x7f) as i64) << 57 >> 57) * 8).filter(|&offset| offset < 0)
        }
        Class::PushFrame => Some(-16),
        _ => None,
    }
}

/// Fills the scratch memory from `seed`, builds the random register file, runs S, and returns
/// what is compared.
fn run_state(class: Class, word: u32, seed: u64, data: u64) -> Observed {
    let mut rng = Rng(seed | 1);
    let mut harness = HARNESS.lock();
    let scratch = &mut harness.scratch;
    for value in scratch.data.iter_mut().chain(scratch.stack.iter_mut()).chain(scratch.shadow.iter_mut()) {
        *value = rng.next();
    }
    let stack_top = scratch.stack.as_ptr() as u64 + core::mem::size_of_val(&scratch.stack) as u64;
    let shadow_base = scratch.shadow.as_ptr() as u64;
    let mut registers = Registers { x: [0; 31], sp: 0, pc: scratch_instruction(), pstate: 0 };
    for value in registers.x.iter_mut() {
        *value = rng.next();
    }
    registers.x[18] = shadow_base + 16 * 8;
    registers.sp = stack_top - 1024 - 16 * rng.below(16);
    registers.pstate = EL1T_MASKED | ((rng.below(16)) << 28);
    drop(harness);
    prepare(class, word, &mut rng, &mut registers, data);
    let output = run(&registers);
    // Memory the instruction may legitimately have written: the data buffer, the stack from the
    // lowest SP the run had upward (the detour trampoline uses the stack below it, dead space),
    // and the shadow call stack below the final x18.
    let harness = HARNESS.lock();
    let scratch = &harness.scratch;
    let stack_base = scratch.stack.as_ptr() as u64;
    let stack_from = ((registers.sp.min(stack_top) - stack_base) / 8) as usize;
    let pair = stack_store_below(class, word).map_or(0, |offset| {
        let index = ((registers.sp.wrapping_add_signed(offset) - stack_base) / 8) as usize;
        hash(&scratch.stack[index..index + 2])
    });
    let shadow_to = ((output.x[18].saturating_sub(shadow_base)) / 8).min(128) as usize;
    let memory_hash = hash(&scratch.data)
        ^ hash(&scratch.stack[stack_from.min(1024)..]).rotate_left(1)
        ^ hash(&scratch.shadow[..shadow_to]).rotate_left(2)
        ^ pair.rotate_left(3);
    let mut registers = output;
    registers.pstate &= 0xf << 28; // NZCV only: BTYPE and the rest are not part of the result
    Observed { registers, memory_hash }
}

fn probes_match_unprobed_execution(_: &Context) -> Outcome {
    let at = scratch_instruction();
    let data = HARNESS.lock().scratch.data.as_ptr() as u64;
    // A new seed per run (the counter), printed so that a failure can be replayed: the test
    // matrix then covers different random states in each of its configurations.
    let seed = crate::arch::counters::virtual_count() ^ 0x7072_6f62_6573_0001;
    defmt::info!("  seed {=u64:#x}", seed);
    let mut rng = Rng(seed | 1);
    let mut compared = 0_u64;
    for &(name, class) in CLASSES {
        for _ in 0..ENCODINGS {
            let word = encode(class, &mut rng);
            // SAFETY: S is this test's scratch text; nothing else executes it.
            unsafe { patch::write_instruction(at, word) };
            let seeds: [u64; STATES] = core::array::from_fn(|_| rng.next());
            let expected: [Observed; STATES] = core::array::from_fn(|state| run_state(class, word, seeds[state], data));
            for method in Method::ALL {
                let result = kprobes::register(
                    at,
                    method,
                    count_pre,
                    (method != Method::Detour).then_some(count_post as kprobes::Handler),
                );
                if let Some(error) = expected_error(class, method) {
                    if result != Err(error) {
                        defmt::error!(
                            "  {=str} {=u32:#x} {}: expected a refusal, got {}",
                            name,
                            word,
                            method,
                            result.err()
                        );
                        return Err(fail("refusal as expected"));
                    }
                    continue;
                }
                if let Err(error) = result {
                    defmt::error!("  {=str} {=u32:#x} {}: {}", name, word, method, error);
                    return Err(fail("registered"));
                }
                let (pre_before, post_before) = (PRE_HITS.load(Ordering::Relaxed), POST_HITS.load(Ordering::Relaxed));
                for state in 0..STATES {
                    let probed = run_state(class, word, seeds[state], data);
                    if probed != expected[state] {
                        report_difference(name, word, method, &expected[state], &probed);
                        let _ = kprobes::unregister(at);
                        return Err(fail("probed run == unprobed run"));
                    }
                    compared += 1;
                }
                check!(kprobes::counts(at) == Some((STATES as u64, 0)));
                kprobes::unregister(at).map_err(|_| fail("unregistered"))?;
                // SAFETY: S is this test's scratch text, readable.
                check_eq!(unsafe { core::ptr::read_volatile(at as *const u32) }, word);
                check_eq!(PRE_HITS.load(Ordering::Relaxed) - pre_before, STATES as u64);
                let posts = if method == Method::Detour { 0 } else { STATES as u64 };
                check_eq!(POST_HITS.load(Ordering::Relaxed) - post_before, posts);
            }
        }
    }
    check_eq!(WRONG_PC.load(Ordering::Relaxed), 0);
    defmt::info!("  {=u64} probed runs matched their unprobed runs", compared);
    Ok(Verdict::Passed)
}

fn report_difference(name: &str, word: u32, method: Method, expected: &Observed, probed: &Observed) {
    defmt::error!("  {=str} {=u32:#x} with {}: differs from the unprobed run", name, word, method);
    let (e, p) = (registers_words(&expected.registers), registers_words(&probed.registers));
    for index in 0..34 {
        if e[index] != p[index] {
            defmt::error!(
                "    word {=usize} (x0..x30, sp, pc, nzcv): {=u64:#x} unprobed, {=u64:#x} probed",
                index,
                e[index],
                p[index]
            );
        }
    }
    if expected.memory_hash != probed.memory_hash {
        defmt::error!("    memory differs");
    }
}

static SEEN: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];

fn see_pre(registers: &mut Registers) {
    SEEN[0].store(registers.x[0], Ordering::Relaxed);
    SEEN[1].store(registers.x[1], Ordering::Relaxed);
    SEEN[2].store(registers.pc, Ordering::Relaxed);
    registers.x[1] += 100;
}

fn see_post(registers: &mut Registers) {
    SEEN[3].store(registers.x[0], Ordering::Relaxed);
    SEEN[2].store(registers.pc, Ordering::Relaxed);
}

fn probe_handlers_see_registers(_: &Context) -> Outcome {
    for method in Method::ALL {
        let (function, target): (unsafe extern "C" fn(u64, u64) -> u64, u64) = if method == Method::Simulate {
            (probe_target_mov, probe_target_mov as *const () as u64)
        } else {
            (probe_target_add, probe_target_add as *const () as u64)
        };
        // SAFETY: kernel text, readable.
        let original = unsafe { core::ptr::read_volatile(target as *const u32) };
        let post = if method == Method::Detour { None } else { Some(see_post as kprobes::Handler) };
        if let Err(error) = kprobes::register(target, method, see_pre, post) {
            defmt::error!("  {}: {}", method, error);
            return Err(fail("registered"));
        }
        // SAFETY: the target returns x0 + x1 (or x1), touching nothing else.
        let result = unsafe { function(5, 7) };
        check_eq!(SEEN[0].load(Ordering::Relaxed), 5);
        check_eq!(SEEN[1].load(Ordering::Relaxed), 7);
        // The pre-handler's change of x1 is what the instruction used.
        let expected = if method == Method::Simulate { 107 } else { 112 };
        check_eq!(result, expected);
        if method == Method::Detour {
            check_eq!(SEEN[2].load(Ordering::Relaxed), target);
        } else {
            check_eq!(SEEN[2].load(Ordering::Relaxed), target + 4);
            check_eq!(SEEN[3].load(Ordering::Relaxed), expected);
        }
        // SAFETY: kernel text, readable.
        check!(unsafe { core::ptr::read_volatile(target as *const u32) } != original);
        check!(kprobes::counts(target) == Some((1, 0)));
        check!(kprobes::unregister(target).is_ok());
        // SAFETY: as above.
        check_eq!(unsafe { core::ptr::read_volatile(target as *const u32) }, original);
        // SAFETY: as above.
        check_eq!(unsafe { function(5, 7) }, if method == Method::Simulate { 7 } else { 12 });
    }
    Ok(Verdict::Passed)
}

/// Whether the build keeps frame records: not without frame pointers, nor in `plain` (the
/// compiler's default leaves them out of leaves and small functions).
const FRAME_RECORDS: bool =
    crate::build_info::FRAME_POINTERS && !matches!(crate::build_info::VARIANT.as_bytes(), b"plain");

/// The post-handler's SFrame trace, and its frame-record trace where the build has frame records.
static POST_TRACES: IrqSpinLock<(Trace, Trace)> = IrqSpinLock::new((Trace::new(), Trace::new()));

fn trace_post(_: &mut Registers) {
    let sframe = stacktrace::capture(Mode::SFrame, TraceOptions::ALL);
    let fp = if FRAME_RECORDS { stacktrace::capture(Mode::FramePointer, TraceOptions::ALL) } else { Trace::new() };
    *POST_TRACES.lock() = (sframe, fp);
}

#[inline(never)]
fn call_probe_target_add() -> u64 {
    // SAFETY: the target returns x0 + x1, touching nothing else.
    core::hint::black_box(unsafe { probe_target_add(core::hint::black_box(5), 7) })
}

/// A post-handler runs with the probed instruction executed in its XOL slot: the step (or the
/// slot's BRK) exception's PC is in the slot, which has no rows of its own. The SFrame walk from
/// the handler crosses the exception frame and unwinds the slot by the rows of the instruction
/// it stands for (`ret` of the leaf `probe_target_add`, the return address in x30), on to the
/// caller and the end of the task; the frame walk, which skips the leaf's caller (x30 is in no
/// record), gives the same entries from the slot on but that one.
fn probe_slot_walks_by_the_probed_rows(_: &Context) -> Outcome {
    let target = probe_target_add as *const () as u64;
    let caller = call_probe_target_add as *const () as u64;
    // The return address into the small caller (`plain` has no patchable entries to look it up).
    let into_caller = |address: u64| address > caller && address - caller < 0x200;
    let in_slots = |address: u64| address.wrapping_sub(kprobes::slot_area_address()) < kprobes::SLOT_AREA_SIZE;
    for method in [Method::SingleStep, Method::BrkStep] {
        if let Err(error) = kprobes::register(target, method, ignore, Some(trace_post as kprobes::Handler)) {
            defmt::error!("  {}: {}", method, error);
            return Err(fail("registered"));
        }
        let result = call_probe_target_add();
        check!(kprobes::unregister(target).is_ok());
        check_eq!(result, 12);
        let (sframe, fp) = POST_TRACES.lock().clone();
        let Some(slot) = sframe.addresses().iter().position(|&address| in_slots(address)) else {
            stacktrace::print("post-handler, SFrame", &sframe);
            return Err(fail("the SFrame walk from the post-handler does not reach the slot"));
        };
        if !sframe.stop_reason().is_complete() || sframe.len() <= slot + 1 {
            stacktrace::print("post-handler, SFrame", &sframe);
            return Err(fail("the SFrame walk stops at the slot"));
        }
        check!(into_caller(sframe.addresses()[slot + 1]));
        if FRAME_RECORDS {
            let Some(fp_slot) = fp.addresses().iter().position(|&address| in_slots(address)) else {
                return Err(fail("the frame walk from the post-handler does not reach the slot"));
            };
            check_eq!(fp.addresses()[fp_slot], sframe.addresses()[slot]);
            if fp.addresses()[fp_slot + 1..] != sframe.addresses()[slot + 2..] {
                stacktrace::print("post-handler, SFrame", &sframe);
                stacktrace::print("post-handler, frame records", &fp);
                return Err(fail("the SFrame walk past the slot differs from the frame walk"));
            }
        }
    }
    Ok(Verdict::Passed)
}

/// A pre-handler asking to skip the instruction, Linux-style (the PC past it), that also
/// changes x1: the x1 change must apply, the PC change be refused.
fn skip_instruction(registers: &mut Registers) {
    registers.pc += 4;
    registers.x[1] += 100;
}

/// A pre-handler moving SP (which, applied, would unbalance the caller's stack).
fn move_stack_pointer(registers: &mut Registers) {
    registers.sp -= 64;
}

/// A detour probe whose pre-handler changes `pc` or `sp`: the change is refused (counted and
/// undone), so the instruction still runs at its address with the original SP; `expected` is
/// what the probed `probe_target_add(5, 7)` then returns.
fn detour_refuses(change: kprobes::Handler, expected: u64) -> Outcome {
    let target = probe_target_add as *const () as u64;
    if let Err(error) = kprobes::register(target, Method::Detour, change, None) {
        defmt::error!("  detour: {}", error);
        return Err(fail("registered"));
    }
    // SAFETY: the target returns x0 + x1, touching nothing else.
    let result = unsafe { probe_target_add(5, 7) };
    let (counts, refused) = (kprobes::counts(target), kprobes::refused_changes(target));
    check!(kprobes::unregister(target).is_ok());
    check_eq!(result, expected);
    check!(counts == Some((1, 0)));
    check!(refused == Some(1));
    Ok(Verdict::Passed)
}

fn probe_detour_refuses_pc_change(_: &Context) -> Outcome {
    // Skipped, the ADD would leave 5; performed with the pre-handler's x1, 5 + 107.
    detour_refuses(skip_instruction, 112)
}

fn probe_detour_refuses_sp_change(_: &Context) -> Outcome {
    // Applied, the new SP would reach the caller, whose stack would be off by 64 bytes.
    detour_refuses(move_stack_pointer, 12)
}

fn ignore(_: &mut Registers) {}

/// A sum of the slot area's words: what a probe leaves in it after unregistering shows here.
fn slot_area_sum() -> u64 {
    let start = kprobes::slot_area_address();
    (0..kprobes::SLOT_AREA_SIZE / 4)
        // SAFETY: the slot area is mapped kernel memory, readable.
        .map(|word| u64::from(unsafe { core::ptr::read_volatile((start + 4 * word) as *const u32) }))
        .fold(0u64, |sum, word| sum.rotate_left(5) ^ word)
}

/// `register_all` and `unregister_all` (as the probe sweep arms and disarms a batch): each takes
/// one hold of the other CPUs for the whole batch; every probe of the batch is hit, then gone,
/// its word restored and its slot or trampoline poisoned again; an address that holds no probe,
/// or one given twice, is reported and does not stop the others.
fn probe_unregister_all_frees_every_probe(_: &Context) -> Outcome {
    let targets = [
        (probe_target_add as *const () as u64, Method::Detour),
        (probe_target_mov as *const () as u64, Method::SingleStep),
        (probe_target_increment as *const () as u64, Method::BrkStep),
    ];
    // SAFETY: kernel text, readable.
    let originals = targets.map(|(address, _)| unsafe { core::ptr::read_volatile(address as *const u32) });
    let area = slot_area_sum();
    let holds = crate::task::cpus::holds();
    let mut registered = [Err(ProbeError::NotRegistered); 3];
    kprobes::register_all(&targets, ignore, None, &mut registered);
    check!(registered == [Ok(()); 3]);
    check_eq!(crate::task::cpus::holds(), holds + 1);
    // SAFETY: the targets compute from their arguments only.
    check!(unsafe { (probe_target_add(5, 7), probe_target_mov(5, 7), probe_target_increment(5)) } == (12, 7, 6));
    check!(targets.iter().all(|&(address, _)| kprobes::counts(address) == Some((1, 0))));
    let not_registered = scratch_instruction();
    let batch = [targets[0].0, not_registered, targets[1].0, targets[0].0, targets[2].0];
    check!(kprobes::unregister_all(&batch) == Err(ProbeError::NotRegistered));
    check_eq!(crate::task::cpus::holds(), holds + 2);
    for ((address, _), original) in targets.iter().zip(originals) {
        check!(kprobes::counts(*address).is_none());
        // SAFETY: as above.
        check_eq!(unsafe { core::ptr::read_volatile(*address as *const u32) }, original);
    }
    check_eq!(slot_area_sum(), area);
    // SAFETY: as above.
    check!(unsafe { (probe_target_add(5, 7), probe_target_mov(5, 7), probe_target_increment(5)) } == (12, 7, 6));
    Ok(Verdict::Passed)
}

/// Batches of probes coming and going, as the probe sweep's do, leave the PC table as they found
/// it: a removed probe's entry is emptied once nothing follows it, so the table does not fill
/// with tombstones (which made every registration walk all of it).
fn probe_table_keeps_no_tombstones(_: &Context) -> Outcome {
    const WORDS: usize = 240;
    const NOP: u32 = 0xd503_201f;
    // SAFETY: only the address of the asm-defined page is taken.
    let page = unsafe { &probe_scratch_page as *const u32 as u64 };
    // SAFETY: the scratch page is this module's test text, run by no CPU while written.
    unsafe { patch::write_instructions(page, &[NOP; WORDS]) };
    let before = kprobes::table_entries_in_use();
    let mut probes = [(0u64, Method::Simulate); WORDS / 2];
    let mut results = [Ok(()); WORDS / 2];
    let mut every_batch_armed = true;
    for round in 0..8u64 {
        // Every round probes other words: the first half, then the second, shifted by a word.
        let first = (round % 2) as usize * (WORDS / 2);
        for (index, probe) in probes.iter_mut().enumerate() {
            probe.0 = page + 4 * ((first + index + round as usize / 2) % WORDS) as u64;
        }
        kprobes::register_all(&probes, ignore, None, &mut results);
        let armed = results.iter().all(|result| result.is_ok());
        let addresses = probes.map(|(address, _)| address);
        let _ = kprobes::unregister_all(&addresses);
        every_batch_armed &= armed;
    }
    let after = kprobes::table_entries_in_use();
    let capture = probes::encode_brk(BRK_HARNESS_CAPTURE).0;
    // SAFETY: as above.
    unsafe { patch::write_instructions(page, &[capture; WORDS]) };
    check!(every_batch_armed);
    check_eq!(after, before);
    Ok(Verdict::Passed)
}

fn refusal(address: u64, method: Method, post: Option<kprobes::Handler>) -> Result<(), ProbeError> {
    let result = kprobes::register(address, method, ignore, post);
    if result.is_ok() {
        let _ = kprobes::unregister(address);
    }
    result
}

fn refusal_of(word: u32, method: Method) -> Result<(), ProbeError> {
    let at = scratch_instruction();
    // SAFETY: S is this test's scratch text.
    unsafe { patch::write_instruction(at, word) };
    refusal(at, method, None)
}

fn probe_refusals_say_why(_: &Context) -> Outcome {
    use probes::RejectReason;
    let at = scratch_instruction();
    // crates/probes' rejections.
    check!(refusal_of(0xd420_0000, Method::Simulate) == Err(ProbeError::Rejected(RejectReason::ExceptionGenerating)));
    check!(refusal_of(0xd51b_4200, Method::Detour) == Err(ProbeError::Rejected(RejectReason::SystemRegisterWrite)));
    check!(refusal_of(0xc85f_7c20, Method::SingleStep) == Err(ProbeError::Rejected(RejectReason::Exclusive)));
    // The same address twice; unregistering twice.
    check!(refusal_of(0xd503_201f, Method::Simulate).is_ok());
    check!(kprobes::register(at, Method::Simulate, ignore, None).is_ok());
    check!(kprobes::register(at, Method::Detour, ignore, None) == Err(ProbeError::AlreadyRegistered));
    check!(kprobes::unregister(at).is_ok());
    check!(kprobes::unregister(at) == Err(ProbeError::NotRegistered));
    // Inside LDXR..STXR: the add after the ldxr; the ret after the stxr is fine.
    // SAFETY: only the address is taken.
    let exclusive = unsafe { &probe_target_exclusive as *const u32 as u64 };
    check!(refusal(exclusive + 4, Method::SingleStep, None) == Err(ProbeError::InsideExclusiveSequence));
    check!(refusal(exclusive + 12, Method::Simulate, None).is_ok());
    // The no-probe list: vectors, the BRK handler, the hit path, the slot area, logging.
    for address in [
        crate::arch::exception::vectors_address(),
        crate::trap::sync_handler_address(),
        kprobes::on_brk as *const () as u64,
        kprobes::slot_area_address(),
    ] {
        check!(matches!(refusal(address, Method::Simulate, None), Err(ProbeError::NoProbe(_))));
    }
    // ftrace's patchable entries (not in the plain variant, which has none).
    if let Some(entry) = kprobes::first_patchable_entry() {
        for offset in [0, 4, 8, 12] {
            check!(refusal(entry + offset, Method::Simulate, None) == Err(ProbeError::FtraceCallsite));
        }
    }
    // Not text, misaligned.
    static NOT_TEXT: u32 = 0;
    check!(refusal(&NOT_TEXT as *const u32 as u64, Method::Simulate, None) == Err(ProbeError::NotText(Text::Kernel)));
    // EL0 code inside the kernel image: uprobes' business.
    let (user_text, _) = crate::task::user::user_text();
    check!(refusal(user_text, Method::Simulate, None) == Err(ProbeError::UserText));
    check!(refusal(at + 2, Method::Simulate, None) == Err(ProbeError::Misaligned));
    // Method-specific refusals.
    check!(refusal_of(0x1400_0010, Method::SingleStep) == Err(ProbeError::NeedsOriginalPc(Text::Kernel))); // b
    check!(refusal_of(0xd65f_03c0, Method::BrkStep) == Err(ProbeError::NeedsOriginalPc(Text::Kernel))); // ret
    check!(refusal_of(0x8b01_0000, Method::Simulate) == Err(ProbeError::NotSimulated)); // add x0, x0, x1
    check!(refusal_of(0xa9b0_7bfd, Method::Simulate) == Err(ProbeError::StackBeyondGap)); // stp x29, x30, [sp, #-256]!
    check!(refusal_of(0xd104_03ff, Method::Simulate) == Err(ProbeError::StackBeyondGap)); // sub sp, sp, #256
    check!(refusal_of(0x9100_001f, Method::Simulate) == Err(ProbeError::StackBeyondGap)); // mov sp, x0
    check!(refusal_of(0xa9b1_7bfd, Method::Simulate).is_ok()); // stp x29, x30, [sp, #-240]!
    check!(refusal_of(0xd63f_03c0, Method::Detour) == Err(ProbeError::DetourBlrX30)); // blr x30
    check!(refusal_of(0xd503_201f, Method::Detour).is_ok());
    check!(refusal(at, Method::Detour, Some(ignore)) == Err(ProbeError::DetourPostHandler));
    // PAC and SCS instructions are probed, not refused (the differential test runs them).
    check!(refusal_of(0xd503_233f, Method::SingleStep).is_ok()); // paciasp
    check!(refusal_of(0xf800_865e, Method::Detour).is_ok()); // str x30, [x18], #8
    Ok(Verdict::Passed)
}

fn call_inner(_: &mut Registers) {
    // SAFETY: the target returns x0 + x1.
    core::hint::black_box(unsafe { probe_target_add(1, 2) });
}

fn probe_hit_from_handler_is_missed(_: &Context) -> Outcome {
    let outer = probe_target_mov as *const () as u64;
    let inner = probe_target_add as *const () as u64;
    for method in Method::ALL {
        let inner_method = if method == Method::Simulate { Method::SingleStep } else { method };
        check!(kprobes::register(inner, inner_method, ignore, None).is_ok());
        check!(kprobes::register(outer, method, call_inner, None).is_ok());
        // SAFETY: the target returns x1.
        check_eq!(unsafe { probe_target_mov(0, 9) }, 9);
        check!(kprobes::counts(outer) == Some((1, 0)));
        // The inner probe's instruction still ran (the result above is unchanged by it, and
        // calling it directly gives its result), but its handler did not.
        check!(kprobes::counts(inner) == Some((0, 1)));
        // SAFETY: as above.
        check_eq!(unsafe { probe_target_add(1, 2) }, 3);
        check!(kprobes::counts(inner) == Some((1, 1)));
        check!(kprobes::unregister(outer).is_ok());
        check!(kprobes::unregister(inner).is_ok());
    }
    Ok(Verdict::Passed)
}

/// What the re-entered target returned inside the outer handler.
static REENTERED_RESULT: AtomicU64 = AtomicU64::new(0);

fn call_increment(_: &mut Registers) {
    // SAFETY: the target returns x0 + 1.
    REENTERED_RESULT.store(unsafe { probe_target_increment(41) }, Ordering::Relaxed);
}

/// What one outer/inner pair gave: the outer target's result, the inner target's result inside
/// the outer handler, and the (hits, missed) counts of the outer and the inner probe.
type ReentryRound = (u64, u64, (u64, u64), (u64, u64));

/// One outer/inner pair: the outer probe's handler calls the inner probe's function.
fn reentry_round(outer_method: Method, inner_method: Method) -> Result<ReentryRound, Failure> {
    let outer = probe_target_mov as *const () as u64;
    let inner = probe_target_increment as *const () as u64;
    REENTERED_RESULT.store(0, Ordering::Relaxed);
    check!(kprobes::register(inner, inner_method, ignore, None).is_ok());
    check!(kprobes::register(outer, outer_method, call_increment, None).is_ok());
    // SAFETY: the target returns x1.
    let result = unsafe { probe_target_mov(0, 9) };
    let counts = (kprobes::counts(outer).unwrap_or_default(), kprobes::counts(inner).unwrap_or_default());
    check!(kprobes::unregister(outer).is_ok());
    check!(kprobes::unregister(inner).is_ok());
    Ok((result, REENTERED_RESULT.load(Ordering::Relaxed), counts.0, counts.1))
}

/// Linux's `kprobe_reenter` for every pair of methods: a probe hit from inside another probe's
/// handler is performed by its own method (the target's result is right), its handler does not
/// run, and it counts one miss. With the re-entry handling switched off (a test-only switch),
/// the inner hit runs its handler as a fresh one: the counts this test checks must show it.
fn probe_reentry_every_method_pair(_: &Context) -> Outcome {
    for outer_method in Method::ALL {
        for inner_method in Method::ALL {
            let (result, reentered, outer, inner) = reentry_round(outer_method, inner_method)?;
            check_eq!(result, 9);
            check_eq!(reentered, 42);
            check!(outer == (1, 0));
            check!(inner == (0, 1));
        }
    }
    for outer_method in Method::ALL {
        crate::inject::set(crate::inject::Fault::ReentryUnhandled, true);
        let unhandled = reentry_round(outer_method, Method::Simulate);
        crate::inject::set(crate::inject::Fault::ReentryUnhandled, false);
        let (result, reentered, outer, inner) = unhandled?;
        // The instructions still ran; only the re-entry accounting is gone, and it is caught.
        check!(result == 9 && reentered == 42 && outer == (1, 0));
        check!(inner == (1, 0));
    }
    Ok(Verdict::Passed)
}

fn fail(expression: &'static str) -> Failure {
    Failure { expression, file: file!(), line: line!() }
}
