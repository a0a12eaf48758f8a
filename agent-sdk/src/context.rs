//! Named contexts, and how a program settles where the daemon is: the one resolution
//! of connection options that the CLI and the Python SDK share.
//!
//! A context is a daemon kept by name in a small TOML file in the user's configuration
//! directory (`$XDG_CONFIG_HOME/muster/contexts.toml`, by default
//! `~/.config/muster/contexts.toml`; `~/Library/Application Support/muster/` on macOS):
//! an address, how to trust the daemon (pin, CA file or data directory) and, if asked,
//! the path of a token file (never a token: the file stays the only copy). The one in
//! use is the one named (`--context NAME`, else `MUSTER_CONTEXT`), else the file's
//! `current`. A connection option given as a flag, an argument or an environment
//! variable (`--addr`, `MUSTER_ADDR`, …) wins over the context's ([`ConnectArgs`]).
//!
//! This module reads the file and edits it in memory; writing it back is the CLI's
//! (`muster context add|use|remove`), the only program that changes it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::{ConnectOptions, Error, Trust};

/// The file's name inside the `muster` configuration directory.
pub const FILE_NAME: &str = "contexts.toml";

/// Most contexts kept, so the file stays small enough to read on every command.
pub const MAX_CONTEXTS: usize = 256;

/// One daemon: where it is and how to trust it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Context {
    /// HOST:PORT, or a cluster's nodes HOST:PORT,HOST:PORT,... (see
    /// [`crate::connect::addresses`]).
    pub addr: String,
    /// SHA-256 fingerprint of the daemon's certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pin: Option<String>,
    /// A PEM CA file (or the daemon's certificate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<PathBuf>,
    /// The daemon's data directory, where its certificate is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<PathBuf>,
    /// A file holding the token to present (its path: a context never holds a token).
    /// Used like `--token-file` when the daemon is trusted by this context's trust.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
}

/// The whole file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Contexts {
    /// The context used when none is named.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current: Option<String>,
    /// Every context by name.
    #[serde(default)]
    pub contexts: BTreeMap<String, Context>,
}

/// Connection options as a program was given them (the CLI's flags, the Python SDK's
/// arguments), each `None` when not given; [`ConnectArgs::resolve`] fills in the rest
/// from the context in use and the defaults.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnectArgs {
    /// The context to use instead of the current one.
    pub context: Option<String>,
    /// HOST:PORT, or a cluster's nodes HOST:PORT,HOST:PORT,....
    pub addr: Option<String>,
    /// The daemon's data directory, where its certificate (and local token) is.
    pub data: Option<PathBuf>,
    /// A PEM CA file (or the daemon's certificate) to trust.
    pub ca: Option<PathBuf>,
    /// The SHA-256 fingerprint of the daemon's certificate to trust.
    pub pin: Option<String>,
    /// A token.
    pub token: Option<String>,
    /// A file holding the token.
    pub token_file: Option<PathBuf>,
    /// The name to verify in the certificate; the host of the address if absent.
    pub server_name: Option<String>,
}

impl Contexts {
    /// Where the file is, or an error if the system names no configuration directory.
    pub fn path() -> Result<PathBuf, Error> {
        let dir = dirs::config_dir().ok_or_else(|| {
            Error::Config("no configuration directory (set XDG_CONFIG_HOME or HOME)".into())
        })?;
        Ok(dir.join("muster").join(FILE_NAME))
    }

    /// Reads the file; no file is no contexts.
    pub fn load(path: &Path) -> Result<Contexts, Error> {
        let reading =
            |e: &dyn std::fmt::Display| Error::Config(format!("reading {}: {e}", path.display()));
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Contexts::default()),
            Err(e) => return Err(reading(&e)),
        };
        let contexts: Contexts = toml::from_str(&text).map_err(|e| reading(&e))?;
        if let Some(current) = &contexts.current
            && !contexts.contexts.contains_key(current)
        {
            return Err(Error::Config(format!(
                "{}: current context {current:?} is not defined",
                path.display()
            )));
        }
        Ok(contexts)
    }

    /// Adds or replaces a context; the first one added becomes current.
    pub fn add(&mut self, name: &str, context: Context) -> Result<(), Error> {
        check_name(name)?;
        if !self.contexts.contains_key(name) && self.contexts.len() >= MAX_CONTEXTS {
            return Err(Error::Config(format!(
                "{MAX_CONTEXTS} contexts exist already; remove one first"
            )));
        }
        self.contexts.insert(name.to_owned(), context);
        if self.current.is_none() {
            self.current = Some(name.to_owned());
        }
        Ok(())
    }

    /// Makes a context current.
    pub fn use_context(&mut self, name: &str) -> Result<(), Error> {
        self.get(name)?;
        self.current = Some(name.to_owned());
        Ok(())
    }

    /// Removes a context (and makes none current if it was).
    pub fn remove(&mut self, name: &str) -> Result<(), Error> {
        self.get(name)?;
        self.contexts.remove(name);
        if self.current.as_deref() == Some(name) {
            self.current = None;
        }
        Ok(())
    }

    /// A context by name.
    pub fn get(&self, name: &str) -> Result<&Context, Error> {
        self.contexts.get(name).ok_or_else(|| {
            Error::Config(format!("no context {name:?} (see `muster context list`)"))
        })
    }

    /// The context in use: the named one, else the current one, else none.
    pub fn selected(&self, named: Option<&str>) -> Result<Option<&Context>, Error> {
        match named.or(self.current.as_deref()) {
            Some(name) => self.get(name).map(Some),
            None => Ok(None),
        }
    }
}

impl ConnectArgs {
    /// The `MUSTER_*` variables the CLI reads: `MUSTER_CONTEXT`, `MUSTER_ADDR`,
    /// `MUSTER_DATA`, `MUSTER_CA`, `MUSTER_PIN`, `MUSTER_TOKEN` and `MUSTER_TOKEN_FILE`
    /// (an empty one counts as unset).
    pub fn from_env() -> ConnectArgs {
        let var = |name| std::env::var(name).ok().filter(|v: &String| !v.is_empty());
        ConnectArgs {
            context: var("MUSTER_CONTEXT"),
            addr: var("MUSTER_ADDR"),
            data: var("MUSTER_DATA").map(PathBuf::from),
            ca: var("MUSTER_CA").map(PathBuf::from),
            pin: var("MUSTER_PIN"),
            token: var("MUSTER_TOKEN"),
            token_file: var("MUSTER_TOKEN_FILE").map(PathBuf::from),
            server_name: None,
        }
    }

    /// These arguments, each one not given taken from `fallback`: a program's own
    /// arguments over the environment, as a flag wins over its variable in the CLI.
    pub fn or(self, fallback: ConnectArgs) -> ConnectArgs {
        ConnectArgs {
            context: self.context.or(fallback.context),
            addr: self.addr.or(fallback.addr),
            data: self.data.or(fallback.data),
            ca: self.ca.or(fallback.ca),
            pin: self.pin.or(fallback.pin),
            token: self.token.or(fallback.token),
            token_file: self.token_file.or(fallback.token_file),
            server_name: self.server_name.or(fallback.server_name),
        }
    }

    /// Where the daemon is and how to trust it: these options, else the context in use
    /// (read from [`Contexts::path`]), else the local daemon. Without a configuration
    /// directory (no HOME) there are no contexts, unless one is named.
    pub fn resolve(&self) -> Result<ConnectOptions, Error> {
        let contexts = match Contexts::path() {
            Ok(path) => Contexts::load(&path)?,
            Err(e) if self.context.is_some() => return Err(e),
            Err(_) => Contexts::default(),
        };
        self.resolve_in(&contexts)
    }

    /// [`ConnectArgs::resolve`] against contexts already read.
    pub fn resolve_in(&self, contexts: &Contexts) -> Result<ConnectOptions, Error> {
        let context = contexts.selected(self.context.as_deref())?;
        Ok(self.options_with(context))
    }

    /// The options with `context` filling in what was not given. Trust is taken whole,
    /// from these options if any of `pin`, `ca` and `data` was given, else from the
    /// context: a pin beats a CA file, which beats a data directory. The context's token
    /// file goes with its trust (it is only sent to a daemon the context trusts), and a
    /// token or token file given wins over it.
    pub fn options_with(&self, context: Option<&Context>) -> ConnectOptions {
        let given_trust = self.pin.is_some() || self.ca.is_some() || self.data.is_some();
        let (pin, ca, data, token_file) = match context {
            Some(c) if !given_trust => (
                c.pin.clone(),
                c.ca.clone(),
                c.data.clone(),
                c.token_file.clone(),
            ),
            _ => (self.pin.clone(), self.ca.clone(), self.data.clone(), None),
        };
        let token_file = match (&self.token, &self.token_file) {
            (None, None) => token_file,
            (_, given) => given.clone(),
        };
        let trust = match (pin, ca) {
            (Some(pin), _) => Trust::Pin(pin),
            (None, Some(ca)) => Trust::CaFile(ca),
            (None, None) => Trust::DataDir(data.unwrap_or_else(crate::connect::default_data_dir)),
        };
        let addr = match (&self.addr, context) {
            (Some(addr), _) => addr.clone(),
            (None, Some(c)) => c.addr.clone(),
            (None, None) => format!("127.0.0.1:{}", muster_protocol::DEFAULT_PORT),
        };
        ConnectOptions {
            addr,
            trust,
            token: self.token.clone(),
            token_file,
            server_name: self.server_name.clone(),
            bind: None,
        }
    }
}

/// A context's name: `[A-Za-z0-9._-]{1,64}`.
fn check_name(name: &str) -> Result<(), Error> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if !ok {
        return Err(Error::Config(format!(
            "invalid context name {name:?}: want [A-Za-z0-9._-]{{1,64}}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
