//! Glob matching of symbol names for filters: `*` and `?`, nothing else.

/// Whether `name` matches `pattern`, where `*` matches any run of characters
/// (including none), `?` exactly one character, and every other character
/// itself. There is no escape and no character class: symbol names do not
/// contain `*` or `?`.
///
/// Linear in `name` for each `*`, without recursion or allocation: a
/// mismatch after a `*` retries that `*` with one more character, which is
/// enough because a later `*` can absorb whatever an earlier one could.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let pattern = pattern.as_bytes();
    let name = name.as_bytes();
    let (mut p, mut n) = (0, 0);
    // The last `*` seen, and the name position it is currently matched up to.
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        if p < pattern.len() {
            match pattern[p] {
                b'*' => {
                    star = Some((p, n));
                    p += 1;
                    continue;
                }
                b'?' => {
                    p += 1;
                    n += char_length(name, n);
                    continue;
                }
                byte if byte == name[n] => {
                    p += 1;
                    n += 1;
                    continue;
                }
                _ => {}
            }
        }
        let Some((star_p, star_n)) = star else { return false };
        // Let that `*` swallow one more character and retry after it.
        let next = star_n + char_length(name, star_n);
        star = Some((star_p, next));
        p = star_p + 1;
        n = next;
    }
    pattern[p..].iter().all(|&byte| byte == b'*')
}

/// Length in bytes of the UTF-8 character that starts at `name[at]`, so that
/// `?` and `*` step over whole characters and byte comparisons only ever
/// start at character boundaries.
fn char_length(name: &[u8], at: usize) -> usize {
    let length = match name[at] {
        0xf0.. => 4,
        0xe0.. => 3,
        0xc0.. => 2,
        _ => 1,
    };
    length.min(name.len() - at)
}
