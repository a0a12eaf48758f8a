//! The data directory is private to the daemon's user, and so is the daemon's own token.
//!
//! `musterd` sets its umask to 0077 before anything is created, so the store's journal
//! and tables, the certificate, the key and the local token are 0600 and every
//! directory 0700 whatever the user's umask. A data directory left wider by an older
//! version or by hand is made private at start, with a warning naming what was wider.
//!
//! With no tokens configured and without `--open`, the daemon is *local-only*: it
//! serves only whoever presents the admin token it keeps in [`LOCAL_TOKEN_FILE`], which
//! only its own user can read; local clients read it by themselves.

use std::fs::Permissions;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::Context;
use tracing::warn;

use crate::auth::LOCAL_TOKEN_FILE;

/// The umask the daemon runs with: nothing it creates is readable by group or others.
pub const UMASK: u32 = 0o077;

/// Mode of the data directory and of every directory in it.
pub const DIR_MODE: u32 = 0o700;

/// Mode of every file in the data directory.
pub const FILE_MODE: u32 = 0o600;

/// Most entries looked at when checking the data directory's modes at start: the
/// store holds a few dozen files; past this many the rest is left as it is (with a
/// warning), behind the directory's own 0700.
const MAX_CHECKED_ENTRIES: usize = 100_000;

/// Random bytes in a generated token (hex-encoded, so 64 characters): 256 bits.
pub const TOKEN_BYTES: usize = 32;

/// Sets the process's umask to [`UMASK`]; call before anything is created.
pub fn restrict_umask() {
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(UMASK));
}

/// Creates the data directory (0700) or makes an existing one private: the directory
/// and everything in it lose group and other access, with a warning for each kind. A
/// directory or file in it owned by another user is refused: that user could have
/// planted a token or a store.
pub fn prepare(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("creating data directory {}", dir.display()))?;
    let me = nix::unistd::geteuid().as_raw();
    let mut wider = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    let mut seen = 0;
    'walk: while let Some(path) = stack.pop() {
        let meta = std::fs::symlink_metadata(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        if meta.file_type().is_symlink() {
            continue;
        }
        if meta.uid() != me {
            // Another user could have planted anything here (a local token that makes
            // them admin, say): trust nothing of it.
            anyhow::bail!(
                "{} is owned by uid {}, not by this daemon's user (uid {me}): refusing to use a data directory another user controls (chown -R it to this user, or choose another --data)",
                path.display(),
                meta.uid()
            );
        }
        let want = if meta.is_dir() { DIR_MODE } else { FILE_MODE };
        let mode = meta.permissions().mode() & 0o777;
        if mode & !want != 0 {
            std::fs::set_permissions(&path, Permissions::from_mode(mode & want))
                .with_context(|| format!("making {} private", path.display()))?;
            wider.push((path.clone(), mode));
        }
        if meta.is_dir() {
            for entry in
                std::fs::read_dir(&path).with_context(|| format!("reading {}", path.display()))?
            {
                seen += 1;
                if seen > MAX_CHECKED_ENTRIES {
                    // The directory itself was narrowed first: nobody else can reach
                    // what is left unchecked.
                    warn!(
                        data = %dir.display(),
                        "the data directory holds more than {MAX_CHECKED_ENTRIES} entries: the modes of the rest were not checked"
                    );
                    break 'walk;
                }
                stack.push(entry.context("reading the data directory")?.path());
            }
        }
    }
    if let Some((first, mode)) = wider.first() {
        warn!(
            data = %dir.display(),
            count = wider.len(),
            first = %first.display(),
            mode = format!("{mode:o}"),
            "the data directory or files in it were readable by other users: made private (0700 directories, 0600 files)"
        );
    }
    Ok(())
}

/// The data directory's local token: read if present, else generated and written
/// (0600, created exclusively). `None` when the daemon does not run local-only (tokens
/// configured, or `--open`): [`remove_local_token`] then removes a stale one once the
/// daemon has started, so that clients do not present a token nobody accepts.
pub fn local_token(dir: &Path, local_only: bool) -> anyhow::Result<Option<String>> {
    let path = dir.join(LOCAL_TOKEN_FILE);
    if !local_only {
        return Ok(None);
    }
    match std::fs::read_to_string(&path) {
        Ok(text) if valid_token(text.trim()) => return Ok(Some(text.trim().to_owned())),
        Ok(_) => {
            warn!(path = %path.display(), "the local token file is not a token: writing a new one");
            std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    }
    let token = new_token()?;
    write_private(&path, &format!("{token}\n"))?;
    Ok(Some(token))
}

/// Removes the data directory's local token file, if there is one.
pub fn remove_local_token(dir: &Path) -> anyhow::Result<()> {
    let path = dir.join(LOCAL_TOKEN_FILE);
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("removing {}", path.display())),
    }
}

/// A token read from a file (surrounding whitespace ignored): one that others can
/// write is refused, as is an empty one.
pub fn read_token_file(path: &Path) -> anyhow::Result<String> {
    let meta = std::fs::metadata(path)
        .with_context(|| format!("reading token file {}", path.display()))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o022 != 0 {
        anyhow::bail!(
            "token file {} is writable by other users (mode {mode:o}): chmod go-w it",
            path.display()
        );
    }
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading token file {}", path.display()))?;
    let token = text.trim();
    if token.is_empty() {
        anyhow::bail!("token file {} is empty", path.display());
    }
    Ok(token.to_owned())
}

/// A fresh random token: [`TOKEN_BYTES`] bytes from the system's generator, hex.
pub fn new_token() -> anyhow::Result<String> {
    let mut bytes = [0u8; TOKEN_BYTES];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
        .map_err(|_| anyhow::anyhow!("the system's random generator failed"))?;
    Ok(hex::encode(bytes))
}

fn valid_token(text: &str) -> bool {
    text.len() == 2 * TOKEN_BYTES && text.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Writes a new file readable by its owner only, never through an existing file or link.
fn write_private(path: &PathBuf, text: &str) -> anyhow::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(FILE_MODE)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    file.write_all(text.as_bytes())
        .and_then(|()| file.sync_all())
        .with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn a_wide_data_directory_is_made_private() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("data");
        std::fs::create_dir_all(dir.join("store")).unwrap();
        std::fs::write(dir.join("store/journal"), "iban").unwrap();
        std::fs::set_permissions(&dir, Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(dir.join("store"), Permissions::from_mode(0o775)).unwrap();
        std::fs::set_permissions(dir.join("store/journal"), Permissions::from_mode(0o644)).unwrap();
        prepare(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join("store")), 0o700);
        assert_eq!(mode(&dir.join("store/journal")), 0o600);
        let fresh = root.path().join("fresh");
        prepare(&fresh).unwrap();
        assert!(fresh.is_dir());
    }

    #[test]
    fn the_local_token_is_private_kept_and_removed_when_not_local_only() {
        let dir = tempfile::tempdir().unwrap();
        let token = local_token(dir.path(), true).unwrap().unwrap();
        assert!(valid_token(&token), "{token}");
        let path = dir.path().join(LOCAL_TOKEN_FILE);
        assert_eq!(mode(&path), FILE_MODE);
        assert_eq!(local_token(dir.path(), true).unwrap(), Some(token.clone()));
        std::fs::write(&path, "garbage").unwrap();
        let replaced = local_token(dir.path(), true).unwrap().unwrap();
        assert_ne!(replaced, token);
        assert!(valid_token(&replaced));
        assert_eq!(local_token(dir.path(), false).unwrap(), None);
        assert!(path.exists(), "kept until the daemon has started");
        remove_local_token(dir.path()).unwrap();
        assert!(!path.exists());
        remove_local_token(dir.path()).unwrap();
        assert_ne!(new_token().unwrap(), new_token().unwrap());
    }
}
