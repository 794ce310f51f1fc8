//! `--log linux` output held to the patterns of the Linux tools that read it.
//!
//! The fixtures in `xtask/fixtures/linux/` are captured from the kernel (stdout only; the
//! function trace is the file the demo writes):
//!
//! ```sh
//! cargo xtask qemu --log linux > xtask/fixtures/linux/demo.log
//! cp target/trace/trace.txt xtask/fixtures/linux/trace.txt
//! cargo xtask qemu --log linux --run test --filter kasan_oob_right_small > xtask/fixtures/linux/corpus.log
//! cargo xtask qemu --log linux --run panic > xtask/fixtures/linux/panic.log
//! cargo xtask qemu --log linux --run unowned-brk > xtask/fixtures/linux/oops.log
//! ```
//!
//! Each pattern below is the tool's own, rewritten for Rust's `regex` where the syntax differs
//! (named in its comment), with the file and commit it was read from. syzkaller's `compile()`
//! (pkg/report/report.go) expands `{{FUNC}}` to `([a-zA-Z0-9_]+)(?:\.|\+)` and `{{PC}}` to
//! `\[\<?(?:0x)?[0-9a-f]+\>?\]`; the expansions are written out here.

use regex::Regex;

const DEMO: &str = include_str!("../../fixtures/linux/demo.log");
const CORPUS: &str = include_str!("../../fixtures/linux/corpus.log");
const PANIC: &str = include_str!("../../fixtures/linux/panic.log");
const OOPS: &str = include_str!("../../fixtures/linux/oops.log");
const TRACE: &str = include_str!("../../fixtures/linux/trace.txt");

/// syzkaller 1e72964b0111319984575e60f266d1fa0a98abb5, pkg/report/linux.go, `linuxOopses`
/// "BUG: KASAN:" report pattern (`(?:.*\n)+?` spans the lines up to the access line).
const SYZKALLER_KASAN: &str =
    r"BUG: KASAN: ([a-z\-]+) in ([a-zA-Z0-9_]+)(?:\.|\+)(?:.*\n)+?.*(Read|Write) (?:of size|at addr) (?:[0-9a-f]+)";
/// The same file, `linuxOopses` "Kernel panic" title: `Kernel panic - not syncing: (.*)`.
const SYZKALLER_PANIC: &str = r"Kernel panic - not syncing: (.*)";
/// The same file, `linuxOopses` "Internal error:" title, the oops arm64's `die()` prints.
const SYZKALLER_INTERNAL_ERROR: &str = r"Internal error:";
/// The same file, `linuxRipFrame` (the `pc :` line that names the title's function), its
/// `(?:[0-9]+:)?{{PC}}`-only alternatives left out.
const SYZKALLER_RIP_FRAME: &str =
    r"(?:IP|NIP|pc |PC is at):? (?:(?:[0-9]+:)?(?:\[<?(?:0x)?[0-9a-f]+>?\] +){0,2}([a-zA-Z0-9_]+)(?:\.|\+))";
/// The same file, `linuxCallTrace`, which starts the stack part of both formats.
const SYZKALLER_CALL_TRACE: &str = r"(?:Call (?:T|t)race:)|(?:Backtrace:)";
/// The same file, `linuxStackParams.frameRes[0]`: `^ *(?:{{PC}} ){0,2}{{FUNC}}`, matched on a
/// line without its console timestamp (syzkaller strips the `[    1.234567] ` prefix).
const SYZKALLER_FRAME: &str = r"^ *(?:\[<?(?:0x)?[0-9a-f]+>?\] ){0,2}([a-zA-Z0-9_]+)(?:\.|\+)";
/// Linux 076979ee62f23c0eff035e0528b4cfadbe743255, scripts/decode_stacktrace.sh: the lines it
/// decodes (`[[ $line =~ [^+\ ]+\+0x[0-9a-f]+/0x[0-9a-f]+ ]]`, bash ERE); it then takes the
/// line's last word for the symbol and looks up `${symbol%+*}` in `nm`'s third column.
const DECODE_STACKTRACE: &str = r"[^+ ]+\+0x[0-9a-f]+/0x[0-9a-f]+";
/// Linux b4f2796932ac67a690ec01b643c0f7f621b9bff2, scripts/tracing/draw_functrace.py,
/// `parseLine`: `re.match("[^]]+?\\] +([0-9.]+): (\\w+) <-(\\w+)", line)` on the stripped
/// line; anchored at both ends here, so a name must be the whole token (`re.match` anchors at
/// the start only, and would take `kernel` of `kernel::demo::run`).
const DRAW_FUNCTRACE: &str = r"^[^\]]+?\] +([0-9.]+): (\w+) <-(\w+)$";

/// A line without its dmesg timestamp.
fn without_timestamp(line: &str) -> &str {
    match line.strip_prefix('[').and_then(|rest| rest.split_once("] ")) {
        Some((time, rest)) if time.trim().parse::<f64>().is_ok() => rest,
        _ => line,
    }
}

/// The lines of the first `Call trace:` block after `start` (the line index of a title).
fn call_trace(log: &str, start: usize) -> Vec<&str> {
    let call_trace = Regex::new(SYZKALLER_CALL_TRACE).unwrap();
    log.lines()
        .skip(start)
        .map(without_timestamp)
        .skip_while(|line| !call_trace.is_match(line))
        .skip(1)
        .take_while(|line| line.starts_with(' ') && !line.trim_start().starts_with("fp:"))
        .collect()
}

fn line_index(log: &str, prefix: &str) -> usize {
    log.lines().position(|line| without_timestamp(line).starts_with(prefix)).expect("the fixture has the line")
}

/// syzkaller's title of a KASAN report (its format `KASAN: %[1]v %[3]v in %[4]v`, the groups
/// counted with the `BUG: KASAN:` prefix its title pattern adds), or why there is none.
fn kasan_title(log: &str) -> String {
    let captures = Regex::new(SYZKALLER_KASAN).unwrap().captures(log).expect("syzkaller's KASAN pattern matches");
    format!("KASAN: {} {} in {}", &captures[1], &captures[3], &captures[2])
}

/// Frames syzkaller reads under the report's `Call trace:`.
fn frames(log: &str, start: usize) -> Vec<String> {
    let frame = Regex::new(SYZKALLER_FRAME).unwrap();
    call_trace(log, start)
        .into_iter()
        .filter_map(|line| frame.captures(line).map(|captures| captures[1].to_string()))
        .collect()
}

#[test]
fn the_demo_report_has_syzkaller_title_with_access_and_frames() {
    let title = kasan_title(DEMO);
    assert!(title.starts_with("KASAN: slab-use-after-free Read in _R"), "{title}");
    assert!(title.ends_with("11read_object"), "{title}");
    let frames = frames(DEMO, line_index(DEMO, "BUG: KASAN:"));
    assert!(frames.len() >= 4, "{frames:?}");
    assert!(frames[0].ends_with("11read_object"), "{frames:?}");
    assert!(frames.iter().all(|name| Regex::new(r"^(_R[A-Za-z0-9_]+|[a-z_]+)$").unwrap().is_match(name)));
}

#[test]
fn a_corpus_report_has_syzkaller_title_with_access_and_frames() {
    let title = kasan_title(CORPUS);
    assert!(title.starts_with("KASAN: slab-out-of-bounds Write in _R"), "{title}");
    assert!(!frames(CORPUS, line_index(CORPUS, "BUG: KASAN:")).is_empty());
}

#[test]
fn a_panic_has_syzkaller_title_and_frames() {
    let panic = Regex::new(SYZKALLER_PANIC).unwrap();
    let line = PANIC.lines().map(without_timestamp).find(|line| panic.is_match(line)).expect("a panic line");
    assert_eq!(&panic.captures(line).unwrap()[1], "deliberate panic (run=panic)");
    let frames = frames(PANIC, line_index(PANIC, "Kernel panic - not syncing:"));
    assert!(frames.iter().any(|name| name.ends_with("3run5panic")), "{frames:?}");
    // Linux's closing line of a panic, before the kernel's own.
    let end = "---[ end Kernel panic - not syncing: deliberate panic (run=panic) ]---";
    assert!(PANIC.lines().map(without_timestamp).any(|line| line == end));
}

#[test]
fn an_unexpected_exception_has_syzkaller_title_and_frames() {
    let start = line_index(OOPS, "Internal error:");
    assert!(Regex::new(SYZKALLER_INTERNAL_ERROR).unwrap().is_match(OOPS.lines().nth(start).unwrap()));
    // syzkaller's title is `Internal error in FUNC`, FUNC from the `pc :` line after the title.
    let rip = Regex::new(SYZKALLER_RIP_FRAME).unwrap();
    let function = OOPS
        .lines()
        .skip(start)
        .map(without_timestamp)
        .find_map(|line| rip.captures(line).map(|captures| captures[1].to_string()))
        .expect("a pc : line");
    assert!(function.ends_with("11unowned_brk"), "{function}");
    let frames = frames(OOPS, start);
    assert!(frames.first().is_some_and(|name| name.ends_with("11unowned_brk")), "{frames:?}");
    assert!(OOPS.lines().map(without_timestamp).any(|line| line == "---[ end trace 0000000000000000 ]---"));
}

#[test]
fn call_trace_lines_are_what_decode_stacktrace_decodes() {
    let decodable = Regex::new(DECODE_STACKTRACE).unwrap();
    let symbol = Regex::new(r"^([A-Za-z0-9_]+)\+0x[0-9a-f]+/0x[0-9a-f]+$").unwrap();
    // The unowned BRK is raised two calls below the boot code.
    for (log, frames) in [(DEMO, 3), (CORPUS, 3), (PANIC, 3), (OOPS, 2)] {
        let mut decoded = 0;
        for line in call_trace(log, 0).into_iter().filter(|line| !line.trim().starts_with("0x")) {
            assert!(decodable.is_match(line), "{line}");
            // The script's symbol is the last word; `${symbol%+*}` must be an `nm` name.
            let last = line.split_whitespace().last().unwrap();
            assert!(symbol.is_match(last), "{line}");
            decoded += 1;
        }
        assert!(decoded >= frames);
    }
}

#[test]
fn draw_functrace_parses_every_trace_record() {
    let pattern = Regex::new(DRAW_FUNCTRACE).unwrap();
    let records: Vec<&str> = TRACE.lines().filter(|line| !line.starts_with('#')).collect();
    let parsed = records.iter().filter(|line| pattern.is_match(line.trim())).count();
    let written = TRACE
        .lines()
        .find_map(|line| line.strip_prefix("# entries-in-buffer/entries-written: "))
        .and_then(|rest| rest.split('/').next()?.parse::<usize>().ok())
        .expect("the header's entry count");
    assert_eq!((parsed, records.len()), (written, written));
    // Linux's timestamp column: `[%03d]` then ` %5lu.%06lu: `.
    assert!(
        records.iter().all(|line| Regex::new(r"\[[0-9]{3}\]  {1,5}[0-9]{1,5}\.[0-9]{6}: ").unwrap().is_match(line))
    );
}

#[test]
fn no_report_line_has_a_level_word() {
    for log in [DEMO, CORPUS, PANIC, OOPS] {
        assert!(
            log.lines().map(without_timestamp).all(|line| !line.starts_with("ERROR ") && !line.starts_with("WARN "))
        );
    }
}
