//! openraft's log and state machine over the node's own fjall store.
//!
//! | keyspace     | key                  | value                                      |
//! |--------------|----------------------|--------------------------------------------|
//! | `raft_log`   | index, 8 bytes BE    | the entry (postcard)                       |
//! | `raft_state` | `vote`, `committed`, `purged` | postcard                          |
//! | `meta`       | `raft_applied`, `raft_membership`, `raft_wall_ms`, `raft_installing` | postcard |
//!
//! Log and state machine share one fjall journal, so what is durable is always a prefix
//! of what was written: a state machine is never ahead of the log it applied. Appends
//! and votes are persisted per `--durability` before openraft hears they are done;
//! applying a committed entry is not synced itself (the log holds the entry).
//!
//! Snapshots are files in `DATA/snapshots`: `current` is frames of a u32 big-endian
//! length and postcard bytes, the first its [`SnapshotMeta`], the others a [`Change`]
//! each: every key of the engine's keyspaces at one applied position. A new one is
//! written to `building` (or received into `receiving`) and renamed. Installing one replaces the
//! keyspaces in batches; the store is marked `raft_installing` meanwhile, and a node
//! that stops half way redoes the install from `current` when it starts.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufReader, BufWriter, Read, Write};
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use fjall::{Keyspace, KeyspaceCreateOptions};
use openraft::storage::{LogFlushed, LogState, RaftLogStorage, RaftStateMachine, Snapshot};
use openraft::{
    Entry, EntryPayload, LogId, Membership, OptionalSend, RaftLogReader, RaftSnapshotBuilder,
    SnapshotMeta, StorageError, StorageIOError, StoredMembership, Vote,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{Muster, NodeAddr};
use crate::store::{Change, Persist, SNAPSHOT_BATCH, Space, Store, StoreError};

type StorageResult<T> = Result<T, StorageError<u64>>;

const VOTE: &[u8] = b"vote";
const COMMITTED: &[u8] = b"committed";
const PURGED: &[u8] = b"purged";
/// The last applied log id, in `meta`.
pub const APPLIED: &[u8] = b"raft_applied";
/// The membership in force at the last applied entry, in `meta`.
pub const MEMBERSHIP: &[u8] = b"raft_membership";
/// The wall-clock time of the last applied round, in `meta`.
pub const WALL_MS: &[u8] = b"raft_wall_ms";
/// Present while a snapshot is being installed, in `meta`.
const INSTALLING: &[u8] = b"raft_installing";

/// The snapshot files' directory under the data directory.
pub const SNAPSHOT_DIR: &str = "snapshots";
const CURRENT: &str = "current";
const RECEIVING: &str = "receiving";
const BUILDING: &str = "building";

/// Largest frame of a snapshot file: one change (a key and a value of at most a
/// payload's size, with room to spare).
const MAX_SNAPSHOT_FRAME: usize = 8 << 20;

fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    postcard::to_stdvec(value).expect("raft records serialize")
}

fn decode<T: DeserializeOwned>(bytes: &[u8], what: &str) -> Result<T, StoreError> {
    postcard::from_bytes(bytes).map_err(|e| StoreError::Corrupt {
        what: what.into(),
        detail: e.to_string(),
    })
}

fn read_err(e: impl std::error::Error + Send + Sync + 'static) -> StorageError<u64> {
    StorageIOError::read(&e).into()
}

fn write_err(e: impl std::error::Error + Send + Sync + 'static) -> StorageError<u64> {
    StorageIOError::write(&e).into()
}

/// Runs blocking store work off the async runtime.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic.into_panic()))
}

/// The raft log and vote, in the node's store.
#[derive(Clone)]
pub struct LogStore {
    store: Store,
    log: Keyspace,
    state: Keyspace,
    persist: Persist,
}

impl LogStore {
    /// The log of `store`, persisting appends and votes as far as `persist` says.
    pub fn open(store: &Store, persist: Persist) -> Result<LogStore, StoreError> {
        let opts = KeyspaceCreateOptions::default;
        Ok(LogStore {
            store: store.clone(),
            log: store.database().keyspace("raft_log", opts)?,
            state: store.database().keyspace("raft_state", opts)?,
            persist,
        })
    }

    fn get_state<T: DeserializeOwned>(&self, key: &[u8]) -> Result<Option<T>, StoreError> {
        match self.state.get(key)? {
            Some(v) => Ok(Some(decode(&v, "raft state")?)),
            None => Ok(None),
        }
    }

    fn last_entry(&self) -> Result<Option<LogId<u64>>, StoreError> {
        match self.log.last_key_value() {
            Some(guard) => {
                let (_, v) = guard.into_inner()?;
                let entry: Entry<Muster> = decode(&v, "raft log entry")?;
                Ok(Some(entry.log_id))
            }
            None => Ok(None),
        }
    }

    /// The membership this node's log and state machine hold last: the latest
    /// membership entry of the log, else the applied one.
    fn last_membership(
        &self,
        store: &Store,
    ) -> Result<Option<Membership<u64, NodeAddr>>, StoreError> {
        for guard in self.log.iter().rev() {
            let (_, v) = guard.into_inner()?;
            let entry: Entry<Muster> = decode(&v, "raft log entry")?;
            if let EntryPayload::Membership(m) = entry.payload {
                return Ok(Some(m));
            }
        }
        let applied = Applied::of(store)?;
        Ok(applied
            .log_id
            .is_some()
            .then(|| applied.membership.membership().clone()))
    }

    /// The way back from a lost majority: makes this node, `node` at `addr`, the only
    /// voter of its cluster, keeping everything its store and log hold. Appends a
    /// membership entry of `{node}` after the log's last entry, in a term above every
    /// term it has seen, and votes for itself in that term (not yet elected: it wins
    /// its own election at start, as the only voter). Nothing is done (`Ok(false)`)
    /// when the node is its cluster's only voter already, so a flag left in place is
    /// harmless; refused when its store never joined a cluster.
    pub fn force_single_node(
        &self,
        store: &Store,
        node: u64,
        addr: NodeAddr,
    ) -> Result<bool, StoreError> {
        let refuse = |detail: String| StoreError::Corrupt {
            what: "the forced recovery".into(),
            detail,
        };
        let Some(membership) = self.last_membership(store)? else {
            return Err(refuse(
                "this node's store holds no cluster: there is nothing to recover".into(),
            ));
        };
        let voters: BTreeSet<u64> = membership.voter_ids().collect();
        if voters == BTreeSet::from([node]) && membership.get_joint_config().len() == 1 {
            return Ok(false);
        }
        let purged: Option<LogId<u64>> = self.get_state(PURGED)?;
        let last = self.last_entry()?.or(purged);
        let vote: Option<Vote<u64>> = self.get_state(VOTE)?;
        let term = vote
            .map_or(0, |v| v.leader_id().term)
            .max(last.map_or(0, |l| l.leader_id.term))
            + 1;
        let index = last.map_or(0, |l| l.index + 1);
        let entry: Entry<Muster> = Entry {
            log_id: LogId::new(openraft::CommittedLeaderId::new(term, node), index),
            payload: EntryPayload::Membership(Membership::new(
                vec![BTreeSet::from([node])],
                BTreeMap::from([(node, addr)]),
            )),
        };
        let db = store.database();
        let mut batch = db.batch();
        batch.insert(&self.log, index.to_be_bytes(), encode(&entry));
        batch.insert(&self.state, VOTE, encode(&Vote::new(term, node)));
        batch.durability(None).commit()?;
        store.persist(Persist::All)?;
        tracing::warn!(
            node,
            term,
            index,
            former_voters = ?voters,
            "forced a one-node cluster from this node's store (--cluster-force-single-node): it leads alone with everything it held; add new nodes with `muster cluster add`, and never restart the former voters with their old data"
        );
        Ok(true)
    }

    /// Removes the entries in `from..to`, a batch at a time.
    fn remove_range(&self, from: u64, to: Option<u64>) -> Result<(), StoreError> {
        let range = match to {
            Some(to) => self.log.range(from.to_be_bytes()..to.to_be_bytes()),
            None => self.log.range(from.to_be_bytes()..),
        };
        let db = self.store.database();
        let mut batch = db.batch();
        for guard in range {
            batch.remove(&self.log, guard.key()?);
            if batch.len() >= SNAPSHOT_BATCH {
                batch.durability(None).commit()?;
                batch = db.batch();
            }
        }
        batch.durability(None).commit()?;
        Ok(())
    }
}

fn index_range(range: impl RangeBounds<u64>) -> (u64, Option<u64>) {
    let start = match range.start_bound() {
        Bound::Included(&i) => i,
        Bound::Excluded(&i) => i.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&i) => i.checked_add(1),
        Bound::Excluded(&i) => Some(i),
        Bound::Unbounded => None,
    };
    (start, end)
}

impl RaftLogReader<Muster> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + std::fmt::Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> StorageResult<Vec<Entry<Muster>>> {
        let (start, end) = index_range(range);
        if end.is_some_and(|end| end <= start) {
            return Ok(Vec::new());
        }
        let iter = match end {
            Some(end) => self.log.range(start.to_be_bytes()..end.to_be_bytes()),
            None => self.log.range(start.to_be_bytes()..),
        };
        let mut out = Vec::new();
        for guard in iter {
            let (_, v) = guard.into_inner().map_err(read_err)?;
            out.push(decode(&v, "raft log entry").map_err(read_err)?);
        }
        Ok(out)
    }
}

impl RaftLogStorage<Muster> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> StorageResult<LogState<Muster>> {
        let purged: Option<LogId<u64>> = self.get_state(PURGED).map_err(read_err)?;
        let last = self.last_entry().map_err(read_err)?.or(purged);
        Ok(LogState {
            last_purged_log_id: purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> LogStore {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<u64>) -> StorageResult<()> {
        let this = self.clone();
        let vote = encode(vote);
        blocking(move || {
            this.state.insert(VOTE, vote)?;
            this.store.persist(this.persist)
        })
        .await
        .map_err(|e| StorageIOError::write_vote(&e).into())
    }

    async fn read_vote(&mut self) -> StorageResult<Option<Vote<u64>>> {
        self.get_state(VOTE)
            .map_err(|e| StorageIOError::read_vote(&e).into())
    }

    async fn save_committed(&mut self, committed: Option<LogId<u64>>) -> StorageResult<()> {
        self.state
            .insert(COMMITTED, encode(&committed))
            .map_err(|e| write_err(StoreError::from(e)))
    }

    async fn read_committed(&mut self) -> StorageResult<Option<LogId<u64>>> {
        Ok(self
            .get_state::<Option<LogId<u64>>>(COMMITTED)
            .map_err(read_err)?
            .flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<Muster>) -> StorageResult<()>
    where
        I: IntoIterator<Item = Entry<Muster>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut batch = self.store.database().batch();
        for entry in entries {
            batch.insert(&self.log, entry.log_id.index.to_be_bytes(), encode(&entry));
        }
        batch
            .durability(None)
            .commit()
            .map_err(|e| StorageIOError::write_logs(&StoreError::from(e)))?;
        // The entries are readable now; openraft hears they are durable once they are.
        let this = self.clone();
        tokio::task::spawn_blocking(move || {
            let result = this
                .store
                .persist(this.persist)
                .map_err(std::io::Error::other);
            callback.log_io_completed(result);
        });
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<u64>) -> StorageResult<()> {
        self.remove_range(log_id.index, None)
            .map_err(|e| StorageIOError::write_logs(&e).into())
    }

    async fn purge(&mut self, log_id: LogId<u64>) -> StorageResult<()> {
        self.state
            .insert(PURGED, encode(&log_id))
            .map_err(|e| write_err(StoreError::from(e)))?;
        self.remove_range(0, log_id.index.checked_add(1))
            .map_err(|e| StorageIOError::write_logs(&e).into())
    }
}

/// What the state machine has applied, as stored in `meta`.
#[derive(Debug, Clone, Default)]
pub struct Applied {
    /// The last applied log id.
    pub log_id: Option<LogId<u64>>,
    /// The membership in force.
    pub membership: StoredMembership<u64, NodeAddr>,
    /// The last applied round's wall-clock time (0 before any).
    pub wall_ms: u64,
}

impl Applied {
    /// Reads the applied position from `read` (the store, or a view of it).
    fn read(
        read: impl Fn(&[u8]) -> Result<Option<Vec<u8>>, StoreError>,
    ) -> Result<Applied, StoreError> {
        let log_id = match read(APPLIED)? {
            Some(v) => decode(&v, "raft applied")?,
            None => None,
        };
        let membership = match read(MEMBERSHIP)? {
            Some(v) => decode(&v, "raft membership")?,
            None => StoredMembership::default(),
        };
        let wall_ms = match read(WALL_MS)? {
            Some(v) => decode(&v, "raft wall time")?,
            None => 0,
        };
        Ok(Applied {
            log_id,
            membership,
            wall_ms,
        })
    }

    /// Reads the applied position of `store`.
    pub fn of(store: &Store) -> Result<Applied, StoreError> {
        Applied::read(|key| store.meta(key))
    }

    fn meta(&self) -> [(&'static [u8], Vec<u8>); 3] {
        [
            (APPLIED, encode(&self.log_id)),
            (MEMBERSHIP, encode(&self.membership)),
            (WALL_MS, encode(&self.wall_ms)),
        ]
    }
}

/// The state machine: the node's store, written only by applying committed rounds.
pub struct StateMachine {
    store: Store,
    dir: PathBuf,
    applied: Applied,
    snapshots_built: Arc<AtomicU64>,
}

impl StateMachine {
    /// The state machine over `store`, its snapshots in `data/snapshots`. Finishes a
    /// snapshot install a stop cut short.
    pub fn open(store: &Store, data: &Path) -> Result<StateMachine, StoreError> {
        let dir = data.join(SNAPSHOT_DIR);
        std::fs::create_dir_all(&dir).map_err(fjall::Error::from)?;
        if store.meta(INSTALLING)?.is_some() {
            let meta = read_meta(&dir.join(CURRENT))?;
            tracing::warn!(
                "finishing the install of snapshot {} that a stop cut short",
                meta.snapshot_id
            );
            load_snapshot(store, &dir.join(CURRENT), &meta)?;
        }
        Ok(StateMachine {
            store: store.clone(),
            applied: Applied::of(store)?,
            dir,
            snapshots_built: Arc::default(),
        })
    }
}

/// Replaces the store's engine keyspaces with the snapshot in `file`.
fn load_snapshot(
    store: &Store,
    file: &Path,
    meta: &SnapshotMeta<u64, NodeAddr>,
) -> Result<Applied, StoreError> {
    store.apply(&[], &[(INSTALLING, Vec::new())])?;
    store.persist(Persist::Data)?;
    store.clear()?;
    let mut reader = BufReader::new(std::fs::File::open(file).map_err(fjall::Error::from)?);
    let _meta = read_frame(&mut reader)?;
    let mut changes = Vec::with_capacity(SNAPSHOT_BATCH);
    let mut wall_ms = 0;
    while let Some(frame) = read_frame(&mut reader)? {
        let change: Change = decode(&frame, "snapshot frame")?;
        if change.space == Space::Meta {
            if change.key == WALL_MS
                && let Some(v) = &change.value
            {
                wall_ms = decode(v, "snapshot wall time")?;
            }
            continue;
        }
        changes.push(change);
        if changes.len() >= SNAPSHOT_BATCH {
            store.apply(&changes, &[])?;
            changes.clear();
        }
    }
    let applied = Applied {
        log_id: meta.last_log_id,
        membership: meta.last_membership.clone(),
        wall_ms,
    };
    store.apply(&changes, &applied.meta())?;
    store.remove_meta(INSTALLING)?;
    store.persist(Persist::All)?;
    Ok(applied)
}

/// The meta of the snapshot in `file`: its first frame.
fn read_meta(file: &Path) -> Result<SnapshotMeta<u64, NodeAddr>, StoreError> {
    let mut reader = BufReader::new(std::fs::File::open(file).map_err(fjall::Error::from)?);
    match read_frame(&mut reader)? {
        Some(frame) => decode(&frame, "snapshot meta"),
        None => Err(StoreError::Corrupt {
            what: "snapshot file".into(),
            detail: "empty".into(),
        }),
    }
}

/// The next frame's bytes; `None` at the end of the file.
fn read_frame(reader: &mut impl Read) -> Result<Option<Vec<u8>>, StoreError> {
    let corrupt = |detail: String| StoreError::Corrupt {
        what: "snapshot file".into(),
        detail,
    };
    let mut len = [0u8; 4];
    match reader.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(fjall::Error::from(e).into()),
    }
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_SNAPSHOT_FRAME {
        return Err(corrupt(format!("a frame of {len} bytes")));
    }
    let mut buf = vec![0u8; len];
    reader
        .read_exact(&mut buf)
        .map_err(|e| corrupt(format!("a cut frame: {e}")))?;
    Ok(Some(buf))
}

fn write_frame(writer: &mut impl Write, value: &impl Serialize) -> std::io::Result<()> {
    let bytes = encode(value);
    writer.write_all(&(bytes.len() as u32).to_be_bytes())?;
    writer.write_all(&bytes)
}

/// Builds snapshot files from a view of the store.
pub struct SnapshotBuilder {
    store: Store,
    dir: PathBuf,
    built: Arc<AtomicU64>,
}

impl SnapshotBuilder {
    fn build(&self) -> Result<(SnapshotMeta<u64, NodeAddr>, PathBuf), StoreError> {
        let view = self.store.view();
        let applied = Applied::read(|key| view.get(Space::Meta, key))?;
        let last = applied.log_id;
        let n = self.built.fetch_add(1, Ordering::Relaxed);
        let meta = SnapshotMeta {
            last_log_id: last,
            last_membership: applied.membership.clone(),
            snapshot_id: match last {
                Some(last) => format!("{}-{}-{n}", last.leader_id.term, last.index),
                None => format!("0-0-{n}"),
            },
        };
        let building = self.dir.join(BUILDING);
        let file = std::fs::File::create(&building).map_err(fjall::Error::from)?;
        let mut writer = BufWriter::new(file);
        let io = |e: std::io::Error| StoreError::from(fjall::Error::from(e));
        write_frame(&mut writer, &meta).map_err(io)?;
        write_frame(
            &mut writer,
            &Change {
                space: Space::Meta,
                key: WALL_MS.to_vec(),
                value: Some(encode(&applied.wall_ms)),
            },
        )
        .map_err(io)?;
        for space in Space::ALL {
            if space == Space::Meta {
                continue;
            }
            view.for_each(space, |key, value| {
                write_frame(
                    &mut writer,
                    &Change {
                        space,
                        key: key.to_vec(),
                        value: Some(value.to_vec()),
                    },
                )
                .map_err(io)
            })?;
        }
        let file = writer.into_inner().map_err(|e| io(e.into_error()))?;
        file.sync_all().map_err(io)?;
        let current = self.dir.join(CURRENT);
        std::fs::rename(&building, &current).map_err(fjall::Error::from)?;
        sync_dir(&self.dir)?;
        Ok((meta, current))
    }
}

fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| fjall::Error::from(e).into())
}

async fn open_snapshot(path: &Path) -> Result<Box<tokio::fs::File>, StoreError> {
    Ok(Box::new(
        tokio::fs::File::open(path)
            .await
            .map_err(fjall::Error::from)?,
    ))
}

impl RaftSnapshotBuilder<Muster> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> StorageResult<Snapshot<Muster>> {
        let this = SnapshotBuilder {
            store: self.store.clone(),
            dir: self.dir.clone(),
            built: Arc::clone(&self.built),
        };
        let (meta, path) = blocking(move || this.build())
            .await
            .map_err(|e| StorageIOError::write_snapshot(None, &e))?;
        let snapshot = open_snapshot(&path)
            .await
            .map_err(|e| StorageIOError::read_snapshot(None, &e))?;
        Ok(Snapshot { meta, snapshot })
    }
}

impl RaftStateMachine<Muster> for StateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(
        &mut self,
    ) -> StorageResult<(Option<LogId<u64>>, StoredMembership<u64, NodeAddr>)> {
        Ok((self.applied.log_id, self.applied.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> StorageResult<Vec<bool>>
    where
        I: IntoIterator<Item = Entry<Muster>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut replies = Vec::new();
        for entry in entries {
            let log_id = entry.log_id;
            let mut applied = self.applied.clone();
            applied.log_id = Some(log_id);
            let changes = match entry.payload {
                EntryPayload::Blank => Vec::new(),
                EntryPayload::Membership(m) => {
                    applied.membership = StoredMembership::new(Some(log_id), m);
                    Vec::new()
                }
                // IMPORTANT: the term fence. A round made by an engine of another term
                // is not applied: only the engine built in the term that appends it
                // knows the store the round was computed against.
                EntryPayload::Normal(round) if round.term == log_id.leader_id.term => {
                    applied.wall_ms = applied.wall_ms.max(round.wall_ms);
                    round.changes
                }
                EntryPayload::Normal(_) => {
                    replies.push(false);
                    self.store
                        .apply(&[], &applied.meta())
                        .map_err(|e| StorageIOError::apply(log_id, &e))?;
                    self.applied = applied;
                    continue;
                }
            };
            self.store
                .apply(&changes, &applied.meta())
                .map_err(|e| StorageIOError::apply(log_id, &e))?;
            self.applied = applied;
            replies.push(true);
        }
        Ok(replies)
    }

    async fn get_snapshot_builder(&mut self) -> SnapshotBuilder {
        SnapshotBuilder {
            store: self.store.clone(),
            dir: self.dir.clone(),
            built: Arc::clone(&self.snapshots_built),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> StorageResult<Box<tokio::fs::File>> {
        // Read back by install_snapshot, so opened for reading too.
        let file = tokio::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(self.dir.join(RECEIVING))
            .await
            .map_err(|e| StorageIOError::write_snapshot(None, &e))?;
        Ok(Box::new(file))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<u64, NodeAddr>,
        snapshot: Box<tokio::fs::File>,
    ) -> StorageResult<()> {
        let failed = |e: StoreError| StorageIOError::write_snapshot(Some(meta.signature()), &e);
        let io = |e: std::io::Error| failed(fjall::Error::from(e).into());
        // The data is whatever the file openraft hands back holds (normally `receiving`,
        // written chunk by chunk): copied whole into `building`, then made `current`.
        let mut source = snapshot;
        tokio::io::AsyncSeekExt::seek(&mut *source, std::io::SeekFrom::Start(0))
            .await
            .map_err(io)?;
        let building = self.dir.join(BUILDING);
        let mut target = tokio::fs::File::create(&building).await.map_err(io)?;
        tokio::io::copy(&mut *source, &mut target)
            .await
            .map_err(io)?;
        target.sync_all().await.map_err(io)?;
        drop((source, target));
        let (store, dir, owned) = (self.store.clone(), self.dir.clone(), meta.clone());
        let applied = blocking(move || {
            std::fs::rename(dir.join(BUILDING), dir.join(CURRENT)).map_err(fjall::Error::from)?;
            let _ = std::fs::remove_file(dir.join(RECEIVING));
            sync_dir(&dir)?;
            load_snapshot(&store, &dir.join(CURRENT), &owned)
        })
        .await
        .map_err(failed)?;
        tracing::info!(
            snapshot = %meta.snapshot_id,
            applied = ?applied.log_id.map(|l| l.index),
            "installed a snapshot from the leader"
        );
        self.applied = applied;
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> StorageResult<Option<Snapshot<Muster>>> {
        let path = self.dir.join(CURRENT);
        if !path.exists() {
            return Ok(None);
        }
        let meta = blocking(move || read_meta(&path))
            .await
            .map_err(|e| StorageIOError::read_snapshot(None, &e))?;
        let snapshot = open_snapshot(&self.dir.join(CURRENT))
            .await
            .map_err(|e| StorageIOError::read_snapshot(Some(meta.signature()), &e))?;
        Ok(Some(Snapshot { meta, snapshot }))
    }
}

#[cfg(test)]
mod tests {
    use openraft::testing::{StoreBuilder, Suite};
    use openraft::{CommittedLeaderId, Membership};

    use super::*;
    use crate::cluster::Round;

    struct Builder;

    /// The member names in the store's `owners` keyspace (what the test rounds write).
    fn owners(store: &Store) -> Vec<String> {
        store
            .load_owners()
            .unwrap()
            .into_iter()
            .map(|(m, _)| m)
            .collect()
    }

    fn open(dir: &Path) -> (Store, LogStore, StateMachine) {
        let store = Store::open_clustered(&dir.join("store"), 8 << 20).unwrap();
        let log = LogStore::open(&store, Persist::Os).unwrap();
        let machine = StateMachine::open(&store, dir).unwrap();
        (store, log, machine)
    }

    impl StoreBuilder<Muster, LogStore, StateMachine, tempfile::TempDir> for Builder {
        async fn build(&self) -> StorageResult<(tempfile::TempDir, LogStore, StateMachine)> {
            let dir = tempfile::tempdir().unwrap();
            let (_, log, machine) = open(dir.path());
            Ok((dir, log, machine))
        }
    }

    #[test]
    fn passes_openraft_storage_suite() {
        Suite::test_all(Builder).unwrap();
    }

    fn entry(term: u64, index: u64, round_term: u64, key: &[u8]) -> Entry<Muster> {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(term, 1), index),
            payload: EntryPayload::Normal(Round {
                term: round_term,
                wall_ms: 1_000 * index,
                changes: vec![Change {
                    space: Space::Owners,
                    key: key.to_vec(),
                    value: Some(b"p".to_vec()),
                }],
            }),
        }
    }

    #[tokio::test]
    async fn a_round_of_another_term_is_not_applied() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _, mut machine) = open(dir.path());
        let replies = machine
            .apply([entry(3, 1, 3, b"kept"), entry(4, 2, 3, b"fenced")])
            .await
            .unwrap();
        assert_eq!(replies, vec![true, false]);
        assert_eq!(owners(&store), ["kept"]);
        let applied = Applied::of(&store).unwrap();
        assert_eq!(applied.log_id.map(|l| l.index), Some(2));
        assert_eq!(
            applied.wall_ms, 1_000,
            "the fenced round's time is not taken either"
        );
    }

    #[tokio::test]
    async fn a_snapshot_carries_every_key_and_installs_over_another_store() {
        let from = tempfile::tempdir().unwrap();
        let (_, _, mut machine) = open(from.path());
        let membership = Membership::new(
            vec![std::collections::BTreeSet::from([1u64])],
            std::collections::BTreeMap::from([(1u64, NodeAddr::default())]),
        );
        machine
            .apply([
                Entry {
                    log_id: LogId::new(CommittedLeaderId::new(1, 1), 1),
                    payload: EntryPayload::Membership(membership),
                },
                entry(1, 2, 1, b"a"),
                entry(1, 3, 1, b"b"),
            ])
            .await
            .unwrap();
        let snapshot = machine
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        assert_eq!(snapshot.meta.last_log_id.map(|l| l.index), Some(3));

        let to = tempfile::tempdir().unwrap();
        let (store, _, mut other) = open(to.path());
        other.apply([entry(1, 1, 1, b"stale")]).await.unwrap();
        let mut receiving = other.begin_receiving_snapshot().await.unwrap();
        let bytes = std::fs::read(from.path().join(SNAPSHOT_DIR).join(CURRENT)).unwrap();
        tokio::io::AsyncWriteExt::write_all(&mut *receiving, &bytes)
            .await
            .unwrap();
        other
            .install_snapshot(&snapshot.meta, receiving)
            .await
            .unwrap();
        assert_eq!(owners(&store), ["a", "b"]);
        let (applied, members) = other.applied_state().await.unwrap();
        assert_eq!(applied.map(|l| l.index), Some(3));
        assert_eq!(members.voter_ids().collect::<Vec<_>>(), vec![1]);
        assert_eq!(Applied::of(&store).unwrap().wall_ms, 3_000);
        assert_eq!(store.meta(INSTALLING).unwrap(), None);
    }
}
