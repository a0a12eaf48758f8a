//! Watches: the operator's screens, pushed when they change (PROTOCOL.md §5.32).
//!
//! A connection watches one [`View`] at a time. The `watch` reply carries the screen at
//! once; afterwards the engine pushes it again when something changed, at most once per
//! [`WATCH_INTERVAL`]. "Something changed" is the engine's generation: every committed
//! change and every member event moves it, so an idle daemon sends nothing. The limits
//! screen is the exception: its buckets refill with time, which moves no generation, so
//! it is pushed every interval while watched. Building a screen costs a page, never a
//! scan: counts come from the in-memory indexes, rows from a range of one state's ids
//! (at most [`MAX_WATCH_ROWS`] records read), limits from one pass over the buckets.
//!
//! A watch has at most one push waiting for the connection's writer: its flag is set
//! when a push is queued and cleared once the writer has encoded the frame. A console
//! that stops reading (a suspended terminal) therefore holds at most two screens in the
//! daemon (one encoded in the stalled writer's buffer, one queued), not one per second.

use std::ops::Bound;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use ulid::Ulid;

use muster_protocol::limits::{MAX_WATCH_ROWS, MAX_WATCHES, WATCH_INTERVAL, cut_to};
use muster_protocol::model::{TaskState, TaskSummary};
use muster_protocol::ops::{Empty, View, Watch, WatchReply, WatchUpdate};
use muster_protocol::{ErrorCode, Push};

use super::listing::fill;
use super::ops::{bad, parse_id};
use super::{Engine, Failure, Now, OpResult, Sink, Waiter, client};
use crate::auth::Principal;
use crate::store::StoreError;

/// Rows of a page when the view does not say.
const DEFAULT_ROWS: u32 = 100;

/// Bytes of a task's last error a screen's row carries (the task screen has it whole):
/// a page of 500 rows then stays well inside a frame.
pub const ROW_ERROR_BYTES: usize = 512;

/// A task's row on a screen: its summary with the last error cut to [`ROW_ERROR_BYTES`].
fn row(id: Ulid, rec: &crate::store::TaskRecord) -> TaskSummary {
    let mut t = super::ops::summary(id, rec);
    if let Some(e) = t.last_error.as_mut()
        && cut_to(e, ROW_ERROR_BYTES)
    {
        e.push('…');
    }
    debug_assert!(
        t.last_error
            .as_ref()
            .is_none_or(|e| e.len() <= ROW_ERROR_BYTES + '…'.len_utf8()),
        "task {id}: a row's error is cut to {ROW_ERROR_BYTES} bytes"
    );
    t
}

/// One connection's watch.
pub(super) struct Watcher<S> {
    sink: S,
    view: View,
    principal: Option<Principal>,
    tag: u64,
    /// The generation last sent.
    seen: u64,
    /// Monotonic time it was last sent.
    sent_ms: u64,
    /// Set while a push of this watch waits for the connection's writer.
    queued: Arc<AtomicBool>,
}

impl<S> Watcher<S> {
    /// Changed since last sent, the interval passed, and nothing waiting to be written.
    fn due(&self, generation: u64, now: Now) -> bool {
        self.changed(generation)
            && now.mono_ms >= self.sent_ms + WATCH_INTERVAL.as_millis() as u64
            && !self.queued.load(Ordering::Acquire)
    }

    /// Whether the screen may have changed since last sent: the generation moved, or it
    /// shows limits, whose buckets refill with time alone.
    fn changed(&self, generation: u64) -> bool {
        self.seen != generation || matches!(self.view, View::Limits { .. })
    }
}

fn rows(limit: Option<u32>) -> OpResult<usize> {
    let limit = limit.unwrap_or(DEFAULT_ROWS);
    if limit == 0 || limit > MAX_WATCH_ROWS {
        return Err(bad(format!(
            "limit {limit} is outside 1..={MAX_WATCH_ROWS}"
        )));
    }
    Ok(limit as usize)
}

/// Splits `items` (fetched with one extra) into a page and the cursor of the next one.
fn after(cursor: Option<&String>) -> Bound<&str> {
    cursor.map_or(Bound::Unbounded, |c| Bound::Excluded(c.as_str()))
}

fn covers(p: Option<&Principal>, queue: &str) -> bool {
    p.is_none_or(|p| p.covers(queue))
}

impl<W: Waiter> Engine<W> {
    pub(super) fn watch(&mut self, r: Watch, waiter: &W, now: Now) -> OpResult<WatchReply> {
        if !self.waiting.watches.contains_key(&waiter.connection())
            && self.waiting.watches.len() >= MAX_WATCHES
        {
            return Err(client(
                ErrorCode::Limit,
                format!("{MAX_WATCHES} watches are open, the most the daemon keeps"),
            ));
        }
        let principal = waiter.principal().cloned();
        let update = self.screen(&r.view, principal.as_ref(), now)?;
        self.waiting.watches.insert(
            waiter.connection(),
            Watcher {
                sink: waiter.sink(),
                view: r.view,
                principal,
                tag: r.tag,
                seen: self.generation,
                sent_ms: now.mono_ms,
                queued: Arc::new(AtomicBool::new(false)),
            },
        );
        debug_assert!(
            self.waiting.watches.len() <= MAX_WATCHES,
            "the daemon keeps at most {MAX_WATCHES} watches"
        );
        Ok(WatchReply {
            tag: r.tag,
            update,
            disk_alarm: self.budget.disk_alarm,
        })
    }

    pub(super) fn unwatch(&mut self, waiter: &W) -> Empty {
        self.waiting.watches.remove(&waiter.connection());
        Empty {}
    }

    /// Monotonic time the next watch push is due, if one is waiting for its interval.
    /// A watch whose last push is still queued is left out: the dispatcher's idle wake-up
    /// serves it once the writer caught up.
    pub(super) fn next_watch(&self) -> Option<u64> {
        self.waiting
            .watches
            .values()
            .filter(|w| w.changed(self.generation) && !w.queued.load(Ordering::Acquire))
            .map(|w| w.sent_ms + WATCH_INTERVAL.as_millis() as u64)
            .min()
    }

    /// Pushes every watched screen that changed and whose interval has passed. A screen
    /// whose queue or task is gone is pushed as `gone` once, and its watch ends.
    pub(super) fn serve_watches(&mut self, now: Now) -> Result<(), StoreError> {
        self.waiting.watches.retain(|_, w| !w.sink.is_closed());
        let due: Vec<u64> = self
            .waiting
            .watches
            .iter()
            .filter(|(_, w)| w.due(self.generation, now))
            .map(|(&c, _)| c)
            .collect();
        for connection in due {
            let Some(w) = self.waiting.watches.get(&connection) else {
                continue;
            };
            debug_assert!(
                !w.queued.load(Ordering::Acquire),
                "a watch is served only with no push of it waiting to be written"
            );
            let update = match self.screen(&w.view, w.principal.as_ref(), now) {
                Ok(update) => update,
                Err(Failure::Client(error)) => WatchUpdate::Gone { error },
                Err(Failure::Store(e)) => return Err(e),
            };
            let gone = matches!(update, WatchUpdate::Gone { .. });
            let push = Push::Watch(Box::new(WatchReply {
                tag: w.tag,
                update,
                disk_alarm: self.budget.disk_alarm,
            }));
            w.queued.store(true, Ordering::Release);
            self.outbox
                .watch_pushes
                .push((w.sink.clone(), push, Arc::clone(&w.queued)));
            if gone {
                self.waiting.watches.remove(&connection);
            } else if let Some(w) = self.waiting.watches.get_mut(&connection) {
                w.seen = self.generation;
                w.sent_ms = now.mono_ms;
            }
        }
        Ok(())
    }

    /// Builds one screen as `principal` may see it, at `now`. A watch of one queue or
    /// task was authorized when it was asked for (tokens and a task's queue never
    /// change), so only the lists spanning queues filter here; limits span queues and
    /// every token may read them, so they are not filtered.
    fn screen(
        &self,
        view: &View,
        principal: Option<&Principal>,
        now: Now,
    ) -> OpResult<WatchUpdate> {
        match view {
            View::Queues { after: a, limit } => {
                self.queues_screen(a.as_ref(), rows(*limit)?, principal)
            }
            View::Tasks {
                queue,
                state,
                after: a,
                limit,
            } => self.tasks_screen(queue, *state, a.as_deref(), rows(*limit)?),
            View::Dead { after: a, limit } => {
                self.dead_screen(a.as_deref(), rows(*limit)?, principal)
            }
            View::Task { task } => {
                let id = parse_id(task)?;
                let (tree, tree_truncated) = self.family_tree(id);
                Ok(WatchUpdate::Task {
                    task: self.task_info(id)?,
                    output: self.output_tail(id, muster_protocol::limits::WATCH_OUTPUT_BYTES)?,
                    tree,
                    tree_truncated,
                })
            }
            View::Member { member } => self.member_screen(member),
            View::Members { after: a, limit } => self.members_screen(a.as_ref(), rows(*limit)?),
            View::Limits { after: a, limit } => {
                Ok(self.limits_screen(a.as_deref(), rows(*limit)?, now))
            }
            View::Schedules { after: a, limit } => {
                let (schedules, next) = self.schedules.page(a.as_deref(), rows(*limit)?, principal);
                Ok(WatchUpdate::Schedules { schedules, next })
            }
        }
    }

    /// A page of limits with their state at `now`, after the cursor (a limit name).
    fn limits_screen(&self, cursor: Option<&str>, limit: usize, now: Now) -> WatchUpdate {
        let names = self.index.limits.names_after(cursor, limit + 1);
        let next = (names.len() > limit).then(|| names[limit - 1].to_string());
        let limits = self
            .index
            .limits
            .infos(names.iter().take(limit).map(|n| &**n), now.wall_ms);
        debug_assert!(
            limits.len() <= limit,
            "a limits screen holds at most one page"
        );
        WatchUpdate::Limits { limits, next }
    }

    /// A page of the queues `principal` covers, after the cursor.
    fn queues_screen(
        &self,
        cursor: Option<&String>,
        limit: usize,
        principal: Option<&Principal>,
    ) -> OpResult<WatchUpdate> {
        let page = fill(
            self.index
                .queues
                .range::<str, _>((after(cursor), Bound::Unbounded))
                .filter(|(name, _)| covers(principal, name))
                .map(|(name, q)| Ok::<_, Failure>(self.queue_info(name, q))),
            limit,
            |q| q.name.clone(),
        )?;
        Ok(WatchUpdate::Queues {
            queues: page.items,
            next: page.next,
        })
    }

    /// A page of one queue's tasks in one state, after the cursor (a task id).
    fn tasks_screen(
        &self,
        queue: &str,
        state: TaskState,
        cursor: Option<&str>,
        limit: usize,
    ) -> OpResult<WatchUpdate> {
        let q = self.index.queue(queue)?;
        let start = match cursor {
            Some(a) => Bound::Excluded(parse_id(a)?),
            None => Bound::Unbounded,
        };
        let page = fill(
            q.ids(state)
                .range((start, Bound::Unbounded))
                .map(|&id| Ok::<_, Failure>(row(id, &self.record(id)?))),
            limit,
            |t| t.id.clone(),
        )?;
        Ok(WatchUpdate::Tasks {
            queue: self.queue_info(queue, q),
            state,
            tasks: page.items,
            next: page.next,
        })
    }

    /// One member and the first [`MAX_WATCH_ROWS`] of its leases.
    fn member_screen(&self, member: &str) -> OpResult<WatchUpdate> {
        let m = self
            .members
            .by_name
            .get(member)
            .ok_or_else(|| super::members::not_a_member(member))?;
        let mut leases = Vec::new();
        for &id in m.leased.iter().take(MAX_WATCH_ROWS as usize) {
            leases.push(row(id, &self.record(id)?));
        }
        Ok(WatchUpdate::Member {
            member: m.info(member),
            leases,
        })
    }

    /// A page of members, after the cursor (a member name).
    fn members_screen(&self, cursor: Option<&String>, limit: usize) -> OpResult<WatchUpdate> {
        let page = fill(
            self.members
                .by_name
                .range::<str, _>((after(cursor), Bound::Unbounded))
                .map(|(name, m)| Ok::<_, Failure>(m.info(name))),
            limit,
            |m| m.name.clone(),
        )?;
        Ok(WatchUpdate::Members {
            members: page.items,
            connected: self.connected_members() as u64,
            next: page.next,
        })
    }

    /// Dead tasks of every covered queue, by queue name then id. The cursor is
    /// `QUEUE/ID` (queue names have no `/`), so it stays valid when its task is redriven.
    fn dead_screen(
        &self,
        cursor: Option<&str>,
        limit: usize,
        principal: Option<&Principal>,
    ) -> OpResult<WatchUpdate> {
        let (first_queue, first_id) = match cursor {
            None => (Bound::Unbounded, None),
            Some(c) => {
                let (queue, id) = c
                    .split_once('/')
                    .ok_or_else(|| bad(format!("invalid dead cursor {c:?}: want QUEUE/ID")))?;
                (Bound::Included(queue), Some((queue, parse_id(id)?)))
            }
        };
        let mut ids: Vec<Ulid> = Vec::new();
        let read_at_most = limit + 1;
        for (name, q) in self
            .index
            .queues
            .range::<str, _>((first_queue, Bound::Unbounded))
        {
            if ids.len() > limit {
                break;
            }
            if !covers(principal, name) {
                continue;
            }
            let start = match first_id {
                Some((queue, id)) if queue == name.as_str() => Bound::Excluded(id),
                _ => Bound::Unbounded,
            };
            ids.extend(
                q.ids(TaskState::Dead)
                    .range((start, Bound::Unbounded))
                    .take(limit + 1 - ids.len()),
            );
        }
        assert!(
            ids.len() <= read_at_most,
            "a dead screen reads at most one page of records and one more"
        );
        let page = fill(
            ids.into_iter()
                .map(|id| Ok::<_, Failure>(row(id, &self.record(id)?))),
            limit,
            |t| format!("{}/{}", t.queue, t.id),
        )?;
        let total = self
            .index
            .queues
            .iter()
            .filter(|(name, _)| covers(principal, name))
            .map(|(_, q)| q.ids(TaskState::Dead).len() as u64)
            .sum();
        Ok(WatchUpdate::Dead {
            tasks: page.items,
            total,
            next: page.next,
        })
    }
}
