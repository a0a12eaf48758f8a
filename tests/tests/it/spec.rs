//! The daemon as PROTOCOL.md describes it, where a client written from the document
//! alone found the two disagreeing, and the engine bugs a whole-engine property test
//! found: subscriptions across a queue's deletion, waits ended by removals (purge and
//! queue deletion), `null`, member records, paging of queues, leases under
//! `max_runtime_ms` across restarts and queue updates, the member named by a reclaim's
//! dead letter, members dropped when their connection ends without leases, and
//! priority within a key's first `key_concurrency` places.

use std::time::{Duration, Instant};

use muster_sdk::protocol::ops::{self, Claim, SessionOpen};
use muster_sdk::{Client, ErrorCode, NewTask, QueuePatch, TaskState};
use muster_tests::{Daemon, until};

async fn enqueue(client: &Client, queue: &str) -> String {
    let payload = muster_sdk::json(&1).expect("json");
    client
        .enqueue(queue, NewTask::new(payload))
        .await
        .expect("enqueue")
        .id
}

/// A daemon with a queue of default options, and a client.
async fn with_queue(queue: &str) -> (Daemon, Client) {
    with_queue_options(queue, QueuePatch::default()).await
}

/// A daemon with a queue of these options, and a client.
async fn with_queue_options(queue: &str, options: QueuePatch) -> (Daemon, Client) {
    let d = Daemon::start();
    let client = d.client().await;
    client
        .queue_create(queue, options)
        .await
        .expect("queue_create");
    (d, client)
}

/// Waits for the next push, which must be the delivery of task `id`, within 5 s.
async fn delivered(pushes: &mut tokio::sync::mpsc::UnboundedReceiver<muster_sdk::Push>, id: &str) {
    let push = tokio::time::timeout(Duration::from_secs(5), pushes.recv())
        .await
        .expect("a push within 5 s");
    match push {
        Some(muster_sdk::Push::Deliver(delivery)) => assert_eq!(delivery.id, id),
        other => panic!("{other:?}"),
    }
}

fn session(member: &str, labels: &[&str]) -> SessionOpen {
    SessionOpen {
        member: member.into(),
        labels: labels.iter().map(|l| (*l).to_owned()).collect(),
        capacity: 2,
        reclaim: false,
        resume: false,
        held: None,
        liveness_ms: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_outlives_its_queue_and_serves_it_again_when_created_again() {
    let d = Daemon::start();
    let client = d.client().await;
    client
        .queue_create("a", QueuePatch::default())
        .await
        .unwrap();
    let agent = d.client().await;
    let (_, mut pushes) = agent.open_session(&session("m", &[])).await.unwrap();
    agent.subscribe("m", &["a".into()]).await.unwrap();
    client.queue_delete("a").await.unwrap();
    let m = client.member_describe("m").await.unwrap().member;
    assert_eq!(m.subscribed, ["a"]);
    client
        .queue_create("a", QueuePatch::default())
        .await
        .unwrap();
    let id = enqueue(&client, "a").await;
    delivered(&mut pushes, &id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_ends_at_once_when_its_tasks_are_purged() {
    let (_d, client) = with_queue("q").await;
    let id = enqueue(&client, "q").await;
    // Requests sent one after another on a connection arrive in that order: the wait
    // is parked before the purge.
    let wait = client
        .send(&ops::Wait {
            tasks: vec![id],
            timeout_ms: Some(60_000),
        })
        .await
        .unwrap();
    let asked = Instant::now();
    assert_eq!(client.queue_purge("q").await.unwrap(), 1);
    let reply = tokio::time::timeout(Duration::from_secs(5), wait.reply())
        .await
        .expect("answered at once")
        .unwrap();
    assert_eq!(
        (
            reply.finished.len(),
            reply.pending.len(),
            reply.removed.len()
        ),
        (0, 0, 1)
    );
    eprintln!(
        "wait answered {:?} after the purge was sent",
        asked.elapsed()
    );
}

/// Sends raw request frames on a stream of their own, after a `hello` with the
/// daemon's local token, and returns each reply but the hello's.
async fn raw_frames(d: &Daemon, bodies: &[&str]) -> Vec<serde_json::Value> {
    let options = d.options();
    let conn = muster_sdk::connect::open(&options).await.expect("connect");
    let (mut send, mut recv) = conn.open_bi().await.expect("stream");
    let hello = serde_json::json!({
        "id": 0, "op": "hello", "version": 1, "token": options.hello_token().expect("the local token"),
    })
    .to_string();
    let mut replies: Vec<serde_json::Value> = Vec::new();
    for body in std::iter::once(hello.as_str()).chain(bodies.iter().copied()) {
        let mut frame = (body.len() as u32).to_be_bytes().to_vec();
        frame.extend_from_slice(body.as_bytes());
        send.write_all(&frame).await.expect("write");
        let mut len = [0u8; 4];
        recv.read_exact(&mut len).await.expect("reply header");
        let mut reply = vec![0u8; u32::from_be_bytes(len) as usize];
        recv.read_exact(&mut reply).await.expect("reply body");
        replies.push(serde_json::from_slice(&reply).expect("reply JSON"));
    }
    assert_eq!(replies[0]["ok"], true, "hello: {}", replies[0]);
    replies.split_off(1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn null_is_absent_for_numbers_and_refused_for_booleans_and_objects_on_the_wire() {
    let (d, client) = with_queue("q").await;
    let replies = raw_frames(
        &d,
        &[
            r#"{"id":1,"op":"queue_update","queue":"q","options":{"lease_ms":null}}"#,
            r#"{"id":2,"op":"queue_update","queue":"q","options":{"paused":null}}"#,
            r#"{"id":3,"op":"queue_update","queue":"q","options":{"retry_backoff":null}}"#,
            r#"{"id":4,"op":"watch","tag":null,"view":{"screen":"queues"}}"#,
        ],
    )
    .await;
    let got: Vec<(u64, bool, &str)> = replies
        .iter()
        .map(|v| {
            (
                v["id"].as_u64().unwrap(),
                v["ok"].as_bool().unwrap(),
                v["error"]["code"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (1, true, ""),
            (2, false, "bad_request"),
            (3, false, "bad_request"),
            (4, true, "")
        ]
    );
    assert_eq!(replies[3]["tag"], 0);
    // Nothing refused changed the queue.
    let q = client.queue_describe("q").await.unwrap();
    assert_eq!(q.options, muster_sdk::QueueOptions::default());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_list_pages_and_duplicate_queues_are_refused() {
    let d = Daemon::start();
    let client = d.client().await;
    for n in 0..250 {
        client
            .queue_create(&format!("q{n:03}"), QueuePatch::default())
            .await
            .unwrap();
    }
    let first = client.call(&ops::QueueList::default()).await.unwrap();
    assert_eq!(first.queues.len(), 100);
    assert_eq!(first.next.as_deref(), Some("q099"));
    let all = client.queue_list().await.unwrap();
    assert_eq!(all.len(), 250);
    assert!(all.windows(2).all(|w| w[0].name < w[1].name));
    let e = client
        .claim(&Claim::new(["q000", "q001", "q000"]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::BadRequest), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_of_a_disconnected_members_last_lease_keeps_its_record() {
    let (d, client) = with_queue("q").await;
    let id = enqueue(&client, "q").await;
    let agent = d.client().await;
    let (_, _pushes) = agent
        .open_session(&session("keeper", &["gpu"]))
        .await
        .unwrap();
    let got = agent
        .claim(&Claim::new(["q"]).member("keeper"))
        .await
        .unwrap();
    assert_eq!(got.len(), 1);
    agent.close().await;
    let before = client.member_describe("keeper").await.unwrap().member;
    client.renew(&id, 1, None, None).await.unwrap();
    client.cancel(&id).await.unwrap();
    let after = client.member_describe("keeper").await.unwrap().member;
    assert_eq!(
        (
            after.labels.clone(),
            after.capacity,
            after.leased,
            after.last_seen_ms
        ),
        (vec!["gpu".to_owned()], 2, 1, before.last_seen_ms)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_runtime_holds_across_a_restart_and_a_refused_renewal_means_the_lease_ended() {
    let mut d = Daemon::start();
    let client = d.client().await;
    let patch = QueuePatch {
        lease_ms: Some(1_000),
        max_runtime_ms: Some(3_000),
        ..QueuePatch::default()
    };
    client.queue_create("q", patch).await.unwrap();
    let id = enqueue(&client, "q").await;
    let granted = Instant::now();
    assert_eq!(client.claim(&Claim::new(["q"])).await.unwrap().len(), 1);
    drop(client);
    tokio::task::block_in_place(|| {
        d.kill9();
        d.restart();
    });
    let client = d.client().await;
    // Renew until refused: the cap counts from the grant, not from the restart.
    let refused = loop {
        match client.renew(&id, 1, None, None).await {
            Ok(_) => {}
            Err(e) => break e,
        }
        assert!(
            granted.elapsed() < Duration::from_secs(10),
            "renewed for 10 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(refused.code(), Some(ErrorCode::LeaseLost), "{refused}");
    let at = granted.elapsed();
    assert!(
        at < Duration::from_millis(3_500),
        "refused only {at:?} after the grant"
    );
    // The refusal is the truth: the lease is gone, the task ready again.
    let t = client.task_get(&id).await.unwrap();
    assert_eq!((t.state, t.failures, t.lease), (TaskState::Ready, 1, None));

    // Lowering max_runtime below a running delivery's age ends its lease at once.
    client
        .queue_update(
            "q",
            QueuePatch {
                max_runtime_ms: Some(0),
                lease_ms: Some(60_000),
                ..QueuePatch::default()
            },
        )
        .await
        .unwrap();
    let got = client.claim(&Claim::new(["q"])).await.unwrap();
    let epoch = got[0].epoch;
    tokio::time::sleep(Duration::from_millis(300)).await;
    client
        .queue_update(
            "q",
            QueuePatch {
                max_runtime_ms: Some(200),
                ..QueuePatch::default()
            },
        )
        .await
        .unwrap();
    let t = client.task_get(&id).await.unwrap();
    assert_eq!(
        (t.state, t.failures),
        (TaskState::Ready, 2),
        "{:?}",
        t.history
    );
    let e = client.ack(&id, epoch, None).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::LeaseLost));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_ends_at_once_when_its_queue_is_deleted() {
    let (_d, client) = with_queue("q").await;
    let (a, b) = (enqueue(&client, "q").await, enqueue(&client, "q").await);
    let wait = client
        .send(&ops::Wait {
            tasks: vec![a.clone(), b.clone()],
            timeout_ms: Some(60_000),
        })
        .await
        .unwrap();
    assert_eq!(client.queue_delete("q").await.unwrap(), 2);
    let reply = tokio::time::timeout(Duration::from_secs(5), wait.reply())
        .await
        .expect("answered at once")
        .unwrap();
    let mut removed = reply.removed.clone();
    removed.sort();
    let mut want = vec![a, b];
    want.sort();
    assert_eq!(
        (reply.finished.len(), reply.pending.len(), removed),
        (0, 0, want)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reclaim_reaching_max_attempts_names_the_member_in_its_dead_lettered_event() {
    let (d, client) = with_queue_options(
        "q",
        QueuePatch {
            max_attempts: Some(1),
            ..QueuePatch::default()
        },
    )
    .await;
    let id = enqueue(&client, "q").await;
    let first = d.client().await;
    let (_, mut pushes) = first.open_session(&session("m", &[])).await.unwrap();
    first.subscribe("m", &["q".into()]).await.unwrap();
    delivered(&mut pushes, &id).await;
    // The member comes back (a new process under the same name) and reclaims.
    let second = d.client().await;
    let mut again = session("m", &[]);
    again.reclaim = true;
    second.open_session(&again).await.unwrap();
    let t = client.task_get(&id).await.unwrap();
    assert_eq!((t.state, t.failures), (TaskState::Dead, 1));
    let last = t.history.last().expect("events");
    assert_eq!(
        (
            last.event.as_str(),
            last.member.as_deref(),
            last.error.as_deref()
        ),
        ("dead_lettered", Some("m"), Some("max_attempts"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_connection_ends_is_dropped_unless_it_holds_leases() {
    let (d, client) = with_queue("q").await;
    let id = enqueue(&client, "q").await;
    let idle = d.client().await;
    idle.open_session(&session("idle", &[])).await.unwrap();
    let holder = d.client().await;
    let (_, mut pushes) = holder.open_session(&session("holder", &[])).await.unwrap();
    holder.subscribe("holder", &["q".into()]).await.unwrap();
    delivered(&mut pushes, &id).await;
    let names = |list: &[muster_sdk::protocol::model::MemberInfo]| {
        let mut v: Vec<_> = list
            .iter()
            .map(|m| (m.name.clone(), m.state, m.leased))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    };
    use muster_sdk::protocol::model::MemberState::{Connected, Gone};
    assert_eq!(
        names(&client.member_list().await.unwrap()),
        [
            ("holder".to_owned(), Connected, 1),
            ("idle".to_owned(), Connected, 0)
        ]
    );
    idle.close().await;
    holder.close().await;
    // `close` waits until the daemon was told: both ends are seen at once.
    until(
        Duration::from_secs(5),
        "idle dropped and holder gone after closing",
        || async {
            names(&client.member_list().await.unwrap()) == [("holder".to_owned(), Gone, 1)]
        },
    )
    .await;
    assert_eq!(client.task_get(&id).await.unwrap().state, TaskState::Leased);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priority_orders_a_keys_first_key_concurrency_places_only() {
    let (_d, client) = with_queue_options(
        "q",
        QueuePatch {
            key_concurrency: Some(2),
            ..QueuePatch::default()
        },
    )
    .await;
    let task = |priority: u8| {
        let mut t = NewTask::new(muster_sdk::json(&priority).unwrap());
        t.priority = Some(priority);
        t.key = Some("k".into());
        t
    };
    let a = client.enqueue("q", task(0)).await.unwrap().id;
    let b = client.enqueue("q", task(9)).await.unwrap().id;
    let claim_one = || async {
        let got = client.claim(&Claim::new(["q"])).await.unwrap();
        got.into_iter().map(|t| t.id).collect::<Vec<_>>()
    };
    // Both are among the key's first two places: priority picks the later one.
    assert_eq!(claim_one().await, [b]);
    // The line is now a (ready), b (leased), c: c is third, so a comes first although
    // c has the higher priority.
    let c = client.enqueue("q", task(9)).await.unwrap().id;
    assert_eq!(claim_one().await, [a]);
    // Two of the key are leased: nothing more of it until one finishes.
    assert_eq!(claim_one().await, Vec::<String>::new());
    let t = client.task_get(&c).await.unwrap();
    assert_eq!(t.state, TaskState::Ready);
}
