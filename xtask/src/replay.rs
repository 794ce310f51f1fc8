//! Linux's recorded allocations as the replay blob the `kasan-replay` suite's kernel reads.
//!
//! The input is the committed `tracelab-alloc-trace 1` file (`xtask/data/linux/`, written by
//! `peer::alloc`). The kernel does not parse it: the gzip text is 423 KiB, which every image
//! would carry for one suite, and its addresses and symbol names mean nothing to the lab. xtask
//! converts it at build time into a compact little-endian blob for the suite's runs alone to
//! load into the guest (QEMU `-device loader`), so other images stay as they are.
//!
//! What the conversion keeps and why:
//! - **Frames.** Each distinct recorded return address (`symbol+0xOFFSET`) becomes one of the
//!   kernel's frame functions, by index. A frame function calls the next one of the stack from
//!   its single call site, so identical Linux stacks produce identical lab return-address
//!   sequences and stacks that share their outer frames share them in the lab too. The lab's
//!   own frames (the replay loop, the heap's entry) are a constant suffix and prefix around
//!   them. The kernel has [`FRAME_FUNCTIONS`] of them; a trace with more distinct frames is
//!   refused rather than folded, as folding would merge distinct stacks in the depot.
//! - **Depth.** Stacks keep at most [`MAX_RECORDED_DEPTH`] innermost frames (the lab's 64-frame
//!   trace depth less its own frames). This trace's deepest stack has 42 frames, so none is
//!   cut; a cut stack is counted ([`Blob::stacks_truncated`]).
//! - **Lifetimes.** Addresses become slots: each allocation takes the lowest free slot and its
//!   free names the slot, so the kernel keeps one pointer per slot (the trace's peak live set)
//!   instead of a map from Linux addresses. An address allocated again while live lost its
//!   free to a path the trace lacks (bulk and RCU frees): the earlier allocation is freed
//!   there, and counted ([`Blob::frees_implied`]).
//! - **Sizes and CPUs.** The requested size (the lab's heap rounds as it rounds; Linux's slab
//!   size class is not the lab's) and the recorded CPU of every event, in the trace's order.
//!
//! The layout is `protocol::replay`'s, whose reader the kernel uses.

use std::collections::{BTreeSet, HashMap};
use std::io::Read;
use std::path::PathBuf;
use std::sync::OnceLock;

use protocol::replay::{CPU_SHIFT, Event, FRAME_FUNCTIONS, FREE_BIT, Header, MAX_RECORDED_DEPTH, SLOT_MASK};

use crate::peer::alloc::MAGIC;

/// The committed boot trace the suite replays.
const TRACE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/data/linux/kmem-boot.trace.gz");

/// Whether a kernel command line runs the `kasan-replay` suite (`bench=...,kasan-replay,...`),
/// the kernel's tests (whose `replayed_boot_prefix_is_clean` replays the trace's first
/// allocations) or the profiler's `replay` workload: only those runs load the blob.
pub fn wants_blob(bootargs: &str) -> bool {
    fn value<'a>(word: &'a str, key: &str) -> Option<&'a str> {
        word.strip_prefix(key)?.strip_prefix('=')
    }
    bootargs.split_whitespace().any(|word| {
        value(word, protocol::cmdline::RUN) == Some("test")
            || value(word, protocol::cmdline::PROFILE_WORKLOAD) == Some(protocol::profile::REPLAY)
            || value(word, protocol::cmdline::BENCH)
                .is_some_and(|suites| suites.split(',').any(|suite| suite == protocol::suite::KASAN_REPLAY))
    })
}

/// QEMU's `-device` argument loading the committed trace's blob at `protocol::replay::
/// BLOB_ADDRESS`, converting it into `target/replay/` once per xtask run.
pub fn loader_device() -> Result<String> {
    static BLOB: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    let path = BLOB.get_or_init(|| {
        let mut text = String::new();
        let file = std::fs::File::open(TRACE).map_err(|error| format!("{TRACE}: {error}"))?;
        flate2::read::GzDecoder::new(file).read_to_string(&mut text).map_err(|error| format!("{TRACE}: {error}"))?;
        let bytes = parse(&text).map_err(|error| format!("{TRACE}: {error}"))?.encode();
        if bytes.len() > protocol::replay::SLOTS_OFFSET {
            return Err(format!("{TRACE}: its blob of {} bytes is past the guest's room for it", bytes.len()));
        }
        let dir = crate::build::target_dir().join("replay");
        std::fs::create_dir_all(&dir).map_err(|error| format!("{}: {error}", dir.display()))?;
        // Written aside and renamed: another xtask may be loading the same file.
        let path = dir.join("kmem-boot.blob");
        let partial = dir.join(format!("kmem-boot.blob.{}", std::process::id()));
        std::fs::write(&partial, &bytes).map_err(|error| format!("{}: {error}", partial.display()))?;
        std::fs::rename(&partial, &path).map_err(|error| format!("{}: {error}", path.display()))?;
        Ok(path)
    });
    let path = path.as_ref().map_err(Clone::clone)?;
    Ok(format!("loader,file={},addr={:#x},force-raw=on", path.display(), protocol::replay::BLOB_ADDRESS))
}

/// A conversion's failure: what is wrong, and where in the trace.
type Result<T> = std::result::Result<T, String>;

macro_rules! ensure {
    ($condition:expr, $($message:tt)+) => {
        if !$condition {
            return Err(format!($($message)+));
        }
    };
}

/// A trace converted for the replay: frames by index, stacks as frame indices, events by slot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Blob {
    /// The highest recorded CPU plus one.
    pub cpus: u32,
    /// Distinct recorded return addresses, in order of first appearance: frame function `i`
    /// stands for `frames[i]`.
    pub frames: Vec<String>,
    /// Per recorded stack (by the trace's ID), its frame indices, innermost first.
    pub stacks: Vec<Vec<u16>>,
    /// The peak number of live allocations: the kernel's slot table.
    pub slots: u32,
    pub allocations: u32,
    pub frees: u32,
    /// Counted by the recording, not replayed: frees of allocations made before it started.
    pub frees_unrecorded: u32,
    /// Counted by the recording, not replayed: frees of NULL.
    pub frees_null: u32,
    pub live_at_end: u32,
    /// Stacks deeper than [`MAX_RECORDED_DEPTH`], cut to their innermost frames.
    pub stacks_truncated: u32,
    /// Frees the trace lacks (Linux's bulk and RCU paths trace no `kfree`), replayed where the
    /// address is allocated again; counted apart from [`Blob::frees`].
    pub frees_implied: u32,
    pub events: Vec<Event>,
}

fn meta_count(text: &str, key: &str) -> Result<u32> {
    let prefix = format!("meta {key} ");
    let line = text.lines().find_map(|line| line.strip_prefix(prefix.as_str()));
    let value = line.ok_or_else(|| format!("no `meta {key}` line"))?;
    value.trim().parse().map_err(|error| format!("meta {key} {value}: {error}"))
}

/// Reads a [`MAGIC`] trace's text into the replay's form.
pub fn parse(text: &str) -> Result<Blob> {
    ensure!(text.lines().next() == Some(MAGIC), "not a `{MAGIC}` file");
    let mut blob = Blob {
        frees_unrecorded: meta_count(text, "frees_unrecorded")?,
        frees_null: meta_count(text, "frees_null")?,
        ..Blob::default()
    };
    let mut frame_index: HashMap<&str, u16> = HashMap::new();
    // Linux address to slot, and the free slots below the high-water mark (lowest first).
    let mut live: HashMap<u64, u32> = HashMap::new();
    let mut free_slots: BTreeSet<u32> = BTreeSet::new();
    for (number, line) in text.lines().enumerate().skip(1) {
        let context = || format!("line {}: {line}", number + 1);
        let mut words = line.split(' ');
        let number = |word: Option<&str>| -> Result<u64> {
            word.and_then(|word| word.parse().ok()).ok_or_else(|| format!("a missing or bad number: {}", context()))
        };
        match words.next() {
            Some("meta") | Some("") | None => {}
            Some("stack") => {
                let id = number(words.next())?;
                ensure!(id == blob.stacks.len() as u64, "stack IDs out of order: {}", context());
                let mut frames = Vec::new();
                for frame in words {
                    let next = frame_index.len();
                    let index = *frame_index.entry(frame).or_insert_with(|| {
                        blob.frames.push(frame.to_string());
                        next as u16
                    });
                    ensure!(blob.frames.len() <= FRAME_FUNCTIONS, "more than {FRAME_FUNCTIONS} frames");
                    frames.push(index);
                }
                ensure!(!frames.is_empty(), "an empty stack: {}", context());
                if frames.len() > MAX_RECORDED_DEPTH {
                    frames.truncate(MAX_RECORDED_DEPTH);
                    blob.stacks_truncated += 1;
                }
                blob.stacks.push(frames);
            }
            Some("a") => {
                let cpu = number(words.next())? as u32;
                let _kind = words.next();
                let size = number(words.next())?;
                let _allocated = words.next();
                let address = words.next().and_then(|word| u64::from_str_radix(word, 16).ok());
                let address = address.ok_or_else(|| format!("bad address: {}", context()))?;
                let stack = number(words.next())?;
                ensure!(cpu < 1 << (31 - CPU_SHIFT), "CPU {cpu} does not fit: {}", context());
                ensure!(stack < blob.stacks.len() as u64, "unknown stack: {}", context());
                let size = u32::try_from(size).map_err(|_| format!("size too large: {}", context()))?;
                if let Some(earlier) = live.remove(&address) {
                    // Linux freed the earlier allocation by a path the trace lacks: the lab
                    // frees it here, where Linux had at the latest.
                    free_slots.insert(earlier);
                    blob.frees_implied += 1;
                    blob.events.push(Event::Free { cpu, slot: earlier });
                }
                let slot = free_slots.pop_first().unwrap_or_else(|| {
                    blob.slots += 1;
                    blob.slots - 1
                });
                ensure!(slot <= SLOT_MASK, "more than {SLOT_MASK} live allocations");
                live.insert(address, slot);
                blob.cpus = blob.cpus.max(cpu + 1);
                blob.allocations += 1;
                blob.events.push(Event::Allocate { cpu, slot, size, stack: stack as u32 });
            }
            Some("f") => {
                let cpu = number(words.next())? as u32;
                let address = words.next().and_then(|word| u64::from_str_radix(word, 16).ok());
                let address = address.ok_or_else(|| format!("bad address: {}", context()))?;
                let slot =
                    live.remove(&address).ok_or_else(|| format!("a free of no live allocation: {}", context()))?;
                free_slots.insert(slot);
                blob.cpus = blob.cpus.max(cpu + 1);
                blob.frees += 1;
                blob.events.push(Event::Free { cpu, slot });
            }
            Some(other) => return Err(format!("unknown record `{other}`: {}", context())),
        }
    }
    blob.live_at_end = live.len() as u32;
    for (key, value) in [("allocations", blob.allocations), ("frees", blob.frees), ("stacks", blob.stacks.len() as u32)]
    {
        let recorded = meta_count(text, key)?;
        ensure!(recorded == value, "`meta {key}` says {recorded} but the file has {value}");
    }
    Ok(blob)
}

impl Blob {
    /// The blob's bytes, in `protocol::replay`'s layout.
    pub fn encode(&self) -> Vec<u8> {
        let frame_ids: usize = self.stacks.iter().map(Vec::len).sum();
        let header = Header {
            cpus: self.cpus,
            frames: self.frames.len() as u32,
            stacks: self.stacks.len() as u32,
            slots: self.slots,
            allocations: self.allocations,
            frees: self.frees,
            frees_unrecorded: self.frees_unrecorded,
            frees_null: self.frees_null,
            live_at_end: self.live_at_end,
            stacks_truncated: self.stacks_truncated,
            frees_implied: self.frees_implied,
            frame_ids: frame_ids as u32,
            events: self.events.len() as u32,
        };
        let mut out = Vec::with_capacity(64 + 4 * self.stacks.len() + 2 * frame_ids + 12 * self.events.len());
        out.extend_from_slice(&protocol::replay::MAGIC);
        let word = |out: &mut Vec<u8>, value: u32| out.extend_from_slice(&value.to_le_bytes());
        for value in header.words() {
            word(&mut out, value);
        }
        let mut offset = 0;
        for stack in &self.stacks {
            word(&mut out, offset);
            offset += stack.len() as u32;
        }
        word(&mut out, offset);
        for frame in self.stacks.iter().flatten() {
            out.extend_from_slice(&frame.to_le_bytes());
        }
        out.resize(out.len().next_multiple_of(4), 0);
        for event in &self.events {
            match *event {
                Event::Allocate { cpu, slot, size, stack } => {
                    word(&mut out, cpu << CPU_SHIFT | slot);
                    word(&mut out, size);
                    word(&mut out, stack);
                }
                Event::Free { cpu, slot } => word(&mut out, FREE_BIT | cpu << CPU_SHIFT | slot),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {

    use super::*;

    const SMALL: &str = "tracelab-alloc-trace 1\n\
        meta kernel test\n\
        meta allocations 4\nmeta frees 2\nmeta frees_unrecorded 1\nmeta frees_null 3\nmeta stacks 3\n\
        stack 0 a+0x4 b+0x8 root+0x10\n\
        stack 1 c+0x4 b+0x8 root+0x10\n\
        stack 2 a+0x4 d+0x8 root+0x10\n\
        a 0 kmalloc 24 32 1000 0\n\
        a 1 cache 56 64 2000 1\n\
        f 0 1000\n\
        a 0 kmalloc 8 8 3000 2\n\
        f 1 2000\n\
        a 3 kmalloc 100 128 1000 0\n";

    /// A stack as the lab's frame functions' names, innermost first.
    fn lab_stack(blob: &Blob, stack: usize) -> Vec<String> {
        blob.stacks[stack].iter().map(|index| format!("replay_frame_{index}")).collect()
    }

    #[test]
    fn slots_are_reused_and_counts_are_kept() {
        let blob = parse(SMALL).unwrap();
        assert_eq!(
            blob.events,
            [
                Event::Allocate { cpu: 0, slot: 0, size: 24, stack: 0 },
                Event::Allocate { cpu: 1, slot: 1, size: 56, stack: 1 },
                Event::Free { cpu: 0, slot: 0 },
                Event::Allocate { cpu: 0, slot: 0, size: 8, stack: 2 },
                Event::Free { cpu: 1, slot: 1 },
                // Linux reused the address; the lab reuses the lowest free slot.
                Event::Allocate { cpu: 3, slot: 1, size: 100, stack: 0 },
            ]
        );
        assert_eq!((blob.cpus, blob.slots, blob.allocations, blob.frees, blob.live_at_end), (4, 2, 4, 2, 2));
        assert_eq!((blob.frees_unrecorded, blob.frees_null, blob.stacks_truncated), (1, 3, 0));
    }

    #[test]
    fn an_address_allocated_again_frees_the_earlier_allocation() {
        let text = SMALL.replace("meta allocations 4", "meta allocations 5") + "a 2 kmalloc 16 16 3000 1\n";
        let blob = parse(&text).unwrap();
        assert_eq!(
            blob.events[6..],
            [Event::Free { cpu: 2, slot: 0 }, Event::Allocate { cpu: 2, slot: 0, size: 16, stack: 1 }]
        );
        assert_eq!((blob.frees, blob.frees_implied, blob.live_at_end, blob.slots), (2, 1, 2, 2));
    }

    #[test]
    fn distinct_frames_map_to_distinct_functions_and_prefixes_stay_shared() {
        let blob = parse(SMALL).unwrap();
        assert_eq!(blob.frames, ["a+0x4", "b+0x8", "root+0x10", "c+0x4", "d+0x8"]);
        // The same return address is the same function wherever it appears.
        assert_eq!(lab_stack(&blob, 0)[0], lab_stack(&blob, 2)[0]);
        // Stacks 0 and 1 share their two outer frames in Linux and in the lab; 0 and 2 only
        // the outermost.
        assert_eq!(lab_stack(&blob, 0)[1..], lab_stack(&blob, 1)[1..]);
        assert_ne!(lab_stack(&blob, 0)[0], lab_stack(&blob, 1)[0]);
        assert_eq!(lab_stack(&blob, 0)[2], lab_stack(&blob, 2)[2]);
        assert_ne!(lab_stack(&blob, 0)[1], lab_stack(&blob, 2)[1]);
    }

    #[test]
    fn bad_traces_are_refused() {
        assert!(parse("tracelab-alloc-trace 2\n").is_err());
        let unknown_free = SMALL.replace("f 1 2000", "f 1 9000");
        assert!(parse(&unknown_free).unwrap_err().to_string().contains("no live allocation"));
        let unknown_stack = SMALL.replace("a 3 kmalloc 100 128 1000 0", "a 3 kmalloc 100 128 1000 7");
        assert!(parse(&unknown_stack).is_err());
        let miscounted = SMALL.replace("meta allocations 4", "meta allocations 5");
        assert!(parse(&miscounted).unwrap_err().to_string().contains("meta allocations"));
    }

    #[test]
    fn deep_stacks_keep_their_innermost_frames() {
        let frames: Vec<String> = (0..MAX_RECORDED_DEPTH + 3).map(|depth| format!("f{depth}+0x4")).collect();
        let text = format!(
            "tracelab-alloc-trace 1\nmeta allocations 1\nmeta frees 0\nmeta frees_unrecorded 0\n\
             meta frees_null 0\nmeta stacks 1\nstack 0 {}\na 0 kmalloc 8 8 1000 0\n",
            frames.join(" ")
        );
        let blob = parse(&text).unwrap();
        assert_eq!(blob.stacks_truncated, 1);
        assert_eq!(blob.stacks[0], (0..MAX_RECORDED_DEPTH as u16).collect::<Vec<_>>());
    }

    /// What the kernel's reader sees of an encoded blob.
    fn read_back(bytes: &[u8]) -> (Header, Vec<Vec<u16>>, Vec<Event>) {
        let reader = protocol::replay::Blob::parse(bytes).unwrap();
        let stacks = (0..reader.header.stacks).map(|stack| reader.stack(stack).unwrap().collect()).collect();
        (reader.header, stacks, reader.events().collect())
    }

    #[test]
    fn the_kernel_reads_what_was_encoded() {
        let blob = parse(SMALL).unwrap();
        let bytes = blob.encode();
        let (header, stacks, events) = read_back(&bytes);
        assert_eq!((header.cpus, header.frames, header.slots, header.allocations), (4, 5, 2, 4));
        assert_eq!((header.frees, header.frees_unrecorded, header.frees_null), (2, 1, 3));
        assert_eq!((header.events, header.frame_ids), (6, 9));
        assert_eq!((stacks, events), (blob.stacks, blob.events));
        use protocol::replay::BlobError;
        assert_eq!(protocol::replay::Blob::parse(&bytes[..40]).unwrap_err(), BlobError::Truncated);
        assert_eq!(protocol::replay::Blob::parse(&bytes[8..]).unwrap_err(), BlobError::NotABlob);
        let mut bad_frame = bytes.clone();
        let ids_start = 8 + 4 * (protocol::replay::HEADER_WORDS + 4);
        bad_frame[ids_start] = 5;
        assert_eq!(protocol::replay::Blob::parse(&bad_frame).unwrap_err(), BlobError::Truncated);
    }

    #[test]
    fn only_the_suite_the_kernel_tests_and_the_replay_profile_load_the_blob() {
        assert!(wants_blob("run=bench bench=baseline,kasan-replay reps=1 clock=cycles"));
        assert!(wants_blob("run=test hz=100 icount=1 filter=replayed"));
        assert!(wants_blob("run=profile profile.workload=replay profile.unwinder=all"));
        assert!(!wants_blob("run=bench bench=kasan-boot reps=1"));
        assert!(!wants_blob("run=profile profile.workload=kasan-boot"));
    }

    /// The committed boot trace: its counts as its `meta` lines and README give them.
    #[test]
    fn the_committed_trace_converts() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/data/linux/kmem-boot.trace.gz");
        let mut text = String::new();
        flate2::read::GzDecoder::new(std::fs::File::open(path).unwrap()).read_to_string(&mut text).unwrap();
        let blob = parse(&text).unwrap();
        assert_eq!((blob.allocations, blob.stacks.len(), blob.cpus), (89_391, 9_197, 4));
        assert_eq!(blob.stacks_truncated, 0);
        assert_eq!(blob.live_at_end, meta_count(&text, "live_at_end").unwrap());
        // Distinct stacks in, distinct frame sequences out.
        let distinct: BTreeSet<&Vec<u16>> = blob.stacks.iter().collect();
        assert_eq!(distinct.len(), blob.stacks.len());
        let bytes = blob.encode();
        assert!(bytes.len() < 2 << 20, "{} bytes", bytes.len());
        let (header, stacks, events) = read_back(&bytes);
        assert_eq!((header.frees_implied, header.frames), (blob.frees_implied, 4341));
        assert_eq!((stacks, events), (blob.stacks, blob.events));
    }
}
