//! The store's own record types: what is on disk, apart from the wire types.
//!
//! The engine works with [`TaskRecord`](super::TaskRecord) and
//! [`QueueRecord`](super::QueueRecord), which hold protocol types (task states, queue
//! options, timeline events). On disk they go through the `Stored*` types here, which
//! spell format 1 out field by field: a change to a wire type cannot change the store
//! by accident, and every record's version `v` is checked when it is read.
//!
//! Format history:
//! - 1: JSON records, `v: 1` in each (the first format). Stores from before the
//!   `meta` keyspace existed are format 1. Task records gained `enqueued_by` and
//!   `payload_bytes` later in format 1: a record without them was enqueued by nobody
//!   and counts 0 bytes against any quota.
//! - 2: task records in postcard (a compact binary serde format: varints, length-
//!   prefixed strings, fields in declaration order), [`TaskHead`] first: the fields the
//!   start-up index needs, so the scan decodes only those. About a quarter of the size
//!   of a format 1 record and several times faster to write and read, which is what
//!   every enqueue, lease and ack pays. Queue records stay JSON, now `v: 2`. A format 1
//!   store needs no migration: its task records are JSON (they begin with `{`, which no
//!   format 2 record does, as its first byte is its version) and are read as they are,
//!   then written in format 2 when they next change.
//! - 3: task records gain the limits they draw on and their group ([`TaskHead`], then
//!   the limits, the group, then [`TaskBody`]); the `limits` keyspace holds limit
//!   records (JSON, `v: 3`). Format 2 records are read as they are (they draw on no
//!   limit, name no group) and written in format 3 when they next change. Queue records
//!   gain `fair` and `group_weights`, left out while off and empty.
//! - 4: task records gain what waiting needs ([`TaskWait`], after the limits and group:
//!   a suspended task's suspension, whose timeout the start-up index reads, and how its
//!   last suspension ended); task states gain `suspended` (at the end of
//!   [`StoredState`]). Format 2 and 3 records are read as they are (never suspended)
//!   and written in format 4 when they next change.
//! - 5: task records gain their family ([`TaskFamily`], after what waiting needs: a
//!   child's parent and key, which the start-up index reads) and what waiting for
//!   children needs ([`TaskFanIn`]: whether the suspension waits for them, and the
//!   children's outcomes its parent woke with). Format 2 to 4 records are read as they
//!   are (no family, never waiting for children) and written in format 5 when they next
//!   change.
//! - 6: the `output` keyspace (task output, its own records); task records are as in
//!   format 5 (a format 6 record reads as one).
//! - 7: the `schedules` keyspace (schedule records, JSON, `v: 7`); task records gain,
//!   after their body, the W3C trace context they were enqueued with ([`TaskTrace`]).
//!   Format 5 and 6 records are read as they are (no trace context) and written in
//!   format 7 when they next change.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use muster_protocol::RawJson;
use muster_protocol::model::{
    Backoff, ChildOutcome, LimitSpec, OnTimeout, QueueOptions, Rate, Resumed, SuspensionInfo,
    TaskState, TimelineEvent,
};

use super::{
    LeaseRecord, LimitRecord, ParentLink, QueueRecord, ScheduleRecord, SuspensionRecord, TaskIndex,
    TaskLimit, TaskRecord,
};

/// The format this build writes, and the newest it reads.
pub const FORMAT: u32 = 7;

/// The oldest format this build reads (older ones would be migrated on open).
pub const OLDEST_FORMAT: u32 = 1;

/// Checks a record's version: a record of a newer format is refused with a message
/// that says so; an older one would be migrated (there is none yet).
pub(super) fn check_version(v: u32) -> Result<(), String> {
    if v > FORMAT {
        return Err(format!(
            "record format {v} was written by a newer musterd; this one reads formats {OLDEST_FORMAT} to {FORMAT}"
        ));
    }
    if v < OLDEST_FORMAT {
        return Err(format!("record format {v} is not a muster format"));
    }
    Ok(())
}

/// A task's state on disk: by name in format 1, by its position here in format 2 (so
/// variants are never reordered, only added at the end).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StoredState {
    /// Waiting for its time.
    Scheduled,
    /// Waiting for a holder.
    Ready,
    /// Held under a lease.
    Leased,
    /// Acked.
    Done,
    /// Out of attempts or dead-lettered.
    Dead,
    /// Cancelled.
    Cancelled,
    /// Suspended until a resume or its timeout.
    Suspended,
}

impl From<TaskState> for StoredState {
    fn from(s: TaskState) -> Self {
        match s {
            TaskState::Scheduled => StoredState::Scheduled,
            TaskState::Ready => StoredState::Ready,
            TaskState::Leased => StoredState::Leased,
            TaskState::Done => StoredState::Done,
            TaskState::Dead => StoredState::Dead,
            TaskState::Cancelled => StoredState::Cancelled,
            TaskState::Suspended => StoredState::Suspended,
        }
    }
}

impl From<StoredState> for TaskState {
    fn from(s: StoredState) -> Self {
        match s {
            StoredState::Scheduled => TaskState::Scheduled,
            StoredState::Ready => TaskState::Ready,
            StoredState::Leased => TaskState::Leased,
            StoredState::Done => TaskState::Done,
            StoredState::Dead => TaskState::Dead,
            StoredState::Cancelled => TaskState::Cancelled,
            StoredState::Suspended => TaskState::Suspended,
        }
    }
}

/// A task record of format 1 (JSON), without its payload: read, never written.
#[derive(Debug, Deserialize)]
struct StoredTask1 {
    v: u32,
    queue: String,
    state: StoredState,
    priority: u8,
    key: Option<String>,
    requires: Vec<String>,
    not_before_ms: Option<u64>,
    idempotency_key: Option<String>,
    deliveries: u64,
    failures: u64,
    lease: Option<LeaseRecord>,
    cancel_requested: bool,
    progress: Option<RawJson>,
    result: Option<RawJson>,
    last_error: Option<String>,
    dead_reason: Option<String>,
    created_ms: u64,
    updated_ms: u64,
    finished_ms: Option<u64>,
    history: Vec<Event<'static>>,
    #[serde(default)]
    enqueued_by: Option<String>,
    #[serde(default)]
    payload_bytes: u64,
}

impl TryFrom<StoredTask1> for TaskRecord {
    type Error = String;

    fn try_from(s: StoredTask1) -> Result<Self, String> {
        check_json_version(s.v)?;
        Ok(TaskRecord {
            queue: s.queue,
            state: s.state.into(),
            priority: s.priority,
            key: s.key,
            requires: s.requires,
            limits: Vec::new(),
            group: None,
            not_before_ms: s.not_before_ms,
            idempotency_key: s.idempotency_key,
            deliveries: s.deliveries,
            failures: s.failures,
            lease: s.lease,
            cancel_requested: s.cancel_requested,
            progress: s.progress,
            result: s.result,
            last_error: s.last_error,
            dead_reason: s.dead_reason,
            suspension: None,
            resumed: None,
            parent: None,
            traceparent: None,
            tracestate: None,
            created_ms: s.created_ms,
            updated_ms: s.updated_ms,
            finished_ms: s.finished_ms,
            history: s.history.into_iter().map(Into::into).collect(),
            enqueued_by: s.enqueued_by,
            stored_bytes: s.payload_bytes,
        })
    }
}

/// The first part of a format 2 task record: what the start-up index needs. It also
/// reads those fields of a format 1 (JSON) record, skipping the rest; the defaults are
/// for format 1 records from before those fields (postcard always has every field).
#[derive(Debug, Serialize, Deserialize)]
struct TaskHead<'a> {
    v: u32,
    queue: Cow<'a, str>,
    state: StoredState,
    priority: u8,
    key: Option<Cow<'a, str>>,
    requires: Cow<'a, [String]>,
    not_before_ms: Option<u64>,
    deliveries: u64,
    lease: Option<Cow<'a, LeaseRecord>>,
    finished_ms: Option<u64>,
    #[serde(default)]
    enqueued_by: Option<Cow<'a, str>>,
    #[serde(default)]
    payload_bytes: u64,
}

/// The rest of a format 2 task record.
#[derive(Debug, Serialize, Deserialize)]
struct TaskBody<'a> {
    idempotency_key: Option<Cow<'a, str>>,
    failures: u64,
    cancel_requested: bool,
    progress: Option<Cow<'a, str>>,
    result: Option<Cow<'a, str>>,
    last_error: Option<Cow<'a, str>>,
    dead_reason: Option<Cow<'a, str>>,
    created_ms: u64,
    updated_ms: u64,
    history: Vec<Event<'a>>,
}

/// One timeline event of a record of either format (format 1 leaves out the fields
/// it does not have).
#[derive(Debug, Serialize, Deserialize)]
struct Event<'a> {
    at_ms: u64,
    event: Cow<'a, str>,
    #[serde(default)]
    member: Option<Cow<'a, str>>,
    #[serde(default)]
    epoch: Option<u64>,
    #[serde(default)]
    error: Option<Cow<'a, str>>,
}

impl From<Event<'_>> for TimelineEvent {
    fn from(e: Event<'_>) -> Self {
        TimelineEvent {
            at_ms: e.at_ms,
            event: e.event.into_owned(),
            member: e.member.map(Cow::into_owned),
            epoch: e.epoch,
            error: e.error.map(Cow::into_owned),
        }
    }
}

/// A format 2 task record: its head, then its body. Read, never written.
#[derive(Debug, Deserialize)]
struct StoredTask2<'a> {
    #[serde(borrow)]
    head: TaskHead<'a>,
    #[serde(borrow)]
    body: TaskBody<'a>,
}

/// A format 3 task record: its head, the limits it draws on, its group, then its body.
#[derive(Debug, Serialize, Deserialize)]
struct StoredTask3<'a> {
    #[serde(borrow)]
    head: TaskHead<'a>,
    #[serde(borrow)]
    flow: TaskFlow<'a>,
    #[serde(borrow)]
    body: TaskBody<'a>,
}

/// What a format 3 task record adds after its head: the start-up index needs it too.
#[derive(Debug, Default, Serialize, Deserialize)]
struct TaskFlow<'a> {
    limits: Cow<'a, [TaskLimit]>,
    #[serde(borrow)]
    group: Option<Cow<'a, str>>,
}

/// A format 4 task record: its head, its flow, what waiting needs, then its body.
#[derive(Debug, Serialize, Deserialize)]
struct StoredTask4<'a> {
    #[serde(borrow)]
    head: TaskHead<'a>,
    #[serde(borrow)]
    flow: TaskFlow<'a>,
    #[serde(borrow)]
    wait: TaskWait<'a>,
    #[serde(borrow)]
    body: TaskBody<'a>,
}

/// What a format 4 task record adds after its flow: the start-up index reads the
/// suspension (for its timeout), so it comes before the body.
#[derive(Debug, Default, Serialize, Deserialize)]
struct TaskWait<'a> {
    #[serde(borrow)]
    suspension: Option<StoredSuspension<'a>>,
    #[serde(borrow)]
    resumed: Option<StoredResumed<'a>>,
}

/// A format 5 task record: a format 4 record's parts, its family and what waiting for
/// children needs before the body.
#[derive(Debug, Serialize, Deserialize)]
struct StoredTask5<'a> {
    #[serde(borrow)]
    head: TaskHead<'a>,
    #[serde(borrow)]
    flow: TaskFlow<'a>,
    #[serde(borrow)]
    wait: TaskWait<'a>,
    #[serde(borrow)]
    family: TaskFamily<'a>,
    #[serde(borrow)]
    fan_in: TaskFanIn<'a>,
    #[serde(borrow)]
    body: TaskBody<'a>,
}

/// A format 7 task record: a format 5 record and, after its body, its trace context (a
/// format 5 or 6 record is a format 7 record without it: none).
#[derive(Debug, Serialize, Deserialize)]
struct StoredTask7<'a> {
    #[serde(borrow)]
    task: StoredTask5<'a>,
    #[serde(borrow)]
    trace: TaskTrace<'a>,
}

/// What a format 7 task record adds after its body: the W3C trace context it was
/// enqueued with.
#[derive(Debug, Default, Serialize, Deserialize)]
struct TaskTrace<'a> {
    #[serde(borrow)]
    traceparent: Option<Cow<'a, str>>,
    #[serde(borrow)]
    tracestate: Option<Cow<'a, str>>,
}

/// What a format 5 task record adds after what waiting needs: a child's parent, which
/// the start-up index reads.
#[derive(Debug, Default, Serialize, Deserialize)]
struct TaskFamily<'a> {
    #[serde(borrow)]
    parent: Option<StoredParent<'a>>,
}

/// A child's link to its parent on disk (the parent's id as its 128 bits).
#[derive(Debug, Serialize, Deserialize)]
struct StoredParent<'a> {
    id: u128,
    depth: u8,
    child_key: Cow<'a, str>,
}

/// What a format 5 task record adds after its family: whether its suspension waits
/// for its children, and the outcomes of the children it last woke with.
#[derive(Debug, Default, Serialize, Deserialize)]
struct TaskFanIn<'a> {
    waits: bool,
    #[serde(borrow)]
    outcomes: Vec<StoredOutcome<'a>>,
}

/// A child's outcome on disk.
#[derive(Debug, Serialize, Deserialize)]
struct StoredOutcome<'a> {
    id: u128,
    state: StoredState,
    omitted: bool,
    child_key: Cow<'a, str>,
    queue: Cow<'a, str>,
    result: Option<Cow<'a, str>>,
    error: Option<Cow<'a, str>>,
}

impl<'a> StoredOutcome<'a> {
    fn new(o: &'a ChildOutcome) -> Self {
        StoredOutcome {
            id: ulid::Ulid::from_string(&o.id)
                .expect("a child outcome names a task by its id")
                .0,
            state: o.state.into(),
            omitted: o.omitted,
            child_key: Cow::Borrowed(&o.child_key),
            queue: Cow::Borrowed(&o.queue),
            result: o.result.as_deref().map(|r| Cow::Borrowed(r.get())),
            error: o.error.as_deref().map(Cow::Borrowed),
        }
    }

    fn outcome(self) -> Result<ChildOutcome, String> {
        Ok(ChildOutcome {
            id: ulid::Ulid(self.id).to_string(),
            child_key: self.child_key.into_owned(),
            queue: self.queue.into_owned(),
            state: self.state.into(),
            result: self.result.map(raw_json).transpose()?,
            error: self.error.map(Cow::into_owned),
            omitted: self.omitted,
        })
    }
}

/// A suspension on disk; `on_timeout` by position (0 resume, 1 fail, 2 cancel).
#[derive(Debug, Serialize, Deserialize)]
struct StoredSuspension<'a> {
    timeout_at_ms: u64,
    on_timeout: u8,
    epoch: u64,
    since_ms: u64,
    token_digest: [u8; 32],
    member: Cow<'a, str>,
    reason: Cow<'a, str>,
}

/// How a suspension ended, on disk.
#[derive(Debug, Serialize, Deserialize)]
struct StoredResumed<'a> {
    at_ms: u64,
    timed_out: bool,
    by: Cow<'a, str>,
    data: Option<Cow<'a, str>>,
}

const ON_TIMEOUT: [OnTimeout; 3] = [OnTimeout::Resume, OnTimeout::Fail, OnTimeout::Cancel];

impl<'a> StoredSuspension<'a> {
    fn new(r: &'a SuspensionRecord) -> Self {
        let i = &r.info;
        StoredSuspension {
            timeout_at_ms: i.timeout_at_ms,
            on_timeout: ON_TIMEOUT
                .iter()
                .position(|o| *o == i.on_timeout)
                .expect("every OnTimeout is in ON_TIMEOUT") as u8,
            epoch: i.epoch,
            since_ms: i.since_ms,
            token_digest: r.token_digest,
            member: Cow::Borrowed(&i.member),
            reason: Cow::Borrowed(&i.reason),
        }
    }

    fn record(self, children: bool) -> Result<SuspensionRecord, String> {
        let on_timeout = *ON_TIMEOUT
            .get(usize::from(self.on_timeout))
            .ok_or_else(|| format!("on_timeout {} is not a muster value", self.on_timeout))?;
        Ok(SuspensionRecord {
            info: SuspensionInfo {
                reason: self.reason.into_owned(),
                member: self.member.into_owned(),
                epoch: self.epoch,
                since_ms: self.since_ms,
                timeout_at_ms: self.timeout_at_ms,
                on_timeout,
                children,
            },
            token_digest: self.token_digest,
        })
    }
}

impl<'a> StoredResumed<'a> {
    fn new(r: &'a Resumed) -> Self {
        StoredResumed {
            at_ms: r.at_ms,
            timed_out: r.timed_out,
            by: Cow::Borrowed(&r.by),
            data: r.data.as_deref().map(|d| Cow::Borrowed(d.get())),
        }
    }

    fn resumed(self, children: Vec<ChildOutcome>) -> Result<Resumed, String> {
        Ok(Resumed {
            data: self.data.map(raw_json).transpose()?,
            by: self.by.into_owned(),
            at_ms: self.at_ms,
            timed_out: self.timed_out,
            children,
        })
    }
}

/// The first byte of every format 1 record (a JSON object); never the first byte of a
/// format 2 record, which is its version as a varint (2 to 127 in one byte).
const JSON_RECORD: u8 = b'{';

/// Bytes reserved for encoding a record without its timeline, and for each event: most
/// records then take one allocation, not the several of a growing buffer.
const RECORD_ROOM: usize = 96;
const EVENT_ROOM: usize = 32;

/// A task record in the current format.
pub(super) fn encode_task(r: &TaskRecord) -> Vec<u8> {
    fn borrowed(s: &Option<String>) -> Option<Cow<'_, str>> {
        s.as_deref().map(Cow::Borrowed)
    }
    let stored = StoredTask5 {
        head: TaskHead {
            v: FORMAT,
            queue: Cow::Borrowed(&r.queue),
            state: r.state.into(),
            priority: r.priority,
            key: borrowed(&r.key),
            requires: Cow::Borrowed(&r.requires),
            not_before_ms: r.not_before_ms,
            deliveries: r.deliveries,
            lease: r.lease.as_ref().map(Cow::Borrowed),
            finished_ms: r.finished_ms,
            enqueued_by: borrowed(&r.enqueued_by),
            payload_bytes: r.stored_bytes,
        },
        flow: TaskFlow {
            limits: Cow::Borrowed(&r.limits),
            group: borrowed(&r.group),
        },
        wait: TaskWait {
            suspension: r.suspension.as_ref().map(StoredSuspension::new),
            resumed: r.resumed.as_ref().map(StoredResumed::new),
        },
        family: TaskFamily {
            parent: r.parent.as_ref().map(|p| StoredParent {
                id: p.id.0,
                depth: p.depth,
                child_key: Cow::Borrowed(&p.child_key),
            }),
        },
        fan_in: TaskFanIn {
            waits: r.suspension.as_ref().is_some_and(|s| s.info.children),
            outcomes: r
                .resumed
                .iter()
                .flat_map(|r| &r.children)
                .map(StoredOutcome::new)
                .collect(),
        },
        body: TaskBody {
            idempotency_key: borrowed(&r.idempotency_key),
            failures: r.failures,
            cancel_requested: r.cancel_requested,
            progress: r.progress.as_deref().map(|p| Cow::Borrowed(p.get())),
            result: r.result.as_deref().map(|p| Cow::Borrowed(p.get())),
            last_error: borrowed(&r.last_error),
            dead_reason: borrowed(&r.dead_reason),
            created_ms: r.created_ms,
            updated_ms: r.updated_ms,
            history: r
                .history
                .iter()
                .map(|e| Event {
                    at_ms: e.at_ms,
                    event: Cow::Borrowed(&e.event),
                    member: borrowed(&e.member),
                    epoch: e.epoch,
                    error: borrowed(&e.error),
                })
                .collect(),
        },
    };
    let stored = StoredTask7 {
        task: stored,
        trace: TaskTrace {
            traceparent: borrowed(&r.traceparent),
            tracestate: borrowed(&r.tracestate),
        },
    };
    let room = RECORD_ROOM + r.history.len() * EVENT_ROOM;
    postcard::to_extend(&stored, Vec::with_capacity(room))
        .expect("postcard writes every record into a Vec")
}

/// A task record of any format this build reads.
pub(super) fn decode_task(bytes: &[u8]) -> Result<TaskRecord, String> {
    if bytes.first() == Some(&JSON_RECORD) {
        let stored: StoredTask1 = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        return stored.try_into();
    }
    let mut trace = TaskTrace::default();
    let (head, flow, wait, family, fan_in, body) = match binary_version(bytes)? {
        2 => {
            let StoredTask2 { head, body } =
                postcard::from_bytes(bytes).map_err(|e| e.to_string())?;
            let (flow, wait) = (TaskFlow::default(), TaskWait::default());
            (
                head,
                flow,
                wait,
                TaskFamily::default(),
                TaskFanIn::default(),
                body,
            )
        }
        3 => {
            let StoredTask3 { head, flow, body } =
                postcard::from_bytes(bytes).map_err(|e| e.to_string())?;
            let wait = TaskWait::default();
            (
                head,
                flow,
                wait,
                TaskFamily::default(),
                TaskFanIn::default(),
                body,
            )
        }
        4 => {
            let StoredTask4 {
                head,
                flow,
                wait,
                body,
            } = postcard::from_bytes(bytes).map_err(|e| e.to_string())?;
            (
                head,
                flow,
                wait,
                TaskFamily::default(),
                TaskFanIn::default(),
                body,
            )
        }
        5 | 6 => {
            let StoredTask5 {
                head,
                flow,
                wait,
                family,
                fan_in,
                body,
            } = postcard::from_bytes(bytes).map_err(|e| e.to_string())?;
            (head, flow, wait, family, fan_in, body)
        }
        _ => {
            let StoredTask7 {
                task:
                    StoredTask5 {
                        head,
                        flow,
                        wait,
                        family,
                        fan_in,
                        body,
                    },
                trace: stored_trace,
            } = postcard::from_bytes(bytes).map_err(|e| e.to_string())?;
            trace = stored_trace;
            (head, flow, wait, family, fan_in, body)
        }
    };
    let outcomes = fan_in
        .outcomes
        .into_iter()
        .map(StoredOutcome::outcome)
        .collect::<Result<Vec<_>, _>>()?;
    let owned = |s: Option<Cow<'_, str>>| s.map(Cow::into_owned);
    Ok(TaskRecord {
        queue: head.queue.into_owned(),
        state: head.state.into(),
        priority: head.priority,
        key: owned(head.key),
        requires: head.requires.into_owned(),
        limits: flow.limits.into_owned(),
        group: owned(flow.group),
        not_before_ms: head.not_before_ms,
        idempotency_key: owned(body.idempotency_key),
        deliveries: head.deliveries,
        failures: body.failures,
        lease: head.lease.map(Cow::into_owned),
        cancel_requested: body.cancel_requested,
        progress: body.progress.map(raw_json).transpose()?,
        result: body.result.map(raw_json).transpose()?,
        last_error: owned(body.last_error),
        dead_reason: owned(body.dead_reason),
        suspension: wait
            .suspension
            .map(|s| s.record(fan_in.waits))
            .transpose()?,
        resumed: wait.resumed.map(|r| r.resumed(outcomes)).transpose()?,
        parent: family.parent.map(|p| ParentLink {
            id: ulid::Ulid(p.id),
            child_key: p.child_key.into_owned(),
            depth: p.depth,
        }),
        traceparent: owned(trace.traceparent),
        tracestate: owned(trace.tracestate),
        created_ms: body.created_ms,
        updated_ms: body.updated_ms,
        finished_ms: head.finished_ms,
        history: body.history.into_iter().map(Into::into).collect(),
        enqueued_by: owned(head.enqueued_by),
        stored_bytes: head.payload_bytes,
    })
}

/// What the start-up index needs of a task record of any format, decoding no more.
pub(super) fn decode_index(bytes: &[u8]) -> Result<TaskIndex, String> {
    let (head, flow, timeout_at_ms, parent) = if bytes.first() == Some(&JSON_RECORD) {
        let head: TaskHead<'_> = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        check_json_version(head.v)?;
        (head, TaskFlow::default(), None, None)
    } else {
        let v = binary_version(bytes)?;
        let (head, rest): (TaskHead<'_>, _) =
            postcard::take_from_bytes(bytes).map_err(|e| e.to_string())?;
        if v == 2 {
            (head, TaskFlow::default(), None, None)
        } else {
            let (flow, rest): (TaskFlow<'_>, _) =
                postcard::take_from_bytes(rest).map_err(|e| e.to_string())?;
            let (timeout_at_ms, parent) = match v {
                3 => (None, None),
                4 => {
                    // The suspension comes first in the wait part; its timeout first in it.
                    let (suspension, _rest): (Option<StoredSuspension<'_>>, _) =
                        postcard::take_from_bytes(rest).map_err(|e| e.to_string())?;
                    (suspension.map(|s| s.timeout_at_ms), None)
                }
                _ => {
                    let (wait, rest): (TaskWait<'_>, _) =
                        postcard::take_from_bytes(rest).map_err(|e| e.to_string())?;
                    let (family, _rest): (TaskFamily<'_>, _) =
                        postcard::take_from_bytes(rest).map_err(|e| e.to_string())?;
                    let parent = family
                        .parent
                        .map(|p| (ulid::Ulid(p.id), p.child_key.into_owned()));
                    (wait.suspension.map(|s| s.timeout_at_ms), parent)
                }
            };
            (head, flow, timeout_at_ms, parent)
        }
    };
    Ok(TaskIndex {
        queue: head.queue.into_owned(),
        state: head.state.into(),
        priority: head.priority,
        key: head.key.map(Cow::into_owned),
        requires: head.requires.into_owned(),
        limits: flow.limits.into_owned(),
        group: flow.group.map(Cow::into_owned),
        not_before_ms: head.not_before_ms,
        timeout_at_ms,
        parent,
        deliveries: head.deliveries,
        lease: head.lease.map(Cow::into_owned),
        finished_ms: head.finished_ms,
        enqueued_by: head.enqueued_by.map(Cow::into_owned),
        stored_bytes: head.payload_bytes,
    })
}

fn raw_json(text: Cow<'_, str>) -> Result<RawJson, String> {
    serde_json::value::RawValue::from_string(text.into_owned()).map_err(|e| e.to_string())
}

/// A JSON task record is format 1, whatever else it says.
fn check_json_version(v: u32) -> Result<(), String> {
    check_version(v)?;
    if v != 1 {
        return Err(format!("a JSON task record says format {v}, not 1"));
    }
    Ok(())
}

/// The format of a binary task record (its first field, a varint): 2 or later.
fn binary_version(bytes: &[u8]) -> Result<u32, String> {
    let (v, _): (u32, _) = postcard::take_from_bytes(bytes).map_err(|e| e.to_string())?;
    check_version(v)?;
    if v < 2 {
        return Err(format!("a binary task record says format {v}"));
    }
    Ok(v)
}

/// A limit record on disk (JSON).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StoredLimit {
    v: u32,
    rate: Option<StoredRate>,
    burst: Option<u64>,
    concurrency: Option<u32>,
    per_key: bool,
    created_ms: u64,
    updated_ms: u64,
}

/// A limit's rate on disk.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct StoredRate {
    count: u64,
    per_ms: u64,
}

impl From<LimitRecord> for StoredLimit {
    fn from(r: LimitRecord) -> Self {
        StoredLimit {
            v: FORMAT,
            rate: r.spec.rate.map(|r| StoredRate {
                count: r.count,
                per_ms: r.per_ms,
            }),
            burst: r.spec.burst,
            concurrency: r.spec.concurrency,
            per_key: r.spec.per_key,
            created_ms: r.created_ms,
            updated_ms: r.updated_ms,
        }
    }
}

impl TryFrom<StoredLimit> for LimitRecord {
    type Error = String;

    fn try_from(s: StoredLimit) -> Result<Self, String> {
        check_version(s.v)?;
        Ok(LimitRecord {
            spec: LimitSpec {
                rate: s.rate.map(|r| Rate {
                    count: r.count,
                    per_ms: r.per_ms,
                }),
                burst: s.burst,
                concurrency: s.concurrency,
                per_key: s.per_key,
            },
            created_ms: s.created_ms,
            updated_ms: s.updated_ms,
        })
    }
}

/// A schedule on disk (format 7), JSON. Its task is the protocol's `NewTask` as JSON,
/// whose fields only ever grow (each optional).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StoredSchedule {
    v: u32,
    cron: String,
    tz: String,
    queue: String,
    task: muster_protocol::model::NewTask,
    catch_up: StoredCatchUp,
    paused: bool,
    cursor_ms: u64,
    last_fire_ms: Option<u64>,
    last_task: Option<String>,
    fires: u64,
    runs: u64,
    missed: u64,
    failures: u64,
    last_error: Option<String>,
    owner: Option<String>,
    created_ms: u64,
    updated_ms: u64,
}

/// A schedule's catch-up policy on disk, by name.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum StoredCatchUp {
    Skip,
    Once,
}

impl From<ScheduleRecord> for StoredSchedule {
    fn from(r: ScheduleRecord) -> Self {
        use muster_protocol::model::CatchUp;
        StoredSchedule {
            v: FORMAT,
            cron: r.cron,
            tz: r.tz,
            queue: r.queue,
            task: r.task,
            catch_up: match r.catch_up {
                CatchUp::Skip => StoredCatchUp::Skip,
                CatchUp::Once => StoredCatchUp::Once,
            },
            paused: r.paused,
            cursor_ms: r.cursor_ms,
            last_fire_ms: r.last_fire_ms,
            last_task: r.last_task,
            fires: r.fires,
            runs: r.runs,
            missed: r.missed,
            failures: r.failures,
            last_error: r.last_error,
            owner: r.owner,
            created_ms: r.created_ms,
            updated_ms: r.updated_ms,
        }
    }
}

impl TryFrom<StoredSchedule> for ScheduleRecord {
    type Error = String;

    fn try_from(s: StoredSchedule) -> Result<Self, String> {
        use muster_protocol::model::CatchUp;
        check_version(s.v)?;
        Ok(ScheduleRecord {
            cron: s.cron,
            tz: s.tz,
            queue: s.queue,
            task: s.task,
            catch_up: match s.catch_up {
                StoredCatchUp::Skip => CatchUp::Skip,
                StoredCatchUp::Once => CatchUp::Once,
            },
            paused: s.paused,
            cursor_ms: s.cursor_ms,
            last_fire_ms: s.last_fire_ms,
            last_task: s.last_task,
            fires: s.fires,
            runs: s.runs,
            missed: s.missed,
            failures: s.failures,
            last_error: s.last_error,
            owner: s.owner,
            created_ms: s.created_ms,
            updated_ms: s.updated_ms,
        })
    }
}

/// A retry backoff on disk.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct StoredBackoff {
    base_ms: u64,
    factor: f64,
    cap_ms: u64,
    jitter: f64,
}

/// A queue record on disk (format 1).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StoredQueue {
    v: u32,
    options: StoredOptions,
    created_ms: u64,
}

/// Queue options on disk.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct StoredOptions {
    lease_ms: u64,
    max_attempts: u32,
    retry_backoff: StoredBackoff,
    key_concurrency: u32,
    retention_ms: u64,
    max_runtime_ms: Option<u64>,
    paused: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    fair: bool,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    group_weights: BTreeMap<String, u32>,
}

impl From<QueueRecord> for StoredQueue {
    fn from(r: QueueRecord) -> Self {
        let o = r.options;
        let b = o.retry_backoff;
        StoredQueue {
            v: FORMAT,
            options: StoredOptions {
                lease_ms: o.lease_ms,
                max_attempts: o.max_attempts,
                retry_backoff: StoredBackoff {
                    base_ms: b.base_ms,
                    factor: b.factor,
                    cap_ms: b.cap_ms,
                    jitter: b.jitter,
                },
                key_concurrency: o.key_concurrency,
                retention_ms: o.retention_ms,
                max_runtime_ms: o.max_runtime_ms,
                paused: o.paused,
                fair: o.fair,
                group_weights: o.group_weights,
            },
            created_ms: r.created_ms,
        }
    }
}

impl TryFrom<StoredQueue> for QueueRecord {
    type Error = String;

    fn try_from(s: StoredQueue) -> Result<Self, String> {
        check_version(s.v)?;
        let o = s.options;
        let b = o.retry_backoff;
        Ok(QueueRecord {
            options: QueueOptions {
                lease_ms: o.lease_ms,
                max_attempts: o.max_attempts,
                retry_backoff: Backoff {
                    base_ms: b.base_ms,
                    factor: b.factor,
                    cap_ms: b.cap_ms,
                    jitter: b.jitter,
                },
                key_concurrency: o.key_concurrency,
                retention_ms: o.retention_ms,
                max_runtime_ms: o.max_runtime_ms,
                paused: o.paused,
                fair: o.fair,
                group_weights: o.group_weights,
            },
            created_ms: s.created_ms,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record with every optional field set, a timeline of three events and a lease.
    fn full() -> TaskRecord {
        let raw = |s: &str| serde_json::value::RawValue::from_string(s.to_owned()).unwrap();
        let event =
            |at_ms, event: &str, member: Option<&str>, epoch, error: Option<&str>| TimelineEvent {
                at_ms,
                event: event.to_owned(),
                member: member.map(str::to_owned),
                epoch,
                error: error.map(str::to_owned),
            };
        TaskRecord {
            queue: "q-é".into(),
            state: TaskState::Leased,
            priority: 7,
            key: Some("k".into()),
            requires: vec!["gpu".into(), "zone=eu".into()],
            limits: vec![
                TaskLimit {
                    limit: "openai".into(),
                    key: None,
                    cost: 3,
                },
                TaskLimit {
                    limit: "per-customer".into(),
                    key: Some("org-42".into()),
                    cost: 1,
                },
            ],
            group: Some("acme".into()),
            not_before_ms: Some(1_764_000_000_001),
            idempotency_key: Some("idem".into()),
            deliveries: 2,
            failures: 1,
            lease: Some(LeaseRecord {
                member: "agent-1".into(),
                epoch: 2,
                expires_ms: 1_764_000_060_000,
                granted_ms: 1_764_000_000_500,
            }),
            cancel_requested: true,
            progress: Some(raw(r#"{"step":3}"#)),
            result: Some(raw("[1,2]")),
            last_error: Some("boom".into()),
            dead_reason: Some("why".into()),
            suspension: Some(SuspensionRecord {
                info: SuspensionInfo {
                    reason: "may I merge? ✓".into(),
                    member: "agent-1".into(),
                    epoch: 2,
                    since_ms: 1_764_000_000_650,
                    timeout_at_ms: 1_764_000_600_650,
                    on_timeout: OnTimeout::Cancel,
                    children: true,
                },
                token_digest: [7; 32],
            }),
            resumed: Some(Resumed {
                data: Some(raw(r#"{"approved":true}"#)),
                by: "alice".into(),
                at_ms: 1_764_000_000_640,
                timed_out: false,
                children: vec![
                    ChildOutcome {
                        id: "01KBX0Q7R3ZJ9W5V2M8N4P6T1A".into(),
                        child_key: "doc-1".into(),
                        queue: "summarise".into(),
                        state: TaskState::Done,
                        result: Some(raw(r#"{"words":120}"#)),
                        error: None,
                        omitted: false,
                    },
                    ChildOutcome {
                        id: "01KBX0Q7R3ZJ9W5V2M8N4P6T1B".into(),
                        child_key: "doc-2".into(),
                        queue: "summarise".into(),
                        state: TaskState::Dead,
                        result: None,
                        error: Some("too long".into()),
                        omitted: true,
                    },
                ],
            }),
            parent: Some(ParentLink {
                id: ulid::Ulid::from_string("01KBX0Q7R3ZJ9W5V2M8N4P6T1C").unwrap(),
                child_key: "part-7".into(),
                depth: 3,
            }),
            traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
            tracestate: Some("vendor=abc".into()),
            created_ms: 1_764_000_000_000,
            updated_ms: 1_764_000_000_600,
            finished_ms: Some(1_764_000_000_700),
            history: vec![
                event(1_764_000_000_000, "enqueued", None, None, None),
                event(1_764_000_000_100, "leased", Some("agent-0"), Some(1), None),
                event(
                    1_764_000_000_200,
                    "nacked",
                    Some("agent-0"),
                    Some(1),
                    Some("boom"),
                ),
            ],
            enqueued_by: Some("producers".into()),
            stored_bytes: 256,
        }
    }

    /// A record as fresh from an enqueue: every optional field empty.
    fn bare() -> TaskRecord {
        TaskRecord {
            queue: "q".into(),
            state: TaskState::Ready,
            priority: 0,
            key: None,
            requires: Vec::new(),
            limits: Vec::new(),
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
            created_ms: 1_764_000_000_000,
            updated_ms: 1_764_000_000_000,
            finished_ms: None,
            history: Vec::new(),
            enqueued_by: None,
            stored_bytes: 0,
        }
    }

    fn index_of(r: &TaskRecord) -> String {
        format!(
            "{:?}",
            (
                &r.queue,
                r.state,
                r.priority,
                &r.key,
                &r.requires,
                &r.limits,
                r.not_before_ms,
                r.deliveries,
                &r.lease,
                r.finished_ms,
                &r.enqueued_by,
                r.stored_bytes
            )
        )
    }

    #[test]
    fn a_task_record_reads_back_field_for_field_and_its_index_alone() {
        for rec in [full(), bare()] {
            let bytes = encode_task(&rec);
            assert_eq!(bytes[0], 7, "a format 7 record begins with its version");
            let back = decode_task(&bytes).unwrap();
            assert_eq!(format!("{back:?}"), format!("{rec:?}"));
            let i = decode_index(&bytes).unwrap();
            let index = TaskRecord {
                queue: i.queue,
                state: i.state,
                priority: i.priority,
                key: i.key,
                requires: i.requires,
                limits: i.limits,
                not_before_ms: i.not_before_ms,
                deliveries: i.deliveries,
                lease: i.lease,
                finished_ms: i.finished_ms,
                enqueued_by: i.enqueued_by,
                stored_bytes: i.stored_bytes,
                ..bare()
            };
            assert_eq!(index_of(&index), index_of(&rec));
            assert_eq!(
                i.timeout_at_ms,
                rec.suspension.as_ref().map(|s| s.info.timeout_at_ms)
            );
            assert_eq!(
                i.parent,
                rec.parent.as_ref().map(|p| (p.id, p.child_key.clone()))
            );
        }
    }

    #[test]
    fn a_format_1_record_reads_as_the_same_task_at_three_and_a_half_times_the_size() {
        let json = r#"{"v":1,"queue":"q-é","state":"leased","priority":7,"key":"k","requires":["gpu","zone=eu"],"not_before_ms":1764000000001,"idempotency_key":"idem","deliveries":2,"failures":1,"lease":{"member":"agent-1","epoch":2,"expires_ms":1764000060000,"granted_ms":1764000000500},"cancel_requested":true,"progress":{"step":3},"result":[1,2],"last_error":"boom","dead_reason":"why","created_ms":1764000000000,"updated_ms":1764000000600,"finished_ms":1764000000700,"history":[{"at_ms":1764000000000,"event":"enqueued"},{"at_ms":1764000000100,"event":"leased","member":"agent-0","epoch":1},{"at_ms":1764000000200,"event":"nacked","member":"agent-0","epoch":1,"error":"boom"}],"enqueued_by":"producers","payload_bytes":256}"#;
        let rec = decode_task(json.as_bytes()).unwrap();
        // Format 1 had no limits and no groups.
        let full = TaskRecord {
            limits: Vec::new(),
            group: None,
            suspension: None,
            resumed: None,
            parent: None,
            traceparent: None,
            tracestate: None,
            ..full()
        };
        assert_eq!(format!("{rec:?}"), format!("{full:?}"));
        let index = decode_index(json.as_bytes()).unwrap();
        assert_eq!(
            (index.queue.as_str(), index.deliveries, index.stored_bytes),
            ("q-é", 2, 256)
        );
        let binary = encode_task(&rec);
        assert_eq!((json.len(), binary.len()), (706, 207));
    }

    #[test]
    fn format_2_to_4_records_read_as_the_same_task_never_suspended_and_no_child() {
        let rec = TaskRecord {
            limits: Vec::new(),
            group: None,
            suspension: None,
            resumed: None,
            parent: None,
            traceparent: None,
            tracestate: None,
            ..full()
        };
        // Format 4 is format 6 (and 5) without the family and fan-in parts (after the wait
        // part), format 3 is format 4 without the wait part (after the limits and
        // group), and format 2 is format 3 without the limits and group.
        let current = encode_task(&rec);
        let (_, rest): (TaskHead<'_>, &[u8]) = postcard::take_from_bytes(&current).unwrap();
        let head_len = current.len() - rest.len();
        assert_eq!(
            rest[..7],
            [0; 7],
            "no limits, no group, no suspension, not resumed, no parent, not waiting, \
             no outcomes: empty sequences, Nones and false"
        );
        let old = |v: u8, parts: &[u8]| {
            let mut old = current[..head_len].to_vec();
            old[0] = v;
            old.extend_from_slice(parts);
            old.extend_from_slice(&rest[7..]);
            old
        };
        // Formats 5 and 6 are format 7 with another version number.
        for old in [
            old(2, &[]),
            old(3, &rest[..2]),
            old(4, &rest[..4]),
            old(5, &rest[..7]),
            old(6, &rest[..7]),
        ] {
            assert_eq!(
                format!("{:?}", decode_task(&old).unwrap()),
                format!("{rec:?}")
            );
            let index = decode_index(&old).unwrap();
            assert_eq!(
                (
                    index.queue.as_str(),
                    index.limits.len(),
                    index.timeout_at_ms,
                    index.stored_bytes
                ),
                ("q-é", 0, None, 256)
            );
            assert_eq!(index.parent, None);
            // Written again, it is of the current format.
            assert_eq!(encode_task(&decode_task(&old).unwrap()), current);
        }
    }

    #[test]
    fn a_limit_record_reads_back_and_a_newer_one_is_refused() {
        let rec = LimitRecord {
            spec: LimitSpec {
                rate: Some(Rate {
                    count: 500,
                    per_ms: 60_000,
                }),
                burst: Some(50),
                concurrency: Some(4),
                per_key: true,
            },
            created_ms: 1_764_000_000_000,
            updated_ms: 1_764_000_000_500,
        };
        let json = serde_json::to_string(&rec).unwrap();
        assert_eq!(
            json,
            r#"{"v":7,"rate":{"count":500,"per_ms":60000},"burst":50,"concurrency":4,"per_key":true,"created_ms":1764000000000,"updated_ms":1764000000500}"#
        );
        assert_eq!(serde_json::from_str::<LimitRecord>(&json).unwrap(), rec);
        let newer = json.replacen(r#""v":7"#, r#""v":8"#, 1);
        let err = serde_json::from_str::<LimitRecord>(&newer).unwrap_err();
        assert!(
            err.to_string()
                .contains("record format 8 was written by a newer musterd"),
            "{err}"
        );
    }

    #[test]
    fn a_schedule_record_reads_back_and_a_newer_one_is_refused() {
        let rec = ScheduleRecord {
            cron: "*/5 * * * *".into(),
            tz: "Europe/Berlin".into(),
            queue: "reports".into(),
            task: muster_protocol::model::NewTask {
                priority: Some(3),
                ..muster_protocol::model::NewTask::new(
                    muster_protocol::ops::raw(r#"{"kind":"daily"}"#).unwrap(),
                )
            },
            catch_up: muster_protocol::model::CatchUp::Once,
            paused: false,
            cursor_ms: 1_764_000_300_000,
            last_fire_ms: Some(1_764_000_300_000),
            last_task: Some("01JHMPFNMW1HEAD8X4A1JH69RE".into()),
            fires: 12,
            runs: 1,
            missed: 3,
            failures: 2,
            last_error: Some("disk_full: the disk alarm is on".into()),
            owner: Some("ops".into()),
            created_ms: 1_764_000_000_000,
            updated_ms: 1_764_000_000_500,
        };
        let json = serde_json::to_string(&rec).unwrap();
        assert_eq!(
            json,
            r#"{"v":7,"cron":"*/5 * * * *","tz":"Europe/Berlin","queue":"reports","task":{"payload":{"kind":"daily"},"priority":3},"catch_up":"once","paused":false,"cursor_ms":1764000300000,"last_fire_ms":1764000300000,"last_task":"01JHMPFNMW1HEAD8X4A1JH69RE","fires":12,"runs":1,"missed":3,"failures":2,"last_error":"disk_full: the disk alarm is on","owner":"ops","created_ms":1764000000000,"updated_ms":1764000000500}"#
        );
        let back: ScheduleRecord = serde_json::from_str(&json).unwrap();
        assert_eq!(format!("{back:?}"), format!("{rec:?}"));
        let newer = json.replacen(r#""v":7"#, r#""v":8"#, 1);
        let err = serde_json::from_str::<ScheduleRecord>(&newer).unwrap_err();
        assert!(
            err.to_string()
                .contains("record format 8 was written by a newer musterd"),
            "{err}"
        );
    }

    #[test]
    fn a_record_that_does_not_decode_or_is_newer_is_refused_with_its_reason() {
        let mut bytes = encode_task(&full());
        for cut in [1, bytes.len() / 2, bytes.len() - 1] {
            let err = decode_task(&bytes[..cut]).unwrap_err();
            assert_eq!(
                err, "Hit the end of buffer, expected more data",
                "cut at {cut}"
            );
        }
        bytes[0] = 8;
        for err in [
            decode_task(&bytes).unwrap_err(),
            decode_index(&bytes).unwrap_err(),
        ] {
            assert_eq!(
                err,
                "record format 8 was written by a newer musterd; this one reads formats 1 to 7"
            );
        }
        bytes[0] = 1;
        assert_eq!(
            decode_task(&bytes).unwrap_err(),
            "a binary task record says format 1"
        );
        let json2 = r#"{"v":2,"queue":"q"}"#;
        assert_eq!(
            decode_index(json2.as_bytes()).unwrap_err(),
            "missing field `state` at line 1 column 19"
        );
    }

    #[test]
    fn a_queue_record_of_a_newer_format_is_refused_with_a_message_saying_so() {
        let newer = r#"{"v":8,"options":{"lease_ms":1,"max_attempts":1,"retry_backoff":{"base_ms":1,"factor":1.0,"cap_ms":1,"jitter":0.0},"key_concurrency":1,"retention_ms":1,"max_runtime_ms":null,"paused":false},"created_ms":1}"#;
        let err = serde_json::from_str::<QueueRecord>(newer).unwrap_err();
        assert!(
            err.to_string()
                .contains("record format 8 was written by a newer musterd"),
            "{err}"
        );
        let old = newer.replacen(r#""v":8"#, r#""v":1"#, 1);
        let rec: QueueRecord = serde_json::from_str(&old).unwrap();
        let again = serde_json::to_string(&rec).unwrap();
        assert_eq!(
            again,
            old.replacen(r#""v":1"#, r#""v":7"#, 1),
            "a format 1 queue record is written back as format 7, otherwise byte for byte"
        );
    }
}
