//! The kernel's embedded symbol table, derived from the ELF after linking.
//!
//! ftrace filters tracers by function name (`register("kernel::tests::*")`), so the kernel needs
//! names for its callsites at run time. The linker script reserves a `.ksyms` section (zeros);
//! after the build xtask writes every function symbol into it, demangled without the hash,
//! sorted by address: the symbolizer's list (`log::function_symbols`), one table for both. Addresses do not move: the table is written into the linked image, not
//! linked into it. The layout is `protocol::ksyms` (shared with the kernel's reader,
//! `kernel/src/symbols/names.rs`).

use crate::Failure;
use object::{Object, ObjectSection};
use protocol::ksyms::serialize;
#[cfg(test)]
use protocol::ksyms::{ENTRY, HEADER, MAGIC};

/// Fills the `.ksyms` section of the ELF image `elf` in place.
pub fn embed(elf: &mut [u8]) -> Result<usize, Failure> {
    let (range, table) = {
        let file = object::File::parse(&*elf).map_err(|error| Failure::usage(format!("kernel ELF: {error}")))?;
        let section = file
            .section_by_name(".ksyms")
            .ok_or_else(|| Failure { status: 1, message: "kernel ELF has no .ksyms section".into() })?;
        let (offset, size) = section
            .file_range()
            .ok_or_else(|| Failure { status: 1, message: ".ksyms has no file contents (NOBITS)".into() })?;
        // The symbolizer's own list, so the kernel's names (its reports, ftrace's filters) are the
        // names xtask's symbolizer finds sizes and lines for.
        let functions: Vec<(u64, String)> =
            crate::log::function_symbols(&file).into_iter().map(|symbol| (symbol.start, symbol.name)).collect();
        (offset as usize..(offset + size) as usize, serialize(&functions))
    };
    let section = &mut elf[range];
    if table.len() > section.len() {
        return Err(Failure {
            status: 1,
            message: format!(
                "symbol table needs {} bytes, .ksyms holds {}: grow it in kernel.ld",
                table.len(),
                section.len()
            ),
        });
    }
    section[..table.len()].copy_from_slice(&table);
    section[table.len()..].fill(0);
    Ok(table.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_u32(table: &[u8], at: usize) -> u32 {
        u32::from_le_bytes(table[at..at + 4].try_into().unwrap())
    }

    #[test]
    fn the_kernel_reader_reads_it_back() {
        let functions = [(0x1000, "a::b".to_string()), (0x2000, "c".to_string())];
        let table = serialize(&functions);
        let reader = protocol::ksyms::Table::new(&table).expect("a table");
        assert_eq!(reader.name_at(0x2000), Some("c"));
        assert_eq!(reader.address_of("a::b"), Some(0x1000));
    }

    #[test]
    fn layout_matches_the_kernel_reader() {
        let functions = [(0x1000, "a::b".to_string()), (0x2000, "c".to_string())];
        let table = serialize(&functions);
        assert_eq!(read_u32(&table, 0), MAGIC);
        assert_eq!(read_u32(&table, 4), 2);
        assert_eq!(u64::from_le_bytes(table[8..16].try_into().unwrap()), 0x1000);
        let (offset, length) = (read_u32(&table, 16) as usize, read_u32(&table, 20) as usize);
        assert_eq!(&table[offset..offset + length], b"a::b");
        let (offset, length) = (read_u32(&table, 32) as usize, read_u32(&table, 36) as usize);
        assert_eq!(&table[offset..offset + length], b"c");
        assert_eq!(table.len(), HEADER + 2 * ENTRY + 5);
    }
}
