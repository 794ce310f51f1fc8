//! Host set-up: QEMU 10 through the machine's own package manager, and the Pi 4 boot files.
//!
//! On Debian and its derivatives, running as root, xtask installs QEMU itself (after saying
//! what it will run); anyone else gets the one command to run. No mirror is named here: on
//! Debian 12, whose QEMU (7.2) is too old, the `bookworm-backports` entry xtask adds takes the
//! URI and keyring of the entry that already serves the machine's `bookworm` suite, read from
//! the machine's own apt sources (deb822 `*.sources` and one-line `*.list` files).

use crate::Failure;
use crate::apt::{Host, deb822_entry, read_apt_sources, suite_source};
use std::process::{Command, Stdio};

/// `raspi4b` and the `pauth-qarma3`/`pauth-qarma5` CPU options need QEMU 10.
pub const MIN_QEMU_MAJOR: u32 = 10;
/// The Debian release whose own QEMU is too old: QEMU comes from its backports suite.
const BACKPORTS_RELEASE: &str = "bookworm";
/// Where xtask writes the backports entry (its name says who added it).
const BACKPORTS_ENTRY_PATH: &str = "/etc/apt/sources.list.d/tracelab-bookworm-backports.sources";

#[derive(clap::Args)]
pub struct SetupArgs {
    /// Print what would be installed and fetched (the commands, the apt sources entry), and do
    /// nothing; the plan is shown even when QEMU is already there.
    #[arg(long)]
    pub dry_run: bool,
    /// Do not fetch the Raspberry Pi 4 boot files (only `--board rpi4` needs them).
    #[arg(long)]
    pub no_boot_files: bool,
    /// With --dry-run: plan from the apt sources under this directory (laid out like
    /// /etc/apt) instead of the machine's, as if QEMU were missing.
    #[arg(long, requires = "dry_run")]
    pub apt_dir: Option<std::path::PathBuf>,
}

/// `cargo xtask setup`: QEMU, then the Pi 4 boot files.
pub fn run(args: &SetupArgs) -> Result<u8, Failure> {
    let installed = qemu_version_major();
    match &installed {
        Some((major, version)) if *major >= MIN_QEMU_MAJOR => {
            eprintln!("xtask: qemu-system-aarch64 {version} is installed (>= {MIN_QEMU_MAJOR} needed)")
        }
        Some((_, version)) => eprintln!("xtask: qemu-system-aarch64 {version} is too old (>= {MIN_QEMU_MAJOR} needed)"),
        None => eprintln!("xtask: qemu-system-aarch64 is not installed"),
    }
    let mut host = Host::probe();
    if let Some(apt_dir) = &args.apt_dir {
        host.apt_sources = read_apt_sources(apt_dir);
    }
    if args.dry_run {
        match qemu_plan(&host) {
            Ok(plan) => {
                eprintln!("xtask: to install QEMU, {} would run:\n{}", plan.who(), plan.command_line());
                if let Some(entry) = &plan.sources_entry {
                    eprintln!("xtask: the apt sources entry it writes to {BACKPORTS_ENTRY_PATH}:\n{entry}");
                }
            }
            Err(hint) => eprintln!("xtask: {hint}"),
        }
        if !args.no_boot_files {
            eprintln!(
                "xtask: then it would fetch the Raspberry Pi 4 boot files into {}",
                crate::bootfiles::cache_dir().display()
            );
        }
        return Ok(0);
    }
    ensure_qemu()?;
    if !args.no_boot_files {
        let files = crate::bootfiles::get(&crate::bootfiles::BootFileArgs::default())?;
        eprintln!("xtask: Raspberry Pi 4 boot files ready: {}", files.source);
    }
    eprintln!("xtask: set-up complete");
    Ok(0)
}

/// The installed QEMU's version (e.g. `10.0.2`), for result files.
pub fn qemu_version() -> String {
    qemu_version_major().map(|(_, version)| version).unwrap_or_else(|| "unknown".into())
}

fn qemu_version_major() -> Option<(u32, String)> {
    let output = Command::new("qemu-system-aarch64").arg("--version").output().ok()?;
    let text = String::from_utf8_lossy(&output.stdout);
    let version = text.split_whitespace().skip_while(|word| *word != "version").nth(1)?.to_string();
    let major = version.split('.').next()?.parse().ok()?;
    Some((major, version))
}

/// Makes sure `qemu-system-aarch64` 10 or newer is there: installs it through apt when running
/// as root (saying first what it runs), else fails with the one command to run.
pub fn ensure_qemu() -> Result<(), Failure> {
    static CHECKED: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    if CHECKED.get().is_some() {
        return Ok(());
    }
    if matches!(qemu_version_major(), Some((major, _)) if major >= MIN_QEMU_MAJOR) {
        let _ = CHECKED.set(());
        return Ok(());
    }
    let missing = format!("qemu-system-aarch64 {MIN_QEMU_MAJOR} or newer is missing");
    let plan = qemu_plan(&Host::probe()).map_err(|hint| Failure::usage(format!("{missing}; {hint}")))?;
    if !plan.automatic {
        return Err(Failure::usage(format!("{missing}; install it with: {}", plan.command_line())));
    }
    eprintln!("xtask: {missing}; installing it as root with: {}", plan.command_line());
    let status = Command::new("sh")
        .args(["-c", &plan.command])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdout(Stdio::null())
        .status()
        .map_err(|error| Failure::usage(format!("cannot run sh: {error}")))?;
    match qemu_version_major() {
        Some((major, version)) if status.success() && major >= MIN_QEMU_MAJOR => {
            eprintln!("xtask: installed qemu-system-aarch64 {version}");
            let _ = CHECKED.set(());
            Ok(())
        }
        Some((_, version)) if status.success() => Err(Failure::usage(format!(
            "the package manager installed QEMU {version}, older than {MIN_QEMU_MAJOR}: install QEMU \
             {MIN_QEMU_MAJOR} from your distribution's backports or from source"
        ))),
        _ => Err(Failure::usage(format!("installing QEMU failed; the command was: {}", plan.command))),
    }
}

/// An installation: the shell command, run as root by xtask (`automatic`) or shown to the user.
#[derive(Debug)]
pub struct InstallPlan {
    pub command: String,
    /// The apt sources entry the command writes, if any (shown in a dry run).
    pub sources_entry: Option<String>,
    /// Whether it needs root (shown with `sudo` to others).
    pub needs_root: bool,
    /// Root with apt: xtask runs it itself.
    pub automatic: bool,
}

impl InstallPlan {
    /// The command as the user should type it: through `sudo sh -c` when it needs root and
    /// xtask is not root (a redirect into /etc needs the root shell, not just root commands).
    pub fn command_line(&self) -> String {
        if self.needs_root && !self.automatic {
            format!("sudo sh -c {}", shell_quote(&self.command))
        } else {
            self.command.clone()
        }
    }

    fn who(&self) -> &'static str {
        if self.automatic { "xtask (as root)" } else { "you" }
    }
}

/// How to install QEMU 10 on `host`, or a one-line hint where xtask knows no way.
pub fn qemu_plan(host: &Host) -> Result<InstallPlan, String> {
    let debian_like = host.has_apt || host.is("debian") || host.is("ubuntu");
    if !debian_like {
        return Err(foreign_hint(host));
    }
    let automatic = host.is_root && host.has_apt;
    if host.is("debian") && host.codename == BACKPORTS_RELEASE {
        let backports = format!("{BACKPORTS_RELEASE}-backports");
        let install = format!("apt-get update && apt-get install -y -t {backports} qemu-system-arm");
        // An entry for the backports suite is there already (added by hand or by an earlier run).
        if host.apt_sources.iter().any(|source| source.suites.contains(&backports)) {
            return Ok(InstallPlan { command: install, sources_entry: None, needs_root: true, automatic });
        }
        let source = suite_source(&host.apt_sources, BACKPORTS_RELEASE).ok_or_else(|| {
            format!(
                "no apt source serves Debian {BACKPORTS_RELEASE}, so xtask cannot name a mirror for \
                 {backports}: add {backports} (component main) from your mirror, then run: {install}"
            )
        })?;
        let entry = deb822_entry(source, &backports, &["main"], None);
        let command = format!("printf {} > {BACKPORTS_ENTRY_PATH} && {install}", shell_quote(&printf_format(&entry)));
        return Ok(InstallPlan { command, sources_entry: Some(entry), needs_root: true, automatic });
    }
    Ok(InstallPlan {
        command: "apt-get update && apt-get install -y qemu-system-arm".into(),
        sources_entry: None,
        needs_root: true,
        automatic,
    })
}

/// One line for a host without apt: its own package manager's command.
fn foreign_hint(host: &Host) -> String {
    let command = if host.is("fedora") || host.is("rhel") || host.is("centos") {
        "sudo dnf install qemu-system-aarch64"
    } else if host.is("arch") {
        "sudo pacman -S --needed qemu-system-aarch64"
    } else if host.is("opensuse") || host.is("suse") {
        "sudo zypper install qemu-arm"
    } else if host.is("alpine") {
        "sudo apk add qemu-system-aarch64"
    } else if host.is("macos") {
        "brew install qemu"
    } else {
        return format!(
            "install QEMU {MIN_QEMU_MAJOR} or newer (the program qemu-system-aarch64) with your package manager"
        );
    };
    format!("install QEMU {MIN_QEMU_MAJOR} or newer with: {command}")
}

/// `text` as a printf format: `%` and `\` escaped, newlines as `\n`.
fn printf_format(text: &str) -> String {
    text.replace('\\', "\\\\").replace('%', "%%").replace('\n', "\\n")
}

/// `text` as one shell word.
fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', "'\\''"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apt::{AptSource, parse_one_line_sources};

    const KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";

    /// A scratch apt configuration directory, removed when dropped.
    struct AptDir(std::path::PathBuf);

    impl AptDir {
        fn new(name: &str, files: &[(&str, &str)]) -> Self {
            let dir = std::env::temp_dir().join(format!("tracelab-setup-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(dir.join("sources.list.d")).unwrap();
            for (path, text) in files {
                std::fs::write(dir.join(path), text).unwrap();
            }
            Self(dir)
        }
    }

    impl Drop for AptDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn bookworm_host(apt_sources: Vec<AptSource>, is_root: bool) -> Host {
        Host { os_ids: vec!["debian".into()], codename: "bookworm".into(), is_root, has_apt: true, apt_sources }
    }

    /// The promise that no mirror is written in the code: the backports entry uses the mirror
    /// the machine's sources name for its suite, with that entry's keyring.
    #[test]
    fn backports_entry_uses_the_machines_own_mirror() {
        let apt = AptDir::new(
            "custom-mirror",
            &[
                ("sources.list", "deb http://security.example.net/debian-security bookworm-security main\n"),
                (
                    "sources.list.d/debian.sources",
                    &format!(
                        "Types: deb\nURIs: http://mirror.example.net/debian\nSuites: bookworm bookworm-updates\n\
                         Components: main\nSigned-By: {KEYRING}\n"
                    ),
                ),
                ("sources.list.d/other.list.disabled", "deb http://wrong.example.net/debian bookworm main\n"),
            ],
        );
        let host = bookworm_host(read_apt_sources(&apt.0), true);
        assert_eq!(host.apt_sources.len(), 2);
        let plan = qemu_plan(&host).unwrap();
        assert!(plan.automatic);
        let entry = plan.sources_entry.as_deref().unwrap();
        assert_eq!(
            entry,
            format!(
                "Types: deb\nURIs: http://mirror.example.net/debian\nSuites: bookworm-backports\nComponents: main\n\
                 Signed-By: {KEYRING}\n"
            )
        );
        assert!(plan.command.contains("URIs: http://mirror.example.net/debian\\n"), "{}", plan.command);
        assert!(plan.command.ends_with("apt-get install -y -t bookworm-backports qemu-system-arm"));
        // The printf command really writes the entry.
        let written = apt.0.join("written.sources");
        let printf = plan.command.split(" > ").next().unwrap();
        let status = Command::new("sh").args(["-c", &format!("{printf} > {}", written.display())]).status().unwrap();
        assert!(status.success());
        assert_eq!(std::fs::read_to_string(&written).unwrap(), entry);
    }

    #[test]
    fn one_line_mirror_and_existing_backports() {
        let sources = parse_one_line_sources(&format!(
            "deb [signed-by={KEYRING}] https://mirror.example.com/debian/ bookworm main contrib\n"
        ));
        let plan = qemu_plan(&bookworm_host(sources.clone(), true)).unwrap();
        assert!(plan.sources_entry.unwrap().contains("URIs: https://mirror.example.com/debian/\n"));
        let mut with_backports = sources;
        with_backports
            .extend(parse_one_line_sources("deb https://mirror.example.com/debian bookworm-backports main\n"));
        let plan = qemu_plan(&bookworm_host(with_backports, true)).unwrap();
        assert_eq!(plan.sources_entry, None);
        assert_eq!(plan.command, "apt-get update && apt-get install -y -t bookworm-backports qemu-system-arm");
    }

    #[test]
    fn non_root_gets_one_sudo_line_and_no_source_gets_a_hint() {
        let sources = parse_one_line_sources("deb http://mirror.example.com/debian bookworm main\n");
        let plan = qemu_plan(&bookworm_host(sources, false)).unwrap();
        assert!(!plan.automatic);
        let line = plan.command_line();
        assert!(line.starts_with("sudo sh -c 'printf "), "{line}");
        assert_eq!(line.lines().count(), 1);
        let hint = qemu_plan(&bookworm_host(Vec::new(), true)).unwrap_err();
        assert!(hint.contains("no apt source serves Debian bookworm"), "{hint}");
    }

    #[test]
    fn other_systems_get_their_package_managers_command() {
        let host = |id: &str| Host {
            os_ids: vec![id.into()],
            codename: String::new(),
            is_root: false,
            has_apt: false,
            apt_sources: Vec::new(),
        };
        assert_eq!(
            qemu_plan(&host("fedora")).unwrap_err(),
            "install QEMU 10 or newer with: sudo dnf install qemu-system-aarch64"
        );
        assert!(qemu_plan(&host("arch")).unwrap_err().contains("pacman"));
        assert!(qemu_plan(&host("plan9")).unwrap_err().contains("your package manager"));
        // A newer Debian has QEMU 10 in its own suite.
        let trixie = Host { os_ids: vec!["debian".into()], codename: "trixie".into(), ..host("debian") };
        assert_eq!(qemu_plan(&trixie).unwrap().command, "apt-get update && apt-get install -y qemu-system-arm");
    }
}
