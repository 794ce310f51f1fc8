//! The kernel's SFrame table, converted from the compiler's `.eh_frame` after linking.
//!
//! The target emits call-frame information (CFI) for every compiled function; no assembler
//! here writes a usable AArch64 SFrame section for this kernel (the shadow call stack's
//! `DW_CFA_val_expression` is refused or dropped), so xtask converts it, as objtool generates
//! ORC tables. The linker script keeps `.eh_frame` in a segment nothing loads and reserves
//! `.sframe` (zeros) in the loaded read-only data, after everything the code's layout depends
//! on; [`embed`] fills `.sframe` in place, so no address moves, and fails the build when the
//! table outgrows the reservation. The kernel reads it (`stacktrace`'s `sframe` mode).
//!
//! Conversion, per FDE row (gimli evaluates the CFI): the CFA is SP or x29 plus an offset; x30
//! (RA) and x29 (FP) are in their registers or at CFA-relative slots; the PAC state is
//! `DW_CFA_AARCH64_negate_ra_state`'s pseudo-register. x18's shadow-stack expression and the
//! other callee-saved registers are not needed by a walker that only follows SP, FP and RA.
//! Consecutive rows that say the same thing are merged. A function with any row the format
//! cannot express (another CFA register, an RA or FP rule other than a slot or its register,
//! FP saved without RA) is left out whole and counted.
//!
//! One LLVM quirk is rewritten: in shadow-call-stack epilogues (`ldp x29, x30, [sp, #16];
//! add sp, sp, #32; ldr x30, [x18, #-8]!; autiasp; ret`) the rows after the `add sp` still say
//! RA and FP are saved at CFA-8 and CFA-16 with CFA = SP, i.e. below SP, in memory an interrupt
//! may overwrite. By then both are in their registers (the `ldp` ran), so such a row becomes
//! CFA = SP + 0, RA in x30, FP in x29.
//!
//! [`validate`] then replays the CFI at every instruction of every function against the table
//! as the kernel's walker reads it (`unwind::SFrameTable`): they must agree everywhere except the
//! rewritten rows, where it checks that the CFI's slots were below SP and that the instructions
//! before the row loaded x29 and x30 and raised SP.

use std::collections::BTreeMap;

use ftrace::CallSite;
use gimli::{
    BaseAddresses, CfaRule, CieOrFde, EhFrame, LittleEndian, Register, RegisterRule, UnwindContext, UnwindSection,
    UnwindTableRow,
};
use object::{Object, ObjectSection, ObjectSymbol};
use unwind::sframe::encode::{self, Function};
use unwind::{CfaBase, SFrameTable, UnwindRow};

use crate::Failure;

const SP: Register = Register(31);
const FP: Register = Register(29);
const RA: Register = Register(30);
/// DWARF's AArch64 pseudo-register for the return address's signing state.
const RA_SIGN_STATE: Register = gimli::AArch64::RA_SIGN_STATE;

/// What one CFI row says, in the terms of an SFrame row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    Row(UnwindRow),
    /// Something SFrame v2 cannot say (the reason, for the report).
    Inexpressible(&'static str),
}

/// A CFI row in SFrame terms: `None` when the format cannot say it.
fn shape<T: gimli::ReaderOffset>(row: &UnwindTableRow<T>) -> Shape {
    let (cfa_base, cfa_offset) = match row.cfa() {
        CfaRule::RegisterAndOffset { register, offset } if *register == SP => (CfaBase::StackPointer, *offset),
        CfaRule::RegisterAndOffset { register, offset } if *register == FP => (CfaBase::FramePointer, *offset),
        _ => return Shape::Inexpressible("CFA is not SP or x29 plus an offset"),
    };
    let Ok(cfa_offset) = i32::try_from(cfa_offset) else {
        return Shape::Inexpressible("CFA offset beyond 32 bits");
    };
    // Undefined is also what gimli says for a register no instruction mentions: for x29 and
    // x30 that means "still in the register" (LLVM never emits DW_CFA_undefined for them).
    let location = |rule: RegisterRule<T>| match rule {
        RegisterRule::Undefined | RegisterRule::SameValue => Ok(None),
        RegisterRule::Offset(offset) => i32::try_from(offset).map(Some).map_err(|_| "slot offset beyond 32 bits"),
        _ => Err("RA or FP rule other than a CFA-relative slot or its register"),
    };
    let ra_offset = match location(row.register(RA)) {
        Ok(offset) => offset,
        Err(reason) => return Shape::Inexpressible(reason),
    };
    let fp_offset = match location(row.register(FP)) {
        Ok(offset) => offset,
        Err(reason) => return Shape::Inexpressible(reason),
    };
    if fp_offset.is_some() && ra_offset.is_none() {
        return Shape::Inexpressible("FP saved without RA (no v2 slot for it)");
    }
    let ra_signed = match row.register(RA_SIGN_STATE) {
        RegisterRule::Undefined => false,
        RegisterRule::Constant(state) => state & 1 == 1,
        _ => return Shape::Inexpressible("RA sign state not a constant"),
    };
    Shape::Row(UnwindRow { cfa_base, cfa_offset, ra_offset, fp_offset, ra_signed })
}

/// Whether `row` places a saved slot below SP (the SCS-epilogue quirk) and what it becomes.
fn rewritten(row: &UnwindRow) -> Option<UnwindRow> {
    if row.cfa_base != CfaBase::StackPointer {
        return None;
    }
    let below_sp = |slot: Option<i32>| slot.is_some_and(|offset| i64::from(row.cfa_offset) + i64::from(offset) < 0);
    if !below_sp(row.ra_offset) && !below_sp(row.fp_offset) {
        return None;
    }
    Some(UnwindRow { ra_offset: None, fp_offset: None, ..*row })
}

/// One FDE of the CFI.
#[derive(Clone, Debug)]
struct CfiFunction {
    start: u64,
    size: u64,
    /// Offset of the FDE in `.eh_frame` (to evaluate it again).
    offset: usize,
}

/// The converter's result and counts.
#[derive(Debug, Default)]
pub struct Conversion {
    functions: Vec<Function>,
    cfi: Vec<CfiFunction>,
    /// FDEs in `.eh_frame` (zero-length ones included).
    pub fdes: usize,
    /// Rows gimli evaluates from them.
    pub cfi_rows: usize,
    /// FREs written (after merging equal neighbours).
    pub table_rows: usize,
    /// SCS-epilogue rows rewritten.
    pub rewritten: usize,
    /// Rows SFrame v2 cannot express.
    pub inexpressible_rows: usize,
    /// The functions left out because of them (start, first reason).
    pub inexpressible_functions: Vec<(u64, &'static str)>,
    /// Functions without CFI whose rows [`describe_thunks`] derived from their instructions
    /// (start, size): the sanitizer's check thunks and their shared tail.
    pub described: Vec<(u64, u32)>,
    /// Function symbols whose call slot got [`add_call_slot_rows`]' row.
    pub call_slots: Vec<u64>,
}

fn cfi_error(error: gimli::Error) -> Failure {
    Failure { status: 1, message: format!(".eh_frame: {error}") }
}

fn eh_frame(data: &[u8]) -> EhFrame<gimli::EndianSlice<'_, LittleEndian>> {
    let mut section = EhFrame::new(data, LittleEndian);
    section.set_address_size(8);
    // DW_CFA 0x2d is AArch64's negate_ra_state (SPARC's window_save elsewhere).
    section.set_vendor(gimli::Vendor::AArch64);
    section
}

/// Converts the `.eh_frame` bytes `data`, loaded at `address`, into SFrame functions.
pub fn convert(data: &[u8], address: u64) -> Result<Conversion, Failure> {
    let section = eh_frame(data);
    let bases = BaseAddresses::default().set_eh_frame(address);
    let mut context = UnwindContext::new();
    let mut conversion = Conversion::default();
    let mut entries = section.entries(&bases);
    while let Some(entry) = entries.next().map_err(cfi_error)? {
        let CieOrFde::Fde(partial) = entry else { continue };
        let fde = partial.parse(EhFrame::cie_from_offset).map_err(cfi_error)?;
        conversion.fdes += 1;
        if fde.len() == 0 {
            continue;
        }
        let (start, size) = (fde.initial_address(), fde.len());
        let size_u32 =
            u32::try_from(size).map_err(|_| Failure::usage(format!("function at {start:#x}: {size} bytes")))?;
        let mut rows: Vec<(u32, UnwindRow)> = Vec::new();
        let mut inexpressible = None;
        let mut table = fde.rows(&section, &bases, &mut context).map_err(cfi_error)?;
        while let Some(row) = table.next_row().map_err(cfi_error)? {
            conversion.cfi_rows += 1;
            let offset = (row.start_address() - start) as u32;
            match shape(row) {
                Shape::Inexpressible(reason) => {
                    conversion.inexpressible_rows += 1;
                    inexpressible.get_or_insert(reason);
                }
                Shape::Row(row) => {
                    let row = match rewritten(&row) {
                        Some(rewrite) => {
                            conversion.rewritten += 1;
                            rewrite
                        }
                        None => row,
                    };
                    if rows.last().is_none_or(|(_, last)| *last != row) {
                        rows.push((offset, row));
                    }
                }
            }
        }
        let offset = fde.offset();
        conversion.cfi.push(CfiFunction { start, size, offset });
        match inexpressible {
            Some(reason) => conversion.inexpressible_functions.push((start, reason)),
            None => {
                conversion.table_rows += rows.len();
                conversion.functions.push(Function { start, size: size_u32, rows });
            }
        }
    }
    conversion.cfi.sort_by_key(|function| function.start);
    Ok(conversion)
}

/// What the validator found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Validation {
    /// Instruction addresses replayed.
    pub addresses: usize,
    /// Of which inside rewritten rows (rewrite checked).
    pub rewritten_addresses: usize,
    /// Returns into call slots looked up (`E + 15`) and found with [`call_slot_row`].
    pub call_slot_returns: usize,
}

/// The stack pointer's register number in a load's base field.
const SP_BASE: u32 = 31;

/// The registers a 64-bit integer LDP (signed offset, pre- or post-indexed) loads, its base,
/// and whether it is post-indexed.
fn ldp_x(word: u32) -> Option<([u32; 2], u32, bool)> {
    let form = word & 0xffc0_0000;
    if form != 0xa8c0_0000 && form != 0xa940_0000 && form != 0xa9c0_0000 {
        return None;
    }
    Some(([word & 31, (word >> 10) & 31], (word >> 5) & 31, form == 0xa8c0_0000))
}

/// The register a 64-bit integer LDR (unsigned offset, pre- or post-indexed) loads, its base,
/// and whether it is post-indexed.
fn ldr_x(word: u32) -> Option<(u32, u32, bool)> {
    if word & 0xffc0_0000 == 0xf940_0000 {
        return Some((word & 31, (word >> 5) & 31, false));
    }
    if word & 0xffe0_0400 == 0xf840_0400 {
        return Some((word & 31, (word >> 5) & 31, (word >> 11) & 1 == 0));
    }
    None
}

/// `add sp, sp, #imm` (64-bit ADD immediate, Rd = Rn = SP), or a load post-indexed on SP
/// (`ldp x29, x30, [sp], #32`, `ldr x30, [sp], #16`): what frees a frame.
fn raises_sp(word: u32) -> bool {
    word & 0xff80_03ff == 0x9100_03ff
        || ldp_x(word).is_some_and(|(_, base, post)| base == SP_BASE && post)
        || ldr_x(word).is_some_and(|(_, base, post)| base == SP_BASE && post)
}

/// Whether `word` loads register `register` from the stack (a frame's save slot).
fn loads_from_stack(word: u32, register: u32) -> bool {
    ldp_x(word).is_some_and(|(registers, base, _)| base == SP_BASE && registers.contains(&register))
        || ldr_x(word).is_some_and(|(loaded, base, _)| base == SP_BASE && loaded == register)
}

/// Replays the CFI (`.eh_frame` bytes `data` at `address`) at every instruction of every
/// function against `table` (an SFrame section at `table_address`). `instruction` reads the
/// kernel's text, to check each rewrite.
pub fn validate(
    conversion: &Conversion,
    data: &[u8],
    address: u64,
    table: &[u8],
    table_address: u64,
    instruction: impl Fn(u64) -> Option<u32>,
) -> Result<Validation, Failure> {
    let fail = |message: String| Failure { status: 1, message: format!("sframe validator: {message}") };
    let sframe = SFrameTable::new(table, table_address).map_err(|error| fail(format!("table: {error:?}")))?;
    let rows = sframe.check().map_err(|error| fail(format!("table: {error:?}")))?;
    if rows != conversion.table_rows || sframe.len() != conversion.functions.len() {
        return Err(fail(format!(
            "table has {} functions and {rows} rows, the conversion {} and {}",
            sframe.len(),
            conversion.functions.len(),
            conversion.table_rows
        )));
    }
    let left_out: BTreeMap<u64, &str> = conversion.inexpressible_functions.iter().copied().collect();
    let section = eh_frame(data);
    let bases = BaseAddresses::default().set_eh_frame(address);
    let mut context = UnwindContext::new();
    let mut validation = Validation::default();
    for function in &conversion.cfi {
        let fde = section
            .fde_from_offset(&bases, gimli::EhFrameOffset(function.offset), EhFrame::cie_from_offset)
            .map_err(cfi_error)?;
        let expressible = !left_out.contains_key(&function.start);
        for pc in (function.start..function.start + function.size).step_by(4) {
            let found = sframe.find(pc).map_err(|error| fail(format!("lookup at {pc:#x}: {error:?}")))?;
            let row = fde.unwind_info_for_address(&section, &bases, &mut context, pc).map_err(cfi_error)?;
            validation.addresses += 1;
            if !expressible {
                if found.is_some() {
                    return Err(fail(format!("{pc:#x}: a left-out function has rows")));
                }
                continue;
            }
            let expected = match shape(row) {
                Shape::Row(row) => row,
                Shape::Inexpressible(reason) => return Err(fail(format!("{pc:#x}: {reason}, yet converted"))),
            };
            let Some(found) = found else {
                return Err(fail(format!("{pc:#x}: the CFI has a row, the table none")));
            };
            match rewritten(&expected) {
                None if found == expected => {}
                None => return Err(fail(format!("{pc:#x}: CFI says {expected:?}, the table {found:?}"))),
                Some(rewrite) => {
                    if found != rewrite {
                        return Err(fail(format!("{pc:#x}: rewrite of {expected:?} is {found:?}")));
                    }
                    check_rewrite(&expected, row.start_address(), function.start, &instruction)
                        .map_err(|message| fail(format!("{pc:#x}: {message}")))?;
                    validation.rewritten_addresses += 1;
                }
            }
        }
    }
    // The call slots: the replay above found the CFI's rows at the slot's instruction and at
    // its return address; the return's lookup, a byte before it, finds the trampoline's frame.
    for &symbol in &conversion.call_slots {
        let pc = symbol + u64::from(AFTER_CALL_SLOT) - 1;
        let found = sframe.find(pc).map_err(|error| fail(format!("lookup at {pc:#x}: {error:?}")))?;
        if found != Some(call_slot_row()) {
            return Err(fail(format!("{pc:#x}: the call slot's return finds {found:?}")));
        }
        validation.call_slot_returns += 1;
    }
    // Nothing outside the CFI: every table function is an FDE's range or a described thunk.
    let mut ranges: BTreeMap<u64, u64> =
        conversion.cfi.iter().map(|function| (function.start, function.size)).collect();
    ranges.extend(conversion.described.iter().map(|(start, size)| (*start, u64::from(*size))));
    for index in 0..sframe.len() {
        let function = sframe.function(index).expect("index below len");
        if ranges.get(&function.start) != Some(&u64::from(function.size)) {
            return Err(fail(format!("table function at {:#x} is no FDE's range", function.start)));
        }
    }
    Ok(validation)
}

/// How far back from an epilogue's SP increment [`check_rewrite`] looks for the restores.
const EPILOGUE_SEARCH: u64 = 32;

/// A branch (B, BL, B.cond, CBZ/CBNZ, TBZ/TBNZ, or BR/BLR/RET and the other register
/// branches): the end of the straight-line run before it.
fn is_branch(word: u32) -> bool {
    word & 0x7c00_0000 == 0x1400_0000
        || word & 0xff00_0010 == 0x5400_0000
        || word & 0x7e00_0000 == 0x3400_0000
        || word & 0x7e00_0000 == 0x3600_0000
        || word & 0xfe00_0000 == 0xd600_0000
}

/// A hint-space instruction (`nop`, `autiasp`, `autibsp`, `bti`...).
fn is_hint(word: u32) -> bool {
    word & 0xffff_f01f == 0xd503_201f
}

/// A rewritten row starting at `row_start`, for `original` (its CFI): going back over the
/// epilogue's tail (the shadow stack's pop, `autiasp` and other hints), the first other
/// instruction frees the frame (raises SP), and each register whose slot the CFI still places
/// below SP (x30, x29) was loaded from the stack in the straight-line run that ends with it
/// ([`EPILOGUE_SEARCH`] instructions at most, back to a branch or the function's start). With
/// frame pointers that load is the `ldp x29, x30` just before; without them (variant `nofp`)
/// x29 is an ordinary callee-saved register, and LLVM schedules the restores among the
/// function's last stores, several instructions up.
fn check_rewrite(
    original: &UnwindRow,
    row_start: u64,
    function_start: u64,
    instruction: &impl Fn(u64) -> Option<u32>,
) -> Result<(), String> {
    let mut at = row_start;
    let raise = loop {
        at = at.checked_sub(4).filter(|at| *at >= function_start).ok_or("no SP increment before the row")?;
        let word = instruction(at).ok_or_else(|| format!("no text at {at:#x}"))?;
        if word == unwind::SCS_POP || is_hint(word) {
            continue;
        }
        if !raises_sp(word) {
            return Err(format!("rewritten row not after an SP increment ({word:#010x} at {at:#x})"));
        }
        break at;
    };
    let below_sp =
        |slot: Option<i32>| slot.is_some_and(|offset| i64::from(original.cfa_offset) + i64::from(offset) < 0);
    let words: Vec<u32> = (0..EPILOGUE_SEARCH)
        .map_while(|back| raise.checked_sub(4 * back).filter(|at| *at >= function_start))
        .map_while(instruction)
        .take_while(|word| !is_branch(*word))
        .collect();
    for (slot, register, name) in [(original.ra_offset, 30, "x30"), (original.fp_offset, 29, "x29")] {
        if below_sp(slot) && !words.iter().any(|word| loads_from_stack(*word, register)) {
            return Err(format!("no load of {name} before the SP increment at {raise:#x}"));
        }
    }
    Ok(())
}

/// The frame a row derived from instructions tracks: CFA = SP + `cfa`, RA and FP at
/// CFA-relative slots or (`None`) in x30 and x29.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct TrackedFrame {
    cfa: i32,
    ra: Option<i32>,
    fp: Option<i32>,
}

impl TrackedFrame {
    const ENTRY: Self = Self { cfa: 0, ra: None, fp: None };
    /// What a check thunk's failure path leaves for `__hwasan_tag_mismatch`: 256 bytes reserved,
    /// x29 and x30 stored at `[sp, #232]` (LLVM's `HWAddressSanitizer` memaccess thunks).
    const TAG_MISMATCH: Self = Self { cfa: 256, ra: Some(-16), fp: Some(-24) };

    fn row(&self) -> UnwindRow {
        UnwindRow {
            cfa_base: CfaBase::StackPointer,
            cfa_offset: self.cfa,
            ra_offset: self.ra,
            fp_offset: self.fp,
            ra_signed: false,
        }
    }

    /// The frame after `word`, or why it cannot be followed: every instruction that writes SP
    /// must be a 64-bit STP or LDP on SP (the thunks' only kind), x29 and x30 are saved and
    /// restored as a pair, and no call may clobber x30 while it holds the return address.
    fn after(self, word: u32) -> Result<Self, String> {
        let form = word & 0xffc0_0000;
        let pair = matches!(form, 0xa880_0000 | 0xa980_0000 | 0xa900_0000 | 0xa8c0_0000 | 0xa9c0_0000 | 0xa940_0000);
        if pair && (word >> 5) & 31 == SP_BASE {
            let imm = (((word >> 15) & 0x7f) as i32) << 25 >> 25;
            let imm = imm * 8;
            let registers = (word & 31, (word >> 10) & 31);
            let load = form & 0x0040_0000 != 0;
            let mut next = self;
            // Where the pair is, relative to the CFA, and SP's change.
            let slot = match form & 0x0180_0000 {
                0x0180_0000 => {
                    next.cfa -= imm;
                    -next.cfa
                }
                0x0100_0000 => imm - self.cfa,
                _ => {
                    next.cfa -= imm;
                    -self.cfa
                }
            };
            if next.cfa < 0 {
                return Err(format!("{word:#010x} frees more than the frame"));
            }
            let touches = |register| registers.0 == register || registers.1 == register;
            match (load, registers) {
                (false, (29, 30)) => {
                    next.fp = Some(slot);
                    next.ra = Some(slot + 8);
                }
                (true, (29, 30)) => {
                    next.fp = None;
                    next.ra = None;
                }
                _ if load && (touches(29) || touches(30)) => {
                    return Err(format!("{word:#010x} loads x29 or x30 alone"));
                }
                _ => {}
            }
            return Ok(next);
        }
        let writes_sp = (word & 0x7f80_0000 == 0x1100_0000 || word & 0x7f80_0000 == 0x5100_0000) && word & 31 == 31
            || (word & 0x3a00_0000 == 0x2800_0000 && (word >> 23) & 1 == 1 && (word >> 5) & 31 == SP_BASE)
            || (word & 0x3b20_0400 == 0x3800_0400 && (word >> 5) & 31 == SP_BASE);
        if writes_sp {
            return Err(format!("{word:#010x} writes SP in a way the description does not follow"));
        }
        let call = word & 0xfc00_0000 == 0x9400_0000 || word & 0xffff_fc1f == 0xd63f_0000;
        if call && self.ra.is_none() {
            return Err(format!("{word:#010x} calls while x30 holds the return address"));
        }
        Ok(self)
    }
}

/// `ret`.
const RET: u32 = 0xd65f_03c0;

/// Whether `word` is an unconditional `b` or `br` (a tail call: the end of a thunk).
fn is_tail_call(word: u32) -> bool {
    word & 0xfc00_0000 == 0x1400_0000 || word & 0xffff_fc1f == 0xd61f_0000
}

/// The rows of code without CFI at `start`, from its instructions: the frame starts as `entry`
/// and follows each instruction ([`TrackedFrame::after`]); the code ends after its first tail
/// call (`until_ret` false) or its first `ret`, before `limit`.
fn describe(
    start: u64,
    limit: u64,
    entry: TrackedFrame,
    until_ret: bool,
    instruction: &impl Fn(u64) -> Option<u32>,
) -> Result<Function, String> {
    let mut frame = entry;
    let mut rows = vec![(0, entry.row())];
    let mut at = start;
    loop {
        if at >= limit {
            return Err(format!("no end before {limit:#x}"));
        }
        let word = instruction(at).ok_or_else(|| format!("no text at {at:#x}"))?;
        frame = frame.after(word).map_err(|message| format!("{at:#x}: {message}"))?;
        at += 4;
        let end = if until_ret { word == RET } else { is_tail_call(word) };
        if end {
            break;
        }
        if frame.row() != rows.last().expect("one row").1 {
            rows.push(((at - start) as u32, frame.row()));
        }
    }
    Ok(Function { start, size: (at - start) as u32, rows })
}

/// Rows for the code the compiler emits without CFI on every instrumented build: the sanitizer's
/// check thunks (`__hwasan_check_*`, LLVM-generated, one per register and access kind: a tag
/// compare and `ret`, or 256 bytes reserved, x29 and x30 saved and a tail call) and their shared
/// tail `__hwasan_tag_mismatch` (kernel/src/mm/kasan/abi.rs, entered with that frame). Their
/// symbols have no size: each ends at its tail call (the thunks) or its `ret` (the tail),
/// before the next symbol. `symbols` are the text symbols (name, address), any order.
pub fn describe_thunks(
    conversion: &mut Conversion,
    symbols: &[(&str, u64)],
    instruction: impl Fn(u64) -> Option<u32>,
) -> Result<(), Failure> {
    // Compiler-local labels (`.Ltmp`) and mapping symbols (`$x`, `$d`) start no function.
    let mut starts: Vec<u64> = symbols
        .iter()
        .filter(|(name, _)| !name.starts_with(".L") && !name.starts_with('$'))
        .map(|(_, address)| *address)
        .collect();
    starts.sort_unstable();
    starts.dedup();
    let covered: Vec<(u64, u64)> = conversion.cfi.iter().map(|function| (function.start, function.size)).collect();
    let mut seen = std::collections::BTreeSet::new();
    for (name, address) in symbols {
        let (entry, until_ret) = if name.starts_with("__hwasan_check_") {
            (TrackedFrame::ENTRY, false)
        } else if *name == "__hwasan_tag_mismatch" || *name == "__hwasan_tag_mismatch_v2" {
            (TrackedFrame::TAG_MISMATCH, true)
        } else {
            continue;
        };
        if !seen.insert(*address) {
            continue;
        }
        let limit = starts.iter().copied().find(|start| start > address).unwrap_or(u64::MAX);
        let function = describe(*address, limit, entry, until_ret, &instruction)
            .map_err(|message| Failure { status: 1, message: format!("sframe: {name}: {message}") })?;
        let end = function.start + u64::from(function.size);
        if covered.iter().any(|(start, size)| *start < end && function.start < start + size) {
            return Err(Failure { status: 1, message: format!("sframe: {name} overlaps a function with CFI") });
        }
        conversion.table_rows += function.rows.len();
        conversion.described.push((function.start, function.size));
        conversion.functions.push(function);
    }
    Ok(())
}

/// Where a traced function's call-slot row starts, from its symbol: one byte past the call
/// slot's `bl`, so that the instruction itself (an interrupted PC, looked up as is) keeps the
/// entry row and only the return from the trampoline (`E + 16`, looked up at `E + 15`) finds
/// this one.
const CALL_SLOT_ROW: u32 = (CallSite::CALL_OFFSET - CallSite::FUNCTION_OFFSET) as u32 + 1;
/// Where the function's own rows resume: the call slot's return address, from the symbol.
const AFTER_CALL_SLOT: u32 = (CallSite::CALL_OFFSET + 4 - CallSite::FUNCTION_OFFSET) as u32;

/// The frame a return from the ftrace trampoline into a call slot unwinds: the 32 bytes the
/// trampoline built for the traced function (`CallSite::CALLER_FRAME`), its frame record (x29,
/// and x9: the function's return address) at the bottom. The trampoline's CFI ends its own
/// frame just below them (kernel/src/ftrace/trampoline.rs).
pub fn call_slot_row() -> UnwindRow {
    let frame = CallSite::CALLER_FRAME as i32;
    UnwindRow {
        cfa_base: CfaBase::StackPointer,
        cfa_offset: frame,
        ra_offset: Some(8 - frame),
        fp_offset: Some(-frame),
        ra_signed: false,
    }
}

/// The row a function has at `offset` (the last row starting at or before it).
fn row_at(rows: &[(u32, UnwindRow)], offset: u32) -> Option<UnwindRow> {
    rows.iter().rev().find(|(start, _)| *start <= offset).map(|(_, row)| *row)
}

/// Rows for the call slots of the functions with a patchable entry at `entries` (each an `E`
/// of `__patchable_function_entries`, the symbol at `E + 8`). With ftrace on, the slot's `bl`
/// enters the trampoline with the function's return address in x9, which no row of the
/// function's CFI can say: the return into the slot is a frame of its own, built by the
/// trampoline ([`call_slot_row`]). The function's CFI must still be in its entry state (CFA =
/// SP, nothing saved) through the slot, as the compiler leaves a patchable entry.
pub fn add_call_slot_rows(conversion: &mut Conversion, entries: &[u64]) -> Result<(), Failure> {
    let fail = |message: String| Failure { status: 1, message: format!("sframe: {message}") };
    let by_start: BTreeMap<u64, usize> =
        conversion.functions.iter().enumerate().map(|(index, function)| (function.start, index)).collect();
    let entry_row = UnwindRow {
        cfa_base: CfaBase::StackPointer,
        cfa_offset: 0,
        ra_offset: None,
        fp_offset: None,
        ra_signed: false,
    };
    for &entry in entries {
        let symbol = entry + CallSite::FUNCTION_OFFSET;
        // A patchable function without rows (hand-written, or left out) gets none here either.
        let Some(&index) = by_start.get(&symbol) else { continue };
        let function = &mut conversion.functions[index];
        if function.size <= AFTER_CALL_SLOT {
            return Err(fail(format!("function at {symbol:#x} ends inside its call slot")));
        }
        if function.rows.iter().any(|(start, _)| (CALL_SLOT_ROW..AFTER_CALL_SLOT).contains(start))
            || row_at(&function.rows, CALL_SLOT_ROW - 1) != Some(entry_row)
        {
            return Err(fail(format!("function at {symbol:#x}: its CFI is not the entry's through the call slot")));
        }
        let after = row_at(&function.rows, AFTER_CALL_SLOT).expect("a row at 0");
        let at = function.rows.partition_point(|(start, _)| *start < CALL_SLOT_ROW);
        let mut added = vec![(CALL_SLOT_ROW, call_slot_row())];
        if function.rows.get(at).is_none_or(|(start, _)| *start != AFTER_CALL_SLOT) {
            added.push((AFTER_CALL_SLOT, after));
        }
        conversion.table_rows += added.len();
        function.rows.splice(at..at, added);
        conversion.call_slots.push(symbol);
    }
    Ok(())
}

/// The entries `E` of `__patchable_function_entries` (none in a build without them).
fn patchable_entries(file: &object::File) -> Vec<u64> {
    let Some(section) = file.section_by_name("__patchable_function_entries") else { return Vec::new() };
    let Ok(data) = section.data() else { return Vec::new() };
    data.chunks_exact(8).map(|chunk| u64::from_le_bytes(chunk.try_into().expect("8 bytes"))).collect()
}

/// Fills the `.sframe` section of the ELF image `elf` in place from its `.eh_frame`, validates
/// the table against the CFI and prints the counts.
pub fn embed(elf: &mut [u8]) -> Result<Conversion, Failure> {
    let missing = |name: &str| Failure { status: 1, message: format!("kernel ELF has no {name} section (kernel.ld)") };
    let (range, table, conversion) = {
        let file = object::File::parse(&*elf).map_err(|error| Failure::usage(format!("kernel ELF: {error}")))?;
        let eh = file.section_by_name(".eh_frame").ok_or_else(|| missing(".eh_frame"))?;
        let sframe = file.section_by_name(".sframe").ok_or_else(|| missing(".sframe"))?;
        let (offset, size) = sframe.file_range().ok_or_else(|| missing(".sframe (PROGBITS)"))?;
        let data = eh.data().map_err(|error| Failure::usage(format!(".eh_frame: {error}")))?;
        let text = |at: u64| {
            file.sections()
                .find(|section| (section.address()..section.address() + section.size()).contains(&at))
                .and_then(|section| {
                    let data = section.data().ok()?;
                    let index = (at - section.address()) as usize;
                    Some(u32::from_le_bytes(data.get(index..index + 4)?.try_into().ok()?))
                })
        };
        let mut conversion = convert(data, eh.address())?;
        // Every symbol in executable code: `global_asm!` labels without `.type` (the tail) are
        // untyped, not functions.
        let code: Vec<(u64, u64)> = file
            .sections()
            .filter(|section| section.kind() == object::SectionKind::Text)
            .map(|section| (section.address(), section.address() + section.size()))
            .collect();
        let symbols: Vec<(&str, u64)> = file
            .symbols()
            .filter(|symbol| code.iter().any(|(start, end)| (*start..*end).contains(&symbol.address())))
            .filter_map(|symbol| Some((symbol.name().ok()?, symbol.address())))
            .collect();
        describe_thunks(&mut conversion, &symbols, text)?;
        add_call_slot_rows(&mut conversion, &patchable_entries(&file))?;
        let table = encode::table(&conversion.functions, sframe.address())
            .map_err(|error| Failure { status: 1, message: format!("sframe: {error:?}") })?;
        if table.len() as u64 > size {
            return Err(Failure {
                status: 1,
                message: format!(
                    "SFrame table needs {} bytes, .sframe holds {size}: grow it in kernel.ld",
                    table.len()
                ),
            });
        }
        let validation = validate(&conversion, data, eh.address(), &table, sframe.address(), text)?;
        eprintln!(
            "xtask: sframe: {} FDEs, {} CFI rows -> {} functions, {} rows ({} SCS-epilogue rows rewritten, {} rows \
             inexpressible in {} functions, {} thunks described from their instructions, {} call slots), {} bytes \
             of {size}; validator: {} addresses agree with the CFI, {} in rewritten rows checked, {} call-slot \
             returns checked",
            conversion.fdes,
            conversion.cfi_rows,
            conversion.functions.len(),
            conversion.table_rows,
            conversion.rewritten,
            conversion.inexpressible_rows,
            conversion.inexpressible_functions.len(),
            conversion.described.len(),
            conversion.call_slots.len(),
            table.len(),
            validation.addresses,
            validation.rewritten_addresses,
            validation.call_slot_returns,
        );
        for (start, reason) in conversion.inexpressible_functions.iter().take(5) {
            eprintln!("xtask: sframe: function at {start:#x} left out: {reason}");
        }
        ((offset as usize)..(offset + size) as usize, table, conversion)
    };
    let section = &mut elf[range];
    section[..table.len()].copy_from_slice(&table);
    section[table.len()..].fill(0);
    Ok(conversion)
}

#[cfg(test)]
mod tests {
    use super::*;

    const EH_FRAME: u64 = 0xffff_ff80_4020_0000;
    const TEXT: u64 = 0xffff_ff80_4008_0000;
    const SFRAME: u64 = 0xffff_ff80_4030_0000;

    /// A CIE as LLVM writes it for AArch64 (code alignment 1, data alignment -4, RA column 30,
    /// pc-relative sdata4 pointers, CFA = SP), then one FDE per `(start, size, instructions)`.
    fn eh_frame(functions: &[(u64, u32, &[u8])]) -> Vec<u8> {
        let mut section = Vec::new();
        let cie = [1, b'z', b'R', 0, 1, 0x7c, 30, 1, 0x1b, 0x0c, 31, 0];
        let mut body = vec![0, 0, 0, 0];
        body.extend_from_slice(&cie);
        while !body.len().is_multiple_of(4) {
            body.push(0);
        }
        section.extend_from_slice(&(body.len() as u32).to_le_bytes());
        section.extend_from_slice(&body);
        for (start, size, instructions) in functions {
            let field = section.len() + 4;
            let mut body = (field as u32).to_le_bytes().to_vec();
            let pc_begin = (*start as i64 - (EH_FRAME as i64 + field as i64 + 4)) as i32;
            body.extend_from_slice(&pc_begin.to_le_bytes());
            body.extend_from_slice(&size.to_le_bytes());
            body.push(0);
            body.extend_from_slice(instructions);
            while !body.len().is_multiple_of(4) {
                body.push(0);
            }
            section.extend_from_slice(&(body.len() as u32).to_le_bytes());
            section.extend_from_slice(&body);
        }
        section
    }

    /// `paciasp; str x30, [x18], #8; sub sp, sp, #32; stp x29, x30, [sp, #16];
    /// add x29, sp, #16; bl; ldp x29, x30, [sp, #16]; add sp, sp, #32; ldr x30, [x18, #-8]!;
    /// autiasp; ret` and its CFI as LLVM writes it (the rows after `add sp` keep the slots).
    const SCS_FUNCTION: [u32; 11] = [
        0xd503_233f,
        unwind::SCS_PUSH,
        0xd100_83ff,
        0xa901_7bfd,
        0x9100_43fd,
        0x9400_0000,
        0xa941_7bfd,
        0x9100_83ff,
        unwind::SCS_POP,
        0xd503_23bf,
        0xd65f_03c0,
    ];
    const SCS_CFI: &[u8] = &[
        0x44, 0x2d, // paciasp: signed
        0x44, 0x16, 18, 2, 0x82, 0x78, // SCS push: x18 = x18 - 8
        0x44, 0x0e, 32, // sub sp
        0x44, 0x9e, 2, 0x9d, 4, // stp: x30 at CFA-8, x29 at CFA-16
        0x44, 0x0c, 29, 16, // add x29
        0x44, 0x0c, 31, 32, // before the epilogue: CFA = SP + 32
        0x48, 0x0e, 0, // after `add sp`: CFA = SP, slots unchanged (below SP)
        0x44, 0xd2, // after the SCS pop: x18 restored
        0x44, 0x2d, 0xde, 0xdd, // after autiasp: unsigned, x30 and x29 restored
    ];
    /// CFA = x19 + 16 from its second instruction: not expressible.
    const ODD_CFI: &[u8] = &[0x44, 0x0c, 19, 16];

    fn text(at: u64) -> Option<u32> {
        let index = usize::try_from(at.checked_sub(TEXT)? / 4).ok()?;
        Some(SCS_FUNCTION.get(index).copied().unwrap_or(0xd503_201f))
    }

    fn sample() -> Vec<u8> {
        eh_frame(&[(TEXT, 44, SCS_CFI), (TEXT + 0x40, 16, ODD_CFI), (TEXT + 0x80, 8, &[]), (TEXT + 0x90, 0, &[])])
    }

    /// `__hwasan_check_x0_67043328` as LLVM emits it (a tag compare and `ret`; on a mismatch,
    /// 256 bytes reserved, x0/x1 and x29/x30 saved, a tail call), and `__hwasan_tag_mismatch`
    /// (kernel/src/mm/kasan/abi.rs) entered with that frame.
    const CHECK_THUNK: [u32; 12] = [
        0x9344_dc10,
        0x3870_6930,
        0xeb40_e21f,
        0x5400_0041,
        0xd65f_03c0,
        0xd378_fc11,
        0xf103_fe3f,
        0x54ff_ffa0,
        0xa9b0_07e0,
        0xa90e_fbfd,
        0xd280_0001,
        0x17ff_56dc,
    ];
    const TAG_MISMATCH: [u32; 20] = [
        0xa901_0fe2,
        0xa902_17e4,
        0xa903_1fe6,
        0xa904_27e8,
        0xa905_2fea,
        0xa906_37ec,
        0xa907_3fee,
        0x9103_a3fd,
        0xaa1e_03e2,
        0x9400_01ad,
        0xa941_0fe2,
        0xa942_17e4,
        0xa943_1fe6,
        0xa944_27e8,
        0xa945_2fea,
        0xa946_37ec,
        0xa947_3fee,
        0xa94e_fbfd,
        0xa8d0_07e0,
        0xd65f_03c0,
    ];

    fn words_at(words: &[u32], start: u64) -> impl Fn(u64) -> Option<u32> + '_ {
        move |at| words.get(usize::try_from(at.checked_sub(start)? / 4).ok()?).copied()
    }

    #[test]
    fn the_sanitizer_thunks_are_described_from_their_instructions() {
        let sp = |cfa_offset, ra_offset, fp_offset| UnwindRow {
            cfa_base: CfaBase::StackPointer,
            cfa_offset,
            ra_offset,
            fp_offset,
            ra_signed: false,
        };
        let thunk = describe(TEXT, u64::MAX, TrackedFrame::ENTRY, false, &words_at(&CHECK_THUNK, TEXT)).unwrap();
        assert_eq!(thunk.size, 48);
        assert_eq!(thunk.rows, [(0, UnwindRow::ENTRY), (36, sp(256, None, None)), (40, sp(256, Some(-16), Some(-24)))]);
        let tail = describe(TEXT, u64::MAX, TrackedFrame::TAG_MISMATCH, true, &words_at(&TAG_MISMATCH, TEXT)).unwrap();
        assert_eq!(tail.size, 80);
        assert_eq!(tail.rows, [(0, sp(256, Some(-16), Some(-24))), (72, sp(256, None, None)), (76, UnwindRow::ENTRY)]);
        // Through the table and the walker's packed form: the tail's body row is a frame record.
        assert_ne!(tail.rows[0].1.pack().unwrap() & unwind::sframe::PACKED_RECORD, 0);

        // What the description refuses: an SP write it does not follow, x30 loaded alone, a call
        // while x30 holds the return address, no end before the next symbol.
        let refused = |words: &[u32], until_ret| {
            describe(TEXT, TEXT + 4 * words.len() as u64, TrackedFrame::ENTRY, until_ret, &words_at(words, TEXT))
                .unwrap_err()
        };
        assert!(refused(&[0xd100_83ff, 0xd65f_03c0], true).contains("writes SP"), "sub sp, sp, #32");
        assert!(refused(&[0xf81f_0ffe, 0xd65f_03c0], true).contains("writes SP"), "str x30, [sp, #-16]!");
        assert!(refused(&[0xa9b0_07e0, 0xa940_07fd, 0xd65f_03c0], true).contains("alone"), "ldp x29, x1, [sp]");
        assert!(refused(&[0x9400_0000, 0xd65f_03c0], true).contains("calls while x30"));
        assert!(refused(&[0xd503_201f, 0xd503_201f], true).contains("no end"));

        // Into a conversion: the described ranges pass the validator's check that every table
        // function is an FDE's or a described one, and a described range may not overlap CFI.
        let data = sample();
        let mut conversion = convert(&data, EH_FRAME).unwrap();
        let thunk_at = TEXT + 0x100;
        let symbols = [("__hwasan_check_x0_67043328", thunk_at), ("$x", thunk_at), ("memcpy", thunk_at + 0x40)];
        let text_and_thunk = |at: u64| if at >= thunk_at { words_at(&CHECK_THUNK, thunk_at)(at) } else { text(at) };
        describe_thunks(&mut conversion, &symbols, text_and_thunk).unwrap();
        assert_eq!(conversion.described, [(thunk_at, 48)]);
        let table = encode::table(&conversion.functions, SFRAME).unwrap();
        validate(&conversion, &data, EH_FRAME, &table, SFRAME, text_and_thunk).unwrap();
        let sframe = SFrameTable::new(&table, SFRAME).unwrap();
        assert_eq!(sframe.find(thunk_at + 44).unwrap(), Some(sp(256, Some(-16), Some(-24))));
        let mut overlapping = convert(&data, EH_FRAME).unwrap();
        let error = describe_thunks(&mut overlapping, &[("__hwasan_check_x1_1", TEXT)], words_at(&CHECK_THUNK, TEXT))
            .unwrap_err();
        assert!(error.message.contains("overlaps"), "{}", error.message);
    }

    #[test]
    fn a_hand_made_eh_frame_converts_and_validates() {
        let data = sample();
        let conversion = convert(&data, EH_FRAME).unwrap();
        assert_eq!(conversion.fdes, 4);
        assert_eq!(conversion.cfi_rows, 10 + 2 + 1);
        assert_eq!(conversion.rewritten, 2);
        assert_eq!(conversion.inexpressible_rows, 1);
        assert_eq!(conversion.inexpressible_functions, [(TEXT + 0x40, "CFA is not SP or x29 plus an offset")]);
        // The SCS push and pop rows merge with their neighbours, and the two rewritten rows.
        let rows: Vec<(u32, UnwindRow)> = conversion.functions[0].rows.clone();
        let signed = |cfa_base, cfa_offset, ra_offset, fp_offset| UnwindRow {
            cfa_base,
            cfa_offset,
            ra_offset,
            fp_offset,
            ra_signed: true,
        };
        assert_eq!(
            rows,
            [
                (0, UnwindRow::ENTRY),
                (4, signed(CfaBase::StackPointer, 0, None, None)),
                (12, signed(CfaBase::StackPointer, 32, None, None)),
                (16, signed(CfaBase::StackPointer, 32, Some(-8), Some(-16))),
                (20, signed(CfaBase::FramePointer, 16, Some(-8), Some(-16))),
                (24, signed(CfaBase::StackPointer, 32, Some(-8), Some(-16))),
                (32, signed(CfaBase::StackPointer, 0, None, None)),
                (40, UnwindRow::ENTRY),
            ]
        );
        assert_eq!(conversion.table_rows, 8 + 1);
        let table = encode::table(&conversion.functions, SFRAME).unwrap();
        let validation = validate(&conversion, &data, EH_FRAME, &table, SFRAME, text).unwrap();
        assert_eq!(validation, Validation { addresses: 11 + 4 + 2, rewritten_addresses: 2, call_slot_returns: 0 });
    }

    #[test]
    fn the_validator_catches_a_wrong_table_and_an_unfounded_rewrite() {
        let data = sample();
        let conversion = convert(&data, EH_FRAME).unwrap();
        let good = encode::table(&conversion.functions, SFRAME).unwrap();
        // Each byte of the rows changed: the validator (or the table's own check) objects.
        let rows = unwind::sframe::HEADER_SIZE + conversion.functions.len() * unwind::sframe::FDE_SIZE;
        for at in rows..good.len() {
            let mut table = good.clone();
            table[at] ^= 0x08;
            assert!(validate(&conversion, &data, EH_FRAME, &table, SFRAME, text).is_err(), "byte {at}");
        }
        // A table for another function set.
        let mut fewer = conversion.functions.clone();
        fewer.pop();
        let table = encode::table(&fewer, SFRAME).unwrap();
        assert!(validate(&conversion, &data, EH_FRAME, &table, SFRAME, text).is_err());
        // The rewrite needs `ldp x29, x30` and an SP increment before the row.
        let no_ldp = |at: u64| text(at).map(|word| if word == 0xa941_7bfd { 0xd503_201f } else { word });
        let failure = validate(&conversion, &data, EH_FRAME, &good, SFRAME, no_ldp).unwrap_err();
        assert!(failure.message.contains("no load of x30"), "{}", failure.message);
        let no_add = |at: u64| text(at).map(|word| if word == 0x9100_83ff { 0xaa00_03e0 } else { word });
        let failure = validate(&conversion, &data, EH_FRAME, &good, SFRAME, no_add).unwrap_err();
        assert!(failure.message.contains("SP increment"), "{}", failure.message);
    }

    /// The `prod` kernel's table, when that kernel has been built: every FDE expressible, the
    /// SCS-epilogue rows rewritten, and the validator content.
    #[test]
    fn the_built_kernel_converts_without_loss() {
        for variant in ["prod", "full"] {
            let elf = crate::build::target_dir().join("kernel/virt").join(variant).join("kernel");
            let Ok(mut data) = std::fs::read(&elf) else {
                eprintln!("{}: not built, skipped", elf.display());
                continue;
            };
            let has_cfi = object::File::parse(&*data).is_ok_and(|file| file.section_by_name(".sframe").is_some());
            if !has_cfi {
                eprintln!("{}: built before .eh_frame was kept, skipped", elf.display());
                continue;
            }
            let conversion = embed(&mut data).unwrap();
            assert_eq!(conversion.inexpressible_rows, 0, "{variant}: {:x?}", conversion.inexpressible_functions);
            assert!(conversion.fdes > 500 && conversion.rewritten > 0, "{variant}: {conversion:?}");
            // The sanitizer's thunks and their tail have rows where the sanitizer is built in.
            if variant == "full" {
                assert!(conversion.described.len() > 100, "full: {} described", conversion.described.len());
                let tail = file_symbol(&data, "__hwasan_tag_mismatch");
                assert!(conversion.described.iter().any(|(start, _)| Some(*start) == tail), "full: no tail");
            }
            // Every traced function's call slot has the trampoline's frame, and the kernel's
            // hand-written trampolines have rows of their own.
            assert!(conversion.call_slots.len() > 500, "{variant}: {} call slots", conversion.call_slots.len());
            let bytes = data_of_sframe(&data);
            let table = SFrameTable::new(&bytes, sframe_address(&data)).unwrap();
            for symbol in ["kretprobe_trampoline", "ftrace_graph_entry", "ftrace_graph_return", "switch_to"] {
                let start = file_symbol(&data, symbol).unwrap_or_else(|| panic!("{variant}: no {symbol}"));
                assert!(table.find(start).unwrap().is_some(), "{variant}: {symbol} has no rows");
            }
            walks_through_real_rows(&data);
        }
    }

    /// The bytes of the ELF's `.sframe` section.
    fn data_of_sframe(elf: &[u8]) -> Vec<u8> {
        let file = object::File::parse(elf).unwrap();
        file.section_by_name(".sframe").unwrap().data().unwrap().to_vec()
    }

    /// The address of the ELF's `.sframe` section.
    fn sframe_address(elf: &[u8]) -> u64 {
        object::File::parse(elf).unwrap().section_by_name(".sframe").unwrap().address()
    }

    /// A function with a patchable entry at `E = start - 8`, its CFI in the entry state through
    /// the call slot, then a frame from offset 12.
    fn patchable_function(start: u64) -> Function {
        let entry = UnwindRow {
            cfa_base: CfaBase::StackPointer,
            cfa_offset: 0,
            ra_offset: None,
            fp_offset: None,
            ra_signed: false,
        };
        let body = UnwindRow { cfa_offset: 16, ra_offset: Some(-8), fp_offset: Some(-16), ..entry };
        Function { start, size: 64, rows: vec![(0, entry), (12, body)] }
    }

    #[test]
    fn call_slots_get_the_trampolines_frame() {
        let start = 0xffff_ff80_4008_1008;
        let mut conversion = Conversion {
            functions: vec![patchable_function(start), patchable_function(start + 64 + 8)],
            table_rows: 4,
            ..Conversion::default()
        };
        // The second function's entry is not in the list; an entry without rows is passed over.
        add_call_slot_rows(&mut conversion, &[start - 8, 0xffff_ff80_4009_0000]).unwrap();
        assert_eq!(conversion.call_slots, vec![start]);
        let rows: Vec<u32> = conversion.functions[0].rows.iter().map(|(offset, _)| *offset).collect();
        assert_eq!(rows, vec![0, 5, 8, 12]);
        assert_eq!(conversion.functions[0].rows[1].1, call_slot_row());
        assert_eq!(conversion.functions[0].rows[2].1, conversion.functions[0].rows[0].1);
        assert_eq!(conversion.functions[1].rows.len(), 2);
        assert_eq!(conversion.table_rows, 6);
        // Read back: the `bl` keeps the entry row, its return finds the trampoline's frame.
        let bytes = encode::table(&conversion.functions, 0xffff_ff80_4100_0000).unwrap();
        let table = SFrameTable::new(&bytes, 0xffff_ff80_4100_0000).unwrap();
        assert_eq!(table.find(start + 4).unwrap(), Some(conversion.functions[0].rows[0].1));
        assert_eq!(table.find(start + 7).unwrap(), Some(call_slot_row()));
        assert_eq!(table.find(start + 8).unwrap(), Some(conversion.functions[0].rows[0].1));
        assert_eq!(call_slot_row().pack().map(UnwindRow::unpack), Some(call_slot_row()));

        // A function whose frame starts inside the call slot is refused, not given a wrong row.
        let mut early = patchable_function(start);
        early.rows[1].0 = 4;
        let mut conversion = Conversion { functions: vec![early], ..Conversion::default() };
        let error = add_call_slot_rows(&mut conversion, &[start - 8]).unwrap_err();
        assert!(error.message.contains("not the entry's through the call slot"), "{}", error.message);
    }

    /// The address of the symbol `name` in the ELF `elf`.
    fn file_symbol(elf: &[u8], name: &str) -> Option<u64> {
        let file = object::File::parse(elf).ok()?;
        file.symbols().find(|symbol| symbol.name() == Ok(name)).map(|symbol| symbol.address())
    }

    /// Memory of 8-byte words; everything else unreadable.
    struct Words(BTreeMap<u64, u64>);

    impl unwind::StackMemory for Words {
        fn read_u64(&self, address: u64) -> Option<u64> {
            self.0.get(&address).copied()
        }
    }

    /// Chains of frames laid out by the kernel's own body rows (CFA = x29 + offset, RA and FP
    /// saved), each frame's return address inside such a row of its caller, closed by a final
    /// marker and a return into code without rows: the walker reads them back, PACs stripped.
    fn walks_through_real_rows(elf: &[u8]) {
        let file = object::File::parse(elf).unwrap();
        let section = file.section_by_name(".sframe").unwrap();
        let bytes = section.data().unwrap();
        let table = SFrameTable::new(bytes, section.address()).unwrap();
        // Every (function index, offset range) of an FP-based body row.
        let mut bodies = Vec::new();
        for index in 0..table.len() {
            let function = table.function(index).unwrap();
            let rows: Vec<(u32, UnwindRow)> = table.rows(index).unwrap().map(Result::unwrap).collect();
            for (position, (start, row)) in rows.iter().enumerate() {
                let end = rows.get(position + 1).map_or(function.size, |(next, _)| *next);
                if row.cfa_base == CfaBase::FramePointer && row.ra_offset.is_some() && row.fp_offset.is_some() {
                    bodies.push((function.start, *start, end, *row));
                }
            }
        }
        assert!(bodies.len() > 100, "{} body rows", bodies.len());
        let text = file.section_by_name(".text").unwrap();
        let no_row = (text.address()..text.address() + text.size())
            .step_by(4)
            .find(|pc| table.find(*pc).unwrap().is_none())
            .expect("hand-written code without rows");
        let stack = unwind::StackRange::new(0x4010_0000, 0x4030_0000, unwind::StackKind::Task);
        let layout = unwind::AddressLayout::new(39);
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move |bound: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % bound as u64) as usize
        };
        for _ in 0..500 {
            let depth = 1 + next(40);
            let chain: Vec<_> = (0..depth).map(|_| bodies[next(bodies.len())]).collect();
            // A PC inside each chosen row (the first is interrupted there; the others are
            // return addresses, looked up 1 byte before).
            let pcs: Vec<u64> = chain
                .iter()
                .enumerate()
                .map(|(level, (start, from, to, _))| {
                    let slots = (to - from) / 4;
                    let offset = u64::from(from + 4 * next(slots as usize) as u32);
                    start + offset + if level == 0 { 0 } else { 4 }
                })
                .collect();
            let mut memory = BTreeMap::new();
            let mut sp = stack.low + 0x100;
            let mut records = Vec::new();
            for (_, _, _, row) in &chain {
                // x29 at the frame's lowest slot (the record), the CFA above it, as LLVM lays it out.
                let lowest = row.ra_offset.unwrap().min(row.fp_offset.unwrap());
                let fp = sp + 16 * next(4) as u64;
                let cfa = (fp as i64 + i64::from(row.cfa_offset)) as u64;
                assert!(cfa as i64 + i64::from(lowest) >= sp as i64, "{row:?}");
                records.push((fp, cfa));
                sp = cfa;
            }
            let marker = sp + 16;
            memory.extend([(marker, 0), (marker + 8, 0), (marker + 16, 0), (marker + 24, 0), (marker + 32, 0)]);
            for (level, (_, _, _, row)) in chain.iter().enumerate() {
                let (_, cfa) = records[level];
                let caller_fp = records.get(level + 1).map_or(marker, |(fp, _)| *fp);
                let ra = pcs.get(level + 1).copied().unwrap_or(no_row + 4);
                let signed = (ra & ((1 << 39) - 1)) | ((level as u64 * 0x1357) & 0xffff) << 39 | 0xff80 << 48;
                memory.insert((cfa as i64 + i64::from(row.ra_offset.unwrap())) as u64, signed);
                memory.insert((cfa as i64 + i64::from(row.fp_offset.unwrap())) as u64, caller_fp);
            }
            let memory = Words(memory);
            let stacks = [stack];
            let walker = unwind::SFrameWalker::new(&memory, &stacks, &table, layout);
            let start = unwind::SFrameStart::Interrupted(unwind::Registers {
                pc: pcs[0],
                sp: stack.low + 0x100,
                fp: records[0].0,
                lr: 0,
            });
            let mut trace = unwind::Trace::new();
            trace.fill(|buffer| walker.walk(start, unwind::TraceOptions::ALL, buffer));
            let mut expected = pcs.clone();
            expected.push(no_row + 4);
            expected.truncate(unwind::MAX_FRAMES);
            assert_eq!(trace.addresses(), &expected[..], "{chain:x?}");
            assert_eq!(trace.stop_reason(), unwind::StopReason::EndOfTask);
        }
    }
}
