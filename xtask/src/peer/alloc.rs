//! Allocation traces from a Linux boot: Linux's `trace` text to a compact, versioned file.
//!
//! The input is tracefs' `trace` file of a boot with the kmem events (`kmalloc`, `kfree`,
//! `kmem_cache_alloc`, `kmem_cache_free`) and `trace_options=stacktrace,sym-offset`: each
//! event line is followed, on its CPU, by a `<stack trace>` event whose ` => SYMBOL+OFF/SIZE`
//! lines are its stack (other CPUs' lines may come between, as the file is ordered by time,
//! and on its own CPU an interrupt's event and stack, which then come first).
//! The output, `tracelab-alloc-trace 1`, is text (gzip-compressed when committed):
//!
//! ```text
//! tracelab-alloc-trace 1
//! meta KEY VALUE...                 provenance: kernel package, command line, workload, counts,
//!                                   the boot's instructions (`instructions.*`) and
//!                                   `instructions_per_allocation`
//! stack ID FRAME FRAME...           a distinct allocating stack, innermost frame first,
//!                                   frames `symbol+0xOFFSET`
//! a CPU KIND REQUESTED ALLOCATED ADDRESS STACK
//!                                   an allocation: KIND `kmalloc` or `cache`, sizes in bytes,
//!                                   ADDRESS in hexadecimal, STACK a `stack` ID
//! f CPU ADDRESS                     the free of the live allocation at ADDRESS
//! ```
//!
//! Events are in the trace's order. Recording starts at `trace_init`, not at the first
//! allocation: a free of an allocation made before (or of one the trace otherwise lacks) is
//! dropped and counted (`meta frees_unrecorded`), as are frees of NULL (`meta frees_null`).
//! The tracer's own frames (`__traceiter_*`) at the top of every stack are left out.

use std::collections::HashMap;

/// The first line of a trace file: its format and version.
pub const MAGIC: &str = "tracelab-alloc-trace 1";

/// What the conversion counted, written as `meta` lines.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub allocations: u64,
    pub frees: u64,
    pub frees_unrecorded: u64,
    pub frees_null: u64,
    pub stacks: u64,
    /// Events whose stack never came (none expected with `stacktrace` on).
    pub without_stack: u64,
    /// Allocations still live at the end of the trace.
    pub live_at_end: u64,
}

/// One kmem event as the trace prints it.
struct Event {
    cpu: u32,
    kind: EventKind,
    address: u64,
    requested: u64,
    allocated: u64,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum EventKind {
    Kmalloc,
    CacheAlloc,
    Free,
}

/// `TASK-PID [CPU] FLAGS TIMESTAMP: EVENT: FIELDS`: the CPU, event name and fields.
fn split_event_line(line: &str) -> Option<(u32, &str, &str)> {
    let open = line.find(" [")?;
    let close = open + line[open..].find(']')?;
    let cpu = line[open + 2..close].parse().ok()?;
    let rest = &line[close + 1..];
    // The timestamp ends with ": ", then the event's name and its own ": ".
    let after_time = rest.find(": ")? + 2;
    let rest = &rest[after_time..];
    match rest.split_once(": ") {
        Some((name, fields)) => Some((cpu, name, fields)),
        None => Some((cpu, rest.trim_end(), "")),
    }
}

fn field<'a>(fields: &'a str, key: &str) -> Option<&'a str> {
    fields.split(' ').find_map(|word| word.strip_prefix(key)?.strip_prefix('='))
}

fn parse_event(cpu: u32, name: &str, fields: &str) -> Option<Event> {
    let kind = match name {
        "kmalloc" => EventKind::Kmalloc,
        "kmem_cache_alloc" => EventKind::CacheAlloc,
        "kfree" | "kmem_cache_free" => EventKind::Free,
        _ => return None,
    };
    let address = u64::from_str_radix(field(fields, "ptr")?, 16).ok()?;
    let size = |key| field(fields, key).and_then(|value| value.parse().ok()).unwrap_or(0);
    Some(Event { cpu, kind, address, requested: size("bytes_req"), allocated: size("bytes_alloc") })
}

/// ` => symbol+0xOFF/0xSIZE` to `symbol+0xOFF`.
fn frame(line: &str) -> Option<&str> {
    let frame = line.strip_prefix(" => ")?.trim_end();
    Some(frame.split_once('/').map_or(frame, |(symbol, _)| symbol))
}

/// Converts Linux's `trace` text to a [`MAGIC`] file, with `meta` lines `provenance` first.
pub fn convert(trace: &str, provenance: &[(String, String)]) -> (String, Counts) {
    // Events in trace order, each with its stack once that has come.
    let mut events: Vec<(Event, Option<u32>)> = Vec::new();
    // Per CPU, the events still waiting for their stacks, innermost last: an interrupt's
    // allocation can come between an event and its stack on one CPU, and its stack first.
    let mut waiting: HashMap<u32, Vec<usize>> = HashMap::new();
    let mut stack_ids: HashMap<Vec<String>, u32> = HashMap::new();
    let mut stacks: Vec<Vec<String>> = Vec::new();
    let mut lines = trace.lines().peekable();
    while let Some(line) = lines.next() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let Some((cpu, name, fields)) = split_event_line(line) else { continue };
        if name == "<stack trace>" {
            let mut frames = Vec::new();
            while let Some(next) = lines.peek().and_then(|next| frame(next)) {
                frames.push(next.to_string());
                lines.next();
            }
            let Some(index) = waiting.get_mut(&cpu).and_then(Vec::pop) else { continue };
            if events[index].0.kind == EventKind::Free {
                // A free's stack is not kept: the replay frees where the trace says, by address.
                events[index].1 = Some(u32::MAX);
                continue;
            }
            let start = frames.iter().take_while(|frame| frame.starts_with("__traceiter_")).count();
            let frames = frames.split_off(start);
            let next_id = stacks.len() as u32;
            let id = *stack_ids.entry(frames.clone()).or_insert_with(|| {
                stacks.push(frames);
                next_id
            });
            events[index].1 = Some(id);
        } else if let Some(event) = parse_event(cpu, name, fields) {
            waiting.entry(cpu).or_default().push(events.len());
            events.push((event, None));
        }
    }
    let mut counts = Counts { stacks: stacks.len() as u64, ..Counts::default() };
    let mut body = String::new();
    let mut live: HashMap<u64, ()> = HashMap::new();
    for (event, stack) in &events {
        match event.kind {
            EventKind::Kmalloc | EventKind::CacheAlloc => {
                let Some(stack) = stack else {
                    counts.without_stack += 1;
                    continue;
                };
                if event.address == 0 {
                    // A failed allocation: nothing to pair with a free.
                    continue;
                }
                let kind = if event.kind == EventKind::Kmalloc { "kmalloc" } else { "cache" };
                body.push_str(&format!(
                    "a {} {kind} {} {} {:x} {stack}\n",
                    event.cpu, event.requested, event.allocated, event.address
                ));
                live.insert(event.address, ());
                counts.allocations += 1;
            }
            EventKind::Free => {
                if event.address == 0 {
                    counts.frees_null += 1;
                } else if live.remove(&event.address).is_some() {
                    body.push_str(&format!("f {} {:x}\n", event.cpu, event.address));
                    counts.frees += 1;
                } else {
                    counts.frees_unrecorded += 1;
                }
            }
        }
    }
    counts.live_at_end = live.len() as u64;
    let mut out = format!("{MAGIC}\n");
    for (key, value) in provenance {
        out.push_str(&format!("meta {key} {value}\n"));
    }
    for (key, value) in [
        ("allocations", counts.allocations),
        ("frees", counts.frees),
        ("frees_unrecorded", counts.frees_unrecorded),
        ("frees_null", counts.frees_null),
        ("stacks", counts.stacks),
        ("without_stack", counts.without_stack),
        ("live_at_end", counts.live_at_end),
    ] {
        out.push_str(&format!("meta {key} {value}\n"));
    }
    for (id, frames) in stacks.iter().enumerate() {
        out.push_str(&format!("stack {id} {}\n", frames.join(" ")));
    }
    out.push_str(&body);
    (out, counts)
}

/// `text` (a [`MAGIC`] file) with `extra` `meta` lines after its last one: provenance that
/// needs the conversion's counts, such as instructions per allocation.
pub fn with_meta(text: &str, extra: &[(String, String)]) -> String {
    let mut meta_end = text.find('\n').map_or(text.len(), |at| at + 1);
    while text[meta_end..].starts_with("meta ") {
        meta_end += text[meta_end..].find('\n').map_or(text.len() - meta_end, |at| at + 1);
    }
    let mut out = String::with_capacity(text.len() + 256);
    out.push_str(&text[..meta_end]);
    for (key, value) in extra {
        out.push_str(&format!("meta {key} {value}\n"));
    }
    out.push_str(&text[meta_end..]);
    out
}

/// How a re-recorded trace compares with another one: whether their records (every line but
/// the `meta` ones) are the same, and if not, where they part and how the counts differ.
#[derive(Debug, PartialEq, Eq)]
pub struct Comparison {
    pub identical_records: bool,
    /// The first record (0-based, `meta` lines not counted) that differs.
    pub first_difference: Option<usize>,
    /// (name, other's, this one's) of `allocations`, `frees`, `frees_unrecorded`,
    /// `frees_null`, `stacks`, `live_at_end`.
    pub counts: Vec<(&'static str, String, String)>,
    /// This trace's distinct stacks that the other one also has (the same frames).
    pub stacks_shared: usize,
}

impl Comparison {
    /// Compares `new` with `old`, both [`MAGIC`] files.
    pub fn of(old: &str, new: &str) -> Self {
        fn records(text: &str) -> Vec<&str> {
            text.lines().skip(1).filter(|line| !line.starts_with("meta ")).collect()
        }
        let (old_records, new_records) = (records(old), records(new));
        let first_difference = (0..old_records.len().max(new_records.len()))
            .find(|&index| old_records.get(index) != new_records.get(index));
        let meta = |text: &str, key: &str| {
            text.lines()
                .find_map(|line| line.strip_prefix("meta ")?.strip_prefix(key)?.strip_prefix(' ').map(str::to_string))
                .unwrap_or_else(|| "?".into())
        };
        let counts = ["allocations", "frees", "frees_unrecorded", "frees_null", "stacks", "live_at_end"]
            .into_iter()
            .map(|key| (key, meta(old, key), meta(new, key)))
            .collect();
        let frames = |records: &[&str]| {
            records
                .iter()
                .filter_map(|line| line.strip_prefix("stack ")?.split_once(' ').map(|(_, frames)| frames.to_string()))
                .collect::<std::collections::HashSet<_>>()
        };
        let old_stacks = frames(&old_records);
        let stacks_shared = frames(&new_records).intersection(&old_stacks).count();
        Self { identical_records: first_difference.is_none(), first_difference, counts, stacks_shared }
    }

    /// One line for xtask's output and the README.
    pub fn summary(&self) -> String {
        if self.identical_records {
            return "records identical".into();
        }
        let counts: Vec<String> = self.counts.iter().map(|(name, old, new)| format!("{name} {old} -> {new}")).collect();
        format!(
            "records differ from record {}: {}; {} of the new stacks are in the other trace",
            self.first_difference.unwrap_or(0),
            counts.join(", "),
            self.stacks_shared
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines of a real boot's trace (Debian's 6.12.95-1~bpo12+1 on 4 CPUs): allocations on
    /// two CPUs with their stacks interleaved, frees of recorded, unrecorded and NULL pointers.
    const TRACE: &str = include_str!("fixtures/linux-kmem-trace.txt");

    #[test]
    fn a_real_trace_converts() {
        let (text, counts) = convert(TRACE, &[("kernel".into(), "linux-image-test".into())]);
        let mut lines = text.lines();
        assert_eq!(lines.next(), Some(MAGIC));
        assert_eq!(lines.next(), Some("meta kernel linux-image-test"));
        assert_eq!(counts.without_stack, 0, "{text}");
        assert!(counts.allocations > 0 && counts.stacks > 0 && counts.stacks <= counts.allocations, "{counts:?}");
        // Every allocation names a stack that exists; no stack starts with the tracer's frame.
        for line in text.lines().filter(|line| line.starts_with("stack ")) {
            assert!(!line.split(' ').nth(2).unwrap().starts_with("__traceiter_"), "{line}");
            assert!(line.split(' ').skip(2).all(|frame| frame.contains("+0x") && !frame.contains('/')), "{line}");
        }
        for line in text.lines().filter(|line| line.starts_with("a ")) {
            let stack: u64 = line.split(' ').nth(6).unwrap().parse().unwrap();
            assert!(stack < counts.stacks, "{line}");
        }
        let frees_in_fixture =
            TRACE.lines().filter(|line| line.contains(" kfree: ") || line.contains(" kmem_cache_free: ")).count();
        assert_eq!(counts.frees + counts.frees_unrecorded + counts.frees_null, frees_in_fixture as u64);
    }

    #[test]
    fn extra_meta_goes_after_the_last_and_comparison_ignores_meta() {
        let (text, _) = convert(TRACE, &[("kernel".into(), "linux-image-test".into())]);
        let extended = with_meta(&text, &[("instructions.run".into(), "123".into())]);
        let meta: Vec<&str> = extended.lines().skip(1).take_while(|line| line.starts_with("meta ")).collect();
        assert_eq!(meta.last(), Some(&"meta instructions.run 123"));
        assert_eq!(extended.lines().filter(|line| line.starts_with("meta ")).count(), meta.len());
        assert_eq!(extended.len(), text.len() + "meta instructions.run 123\n".len());
        let same = Comparison::of(&text, &extended);
        assert!(same.identical_records && same.first_difference.is_none(), "{same:?}");
        assert_eq!(same.summary(), "records identical");
        // One allocation fewer: the records part where it was.
        let (fewer, _) = convert(&TRACE.replacen(" kmalloc: ", " kmalloc_was: ", 1), &[]);
        let differs = Comparison::of(&text, &fewer);
        assert!(!differs.identical_records, "{differs:?}");
        assert!(differs.summary().contains("allocations "), "{}", differs.summary());
    }

    #[test]
    fn stacks_follow_their_cpu_and_frees_pair_by_address() {
        let trace = "# tracer: nop\n\
            a-1 [000] d.... 0.000001: kmalloc: call_site=f+0x1/0x2 ptr=fff0000000001000 bytes_req=24 bytes_alloc=32 gfp_flags=GFP_KERNEL node=-1 accounted=false\n\
            a-1 [000] d.h.. 0.000002: kmalloc: call_site=irq+0x1/0x2 ptr=fff0000000003000 bytes_req=8 bytes_alloc=8 gfp_flags=GFP_ATOMIC node=-1 accounted=false\n\
            a-1 [000] d.h.. 0.000002: <stack trace>\n => __traceiter_kmalloc+0x74/0xa8\n => irq+0x4/0x8\n\
            b-2 [001] d.... 0.000002: kmem_cache_alloc: call_site=g+0x1/0x2 ptr=fff0000000002000 bytes_req=56 bytes_alloc=64 gfp_flags=GFP_KERNEL node=-1 accounted=false\n\
            a-1 [000] d.... 0.000003: <stack trace>\n => __traceiter_kmalloc+0x74/0xa8\n => f+0x10/0x40\n => start+0x8/0x20\n\
            b-2 [001] d.... 0.000004: <stack trace>\n => __traceiter_kmem_cache_alloc+0x74/0xa8\n => g+0x20/0x40\n => start+0x8/0x20\n\
            a-1 [000] d.... 0.000005: kfree: call_site=h+0x1/0x2 ptr=fff0000000001000\n\
            a-1 [000] d.... 0.000006: <stack trace>\n => __traceiter_kfree+0x74/0xa8\n => h+0x4/0x8\n\
            a-1 [000] d.... 0.000007: kfree: call_site=h+0x1/0x2 ptr=0000000000000000\n\
            a-1 [000] d.... 0.000008: kmem_cache_free: call_site=h+0x1/0x2 ptr=fff0000000009000 name=x\n";
        let (text, counts) = convert(trace, &[]);
        assert_eq!(
            text.lines().skip(1).filter(|line| !line.starts_with("meta ")).collect::<Vec<_>>(),
            [
                // The interrupt's stack came first: it is stack 0, and its event the second.
                "stack 0 irq+0x4",
                "stack 1 f+0x10 start+0x8",
                "stack 2 g+0x20 start+0x8",
                "a 0 kmalloc 24 32 fff0000000001000 1",
                "a 0 kmalloc 8 8 fff0000000003000 0",
                "a 1 cache 56 64 fff0000000002000 2",
                "f 0 fff0000000001000",
            ]
        );
        assert_eq!(
            counts,
            Counts {
                allocations: 3,
                frees: 1,
                frees_unrecorded: 1,
                frees_null: 1,
                stacks: 3,
                without_stack: 0,
                live_at_end: 2
            }
        );
    }
}
