//! The function names ftrace filters by: a table xtask derives from the linked ELF and writes
//! into the reserved `.ksyms` section (layout and reader in `protocol::ksyms`, shared with
//! xtask); names are demangled, without the hash: `kernel::tests::ftrace::traced_add`.

use protocol::ksyms::Table;

unsafe extern "C" {
    static __ksyms_start: u8;
    static __ksyms_end: u8;
}

/// The embedded table, or `None` if xtask did not fill it (an image not built by xtask).
pub struct Symbols {
    table: Table<'static>,
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
        Table::new(bytes).map(|table| Self { table })
    }

    /// The name of the function that starts exactly at `address`.
    pub fn name_at(&self, address: u64) -> Option<&'static str> {
        self.table.name_at(address)
    }

    /// The address of the first function called exactly `name`.
    pub fn address_of(&self, name: &str) -> Option<u64> {
        self.table.address_of(name)
    }
}
