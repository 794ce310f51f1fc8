//! The `.ksyms` symbol table: xtask writes it into the linked image, the kernel reads it.
//!
//! Layout (little-endian):
//!
//! ```text
//! 0   magic  u32 = "KSYM"
//! 4   count  u32
//! 8   count x { address u64, name_offset u32, name_length u32 }   sorted by address
//! ..  names (UTF-8, no terminators); name_offset counts from the start of the section
//! ```

pub const MAGIC: u32 = u32::from_le_bytes(*b"KSYM");
/// Bytes before the first entry (magic, count).
pub const HEADER: usize = 8;
/// Bytes per entry.
pub const ENTRY: usize = 16;

/// One entry, as stored.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Entry {
    pub address: u64,
    pub name_offset: u32,
    pub name_length: u32,
}

impl Entry {
    pub fn to_bytes(self) -> [u8; ENTRY] {
        let mut bytes = [0; ENTRY];
        bytes[0..8].copy_from_slice(&self.address.to_le_bytes());
        bytes[8..12].copy_from_slice(&self.name_offset.to_le_bytes());
        bytes[12..16].copy_from_slice(&self.name_length.to_le_bytes());
        bytes
    }
}

/// A table in memory, checked on creation: the magic, and room for `count` entries.
#[derive(Clone, Copy)]
pub struct Table<'a> {
    bytes: &'a [u8],
    count: usize,
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    bytes.get(at..at + 4).map(|word| u32::from_le_bytes([word[0], word[1], word[2], word[3]]))
}

impl<'a> Table<'a> {
    /// None when `bytes` holds no table (an image xtask did not fill: zeros).
    pub fn new(bytes: &'a [u8]) -> Option<Self> {
        if u32_at(bytes, 0)? != MAGIC {
            return None;
        }
        let count = u32_at(bytes, 4)? as usize;
        let end = count.checked_mul(ENTRY)?.checked_add(HEADER)?;
        (end <= bytes.len()).then_some(Self { bytes, count })
    }

    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Entry `index` (< len).
    pub fn entry(&self, index: usize) -> Entry {
        let at = HEADER + index * ENTRY;
        let word = |offset: usize| u32_at(self.bytes, at + offset).unwrap_or(0);
        Entry { address: u64::from(word(0)) | u64::from(word(4)) << 32, name_offset: word(8), name_length: word(12) }
    }

    pub fn address(&self, index: usize) -> u64 {
        self.entry(index).address
    }

    /// The name of entry `index`, "?" when it does not lie in the table or is not UTF-8.
    pub fn name(&self, index: usize) -> &'a str {
        let entry = self.entry(index);
        let (offset, length) = (entry.name_offset as usize, entry.name_length as usize);
        self.bytes.get(offset..offset + length).and_then(|name| core::str::from_utf8(name).ok()).unwrap_or("?")
    }

    /// The name of the function that starts exactly at `address` (entries sorted by address).
    pub fn name_at(&self, address: u64) -> Option<&'a str> {
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

/// The table for `functions` (sorted by address, one name each), as xtask writes it into the image.
#[cfg(any(test, feature = "writer"))]
pub fn serialize<S: AsRef<str>>(functions: &[(u64, S)]) -> std::vec::Vec<u8> {
    let names_start = HEADER + ENTRY * functions.len();
    let names: usize = functions.iter().map(|(_, name)| name.as_ref().len()).sum();
    let mut table = std::vec::Vec::with_capacity(names_start + names);
    table.extend_from_slice(&MAGIC.to_le_bytes());
    table.extend_from_slice(&(functions.len() as u32).to_le_bytes());
    let mut name_offset = names_start;
    for (address, name) in functions {
        let name_length = name.as_ref().len();
        let entry = Entry { address: *address, name_offset: name_offset as u32, name_length: name_length as u32 };
        table.extend_from_slice(&entry.to_bytes());
        name_offset += name_length;
    }
    for (_, name) in functions {
        table.extend_from_slice(name.as_ref().as_bytes());
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(functions: &[(u64, &str)]) -> Vec<u8> {
        serialize(functions)
    }

    #[test]
    fn round_trip() {
        let bytes = table(&[(0xffff_ff80_4008_0000, "a"), (0xffff_ff80_4008_0040, "kernel::b"), (0x1_0000_0004, "c")]);
        let table = Table::new(&bytes).expect("a table");
        assert_eq!(table.len(), 3);
        assert_eq!(table.name_at(0xffff_ff80_4008_0040), Some("kernel::b"));
        assert_eq!(table.name_at(0xffff_ff80_4008_0044), None);
        assert_eq!(table.address_of("a"), Some(0xffff_ff80_4008_0000));
        assert_eq!(table.address_of("d"), None);
    }

    #[test]
    fn refuses_what_is_not_a_table() {
        assert!(Table::new(&[0; 64]).is_none());
        assert!(Table::new(&[]).is_none());
        // A count that does not fit the bytes.
        let mut bytes = table(&[(16, "x")]);
        bytes[4] = 200;
        assert!(Table::new(&bytes).is_none());
    }

    #[test]
    fn a_name_outside_the_table_reads_as_unknown() {
        let mut bytes = table(&[(16, "x")]);
        bytes[HEADER + 8] = 0xff;
        let table = Table::new(&bytes).expect("a table");
        assert_eq!(table.name(0), "?");
    }
}
