//! The engine's side of limits ([`super::limits`]): the `limit_*` ops, the check of the
//! limits an enqueue names, and the admission of waiting tasks when a bucket's room
//! grows.

use std::sync::Arc;

use ulid::Ulid;

use muster_protocol::limits::{
    MAX_LIMIT_CONCURRENCY, MAX_LIMIT_COST, MAX_LIMIT_TOKENS, MAX_LIMITS, MAX_PAGE, MAX_RATE_PERIOD,
    MAX_TASK_LIMITS,
};
use muster_protocol::model::{LimitSpec, NewTask};
use muster_protocol::ops::{
    CountReply, LimitDelete, LimitGet, LimitList, LimitListReply, LimitReply, LimitSet,
};
use muster_protocol::{ErrorCode, names};

use super::dispatch::Gate;
use super::limits::BucketId;
use super::ops::bad;
use super::{Engine, Now, OpResult, Waiter, client};
use crate::store::LimitRecord;

/// Checks a limit's settings: a rate, a concurrency or both, each within its bounds.
fn check_spec(spec: &LimitSpec) -> OpResult<()> {
    if spec.rate.is_none() && spec.concurrency.is_none() {
        return Err(bad("a limit needs a rate, a concurrency, or both"));
    }
    if let Some(rate) = spec.rate {
        let period = MAX_RATE_PERIOD.as_millis() as u64;
        if !(1..=MAX_LIMIT_TOKENS).contains(&rate.count) || !(1..=period).contains(&rate.per_ms) {
            return Err(bad(format!(
                "a rate adds 1 to {MAX_LIMIT_TOKENS} tokens every 1 to {period} ms, not {} every {} ms",
                rate.count, rate.per_ms
            )));
        }
    }
    match (spec.burst, spec.rate) {
        (Some(_), None) => return Err(bad("a burst needs a rate")),
        (Some(b), Some(_)) if !(1..=MAX_LIMIT_TOKENS).contains(&b) => {
            return Err(bad(format!("burst is 1 to {MAX_LIMIT_TOKENS}, not {b}")));
        }
        _ => {}
    }
    if spec
        .concurrency
        .is_some_and(|c| !(1..=MAX_LIMIT_CONCURRENCY).contains(&c))
    {
        return Err(bad(format!("concurrency is 1 to {MAX_LIMIT_CONCURRENCY}")));
    }
    Ok(())
}

impl<W: Waiter> Engine<W> {
    /// Checks the limits an enqueue's tasks name: at most [`MAX_TASK_LIMITS`] each,
    /// each named once, existing, with a valid key and a cost within the limit's burst.
    pub(super) fn check_task_limits(&self, tasks: &[NewTask]) -> OpResult<()> {
        for (i, t) in tasks.iter().enumerate() {
            let at = |m: String| bad(format!("task {i}: {m}"));
            if t.limits.len() > MAX_TASK_LIMITS {
                return Err(at(format!(
                    "{} limits exceed the limit of {MAX_TASK_LIMITS} per task",
                    t.limits.len()
                )));
            }
            for (j, u) in t.limits.iter().enumerate() {
                if t.limits[..j].iter().any(|v| v.limit == u.limit) {
                    return Err(at(format!("limit {} is named twice", u.limit)));
                }
                if let Some(key) = &u.key {
                    names::check_short("limit key", key).map_err(at)?;
                }
                let Some(rec) = self.index.limits.record(&u.limit) else {
                    return Err(client(
                        ErrorCode::NotFound,
                        format!("task {i}: no limit {}", u.limit),
                    ));
                };
                let cost = u.cost.unwrap_or(1);
                let most = rec.spec.rate.map_or(MAX_LIMIT_COST, |r| {
                    rec.spec.burst.unwrap_or(r.count).min(MAX_LIMIT_COST)
                });
                if !(1..=most).contains(&cost) {
                    return Err(at(format!(
                        "a cost on limit {} is 1 to {most} (its burst), not {cost}",
                        u.limit
                    )));
                }
            }
        }
        Ok(())
    }

    pub(super) fn limit_set(&mut self, r: LimitSet, now: Now) -> OpResult<LimitReply> {
        names::check_limit(&r.name).map_err(bad)?;
        check_spec(&r.spec)?;
        let rec = match self.index.limits.record(&r.name) {
            Some(old) => LimitRecord {
                spec: r.spec,
                created_ms: old.created_ms,
                updated_ms: now.wall_ms,
            },
            None if self.index.limits.count() >= MAX_LIMITS => {
                return Err(client(
                    ErrorCode::Limit,
                    format!("the daemon holds {MAX_LIMITS} limits, its most"),
                ));
            }
            None => LimitRecord {
                spec: r.spec,
                created_ms: now.wall_ms,
                updated_ms: now.wall_ms,
            },
        };
        self.pending.put_limit(&r.name, &rec);
        let changed = self.index.limits.set(&r.name, rec);
        self.regate(&changed);
        self.admit_waiting_on_limits();
        Ok(LimitReply {
            limit: self
                .index
                .limits
                .info(&r.name, now.wall_ms)
                .expect("the limit was just set"),
        })
    }

    pub(super) fn limit_get(&self, r: &LimitGet, now: Now) -> OpResult<LimitReply> {
        self.index
            .limits
            .info(&r.0.name, now.wall_ms)
            .map(|limit| LimitReply { limit })
            .ok_or_else(|| client(ErrorCode::NotFound, format!("no limit {}", r.0.name)))
    }

    pub(super) fn limit_list(&self, r: &LimitList, now: Now) -> OpResult<LimitListReply> {
        let n = r.limit.unwrap_or(100);
        if !(1..=MAX_PAGE).contains(&n) {
            return Err(bad(format!("limit is 1 to {MAX_PAGE}")));
        }
        let names = self
            .index
            .limits
            .names_after(r.after.as_deref(), n as usize + 1);
        let next = (names.len() > n as usize).then(|| names[n as usize - 1].to_string());
        Ok(LimitListReply {
            limits: names
                .iter()
                .take(n as usize)
                .map(|name| {
                    self.index
                        .limits
                        .info(name, now.wall_ms)
                        .expect("a listed limit exists")
                })
                .collect(),
            next,
        })
    }

    /// Deletes a limit: the tasks waiting on it pass their gates again without it.
    /// Replies with how many tasks were waiting on it.
    pub(super) fn limit_delete(&mut self, r: &LimitDelete) -> OpResult<CountReply> {
        let waiting = self
            .index
            .limits
            .info(&r.0.name, 0)
            .map(|i| i.waiting)
            .ok_or_else(|| client(ErrorCode::NotFound, format!("no limit {}", r.0.name)))?;
        self.pending.remove_limit(&r.0.name);
        let buckets = self
            .index
            .limits
            .delete(&r.0.name)
            .expect("looked up above");
        self.regate(&buckets);
        self.admit_waiting_on_limits();
        Ok(CountReply {
            count: waiting,
            ids: Vec::new(),
        })
    }

    /// Passes the tasks of `buckets` (which a limit's change or deletion made stale)
    /// through their gates again: all leave their places first, then each takes its
    /// new one.
    fn regate(&mut self, buckets: &[BucketId]) {
        let mut tasks: Vec<(Arc<str>, Ulid)> = Vec::new();
        for bucket in buckets {
            tasks.extend(self.index.limits.drain_bucket(bucket));
        }
        // A task draws on a limit once, so it is in one of a limit's buckets at most.
        debug_assert!(
            {
                let mut ids: Vec<Ulid> = tasks.iter().map(|(_, id)| *id).collect();
                ids.sort();
                ids.windows(2).all(|w| w[0] != w[1])
            },
            "a task is in one drained bucket"
        );
        for step in [Step::Unplace, Step::Place] {
            for (queue, id) in &tasks {
                let q = self
                    .index
                    .queues
                    .get_mut(&**queue)
                    .unwrap_or_else(|| panic!("task {id} waits in a line of queue {queue}"));
                let gate = &mut Gate {
                    limits: &mut self.index.limits,
                    queue,
                };
                match step {
                    Step::Unplace => q.dispatch.unplace(*id, gate),
                    Step::Place => q.dispatch.place(*id, gate),
                }
            }
        }
        for (queue, _) in &tasks {
            self.waiting.ready_changed.queue(queue);
        }
    }

    /// Admits the tasks waiting in the lines of buckets whose room grew (a refill
    /// timer due, a lease ended, a limit changed), as many as fit each line, and sets
    /// each bucket's next timer. Queues that gained dispatchable tasks are served this
    /// round.
    pub(super) fn admit_waiting_on_limits(&mut self) {
        self.index.limits.due();
        for bucket in self.index.limits.take_grown() {
            for queue in self.index.limits.waiting_queues(&bucket) {
                let q = self
                    .index
                    .queues
                    .get_mut(&*queue)
                    .unwrap_or_else(|| panic!("bucket {bucket:?} has a line of queue {queue}"));
                let mut admitted = false;
                while let Some(entry) = self.index.limits.admit_next(&bucket, &queue) {
                    let gate = &mut Gate {
                        limits: &mut self.index.limits,
                        queue: &queue,
                    };
                    q.dispatch.admitted(Ulid::from_bytes(entry.1), gate);
                    admitted = true;
                }
                if admitted {
                    self.waiting.ready_changed.queue(&queue);
                }
            }
            self.index.limits.retime(&bucket);
        }
    }
}

/// The two passes of [`Engine::regate`].
#[derive(Clone, Copy)]
enum Step {
    Unplace,
    Place,
}
