//! The kernel command line (`/chosen/bootargs`): what to run and how.
//!
//! `run=demo|test|panic|fault|hang` (the last three exercise the failure paths), `filter=SUBSTRING` (tests), `hz=N` (tick rate), `exit=semihosting|park`,
//! `expect-pauth=QARMA5|QARMA3|IMPDEF|none` (what xtask knows the CPU variant has).

#[derive(Clone, Copy, PartialEq, Eq, defmt::Format)]
pub enum Run {
    Demo,
    Test,
    /// Failure paths, for xtask to check that they end runs as they must.
    Panic,
    Fault,
    Hang,
}

pub struct CommandLine {
    pub run: Run,
    pub filter: &'static str,
    pub hz: u64,
    pub semihosting: bool,
    pub expect_pauth: Option<&'static str>,
}

impl CommandLine {
    pub fn parse(bootargs: &'static str, semihosting_by_default: bool) -> Self {
        let mut line = Self {
            run: Run::Demo,
            filter: "",
            hz: 100,
            semihosting: semihosting_by_default,
            expect_pauth: None,
        };
        for word in bootargs.split_whitespace() {
            let (key, value) = word.split_once('=').unwrap_or((word, ""));
            match (key, value) {
                ("run", "demo") => line.run = Run::Demo,
                ("run", "test") => line.run = Run::Test,
                ("run", "panic") => line.run = Run::Panic,
                ("run", "fault") => line.run = Run::Fault,
                ("run", "hang") => line.run = Run::Hang,
                ("filter", filter) => line.filter = filter,
                ("hz", hz) => match hz.parse::<u64>() {
                    Ok(hz) if (1..=10_000).contains(&hz) => line.hz = hz,
                    _ => defmt::warn!(
                        "cmdline: hz={=str} is not in 1..=10000, keeping {=u64}",
                        hz,
                        line.hz
                    ),
                },
                ("exit", "semihosting") => line.semihosting = true,
                ("exit", "park") => line.semihosting = false,
                ("expect-pauth", name) => line.expect_pauth = Some(name),
                _ => defmt::warn!("cmdline: ignoring unknown argument {=str}", word),
            }
        }
        line
    }
}
