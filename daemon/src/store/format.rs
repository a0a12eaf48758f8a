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

use serde::{Deserialize, Serialize};

use muster_protocol::RawJson;
use muster_protocol::model::{Backoff, QueueOptions, TaskState, TimelineEvent};

use super::{LeaseRecord, QueueRecord, TaskRecord};

/// The format this build writes, and the newest it reads.
pub const FORMAT: u32 = 1;

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

/// A task's state on disk.
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
        }
    }
}

/// One timeline event on disk.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StoredEvent {
    at_ms: u64,
    event: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    member: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    epoch: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

impl From<TimelineEvent> for StoredEvent {
    fn from(e: TimelineEvent) -> Self {
        StoredEvent {
            at_ms: e.at_ms,
            event: e.event,
            member: e.member,
            epoch: e.epoch,
            error: e.error,
        }
    }
}

impl From<StoredEvent> for TimelineEvent {
    fn from(e: StoredEvent) -> Self {
        TimelineEvent {
            at_ms: e.at_ms,
            event: e.event,
            member: e.member,
            epoch: e.epoch,
            error: e.error,
        }
    }
}

/// A task record on disk (format 1), without its payload.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StoredTask {
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
    history: Vec<StoredEvent>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    enqueued_by: Option<String>,
    #[serde(default)]
    payload_bytes: u64,
}

impl From<TaskRecord> for StoredTask {
    fn from(r: TaskRecord) -> Self {
        StoredTask {
            v: FORMAT,
            queue: r.queue,
            state: r.state.into(),
            priority: r.priority,
            key: r.key,
            requires: r.requires,
            not_before_ms: r.not_before_ms,
            idempotency_key: r.idempotency_key,
            deliveries: r.deliveries,
            failures: r.failures,
            lease: r.lease,
            cancel_requested: r.cancel_requested,
            progress: r.progress,
            result: r.result,
            last_error: r.last_error,
            dead_reason: r.dead_reason,
            created_ms: r.created_ms,
            updated_ms: r.updated_ms,
            finished_ms: r.finished_ms,
            history: r.history.into_iter().map(Into::into).collect(),
            enqueued_by: r.enqueued_by,
            payload_bytes: r.payload_bytes,
        }
    }
}

impl TryFrom<StoredTask> for TaskRecord {
    type Error = String;

    fn try_from(s: StoredTask) -> Result<Self, String> {
        check_version(s.v)?;
        Ok(TaskRecord {
            queue: s.queue,
            state: s.state.into(),
            priority: s.priority,
            key: s.key,
            requires: s.requires,
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
            created_ms: s.created_ms,
            updated_ms: s.updated_ms,
            finished_ms: s.finished_ms,
            history: s.history.into_iter().map(Into::into).collect(),
            enqueued_by: s.enqueued_by,
            payload_bytes: s.payload_bytes,
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
            },
            created_ms: s.created_ms,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_of_a_newer_format_is_refused_with_a_message_saying_so() {
        let newer = r#"{"v":2,"options":{"lease_ms":1,"max_attempts":1,"retry_backoff":{"base_ms":1,"factor":1.0,"cap_ms":1,"jitter":0.0},"key_concurrency":1,"retention_ms":1,"max_runtime_ms":null,"paused":false},"created_ms":1}"#;
        let err = serde_json::from_str::<QueueRecord>(newer).unwrap_err();
        assert!(
            err.to_string()
                .contains("record format 2 was written by a newer musterd"),
            "{err}"
        );
        let current = newer.replacen(r#""v":2"#, r#""v":1"#, 1);
        let rec: QueueRecord = serde_json::from_str(&current).unwrap();
        let again = serde_json::to_string(&rec).unwrap();
        assert_eq!(
            again, current,
            "format 1 reads and writes back byte for byte"
        );
    }
}
