//! Memory: the final kernel address space, the sanitizer shadow that backs RAM, and the
//! sanitizer (kasan/: its heap on the free RAM after the shadow).

pub mod kasan;

use crate::arch::mmu::{self, Attributes, KernelSpace, MapError, PAGE_SIZE, TEXT_ALIAS_OFFSET, VA_OFFSET};
use crate::board::{GicRegions, Platform, Region};
use crate::drivers::gic::GicConfig;
use crate::task::stacks::{SHADOW_STACK_SIZE, STACK_SIZE};
use core::sync::atomic::AtomicU64;

const BLOCK_SIZE: u64 = 2 << 20;

unsafe extern "C" {
    static __kernel_start: u8;
    static __text_end: u8;
    static __rodata_end: u8;
    static __boot_stack_guard: u8;
    static __stack_slots_start: u8;
    static __stack_slots_end: u8;
    static __kernel_end: u8;
}

/// The boot stack's guard page: mapped by nothing, so any access faults.
pub fn boot_stack_guard() -> u64 {
    // SAFETY: only the address of the linker symbol is taken.
    symbol(unsafe { &__boot_stack_guard })
}

fn symbol(address: &u8) -> u64 {
    address as *const u8 as u64
}

/// What `init` set up, for the banner and for later allocators.
#[derive(defmt::Format)]
pub struct Layout {
    pub ram: Region,
    pub shadow: Region,
    /// RAM nobody uses yet (after the kernel image and the shadow).
    pub free: Region,
    pub gic: GicConfig,
    pub tables_used: usize,
}

#[derive(Debug, defmt::Format)]
pub enum InitError {
    Map(MapError),
    /// The RAM shadow must lie in the early-mapped GiB that holds the image.
    NoRoomForShadow {
        needed: u64,
    },
}

impl From<MapError> for InitError {
    fn from(error: MapError) -> Self {
        Self::Map(error)
    }
}

const fn align_up(value: u64, align: u64) -> u64 {
    (value + align - 1) & !(align - 1)
}

fn overlaps(a: Region, b: Region) -> bool {
    a.base < b.end() && b.base < a.end()
}

/// The two physical pages `mmu::TLB_TEST_PAGE` is switched between (test `smp_tlb_shootdown`),
/// owned here because `init` maps the page onto them. Atomics, not a `static mut`: the test
/// writes them through their linear-map alias and reads them through the test page, so their
/// contents change behind any reference to the static.
#[repr(C, align(4096))]
struct TlbTestFrames([[AtomicU64; 512]; 2]);

static TLB_TEST_FRAMES: TlbTestFrames = TlbTestFrames([const { [const { AtomicU64::new(0) }; 512] }; 2]);

/// Physical address of test frame `index` (0 or 1).
pub fn tlb_test_frame(index: usize) -> u64 {
    mmu::pa_of(&raw const TLB_TEST_FRAMES as u64) + index as u64 * mmu::PAGE_SIZE
}

/// Builds the final address space from the device tree and switches to it.
pub fn init(platform: &Platform) -> Result<Layout, InitError> {
    // SAFETY: the linker script defines these symbols; only their addresses are used.
    let (kernel_start, text_end, rodata_end, slots_start, slots_end, kernel_end) = unsafe {
        (
            symbol(&__kernel_start),
            symbol(&__text_end),
            symbol(&__rodata_end),
            symbol(&__stack_slots_start),
            symbol(&__stack_slots_end),
            symbol(&__kernel_end),
        )
    };
    let pa = mmu::pa_of;
    let ram = platform.ram;

    // The RAM shadow: one byte per 16, carved after the image, clear of the device tree, and
    // filled with the match-all tag through the early map before the shadow VA points at it.
    let shadow_size = align_up(ram.size / 16, PAGE_SIZE);
    let mut shadow = Region { base: align_up(pa(kernel_end), BLOCK_SIZE), size: shadow_size };
    if overlaps(shadow, platform.dtb) {
        shadow.base = align_up(platform.dtb.end(), BLOCK_SIZE);
    }
    let early_gib = crate::board::CONFIG.load_address >> 30;
    if shadow.end() > ram.end() || (shadow.end() - 1) >> 30 != early_gib {
        return Err(InitError::NoRoomForShadow { needed: shadow_size });
    }
    // SAFETY: the carve-out is RAM inside the early-mapped GiB that nothing else uses.
    unsafe { core::ptr::write_bytes((shadow.base + VA_OFFSET) as *mut u8, 0xff, shadow_size as usize) };

    let mut space = KernelSpace::new()?;
    // The image, W^X, guard pages left out.
    space.map(kernel_start, pa(kernel_start), text_end - kernel_start, Attributes::Text)?;
    space.map(text_end, pa(text_end), rodata_end - text_end, Attributes::ReadOnly)?;
    space.map(rodata_end, pa(rodata_end), slots_start - rodata_end, Attributes::ReadWrite)?;
    // Stack slots: the shadow call stack and the stack of each, never the guard between them.
    for slot in crate::task::stacks::slots(slots_start, slots_end) {
        space.map(slot.shadow_stack_base(), pa(slot.shadow_stack_base()), SHADOW_STACK_SIZE, Attributes::ReadWrite)?;
        space.map(slot.stack_base(), pa(slot.stack_base()), STACK_SIZE, Attributes::ReadWrite)?;
    }
    space.map(slots_end, pa(slots_end), kernel_end - slots_end, Attributes::ReadWrite)?;
    // The text alias, for patching.
    space.map(
        pa(kernel_start) + TEXT_ALIAS_OFFSET,
        pa(kernel_start),
        text_end - kernel_start,
        Attributes::ReadWrite,
    )?;
    // The rest of RAM.
    let ram_end = ram.end() & !(PAGE_SIZE - 1);
    space.map(ram.base + VA_OFFSET, ram.base, pa(kernel_start) - ram.base, Attributes::ReadWrite)?;
    // The RAM after the image holds the heap: Tagged in build variant `mte` (its tags are MTE's).
    space.map(kernel_end, pa(kernel_end), ram_end - pa(kernel_end), Attributes::TaggedReadWrite)?;
    // Devices.
    let mut map_device = |region: Region| -> Result<u64, MapError> {
        let base = region.base & !(PAGE_SIZE - 1);
        let size = align_up(region.end(), PAGE_SIZE) - base;
        space.map(base + VA_OFFSET, base, size, Attributes::Device)?;
        Ok(region.base + VA_OFFSET)
    };
    map_device(Region { base: crate::board::CONFIG.console_uart, size: 0x1000 })?;
    let gic = match platform.gic {
        GicRegions::V2 { distributor, cpu_interface } => {
            GicConfig::V2 { distributor: map_device(distributor)?, cpu_interface: map_device(cpu_interface)? }
        }
        GicRegions::V3 { distributor, redistributor } => {
            // Every CPU's RD_base and SGI_base frames (the region may describe more CPUs).
            let frames = crate::arch::percpu::CPUS as u64 * crate::drivers::gic::GICR_FRAME_SIZE;
            let redistributor = Region { base: redistributor.base, size: redistributor.size.min(frames) };
            GicConfig::V3 { distributor: map_device(distributor)?, redistributor: map_device(redistributor)? }
        }
    };
    // The TLB shootdown test's page, on the first of its two frames.
    space.map_test_page(mmu::TLB_TEST_PAGE, pa(&raw const TLB_TEST_FRAMES as u64))?;
    // Real shadow for RAM; everything else keeps the shared match-all page.
    space.map(mmu::shadow_of(ram.base + VA_OFFSET), shadow.base, shadow_size, Attributes::ReadWrite)?;
    let tables_used = space.tables_used();
    space.activate();

    let free_base = align_up(shadow.end(), PAGE_SIZE);
    Ok(Layout { ram, shadow, free: Region { base: free_base, size: ram.end() - free_base }, gic, tables_used })
}
