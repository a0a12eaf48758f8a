//! Families: children spawned under a lease (fenced by its epoch, each once per child
//! key), a parent waiting for them without a lease, its wake with their outcomes, and
//! a cancel that reaches every unfinished descendant.

use muster_protocol::ErrorCode;
use muster_protocol::limits::{MAX_CHILDREN, MAX_DEPTH};
use muster_protocol::model::{NewTask, OnTimeout, QueuePatch, TaskState};
use muster_protocol::ops::{
    Ack, Cancel, Claim, EngineRequest, Nack, NewChild, Release, Spawn, SpawnReply, SpawnWait,
};

use super::{Harness, ack, raw};
use crate::engine::Reply;

fn child(key: &str, queue: &str) -> NewChild {
    NewChild {
        child_key: key.into(),
        queue: queue.into(),
        task: NewTask::new(raw(&format!(r#"{{"doc":"{key}"}}"#))),
    }
}

fn spawn_req(id: &str, epoch: u64, keys: &[&str], wait: Option<SpawnWait>) -> EngineRequest {
    EngineRequest::Spawn(Spawn {
        task: id.into(),
        epoch,
        children: keys.iter().map(|k| child(k, "work")).collect(),
        wait,
    })
}

fn spawn(h: &mut Harness, id: &str, epoch: u64, keys: &[&str], wait: bool) -> SpawnReply {
    let wait = wait.then(SpawnWait::default);
    match h.call(spawn_req(id, epoch, keys, wait)) {
        Ok(Reply::Spawn(r)) => r,
        other => panic!("spawn from {id}: {other:?}"),
    }
}

fn ack_with(id: &str, epoch: u64, result: &str) -> EngineRequest {
    EngineRequest::Ack(Ack {
        task: id.into(),
        epoch,
        result: Some(raw(result)),
    })
}

/// A queue `plan` for parents and `work` for children (one attempt: a nack is dead).
fn harness() -> Harness {
    let mut h = Harness::new();
    h.create("plan", QueuePatch::default());
    h.create(
        "work",
        QueuePatch {
            max_attempts: Some(1),
            ..QueuePatch::default()
        },
    );
    h
}

fn ids(r: &SpawnReply) -> Vec<String> {
    r.children.iter().map(|c| c.id.clone()).collect()
}

#[test]
fn a_waiting_parent_holds_nothing_and_wakes_once_every_child_ended_with_their_outcomes() {
    let mut h = harness();
    let parent = h.enqueue("plan", r#"{"docs":3}"#);
    let (_, epoch) = h.claim_one("plan");
    let r = spawn(&mut h, &parent, epoch, &["a", "b", "c"], true);
    assert_eq!(r.state, TaskState::Suspended);
    assert!(r.resume_token.is_some() && r.timeout_at_ms.is_some());
    assert_eq!(
        r.children
            .iter()
            .map(|c| (c.child_key.as_str(), c.duplicate, c.state))
            .collect::<Vec<_>>(),
        [
            ("a", false, TaskState::Ready),
            ("b", false, TaskState::Ready),
            ("c", false, TaskState::Ready)
        ]
    );
    let kids = ids(&r);
    // The parent holds no lease and no slot, spent no attempt, and shows its children.
    let t = h.task(&parent);
    assert_eq!(
        (t.state, t.deliveries, t.failures),
        (TaskState::Suspended, 1, 0)
    );
    assert!(t.lease.is_none());
    assert!(t.suspension.as_ref().unwrap().children);
    assert_eq!(
        t.children
            .iter()
            .map(|c| (
                c.id.as_str(),
                c.child_key.as_str(),
                c.queue.as_str(),
                c.state
            ))
            .collect::<Vec<_>>(),
        [
            (kids[0].as_str(), "a", "work", TaskState::Ready),
            (kids[1].as_str(), "b", "work", TaskState::Ready),
            (kids[2].as_str(), "c", "work", TaskState::Ready)
        ]
    );
    let c = h.task(&kids[0]);
    assert_eq!(
        (c.parent.as_deref(), c.child_key.as_deref()),
        (Some(parent.as_str()), Some("a"))
    );
    assert_eq!(h.counts("plan"), [0, 0, 0, 0, 0, 0, 1]);
    // Children run; the parent waits while any is unfinished.
    let got = h.claim_as("work", 2, "w");
    assert_eq!(
        got.iter().map(|g| g.0.as_str()).collect::<Vec<_>>(),
        [kids[0].as_str(), kids[1].as_str()]
    );
    h.call(ack_with(&kids[0], got[0].1, r#"{"words":120}"#))
        .unwrap();
    h.call(EngineRequest::Cancel(Cancel {
        task: kids[2].clone(),
        if_state: None,
    }))
    .unwrap();
    assert_eq!(h.state(&parent).0, TaskState::Suspended);
    // The last one ends dead (out of attempts): its parent wakes in the same change.
    h.call(EngineRequest::Nack(Nack {
        task: kids[1].clone(),
        epoch: got[1].1,
        delay_ms: None,
        error: Some("too long".into()),
    }))
    .unwrap();
    assert_eq!(h.state(&parent), (TaskState::Ready, 1, 0));
    let d = match h.call(EngineRequest::Claim(Claim::new(["plan"]).member("m2"))) {
        Ok(Reply::Claim(mut r)) => r.tasks.remove(0),
        other => panic!("claim: {other:?}"),
    };
    assert_eq!(
        (d.id.as_str(), d.attempt, d.failures),
        (parent.as_str(), 2, 0)
    );
    let resumed = d.resumed.expect("resumed by its children");
    assert!(!resumed.timed_out && resumed.data.is_none() && resumed.by.is_empty());
    assert_eq!(
        resumed
            .children
            .iter()
            .map(|c| (
                c.id.as_str(),
                c.child_key.as_str(),
                c.state,
                c.result.as_ref().map(|r| r.get()),
                c.error.as_deref(),
                c.omitted
            ))
            .collect::<Vec<_>>(),
        [
            (
                kids[0].as_str(),
                "a",
                TaskState::Done,
                Some(r#"{"words":120}"#),
                None,
                false
            ),
            (
                kids[1].as_str(),
                "b",
                TaskState::Dead,
                None,
                Some("too long"),
                false
            ),
            (
                kids[2].as_str(),
                "c",
                TaskState::Cancelled,
                None,
                None,
                false
            )
        ]
    );
    let events: Vec<String> = h
        .task(&parent)
        .history
        .into_iter()
        .map(|e| e.event)
        .collect();
    assert_eq!(
        events,
        [
            "enqueued",
            "leased",
            "spawned",
            "suspended",
            "children_finished",
            "leased"
        ]
    );
}

#[test]
fn a_spawn_is_fenced_by_its_epoch_and_a_reclaimed_parent_spawns_nothing_twice() {
    let mut h = harness();
    let parent = h.enqueue("plan", "{}");
    let (_, epoch) = h.claim_one("plan");
    let first = spawn(&mut h, &parent, epoch, &["a", "b"], false);
    assert_eq!(
        first.state,
        TaskState::Leased,
        "no wait: the parent keeps its lease"
    );
    h.call(EngineRequest::Release(Release {
        task: parent.clone(),
        epoch,
    }))
    .unwrap();
    // The old holder's spawn is refused; the new holder's finds a and b spawned.
    assert_eq!(
        h.code(spawn_req(&parent, epoch, &["c"], None)),
        ErrorCode::LeaseLost
    );
    let (_, epoch2) = h.claim_one("plan");
    assert_eq!(epoch2, epoch + 1);
    let again = spawn(&mut h, &parent, epoch2, &["a", "b", "c"], false);
    assert_eq!(
        again
            .children
            .iter()
            .map(|c| (c.child_key.as_str(), c.duplicate))
            .collect::<Vec<_>>(),
        [("a", true), ("b", true), ("c", false)]
    );
    assert_eq!(ids(&again)[..2], ids(&first)[..]);
    assert_eq!(h.counts("work"), [0, 3, 0, 0, 0, 0, 0]);
    assert_eq!(h.task(&parent).children.len(), 3);
}

#[test]
fn a_spawn_and_wait_repeated_after_a_lost_reply_gets_the_same_children_and_a_new_token() {
    let mut h = harness();
    let parent = h.enqueue("plan", "{}");
    let (_, epoch) = h.claim_one("plan");
    let first = spawn(&mut h, &parent, epoch, &["a", "b"], true);
    let again = spawn(&mut h, &parent, epoch, &["a", "b"], true);
    assert_eq!(again.state, TaskState::Suspended);
    assert_eq!(ids(&again), ids(&first));
    assert!(again.children.iter().all(|c| c.duplicate));
    assert_ne!(again.resume_token, first.resume_token);
    assert_eq!(again.timeout_at_ms, first.timeout_at_ms);
    // A key it never spawned is no repeat.
    assert_eq!(
        h.code(spawn_req(
            &parent,
            epoch,
            &["a", "z"],
            Some(SpawnWait::default())
        )),
        ErrorCode::InvalidState
    );
    assert_eq!(h.counts("work"), [0, 2, 0, 0, 0, 0, 0]);
}

#[test]
fn cancelling_a_parent_cancels_its_unfinished_descendants_and_asks_their_holders() {
    let mut h = harness();
    let root = h.enqueue("plan", "{}");
    let (_, epoch) = h.claim_one("plan");
    let kids = ids(&spawn(&mut h, &root, epoch, &["a", "b", "c"], false));
    // a is held and spawns a grandchild; b is done; c waits.
    let got = h.claim_as("work", 2, "w");
    assert_eq!(got[0].0, kids[0]);
    h.call(ack(&kids[1], got[1].1)).unwrap();
    let grand = ids(&spawn(&mut h, &kids[0], got[0].1, &["g"], false));
    h.call(EngineRequest::Cancel(Cancel {
        task: root.clone(),
        if_state: None,
    }))
    .unwrap();
    let t = h.task(&root);
    assert_eq!((t.state, t.cancel_requested), (TaskState::Leased, true));
    let a = h.task(&kids[0]);
    assert_eq!((a.state, a.cancel_requested), (TaskState::Leased, true));
    assert_eq!(
        h.state(&kids[1]).0,
        TaskState::Done,
        "a finished child stays"
    );
    assert_eq!(h.state(&kids[2]).0, TaskState::Cancelled);
    let g = h.task(&grand[0]);
    assert_eq!(g.state, TaskState::Cancelled);
    assert_eq!(
        g.history
            .last()
            .map(|e| (e.event.as_str(), e.error.as_deref())),
        Some(("cancelled", Some("its parent was cancelled")))
    );
    // The holders settle: each ends cancelled.
    h.call(ack(&kids[0], got[0].1)).unwrap();
    h.call(ack(&root, epoch)).unwrap();
    assert_eq!(h.state(&kids[0]).0, TaskState::Cancelled);
    assert_eq!(h.state(&root).0, TaskState::Cancelled);
}

#[test]
fn a_wait_outlives_restarts_and_the_last_childs_ack_wakes_its_parent() {
    let mut h = harness();
    let parent = h.enqueue("plan", "{}");
    let (_, epoch) = h.claim_one("plan");
    let kids = ids(&spawn(&mut h, &parent, epoch, &["a", "b"], true));
    h.restart(1_000);
    assert_eq!(h.state(&parent).0, TaskState::Suspended);
    let got = h.claim_as("work", 2, "w");
    h.call(ack(&kids[0], got[0].1)).unwrap();
    h.restart(1_000);
    let t = h.task(&parent);
    assert_eq!(t.state, TaskState::Suspended);
    assert_eq!(
        t.children.iter().map(|c| c.state).collect::<Vec<_>>(),
        [TaskState::Done, TaskState::Leased]
    );
    h.call(ack(&kids[1], got[1].1)).unwrap();
    assert_eq!(h.state(&parent).0, TaskState::Ready);
    h.restart(1_000);
    let resumed = h.task(&parent).resumed.unwrap();
    assert_eq!(
        resumed.children.iter().map(|c| c.state).collect::<Vec<_>>(),
        [TaskState::Done, TaskState::Done]
    );
}

#[test]
fn a_wait_whose_children_all_ended_wakes_at_once_and_a_timeout_shows_them_as_they_stand() {
    let mut h = harness();
    let parent = h.enqueue("plan", "{}");
    let (_, epoch) = h.claim_one("plan");
    let kids = ids(&spawn(&mut h, &parent, epoch, &["a"], false));
    let (_, ce) = h.claim_one("work");
    h.call(ack_with(&kids[0], ce, "7")).unwrap();
    let r = spawn(&mut h, &parent, epoch, &[], true);
    assert_eq!((r.state, r.resume_token), (TaskState::Ready, None));
    let t = h.task(&parent);
    assert_eq!(t.state, TaskState::Ready);
    let resumed = t.resumed.unwrap();
    assert_eq!(resumed.children.len(), 1);
    assert_eq!(resumed.children[0].result.as_ref().unwrap().get(), "7");
    // A wait with a timeout that resumes: the children as they stand then.
    let (_, epoch) = h.claim_one("plan");
    let more = ids(&spawn(&mut h, &parent, epoch, &["b"], false));
    let r = match h.call(EngineRequest::Spawn(Spawn {
        task: parent.clone(),
        epoch,
        children: vec![],
        wait: Some(SpawnWait {
            reason: Some("summaries".into()),
            timeout_ms: Some(5_000),
            on_timeout: Some(OnTimeout::Resume),
        }),
    })) {
        Ok(Reply::Spawn(r)) => r,
        other => panic!("{other:?}"),
    };
    assert_eq!(r.state, TaskState::Suspended);
    h.advance(5_000);
    let t = h.task(&parent);
    assert_eq!(t.state, TaskState::Ready);
    let resumed = t.resumed.unwrap();
    assert!(resumed.timed_out);
    assert_eq!(
        resumed
            .children
            .iter()
            .map(|c| (c.id.as_str(), c.state))
            .collect::<Vec<_>>(),
        [
            (kids[0].as_str(), TaskState::Done),
            (more[0].as_str(), TaskState::Ready)
        ]
    );
}

#[test]
fn spawns_past_a_limit_or_malformed_are_refused_and_change_nothing() {
    let mut h = harness();
    let parent = h.enqueue("plan", "{}");
    let (_, epoch) = h.claim_one("plan");
    let code = |h: &mut Harness, children: Vec<NewChild>, wait: Option<SpawnWait>| {
        h.code(EngineRequest::Spawn(Spawn {
            task: parent.clone(),
            epoch,
            children,
            wait,
        }))
    };
    assert_eq!(code(&mut h, vec![], None), ErrorCode::BadRequest);
    assert_eq!(
        code(&mut h, vec![child("a", "work"), child("a", "work")], None),
        ErrorCode::BadRequest
    );
    assert_eq!(
        code(&mut h, vec![child("", "work")], None),
        ErrorCode::BadRequest
    );
    let mut keyed = child("a", "work");
    keyed.task.idempotency_key = Some("k".into());
    assert_eq!(code(&mut h, vec![keyed], None), ErrorCode::BadRequest);
    // A missing queue after a good one: nothing of the spawn is stored.
    assert_eq!(
        code(
            &mut h,
            vec![child("a", "work"), child("b", "nowhere")],
            None
        ),
        ErrorCode::NotFound
    );
    let wait = SpawnWait {
        timeout_ms: Some(0),
        ..SpawnWait::default()
    };
    assert_eq!(
        code(&mut h, vec![child("a", "work")], Some(wait)),
        ErrorCode::BadRequest
    );
    assert_eq!(h.counts("work"), [0; 7]);
    // Children per parent.
    let many: Vec<String> = (0..MAX_CHILDREN).map(|i| format!("k{i}")).collect();
    let keys: Vec<&str> = many.iter().map(String::as_str).collect();
    spawn(&mut h, &parent, epoch, &keys, false);
    assert_eq!(
        code(&mut h, vec![child("one-more", "work")], None),
        ErrorCode::Limit
    );
    // Spawning known keys again is no new child, so no limit.
    assert!(spawn(&mut h, &parent, epoch, &["k0"], false).children[0].duplicate);
    assert_eq!(h.counts("work")[1], MAX_CHILDREN as u64);
    // Depth: a chain of MAX_DEPTH spawns, then one more is refused.
    let mut h = harness();
    let mut task = h.enqueue("work", "{}");
    for depth in 1..=MAX_DEPTH {
        let (id, epoch) = h.claim_one("work");
        assert_eq!(id, task);
        let next = ids(&spawn(&mut h, &task, epoch, &["next"], false));
        h.call(ack(&task, epoch)).unwrap();
        task = next[0].clone();
        assert_eq!(
            h.task(&task).child_key.as_deref(),
            Some("next"),
            "depth {depth}"
        );
    }
    let (_, epoch) = h.claim_one("work");
    assert_eq!(
        h.code(spawn_req(&task, epoch, &["too-deep"], None)),
        ErrorCode::Limit
    );
}

#[test]
fn a_crash_between_a_childs_end_and_its_parents_wake_is_finished_at_start() {
    let mut h = harness();
    let parent = h.enqueue("plan", "{}");
    let (_, epoch) = h.claim_one("plan");
    let kids = ids(&spawn(&mut h, &parent, epoch, &["a"], true));
    // What a crash between a round's two commits leaves: the child's end stored, its
    // parent's wake not.
    let child: ulid::Ulid = kids[0].parse().unwrap();
    let wall_ms = h.now.wall_ms;
    {
        let store = h.engine().store();
        let mut rec = store.task(child).unwrap().unwrap();
        rec.state = TaskState::Done;
        rec.finished_ms = Some(wall_ms);
        let mut batch = store.batch();
        batch.put_task(child, &rec);
        batch.commit().unwrap();
    }
    h.restart(1_000);
    // The first round after the start wakes it.
    let t = h.task(&parent);
    assert_eq!(t.state, TaskState::Ready);
    let resumed = t.resumed.expect("woken by its children");
    assert_eq!(
        resumed
            .children
            .iter()
            .map(|c| (c.id.as_str(), c.state))
            .collect::<Vec<_>>(),
        [(kids[0].as_str(), TaskState::Done)]
    );
}

#[test]
fn a_cascade_past_one_round_goes_on_in_the_next_and_after_a_restart() {
    let mut h = harness();
    let root = h.enqueue("plan", "{}");
    let (_, epoch) = h.claim_one("plan");
    // Two generations: more descendants than one round cancels.
    let many: Vec<String> = (0..MAX_CHILDREN).map(|i| format!("k{i}")).collect();
    let keys: Vec<&str> = many.iter().map(String::as_str).collect();
    let kids = ids(&spawn(&mut h, &root, epoch, &keys, false));
    let got = h.claim_as("work", 1, "w");
    assert_eq!(got[0].0, kids[0]);
    let grand = ids(&spawn(&mut h, &kids[0], got[0].1, &["g1", "g2"], false));
    let unfinished = |h: &mut Harness| {
        let counts = h.counts("work");
        counts[0] + counts[1] + counts[6]
    };
    assert_eq!(unfinished(&mut h), (MAX_CHILDREN - 1 + 2) as u64);
    // The cancel's request cancels CASCADE_BATCH (its children) and no more: the
    // grandchildren are left for the next round, which a restart comes before.
    let tag = super::Tag {
        seq: u64::MAX,
        conn: 0,
        principal: None,
    };
    let now = h.now;
    h.engine()
        .handle(
            EngineRequest::Cancel(Cancel {
                task: root.clone(),
                if_state: None,
            }),
            tag,
            now,
        )
        .unwrap();
    let _ = h.engine().take_outbox().count();
    for g in &grand {
        assert_eq!(
            h.engine().index.tasks[&g.parse().unwrap()].state,
            TaskState::Ready
        );
    }
    h.restart(1_000);
    assert_eq!(unfinished(&mut h), 0);
    for g in &grand {
        assert_eq!(h.state(g).0, TaskState::Cancelled);
    }
    assert!(h.task(&kids[0]).cancel_requested);
    assert!(h.task(&root).cancel_requested);
}

#[test]
fn a_parent_waiting_for_children_that_are_all_gone_wakes_at_start() {
    let mut h = harness();
    let parent = h.enqueue("plan", "{}");
    let (_, epoch) = h.claim_one("plan");
    let kids = ids(&spawn(&mut h, &parent, epoch, &["a"], true));
    // What a crash leaves after a queue_delete's slice removed the only child and
    // before its parent's wake was committed.
    let child: ulid::Ulid = kids[0].parse().unwrap();
    {
        let store = h.engine().store();
        let mut batch = store.batch();
        batch.remove_task(child, "work", None);
        batch.commit().unwrap();
    }
    h.restart(1_000);
    let t = h.task(&parent);
    assert_eq!(t.state, TaskState::Ready);
    assert!(t.resumed.unwrap().children.is_empty());
    assert!(t.children.is_empty());
}

#[test]
fn a_finished_parent_outlives_its_retention_while_a_child_is_unfinished() {
    let mut h = Harness::new();
    let brief = QueuePatch {
        retention_ms: Some(1_000),
        ..QueuePatch::default()
    };
    h.create("plan", brief.clone());
    h.create("work", brief);
    let parent = h.enqueue("plan", "{}");
    let (_, epoch) = h.claim_one("plan");
    let kids = ids(&spawn(&mut h, &parent, epoch, &["a"], false));
    h.call(ack(&parent, epoch)).unwrap();
    h.advance(30_000);
    assert_eq!(h.state(&parent).0, TaskState::Done, "kept for its child");
    let (_, ce) = h.claim_one("work");
    h.call(ack(&kids[0], ce)).unwrap();
    // The child goes after its own retention, then the parent at its next look.
    h.advance(1_000);
    h.advance(5_000);
    assert_eq!(
        h.code(EngineRequest::TaskGet(muster_protocol::ops::TaskGet {
            task: parent.clone()
        })),
        ErrorCode::NotFound
    );
    assert_eq!(
        h.code(EngineRequest::TaskGet(muster_protocol::ops::TaskGet {
            task: kids[0].clone()
        })),
        ErrorCode::NotFound
    );
}

#[test]
fn a_spawn_and_wait_never_repeats_a_plain_suspension() {
    let mut h = harness();
    let parent = h.enqueue("plan", "{}");
    let (_, epoch) = h.claim_one("plan");
    h.call(EngineRequest::Suspend(muster_protocol::ops::Suspend {
        task: parent.clone(),
        epoch,
        reason: "a person".into(),
        timeout_ms: None,
        on_timeout: None,
    }))
    .unwrap();
    assert_eq!(
        h.code(spawn_req(&parent, epoch, &[], Some(SpawnWait::default()))),
        ErrorCode::LeaseLost
    );
    assert!(!h.task(&parent).suspension.unwrap().children);
}

#[test]
fn childrens_outcomes_count_against_the_parents_enqueuer() {
    let producer = super::principal(
        r#"
[[tokens]]
name = "planner"
token = "planner-token-0123456789ab"
roles = ["admin"]
"#,
        "planner-token-0123456789ab",
    );
    let mut h = harness();
    h.principal = Some(producer);
    let parent = h.enqueue("plan", "1");
    let (_, epoch) = h.claim_one("plan");
    let kids = ids(&spawn(&mut h, &parent, epoch, &["a"], true));
    let (_, ce) = h.claim_one("work");
    let before = h.engine().budget.stored_bytes["planner"];
    h.call(ack_with(&kids[0], ce, "12345")).unwrap();
    let outcome = kids[0].len() + "a".len() + "work".len() + "12345".len();
    let counted = outcome + muster_protocol::limits::CHILD_OUTCOME_OVERHEAD_BYTES;
    // The child's result (5 bytes) and the parent's outcomes.
    assert_eq!(
        h.engine().budget.stored_bytes["planner"],
        before + 5 + counted as u64
    );
}

#[test]
fn a_watched_task_screen_carries_its_family_tree_depth_first() {
    use muster_protocol::ops::{View, Watch, WatchUpdate};
    let mut h = harness();
    let root = h.enqueue("plan", "{}");
    let (_, epoch) = h.claim_one("plan");
    let kids = ids(&spawn(&mut h, &root, epoch, &["a", "b"], false));
    // "a" spawns a grandchild; "b" none.
    let (first, ce) = h.claim_one("work");
    assert_eq!(first, kids[0]);
    let grand = ids(&spawn(&mut h, &kids[0], ce, &["a1"], false));
    let tree = match h.call_on(
        9,
        EngineRequest::Watch(Watch {
            view: View::Task { task: root.clone() },
            tag: 1,
        }),
    ) {
        Ok(Reply::Watch(r)) => match r.update {
            WatchUpdate::Task {
                tree,
                tree_truncated,
                ..
            } => {
                assert!(!tree_truncated);
                tree
            }
            other => panic!("{other:?}"),
        },
        other => panic!("watch: {other:?}"),
    };
    let shown: Vec<(u8, &str, &str, TaskState, u32)> = tree
        .iter()
        .map(|n| {
            (
                n.depth,
                n.child.child_key.as_str(),
                n.child.id.as_str(),
                n.child.state,
                n.child.children,
            )
        })
        .collect();
    assert_eq!(
        shown,
        [
            (1, "a", kids[0].as_str(), TaskState::Leased, 1),
            (2, "a1", grand[0].as_str(), TaskState::Ready, 0),
            (1, "b", kids[1].as_str(), TaskState::Ready, 0),
        ]
    );
}
