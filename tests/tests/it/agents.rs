//! Agents: member sessions, reclaim after kill -9, daemon restarts under a working
//! agent, takeover, drain on SIGTERM, capacity, and cancels reaching running work.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use muster_sdk::{
    Client, ErrorCode, NewTask, Outcome, QueuePatch, TaskState, Worker, WorkerConfig,
};
use muster_tests::Daemon;
use tokio::sync::{Notify, mpsc};

fn json(v: serde_json::Value) -> muster_sdk::RawJson {
    muster_sdk::json(&v).expect("serializable")
}

async fn queue_with_lease(client: &Client, queue: &str, lease_ms: u64) {
    let patch = QueuePatch {
        lease_ms: Some(lease_ms),
        ..QueuePatch::default()
    };
    client
        .queue_create(queue, patch)
        .await
        .expect("queue_create");
}

async fn enqueue(client: &Client, queue: &str, payload: serde_json::Value) -> String {
    client
        .enqueue(queue, NewTask::new(json(payload)))
        .await
        .expect("enqueue")
        .id
}

/// Polls the daemon (bounded) until `member` holds `n` leases.
async fn until_member_holds(client: &Client, member: &str, n: u64) {
    for _ in 0..300 {
        if let Ok(m) = client.member_describe(member).await
            && m.member.leased == n
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("member {member} never held {n} leases");
}

fn block<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_agent_restarted_under_its_name_gets_its_tasks_back_at_once() {
    let d = Daemon::start();
    let client = d.client().await;
    queue_with_lease(&client, "jobs", 30_000).await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(
            enqueue(
                &client,
                "jobs",
                serde_json::json!({"steps": 2000, "step_ms": 20}),
            )
            .await,
        );
    }
    let mut agent = d.spawn_agent("gpu-3/agent-7", "jobs", 3);
    let started =
        block(|| agent.lines_matching(3, Duration::from_secs(30), |l| l.starts_with("start ")));
    assert!(
        started
            .iter()
            .all(|l| l.contains("attempt=1 reclaimed=false progress=-")),
        "{started:?}"
    );
    // Wait (bounded) until every task has a checkpoint stored at the daemon.
    let mut checkpoints = HashMap::new();
    for _ in 0..200 {
        for id in &ids {
            if let Some(p) = client.task_get(id).await.unwrap().progress {
                let v: serde_json::Value = serde_json::from_str(p.get()).unwrap();
                checkpoints.insert(id.clone(), v["step"].as_u64().unwrap());
            }
        }
        if checkpoints.len() == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(checkpoints.len(), 3, "progress never reached the daemon");

    block(|| agent.kill9());
    let restarted_at = Instant::now();
    let again = d.spawn_agent("gpu-3/agent-7", "jobs", 3);
    // The lease is 30 s: getting the tasks back within 10 s cannot be a lapse.
    let lines =
        block(|| again.lines_matching(3, Duration::from_secs(10), |l| l.starts_with("start ")));
    let elapsed = restarted_at.elapsed();
    eprintln!("reclaim: 3 tasks back in the restarted agent's hands {elapsed:?} after its start");
    for line in &lines {
        let id = line.split(' ').nth(1).unwrap();
        assert!(
            line.contains(" attempt=2 reclaimed=true progress={\"step\":"),
            "{line}"
        );
        let step: u64 = line
            .rsplit(":")
            .next()
            .unwrap()
            .trim_end_matches('}')
            .parse()
            .unwrap();
        assert!(
            step >= checkpoints[id],
            "{line}: resumed before the stored checkpoint {}",
            checkpoints[id]
        );
    }
    for id in &ids {
        let t = client.task_get(id).await.unwrap();
        assert_eq!(
            (t.state, t.deliveries, t.failures),
            (TaskState::Leased, 2, 1)
        );
        let lease = t.lease.unwrap();
        assert_eq!((lease.member.as_str(), lease.epoch), ("gpu-3/agent-7", 2));
        let events: Vec<&str> = t.history.iter().map(|e| e.event.as_str()).collect();
        assert_eq!(events, ["enqueued", "leased", "reclaimed"]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn muster_work_killed_and_restarted_finishes_each_task_exactly_once() {
    let d = Daemon::start();
    let client = d.client().await;
    queue_with_lease(&client, "jobs", 30_000).await;
    let mut ids = Vec::new();
    for n in 0..3 {
        ids.push(enqueue(&client, "jobs", serde_json::json!({"n": n})).await);
    }
    // First run: hang on every task. After a restart (reclaimed): answer at once.
    let script = r#"if [ "$MUSTER_RECLAIMED" = true ]; then printf '{"attempt":%s}' "$MUSTER_ATTEMPT"; else exec sleep 60; fi"#;
    let args = [
        "work",
        "jobs",
        "--member",
        "shell-1",
        "--capacity",
        "3",
        "--",
        "sh",
        "-c",
        script,
    ];
    let mut work = d.spawn_cli(&args);
    until_member_holds(&client, "shell-1", 3).await;
    block(|| work.kill9());
    let restarted_at = Instant::now();
    let _again = d.spawn_cli(&args);
    let reply = client.wait(ids.clone(), 20_000).await.unwrap();
    eprintln!(
        "muster work: 3 tasks done {:?} after the restart",
        restarted_at.elapsed()
    );
    assert_eq!((reply.finished.len(), reply.pending.len()), (3, 0));
    for t in reply.finished {
        assert_eq!((t.state, t.deliveries), (TaskState::Done, 2));
        assert_eq!(t.result.unwrap().get(), r#"{"attempt":2}"#);
        let done = t.history.iter().filter(|e| e.event == "done").count();
        assert_eq!(done, 1, "{:?}", t.history);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_restart_does_not_take_work_away_from_a_working_agent() {
    let mut d = Daemon::start();
    let client = d.client().await;
    queue_with_lease(&client, "jobs", 30_000).await;
    let id = enqueue(&client, "jobs", serde_json::json!({"n": 1})).await;
    drop(client);
    let (started, mut started_rx) = mpsc::unbounded_channel();
    let finish = Arc::new(Notify::new());
    let worker = Worker::new(d.options(), WorkerConfig::new("steady", ["jobs"]));
    let handle = worker.handle();
    let gate = Arc::clone(&finish);
    let running = tokio::spawn(worker.run(move |task| {
        let (started, gate) = (started.clone(), Arc::clone(&gate));
        async move {
            let _ = started.send(task.id().to_owned());
            gate.notified().await;
            Outcome::Ack(Some(json(serde_json::json!("ok"))))
        }
    }));
    assert_eq!(started_rx.recv().await.unwrap(), id);
    block(|| {
        d.kill9();
        d.restart();
    });
    finish.notify_one();
    let client = d.client().await;
    let reply = client.wait(vec![id.clone()], 60_000).await.unwrap();
    assert_eq!(reply.finished.len(), 1, "{:?}", reply.pending);
    let t = &reply.finished[0];
    assert_eq!((t.state, t.deliveries, t.failures), (TaskState::Done, 1, 0));
    let events: Vec<&str> = t.history.iter().map(|e| e.event.as_str()).collect();
    assert_eq!(events, ["enqueued", "leased", "done"]);
    handle.shutdown();
    running.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_session_under_the_same_name_replaces_the_first() {
    let d = Daemon::start();
    let client = d.client().await;
    queue_with_lease(&client, "jobs", 30_000).await;
    let first = Worker::new(d.options(), WorkerConfig::new("twin", ["jobs"]));
    let first_run = tokio::spawn(first.run(|_task| async { Outcome::Ack(None) }));
    until_connected(&client, "twin").await;
    let second = Worker::new(d.options(), WorkerConfig::new("twin", ["jobs"]));
    let second_handle = second.handle();
    let second_run = tokio::spawn(second.run(|_task| async { Outcome::Ack(None) }));
    let ended = tokio::time::timeout(Duration::from_secs(20), first_run)
        .await
        .unwrap()
        .unwrap();
    match ended {
        Err(muster_sdk::Error::Server(e)) => assert_eq!(e.code, ErrorCode::Replaced),
        other => panic!("the first session should end replaced: {other:?}"),
    }
    let members = client.member_list().await.unwrap();
    assert_eq!(
        members
            .iter()
            .map(|m| (m.name.as_str(), m.connected))
            .collect::<Vec<_>>(),
        [("twin", true)]
    );
    second_handle.shutdown();
    second_run.await.unwrap().unwrap();
}

async fn until_connected(client: &Client, member: &str) {
    for _ in 0..300 {
        let members = client.member_list().await.expect("member_list");
        if members
            .iter()
            .any(|m| m.name == member && m.connected && !m.subscribed.is_empty())
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("member {member} never connected");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_releases_unfinished_tasks_for_another_agent_without_a_failure() {
    let d = Daemon::start();
    let client = d.client().await;
    queue_with_lease(&client, "jobs", 30_000).await;
    let a = enqueue(&client, "jobs", serde_json::json!({"n": 1})).await;
    let b = enqueue(&client, "jobs", serde_json::json!({"n": 2})).await;
    let args = [
        "work",
        "jobs",
        "--member",
        "leaving",
        "--capacity",
        "2",
        "--grace",
        "0s",
        "--",
        "sleep",
        "60",
    ];
    let mut work = d.spawn_cli(&args);
    until_member_holds(&client, "leaving", 2).await;
    // SIGTERM to the agent alone, as an orchestrator stopping it would send.
    let status = std::process::Command::new("kill")
        .args(["-TERM", &work.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    assert_eq!(block(|| work.wait(Duration::from_secs(20))), Some(0));
    for id in [&a, &b] {
        let t = client.task_get(id).await.unwrap();
        assert_eq!(
            (t.state, t.deliveries, t.failures),
            (TaskState::Ready, 1, 0),
            "{id}"
        );
    }
    let other = client
        .claim(
            &muster_sdk::protocol::ops::Claim::new(["jobs"])
                .max(2)
                .member("stayer"),
        )
        .await
        .unwrap();
    let mut got: Vec<(String, u64, u64)> = other
        .into_iter()
        .map(|d| (d.id, d.attempt, d.failures))
        .collect();
    got.sort();
    let mut want = vec![(a, 2, 0), (b, 2, 0)];
    want.sort();
    assert_eq!(got, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_agents_of_capacity_two_share_a_hundred_tasks_and_a_slow_one_holds_nobody_up() {
    let d = Daemon::start();
    let client = d.client().await;
    queue_with_lease(&client, "jobs", 30_000).await;
    let holding: Arc<Mutex<HashMap<String, (u32, u32)>>> = Arc::default();
    let finished: Arc<Mutex<Vec<String>>> = Arc::default();
    let mut handles = Vec::new();
    let mut runs = Vec::new();
    for n in 0..4 {
        let member = format!("pool-{n}");
        let mut config = WorkerConfig::new(member.clone(), ["jobs"]);
        config.capacity = 2;
        let worker = Worker::new(d.options(), config);
        handles.push(worker.handle());
        let (holding, finished) = (Arc::clone(&holding), Arc::clone(&finished));
        runs.push(tokio::spawn(worker.run(move |task| {
            let (holding, finished, member) =
                (Arc::clone(&holding), Arc::clone(&finished), member.clone());
            async move {
                {
                    let mut h = holding.lock().unwrap();
                    let entry = h.entry(member.clone()).or_default();
                    entry.0 += 1;
                    entry.1 = entry.1.max(entry.0);
                }
                let slow = task.payload().get().contains("slow");
                tokio::time::sleep(Duration::from_millis(if slow { 10_000 } else { 5 })).await;
                holding.lock().unwrap().get_mut(&member).unwrap().0 -= 1;
                finished.lock().unwrap().push(task.id().to_owned());
                Outcome::Ack(None)
            }
        })));
    }
    let slow = enqueue(&client, "jobs", serde_json::json!({"slow": true})).await;
    let mut ids = vec![slow.clone()];
    for n in 0..99 {
        ids.push(enqueue(&client, "jobs", serde_json::json!({"n": n})).await);
    }
    let reply = client.wait(ids, 120_000).await.unwrap();
    assert_eq!((reply.finished.len(), reply.pending.len()), (100, 0));
    let order = finished.lock().unwrap().clone();
    assert_eq!(order.len(), 100);
    assert_eq!(
        order.last(),
        Some(&slow),
        "the slow task finished before others: they waited for it"
    );
    let most: HashMap<String, u32> = holding
        .lock()
        .unwrap()
        .iter()
        .map(|(m, (_, most))| (m.clone(), *most))
        .collect();
    assert!(
        most.values().all(|&m| m <= 2),
        "a member held more than its capacity: {most:?}"
    );
    for h in &handles {
        h.shutdown();
    }
    for r in runs {
        r.await.unwrap().unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_reaches_a_running_handler_and_a_work_child_by_push() {
    let d = Daemon::start();
    let client = d.client().await;
    // With a 30 s lease the first renewal comes after 10 s: a cancel seen sooner came by push.
    queue_with_lease(&client, "sdk", 30_000).await;
    queue_with_lease(&client, "shell", 30_000).await;
    let id = enqueue(&client, "sdk", serde_json::json!({"n": 1})).await;
    let (events, mut events_rx) = mpsc::unbounded_channel();
    let worker = Worker::new(d.options(), WorkerConfig::new("cancellable", ["sdk"]));
    let handle = worker.handle();
    let run = tokio::spawn(worker.run(move |task| {
        let events = events.clone();
        async move {
            let _ = events.send("started");
            task.cancelled().await;
            let _ = events.send("cancelled");
            Outcome::Nack {
                delay: None,
                error: "stopped on cancel".into(),
            }
        }
    }));
    assert_eq!(events_rx.recv().await, Some("started"));
    let asked = Instant::now();
    client.cancel(&id).await.unwrap();
    let seen = tokio::time::timeout(Duration::from_secs(5), events_rx.recv())
        .await
        .unwrap();
    assert_eq!(seen, Some("cancelled"));
    eprintln!("cancel reached the SDK handler after {:?}", asked.elapsed());
    let reply = client.wait(vec![id], 5_000).await.unwrap();
    assert_eq!(reply.finished[0].state, TaskState::Cancelled);
    handle.shutdown();
    run.await.unwrap().unwrap();

    let shell_id = enqueue(&client, "shell", serde_json::json!({"n": 2})).await;
    let _work = d.spawn_cli(&[
        "work",
        "shell",
        "--member",
        "shell-cancel",
        "--grace",
        "2s",
        "--",
        "sleep",
        "60",
    ]);
    until_member_holds(&client, "shell-cancel", 1).await;
    let asked = Instant::now();
    client.cancel(&shell_id).await.unwrap();
    let reply = client.wait(vec![shell_id], 5_000).await.unwrap();
    assert_eq!(reply.finished.len(), 1, "the child was not stopped in time");
    assert_eq!(reply.finished[0].state, TaskState::Cancelled);
    eprintln!(
        "cancel stopped the muster work child after {:?}",
        asked.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_list_members_revoke_a_lease_and_drain_from_the_cli() {
    let d = Daemon::start();
    let client = d.client().await;
    queue_with_lease(&client, "jobs", 30_000).await;
    let id = enqueue(&client, "jobs", serde_json::json!({"n": 1})).await;
    let args = [
        "work", "jobs", "--member", "ops-1", "--labels", "gpu,big", "--grace", "1s", "--", "sleep",
        "60",
    ];
    let mut work = d.spawn_cli(&args);
    until_member_holds(&client, "ops-1", 1).await;

    let members = d.ok(&["members", "--no-headers"]);
    let fields: Vec<&str> = members.trim_end().split('\t').collect();
    assert_eq!(
        fields[..5],
        ["ops-1", "connected", "1/1", "active", "gpu,big"],
        "{members}"
    );
    let described = d.ok(&["member", "describe", "ops-1", "--no-headers"]);
    let lease_line = described.lines().nth(2).expect("a line per lease");
    assert!(
        lease_line.starts_with(&format!("{id}\tjobs\tleased\t0\t1\t0\t")),
        "{described}"
    );

    // A revoked lease ends now (one failure). No other member can take the task, so
    // it goes back to ops-1 once ops-1 has been heard from after the revoke (its next
    // keep-alive), not in the same instant.
    assert_eq!(d.ok(&["lease", "revoke", &id]), "ready\n");
    until_member_holds(&client, "ops-1", 1).await;
    let t = client.task_get(&id).await.unwrap();
    assert_eq!(
        (t.state, t.deliveries, t.failures),
        (TaskState::Leased, 2, 1)
    );
    let events: Vec<&str> = t.history.iter().map(|e| e.event.as_str()).collect();
    assert_eq!(events, ["enqueued", "leased", "revoked", "leased"]);

    // Drained: the agent is told, lets its program run out the grace period, releases
    // the task without a failure and exits.
    let drained = d.ok(&["member", "drain", "ops-1"]);
    assert_eq!(drained.split('\t').nth(3), Some("draining"), "{drained}");
    assert_eq!(block(|| work.wait(Duration::from_secs(30))), Some(0));
    let t = client.task_get(&id).await.unwrap();
    assert_eq!(
        (t.state, t.deliveries, t.failures),
        (TaskState::Ready, 2, 1)
    );
    let bad = d.cli(&["member", "drain", "nobody"]);
    assert_eq!(
        String::from_utf8(bad.stderr).unwrap(),
        "muster: not_found: no member \"nobody\"\n"
    );
}

/// `muster work` started before its queue exists (an agent under systemd or Kubernetes
/// that comes up first) waits for the queue, saying so once, instead of exiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn muster_work_started_before_its_queue_waits_for_it_and_says_so_once() {
    use std::os::unix::process::CommandExt;
    let d = Daemon::start();
    let client = d.client().await;
    let log_dir = tempfile::tempdir().unwrap();
    let log_path = log_dir.path().join("work.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut work = std::process::Command::new(muster_tests::muster_bin())
        .args(["work", "later", "--member", "early", "--grace", "1s", "--"])
        .args(["sh", "-c", r#"printf '{"got":%s}' "$(cat)""#])
        .env("MUSTER_ADDR", &d.addr)
        .env("MUSTER_DATA", d.data())
        .env_remove("MUSTER_LOG")
        .process_group(0)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let read_log = || std::fs::read_to_string(&log_path).unwrap();
    let waiting = |log: &str| {
        log.lines()
            .filter(|l| {
                l.contains(" WARN ")
                    && l.contains("the queue does not exist; waiting for it to be created")
                    && l.contains("queue=later")
            })
            .count()
    };
    muster_tests::until(Duration::from_secs(10), "the wait is logged", || async {
        waiting(&read_log()) == 1
    })
    .await;
    assert_eq!(work.try_wait().unwrap(), None, "it exited:\n{}", read_log());
    // The member is connected (serving nothing yet) while it waits.
    let m = client.member_describe("early").await.unwrap().member;
    assert_eq!(m.state, muster_sdk::protocol::model::MemberState::Connected);

    queue_with_lease(&client, "later", 30_000).await;
    let id = enqueue(&client, "later", serde_json::json!({"n": 7})).await;
    let reply = client.wait(vec![id.clone()], 20_000).await.unwrap();
    assert_eq!(reply.finished.len(), 1, "not run:\n{}", read_log());
    let t = &reply.finished[0];
    assert_eq!((t.state, t.deliveries), (TaskState::Done, 1));
    assert_eq!(
        t.result.as_ref().map(|r| r.get()),
        Some(r#"{"got":{"n":7}}"#)
    );
    // Stopped, it exits 0; the log said it waited exactly once, then that it serves.
    let status = std::process::Command::new("kill")
        .args(["-TERM", &work.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(20);
    let code = loop {
        if let Some(status) = work.try_wait().unwrap() {
            break status.code();
        }
        assert!(Instant::now() < deadline, "muster work did not exit");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let log = read_log();
    assert_eq!(code, Some(0), "{log}");
    assert_eq!(waiting(&log), 1, "{log}");
    let serving = log
        .lines()
        .filter(|l| l.contains("the queue exists now; serving it") && l.contains("queue=later"))
        .count();
    assert_eq!(serving, 1, "{log}");
}

/// The SDK's `Worker` on two queues, one not created yet: it serves the other
/// meanwhile, then both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_serves_its_queues_that_exist_while_it_waits_for_the_others() {
    let d = Daemon::start();
    let client = d.client().await;
    queue_with_lease(&client, "now", 30_000).await;
    let worker = Worker::new(d.options(), WorkerConfig::new("both", ["now", "later"]));
    let handle = worker.handle();
    let run =
        tokio::spawn(worker.run(|task: muster_sdk::Task| async move {
            Outcome::Ack(Some(task.payload().clone()))
        }));
    let first = enqueue(&client, "now", serde_json::json!({"q": "now"})).await;
    let reply = client.wait(vec![first], 20_000).await.unwrap();
    assert_eq!(reply.finished.len(), 1, "the existing queue is not served");
    assert_eq!(reply.finished[0].state, TaskState::Done);
    assert!(!run.is_finished(), "the worker stopped");

    queue_with_lease(&client, "later", 30_000).await;
    let ids = vec![
        enqueue(&client, "later", serde_json::json!({"q": "later"})).await,
        enqueue(&client, "now", serde_json::json!({"q": "now"})).await,
    ];
    let reply = client.wait(ids, 20_000).await.unwrap();
    assert_eq!((reply.finished.len(), reply.pending.len()), (2, 0));
    assert!(reply.finished.iter().all(|t| t.state == TaskState::Done));
    let m = client.member_describe("both").await.unwrap().member;
    assert_eq!(m.subscribed, ["now", "later"]);
    handle.shutdown();
    run.await.unwrap().unwrap();
}
