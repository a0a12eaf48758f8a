//! Operators acting on waiting tasks and drained members: `task_update` (priority,
//! run now) and `member_undrain`, through the SDK and the CLI, with exact states and
//! error codes, and nothing changed by a refused request.

use std::time::Duration;

use muster_sdk::protocol::ops::{Claim, SessionOpen, TaskUpdate};
use muster_sdk::{Client, ErrorCode, NewTask, Push, QueuePatch, TaskState};
use muster_tests::Daemon;

fn payload(n: u64) -> NewTask {
    NewTask::new(muster_sdk::json(&serde_json::json!({ "n": n })).expect("json"))
}

async fn enqueue(client: &Client, task: NewTask) -> String {
    client.enqueue("jobs", task).await.expect("enqueue").id
}

fn update(task: &str, priority: Option<u8>, run_now: bool) -> TaskUpdate {
    TaskUpdate {
        task: task.into(),
        priority,
        run_now,
    }
}

fn events(t: &muster_sdk::TaskInfo) -> Vec<&str> {
    t.history.iter().map(|e| e.event.as_str()).collect()
}

/// The code and message of a refused call.
fn refused<T: std::fmt::Debug>(r: Result<T, muster_sdk::Error>) -> (ErrorCode, String) {
    match r {
        Err(muster_sdk::Error::Server(body)) => (body.code, body.message),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_priority_moves_a_ready_task_ahead_and_run_now_makes_a_scheduled_one_ready() {
    let d = Daemon::start();
    let c = d.client().await;
    c.queue_create("jobs", QueuePatch::default())
        .await
        .expect("queue");
    let first = enqueue(&c, payload(1)).await;
    let second = enqueue(&c, payload(2)).await;
    let mut later = payload(3);
    later.delay_ms = Some(3_600_000);
    let scheduled = enqueue(&c, later).await;

    let moved = c
        .task_update(&update(&second, Some(7), false))
        .await
        .expect("update");
    assert_eq!(
        (moved.id.as_str(), moved.state, moved.priority),
        (second.as_str(), TaskState::Ready, 7)
    );
    // Higher priority first: the second task goes before the first.
    let got = c.claim(&Claim::new(["jobs"])).await.expect("claim");
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].id.as_str(), got[0].priority), (second.as_str(), 7));

    let now = c
        .task_update(&update(&scheduled, None, true))
        .await
        .expect("run now");
    assert_eq!(
        (now.state, now.not_before_ms, now.priority),
        (TaskState::Ready, None, 0)
    );
    let t = c.task_get(&scheduled).await.expect("task");
    assert_eq!(events(&t), ["enqueued", "run_now"]);
    let t = c.task_get(&second).await.expect("task");
    assert_eq!(events(&t), ["enqueued", "priority_changed", "leased"]);

    // Both at priority 0 now: enqueue order, the first then the one run now.
    let got = c.claim(&Claim::new(["jobs"]).max(2)).await.expect("claim");
    let ids: Vec<&str> = got.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(ids, [first.as_str(), scheduled.as_str()]);

    // What changes nothing writes nothing: no event, the same summary.
    let ready = enqueue(&c, payload(4)).await;
    let before = c.task_get(&ready).await.expect("task");
    let same = c
        .task_update(&update(&ready, Some(0), true))
        .await
        .expect("no change");
    assert_eq!((same.state, same.priority), (TaskState::Ready, 0));
    let after = c.task_get(&ready).await.expect("task");
    assert_eq!(events(&after), ["enqueued"]);
    assert_eq!(after.updated_ms, before.updated_ms);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_task_update_names_why_and_changes_nothing() {
    let d = Daemon::start();
    let c = d.client().await;
    c.queue_create("jobs", QueuePatch::default())
        .await
        .expect("queue");
    let waiting = enqueue(&c, payload(1)).await;
    let leased = enqueue(&c, payload(2)).await;
    let done = enqueue(&c, payload(3)).await;
    let claimed = c.claim(&Claim::new(["jobs"]).max(3)).await.expect("claim");
    assert_eq!(claimed.len(), 3);
    let held = |id: &str| claimed.iter().find(|t| t.id == id).expect("claimed");
    // `waiting` goes back to ready; `done` is acked; `leased` stays leased.
    c.release(&waiting, held(&waiting).epoch)
        .await
        .expect("release");
    c.ack(&done, held(&done).epoch, None).await.expect("ack");
    let snapshot = |c: &Client| {
        let c = c.clone();
        let ids = [waiting.clone(), leased.clone(), done.clone()];
        async move {
            let mut all = Vec::new();
            for id in ids {
                let t = c.task_get(&id).await.expect("task");
                all.push(serde_json::to_string(&t).expect("json"));
            }
            all
        }
    };
    let before = snapshot(&c).await;

    let unknown = "01JHMPFNMW1HEAD8X4A1JH69RE";
    let cases: Vec<(TaskUpdate, ErrorCode, String)> = vec![
        (
            update("not-an-id", Some(1), false),
            ErrorCode::BadRequest,
            "invalid task id \"not-an-id\"".into(),
        ),
        (
            update(&waiting, None, false),
            ErrorCode::BadRequest,
            "name a change: priority, run_now or both".into(),
        ),
        (
            update(&waiting, Some(10), false),
            ErrorCode::BadRequest,
            "priority 10 is out of range 0..=9".into(),
        ),
        (
            update(unknown, Some(1), false),
            ErrorCode::NotFound,
            format!("no task {unknown}"),
        ),
        (
            update(&leased, Some(1), true),
            ErrorCode::InvalidState,
            format!("task {leased} is leased: only ready and scheduled tasks can be updated"),
        ),
        (
            update(&done, None, true),
            ErrorCode::InvalidState,
            format!("task {done} is done: only ready and scheduled tasks can be updated"),
        ),
    ];
    for (request, code, message) in cases {
        assert_eq!(
            refused(c.task_update(&request).await),
            (code, message),
            "{request:?}"
        );
    }
    assert_eq!(snapshot(&c).await, before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undrained_member_is_served_again_at_once() {
    let d = Daemon::start();
    let admin = d.client().await;
    admin
        .queue_create("jobs", QueuePatch::default())
        .await
        .expect("queue");
    let agent = d.client().await;
    let open = SessionOpen {
        member: "m1".into(),
        labels: vec![],
        capacity: 1,
        reclaim: false,
        resume: false,
        held: None,
        liveness_ms: None,
    };
    let (_, mut pushes) = agent.open_session(&open).await.expect("session");
    agent
        .subscribe("m1", &["jobs".into()])
        .await
        .expect("subscribe");

    let drained = admin.member_drain("m1").await.expect("drain");
    assert!(drained.draining);
    let push = tokio::time::timeout(Duration::from_secs(10), pushes.recv())
        .await
        .expect("a push in time");
    assert!(matches!(push, Some(Push::Drain)), "{push:?}");

    // Drained: a new task stays ready (dispatch runs in the enqueue's own round).
    let id = enqueue(&admin, payload(1)).await;
    assert_eq!(
        admin.task_get(&id).await.expect("task").state,
        TaskState::Ready
    );

    let undrained = admin.member_undrain("m1").await.expect("undrain");
    assert_eq!((undrained.name.as_str(), undrained.draining), ("m1", false));
    let push = tokio::time::timeout(Duration::from_secs(10), pushes.recv())
        .await
        .expect("a push in time");
    match push {
        Some(Push::Deliver(task)) => assert_eq!(task.id, id),
        other => panic!("expected the task delivered, got {other:?}"),
    }
    assert_eq!(
        admin.task_get(&id).await.expect("task").state,
        TaskState::Leased
    );
    // Undraining a member that is not draining changes nothing.
    assert!(!admin.member_undrain("m1").await.expect("again").draining);
    assert_eq!(
        refused(admin.member_undrain("nobody").await),
        (ErrorCode::NotFound, "no member \"nobody\"".into())
    );
}

#[test]
fn the_cli_updates_priority_runs_now_and_undrains() {
    let d = Daemon::start();
    d.ok(&["queue", "create", "jobs"]);
    let id = d.ok(&["enqueue", "jobs", "{}", "--delay", "1h"]);
    let id = id.trim();
    let line = d.ok(&["task", "update", id, "--priority", "4"]);
    assert_eq!(line, format!("{id}\tjobs\tscheduled\t4\t0\t0\t-\n"));
    let line = d.ok(&["task", "run-now", id]);
    assert_eq!(line, format!("{id}\tjobs\tready\t4\t0\t0\t-\n"));
    let out = d.cli(&["task", "update", id, "--priority", "12"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8(out.stderr).expect("utf-8"),
        "muster: invalid value '12' for '--priority <PRIORITY>': 12 is not in 0..=9 (see `muster task update --help`)\n"
    );
    let out = d.cli(&["--json", "task", "run-now", "01JHMPFNMW1HEAD8X4A1JH69RE"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8(out.stderr).expect("utf-8"),
        "{\"error\":{\"code\":\"not_found\",\"message\":\"no task 01JHMPFNMW1HEAD8X4A1JH69RE\"}}\n"
    );
    let out = d.cli(&["member", "undrain", "nobody"]);
    assert_eq!(
        String::from_utf8(out.stderr).expect("utf-8"),
        "muster: not_found: no member \"nobody\"\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_stats_report_uptime_members_and_fsync_latency() {
    let d = Daemon::start();
    let c = d.client().await;
    c.queue_create("jobs", QueuePatch::default())
        .await
        .expect("queue");
    let stats = c.server_stats().await.expect("stats");
    assert!(stats.syncs >= 1, "{stats:?}");
    assert!(stats.fsync_last_us > 0, "{stats:?}");
    assert!(stats.fsync_total_us >= stats.fsync_last_us, "{stats:?}");
    assert!(stats.uptime_ms < 600_000, "{stats:?}");
    let agent = d.client().await;
    let open = SessionOpen {
        member: "m1".into(),
        labels: vec![],
        capacity: 1,
        reclaim: false,
        resume: false,
        held: None,
        liveness_ms: None,
    };
    let _session = agent.open_session(&open).await.expect("session");
    // Counted once a second with the gauges: poll (bounded) until it shows.
    let mut seen = 0;
    for _ in 0..100 {
        seen = c.server_stats().await.expect("stats").members_connected;
        if seen == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(seen, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn summaries_carry_the_progress_checkpoint_cut_to_256_bytes() {
    let d = Daemon::start();
    let c = d.client().await;
    c.queue_create("jobs", QueuePatch::default())
        .await
        .expect("queue");
    let id = enqueue(&c, payload(1)).await;
    let leased = || async {
        let page = c
            .task_list("jobs", TaskState::Leased, None, None)
            .await
            .expect("list");
        assert_eq!(page.tasks.len(), 1);
        page.tasks[0].clone()
    };
    let got = c.claim(&Claim::new(["jobs"])).await.expect("claim");
    assert_eq!(leased().await.progress, None);
    let step = muster_sdk::json(&serde_json::json!({"step": 3, "of": 10})).expect("json");
    c.renew(&id, got[0].epoch, None, Some(step))
        .await
        .expect("renew");
    assert_eq!(
        leased().await.progress.as_deref(),
        Some(r#"{"step":3,"of":10}"#)
    );
    // A long checkpoint is cut on a character boundary (9 bytes of `{"logs":"`, then
    // two-byte characters: 255 bytes), with a mark; task_get has it all.
    let long = serde_json::json!({ "logs": "é".repeat(400) });
    let long = muster_sdk::json(&long).expect("json");
    c.renew(&id, got[0].epoch, None, Some(long.clone()))
        .await
        .expect("renew");
    let cut = leased().await.progress.expect("progress");
    assert_eq!(cut.len(), 255 + '…'.len_utf8(), "{cut}");
    assert!(
        cut.starts_with(r#"{"logs":"éé"#) && cut.ends_with("é…"),
        "{cut}"
    );
    let whole = c
        .task_get(&id)
        .await
        .expect("task")
        .progress
        .expect("progress");
    assert_eq!(whole.get(), long.get());
}
