//! Fencing against a real daemon, in every order: after a lease lapses and the task is
//! claimed again, the old claim's ack, nack, renew, renew with progress, release and
//! dead-letter are each refused with `lease_lost` and change nothing, before and after
//! a kill -9 and restart; the current claim still settles.

use muster_sdk::protocol::ops::Claim;
use muster_sdk::{Client, ErrorCode, NewTask, QueuePatch, TaskInfo, TaskState};
use muster_tests::Daemon;

/// Every stale settle, by name, sent with `epoch`.
async fn refuse_all_stale(client: &Client, id: &str, epoch: u64) {
    let progress = muster_sdk::json(&serde_json::json!({"stale": true})).expect("json");
    let before = client.task_get(id).await.expect("task_get");
    let results = [
        ("ack", client.ack(id, epoch, None).await.map(|_| ())),
        (
            "nack",
            client.nack(id, epoch, Some(0), None).await.map(|_| ()),
        ),
        (
            "renew",
            client.renew(id, epoch, None, None).await.map(|_| ()),
        ),
        (
            "progress",
            client
                .renew(id, epoch, Some(60_000), Some(progress))
                .await
                .map(|_| ()),
        ),
        ("release", client.release(id, epoch).await.map(|_| ())),
        (
            "dead_letter",
            client.dead_letter(id, epoch, "stale").await.map(|_| ()),
        ),
    ];
    for (name, r) in results {
        let e = r.expect_err(name);
        assert_eq!(e.code(), Some(ErrorCode::LeaseLost), "{name}: {e}");
    }
    let after = client.task_get(id).await.expect("task_get");
    assert_eq!(
        view(&after),
        view(&before),
        "a stale settle changed the task"
    );
}

fn view(t: &TaskInfo) -> String {
    format!("{t:?}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_claims_after_a_lapse_and_a_new_claim_are_refused_and_change_nothing() {
    let mut d = Daemon::start();
    let client = d.client().await;
    let lease = QueuePatch {
        lease_ms: Some(500),
        max_attempts: Some(0),
        ..QueuePatch::default()
    };
    client.queue_create("fence", lease).await.unwrap();
    let id = client
        .enqueue("fence", NewTask::new(muster_sdk::json(&1).unwrap()))
        .await
        .unwrap()
        .id;
    let claim = Claim::new(["fence"]).wait_ms(5_000);
    let first = client.claim(&claim).await.unwrap();
    assert_eq!((first.len(), first[0].epoch), (1, 1));
    // Nobody renews: the lease lapses after 500 ms and the waiting claim gets epoch 2.
    let second = client.claim(&claim).await.unwrap();
    assert_eq!(
        (second.len(), second[0].id.as_str(), second[0].epoch),
        (1, id.as_str(), 2)
    );
    // Keep the new lease alive across the restart below.
    client.renew(&id, 2, Some(60_000), None).await.unwrap();

    refuse_all_stale(&client, &id, 1).await;
    // An epoch from the future is as stale as one from the past.
    refuse_all_stale(&client, &id, 3).await;

    drop(client);
    d.kill9();
    d.restart();
    let client = d.client().await;
    refuse_all_stale(&client, &id, 1).await;
    let t = client.task_get(&id).await.unwrap();
    assert_eq!(
        (
            t.state,
            t.deliveries,
            t.failures,
            t.lease.as_ref().map(|l| l.epoch),
            t.progress.is_none()
        ),
        (TaskState::Leased, 2, 1, Some(2), true)
    );
    assert_eq!(
        client.ack(&id, 2, None).await.unwrap().state,
        TaskState::Done
    );
    // Settling twice is refused too: the lease ended with the first.
    refuse_all_stale(&client, &id, 2).await;
    let t = client.task_get(&id).await.unwrap();
    assert_eq!((t.state, t.deliveries, t.failures), (TaskState::Done, 2, 1));
}
