//! Debian's arm64 kernel package through a private apt configuration under target/peer/.
//!
//! Nothing is installed or configured system-wide: apt runs with `APT_CONFIG` pointing at a
//! file of our own whose state, cache, sources and configuration parts all live under
//! `target/peer/apt/`, with `APT::Architecture "arm64"` (no `dpkg --add-architecture`). The
//! sources are the machine's own entry for its Debian release, read by [`crate::apt`], once for
//! the release and once for its backports suite, where the 6.12 kernels are: no mirror host is
//! written in the code. The package is fetched with `apt-get download` and unpacked with
//! `dpkg-deb -x`; which package and version it was is recorded next to the tree.

use crate::Failure;
use crate::apt::{AptSource, deb822_entry, machine_debian_source};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The kernel series the peer runs: Debian's backports carry it for bookworm.
pub const SERIES: &str = "6.12";
/// The flavour: the generic arm64 kernel (not `cloud-arm64` nor `rt-arm64`), unsigned (the
/// signed one wraps the same image for Secure Boot).
const FLAVOUR_SUFFIX: &str = "-arm64-unsigned";
/// The file that records which package the tree under `root/` came from.
const RECORD_FILE: &str = "package.txt";

/// A Debian kernel package unpacked under target/peer/linux/.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelPackage {
    /// e.g. `linux-image-6.12.95+deb12-arm64-unsigned`.
    pub name: String,
    /// e.g. `6.12.95-1~bpo12+1`.
    pub version: String,
    /// The `.deb`'s SHA-256, as apt's index gives it (apt checked the download against it).
    pub sha256: String,
    /// The unpacked package (`boot/`, `lib/modules/`).
    pub root: PathBuf,
}

impl KernelPackage {
    /// The kernel release the package installs (`6.12.95+deb12-arm64`): the name of its
    /// `boot/vmlinuz-*`, `boot/config-*` and `lib/modules/*` (its `boot/System.map-*` is a
    /// placeholder: the symbols are in the `-dbg` package, or the guest's /proc/kallsyms).
    pub fn release(&self) -> &str {
        let release = self.name.strip_prefix("linux-image-").unwrap_or(&self.name);
        release.strip_suffix("-unsigned").unwrap_or(release)
    }

    pub fn image(&self) -> PathBuf {
        self.root.join(format!("boot/vmlinuz-{}", self.release()))
    }

    pub fn config(&self) -> PathBuf {
        self.root.join(format!("boot/config-{}", self.release()))
    }

    pub fn modules(&self) -> PathBuf {
        self.root.join(format!("lib/modules/{}", self.release()))
    }

    /// `name version sha256`, one field a line: what every result names.
    fn record(&self) -> String {
        format!("name {}\nversion {}\nsha256 {}\n", self.name, self.version, self.sha256)
    }

    fn from_record(text: &str, root: PathBuf) -> Option<Self> {
        let field =
            |key: &str| text.lines().find_map(|line| line.strip_prefix(key)?.strip_prefix(' ').map(str::to_string));
        Some(Self { name: field("name")?, version: field("version")?, sha256: field("sha256")?, root })
    }
}

/// target/peer/: the apt configuration, the downloads and the unpacked trees.
pub fn peer_dir() -> PathBuf {
    crate::build::target_dir().join("peer")
}

/// The newest Debian 6.12 arm64 kernel from the machine's Debian release and its backports,
/// downloaded and unpacked under target/peer/linux/ (kept when the same version is there).
pub fn fetch_kernel() -> Result<KernelPackage, Failure> {
    let (source, release) = machine_debian_source().map_err(Failure::usage)?;
    let apt = PrivateApt::create(&peer_dir().join("apt"), &source, &release)?;
    eprintln!("xtask: apt-get update for arm64 in {} (the machine's {release} source)", apt.dir.display());
    apt.run("apt-get", &["-q", "update"])?;
    let listing = apt.output("apt-cache", &["search", "--names-only", &format!("^linux-image-{SERIES}\\.")])?;
    let names: Vec<&str> = listing.lines().filter_map(|line| line.split(" - ").next()).collect();
    let name = newest_kernel(&names).ok_or_else(|| {
        Failure::usage(format!(
            "no linux-image-{SERIES}.*{FLAVOUR_SUFFIX} in {release} or {release}-backports for arm64 \
             (apt's sources under {})",
            apt.dir.display()
        ))
    })?;
    let stanza = apt.output("apt-cache", &["show", "--no-all-versions", &name])?;
    let field = |key: &str| {
        stanza
            .lines()
            .find_map(|line| line.strip_prefix(key)?.strip_prefix(": ").map(str::to_string))
            .ok_or_else(|| Failure::usage(format!("apt-cache show {name} has no {key} field")))
    };
    let version = field("Version")?;
    let sha256 = field("SHA256")?;
    let linux_dir = peer_dir().join("linux");
    let root = linux_dir.join("root");
    let wanted = KernelPackage { name: name.clone(), version: version.clone(), sha256, root: root.clone() };
    if let Some(present) = unpacked_kernel()
        && present == wanted
        && present.image().is_file()
    {
        eprintln!("xtask: {name} {version} is already unpacked in {}", root.display());
        return Ok(present);
    }
    let downloads = linux_dir.join("debs");
    std::fs::create_dir_all(&downloads).map_err(|error| io_failure(&downloads, error))?;
    eprintln!("xtask: apt-get download {name}={version}");
    apt.run_in(&downloads, "apt-get", &["-q", "download", &format!("{name}={version}")])?;
    let deb = downloads.join(format!("{name}_{}_arm64.deb", version.replace(':', "%3a")));
    if !deb.is_file() {
        return Err(Failure::usage(format!("apt-get download left no {}", deb.display())));
    }
    // Unpack beside the old tree and rename: a run that stops half way leaves no mixed tree.
    let partial = linux_dir.join("root.partial");
    let _ = std::fs::remove_dir_all(&partial);
    eprintln!("xtask: dpkg-deb -x {} {}", deb.display(), root.display());
    let status = Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&partial).status();
    if !status.is_ok_and(|status| status.success()) {
        return Err(Failure::usage(format!("dpkg-deb -x {} failed", deb.display())));
    }
    std::fs::write(partial.join(RECORD_FILE), wanted.record()).map_err(|error| io_failure(&partial, error))?;
    let _ = std::fs::remove_dir_all(&root);
    std::fs::rename(&partial, &root).map_err(|error| io_failure(&root, error))?;
    // The .deb is not needed once unpacked (apt can fetch it again): 90 MB less under target/.
    let _ = std::fs::remove_file(&deb);
    if !wanted.image().is_file() {
        return Err(Failure::usage(format!("{name} has no {}", wanted.image().display())));
    }
    Ok(wanted)
}

/// The package unpacked by an earlier fetch, if any.
pub fn unpacked_kernel() -> Option<KernelPackage> {
    let root = peer_dir().join("linux/root");
    let text = std::fs::read_to_string(root.join(RECORD_FILE)).ok()?;
    KernelPackage::from_record(&text, root)
}

/// Of apt's package names, the generic arm64 kernel of [`SERIES`] with the highest patch level
/// (`linux-image-6.12.95+deb12-arm64-unsigned` over `...6.12.38+deb12...`).
pub fn newest_kernel(names: &[&str]) -> Option<String> {
    names
        .iter()
        .filter_map(|name| {
            let rest = name.strip_prefix("linux-image-")?.strip_prefix(SERIES)?.strip_prefix('.')?;
            let (patch, abi) = rest.split_once('+')?;
            // `+deb12-arm64-unsigned`, not `+deb12-cloud-arm64-unsigned` or `-rt-`.
            let flavour = abi.split_once('-')?.1;
            (format!("-{flavour}") == FLAVOUR_SUFFIX).then_some((patch.parse::<u32>().ok()?, *name))
        })
        .max()
        .map(|(_, name)| name.to_string())
}

/// An apt configuration of our own: `APT_CONFIG` names its file, which moves every directory
/// apt reads or writes under `dir`.
struct PrivateApt {
    dir: PathBuf,
    config: PathBuf,
}

impl PrivateApt {
    fn create(dir: &Path, source: &AptSource, release: &str) -> Result<Self, Failure> {
        for sub in [
            "etc/sources.list.d",
            "etc/apt.conf.d",
            "etc/preferences.d",
            "state/lists/partial",
            "cache/archives/partial",
        ] {
            std::fs::create_dir_all(dir.join(sub)).map_err(|error| io_failure(dir, error))?;
        }
        let status = dir.join("state/status");
        if !status.exists() {
            // dpkg's database of installed packages: empty, as nothing is installed for arm64.
            std::fs::write(&status, "").map_err(|error| io_failure(&status, error))?;
        }
        let sources = sources_text(source, release);
        let sources_path = dir.join("etc/sources.list.d/debian.sources");
        std::fs::write(&sources_path, sources).map_err(|error| io_failure(&sources_path, error))?;
        let config = dir.join("apt.conf");
        std::fs::write(&config, config_text(dir)).map_err(|error| io_failure(&config, error))?;
        Ok(Self { dir: dir.to_path_buf(), config })
    }

    fn command(&self, program: &str, args: &[&str]) -> Command {
        let mut command = Command::new(program);
        command.args(args).env("APT_CONFIG", &self.config);
        command
    }

    fn run(&self, program: &str, args: &[&str]) -> Result<(), Failure> {
        self.run_in(&self.dir, program, args)
    }

    fn run_in(&self, dir: &Path, program: &str, args: &[&str]) -> Result<(), Failure> {
        // apt's progress goes to stderr with xtask's own: stdout is the table and the facts.
        let status = self.command(program, args).current_dir(dir).stdout(std::io::stderr()).status();
        match status {
            Ok(status) if status.success() => Ok(()),
            Ok(status) => Err(Failure::usage(format!("{program} {} failed ({status})", args.join(" ")))),
            Err(error) => Err(Failure::usage(format!("cannot run {program}: {error}"))),
        }
    }

    fn output(&self, program: &str, args: &[&str]) -> Result<String, Failure> {
        let output = self
            .command(program, args)
            .output()
            .map_err(|error| Failure::usage(format!("cannot run {program}: {error}")))?;
        if !output.status.success() {
            return Err(Failure::usage(format!(
                "{program} {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&output.stderr).trim()
            )));
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }
}

/// The private sources: the machine's entry for `release`, and the same mirror and keyring for
/// `release-backports`, both for arm64 only.
fn sources_text(source: &AptSource, release: &str) -> String {
    let backports = format!("{release}-backports");
    [release, backports.as_str()]
        .iter()
        .map(|suite| deb822_entry(source, suite, &["main"], Some("arm64")))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The configuration file `APT_CONFIG` names. `Dir::Etc::Parts` is ours too, so that the
/// machine's `apt.conf.d` (extra index targets, proxies for other architectures) stays out;
/// its trusted keys (`Dir::Etc::TrustedParts`) stay in, for sources without `Signed-By`.
fn config_text(dir: &Path) -> String {
    let path = |sub: &str| dir.join(sub).display().to_string();
    format!(
        "APT::Architecture \"arm64\";\n\
         APT::Architectures {{ \"arm64\"; }};\n\
         Dir::State \"{state}\";\n\
         Dir::State::status \"{status}\";\n\
         Dir::Cache \"{cache}\";\n\
         Dir::Etc::SourceList \"/dev/null\";\n\
         Dir::Etc::SourceParts \"{sources}\";\n\
         Dir::Etc::Parts \"{parts}\";\n\
         Dir::Etc::Preferences \"/dev/null\";\n\
         Dir::Etc::PreferencesParts \"{preferences}\";\n\
         Acquire::Languages \"none\";\n\
         // The files live under target/, which apt's unprivileged `_apt` user cannot write:\n\
         // download as the user running xtask, as apt would after warning.\n\
         APT::Sandbox::User \"root\";\n",
        state = path("state"),
        status = path("state/status"),
        cache = path("cache"),
        sources = path("etc/sources.list.d"),
        parts = path("etc/apt.conf.d"),
        preferences = path("etc/preferences.d"),
    )
}

fn io_failure(path: &Path, error: std::io::Error) -> Failure {
    Failure::usage(format!("{}: {error}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newest_generic_kernel_of_the_series() {
        let names = [
            "linux-image-6.12.38+deb12-arm64-unsigned",
            "linux-image-6.12.95+deb12-cloud-arm64-unsigned",
            "linux-image-6.12.95+deb12-rt-arm64-unsigned",
            "linux-image-6.12.9+deb12-arm64-unsigned",
            "linux-image-6.12.95+deb12-arm64-unsigned",
            "linux-image-6.12.95+deb12-arm64-unsigned-dbg",
            "linux-image-6.1.0-30-arm64-unsigned",
        ];
        assert_eq!(newest_kernel(&names).as_deref(), Some("linux-image-6.12.95+deb12-arm64-unsigned"));
        assert_eq!(newest_kernel(&names[1..3]), None);
    }

    #[test]
    fn sources_follow_the_machines_mirror_for_arm64() {
        let source = AptSource {
            uri: "http://mirror.example.net/debian".into(),
            suites: vec!["bookworm".into()],
            components: vec!["main".into()],
            signed_by: Some("/usr/share/keyrings/debian-archive-keyring.gpg".into()),
        };
        let text = sources_text(&source, "bookworm");
        assert_eq!(text.matches("URIs: http://mirror.example.net/debian\n").count(), 2, "{text}");
        assert!(text.contains("Suites: bookworm-backports\n"));
        assert_eq!(text.matches("Architectures: arm64\n").count(), 2);
        let config = config_text(Path::new("/x/apt"));
        assert!(config.contains("APT::Architecture \"arm64\";"));
        assert!(config.contains("Dir::State \"/x/apt/state\";"));
        assert!(config.contains("Dir::Cache \"/x/apt/cache\";"));
    }

    #[test]
    fn package_record_round_trip_and_file_names() {
        let package = KernelPackage {
            name: "linux-image-6.12.95+deb12-arm64-unsigned".into(),
            version: "6.12.95-1~bpo12+1".into(),
            sha256: "ab".into(),
            root: PathBuf::from("/r"),
        };
        assert_eq!(KernelPackage::from_record(&package.record(), PathBuf::from("/r")), Some(package.clone()));
        assert_eq!(package.release(), "6.12.95+deb12-arm64");
        assert_eq!(package.image(), Path::new("/r/boot/vmlinuz-6.12.95+deb12-arm64"));
        assert_eq!(package.config(), Path::new("/r/boot/config-6.12.95+deb12-arm64"));
    }
}
