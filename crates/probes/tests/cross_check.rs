//! Cross-checks `describe`/`classify` (disarm64) against yaxpeax-arm.
//!
//! Over a seeded random sample of at least a million words, the two decoders
//! must agree on whether a word is allocated, a branch, a load/store and
//! PC-relative. Every family of disagreements found was resolved against the
//! Arm ARM: where the primary was wrong it was fixed (`src/reserved.rs`),
//! where the second decoder is wrong or incomplete `known_second_decoder_gap`
//! names the reason, and `tests/classify.rs` pins a representative of each.
//! No family is left open: any other disagreement fails the test.
//! `PROBES_DUMP=1` prints every explained word, e.g. to feed a third
//! disassembler (`llvm-mc --disassemble`).

use disarm64::InsnOpcode;
use disarm64_defn::InsnClass;
use probes::{Classification, Insn, classify};
use yaxpeax_arch::{Decoder, U8Reader};
use yaxpeax_arm::armv8::a64::{DecodeError, InstDecoder, Opcode, Operand};

/// What a decoder says about one word.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Categories {
    allocated: bool,
    branch: bool,
    load_store: bool,
    pc_relative: bool,
}

const UNALLOCATED: Categories = Categories { allocated: false, branch: false, load_store: false, pc_relative: false };

fn primary(word: u32) -> Categories {
    match Insn(word).describe() {
        Some(d) => Categories {
            allocated: true,
            branch: d.is_branch,
            load_store: d.is_load_store,
            pc_relative: d.is_pc_relative,
        },
        None => UNALLOCATED,
    }
}

/// The second decoder's answer, or `None` where it says it cannot decode the
/// word (SVE/SME: `IncompleteDecoder`), so it has no opinion.
fn second(word: u32) -> Option<Categories> {
    let bytes = word.to_le_bytes();
    let mut reader = U8Reader::new(&bytes);
    match InstDecoder::default().decode(&mut reader) {
        Ok(instruction) if instruction.opcode == Opcode::Invalid => Some(UNALLOCATED),
        Ok(instruction) => {
            let opcode = instruction.opcode;
            let name = format!("{opcode:?}");
            let branch = matches!(
                opcode,
                Opcode::B
                    | Opcode::BL
                    | Opcode::Bcc(_)
                    | Opcode::BCcc(_)
                    | Opcode::CBZ
                    | Opcode::CBNZ
                    | Opcode::TBZ
                    | Opcode::TBNZ
                    | Opcode::BR
                    | Opcode::BLR
                    | Opcode::RET
                    | Opcode::ERET
                    | Opcode::DRPS
                    | Opcode::BLRAA
                    | Opcode::BLRAAZ
                    | Opcode::BLRAB
                    | Opcode::BLRABZ
                    | Opcode::BRAA
                    | Opcode::BRAAZ
                    | Opcode::BRAB
                    | Opcode::BRABZ
                    | Opcode::RETAA
                    | Opcode::RETAB
                    | Opcode::ERETAA
                    | Opcode::ERETAB
                    | Opcode::RETAASPPC
                    | Opcode::RETABSPPC
                    | Opcode::RETAASPPCR
                    | Opcode::RETABSPPCR
            );
            // Every yaxpeax memory-access opcode is named LD*, ST*, CAS*,
            // SWP* or PRF*; no other opcode starts with those letters.
            let load_store = ["LD", "ST", "CAS", "SWP", "PRF"].iter().any(|p| name.starts_with(p));
            let pc_relative = instruction.operands.iter().any(|operand| matches!(operand, Operand::PCOffset(_)));
            Some(Categories { allocated: true, branch, load_store, pc_relative })
        }
        Err(DecodeError::IncompleteDecoder) => None,
        Err(_) => Some(UNALLOCATED),
    }
}

/// xorshift64*: small, seeded, and the same on every host.
struct Xorshift(u64);

impl Xorshift {
    fn next_word(&mut self) -> u32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32) as u32
    }
}

/// Groups where the second decoder is known to be wrong or incomplete and
/// the Arm ARM agrees with the primary. Each returns the reason.
fn known_second_decoder_gap(word: u32, primary: Categories, second: Categories, known: &Known) -> Option<&'static str> {
    let description = Insn(word).describe();
    if primary.allocated && !second.allocated {
        let description = description?;
        let feature = description.feature().to_string();
        if !known.second.contains(description.mnemonic) || SECOND_LACKS.contains(&feature.as_str()) {
            return Some("second decoder lacks the instruction (newer extension)");
        }
        if second_rejects_allocated_simd(word) {
            return Some("second decoder rejects allocated FMLAL/FMLSL (vector, sz = 0) or FRINT64X (4S)");
        }
    }
    if !primary.allocated && second.allocated {
        // The primary's tables matched, and `reserved.rs` rejected the word
        // on an Arm ARM UNDEFINED size/Q/immh/imm5 condition that the second
        // decoder does not check either (LLVM 14's disassembler agrees on
        // every such word in the sample; see the crate docs).
        if disarm64::decoder::decode(word).is_some_and(|opcode| ADVANCED_SIMD.contains(&opcode.definition().class)) {
            return Some("second decoder accepts a reserved Advanced SIMD size/Q/immh/imm5 value");
        }
        let name = second_name(word)?;
        if known.primary.contains(&name) || RARE_IN_PRIMARY.contains(&name.as_str()) {
            return Some("second decoder ignores fixed or should-be-zero/one bits");
        }
    }
    None
}

/// Feature sets the second decoder does not implement, whose mnemonics
/// collide with ones it does (e.g. CSSC `smax` vs. Advanced SIMD `smax`).
const SECOND_LACKS: &[&str] = &["CSSC", "FPRCVT", "RCPC3"];

/// The primary's Advanced SIMD classes whose size/Q rules `reserved.rs` adds.
const ADVANCED_SIMD: &[InsnClass] = &[
    InsnClass::ASIMDALL,
    InsnClass::ASIMDDIFF,
    InsnClass::ASIMDELEM,
    InsnClass::ASIMDEXT,
    InsnClass::ASIMDINS,
    InsnClass::ASIMDMISC,
    InsnClass::ASIMDPERM,
    InsnClass::ASIMDSAME,
    InsnClass::ASIMDSHF,
    InsnClass::ASISDDIFF,
    InsnClass::ASISDELEM,
    InsnClass::ASISDLSE,
    InsnClass::ASISDLSEP,
    InsnClass::ASISDLSO,
    InsnClass::ASISDLSOP,
    InsnClass::ASISDMISC,
    InsnClass::ASISDONE,
    InsnClass::ASISDPAIR,
    InsnClass::ASISDSAME,
    InsnClass::ASISDSHF,
    InsnClass::DOTPRODUCT,
];

/// Allocated encodings yaxpeax-arm 0.5 rejects (Arm ARM C7.2; LLVM 14
/// disassembles them): FMLAL/FMLSL (vector, FEAT_FHM) `0 Q 0 01110 S 0 1 Rm
/// 11101 1 Rn Rd` with sz = 0, and FRINT64X (vector, FEAT_FRINTTS) with
/// sz:Q = 01.
fn second_rejects_allocated_simd(word: u32) -> bool {
    word & 0xbf60_fc00 == 0x0e20_ec00 || word & 0xffff_fc00 == 0x6e21_f800
}

/// Instructions the primary decodes, whose few valid encodings the sample
/// happens not to hit (e.g. LDXR needs Rs = Rt2 = 11111); checked by hand.
const RARE_IN_PRIMARY: &[&str] = &[
    "stlr",
    "stlrb",
    "stlrh",
    "stllr",
    "stllrb",
    "stllrh",
    "ldlar",
    "ldlarb",
    "ldlarh",
    "ldar",
    "ldarb",
    "ldarh",
    "ldxr",
    "ldxrb",
    "ldxrh",
    "ldaxr",
    "ldaxrb",
    "ldaxrh",
    "stxr",
    "stxrb",
    "stxrh",
    "stlxr",
    "stlxrb",
    "stlxrh",
    "ldxp",
    "ldaxp",
    "stxp",
    "stlxp",
    "sm4e",
    "sha512su0",
    "fcmp",
    "fcvtxn2",
    "rev",
];

/// Mnemonics each decoder knows at all, gathered over the sample.
struct Known {
    primary: std::collections::BTreeSet<String>,
    second: std::collections::BTreeSet<String>,
}

/// The second decoder's lower-case opcode name, without operands.
fn second_name(word: u32) -> Option<String> {
    let bytes = word.to_le_bytes();
    let mut reader = U8Reader::new(&bytes);
    let instruction = InstDecoder::default().decode(&mut reader).ok()?;
    let name = format!("{:?}", instruction.opcode).to_lowercase();
    Some(name.split('(').next().unwrap_or_default().to_string())
}

const SAMPLE: u32 = 1_000_000;
const SEED: u64 = 0x7ace_1ab5_eed0_0005;

#[test]
fn classify_agrees_with_second_decoder() {
    let mut rng = Xorshift(SEED);
    let mut known = Known { primary: Default::default(), second: Default::default() };
    for _ in 0..SAMPLE {
        let word = rng.next_word();
        if let Some(name) = second_name(word) {
            known.second.insert(name);
        }
        if let Some(description) = Insn(word).describe() {
            known.primary.insert(description.mnemonic.to_string());
        }
    }
    let mut rng = Xorshift(SEED);
    let mut compared = 0u32;
    let mut abstained = 0u32;
    let mut explained = std::collections::BTreeMap::<&str, u32>::new();
    let mut disagreements = Vec::new();
    for _ in 0..SAMPLE {
        let word = rng.next_word();
        let ours = primary(word);
        // Every word gets a classification without panicking.
        let classification = classify(Insn(word));
        assert_eq!(
            ours.allocated,
            !matches!(classification, Classification::Reject(probes::RejectReason::Unallocated)),
            "{word:#010x}"
        );
        let Some(theirs) = second(word) else {
            abstained += 1;
            continue;
        };
        compared += 1;
        if ours == theirs {
            continue;
        }
        if let Some(reason) = known_second_decoder_gap(word, ours, theirs, &known) {
            *explained.entry(reason).or_default() += 1;
            if std::env::var_os("PROBES_DUMP").is_some() {
                println!("DUMP {word:#010x} {}", reason.split(' ').nth(2).unwrap_or("?"));
            }
            continue;
        }
        disagreements.push((word, ours, theirs));
    }
    eprintln!("sample {SAMPLE}, compared {compared}, second decoder abstained {abstained}");
    for (reason, count) in &explained {
        eprintln!("  {count:7} explained: {reason}");
    }
    // Group what is left by (feature, mnemonic, second decoder's opcode) so
    // that a failure names families, not a million words.
    let mut families = std::collections::BTreeMap::<String, (u32, u32)>::new();
    for (word, ours, theirs) in &disagreements {
        let (feature, mnemonic) =
            Insn(*word).describe().map_or(("-".to_string(), "-"), |d| (d.feature().to_string(), d.mnemonic));
        let their_name = second_name(*word).unwrap_or_else(|| "invalid".to_string());
        let key = format!("{feature} {mnemonic} / {their_name}: ours {ours:?} theirs {theirs:?}");
        families.entry(key).or_insert((0, *word)).0 += 1;
    }
    for (family, (count, word)) in &families {
        eprintln!("{count:7} like {word:#010x}: {family}");
    }
    assert!(disagreements.is_empty(), "{} unexplained disagreements", disagreements.len());
}
