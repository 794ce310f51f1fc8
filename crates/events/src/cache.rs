//! A cache model with the Cortex-A72's geometry, for modelled misses per operation.
//!
//! Geometry from the Cortex-A72 MPCore TRM (r0p3), sections 6.1 (L1 instruction memory system:
//! 48 KiB, 3-way), 6.4 (L1 data memory system: 32 KiB, 2-way) and 7.1 (L2: 512 KiB to 4 MiB,
//! 16-way; the Raspberry Pi 4's BCM2711 has 1 MiB), 64-byte lines everywhere. Each CPU has its
//! own L1s; the L2 is shared. Replacement is LRU in every set (the A72's L1s use LRU, its L2 a
//! pseudo-random policy this model does not follow).
//!
//! What it does not model: prefetchers (the A72's L1D and L2 prefetch strides and the next line:
//! a sequential sweep misses far less on the core than here), TLBs and page walks, branch
//! prediction, the L2's inclusion of the L1D and back-invalidation, coherence between the CPUs'
//! L1s (a store on one CPU does not evict the line from another's), write-back traffic and
//! write-streaming mode (a store allocates like a load), and cache maintenance (`dc`, `ic`
//! evict nothing here). Addresses are what the caller gives: physical for data, and for
//! instruction fetches the virtual address (the same for the kernel's identity-mapped text).

use alloc::vec;
use alloc::vec::Vec;

/// One cache's size, associativity and line size, in bytes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Geometry {
    pub size: usize,
    pub ways: usize,
    pub line: usize,
}

impl Geometry {
    pub const fn sets(self) -> usize {
        self.size / (self.ways * self.line)
    }
}

/// The Cortex-A72's L1 instruction cache: 48 KiB, 3-way, 64-byte lines (256 sets).
pub const A72_L1I: Geometry = Geometry { size: 48 * 1024, ways: 3, line: 64 };
/// The Cortex-A72's L1 data cache: 32 KiB, 2-way, 64-byte lines (256 sets).
pub const A72_L1D: Geometry = Geometry { size: 32 * 1024, ways: 2, line: 64 };
/// The Raspberry Pi 4's L2: 1 MiB, 16-way, 64-byte lines (1024 sets), shared by the 4 CPUs.
pub const PI4_L2: Geometry = Geometry { size: 1024 * 1024, ways: 16, line: 64 };

/// One set-associative cache with LRU replacement.
#[derive(Clone, Debug)]
pub struct Cache {
    geometry: Geometry,
    /// Per set, the line numbers it holds, most recently used first.
    sets: Vec<Vec<u64>>,
}

impl Cache {
    pub fn new(geometry: Geometry) -> Self {
        Self { geometry, sets: vec![Vec::with_capacity(geometry.ways); geometry.sets()] }
    }

    /// Touches the line holding `address`; true on a hit. A miss fills the line, evicting the
    /// set's least recently used one when the set is full.
    pub fn access(&mut self, address: u64) -> bool {
        let line = address / self.geometry.line as u64;
        let set = &mut self.sets[(line % self.geometry.sets() as u64) as usize];
        match set.iter().position(|&held| held == line) {
            Some(way) => {
                set[..=way].rotate_right(1);
                true
            }
            None => {
                if set.len() == self.geometry.ways {
                    set.pop();
                }
                set.insert(0, line);
                false
            }
        }
    }

    /// Forgets every line.
    pub fn clear(&mut self) {
        self.sets.iter_mut().for_each(Vec::clear);
    }
}

/// Misses counted by a [`Hierarchy`].
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct Misses {
    pub l1i: u64,
    pub l1d: u64,
    pub l2: u64,
}

/// Per-CPU L1 instruction and data caches over one shared L2.
#[derive(Clone, Debug)]
pub struct Hierarchy {
    l1i: Vec<Cache>,
    l1d: Vec<Cache>,
    l2: Cache,
    pub misses: Misses,
}

/// Which L1 an access goes through.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Access {
    Fetch,
    Data,
}

impl Hierarchy {
    /// The Raspberry Pi 4's: four Cortex-A72s and their 1 MiB L2.
    pub fn pi4(cpus: usize) -> Self {
        Self::new(cpus, A72_L1I, A72_L1D, PI4_L2)
    }

    pub fn new(cpus: usize, l1i: Geometry, l1d: Geometry, l2: Geometry) -> Self {
        Self {
            l1i: vec![Cache::new(l1i); cpus],
            l1d: vec![Cache::new(l1d); cpus],
            l2: Cache::new(l2),
            misses: Misses::default(),
        }
    }

    /// An access of `size` bytes at `address` from `cpu`: every line it touches goes through
    /// that CPU's L1 and, on a miss there, the L2. CPUs beyond those the model was made for
    /// share the last one's L1s.
    pub fn access(&mut self, cpu: usize, kind: Access, address: u64, size: usize) {
        let line = self.l2.geometry.line as u64;
        let first = address / line;
        let last = (address + size.max(1) as u64 - 1) / line;
        for number in first..=last {
            let address = number * line;
            let (l1, missed) = match kind {
                Access::Fetch => (&mut self.l1i, &mut self.misses.l1i),
                Access::Data => (&mut self.l1d, &mut self.misses.l1d),
            };
            let cpu = cpu.min(l1.len() - 1);
            if !l1[cpu].access(address) {
                *missed += 1;
                if !self.l2.access(address) {
                    self.misses.l2 += 1;
                }
            }
        }
    }

    /// Empties every cache (the misses counted so far stay).
    pub fn clear(&mut self) {
        self.l1i.iter_mut().chain(self.l1d.iter_mut()).for_each(Cache::clear);
        self.l2.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sweep(hierarchy: &mut Hierarchy, kind: Access, bytes: u64) {
        for address in (0..bytes).step_by(64) {
            hierarchy.access(0, kind, 0x4000_0000 + address, 8);
        }
    }

    #[test]
    fn the_a72_geometry() {
        assert_eq!((A72_L1I.sets(), A72_L1D.sets(), PI4_L2.sets()), (256, 256, 1024));
    }

    #[test]
    fn a_sweep_that_fits_the_l1d_misses_once() {
        let mut pi4 = Hierarchy::pi4(4);
        sweep(&mut pi4, Access::Data, 32 * 1024);
        assert_eq!(pi4.misses, Misses { l1i: 0, l1d: 512, l2: 512 });
        sweep(&mut pi4, Access::Data, 32 * 1024);
        assert_eq!(pi4.misses, Misses { l1i: 0, l1d: 512, l2: 512 });
    }

    #[test]
    fn a_sweep_larger_than_the_l1d_misses_every_line_under_lru_but_hits_the_l2() {
        let mut pi4 = Hierarchy::pi4(1);
        sweep(&mut pi4, Access::Data, 48 * 1024);
        sweep(&mut pi4, Access::Data, 48 * 1024);
        assert_eq!(pi4.misses, Misses { l1i: 0, l1d: 2 * 768, l2: 768 });
    }

    #[test]
    fn a_sweep_of_the_whole_l2_fits_it_and_one_line_more_does_not() {
        let mut pi4 = Hierarchy::pi4(1);
        sweep(&mut pi4, Access::Data, 1024 * 1024);
        sweep(&mut pi4, Access::Data, 1024 * 1024);
        assert_eq!(pi4.misses, Misses { l1i: 0, l1d: 2 * 16_384, l2: 16_384 });
        let mut over = Hierarchy::pi4(1);
        sweep(&mut over, Access::Data, 1024 * 1024 + 1024 * 64);
        let first = over.misses.l2;
        sweep(&mut over, Access::Data, 1024 * 1024 + 1024 * 64);
        assert_eq!(over.misses.l2, 2 * first, "seventeen lines per set, cyclic: LRU keeps none");
    }

    #[test]
    fn three_lines_in_one_set_thrash_the_2_way_l1d_and_fit_the_3_way_l1i() {
        // 16 KiB apart: the same set of both L1s (256 sets of 64 bytes).
        let lines = [0x4000_0000, 0x4000_4000, 0x4000_8000];
        let mut pi4 = Hierarchy::pi4(1);
        for _ in 0..10 {
            for address in lines {
                pi4.access(0, Access::Data, address, 4);
                pi4.access(0, Access::Fetch, address, 4);
            }
        }
        assert_eq!(pi4.misses, Misses { l1i: 3, l1d: 30, l2: 3 });
    }

    #[test]
    fn an_access_across_a_line_boundary_touches_both_lines() {
        let mut pi4 = Hierarchy::pi4(1);
        pi4.access(0, Access::Data, 0x4000_003c, 8);
        assert_eq!(pi4.misses.l1d, 2);
        pi4.access(0, Access::Data, 0x4000_0040, 16);
        assert_eq!(pi4.misses.l1d, 2);
    }

    #[test]
    fn each_cpu_has_its_l1s_and_shares_the_l2() {
        let mut pi4 = Hierarchy::pi4(2);
        pi4.access(0, Access::Data, 0x4000_0000, 8);
        pi4.access(1, Access::Data, 0x4000_0000, 8);
        assert_eq!(pi4.misses, Misses { l1i: 0, l1d: 2, l2: 1 });
        pi4.clear();
        pi4.access(1, Access::Data, 0x4000_0000, 8);
        assert_eq!(pi4.misses, Misses { l1i: 0, l1d: 3, l2: 2 });
    }
}
