//! Authorization: what a principal may do, op by op (when tokens are configured).
//!
//! | op | role | queue checked |
//! |----|------|---------------|
//! | `queue_create`, `queue_update`, `queue_pause`, `queue_resume`, `queue_purge`, `queue_delete` | admin | the queue |
//! | `queue_list` | any | lists only covered queues |
//! | `queue_describe` | any | the queue |
//! | `enqueue` | produce | the queue |
//! | `claim` | consume | every queue; a named member must be free or the principal's, and match its member patterns |
//! | `ack`, `nack`, `renew`, `release`, `throttled`, `dead_letter`, `suspend` | consume | the task's queue; the lease's member must be the principal's |
//! | `spawn` | consume, and produce | consume: the parent's queue, the lease's member the principal's; produce: every child's queue |
//! | `emit` | consume | the task's queue; the lease's member must be the principal's |
//! | `follow` | produce, consume or approve | the task's queue |
//! | `resume` with a token | approve or consume | the task's queue |
//! | `resume` by task id | approve | the task's queue |
//! | `task_get` | produce, consume or approve | the task's queue |
//! | `wait` | produce | every task's queue |
//! | `cancel` | produce; approve for a suspended task, or with `if_state` suspended | the task's queue |
//! | `task_list`, `redrive`, `discard` | admin (approve too: `task_list` of `suspended` tasks) | the queue |
//! | `task_find` | admin (approve too: with state `suspended`) | the queue; without one, searches only covered queues |
//! | `session_open` | consume | the member must be free or the principal's and match its member patterns; every queue the member holds leases in |
//! | `session_update`, `unsubscribe` | consume | (the session is the connection's own) |
//! | `subscribe` | consume | every queue |
//! | `member_list` | admin | a queue-scoped admin lists only members with a lease or a subscription in a covered queue |
//! | `member_describe`, `member_drain`, `member_undrain` | admin | the member must have a lease or a subscription in a covered queue (any member for an admin of every queue) |
//! | `member_release` | admin, of every queue | the member must have no session and no lease |
//! | `lease_revoke`, `task_update` | admin | the task's queue |
//! | `server_stats` | admin | |
//! | `cluster_status` | admin | |
//! | `cluster_add`, `cluster_remove` | admin | every queue |
//! | `admin_snapshot` | admin, of every queue | |
//! | `schedule_set` | admin | the schedule's queue (the old one too, when it moves) |
//! | `schedule_pause`, `schedule_resume`, `schedule_delete` | admin | the schedule's queue |
//! | `schedule_run` | produce | the schedule's queue |
//! | `schedule_get` | any | the schedule's queue |
//! | `schedule_list` | any | lists only schedules of covered queues |
//! | `watch` | admin (approve too: a queue's `suspended` tasks, a suspended task; any role: limits, schedules) | the view's queue or task; queue, dead and schedule screens show only covered queues; member screens: admin of every queue |
//! | `unwatch` | admin | |
//!
//! Admin holds every role. A member name belongs to the principal that first used it
//! in a session or in a claim that got tasks (recorded in the store); no other
//! principal can open its session, claim in its name or settle its leases.

use std::collections::HashMap;
use std::time::Duration;

use ulid::Ulid;

use muster_protocol::model::TaskState;
use muster_protocol::ops::{Claim, SessionOpen, View};
use muster_protocol::ops::{EdgeRequest, EngineRequest};
use muster_protocol::{ErrorBody, ErrorCode};

use super::{Engine, Now, Waiter};
use crate::auth::{Principal, Role};
use crate::store::Batch;

/// Most member names one principal may hold: a swarm's worth of agents. Each binding
/// is a store entry loaded at start and a map entry in memory (~100 bytes), so one
/// token can make the daemon keep at most ~400 KiB and start ~4,096 rows slower;
/// past it, `session_open` and claims naming a new member get `limit`.
pub const MAX_MEMBER_NAMES_PER_PRINCIPAL: usize = 4096;

/// How long a member name stays bound to its principal with no session and no lease
/// (counted from the last moment it had either, or from the daemon's start):
/// `--member-name-expiry`. A day outlasts any restart of an agent that still needs
/// its name; a name left behind is free again after it.
pub const DEFAULT_MEMBER_NAME_EXPIRY: Duration = Duration::from_secs(24 * 60 * 60);

/// Shortest `--member-name-expiry`.
pub const MIN_MEMBER_NAME_EXPIRY: Duration = Duration::from_secs(1);

/// Longest time between two sweeps for expired member names: expiry is late by at
/// most this (or an eighth of the expiry, if shorter).
const MAX_MEMBER_NAME_SWEEP: Duration = Duration::from_secs(60);

/// Member names bound to the principal that first used each, kept in the store.
pub(super) struct Owners {
    by_member: HashMap<String, Owner>,
    /// How many names each principal holds (at most
    /// [`MAX_MEMBER_NAMES_PER_PRINCIPAL`] when bound through [`Engine::take_member`]).
    per_principal: HashMap<String, usize>,
    expiry_ms: u64,
    /// Monotonic time of the next sweep for expired names.
    sweep_at: u64,
}

struct Owner {
    principal: String,
    /// Monotonic time the name last had a session or a lease (or the daemon started).
    used_ms: u64,
}

impl Owners {
    /// The bindings read from the store, each counted as used `now`.
    pub(super) fn new(bindings: Vec<(String, String)>, now: Now) -> Owners {
        let mut owners = Owners {
            by_member: HashMap::with_capacity(bindings.len()),
            per_principal: HashMap::new(),
            expiry_ms: DEFAULT_MEMBER_NAME_EXPIRY.as_millis() as u64,
            sweep_at: now.mono_ms,
        };
        for (member, principal) in bindings {
            *owners.per_principal.entry(principal.clone()).or_default() += 1;
            owners.by_member.insert(
                member,
                Owner {
                    principal,
                    used_ms: now.mono_ms,
                },
            );
        }
        debug_assert_eq!(
            owners.per_principal.values().sum::<usize>(),
            owners.by_member.len(),
            "each stored member name is bound once and counted under its principal"
        );
        owners
    }

    /// Bound names (for the debug digest of refused requests).
    #[cfg(debug_assertions)]
    pub(super) fn len(&self) -> usize {
        self.by_member.len()
    }

    /// Monotonic time of the next sweep, if any name is bound.
    pub(super) fn next_sweep(&self) -> Option<u64> {
        (!self.by_member.is_empty()).then_some(self.sweep_at)
    }

    fn owner(&self, member: &str) -> Option<&str> {
        self.by_member.get(member).map(|o| &*o.principal)
    }

    fn remove(&mut self, member: &str, pending: &mut Batch) -> bool {
        let Some(owner) = self.by_member.remove(member) else {
            return false;
        };
        let count = self
            .per_principal
            .get_mut(&owner.principal)
            .expect("every binding is counted under its principal");
        assert!(*count > 0, "a principal's binding count never underflows");
        *count -= 1;
        if *count == 0 {
            self.per_principal.remove(&owner.principal);
        }
        pending.remove_owner(member);
        true
    }
}

const ADMIN: &[Role] = &[Role::Admin];
const PRODUCE: &[Role] = &[Role::Produce];
const CONSUME: &[Role] = &[Role::Consume];
const READ: &[Role] = &[Role::Produce, Role::Consume, Role::Approve];
const APPROVE: &[Role] = &[Role::Approve];
const ADMIN_OR_APPROVE: &[Role] = &[Role::Admin, Role::Approve];
const RESUME_BY_TOKEN: &[Role] = &[Role::Approve, Role::Consume];
/// Any role: what reading the limits needs (`limit_get`, `limit_list`, their watch).
const ANY_ROLE: &[Role] = &[Role::Produce, Role::Consume, Role::Approve, Role::Admin];

/// Checks an op the connection answers itself past `hello` (which anyone may send):
/// `server_stats`, and on a cluster node `cluster_status`, `cluster_add`,
/// `cluster_remove`. Its rules need no engine state; they are kept here with every
/// other op's.
pub fn authorize_edge(req: &EdgeRequest, p: &Principal) -> Result<(), ErrorBody> {
    match req {
        EdgeRequest::ServerStats(_) => p.check(ADMIN, None),
        EdgeRequest::ClusterStatus(_) => p.check(ADMIN, None),
        // A membership change can take the whole cluster's availability: only for an
        // admin of every queue.
        EdgeRequest::ClusterAdd(_) | EdgeRequest::ClusterRemove(_) => every_queue_admin(p),
    }
}

/// `forbidden` unless an admin whose token covers every queue: what only such an
/// admin may see or do (every member's screen, releasing member names).
fn every_queue_admin(p: &Principal) -> Result<(), ErrorBody> {
    p.check(ADMIN, None)?;
    if p.covers_all() {
        return Ok(());
    }
    Err(ErrorBody::new(
        ErrorCode::Forbidden,
        format!("token {:?} is limited to some queues", p.name),
    ))
}

impl<W: Waiter> Engine<W> {
    /// Checks a request against the principal's roles, queues and members.
    pub(super) fn authorize(&self, req: &EngineRequest, p: &Principal) -> Result<(), ErrorBody> {
        let any = ANY_ROLE;
        match req {
            EngineRequest::QueueList(_) => Ok(()),
            // A copy of every queue's tasks: only for an admin of every queue.
            EngineRequest::AdminSnapshot(_) => every_queue_admin(p),
            EngineRequest::QueueCreate(r) => p.check(ADMIN, Some(&r.queue)),
            EngineRequest::QueueUpdate(r) => p.check(ADMIN, Some(&r.queue)),
            EngineRequest::QueuePause(r) => p.check(ADMIN, Some(&r.0.queue)),
            EngineRequest::QueueResume(r) => p.check(ADMIN, Some(&r.0.queue)),
            EngineRequest::QueuePurge(r) => p.check(ADMIN, Some(&r.0.queue)),
            EngineRequest::QueueDelete(r) => p.check(ADMIN, Some(&r.0.queue)),
            EngineRequest::QueueDescribe(r) => p.check(any, Some(&r.0.queue)),
            EngineRequest::Enqueue(r) => p.check(PRODUCE, Some(&r.queue)),
            EngineRequest::Claim(r) => self.claim_allowed(r, p),
            EngineRequest::Ack(r) => self.settle_allowed(&r.task, p),
            EngineRequest::Nack(r) => self.settle_allowed(&r.task, p),
            EngineRequest::Renew(r) => self.settle_allowed(&r.task, p),
            EngineRequest::Release(r) => self.settle_allowed(&r.task, p),
            EngineRequest::Throttled(r) => self.settle_allowed(&r.task, p),
            EngineRequest::DeadLetter(r) => self.settle_allowed(&r.task, p),
            EngineRequest::Suspend(r) => self.settle_allowed(&r.task, p),
            EngineRequest::Emit(r) => self.settle_allowed(&r.task, p),
            EngineRequest::Follow(r) => self.task_allowed(&r.task, READ, p),
            // A holder spawns into the queues it may produce to.
            EngineRequest::Spawn(r) => {
                self.settle_allowed(&r.task, p)?;
                r.children
                    .iter()
                    .try_for_each(|c| p.check(PRODUCE, Some(&c.queue)))
            }
            EngineRequest::Resume(r) => {
                let roles = if r.token.is_some() {
                    RESUME_BY_TOKEN
                } else {
                    APPROVE
                };
                // A request naming no task is refused by the op itself.
                super::suspend::resume_target(r)
                    .map_or(Ok(()), |task| self.task_allowed(task, roles, p))
            }
            EngineRequest::TaskGet(r) => self.task_allowed(&r.task, READ, p),
            EngineRequest::Wait(r) => r
                .tasks
                .iter()
                .try_for_each(|t| self.task_allowed(t, PRODUCE, p)),
            // Approvers reject: cancel a suspended task, or ask to cancel only one that
            // is (`if_state` suspended, refused by the op if it is not).
            EngineRequest::Cancel(r) => self.task_allowed(&r.task, PRODUCE, p).or_else(|e| {
                let rejects = r.if_state == Some(TaskState::Suspended)
                    || self.task_state(&r.task) == Some(TaskState::Suspended);
                match rejects {
                    true => self.task_allowed(&r.task, APPROVE, p),
                    false => Err(e),
                }
            }),
            // Approvers list and search the tasks waiting for them.
            EngineRequest::TaskList(r) => p.check(
                if r.state == TaskState::Suspended {
                    ADMIN_OR_APPROVE
                } else {
                    ADMIN
                },
                Some(&r.queue),
            ),
            EngineRequest::TaskFind(r) => p.check(
                if r.state == Some(TaskState::Suspended) {
                    ADMIN_OR_APPROVE
                } else {
                    ADMIN
                },
                r.queue.as_deref(),
            ),
            EngineRequest::Redrive(r) => p.check(ADMIN, Some(&r.0.queue)),
            EngineRequest::Discard(r) => p.check(ADMIN, Some(&r.0.queue)),
            EngineRequest::SessionOpen(r) => self.session_open_allowed(r, p),
            EngineRequest::SessionUpdate(_) | EngineRequest::Unsubscribe(_) => {
                p.check(CONSUME, None)
            }
            EngineRequest::Subscribe(r) => {
                r.queues.iter().try_for_each(|q| p.check(CONSUME, Some(q)))
            }
            EngineRequest::MemberList(_) => p.check(ADMIN, None),
            EngineRequest::MemberDescribe(r) => self.member_in_scope(&r.0.member, p),
            EngineRequest::MemberDrain(r) => self.member_in_scope(&r.0.member, p),
            EngineRequest::MemberUndrain(r) => self.member_in_scope(&r.0.member, p),
            EngineRequest::MemberRelease(_) => every_queue_admin(p),
            EngineRequest::LeaseRevoke(r) => self.task_allowed(&r.task, ADMIN, p),
            EngineRequest::TaskUpdate(r) => self.task_allowed(&r.task, ADMIN, p),
            EngineRequest::Watch(r) => self.watch_allowed(&r.view, p),
            // Ends the connection's own watch, whatever it watched (a limits watch is
            // open to any role).
            EngineRequest::Unwatch(_) => p.check(ANY_ROLE, None),
            // A limit spans queues: only an admin of every queue changes one; anyone
            // who may enqueue or take tasks may see them.
            EngineRequest::LimitSet(_) | EngineRequest::LimitDelete(_) => every_queue_admin(p),
            EngineRequest::LimitGet(_) | EngineRequest::LimitList(_) => p.check(any, None),
            // A schedule is its queue's: an admin of the queue sets and steers it (of
            // both queues when it moves), whoever may enqueue there runs it at once,
            // any role of the queue sees it.
            EngineRequest::ScheduleSet(r) => {
                p.check(ADMIN, Some(&r.queue))?;
                p.check(ADMIN, self.schedules.queue_of(&r.name))
            }
            EngineRequest::ScheduleGet(r) => p.check(any, self.schedules.queue_of(&r.0.name)),
            EngineRequest::SchedulePause(r) => p.check(ADMIN, self.schedules.queue_of(&r.0.name)),
            EngineRequest::ScheduleResume(r) => p.check(ADMIN, self.schedules.queue_of(&r.0.name)),
            EngineRequest::ScheduleDelete(r) => p.check(ADMIN, self.schedules.queue_of(&r.0.name)),
            EngineRequest::ScheduleRun(r) => p.check(PRODUCE, self.schedules.queue_of(&r.0.name)),
            EngineRequest::ScheduleList(_) => p.check(any, None),
        }
    }

    /// A claim: consume on every queue it names, and the member name it gives (if
    /// any) the principal's to use.
    fn claim_allowed(&self, r: &Claim, p: &Principal) -> Result<(), ErrorBody> {
        for q in &r.queues {
            p.check(CONSUME, Some(q))?;
        }
        match r.member.as_deref() {
            Some(m) if !m.is_empty() => {
                p.check_member(m)?;
                self.member_free_or_own(m, p)?;
                self.member_name_room(m, p)
            }
            _ => Ok(()),
        }
    }

    /// A session open: consume, the member name the principal's to use, and every
    /// queue of the leases the member holds covered.
    fn session_open_allowed(&self, r: &SessionOpen, p: &Principal) -> Result<(), ErrorBody> {
        p.check(CONSUME, None)?;
        p.check_member(&r.member)?;
        self.member_free_or_own(&r.member, p)?;
        self.member_name_room(&r.member, p)?;
        // Reclaim hands back, and release and resume act on, every lease the
        // member holds: each must be in a queue the token covers.
        self.member_queues(&r.member)
            .try_for_each(|q| p.check(CONSUME, Some(q)))
    }

    /// A watch, by its screen: admin of the queue it shows, or of every queue for the
    /// screens of members; the limits, as `limit_list`, any role.
    fn watch_allowed(&self, view: &View, p: &Principal) -> Result<(), ErrorBody> {
        match view {
            View::Tasks {
                queue,
                state: TaskState::Suspended,
                ..
            } => p.check(ADMIN_OR_APPROVE, Some(queue)),
            View::Tasks { queue, .. } => p.check(ADMIN, Some(queue)),
            View::Task { task } => {
                self.task_allowed(task, ADMIN, p)
                    .or_else(|e| match self.task_state(task) {
                        Some(TaskState::Suspended) => self.task_allowed(task, APPROVE, p),
                        _ => Err(e),
                    })
            }
            View::Queues { .. } | View::Dead { .. } => p.check(ADMIN, None),
            View::Member { .. } | View::Members { .. } => every_queue_admin(p),
            View::Limits { .. } | View::Schedules { .. } => p.check(ANY_ROLE, None),
        }
    }

    /// The queue of a task, if the id parses and the task exists. Unknown tasks are left
    /// to the op, which answers `not_found` or `bad_request`.
    fn task_queue(&self, task: &str) -> Option<&str> {
        let id = Ulid::from_string(task).ok()?;
        self.index.tasks.get(&id).map(|m| &*m.queue)
    }

    fn task_state(&self, task: &str) -> Option<TaskState> {
        let id = Ulid::from_string(task).ok()?;
        self.index.tasks.get(&id).map(|m| m.state)
    }

    fn task_allowed(&self, task: &str, roles: &[Role], p: &Principal) -> Result<(), ErrorBody> {
        p.check(roles, self.task_queue(task))
    }

    fn settle_allowed(&self, task: &str, p: &Principal) -> Result<(), ErrorBody> {
        self.task_allowed(task, CONSUME, p)?;
        let member = Ulid::from_string(task)
            .ok()
            .and_then(|id| self.index.tasks.get(&id))
            .and_then(|m| m.member().cloned());
        match member {
            Some(m) => self.member_free_or_own(&m, p),
            None => Ok(()),
        }
    }

    /// The queues a member holds leases in or subscribes to, repeats included.
    fn member_queues<'a>(&'a self, member: &str) -> impl Iterator<Item = &'a str> + 'a {
        let m = self.members.by_name.get(member);
        let leased = m
            .into_iter()
            .flat_map(|m| m.leased.iter())
            .filter_map(|id| self.index.tasks.get(id).map(|t| &*t.queue));
        let subscribed = m
            .into_iter()
            .flat_map(|m| m.subscribed().iter().map(String::as_str));
        leased.chain(subscribed)
    }

    /// Whether the principal covers a queue the member holds a lease in or subscribes
    /// to: a queue-scoped admin sees only the members working on its queues.
    pub(super) fn member_visible(&self, member: &str, p: &Principal) -> bool {
        p.covers_all() || self.member_queues(member).any(|q| p.covers(q))
    }

    /// `forbidden` unless an admin that sees the member (an unknown member is left to
    /// the op, which answers `not_found`).
    fn member_in_scope(&self, member: &str, p: &Principal) -> Result<(), ErrorBody> {
        p.check(ADMIN, None)?;
        if !self.members.by_name.contains_key(member) || self.member_visible(member, p) {
            return Ok(());
        }
        Err(ErrorBody::new(
            ErrorCode::Forbidden,
            format!(
                "member {member:?} has no lease or subscription in a queue token {:?} covers",
                p.name
            ),
        ))
    }

    /// `forbidden` if the member name belongs to another principal.
    pub(super) fn member_free_or_own(&self, member: &str, p: &Principal) -> Result<(), ErrorBody> {
        match self.members.owners.owner(member) {
            Some(owner) if owner != p.name && p.binds_members() => Err(ErrorBody::new(
                ErrorCode::Forbidden,
                format!(
                    "member {member:?} belongs to another principal; an admin of every \
                     queue frees it with `muster member release {member}`, or it frees \
                     itself after --member-name-expiry (24 h by default) with no session \
                     and no lease"
                ),
            )),
            _ => Ok(()),
        }
    }

    /// `limit` if using the member name would bind a new name to a principal that
    /// holds [`MAX_MEMBER_NAMES_PER_PRINCIPAL`] already.
    fn member_name_room(&self, member: &str, p: &Principal) -> Result<(), ErrorBody> {
        let held = self
            .members
            .owners
            .per_principal
            .get(&p.name)
            .copied()
            .unwrap_or(0);
        if !p.binds_members()
            || self.members.owners.owner(member).is_some()
            || held < MAX_MEMBER_NAMES_PER_PRINCIPAL
        {
            return Ok(());
        }
        Err(ErrorBody::new(
            ErrorCode::Limit,
            format!(
                "token {:?} holds {MAX_MEMBER_NAMES_PER_PRINCIPAL} member names already: \
                 an admin can free one with `muster member release NAME`, and names with no \
                 session and no lease are freed after --member-name-expiry",
                p.name
            ),
        ))
    }

    /// Records the principal as the owner of a member name it uses first: in a session,
    /// or in a claim that got tasks (an empty claim binds nothing). Authorization
    /// checked the room for it when the request came in.
    pub(super) fn take_member(&mut self, member: &str, p: Option<&Principal>, now: Now) {
        let Some(p) = p else { return };
        if member.is_empty() || !p.binds_members() {
            return;
        }
        if let Some(owner) = self.members.owners.by_member.get_mut(member) {
            owner.used_ms = now.mono_ms;
            return;
        }
        let old = self.members.owners.by_member.insert(
            member.to_owned(),
            Owner {
                principal: p.name.clone(),
                used_ms: now.mono_ms,
            },
        );
        assert!(old.is_none(), "member name {member:?}: bound once");
        *self
            .members
            .owners
            .per_principal
            .entry(p.name.clone())
            .or_default() += 1;
        debug_assert_eq!(
            self.members.owners.per_principal.values().sum::<usize>(),
            self.members.owners.by_member.len(),
            "each bound member name is counted under its principal"
        );
        self.pending.put_owner(member, &p.name);
    }

    /// Sets how long a name stays bound with no session and no lease.
    pub fn set_member_name_expiry(&mut self, expiry: Duration) {
        assert!(
            expiry >= MIN_MEMBER_NAME_EXPIRY,
            "checked with the settings"
        );
        self.members.owners.expiry_ms = expiry.as_millis() as u64;
    }

    /// Frees the names that had no session and no lease for the expiry time.
    pub(super) fn expire_member_names(&mut self, now: Now) {
        if self.members.owners.by_member.is_empty() || now.mono_ms < self.members.owners.sweep_at {
            return;
        }
        let sweep =
            (self.members.owners.expiry_ms / 8).clamp(1, MAX_MEMBER_NAME_SWEEP.as_millis() as u64);
        self.members.owners.sweep_at = now.mono_ms + sweep;
        let mut expired = Vec::new();
        for (member, owner) in &mut self.members.owners.by_member {
            // The engine keeps a member while it has a session or leases.
            if self.members.by_name.contains_key(member.as_str()) {
                owner.used_ms = now.mono_ms;
            } else if now.mono_ms.saturating_sub(owner.used_ms) >= self.members.owners.expiry_ms {
                expired.push(member.clone());
            }
        }
        for member in &expired {
            assert!(
                self.members.owners.remove(member, &mut self.pending),
                "member name {member:?}: an expired name was bound"
            );
        }
        assert!(
            self.members.owners.sweep_at > now.mono_ms,
            "the next sweep for expired member names lies after now"
        );
        if !expired.is_empty() {
            tracing::info!(
                count = expired.len(),
                "member names unused past their expiry freed"
            );
        }
    }

    /// `member_release`: frees a member name bound to a principal, ending the member's
    /// session if it has one. Refused, with nothing changed, while the member holds
    /// leases (drain it first) or when the name is bound to no principal.
    pub(super) fn member_release(&mut self, member: &str) -> Result<(), ErrorBody> {
        if let Some(m) = self.members.by_name.get(member)
            && !m.leased.is_empty()
        {
            return Err(ErrorBody::new(
                ErrorCode::InvalidState,
                format!(
                    "member {member:?} holds {} leases: drain it (its agent finishes or hands them back) or revoke them first",
                    m.leased.len()
                ),
            ));
        }
        // Checked before the session ends: a refused release changes nothing.
        if !self.members.owners.by_member.contains_key(member) {
            return Err(ErrorBody::new(
                ErrorCode::NotFound,
                format!("member name {member:?} is bound to no principal"),
            ));
        }
        // A session (a squatter's, say) ends: the name is the operator's to free.
        self.end_session(
            member,
            &format!("an operator released member name {member:?}: this session has ended"),
        );
        assert!(
            self.members.owners.remove(member, &mut self.pending),
            "member name {member:?}: bound, and still bound after its session ended"
        );
        tracing::info!(member, "member name released");
        Ok(())
    }
}
