//! The host's package sources: its OS (`/etc/os-release`) and apt's entries, read in both
//! formats (one-line `*.list` and deb822 `*.sources`), and deb822 entries written from them.

use std::path::Path;
use std::process::{Command, Stdio};

/// What xtask knows about the machine when it plans an installation.
pub struct Host {
    /// `/etc/os-release`'s `ID` and `ID_LIKE` words.
    pub os_ids: Vec<String>,
    /// `/etc/os-release`'s `VERSION_CODENAME` (e.g. `bookworm`).
    pub codename: String,
    pub is_root: bool,
    pub has_apt: bool,
    /// The machine's apt sources, when it has any.
    pub apt_sources: Vec<AptSource>,
}

impl Host {
    pub fn probe() -> Self {
        let os_release = std::fs::read_to_string("/etc/os-release").unwrap_or_default();
        let field = |name: &str| {
            os_release.lines().find_map(|line| {
                line.strip_prefix(name)?.strip_prefix('=').map(|value| value.trim_matches('"').to_string())
            })
        };
        let mut os_ids: Vec<String> = field("ID").into_iter().collect();
        os_ids.extend(field("ID_LIKE").unwrap_or_default().split_whitespace().map(str::to_string));
        if cfg!(target_os = "macos") {
            os_ids.push("macos".into());
        }
        Self {
            os_ids,
            codename: field("VERSION_CODENAME").unwrap_or_default(),
            is_root: Command::new("id").arg("-u").output().is_ok_and(|output| output.stdout.trim_ascii() == b"0"),
            has_apt: Command::new("apt-get").arg("--version").stdout(Stdio::null()).status().is_ok(),
            apt_sources: read_apt_sources(Path::new("/etc/apt")),
        }
    }

    pub fn is(&self, id: &str) -> bool {
        self.os_ids.iter().any(|known| known == id)
    }
}

/// One `deb` entry of apt's sources (binary packages; `deb-src` entries are not kept).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AptSource {
    pub uri: String,
    pub suites: Vec<String>,
    pub components: Vec<String>,
    /// A keyring path or, in deb822, an inline key block (kept with its continuation lines).
    pub signed_by: Option<String>,
}

/// Every `deb` entry under an apt configuration directory: `sources.list`,
/// `sources.list.d/*.list` (one-line format) and `sources.list.d/*.sources` (deb822).
pub fn read_apt_sources(apt_dir: &Path) -> Vec<AptSource> {
    let mut sources = std::fs::read_to_string(apt_dir.join("sources.list"))
        .map(|text| parse_one_line_sources(&text))
        .unwrap_or_default();
    let mut parts: Vec<_> = std::fs::read_dir(apt_dir.join("sources.list.d"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path())
        .collect();
    // apt reads the parts in name order; the first entry for a suite wins below.
    parts.sort();
    for path in parts {
        let Ok(text) = std::fs::read_to_string(&path) else { continue };
        match path.extension().and_then(|extension| extension.to_str()) {
            Some("list") => sources.extend(parse_one_line_sources(&text)),
            Some("sources") => sources.extend(parse_deb822_sources(&text)),
            _ => {}
        }
    }
    sources
}

/// The one-line format: `deb [option=value ...] URI SUITE [COMPONENT ...]`.
pub fn parse_one_line_sources(text: &str) -> Vec<AptSource> {
    let mut sources = Vec::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or_default().trim();
        let Some(rest) = line.strip_prefix("deb ").or_else(|| line.strip_prefix("deb\t")) else { continue };
        let rest = rest.trim_start();
        let (options, rest) = match rest.strip_prefix('[') {
            Some(bracketed) => match bracketed.split_once(']') {
                Some((options, rest)) => (options, rest),
                None => continue,
            },
            None => ("", rest),
        };
        let signed_by = options.split_whitespace().find_map(|option| {
            let (key, value) = option.split_once('=')?;
            key.eq_ignore_ascii_case("signed-by").then(|| value.to_string())
        });
        let mut words = rest.split_whitespace();
        let (Some(uri), Some(suite)) = (words.next(), words.next()) else { continue };
        sources.push(AptSource {
            uri: uri.to_string(),
            suites: vec![suite.to_string()],
            components: words.map(str::to_string).collect(),
            signed_by,
        });
    }
    sources
}

/// The deb822 format: stanzas of `Field: value` separated by blank lines, continuation lines
/// starting with white space, `#` comments; `Enabled: no` stanzas are skipped.
pub fn parse_deb822_sources(text: &str) -> Vec<AptSource> {
    let mut sources = Vec::new();
    let mut fields: Vec<(String, String)> = Vec::new();
    let mut finish = |fields: &mut Vec<(String, String)>| {
        let get =
            |name: &str| fields.iter().find(|(key, _)| key.eq_ignore_ascii_case(name)).map(|(_, value)| value.as_str());
        let words =
            |name: &str| get(name).unwrap_or_default().split_whitespace().map(str::to_string).collect::<Vec<_>>();
        let enabled = !get("Enabled").is_some_and(|value| value.trim().eq_ignore_ascii_case("no"));
        if enabled && words("Types").iter().any(|kind| kind == "deb") {
            for uri in words("URIs") {
                sources.push(AptSource {
                    uri,
                    suites: words("Suites"),
                    components: words("Components"),
                    signed_by: get("Signed-By").map(|value| value.trim().to_string()).filter(|value| !value.is_empty()),
                });
            }
        }
        fields.clear();
    };
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        if line.trim().is_empty() {
            finish(&mut fields);
        } else if line.starts_with([' ', '\t']) {
            if let Some((_, value)) = fields.last_mut() {
                value.push('\n');
                value.push_str(line);
            }
        } else if let Some((key, value)) = line.split_once(':') {
            fields.push((key.trim().to_string(), value.trim().to_string()));
        }
    }
    finish(&mut fields);
    sources
}

/// The entry that serves the Debian suite `suite` itself (not `-security` or `-updates`),
/// preferring one with component `main`.
pub fn suite_source<'a>(sources: &'a [AptSource], suite: &str) -> Option<&'a AptSource> {
    let serves = |source: &&AptSource| source.suites.iter().any(|name| name == suite);
    sources
        .iter()
        .filter(serves)
        .find(|source| source.components.iter().any(|component| component == "main"))
        .or_else(|| sources.iter().find(serves))
}

/// A deb822 entry for `suite` from the mirror and keyring of `source`.
pub fn deb822_entry(source: &AptSource, suite: &str, components: &[&str], architecture: Option<&str>) -> String {
    let mut entry =
        format!("Types: deb\nURIs: {}\nSuites: {suite}\nComponents: {}\n", source.uri, components.join(" "));
    if let Some(architecture) = architecture {
        entry.push_str(&format!("Architectures: {architecture}\n"));
    }
    // The source's own keyring; without one apt falls back to its global trusted keys, which
    // already vouch for that mirror.
    if let Some(signed_by) = &source.signed_by {
        entry.push_str(&format!("Signed-By: {signed_by}\n"));
    }
    entry
}

/// The machine's source for its own Debian release, with that release's name.
pub fn machine_debian_source() -> Result<(AptSource, String), String> {
    let host = Host::probe();
    if !host.is("debian") || host.codename.is_empty() {
        return Err("this host is not Debian: there is no Debian suite to fetch from".into());
    }
    suite_source(&host.apt_sources, &host.codename)
        .cloned()
        .map(|source| (source, host.codename.clone()))
        .ok_or_else(|| format!("no apt source serves Debian {}", host.codename))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deb822_stanzas_comments_continuations_and_disabled_entries() {
        let text = "# a comment\nTypes: deb deb-src\nURIs: http://mirror.example.org/debian\nSuites: bookworm bookworm-updates\n\
                    Components: main contrib\nSigned-By: /etc/keys/a.gpg\n\n\
                    Types: deb\nURIs: http://disabled.example.org/debian\nSuites: bookworm\nComponents: main\nEnabled: no\n\n\
                    Types: deb-src\nURIs: http://source-only.example.org/debian\nSuites: bookworm\nComponents: main\n\n\
                    Types: deb\nURIs: http://inline.example.org/debian\nSuites: trixie\nComponents: main\n\
                    Signed-By:\n -----BEGIN PGP PUBLIC KEY BLOCK-----\n .\n abc\n";
        let sources = parse_deb822_sources(text);
        assert_eq!(sources.len(), 2, "{sources:?}");
        assert_eq!(sources[0].uri, "http://mirror.example.org/debian");
        assert_eq!(sources[0].suites, ["bookworm", "bookworm-updates"]);
        assert_eq!(sources[0].components, ["main", "contrib"]);
        assert_eq!(sources[0].signed_by.as_deref(), Some("/etc/keys/a.gpg"));
        assert_eq!(sources[1].signed_by.as_deref(), Some("-----BEGIN PGP PUBLIC KEY BLOCK-----\n .\n abc"));
    }

    #[test]
    fn one_line_entries_with_options() {
        let text = "deb [arch=amd64 signed-by=/etc/keys/b.gpg] http://mirror.example.org/debian bookworm main non-free\n\
                    deb-src http://mirror.example.org/debian bookworm main\n\
                    # deb http://commented.example.org/debian bookworm main\n\
                    deb http://security.example.org/debian-security bookworm-security main # trailing\n";
        let sources = parse_one_line_sources(text);
        assert_eq!(
            sources,
            [
                AptSource {
                    uri: "http://mirror.example.org/debian".into(),
                    suites: vec!["bookworm".into()],
                    components: vec!["main".into(), "non-free".into()],
                    signed_by: Some("/etc/keys/b.gpg".into()),
                },
                AptSource {
                    uri: "http://security.example.org/debian-security".into(),
                    suites: vec!["bookworm-security".into()],
                    components: vec!["main".into()],
                    signed_by: None,
                },
            ]
        );
    }
}
