//! The operator's verbs on the console's state: the table of the verb a key names on
//! each screen (`App::verb`) with the checks that refuse one, and the drafts written in
//! `$EDITOR` (`a`, `o`, `e`) turned into verbs. What a verb is lives in `changes.rs`.
//!
//! Nothing here runs a verb: a confirmed verb is an [`Effect::Run`] for the loop.

use muster_protocol::limits::MAX_PRIORITY;
use muster_protocol::model::{QueuePatch, TaskState, TaskSummary};
use muster_protocol::ops::WatchUpdate;

use super::app::{App, Effect, Level, Mode, Screen};
use super::changes::{
    DeadAction, DeadTasks, Draft, QueueChange, Requeue, Verb, pretty_json, queue_changes,
};
use super::rows::Row;

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
            ('p' | 'N' | 'D', Screen::Schedules) => {
                let Some(Row::Schedule(s)) = self.selected_row() else {
                    return None;
                };
                let name = s.name.clone();
                match key {
                    'p' if s.paused => Verb::ResumeSchedule(name),
                    'p' => Verb::PauseSchedule(name),
                    'N' => Verb::RunSchedule {
                        name,
                        queue: s.queue.clone(),
                    },
                    _ => Verb::DeleteSchedule(name),
                }
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
            return self
                .refuse("only ready, scheduled, leased and suspended tasks can be cancelled");
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
            Some(WatchUpdate::Task { task, .. }) => {
                Some((task.id.clone(), task.state, task.priority))
            }
            _ => self.selected_task().map(|t| (t.id, t.state, t.priority)),
        }
    }

    fn shown_state(&self) -> Option<(TaskState, String)> {
        match &self.data {
            Some(WatchUpdate::Task { task, .. }) => Some((task.state, task.id.clone())),
            _ => None,
        }
    }

    /// The shown task's queue and id, if it is in `state`.
    fn shown_task(&mut self, state: TaskState) -> Option<(String, String)> {
        match &self.data {
            Some(WatchUpdate::Task { task, .. }) if task.state == state => {
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

    /// `A` on a suspended task (shown, or selected in a list): write the data it is
    /// resumed with, to approve it.
    pub(super) fn approve(&mut self) -> Option<Effect> {
        let (id, state) = match (&self.data, &self.page().screen) {
            (Some(WatchUpdate::Task { task, .. }), Screen::Task { .. }) => {
                (task.id.clone(), task.state)
            }
            (_, Screen::Queue { .. } | Screen::Found { .. } | Screen::Member { .. }) => {
                let t = self.selected_task()?;
                (t.id, t.state)
            }
            _ => return None,
        };
        if state != TaskState::Suspended {
            self.refuse("only a suspended task is approved (resumed)");
            return None;
        }
        Some(Effect::Edit(Draft::Resume { id }))
    }

    /// `e` on a dead task's screen: edit its payload, to enqueue it again.
    pub(super) fn edit(&mut self) -> Option<Effect> {
        let Some(WatchUpdate::Task { task, .. }) = &self.data else {
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
            Draft::Resume { id } => {
                let data = text.trim();
                if !data.is_empty()
                    && let Err(e) = serde_json::from_str::<serde_json::Value>(data)
                {
                    return self.say(Err(format!("the data is not JSON ({e}): nothing done")));
                }
                self.mode = Mode::Confirm(Verb::ResumeTask {
                    id,
                    data: (!data.is_empty()).then(|| data.to_owned()),
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

/// Whether a task in `state` can still be cancelled: it waits, is leased or suspended
/// (a suspended task cancelled is rejected).
pub(super) fn is_live(state: TaskState) -> bool {
    !state.is_finished()
}

/// The dead-task verb of a key: `r` redrives, `x` discards.
fn dead_action(key: char) -> DeadAction {
    if key == 'r' {
        DeadAction::Redrive
    } else {
        DeadAction::Discard
    }
}
