//! The function names ftrace filters by: a table xtask derives from the linked ELF and writes
//! into the reserved `.ksyms` section (layout in `xtask/src/ksyms.rs`): `"KSYM"`, a count, then
//! `{address u64, name_offset u32, name_length u32}` sorted by address, then the names
//! (demangled, without the hash: `kernel::tests::ftrace::traced_add`).

unsafe extern "C" {
    static __ksyms_start: u8;
    static __ksyms_end: u8;
}

const MAGIC: u32 = u32::from_le_bytes(*b"KSYM");
const HEADER: usize = 8;
const ENTRY: usize = 16;

/// The embedded table, or `None` if xtask did not fill it (an image not built by xtask).
pub struct Symbols {
    bytes: &'static [u8],
    count: usize,
}

impl Symbols {
    pub fn get() -> Option<Self> {
        // SAFETY: the linker script reserves `[__ksyms_start, __ksyms_end)` in read-only data;
        // xtask fills it before the image boots and nothing writes it afterwards.
        let bytes = unsafe {
            let start = &raw const __ksyms_start;
            let end = &raw const __ksyms_end;
            core::slice::from_raw_parts(start, end.offset_from(start) as usize)
        };
        let word = |at: usize| u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
        if bytes.len() < HEADER || word(0) != MAGIC {
            return None;
        }
        let count = word(4) as usize;
        (HEADER + count * ENTRY <= bytes.len()).then_some(Self { bytes, count })
    }

    fn u32_at(&self, at: usize) -> u32 {
        u32::from_le_bytes([self.bytes[at], self.bytes[at + 1], self.bytes[at + 2], self.bytes[at + 3]])
    }

    fn address(&self, index: usize) -> u64 {
        let at = HEADER + index * ENTRY;
        u64::from(self.u32_at(at)) | u64::from(self.u32_at(at + 4)) << 32
    }

    fn name(&self, index: usize) -> &'static str {
        let at = HEADER + index * ENTRY;
        let (offset, length) = (self.u32_at(at + 8) as usize, self.u32_at(at + 12) as usize);
        self.bytes.get(offset..offset + length).and_then(|name| core::str::from_utf8(name).ok()).unwrap_or("?")
    }

    /// The name of the function that starts exactly at `address`.
    pub fn name_at(&self, address: u64) -> Option<&'static str> {
        let (mut low, mut high) = (0, self.count);
        while low < high {
            let middle = low + (high - low) / 2;
            match self.address(middle) {
                found if found == address => return Some(self.name(middle)),
                found if found < address => low = middle + 1,
                _ => high = middle,
            }
        }
        None
    }

    /// The address of the first function called exactly `name`.
    pub fn address_of(&self, name: &str) -> Option<u64> {
        (0..self.count).find(|&index| self.name(index) == name).map(|index| self.address(index))
    }
}
