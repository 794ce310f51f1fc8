//! The arm64 instruction classifier: what one A64 instruction word does, by event class.
//!
//! Follows the ARM ARM's A64 encoding index (C4.1): loads and stores (C4.1.88), branches,
//! exception generation and system instructions (C4.1.87), data processing (register, C4.1.90
//! and C4.1.91) for the pointer-authentication instructions. The answer depends on the word
//! alone, so the plugin asks once per translated instruction and counts with inline adds;
//! whether a conditional branch is taken is the one event it decides at run time.

/// How an instruction moves control, for the branch counters.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub enum Branch {
    /// Falls through to the next instruction (or is an exception return, counted as `eret`).
    #[default]
    None,
    /// `b.cond`, `bc.cond`, `cbz`/`cbnz`, `tbz`/`tbnz`: taken or not at run time.
    Conditional,
    /// `b`: always taken, target in the word.
    Jump,
    /// `bl`: a direct call.
    Call,
    /// `br`, `braa` and kin: an indirect jump.
    IndirectJump,
    /// `blr`, `blraa` and kin: an indirect call.
    IndirectCall,
    /// `ret`, `retaa`, `retab`.
    Return,
}

impl Branch {
    /// Taken on every execution (a conditional branch is decided at run time).
    pub fn always_taken(self) -> bool {
        !matches!(self, Branch::None | Branch::Conditional)
    }

    /// Its target comes from a register (returns included).
    pub fn indirect(self) -> bool {
        matches!(self, Branch::IndirectJump | Branch::IndirectCall | Branch::Return)
    }

    pub fn call(self) -> bool {
        matches!(self, Branch::Call | Branch::IndirectCall)
    }
}

/// The events one execution of an instruction is, as far as its word says.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct Class {
    /// Reads data memory (a load, an atomic, a compare-and-swap, `ldraa`).
    pub load: bool,
    /// Writes data memory (a store, an atomic, a compare-and-swap, a tag store).
    pub store: bool,
    /// Bytes read from data memory by one execution (a pair or structure counts all its
    /// registers; tag-only accesses count 0).
    pub bytes_loaded: u32,
    /// Bytes written, likewise.
    pub bytes_stored: u32,
    pub branch: Branch,
    /// `eret`, `eretaa`, `eretab`.
    pub eret: bool,
    pub isb: bool,
    pub dsb: bool,
    pub dmb: bool,
    /// `dc` and `ic`: data and instruction cache maintenance (and `dc zva`).
    pub cache_maintenance: bool,
    pub tlbi: bool,
    /// `mrs`/`msr` of a system register, `msr` of a PSTATE field.
    pub system_register: bool,
    /// A pointer-authentication instruction: `pac*`, `aut*`, `xpac*`, `pacga`, the
    /// authenticating branches and returns, `ldraa`/`ldrab`.
    pub pointer_authentication: bool,
    /// `mrs Xt, pmccntr_el0`: the counter read that opens and closes every measured window.
    pub window_marker: bool,
    /// `hint #0x7f` ([`ROW_MARKER`]): the kernel is about to say which windows a row's figure
    /// came from (outside every window; a NOP to the CPU).
    pub row_marker: bool,
}

/// `hint #0x7f`, the row marker.
pub const ROW_MARKER: u32 = 0xd503_2fff;

/// `mrs Xt, pmccntr_el0` (op0=3, op1=3, CRn=9, CRm=13, op2=0) without its Rt field.
pub const MRS_PMCCNTR_EL0: u32 = 0xd53b_9d00;

fn bits(word: u32, high: u32, low: u32) -> u32 {
    (word >> low) & ((1 << (high - low + 1)) - 1)
}

fn bit(word: u32, at: u32) -> bool {
    (word >> at) & 1 == 1
}

/// Classifies one A64 instruction word. Unallocated and unrecognised words are plain
/// instructions: they count as instructions and nothing else.
pub fn classify(word: u32) -> Class {
    // op0 (bits 28:25) = x1x0: loads and stores.
    if bits(word, 27, 27) == 1 && bits(word, 25, 25) == 0 {
        return load_store(word);
    }
    // op0 = 101x: branches, exception generation and system instructions.
    if bits(word, 28, 26) == 0b101 {
        return branch_system(word);
    }
    let mut class = Class::default();
    // Data processing (1 source), opcode2 = 00001: pac*/aut*/xpac* (opcode 000000..010001).
    if word & 0xffff_0000 == 0xdac1_0000 && bits(word, 15, 10) <= 0b01_0001 {
        class.pointer_authentication = true;
    }
    // Data processing (2 source): pacga.
    if word & 0xffe0_fc00 == 0x9ac0_3000 {
        class.pointer_authentication = true;
    }
    class
}

fn access(class: &mut Class, load: bool, store: bool, bytes: u32) {
    class.load |= load;
    class.store |= store;
    if load {
        class.bytes_loaded += bytes;
    }
    if store {
        class.bytes_stored += bytes;
    }
}

fn load_store(word: u32) -> Class {
    let mut class = Class::default();
    let size = bits(word, 31, 30);
    let vector = bit(word, 26);
    let load = bit(word, 22);
    // Advanced SIMD load/store multiple structures (and post-indexed).
    if word & 0xbfbf_0000 == 0x0c00_0000 || word & 0xbfa0_0000 == 0x0c80_0000 {
        let registers = match bits(word, 15, 12) {
            0b0000 | 0b0010 => 4,
            0b0100 | 0b0110 => 3,
            0b1000 | 0b1010 => 2,
            0b0111 => 1,
            _ => return class,
        };
        let register_bytes = if bit(word, 30) { 16 } else { 8 };
        access(&mut class, load, !load, registers * register_bytes);
        return class;
    }
    // Advanced SIMD load/store single structure (and post-indexed, and replicate).
    if word & 0xbf9f_0000 == 0x0d00_0000 || word & 0xbf80_0000 == 0x0d80_0000 {
        let structures = ((bits(word, 13, 13) << 1) | bits(word, 21, 21)) + 1;
        let element = match bits(word, 15, 14) {
            0b00 => 1,
            0b01 => 2,
            0b10 => {
                if bit(word, 10) {
                    8
                } else {
                    4
                }
            }
            _ => 1 << bits(word, 11, 10),
        };
        access(&mut class, load, !load, structures * element);
        return class;
    }
    // Memory tagging: stg, stzg, st2g, stz2g, ldg, stgm, ldgm. Tags only (16-byte granules),
    // except that the zeroing forms also clear the granules' data.
    if word & 0xff20_0000 == 0xd920_0000 {
        let opc = bits(word, 23, 22);
        let imm_or_mode = bits(word, 11, 10);
        match (opc, imm_or_mode) {
            (0b01, 0b00) | (0b10, 0b00) | (0b11, 0b00) => access(&mut class, true, false, 0),
            (0b00, 0b00) => access(&mut class, false, true, 0),
            (0b11, _) | (0b00, _) => {
                let granules = if opc == 0b11 { 2 } else { 1 };
                access(&mut class, false, true, granules * 16);
            }
            _ => access(&mut class, false, true, 0),
        }
        return class;
    }
    match bits(word, 29, 24) {
        // Load/store exclusive and ordered, compare-and-swap (pair).
        0b00_1000 => {
            let o2 = bit(word, 23);
            let o1 = bit(word, 21);
            let bytes = 1 << size;
            if o2 && o1 {
                // cas: read and (conditionally) write one register.
                access(&mut class, true, true, bytes);
            } else if o1 && size >= 2 {
                // ldxp/stxp, ldaxp/stlxp: a pair of 32- or 64-bit registers.
                access(&mut class, load, !load, 2 * bytes);
            } else if o1 {
                // casp: size 00/01 selects a pair of 32- or 64-bit registers.
                access(&mut class, true, true, 2 * (4 << size));
            } else {
                access(&mut class, load, !load, bytes);
            }
            return class;
        }
        // ldapr/stlr with unscaled offset (ldapur, stlur).
        0b01_1001 if !bit(word, 21) && bits(word, 11, 10) == 0 => {
            let opc = bits(word, 23, 22);
            access(&mut class, opc != 0, opc == 0, 1 << size);
            return class;
        }
        _ => {}
    }
    // Load register (literal).
    if word & 0x3b00_0000 == 0x1800_0000 {
        let bytes = match (vector, size) {
            (_, 0b00) => 4,
            (_, 0b01) => 8,
            (true, 0b10) => 16,
            (false, 0b10) => 4,
            _ => return class, // prfm
        };
        access(&mut class, true, false, bytes);
        return class;
    }
    // Load/store pair (all addressing modes, no-allocate pairs included).
    if word & 0x3800_0000 == 0x2800_0000 {
        let register_bytes = match (vector, size) {
            (false, 0b00) => 4,
            (false, 0b01) => {
                if load {
                    4 // ldpsw
                } else {
                    8 // stgp: 16 bytes of data and the granule's tag
                }
            }
            (false, 0b10) => 8,
            (true, 0b00) => 4,
            (true, 0b01) => 8,
            (true, 0b10) => 16,
            _ => return class,
        };
        access(&mut class, load, !load, 2 * register_bytes);
        return class;
    }
    // Load/store register: unsigned offset, unscaled, pre/post-indexed, unprivileged,
    // register offset, atomics, pointer-authenticated loads.
    if word & 0x3800_0000 == 0x3800_0000 {
        let opc = bits(word, 23, 22);
        let register_form = !bit(word, 24) && bit(word, 21);
        if register_form && bit(word, 10) {
            // ldraa, ldrab: an authenticated 64-bit load.
            class.pointer_authentication = true;
            access(&mut class, true, false, 8);
            return class;
        }
        let bytes = if vector && opc >= 0b10 && size == 0 { 16 } else { 1 << size };
        if register_form && bits(word, 11, 10) == 0b00 && !vector {
            // Atomic memory operations: read-modify-write, except ldapr (o3=1, opc=100).
            let ldapr = bit(word, 15) && bits(word, 14, 12) == 0b100;
            access(&mut class, true, !ldapr, bytes);
            return class;
        }
        if vector {
            let is_load = bit(word, 22);
            access(&mut class, is_load, !is_load, bytes);
            return class;
        }
        match (size, opc) {
            (_, 0b00) => access(&mut class, false, true, bytes),
            (0b11, 0b10) => {} // prfm
            (0b10, 0b11) | (0b11, 0b11) => {}
            _ => access(&mut class, true, false, bytes),
        }
    }
    class
}

fn branch_system(word: u32) -> Class {
    let mut class = Class::default();
    // b, bl.
    if word & 0x7c00_0000 == 0x1400_0000 {
        class.branch = if bit(word, 31) { Branch::Call } else { Branch::Jump };
        return class;
    }
    // b.cond, bc.cond; cbz/cbnz; tbz/tbnz.
    if word & 0xff00_0000 == 0x5400_0000 || word & 0x7e00_0000 == 0x3400_0000 || word & 0x7e00_0000 == 0x3600_0000 {
        class.branch = Branch::Conditional;
        return class;
    }
    // Unconditional branch (register).
    if word & 0xfe00_0000 == 0xd600_0000 {
        let opc = bits(word, 24, 21);
        let authenticated = bits(word, 15, 11) == 0b00001;
        class.pointer_authentication = authenticated;
        match opc {
            0b0000 | 0b1000 => class.branch = Branch::IndirectJump,
            0b0001 | 0b1001 => class.branch = Branch::IndirectCall,
            0b0010 => class.branch = Branch::Return,
            0b0100 => class.eret = true,
            _ => {}
        }
        class.pointer_authentication |= opc & 0b1000 != 0;
        return class;
    }
    // System instructions (C5.2): L (bit 21), op0 (20:19), op1 (18:16), CRn, CRm, op2.
    if word & 0xffc0_0000 == 0xd500_0000 {
        let read = bit(word, 21);
        let op0 = bits(word, 20, 19);
        let op1 = bits(word, 18, 16);
        let crn = bits(word, 15, 12);
        let crm = bits(word, 11, 8);
        let op2 = bits(word, 7, 5);
        match (op0, crn) {
            (0b00, 0b0010) if !read && op1 == 0b011 => {
                // Hints: pac*/aut*/xpaclri live here so that they are NOPs without PAuth.
                let hint = (crm << 3) | op2;
                class.pointer_authentication = matches!(hint, 7 | 8 | 10 | 12 | 14 | 24..=31);
                class.row_marker = word == ROW_MARKER;
            }
            (0b00, 0b0011) if !read && op1 == 0b011 => match op2 {
                0b100 => class.dsb = true,
                0b101 => class.dmb = true,
                0b110 => class.isb = true,
                0b001 if crm & 0b0011 == 0b0010 => class.dsb = true, // dsb nXS
                _ => {}
            },
            (0b00, 0b0100) if !read => class.system_register = true, // msr of a PSTATE field
            (0b01, 0b0111) if !read => {
                // sys: dc/ic maintenance; at (CRm 1000/1001) is a translation, not maintenance.
                if crm != 0b1000 && crm != 0b1001 {
                    class.cache_maintenance = true;
                    if op1 == 0b011 && crm == 0b0100 && op2 == 0b001 {
                        access(&mut class, false, true, 64); // dc zva: zeroes a block
                    }
                }
            }
            (0b01, 0b1000) | (0b01, 0b1001) if !read => class.tlbi = true,
            (0b10, _) | (0b11, _) => {
                class.system_register = true;
                class.window_marker = read && word & !0x1f == MRS_PMCCNTR_EL0;
            }
            _ => {}
        }
    }
    class
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class_of(word: u32) -> Class {
        classify(word)
    }

    #[test]
    fn plain_arithmetic_is_nothing_but_an_instruction() {
        assert_eq!(class_of(0xd100_0400), Class::default()); // sub x0, x0, #1
        assert_eq!(class_of(0xd503_201f), Class::default()); // nop
        assert_eq!(class_of(0xd503_2fdf), Class::default()); // hint #0x7e
        assert_eq!(class_of(0xd503_2fff), Class { row_marker: true, ..Class::default() }); // hint #0x7f
    }

    #[test]
    fn loads_and_stores_by_size() {
        let ldr_x = class_of(0xf940_0020); // ldr x0, [x1]
        assert!(ldr_x.load && !ldr_x.store);
        assert_eq!(ldr_x.bytes_loaded, 8);
        let ldrb = class_of(0x3940_0020); // ldrb w0, [x1]
        assert_eq!((ldrb.load, ldrb.bytes_loaded), (true, 1));
        let str_w = class_of(0xb900_0020); // str w0, [x1]
        assert_eq!((str_w.store, str_w.load, str_w.bytes_stored), (true, false, 4));
        let stp = class_of(0xa9bf_7bfd); // stp x29, x30, [sp, #-16]!
        assert_eq!((stp.store, stp.bytes_stored), (true, 16));
        let ldp = class_of(0xa8c1_7bfd); // ldp x29, x30, [sp], #16
        assert_eq!((ldp.load, ldp.bytes_loaded), (true, 16));
        let ldr_q = class_of(0x3dc0_0020); // ldr q0, [x1]
        assert_eq!(ldr_q.bytes_loaded, 16);
        let stp_q = class_of(0xad00_0420); // stp q0, q1, [x1]
        assert_eq!(stp_q.bytes_stored, 32);
        let literal = class_of(0x5800_0040); // ldr x0, #8
        assert_eq!(literal.bytes_loaded, 8);
        let ldr_register = class_of(0xf862_6820); // ldr x0, [x1, x2]
        assert_eq!(ldr_register.bytes_loaded, 8);
        let ldur = class_of(0xf85f_8020); // ldur x0, [x1, #-8]
        assert_eq!(ldur.bytes_loaded, 8);
        let ldrsw = class_of(0xb980_0020); // ldrsw x0, [x1]
        assert_eq!(ldrsw.bytes_loaded, 4);
    }

    #[test]
    fn prefetches_move_no_data() {
        assert_eq!(class_of(0xf980_0020), Class::default()); // prfm pldl1keep, [x1]
        assert_eq!(class_of(0xd800_0040), Class::default()); // prfm pldl1keep, #8
    }

    #[test]
    fn exclusives_atomics_and_structures() {
        let ldxr = class_of(0xc85f_7c20); // ldxr x0, [x1]
        assert_eq!((ldxr.load, ldxr.store, ldxr.bytes_loaded), (true, false, 8));
        let stxr = class_of(0xc802_7c20); // stxr w2, x0, [x1]
        assert_eq!((stxr.load, stxr.store, stxr.bytes_stored), (false, true, 8));
        let stlr = class_of(0xc89f_fc20); // stlr x0, [x1]
        assert_eq!((stlr.store, stlr.bytes_stored), (true, 8));
        let ldadd = class_of(0xf820_0022); // ldadd x0, x2, [x1]
        assert_eq!((ldadd.load, ldadd.store, ldadd.bytes_loaded, ldadd.bytes_stored), (true, true, 8, 8));
        let ldapr = class_of(0xf8bf_c020); // ldapr x0, [x1]
        assert_eq!((ldapr.load, ldapr.store), (true, false));
        let cas = class_of(0xc8a0_7c22); // cas x0, x2, [x1]
        assert_eq!((cas.load, cas.store, cas.bytes_loaded), (true, true, 8));
        let ld1 = class_of(0x4c40_7020); // ld1 {v0.16b}, [x1]
        assert_eq!((ld1.load, ld1.bytes_loaded), (true, 16));
        let st1_four = class_of(0x4c00_2020); // st1 {v0.16b-v3.16b}, [x1]
        assert_eq!((st1_four.store, st1_four.bytes_stored), (true, 64));
        let ld1_lane = class_of(0x4d40_8420); // ld1 {v0.d}[1], [x1]
        assert_eq!(ld1_lane.bytes_loaded, 8);
    }

    #[test]
    fn branches_by_kind() {
        assert_eq!(class_of(0x1400_0002).branch, Branch::Jump); // b .+8
        assert_eq!(class_of(0x9400_0002).branch, Branch::Call); // bl .+8
        assert_eq!(class_of(0x5400_0041).branch, Branch::Conditional); // b.ne .+8
        assert_eq!(class_of(0xb400_0040).branch, Branch::Conditional); // cbz x0, .+8
        assert_eq!(class_of(0x3600_0040).branch, Branch::Conditional); // tbz w0, #0, .+8
        assert_eq!(class_of(0xd61f_0020).branch, Branch::IndirectJump); // br x1
        assert_eq!(class_of(0xd63f_0020).branch, Branch::IndirectCall); // blr x1
        assert_eq!(class_of(0xd65f_03c0).branch, Branch::Return); // ret
        assert!(Branch::Return.indirect() && Branch::IndirectCall.call() && !Branch::Conditional.always_taken());
    }

    #[test]
    fn exception_return_and_barriers() {
        let eret = class_of(0xd69f_03e0);
        assert!(eret.eret && eret.branch == Branch::None && !eret.pointer_authentication);
        assert!(class_of(0xd503_3fdf).isb); // isb
        assert!(class_of(0xd503_3f9f).dsb); // dsb sy
        assert!(class_of(0xd503_3b9f).dsb); // dsb ish
        assert!(class_of(0xd503_3bbf).dmb); // dmb ish
        assert!(!class_of(0xd503_3f5f).dsb); // clrex
    }

    #[test]
    fn maintenance_and_translation() {
        assert!(class_of(0xd50b_7b20).cache_maintenance); // dc cvau, x0
        assert!(class_of(0xd50b_7520).cache_maintenance); // ic ivau, x0
        assert!(class_of(0xd508_751f).cache_maintenance); // ic iallu
        assert!(class_of(0xd508_871f).tlbi); // tlbi vmalle1
        assert!(class_of(0xd508_831f).tlbi); // tlbi vmalle1is
        assert!(!class_of(0xd508_7800).cache_maintenance); // at s1e1r, x0
        let zva = class_of(0xd50b_7420); // dc zva, x0
        assert!(zva.cache_maintenance && zva.store && zva.bytes_stored == 64);
    }

    #[test]
    fn system_registers_and_the_window_marker() {
        let marker = class_of(0xd53b_9d00); // mrs x0, pmccntr_el0
        assert!(marker.system_register && marker.window_marker);
        let marker_x21 = class_of(0xd53b_9d15); // mrs x21, pmccntr_el0
        assert!(marker_x21.window_marker);
        let cntvct = class_of(0xd53b_e040); // mrs x0, cntvct_el0
        assert!(cntvct.system_register && !cntvct.window_marker);
        let msr = class_of(0xd518_c000); // msr vbar_el1, x0
        assert!(msr.system_register && !msr.window_marker);
        assert!(class_of(0xd503_43df).system_register); // msr daifset, #3
        assert!(!class_of(0xd51b_9d00).window_marker); // msr pmccntr_el0, x0
    }

    #[test]
    fn pointer_authentication() {
        for word in [
            0xd503_233f, // paciasp
            0xd503_23bf, // autiasp
            0xd503_20ff, // xpaclri
            0xdac1_0020, // pacia x0, x1
            0xdac1_1020, // autia x0, x1
            0xdac1_43e0, // xpaci x0
            0x9ac2_3020, // pacga x0, x1, x2
            0xd65f_0bff, // retaa
            0xd71f_0820, // braa x1, x0
            0xd73f_0820, // blraa x1, x0
            0xd69f_0bff, // eretaa
            0xf820_0420, // ldraa x0, [x1]
        ] {
            assert!(class_of(word).pointer_authentication, "{word:#010x}");
        }
        assert_eq!(class_of(0xd65f_0bff).branch, Branch::Return);
        assert_eq!(class_of(0xd73f_0820).branch, Branch::IndirectCall);
        assert!(class_of(0xd69f_0bff).eret);
        assert_eq!(class_of(0xf820_0420).bytes_loaded, 8);
        assert!(!class_of(0xd65f_03c0).pointer_authentication); // ret
        assert!(!class_of(0xdac0_0020).pointer_authentication); // rbit x0, x1
    }
}
