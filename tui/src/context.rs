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

    #[test]
    fn a_context_keeps_a_token_files_path_and_resolution_uses_it_with_its_trust() {
        use muster_sdk::ConnectArgs;
        use std::path::PathBuf;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("contexts.toml");
        let prod = Context {
            addr: "prod.example:7420".into(),
            pin: Some("ab".repeat(32)),
            token_file: Some("/etc/muster/ops.token".into()),
            ..Context::default()
        };
        let mut c = Contexts::default();
        c.add("prod", prod.clone()).unwrap();
        save(&c, &path).unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            format!(
                "current = \"prod\"\n\n[contexts.prod]\naddr = \"prod.example:7420\"\n\
                 pin = \"{}\"\ntoken_file = \"/etc/muster/ops.token\"\n",
                "ab".repeat(32)
            )
        );
        assert_eq!(Contexts::load(&path).unwrap(), c);
        let file = |args: ConnectArgs| {
            let o = args.options_with(Some(&prod));
            (o.token, o.token_file)
        };
        let ops = Some(PathBuf::from("/etc/muster/ops.token"));
        // Nothing given: the context's token file.
        assert_eq!(file(ConnectArgs::default()), (None, ops.clone()));
        // Another address, still trusted by the context's pin: the same.
        let addr = ConnectArgs {
            addr: Some("10.0.0.9:7420".into()),
            ..ConnectArgs::default()
        };
        assert_eq!(file(addr), (None, ops));
        // A token or token file given wins.
        let given = ConnectArgs {
            token_file: Some("/home/me/t".into()),
            ..ConnectArgs::default()
        };
        assert_eq!(file(given), (None, Some("/home/me/t".into())));
        let token = ConnectArgs {
            token: Some("secret".into()),
            ..ConnectArgs::default()
        };
        assert_eq!(file(token), (Some("secret".into()), None));
        // Trust given: another daemon, never sent the context's token.
        let elsewhere = ConnectArgs {
            addr: Some("10.0.0.9:7420".into()),
            pin: Some("cd".repeat(32)),
            ..ConnectArgs::default()
        };
        assert_eq!(file(elsewhere), (None, None));
    }
}
