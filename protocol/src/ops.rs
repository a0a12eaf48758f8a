//! Requests and their replies, one struct per op.
//!
//! A request frame is `{"id": N, "op": "NAME", ...fields}`; its reply is
//! `{"id": N, "ok": true, ...reply fields}` or `{"id": N, "ok": false, "error": {code, message}}`.
//! Unknown fields are ignored, so clients may send fields newer daemons understand.
//! [`decode_request`] turns a frame body into a typed [`Request`].

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::RawJson;
use crate::error::{ErrorBody, ErrorCode};
use crate::model::{
    CatchUp, Delivery, EnqueuedTask, LimitInfo, LimitSpec, MemberInfo, NewTask, OnTimeout,
    QueueInfo, QueuePatch, ScheduleInfo, TaskInfo, TaskState, TaskSummary,
};

/// A request type: its op name and the type of its successful reply.
pub trait Op: Serialize {
    /// The `op` string on the wire.
    const NAME: &'static str;
    /// The fields of a successful reply.
    type Reply: DeserializeOwned + Serialize;

    /// Whether the daemon may hold the reply back until something happens (a claim
    /// or wait with a time to wait), so a client closing need not wait for it.
    fn may_wait(&self) -> bool {
        false
    }
}

/// Reply of requests that return nothing but success.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Empty {}

/// Opens a connection: names the protocol version and presents a token.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Hello {
    /// The client's protocol version ([`crate::PROTOCOL_VERSION`]).
    pub version: u32,
    /// The client's token, if the daemon requires one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// A free-form client name for logs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<String>,
}

/// Reply to [`Hello`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HelloReply {
    /// The daemon's protocol version.
    pub version: u32,
    /// The daemon's name and version.
    pub server: String,
    /// The cluster this daemon is a node of, as the node sees it now; absent from a
    /// single daemon (one that is not a cluster node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterHello>,
    /// Who the connection acts as and what it may do: the principal of the token the
    /// `hello` presented (the local-only daemon's own token is the principal `local`,
    /// an admin of every queue). Absent from a daemon that runs `--open`, where every
    /// request is allowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<PrincipalInfo>,
}

/// A role a token grants (PROTOCOL.md §1.7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Enqueue, read tasks, wait for them, cancel them.
    Produce,
    /// Member sessions, claim, renew, settle, read tasks.
    Consume,
    /// Read, resume and reject (cancel) suspended tasks.
    Approve,
    /// Everything: holds every other role.
    Admin,
}

/// The principal a connection authenticated as, in a [`HelloReply`]: the token's name,
/// roles and patterns as the daemon's config gives them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrincipalInfo {
    /// The token's name.
    pub name: String,
    /// Its roles, as configured (admin holds every role).
    pub roles: Vec<Role>,
    /// Glob patterns of the queues it may act on; empty means every queue.
    pub queues: Vec<String>,
    /// Glob patterns of the member names it may use; empty means any name.
    pub members: Vec<String>,
}

impl PrincipalInfo {
    /// Whether it holds `role` (admin holds every role).
    pub fn holds(&self, role: Role) -> bool {
        self.roles.contains(&role) || self.roles.contains(&Role::Admin)
    }

    /// Whether it may act on every queue (no queue patterns).
    pub fn covers_all(&self) -> bool {
        self.queues.is_empty()
    }
}

/// What a cluster node tells a client in its [`HelloReply`]: whom it believes to lead,
/// so that a client can go to the leader.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterHello {
    /// The cluster's id (`musterd --cluster-id`), the same on every node.
    pub cluster_id: String,
    /// This node's id.
    pub node: u64,
    /// The term this node is in.
    pub term: u64,
    /// The node this node believes leads; absent during an election.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<u64>,
    /// The leader's client address `HOST:PORT`, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader_addr: Option<String>,
}

/// Creates a queue.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QueueCreate {
    /// The queue's name.
    pub queue: String,
    /// Options to set; absent ones take their defaults.
    #[serde(default)]
    pub options: QueuePatch,
}

/// Reply carrying one queue.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QueueReply {
    /// The queue.
    pub queue: QueueInfo,
}

/// Lists queues, a page at a time, by name.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct QueueList {
    /// Start after this queue name (the `next` of the previous page).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
    /// Page size, 1 to [`crate::limits::MAX_PAGE`]; 100 if absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

/// Reply to [`QueueList`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QueueListReply {
    /// The page of queues, by name.
    pub queues: Vec<QueueInfo>,
    /// The cursor of the next page; `None` on the last one.
    #[serde(default)]
    pub next: Option<String>,
}

/// Names one queue (describe, pause, resume, purge, delete).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QueueName {
    /// The queue's name.
    pub queue: String,
}

/// Changes a queue's options.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QueueUpdate {
    /// The queue's name.
    pub queue: String,
    /// Options to change.
    pub options: QueuePatch,
}

/// Shows one queue.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QueueDescribe(pub QueueName);
/// Pauses a queue: it keeps accepting enqueues but hands nothing out.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QueuePause(pub QueueName);
/// Resumes a paused queue.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QueueResume(pub QueueName);
/// Removes every ready and scheduled task of a queue.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QueuePurge(pub QueueName);
/// Deletes a queue and every task in it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QueueDelete(pub QueueName);

/// Reply carrying a count of affected tasks.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CountReply {
    /// How many tasks the request affected (or, for a dry run, would affect).
    pub count: u64,
    /// Their ids (at most [`crate::limits::MAX_IDS`]), on a dry run only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ids: Vec<String>,
}

/// Creates a limit or replaces its settings; tasks waiting on it see the new ones at
/// once.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LimitSet {
    /// The limit's name.
    pub name: String,
    /// Its settings: a rate, a concurrency, or both.
    #[serde(flatten)]
    pub spec: LimitSpec,
}

/// Names one limit (get, delete).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LimitName {
    /// The limit's name.
    pub name: String,
}

/// Shows one limit.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LimitGet(pub LimitName);

/// Deletes a limit: tasks that name it no longer wait on it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LimitDelete(pub LimitName);

/// Reply carrying one limit.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LimitReply {
    /// The limit.
    pub limit: LimitInfo,
}

/// Lists limits, a page at a time, by name.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LimitList {
    /// Start after this limit name (the `next` of the previous page).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
    /// Page size, 1 to [`crate::limits::MAX_PAGE`]; 100 if absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

/// Reply to [`LimitList`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LimitListReply {
    /// The page of limits, by name.
    pub limits: Vec<LimitInfo>,
    /// The cursor of the next page; `None` on the last one.
    #[serde(default)]
    pub next: Option<String>,
}

/// Creates a schedule or replaces its settings: each time its cron pattern names,
/// one task is enqueued into its queue (idempotency key `schedule:NAME:FIRE_MS`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ScheduleSet {
    /// The schedule's name.
    pub name: String,
    /// A cron pattern: five fields (minute granularity), or six with seconds first;
    /// `@hourly`-style aliases and croner's extensions (`L`, `#`, `W`) are accepted.
    pub cron: String,
    /// The IANA time zone the pattern is read in; `UTC` if absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tz: Option<String>,
    /// The queue its tasks go to (it must exist).
    pub queue: String,
    /// The task each fire enqueues: as an enqueue's task, without an idempotency key or
    /// `not_before_ms` (each fire sets its own).
    pub task: NewTask,
    /// What it does with missed fires; `skip` if absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub catch_up: Option<CatchUp>,
    /// Create it (or leave it) paused; a replaced schedule keeps its state if absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
}

// Boxed in `Request` (a schedule's task makes it the largest request), so its `Op` is
// spelled out here rather than by `ops!`.
impl Op for ScheduleSet {
    const NAME: &'static str = "schedule_set";
    type Reply = ScheduleReply;
}

/// Names one schedule (get, pause, resume, delete, run).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ScheduleName {
    /// The schedule's name.
    pub name: String,
}

/// Shows one schedule.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ScheduleGet(pub ScheduleName);

/// Pauses a schedule: it does not fire until resumed.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SchedulePause(pub ScheduleName);

/// Resumes a paused schedule: it fires from its next time after now (the times it
/// passed while paused do not fire).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ScheduleResume(pub ScheduleName);

/// Deletes a schedule (the tasks it enqueued stay).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ScheduleDelete(pub ScheduleName);

/// Enqueues the schedule's task now, once, whatever its pattern and pause; its fires
/// go on as before.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ScheduleRun(pub ScheduleName);

/// Reply carrying one schedule.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ScheduleReply {
    /// The schedule.
    pub schedule: ScheduleInfo,
}

/// Reply to [`ScheduleRun`]: the task enqueued.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ScheduleRunReply {
    /// The task.
    pub task: EnqueuedTask,
}

/// Lists schedules, a page at a time, by name.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ScheduleList {
    /// Start after this schedule name (the `next` of the previous page).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
    /// Page size, 1 to [`crate::limits::MAX_PAGE`]; 100 if absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

/// Reply to [`ScheduleList`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ScheduleListReply {
    /// The page of schedules, by name (those of queues the caller may see).
    pub schedules: Vec<ScheduleInfo>,
    /// The cursor of the next page; `None` on the last one.
    #[serde(default)]
    pub next: Option<String>,
}

/// Enqueues one task or a batch.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Enqueue {
    /// The queue.
    pub queue: String,
    /// The tasks, 1 to [`crate::limits::MAX_BATCH`].
    pub tasks: Vec<NewTask>,
}

/// Reply to [`Enqueue`]: one entry per task, in request order.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EnqueueReply {
    /// The outcome of each task.
    pub tasks: Vec<EnqueuedTask>,
}

/// Leases up to `max` ready tasks from the named queues, waiting up to `wait_ms` for one.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Claim {
    /// Queues to serve, round robin.
    pub queues: Vec<String>,
    /// Most tasks to lease (1 to [`crate::limits::MAX_CLAIM`]); 1 if absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<u32>,
    /// How long to wait for a first task; 0 or absent returns at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<u64>,
    /// Lease to grant; the queue's if absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_ms: Option<u64>,
    /// The member the leases belong to; anonymous if absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member: Option<String>,
    /// Labels of the claimer, matched against tasks' `requires`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub labels: Vec<String>,
}

impl Claim {
    /// Whether the reply may be held back for a task to become ready.
    pub fn waits(&self) -> bool {
        self.wait_ms.unwrap_or(0) > 0
    }

    /// A claim of one task from these queues, returning at once, with the queue's lease.
    pub fn new<S: Into<String>>(queues: impl IntoIterator<Item = S>) -> Claim {
        Claim {
            queues: queues.into_iter().map(Into::into).collect(),
            max: None,
            wait_ms: None,
            lease_ms: None,
            member: None,
            labels: Vec::new(),
        }
    }

    /// Lease up to `n` tasks.
    pub fn max(mut self, n: u32) -> Claim {
        self.max = Some(n);
        self
    }

    /// Wait up to `ms` for a first task.
    pub fn wait_ms(mut self, ms: u64) -> Claim {
        self.wait_ms = Some(ms);
        self
    }

    /// Ask for this lease instead of the queue's.
    pub fn lease_ms(mut self, ms: u64) -> Claim {
        self.lease_ms = Some(ms);
        self
    }

    /// Hold the leases under this member name.
    pub fn member(mut self, name: impl Into<String>) -> Claim {
        self.member = Some(name.into());
        self
    }

    /// Claim with these labels.
    pub fn labels<S: Into<String>>(mut self, labels: impl IntoIterator<Item = S>) -> Claim {
        self.labels = labels.into_iter().map(Into::into).collect();
        self
    }
}

/// Reply to [`Claim`]: the leased tasks, possibly none.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClaimReply {
    /// The deliveries.
    pub tasks: Vec<Delivery>,
}

/// Settles a leased task as done.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Ack {
    /// The task's id.
    pub task: String,
    /// The lease epoch.
    pub epoch: u64,
    /// A result to store with the task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<RawJson>,
}

/// Hands a leased task back as failed, to be retried after a delay.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Nack {
    /// The task's id.
    pub task: String,
    /// The lease epoch.
    pub epoch: u64,
    /// Delay before the retry; the queue's backoff if absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
    /// What went wrong.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Gives a task back because a provider it calls said to slow down (an HTTP 429, a
/// quota error): the task is ready again at its place without a failure (it spends no
/// attempt), and the limit's bucket it draws on for its key hands out nothing for
/// `retry_after_ms`. Without `limit`, every limit the task names is throttled; a task
/// that names none is not handed out again before `retry_after_ms`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Throttled {
    /// The task's id.
    pub task: String,
    /// The lease epoch.
    pub epoch: u64,
    /// How long the throttled limit (or the task) waits, 1 ms to
    /// [`crate::limits::MAX_DELAY`]; [`crate::limits::DEFAULT_THROTTLE`] if absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    /// The limit the provider throttled: one the task draws on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<String>,
    /// What the provider said, for the task's timeline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Suspends a leased task instead of settling it: the lease ends (the holder's slot and
/// its limits' slots are free), no attempt is spent, the progress checkpoint is kept,
/// and the task waits as `suspended` until a `resume` with the reply's token (or an
/// admin's by task id) or its timeout.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Suspend {
    /// The task's id.
    pub task: String,
    /// The lease epoch.
    pub epoch: u64,
    /// What it waits for, shown to people (up to
    /// [`crate::limits::MAX_SUSPEND_REASON_BYTES`]).
    pub reason: String,
    /// How long it may wait, 1 ms to [`crate::limits::MAX_SUSPEND_TIMEOUT`];
    /// [`crate::limits::DEFAULT_SUSPEND_TIMEOUT`] if absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// What the timeout does; `fail` if absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_timeout: Option<OnTimeout>,
}

/// Reply to [`Suspend`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SuspendReply {
    /// `suspended`, or `cancelled` if a cancel had been asked.
    pub state: TaskState,
    /// The token that resumes this suspension once; absent when cancelled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_token: Option<String>,
    /// When the timeout acts; absent when cancelled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_at_ms: Option<u64>,
}

/// Enqueues children of a leased task, fenced by its lease (`task`, `epoch`), and with
/// `wait` suspends the task until every child has finished, in the same atomic change.
/// A child whose `child_key` the task spawned before is not enqueued again: its id is
/// answered (`duplicate`), so a reclaimed task that spawns again spawns nothing twice.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Spawn {
    /// The parent's id.
    pub task: String,
    /// Its lease epoch.
    pub epoch: u64,
    /// The children, 0 to [`crate::limits::MAX_SPAWN`].
    pub children: Vec<NewChild>,
    /// Suspend the parent until every child (of this and earlier spawns) has finished.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::nulls::refused"
    )]
    pub wait: Option<SpawnWait>,
}

/// One child of a [`Spawn`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NewChild {
    /// Its key among the parent's children: a spawn of a key spawned before answers
    /// that child.
    pub child_key: String,
    /// Its queue (any queue, the parent's or another).
    pub queue: String,
    /// The task, as an enqueue's (without an idempotency key: the child key is one).
    pub task: NewTask,
}

impl NewChild {
    /// Child `child_key` in `queue` with this payload and no other options.
    pub fn new(child_key: impl Into<String>, queue: impl Into<String>, payload: RawJson) -> Self {
        NewChild {
            child_key: child_key.into(),
            queue: queue.into(),
            task: NewTask::new(payload),
        }
    }
}

/// How a [`Spawn`]'s parent waits for its children.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SpawnWait {
    /// What it waits for, shown to people; "waiting for its children" if absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// How long it may wait, as a suspend's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// What the timeout does; `fail` if absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_timeout: Option<OnTimeout>,
}

/// Reply to [`Spawn`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SpawnReply {
    /// One per child asked for, in order.
    pub children: Vec<SpawnedChild>,
    /// The parent's state: `leased` without `wait`; with it `suspended`, or `ready`
    /// when every child had finished already, or `cancelled` if a cancel was asked.
    pub state: TaskState,
    /// With `wait`, the token that resumes the parent early (as a suspend's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_token: Option<String>,
    /// With `wait`, when its timeout acts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_at_ms: Option<u64>,
}

/// A child a [`Spawn`] enqueued, or found spawned before.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SpawnedChild {
    /// Its key among the parent's children.
    pub child_key: String,
    /// Its id.
    pub id: String,
    /// True when the parent had spawned it before.
    pub duplicate: bool,
    /// Its state.
    pub state: TaskState,
}

/// Makes a suspended task ready again at its place, handing `data` to its next holder.
/// Names the suspension by its `token`, or (admins and approvers) the task by `task`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Resume {
    /// The resume token a `suspend` replied with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// The task's id, instead of a token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
    /// What the task's next holder sees as `resumed.data` (up to
    /// [`crate::limits::MAX_RESUME_DATA_BYTES`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<RawJson>,
}

/// Reply to [`Resume`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ResumeReply {
    /// The task's id.
    pub task: String,
    /// Its new state: `ready`.
    pub state: TaskState,
}

/// Extends a lease and stores a progress checkpoint.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Renew {
    /// The task's id.
    pub task: String,
    /// The lease epoch.
    pub epoch: u64,
    /// New lease from now; the queue's lease if absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extend_ms: Option<u64>,
    /// A checkpoint to store (up to [`crate::limits::MAX_PROGRESS_BYTES`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<RawJson>,
}

/// Appends output to a held task: chunks a follower sees live and anyone reads later,
/// numbered in order from 0, kept until the task is removed (within
/// [`crate::limits::MAX_OUTPUT_BYTES`]). Fenced by the lease epoch, like a renewal.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Emit {
    /// The task's id.
    pub task: String,
    /// The lease epoch.
    pub epoch: u64,
    /// The number the first chunk is to get: the delivery's `output`, then each
    /// reply's `next`. Chunks numbered before the task's next number were stored by an
    /// earlier try of this emit (its reply lost) and are not stored again.
    pub at: u64,
    /// The chunks, 1 to [`crate::limits::MAX_EMIT_CHUNKS`].
    pub chunks: Vec<crate::model::Chunk>,
}

/// Reply to [`Emit`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EmitReply {
    /// The number the next chunk gets: the next emit's `at`.
    pub next: u64,
    /// Chunks of this emit found stored already (a repeat after a lost reply).
    #[serde(default)]
    pub repeated: u64,
    /// Wait this long before the next emit: the task's output rate
    /// ([`crate::limits::OUTPUT_RATE_BYTES`]) is spent until then.
    #[serde(default)]
    pub wait_ms: u64,
    /// An operator or producer asked to cancel the task: stop and settle it.
    pub cancel_requested: bool,
}

/// Reads a task's output from chunk `from`: what is kept there at once, else (with a
/// timeout) the next chunks as they are stored, or the task's end.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Follow {
    /// The task's id.
    pub task: String,
    /// The first chunk wanted (0 for all): the previous reply's `next`.
    #[serde(default)]
    pub from: u64,
    /// Longest wait for a chunk when none is stored from `from` and the task is not
    /// finished; 0 or absent answers at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

impl Follow {
    /// Whether the reply may be held back for output to come.
    pub fn waits(&self) -> bool {
        self.timeout_ms.unwrap_or(0) > 0
    }
}

/// Reply to [`Follow`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FollowReply {
    /// Chunks from `from` on, in order with no gap, at most
    /// [`crate::limits::MAX_FOLLOW_BYTES`] of them (at least one when any is kept).
    pub chunks: Vec<crate::model::OutputChunk>,
    /// Chunks from `from` that are no longer kept (dropped to keep the task within its
    /// output limit): `chunks` start after them.
    #[serde(default)]
    pub dropped: u64,
    /// The `from` of the next follow: one past the last chunk sent.
    pub next: u64,
    /// The task's state when answered.
    pub state: TaskState,
    /// The task is finished (done, dead or cancelled) and every chunk it emitted was
    /// sent: there is no more to follow.
    pub end: bool,
}

/// Reply to [`Renew`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RenewReply {
    /// The new deadline.
    pub lease_expires_ms: u64,
    /// The lease's length from the moment the daemon renewed it: a holder adds it to
    /// the instant it sent the renewal to get a deadline that needs no synchronized clock.
    pub lease_ms: u64,
    /// An operator or producer asked to cancel the task: stop and settle it.
    pub cancel_requested: bool,
}

/// Hands a leased task back without counting a failure (a graceful drain).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Release {
    /// The task's id.
    pub task: String,
    /// The lease epoch.
    pub epoch: u64,
}

/// Sends a leased task to dead at once.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeadLetter {
    /// The task's id.
    pub task: String,
    /// The lease epoch.
    pub epoch: u64,
    /// Why.
    pub error: String,
}

/// Reply to settle requests: the task's state afterwards.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SettleReply {
    /// The task's new state.
    pub state: TaskState,
    /// When a scheduled task becomes ready again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_before_ms: Option<u64>,
}

/// Reads one whole task.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TaskGet {
    /// The task's id.
    pub task: String,
}

/// Reply carrying one task.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TaskReply {
    /// The task.
    pub task: TaskInfo,
}

/// Lists a queue's tasks in one state, oldest first, a page at a time.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TaskList {
    /// The queue.
    pub queue: String,
    /// The state to list.
    pub state: TaskState,
    /// Start after this id (the `next` of the previous page).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
    /// Page size, 1 to [`crate::limits::MAX_PAGE`]; 100 if absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

/// Reply to [`TaskList`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TaskListReply {
    /// The page.
    pub tasks: Vec<TaskSummary>,
    /// The cursor of the next page; null on the last.
    pub next: Option<String>,
}

/// Searches tasks by what they hold, over one queue or every queue, a bounded amount of
/// work per request: a reply may hold fewer matches than `limit` (even none) and still
/// have a `next` cursor to continue from.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TaskFind {
    /// The queue to search; every queue the principal covers if absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// Only tasks in this state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<TaskState>,
    /// Only tasks whose id starts with this (case-insensitive, 1 to 26 characters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id_prefix: Option<String>,
    /// Only tasks with this key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Only tasks with this idempotency key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// Only tasks that require this label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// Only tasks whose last error contains this text (ASCII case-insensitive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Only tasks whose payload's JSON text contains this text (case-sensitive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<String>,
    /// Only tasks whose payload has this value at this path.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::nulls::refused"
    )]
    pub field: Option<FieldMatch>,
    /// Newest first (descending ids, queues in reverse name order) instead of oldest first.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub newest_first: bool,
    /// Continue after this position (the `next` of the previous reply).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::nulls::refused"
    )]
    pub after: Option<FindCursor>,
    /// Most matches to return, 1 to [`crate::limits::MAX_PAGE`]; 100 if absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

// A search is large next to the other requests: it travels boxed in a [`Request`] (the
// table above implements `Op` for the box), and clients send it as it is.
impl Op for TaskFind {
    const NAME: &'static str = "task_find";
    type Reply = TaskFindReply;
}

/// A payload field to compare: a dotted path of object keys and array indexes
/// (`order.lines.0.sku`) and the JSON value it must equal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FieldMatch {
    /// Object keys and array indexes separated by dots.
    pub path: String,
    /// The value the field must equal (numbers compare by value: `1` equals `1.0`).
    pub value: serde_json::Value,
}

/// Where a search stopped: the last task it examined and that task's queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FindCursor {
    /// The queue the search was in.
    pub queue: String,
    /// The last id examined there.
    pub id: String,
}

/// Reply to [`TaskFind`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TaskFindReply {
    /// The matches, in search order.
    pub tasks: Vec<TaskSummary>,
    /// Where to continue; `None` once every candidate was examined.
    pub next: Option<FindCursor>,
    /// Tasks examined by this request.
    pub scanned: u64,
}

/// Waits until tasks finish (done, dead or cancelled).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Wait {
    /// The tasks, 1 to [`crate::limits::MAX_IDS`].
    pub tasks: Vec<String>,
    /// Longest wait; 0 or absent checks once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

impl Wait {
    /// Whether the reply may be held back for the tasks to finish.
    pub fn waits(&self) -> bool {
        self.timeout_ms.unwrap_or(0) > 0
    }
}

/// Reply to [`Wait`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WaitReply {
    /// The finished tasks, as many as fit [`crate::limits::MAX_LISTING_BYTES`].
    pub finished: Vec<TaskInfo>,
    /// Finished tasks left out of `finished` to keep the reply within a frame: read
    /// them with `task_get`.
    #[serde(default)]
    pub omitted: Vec<String>,
    /// The ids still unfinished when the wait ended.
    pub pending: Vec<String>,
    /// The ids of tasks removed while waiting (purged, discarded or deleted with their queue).
    pub removed: Vec<String>,
}

/// Cancels a task: at once if ready, scheduled or suspended, at its settle if leased.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Cancel {
    /// The task's id.
    pub task: String,
    /// Cancel only a task in this state, else refuse (`invalid_state`) and change
    /// nothing: `suspended` rejects a task that waits for a person and nothing else,
    /// whatever happened to it since it was read. `done` and `dead` are refused
    /// (`bad_request`): such a task is never cancelled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub if_state: Option<TaskState>,
}

/// Reply to [`Cancel`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CancelReply {
    /// The state after the request: `cancelled`, or `leased` with a pending cancel.
    pub state: TaskState,
    /// True if the task is leased and its holder was asked to stop.
    pub cancel_requested: bool,
}

/// Changes a task that waits (`ready` or `scheduled`): its priority, and whether a
/// scheduled task waits for its time or becomes ready now. At least one change is named.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TaskUpdate {
    /// The task's id.
    pub task: String,
    /// The new priority, 0 to [`crate::limits::MAX_PRIORITY`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u8>,
    /// A scheduled task becomes ready now (a ready task stays as it is).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub run_now: bool,
}

/// Reply to [`TaskUpdate`]: the task as it is after the change.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TaskUpdateReply {
    /// The task.
    pub task: TaskSummary,
}

/// Names dead tasks of a queue: by ids, or all of them.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeadSelection {
    /// The queue.
    pub queue: String,
    /// The tasks; ignored when `all` is true.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ids: Vec<String>,
    /// Every dead task of the queue.
    #[serde(default)]
    pub all: bool,
    /// Only count (and list) what would be affected.
    #[serde(default)]
    pub dry_run: bool,
}

/// Makes dead tasks ready again, with failures reset to 0.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Redrive(pub DeadSelection);
/// Removes dead tasks.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Discard(pub DeadSelection);

/// Opens a member session on this connection: the agent's stable name, labels and
/// capacity, and what to do with leases the member still holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SessionOpen {
    /// The member's stable name, `[A-Za-z0-9._:/@-]{1,128}`.
    pub member: String,
    /// The member's labels, matched against tasks' `requires`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub labels: Vec<String>,
    /// Most leases pushed to it at once (1 to [`crate::limits::MAX_CAPACITY`]).
    pub capacity: u32,
    /// Re-deliver at once every task still leased to this member (a restarted agent).
    #[serde(default)]
    pub reclaim: bool,
    /// Keep the member's leases as they are (an agent that reconnected and still holds
    /// its work). With neither `reclaim` nor `resume`, they are released to their queues.
    #[serde(default)]
    pub resume: bool,
    /// With `resume`: every lease the agent knows it holds (running, or finished and not
    /// settled yet), at most [`crate::limits::MAX_RESUME_HELD`]. A lease of the member's
    /// that is not named here is one the agent never heard of (granted in a round whose
    /// reply or push was lost with its connection, e.g. a cluster leader's last round,
    /// agreed on by its successor): it is re-delivered in the reply with a new epoch and
    /// no failure counted, instead of lapsing unworked. Absent: every lease is kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<Vec<LeaseRef>>,
    /// Milliseconds of silence after which the daemon marks the member unreachable
    /// ([`crate::limits::MIN_LIVENESS`] to [`crate::limits::MAX_LIVENESS`]; default
    /// [`crate::limits::DEFAULT_LIVENESS`]). Send packets (keep-alive PINGs count) at
    /// least three times as often.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub liveness_ms: Option<u64>,
}

/// Reply to [`SessionOpen`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SessionOpenReply {
    /// Tasks re-delivered to the member (`reclaim`, or on `resume` the leases `held`
    /// did not name, with `reclaimed` false: the agent never had them), each with a new
    /// epoch.
    pub reclaimed: Vec<Delivery>,
    /// Leases released to their queues (neither `reclaim` nor `resume`).
    pub released: u64,
    /// Leases kept (`resume`; those it named in `held`, when it gave the list).
    pub kept: u64,
    /// Leases that went to dead instead of being reclaimed (out of attempts).
    pub dead: u64,
}

/// Changes a session's labels or capacity.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SessionUpdate {
    /// The member.
    pub member: String,
    /// New labels, if given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<Vec<String>>,
    /// New capacity, if given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<u32>,
}

/// Asks for tasks of these queues to be pushed to the member while it holds fewer
/// leases than its capacity. Replaces an earlier subscription.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Subscribe {
    /// The member; its session must be on this connection.
    pub member: String,
    /// Queues to serve, round robin.
    pub queues: Vec<String>,
}

/// Stops pushes to the member.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Unsubscribe {
    /// The member; its session must be on this connection.
    pub member: String,
}

/// Names one member (describe, drain).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MemberName {
    /// The member's name.
    pub member: String,
}

/// Lists members (those with a session or with leases), a page at a time by name.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct MemberList {
    /// Start after this member name (a previous page's `next`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
    /// Most members in the page (1..=[`crate::limits::MAX_PAGE`], default 1000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

/// Shows one member and its leases.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MemberDescribe(pub MemberName);

/// Drains a member: it keeps what it holds, gets nothing new, and is told so.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MemberDrain(pub MemberName);

/// Ends a member's drain: it gets work again (pushes to its session, tasks to claims
/// naming it). Nothing is pushed to the member.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MemberUndrain(pub MemberName);

/// Frees a member name bound to the principal that first used it, so that another
/// principal may use it. Refused (`invalid_state`) while the member has a session or
/// leases; `not_found` if the name is bound to nobody.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MemberRelease(pub MemberName);

/// Reply carrying one member.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MemberReply {
    /// The member.
    pub member: MemberInfo,
}

/// Reply to [`MemberList`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MemberListReply {
    /// Members by name.
    pub members: Vec<MemberInfo>,
    /// The cursor of the next page; null on the last.
    #[serde(default)]
    pub next: Option<String>,
}

/// Reply to [`MemberDescribe`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MemberDescribeReply {
    /// The member.
    pub member: MemberInfo,
    /// The tasks it holds, as many as fit [`crate::limits::MAX_LISTING_BYTES`].
    pub leases: Vec<TaskSummary>,
    /// How many tasks it holds in all.
    #[serde(default)]
    pub leases_total: u64,
}

/// Writes a consistent copy of the daemon's store into a new directory on the daemon's
/// host: a backup that a daemon opens as its `store` directory.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AdminSnapshot {
    /// Where: a directory that does not exist yet inside the daemon's snapshot root (a
    /// name there, or an absolute path inside it; no `.` or `..`).
    pub dir: String,
}

/// What `admin_snapshot` wrote.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SnapshotReply {
    /// The directory written.
    pub dir: String,
    /// Tasks in the copy.
    pub tasks: u64,
    /// Queues in the copy.
    pub queues: u64,
}

/// Revokes a lease: it lapses now (a failure is counted) and its holder is told.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LeaseRevoke {
    /// The leased task's id.
    pub task: String,
}

/// Reads the daemon's own counters (group commit, connections).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ServerStats {}

/// Reply to [`ServerStats`].
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ServerStatsReply {
    /// Dispatcher rounds that made changes durable (one fsync each with `sync` durability).
    pub syncs: u64,
    /// Requests applied in those rounds: `synced_requests / syncs` is the group-commit
    /// batch factor.
    pub synced_requests: u64,
    /// When a reply leaves: `sync` (after fdatasync: nothing acknowledged is lost) or
    /// `buffered` (after the journal is handed to the OS: a power loss may lose the last
    /// moments).
    pub durability: String,
    /// The disk alarm is on: enqueues are refused (`disk_full`) until the data
    /// directory's free space is back (absent from daemons before it: false).
    #[serde(default)]
    pub disk_alarm: bool,
    /// Milliseconds since the daemon started (absent from daemons before it: 0).
    #[serde(default)]
    pub uptime_ms: u64,
    /// Member sessions connected and reachable, as counted at most a second ago
    /// (absent from daemons before it: 0).
    #[serde(default)]
    pub members_connected: u64,
    /// How long the latest persist took, in microseconds (fdatasync with `sync`
    /// durability); 0 before the first (and from daemons before it).
    #[serde(default)]
    pub fsync_last_us: u64,
    /// The time of every persist so far added up, in microseconds: two readings give
    /// the mean over the span, `Δfsync_total_us / Δsyncs` (absent from daemons before it: 0).
    #[serde(default)]
    pub fsync_total_us: u64,
}

/// Reads the cluster as the node the request reaches sees it: its role, term, log, and
/// the members (answered by any node, leader or not).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ClusterStatus {}

/// Adds a node to the cluster (leader only): as a learner first, then, once it has caught
/// up with the log (waiting up to `catch_up_ms`, by default
/// [`crate::limits::CLUSTER_CATCH_UP`]), as a voter unless `learner`. Adding a node that
/// is a learner already promotes it, after the same wait. A node that did not catch up
/// stays a learner: it never weakens the cluster's quorum.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClusterAdd {
    /// The new node's id, unique in the cluster.
    pub node: u64,
    /// The address clients reach it at, `HOST:PORT`.
    pub addr: String,
    /// The address the other nodes reach it at, `HOST:PORT`.
    pub cluster_addr: String,
    /// Keep it a learner (it copies the log but does not vote).
    #[serde(default)]
    pub learner: bool,
    /// Longest to wait for the node to catch up before promoting it, 1 ms to
    /// [`crate::limits::MAX_CLUSTER_CATCH_UP`]; [`crate::limits::CLUSTER_CATCH_UP`] if
    /// absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub catch_up_ms: Option<u64>,
}

/// Removes a node from the cluster (leader only).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClusterRemove {
    /// The node's id.
    pub node: u64,
}

/// Reply to [`ClusterStatus`], [`ClusterAdd`] and [`ClusterRemove`]: the cluster as the
/// answering node sees it (after the change, for add and remove).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterStatusReply {
    /// The cluster's id.
    pub cluster_id: String,
    /// The answering node's id.
    pub node: u64,
    /// Its role: `leader`, `follower`, `candidate`, `learner` or `shutdown`.
    pub role: String,
    /// The term it is in.
    pub term: u64,
    /// The node it believes leads; absent during an election.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<u64>,
    /// The index of the last entry in its log; absent while the log is empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_log_index: Option<u64>,
    /// The index of the last entry it applied; absent before the first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_applied: Option<u64>,
    /// The last index its latest snapshot covers; absent before the first snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_index: Option<u64>,
    /// Every node of the cluster's membership, voters and learners, by id.
    pub members: Vec<ClusterMember>,
}

/// One node of the cluster's membership, in a [`ClusterStatusReply`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterMember {
    /// The node's id.
    pub node: u64,
    /// The address clients reach it at, `HOST:PORT`.
    pub addr: String,
    /// The address the other nodes reach it at, `HOST:PORT`.
    pub cluster_addr: String,
    /// Whether it votes (false: a learner).
    pub voter: bool,
    /// The last log index the leader knows this node holds; absent when the answering
    /// node is not the leader or does not know.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matched: Option<u64>,
}

/// One screen of the operator's view, as a `watch` asks for it. Lists come a page at a
/// time: `after` is the `next` cursor of the previous page, `limit` is 1 to
/// [`crate::limits::MAX_WATCH_ROWS`] (100 if absent).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "screen", rename_all = "snake_case")]
pub enum View {
    /// Queues with their counts, in name order; the cursor is a queue name.
    Queues {
        /// Start after this queue name.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        after: Option<String>,
        /// Page size.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        limit: Option<u32>,
    },
    /// One queue and a page of its tasks in one state, oldest first; the cursor is a task id.
    Tasks {
        /// The queue.
        queue: String,
        /// The state listed.
        state: TaskState,
        /// Start after this task id.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        after: Option<String>,
        /// Page size.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        limit: Option<u32>,
    },
    /// Dead tasks of every queue, by queue name then id; the cursor is `QUEUE/ID`.
    Dead {
        /// Start after this task id.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        after: Option<String>,
        /// Page size.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        limit: Option<u32>,
    },
    /// One task, whole.
    Task {
        /// The task's id.
        task: String,
    },
    /// One member and the tasks it holds (the first [`crate::limits::MAX_WATCH_ROWS`]
    /// by id).
    Member {
        /// The member's name.
        member: String,
    },
    /// Members, in name order; the cursor is a member name.
    Members {
        /// Start after this member name.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        after: Option<String>,
        /// Page size.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        limit: Option<u32>,
    },
    /// Limits with their state now, in name order; the cursor is a limit name. Pushed
    /// every [`crate::limits::WATCH_INTERVAL`] while watched, changed or not: buckets
    /// refill with time.
    Limits {
        /// Start after this limit name.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        after: Option<String>,
        /// Page size.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        limit: Option<u32>,
    },
    /// Schedules with their next fire, in name order; the cursor is a schedule name.
    Schedules {
        /// Start after this schedule name.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        after: Option<String>,
        /// Page size.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        limit: Option<u32>,
    },
}

/// What a [`View`] shows, as the `watch` reply and each `watch` push carry it:
/// `{"screen": "...", "data": {...}}`, the screen first. (Adjacently tagged, not
/// internally: a task's payload is kept verbatim, which an internally tagged enum cannot.)
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "screen", content = "data", rename_all = "snake_case")]
// A task screen (its task and output tail) is the largest; one screen is built and
// sent at most once a second per watch, so boxing it would save nothing that counts.
#[allow(clippy::large_enum_variant)]
pub enum WatchUpdate {
    /// A page of queues.
    Queues {
        /// The queues.
        queues: Vec<QueueInfo>,
        /// The cursor of the next page; null on the last.
        next: Option<String>,
    },
    /// A queue and a page of its tasks in one state.
    Tasks {
        /// The queue, with its counts.
        queue: QueueInfo,
        /// The state listed.
        state: TaskState,
        /// The page.
        tasks: Vec<TaskSummary>,
        /// The cursor of the next page; null on the last.
        next: Option<String>,
    },
    /// A page of dead tasks.
    Dead {
        /// The page.
        tasks: Vec<TaskSummary>,
        /// Dead tasks in every queue the watcher sees.
        total: u64,
        /// The cursor of the next page; null on the last.
        next: Option<String>,
    },
    /// One task.
    Task {
        /// The task.
        task: TaskInfo,
        /// The last chunks of its output, oldest first (at most
        /// [`crate::limits::WATCH_OUTPUT_BYTES`] of them); left out if none.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        output: Vec<crate::model::OutputChunk>,
        /// Its stored descendants, depth first (at most
        /// [`crate::limits::MAX_TREE_NODES`]); left out if it has no children.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tree: Vec<crate::model::TreeNode>,
        /// True when descendants were left out of `tree` for its size.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        tree_truncated: bool,
    },
    /// One member and its leases.
    Member {
        /// The member.
        member: MemberInfo,
        /// The tasks it holds, by id (its `leased` count says how many in all).
        leases: Vec<TaskSummary>,
    },
    /// A page of members.
    Members {
        /// The members.
        members: Vec<MemberInfo>,
        /// Members with a session connected now (of every page).
        connected: u64,
        /// The cursor of the next page; null on the last.
        next: Option<String>,
    },
    /// A page of limits.
    Limits {
        /// The limits, each with its busiest keys.
        limits: Vec<LimitInfo>,
        /// The cursor of the next page; null on the last.
        next: Option<String>,
    },
    /// A page of schedules.
    Schedules {
        /// The schedules (of queues the watcher sees).
        schedules: Vec<ScheduleInfo>,
        /// The cursor of the next page; null on the last.
        next: Option<String>,
    },
    /// What the watch showed is gone (its queue was deleted, its task removed); the
    /// watch has ended. Only ever pushed, never a reply.
    Gone {
        /// Why, e.g. `not_found`.
        error: ErrorBody,
    },
}

/// Watches one screen: the reply carries it now, then the daemon pushes it again
/// (`{"push":"watch","update":…}`) whenever something changed, at most once per
/// [`crate::limits::WATCH_INTERVAL`]. One watch per connection: a new one replaces it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Watch {
    /// The screen.
    pub view: View,
    /// A number of the client's choosing, echoed in the reply and every push of this
    /// watch, so a client can tell pushes of a replaced watch from the new one's.
    /// Absent or `null`: 0.
    #[serde(default, deserialize_with = "crate::nulls::absent")]
    pub tag: u64,
}

/// Reply to [`Watch`], and the body of each `watch` push.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WatchReply {
    /// The watch's tag.
    pub tag: u64,
    /// The screen as it is now.
    pub update: WatchUpdate,
    /// The daemon's disk alarm is on: enqueues are refused (`disk_full`). Sent only when
    /// true.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub disk_alarm: bool,
}

/// Ends the connection's watch.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Unwatch {}

/// A frame the daemon sends unasked, on the stream of a member's session or a watch.
/// On the wire: `{"push": "<kind>", ...fields}` and no `id`.
#[derive(Debug, Clone)]
pub enum Push {
    /// A task leased to the member (`{"push":"deliver","task":{Delivery}}`).
    Deliver(Delivery),
    /// A cancel was asked for a task the member holds: stop and settle it.
    Cancel(LeaseRef),
    /// An operator revoked a lease the member held: the lease is gone.
    Revoked(LeaseRef),
    /// An operator drained the member: finish what you hold, nothing new comes.
    Drain,
    /// The session ended, e.g. `replaced` by a newer session under the same member.
    Closed(ErrorBody),
    /// The watched screen changed (`{"push":"watch","tag":N,"update":{WatchUpdate}}`).
    Watch(Box<WatchReply>),
}

/// A task and lease epoch (named by a push, or by an agent resuming its session).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRef {
    /// The task's id.
    pub task: String,
    /// The lease epoch.
    pub epoch: u64,
}

/// A `deliver` push's fields: written from a borrowed [`Delivery`] (its payload is not
/// copied to encode it), read into an owned one.
#[derive(Serialize, Deserialize)]
struct DeliverBody<T> {
    task: T,
}

/// A `closed` push's fields, written borrowed and read owned as [`DeliverBody`].
#[derive(Serialize, Deserialize)]
struct ClosedBody<T> {
    error: T,
}

#[derive(Serialize)]
struct PushFrame<'a, T: Serialize> {
    push: &'static str,
    #[serde(flatten)]
    body: &'a T,
}

impl Push {
    /// The `push` string on the wire.
    pub fn name(&self) -> &'static str {
        match self {
            Push::Deliver(_) => "deliver",
            Push::Cancel(_) => "cancel",
            Push::Revoked(_) => "revoked",
            Push::Drain => "drain",
            Push::Closed(_) => "closed",
            Push::Watch(_) => "watch",
        }
    }

    /// Encodes the push as one frame appended to `out` (which a push over the frame
    /// limit leaves as it was).
    pub fn append_to(&self, out: &mut Vec<u8>) -> Result<(), crate::frame::FrameError> {
        use crate::frame::append_json;
        let push = self.name();
        match self {
            Push::Deliver(task) => append_json(
                out,
                &PushFrame {
                    push,
                    body: &DeliverBody { task },
                },
            ),
            Push::Cancel(r) | Push::Revoked(r) => append_json(out, &PushFrame { push, body: r }),
            Push::Drain => append_json(
                out,
                &PushFrame {
                    push,
                    body: &Empty {},
                },
            ),
            Push::Closed(error) => append_json(
                out,
                &PushFrame {
                    push,
                    body: &ClosedBody { error },
                },
            ),
            Push::Watch(w) => append_json(out, &PushFrame { push, body: &**w }),
        }
    }

    /// Decodes a push frame body whose envelope named `kind`.
    pub fn decode(kind: &str, body: &[u8]) -> Result<Push, String> {
        let bad = |e: serde_json::Error| format!("unreadable {kind} push: {e}");
        match kind {
            "deliver" => Ok(Push::Deliver(
                serde_json::from_slice::<DeliverBody<Delivery>>(body)
                    .map_err(bad)?
                    .task,
            )),
            "cancel" => Ok(Push::Cancel(serde_json::from_slice(body).map_err(bad)?)),
            "revoked" => Ok(Push::Revoked(serde_json::from_slice(body).map_err(bad)?)),
            "drain" => Ok(Push::Drain),
            "closed" => Ok(Push::Closed(
                serde_json::from_slice::<ClosedBody<ErrorBody>>(body)
                    .map_err(bad)?
                    .error,
            )),
            "watch" => Ok(Push::Watch(serde_json::from_slice(body).map_err(bad)?)),
            other => Err(format!("unknown push {other:?}")),
        }
    }
}

macro_rules! ops {
    (
        hello { $hvariant:ident($hty:ty) = $hname:literal -> $hreply:ty; }
        edge { $($evariant:ident($ety:ty) = $ename:literal -> $ereply:ty;)* }
        engine { $($variant:ident($ty:ty) = $name:literal -> $reply:ty $(, waits if $waits:path)?;)* }
    ) => {
        /// Every request, decoded.
        #[derive(Debug, Clone)]
        pub enum Request {
            #[doc = concat!("The `", $hname, "` op.")]
            $hvariant($hty),
            $(
                #[doc = concat!("The `", $ename, "` op.")]
                $evariant($ety),
            )*
            $(
                #[doc = concat!("The `", $name, "` op.")]
                $variant($ty),
            )*
        }

        /// The ops a daemon's connection answers itself, past the handshake, from what
        /// its node knows: its counters, its cluster.
        #[derive(Debug, Clone)]
        pub enum EdgeRequest {
            $(
                #[doc = concat!("The `", $ename, "` op.")]
                $evariant($ety),
            )*
        }

        /// The ops a daemon's engine answers: every op but the handshake and the
        /// [`EdgeRequest`]s.
        #[derive(Debug, Clone)]
        pub enum EngineRequest {
            $(
                #[doc = concat!("The `", $name, "` op.")]
                $variant($ty),
            )*
        }

        /// A request sorted by who answers it ([`Request::route`]).
        #[derive(Debug, Clone)]
        pub enum Route {
            /// The handshake, which the connection answers.
            $hvariant($hty),
            /// The connection answers it.
            Edge(EdgeRequest),
            /// The engine answers it.
            Engine(EngineRequest),
        }

        impl Op for $hty {
            const NAME: &'static str = $hname;
            type Reply = $hreply;
        }

        $(
            impl Op for $ety {
                const NAME: &'static str = $ename;
                type Reply = $ereply;
            }
        )*

        $(
            impl Op for $ty {
                const NAME: &'static str = $name;
                type Reply = $reply;
                $(
                    fn may_wait(&self) -> bool {
                        $waits(self)
                    }
                )?
            }
        )*

        impl Request {
            /// The op name.
            pub fn name(&self) -> &'static str {
                match self {
                    Request::$hvariant(_) => $hname,
                    $(Request::$evariant(_) => $ename,)*
                    $(Request::$variant(_) => $name,)*
                }
            }

            /// Whether the daemon may hold the reply back ([`Op::may_wait`]).
            pub fn may_wait(&self) -> bool {
                match self {
                    Request::$hvariant(req) => req.may_wait(),
                    $(Request::$evariant(req) => req.may_wait(),)*
                    $(Request::$variant(req) => req.may_wait(),)*
                }
            }

            /// Sorts the request by who answers it.
            pub fn route(self) -> Route {
                match self {
                    Request::$hvariant(req) => Route::$hvariant(req),
                    $(Request::$evariant(req) => Route::Edge(EdgeRequest::$evariant(req)),)*
                    $(Request::$variant(req) => Route::Engine(EngineRequest::$variant(req)),)*
                }
            }
        }

        impl EdgeRequest {
            /// The op name.
            pub fn name(&self) -> &'static str {
                match self {
                    $(EdgeRequest::$evariant(_) => $ename,)*
                }
            }
        }

        impl EngineRequest {
            /// The op name.
            pub fn name(&self) -> &'static str {
                match self {
                    $(EngineRequest::$variant(_) => $name,)*
                }
            }

            /// Whether the daemon may hold the reply back ([`Op::may_wait`]).
            pub fn may_wait(&self) -> bool {
                match self {
                    $(EngineRequest::$variant(req) => req.may_wait(),)*
                }
            }
        }

        /// Every op name this protocol version knows.
        pub const OP_NAMES: &[&str] = &[$hname, $($ename,)* $($name),*];

        fn decode_body(op: &str, body: &[u8]) -> Result<Request, ErrorBody> {
            match op {
                $hname => parse::<$hty>(body).map(Request::$hvariant),
                $($ename => parse::<$ety>(body).map(Request::$evariant),)*
                $($name => parse::<$ty>(body).map(Request::$variant),)*
                other => Err(ErrorBody::new(
                    ErrorCode::UnknownOp,
                    format!("unknown op {other:?}"),
                )),
            }
        }
    };
}

ops! {
    hello {
        Hello(Hello) = "hello" -> HelloReply;
    }
    edge {
    ServerStats(ServerStats) = "server_stats" -> ServerStatsReply;
    ClusterStatus(ClusterStatus) = "cluster_status" -> ClusterStatusReply;
    ClusterAdd(ClusterAdd) = "cluster_add" -> ClusterStatusReply;
    ClusterRemove(ClusterRemove) = "cluster_remove" -> ClusterStatusReply;
    }
    engine {
    QueueCreate(QueueCreate) = "queue_create" -> QueueReply;
    QueueList(QueueList) = "queue_list" -> QueueListReply;
    QueueDescribe(QueueDescribe) = "queue_describe" -> QueueReply;
    QueueUpdate(QueueUpdate) = "queue_update" -> QueueReply;
    QueuePause(QueuePause) = "queue_pause" -> QueueReply;
    QueueResume(QueueResume) = "queue_resume" -> QueueReply;
    QueuePurge(QueuePurge) = "queue_purge" -> CountReply;
    QueueDelete(QueueDelete) = "queue_delete" -> CountReply;
    Enqueue(Enqueue) = "enqueue" -> EnqueueReply;
    Claim(Claim) = "claim" -> ClaimReply, waits if Claim::waits;
    Ack(Ack) = "ack" -> SettleReply;
    Nack(Nack) = "nack" -> SettleReply;
    Renew(Renew) = "renew" -> RenewReply;
    Release(Release) = "release" -> SettleReply;
    Throttled(Throttled) = "throttled" -> SettleReply;
    DeadLetter(DeadLetter) = "dead_letter" -> SettleReply;
    Suspend(Suspend) = "suspend" -> SuspendReply;
    Resume(Resume) = "resume" -> ResumeReply;
    Spawn(Spawn) = "spawn" -> SpawnReply;
    Emit(Emit) = "emit" -> EmitReply;
    Follow(Follow) = "follow" -> FollowReply, waits if Follow::waits;

    TaskGet(TaskGet) = "task_get" -> TaskReply;
    TaskList(TaskList) = "task_list" -> TaskListReply;
    TaskFind(Box<TaskFind>) = "task_find" -> TaskFindReply;
    Wait(Wait) = "wait" -> WaitReply, waits if Wait::waits;
    Cancel(Cancel) = "cancel" -> CancelReply;
    TaskUpdate(TaskUpdate) = "task_update" -> TaskUpdateReply;
    Redrive(Redrive) = "redrive" -> CountReply;
    Discard(Discard) = "discard" -> CountReply;
    SessionOpen(SessionOpen) = "session_open" -> SessionOpenReply;
    SessionUpdate(SessionUpdate) = "session_update" -> MemberReply;
    Subscribe(Subscribe) = "subscribe" -> Empty;
    Unsubscribe(Unsubscribe) = "unsubscribe" -> Empty;
    MemberList(MemberList) = "member_list" -> MemberListReply;
    MemberDescribe(MemberDescribe) = "member_describe" -> MemberDescribeReply;
    MemberDrain(MemberDrain) = "member_drain" -> MemberReply;
    MemberUndrain(MemberUndrain) = "member_undrain" -> MemberReply;
    MemberRelease(MemberRelease) = "member_release" -> Empty;
    LeaseRevoke(LeaseRevoke) = "lease_revoke" -> SettleReply;
    AdminSnapshot(AdminSnapshot) = "admin_snapshot" -> SnapshotReply;
    Watch(Watch) = "watch" -> WatchReply;
    Unwatch(Unwatch) = "unwatch" -> Empty;
    LimitSet(LimitSet) = "limit_set" -> LimitReply;
    LimitGet(LimitGet) = "limit_get" -> LimitReply;
    LimitList(LimitList) = "limit_list" -> LimitListReply;
    LimitDelete(LimitDelete) = "limit_delete" -> CountReply;
    ScheduleSet(Box<ScheduleSet>) = "schedule_set" -> ScheduleReply;
    ScheduleGet(ScheduleGet) = "schedule_get" -> ScheduleReply;
    ScheduleList(ScheduleList) = "schedule_list" -> ScheduleListReply;
    SchedulePause(SchedulePause) = "schedule_pause" -> ScheduleReply;
    ScheduleResume(ScheduleResume) = "schedule_resume" -> ScheduleReply;
    ScheduleDelete(ScheduleDelete) = "schedule_delete" -> Empty;
    ScheduleRun(ScheduleRun) = "schedule_run" -> ScheduleRunReply;
    }
}

fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, ErrorBody> {
    serde_json::from_slice(body)
        .map_err(|e| ErrorBody::new(ErrorCode::BadRequest, format!("invalid request: {e}")))
}

#[derive(Deserialize)]
struct Envelope<'a> {
    id: Option<u64>,
    #[serde(borrow)]
    op: Option<std::borrow::Cow<'a, str>>,
}

/// A request frame that could not be decoded, with its id when the id itself was readable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError {
    /// The request's id, if it could be read.
    pub id: Option<u64>,
    /// What is wrong.
    pub error: ErrorBody,
}

/// Decodes one request frame body into its id and typed request.
pub fn decode_request(body: &[u8]) -> Result<(u64, Request), DecodeError> {
    if let Err(e) = std::str::from_utf8(body) {
        return Err(DecodeError {
            id: None,
            error: ErrorBody::new(ErrorCode::BadRequest, format!("frame is not UTF-8: {e}")),
        });
    }
    let depth = crate::frame::json_depth(body);
    if depth > crate::limits::MAX_JSON_DEPTH {
        // The refusal names the request when its id is readable, so that the client
        // waiting for that request hears of it.
        let id = leading_id_and_op(body).map(|(id, _)| id).or_else(|| {
            serde_json::from_slice::<Envelope<'_>>(body)
                .ok()
                .and_then(|e| e.id)
        });
        return Err(DecodeError {
            id,
            error: ErrorBody::new(
                ErrorCode::BadRequest,
                format!(
                    "JSON nested {depth} deep exceeds the limit of {}",
                    crate::limits::MAX_JSON_DEPTH
                ),
            ),
        });
    }
    if let Some((id, op)) = leading_id_and_op(body)
        && let Ok(req) = decode_body(op, body)
    {
        return Ok((id, req));
    }
    let envelope: Envelope<'_> = serde_json::from_slice(body).map_err(|e| DecodeError {
        id: None,
        error: ErrorBody::new(
            ErrorCode::BadRequest,
            format!("frame is not a JSON object with a numeric id and a string op: {e}"),
        ),
    })?;
    let fail = |error| DecodeError {
        id: envelope.id,
        error,
    };
    let id = envelope.id.ok_or_else(|| {
        fail(ErrorBody::new(
            ErrorCode::BadRequest,
            "request has no numeric \"id\"",
        ))
    })?;
    let op = envelope.op.as_deref().ok_or_else(|| {
        fail(ErrorBody::new(
            ErrorCode::BadRequest,
            "request has no \"op\"",
        ))
    })?;
    decode_body(op, body).map(|req| (id, req)).map_err(fail)
}

/// The id and op of a frame that begins `{"id":N,"op":"NAME"` (whitespace allowed between
/// the tokens), as the SDKs write every request: read without parsing the frame twice.
///
/// `None` sends the frame the general way, which reads `id` and `op` wherever they are.
/// That is also the way for a frame whose rest holds `"id"`, `"op"` or a `\u` escape
/// anywhere (a second top-level `id` or `op`, which the general way refuses, could hide
/// there), and for any frame the typed parse then refuses, so every error reads exactly
/// as the general way words it.
fn leading_id_and_op(body: &[u8]) -> Option<(u64, &str)> {
    fn token<'a>(rest: &'a [u8], expected: &[u8]) -> Option<&'a [u8]> {
        rest.trim_ascii_start().strip_prefix(expected)
    }
    let rest = token(body, b"{")?;
    let rest = token(rest, b"\"id\"")?;
    let rest = token(rest, b":")?.trim_ascii_start();
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    // JSON allows no leading zero; the general way refuses one.
    if digits == 0 || (digits > 1 && rest[0] == b'0') {
        return None;
    }
    let id = std::str::from_utf8(&rest[..digits]).ok()?.parse().ok()?;
    let rest = token(&rest[digits..], b",")?;
    let rest = token(rest, b"\"op\"")?;
    let rest = token(rest, b":")?;
    let rest = token(rest, b"\"")?;
    let end = memchr::memchr2(b'"', b'\\', rest)?;
    if rest[end] != b'"' {
        return None;
    }
    let op = std::str::from_utf8(&rest[..end]).ok()?;
    let after = &rest[end + 1..];
    if HIDDEN.iter().any(|finder| finder.find(after).is_some()) {
        return None;
    }
    Some((id, op))
}

/// What may not follow a request's leading id and op for [`leading_id_and_op`] to read
/// them: a second `"id"` or `"op"` key, or a `\u` escape (which could spell one). Built
/// once: a finder made per request showed in clients' profiles.
static HIDDEN: std::sync::LazyLock<[memchr::memmem::Finder<'static>; 3]> =
    std::sync::LazyLock::new(|| {
        [
            memchr::memmem::Finder::new(b"\"id\""),
            memchr::memmem::Finder::new(b"\"op\""),
            memchr::memmem::Finder::new(b"\\u"),
        ]
    });

/// A request as a client writes it: its id and op next to the request's own fields.
#[derive(Serialize)]
pub struct RequestFrame<'a, T: Op> {
    /// The request id, echoed in the reply.
    pub id: u64,
    /// The op name.
    pub op: &'static str,
    /// The request's fields.
    #[serde(flatten)]
    pub body: &'a T,
}

impl<'a, T: Op> RequestFrame<'a, T> {
    /// Wraps a request for the wire.
    pub fn new(id: u64, body: &'a T) -> Self {
        RequestFrame {
            id,
            op: T::NAME,
            body,
        }
    }
}

/// A successful reply as the daemon writes it.
#[derive(Serialize)]
pub struct OkFrame<'a, T: Serialize> {
    /// The request id.
    pub id: u64,
    /// Always true.
    pub ok: bool,
    /// The reply's fields.
    #[serde(flatten)]
    pub body: &'a T,
}

/// A failed reply as the daemon writes it. `id` is null when the request's id was unreadable.
#[derive(Serialize)]
pub struct ErrFrame<'a> {
    /// The request id.
    pub id: Option<u64>,
    /// Always false.
    pub ok: bool,
    /// What went wrong.
    pub error: &'a ErrorBody,
}

/// The envelope of any frame the daemon sends, as a client first reads it.
#[derive(Debug, Deserialize)]
pub struct ServerEnvelope {
    /// The kind of a push; absent on replies.
    pub push: Option<String>,
    /// The id of the request a reply answers; absent on pushes.
    pub id: Option<u64>,
    /// Whether the request succeeded.
    pub ok: Option<bool>,
    /// The error of a failed reply.
    pub error: Option<ErrorBody>,
}

impl std::fmt::Debug for RequestFrame<'_, Enqueue> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "enqueue #{} ({} tasks)", self.id, self.body.tasks.len())
    }
}

/// Raw JSON from a string the caller knows to be JSON (e.g. `"null"`).
pub fn raw(json: &str) -> Result<RawJson, serde_json::Error> {
    serde_json::value::RawValue::from_string(json.to_owned())
}

#[cfg(test)]
mod tests;
