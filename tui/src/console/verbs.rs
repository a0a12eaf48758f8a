//! The operator's verbs: what a verb is ([`Verb`]) and the question its confirmation
//! asks, the table of the verb a key names on each screen (`App::verb`) with the checks
//! that refuse one, and the drafts written in `$EDITOR` (`a`, `o`, `e`) that become
//! verbs.
//!
//! Nothing here runs a verb: a confirmed verb is an [`Effect::Run`] for the loop.

use muster_protocol::limits::MAX_PRIORITY;
use muster_protocol::model::{QueueOptions, QueuePatch, TaskState, TaskSummary};
use muster_protocol::ops::WatchUpdate;

use super::app::{App, Effect, Level, Mode, Screen};
use super::rows::Row;

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
}

/// What the editor starts with for a new task's payload.
pub const NEW_PAYLOAD: &str = "{}\n";

impl Draft {
    /// The text the editor opens with.
    pub fn text(&self) -> String {
        match self {
            Draft::Requeue(r) => r.payload.clone(),
            Draft::Enqueue { .. } => NEW_PAYLOAD.to_owned(),
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
        }
    }
}

/// JSON laid out for editing; text that is not JSON stays as it is.
fn pretty_json(text: &str) -> String {
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

impl App {
    /// The verb a key names on the current screen, if it applies to what is selected:
    /// one arm per key and screen (a table), each a step of its own.
    pub(super) fn verb(&mut self, key: char) -> Option<Verb> {
        let screen = self.page().screen.clone();
        let verb = match (key, &screen) {
            ('p', Screen::Queues | Screen::Queue { .. }) => {
                let q = self.selected_queue()?;
                if q.options.paused {
                    Verb::Resume(q.name)
                } else {
                    Verb::Pause(q.name)
                }
            }
            ('R', Screen::Queues | Screen::Queue { .. }) => {
                let q = self.selected_queue()?;
                self.all_dead(q.name, q.counts.dead)?
            }
            (
                'r' | 'x',
                Screen::Queue {
                    state: TaskState::Dead,
                    ..
                }
                | Screen::Dead,
            ) => Verb::Dead(dead_action(key), self.marked_dead()?),
            ('r' | 'x', Screen::Task { .. }) => Verb::Dead(dead_action(key), self.shown_dead()?),
            ('c', Screen::Queue { .. } | Screen::Member { .. } | Screen::Found { .. }) => {
                let t = self.selected_task()?;
                self.cancel(t.state, t.id)?
            }
            ('c', Screen::Task { .. }) => {
                let (state, id) = self.shown_state()?;
                self.cancel(state, id)?
            }
            ('v', Screen::Queue { .. } | Screen::Member { .. } | Screen::Found { .. }) => {
                let t = self.selected_task()?;
                if t.state != TaskState::Leased {
                    return self.refuse("only a leased task has a lease to revoke");
                }
                Verb::Revoke(t.id)
            }
            ('v', Screen::Task { .. }) => Verb::Revoke(self.shown_task(TaskState::Leased)?.1),
            ('d', Screen::Members) => match self.selected_row()? {
                Row::Member(m) => Verb::Drain(m.name.clone()),
                _ => return None,
            },
            ('d', Screen::Member { name }) => Verb::Drain(name.clone()),
            ('u', Screen::Members | Screen::Member { .. }) => self.undrain()?,
            (
                '+' | '-' | 'N',
                Screen::Queue { .. } | Screen::Found { .. } | Screen::Task { .. },
            ) => self.reprioritize(key)?,
            ('P', Screen::Queues | Screen::Queue { .. }) => self.purge()?,
            ('D', Screen::Queues) => {
                let q = self.selected_queue()?;
                let n = TaskState::ALL.iter().map(|s| q.counts.get(*s)).sum();
                Verb::DeleteQueue(q.name, n)
            }
            _ => return None,
        };
        Some(verb)
    }

    /// Says in the footer why a key names no verb here.
    fn refuse(&mut self, why: &str) -> Option<Verb> {
        self.message = Some((Level::Error, why.to_owned()));
        None
    }

    /// The shown task, to redrive or discard, if it is dead.
    fn shown_dead(&mut self) -> Option<DeadTasks> {
        let (queue, id) = self.shown_task(TaskState::Dead)?;
        Some(DeadTasks {
            queue,
            ids: vec![id],
            all: false,
            count: 1,
        })
    }

    /// Cancel the task `id`, if it is in a `state` that can be cancelled.
    fn cancel(&mut self, state: TaskState, id: String) -> Option<Verb> {
        if !is_live(state) {
            return self.refuse("only ready, scheduled and leased tasks can be cancelled");
        }
        Some(Verb::Cancel(id))
    }

    /// Undrain the member shown or selected, if it is draining.
    fn undrain(&mut self) -> Option<Verb> {
        let (name, draining) = match (&self.data, self.selected_row()) {
            (Some(WatchUpdate::Member { member, .. }), _) => (member.name.clone(), member.draining),
            (_, Some(Row::Member(m))) => (m.name.clone(), m.draining),
            _ => return None,
        };
        if !draining {
            return self.refuse(&format!("member {name} is not draining"));
        }
        Some(Verb::Undrain(name))
    }

    /// `+`, `-` or `N` on a waiting task: a priority one higher or lower (within
    /// 0..=[`MAX_PRIORITY`]), or a scheduled task run now.
    fn reprioritize(&mut self, key: char) -> Option<Verb> {
        let (id, state, priority) = self.waiting_task()?;
        if !matches!(state, TaskState::Ready | TaskState::Scheduled) {
            return self.refuse("only a ready or scheduled task gets a new priority or runs now");
        }
        let verb = match key {
            'N' if state != TaskState::Scheduled => {
                return self.refuse("only a scheduled task waits to run");
            }
            'N' => Verb::RunNow(id),
            '+' if priority >= MAX_PRIORITY => {
                return self.refuse(&format!(
                    "task {id} has priority {MAX_PRIORITY}, the highest"
                ));
            }
            '-' if priority == 0 => {
                return self.refuse(&format!("task {id} has priority 0, the lowest"));
            }
            '+' => Verb::Priority {
                id,
                from: priority,
                to: priority + 1,
            },
            _ => Verb::Priority {
                id,
                from: priority,
                to: priority - 1,
            },
        };
        Some(verb)
    }

    /// Purge the selected queue's ready and scheduled tasks, if it has any.
    fn purge(&mut self) -> Option<Verb> {
        let q = self.selected_queue()?;
        let n = q.counts.ready + q.counts.scheduled;
        if n == 0 {
            return self.refuse(&format!("queue {} has no ready or scheduled tasks", q.name));
        }
        Some(Verb::Purge(q.name, n))
    }

    /// Redrive every dead task of a queue, `count` of them as its counts say.
    fn all_dead(&mut self, queue: String, count: u64) -> Option<Verb> {
        if count == 0 {
            return self.refuse(&format!("queue {queue} has no dead tasks"));
        }
        let tasks = DeadTasks {
            queue,
            ids: Vec::new(),
            all: true,
            count,
        };
        Some(Verb::Dead(DeadAction::Redrive, tasks))
    }

    /// The marked dead tasks (of one queue), or the selected one.
    fn marked_dead(&mut self) -> Option<DeadTasks> {
        if let Some(Row::Group(g)) = self.selected_row() {
            let [queue] = g.queues.as_slice() else {
                self.refuse(
                    "the error's tasks are in several queues: open it (enter) and mark one queue's",
                );
                return None;
            };
            return Some(DeadTasks {
                queue: queue.clone(),
                count: g.ids.len() as u64,
                ids: g.ids,
                all: false,
            });
        }
        let current = self.selected_task()?;
        let marked = &self.page().marked;
        let picked: Vec<TaskSummary> = if marked.is_empty() {
            vec![current]
        } else {
            self.rows()
                .into_iter()
                .filter_map(|r| match r {
                    Row::Task(t) if marked.contains(&t.id) => Some(t.clone()),
                    _ => None,
                })
                .collect()
        };
        let queue = picked.first()?.queue.clone();
        if picked.iter().any(|t| t.queue != queue) {
            self.refuse("marked tasks are in several queues: mark one queue's at a time");
            return None;
        }
        let ids: Vec<String> = picked.into_iter().map(|t| t.id).collect();
        Some(DeadTasks {
            queue,
            count: ids.len() as u64,
            ids,
            all: false,
        })
    }

    /// The task `+`, `-` and `N` act on: the one shown, or the selected row's; its id,
    /// state and priority.
    fn waiting_task(&self) -> Option<(String, TaskState, u8)> {
        match &self.data {
            Some(WatchUpdate::Task { task }) => Some((task.id.clone(), task.state, task.priority)),
            _ => self.selected_task().map(|t| (t.id, t.state, t.priority)),
        }
    }

    fn shown_state(&self) -> Option<(TaskState, String)> {
        match &self.data {
            Some(WatchUpdate::Task { task }) => Some((task.state, task.id.clone())),
            _ => None,
        }
    }

    /// The shown task's queue and id, if it is in `state`.
    fn shown_task(&mut self, state: TaskState) -> Option<(String, String)> {
        match &self.data {
            Some(WatchUpdate::Task { task }) if task.state == state => {
                Some((task.queue.clone(), task.id.clone()))
            }
            Some(WatchUpdate::Task { .. }) => {
                self.refuse(&format!("the task is not {}", state.as_str()));
                None
            }
            _ => None,
        }
    }

    /// `a` on the queues or a queue's screen: write a new task's payload for the
    /// (selected) queue; `o`: edit its options.
    pub(super) fn draft_for_queue(&mut self, options: bool) -> Option<Effect> {
        if !matches!(self.page().screen, Screen::Queues | Screen::Queue { .. }) {
            return None;
        }
        let q = self.selected_queue()?;
        Some(Effect::Edit(if options {
            Draft::Options {
                queue: q.name,
                options: q.options,
            }
        } else {
            Draft::Enqueue { queue: q.name }
        }))
    }

    /// `e` on a dead task's screen: edit its payload, to enqueue it again.
    pub(super) fn edit(&mut self) -> Option<Effect> {
        let Some(WatchUpdate::Task { task }) = &self.data else {
            if matches!(self.page().screen, Screen::Task { .. }) {
                self.refuse("the task has not arrived yet; try again in a moment");
            }
            return None;
        };
        if task.state != TaskState::Dead {
            self.refuse("only a dead task is edited and enqueued again");
            return None;
        }
        Some(Effect::Edit(Draft::Requeue(Requeue {
            id: task.id.clone(),
            queue: task.queue.clone(),
            payload: pretty_json(task.payload.get()),
            priority: task.priority,
            key: task.key.clone(),
            requires: task.requires.clone(),
        })))
    }

    /// The editor closed with `edited` (or failed): what was written asks for the
    /// confirm of its verb; what is unchanged, empty or invalid does nothing and the
    /// footer says why.
    pub fn on_edited(&mut self, draft: Draft, edited: Result<String, String>) {
        let text = match edited {
            Ok(text) => text,
            Err(e) => return self.say(Err(format!("editing: {e}"))),
        };
        match draft {
            Draft::Requeue(requeue) => self.edited_requeue(requeue, &text),
            Draft::Enqueue { queue } => {
                let payload = text.trim();
                if payload.is_empty() {
                    return self.say(Err("the payload is empty: nothing done".into()));
                }
                if let Err(e) = serde_json::from_str::<serde_json::Value>(payload) {
                    return self.say(Err(format!("the payload is not JSON ({e}): nothing done")));
                }
                self.mode = Mode::Confirm(Verb::Enqueue {
                    queue,
                    payload: payload.to_owned(),
                });
            }
            Draft::Options { queue, options } => {
                let edited = match serde_json::from_str::<QueuePatch>(&text) {
                    Ok(edited) => edited,
                    Err(e) => {
                        return self.say(Err(format!(
                            "the edited options are not valid ({e}): nothing done"
                        )));
                    }
                };
                let (patch, changes) = queue_changes(&options, &edited);
                if changes.is_empty() {
                    return self.say(Ok("options unchanged: nothing done".into()));
                }
                self.mode = Mode::Confirm(Verb::UpdateQueue(QueueChange {
                    queue,
                    patch,
                    changes,
                }));
            }
        }
    }

    fn edited_requeue(&mut self, mut requeue: Requeue, text: &str) {
        let text = text.trim();
        if text == requeue.payload.trim() {
            return self.say(Ok("payload unchanged: nothing done".into()));
        }
        if let Err(e) = serde_json::from_str::<serde_json::Value>(text) {
            return self.say(Err(format!(
                "the edited payload is not JSON ({e}): nothing done"
            )));
        }
        requeue.payload = text.to_owned();
        self.mode = Mode::Confirm(Verb::Requeue(requeue));
    }
}

/// Whether a task in `state` can still be cancelled: it waits or is leased.
pub(super) fn is_live(state: TaskState) -> bool {
    matches!(
        state,
        TaskState::Ready | TaskState::Scheduled | TaskState::Leased
    )
}

/// The dead-task verb of a key: `r` redrives, `x` discards.
fn dead_action(key: char) -> DeadAction {
    if key == 'r' {
        DeadAction::Redrive
    } else {
        DeadAction::Discard
    }
}
