//! Host tests for the filter glob: `*` and `?` over symbol names.

use ftrace::glob_match;

#[test]
fn literal_and_wildcards() {
    assert!(glob_match("kmalloc", "kmalloc"));
    assert!(!glob_match("kmalloc", "kmalloc_node"));
    assert!(!glob_match("kmalloc_node", "kmalloc"));
    assert!(glob_match("kmalloc*", "kmalloc_node"));
    assert!(glob_match("kmalloc*", "kmalloc"));
    assert!(glob_match("*alloc*", "__kmalloc_node"));
    assert!(glob_match("*", ""));
    assert!(glob_match("", ""));
    assert!(!glob_match("", "a"));
    assert!(!glob_match("?", ""));
    assert!(glob_match("k?alloc", "kmalloc"));
    assert!(!glob_match("k?alloc", "kalloc"));
    assert!(glob_match("*::*::new", "tracelab::mm::Frame::new"));
    assert!(!glob_match("*::*::new", "tracelab::mm::Frame::newer"));
}

#[test]
fn star_backtracks() {
    assert!(glob_match("*ab", "aab"));
    assert!(glob_match("*ab*ab", "xabyabab"));
    assert!(!glob_match("*ab*ab", "xabyaba"));
    assert!(glob_match("a*b*c", "abbbbc"));
    assert!(!glob_match("a*b*c", "abbbbcd"));
    assert!(glob_match("a**?", "ab"));
    assert!(glob_match("*?*?*", "ab"));
    assert!(!glob_match("*?*?*", "a"));
}

#[test]
fn question_mark_is_one_character_not_one_byte() {
    assert!(glob_match("f?o", "f\u{e9}o"));
    assert!(!glob_match("f??o", "f\u{e9}o"));
    assert!(glob_match("*\u{e9}", "caf\u{e9}"));
    assert!(glob_match("?", "\u{1f600}"));
}

/// Against a plain recursive matcher over characters, on all short strings
/// of a small alphabet.
#[test]
fn agrees_with_a_reference_matcher() {
    fn reference(pattern: &[char], name: &[char]) -> bool {
        match pattern.split_first() {
            None => name.is_empty(),
            Some(('*', rest)) => (0..=name.len()).any(|skip| reference(rest, &name[skip..])),
            Some(('?', rest)) => !name.is_empty() && reference(rest, &name[1..]),
            Some((c, rest)) => name.first() == Some(c) && reference(rest, &name[1..]),
        }
    }
    fn strings(alphabet: &[char], max: usize) -> Vec<String> {
        let mut all = vec![String::new()];
        let mut last = vec![String::new()];
        for _ in 0..max {
            last = last.iter().flat_map(|s| alphabet.iter().map(move |c| format!("{s}{c}"))).collect();
            all.extend(last.iter().cloned());
        }
        all
    }
    let patterns = strings(&['a', 'b', '*', '?'], 4);
    let names = strings(&['a', 'b', '\u{e9}'], 4);
    for pattern in &patterns {
        let p: Vec<char> = pattern.chars().collect();
        for name in &names {
            let n: Vec<char> = name.chars().collect();
            assert_eq!(glob_match(pattern, name), reference(&p, &n), "{pattern:?} vs {name:?}");
        }
    }
}
