//! Randomised check of the registry against a plain model, replaying every
//! patch to check that each intermediate text state is safe to execute.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::{LIST_OPS, NOP_OPS, SITES, TRAMPOLINE, Table, Text, VECTOR_OPS, Write, setup, tracer_ops};
use ftrace::{CallSite, MOV_X9_X30, NOP, Scheme, TextPatcher, TracerId, decode_bl};

struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// The kernel's text as seen at each write, next to the dispatch table: a
/// literal that points at a vector must find the vector's set already there.
struct Checked<'a> {
    text: &'a mut Text,
    table: &'a Table,
}

impl TextPatcher for Checked<'_> {
    fn read_u32(&self, address: u64) -> u32 {
        self.text.read_u32(address)
    }

    fn write_u32(&mut self, address: u64, instruction: u32) {
        self.text.write_u32(address, instruction);
    }

    fn write_u64(&mut self, address: u64, value: u64) {
        if let Some(slot) = (0..4).find(|&slot| value == VECTOR_OPS.address(slot)) {
            let entry = CallSite::new(address).unwrap().entry();
            let site = self.table.site_index(entry).unwrap();
            assert_eq!(self.table.vector(slot), self.table.relevant(site), "vector published before it was filled");
        }
        self.text.write_u64(address, value);
    }

    fn synchronize(&mut self) {
        self.text.synchronize();
    }
}

/// The literals a CPU may find behind a `bl` at any moment: the nop and list
/// ops, any vector ops, and the ops of tracers whose memory is not freed.
fn literal_is_live(literal: u64, live_ops: &BTreeSet<u64>) -> bool {
    literal == NOP_OPS
        || literal == LIST_OPS
        || (0..4).any(|slot| literal == VECTOR_OPS.address(slot))
        || live_ops.contains(&literal)
}

#[test]
fn random_operations_keep_text_and_tables_consistent() {
    let table = Table::new();
    let (mut text, mut registry) = setup(&table, Scheme::CallOps);
    let mut random = Random(0x9e37_79b9_7f4a_7c15);
    // Model: registered tracer -> (ops, sites); unregistered tracers whose
    // memory is still live -> ops.
    let mut registered: BTreeMap<TracerId, (u64, BTreeSet<usize>)> = BTreeMap::new();
    let mut live_ops: BTreeSet<u64> = BTreeSet::new();
    let mut retiring: Vec<(TracerId, u64)> = Vec::new();
    let mut next_ops = 0;
    let mut scheme = Scheme::CallOps;
    let mut last_generation = 0;
    let (mut enables, mut disables, mut swaps) = (0, 0, 0);

    for step in 0..3000 {
        match random.below(10) {
            0..=2 if registered.len() < 8 => {
                let sites: BTreeSet<usize> = (0..random.below(4)).map(|_| random.below(SITES)).collect();
                next_ops += 1;
                let ops = tracer_ops(next_ops);
                let id = registry.register(ops, sites.iter().copied()).unwrap();
                assert!(!registered.contains_key(&id));
                registered.insert(id, (ops, sites));
                live_ops.insert(ops);
            }
            3..=5 if !registered.is_empty() => {
                let id = *registered.keys().nth(random.below(registered.len())).unwrap();
                let (ops, _) = registered.remove(&id).unwrap();
                registry.unregister(id).unwrap();
                retiring.push((id, ops));
            }
            6 => {
                scheme = [Scheme::List, Scheme::CallOps, Scheme::Vector][random.below(3)];
                registry.set_scheme(scheme).unwrap();
            }
            7 => {
                // The kernel: a grace period after the last apply; frees memory.
                let reclaimed = registry.grace_period_elapsed(last_generation);
                retiring.retain(|&(id, ops)| {
                    let freed = reclaimed.tracers.contains(id);
                    if freed {
                        live_ops.remove(&ops);
                    }
                    !freed
                });
                // No site can still reach a freed tracer.
                for site in 0..SITES {
                    let call_site = text.site(site);
                    let literal = text.read_u64(call_site.literal());
                    assert!(literal_is_live(literal, &live_ops), "step {step}: site {site} reaches freed {literal:#x}");
                }
            }
            _ => {
                let before = text.clone();
                let applied = registry.apply(&mut Checked { text: &mut text, table: &table }).unwrap();
                enables += applied.enabled;
                disables += applied.disabled;
                swaps += applied.retargeted;
                check_patches(&before, &text, &live_ops, step);
                text.log.clear();
                // Every site is where the model says, and a second apply has nothing to do.
                check_sites(&table, &registry, &text, &registered, scheme, step);
                let again = registry.apply(&mut text).unwrap();
                assert_eq!((again.literal_writes, again.instruction_writes), (0, 0), "step {step}");
                last_generation = again.generation;
            }
        }
        // The per-call read path agrees with the model at every step.
        for site in 0..SITES {
            let relevant: Vec<TracerId> =
                registered.iter().filter(|(_, (_, sites))| sites.contains(&site)).map(|(&id, _)| id).collect();
            assert_eq!(table.relevant(site).iter().collect::<Vec<_>>(), relevant, "step {step} site {site}");
            for (&id, (ops, sites)) in &registered {
                assert_eq!(table.traces(site, id), sites.contains(&site));
                assert_eq!(table.ops_address(id), *ops);
            }
        }
    }
    assert!(enables > 100 && disables > 100 && swaps > 100, "{enables} {disables} {swaps}");
}

/// Replays one apply's writes over the text before it, checking each step.
fn check_patches(before: &Text, after: &Text, live_ops: &BTreeSet<u64>, step: usize) {
    let mut replay = before.clone();
    let mut per_site: BTreeMap<usize, (usize, usize)> = BTreeMap::new();
    for &write in &after.log {
        let (site, _) = match write {
            Write::U64 { address, value } => {
                let site = ((address - common::BASE) / common::FUNCTION_BYTES) as usize;
                assert_eq!(address, replay.site(site).literal(), "step {step}: 64-bit store off a literal");
                assert!(literal_is_live(value, live_ops), "step {step}: literal {value:#x} is dead");
                per_site.entry(site).or_default().0 += 1;
                (site, ())
            }
            Write::U32 { address, value } => {
                let site = ((address - common::BASE) / common::FUNCTION_BYTES) as usize;
                let call_site = replay.site(site);
                assert_eq!(address, call_site.call(), "step {step}: instruction write off the call slot");
                assert!(value == NOP || decode_bl(address, value) == Some(TRAMPOLINE), "step {step}: {value:#x}");
                let literal = replay.read_u64(call_site.literal());
                let final_literal = after.read_u64(call_site.literal());
                if value == NOP {
                    // Disabling: the literal already is the nop ops.
                    assert_eq!(literal, NOP_OPS, "step {step}: BL -> NOP before the nop ops");
                } else {
                    // Enabling: the literal already is the final one.
                    assert_eq!(literal, final_literal, "step {step}: NOP -> BL before the literal");
                }
                per_site.entry(site).or_default().1 += 1;
                (site, ())
            }
            Write::Synchronize => continue,
        };
        replay.replay(write);
        // Whatever a CPU executes now is safe: MOV in place; a BL finds a live literal.
        let call_site = replay.site(site);
        assert_eq!(replay.word(call_site.function()), MOV_X9_X30);
        if replay.word(call_site.call()) != NOP {
            assert!(literal_is_live(replay.read_u64(call_site.literal()), live_ops));
        }
    }
    assert_eq!(replay.words, after.words);
    for (site, (literals, instructions)) in per_site {
        assert!(literals <= 1 && instructions <= 1, "step {step} site {site}: {literals} + {instructions} writes");
        let call_site = before.site(site);
        let literal_changed = before.read_u64(call_site.literal()) != after.read_u64(call_site.literal());
        let call_changed = before.word(call_site.call()) != after.word(call_site.call());
        assert_eq!((literals == 1, instructions == 1), (literal_changed, call_changed), "step {step}: not minimal");
    }
}

fn check_sites(
    table: &Table,
    registry: &common::Reg<'_>,
    text: &Text,
    registered: &BTreeMap<TracerId, (u64, BTreeSet<usize>)>,
    scheme: Scheme,
    step: usize,
) {
    for site in 0..SITES {
        let call_site = text.site(site);
        let relevant: Vec<(TracerId, u64)> = registered
            .iter()
            .filter(|(_, (_, sites))| sites.contains(&site))
            .map(|(&id, (ops, _))| (id, *ops))
            .collect();
        let literal = text.read_u64(call_site.literal());
        let calling = text.word(call_site.call()) != NOP;
        assert_eq!(text.word(call_site.function()), MOV_X9_X30);
        match (scheme, relevant.as_slice()) {
            (_, []) => assert!(!calling && literal == NOP_OPS, "step {step} site {site}"),
            (Scheme::List, _) => assert!(calling && literal == LIST_OPS, "step {step} site {site}"),
            (_, [(_, ops)]) => assert!(calling && literal == *ops, "step {step} site {site}"),
            (Scheme::CallOps, _) => assert!(calling && literal == LIST_OPS, "step {step} site {site}"),
            (Scheme::Vector, _) => {
                assert!(calling, "step {step} site {site}");
                // A vector with exactly the relevant tracers, or the list when all are taken.
                if let Some(slot) = registry.site_vector(site) {
                    assert_eq!(literal, VECTOR_OPS.address(slot), "step {step} site {site}");
                    let ids: Vec<TracerId> = relevant.iter().map(|&(id, _)| id).collect();
                    assert_eq!(table.vector(slot).iter().collect::<Vec<_>>(), ids);
                } else {
                    assert_eq!(literal, LIST_OPS, "step {step} site {site}");
                }
            }
        }
    }
}
