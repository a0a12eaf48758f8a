//! The audit trail: one INFO line per operator action that was applied, naming who
//! (the token's name), what (the op), on what (queue, task or member) and how many
//! tasks it touched. Refused requests are logged at DEBUG by [`super::Engine::handle`].

use muster_protocol::ops::EngineRequest;

use super::Reply;

/// An operator action about to be applied: its op and target.
pub struct Action {
    op: &'static str,
    target: String,
}

/// The action a request is, if it is one: what changes queues or limits, cancels or
/// repairs tasks, or steers members (not the work of producers and agents, not reads, not dry runs).
pub(super) fn action(req: &EngineRequest) -> Option<Action> {
    let target = match req {
        EngineRequest::QueueCreate(r) => &r.queue,
        EngineRequest::QueueUpdate(r) => &r.queue,
        EngineRequest::QueuePause(r) => &r.0.queue,
        EngineRequest::QueueResume(r) => &r.0.queue,
        EngineRequest::QueuePurge(r) => &r.0.queue,
        EngineRequest::QueueDelete(r) => &r.0.queue,
        EngineRequest::Redrive(r) if !r.0.dry_run => &r.0.queue,
        EngineRequest::Discard(r) if !r.0.dry_run => &r.0.queue,
        EngineRequest::Cancel(r) => &r.task,
        EngineRequest::TaskUpdate(r) => &r.task,
        EngineRequest::MemberDrain(r) => &r.0.member,
        EngineRequest::MemberUndrain(r) => &r.0.member,
        EngineRequest::LeaseRevoke(r) => &r.task,
        EngineRequest::LimitSet(r) => &r.name,
        EngineRequest::LimitDelete(r) => &r.0.name,
        EngineRequest::ScheduleSet(r) => &r.name,
        EngineRequest::SchedulePause(r) => &r.0.name,
        EngineRequest::ScheduleResume(r) => &r.0.name,
        EngineRequest::ScheduleDelete(r) => &r.0.name,
        EngineRequest::ScheduleRun(r) => &r.0.name,
        // The task, never the token (a secret, which the log must not hold).
        EngineRequest::Resume(r) => super::suspend::resume_target(r)?,
        _ => return None,
    };
    Some(Action {
        op: req.name(),
        target: target.to_owned(),
    })
}

/// Logs an applied action with the tasks its reply says it touched.
pub(super) fn applied(action: &Action, principal: Option<&str>, reply: &Reply) {
    let tasks = match reply {
        Reply::Count(c) => c.count,
        Reply::Cancel(_)
        | Reply::Settle(_)
        | Reply::TaskUpdate(_)
        | Reply::Resume(_)
        | Reply::ScheduleRun(_) => 1,
        Reply::Member(m) => m.member.leased,
        _ => 0,
    };
    record(principal, action.op, &action.target, tasks);
}

/// Logs an operator action: `admin_snapshot`'s, answered by the dispatcher once the copy
/// is written, comes here directly.
pub fn record(principal: Option<&str>, op: &str, target: &str, tasks: u64) {
    tracing::info!(
        principal = principal.unwrap_or(ANONYMOUS),
        op,
        target,
        tasks,
        "operator action"
    );
}

/// The principal of a connection when no tokens are configured.
pub const ANONYMOUS: &str = "anonymous";
