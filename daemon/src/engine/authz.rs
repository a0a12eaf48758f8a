//! Authorization: what a principal may do, op by op (when tokens are configured).
//!
//! | op | role | queue checked |
//! |----|------|---------------|
//! | `queue_create`, `queue_update`, `queue_pause`, `queue_resume`, `queue_purge`, `queue_delete` | admin | the queue |
//! | `queue_list` | any | lists only covered queues |
//! | `queue_describe` | any | the queue |
//! | `enqueue` | produce | the queue |
//! | `claim` | consume | every queue; a named member must be free or the principal's |
//! | `ack`, `nack`, `renew`, `release`, `dead_letter` | consume | the task's queue; the lease's member must be the principal's |
//! | `task_get` | produce or consume | the task's queue |
//! | `wait`, `cancel` | produce | every task's queue |
//! | `task_list`, `redrive`, `discard` | admin | the queue |
//! | `session_open` | consume | the member must be free or the principal's |
//! | `session_update`, `unsubscribe` | consume | (the session is the connection's own) |
//! | `subscribe` | consume | every queue |
//! | `member_list`, `member_describe`, `member_drain` | admin | |
//! | `lease_revoke` | admin | the task's queue |
//! | `server_stats`, `admin_snapshot` | admin | |
//! | `watch` | admin | the view's queue or task; queue and dead screens show only covered queues; member screens: admin |
//! | `unwatch` | admin | |
//!
//! Admin holds every role. A member name belongs to the principal that first used it
//! (recorded in the store); no other principal can open its session, claim in its name
//! or settle its leases.

use ulid::Ulid;

use muster_protocol::ops::View;
use muster_protocol::{ErrorBody, ErrorCode, Request};

use super::{Engine, Waiter};
use crate::auth::{Principal, Role};

const ADMIN: &[Role] = &[Role::Admin];
const PRODUCE: &[Role] = &[Role::Produce];
const CONSUME: &[Role] = &[Role::Consume];
const READ: &[Role] = &[Role::Produce, Role::Consume];

/// Checks an op the connection layer answers itself (`hello`, `server_stats`), which
/// needs no engine state; `None` for every other op. The engine's [`Engine::authorize`]
/// uses it too, so each op has one rule.
pub fn authorize_stateless(req: &Request, p: &Principal) -> Option<Result<(), ErrorBody>> {
    match req {
        Request::Hello(_) => Some(Ok(())),
        Request::ServerStats(_) => Some(p.check(ADMIN, None)),
        _ => None,
    }
}

impl<W: Waiter> Engine<W> {
    /// Checks a request against the principal's roles, queues and members.
    pub(super) fn authorize(&self, req: &Request, p: &Principal) -> Result<(), ErrorBody> {
        if let Some(checked) = authorize_stateless(req, p) {
            return checked;
        }
        let any: &[Role] = &[Role::Produce, Role::Consume, Role::Admin];
        match req {
            Request::Hello(_) | Request::ServerStats(_) => {
                unreachable!("authorized by authorize_stateless")
            }
            Request::QueueList(_) => Ok(()),
            Request::AdminSnapshot(_) => p.check(ADMIN, None),
            Request::QueueCreate(r) => p.check(ADMIN, Some(&r.queue)),
            Request::QueueUpdate(r) => p.check(ADMIN, Some(&r.queue)),
            Request::QueuePause(r) => p.check(ADMIN, Some(&r.0.queue)),
            Request::QueueResume(r) => p.check(ADMIN, Some(&r.0.queue)),
            Request::QueuePurge(r) => p.check(ADMIN, Some(&r.0.queue)),
            Request::QueueDelete(r) => p.check(ADMIN, Some(&r.0.queue)),
            Request::QueueDescribe(r) => p.check(any, Some(&r.0.queue)),
            Request::Enqueue(r) => p.check(PRODUCE, Some(&r.queue)),
            Request::Claim(r) => {
                for q in &r.queues {
                    p.check(CONSUME, Some(q))?;
                }
                match r.member.as_deref() {
                    Some(m) if !m.is_empty() => self.member_free_or_own(m, p),
                    _ => Ok(()),
                }
            }
            Request::Ack(r) => self.settle_allowed(&r.task, p),
            Request::Nack(r) => self.settle_allowed(&r.task, p),
            Request::Renew(r) => self.settle_allowed(&r.task, p),
            Request::Release(r) => self.settle_allowed(&r.task, p),
            Request::DeadLetter(r) => self.settle_allowed(&r.task, p),
            Request::TaskGet(r) => self.task_allowed(&r.task, READ, p),
            Request::Wait(r) => r
                .tasks
                .iter()
                .try_for_each(|t| self.task_allowed(t, PRODUCE, p)),
            Request::Cancel(r) => self.task_allowed(&r.task, PRODUCE, p),
            Request::TaskList(r) => p.check(ADMIN, Some(&r.queue)),
            Request::Redrive(r) => p.check(ADMIN, Some(&r.0.queue)),
            Request::Discard(r) => p.check(ADMIN, Some(&r.0.queue)),
            Request::SessionOpen(r) => {
                p.check(CONSUME, None)?;
                self.member_free_or_own(&r.member, p)
            }
            Request::SessionUpdate(_) | Request::Unsubscribe(_) => p.check(CONSUME, None),
            Request::Subscribe(r) => r.queues.iter().try_for_each(|q| p.check(CONSUME, Some(q))),
            Request::MemberList(_) | Request::MemberDescribe(_) | Request::MemberDrain(_) => {
                p.check(ADMIN, None)
            }
            Request::LeaseRevoke(r) => self.task_allowed(&r.task, ADMIN, p),
            Request::Watch(r) => match &r.view {
                View::Tasks { queue, .. } => p.check(ADMIN, Some(queue)),
                View::Task { task } => self.task_allowed(task, ADMIN, p),
                View::Queues { .. }
                | View::Dead { .. }
                | View::Member { .. }
                | View::Members { .. } => p.check(ADMIN, None),
            },
            Request::Unwatch(_) => p.check(ADMIN, None),
        }
    }

    /// The queue of a task, if the id parses and the task exists. Unknown tasks are left
    /// to the op, which answers `not_found` or `bad_request`.
    fn task_queue(&self, task: &str) -> Option<&str> {
        let id = Ulid::from_string(task).ok()?;
        self.tasks.get(&id).map(|m| &*m.queue)
    }

    fn task_allowed(&self, task: &str, roles: &[Role], p: &Principal) -> Result<(), ErrorBody> {
        p.check(roles, self.task_queue(task))
    }

    fn settle_allowed(&self, task: &str, p: &Principal) -> Result<(), ErrorBody> {
        self.task_allowed(task, CONSUME, p)?;
        let member = Ulid::from_string(task)
            .ok()
            .and_then(|id| self.tasks.get(&id))
            .and_then(|m| m.member.clone());
        match member {
            Some(m) => self.member_free_or_own(&m, p),
            None => Ok(()),
        }
    }

    /// `forbidden` if the member name belongs to another principal.
    fn member_free_or_own(&self, member: &str, p: &Principal) -> Result<(), ErrorBody> {
        match self.owners.get(member) {
            Some(owner) if *owner != p.name => Err(ErrorBody::new(
                ErrorCode::Forbidden,
                format!("member {member:?} belongs to another principal"),
            )),
            _ => Ok(()),
        }
    }

    /// Records the principal as the owner of a member name it uses first.
    pub(super) fn take_member(&mut self, member: &str, p: Option<&Principal>) {
        let Some(p) = p else { return };
        if member.is_empty() || self.owners.contains_key(member) {
            return;
        }
        self.owners.insert(member.to_owned(), p.name.clone());
        self.pending.put_owner(member, &p.name);
    }
}
