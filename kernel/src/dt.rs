//! What the kernel takes from the flattened device tree: RAM, GIC, timer, PSCI conduit,
//! bootargs, model; it fills the board's types (`board::Platform`).
//!
//! Firmware and QEMU edit device trees with libfdt, which leaves FDT_NOP tokens inside nodes;
//! flat_device_tree 3.1 loses every node after the first such edited subtree (on QEMU `raspi4b`,
//! the whole root after `/soc`, timer included). `parse` therefore first removes NOP tokens in
//! place: the tree means the same, only shorter.
//!
//! Addresses of devices under a bus node (the BCM2711's `/soc`) are translated to CPU physical
//! addresses through that node's `ranges`. Without a device tree (the Pi 4's firmware passes
//! 0x100 when it has none) or with an empty memory node, the board's fallback is used.

use crate::board::{BoardConfig, CpuList, GicRegions, Platform, PsciConduit, Region};
use flat_device_tree::Fdt;

#[derive(Debug, defmt::Format)]
pub enum DtError {
    BadHeader,
    NoGic,
    NoTimer,
}

/// Bus-to-CPU address translations of one bus node: (child base, parent base, size).
struct Ranges([(u64, u64, u64); 8], usize);

impl Ranges {
    fn translate(&self, region: Region) -> Region {
        for &(child, parent, size) in &self.0[..self.1] {
            if region.base >= child && region.base < child + size {
                return Region { base: region.base - child + parent, size: region.size };
            }
        }
        region
    }
}

fn bus_ranges(fdt: &Fdt<'_>) -> Ranges {
    let mut ranges = Ranges([(0, 0, 0); 8], 0);
    if let Some(soc) = fdt.find_node("/soc") {
        for range in soc.ranges().take(8) {
            ranges.0[ranges.1] = (range.child_bus_address as u64, range.parent_bus_address as u64, range.size as u64);
            ranges.1 += 1;
        }
    }
    ranges
}

fn region(node: flat_device_tree::node::FdtNode<'_, '_>, index: usize, ranges: &Ranges) -> Option<Region> {
    node.reg().nth(index).map(|region| {
        ranges.translate(Region { base: region.starting_address as u64, size: region.size.unwrap_or(0) as u64 })
    })
}

impl Platform {
    /// Parses the device tree at virtual address `dtb` (physical `dtb_pa`).
    ///
    /// # Safety
    /// `dtb` must point to at least 40 readable bytes and, when they hold a device tree header, to
    /// a writable blob of the size it declares that nothing else uses for the rest of the
    /// kernel's life.
    pub unsafe fn parse(dtb: u64, dtb_pa: u64, board: &BoardConfig) -> Result<Self, DtError> {
        // SAFETY: the header is readable (caller's contract); its size bounds the whole blob.
        let header = unsafe { core::slice::from_raw_parts(dtb as *const u8, 40) };
        if header[0..4] != [0xd0, 0x0d, 0xfe, 0xed] {
            return Err(DtError::BadHeader);
        }
        let total = u32::from_be_bytes([header[4], header[5], header[6], header[7]]) as usize;
        // SAFETY: as above, for the size the header declares; the caller gives the blob to the
        // kernel for good, so rewriting it in place is allowed.
        let blob: &'static mut [u8] = unsafe { core::slice::from_raw_parts_mut(dtb as *mut u8, total) };
        strip_nops(blob).ok_or(DtError::BadHeader)?;
        let blob: &'static [u8] = blob;
        let fdt = Fdt::new(blob).map_err(|_| DtError::BadHeader)?;
        let ranges = bus_ranges(&fdt);

        let mut used_fallback = false;
        let ram = fdt
            .memory()
            .ok()
            .and_then(|memory| memory.regions().next())
            .map(|region| Region { base: region.starting_address as u64, size: region.size.unwrap_or(0) as u64 })
            .filter(|ram| ram.size != 0)
            .unwrap_or_else(|| {
                used_fallback = true;
                board.fallback.ram
            });
        let gic = if let Some(node) = fdt.find_compatible(&["arm,gic-v3"]) {
            GicRegions::V3 {
                distributor: region(node, 0, &ranges).ok_or(DtError::NoGic)?,
                redistributor: region(node, 1, &ranges).ok_or(DtError::NoGic)?,
            }
        } else if let Some(node) = fdt.find_compatible(&["arm,cortex-a15-gic", "arm,gic-400"]) {
            GicRegions::V2 {
                distributor: region(node, 0, &ranges).ok_or(DtError::NoGic)?,
                cpu_interface: region(node, 1, &ranges).ok_or(DtError::NoGic)?,
            }
        } else {
            return Err(DtError::NoGic);
        };
        // "arm,armv8-timer" lists secure physical, non-secure physical, virtual and hypervisor
        // timer PPIs as (type, number, flags) triples; PPI n is INTID 16 + n.
        let timer = fdt.find_compatible(&["arm,armv8-timer", "arm,armv7-timer"]).ok_or(DtError::NoTimer)?;
        let interrupts = timer.property("interrupts").ok_or(DtError::NoTimer)?.value;
        let cell = |index: usize| -> Option<u32> {
            interrupts
                .get(index * 4..index * 4 + 4)
                .map(|bytes| u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
        };
        let virtual_timer_intid = 16 + cell(2 * 3 + 1).ok_or(DtError::NoTimer)?;
        // "arm,armv8-pmuv3": one (type, number, flags) triple; type 1 is a PPI.
        let pmu_intid = fdt.find_compatible(&["arm,armv8-pmuv3"]).and_then(|node| {
            let cells = node.property("interrupts")?.value;
            let cell = |index: usize| {
                cells.get(index * 4..index * 4 + 4).map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
            };
            (cell(0)? == 1).then_some(16 + cell(1)?)
        });
        let bootargs = fdt.chosen().ok().and_then(|chosen| chosen.bootargs()).unwrap_or("");
        let model = fdt.root().ok().map(|root| root.model()).unwrap_or("unknown");
        // No /psci node (the Pi 4's firmware): no PSCI, secondaries use the spin table.
        let psci = fdt
            .find_node("/psci")
            .and_then(|node| node.property("method"))
            .and_then(|method| method.as_str())
            .and_then(PsciConduit::from_method);
        let mut cpus = CpuList::EMPTY;
        for cpu in fdt.cpus() {
            let Some(mpidr) = cpu.ids().ok().and_then(|ids| ids.first().ok()) else { continue };
            if cpus.count < CpuList::MAX {
                cpus.mpidr[cpus.count] = mpidr as u64;
                cpus.count += 1;
            }
            cpus.listed += 1;
        }
        Ok(Self {
            dtb: Region { base: dtb_pa, size: total as u64 },
            ram,
            gic,
            virtual_timer_intid,
            pmu_intid,
            bootargs,
            model,
            psci,
            cpus,
            used_fallback,
        })
    }
}

fn be32(blob: &[u8], offset: usize) -> Option<u32> {
    blob.get(offset..offset + 4).map(|bytes| u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
}

/// Removes FDT_NOP tokens from the structure block in place and shrinks `size_dt_struct` to
/// match (devicetree specification v0.4, section 5.4). None if the block is malformed.
fn strip_nops(blob: &mut [u8]) -> Option<()> {
    const BEGIN_NODE: u32 = 1;
    const END_NODE: u32 = 2;
    const PROP: u32 = 3;
    const NOP: u32 = 4;
    const END: u32 = 9;
    let start = be32(blob, 8)? as usize;
    let size = be32(blob, 36)? as usize;
    let end = start.checked_add(size).filter(|&end| end <= blob.len())?;
    let (mut read, mut write) = (start, start);
    loop {
        let token = be32(&blob[..end], read)?;
        let length = match token {
            BEGIN_NODE => {
                let name = blob[read + 4..end].iter().position(|&byte| byte == 0)?;
                4 + (name + 1).next_multiple_of(4)
            }
            PROP => 12 + (be32(&blob[..end], read + 4)? as usize).next_multiple_of(4),
            END_NODE | NOP | END => 4,
            _ => return None,
        };
        if read + length > end {
            return None;
        }
        if token != NOP {
            blob.copy_within(read..read + length, write);
            write += length;
        }
        read += length;
        if token == END {
            break;
        }
    }
    blob[write..end].fill(0);
    blob[36..40].copy_from_slice(&((write - start) as u32).to_be_bytes());
    Some(())
}
