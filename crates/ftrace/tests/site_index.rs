//! Host tests for the site index: the list function's constant-time
//! entry-to-site lookup, built by `initialise`.

use ftrace::{DispatchTable, Error, Registry};

mod common;

use common::{BASE, config};

const SITES: usize = 4096;
type Table = DispatchTable<SITES, 1, 1>;
type Reg<'t> = Registry<'t, SITES, 1, 1>;

/// A small deterministic generator (splitmix64): the tests are reproducible.
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound
    }
}

/// `count` sorted, 8-aligned entries at least 16 bytes apart (four NOPs each)
/// with random gaps of up to 2 KiB, as a kernel's functions are.
fn random_entries(random: &mut Random, count: usize) -> Vec<u64> {
    let mut entry = BASE;
    (0..count)
        .map(|_| {
            entry += 16 + 8 * random.below(255);
            entry
        })
        .collect()
}

/// A table initialised with `entries` (any order), every site untraceable,
/// so no text is needed: only the entries and the site index are written.
fn initialised(entries: &[u64]) -> Result<Box<Table>, Error> {
    let table = Box::new(Table::new());
    let mut registry = Box::new(Reg::new(&table));
    let mut text = common::Text::new(0);
    let traced = registry.initialise(entries.iter().copied(), config(ftrace::Scheme::List), &mut text, |_| false)?;
    assert_eq!(traced, 0);
    assert!(text.log.is_empty(), "no text written");
    drop(registry);
    Ok(table)
}

/// At least `count` 8-aligned entries, 16 bytes apart or more, that share one
/// home slot in the site index.
fn colliding_entries(count: usize) -> Vec<u64> {
    let home = Table::home_slot(BASE);
    let mut entries = vec![BASE];
    let mut entry = BASE;
    while entries.len() < count {
        entry += 16;
        if Table::home_slot(entry) == home {
            entries.push(entry);
        }
    }
    entries
}

#[test]
fn every_entry_maps_to_its_site() {
    let mut random = Random(1);
    for count in [1, 2, 100, 4096] {
        let entries = random_entries(&mut random, count);
        let table = initialised(&entries.iter().rev().copied().collect::<Vec<_>>()).unwrap();
        assert_eq!(table.site_count(), count);
        assert!((1..=Table::MAX_PROBES).contains(&table.longest_probe()), "longest probe {}", table.longest_probe());
        for (site, &entry) in entries.iter().enumerate() {
            assert_eq!(table.site_index(entry), Some(site), "{count} entries: entry {entry:#x}");
            assert_eq!(table.entry(site), Some(entry));
            // Entries are >= 16 apart: the neighbours are never entries.
            for near in [entry - 8, entry + 8, entry - 4, entry + 4, entry + 1] {
                assert_eq!(table.site_index(near), None, "{count} entries: {near:#x} next to {entry:#x}");
            }
        }
        for address in [0, u64::MAX, u64::MAX - 7, BASE] {
            assert_eq!(table.site_index(address), None, "{count} entries: {address:#x}");
        }
    }
}

#[test]
fn lookup_agrees_with_a_binary_search_over_random_addresses() {
    let mut random = Random(2);
    for count in [100, 4096] {
        let entries = random_entries(&mut random, count);
        let table = initialised(&entries).unwrap();
        let span = entries[count - 1] + 64 - BASE;
        for round in 0..100_000 {
            let address = match round % 4 {
                // Anywhere, 8-aligned: mostly non-entries near the text.
                0 | 1 => BASE - 32 + (random.below(span) & !7),
                // An entry.
                2 => entries[random.below(count as u64) as usize],
                _ => random.next(),
            };
            assert_eq!(table.site_index(address), entries.binary_search(&address).ok(), "{address:#x}");
        }
    }
}

#[test]
fn an_uninitialised_table_finds_nothing() {
    let table = Box::new(Table::new());
    assert_eq!(table.longest_probe(), 0);
    for address in [0, BASE, u64::MAX] {
        assert_eq!(table.site_index(address), None);
    }
}

#[test]
fn lookup_reads_the_index_and_stops_at_an_empty_slot() {
    // Two entries with one home slot: the second sits in the next slot.
    let entries = colliding_entries(2);
    let table = initialised(&entries).unwrap();
    assert_eq!(table.longest_probe(), 2);
    assert_eq!(table.site_index(entries[0]), Some(0));
    assert_eq!(table.site_index(entries[1]), Some(1));
    // Emptying the home slot loses the first entry, and the probe for the
    // second ends there, before it reaches it: the entries array alone is
    // not searched.
    table.clear_index_slot(Table::home_slot(entries[0]));
    assert_eq!(table.entry(0), Some(entries[0]));
    assert_eq!(table.site_index(entries[0]), None);
    assert_eq!(table.site_index(entries[1]), None);
}

#[test]
fn initialise_refuses_entries_beyond_the_probe_bound() {
    let limit = Table::MAX_PROBES;
    // `limit` entries on one home slot: the last is exactly at the bound.
    let entries = colliding_entries(limit + 1);
    let table = initialised(&entries[..limit]).unwrap();
    assert_eq!(table.longest_probe(), limit);
    for (site, &entry) in entries[..limit].iter().enumerate() {
        assert_eq!(table.site_index(entry), Some(site));
    }
    // A non-entry with that home slot: `limit` probes, all full, then None.
    assert_eq!(table.site_index(entries[limit]), None);

    // One more is refused, naming the entry that does not fit, with nothing
    // published; a second attempt with fitting entries then succeeds.
    let table = Box::new(Table::new());
    let mut registry = Box::new(Reg::new(&table));
    let mut text = common::Text::new(0);
    let scheme = ftrace::Scheme::List;
    assert_eq!(
        registry.initialise(entries.iter().copied(), config(scheme), &mut text, |_| false),
        Err(Error::SiteIndexProbe { entry: entries[limit], limit })
    );
    assert_eq!(table.site_count(), 0);
    assert_eq!(table.site_index(entries[0]), None);
    assert!(registry.config().is_none());
    assert_eq!(registry.initialise(entries[1..].iter().copied(), config(scheme), &mut text, |_| false), Ok(0));
    assert_eq!(table.site_index(entries[0]), None);
    for (site, &entry) in entries[1..].iter().enumerate() {
        assert_eq!(table.site_index(entry), Some(site));
    }
}

#[test]
fn the_lowest_entry_is_at_home_and_a_colliding_later_one_is_not() {
    // Entries are indexed in address order: the first always takes its home slot, so a
    // function placed lowest is found without the out-of-line probe whatever else collides.
    let entries = colliding_entries(3);
    let table = initialised(&entries).unwrap();
    assert!(table.at_home(entries[0]));
    assert!(!table.at_home(entries[1]) && !table.at_home(entries[2]));
    assert_eq!(table.site_index(entries[2]), Some(2));
    assert!(!table.at_home(entries[2] + 8), "not an entry");
    assert!(!Table::new().at_home(entries[0]), "an empty table");
}
