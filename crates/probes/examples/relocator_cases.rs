//! Prints relocated sequences as JSON lines for the independent relocator check.
//!
//! `tools/check_relocator.py` runs this and executes, in Unicorn, each original instruction at
//! its address and the relocated sequence at its trampoline's address. For every form the
//! relocator accepts, this draws random words (offsets over the whole field, edges included),
//! probed addresses and trampoline positions from a seed, and relocates them with the crate's
//! real `relocate`. Arguments: `--seed N`, `--per-form N` (words per form), `--bug NAME` (one of
//! `probes::injected::Bug`, to check that the check notices it).
//!
//! One line per case: `{"form", "word", "address", "slot", "base"?, "code", "literals"}` (code
//! from the slot, literals from word `LITERAL_POOL`), or `{"form", "word", ..., "refused"}`.

use probes::injected::{Bug, inject};
use probes::{
    Classification, Insn, LITERAL_POOL, RelocateError, Simulated, TRAMPOLINE_WORDS, Trampoline, classify, encode_brk,
    relocate,
};

/// Where probed instructions are drawn: 64 MiB of text well inside a 48-bit physical space, so
/// that Unicorn (MMU off) can map any page a form reaches.
const TEXT_BASE: u64 = 0x10_0000_0000;
const TEXT_SPAN: u64 = 64 << 20;
const MIB: i64 = 1 << 20;
const CHUNK_BYTES: u64 = 4 * TRAMPOLINE_WORDS as u64;

/// xorshift64*: small, seeded, and the same on every host.
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound
    }
    fn bits(&mut self, width: u32) -> u32 {
        (self.next() & ((1 << width) - 1)) as u32
    }
    /// A signed field of `width` bits: uniform half the time, else one of its edges or near 0.
    fn field(&mut self, width: u32) -> u32 {
        let mask = (1u32 << width) - 1;
        let edge = [0, 1, 2, mask, mask - 1, mask >> 1, (mask >> 1) + 1, (mask >> 1) - 1];
        if self.below(2) == 0 { self.bits(width) } else { edge[self.below(edge.len() as u64) as usize] & mask }
    }
    fn register(&mut self) -> u32 {
        self.bits(5)
    }
}

/// The forms the relocator accepts: a name and a generator of words for it.
type Generator = fn(&mut Random) -> u32;

const FORMS: &[(&str, Generator)] = &[
    ("b", |r| 0x1400_0000 | r.field(26)),
    ("bl", |r| 0x9400_0000 | r.field(26)),
    ("b.cond", |r| 0x5400_0000 | r.field(19) << 5 | r.bits(4)),
    ("cbz-cbnz", |r| r.bits(1) << 31 | 0x3400_0000 | r.bits(1) << 24 | r.field(19) << 5 | r.register()),
    ("tbz-tbnz", |r| {
        r.bits(1) << 31 | 0x3600_0000 | r.bits(1) << 24 | r.bits(5) << 19 | r.field(14) << 5 | r.register()
    }),
    ("adr", |r| {
        let immediate = r.field(21);
        (immediate & 3) << 29 | 0x1000_0000 | (immediate >> 2) << 5 | r.register()
    }),
    ("adrp", |r| {
        let immediate = r.field(21);
        1 << 31 | (immediate & 3) << 29 | 0x1000_0000 | (immediate >> 2) << 5 | r.register()
    }),
    // LDR (literal) W and X, LDRSW (literal); Rt = XZR one time in four.
    ("ldr-literal", |r| {
        let rt = if r.below(4) == 0 { 31 } else { r.register() };
        (r.below(3) as u32) << 30 | 0x1800_0000 | r.field(19) << 5 | rt
    }),
    ("prfm-literal", |r| 0xd800_0000 | r.field(19) << 5 | r.register()),
    ("hint", |r| [0xd503_201f, 0xd503_203f, 0xd503_241f, 0xd503_245f, 0xd503_249f, 0xd503_24df][r.below(6) as usize]),
    ("br-blr-ret", |r| [0xd61f_0000, 0xd63f_0000, 0xd65f_0000][r.below(3) as usize] | r.register() << 5),
    // STP/LDP of X registers: post-index, signed offset, pre-index.
    ("stp-ldp", |r| 0xa800_0000 | (1 + r.below(3) as u32) << 23 | r.bits(1) << 22 | r.field(7) << 15 | r.bits(15)),
    ("mov-register", |r| r.bits(1) << 31 | 0x2a00_03e0 | r.register() << 16 | r.register()),
    ("add-sub-immediate", |r| r.bits(3) << 29 | 0x1100_0000 | r.bits(1) << 22 | r.bits(12) << 10 | r.bits(10)),
    // Stepped forms are copied: data processing (immediate and register) words the crate steps.
    ("stepped", |r| {
        let group = [0b1000, 0b1001, 0b0101, 0b1101][r.below(4) as usize];
        (r.next() as u32 & !(0xf << 25)) | group << 25
    }),
];

/// The register a form addresses memory through, which the check points at mapped data.
fn base_register(classification: &Classification) -> Option<u8> {
    match classification {
        Classification::Simulate(Simulated::LoadStorePair { rn, .. }) => Some(rn.number()),
        _ => None,
    }
}

fn accepted(form: &str, classification: &Classification) -> bool {
    match (form, classification) {
        (_, Classification::Reject(_)) => false,
        ("stepped", Classification::StepOutOfLine) => true,
        ("stepped", _) => false,
        // CONSTRAINED UNPREDICTABLE pairs are stepped, not relocated as a pair: not this form.
        ("stp-ldp", Classification::StepOutOfLine) => false,
        _ => true,
    }
}

fn refusal_name(error: RelocateError) -> &'static str {
    match error {
        RelocateError::Rejected(_) => "rejected",
        RelocateError::BlrX30 => "blr-x30",
        RelocateError::OutOfBranchRange => "out-of-branch-range",
        RelocateError::TooLong => "too-long",
        RelocateError::LiteralOutOfRange => "literal-out-of-range",
    }
}

fn join(words: &[u32]) -> String {
    words.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

fn main() {
    let mut seed = 1u64;
    let mut per_form = 200u64;
    let mut arguments = std::env::args().skip(1);
    while let Some(argument) = arguments.next() {
        let mut value = || arguments.next().unwrap_or_else(|| usage(&format!("{argument} needs a value")));
        match argument.as_str() {
            "--seed" => seed = value().parse().unwrap_or_else(|_| usage("--seed takes a number")),
            "--per-form" => per_form = value().parse().unwrap_or_else(|_| usage("--per-form takes a number")),
            "--bug" => {
                let name = value();
                let bug = Bug::ALL.into_iter().find(|bug| bug.name() == name);
                inject(Some(bug.unwrap_or_else(|| usage(&format!("no bug named {name}")))));
            }
            other => usage(&format!("unknown argument {other}")),
        }
    }
    let mut random = Random(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let filler = encode_brk(0x006).0;
    for &(form, generate) in FORMS {
        let mut emitted = 0;
        while emitted < per_form {
            let word = generate(&mut random);
            let classification = classify(Insn(word));
            if !accepted(form, &classification) {
                continue;
            }
            let address = TEXT_BASE + 4 * random.below(TEXT_SPAN / 4);
            // Trampolines near (within an LDR literal's reach), mid-way and far (beyond B's).
            let reach = [2 * MIB, 64 * MIB, 160 * MIB][random.below(3) as usize];
            let delta = random.below(2 * reach as u64) as i64 - reach;
            let slot = address.wrapping_add_signed(delta) & !(CHUNK_BYTES - 1);
            // The relocated run stops when the PC leaves the chunk: the probe and its fall-through
            // must lie outside it (a branch target inside it is the form's own business).
            if (slot..slot + CHUNK_BYTES).contains(&address) || (slot..slot + CHUNK_BYTES).contains(&(address + 4)) {
                continue;
            }
            emitted += 1;
            let head = format!("{{\"form\":\"{form}\",\"word\":{word},\"address\":{address},\"slot\":{slot}");
            let mut trampoline = Trampoline::new(slot, filler);
            match relocate(&mut trampoline, address, word, &classification) {
                Ok(()) => {
                    let base = base_register(&classification).map(|rn| format!(",\"base\":{rn}")).unwrap_or_default();
                    println!(
                        "{head}{base},\"code\":[{}],\"literals\":[{}],\"literal_pool\":{LITERAL_POOL}}}",
                        join(trampoline.code()),
                        join(trampoline.literals())
                    );
                }
                Err(error) => println!("{head},\"refused\":\"{}\"}}", refusal_name(error)),
            }
        }
    }
}

fn usage(message: &str) -> ! {
    eprintln!("relocator_cases: {message}");
    eprintln!("usage: relocator_cases [--seed N] [--per-form N] [--bug NAME]");
    std::process::exit(2)
}
