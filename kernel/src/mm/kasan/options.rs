//! The sanitizer's command-line options: the tag generator's seed, the report policy and the
//! MTE check mode.

use crate::arch::mte::CheckMode;
use crate::args::{self, Args};
use protocol::cmdline as key;

/// `tag-seed=N kasan.fault=report|panic kasan.multi_shot[=0|1] kasan=panic|recover
/// kasan.mode=sync|async|asymm`.
#[derive(Clone, Copy)]
pub struct Options {
    /// Seed of the heap's tag generator (`tag-seed=`): the same seed gives the same tags.
    pub tag_seed: u32,
    /// Stop the kernel after a report (`kasan.fault=panic`) instead of continuing.
    pub fault_panic: bool,
    /// Print every report, not only the first (`kasan.multi_shot`).
    pub multi_shot: bool,
    /// What an MTE tag check fault does (build variant `mte`).
    pub mode: CheckMode,
}

impl Options {
    /// The words in order, so that `kasan=` and the `kasan.*` words combine as written.
    pub fn from_args(args: &Args) -> Self {
        let mut options = Self {
            tag_seed: super::shadow::DEFAULT_SEED,
            fault_panic: false,
            multi_shot: false,
            mode: CheckMode::Sync,
        };
        for (name, value) in args.pairs() {
            match (name, value) {
                (key::TAG_SEED, seed) => match args::parse_u32(seed) {
                    Some(seed) => options.tag_seed = seed,
                    None => defmt::warn!("cmdline: tag-seed={=str} is not a 32-bit number", seed),
                },
                (key::KASAN, "panic") => options.fault_panic = true,
                (key::KASAN, "recover") => (options.fault_panic, options.multi_shot) = (false, true),
                (key::KASAN, other) => Args::ignoring(key::KASAN, other),
                (key::KASAN_FAULT, "report") => options.fault_panic = false,
                (key::KASAN_FAULT, "panic") => options.fault_panic = true,
                (key::KASAN_FAULT, other) => {
                    defmt::warn!("cmdline: kasan.fault={=str} is not report|panic, keeping report", other)
                }
                (key::KASAN_MODE, mode) => match CheckMode::parse(mode) {
                    Some(mode) => options.mode = mode,
                    None => defmt::warn!("cmdline: kasan.mode={=str} is not sync|async|asymm, keeping sync", mode),
                },
                (key::KASAN_MULTI_SHOT, "" | "1" | "on") => options.multi_shot = true,
                (key::KASAN_MULTI_SHOT, "0" | "off") => options.multi_shot = false,
                (key::KASAN_MULTI_SHOT, other) => {
                    defmt::warn!("cmdline: kasan.multi_shot={=str} is not 0|1, keeping single-shot", other)
                }
                _ => {}
            }
        }
        options
    }
}
