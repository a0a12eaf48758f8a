//! kill -9 of the daemon: nothing acknowledged is lost, leases survive.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use muster_sdk::protocol::ops::Claim;
use muster_sdk::{NewTask, QueuePatch, TaskState};
use muster_tests::Daemon;
use tokio::sync::{Semaphore, watch};

const PRODUCERS: u64 = 4;
const PER_PRODUCER: u64 = 2500;
const IN_FLIGHT: usize = 64;
/// Acknowledged enqueues after which the daemon is killed.
const KILL_AFTER: usize = 2000;

fn claim_all(queue: &str) -> Claim {
    Claim::new([queue]).max(1000).lease_ms(600_000)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_during_a_burst_of_enqueues_loses_nothing_acknowledged() {
    let mut d = Daemon::start();
    d.client()
        .await
        .queue_create("burst", QueuePatch::default())
        .await
        .unwrap();

    let acked: Arc<Mutex<Vec<(u64, u64)>>> = Arc::default();
    let (progress, mut watch_rx) = watch::channel(0usize);
    let progress = Arc::new(progress);
    let mut producers = Vec::new();
    for p in 0..PRODUCERS {
        let client = d.client().await;
        let (acked, progress) = (Arc::clone(&acked), Arc::clone(&progress));
        producers.push(tokio::spawn(async move {
            let slots = Arc::new(Semaphore::new(IN_FLIGHT));
            let mut calls = Vec::new();
            for n in 0..PER_PRODUCER {
                let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
                    break;
                };
                let (client, acked, progress) =
                    (client.clone(), Arc::clone(&acked), Arc::clone(&progress));
                calls.push(tokio::spawn(async move {
                    let payload = muster_sdk::json(&serde_json::json!({"p": p, "n": n})).unwrap();
                    let ok = client.enqueue("burst", NewTask::new(payload)).await.is_ok();
                    if ok {
                        let total = {
                            let mut a = acked.lock().unwrap();
                            a.push((p, n));
                            a.len()
                        };
                        progress.send_replace(total);
                    }
                    drop(slot);
                    ok
                }));
            }
            for c in calls {
                c.await.unwrap();
            }
        }));
    }
    watch_rx.wait_for(|n| *n >= KILL_AFTER).await.unwrap();
    d.kill9();
    for p in producers {
        p.await.unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    assert!(
        acked.len() >= KILL_AFTER,
        "only {} acknowledged",
        acked.len()
    );
    assert!(
        acked.len() < (PRODUCERS * PER_PRODUCER) as usize,
        "the kill came too late to test anything"
    );

    d.restart();
    let client = d.client().await;
    let mut seen: HashMap<(u64, u64), u32> = HashMap::new();
    loop {
        let got = client.claim(&claim_all("burst")).await.unwrap();
        if got.is_empty() {
            break;
        }
        for t in got {
            let v: serde_json::Value = serde_json::from_str(t.payload.get()).unwrap();
            let key = (v["p"].as_u64().unwrap(), v["n"].as_u64().unwrap());
            assert!(
                key.0 < PRODUCERS && key.1 < PER_PRODUCER,
                "never attempted: {key:?}"
            );
            *seen.entry(key).or_default() += 1;
        }
    }
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "present more than once: {twice:?}");
    let lost: Vec<_> = acked.iter().filter(|k| !seen.contains_key(k)).collect();
    assert!(
        lost.is_empty(),
        "{} acknowledged enqueues lost, e.g. {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );
    let q = client.queue_describe("burst").await.unwrap();
    assert_eq!((q.counts.ready, q.counts.leased), (0, seen.len() as u64));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_held_across_a_kill9_is_renewed_and_acked_with_its_old_claim() {
    let mut d = Daemon::start();
    let client = d.client().await;
    client
        .queue_create(
            "long",
            QueuePatch {
                lease_ms: Some(30_000),
                ..QueuePatch::default()
            },
        )
        .await
        .unwrap();
    let id = client
        .enqueue("long", NewTask::new(muster_sdk::json(&1).unwrap()))
        .await
        .unwrap()
        .id;
    let got = client.claim(&claim_all("long")).await.unwrap();
    assert_eq!(
        (got.len(), got[0].id.as_str(), got[0].epoch),
        (1, id.as_str(), 1)
    );
    drop(client);
    d.kill9();
    d.restart();

    let client = d.client().await;
    let progress = muster_sdk::json(&serde_json::json!({"step": 2})).unwrap();
    let renewed = client
        .renew(&id, 1, Some(60_000), Some(progress))
        .await
        .unwrap();
    assert!(!renewed.cancel_requested);
    assert_eq!(
        client.ack(&id, 1, None).await.unwrap().state,
        TaskState::Done
    );
    let t = client.task_get(&id).await.unwrap();
    assert_eq!((t.state, t.deliveries, t.failures), (TaskState::Done, 1, 0));
    assert_eq!(t.progress.unwrap().get(), r#"{"step":2}"#);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_cleanly_and_everything_is_there_after_a_restart() {
    let mut d = Daemon::start();
    let client = d.client().await;
    client
        .queue_create("keep", QueuePatch::default())
        .await
        .unwrap();
    let tasks = (0..100)
        .map(|n| NewTask::new(muster_sdk::json(&n).unwrap()))
        .collect();
    let ids: Vec<String> = client
        .enqueue_batch("keep", tasks)
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.id)
        .collect();
    drop(client);
    assert_eq!(d.terminate(), Some(0));
    d.restart();
    let client = d.client().await;
    let page = client
        .task_list("keep", TaskState::Ready, None, Some(1000))
        .await
        .unwrap();
    assert_eq!(
        page.tasks.into_iter().map(|t| t.id).collect::<Vec<_>>(),
        ids
    );
}
