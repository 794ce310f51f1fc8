//! Translation tables: 4 KiB granule, 39-bit VA, kernel in TTBR1 (ARM ARM D8.3, D8.4).
//!
//! Virtual layout (TTBR1, 0xFFFF_FF80_0000_0000 upwards, TCR_EL1.TBI1 set):
//! - linear map: VA = PA + `VA_OFFSET`, for RAM, the kernel image and devices;
//! - text alias: VA = PA + `TEXT_ALIAS_OFFSET`, a writable, never executable second mapping of
//!   the kernel text, the only way probes and ftrace modify code;
//! - sanitizer shadow: one byte per 16-byte granule at `shadow_of(va)`, computed exactly as the
//!   compiler's outlined checks do (`sbfx` of bits [55:4], plus `SHADOW_OFFSET`). RAM has real,
//!   writable shadow pages; every other shadow address (devices, text alias, holes) maps one
//!   shared read-only page of 0xFF, the tag of an untagged kernel pointer.
//!
//! The kernel image is mapped W^X per page: text read-only executable, rodata read-only, data and
//! stacks read-write non-executable, guard pages not mapped at all.

use crate::inject::{self, Fault};
use core::ptr::addr_of_mut;

/// Kernel VA = PA + this (the base of the 39-bit TTBR1 range).
pub const VA_OFFSET: u64 = protocol::VA_OFFSET;
/// Writable alias of kernel text: alias VA = PA + this.
pub const TEXT_ALIAS_OFFSET: u64 = 0xFFFF_FFA0_0000_0000;
/// The sanitizer's mapping offset. xtask passes the same value to the compiler as
/// `-hwasan-mapping-offset` (see xtask's build variants); the `shadow` test checks they agree.
pub const SHADOW_OFFSET: u64 = 0xFFFF_FFC8_0000_0000;

/// MAIR_EL1: index 0 Device-nGnRE, 1 Normal write-back, 2 Normal non-cacheable; in build
/// variant `mte`, 3 Tagged Normal write-back (0xF0: memory with MTE allocation tags; used only
/// once the boot path checked that the CPU has MTE).
pub const MAIR: u64 = 0x04 | (0xff << 8) | (0x44 << 16) | if cfg!(feature = "mte") { 0xf0 << 24 } else { 0 };
const ATTR_DEVICE: u64 = 0 << 2;
const ATTR_NORMAL: u64 = 1 << 2;
const ATTR_TAGGED: u64 = 3 << 2;

/// TCR_EL1: T0SZ = T1SZ = 25 (39-bit VA), 4 KiB granules, inner-shareable write-back walks,
/// top-byte-ignore for both halves. IPS is filled in at boot from ID_AA64MMFR0_EL1.
pub const TCR: u64 = 25
    | (1 << 8)
    | (1 << 10)
    | (3 << 12)
    | (25 << 16)
    | (1 << 24)
    | (1 << 26)
    | (3 << 28)
    | (2 << 30)
    | TCR_TBI0
    | TCR_TBI1;
pub const TCR_EPD0: u64 = 1 << 7;
pub const TCR_TBI0: u64 = 1 << 37;
pub const TCR_TBI1: u64 = 1 << 38;

pub const PAGE_SIZE: u64 = 4096;

/// A kernel page whose mapping the TLB shootdown test changes at run time (`retarget_test_page`):
/// 15 GiB into the upper half, where no RAM or device is mapped, and inside the 16 GiB whose
/// shadow is mapped (the sanitizer's checks read it).
pub const TLB_TEST_PAGE: u64 = VA_OFFSET + (15 << 30);

/// The live descriptor of `TLB_TEST_PAGE` (its address; 0 before `mm::init`).
static TLB_TEST_ENTRY: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);

/// Drops every CPU's TLB entries for ASID `asid` (a user address space rebuilt for a new task:
/// the slot's last task may have run on another CPU), after the new tables are published. Only
/// this CPU's under `inject::Fault::LocalTlbi` (`smp.tlbi=local`: the shootdown test must then
/// fail).
pub fn invalidate_asid(asid: u64) {
    let operand = asid << 48;
    if inject::on(Fault::LocalTlbi) {
        // SAFETY: TLB maintenance only; the barriers order it after the table writes.
        unsafe {
            core::arch::asm!("dsb ishst", "tlbi aside1, {}", "dsb nsh", "isb", in(reg) operand, options(nostack, preserves_flags))
        };
    } else {
        // SAFETY: as above, broadcast to the inner-shareable domain (every CPU).
        unsafe {
            core::arch::asm!("dsb ishst", "tlbi aside1is, {}", "dsb ish", "isb", in(reg) operand, options(nostack, preserves_flags))
        };
    }
}

/// Drops every CPU's TLB entries for the kernel page at `va` (all ASIDs), after its descriptor
/// changed. Only this CPU's under `inject::Fault::LocalTlbi`, as for `invalidate_asid`.
pub fn invalidate_kernel_page(va: u64) {
    let operand = (va >> 12) & ((1 << 44) - 1);
    if inject::on(Fault::LocalTlbi) {
        // SAFETY: TLB maintenance only; the barriers order it after the descriptor write.
        unsafe {
            core::arch::asm!("dsb ishst", "tlbi vaae1, {}", "dsb nsh", "isb", in(reg) operand, options(nostack, preserves_flags))
        };
    } else {
        // SAFETY: as above, broadcast to the inner-shareable domain (every CPU).
        unsafe {
            core::arch::asm!("dsb ishst", "tlbi vaae1is, {}", "dsb ish", "isb", in(reg) operand, options(nostack, preserves_flags))
        };
    }
}

/// Points `TLB_TEST_PAGE` at the physical page `pa` (kernel read-write) and invalidates the old
/// translation (broadcast, or local under `smp.tlbi=local`). Only the shootdown test calls it.
pub fn retarget_test_page(pa: u64) {
    let entry = TLB_TEST_ENTRY.load(core::sync::atomic::Ordering::Acquire) as *mut u64;
    assert!(!entry.is_null() && pa.is_multiple_of(PAGE_SIZE), "the TLB test page is mapped at memory init");
    // SAFETY: `entry` is the live level-3 descriptor of TLB_TEST_PAGE (recorded by `mm::init`),
    // which only this function changes; the old translation is invalidated right after.
    unsafe { core::ptr::write_volatile(entry, pa | Descriptor::PAGE | Attributes::ReadWrite.bits()) };
    invalidate_kernel_page(TLB_TEST_PAGE);
}
const BLOCK_SIZE: u64 = 2 << 20;
const ENTRIES: usize = 512;

/// The shadow address the compiler's checks read for `va`. Always inlined: the sanitizer's
/// range checks call it once per granule, and LLVM does not inline an instrumented callee into
/// their uninstrumented loop on its own (it did only while both sat in one codegen unit).
#[inline(always)]
pub const fn shadow_of(va: u64) -> u64 {
    (((va | (0xff << 56)) as i64 >> 4) as u64).wrapping_add(SHADOW_OFFSET)
}

/// Index of `va`'s entry in the TTBR1 level-1 table.
pub const fn l1_index(va: u64) -> u64 {
    (va >> 30) & 0x1ff
}

/// Translation table descriptor bits (ARM ARM D8.3.1).
pub struct Descriptor;

impl Descriptor {
    pub const TABLE: u64 = 0b11;
    const PAGE: u64 = 0b11;
    const BLOCK: u64 = 0b01;
    const AP_READ_ONLY: u64 = 1 << 7;
    const INNER_SHAREABLE: u64 = 3 << 8;
    const ACCESS_FLAG: u64 = 1 << 10;
    const PXN: u64 = 1 << 53;
    const UXN: u64 = 1 << 54;
    const ADDRESS_MASK: u64 = 0x0000_ffff_ffff_f000;

    /// Attributes of the shared read-only shadow page (a level-3 page descriptor without address).
    pub const SHADOW_PAGE_ATTRS: u64 = Self::PAGE | Attributes::ReadOnly.bits();

    /// The early 1 GiB RWX block holding the image (identity and linear map alike).
    pub const fn early_ram_block(pa: u64) -> u64 {
        (pa & !((1 << 30) - 1)) | Self::BLOCK | ATTR_NORMAL | Self::INNER_SHAREABLE | Self::ACCESS_FLAG | Self::UXN
    }

    /// The early 1 GiB device block holding the console.
    pub const fn early_device_block(pa: u64) -> u64 {
        (pa & !((1 << 30) - 1)) | Self::BLOCK | Attributes::Device.bits()
    }
}

/// What a mapping permits.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Attributes {
    /// Kernel text: read-only, executable at EL1.
    Text,
    /// Read-only data, never executable.
    ReadOnly,
    /// Read-write data, never executable.
    ReadWrite,
    /// Device-nGnRE MMIO, never executable.
    Device,
    /// Read-write data, never executable, with MTE allocation tags (build variant `mte`; plain
    /// `ReadWrite` elsewhere).
    TaggedReadWrite,
}

impl Attributes {
    const fn bits(self) -> u64 {
        let common = Descriptor::ACCESS_FLAG | Descriptor::UXN;
        match self {
            Self::Text => common | ATTR_NORMAL | Descriptor::INNER_SHAREABLE | Descriptor::AP_READ_ONLY,
            Self::ReadOnly => {
                common | ATTR_NORMAL | Descriptor::INNER_SHAREABLE | Descriptor::AP_READ_ONLY | Descriptor::PXN
            }
            Self::ReadWrite => common | ATTR_NORMAL | Descriptor::INNER_SHAREABLE | Descriptor::PXN,
            Self::Device => common | ATTR_DEVICE | Descriptor::PXN,
            Self::TaggedReadWrite => {
                let attr = if cfg!(feature = "mte") { ATTR_TAGGED } else { ATTR_NORMAL };
                common | attr | Descriptor::INNER_SHAREABLE | Descriptor::PXN
            }
        }
    }
}

#[repr(C, align(4096))]
pub struct Table([u64; ENTRIES]);

unsafe extern "C" {
    // The shared shadow structures (boot.S): filled before the first Rust instruction, then only
    // read, by the MMU's table walks. Rust takes nothing but their addresses, so plain `static`s.
    static SHADOW_L2: Table;
    static SHADOW_L3: Table;
    static SHADOW_MATCH_ALL_PAGE: [u8; 4096];
    fn switch_ttbr1_idmap(ttbr1: u64);
}

/// Tables for the final kernel address space. Enough for the image's pages, devices, the shadow
/// and private copies of the shared shadow tables; `MapError::OutOfTables` says when not. The
/// one `KernelSpace` takes the lock for good (the tables live as long as the kernel). A raw
/// `spin::Mutex`, not an `IrqSpinLock`: it is a once-only claim (`try_lock`, then the guard is
/// leaked), never waited on, so no IRQ can find it held; an `IrqSpinLock`'s guard would keep IRQs
/// masked for good.
const TABLE_POOL_SIZE: usize = 48;
static TABLE_POOL: spin::Mutex<[Table; TABLE_POOL_SIZE]> =
    spin::Mutex::new([const { Table([0; ENTRIES]) }; TABLE_POOL_SIZE]);

#[derive(Debug, defmt::Format)]
pub enum MapError {
    OutOfTables,
    /// A second kernel space: the table pool belongs to the first.
    PoolTaken,
    Misaligned {
        va: u64,
        pa: u64,
        size: u64,
    },
    AlreadyMapped {
        va: u64,
    },
}

/// Physical address of something in the kernel image or the linear map.
pub fn pa_of(va: u64) -> u64 {
    va - VA_OFFSET
}

/// The kernel's upper-half address space while it is being built.
pub struct KernelSpace {
    root: *mut Table,
    /// The pool's first table (TABLE_POOL, taken for good).
    pool: *mut Table,
    tables_used: usize,
}

impl KernelSpace {
    /// Starts from an empty level-1 table whose shadow entries map the shared 0xFF shadow.
    pub fn new() -> Result<Self, MapError> {
        let pool = spin::MutexGuard::leak(TABLE_POOL.try_lock().ok_or(MapError::PoolTaken)?);
        let mut space = Self { root: core::ptr::null_mut(), pool: pool.as_mut_ptr(), tables_used: 0 };
        space.root = space.alloc_table()?;
        let shared_l2 = pa_of(&raw const SHADOW_L2 as u64) | Descriptor::TABLE;
        for va in [VA_OFFSET, TEXT_ALIAS_OFFSET] {
            // SAFETY: root points to a table from the pool, exclusively owned by this space.
            unsafe { (*space.root).0[l1_index(shadow_of(va)) as usize] = shared_l2 };
        }
        Ok(space)
    }

    fn alloc_table(&mut self) -> Result<*mut Table, MapError> {
        if self.tables_used == TABLE_POOL_SIZE {
            return Err(MapError::OutOfTables);
        }
        // SAFETY: tables_used < TABLE_POOL_SIZE, so the pointer stays inside the pool, which this
        // space owns (its lock was leaked); each table is handed out once (tables_used only grows).
        let table = unsafe { self.pool.add(self.tables_used) };
        self.tables_used += 1;
        Ok(table)
    }

    /// The next-level table of `entry`, creating it, or copying it when it is one of the shared
    /// shadow tables (those must never be written: every non-RAM shadow address uses them).
    fn next_table(&mut self, entry: *mut u64) -> Result<*mut Table, MapError> {
        // SAFETY: entry points into a table owned by this space.
        let descriptor = unsafe { *entry };
        if descriptor & 0b11 == Descriptor::TABLE {
            let va = (descriptor & Descriptor::ADDRESS_MASK) + VA_OFFSET;
            if !is_shared_shadow(descriptor) {
                return Ok(va as *mut Table);
            }
            let copy = self.alloc_table()?;
            // SAFETY: copy is a fresh pool table; va is a shared table, readable.
            unsafe { (*copy).0 = (*(va as *const Table)).0 };
            // SAFETY: as above, entry is ours to write.
            unsafe { *entry = pa_of(copy as u64) | Descriptor::TABLE };
            return Ok(copy);
        }
        if descriptor & 1 != 0 {
            return Err(MapError::AlreadyMapped { va: 0 });
        }
        let table = self.alloc_table()?;
        // SAFETY: entry is ours to write; the new table is zeroed (.bss).
        unsafe { *entry = pa_of(table as u64) | Descriptor::TABLE };
        Ok(table)
    }

    /// Maps `[va, va + size)` to `[pa, pa + size)`: 2 MiB blocks where alignment allows, 4 KiB
    /// pages elsewhere. Never replaces an existing mapping.
    pub fn map(&mut self, va: u64, pa: u64, size: u64, attributes: Attributes) -> Result<(), MapError> {
        if !(va | pa | size).is_multiple_of(PAGE_SIZE) {
            return Err(MapError::Misaligned { va, pa, size });
        }
        let mut offset = 0;
        while offset < size {
            let (va, pa) = (va + offset, pa + offset);
            let l1_entry = self.entry(self.root, (va >> 30) & 0x1ff);
            let l2 = self.next_table(l1_entry)?;
            let l2_entry = self.entry(l2, (va >> 21) & 0x1ff);
            let block_fits = (va | pa) % BLOCK_SIZE == 0 && size - offset >= BLOCK_SIZE;
            // SAFETY: l2_entry points into a table of this space.
            let l2_descriptor = unsafe { *l2_entry };
            let replaceable = l2_descriptor & 0b11 != Descriptor::TABLE || is_shared_shadow(l2_descriptor);
            if block_fits && replaceable {
                // SAFETY: as above; a shared shadow table is replaced, never written.
                unsafe { *l2_entry = 0 };
                self.write(l2_entry, pa | Descriptor::BLOCK | attributes.bits(), va)?;
                offset += BLOCK_SIZE;
                continue;
            }
            let l3 = self.next_table(l2_entry)?;
            let l3_entry = self.entry(l3, (va >> 12) & 0x1ff);
            self.write(l3_entry, pa | Descriptor::PAGE | attributes.bits(), va)?;
            offset += PAGE_SIZE;
        }
        Ok(())
    }

    fn entry(&self, table: *mut Table, index: u64) -> *mut u64 {
        // SAFETY: index < 512, so the entry lies inside the table.
        unsafe { addr_of_mut!((*table).0[index as usize]) }
    }

    fn write(&mut self, entry: *mut u64, descriptor: u64, va: u64) -> Result<(), MapError> {
        // SAFETY: entry points into a table of this space, not yet live.
        unsafe {
            if *entry & 1 != 0 && !is_shared_shadow(*entry) {
                return Err(MapError::AlreadyMapped { va });
            }
            *entry = descriptor;
        }
        Ok(())
    }

    /// Maps the one page `va` to `pa` (read-write) and remembers its level-3 descriptor for
    /// `retarget_test_page`.
    pub fn map_test_page(&mut self, va: u64, pa: u64) -> Result<(), MapError> {
        self.map(va, pa, PAGE_SIZE, Attributes::ReadWrite)?;
        let l1_entry = self.entry(self.root, (va >> 30) & 0x1ff);
        let l2 = self.next_table(l1_entry)?;
        let l3 = self.next_table(self.entry(l2, (va >> 21) & 0x1ff))?;
        TLB_TEST_ENTRY.store(self.entry(l3, (va >> 12) & 0x1ff) as u64, core::sync::atomic::Ordering::Release);
        Ok(())
    }

    pub fn tables_used(&self) -> usize {
        self.tables_used
    }

    /// Makes this space live: switches TTBR1 from the identity map and turns off TTBR0 walks.
    pub fn activate(self) {
        // SAFETY: publishes the tables before the walker can see them.
        unsafe { core::arch::asm!("dsb ishst", options(nostack, preserves_flags)) };
        let switch = pa_of(switch_ttbr1_idmap as *const () as u64);
        // SAFETY: the trampoline runs from the identity map, which TTBR0 still holds, and touches
        // neither memory nor upper-half addresses; the new tables map this code, stack and shadow
        // call stack at the same addresses as the early ones.
        unsafe {
            let switch: unsafe extern "C" fn(u64) = core::mem::transmute(switch);
            switch(pa_of(self.root as u64));
        }
        // SAFETY: nothing runs from the identity map any more; disabling TTBR0 walks leaves it for
        // EL0 address spaces.
        unsafe {
            core::arch::asm!(
                "mrs {tcr}, tcr_el1",
                "orr {tcr}, {tcr}, {epd0}",
                "msr tcr_el1, {tcr}",
                "msr ttbr0_el1, xzr",
                "isb",
                "tlbi vmalle1",
                "dsb nsh",
                "isb",
                tcr = out(reg) _,
                epd0 = const TCR_EPD0,
                options(nostack),
            )
        };
    }
}

/// Whether a descriptor points at one of the shared shadow structures (which are replaced by
/// private copies or real shadow memory, never written).
fn is_shared_shadow(descriptor: u64) -> bool {
    let pa = descriptor & Descriptor::ADDRESS_MASK;
    let shared = [&raw const SHADOW_L2 as u64, &raw const SHADOW_L3 as u64, &raw const SHADOW_MATCH_ALL_PAGE as u64];
    shared.iter().any(|&va| pa_of(va) == pa)
}
