//! muster: the operator's command line.
//!
//! Scriptable subcommands for every operation of the daemon: one line per item, `--json`
//! for JSON lines, and a one-line error with a non-zero exit status on failure.
//!
//! # Layout
//! - [`cli`]: the arguments (clap).
//! - [`commands`]: what each subcommand does.
//! - [`context`]: named contexts, several daemons kept by name: writing the file
//!   muster-sdk reads.
//! - [`output`]: how results are printed, as text or JSON lines.
//! - [`failure`]: how a failure ends: one line or one JSON object, exit status 1.
//! - [`work`]: `muster work`, any program as an agent.
//! - [`demo`]: `muster demo`, a live swarm to watch.
//! - [`bench`]: `muster bench`, the benchmark BENCHMARKS.md describes.
//! - [`console`]: `muster tui`, the operator's console.
//! - [`mcp`]: `muster mcp`, muster's tasks as tools for an MCP client.

pub mod bench;
pub mod cli;
pub mod commands;
pub mod console;
pub mod context;
pub mod demo;
pub mod failure;
pub mod mcp;
pub mod output;
pub mod work;

use std::fmt;

/// What `muster --version` prints: the crate's version and the git commit it was built
/// from (`unknown` outside a git checkout).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("MUSTER_GIT_COMMIT"),
    ")"
);

/// A claim as the CLI prints and takes it: the task id and the lease epoch, `ID.EPOCH`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimString {
    /// The task id.
    pub id: String,
    /// The lease epoch.
    pub epoch: u64,
}

impl std::str::FromStr for ClaimString {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || format!("invalid claim {s:?}: want ID.EPOCH as printed by `muster claim`");
        let (id, epoch) = s.rsplit_once('.').ok_or_else(bad)?;
        if id.is_empty() {
            return Err(bad());
        }
        let epoch = epoch.parse().map_err(|_| bad())?;
        Ok(ClaimString {
            id: id.to_owned(),
            epoch,
        })
    }
}

impl fmt::Display for ClaimString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.id, self.epoch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claim_strings_round_trip() {
        let c: ClaimString = "01JABC.3".parse().unwrap();
        assert_eq!(
            c,
            ClaimString {
                id: "01JABC".into(),
                epoch: 3
            }
        );
        assert_eq!(c.to_string(), "01JABC.3");
        assert!("01JABC".parse::<ClaimString>().is_err());
        assert!(".3".parse::<ClaimString>().is_err());
        assert!("01JABC.x".parse::<ClaimString>().is_err());
        assert!("01JABC.-1".parse::<ClaimString>().is_err());
    }
}
