//! Suspend and resume: the lease ends without a failure, a token resumes its own
//! suspension once, timeouts act as told, and suspended tasks keep their key's line.

use muster_protocol::ErrorCode;
use muster_protocol::model::{LimitSpec, LimitUse, NewTask, OnTimeout, QueuePatch, TaskState};
use muster_protocol::ops::{
    Cancel, Claim, EngineRequest, LimitSet, Renew, Resume, Suspend, SuspendReply,
};

use super::{Harness, ack, principal, raw};
use crate::engine::Reply;

fn suspend_req(
    id: &str,
    epoch: u64,
    timeout_ms: Option<u64>,
    on: Option<OnTimeout>,
) -> EngineRequest {
    EngineRequest::Suspend(Suspend {
        task: id.into(),
        epoch,
        reason: "may I merge PR 42?".into(),
        timeout_ms,
        on_timeout: on,
    })
}

fn suspend(h: &mut Harness, id: &str, epoch: u64) -> SuspendReply {
    match h.call(suspend_req(id, epoch, None, None)) {
        Ok(Reply::Suspend(r)) => r,
        other => panic!("suspend {id}: {other:?}"),
    }
}

fn by_token(token: &str, data: Option<&str>) -> EngineRequest {
    EngineRequest::Resume(Resume {
        token: Some(token.into()),
        task: None,
        data: data.map(raw),
    })
}

fn by_task(id: &str, data: Option<&str>) -> EngineRequest {
    EngineRequest::Resume(Resume {
        token: None,
        task: Some(id.into()),
        data: data.map(raw),
    })
}

fn delivered(h: &mut Harness, queue: &str) -> muster_protocol::model::Delivery {
    match h.call(EngineRequest::Claim(Claim::new([queue]).member("m2"))) {
        Ok(Reply::Claim(mut r)) => {
            assert_eq!(r.tasks.len(), 1, "one delivery: {r:?}");
            r.tasks.remove(0)
        }
        other => panic!("claim: {other:?}"),
    }
}

#[test]
fn a_suspended_task_holds_no_lease_spends_no_attempt_and_resumes_once_with_its_data() {
    let mut h = Harness::new();
    h.create("q", QueuePatch::default());
    let id = h.enqueue("q", r#"{"pr":42}"#);
    let (_, epoch) = h.claim_one("q");
    h.call(EngineRequest::Renew(Renew {
        task: id.clone(),
        epoch,
        extend_ms: None,
        progress: Some(raw(r#"{"step":"asked"}"#)),
    }))
    .unwrap();
    let s = suspend(&mut h, &id, epoch);
    assert_eq!(s.state, TaskState::Suspended);
    let token = s.resume_token.expect("a token");
    assert!(token.starts_with(&format!("{id}.{epoch}.")), "{token}");
    assert_eq!(s.timeout_at_ms, Some(h.now.wall_ms + 7 * 24 * 3600 * 1000));
    // No lease, no failure, the checkpoint kept, counted as suspended.
    let t = h.task(&id);
    assert_eq!(
        (t.state, t.deliveries, t.failures),
        (TaskState::Suspended, 1, 0)
    );
    assert!(t.lease.is_none());
    assert_eq!(t.progress.unwrap().get(), r#"{"step":"asked"}"#);
    let info = t.suspension.expect("its suspension");
    assert_eq!(
        (
            info.reason.as_str(),
            info.member.as_str(),
            info.epoch,
            info.on_timeout
        ),
        ("may I merge PR 42?", "m1", epoch, OnTimeout::Fail)
    );
    assert_eq!(h.counts("q"), [0, 0, 0, 0, 0, 0, 1]);
    // Its lease is gone: settles are fenced off, and nothing is claimable.
    assert_eq!(h.code(ack(&id, epoch)), ErrorCode::LeaseLost);
    assert!(h.claim("q").is_empty());
    // A resume makes it ready at once; the next holder sees the data.
    match h.call(by_token(&token, Some(r#"{"approved":true}"#))) {
        Ok(Reply::Resume(r)) => {
            assert_eq!((r.task.as_str(), r.state), (id.as_str(), TaskState::Ready))
        }
        other => panic!("resume: {other:?}"),
    }
    assert_eq!(h.code(by_token(&token, None)), ErrorCode::StaleToken);
    let d = delivered(&mut h, "q");
    assert_eq!((d.id.as_str(), d.epoch, d.failures), (id.as_str(), 2, 0));
    let resumed = d.resumed.expect("resumed");
    assert_eq!(
        (
            resumed.data.unwrap().get(),
            resumed.by.as_str(),
            resumed.timed_out
        ),
        (r#"{"approved":true}"#, "", false)
    );
    assert_eq!(d.progress.unwrap().get(), r#"{"step":"asked"}"#);
    let events: Vec<String> = h.task(&id).history.into_iter().map(|e| e.event).collect();
    assert_eq!(
        events,
        ["enqueued", "leased", "suspended", "resumed", "leased"]
    );
}

#[test]
fn a_token_of_an_earlier_suspension_a_forged_one_and_one_after_cancel_are_stale() {
    let mut h = Harness::new();
    h.create("q", QueuePatch::default());
    let id = h.enqueue("q", "1");
    let (_, e1) = h.claim_one("q");
    let first = suspend(&mut h, &id, e1).resume_token.unwrap();
    h.call(by_task(&id, None)).unwrap();
    let (_, e2) = h.claim_one("q");
    let second = suspend(&mut h, &id, e2).resume_token.unwrap();
    // The first token names the suspension under e1: stale, and nothing changes.
    assert_eq!(h.code(by_token(&first, None)), ErrorCode::StaleToken);
    // The right task and epoch with another secret: stale too.
    let forged = format!("{id}.{e2}.{}", "0".repeat(32));
    assert_eq!(h.code(by_token(&forged, None)), ErrorCode::StaleToken);
    assert_eq!(h.task(&id).state, TaskState::Suspended);
    for bad in [
        "",
        "x.1.2",
        &format!("{id}.{e2}"),
        &format!("{id}.x.{}", "0".repeat(32)),
    ] {
        assert_eq!(
            h.code(by_token(bad, None)),
            ErrorCode::BadRequest,
            "{bad:?}"
        );
    }
    let both = EngineRequest::Resume(Resume {
        token: Some(second.clone()),
        task: Some(id.clone()),
        data: None,
    });
    assert_eq!(h.code(both), ErrorCode::BadRequest);
    let big = format!("\"{}\"", "x".repeat(64 * 1024));
    assert_eq!(h.code(by_token(&second, Some(&big))), ErrorCode::TooLarge);
    // A cancel ends it: the token is stale, a resume by id is refused.
    h.call(EngineRequest::Cancel(Cancel {
        task: id.clone(),
        if_state: None,
    }))
    .unwrap();
    assert_eq!(h.task(&id).state, TaskState::Cancelled);
    assert_eq!(h.code(by_token(&second, None)), ErrorCode::StaleToken);
    assert_eq!(h.code(by_task(&id, None)), ErrorCode::InvalidState);
    let unknown = format!("{}.1.{}", ulid::Ulid::new(), "0".repeat(32));
    assert_eq!(h.code(by_token(&unknown, None)), ErrorCode::NotFound);
}

#[test]
fn bad_suspends_are_refused_and_change_nothing() {
    let mut h = Harness::new();
    h.create("q", QueuePatch::default());
    let id = h.enqueue("q", "1");
    let (_, epoch) = h.claim_one("q");
    assert_eq!(
        h.code(suspend_req(&id, epoch + 1, None, None)),
        ErrorCode::LeaseLost
    );
    assert_eq!(
        h.code(suspend_req(&id, epoch, Some(0), None)),
        ErrorCode::BadRequest
    );
    let year = 365 * 24 * 3600 * 1000;
    assert_eq!(
        h.code(suspend_req(&id, epoch, Some(year + 1), None)),
        ErrorCode::BadRequest
    );
    let mut long = suspend_req(&id, epoch, None, None);
    if let EngineRequest::Suspend(s) = &mut long {
        s.reason = "x".repeat(1025);
    }
    assert_eq!(h.code(long), ErrorCode::TooLarge);
    let mut blank = suspend_req(&id, epoch, None, None);
    if let EngineRequest::Suspend(s) = &mut blank {
        s.reason = "  ".into();
    }
    assert_eq!(h.code(blank), ErrorCode::BadRequest);
    assert_eq!(h.task(&id).state, TaskState::Leased);
    // A pending cancel turns the suspend into the end: cancelled, no token.
    h.call(EngineRequest::Cancel(Cancel {
        task: id.clone(),
        if_state: None,
    }))
    .unwrap();
    match h.call(suspend_req(&id, epoch, None, None)) {
        Ok(Reply::Suspend(r)) => {
            assert_eq!(
                (r.state, r.resume_token, r.timeout_at_ms),
                (TaskState::Cancelled, None, None)
            );
        }
        other => panic!("suspend: {other:?}"),
    }
}

#[test]
fn timeouts_resume_fail_or_cancel_as_told_and_outlast_a_restart() {
    let mut h = Harness::new();
    h.create("q", QueuePatch::default());
    let ids: Vec<String> = (0..3).map(|i| h.enqueue("q", &i.to_string())).collect();
    let outcomes = [OnTimeout::Resume, OnTimeout::Fail, OnTimeout::Cancel];
    for (id, on) in ids.iter().zip(outcomes) {
        let (got, epoch) = h.claim_one("q");
        assert_eq!(&got, id);
        h.call(suspend_req(id, epoch, Some(60_000), Some(on)))
            .unwrap();
    }
    h.advance(59_999);
    assert_eq!(h.counts("q"), [0, 0, 0, 0, 0, 0, 3]);
    h.restart(0);
    h.advance(1);
    let states: Vec<TaskState> = ids.iter().map(|id| h.task(id).state).collect();
    assert_eq!(
        states,
        [TaskState::Ready, TaskState::Dead, TaskState::Cancelled]
    );
    let dead = h.task(&ids[1]);
    assert_eq!(
        (
            dead.dead_reason.as_deref(),
            dead.last_error.as_deref(),
            dead.failures
        ),
        (
            Some("suspend_timed_out"),
            Some("suspension timed out after 60000 ms"),
            0
        )
    );
    let d = delivered(&mut h, "q");
    let resumed = d.resumed.expect("resumed by its timeout");
    assert_eq!(
        (d.id.as_str(), resumed.timed_out, resumed.data.is_none()),
        (ids[0].as_str(), true, true)
    );
}

#[test]
fn a_suspended_task_keeps_its_keys_line_and_frees_its_members_and_limits_slots() {
    let mut h = Harness::new();
    h.create("q", QueuePatch::default());
    h.call(EngineRequest::LimitSet(LimitSet {
        name: "api".into(),
        spec: LimitSpec {
            concurrency: Some(1),
            ..LimitSpec::default()
        },
    }))
    .unwrap();
    let task = |payload: &str, key: Option<&str>| NewTask {
        key: key.map(str::to_owned),
        limits: vec![LimitUse {
            limit: "api".into(),
            key: None,
            cost: None,
        }],
        ..NewTask::new(raw(payload))
    };
    let a = h.enqueue_task("q", task("1", Some("repo")));
    let b = h.enqueue_task("q", task("2", Some("repo")));
    let c = h.enqueue_task("q", task("3", None));
    let (got, epoch) = h.claim_one("q");
    assert_eq!(got, a);
    let token = suspend(&mut h, &a, epoch).resume_token.unwrap();
    // b waits behind a in its key's line; c takes the limit's one slot a gave back.
    let (got, ce) = h.claim_one("q");
    assert_eq!(got, c);
    assert!(h.claim("q").is_empty());
    h.call(ack(&c, ce)).unwrap();
    assert!(
        h.claim("q").is_empty(),
        "b still waits for a, which is suspended"
    );
    h.call(by_token(&token, None)).unwrap();
    let (got, _) = h.claim_one("q");
    assert_eq!(got, a, "a goes first in its line");
    assert_eq!(h.task(&b).state, TaskState::Ready);
}

/// Who may resume: approve or consume with a token, approve by task id, admin always;
/// an approver may cancel a suspended task, not a ready one.
const ROLES: &str = r#"
[[tokens]]
name = "alice"
token = "alice-token-0123456789ab"
roles = ["approve"]
queues = ["q"]

[[tokens]]
name = "agent"
token = "agent-token-0123456789ab"
roles = ["consume"]

[[tokens]]
name = "producer"
token = "producer-token-0123456789"
roles = ["produce"]
"#;

#[test]
fn approvers_resume_and_reject_in_their_queues_and_producers_do_not_resume() {
    let alice = principal(ROLES, "alice-token-0123456789ab");
    let agent = principal(ROLES, "agent-token-0123456789ab");
    let producer = principal(ROLES, "producer-token-0123456789");
    let mut h = Harness::new();
    h.create("q", QueuePatch::default());
    h.create("other", QueuePatch::default());
    let id = h.enqueue("q", "1");
    let elsewhere = h.enqueue("other", "2");
    let ready = h.enqueue("q", "3");
    let (_, e) = h.claim_one("q");
    let token = suspend(&mut h, &id, e).resume_token.unwrap();
    let (_, e2) = h.claim_one("other");
    suspend(&mut h, &elsewhere, e2);
    h.principal = Some(producer);
    assert_eq!(h.code(by_token(&token, None)), ErrorCode::Forbidden);
    h.principal = Some(alice);
    assert_eq!(h.code(by_task(&elsewhere, None)), ErrorCode::Forbidden);
    assert_eq!(
        h.code(EngineRequest::Cancel(Cancel {
            task: ready.clone(),
            if_state: None,
        })),
        ErrorCode::Forbidden
    );
    match h.call(by_task(&id, Some("\"ok\""))) {
        Ok(Reply::Resume(r)) => assert_eq!(r.state, TaskState::Ready),
        other => panic!("resume: {other:?}"),
    }
    h.principal = None;
    let (_, e3) = h.claim_one("q");
    let again = suspend(&mut h, &id, e3).resume_token.unwrap();
    h.principal = Some(agent);
    assert_eq!(
        h.code(by_task(&id, None)),
        ErrorCode::Forbidden,
        "consume needs the token"
    );
    h.call(by_token(&again, None)).unwrap();
    h.principal = None;
    let d = delivered(&mut h, "q");
    assert_eq!(
        (d.id.as_str(), d.resumed.unwrap().by.as_str()),
        (id.as_str(), "agent")
    );
    suspend(&mut h, &id, d.epoch);
    h.principal = Some(alice);
    h.call(EngineRequest::Cancel(Cancel {
        task: id.clone(),
        if_state: None,
    }))
    .unwrap();
    assert_eq!(h.task(&id).state, TaskState::Cancelled);
}

#[test]
fn a_suspend_repeated_by_its_holder_replaces_the_token_and_changes_nothing_else() {
    let mut h = Harness::new();
    h.create("q", QueuePatch::default());
    let id = h.enqueue("q", "1");
    let (_, epoch) = h.claim_one("q");
    let first = h.call(suspend_req(
        &id,
        epoch,
        Some(60_000),
        Some(OnTimeout::Cancel),
    ));
    let Ok(Reply::Suspend(first)) = first else {
        panic!("suspend: {first:?}")
    };
    let before = h.task(&id);
    h.advance(1_000);
    // The reply was lost: the holder asks again, under the same epoch.
    let again = match h.call(suspend_req(&id, epoch, None, None)) {
        Ok(Reply::Suspend(r)) => r,
        other => panic!("suspend again: {other:?}"),
    };
    assert_eq!(
        (again.state, again.timeout_at_ms),
        (TaskState::Suspended, first.timeout_at_ms)
    );
    let (old, new) = (first.resume_token.unwrap(), again.resume_token.unwrap());
    assert_ne!(old, new);
    let after = h.task(&id);
    assert_eq!(
        after.suspension, before.suspension,
        "the suspension is as it was"
    );
    assert_eq!(
        after.history.len(),
        before.history.len(),
        "no event for a repeat"
    );
    assert_eq!(h.code(by_token(&old, None)), ErrorCode::StaleToken);
    h.call(by_token(&new, None)).unwrap();
    // Once resumed, a repeat is a suspend of a task no longer held: lease_lost.
    assert_eq!(
        h.code(suspend_req(&id, epoch, None, None)),
        ErrorCode::LeaseLost
    );
}

/// Two consumers of one queue, each with its member names.
const CONSUMERS: &str = r#"
[[tokens]]
name = "holder"
token = "holder-token-0123456789ab"
roles = ["consume"]

[[tokens]]
name = "other"
token = "other-token-01234567890ab"
roles = ["consume"]

[[tokens]]
name = "approver"
token = "approver-token-0123456789"
roles = ["approve"]
"#;

#[test]
fn only_the_holders_principal_replaces_a_token_and_approvers_list_what_waits_for_them() {
    let holder = principal(CONSUMERS, "holder-token-0123456789ab");
    let other = principal(CONSUMERS, "other-token-01234567890ab");
    let approver = principal(CONSUMERS, "approver-token-0123456789");
    let mut h = Harness::new();
    h.create("q", QueuePatch::default());
    let id = h.enqueue("q", "1");
    h.principal = Some(holder);
    let (_, epoch) = {
        let got = h.claim_as("q", 1, "holder-1");
        (got[0].0.clone(), got[0].1)
    };
    suspend(&mut h, &id, epoch);
    h.principal = Some(other);
    assert_eq!(
        h.code(suspend_req(&id, epoch, None, None)),
        ErrorCode::Forbidden
    );
    h.principal = Some(approver);
    let list = |state| {
        EngineRequest::TaskList(muster_protocol::ops::TaskList {
            queue: "q".into(),
            state,
            after: None,
            limit: None,
        })
    };
    match h.call(list(TaskState::Suspended)) {
        Ok(Reply::TaskList(r)) => {
            let ids: Vec<&str> = r.tasks.iter().map(|t| t.id.as_str()).collect();
            assert_eq!(ids, [id.as_str()]);
            let s = r.tasks[0].suspension.as_ref().expect("its suspension");
            assert_eq!(s.reason, "may I merge PR 42?");
        }
        other => panic!("task_list: {other:?}"),
    }
    assert_eq!(h.code(list(TaskState::Ready)), ErrorCode::Forbidden);
}

#[test]
fn resume_data_counts_against_the_enqueuers_quota_and_is_cut_under_the_disk_alarm() {
    let producer = principal(ROLES, "producer-token-0123456789");
    let mut h = Harness::new();
    h.create("q", QueuePatch::default());
    h.principal = Some(producer);
    let id = h.enqueue("q", "1");
    h.principal = None;
    let stored = |h: &mut Harness| h.engine().budget.stored_bytes["producer"];
    let base = 1 + crate::store::TASK_RECORD_BYTES;
    assert_eq!(stored(&mut h), base);
    // Under the disk alarm, a person's answer still gets through, as a marker of its
    // size, and counts as that.
    let (_, e) = h.claim_one("q");
    let token = suspend(&mut h, &id, e).resume_token.unwrap();
    let big = format!("\"{}\"", "x".repeat(10_000));
    h.engine().set_disk_alarm(true);
    h.call(by_token(&token, Some(&big))).unwrap();
    h.engine().set_disk_alarm(false);
    let marker = r#"{"muster_truncated":{"reason":"disk_alarm","bytes":10002}}"#;
    let t = h.task(&id);
    assert_eq!(t.resumed.unwrap().data.unwrap().get(), marker);
    assert_eq!(stored(&mut h), base + marker.len() as u64);
    // The next resume's data replaces it in the count; the next suspension drops it.
    let (_, e) = h.claim_one("q");
    let token = suspend(&mut h, &id, e).resume_token.unwrap();
    assert_eq!(stored(&mut h), base);
    h.call(by_token(&token, Some(&big))).unwrap();
    assert_eq!(stored(&mut h), base + big.len() as u64);
}

fn reject(id: &str) -> EngineRequest {
    EngineRequest::Cancel(Cancel {
        task: id.into(),
        if_state: Some(TaskState::Suspended),
    })
}

/// A cancel `if_state` suspended (a reject) cancels a suspended task, and refuses one
/// resumed or timed out meanwhile with `invalid_state`, changing nothing; an approver
/// gets that same refusal, not `forbidden`, and producers reject too. `done` and `dead`
/// are never a cancel's condition.
#[test]
fn a_reject_cancels_only_a_task_that_is_still_suspended() {
    let alice = principal(ROLES, "alice-token-0123456789ab");
    let producer = principal(ROLES, "producer-token-0123456789");
    let mut h = Harness::new();
    h.create("q", QueuePatch::default());
    let id = h.enqueue("q", "1");
    let (_, e) = h.claim_one("q");
    suspend(&mut h, &id, e);
    let before = h.task(&id);
    for state in [TaskState::Done, TaskState::Dead] {
        let err = h
            .call(EngineRequest::Cancel(Cancel {
                task: id.clone(),
                if_state: Some(state),
            }))
            .unwrap_err();
        assert_eq!(
            (err.code, err.message),
            (
                ErrorCode::BadRequest,
                format!("if_state {state}: a {state} task is never cancelled")
            )
        );
    }
    let leased = EngineRequest::Cancel(Cancel {
        task: id.clone(),
        if_state: Some(TaskState::Leased),
    });
    let err = h.call(leased).unwrap_err();
    assert_eq!(
        (err.code, err.message),
        (
            ErrorCode::InvalidState,
            format!("task {id} is suspended, not leased: nothing was done")
        )
    );
    let unknown = ulid::Ulid::new().to_string();
    assert_eq!(h.code(reject(&unknown)), ErrorCode::NotFound);
    assert_eq!(h.code(reject("not-an-id")), ErrorCode::BadRequest);
    let after = h.task(&id);
    assert_eq!(
        (after.state, after.updated_ms, after.history.len()),
        (before.state, before.updated_ms, before.history.len()),
        "refused cancels changed nothing"
    );

    // Resumed before the approver's reject arrives: refused, the task stays ready.
    h.principal = Some(alice);
    h.call(by_task(&id, None)).unwrap();
    h.advance(1_000);
    let err = h.call(reject(&id)).unwrap_err();
    assert_eq!(
        (err.code, err.message),
        (
            ErrorCode::InvalidState,
            format!("task {id} is ready, not suspended: nothing was done")
        )
    );
    assert_eq!(h.task(&id).state, TaskState::Ready);
    // A plain cancel of the ready task is still a producer's, not an approver's.
    assert_eq!(
        h.code(EngineRequest::Cancel(Cancel {
            task: id.clone(),
            if_state: None,
        })),
        ErrorCode::Forbidden
    );

    // Suspended again: the approver's reject cancels it.
    h.principal = None;
    let (_, e) = h.claim_one("q");
    suspend(&mut h, &id, e);
    h.advance(1_000);
    h.principal = Some(alice);
    match h.call(reject(&id)) {
        Ok(Reply::Cancel(r)) => {
            assert_eq!((r.state, r.cancel_requested), (TaskState::Cancelled, false))
        }
        other => panic!("reject: {other:?}"),
    }
    let t = h.task(&id);
    assert_eq!(
        (t.state, t.history.last().map(|e| e.event.as_str())),
        (TaskState::Cancelled, Some("cancelled"))
    );
    // Cancelled now: a second reject is refused as well.
    let err = h.call(reject(&id)).unwrap_err();
    assert_eq!(
        (err.code, err.message),
        (
            ErrorCode::InvalidState,
            format!("task {id} is cancelled, not suspended: nothing was done")
        )
    );

    // A suspension that timed out (failed: dead) before the reject: refused.
    h.principal = None;
    let other = h.enqueue("q", "2");
    let (_, e) = h.claim_one("q");
    h.call(suspend_req(&other, e, Some(60_000), None)).unwrap();
    h.advance(60_000);
    assert_eq!(h.task(&other).state, TaskState::Dead);
    h.principal = Some(producer);
    let err = h.call(reject(&other)).unwrap_err();
    assert_eq!(
        (err.code, err.message),
        (
            ErrorCode::InvalidState,
            format!("task {other} is dead, not suspended: nothing was done")
        )
    );

    // A producer rejects a suspended task too (it may cancel any of its tasks).
    h.principal = None;
    let third = h.enqueue("q", "3");
    let (_, e) = h.claim_one("q");
    suspend(&mut h, &third, e);
    h.principal = Some(producer);
    match h.call(reject(&third)) {
        Ok(Reply::Cancel(r)) => assert_eq!(r.state, TaskState::Cancelled),
        other => panic!("reject: {other:?}"),
    }
}
