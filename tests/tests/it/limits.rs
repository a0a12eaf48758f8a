//! Limits against a real daemon: a budget shared by three queues and twenty agents, a
//! per-key limit over a thousand keys, a throttle reported by an agent, and a restart
//! in the middle of a burst. Every bound is checked from the daemon's own record of
//! each lease (the `leased` and settle events of the tasks' timelines, in wall ms).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use muster_sdk::protocol::model::{LimitSpec, LimitUse, Rate};
use muster_sdk::{Client, NewTask, Outcome, QueuePatch, TaskState, Worker, WorkerConfig};
use muster_tests::Daemon;

fn limited(n: usize, limits: Vec<LimitUse>) -> NewTask {
    NewTask {
        limits,
        ..NewTask::new(muster_sdk::json(&serde_json::json!({ "n": n })).expect("json"))
    }
}

fn uses(limit: &str, key: Option<String>) -> LimitUse {
    LimitUse {
        limit: limit.into(),
        key,
        cost: None,
    }
}

/// Each grant of the tasks `ids` as the daemon recorded it: (granted, ended) in wall
/// ms, with the task's key for its limit. A lease handed back to its member's agent
/// (reclaimed, redelivered) is the same grant going on.
async fn leases(client: &Client, ids: &[String]) -> Vec<(u64, u64, Option<String>)> {
    let mut out = Vec::new();
    for id in ids {
        let task = client.task_get(id).await.expect("task_get");
        let key = task.limits.first().and_then(|l| l.key.clone());
        let mut granted = None;
        for e in &task.history {
            match e.event.as_str() {
                "leased" => granted = Some(e.at_ms),
                "done" | "nacked" | "released" | "throttled" | "lapsed" | "dead_lettered" => {
                    if let Some(at) = granted.take() {
                        out.push((at, e.at_ms, key.clone()));
                    }
                }
                _ => {}
            }
        }
    }
    out
}

/// Asserts the bucket's bound over every interval between two grants: at most
/// `burst + count × interval / per_ms` granted (1 ms of slack for wall-ms rounding).
fn assert_bucket(grants: &mut [u64], count: u64, per_ms: u64, burst: u64) {
    grants.sort_unstable();
    for i in 0..grants.len() {
        for j in i..grants.len() {
            let n = (j - i + 1) as u64;
            let span = grants[j] - grants[i] + 1;
            assert!(
                n * per_ms <= burst * per_ms + count * span,
                "{n} grants in {span} ms beat {count} per {per_ms} ms with a burst of {burst}"
            );
        }
    }
}

/// Asserts that at most `cap` leases overlap at any time.
fn assert_concurrency(leases: &[(u64, u64)], cap: usize) {
    let mut edges: Vec<(u64, i32)> = Vec::new();
    for (from, to) in leases {
        edges.push((*from, 1));
        edges.push((*to, -1));
    }
    // An end and a start at the same ms: the end first (the slot came back).
    edges.sort_unstable();
    let mut held = 0;
    for (at, d) in edges {
        held += d;
        assert!(
            held as usize <= cap,
            "{held} leases held at {at}, over {cap}"
        );
    }
}

async fn drain_with_agents(
    options: muster_sdk::ConnectOptions,
    queues: &[&str],
    agents: usize,
    handler: impl Fn(muster_sdk::Task) -> Outcome + Send + Sync + Clone + 'static,
) -> Vec<muster_sdk::WorkerHandle> {
    let mut handles = Vec::new();
    for n in 0..agents {
        let mut config = WorkerConfig::new(format!("agent-{n}"), queues.iter().copied());
        config.capacity = 2;
        let worker = Worker::new(options.clone(), config);
        handles.push(worker.handle());
        let handler = handler.clone();
        tokio::spawn(worker.run(move |task| {
            let handler = handler.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                handler(task)
            }
        }));
    }
    handles
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_queues_share_one_limit_with_twenty_agents() {
    let d = Daemon::start();
    let client = d.client().await;
    for q in ["a", "b", "c"] {
        client.queue_create(q, QueuePatch::default()).await.unwrap();
    }
    let (count, per_ms, burst) = (40, 1000, 5);
    let spec = LimitSpec {
        rate: Some(Rate { count, per_ms }),
        burst: Some(burst),
        concurrency: Some(4),
        per_key: false,
    };
    client.limit_set("api", spec).await.unwrap();
    let mut ids = Vec::new();
    for n in 0..90 {
        let q = ["a", "b", "c"][n % 3];
        let t = limited(n, vec![uses("api", None)]);
        ids.push(client.enqueue(q, t).await.unwrap().id);
    }
    let handles =
        drain_with_agents(d.options(), &["a", "b", "c"], 20, |_| Outcome::Ack(None)).await;
    let reply = client.wait(ids.clone(), 60_000).await.unwrap();
    assert_eq!((reply.finished.len(), reply.pending.len()), (90, 0));
    let leases = leases(&client, &ids).await;
    assert_eq!(leases.len(), 90, "one lease per task");
    assert_bucket(
        &mut leases.iter().map(|l| l.0).collect::<Vec<_>>(),
        count,
        per_ms,
        burst,
    );
    assert_concurrency(&leases.iter().map(|l| (l.0, l.1)).collect::<Vec<_>>(), 4);
    let info = client.limit_get("api").await.unwrap();
    assert_eq!((info.granted, info.held, info.waiting), (90, 0, 0));
    for h in handles {
        h.shutdown();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_per_key_limit_over_a_thousand_keys_runs_each_key_alone() {
    let d = Daemon::start();
    let client = d.client().await;
    client
        .queue_create("q", QueuePatch::default())
        .await
        .unwrap();
    let spec = LimitSpec {
        concurrency: Some(1),
        per_key: true,
        ..LimitSpec::default()
    };
    client.limit_set("tenant", spec).await.unwrap();
    let mut tasks = Vec::new();
    for n in 0..2000 {
        let key = format!("org-{}", n % 1000);
        tasks.push(limited(n, vec![uses("tenant", Some(key))]));
    }
    let mut ids: Vec<String> = Vec::new();
    let mut tasks = tasks.into_iter().peekable();
    while tasks.peek().is_some() {
        let batch: Vec<NewTask> = tasks.by_ref().take(1000).collect();
        let done = client.enqueue_batch("q", batch).await.unwrap();
        ids.extend(done.into_iter().map(|t| t.id));
    }
    let handles = drain_with_agents(d.options(), &["q"], 10, |_| Outcome::Ack(None)).await;
    for half in ids.chunks(1000) {
        let reply = client.wait(half.to_vec(), 120_000).await.unwrap();
        assert_eq!((reply.finished.len(), reply.pending.len()), (1000, 0));
    }
    let mut by_key: HashMap<String, Vec<(u64, u64)>> = HashMap::new();
    for (from, to, key) in leases(&client, &ids).await {
        by_key
            .entry(key.expect("a key"))
            .or_default()
            .push((from, to));
    }
    assert_eq!(by_key.len(), 1000);
    for (key, leases) in &by_key {
        assert_eq!(leases.len(), 2, "key {key}");
        assert_concurrency(leases, 1);
    }
    let info = client.limit_get("tenant").await.unwrap();
    assert_eq!((info.granted, info.keys_in_use), (2000, 0));
    for h in handles {
        h.shutdown();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttle_reported_by_an_agent_pauses_only_its_key() {
    let d = Daemon::start();
    let client = d.client().await;
    client
        .queue_create("q", QueuePatch::default())
        .await
        .unwrap();
    let spec = LimitSpec {
        concurrency: Some(10),
        per_key: true,
        ..LimitSpec::default()
    };
    client.limit_set("provider", spec).await.unwrap();
    let a = client
        .enqueue("q", limited(0, vec![uses("provider", Some("a".into()))]))
        .await
        .unwrap()
        .id;
    let throttled_once: Arc<Mutex<bool>> = Arc::default();
    let seen = Arc::clone(&throttled_once);
    let handles = drain_with_agents(d.options(), &["q"], 2, move |task| {
        let mut seen = seen.lock().unwrap();
        if !*seen && task.payload().get() == r#"{"n":0}"# {
            *seen = true;
            return Outcome::Throttled {
                retry_after: Some(Duration::from_millis(1_500)),
                limit: Some("provider".into()),
            };
        }
        Outcome::Ack(None)
    })
    .await;
    // Once a is throttled, key b's tasks go and key a's wait out the throttle.
    for _ in 0..100 {
        if *throttled_once.lock().unwrap() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        *throttled_once.lock().unwrap(),
        "the agent reported the throttle"
    );
    let a2 = client
        .enqueue("q", limited(1, vec![uses("provider", Some("a".into()))]))
        .await
        .unwrap()
        .id;
    let b = client
        .enqueue("q", limited(2, vec![uses("provider", Some("b".into()))]))
        .await
        .unwrap()
        .id;
    let reply = client.wait(vec![b.clone()], 1_000).await.unwrap();
    assert_eq!(reply.finished.len(), 1, "key b is not held back");
    assert_eq!(client.task_get(&a2).await.unwrap().state, TaskState::Ready);
    let reply = client.wait(vec![a.clone(), a2], 10_000).await.unwrap();
    assert_eq!(reply.finished.len(), 2);
    let task = client.task_get(&a).await.unwrap();
    assert_eq!((task.state, task.failures), (TaskState::Done, 0));
    let throttled = task
        .history
        .iter()
        .find(|e| e.event == "throttled")
        .unwrap();
    let leased_again = task
        .history
        .iter()
        .filter(|e| e.event == "leased")
        .nth(1)
        .unwrap();
    // The throttle runs on the daemon's monotonic clock and history shows wall
    // times: each read is cut to whole milliseconds on its own, so the wall times
    // can show one millisecond less than the monotonic wait.
    assert!(
        leased_again.at_ms + 1 >= throttled.at_ms + 1_500,
        "key a waited its throttle out: {} ms",
        leased_again.at_ms - throttled.at_ms
    );
    for h in handles {
        h.shutdown();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_in_the_middle_of_a_burst_lets_no_burst_through_twice() {
    let mut d = Daemon::start();
    let client = d.client().await;
    client
        .queue_create("q", QueuePatch::default())
        .await
        .unwrap();
    let (count, per_ms, burst) = (20, 1000, 10);
    let spec = LimitSpec {
        rate: Some(Rate { count, per_ms }),
        burst: Some(burst),
        ..LimitSpec::default()
    };
    client.limit_set("api", spec).await.unwrap();
    let tasks: Vec<NewTask> = (0..60)
        .map(|n| limited(n, vec![uses("api", None)]))
        .collect();
    let ids: Vec<String> = client
        .enqueue_batch("q", tasks)
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.id)
        .collect();
    // Let the bucket fill, then take the burst and some, and kill the daemon.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let handles = drain_with_agents(d.options(), &["q"], 4, |_| Outcome::Ack(None)).await;
    for _ in 0..200 {
        if client
            .limit_get("api")
            .await
            .map(|l| l.granted)
            .unwrap_or(0)
            >= 15
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::task::block_in_place(|| {
        d.kill9();
        d.restart();
    });
    let client = d.client().await;
    let reply = client.wait(ids.clone(), 60_000).await.unwrap();
    assert_eq!((reply.finished.len(), reply.pending.len()), (60, 0));
    let leases = leases(&client, &ids).await;
    assert!(leases.len() >= 60);
    assert_bucket(
        &mut leases.iter().map(|l| l.0).collect::<Vec<_>>(),
        count,
        per_ms,
        burst,
    );
    for h in handles {
        h.shutdown();
    }
}

/// Fair dispatch from the CLI: a queue created `--fair true --group-weight gold=2`,
/// tasks enqueued `--group`; claims take gold twice for each of tin's turns though
/// tin's backlog came first, and `queue describe` and `task get` show it all.
#[test]
fn fair_dispatch_from_the_cli_shares_turns_by_weight() {
    let d = Daemon::start();
    let ok = |args: &[&str]| {
        let out = d.cli(args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    ok(&[
        "queue",
        "create",
        "q",
        "--fair",
        "true",
        "--group-weight",
        "gold=2",
    ]);
    let describe = ok(&["queue", "describe", "q"]);
    assert!(
        describe.lines().any(|l| l == "fair\ttrue gold=2"),
        "{describe}"
    );
    let mut groups = HashMap::new();
    for (group, n) in [("tin", 6), ("gold", 6)] {
        for i in 0..n {
            let id = ok(&["enqueue", "q", &i.to_string(), "--group", group]);
            groups.insert(id.trim().to_owned(), group);
        }
    }
    let mut order = Vec::new();
    for _ in 0..9 {
        let line = ok(&["claim", "q", "--max", "1", "--wait", "0s"]);
        let claim = line.split('\t').next().unwrap();
        let id = claim.split('.').next().unwrap();
        order.push(groups[id]);
        ok(&["ack", claim]);
    }
    // Both start even and gold wins the tie by name; then two of gold's turns cost
    // what one of tin's does.
    assert_eq!(
        order,
        [
            "gold", "tin", "gold", "gold", "tin", "gold", "gold", "tin", "gold"
        ]
    );
    let task = ok(&[
        "task",
        "get",
        groups.iter().find(|(_, g)| **g == "tin").unwrap().0,
    ]);
    assert!(task.lines().any(|l| l == "group\ttin"), "{task}");
    // Bad weights are refused with a one-line message and change nothing.
    for bad in ["gold=0", "gold=1001", "gold", "=2"] {
        let out = d.cli(&["queue", "update", "q", "--group-weight", bad]);
        assert!(!out.status.success(), "{bad}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{bad}: {err}");
    }
    let describe = ok(&["queue", "describe", "q"]);
    assert!(
        describe.lines().any(|l| l == "fair\ttrue gold=2"),
        "{describe}"
    );
}

/// A cluster's leader killed in the middle of a burst: the new leader's buckets start
/// empty, so the grants of the whole run, both leaders' together, keep the bucket's
/// bound over every interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_failover_in_the_middle_of_a_burst_lets_no_burst_through_twice() {
    let mut cluster = muster_tests::cluster::Cluster::start(3).await;
    let client = cluster.client().await;
    client
        .queue_create("q", QueuePatch::default())
        .await
        .unwrap();
    let (count, per_ms, burst) = (20, 1000, 10);
    let spec = LimitSpec {
        rate: Some(Rate { count, per_ms }),
        burst: Some(burst),
        ..LimitSpec::default()
    };
    client.limit_set("api", spec).await.unwrap();
    let tasks: Vec<NewTask> = (0..60)
        .map(|n| limited(n, vec![uses("api", None)]))
        .collect();
    let ids: Vec<String> = client
        .enqueue_batch("q", tasks)
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.id)
        .collect();
    tokio::time::sleep(Duration::from_millis(600)).await;
    let handles = drain_with_agents(cluster.options(), &["q"], 4, |_| Outcome::Ack(None)).await;
    for _ in 0..200 {
        if client
            .limit_get("api")
            .await
            .map(|l| l.granted)
            .unwrap_or(0)
            >= 15
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let old = cluster.leader().await;
    cluster.kill9(old.node);
    let new = cluster.leader().await;
    assert_ne!(new.node, old.node);
    let client = cluster.client().await;
    let reply = client.wait(ids.clone(), 60_000).await.unwrap();
    assert_eq!((reply.finished.len(), reply.pending.len()), (60, 0));
    let leases = leases(&client, &ids).await;
    assert!(leases.len() >= 60);
    assert_bucket(
        &mut leases.iter().map(|l| l.0).collect::<Vec<_>>(),
        count,
        per_ms,
        burst,
    );
    for h in handles {
        h.shutdown();
    }
}

/// A handler's throttle naming a limit its task does not draw on is refused by the
/// daemon; the Worker then throttles the task's own limits instead of letting its lease
/// lapse into a failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttle_naming_another_limit_throttles_the_tasks_own() {
    let d = Daemon::start();
    let client = d.client().await;
    client
        .queue_create("q", QueuePatch::default())
        .await
        .unwrap();
    let spec = LimitSpec {
        concurrency: Some(5),
        ..LimitSpec::default()
    };
    client.limit_set("api", spec.clone()).await.unwrap();
    client.limit_set("other", spec).await.unwrap();
    let id = client
        .enqueue("q", limited(0, vec![uses("api", None)]))
        .await
        .unwrap()
        .id;
    let throttled = Arc::new(Mutex::new(false));
    let first = Arc::clone(&throttled);
    let handles = drain_with_agents(d.options(), &["q"], 1, move |_| {
        let mut first = first.lock().unwrap();
        if *first {
            return Outcome::Ack(None);
        }
        *first = true;
        Outcome::Throttled {
            retry_after: Some(Duration::from_millis(200)),
            limit: Some("other".into()),
        }
    })
    .await;
    let reply = client.wait(vec![id.clone()], 30_000).await.unwrap();
    assert_eq!(reply.finished.len(), 1);
    let task = client.task_get(&id).await.unwrap();
    let events: Vec<&str> = task.history.iter().map(|e| e.event.as_str()).collect();
    assert_eq!(
        (task.state, task.failures, events),
        (
            TaskState::Done,
            0,
            vec!["enqueued", "leased", "throttled", "leased", "done"]
        )
    );
    let (api, other) = (
        client.limit_get("api").await.unwrap(),
        client.limit_get("other").await.unwrap(),
    );
    assert_eq!((api.throttled, other.throttled), (1, 0));
    for h in handles {
        h.shutdown();
    }
}
