//! Member liveness with a driven clock: connected, unreachable and gone; no pushes to a
//! silent member; a lapsed or revoked task is not handed back to the member that let it
//! go while another member can take it, nor before that member is heard from again.

use muster_protocol::model::{MemberState, QueuePatch, TaskState};
use muster_protocol::ops::{self, Claim, Nack};
use muster_protocol::{ErrorCode, ops::EngineRequest};

use super::{Harness, delivered, member_info, open, subscribe};
use crate::engine::Reply;

fn open_with_liveness(name: &str, capacity: u32, liveness_ms: u64) -> EngineRequest {
    match open(name, capacity, true, false) {
        EngineRequest::SessionOpen(mut o) => {
            o.liveness_ms = Some(liveness_ms);
            EngineRequest::SessionOpen(o)
        }
        _ => unreachable!("open builds a session_open"),
    }
}

/// Advances the clock while the connection `conn` keeps sending packets.
fn advance_heard(h: &mut Harness, conn: u64, ms: u64) {
    h.advance(ms);
    let now = h.now;
    h.engine().heard(conn, now);
    h.round();
}

fn unclaimable(h: &mut Harness) -> (u64, u64, Vec<Vec<String>>) {
    h.engine().check_claimability();
    match h.call(EngineRequest::QueueDescribe(ops::QueueDescribe(
        ops::QueueName {
            queue: "jobs".into(),
        },
    ))) {
        Ok(Reply::Queue(r)) => (
            r.queue.unclaimable,
            r.queue.unclaimable_sets,
            r.queue.unclaimable_requires,
        ),
        other => panic!("describe: {other:?}"),
    }
}

fn queue(h: &mut Harness, lease_ms: u64) {
    h.create(
        "jobs",
        QueuePatch {
            lease_ms: Some(lease_ms),
            max_attempts: Some(3),
            ..QueuePatch::default()
        },
    );
}

#[test]
fn a_silent_member_becomes_unreachable_gets_nothing_and_comes_back_when_heard() {
    let mut h = Harness::new();
    queue(&mut h, 60_000);
    h.call_on(1, open_with_liveness("a", 2, 2_000)).unwrap();
    h.call_on(1, subscribe("a", &["jobs"])).unwrap();
    let m = member_info(&mut h, "a");
    assert_eq!(
        (m.state, m.connected, m.liveness_ms),
        (MemberState::Connected, true, 2_000)
    );
    // Exactly the timeout is still alive; past it (and past a sweep) it is not.
    h.advance(2_000);
    assert_eq!(member_info(&mut h, "a").state, MemberState::Connected);
    h.advance(251);
    let m = member_info(&mut h, "a");
    assert_eq!((m.state, m.connected), (MemberState::Unreachable, false));
    let id = h.enqueue("jobs", "1");
    assert!(
        h.pushed(1).is_empty(),
        "nothing is pushed to a silent member"
    );
    assert_eq!(h.state(&id), (TaskState::Ready, 0, 0));
    // A packet arrives: it is connected again and takes the task.
    let now = h.now;
    h.engine().heard(1, now);
    h.round();
    assert_eq!(member_info(&mut h, "a").state, MemberState::Connected);
    assert_eq!(delivered(&h.pushed(1)), vec![(id.clone(), 1, false)]);
    // Its connection ends: gone, its lease kept.
    h.engine().disconnected(1);
    let m = member_info(&mut h, "a");
    assert_eq!(
        (m.state, m.leased, m.liveness_ms),
        (MemberState::Gone, 1, 0)
    );
}

#[test]
fn liveness_outside_its_bounds_is_refused() {
    let mut h = Harness::new();
    for bad in [999, 60_001] {
        let e = h.call_on(1, open_with_liveness("a", 1, bad)).unwrap_err();
        assert_eq!(e.code, ErrorCode::BadRequest, "{bad}: {e:?}");
    }
    assert!(h.call_on(1, open_with_liveness("a", 1, 60_000)).is_ok());
}

#[test]
fn a_dead_members_lapsed_tasks_wait_for_another_member_with_one_failure_each() {
    let mut h = Harness::new();
    // The lease (3 s) is shorter than the liveness timeout (5 s): the leases lapse
    // while the dead member still counts as connected.
    queue(&mut h, 3_000);
    let a = h.enqueue("jobs", "1");
    let b = h.enqueue("jobs", "2");
    h.call_on(1, open("ghost", 2, true, false)).unwrap();
    h.call_on(1, subscribe("ghost", &["jobs"])).unwrap();
    assert_eq!(delivered(&h.pushed(1)).len(), 2);
    // kill -9: nothing more is heard from connection 1.
    h.advance(3_000);
    assert_eq!(h.state(&a), (TaskState::Ready, 1, 1));
    assert_eq!(h.state(&b), (TaskState::Ready, 1, 1));
    assert_eq!(member_info(&mut h, "ghost").state, MemberState::Connected);
    assert!(
        h.pushed(1).is_empty(),
        "not handed back to the silent member"
    );
    // Long after, the tasks still wait with one failure each.
    h.advance(30_000);
    assert_eq!(member_info(&mut h, "ghost").state, MemberState::Unreachable);
    assert_eq!(h.state(&a), (TaskState::Ready, 1, 1));
    // Another agent starts: it gets both at once.
    h.call_on(2, open("fresh", 2, true, false)).unwrap();
    h.call_on(2, subscribe("fresh", &["jobs"])).unwrap();
    let mut got = delivered(&h.pushed(2));
    got.sort();
    let mut want = vec![(a.clone(), 2, false), (b.clone(), 2, false)];
    want.sort();
    assert_eq!(got, want);
    assert_eq!(h.state(&a), (TaskState::Leased, 2, 1));
}

#[test]
fn the_only_member_gets_its_lapsed_task_back_once_heard_from_after_the_lapse() {
    let mut h = Harness::new();
    queue(&mut h, 3_000);
    let id = h.enqueue("jobs", "1");
    h.call_on(1, open("a", 1, true, false)).unwrap();
    h.call_on(1, subscribe("a", &["jobs"])).unwrap();
    assert_eq!(delivered(&h.pushed(1)).len(), 1);
    // Frozen past its lease, still within its liveness timeout.
    h.advance(3_000);
    assert_eq!(h.state(&id), (TaskState::Ready, 1, 1));
    assert!(h.pushed(1).is_empty());
    // A pull claim from another connection under another name may take it...
    // ...but here nobody else exists, and the member wakes up: it is heard from.
    advance_heard(&mut h, 1, 10);
    assert_eq!(delivered(&h.pushed(1)), vec![(id.clone(), 2, false)]);
    assert_eq!(h.state(&id), (TaskState::Leased, 2, 1));
}

#[test]
fn a_lapsed_task_goes_to_another_member_with_room_even_when_its_holder_is_alive() {
    let mut h = Harness::new();
    queue(&mut h, 3_000);
    let t = h.enqueue("jobs", "1");
    h.call_on(1, open("a", 1, true, false)).unwrap();
    h.call_on(1, subscribe("a", &["jobs"])).unwrap();
    assert_eq!(delivered(&h.pushed(1)), vec![(t.clone(), 1, false)]);
    let u = h.enqueue("jobs", "2");
    h.call_on(2, open("b", 1, true, false)).unwrap();
    h.call_on(2, subscribe("b", &["jobs"])).unwrap();
    assert_eq!(delivered(&h.pushed(2)), vec![(u.clone(), 1, false)]);
    // b renews, a does not: a's lease lapses; b is full, so a (heard from again) is the
    // only member that can take it.
    h.advance(2_000);
    h.call_on(2, super::renew(&u, 1)).unwrap();
    h.advance(1_000);
    assert_eq!(h.state(&t), (TaskState::Ready, 1, 1));
    advance_heard(&mut h, 1, 10);
    assert_eq!(delivered(&h.pushed(1)), vec![(t.clone(), 2, false)]);
    // Again, but now b has room: b gets it although a is alive.
    h.call_on(2, super::ack(&u, 1)).unwrap();
    advance_heard(&mut h, 1, 3_000);
    assert!(
        h.pushed(1).is_empty(),
        "a must not get it back while b has room"
    );
    assert_eq!(delivered(&h.pushed(2)), vec![(t.clone(), 3, false)]);
    assert_eq!(h.state(&t), (TaskState::Leased, 3, 2));
}

#[test]
fn a_parked_claim_of_a_silent_connection_is_not_served() {
    let mut h = Harness::new();
    queue(&mut h, 60_000);
    let claim = EngineRequest::Claim(Claim::new(["jobs"]).member("puller").wait_ms(120_000));
    let tag = h.send_on(5, claim);
    h.advance(5_001);
    let id = h.enqueue("jobs", "1");
    assert!(h.reply_for(tag).is_none(), "served a silent connection");
    assert_eq!(h.state(&id), (TaskState::Ready, 0, 0));
    // It is heard from again: the parked claim is served.
    let now = h.now;
    h.engine().heard(5, now);
    h.round();
    match h.reply_for(tag) {
        Some(Ok(Reply::Claim(c))) => assert_eq!(c.tasks.len(), 1),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_cancelled_running_task_ends_cancelled_without_a_failure() {
    let mut h = Harness::new();
    queue(&mut h, 3_000);
    let a = h.enqueue("jobs", "1");
    let b = h.enqueue("jobs", "2");
    let (_, ea) = h.claim_one("jobs");
    let (_, eb) = h.claim_one("jobs");
    for id in [&a, &b] {
        h.call(EngineRequest::Cancel(ops::Cancel {
            task: id.to_string(),
            if_state: None,
        }))
        .unwrap();
    }
    // One holder stops and nacks; the other dies and its lease lapses.
    h.call(EngineRequest::Nack(Nack {
        task: a.clone(),
        epoch: ea,
        delay_ms: None,
        error: Some("stopped".into()),
    }))
    .unwrap();
    h.advance(3_000);
    assert_eq!(eb, 1);
    for id in [&a, &b] {
        let t = h.task(id);
        assert_eq!((t.state, t.failures), (TaskState::Cancelled, 0), "{id}");
    }
}

#[test]
fn a_member_that_let_a_lease_lapse_gets_nothing_new_until_heard_from() {
    let mut h = Harness::new();
    queue(&mut h, 3_000);
    let first = h.enqueue("jobs", "1");
    h.call_on(1, open("a", 2, true, false)).unwrap();
    h.call_on(1, subscribe("a", &["jobs"])).unwrap();
    assert_eq!(delivered(&h.pushed(1)), vec![(first.clone(), 1, false)]);
    // Cut off: its lease lapses while it still counts as connected (3 s < 5 s).
    h.advance(3_000);
    assert_eq!(member_info(&mut h, "a").state, MemberState::Connected);
    let second = h.enqueue("jobs", "2");
    assert!(
        h.pushed(1).is_empty(),
        "a member silent since its lapse gets no new task"
    );
    assert_eq!(h.state(&second), (TaskState::Ready, 0, 0));
    // Heard from again: both come to it.
    advance_heard(&mut h, 1, 10);
    let mut got = delivered(&h.pushed(1));
    got.sort();
    let mut want = vec![(first, 2, false), (second, 1, false)];
    want.sort();
    assert_eq!(got, want);
}

#[test]
fn unclaimable_tasks_follow_members_connecting_going_silent_relabelling_and_leaving() {
    let mut h = Harness::new();
    queue(&mut h, 60_000);
    let requiring = |labels: &[&str]| {
        let mut t = muster_protocol::model::NewTask::new(super::raw("1"));
        t.requires = labels.iter().map(|l| (*l).to_owned()).collect();
        t
    };
    for labels in [&["gpu"][..], &["gpu"], &["gpu", "a100"], &[]] {
        h.enqueue_task("jobs", requiring(labels));
    }
    let gpu = || vec!["gpu".to_owned()];
    let both = || vec!["a100".to_owned(), "gpu".to_owned()];
    assert_eq!(unclaimable(&mut h), (3, 2, vec![both(), gpu()]));
    // A member carrying gpu (not subscribed, so it takes nothing) connects.
    let open_gpu = match open_with_liveness("a", 1, 2_000) {
        EngineRequest::SessionOpen(mut o) => {
            o.labels = vec!["gpu".into()];
            EngineRequest::SessionOpen(o)
        }
        _ => unreachable!("open builds a session_open"),
    };
    h.call_on(1, open_gpu).unwrap();
    assert_eq!(unclaimable(&mut h), (1, 1, vec![both()]));
    // It goes silent: its labels count for nothing until it is heard from again.
    h.advance(2_251);
    assert_eq!(member_info(&mut h, "a").state, MemberState::Unreachable);
    assert_eq!(unclaimable(&mut h), (3, 2, vec![both(), gpu()]));
    advance_heard(&mut h, 1, 1);
    assert_eq!(unclaimable(&mut h), (1, 1, vec![both()]));
    // It takes on a100 as well: nothing is unclaimable.
    h.call_on(
        1,
        EngineRequest::SessionUpdate(ops::SessionUpdate {
            member: "a".into(),
            labels: Some(vec!["gpu".into(), "a100".into()]),
            capacity: None,
        }),
    )
    .unwrap();
    assert_eq!(unclaimable(&mut h), (0, 0, vec![]));
    // A second member with only gpu; the first leaves: a100 is unclaimable again.
    let open_b = match open("b", 1, true, false) {
        EngineRequest::SessionOpen(mut o) => {
            o.labels = vec!["gpu".into()];
            EngineRequest::SessionOpen(o)
        }
        _ => unreachable!("open builds a session_open"),
    };
    h.call_on(2, open_b).unwrap();
    h.engine().disconnected(1);
    assert_eq!(unclaimable(&mut h), (1, 1, vec![both()]));
    // A newer session of b with no labels replaces the old one.
    h.call_on(3, open("b", 1, true, false)).unwrap();
    assert_eq!(unclaimable(&mut h), (3, 2, vec![both(), gpu()]));
}
