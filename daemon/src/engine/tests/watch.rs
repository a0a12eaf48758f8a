//! Watches: the screen comes with the reply, changes are pushed at most once per
//! interval, an idle daemon pushes nothing (but the limits screen, whose buckets refill
//! with time), pages follow their cursors, and a screen whose subject disappears is
//! pushed once as `gone`.

use muster_protocol::model::{
    LimitInfo, LimitKeyInfo, LimitSpec, LimitUse, NewTask, QueuePatch, Rate, TaskState,
};
use muster_protocol::ops::{self, DeadSelection, QueueName, View, Watch, WatchUpdate};
use muster_protocol::{ErrorCode, Push, ops::EngineRequest};

use super::{Harness, Reply, dead_letter, open, subscribe};

const WATCHER: u64 = 9;

fn watch(h: &mut Harness, view: View) -> WatchUpdate {
    match h.call_on(WATCHER, EngineRequest::Watch(Watch { view, tag: 7 })) {
        Ok(Reply::Watch(r)) => {
            assert_eq!(r.tag, 7);
            r.update
        }
        other => panic!("watch: {other:?}"),
    }
}

fn watch_error(h: &mut Harness, view: View) -> ErrorCode {
    match h.call_on(WATCHER, EngineRequest::Watch(Watch { view, tag: 8 })) {
        Err(e) => e.code,
        other => panic!("expected an error, got {other:?}"),
    }
}

fn updates(h: &mut Harness) -> Vec<WatchUpdate> {
    h.pushed(WATCHER)
        .into_iter()
        .map(|p| match p {
            Push::Watch(w) => {
                assert_eq!(w.tag, 7, "pushes carry the watch's tag");
                w.update
            }
            other => panic!("unexpected push {other:?}"),
        })
        .collect()
}

fn tasks_view(queue: &str, state: TaskState, after: Option<String>, limit: u32) -> View {
    View::Tasks {
        queue: queue.into(),
        state,
        after,
        limit: Some(limit),
    }
}

fn ids(update: &WatchUpdate) -> (Vec<String>, Option<String>) {
    match update {
        WatchUpdate::Tasks { tasks, next, .. } | WatchUpdate::Dead { tasks, next, .. } => {
            (tasks.iter().map(|t| t.id.clone()).collect(), next.clone())
        }
        other => panic!("not a task page: {other:?}"),
    }
}

#[test]
fn the_reply_carries_the_screen_and_changes_are_pushed_at_most_once_a_second() {
    let mut h = Harness::new();
    h.create("q", QueuePatch::default());
    let first = h.enqueue("q", "1");
    match watch(
        &mut h,
        View::Queues {
            after: None,
            limit: None,
        },
    ) {
        WatchUpdate::Queues { queues, next } => {
            assert_eq!(queues.len(), 1);
            assert_eq!((queues[0].name.as_str(), queues[0].counts.ready), ("q", 1));
            assert_eq!(next, None);
        }
        other => panic!("{other:?}"),
    }
    // Nothing changed: nothing is pushed, however long we wait.
    h.advance(5_000);
    assert_eq!(updates(&mut h).len(), 0);
    // Three changes inside one interval make one push, sent when the interval is over.
    h.advance(500);
    h.enqueue("q", "2");
    h.enqueue("q", "3");
    assert_eq!(
        updates(&mut h).len(),
        1,
        "the first change after a quiet second goes at once"
    );
    h.enqueue("q", "4");
    h.enqueue("q", "5");
    h.advance(999);
    assert_eq!(
        updates(&mut h).len(),
        0,
        "within the interval nothing more is pushed"
    );
    let now = h.now;
    assert_eq!(
        h.engine().next_timer(now),
        Some(1),
        "the dispatcher wakes for the push"
    );
    h.advance(1);
    let pushed = updates(&mut h);
    assert_eq!(pushed.len(), 1);
    match &pushed[0] {
        WatchUpdate::Queues { queues, .. } => assert_eq!(queues[0].counts.ready, 5),
        other => panic!("{other:?}"),
    }
    h.advance(3_000);
    assert_eq!(updates(&mut h).len(), 0);
    // Unwatch ends the pushes.
    h.call_on(WATCHER, EngineRequest::Unwatch(ops::Unwatch {}))
        .unwrap();
    let (claimed, epoch) = h.claim_one("q");
    assert_eq!(claimed, first);
    h.call(super::ack(&claimed, epoch)).unwrap();
    h.advance(2_000);
    assert_eq!(updates(&mut h).len(), 0);
    assert_eq!(h.state(&first).0, TaskState::Done);
}

#[test]
fn task_pages_follow_their_cursors_and_the_queue_counts_come_along() {
    let mut h = Harness::new();
    h.create("q", QueuePatch::default());
    let all: Vec<String> = (0..7).map(|i| h.enqueue("q", &i.to_string())).collect();
    let page1 = watch(&mut h, tasks_view("q", TaskState::Ready, None, 3));
    assert_eq!(ids(&page1), (all[..3].to_vec(), Some(all[2].clone())));
    match &page1 {
        WatchUpdate::Tasks {
            queue,
            state,
            tasks,
            ..
        } => {
            assert_eq!((queue.counts.ready, *state), (7, TaskState::Ready));
            assert_eq!(tasks[0].queue, "q");
        }
        other => panic!("{other:?}"),
    }
    let page3 = watch(
        &mut h,
        tasks_view("q", TaskState::Ready, Some(all[5].clone()), 3),
    );
    assert_eq!(ids(&page3), (vec![all[6].clone()], None));
    let leased = watch(&mut h, tasks_view("q", TaskState::Leased, None, 3));
    assert_eq!(ids(&leased), (vec![], None));
    // The leased page is pushed once a task is leased, with its holder.
    h.advance(1_000);
    let (id, _) = h.claim_one("q");
    let pushed = updates(&mut h);
    assert_eq!(pushed.len(), 1);
    match &pushed[0] {
        WatchUpdate::Tasks { tasks, .. } => {
            assert_eq!(tasks.len(), 1);
            assert_eq!(tasks[0].id, id);
            assert_eq!(
                tasks[0].lease.as_ref().map(|l| l.member.as_str()),
                Some("m1")
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_dead_screen_spans_queues_with_a_cursor_that_survives_a_redrive() {
    let mut h = Harness::new();
    h.create("a", QueuePatch::default());
    h.create("b", QueuePatch::default());
    let mut dead = Vec::new();
    for q in ["b", "a", "b"] {
        h.enqueue(q, "1");
        let (id, epoch) = h.claim_one(q);
        h.call(dead_letter(&id, epoch)).unwrap();
        dead.push((q, id));
    }
    // By queue name, then id: a's one, then b's two.
    let order = [dead[1].1.clone(), dead[0].1.clone(), dead[2].1.clone()];
    let first = watch(
        &mut h,
        View::Dead {
            after: None,
            limit: Some(2),
        },
    );
    assert_eq!(
        ids(&first),
        (order[..2].to_vec(), Some(format!("b/{}", order[1])))
    );
    match &first {
        WatchUpdate::Dead { tasks, total, .. } => {
            assert_eq!(*total, 3);
            assert_eq!(tasks[1].dead_reason.as_deref(), Some("dead_lettered"));
            assert_eq!(tasks[1].last_error.as_deref(), Some("poison"));
        }
        other => panic!("{other:?}"),
    }
    // The cursor's own task is redriven; the next page still starts after it.
    h.call(EngineRequest::Redrive(ops::Redrive(DeadSelection {
        queue: "b".into(),
        ids: vec![order[1].clone()],
        all: false,
        dry_run: false,
    })))
    .unwrap();
    let second = watch(
        &mut h,
        View::Dead {
            after: Some(format!("b/{}", order[1])),
            limit: Some(2),
        },
    );
    assert_eq!(ids(&second), (vec![order[2].clone()], None));
    assert_eq!(
        watch_error(
            &mut h,
            View::Dead {
                after: Some("nope".into()),
                limit: None
            }
        ),
        ErrorCode::BadRequest
    );
}

#[test]
fn members_and_task_screens_and_bad_views() {
    let mut h = Harness::new();
    h.create("q", QueuePatch::default());
    let id = h.enqueue("q", r#"{"prompt":"hi"}"#);
    match watch(&mut h, View::Task { task: id.clone() }) {
        WatchUpdate::Task { task, .. } => {
            assert_eq!(task.payload.get(), r#"{"prompt":"hi"}"#);
            assert_eq!(task.history.len(), 1);
        }
        other => panic!("{other:?}"),
    }
    // A session on another connection is a member event: the task screen is pushed
    // only when the task's generation moved, and here it did (the engine's is global).
    match h.call_on(3, open("gpu-1", 4, true, false)).unwrap() {
        Reply::SessionOpen(_) => {}
        other => panic!("{other:?}"),
    }
    h.call_on(3, subscribe("gpu-1", &["q"])).unwrap();
    // One member and what it holds: the task it took by push.
    match watch(
        &mut h,
        View::Member {
            member: "gpu-1".into(),
        },
    ) {
        WatchUpdate::Member { member, leases } => {
            assert_eq!((member.name.as_str(), member.leased), ("gpu-1", 1));
            assert_eq!(leases.len(), 1);
            assert_eq!(
                (leases[0].id.as_str(), leases[0].queue.as_str()),
                (id.as_str(), "q")
            );
            assert_eq!(
                leases[0].lease.as_ref().map(|l| l.member.as_str()),
                Some("gpu-1")
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        watch_error(
            &mut h,
            View::Member {
                member: "nobody".into()
            }
        ),
        ErrorCode::NotFound
    );
    match watch(
        &mut h,
        View::Members {
            after: None,
            limit: None,
        },
    ) {
        WatchUpdate::Members {
            members,
            connected,
            next,
        } => {
            assert_eq!(members.len(), 1);
            assert_eq!(members[0].name, "gpu-1");
            // The subscription took the task by push.
            assert_eq!((members[0].capacity, members[0].leased), (4, 1));
            assert_eq!((connected, next), (1, None));
        }
        other => panic!("{other:?}"),
    }
    h.advance(1_000);
    h.engine().disconnected(3);
    h.advance(0);
    match updates(&mut h).as_slice() {
        [
            WatchUpdate::Members {
                members, connected, ..
            },
        ] => {
            assert_eq!((members[0].connected, *connected), (false, 0));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        watch_error(
            &mut h,
            View::Task {
                task: "01JAAAAAAAAAAAAAAAAAAAAAAA".into()
            }
        ),
        ErrorCode::NotFound
    );
    assert_eq!(
        watch_error(&mut h, tasks_view("nope", TaskState::Ready, None, 10)),
        ErrorCode::NotFound
    );
    assert_eq!(
        watch_error(&mut h, tasks_view("q", TaskState::Ready, None, 0)),
        ErrorCode::BadRequest
    );
    assert_eq!(
        watch_error(&mut h, tasks_view("q", TaskState::Ready, None, 501)),
        ErrorCode::BadRequest
    );
    assert_eq!(
        watch_error(
            &mut h,
            tasks_view("q", TaskState::Ready, Some("x".into()), 10)
        ),
        ErrorCode::BadRequest
    );
}

#[test]
fn a_watched_queue_that_is_deleted_is_pushed_once_as_gone() {
    let mut h = Harness::new();
    h.create("q", QueuePatch::default());
    h.enqueue("q", "1");
    watch(&mut h, tasks_view("q", TaskState::Ready, None, 10));
    h.advance(1_000);
    h.call(EngineRequest::QueueDelete(ops::QueueDelete(QueueName {
        queue: "q".into(),
    })))
    .unwrap();
    match updates(&mut h).as_slice() {
        [WatchUpdate::Gone { error }] => assert_eq!(error.code, ErrorCode::NotFound),
        other => panic!("{other:?}"),
    }
    h.create("q", QueuePatch::default());
    h.advance(2_000);
    assert_eq!(updates(&mut h).len(), 0, "the watch ended with `gone`");
}

#[test]
fn a_console_that_stops_reading_has_one_push_queued_not_one_per_second() {
    let mut h = Harness::new();
    h.create("q", QueuePatch::default());
    watch(
        &mut h,
        View::Queues {
            after: None,
            limit: None,
        },
    );
    h.reading = false;
    for _ in 0..5 {
        h.advance(1_000);
        h.enqueue("q", "1");
    }
    assert_eq!(updates(&mut h).len(), 1, "one push waits for the writer");
    let now = h.now;
    assert_eq!(
        h.engine().next_timer(now),
        None,
        "and the dispatcher does not spin on it"
    );
    // The writer catches up: the screen as it is now follows at the next round.
    h.reading = true;
    for queued in std::mem::take(&mut h.unread) {
        queued.store(false, std::sync::atomic::Ordering::Release);
    }
    h.advance(0);
    match updates(&mut h).as_slice() {
        [WatchUpdate::Queues { queues, .. }] => assert_eq!(queues[0].counts.ready, 5),
        other => panic!("{other:?}"),
    }
}

#[test]
fn rows_carry_the_last_error_cut_and_the_task_screen_carries_it_whole() {
    let mut h = Harness::new();
    h.create("q", QueuePatch::default());
    let id = h.enqueue("q", "1");
    let (_, epoch) = h.claim_one("q");
    let long = "é".repeat(400); // 800 bytes; the cut must land on a character boundary
    h.call(EngineRequest::DeadLetter(ops::DeadLetter {
        task: id.clone(),
        epoch,
        error: long.clone(),
    }))
    .unwrap();
    match watch(
        &mut h,
        View::Dead {
            after: None,
            limit: None,
        },
    ) {
        WatchUpdate::Dead { tasks, .. } => {
            let cut = tasks[0].last_error.clone().unwrap();
            assert_eq!(cut, format!("{}…", "é".repeat(256)));
        }
        other => panic!("{other:?}"),
    }
    match watch(&mut h, View::Task { task: id }) {
        WatchUpdate::Task { task, .. } => assert_eq!(task.last_error, Some(long)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn watches_are_limited_and_a_connection_replaces_its_own() {
    use muster_protocol::limits::MAX_WATCHES;
    let mut h = Harness::new();
    let view = || View::Queues {
        after: None,
        limit: None,
    };
    for conn in 0..MAX_WATCHES as u64 {
        match h.call_on(
            100 + conn,
            EngineRequest::Watch(Watch {
                view: view(),
                tag: 1,
            }),
        ) {
            Ok(Reply::Watch(_)) => {}
            other => panic!("watch {conn}: {other:?}"),
        }
    }
    let extra = h.call_on(
        99,
        EngineRequest::Watch(Watch {
            view: view(),
            tag: 1,
        }),
    );
    assert_eq!(extra.map(|_| ()).map_err(|e| e.code), Err(ErrorCode::Limit));
    // A connection that watches already may change its screen.
    match h.call_on(
        100,
        EngineRequest::Watch(Watch {
            view: View::Dead {
                after: None,
                limit: None,
            },
            tag: 2,
        }),
    ) {
        Ok(Reply::Watch(r)) => assert_eq!(r.tag, 2),
        other => panic!("{other:?}"),
    }
    // A watch that ends makes room.
    h.call_on(101, EngineRequest::Unwatch(ops::Unwatch {}))
        .unwrap();
    match h.call_on(
        99,
        EngineRequest::Watch(Watch {
            view: view(),
            tag: 1,
        }),
    ) {
        Ok(Reply::Watch(_)) => {}
        other => panic!("{other:?}"),
    }
}

fn limits_view(after: Option<&str>, limit: Option<u32>) -> View {
    View::Limits {
        after: after.map(str::to_owned),
        limit,
    }
}

fn set_limit(h: &mut Harness, name: &str, spec: LimitSpec) {
    h.call(EngineRequest::LimitSet(ops::LimitSet {
        name: name.into(),
        spec,
    }))
    .unwrap_or_else(|e| panic!("limit_set {name}: {e:?}"));
}

fn drawing_on(payload: &str, limit: &str, key: Option<&str>) -> NewTask {
    NewTask {
        limits: vec![LimitUse {
            limit: limit.into(),
            key: key.map(str::to_owned),
            cost: None,
        }],
        ..NewTask::new(super::raw(payload))
    }
}

fn limits_page(update: WatchUpdate) -> (Vec<LimitInfo>, Option<String>) {
    match update {
        WatchUpdate::Limits { limits, next } => (limits, next),
        other => panic!("not a limits page: {other:?}"),
    }
}

#[test]
fn the_limits_screen_is_pushed_every_second_as_its_buckets_refill_with_nothing_else_changing() {
    let mut h = Harness::new();
    let created_ms = h.now.wall_ms;
    h.create("q", QueuePatch::default());
    // One token a second, at most two; and one lease at a time for each key.
    let api = LimitSpec {
        rate: Some(Rate {
            count: 1,
            per_ms: 1_000,
        }),
        burst: Some(2),
        ..LimitSpec::default()
    };
    set_limit(&mut h, "api", api.clone());
    let tenant = LimitSpec {
        concurrency: Some(1),
        per_key: true,
        ..LimitSpec::default()
    };
    set_limit(&mut h, "tenant", tenant.clone());
    // The api bucket fills (2 tokens in 2 s); both api tasks and one of acme's are
    // taken, acme's second waits for its key's lease.
    h.advance(2_000);
    for (payload, limit, key) in [
        ("1", "api", None),
        ("2", "api", None),
        ("3", "tenant", Some("acme")),
        ("4", "tenant", Some("acme")),
    ] {
        h.enqueue_task("q", drawing_on(payload, limit, key));
    }
    assert_eq!(h.claim_as("q", 4, "m1").len(), 3);
    let claimed_ms = h.now.wall_ms;
    // A second connection watches the queues: nothing changes, so it gets nothing.
    match h.call_on(
        WATCHER + 1,
        EngineRequest::Watch(Watch {
            view: View::Queues {
                after: None,
                limit: None,
            },
            tag: 1,
        }),
    ) {
        Ok(Reply::Watch(_)) => {}
        other => panic!("{other:?}"),
    }
    let api_info = |tokens: u64, full_ms: Option<u64>| LimitInfo {
        name: "api".into(),
        spec: api.clone(),
        held: 2,
        waiting: 0,
        granted: 2,
        throttled: 0,
        keys_in_use: 1,
        keys: vec![LimitKeyInfo {
            key: String::new(),
            tokens: Some(tokens),
            held: 2,
            waiting: 0,
            full_ms,
            throttled_until_ms: None,
        }],
        created_ms,
        updated_ms: created_ms,
    };
    let tenant_info = LimitInfo {
        name: "tenant".into(),
        spec: tenant.clone(),
        held: 1,
        waiting: 1,
        granted: 1,
        throttled: 0,
        keys_in_use: 1,
        keys: vec![LimitKeyInfo {
            key: "acme".into(),
            tokens: None,
            held: 1,
            waiting: 1,
            full_ms: None,
            throttled_until_ms: None,
        }],
        created_ms,
        updated_ms: created_ms,
    };
    // Empty after the two leases: full again in two seconds.
    assert_eq!(
        limits_page(watch(&mut h, limits_view(None, None))),
        (
            vec![api_info(0, Some(claimed_ms + 2_000)), tenant_info.clone()],
            None
        )
    );
    let now = h.now;
    assert_eq!(
        h.engine().next_timer(now),
        Some(1_000),
        "the dispatcher wakes for the next push, changed or not"
    );
    h.advance(999);
    assert_eq!(
        updates(&mut h).len(),
        0,
        "within the interval nothing is pushed"
    );
    // A second on, with no change in the daemon: the bucket refilled one token, and
    // the screen says so.
    h.advance(1);
    let pushed: Vec<_> = updates(&mut h).into_iter().map(limits_page).collect();
    assert_eq!(
        pushed,
        vec![(
            vec![api_info(1, Some(claimed_ms + 2_000)), tenant_info.clone()],
            None
        )]
    );
    h.advance(1_000);
    let pushed: Vec<_> = updates(&mut h).into_iter().map(limits_page).collect();
    assert_eq!(pushed, vec![(vec![api_info(2, None), tenant_info], None)]);
    assert_eq!(
        h.pushed(WATCHER + 1).len(),
        0,
        "the other screens are still pushed only when something changed"
    );
}

#[test]
fn the_limits_screen_pages_by_name_and_any_role_may_watch_it() {
    const CONFIG: &str = r#"
[[tokens]]
name = "p"
token = "p-token-0123456789abcdef"
roles = ["produce"]
"#;
    let mut h = Harness::new();
    for name in ["c", "a", "b"] {
        set_limit(
            &mut h,
            name,
            LimitSpec {
                concurrency: Some(3),
                ..LimitSpec::default()
            },
        );
    }
    let names = |page: (Vec<LimitInfo>, Option<String>)| {
        let names: Vec<String> = page.0.into_iter().map(|l| l.name).collect();
        (names, page.1)
    };
    assert_eq!(
        names(limits_page(watch(&mut h, limits_view(None, Some(2))))),
        (vec!["a".to_owned(), "b".to_owned()], Some("b".to_owned()))
    );
    assert_eq!(
        names(limits_page(watch(&mut h, limits_view(Some("b"), Some(2))))),
        (vec!["c".to_owned()], None)
    );
    assert_eq!(
        names(limits_page(watch(&mut h, limits_view(Some("c"), None)))),
        (vec![], None)
    );
    assert_eq!(
        watch_error(&mut h, limits_view(None, Some(0))),
        ErrorCode::BadRequest
    );
    assert_eq!(
        watch_error(&mut h, limits_view(None, Some(501))),
        ErrorCode::BadRequest
    );
    // A token that may only enqueue reads the limits (as `limit_list`), not the queues.
    h.principal = Some(super::principal(CONFIG, "p-token-0123456789abcdef"));
    assert_eq!(
        watch_error(
            &mut h,
            View::Queues {
                after: None,
                limit: None
            }
        ),
        ErrorCode::Forbidden
    );
    assert_eq!(
        names(limits_page(watch(&mut h, limits_view(None, None)))),
        (vec!["a".to_owned(), "b".to_owned(), "c".to_owned()], None)
    );
}
