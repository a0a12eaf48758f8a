//! What an operator asks to change, as data: a verb ([`Verb`]) and the question its
//! confirmation asks, the dead tasks a verb names, a queue's options as edited, and the
//! drafts written in `$EDITOR` that become verbs. Nothing here reads the console's
//! state (`App`, in `app.rs`) or runs a verb.

use muster_protocol::model::{QueueOptions, QueuePatch};

/// What to do with dead tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadAction {
    /// Make them ready again.
    Redrive,
    /// Remove them for good.
    Discard,
}

/// Dead tasks of one queue a verb names: some ids, or all of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadTasks {
    /// The queue.
    pub queue: String,
    /// The tasks; empty with `all`.
    pub ids: Vec<String>,
    /// Every dead task of the queue.
    pub all: bool,
    /// How many tasks, as shown in the confirm dialog.
    pub count: u64,
}

/// A change the operator asked for.
#[derive(Debug, Clone, PartialEq)]
pub enum Verb {
    /// Redrive or discard dead tasks.
    Dead(DeadAction, DeadTasks),
    /// Cancel a task.
    Cancel(String),
    /// Revoke a task's lease.
    Revoke(String),
    /// Pause a queue.
    Pause(String),
    /// Resume a queue.
    Resume(String),
    /// Drain a member.
    Drain(String),
    /// Remove a queue's ready and scheduled tasks (this many, as last shown).
    Purge(String, u64),
    /// Delete a queue and its tasks (this many, as last shown).
    DeleteQueue(String, u64),
    /// Enqueue an edited copy of a dead task, then discard the dead one.
    Requeue(Requeue),
    /// Enqueue a new task with a payload written in the editor.
    Enqueue {
        /// The queue.
        queue: String,
        /// The payload (checked to be JSON).
        payload: String,
    },
    /// Give a ready or scheduled task another priority.
    Priority {
        /// The task.
        id: String,
        /// Its priority, as last shown.
        from: u8,
        /// The new one.
        to: u8,
    },
    /// Make a scheduled task ready now.
    RunNow(String),
    /// End a member's drain.
    Undrain(String),
    /// Change a queue's options as edited.
    UpdateQueue(QueueChange),
    /// Resume a suspended task by its id (approve it), with the data written in the
    /// editor (checked to be JSON), if any.
    ResumeTask {
        /// The task.
        id: String,
        /// What its next holder sees as the resume's data.
        data: Option<String>,
    },
    /// Pause a schedule: it does not fire until resumed.
    PauseSchedule(String),
    /// Resume a paused schedule: it fires from its next time after now.
    ResumeSchedule(String),
    /// Enqueue a schedule's task now, once.
    RunSchedule {
        /// The schedule.
        name: String,
        /// Its queue, as last shown.
        queue: String,
    },
    /// Delete a schedule (the tasks it enqueued stay).
    DeleteSchedule(String),
}

/// A queue's options as the operator edited them: only what differs from the options
/// shown when the editor opened.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueChange {
    /// The queue.
    pub queue: String,
    /// The options that change.
    pub patch: QueuePatch,
    /// Each change as `name old → new`, for the confirm dialog and the footer.
    pub changes: Vec<String>,
}

/// Text the operator writes in `$EDITOR`, and what it becomes.
#[derive(Debug, Clone, PartialEq)]
pub enum Draft {
    /// An edited copy of a dead task, enqueued in its place.
    Requeue(Requeue),
    /// The payload of a new task for this queue.
    Enqueue {
        /// The queue.
        queue: String,
    },
    /// A queue's options, as shown when the editor opened.
    Options {
        /// The queue.
        queue: String,
        /// Its options then.
        options: QueueOptions,
    },
    /// The data a suspended task is resumed with (approved).
    Resume {
        /// The task.
        id: String,
    },
}

/// What the editor starts with for a resume's data: an approval; emptied, the task is
/// resumed with no data.
pub const APPROVAL: &str = "{\"approved\": true}\n";

/// What the editor starts with for a new task's payload.
pub const NEW_PAYLOAD: &str = "{}\n";

impl Draft {
    /// The text the editor opens with.
    pub fn text(&self) -> String {
        match self {
            Draft::Requeue(r) => r.payload.clone(),
            Draft::Enqueue { .. } => NEW_PAYLOAD.to_owned(),
            Draft::Resume { .. } => APPROVAL.to_owned(),
            Draft::Options { options, .. } => {
                let mut text =
                    serde_json::to_string_pretty(options).expect("queue options serialize to JSON");
                text.push('\n');
                text
            }
        }
    }
}

/// A dead task to enqueue again with an edited payload: what the new task keeps of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requeue {
    /// The dead task, discarded once the copy is enqueued.
    pub id: String,
    /// Its queue, where the copy goes.
    pub queue: String,
    /// The edited payload (checked to be JSON).
    pub payload: String,
    /// Its priority, key and required labels, which the copy keeps.
    pub priority: u8,
    /// Its key.
    pub key: Option<String>,
    /// Its required labels.
    pub requires: Vec<String>,
}

impl Verb {
    /// The question of the confirm dialog.
    pub fn question(&self) -> String {
        fn tasks(n: u64) -> String {
            if n == 1 {
                "1 dead task".into()
            } else {
                format!("{n} dead tasks")
            }
        }
        match self {
            Verb::Dead(action, t) => {
                let what = match t.ids.as_slice() {
                    [one] if !t.all => format!("dead task {one}"),
                    _ => tasks(t.count),
                };
                match action {
                    DeadAction::Redrive => format!("Redrive {what} of {}?", t.queue),
                    DeadAction::Discard => format!("Discard {what} of {} for good?", t.queue),
                }
            }
            Verb::Cancel(id) => format!("Cancel task {id}?"),
            Verb::ResumeTask { id, data } => match data {
                Some(data) => format!("Resume task {id} with {data}?"),
                None => format!("Resume task {id} with no data?"),
            },
            Verb::Revoke(id) => format!("Revoke the lease of task {id}?"),
            Verb::Pause(q) => format!("Pause queue {q}?"),
            Verb::Resume(q) => format!("Resume queue {q}?"),
            Verb::Drain(m) => {
                format!("Drain member {m}? It finishes what it holds, gets nothing new.")
            }
            Verb::Purge(q, n) => {
                format!("Purge queue {q}: remove its {n} ready and scheduled tasks for good?")
            }
            Verb::DeleteQueue(q, n) => {
                format!("Delete queue {q} and its {n} tasks for good?")
            }
            Verb::Requeue(r) => format!(
                "Enqueue the edited payload on queue {} and discard dead task {}?",
                r.queue, r.id
            ),
            Verb::Enqueue { queue, payload } => format!(
                "Enqueue the edited payload ({} bytes) on queue {queue}?",
                payload.len()
            ),
            Verb::Priority { id, from, to } => format!("Task {id}: priority {from} → {to}?"),
            Verb::RunNow(id) => format!("Run scheduled task {id} now?"),
            Verb::Undrain(m) => format!("Undrain member {m}? It gets work again."),
            Verb::UpdateQueue(c) => {
                format!("Update queue {}: {}?", c.queue, c.changes.join(", "))
            }
            Verb::PauseSchedule(name) => {
                format!("Pause schedule {name}? It does not fire until resumed.")
            }
            Verb::ResumeSchedule(name) => {
                format!("Resume schedule {name}? It fires from its next time after now.")
            }
            Verb::RunSchedule { name, queue } => {
                format!("Run schedule {name} now: enqueue its task on queue {queue} once?")
            }
            Verb::DeleteSchedule(name) => {
                format!("Delete schedule {name}? The tasks it enqueued stay.")
            }
        }
    }
}

/// JSON laid out for editing; text that is not JSON stays as it is.
pub(super) fn pretty_json(text: &str) -> String {
    serde_json::from_str::<serde_json::Value>(text)
        .and_then(|v| serde_json::to_string_pretty(&v))
        .unwrap_or_else(|_| text.to_owned())
}

/// What an edited set of queue options changes: the patch of the options that differ
/// from `shown`, and each change as `name old → new`. An option left out keeps its
/// value, but for `max_runtime_ms`: the editor shows it (null when there is none), and
/// null, 0 or left out means no bound.
pub fn queue_changes(shown: &QueueOptions, edited: &QueuePatch) -> (QueuePatch, Vec<String>) {
    fn ms(v: Option<u64>) -> String {
        v.map_or("none".into(), |v| v.to_string())
    }
    let mut patch = QueuePatch::default();
    let mut changes = Vec::new();
    if let Some(v) = edited.lease_ms.filter(|v| *v != shown.lease_ms) {
        changes.push(format!("lease_ms {} → {v}", shown.lease_ms));
        patch.lease_ms = Some(v);
    }
    if let Some(v) = edited.max_attempts.filter(|v| *v != shown.max_attempts) {
        changes.push(format!("max_attempts {} → {v}", shown.max_attempts));
        patch.max_attempts = Some(v);
    }
    if let Some(v) = edited.retry_backoff.filter(|v| *v != shown.retry_backoff) {
        let b = |b: &muster_protocol::model::Backoff| {
            format!("{}ms×{}≤{}ms±{}", b.base_ms, b.factor, b.cap_ms, b.jitter)
        };
        changes.push(format!(
            "retry_backoff {} → {}",
            b(&shown.retry_backoff),
            b(&v)
        ));
        patch.retry_backoff = Some(v);
    }
    if let Some(v) = edited
        .key_concurrency
        .filter(|v| *v != shown.key_concurrency)
    {
        changes.push(format!("key_concurrency {} → {v}", shown.key_concurrency));
        patch.key_concurrency = Some(v);
    }
    if let Some(v) = edited.retention_ms.filter(|v| *v != shown.retention_ms) {
        changes.push(format!("retention_ms {} → {v}", shown.retention_ms));
        patch.retention_ms = Some(v);
    }
    let runtime = edited.max_runtime_ms.filter(|v| *v > 0);
    if runtime != shown.max_runtime_ms {
        changes.push(format!(
            "max_runtime_ms {} → {}",
            ms(shown.max_runtime_ms),
            ms(runtime)
        ));
        patch.max_runtime_ms = Some(runtime.unwrap_or(0));
    }
    if let Some(v) = edited.paused.filter(|v| *v != shown.paused) {
        changes.push(format!("paused {} → {v}", shown.paused));
        patch.paused = Some(v);
    }
    (patch, changes)
}
