//! What the kernel takes from the flattened device tree: RAM, console, GIC, timer, bootargs.

use flat_device_tree::Fdt;

/// Physical addresses and sizes, as the device tree gives them.
#[derive(Clone, Copy, Debug, defmt::Format)]
pub struct Region {
    pub base: u64,
    pub size: u64,
}

impl Region {
    pub fn end(&self) -> u64 {
        self.base + self.size
    }
}

pub enum GicRegions {
    V2 {
        distributor: Region,
        cpu_interface: Region,
    },
    V3 {
        distributor: Region,
        redistributor: Region,
    },
}

pub struct Platform {
    pub dtb: Region,
    pub ram: Region,
    pub console: Region,
    pub gic: GicRegions,
    /// INTID of the EL1 virtual timer.
    pub virtual_timer_intid: u32,
    pub bootargs: &'static str,
    pub model: &'static str,
}

#[derive(Debug, defmt::Format)]
pub enum DtError {
    BadHeader,
    NoMemory,
    NoConsole,
    NoGic,
    NoTimer,
}

fn first_region(node: flat_device_tree::node::FdtNode<'_, '_>, index: usize) -> Option<Region> {
    node.reg().nth(index).map(|region| Region {
        base: region.starting_address as u64,
        size: region.size.unwrap_or(0) as u64,
    })
}

impl Platform {
    /// Parses the device tree at virtual address `dtb`.
    ///
    /// # Safety
    /// `dtb` must point to mapped memory holding a device tree blob that lives, unmodified, for
    /// the rest of the kernel's life.
    pub unsafe fn parse(dtb: u64, dtb_pa: u64) -> Result<Self, DtError> {
        // SAFETY: the header is readable (caller's contract); its size bounds the whole blob.
        let header = unsafe { core::slice::from_raw_parts(dtb as *const u8, 40) };
        if header[0..4] != [0xd0, 0x0d, 0xfe, 0xed] {
            return Err(DtError::BadHeader);
        }
        let total = u32::from_be_bytes([header[4], header[5], header[6], header[7]]) as usize;
        // SAFETY: as above, for the size the header declares.
        let blob: &'static [u8] = unsafe { core::slice::from_raw_parts(dtb as *const u8, total) };
        let fdt = Fdt::new(blob).map_err(|_| DtError::BadHeader)?;

        let memory = fdt.memory().map_err(|_| DtError::NoMemory)?;
        let ram = memory
            .regions()
            .next()
            .map(|region| Region {
                base: region.starting_address as u64,
                size: region.size.unwrap_or(0) as u64,
            })
            .ok_or(DtError::NoMemory)?;
        let console = fdt
            .find_compatible(&["arm,pl011"])
            .and_then(|node| first_region(node, 0))
            .ok_or(DtError::NoConsole)?;
        let gic = if let Some(node) = fdt.find_compatible(&["arm,gic-v3"]) {
            GicRegions::V3 {
                distributor: first_region(node, 0).ok_or(DtError::NoGic)?,
                redistributor: first_region(node, 1).ok_or(DtError::NoGic)?,
            }
        } else if let Some(node) = fdt.find_compatible(&["arm,cortex-a15-gic", "arm,gic-400"]) {
            GicRegions::V2 {
                distributor: first_region(node, 0).ok_or(DtError::NoGic)?,
                cpu_interface: first_region(node, 1).ok_or(DtError::NoGic)?,
            }
        } else {
            return Err(DtError::NoGic);
        };
        // "arm,armv8-timer" lists secure physical, non-secure physical, virtual and hypervisor
        // timer PPIs as (type, number, flags) triples; PPI n is INTID 16 + n.
        let timer = fdt
            .find_compatible(&["arm,armv8-timer", "arm,armv7-timer"])
            .ok_or(DtError::NoTimer)?;
        let interrupts = timer.property("interrupts").ok_or(DtError::NoTimer)?.value;
        let cell = |index: usize| -> Option<u32> {
            interrupts
                .get(index * 4..index * 4 + 4)
                .map(|bytes| u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
        };
        let virtual_timer_intid = 16 + cell(2 * 3 + 1).ok_or(DtError::NoTimer)?;
        let bootargs = fdt
            .chosen()
            .ok()
            .and_then(|chosen| chosen.bootargs())
            .unwrap_or("");
        let model = fdt
            .root()
            .ok()
            .map(|root| root.model())
            .unwrap_or("unknown");
        Ok(Self {
            dtb: Region {
                base: dtb_pa,
                size: total as u64,
            },
            ram,
            console,
            gic,
            virtual_timer_intid,
            bootargs,
            model,
        })
    }
}
