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
//! each: every key of the engine's keyspaces at one applied position, read back through
//! the protocol's `FrameReader` ([`SnapshotFrames`]). A new one is
//! written to `building` (or received into `receiving`) and renamed. Installing one replaces the
//! keyspaces in batches; the store is marked `raft_installing` meanwhile, and a node
//! that stops half way redoes the install from `current` when it starts.
//!
//! Every append of the log is persisted in one fsync, timed as `muster_fsync_seconds`
//! (what a single daemon's round persist is). The state machine also keeps a
//! [`Census`] of what it applied: each task's queue and state, so that a node that does
//! not serve (it has no engine) exports the same task gauges as the leader, and the
//! membership, for the voter gauges; the node that opens the state machine keeps a
//! handle on it ([`StateMachine::census`], [`Counted`]) to publish them.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{BufWriter, Read, Write};
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use fjall::{Keyspace, KeyspaceCreateOptions};
use openraft::storage::{LogFlushed, LogState, RaftLogStorage, RaftStateMachine, Snapshot};
use openraft::{
    Entry, EntryPayload, LogId, Membership, OptionalSend, RaftLogReader, RaftSnapshotBuilder,
    SnapshotMeta, StorageError, StorageIOError, StoredMembership, Vote,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use ulid::Ulid;

use muster_protocol::frame::{FrameError, FrameReader, HEADER_LEN, Wants};
use muster_protocol::model::TaskState;

use super::{Fate, Muster, NodeAddr};
use crate::store::format::{self, StoredState};
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

/// Runs blocking store work off the async runtime's workers: every fjall call of a
/// cluster node goes through here (or the fsync task of [`LogStore::append`]).
async fn blocking<T: Send + 'static, E: Send + 'static>(
    f: impl FnOnce() -> Result<T, E> + Send + 'static,
) -> Result<T, E> {
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
                let (k, v) = guard.into_inner()?;
                let entry: Entry<Muster> = decode(&v, "raft log entry")?;
                assert_eq!(
                    *k,
                    entry.log_id.index.to_be_bytes(),
                    "a log entry is stored under its index ({})",
                    entry.log_id
                );
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
        let (voted_term, last_term) = (
            vote.map_or(0, |v| v.leader_id().term),
            last.map_or(0, |l| l.leader_id.term),
        );
        let term = voted_term.max(last_term) + 1;
        let index = last.map_or(0, |l| l.index + 1);
        // IMPORTANT: above every term the node has seen, so no leader of an old term
        // can ever overwrite the entry, nor a vote of one count.
        assert!(
            term > voted_term && term > last_term,
            "the forced term {term} is above the vote's ({voted_term}) and the log's ({last_term})"
        );
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
        debug_assert_eq!(
            self.last_entry().ok().flatten(),
            Some(entry.log_id),
            "the forced membership is the log's last entry"
        );
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
        assert!(
            to.is_none_or(|to| from <= to),
            "a range of the log ends after it starts ({from}..{to:?})"
        );
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
        debug_assert!(
            match to {
                Some(to) => self.log.range(from.to_be_bytes()..to.to_be_bytes()).next(),
                None => self.log.range(from.to_be_bytes()..).next(),
            }
            .is_none(),
            "no entry of {from}..{to:?} is left"
        );
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
        let log = self.log.clone();
        blocking(move || {
            let iter = match end {
                Some(end) => log.range(start.to_be_bytes()..end.to_be_bytes()),
                None => log.range(start.to_be_bytes()..),
            };
            let mut out: Vec<Entry<Muster>> = Vec::new();
            for guard in iter {
                let (_, v) = guard.into_inner()?;
                let entry: Entry<Muster> = decode(&v, "raft log entry")?;
                if let Some(previous) = out.last() {
                    assert_eq!(
                        entry.log_id.index,
                        previous.log_id.index + 1,
                        "the log's entries are contiguous"
                    );
                }
                out.push(entry);
            }
            debug_assert!(
                out.first().is_none_or(|e| e.log_id.index >= start)
                    && out
                        .last()
                        .is_none_or(|e| end.is_none_or(|end| e.log_id.index < end)),
                "the entries read lie in {start}..{end:?}"
            );
            Ok::<_, StoreError>(out)
        })
        .await
        .map_err(read_err)
    }
}

impl RaftLogStorage<Muster> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> StorageResult<LogState<Muster>> {
        let this = self.clone();
        blocking(move || {
            let purged: Option<LogId<u64>> = this.get_state(PURGED)?;
            let last = this.last_entry()?.or(purged);
            Ok::<_, StoreError>(LogState {
                last_purged_log_id: purged,
                last_log_id: last,
            })
        })
        .await
        .map_err(read_err)
    }

    async fn get_log_reader(&mut self) -> LogStore {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<u64>) -> StorageResult<()> {
        debug_assert!(
            self.get_state::<Vote<u64>>(VOTE)
                .ok()
                .flatten()
                .is_none_or(|saved| vote.leader_id().term >= saved.leader_id().term
                    && saved.partial_cmp(vote) != Some(std::cmp::Ordering::Greater)),
            "terms and votes never go back: vote {vote} saved"
        );
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
        let this = self.clone();
        blocking(move || this.get_state(VOTE))
            .await
            .map_err(|e| StorageIOError::read_vote(&e).into())
    }

    async fn save_committed(&mut self, committed: Option<LogId<u64>>) -> StorageResult<()> {
        debug_assert!(
            self.get_state::<Option<LogId<u64>>>(COMMITTED)
                .ok()
                .flatten()
                .flatten()
                <= committed,
            "the committed position never goes back: {committed:?} saved"
        );
        let state = self.state.clone();
        blocking(move || Ok::<_, StoreError>(state.insert(COMMITTED, encode(&committed))?))
            .await
            .map_err(write_err)
    }

    async fn read_committed(&mut self) -> StorageResult<Option<LogId<u64>>> {
        let this = self.clone();
        blocking(move || this.get_state::<Option<LogId<u64>>>(COMMITTED))
            .await
            .map(Option::flatten)
            .map_err(read_err)
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<Muster>) -> StorageResult<()>
    where
        I: IntoIterator<Item = Entry<Muster>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry<Muster>> = entries.into_iter().collect();
        let this = self.clone();
        blocking(move || {
            let mut batch = this.store.database().batch();
            let mut previous: Option<LogId<u64>> = None;
            for entry in &entries {
                if let Some(p) = previous {
                    assert_eq!(
                        entry.log_id.index,
                        p.index + 1,
                        "appended entries are contiguous"
                    );
                    assert!(
                        entry.log_id.leader_id.term >= p.leader_id.term,
                        "terms never go back"
                    );
                }
                previous = Some(entry.log_id);
                batch.insert(&this.log, entry.log_id.index.to_be_bytes(), encode(entry));
            }
            Ok::<_, StoreError>(batch.durability(None).commit()?)
        })
        .await
        .map_err(|e| StorageIOError::write_logs(&e))?;
        // The entries are readable now; openraft hears they are durable once they are.
        let this = self.clone();
        tokio::task::spawn_blocking(move || {
            let started = Instant::now();
            let result = this
                .store
                .persist(this.persist)
                .map_err(std::io::Error::other);
            metrics::histogram!("muster_fsync_seconds").record(started.elapsed().as_secs_f64());
            callback.log_io_completed(result);
        });
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<u64>) -> StorageResult<()> {
        let this = self.clone();
        blocking(move || {
            // IMPORTANT: Raft's safety: what a majority holds is never taken back.
            debug_assert!(
                this.get_state::<Option<LogId<u64>>>(COMMITTED)
                    .ok()
                    .flatten()
                    .flatten()
                    .is_none_or(|committed| committed.index < log_id.index),
                "a committed entry is never truncated ({log_id})"
            );
            this.remove_range(log_id.index, None)?;
            debug_assert!(
                this.last_entry()
                    .ok()
                    .flatten()
                    .is_none_or(|last| last.index < log_id.index),
                "the log ends before {log_id} once truncated"
            );
            Ok::<_, StoreError>(())
        })
        .await
        .map_err(|e| StorageIOError::write_logs(&e).into())
    }

    async fn purge(&mut self, log_id: LogId<u64>) -> StorageResult<()> {
        let this = self.clone();
        blocking(move || {
            let purged: Option<LogId<u64>> = this.get_state(PURGED)?;
            assert!(
                purged <= Some(log_id),
                "the purged position never goes back ({log_id} after {purged:?})"
            );
            this.state.insert(PURGED, encode(&log_id))?;
            this.remove_range(0, log_id.index.checked_add(1))?;
            debug_assert!(
                this.log.first_key_value().is_none_or(|first| {
                    first
                        .key()
                        .is_ok_and(|k| *k > log_id.index.to_be_bytes()[..])
                }),
                "no entry up to {log_id} is left once purged"
            );
            Ok::<_, StoreError>(())
        })
        .await
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
    census: Counted,
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
        let applied = Applied::of(store)?;
        let census = Counted(Arc::new(Mutex::new(Census::scan(store, &applied)?)));
        Ok(StateMachine {
            store: store.clone(),
            applied,
            dir,
            snapshots_built: Arc::default(),
            census,
        })
    }

    /// The census of what this state machine applies, for its node's gauges.
    pub fn census(&self) -> Counted {
        self.census.clone()
    }
}

/// Replaces the store's engine keyspaces with the snapshot in `file`; returns what is
/// applied then, and the census of what the store holds then.
fn load_snapshot(
    store: &Store,
    file: &Path,
    meta: &SnapshotMeta<u64, NodeAddr>,
) -> Result<(Applied, Census), StoreError> {
    store.apply(&[], &[(INSTALLING, Vec::new())])?;
    store.persist(Persist::Data)?;
    store.clear()?;
    let mut frames = SnapshotFrames::open(file)?;
    let _meta = frames.next()?;
    let mut changes = Vec::with_capacity(SNAPSHOT_BATCH);
    let mut wall_ms = 0;
    let mut census = Census::default();
    while let Some(frame) = frames.next()? {
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
            census.apply(&changes);
            changes.clear();
        }
    }
    let applied = Applied {
        log_id: meta.last_log_id,
        membership: meta.last_membership.clone(),
        wall_ms,
    };
    store.apply(&changes, &applied.meta())?;
    census.apply(&changes);
    census.set_membership(&applied);
    store.remove_meta(INSTALLING)?;
    store.persist(Persist::All)?;
    debug_assert!(
        store.meta(INSTALLING).ok().flatten().is_none(),
        "an install ends with its mark cleared"
    );
    debug_assert!(census.consistent(), "the census of an installed snapshot");
    Ok((applied, census))
}

/// What the state machine has applied, counted for the gauges: every stored task's
/// queue and state, per queue the tasks in each state and the ready ones in id order
/// (enqueue order: the oldest ready task is the first), and the membership. Kept as
/// entries are applied, from their changes (no read of the store); built by a scan of
/// the store when the node starts, and from the snapshot a node installs. It costs
/// about 30 bytes a task (and as much again a ready one), and a hash lookup per task
/// changed.
#[derive(Debug, Default)]
pub struct Census {
    /// Every stored task (by its id's bytes): its queue (an index of `queues`) and state.
    tasks: HashMap<[u8; 16], (u32, StoredState)>,
    /// Every queue seen, by index; a deleted one stays, not stored.
    queues: Vec<QueueCensus>,
    /// Queue name → index of `queues`.
    index: HashMap<String, u32>,
    /// The applied membership's nodes, true for voters.
    members: BTreeMap<u64, bool>,
}

/// One queue of the [`Census`].
#[derive(Debug)]
struct QueueCensus {
    name: String,
    /// The queue is stored (its series are published).
    stored: bool,
    /// Tasks per state, indexed by [`StoredState`].
    counts: [u64; TaskState::ALL.len()],
    /// The ready tasks.
    ready: BTreeSet<Ulid>,
}

/// The fields of a task record the census reads: the first three of `store::format`'s
/// `TaskHead`, in both formats (a format 2 record is postcard, whose fields are read in
/// order, so these three are read without the rest; a format 1 record is JSON, its other
/// fields skipped). `a_census_reads_what_the_store_writes` checks it against the store.
#[derive(Deserialize)]
struct Head<'a> {
    v: u32,
    #[serde(borrow)]
    queue: Cow<'a, str>,
    state: StoredState,
}

/// The queue and state of a stored task record of any format.
fn read_head(bytes: &[u8]) -> Result<Head<'_>, String> {
    let head: Head<'_> = if bytes.first() == Some(&b'{') {
        serde_json::from_slice(bytes).map_err(|e| e.to_string())?
    } else {
        postcard::take_from_bytes(bytes)
            .map_err(|e| e.to_string())?
            .0
    };
    if !(format::OLDEST_FORMAT..=format::FORMAT).contains(&head.v) {
        return Err(format!("a task record of format {}", head.v));
    }
    Ok(head)
}

impl Census {
    /// The census of what `store` holds, at `applied`.
    fn scan(store: &Store, applied: &Applied) -> Result<Census, StoreError> {
        let mut census = Census::default();
        for (name, _) in store.load_queues()? {
            let q = census.queue(&name);
            census.queues[q as usize].stored = true;
        }
        store.for_each_task(|id, task| {
            census.put(id.to_bytes(), Some((&task.queue, task.state.into())));
        })?;
        census.set_membership(applied);
        debug_assert!(census.consistent(), "the census of a scan");
        Ok(census)
    }

    /// The index of queue `name`, added if new.
    fn queue(&mut self, name: &str) -> u32 {
        if let Some(&q) = self.index.get(name) {
            return q;
        }
        let q = u32::try_from(self.queues.len()).expect("queue indexes fit in u32");
        self.queues.push(QueueCensus {
            name: name.to_owned(),
            stored: false,
            counts: [0; TaskState::ALL.len()],
            ready: BTreeSet::new(),
        });
        self.index.insert(name.to_owned(), q);
        debug_assert_eq!(
            self.index.len(),
            self.queues.len(),
            "every queue is indexed once by its name"
        );
        q
    }

    /// Task `id` is now in `task` (queue, state), or removed (`None`).
    fn put(&mut self, id: [u8; 16], task: Option<(&str, StoredState)>) {
        let new = task.map(|(queue, state)| (self.queue(queue), state));
        let old = match new {
            Some(new) => self.tasks.insert(id, new),
            None => self.tasks.remove(&id),
        };
        if let Some((q, state)) = old {
            let q = &mut self.queues[q as usize];
            debug_assert!(
                q.counts[state as usize] > 0,
                "a counted task is in its state's count"
            );
            q.counts[state as usize] = q.counts[state as usize].saturating_sub(1);
            if state == StoredState::Ready {
                let removed = q.ready.remove(&Ulid::from_bytes(id));
                debug_assert!(removed, "a task counted ready is in its queue's ready set");
            }
        }
        if let Some((q, state)) = new {
            let q = &mut self.queues[q as usize];
            q.counts[state as usize] += 1;
            if state == StoredState::Ready {
                let added = q.ready.insert(Ulid::from_bytes(id));
                debug_assert!(added, "a task is in one ready set at most once");
            }
        }
    }

    /// Counts the changes of an applied entry (or of a snapshot being installed).
    fn apply(&mut self, changes: &[Change]) {
        for change in changes {
            match change.space {
                Space::Queues => {
                    let name = String::from_utf8_lossy(&change.key);
                    let q = self.queue(&name);
                    self.queues[q as usize].stored = change.value.is_some();
                }
                Space::Tasks => {
                    let Ok(id) = <[u8; 16]>::try_from(change.key.as_slice()) else {
                        continue;
                    };
                    match change.value.as_deref().map(read_head).transpose() {
                        Ok(head) => self.put(id, head.as_ref().map(|h| (&*h.queue, h.state))),
                        Err(e) => {
                            // Written by this build's store: not expected. The task is
                            // left out of the counts rather than counted wrong.
                            tracing::warn!(
                                task = %Ulid::from_bytes(id),
                                error = e,
                                "a task record the gauges cannot read"
                            );
                            self.put(id, None);
                        }
                    }
                }
                _ => {}
            }
        }
        debug_assert!(
            self.consistent(),
            "the census after {} changes",
            changes.len()
        );
    }

    /// Whether the counts agree with the tasks: every task counted once, in its queue
    /// and state, and each queue's ready set its ready count. O(queues).
    fn consistent(&self) -> bool {
        let counted: u64 = self.queues.iter().flat_map(|q| q.counts).sum();
        counted == self.tasks.len() as u64
            && self.index.len() == self.queues.len()
            && self
                .queues
                .iter()
                .all(|q| q.ready.len() as u64 == q.counts[StoredState::Ready as usize])
    }

    /// The membership in force at `applied`.
    fn set_membership(&mut self, applied: &Applied) {
        let membership = applied.membership.membership();
        let voters: BTreeSet<u64> = membership.voter_ids().collect();
        self.members = membership
            .nodes()
            .map(|(&id, _)| (id, voters.contains(&id)))
            .collect();
        debug_assert_eq!(
            self.members.values().filter(|&&voter| voter).count(),
            voters.len(),
            "every voter is a node of its membership"
        );
    }

    /// Sets the task gauges of every stored queue, as the engine does for a node that
    /// serves: `muster_tasks{state}`, `muster_leases_in_flight` and
    /// `muster_oldest_ready_age_seconds` (by the oldest ready task's id, as the engine
    /// reads it, at the wall time `now_ms`).
    fn publish_tasks(&self, now_ms: u64) {
        for q in self.queues.iter().filter(|q| q.stored) {
            for state in TaskState::ALL {
                let count = q.counts[StoredState::from(state) as usize];
                metrics::gauge!("muster_tasks", "queue" => q.name.clone(), "state" => state.as_str())
                    .set(count as f64);
            }
            metrics::gauge!("muster_leases_in_flight", "queue" => q.name.clone())
                .set(q.counts[StoredState::Leased as usize] as f64);
            let age = q.ready.first().map_or(0.0, |id| {
                now_ms.saturating_sub(id.timestamp_ms()) as f64 / 1000.0
            });
            metrics::gauge!("muster_oldest_ready_age_seconds", "queue" => q.name.clone()).set(age);
        }
    }
}

/// A state machine's [`Census`], shared by the state machine (which keeps it as it
/// applies entries and installs snapshots) and the node that publishes its gauges.
#[derive(Clone)]
pub struct Counted(Arc<Mutex<Census>>);

impl Counted {
    fn lock(&self) -> MutexGuard<'_, Census> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Publishes what the state machine applied, once a second: always
    /// `muster_cluster_voters` (the voters of the applied membership); and unless the
    /// node is `serving` (its engine sets them), the task gauges of every queue
    /// ([`Census::publish_tasks`]): a follower exports the same queue depths as its
    /// leader, as far as it has applied. Held-back and unclaimable tasks, and members,
    /// are the serving leader's alone: they describe dispatch, which only it does.
    pub fn publish_gauges(&self, serving: bool) {
        let census = self.lock();
        let voters = census.members.values().filter(|&&voter| voter).count();
        metrics::gauge!("muster_cluster_voters").set(voters as f64);
        if !serving {
            let now_ms = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            census.publish_tasks(now_ms);
        }
    }

    /// The nodes of the membership the state machine applied last, true for voters.
    pub fn members(&self) -> BTreeMap<u64, bool> {
        self.lock().members.clone()
    }
}

/// The meta of the snapshot in `file`: its first frame.
fn read_meta(file: &Path) -> Result<SnapshotMeta<u64, NodeAddr>, StoreError> {
    match SnapshotFrames::open(file)?.next()? {
        Some(frame) => decode(&frame, "snapshot meta"),
        None => Err(StoreError::Corrupt {
            what: "snapshot file".into(),
            detail: "empty".into(),
        }),
    }
}

/// Bytes of a snapshot file read at a time.
const SNAPSHOT_READ: usize = 64 * 1024;

/// The frames of a snapshot file, read through the protocol's [`FrameReader`] with
/// [`MAX_SNAPSHOT_FRAME`] as its limit. Its frames are postcard, never empty; an empty
/// one is left to postcard to refuse, as a corrupt frame.
struct SnapshotFrames {
    file: std::fs::File,
    frames: FrameReader,
    chunk: Vec<u8>,
}

impl SnapshotFrames {
    fn open(file: &Path) -> Result<SnapshotFrames, StoreError> {
        Ok(SnapshotFrames {
            file: std::fs::File::open(file).map_err(fjall::Error::from)?,
            frames: FrameReader::with_limit(MAX_SNAPSHOT_FRAME).allowing_empty(),
            chunk: vec![0; SNAPSHOT_READ],
        })
    }

    /// The next frame's bytes; `None` at the end of the file, where a frame ended.
    fn next(&mut self) -> Result<Option<Vec<u8>>, StoreError> {
        let corrupt = |detail: String| StoreError::Corrupt {
            what: "snapshot file".into(),
            detail,
        };
        loop {
            match self.frames.next_frame() {
                Ok(Some(frame)) => {
                    debug_assert!(
                        frame.len() <= MAX_SNAPSHOT_FRAME,
                        "a frame within the limit"
                    );
                    return Ok(Some(frame));
                }
                Ok(None) => {}
                Err(FrameError::TooLarge { len, .. }) => {
                    return Err(corrupt(format!("a frame of {len} bytes")));
                }
                Err(e @ FrameError::Empty) => {
                    unreachable!("a snapshot's frame reader takes empty bodies: {e}")
                }
            }
            let got = match self.file.read(&mut self.chunk) {
                Ok(got) => got,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(fjall::Error::from(e).into()),
            };
            if got == 0 {
                return match self.frames.wants() {
                    Wants::Header(_) if !self.frames.in_frame() => Ok(None),
                    Wants::Header(missing) => Err(corrupt(format!(
                        "a cut frame: {} of its header's {HEADER_LEN} bytes",
                        HEADER_LEN - missing
                    ))),
                    Wants::Body { len, missing } => Err(corrupt(format!(
                        "a cut frame: {} of its {len} bytes",
                        len - missing
                    ))),
                    Wants::Nothing => {
                        unreachable!("next_frame returned neither a frame nor an error")
                    }
                };
            }
            self.frames.push(&self.chunk[..got]);
        }
    }
}

fn write_frame(writer: &mut impl Write, value: &impl Serialize) -> std::io::Result<()> {
    let bytes = encode(value);
    debug_assert!(
        bytes.len() <= MAX_SNAPSHOT_FRAME,
        "a snapshot frame of {} bytes, over what a reader takes",
        bytes.len()
    );
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
        assert!(
            applied.membership.log_id() <= &last,
            "the membership in force ({:?}) was applied by {last:?}",
            applied.membership.log_id()
        );
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

/// Applies committed entries to the store after `applied`, in order, keeping the
/// census: what is applied then, and each entry's fate. Blocking (fjall).
fn apply_entries(
    store: &Store,
    census: &Counted,
    mut last: Applied,
    entries: Vec<Entry<Muster>>,
) -> Result<(Applied, Vec<Fate>), (LogId<u64>, StoreError)> {
    let (count, last_id) = (entries.len(), entries.last().map(|e| e.log_id));
    let mut replies = Vec::with_capacity(count);
    for entry in entries {
        let log_id = entry.log_id;
        let (applied, fate) = apply_entry(store, census, &last, entry).map_err(|e| (log_id, e))?;
        last = applied;
        replies.push(fate);
    }
    assert_eq!(replies.len(), count, "one fate for each entry applied");
    assert!(
        last_id.is_none_or(|id| last.log_id == Some(id)),
        "the applied position is the last entry's"
    );
    Ok((last, replies))
}

/// Applies one committed entry, the next after `last`, to the store and the census:
/// what is applied then, and the entry's fate. Blocking (fjall).
fn apply_entry(
    store: &Store,
    census: &Counted,
    last: &Applied,
    entry: Entry<Muster>,
) -> Result<(Applied, Fate), StoreError> {
    let log_id = entry.log_id;
    // Applied once each, in order: the store's applied position only moves on.
    if let Some(previous) = last.log_id {
        assert!(
            log_id.index > previous.index,
            "{log_id} applied after {previous}"
        );
        assert!(
            log_id.leader_id.term >= previous.leader_id.term,
            "{log_id} of an older term applied after {previous}"
        );
    }
    let mut applied = last.clone();
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
        EntryPayload::Normal(round) => {
            // An engine's round is proposed in the term it was built in: only
            // a later leader's log can hold it in another term.
            assert!(
                round.term < log_id.leader_id.term,
                "a round of term {} in {log_id}",
                round.term
            );
            store.apply(&[], &applied.meta())?;
            return Ok((applied, Fate::Fenced));
        }
    };
    store.apply(&changes, &applied.meta())?;
    let mut counted = census.lock();
    counted.apply(&changes);
    if applied.membership.log_id() != last.membership.log_id() {
        counted.set_membership(&applied);
    }
    drop(counted);
    assert!(
        applied.membership.log_id() <= &applied.log_id,
        "the membership in force ({:?}) was applied by {log_id}",
        applied.membership.log_id()
    );
    Ok((applied, Fate::Written))
}

impl RaftStateMachine<Muster> for StateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(
        &mut self,
    ) -> StorageResult<(Option<LogId<u64>>, StoredMembership<u64, NodeAddr>)> {
        Ok((self.applied.log_id, self.applied.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> StorageResult<Vec<Fate>>
    where
        I: IntoIterator<Item = Entry<Muster>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry<Muster>> = entries.into_iter().collect();
        let (store, census) = (self.store.clone(), self.census.clone());
        let applied = self.applied.clone();
        let (applied, replies) = blocking(move || apply_entries(&store, &census, applied, entries))
            .await
            .map_err(|(log_id, e)| StorageIOError::apply(log_id, &e))?;
        assert!(
            applied.log_id >= self.applied.log_id,
            "the applied position never goes back ({:?} after {:?})",
            applied.log_id,
            self.applied.log_id
        );
        self.applied = applied;
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
        // openraft installs only a snapshot past what is committed here (so past what is
        // applied): checked before the store is touched.
        assert!(
            meta.last_log_id >= self.applied.log_id,
            "a snapshot older than what is applied is never installed ({:?} after {:?})",
            meta.last_log_id,
            self.applied.log_id
        );
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
        let (applied, census) = blocking(move || {
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
        assert!(
            applied.log_id >= self.applied.log_id,
            "a snapshot installed never takes the applied position back ({:?} after {:?})",
            applied.log_id,
            self.applied.log_id
        );
        self.applied = applied;
        *self.census.lock() = census;
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
    use crate::store::HeldRound;

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

    fn open(dir: &Path) -> ((Store, HeldRound), LogStore, StateMachine) {
        let (store, round) = Store::open_clustered(&dir.join("store"), 8 << 20).unwrap();
        let log = LogStore::open(&store, Persist::Os).unwrap();
        let machine = StateMachine::open(&store, dir).unwrap();
        ((store, round), log, machine)
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

    fn task(queue: &str, state: TaskState) -> crate::store::TaskRecord {
        crate::store::TaskRecord {
            queue: queue.into(),
            state,
            priority: 0,
            key: None,
            requires: vec![],
            limits: vec![],
            group: None,
            not_before_ms: None,
            idempotency_key: None,
            deliveries: 0,
            failures: 0,
            lease: None,
            cancel_requested: false,
            progress: None,
            result: None,
            last_error: None,
            dead_reason: None,
            suspension: None,
            resumed: None,
            parent: None,
            traceparent: None,
            tracestate: None,
            created_ms: 1,
            updated_ms: 1,
            finished_ms: None,
            history: vec![],
            enqueued_by: None,
            stored_bytes: 0,
        }
    }

    /// Per stored queue: its tasks per state (in `TaskState::ALL`'s order) and the
    /// oldest ready task.
    fn summary(census: &Census) -> BTreeMap<String, (Vec<u64>, Option<Ulid>)> {
        census
            .queues
            .iter()
            .filter(|q| q.stored)
            .map(|q| {
                let counts = TaskState::ALL
                    .iter()
                    .map(|&s| q.counts[StoredState::from(s) as usize])
                    .collect();
                (q.name.clone(), (counts, q.ready.first().copied()))
            })
            .collect()
    }

    /// Commits a leader's round of `writes` through the store's batches and applies
    /// it as entry `index`.
    async fn apply_round(
        (store, held): (&Store, &HeldRound),
        machine: &mut StateMachine,
        index: u64,
        writes: impl FnOnce(&mut crate::store::Batch),
    ) {
        let made = make_round(store, held, writes);
        apply_made(held, machine, index, made).await;
    }

    /// Commits a leader's round of `writes` through the store's batches and takes it:
    /// its number and changes, held until applied.
    fn make_round(
        store: &Store,
        held: &HeldRound,
        writes: impl FnOnce(&mut crate::store::Batch),
    ) -> (u64, Vec<Change>) {
        let mut batch = store.batch();
        writes(&mut batch);
        batch.commit().unwrap();
        held.take()
    }

    /// Applies a round made by [`make_round`] as entry `index`.
    async fn apply_made(
        held: &HeldRound,
        machine: &mut StateMachine,
        index: u64,
        (number, changes): (u64, Vec<Change>),
    ) {
        let round = Round {
            term: 1,
            wall_ms: 1_000 * index,
            changes,
        };
        let applied = machine
            .apply([Entry {
                log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
                payload: EntryPayload::Normal(round),
            }])
            .await
            .unwrap();
        assert_eq!(applied, vec![Fate::Written]);
        held.applied(number);
    }

    #[tokio::test]
    async fn rounds_in_flight_read_as_made_until_each_is_applied() {
        use TaskState::{Leased, Ready};
        use muster_protocol::model::QueueOptions;

        let dir = tempfile::tempdir().unwrap();
        let ((store, held), _, mut machine) = open(dir.path());
        let ids: Vec<Ulid> = (1..=2).map(|n| Ulid::from_parts(n, 7)).collect();
        let queue = crate::store::QueueRecord::new(QueueOptions::default(), 1);
        let state = |id| store.task(id).unwrap().map(|t| t.state);
        let first = make_round(&store, &held, |b| {
            b.put_queue("jobs", &queue);
            b.put_task(ids[0], &task("jobs", Ready));
            b.put_task(ids[1], &task("jobs", Ready));
        });
        // Made while the first is being agreed on: it reads the first's changes.
        assert_eq!(state(ids[1]), Some(Ready));
        let second = make_round(&store, &held, |b| {
            b.put_task(ids[0], &task("jobs", Leased));
            b.remove_task(ids[1], "jobs", None);
        });
        assert_eq!((first.0, second.0), (0, 1), "rounds are numbered as taken");
        assert_eq!((state(ids[0]), state(ids[1])), (Some(Leased), None));

        // The first applied: what the second changed still reads as the second left
        // it, not as fjall now holds it (task 1 ready there).
        apply_made(&held, &mut machine, 1, first).await;
        assert_eq!((state(ids[0]), state(ids[1])), (Some(Leased), None));
        let view = store.view();
        assert!(
            view.get(Space::Tasks, &ids[1].to_bytes())
                .unwrap()
                .is_some()
        );

        // Both applied: fjall holds what the reads saw all along.
        apply_made(&held, &mut machine, 2, second).await;
        assert_eq!((state(ids[0]), state(ids[1])), (Some(Leased), None));
        assert!(
            store
                .view()
                .get(Space::Tasks, &ids[1].to_bytes())
                .unwrap()
                .is_none()
        );
    }

    #[tokio::test]
    async fn a_census_reads_what_the_store_writes() {
        use TaskState::{Done, Leased, Ready, Suspended};
        use muster_protocol::model::QueueOptions;

        let dir = tempfile::tempdir().unwrap();
        let ((store, round), _, mut machine) = open(dir.path());
        let ids: Vec<Ulid> = (1..=4).map(|n| Ulid::from_parts(n, 7)).collect();
        let queue = crate::store::QueueRecord::new(QueueOptions::default(), 1);
        apply_round((&store, &round), &mut machine, 1, |b| {
            b.put_queue("jobs", &queue);
            b.put_queue("idle", &queue);
            b.put_task(ids[0], &task("jobs", Ready));
            b.put_task(ids[1], &task("jobs", Ready));
            b.put_task(ids[2], &task("jobs", Leased));
            b.put_task(ids[3], &task("jobs", Done));
        })
        .await;
        let counted = summary(&machine.census.lock());
        //                  scheduled ready leased suspended done dead cancelled
        assert_eq!(counted["jobs"], (vec![0, 2, 1, 0, 1, 0, 0], Some(ids[0])));
        assert_eq!(counted["idle"], (vec![0; 7], None));

        // The oldest ready task leased, the done one removed, a queue deleted.
        apply_round((&store, &round), &mut machine, 2, |b| {
            b.put_task(ids[0], &task("jobs", Leased));
            b.put_task(ids[2], &task("jobs", Suspended));
            b.remove_task(ids[3], "jobs", None);
            b.remove_queue("idle");
        })
        .await;
        let counted = summary(&machine.census.lock());
        assert_eq!(
            counted,
            BTreeMap::from([("jobs".to_owned(), (vec![0, 1, 1, 1, 0, 0, 0], Some(ids[1])))])
        );
        // What was counted entry by entry is what a scan of the store finds.
        let scanned = Census::scan(&store, &Applied::of(&store).unwrap()).unwrap();
        assert_eq!(summary(&scanned), counted);

        // And what a node that installs a snapshot of it counts.
        let snapshot = machine
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        let to = tempfile::tempdir().unwrap();
        let (_, _, mut other) = open(to.path());
        let mut receiving = other.begin_receiving_snapshot().await.unwrap();
        let bytes = std::fs::read(dir.path().join(SNAPSHOT_DIR).join(CURRENT)).unwrap();
        tokio::io::AsyncWriteExt::write_all(&mut *receiving, &bytes)
            .await
            .unwrap();
        other
            .install_snapshot(&snapshot.meta, receiving)
            .await
            .unwrap();
        assert_eq!(summary(&other.census.lock()), counted);

        // A format 1 record (JSON) reads too; a record of a newer format does not.
        let old = read_head(br#"{"v":1,"queue":"old","state":"dead","priority":3}"#).unwrap();
        assert_eq!((&*old.queue, old.state), ("old", StoredState::Dead));
        let newer = format!(
            r#"{{"v":{},"queue":"q","state":"ready"}}"#,
            format::FORMAT + 1
        );
        assert!(read_head(newer.as_bytes()).is_err());
    }

    #[test]
    fn a_snapshot_file_ends_cleanly_only_between_frames() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("frames");
        let mut whole = Vec::new();
        write_frame(&mut whole, &"first").unwrap();
        write_frame(&mut whole, &vec![7u8; 3 * SNAPSHOT_READ]).unwrap();
        let read_all = |bytes: &[u8]| {
            std::fs::write(&file, bytes).unwrap();
            let mut frames = SnapshotFrames::open(&file).unwrap();
            let mut got = Vec::new();
            loop {
                match frames.next() {
                    Ok(Some(frame)) => got.push(frame),
                    Ok(None) => return Ok(got),
                    Err(StoreError::Corrupt { detail, .. }) => return Err((got, detail)),
                    Err(e) => panic!("{e}"),
                }
            }
        };
        let frames = read_all(&whole).unwrap();
        assert_eq!(frames.len(), 2);
        assert_eq!(decode::<String>(&frames[0], "first").unwrap(), "first");
        assert_eq!(
            decode::<Vec<u8>>(&frames[1], "second").unwrap(),
            vec![7u8; 3 * SNAPSHOT_READ]
        );
        assert_eq!(read_all(&[]).unwrap(), Vec::<Vec<u8>>::new());

        // Cut in a body, or in a header: corrupt, after the frames before it.
        let first = frames[0].clone();
        let body = 3 * SNAPSHOT_READ + 3; // postcard's length prefix, then the bytes
        assert_eq!(frames[1].len(), body);
        let second = 4 + first.len();
        assert_eq!(
            read_all(&whole[..whole.len() - 1]),
            Err((
                vec![first.clone()],
                format!("a cut frame: {} of its {body} bytes", body - 1)
            ))
        );
        assert_eq!(
            read_all(&whole[..second + 3]),
            Err((
                vec![first.clone()],
                "a cut frame: 3 of its header's 4 bytes".into()
            ))
        );

        // A frame over the limit is refused by its header.
        let mut large = whole[..second].to_vec();
        large.extend_from_slice(&(MAX_SNAPSHOT_FRAME as u32 + 1).to_be_bytes());
        large.extend_from_slice(&[0; 16]);
        assert_eq!(
            read_all(&large),
            Err((
                vec![first.clone()],
                format!("a frame of {} bytes", MAX_SNAPSHOT_FRAME + 1)
            ))
        );

        // An empty frame is read as one; its decoder refuses it.
        let mut empty = whole[..second].to_vec();
        empty.extend_from_slice(&0u32.to_be_bytes());
        assert_eq!(read_all(&empty).unwrap(), vec![first, Vec::new()]);
    }

    #[tokio::test]
    async fn a_round_of_another_term_is_not_applied() {
        let dir = tempfile::tempdir().unwrap();
        let ((store, _), _, mut machine) = open(dir.path());
        let replies = machine
            .apply([entry(3, 1, 3, b"kept"), entry(4, 2, 3, b"fenced")])
            .await
            .unwrap();
        assert_eq!(replies, vec![Fate::Written, Fate::Fenced]);
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
        let ((store, _), _, mut other) = open(to.path());
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
        // The node's handle on the census sees what the install counted.
        assert_eq!(other.census().members(), BTreeMap::from([(1, true)]));
        assert_eq!(Applied::of(&store).unwrap().wall_ms, 3_000);
        assert_eq!(store.meta(INSTALLING).unwrap(), None);
    }
}
