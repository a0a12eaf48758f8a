//! The durable record: the only module that touches fjall, but for the raft log
//! keyspaces of a cluster node (`cluster::storage`).
//!
//! One fjall `Database` with nine keyspaces, all written through [`Batch`]es so each
//! request's changes land atomically:
//!
//! | keyspace   | key                          | value                           |
//! |------------|------------------------------|---------------------------------|
//! | `queues`   | queue name                   | [`QueueRecord`] as JSON         |
//! | `tasks`    | task id, 16 bytes big-endian | [`TaskRecord`], binary (postcard) |
//! | `payloads` | task id, 16 bytes big-endian | the payload's raw JSON bytes    |
//! | `idem`     | queue name, 0x00, idem key   | task id, 16 bytes big-endian    |
//! | `owners`   | member name                  | the owning principal's name     |
//! | `limits`   | limit name                   | [`LimitRecord`] as JSON         |
//! | `limits`   | limit name, 0x00, key        | a throttle's end, wall ms, decimal |
//! | `meta`     | `format`                     | the store's format, decimal     |
//! | `output`   | 0x00, task id                | [`OutputMeta`], 32 bytes         |
//! | `output`   | 0x01, task id, first number (8 bytes big-endian) | one emit's chunks: count and bytes (4 bytes big-endian each), wall ms (8), a JSON array of chunks |
//! | `schedules` | schedule name               | [`ScheduleRecord`] as JSON      |
//!
//! Records are written through the store's own types (`format`), each carrying its
//! format version; the store's format is checked when it is opened: a store of a newer
//! format is refused with a message saying so, and an older one is read as it is (its
//! records are rewritten in the current format as they change).
//!
//! Payloads live apart from task records because they never change: a lease, renewal or
//! settle rewrites the small record, not a payload of up to 1 MiB.
//!
//! The journal is persisted by hand ([`Store::persist`]): the engine commits every
//! request's batch without syncing and syncs once per round, which is group commit.
//!
//! On a cluster node ([`Store::open_clustered`]) batches are held back as the leader's
//! round instead, and reach fjall only through [`Store::apply`] once the cluster agreed
//! on them; `meta` then also holds the raft state machine's keys (`cluster::storage`).

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

pub mod format;
mod torn_tail;

use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode};
use serde::{Deserialize, Serialize};
use ulid::Ulid;

use muster_protocol::RawJson;
use muster_protocol::model::{LimitSpec, NewTask, QueueOptions, TaskState, TimelineEvent};

/// The key of the store's format in the `meta` keyspace.
const FORMAT_KEY: &[u8] = b"format";

/// Records the start-up scan decodes before handing them over to be indexed.
pub(crate) const SCAN_BATCH: usize = 4096;

/// Decoded batches the start-up scan keeps ready at most (memory: a few MiB).
const SCAN_QUEUE: usize = 4;

/// Largest memtable of a keyspace before it is flushed to disk.
const MEMTABLE_BYTES: u64 = 16 * 1024 * 1024;

/// Most journal bytes kept before fjall flushes the keyspaces that hold the oldest
/// journal back (the small ones: queues, owners, meta); fjall's least. A start replays
/// the journal entry by entry into memtables: at fjall's default of 512 MiB a start
/// after 1,000,000 enqueues replayed all of them, about three quarters of a 10 s start,
/// and the memtables it refilled stayed resident.
const JOURNAL_BYTES: u64 = 64 * 1024 * 1024;

/// How far [`Store::persist`] takes what was committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Persist {
    /// Handed to the operating system: survives a daemon crash, not a power loss.
    Os,
    /// On disk (`fdatasync`): survives a power loss.
    Data,
    /// On disk with metadata (`fsync`), for shutdown.
    All,
}

/// A failure of the store. Every one of them stops the daemon: a write that may not
/// have landed must never be acknowledged, and fjall refuses further writes anyway.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// fjall reported an error (I/O, fsync, corruption).
    #[error("store: {0}")]
    Fjall(#[source] fjall::Error),
    /// fjall takes no more writes because one of its own writes failed earlier: its
    /// flush or compaction workers write tables in the background, and their error
    /// reaches the log, not the caller.
    #[error(
        "store: fjall takes no more writes after one of its background writes (a flush or compaction) failed; the log line before this one says why"
    )]
    Poisoned,
    /// The store was written by a newer musterd.
    #[error(
        "store: {dir} has format {found}, written by a newer musterd; this one reads formats {oldest} to {newest}"
    )]
    NewerFormat {
        /// The store's directory.
        dir: String,
        /// The format found.
        found: u32,
        /// The oldest format this build reads.
        oldest: u32,
        /// The newest format this build reads.
        newest: u32,
    },
    /// A stored record does not decode: the store is corrupt or from another version.
    #[error("store: corrupt record {what}: {detail}")]
    Corrupt {
        /// Which record.
        what: String,
        /// The decode error.
        detail: String,
    },
}

impl From<fjall::Error> for StoreError {
    fn from(e: fjall::Error) -> StoreError {
        match e {
            fjall::Error::Poisoned => StoreError::Poisoned,
            e => StoreError::Fjall(e),
        }
    }
}

/// A limit as stored (on disk as a [`format::StoredLimit`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "format::StoredLimit", try_from = "format::StoredLimit")]
pub struct LimitRecord {
    /// Its settings, the burst filled in when it has a rate.
    pub spec: LimitSpec,
    /// When it was created.
    pub created_ms: u64,
    /// When its settings last changed.
    pub updated_ms: u64,
}

/// A schedule as stored (on disk as a [`format::StoredSchedule`]): its settings, where
/// its fires have got to, and what they did.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(into = "format::StoredSchedule", try_from = "format::StoredSchedule")]
pub struct ScheduleRecord {
    /// Its cron pattern, as given.
    pub cron: String,
    /// The IANA time zone the pattern is read in.
    pub tz: String,
    /// The queue its tasks go to.
    pub queue: String,
    /// The task each fire enqueues (no idempotency key, no `not_before_ms`).
    pub task: muster_protocol::model::NewTask,
    /// What it does with missed fires.
    pub catch_up: muster_protocol::model::CatchUp,
    /// True while paused.
    pub paused: bool,
    /// Every time of the pattern at or before this (wall ms) was dealt with: fired,
    /// missed, or passed while paused. The next fire is the pattern's first time after it.
    pub cursor_ms: u64,
    /// The time of its last fire that enqueued a task.
    pub last_fire_ms: Option<u64>,
    /// The task its last fire or run enqueued.
    pub last_task: Option<String>,
    /// Fires that enqueued a task (or found it enqueued).
    pub fires: u64,
    /// Tasks `schedule_run` enqueued.
    pub runs: u64,
    /// Fires missed and skipped.
    pub missed: u64,
    /// Fires whose task could not be enqueued.
    pub failures: u64,
    /// Why the last failed fire failed.
    pub last_error: Option<String>,
    /// The principal that set it (its tasks count against that principal's quota).
    pub owner: Option<String>,
    /// When it was created.
    pub created_ms: u64,
    /// When its settings last changed.
    pub updated_ms: u64,
}

/// A limit a task draws on, as stored: its cost filled in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskLimit {
    /// The limit's name.
    pub limit: String,
    /// The key it draws on (a per-key limit's bucket); `None` for the keyless one.
    pub key: Option<String>,
    /// Tokens a lease takes.
    pub cost: u64,
}

/// A queue as stored (on disk as a [`format::StoredQueue`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(into = "format::StoredQueue", try_from = "format::StoredQueue")]
pub struct QueueRecord {
    /// The queue's options.
    pub options: QueueOptions,
    /// When the queue was created.
    pub created_ms: u64,
}

impl QueueRecord {
    /// A queue record of the current format.
    pub fn new(options: QueueOptions, created_ms: u64) -> Self {
        QueueRecord {
            options,
            created_ms,
        }
    }
}

/// A lease as stored. Its deadline is wall-clock time for display and for restarts;
/// the engine keeps its own monotonic deadline in memory.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LeaseRecord {
    /// The holding member ("" for anonymous claims).
    pub member: String,
    /// The lease epoch (the delivery number that granted it).
    pub epoch: u64,
    /// When the lease lapses unless renewed.
    pub expires_ms: u64,
    /// When this delivery was granted (bounds renewals under `max_runtime`).
    pub granted_ms: u64,
}

/// A suspended task's suspension, as stored: what people see, and the digest of its
/// resume token's secret (the token itself is never stored).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SuspensionRecord {
    /// What people see of it.
    pub info: muster_protocol::model::SuspensionInfo,
    /// SHA-256 of the token's secret part.
    pub token_digest: [u8; 32],
}

/// A child task's link to the task that spawned it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParentLink {
    /// The parent's id.
    pub id: Ulid,
    /// The child's key among its parent's children.
    pub child_key: String,
    /// Spawns between it and the first task of its family that is no child (1 for a
    /// child of such a task).
    pub depth: u8,
}

/// What a task's record holds besides its payload, result and progress (its fields,
/// timeline, last error and index entries), as its stored-bytes quota counts it.
pub const TASK_RECORD_BYTES: u64 = 1024;

/// A task as stored, without its payload (on disk in the form `format` gives it).
#[derive(Debug, Clone)]
pub struct TaskRecord {
    /// The task's queue.
    pub queue: String,
    /// Its state.
    pub state: TaskState,
    /// Its priority.
    pub priority: u8,
    /// Its key.
    pub key: Option<String>,
    /// Labels a holder must carry.
    pub requires: Vec<String>,
    /// The limits it draws on.
    pub limits: Vec<TaskLimit>,
    /// Its group for fair dispatch.
    pub group: Option<String>,
    /// When a scheduled task becomes ready.
    pub not_before_ms: Option<u64>,
    /// Its idempotency key.
    pub idempotency_key: Option<String>,
    /// Leases granted so far; also the epoch of the latest lease.
    pub deliveries: u64,
    /// Failures since enqueue or the last redrive.
    pub failures: u64,
    /// The current lease, while leased.
    pub lease: Option<LeaseRecord>,
    /// A cancel was asked while leased.
    pub cancel_requested: bool,
    /// The last progress checkpoint.
    pub progress: Option<RawJson>,
    /// The ack's result.
    pub result: Option<RawJson>,
    /// The last error.
    pub last_error: Option<String>,
    /// Why it is dead.
    pub dead_reason: Option<String>,
    /// Its suspension, exactly while suspended.
    pub suspension: Option<SuspensionRecord>,
    /// How its last suspension ended, until its next suspension.
    pub resumed: Option<muster_protocol::model::Resumed>,
    /// The task that spawned it, if it is a child.
    pub parent: Option<ParentLink>,
    /// The W3C trace context it was enqueued with.
    pub traceparent: Option<String>,
    /// Its `tracestate`.
    pub tracestate: Option<String>,
    /// When it was enqueued.
    pub created_ms: u64,
    /// When it last changed.
    pub updated_ms: u64,
    /// When it finished (done or cancelled), for retention.
    pub finished_ms: Option<u64>,
    /// Its timeline.
    pub history: Vec<TimelineEvent>,
    /// The principal that enqueued it (with tokens), for its stored-bytes quota.
    pub enqueued_by: Option<String>,
    /// What it stores, counted against that principal's quota: its payload, result and
    /// progress checkpoint, and [`TASK_RECORD_BYTES`] for the rest of its record (on
    /// disk as format 1's `payload_bytes`; records written before results and progress
    /// counted hold their payload's length only, until they are next written).
    pub stored_bytes: u64,
}

/// The fields of a task record the engine's index needs, read at start-up without
/// the rest (history, progress, result are skipped, not built).
#[derive(Debug)]
pub struct TaskIndex {
    /// The task's queue.
    pub queue: String,
    /// Its state.
    pub state: TaskState,
    /// Its priority.
    pub priority: u8,
    /// Its key.
    pub key: Option<String>,
    /// Labels a holder must carry.
    pub requires: Vec<String>,
    /// The limits it draws on.
    pub limits: Vec<TaskLimit>,
    /// Its group for fair dispatch.
    pub group: Option<String>,
    /// When a scheduled task becomes ready.
    pub not_before_ms: Option<u64>,
    /// When a suspended task's timeout acts.
    pub timeout_at_ms: Option<u64>,
    /// The task that spawned it and its key among that task's children, if a child.
    pub parent: Option<(Ulid, String)>,
    /// Leases granted so far.
    pub deliveries: u64,
    /// The current lease, while leased.
    pub lease: Option<LeaseRecord>,
    /// When it finished.
    pub finished_ms: Option<u64>,
    /// The principal that enqueued it.
    pub enqueued_by: Option<String>,
    /// What it stores, counted against that principal's quota.
    pub stored_bytes: u64,
}

/// What the engine indexes of a task, borrowed from a full record or a [`TaskIndex`].
#[derive(Debug, Clone, Copy)]
pub struct IndexView<'a> {
    /// The task's queue.
    pub queue: &'a str,
    /// Its state.
    pub state: TaskState,
    /// Its priority.
    pub priority: u8,
    /// Its key.
    pub key: Option<&'a str>,
    /// Labels a holder must carry.
    pub requires: &'a [String],
    /// The limits it draws on.
    pub limits: &'a [TaskLimit],
    /// Its group for fair dispatch.
    pub group: Option<&'a str>,
    /// When a scheduled task becomes ready.
    pub not_before_ms: Option<u64>,
    /// When a suspended task's timeout acts.
    pub timeout_at_ms: Option<u64>,
    /// The task that spawned it and its key among that task's children, if a child.
    pub parent: Option<(Ulid, &'a str)>,
    /// Leases granted so far.
    pub deliveries: u64,
    /// The current lease, while leased.
    pub lease: Option<&'a LeaseRecord>,
    /// When it finished.
    pub finished_ms: Option<u64>,
}

impl TaskRecord {
    /// A task as enqueued at `now_ms` into `queue` by `owner`: ready, or scheduled until
    /// `not_before_ms` (a time after now) when given; nothing in its timeline yet.
    pub fn new(
        queue: &str,
        task: &NewTask,
        not_before_ms: Option<u64>,
        owner: Option<&str>,
        now_ms: u64,
    ) -> TaskRecord {
        assert!(
            not_before_ms.is_none_or(|nb| nb > now_ms),
            "a scheduled task is due after now"
        );
        TaskRecord {
            queue: queue.to_owned(),
            state: match not_before_ms {
                Some(_) => TaskState::Scheduled,
                None => TaskState::Ready,
            },
            priority: task.priority.unwrap_or(0),
            key: task.key.clone(),
            requires: task.requires.clone(),
            limits: task
                .limits
                .iter()
                .map(|l| TaskLimit {
                    limit: l.limit.clone(),
                    key: l.key.clone(),
                    cost: l.cost.unwrap_or(1),
                })
                .collect(),
            group: task.group.clone(),
            not_before_ms,
            idempotency_key: task.idempotency_key.clone(),
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
            traceparent: task.traceparent.clone(),
            tracestate: task.tracestate.clone(),
            created_ms: now_ms,
            updated_ms: now_ms,
            finished_ms: None,
            history: Vec::new(),
            enqueued_by: owner.map(str::to_owned),
            stored_bytes: task.payload.get().len() as u64 + TASK_RECORD_BYTES,
        }
    }

    /// The indexed fields.
    pub fn view(&self) -> IndexView<'_> {
        IndexView {
            queue: &self.queue,
            state: self.state,
            priority: self.priority,
            key: self.key.as_deref(),
            requires: &self.requires,
            limits: &self.limits,
            group: self.group.as_deref(),
            not_before_ms: self.not_before_ms,
            timeout_at_ms: self.suspension.as_ref().map(|s| s.info.timeout_at_ms),
            parent: self.parent.as_ref().map(|p| (p.id, p.child_key.as_str())),
            deliveries: self.deliveries,
            lease: self.lease.as_ref(),
            finished_ms: self.finished_ms,
        }
    }
}

impl TaskIndex {
    /// The indexed fields.
    pub fn view(&self) -> IndexView<'_> {
        IndexView {
            queue: &self.queue,
            state: self.state,
            priority: self.priority,
            key: self.key.as_deref(),
            requires: &self.requires,
            limits: &self.limits,
            group: self.group.as_deref(),
            not_before_ms: self.not_before_ms,
            timeout_at_ms: self.timeout_at_ms,
            parent: self.parent.as_ref().map(|(id, key)| (*id, key.as_str())),
            deliveries: self.deliveries,

            lease: self.lease.as_ref(),
            finished_ms: self.finished_ms,
        }
    }
}

/// A keyspace the engine writes: what a cluster's log entries and snapshots name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Space {
    /// `meta`.
    Meta,
    /// `owners`.
    Owners,
    /// `queues`.
    Queues,
    /// `tasks`.
    Tasks,
    /// `payloads`.
    Payloads,
    /// `idem`.
    Idem,
    /// `limits`.
    Limits,
    /// `output`.
    Output,
    /// `schedules`.
    Schedules,
}

impl Space {
    /// Every keyspace of the engine's state, in the order a copy writes them.
    pub const ALL: [Space; 9] = [
        Space::Meta,
        Space::Owners,
        Space::Queues,
        Space::Limits,
        Space::Tasks,
        Space::Payloads,
        Space::Idem,
        Space::Output,
        Space::Schedules,
    ];
}

/// One change to the store: `value` written at `key`, or the key removed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    /// The keyspace.
    pub space: Space,
    /// The key.
    pub key: Vec<u8>,
    /// The new value; `None` removes the key.
    pub value: Option<Vec<u8>>,
}

impl Change {
    /// Bytes the change carries (its key and value), for bounding a round.
    pub fn bytes(&self) -> usize {
        self.key.len() + self.value.as_ref().map_or(0, Vec::len)
    }
}

/// The daemon's fjall database. Clones share it.
#[derive(Clone)]
pub struct Store {
    db: Database,
    ks: Arc<Keyspaces>,
    /// On a cluster node: the changes of the leader's current round, held back until
    /// the cluster agrees on them (and readable meanwhile); `None` on a single daemon,
    /// whose batches go straight to fjall.
    held: Option<Arc<Mutex<Held>>>,
}

/// A cluster leader's round in the making, held back by a clustered store: the leader
/// takes it ([`HeldRound::take`]) to propose it, and reads see what it changed until
/// it is applied ([`HeldRound::applied`]). The store's own handle writes and reads it;
/// this one, returned by [`Store::open_clustered`], belongs to the leader.
#[derive(Clone)]
pub struct HeldRound(Arc<Mutex<Held>>);

impl HeldRound {
    /// Takes the changes committed since the last call: the round to propose, with its
    /// number (rounds are numbered from 0 for each engine, in the order taken).
    pub fn take(&self) -> (u64, Vec<Change>) {
        let mut held = self.lock();
        held.bytes = 0;
        let round = held.making;
        held.making += 1;
        (round, std::mem::take(&mut held.changes))
    }

    /// Bytes of changes committed since the last [`HeldRound::take`].
    pub fn bytes(&self) -> usize {
        self.lock().bytes
    }

    /// Round `round` (and every one taken before it) was applied ([`Store::apply`]):
    /// reads of what those rounds changed go to fjall again; what later rounds, still
    /// being agreed on, changed stays readable here.
    pub fn applied(&self, round: u64) {
        let mut held = self.lock();
        assert!(
            round < held.making,
            "round {round} is applied only after it was taken ({} taken)",
            held.making
        );
        held.latest.retain(|_, (by, _)| *by > round);
        held.output.retain(|_, (by, _)| *by > round);
    }

    /// Forgets every held change: the rounds will not be applied (the leadership was
    /// lost) and the engine that made them is dropped.
    pub fn drop_all(&self) {
        *self.lock() = Held::default();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        self.0.lock().expect("the held round's lock")
    }
}

#[derive(Default)]
struct Held {
    /// Changes not yet taken for a round.
    changes: Vec<Change>,
    /// Their bytes.
    bytes: usize,
    /// The number of the round being made: the next [`HeldRound::take`] returns it.
    making: u64,
    /// The latest value of every key changed by a round not yet applied, with the
    /// number of the round that changed it last: reads see the engine's own writes
    /// before the cluster has agreed on them (several rounds may be in flight).
    latest: HashMap<(Space, Vec<u8>), Overlaid>,
    /// The same for the `output` keyspace, in key order: its reads are ranges.
    output: std::collections::BTreeMap<Vec<u8>, Overlaid>,
}

/// A held value (`None`: removed) and the number of the round that changed it last.
type Overlaid = (u64, Option<Vec<u8>>);

struct Keyspaces {
    meta: Keyspace,
    owners: Keyspace,
    queues: Keyspace,
    tasks: Keyspace,
    payloads: Keyspace,
    idem: Keyspace,
    limits: Keyspace,
    output: Keyspace,
    schedules: Keyspace,
}

impl Keyspaces {
    fn get(&self, space: Space) -> &Keyspace {
        match space {
            Space::Meta => &self.meta,
            Space::Owners => &self.owners,
            Space::Queues => &self.queues,
            Space::Tasks => &self.tasks,
            Space::Payloads => &self.payloads,
            Space::Idem => &self.idem,
            Space::Limits => &self.limits,
            Space::Output => &self.output,
            Space::Schedules => &self.schedules,
        }
    }
}

impl Store {
    /// Opens (or creates) the store in `dir` with a block cache of `cache_bytes`.
    pub fn open(dir: &Path, cache_bytes: u64) -> Result<Store, StoreError> {
        let open = || {
            Database::builder(dir)
                .cache_size(cache_bytes)
                // IMPORTANT: nothing is flushed behind our back; the engine persists once
                // per round after committing every batch of that round (group commit).
                .manual_journal_persist(true)
                .max_journaling_size(JOURNAL_BYTES)
                .open()
        };
        let db = match open() {
            Ok(db) => db,
            // A power loss can tear the unsynced last batch in a way fjall refuses to
            // recover; drop that batch (nothing acknowledged depends on it) and retry.
            Err(e @ fjall::Error::JournalRecovery(_)) => {
                match torn_tail::drop_torn_last_batch(dir).map_err(fjall::Error::from)? {
                    Some(cut) => {
                        tracing::warn!("recovering from a power loss: {cut}");
                        open()?
                    }
                    None => return Err(e.into()),
                }
            }
            Err(e) => return Err(e.into()),
        };
        let opts = || KeyspaceCreateOptions::default().max_memtable_size(MEMTABLE_BYTES);
        let ks = Keyspaces {
            meta: db.keyspace("meta", opts)?,
            owners: db.keyspace("owners", opts)?,
            queues: db.keyspace("queues", opts)?,
            tasks: db.keyspace("tasks", opts)?,
            payloads: db.keyspace("payloads", opts)?,
            idem: db.keyspace("idem", opts)?,
            limits: db.keyspace("limits", opts)?,
            output: db.keyspace("output", opts)?,
            schedules: db.keyspace("schedules", opts)?,
        };
        let store = Store {
            db,
            ks: Arc::new(ks),
            held: None,
        };
        store.check_format(dir)?;
        Ok(store)
    }

    /// Opens the store of a cluster node: the engine's batches are held back as the
    /// leader's round (the [`HeldRound`] returned with it) and reach fjall only through
    /// [`Store::apply`], when the cluster has agreed on them.
    pub fn open_clustered(dir: &Path, cache_bytes: u64) -> Result<(Store, HeldRound), StoreError> {
        let mut store = Store::open(dir, cache_bytes)?;
        let held: Arc<Mutex<Held>> = Arc::default();
        store.held = Some(Arc::clone(&held));
        Ok((store, HeldRound(held)))
    }

    /// The fjall database, for the cluster's log keyspaces.
    pub fn database(&self) -> &Database {
        &self.db
    }

    /// The start-up scans read fjall alone: an engine is built only over a store that
    /// holds nothing back.
    fn assert_nothing_held(&self) {
        if let Some(held) = &self.held {
            let held = held.lock().expect("the held round's lock");
            assert!(
                held.changes.is_empty() && held.latest.is_empty() && held.output.is_empty(),
                "an engine is built over a store with changes held back"
            );
        }
    }

    /// The held value of `key`, if a change not yet applied touched it.
    fn latest(&self, space: Space, key: &[u8]) -> Option<Option<Vec<u8>>> {
        let held = self.held.as_ref()?.lock().expect("the held round's lock");
        held.latest
            .get(&(space, key.to_vec()))
            .map(|(_, value)| value.clone())
    }

    /// Reads `key`, the held value first (a single daemon holds none: it reads fjall
    /// without a copy).
    fn get(&self, space: Space, key: &[u8]) -> Result<Option<fjall::Slice>, StoreError> {
        if let Some(value) = self.latest(space, key) {
            return Ok(value.map(fjall::Slice::from));
        }
        Ok(self.ks.get(space).get(key)?)
    }

    /// Writes `changes` and `meta` (keys of the `meta` keyspace) as one atomic batch,
    /// unsynced: a cluster node's only way of writing the engine's keyspaces.
    pub fn apply(&self, changes: &[Change], meta: &[(&[u8], Vec<u8>)]) -> Result<(), StoreError> {
        let mut batch = self.db.batch();
        for change in changes {
            let ks = self.ks.get(change.space);
            match &change.value {
                Some(value) => batch.insert(ks, change.key.as_slice(), value.as_slice()),
                None => batch.remove(ks, change.key.as_slice()),
            }
        }
        for (key, value) in meta {
            batch.insert(&self.ks.meta, *key, value.as_slice());
        }
        batch.durability(None).commit()?;
        Ok(())
    }

    /// Removes a key of the `meta` keyspace (unsynced).
    pub fn remove_meta(&self, key: &[u8]) -> Result<(), StoreError> {
        self.ks.meta.remove(key)?;
        Ok(())
    }

    /// Reads a key of the `meta` keyspace.
    pub fn meta(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.ks.meta.get(key)?.map(|v| v.to_vec()))
    }

    /// Removes every key of the engine's keyspaces but `meta`'s format (a snapshot is
    /// about to be installed), a batch at a time.
    pub fn clear(&self) -> Result<(), StoreError> {
        for space in Space::ALL {
            let ks = self.ks.get(space);
            let mut batch = self.db.batch();
            for guard in ks.iter() {
                let key = guard.key()?;
                if space == Space::Meta && &*key == FORMAT_KEY {
                    continue;
                }
                batch.remove(ks, key);
                if batch.len() >= SNAPSHOT_BATCH {
                    batch.durability(None).commit()?;
                    batch = self.db.batch();
                }
            }
            batch.durability(None).commit()?;
        }
        Ok(())
    }

    /// Checks (and on a new or pre-`meta` store, records) the store's format.
    fn check_format(&self, dir: &Path) -> Result<(), StoreError> {
        let found = match self.ks.meta.get(FORMAT_KEY)? {
            Some(v) => std::str::from_utf8(&v)
                .ok()
                .and_then(|s| s.parse::<u32>().ok())
                .ok_or_else(|| StoreError::Corrupt {
                    what: "meta format".into(),
                    detail: format!("{:?} is not a number", String::from_utf8_lossy(&v)),
                })?,
            // A new store, or one from before formats were recorded (format 1).
            None => format::OLDEST_FORMAT,
        };
        if found > format::FORMAT {
            return Err(StoreError::NewerFormat {
                dir: dir.display().to_string(),
                found,
                oldest: format::OLDEST_FORMAT,
                newest: format::FORMAT,
            });
        }
        // No format needs a migration: older task records are read as they are and
        // rewritten in the current format as they change (`format`). Format 1 is the
        // oldest there is.
        if found < format::OLDEST_FORMAT {
            return Err(StoreError::Corrupt {
                what: "meta format".into(),
                detail: format!("format {found} is not a muster format"),
            });
        }
        if found != format::FORMAT || self.ks.meta.get(FORMAT_KEY)?.is_none() {
            self.ks
                .meta
                .insert(FORMAT_KEY, format::FORMAT.to_string().as_bytes())?;
            self.persist(Persist::All)?;
        }
        Ok(())
    }

    /// Bytes of the store's files on disk (journals and tables).
    pub fn disk_space(&self) -> Result<u64, StoreError> {
        Ok(self.db.disk_space()?)
    }

    /// Takes every committed batch as far as `to` says.
    pub fn persist(&self, to: Persist) -> Result<(), StoreError> {
        let mode = match to {
            Persist::Os => PersistMode::Buffer,
            Persist::Data => PersistMode::SyncData,
            Persist::All => PersistMode::SyncAll,
        };
        self.db.persist(mode)?;
        Ok(())
    }

    /// Every member name and the principal that owns it.
    pub fn load_owners(&self) -> Result<Vec<(String, String)>, StoreError> {
        self.assert_nothing_held();
        let mut out = Vec::new();
        for guard in self.ks.owners.iter() {
            let (k, v) = guard.into_inner()?;
            out.push((
                String::from_utf8_lossy(&k).into_owned(),
                String::from_utf8_lossy(&v).into_owned(),
            ));
        }
        Ok(out)
    }

    /// Every stored limit, and every stored throttle (limit, key, its end in wall ms).
    #[allow(clippy::type_complexity)]
    pub fn load_limits(
        &self,
    ) -> Result<(Vec<(String, LimitRecord)>, Vec<(String, String, u64)>), StoreError> {
        self.assert_nothing_held();
        let mut out = Vec::new();
        let mut throttles = Vec::new();
        for guard in self.ks.limits.iter() {
            let (k, v) = guard.into_inner()?;
            if let Some(at) = k.iter().position(|b| *b == 0) {
                let until = std::str::from_utf8(&v)
                    .ok()
                    .and_then(|s| s.parse::<u64>().ok())
                    .ok_or_else(|| StoreError::Corrupt {
                        what: "limit throttle".into(),
                        detail: format!("{:?} is not a time", String::from_utf8_lossy(&v)),
                    })?;
                throttles.push((
                    String::from_utf8_lossy(&k[..at]).into_owned(),
                    String::from_utf8_lossy(&k[at + 1..]).into_owned(),
                    until,
                ));
                continue;
            }
            let name = String::from_utf8_lossy(&k).into_owned();
            let rec = decode(&v, || format!("limit {name}"))?;
            out.push((name, rec));
        }
        Ok((out, throttles))
    }

    /// Every stored schedule, by name.
    pub fn load_schedules(&self) -> Result<Vec<(String, ScheduleRecord)>, StoreError> {
        self.assert_nothing_held();
        let mut out = Vec::new();
        for guard in self.ks.schedules.iter() {
            let (k, v) = guard.into_inner()?;
            let name = String::from_utf8_lossy(&k).into_owned();
            let rec = decode(&v, || format!("schedule {name}"))?;
            out.push((name, rec));
        }
        Ok(out)
    }

    /// Every stored queue.
    pub fn load_queues(&self) -> Result<Vec<(String, QueueRecord)>, StoreError> {
        self.assert_nothing_held();
        let mut out = Vec::new();
        for guard in self.ks.queues.iter() {
            let (k, v) = guard.into_inner()?;
            let name = String::from_utf8_lossy(&k).into_owned();
            let rec = decode(&v, || format!("queue {name}"))?;
            out.push((name, rec));
        }
        Ok(out)
    }

    /// Calls `f` for every stored task, in id order. Reading and decoding the records
    /// runs on a thread of its own, [`SCAN_BATCH`] records at a time, while `f` indexes
    /// the previous batch on the caller's: start-up takes both cores.
    pub fn for_each_task(&self, mut f: impl FnMut(Ulid, TaskIndex)) -> Result<(), StoreError> {
        self.assert_nothing_held();
        let tasks = self.ks.tasks.clone();
        std::thread::scope(|scope| {
            let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<(Ulid, TaskIndex)>>(SCAN_QUEUE);
            let reader = std::thread::Builder::new()
                .name("muster-scan".into())
                .spawn_scoped(scope, move || -> Result<(), StoreError> {
                    let mut batch = Vec::with_capacity(SCAN_BATCH);
                    for guard in tasks.iter() {
                        let (k, v) = guard.into_inner()?;
                        let id = id_from_key(&k)?;
                        let index = format::decode_index(&v).map_err(|d| corrupt_task(id, d))?;
                        batch.push((id, index));
                        if batch.len() == SCAN_BATCH {
                            let full =
                                std::mem::replace(&mut batch, Vec::with_capacity(SCAN_BATCH));
                            if tx.send(full).is_err() {
                                // The indexing side is gone: it panicked, and the
                                // panic is what the join below reports.
                                return Ok(());
                            }
                        }
                    }
                    if !batch.is_empty() {
                        let _ = tx.send(batch);
                    }
                    Ok(())
                })
                .map_err(fjall::Error::from)?;
            for batch in rx {
                for (id, index) in batch {
                    f(id, index);
                }
            }
            reader
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }

    /// About how many tasks are stored (fjall's estimate): room to reserve at start-up.
    pub fn approximate_task_count(&self) -> usize {
        self.ks.tasks.approximate_len()
    }

    /// Reads one task record.
    pub fn task(&self, id: Ulid) -> Result<Option<TaskRecord>, StoreError> {
        match self.get(Space::Tasks, &id.to_bytes())? {
            Some(v) => Ok(Some(
                format::decode_task(&v).map_err(|d| corrupt_task(id, d))?,
            )),
            None => Ok(None),
        }
    }

    /// Whether task `id`'s stored record is `rec`, byte for byte (debug builds check
    /// the records the engine keeps in memory with it).
    #[cfg(debug_assertions)]
    pub fn holds_exactly(&self, id: Ulid, rec: &TaskRecord) -> Result<bool, StoreError> {
        let stored = self.get(Space::Tasks, &id.to_bytes())?;
        Ok(stored.as_deref() == Some(format::encode_task(rec).as_slice()))
    }

    /// Reads one task's payload as raw JSON.
    pub fn payload(&self, id: Ulid) -> Result<RawJson, StoreError> {
        let bytes =
            self.get(Space::Payloads, &id.to_bytes())?
                .ok_or_else(|| StoreError::Corrupt {
                    what: format!("payload {id}"),
                    detail: "missing".into(),
                })?;
        let text = String::from_utf8(bytes.to_vec()).map_err(|e| StoreError::Corrupt {
            what: format!("payload {id}"),
            detail: e.to_string(),
        })?;
        serde_json::value::RawValue::from_string(text).map_err(|e| StoreError::Corrupt {
            what: format!("payload {id}"),
            detail: e.to_string(),
        })
    }

    /// Looks up the task an idempotency key names in a queue.
    pub fn idem(&self, queue: &str, key: &str) -> Result<Option<Ulid>, StoreError> {
        match self.get(Space::Idem, &idem_key(queue, key))? {
            Some(v) => Ok(Some(id_from_key(&v)?)),
            None => Ok(None),
        }
    }

    /// Starts an atomic batch of changes.
    pub fn batch(&self) -> Batch {
        let writes = match &self.held {
            None => Writes::Direct(self.db.batch()),
            Some(held) => Writes::Held {
                held: Arc::clone(held),
                changes: Vec::new(),
            },
        };
        Batch {
            ks: Arc::clone(&self.ks),
            writes,
        }
    }
}

/// What a task's output holds, as stored with it (the meta key of the `output`
/// keyspace). Invariant: its pages number the chunks `first..next` with no gap, at
/// most [`muster_protocol::limits::MAX_OUTPUT_EMITS`] pages and
/// [`muster_protocol::limits::MAX_OUTPUT_BYTES`] bytes of chunks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OutputMeta {
    /// The number of the oldest chunk kept (the first of the oldest page).
    pub first: u64,
    /// The number the next chunk gets.
    pub next: u64,
    /// Bytes of the chunks kept ([`muster_protocol::model::Chunk::bytes`]).
    pub bytes: u64,
    /// Pages kept (one per emit).
    pub pages: u64,
}

impl OutputMeta {
    fn encode(&self) -> [u8; 32] {
        let mut b = [0u8; 32];
        for (i, v) in [self.first, self.next, self.bytes, self.pages]
            .into_iter()
            .enumerate()
        {
            b[i * 8..i * 8 + 8].copy_from_slice(&v.to_be_bytes());
        }
        b
    }

    fn decode(id: Ulid, b: &[u8]) -> Result<OutputMeta, StoreError> {
        let words: [u8; 32] = b.try_into().map_err(|_| StoreError::Corrupt {
            what: format!("output meta of task {id}"),
            detail: format!("{} bytes instead of 32", b.len()),
        })?;
        let word =
            |i: usize| u64::from_be_bytes(words[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        let meta = OutputMeta {
            first: word(0),
            next: word(1),
            bytes: word(2),
            pages: word(3),
        };
        if meta.first > meta.next || (meta.pages == 0) != (meta.first == meta.next) {
            return Err(StoreError::Corrupt {
                what: format!("output meta of task {id}"),
                detail: format!("{meta:?} is not a run of pages"),
            });
        }
        Ok(meta)
    }
}

/// One emit's chunks as stored: how many, the page's bytes, when, and the chunks.
#[derive(Debug)]
pub struct OutputPage {
    /// Chunks in it.
    pub count: u32,
    /// Bytes of the whole page as stored (what the task's output limit counts).
    pub bytes: u32,
    /// When it was stored (wall ms).
    pub at_ms: u64,
    /// The chunks, a JSON array.
    pub chunks: Vec<u8>,
}

impl OutputPage {
    /// The stored form of `chunks`, stored at `at_ms`: [`OUTPUT_PAGE_HEADER_BYTES`]
    /// and their JSON array.
    ///
    /// [`OUTPUT_PAGE_HEADER_BYTES`]: muster_protocol::limits::OUTPUT_PAGE_HEADER_BYTES
    pub fn encode(chunks: &[muster_protocol::model::Chunk], at_ms: u64) -> Vec<u8> {
        const HEADER: usize = muster_protocol::limits::OUTPUT_PAGE_HEADER_BYTES;
        let mut page = vec![0u8; HEADER];
        serde_json::to_writer(&mut page, chunks).expect("chunks hold strings and raw JSON");
        let bytes = u32::try_from(page.len()).unwrap_or(u32::MAX);
        page[0..4].copy_from_slice(&(chunks.len() as u32).to_be_bytes());
        page[4..8].copy_from_slice(&bytes.to_be_bytes());
        page[8..16].copy_from_slice(&at_ms.to_be_bytes());
        page
    }

    fn decode(id: Ulid, first: u64, b: &[u8]) -> Result<OutputPage, StoreError> {
        let corrupt = |detail: &str| StoreError::Corrupt {
            what: format!("output of task {id} from chunk {first}"),
            detail: detail.to_owned(),
        };
        if b.len() < 16 {
            return Err(corrupt("shorter than its header"));
        }
        Ok(OutputPage {
            count: u32::from_be_bytes(b[0..4].try_into().expect("4 bytes")),
            bytes: u32::from_be_bytes(b[4..8].try_into().expect("4 bytes")),
            at_ms: u64::from_be_bytes(b[8..16].try_into().expect("8 bytes")),
            chunks: b[16..].to_vec(),
        })
    }

    /// Its chunks.
    pub fn chunks(
        &self,
        id: Ulid,
        first: u64,
    ) -> Result<Vec<muster_protocol::model::Chunk>, StoreError> {
        let chunks: Vec<muster_protocol::model::Chunk> = serde_json::from_slice(&self.chunks)
            .map_err(|e| StoreError::Corrupt {
                what: format!("output of task {id} from chunk {first}"),
                detail: e.to_string(),
            })?;
        if chunks.len() != self.count as usize {
            return Err(StoreError::Corrupt {
                what: format!("output of task {id} from chunk {first}"),
                detail: format!("{} chunks, its header says {}", chunks.len(), self.count),
            });
        }
        Ok(chunks)
    }
}

/// A key and its value.
type Entry = (Vec<u8>, Vec<u8>);

fn output_meta_key(id: Ulid) -> [u8; 17] {
    let mut k = [0u8; 17];
    k[1..].copy_from_slice(&id.to_bytes());
    k
}

fn output_page_key(id: Ulid, first: u64) -> [u8; 25] {
    let mut k = [0u8; 25];
    k[0] = 1;
    k[1..17].copy_from_slice(&id.to_bytes());
    k[17..].copy_from_slice(&first.to_be_bytes());
    k
}

impl Store {
    /// Every task's output meta (start-up).
    pub fn load_output_metas(&self) -> Result<Vec<(Ulid, OutputMeta)>, StoreError> {
        self.assert_nothing_held();
        let mut metas = Vec::new();
        for guard in self.ks.output.prefix([0u8]) {
            let (k, v) = guard.into_inner()?;
            let id = id_from_key(&k[1..])?;
            metas.push((id, OutputMeta::decode(id, &v)?));
        }
        Ok(metas)
    }

    /// Task `id`'s pages whose first chunk is at least `from`, in order, until
    /// `enough` says so (it sees each page's first number and page, and says whether
    /// to stop after it). Reads what a cluster node holds back for its round too.
    pub fn output_pages(
        &self,
        id: Ulid,
        from: u64,
        mut enough: impl FnMut(u64, &OutputPage) -> bool,
    ) -> Result<(), StoreError> {
        let start = output_page_key(id, from);
        let end = output_page_key(id, u64::MAX);
        let held = self.held_range(&start, &end);
        let mut stored = self.ks.output.range(start..=end);
        let mut next_stored = || -> Result<Option<Entry>, StoreError> {
            Ok(match stored.next() {
                Some(guard) => {
                    let (k, v) = guard.into_inner()?;
                    Some((k.to_vec(), v.to_vec()))
                }
                None => None,
            })
        };
        let mut held = held.into_iter().peekable();
        let mut s = next_stored()?;
        loop {
            // The smaller key of the two; the held one wins a tie.
            let take_held = match (&s, held.peek()) {
                (None, None) => return Ok(()),
                (Some(_), None) => false,
                (None, Some(_)) => true,
                (Some((sk, _)), Some((hk, _))) => hk <= sk,
            };
            let (key, value) = if take_held {
                let (hk, hv) = held.next().expect("peeked");
                if s.as_ref().is_some_and(|(sk, _)| *sk == hk) {
                    s = next_stored()?;
                }
                match hv {
                    Some(v) => (hk, v),
                    None => continue,
                }
            } else {
                let taken = s.take().expect("matched");
                s = next_stored()?;
                taken
            };
            let first =
                u64::from_be_bytes(key[17..25].try_into().map_err(|_| StoreError::Corrupt {
                    what: format!("output key of task {id}"),
                    detail: format!("{} bytes instead of 25", key.len()),
                })?);
            let page = OutputPage::decode(id, first, &value)?;
            if enough(first, &page) {
                return Ok(());
            }
        }
    }

    /// The first number of task `id`'s page that holds chunk `n` (the last page
    /// starting at or before it), if any.
    pub fn output_page_of(&self, id: Ulid, n: u64) -> Result<Option<u64>, StoreError> {
        let start = output_page_key(id, 0);
        let end = output_page_key(id, n);
        let held = self.held_range(&start, &end);
        let held_last = held
            .iter()
            .rev()
            .find(|(_, v)| v.is_some())
            .map(|(k, _)| k.clone());
        let mut stored_last = None;
        for guard in self.ks.output.range(start..=end).rev() {
            let k = guard.key()?;
            // A page the held round removes is no candidate.
            if held.get(&*k).is_some_and(Option::is_none) {
                continue;
            }
            stored_last = Some(k.to_vec());
            break;
        }
        let last = held_last.max(stored_last);
        Ok(last.map(|k| u64::from_be_bytes(k[17..25].try_into().expect("a page key"))))
    }

    /// The held changes of the `output` keyspace with keys in `start..=end`, in key
    /// order (none on a single daemon).
    fn held_range(
        &self,
        start: &[u8],
        end: &[u8],
    ) -> std::collections::BTreeMap<Vec<u8>, Option<Vec<u8>>> {
        let Some(held) = &self.held else {
            return std::collections::BTreeMap::new();
        };
        let held = held.lock().expect("the held round's lock");
        held.output
            .range::<[u8], _>((
                std::ops::Bound::Included(start),
                std::ops::Bound::Included(end),
            ))
            .map(|(k, (_, v))| (k.clone(), v.clone()))
            .collect()
    }

    /// The first numbers of task `id`'s pages, in order, at most `limit` of them: their
    /// keys only, no page copied.
    pub fn output_page_firsts(&self, id: Ulid, limit: usize) -> Result<Vec<u64>, StoreError> {
        let start = output_page_key(id, 0);
        let end = output_page_key(id, u64::MAX);
        let held = self.held_range(&start, &end);
        let mut keys: std::collections::BTreeSet<Vec<u8>> = held
            .iter()
            .filter(|(_, v)| v.is_some())
            .map(|(k, _)| k.clone())
            .collect();
        // The first `limit` stored keys the held round leaves as they are: the first
        // `limit` of all are among them and the held ones.
        let mut stored = 0;
        for guard in self.ks.output.range(start..=end) {
            if stored >= limit {
                break;
            }
            let k = guard.key()?;
            if !held.contains_key(&*k) {
                keys.insert(k.to_vec());
                stored += 1;
            }
        }
        Ok(keys
            .into_iter()
            .take(limit)
            .map(|k| u64::from_be_bytes(k[17..25].try_into().expect("a page key")))
            .collect())
    }
}

/// Entries copied per batch when a snapshot is written: bounds the batch's memory.
pub(crate) const SNAPSHOT_BATCH: usize = 4096;

/// Block cache of a store while a snapshot is written into it.
const SNAPSHOT_CACHE_BYTES: u64 = 8 << 20;

/// A consistent read view of the whole store at one moment, to copy while the daemon
/// goes on changing the store.
pub struct StoreView {
    snapshot: fjall::Snapshot,
    ks: Arc<Keyspaces>,
}

/// What a snapshot holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotCounts {
    /// Task records.
    pub tasks: u64,
    /// Queue records.
    pub queues: u64,
}

impl Store {
    /// A view of everything committed so far.
    pub fn view(&self) -> StoreView {
        StoreView {
            snapshot: self.db.snapshot(),
            ks: Arc::clone(&self.ks),
        }
    }
}

impl StoreView {
    /// Reads `key` of `space` as of the view.
    pub fn get(&self, space: Space, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        use fjall::Readable;
        Ok(self
            .snapshot
            .get(self.ks.get(space), key)?
            .map(|v| v.to_vec()))
    }

    /// Calls `f` with every entry of `space` as of the view, in key order.
    pub fn for_each(
        &self,
        space: Space,
        mut f: impl FnMut(&[u8], &[u8]) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        use fjall::Readable;
        for guard in self.snapshot.iter(self.ks.get(space)) {
            let (k, v) = guard.into_inner()?;
            f(&k, &v)?;
        }
        Ok(())
    }

    /// Writes the view into a new store in `dir` (an empty directory), every keyspace
    /// entry as it is, and makes it durable (`SyncAll`: a backup is kept whole or not at all).
    pub fn write_to(&self, dir: &Path) -> Result<SnapshotCounts, StoreError> {
        use fjall::Readable;
        let copy = Store::open(dir, SNAPSHOT_CACHE_BYTES)?;
        let mut counts = SnapshotCounts {
            tasks: 0,
            queues: 0,
        };
        // Every keyspace of the engine's state, as a cluster's snapshot copies it.
        for space in Space::ALL {
            let (source, target) = (self.ks.get(space), copy.ks.get(space));
            let mut batch = copy.db.batch();
            let mut entries = 0u64;
            for guard in self.snapshot.iter(source) {
                let (k, v) = guard.into_inner()?;
                batch.insert(target, k, v);
                entries += 1;
                if batch.len() >= SNAPSHOT_BATCH {
                    batch.durability(None).commit()?;
                    batch = copy.db.batch();
                }
            }
            batch.durability(None).commit()?;
            match space {
                Space::Queues => counts.queues = entries,
                Space::Tasks => counts.tasks = entries,
                Space::Meta
                | Space::Owners
                | Space::Limits
                | Space::Payloads
                | Space::Idem
                | Space::Output
                | Space::Schedules => {}
            }
        }
        copy.persist(Persist::All)?;
        Ok(counts)
    }
}

/// An atomic set of changes, committed without syncing (the engine syncs per round).
/// On a cluster node the changes are held back for the leader's round instead.
pub struct Batch {
    ks: Arc<Keyspaces>,
    writes: Writes,
}

enum Writes {
    /// A single daemon's: a fjall batch.
    Direct(fjall::OwnedWriteBatch),
    /// A cluster node's: changes for the round, added to it on commit.
    Held {
        held: Arc<Mutex<Held>>,
        changes: Vec<Change>,
    },
}

impl Batch {
    /// Writes `value` at `key`. A single daemon's owned keys and values move into
    /// fjall's batch without a copy.
    fn insert(
        &mut self,
        space: Space,
        key: impl Into<fjall::Slice>,
        value: impl Into<fjall::Slice>,
    ) {
        match &mut self.writes {
            Writes::Direct(batch) => batch.insert(self.ks.get(space), key, value),
            Writes::Held { changes, .. } => changes.push(Change {
                space,
                key: key.into().to_vec(),
                value: Some(value.into().to_vec()),
            }),
        }
    }

    fn remove(&mut self, space: Space, key: impl Into<fjall::Slice>) {
        match &mut self.writes {
            Writes::Direct(batch) => batch.remove(self.ks.get(space), key),
            Writes::Held { changes, .. } => changes.push(Change {
                space,
                key: key.into().to_vec(),
                value: None,
            }),
        }
    }

    /// Writes a queue record.
    pub fn put_queue(&mut self, name: &str, rec: &QueueRecord) {
        self.insert(Space::Queues, name.as_bytes(), encode(rec));
    }

    /// Records the principal that owns a member name.
    pub fn put_owner(&mut self, member: &str, principal: &str) {
        self.insert(Space::Owners, member.as_bytes(), principal.as_bytes());
    }

    /// Forgets the principal that owns a member name.
    pub fn remove_owner(&mut self, member: &str) {
        self.remove(Space::Owners, member.as_bytes());
    }

    /// Writes a limit record.
    pub fn put_limit(&mut self, name: &str, rec: &LimitRecord) {
        self.insert(Space::Limits, name.as_bytes(), encode(rec));
    }

    /// Writes a schedule record.
    pub fn put_schedule(&mut self, name: &str, rec: &ScheduleRecord) {
        self.insert(Space::Schedules, name.as_bytes(), encode(rec));
    }

    /// Removes a schedule record.
    pub fn remove_schedule(&mut self, name: &str) {
        self.remove(Space::Schedules, name.as_bytes());
    }

    /// Removes a limit record.
    pub fn remove_limit(&mut self, name: &str) {
        self.remove(Space::Limits, name.as_bytes());
    }

    /// Removes the throttle of bucket `key` of limit `name`.
    pub fn remove_throttle(&mut self, name: &str, key: &str) {
        self.remove(Space::Limits, throttle_key(name, key));
    }

    /// Writes a throttle of bucket `key` of limit `name`: it hands nothing out until
    /// `until_ms` (wall clock).
    pub fn put_throttle(&mut self, name: &str, key: &str, until_ms: u64) {
        self.insert(
            Space::Limits,
            throttle_key(name, key),
            until_ms.to_string().into_bytes(),
        );
    }

    /// Removes a queue record.
    pub fn remove_queue(&mut self, name: &str) {
        self.remove(Space::Queues, name.as_bytes());
    }

    /// Writes a task record.
    pub fn put_task(&mut self, id: Ulid, rec: &TaskRecord) {
        self.insert(Space::Tasks, id.to_bytes(), format::encode_task(rec));
    }

    /// Writes a new task's payload and its idempotency key.
    pub fn put_payload(&mut self, id: Ulid, queue: &str, payload: &str, idem: Option<&str>) {
        self.insert(Space::Payloads, id.to_bytes(), payload.as_bytes());
        if let Some(key) = idem {
            self.insert(Space::Idem, idem_key(queue, key), id.to_bytes());
        }
    }

    /// Removes a task with its payload and idempotency key.
    pub fn remove_task(&mut self, id: Ulid, queue: &str, idem: Option<&str>) {
        self.remove(Space::Tasks, id.to_bytes());
        self.remove(Space::Payloads, id.to_bytes());
        if let Some(key) = idem {
            self.remove(Space::Idem, idem_key(queue, key));
        }
    }

    /// Writes one emit's chunks (a page, [`OutputPage::encode`]) of task `id`, the first
    /// numbered `first`.
    pub fn put_output_page(&mut self, id: Ulid, first: u64, page: Vec<u8>) {
        self.insert(Space::Output, output_page_key(id, first).to_vec(), page);
    }

    /// Removes the page of task `id` whose first chunk is numbered `first`.
    pub fn remove_output_page(&mut self, id: Ulid, first: u64) {
        self.remove(Space::Output, output_page_key(id, first).to_vec());
    }

    /// Writes what task `id`'s output holds.
    pub fn put_output_meta(&mut self, id: Ulid, meta: &OutputMeta) {
        self.insert(
            Space::Output,
            output_meta_key(id).to_vec(),
            meta.encode().to_vec(),
        );
    }

    /// Removes task `id`'s output meta (its pages are all removed).
    pub fn remove_output_meta(&mut self, id: Ulid) {
        self.remove(Space::Output, output_meta_key(id).to_vec());
    }

    /// Whether the batch holds no change.
    pub fn is_empty(&self) -> bool {
        match &self.writes {
            Writes::Direct(batch) => batch.is_empty(),
            Writes::Held { changes, .. } => changes.is_empty(),
        }
    }

    /// Applies the batch atomically (to the journal buffer and the memtables), or on a
    /// cluster node adds it to the round.
    pub fn commit(self) -> Result<(), StoreError> {
        match self.writes {
            Writes::Direct(batch) => {
                if !batch.is_empty() {
                    batch.durability(None).commit()?;
                }
            }
            Writes::Held { held, changes } => {
                let mut held = held.lock().expect("the held round's lock");
                let round = held.making;
                for change in changes {
                    held.bytes += change.bytes();
                    if change.space == Space::Output {
                        held.output
                            .insert(change.key.clone(), (round, change.value.clone()));
                    }
                    held.latest.insert(
                        (change.space, change.key.clone()),
                        (round, change.value.clone()),
                    );
                    held.changes.push(change);
                }
            }
        }
        Ok(())
    }
}

fn idem_key(queue: &str, key: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(queue.len() + 1 + key.len());
    k.extend_from_slice(queue.as_bytes());
    k.push(0);
    k.extend_from_slice(key.as_bytes());
    k
}

fn id_from_key(k: &[u8]) -> Result<Ulid, StoreError> {
    let bytes: [u8; 16] = k.try_into().map_err(|_| StoreError::Corrupt {
        what: "task id".into(),
        detail: format!("{} bytes instead of 16", k.len()),
    })?;
    Ok(Ulid::from_bytes(bytes))
}

/// Task `id`'s record does not decode: `detail` says why.
fn corrupt_task(id: Ulid, detail: String) -> StoreError {
    StoreError::Corrupt {
        what: format!("task {id}"),
        detail,
    }
}

/// The key of a throttle in the `limits` keyspace: the limit's name, 0x00, the key
/// (limit names never hold a 0x00).
fn throttle_key(name: &str, key: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(name.len() + 1 + key.len());
    k.extend_from_slice(name.as_bytes());
    k.push(0);
    k.extend_from_slice(key.as_bytes());
    k
}

fn encode<T: Serialize>(rec: &T) -> Vec<u8> {
    serde_json::to_vec(rec).expect("records hold only strings, numbers and raw JSON")
}

fn decode<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    what: impl FnOnce() -> String,
) -> Result<T, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| StoreError::Corrupt {
        what: what(),
        detail: e.to_string(),
    })
}

#[cfg(test)]
impl Store {
    /// Overwrites task `id`'s record with bytes that do not decode (start-up tests).
    pub fn spoil_task(&self, id: Ulid) {
        self.ks
            .tasks
            .insert(id.to_bytes(), b"{not a record")
            .expect("writing the spoiled record");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_of_a_newer_format_is_refused_with_a_message_saying_so() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(
            store.ks.meta.get(FORMAT_KEY).unwrap().as_deref(),
            Some(format::FORMAT.to_string().as_bytes())
        );
        store.ks.meta.insert(FORMAT_KEY, b"99").unwrap();
        store.persist(Persist::All).unwrap();
        drop(store);
        let err = Store::open(dir.path(), 1 << 20).err().expect("refused");
        assert_eq!(
            err.to_string(),
            format!(
                "store: {} has format 99, written by a newer musterd; this one reads formats 1 to 7",
                dir.path().display()
            )
        );
    }
}
