//! Close names for a mistyped one, and the kernel tests' names that `test --filter` must match.
//!
//! A mistake in a name should end xtask at once with the names the user probably meant, not
//! after a build and a boot. The kernel tests' names are known statically: each is the string
//! literal of a `Test { name: "...", .. }` entry under `kernel/src/tests` (the kernel's `TESTS`
//! table, which `run=test filter=` matches by substring), so they are read from the sources,
//! before anything builds.

use crate::Failure;
use std::path::Path;

/// How many close names a message offers.
const OFFERED: usize = 5;

/// The names in `names` closest to `wanted`, best first, at most [`OFFERED`]: the same last
/// path segment (`tick` for `kernel::task::tick`), then names containing `wanted` (or its last
/// segment), then names within a small edit distance. Spaces are ignored, as the kernel's
/// sweep ignores them in names such as `<StackDepot<4096, 16>>::find`.
pub fn close_names<'a>(wanted: &str, names: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    let wanted: String = wanted.chars().filter(|&c| c != ' ').collect();
    let wanted_leaf = leaf(&wanted);
    // Allow about one typing mistake in four characters, at least one, at most four.
    let budget = (wanted.chars().count() / 4).clamp(1, 4);
    let mut scored: Vec<(usize, usize, &str)> = names
        .into_iter()
        .filter_map(|name| {
            let compact: String = name.chars().filter(|&c| c != ' ').collect();
            let score = if compact == wanted {
                return None;
            } else if !wanted_leaf.is_empty() && leaf(&compact) == wanted_leaf {
                0
            } else if compact.contains(&wanted) || (wanted_leaf.len() >= 3 && leaf(&compact).contains(wanted_leaf)) {
                1
            } else {
                let distance = edit_distance(&wanted, &compact, budget)
                    .or_else(|| edit_distance(wanted_leaf, leaf(&compact), budget))?;
                2 + distance
            };
            Some((score, name.len(), name))
        })
        .collect();
    scored.sort();
    let mut offered: Vec<&str> = Vec::new();
    for (_, _, name) in scored {
        if !offered.contains(&name) {
            offered.push(name);
        }
        if offered.len() == OFFERED {
            break;
        }
    }
    offered
}

/// ` (did you mean a, b?)`, or nothing when no name is close.
pub fn did_you_mean(close: &[&str]) -> String {
    if close.is_empty() {
        return String::new();
    }
    let quoted: Vec<String> = close.iter().map(|name| format!("`{name}`")).collect();
    format!(" (did you mean {}?)", quoted.join(", "))
}

/// The last `::` segment of a path (the whole text when it has none).
fn leaf(name: &str) -> &str {
    name.rsplit("::").next().unwrap_or(name)
}

/// Levenshtein distance between `a` and `b` if it is at most `budget` (None: farther).
pub fn edit_distance(a: &str, b: &str, budget: usize) -> Option<usize> {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    if a.len().abs_diff(b.len()) > budget {
        return None;
    }
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    let mut current = vec![0; b.len() + 1];
    for (i, &left) in a.iter().enumerate() {
        current[0] = i + 1;
        for (j, &right) in b.iter().enumerate() {
            let substitute = previous[j] + usize::from(left != right);
            current[j + 1] = substitute.min(previous[j + 1] + 1).min(current[j] + 1);
        }
        // Every later row is at least this row's minimum: stop as soon as it is over budget.
        if current.iter().min().is_some_and(|&least| least > budget) {
            return None;
        }
        std::mem::swap(&mut previous, &mut current);
    }
    Some(previous[b.len()]).filter(|&distance| distance <= budget)
}

/// Every kernel test's name, from the `Test { name: "..." }` entries under `tests_dir`.
pub fn kernel_test_names(tests_dir: &Path) -> Result<Vec<String>, Failure> {
    let entry = regex::Regex::new(r#"Test\s*\{\s*name:\s*"([^"]+)""#).expect("a valid pattern");
    let mut names = Vec::new();
    let mut pending = vec![tests_dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let listing = std::fs::read_dir(&dir).map_err(|error| Failure::usage(format!("{}: {error}", dir.display())))?;
        for item in listing.flatten() {
            let path = item.path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|extension| extension == "rs") {
                let text = std::fs::read_to_string(&path)
                    .map_err(|error| Failure::usage(format!("{}: {error}", path.display())))?;
                names.extend(entry.captures_iter(&text).map(|captures| captures[1].to_string()));
            }
        }
    }
    names.sort();
    names.dedup();
    Ok(names)
}

/// `test --filter FILTER`: some kernel test's name must contain it (the kernel's rule), or exit
/// 2 with the close names. An empty filter selects every test.
pub fn check_test_filter(filter: &str) -> Result<(), Failure> {
    if filter.is_empty() {
        return Ok(());
    }
    let tests = crate::build::workspace_root().join("kernel/src/tests");
    let names = kernel_test_names(&tests)?;
    check_filter_against(filter, &names)
}

fn check_filter_against(filter: &str, names: &[String]) -> Result<(), Failure> {
    if names.iter().any(|name| name.contains(filter)) {
        return Ok(());
    }
    let mut close = close_names(filter, names.iter().map(String::as_str));
    if close.is_empty() {
        close = close_fragments(filter, names);
    }
    Err(Failure::usage(format!(
        "--filter `{filter}`: no kernel test's name contains it{} ({} tests: \
         `grep -rn 'name: \"' kernel/src/tests` lists them)",
        did_you_mean(&close),
        names.len(),
    )))
}

/// The names holding a part within a small edit distance of `fragment` (a filter is a part of
/// a name, so whole-name distances miss its typos), closest first, at most [`OFFERED`].
fn close_fragments<'a>(fragment: &str, names: &'a [String]) -> Vec<&'a str> {
    let wanted: Vec<char> = fragment.chars().collect();
    let budget = (wanted.len() / 4).clamp(1, 4);
    let mut scored: Vec<(usize, &str)> = names
        .iter()
        .filter_map(|name| {
            let name_chars: Vec<char> = name.chars().collect();
            let lengths = wanted.len().saturating_sub(budget).max(1)..=wanted.len() + budget;
            let best = lengths
                .flat_map(|length| name_chars.windows(length.min(name_chars.len())))
                .filter_map(|window| edit_distance(fragment, &window.iter().collect::<String>(), budget))
                .min()?;
            Some((best, name.as_str()))
        })
        .collect();
    scored.sort();
    scored.into_iter().take(OFFERED).map(|(_, name)| name).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edit_distance_counts_edits_within_a_budget() {
        assert_eq!(edit_distance("simulate", "simulate", 2), Some(0));
        assert_eq!(edit_distance("simulat", "simulate", 2), Some(1));
        assert_eq!(edit_distance("brk_step", "brk-step", 2), Some(1));
        assert_eq!(edit_distance("tick", "kick", 1), Some(1));
        assert_eq!(edit_distance("abc", "xyz", 2), None);
        assert_eq!(edit_distance("a", "abcdef", 2), None);
    }

    #[test]
    fn close_names_prefer_the_same_leaf_then_substrings_then_typos() {
        let names = [
            "kernel::task::tick",
            "kernel::time::tick_count",
            "kernel::task::tock",
            "kernel::demo::probes::call_once",
            "bench_probe_target_push",
        ];
        assert_eq!(close_names("tick", names)[..2], ["kernel::task::tick", "kernel::time::tick_count"]);
        assert_eq!(close_names("kernel::task::tikc", names).first(), Some(&"kernel::task::tick"));
        assert_eq!(close_names("probe_target_push", names), ["bench_probe_target_push"]);
        assert!(close_names("nope", names).is_empty());
        // Spaces do not count: the sweep's names are written without them.
        assert_eq!(close_names("<a<1,2>>::find", ["<a<1, 2>>::finds"]), ["<a<1, 2>>::finds"]);
    }

    #[test]
    fn a_filter_no_test_matches_exits_2_with_close_names() {
        let names: Vec<String> = ["kprobe_simulates_push", "kretprobe_counts_returns"].map(String::from).to_vec();
        assert!(check_filter_against("kprobe", &names).is_ok());
        let failure = check_filter_against("kprobe_simulate_push", &names).expect_err("no test contains it");
        assert_eq!(failure.status, 2);
        assert!(failure.message.contains("`kprobe_simulates_push`"), "{}", failure.message);
        // A typo in a part of a name.
        let failure = check_filter_against("simulats_pus", &names).expect_err("no test contains it");
        assert!(failure.message.contains("did you mean `kprobe_simulates_push`?"), "{}", failure.message);
    }

    #[test]
    fn the_kernel_tests_are_found_in_the_sources() {
        let names = kernel_test_names(&crate::build::workspace_root().join("kernel/src/tests")).expect("readable");
        assert!(names.len() > 100, "{} names", names.len());
        assert!(names.iter().any(|name| name == "brk_is_taken_and_returned_from"));
    }
}
