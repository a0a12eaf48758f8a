//! Child tasks against a real daemon: a planner of capacity one that fans out, waits
//! holding nothing, and summarises its children's results (the same agent runs them);
//! a kill -9 right after the last child's ack; a cancel that reaches the children; the
//! CLI's spawn and task view; and `muster work`'s children in its suspend file.

use std::time::Duration;

use muster_sdk::{
    NewChild, NewTask, Outcome, QueuePatch, Suspension, TaskState, Worker, WorkerConfig,
};
use muster_tests::{Daemon, until};

fn json(value: serde_json::Value) -> muster_sdk::RawJson {
    muster_sdk::json(&value).expect("json")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planner_of_capacity_one_fans_out_waits_holding_nothing_and_sums_its_childrens_results() {
    let d = Daemon::start();
    let client = d.client().await;
    for q in ["plan", "count"] {
        client.queue_create(q, QueuePatch::default()).await.unwrap();
    }
    let doc = client
        .enqueue(
            "plan",
            NewTask::new(json(serde_json::json!({"pages": ["a b", "c d e", "f"]}))),
        )
        .await
        .unwrap()
        .id;
    // One agent with one slot serves both queues: the planner's children run only
    // because a waiting parent holds no slot.
    let mut config = WorkerConfig::new("solo", ["plan", "count"]);
    config.capacity = 1;
    let worker = Worker::new(d.options(), config);
    let handle = worker.handle();
    let run = tokio::spawn(worker.run(|task| async move {
        let payload: serde_json::Value = serde_json::from_str(task.payload().get()).unwrap();
        if task.delivery().queue == "count" {
            assert!(task.parent().is_some(), "a child knows its parent");
            let words = payload["text"].as_str().unwrap().split(' ').count();
            return Outcome::Ack(Some(json(serde_json::json!(words))));
        }
        if task.resumed().is_none() {
            let children = payload["pages"]
                .as_array()
                .unwrap()
                .iter()
                .enumerate()
                .map(|(i, text)| {
                    NewChild::new(
                        format!("page-{i}"),
                        "count",
                        json(serde_json::json!({"text": text})),
                    )
                })
                .collect();
            let reply = task
                .spawn_and_wait(children, Suspension::new("counting pages"))
                .await
                .expect("spawn and wait");
            assert_eq!(reply.state, TaskState::Suspended);
            assert_eq!(reply.children.len(), 3);
            return Outcome::Suspended;
        }
        let total: u64 = task
            .children()
            .iter()
            .map(|c| {
                assert_eq!(c.state, TaskState::Done);
                c.result.as_ref().unwrap().get().parse::<u64>().unwrap()
            })
            .sum();
        Outcome::Ack(Some(json(serde_json::json!({"words": total}))))
    }));
    until(Duration::from_secs(20), "the planner done", || async {
        client.task_get(&doc).await.unwrap().state == TaskState::Done
    })
    .await;
    let t = client.task_get(&doc).await.unwrap();
    assert_eq!(t.result.unwrap().get(), r#"{"words":6}"#);
    assert_eq!((t.deliveries, t.failures), (2, 0));
    assert_eq!(
        t.children
            .iter()
            .map(|c| (c.child_key.as_str(), c.state))
            .collect::<Vec<_>>(),
        [
            ("page-0", TaskState::Done),
            ("page-1", TaskState::Done),
            ("page-2", TaskState::Done)
        ]
    );
    // The task view lists them, and each names its parent.
    let shown = d.ok(&["task", "get", &doc]);
    assert!(shown.contains("children\t3 (3 done)"), "{shown}");
    let first = &t.children[0].id;
    assert!(
        shown.contains(&format!("child\tpage-0\tdone\t{first}\tcount\tchildren=0")),
        "{shown}"
    );
    assert!(shown.contains("outcome\tpage-0\tdone"), "{shown}");
    let child = d.ok(&["task", "get", first]);
    assert!(
        child.contains(&format!("parent\t{doc} child_key=page-0")),
        "{child}"
    );
    handle.shutdown();
    tokio::time::timeout(Duration::from_secs(20), run)
        .await
        .expect("the worker stopped")
        .unwrap()
        .unwrap();
}

#[test]
fn a_kill_9_after_the_last_childs_ack_leaves_its_parent_ready_and_a_cancel_reaches_children() {
    let mut d = Daemon::start();
    d.ok(&["queue", "create", "plan"]);
    d.ok(&["queue", "create", "work"]);
    let parent = d.ok(&["enqueue", "plan", "{}"]).trim().to_owned();
    d.ok(&["claim", "plan"]);
    let claim = format!("{parent}.1");
    let spawned = d.ok(&[
        "spawn",
        &claim,
        "--child",
        "a",
        "work",
        r#"{"n":1}"#,
        "--child",
        "b",
        "work",
        r#"{"n":2}"#,
        "--wait",
        "--reason",
        "two parts",
    ]);
    let lines: Vec<&str> = spawned.lines().collect();
    assert_eq!(lines.len(), 4, "{spawned}");
    assert!(lines[0].starts_with("child\ta\t") && lines[0].ends_with("\tready\tnew"));
    assert_eq!(lines[2], "state\tsuspended");
    assert!(lines[3].starts_with(&format!("resume_token\t{parent}.1.")));
    let shown = d.ok(&["task", "get", &parent]);
    assert!(shown.contains("suspended\treason=\"two parts\""), "{shown}");
    // The children run; the parent waits through a kill -9 in between.
    let a = d.ok(&["claim", "work"]);
    let b = d.ok(&["claim", "work"]);
    let claim_of = |line: &str| line.split('\t').next().unwrap().to_owned();
    d.ok(&["ack", &claim_of(&a), "--result", "10"]);
    d.kill9();
    d.restart();
    assert!(d.ok(&["task", "get", &parent]).contains("state\tsuspended"));
    // The last child's ack is acknowledged, then the daemon dies at once: its
    // parent's wake was made durable with it.
    d.ok(&["ack", &claim_of(&b), "--result", "20"]);
    d.kill9();
    d.restart();
    let shown = d.ok(&["task", "get", &parent]);
    assert!(shown.contains("state\tready"), "{shown}");
    assert!(shown.contains("outcome\ta\tdone"), "{shown}");
    assert!(shown.contains(" result=20"), "{shown}");

    // A second parent: cancelling it cancels its waiting children, and asks the
    // holder of its leased one.
    let other = d.ok(&["enqueue", "plan", "{}"]).trim().to_owned();
    let line = d.ok(&["claim", "plan"]);
    let held = claim_of(&line);
    assert!(
        held.starts_with(&parent) || held.starts_with(&other),
        "{line}"
    );
    let (owner, owner_claim) = if held.starts_with(&other) {
        (other.clone(), held)
    } else {
        // The first parent came back first: settle it and take the second.
        d.ok(&["ack", &held]);
        let line = d.ok(&["claim", "plan"]);
        (other.clone(), claim_of(&line))
    };
    d.ok(&[
        "spawn",
        &owner_claim,
        "--child",
        "x",
        "work",
        "{}",
        "--child",
        "y",
        "work",
        "{}",
    ]);
    let x = d.ok(&["claim", "work"]);
    d.ok(&["cancel", &owner]);
    let shown = d.ok(&["task", "get", &owner]);
    assert!(
        shown.contains("children\t2 (1 leased, 1 cancelled)"),
        "{shown}"
    );
    let x_id = claim_of(&x).split('.').next().unwrap().to_owned();
    let x_shown = d.ok(&["task", "get", &x_id]);
    assert!(x_shown.contains("cancel_requested\ttrue"), "{x_shown}");
    let refused = d.cli(&["spawn", &format!("{owner}.9"), "--child", "z", "work", "{}"]);
    assert_eq!(refused.status.code(), Some(1));
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("lease_lost"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_muster_work_program_spawns_children_from_its_suspend_file_and_reads_their_results() {
    let d = Daemon::start();
    let client = d.client().await;
    client
        .queue_create("fan", QueuePatch::default())
        .await
        .unwrap();
    let id = client
        .enqueue("fan", NewTask::new(json(serde_json::json!({}))))
        .await
        .unwrap()
        .id;
    // The parent's first run asks for two children in its own queue (one runner of
    // capacity one runs them: the waiting parent holds no slot); its next run prints
    // what they said, from the file that always holds the resume whole. A child
    // prints its parent.
    let script = r#"if [ -n "$MUSTER_PARENT" ]; then
  printf '"%s"' "$MUSTER_PARENT"
elif [ -z "$MUSTER_RESUMED" ]; then
  printf '{"reason":"two leaves","children":[{"child_key":"l1","queue":"fan","task":{"payload":1}},{"child_key":"l2","queue":"fan","task":{"payload":2}}]}' > "$MUSTER_SUSPEND_FILE"
elif [ -n "$MUSTER_RESUMED" ]; then
  cat "$MUSTER_RESUMED_FILE"
fi"#;
    let log_dir = tempfile::tempdir().unwrap();
    let log_path = log_dir.path().join("work.log");
    let mut work = d.spawn_cli_logged(
        &[
            "work", "fan", "--member", "fanner", "--grace", "1s", "--", "sh", "-c", script,
        ],
        &log_path,
    );
    let read_log = || std::fs::read_to_string(&log_path).unwrap();
    until(Duration::from_secs(20), "the parent done", || async {
        client.task_get(&id).await.unwrap().state == TaskState::Done
    })
    .await;
    let result: serde_json::Value =
        serde_json::from_str(client.task_get(&id).await.unwrap().result.unwrap().get()).unwrap();
    let children = result["children"].as_array().expect("children");
    assert_eq!(children.len(), 2, "{result}");
    for (c, key) in children.iter().zip(["l1", "l2"]) {
        assert_eq!(
            (c["child_key"].as_str(), c["state"].as_str()),
            (Some(key), Some("done")),
            "{result}\n{}",
            read_log()
        );
        assert_eq!(c["result"], serde_json::json!(id), "{result}");
    }
    work.signal("-TERM");
    let code = tokio::task::block_in_place(|| work.wait(Duration::from_secs(20)));
    assert_eq!(code, Some(0), "{}", read_log());
}
