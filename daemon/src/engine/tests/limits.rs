//! Limits: token buckets and concurrency caps shared across queues, per key or not,
//! with time driven by the test.

use muster_protocol::ErrorCode;
use muster_protocol::model::{LimitSpec, LimitUse, NewTask, QueuePatch, Rate, TaskState};
use muster_protocol::ops::{
    Claim, EngineRequest, LimitDelete, LimitGet, LimitName, LimitSet, QueueDescribe, QueueName,
};

use super::{Harness, ack, raw};
use crate::engine::Reply;

fn rate(count: u64, per_ms: u64) -> LimitSpec {
    LimitSpec {
        rate: Some(Rate { count, per_ms }),
        ..LimitSpec::default()
    }
}

fn concurrency(c: u32) -> LimitSpec {
    LimitSpec {
        concurrency: Some(c),
        ..LimitSpec::default()
    }
}

fn set(h: &mut Harness, name: &str, spec: LimitSpec) {
    let req = EngineRequest::LimitSet(LimitSet {
        name: name.into(),
        spec,
    });
    h.call(req)
        .unwrap_or_else(|e| panic!("limit_set {name}: {e:?}"));
}

fn info(h: &mut Harness, name: &str) -> muster_protocol::model::LimitInfo {
    match h.call(EngineRequest::LimitGet(LimitGet(LimitName {
        name: name.into(),
    }))) {
        Ok(Reply::Limit(r)) => r.limit,
        other => panic!("limit_get {name}: {other:?}"),
    }
}

fn limited(payload: &str, limits: &[(&str, Option<&str>, u64)]) -> NewTask {
    NewTask {
        limits: limits
            .iter()
            .map(|(limit, key, cost)| LimitUse {
                limit: (*limit).into(),
                key: key.map(str::to_owned),
                cost: Some(*cost),
            })
            .collect(),
        ..NewTask::new(raw(payload))
    }
}

fn waiting_on_limits(h: &mut Harness, queue: &str) -> u64 {
    match h.call(EngineRequest::QueueDescribe(QueueDescribe(QueueName {
        queue: queue.into(),
    }))) {
        Ok(Reply::Queue(r)) => r.queue.waiting_on_limits,
        other => panic!("describe: {other:?}"),
    }
}

fn claim_n(h: &mut Harness, queues: &[&str], max: u32) -> Vec<String> {
    let req = EngineRequest::Claim(Claim::new(queues.iter().copied()).max(max).member("m1"));
    match h.call(req) {
        Ok(Reply::Claim(r)) => r.tasks.into_iter().map(|d| d.id).collect(),
        other => panic!("claim: {other:?}"),
    }
}

#[test]
fn a_rate_limit_starts_empty_and_hands_out_tokens_as_they_refill() {
    let mut h = Harness::new();
    h.create("q", QueuePatch::default());
    // 2 tokens a second, a burst of 2.
    set(&mut h, "api", rate(2, 1000));
    let ids: Vec<String> = (0..5)
        .map(|i| h.enqueue_task("q", limited(&i.to_string(), &[("api", None, 1)])))
        .collect();
    // A new limit's bucket is empty: nothing goes until a token is there.
    assert_eq!(claim_n(&mut h, &["q"], 5), Vec::<String>::new());
    assert_eq!(waiting_on_limits(&mut h, "q"), 5);
    // One token every 500 ms, handed out in enqueue order.
    h.advance(499);
    assert_eq!(claim_n(&mut h, &["q"], 5), Vec::<String>::new());
    h.advance(1);
    assert_eq!(claim_n(&mut h, &["q"], 5), [ids[0].clone()]);
    // A full second gathers the burst (2), never more.
    h.advance(5_000);
    assert_eq!(claim_n(&mut h, &["q"], 5), [ids[1].clone(), ids[2].clone()]);
    assert_eq!(waiting_on_limits(&mut h, "q"), 2);
    let i = info(&mut h, "api");
    assert_eq!((i.held, i.waiting, i.granted), (3, 2, 3));
    assert_eq!(i.keys.len(), 1);
    assert_eq!((i.keys[0].key.as_str(), i.keys[0].tokens), ("", Some(0)));
    assert_eq!(i.spec.burst, Some(2), "the burst shown is the rate's count");
}

#[test]
fn the_next_timer_is_when_the_first_waiting_task_fits_and_a_parked_claim_gets_it_then() {
    let mut h = Harness::new();
    h.create("q", QueuePatch::default());
    set(&mut h, "api", rate(1, 300));
    let id = h.enqueue_task("q", limited("1", &[("api", None, 1)]));
    let now = h.now;
    assert_eq!(h.engine().next_timer(now), Some(300));
    let tag = h.send(EngineRequest::Claim(
        Claim::new(["q"]).member("m1").wait_ms(10_000),
    ));
    assert!(h.reply_for(tag).is_none(), "the claim waits");
    h.advance(299);
    assert!(h.reply_for(tag).is_none(), "no token yet");
    h.advance(1);
    match h.reply_for(tag) {
        Some(Ok(Reply::Claim(r))) => assert_eq!(r.tasks[0].id, id),
        other => panic!("the claim is served the round the bucket refills: {other:?}"),
    }
}

#[test]
fn a_concurrency_limit_caps_held_leases_and_a_settle_gives_the_slot_back() {
    let mut h = Harness::new();
    h.create("q", QueuePatch::default());
    set(&mut h, "browser", concurrency(2));
    let ids: Vec<String> = (0..4)
        .map(|i| h.enqueue_task("q", limited(&i.to_string(), &[("browser", None, 1)])))
        .collect();
    let first = claim_n(&mut h, &["q"], 4);
    assert_eq!(first, [ids[0].clone(), ids[1].clone()]);
    assert_eq!(claim_n(&mut h, &["q"], 4), Vec::<String>::new());
    assert_eq!(waiting_on_limits(&mut h, "q"), 2);
    h.call(ack(&ids[0], 1)).unwrap();
    assert_eq!(claim_n(&mut h, &["q"], 4), [ids[2].clone()]);
    // A lapse gives the slot back too.
    h.advance(60_000);
    let got = claim_n(&mut h, &["q"], 4);
    assert_eq!(got.len(), 2, "both lapsed leases' slots came back: {got:?}");
    assert_eq!(info(&mut h, "browser").held, 2);
}

#[test]
fn a_task_waiting_on_a_limit_blocks_neither_other_limits_nor_tasks_without_one() {
    let mut h = Harness::new();
    h.create("q", QueuePatch::default());
    set(&mut h, "slow", rate(1, 60_000));
    set(&mut h, "free", concurrency(10));
    let blocked = h.enqueue_task("q", limited("1", &[("slow", None, 1)]));
    let other = h.enqueue_task("q", limited("2", &[("free", None, 1)]));
    let plain = h.enqueue("q", "3");
    assert_eq!(claim_n(&mut h, &["q"], 3), [other, plain]);
    assert_eq!(h.state(&blocked), (TaskState::Ready, 0, 0));
}

#[test]
fn a_per_key_limit_gives_each_key_its_own_count() {
    let mut h = Harness::new();
    h.create("q", QueuePatch::default());
    set(
        &mut h,
        "tenant",
        LimitSpec {
            per_key: true,
            ..concurrency(1)
        },
    );
    let a1 = h.enqueue_task("q", limited("1", &[("tenant", Some("a"), 1)]));
    let _a2 = h.enqueue_task("q", limited("2", &[("tenant", Some("a"), 1)]));
    let b1 = h.enqueue_task("q", limited("3", &[("tenant", Some("b"), 1)]));
    assert_eq!(claim_n(&mut h, &["q"], 3), [a1, b1]);
    let i = info(&mut h, "tenant");
    assert_eq!((i.held, i.waiting, i.keys_in_use), (2, 1, 2));
    // The busiest key first: a holds one and has one waiting.
    assert_eq!(
        (i.keys[0].key.as_str(), i.keys[0].held, i.keys[0].waiting),
        ("a", 1, 1)
    );
}

#[test]
fn queues_share_a_limit_and_an_idle_queue_keeps_no_room_from_the_others() {
    let mut h = Harness::new();
    h.create("a", QueuePatch::default());
    h.create("b", QueuePatch::default());
    set(&mut h, "api", rate(1, 100));
    // Queue a's tasks are older, but nobody claims from a.
    for i in 0..3 {
        h.enqueue_task("a", limited(&i.to_string(), &[("api", None, 1)]));
    }
    let b: Vec<String> = (0..3)
        .map(|i| h.enqueue_task("b", limited(&i.to_string(), &[("api", None, 1)])))
        .collect();
    for (n, id) in b.iter().enumerate() {
        h.advance(100);
        assert_eq!(
            claim_n(&mut h, &["b"], 3),
            std::slice::from_ref(id),
            "token {n}"
        );
    }
    // Both queues drew on the one bucket: a's claim now finds it empty, and its
    // admitted task goes back to its line.
    assert_eq!(claim_n(&mut h, &["a"], 3), Vec::<String>::new());
    assert_eq!(waiting_on_limits(&mut h, "a"), 3);
    h.advance(100);
    assert_eq!(claim_n(&mut h, &["a", "b"], 3).len(), 1);
}

#[test]
fn a_restart_starts_every_bucket_empty_so_no_burst_goes_through_twice() {
    let mut h = Harness::new();
    h.create("q", QueuePatch::default());
    set(&mut h, "api", rate(10, 1000));
    for i in 0..30 {
        h.enqueue_task("q", limited(&i.to_string(), &[("api", None, 1)]));
    }
    h.advance(1_000);
    assert_eq!(claim_n(&mut h, &["q"], 30).len(), 10, "the burst");
    h.restart(0);
    h.round();
    assert_eq!(
        claim_n(&mut h, &["q"], 30).len(),
        0,
        "empty after the restart"
    );
    h.advance(100);
    assert_eq!(claim_n(&mut h, &["q"], 30).len(), 1, "one token a 100 ms");
    // Held leases are counted again from the store.
    assert_eq!(info(&mut h, "api").held, 11);
}

#[test]
fn leases_held_count_again_after_a_restart_against_a_concurrency() {
    let mut h = Harness::new();
    h.create("q", QueuePatch::default());
    set(&mut h, "gpu", concurrency(2));
    for i in 0..4 {
        h.enqueue_task("q", limited(&i.to_string(), &[("gpu", None, 1)]));
    }
    assert_eq!(claim_n(&mut h, &["q"], 4).len(), 2);
    h.restart(0);
    h.round();
    assert_eq!(claim_n(&mut h, &["q"], 4).len(), 0, "both slots still held");
    assert_eq!(info(&mut h, "gpu").held, 2);
}

#[test]
fn changing_a_limit_applies_at_once_and_deleting_it_frees_its_tasks() {
    let mut h = Harness::new();
    h.create("q", QueuePatch::default());
    set(&mut h, "gpu", concurrency(1));
    for i in 0..4 {
        h.enqueue_task("q", limited(&i.to_string(), &[("gpu", None, 1)]));
    }
    assert_eq!(claim_n(&mut h, &["q"], 4).len(), 1);
    set(&mut h, "gpu", concurrency(2));
    assert_eq!(claim_n(&mut h, &["q"], 4).len(), 1, "one more slot");
    let deleted = h.call(EngineRequest::LimitDelete(LimitDelete(LimitName {
        name: "gpu".into(),
    })));
    match deleted {
        Ok(Reply::Count(c)) => assert_eq!(c.count, 2, "two tasks were waiting on it"),
        other => panic!("limit_delete: {other:?}"),
    }
    assert_eq!(waiting_on_limits(&mut h, "q"), 0);
    assert_eq!(claim_n(&mut h, &["q"], 4).len(), 2);
    assert_eq!(
        h.code(EngineRequest::LimitGet(LimitGet(LimitName {
            name: "gpu".into()
        }))),
        ErrorCode::NotFound
    );
}

#[test]
fn making_a_limit_per_key_moves_its_waiting_tasks_to_their_keys_buckets() {
    let mut h = Harness::new();
    h.create("q", QueuePatch::default());
    set(&mut h, "tenant", concurrency(1));
    let a1 = h.enqueue_task("q", limited("1", &[("tenant", Some("a"), 1)]));
    h.enqueue_task("q", limited("2", &[("tenant", Some("a"), 1)]));
    let b1 = h.enqueue_task("q", limited("3", &[("tenant", Some("b"), 1)]));
    assert_eq!(claim_n(&mut h, &["q"], 3), [a1]);
    set(
        &mut h,
        "tenant",
        LimitSpec {
            per_key: true,
            ..concurrency(1)
        },
    );
    // a's lease holds a's one slot; b has its own now.
    assert_eq!(claim_n(&mut h, &["q"], 3), [b1]);
    assert_eq!(waiting_on_limits(&mut h, "q"), 1);
}

#[test]
fn leases_held_are_counted_per_key_across_per_key_changes_and_a_delete() {
    let mut h = Harness::new();
    h.create("q", QueuePatch::default());
    let per_key = |c| LimitSpec {
        per_key: true,
        ..concurrency(c)
    };
    set(&mut h, "tenant", per_key(1));
    let a1 = h.enqueue_task("q", limited("1", &[("tenant", Some("a"), 1)]));
    let a2 = h.enqueue_task("q", limited("2", &[("tenant", Some("a"), 1)]));
    let b1 = h.enqueue_task("q", limited("3", &[("tenant", Some("b"), 1)]));
    assert_eq!(claim_n(&mut h, &["q"], 3), [a1.clone(), b1.clone()]);
    // Shared, two slots: both are held, a2 waits.
    set(&mut h, "tenant", concurrency(2));
    assert!(claim_n(&mut h, &["q"], 3).is_empty());
    assert_eq!(info(&mut h, "tenant").held, 2);
    // Gone and back per key: each key still holds its one lease.
    h.call(EngineRequest::LimitDelete(LimitDelete(LimitName {
        name: "tenant".into(),
    })))
    .unwrap();
    set(&mut h, "tenant", per_key(1));
    assert!(claim_n(&mut h, &["q"], 3).is_empty());
    let tenant = info(&mut h, "tenant");
    assert_eq!((tenant.held, tenant.keys_in_use, tenant.waiting), (2, 2, 1));
    // b's lease ending frees b's slot, not a's; a's frees a's.
    h.call(ack(&b1, 1)).unwrap();
    assert!(claim_n(&mut h, &["q"], 3).is_empty());
    h.call(ack(&a1, 1)).unwrap();
    assert_eq!(claim_n(&mut h, &["q"], 3), [a2.as_str()]);
    h.call(ack(&a2, 1)).unwrap();
    let tenant = info(&mut h, "tenant");
    assert_eq!((tenant.held, tenant.keys_in_use, tenant.waiting), (0, 0, 0));
}

#[test]
fn bad_limits_and_bad_uses_are_refused_and_change_nothing() {
    let mut h = Harness::new();
    h.create("q", QueuePatch::default());
    let code = |h: &mut Harness, name: &str, spec: LimitSpec| {
        h.code(EngineRequest::LimitSet(LimitSet {
            name: name.into(),
            spec,
        }))
    };
    assert_eq!(
        code(&mut h, "none", LimitSpec::default()),
        ErrorCode::BadRequest
    );
    assert_eq!(
        code(&mut h, "Bad Name", concurrency(1)),
        ErrorCode::BadRequest
    );
    assert_eq!(code(&mut h, "zero", concurrency(0)), ErrorCode::BadRequest);
    assert_eq!(code(&mut h, "r", rate(0, 1000)), ErrorCode::BadRequest);
    assert_eq!(
        code(
            &mut h,
            "b",
            LimitSpec {
                burst: Some(3),
                ..concurrency(1)
            }
        ),
        ErrorCode::BadRequest
    );
    set(&mut h, "api", rate(2, 1000));
    let enqueue = |h: &mut Harness, task: NewTask| {
        h.code(EngineRequest::Enqueue(muster_protocol::ops::Enqueue {
            queue: "q".into(),
            tasks: vec![task],
        }))
    };
    assert_eq!(
        enqueue(&mut h, limited("1", &[("nope", None, 1)])),
        ErrorCode::NotFound
    );
    assert_eq!(
        enqueue(&mut h, limited("1", &[("api", None, 3)])),
        ErrorCode::BadRequest,
        "a cost above the burst could never be granted"
    );
    assert_eq!(
        enqueue(
            &mut h,
            limited("1", &[("api", None, 1), ("api", Some("k"), 1)])
        ),
        ErrorCode::BadRequest
    );
    assert_eq!(h.counts("q"), [0; 7]);
}

fn throttled(h: &mut Harness, id: &str, epoch: u64, wait: u64, limit: Option<&str>) -> Reply {
    h.call(EngineRequest::Throttled(muster_protocol::ops::Throttled {
        task: id.into(),
        epoch,
        retry_after_ms: Some(wait),
        limit: limit.map(str::to_owned),
        error: Some("429 Too Many Requests".into()),
    }))
    .unwrap_or_else(|e| panic!("throttled: {e:?}"))
}

#[test]
fn a_throttle_gives_the_task_back_without_an_attempt_and_holds_only_its_key() {
    let mut h = Harness::new();
    h.create("q", QueuePatch::default());
    set(
        &mut h,
        "api",
        LimitSpec {
            per_key: true,
            ..concurrency(5)
        },
    );
    let a = h.enqueue_task("q", limited("1", &[("api", Some("a"), 1)]));
    assert_eq!(claim_n(&mut h, &["q"], 1), std::slice::from_ref(&a));
    match throttled(&mut h, &a, 1, 1_000, Some("api")) {
        Reply::Settle(s) => assert_eq!((s.state, s.not_before_ms), (TaskState::Ready, None)),
        other => panic!("throttled: {other:?}"),
    }
    assert_eq!(h.state(&a), (TaskState::Ready, 1, 0), "no failure counted");
    // Key a hands nothing out for a second; key b and tasks without limits go on.
    let a2 = h.enqueue_task("q", limited("2", &[("api", Some("a"), 1)]));
    let b = h.enqueue_task("q", limited("3", &[("api", Some("b"), 1)]));
    let plain = h.enqueue("q", "4");
    assert_eq!(claim_n(&mut h, &["q"], 4), [b, plain]);
    let i = info(&mut h, "api");
    assert_eq!(i.throttled, 1);
    let key_a = i
        .keys
        .iter()
        .find(|k| k.key == "a")
        .expect("key a is in use");
    assert_eq!(key_a.throttled_until_ms, Some(h.now.wall_ms + 1_000));
    h.advance(999);
    assert_eq!(claim_n(&mut h, &["q"], 4), Vec::<String>::new());
    h.advance(1);
    assert_eq!(claim_n(&mut h, &["q"], 4), [a.clone(), a2]);
    assert_eq!(h.state(&a), (TaskState::Leased, 2, 0));
    assert_eq!(
        h.task(&a)
            .history
            .iter()
            .filter(|e| e.event == "throttled")
            .count(),
        1
    );
}

#[test]
fn a_throttle_without_a_limit_named_holds_every_limit_of_the_task_and_a_task_without_limits_waits_itself()
 {
    let mut h = Harness::new();
    h.create("q", QueuePatch::default());
    set(&mut h, "x", concurrency(5));
    set(&mut h, "y", concurrency(5));
    let t = h.enqueue_task("q", limited("1", &[("x", None, 1), ("y", None, 1)]));
    h.claim_one("q");
    throttled(&mut h, &t, 1, 500, None);
    assert_eq!(info(&mut h, "x").throttled, 1);
    assert_eq!(info(&mut h, "y").throttled, 1);
    let plain = h.enqueue("q", "2");
    let (got, epoch) = h.claim_one("q");
    assert_eq!(got, plain);
    match throttled(&mut h, &plain, epoch, 700, None) {
        Reply::Settle(s) => assert_eq!(
            (s.state, s.not_before_ms),
            (TaskState::Scheduled, Some(h.now.wall_ms + 700))
        ),
        other => panic!("throttled: {other:?}"),
    }
    assert_eq!(h.state(&plain), (TaskState::Scheduled, 1, 0));
    h.advance(500);
    assert_eq!(claim_n(&mut h, &["q"], 2), [t]);
    h.advance(200);
    assert_eq!(claim_n(&mut h, &["q"], 2), [plain]);
}

#[test]
fn a_throttle_outlasts_a_restart_and_a_bad_one_changes_nothing() {
    let mut h = Harness::new();
    h.create("q", QueuePatch::default());
    set(&mut h, "api", concurrency(5));
    set(&mut h, "other", concurrency(5));
    let t = h.enqueue_task("q", limited("1", &[("api", None, 1)]));
    h.claim_one("q");
    let bad = EngineRequest::Throttled(muster_protocol::ops::Throttled {
        task: t.clone(),
        epoch: 1,
        retry_after_ms: Some(1_000),
        limit: Some("other".into()),
        error: None,
    });
    assert_eq!(h.code(bad), ErrorCode::BadRequest);
    assert_eq!(h.state(&t), (TaskState::Leased, 1, 0));
    throttled(&mut h, &t, 1, 10_000, Some("api"));
    h.advance(4_000);
    h.restart(0);
    h.round();
    // The throttle's end is kept by the wall clock: 6 s are left.
    assert_eq!(claim_n(&mut h, &["q"], 1), Vec::<String>::new());
    h.advance(5_999);
    assert_eq!(claim_n(&mut h, &["q"], 1), Vec::<String>::new());
    h.advance(1);
    assert_eq!(claim_n(&mut h, &["q"], 1), [t]);
}
