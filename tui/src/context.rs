//! Named contexts: several daemons kept by name in a small TOML file in the user's
//! configuration directory (`$XDG_CONFIG_HOME/muster/contexts.toml`, by default
//! `~/.config/muster/contexts.toml`; `~/Library/Application Support/muster/` on macOS).
//!
//! A context holds an address and how to trust the daemon (pin, CA file or data
//! directory). The one in use is `--context NAME`, else `MUSTER_CONTEXT`, else the file's
//! `current`. A connection option given as a flag or an environment variable
//! (`--addr`, `MUSTER_ADDR`, …) wins over the context's.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use serde::{Deserialize, Serialize};

/// The file's name inside the `muster` configuration directory.
const FILE_NAME: &str = "contexts.toml";

/// Most contexts kept, so the file stays small enough to read on every command.
pub const MAX_CONTEXTS: usize = 256;

/// One daemon: where it is and how to trust it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Context {
    /// HOST:PORT.
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

impl Contexts {
    /// Where the file is, or an error if the system names no configuration directory.
    pub fn path() -> anyhow::Result<PathBuf> {
        let dir = dirs::config_dir()
            .context("no configuration directory (set XDG_CONFIG_HOME or HOME)")?;
        Ok(dir.join("muster").join(FILE_NAME))
    }

    /// Reads the file; no file is no contexts.
    pub fn load(path: &Path) -> anyhow::Result<Contexts> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Contexts::default()),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        let contexts: Contexts =
            toml::from_str(&text).with_context(|| format!("reading {}", path.display()))?;
        if let Some(current) = &contexts.current
            && !contexts.contexts.contains_key(current)
        {
            bail!(
                "{}: current context {current:?} is not defined",
                path.display()
            );
        }
        Ok(contexts)
    }

    /// Writes the file whole: a new file beside it, then a rename, so a reader never
    /// sees half of it. Owner-only (it names what to trust).
    pub fn save(&self, path: &Path) -> anyhow::Result<()> {
        let dir = path
            .parent()
            .context("the contexts file has no directory")?;
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let text = toml::to_string(self).context("writing contexts")?;
        let mut file = tempfile::NamedTempFile::new_in(dir)
            .with_context(|| format!("creating a file in {}", dir.display()))?;
        std::io::Write::write_all(&mut file, text.as_bytes())?;
        file.as_file().sync_all()?;
        file.persist(path)
            .with_context(|| format!("writing {}", path.display()))?;
        Ok(())
    }

    /// Adds or replaces a context; the first one added becomes current.
    pub fn add(&mut self, name: &str, context: Context) -> anyhow::Result<()> {
        check_name(name)?;
        if !self.contexts.contains_key(name) && self.contexts.len() >= MAX_CONTEXTS {
            bail!("{MAX_CONTEXTS} contexts exist already; remove one first");
        }
        self.contexts.insert(name.to_owned(), context);
        if self.current.is_none() {
            self.current = Some(name.to_owned());
        }
        Ok(())
    }

    /// Makes a context current.
    pub fn use_context(&mut self, name: &str) -> anyhow::Result<()> {
        self.get(name)?;
        self.current = Some(name.to_owned());
        Ok(())
    }

    /// Removes a context (and makes none current if it was).
    pub fn remove(&mut self, name: &str) -> anyhow::Result<()> {
        self.get(name)?;
        self.contexts.remove(name);
        if self.current.as_deref() == Some(name) {
            self.current = None;
        }
        Ok(())
    }

    /// A context by name.
    pub fn get(&self, name: &str) -> anyhow::Result<&Context> {
        self.contexts
            .get(name)
            .with_context(|| format!("no context {name:?} (see `muster context list`)"))
    }

    /// The context in use: the named one, else the current one, else none.
    pub fn selected(&self, named: Option<&str>) -> anyhow::Result<Option<&Context>> {
        match named.or(self.current.as_deref()) {
            Some(name) => self.get(name).map(Some),
            None => Ok(None),
        }
    }
}

/// A context's name: `[A-Za-z0-9._-]{1,64}`.
fn check_name(name: &str) -> anyhow::Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if !ok {
        bail!("invalid context name {name:?}: want [A-Za-z0-9._-]{{1,64}}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{Context, Contexts};

    fn ctx(addr: &str) -> Context {
        Context {
            addr: addr.into(),
            pin: Some("ab".repeat(32)),
            ..Context::default()
        }
    }

    #[test]
    fn contexts_round_trip_through_the_file_and_the_first_is_current() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("muster").join("contexts.toml");
        assert_eq!(Contexts::load(&path).unwrap(), Contexts::default());
        let mut c = Contexts::default();
        c.add("prod", ctx("prod.example:7420")).unwrap();
        c.add("staging", ctx("staging.example:7420")).unwrap();
        assert_eq!(c.current.as_deref(), Some("prod"));
        c.save(&path).unwrap();
        let back = Contexts::load(&path).unwrap();
        assert_eq!(back, c);
        assert_eq!(
            back.selected(Some("staging"))
                .unwrap()
                .map(|c| c.addr.as_str()),
            Some("staging.example:7420")
        );
        assert_eq!(
            back.selected(None).unwrap().map(|c| c.addr.as_str()),
            Some("prod.example:7420")
        );
        let mut back = back;
        back.remove("prod").unwrap();
        assert_eq!(back.current, None);
        assert_eq!(back.selected(None).unwrap(), None);
        assert!(back.use_context("prod").is_err());
        assert!(back.add("bad name", ctx("x:1")).is_err());
    }

    #[test]
    fn a_broken_file_is_an_error_not_an_empty_list() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("contexts.toml");
        std::fs::write(&path, "current = \"gone\"\n").unwrap();
        let e = Contexts::load(&path).unwrap_err();
        assert!(
            format!("{e:#}").contains("current context \"gone\" is not defined"),
            "{e:#}"
        );
        std::fs::write(&path, "[contexts.a]\naddr = 1\n").unwrap();
        assert!(Contexts::load(&path).is_err());
    }
}
