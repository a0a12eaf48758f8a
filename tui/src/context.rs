//! Named contexts: the file muster-sdk reads (`muster_sdk::context`: where it is, its
//! format and rules, which context is in use), and how `muster context add|use|remove`
//! writes it back.

use std::path::Path;

use anyhow::Context as _;
pub use muster_sdk::context::{Context, Contexts};

/// Writes the file whole: a new file beside it, then a rename, so a reader never sees
/// half of it. Owner-only (it names what to trust).
pub fn save(contexts: &Contexts, path: &Path) -> anyhow::Result<()> {
    let dir = path
        .parent()
        .context("the contexts file has no directory")?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let text = toml::to_string(contexts).context("writing contexts")?;
    let mut file = tempfile::NamedTempFile::new_in(dir)
        .with_context(|| format!("creating a file in {}", dir.display()))?;
    std::io::Write::write_all(&mut file, text.as_bytes())?;
    file.as_file().sync_all()?;
    file.persist(path)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::{Context, Contexts, save};

    #[test]
    fn saved_contexts_read_back_the_same_and_only_the_owner_reads_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("muster").join("contexts.toml");
        let mut c = Contexts::default();
        c.add(
            "prod",
            Context {
                addr: "prod.example:7420".into(),
                pin: Some("ab".repeat(32)),
                ..Context::default()
            },
        )
        .unwrap();
        save(&c, &path).unwrap();
        assert_eq!(Contexts::load(&path).unwrap(), c);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
