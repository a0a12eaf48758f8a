//! The queue engine: every task's state, the dispatch indexes, leases and timers.
//!
//! The engine is single-threaded and synchronous. It owns the [`Store`] and an in-memory
//! index rebuilt from it on start; requests and timers mutate both. It never reads a
//! clock: every call takes a [`Now`], so tests drive time. It never sends anything:
//! replies go to an outbox of `(waiter, reply)` pairs that its owner (the dispatcher
//! thread) delivers after the round's changes are durable.
//!
//! Each request's changes are committed to fjall as one atomic batch; the dispatcher
//! persists once per round. In memory, a task's state is derived from its record by
//! [`Engine::save`], which removes the task from every index and inserts it again where
//! its new state says, so the indexes cannot drift from the records.

pub mod audit;
mod authz;
pub use authz::{
    DEFAULT_MEMBER_NAME_EXPIRY, MAX_MEMBER_NAMES_PER_PRINCIPAL, MIN_MEMBER_NAME_EXPIRY,
};
mod bulk;
pub mod dispatch;
mod fair;
mod family;
mod find;
mod sharded;

pub use authz::authorize_edge;
mod limit_ops;
pub mod limits;
mod listing;
mod members;
mod ops;
mod output;
mod quotas;
mod schedules;
mod suspend;
pub mod telemetry;
#[cfg(test)]
mod tests;
mod watch;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use ulid::Ulid;

use muster_protocol::limits::{MAX_HISTORY, MAX_LEASE, MAX_LIMITS};
use muster_protocol::model::{QueueOptions, QueueTotals, TaskState, TimelineEvent};
use muster_protocol::ops::{
    CancelReply, ClaimReply, CountReply, Empty, EnqueueReply, HelloReply, MemberDescribeReply,
    MemberListReply, MemberReply, QueueListReply, QueueReply, RenewReply, ServerStatsReply,
    SessionOpenReply, SettleReply, TaskFindReply, TaskListReply, TaskReply, WaitReply, WatchReply,
};
use muster_protocol::{ErrorBody, ErrorCode, RawJson};

use crate::auth::Principal;
use crate::store::{Batch, IndexView, Store, StoreError, TaskIndex, TaskRecord};
use dispatch::{Class, DispatchIndex, Gate, TaskRef};
use fair::Group;
use limits::{Limits, Use, Uses};
use sharded::IdMap;
use telemetry::LeaseEnd;

/// Default of `--max-tasks-per-queue`: tasks one queue may hold in any state. The
/// engine keeps ~200 bytes of index per task, so a queue at the cap costs ~2 GiB.
pub const DEFAULT_MAX_TASKS_PER_QUEUE: u64 = 10_000_000;

/// Default of `--max-bytes-per-token`: payload bytes the tasks one principal enqueued
/// may hold in the store, until they are removed (purge, discard, retention).
pub const DEFAULT_MAX_BYTES_PER_PRINCIPAL: u64 = 16 << 30;

/// Quotas on what producers can make the daemon store: past one, `enqueue` gets
/// `limit` and nothing of the batch is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quotas {
    /// Tasks one queue may hold, in every state.
    pub max_tasks_per_queue: u64,
    /// Payload bytes the stored tasks of one principal may hold (with tokens).
    pub max_bytes_per_principal: u64,
}

impl Default for Quotas {
    fn default() -> Quotas {
        Quotas {
            max_tasks_per_queue: DEFAULT_MAX_TASKS_PER_QUEUE,
            max_bytes_per_principal: DEFAULT_MAX_BYTES_PER_PRINCIPAL,
        }
    }
}

/// Most retention removals (or postponements) done per round, so a large expiry never
/// stalls dispatch.
const RETENTION_BATCH: usize = 512;

/// How much later retention looks again at a finished parent kept because a child of
/// it is unfinished.
const RETENTION_RECHECK_MS: u64 = 5_000;

/// How often member sessions are checked for silence past their liveness timeout (the
/// `unreachable` state shows up to this much late; pushes check liveness exactly).
const LIVENESS_SWEEP: std::time::Duration = std::time::Duration::from_millis(250);

/// Most tasks a claimer's pick skips in one label class because the claimer let them
/// lapse ([`Engine::avoided`]); past it the class gives that claimer nothing this time.
const MAX_AVOID_SKIP: usize = 64;

/// The time of one engine step: wall-clock for what users schedule and see, monotonic
/// for lease deadlines (a wall-clock jump neither expires nor prolongs a lease).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    /// Milliseconds since the Unix epoch.
    pub wall_ms: u64,
    /// Milliseconds on a monotonic clock with an arbitrary origin.
    pub mono_ms: u64,
}

/// Where a reply goes. The dispatcher's waiters are connection streams; tests use tags.
pub trait Waiter {
    /// Where pushes to a member session opened by this request go.
    type Sink: Sink;
    /// True once nobody will read the reply (the stream or connection is gone).
    fn is_closed(&self) -> bool;
    /// The connection the request came on: a member session belongs to one.
    fn connection(&self) -> u64;
    /// A sink for pushes on the request's stream.
    fn sink(&self) -> Self::Sink;
    /// Who sent the request, when tokens are configured; `None` serves everything.
    fn principal(&self) -> Option<&Principal>;
}

/// Where a member session's pushes go.
pub trait Sink: Clone {
    /// True once the session's stream or connection is gone.
    fn is_closed(&self) -> bool;
}

/// A watch push: where it goes, the push, and its watch's "queued" flag.
pub type WatchPush<S> = (S, muster_protocol::Push, Arc<std::sync::atomic::AtomicBool>);

/// A successful reply of any op.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum Reply {
    /// Hello (answered by the connection, not the engine).
    Hello(HelloReply),
    /// Server stats (answered by the connection, not the engine).
    ServerStats(ServerStatsReply),
    /// Session open.
    SessionOpen(SessionOpenReply),
    /// Session update, member drain and undrain.
    Member(MemberReply),
    /// Member list.
    MemberList(MemberListReply),
    /// Member describe.
    MemberDescribe(MemberDescribeReply),
    /// Subscribe, unsubscribe.
    Empty(Empty),
    /// Queue create, describe, update, pause, resume.
    Queue(QueueReply),
    /// Queue list.
    QueueList(QueueListReply),
    /// Purge, delete, redrive, discard.
    Count(CountReply),
    /// Enqueue.
    Enqueue(EnqueueReply),
    /// Claim.
    Claim(ClaimReply),
    /// Ack, nack, release, dead-letter.
    Settle(SettleReply),
    /// Renew.
    Renew(RenewReply),
    /// Task get.
    Task(TaskReply),
    /// Task list.
    TaskList(TaskListReply),
    /// Task find.
    TaskFind(TaskFindReply),
    /// Wait.
    Wait(WaitReply),
    /// Cancel.
    Cancel(CancelReply),
    /// Task update.
    TaskUpdate(muster_protocol::ops::TaskUpdateReply),
    /// Watch.
    Watch(WatchReply),
    /// Admin snapshot (answered by the dispatcher once the copy is written).
    Snapshot(muster_protocol::ops::SnapshotReply),
    /// Cluster status, add, remove (answered by the connection on a cluster node).
    Cluster(muster_protocol::ops::ClusterStatusReply),
    /// Limit set, get.
    Limit(muster_protocol::ops::LimitReply),
    /// Limit list.
    LimitList(muster_protocol::ops::LimitListReply),
    /// Schedule set, get, pause, resume.
    Schedule(muster_protocol::ops::ScheduleReply),
    /// Schedule list.
    ScheduleList(muster_protocol::ops::ScheduleListReply),
    /// Schedule run.
    ScheduleRun(muster_protocol::ops::ScheduleRunReply),
    /// Suspend.
    Suspend(muster_protocol::ops::SuspendReply),
    /// Resume.
    Resume(muster_protocol::ops::ResumeReply),
    /// Spawn.
    Spawn(muster_protocol::ops::SpawnReply),
    /// Emit.
    Emit(muster_protocol::ops::EmitReply),
    /// Follow.
    Follow(muster_protocol::ops::FollowReply),
}

/// Why an op failed: the client's fault (reply with the error) or the store's (stop).
#[derive(Debug)]
pub enum Failure {
    /// A reply-worthy error; nothing was changed.
    Client(ErrorBody),
    /// The store failed; the daemon must stop.
    Store(StoreError),
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        Failure::Store(e)
    }
}

impl From<ErrorBody> for Failure {
    fn from(e: ErrorBody) -> Self {
        Failure::Client(e)
    }
}

type OpResult<T> = Result<T, Failure>;

fn client(code: ErrorCode, message: impl Into<String>) -> Failure {
    Failure::Client(ErrorBody::new(code, message))
}

/// A queue in memory: options, the ids of its tasks per state, and its dispatch index.
struct Queue {
    /// The queue's name, shared by its tasks' index entries.
    name: Arc<str>,
    options: QueueOptions,
    created_ms: u64,
    /// Which ready task goes next: by label class, priority, enqueue order and key.
    dispatch: DispatchIndex,
    /// Every task by state, in id order, for counts and listings.
    by_state: [BTreeSet<Ulid>; TaskState::ALL.len()],
    /// What happened since the daemon started.
    totals: QueueTotals,
    /// A `queue_delete` is removing it: it is gone for every request, and nothing is
    /// leased from it.
    deleting: bool,
    /// Who first enqueued a task of each label set it knows, since the daemon started:
    /// a token's share of the queue's label sets ([`MAX_LABEL_CLASSES_PER_TOKEN`]).
    /// Entries of sets the queue no longer knows are dropped at the next new set.
    class_owners: HashMap<Vec<String>, Arc<str>>,
}

impl Queue {
    fn new(name: &str, options: QueueOptions, created_ms: u64) -> Queue {
        let mut dispatch = DispatchIndex::default();
        dispatch.set_fair(options.fair, options.group_weights.clone(), |_| None);
        Queue {
            name: Arc::from(name),
            options,
            created_ms,
            dispatch,
            by_state: Default::default(),
            totals: QueueTotals::default(),
            deleting: false,
            class_owners: HashMap::new(),
        }
    }

    fn ids(&self, state: TaskState) -> &BTreeSet<Ulid> {
        &self.by_state[state_index(state)]
    }
}

fn state_index(state: TaskState) -> usize {
    match state {
        TaskState::Scheduled => 0,
        TaskState::Ready => 1,
        TaskState::Leased => 2,
        TaskState::Done => 3,
        TaskState::Dead => 4,
        TaskState::Cancelled => 5,
        TaskState::Suspended => 6,
    }
}

/// Whether a task in `state` has its place in its queue's dispatch index (its key's
/// line, its label class): every unfinished state.
fn in_line(state: TaskState) -> bool {
    !state.is_finished()
}

/// What the engine keeps in memory of each task: enough to dispatch and time it,
/// never its payload or history (those are read from the store when needed).
struct Meta {
    queue: Arc<str>,
    key: Option<Arc<str>>,
    /// The labels it requires, shared with its label class.
    class: Class,
    /// Wall time a scheduled task becomes ready, a suspended one's timeout acts, or a
    /// done or cancelled one is removed; 0 in every other state.
    at_ms: u64,
    /// Current lease epoch.
    epoch: u64,
    /// Its lease; `Some` exactly when the task is leased. Boxed: most tasks are not, and
    /// one entry per stored task is most of the daemon's memory ([`META_BYTES`]).
    held: Option<Box<Held>>,
    state: TaskState,
    priority: u8,
    /// Whether it names limits (its uses are in [`Index::limited`]) and a group (in
    /// [`Index::grouped`]): a task that names neither looks neither up.
    limited: bool,
    grouped: bool,
}

/// What a stored task costs in the task map at most (its key beside it), so that
/// 1,000,000 tasks fit their 400 MiB with everything else.
const META_BYTES: usize = 80;
const _: () = assert!(std::mem::size_of::<Meta>() <= META_BYTES);

/// A leased task's lease, in memory.
#[derive(Debug, Clone)]
struct Held {
    /// Its monotonic times.
    clock: LeaseClock,
    /// The member holding it, unless anonymous.
    member: Option<Arc<str>>,
}

impl Meta {
    /// The lease's monotonic times, while leased.
    fn clock(&self) -> Option<LeaseClock> {
        self.held.as_ref().map(|h| h.clock)
    }

    /// The member holding the lease, while leased by one.
    fn member(&self) -> Option<&Arc<str>> {
        self.held.as_ref()?.member.as_ref()
    }
}

/// The monotonic times of a lease, kept in memory beside its record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LeaseClock {
    /// When it lapses unless renewed.
    deadline: u64,
    /// When its delivery was granted. Signed: a lease restored at start-up may have been
    /// granted before this run's monotonic clock began.
    granted: i64,
}

impl LeaseClock {
    /// The latest deadline `max_runtime_ms` allows this delivery (0 if already past).
    fn runtime_cap(&self, max_runtime_ms: Option<u64>) -> u64 {
        match max_runtime_ms {
            Some(max) => u64::try_from(self.granted.saturating_add_unsigned(max)).unwrap_or(0),
            None => u64::MAX,
        }
    }
}

/// When a connection was last heard from.
#[derive(Debug, Clone, Copy)]
struct Heard {
    /// Monotonic milliseconds: for liveness timeouts.
    at_ms: u64,
    /// The event number (`Members::events`): for "heard from since".
    event: u64,
}

/// A claim waiting for tasks.
struct ClaimWaiter<W> {
    waiter: W,
    claim: ops::ClaimSpec,
    deadline: u64,
}

/// A wait for tasks to finish.
struct TaskWait<W> {
    waiter: W,
    ids: Vec<Ulid>,
    deadline: u64,
}

/// Who parked a claim.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) enum Parked {
    Connection(u64),
    Principal(Box<str>),
}

/// Parked claims per connection and per principal, for their caps, and per queue
/// (a queue's consumers).
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct ParkedCounts {
    by: HashMap<Parked, usize>,
    queues: HashMap<String, usize>,
}

impl ParkedCounts {
    fn add(&mut self, waiter: &impl Waiter, queues: &[String]) {
        debug_assert!(!queues.is_empty(), "a parked claim names a queue");
        for q in queues {
            *self.queues.entry(q.clone()).or_default() += 1;
        }
        *self
            .by
            .entry(Parked::Connection(waiter.connection()))
            .or_default() += 1;
        if let Some(p) = waiter.principal() {
            *self
                .by
                .entry(Parked::Principal(p.name.as_str().into()))
                .or_default() += 1;
        }
    }

    fn count(&self, who: &Parked) -> usize {
        self.by.get(who).copied().unwrap_or(0)
    }

    /// Claims parked on `queue` (among others).
    fn on_queue(&self, queue: &str) -> usize {
        self.queues.get(queue).copied().unwrap_or(0)
    }
}

/// Where tasks may have become available since parked claims and pushes were served.
#[derive(Debug, Default)]
pub(super) struct ReadyChanged {
    /// Everywhere: a claimer or member may take tasks it could not before.
    every: bool,
    queues: std::collections::HashSet<Arc<str>>,
}

impl ReadyChanged {
    fn queue(&mut self, queue: &Arc<str>) {
        if !self.every && !self.queues.contains(queue) {
            self.queues.insert(Arc::clone(queue));
        }
        debug_assert!(self.any(), "a queue whose tasks changed is noted");
    }

    fn everywhere(&mut self) {
        self.every = true;
        self.queues.clear();
    }

    fn any(&self) -> bool {
        self.every || !self.queues.is_empty()
    }

    /// Whether a claim or subscription over `queues` may find something new.
    fn touches<'a>(&self, mut queues: impl Iterator<Item = &'a str>) -> bool {
        self.every || (!self.queues.is_empty() && queues.any(|q| self.queues.contains(q)))
    }
}

/// The engine. `W` is where replies go.
///
/// Its state is grouped by job: [`Index`] (where every stored task is), [`Caches`]
/// (records kept in memory so the hot paths read no store), [`Members`] (sessions,
/// liveness and the lapse rule), [`Waiting`] (requests answered later), [`Outbox`] (what
/// leaves after the round's persist) and [`Budget`] (what producers may still store).
/// Each group states the invariant it keeps; the engine's own fields are the store and
/// the round.
pub struct Engine<W: Waiter> {
    store: Store,
    /// Changes of the request being handled; committed when it ends.
    pending: Batch,
    /// True once a round has committed anything that needs persisting.
    dirty: bool,
    /// Moves with every committed change and member event: watches compare it with what
    /// they last sent.
    generation: u64,
    /// The last id handed out, so ids grow even if the wall clock steps back.
    last_id: Ulid,
    /// Round-robin position for claims over several queues.
    rotation: usize,
    /// Random numbers for ids and retry jitter, from the seed the engine was opened with.
    rng: SmallRng,
    /// Where every stored task is.
    index: Index,
    /// Records kept in memory.
    caches: Caches,
    /// Member sessions and liveness.
    members: Members<W::Sink>,
    /// Claims, waits and watches answered later.
    waiting: Waiting<W>,
    /// What leaves after the round's persist.
    outbox: Outbox<W>,
    /// What producers may still store.
    budget: Budget,
    /// Bulk operations under way, a slice per round (see [`bulk`]).
    bulk: bulk::BulkJobs<W>,
    /// Tasks' output, its follows and its sweep (see [`output`]).
    output: output::Output<W>,
    /// Cron schedules and their next fires (see [`schedules`]).
    schedules: schedules::Schedules,
    /// Work [`Engine::check_carried`] may do before it next runs (debug builds).
    #[cfg(debug_assertions)]
    check_credit: usize,
}

/// The in-memory indexes of the stored tasks: every task's [`Meta`], each queue's
/// per-state id sets and dispatch index, and the timer sets. Invariant: each entry is
/// derived from a task's record by [`Engine::save`] (unindex, then index again), so a
/// task is in exactly the sets its state names; indexing a task twice or unindexing
/// one that is not indexed panics.
struct Index {
    queues: BTreeMap<String, Queue>,
    /// Every limit, its buckets in use and their lines.
    limits: Limits,
    /// The limits each task that names any draws on (most tasks name none, and pay
    /// nothing for them).
    limited: IdMap<Uses>,
    /// The group of each task that names one, for fair dispatch.
    grouped: IdMap<Group>,
    /// Every stored task (a fast hash: ids are the daemon's own, never chosen by a client).
    tasks: IdMap<Meta>,
    /// Scheduled tasks by the wall time they become ready.
    scheduled: BTreeSet<(u64, Ulid)>,
    /// Suspended tasks by the wall time their timeout acts.
    suspended: BTreeSet<(u64, Ulid)>,
    /// Leased tasks by monotonic deadline.
    leases: BTreeSet<(u64, Ulid)>,
    /// Finished tasks by the wall time retention removes them.
    expiry: BTreeSet<(u64, Ulid)>,
    /// Parents and children, and the fan-ins and cascades left to do.
    family: family::Families,
}

/// Records kept in memory so that renewals, settles and first deliveries read no
/// store. Invariant: a kept record is a leased task's (at most [`LEASED_RECORDS`]) or
/// a fresh ready task's (at most [`FRESH_BYTES`]), never both, and it is the stored
/// record but for the expiry of a renewal kept in memory
/// ([`Caches::check`], [`Engine::check_kept`]).
#[derive(Default)]
struct Caches {
    /// The records of leased tasks as last saved, so that renewals and settles read no
    /// store: at most [`LEASED_RECORDS`]; a leased task beyond them is read from the store.
    leased: IdMap<TaskRecord>,
    /// Kept records renewed in memory only, each with the lease expiry its stored record
    /// still has: the only way a kept record may differ from the stored one. A renewal
    /// that neither stores progress nor extends past one lease period from now, of a
    /// lease whose stored expiry is within a period too, is not written: a restart gives
    /// every held lease the longer of a full period and what its stored expiry has left
    /// ([`Engine::open`]), so its holder's lease outlasts the deadline it was told either
    /// way, and no longer. The next write of the task stores its expiry with the rest.
    renewed_in_memory: IdMap<u64>,
    /// Tasks enqueued ready since the start whose records have not been written since,
    /// with their records and payloads as stored: a task's first delivery (the read
    /// that dominated a drain) then reads no store. At most [`FRESH_BYTES`]; a task
    /// enqueued beyond them is read from the store.
    fresh: Fresh,
}

/// Members and what the engine knows of the connections they are on: sessions,
/// liveness, push order, the label sets connected members carry, and the lapse rule.
/// Invariant: `carried` and `consumers` count exactly the connected members' label
/// sets and subscriptions ([`Engine::check_carried`]), `sessions` names each open
/// session's connection, and `events` only grows.
struct Members<S> {
    /// Members: those with a session and those holding leases.
    by_name: BTreeMap<Arc<str>, members::Member<S>>,
    /// The member whose session is on each connection.
    sessions: HashMap<u64, Arc<str>>,
    /// Members whose room for pushes may have grown since pushes were last served (a
    /// slot freed, a session opened, a subscription, capacity or labels changed, a drain
    /// ended, heard from again): serving pushes looks at these, and at every member only
    /// when tasks became ready, never at every member for one member's renewal.
    push_members: BTreeSet<Arc<str>>,
    /// The label sets of members counted as connected (session open and reachable):
    /// kept as members come and go, so each queue knows its unclaimable classes.
    carried: dispatch::Carried,
    /// Connected, not draining members subscribed to each queue.
    consumers: HashMap<String, u32>,
    /// Round-robin position for pushes over members.
    rotation: usize,
    /// Member names and the principal that first used each (with tokens configured).
    owners: authz::Owners,
    /// When each open connection was last heard from: any packet, as reported by the
    /// connection layer, or any request.
    heard: HashMap<u64, Heard>,
    /// Ready tasks whose last lease lapsed or was revoked: the member that let each go,
    /// and the event number of that moment. See [`Engine::avoided`].
    avoid: HashMap<Ulid, (Arc<str>, u64)>,
    /// Numbers hearing from connections and leases let go, in the order they happen:
    /// "heard from since the lapse" compares these, never milliseconds.
    events: u64,
    /// Members whose last lease ended while they had no session: forgotten at the end
    /// of the request or timer, once it is sure no lease came back (a renewal re-indexes
    /// its task: the member must survive the moment in between).
    idle: Vec<Arc<str>>,
    /// Monotonic time of the next liveness sweep.
    liveness_sweep_at: u64,
}

/// Requests answered later, and what tells them to look again. Invariant: `parked`
/// counts exactly the `claim_waiters` ([`Engine::check_carried`]), each parked claim
/// and wait has a deadline, so [`Engine::next_timer`] ends every one.
struct Waiting<W: Waiter> {
    claim_waiters: Vec<ClaimWaiter<W>>,
    /// How many of `claim_waiters` each connection and principal parked.
    parked: ParkedCounts,
    task_waits: Vec<TaskWait<W>>,
    /// The queues where some task became ready (or a key or the queue freed up) since
    /// claims and pushes were last served: only claims and members of those are served.
    ready_changed: ReadyChanged,
    /// Some task finished since waits were last checked.
    finished_changed: bool,
    /// Each connection's watch, if it has one.
    watches: HashMap<u64, watch::Watcher<W::Sink>>,
}

/// What leaves the engine after the round's persist: replies, pushes to member
/// sessions, watch pushes and snapshots to write. Invariant: nothing here is sent
/// before the round's changes are durable (the dispatcher takes it only after the
/// persist), and each vector is drained every round, keeping its capacity.
struct Outbox<W: Waiter> {
    /// Replies, each with where it goes.
    replies: Vec<(W, Result<Reply, ErrorBody>)>,
    /// Pushes to member sessions.
    pushes: Vec<(W::Sink, muster_protocol::Push)>,
    /// Watch pushes, each with its watch's flag for the writer to clear once written.
    watch_pushes: Vec<WatchPush<W::Sink>>,
    /// Snapshots asked for this round, for the dispatcher to write from a view of the
    /// store taken after the round's persist. At most one request per connection's
    /// in-flight slot: bounded like every reply.
    snapshots: Vec<(W, std::path::PathBuf)>,
}

/// What producers may still store: the quotas, the bytes each principal's tasks hold,
/// and the disk alarm. Invariant: `stored_bytes` holds, per principal, the sum of the
/// stored bytes of the stored tasks it enqueued, and no zero entry.
#[derive(Default)]
struct Budget {
    quotas: Quotas,
    /// Payload bytes of the stored tasks each principal enqueued: kept as tasks are
    /// enqueued and removed, and rebuilt from the records at start.
    stored_bytes: rustc_hash::FxHashMap<String, u64>,
    /// The disk alarm is on: enqueues are refused (set by the dispatcher, which reads
    /// the disk; see `crate::disk`).
    disk_alarm: bool,
}

impl Index {
    /// A queue by name: `not_found` if there is none, or it is being deleted.
    fn queue(&self, name: &str) -> OpResult<&Queue> {
        // A queue being deleted is gone already for every request.
        self.queues
            .get(name)
            .filter(|q| !q.deleting)
            .ok_or_else(|| client(ErrorCode::NotFound, format!("no queue {name:?}")))
    }
}

impl Caches {
    /// A task's kept record: a leased task's, or a fresh task's.
    fn record(&self, id: Ulid) -> Option<&TaskRecord> {
        debug_assert!(
            !(self.leased.contains_key(&id) && self.fresh.tasks.contains_key(&id)),
            "task {id}: kept both as leased and as fresh"
        );
        self.leased
            .get(&id)
            .or_else(|| self.fresh.tasks.get(&id).map(|k| &k.0))
    }

    /// A task's record was written: it is kept if it is leased (and there is room, or
    /// it was kept already), and it is no longer fresh nor renewed in memory only.
    fn written(&mut self, id: Ulid, rec: &TaskRecord) {
        self.renewed_in_memory.remove(&id);
        self.fresh.forget(id);
        if rec.state == TaskState::Leased
            && (self.leased.len() < LEASED_RECORDS || self.leased.contains_key(&id))
        {
            self.leased.insert(id, rec.clone());
        } else {
            self.leased.remove(&id);
        }
        assert!(
            self.leased.len() <= LEASED_RECORDS,
            "at most {LEASED_RECORDS} leased records kept"
        );
        debug_assert!(
            self.leased
                .get(&id)
                .is_none_or(|kept| kept.state == TaskState::Leased),
            "task {id}: only a leased task's record is kept as leased"
        );
    }

    /// Asserts that every record kept in memory is a leased task's or a fresh ready
    /// one's, and the fresh tasks' byte count (each copy is compared with the store's
    /// when it is read: [`Engine::record`], [`Engine::payload`]).
    #[cfg(any(debug_assertions, test))]
    fn check(&self, tasks: &IdMap<Meta>) {
        assert!(self.leased.len() <= LEASED_RECORDS);
        for id in self.renewed_in_memory.keys() {
            assert!(
                self.leased.contains_key(id),
                "task {id}: renewed in memory but not kept"
            );
        }
        for id in self.leased.keys() {
            assert_eq!(
                tasks[id].state,
                TaskState::Leased,
                "task {id}: a kept record"
            );
        }
        let mut bytes = 0;
        for (id, kept) in self.fresh.tasks.iter() {
            let (rec, payload) = &**kept;
            assert_eq!(
                tasks[id].state,
                TaskState::Ready,
                "task {id}: a fresh task that is no longer ready"
            );
            assert!(!self.leased.contains_key(id), "task {id}: fresh and leased");
            bytes += Fresh::cost(rec, payload);
        }
        assert_eq!(bytes, self.fresh.bytes, "fresh tasks' bytes");
        assert!(bytes <= FRESH_BYTES);
    }

    /// A task was removed: nothing of it stays kept.
    fn forget(&mut self, id: Ulid) {
        self.leased.remove(&id);
        self.renewed_in_memory.remove(&id);
        self.fresh.forget(id);
    }
}

impl<S: Sink> Members<S> {
    /// No member yet; member names bound to principals as loaded from the store.
    fn new(owners: authz::Owners) -> Members<S> {
        Members {
            by_name: BTreeMap::new(),
            sessions: HashMap::new(),
            push_members: BTreeSet::new(),
            carried: dispatch::Carried::default(),
            consumers: HashMap::new(),
            rotation: 0,
            owners,
            heard: HashMap::new(),
            avoid: HashMap::new(),
            events: 0,
            idle: Vec::new(),
            liveness_sweep_at: 0,
        }
    }

    /// Forgets members left with neither a lease nor a session (nor a drain) by the
    /// request or timer that just ran.
    fn forget_idle(&mut self) {
        for name in std::mem::take(&mut self.idle) {
            if self
                .by_name
                .get(&name)
                .is_some_and(members::Member::is_idle)
            {
                debug_assert!(
                    !self.sessions.values().any(|n| *n == name),
                    "member {name:?}: forgotten while the sessions map names it"
                );
                self.by_name.remove(&name);
            }
        }
    }
}

impl<W: Waiter> Waiting<W> {
    /// Nothing waiting.
    fn new() -> Waiting<W> {
        Waiting {
            claim_waiters: Vec::new(),
            parked: ParkedCounts::default(),
            task_waits: Vec::new(),
            ready_changed: ReadyChanged::default(),
            finished_changed: false,
            watches: HashMap::new(),
        }
    }

    /// Parks a claim until tasks come or its deadline passes, counting it.
    fn park(&mut self, w: ClaimWaiter<W>) {
        debug_assert!(w.claim.max > 0, "a parked claim wants at least one task");
        self.parked.add(&w.waiter, &w.claim.queues);
        self.claim_waiters.push(w);
    }

    /// Parks again the claims still waiting after serving them, counted anew.
    fn repark(&mut self, keep: Vec<ClaimWaiter<W>>) {
        assert!(
            self.claim_waiters.is_empty(),
            "parked claims are served all at once"
        );
        self.parked = ParkedCounts::default();
        let kept = keep.len();
        for w in keep {
            self.park(w);
        }
        assert_eq!(
            self.claim_waiters.len(),
            kept,
            "every claim still waiting is parked again, once"
        );
    }
}

impl<W: Waiter> Outbox<W> {
    /// Nothing to send.
    fn new() -> Outbox<W> {
        Outbox {
            replies: Vec::new(),
            pushes: Vec::new(),
            watch_pushes: Vec::new(),
            snapshots: Vec::new(),
        }
    }

    /// Whether the round has anything to tell: replies, pushes or snapshots to start.
    fn is_empty(&self) -> bool {
        self.replies.is_empty()
            && self.pushes.is_empty()
            && self.watch_pushes.is_empty()
            && self.snapshots.is_empty()
    }
}

/// Leased tasks whose records the engine keeps in memory (see `Caches::leased`): a few
/// hundred bytes each, so at most some tens of MiB.
const LEASED_RECORDS: usize = 65_536;

/// Most bytes of fresh tasks (see `Caches::fresh`) kept in memory, as [`Fresh::cost`]
/// counts them (757 bytes for a task with a 256-byte payload): some 88,000 such tasks.
const FRESH_BYTES: usize = 64 << 20;

/// Tasks enqueued and not written since (see `Caches::fresh`), within [`FRESH_BYTES`].
#[derive(Default)]
struct Fresh {
    /// Boxed: the map's slots stay small, and so do its moves as it grows.
    tasks: IdMap<Box<(TaskRecord, RawJson)>>,
    /// What [`Fresh::cost`] counts for every kept task.
    bytes: usize,
}

impl Fresh {
    /// What a kept task is counted for: its payload, its record's strings and timeline,
    /// and the map's entry.
    fn cost(rec: &TaskRecord, payload: &RawJson) -> usize {
        let strings = rec.queue.len()
            + rec.key.as_ref().map_or(0, String::len)
            + rec.idempotency_key.as_ref().map_or(0, String::len)
            + rec.enqueued_by.as_ref().map_or(0, String::len)
            + rec.requires.iter().map(String::len).sum::<usize>();
        payload.get().len()
            + strings
            + rec.history.len() * std::mem::size_of::<TimelineEvent>()
            + std::mem::size_of::<(TaskRecord, RawJson)>()
            + std::mem::size_of::<(Ulid, Box<(TaskRecord, RawJson)>)>()
    }

    /// Keeps a task just enqueued, if it is ready (a delayed one is written when it
    /// becomes ready, which would end its freshness before its delivery) and the budget
    /// has room for it.
    fn keep(&mut self, id: Ulid, rec: &TaskRecord, payload: &RawJson) {
        if rec.state != TaskState::Ready {
            return;
        }
        assert_eq!(
            rec.deliveries, 0,
            "task {id}: only a task never delivered is fresh"
        );
        let cost = Fresh::cost(rec, payload);
        if self.bytes + cost <= FRESH_BYTES {
            let old = self
                .tasks
                .insert(id, Box::new((rec.clone(), payload.clone())));
            assert!(old.is_none(), "task {id} enqueued twice");
            self.bytes += cost;
        }
        assert!(
            self.bytes <= FRESH_BYTES,
            "fresh tasks are kept within {FRESH_BYTES} bytes"
        );
    }

    /// Lets a task go: it was written (its record is no longer the one kept) or removed.
    fn forget(&mut self, id: Ulid) {
        if let Some(kept) = self.tasks.remove(&id) {
            let cost = Fresh::cost(&kept.0, &kept.1);
            assert!(
                self.bytes >= cost,
                "task {id}: the fresh tasks' byte count never underflows"
            );
            self.bytes -= cost;
        }
    }
}

/// Debug builds recount what [`Engine::check_carried`] checks after every request and
/// timer while the state is small; on a larger one, as often as keeps the recount at
/// this many items (members, parked claims, label classes, kept records) per call on
/// average. The checks stay on in every test without making a test with thousands of
/// parked claims or fresh tasks quadratic (and its timings those of the checks).
#[cfg(debug_assertions)]
const CHECK_ITEMS_PER_CALL: usize = 256;

impl<W: Waiter> Engine<W> {
    /// Opens the engine over a store, rebuilding the in-memory state from it.
    ///
    /// Every lease still held gets at least one full lease period from `now`: nobody
    /// could renew while the daemon was down. The new deadlines are written back with
    /// the first round, so readers see the lease a holder really has.
    pub fn open(store: Store, now: Now, seed: u64) -> Result<Engine<W>, StoreError> {
        let owners = authz::Owners::new(store.load_owners()?, now);
        let mut engine = Engine {
            pending: store.batch(),
            store,
            dirty: false,
            generation: 0,
            last_id: Ulid::nil(),
            rotation: 0,
            rng: SmallRng::seed_from_u64(seed),
            index: Index {
                queues: BTreeMap::new(),
                limits: Limits::new(now.mono_ms),
                limited: IdMap::default(),
                grouped: IdMap::default(),
                tasks: IdMap::default(),
                scheduled: BTreeSet::new(),
                suspended: BTreeSet::new(),
                leases: BTreeSet::new(),
                expiry: BTreeSet::new(),
                family: family::Families::default(),
            },
            caches: Caches::default(),
            members: Members::new(owners),
            waiting: Waiting::new(),
            outbox: Outbox::new(),
            budget: Budget::default(),
            bulk: bulk::BulkJobs::new(),
            output: output::Output::new(),
            schedules: schedules::Schedules::default(),
            #[cfg(debug_assertions)]
            check_credit: 0,
        };
        engine.load_queues()?;
        engine.load_limits(now)?;
        engine.load_schedules()?;
        engine.load_tasks(now)?;
        engine.load_output()?;
        engine.commit()?;
        // A wake or cascade a crash cut short is finished before anything is served.
        engine.restore_families()?;
        engine.settle_families(now)?;
        debug_assert!(
            engine.index.tasks.keys().all(|id| *id <= engine.last_id),
            "ids handed out from now on grow past every stored one"
        );
        Ok(engine)
    }

    /// Loads every stored queue, each with no task yet.
    fn load_queues(&mut self) -> Result<(), StoreError> {
        assert!(self.index.queues.is_empty(), "queues are loaded once");
        for (name, rec) in self.store.load_queues()? {
            telemetry::queue_created(&name);
            self.index
                .queues
                .insert(name.clone(), Queue::new(&name, rec.options, rec.created_ms));
        }
        Ok(())
    }

    /// Indexes every stored task ([`Self::restore`]). Each record is indexed as it is
    /// read and dropped at once: start-up holds the index, never the whole store, in
    /// memory.
    fn load_tasks(&mut self, now: Now) -> Result<(), StoreError> {
        assert_eq!(self.index.tasks.len(), 0, "tasks are loaded once");
        let store = self.store.clone();
        self.index.tasks.reserve(store.approximate_task_count());
        let mut failure = None;
        store.for_each_task(|id, rec| {
            if failure.is_none()
                && let Err(e) = self.restore(id, rec, now)
            {
                failure = Some(e);
            }
        })?;
        if let Some(e) = failure {
            return Err(e);
        }
        let counted = |state| {
            self.index
                .queues
                .values()
                .map(|q| q.ids(state).len())
                .sum::<usize>()
        };
        assert_eq!(
            self.index.leases.len(),
            counted(TaskState::Leased),
            "every leased task restored has its deadline indexed, once"
        );
        assert_eq!(
            self.index.scheduled.len(),
            counted(TaskState::Scheduled),
            "every scheduled task restored has its time indexed, once"
        );
        assert_eq!(
            self.index.suspended.len(),
            counted(TaskState::Suspended),
            "every suspended task restored has its timeout indexed, once"
        );
        Ok(())
    }

    /// Indexes one stored task at start-up. A lease still held gets at least a full
    /// lease period from now, written back with the first round.
    fn restore(&mut self, id: Ulid, rec: TaskIndex, now: Now) -> Result<(), StoreError> {
        let Some(queue) = self.index.queues.get(&rec.queue) else {
            return Err(StoreError::Corrupt {
                what: format!("task {id}"),
                detail: format!("names missing queue {}", rec.queue),
            });
        };
        let clock = rec.lease.as_ref().map(|lease| {
            let left = lease.expires_ms.saturating_sub(now.wall_ms);
            let full = queue.options.lease_ms;
            let elapsed =
                i64::try_from(now.wall_ms.saturating_sub(lease.granted_ms)).unwrap_or(i64::MAX);
            let mut clock = LeaseClock {
                deadline: now.mono_ms + left.max(full).min(MAX_LEASE.as_millis() as u64),
                // The delivery's age carries over the restart: max_runtime_ms still holds.
                granted: (now.mono_ms as i64).saturating_sub(elapsed),
            };
            clock.deadline = clock.deadline.min(
                clock
                    .runtime_cap(queue.options.max_runtime_ms)
                    .max(now.mono_ms),
            );
            assert!(
                clock.deadline >= now.mono_ms,
                "task {id}: a restored lease's deadline is not before now"
            );
            clock
        });
        self.last_id = self.last_id.max(id);
        if let Some(principal) = &rec.enqueued_by {
            self.budget.count(principal, rec.stored_bytes);
        }
        if let Some(clock) = clock
            && let Some(mut full) = self.store.task(id)?
            && let Some(lease) = full.lease.as_mut()
        {
            // Show the deadline the lease really has now.
            lease.expires_ms = now.wall_ms + (clock.deadline - now.mono_ms);
            self.pending.put_task(id, &full);
        }
        self.index_record(id, rec.view(), clock);
        Ok(())
    }

    /// Handles one request, queueing its reply (now, or later for waits and claims).
    ///
    /// Returns an error only when the store failed; the daemon must then stop.
    pub fn handle(
        &mut self,
        req: muster_protocol::ops::EngineRequest,
        waiter: W,
        now: Now,
    ) -> Result<(), StoreError> {
        self.index.limits.set_now(now.mono_ms);
        // Tasks whose room came since the last round are dispatchable for this request.
        self.admit_waiting_on_limits();
        #[cfg(debug_assertions)]
        let before = self.digest();
        let result = match self.dispatch(req, waiter, now) {
            Ok(()) => {
                tracing::debug!("applied");
                self.commit()?;
                self.settle_families(now)
            }
            Err((waiter, Failure::Client(e))) => {
                tracing::debug!(code = e.code.as_str(), error = %e.message, "refused");
                // A refused request changed nothing: every op validates before it mutates.
                #[cfg(debug_assertions)]
                assert_eq!(
                    self.digest(),
                    before,
                    "a refused request ({}) changed the engine",
                    e.code.as_str()
                );
                // Nothing was written for a refused request; drop any partial batch.
                self.pending = self.store.batch();
                self.outbox.replies.push((waiter, Err(e)));
                Ok(())
            }
            Err((_, Failure::Store(e))) => Err(e),
        };
        assert!(
            result.is_err() || self.pending.is_empty(),
            "a request's changes are committed or dropped when it ends"
        );
        self.members.forget_idle();
        #[cfg(debug_assertions)]
        self.check_carried_now_and_then();
        result
    }

    /// [`Self::check_carried`] when it has earned it (see [`CHECK_ITEMS_PER_CALL`]).
    #[cfg(debug_assertions)]
    fn check_carried_now_and_then(&mut self) {
        let items = self.members.by_name.len()
            + self.waiting.claim_waiters.len()
            + self.caches.leased.len()
            + self.caches.fresh.tasks.len()
            + self
                .index
                .queues
                .values()
                .map(|q| q.dispatch.classes())
                .sum::<usize>();
        self.check_credit += CHECK_ITEMS_PER_CALL;
        if self.check_credit >= items {
            self.check_credit = 0;
            self.check_carried();
            self.check_output();
        }
    }

    /// Asserts that the counts of connected members (label sets, consumers per queue)
    /// and of parked claims are exact and that every queue's unclaimable count matches
    /// its classes (debug builds: every test; and the engine's own tests in any build).
    #[cfg(any(debug_assertions, test))]
    fn check_carried(&self) {
        let mut carried = dispatch::Carried::default();
        let mut consumers: HashMap<String, u32> = HashMap::new();
        for m in self.members.by_name.values() {
            let counted = m.counted();
            if let Some(labels) = &counted.labels {
                carried.add(labels);
            }
            for q in counted.consumes {
                *consumers.entry(q).or_default() += 1;
            }
        }
        assert_eq!(
            carried, self.members.carried,
            "connected members' label sets miscounted"
        );
        assert_eq!(
            consumers, self.members.consumers,
            "subscribed members miscounted"
        );
        let mut parked = ParkedCounts::default();
        for w in &self.waiting.claim_waiters {
            parked.add(&w.waiter, &w.claim.queues);
        }
        assert_eq!(parked, self.waiting.parked, "parked claims miscounted");
        for q in self.index.queues.values() {
            q.dispatch.check_unclaimable(None);
        }
        self.index.limits.check();
        self.caches.check(&self.index.tasks);
    }

    /// [`Self::check_carried`], and every class's claimability against the label sets
    /// (classes × sets: for tests that change members).
    #[cfg(test)]
    fn check_claimability(&self) {
        self.check_carried();
        for q in self.index.queues.values() {
            q.dispatch.check_unclaimable(Some(&self.members.carried));
        }
    }

    /// What a request may change in memory, in brief: compared before and after a
    /// refused request (debug builds, so every test checks it).
    #[cfg(debug_assertions)]
    fn digest(&self) -> Vec<usize> {
        let mut d = vec![
            self.schedules.digest(),
            self.index.tasks.len(),
            self.index.scheduled.len(),
            self.index.suspended.len(),
            self.index.leases.len(),
            self.index.expiry.len(),
            self.members.by_name.len(),
            self.index.queues.len(),
            self.waiting.claim_waiters.len(),
            self.waiting.task_waits.len(),
            self.outbox.replies.len(),
            self.outbox.pushes.len(),
            self.members.owners.len(),
            self.waiting.watches.len(),
            self.members.avoid.len(),
            self.caches.leased.len(),
            self.index.limits.count(),
            self.index.limited.len(),
            self.index.family.len().0,
            self.index.family.len().1,
        ];
        d.extend(self.output.digest());
        for q in self.index.queues.values() {
            d.extend(q.by_state.iter().map(BTreeSet::len));
            d.push(q.dispatch.held_back() as usize);
            d.push(q.dispatch.waiting_on_limits() as usize);
        }
        d.extend(self.members.by_name.values().map(|m| m.leased.len()));
        d
    }

    /// Runs every timer due at `now` and serves waiting claims and waits.
    pub fn tick(&mut self, now: Now) -> Result<(), StoreError> {
        self.index.limits.set_now(now.mono_ms);
        self.sweep_liveness(now);
        self.fire_schedules(now)?;
        self.promote_scheduled(now)?;
        self.time_out_suspensions(now)?;
        self.lapse_leases(now)?;
        self.expire_finished(now)?;
        self.expire_member_names(now);
        self.bulk_slice(now)?;
        self.sweep_output(now)?;
        self.commit()?;
        self.settle_families(now)?;
        self.admit_waiting_on_limits();
        self.forget_ended_throttles();
        let ready = std::mem::take(&mut self.waiting.ready_changed);
        self.serve_claims(&ready, now)?;
        self.serve_pushes(&ready, now)?;
        self.serve_follows(now)?;
        self.serve_waits(now)?;
        self.commit()?;
        debug_assert!(
            self.index
                .scheduled
                .first()
                .is_none_or(|&(at, _)| at > now.wall_ms),
            "every scheduled task due was made ready"
        );
        debug_assert!(
            self.index
                .leases
                .first()
                .is_none_or(|&(at, _)| at > now.mono_ms),
            "every lease past its deadline lapsed"
        );
        debug_assert!(
            self.index
                .suspended
                .first()
                .is_none_or(|&(at, _)| at > now.wall_ms),
            "every suspension past its timeout ended"
        );
        self.members.forget_idle();
        #[cfg(debug_assertions)]
        self.check_carried_now_and_then();
        self.serve_watches(now)
    }

    /// Milliseconds until the next timer is due, if any.
    pub fn next_timer(&self, now: Now) -> Option<u64> {
        let wall = |at: u64| at.saturating_sub(now.wall_ms);
        let mono = |at: u64| at.saturating_sub(now.mono_ms);
        [
            self.index.scheduled.first().map(|(at, _)| wall(*at)),
            self.schedules.next_fire().map(wall),
            self.index.suspended.first().map(|(at, _)| wall(*at)),
            self.index.leases.first().map(|(at, _)| mono(*at)),
            self.index.expiry.first().map(|(at, _)| wall(*at)),
            self.index.limits.next_timer().map(mono),
            self.waiting
                .claim_waiters
                .iter()
                .map(|w| mono(w.deadline))
                .min(),
            self.waiting
                .task_waits
                .iter()
                .map(|w| mono(w.deadline))
                .min(),
            self.next_watch().map(mono),
            self.output.next_timer().0.map(mono),
            // Removed tasks' output left to delete: at once, after the rest.
            self.output.next_timer().1.then_some(0),
            (!self.members.sessions.is_empty()).then(|| mono(self.members.liveness_sweep_at)),
            self.members.owners.next_sweep().map(mono),
            // The next slice of a bulk job or cascade: at once, after whatever else is
            // waiting.
            self.bulk_pending().then_some(0),
            self.index.family.pending().then_some(0),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Takes the replies ready to be sent. The outbox keeps its capacity for the next
    /// round: a round of hundreds of replies would otherwise grow a new one from empty,
    /// and each growth of a large one fault in fresh pages.
    pub fn take_outbox(&mut self) -> std::vec::Drain<'_, (W, Result<Reply, ErrorBody>)> {
        assert!(
            self.pending.is_empty(),
            "replies leave only once their round's changes are committed"
        );
        self.outbox.replies.drain(..)
    }

    /// Takes the pushes ready to be sent to member sessions (keeping the capacity, as
    /// `take_outbox`).
    pub fn take_pushes(&mut self) -> std::vec::Drain<'_, (W::Sink, muster_protocol::Push)> {
        assert!(
            self.pending.is_empty(),
            "pushes leave only once their round's changes are committed"
        );
        self.outbox.pushes.drain(..)
    }

    /// Takes the watch pushes ready to be sent. The writer clears each one's flag once
    /// it has encoded the push; until then the watch sends nothing more.
    pub fn take_watch_pushes(&mut self) -> std::vec::Drain<'_, WatchPush<W::Sink>> {
        self.outbox.watch_pushes.drain(..)
    }

    /// True if anything was committed since the last call: the round must be persisted
    /// before its replies leave.
    pub fn take_dirty(&mut self) -> bool {
        std::mem::take(&mut self.dirty)
    }

    /// Sets the Prometheus gauges from the counts the engine keeps (no task scan).
    pub fn publish_gauges(&self, now: Now) {
        let members: Vec<_> = self
            .members
            .by_name
            .iter()
            .map(|(name, m)| m.info(name))
            .collect();
        telemetry::publish(&telemetry::Snapshot {
            queues: self
                .index
                .queues
                .iter()
                .map(|(name, q)| self.queue_info(name, q))
                .collect(),
            members: &members,
            limits: self.index.limits.infos(
                self.index
                    .limits
                    .names_after(None, MAX_LIMITS)
                    .iter()
                    .map(|n| &**n),
                now.wall_ms,
            ),
            schedules: self.schedules.counts(),
            connected: self.connected_members(),
            unreachable: self.unreachable_members(),
            now_ms: now.wall_ms,
        });
        // A failure to read the sizes only leaves the gauge at its last value.
        if let Ok(bytes) = self.store.disk_space() {
            metrics::gauge!("muster_store_size_bytes").set(bytes as f64);
        }
    }

    /// Whether a snapshot was asked for since the last [`Engine::take_snapshots`].
    pub fn wants_snapshot(&self) -> bool {
        !self.outbox.snapshots.is_empty()
    }

    /// The snapshots asked for since the last call, with where each goes.
    pub fn take_snapshots(&mut self) -> Vec<(W, std::path::PathBuf)> {
        std::mem::take(&mut self.outbox.snapshots)
    }

    /// Turns the disk alarm on or off: while on, enqueues are refused with `disk_full`
    /// and everything else is served.
    pub fn set_disk_alarm(&mut self, on: bool) {
        if self.budget.disk_alarm != on {
            // Watching consoles show the alarm: their screens are due again.
            self.generation += 1;
        }
        self.budget.disk_alarm = on;
    }

    /// Whether the round has anything to tell: replies, pushes or snapshots to start.
    pub fn has_output(&self) -> bool {
        !self.outbox.is_empty()
    }

    /// The store, for persisting.
    pub fn store(&self) -> &Store {
        &self.store
    }

    fn commit(&mut self) -> Result<(), StoreError> {
        if !self.pending.is_empty() {
            let batch = std::mem::replace(&mut self.pending, self.store.batch());
            batch.commit()?;
            self.dirty = true;
            self.generation += 1;
        }
        Ok(())
    }

    /// A new task id: of `now`'s millisecond, and above every id handed out before.
    fn next_id(&mut self, now: Now) -> Ulid {
        let candidate = Ulid::from_parts(now.wall_ms, self.rng.random::<u128>());
        let id = if candidate > self.last_id {
            candidate
        } else {
            // The clock stepped back or this millisecond is crowded: keep ids growing.
            self.last_id.increment().unwrap_or(candidate)
        };
        assert!(
            !self.index.tasks.contains_key(&id),
            "task id {id} handed out twice"
        );
        assert!(id > self.last_id, "task ids only grow");
        self.last_id = id;
        id
    }

    /// Loads a task's record; `not_found` if the id is unknown.
    fn record(&self, id: Ulid) -> OpResult<TaskRecord> {
        if !self.index.tasks.contains_key(&id) {
            return Err(client(ErrorCode::NotFound, format!("no task {id}")));
        }
        if let Some(rec) = self.caches.record(id) {
            #[cfg(debug_assertions)]
            {
                self.check_kept(id, rec)?;
                self.check_indexed(id, rec);
            }
            return Ok(rec.clone());
        }
        let rec = self.store.task(id)?.ok_or_else(|| {
            Failure::Store(StoreError::Corrupt {
                what: format!("task {id}"),
                detail: "indexed but not stored".into(),
            })
        })?;
        #[cfg(debug_assertions)]
        self.check_indexed(id, &rec);
        Ok(rec)
    }

    /// Asserts that a task's record and its index entry agree: its state, queue and
    /// epoch (debug builds, at every read of a record).
    #[cfg(debug_assertions)]
    fn check_indexed(&self, id: Ulid, rec: &TaskRecord) {
        let meta = &self.index.tasks[&id];
        assert_eq!(
            meta.state, rec.state,
            "task {id}: its index entry and its record disagree on its state"
        );
        assert_eq!(
            &*meta.queue, rec.queue,
            "task {id}: its index entry and its record disagree on its queue"
        );
        assert_eq!(
            meta.epoch,
            rec.lease.as_ref().map_or(rec.deliveries, |l| l.epoch),
            "task {id}: its index entry and its record disagree on its epoch"
        );
    }

    /// Asserts that a record kept in memory is the stored one, but for the expiry of a
    /// renewal in memory: checked with nothing pending, when the store holds every
    /// saved record.
    #[cfg(debug_assertions)]
    fn check_kept(&self, id: Ulid, rec: &TaskRecord) -> Result<(), StoreError> {
        if !self.pending.is_empty() {
            return Ok(());
        }
        let mut stored = rec.clone();
        if let Some(&expires_ms) = self.caches.renewed_in_memory.get(&id) {
            stored
                .lease
                .as_mut()
                .expect("a task renewed in memory is leased")
                .expires_ms = expires_ms;
        }
        assert!(
            self.store.holds_exactly(id, &stored)?,
            "task {id}: the kept record is not the stored one"
        );
        Ok(())
    }

    /// A task's payload, from memory while the task is fresh.
    fn payload(&self, id: Ulid) -> OpResult<RawJson> {
        if let Some(kept) = self.caches.fresh.tasks.get(&id) {
            let payload = &kept.1;
            #[cfg(debug_assertions)]
            assert!(
                !self.pending.is_empty() || self.store.payload(id)?.get() == payload.get(),
                "task {id}: the fresh payload is not the stored one"
            );
            return Ok(payload.clone());
        }
        Ok(self.store.payload(id)?)
    }

    /// Writes a task's record and re-indexes it from the record. `clock` holds the
    /// monotonic times of a leased record and must be `Some` exactly when it is leased.
    fn save(&mut self, id: Ulid, rec: &TaskRecord, clock: Option<LeaseClock>) {
        // A task being enqueued has nothing to unindex yet.
        if self.index.tasks.contains_key(&id) {
            self.unindex(id);
        }
        self.index_record(id, rec.view(), clock);
        self.write(id, rec);
        debug_assert!(
            self.index.queues[rec.queue.as_str()]
                .ids(rec.state)
                .contains(&id),
            "task {id}: saved {} and indexed so in its queue",
            rec.state
        );
    }

    /// Writes a task's record, its index unchanged, and keeps it if it is leased.
    fn write(&mut self, id: Ulid, rec: &TaskRecord) {
        assert_eq!(
            rec.state == TaskState::Leased,
            rec.lease.is_some(),
            "task {id}: a record holds a lease exactly while leased"
        );
        assert!(
            rec.state != TaskState::Dead || rec.dead_reason.is_some(),
            "task {id}: a dead record says why it died"
        );
        assert!(
            !matches!(rec.state, TaskState::Done | TaskState::Cancelled)
                || rec.finished_ms.is_some(),
            "task {id}: a finished record says when it finished (its retention counts from it)"
        );
        self.pending.put_task(id, rec);
        self.caches.written(id, rec);
    }

    /// Renews a lease: moves its deadline (nothing else of its index changes) and
    /// writes its record, or keeps it in memory only (see `Caches::renewed_in_memory`).
    /// `plain_until` is set for a renewal without progress whose deadline is within a
    /// lease period: the wall time a restart's full period would reach, which the
    /// stored expiry must not pass for the record to stay in memory.
    fn renew_lease(
        &mut self,
        id: Ulid,
        rec: TaskRecord,
        clock: LeaseClock,
        plain_until: Option<u64>,
    ) {
        let meta = self
            .index
            .tasks
            .get_mut(&id)
            .unwrap_or_else(|| panic!("task {id}: renewed but not indexed"));
        if let Some(member) = meta.member() {
            // Its holder is alive: pushes it was passed over for may go to it now.
            self.members.push_members.insert(Arc::clone(member));
        }
        assert_eq!(
            rec.lease.as_ref().map(|l| l.epoch),
            Some(meta.epoch),
            "task {id}: the renewed lease is the indexed one"
        );
        let held = meta
            .held
            .as_mut()
            .unwrap_or_else(|| panic!("task {id}: renewed but not leased"));
        assert_eq!(
            held.clock.granted, clock.granted,
            "task {id}: a renewal regranted"
        );
        assert!(
            self.index.leases.remove(&(held.clock.deadline, id)),
            "task {id}: lease not indexed"
        );
        assert!(
            self.index.leases.insert((clock.deadline, id)),
            "task {id} leased twice"
        );
        held.clock = clock;
        if let Some(kept) = self.caches.leased.get_mut(&id) {
            let stored = match self.caches.renewed_in_memory.get(&id) {
                Some(&expires_ms) => expires_ms,
                None => {
                    kept.lease
                        .as_ref()
                        .expect("a kept record is leased")
                        .expires_ms
                }
            };
            if plain_until.is_some_and(|until| stored <= until) {
                self.caches.renewed_in_memory.insert(id, stored);
                *kept = rec;
                // Watching consoles show the new expiry.
                self.generation += 1;
                return;
            }
        }
        self.write(id, &rec);
    }

    /// Writes every lease of `queue` renewed in memory: its lease period is shorter
    /// now, so a restart would no longer give them the deadlines their holders have.
    fn store_renewals(&mut self, queue: &str) {
        let ids: Vec<Ulid> = self
            .caches
            .renewed_in_memory
            .keys()
            .filter(|id| &*self.index.tasks[id].queue == queue)
            .copied()
            .collect();
        for id in ids {
            let rec = self.caches.leased[&id].clone();
            self.write(id, &rec);
        }
        debug_assert!(
            self.caches
                .renewed_in_memory
                .keys()
                .all(|id| &*self.index.tasks[id].queue != queue),
            "queue {queue:?}: a renewal left in memory"
        );
    }

    /// Removes a task from the store and every index.
    fn remove(&mut self, id: Ulid, rec: &TaskRecord) {
        debug_assert_eq!(
            self.index.tasks.get(&id).map(|m| &*m.queue),
            Some(rec.queue.as_str()),
            "task {id}: removed from the queue its index entry names"
        );
        if let Some(principal) = &rec.enqueued_by {
            self.budget.uncount(principal, rec.stored_bytes);
        }
        self.unindex(id);
        self.index.tasks.remove(&id);
        self.index.limited.remove(&id);
        self.index.grouped.remove(&id);
        self.index.family.removed(id);
        self.output.removed(id);
        self.caches.forget(id);
        self.members.avoid.remove(&id);
        // A wait on this task can end now: it reports it as removed.
        self.waiting.finished_changed = true;
        self.pending
            .remove_task(id, &rec.queue, rec.idempotency_key.as_deref());
    }

    fn index_record(&mut self, id: Ulid, rec: IndexView<'_>, clock: Option<LeaseClock>) {
        assert_eq!(
            rec.state == TaskState::Leased,
            clock.is_some() && rec.lease.is_some(),
            "task {id}: a lease clock exactly for a leased record"
        );
        let Some(queue) = self.index.queues.get(rec.queue) else {
            panic!("task {id} names queue {:?}, which is not loaded", rec.queue);
        };
        let queue_name = Arc::clone(&queue.name);
        let remove_at = rec
            .finished_ms
            .map_or(0, |f| f.saturating_add(queue.options.retention_ms));
        let at_ms = match rec.state {
            TaskState::Scheduled => rec.not_before_ms.unwrap_or(0),
            TaskState::Suspended => rec.timeout_at_ms.unwrap_or(0),
            TaskState::Done | TaskState::Cancelled => remove_at,
            TaskState::Ready | TaskState::Leased | TaskState::Dead => 0,
        };
        assert!(
            rec.state != TaskState::Scheduled || rec.not_before_ms.is_some(),
            "task {id}: a scheduled task names when it becomes ready"
        );
        assert_eq!(
            rec.state == TaskState::Suspended,
            rec.timeout_at_ms.is_some(),
            "task {id}: a record holds a suspension exactly while suspended"
        );
        assert!(
            rec.lease.is_none_or(|l| l.epoch == rec.deliveries),
            "task {id}: a lease's epoch is the task's delivery count"
        );
        let held = clock.map(|clock| {
            Box::new(Held {
                clock,
                member: rec
                    .lease
                    .filter(|l| !l.member.is_empty())
                    .map(|l| self.members.name(&l.member)),
            })
        });
        if !rec.limits.is_empty() && !self.index.limited.contains_key(&id) {
            let uses: Uses = rec
                .limits
                .iter()
                .map(|l| Use {
                    limit: self
                        .index
                        .limits
                        .name(&l.limit)
                        .map_or_else(|| Arc::from(l.limit.as_str()), Arc::clone),
                    key: Arc::from(l.key.as_deref().unwrap_or("")),
                    cost: l.cost,
                })
                .collect();
            self.index.limited.insert(id, uses);
        }
        if let Some(group) = rec.group
            && !self.index.grouped.contains_key(&id)
        {
            self.index.grouped.insert(id, Group::from(group));
        }
        let meta = Meta {
            queue: queue_name,
            key: rec.key.map(Arc::from),
            class: queue.dispatch.class(rec.requires),
            at_ms,
            epoch: rec.lease.map_or(rec.deliveries, |l| l.epoch),
            held,
            state: rec.state,
            priority: rec.priority,
            limited: !rec.limits.is_empty(),
            grouped: rec.group.is_some(),
        };
        self.index(id, &meta);
        if meta.state.is_finished() {
            self.waiting.finished_changed = true;
        }
        self.index.family.indexed(id, rec.parent, meta.state);
        self.index.tasks.insert(id, meta);
    }

    fn index(&mut self, id: Ulid, meta: &Meta) {
        if meta.state != TaskState::Ready {
            // Only a ready task can go to the member that let it lapse.
            self.members.avoid.remove(&id);
        }
        let queue = self
            .index
            .queues
            .get_mut(&*meta.queue)
            .unwrap_or_else(|| panic!("task {id}: its queue {:?} is not loaded", meta.queue));
        assert!(
            queue.by_state[state_index(meta.state)].insert(id),
            "task {id} indexed twice as {}",
            meta.state
        );
        if in_line(meta.state) {
            queue.dispatch.add(
                task_ref(id, meta, &self.index.limited, &self.index.grouped),
                queue.options.key_concurrency,
                &self.members.carried,
                &mut Gate {
                    limits: &mut self.index.limits,
                    queue: &meta.queue,
                },
            );
        }
        match meta.state {
            TaskState::Ready => {
                debug_assert!(
                    meta.held.is_none() && meta.at_ms == 0,
                    "task {id}: a ready task holds no lease and waits for no time"
                );
                self.waiting.ready_changed.queue(&meta.queue);
            }
            TaskState::Scheduled => {
                assert!(
                    self.index.scheduled.insert((meta.at_ms, id)),
                    "task {id} scheduled twice"
                );
            }
            TaskState::Suspended => {
                assert!(
                    self.index.suspended.insert((meta.at_ms, id)),
                    "task {id} suspended twice"
                );
            }
            TaskState::Leased => {
                let clock = meta.clock().expect("a leased task has a lease clock");
                assert!(
                    self.index.leases.insert((clock.deadline, id)),
                    "task {id} leased twice"
                );
                if let Some(uses) = uses_of(id, meta, &self.index.limited) {
                    self.index.limits.hold(uses);
                }
                if let Some(member) = meta.member() {
                    let fresh = self
                        .members
                        .by_name
                        .entry(Arc::clone(member))
                        .or_insert_with(members::Member::new)
                        .leased
                        .insert(id);
                    assert!(fresh, "task {id} held twice by member {member:?}");
                }
            }
            TaskState::Done | TaskState::Cancelled => {
                assert!(
                    self.index.expiry.insert((meta.at_ms, id)),
                    "task {id} expires twice"
                );
            }
            TaskState::Dead => {}
        }
    }

    fn unindex(&mut self, id: Ulid) {
        let meta = self
            .index
            .tasks
            .get(&id)
            .unwrap_or_else(|| panic!("task {id} unindexed but not indexed"));
        self.index.family.unindexed(id, meta.state);
        let queue = self
            .index
            .queues
            .get_mut(&*meta.queue)
            .unwrap_or_else(|| panic!("task {id}: its queue {:?} is not loaded", meta.queue));
        assert!(
            queue.by_state[state_index(meta.state)].remove(&id),
            "task {id} was not indexed as {}",
            meta.state
        );
        if in_line(meta.state) {
            queue.dispatch.remove(
                task_ref(id, meta, &self.index.limited, &self.index.grouped),
                queue.options.key_concurrency,
                &mut Gate {
                    limits: &mut self.index.limits,
                    queue: &meta.queue,
                },
            );
            if meta.key.is_some() {
                // The key's line moved: its next task may be dispatchable now.
                self.waiting.ready_changed.queue(&meta.queue);
            }
        }
        match meta.state {
            TaskState::Ready => {}
            TaskState::Scheduled => {
                assert!(
                    self.index.scheduled.remove(&(meta.at_ms, id)),
                    "task {id}: not scheduled"
                );
            }
            TaskState::Suspended => {
                assert!(
                    self.index.suspended.remove(&(meta.at_ms, id)),
                    "task {id}: not suspended"
                );
            }
            TaskState::Leased => {
                let clock = meta.clock().expect("a leased task has a lease clock");
                assert!(
                    self.index.leases.remove(&(clock.deadline, id)),
                    "task {id}: lease not indexed"
                );
                if let Some(uses) = uses_of(id, meta, &self.index.limited) {
                    self.index.limits.release(uses);
                }
                if let Some(member) = meta.member() {
                    let member = Arc::clone(member);
                    self.members.release_slot(&member, id);
                }
            }
            TaskState::Done | TaskState::Cancelled => {
                assert!(
                    self.index.expiry.remove(&(meta.at_ms, id)),
                    "task {id}: no expiry"
                );
            }
            TaskState::Dead => {}
        }
    }

    /// Makes every scheduled task whose time came ready.
    fn promote_scheduled(&mut self, now: Now) -> Result<(), StoreError> {
        while let Some(&(at, id)) = self.index.scheduled.first() {
            if at > now.wall_ms {
                break;
            }
            let mut rec = self.record(id).map_err(store_only)?;
            assert_eq!(rec.state, TaskState::Scheduled, "task {id}: scheduled");
            assert_eq!(
                rec.not_before_ms,
                Some(at),
                "task {id}: scheduled for the time its record names"
            );
            rec.state = TaskState::Ready;
            rec.not_before_ms = None;
            rec.updated_ms = now.wall_ms;
            self.save(id, &rec, None);
            assert!(
                !self.index.scheduled.contains(&(at, id)),
                "task {id}: promoted but still scheduled"
            );
            self.commit()?;
        }
        Ok(())
    }

    /// Ends every lease whose deadline passed: a failure of its task, which goes to
    /// another member if one can take it.
    fn lapse_leases(&mut self, now: Now) -> Result<(), StoreError> {
        while let Some(&(at, id)) = self.index.leases.first() {
            if at > now.mono_ms {
                break;
            }
            let mut rec = self.record(id).map_err(store_only)?;
            let lease = rec
                .lease
                .take()
                .expect("a task with a lease deadline has a lease");
            assert_eq!(
                lease.epoch, self.index.tasks[&id].epoch,
                "task {id}: the lapsing lease is the indexed one"
            );
            telemetry::lease_ended(id, &rec, &lease, LeaseEnd::Lapsed, now.wall_ms);
            let (member, epoch) = (lease.member, lease.epoch);
            let error = format!("lease lapsed (member {member:?}, epoch {epoch})");
            if let Some(q) = self.index.queues.get_mut(&rec.queue) {
                q.totals.lapsed += 1;
            }
            push_event(&mut rec, now, "lapsed", Some(&member), Some(epoch), None);
            tracing::info!(task = %id, member = %member, epoch, "lease lapsed");
            if self.fail(id, &mut rec, now, error, Some(0)) == TaskState::Ready {
                self.members.let_go(id, &member);
            }
            assert!(
                !self.index.leases.contains(&(at, id)),
                "task {id}: lapsed but still leased"
            );
            self.commit()?;
        }
        Ok(())
    }

    /// Removes finished tasks past their retention, at most [`RETENTION_BATCH`] a round.
    fn expire_finished(&mut self, now: Now) -> Result<(), StoreError> {
        let mut removed = 0;
        while let Some(&(at, id)) = self.index.expiry.first() {
            if at > now.wall_ms || removed == RETENTION_BATCH {
                break;
            }
            removed += 1;
            if self.index.family.unfinished(id) > 0 {
                // A parent is kept while a child of it is unfinished: its children name
                // it, and a cancelled one's cascade goes on from it (also after a
                // restart). Looked at again a little later.
                let later = now.wall_ms + RETENTION_RECHECK_MS;
                let meta = self
                    .index
                    .tasks
                    .get_mut(&id)
                    .expect("an expiring task is indexed");
                assert_eq!(meta.at_ms, at, "task {id}: expires when its index says");
                meta.at_ms = later;
                assert!(
                    self.index.expiry.remove(&(at, id)),
                    "task {id}: expiry indexed"
                );
                self.index.expiry.insert((later, id));
                continue;
            }
            let rec = self.record(id).map_err(store_only)?;
            assert!(
                matches!(rec.state, TaskState::Done | TaskState::Cancelled),
                "task {id}: only done and cancelled tasks expire, not {}",
                rec.state
            );
            debug_assert!(
                rec.finished_ms.is_some_and(|f| f <= at),
                "task {id}: removed by retention after it finished"
            );
            self.remove(id, &rec);
        }
        self.commit()
    }

    /// Ends a leased task's delivery that failed: cancelled if a cancel is pending (no
    /// failure counted: the work was to stop anyway), else counts a failure and moves
    /// it to dead if out of attempts, else retries it after `delay_ms` (or the backoff).
    fn fail(
        &mut self,
        id: Ulid,
        rec: &mut TaskRecord,
        now: Now,
        error: String,
        delay_ms: Option<u64>,
    ) -> TaskState {
        assert_eq!(
            rec.state,
            TaskState::Leased,
            "task {id}: only a delivery fails"
        );
        rec.lease = None;
        let backoff = self
            .index
            .queues
            .get(&rec.queue)
            .map(|q| q.options.retry_backoff)
            .unwrap_or_default();
        // A task whose cancel is pending ends cancelled, no failure counted.
        let ended = if rec.cancel_requested {
            rec.last_error = Some(error);
            self.cancel_if_requested(rec, now, None, None)
        } else {
            self.count_failure(id, rec, now, error, None)
        };
        if !ended {
            let delay = delay_ms.unwrap_or_else(|| {
                let exp = backoff
                    .factor
                    .powi(i32::try_from(rec.failures - 1).unwrap_or(i32::MAX));
                let base = (backoff.base_ms as f64 * exp).min(backoff.cap_ms as f64);
                let spread = base * backoff.jitter;
                let jittered = base + self.rng.random_range(-1.0..=1.0) * spread;
                jittered.clamp(0.0, backoff.cap_ms as f64) as u64
            });
            rec.updated_ms = now.wall_ms;
            if delay == 0 {
                rec.state = TaskState::Ready;
                rec.not_before_ms = None;
            } else {
                rec.state = TaskState::Scheduled;
                rec.not_before_ms = Some(now.wall_ms + delay);
            }
        }
        assert!(
            !matches!(rec.state, TaskState::Leased | TaskState::Done),
            "task {id}: a failed delivery ends {}",
            rec.state
        );
        assert!(
            rec.state != TaskState::Scheduled
                || rec.not_before_ms.is_some_and(|nb| nb > now.wall_ms),
            "task {id}: a retry is scheduled in the future"
        );
        self.save(id, rec, None);
        rec.state
    }

    /// A task whose cancel is pending ends `cancelled` (event `cancelled`, naming the
    /// member and epoch when given). Returns whether it did. The one place that turns a
    /// pending cancel into `cancelled`.
    fn cancel_if_requested(
        &self,
        rec: &mut TaskRecord,
        now: Now,
        member: Option<&str>,
        epoch: Option<u64>,
    ) -> bool {
        if !rec.cancel_requested {
            return false;
        }
        assert_eq!(
            rec.state,
            TaskState::Leased,
            "a cancel is pending only while a task is leased"
        );
        push_event(rec, now, "cancelled", member, epoch, None);
        self.finish(rec, TaskState::Cancelled, now);
        true
    }

    /// Counts a failure against a task, with its error: it goes to dead when out of
    /// attempts (returns whether it did). The one place a failure is counted.
    fn count_failure(
        &self,
        id: Ulid,
        rec: &mut TaskRecord,
        now: Now,
        error: String,
        member: Option<&str>,
    ) -> bool {
        let before = rec.failures;
        rec.failures += 1;
        rec.last_error = Some(error);
        let dead = self.dead_if_out_of_attempts(id, rec, now, member);
        assert_eq!(rec.failures, before + 1, "{id}: one failure counted");
        assert_eq!(
            dead,
            rec.state == TaskState::Dead,
            "{id}: dead when out of attempts"
        );
        dead
    }

    /// A task whose failures reached its queue's `max_attempts` goes to dead (reason
    /// `max_attempts`, event `dead_lettered` naming `member` when given). Returns whether
    /// it did. The one place that turns failures into dead.
    fn dead_if_out_of_attempts(
        &self,
        id: Ulid,
        rec: &mut TaskRecord,
        now: Now,
        member: Option<&str>,
    ) -> bool {
        let max = self
            .index
            .queues
            .get(&rec.queue)
            .map_or(0, |q| q.options.max_attempts);
        assert!(
            rec.failures > 0,
            "task {id}: only a counted failure makes it run out of attempts"
        );
        if max == 0 || rec.failures < u64::from(max) {
            return false;
        }
        rec.state = TaskState::Dead;
        rec.lease = None;
        rec.dead_reason = Some(telemetry::DEAD_MAX_ATTEMPTS.into());
        telemetry::dead(id, &rec.queue, telemetry::DEAD_MAX_ATTEMPTS);
        rec.updated_ms = now.wall_ms;
        push_event(
            rec,
            now,
            "dead_lettered",
            member,
            None,
            Some("max_attempts"),
        );
        true
    }

    /// Moves a task to done or cancelled, starting its retention.
    fn finish(&self, rec: &mut TaskRecord, to: TaskState, now: Now) {
        assert!(
            matches!(to, TaskState::Done | TaskState::Cancelled),
            "a task finishes done or cancelled, not {to}"
        );
        assert!(
            !rec.state.is_finished(),
            "a task finishes once (it is {} already)",
            rec.state
        );
        if to == TaskState::Cancelled {
            telemetry::cancelled(&rec.queue);
        }
        rec.state = to;
        rec.lease = None;
        rec.not_before_ms = None;
        rec.suspension = None;
        rec.finished_ms = Some(now.wall_ms);
        rec.updated_ms = now.wall_ms;
    }
}

/// The limits task `id` draws on, if it names any (`limited` holds them).
fn uses_of<'a>(id: Ulid, meta: &Meta, limited: &'a IdMap<Uses>) -> Option<&'a Uses> {
    let uses = meta.limited.then(|| limited.get(&id)).flatten();
    debug_assert_eq!(uses.is_some(), meta.limited, "task {id}: its uses are kept");
    uses
}

/// What the dispatch index knows of task `id`.
fn task_ref<'a>(
    id: Ulid,
    meta: &'a Meta,
    limited: &'a IdMap<Uses>,
    grouped: &'a IdMap<Group>,
) -> TaskRef<'a> {
    let group = meta.grouped.then(|| grouped.get(&id)).flatten();
    debug_assert_eq!(
        group.is_some(),
        meta.grouped,
        "task {id}: its group is kept"
    );
    TaskRef {
        id,
        state: meta.state,
        priority: meta.priority,
        key: meta.key.as_ref(),
        class: &meta.class,
        uses: uses_of(id, meta, limited),
        group,
    }
}

fn store_only(f: Failure) -> StoreError {
    match f {
        Failure::Store(e) => e,
        Failure::Client(e) => StoreError::Corrupt {
            what: "index".into(),
            detail: e.message,
        },
    }
}

/// Appends an event to a task's timeline, dropping the oldest but the first beyond the limit.
fn push_event(
    rec: &mut TaskRecord,
    now: Now,
    event: &str,
    member: Option<&str>,
    epoch: Option<u64>,
    error: Option<&str>,
) {
    if rec.history.len() >= MAX_HISTORY {
        rec.history.remove(1);
    }
    rec.history.push(TimelineEvent {
        at_ms: now.wall_ms,
        event: event.to_owned(),
        member: member.map(str::to_owned),
        epoch,
        error: error.map(str::to_owned),
    });
    debug_assert!(
        rec.history.len() <= MAX_HISTORY,
        "a timeline holds at most {MAX_HISTORY} events"
    );
}
