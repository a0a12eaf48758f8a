//! The engine's side of limits ([`super::limits`]): the `limit_*` ops, the check of the
//! limits an enqueue names, and the admission of waiting tasks when a bucket's room
//! grows.

use std::sync::Arc;

use ulid::Ulid;

use muster_protocol::limits::{
    DEFAULT_THROTTLE, MAX_DELAY, MAX_LIMIT_CONCURRENCY, MAX_LIMIT_COST, MAX_LIMIT_TOKENS,
    MAX_LIMITS, MAX_PAGE, MAX_RATE_PERIOD, MAX_TASK_LIMITS,
};
use muster_protocol::model::{LimitSpec, NewTask, TaskState};
use muster_protocol::ops::{
    CountReply, LimitDelete, LimitGet, LimitList, LimitListReply, LimitReply, LimitSet,
    SettleReply, Throttled,
};
use muster_protocol::{ErrorCode, names};

use super::dispatch::Gate;
use super::limits::{BucketId, Use};
use super::ops::{bad, check_error_text};
use super::telemetry::{self, LeaseEnd};
use super::{Engine, Now, OpResult, Waiter, client, push_event};
use crate::store::{LimitRecord, StoreError};

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
    /// Loads every stored limit and the throttles still running; a throttle that ended
    /// while the daemon was down, or of a limit deleted since, is removed.
    pub(super) fn load_limits(&mut self, now: Now) -> Result<(), StoreError> {
        let (limits, throttles) = self.store.load_limits()?;
        for (name, rec) in limits {
            self.index.limits.load(&name, rec);
        }
        for (name, key, until_ms) in throttles {
            if until_ms > now.wall_ms && self.index.limits.record(&name).is_some() {
                let until = now.mono_ms + (until_ms - now.wall_ms);
                self.index.limits.load_throttle(&name, &key, until);
            } else {
                self.pending.remove_throttle(&name, &key);
            }
        }
        Ok(())
    }

    /// A holder gives its task back because a provider throttled it: ready again at
    /// its place with no failure, and the limit's bucket (every limit the task names,
    /// without `limit`) hands nothing out for the time asked; a task that names no
    /// limit waits that time itself.
    pub(super) fn throttled(&mut self, r: Throttled, now: Now) -> OpResult<SettleReply> {
        let wait = r
            .retry_after_ms
            .unwrap_or(DEFAULT_THROTTLE.as_millis() as u64);
        let most = MAX_DELAY.as_millis() as u64;
        if !(1..=most).contains(&wait) {
            return Err(bad(format!("retry_after_ms is 1 to {most}, not {wait}")));
        }
        let error = r
            .error
            .unwrap_or_else(|| format!("throttled for {wait} ms"));
        check_error_text(&error)?;
        let (id, mut rec) = self.held(&r.task, r.epoch)?;
        let uses: Vec<Use> = self
            .index
            .limited
            .get(&id)
            .map(|u| u.to_vec())
            .unwrap_or_default();
        let throttled: Vec<Use> = match &r.limit {
            Some(name) => match uses.iter().find(|u| &*u.limit == name.as_str()) {
                Some(u) => vec![u.clone()],
                None => {
                    return Err(bad(format!("task {id} draws on no limit {name}")));
                }
            },
            None => uses,
        };
        telemetry::lease_ended(
            id,
            &rec,
            rec.lease.as_ref().expect("a held task has a lease"),
            LeaseEnd::Throttled,
            now.wall_ms,
        );
        let member = rec.lease.take().map(|l| l.member);
        assert!(
            member.is_some(),
            "task {id}: a held task has a lease to give back"
        );
        push_event(
            &mut rec,
            now,
            "throttled",
            member.as_deref(),
            Some(r.epoch),
            Some(&error),
        );
        let until = now.mono_ms + wait;
        let mut limited = false;
        for u in &throttled {
            if let Some(((limit, key), ends)) = self.index.limits.throttle(u, until) {
                // The later of this throttle and one already running, as it is kept.
                let ends_ms = now.wall_ms + (ends - now.mono_ms);
                self.pending.put_throttle(&limit, &key, ends_ms);
                limited = true;
            }
        }
        let failures = rec.failures;
        if !self.cancel_if_requested(&mut rec, now, None, None) {
            if limited {
                rec.state = TaskState::Ready;
            } else {
                // Nothing to hold back but the task itself.
                rec.state = TaskState::Scheduled;
                rec.not_before_ms = Some(now.wall_ms + wait);
            }
            rec.updated_ms = now.wall_ms;
        }
        assert_eq!(
            rec.failures, failures,
            "task {id}: a throttle spends no attempt"
        );
        self.save(id, &rec, None);
        Ok(SettleReply {
            state: rec.state,
            not_before_ms: rec.not_before_ms,
        })
    }

    /// Checks the limits an enqueue's tasks name: at most [`MAX_TASK_LIMITS`] each,
    /// each named once, existing, with a valid key and a cost within the limit's burst;
    /// a refusal names the task as `name` calls it.
    pub(super) fn check_task_limits(
        &self,
        tasks: &[NewTask],
        name: impl Fn(usize) -> String,
    ) -> OpResult<()> {
        for (i, t) in tasks.iter().enumerate() {
            let at = |m: String| bad(format!("{}: {m}", name(i)));
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
                        format!("{}: no limit {}", name(i), u.limit),
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
            limits: self
                .index
                .limits
                .infos(names.iter().take(n as usize).map(|n| &**n), now.wall_ms),
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
        // An admission can give room back in a bucket already looked at (a task
        // admitted by one line displaces a task admitted behind it, whose charges in
        // its other lines come back): those buckets are grown again, and looked at
        // again, until no admission changes anything or the passes run out (the rest
        // waits for the next round).
        for _ in 0..MAX_ADMISSION_PASSES {
            let grown = self.index.limits.take_grown();
            if grown.is_empty() {
                return;
            }
            self.admit_grown(grown);
        }
    }

    /// One pass of [`Self::admit_waiting_on_limits`] over the buckets `grown`.
    fn admit_grown(&mut self, grown: std::collections::BTreeSet<BucketId>) {
        for bucket in grown {
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

    /// Removes the stored throttles that ended (a round's work: a request starts with
    /// no change pending).
    pub(super) fn forget_ended_throttles(&mut self) {
        for (limit, key) in self.index.limits.take_unthrottled() {
            self.pending.remove_throttle(&limit, &key);
        }
    }
}

/// Most passes one admission makes over the buckets whose room grew (each pass
/// looks again at those the previous one gave room back in); a pass that admits
/// nothing ends it.
const MAX_ADMISSION_PASSES: usize = 16;

/// The two passes of [`Engine::regate`].
#[derive(Clone, Copy)]
enum Step {
    Unplace,
    Place,
}
