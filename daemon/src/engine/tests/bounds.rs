//! What one client may cost everyone else: label classes, parked claims, and replies
//! bounded in bytes (waits, pages, member listings).

use muster_protocol::limits::{
    MAX_LABEL_CLASSES, MAX_LABEL_CLASSES_PER_TOKEN, MAX_LISTED_LABEL_SETS, MAX_LISTING_BYTES,
    MAX_PARKED_CLAIMS_PER_CONNECTION,
};
use muster_protocol::model::{NewTask, QueuePatch, TaskState};
use muster_protocol::ops::{self, Claim, Enqueue, QueueName, TaskList, Wait};
use muster_protocol::{ErrorCode, ops::EngineRequest};

use super::{Harness, Reply, dead_letter, principal, raw};

fn requiring(labels: &[String]) -> NewTask {
    let mut t = NewTask::new(raw("1"));
    t.requires = labels.to_vec();
    t
}

fn enqueue_many(queue: &str, tasks: Vec<NewTask>) -> EngineRequest {
    EngineRequest::Enqueue(Enqueue {
        queue: queue.into(),
        tasks,
    })
}

#[test]
fn a_queue_holds_at_most_max_label_classes_and_a_refused_enqueue_changes_nothing() {
    let mut h = Harness::new();
    h.create("q", QueuePatch::default());
    // The empty set (which never counts) and MAX classes, enqueued in batches.
    let classes: Vec<Vec<String>> = (0..=MAX_LABEL_CLASSES)
        .map(|i| {
            if i == 0 {
                Vec::new()
            } else {
                vec![format!("l{i}")]
            }
        })
        .collect();
    let mut ids = Vec::new();
    for chunk in classes.chunks(100) {
        match h.call(enqueue_many(
            "q",
            chunk.iter().map(|c| requiring(c)).collect(),
        )) {
            Ok(Reply::Enqueue(r)) => ids.extend(r.tasks.into_iter().map(|t| t.id)),
            other => panic!("enqueue: {other:?}"),
        }
    }
    // Known classes, in any order and with repeated labels, still go in.
    h.call(enqueue_many(
        "q",
        vec![requiring(&["l7".into(), "l7".into()]), requiring(&[])],
    ))
    .unwrap();
    let before = h.counts("q");
    // One new class in a batch of known ones: the whole batch is refused.
    let refused = enqueue_many(
        "q",
        vec![
            requiring(&["l1".into()]),
            requiring(&["l1".into(), "l2".into()]),
        ],
    );
    match h.call(refused.clone()) {
        Err(e) => {
            assert_eq!(e.code, ErrorCode::Limit);
            assert!(e.message.contains("257 label sets"), "{}", e.message);
        }
        other => panic!("expected limit, got {other:?}"),
    }
    assert_eq!(h.counts("q"), before);
    // Once the tasks of one class are finished, its place is free again.
    h.call(EngineRequest::Cancel(ops::Cancel {
        task: ids[5].clone(),
        if_state: None,
    }))
    .unwrap();
    h.call(refused).unwrap();
    assert_eq!(h.counts("q")[1], before[1] + 1);
}

/// Two tenants of one queue, as a config file names them.
const TENANTS: &str = r#"
[[tokens]]
name = "greedy"
token = "greedy-token-0123456789ab"
roles = ["produce"]

[[tokens]]
name = "modest"
token = "modest-token-0123456789ab"
roles = ["produce"]
"#;

#[test]
fn a_token_brings_at_most_its_share_of_a_queues_label_sets_and_plain_tasks_never_count() {
    let (greedy, modest) = (
        principal(TENANTS, "greedy-token-0123456789ab"),
        principal(TENANTS, "modest-token-0123456789ab"),
    );
    let mut h = Harness::new();
    h.create("q", QueuePatch::default());
    h.principal = Some(greedy);
    let sets = |from: usize, n: usize| -> Vec<NewTask> {
        (from..from + n)
            .map(|i| requiring(&[format!("g{i}")]))
            .collect()
    };
    let Ok(Reply::Enqueue(mine)) = h.call(enqueue_many("q", sets(0, MAX_LABEL_CLASSES_PER_TOKEN)))
    else {
        panic!("the token's share");
    };
    let before = h.counts("q");
    match h.call(enqueue_many("q", sets(MAX_LABEL_CLASSES_PER_TOKEN, 1))) {
        Err(e) => {
            assert_eq!(e.code, ErrorCode::Limit);
            assert_eq!(
                e.message,
                format!(
                    "token \"greedy\" would have brought {} label sets (requires) to queue \"q\"; one token may bring at most {MAX_LABEL_CLASSES_PER_TOKEN} of its {MAX_LABEL_CLASSES}",
                    MAX_LABEL_CLASSES_PER_TOKEN + 1
                )
            );
        }
        other => panic!("expected limit, got {other:?}"),
    }
    assert_eq!(h.counts("q"), before);
    // Another tenant: a plain enqueue, and label sets of its own.
    h.principal = Some(modest);
    h.call(enqueue_many("q", vec![requiring(&[])])).unwrap();
    h.call(enqueue_many("q", vec![requiring(&["m0".into()])]))
        .unwrap();
    // A set the greedy token brought is anyone's to use; its tasks finished, its place
    // in the share is free again.
    h.call(enqueue_many("q", vec![requiring(&["g0".into()])]))
        .unwrap();
    h.principal = Some(greedy);
    h.call(EngineRequest::Cancel(ops::Cancel {
        task: mine.tasks[1].id.clone(),
        if_state: None,
    }))
    .unwrap();
    h.call(enqueue_many("q", sets(MAX_LABEL_CLASSES_PER_TOKEN, 1)))
        .unwrap();
}

#[test]
fn unclaimable_label_sets_are_listed_most_tasks_first_up_to_the_limit_and_counted() {
    let mut h = Harness::new();
    h.create("q", QueuePatch::default());
    let sets = MAX_LISTED_LABEL_SETS + 4;
    for i in 0..sets {
        // Set i holds i + 1 tasks.
        let tasks = (0..=i).map(|_| requiring(&[format!("s{i:02}")])).collect();
        h.call(enqueue_many("q", tasks)).unwrap();
    }
    let q = match h.call(EngineRequest::QueueDescribe(ops::QueueDescribe(
        QueueName { queue: "q".into() },
    ))) {
        Ok(Reply::Queue(r)) => r.queue,
        other => panic!("describe: {other:?}"),
    };
    assert_eq!(q.unclaimable_sets, sets as u64);
    assert_eq!(q.unclaimable, (sets * (sets + 1) / 2) as u64);
    // The four smallest sets (s00..s03) are left out; the rest are listed, sorted.
    let listed: Vec<String> = q
        .unclaimable_requires
        .iter()
        .map(|s| s[0].clone())
        .collect();
    let want: Vec<String> = (4..sets).map(|i| format!("s{i:02}")).collect();
    assert_eq!(listed, want);
}

#[test]
fn a_connection_parks_at_most_its_share_of_claims() {
    let mut h = Harness::new();
    h.create("q", QueuePatch::default());
    let parked = |h: &mut Harness, conn| {
        h.send_on(
            conn,
            EngineRequest::Claim(Claim::new(["q"]).wait_ms(60_000)),
        )
    };
    let mut tags = Vec::new();
    for _ in 0..MAX_PARKED_CLAIMS_PER_CONNECTION {
        tags.push(parked(&mut h, 1));
    }
    assert!(tags.iter().all(|t| h.reply_for(*t).is_none()), "all parked");
    let over = parked(&mut h, 1);
    match h.reply_for(over) {
        Some(Err(e)) => assert_eq!(e.code, ErrorCode::Limit, "{}", e.message),
        other => panic!("expected limit, got {other:?}"),
    }
    // A claim without a wait never parks: it is answered as usual.
    match h.call_on(1, EngineRequest::Claim(Claim::new(["q"]))) {
        Ok(Reply::Claim(r)) => assert!(r.tasks.is_empty()),
        other => panic!("claim: {other:?}"),
    }
    // Another connection is not affected.
    let other = parked(&mut h, 2);
    assert!(h.reply_for(other).is_none());
    // A served claim frees its place.
    h.enqueue("q", "1");
    let served = tags.iter().filter(|t| h.reply_for(**t).is_some()).count();
    assert_eq!(served, 1);
    let again = parked(&mut h, 1);
    assert!(h.reply_for(again).is_none(), "parked again");
}

/// A task whose payload is `kib` KiB of JSON string.
fn big_task(kib: usize) -> NewTask {
    NewTask::new(raw(&format!("\"{}\"", "p".repeat(kib * 1024 - 2))))
}

#[test]
fn a_wait_answers_each_task_once_and_leaves_out_what_does_not_fit_a_frame() {
    let mut h = Harness::new();
    h.create("q", QueuePatch::default());
    let mut ids = Vec::new();
    for _ in 0..5 {
        let id = match h.call(enqueue_many("q", vec![big_task(1024)])) {
            Ok(Reply::Enqueue(r)) => r.tasks[0].id.clone(),
            other => panic!("enqueue: {other:?}"),
        };
        let (cid, epoch) = h.claim_one("q");
        assert_eq!(cid, id);
        h.call(dead_letter(&cid, epoch)).unwrap();
        ids.push(id);
    }
    // The same finished 1 MiB task named 300 times comes back once.
    let wait = |tasks: Vec<String>| {
        EngineRequest::Wait(Wait {
            tasks,
            timeout_ms: None,
        })
    };
    match h.call(wait(vec![ids[0].clone(); 300])) {
        Ok(Reply::Wait(r)) => {
            assert_eq!(r.finished.len(), 1);
            assert!(r.omitted.is_empty() && r.pending.is_empty() && r.removed.is_empty());
        }
        other => panic!("wait: {other:?}"),
    }
    // Five 1 MiB tasks do not fit one frame: three come whole, two are named.
    match h.call(wait(ids.clone())) {
        Ok(Reply::Wait(r)) => {
            let finished: Vec<&str> = r.finished.iter().map(|t| t.id.as_str()).collect();
            assert_eq!(finished, [&ids[0], &ids[1], &ids[2]]);
            assert_eq!(r.omitted, ids[3..]);
            let reply = Reply::Wait(r);
            assert!(super::super::listing::json_len(&reply) <= MAX_LISTING_BYTES);
        }
        other => panic!("wait: {other:?}"),
    }
}

#[test]
fn a_page_of_tasks_stops_before_it_outgrows_a_frame_and_its_cursor_reaches_the_rest() {
    let mut h = Harness::new();
    h.create("q", QueuePatch::default());
    let n = 600;
    for chunk in (0..n).collect::<Vec<_>>().chunks(200) {
        h.call(enqueue_many(
            "q",
            chunk.iter().map(|_| NewTask::new(raw("1"))).collect(),
        ))
        .unwrap();
    }
    // Dead letters with the largest errors, full of bytes JSON must escape.
    let error = "\u{1}".repeat(muster_protocol::limits::MAX_ERROR_BYTES);
    for _ in 0..n {
        let (id, epoch) = h.claim_one("q");
        h.call(EngineRequest::DeadLetter(ops::DeadLetter {
            task: id,
            epoch,
            error: error.clone(),
        }))
        .unwrap();
    }
    let mut seen = 0;
    let mut after = None;
    let mut pages = 0;
    loop {
        let page = match h.call(EngineRequest::TaskList(TaskList {
            queue: "q".into(),
            state: TaskState::Dead,
            after: after.clone(),
            limit: Some(1000),
        })) {
            Ok(Reply::TaskList(r)) => r,
            other => panic!("task_list: {other:?}"),
        };
        pages += 1;
        let bytes = super::super::listing::json_len(&page.tasks);
        assert!(bytes <= MAX_LISTING_BYTES, "a page of {bytes} bytes");
        seen += page.tasks.len();
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    assert_eq!(seen, n);
    assert!(pages > 1, "600 errors of 48 KiB as JSON need several pages");
}

#[test]
fn members_are_listed_a_page_at_a_time() {
    let mut h = Harness::new();
    h.create("q", QueuePatch::default());
    for i in 0..5 {
        h.enqueue("q", "1");
        h.claim_as("q", 1, &format!("m{i}"));
    }
    let list = |h: &mut Harness, after: Option<String>| match h.call(EngineRequest::MemberList(
        ops::MemberList {
            after,
            limit: Some(2),
        },
    )) {
        Ok(Reply::MemberList(r)) => r,
        other => panic!("member_list: {other:?}"),
    };
    let first = list(&mut h, None);
    let names: Vec<&str> = first.members.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, ["m0", "m1"]);
    assert_eq!(first.next.as_deref(), Some("m1"));
    let last = list(&mut h, Some("m3".into()));
    assert_eq!(last.members.len(), 1);
    assert_eq!(last.next, None);
    assert_eq!(
        h.code(EngineRequest::MemberList(ops::MemberList {
            after: None,
            limit: Some(0),
        })),
        ErrorCode::BadRequest
    );
}
