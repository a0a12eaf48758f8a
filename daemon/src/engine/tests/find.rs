//! `task_find`: every filter, both orders, cursors across queues, and the work bound.

use muster_protocol::limits::{MAX_FIND_READS, MAX_FIND_SCAN};
use muster_protocol::model::{NewTask, QueuePatch, TaskState};
use muster_protocol::ops::{Enqueue, FieldMatch, FindCursor, TaskFind, TaskFindReply};
use muster_protocol::{ErrorCode, ops::EngineRequest};
use serde_json::json;

use super::{Harness, Reply, nack, raw};

fn find(h: &mut Harness, r: TaskFind) -> TaskFindReply {
    match h.call(EngineRequest::TaskFind(Box::new(r))) {
        Ok(Reply::TaskFind(f)) => f,
        other => panic!("task_find: {other:?}"),
    }
}

fn ids(reply: &TaskFindReply) -> Vec<String> {
    reply.tasks.iter().map(|t| t.id.clone()).collect()
}

fn in_queue(queue: &str) -> TaskFind {
    TaskFind {
        queue: Some(queue.into()),
        ..TaskFind::default()
    }
}

/// Two queues: `a` holds a task that failed with an error, a keyed task with a label and
/// an idempotency key, and a plain one; `b` holds one task. Returned in id order.
fn fixture() -> (Harness, Vec<String>) {
    let mut h = Harness::new();
    h.create("a", QueuePatch::default());
    h.create("b", QueuePatch::default());
    // `failing` is claimed and nacked first: scheduled for a retry, with an error.
    let failing = h.enqueue("a", r#"{"order":{"id":43}}"#);
    assert_eq!(h.claim_one("a"), (failing.clone(), 1));
    h.call(nack(&failing, 1, Some(60_000))).unwrap();
    let mut keyed = NewTask::new(raw(r#"{"order":{"id":42,"sku":"x-1"}}"#));
    keyed.key = Some("customer-7".into());
    keyed.requires = vec!["gpu".into()];
    keyed.idempotency_key = Some("order-42".into());
    let keyed = h.enqueue_task("a", keyed);
    let plain = h.enqueue("a", r#"{"note":"Upstream"}"#);
    let other = h.enqueue("b", r#"{"order":{"id":42}}"#);
    (h, vec![failing, keyed, plain, other])
}

#[test]
fn each_filter_finds_exactly_its_tasks() {
    let (mut h, t) = fixture();
    let [failing, keyed, plain, other] = [&t[0], &t[1], &t[2], &t[3]].map(String::clone);
    let cases: Vec<(TaskFind, Vec<&String>)> = vec![
        (in_queue("a"), vec![&failing, &keyed, &plain]),
        (TaskFind::default(), vec![&failing, &keyed, &plain, &other]),
        (
            TaskFind {
                state: Some(TaskState::Scheduled),
                ..TaskFind::default()
            },
            vec![&failing],
        ),
        (
            TaskFind {
                id_prefix: Some(other[..20].to_lowercase()),
                ..TaskFind::default()
            },
            vec![&other],
        ),
        (
            TaskFind {
                key: Some("customer-7".into()),
                ..TaskFind::default()
            },
            vec![&keyed],
        ),
        (
            TaskFind {
                idempotency_key: Some("order-42".into()),
                ..TaskFind::default()
            },
            vec![&keyed],
        ),
        (
            TaskFind {
                label: Some("gpu".into()),
                ..TaskFind::default()
            },
            vec![&keyed],
        ),
        (
            TaskFind {
                error: Some("BOO".into()),
                ..TaskFind::default()
            },
            vec![&failing],
        ),
        (
            TaskFind {
                payload: Some("Upstream".into()),
                ..TaskFind::default()
            },
            vec![&plain],
        ),
        (
            TaskFind {
                payload: Some("upstream".into()),
                ..TaskFind::default()
            },
            vec![],
        ),
        (
            TaskFind {
                field: Some(FieldMatch {
                    path: "order.id".into(),
                    value: json!(42),
                }),
                ..TaskFind::default()
            },
            vec![&keyed, &other],
        ),
        (
            TaskFind {
                queue: Some("a".into()),
                field: Some(FieldMatch {
                    path: "order.id".into(),
                    value: json!(42),
                }),
                newest_first: true,
                ..TaskFind::default()
            },
            vec![&keyed],
        ),
        (
            TaskFind {
                newest_first: true,
                ..TaskFind::default()
            },
            vec![&other, &plain, &keyed, &failing],
        ),
    ];
    for (search, want) in cases {
        let got = find(&mut h, search.clone());
        let want: Vec<String> = want.into_iter().cloned().collect();
        assert_eq!(ids(&got), want, "{search:?}");
        assert_eq!(got.next, None, "{search:?}");
    }
    assert_eq!(
        find(&mut h, in_queue("b")).tasks[0].queue,
        "b",
        "a match carries its summary"
    );
}

#[test]
fn pages_continue_across_queues_in_both_orders() {
    let (mut h, t) = fixture();
    for newest_first in [false, true] {
        let mut order = t.clone();
        if newest_first {
            order.reverse();
        }
        let mut seen = Vec::new();
        let mut after = None;
        for _ in 0..10 {
            let page = find(
                &mut h,
                TaskFind {
                    limit: Some(1),
                    newest_first,
                    after: after.take(),
                    ..TaskFind::default()
                },
            );
            seen.extend(ids(&page));
            match page.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        assert_eq!(seen, order, "newest_first {newest_first}");
    }
}

#[test]
fn one_request_reads_at_most_its_share_and_the_cursor_goes_on() {
    let mut h = Harness::new();
    h.create("big", QueuePatch::default());
    let total = MAX_FIND_READS as usize + 10;
    let mut last = String::new();
    for chunk in 0..total.div_ceil(1000) {
        let n = (total - chunk * 1000).min(1000);
        let tasks = (0..n)
            .map(|i| {
                let text = if chunk * 1000 + i == total - 1 {
                    r#""needle""#
                } else {
                    r#""hay""#
                };
                NewTask::new(raw(text))
            })
            .collect();
        match h.call(EngineRequest::Enqueue(Enqueue {
            queue: "big".into(),
            tasks,
        })) {
            Ok(Reply::Enqueue(r)) => last = r.tasks.last().unwrap().id.clone(),
            other => panic!("{other:?}"),
        }
    }
    let search = TaskFind {
        queue: Some("big".into()),
        payload: Some("needle".into()),
        ..TaskFind::default()
    };
    let first = find(&mut h, search.clone());
    assert_eq!(ids(&first), Vec::<String>::new());
    // One index entry for the queue, then one per task read.
    assert_eq!(first.scanned, 1 + MAX_FIND_READS);
    let cursor = first
        .next
        .clone()
        .expect("a cursor: the search stopped early");
    assert_eq!(cursor.queue, "big");
    let second = find(
        &mut h,
        TaskFind {
            after: Some(cursor),
            ..search.clone()
        },
    );
    assert_eq!(ids(&second), vec![last]);
    assert_eq!(second.next, None);
    assert_eq!(second.scanned, 1 + 10);
    // In-memory filters are bounded by the scan limit, which is larger.
    const { assert!(MAX_FIND_SCAN > MAX_FIND_READS) };
}

#[test]
fn bad_searches_are_refused() {
    let (mut h, _) = fixture();
    let cases = [
        (in_queue("nope"), ErrorCode::NotFound),
        (in_queue("Bad Name"), ErrorCode::BadRequest),
        (
            TaskFind {
                limit: Some(0),
                ..TaskFind::default()
            },
            ErrorCode::BadRequest,
        ),
        (
            TaskFind {
                id_prefix: Some("01I".into()),
                ..TaskFind::default()
            },
            ErrorCode::BadRequest,
        ),
        (
            TaskFind {
                error: Some(String::new()),
                ..TaskFind::default()
            },
            ErrorCode::BadRequest,
        ),
        (
            TaskFind {
                label: Some("no spaces".into()),
                ..TaskFind::default()
            },
            ErrorCode::BadRequest,
        ),
        (
            TaskFind {
                field: Some(FieldMatch {
                    path: "a..b".into(),
                    value: json!(1),
                }),
                ..TaskFind::default()
            },
            ErrorCode::BadRequest,
        ),
        (
            TaskFind {
                queue: Some("a".into()),
                after: Some(FindCursor {
                    queue: "b".into(),
                    id: "01JHMPFNMW1HEAD8X4A1JH69RE".into(),
                }),
                ..TaskFind::default()
            },
            ErrorCode::BadRequest,
        ),
        (
            TaskFind {
                after: Some(FindCursor {
                    queue: "a".into(),
                    id: "not-an-id".into(),
                }),
                ..TaskFind::default()
            },
            ErrorCode::BadRequest,
        ),
    ];
    for (search, code) in cases {
        assert_eq!(
            h.code(EngineRequest::TaskFind(Box::new(search.clone()))),
            code,
            "{search:?}"
        );
    }
}
