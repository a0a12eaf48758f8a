//! The records requests take and replies give, as JavaScript objects.
//!
//! Each is a `#[napi(object)]` struct (its TypeScript interface generated into
//! `binding.d.ts`, its fields camelCase there) whose Rust fields are named as the wire
//! names them (PROTOCOL.md §5), so serde reads a reply's JSON straight into it and
//! writes a request's fields from it: a field left out in JavaScript is left out on the
//! wire. JSON values (payloads, results, checkpoints) are plain JavaScript values; times
//! are milliseconds since the Unix epoch (`...Ms`), durations milliseconds; counts are
//! numbers (exact up to 2^53).
//!
//! A request's integers are `i64` whatever the wire's type: napi-rs reads a negative
//! number into a `u32` wrapped around (-1 becomes 4,294,967,295) and one past a `u8`'s
//! range as an error of no muster class, while an `i64` goes on the wire as it was
//! given and the request's decoding (`muster_sdk::Client::prepare_raw`) refuses it out
//! of the wire type's range (`InvalidInput`, nothing sent). Replies keep the wire's
//! `u8` and `u32`.

use std::collections::BTreeMap;

use napi_derive::napi;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The largest integer a JavaScript number holds exactly (2^53 - 1).
const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

/// `value` with every integer beyond JavaScript's exact range made a float, as
/// `JSON.parse` reads it: napi-rs would hand such an integer over as a `BigInt`, which
/// `JSON.stringify` then refuses.
pub fn as_js_numbers(value: &mut Value) {
    match value {
        Value::Number(n) => {
            let beyond = match (n.as_u64(), n.as_i64()) {
                (Some(u), _) => u > MAX_SAFE_INTEGER,
                (None, Some(i)) => i.unsigned_abs() > MAX_SAFE_INTEGER,
                (None, None) => false,
            };
            if beyond && let Some(f) = n.as_f64().and_then(serde_json::Number::from_f64) {
                *n = f;
            }
        }
        Value::Array(items) => items.iter_mut().for_each(as_js_numbers),
        Value::Object(map) => map.values_mut().for_each(as_js_numbers),
        Value::Null | Value::Bool(_) | Value::String(_) => {}
    }
}

/// A reply the Rust SDK read (a `muster_sdk` record), as its record here, its numbers
/// as JavaScript reads them ([`as_js_numbers`]).
pub fn record<T: Serialize, R: serde::de::DeserializeOwned>(reply: &T) -> napi::Result<R> {
    let mut value = serde_json::to_value(reply).map_err(crate::errors::invalid)?;
    as_js_numbers(&mut value);
    serde_json::from_value(value).map_err(crate::errors::invalid)
}

/// A reply's JSON text read into `R`, its numbers as JavaScript reads them
/// ([`as_js_numbers`]).
pub fn read_js<R: serde::de::DeserializeOwned>(text: &str) -> serde_json::Result<R> {
    let mut value: Value = serde_json::from_str(text)?;
    as_js_numbers(&mut value);
    serde_json::from_value(value)
}

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
    /// 0 (lowest) to 9, higher handed out first; 0 if left out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<i64>,
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
    /// 0 (lowest) to 9, higher handed out first; 0 if left out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<i64>,
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
            Ok(_) | Err(_) => {
                return Err(crate::errors::invalid("a child's options are not fields"));
            }
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

// ---- queues -------------------------------------------------------------------------

/// Exponential retry backoff (PROTOCOL.md §4.1): the delay after the n-th failure is
/// `min(baseMs * factor^(n-1), capMs)`, spread by ± `jitter` of itself. In a request all
/// four fields are given.
#[napi(object)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Backoff {
    /// The delay after the first failure (1,000 by default).
    pub base_ms: i64,
    /// The growth per further failure, at least 1.0 (2.0 by default).
    pub factor: f64,
    /// The longest delay, at most 365 days (300,000 by default).
    pub cap_ms: i64,
    /// The random spread as a fraction of the delay, 0.0 to 1.0 (0.2 by default: ±20 %).
    pub jitter: f64,
}

/// A queue's options, as replies show them (PROTOCOL.md §4.2).
#[napi(object)]
#[derive(Debug, Clone, Deserialize)]
pub struct QueueOptions {
    /// The lease a claim without its own gets, and a renewal's default (30,000 by default).
    pub lease_ms: i64,
    /// A task goes `dead` when its failures reach this; 0 means unlimited (5 by default).
    pub max_attempts: u32,
    /// The delay of a nack that names none.
    pub retry_backoff: Backoff,
    /// The most tasks of one key leased at once (1 by default).
    pub key_concurrency: u32,
    /// How long `done` and `cancelled` tasks are kept (a day by default).
    pub retention_ms: i64,
    /// If set, no delivery's lease runs past its grant time plus this, however often
    /// renewed.
    #[serde(default)]
    pub max_runtime_ms: Option<i64>,
    /// A paused queue accepts enqueues but hands nothing out.
    pub paused: bool,
    /// Fair dispatch between task groups (PROTOCOL.md §4.15) instead of enqueue order.
    #[serde(default)]
    pub fair: bool,
    /// Each named group's weight in fair dispatch; a group not named weighs 1.
    #[serde(default)]
    pub group_weights: BTreeMap<String, u32>,
}

/// Options to set on a queue (`queueCreate`, `queueUpdate`; PROTOCOL.md §4.3): each
/// left out keeps its value (its default at creation). The patch is checked whole and
/// applied all or nothing.
#[napi(object)]
#[derive(Debug, Clone, Default, Serialize)]
pub struct QueuePatch {
    /// The lease a claim without its own gets, 100 to 86,400,000.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_ms: Option<i64>,
    /// Failures after which a task goes `dead`; 0 means unlimited.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<i64>,
    /// The delay of a nack that names none (all four fields).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_backoff: Option<Backoff>,
    /// The most tasks of one key leased at once, 1 to 1,000.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_concurrency: Option<i64>,
    /// How long finished tasks are kept, 0 to 365 days.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retention_ms: Option<i64>,
    /// The longest a delivery's lease may run from its grant, 100 to 86,400,000; 0
    /// removes the bound.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_runtime_ms: Option<i64>,
    /// Paused: enqueues are accepted, nothing is handed out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
    /// Fair dispatch between task groups.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fair: Option<bool>,
    /// Group weights (1 to 1,000) merged into the queue's: a weight of 1 takes a
    /// group's entry out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group_weights: Option<BTreeMap<String, i64>>,
}

/// What happened on a queue since the daemon started.
#[napi(object)]
#[derive(Debug, Clone, Deserialize)]
pub struct QueueTotals {
    /// Tasks enqueued (duplicates not counted).
    pub enqueued: i64,
    /// Tasks acked.
    pub acked: i64,
    /// Nacks.
    pub nacked: i64,
    /// Leases that lapsed.
    pub lapsed: i64,
}

/// A queue with its counts (PROTOCOL.md §4.4).
#[napi(object)]
#[derive(Debug, Clone, Deserialize)]
pub struct QueueInfo {
    /// The queue's name.
    pub name: String,
    /// Its options.
    pub options: QueueOptions,
    /// Tasks `scheduled`.
    pub scheduled: i64,
    /// Tasks `ready`.
    pub ready: i64,
    /// Tasks `leased`.
    pub leased: i64,
    /// Tasks `suspended`.
    #[serde(default)]
    pub suspended: i64,
    /// Tasks `done`.
    pub done: i64,
    /// Tasks `dead`.
    pub dead: i64,
    /// Tasks `cancelled`.
    pub cancelled: i64,
    /// Ready tasks waiting for their key: an earlier task of the key is leased,
    /// suspended or scheduled for a retry.
    pub held_back: i64,
    /// Ready tasks (not held back) whose `requires` no connected member's labels cover.
    pub unclaimable: i64,
    /// Ready tasks waiting for room in a limit they draw on.
    #[serde(default)]
    pub waiting_on_limits: i64,
    /// The label sets unclaimable tasks require: the 16 holding the most tasks, sorted.
    pub unclaimable_requires: Vec<Vec<String>>,
    /// How many label sets unclaimable tasks require in all.
    #[serde(default)]
    pub unclaimable_sets: i64,
    /// Who can take its tasks now: connected members subscribed to it (not draining)
    /// and claims parked on it.
    #[serde(default)]
    pub consumers: i64,
    /// What happened on it since the daemon started.
    pub totals: QueueTotals,
    /// When the oldest ready task was enqueued, if a task is ready.
    #[serde(default)]
    pub oldest_ready_ms: Option<i64>,
    /// When the queue was created.
    pub created_ms: i64,
}

// ---- tasks --------------------------------------------------------------------------

/// A task in a listing (`list`, `find`, `update`, `memberDescribe`; PROTOCOL.md
/// §4.10): a `TaskInfo` without its payload, result, history and a few more.
#[napi(object)]
#[derive(Debug, Clone, Deserialize)]
pub struct TaskSummary {
    /// The task's id.
    pub id: String,
    /// Its queue.
    pub queue: String,
    /// Its state.
    pub state: String,
    /// Its priority.
    pub priority: u8,
    /// Its key, if any.
    #[serde(default)]
    pub key: Option<String>,
    /// Leases granted so far.
    pub deliveries: i64,
    /// Failures since enqueue or the last redrive.
    pub failures: i64,
    /// When a scheduled task becomes ready.
    #[serde(default)]
    pub not_before_ms: Option<i64>,
    /// The current lease, while leased.
    #[serde(default)]
    pub lease: Option<LeaseInfo>,
    /// The last error.
    #[serde(default)]
    pub last_error: Option<String>,
    /// Why it is dead.
    #[serde(default)]
    pub dead_reason: Option<String>,
    /// While suspended: why, since when, and what its timeout does.
    #[serde(default)]
    pub suspension: Option<SuspensionInfo>,
    /// When it was enqueued.
    pub created_ms: i64,
    /// When it last changed state.
    pub updated_ms: i64,
    /// The JSON text of its last progress checkpoint, cut to 256 bytes with `…`
    /// appended when longer (it is then no longer JSON); absent if it has none.
    #[serde(default)]
    pub progress: Option<String>,
}

/// A page of a queue's tasks in one state, oldest first.
#[napi(object)]
#[derive(Debug, Clone, Deserialize)]
pub struct TaskPage {
    /// The tasks.
    pub tasks: Vec<TaskSummary>,
    /// Pass it as `after` for the next page; absent on the last page. A page may end
    /// short of its limit (to fit a frame) and still have a next one.
    #[serde(default)]
    pub next: Option<String>,
}

/// Which page of a listing.
#[napi(object)]
#[derive(Debug, Clone, Default, Serialize)]
pub struct PageOptions {
    /// Start after this (the previous page's `next`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
    /// The most items, 1 to `MAX_PAGE` (100 if left out).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<i64>,
}

/// A payload field a search compares: the value at a dotted path of object keys and
/// array indexes (`order.lines.0.sku`) equals `value` (numbers by value: 1 equals 1.0).
#[napi(object)]
#[derive(Debug, Clone, Serialize)]
pub struct FieldMatch {
    /// Object keys and array indexes separated by dots.
    pub path: String,
    /// The value the field must equal.
    pub value: Value,
}

/// Where a search stopped: the last task it examined and that task's queue.
#[napi(object)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FindCursor {
    /// The queue the search was in.
    pub queue: String,
    /// The last id examined there.
    pub id: String,
}

/// What `find` searches for (PROTOCOL.md §5.35): every filter given must match.
#[napi(object)]
#[derive(Debug, Clone, Default, Serialize)]
pub struct FindOptions {
    /// The queue to search; every queue the token covers if left out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// Only tasks in this state.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// Only tasks whose id starts with this (1 to 26 characters, any case).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id_prefix: Option<String>,
    /// Only tasks with this key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Only tasks with this idempotency key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// Only tasks that require this label.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// Only tasks whose last error contains this (ASCII case-insensitive).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Only tasks whose payload's JSON text, as stored, contains this (case-sensitive).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload: Option<String>,
    /// Only tasks whose payload has this value at this path.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<FieldMatch>,
    /// Newest first (queues in reverse name order, ids descending).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub newest_first: Option<bool>,
    /// Continue from here: the previous result's `next`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub after: Option<FindCursor>,
    /// The most matches, 1 to `MAX_PAGE` (100 if left out).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<i64>,
}

/// What one step of a search found. One step does a bounded amount of work: it may
/// hold fewer matches than asked for, even none, and still have a `next`.
#[napi(object)]
#[derive(Debug, Clone, Deserialize)]
pub struct FindResult {
    /// The matches, in search order.
    pub tasks: Vec<TaskSummary>,
    /// Where to continue (pass it as `after`); absent once every candidate was
    /// examined.
    #[serde(default)]
    pub next: Option<FindCursor>,
    /// What this step examined.
    pub scanned: i64,
}

/// A change to a task that waits (`ready` or `scheduled`): at least one of them.
#[napi(object)]
#[derive(Debug, Clone, Default, Serialize)]
pub struct TaskUpdate {
    /// Its new priority, 0 to 9.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<i64>,
    /// A scheduled task becomes ready now (a ready one stays as it is).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_now: Option<bool>,
}

/// What a cancel did.
#[napi(object)]
#[derive(Debug, Clone, Deserialize)]
pub struct CancelResult {
    /// `cancelled`, or `leased` while its holder is asked to stop.
    pub state: String,
    /// True when the task is leased and its holder was asked to stop: it ends
    /// `cancelled` at its holder's settle.
    pub cancel_requested: bool,
}

/// Which dead tasks of a queue `redrive` and `discard` act on: `ids`, or `all`.
#[napi(object)]
#[derive(Debug, Clone, Default, Serialize)]
pub struct DeadSelection {
    /// These dead tasks (1 to 1,000 ids); ignored with `all`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ids: Option<Vec<String>>,
    /// Every dead task of the queue.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub all: Option<bool>,
    /// Change nothing: count (and list) what would be affected.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dry_run: Option<bool>,
}

/// How many tasks an operation affected (or, for a dry run, would affect).
#[napi(object)]
#[derive(Debug, Clone, Deserialize)]
pub struct CountResult {
    /// How many.
    pub count: i64,
    /// For a dry run, their ids in id order (at most 1,000); empty otherwise.
    #[serde(default)]
    pub ids: Vec<String>,
}

// ---- limits -------------------------------------------------------------------------

/// A limit's rate: `count` tokens every `perMs` milliseconds, added a little at a time.
#[napi(object)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rate {
    /// Tokens per period, 1 to 1,000,000,000.
    pub count: i64,
    /// The period, 1 to 86,400,000 ms.
    pub per_ms: i64,
}

/// A limit's settings (PROTOCOL.md §4.14): a token bucket (`rate`, `burst`), a cap on
/// leases held at once (`concurrency`), or both.
#[napi(object)]
#[derive(Debug, Clone, Default, Serialize)]
pub struct LimitSpec {
    /// Tokens added to the bucket over time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate: Option<Rate>,
    /// The most tokens the bucket holds (1 to 1,000,000,000; the rate's count if left
    /// out). Only with a rate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub burst: Option<i64>,
    /// The most leases held at once, 1 to 1,000,000.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<i64>,
    /// Every key tasks name for it has its own bucket and count (false if left out).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub per_key: Option<bool>,
}

/// One key of a limit in use.
#[napi(object)]
#[derive(Debug, Clone, Deserialize)]
pub struct LimitKeyInfo {
    /// The key (`""` for the keyless bucket).
    pub key: String,
    /// Whole tokens in its bucket now; absent for a limit without a rate.
    #[serde(default)]
    pub tokens: Option<i64>,
    /// Leases held on it.
    pub held: i64,
    /// Ready tasks waiting for its room.
    pub waiting: i64,
    /// When its bucket is full again, if it is not.
    #[serde(default)]
    pub full_ms: Option<i64>,
    /// Until when it hands nothing out, while a holder's throttle lasts.
    #[serde(default)]
    pub throttled_until_ms: Option<i64>,
}

/// A limit: its settings and its state now.
#[napi(object)]
#[derive(Debug, Clone, Deserialize)]
pub struct LimitInfo {
    /// The limit's name.
    pub name: String,
    /// Its rate, if it has one.
    #[serde(default)]
    pub rate: Option<Rate>,
    /// Its burst (filled in: the rate's count if none was set); absent without a rate.
    #[serde(default)]
    pub burst: Option<i64>,
    /// Its cap on leases held at once, if any.
    #[serde(default)]
    pub concurrency: Option<u32>,
    /// Every key has its own bucket and count.
    #[serde(default)]
    pub per_key: bool,
    /// Leases held that draw on it.
    pub held: i64,
    /// Ready tasks waiting for its room.
    pub waiting: i64,
    /// Leases granted that drew on it since the daemon started.
    pub granted: i64,
    /// Throttles its holders reported since the daemon started.
    pub throttled: i64,
    /// Its keys in use (a bucket below full, leases held, tasks waiting, a throttle).
    pub keys_in_use: i64,
    /// The busiest keys in use, most leases held then most waiting first, at most 10.
    pub keys: Vec<LimitKeyInfo>,
    /// When it was created.
    pub created_ms: i64,
    /// When its settings last changed.
    pub updated_ms: i64,
}

// ---- pull-mode consuming ------------------------------------------------------------

/// How a `claim` leases.
#[napi(object)]
#[derive(Debug, Clone, Default, Serialize)]
pub struct ClaimOptions {
    /// The most tasks to lease, 1 to 1,000 (1 if left out).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max: Option<i64>,
    /// How long to wait for a first task, at most 300,000 (0 if left out: at once).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<i64>,
    /// The lease to grant, 100 to 86,400,000 (each task's queue's if left out).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_ms: Option<i64>,
    /// The member the leases belong to (anonymous if left out).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub member: Option<String>,
    /// The claimer's labels, matched against the tasks' `requires`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub labels: Option<Vec<String>>,
}

/// A task leased by `claim` (a delivery, PROTOCOL.md §4.7): renew and settle it with
/// this object, or `{ id, epoch }`, or the claim string `ID.EPOCH`.
#[napi(object)]
#[derive(Debug, Clone, Deserialize)]
pub struct Claim {
    /// The task's id.
    pub id: String,
    /// The lease's epoch: every renew and settle names it.
    pub epoch: i64,
    /// The task's queue.
    pub queue: String,
    /// Its payload.
    pub payload: Value,
    /// The delivery's number, 1 on the first.
    pub attempt: i64,
    /// Failures so far.
    pub failures: i64,
    /// Its priority.
    pub priority: u8,
    /// Its key, if any.
    #[serde(default)]
    pub key: Option<String>,
    /// When the lease lapses unless renewed (the daemon's clock).
    pub lease_expires_ms: i64,
    /// The lease's length from when the daemon granted it.
    pub lease_ms: i64,
    /// The last progress checkpoint an earlier holder stored, if any.
    #[serde(default)]
    pub progress: Option<Value>,
    /// True only for a task handed back to the member that held it before it
    /// restarted (never from `claim`).
    #[serde(default)]
    pub reclaimed: bool,
    /// How its last suspension ended, if it was suspended and resumed (or timed out
    /// into `ready`).
    #[serde(default)]
    pub resumed: Option<Resumed>,
    /// The task that spawned it, if it is a child.
    #[serde(default)]
    pub parent: Option<String>,
    /// The number its next output chunk gets: the `at` of this holder's first `emit`.
    #[serde(default)]
    pub output: i64,
}

/// A lease to renew or settle: the task's id and the lease's epoch (a `Claim` is one).
#[napi(object)]
#[derive(Debug, Clone)]
pub struct ClaimRef {
    /// The task's id.
    pub id: String,
    /// The lease's epoch.
    pub epoch: i64,
}

/// How a `renew` renews.
#[napi(object)]
#[derive(Debug, Clone, Default, Serialize)]
pub struct RenewOptions {
    /// The new lease from now, 100 to 86,400,000 (the queue's lease if left out).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub extend_ms: Option<i64>,
    /// A progress checkpoint to store (any JSON value, at most 64 KiB as JSON).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub progress: Option<Value>,
}

/// What a `renew` answered.
#[napi(object)]
#[derive(Debug, Clone, Deserialize)]
pub struct RenewResult {
    /// The new deadline (the daemon's clock).
    pub lease_expires_ms: i64,
    /// The lease's length from when the daemon renewed it.
    pub lease_ms: i64,
    /// A cancel was asked: stop and settle the task.
    pub cancel_requested: bool,
}

/// How a `nack` hands a task back.
#[napi(object)]
#[derive(Debug, Clone, Default, Serialize)]
pub struct NackOptions {
    /// Retry after this long (0: ready at once); the queue's backoff if left out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<i64>,
    /// What went wrong (at most 8 KiB; `nacked` if left out): the task's `lastError`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// How a `throttled` hands a task back.
#[napi(object)]
#[derive(Debug, Clone, Default, Serialize)]
pub struct ThrottleOptions {
    /// How long the limit (or, for a task that draws on none, the task) waits, 1 ms to
    /// 365 days (1,000 if left out).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<i64>,
    /// The limit the provider throttled, one the task draws on (every one it draws on
    /// if left out).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<String>,
    /// What the provider said (at most 8 KiB), for the task's timeline.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A settled task's state.
#[napi(object)]
#[derive(Debug, Clone, Deserialize)]
pub struct SettleResult {
    /// Its state now.
    pub state: String,
    /// When a `scheduled` task becomes ready.
    #[serde(default)]
    pub not_before_ms: Option<i64>,
}

/// How a `spawn` spawns: keeping the lease, or (`wait`) suspending the parent until
/// every child has finished.
#[napi(object)]
#[derive(Debug, Clone, Default)]
pub struct SpawnOptions {
    /// Suspend the parent until every child it spawned (now or before) has finished.
    pub wait: Option<bool>,
    /// With `wait`: what it waits for, shown to people ("waiting for its children" if
    /// left out).
    pub reason: Option<String>,
    /// With `wait`: how long it may wait, 1 ms to 365 days (7 days if left out).
    pub timeout_ms: Option<i64>,
    /// With `wait`: what the timeout does, `resume`, `fail` (if left out) or `cancel`.
    pub on_timeout: Option<String>,
}

/// What an `emit` answered.
#[napi(object)]
#[derive(Debug, Clone, Deserialize)]
pub struct EmitResult {
    /// The number the next chunk gets: the next emit's `at`.
    pub next: i64,
    /// Chunks of this emit stored before (by an earlier try whose reply was lost).
    #[serde(default)]
    pub repeated: i64,
    /// Wait this long before the next emit (the task's output rate is spent until then).
    #[serde(default)]
    pub wait_ms: i64,
    /// A cancel was asked: stop and settle the task.
    pub cancel_requested: bool,
}

/// What a resume did.
#[napi(object)]
#[derive(Debug, Clone, Deserialize)]
pub struct ResumeResult {
    /// The task's id.
    pub task: String,
    /// Its state now: `ready`.
    pub state: String,
}

// ---- members and the daemon ---------------------------------------------------------

/// A member: a name leases are held under (PROTOCOL.md §4.13).
#[napi(object)]
#[derive(Debug, Clone, Deserialize)]
pub struct MemberInfo {
    /// Its name.
    pub name: String,
    /// Its labels, from its session (none if it never had one).
    pub labels: Vec<String>,
    /// The most leases pushed to it at once, from its session (0 if it never had one).
    pub capacity: u32,
    /// Leases it holds now.
    pub leased: i64,
    /// `state` is `connected`.
    pub connected: bool,
    /// `connected`, `unreachable` (its session is silent past its liveness timeout) or
    /// `gone` (no session).
    pub state: String,
    /// Its session's liveness timeout; 0 without a session.
    pub liveness_ms: i64,
    /// Drained: it keeps what it holds and gets nothing new.
    pub draining: bool,
    /// The queues its session subscribed to.
    pub subscribed: Vec<String>,
    /// When the daemon last heard from its session, if it ever had one.
    #[serde(default)]
    pub last_seen_ms: Option<i64>,
}

/// One member and the tasks it holds.
#[napi(object)]
#[derive(Debug, Clone, Deserialize)]
pub struct MemberDescription {
    /// The member.
    pub member: MemberInfo,
    /// Its leased tasks in id order, as many as fit a reply.
    pub leases: Vec<TaskSummary>,
    /// How many it holds in all.
    #[serde(default)]
    pub leases_total: i64,
}

/// What `adminSnapshot` wrote.
#[napi(object)]
#[derive(Debug, Clone, Deserialize)]
pub struct SnapshotResult {
    /// The absolute path written, on the daemon's host.
    pub dir: String,
    /// Tasks in the copy.
    pub tasks: i64,
    /// Queues in the copy.
    pub queues: i64,
}

/// The daemon's own counters.
#[napi(object)]
#[derive(Debug, Clone, Deserialize)]
pub struct ServerStats {
    /// Dispatcher rounds that made changes durable (one fsync each with `sync`
    /// durability).
    pub syncs: i64,
    /// Requests applied in those rounds: `syncedRequests / syncs` is the group-commit
    /// batch factor.
    pub synced_requests: i64,
    /// `sync` (a reply leaves after fdatasync) or `buffered` (after the journal was
    /// handed to the OS).
    pub durability: String,
    /// The disk alarm is on: enqueues, spawns and emits are refused (`DiskFull`).
    #[serde(default)]
    pub disk_alarm: bool,
    /// Since the daemon started.
    #[serde(default)]
    pub uptime_ms: i64,
    /// Member sessions connected and reachable, counted at most a second ago.
    #[serde(default)]
    pub members_connected: i64,
    /// Microseconds the latest persist took (0 before the first).
    #[serde(default)]
    pub fsync_last_us: i64,
    /// Microseconds of every persist added up.
    #[serde(default)]
    pub fsync_total_us: i64,
}

/// One node of a cluster's membership.
#[napi(object)]
#[derive(Debug, Clone, Deserialize)]
pub struct ClusterMember {
    /// The node's id.
    pub node: i64,
    /// The address clients reach it at, `HOST:PORT`.
    pub addr: String,
    /// The address the other nodes reach it at, `HOST:PORT`.
    pub cluster_addr: String,
    /// It votes (false: a learner).
    pub voter: bool,
    /// The last log index the leader knows it holds; absent when the answering node
    /// is not the leader or does not know.
    #[serde(default)]
    pub matched: Option<i64>,
}

/// A cluster as the node that answered sees it.
#[napi(object)]
#[derive(Debug, Clone, Deserialize)]
pub struct ClusterStatus {
    /// The cluster's id.
    pub cluster_id: String,
    /// The answering node.
    pub node: i64,
    /// Its role: `leader`, `follower`, `candidate`, `learner` or `shutdown`.
    pub role: String,
    /// The term it is in.
    pub term: i64,
    /// The node it believes leads; absent during an election.
    #[serde(default)]
    pub leader: Option<i64>,
    /// The last entry of its log; absent while its log is empty.
    #[serde(default)]
    pub last_log_index: Option<i64>,
    /// The last entry it applied; absent before the first.
    #[serde(default)]
    pub last_applied: Option<i64>,
    /// The last entry its latest snapshot covers; absent before the first snapshot.
    #[serde(default)]
    pub snapshot_index: Option<i64>,
    /// Every voter and learner, by node id.
    pub members: Vec<ClusterMember>,
}

/// How `clusterAdd` adds a node.
#[napi(object)]
#[derive(Debug, Clone, Default, Serialize)]
pub struct ClusterAddOptions {
    /// Keep it a learner (it copies the log but does not vote).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub learner: Option<bool>,
    /// The longest wait for it to catch up before it is made a voter, 1 to 3,600,000
    /// (60,000 if left out).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub catch_up_ms: Option<i64>,
}
