//! Drops a torn last batch of fjall's newest journal, which fjall itself refuses to open.
//!
//! A power loss can leave the batch written after the last sync with its End entry on
//! disk but part of its items not (dirty pages reach the disk in any order, unwritten
//! ones read back as the file's pre-allocated zeros). fjall 3 drops a tail batch that
//! lacks its End entry, but stops with `ChecksumMismatch` on this one, and the daemon
//! could not start. Such a batch was never synced, so no reply depended on it: the
//! dispatcher replies only after a sync, which leaves every byte before it durable and
//! intact. Dropping it is recovering to the last sync, as fjall does for a batch cut
//! short.
//!
//! Only that batch is dropped: the first batch whose checksum fails must be the last
//! complete batch of the newest journal. Anything else is real corruption and is left
//! for fjall to report.
//!
//! The format (fjall 3.1, `journal/entry.rs`): a batch is a Start entry (tag 1, u32
//! item count, u64 seqno), its Items (tag 2, value type, compression, u64 keyspace,
//! u16 key length, u32 value length, u32 stored length, key, value) and Clears (tag 4,
//! u64 keyspace), then an End entry (tag 3, u64 xxh3 of the items' bytes, the magic
//! `FJL\x03`). Integers are little-endian.

use std::io;
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 4] = b"FJL\x03";

/// A complete batch found in a journal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Batch {
    /// Offset of its Start entry.
    start: usize,
    /// True if its checksum and item count match.
    intact: bool,
}

/// Every complete batch of a journal, up to the first entry that does not parse.
fn batches(bytes: &[u8]) -> Vec<Batch> {
    let u16_at = |p: usize| {
        bytes
            .get(p..p + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    let u32_at = |p: usize| {
        bytes
            .get(p..p + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let u64_at = |p: usize| {
        bytes.get(p..p + 8).map(|b| {
            let mut a = [0u8; 8];
            a.copy_from_slice(b);
            u64::from_le_bytes(a)
        })
    };
    let mut out = Vec::new();
    // The open batch: its start, items still expected, and the hash of its items.
    let mut open: Option<(usize, u32, xxhash_rust::xxh3::Xxh3)> = None;
    let mut pos = 0;
    while let Some(&tag) = bytes.get(pos) {
        let len = match tag {
            1 => 13,
            2 => match (u16_at(pos + 11), u32_at(pos + 17)) {
                (Some(key), Some(value)) => 21 + usize::from(key) + value as usize,
                _ => break,
            },
            3 => 13,
            4 => 9,
            _ => break,
        };
        let Some(entry) = bytes.get(pos..pos + len) else {
            break;
        };
        match (tag, open.as_mut()) {
            (1, None) => {
                let count = u32_at(pos + 1).unwrap_or(0);
                open = Some((pos, count, xxhash_rust::xxh3::Xxh3::new()));
            }
            (2 | 4, Some((_, left, hash))) => {
                *left = left.saturating_sub(1);
                hash.update(entry);
            }
            (3, Some((start, left, hash))) if &entry[9..] == MAGIC => {
                let intact = *left == 0 && u64_at(pos + 1) == Some(hash.digest());
                out.push(Batch {
                    start: *start,
                    intact,
                });
                open = None;
            }
            _ => break,
        }
        pos += len;
    }
    out
}

/// The newest journal file (`N.jnl`, highest N) directly in `dir`.
fn newest_journal(dir: &Path) -> io::Result<Option<PathBuf>> {
    let mut newest: Option<(u64, PathBuf)> = None;
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let id = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".jnl"))
            .and_then(|n| n.parse::<u64>().ok());
        if let Some(id) = id
            && newest.as_ref().is_none_or(|(n, _)| id > *n)
        {
            newest = Some((id, path));
        }
    }
    Ok(newest.map(|(_, p)| p))
}

/// If the newest journal in `dir` ends with a torn batch (complete framing, wrong
/// checksum) and every batch before it is intact, cuts the journal before it and says
/// what it cut; otherwise changes nothing and returns `None`.
pub(super) fn drop_torn_last_batch(dir: &Path) -> io::Result<Option<String>> {
    let Some(path) = newest_journal(dir)? else {
        return Ok(None);
    };
    let bytes = std::fs::read(&path)?;
    let found = batches(&bytes);
    let Some(first_bad) = found.iter().position(|b| !b.intact) else {
        return Ok(None);
    };
    if first_bad + 1 != found.len() {
        return Ok(None);
    }
    let start = found[first_bad].start;
    let file = std::fs::OpenOptions::new().write(true).open(&path)?;
    // IMPORTANT: durable before fjall reads the journal again.
    file.set_len(start as u64)?;
    file.sync_all()?;
    Ok(Some(format!(
        "{} was cut at offset {start}: its last batch was torn",
        path.display()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch of one item with this key and value, as fjall writes it.
    fn batch(key: &[u8], value: &[u8]) -> Vec<u8> {
        let mut item = vec![2u8, 0, 0];
        item.extend(7u64.to_le_bytes());
        item.extend((key.len() as u16).to_le_bytes());
        item.extend((value.len() as u32).to_le_bytes());
        item.extend((value.len() as u32).to_le_bytes());
        item.extend(key);
        item.extend(value);
        let mut b = vec![1u8];
        b.extend(1u32.to_le_bytes());
        b.extend(9u64.to_le_bytes());
        b.extend(&item);
        b.push(3);
        b.extend(xxhash_rust::xxh3::xxh3_64(&item).to_le_bytes());
        b.extend(MAGIC);
        b
    }

    fn journal(batches: &[Vec<u8>]) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("0.jnl"), b"old").unwrap();
        let path = dir.path().join("1.jnl");
        let mut bytes = batches.concat();
        bytes.extend([0u8; 100]);
        std::fs::write(&path, bytes).unwrap();
        (dir, path)
    }

    fn torn(mut b: Vec<u8>) -> Vec<u8> {
        // A page in the middle never reached the disk.
        b[36] = 0;
        b
    }

    #[test]
    fn a_torn_last_batch_is_cut_and_nothing_else() {
        let (a, b) = (batch(b"k1", b"one"), batch(b"k2", b"two"));
        let (dir, path) = journal(&[a.clone(), b.clone(), torn(batch(b"k3", b"three"))]);
        let cut = drop_torn_last_batch(dir.path()).unwrap();
        assert_eq!(
            cut,
            Some(format!(
                "{} was cut at offset {}: its last batch was torn",
                path.display(),
                a.len() + b.len()
            ))
        );
        assert_eq!(std::fs::read(&path).unwrap(), [a, b].concat());
        // Nothing more to cut.
        assert_eq!(drop_torn_last_batch(dir.path()).unwrap(), None);
    }

    #[test]
    fn intact_journals_and_corruption_before_the_end_are_left_alone() {
        let (a, b) = (batch(b"k1", b"one"), batch(b"k2", b"two"));
        for batches in [vec![a.clone(), b.clone()], vec![torn(a.clone()), b.clone()]] {
            let (dir, path) = journal(&batches);
            let before = std::fs::read(&path).unwrap();
            assert_eq!(drop_torn_last_batch(dir.path()).unwrap(), None);
            assert_eq!(std::fs::read(&path).unwrap(), before);
        }
    }
}
