//! Fair dispatch between groups through the engine: backlogs, weights, restarts, keys
//! and bad options.

use std::collections::BTreeMap;

use muster_protocol::ErrorCode;
use muster_protocol::model::{NewTask, QueuePatch};
use muster_protocol::ops::{EngineRequest, Enqueue, QueueUpdate};

use super::{Harness, ack, raw};

fn fair(weights: &[(&str, u32)]) -> QueuePatch {
    QueuePatch {
        fair: Some(true),
        group_weights: Some(weights.iter().map(|(g, w)| ((*g).to_owned(), *w)).collect()),
        ..QueuePatch::default()
    }
}

/// Enqueues `n` tasks of `group` in batches, each with its group and a number as its
/// payload.
fn backlog(h: &mut Harness, queue: &str, group: &str, n: usize, key: Option<&str>) {
    for start in (0..n).step_by(1000) {
        let tasks = (start..n.min(start + 1000))
            .map(|i| NewTask {
                group: Some(group.to_owned()),
                key: key.map(str::to_owned),
                ..NewTask::new(raw(&i.to_string()))
            })
            .collect();
        h.call(EngineRequest::Enqueue(Enqueue {
            queue: queue.into(),
            tasks,
        }))
        .unwrap();
    }
}

/// Claims and acks `n` tasks one at a time; gives each one's group.
fn take(h: &mut Harness, queue: &str, n: usize) -> Vec<String> {
    (0..n)
        .map(|_| {
            let (id, epoch) = h.claim_one(queue);
            let group = h.task(&id).group.expect("every task here has a group");
            h.call(ack(&id, epoch)).unwrap();
            group
        })
        .collect()
}

fn update(h: &mut Harness, queue: &str, options: QueuePatch) -> Result<(), ErrorCode> {
    h.call(EngineRequest::QueueUpdate(QueueUpdate {
        queue: queue.into(),
        options,
    }))
    .map(drop)
    .map_err(|e| e.code)
}

#[test]
fn a_backlog_of_ten_thousand_delays_another_groups_task_by_one_dispatch() {
    let mut h = Harness::new();
    h.create("q", fair(&[]));
    backlog(&mut h, "q", "big", 10_000, None);
    assert_eq!(take(&mut h, "q", 5), vec!["big"; 5]);
    backlog(&mut h, "q", "small", 3, None);
    assert_eq!(
        take(&mut h, "q", 8),
        ["big", "small", "big", "small", "big", "small", "big", "big"]
    );
    // Without fair dispatch the same backlog would have gone first: the task shows its
    // group, and the plain queue hands out in enqueue order.
    h.create("plain", QueuePatch::default());
    backlog(&mut h, "plain", "big", 3, None);
    backlog(&mut h, "plain", "small", 1, None);
    assert_eq!(take(&mut h, "plain", 4), ["big", "big", "big", "small"]);
}

#[test]
fn weights_share_the_dispatches_and_a_new_weight_applies_at_once() {
    let mut h = Harness::new();
    h.create("q", fair(&[("gold", 3)]));
    backlog(&mut h, "q", "gold", 200, None);
    backlog(&mut h, "q", "tin", 200, None);
    let count = |v: &[String], g: &str| v.iter().filter(|x| *x == g).count();
    let got = take(&mut h, "q", 40);
    assert_eq!((count(&got, "gold"), count(&got, "tin")), (30, 10));
    update(&mut h, "q", fair(&[("gold", 1), ("tin", 4)])).unwrap();
    let got = take(&mut h, "q", 50);
    assert_eq!((count(&got, "gold"), count(&got, "tin")), (10, 40));
    let options = h.options("q");
    assert_eq!(
        (options.fair, options.group_weights),
        (true, BTreeMap::from([("tin".to_owned(), 4)])),
        "weight 1 takes gold's entry out"
    );
}

#[test]
fn fair_dispatch_turned_on_over_a_backlog_and_kept_across_a_restart() {
    let mut h = Harness::new();
    h.create("q", QueuePatch::default());
    backlog(&mut h, "q", "a", 100, None);
    backlog(&mut h, "q", "b", 100, None);
    assert_eq!(take(&mut h, "q", 2), ["a", "a"]);
    update(&mut h, "q", fair(&[])).unwrap();
    assert_eq!(take(&mut h, "q", 4), ["a", "b", "a", "b"]);
    h.restart(0);
    // The groups are stored with the tasks, the option with the queue: turns go on.
    assert_eq!(take(&mut h, "q", 4), ["a", "b", "a", "b"]);
    update(
        &mut h,
        "q",
        QueuePatch {
            fair: Some(false),
            ..QueuePatch::default()
        },
    )
    .unwrap();
    assert_eq!(take(&mut h, "q", 2), ["a", "a"]);
}

#[test]
fn keys_and_fair_turns_work_together() {
    let mut h = Harness::new();
    h.create("q", fair(&[]));
    // a's tasks share one key: one at a time, so while one is leased a has none to
    // offer and b takes every turn.
    backlog(&mut h, "q", "a", 5, Some("k"));
    backlog(&mut h, "q", "b", 5, None);
    let (first, epoch) = h.claim_one("q");
    assert_eq!(h.task(&first).group.as_deref(), Some("a"));
    assert_eq!(take(&mut h, "q", 3), ["b", "b", "b"]);
    h.call(ack(&first, epoch)).unwrap();
    // a comes back at the virtual time (b's pass) and wins the tie by name; then each
    // of its tasks, one at a time, comes back at its own pass, a turn ahead, so the two
    // alternate instead of a winning every tie by rejoining at the virtual time.
    assert_eq!(take(&mut h, "q", 4), ["a", "b", "a", "b"]);
}

#[test]
fn bad_groups_and_weights_are_refused_and_change_nothing() {
    let mut h = Harness::new();
    h.create("q", fair(&[("gold", 2)]));
    for bad in [
        fair(&[("gold", 0)]),
        fair(&[("gold", 1001)]),
        fair(&[("", 2)]),
        fair(&[("a\nb", 2)]),
    ] {
        assert_eq!(update(&mut h, "q", bad), Err(ErrorCode::BadRequest));
    }
    let many: Vec<(String, u32)> = (0..1001).map(|i| (format!("g{i}"), 2)).collect();
    let many = QueuePatch {
        group_weights: Some(many.into_iter().collect()),
        ..QueuePatch::default()
    };
    assert_eq!(update(&mut h, "q", many), Err(ErrorCode::Limit));
    assert_eq!(
        h.options("q").group_weights,
        BTreeMap::from([("gold".to_owned(), 2)])
    );
    let code = h.code(EngineRequest::Enqueue(Enqueue {
        queue: "q".into(),
        tasks: vec![NewTask {
            group: Some("x".repeat(129)),
            ..NewTask::new(raw("1"))
        }],
    }));
    assert_eq!(code, ErrorCode::BadRequest);
    assert_eq!(h.counts("q"), [0; 7]);
}
