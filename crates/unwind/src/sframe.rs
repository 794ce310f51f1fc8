//! SFrame tables (binutils' format, version 2, AArch64): decoding, lookup, encoding.
//!
//! An SFrame section describes, for every instruction of every function it lists, where the
//! caller's frame is: the CFA (the caller's SP) as SP or FP plus an offset, and where the
//! return address (RA) and the caller's FP are (saved at CFA-relative slots, or still in x30
//! and x29). Layout, as binutils' `include/sframe.h` and the SFrame v2 specification give it
//! (all little-endian, packed):
//!
//! - header, 28 bytes: magic `0xdee2` (u16), version 2, flags ([`FLAG_FDE_SORTED`]), ABI
//!   ([`ABI_AARCH64_LITTLE`]), the fixed FP and RA offsets (0: AArch64 tracks both per row), the
//!   auxiliary header's length, then u32 counts of FDEs and FREs, the FRE sub-section's length
//!   and the offsets of the FDE and FRE sub-sections after the header;
//! - function descriptors (FDEs), 20 bytes each, sorted by start address: start (i32, from the
//!   section's own address since [`FLAG_FDE_FUNC_START_PCREL`] is not set), size (u32), first
//!   FRE (u32, from the FRE sub-section's start), FRE count (u32), info (u8: FRE start-address
//!   width in bits 0-3, FDE type in bit 4, PAuth key in bit 5), repeat size (u8), padding (u16);
//! - frame row entries (FREs), variable length: start offset in the function (1, 2 or 4 bytes as
//!   the FDE says), info (u8: CFA base in bit 0, 1 = SP and 0 = FP; offset count in bits 1-4;
//!   offset width in bits 5-6, 1, 2 or 4 bytes; RA signed in bit 7), then the CFA offset, the RA
//!   offset (if saved) and the FP offset (if saved). A row applies from its start to the next
//!   row's start (or the function's end).
//!
//! Lookup ([`SFrameTable::find`]) is a binary search of the FDEs, then a scan of the function's
//! rows. Every read is bounds-checked against the section: a corrupt table yields an error, never
//! an out-of-bounds read, and [`SFrameTable::check`] validates a whole table once (what lookup
//! cannot see: order, overlaps, implausible offsets).

/// `sfp_magic`.
pub const MAGIC: u16 = 0xdee2;
/// `sfp_version`: the version this module reads and writes.
pub const VERSION: u8 = 2;
/// `SFRAME_F_FDE_SORTED`: FDEs are sorted by start address (lookup needs it).
pub const FLAG_FDE_SORTED: u8 = 0x1;
/// `SFRAME_F_FRAME_POINTER`: every function keeps a frame pointer.
pub const FLAG_FRAME_POINTER: u8 = 0x2;
/// `SFRAME_F_FDE_FUNC_START_PCREL` (v2 erratum): starts are relative to the field itself.
/// Not written; read (a table from a newer assembler may set it).
pub const FLAG_FDE_FUNC_START_PCREL: u8 = 0x4;
/// `SFRAME_ABI_AARCH64_ENDIAN_LITTLE`.
pub const ABI_AARCH64_LITTLE: u8 = 2;
/// Size of the header (preamble included).
pub const HEADER_SIZE: usize = 28;
/// Size of one function descriptor.
pub const FDE_SIZE: usize = 20;
/// `SFRAME_FDE_TYPE_PCINC` in the FDE info's bit 4 (0): rows start at offsets in the function.
/// `SFRAME_FDE_TYPE_PCMASK` (1, for repeated PLT-like blocks) is refused.
const FDE_TYPE_PCMASK: u8 = 1 << 4;
/// FDE info bit 5: the function signs its return address with key B (else A).
pub const FDE_PAUTH_KEY_B: u8 = 1 << 5;
/// `SFRAME_FRE_TYPE_ADDR1/2/4`: width of an FRE's start offset.
pub const FRE_TYPE_ADDR1: u8 = 0;
/// See [`FRE_TYPE_ADDR1`].
pub const FRE_TYPE_ADDR2: u8 = 1;
/// See [`FRE_TYPE_ADDR1`].
pub const FRE_TYPE_ADDR4: u8 = 2;
/// FRE info bit 0: the CFA is SP-based (else FP-based).
const FRE_BASE_SP: u8 = 1;
/// FRE info bit 7: the return address is signed (PAC) at this row.
const FRE_RA_SIGNED: u8 = 1 << 7;

/// What the CFA is computed from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CfaBase {
    /// SP (x31) of the frame.
    StackPointer,
    /// x29 of the frame.
    FramePointer,
}

/// One row: how to find the caller's frame at an instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct UnwindRow {
    /// The register the CFA is an offset from.
    pub cfa_base: CfaBase,
    /// CFA = base + `cfa_offset`.
    pub cfa_offset: i32,
    /// The return address is saved at CFA + this, or (`None`) is still in x30.
    pub ra_offset: Option<i32>,
    /// The caller's x29 is saved at CFA + this, or (`None`) is still in x29.
    pub fp_offset: Option<i32>,
    /// The return address is signed (between `paciasp` and `autiasp`).
    pub ra_signed: bool,
}

impl UnwindRow {
    /// A leaf's row, or the entry of any function: CFA = SP, RA in x30, FP in x29.
    pub const ENTRY: Self =
        Self { cfa_base: CfaBase::StackPointer, cfa_offset: 0, ra_offset: None, fp_offset: None, ra_signed: false };

    /// The row in 32 bits (never 0), for a cache that reads and writes an entry in one access,
    /// or `None` if it does not fit: bit 0 set, bit 1 the CFA is FP-based ([`PACKED_FP_BASED`]),
    /// bit 2 the RA is signed, bits 3 and 4 the RA and FP are saved ([`PACKED_RA_SAVED`],
    /// [`PACKED_FP_SAVED`]), bits 5-14 the CFA offset / 8, bit 15 both are saved as a frame
    /// record (FP's slot, then RA's: [`PACKED_RECORD`]), bits 16-23 and 24-31 the RA and FP
    /// slots as `(-offset - 8) / 8`. Every offset must be a multiple of 8, the CFA offset in
    /// 0..=8184 and the slots in -2048..=-8 (the kernel's frames all are). A slot decodes to
    /// `CFA - 8 - 8 * field`: below the CFA whatever the word holds, so the walker's fast path
    /// needs no check that a packed slot is under the CFA.
    pub const fn pack(&self) -> Option<u32> {
        let cfa = self.cfa_offset;
        if cfa < 0 || cfa % 8 != 0 || cfa / 8 > 0x3ff {
            return None;
        }
        let mut word = 1 | (cfa as u32 / 8) << 5;
        if let CfaBase::FramePointer = self.cfa_base {
            word |= PACKED_FP_BASED;
        }
        if self.ra_signed {
            word |= 1 << 2;
        }
        if let Some(offset) = self.ra_offset {
            match pack_slot(offset) {
                Some(slot) => word |= PACKED_RA_SAVED | slot << 16,
                None => return None,
            }
        }
        if let Some(offset) = self.fp_offset {
            match pack_slot(offset) {
                Some(slot) => word |= PACKED_FP_SAVED | slot << 24,
                None => return None,
            }
        }
        if let (Some(ra), Some(fp)) = (self.ra_offset, self.fp_offset)
            && ra == fp + 8
        {
            word |= PACKED_RECORD;
        }
        Some(word)
    }

    /// The row [`pack`](Self::pack) made `word` from.
    #[inline(always)]
    pub const fn unpack(word: u32) -> Self {
        Self {
            cfa_base: if word & PACKED_FP_BASED != 0 { CfaBase::FramePointer } else { CfaBase::StackPointer },
            cfa_offset: packed_cfa_offset(word) as i32,
            ra_offset: unpack_slot(word, PACKED_RA_SAVED, 16),
            fp_offset: unpack_slot(word, PACKED_FP_SAVED, 24),
            ra_signed: word & (1 << 2) != 0,
        }
    }
}

/// Packed row bit 1: the CFA is x29-based (else SP-based).
pub const PACKED_FP_BASED: u32 = 1 << 1;
/// Packed row bit 3: the RA is saved at the slot in bits 16-23.
pub const PACKED_RA_SAVED: u32 = 1 << 3;
/// Packed row bit 4: the caller's FP is saved at the slot in bits 24-31.
pub const PACKED_FP_SAVED: u32 = 1 << 4;

/// Packed row bit 15: RA and FP are saved as a frame record, FP's slot then RA's.
pub const PACKED_RECORD: u32 = 1 << 15;

/// The CFA offset a packed row holds (bits 5-14, in units of 8).
#[inline(always)]
pub const fn packed_cfa_offset(word: u32) -> u64 {
    ((word >> 5) & 0x3ff) as u64 * 8
}

/// Where a [`PACKED_RECORD`] row's frame record is in the frame whose CFA is `cfa`: 8 below
/// the RA slot, so the record's 16 bytes end at or below the CFA whatever the word holds
/// (`cfa >= 2064`, or a wrap the caller's bounds check refuses).
#[inline(always)]
pub const fn packed_record(word: u32, cfa: u64) -> u64 {
    cfa.wrapping_sub(16).wrapping_sub(((word >> 16) & 0xff) as u64 * 8)
}

/// The slot offset [`UnwindRow::pack`] stored at `shift` if bit `present` is set.
#[inline(always)]
const fn unpack_slot(word: u32, present: u32, shift: u32) -> Option<i32> {
    if word & present != 0 { Some(-(((word >> shift) & 0xff) as i32) * 8 - 8) } else { None }
}

/// A saved slot's offset as [`UnwindRow::pack`] stores it: `(-offset - 8) / 8`, 0..=255.
const fn pack_slot(offset: i32) -> Option<u32> {
    if offset >= 0 || offset % 8 != 0 || -offset / 8 > 0x100 { None } else { Some((-offset / 8 - 1) as u32) }
}

/// Where a walk finds the row at an address: the table itself, or a cache in front of it.
pub trait RowLookup {
    /// As [`SFrameTable::find`].
    fn find(&self, pc: u64) -> Result<Option<UnwindRow>, TableError>;

    /// The row at `pc` as [`UnwindRow::pack`] packs it, or 0 where [`find`](Self::find) must
    /// answer (no row, a corrupt entry, a row that does not pack). The walker's fast path reads
    /// this: a cache answers it from its entry without decoding the row. The walker checks every
    /// field it uses, so a wrong word gives a wrong trace, never a read outside the stack.
    #[inline(always)]
    #[allow(
        clippy::manual_unwrap_or_default,
        clippy::manual_unwrap_or,
        reason = "`Option::unwrap_or` is a core helper the uninstrumented walkers would not inline"
    )]
    fn find_packed(&self, pc: u64) -> u32 {
        match self.find(pc) {
            Ok(Some(row)) => match row.pack() {
                Some(word) => word,
                None => 0,
            },
            _ => 0,
        }
    }
}

impl RowLookup for SFrameTable<'_> {
    #[inline(always)]
    fn find(&self, pc: u64) -> Result<Option<UnwindRow>, TableError> {
        SFrameTable::find(self, pc)
    }
}

/// What is wrong with a table (found by [`SFrameTable::new`], a lookup or [`SFrameTable::check`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TableError {
    /// Shorter than its header, or than the sub-sections the header declares.
    Truncated,
    /// Not `0xdee2`.
    BadMagic,
    /// Not version 2.
    UnsupportedVersion,
    /// Not AArch64 little-endian, or fixed RA/FP offsets (which AArch64 does not use).
    UnsupportedAbi,
    /// Unknown flags, or FDEs not declared sorted.
    UnsupportedFlags,
    /// FDE `index`: its rows lie outside the FRE sub-section, or its type or width is unknown.
    BadFunction {
        /// The FDE.
        index: usize,
    },
    /// FDE `index` starts before the previous one ends (unsorted or overlapping).
    Unordered {
        /// The FDE.
        index: usize,
    },
    /// A row of FDE `index`: bad info byte, start not increasing or past the function's end,
    /// or an implausible offset.
    BadRow {
        /// The FDE.
        index: usize,
    },
}

/// A decoded function descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FunctionEntry {
    /// Address of the function's first instruction.
    pub start: u64,
    /// Size in bytes.
    pub size: u32,
    /// Offset of its first row in the FRE sub-section.
    pub first_row: u32,
    /// Number of rows.
    pub rows: u32,
    /// The FDE info byte.
    pub info: u8,
}

/// A validated view of an SFrame section at `address`.
#[derive(Clone, Copy, Debug)]
pub struct SFrameTable<'a> {
    bytes: &'a [u8],
    /// The FDE sub-section as descriptors (`len` of them): the search reads these fixed-size
    /// arrays, so a probe costs one bounds check, not one per byte.
    descriptors: &'a [[u8; FDE_SIZE]],
    address: u64,
    pc_relative: bool,
    fdes: usize,
    functions: usize,
    fres: usize,
    fres_end: usize,
}

#[inline(always)]
fn read_u8(bytes: &[u8], at: usize) -> Result<u8, TableError> {
    if at < bytes.len() { Ok(bytes[at]) } else { Err(TableError::Truncated) }
}

#[inline(always)]
fn read_u16(bytes: &[u8], at: usize) -> Result<u16, TableError> {
    if at < bytes.len() && bytes.len() - at >= 2 {
        Ok(bytes[at] as u16 | (bytes[at + 1] as u16) << 8)
    } else {
        Err(TableError::Truncated)
    }
}

#[inline(always)]
fn read_u32(bytes: &[u8], at: usize) -> Result<u32, TableError> {
    if at < bytes.len() && bytes.len() - at >= 4 {
        Ok(bytes[at] as u32 | (bytes[at + 1] as u32) << 8 | (bytes[at + 2] as u32) << 16 | (bytes[at + 3] as u32) << 24)
    } else {
        Err(TableError::Truncated)
    }
}

/// The signed offset of `width` bytes (1, 2 or 4) at `at`.
#[inline(always)]
fn read_offset(bytes: &[u8], at: usize, width: usize) -> Result<i32, TableError> {
    if width == 1 {
        return match read_u8(bytes, at) {
            Ok(value) => Ok(value as i8 as i32),
            Err(error) => Err(error),
        };
    }
    if width == 2 {
        return match read_u16(bytes, at) {
            Ok(value) => Ok(value as i16 as i32),
            Err(error) => Err(error),
        };
    }
    match read_u32(bytes, at) {
        Ok(value) => Ok(value as i32),
        Err(error) => Err(error),
    }
}

/// One row as stored: where it starts in the function, what it says, and where the next begins.
struct StoredRow {
    start: u32,
    row: UnwindRow,
    next: usize,
}

impl<'a> SFrameTable<'a> {
    /// Checks the header of the section `bytes` loaded at `address` (the address function
    /// starts are relative to): magic, version, ABI, flags and the sub-sections' bounds.
    pub fn new(bytes: &'a [u8], address: u64) -> Result<Self, TableError> {
        if bytes.len() < HEADER_SIZE {
            return Err(TableError::Truncated);
        }
        if or_stop!(read_u16(bytes, 0), Err) != MAGIC {
            return Err(TableError::BadMagic);
        }
        if bytes[2] != VERSION {
            return Err(TableError::UnsupportedVersion);
        }
        let flags = bytes[3];
        if flags & !(FLAG_FDE_SORTED | FLAG_FRAME_POINTER | FLAG_FDE_FUNC_START_PCREL) != 0
            || flags & FLAG_FDE_SORTED == 0
        {
            return Err(TableError::UnsupportedFlags);
        }
        if bytes[4] != ABI_AARCH64_LITTLE || bytes[5] != 0 || bytes[6] != 0 {
            return Err(TableError::UnsupportedAbi);
        }
        let body = HEADER_SIZE + bytes[7] as usize;
        let functions = or_stop!(read_u32(bytes, 8), Err) as usize;
        let fre_len = or_stop!(read_u32(bytes, 16), Err) as usize;
        let fdes = body + or_stop!(read_u32(bytes, 20), Err) as usize;
        let fres = body + or_stop!(read_u32(bytes, 24), Err) as usize;
        // Sizes from the header are at most 2^32 each: no overflow in 64-bit usize arithmetic,
        // and on a 32-bit host a section that large cannot be in memory anyway.
        let fdes_end = match functions.checked_mul(FDE_SIZE) {
            Some(size) => fdes.saturating_add(size),
            None => return Err(TableError::Truncated),
        };
        let fres_end = fres.saturating_add(fre_len);
        if fdes_end > bytes.len() || fres_end > bytes.len() {
            return Err(TableError::Truncated);
        }
        let descriptors = match bytes[fdes..fdes_end].as_chunks::<FDE_SIZE>() {
            (descriptors, []) => descriptors,
            _ => return Err(TableError::Truncated),
        };
        Ok(Self {
            bytes,
            descriptors,
            address,
            pc_relative: flags & FLAG_FDE_FUNC_START_PCREL != 0,
            fdes,
            functions,
            fres,
            fres_end,
        })
    }

    /// Number of functions.
    pub const fn len(&self) -> usize {
        self.functions
    }

    /// Whether the table lists no function.
    pub const fn is_empty(&self) -> bool {
        self.functions == 0
    }

    /// The address function starts are relative to (the section's).
    pub const fn address(&self) -> u64 {
        self.address
    }

    /// The start address of FDE `index` (`index < len`), the one field the search reads.
    #[inline(always)]
    fn start_of(&self, index: usize) -> u64 {
        let at = self.fdes + index * FDE_SIZE;
        let descriptor = &self.descriptors[index];
        let relative = i32::from_le_bytes([descriptor[0], descriptor[1], descriptor[2], descriptor[3]]) as i64 as u64;
        let base = if self.pc_relative { self.address.wrapping_add(at as u64) } else { self.address };
        base.wrapping_add(relative)
    }

    /// FDE `index`, or `None` past the end.
    pub fn function(&self, index: usize) -> Option<FunctionEntry> {
        if index >= self.functions {
            return None;
        }
        let descriptor = &self.descriptors[index];
        let word = |at: usize| {
            u32::from_le_bytes([descriptor[at], descriptor[at + 1], descriptor[at + 2], descriptor[at + 3]])
        };
        Some(FunctionEntry {
            start: self.start_of(index),
            size: word(4),
            first_row: word(8),
            rows: word(12),
            info: descriptor[16],
        })
    }

    /// The index of the function whose range holds `pc`, by binary search of the sorted starts.
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    #[inline]
    pub fn function_index(&self, pc: u64) -> Option<usize> {
        let descriptors = self.descriptors;
        // start_of(i) = first + i * step + the descriptor's relative start.
        let (first, step) = if self.pc_relative {
            (self.address.wrapping_add(self.fdes as u64), FDE_SIZE as u64)
        } else {
            (self.address, 0)
        };
        let start = |index: usize, descriptor: &[u8; FDE_SIZE]| {
            let relative = i32::from_le_bytes([descriptor[0], descriptor[1], descriptor[2], descriptor[3]]);
            first.wrapping_add(index as u64 * step).wrapping_add(relative as i64 as u64)
        };
        // Invariant: every FDE below `low` starts at or before `pc`, every one from `high` after.
        let mut low = 0;
        let mut high = descriptors.len();
        while low < high {
            let middle = low + (high - low) / 2;
            if start(middle, &descriptors[middle]) <= pc {
                low = middle + 1;
            } else {
                high = middle;
            }
        }
        if low == 0 {
            return None;
        }
        let index = low - 1;
        let descriptor = &descriptors[index];
        let size = u32::from_le_bytes([descriptor[4], descriptor[5], descriptor[6], descriptor[7]]);
        if pc.wrapping_sub(start(index, descriptor)) < u64::from(size) { Some(index) } else { None }
    }

    /// The row that applies at `pc`: `Ok(None)` if no function (or no row) covers it, `Err` if
    /// the function's entry or rows are corrupt. The scan reads each row's start and info byte
    /// (enough to step over it) and decodes only the row it stops at.
    #[cfg_attr(feature = "kernel", sanitize(kernel_hwaddress = "off"))]
    #[inline]
    pub fn find(&self, pc: u64) -> Result<Option<UnwindRow>, TableError> {
        let index = match self.function_index(pc) {
            Some(index) => index,
            None => return Ok(None),
        };
        let function = match self.function(index) {
            Some(function) => function,
            None => return Err(TableError::BadFunction { index }),
        };
        let offset = pc - function.start;
        let (mut at, width) = or_stop!(self.rows_of(index, &function), Err);
        let rows = &self.bytes[..self.fres_end];
        let mut found = None;
        let mut left = function.rows;
        while left > 0 {
            let start = match width {
                1 => or_stop!(read_u8(rows, at), Err) as u32,
                2 => or_stop!(read_u16(rows, at), Err) as u32,
                _ => or_stop!(read_u32(rows, at), Err),
            };
            if start as u64 > offset {
                break;
            }
            let info = or_stop!(read_u8(rows, at + width), Err);
            let count = ((info >> 1) & 0xf) as usize;
            let offset_width = match (info >> 5) & 3 {
                0 => 1,
                1 => 2,
                2 => 4,
                _ => return Err(TableError::BadRow { index }),
            };
            if count == 0 || count > 3 {
                return Err(TableError::BadRow { index });
            }
            found = Some(at);
            at += width + 1 + count * offset_width;
            left -= 1;
        }
        match found {
            Some(at) => match self.row_at(index, at, width) {
                Ok(stored) => Ok(Some(stored.row)),
                Err(error) => Err(error),
            },
            None => Ok(None),
        }
    }

    /// Where FDE `index`'s rows start and the width of their start offsets.
    #[inline(always)]
    fn rows_of(&self, index: usize, function: &FunctionEntry) -> Result<(usize, usize), TableError> {
        let width = match function.info & 0xf {
            FRE_TYPE_ADDR1 => 1,
            FRE_TYPE_ADDR2 => 2,
            FRE_TYPE_ADDR4 => 4,
            _ => return Err(TableError::BadFunction { index }),
        };
        if function.info & FDE_TYPE_PCMASK != 0 || function.first_row as usize > self.fres_end - self.fres {
            return Err(TableError::BadFunction { index });
        }
        Ok((self.fres + function.first_row as usize, width))
    }

    /// Decodes the row at `at` (start offsets `width` bytes wide), inside the FRE sub-section.
    #[inline(always)]
    fn row_at(&self, index: usize, at: usize, width: usize) -> Result<StoredRow, TableError> {
        let rows = &self.bytes[..self.fres_end];
        let bad = TableError::BadRow { index };
        let start = match width {
            1 => or_stop!(read_u8(rows, at), Err) as u32,
            2 => or_stop!(read_u16(rows, at), Err) as u32,
            _ => or_stop!(read_u32(rows, at), Err),
        };
        let info = or_stop!(read_u8(rows, at + width), Err);
        let count = (info >> 1) & 0xf;
        let offset_width = match (info >> 5) & 3 {
            0 => 1,
            1 => 2,
            2 => 4,
            _ => return Err(bad),
        };
        if count == 0 || count > 3 {
            return Err(bad);
        }
        let mut next = at + width + 1;
        let cfa_offset = or_stop!(read_offset(rows, next, offset_width), Err);
        next += offset_width;
        let mut ra_offset = None;
        let mut fp_offset = None;
        if count >= 2 {
            ra_offset = Some(or_stop!(read_offset(rows, next, offset_width), Err));
            next += offset_width;
        }
        if count == 3 {
            fp_offset = Some(or_stop!(read_offset(rows, next, offset_width), Err));
            next += offset_width;
        }
        let cfa_base = if info & FRE_BASE_SP != 0 { CfaBase::StackPointer } else { CfaBase::FramePointer };
        let row = UnwindRow { cfa_base, cfa_offset, ra_offset, fp_offset, ra_signed: info & FRE_RA_SIGNED != 0 };
        Ok(StoredRow { start, row, next })
    }

    /// The rows of FDE `index`, as (start offset in the function, row), in order.
    pub fn rows(&self, index: usize) -> Result<Rows<'_, 'a>, TableError> {
        let function = match self.function(index) {
            Some(function) => function,
            None => return Err(TableError::BadFunction { index }),
        };
        let (at, width) = self.rows_of(index, &function)?;
        Ok(Rows { table: self, index, at, width, left: function.rows })
    }

    /// Validates the whole table: every FDE's rows decode inside the FRE sub-section, rows start
    /// at 0 and strictly increase inside the function, offsets are plausible (CFA offset
    /// non-negative, saved slots below the CFA, all 8-aligned), and functions are sorted and do
    /// not overlap. Returns the number of rows.
    pub fn check(&self) -> Result<usize, TableError> {
        let mut rows = 0;
        let mut previous_end = 0u64;
        for index in 0..self.functions {
            let function = self.function(index).ok_or(TableError::BadFunction { index })?;
            if index > 0 && function.start < previous_end {
                return Err(TableError::Unordered { index });
            }
            previous_end =
                function.start.checked_add(u64::from(function.size)).ok_or(TableError::BadFunction { index })?;
            let mut expected = 0u64;
            for (position, entry) in self.rows(index)?.enumerate() {
                let (start, row) = entry?;
                let start = u64::from(start);
                let plausible = |offset: Option<i32>| offset.is_none_or(|offset| offset < 0 && offset % 8 == 0);
                if (position == 0 && start != 0)
                    || (position > 0 && start < expected)
                    || start >= u64::from(function.size)
                    || row.cfa_offset < 0
                    || row.cfa_offset % 8 != 0
                    || !plausible(row.ra_offset)
                    || !plausible(row.fp_offset)
                {
                    return Err(TableError::BadRow { index });
                }
                expected = start + 1;
                rows += 1;
            }
        }
        Ok(rows)
    }
}

/// The rows of one function ([`SFrameTable::rows`]).
pub struct Rows<'t, 'a> {
    table: &'t SFrameTable<'a>,
    index: usize,
    at: usize,
    width: usize,
    left: u32,
}

impl Iterator for Rows<'_, '_> {
    type Item = Result<(u32, UnwindRow), TableError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        match self.table.row_at(self.index, self.at, self.width) {
            Ok(stored) => {
                self.at = stored.next;
                Some(Ok((stored.start, stored.row)))
            }
            Err(error) => {
                self.left = 0;
                Some(Err(error))
            }
        }
    }
}

/// Writing tables (the build tool's converter, and tests).
#[cfg(any(test, feature = "encode"))]
pub mod encode {
    extern crate alloc;

    use alloc::vec::Vec;

    use super::*;

    /// One function to describe: its rows as (start offset in the function, row), in order,
    /// the first at offset 0.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct Function {
        /// Address of its first instruction.
        pub start: u64,
        /// Size in bytes.
        pub size: u32,
        /// Rows, by increasing start offset.
        pub rows: Vec<(u32, UnwindRow)>,
    }

    /// Why a table could not be written.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum EncodeError {
        /// A function starts more than 2 GiB away from the section.
        TooFar {
            /// The function's start.
            start: u64,
        },
        /// A row saves the FP but not the RA: SFrame v2 on AArch64 has no slot for that.
        FpWithoutRa {
            /// The function's start.
            start: u64,
        },
        /// More than 2^32 bytes or entries.
        TooLarge,
    }

    /// The width code and byte count of the narrowest signed field holding every value.
    fn offset_width(values: &[i32]) -> (u8, usize) {
        if values.iter().all(|value| i8::try_from(*value).is_ok()) {
            (0, 1)
        } else if values.iter().all(|value| i16::try_from(*value).is_ok()) {
            (1, 2)
        } else {
            (2, 4)
        }
    }

    /// The table for `functions` (any order; written sorted), for a section at `address`.
    pub fn table(functions: &[Function], address: u64) -> Result<Vec<u8>, EncodeError> {
        let mut sorted: Vec<&Function> = functions.iter().collect();
        sorted.sort_by_key(|function| function.start);
        let mut fdes = Vec::with_capacity(sorted.len() * FDE_SIZE);
        let mut fres = Vec::new();
        let mut row_count = 0u32;
        for function in sorted {
            let start = i32::try_from(function.start.wrapping_sub(address) as i64)
                .map_err(|_| EncodeError::TooFar { start: function.start })?;
            let (fre_type, width) = match function.size {
                0..=0xff => (FRE_TYPE_ADDR1, 1),
                0x100..=0xffff => (FRE_TYPE_ADDR2, 2),
                _ => (FRE_TYPE_ADDR4, 4),
            };
            let first_row = u32::try_from(fres.len()).map_err(|_| EncodeError::TooLarge)?;
            for (offset, row) in &function.rows {
                fres.extend_from_slice(&offset.to_le_bytes()[..width]);
                let mut values = Vec::with_capacity(3);
                values.push(row.cfa_offset);
                match (row.ra_offset, row.fp_offset) {
                    (None, None) => {}
                    (Some(ra), None) => values.push(ra),
                    (Some(ra), Some(fp)) => values.extend([ra, fp]),
                    (None, Some(_)) => return Err(EncodeError::FpWithoutRa { start: function.start }),
                }
                let (size_code, size) = offset_width(&values);
                let base = if row.cfa_base == CfaBase::StackPointer { FRE_BASE_SP } else { 0 };
                let signed = if row.ra_signed { FRE_RA_SIGNED } else { 0 };
                fres.push(base | (values.len() as u8) << 1 | size_code << 5 | signed);
                for value in values {
                    fres.extend_from_slice(&value.to_le_bytes()[..size]);
                }
            }
            let rows = u32::try_from(function.rows.len()).map_err(|_| EncodeError::TooLarge)?;
            row_count = row_count.checked_add(rows).ok_or(EncodeError::TooLarge)?;
            fdes.extend_from_slice(&start.to_le_bytes());
            fdes.extend_from_slice(&function.size.to_le_bytes());
            fdes.extend_from_slice(&first_row.to_le_bytes());
            fdes.extend_from_slice(&rows.to_le_bytes());
            fdes.extend_from_slice(&[fre_type, 0, 0, 0]);
        }
        let count = |value: usize| u32::try_from(value).map_err(|_| EncodeError::TooLarge);
        let mut table = Vec::with_capacity(HEADER_SIZE + fdes.len() + fres.len());
        table.extend_from_slice(&MAGIC.to_le_bytes());
        table.extend_from_slice(&[VERSION, FLAG_FDE_SORTED, ABI_AARCH64_LITTLE, 0, 0, 0]);
        table.extend_from_slice(&count(fdes.len() / FDE_SIZE)?.to_le_bytes());
        table.extend_from_slice(&row_count.to_le_bytes());
        table.extend_from_slice(&count(fres.len())?.to_le_bytes());
        table.extend_from_slice(&0u32.to_le_bytes());
        table.extend_from_slice(&count(fdes.len())?.to_le_bytes());
        table.extend_from_slice(&fdes);
        table.extend_from_slice(&fres);
        Ok(table)
    }
}
