//! The records requests take and replies give, as JavaScript objects.
//!
//! Each is a `#[napi(object)]` struct (its TypeScript interface generated into
//! `binding.d.ts`, its fields camelCase there) whose Rust fields are named as the wire
//! names them (PROTOCOL.md §5), so serde reads a reply's JSON straight into it and
//! writes a request's fields from it: a field left out in JavaScript is left out on the
//! wire. JSON values (payloads, results, checkpoints) are plain JavaScript values; times
//! are milliseconds since the Unix epoch (`...Ms`), durations milliseconds; counts are
//! numbers (exact up to 2^53).

use napi_derive::napi;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Where the daemon is and how to trust it. Each option left out is taken from its
/// `MUSTER_*` variable, else from the context in use (`context`, `MUSTER_CONTEXT`, the
/// current one of `muster context use`), else the local daemon, exactly as the `muster`
/// CLI settles it. Trust is taken whole: giving any of `pin`, `ca`, `data` ignores the
/// context's.
#[napi(object)]
#[derive(Debug, Clone, Default)]
pub struct ConnectOptions {
    /// `HOST:PORT`, or a cluster's nodes `HOST:PORT,HOST:PORT,...` (at most 16): the
    /// client connects to the leader among them.
    pub addr: Option<String>,
    /// The daemon's data directory, to trust its certificate and read its admin token.
    pub data: Option<String>,
    /// A CA certificate (PEM) to trust.
    pub ca: Option<String>,
    /// The SHA-256 fingerprint of the daemon's certificate to trust.
    pub pin: Option<String>,
    /// The token to present.
    pub token: Option<String>,
    /// A file holding the token to present.
    pub token_file: Option<String>,
    /// The name to verify the daemon's certificate for (the address's host if left out).
    pub server_name: Option<String>,
    /// The named context of the contexts file to use.
    pub context: Option<String>,
}

/// A limit a task draws on, and how much of it.
#[napi(object)]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LimitUse {
    /// The limit's name.
    pub limit: String,
    /// The key it draws on, for a limit kept per key (a tenant, an API key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// How many tokens and slots it takes (1 if left out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<i64>,
}

/// How a task is enqueued, beside its queue and payload.
#[napi(object)]
#[derive(Debug, Clone, Default, Serialize)]
pub struct EnqueueOptions {
    /// 0 (lowest) to 9; the queue's default if left out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<u8>,
    /// A key (e.g. a repository) whose tasks run one at a time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Labels a holder must carry.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requires: Option<Vec<String>>,
    /// Ready only after this many milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<i64>,
    /// Ready only from this time (ms since the epoch).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_before_ms: Option<i64>,
    /// Enqueued once per key: a repeat answers the first task (`duplicate`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// The limits it draws on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limits: Option<Vec<LimitUse>>,
    /// Its group (a tenant) in a fair queue.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

/// One task of `enqueueMany`: its payload and options.
#[napi(object)]
#[derive(Debug, Clone, Serialize)]
pub struct NewTask {
    /// The payload, any JSON value.
    pub payload: Value,
    /// 0 (lowest) to 9; the queue's default if left out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<u8>,
    /// A key whose tasks run one at a time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Labels a holder must carry.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requires: Option<Vec<String>>,
    /// Ready only after this many milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<i64>,
    /// Ready only from this time (ms since the epoch).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_before_ms: Option<i64>,
    /// Enqueued once per key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// The limits it draws on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limits: Option<Vec<LimitUse>>,
    /// Its group in a fair queue.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

/// A task enqueued (or found enqueued before under its idempotency key).
#[napi(object)]
#[derive(Debug, Clone, Deserialize)]
pub struct EnqueuedTask {
    /// The task's id.
    pub id: String,
    /// True if the idempotency key named a task enqueued before: this is that task.
    pub duplicate: bool,
    /// Its state now.
    pub state: String,
}

/// A limit and key a task waits on.
#[napi(object)]
#[derive(Debug, Clone, Deserialize)]
pub struct LimitKey {
    /// The limit.
    pub limit: String,
    /// The key (empty for a limit not kept per key).
    pub key: String,
}

/// A task's current lease.
#[napi(object)]
#[derive(Debug, Clone, Deserialize)]
pub struct LeaseInfo {
    /// The member holding it.
    pub member: String,
    /// The lease epoch.
    pub epoch: i64,
    /// When it expires unless renewed.
    pub expires_ms: i64,
}

/// An event of a task's timeline.
#[napi(object)]
#[derive(Debug, Clone, Deserialize)]
pub struct TimelineEvent {
    /// When.
    pub at_ms: i64,
    /// What: `enqueued`, `leased`, `acked`, `nacked`, `lapsed`, ... (PROTOCOL.md §4.7).
    pub event: String,
    /// The member, for lease events.
    #[serde(default)]
    pub member: Option<String>,
    /// The lease epoch, for lease events.
    #[serde(default)]
    pub epoch: Option<i64>,
    /// The error or reason given.
    #[serde(default)]
    pub error: Option<String>,
}

/// Why and until when a task is suspended.
#[napi(object)]
#[derive(Debug, Clone, Deserialize)]
pub struct SuspensionInfo {
    /// What it waits for, shown to people.
    pub reason: String,
    /// The member that suspended it.
    pub member: String,
    /// The epoch of the lease it was suspended under.
    pub epoch: i64,
    /// Since when.
    pub since_ms: i64,
    /// When its timeout fires.
    pub timeout_at_ms: i64,
    /// What the timeout does: `resume`, `fail` or `cancel`.
    pub on_timeout: String,
    /// True while it waits for its children rather than for a person.
    #[serde(default)]
    pub children: bool,
}

/// How a child task ended, as its parent's next run sees it.
#[napi(object)]
#[derive(Debug, Clone, Deserialize)]
pub struct ChildOutcome {
    /// The child's id.
    pub id: String,
    /// Its key among its parent's children.
    pub child_key: String,
    /// Its queue.
    pub queue: String,
    /// Its state: `done`, `dead` or `cancelled` (or any, after a timeout or an early
    /// resume).
    pub state: String,
    /// Its result, when done (and not `omitted`).
    #[serde(default)]
    pub result: Option<Value>,
    /// Its last error, when it failed (and not `omitted`).
    #[serde(default)]
    pub error: Option<String>,
    /// True when the result or error was too large to carry: read the child by id.
    #[serde(default)]
    pub omitted: bool,
}

/// How a task's last suspension ended.
#[napi(object)]
#[derive(Debug, Clone, Deserialize)]
pub struct Resumed {
    /// The data the resumer gave.
    #[serde(default)]
    pub data: Option<Value>,
    /// Who resumed it (a principal, or `timeout`, or `children`).
    pub by: String,
    /// When.
    pub at_ms: i64,
    /// True if its timeout resumed it.
    #[serde(default)]
    pub timed_out: bool,
    /// Its children's outcomes, when it waited for them.
    #[serde(default)]
    pub children: Vec<ChildOutcome>,
}

/// A child of a task, as the task's record lists it.
#[napi(object)]
#[derive(Debug, Clone, Deserialize)]
pub struct ChildSummary {
    /// The child's id.
    pub id: String,
    /// Its key among its parent's children.
    pub child_key: String,
    /// Its queue.
    pub queue: String,
    /// Its state.
    pub state: String,
    /// How many children it has itself.
    #[serde(default)]
    pub children: u32,
}

/// What a task's output holds.
#[napi(object)]
#[derive(Debug, Clone, Deserialize)]
pub struct OutputSummary {
    /// The number of the first chunk still kept.
    pub first: i64,
    /// The number the next chunk will get.
    pub next: i64,
    /// The kept output's size as stored.
    pub bytes: i64,
}

/// Everything about a task.
#[napi(object)]
#[derive(Debug, Clone, Deserialize)]
pub struct TaskInfo {
    /// The task's id.
    pub id: String,
    /// Its queue.
    pub queue: String,
    /// Its state: `scheduled`, `ready`, `leased`, `suspended`, `done`, `dead` or
    /// `cancelled`.
    pub state: String,
    /// Its payload.
    pub payload: Value,
    /// Its priority.
    pub priority: u8,
    /// Its key, if any.
    #[serde(default)]
    pub key: Option<String>,
    /// Labels a holder must carry.
    #[serde(default)]
    pub requires: Vec<String>,
    /// The limits it draws on.
    #[serde(default)]
    pub limits: Vec<LimitUse>,
    /// Its group, if any.
    #[serde(default)]
    pub group: Option<String>,
    /// While ready and waiting for room in a limit: which limit and key.
    #[serde(default)]
    pub waiting_on: Option<LimitKey>,
    /// When a scheduled task becomes ready.
    #[serde(default)]
    pub not_before_ms: Option<i64>,
    /// Its idempotency key, if any.
    #[serde(default)]
    pub idempotency_key: Option<String>,
    /// Leases granted so far.
    pub deliveries: i64,
    /// Failures since enqueue or the last redrive.
    pub failures: i64,
    /// The current lease, while leased.
    #[serde(default)]
    pub lease: Option<LeaseInfo>,
    /// A cancel was asked while it was leased.
    #[serde(default)]
    pub cancel_requested: bool,
    /// The last progress checkpoint.
    #[serde(default)]
    pub progress: Option<Value>,
    /// The result given with the ack.
    #[serde(default)]
    pub result: Option<Value>,
    /// The last error given with a nack or dead-letter, or the reason of a lapse.
    #[serde(default)]
    pub last_error: Option<String>,
    /// Why it is dead: `max_attempts`, `dead_lettered` or `suspend_timed_out`.
    #[serde(default)]
    pub dead_reason: Option<String>,
    /// While suspended: why, since when, and what its timeout does.
    #[serde(default)]
    pub suspension: Option<SuspensionInfo>,
    /// How its last suspension ended, until its next suspension.
    #[serde(default)]
    pub resumed: Option<Resumed>,
    /// The task that spawned it, if it is a child.
    #[serde(default)]
    pub parent: Option<String>,
    /// Its key among its parent's children, if it is a child.
    #[serde(default)]
    pub child_key: Option<String>,
    /// The children it spawned that are still stored, in spawn order.
    #[serde(default)]
    pub children: Vec<ChildSummary>,
    /// Its output, if it emitted any.
    #[serde(default)]
    pub output: Option<OutputSummary>,
    /// When it was enqueued.
    pub created_ms: i64,
    /// When it last changed state.
    pub updated_ms: i64,
    /// Its timeline, oldest first.
    #[serde(default)]
    pub history: Vec<TimelineEvent>,
}

/// What `wait` found.
#[napi(object)]
#[derive(Debug, Clone, Deserialize)]
pub struct WaitReply {
    /// The tasks that have finished (done, dead or cancelled), whole.
    #[serde(default)]
    pub finished: Vec<TaskInfo>,
    /// Finished tasks left out to keep the reply within its frame: read them by id.
    #[serde(default)]
    pub omitted: Vec<String>,
    /// The tasks not finished when the wait ended.
    #[serde(default)]
    pub pending: Vec<String>,
    /// Tasks that do not exist (never did, or were removed).
    #[serde(default)]
    pub removed: Vec<String>,
}

/// What a suspend (or a spawn with `wait`) answered.
#[napi(object)]
#[derive(Debug, Clone, Deserialize)]
pub struct Suspended {
    /// `suspended`; `ready` when a spawn-and-wait found every child finished already;
    /// `cancelled` if a cancel had been asked.
    pub state: String,
    /// The token that resumes this suspension once (absent when cancelled).
    #[serde(default)]
    pub resume_token: Option<String>,
    /// When the timeout acts (absent when cancelled).
    #[serde(default)]
    pub timeout_at_ms: Option<i64>,
}

/// A child task to spawn: its key among its parent's children, its queue and the task.
#[napi(object)]
#[derive(Debug, Clone)]
pub struct NewChild {
    /// Its key among the parent's children: spawning a key spawned before answers that
    /// child (`duplicate`) instead of enqueueing another.
    pub child_key: String,
    /// Its queue (any existing queue).
    pub queue: String,
    /// Its payload.
    pub payload: Value,
    /// How it is enqueued (an idempotency key is refused: the child key is one).
    pub options: Option<EnqueueOptions>,
}

impl NewChild {
    /// The child as the wire writes it (`{child_key, queue, task}`).
    pub fn to_wire(&self) -> napi::Result<Value> {
        let mut task = match serde_json::to_value(self.options.clone().unwrap_or_default()) {
            Ok(Value::Object(map)) => map,
            Ok(_) | Err(_) => return Err(crate::errors::invalid("a child's options are not fields")),
        };
        task.insert("payload".into(), self.payload.clone());
        Ok(serde_json::json!({
            "child_key": self.child_key,
            "queue": self.queue,
            "task": task,
        }))
    }
}

/// A child spawned (or found spawned before under its key).
#[napi(object)]
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct SpawnedChild {
    /// Its key among its parent's children.
    pub child_key: String,
    /// Its id.
    pub id: String,
    /// True when the parent had spawned it before.
    pub duplicate: bool,
    /// Its state.
    pub state: String,
}

/// What a spawn answered.
#[napi(object)]
#[derive(Debug, Clone, Deserialize)]
pub struct Spawned {
    /// One per child asked for, in order.
    pub children: Vec<SpawnedChild>,
    /// The parent's state: `leased` without `wait`; with it `suspended`, or `ready` when
    /// every child had finished already, or `cancelled` if a cancel was asked.
    pub state: String,
    /// With `wait`, the token that resumes the parent early.
    #[serde(default)]
    pub resume_token: Option<String>,
    /// With `wait`, when its timeout acts.
    #[serde(default)]
    pub timeout_at_ms: Option<i64>,
}

/// A chunk of a task's output: text, or a JSON value (not `null`).
#[napi(object)]
#[derive(Debug, Clone, Serialize)]
pub struct Chunk {
    /// Text (at most 64 KiB of UTF-8).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// A JSON value (at most 64 KiB as JSON).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub json: Option<Value>,
}

/// A chunk of a task's output as a follower reads it.
#[napi(object)]
#[derive(Debug, Clone, Deserialize)]
pub struct OutputChunk {
    /// Its number: 0 for the task's first chunk, one more for each after it.
    pub n: i64,
    /// When the daemon stored it.
    pub at_ms: i64,
    /// Its text, for a text chunk.
    #[serde(default)]
    pub text: Option<String>,
    /// Its value, for a JSON chunk.
    #[serde(default)]
    pub json: Option<Value>,
}

/// One batch of a task's output.
#[napi(object)]
#[derive(Debug, Clone, Deserialize)]
pub struct FollowResult {
    /// Chunks from `from` on, in order with no gap.
    pub chunks: Vec<OutputChunk>,
    /// Chunks from `from` no longer kept (dropped to keep the task within its output
    /// limit): `chunks` start after them.
    #[serde(default)]
    pub dropped: i64,
    /// Where to follow from next: one past the last chunk sent.
    pub next: i64,
    /// The task's state when answered.
    pub state: String,
    /// The task is finished and every chunk it emitted was sent.
    pub end: bool,
}
