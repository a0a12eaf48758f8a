//! One method per request: validate everything first, then change the record and
//! re-index it. A refused request changes nothing.

use std::ops::Bound;
use std::sync::Arc;

use ulid::Ulid;

use muster_protocol::limits::{
    MAX_BATCH, MAX_CLAIM, MAX_CLAIM_QUEUES, MAX_CLAIM_REPLY_BYTES, MAX_DELAY, MAX_ERROR_BYTES,
    MAX_GROUP_WEIGHT, MAX_GROUP_WEIGHTS, MAX_IDS, MAX_KEY_CONCURRENCY, MAX_LABEL_CLASSES,
    MAX_LABEL_CLASSES_PER_TOKEN, MAX_LEASE, MAX_LISTED_LABEL_SETS, MAX_LISTING_BYTES, MAX_PAGE,
    MAX_PARKED_CLAIMS_PER_CONNECTION, MAX_PARKED_CLAIMS_PER_PRINCIPAL, MAX_PAYLOAD_BYTES,
    MAX_PRIORITY, MAX_PROGRESS_BYTES, MAX_QUEUES, MAX_RESULT_BYTES, MAX_RETENTION,
    MAX_SUMMARY_PROGRESS_BYTES, MAX_WAIT, MIN_LEASE, cut_to,
};
use muster_protocol::model::{
    Delivery, EnqueuedTask, LeaseInfo, NewTask, QueueInfo, QueueOptions, QueuePatch, StateCounts,
    TaskInfo, TaskState, TaskSummary,
};
use muster_protocol::names;
use muster_protocol::ops::{
    Ack, Cancel, CancelReply, Claim, ClaimReply, CountReply, DeadLetter, DeadSelection, Enqueue,
    EnqueueReply, Nack, QueueCreate, QueueListReply, QueueName, QueueReply, Release, Renew,
    RenewReply, SettleReply, TaskGet, TaskList, TaskListReply, TaskReply, TaskUpdate,
    TaskUpdateReply, Wait, WaitReply,
};
use muster_protocol::{ErrorCode, RawJson, ops::EngineRequest};

use super::audit;
use super::bulk::{BulkJob, BulkKind};
use super::dispatch::Gate;
use super::listing::{self, fill};
use super::telemetry::{self, LeaseEnd};
use super::{
    ClaimWaiter, Engine, Failure, LeaseClock, Now, OpResult, Parked, Queue, Reply, TaskWait,
    Waiter, client, push_event,
};
use crate::auth::Principal;
use crate::store::{LeaseRecord, QueueRecord, StoreError, TaskRecord};

/// How a lease comes to its member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Grant {
    /// A claim or a push: the task's first lease since it was last ready.
    Leased,
    /// Leased again to a member whose agent restarted (`session_open` with `reclaim`).
    Reclaimed,
    /// Leased again, under a new epoch, to a resuming agent that never heard of its
    /// lease (`session_open` with `resume`, not named in `held`).
    Redelivered,
}

/// A validated claim, kept by a waiting claim until tasks arrive.
pub(super) struct ClaimSpec {
    pub(super) queues: Vec<String>,
    pub(super) max: usize,
    pub(super) lease_ms: Option<u64>,
    pub(super) member: String,
    pub(super) labels: Vec<String>,
    /// The event number of when the claimer was last heard from: tasks it let lapse
    /// come back to it only if it was heard from since.
    pub(super) heard: u64,
}

fn ms(d: std::time::Duration) -> u64 {
    d.as_millis() as u64
}

pub(super) fn bad(message: impl Into<String>) -> Failure {
    client(ErrorCode::BadRequest, message)
}

pub(super) fn parse_id(s: &str) -> OpResult<Ulid> {
    Ulid::from_string(s).map_err(|_| bad(format!("invalid task id {s:?}")))
}

/// How a refusal names the `i`th task of an enqueue.
pub(super) fn nth_task(i: usize) -> String {
    format!("task {i}")
}

/// Checks an enqueue's tasks before anything is stored: 1 to `MAX_BATCH` of them, each
/// payload, priority, key, idempotency key, label and delay within its limits; a
/// refusal names the task as `name` calls it.
pub(super) fn check_new_tasks(
    tasks: &[NewTask],
    now: Now,
    name: impl Fn(usize) -> String,
) -> OpResult<()> {
    if tasks.is_empty() || tasks.len() > MAX_BATCH {
        return Err(client(
            if tasks.is_empty() {
                ErrorCode::BadRequest
            } else {
                ErrorCode::TooLarge
            },
            format!(
                "an enqueue carries 1 to {MAX_BATCH} tasks, not {}",
                tasks.len()
            ),
        ));
    }
    for (i, t) in tasks.iter().enumerate() {
        let at = |m: String| bad(format!("{}: {m}", name(i)));
        check_size("payload", Some(&t.payload), MAX_PAYLOAD_BYTES)?;
        if t.priority.is_some_and(|p| p > MAX_PRIORITY) {
            return Err(at(format!("priority is 0..={MAX_PRIORITY}")));
        }
        if let Some(k) = &t.key {
            names::check_short("key", k).map_err(at)?;
        }
        if let Some(k) = &t.idempotency_key {
            names::check_short("idempotency key", k).map_err(at)?;
        }
        if let Some(g) = &t.group {
            names::check_short("group", g).map_err(at)?;
        }
        names::check_labels(&t.requires).map_err(at)?;
        names::check_trace(t.traceparent.as_deref(), t.tracestate.as_deref()).map_err(at)?;
        if t.delay_ms.is_some_and(|d| d > ms(MAX_DELAY)) {
            return Err(at("delay exceeds one year".into()));
        }
        if t.not_before_ms
            .is_some_and(|nb| nb > now.wall_ms.saturating_add(ms(MAX_DELAY)))
        {
            return Err(at("not_before is more than a year away".into()));
        }
    }
    Ok(())
}

fn check_lease(what: &str, value: u64) -> OpResult<()> {
    if value < ms(MIN_LEASE) || value > ms(MAX_LEASE) {
        return Err(bad(format!(
            "{what} of {value} ms is outside {}..={} ms",
            ms(MIN_LEASE),
            ms(MAX_LEASE)
        )));
    }
    Ok(())
}

fn check_size(what: &str, raw: Option<&RawJson>, limit: usize) -> OpResult<()> {
    match raw {
        Some(r) if r.get().len() > limit => Err(client(
            ErrorCode::TooLarge,
            format!(
                "{what} of {} bytes exceeds the limit of {limit}",
                r.get().len()
            ),
        )),
        _ => Ok(()),
    }
}

pub(super) fn check_error_text(text: &str) -> OpResult<()> {
    if text.len() > MAX_ERROR_BYTES {
        return Err(client(
            ErrorCode::TooLarge,
            format!(
                "error text of {} bytes exceeds the limit of {MAX_ERROR_BYTES}",
                text.len()
            ),
        ));
    }
    Ok(())
}

/// Applies a patch to queue options after checking every field.
fn apply_patch(options: &mut QueueOptions, patch: &QueuePatch) -> OpResult<()> {
    let mut next = options.clone();
    if let Some(v) = patch.lease_ms {
        check_lease("lease", v)?;
        next.lease_ms = v;
    }
    if let Some(v) = patch.max_attempts {
        next.max_attempts = v;
    }
    if let Some(b) = patch.retry_backoff {
        let ok = b.factor.is_finite()
            && b.factor >= 1.0
            && b.jitter.is_finite()
            && (0.0..=1.0).contains(&b.jitter)
            && b.base_ms <= b.cap_ms
            && b.cap_ms <= ms(MAX_DELAY);
        if !ok {
            return Err(bad(
                "retry_backoff wants factor >= 1, jitter in 0..=1 and base_ms <= cap_ms <= one year",
            ));
        }
        next.retry_backoff = b;
    }
    if let Some(v) = patch.key_concurrency {
        if v == 0 || v > MAX_KEY_CONCURRENCY {
            return Err(bad(format!(
                "key_concurrency {v} is outside 1..={MAX_KEY_CONCURRENCY}"
            )));
        }
        next.key_concurrency = v;
    }
    if let Some(v) = patch.retention_ms {
        if v > ms(MAX_RETENTION) {
            return Err(bad(format!("retention of {v} ms exceeds one year")));
        }
        next.retention_ms = v;
    }
    if let Some(v) = patch.max_runtime_ms {
        if v == 0 {
            next.max_runtime_ms = None;
        } else {
            check_lease("max_runtime", v)?;
            next.max_runtime_ms = Some(v);
        }
    }
    if let Some(v) = patch.paused {
        next.paused = v;
    }
    if let Some(v) = patch.fair {
        next.fair = v;
    }
    if let Some(weights) = &patch.group_weights {
        for (group, &weight) in weights {
            names::check_short("group", group).map_err(bad)?;
            if weight == 0 || weight > MAX_GROUP_WEIGHT {
                return Err(bad(format!(
                    "group {group:?}: weight {weight} is outside 1..={MAX_GROUP_WEIGHT}"
                )));
            }
            if weight == 1 {
                next.group_weights.remove(group);
            } else {
                next.group_weights.insert(group.clone(), weight);
            }
        }
        if next.group_weights.len() > MAX_GROUP_WEIGHTS {
            return Err(client(
                ErrorCode::Limit,
                format!("a queue names at most {MAX_GROUP_WEIGHTS} group weights"),
            ));
        }
    }
    assert!(
        next.key_concurrency >= 1,
        "a queue's key concurrency lets one task of a key run"
    );
    assert!(
        next.retry_backoff.base_ms <= next.retry_backoff.cap_ms,
        "a queue's retry backoff starts within its cap"
    );
    *options = next;
    Ok(())
}

/// True for ops that change members without committing (labels, capacity,
/// subscriptions, drain): the generation must move for watches of the members screen.
fn changes_members(req: &EngineRequest) -> bool {
    matches!(
        req,
        EngineRequest::SessionOpen(_)
            | EngineRequest::SessionUpdate(_)
            | EngineRequest::Subscribe(_)
            | EngineRequest::Unsubscribe(_)
            | EngineRequest::MemberDrain(_)
            | EngineRequest::MemberUndrain(_)
    )
}

pub(super) fn summary(id: Ulid, rec: &TaskRecord) -> TaskSummary {
    TaskSummary {
        id: id.to_string(),
        queue: rec.queue.clone(),
        state: rec.state,
        priority: rec.priority,
        key: rec.key.clone(),
        deliveries: rec.deliveries,
        failures: rec.failures,
        not_before_ms: rec.not_before_ms,
        lease: lease_info(rec),
        last_error: rec.last_error.clone(),
        dead_reason: rec.dead_reason.clone(),
        suspension: rec.suspension.as_ref().map(|s| Box::new(s.info.clone())),
        created_ms: rec.created_ms,
        updated_ms: rec.updated_ms,
        progress: rec.progress.as_ref().map(|p| {
            let mut text = p.get().to_owned();
            if cut_to(&mut text, MAX_SUMMARY_PROGRESS_BYTES) {
                text.push('…');
            }
            text
        }),
    }
}

fn lease_info(rec: &TaskRecord) -> Option<LeaseInfo> {
    rec.lease.as_ref().map(|l| LeaseInfo {
        member: l.member.clone(),
        epoch: l.epoch,
        expires_ms: l.expires_ms,
    })
}

/// The label sets an enqueue's tasks require that its queue knows none of yet, each
/// once. Tasks that require nothing never count.
fn new_label_classes(dispatch: &super::dispatch::DispatchIndex, r: &Enqueue) -> Vec<Vec<String>> {
    let mut new: Vec<Vec<String>> = Vec::new();
    for t in &r.tasks {
        if t.requires.is_empty() || dispatch.knows(&t.requires) {
            continue;
        }
        let labels = super::dispatch::sorted(&t.requires);
        if !new.contains(&labels) {
            new.push(labels);
        }
    }
    new
}

/// Records the label sets `new` to `queue` as `tenant`'s, or refuses them if they
/// would give it more than [`MAX_LABEL_CLASSES_PER_TOKEN`] of the queue's sets.
fn charge_label_classes(
    queue: &mut Queue,
    tenant: &Principal,
    new: Vec<Vec<String>>,
) -> OpResult<()> {
    let dispatch = &queue.dispatch;
    queue
        .class_owners
        .retain(|labels, _| dispatch.knows(labels));
    let spender: std::sync::Arc<str> = std::sync::Arc::from(tenant.name.as_str());
    let mine = queue
        .class_owners
        .values()
        .filter(|owner| **owner == spender)
        .count();
    if mine + new.len() > MAX_LABEL_CLASSES_PER_TOKEN {
        return Err(client(
            ErrorCode::Limit,
            format!(
                "token {spender:?} would have brought {} label sets (requires) to queue {:?}; one token may bring at most {MAX_LABEL_CLASSES_PER_TOKEN} of its {MAX_LABEL_CLASSES}",
                mine + new.len(),
                queue.name
            ),
        ));
    }
    for labels in new {
        let old = queue
            .class_owners
            .insert(labels, std::sync::Arc::clone(&spender));
        debug_assert!(
            old.is_none(),
            "a label set new to the queue has no owner yet"
        );
    }
    debug_assert!(
        queue
            .class_owners
            .values()
            .filter(|owner| **owner == spender)
            .count()
            <= MAX_LABEL_CLASSES_PER_TOKEN,
        "token {spender:?}: at most {MAX_LABEL_CLASSES_PER_TOKEN} label sets of a queue"
    );
    Ok(())
}

/// What a member is sent of a task just leased to it under `epoch`, until `expires`
/// (wall time), `lease_ms` from now.
fn delivery(
    id: Ulid,
    rec: &TaskRecord,
    payload: RawJson,
    epoch: u64,
    expires: u64,
    lease_ms: u64,
    grant: Grant,
) -> Delivery {
    Delivery {
        id: id.to_string(),
        epoch,
        queue: rec.queue.clone(),
        payload,
        attempt: rec.deliveries,
        failures: rec.failures,
        priority: rec.priority,
        key: rec.key.clone(),
        lease_expires_ms: expires,
        lease_ms,
        progress: rec.progress.clone(),
        reclaimed: grant == Grant::Reclaimed,
        resumed: rec.resumed.clone().map(Box::new),
        parent: rec.parent.as_ref().map(|p| p.id.to_string()),
        output: 0,
        traceparent: holder_traceparent(id, rec, epoch),
        tracestate: rec.tracestate.clone(),
    }
}

/// The trace context a holder of lease `epoch` of task `id` is handed: the task's own,
/// or, when the daemon exports spans, the same trace with this lease's span as the
/// parent (so the holder's spans are children of the lease's).
fn holder_traceparent(id: Ulid, rec: &TaskRecord, epoch: u64) -> Option<String> {
    let traceparent = rec.traceparent.as_deref()?;
    if !crate::otlp::enabled() {
        return Some(traceparent.to_owned());
    }
    let (trace, _, flags) = crate::otlp::parse(traceparent)?;
    let span = crate::otlp::span_id(id, epoch, false);
    Some(format!("00-{trace}-{span}-{:02x}", flags.to_u8()))
}

impl<W: Waiter> Engine<W> {
    pub(super) fn dispatch(
        &mut self,
        req: EngineRequest,
        waiter: W,
        now: Now,
    ) -> Result<(), (W, Failure)> {
        assert!(
            self.pending.is_empty(),
            "a request starts with no change pending"
        );
        self.heard_from(waiter.connection(), now);
        if let Some(p) = waiter.principal()
            && let Err(e) = self.authorize(&req, p)
        {
            return Err((waiter, Failure::Client(e)));
        }
        let members_change = changes_members(&req);
        let action = audit::action(&req);
        let result = match req {
            EngineRequest::QueueCreate(r) => self.queue_create(r, now).map(Reply::Queue),
            EngineRequest::QueueList(r) => self
                .queue_list(&r, waiter.principal())
                .map(Reply::QueueList),
            EngineRequest::QueueDescribe(r) => self.queue_describe(&r.0.queue).map(Reply::Queue),
            EngineRequest::QueueUpdate(r) => self
                .queue_update(&r.queue, &r.options, now)
                .map(Reply::Queue),
            EngineRequest::QueuePause(r) => self.queue_pause(&r.0, true, now).map(Reply::Queue),
            EngineRequest::QueueResume(r) => self.queue_pause(&r.0, false, now).map(Reply::Queue),
            EngineRequest::QueuePurge(r) => {
                let ids = self.purge_ids(&r.0);
                return self.bulk(waiter, BulkKind::Purge, r.0.queue, ids);
            }
            EngineRequest::QueueDelete(r) => {
                let ids = self.delete_ids(&r.0);
                return self.bulk(waiter, BulkKind::Delete, r.0.queue, ids);
            }
            EngineRequest::Enqueue(r) => {
                self.enqueue(r, waiter.principal(), now).map(Reply::Enqueue)
            }
            EngineRequest::Claim(r) => return self.claim(r, waiter, now),
            EngineRequest::Ack(r) => self.ack(r, now).map(Reply::Settle),
            EngineRequest::Nack(r) => self.nack(r, now).map(Reply::Settle),
            EngineRequest::Renew(r) => self.renew(r, now).map(Reply::Renew),
            EngineRequest::Release(r) => self.release(r, now).map(Reply::Settle),
            EngineRequest::Throttled(r) => self.throttled(r, now).map(Reply::Settle),
            EngineRequest::DeadLetter(r) => self.dead_letter(r, now).map(Reply::Settle),
            EngineRequest::Suspend(r) => {
                self.suspend(r, waiter.principal(), now).map(Reply::Suspend)
            }
            EngineRequest::Resume(r) => self.resume(r, waiter.principal(), now).map(Reply::Resume),
            EngineRequest::Spawn(r) => self.spawn(r, waiter.principal(), now).map(Reply::Spawn),
            EngineRequest::Emit(r) => self.emit(r, now).map(Reply::Emit),
            EngineRequest::Follow(r) => return self.follow(r, waiter, now),
            EngineRequest::TaskGet(r) => self.task_get(r).map(Reply::Task),
            EngineRequest::TaskList(r) => self.task_list(r).map(Reply::TaskList),
            EngineRequest::TaskFind(r) => {
                self.task_find(*r, waiter.principal()).map(Reply::TaskFind)
            }
            EngineRequest::Wait(r) => return self.wait(r, waiter, now),
            EngineRequest::Cancel(r) => self.cancel(r, now).map(Reply::Cancel),
            EngineRequest::TaskUpdate(r) => self.task_update(&r, now).map(Reply::TaskUpdate),
            EngineRequest::Redrive(r) if !r.0.dry_run => {
                let ids = self.dead_selection(&r.0);
                return self.bulk(waiter, BulkKind::Redrive, r.0.queue, ids);
            }
            EngineRequest::Discard(r) if !r.0.dry_run => {
                let ids = self.dead_selection(&r.0);
                return self.bulk(waiter, BulkKind::Discard, r.0.queue, ids);
            }
            // Dry runs: what would be touched, at once.
            EngineRequest::Redrive(r) => self
                .dead_selection(&r.0)
                .map(|ids| Reply::Count(count_reply(&ids, true))),
            EngineRequest::Discard(r) => self
                .dead_selection(&r.0)
                .map(|ids| Reply::Count(count_reply(&ids, true))),
            EngineRequest::SessionOpen(r) => {
                self.session_open(r, &waiter, now).map(Reply::SessionOpen)
            }
            EngineRequest::SessionUpdate(r) => self.session_update(r, &waiter).map(Reply::Member),
            EngineRequest::Subscribe(r) => self.subscribe(r, &waiter).map(Reply::Empty),
            EngineRequest::Unsubscribe(r) => self.unsubscribe(r, &waiter).map(Reply::Empty),
            EngineRequest::MemberList(r) => self
                .member_list(&r, waiter.principal())
                .map(Reply::MemberList),
            EngineRequest::MemberDescribe(r) => {
                self.member_describe(&r.0).map(Reply::MemberDescribe)
            }
            EngineRequest::MemberDrain(r) => self.member_drain(&r.0).map(Reply::Member),
            EngineRequest::MemberUndrain(r) => self.member_undrain(&r.0).map(Reply::Member),
            EngineRequest::MemberRelease(r) => self
                .member_release(&r.0.member)
                .map(|()| Reply::Empty(muster_protocol::ops::Empty {}))
                .map_err(Failure::Client),
            EngineRequest::LeaseRevoke(r) => self.lease_revoke(r, now).map(Reply::Settle),
            EngineRequest::Watch(r) => self.watch(r, &waiter, now).map(Reply::Watch),
            EngineRequest::Unwatch(_) => Ok(Reply::Empty(self.unwatch(&waiter))),
            EngineRequest::AdminSnapshot(r) => return self.admin_snapshot(&r.dir, waiter),
            EngineRequest::LimitSet(r) => self.limit_set(r, now).map(Reply::Limit),
            EngineRequest::LimitGet(r) => self.limit_get(&r, now).map(Reply::Limit),
            EngineRequest::LimitList(r) => self.limit_list(&r, now).map(Reply::LimitList),
            EngineRequest::LimitDelete(r) => self.limit_delete(&r).map(Reply::Count),
            EngineRequest::ScheduleSet(r) => self
                .schedule_set(*r, waiter.principal(), now)
                .map(Reply::Schedule),
            EngineRequest::ScheduleGet(r) => self.schedule_get(&r.0).map(Reply::Schedule),
            EngineRequest::ScheduleList(r) => self
                .schedule_list(&r, waiter.principal())
                .map(Reply::ScheduleList),
            EngineRequest::SchedulePause(r) => {
                self.schedule_pause(&r.0, true, now).map(Reply::Schedule)
            }
            EngineRequest::ScheduleResume(r) => {
                self.schedule_pause(&r.0, false, now).map(Reply::Schedule)
            }
            EngineRequest::ScheduleDelete(r) => self.schedule_delete(&r.0).map(Reply::Empty),
            EngineRequest::ScheduleRun(r) => self
                .schedule_run(&r.0, waiter.principal(), now)
                .map(Reply::ScheduleRun),
        };
        match result {
            Ok(reply) => {
                self.answered(waiter, reply, action.as_ref(), members_change);
                Ok(())
            }
            Err(f) => Err((waiter, f)),
        }
    }

    /// Queues the reply of a request applied now: audited if it is an operator's
    /// action, and seen by watches if it changed members in memory only.
    fn answered(
        &mut self,
        waiter: W,
        reply: Reply,
        action: Option<&audit::Action>,
        members_change: bool,
    ) {
        debug_assert!(
            !matches!(
                reply,
                Reply::Hello(_) | Reply::ServerStats(_) | Reply::Cluster(_)
            ),
            "the engine answers no handshake and no edge op"
        );
        if let Some(action) = action {
            audit::applied(action, waiter.principal().map(|p| p.name.as_str()), &reply);
        }
        if members_change {
            // In-memory member changes commit nothing; watches must still see them.
            self.generation += 1;
        }
        self.outbox.replies.push((waiter, Ok(reply)));
    }

    /// Parks an `admin_snapshot` for the dispatcher, which writes it after the round's
    /// persist and answers.
    fn admin_snapshot(&mut self, dir: &str, waiter: W) -> Result<(), (W, Failure)> {
        match snapshot_dir(dir) {
            Ok(dir) => {
                self.outbox.snapshots.push((waiter, dir));
                Ok(())
            }
            Err(f) => Err((waiter, f)),
        }
    }

    /// A queue's options and counts.
    fn queue_describe(&self, name: &str) -> OpResult<QueueReply> {
        let q = self.index.queue(name)?;
        Ok(QueueReply {
            queue: self.queue_info(name, q),
        })
    }

    /// A page of the queues the principal covers, by name.
    fn queue_list(
        &self,
        r: &muster_protocol::ops::QueueList,
        principal: Option<&crate::auth::Principal>,
    ) -> OpResult<QueueListReply> {
        let limit = r.limit.unwrap_or(100);
        if limit == 0 || limit > MAX_PAGE {
            return Err(bad(format!("limit {limit} is outside 1..={MAX_PAGE}")));
        }
        let start = match &r.after {
            Some(a) => Bound::Excluded(a.as_str()),
            None => Bound::Unbounded,
        };
        let page = fill(
            self.index
                .queues
                .range::<str, _>((start, Bound::Unbounded))
                .filter(|(name, q)| !q.deleting && principal.is_none_or(|p| p.covers(name)))
                .map(|(name, q)| Ok::<_, Failure>(self.queue_info(name, q))),
            limit as usize,
            |q| q.name.clone(),
        )?;
        Ok(QueueListReply {
            queues: page.items,
            next: page.next,
        })
    }

    fn queue_create(&mut self, r: QueueCreate, now: Now) -> OpResult<QueueReply> {
        names::check_queue(&r.queue).map_err(bad)?;
        if self.index.queues.contains_key(&r.queue) {
            return Err(client(
                ErrorCode::AlreadyExists,
                format!("queue {:?} exists already", r.queue),
            ));
        }
        if self.index.queues.len() >= MAX_QUEUES {
            return Err(client(
                ErrorCode::Limit,
                format!("the daemon holds the maximum of {MAX_QUEUES} queues"),
            ));
        }
        let mut options = QueueOptions::default();
        apply_patch(&mut options, &r.options)?;
        self.pending
            .put_queue(&r.queue, &QueueRecord::new(options.clone(), now.wall_ms));
        let queue = Queue::new(&r.queue, options, now.wall_ms);
        telemetry::queue_created(&r.queue);
        let info = self.queue_info(&r.queue, &queue);
        let old = self.index.queues.insert(r.queue, queue);
        assert!(old.is_none(), "a queue is created once");
        debug_assert!(
            self.index.queues.len() <= MAX_QUEUES,
            "the daemon holds at most {MAX_QUEUES} queues"
        );
        Ok(QueueReply { queue: info })
    }

    fn queue_update(&mut self, name: &str, patch: &QueuePatch, now: Now) -> OpResult<QueueReply> {
        let queue = self
            .index
            .queues
            .get_mut(name)
            .ok_or_else(|| client(ErrorCode::NotFound, format!("no queue {name:?}")))?;
        let old_retention = queue.options.retention_ms;
        let old_key_concurrency = queue.options.key_concurrency;
        let old_fair = queue.options.fair;
        let old_weights = queue.options.group_weights.clone();
        let old_max_runtime = queue.options.max_runtime_ms;
        let old_lease = queue.options.lease_ms;
        apply_patch(&mut queue.options, patch)?;
        let new_max_runtime = queue.options.max_runtime_ms;
        let new_lease = queue.options.lease_ms;
        if queue.options.fair != old_fair || queue.options.group_weights != old_weights {
            let grouped = &self.index.grouped;
            queue.dispatch.set_fair(
                queue.options.fair,
                queue.options.group_weights.clone(),
                |id| grouped.get(&id).cloned(),
            );
        }
        if queue.options.key_concurrency != old_key_concurrency {
            let name = Arc::clone(&queue.name);
            queue.dispatch.rebuild(
                queue.options.key_concurrency,
                &mut Gate {
                    limits: &mut self.index.limits,
                    queue: &name,
                },
            );
        }
        let new_retention = queue.options.retention_ms;
        if new_retention != old_retention {
            // Finished tasks follow the new retention, counted from when they finished.
            let finished: Vec<_> = queue
                .ids(TaskState::Done)
                .iter()
                .chain(queue.ids(TaskState::Cancelled))
                .copied()
                .collect();
            for id in finished {
                let meta = self
                    .index
                    .tasks
                    .get_mut(&id)
                    .unwrap_or_else(|| panic!("finished task {id} of {name:?} is not indexed"));
                assert!(
                    self.index.expiry.remove(&(meta.at_ms, id)),
                    "finished task {id} was not waiting to expire"
                );
                assert!(
                    meta.at_ms >= old_retention,
                    "finished task {id}: its removal time counts its queue's retention"
                );
                meta.at_ms = (meta.at_ms - old_retention).saturating_add(new_retention);
                assert!(
                    self.index.expiry.insert((meta.at_ms, id)),
                    "task {id} expires twice"
                );
            }
        }
        if new_max_runtime.unwrap_or(u64::MAX) < old_max_runtime.unwrap_or(u64::MAX) {
            self.cap_running_leases(name, now)?;
        }
        if new_lease < old_lease {
            self.store_renewals(name);
        }
        let queue = &self.index.queues[name];
        self.pending.put_queue(
            name,
            &QueueRecord::new(queue.options.clone(), queue.created_ms),
        );
        // Resuming a queue or raising its key concurrency can make tasks available.
        self.waiting
            .ready_changed
            .queue(&std::sync::Arc::from(name));
        Ok(QueueReply {
            queue: self.queue_info(name, queue),
        })
    }

    /// Shortens the running leases of a queue to their new runtime cap: a lease past it
    /// lapses at the next timer run, and its holder's renewals get `lease_lost`.
    fn cap_running_leases(&mut self, name: &str, now: Now) -> OpResult<()> {
        let queue = &self.index.queues[name];
        let max = queue.options.max_runtime_ms;
        let leased: Vec<Ulid> = queue.ids(TaskState::Leased).iter().copied().collect();
        for id in leased {
            let mut clock = self.index.tasks[&id]
                .clock()
                .expect("a leased task has a lease clock");
            let cap = clock.runtime_cap(max);
            if clock.deadline <= cap {
                continue;
            }
            clock.deadline = cap;
            let mut rec = self.record(id)?;
            if let Some(lease) = rec.lease.as_mut() {
                lease.expires_ms = now.wall_ms + cap.saturating_sub(now.mono_ms);
            }
            self.save(id, &rec, Some(clock));
        }
        debug_assert!(
            self.index.queues[name]
                .ids(TaskState::Leased)
                .iter()
                .filter_map(|id| self.index.tasks[id].clock())
                .all(|c| c.deadline <= c.runtime_cap(max)),
            "queue {name:?}: every lease's deadline within its new runtime cap"
        );
        Ok(())
    }

    fn queue_pause(&mut self, r: &QueueName, paused: bool, now: Now) -> OpResult<QueueReply> {
        let patch = QueuePatch {
            paused: Some(paused),
            ..QueuePatch::default()
        };
        self.queue_update(&r.queue, &patch, now)
    }

    /// The tasks a purge removes: ready and scheduled.
    fn purge_ids(&self, r: &QueueName) -> OpResult<Vec<Ulid>> {
        let q = self.index.queue(&r.queue)?;
        Ok(q.ids(TaskState::Ready)
            .iter()
            .chain(q.ids(TaskState::Scheduled))
            .copied()
            .collect())
    }

    /// The tasks a queue deletion removes: all.
    fn delete_ids(&self, r: &QueueName) -> OpResult<Vec<Ulid>> {
        let q = self.index.queue(&r.queue)?;
        Ok(q.by_state.iter().flatten().copied().collect())
    }

    /// Starts a bulk job over the tasks `ids` chose, or refuses the request.
    fn bulk(
        &mut self,
        waiter: W,
        kind: BulkKind,
        queue: String,
        ids: OpResult<Vec<Ulid>>,
    ) -> Result<(), (W, Failure)> {
        match ids {
            Ok(ids) => {
                self.start_bulk(BulkJob::new(waiter, kind, queue, ids));
                Ok(())
            }
            Err(f) => Err((waiter, f)),
        }
    }

    fn enqueue(
        &mut self,
        r: Enqueue,
        principal: Option<&Principal>,
        now: Now,
    ) -> OpResult<EnqueueReply> {
        let owner = principal.map(|p| p.name.as_str());
        self.check_enqueue(&r, principal, owner, 0, now)?;
        let mut out = Vec::with_capacity(r.tasks.len());
        // This batch's idempotency keys so far, so a key repeated within it is one task.
        let mut keyed: Vec<(&str, Ulid)> = Vec::new();
        for t in &r.tasks {
            if let Some(existing) = self.existing_by_key(&r.queue, t, &keyed)? {
                out.push(existing);
                continue;
            }
            let (id, state) = self.store_new(&r.queue, t, owner, None, now);
            if let Some(key) = t.idempotency_key.as_deref() {
                keyed.push((key, id));
            }
            out.push(EnqueuedTask {
                id: id.to_string(),
                duplicate: false,
                state,
            });
        }
        assert_eq!(out.len(), r.tasks.len(), "one answer per task");
        debug_assert!(
            self.index.queues[r.queue.as_str()]
                .by_state
                .iter()
                .map(|ids| ids.len() as u64)
                .sum::<u64>()
                <= self.budget.quotas.max_tasks_per_queue,
            "queue {:?}: an enqueue never takes a queue past its task quota",
            r.queue
        );
        debug_assert!(
            owner.is_none_or(|o| self.budget.stored_bytes.get(o).copied().unwrap_or(0)
                <= self.budget.quotas.max_bytes_per_principal),
            "an enqueue never takes its principal past its stored-bytes quota"
        );
        Ok(EnqueueReply { tasks: out })
    }

    /// Refuses tasks an enqueue may not store (`earlier` bytes of the same request
    /// counted already against `owner`'s quota): the queue, the disk alarm, every
    /// task's fields and limits, label sets and quotas.
    pub(super) fn check_enqueue(
        &mut self,
        r: &Enqueue,
        principal: Option<&Principal>,
        owner: Option<&str>,
        earlier: u64,
        now: Now,
    ) -> OpResult<()> {
        self.index.queue(&r.queue)?;
        if self.budget.disk_alarm {
            return Err(client(
                ErrorCode::DiskFull,
                "the disk alarm is on: the data directory's free space is below its threshold; \
                 enqueues are refused until space comes back (claims, settles and repairs go on)",
            ));
        }
        check_new_tasks(&r.tasks, now, nth_task)?;
        self.check_task_limits(&r.tasks, nth_task)?;
        self.check_label_classes(r, principal)?;
        self.check_quotas(r, owner, earlier)
    }

    /// The task already stored under `t`'s idempotency key in `queue` (or earlier in this
    /// batch, `keyed`), answered as a duplicate; `None` when there is none (or it is
    /// gone: retention ended it).
    pub(super) fn existing_by_key(
        &self,
        queue: &str,
        t: &NewTask,
        keyed: &[(&str, Ulid)],
    ) -> OpResult<Option<EnqueuedTask>> {
        let Some(key) = t.idempotency_key.as_deref() else {
            return Ok(None);
        };
        let existing = match keyed.iter().find(|(k, _)| *k == key) {
            Some((_, id)) => Some(*id),
            None => self.store.idem(queue, key)?,
        };
        debug_assert!(
            existing
                .and_then(|id| self.index.tasks.get(&id))
                .is_none_or(|m| *m.queue == *queue),
            "an idempotency key names a task of its own queue"
        );
        Ok(existing
            .filter(|id| self.index.tasks.contains_key(id))
            .map(|id| EnqueuedTask {
                id: id.to_string(),
                duplicate: true,
                state: self.index.tasks[&id].state,
            }))
    }

    /// Stores a new task (its record, payload and idempotency key; its parent when it
    /// is a child) and counts it: its id and first state.
    pub(super) fn store_new(
        &mut self,
        queue: &str,
        t: &NewTask,
        owner: Option<&str>,
        parent: Option<crate::store::ParentLink>,
        now: Now,
    ) -> (Ulid, TaskState) {
        let id = self.next_id(now);
        let not_before = [t.delay_ms.map(|d| now.wall_ms + d), t.not_before_ms]
            .into_iter()
            .flatten()
            .max()
            .filter(|&nb| nb > now.wall_ms);
        let mut rec = TaskRecord::new(queue, t, not_before, owner, now.wall_ms);
        rec.parent = parent;
        assert!(
            matches!(rec.state, TaskState::Ready | TaskState::Scheduled),
            "task {id}: a new task starts ready or scheduled, not {}",
            rec.state
        );
        if let Some(owner) = owner {
            self.budget.count(owner, rec.stored_bytes);
        }
        push_event(&mut rec, now, "enqueued", None, None, None);
        self.pending
            .put_payload(id, queue, t.payload.get(), t.idempotency_key.as_deref());
        self.save(id, &rec, None);
        self.caches.fresh.keep(id, &rec, &t.payload);
        telemetry::enqueued(queue);
        if let Some(q) = self.index.queues.get_mut(queue) {
            q.totals.enqueued += 1;
        }
        debug_assert_eq!(
            self.index.tasks[&id].state, rec.state,
            "task {id}: indexed as stored"
        );
        (id, rec.state)
    }

    /// Refuses a claim that may park when its connection or principal already has as
    /// many claims parked as allowed.
    fn check_parked(&self, waiter: &W) -> OpResult<()> {
        let on_connection = self
            .waiting
            .parked
            .count(&Parked::Connection(waiter.connection()));
        let principal = waiter.principal().map(|p| p.name.as_str());
        let by_principal = principal.map_or(0, |p| {
            self.waiting.parked.count(&Parked::Principal(p.into()))
        });
        if on_connection >= MAX_PARKED_CLAIMS_PER_CONNECTION {
            return Err(client(
                ErrorCode::Limit,
                format!(
                    "this connection has {on_connection} claims waiting already (at most {MAX_PARKED_CLAIMS_PER_CONNECTION})"
                ),
            ));
        }
        if by_principal >= MAX_PARKED_CLAIMS_PER_PRINCIPAL {
            return Err(client(
                ErrorCode::Limit,
                format!(
                    "{:?} has {by_principal} claims waiting already (at most {MAX_PARKED_CLAIMS_PER_PRINCIPAL})",
                    principal.unwrap_or_default()
                ),
            ));
        }
        Ok(())
    }

    /// Refuses an enqueue that would give its queue more than [`MAX_LABEL_CLASSES`]
    /// label sets, or give one configured token more than
    /// [`MAX_LABEL_CLASSES_PER_TOKEN`] of them. Tasks that require nothing never count:
    /// a plain enqueue is never refused for what other tokens' tasks require. The sets
    /// new to the queue are recorded as the token's.
    fn check_label_classes(&mut self, r: &Enqueue, principal: Option<&Principal>) -> OpResult<()> {
        let queue = self
            .index
            .queues
            .get_mut(&r.queue)
            .expect("the enqueue's queue was checked");
        let dispatch = &queue.dispatch;
        let new = new_label_classes(dispatch, r);
        if new.is_empty() {
            return Ok(());
        }
        let counted = dispatch.class_count() - usize::from(dispatch.knows(&[]));
        let total = counted + new.len();
        if total > MAX_LABEL_CLASSES {
            return Err(client(
                ErrorCode::Limit,
                format!(
                    "queue {:?} would hold tasks of {total} label sets (requires); at most {MAX_LABEL_CLASSES} are allowed among its unfinished tasks",
                    r.queue
                ),
            ));
        }
        let Some(tenant) = principal.filter(|p| p.is_tenant()) else {
            return Ok(());
        };
        charge_label_classes(queue, tenant, new)
    }

    fn claim_spec(&self, r: Claim) -> OpResult<(ClaimSpec, u64)> {
        if r.queues.is_empty() || r.queues.len() > MAX_CLAIM_QUEUES {
            return Err(bad(format!(
                "a claim names 1 to {MAX_CLAIM_QUEUES} queues, not {}",
                r.queues.len()
            )));
        }
        for (i, q) in r.queues.iter().enumerate() {
            if r.queues[..i].contains(q) {
                return Err(bad(format!("queue {q:?} is named twice")));
            }
            self.index.queue(q)?;
        }
        let max = r.max.unwrap_or(1);
        if max == 0 || max > MAX_CLAIM {
            return Err(bad(format!("max {max} is outside 1..={MAX_CLAIM}")));
        }
        let wait = r.wait_ms.unwrap_or(0);
        if wait > ms(MAX_WAIT) {
            return Err(bad(format!(
                "wait of {wait} ms exceeds {} ms",
                ms(MAX_WAIT)
            )));
        }
        if let Some(l) = r.lease_ms {
            check_lease("lease", l)?;
        }
        let member = r.member.unwrap_or_default();
        if !member.is_empty() {
            names::check_member(&member).map_err(bad)?;
        }
        names::check_labels(&r.labels).map_err(bad)?;
        let spec = ClaimSpec {
            queues: r.queues,
            max: max as usize,
            lease_ms: r.lease_ms,
            member,
            labels: r.labels,
            heard: 0,
        };
        Ok((spec, wait))
    }

    fn claim(&mut self, r: Claim, waiter: W, now: Now) -> Result<(), (W, Failure)> {
        let (mut spec, wait) = match self.claim_spec(r) {
            Ok(v) => v,
            Err(e) => return Err((waiter, e)),
        };
        if wait > 0
            && let Err(e) = self.check_parked(&waiter)
        {
            return Err((waiter, e));
        }
        // The claim itself is news of the claimer, after anything that happened before.
        spec.heard = self
            .members
            .heard
            .get(&waiter.connection())
            .map_or(0, |h| h.event);
        debug_assert!(
            spec.heard <= self.members.events,
            "a claimer was heard from at an event that happened"
        );
        // A drained member takes nothing new, by pull as by push.
        let tasks = if self.is_draining(&spec.member) {
            Vec::new()
        } else {
            match self.take_ready(&spec, now) {
                Ok(t) => t,
                Err(e) => return Err((waiter, e)),
            }
        };
        if !tasks.is_empty() {
            self.take_member(&spec.member, waiter.principal(), now);
        }
        if tasks.is_empty() && wait > 0 {
            self.waiting.park(ClaimWaiter {
                waiter,
                claim: spec,
                deadline: now.mono_ms + wait,
            });
        } else {
            self.outbox
                .replies
                .push((waiter, Ok(Reply::Claim(ClaimReply { tasks }))));
        }
        Ok(())
    }

    /// Leases up to `spec.max` tasks, taking one queue after another round robin.
    pub(super) fn take_ready(&mut self, spec: &ClaimSpec, now: Now) -> OpResult<Vec<Delivery>> {
        let n = spec.queues.len();
        assert!(n > 0, "a claim names at least one queue");
        let start = self.rotation % n;
        self.rotation = self.rotation.wrapping_add(1);
        let mut out: Vec<Delivery> = Vec::new();
        let mut bytes = 0;
        let mut exhausted = vec![false; n];
        let full =
            |out: &Vec<Delivery>, bytes| out.len() >= spec.max || bytes >= MAX_CLAIM_REPLY_BYTES;
        while !full(&out, bytes) && exhausted.iter().any(|e| !e) {
            for i in 0..n {
                let qi = (start + i) % n;
                if full(&out, bytes) || exhausted[qi] {
                    continue;
                }
                match self.pick(&spec.queues[qi], spec, now) {
                    Some(id) => {
                        let delivery = self.grant(id, spec, now)?;
                        bytes += delivery.bytes();
                        out.push(delivery);
                    }
                    None => exhausted[qi] = true,
                }
            }
        }
        assert!(out.len() <= spec.max, "a claim gets at most its max");
        Ok(out)
    }

    /// The next ready task of a queue that this claimer may take (and will lease at
    /// once): one whose limits have room for it now. An admitted task whose room was taken since (by another
    /// queue's lease) goes back to its line, and the next is looked at.
    fn pick(&mut self, queue: &str, spec: &ClaimSpec, now: Now) -> Option<Ulid> {
        loop {
            let id = self.candidate(queue, spec, now)?;
            let q = self.index.queues.get_mut(queue)?;
            let grantable = q
                .dispatch
                .uses(id)
                .is_none_or(|uses| self.index.limits.grantable(uses).is_ok());
            if grantable {
                // Picked for a lease: its group (in a fair queue) has had its turn, while
                // the task is still in its class (so its group is still active).
                if q.dispatch.is_fair() {
                    q.dispatch.served(self.index.grouped.get(&id));
                }
                return Some(id);
            }
            let name = Arc::clone(&q.name);
            q.dispatch.regate(
                id,
                &mut Gate {
                    limits: &mut self.index.limits,
                    queue: &name,
                },
            );
            // The room it left in its other limits' lines may admit a task behind it.
            self.admit_waiting_on_limits();
        }
    }

    /// The first dispatchable task of a queue for this claimer, limits aside.
    fn candidate(&self, queue: &str, spec: &ClaimSpec, now: Now) -> Option<Ulid> {
        let q = self.index.queues.get(queue)?;
        if q.options.paused || q.deleting {
            return None;
        }
        let picked = if self.members.avoid.is_empty() || spec.member.is_empty() {
            q.dispatch.pick(&spec.labels, |_| true, 0)
        } else {
            q.dispatch.pick(
                &spec.labels,
                |id| !self.avoided(id, &spec.member, spec.heard, now),
                super::MAX_AVOID_SKIP,
            )
        };
        debug_assert!(
            picked.is_none_or(|id| self
                .index
                .tasks
                .get(&id)
                .is_some_and(|m| m.state == TaskState::Ready && *m.queue == *queue)),
            "queue {queue:?}: the dispatch index hands out only its own ready tasks"
        );
        picked
    }

    fn grant(&mut self, id: Ulid, spec: &ClaimSpec, now: Now) -> OpResult<Delivery> {
        let rec = self.record(id)?;
        self.lease_to(id, rec, &spec.member, spec.lease_ms, now, Grant::Leased)
    }

    /// Leases a task to `member` under a new epoch.
    pub(super) fn lease_to(
        &mut self,
        id: Ulid,
        mut rec: TaskRecord,
        member: &str,
        lease_ms: Option<u64>,
        now: Now,
        grant: Grant,
    ) -> OpResult<Delivery> {
        assert_eq!(
            rec.state,
            if grant == Grant::Leased {
                TaskState::Ready
            } else {
                TaskState::Leased
            },
            "task {id}: leased from ready, or handed back to the member holding it"
        );
        // Read before the lease is written: the write ends the task's freshness.
        let payload = self.payload(id)?;
        let deadline = self.lease_deadline(id, &rec.queue, lease_ms, now)?;
        if grant == Grant::Leased
            && !rec.limits.is_empty()
            && let Some(uses) = self.index.limited.get(&id)
        {
            // A new grant takes its limits' tokens; a lease handed back to its member
            // (reclaimed, redelivered) is the same grant and takes none.
            self.index.limits.take(uses);
        }
        let expires = now.wall_ms + (deadline - now.mono_ms);
        let epoch = self.record_lease(id, &mut rec, member, expires, now, grant);
        let clock = LeaseClock {
            deadline,
            granted: now.mono_ms as i64,
        };
        self.save(id, &rec, Some(clock));
        debug_assert!(
            member.is_empty()
                || self
                    .members
                    .by_name
                    .get(member)
                    .is_some_and(|m| m.leased.contains(&id)),
            "task {id}: the member its lease names holds it"
        );
        let lease_ms = deadline - now.mono_ms;
        let mut d = delivery(id, &rec, payload, epoch, expires, lease_ms, grant);
        d.output = self.output.next(id);
        Ok(d)
    }

    /// When a lease granted now runs out on the monotonic clock: after `lease_ms` (the
    /// queue's lease by default), and never past the queue's `max_runtime_ms`.
    fn lease_deadline(
        &self,
        id: Ulid,
        queue: &str,
        lease_ms: Option<u64>,
        now: Now,
    ) -> OpResult<u64> {
        let options = &self.index.queue(queue)?.options;
        let lease = lease_ms.unwrap_or(options.lease_ms);
        let mut deadline = now.mono_ms + lease;
        if let Some(max) = options.max_runtime_ms {
            deadline = deadline.min(now.mono_ms + max);
        }
        assert!(
            deadline > now.mono_ms,
            "task {id}: a lease's deadline lies after now"
        );
        Ok(deadline)
    }

    /// Writes a lease to `member` until `expires` (wall time) on the task's record,
    /// under the next epoch, which it returns.
    fn record_lease(
        &self,
        id: Ulid,
        rec: &mut TaskRecord,
        member: &str,
        expires: u64,
        now: Now,
        grant: Grant,
    ) -> u64 {
        if grant == Grant::Leased {
            // Since it became ready: enqueued, promoted after its delay, or made ready again
            // (each of which sets `updated_ms`); recorded for its first lease only.
            let first_wait =
                (rec.deliveries == 0).then(|| now.wall_ms.saturating_sub(rec.updated_ms));
            telemetry::leased(&rec.queue, first_wait);
        }
        rec.deliveries += 1;
        let epoch = rec.deliveries;
        assert!(
            epoch > self.index.tasks[&id].epoch,
            "task {id}: a lease's epoch is above every earlier one"
        );
        rec.state = TaskState::Leased;
        rec.not_before_ms = None;
        rec.lease = Some(LeaseRecord {
            member: member.to_owned(),
            epoch,
            expires_ms: expires,
            granted_ms: now.wall_ms,
        });
        rec.updated_ms = now.wall_ms;
        let event = match grant {
            Grant::Leased => "leased",
            Grant::Reclaimed => "reclaimed",
            Grant::Redelivered => "redelivered",
        };
        push_event(rec, now, event, Some(member), Some(epoch), None);
        epoch
    }

    /// The record of a task leased under `epoch`, or `lease_lost`.
    pub(super) fn held(&self, task: &str, epoch: u64) -> OpResult<(Ulid, TaskRecord)> {
        let id = parse_id(task)?;
        let meta = self
            .index
            .tasks
            .get(&id)
            .ok_or_else(|| client(ErrorCode::NotFound, format!("no task {id}")))?;
        if meta.state != TaskState::Leased || meta.epoch != epoch {
            return Err(client(
                ErrorCode::LeaseLost,
                format!(
                    "task {id} epoch {epoch} is not held: the task is {} at epoch {}",
                    meta.state, meta.epoch
                ),
            ));
        }
        debug_assert!(
            meta.held.is_some(),
            "task {id}: a leased task's index entry holds its lease"
        );
        Ok((id, self.record(id)?))
    }

    fn ack(&mut self, r: Ack, now: Now) -> OpResult<SettleReply> {
        check_size("result", r.result.as_ref(), MAX_RESULT_BYTES)?;
        let (id, mut rec) = self.held(&r.task, r.epoch)?;
        let member = rec.lease.as_ref().map(|l| l.member.clone());
        let result = match r.result {
            // The agent finishes its task; the disk does not fill with its result.
            Some(result)
                if self.budget.disk_alarm && result.get().len() > MAX_RESULT_BYTES_UNDER_ALARM =>
            {
                Some(truncated_result(result.get().len()))
            }
            result => result,
        };
        let was = json_len(&rec.result);
        self.budget.recount(&mut rec, was, json_len(&result));
        rec.result = result;
        telemetry::lease_ended(
            id,
            &rec,
            rec.lease.as_ref().expect("a held task has a lease"),
            LeaseEnd::Acked,
            now.wall_ms,
        );
        if let Some(q) = self.index.queues.get_mut(&rec.queue) {
            q.totals.acked += 1;
        }
        push_event(
            &mut rec,
            now,
            "done",
            member.as_deref(),
            Some(r.epoch),
            None,
        );
        if !self.cancel_if_requested(&mut rec, now, None, None) {
            self.finish(&mut rec, TaskState::Done, now);
        }
        assert!(rec.lease.is_none(), "task {id}: acked, its lease ended");
        assert!(
            rec.state.is_finished(),
            "task {id}: an ack finishes its task, not {}",
            rec.state
        );
        let to = rec.state;
        self.save(id, &rec, None);
        Ok(SettleReply {
            state: to,
            not_before_ms: None,
        })
    }

    fn nack(&mut self, r: Nack, now: Now) -> OpResult<SettleReply> {
        if let Some(d) = r.delay_ms
            && d > ms(MAX_DELAY)
        {
            return Err(bad("delay exceeds one year"));
        }
        let error = r.error.unwrap_or_else(|| "nacked".into());
        check_error_text(&error)?;
        let (id, mut rec) = self.held(&r.task, r.epoch)?;
        telemetry::lease_ended(
            id,
            &rec,
            rec.lease.as_ref().expect("a held task has a lease"),
            LeaseEnd::Nacked,
            now.wall_ms,
        );
        if let Some(q) = self.index.queues.get_mut(&rec.queue) {
            q.totals.nacked += 1;
        }
        let member = rec.lease.as_ref().map(|l| l.member.clone());
        push_event(
            &mut rec,
            now,
            "nacked",
            member.as_deref(),
            Some(r.epoch),
            Some(&error),
        );
        let failures = rec.failures;
        let state = self.fail(id, &mut rec, now, error, r.delay_ms);
        assert!(
            rec.failures >= failures,
            "task {id}: a nack never lowers its failures"
        );
        Ok(SettleReply {
            state,
            not_before_ms: rec.not_before_ms,
        })
    }

    fn renew(&mut self, r: Renew, now: Now) -> OpResult<RenewReply> {
        if let Some(e) = r.extend_ms {
            check_lease("extend", e)?;
        }
        check_size("progress", r.progress.as_ref(), MAX_PROGRESS_BYTES)?;
        let (id, mut rec) = self.held(&r.task, r.epoch)?;
        let options = &self.index.queue(&rec.queue)?.options;
        let mut clock = self.index.tasks[&id]
            .clock()
            .expect("a held task has a lease clock");
        let cap = clock.runtime_cap(options.max_runtime_ms);
        // Every lease's deadline stays within its runtime cap (grants, renewals, queue
        // updates and restarts keep it so): a lease past its cap lapses this round.
        assert!(
            clock.deadline <= cap,
            "task {id}: deadline past its runtime cap"
        );
        if cap <= now.mono_ms {
            return Err(client(
                ErrorCode::LeaseLost,
                format!(
                    "task {id} epoch {} reached the queue's max_runtime of {} ms: its lease ends now",
                    r.epoch,
                    options.max_runtime_ms.unwrap_or_default()
                ),
            ));
        }
        let deadline = (now.mono_ms + r.extend_ms.unwrap_or(options.lease_ms)).min(cap);
        assert!(
            deadline > now.mono_ms,
            "task {id}: a renewed lease's deadline lies after now"
        );
        // A restart gives the lease the longer of a full period and what its stored
        // expiry has left: a plain renewal's deadline holds across one without being
        // written while the stored expiry is within that period too (else a restart
        // would keep a shortened lease long, its holder perhaps dead with the daemon).
        let plain_until = (r.progress.is_none() && deadline <= now.mono_ms + options.lease_ms)
            .then_some(now.wall_ms + options.lease_ms);
        clock.deadline = deadline;
        let expires = now.wall_ms + deadline.saturating_sub(now.mono_ms);
        if let Some(lease) = rec.lease.as_mut() {
            lease.expires_ms = expires;
        }
        // Under the disk alarm the lease is renewed but a new checkpoint is not stored:
        // a reclaim then resumes from the last one stored before it.
        if r.progress.is_some() && !self.budget.disk_alarm {
            let was = json_len(&rec.progress);
            self.budget.recount(&mut rec, was, json_len(&r.progress));
            rec.progress = r.progress;
        }
        let cancel_requested = rec.cancel_requested;
        self.renew_lease(id, rec, clock, plain_until);
        Ok(RenewReply {
            lease_expires_ms: expires,
            lease_ms: deadline.saturating_sub(now.mono_ms),
            cancel_requested,
        })
    }

    fn release(&mut self, r: muster_protocol::ops::Release, now: Now) -> OpResult<SettleReply> {
        let Release { task, epoch } = r;
        let (id, mut rec) = self.held(&task, epoch)?;
        telemetry::lease_ended(
            id,
            &rec,
            rec.lease.as_ref().expect("a held task has a lease"),
            LeaseEnd::Released,
            now.wall_ms,
        );
        let member = rec.lease.take().map(|l| l.member);
        assert!(
            member.is_some(),
            "task {id}: a held task has a lease to release"
        );
        push_event(
            &mut rec,
            now,
            "released",
            member.as_deref(),
            Some(epoch),
            None,
        );
        if !self.cancel_if_requested(&mut rec, now, None, None) {
            rec.state = TaskState::Ready;
            rec.updated_ms = now.wall_ms;
        }
        assert!(
            matches!(rec.state, TaskState::Ready | TaskState::Cancelled),
            "task {id}: released to {}",
            rec.state
        );
        self.save(id, &rec, None);
        Ok(SettleReply {
            state: rec.state,
            not_before_ms: None,
        })
    }

    fn dead_letter(&mut self, r: DeadLetter, now: Now) -> OpResult<SettleReply> {
        check_error_text(&r.error)?;
        let (id, mut rec) = self.held(&r.task, r.epoch)?;
        telemetry::lease_ended(
            id,
            &rec,
            rec.lease.as_ref().expect("a held task has a lease"),
            LeaseEnd::DeadLettered,
            now.wall_ms,
        );
        let member = rec.lease.take().map(|l| l.member);
        assert!(
            member.is_some(),
            "task {id}: a held task has a lease to end"
        );
        push_event(
            &mut rec,
            now,
            "dead_lettered",
            member.as_deref(),
            Some(r.epoch),
            Some(&r.error),
        );
        rec.last_error = Some(r.error);
        if !self.cancel_if_requested(&mut rec, now, None, None) {
            rec.state = TaskState::Dead;
            rec.dead_reason = Some(telemetry::DEAD_BY_AGENT.into());
            telemetry::dead(id, &rec.queue, telemetry::DEAD_BY_AGENT);
            rec.updated_ms = now.wall_ms;
        }
        assert!(
            matches!(rec.state, TaskState::Dead | TaskState::Cancelled),
            "task {id}: dead-lettered to {}",
            rec.state
        );
        self.save(id, &rec, None);
        Ok(SettleReply {
            state: rec.state,
            not_before_ms: None,
        })
    }

    pub(super) fn task_info(&self, id: Ulid) -> OpResult<TaskInfo> {
        let rec = self.record(id)?;
        let waiting_on = self
            .index
            .queues
            .get(rec.queue.as_str())
            .and_then(|q| q.dispatch.waiting_on(id))
            .map(|(limit, key)| muster_protocol::model::LimitKey {
                limit: limit.to_string(),
                key: key.to_string(),
            });
        Ok(TaskInfo {
            id: id.to_string(),
            payload: self.payload(id)?,
            lease: lease_info(&rec),
            queue: rec.queue,
            state: rec.state,
            priority: rec.priority,
            key: rec.key,
            requires: rec.requires,
            limits: rec
                .limits
                .into_iter()
                .map(|l| muster_protocol::model::LimitUse {
                    limit: l.limit,
                    key: l.key,
                    cost: Some(l.cost),
                })
                .collect(),
            group: rec.group,
            waiting_on,
            not_before_ms: rec.not_before_ms,
            idempotency_key: rec.idempotency_key,
            deliveries: rec.deliveries,
            failures: rec.failures,
            cancel_requested: rec.cancel_requested,
            progress: rec.progress,
            result: rec.result,
            last_error: rec.last_error,
            dead_reason: rec.dead_reason,
            suspension: rec.suspension.map(|s| Box::new(s.info)),
            resumed: rec.resumed.map(Box::new),
            children: self.child_summaries(id),
            output: self.output.summary(id),
            parent: rec.parent.as_ref().map(|p| p.id.to_string()),
            child_key: rec.parent.map(|p| p.child_key),
            traceparent: rec.traceparent,
            tracestate: rec.tracestate,
            created_ms: rec.created_ms,
            updated_ms: rec.updated_ms,
            history: rec.history,
        })
    }

    fn task_get(&self, r: TaskGet) -> OpResult<TaskReply> {
        let id = parse_id(&r.task)?;
        Ok(TaskReply {
            task: self.task_info(id)?,
        })
    }

    fn task_list(&self, r: TaskList) -> OpResult<TaskListReply> {
        let q = self.index.queue(&r.queue)?;
        let limit = r.limit.unwrap_or(100);
        if limit == 0 || limit > MAX_PAGE {
            return Err(bad(format!("limit {limit} is outside 1..={MAX_PAGE}")));
        }
        let after = match &r.after {
            Some(a) => Bound::Excluded(parse_id(a)?),
            None => Bound::Unbounded,
        };
        let page = fill(
            q.ids(r.state)
                .range((after, Bound::Unbounded))
                .map(|&id| Ok::<_, Failure>(summary(id, &self.record(id)?))),
            limit as usize,
            |t| t.id.clone(),
        )?;
        Ok(TaskListReply {
            tasks: page.items,
            next: page.next,
        })
    }

    fn wait(&mut self, r: Wait, waiter: W, now: Now) -> Result<(), (W, Failure)> {
        let parsed: OpResult<(Vec<Ulid>, u64)> = (|| {
            if r.tasks.is_empty() || r.tasks.len() > MAX_IDS {
                return Err(bad(format!("a wait names 1 to {MAX_IDS} tasks")));
            }
            let timeout = r.timeout_ms.unwrap_or(0);
            if timeout > ms(MAX_WAIT) {
                return Err(bad(format!(
                    "timeout of {timeout} ms exceeds {} ms",
                    ms(MAX_WAIT)
                )));
            }
            let mut ids = Vec::with_capacity(r.tasks.len());
            for t in &r.tasks {
                let id = parse_id(t)?;
                if !self.index.tasks.contains_key(&id) {
                    return Err(client(ErrorCode::NotFound, format!("no task {id}")));
                }
                ids.push(id);
            }
            // Each task is answered once, however often it is named.
            let mut seen = std::collections::HashSet::with_capacity(ids.len());
            ids.retain(|id| seen.insert(*id));
            Ok((ids, timeout))
        })();
        let (ids, timeout) = match parsed {
            Ok(v) => v,
            Err(e) => return Err((waiter, e)),
        };
        let wait = TaskWait {
            waiter,
            ids,
            deadline: now.mono_ms + timeout,
        };
        if timeout == 0 || self.wait_over(&wait) {
            self.answer_wait(wait).map_err(|e| e.into_waiter_error())?;
        } else {
            self.waiting.task_waits.push(wait);
        }
        Ok(())
    }

    fn wait_over(&self, wait: &TaskWait<W>) -> bool {
        wait.ids.iter().all(|id| {
            self.index
                .tasks
                .get(id)
                .is_none_or(|m| m.state.is_finished())
        })
    }

    fn answer_wait(&mut self, wait: TaskWait<W>) -> Result<(), WaitFailure<W>> {
        let mut reply = WaitReply {
            finished: Vec::new(),
            omitted: Vec::new(),
            pending: Vec::new(),
            removed: Vec::new(),
        };
        let mut bytes = 0;
        for &id in &wait.ids {
            match self.index.tasks.get(&id) {
                None => reply.removed.push(id.to_string()),
                Some(m) if m.state.is_finished() => {
                    if !reply.finished.is_empty() && bytes >= MAX_LISTING_BYTES {
                        reply.omitted.push(id.to_string());
                        continue;
                    }
                    let info = match self.task_info(id) {
                        Ok(info) => info,
                        Err(f) => return Err(WaitFailure(wait.waiter, f)),
                    };
                    let len = listing::json_len(&info);
                    if !reply.finished.is_empty() && bytes + len > MAX_LISTING_BYTES {
                        reply.omitted.push(id.to_string());
                    } else {
                        bytes += len;
                        reply.finished.push(info);
                    }
                }
                Some(_) => reply.pending.push(id.to_string()),
            }
        }
        assert_eq!(
            reply.finished.len() + reply.omitted.len() + reply.pending.len() + reply.removed.len(),
            wait.ids.len(),
            "every task of a wait is answered once"
        );
        self.outbox
            .replies
            .push((wait.waiter, Ok(Reply::Wait(reply))));
        Ok(())
    }

    /// Serves parked claims when tasks became available, and ends those past their wait.
    pub(super) fn serve_claims(
        &mut self,
        ready: &super::ReadyChanged,
        now: Now,
    ) -> Result<(), StoreError> {
        let waiters = std::mem::take(&mut self.waiting.claim_waiters);
        let mut keep = Vec::with_capacity(waiters.len());
        let liveness = muster_protocol::limits::DEFAULT_LIVENESS.as_millis() as u64;
        for mut w in waiters {
            if w.waiter.is_closed() {
                continue;
            }
            // A claim parked by a connection gone silent (a crashed or cut-off client)
            // gets nothing: a lease granted to it would only lapse.
            let heard = self.members.heard.get(&w.waiter.connection()).copied();
            w.claim.heard = heard.map_or(0, |h| h.event);
            let alive = heard.is_some_and(|h| now.mono_ms.saturating_sub(h.at_ms) <= liveness);
            let serve = ready.touches(w.claim.queues.iter().map(String::as_str));
            if serve && alive && !self.is_draining(&w.claim.member) {
                match self.take_ready(&w.claim, now) {
                    Ok(tasks) if !tasks.is_empty() => {
                        self.take_member(&w.claim.member, w.waiter.principal(), now);
                        self.outbox
                            .replies
                            .push((w.waiter, Ok(Reply::Claim(ClaimReply { tasks }))));
                        continue;
                    }
                    Ok(_) => {}
                    Err(Failure::Client(e)) => {
                        self.outbox.replies.push((w.waiter, Err(e)));
                        continue;
                    }
                    Err(Failure::Store(e)) => return Err(e),
                }
            }
            if w.deadline <= now.mono_ms {
                self.outbox
                    .replies
                    .push((w.waiter, Ok(Reply::Claim(ClaimReply { tasks: Vec::new() }))));
                continue;
            }
            keep.push(w);
        }
        self.waiting.repark(keep);
        debug_assert!(
            self.waiting
                .claim_waiters
                .iter()
                .all(|w| w.deadline > now.mono_ms),
            "every parked claim past its deadline was answered"
        );
        Ok(())
    }

    /// Answers waits whose tasks all finished or whose timeout passed.
    pub(super) fn serve_waits(&mut self, now: Now) -> Result<(), StoreError> {
        let changed = std::mem::take(&mut self.waiting.finished_changed);
        let waits = std::mem::take(&mut self.waiting.task_waits);
        for w in waits {
            if w.waiter.is_closed() {
                continue;
            }
            if (changed && self.wait_over(&w)) || w.deadline <= now.mono_ms {
                match self.answer_wait(w) {
                    Ok(()) => {}
                    Err(WaitFailure(waiter, Failure::Client(e))) => {
                        self.outbox.replies.push((waiter, Err(e)))
                    }
                    Err(WaitFailure(_, Failure::Store(e))) => return Err(e),
                }
            } else {
                self.waiting.task_waits.push(w);
            }
        }
        debug_assert!(
            self.waiting
                .task_waits
                .iter()
                .all(|w| w.deadline > now.mono_ms),
            "every wait past its timeout was answered"
        );
        Ok(())
    }

    /// Cancels a task; with `if_state`, only a task in that state (a reject is a
    /// cancel `if_state` suspended), checked in the same step as the cancel.
    fn cancel(&mut self, r: Cancel, now: Now) -> OpResult<CancelReply> {
        let id = parse_id(&r.task)?;
        if let Some(state @ (TaskState::Done | TaskState::Dead)) = r.if_state {
            return Err(bad(format!(
                "if_state {state}: a {state} task is never cancelled"
            )));
        }
        let rec = self.record(id)?;
        if let Some(wanted) = r.if_state
            && rec.state != wanted
        {
            return Err(client(
                ErrorCode::InvalidState,
                format!("task {id} is {}, not {wanted}: nothing was done", rec.state),
            ));
        }
        if matches!(rec.state, TaskState::Done | TaskState::Dead) {
            return Err(client(
                ErrorCode::InvalidState,
                format!("task {id} is {} and cannot be cancelled", rec.state),
            ));
        }
        Ok(self.cancel_task(id, rec, now, None))
    }

    /// Cancels an unfinished task (asks its holder to, when leased; a cancelled one
    /// stays as it is), noting `why` in its timeline; its unfinished children follow
    /// ([`Families`](super::family::Families)).
    pub(super) fn cancel_task(
        &mut self,
        id: Ulid,
        mut rec: TaskRecord,
        now: Now,
        why: Option<&str>,
    ) -> CancelReply {
        match rec.state {
            TaskState::Ready | TaskState::Scheduled | TaskState::Suspended => {
                push_event(&mut rec, now, "cancelled", None, None, why);
                self.finish(&mut rec, TaskState::Cancelled, now);
                self.save(id, &rec, None);
                CancelReply {
                    state: TaskState::Cancelled,
                    cancel_requested: false,
                }
            }
            TaskState::Leased => {
                if !rec.cancel_requested {
                    rec.cancel_requested = true;
                    rec.updated_ms = now.wall_ms;
                    push_event(&mut rec, now, "cancel_requested", None, None, why);
                    let meta = &self.index.tasks[&id];
                    let (clock, member) = (meta.clock(), meta.member().cloned());
                    self.save(id, &rec, clock);
                    debug_assert_eq!(
                        self.index.tasks[&id].clock(),
                        clock,
                        "task {id}: a cancel request leaves its lease as it was"
                    );
                    if let Some(member) = member {
                        let epoch = rec.lease.as_ref().map_or(rec.deliveries, |l| l.epoch);
                        let lease = muster_protocol::ops::LeaseRef {
                            task: id.to_string(),
                            epoch,
                        };
                        self.push_to(&member, muster_protocol::Push::Cancel(lease));
                    }
                    self.index.family.cascade_from(id);
                }
                CancelReply {
                    state: TaskState::Leased,
                    cancel_requested: true,
                }
            }
            TaskState::Cancelled => CancelReply {
                state: TaskState::Cancelled,
                cancel_requested: false,
            },
            TaskState::Done | TaskState::Dead => {
                unreachable!("task {id}: a finished task is not cancelled")
            }
        }
    }

    /// Changes a waiting task's priority, or makes a scheduled task ready now. Every
    /// value is checked before the task is looked at; a task that no longer waits is
    /// refused whole. A request that changes nothing (the same priority, `run_now` of a
    /// ready task) writes nothing and records no event.
    fn task_update(&mut self, r: &TaskUpdate, now: Now) -> OpResult<TaskUpdateReply> {
        let id = parse_id(&r.task)?;
        if r.priority.is_none() && !r.run_now {
            return Err(bad("name a change: priority, run_now or both"));
        }
        if let Some(p) = r.priority
            && p > MAX_PRIORITY
        {
            return Err(bad(format!(
                "priority {p} is out of range 0..={MAX_PRIORITY}"
            )));
        }
        let mut rec = self.record(id)?;
        if !matches!(rec.state, TaskState::Ready | TaskState::Scheduled) {
            return Err(client(
                ErrorCode::InvalidState,
                format!(
                    "task {id} is {}: only ready and scheduled tasks can be updated",
                    rec.state
                ),
            ));
        }
        let mut changed = false;
        if let Some(p) = r.priority.filter(|p| *p != rec.priority) {
            rec.priority = p;
            push_event(&mut rec, now, "priority_changed", None, None, None);
            changed = true;
        }
        if r.run_now && rec.state == TaskState::Scheduled {
            rec.state = TaskState::Ready;
            rec.not_before_ms = None;
            push_event(&mut rec, now, "run_now", None, None, None);
            changed = true;
        }
        assert!(
            rec.priority <= MAX_PRIORITY,
            "task {id}: a priority within 0..={MAX_PRIORITY}"
        );
        if changed {
            rec.updated_ms = now.wall_ms;
            // Re-indexed from the record: its place in the dispatch order follows the
            // new priority, and a task made ready leaves the timer of scheduled tasks.
            self.save(id, &rec, None);
        }
        Ok(TaskUpdateReply {
            task: summary(id, &rec),
        })
    }

    /// Resolves a selection of dead tasks, refusing it whole if any named task is not dead.
    fn dead_selection(&self, sel: &DeadSelection) -> OpResult<Vec<Ulid>> {
        let q = self.index.queue(&sel.queue)?;
        if sel.all {
            return Ok(q.ids(TaskState::Dead).iter().copied().collect());
        }
        if sel.ids.is_empty() || sel.ids.len() > MAX_IDS {
            return Err(bad(format!("name 1 to {MAX_IDS} task ids, or all")));
        }
        let mut ids = Vec::with_capacity(sel.ids.len());
        for s in &sel.ids {
            let id = parse_id(s)?;
            match self.index.tasks.get(&id) {
                Some(m) if *m.queue == *sel.queue && m.state == TaskState::Dead => ids.push(id),
                Some(m) if *m.queue == *sel.queue => {
                    return Err(client(
                        ErrorCode::InvalidState,
                        format!("task {id} is {}, not dead", m.state),
                    ));
                }
                _ => {
                    return Err(client(
                        ErrorCode::NotFound,
                        format!("no task {id} in queue {:?}", sel.queue),
                    ));
                }
            }
        }
        ids.sort_unstable();
        ids.dedup();
        Ok(ids)
    }
}

struct WaitFailure<W>(W, Failure);

impl<W> WaitFailure<W> {
    fn into_waiter_error(self) -> (W, Failure) {
        (self.0, self.1)
    }
}

/// The length of an optional JSON value, 0 for none.
fn json_len(value: &Option<muster_protocol::RawJson>) -> u64 {
    value.as_ref().map_or(0, |v| v.get().len() as u64)
}

/// Largest result an ack stores while the disk alarm is on; a larger one is replaced by
/// [`truncated_result`].
pub const MAX_RESULT_BYTES_UNDER_ALARM: usize = 1024;

/// What an ack's result of `bytes` bytes is stored as while the disk alarm is on.
pub(super) fn truncated_result(bytes: usize) -> muster_protocol::RawJson {
    muster_protocol::ops::raw(&format!(
        r#"{{"muster_truncated":{{"reason":"disk_alarm","bytes":{bytes}}}}}"#
    ))
    .expect("the truncation marker is JSON")
}

/// Longest directory name `admin_snapshot` takes, in bytes (Linux's PATH_MAX).
const MAX_SNAPSHOT_DIR_BYTES: usize = 4096;

/// Checks the form of a snapshot's directory: at most [`MAX_SNAPSHOT_DIR_BYTES`], no
/// NUL, no `.` or `..` component. Where it may be created (inside the snapshot root) is
/// the dispatcher's to find out (the engine does no I/O but through the store).
fn snapshot_dir(dir: &str) -> OpResult<std::path::PathBuf> {
    use std::path::Component;
    let path = std::path::Path::new(dir);
    if dir.is_empty() || dir.len() > MAX_SNAPSHOT_DIR_BYTES || dir.contains('\0') {
        return Err(bad(format!(
            "snapshot directory {dir:?} must be a path of 1 to {MAX_SNAPSHOT_DIR_BYTES} bytes"
        )));
    }
    if path
        .components()
        .any(|c| matches!(c, Component::ParentDir | Component::CurDir))
        || path.file_name().is_none()
    {
        return Err(bad(format!(
            "snapshot directory {dir:?} must name a new directory without . or .. in it"
        )));
    }
    Ok(path.to_path_buf())
}

/// When the lease of a held task was granted.
fn count_reply(ids: &[Ulid], list: bool) -> CountReply {
    CountReply {
        count: ids.len() as u64,
        ids: if list {
            ids.iter().take(MAX_IDS).map(Ulid::to_string).collect()
        } else {
            Vec::new()
        },
    }
}

impl<W: Waiter> Engine<W> {
    /// A queue with its counts, what its key lines hold back, and what no connected
    /// member can take (kept by its dispatch index: the cost is the unclaimable
    /// classes, at most `MAX_LABEL_CLASSES`, not the members).
    pub(super) fn queue_info(&self, name: &str, q: &Queue) -> QueueInfo {
        let mut counts = StateCounts::default();
        for state in TaskState::ALL {
            *counts.get_mut(state) = q.ids(state).len() as u64;
        }
        let unclaimable = q.dispatch.unclaimable();
        let mut unclaimed: Vec<(usize, &[String])> = q
            .dispatch
            .unclaimable_classes()
            .map(|(class, ready)| (ready, &class[..]))
            .collect();
        let unclaimable_sets = unclaimed.len() as u64;
        // The sets holding the most tasks first; ties by name, so the reply is stable.
        unclaimed.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(b.1)));
        let mut unclaimable_requires: Vec<Vec<String>> = unclaimed
            .iter()
            .take(MAX_LISTED_LABEL_SETS)
            .map(|(_, class)| class.to_vec())
            .collect();
        unclaimable_requires.sort();
        debug_assert!(
            unclaimable + q.dispatch.held_back() <= counts.get(TaskState::Ready),
            "queue {name:?}: unclaimable and held-back tasks are ready ones"
        );
        QueueInfo {
            name: name.to_owned(),
            options: q.options.clone(),
            counts,
            held_back: q.dispatch.held_back(),
            unclaimable,
            waiting_on_limits: q.dispatch.waiting_on_limits(),
            unclaimable_requires,
            unclaimable_sets,
            consumers: self.consumers(name),
            totals: q.totals,
            oldest_ready_ms: q.ids(TaskState::Ready).first().map(|id| id.timestamp_ms()),
            created_ms: q.created_ms,
        }
    }
}
