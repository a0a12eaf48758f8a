//! The data clients see: queue options and counts, task states, tasks and deliveries.
//!
//! Times are milliseconds since the Unix epoch (`*_ms` fields holding instants) and
//! durations are milliseconds (`*_ms` fields holding spans). Payloads, results and
//! progress are raw JSON, passed through untouched.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::RawJson;

/// The state of a task. See PROTOCOL.md §4.12 for the transitions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskState {
    /// Waiting for its `not_before` time or its retry backoff.
    Scheduled,
    /// Waiting to be handed out.
    Ready,
    /// Held by a member under a lease.
    Leased,
    /// Acknowledged by its holder.
    Done,
    /// Out of attempts or dead-lettered; waits for redrive or discard.
    Dead,
    /// Cancelled before it finished.
    Cancelled,
    /// Put aside by its holder until a resume (a person, an event) or its timeout: it
    /// holds no lease, spends no attempt, and keeps its place in its key's line.
    Suspended,
}

impl TaskState {
    /// Every state, in the order they are shown.
    pub const ALL: [TaskState; 7] = [
        TaskState::Scheduled,
        TaskState::Ready,
        TaskState::Leased,
        TaskState::Suspended,
        TaskState::Done,
        TaskState::Dead,
        TaskState::Cancelled,
    ];

    /// The snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Scheduled => "scheduled",
            TaskState::Ready => "ready",
            TaskState::Leased => "leased",
            TaskState::Done => "done",
            TaskState::Dead => "dead",
            TaskState::Cancelled => "cancelled",
            TaskState::Suspended => "suspended",
        }
    }

    /// Parses a snake_case name.
    pub fn parse(s: &str) -> Option<TaskState> {
        TaskState::ALL.into_iter().find(|st| st.as_str() == s)
    }

    /// Whether the task has reached an end (done, dead or cancelled).
    pub fn is_finished(self) -> bool {
        matches!(
            self,
            TaskState::Done | TaskState::Dead | TaskState::Cancelled
        )
    }
}

impl std::fmt::Display for TaskState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Exponential retry backoff: `base * factor^(failures-1)`, capped, with ± jitter.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Backoff {
    /// Delay after the first failure.
    pub base_ms: u64,
    /// Growth per further failure (at least 1.0).
    pub factor: f64,
    /// Longest delay.
    pub cap_ms: u64,
    /// Random spread as a fraction of the delay (0.0 to 1.0): 0.2 means ±20 %.
    pub jitter: f64,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            base_ms: 1000,
            factor: 2.0,
            cap_ms: 300_000,
            jitter: 0.2,
        }
    }
}

/// A queue's options.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueueOptions {
    /// Lease granted by a claim that does not ask for its own.
    pub lease_ms: u64,
    /// Failures after which a task goes to dead; 0 means unlimited.
    pub max_attempts: u32,
    /// Delay of a nack that names none.
    pub retry_backoff: Backoff,
    /// Most tasks of one key leased at once.
    pub key_concurrency: u32,
    /// How long done and cancelled tasks are kept.
    pub retention_ms: u64,
    /// Longest a single delivery may be renewed for, from its grant; none if absent.
    pub max_runtime_ms: Option<u64>,
    /// A paused queue accepts enqueues but hands nothing out.
    pub paused: bool,
    /// Fair dispatch between groups: among ready tasks of equal priority, the groups
    /// with ready tasks take turns in proportion to their weights, instead of plain
    /// enqueue order.
    #[serde(default)]
    pub fair: bool,
    /// Groups' weights for fair dispatch, at most [`crate::limits::MAX_GROUP_WEIGHTS`],
    /// each 2 to [`crate::limits::MAX_GROUP_WEIGHT`]; a group not named weighs 1.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub group_weights: BTreeMap<String, u32>,
}

impl Default for QueueOptions {
    fn default() -> Self {
        QueueOptions {
            lease_ms: 30_000,
            max_attempts: 5,
            retry_backoff: Backoff::default(),
            key_concurrency: 1,
            retention_ms: 24 * 3600 * 1000,
            max_runtime_ms: None,
            paused: false,
            fair: false,
            group_weights: BTreeMap::new(),
        }
    }
}

/// A partial set of queue options, for create and update: absent fields keep their value.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueuePatch {
    /// See [`QueueOptions::lease_ms`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_ms: Option<u64>,
    /// See [`QueueOptions::max_attempts`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    /// See [`QueueOptions::retry_backoff`].
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::nulls::refused"
    )]
    pub retry_backoff: Option<Backoff>,
    /// See [`QueueOptions::key_concurrency`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_concurrency: Option<u32>,
    /// See [`QueueOptions::retention_ms`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention_ms: Option<u64>,
    /// See [`QueueOptions::max_runtime_ms`]; 0 removes the bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_runtime_ms: Option<u64>,
    /// See [`QueueOptions::paused`].
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::nulls::refused"
    )]
    pub paused: Option<bool>,
    /// See [`QueueOptions::fair`].
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::nulls::refused"
    )]
    pub fair: Option<bool>,
    /// Weights to set, merged into [`QueueOptions::group_weights`]; a weight of 1 (the
    /// default) takes a group's entry out.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::nulls::refused"
    )]
    pub group_weights: Option<BTreeMap<String, u32>>,
}

/// Number of tasks of a queue in each state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateCounts {
    /// Tasks in `scheduled`.
    pub scheduled: u64,
    /// Tasks in `ready`.
    pub ready: u64,
    /// Tasks in `leased`.
    pub leased: u64,
    /// Tasks in `done`.
    pub done: u64,
    /// Tasks in `dead`.
    pub dead: u64,
    /// Tasks in `cancelled`.
    pub cancelled: u64,
    /// Tasks in `suspended` (absent from daemons that predate it).
    #[serde(default)]
    pub suspended: u64,
}

impl StateCounts {
    /// The count of one state.
    pub fn get(&self, state: TaskState) -> u64 {
        match state {
            TaskState::Scheduled => self.scheduled,
            TaskState::Ready => self.ready,
            TaskState::Leased => self.leased,
            TaskState::Done => self.done,
            TaskState::Dead => self.dead,
            TaskState::Cancelled => self.cancelled,
            TaskState::Suspended => self.suspended,
        }
    }

    /// The count of one state, for updating.
    pub fn get_mut(&mut self, state: TaskState) -> &mut u64 {
        match state {
            TaskState::Scheduled => &mut self.scheduled,
            TaskState::Ready => &mut self.ready,
            TaskState::Leased => &mut self.leased,
            TaskState::Done => &mut self.done,
            TaskState::Dead => &mut self.dead,
            TaskState::Cancelled => &mut self.cancelled,
            TaskState::Suspended => &mut self.suspended,
        }
    }
}

/// Counts of what happened on a queue since the daemon started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueTotals {
    /// Tasks enqueued (not counting duplicates).
    pub enqueued: u64,
    /// Tasks acked.
    pub acked: u64,
    /// Nacks.
    pub nacked: u64,
    /// Leases that lapsed.
    pub lapsed: u64,
}

/// A queue as `queue_list` and `queue_describe` show it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueueInfo {
    /// The queue's name.
    pub name: String,
    /// Its options.
    pub options: QueueOptions,
    /// Tasks per state, flattened under each state's name.
    #[serde(flatten)]
    pub counts: StateCounts,
    /// Ready tasks held back by their key: an earlier task of the same key is leased or
    /// waiting for its retry (at most `key_concurrency` of a key go at once, in order).
    pub held_back: u64,
    /// Ready tasks that require labels no connected member carries: nobody can take them.
    pub unclaimable: u64,
    /// Ready tasks waiting for room in a limit they draw on (counted apart from
    /// `held_back` and `unclaimable`).
    #[serde(default)]
    pub waiting_on_limits: u64,
    /// The label sets those unclaimable tasks require: at most
    /// [`crate::limits::MAX_LISTED_LABEL_SETS`], those holding the most tasks, sorted.
    pub unclaimable_requires: Vec<Vec<String>>,
    /// How many label sets unclaimable tasks require in all.
    #[serde(default)]
    pub unclaimable_sets: u64,
    /// Who can take its tasks now: members with a connected session subscribed to it
    /// (not draining), and claims parked on it. Ready tasks and none: nobody takes them.
    #[serde(default)]
    pub consumers: u64,
    /// What happened on the queue since the daemon started.
    pub totals: QueueTotals,
    /// When the oldest ready task (by id) was enqueued, if any task is ready.
    pub oldest_ready_ms: Option<u64>,
    /// When the queue was created.
    pub created_ms: u64,
}

/// One task of an enqueue request.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewTask {
    /// Any JSON value, up to [`crate::limits::MAX_PAYLOAD_BYTES`].
    pub payload: RawJson,
    /// 0..=9, higher first; 0 if absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u8>,
    /// Tasks sharing a key are handed out in order, at most `key_concurrency` at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Labels a member must carry to be handed this task.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requires: Vec<String>,
    /// Not handed out before this many milliseconds from now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
    /// Not handed out before this instant; the later of this and `delay_ms` wins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_before_ms: Option<u64>,
    /// A repeated enqueue with the same key returns the first task instead of a new one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// The limits it draws on, at most [`crate::limits::MAX_TASK_LIMITS`], each named
    /// once: it is leased only while every one has room for it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub limits: Vec<LimitUse>,
    /// Its group (a tenant, a customer) for fair dispatch in a queue that has it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// The W3C trace context of the span that enqueued it (`00-TRACE-SPAN-FLAGS`), handed
    /// to every holder: see [`crate::names::check_trace`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// The W3C `tracestate` that goes with `traceparent`, at most
    /// [`crate::limits::MAX_TRACESTATE_BYTES`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracestate: Option<String>,
}

/// A limit a task draws on: which, for which key, and how many of its tokens a lease
/// takes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitUse {
    /// The limit's name.
    pub limit: String,
    /// The key whose bucket and concurrency count it draws on, for a per-key limit;
    /// tasks without one share the limit's keyless bucket. Ignored by a limit that is
    /// not per key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Tokens its lease takes, 1 to [`crate::limits::MAX_LIMIT_COST`]; 1 if absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<u64>,
}

/// A limit's bucket: the limit, and the key (`""` for a limit that is not per key, or
/// a task that names no key).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitKey {
    /// The limit's name.
    pub limit: String,
    /// The key.
    pub key: String,
}

/// A rate: `count` tokens every `per_ms` milliseconds, added a little at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rate {
    /// Tokens per period, 1 to [`crate::limits::MAX_LIMIT_TOKENS`].
    pub count: u64,
    /// The period in milliseconds, 1 to [`crate::limits::MAX_RATE_PERIOD`].
    pub per_ms: u64,
}

/// A limit's settings: a token bucket (`rate`, `burst`), a cap on leases held at once
/// (`concurrency`), or both.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitSpec {
    /// Tokens added to the bucket over time; absent: no rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<Rate>,
    /// Most tokens the bucket holds, 1 to [`crate::limits::MAX_LIMIT_TOKENS`]; the
    /// rate's count if absent (one period's worth). Only with a rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u64>,
    /// Most leases held at once, 1 to [`crate::limits::MAX_LIMIT_CONCURRENCY`];
    /// absent: no cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u32>,
    /// Every key gets its own bucket and concurrency count with these settings.
    #[serde(default)]
    pub per_key: bool,
}

/// What a schedule does with the fires it missed by more than
/// [`crate::limits::SCHEDULE_GRACE`] (the daemon was down, or the schedule could not
/// fire): fires late by less fire whatever the policy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CatchUp {
    /// Missed fires enqueue nothing; the schedule goes on with its next fire.
    #[default]
    Skip,
    /// The latest missed fire enqueues one task, standing for every missed one.
    Once,
}

impl CatchUp {
    /// Its name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            CatchUp::Skip => "skip",
            CatchUp::Once => "once",
        }
    }
}

/// A schedule as `schedule_get` and `schedule_list` show it: its settings, when it
/// fires next and what its fires did.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ScheduleInfo {
    /// The schedule's name.
    pub name: String,
    /// Its cron pattern, as given.
    pub cron: String,
    /// The time zone its pattern is read in (an IANA name; `UTC` if none was given).
    pub tz: String,
    /// The queue its tasks go to.
    pub queue: String,
    /// The task each fire enqueues (its idempotency key is set by each fire).
    pub task: NewTask,
    /// What it does with missed fires.
    pub catch_up: CatchUp,
    /// True while paused: it does not fire.
    pub paused: bool,
    /// When it fires next (wall ms); null while paused.
    pub next_fire_ms: Option<u64>,
    /// The time of its last fire that enqueued a task (the time the pattern named, not
    /// when it ran), if any.
    pub last_fire_ms: Option<u64>,
    /// The task its last fire or run enqueued, if any.
    pub last_task: Option<String>,
    /// Fires that enqueued a task (or found it enqueued already).
    pub fires: u64,
    /// Tasks `schedule_run` enqueued.
    pub runs: u64,
    /// Fires missed by more than the grace and skipped (a catch-up counts at most
    /// [`crate::limits::MAX_COUNTED_MISSES`]).
    pub missed: u64,
    /// Fires whose task could not be enqueued (the queue gone, a quota, the disk
    /// alarm): each is recorded and passed, not retried.
    pub failures: u64,
    /// Why the last failed fire failed (`code: message`), if one did.
    pub last_error: Option<String>,
    /// When it was created.
    pub created_ms: u64,
    /// When its settings last changed (set, pause, resume).
    pub updated_ms: u64,
}

/// A limit as `limit_get` and `limit_list` show it: its settings and its state now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitInfo {
    /// The limit's name.
    pub name: String,
    /// Its settings, the burst filled in.
    #[serde(flatten)]
    pub spec: LimitSpec,
    /// Leases held that draw on it (on all its keys).
    pub held: u64,
    /// Ready tasks waiting for its room (on all its keys).
    pub waiting: u64,
    /// Leases granted that drew on it since the daemon started.
    pub granted: u64,
    /// Throttles its holders reported since the daemon started.
    pub throttled: u64,
    /// Its keys with a bucket in use (below full, holding leases or with tasks
    /// waiting): 1 for the keyless bucket of a limit that is not per key while in use.
    pub keys_in_use: u64,
    /// The keys in use, the busiest first (most leases held, then most waiting), at
    /// most [`crate::limits::MAX_LISTED_LIMIT_KEYS`]; a limit that is not per key lists
    /// its one bucket under the key `""`.
    pub keys: Vec<LimitKeyInfo>,
    /// When it was created.
    pub created_ms: u64,
    /// When its settings last changed.
    pub updated_ms: u64,
}

/// One key of a limit in use.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitKeyInfo {
    /// The key (`""` for the keyless bucket).
    pub key: String,
    /// Whole tokens in its bucket now; absent for a limit without a rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    /// Leases held on it.
    pub held: u64,
    /// Ready tasks waiting for its room.
    pub waiting: u64,
    /// When its bucket is next full (wall clock), if it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub full_ms: Option<u64>,
    /// Until when it hands nothing out (wall clock), while a holder's throttle lasts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub throttled_until_ms: Option<u64>,
}

impl NewTask {
    /// A task with this payload and no options.
    pub fn new(payload: RawJson) -> NewTask {
        NewTask {
            payload,
            priority: None,
            key: None,
            requires: Vec::new(),
            delay_ms: None,
            not_before_ms: None,
            idempotency_key: None,
            limits: Vec::new(),
            group: None,
            traceparent: None,
            tracestate: None,
        }
    }
}

/// The outcome of one enqueued task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnqueuedTask {
    /// The task's id (the existing task's, for a duplicate).
    pub id: String,
    /// True if the idempotency key named an existing task and nothing was created.
    pub duplicate: bool,
    /// The task's state now.
    pub state: TaskState,
}

/// A task handed to a member under a lease.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Delivery {
    /// The task's id.
    pub id: String,
    /// The lease epoch; settle calls must name it.
    pub epoch: u64,
    /// The task's queue.
    pub queue: String,
    /// The task's payload.
    pub payload: RawJson,
    /// The delivery number, 1 on the first.
    pub attempt: u64,
    /// Failures so far (nacks and lapses since the last redrive).
    pub failures: u64,
    /// The task's priority.
    pub priority: u8,
    /// The task's key, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// When the lease lapses unless renewed.
    pub lease_expires_ms: u64,
    /// The lease's length from the moment the daemon granted it.
    pub lease_ms: u64,
    /// The last progress checkpoint stored by a holder, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<RawJson>,
    /// True if this is a re-delivery of a task the member held before it restarted.
    pub reclaimed: bool,
    /// How the task's last suspension ended, if it was suspended and resumed (or timed
    /// out into ready): the resume's data, or its timeout. Boxed: most tasks never were.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed: Option<Box<Resumed>>,
    /// The task that spawned this one, if it is a child.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// The number the task's next output chunk gets: the `at` of this holder's first
    /// `emit` (0, absent, when the task has no output yet).
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub output: u64,
    /// The trace context this holder's work belongs to: the producer's, or, when the
    /// daemon exports spans, this lease's span in the same trace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// The `tracestate` that goes with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracestate: Option<String>,
}

fn is_zero_u64(n: &u64) -> bool {
    *n == 0
}

/// One chunk of a task's output, as a holder emits it: exactly one of `text` and
/// `json`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Chunk {
    /// Text (up to [`crate::limits::MAX_CHUNK_BYTES`] bytes of UTF-8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// A JSON value (up to [`crate::limits::MAX_CHUNK_BYTES`] bytes), not `null`: on
    /// the wire `"json": null` reads as no JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json: Option<RawJson>,
}

impl Chunk {
    /// A text chunk.
    pub fn text(text: impl Into<String>) -> Chunk {
        Chunk {
            text: Some(text.into()),
            json: None,
        }
    }

    /// A JSON chunk.
    pub fn json(json: RawJson) -> Chunk {
        Chunk {
            text: None,
            json: Some(json),
        }
    }

    /// The bytes it carries (its text's, or its JSON's), as
    /// [`crate::limits::MAX_CHUNK_BYTES`] counts them.
    pub fn bytes(&self) -> usize {
        self.text.as_ref().map_or(0, String::len) + self.json.as_ref().map_or(0, |j| j.get().len())
    }

    /// The bytes it takes in an emit as stored, as [`crate::limits::MAX_EMIT_BYTES`],
    /// the task's output limit and its rate count them: its JSON and a comma. An emit
    /// of chunks takes [`crate::limits::OUTPUT_PAGE_HEADER_BYTES`] and 1 more.
    pub fn stored_bytes(&self) -> usize {
        serde_json::to_vec(self).map_or(0, |v| v.len()) + 1
    }
}

/// One chunk of a task's output as a follower sees it: its number and when it was
/// stored, then exactly one of `text` and `json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OutputChunk {
    /// Its number: 0 for the task's first chunk, one more for each chunk after it.
    pub n: u64,
    /// When the daemon stored it (wall ms).
    pub at_ms: u64,
    /// Its text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Its JSON value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json: Option<RawJson>,
}

/// What a task's output holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputSummary {
    /// The number of the oldest chunk kept; chunks before it were dropped to keep the
    /// task's output within [`crate::limits::MAX_OUTPUT_BYTES`].
    pub first: u64,
    /// The number the next chunk gets (chunks emitted so far).
    pub next: u64,
    /// Bytes of the chunks kept.
    pub bytes: u64,
}

/// What a suspension's timeout does when no resume came first.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnTimeout {
    /// The task is ready again and its next holder sees `resumed.timed_out`.
    Resume,
    /// The task is dead (`dead_reason` `suspend_timed_out`), for a redrive or discard.
    #[default]
    Fail,
    /// The task is cancelled.
    Cancel,
}

impl OnTimeout {
    /// The snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            OnTimeout::Resume => "resume",
            OnTimeout::Fail => "fail",
            OnTimeout::Cancel => "cancel",
        }
    }

    /// Parses a snake_case name.
    pub fn parse(s: &str) -> Option<OnTimeout> {
        [OnTimeout::Resume, OnTimeout::Fail, OnTimeout::Cancel]
            .into_iter()
            .find(|o| o.as_str() == s)
    }
}

/// A suspended task's suspension, as people see it (never its resume token).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SuspensionInfo {
    /// What the task waits for, in its holder's words.
    pub reason: String,
    /// The member that suspended it ("" for an anonymous claim).
    pub member: String,
    /// The epoch of the lease it was suspended under: its resume token names it.
    pub epoch: u64,
    /// When it was suspended.
    pub since_ms: u64,
    /// When its timeout acts.
    pub timeout_at_ms: u64,
    /// What its timeout does.
    pub on_timeout: OnTimeout,
    /// True when it waits for its children (a `spawn` with `wait`): it is ready again
    /// once every one has finished.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub children: bool,
}

/// How a task's last suspension ended, shown to its next holder.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Resumed {
    /// The data the resume carried, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<RawJson>,
    /// Who resumed it: the token's name (with tokens configured), else "".
    pub by: String,
    /// When it was resumed or timed out.
    pub at_ms: u64,
    /// True when the suspension's timeout resumed it (no one did).
    pub timed_out: bool,
    /// For a task that waited for its children: each one as it ended (or stood, when a
    /// resume or the timeout came first), in the order they were spawned.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub children: Vec<ChildOutcome>,
}

impl Delivery {
    /// The bytes a reply carrying it counts against
    /// [`crate::limits::MAX_CLAIM_REPLY_BYTES`]: its payload, its progress checkpoint
    /// and how its last suspension ended ([`Resumed::bytes`]).
    pub fn bytes(&self) -> usize {
        self.payload.get().len()
            + self.progress.as_ref().map_or(0, |p| p.get().len())
            + self.resumed.as_ref().map_or(0, |r| r.bytes())
    }
}

impl Resumed {
    /// The bytes it carries, as a delivery's size and the stored-bytes quota count
    /// them: its data, and for each child outcome its strings, its result and error,
    /// and [`crate::limits::CHILD_OUTCOME_OVERHEAD_BYTES`]. At most
    /// [`crate::limits::MAX_RESUMED_BYTES`].
    pub fn bytes(&self) -> usize {
        let data = self.data.as_ref().map_or(0, |d| d.get().len());
        let children: usize = self
            .children
            .iter()
            .map(|c| {
                c.id.len()
                    + c.child_key.len()
                    + c.queue.len()
                    + c.result.as_ref().map_or(0, |r| r.get().len())
                    + c.error.as_ref().map_or(0, String::len)
                    + crate::limits::CHILD_OUTCOME_OVERHEAD_BYTES
            })
            .sum();
        data + children
    }
}

/// A child task as its waiting parent's next holder sees it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChildOutcome {
    /// The child's id.
    pub id: String,
    /// Its key among its parent's children.
    pub child_key: String,
    /// Its queue.
    pub queue: String,
    /// Its state when its parent woke: done, dead or cancelled once all have finished.
    pub state: TaskState,
    /// Its result, when done and small enough to carry here
    /// ([`crate::limits::MAX_CHILD_OUTCOME_BYTES`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<RawJson>,
    /// Its last error, when it has one and it fits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// True when its result or error was left out to keep the parent small: fetch the
    /// child by its id.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub omitted: bool,
}

/// A child task as its parent's task view lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChildSummary {
    /// The child's id.
    pub id: String,
    /// Its key among its parent's children.
    pub child_key: String,
    /// Its queue.
    pub queue: String,
    /// Its state.
    pub state: TaskState,
    /// How many children it has itself.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub children: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// A descendant of a task in its family tree, as the watched task screen lists them:
/// depth first, each child after its parent, in the order spawned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeNode {
    /// Spawns below the task (1 for its children, 2 for theirs, …).
    pub depth: u8,
    /// The descendant.
    pub child: ChildSummary,
}

/// The lease of a leased task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseInfo {
    /// The member holding it ("" for an anonymous claim).
    pub member: String,
    /// The lease epoch.
    pub epoch: u64,
    /// When it lapses unless renewed.
    pub expires_ms: u64,
}

/// One event in a task's timeline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimelineEvent {
    /// When it happened.
    pub at_ms: u64,
    /// What happened: `enqueued`, `leased`, `reclaimed`, `redelivered`, `done` (acked),
    /// `nacked`, `lapsed`, `revoked`, `released`, `dead_lettered`, `redriven`,
    /// `cancel_requested`, `cancelled`.
    /// Renewals are not recorded.
    pub event: String,
    /// The member involved, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member: Option<String>,
    /// The lease epoch involved, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<u64>,
    /// The error given, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A whole task, as `task_get` and `wait` return it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TaskInfo {
    /// The task's id.
    pub id: String,
    /// Its queue.
    pub queue: String,
    /// Its state.
    pub state: TaskState,
    /// Its payload.
    pub payload: RawJson,
    /// Its priority.
    pub priority: u8,
    /// Its key, if any.
    pub key: Option<String>,
    /// Labels a holder must carry.
    pub requires: Vec<String>,
    /// The limits it draws on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub limits: Vec<LimitUse>,
    /// Its group, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// While ready and waiting for room in a limit: which limit and key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_on: Option<LimitKey>,
    /// When a scheduled task becomes ready.
    pub not_before_ms: Option<u64>,
    /// Its idempotency key, if any.
    pub idempotency_key: Option<String>,
    /// Leases granted so far.
    pub deliveries: u64,
    /// Failures since enqueue or the last redrive.
    pub failures: u64,
    /// The current lease, while leased.
    pub lease: Option<LeaseInfo>,
    /// A cancel was asked while it was leased.
    pub cancel_requested: bool,
    /// The last progress checkpoint.
    pub progress: Option<RawJson>,
    /// The result given with the ack.
    pub result: Option<RawJson>,
    /// The last error given with a nack or dead-letter, or the reason of a lapse.
    pub last_error: Option<String>,
    /// Why it is dead: `max_attempts`, `dead_lettered` or `suspend_timed_out`.
    pub dead_reason: Option<String>,
    /// While suspended: why, since when, and what its timeout does (boxed: most tasks
    /// are not suspended).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspension: Option<Box<SuspensionInfo>>,
    /// How its last suspension ended, until its next suspension.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed: Option<Box<Resumed>>,
    /// The task that spawned it, if it is a child.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// Its key among its parent's children, if it is a child.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub child_key: Option<String>,
    /// The children it spawned that are still stored, in the order they were spawned
    /// (at most [`crate::limits::MAX_CHILDREN`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub children: Vec<ChildSummary>,
    /// Its output, if it emitted any (`follow` reads it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<OutputSummary>,
    /// The trace context it was enqueued with, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// The `tracestate` that goes with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracestate: Option<String>,
    /// When it was enqueued.
    pub created_ms: u64,
    /// When it last changed state.
    pub updated_ms: u64,
    /// Its timeline, oldest first, at most [`crate::limits::MAX_HISTORY`] events.
    pub history: Vec<TimelineEvent>,
}

/// A task in a listing: everything but payload, result, progress and history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskSummary {
    /// The task's id.
    pub id: String,
    /// Its queue.
    pub queue: String,
    /// Its state.
    pub state: TaskState,
    /// Its priority.
    pub priority: u8,
    /// Its key, if any.
    pub key: Option<String>,
    /// Leases granted so far.
    pub deliveries: u64,
    /// Failures since enqueue or the last redrive.
    pub failures: u64,
    /// When a scheduled task becomes ready.
    pub not_before_ms: Option<u64>,
    /// The current lease, while leased.
    pub lease: Option<LeaseInfo>,
    /// The last error.
    pub last_error: Option<String>,
    /// Why it is dead.
    pub dead_reason: Option<String>,
    /// While suspended: why, since when, and what its timeout does (boxed: most tasks
    /// are not suspended).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspension: Option<Box<SuspensionInfo>>,
    /// When it was enqueued.
    pub created_ms: u64,
    /// When it last changed state.
    pub updated_ms: u64,
    /// The JSON text of its last progress checkpoint, cut to
    /// [`crate::limits::MAX_SUMMARY_PROGRESS_BYTES`] with `…` appended if longer (then
    /// it is no longer JSON); absent if it has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,
}

/// A member as `member_list` and `member_describe` show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberInfo {
    /// The member's stable name.
    pub name: String,
    /// Its labels, from its session.
    pub labels: Vec<String>,
    /// Most leases it takes at once by push, from its session.
    pub capacity: u32,
    /// Leases it holds now.
    pub leased: u64,
    /// Whether a session of this member is connected and heard from (`state` is
    /// `connected`).
    pub connected: bool,
    /// Connected, unreachable (its session is silent past its liveness timeout) or gone
    /// (no session).
    pub state: MemberState,
    /// Its session's liveness timeout; 0 if it has no session.
    pub liveness_ms: u64,
    /// Drained by an operator: it keeps what it holds and takes nothing new.
    pub draining: bool,
    /// Queues its session subscribed to.
    pub subscribed: Vec<String>,
    /// When the daemon last heard from its session (any packet, keep-alive PINGs
    /// included), if it ever had one.
    pub last_seen_ms: Option<u64>,
}

/// Whether the daemon hears from a member.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemberState {
    /// Its session is open and was heard from within its liveness timeout: it gets
    /// pushes and leases.
    Connected,
    /// Its session is open but silent past its liveness timeout (crashed, frozen or cut
    /// off): it gets nothing new; its leases run on to their deadlines.
    Unreachable,
    /// It has no session (its connection ended, or it only ever pulled): it gets no pushes.
    Gone,
}

impl MemberState {
    /// The state's wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            MemberState::Connected => "connected",
            MemberState::Unreachable => "unreachable",
            MemberState::Gone => "gone",
        }
    }
}

impl std::fmt::Display for MemberState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
